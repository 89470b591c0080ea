//! Explicit Congestion Notification (RFC 3168 §6.1). The handshake negotiates it
//! (an ECN-setup SYN carries ECE and CWR, the ECN-setup SYN-ACK ECE alone); then
//! new data goes out ECT(0) (never SYNs, pure ACKs, probes or retransmissions,
//! §6.1.4-6.1.6), a CE mark on arriving data is echoed with ECE on every ACK until
//! the sender's CWR arrives (§6.1.3), and an ECE reduces the congestion window as a
//! loss would, once per window of data, the first new data after it carrying CWR
//! (§6.1.2). The reduction is spread over the window's ACKs by proportional rate
//! reduction (RFC 6937, with the conservative reduction bound), not taken at once.

use usnet_wire::TcpFlags;

use super::{Connection, Segment};
use crate::config::ECN_ON;
use crate::seq::Seq;

/// ECN progress of one connection.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EcnState {
    /// Both ends agreed to ECN.
    pub ok: bool,
    /// Our first SYN was an ECN-setup SYN.
    pub asked: bool,
    /// Receiver: a CE mark arrived; our ACKs carry ECE until a CWR arrives.
    pub echo: bool,
    /// A CE mark was ever seen (Linux `TCPI_OPT_ECN_SEEN`).
    pub seen: bool,
    /// Sender: the window was reduced; the next new data segment carries CWR.
    pub cwr_pending: bool,
    /// Sender: reduced for the window of data up to here; ECEs until SND.UNA passes
    /// it are about that window.
    pub cwr_until: Option<Seq>,
    /// The reduction under way (RFC 6937).
    pub prr: Option<Prr>,
    /// Sequence number of the segment that last carried CWR: ACKs up to it were
    /// sent before the receiver saw it, so their ECE is old news.
    pub cwr_sent: Option<Seq>,
}

/// Proportional rate reduction's state (RFC 6937 §3), in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Prr {
    /// FlightSize when the reduction began.
    pub recover_fs: u32,
    /// Delivered (cumulatively or selectively acknowledged) since.
    pub delivered: u32,
    /// Sent since.
    pub out: u32,
}

impl Connection {
    /// ECE and CWR for our first SYN when the configuration asks for ECN.
    pub(crate) fn ecn_syn_flags(&mut self) -> TcpFlags {
        if self.syn.xmits == 0 && self.cfg.ecn == ECN_ON {
            self.ecn.asked = true;
            TcpFlags::ECE | TcpFlags::CWR
        } else {
            TcpFlags::empty()
        }
    }

    /// The peer's SYN-ACK answered our SYN: ECN is on if ours asked and it is an
    /// ECN-setup SYN-ACK (ECE without CWR).
    pub(crate) fn ecn_synack_received(&mut self, flags: TcpFlags) {
        self.ecn.ok = self.ecn.asked && flags.ece() && !flags.cwr();
    }

    /// Whether an outgoing segment is marked ECT(0): new data once ECN is on.
    pub(crate) fn ecn_ect(&self, flags: TcpFlags, seq: Seq, data_len: usize) -> bool {
        self.ecn.ok && data_len > 0 && !flags.syn() && !flags.rst() && seq == self.snd.nxt
    }

    /// The ECN bits of an outgoing segment after the handshake: ECE while echoing a
    /// CE mark, CWR on the first new data after a reduction.
    pub(crate) fn ecn_flags(&self, flags: TcpFlags, ect: bool) -> TcpFlags {
        let mut f = TcpFlags::empty();
        if !self.ecn.ok || flags.rst() {
            return f;
        }
        if flags.syn() {
            // Our SYN-ACK of an ECN-setup SYN.
            return TcpFlags::ECE;
        }
        if self.ecn.echo && flags.ack() {
            f |= TcpFlags::ECE;
        }
        if ect && self.ecn.cwr_pending {
            f |= TcpFlags::CWR;
        }
        f
    }

    /// A segment starting at `seq` went out with `flags`.
    pub(crate) fn ecn_sent(&mut self, flags: TcpFlags, seq: Seq) {
        if flags.cwr() && !flags.syn() {
            self.ecn.cwr_pending = false;
            self.ecn.cwr_sent = Some(seq);
        }
    }

    /// The receiver's part for an acceptable segment: a CWR with data ends the echo,
    /// a CE mark on data starts it (and is acknowledged at once, as Linux does).
    pub(crate) fn ecn_on_segment(&mut self, seg: &Segment) {
        if !self.ecn.ok || seg.payload.is_empty() {
            return;
        }
        if seg.flags.cwr() {
            self.ecn.echo = false;
        }
        if seg.ce {
            self.stats.rare().rx_ecn_ce += 1;
            self.ecn.seen = true;
            if !self.ecn.echo {
                self.ecn.echo = true;
                self.ack.pending = true;
            }
        }
    }

    /// The sender's part for an ACK that delivered `delivered` bytes (and
    /// acknowledged retransmitted data, or marked new losses, as the flags say): an
    /// ECE (on
    /// anything but a SYN) starts a reduction, once per window of data, not before
    /// the last one's CWR went out and not during loss recovery (which reduces for
    /// itself); during one, PRR sets cwnd.
    pub(crate) fn ecn_on_ack(
        &mut self,
        seg: &Segment,
        delivered: u32,
        retrans_acked: bool,
        newly_lost: bool,
    ) {
        if let Some(p) = self.ecn.cwr_until {
            if self.snd.una.ge(p) || self.recovery.in_recovery() {
                self.ecn.cwr_until = None;
                // RFC 6937: the reduction ends at ssthresh (loss recovery, if it
                // took over, sets its own window).
                if self.ecn.prr.take().is_some() && !self.recovery.in_recovery() {
                    let ss = self.cc.ssthresh();
                    self.cc.set_cwnd(ss);
                }
            }
        }
        if self.ecn.ok && seg.flags.ece() && !seg.flags.syn() {
            self.stats.rare().rx_ecn_ece += 1;
            // Echoes sent before the receiver saw our CWR (or before it went out)
            // are of the congestion already reacted to.
            let fresh = self.ecn.cwr_sent.is_none_or(|c| Seq(seg.ack).gt(c));
            if self.ecn.cwr_until.is_none()
                && !self.ecn.cwr_pending
                && fresh
                && !self.recovery.in_recovery()
            {
                let flight = self.snd.nxt.since(self.snd.una);
                self.cc.on_loss(self.now, flight, self.smss());
                self.stats.rare().ecn_reductions += 1;
                self.ecn.cwr_until = Some(self.snd.nxt);
                self.ecn.cwr_pending = true;
                self.ecn.prr = Some(Prr {
                    recover_fs: flight.max(1),
                    ..Prr::default()
                });
            }
        }
        self.prr_on_ack(delivered, retrans_acked, newly_lost);
    }

    /// RFC 6937 §3 on an ACK that delivered `delivered` bytes during a reduction
    /// (an ECN echo's or fast recovery's): cwnd = pipe + sndcnt, where sndcnt keeps
    /// what is sent proportional to what is delivered while pipe is above ssthresh.
    /// Below it, as Linux: the slow start reduction bound (what was delivered and
    /// not yet matched, at least this ACK's delivery, plus one segment) when the
    /// ACK acknowledged retransmitted data and marked no new loss (the repair is
    /// getting through), else the conservative bound (this ACK's delivery); never
    /// past ssthresh. An ACK that delivered nothing leaves cwnd alone; the
    /// reduction's first sending opportunity is at least one segment (the fast
    /// retransmit).
    pub(crate) fn prr_on_ack(&mut self, delivered: u32, retrans_acked: bool, newly_lost: bool) {
        let Some(mut p) = self.ecn.prr else {
            return;
        };
        // A controller that keeps its own window in recovery (BBR) gets no PRR.
        if self.cc.owns_cwnd() {
            return;
        }
        if delivered == 0 {
            return;
        }
        p.delivered = p.delivered.saturating_add(delivered);
        self.ecn.prr = Some(p);
        let mss = u64::from(self.smss());
        let ssthresh = u64::from(self.cc.ssthresh());
        let pipe = u64::from(self.pipe_est());
        let (del, out) = (u64::from(p.delivered), u64::from(p.out));
        let mut sndcnt = if pipe > ssthresh {
            // Rounded up to whole segments, as Linux counts in packets.
            (del * ssthresh)
                .div_ceil(u64::from(p.recover_fs))
                .div_ceil(mss)
                .saturating_mul(mss)
                .saturating_sub(out)
        } else if retrans_acked && !newly_lost {
            (del.saturating_sub(out).max(u64::from(delivered)) + mss).min(ssthresh - pipe)
        } else {
            u64::from(delivered).min(ssthresh - pipe)
        };
        if out == 0 {
            sndcnt = sndcnt.max(mss);
        }
        let cwnd = (pipe + sndcnt).min(u64::from(u32::MAX)) as u32;
        self.cc.set_cwnd(cwnd.max(self.smss()));
    }

    /// Data went out during a reduction (PRR's `prr_out`).
    pub(crate) fn prr_sent(&mut self, bytes: u32) {
        if let Some(p) = self.ecn.prr.as_mut() {
            p.out = p.out.saturating_add(bytes);
        }
    }

    /// In Linux's CWR state: the window was reduced for an ECE and the window of
    /// data it was about is not yet acknowledged.
    pub(crate) fn ecn_in_cwr(&self) -> bool {
        self.ecn.cwr_until.is_some_and(|p| self.snd.una.lt(p))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::config::{ECN_ACCEPT, ECN_OFF};
    use crate::conn::State;
    use crate::testing::VecSink;
    use crate::{Listener, TcpConfig};
    use usnet_wire::TcpFlags;

    fn ecn(mode: u8) -> TcpConfig {
        TcpConfig {
            ecn: mode,
            ..TcpConfig::default()
        }
    }

    #[test]
    fn negotiated_when_the_client_asks_and_the_server_accepts() {
        let (c, s) = addrs();
        let mut cli = crate::Connection::connect(c, s, T0, ecn(super::ECN_ON));
        let syn = drain(&mut cli, T0).remove(0);
        assert!(
            syn.repr.flags.ece() && syn.repr.flags.cwr(),
            "ECN-setup SYN"
        );
        assert!(!syn.ect, "a SYN is never ECT");
        for (mode, agree) in [(ECN_OFF, false), (ECN_ACCEPT, true), (super::ECN_ON, true)] {
            let mut l: Listener<u32> = Listener::new(s, ecn(mode), 8, false);
            let mut out = VecSink::default();
            l.input(T0, s, c, &syn.segment(), &mut out);
            let synack = &out.segments[0];
            assert_eq!(synack.repr.flags.ece(), agree, "mode {mode}");
            assert!(!synack.repr.flags.cwr());
        }
        let (cli, srv) = pair(ecn(super::ECN_ON), ecn(ECN_ACCEPT));
        assert!(cli.ecn.ok && srv.ecn.ok);
        assert!(cli.info().ecn && srv.info().ecn);
        // Only asking clients get it; a SYN-ACK with ECE and CWR is no agreement.
        let (cli, srv) = pair(ecn(ECN_ACCEPT), ecn(ECN_ACCEPT));
        assert!(!cli.ecn.ok && !srv.ecn.ok);
        let mut cli = crate::Connection::connect(c, s, T0, ecn(super::ECN_ON));
        drain(&mut cli, T0);
        cli.ecn_synack_received(TcpFlags::SYN | TcpFlags::ACK | TcpFlags::ECE | TcpFlags::CWR);
        assert!(!cli.ecn.ok);
    }

    #[test]
    fn a_retransmitted_syn_does_not_ask() {
        let (c, s) = addrs();
        let mut cli = crate::Connection::connect(c, s, T0, ecn(super::ECN_ON));
        drain(&mut cli, T0);
        let again = cli.poll_at().unwrap();
        let syn = drain(&mut cli, again).remove(0);
        assert!(syn.repr.flags.syn());
        assert!(!syn.repr.flags.ece() && !syn.repr.flags.cwr());
    }

    #[test]
    fn new_data_is_ect0_and_a_ce_mark_is_echoed_until_cwr() {
        let (mut cli, mut srv) = pair(ecn(super::ECN_ON), ecn(ECN_ACCEPT));
        cli.send(&vec![7u8; 3 * MSS]);
        let mut data = drain(&mut cli, T0);
        assert_eq!(data.len(), 3);
        assert!(data.iter().all(|d| d.ect), "new data is ECT(0)");
        // The router marks the second one CE: the receiver echoes it at once.
        data[1].ce = true;
        feed(&mut srv, T0, &data[..2]);
        let acks = drain(&mut srv, T0);
        assert!(acks.last().unwrap().repr.flags.ece());
        assert!(acks.iter().all(|a| !a.ect), "pure ACKs are not ECT");
        assert_eq!(srv.stats().rx_ecn_ce, 1);
        // The sender halves its window once, and says so with CWR on new data.
        let before = cli.info().cwnd;
        feed(&mut cli, T0 + ms(1), &acks);
        assert!(cli.info().cwnd < before);
        assert!(cli.info().in_cwr);
        assert_eq!(cli.stats().ecn_reductions, 1);
        feed(&mut srv, T0 + ms(1), &data[2..]);
        let more = drain(&mut srv, T0 + ms(1));
        assert!(more.iter().all(|a| a.repr.flags.ece()), "echoed until CWR");
        feed(&mut cli, T0 + ms(2), &more);
        assert_eq!(cli.stats().ecn_reductions, 1, "once per window");
        cli.send(b"after");
        let next = drain(&mut cli, T0 + ms(2));
        assert!(next[0].repr.flags.cwr() && next[0].ect);
        feed(&mut srv, T0 + ms(3), &next);
        srv.send(b"reply");
        let reply = drain(&mut srv, T0 + ms(3));
        assert!(
            reply.iter().all(|a| !a.repr.flags.ece()),
            "CWR ends the echo"
        );
        feed(&mut cli, T0 + ms(4), &reply);
        assert!(!cli.info().in_cwr, "the window is acknowledged");
        assert_eq!(cli.state(), State::Established);
    }

    #[test]
    fn an_echo_reduces_the_window_by_proportional_rate_reduction() {
        // Four segments out, the ACK of the first carries ECE: pipe is 3 segments,
        // below ssthresh (7 of 10 with CUBIC), and one segment was delivered, so
        // the conservative bound lets one more go: cwnd = 3 + 1 (as Linux).
        let (mut cli, mut srv) = pair(ecn(super::ECN_ON), ecn(ECN_ACCEPT));
        let mss = cli.smss();
        cli.send(&vec![1u8; 4 * mss as usize]);
        let data = drain(&mut cli, T0);
        assert_eq!(data.len(), 4);
        feed(&mut srv, T0, &data[..1]);
        let mut ack = drain(&mut srv, T0).remove(0);
        ack.repr.flags |= TcpFlags::ECE;
        feed(&mut cli, T0 + ms(100), &[ack]);
        assert!(cli.info().in_cwr);
        assert_eq!(cli.info().cwnd, 4 * mss);
        let ssthresh = cli.info().ssthresh;
        assert!(ssthresh > 4 * mss && ssthresh <= 7 * mss);
        // The rest is acknowledged: the reduction ends at ssthresh.
        feed(&mut srv, T0 + ms(100), &data[1..]);
        let acks = drain(&mut srv, T0 + ms(100));
        feed(&mut cli, T0 + ms(200), &acks);
        assert!(!cli.info().in_cwr);
        assert_eq!(cli.info().cwnd, ssthresh);
    }

    #[test]
    fn retransmissions_are_not_ect() {
        let (mut cli, _srv) = pair(ecn(super::ECN_ON), ecn(ECN_ACCEPT));
        cli.send(b"lost");
        assert!(drain(&mut cli, T0)[0].ect);
        for _ in 0..2 {
            let now = cli.poll_at().unwrap();
            for s in drain(&mut cli, now) {
                assert!(!s.ect, "a probe or retransmission is not ECT");
            }
        }
    }

    #[test]
    fn without_ecn_nothing_is_marked_and_marks_are_ignored() {
        let (mut cli, mut srv) = default_pair();
        cli.send(b"plain");
        let mut data = drain(&mut cli, T0);
        assert!(!data[0].ect);
        data[0].ce = true;
        feed(&mut srv, T0, &data);
        assert!(drain(&mut srv, T0).iter().all(|a| !a.repr.flags.ece()));
    }
}
