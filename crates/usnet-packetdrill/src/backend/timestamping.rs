//! `SO_TIMESTAMPING` transmit timestamps on the backend's sockets: the
//! bookkeeping is `usnet_stack::tx_stamps` (shared with the stack server), fed
//! after every run of the stack with virtual microseconds.

use std::ffi::c_int;

pub use usnet_stack::tx_stamps::{Stamp, TxStamps as Timestamping, OPT_ID};

use super::{Backend, Kind, Res};

impl Backend {
    /// Reports what each timestamping socket's connection sent or had
    /// acknowledged since the last look (after every run of the stack).
    pub(crate) fn timestamp_progress(&mut self) {
        let now = self.now_us();
        let fds: Vec<(c_int, Kind, u64)> = self
            .fds
            .iter()
            .filter(|(_, f)| f.ts.marked())
            .map(|(&fd, f)| (fd, f.kind, f.zc.written))
            .collect();
        for (fd, kind, written) in fds {
            let (sent, acked) = match kind {
                Kind::Conn(h) => match self.stack().tcp_info(h) {
                    Ok(i) => {
                        let acked = written.saturating_sub(i.send_queued as u64);
                        let sent = (acked + u64::from(i.bytes_in_flight)).min(written);
                        (sent, Some(acked))
                    }
                    Err(_) => (0, None),
                },
                _ => (0, None),
            };
            if let Some(f) = self.fds.get_mut(&fd) {
                f.ts.progress(sent, acked, now);
            }
        }
    }

    /// `setsockopt(SO_TIMESTAMPING)` on `fd`: `OPT_ID` needs a connection (Linux:
    /// `EINVAL` in CLOSE and LISTEN).
    pub(crate) fn set_timestamping(&mut self, fd: c_int, flags: u32) -> Res<()> {
        let f = self.fd(fd)?;
        let (kind, written) = (f.kind, f.zc.written);
        let acked = match kind {
            Kind::Conn(h) => {
                let q = self.stack().tcp_info(h).map_err(super::map)?.send_queued;
                written.saturating_sub(q as u64)
            }
            _ if flags & OPT_ID != 0 => return Err(libc::EINVAL),
            _ => 0,
        };
        self.fd(fd)?
            .ts
            .set(flags, acked, written)
            .map_err(|_| libc::EINVAL)
    }

    /// After a send on `fd` that queued bytes: its last byte is marked.
    pub(crate) fn timestamp_sent(&mut self, fd: c_int) {
        if let Ok(f) = self.fd(fd) {
            let w = f.zc.written;
            f.ts.record(w);
            // It may have left already.
            self.timestamp_progress();
        }
    }

    /// `recvmsg(MSG_ERRQUEUE)`: the oldest timestamp report and whether the socket
    /// is IPv6; `EAGAIN` when none.
    pub fn timestamp_take(&mut self, fd: c_int) -> Res<(Stamp, bool)> {
        let f = self.fd(fd)?;
        let v6 = f.v6;
        f.ts.take().map(|s| (s, v6)).ok_or(libc::EAGAIN)
    }

    /// Whether `fd` has a timestamp report queued (`POLLERR`).
    pub(crate) fn timestamp_pending(&self, fd: c_int) -> bool {
        self.fds.get(&fd).is_some_and(|f| f.ts.queued())
    }
}
