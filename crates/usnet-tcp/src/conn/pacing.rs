//! Pacing: segments leave at the connection's pacing rate instead of in bursts as
//! ACKs open the window, as Linux's TCP paces itself (`tcp_wstamp_ns`, its
//! earliest departure time, and the `pacing_timer`). A burst of up to the TSO
//! size (`tso_segs`, about a millisecond at the rate) goes at once, as Linux sends
//! one TSO frame; the next waits until the bytes sent have had their time at the
//! rate. A sender that was late gets up to half of a burst's time back
//! (Linux's `tcp_update_skb_after_send` credit). The first ten data segments are
//! not paced (the initial window, as Linux).
//!
//! Who is paced: a controller that sets its own rate (BBR), a socket with
//! `SO_MAX_PACING_RATE`, or every connection when [`TcpConfig::pacing`] is on
//! (Linux's `fq` qdisc). The default rate is Linux's `tcp_update_pacing_rate`:
//! cwnd per SRTT times 200 % in slow start and 120 % after.
//!
//! [`TcpConfig::pacing`]: crate::TcpConfig::pacing

use std::time::Duration;

use super::timers::Timer;
use super::Connection;
use crate::time::Instant;

/// Data segments sent before pacing starts (Linux: `data_segs_out >= 10`).
const UNPACED_SEGMENTS: u64 = 10;

/// The paced sender's clock.
#[derive(Debug, Clone)]
pub(crate) struct Pacing {
    /// Earliest departure time of the next burst.
    next: Instant,
    /// Segments left in the burst under way.
    burst: u32,
    /// Lateness the burst under way may take back.
    credit: Duration,
    /// `SO_MAX_PACING_RATE`, bytes per second (`u64::MAX`: none).
    pub max_rate: u64,
    /// Data segments sent so far.
    data_segments: u64,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            next: Instant::ZERO,
            burst: 0,
            credit: Duration::ZERO,
            max_rate: u64::MAX,
            data_segments: 0,
        }
    }
}

impl Connection {
    /// Whether this connection is paced.
    pub(crate) fn pacing_on(&self) -> bool {
        self.cfg.pacing || self.pace.max_rate != u64::MAX || self.cc.pacing_rate().is_some()
    }

    /// Linux's `tcp_update_pacing_rate`: cwnd (or what is out, if more) per SRTT,
    /// 200 % of it in slow start and 120 % after; unbounded before an RTT sample.
    fn default_pacing_rate(&self) -> u64 {
        let mss = u64::from(self.smss());
        let cwnd = self.cc.cwnd();
        let ratio = if cwnd < self.cc.ssthresh() / 2 {
            self.cfg.pacing_ss_ratio
        } else {
            self.cfg.pacing_ca_ratio
        };
        let segs = u64::from((cwnd / self.smss().max(1)).max(self.scoreboard.segs_out()));
        let srtt_us = self.rtt.srtt.map_or(0, |d| d.as_micros() as u64);
        (mss * u64::from(ratio) * segs * 10_000)
            .checked_div(srtt_us)
            .unwrap_or(u64::MAX >> 11)
    }

    /// The pacing rate in bytes per second (Linux's `sk_pacing_rate`): the
    /// controller's, else the default, never above `SO_MAX_PACING_RATE`.
    pub fn pacing_rate(&self) -> u64 {
        self.cc
            .pacing_rate()
            .unwrap_or_else(|| self.default_pacing_rate())
            .min(self.pace.max_rate)
    }

    /// `SO_MAX_PACING_RATE` in bytes per second; None lifts it. Setting one paces
    /// the connection (as Linux's internal pacing).
    pub fn set_max_pacing_rate(&mut self, rate: Option<u64>) {
        self.pace.max_rate = rate.unwrap_or(u64::MAX);
    }

    /// The next data segment must wait for its departure time: the pace timer is
    /// armed for it (only if data waits: a lost segment, a probe, or unsent bytes).
    pub(crate) fn paced_out(&mut self) -> bool {
        if self.pace.burst > 0 || !self.pacing_on() || self.pace.next <= self.now {
            return false;
        }
        let unsent = self.snd.buf.len() > self.snd.nxt.since(self.snd.una) as usize;
        if unsent || self.scoreboard.lost_segs() > 0 || self.recovery.tlp_pending {
            self.timers.set(Timer::Pace, self.pace.next);
        }
        true
    }

    /// Segments left in the pacing burst under way (with pacing on, a run of
    /// segments ends with it: what comes next waits for `paced_out` to decide).
    pub(crate) fn pacing_burst_left(&self) -> usize {
        self.pace.burst as usize
    }

    /// A data segment of `bytes` payload went out: the departure time moves on by
    /// its time at the pacing rate.
    pub(crate) fn pacing_sent(&mut self, bytes: u32) {
        self.pace.data_segments += 1;
        if !self.pacing_on() {
            return;
        }
        if self.pace.burst == 0 {
            self.pace.burst = self.tso_segs(self.smss());
            self.pace.credit = self.now.saturating_since(self.pace.next);
            self.pace.next = self.pace.next.max(self.now);
        }
        self.pace.burst -= 1;
        let rate = self.pacing_rate();
        if self.pace.data_segments < UNPACED_SEGMENTS || rate == 0 || rate >= u64::MAX >> 11 {
            return;
        }
        let ns = u64::from(bytes).saturating_mul(1_000_000_000) / rate;
        let back = (ns / 2).min(self.pace.credit.as_nanos() as u64);
        self.pace.credit -= Duration::from_nanos(back);
        self.pace.next = self.pace.next + Duration::from_nanos(ns - back);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::time::Instant;
    use crate::TcpConfig;

    /// Departure times of 60 kB written at once with windows that do not stop it
    /// (the peer's is 64 kB), `max_rate` bytes per second.
    fn departures(max_rate: Option<u64>) -> Vec<(Instant, usize)> {
        let cfg = TcpConfig {
            initial_window: 200,
            nodelay: true,
            ..TcpConfig::default()
        };
        let (mut c, _s) = pair_with_rtt(cfg.clone(), cfg, ms(10));
        c.set_max_pacing_rate(max_rate);
        assert_eq!(c.send(&[7u8; 60_000]), 60_000);
        let mut now = T0 + ms(10);
        let mut out = Vec::new();
        let mut sent = 0;
        while sent < 60_000 {
            for seg in drain(&mut c, now) {
                sent += seg.payload.len();
                out.push((now, seg.payload.len()));
            }
            now = c
                .poll_at()
                .unwrap_or_else(|| panic!("no timer, {sent} sent, {:?}", c.info()));
        }
        out
    }

    #[test]
    fn a_max_pacing_rate_spreads_the_data_at_that_rate() {
        let paced = departures(Some(1_000_000));
        let start = paced[0].0;
        // The initial window's ten segments go at once ...
        assert!(paced[..10].iter().all(|&(t, _)| t == start));
        // ... the rest no faster than the rate: every segment's departure is no
        // earlier than the bytes before it (beyond those ten) take at 1 MB/s.
        let mut bytes_before = 0u64;
        for (i, &(t, len)) in paced.iter().enumerate() {
            if i >= 10 {
                let due = start + std::time::Duration::from_nanos((bytes_before) * 1000);
                // One burst (two segments at this rate) may go together.
                let slack = std::time::Duration::from_nanos(2 * MSS as u64 * 1000);
                assert!(t + slack >= due, "segment {i} at {t:?}, due {due:?}");
            }
            if i >= 9 {
                bytes_before += len as u64;
            }
        }
        let last = paced.last().unwrap().0;
        let took = last.saturating_since(start);
        // 60 kB less the initial window's 14.5 kB at 1 MB/s: about 45 ms.
        assert!(took >= ms(42) && took <= ms(47), "{took:?}");
    }

    #[test]
    fn an_unpaced_sender_sends_the_window_at_once() {
        let unpaced = departures(None);
        let start = unpaced[0].0;
        assert!(unpaced.iter().all(|&(t, _)| t == start));
    }

    #[test]
    fn the_default_rate_is_linuxs_cwnd_per_srtt_with_its_ratios() {
        let (c, _s) = pair_with_rtt(TcpConfig::default(), TcpConfig::default(), ms(10));
        // Slow start: 200 % of 10 × 1448 bytes per 10 ms.
        assert_eq!(c.pacing_rate(), 2 * 10 * MSS as u64 * 100);
        let mut c = c;
        c.set_max_pacing_rate(Some(500_000));
        assert_eq!(c.pacing_rate(), 500_000);
    }
}
