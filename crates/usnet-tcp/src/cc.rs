//! Congestion control behind one trait: NewReno (RFC 5681 + 6582), CUBIC (RFC 9438)
//! and BBR v1 ([`bbr`], as Linux's `tcp_bbr.c`).
//!
//! The connection owns loss detection and recovery (SACK scoreboard, RACK-TLP); the
//! controller only decides the window: it is told about acknowledged bytes outside
//! recovery, about the start and end of a fast recovery, and about retransmission
//! timeouts. During fast recovery the connection sends while `pipe < cwnd`, and the
//! controller has set `cwnd = ssthresh` on entry.
//!
//! A model-based controller (BBR) instead hears of every ACK through
//! [`CongestionControl::on_rate_sample`] with a delivery-rate sample (the
//! connection's `conn/rate.rs`), sets the pacing rate, and keeps the window itself
//! in recovery too ([`CongestionControl::owns_cwnd`]: no proportional rate
//! reduction), as Linux's `cong_control` hook does.

pub mod bbr;

use std::fmt;
use std::time::Duration;

use crate::seq::Seq;
use crate::time::Instant;

/// Which built-in controller to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CcAlgorithm {
    /// RFC 5681 slow start / congestion avoidance with RFC 6582 recovery.
    NewReno,
    /// RFC 9438 CUBIC (the default, as in Linux).
    #[default]
    Cubic,
    /// BBR v1 as Linux's `tcp_bbr.c` (model-based, paced).
    Bbr,
}

impl CcAlgorithm {
    /// A fresh controller of this kind.
    pub fn build(self, mss: u32, initial_window_segments: u32) -> Box<dyn CongestionControl> {
        match self {
            CcAlgorithm::NewReno => Box::new(NewReno::new(mss, initial_window_segments)),
            CcAlgorithm::Cubic => Box::new(Cubic::new(mss, initial_window_segments)),
            CcAlgorithm::Bbr => Box::new(bbr::Bbr::new(mss, initial_window_segments)),
        }
    }

    /// Linux's name for it (`TCP_CONGESTION`, `tcp_congestion_control`).
    pub fn name(self) -> &'static str {
        match self {
            CcAlgorithm::NewReno => "reno",
            CcAlgorithm::Cubic => "cubic",
            CcAlgorithm::Bbr => "bbr",
        }
    }

    /// The controller Linux calls `name` ("reno" and "newreno" are the same one).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "reno" | "newreno" => Some(CcAlgorithm::NewReno),
            "cubic" => Some(CcAlgorithm::Cubic),
            "bbr" => Some(CcAlgorithm::Bbr),
            _ => None,
        }
    }
}

/// Where loss recovery stands, as a controller that keeps its own window needs to
/// know it (Linux's `TCP_CA_Open`/`Recovery`/`Loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CcPhase {
    /// No recovery (Linux's Open, Disorder and CWR).
    Open,
    /// Fast recovery.
    Recovery,
    /// Recovery after a retransmission timeout.
    Loss,
}

/// A delivery-rate sample (draft-cheng-iccrg-delivery-rate-estimation, Linux's
/// `struct rate_sample`), taken on every ACK that delivered data.
#[derive(Debug, Clone, Copy)]
pub struct RateSample {
    /// Bytes delivered between the send of the most recently sent segment this
    /// ACK delivered and now.
    pub delivered: u64,
    /// The interval over which `delivered` was delivered: the longer of the send
    /// and the ACK intervals. None: no valid sample (nothing delivered, or shorter
    /// than the minimum RTT).
    pub interval: Option<Duration>,
    /// The sample was taken while the application did not fill the pipe: its rate
    /// is a lower bound.
    pub app_limited: bool,
    /// The connection's delivered bytes when that segment was sent (a round ends
    /// when a segment sent after the round began is delivered).
    pub prior_delivered: u64,
    /// The connection's delivered bytes after this ACK.
    pub total_delivered: u64,
    /// Bytes this ACK newly delivered (acknowledged or SACKed).
    pub acked_sacked: u32,
    /// Bytes this ACK newly marked lost.
    pub losses: u32,
    /// Bytes in flight before this ACK.
    pub prior_in_flight: u32,
    /// Bytes in flight after it.
    pub in_flight: u32,
    /// This ACK's RTT sample, if it gave one.
    pub rtt: Option<Duration>,
    /// Sender maximum segment size.
    pub mss: u32,
    /// Recovery phase after this ACK.
    pub phase: CcPhase,
}

impl RateSample {
    /// The sample's delivery rate in bytes per second, if it is valid.
    pub fn rate(&self) -> Option<u64> {
        let us = self.interval?.as_micros() as u64;
        (us > 0).then(|| (u128::from(self.delivered) * 1_000_000 / u128::from(us)) as u64)
    }
}

/// What an acknowledgment tells the controller.
#[derive(Debug, Clone, Copy)]
pub struct AckSample {
    /// Bytes newly acknowledged (cumulatively or selectively).
    pub acked: u32,
    /// Current sender maximum segment size.
    pub mss: u32,
    /// Smoothed RTT, if measured.
    pub srtt: Option<Duration>,
    /// Bytes in flight before this ACK.
    pub in_flight: u32,
    /// Whether the sender was limited by cwnd (not by the application or the
    /// receiver window) when it last sent; windows only grow when this is true.
    pub cwnd_limited: bool,
    /// This ACK's RTT sample (of the most recently sent segment it acknowledges),
    /// if it gave one.
    pub rtt: Option<Duration>,
    /// SND.UNA after this ACK (a controller's rounds of data end here).
    pub una: Seq,
    /// SND.NXT when this ACK arrived.
    pub nxt: Seq,
}

/// A congestion controller. Windows are in bytes.
pub trait CongestionControl: fmt::Debug + Send {
    /// Short name ("newreno", "cubic").
    fn name(&self) -> &'static str;
    /// Congestion window.
    fn cwnd(&self) -> u32;
    /// Slow-start threshold.
    fn ssthresh(&self) -> u32;
    /// New data acknowledged outside fast recovery.
    fn on_ack(&mut self, now: Instant, ack: &AckSample);
    /// Loss detected (fast retransmit / RACK): fast recovery begins.
    fn on_loss(&mut self, now: Instant, in_flight: u32, mss: u32);
    /// Fast recovery ended (everything outstanding at its start is acknowledged).
    fn on_recovery_end(&mut self, now: Instant, in_flight: u32, mss: u32);
    /// The retransmission timer expired (first expiry of a back-off series).
    fn on_rto(&mut self, now: Instant, in_flight: u32, mss: u32);
    /// Restart after idle (RFC 5681 §4.1): cwnd drops to at most the restart window.
    fn on_idle_restart(&mut self, restart_window: u32);
    /// New data goes out with nothing in flight, `idle` after the last segment sent
    /// (Linux's `CA_EVENT_TX_START`).
    fn on_send_after_idle(&mut self, _now: Instant, _idle: Duration) {}
    /// Sets cwnd: proportional rate reduction (RFC 6937) steers it during a
    /// reduction, from the ssthresh `on_loss` chose.
    fn set_cwnd(&mut self, cwnd: u32);
    /// Whether it is to hear [`CongestionControl::on_rate_sample`] (the sample is
    /// not built for one that does not).
    fn wants_rate_samples(&self) -> bool {
        false
    }
    /// Every ACK, in recovery too, after the callbacks above, for a controller
    /// that [wants them](CongestionControl::wants_rate_samples). Returns true when
    /// the controller wants the sender counted as application-limited from here
    /// (BBR's ProbeRTT: its samples must not raise the bandwidth estimate).
    fn on_rate_sample(&mut self, _now: Instant, _rs: &RateSample) -> bool {
        false
    }
    /// The pacing rate it asks for, bytes per second; None: pace (when pacing is
    /// on) at the connection's default, Linux's `tcp_update_pacing_rate`.
    fn pacing_rate(&self) -> Option<u64> {
        None
    }
    /// It keeps cwnd itself in recovery (no proportional rate reduction): Linux's
    /// `cong_control` controllers.
    fn owns_cwnd(&self) -> bool {
        false
    }
}

fn loss_ssthresh(in_flight: u32, mss: u32) -> u32 {
    (in_flight / 2).max(2 * mss)
}

/// Slow start with appropriate byte counting (RFC 3465, L = 2 SMSS), except that a
/// stretch ACK (from a receiver that coalesces segments, GRO/LRO, and ACKs each
/// coalesced frame once) may add up to cwnd: one ACK per burst must still double the
/// window per RTT, as Linux's packet counting does.
fn slow_start(cwnd: &mut u32, ssthresh: u32, acked: u32, mss: u32) -> u32 {
    let inc = acked.min((2 * mss).max(*cwnd));
    let room = ssthresh.saturating_sub(*cwnd);
    let used = inc.min(room.max(1));
    *cwnd = cwnd.saturating_add(used);
    acked.saturating_sub(used)
}

/// NewReno.
#[derive(Debug, Clone)]
pub struct NewReno {
    cwnd: u32,
    ssthresh: u32,
    bytes_acked: u32,
}

impl NewReno {
    /// Initial window `iw` segments (RFC 6928 allows 10).
    pub fn new(mss: u32, iw: u32) -> Self {
        NewReno {
            cwnd: mss * iw.max(1),
            ssthresh: u32::MAX,
            bytes_acked: 0,
        }
    }
}

impl CongestionControl for NewReno {
    fn name(&self) -> &'static str {
        "newreno"
    }
    fn cwnd(&self) -> u32 {
        self.cwnd
    }
    fn ssthresh(&self) -> u32 {
        self.ssthresh
    }
    fn on_ack(&mut self, _now: Instant, a: &AckSample) {
        if !a.cwnd_limited {
            return;
        }
        let mut acked = a.acked;
        if self.cwnd < self.ssthresh {
            acked = slow_start(&mut self.cwnd, self.ssthresh, acked, a.mss);
            if acked == 0 {
                return;
            }
        }
        // Congestion avoidance: one MSS per cwnd of acknowledged bytes.
        self.bytes_acked = self.bytes_acked.saturating_add(acked);
        if self.bytes_acked >= self.cwnd {
            self.bytes_acked -= self.cwnd;
            self.cwnd = self.cwnd.saturating_add(a.mss);
        }
    }
    fn on_loss(&mut self, _now: Instant, in_flight: u32, mss: u32) {
        self.ssthresh = loss_ssthresh(in_flight, mss);
        self.cwnd = self.ssthresh;
        self.bytes_acked = 0;
    }
    fn on_recovery_end(&mut self, _now: Instant, in_flight: u32, mss: u32) {
        // RFC 6582 §3.2 step 3, option 1, with the burst guard.
        self.cwnd = self.ssthresh.min(in_flight.max(mss) + mss).max(2 * mss);
    }
    fn on_rto(&mut self, _now: Instant, in_flight: u32, mss: u32) {
        self.ssthresh = loss_ssthresh(in_flight, mss);
        self.cwnd = mss;
        self.bytes_acked = 0;
    }
    fn on_idle_restart(&mut self, rw: u32) {
        self.cwnd = self.cwnd.min(rw);
    }
    fn set_cwnd(&mut self, cwnd: u32) {
        self.cwnd = cwnd;
    }
}

/// CUBIC (RFC 9438) as Linux's `tcp_cubic.c` computes it, so that its windows
/// are Linux's to the segment: the window in whole segments with a count of
/// acknowledged segments toward the next one (`snd_cwnd_cnt`,
/// `tcp_cong_avoid_ai`); the cubic function in fixed point on a millisecond clock
/// (`bictcp_update`: at most one recalculation per millisecond, the curve looked
/// at one minimum RTT ahead), fast convergence, the Reno-friendly estimate
/// (`tcp_friendliness`), at most one segment per two acknowledged; 5 % per RTT
/// while no maximum is known (before the first reduction, and after a timeout,
/// which forgets it, as Linux's `bictcp_reset` on entering Loss).
#[derive(Debug, Clone)]
pub struct Cubic {
    /// Bytes (whole segments of `mss` in congestion avoidance).
    cwnd: u32,
    ssthresh: u32,
    mss: u32,
    hystart: HyStart,
    /// Acknowledged segments per one-segment increase (`ca->cnt`).
    cnt: u32,
    /// Window before the last reduction, segments (`last_max_cwnd`; 0: none).
    last_max: u32,
    /// Window and time (ms) of the last recalculation.
    last_cwnd: u32,
    last_time: u64,
    /// The curve's plateau (segments) and the time to it (1/1024 s).
    origin: u32,
    k: u32,
    /// Start of the current congestion-avoidance epoch (ms).
    epoch: Option<u64>,
    /// Segments acknowledged toward the Reno-friendly estimate, and the estimate.
    ack_cnt: u32,
    tcp_cwnd: u32,
    /// Segments acknowledged toward the next increase (`snd_cwnd_cnt`).
    cwnd_cnt: u32,
}

/// HyStart (Ha & Rhee, "Taming the elephants", 2011), as Linux's CUBIC runs it
/// (`hystart_detect` both ways): slow start ends, with ssthresh = cwnd, once cwnd is
/// at least [`HYSTART_LOW_WINDOW`] segments and, within one round of data, either
/// the ACKs of a train of closely spaced ACKs (each within
/// [`HYSTART_ACK_DELTA`] of the last) span more than half the minimum RTT, or the
/// smallest of the round's RTT samples after its first
/// [`HYSTART_MIN_SAMPLES`] exceeds the minimum RTT by an eighth of it (clamped to
/// 4..16 ms).
#[derive(Debug, Clone, Default)]
struct HyStart {
    /// Slow start was ended (until the next retransmission timeout).
    found: bool,
    /// Smallest RTT sample.
    delay_min: Option<Duration>,
    /// The current round: its start, its last ACK of a train, where it ends
    /// (SND.NXT when it began), its smallest RTT sample and how many it counted.
    round_start: Option<Instant>,
    last_ack: Option<Instant>,
    end_seq: Option<Seq>,
    curr_rtt: Option<Duration>,
    samples: u32,
}

/// Below this cwnd (segments) HyStart does not look.
const HYSTART_LOW_WINDOW: u32 = 16;
/// RTT samples a round takes before its delay check.
const HYSTART_MIN_SAMPLES: u32 = 8;
/// Most time between two ACKs of one train.
const HYSTART_ACK_DELTA: Duration = Duration::from_millis(2);
/// What the train may add to half the minimum RTT for sending time (Linux's
/// `hystart_ack_delay`, at most 1 ms).
const HYSTART_ACK_DELAY: Duration = Duration::from_millis(1);

impl HyStart {
    /// One ACK with cwnd `cwnd_seg` segments, `slow_start` or not; true: slow start
    /// ends.
    fn update(&mut self, now: Instant, a: &AckSample, cwnd_seg: u32, slow_start: bool) -> bool {
        let Some(rtt) = a.rtt else {
            return false;
        };
        let delay = rtt.max(Duration::from_micros(1));
        let min = self.delay_min.map_or(delay, |m| m.min(delay));
        self.delay_min = Some(min);
        if self.found || !slow_start || cwnd_seg < HYSTART_LOW_WINDOW {
            return false;
        }
        if self.end_seq.is_none_or(|e| a.una.gt(e)) {
            self.round_start = Some(now);
            self.last_ack = Some(now);
            self.end_seq = Some(a.nxt);
            self.curr_rtt = None;
            self.samples = 0;
        }
        // The ACK train.
        if let (Some(start), Some(last)) = (self.round_start, self.last_ack) {
            if now.saturating_since(last) <= HYSTART_ACK_DELTA {
                self.last_ack = Some(now);
                if now.saturating_since(start) > (min + HYSTART_ACK_DELAY) / 2 {
                    self.found = true;
                }
            }
        }
        // The delay increase.
        let curr = self.curr_rtt.map_or(delay, |c| c.min(delay));
        self.curr_rtt = Some(curr);
        if self.samples < HYSTART_MIN_SAMPLES {
            self.samples += 1;
        } else {
            let thresh = (min / 8).clamp(Duration::from_millis(4), Duration::from_millis(16));
            if curr > min + thresh {
                self.found = true;
            }
        }
        self.found
    }
}

/// Linux's `beta` (717/1024) and `BICTCP_BETA_SCALE`.
const CUBIC_BETA: u32 = 717;
const CUBIC_BETA_SCALE: u32 = 1024;
/// `cube_rtt_scale` (`bic_scale` 41 * 10) and `BICTCP_HZ`.
const CUBE_RTT_SCALE: u64 = 410;
const BICTCP_HZ: u32 = 10;
/// `beta_scale`: 8 * (1024 + 717) / 3 / (1024 - 717).
const BETA_SCALE: u32 = 8 * (CUBIC_BETA_SCALE + CUBIC_BETA) / 3 / (CUBIC_BETA_SCALE - CUBIC_BETA);
/// Jiffies per second of the clock the function runs on (HZ=1000: milliseconds).
const HZ: u64 = 1000;

/// `cube_factor`: 2^(10 + 3 * BICTCP_HZ) / `cube_rtt_scale`.
fn cube_factor() -> u64 {
    (1u64 << (10 + 3 * BICTCP_HZ)) / CUBE_RTT_SCALE
}

/// The integer cube root (Linux approximates it within a fraction of a percent).
fn cubic_root(a: u64) -> u32 {
    let mut x = (a as f64).cbrt() as u64;
    while (x + 1).pow(3) <= a {
        x += 1;
    }
    while x > 0 && x.pow(3) > a {
        x -= 1;
    }
    x as u32
}

impl Cubic {
    /// Initial window `iw` segments.
    pub fn new(mss: u32, iw: u32) -> Self {
        Cubic {
            cwnd: mss * iw.max(1),
            ssthresh: u32::MAX,
            mss,
            hystart: HyStart::default(),
            cnt: 0,
            last_max: 0,
            last_cwnd: 0,
            last_time: 0,
            origin: 0,
            k: 0,
            epoch: None,
            ack_cnt: 0,
            tcp_cwnd: 0,
            cwnd_cnt: 0,
        }
    }

    /// `cubictcp_recalc_ssthresh`: the epoch ends, Wmax with fast convergence, the
    /// new ssthresh (bytes).
    fn reduce(&mut self, mss: u32) {
        self.mss = mss;
        let cwnd = (self.cwnd / mss.max(1)).max(1);
        self.epoch = None;
        let scaled = |f: u32, d: u32| (u64::from(cwnd) * u64::from(f) / u64::from(d)) as u32;
        self.last_max = if cwnd < self.last_max {
            scaled(CUBIC_BETA_SCALE + CUBIC_BETA, 2 * CUBIC_BETA_SCALE)
        } else {
            cwnd
        };
        self.ssthresh = scaled(CUBIC_BETA, CUBIC_BETA_SCALE)
            .max(2)
            .saturating_mul(mss);
        self.cwnd_cnt = 0;
    }

    /// `bictcp_update`: `cnt` for a window of `cwnd` segments at `now` (ms), with
    /// `acked` segments newly acknowledged.
    fn update(&mut self, now: u64, cwnd: u32, acked: u32) {
        self.ack_cnt = self.ack_cnt.saturating_add(acked);
        if self.last_cwnd == cwnd && now.saturating_sub(self.last_time) <= HZ / 32 {
            return;
        }
        // The function is recalculated at most once per tick.
        if !(self.epoch.is_some() && now == self.last_time) {
            self.last_cwnd = cwnd;
            self.last_time = now;
            let epoch = *self.epoch.get_or_insert_with(|| {
                self.ack_cnt = acked;
                self.tcp_cwnd = cwnd;
                if self.last_max <= cwnd {
                    self.k = 0;
                    self.origin = cwnd;
                } else {
                    self.k =
                        cubic_root(cube_factor().saturating_mul(u64::from(self.last_max - cwnd)));
                    self.origin = self.last_max;
                }
                now
            });
            // Time since the epoch plus the minimum RTT, in 1/1024 s.
            let delay_min = self.hystart.delay_min.map_or(0, |d| d.as_micros() as u64);
            let t = now.saturating_sub(epoch) + delay_min.div_ceil(1_000_000 / HZ);
            let t = t.min(u64::MAX >> (BICTCP_HZ + 1)) << BICTCP_HZ;
            let t = t / HZ;
            let k = u64::from(self.k);
            let offs = u128::from(t.abs_diff(k));
            // (Linux's u64 holds this for any sane epoch; a wider one saturates.)
            let delta = ((u128::from(CUBE_RTT_SCALE) * offs * offs * offs) >> (10 + 3 * BICTCP_HZ))
                .min(u128::from(u32::MAX)) as u32;
            let target = if t < k {
                self.origin.saturating_sub(delta)
            } else {
                self.origin.saturating_add(delta)
            };
            self.cnt = if target > cwnd {
                cwnd / (target - cwnd)
            } else {
                cwnd.saturating_mul(100)
            };
            // Before any maximum is known: at least 5 % per RTT.
            if self.last_max == 0 && self.cnt > 20 {
                self.cnt = 20;
            }
        }
        // The Reno-friendly estimate.
        let delta = (cwnd.saturating_mul(BETA_SCALE) >> 3).max(1);
        // Linux subtracts `delta` while more than `delta` remain, one segment each.
        let n = self.ack_cnt.saturating_sub(1) / delta;
        self.ack_cnt -= n * delta;
        self.tcp_cwnd = self.tcp_cwnd.saturating_add(n);
        if self.tcp_cwnd > cwnd {
            let max_cnt = cwnd / (self.tcp_cwnd - cwnd);
            self.cnt = self.cnt.min(max_cnt);
        }
        // At most one segment per two acknowledged: 1.5 times per RTT.
        self.cnt = self.cnt.max(2);
    }
}

impl CongestionControl for Cubic {
    fn name(&self) -> &'static str {
        "cubic"
    }
    fn cwnd(&self) -> u32 {
        self.cwnd
    }
    fn ssthresh(&self) -> u32 {
        self.ssthresh
    }
    fn on_ack(&mut self, now: Instant, a: &AckSample) {
        // HyStart looks at every ACK in slow start, limited or not, before the
        // window grows for it. Linux skips delay samples for a second after a
        // congestion-avoidance epoch began.
        let now_ms = now.as_millis();
        let fresh_epoch = self.epoch.is_some_and(|e| now_ms.saturating_sub(e) < HZ);
        let in_ss = self.cwnd < self.ssthresh;
        if !fresh_epoch && self.hystart.update(now, a, self.cwnd / a.mss.max(1), in_ss) {
            self.ssthresh = self.cwnd;
        }
        if !a.cwnd_limited {
            // RFC 9438 §5.8: no growth while application-limited (the idle time is
            // taken out of the epoch when sending resumes: `on_send_after_idle`).
            return;
        }
        self.mss = a.mss;
        let mss = a.mss.max(1);
        let mut acked = a.acked;
        if self.cwnd < self.ssthresh {
            acked = slow_start(&mut self.cwnd, self.ssthresh, acked, a.mss);
            if acked == 0 {
                return;
            }
        }
        // Linux counts segments.
        let acked = acked.div_ceil(mss).max(1);
        let mut cwnd = (self.cwnd / mss).max(1);
        self.update(now_ms, cwnd, acked);
        // tcp_cong_avoid_ai.
        let w = self.cnt.max(1);
        if self.cwnd_cnt >= w {
            self.cwnd_cnt = 0;
            cwnd = cwnd.saturating_add(1);
        }
        self.cwnd_cnt = self.cwnd_cnt.saturating_add(acked);
        if self.cwnd_cnt >= w {
            let d = self.cwnd_cnt / w;
            self.cwnd_cnt -= d * w;
            cwnd = cwnd.saturating_add(d);
        }
        self.cwnd = cwnd.saturating_mul(mss);
    }
    fn on_loss(&mut self, _now: Instant, _in_flight: u32, mss: u32) {
        self.reduce(mss);
        self.cwnd = self.ssthresh;
    }
    fn on_recovery_end(&mut self, _now: Instant, _in_flight: u32, mss: u32) {
        self.cwnd = self.ssthresh.max(2 * mss);
    }
    fn on_rto(&mut self, _now: Instant, _in_flight: u32, mss: u32) {
        self.reduce(mss);
        self.cwnd = mss;
        // Entering Loss forgets the curve (`bictcp_reset`) and HyStart starts over.
        self.last_max = 0;
        self.cnt = 0;
        self.last_cwnd = 0;
        self.last_time = 0;
        self.origin = 0;
        self.k = 0;
        self.ack_cnt = 0;
        self.tcp_cwnd = 0;
        self.hystart = HyStart::default();
    }
    fn on_idle_restart(&mut self, rw: u32) {
        self.cwnd = self.cwnd.min(rw);
    }
    fn on_send_after_idle(&mut self, now: Instant, idle: Duration) {
        // RFC 9438 §5.8: the time the sender was idle is no growth time; the epoch
        // moves on by it (as Linux's CUBIC does), never past now.
        let now = now.as_millis();
        if let Some(e) = self.epoch {
            self.epoch = Some((e + idle.as_millis() as u64).min(now));
        }
    }
    fn set_cwnd(&mut self, cwnd: u32) {
        self.cwnd = cwnd;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(acked: u32) -> AckSample {
        AckSample {
            acked,
            mss: 1000,
            srtt: Some(Duration::from_millis(10)),
            in_flight: 0,
            cwnd_limited: true,
            rtt: None,
            una: Seq(0),
            nxt: Seq(0),
        }
    }

    #[test]
    fn newreno_slow_start_then_avoidance() {
        let mut c = NewReno::new(1000, 10);
        let t = Instant::ZERO;
        c.on_ack(t, &ack(1000));
        assert_eq!(c.cwnd(), 11_000);
        c.on_loss(t, 20_000, 1000);
        assert_eq!((c.cwnd(), c.ssthresh()), (10_000, 10_000));
        for _ in 0..10 {
            c.on_ack(t, &ack(1000));
        }
        assert_eq!(c.cwnd(), 11_000);
        c.on_rto(t, 8000, 1000);
        assert_eq!((c.cwnd(), c.ssthresh()), (1000, 4000));
        let mut lim = ack(1000);
        lim.cwnd_limited = false;
        c.on_ack(t, &lim);
        assert_eq!(c.cwnd(), 1000);
    }

    #[test]
    fn slow_start_credits_stretch_acks_up_to_doubling() {
        let t = Instant::ZERO;
        for mut c in [
            Box::new(NewReno::new(1000, 10)) as Box<dyn CongestionControl>,
            Box::new(Cubic::new(1000, 10)),
        ] {
            // One ACK for a whole coalesced window doubles it, as ten ACKs would.
            c.on_ack(t, &ack(10_000));
            assert_eq!(c.cwnd(), 20_000, "{}", c.name());
            // At most a doubling per ACK (the rest goes to congestion avoidance).
            c.on_ack(t, &ack(100_000));
            assert!(
                (40_000..50_000).contains(&c.cwnd()),
                "{} {}",
                c.name(),
                c.cwnd()
            );
        }
        // A small window still grows by at most 2 SMSS per ACK (RFC 3465).
        let mut c = NewReno::new(1000, 1);
        c.on_ack(t, &ack(2500));
        assert_eq!(c.cwnd(), 3000);
    }

    /// An ACK of `acked` bytes with an RTT sample, SND.UNA and SND.NXT.
    fn timed(acked: u32, rtt_ms: u64, una: u32, nxt: u32) -> AckSample {
        AckSample {
            rtt: Some(Duration::from_millis(rtt_ms)),
            una: Seq(una),
            nxt: Seq(nxt),
            ..ack(acked)
        }
    }

    #[test]
    fn hystart_ends_slow_start_when_a_rounds_rtt_rises_an_eighth_above_the_minimum() {
        let mut c = Cubic::new(1000, 20);
        let mut t = Instant::ZERO;
        // The minimum RTT, 200 ms (its round ends at 1500); then a round whose
        // samples are all 240 ms, one ACK per ms (no train long enough).
        c.on_ack(t, &timed(1000, 200, 1000, 1500));
        t = t + Duration::from_millis(240);
        for i in 0..8 {
            t = t + Duration::from_millis(1);
            c.on_ack(t, &timed(1000, 240, 2000 + i * 1000, 40_000));
            assert_eq!(c.ssthresh(), u32::MAX, "eight samples before the check");
        }
        let before = c.cwnd();
        t = t + Duration::from_millis(1);
        c.on_ack(t, &timed(1000, 240, 10_000, 40_000));
        assert_eq!(
            c.ssthresh(),
            before,
            "ssthresh = cwnd; the window stops doubling"
        );
        assert!(c.cwnd() < before + 1000, "congestion avoidance from there");
    }

    #[test]
    fn hystart_keeps_slow_start_when_the_rtt_stays_near_the_minimum() {
        let mut c = Cubic::new(1000, 20);
        let mut t = Instant::ZERO;
        c.on_ack(t, &timed(1000, 200, 1000, 20_000));
        for i in 0..20 {
            t = t + Duration::from_millis(5);
            // Within 200 + 16 ms: no delay exit; 5 ms apart: no ACK train.
            c.on_ack(t, &timed(1000, 210, 2000 + i * 1000, 40_000));
        }
        assert_eq!(c.ssthresh(), u32::MAX);
        assert_eq!(c.cwnd(), 41_000);
    }

    #[test]
    fn hystart_ack_train_spanning_half_the_minimum_rtt_ends_slow_start() {
        let mut c = Cubic::new(1000, 20);
        let mut t = Instant::ZERO;
        c.on_ack(t, &timed(1000, 20, 1000, 20_000));
        // Closely spaced ACKs (1 ms) for more than (20 + 1) / 2 ms of one round.
        for i in 0..12 {
            t = t + Duration::from_millis(1);
            c.on_ack(t, &timed(1000, 20, 2000 + i * 1000, 40_000));
        }
        assert_ne!(c.ssthresh(), u32::MAX);
        // Congestion avoidance from there: less than a segment more.
        assert!((c.ssthresh()..c.ssthresh() + 1000).contains(&c.cwnd()));
    }

    #[test]
    fn cubic_does_not_count_idle_time_as_growth_time() {
        let grown = |shift: bool| {
            let mut c = Cubic::new(1000, 100);
            let mut t = Instant::ZERO;
            c.on_loss(t, 100_000, 1000);
            // The epoch starts with the first ACK after the loss.
            c.on_ack(t, &ack(1000));
            let before = c.cwnd();
            // Ten seconds with nothing to send, then data again.
            t = t + Duration::from_secs(10);
            if shift {
                c.on_send_after_idle(t, Duration::from_secs(10));
            }
            c.on_ack(t, &ack(10_000));
            c.cwnd() - before
        };
        assert!(grown(false) >= 4_000, "ten idle seconds as growth time");
        assert!(grown(true) < 1_000, "the epoch moved on by the idle time");
    }

    #[test]
    fn cubic_reduces_by_beta_and_regrows_to_wmax() {
        let mut c = Cubic::new(1000, 100);
        let mut t = Instant::ZERO;
        c.on_loss(t, 100_000, 1000);
        assert_eq!(c.cwnd(), 70_000);
        // About K = cbrt(30 / 0.4) = 4.2 s to regain w_max; ACK a window every 10 ms.
        for _ in 0..500 {
            t = t + Duration::from_millis(10);
            let w = c.cwnd();
            c.on_ack(t, &ack(w / 10));
        }
        assert!(c.cwnd() >= 95_000, "cwnd {}", c.cwnd());
        assert!(c.cwnd() <= 140_000, "cwnd {}", c.cwnd());
        // Fast convergence: a loss below the last w_max lowers w_max further.
        let before = c.cwnd() / 1000;
        c.on_loss(t, 0, 1000);
        if before < 100 {
            assert!(c.last_max < before, "{} >= {before}", c.last_max);
        }
    }

    #[test]
    fn cubic_grows_in_whole_segments_as_linux() {
        // A timeout forgets w_max: 5 % per RTT (one segment per 20 acknowledged).
        let mut c = Cubic::new(1000, 10);
        let mut t = Instant::ZERO;
        c.on_rto(t, 10_000, 1000);
        assert_eq!((c.cwnd(), c.ssthresh()), (1000, 7000));
        // Slow start to ssthresh, then congestion avoidance.
        while c.cwnd() < c.ssthresh() {
            t = t + Duration::from_millis(1);
            c.on_ack(t, &ack(1000));
        }
        assert_eq!(c.cwnd(), 7000);
        let mut acks = 0;
        while c.cwnd() == 7000 {
            t = t + Duration::from_millis(2);
            c.on_ack(t, &ack(1000));
            acks += 1;
        }
        assert_eq!(c.cwnd(), 8000, "one whole segment at a time");
        // One per 20 by the 5 % rule, until the Reno-friendly estimate (a segment
        // per 7 * 15 / 8 = 13 acknowledged) passes cwnd after 14 and caps the count
        // at cwnd / 1 = 7: 14 + 3 ACKs, as Linux's arithmetic gives.
        assert_eq!(acks, 17);
    }

    #[test]
    fn the_integer_cube_root() {
        for a in [0u64, 1, 7, 8, 26, 27, 1 << 40, 123_456_789_012] {
            let r = u64::from(cubic_root(a));
            assert!(r.pow(3) <= a && (r + 1).pow(3) > a, "cbrt({a}) = {r}");
        }
    }
}
