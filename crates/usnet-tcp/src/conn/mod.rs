//! One TCP connection (a TCB): RFC 9293 state machine, send/receive buffers, SACK
//! scoreboard, RACK-TLP, congestion control and timers. Pure and deterministic: time
//! is passed in, segments come in through [`Connection::input`] and go out through a
//! [`SegmentSink`] in [`Connection::poll_transmit`].

mod icmp;
mod input;
mod keepalive;
mod output;
mod recovery;
mod recv;
mod rtt;
mod scoreboard;
mod send;
#[cfg(test)]
mod test_util;
mod timers;

pub use icmp::{IcmpError, IcmpOutcome};

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_wire::{TcpFlags, TcpHeader, TcpOptions, TcpRepr};

use crate::cc::CongestionControl;
use crate::config::TcpConfig;
use crate::hash::{initial_sequence, tuple_hash};
use crate::payload::Payload;
use crate::seq::Seq;
use crate::stats::TcpStats;
use crate::time::Instant;
use keepalive::KeepaliveState;
use recovery::Recovery;
use recv::{AckState, RecvState};
use rtt::RttEstimator;
use scoreboard::Scoreboard;
use send::SendState;
use timers::{Timer, Timers};

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

/// Why a connection ended abnormally. The stack maps it to its own error type, whose
/// errno table is the only one (`usnet_stack::StackError::errno`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpError {
    /// RST in answer to our SYN (ECONNREFUSED).
    Refused,
    /// RST from the peer (ECONNRESET).
    Reset,
    /// Retransmissions or keepalives unanswered (ETIMEDOUT).
    TimedOut,
    /// Aborted locally (linger timeout, close with unread data) (ECONNABORTED).
    Aborted,
    /// ICMP host unreachable (or administratively prohibited) (EHOSTUNREACH).
    HostUnreachable,
    /// ICMP network unreachable (ENETUNREACH).
    NetUnreachable,
}

/// A received segment as the engine needs it: the TCP header fields plus payload.
/// Build it from a parsed header with `Segment::from(&hdr)`.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Control bits.
    pub flags: TcpFlags,
    /// Window field (unscaled).
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Parsed options.
    pub options: TcpOptions,
    /// Payload: one slice, or the joined payloads of a coalesced frame.
    pub payload: Payload<'a>,
    /// For a frame the device coalesced from several wire segments (GRO, or a GSO
    /// frame from a TAP), the size of those segments; 0 for an ordinary segment. It
    /// keeps the receiver's idea of the peer's MSS (and so its ACK pacing) right, and
    /// per-segment counters count wire segments.
    pub gso_size: u16,
}

impl<'a> From<&TcpHeader<'a>> for Segment<'a> {
    fn from(h: &TcpHeader<'a>) -> Self {
        Segment {
            seq: h.seq,
            ack: h.ack,
            flags: h.flags,
            window: h.window,
            urgent: h.urgent,
            options: h.options,
            payload: Payload::new(h.payload),
            gso_size: 0,
        }
    }
}

impl Segment<'_> {
    /// Sequence space used.
    pub fn seg_len(&self) -> u32 {
        self.payload.len() as u32 + u32::from(self.flags.syn()) + u32::from(self.flags.fin())
    }

    /// The wire segments this one stands for: `payload / gso_size` rounded up for a
    /// coalesced frame, else 1.
    pub fn wire_segments(&self) -> u32 {
        let g = usize::from(self.gso_size);
        if g == 0 || self.payload.len() <= g {
            1
        } else {
            self.payload.len().div_ceil(g) as u32
        }
    }
}

/// Where outgoing segments go. The stack implements this by taking a pool buffer,
/// copying the payload slices behind the headroom and emitting `repr` in front of it.
pub trait SegmentSink {
    /// Emit one segment from `local` to `remote`; the payload is the concatenation of
    /// the two slices (the send ring may wrap). Return false if it cannot be sent now
    /// (no buffer): the engine leaves its state as if nothing was sent and stops.
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
    ) -> bool;
}

/// What changed in an `input` or `poll_transmit` call, for waking the application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wake {
    /// New data or EOF can be read.
    pub readable: bool,
    /// Send-buffer space was freed.
    pub writable: bool,
    /// The connection reached CLOSED, TIME-WAIT or an error.
    pub closed: bool,
}

/// A snapshot like Linux's `struct tcp_info`.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpInfo {
    /// State.
    pub state: State,
    /// Smoothed RTT.
    pub srtt: Option<Duration>,
    /// RTT variance.
    pub rttvar: Duration,
    /// Minimum RTT seen.
    pub min_rtt: Option<Duration>,
    /// Current RTO (without back-off).
    pub rto: Duration,
    /// Back-off exponent.
    pub backoff: u32,
    /// Congestion window, bytes.
    pub cwnd: u32,
    /// Slow-start threshold, bytes.
    pub ssthresh: u32,
    /// Sender MSS (payload, options excluded).
    pub snd_mss: u32,
    /// Largest payload seen from the peer.
    pub rcv_mss: u32,
    /// Unacknowledged bytes (SND.NXT - SND.UNA).
    pub bytes_in_flight: u32,
    /// RFC 6675 pipe.
    pub pipe: u32,
    /// Bytes selectively acknowledged.
    pub sacked_bytes: u32,
    /// Segments marked lost and not yet retransmitted.
    pub lost_segments: u32,
    /// Peer's window, bytes (scaled).
    pub snd_wnd: u32,
    /// Window we advertise, bytes.
    pub rcv_wnd: u32,
    /// Current receive-window limit (autotuning).
    pub rcv_space: u32,
    /// Segments retransmitted so far.
    pub total_retransmits: u64,
    /// Fast-recovery episodes.
    pub fast_recoveries: u64,
    /// RTO expiries.
    pub rto_expiries: u64,
    /// SACK blocks received.
    pub sack_blocks: u64,
    /// Whether the connection is in loss recovery.
    pub in_recovery: bool,
    /// Congestion control in use.
    pub congestion: &'static str,
    /// Window scaling negotiated (send shift, receive shift).
    pub wscale: Option<(u8, u8)>,
    /// Timestamps negotiated.
    pub timestamps: bool,
    /// SACK negotiated.
    pub sack: bool,
    /// Unread bytes in the receive buffer.
    pub recv_queued: usize,
    /// Unacknowledged + unsent bytes in the send buffer.
    pub send_queued: usize,
}

/// Listener-negotiated parameters that a passively opened connection starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handshake {
    pub iss: Seq,
    pub irs: Seq,
    pub peer_mss: u16,
    /// Peer's window shift, if both sides do window scaling.
    pub peer_wscale: Option<u8>,
    pub sack: bool,
    /// Peer's TSval from the SYN, if timestamps are on.
    pub ts_recent: Option<u32>,
    /// When the (last) SYN-ACK went out, and how many times it was sent (for an RTT
    /// sample under Karn's rule).
    pub synack_sent: Instant,
    pub synack_xmits: u32,
}

/// A TCP connection.
pub struct Connection {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) state: State,
    pub(crate) cfg: TcpConfig,
    pub(crate) error: Option<TcpError>,
    /// An ICMP error since the last new ACK, reported if the connection times out.
    pub(crate) soft_error: Option<TcpError>,
    pub(crate) now: Instant,

    pub(crate) snd: SendState,
    pub(crate) scoreboard: Scoreboard,

    pub(crate) rcv: RecvState,
    pub(crate) ack: AckState,

    // ---- options
    pub(crate) ws_ok: bool,
    pub(crate) ts_ok: bool,
    pub(crate) sack_ok: bool,
    pub(crate) ts_recent: u32,
    pub(crate) ts_recent_at: Instant,
    pub(crate) ts_offset: u32,

    // ---- timers
    pub(crate) rtt: RttEstimator,
    pub(crate) timers: Timers,
    pub(crate) keepalive: KeepaliveState,

    // ---- pending output
    pub(crate) syn_pending: bool,
    pub(crate) rst_pending: bool,
    /// An RST to send in reply to an unacceptable segment: (seq, ack).
    pub(crate) reply_rst: Option<(Seq, Option<Seq>)>,
    pub(crate) challenge_count: u32,
    pub(crate) challenge_window: Instant,
    pub(crate) syn_xmits: u32,
    pub(crate) syn_sent_at: Instant,

    // ---- recovery and congestion control
    pub(crate) recovery: Recovery,
    pub(crate) cc: Box<dyn CongestionControl>,
    /// The application called `close()` (not just `shutdown_write`).
    pub(crate) app_closed: bool,
    pub(crate) stats: TcpStats,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("state", &self.state)
            .field("snd_una", &self.snd.una)
            .field("snd_nxt", &self.snd.nxt)
            .field("rcv_nxt", &self.rcv.nxt)
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn blank(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: TcpConfig,
        iss: Seq,
    ) -> Self {
        let mss = u32::from(cfg.mss.max(64));
        let ts_offset = if cfg.ts_random_offset {
            tuple_hash(cfg.secret, local, remote, b"ts") as u32
        } else {
            0
        };
        let cc = cfg.congestion.build(mss, cfg.initial_window);
        Connection {
            local,
            remote,
            state: State::Closed,
            error: None,
            soft_error: None,
            now,
            snd: SendState::new(iss, cfg.send_buffer, remote, now),
            scoreboard: Scoreboard::new(cfg.send_buffer),
            rcv: RecvState::new(&cfg, mss, now),
            ack: AckState::new(cfg.quickack_segments),
            ws_ok: false,
            ts_ok: false,
            sack_ok: false,
            ts_recent: 0,
            ts_recent_at: now,
            ts_offset,
            rtt: RttEstimator::new(cfg.initial_rto),
            timers: Timers::default(),
            keepalive: KeepaliveState::new(now),
            syn_pending: false,
            rst_pending: false,
            reply_rst: None,
            challenge_count: 0,
            challenge_window: now,
            syn_xmits: 0,
            syn_sent_at: now,
            recovery: Recovery::new(iss),
            cc,
            app_closed: false,
            stats: TcpStats::default(),
            cfg,
        }
    }

    /// Active open: a connection in SYN-SENT whose SYN goes out on the next
    /// `poll_transmit`. The ISN follows RFC 6528.
    pub fn connect(local: SocketAddr, remote: SocketAddr, now: Instant, cfg: TcpConfig) -> Self {
        let iss = Seq(initial_sequence(cfg.secret, local, remote, now.as_nanos()));
        let mut c = Connection::blank(local, remote, now, cfg, iss);
        c.state = State::SynSent;
        c.snd.nxt = iss + 1u32;
        c.syn_pending = true;
        c.rcv.wscale = if c.cfg.window_scaling {
            c.cfg.rcv_wscale()
        } else {
            0
        };
        c
    }

    /// A passively opened connection in SYN-RECEIVED whose SYN-ACK the listener has
    /// sent; the listener feeds it the completing ACK next.
    pub(crate) fn from_handshake(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: TcpConfig,
        h: Handshake,
    ) -> Self {
        let mut c = Connection::blank(local, remote, now, cfg, h.iss);
        c.state = State::SynReceived;
        c.snd.nxt = h.iss + 1u32;
        c.rcv.irs = h.irs;
        c.rcv.nxt = h.irs + 1u32;
        c.snd.wl1 = h.irs;
        c.ack.last_sent = c.rcv.nxt;
        c.set_peer_mss(Some(h.peer_mss));
        if let Some(ws) = h.peer_wscale {
            c.ws_ok = true;
            c.snd.wscale = ws;
            c.rcv.wscale = c.cfg.rcv_wscale();
        }
        c.sack_ok = h.sack;
        if let Some(ts) = h.ts_recent {
            c.ts_ok = true;
            c.ts_recent = ts;
            c.ts_recent_at = now;
        }
        // The SYN-ACK advertised an unscaled window of at most 65535.
        let w = c.rcv_window_available().min(65535);
        c.rcv.adv = c.rcv.nxt + w;
        c.syn_xmits = h.synack_xmits;
        c.syn_sent_at = h.synack_sent;
        c
    }

    // ------------------------------------------------------------ accessors

    /// Local address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }
    /// Remote address.
    pub fn remote(&self) -> SocketAddr {
        self.remote
    }
    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }
    /// The error that ended the connection, if any.
    pub fn error(&self) -> Option<TcpError> {
        self.error
    }
    /// Counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }
    /// The configuration in force.
    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }
    /// Our initial sequence number.
    pub fn iss(&self) -> u32 {
        self.snd.iss.0
    }
    /// The peer's initial sequence number (valid once a SYN was received).
    pub fn irs(&self) -> u32 {
        self.rcv.irs.0
    }

    /// A `tcp_info`-like snapshot.
    pub fn info(&self) -> TcpInfo {
        TcpInfo {
            state: self.state,
            srtt: self.rtt.srtt,
            rttvar: self.rtt.rttvar,
            min_rtt: self.rtt.min_rtt,
            rto: self.rtt.rto,
            backoff: self.rtt.backoff,
            cwnd: self.cc.cwnd(),
            ssthresh: self.cc.ssthresh(),
            snd_mss: self.smss(),
            rcv_mss: self.rcv.mss,
            bytes_in_flight: self.snd.nxt.since(self.snd.una),
            pipe: self.scoreboard.pipe(),
            sacked_bytes: self.scoreboard.sacked_bytes(),
            lost_segments: self.scoreboard.lost_segs(),
            snd_wnd: self.snd.wnd,
            rcv_wnd: self.rcv.adv.since(self.rcv.nxt),
            rcv_space: self.rcv.space as u32,
            total_retransmits: self.stats.retransmit_segments,
            fast_recoveries: self.stats.fast_recoveries,
            rto_expiries: self.stats.rto_expired,
            sack_blocks: self.stats.rx_sack_blocks,
            in_recovery: self.recovery.in_recovery(),
            congestion: self.cc.name(),
            wscale: self.ws_ok.then_some((self.snd.wscale, self.rcv.wscale)),
            timestamps: self.ts_ok,
            sack: self.sack_ok,
            recv_queued: self.rcv.buf.len(),
            send_queued: self.snd.buf.len(),
        }
    }

    // ------------------------------------------------------------ options

    /// TCP_NODELAY.
    pub fn set_nodelay(&mut self, on: bool) {
        self.cfg.nodelay = on;
    }
    /// SO_LINGER.
    pub fn set_linger(&mut self, linger: Option<Duration>) {
        self.cfg.linger = linger;
    }
    /// Replace the congestion controller (TCP_CONGESTION); takes effect at once.
    pub fn set_congestion_control(&mut self, cc: Box<dyn CongestionControl>) {
        self.cc = cc;
    }
    /// Lower the sender MSS (path MTU decrease). Never raises it above the
    /// negotiated value.
    pub fn clamp_mss(&mut self, mss: u16) {
        if mss < self.cfg.mss {
            self.cfg.mss = mss.max(64);
        }
    }

    // ------------------------------------------------------------ application data

    // ------------------------------------------------------------ closing

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
                self.stats.rx_after_close += 1;
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
        if self.state == State::FinWait2 && !self.timers.is_armed(Timer::Close) {
            self.timers
                .set(Timer::Close, self.now + self.cfg.fin_wait2_timeout);
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
        self.stats.conn_aborts += 1;
    }

    /// RFC 6191 / RFC 9293 §3.6.1: may a SYN for this 4-tuple, arriving while this
    /// connection is in TIME-WAIT, start a new incarnation? True if its timestamp (or,
    /// without timestamps, its sequence number) is newer than this incarnation's.
    /// The stack then drops this connection and hands the SYN to the listener.
    pub fn time_wait_accepts_syn(&self, seg: &Segment) -> bool {
        if self.state != State::TimeWait || !seg.flags.syn() || seg.flags.ack() {
            return false;
        }
        match (self.ts_ok, seg.options.timestamps) {
            (true, Some((tsval, _))) => (tsval.wrapping_sub(self.ts_recent) as i32) > 0,
            _ => Seq(seg.seq).gt(self.rcv.nxt),
        }
    }

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
        self.syn_pending = false;
        self.recovery.tlp_pending = false;
        self.snd.persist_pending = false;
        self.keepalive.pending = false;
    }

    pub(crate) fn enter_time_wait(&mut self) {
        self.state = State::TimeWait;
        self.stats.time_wait_entered += 1;
        self.timers.clear_all();
        self.timers.set(Timer::Close, self.now + self.cfg.time_wait);
        self.scoreboard.clear();
    }

    /// The next time `poll_transmit` has timer work to do (or `now` if it has output
    /// pending), or None.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.ack.pending
            || self.ack.dupacks_owed > 0
            || self.rst_pending
            || self.reply_rst.is_some()
            || (self.syn_pending && self.syn_xmits == 0)
        {
            return Some(self.now);
        }
        self.timers.next()
    }

    /// Timestamp clock value for now (ms + per-connection offset).
    pub(crate) fn ts_now(&self) -> u32 {
        (self.now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// RTO with back-off.
    pub(crate) fn rto_backed_off(&self) -> Duration {
        self.rtt.backed_off(self.cfg.max_rto)
    }

    /// Rate-limited challenge ACK (RFC 5961 §7, per connection).
    pub(crate) fn challenge_ack(&mut self) {
        if self.now.saturating_since(self.challenge_window) >= Duration::from_secs(1) {
            self.challenge_window = self.now;
            self.challenge_count = 0;
        }
        if self.challenge_count < self.cfg.challenge_ack_limit {
            self.challenge_count += 1;
            self.ack.pending = true;
            self.stats.tx_challenge_acks += 1;
        } else {
            self.stats.challenge_acks_limited += 1;
        }
    }

    /// Check the scoreboard's cached counters against a recount (tests).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.scoreboard.check(self.snd.una, self.snd.nxt)
    }
}
