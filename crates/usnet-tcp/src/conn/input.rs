//! Segment arrival (RFC 9293 §3.10.7), with RFC 5961 checks, PAWS, SACK scoreboard
//! updates, RACK loss detection and the receive path.

use std::time::Duration;

use super::timers::Timer;
use super::{Connection, Segment, State, TcpError, Wake};
use crate::seq::Seq;
use crate::time::Instant;

/// TS.Recent is only trusted for 24 days of idleness (RFC 7323 §5.5).
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

impl Connection {
    /// Process one received segment (already checksummed and demultiplexed to this
    /// connection). Nothing in it is trusted. Replies are queued: call
    /// `poll_transmit` afterwards.
    pub fn input(&mut self, now: Instant, seg: &Segment) -> Wake {
        self.now = self.now.max(now);
        self.stats.rx_segments += u64::from(seg.wire_segments());
        let readable = self.recv_available();
        let eof = self.rcv.fin_received;
        let free = self.snd.buf.free();
        let state = self.state;
        match self.state {
            State::Closed => self.stats.rx_closed_drop += 1,
            State::SynSent => self.input_syn_sent(seg),
            _ => self.input_synchronized(seg),
        }
        self.wake_since(readable, eof, free, state)
    }

    pub(crate) fn wake_since(&self, readable: usize, eof: bool, free: usize, state: State) -> Wake {
        let gone = |s: State| matches!(s, State::Closed | State::TimeWait);
        Wake {
            readable: self.recv_available() > readable || self.rcv.fin_received != eof,
            writable: self.snd.buf.free() > free
                || (state != self.state && self.state == State::Established),
            closed: !gone(state) && gone(self.state),
        }
    }

    fn negotiate(&mut self, seg: &Segment) {
        let o = &seg.options;
        self.set_peer_mss(o.mss);
        match (self.cfg.window_scaling, o.window_scale) {
            (true, Some(ws)) => {
                self.ws_ok = true;
                self.snd.wscale = ws.min(14);
                self.rcv.wscale = self.cfg.rcv_wscale();
            }
            _ => {
                self.ws_ok = false;
                self.snd.wscale = 0;
                self.rcv.wscale = 0;
            }
        }
        self.sack_ok = self.cfg.sack && o.sack_permitted;
        match (self.cfg.timestamps, o.timestamps) {
            (true, Some((val, _))) => {
                self.ts_ok = true;
                self.ts_recent = val;
                self.ts_recent_at = self.now;
            }
            _ => self.ts_ok = false,
        }
    }

    fn input_syn_sent(&mut self, seg: &Segment) {
        let f = seg.flags;
        let ack = Seq(seg.ack);
        if f.ack() && (ack.le(self.snd.iss) || ack.gt(self.snd.nxt)) {
            if !f.rst() {
                self.stats.rx_bad_syn_ack += 1;
                self.reply_rst = Some((ack, None));
            }
            return;
        }
        if f.rst() {
            // RFC 5961 §3.2: acceptable only if it acknowledges our SYN.
            if f.ack() {
                self.stats.conn_refused += 1;
                self.enter_closed(Some(TcpError::Refused));
            } else {
                self.stats.rx_rst_out_of_window += 1;
            }
            return;
        }
        if !f.syn() {
            return;
        }
        self.rcv.irs = Seq(seg.seq);
        self.rcv.nxt = self.rcv.irs + 1u32;
        self.rcv.adv = self.rcv.nxt;
        self.ack.last_sent = self.rcv.nxt;
        self.negotiate(seg);
        self.snd.wnd = u32::from(seg.window);
        self.snd.max_wnd = self.snd.wnd;
        self.snd.wl1 = Seq(seg.seq);
        self.snd.wl2 = ack;
        if f.ack() {
            self.snd.una = ack;
            if self.syn_xmits == 1 {
                let r = self.now.saturating_since(self.syn_sent_at);
                self.rtt.sample(r, &self.cfg);
            }
            self.establish();
            self.ack.pending = true;
        } else {
            // Simultaneous open: SYN-ACK with our original ISS.
            self.state = State::SynReceived;
            self.syn_pending = true;
        }
    }

    pub(crate) fn establish(&mut self) {
        self.state = if self.snd.fin_queued {
            State::FinWait1
        } else {
            State::Established
        };
        self.stats.conn_established += 1;
        self.cc = self
            .cfg
            .congestion
            .build(self.smss(), self.cfg.initial_window);
        self.recovery.rack.end_seq = self.snd.una;
        self.recovery.rack.fack = self.snd.una;
        self.recovery.point = self.snd.una;
        self.timers.clear(Timer::Rto);
        self.rtt.backoff = 0;
        self.syn_pending = false;
        self.ack.quickack = self.cfg.quickack_segments;
        if self.rcv.adv.lt(self.rcv.nxt) {
            self.rcv.adv = self.rcv.nxt;
        }
        self.arm_keepalive();
        self.snd.last_tx = self.now;
    }

    fn input_synchronized(&mut self, seg: &Segment) {
        let f = seg.flags;
        let seq = Seq(seg.seq);
        let len = seg.seg_len();
        self.keepalive_heard_peer();

        if self.state == State::SynReceived && f.syn() && seq == self.rcv.irs {
            if f.ack() && Seq(seg.ack) == self.snd.nxt && !f.rst() {
                // Simultaneous open: the peer's SYN-ACK acknowledges our SYN (its SYN
                // is the one we already have). Take it as the handshake's ACK.
                self.snd.una = self.snd.nxt;
                self.set_send_window(seq, self.snd.nxt, seg.window);
                self.establish();
            } else if !f.ack() {
                // The peer retransmitted its SYN: our SYN-ACK was lost.
                self.syn_pending = true;
            }
            return;
        }

        // PAWS (RFC 7323 §5.3).
        if self.ts_ok {
            match seg.options.timestamps {
                Some((tsval, _)) if !f.rst() => {
                    if (tsval.wrapping_sub(self.ts_recent) as i32) < 0 {
                        if self.now.saturating_since(self.ts_recent_at) > PAWS_IDLE {
                            self.stats.rx_ts_recent_expired += 1;
                            self.ts_recent = tsval;
                            self.ts_recent_at = self.now;
                        } else {
                            self.stats.rx_paws_rejected += 1;
                            self.ack.pending = true;
                            return;
                        }
                    }
                }
                Some(_) => {}
                None => self.stats.rx_missing_ts += 1,
            }
        }

        // Sequence acceptability (RFC 9293 §3.10.7.4, first check).
        let wnd = self.rcv.adv.since(self.rcv.nxt);
        let wend = self.rcv.nxt + wnd;
        let acceptable = match (len, wnd) {
            (0, 0) => seq == self.rcv.nxt,
            (0, _) => seq.in_range(self.rcv.nxt, wend),
            (_, 0) => false,
            (_, _) => {
                seq.in_range(self.rcv.nxt, wend)
                    || (seq + (len - 1)).in_range(self.rcv.nxt, wend)
                    || (seq.lt(self.rcv.nxt) && (seq + len).gt(wend))
            }
        };
        // A segment that starts before RCV.NXT and covers it is acceptable too (its
        // old part is trimmed below); the test above catches it via its last byte, or,
        // for a coalesced frame longer than the window, because it spans the window.
        if !acceptable {
            if f.rst() {
                self.stats.rx_rst_out_of_window += 1;
                return;
            }
            if f.syn() {
                self.stats.rx_syn_challenged += 1;
                self.challenge_ack();
                return;
            }
            let zero_window_edge = wnd == 0 && seq == self.rcv.nxt && f.ack();
            if !zero_window_edge {
                self.stats.rx_out_of_window += u64::from(seg.wire_segments());
                let plen = seg.payload.len() as u32;
                if plen > 0 && (seq + plen).le(self.rcv.nxt) {
                    self.stats.rx_dup_bytes += u64::from(plen);
                    if self.sack_ok {
                        self.rcv.dsack = Some((seq, seq + plen));
                    }
                }
                if self.state == State::TimeWait && f.fin() {
                    self.timers.set(Timer::Close, self.now + self.cfg.time_wait);
                    self.stats.time_wait_restarted += 1;
                }
                self.ack.pending = true;
                return;
            }
            // Zero window: take the ACK and window information, not the data.
            if !seg.payload.is_empty() {
                self.stats.rx_beyond_window_bytes += seg.payload.len() as u64;
            }
            self.ack.pending = true;
            self.process_ack(seg);
            return;
        }

        // RST (RFC 5961 §3.2).
        if f.rst() {
            if seq != self.rcv.nxt {
                self.stats.rx_rst_challenged += 1;
                self.challenge_ack();
                return;
            }
            match self.state {
                State::TimeWait => self.stats.rx_rst_time_wait += 1,
                State::SynReceived => {
                    self.stats.conn_resets += 1;
                    self.enter_closed(Some(TcpError::Refused));
                }
                State::Established | State::FinWait1 | State::FinWait2 | State::CloseWait => {
                    self.stats.conn_resets += 1;
                    self.enter_closed(Some(TcpError::Reset));
                }
                _ => {
                    self.stats.rx_rst += 1;
                    self.enter_closed(None);
                }
            }
            if self.state == State::Closed {
                self.stats.rx_rst += 1;
            }
            return;
        }

        // SYN in a synchronized state (RFC 5961 §4): challenge ACK.
        if f.syn() {
            self.stats.rx_syn_challenged += 1;
            self.challenge_ack();
            return;
        }

        if !f.ack() {
            self.stats.rx_no_ack += 1;
            return;
        }

        // TS.Recent update (RFC 7323 §4.3).
        if self.ts_ok {
            if let Some((tsval, _)) = seg.options.timestamps {
                if (tsval.wrapping_sub(self.ts_recent) as i32) >= 0 && seq.le(self.ack.last_sent) {
                    self.ts_recent = tsval;
                    self.ts_recent_at = self.now;
                }
            }
        }

        if self.state == State::SynReceived {
            let ack = Seq(seg.ack);
            if ack.gt(self.snd.una) && ack.le(self.snd.nxt) {
                self.snd.una = ack;
                if self.syn_xmits == 1 {
                    let r = self.now.saturating_since(self.syn_sent_at);
                    self.rtt.sample(r, &self.cfg);
                }
                self.set_send_window(seq, ack, seg.window);
                self.establish();
            } else {
                self.reply_rst = Some((ack, None));
                return;
            }
        }

        if !self.process_ack(seg) {
            return;
        }
        if self.state == State::Closed
            || (self.state == State::TimeWait && seg.payload.is_empty() && !f.fin())
        {
            return;
        }

        // Urgent pointer (RFC 9293 §3.10.7.4 sixth check, RFC 6093).
        if f.urg() {
            self.stats.rx_urgent += 1;
            self.note_urgent(seq, seg.urgent);
        }

        // Segment text and FIN.
        match self.state {
            State::Established | State::FinWait1 | State::FinWait2 => {
                if !seg.payload.is_empty() || f.fin() {
                    self.process_text(seg, seq, f.fin());
                }
            }
            State::TimeWait if f.fin() => {
                self.timers.set(Timer::Close, self.now + self.cfg.time_wait);
                self.stats.time_wait_restarted += 1;
                self.ack.pending = true;
            }
            _ => {
                // CLOSE-WAIT, CLOSING, LAST-ACK: the peer already sent FIN.
                if !seg.payload.is_empty() {
                    self.stats.rx_out_of_window += 1;
                }
            }
        }
    }

    /// The ACK part of an acceptable segment. Returns false if the segment must be
    /// dropped.
    fn process_ack(&mut self, seg: &Segment) -> bool {
        let ack = Seq(seg.ack);
        let seq = Seq(seg.seq);
        if ack.gt(self.snd.nxt) {
            self.stats.rx_ack_too_new += 1;
            self.challenge_ack();
            return false;
        }
        if ack.lt(self.snd.una - self.snd.max_wnd.max(1)) {
            self.stats.rx_ack_too_old += 1;
            self.ack.pending = true;
            return false;
        }
        let flight_before = self.snd.nxt.since(self.snd.una);
        let cwnd_limited =
            self.snd.cwnd_blocked || u64::from(flight_before) * 2 >= u64::from(self.cc.cwnd());
        let mut delivered = false;
        let advanced = ack.gt(self.snd.una);
        if advanced {
            delivered |= self.process_new_ack(ack, seg.options.timestamps.map(|t| t.1));
        }
        if self.sack_ok && seg.options.sack_count > 0 {
            delivered |= self.process_sacks(seg);
        }

        let window_changed = self.update_send_window(seq, ack, seg.window);

        // Duplicate ACK (RFC 5681 §2).
        let duplicate_ack = !advanced
            && ack == self.snd.una
            && seg.payload.is_empty()
            && !seg.flags.fin()
            && !window_changed
            && !self.scoreboard.is_empty();
        self.detect_loss(duplicate_ack, delivered);
        if advanced {
            self.on_ack_advanced(ack, flight_before, cwnd_limited);
        }

        // Our FIN acknowledged?
        if self.snd.fin_acked {
            match self.state {
                State::FinWait1 => {
                    self.state = State::FinWait2;
                    if self.app_closed {
                        self.timers
                            .set(Timer::Close, self.now + self.cfg.fin_wait2_timeout);
                    }
                }
                State::Closing => self.enter_time_wait(),
                State::LastAck => self.enter_closed(None),
                _ => {}
            }
        }
        true
    }

    /// Data and FIN of an acceptable segment in ESTABLISHED / FIN-WAIT-1/2.
    fn process_text(&mut self, seg: &Segment, seq: Seq, fin: bool) {
        let end = seq + seg.payload.len();
        if self.app_closed && !seg.payload.is_empty() && end.gt(self.rcv.nxt) {
            // Nobody will read this (RFC 9293 §3.10.7.4 / RFC 2525 §2.17): reset.
            self.stats.rx_after_close += 1;
            self.error = Some(TcpError::Aborted);
            self.rst_pending = true;
            return;
        }
        self.receive_text(seg, seq, fin);
        if self.take_fin() {
            match self.state {
                State::Established => self.state = State::CloseWait,
                State::FinWait1 => {
                    if self.snd.fin_acked {
                        self.enter_time_wait();
                    } else {
                        self.state = State::Closing;
                    }
                }
                State::FinWait2 => self.enter_time_wait(),
                _ => {}
            }
        }
    }
}
