//! The state machine (RFC 9293 §3.3.2, §3.10): segment arrival in SYN-RECEIVED and
//! the synchronized states, one function per step of §3.10.7.4 (with RFC 5961's
//! blind-attack checks and RFC 7323's PAWS), the FIN exchange, closing by the
//! application (`shutdown_write`, `close`, `abort`, linger), TIME-WAIT and its reuse
//! (RFC 6191). Opening lives in `handshake.rs`.

use std::fmt;
use std::ops::ControlFlow;
use std::time::Duration;

use super::timers::Timer;
use super::timestamps::Paws;
use super::{Connection, Segment, TcpError, Wake};
use crate::seq::Seq;
use crate::time::Instant;

/// RFC 9293 connection states (LISTEN lives in [`crate::Listener`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// No connection (initial before `connect`, or final).
    Closed,
    /// SYN sent, waiting for SYN-ACK.
    SynSent,
    /// SYN received and SYN-ACK sent (simultaneous open or passive open).
    SynReceived,
    /// Data flows both ways.
    Established,
    /// We closed; our FIN is not yet acknowledged.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's FIN.
    FinWait2,
    /// The peer closed; we may still send.
    CloseWait,
    /// Both closed at once; waiting for the ACK of our FIN.
    Closing,
    /// The peer closed, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Both closed; lingering 2*MSL to absorb old duplicates.
    TimeWait,
}

impl State {
    /// SYN exchanged both ways (RFC 9293 "synchronized states").
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::Closed | State::SynSent | State::SynReceived)
    }
    /// The name packetdrill and netstat use.
    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::SynSent => "SYN_SENT",
            State::SynReceived => "SYN_RECV",
            State::Established => "ESTABLISHED",
            State::FinWait1 => "FIN_WAIT1",
            State::FinWait2 => "FIN_WAIT2",
            State::CloseWait => "CLOSE_WAIT",
            State::Closing => "CLOSING",
            State::LastAck => "LAST_ACK",
            State::TimeWait => "TIME_WAIT",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// RFC 5961 §7: challenge ACKs are rate-limited per connection (a global limit is
/// the CVE-2016-5696 side channel).
#[derive(Debug, Clone)]
pub(crate) struct ChallengeLimiter {
    count: u32,
    window_start: Instant,
}

impl ChallengeLimiter {
    pub(crate) fn new(now: Instant) -> Self {
        ChallengeLimiter {
            count: 0,
            window_start: now,
        }
    }

    /// May another challenge ACK go out at `now`, `limit` per second?
    pub(crate) fn allow(&mut self, now: Instant, limit: u32) -> bool {
        if now.saturating_since(self.window_start) >= Duration::from_secs(1) {
            self.window_start = now;
            self.count = 0;
        }
        if self.count < limit {
            self.count += 1;
            true
        } else {
            false
        }
    }
}

/// RFC 9293 §3.10.7.4 first check: is a segment of `len` (SYN and FIN counted)
/// starting at `seq` inside the receive window `rcv_nxt .. rcv_nxt + wnd`? The four
/// cases of the RFC, plus a segment that starts before RCV.NXT and spans the whole
/// window (a coalesced frame longer than the window; its old part is trimmed later).
pub(crate) fn acceptable(seq: Seq, len: u32, rcv_nxt: Seq, wnd: u32) -> bool {
    let wend = rcv_nxt + wnd;
    match (len, wnd) {
        (0, 0) => seq == rcv_nxt,
        (0, _) => seq.in_range(rcv_nxt, wend),
        (_, 0) => false,
        (_, _) => {
            seq.in_range(rcv_nxt, wend)
                || (seq + (len - 1)).in_range(rcv_nxt, wend)
                || (seq.lt(rcv_nxt) && (seq + len).gt(wend))
        }
    }
}

impl Connection {
    /// Process one received segment (already checksummed and demultiplexed to this
    /// connection). Nothing in it is trusted. Replies are queued: call
    /// `poll_transmit` afterwards.
    pub fn input(&mut self, now: Instant, seg: &Segment) -> Wake {
        self.now = self.now.max(now);
        self.stats.rx_segments += u64::from(seg.wire_segments());
        let readable = self.readable_mark();
        let eof = self.rcv.fin_received;
        let state = self.state;
        match self.state {
            State::Closed => self.stats.rare().rx_closed_drop += 1,
            State::SynSent => self.input_syn_sent(seg),
            _ => {
                let _ = self.input_synchronized(seg);
            }
        }
        self.wake_since(readable, eof, state)
    }

    /// What grows when there is more to read: bytes queued, and bytes handed to a
    /// receive sink ([`Connection::set_recv_sink`]).
    pub(crate) fn readable_mark(&self) -> u64 {
        self.recv_available() as u64 + self.recv_delivered()
    }

    pub(crate) fn wake_since(&self, readable: u64, eof: bool, state: State) -> Wake {
        let gone = |s: State| matches!(s, State::Closed | State::TimeWait);
        Wake {
            readable: self.readable_mark() > readable || self.rcv.fin_received != eof,
            // Room for a writer that found none is `wmem_after_transmit`'s to report.
            writable: state != self.state && self.state == State::Established,
            closed: !gone(state) && gone(self.state),
        }
    }

    /// RFC 9293 §3.10.7.4, "otherwise" (SYN-RECEIVED and the synchronized states):
    /// the checks in the RFC's order. A step that is done with the segment (dropped
    /// it, or answered it) breaks. The third check (security) does not apply.
    fn input_synchronized(&mut self, seg: &Segment) -> ControlFlow<()> {
        self.keepalive_heard_peer();
        self.syn_received_syn(seg)?;
        self.check_sequence_number(seg)?;
        self.check_rst(seg)?;
        self.check_syn(seg)?;
        self.check_ack(seg)?;
        self.ecn_on_segment(seg);
        self.check_urg(seg);
        self.process_segment_text(seg)?;
        self.check_fin(seg);
        ControlFlow::Continue(())
    }

    /// First check, sequence number: PAWS (RFC 7323 §5.3) first, then acceptability.
    /// An unacceptable segment is answered with an ACK (unless it is an RST), except
    /// at a zero window's edge, where its ACK and window are still taken.
    fn check_sequence_number(&mut self, seg: &Segment) -> ControlFlow<()> {
        let f = seg.flags;
        let seq = Seq(seg.seq);
        self.check_paws(seg)?;
        let wnd = self.rcv.adv.since(self.rcv.nxt);
        if acceptable(seq, seg.seg_len(), self.rcv.nxt, wnd) {
            return ControlFlow::Continue(());
        }
        if f.rst() {
            self.stats.rare().rx_rst_out_of_window += 1;
            return ControlFlow::Break(());
        }
        if f.syn() {
            self.stats.rare().rx_syn_challenged += 1;
            self.challenge_ack();
            return ControlFlow::Break(());
        }
        let zero_window_edge = wnd == 0 && seq == self.rcv.nxt && f.ack();
        if zero_window_edge {
            // Take the ACK and window information, not the data.
            if !seg.payload.is_empty() {
                self.stats.rare().rx_beyond_window_bytes += seg.payload.len() as u64;
            }
            self.ack.pending = true;
            self.process_ack(seg);
            return ControlFlow::Break(());
        }
        self.stats.rare().rx_out_of_window += u64::from(seg.wire_segments());
        let plen = seg.payload.len() as u32;
        if plen > 0 && (seq + plen).le(self.rcv.nxt) {
            self.stats.rx_dup_bytes += u64::from(plen);
            if self.opts.sack && self.cfg.dsack {
                self.rcv.dsack = Some((seq, seq + plen));
            }
        }
        if self.state == State::TimeWait && f.fin() {
            self.restart_time_wait();
        }
        self.ack.pending = true;
        ControlFlow::Break(())
    }

    /// PAWS (RFC 7323 §5.3): an older timestamp is an old duplicate, dropped with an
    /// ACK. A segment without the negotiated option is accepted and counted (as
    /// Linux does); an RST is never rejected for its timestamp.
    fn check_paws(&mut self, seg: &Segment) -> ControlFlow<()> {
        if !self.ts.ok {
            return ControlFlow::Continue(());
        }
        match seg.options.timestamps {
            Some((tsval, _)) if !seg.flags.rst() => match self.ts.paws(tsval, self.now) {
                Paws::Fresh => {}
                Paws::RecentExpired => self.stats.rare().rx_ts_recent_expired += 1,
                Paws::Reject => {
                    self.stats.rare().rx_paws_rejected += 1;
                    self.ack.pending = true;
                    return ControlFlow::Break(());
                }
            },
            Some(_) => {}
            None => self.stats.rare().rx_missing_ts += 1,
        }
        ControlFlow::Continue(())
    }

    /// Second check, RST bit (RFC 5961 §3.2): only an RST at exactly RCV.NXT resets
    /// the connection; one elsewhere in the window gets a challenge ACK. In TIME-WAIT
    /// an RST is ignored (RFC 1337).
    fn check_rst(&mut self, seg: &Segment) -> ControlFlow<()> {
        if !seg.flags.rst() {
            return ControlFlow::Continue(());
        }
        if Seq(seg.seq) != self.rcv.nxt {
            self.stats.rare().rx_rst_challenged += 1;
            self.challenge_ack();
            return ControlFlow::Break(());
        }
        match self.state {
            State::TimeWait => self.stats.rare().rx_rst_time_wait += 1,
            // A Fast Open child already belongs to the application: reset, as an
            // established connection (Linux: ECONNRESET).
            State::SynReceived if self.syn.tfo_child => {
                self.stats.rare().conn_resets += 1;
                self.enter_closed(Some(TcpError::Reset));
            }
            State::SynReceived => {
                self.stats.rare().conn_resets += 1;
                self.enter_closed(Some(TcpError::Refused));
            }
            State::Established | State::FinWait1 | State::FinWait2 | State::CloseWait => {
                self.stats.rare().conn_resets += 1;
                self.enter_closed(Some(TcpError::Reset));
            }
            _ => {
                self.stats.rare().rx_rst += 1;
                self.enter_closed(None);
            }
        }
        if self.state == State::Closed {
            self.stats.rare().rx_rst += 1;
        }
        ControlFlow::Break(())
    }

    /// Fourth check, SYN bit: a SYN in a synchronized state gets a challenge ACK
    /// (RFC 5961 §4).
    fn check_syn(&mut self, seg: &Segment) -> ControlFlow<()> {
        if !seg.flags.syn() {
            return ControlFlow::Continue(());
        }
        self.stats.rare().rx_syn_challenged += 1;
        self.challenge_ack();
        ControlFlow::Break(())
    }

    /// Fifth check, ACK field: no ACK, no processing. TS.Recent follows (RFC 7323
    /// §4.3) unless the ACK is one `process_ack` drops (of unsent data, or older
    /// than the window): a segment that is not accepted must not move it, or one
    /// forged segment with a high TSval would make PAWS drop the peer's real ones
    /// (as Linux, which updates it only after the ACK checks); in SYN-RECEIVED the
    /// ACK completes the handshake; then the ACK itself. In TIME-WAIT only a
    /// segment with data or a FIN goes on.
    fn check_ack(&mut self, seg: &Segment) -> ControlFlow<()> {
        let f = seg.flags;
        if !f.ack() {
            self.stats.rare().rx_no_ack += 1;
            return ControlFlow::Break(());
        }
        let ack = Seq(seg.ack);
        let ack_invalid = self.state != State::SynReceived
            && (ack.gt(self.snd.nxt) || ack.lt(self.snd.una - self.snd.max_wnd.max(1)));
        if self.ts.ok && !ack_invalid {
            if let Some((tsval, _)) = seg.options.timestamps {
                self.ts
                    .update_recent(tsval, Seq(seg.seq), self.ack.last_sent, self.now);
            }
        }
        if self.state == State::SynReceived {
            self.complete_passive_open(seg)?;
        }
        if !self.process_ack(seg) {
            return ControlFlow::Break(());
        }
        if self.state == State::Closed
            || (self.state == State::TimeWait && seg.payload.is_empty() && !f.fin())
        {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// The ACK of an acceptable segment: RFC 5961 §5 validity (beyond SND.NXT →
    /// challenge ACK; older than SND.UNA − MAX.SND.WND → ACK and drop), then new and
    /// selective ACKs, the window, loss detection, congestion control, and our FIN.
    /// Returns false if the segment must be dropped.
    pub(crate) fn process_ack(&mut self, seg: &Segment) -> bool {
        let ack = Seq(seg.ack);
        let seq = Seq(seg.seq);
        if ack.gt(self.snd.nxt) {
            self.stats.rare().rx_ack_too_new += 1;
            if self.cfg.challenge_unsent_acks {
                self.challenge_ack();
            }
            return false;
        }
        if ack.lt(self.snd.una - self.snd.max_wnd.max(1)) {
            self.stats.rare().rx_ack_too_old += 1;
            self.ack.pending = true;
            return false;
        }
        let flight_before = self.snd.nxt.since(self.snd.una);
        let pipe_before = self.pipe_est();
        let prior_fack = self.scoreboard.highest_sacked_end().unwrap_or(self.snd.una);
        self.recovery.reord_low = None;
        // RFC 6937's DeliveredData: the change in SND.UNA plus in SACKed bytes.
        let (una_before, sacked_before) = (self.snd.una, self.scoreboard.sacked_bytes());
        let cwnd_limited = self.is_cwnd_limited();
        let mut delivered = false;
        let advanced = ack.gt(self.snd.una);
        let dupacks_before = self.recovery.dupacks;
        if advanced {
            delivered |= self.process_new_ack(ack, seg.options.timestamps.map(|t| t.1));
        }
        // SACKed bytes the cumulative ACK retired were delivered by earlier ACKs;
        // without SACK, each duplicate ACK stood for a segment that arrived (as
        // Linux's reno "sacked" count: at least one segment is new).
        let sacked_retired = if self.opts.sack {
            sacked_before.saturating_sub(self.scoreboard.sacked_bytes())
        } else {
            (dupacks_before * self.smss()).min(ack.since(una_before).saturating_sub(self.smss()))
        };
        if self.opts.sack && seg.options.sack_count > 0 {
            delivered |= self.process_sacks(seg);
        }
        if self.opts.sack {
            self.check_reordering(prior_fack);
        }
        let window_changed = self.update_send_window(seq, ack, seg.window);
        // Duplicate ACK (RFC 5681 §2).
        let duplicate_ack = !advanced
            && ack == self.snd.una
            && seg.payload.is_empty()
            && !seg.flags.fin()
            && !window_changed
            && !self.scoreboard.is_empty();
        let lost_before = self.scoreboard.lost_segs();
        self.detect_loss(duplicate_ack, delivered);
        let newly_lost = self.scoreboard.lost_segs() > lost_before;
        if advanced {
            self.on_ack_advanced(ack, flight_before, cwnd_limited, sacked_retired);
        }
        // After the window grew for this ACK: an ECE reduces what it became.
        let delivered = (i64::from(self.snd.una.since(una_before))
            + i64::from(self.scoreboard.sacked_bytes())
            - i64::from(sacked_before))
        .max(0) as u32;
        let retrans_acked = advanced && self.recovery.retrans_acked;
        self.ecn_on_ack(seg, delivered, retrans_acked, newly_lost);
        let losses = (self.scoreboard.lost_segs().saturating_sub(lost_before)) * self.smss();
        self.rate_on_ack(delivered, losses, pipe_before);
        if self.snd.fin_acked {
            self.on_fin_acked();
        }
        true
    }

    /// Our FIN is acknowledged: FIN-WAIT-1 → FIN-WAIT-2 (an orphan waits there only
    /// `fin_wait2_timeout`), CLOSING → TIME-WAIT, LAST-ACK → CLOSED.
    fn on_fin_acked(&mut self) {
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

    /// Sixth check, URG bit (RFC 6093 semantics, see `note_urgent`).
    fn check_urg(&mut self, seg: &Segment) {
        if seg.flags.urg() {
            self.stats.rare().rx_urgent += 1;
            self.note_urgent(Seq(seg.seq), seg.urgent);
        }
    }

    /// Seventh check, segment text: taken in ESTABLISHED and FIN-WAIT-1/2 (unless the
    /// application closed: then new data resets the connection, RFC 2525 §2.17);
    /// after the peer's FIN, data is out of window.
    fn process_segment_text(&mut self, seg: &Segment) -> ControlFlow<()> {
        let fin = seg.flags.fin();
        let seq = Seq(seg.seq);
        match self.state {
            State::Established | State::FinWait1 | State::FinWait2 => {
                if seg.payload.is_empty() && !fin {
                    return ControlFlow::Continue(());
                }
                let end = seq + seg.payload.len();
                if self.app_closed && !seg.payload.is_empty() && end.gt(self.rcv.nxt) {
                    // Nobody will read this: reset (RFC 1122 §4.2.2.13). Nobody holds
                    // the connection any more, so the RST answers the segment as a
                    // closed port would (RFC 9293 §3.10.7.1's form, as Linux).
                    self.stats.rare().rx_after_close += 1;
                    self.stats.rare().conn_aborts += 1;
                    self.reply_rst = Some(if seg.flags.ack() {
                        (Seq(seg.ack), None)
                    } else {
                        (Seq(0), Some(end + u32::from(fin)))
                    });
                    self.enter_closed(Some(TcpError::Aborted));
                    return ControlFlow::Break(());
                }
                self.receive_text(seg, seq, fin);
            }
            // The eighth check restarts the 2MSL wait.
            State::TimeWait if fin => {}
            _ => {
                // CLOSE-WAIT, CLOSING, LAST-ACK (and TIME-WAIT): the peer already
                // sent FIN.
                if !seg.payload.is_empty() {
                    self.stats.rare().rx_out_of_window += 1;
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// Eighth check, FIN bit: once the data before it is in (now, or when a later
    /// segment fills the hole before an out-of-order FIN), the FIN moves ESTABLISHED
    /// to CLOSE-WAIT, FIN-WAIT-1 to CLOSING (or TIME-WAIT if our FIN is acknowledged)
    /// and FIN-WAIT-2 to TIME-WAIT. A FIN in TIME-WAIT restarts the 2MSL wait.
    pub(crate) fn check_fin(&mut self, seg: &Segment) {
        match self.state {
            State::Established | State::FinWait1 | State::FinWait2 => {
                if !self.take_fin() {
                    return;
                }
                match self.state {
                    State::Established => self.state = State::CloseWait,
                    State::FinWait1 if self.snd.fin_acked => self.enter_time_wait(),
                    State::FinWait1 => self.state = State::Closing,
                    _ => self.enter_time_wait(),
                }
            }
            State::TimeWait if seg.flags.fin() => {
                self.restart_time_wait();
                self.ack.pending = true;
            }
            _ => {}
        }
    }

    /// A retransmitted FIN in TIME-WAIT: our last ACK was lost; wait 2MSL again.
    fn restart_time_wait(&mut self) {
        self.timers.set(Timer::Close, self.now + self.cfg.time_wait);
        self.stats.rare().time_wait_restarted += 1;
    }

    /// Rate-limited challenge ACK (RFC 5961 §7, per connection).
    pub(crate) fn challenge_ack(&mut self) {
        if self
            .challenges
            .allow(self.now, self.cfg.challenge_ack_limit)
        {
            self.ack.pending = true;
            self.stats.rare().tx_challenge_acks += 1;
        } else {
            self.stats.rare().challenge_acks_limited += 1;
        }
    }

    /// Half-close: send FIN after the queued data (SHUT_WR).
    pub fn shutdown_write(&mut self) {
        match self.state {
            State::SynSent => self.enter_closed(None),
            // In SYN-RECEIVED the FIN waits for the handshake (establish() moves on
            // to FIN-WAIT-1).
            State::SynReceived => self.snd.fin_queued = true,
            State::Established => {
                self.snd.fin_queued = true;
                self.state = State::FinWait1;
            }
            State::CloseWait => {
                self.snd.fin_queued = true;
                self.state = State::LastAck;
            }
            _ => {}
        }
    }

    /// Full close (close(2)): no more reads or writes. With unread received data, or
    /// `linger == Some(0)`, the connection is aborted with RST; otherwise a FIN
    /// follows the queued data, bounded by the linger time if one is set.
    pub fn close(&mut self) {
        if self.app_closed {
            return;
        }
        self.app_closed = true;
        if self.cfg.linger == Some(Duration::ZERO) || !self.rcv.buf.is_empty() {
            if !self.rcv.buf.is_empty() {
                self.stats.rare().rx_after_close += 1;
            }
            self.abort();
            return;
        }
        self.shutdown_write();
        if let Some(l) = self.cfg.linger {
            if self.state != State::Closed {
                self.timers.set(Timer::Close, self.now + l);
            }
        }
        // Closed after a half-close whose FIN is already acknowledged: the orphan
        // waits for the peer's FIN only so long (Linux arms tcp_fin_timeout here too).
        if self.state == State::FinWait2 {
            self.timers
                .set_if_idle(Timer::Close, self.now + self.cfg.fin_wait2_timeout);
        }
    }

    /// Abortive close: RST now (if synchronized), then CLOSED.
    pub fn abort(&mut self) {
        self.app_closed = true;
        if matches!(self.state, State::Closed | State::TimeWait | State::SynSent) {
            self.enter_closed(None);
            return;
        }
        self.rst_pending = true;
        self.stats.rare().conn_aborts += 1;
    }

    /// RFC 6191 / RFC 9293 §3.6.1: may a SYN for this 4-tuple, arriving while this
    /// connection is in TIME-WAIT, start a new incarnation? True if its timestamp (or,
    /// without timestamps, its sequence number) is newer than this incarnation's.
    /// The stack then drops this connection and hands the SYN to the listener.
    pub fn time_wait_accepts_syn(&self, seg: &Segment) -> bool {
        if self.state != State::TimeWait || !seg.flags.syn() || seg.flags.ack() {
            return false;
        }
        match (self.ts.ok, seg.options.timestamps) {
            (true, Some((tsval, _))) => self.ts.newer_than_recent(tsval),
            _ => Seq(seg.seq).gt(self.rcv.nxt),
        }
    }

    /// Close timer: TIME-WAIT is over, an orphan waited too long in FIN-WAIT-2, or
    /// the linger time ran out (abort).
    pub(crate) fn on_close_timer(&mut self) {
        match self.state {
            State::TimeWait => self.enter_closed(None),
            State::Closed => {}
            State::FinWait2 if self.app_closed => {
                self.stats.rare().fin_wait2_timeouts += 1;
                self.enter_closed(None);
            }
            _ => {
                self.stats.rare().linger_timeouts += 1;
                self.error = Some(TcpError::Aborted);
                self.rst_pending = true;
            }
        }
    }

    /// CLOSED, with `err` as the socket error (a timeout reports a pending soft
    /// error instead). Nothing is pending any more.
    pub(crate) fn enter_closed(&mut self, err: Option<TcpError>) {
        if let Some(e) = err {
            self.error = Some(match e {
                TcpError::TimedOut => self.timeout_error(),
                e => e,
            });
        }
        self.state = State::Closed;
        self.timers.clear_all();
        self.ack.pending = false;
        self.ack.dupacks_owed = 0;
        self.syn.pending = false;
        self.recovery.tlp_pending = false;
        self.snd.persist_pending = false;
        self.keepalive.pending = false;
    }

    /// TIME-WAIT for 2MSL: nothing is in flight any more.
    pub(crate) fn enter_time_wait(&mut self) {
        self.state = State::TimeWait;
        self.stats.time_wait_entered += 1;
        self.timers.clear_all();
        self.timers.set(Timer::Close, self.now + self.cfg.time_wait);
        self.scoreboard.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::testing::OwnedSegment;
    use crate::TcpConfig;
    use usnet_wire::TcpFlags;

    #[test]
    fn the_four_acceptability_cases() {
        let nxt = Seq(1000);
        // Zero length, zero window: only exactly RCV.NXT.
        assert!(acceptable(Seq(1000), 0, nxt, 0));
        assert!(!acceptable(Seq(1001), 0, nxt, 0));
        // Zero length, open window: anywhere inside.
        assert!(acceptable(Seq(1099), 0, nxt, 100));
        assert!(!acceptable(Seq(1100), 0, nxt, 100));
        assert!(!acceptable(Seq(999), 0, nxt, 100));
        // Data, zero window: never.
        assert!(!acceptable(Seq(1000), 10, nxt, 0));
        // Data, open window: first or last byte inside.
        assert!(acceptable(Seq(995), 10, nxt, 100), "last byte inside");
        assert!(acceptable(Seq(1095), 10, nxt, 100), "first byte inside");
        assert!(!acceptable(Seq(990), 10, nxt, 100), "all old");
        assert!(!acceptable(Seq(1100), 10, nxt, 100), "all beyond");
        // Spanning the whole window (a coalesced frame).
        assert!(acceptable(Seq(900), 300, nxt, 100));
        // Modular: RCV.NXT just below the wrap.
        assert!(acceptable(Seq(5), 10, Seq(u32::MAX - 2), 100));
    }

    #[test]
    fn challenge_acks_are_limited_per_second() {
        let t0 = Instant::from_millis(5);
        let mut l = ChallengeLimiter::new(t0);
        assert!(l.allow(t0, 2));
        assert!(l.allow(t0 + ms(10), 2));
        assert!(!l.allow(t0 + ms(999), 2));
        assert!(l.allow(t0 + ms(1000), 2), "a new second");
    }

    /// A segment from the server to the client, built from the server's last one.
    fn from_server(srv: &mut Connection, edit: impl Fn(&mut OwnedSegment)) -> OwnedSegment {
        srv.ack.pending = true;
        let mut s = drain(srv, T0).remove(0);
        edit(&mut s);
        s
    }

    #[test]
    fn rst_must_hit_rcv_nxt_exactly() {
        let (mut cli, mut srv) = default_pair();
        let nxt = cli.rcv.nxt.0;
        let off = from_server(&mut srv, |s| {
            s.repr.flags = TcpFlags::RST;
            s.repr.seq = nxt + 100;
        });
        feed(&mut cli, T0, &[off]);
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.stats().rx_rst_challenged, 1);
        let challenge = drain(&mut cli, T0);
        assert_eq!(challenge.len(), 1);
        assert_eq!(
            challenge[0].repr.ack, nxt,
            "the challenge ACK names RCV.NXT"
        );
        let outside = from_server(&mut srv, |s| {
            s.repr.flags = TcpFlags::RST;
            s.repr.seq = nxt.wrapping_sub(10);
        });
        feed(&mut cli, T0, &[outside]);
        assert_eq!(cli.stats().rx_rst_out_of_window, 1);
        let exact = from_server(&mut srv, |s| s.repr.flags = TcpFlags::RST);
        let wake = cli.input(T0, &exact.segment());
        assert!(wake.closed);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::Reset));
    }

    #[test]
    fn a_syn_on_an_established_connection_is_challenged() {
        let (mut cli, mut srv) = default_pair();
        let syn = from_server(&mut srv, |s| s.repr.flags = TcpFlags::SYN);
        feed(&mut cli, T0, &[syn]);
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.stats().rx_syn_challenged, 1);
        assert_eq!(cli.stats().tx_challenge_acks, 1);
    }

    #[test]
    fn acks_of_unsent_or_ancient_data_are_dropped() {
        let (mut cli, mut srv) = default_pair();
        let una = cli.snd.una.0;
        let too_new = from_server(&mut srv, |s| s.repr.ack = una + 5);
        feed(&mut cli, T0, &[too_new]);
        assert_eq!(cli.stats().rx_ack_too_new, 1);
        assert_eq!(cli.stats().tx_challenge_acks, 1);
        let too_old = from_server(&mut srv, |s| s.repr.ack = una.wrapping_sub(1 << 30));
        feed(&mut cli, T0, &[too_old]);
        assert_eq!(cli.stats().rx_ack_too_old, 1);
        assert_eq!(cli.snd.una.0, una);
    }

    #[test]
    fn the_linux_profile_drops_an_ack_of_unsent_data_without_a_word() {
        let cfg = TcpConfig::profile("linux").unwrap();
        let (mut cli, mut srv) = pair(cfg.clone(), cfg);
        let una = cli.snd.una.0;
        let too_new = from_server(&mut srv, |s| s.repr.ack = una + 5);
        feed(&mut cli, T0, &[too_new]);
        assert_eq!(cli.stats().rx_ack_too_new, 1);
        assert_eq!(cli.stats().tx_challenge_acks, 0);
        assert!(drain(&mut cli, T0).is_empty());
    }

    #[test]
    fn a_segment_with_an_invalid_ack_leaves_ts_recent_alone() {
        let (mut cli, mut srv) = default_pair();
        let recent = cli.ts.recent;
        let una = cli.snd.una.0;
        let forged = from_server(&mut srv, |s| {
            s.repr.ack = una + 9999;
            s.repr.options.timestamps = Some((recent.wrapping_add(1 << 20), 0));
        });
        feed(&mut cli, T0, &[forged]);
        assert_eq!(cli.ts.recent, recent);
    }

    #[test]
    fn paws_drops_an_old_timestamp_with_an_ack() {
        let (mut cli, mut srv) = default_pair();
        cli.send(b"data");
        feed(&mut srv, T0, &drain(&mut cli, T0));
        let old = from_server(&mut srv, |s| {
            let (val, ecr) = s.repr.options.timestamps.unwrap();
            s.repr.options.timestamps = Some((val.wrapping_sub(1), ecr));
        });
        feed(&mut cli, T0, &[old]);
        assert_eq!(cli.stats().rx_paws_rejected, 1);
        assert!(cli.ack.pending);
        assert_eq!(cli.snd.nxt.since(cli.snd.una), 4, "its ACK was not taken");
    }

    #[test]
    fn active_close_through_time_wait_and_passive_close_through_last_ack() {
        let cfg = TcpConfig {
            time_wait: ms(500),
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(cfg.clone(), cfg);
        cli.shutdown_write();
        assert_eq!(cli.state(), State::FinWait1);
        feed(&mut srv, T0, &drain(&mut cli, T0));
        assert_eq!(srv.state(), State::CloseWait);
        assert!(srv.is_eof());
        feed(&mut cli, T0, &drain(&mut srv, T0));
        assert_eq!(cli.state(), State::FinWait2);
        srv.close();
        assert_eq!(srv.state(), State::LastAck);
        feed(&mut cli, T0, &drain(&mut srv, T0));
        assert_eq!(cli.state(), State::TimeWait);
        feed(&mut srv, T0, &drain(&mut cli, T0));
        assert_eq!(srv.state(), State::Closed);
        assert_eq!(srv.error(), None);
        assert_eq!(cli.poll_at(), Some(T0 + ms(500)));
        drain(&mut cli, T0 + ms(500));
        assert_eq!(cli.state(), State::Closed);
    }

    #[test]
    fn simultaneous_close_goes_through_closing() {
        let (mut cli, mut srv) = default_pair();
        cli.shutdown_write();
        srv.shutdown_write();
        let (fc, fs) = (drain(&mut cli, T0), drain(&mut srv, T0));
        feed(&mut cli, T0, &fs);
        feed(&mut srv, T0, &fc);
        assert_eq!((cli.state(), srv.state()), (State::Closing, State::Closing));
        let (ac, as_) = (drain(&mut cli, T0), drain(&mut srv, T0));
        feed(&mut cli, T0, &as_);
        feed(&mut srv, T0, &ac);
        assert_eq!(
            (cli.state(), srv.state()),
            (State::TimeWait, State::TimeWait)
        );
    }

    #[test]
    fn a_retransmitted_fin_restarts_time_wait() {
        let (mut cli, mut srv) = default_pair();
        cli.shutdown_write();
        feed(&mut srv, T0, &drain(&mut cli, T0));
        feed(&mut cli, T0, &drain(&mut srv, T0));
        srv.close();
        let fin = drain(&mut srv, T0);
        feed(&mut cli, T0, &fin);
        assert_eq!(cli.state(), State::TimeWait);
        drain(&mut cli, T0);
        let later = T0 + ms(2000);
        feed(&mut cli, later, &fin);
        assert_eq!(cli.stats().time_wait_restarted, 1);
        assert_eq!(cli.poll_at(), Some(later), "the ACK again");
        drain(&mut cli, later);
        assert_eq!(cli.poll_at(), Some(later + cli.cfg.time_wait));
    }

    #[test]
    fn close_with_unread_data_or_zero_linger_resets() {
        let (mut cli, mut srv) = default_pair();
        cli.send(b"unread");
        feed(&mut srv, T0, &drain(&mut cli, T0));
        srv.close();
        let rst = drain(&mut srv, T0);
        assert_eq!(rst.len(), 1);
        assert!(rst[0].repr.flags.rst());
        assert_eq!(srv.state(), State::Closed);
        assert_eq!(srv.stats().rx_after_close, 1);
        feed(&mut cli, T0, &rst);
        assert_eq!(cli.error(), Some(TcpError::Reset));

        let (mut cli, _srv) = default_pair();
        cli.set_linger(Some(Duration::ZERO));
        cli.close();
        assert!(drain(&mut cli, T0)[0].repr.flags.rst());
        assert_eq!(cli.stats().conn_aborts, 1);
    }

    #[test]
    fn data_after_close_resets_and_a_linger_deadline_aborts() {
        let (mut cli, mut srv) = default_pair();
        srv.close();
        assert_eq!(srv.state(), State::FinWait1);
        drain(&mut srv, T0);
        cli.send(b"nobody reads this");
        let data = drain(&mut cli, T0);
        feed(&mut srv, T0, &data);
        assert_eq!(srv.error(), Some(TcpError::Aborted));
        assert_eq!(srv.state(), State::Closed);
        // The reply form: <SEQ=SEG.ACK><CTL=RST>, whatever our FIN used.
        let rst = drain(&mut srv, T0).remove(0);
        assert_eq!(rst.repr.flags, TcpFlags::RST);
        assert_eq!(rst.repr.seq, data[0].repr.ack);

        let (mut cli, _srv) = default_pair();
        cli.set_linger(Some(ms(300)));
        cli.send(b"never acknowledged");
        cli.close();
        drain(&mut cli, T0);
        let mut now = T0;
        while cli.state() != State::Closed {
            now = cli.poll_at().expect("a deadline");
            drain(&mut cli, now);
        }
        assert_eq!(now, T0 + ms(300));
        assert_eq!(cli.stats().linger_timeouts, 1);
        assert_eq!(cli.error(), Some(TcpError::Aborted));
    }

    #[test]
    fn an_orphan_waits_in_fin_wait_2_only_so_long() {
        let (mut cli, mut srv) = default_pair();
        cli.close();
        feed(&mut srv, T0, &drain(&mut cli, T0));
        feed(&mut cli, T0, &drain(&mut srv, T0));
        assert_eq!(cli.state(), State::FinWait2);
        let deadline = T0 + cli.cfg.fin_wait2_timeout;
        assert_eq!(cli.poll_at(), Some(deadline));
        drain(&mut cli, deadline);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.stats().fin_wait2_timeouts, 1);
    }

    #[test]
    fn time_wait_accepts_only_a_newer_syn() {
        let (mut cli, mut srv) = default_pair();
        cli.shutdown_write();
        feed(&mut srv, T0, &drain(&mut cli, T0));
        feed(&mut cli, T0, &drain(&mut srv, T0));
        srv.close();
        feed(&mut cli, T0, &drain(&mut srv, T0));
        assert_eq!(cli.state(), State::TimeWait);
        let recent = cli.ts.recent;
        let mut syn = |tsval: u32| {
            from_server(&mut srv, |s| {
                s.repr.flags = TcpFlags::SYN;
                s.repr.options.timestamps = Some((tsval, 0));
            })
        };
        assert!(cli.time_wait_accepts_syn(&syn(recent.wrapping_add(1)).segment()));
        assert!(!cli.time_wait_accepts_syn(&syn(recent).segment()));
        let mut syn_ack = syn(recent.wrapping_add(1));
        syn_ack.repr.flags |= TcpFlags::ACK;
        assert!(!cli.time_wait_accepts_syn(&syn_ack.segment()));
    }
}
