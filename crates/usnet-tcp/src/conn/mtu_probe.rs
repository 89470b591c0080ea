//! Packetization-layer path MTU discovery (RFC 4821) as Linux's `tcp_mtu_probing`:
//! a search for the path's MTU between `search_low` (known or assumed to work) and
//! `search_high` (the most the link and the peer allow). While probing is on, the
//! sender MSS is held to `search_low`; one probe segment of the midpoint's size is
//! sent when the window and the queued data allow; its acknowledgment raises
//! `search_low` (and the MSS), its loss lowers `search_high`. The search ends when
//! the range is narrower than `tcp_probe_threshold` and starts again after
//! `tcp_probe_interval`.
//!
//! Mode 2 probes from the start (at `tcp_base_mss`); mode 1 only once repeated
//! timeouts (`tcp_retries1`) suggest a black hole, a path that silently drops large
//! segments (no ICMP). Each further timeout halves `search_low`, down to
//! `tcp_mtu_probe_floor`, so the connection survives such a path.
//!
//! Sizes here are IP MTUs, converted as Linux's `tcp_mtu_to_mss`/`tcp_mss_to_mtu`:
//! an MSS in these conversions is the payload of a full segment, the options every
//! segment carries (timestamps) accounted.
//!
//! usnet's congestion window counts bytes, so the probe counts at its size. Linux,
//! counting packets, takes one packet off cwnd while a probe (about two segments) is
//! out and, on success, rescales cwnd by old MTU / new MTU; both keep the window in
//! bytes where it is, which byte counting does by itself.

use super::{Connection, State};
use crate::config::MTU_PROBING_OFF;
use crate::seq::Seq;
use crate::time::Instant;

/// TCP header without options.
const TCP_HDR: u32 = 20;

/// Linux's `tcp_min_snd_mss` default: the least MSS a black hole's halving leaves.
const MIN_SND_MSS: u32 = 48;

/// The search's state (Linux's `icsk_mtup` and `mtu_probe`).
#[derive(Debug, Clone)]
pub(crate) struct MtuProbe {
    /// Set up at establishment (the sizes depend on the negotiated options).
    pub ready: bool,
    /// Probing is on: the MSS is held to `search_low`.
    pub enabled: bool,
    /// Largest MTU known (or assumed) to get through.
    pub search_low: u32,
    /// Largest MTU not yet shown too big.
    pub search_high: u32,
    /// MTU of the probe in flight; 0: none.
    pub probe_size: u32,
    /// Sequence range of the probe in flight.
    pub probe_start: Seq,
    pub probe_end: Seq,
    /// When the search (re)started: it starts again `probe_interval` later.
    pub probe_timestamp: Instant,
    /// The payload of the probe being sent in this `send_new_data` call.
    pub sending: Option<usize>,
    /// The MSS (without options) `search_low` allowed when last synced.
    pub mss_cap: Option<u32>,
}

impl MtuProbe {
    pub(crate) fn new(now: Instant, iss: Seq) -> Self {
        MtuProbe {
            ready: false,
            enabled: false,
            search_low: 0,
            search_high: 0,
            probe_size: 0,
            probe_start: iss,
            probe_end: iss,
            probe_timestamp: now,
            sending: None,
            mss_cap: None,
        }
    }
}

/// What [`Connection::mtu_probe_due`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeDue {
    /// No probe now; send as usual.
    No,
    /// A probe is due once ACKs open the windows: hold new data back so that they
    /// do not fill the room (Linux's `tcp_mtu_probe` returning 0).
    Wait,
    /// Send a probe with this much payload now.
    Send(usize),
}

impl Connection {
    /// IP header bytes on this connection's packets.
    fn ip_header_len(&self) -> u32 {
        if self.remote.is_ipv6() {
            40
        } else {
            20
        }
    }

    /// Option bytes every segment carries.
    fn option_len(&self) -> u32 {
        if self.ts.ok {
            12
        } else {
            0
        }
    }

    /// The MSS (without options) the peer and the path in force allow: Linux's
    /// `mss_clamp` after `tcp_sync_mss`.
    pub(crate) fn mss_clamp(&self) -> u32 {
        u32::from(self.snd.peer_mss.min(self.cfg.mss))
    }

    /// Linux's `tcp_mtu_to_mss`: a full segment's payload at `mtu`.
    pub(crate) fn mtu_to_mss(&self, mtu: u32) -> u32 {
        let mss = mtu
            .saturating_sub(TCP_HDR + self.ip_header_len())
            .min(self.mss_clamp());
        mss.saturating_sub(self.option_len()).max(MIN_SND_MSS)
    }

    /// Linux's `tcp_mss_to_mtu`: the MTU a full segment of `mss` payload needs.
    pub(crate) fn mss_to_mtu(&self, mss: u32) -> u32 {
        mss + self.option_len() + TCP_HDR + self.ip_header_len()
    }

    /// The cap probing puts on the sender MSS (without options), if any.
    pub(crate) fn mtup_mss_cap(&self) -> Option<u32> {
        self.mtup.mss_cap
    }

    /// Linux's `tcp_sync_mss` as far as probing goes: the MSS follows `search_low`
    /// while probing is on. Linux re-syncs only at certain points (an active open,
    /// a black hole, a probe's success, an ICMP), and so does this: a passive open
    /// keeps its handshake's MSS until the first of them.
    pub(crate) fn mtu_sync(&mut self) {
        let ip = self.ip_header_len();
        self.mtup.mss_cap = self
            .mtup
            .enabled
            .then(|| self.mtup.search_low.saturating_sub(TCP_HDR + ip));
    }

    /// Linux's `tcp_mtup_init`, at establishment: the search spans `tcp_base_mss`
    /// to what the peer and the link allow; mode 2 turns probing on at once. An
    /// active open's MSS follows (Linux syncs it at connect); a passive one's waits
    /// for the next sync (Linux's `tcp_init_transfer` does not sync).
    pub(crate) fn mtup_init(&mut self, active: bool) {
        let m = &mut self.mtup;
        m.ready = true;
        m.enabled = self.cfg.mtu_probing > 1;
        m.probe_size = 0;
        m.probe_timestamp = self.now;
        self.mtup.search_high = self.mss_clamp() + TCP_HDR + self.ip_header_len();
        self.mtup.search_low = self.mss_to_mtu(u32::from(self.cfg.base_mss));
        if active {
            self.mtu_sync();
        }
    }

    /// Linux's `tcp_mtu_probing`, on a retransmission timeout past `tcp_retries1`:
    /// the path may drop large segments silently. The first time probing goes on
    /// (the MSS falls to `search_low`); after that each timeout halves the MSS,
    /// at most to `tcp_base_mss`, at least to `tcp_mtu_probe_floor`.
    pub(crate) fn mtu_black_hole(&mut self) {
        if self.cfg.mtu_probing == MTU_PROBING_OFF || !self.mtup.ready {
            return;
        }
        self.stats.rare().mtu_black_holes += 1;
        if !self.mtup.enabled {
            self.mtup.enabled = true;
            self.mtup.probe_timestamp = self.now;
        } else {
            let mss = (self.mtu_to_mss(self.mtup.search_low) / 2)
                .min(u32::from(self.cfg.base_mss))
                .max(u32::from(self.cfg.mtu_probe_floor))
                .max(MIN_SND_MSS);
            self.mtup.search_low = self.mss_to_mtu(mss);
        }
        self.mtu_sync();
    }

    /// Linux's `tcp_mtu_check_reprobe`: once `tcp_probe_interval` has passed the
    /// search starts again, from the MSS in use up to what the peer and link allow.
    fn mtu_check_reprobe(&mut self) {
        if self.now.saturating_since(self.mtup.probe_timestamp) < self.cfg.probe_interval {
            return;
        }
        let mss = self.smss();
        self.mtup.probe_size = 0;
        self.mtup.search_high = self.mss_clamp() + TCP_HDR + self.ip_header_len();
        self.mtup.search_low = self.mss_to_mtu(mss);
        self.mtup.probe_timestamp = self.now;
        self.stats.rare().mtu_reprobes += 1;
    }

    /// Linux's `tcp_mtu_probe` conditions: probing on and no probe out, the
    /// connection in its open state (no recovery, disorder or CWR) with a window of
    /// at least 11 segments and no SACK blocks to send, a search range still wider
    /// than `tcp_probe_threshold`, and behind the probe enough queued data for
    /// `reordering + 1` more segments (so that its loss is detected by SACKs or
    /// duplicate ACKs rather than a timeout). The probe must fit the peer's window,
    /// and what is in flight plus two segments the congestion window.
    pub(crate) fn mtu_probe_due(&mut self) -> ProbeDue {
        if !self.mtup.enabled
            || self.mtup.probe_size != 0
            || !matches!(self.state, State::Established | State::CloseWait)
            || self.snd.fin_sent
            || self.recovery.in_recovery()
            || self.in_disorder()
            || self.ecn_in_cwr()
        {
            return ProbeDue::No;
        }
        let mss = self.smss().max(1);
        if self.cc.cwnd() < 11 * mss || self.segment_options().sack_count > 0 {
            return ProbeDue::No;
        }
        let (low, high) = (self.mtup.search_low, self.mtup.search_high);
        let probe = self.mtu_to_mss((low + high) / 2);
        if probe > self.mtu_to_mss(high) || high.saturating_sub(low) < self.cfg.probe_threshold {
            self.mtu_check_reprobe();
            return ProbeDue::No;
        }
        let size_needed = probe + (self.recovery.reordering + 1) * mss;
        let off = self.snd.nxt.since(self.snd.una);
        let unsent = (self.snd.buf.len() as u32).saturating_sub(off);
        if unsent < size_needed || self.snd.wnd < size_needed {
            return ProbeDue::No;
        }
        if (self.snd.nxt + size_needed).gt(self.snd.una + self.snd.wnd) {
            return ProbeDue::Wait;
        }
        let in_flight = self.pipe_est().div_ceil(mss);
        if in_flight + 2 > self.cc.cwnd() / mss {
            return if in_flight == 0 {
                ProbeDue::No
            } else {
                ProbeDue::Wait
            };
        }
        // A record boundary (MSG_EOR) inside the probe: Linux does not merge across
        // one (`tcp_can_coalesce_send_queue_head`).
        let end = self.snd.nxt + probe;
        if self
            .snd
            .records
            .iter()
            .any(|&r| r.gt(self.snd.nxt) && r.lt(end))
        {
            return ProbeDue::No;
        }
        ProbeDue::Send(probe as usize)
    }

    /// A probe of `len` bytes from `start` went out.
    pub(crate) fn mtu_probe_sent(&mut self, start: Seq, len: u32) {
        self.mtup.probe_size = self.mss_to_mtu(len);
        self.mtup.probe_start = start;
        self.mtup.probe_end = start + len;
        self.stats.rare().mtu_probes += 1;
    }

    /// SND.UNA reached `ack`: a probe it covers got through (Linux's
    /// `tcp_mtup_probe_success`), and the MSS rises to it.
    pub(crate) fn mtu_probe_on_ack(&mut self, ack: Seq) {
        if self.mtup.probe_size != 0 && self.mtup.probe_end.le(ack) {
            self.mtup.search_low = self.mtup.probe_size;
            self.mtup.probe_size = 0;
            self.stats.rare().mtu_probe_successes += 1;
            self.mtu_sync();
        }
    }

    /// Whether the probe in flight overlaps `start..end`.
    pub(crate) fn is_mtu_probe(&self, start: Seq, end: Seq) -> bool {
        self.mtup.probe_size != 0 && start.lt(self.mtup.probe_end) && end.gt(self.mtup.probe_start)
    }

    /// The probe was lost (Linux's `tcp_mtup_probe_failed`): the search's upper
    /// bound falls below it.
    pub(crate) fn mtu_probe_failed(&mut self) {
        if self.mtup.probe_size == 0 {
            return;
        }
        self.mtup.search_high = self.mtup.probe_size - 1;
        self.mtup.probe_size = 0;
        self.stats.rare().mtu_probe_failures += 1;
    }

    /// Loss detected with the probe at the head of the flight (Linux's check in
    /// `tcp_fastretrans_alert`): the probe failed, and what no longer fits is resent
    /// without a congestion response (`tcp_simple_retransmit`). Returns whether
    /// that replaced fast recovery.
    pub(crate) fn mtu_probe_lost_at_head(&mut self) -> bool {
        if self.mtup.probe_size == 0 || self.snd.una != self.mtup.probe_start {
            return false;
        }
        self.mtu_probe_failed();
        let una = self.snd.una;
        self.resend_oversized(una);
        self.enter_pmtu_phase();
        true
    }

    /// An ICMP lowered the path MTU to `mtu`: the search stays below it (Linux's
    /// `tcp_sync_mss`), and a probe larger than it is lost.
    pub(crate) fn mtu_probe_on_pmtu(&mut self, mss: u32) {
        if !self.mtup.ready {
            return;
        }
        let mtu = mss + TCP_HDR + self.ip_header_len();
        if self.mtup.probe_size > mtu {
            self.mtu_probe_failed();
        }
        self.mtup.search_high = self.mtup.search_high.min(mtu);
        self.mtu_sync();
    }

    /// The search for `TcpInfo`: (search_low, search_high) while probing is on.
    pub(crate) fn mtu_search(&self) -> Option<(u32, u32)> {
        self.mtup
            .enabled
            .then_some((self.mtup.search_low, self.mtup.search_high))
    }

    /// The path MTU in force from the link and ICMP (Linux's `tcpi_pmtu`).
    pub(crate) fn path_mtu(&self) -> u32 {
        u32::from(self.cfg.mss) + TCP_HDR + self.ip_header_len()
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::time::Duration;

    use super::super::test_util::*;
    use super::*;
    use crate::config::{MTU_PROBING_ALWAYS, MTU_PROBING_BLACKHOLE};
    use crate::testing::OwnedSegment;
    use crate::{TcpConfig, TcpError};

    fn cfg(mode: u8) -> TcpConfig {
        TcpConfig {
            mtu_probing: mode,
            ..TcpConfig::default()
        }
    }

    fn byte(i: u64) -> u8 {
        (i % 251) as u8
    }

    /// What a conversation over a black hole came to.
    struct Outcome {
        /// Bytes the server read, every one checked.
        received: u64,
        client: Connection,
    }

    /// The client sends `total` bytes to the server over a path with `delay` each
    /// way that silently drops every client packet larger than `mtu` (IPv4: the
    /// segment plus 20 bytes), until the server has read them all, the client gave
    /// up, or `limit` of virtual time passed.
    fn converse(
        mut cli: Connection,
        mut srv: Connection,
        mtu: usize,
        total: u64,
        limit: Duration,
    ) -> Outcome {
        let delay = ms(10);
        let deadline = T0 + limit;
        let mut now = T0;
        let mut wire: BinaryHeap<Reverse<(Instant, u64, bool, usize)>> = BinaryHeap::new();
        let mut segs: Vec<Option<OwnedSegment>> = Vec::new();
        let (mut sent, mut received) = (0u64, 0u64);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            while sent < total {
                let n = (total - sent).min(buf.len() as u64) as usize;
                for (k, b) in buf[..n].iter_mut().enumerate() {
                    *b = byte(sent + k as u64);
                }
                let w = cli.send(&buf[..n]);
                sent += w as u64;
                if w < n {
                    break;
                }
            }
            loop {
                let n = srv.recv(&mut buf);
                if n == 0 {
                    break;
                }
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(
                        *b,
                        byte(received + k as u64),
                        "byte {}",
                        received + k as u64
                    );
                }
                received += n as u64;
            }
            for (to_server, c) in [(true, &mut cli), (false, &mut srv)] {
                for s in drain(c, now) {
                    if to_server && s.to_bytes().len() + 20 > mtu {
                        continue; // the black hole
                    }
                    wire.push(Reverse((
                        now + delay,
                        segs.len() as u64,
                        to_server,
                        segs.len(),
                    )));
                    segs.push(Some(s));
                }
            }
            if received == total || cli.state() == State::Closed {
                return Outcome {
                    received,
                    client: cli,
                };
            }
            let next = [
                wire.peek().map(|Reverse(e)| e.0),
                cli.poll_at(),
                srv.poll_at(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| {
                let due = cli.mtu_probe_due();
                panic!(
                    "stalled: {received} of {total}; client {:?} {:?} due {:?} una {:?} nxt {:?} buf {} wnd {} piece {:?} mtup {:?}",
                    cli.info(),
                    cli.stats(),
                    due,
                    cli.snd.una, cli.snd.nxt, cli.snd.buf.len(), cli.snd.wnd, cli.snd.piece_end, cli.mtup
                )
            });
            assert!(next <= deadline, "time limit: {received} of {total} bytes");
            now = now.max(next);
            while wire.peek().is_some_and(|Reverse(e)| e.0 <= now) {
                let Reverse((_, _, to_server, i)) = wire.pop().unwrap();
                let s = segs[i].take().unwrap();
                let to = if to_server { &mut srv } else { &mut cli };
                to.input(now, &s.segment());
            }
        }
    }

    #[test]
    fn mode_2_starts_at_the_base_mss_and_mode_0_does_not_probe() {
        let (cli, srv) = pair(cfg(MTU_PROBING_ALWAYS), cfg(MTU_PROBING_ALWAYS));
        for c in [&cli, &srv] {
            // 1024 + 12 (timestamps) + 20 + 20; up to the 1500 of the link.
            assert_eq!(c.info().mtu_search, Some((1076, 1500)));
            assert_eq!(c.info().pmtu, 1500);
        }
        assert_eq!(cli.smss(), 1024, "tcp_base_mss");
        // As Linux: a passive open keeps its MSS until something syncs it.
        assert_eq!(srv.smss() as usize, MSS);
        let (cli, _) = default_pair();
        assert_eq!(cli.smss() as usize, MSS);
        assert_eq!(cli.info().mtu_search, None);
        let (cli, _) = pair(cfg(MTU_PROBING_BLACKHOLE), TcpConfig::default());
        assert_eq!(cli.smss() as usize, MSS, "mode 1 waits for a black hole");
    }

    #[test]
    fn a_probe_of_the_midpoint_raises_the_mss_when_acknowledged() {
        let (mut cli, mut srv) = pair_with_rtt(cfg(MTU_PROBING_ALWAYS), cfg(0), ms(10));
        cli.cc.set_cwnd(20 * 1024);
        cli.send(&vec![5u8; 64 * 1024]);
        let out = drain(&mut cli, T0 + ms(10));
        // The probe first: the midpoint of 1076..1500, less the headers.
        assert_eq!(out[0].payload.len(), (1076 + 1500) / 2 - 52);
        assert!(out[1..].iter().all(|s| s.payload.len() <= 1024));
        assert_eq!(cli.stats().mtu_probes, 1);
        assert_eq!(cli.mtu_probe_due(), ProbeDue::No, "one probe at a time");
        let t = T0 + ms(20);
        feed(&mut srv, t, &out);
        feed(&mut cli, t, &drain(&mut srv, t));
        assert_eq!(cli.stats().mtu_probe_successes, 1);
        assert_eq!(cli.info().mtu_search, Some((1288, 1500)));
        assert_eq!(cli.smss(), 1288 - 52);
        cli.check_invariants().unwrap();
    }

    #[test]
    fn a_lost_probe_lowers_search_high_without_a_congestion_response() {
        let (mut cli, mut srv) = pair_with_rtt(cfg(MTU_PROBING_ALWAYS), cfg(0), ms(10));
        cli.cc.set_cwnd(20 * 1024);
        let cwnd = cli.cc.cwnd();
        cli.send(&vec![5u8; 64 * 1024]);
        let t = T0 + ms(10);
        let out = drain(&mut cli, t);
        let probe = out[0].repr.seq;
        // The probe is dropped; what follows it is SACKed.
        feed(&mut srv, t + ms(10), &out[1..]);
        let acks = drain(&mut srv, t + ms(10));
        let mut now = t + ms(20);
        feed(&mut cli, now, &acks);
        // RACK's reordering window runs out.
        while cli.stats().mtu_probe_failures == 0 {
            now = cli.poll_at().unwrap().max(now);
            let resent = drain(&mut cli, now);
            if cli.stats().mtu_probe_failures > 0 {
                assert_eq!(resent[0].repr.seq, probe);
                assert!(resent.iter().all(|s| s.payload.len() <= 1024));
            }
        }
        assert_eq!(cli.info().mtu_search, Some((1076, 1287)));
        assert_eq!(cli.stats().fast_recoveries, 0, "not congestion");
        assert_eq!(cli.cc.cwnd(), cwnd);
        assert_eq!(cli.smss(), 1024);
        cli.check_invariants().unwrap();
    }

    #[test]
    fn repeated_timeouts_enable_probing_and_halve_the_mss_down_to_the_floor() {
        let mut c = cfg(MTU_PROBING_BLACKHOLE);
        c.set_sysctl("tcp_mtu_probe_floor", "300").unwrap();
        let (mut cli, _srv) = pair_with_rtt(c, TcpConfig::default(), ms(10));
        cli.send(&vec![1u8; 100_000]);
        let mut now = T0 + ms(10);
        drain(&mut cli, now);
        let mut sizes = Vec::new();
        while cli.stats().rto_expired < 7 {
            now = cli.poll_at().unwrap().max(now);
            let out = drain(&mut cli, now);
            if let Some(s) = out.first() {
                sizes.push(s.payload.len());
            }
        }
        assert_eq!(cli.stats().mtu_black_holes, 4, "RTOs 4 to 7");
        // 1024 (tcp_base_mss), then halved: 512, 256 → the floor of 300.
        assert!(sizes.contains(&1024) && sizes.contains(&512));
        assert_eq!(cli.smss(), 300);
        let (_, high) = cli.info().mtu_search.unwrap();
        assert_eq!(high, 1500);
        cli.check_invariants().unwrap();
    }

    #[test]
    fn an_icmp_below_the_search_caps_it_and_ends_a_larger_probe() {
        let (mut cli, _srv) = pair_with_rtt(cfg(MTU_PROBING_ALWAYS), cfg(0), ms(10));
        cli.cc.set_cwnd(20 * 1024);
        cli.send(&vec![5u8; 64 * 1024]);
        let out = drain(&mut cli, T0 + ms(10));
        assert_eq!(cli.stats().mtu_probes, 1);
        let r = cli.icmp_error(
            T0 + ms(15),
            out[0].repr.seq,
            crate::IcmpError::PacketTooBig { mss: 1160 },
        );
        assert_eq!(r, crate::IcmpOutcome::MssLowered);
        assert_eq!(cli.stats().mtu_probe_failures, 1);
        assert_eq!(cli.info().mtu_search, Some((1076, 1200)));
        assert_eq!(cli.info().pmtu, 1200);
        cli.check_invariants().unwrap();
    }

    #[test]
    fn the_search_stops_at_the_threshold_and_restarts_after_the_interval() {
        let mut c = cfg(MTU_PROBING_ALWAYS);
        c.set_sysctl("tcp_probe_interval", "60").unwrap();
        let (mut cli, _srv) = pair_with_rtt(c, cfg(0), ms(10));
        cli.cc.set_cwnd(20 * 1024);
        cli.mtup.search_low = 1400;
        cli.mtup.search_high = 1405;
        cli.mtu_sync();
        cli.send(&vec![5u8; 64 * 1024]);
        assert_eq!(cli.mtu_probe_due(), ProbeDue::No);
        cli.advance_clock(T0 + Duration::from_secs(61));
        assert_eq!(cli.mtu_probe_due(), ProbeDue::No);
        assert_eq!(cli.stats().mtu_reprobes, 1);
        // From the MSS in use up to what the link allows.
        assert_eq!(cli.info().mtu_search, Some((1400, 1500)));
        assert!(matches!(cli.mtu_probe_due(), ProbeDue::Send(_)));
    }

    /// The path drops every client packet over 1200 bytes and sends no ICMP.
    const BLACK_HOLE_MTU: usize = 1200;

    #[test]
    fn a_passive_open_in_mode_2_probes_from_its_handshake_mss() {
        let (mut cli, mut srv) = pair_with_rtt(cfg(0), cfg(MTU_PROBING_ALWAYS), ms(10));
        srv.cc.set_cwnd(20 * MSS as u32);
        srv.send(&vec![5u8; 64 * 1024]);
        let out = drain(&mut srv, T0 + ms(10));
        // Linux's probe is the midpoint even below the MSS in use; its success
        // syncs the MSS to it.
        assert_eq!(out[0].payload.len(), 1288 - 52);
        assert!(out[1..].iter().all(|s| s.payload.len() == MSS));
        let t = T0 + ms(20);
        feed(&mut cli, t, &out);
        feed(&mut srv, t, &drain(&mut cli, t));
        assert_eq!(srv.stats().mtu_probe_successes, 1);
        assert_eq!(srv.smss(), 1288 - 52);
    }

    #[test]
    fn black_hole_mode_0_times_out() {
        let mut c = cfg(0);
        c.max_retries = 6;
        let (cli, srv) = pair_with_rtt(c, TcpConfig::default(), ms(20));
        let o = converse(cli, srv, BLACK_HOLE_MTU, 200_000, Duration::from_secs(3600));
        assert_eq!(o.received, 0, "no data segment fits");
        assert_eq!(o.client.error(), Some(TcpError::TimedOut));
        assert_eq!(o.client.stats().mtu_black_holes, 0);
    }

    #[test]
    fn black_hole_mode_1_completes_after_detection() {
        let mut linux = TcpConfig::profile("linux").unwrap();
        linux.mtu_probing = MTU_PROBING_BLACKHOLE;
        for c in [cfg(MTU_PROBING_BLACKHOLE), linux] {
            black_hole_mode_1(c);
        }
    }

    fn black_hole_mode_1(c: TcpConfig) {
        let (cli, srv) = pair_with_rtt(c, cfg(0), ms(20));
        let o = converse(
            cli,
            srv,
            BLACK_HOLE_MTU,
            2_000_000,
            Duration::from_secs(600),
        );
        assert_eq!(o.received, 2_000_000);
        let st = o.client.stats();
        assert_eq!(st.mtu_black_holes, 1, "{st:?}");
        assert!(st.mtu_probe_successes > 0 && st.mtu_probe_failures > 0);
        let (low, _) = o.client.info().mtu_search.unwrap();
        assert!(low as usize <= BLACK_HOLE_MTU);
        o.client.check_invariants().unwrap();
    }

    #[test]
    fn black_hole_mode_2_probes_close_to_the_limit() {
        // Also with the linux profile's TSO pieces, which the probe cuts across.
        let mut linux = TcpConfig::profile("linux").unwrap();
        linux.mtu_probing = MTU_PROBING_ALWAYS;
        for c in [cfg(MTU_PROBING_ALWAYS), linux] {
            black_hole_mode_2(c);
        }
    }

    fn black_hole_mode_2(c: TcpConfig) {
        let (cli, srv) = pair_with_rtt(c, cfg(0), ms(20));
        let o = converse(
            cli,
            srv,
            BLACK_HOLE_MTU,
            4_000_000,
            Duration::from_secs(600),
        );
        assert_eq!(o.received, 4_000_000);
        let st = o.client.stats();
        assert_eq!((st.mtu_black_holes, st.rto_expired), (0, 0), "{st:?}");
        let (low, high) = o.client.info().mtu_search.unwrap();
        // Within tcp_probe_threshold of the path's limit, never above it.
        assert!(
            low as usize <= BLACK_HOLE_MTU && high - low < 8,
            "{low}..{high}"
        );
        assert!(low as usize > BLACK_HOLE_MTU - 8);
        assert_eq!(o.client.smss(), low - 52);
    }
}
