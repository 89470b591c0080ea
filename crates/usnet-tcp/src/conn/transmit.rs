//! Segment departure: `poll_transmit` runs the expired timers, then emits what is due
//! in priority order (RSTs, SYN, retransmissions, probes, new data, ACKs) through one
//! `emit` that builds the header, fills in the window and commits the ACK state only
//! when the sink took the segment. What each kind of segment is lives with its
//! mechanism (handshake, recovery, send and receive sides, keepalive).

use std::time::Duration;

use usnet_wire::{TcpFlags, TcpOptions, TcpRepr};

use super::mtu_probe::ProbeDue;
use super::{run_segment, Connection, SegmentSink, State, Wake};
use crate::seq::Seq;
use crate::sg::TxData;
use crate::time::Instant;

/// Most segments one `poll_transmit` call emits (bounds the work per call); a run
/// of full segments (`send_full_run`) counts as one: the send buffer bounds it.
const POLL_BUDGET: usize = 4096;

impl Connection {
    /// Run expired timers, then emit every segment that is due into `sink`. Call after
    /// `input`, after `send`/`recv`/`close`, and whenever `poll_at` is reached.
    pub fn poll_transmit<S: SegmentSink + ?Sized>(&mut self, now: Instant, sink: &mut S) -> Wake {
        self.now = self.now.max(now);
        let readable = self.readable_mark();
        let eof = self.rcv.fin_received;
        let state = self.state;
        self.run_timers();
        let mut budget = POLL_BUDGET;
        let mut blocked_by_window = false;
        self.snd.burst = 0;
        self.snd.piece_end = None;
        let nxt_before = self.snd.nxt;
        let data_waits = self.snd.buf.len() > self.snd.nxt.since(self.snd.una) as usize;
        while budget > 0 {
            match self.transmit_one(sink, &mut blocked_by_window) {
                Some(true) => budget -= 1,
                _ => break,
            }
        }
        if data_waits && self.state.is_synchronized() {
            self.validate_cwnd(nxt_before);
        }
        if self.state.is_synchronized() {
            self.rate_check_app_limited();
        }
        self.chrono_after_transmit();
        // A MSG_MORE write corks its own pass only; a NODELAY flush is one pass.
        self.snd.more_pass = false;
        self.snd.push_once = false;
        self.snd.push_one = false;
        if self.state.is_synchronized() && self.state != State::TimeWait {
            if !self.scoreboard.is_empty() {
                self.arm_rto_if_idle();
            }
            // Persist timer: data waits, nothing is in flight, the window stops us.
            if blocked_by_window && self.scoreboard.is_empty() {
                self.arm_persist();
            }
        }
        let room = self.wmem_after_transmit(self.snd.nxt != nxt_before);
        let mut wake = self.wake_since(readable, eof, state);
        wake.writable |= room;
        wake
    }

    /// Options on every segment after the handshake: timestamps, SACK blocks.
    pub(crate) fn segment_options(&self) -> TcpOptions {
        let mut o = TcpOptions::default();
        if self.ts.ok {
            o.timestamps = Some((self.ts.clock(self.now), self.ts.recent));
        }
        if self.opts.sack {
            self.push_sack_blocks(&mut o);
        }
        o
    }

    /// Options on an RST: the timestamps when the connection uses them (RFC 7323
    /// §3.2: TSopt SHOULD be sent in an <RST> segment), nothing else.
    pub(crate) fn rst_options(&self) -> TcpOptions {
        let mut o = TcpOptions::default();
        if self.ts.ok {
            o.timestamps = Some((self.ts.clock(self.now), self.ts.recent));
        }
        o
    }

    /// Build and emit one segment; on success commit the ACK-related state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        flags: TcpFlags,
        seq: Seq,
        data_off: usize,
        data_len: usize,
        opts: TcpOptions,
    ) -> bool {
        let (repr, ect, adv) = self.segment_repr(flags, seq, data_len, opts);
        let payload = if data_len > 0 {
            self.snd
                .buf
                .payload_at(data_off, data_len, &mut self.tx_spans)
        } else {
            TxData::NONE
        };
        if !sink.emit(self.local, self.remote, &repr, payload, ect) {
            self.stats.rare().tx_sink_full += 1;
            return false;
        }
        self.emitted(&repr, adv, 1);
        true
    }

    /// Build and emit a run of `n` new-data segments of `seg` bytes from `seq`
    /// (`send_full_run`): one header for all, PSH (if `flags` has it) on the last.
    /// Bytes from the send ring go to the sink as one run, and so do pieces of pool
    /// buffers where the sink takes them as one (else one segment at a time, each
    /// cut to its own spans). Returns how many, from
    /// the first, the sink took; their ACK-related state is committed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit_run<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        flags: TcpFlags,
        seq: Seq,
        data_off: usize,
        seg: usize,
        n: usize,
        opts: TcpOptions,
    ) -> usize {
        let (repr, ect, adv) = self.segment_repr(flags, seq, seg, opts);
        let (local, remote) = (self.local, self.remote);
        let whole = self
            .snd
            .buf
            .payload_at(data_off, n * seg, &mut self.tx_spans);
        let by_sink = match whole {
            TxData::Bytes(a, b) => Some(sink.emit_run(local, remote, &repr, (a, b), seg, n, ect)),
            TxData::Bufs { spans, .. } => {
                sink.emit_span_run(local, remote, &repr, spans, seg, n, ect)
            }
        };
        let sent = if let Some(sent) = by_sink {
            sent
        } else {
            let mut k = 0;
            while k < n {
                let r = run_segment(&repr, seg, k, n);
                let payload = self
                    .snd
                    .buf
                    .payload_at(data_off + k * seg, seg, &mut self.tx_spans);
                if !sink.emit(local, remote, &r, payload, ect) {
                    break;
                }
                k += 1;
            }
            k
        };
        if sent < n {
            self.stats.rare().tx_sink_full += 1;
        }
        if sent > 0 {
            self.emitted(&repr, adv, sent);
        }
        sent
    }

    /// The header of a segment from `seq` with `data_len` bytes: ECN bits and the
    /// window filled in. Also whether it is ECT and the right edge it advertises.
    fn segment_repr(
        &self,
        flags: TcpFlags,
        seq: Seq,
        data_len: usize,
        opts: TcpOptions,
    ) -> (TcpRepr, bool, Seq) {
        let syn = flags.syn();
        let ect = self.ecn_ect(flags, seq, data_len);
        let flags = flags | self.ecn_flags(flags, ect);
        let (window, adv) = if flags.rst() {
            (0, self.rcv.adv)
        } else {
            self.window_field(syn)
        };
        let repr = TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq: seq.0,
            ack: if flags.ack() { self.rcv.nxt.0 } else { 0 },
            flags,
            window,
            urgent: 0,
            options: opts,
        };
        (repr, ect, adv)
    }

    /// `count` segments with the header `repr` (but for their sequence numbers)
    /// went out: the counters and the ACK-related state take them.
    fn emitted(&mut self, repr: &TcpRepr, adv: Seq, count: usize) {
        let flags = repr.flags;
        let count = count as u64;
        self.ecn_sent(flags, Seq(repr.seq));
        self.stats.tx_segments += count;
        if repr.window == 0 && !flags.rst() {
            self.stats.tx_zero_window += count;
        }
        let nsack = repr.options.sacks().len() as u64;
        if nsack > 0 {
            self.stats.tx_sack_blocks += nsack * count;
        }
        if flags.ack() && !flags.rst() {
            self.on_ack_sent(adv, nsack > 0);
        }
        self.snd.last_tx = self.now;
    }

    /// Emit the one segment that is most urgent, in this order: an RST (abort), an
    /// RST answering a bad segment, the SYN or SYN-ACK, then (once synchronized and
    /// not in TIME-WAIT) a retransmission, a tail loss probe, new data, a window
    /// probe, a keepalive probe, and last a pure ACK. `Some(true)`: sent;
    /// `Some(false)`: the sink is full; None: nothing is due.
    fn transmit_one<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        blocked_by_window: &mut bool,
    ) -> Option<bool> {
        if self.rst_pending {
            return Some(self.send_abort_rst(sink));
        }
        if let Some((seq, ack)) = self.reply_rst {
            return Some(self.send_reply_rst(sink, seq, ack));
        }
        match self.state {
            State::Closed => return None,
            State::SynSent => return self.send_syn(sink),
            State::SynReceived => {
                // A Fast Open child goes on to its data once the SYN-ACK is out.
                let r = self.send_syn(sink);
                if r.is_some() {
                    return r;
                }
                if !self.syn.tfo_child {
                    // An ACK owed while the SYN-ACK is not due (an unacceptable
                    // segment, a PAWS reject, a challenge): a bare ACK at ISS+1, as
                    // Linux's request socket sends. Left pending, `poll_at` would say
                    // "now" for ever and the stack's loop would never sleep.
                    if self.ack.pending || self.ack.dupacks_owed > 0 {
                        return Some(self.send_pure_ack(sink));
                    }
                    return None;
                }
            }
            _ => {}
        }
        // A paced sender waits for its departure time with data (new, resent or a
        // probe); window probes, keepalives and ACKs are not paced.
        let paced = self.state != State::TimeWait && self.paced_out();
        if self.state != State::TimeWait && !paced {
            if self.scoreboard.lost_segs() > 0 {
                if let Some(sent) = self.retransmit_lost(sink) {
                    return Some(sent);
                }
            }
            if self.recovery.tlp_pending {
                self.recovery.tlp_pending = false;
                if let Some(sent) = self.send_tlp(sink) {
                    return Some(sent);
                }
            }
            // A path MTU probe goes before new data; while one waits for room, new
            // data waits too.
            let probe = self.mtu_probe_due();
            if let ProbeDue::Send(len) = probe {
                if let Some(sent) = self.send_mtu_probe(sink, len, blocked_by_window) {
                    return Some(sent);
                }
            }
            // The persist timer fired and the window is open again: what fits goes
            // out regardless of Nagle and SWS rules.
            let force = self.snd.persist_pending && self.snd.wnd > 0;
            let new_data = if probe == ProbeDue::Wait && !force {
                None
            } else {
                self.send_new_data(sink, force, blocked_by_window)
            };
            match new_data {
                Some(true) => {
                    if force {
                        self.snd.persist_pending = false;
                    }
                    return Some(true);
                }
                Some(false) => return Some(false),
                None => {}
            }
            if self.snd.persist_pending {
                return Some(self.send_window_probe(sink, blocked_by_window));
            }
            if self.keepalive.pending {
                return Some(self.send_keepalive_probe(sink));
            }
        }
        if self.ack.pending || self.ack.dupacks_owed > 0 {
            return Some(self.send_pure_ack(sink));
        }
        None
    }

    /// One path MTU probe of `len` bytes of new data: a new-data segment past the
    /// MSS, whose Nagle, window and piece rules `mtu_probe_due` replaced.
    fn send_mtu_probe<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        len: usize,
        blocked_by_window: &mut bool,
    ) -> Option<bool> {
        let start = self.snd.nxt;
        self.mtup.sending = Some(len);
        let r = self.send_new_data(sink, true, blocked_by_window);
        self.mtup.sending = None;
        if r == Some(true) {
            let sent = self.snd.nxt.since(start);
            self.mtu_probe_sent(start, sent);
            // The next piece is cut afresh behind the probe.
            self.snd.piece_end = None;
        }
        r
    }

    /// The RST of an abort (or of a reset decided on input); then CLOSED.
    fn send_abort_rst<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> bool {
        let flags = if self.state.is_synchronized() || self.state == State::SynReceived {
            TcpFlags::RST | TcpFlags::ACK
        } else {
            TcpFlags::RST
        };
        let opts = self.rst_options();
        if !self.emit(sink, flags, self.snd.nxt, 0, 0, opts) {
            return false;
        }
        self.stats.rare().tx_rst += 1;
        self.rst_pending = false;
        self.enter_closed(None);
        true
    }

    /// An RST in reply to an unacceptable segment: `<SEQ=seq>`, with `<ACK=ack>` if
    /// given. The connection stays as it is.
    fn send_reply_rst<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        seq: Seq,
        ack: Option<Seq>,
    ) -> bool {
        let (flags, saved) = match ack {
            Some(a) => (
                TcpFlags::RST | TcpFlags::ACK,
                Some(std::mem::replace(&mut self.rcv.nxt, a)),
            ),
            None => (TcpFlags::RST, None),
        };
        let opts = self.rst_options();
        let ok = self.emit(sink, flags, seq, 0, 0, opts);
        if let Some(s) = saved {
            self.rcv.nxt = s;
        }
        if !ok {
            return false;
        }
        self.stats.rare().tx_rst += 1;
        self.reply_rst = None;
        true
    }

    /// An ACK without data at SND.NXT.
    fn send_pure_ack<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> bool {
        let opts = self.segment_options();
        if !self.emit(sink, TcpFlags::ACK, self.snd.nxt, 0, 0, opts) {
            return false;
        }
        self.stats.tx_acks += 1;
        self.ack.pending = false;
        true
    }

    /// How long until the next timer (for tests and tools).
    pub fn next_timeout(&self) -> Option<Duration> {
        self.poll_at().map(|t| t.saturating_since(self.now))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::timers::Timer;
    use super::*;
    use crate::testing::VecSink;
    use crate::TcpConfig;

    #[test]
    fn a_full_sink_commits_nothing_and_the_next_poll_retries() {
        let (mut cli, _srv) = default_pair();
        cli.send(&vec![1u8; 3 * MSS]);
        let mut full = VecSink {
            refuse: true,
            ..VecSink::default()
        };
        cli.poll_transmit(T0, &mut full);
        assert!(full.segments.is_empty());
        assert_eq!(cli.snd.nxt, cli.snd.una, "nothing counted as sent");
        assert!(cli.scoreboard.is_empty());
        assert_eq!(cli.stats().tx_sink_full, 1);
        let out = drain(&mut cli, T0);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].repr.seq, cli.snd.una.0);
    }

    #[test]
    fn an_abort_rst_goes_before_anything_else() {
        let (mut cli, _srv) = default_pair();
        cli.send(b"queued");
        cli.ack.pending = true;
        cli.abort();
        let out = drain(&mut cli, T0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.flags, TcpFlags::RST | TcpFlags::ACK);
        assert_eq!(out[0].repr.window, 0);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.poll_at(), None);
    }

    #[test]
    fn an_rst_carries_timestamps_when_they_were_negotiated() {
        // RFC 7323 §3.2 (ts_recent/reset_tsval.pkt).
        let (mut cli, _srv) = default_pair();
        let later = T0 + ms(1000);
        drain(&mut cli, later);
        cli.abort();
        let rst = drain(&mut cli, later).remove(0);
        assert!(rst.repr.flags.rst());
        assert_eq!(
            rst.repr.options.timestamps,
            Some((cli.ts.clock(later), cli.ts.recent))
        );
        assert_eq!(rst.repr.options.sack_count, 0, "nothing else");

        let cfg = TcpConfig {
            timestamps: false,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg.clone(), cfg);
        cli.abort();
        let rst = drain(&mut cli, T0).remove(0);
        assert_eq!(rst.repr.options.timestamps, None);
    }

    #[test]
    fn every_segment_carries_timestamps_and_the_current_ack() {
        let (mut cli, mut srv) = default_pair();
        srv.send(b"reply");
        feed(&mut cli, T0, &drain(&mut srv, T0));
        cli.send(b"data");
        let out = drain(&mut cli, T0 + ms(5));
        assert_eq!(out.len(), 1, "the ACK rides on the data");
        let r = &out[0].repr;
        assert_eq!(r.ack, cli.rcv.nxt.0);
        let (val, ecr) = r.options.timestamps.unwrap();
        assert_eq!(val, cli.ts.clock(T0 + ms(5)));
        assert_eq!(ecr, cli.ts.recent);
        assert!(!cli.ack.pending && !cli.timers.is_armed(Timer::DelayedAck));
    }

    #[test]
    fn poll_at_is_now_while_output_is_pending() {
        let (mut cli, _srv) = default_pair();
        assert_eq!(cli.poll_at(), None, "idle");
        cli.ack.pending = true;
        assert_eq!(cli.poll_at(), Some(T0));
        drain(&mut cli, T0);
        assert_eq!(cli.poll_at(), None);
        assert_eq!(cli.next_timeout(), None);
    }
}
