//! Keepalive (RFC 9293 §3.8.4, RFC 1122 §4.2.3.6): after `idle` without a segment
//! from the peer, probe every `interval`; `count` unanswered probes reset the
//! connection. Off unless configured (SO_KEEPALIVE).

use super::timers::Timer;
use std::sync::Arc;

use super::{Connection, SegmentSink, State};
use crate::config::Keepalive;
use crate::time::Instant;

/// Keepalive progress.
#[derive(Debug, Clone)]
pub(crate) struct KeepaliveState {
    /// Probes sent since the peer was last heard from.
    pub sent: u32,
    /// The timer fired: the next transmit pass sends a probe.
    pub pending: bool,
    /// When the last segment arrived (the idle time starts there).
    pub last_rx: Instant,
}

impl KeepaliveState {
    pub(crate) fn new(now: Instant) -> Self {
        KeepaliveState {
            sent: 0,
            pending: false,
            last_rx: now,
        }
    }
}

impl Connection {
    /// SO_KEEPALIVE with its parameters, or off.
    pub fn set_keepalive(&mut self, ka: Option<Keepalive>) {
        Arc::make_mut(&mut self.cfg).keepalive = ka;
        self.keepalive.sent = 0;
        let at = ka
            .filter(|_| self.state.is_synchronized())
            .map(|k| self.keepalive.last_rx + k.idle);
        self.timers.set_or_clear(Timer::Keepalive, at);
    }

    /// The connection is established: the idle time starts.
    pub(crate) fn arm_keepalive(&mut self) {
        let at = self.cfg.keepalive.map(|k| self.now + k.idle);
        self.timers.set_or_clear(Timer::Keepalive, at);
    }

    /// A segment arrived: the peer is alive, the idle time starts again.
    pub(crate) fn keepalive_heard_peer(&mut self) {
        self.keepalive.last_rx = self.now;
        if self.state.is_synchronized() {
            if let Some(k) = self.cfg.keepalive {
                self.keepalive.sent = 0;
                self.timers.set(Timer::Keepalive, self.now + k.idle);
            }
        }
    }

    pub(crate) fn on_keepalive_timer(&mut self) {
        let now = self.now;
        if let (Some(k), true) = (self.cfg.keepalive, self.state.is_synchronized()) {
            if !self.scoreboard.is_empty() || self.state == State::TimeWait {
                // Not idle: the retransmission timer watches the peer.
                self.timers.set(Timer::Keepalive, now + k.idle);
            } else if self.keepalive_expired(k.count) {
                self.stats.rare().keepalive_timeouts += 1;
                self.error = Some(self.timeout_error());
                self.rst_pending = true;
            } else {
                self.keepalive.sent += 1;
                self.keepalive.pending = true;
                self.timers.set(Timer::Keepalive, now + k.interval);
            }
        }
    }

    /// Whether the probes so far end the connection: `count` of them unanswered,
    /// or with a user timeout, at least one unanswered and the peer silent for
    /// that long (as Linux).
    fn keepalive_expired(&self, count: u32) -> bool {
        match self.cfg.user_timeout {
            Some(ut) => {
                self.keepalive.sent > 0 && self.now.saturating_since(self.keepalive.last_rx) >= ut
            }
            None => self.keepalive.sent >= count,
        }
    }

    /// The probe: `SEQ = SND.UNA − 1`, which the peer answers with an ACK. False if
    /// the sink is full.
    pub(crate) fn send_keepalive_probe<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> bool {
        if !self.send_probe(sink) {
            return false;
        }
        self.keepalive.pending = false;
        self.stats.rare().keepalive_probes += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::TcpError;
    use super::*;
    use crate::TcpConfig;

    fn keepalive(count: u32) -> TcpConfig {
        TcpConfig {
            keepalive: Some(Keepalive {
                idle: ms(1000),
                interval: ms(100),
                count,
            }),
            ..TcpConfig::default()
        }
    }

    #[test]
    fn an_idle_connection_is_probed_and_an_answer_resets_the_count() {
        let (mut cli, mut srv) = pair(keepalive(3), TcpConfig::default());
        let at = cli
            .timers
            .get(Timer::Keepalive)
            .expect("armed when established");
        assert_eq!(at, T0 + ms(1000));
        assert!(drain(&mut cli, T0 + ms(999)).is_empty());
        let probe = drain(&mut cli, at);
        assert_eq!(probe.len(), 1);
        assert_eq!(probe[0].repr.seq, (cli.snd.una - 1u32).0);
        assert_eq!(cli.keepalive.sent, 1);
        assert_eq!(cli.timers.get(Timer::Keepalive), Some(at + ms(100)));
        // The peer answers an old sequence number with an ACK.
        feed(&mut srv, at, &probe);
        let answer = drain(&mut srv, at);
        assert_eq!(answer.len(), 1);
        feed(&mut cli, at + ms(1), &answer);
        assert_eq!(cli.keepalive.sent, 0);
        assert_eq!(
            cli.timers.get(Timer::Keepalive),
            Some(at + ms(1) + ms(1000))
        );
    }

    #[test]
    fn unanswered_probes_reset_the_connection() {
        let (mut cli, _srv) = pair(keepalive(2), TcpConfig::default());
        let mut now = T0;
        let mut rst = false;
        while let Some(t) = cli.poll_at() {
            now = t;
            rst |= drain(&mut cli, now).iter().any(|s| s.repr.flags.rst());
        }
        assert!(rst);
        assert_eq!(now, T0 + ms(1200), "idle, then two intervals");
        assert_eq!(cli.stats().keepalive_probes, 2);
        assert_eq!(cli.stats().keepalive_timeouts, 1);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::TimedOut));
    }

    #[test]
    fn data_in_flight_defers_the_probe() {
        let (mut cli, _srv) = pair(keepalive(2), TcpConfig::default());
        cli.send(b"unanswered");
        drain(&mut cli, T0);
        // Keep the RTO out of the way: only the keepalive timer is looked at here.
        cli.timers.clear(Timer::Rto);
        cli.timers.clear(Timer::Tlp);
        let at = cli.timers.get(Timer::Keepalive).unwrap();
        assert!(drain(&mut cli, at).is_empty());
        assert_eq!(cli.keepalive.sent, 0);
        assert_eq!(cli.timers.get(Timer::Keepalive), Some(at + ms(1000)));
    }

    #[test]
    fn switching_keepalive_on_and_off() {
        let (mut cli, _srv) = default_pair();
        assert!(!cli.timers.is_armed(Timer::Keepalive));
        cli.set_keepalive(keepalive(1).keepalive);
        assert_eq!(cli.timers.get(Timer::Keepalive), Some(T0 + ms(1000)));
        cli.set_keepalive(None);
        assert!(!cli.timers.is_armed(Timer::Keepalive));
    }
}
