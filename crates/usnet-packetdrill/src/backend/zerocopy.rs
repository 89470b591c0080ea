//! `MSG_ZEROCOPY` (Linux `Documentation/networking/msg_zerocopy.rst`) as the
//! backend can offer it: usnet copies every send into its ring, so each zero-copy
//! send completes with `SO_EE_CODE_ZEROCOPY_COPIED` once the peer acknowledged all
//! of its bytes. A socket with `SO_ZEROCOPY` numbers its non-empty `MSG_ZEROCOPY`
//! sends from 0; completions wait on the error queue (`recvmsg(MSG_ERRQUEUE)`,
//! `POLLERR`) as ranges `[ee_info, ee_data]`, a range growing while it is queued
//! and the next id completes, as Linux coalesces them.

use std::ffi::c_int;

use usnet_client::msgzc::ZcSends;

use super::{Backend, Kind, Res};

/// A socket's zero-copy state: the numbering and coalescing are the client
/// library's (`usnet_client::msgzc::ZcSends`), counted here in the bytes this
/// socket's sends queued.
#[derive(Debug, Default)]
pub(crate) struct ZeroCopy {
    /// SO_ZEROCOPY.
    pub on: bool,
    /// Bytes this socket's sends queued, in all.
    pub written: u64,
    sends: ZcSends,
}

impl ZeroCopy {
    /// A `MSG_ZEROCOPY` send that queued bytes up to `written` gets the next id.
    pub fn record(&mut self) {
        self.sends.record(self.written);
    }

    /// Sends wait for their acknowledgement.
    pub fn has_inflight(&self) -> bool {
        self.sends.has_inflight()
    }

    /// Completions queued: the ranges, and the highest id (it grows as a range
    /// does).
    pub fn queued(&self) -> (usize, Option<u32>) {
        self.sends.queued()
    }
}

impl Backend {
    /// Moves the acknowledged zero-copy sends of `fd` to its error queue; whether
    /// the queue holds a completion.
    pub(crate) fn zerocopy_pending(&mut self, fd: c_int) -> bool {
        let Some(f) = self.fds.get(&fd) else {
            return false;
        };
        if !f.zc.has_inflight() {
            return f.zc.queued().0 > 0;
        }
        let acked = match f.kind {
            Kind::Conn(h) => match self.stack().tcp_info(h) {
                Ok(i) if i.state != usnet_stack::TcpState::Closed => {
                    f.zc.written.saturating_sub(i.send_queued as u64)
                }
                _ => u64::MAX,
            },
            _ => u64::MAX,
        };
        let f = self.fds.get_mut(&fd).expect("looked up above");
        f.zc.sends.complete(acked);
        f.zc.queued().0 > 0
    }

    /// `recvmsg(MSG_ERRQUEUE)`: the oldest completion `(lo, hi)`, and whether the
    /// socket is IPv6 (for the cmsg level and type); `EAGAIN` when none.
    pub fn zerocopy_take(&mut self, fd: c_int) -> Res<((u32, u32), bool)> {
        self.fd(fd)?;
        self.zerocopy_pending(fd);
        let f = self.fd(fd)?;
        let v6 = f.v6;
        f.zc.sends.pop().map(|r| (r, v6)).ok_or(libc::EAGAIN)
    }
}

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

    /// The completed ranges waiting, oldest first.
    fn queue(z: &ZeroCopy) -> Vec<(u32, u32)> {
        let mut s = z.sends.clone();
        std::iter::from_fn(|| s.pop()).collect()
    }

    #[test]
    fn completions_coalesce_while_queued() {
        let mut z = ZeroCopy::default();
        for n in [100, 200, 300] {
            z.written += n;
            z.record();
        }
        z.sends.complete(99);
        assert!(queue(&z).is_empty(), "nothing fully acknowledged");
        z.sends.complete(300);
        assert_eq!(queue(&z), [(0, 1)]);
        z.sends.complete(600);
        assert_eq!(queue(&z), [(0, 2)], "grows while unread");
        while z.sends.pop().is_some() {}
        z.written += 10;
        z.record();
        z.sends.complete(u64::MAX);
        assert_eq!(queue(&z), [(3, 3)]);
    }
}
