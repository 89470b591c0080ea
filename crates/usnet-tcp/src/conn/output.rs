//! Segment departure and timers: SYN/SYN-ACK, retransmissions from the scoreboard,
//! tail loss probes, new data under the congestion and peer windows (Nagle, sender
//! SWS avoidance), FIN, window probes, keepalives, pure ACKs; the RTO, delayed-ACK,
//! persist, keepalive, RACK reordering, TLP and TIME-WAIT/linger timers.

use std::time::Duration;

use usnet_wire::{TcpFlags, TcpOptions, TcpRepr};

use super::timers::Timer;
use super::{Connection, SegmentSink, State, TcpError, Wake};
use crate::seq::Seq;
use crate::time::Instant;

/// Most segments one `poll_transmit` call emits (bounds the work per call).
const POLL_BUDGET: usize = 4096;

impl Connection {
    /// Run expired timers, then emit every segment that is due into `sink`. Call after
    /// `input`, after `send`/`recv`/`close`, and whenever `poll_at` is reached.
    pub fn poll_transmit<S: SegmentSink + ?Sized>(&mut self, now: Instant, sink: &mut S) -> Wake {
        self.now = self.now.max(now);
        let readable = self.recv_available();
        let eof = self.rcv.fin_received;
        let free = self.snd.buf.free();
        let state = self.state;
        self.run_timers();
        let mut budget = POLL_BUDGET;
        let mut blocked_by_window = false;
        while budget > 0 {
            match self.transmit_one(sink, &mut blocked_by_window) {
                Some(true) => budget -= 1,
                _ => break,
            }
        }
        if self.state.is_synchronized() && self.state != State::TimeWait {
            if !self.scoreboard.is_empty() && !self.timers.is_armed(Timer::Rto) {
                self.timers
                    .set(Timer::Rto, self.now + self.rto_backed_off());
            }
            // Persist timer: data waits, nothing is in flight, the window stops us.
            if blocked_by_window && self.scoreboard.is_empty() {
                self.arm_persist();
            }
        }
        self.wake_since(readable, eof, free, state)
    }

    /// Close timer: TIME-WAIT is over, an orphan waited too long in FIN-WAIT-2, or
    /// the linger time ran out (abort).
    pub(crate) fn on_close_timer(&mut self) {
        match self.state {
            State::TimeWait => self.enter_closed(None),
            State::Closed => {}
            State::FinWait2 if self.app_closed => {
                self.stats.fin_wait2_timeouts += 1;
                self.enter_closed(None);
            }
            _ => {
                self.stats.linger_timeouts += 1;
                self.error = Some(TcpError::Aborted);
                self.rst_pending = true;
            }
        }
    }

    /// The SYN or SYN-ACK was not answered: send it again, or give up after
    /// `syn_retries` / `synack_retries`.
    pub(crate) fn on_syn_timeout(&mut self) {
        let limit = if self.state == State::SynSent {
            self.cfg.syn_retries
        } else {
            self.cfg.synack_retries
        };
        if self.syn_xmits > limit {
            self.stats.conn_timeouts += 1;
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        self.rtt.backoff += 1;
        self.syn_pending = true;
        self.stats.syn_retransmits += 1;
    }

    /// Options for a segment (SYN options when `syn`).
    pub(crate) fn options(&self, syn: bool, synack: bool) -> TcpOptions {
        let mut o = TcpOptions::default();
        if syn {
            o.mss = Some(self.cfg.mss);
            let ws = if synack {
                self.ws_ok
            } else {
                self.cfg.window_scaling
            };
            if ws {
                o.window_scale = Some(self.rcv.wscale);
            }
            o.sack_permitted = if synack { self.sack_ok } else { self.cfg.sack };
            let ts = if synack {
                self.ts_ok
            } else {
                self.cfg.timestamps
            };
            if ts {
                o.timestamps = Some((self.ts_now(), if synack { self.ts_recent } else { 0 }));
            }
            return o;
        }
        if self.ts_ok {
            o.timestamps = Some((self.ts_now(), self.ts_recent));
        }
        if self.sack_ok {
            self.push_sack_blocks(&mut o);
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
        let syn = flags.syn();
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
        let payload = if data_len > 0 {
            self.snd.buf.slices(data_off, data_len)
        } else {
            (&[][..], &[][..])
        };
        if !sink.emit(self.local, self.remote, &repr, payload) {
            self.stats.tx_sink_full += 1;
            return false;
        }
        self.stats.tx_segments += 1;
        if window == 0 && !flags.rst() {
            self.stats.tx_zero_window += 1;
        }
        let nsack = opts.sacks().len() as u64;
        if nsack > 0 {
            self.stats.tx_sack_blocks += nsack;
        }
        if flags.ack() && !flags.rst() {
            self.on_ack_sent(adv, nsack > 0);
        }
        self.snd.last_tx = self.now;
        true
    }

    /// Emit one segment if one is due. `Some(true)`: sent; `Some(false)`/None: nothing
    /// more now (or the sink is full).
    fn transmit_one<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        blocked_by_window: &mut bool,
    ) -> Option<bool> {
        if self.rst_pending {
            let flags = if self.state.is_synchronized() || self.state == State::SynReceived {
                TcpFlags::RST | TcpFlags::ACK
            } else {
                TcpFlags::RST
            };
            if !self.emit(sink, flags, self.snd.nxt, 0, 0, TcpOptions::default()) {
                return Some(false);
            }
            self.stats.tx_rst += 1;
            self.rst_pending = false;
            self.enter_closed(None);
            return Some(true);
        }
        if let Some((seq, ack)) = self.reply_rst {
            let (flags, saved) = match ack {
                Some(a) => (
                    TcpFlags::RST | TcpFlags::ACK,
                    Some(std::mem::replace(&mut self.rcv.nxt, a)),
                ),
                None => (TcpFlags::RST, None),
            };
            let ok = self.emit(sink, flags, seq, 0, 0, TcpOptions::default());
            if let Some(s) = saved {
                self.rcv.nxt = s;
            }
            if !ok {
                return Some(false);
            }
            self.stats.tx_rst += 1;
            self.reply_rst = None;
            return Some(true);
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived => {
                if !self.syn_pending {
                    return None;
                }
                let synack = self.state == State::SynReceived;
                let flags = if synack {
                    TcpFlags::SYN | TcpFlags::ACK
                } else {
                    TcpFlags::SYN
                };
                let opts = self.options(true, synack);
                if !self.emit(sink, flags, self.snd.iss, 0, 0, opts) {
                    return Some(false);
                }
                self.syn_pending = false;
                self.syn_xmits += 1;
                self.syn_sent_at = self.now;
                self.timers
                    .set(Timer::Rto, self.now + self.rto_backed_off());
                return Some(true);
            }
            _ => {}
        }
        if self.state != State::TimeWait {
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
            let force = self.snd.persist_pending && self.snd.wnd > 0;
            match self.send_new_data(sink, force, blocked_by_window) {
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
            if !self.emit(
                sink,
                TcpFlags::ACK,
                self.snd.nxt,
                0,
                0,
                self.options(false, false),
            ) {
                return Some(false);
            }
            self.stats.tx_acks += 1;
            self.ack.pending = false;
            return Some(true);
        }
        None
    }

    /// How long until the next timer (for tests and tools).
    pub fn next_timeout(&self) -> Option<Duration> {
        self.poll_at().map(|t| t.saturating_since(self.now))
    }
}
