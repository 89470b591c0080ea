//! Byte rings for the send and receive buffers, and the receive-side out-of-order
//! range list. A ring's capacity is fixed when the connection is created; its storage
//! grows towards it as bytes are placed (so a connection pays for the buffer it uses,
//! not for its window: zeroing a 4 MiB receive ring and a 1 MiB send ring for every
//! accepted connection cost about half a millisecond each, which capped a server's
//! accept rate), and never shrinks.

use crate::seq::Seq;

/// Storage a ring starts with on its first write (unless its capacity is smaller).
const FIRST_STORAGE: usize = 4096;

/// A fixed-capacity byte ring. Bytes `[0, len)` from `head` are "in" the ring; bytes
/// beyond `len` (up to the capacity) may be written out of order with [`Ring::write_at`]
/// and committed later with [`Ring::commit`]. Positions live in `buf`, whose length
/// (the storage) is at most `cap` and covers every byte placed so far.
#[derive(Debug, Clone)]
pub struct Ring {
    buf: Vec<u8>,
    cap: usize,
    head: usize,
    len: usize,
}

impl Ring {
    /// A ring of `cap` bytes; storage comes with the first bytes placed.
    pub fn new(cap: usize) -> Self {
        Ring {
            buf: Vec::new(),
            cap,
            head: 0,
            len: 0,
        }
    }
    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Room left.
    pub fn free(&self) -> usize {
        self.cap - self.len
    }

    /// Makes the storage cover offsets `[0, end)` from the head (at most the
    /// capacity): doubles it at least, and lays the old bytes out from the head, so
    /// out-of-order bytes beyond `len` keep their offsets.
    fn reserve(&mut self, end: usize) {
        let have = self.buf.len();
        let end = end.min(self.cap);
        if end <= have {
            return;
        }
        let want = end
            .max(have * 2)
            .max(FIRST_STORAGE)
            .next_power_of_two()
            .min(self.cap);
        let mut buf = vec![0u8; want];
        if have > 0 {
            let first = have - self.head;
            buf[..first].copy_from_slice(&self.buf[self.head..]);
            buf[first..have].copy_from_slice(&self.buf[..self.head]);
        }
        self.buf = buf;
        self.head = 0;
    }

    /// Append as much of `data` as fits; returns the count appended.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = self.write_at(self.len, data);
        self.len += n;
        n
    }

    /// Write `data` at `offset` from the head (which may be beyond `len`), clipped to the
    /// capacity; returns bytes written. Does not change `len`.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        if offset >= self.cap {
            return 0;
        }
        let n = data.len().min(self.cap - offset);
        if n == 0 {
            return 0;
        }
        self.reserve(offset + n);
        let size = self.buf.len();
        let start = (self.head + offset) % size;
        let first = n.min(size - start);
        self.buf[start..start + first].copy_from_slice(&data[..first]);
        self.buf[..n - first].copy_from_slice(&data[first..n]);
        n
    }

    /// Appends up to `n` bytes that `fill` writes straight into the ring's free space
    /// (called with up to two slices, in order; it returns how many bytes of each it
    /// wrote, and a short count ends the append). Returns the count appended. This is
    /// how a producer elsewhere (a stack server client's shared ring) is copied in
    /// with one copy.
    pub fn push_with(&mut self, n: usize, mut fill: impl FnMut(&mut [u8]) -> usize) -> usize {
        let n = n.min(self.cap - self.len);
        if n == 0 {
            return 0;
        }
        self.reserve(self.len + n);
        let size = self.buf.len();
        let start = (self.head + self.len) % size;
        let first = n.min(size - start);
        let got = fill(&mut self.buf[start..start + first]).min(first);
        let mut total = got;
        if got == first && n > first {
            total += fill(&mut self.buf[..n - first]).min(n - first);
        }
        self.len += total;
        total
    }

    /// Extend `len` over bytes already placed with `write_at`.
    pub fn commit(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }

    /// The bytes `[offset, offset + n)` (clipped to `len`) as up to two slices.
    pub fn slices(&self, offset: usize, n: usize) -> (&[u8], &[u8]) {
        if offset >= self.len || self.buf.is_empty() {
            return (&[], &[]);
        }
        let n = n.min(self.len - offset);
        let size = self.buf.len();
        let start = (self.head + offset) % size;
        let first = n.min(size - start);
        (&self.buf[start..start + first], &self.buf[..n - first])
    }

    /// Drop `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if self.buf.is_empty() {
            return;
        }
        self.head = (self.head + n) % self.buf.len();
        // The head is not reset when the ring empties: out-of-order bytes may sit
        // beyond `len` at offsets relative to it.
        self.len -= n;
    }

    /// Copy from the front into `out` without consuming; returns the count copied.
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        let (a, b) = self.slices(offset, out.len());
        out[..a.len()].copy_from_slice(a);
        out[a.len()..a.len() + b.len()].copy_from_slice(b);
        a.len() + b.len()
    }
}

/// Out-of-order data held beyond `rcv_nxt`, as sorted, disjoint, non-adjacent
/// `[start, end)` ranges. Bounded: a segment that would need more ranges is refused.
#[derive(Debug, Clone)]
pub struct OooRanges {
    ranges: Vec<(Seq, Seq)>,
    max: usize,
}

/// Result of adding a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OooAdd {
    /// Stored (possibly merged); the new data was partly or fully new.
    Added,
    /// Everything was already held (a duplicate).
    Duplicate,
    /// Would exceed the range limit: refused.
    Full,
}

impl OooRanges {
    /// At most `max` ranges. The list's storage comes with the first range: most
    /// connections never hold out-of-order data, and room for the maximum (64
    /// ranges, 520 bytes) was a seventh of an idle connection's memory.
    pub fn new(max: usize) -> Self {
        OooRanges {
            ranges: Vec::new(),
            max: max.max(1),
        }
    }
    /// The ranges, in sequence order.
    pub fn ranges(&self) -> &[(Seq, Seq)] {
        &self.ranges
    }
    /// No out-of-order data.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    /// Forget everything.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// Add `[start, end)`.
    pub fn add(&mut self, start: Seq, end: Seq) -> OooAdd {
        if !start.lt(end) {
            return OooAdd::Duplicate;
        }
        // First range whose end reaches start (touching merges).
        let i = self.ranges.partition_point(|r| r.1.lt(start));
        // Ranges i..j overlap or touch [start, end).
        let mut j = i;
        while j < self.ranges.len() && self.ranges[j].0.le(end) {
            j += 1;
        }
        if j == i + 1 && self.ranges[i].0.le(start) && self.ranges[i].1.ge(end) {
            return OooAdd::Duplicate;
        }
        if i == j {
            if self.ranges.len() >= self.max {
                return OooAdd::Full;
            }
            self.ranges.insert(i, (start, end));
            return OooAdd::Added;
        }
        let s = self.ranges[i].0.min(start);
        let e = self.ranges[j - 1].1.max(end);
        self.ranges[i] = (s, e);
        self.ranges.drain(i + 1..j);
        OooAdd::Added
    }

    /// If the first range starts at or before `rcv_nxt`, remove it and return its end.
    pub fn pop_contiguous(&mut self, rcv_nxt: Seq) -> Option<Seq> {
        let first = *self.ranges.first()?;
        if first.0.le(rcv_nxt) {
            self.ranges.remove(0);
            Some(first.1)
        } else {
            None
        }
    }

    /// The range containing `s`, if any.
    pub fn containing(&self, s: Seq) -> Option<(Seq, Seq)> {
        self.ranges.iter().copied().find(|r| s.in_range(r.0, r.1))
    }

    /// Whether `[start, end)` is entirely held.
    pub fn covers(&self, start: Seq, end: Seq) -> bool {
        self.ranges.iter().any(|r| r.0.le(start) && r.1.ge(end))
    }

    /// Drop everything at or beyond `limit` (used when a FIN fixes the stream end).
    pub fn truncate(&mut self, limit: Seq) {
        self.ranges.retain_mut(|r| {
            if r.1.gt(limit) {
                r.1 = limit;
            }
            r.0.lt(r.1)
        });
    }
}

/// A `fill` for [`Ring::push_with`] and the calls built on it that copies `data`
/// in order: each call is handed the next part of the destination.
pub fn fill_from(data: &[u8]) -> impl FnMut(&mut [u8]) -> usize + '_ {
    let mut at = 0;
    move |dst| {
        dst.copy_from_slice(&data[at..at + dst.len()]);
        at += dst.len();
        dst.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps() {
        let mut r = Ring::new(8);
        assert_eq!(r.push(b"abcdef"), 6);
        r.consume(4);
        assert_eq!(r.push(b"ghijklmn"), 6);
        assert_eq!(r.len(), 8);
        let (a, b) = r.slices(0, 8);
        assert_eq!([a, b].concat(), b"efghijkl");
        let mut out = [0u8; 3];
        assert_eq!(r.peek(6, &mut out), 2);
        assert_eq!(&out[..2], b"kl");
        r.consume(8);
        assert!(r.is_empty());
        assert_eq!(r.write_at(3, b"xyz"), 3);
        assert_eq!(r.write_at(0, b"abc"), 3);
        r.commit(6);
        let (a, b) = r.slices(0, 6);
        assert_eq!([a, b].concat(), b"abcxyz");
        assert_eq!(r.write_at(8, b"q"), 0);
    }

    #[test]
    fn storage_grows_with_use_and_keeps_out_of_order_bytes_in_place() {
        let mut r = Ring::new(1 << 20);
        assert_eq!(r.capacity(), 1 << 20);
        assert_eq!(r.buf.len(), 0, "nothing stored before the first write");
        // Wrap the first storage, then hold out-of-order bytes beyond len.
        let a: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        assert_eq!(r.push(&a), 3000);
        r.consume(2500);
        assert_eq!(r.push(&a), 3000); // wraps the 4 KiB storage
        assert_eq!(r.buf.len(), FIRST_STORAGE);
        assert_eq!(r.write_at(3600, b"ooo"), 3);
        assert_eq!(r.buf.len(), FIRST_STORAGE);
        // A write far beyond the storage grows it; every byte keeps its offset.
        assert_eq!(r.write_at(10_000, b"far"), 3);
        assert!(r.buf.len() >= 10_003 && r.buf.len() <= 16_384);
        let mut out = [0u8; 3500];
        assert_eq!(r.peek(0, &mut out), 3500);
        assert_eq!(&out[..500], &a[2500..]);
        assert_eq!(&out[500..], &a[..]);
        assert_eq!(r.write_at(3500, b"xyz"), 3);
        r.commit(103);
        let mut tail = [0u8; 3];
        assert_eq!(r.peek(3500, &mut tail), 3);
        assert_eq!(&tail, b"xyz");
        assert_eq!(r.write_at(3603, &[0u8; 6397]), 6397);
        r.commit(6503);
        let mut far = [0u8; 3];
        assert_eq!(r.peek(3600, &mut far), 3);
        assert_eq!(
            &far, b"ooo",
            "placed before the growth, still at its offset"
        );
        assert_eq!(r.peek(10_000, &mut far), 3);
        assert_eq!(&far, b"far");
        // Storage never passes the capacity.
        let mut small = Ring::new(100);
        assert_eq!(small.push(&[1u8; 150]), 100);
        assert_eq!(small.buf.len(), 100);
        assert_eq!(small.free(), 0);
    }

    #[test]
    fn push_with_grows_the_storage_it_fills() {
        let mut r = Ring::new(64 << 10);
        let n = r.push_with(20_000, |dst| {
            dst.fill(7);
            dst.len()
        });
        assert_eq!(n, 20_000);
        assert!(r.buf.len() >= 20_000);
        let (a, b) = r.slices(0, 20_000);
        assert_eq!(a.len() + b.len(), 20_000);
        assert!(a.iter().chain(b).all(|&x| x == 7));
    }

    proptest::proptest! {
        /// Against a model: a ring of capacity `cap` behaves as a byte queue of at
        /// most `cap` bytes plus out-of-order bytes at fixed offsets, whatever its
        /// storage does.
        #[test]
        fn behaves_as_its_model(cap in 1usize..20_000, ops in proptest::collection::vec((0u8..4, 0usize..9000, proptest::num::u8::ANY), 1..60)) {
            let mut r = Ring::new(cap);
            // Model: bytes by offset from the head, and len.
            let mut model: std::collections::VecDeque<u8> = std::collections::VecDeque::from(vec![0u8; cap]);
            let mut len = 0usize;
            for (op, n, byte) in ops {
                match op {
                    0 => {
                        let data = vec![byte; n];
                        let took = r.push(&data);
                        proptest::prop_assert_eq!(took, n.min(cap - len));
                        for k in 0..took { model[len + k] = byte; }
                        len += took;
                    }
                    1 => {
                        let k = n.min(len);
                        r.consume(k);
                        for _ in 0..k { model.pop_front(); model.push_back(0); }
                        len -= k;
                    }
                    2 => {
                        let off = len + n % 64;
                        let data = vec![byte; 1 + n % 300];
                        let w = r.write_at(off, &data);
                        proptest::prop_assert_eq!(w, if off >= cap { 0 } else { data.len().min(cap - off) });
                        for k in 0..w { model[off + k] = byte; }
                    }
                    _ => {
                        let mut out = vec![0u8; n];
                        let got = r.peek(0, &mut out);
                        proptest::prop_assert_eq!(got, n.min(len));
                        for k in 0..got { proptest::prop_assert_eq!(out[k], model[k]); }
                    }
                }
                proptest::prop_assert_eq!(r.len(), len);
                proptest::prop_assert!(r.buf.len() <= cap);
            }
        }
    }

    /// An idle connection's out-of-order list holds no storage; it takes some with
    /// the first range, and never more ranges than its limit.
    #[test]
    fn ooo_storage_comes_with_the_first_range() {
        let mut o = OooRanges::new(64);
        assert_eq!(o.ranges.capacity(), 0, "room for the maximum up front");
        for k in 0..100u32 {
            let _ = o.add(Seq(100 * k), Seq(100 * k + 10));
        }
        assert_eq!(o.ranges().len(), 64);
        assert!(o.ranges.capacity() >= 64);
    }

    #[test]
    fn ooo_merge_and_limit() {
        let mut o = OooRanges::new(2);
        assert_eq!(o.add(Seq(10), Seq(20)), OooAdd::Added);
        assert_eq!(o.add(Seq(30), Seq(40)), OooAdd::Added);
        assert_eq!(o.add(Seq(50), Seq(60)), OooAdd::Full);
        assert_eq!(o.add(Seq(12), Seq(18)), OooAdd::Duplicate);
        assert_eq!(o.add(Seq(20), Seq(30)), OooAdd::Added);
        assert_eq!(o.ranges(), &[(Seq(10), Seq(40))]);
        assert_eq!(o.add(Seq(5), Seq(45)), OooAdd::Added);
        assert_eq!(o.ranges(), &[(Seq(5), Seq(45))]);
        assert_eq!(o.pop_contiguous(Seq(4)), None);
        assert_eq!(o.pop_contiguous(Seq(5)), Some(Seq(45)));
        assert!(o.is_empty());
        o.add(Seq(u32::MAX - 2), Seq(3));
        assert!(o.covers(Seq(u32::MAX), Seq(1)));
        o.truncate(Seq(0));
        assert_eq!(o.ranges(), &[(Seq(u32::MAX - 2), Seq(0))]);
    }
}
