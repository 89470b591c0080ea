//! Loss detection and recovery: cumulative and selective ACKs against the
//! [scoreboard](super::scoreboard), RACK (RFC 8985 §6), the tail loss probe (RFC 8985
//! §7), fast recovery (RFC 6675, and RFC 6582 without SACK), the retransmission
//! timeout (RFC 6298 §5) and the retransmissions themselves. Congestion control is
//! told about each step; the window arithmetic is its own (`crate::cc`).

use std::time::Duration;

use usnet_wire::TcpFlags;

use super::scoreboard::TxSeg;
use super::timers::Timer;
use super::{Connection, Segment, SegmentSink, State, TcpError};
use crate::cc::AckSample;
use crate::seq::Seq;
use crate::time::Instant;

/// The recovery episode the sender is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    None,
    /// Fast recovery (RFC 6675 / 6582) until the recovery point is acknowledged.
    Fast,
    /// Loss recovery after an RTO (go-back-N from the scoreboard, slow start).
    Rto,
    /// Resending what a path MTU decrease dropped, until the recovery point is
    /// acknowledged; not congestion, so the window is left alone.
    Pmtu,
}

/// Loss-recovery state besides the scoreboard.
#[derive(Debug, Clone)]
pub(crate) struct Recovery {
    pub phase: Phase,
    /// SND.NXT when the episode began: it ends when this is acknowledged.
    pub point: Seq,
    /// Duplicate ACKs since the last new ACK (RFC 5681 §2).
    pub dupacks: u32,
    /// The first retransmission of an episode goes out regardless of cwnd.
    pub fast_rtx_pending: bool,
    pub rack: Rack,
    /// The TLP timer fired: the next transmit pass sends a probe.
    pub tlp_pending: bool,
    /// A probe is out and no new ACK came since (one probe per silence).
    pub tlp_outstanding: bool,
    /// The armed TLP timer stands in for the RTO, which would have fired first
    /// (RFC 8985 §7.2): the RTO timer stays disarmed until the probe goes.
    pub tlp_for_rto: bool,
    /// The last new ACK covered a retransmitted segment (PRR's choice of bound).
    pub retrans_acked: bool,
    /// Reordering estimate, in segments (Linux's `tp->reordering`, from 3): how far
    /// below the highest SACKed sequence a never-retransmitted segment was
    /// delivered; and how often that was seen.
    pub reordering: u32,
    pub reord_seen: u32,
    /// Lowest start of a never-retransmitted segment the current ACK delivered.
    pub reord_low: Option<Seq>,
}

/// The initial reordering estimate (Linux's `tcp_reordering` default) and its cap
/// (`tcp_max_reordering`).
pub(crate) const REORDERING_INIT: u32 = 3;
const REORDERING_MAX: u32 = 300;

impl Recovery {
    pub(crate) fn new(iss: Seq) -> Self {
        Recovery {
            phase: Phase::None,
            point: iss,
            dupacks: 0,
            fast_rtx_pending: false,
            rack: Rack::new(iss),
            tlp_pending: false,
            tlp_outstanding: false,
            tlp_for_rto: false,
            retrans_acked: false,
            reordering: REORDERING_INIT,
            reord_seen: 0,
            reord_low: None,
        }
    }

    pub(crate) fn in_recovery(&self) -> bool {
        self.phase != Phase::None
    }

    /// Recovery from a timeout or a path MTU drop (Linux's `TCP_CA_Loss`).
    pub(crate) fn in_loss(&self) -> bool {
        matches!(self.phase, Phase::Rto | Phase::Pmtu)
    }
}

/// RACK state (RFC 8985 §6.1).
#[derive(Debug, Clone)]
pub(crate) struct Rack {
    /// Transmission time of the most recently delivered segment.
    pub xmit_ts: Option<Instant>,
    pub end_seq: Seq,
    /// Its [`TxSeg::order`].
    pub order: u64,
    pub rtt: Duration,
    /// Highest end sequence ever delivered (acked or SACKed).
    pub fack: Seq,
    pub reordering_seen: bool,
    /// Grows with every D-SACK (a spurious retransmission): widens the window.
    pub reo_wnd_mult: u32,
}

impl Rack {
    pub(crate) fn new(iss: Seq) -> Self {
        Rack {
            xmit_ts: None,
            end_seq: iss,
            order: 0,
            rtt: Duration::ZERO,
            fack: iss,
            reordering_seen: false,
            reo_wnd_mult: 1,
        }
    }

    /// RFC 8985 §6.2 steps 2-3: note segment `s`, newly delivered at `now`. Returns
    /// true when this delivery first shows reordering (a never-retransmitted segment
    /// below the highest delivered one).
    pub(crate) fn on_delivered(
        &mut self,
        s: &TxSeg,
        now: Instant,
        min_rtt: Option<Duration>,
    ) -> bool {
        let rtt = now.saturating_since(s.sent);
        if s.xmits > 1 && min_rtt.is_some_and(|m| rtt < m) {
            // Possibly the ACK of an earlier transmission: ambiguous, skip.
            return false;
        }
        self.rtt = rtt;
        let newer = match self.xmit_ts {
            None => true,
            Some(t) => s.sent > t || (s.sent == t && self.tie_after(s)),
        };
        if newer {
            self.xmit_ts = Some(s.sent);
            self.end_seq = s.end;
            self.order = s.order;
        }
        let mut first_reordering = false;
        if s.xmits == 1 && s.end.lt(self.fack) && !self.reordering_seen {
            self.reordering_seen = true;
            first_reordering = true;
        }
        self.fack = self.fack.max(s.end);
        first_reordering
    }

    /// RFC 8985 §6.2 step 4: the reordering window. Zero (the DupThresh rule's
    /// stand-in) when no reordering has been seen and the sender is in recovery or 3+
    /// segments are SACKed; else a quarter of the minimum RTT per multiplier, at most
    /// SRTT.
    pub(crate) fn reo_wnd(
        &self,
        in_recovery: bool,
        sacked_segs: u32,
        min_rtt: Option<Duration>,
        srtt: Option<Duration>,
    ) -> Duration {
        if !self.reordering_seen && (in_recovery || sacked_segs >= 3) {
            return Duration::ZERO;
        }
        let w = min_rtt.unwrap_or(Duration::ZERO) / 4 * self.reo_wnd_mult;
        match srtt {
            Some(s) => w.min(s),
            None => w,
        }
    }

    /// Whether `s`, stamped like the most recently delivered segment, went out
    /// after it. RFC 8985 §6.2's RACK_sent_after orders such ties by sequence,
    /// which holds for new data only: one poll stamps all it sends with one
    /// instant, and a retransmission of a low segment can go out after new data of
    /// higher sequence (it would be marked lost as soon as that data is SACKed and
    /// sent a third time, as against smoltcp on a veth). The order of transmission
    /// decides, and the sequence where that is unknown (0).
    fn tie_after(&self, s: &TxSeg) -> bool {
        if s.order != 0 && self.order != 0 && s.order != self.order {
            return s.order > self.order;
        }
        s.end.gt(self.end_seq)
    }

    /// Whether `s` was sent before the most recently delivered segment (RFC 8985
    /// §6.2 step 5); None before anything was delivered.
    pub(crate) fn sent_before_latest(&self, s: &TxSeg) -> Option<bool> {
        let xts = self.xmit_ts?;
        Some(s.sent < xts || (s.sent == xts && s.end != self.end_seq && !self.tie_after(s)))
    }
}

impl Connection {
    /// SND.UNA advanced to `ack`: retire acknowledged segments and data, take an RTT
    /// sample, restart the timer. Returns whether anything was delivered.
    pub(crate) fn process_new_ack(&mut self, ack: Seq, ecr: Option<u32>) -> bool {
        self.snd.una_before_last_ack = self.snd.una;
        let mut rtt_sample = None;
        let mut delivered = false;
        self.recovery.retrans_acked = false;
        while let Some(front) = self.scoreboard.front() {
            let whole = front.end.le(ack);
            let acked_segs = if whole {
                self.scoreboard.pop_front();
                front.segs
            } else {
                // An ACK inside the entry: the whole segments it covers are
                // delivered, and the entry stays (Linux's `tcp_tso_acked`).
                match self.scoreboard.trim_front(ack) {
                    Some(0) => {
                        delivered = true;
                        break;
                    }
                    Some(n) => n,
                    None => break,
                }
            };
            self.recovery.retrans_acked |= front.xmits > 1;
            if !front.sacked && front.xmits == 1 {
                self.note_reord(front.start);
            }
            if !front.sacked {
                self.rate_seg_delivered(&front);
                self.rack_update(&front);
                self.snd.delivered += u64::from(acked_segs);
                delivered = true;
                if front.xmits == 1 {
                    rtt_sample = Some(self.now.saturating_since(front.sent));
                }
            }
            if !whole {
                break;
            }
        }
        let data_end = self.snd.una + self.snd.buf.len();
        let data_acked = ack.min(data_end).since(self.snd.una);
        self.snd.buf.consume(data_acked as usize);
        if self.snd.fin_sent && ack.gt(data_end) {
            self.snd.fin_acked = true;
        }
        self.snd.una = ack;
        self.mtu_probe_on_ack(ack);
        self.snd.progress = self.now;
        self.wmem_on_ack();
        // All acknowledged: no longer busy (the send-buffer limited time ends when
        // the writer is woken, `wmem_after_transmit`).
        if self.snd.buf.is_empty() {
            self.chrono_stop(super::Chrono::Busy);
        }
        self.rtt.latest = None;
        if let Some(r) = rtt_sample {
            self.rtt.sample(r, &self.cfg);
            self.rtt.latest = Some(r);
        } else if let Some(ms) = ecr
            .filter(|_| self.ts.ok)
            .and_then(|ecr| self.ts.echo_ms(ecr, self.now))
        {
            let r = Duration::from_millis(u64::from(ms));
            self.rtt.sample_coarse(r, &self.cfg);
            self.rtt.latest = Some(r);
        }
        self.rtt.backoff = 0;
        self.recovery.dupacks = 0;
        self.recovery.tlp_outstanding = false;
        // Something got through: forget the soft error (as Linux does).
        self.soft_error = None;
        if self.scoreboard.is_empty() {
            self.timers.clear(Timer::Rto);
            self.timers.clear(Timer::Tlp);
            self.timers.clear(Timer::Reorder);
        } else {
            self.timers
                .set(Timer::Rto, self.now + self.rto_backed_off());
        }
        delivered
    }

    /// The SACK blocks of an ACK (RFC 2018, D-SACK RFC 2883). Returns whether
    /// anything was newly delivered.
    pub(crate) fn process_sacks(&mut self, seg: &Segment) -> bool {
        let blocks = seg.options.sacks();
        let mut delivered = false;
        for (i, &(l, r)) in blocks.iter().enumerate() {
            self.stats.rx_sack_blocks += 1;
            let (l, r) = (Seq(l), Seq(r));
            if !l.lt(r) || r.gt(self.snd.nxt) || r.since(l) > (1 << 30) {
                self.stats.rare().rx_sack_invalid += 1;
                continue;
            }
            // D-SACK (RFC 2883): below the cumulative ACK, or inside the second block.
            let in_second = i == 0
                && blocks
                    .get(1)
                    .is_some_and(|&(l2, r2)| Seq(l2).le(l) && Seq(r2).ge(r));
            if r.le(Seq(seg.ack)) || r.le(self.snd.una) || in_second {
                self.stats.rare().rx_dsack += 1;
                let rack = &mut self.recovery.rack;
                rack.reo_wnd_mult = (rack.reo_wnd_mult + 1).min(8);
                continue;
            }
            let l = l.max(self.snd.una);
            let mut idx = self.scoreboard.first_ending_after(l);
            while idx < self.scoreboard.len() {
                let mut s = self.scoreboard[idx];
                if !s.start.lt(r) {
                    break;
                }
                if s.segs > 1 && !s.sacked {
                    // An entry of several segments the block covers in part: cut out
                    // the whole segments it covers (Linux's `tcp_match_skb_to_sack`).
                    let len = s.data_len();
                    let head = if l.gt(s.start) {
                        l.since(s.start).next_multiple_of(s.unit)
                    } else {
                        0
                    };
                    let end = if r.lt(s.end) {
                        r.since(s.start) / s.unit * s.unit
                    } else {
                        len
                    };
                    if head < end {
                        self.scoreboard.split(idx, end);
                        if head > 0 {
                            self.scoreboard.split(idx, head);
                            idx += 1;
                        }
                        s = self.scoreboard[idx];
                    }
                }
                // Only segments the block covers whole (a single segment covered in
                // part is left alone: conservative).
                if s.start.ge(l) && s.end.le(r) && self.scoreboard.mark_sacked(idx) {
                    if s.xmits == 1 {
                        self.note_reord(s.start);
                    }
                    self.rack_update(&s);
                    self.rate_seg_delivered(&s);
                    self.snd.delivered += u64::from(s.segs);
                    delivered = true;
                }
                idx += 1;
            }
        }
        delivered
    }

    fn note_reord(&mut self, start: Seq) {
        let r = &mut self.recovery.reord_low;
        *r = Some(r.map_or(start, |l| if start.lt(l) { start } else { l }));
    }

    /// After an ACK's cumulative and selective parts (Linux's
    /// `tcp_check_sack_reordering`): a never-retransmitted segment it delivered
    /// below `prior_fack` (the highest SACKed sequence before it) arrived out of
    /// order; the distance to the highest SACKed sequence now, in segments, raises
    /// the reordering estimate.
    pub(crate) fn check_reordering(&mut self, prior_fack: Seq) {
        let Some(low) = self.recovery.reord_low.take() else {
            return;
        };
        let fack = self
            .scoreboard
            .highest_sacked_end()
            .map_or(
                prior_fack,
                |f| if f.gt(prior_fack) { f } else { prior_fack },
            );
        if !low.lt(prior_fack) || !low.lt(fack) {
            return;
        }
        let mss = self.smss().max(1);
        let metric = fack.since(low);
        if metric > self.recovery.reordering.saturating_mul(mss) {
            self.recovery.reordering = metric.div_ceil(mss).min(REORDERING_MAX);
        }
        self.recovery.reord_seen += 1;
    }

    fn rack_update(&mut self, s: &TxSeg) {
        if self
            .recovery
            .rack
            .on_delivered(s, self.now, self.rtt.min_rtt)
        {
            self.stats.rare().reordering_seen += 1;
        }
    }

    /// After the ACK's information is in: a duplicate ACK counts towards DupThresh
    /// (without SACK), a delivery runs RACK, and anything lost starts fast recovery.
    pub(crate) fn detect_loss(&mut self, duplicate_ack: bool, delivered: bool) {
        if duplicate_ack {
            self.recovery.dupacks += 1;
            self.stats.rx_dup_acks += 1;
            if !self.opts.sack && self.recovery.dupacks == 3 && !self.recovery.in_recovery() {
                self.mark_front_lost();
                self.stats.rare().dupthresh_losses += 1;
            }
        }
        if delivered {
            self.rack_detect_loss();
        }
        if self.scoreboard.lost_segs() > 0 && !self.recovery.in_recovery() {
            self.enter_fast_recovery();
        }
    }

    /// RFC 8985 §6.2 step 5: mark segments sent before the most recently delivered
    /// one, and older than it by more than the reordering window, as lost; arm the
    /// reordering timer for the rest.
    pub(crate) fn rack_detect_loss(&mut self) {
        if self.recovery.rack.xmit_ts.is_none() {
            return;
        }
        let reo = self.recovery.rack.reo_wnd(
            self.recovery.in_recovery(),
            self.scoreboard.sacked_segs(),
            self.rtt.min_rtt,
            self.rtt.srtt,
        );
        let mut wait: Option<Instant> = None;
        for i in 0..self.scoreboard.len() {
            let s = self.scoreboard[i];
            if s.sacked || s.lost {
                continue;
            }
            if self.recovery.rack.sent_before_latest(&s) != Some(true) {
                if s.xmits == 1 {
                    // Every later never-retransmitted segment was sent later still.
                    break;
                }
                continue;
            }
            let deadline = s.sent + self.recovery.rack.rtt + reo;
            if deadline <= self.now {
                self.scoreboard.mark_lost(i);
                self.stats.rare().rack_losses += 1;
            } else {
                wait = Some(wait.map_or(deadline, |w: Instant| w.max(deadline)));
            }
        }
        self.timers.set_or_clear(Timer::Reorder, wait);
    }

    fn mark_front_lost(&mut self) {
        if let Some(i) = self.scoreboard.first_unsacked() {
            // One segment, as Linux's `tcp_mark_head_lost` cuts its buffer.
            let head = self.scoreboard[i].head_len();
            self.scoreboard.split(i, head);
            self.scoreboard.mark_lost(i);
        }
    }

    pub(crate) fn enter_fast_recovery(&mut self) {
        if self.recovery.in_recovery() || self.mtu_probe_lost_at_head() {
            return;
        }
        self.recovery.phase = Phase::Fast;
        self.recovery.point = self.snd.nxt;
        self.stats.fast_recoveries += 1;
        let flight = self.snd.nxt.since(self.snd.una);
        let prior_cwnd = self.cc.cwnd();
        self.cc.on_loss(self.now, flight, self.smss());
        // Proportional rate reduction (RFC 6937) takes cwnd from here to ssthresh
        // over the episode; it replaces an ECN reduction under way. Its RecoverFS
        // is the window before the reduction, as Linux's prior_cwnd.
        self.ecn.cwr_until = None;
        self.ecn.prr = Some(super::ecn::Prr {
            recover_fs: prior_cwnd.max(1),
            ..Default::default()
        });
        self.recovery.fast_rtx_pending = true;
        self.timers.clear(Timer::Tlp);
    }

    /// Linux's `TCP_CA_Disorder`: no recovery, but SACKed or lost segments or
    /// duplicate ACKs are on the scoreboard, or a retransmission is outstanding.
    pub(crate) fn in_disorder(&self) -> bool {
        !self.recovery.in_recovery()
            && (self.scoreboard.sacked_segs() > 0
                || self.scoreboard.lost_segs() > 0
                || self.recovery.dupacks > 0
                || self.scoreboard.any_retransmitted())
    }

    /// SND.UNA advanced: congestion control hears of it as the episode allows, an
    /// episode ends at its recovery point, and the TLP is re-armed. The controller
    /// counts only what this ACK newly delivered: `sacked_retired` bytes of it
    /// were SACKed before (as Linux grows cwnd by newly delivered segments).
    pub(crate) fn on_ack_advanced(
        &mut self,
        ack: Seq,
        flight_before: u32,
        cwnd_limited: bool,
        sacked_retired: u32,
    ) {
        let acked = ack
            .since(self.snd.una_before_last_ack)
            .saturating_sub(sacked_retired);
        let (mss, srtt) = (self.smss(), self.rtt.srtt);
        let (rtt, una, nxt) = (self.rtt.latest, self.snd.una, self.snd.nxt);
        let sample = |cwnd_limited| AckSample {
            acked,
            mss,
            srtt,
            in_flight: flight_before,
            cwnd_limited,
            rtt,
            una,
            nxt,
        };
        match self.recovery.phase {
            Phase::None => {
                let s = sample(cwnd_limited);
                self.cc.on_ack(self.now, &s);
            }
            Phase::Fast => {
                if ack.ge(self.recovery.point) {
                    self.recovery.phase = Phase::None;
                    self.ecn.prr = None;
                    self.cc
                        .on_recovery_end(self.now, self.scoreboard.pipe(), self.smss());
                } else {
                    self.stats.rare().partial_acks += 1;
                    if !self.opts.sack {
                        // RFC 6582: the next hole is lost; retransmit it now.
                        self.mark_front_lost();
                        self.recovery.fast_rtx_pending = true;
                    }
                }
            }
            Phase::Rto => {
                let s = sample(true);
                self.cc.on_ack(self.now, &s);
                if ack.ge(self.recovery.point) {
                    self.recovery.phase = Phase::None;
                }
            }
            Phase::Pmtu => {
                // Not congestion: the window grows as usual.
                let s = sample(cwnd_limited);
                self.cc.on_ack(self.now, &s);
                if ack.ge(self.recovery.point) {
                    self.recovery.phase = Phase::None;
                }
            }
        }
        self.snd.cwnd_blocked = false;
        self.arm_tlp();
    }

    /// Arm the tail-loss probe (RFC 8985 §7.2) after new data or a new ACK.
    pub(crate) fn arm_tlp(&mut self) {
        if !self.cfg.tlp
            || !self.opts.sack
            || self.recovery.in_recovery()
            || self.recovery.tlp_outstanding
            || self.scoreboard.is_empty()
        {
            // A probe that stood in for the RTO hands its deadline back.
            if let Some(t) = self
                .timers
                .get(Timer::Tlp)
                .filter(|_| self.recovery.tlp_for_rto)
            {
                if !self.scoreboard.is_empty() {
                    self.timers.set_if_idle(Timer::Rto, t);
                }
            }
            self.recovery.tlp_for_rto = false;
            self.timers.clear(Timer::Tlp);
            return;
        }
        let pto = match self.rtt.srtt {
            Some(s) => {
                // RFC 8985 §7.2 sets no floor: 2·SRTT, plus 2 ms of timer slack
                // (Linux's TCP_TIMEOUT_MIN) so an ACK due at 2·SRTT is not beaten.
                let mut p = s * 2 + Duration::from_millis(2);
                if self.scoreboard.segs_out() == 1 {
                    p += self.cfg.peer_max_ack_delay;
                }
                p
            }
            None => Duration::from_secs(1),
        };
        // RFC 8985 §7.2: if the RTO would fire first, the probe goes at the RTO's
        // time instead and stands in for it (as Linux: sending the probe re-arms
        // the RTO, and so does a probe that finds nothing to send).
        let mut at = self.now + pto;
        let rto = match self.timers.get(Timer::Rto) {
            Some(r) => Some(r),
            None if self.recovery.tlp_for_rto => self.timers.get(Timer::Tlp),
            None => None,
        };
        self.recovery.tlp_for_rto = false;
        match rto {
            Some(r) if r <= at => {
                at = r;
                self.timers.clear(Timer::Rto);
                self.recovery.tlp_for_rto = true;
            }
            // An earlier probe no longer stands in: the RTO is its own again.
            Some(r) => self.timers.set(Timer::Rto, r),
            None => {}
        }
        self.timers.set(Timer::Tlp, at);
    }

    /// Arm the RTO for the data in flight unless it is armed, or the TLP stands in
    /// for it.
    pub(crate) fn arm_rto_if_idle(&mut self) {
        if self.recovery.tlp_for_rto && self.timers.is_armed(Timer::Tlp) {
            return;
        }
        self.timers
            .set_if_idle(Timer::Rto, self.now + self.rto_backed_off());
    }

    /// RACK reordering timer: the segments it waited for are lost now.
    pub(crate) fn on_reorder_timer(&mut self) {
        self.stats.rare().rack_reorder_timeouts += 1;
        self.rack_detect_loss();
        if self.scoreboard.lost_segs() > 0 && !self.recovery.in_recovery() {
            self.enter_fast_recovery();
            // No ACK brings this episode's first reduction step: count one segment
            // delivered, as Linux does, so PRR starts from pipe rather than from
            // the whole new ssthresh.
            self.prr_on_ack(self.smss(), false, false);
        }
    }

    /// TLP timer: send a probe on the next transmit pass.
    pub(crate) fn on_tlp_timer(&mut self) {
        // No longer standing in: the RTO is armed again after this pass.
        self.recovery.tlp_for_rto = false;
        if !self.recovery.in_recovery() && !self.scoreboard.is_empty() {
            self.recovery.tlp_pending = true;
        }
    }

    /// The RTO timer: in SYN-SENT/SYN-RECEIVED the SYN or SYN-ACK is due again,
    /// once synchronized the data in flight.
    pub(crate) fn on_rto_timer(&mut self) {
        match self.state {
            State::SynSent | State::SynReceived => self.on_syn_timeout(),
            State::Closed | State::TimeWait => {}
            _ => self.on_data_timeout(),
        }
    }

    /// RFC 6298 §5.4-5.6 with RFC 5681 §3.1: every un-SACKed segment is lost, cwnd
    /// falls to one segment (ssthresh once per episode), the RTO backs off; after
    /// `max_retries` (or, with a user timeout, once the data has gone
    /// unacknowledged that long after at least one retransmission) the connection is
    /// dropped.
    fn on_data_timeout(&mut self) {
        if self.scoreboard.is_empty() {
            return;
        }
        let expired = match self.user_timeout_left() {
            Some(left) => left.is_zero() && self.rtt.backoff > 0,
            None => self.rtt.backoff >= self.cfg.max_retries,
        };
        if expired {
            self.stats.rare().conn_timeouts += 1;
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        self.stats.rto_expired += 1;
        if self.rtt.backoff >= self.cfg.retries1 {
            // Linux's tcp_write_timeout: maybe a path MTU black hole.
            self.mtu_black_hole();
        }
        let flight = self.snd.nxt.since(self.snd.una);
        if self.recovery.phase == Phase::Rto {
            // Same episode: back to one segment, ssthresh unchanged.
            self.cc.on_idle_restart(self.smss());
        } else {
            self.cc.on_rto(self.now, flight, self.smss());
            self.stats.rare().rto_recoveries += 1;
        }
        self.recovery.phase = Phase::Rto;
        self.recovery.point = self.snd.nxt;
        // Slow start from one segment: no rate reduction steers cwnd any more.
        self.ecn.prr = None;
        for i in 0..self.scoreboard.len() {
            self.scoreboard.mark_lost(i);
        }
        self.rtt.backoff += 1;
        self.timers.clear(Timer::Tlp);
        self.recovery.tlp_pending = false;
        self.timers.clear(Timer::Reorder);
        self.recovery.dupacks = 0;
        self.recovery.fast_rtx_pending = true;
    }

    /// RFC 6675 `pipe`, or without SACK the RFC 6582 estimate: each duplicate ACK
    /// stands for a segment that left the network. Before recovery that lets the
    /// first two duplicate ACKs each send a new segment (RFC 3042 limited transmit:
    /// at most cwnd + 2 segments outstanding, cwnd itself unchanged; with SACK the
    /// scoreboard's pipe does the same).
    pub(crate) fn pipe_est(&self) -> u32 {
        let left = match self.recovery.phase {
            _ if self.opts.sack => 0,
            Phase::Fast => self.recovery.dupacks,
            Phase::None => self.recovery.dupacks.min(2),
            _ => 0,
        };
        self.scoreboard.pipe().saturating_sub(left * self.smss())
    }

    /// Retransmit the first segment marked lost, if the congestion window allows.
    pub(crate) fn retransmit_lost<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
    ) -> Option<bool> {
        let i = self.scoreboard.first_lost()?;
        let len = self.scoreboard[i].head_len();
        let pipe = self.pipe_est();
        if !self.recovery.fast_rtx_pending && pipe > 0 && pipe + len > self.cc.cwnd() {
            self.snd.cwnd_blocked = true;
            return None;
        }
        let sent = self.retransmit(sink, i);
        if sent {
            self.recovery.fast_rtx_pending = false;
        }
        Some(sent)
    }

    /// Whether segment `i`, about to be retransmitted, ends a run of two or more
    /// segments of one original piece retransmitted back to back in this pass (the
    /// one before it just went, the one after it is not marked lost or belongs to
    /// another piece): what is left of one of Linux's TSO buffers, sent again as
    /// one multi-segment frame, which ends with PSH as Linux's do.
    fn ends_retransmitted_run(&self, i: usize) -> bool {
        if !self.cfg.tso_pieces || i == 0 || i >= self.scoreboard.len() {
            return false;
        }
        let (prev, cur) = (self.scoreboard[i - 1], self.scoreboard[i]);
        let after = (i + 1 < self.scoreboard.len()).then(|| self.scoreboard[i + 1]);
        let same_piece = |a: &TxSeg, b: &TxSeg| a.end == b.start && a.piece_end == b.piece_end;
        same_piece(&prev, &cur)
            && prev.xmits > 1
            && prev.sent == self.now
            && !prev.sacked
            && after.is_none_or(|n| !(n.lost && same_piece(&cur, &n)))
    }

    /// Retransmit segment `i` (splitting it first if the MSS shrank).
    fn retransmit<S: SegmentSink + ?Sized>(&mut self, sink: &mut S, i: usize) -> bool {
        let opts = self.segment_options();
        let maxp = self.max_payload(&opts) as u32;
        let (start, end) = (self.scoreboard[i].start, self.scoreboard[i].end);
        if self.is_mtu_probe(start, end) {
            // A probe resent did not get through as one (RFC 4821 §7.5).
            self.mtu_probe_failed();
        }
        if self.scoreboard[i].data_len() > maxp {
            // The head keeps maxp bytes; the tail is a new entry with the same marks.
            self.scoreboard.split(i, maxp);
        }
        let s = self.scoreboard[i];
        let data_len = s.data_len() as usize;
        let mut flags = TcpFlags::ACK;
        if s.fin {
            flags |= TcpFlags::FIN;
        }
        // PSH as on the original: on the segment that ended the queued data.
        let data_end = self.snd.una + self.snd.buf.len();
        let ends_data = s.end.since(data_end) <= 1 && s.end.ge(data_end);
        // (The data a Fast Open SYN carried is a buffer of its own, pushed.)
        let syn_data = self.syn.fo_sent > 0 && s.end == self.snd.iss + 1u32 + self.syn.fo_sent;
        let ends_run = self.ends_retransmitted_run(i);
        if data_len > 0
            && ((ends_data && !self.snd.more)
                || self.snd.records.contains(&s.end)
                || syn_data
                || ends_run)
        {
            flags |= TcpFlags::PSH;
        }
        let off = s.start.since(self.snd.una) as usize;
        if !self.emit(sink, flags, s.start, off, data_len, opts) {
            return false;
        }
        let stamp = self.rate_stamp();
        self.scoreboard.retransmitted(i, self.now);
        self.scoreboard.stamp_rate(i, stamp);
        if data_len > 0 {
            self.pacing_sent(data_len as u32);
        }
        self.prr_sent(data_len as u32);
        self.stats.retransmit_segments += 1;
        self.stats.retransmit_bytes += data_len as u64;
        self.arm_rto_if_idle();
        true
    }

    /// Tail loss probe (RFC 8985 §7.3): new data if possible, else the last segment.
    pub(crate) fn send_tlp<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> Option<bool> {
        let mut dummy = false;
        let sent = match self.send_new_data(sink, true, &mut dummy) {
            Some(s) => s,
            None => {
                // The last segment (Linux's `tcp_send_loss_probe` cuts it off its
                // buffer).
                let mut i = self.scoreboard.last_unsacked()?;
                let s = self.scoreboard[i];
                if s.segs > 1 {
                    self.scoreboard.split(i, (s.segs - 1) * s.unit);
                    i += 1;
                }
                self.retransmit(sink, i)
            }
        };
        if sent {
            self.stats.tlp_probes += 1;
            self.recovery.tlp_outstanding = true;
            self.timers.clear(Timer::Tlp);
            self.timers
                .set(Timer::Rto, self.now + self.rto_backed_off());
        }
        Some(sent)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_retransmitted_run_of_one_piece_ends_with_psh() {
        use crate::conn::scoreboard::TxSeg;
        let cfg = crate::TcpConfig {
            tso_pieces: true,
            ..crate::TcpConfig::default()
        };
        let (mut c, _srv) = pair(cfg, crate::TcpConfig::default());
        let now = c.now;
        let base = c.snd.una;
        // Two pieces of two segments: [0, 200) and [200, 400); all lost.
        c.scoreboard.clear();
        for k in 0..4u32 {
            let start = base + 100 * k;
            let mut s = TxSeg::new(start, start + 100u32, false, now);
            s.piece_end = base + if k < 2 { 200u32 } else { 400u32 };
            c.scoreboard.push(s);
            c.scoreboard.mark_lost(k as usize);
        }
        // The first segment starts a run: not its end.
        assert!(!c.ends_retransmitted_run(0));
        c.scoreboard.retransmitted(0, now);
        // The second ends its piece's run (the next is another piece's).
        assert!(c.ends_retransmitted_run(1));
        c.scoreboard.retransmitted(1, now);
        // The third starts the next piece: a run of one so far.
        assert!(!c.ends_retransmitted_run(2));
        // Without TSO pieces there are no runs.
        std::sync::Arc::make_mut(&mut c.cfg).tso_pieces = false;
        c.scoreboard.retransmitted(2, now);
        assert!(!c.ends_retransmitted_run(3));
    }

    use super::super::test_util::*;
    use super::*;
    use crate::testing::OwnedSegment;
    use crate::TcpConfig;

    fn seg(start: u32, len: u32, sent_ms: u64, xmits: u16) -> TxSeg {
        let mut s = TxSeg::new(
            Seq(start),
            Seq(start + len),
            false,
            Instant::from_millis(sent_ms),
        );
        s.xmits = xmits;
        s
    }

    #[test]
    fn rack_keeps_the_latest_sent_delivery() {
        let mut rack = Rack::new(Seq(0));
        let now = Instant::from_millis(100);
        assert!(!rack.on_delivered(&seg(100, 100, 50, 1), now, None));
        assert_eq!(rack.xmit_ts, Some(Instant::from_millis(50)));
        assert_eq!(rack.rtt, ms(50));
        // Delivered later but sent earlier: RTT taken, the latest send time stays.
        assert!(!rack.on_delivered(&seg(200, 100, 40, 1), now, None));
        assert_eq!(rack.xmit_ts, Some(Instant::from_millis(50)));
        assert_eq!(rack.end_seq, Seq(200));
        assert_eq!(rack.fack, Seq(300));
        // A never-retransmitted segment below the highest delivered: reordering.
        assert!(rack.on_delivered(&seg(0, 100, 30, 1), now, None));
        assert!(rack.reordering_seen);
        assert!(
            !rack.on_delivered(&seg(0, 100, 30, 1), now, None),
            "told once"
        );
    }

    #[test]
    fn rack_skips_an_ambiguous_retransmission() {
        let mut rack = Rack::new(Seq(0));
        let now = Instant::from_millis(100);
        // Retransmitted 5 ms ago with a 20 ms minimum RTT: the ACK is the original's.
        rack.on_delivered(&seg(0, 100, 95, 2), now, Some(ms(20)));
        assert_eq!(rack.xmit_ts, None);
        rack.on_delivered(&seg(0, 100, 60, 2), now, Some(ms(20)));
        assert_eq!(rack.xmit_ts, Some(Instant::from_millis(60)));
    }

    #[test]
    fn reordering_window() {
        let mut rack = Rack::new(Seq(0));
        let (min, srtt) = (Some(ms(40)), Some(ms(50)));
        assert_eq!(rack.reo_wnd(false, 0, min, srtt), ms(10));
        // DupThresh stand-in: nothing reordered yet and 3 SACKed (or in recovery).
        assert_eq!(rack.reo_wnd(false, 3, min, srtt), Duration::ZERO);
        assert_eq!(rack.reo_wnd(true, 0, min, srtt), Duration::ZERO);
        rack.reordering_seen = true;
        assert_eq!(rack.reo_wnd(true, 3, min, srtt), ms(10));
        rack.reo_wnd_mult = 8;
        assert_eq!(rack.reo_wnd(false, 0, min, srtt), ms(50), "at most SRTT");
        assert_eq!(rack.reo_wnd(false, 0, min, None), ms(80));
    }

    #[test]
    fn sent_before_latest_orders_by_time_then_sequence() {
        let mut rack = Rack::new(Seq(0));
        assert_eq!(rack.sent_before_latest(&seg(0, 10, 1, 1)), None);
        rack.on_delivered(&seg(100, 100, 10, 1), Instant::from_millis(20), None);
        assert_eq!(rack.sent_before_latest(&seg(0, 100, 9, 1)), Some(true));
        assert_eq!(rack.sent_before_latest(&seg(0, 100, 10, 1)), Some(true));
        assert_eq!(rack.sent_before_latest(&seg(200, 100, 10, 1)), Some(false));
        assert_eq!(rack.sent_before_latest(&seg(0, 100, 11, 1)), Some(false));
        // With the order of transmission known, it decides a tie: a
        // retransmission of a lower segment after the delivered one is not older.
        let mut rack = Rack::new(Seq(0));
        let mut d = seg(100, 100, 10, 1);
        d.order = 5;
        rack.on_delivered(&d, Instant::from_millis(20), None);
        let mut r = seg(0, 100, 10, 2);
        r.order = 6;
        assert_eq!(rack.sent_before_latest(&r), Some(false));
        r.order = 4;
        assert_eq!(rack.sent_before_latest(&r), Some(true));
    }

    /// `n` full segments from the client, with the server's ACKs for `deliver` of
    /// them (by index).
    fn flight(
        cli: &mut Connection,
        srv: &mut Connection,
        n: usize,
        deliver: impl Fn(usize) -> bool,
        now: Instant,
    ) -> (Vec<OwnedSegment>, Vec<OwnedSegment>) {
        assert_eq!(cli.send(&vec![1u8; n * MSS]), n * MSS);
        let data = drain(cli, now);
        assert_eq!(data.len(), n);
        let mut acks = Vec::new();
        for (i, s) in data.iter().enumerate() {
            if deliver(i) {
                srv.input(now, &s.segment());
                acks.extend(drain(srv, now));
            }
        }
        (data, acks)
    }

    #[test]
    fn sack_marks_the_hole_lost_and_fast_recovery_resends_it() {
        let (mut cli, mut srv) = default_pair();
        let now = T0 + ms(10);
        let (data, acks) = flight(&mut cli, &mut srv, 8, |i| i != 0, now);
        assert!(acks.iter().all(|a| a.repr.ack == data[0].repr.seq));
        assert!(acks.iter().any(|a| a.repr.options.sack_count > 0));
        // The burst is one scoreboard entry of eight segments.
        assert_eq!((cli.scoreboard.len(), cli.scoreboard.segs_out()), (1, 8));
        let cwnd = cli.info().cwnd;
        let now = now + ms(5);
        feed(&mut cli, now, &acks);
        // The SACKs cut it on its segment grid: the hole is one segment of its own.
        assert_eq!(cli.scoreboard.segs_out(), 8);
        assert_eq!(cli.scoreboard[0].end.0, data[1].repr.seq);
        // RACK: the hole was sent before the SACKed segments, and the reordering
        // window is 0 here (no delay, so a zero minimum RTT): it is lost at once.
        assert_eq!(cli.recovery.phase, Phase::Fast);
        assert_eq!(cli.scoreboard.lost_segs(), 1);
        assert_eq!(cli.scoreboard.sacked_segs(), 7);
        assert!(cli.info().cwnd < cwnd);
        let out = drain(&mut cli, now);
        assert_eq!(out[0].repr.seq, data[0].repr.seq, "the hole goes first");
        assert_eq!(cli.stats().retransmit_segments, 1);
        // Its ACK covers everything: the episode ends.
        srv.input(now, &out[0].segment());
        feed(&mut cli, now + ms(5), &drain(&mut srv, now));
        assert_eq!(cli.recovery.phase, Phase::None);
        assert!(cli.scoreboard.is_empty());
        cli.check_invariants().unwrap();
    }

    #[test]
    fn a_duplicate_ack_below_the_threshold_is_disorder_not_recovery() {
        let cfg = TcpConfig {
            sack: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg.clone(), cfg);
        let (_, acks) = flight(&mut cli, &mut srv, 1, |_| true, T0 + ms(1));
        feed(&mut cli, T0 + ms(2), &acks);
        assert!(!cli.info().disorder);
        let now = T0 + ms(10);
        let (_, acks) = flight(&mut cli, &mut srv, 4, |i| i != 0, now);
        feed(&mut cli, now + ms(1), &acks[..1]);
        let info = cli.info();
        assert!(info.disorder && !info.in_recovery && !info.in_loss);
    }

    #[test]
    fn a_cumulative_ack_of_sacked_data_grows_cwnd_only_by_what_it_newly_delivered() {
        let (mut cli, mut srv) = pair_with_rtt(TcpConfig::default(), TcpConfig::default(), ms(100));
        let iw = cli.info().cwnd;
        let now = T0 + ms(200);
        // A full initial window; the second segment arrives first (a SACK), then the
        // first (a cumulative ACK of both).
        assert_eq!(cli.send(&vec![1u8; 10 * MSS]), 10 * MSS);
        let data = drain(&mut cli, now);
        assert_eq!(data.len(), 10);
        srv.input(now + ms(50), &data[1].segment());
        let sack = drain(&mut srv, now + ms(50));
        srv.input(now + ms(51), &data[0].segment());
        let cum = drain(&mut srv, now + ms(51));
        feed(&mut cli, now + ms(100), &sack);
        assert_eq!(cli.recovery.phase, Phase::None);
        assert_eq!(cli.info().cwnd, iw, "a SACK alone does not grow cwnd");
        feed(&mut cli, now + ms(101), &cum);
        assert_eq!(cli.snd.una, Seq(data[2].repr.seq));
        assert_eq!(
            cli.info().cwnd,
            iw + MSS as u32,
            "one segment newly delivered"
        );
    }

    #[test]
    fn without_sack_duplicate_acks_count_as_delivered_segments_for_cwnd() {
        let cfg = TcpConfig {
            sack: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair_with_rtt(cfg.clone(), cfg, ms(100));
        // One delivered segment first, so that the duplicate ACKs carry the window
        // the client already has.
        let (_, acks) = flight(&mut cli, &mut srv, 1, |_| true, T0 + ms(101));
        feed(&mut cli, T0 + ms(150), &acks);
        let iw = cli.info().cwnd;
        let now = T0 + ms(200);
        assert_eq!(cli.send(&vec![1u8; 10 * MSS]), 10 * MSS);
        let data = drain(&mut cli, now);
        // Segments 1 and 2 first (two duplicate ACKs), then 0: the cumulative ACK
        // covers three segments, only one of them news (RFC 3042's reordering case).
        let mut acks = Vec::new();
        for i in [1, 2, 0] {
            srv.input(now + ms(50), &data[i].segment());
            acks.extend(drain(&mut srv, now + ms(50)));
        }
        assert_eq!(acks.len(), 3);
        feed(&mut cli, now + ms(100), &acks[..2]);
        assert_eq!(cli.recovery.dupacks, 2);
        feed(&mut cli, now + ms(101), &acks[2..]);
        assert_eq!(cli.snd.una, Seq(data[3].repr.seq));
        assert_eq!(cli.info().cwnd, iw + MSS as u32);
    }

    #[test]
    fn fast_recovery_spreads_sending_over_the_acks_by_proportional_rate_reduction() {
        let cfg = TcpConfig {
            congestion: crate::CcAlgorithm::NewReno,
            initial_window: 20,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair_with_rtt(cfg.clone(), cfg, ms(100));
        let now = T0 + ms(200);
        // Thirty segments queued, a window of twenty sent; the first is lost.
        assert_eq!(cli.send(&vec![1u8; 30 * MSS]), 30 * MSS);
        let data = drain(&mut cli, now);
        assert_eq!(data.len(), 20);
        let mut sacks = Vec::new();
        for s in &data[1..] {
            srv.input(now + ms(50), &s.segment());
            sacks.extend(drain(&mut srv, now + ms(50)));
        }
        assert_eq!(sacks.len(), 19);
        // Three SACKs: RACK marks the first lost and recovery begins with ssthresh
        // half the flight (10 segments) while 17 are still in the network: the
        // retransmission goes, nothing more.
        let mut t = now + ms(100);
        feed(&mut cli, t, &sacks[..3]);
        assert_eq!(cli.recovery.phase, Phase::Fast);
        let out = drain(&mut cli, t);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.seq, data[0].repr.seq);
        // While pipe is above ssthresh, one new segment per two delivered
        // (ssthresh / RecoverFS), where cwnd = ssthresh would send none at all.
        let mut sent = Vec::new();
        for a in &sacks[3..13] {
            t = t + ms(1);
            feed(&mut cli, t, std::slice::from_ref(a));
            sent.push(drain(&mut cli, t).len());
        }
        assert_eq!(sent, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn a_reordering_timeout_starts_recovery_with_one_retransmission() {
        let (mut cli, mut srv) = pair_with_rtt(TcpConfig::default(), TcpConfig::default(), ms(100));
        let now = T0 + ms(200);
        assert_eq!(cli.send(&vec![1u8; 10 * MSS]), 10 * MSS);
        let data = drain(&mut cli, now);
        assert_eq!(data.len(), 10);
        // Only the eighth arrives: its SACK arms RACK's reordering timer (a quarter
        // of the minimum RTT) for the seven before it.
        srv.input(now + ms(50), &data[7].segment());
        feed(&mut cli, now + ms(100), &drain(&mut srv, now + ms(50)));
        assert_eq!(cli.recovery.phase, Phase::None);
        assert!(drain(&mut cli, now + ms(100)).is_empty());
        // The timer: seven lost, recovery; PRR lets one segment out, as Linux
        // counts the timeout as one segment delivered.
        let out = drain(&mut cli, now + ms(130));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.seq, data[0].repr.seq);
        let info = cli.info();
        assert!(info.in_recovery && !info.in_loss);
        assert_eq!((info.lost_out, info.lost_segments), (7, 6));
        assert_eq!((info.reordering, info.reord_seen), (REORDERING_INIT, 0));
        // Then the third arrives, six segments below the highest SACKed one: it was
        // reordered, not lost.
        srv.input(now + ms(131), &data[2].segment());
        feed(&mut cli, now + ms(132), &drain(&mut srv, now + ms(131)));
        let info = cli.info();
        assert_eq!((info.reordering, info.reord_seen), (6, 1));
        assert_eq!(info.lost_out, 6);
    }

    #[test]
    fn dsack_widens_the_reordering_window() {
        let (mut cli, mut srv) = default_pair();
        let now = T0 + ms(10);
        let (data, acks) = flight(&mut cli, &mut srv, 2, |_| true, now);
        feed(&mut cli, now + ms(1), &acks);
        // The first segment again: the server reports it as a duplicate.
        srv.input(now + ms(2), &data[0].segment());
        let dup = drain(&mut srv, now + ms(2));
        assert!(dup[0].repr.options.sack_count > 0);
        feed(&mut cli, now + ms(3), &dup);
        assert_eq!(cli.stats().rx_dsack, 1);
        assert_eq!(cli.recovery.rack.reo_wnd_mult, 2);
        assert_eq!(cli.scoreboard.lost_segs(), 0, "a D-SACK marks nothing");
    }

    #[test]
    fn without_sack_three_duplicate_acks_mark_the_first_segment_lost() {
        let cfg = TcpConfig {
            sack: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg.clone(), cfg);
        // One delivered segment first, so that the window the duplicate ACKs carry is
        // the one the client already has (a changed window is no duplicate ACK).
        let (_, acks) = flight(&mut cli, &mut srv, 1, |_| true, T0 + ms(1));
        feed(&mut cli, T0 + ms(2), &acks);
        let now = T0 + ms(10);
        let (data, acks) = flight(&mut cli, &mut srv, 5, |i| i != 0, now);
        assert_eq!(acks.len(), 4);
        feed(&mut cli, now + ms(1), &acks[..2]);
        assert_eq!(cli.recovery.dupacks, 2);
        assert_eq!(cli.recovery.phase, Phase::None);
        feed(&mut cli, now + ms(1), &acks[2..3]);
        assert_eq!(cli.stats().dupthresh_losses, 1);
        assert_eq!(cli.recovery.phase, Phase::Fast);
        // Only the first segment of the burst's entry is marked.
        assert_eq!(cli.scoreboard.lost_segs(), 1);
        let out = drain(&mut cli, now + ms(1));
        assert_eq!(out[0].repr.seq, data[0].repr.seq);
        assert_eq!(out[0].payload.len(), MSS);
    }

    #[test]
    fn rto_marks_everything_lost_and_backs_off() {
        let (mut cli, _srv) = default_pair();
        let now = T0 + ms(10);
        cli.send(&vec![1u8; 4 * MSS]);
        let data = drain(&mut cli, now);
        assert_eq!(data.len(), 4);
        assert_eq!(cli.scoreboard.len(), 1, "one entry for the burst");
        let rto_at = cli.timers.get(Timer::Rto).unwrap();
        // The TLP comes first (an RTT sample exists from the handshake).
        let tlp_at = cli.timers.get(Timer::Tlp).unwrap();
        assert!(tlp_at < rto_at);
        let probe = drain(&mut cli, tlp_at);
        assert_eq!(probe.len(), 1);
        assert_eq!(probe[0].repr.seq, data[3].repr.seq, "the last segment");
        assert_eq!(probe[0].payload.len(), MSS, "cut off its entry");
        assert_eq!((cli.scoreboard.len(), cli.scoreboard.segs_out()), (2, 4));
        assert_eq!(cli.stats().tlp_probes, 1);
        assert!(!cli.timers.is_armed(Timer::Tlp), "one probe per silence");
        let rto_at = cli.timers.get(Timer::Rto).unwrap();
        let out = drain(&mut cli, rto_at);
        assert_eq!(cli.recovery.phase, Phase::Rto);
        assert_eq!(cli.stats().rto_expired, 1);
        assert_eq!(cli.rtt.backoff, 1);
        // cwnd is one segment: only the first goes out again.
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.seq, data[0].repr.seq);
        assert_eq!(cli.scoreboard.lost_segs(), 3);
        let next = cli.timers.get(Timer::Rto).unwrap();
        assert_eq!(next.saturating_since(rto_at), cli.rto_backed_off());
        assert_eq!(cli.rto_backed_off(), cli.rtt.rto * 2);
        cli.check_invariants().unwrap();
    }

    #[test]
    fn a_probe_due_after_the_rto_goes_at_the_rto_time_instead() {
        // RFC 8985 §7.2: one segment in flight adds WCDelAckT to the PTO, which
        // puts it after the RTO; the probe then takes the RTO's place.
        let (mut cli, _srv) = default_pair();
        cli.send(b"lonely");
        let data = drain(&mut cli, T0);
        assert_eq!(data.len(), 1);
        let at = cli.timers.get(Timer::Tlp).expect("a probe armed");
        assert_eq!(at, T0 + cli.rtt.rto, "at the RTO's time");
        assert!(
            !cli.timers.is_armed(Timer::Rto),
            "the probe stands in for it"
        );
        let probe = drain(&mut cli, at);
        assert_eq!(probe.len(), 1);
        assert_eq!(probe[0].repr.seq, data[0].repr.seq);
        assert_eq!(cli.stats().tlp_probes, 1);
        assert_eq!(cli.stats().rto_expired, 0);
        assert_eq!(cli.rtt.backoff, 0, "a probe is no timeout");
        // The RTO is armed again from the probe and then backs off as usual.
        let rto_at = cli.timers.get(Timer::Rto).unwrap();
        assert_eq!(rto_at, at + cli.rtt.rto);
        drain(&mut cli, rto_at);
        assert_eq!(cli.stats().rto_expired, 1);
        assert_eq!(cli.timers.get(Timer::Rto), Some(rto_at + cli.rtt.rto * 2));
        cli.check_invariants().unwrap();
    }

    #[test]
    fn a_user_timeout_ends_retransmissions_on_time() {
        let cfg = TcpConfig {
            user_timeout: Some(ms(1000)),
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg, TcpConfig::default());
        cli.send(b"into the void");
        let mut now = T0;
        drain(&mut cli, now);
        while let Some(t) = cli.poll_at() {
            assert!(t <= T0 + ms(1000), "no deadline past the user timeout");
            now = t;
            drain(&mut cli, now);
        }
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::TimedOut));
        assert_eq!(now, T0 + ms(1000), "aborted when it ran out");
        assert!(cli.stats().rto_expired >= 1);
        assert!(cli.stats().rto_expired < cli.cfg.max_retries.into());

        // An ACK restarts the clock: data acknowledged in time survives.
        let cfg = TcpConfig {
            user_timeout: Some(ms(1000)),
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg, TcpConfig::default());
        cli.send(b"first");
        let first = drain(&mut cli, T0);
        feed(&mut srv, T0 + ms(900), &first);
        feed(&mut cli, T0 + ms(900), &drain(&mut srv, T0 + ms(900)));
        cli.send(b"second");
        drain(&mut cli, T0 + ms(900));
        drain(&mut cli, T0 + ms(1500));
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.user_timeout_left(), Some(ms(400)));
    }

    #[test]
    fn limited_transmit_sends_a_new_segment_per_early_duplicate_ack() {
        // RFC 3042 without SACK: the first two duplicate ACKs each let one new
        // segment out; cwnd stays; the third starts recovery.
        let cfg = TcpConfig {
            sack: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg.clone(), cfg);
        // A segment from the server first: its window, not the SYN-ACK's, is the
        // one its duplicate ACKs repeat.
        srv.send(b"hi");
        feed(&mut cli, T0, &drain(&mut srv, T0));
        feed(&mut srv, T0, &drain(&mut cli, T0));
        let iw = cli.cc.cwnd() as usize / MSS;
        cli.send(&vec![1u8; (iw + 4) * MSS]);
        let data = drain(&mut cli, T0);
        assert_eq!(data.len(), iw);
        // The first segment is lost; the next three each bring a duplicate ACK.
        let mut now = T0 + ms(10);
        let cwnd = cli.cc.cwnd();
        for (k, seg) in data[1..4].iter().enumerate() {
            feed(&mut srv, now, std::slice::from_ref(seg));
            feed(&mut cli, now, &drain(&mut srv, now));
            let out = drain(&mut cli, now);
            if k < 2 {
                assert_eq!(out.len(), 1, "dupack {}: one new segment", k + 1);
                assert_eq!(
                    out[0].repr.seq,
                    data[iw - 1].repr.seq + (MSS * (k + 1)) as u32
                );
                assert_eq!(cli.cc.cwnd(), cwnd, "cwnd unchanged");
            } else {
                assert_eq!(cli.recovery.phase, Phase::Fast);
                assert_eq!(out[0].repr.seq, data[0].repr.seq, "then the retransmission");
            }
            now = now + ms(1);
        }
    }

    #[test]
    fn retries_exhausted_time_the_connection_out() {
        let cfg = TcpConfig {
            max_retries: 2,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg, TcpConfig::default());
        cli.send(b"hello");
        let mut now = T0;
        drain(&mut cli, now);
        while let Some(t) = cli.poll_at() {
            now = t;
            drain(&mut cli, now);
        }
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::TimedOut));
        assert_eq!(cli.stats().rto_expired, 2);
        assert_eq!(cli.stats().conn_timeouts, 1);
    }
}
