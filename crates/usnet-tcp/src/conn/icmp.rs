//! ICMP errors about this connection's segments: path MTU decreases (RFC 1191,
//! RFC 8201) and hard/soft errors (RFC 1122 §4.2.3.9, RFC 5461), each accepted only
//! when the quoted sequence number is in flight (RFC 5927 §4.1), so that a blind
//! attacker has to guess it.

use super::recovery::Phase;
use super::timers::Timer;
use super::{Connection, State, TcpError};
use crate::seq::Seq;
use crate::time::Instant;

/// What an ICMP error says, as the engine acts on it. The stack maps the ICMP type
/// and code (and the reported MTU) to this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpError {
    /// Fragmentation needed (ICMPv4 type 3 code 4) or Packet Too Big (ICMPv6): the
    /// largest MSS (payload without options) that fits the reported MTU.
    PacketTooBig {
        /// New sender MSS.
        mss: u16,
    },
    /// Destination unreachable or time exceeded, as the error a socket reports.
    Unreachable {
        /// The error (`Refused`, `HostUnreachable`, `NetUnreachable`).
        error: TcpError,
        /// Ends a connection attempt (SYN-SENT, SYN-RECEIVED) at once. Otherwise, and
        /// always once synchronized, it is a soft error.
        hard: bool,
    },
}

/// What [`Connection::icmp_error`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcmpOutcome {
    /// Closed or TIME-WAIT: nothing to act on.
    Ignored,
    /// The quoted sequence number is not in `SND.UNA..SND.NXT`: stale or forged.
    OutOfWindow,
    /// The MTU does not lower the sender MSS (the quoted segment is still resent if it
    /// is too big for the MSS in force).
    MssNotLowered,
    /// The MSS was lowered; segments in flight that no longer fit are resent.
    MssLowered,
    /// A hard error ended the connection attempt.
    Aborted,
    /// Remembered; reported only if the connection later times out.
    Soft,
}

impl Connection {
    /// An ICMP error quoting one of this connection's segments, whose sequence number
    /// was `seq`. Call `poll_transmit` afterwards (a lowered MSS resends at once).
    pub fn icmp_error(&mut self, now: Instant, seq: u32, err: IcmpError) -> IcmpOutcome {
        self.now = self.now.max(now);
        if matches!(self.state, State::Closed | State::TimeWait) {
            return IcmpOutcome::Ignored;
        }
        // A Fast Open child's SND.UNA is already past its unacknowledged SYN-ACK.
        let syn_ack =
            self.syn.tfo_child && self.state == State::SynReceived && Seq(seq) == self.snd.iss;
        if !syn_ack && !Seq(seq).in_range(self.snd.una, self.snd.nxt) {
            self.stats.rare().icmp_out_of_window += 1;
            return IcmpOutcome::OutOfWindow;
        }
        match err {
            IcmpError::PacketTooBig { mss } => self.pmtu_decrease(Seq(seq), mss),
            IcmpError::Unreachable { error, hard } => {
                if hard && matches!(self.state, State::SynSent | State::SynReceived) {
                    self.stats.rare().icmp_hard_errors += 1;
                    self.enter_closed(Some(error));
                    IcmpOutcome::Aborted
                } else {
                    // Like Linux's sk_err_soft: only a later timeout reports it.
                    self.stats.rare().icmp_soft_errors += 1;
                    self.soft_error = Some(error);
                    IcmpOutcome::Soft
                }
            }
        }
    }

    /// The last soft error (an ICMP error since the last new ACK), if any.
    pub fn soft_error(&self) -> Option<TcpError> {
        self.soft_error
    }

    /// The error a timeout reports: the soft error if one is pending (Linux does the
    /// same), so the application learns why the peer did not answer.
    pub(crate) fn timeout_error(&self) -> TcpError {
        self.soft_error.unwrap_or(TcpError::TimedOut)
    }

    /// Path MTU decrease: lower the MSS and resend at once what no longer fits, from
    /// the quoted segment on. The packets were dropped by a router for their size,
    /// not by congestion, so the congestion window stays (as Linux's
    /// tcp_simple_retransmit). Segments before the quoted one passed the router
    /// before the path narrowed (its errors come in order), so they are not resent:
    /// an ICMP for one of them marks it when it arrives.
    fn pmtu_decrease(&mut self, seq: Seq, mss: u16) -> IcmpOutcome {
        // Before the peer's SYN arrives its MSS is unknown (the RFC 9293 default
        // stands in for it): compare with our own.
        // Path MTU probing may hold the MSS lower: the path's own limit is compared.
        let current = if self.state == State::SynSent {
            u32::from(self.cfg.mss)
        } else {
            self.mss_clamp().max(64)
        };
        let lowered = u32::from(mss) < current;
        if lowered {
            self.clamp_mss(mss);
            self.stats.rare().pmtu_decreases += 1;
        } else {
            self.stats.rare().pmtu_not_lowered += 1;
        }
        if lowered && self.state == State::SynSent && self.syn.fo_sent > 0 && self.syn.xmits == 1 {
            // Our Fast Open SYN was too big for the path: send the SYN again at once,
            // without the data (it follows the handshake) and advertising the MSS
            // that fits; not congestion, so no back-off.
            self.syn.pending = true;
            self.stats.rare().pmtu_resends += 1;
            return IcmpOutcome::MssLowered;
        }
        if lowered {
            self.mtu_probe_on_pmtu(u32::from(mss));
        }
        if self.resend_oversized(seq) {
            self.stats.rare().pmtu_resends += 1;
            self.enter_pmtu_phase();
        }
        if lowered {
            IcmpOutcome::MssLowered
        } else {
            IcmpOutcome::MssNotLowered
        }
    }
}

impl Connection {
    /// Mark lost the segments from `seq` on that no longer fit the MSS (Linux's
    /// `tcp_simple_retransmit`). Returns whether any was marked.
    pub(crate) fn resend_oversized(&mut self, seq: Seq) -> bool {
        let fits = self.smss();
        let mut marked = false;
        let mut i = self.scoreboard.first_ending_after(seq);
        while i < self.scoreboard.len() {
            let s = self.scoreboard[i];
            if !s.sacked && !s.lost && s.seg_payload() > fits {
                // An entry of several segments: from the segment that holds `seq`.
                if s.segs > 1 && s.start.lt(seq) {
                    self.scoreboard
                        .split(i, seq.since(s.start) / s.unit * s.unit);
                    if self.scoreboard[i].end.le(seq) {
                        i += 1;
                    }
                }
                self.scoreboard.mark_lost(i);
                marked = true;
            }
            i += 1;
        }
        marked
    }

    /// Resend what is marked lost without a congestion response: the packets were
    /// dropped for their size, not by congestion.
    pub(crate) fn enter_pmtu_phase(&mut self) {
        if !self.recovery.in_recovery() {
            self.recovery.phase = Phase::Pmtu;
            self.recovery.point = self.snd.nxt;
            self.timers.clear(Timer::Tlp);
            self.recovery.tlp_pending = false;
        }
        // The first resend goes out even if the window is full.
        self.recovery.fast_rtx_pending = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{OwnedSegment, VecSink};
    use crate::{ListenEvent, Listener, TcpConfig};
    use std::net::SocketAddr;
    use std::time::Duration;

    fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        )
    }

    fn cfg() -> TcpConfig {
        TcpConfig {
            mss: 1460,
            ..TcpConfig::default()
        }
    }

    fn take(sink: &mut VecSink) -> Vec<OwnedSegment> {
        std::mem::take(&mut sink.segments)
    }

    /// A client in ESTABLISHED that has sent `n` bytes (the returned segments, not
    /// yet delivered), and the server side.
    fn established(n: usize) -> (Connection, Box<Connection>, Vec<OwnedSegment>, Instant) {
        let (c, s) = addrs();
        let now = Instant::from_nanos(1_000_000_000);
        let mut cli = Connection::connect(c, s, now, cfg());
        let mut lst: Listener<u32> = Listener::new(s, cfg(), 16, false);
        let mut out = VecSink::default();
        let mut back = VecSink::default();
        cli.poll_transmit(now, &mut out);
        for seg in take(&mut out) {
            lst.input(now, s, c, &seg.segment(), &mut back);
        }
        let now = now + Duration::from_millis(1);
        for seg in take(&mut back) {
            cli.input(now, &seg.segment());
        }
        cli.poll_transmit(now, &mut out);
        let mut srv = None;
        for seg in take(&mut out) {
            if let ListenEvent::Established(x) = lst.input(now, s, c, &seg.segment(), &mut back) {
                srv = Some(x);
            }
        }
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.send(&vec![7u8; n]), n);
        cli.poll_transmit(now, &mut out);
        (cli, srv.expect("handshake completed"), take(&mut out), now)
    }

    #[test]
    fn packet_too_big_resends_in_flight_at_the_new_size() {
        let (mut cli, mut srv, first, now) = established(8 * 1448);
        assert_eq!(first.len(), 8);
        assert!(first.iter().all(|s| s.payload.len() == 1448));
        let una = cli.snd.una.0;
        let cwnd = cli.info().cwnd;
        // The error for the third segment: it and the later ones are resent.
        let r = cli.icmp_error(now, una + 2 * 1448, IcmpError::PacketTooBig { mss: 1240 });
        assert_eq!(r, IcmpOutcome::MssLowered);
        assert_eq!(cli.snd_mss(), 1240);
        assert_eq!(cli.scoreboard.lost_segs(), 6);
        // A late error for the first (same MTU) marks the first two as well.
        let r = cli.icmp_error(now, una + 100, IcmpError::PacketTooBig { mss: 1240 });
        assert_eq!(r, IcmpOutcome::MssNotLowered);
        assert_eq!(cli.scoreboard.lost_segs(), 8);
        assert_eq!(cli.stats().pmtu_not_lowered, 1);
        let mut out = VecSink::default();
        cli.poll_transmit(now, &mut out);
        let segs = take(&mut out);
        // The eight went as one burst, one scoreboard entry; the errors cut it after
        // the second segment. Each part is resent at the new size (1228: 1240 −
        // timestamps) as Linux resends a TSO buffer: 2 × 1448 as 3, 6 × 1448 as 8.
        assert_eq!(segs.len(), 11);
        assert!(segs.iter().all(|s| s.payload.len() <= 1228));
        let total: usize = segs.iter().map(|s| s.payload.len()).sum();
        assert_eq!(total, 8 * 1448);
        assert_eq!(segs[0].repr.seq, una);
        assert_eq!(cli.info().cwnd, cwnd, "not congestion");
        assert_eq!(cli.stats().fast_recoveries, 0);
        assert_eq!(cli.stats().pmtu_decreases, 1);
        cli.check_invariants().unwrap();
        assert_eq!(cli.recovery.phase, Phase::Pmtu);
        // More errors for the originals lower nothing and mark nothing again.
        let r = cli.icmp_error(now, una, IcmpError::PacketTooBig { mss: 1240 });
        assert_eq!(r, IcmpOutcome::MssNotLowered);
        assert_eq!(cli.scoreboard.lost_segs(), 0, "nothing marked twice");
        // The router dropped the originals; the resent pieces arrive and are ACKed:
        // the episode ends with the window intact.
        let later = now + Duration::from_millis(1);
        let mut back = VecSink::default();
        for seg in &segs {
            srv.input(later, &seg.segment());
            srv.poll_transmit(later, &mut back);
        }
        for seg in take(&mut back) {
            cli.input(later, &seg.segment());
        }
        assert_eq!(cli.snd.una, cli.snd.nxt);
        assert_eq!(cli.recovery.phase, Phase::None);
        assert!(cli.info().cwnd >= cwnd);
        assert_eq!(cli.stats().fast_recoveries + cli.stats().rto_expired, 0);
        // Once acknowledged, an ICMP about those segments is stale.
        let r = cli.icmp_error(later, una, IcmpError::PacketTooBig { mss: 1000 });
        assert_eq!(r, IcmpOutcome::OutOfWindow);
    }

    #[test]
    fn icmp_outside_the_flight_is_ignored() {
        let (mut cli, _srv, _, now) = established(4 * 1448);
        let (una, nxt) = (cli.snd.una.0, cli.snd.nxt.0);
        for seq in [una.wrapping_sub(1), nxt, nxt + 1000, una ^ 0x8000_0000] {
            let r = cli.icmp_error(now, seq, IcmpError::PacketTooBig { mss: 600 });
            assert_eq!(r, IcmpOutcome::OutOfWindow);
            let r = cli.icmp_error(
                now,
                seq,
                IcmpError::Unreachable {
                    error: TcpError::HostUnreachable,
                    hard: true,
                },
            );
            assert_eq!(r, IcmpOutcome::OutOfWindow);
        }
        assert_eq!(cli.stats().icmp_out_of_window, 8);
        assert_eq!(cli.snd_mss(), 1460);
        assert_eq!(cli.soft_error(), None);
    }

    #[test]
    fn hard_error_in_syn_sent_aborts_and_soft_error_is_kept() {
        let (c, s) = addrs();
        let now = Instant::from_nanos(1_000_000_000);
        let mut cli = Connection::connect(c, s, now, cfg());
        let mut out = VecSink::default();
        cli.poll_transmit(now, &mut out);
        let iss = cli.iss();
        let refused = IcmpError::Unreachable {
            error: TcpError::Refused,
            hard: true,
        };
        assert_eq!(
            cli.icmp_error(now, iss.wrapping_add(1), refused),
            IcmpOutcome::OutOfWindow
        );
        assert_eq!(cli.state(), State::SynSent);
        // A soft error (time exceeded) is only remembered.
        let soft = IcmpError::Unreachable {
            error: TcpError::HostUnreachable,
            hard: false,
        };
        assert_eq!(cli.icmp_error(now, iss, soft), IcmpOutcome::Soft);
        assert_eq!(cli.state(), State::SynSent);
        assert_eq!(cli.icmp_error(now, iss, refused), IcmpOutcome::Aborted);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::Refused));
        // The other hard errors end an attempt with their own variant (the stack maps
        // each to its errno).
        for error in [TcpError::HostUnreachable, TcpError::NetUnreachable] {
            let mut cli = Connection::connect(c, s, now, cfg());
            cli.poll_transmit(now, &mut out);
            let hard = IcmpError::Unreachable { error, hard: true };
            assert_eq!(cli.icmp_error(now, cli.iss(), hard), IcmpOutcome::Aborted);
            assert_eq!(cli.error(), Some(error));
        }
    }

    #[test]
    fn soft_error_in_syn_sent_is_what_the_syn_timeout_reports() {
        let (c, s) = addrs();
        let mut now = Instant::from_nanos(1_000_000_000);
        let mut cli = Connection::connect(c, s, now, cfg());
        let mut out = VecSink::default();
        cli.poll_transmit(now, &mut out);
        let soft = IcmpError::Unreachable {
            error: TcpError::NetUnreachable,
            hard: false,
        };
        assert_eq!(cli.icmp_error(now, cli.iss(), soft), IcmpOutcome::Soft);
        while let Some(t) = cli.poll_at() {
            now = now.max(t);
            cli.poll_transmit(now, &mut out);
        }
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::NetUnreachable));
    }

    #[test]
    fn soft_error_in_established_is_reported_only_by_a_timeout() {
        let (mut cli, _srv, _, mut now) = established(1000);
        let una = cli.snd.una.0;
        let e = IcmpError::Unreachable {
            error: TcpError::HostUnreachable,
            hard: true,
        };
        assert_eq!(cli.icmp_error(now, una, e), IcmpOutcome::Soft);
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.error(), None);
        // Nothing answers: the retransmissions time out with the soft error.
        let mut out = VecSink::default();
        while let Some(t) = cli.poll_at() {
            now = now.max(t);
            cli.poll_transmit(now, &mut out);
            out.segments.clear();
        }
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::HostUnreachable));
    }

    #[test]
    fn a_new_ack_clears_the_soft_error() {
        let (mut cli, mut srv, data, now) = established(1000);
        let e = IcmpError::Unreachable {
            error: TcpError::NetUnreachable,
            hard: false,
        };
        cli.icmp_error(now, cli.snd.una.0, e);
        assert_eq!(cli.soft_error(), Some(TcpError::NetUnreachable));
        let mut back = VecSink::default();
        for seg in &data {
            srv.input(now, &seg.segment());
        }
        let later = now + Duration::from_millis(50);
        srv.poll_transmit(later, &mut back);
        for seg in take(&mut back) {
            cli.input(later, &seg.segment());
        }
        assert_eq!(cli.snd.una, cli.snd.nxt);
        assert_eq!(cli.soft_error(), None);
    }
}
