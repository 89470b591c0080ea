//! `MSG_ZEROCOPY` (Linux `Documentation/networking/msg_zerocopy.rst`) on a session:
//! a send with `MSG_ZEROCOPY` on a socket with `SO_ZEROCOPY` is numbered (from 0),
//! and its completion waits on the socket's error queue once the peer acknowledged
//! all of its bytes. Every send is copied into the session's send ring, so each
//! completes with `SO_EE_CODE_ZEROCOPY_COPIED`, as Linux reports a send it copied.
//!
//! The bytes of a send end at a position of the send ring (`TX_PROD` counts them);
//! the server publishes how far the peer acknowledged in the same count
//! (`usnet_session_abi::slot::TX_ACKED`), bumps the slot's events and rings the bell when it
//! moves. Completed sends are ranges `[lo, hi]`: a range grows while it is queued
//! and the next id completes, as Linux coalesces them.

use std::collections::VecDeque;

/// Linux's `MAX_SKB_FRAGS`: the page fragments one buffer of a zero-copy send holds.
pub const MAX_FRAGS: usize = 17;

const PAGE: usize = 4096;

/// Where a zero-copy send of these iovec pieces (`(address, length)`) must start a new
/// segment: each user page piece is a fragment of the buffer (a piece continuing the
/// previous one in the same page adds to its fragment), and a buffer out of
/// fragments is pushed and closed, as Linux's `MSG_ZEROCOPY` does (`tcp_mark_push`
/// when `skb_zerocopy_iter_stream` finds no fragment free). Offsets into the data.
pub fn frag_breaks(pieces: &[(usize, usize)]) -> Vec<usize> {
    let mut breaks = Vec::new();
    let (mut frags, mut off, mut prev_end) = (0usize, 0usize, None);
    for &(base, len) in pieces {
        let (mut addr, mut left) = (base, len);
        while left > 0 {
            let chunk = left.min(PAGE - addr % PAGE);
            let coalesces = prev_end == Some(addr) && addr % PAGE != 0;
            if !coalesces {
                if frags == MAX_FRAGS {
                    breaks.push(off);
                    frags = 0;
                }
                frags += 1;
            }
            prev_end = Some(addr + chunk);
            off += chunk;
            addr += chunk;
            left -= chunk;
        }
    }
    breaks
}

/// One socket's zero-copy sends.
#[derive(Debug, Default, Clone)]
pub struct ZcSends {
    next: u32,
    /// Sends not yet acknowledged: (id, send ring position after its bytes).
    inflight: VecDeque<(u32, u64)>,
    /// Completed ranges not yet read.
    queue: VecDeque<(u32, u32)>,
}

impl ZcSends {
    /// A zero-copy send whose bytes end at ring position `end` gets the next id.
    pub fn record(&mut self, end: u64) {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.inflight.push_back((id, end));
    }

    /// Moves the sends acknowledged up to `acked` to the queue.
    pub fn complete(&mut self, acked: u64) {
        while let Some(&(id, end)) = self.inflight.front() {
            if end > acked {
                break;
            }
            self.inflight.pop_front();
            match self.queue.back_mut() {
                Some((_, hi)) if hi.wrapping_add(1) == id => *hi = id,
                _ => self.queue.push_back((id, id)),
            }
        }
    }

    /// Sends wait for their acknowledgement.
    pub fn has_inflight(&self) -> bool {
        !self.inflight.is_empty()
    }

    /// Completions queued: the ranges, and the highest id (it grows as a range
    /// does).
    pub fn queued(&self) -> (usize, Option<u32>) {
        (self.queue.len(), self.queue.back().map(|r| r.1))
    }

    /// Whether a completion waits (or would, after `acked`): `POLLERR`.
    pub fn pending(&self, acked: u64) -> bool {
        !self.queue.is_empty() || self.inflight.front().is_some_and(|&(_, end)| end <= acked)
    }

    /// The oldest completed range.
    pub fn take(&mut self, acked: u64) -> Option<(u32, u32)> {
        self.complete(acked);
        self.pop()
    }

    /// The oldest range already completed.
    pub fn pop(&mut self) -> Option<(u32, u32)> {
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_out_of_fragments_ends_a_segment() {
        // Eighteen one-byte pieces 64 bytes apart: seventeen fragments, then a new
        // buffer for the eighteenth.
        let apart: Vec<(usize, usize)> = (0..18).map(|i| (0x10000 + 64 * i, 1)).collect();
        assert_eq!(frag_breaks(&apart), [17]);
        // Contiguous pieces in one page are one fragment.
        let contiguous: Vec<(usize, usize)> = (0..18).map(|i| (0x10000 + i, 1)).collect();
        assert!(frag_breaks(&contiguous).is_empty());
        // A piece over 18 pages: a fragment per page.
        assert_eq!(frag_breaks(&[(0x10000, 18 * 4096)]), [17 * 4096]);
    }

    #[test]
    fn completions_are_numbered_and_coalesce_while_queued() {
        let mut z = ZcSends::default();
        z.record(100);
        z.record(200);
        z.record(300);
        assert!(!z.pending(99));
        assert!(z.pending(100));
        z.complete(200);
        // 0 and 1 are one range; 2 joins it when it completes before it is read.
        z.complete(300);
        assert_eq!(z.take(300), Some((0, 2)));
        assert_eq!(z.take(300), None);
        z.record(400);
        assert_eq!(z.take(400), Some((3, 3)), "a new range after one was read");
        // A connection that is gone completes everything.
        z.record(500);
        z.record(600);
        assert_eq!(z.take(u64::MAX), Some((4, 5)));
    }
}
