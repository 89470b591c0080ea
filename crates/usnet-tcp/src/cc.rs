//! Congestion control behind one trait: NewReno (RFC 5681 + 6582) and CUBIC (RFC 9438).
//!
//! The connection owns loss detection and recovery (SACK scoreboard, RACK-TLP); the
//! controller only decides the window: it is told about acknowledged bytes outside
//! recovery, about the start and end of a fast recovery, and about retransmission
//! timeouts. During fast recovery the connection sends while `pipe < cwnd`, and the
//! controller has set `cwnd = ssthresh` on entry.

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
}

impl CcAlgorithm {
    /// A fresh controller of this kind.
    pub fn build(self, mss: u32, initial_window_segments: u32) -> Box<dyn CongestionControl> {
        match self {
            CcAlgorithm::NewReno => Box::new(NewReno::new(mss, initial_window_segments)),
            CcAlgorithm::Cubic => Box::new(Cubic::new(mss, initial_window_segments)),
        }
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

/// CUBIC (RFC 9438), with fast convergence and the Reno-friendly region.
#[derive(Debug, Clone)]
pub struct Cubic {
    cwnd: u32,
    ssthresh: u32,
    /// Window before the last reduction, in segments.
    w_max: f64,
    /// Previous w_max (fast convergence).
    w_last_max: f64,
    /// Start of the current congestion-avoidance epoch.
    epoch: Option<Instant>,
    k: f64,
    /// Reno-friendly estimate, in segments.
    w_est: f64,
    mss: u32,
    /// Fractional growth carried between ACKs, in bytes.
    carry: f64,
    hystart: HyStart,
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

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;
/// Least growth per acknowledged segment before any reduction (Linux: 5% per RTT).
const CUBIC_FIRST_GROWTH: f64 = 0.05;

impl Cubic {
    /// Initial window `iw` segments.
    pub fn new(mss: u32, iw: u32) -> Self {
        Cubic {
            cwnd: mss * iw.max(1),
            ssthresh: u32::MAX,
            w_max: 0.0,
            w_last_max: 0.0,
            epoch: None,
            k: 0.0,
            w_est: 0.0,
            mss,
            carry: 0.0,
            hystart: HyStart::default(),
        }
    }

    fn reduce(&mut self, mss: u32) {
        self.mss = mss;
        let cwnd_seg = f64::from(self.cwnd) / f64::from(mss);
        // Fast convergence (RFC 9438 §4.7).
        self.w_max = if cwnd_seg < self.w_last_max {
            cwnd_seg * (1.0 + CUBIC_BETA) / 2.0
        } else {
            cwnd_seg
        };
        self.w_last_max = cwnd_seg;
        let target = (f64::from(self.cwnd) * CUBIC_BETA) as u32;
        self.ssthresh = target.max(2 * mss);
        self.epoch = None;
        self.carry = 0.0;
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
        let fresh_epoch = self
            .epoch
            .is_some_and(|e| now.saturating_since(e) < Duration::from_secs(1));
        let in_ss = self.cwnd < self.ssthresh;
        if !fresh_epoch && self.hystart.update(now, a, self.cwnd / a.mss.max(1), in_ss) {
            self.ssthresh = self.cwnd;
        }
        if !a.cwnd_limited {
            // RFC 9438 §5.8: do not grow while application-limited; restart the epoch
            // so that the idle time does not count as growth time.
            self.epoch = None;
            return;
        }
        self.mss = a.mss;
        let mut acked = a.acked;
        if self.cwnd < self.ssthresh {
            acked = slow_start(&mut self.cwnd, self.ssthresh, acked, a.mss);
            if acked == 0 {
                return;
            }
        }
        let mss = f64::from(a.mss);
        let cwnd_seg = f64::from(self.cwnd) / mss;
        let epoch = match self.epoch {
            Some(e) => e,
            None => {
                self.epoch = Some(now);
                if self.w_max < cwnd_seg {
                    self.w_max = cwnd_seg;
                    self.k = 0.0;
                } else {
                    self.k = ((self.w_max - cwnd_seg) / CUBIC_C).cbrt();
                }
                self.w_est = cwnd_seg;
                now
            }
        };
        // The cubic function looks one RTT ahead: the minimum RTT, as Linux (the
        // smoothed RTT grows with the queue this window builds).
        let rtt = self
            .hystart
            .delay_min
            .or(a.srtt)
            .unwrap_or(Duration::from_millis(100))
            .as_secs_f64();
        let t = (now - epoch).as_secs_f64();
        let w_cubic = |t: f64| CUBIC_C * (t - self.k).powi(3) + self.w_max;
        // Reno-friendly estimate (RFC 9438 §4.3).
        let alpha = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);
        self.w_est += alpha * (f64::from(acked) / mss) / cwnd_seg;
        let target = if w_cubic(t) < self.w_est {
            self.w_est
        } else {
            w_cubic(t + rtt).clamp(cwnd_seg, 1.5 * cwnd_seg)
        };
        // Grow by (target - cwnd)/cwnd segments per acknowledged segment; before the
        // first reduction (no w_max learnt: slow start ended by HyStart) by at least
        // 5% per RTT, as Linux.
        let mut rate = (target - cwnd_seg).max(0.0) / cwnd_seg;
        if self.w_last_max == 0.0 {
            rate = rate.max(CUBIC_FIRST_GROWTH);
        }
        if rate > 0.0 {
            self.carry += rate * f64::from(acked);
            if self.carry >= 1.0 {
                let inc = self.carry.floor();
                self.carry -= inc;
                self.cwnd = self
                    .cwnd
                    .saturating_add(inc.min(f64::from(u32::MAX)) as u32);
            }
        }
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
        // Slow start again: HyStart starts over (as Linux on entering Loss).
        self.hystart = HyStart::default();
    }
    fn on_idle_restart(&mut self, rw: u32) {
        self.cwnd = self.cwnd.min(rw);
        self.epoch = None;
    }
    fn on_send_after_idle(&mut self, now: Instant, idle: Duration) {
        // RFC 9438 §5.8: the time the sender was idle is no growth time; the epoch
        // moves on by it (as Linux's CUBIC does), never past now.
        if let Some(e) = self.epoch {
            let shifted = e + idle;
            self.epoch = Some(if shifted > now { now } else { shifted });
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
        c.on_loss(t, 0, 1000);
        assert!(c.w_max < f64::from(c.cwnd()) / 1000.0 / CUBIC_BETA + 1.0);
    }
}
