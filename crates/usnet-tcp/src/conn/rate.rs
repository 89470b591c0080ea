//! Delivery-rate estimation (draft-cheng-iccrg-delivery-rate-estimation), as
//! Linux's `tcp_rate.c`: every segment is stamped when it goes out with how much
//! the connection had delivered by then and when; an ACK that delivers it turns
//! the difference into a rate sample, over the longer of the send and the ACK
//! intervals (so neither a burst sent nor a burst of ACKs overstates the rate).
//! Samples taken while the application left the pipe unfilled are marked
//! application-limited. Every ACK's sample goes to the congestion controller
//! (`CongestionControl::on_rate_sample`); the latest valid one is also kept for
//! `TcpInfo::delivery_rate`.

use std::time::Duration;

use super::recovery::Phase;
use super::scoreboard::TxSeg;
use super::Connection;
use crate::cc::{CcPhase, RateSample};
use crate::time::Instant;

/// What a segment carries from its (latest) transmission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TxRate {
    /// The connection's delivered bytes then.
    pub delivered: u64,
    /// When the connection last had data delivered, then.
    pub delivered_time: Instant,
    /// When the send interval this segment closes began.
    pub first_tx: Instant,
    /// The sender was application-limited.
    pub app_limited: bool,
}

/// The connection's side of rate estimation.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateState {
    /// Bytes delivered (acknowledged or SACKed) over the connection's life.
    pub delivered: u64,
    /// When data was last delivered.
    delivered_time: Instant,
    /// Send time of the segment that began the current send interval.
    first_tx: Instant,
    /// Nonzero: samples are application-limited until `delivered` passes this.
    app_limited: u64,
    /// This ACK's sample so far: the stamp of the most recently sent segment it
    /// delivered, that segment's send interval, and its transmission order
    /// (`TxSeg::order`: one poll stamps all it sends with one time, so the time
    /// cannot tell a retransmission from the new data sent before it).
    prior: Option<TxRate>,
    send_interval: Duration,
    last_order: Option<u64>,
    /// The latest valid sample kept for `tcp_info` (`tcpi_delivery_rate`): bytes
    /// and microseconds (the rate is divided out when asked for: a 128-bit
    /// division on every ACK cost the request/response path 4 %), and whether it
    /// was application-limited.
    last_sample: Option<(u64, u64)>,
    pub last_app_limited: bool,
}

impl Connection {
    /// The stamp a segment going out now carries (`tcp_rate_skb_sent`); with
    /// nothing in flight the intervals start over here.
    pub(crate) fn rate_stamp(&mut self) -> TxRate {
        if self.scoreboard.is_empty() {
            self.rate.first_tx = self.now;
            self.rate.delivered_time = self.now;
        }
        TxRate {
            delivered: self.rate.delivered,
            delivered_time: self.rate.delivered_time,
            first_tx: self.rate.first_tx,
            app_limited: self.rate.app_limited != 0,
        }
    }

    /// Segment `s` was newly delivered by the ACK being processed
    /// (`tcp_rate_skb_delivered`): the most recently sent one gives the sample.
    pub(crate) fn rate_seg_delivered(&mut self, s: &TxSeg) {
        if self.rate.last_order.is_some_and(|o| s.order <= o) {
            return;
        }
        self.rate.prior = Some(s.rate);
        self.rate.last_order = Some(s.order);
        self.rate.send_interval = s.sent.saturating_since(s.rate.first_tx);
        self.rate.first_tx = s.sent;
    }

    /// After an ACK that newly delivered `acked_sacked` bytes and newly marked
    /// `losses` bytes lost (`tcp_rate_gen`): the sample, to the controller.
    pub(crate) fn rate_on_ack(&mut self, acked_sacked: u32, losses: u32, prior_in_flight: u32) {
        let r = &mut self.rate;
        r.delivered += u64::from(acked_sacked);
        if r.app_limited != 0 && r.delivered > r.app_limited {
            r.app_limited = 0;
        }
        if acked_sacked > 0 {
            r.delivered_time = self.now;
        }
        let prior = r.prior.take();
        r.last_order = None;
        let mut interval = None;
        let mut delivered = 0;
        if let Some(p) = prior {
            delivered = r.delivered - p.delivered;
            let ack_interval = self.now.saturating_since(p.delivered_time);
            let i = r.send_interval.max(ack_interval);
            // Shorter than the minimum RTT: ACK compression or a bad stamp.
            if self.rtt.min_rtt.is_none_or(|m| i >= m) && !i.is_zero() {
                interval = Some(i);
            }
        }
        let app_limited = prior.is_some_and(|p| p.app_limited);
        if let Some(i) = interval {
            // Linux keeps the sample unless it is application-limited and slower
            // (compared by cross-multiplying: no division here).
            let us = (i.as_micros() as u64).max(1);
            let faster = |(d, t): (u64, u64)| {
                u128::from(delivered) * u128::from(t) >= u128::from(d) * u128::from(us)
            };
            if !app_limited || r.last_sample.is_none_or(faster) {
                r.last_sample = Some((delivered, us));
                r.last_app_limited = app_limited;
            }
        }
        if !self.cc.wants_rate_samples() {
            return;
        }
        let phase = match self.recovery.phase {
            Phase::None => CcPhase::Open,
            Phase::Fast => CcPhase::Recovery,
            Phase::Rto | Phase::Pmtu => CcPhase::Loss,
        };
        let rs = RateSample {
            delivered,
            interval,
            app_limited,
            prior_delivered: prior.map_or(0, |p| p.delivered),
            total_delivered: self.rate.delivered,
            acked_sacked,
            losses,
            prior_in_flight,
            in_flight: self.pipe_est(),
            rtt: self.rtt.latest,
            mss: self.smss(),
            phase,
        };
        if self.cc.on_rate_sample(self.now, &rs) {
            self.rate_mark_app_limited();
        }
    }

    /// The latest delivery rate kept for `tcp_info`, bytes per second (0: none yet).
    pub(crate) fn delivery_rate(&self) -> u64 {
        self.rate.last_sample.map_or(0, |(d, us)| {
            (u128::from(d) * 1_000_000 / u128::from(us)) as u64
        })
    }

    /// The pipe is not full for want of data (`tcp_rate_check_app_limited`): less
    /// than a segment waits, cwnd has room, and no lost segment waits to be resent.
    pub(crate) fn rate_check_app_limited(&mut self) {
        // (SND.NXT counts a FIN the buffer does not hold.)
        let unsent =
            (self.snd.buf.len() as u64).saturating_sub(u64::from(self.snd.nxt.since(self.snd.una)));
        if unsent < u64::from(self.smss())
            && self.pipe_est() < self.cc.cwnd()
            && self.scoreboard.lost_segs() == 0
        {
            self.rate_mark_app_limited();
        }
    }

    /// Samples are application-limited until what is in flight now is delivered.
    fn rate_mark_app_limited(&mut self) {
        self.rate.app_limited = (self.rate.delivered + u64::from(self.pipe_est())).max(1);
    }
}
