//! Round-trip time estimation and the retransmission timeout (RFC 6298), with the
//! exponential back-off that the RTO timer and the SYN retransmissions share.

use std::time::Duration;

use super::Connection;
use crate::config::TcpConfig;

/// SRTT, RTTVAR and RTO (RFC 6298), the minimum RTT RACK relies on, and the
/// back-off exponent.
#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    pub srtt: Option<Duration>,
    pub rttvar: Duration,
    /// RTO without back-off.
    pub rto: Duration,
    /// Smallest fine-grained sample (RACK tells a retransmission's own ACK by it).
    pub min_rtt: Option<Duration>,
    /// Consecutive timeouts: each doubles the RTO; a new ACK resets it.
    pub backoff: u32,
    /// The last ACK's sample, if it gave one (for congestion control).
    pub latest: Option<Duration>,
}

impl RttEstimator {
    pub(crate) fn new(initial_rto: Duration) -> Self {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: initial_rto,
            min_rtt: None,
            backoff: 0,
            latest: None,
        }
    }

    /// A sample timed on our own clock (a segment sent once: Karn's rule).
    pub(crate) fn sample(&mut self, r: Duration, cfg: &TcpConfig) {
        self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
        self.smooth(r, cfg);
    }

    /// A sample from the timestamp echo. Its millisecond granularity reads 0 on a fast
    /// path, so it feeds SRTT and the RTO but never `min_rtt`: RACK compares an ACK's
    /// timing with `min_rtt` to tell a retransmission's own ACK from the original's,
    /// and a 0 would turn that check off.
    pub(crate) fn sample_coarse(&mut self, r: Duration, cfg: &TcpConfig) {
        self.smooth(r, cfg);
    }

    /// RFC 6298 §2.2-2.4.
    fn smooth(&mut self, r: Duration, cfg: &TcpConfig) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let delta = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
        let s = self.srtt.unwrap_or(r);
        // RFC 6298 (2.3), RTO = SRTT + max(G, 4·RTTVAR), with `min_rto` in G's place
        // (as Linux): a steady RTT shrinks RTTVAR towards 0, but a peer may still
        // delay its ACK by up to 200 ms on top of it (RACK-TLP's WCDelAckT), so the
        // RTO keeps that margin above SRTT instead of flooring the sum.
        let var = (self.rttvar * 4).max(cfg.min_rto);
        self.rto = (s + var).min(cfg.max_rto);
    }

    /// The RTO with back-off (RFC 6298 §5.5), capped at `max_rto`.
    pub(crate) fn backed_off(&self, max_rto: Duration) -> Duration {
        let shift = self.backoff.min(16);
        (self.rto * (1u32 << shift)).min(max_rto)
    }
}

impl Connection {
    /// The RTO with back-off, as the RTO timer is armed; with a user timeout, no
    /// later than when it runs out (as Linux clamps it), so the abort is on time.
    pub(crate) fn rto_backed_off(&self) -> Duration {
        let rto = self.rtt.backed_off(self.cfg.max_rto);
        match self.user_timeout_left() {
            Some(left) => rto.min(left.max(Duration::from_millis(1))),
            None => rto,
        }
    }

    /// With a user timeout and data in flight: how long the data may still go
    /// unacknowledged.
    pub(crate) fn user_timeout_left(&self) -> Option<Duration> {
        let ut = self.cfg.user_timeout?;
        if !self.state.is_synchronized() || self.scoreboard.is_empty() {
            return None;
        }
        Some(ut.saturating_sub(self.now.saturating_since(self.snd.progress)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn first_sample_then_smoothing_follow_rfc6298() {
        let cfg = TcpConfig::default();
        let mut r = RttEstimator::new(Duration::from_secs(1));
        r.sample(ms(100), &cfg);
        assert_eq!(r.srtt, Some(ms(100)));
        assert_eq!(r.rttvar, ms(50));
        assert_eq!(r.rto, ms(300), "SRTT + 4 RTTVAR");
        r.sample(ms(200), &cfg);
        // RTTVAR = 3/4 * 50 + 1/4 * |100 - 200|; SRTT = 7/8 * 100 + 1/8 * 200.
        assert_eq!(r.rttvar, Duration::from_micros(62_500));
        assert_eq!(r.srtt, Some(Duration::from_micros(112_500)));
        assert_eq!(r.rto, Duration::from_micros(362_500));
        assert_eq!(r.min_rtt, Some(ms(100)));
    }

    #[test]
    fn rto_is_clamped_to_its_bounds() {
        let cfg = TcpConfig::default();
        let mut r = RttEstimator::new(Duration::from_secs(1));
        r.sample(Duration::from_micros(50), &cfg);
        assert_eq!(r.rto, Duration::from_micros(50) + cfg.min_rto);
        // A steady RTT: RTTVAR decays, the RTO keeps min_rto above SRTT.
        for _ in 0..50 {
            r.sample(ms(100), &cfg);
        }
        assert!(r.rttvar < ms(10));
        let srtt = r.srtt.unwrap();
        assert_eq!(r.rto, srtt + cfg.min_rto);
        let mut r = RttEstimator::new(Duration::from_secs(1));
        r.sample(Duration::from_secs(100), &cfg);
        assert_eq!(r.rto, cfg.max_rto);
    }

    #[test]
    fn backoff_doubles_up_to_max_rto() {
        let mut r = RttEstimator::new(ms(300));
        let max = Duration::from_secs(120);
        assert_eq!(r.backed_off(max), ms(300));
        r.backoff = 3;
        assert_eq!(r.backed_off(max), ms(2400));
        r.backoff = 9;
        assert_eq!(r.backed_off(max), max);
        // The shift is capped, so a huge count cannot overflow.
        r.backoff = u32::MAX;
        assert_eq!(r.backed_off(max), max);
    }

    #[test]
    fn timestamp_samples_never_lower_min_rtt() {
        let cfg = TcpConfig::default();
        let mut r = RttEstimator::new(Duration::from_secs(1));
        r.sample(Duration::from_micros(50), &cfg);
        // A 0 ms echo on a 50 µs path: smoothed in, but min_rtt keeps the real floor.
        r.sample_coarse(Duration::ZERO, &cfg);
        assert_eq!(r.min_rtt, Some(Duration::from_micros(50)));
        assert!(r.srtt.unwrap() < Duration::from_micros(50));
        // Without a fine sample, a coarse one sets no floor at all.
        let mut r = RttEstimator::new(Duration::from_secs(1));
        r.sample_coarse(Duration::ZERO, &cfg);
        assert_eq!(r.min_rtt, None);
    }
}
