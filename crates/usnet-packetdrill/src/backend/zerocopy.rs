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

#[cfg(test)]
mod tests {
    use super::*;

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
