//! Where the sender's time goes, as Linux's `tcp_info` reports it
//! (`tcpi_busy_time`, `tcpi_rwnd_limited`, `tcpi_sndbuf_limited`): from data being
//! queued until everything is acknowledged the connection is busy; while the peer's
//! window stops the next segment it is receive-window limited; while a write finds
//! the send buffer full it is send-buffer limited. One state runs at a time, the
//! more limiting one winning.

use std::time::Duration;

use super::Connection;
use crate::time::Instant;

/// A state of the chronograph, least limiting first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Chrono {
    Busy = 0,
    RwndLimited = 1,
    SndbufLimited = 2,
}

/// The running state and the time spent in each.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chronos {
    current: Option<(Chrono, Instant)>,
    total: [Duration; 3],
}

impl Chronos {
    fn set(&mut self, k: Option<Chrono>, now: Instant) {
        if let Some((c, since)) = self.current {
            self.total[c as usize] += now.saturating_since(since);
        }
        self.current = k.map(|k| (k, now));
    }

    /// Time spent in `k` up to `now`.
    pub(crate) fn spent(&self, k: Chrono, now: Instant) -> Duration {
        let running = match self.current {
            Some((c, since)) if c == k => now.saturating_since(since),
            _ => Duration::ZERO,
        };
        self.total[k as usize] + running
    }

    /// Time spent busy in any state up to `now` (Linux's `tcpi_busy_time`).
    pub(crate) fn busy(&self, now: Instant) -> Duration {
        [Chrono::Busy, Chrono::RwndLimited, Chrono::SndbufLimited]
            .iter()
            .map(|&k| self.spent(k, now))
            .sum()
    }
}

impl Connection {
    /// Enters `k` unless a more limiting state runs.
    pub(crate) fn chrono_start(&mut self, k: Chrono) {
        if self.chrono.current.is_none_or(|(c, _)| k > c) {
            self.chrono.set(Some(k), self.now);
        }
    }

    /// Leaves `k` (back to busy while data waits or is in flight); with nothing
    /// queued, stops.
    pub(crate) fn chrono_stop(&mut self, k: Chrono) {
        if self.snd.buf.is_empty() && !self.snd.fin_queued {
            self.chrono.set(None, self.now);
        } else if self.chrono.current.is_some_and(|(c, _)| c == k) {
            self.chrono.set(Some(Chrono::Busy), self.now);
        }
    }

    /// After a transmit pass: is the peer's window what stops the next segment?
    pub(crate) fn chrono_after_transmit(&mut self) {
        if !self.state.is_synchronized() {
            return;
        }
        let off = self.snd.nxt.since(self.snd.una) as usize;
        let unsent = self.snd.buf.len().saturating_sub(off);
        let win_left = (self.snd.una + self.snd.wnd).since(self.snd.nxt) as usize;
        // As Linux's `tcp_write_xmit`, which tests cwnd before the window: a
        // sender that cwnd stops is not window limited.
        let cwnd_room = self.pipe_est() < self.cc.cwnd();
        if unsent > 0 && cwnd_room && win_left < unsent.min(self.smss() as usize) {
            self.chrono_start(Chrono::RwndLimited);
        } else {
            self.chrono_stop(Chrono::RwndLimited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn busy_and_window_limited_time_add_up() {
        let (mut cli, mut srv) = default_pair();
        let (wl1, wl2) = (cli.snd.wl1, cli.snd.wl2);
        cli.update_send_window(wl1, wl2, 0);
        cli.send(&[1u8; 1000]);
        drain(&mut cli, T0);
        // 100 ms against a zero window.
        let t1 = T0 + ms(100);
        cli.update_send_window(wl1, wl2, 100);
        let data = drain(&mut cli, t1);
        assert_eq!(data.len(), 1);
        let i = cli.info_at(t1);
        assert_eq!((i.rwnd_limited, i.busy_time), (ms(100), ms(100)));
        // 30 ms busy until it is acknowledged; then idle time counts for nothing.
        feed(&mut srv, t1, &data);
        feed(&mut cli, t1 + ms(30), &drain(&mut srv, t1));
        let i = cli.info_at(t1 + ms(500));
        assert_eq!((i.rwnd_limited, i.busy_time), (ms(100), ms(130)));
        assert_eq!(i.sndbuf_limited, Duration::ZERO);
    }

    #[test]
    fn a_full_send_buffer_counts_as_send_buffer_limited() {
        let cfg = crate::TcpConfig {
            send_buffer: 4096,
            ..crate::TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg, crate::TcpConfig::default());
        assert!(cli.send(&[1u8; 10_000]) < 10_000);
        let out = drain(&mut cli, T0);
        feed(&mut srv, T0 + ms(20), &out);
        feed(&mut cli, T0 + ms(40), &drain(&mut srv, T0 + ms(20)));
        let i = cli.info_at(T0 + ms(40));
        assert_eq!(i.sndbuf_limited, ms(40));
    }
}
