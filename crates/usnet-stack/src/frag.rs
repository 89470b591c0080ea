//! IP fragment reassembly for IPv4 and IPv6, with a memory limit, an entry limit and a
//! time limit. Overlapping fragments drop the whole datagram (RFC 5722, which Linux also
//! applies to IPv4); exact duplicates are ignored. Reassembly is not on the hot path, so
//! it owns heap buffers; they are bounded by `memory`.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::time::Instant;

/// Largest reassembled payload (the IP total length field is 16 bits).
pub const MAX_DATAGRAM: usize = 65535;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragKey {
    V4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        proto: u8,
        ident: u16,
    },
    V6 {
        src: Ipv6Addr,
        dst: Ipv6Addr,
        ident: u32,
    },
}

#[derive(Debug, PartialEq, Eq)]
pub enum FragResult {
    Incomplete,
    /// The whole upper-layer payload; `proto` is the upper protocol; `invoking` is the
    /// first fragment's header + 8 bytes (for ICMP errors about the datagram).
    Complete {
        proto: u8,
        data: Vec<u8>,
        invoking: Vec<u8>,
    },
    /// Memory or entry limit.
    Overflow,
    /// Bad offset/size, inconsistent last fragment or overlap: the datagram is dropped.
    Bad,
}

#[derive(Debug)]
struct Datagram {
    key: FragKey,
    proto: u8,
    data: Vec<u8>,
    /// Received byte ranges, sorted and merged.
    ranges: Vec<(usize, usize)>,
    total: Option<usize>,
    deadline: Instant,
    invoking: Vec<u8>,
}

/// A datagram that timed out.
#[derive(Debug)]
pub struct Expired {
    pub key: FragKey,
    /// First fragment's header + 8 bytes, when the first fragment had arrived.
    pub invoking: Vec<u8>,
}

pub struct Reassembler {
    entries: Vec<Datagram>,
    /// Unfinished datagrams thrown out to make room (limits reached).
    pub evicted: u64,
    mem_used: usize,
    memory: usize,
    max_entries: usize,
    timeout: Duration,
}

impl Reassembler {
    pub fn new(memory: usize, max_entries: usize, timeout: Duration) -> Self {
        Reassembler {
            entries: Vec::new(),
            evicted: 0,
            mem_used: 0,
            memory,
            max_entries,
            timeout,
        }
    }

    pub fn in_progress(&self) -> usize {
        self.entries.len()
    }

    pub fn memory_used(&self) -> usize {
        self.mem_used
    }

    /// Adds one fragment. `offset` in bytes; `first_header` is the fragment's own IP
    /// header plus the first 8 payload bytes when `offset == 0`.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        now: Instant,
        key: FragKey,
        proto: u8,
        offset: usize,
        more: bool,
        payload: &[u8],
        first_header: &[u8],
    ) -> FragResult {
        let end = offset + payload.len();
        if end > MAX_DATAGRAM
            || (more && !payload.len().is_multiple_of(8))
            || (more && payload.is_empty())
        {
            self.remove_key(&key);
            return FragResult::Bad;
        }
        if end > self.memory {
            // Could never fit, even alone: refuse before evicting anything for it.
            self.remove_key(&key);
            return FragResult::Overflow;
        }
        let idx = match self.entries.iter().position(|d| d.key == key) {
            Some(i) => i,
            None => {
                if self.entries.len() >= self.max_entries {
                    self.evict_oldest();
                }
                if self.entries.len() >= self.max_entries {
                    return FragResult::Overflow;
                }
                self.entries.push(Datagram {
                    key,
                    proto,
                    data: Vec::new(),
                    ranges: Vec::new(),
                    total: None,
                    deadline: now + self.timeout,
                    invoking: Vec::new(),
                });
                self.entries.len() - 1
            }
        };

        // Consistency of the last fragment and of anything past it.
        let d = &self.entries[idx];
        let bad_total = match d.total {
            Some(t) => end > t || (!more && end != t),
            None => !more && d.ranges.last().is_some_and(|r| r.1 > end),
        };
        if bad_total {
            self.remove_at(idx);
            return FragResult::Bad;
        }
        // Overlap check: an exact duplicate is ignored, anything else overlapping is bad.
        let mut duplicate = false;
        for &(s, e) in &d.ranges {
            if offset < e && s < end {
                let inside = s <= offset && end <= e;
                if inside && d.data.get(offset..end) == Some(payload) {
                    duplicate = true;
                } else {
                    self.remove_at(idx);
                    return FragResult::Bad;
                }
            }
        }
        if duplicate {
            return FragResult::Incomplete;
        }

        let growth = end.saturating_sub(self.entries[idx].data.len());
        while self.mem_used + growth > self.memory && self.entries.len() > 1 {
            // Make room by dropping the oldest other datagram (as Linux's frag evictor).
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != idx)
                .min_by_key(|(_, d)| d.deadline)
                .map(|(i, _)| i);
            match oldest {
                Some(o) => {
                    self.remove_at(o);
                    self.evicted += 1;
                    if o < idx {
                        return self.insert(now, key, proto, offset, more, payload, first_header);
                    }
                }
                None => break,
            }
        }
        if self.mem_used + growth > self.memory {
            self.remove_key(&key);
            return FragResult::Overflow;
        }
        self.mem_used += growth;
        let d = &mut self.entries[idx];
        if d.data.len() < end {
            d.data.resize(end, 0);
        }
        d.data[offset..end].copy_from_slice(payload);
        if offset == 0 {
            d.invoking = first_header.to_vec();
            d.proto = proto;
        }
        if !more {
            d.total = Some(end);
        }
        insert_range(&mut d.ranges, offset, end);

        if d.total.is_some_and(|t| d.ranges.as_slice() == [(0, t)]) {
            let d = self.remove_at(idx);
            return FragResult::Complete {
                proto: d.proto,
                data: d.data,
                invoking: d.invoking,
            };
        }
        FragResult::Incomplete
    }

    /// Drops datagrams whose time is up.
    pub fn poll(&mut self, now: Instant, expired: &mut Vec<Expired>) {
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].deadline <= now {
                let d = self.remove_at(i);
                expired.push(Expired {
                    key: d.key,
                    invoking: d.invoking,
                });
            } else {
                i += 1;
            }
        }
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.entries.iter().map(|d| d.deadline).min()
    }

    fn remove_at(&mut self, i: usize) -> Datagram {
        let d = self.entries.swap_remove(i);
        self.mem_used -= d.data.len();
        d
    }

    fn remove_key(&mut self, key: &FragKey) {
        if let Some(i) = self.entries.iter().position(|d| d.key == *key) {
            self.remove_at(i);
        }
    }

    fn evict_oldest(&mut self) {
        if let Some(i) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| d.deadline)
            .map(|(i, _)| i)
        {
            self.remove_at(i);
            self.evicted += 1;
        }
    }
}

fn insert_range(ranges: &mut Vec<(usize, usize)>, start: usize, end: usize) {
    if start == end {
        return;
    }
    let pos = ranges.partition_point(|r| r.0 < start);
    ranges.insert(pos, (start, end));
    // Merge neighbours that touch (overlaps were rejected before).
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for &(s, e) in ranges.iter() {
        match merged.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *ranges = merged;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ident: u16) -> FragKey {
        FragKey::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            proto: 17,
            ident,
        }
    }

    fn r() -> Reassembler {
        Reassembler::new(1 << 20, 8, Duration::from_secs(30))
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn reassembles_in_any_order() {
        let payload = data(4000);
        let pieces: Vec<(usize, &[u8])> = payload
            .chunks(1480)
            .enumerate()
            .map(|(i, c)| (i * 1480, c))
            .collect();
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let mut ra = r();
            let mut result = FragResult::Incomplete;
            for &i in &order {
                let (off, c) = pieces[i];
                let more = i != pieces.len() - 1;
                result = ra.insert(Instant::ZERO, key(1), 17, off, more, c, b"hdr");
            }
            match result {
                FragResult::Complete {
                    proto,
                    data,
                    invoking,
                } => {
                    assert_eq!(proto, 17);
                    assert_eq!(data, payload);
                    assert_eq!(invoking, b"hdr");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(ra.memory_used(), 0);
            assert_eq!(ra.in_progress(), 0);
        }
    }

    #[test]
    fn duplicates_ignored_overlaps_rejected() {
        let p = data(16);
        let mut ra = r();
        assert_eq!(
            ra.insert(Instant::ZERO, key(1), 17, 0, true, &p[..8], b""),
            FragResult::Incomplete
        );
        assert_eq!(
            ra.insert(Instant::ZERO, key(1), 17, 0, true, &p[..8], b""),
            FragResult::Incomplete
        );
        assert_eq!(
            ra.insert(Instant::ZERO, key(1), 17, 0, true, &p[8..16], b""),
            FragResult::Bad
        );
        assert_eq!(ra.in_progress(), 0);
    }

    #[test]
    fn bad_sizes_and_inconsistent_ends() {
        let mut ra = r();
        assert_eq!(
            ra.insert(Instant::ZERO, key(1), 17, 0, true, &[0; 7], b""),
            FragResult::Bad
        );
        assert_eq!(
            ra.insert(Instant::ZERO, key(2), 17, 65528, false, &[0; 16], b""),
            FragResult::Bad
        );
        ra.insert(Instant::ZERO, key(3), 17, 16, false, &[0; 8], b"");
        assert_eq!(
            ra.insert(Instant::ZERO, key(3), 17, 32, true, &[0; 8], b""),
            FragResult::Bad
        );
        assert_eq!(ra.memory_used(), 0);
    }

    #[test]
    fn time_limit_expires_and_memory_limit_evicts() {
        let mut ra = Reassembler::new(4096, 2, Duration::from_secs(30));
        ra.insert(Instant::ZERO, key(1), 17, 0, true, &[1; 2000], b"h1");
        ra.insert(
            Instant::from_millis(1),
            key(2),
            17,
            0,
            true,
            &[2; 2000],
            b"h2",
        );
        // A third datagram evicts the oldest (entry limit 2).
        ra.insert(Instant::from_millis(2), key(3), 17, 0, true, &[3; 8], b"h3");
        assert_eq!(ra.in_progress(), 2);
        // A fragment that cannot fit even alone is refused.
        assert_eq!(
            ra.insert(
                Instant::from_millis(3),
                key(4),
                17,
                0,
                true,
                &[4; 5000],
                b""
            ),
            FragResult::Overflow
        );
        let mut exp = Vec::new();
        ra.poll(Instant::from_millis(40_000), &mut exp);
        assert_eq!(ra.in_progress(), 0);
        assert_eq!(exp.len(), 2);
        assert!(exp.iter().any(|e| e.invoking == b"h3"));
        assert_eq!(ra.memory_used(), 0);
    }
}
