//! Congestion control behind one trait: NewReno (RFC 5681 + 6582) and CUBIC (RFC 9438).
//!
//! The connection owns loss detection and recovery (SACK scoreboard, RACK-TLP); the
//! controller only decides the window: it is told about acknowledged bytes outside
//! recovery, about the start and end of a fast recovery, and about retransmission
//! timeouts. During fast recovery the connection sends while `pipe < cwnd`, and the
//! controller has set `cwnd = ssthresh` on entry.

use std::fmt;
use std::time::Duration;

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
}

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

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
        let rtt = a.srtt.unwrap_or(Duration::from_millis(100)).as_secs_f64();
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
        if target > cwnd_seg {
            // Grow by (target - cwnd)/cwnd segments per acknowledged segment.
            self.carry += (target - cwnd_seg) / cwnd_seg * f64::from(acked);
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
    }
    fn on_idle_restart(&mut self, rw: u32) {
        self.cwnd = self.cwnd.min(rw);
        self.epoch = None;
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
