//! The body of `GET /bytes/N`: byte `i` (counting from 0) is `(31 * i + 7) mod 251`.
//! Its period, 251, is prime, so a block delivered at a wrong offset (other than a
//! multiple of 251) is caught. The server streams it from a precomputed table, so
//! serving costs no generation work; clients check what they got with
//! [`check_pattern`].

use std::sync::OnceLock;

/// Period of the `/bytes/N` pattern.
pub const PATTERN_PERIOD: u64 = 251;

/// Byte `i` of the `/bytes/N` pattern: `(31 * i + 7) mod 251`.
pub fn pattern_byte(i: u64) -> u8 {
    (((i % PATTERN_PERIOD) * 31 + 7) % PATTERN_PERIOD) as u8
}

/// Longest slice [`pattern_slice`] returns.
pub const PATTERN_CHUNK: usize = 64 << 10;

fn table() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        (0..(PATTERN_CHUNK as u64 + PATTERN_PERIOD))
            .map(pattern_byte)
            .collect()
    })
}

/// The pattern from offset `off`, `min(len, PATTERN_CHUNK)` bytes, without copying.
pub fn pattern_slice(off: u64, len: usize) -> &'static [u8] {
    let start = (off % PATTERN_PERIOD) as usize;
    &table()[start..start + len.min(PATTERN_CHUNK)]
}

/// Fills `buf` with the pattern from offset `off`.
pub fn fill_pattern(buf: &mut [u8], mut off: u64) {
    let mut at = 0;
    while at < buf.len() {
        let s = pattern_slice(off, buf.len() - at);
        buf[at..at + s.len()].copy_from_slice(s);
        at += s.len();
        off += s.len() as u64;
    }
}

/// The first offset in `buf` (stream offset `off`) that differs from the pattern.
pub fn check_pattern(buf: &[u8], mut off: u64) -> Option<u64> {
    let mut at = 0;
    while at < buf.len() {
        let s = pattern_slice(off, buf.len() - at);
        if buf[at..at + s.len()] != *s {
            let k = (0..s.len()).find(|&k| buf[at + k] != s[k]).unwrap_or(0);
            return Some(off + k as u64);
        }
        at += s.len();
        off += s.len() as u64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_the_documented_formula() {
        for i in [0u64, 1, 250, 251, 252, 65535, 65536, 1 << 33, u64::MAX] {
            assert_eq!(
                pattern_byte(i) as u128,
                (31 * i as u128 + 7) % 251,
                "byte {i}"
            );
        }
        for off in [0u64, 1, 250, 251, 70_000, (8 << 30) + 3] {
            let mut b = vec![0u8; 200_000];
            fill_pattern(&mut b, off);
            for (k, x) in b.iter().enumerate().step_by(997) {
                assert_eq!(*x, pattern_byte(off + k as u64));
            }
            assert_eq!(check_pattern(&b, off), None);
            b[100_001] ^= 1;
            assert_eq!(check_pattern(&b, off), Some(off + 100_001));
        }
        assert_eq!(pattern_slice(5, 1 << 30).len(), PATTERN_CHUNK);
    }
}
