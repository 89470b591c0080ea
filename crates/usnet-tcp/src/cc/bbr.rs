//! BBR v1 as Linux's `tcp_bbr.c` behaves (Cardwell et al., "BBR: Congestion-Based
//! Congestion Control", ACM Queue 2016; draft-cardwell-iccrg-bbr-congestion-control-00).
//!
//! The model: the bottleneck bandwidth (the windowed maximum of delivery-rate
//! samples over 10 rounds) and the round-trip propagation time (the minimum RTT
//! over 10 s). The sender paces at `pacing_gain × bw` and keeps at most
//! `cwnd_gain × bw × min_rtt` in flight. Four modes:
//! - **Startup**: gain 2/ln 2 until the bandwidth stops growing by 25 % for three
//!   rounds;
//! - **Drain**: the inverse gain until what is in flight is down to one BDP;
//! - **ProbeBW**: gains cycling 5/4, 3/4, then six rounds of 1, one phase per
//!   min_rtt;
//! - **ProbeRTT**: after 10 s without a lower RTT sample, four segments in flight
//!   for 200 ms and a round, to see the path's RTT without our own queue.
//!
//! As Linux: loss does not cut the window except by packet conservation in the
//! first round of a recovery (and the window before it is restored after);
//! long-term bandwidth sampling (a token-bucket policer: a loss rate of 20 % or
//! more over 4+ rounds at a steady rate) replaces the max filter for 48 rounds;
//! the ACK-aggregation allowance (`extra_acked`) adds to the window what arrived
//! faster than the estimated rate over the last 5–10 rounds, at most 100 ms of it.
//!
//! Units: bytes and bytes per second (Linux counts packets; one `mss` is one).
//! Gains are fixed point with [`UNIT`] = 256, as Linux's `BBR_UNIT`.

use std::time::Duration;

use super::{AckSample, CcPhase, CongestionControl, RateSample};
use crate::time::Instant;

/// Fixed-point one.
const UNIT: u64 = 256;
/// Startup's pacing and window gain, 2/ln 2 (`bbr_high_gain`).
const HIGH_GAIN: u64 = UNIT * 2885 / 1000 + 1;
/// Drain's pacing gain, its inverse (`bbr_drain_gain`).
const DRAIN_GAIN: u64 = UNIT * 1000 / 2885;
/// ProbeBW's window gain (`bbr_cwnd_gain`).
const CWND_GAIN: u64 = UNIT * 2;
/// ProbeBW's pacing gains, one phase each (`bbr_pacing_gain`).
const PACING_GAINS: [u64; 8] = [
    UNIT * 5 / 4,
    UNIT * 3 / 4,
    UNIT,
    UNIT,
    UNIT,
    UNIT,
    UNIT,
    UNIT,
];
/// ProbeBW starts in a random phase other than the 3/4 one (`bbr_cycle_rand`).
const CYCLE_RAND: u32 = 7;
/// Rounds of the bandwidth max filter (`bbr_bw_rtts`).
const BW_ROUNDS: u64 = 10;
/// How long a min_rtt sample lasts (`bbr_min_rtt_win_sec`).
const MIN_RTT_WIN: Duration = Duration::from_secs(10);
/// ProbeRTT's least duration (`bbr_probe_rtt_mode_ms`).
const PROBE_RTT_TIME: Duration = Duration::from_millis(200);
/// The least window, segments (`bbr_cwnd_min_target`).
const CWND_MIN_SEGS: u64 = 4;
/// Startup is over when the bandwidth grew less than this for `FULL_BW_ROUNDS`
/// rounds (`bbr_full_bw_thresh`, `bbr_full_bw_cnt`).
const FULL_BW_THRESH: u64 = UNIT * 5 / 4;
const FULL_BW_ROUNDS: u32 = 3;
/// Pace this much below the rate (`bbr_pacing_margin_percent`).
const PACING_MARGIN_PERCENT: u64 = 1;
/// Below this rate one segment per TSO frame (`bbr_min_tso_rate`, bits/s).
const MIN_TSO_RATE_BYTES: u64 = 1_200_000 / 8;
/// Linux's GSO size limit, bytes.
const GSO_MAX_SIZE: u64 = 65536;
/// The initial window Linux's BBR assumes before the first RTT sample (segments).
const INIT_CWND_SEGS: u64 = 10;

/// Long-term sampling: intervals of at least this many rounds (`bbr_lt_intvl_min_rtts`).
const LT_INTVL_MIN_ROUNDS: u32 = 4;
/// ... with a loss ratio of at least 50/256 (`bbr_lt_loss_thresh`, ~20 %).
const LT_LOSS_THRESH: u64 = 50;
/// Two intervals' rates within 1/8 (`bbr_lt_bw_ratio`) ...
const LT_BW_RATIO: u64 = UNIT / 8;
/// ... or 4 kbit/s (`bbr_lt_bw_diff`) of each other mean a policer.
const LT_BW_DIFF_BYTES: u64 = 4000 / 8;
/// How long the policed rate is used (`bbr_lt_bw_max_rtts`).
const LT_BW_MAX_ROUNDS: u32 = 48;

/// ACK aggregation: the window's allowance is the max over 5–10 rounds
/// (`bbr_extra_acked_win_rtts`), at most 100 ms at the rate (`bbr_extra_acked_max_us`).
const EXTRA_ACKED_WIN_ROUNDS: u32 = 5;
const EXTRA_ACKED_MAX: Duration = Duration::from_millis(100);
/// An ACK epoch this large starts over (`bbr_ack_epoch_acked_reset_thresh`, segments).
const ACK_EPOCH_RESET_SEGS: u64 = 1 << 20;

/// The mode BBR is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Ramping up to find the bandwidth.
    Startup,
    /// Draining the queue Startup made.
    Drain,
    /// Cycling around the estimated bandwidth.
    ProbeBw,
    /// Cutting in-flight data to measure the path's RTT.
    ProbeRtt,
}

/// A windowed maximum over rounds, the three best samples kept as Kathleen Nichols'
/// algorithm does (Linux's `lib/win_minmax.c`): the best, and the second and third
/// best of later times, so the max of a window that slides past the best is known.
#[derive(Debug, Clone, Copy, Default)]
struct WindowedMax {
    s: [(u64, u64); 3], // (round, value)
}

impl WindowedMax {
    fn get(&self) -> u64 {
        self.s[0].1
    }

    fn reset(&mut self, t: u64, v: u64) -> u64 {
        self.s = [(t, v); 3];
        v
    }

    /// Take sample `v` at round `t`, in a window of `win` rounds.
    fn update(&mut self, win: u64, t: u64, v: u64) -> u64 {
        if v >= self.s[0].1 || t.saturating_sub(self.s[2].0) > win {
            return self.reset(t, v);
        }
        if v >= self.s[1].1 {
            self.s[1] = (t, v);
            self.s[2] = (t, v);
        } else if v >= self.s[2].1 {
            self.s[2] = (t, v);
        }
        self.subwin_update(win, t, v)
    }

    fn subwin_update(&mut self, win: u64, t: u64, v: u64) -> u64 {
        let dt = t.saturating_sub(self.s[0].0);
        if dt > win {
            // The best is out of the window: the second and third move up.
            self.s[0] = self.s[1];
            self.s[1] = self.s[2];
            self.s[2] = (t, v);
            if t.saturating_sub(self.s[0].0) > win {
                self.s[0] = self.s[1];
                self.s[1] = self.s[2];
                self.s[2] = (t, v);
            }
        } else if self.s[1].0 == self.s[0].0 && dt > win / 4 {
            // A quarter of the window went by without a second best: take one.
            self.s[1] = (t, v);
            self.s[2] = (t, v);
        } else if self.s[2].0 == self.s[1].0 && dt > win / 2 {
            self.s[2] = (t, v);
        }
        self.s[0].1
    }
}

/// BBR v1.
#[derive(Debug, Clone)]
pub struct Bbr {
    mss: u32,
    cwnd: u32,
    ssthresh: u32,
    pacing_rate: u64,
    mode: Mode,
    bw: WindowedMax,
    round_count: u64,
    next_round_delivered: u64,
    round_start: bool,
    min_rtt: Option<Duration>,
    min_rtt_stamp: Instant,
    probe_rtt_done: Option<Instant>,
    probe_rtt_round_done: bool,
    prior_cwnd: u32,
    packet_conservation: bool,
    prev_phase: CcPhase,
    idle_restart: bool,
    pacing_gain: u64,
    cwnd_gain: u64,
    full_bw_reached: bool,
    full_bw: u64,
    full_bw_rounds: u32,
    cycle_idx: usize,
    cycle_stamp: Instant,
    /// The first call has set the clock-based fields.
    started: bool,
    /// The pacing rate was set from a measured RTT (`has_seen_rtt`).
    has_seen_rtt: bool,
    // Long-term (policer) sampling.
    lt_is_sampling: bool,
    lt_rtt_cnt: u32,
    lt_use_bw: bool,
    lt_bw: u64,
    lt_last_delivered: u64,
    lt_last_stamp: Instant,
    lt_last_lost: u64,
    /// Bytes lost over the connection (Linux's `tp->lost`), from the samples.
    lost: u64,
    // ACK aggregation.
    ack_epoch_stamp: Instant,
    ack_epoch_acked: u64,
    extra_acked: [u64; 2],
    extra_acked_idx: usize,
    extra_acked_win_rounds: u32,
}

impl Bbr {
    /// A controller with an initial window of `iw` segments of `mss` bytes.
    pub fn new(mss: u32, iw: u32) -> Self {
        let mss = mss.max(1);
        let mut b = Bbr {
            mss,
            cwnd: mss * iw.max(1),
            ssthresh: u32::MAX,
            pacing_rate: 0,
            mode: Mode::Startup,
            bw: WindowedMax::default(),
            round_count: 0,
            next_round_delivered: 0,
            round_start: false,
            min_rtt: None,
            min_rtt_stamp: Instant::ZERO,
            probe_rtt_done: None,
            probe_rtt_round_done: false,
            prior_cwnd: 0,
            packet_conservation: false,
            prev_phase: CcPhase::Open,
            idle_restart: false,
            pacing_gain: HIGH_GAIN,
            cwnd_gain: HIGH_GAIN,
            full_bw_reached: false,
            full_bw: 0,
            full_bw_rounds: 0,
            cycle_idx: 0,
            cycle_stamp: Instant::ZERO,
            started: false,
            has_seen_rtt: false,
            lt_is_sampling: false,
            lt_rtt_cnt: 0,
            lt_use_bw: false,
            lt_bw: 0,
            lt_last_delivered: 0,
            lt_last_stamp: Instant::ZERO,
            lt_last_lost: 0,
            lost: 0,
            ack_epoch_stamp: Instant::ZERO,
            ack_epoch_acked: 0,
            extra_acked: [0; 2],
            extra_acked_idx: 0,
            extra_acked_win_rounds: 0,
        };
        b.init_pacing_rate(None);
        b
    }

    /// The mode it is in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The bandwidth estimate, bytes per second.
    pub fn bandwidth(&self) -> u64 {
        if self.lt_use_bw {
            self.lt_bw
        } else {
            self.bw.get()
        }
    }

    /// The minimum RTT estimate.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// Startup found the bandwidth.
    pub fn full_bw_reached(&self) -> bool {
        self.full_bw_reached
    }

    fn start(&mut self, now: Instant) {
        self.started = true;
        self.min_rtt_stamp = now;
        self.cycle_stamp = now;
        self.ack_epoch_stamp = now;
        self.lt_last_stamp = now;
    }

    /// `bbr_init_pacing_rate_from_rtt`: high gain × cwnd per RTT (1 ms when none
    /// is known yet).
    fn init_pacing_rate(&mut self, rtt: Option<Duration>) {
        self.has_seen_rtt = rtt.is_some();
        let rtt_us = rtt.map_or(1000, |d| (d.as_micros() as u64).max(1));
        self.pacing_rate =
            self.rate_with_gain(u64::from(self.cwnd) * 1_000_000 / rtt_us, HIGH_GAIN);
    }

    /// `bbr_rate_bytes_per_sec`: `rate × gain`, less the pacing margin.
    fn rate_with_gain(&self, rate: u64, gain: u64) -> u64 {
        let r = u128::from(rate) * u128::from(gain) / u128::from(UNIT);
        (r * u128::from(100 - PACING_MARGIN_PERCENT) / 100).min(u128::from(u64::MAX)) as u64
    }

    /// `bbr_set_pacing_rate`: never lower while Startup is still looking.
    fn set_pacing_rate(&mut self, bw: u64, gain: u64, rtt: Option<Duration>) {
        if !self.has_seen_rtt && rtt.is_some() {
            self.init_pacing_rate(rtt);
        }
        let rate = self.rate_with_gain(bw, gain);
        if rate == 0 {
            return;
        }
        if self.full_bw_reached || rate > self.pacing_rate {
            self.pacing_rate = rate;
        }
    }

    /// `bbr_tso_segs_goal` in bytes: about a millisecond at the pacing rate.
    fn tso_goal(&self) -> u64 {
        let mss = u64::from(self.mss);
        let min_segs = if self.pacing_rate < MIN_TSO_RATE_BYTES {
            1
        } else {
            2
        };
        let bytes = (self.pacing_rate >> 10).min(GSO_MAX_SIZE - 1 - 40);
        (bytes / mss).max(min_segs) * mss
    }

    /// `bbr_bdp`: `bw × min_rtt × gain`, the initial window before any RTT sample.
    fn bdp(&self, bw: u64, gain: u64) -> u64 {
        let Some(rtt) = self.min_rtt else {
            return INIT_CWND_SEGS * u64::from(self.mss);
        };
        let w = u128::from(bw) * rtt.as_micros() / 1_000_000;
        (w * u128::from(gain)).div_ceil(u128::from(UNIT)) as u64
    }

    /// `bbr_quantization_budget`: room for the TSO frames in flight in the
    /// sender and receiver, an even number of segments, and one more pair in the
    /// 5/4 phase.
    fn quantization_budget(&self, cwnd: u64) -> u64 {
        let mss = u64::from(self.mss);
        let mut c = cwnd + 3 * self.tso_goal();
        let segs = c.div_ceil(mss);
        c = (segs + (segs & 1)) * mss;
        if self.mode == Mode::ProbeBw && self.cycle_idx == 0 {
            c += 2 * mss;
        }
        c
    }

    /// `bbr_inflight`: the data in flight a gain over the BDP stands for.
    fn inflight(&self, bw: u64, gain: u64) -> u64 {
        self.quantization_budget(self.bdp(bw, gain))
    }

    fn cwnd_min(&self) -> u32 {
        (CWND_MIN_SEGS * u64::from(self.mss)) as u32
    }

    /// `bbr_save_cwnd`: remember the window a recovery or ProbeRTT interrupts.
    fn save_cwnd(&mut self) {
        if self.prev_phase < CcPhase::Recovery && self.mode != Mode::ProbeRtt {
            self.prior_cwnd = self.cwnd;
        } else {
            self.prior_cwnd = self.prior_cwnd.max(self.cwnd);
        }
    }

    fn reset_startup(&mut self) {
        self.mode = Mode::Startup;
    }

    /// `bbr_reset_probe_bw_mode`: a random phase, never the 3/4 one first.
    fn reset_probe_bw(&mut self, now: Instant) {
        self.mode = Mode::ProbeBw;
        // Linux draws it at random; a hash of the clock is as good and keeps a
        // simulation repeatable.
        let r =
            (now.as_nanos() ^ self.round_count.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.cycle_idx = PACING_GAINS.len() - 1 - ((r >> 33) % u64::from(CYCLE_RAND)) as usize;
        self.advance_cycle(now);
    }

    fn reset_mode(&mut self, now: Instant) {
        if self.full_bw_reached {
            self.reset_probe_bw(now);
        } else {
            self.reset_startup();
        }
    }

    fn advance_cycle(&mut self, now: Instant) {
        self.cycle_idx = (self.cycle_idx + 1) % PACING_GAINS.len();
        self.cycle_stamp = now;
    }

    /// `bbr_is_next_cycle_phase`.
    fn is_next_cycle_phase(&self, now: Instant, rs: &RateSample) -> bool {
        let full_length = self
            .min_rtt
            .is_some_and(|m| now.saturating_since(self.cycle_stamp) > m);
        if self.pacing_gain == UNIT {
            return full_length;
        }
        let inflight = u64::from(rs.prior_in_flight);
        let bw = self.bandwidth();
        if self.pacing_gain > UNIT {
            // Probing: on until a min_rtt went by and either there was loss or
            // the pipe holds pacing_gain × BDP.
            return full_length
                && (rs.losses > 0 || inflight >= self.inflight(bw, self.pacing_gain));
        }
        // Draining the probe's queue: on until a min_rtt went by or it is gone.
        full_length || inflight <= self.inflight(bw, UNIT)
    }

    fn update_bw(&mut self, now: Instant, rs: &RateSample) {
        self.round_start = false;
        let Some(bw) = rs.rate() else {
            return;
        };
        if rs.prior_delivered >= self.next_round_delivered {
            self.next_round_delivered = rs.total_delivered;
            self.round_count += 1;
            self.round_start = true;
            self.packet_conservation = false;
        }
        self.lt_sampling(now, rs);
        // An application-limited sample only counts if it beats the estimate.
        if !rs.app_limited || bw >= self.bw.get() {
            self.bw.update(BW_ROUNDS, self.round_count, bw);
        }
    }

    /// `bbr_update_ack_aggregation`.
    fn update_ack_aggregation(&mut self, now: Instant, rs: &RateSample) {
        if rs.acked_sacked == 0 || rs.interval.is_none() {
            return;
        }
        if self.round_start {
            self.extra_acked_win_rounds = (self.extra_acked_win_rounds + 1).min(0x1F);
            if self.extra_acked_win_rounds >= EXTRA_ACKED_WIN_ROUNDS {
                self.extra_acked_win_rounds = 0;
                self.extra_acked_idx ^= 1;
                self.extra_acked[self.extra_acked_idx] = 0;
            }
        }
        let epoch = now.saturating_since(self.ack_epoch_stamp);
        let mut expected = (u128::from(self.bandwidth()) * epoch.as_micros() / 1_000_000) as u64;
        let acked = u64::from(rs.acked_sacked);
        if self.ack_epoch_acked <= expected
            || self.ack_epoch_acked + acked >= ACK_EPOCH_RESET_SEGS * u64::from(self.mss)
        {
            self.ack_epoch_acked = 0;
            self.ack_epoch_stamp = now;
            expected = 0;
        }
        self.ack_epoch_acked =
            (self.ack_epoch_acked + acked).min((ACK_EPOCH_RESET_SEGS - 1) * u64::from(self.mss));
        let extra = (self.ack_epoch_acked - expected).min(u64::from(self.cwnd));
        let slot = &mut self.extra_acked[self.extra_acked_idx];
        *slot = (*slot).max(extra);
    }

    /// `bbr_ack_aggregation_cwnd`.
    fn ack_aggregation_cwnd(&self) -> u64 {
        if !self.full_bw_reached {
            return 0;
        }
        let max_aggr =
            (u128::from(self.bandwidth()) * EXTRA_ACKED_MAX.as_micros() / 1_000_000) as u64;
        self.extra_acked[0].max(self.extra_acked[1]).min(max_aggr)
    }

    fn update_cycle_phase(&mut self, now: Instant, rs: &RateSample) {
        if self.mode == Mode::ProbeBw && self.is_next_cycle_phase(now, rs) {
            self.advance_cycle(now);
        }
    }

    /// `bbr_check_full_bw_reached`.
    fn check_full_bw_reached(&mut self, rs: &RateSample) {
        if self.full_bw_reached || !self.round_start || rs.app_limited {
            return;
        }
        let max = self.bw.get();
        if u128::from(max) * u128::from(UNIT)
            >= u128::from(self.full_bw) * u128::from(FULL_BW_THRESH)
        {
            self.full_bw = max;
            self.full_bw_rounds = 0;
            return;
        }
        self.full_bw_rounds += 1;
        self.full_bw_reached = self.full_bw_rounds >= FULL_BW_ROUNDS;
    }

    /// `bbr_check_drain`.
    fn check_drain(&mut self, now: Instant, rs: &RateSample) {
        if self.mode == Mode::Startup && self.full_bw_reached {
            self.mode = Mode::Drain;
            self.ssthresh = self.inflight(self.bw.get(), UNIT).min(u64::from(u32::MAX)) as u32;
        }
        if self.mode == Mode::Drain && u64::from(rs.in_flight) <= self.inflight(self.bw.get(), UNIT)
        {
            self.reset_probe_bw(now);
        }
    }

    /// `bbr_update_min_rtt` and ProbeRTT. Returns whether the sender is to count
    /// as application-limited (it is in ProbeRTT).
    fn update_min_rtt(&mut self, now: Instant, rs: &RateSample) -> bool {
        let expired = now.saturating_since(self.min_rtt_stamp) > MIN_RTT_WIN;
        if let Some(rtt) = rs.rtt {
            if self.min_rtt.is_none_or(|m| rtt < m) || expired {
                self.min_rtt = Some(rtt);
                self.min_rtt_stamp = now;
            }
        }
        if expired && !self.idle_restart && self.mode != Mode::ProbeRtt {
            self.mode = Mode::ProbeRtt;
            self.save_cwnd();
            self.probe_rtt_done = None;
        }
        let mut app_limited = false;
        if self.mode == Mode::ProbeRtt {
            // Samples from here until it ends must not raise the max filter.
            app_limited = true;
            if self.probe_rtt_done.is_none()
                && u64::from(rs.in_flight) <= u64::from(self.cwnd_min())
            {
                self.probe_rtt_done = Some(now + PROBE_RTT_TIME);
                self.probe_rtt_round_done = false;
                self.next_round_delivered = rs.total_delivered;
            } else if self.probe_rtt_done.is_some() {
                if self.round_start {
                    self.probe_rtt_round_done = true;
                }
                if self.probe_rtt_round_done {
                    self.check_probe_rtt_done(now);
                }
            }
        }
        if rs.delivered > 0 {
            self.idle_restart = false;
        }
        app_limited
    }

    fn check_probe_rtt_done(&mut self, now: Instant) {
        if self.probe_rtt_done.is_some_and(|d| now > d) {
            self.min_rtt_stamp = now;
            self.cwnd = self.cwnd.max(self.prior_cwnd);
            self.reset_mode(now);
        }
    }

    fn update_gains(&mut self) {
        (self.pacing_gain, self.cwnd_gain) = match self.mode {
            Mode::Startup => (HIGH_GAIN, HIGH_GAIN),
            Mode::Drain => (DRAIN_GAIN, HIGH_GAIN),
            Mode::ProbeBw if self.lt_use_bw => (UNIT, CWND_GAIN),
            Mode::ProbeBw => (PACING_GAINS[self.cycle_idx], CWND_GAIN),
            Mode::ProbeRtt => (UNIT, UNIT),
        };
    }

    // ---------------------------------------------------- long-term sampling

    fn lt_reset_interval(&mut self, now: Instant, rs: &RateSample) {
        self.lt_last_stamp = now;
        self.lt_last_delivered = rs.total_delivered;
        self.lt_last_lost = self.lost;
        self.lt_rtt_cnt = 0;
    }

    fn lt_reset(&mut self, now: Instant, rs: &RateSample) {
        self.lt_bw = 0;
        self.lt_use_bw = false;
        self.lt_is_sampling = false;
        self.lt_reset_interval(now, rs);
    }

    /// `bbr_lt_bw_interval_done`: two intervals at about one rate mean a policer.
    fn lt_interval_done(&mut self, now: Instant, rs: &RateSample, bw: u64) {
        if self.lt_bw > 0 {
            let diff = bw.abs_diff(self.lt_bw);
            if diff * UNIT <= LT_BW_RATIO * self.lt_bw || diff <= LT_BW_DIFF_BYTES {
                self.lt_bw = (bw + self.lt_bw) / 2;
                self.lt_use_bw = true;
                self.pacing_gain = UNIT;
                self.lt_rtt_cnt = 0;
                return;
            }
        }
        self.lt_bw = bw;
        self.lt_reset_interval(now, rs);
    }

    /// `bbr_lt_bw_sampling`.
    fn lt_sampling(&mut self, now: Instant, rs: &RateSample) {
        if self.lt_use_bw {
            if self.mode == Mode::ProbeBw && self.round_start {
                self.lt_rtt_cnt += 1;
                if self.lt_rtt_cnt >= LT_BW_MAX_ROUNDS {
                    self.lt_reset(now, rs);
                    self.reset_probe_bw(now);
                }
            }
            return;
        }
        // Wait for the first loss to start an interval: a policer drops.
        if !self.lt_is_sampling {
            if rs.losses == 0 {
                return;
            }
            self.lt_reset_interval(now, rs);
            self.lt_is_sampling = true;
        }
        if rs.app_limited {
            self.lt_reset(now, rs);
            return;
        }
        if self.round_start {
            self.lt_rtt_cnt += 1;
        }
        if self.lt_rtt_cnt < LT_INTVL_MIN_ROUNDS {
            return;
        }
        if self.lt_rtt_cnt > 4 * LT_INTVL_MIN_ROUNDS {
            self.lt_reset(now, rs);
            return;
        }
        // An interval ends at a loss.
        if rs.losses == 0 {
            return;
        }
        let lost = self.lost - self.lt_last_lost;
        let delivered = rs.total_delivered - self.lt_last_delivered;
        if delivered == 0 || lost * UNIT < LT_LOSS_THRESH * delivered {
            return;
        }
        let t = now.saturating_since(self.lt_last_stamp).as_micros() as u64;
        if t < 1 {
            return;
        }
        let bw = (u128::from(delivered) * 1_000_000 / u128::from(t)) as u64;
        self.lt_interval_done(now, rs, bw);
    }

    // ---------------------------------------------------- the window

    /// `bbr_set_cwnd_to_recover_or_restore`: packet conservation in a recovery's
    /// first round, the window restored after it. Returns the window when it
    /// decided it.
    fn recover_or_restore(&mut self, rs: &RateSample) -> Option<u32> {
        let acked = rs.acked_sacked;
        let mut cwnd = self.cwnd;
        if rs.losses > 0 {
            cwnd = cwnd.saturating_sub(rs.losses).max(self.mss);
        }
        if rs.phase == CcPhase::Recovery && self.prev_phase != CcPhase::Recovery {
            self.packet_conservation = true;
            self.next_round_delivered = rs.total_delivered;
            cwnd = rs.in_flight + acked;
        } else if self.prev_phase >= CcPhase::Recovery && rs.phase < CcPhase::Recovery {
            cwnd = cwnd.max(self.prior_cwnd);
            self.packet_conservation = false;
        }
        self.prev_phase = rs.phase;
        if self.packet_conservation {
            return Some(cwnd.max(rs.in_flight + acked));
        }
        self.cwnd = cwnd;
        None
    }

    /// `bbr_set_cwnd`.
    fn set_cwnd_from(&mut self, rs: &RateSample, bw: u64, gain: u64) {
        let acked = rs.acked_sacked;
        if acked > 0 {
            if let Some(c) = self.recover_or_restore(rs) {
                self.cwnd = c;
            } else {
                let target = self
                    .quantization_budget(self.bdp(bw, gain) + self.ack_aggregation_cwnd())
                    .min(u64::from(u32::MAX)) as u32;
                if self.full_bw_reached {
                    self.cwnd = self.cwnd.saturating_add(acked).min(target);
                } else if self.cwnd < target
                    || rs.total_delivered < INIT_CWND_SEGS * u64::from(self.mss)
                {
                    self.cwnd = self.cwnd.saturating_add(acked);
                }
                self.cwnd = self.cwnd.max(self.cwnd_min());
            }
        }
        if self.mode == Mode::ProbeRtt {
            self.cwnd = self.cwnd.min(self.cwnd_min());
        }
    }
}

impl CongestionControl for Bbr {
    fn name(&self) -> &'static str {
        "bbr"
    }
    fn cwnd(&self) -> u32 {
        self.cwnd
    }
    fn ssthresh(&self) -> u32 {
        self.ssthresh
    }
    /// The window is kept in `on_rate_sample`; this only tracks the MSS.
    fn on_ack(&mut self, _now: Instant, a: &AckSample) {
        self.mss = a.mss.max(1);
    }
    /// `bbr_ssthresh`: remember the window; ssthresh stays.
    fn on_loss(&mut self, _now: Instant, _in_flight: u32, mss: u32) {
        self.mss = mss.max(1);
        self.save_cwnd();
    }
    fn on_recovery_end(&mut self, _now: Instant, _in_flight: u32, _mss: u32) {}
    /// Linux's `tcp_enter_loss` sets cwnd to what is in flight plus one (nothing
    /// is: all of it is marked lost) after `bbr_ssthresh` saved it; entering Loss
    /// ends a round and forgets the full-bandwidth count.
    fn on_rto(&mut self, _now: Instant, _in_flight: u32, mss: u32) {
        self.mss = mss.max(1);
        self.save_cwnd();
        self.cwnd = self.mss;
        self.prev_phase = CcPhase::Loss;
        self.full_bw = 0;
        self.round_start = true;
    }
    /// Linux's `tcp_cwnd_restart` applies to every controller.
    fn on_idle_restart(&mut self, restart_window: u32) {
        self.cwnd = self.cwnd.min(restart_window);
    }
    /// `bbr_cwnd_event(CA_EVENT_TX_START)`: after idle, pace at the estimated
    /// rate (not above it) until the pipe is full again.
    fn on_send_after_idle(&mut self, now: Instant, _idle: Duration) {
        self.idle_restart = true;
        self.ack_epoch_stamp = now;
        self.ack_epoch_acked = 0;
        match self.mode {
            Mode::ProbeBw => self.set_pacing_rate(self.bandwidth(), UNIT, None),
            Mode::ProbeRtt => self.check_probe_rtt_done(now),
            _ => {}
        }
    }
    fn set_cwnd(&mut self, cwnd: u32) {
        self.cwnd = cwnd;
    }
    /// `bbr_main`.
    fn on_rate_sample(&mut self, now: Instant, rs: &RateSample) -> bool {
        if !self.started {
            self.start(now);
        }
        self.mss = rs.mss.max(1);
        self.lost += u64::from(rs.losses);
        self.update_bw(now, rs);
        self.update_ack_aggregation(now, rs);
        self.update_cycle_phase(now, rs);
        self.check_full_bw_reached(rs);
        self.check_drain(now, rs);
        let app_limited = self.update_min_rtt(now, rs);
        self.update_gains();
        let bw = self.bandwidth();
        self.set_pacing_rate(bw, self.pacing_gain, rs.rtt);
        self.set_cwnd_from(rs, bw, self.cwnd_gain);
        app_limited
    }
    fn pacing_rate(&self) -> Option<u64> {
        (self.pacing_rate > 0).then_some(self.pacing_rate)
    }
    fn wants_rate_samples(&self) -> bool {
        true
    }
    fn owns_cwnd(&self) -> bool {
        true
    }
}
