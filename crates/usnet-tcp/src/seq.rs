//! Sequence numbers: 32-bit values compared modulo 2^32 (RFC 9293 §3.4).

use std::fmt;
use std::ops::{Add, Sub};

/// A TCP sequence number. Comparisons are in modular arithmetic and only
/// meaningful for numbers less than 2^31 apart, which the window rules guarantee.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// `self - other` as a signed distance.
    #[inline]
    pub fn diff(self, other: Seq) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }
    /// `self < other`.
    #[inline]
    pub fn lt(self, other: Seq) -> bool {
        self.diff(other) < 0
    }
    /// `self <= other`.
    #[inline]
    pub fn le(self, other: Seq) -> bool {
        self.diff(other) <= 0
    }
    /// `self > other`.
    #[inline]
    pub fn gt(self, other: Seq) -> bool {
        self.diff(other) > 0
    }
    /// `self >= other`.
    #[inline]
    pub fn ge(self, other: Seq) -> bool {
        self.diff(other) >= 0
    }
    /// The later of the two.
    #[inline]
    pub fn max(self, other: Seq) -> Seq {
        if self.ge(other) {
            self
        } else {
            other
        }
    }
    /// The earlier of the two.
    #[inline]
    pub fn min(self, other: Seq) -> Seq {
        if self.le(other) {
            self
        } else {
            other
        }
    }
    /// Distance `self - earlier` as a count, 0 if `earlier` is after `self`.
    #[inline]
    pub fn since(self, earlier: Seq) -> u32 {
        self.diff(earlier).max(0) as u32
    }
    /// `lo <= self < hi`.
    #[inline]
    pub fn in_range(self, lo: Seq, hi: Seq) -> bool {
        self.ge(lo) && self.lt(hi)
    }
}

impl Add<u32> for Seq {
    type Output = Seq;
    #[inline]
    fn add(self, n: u32) -> Seq {
        Seq(self.0.wrapping_add(n))
    }
}

impl Add<usize> for Seq {
    type Output = Seq;
    #[inline]
    fn add(self, n: usize) -> Seq {
        Seq(self.0.wrapping_add(n as u32))
    }
}

impl Sub<u32> for Seq {
    type Output = Seq;
    #[inline]
    fn sub(self, n: u32) -> Seq {
        Seq(self.0.wrapping_sub(n))
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let a = Seq(u32::MAX - 5);
        let b = a + 10u32;
        assert_eq!(b.0, 4);
        assert!(a.lt(b) && b.gt(a) && a.le(a) && a.ge(a));
        assert_eq!(b.diff(a), 10);
        assert_eq!(b.since(a), 10);
        assert_eq!(a.since(b), 0);
        assert!((a + 3u32).in_range(a, b));
        assert!(!b.in_range(a, b));
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
    }
}
