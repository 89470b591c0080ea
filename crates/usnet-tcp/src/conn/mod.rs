//! One TCP connection (a TCB). Pure and deterministic: time is passed in, segments
//! come in through [`Connection::input`] and go out through a [`SegmentSink`] in
//! [`Connection::poll_transmit`]. The connection is split by mechanism, each module
//! owning its part of the state:
//!
//! - `state`: the state machine and segment arrival, step by step (RFC 9293 §3.10.7)
//! - `handshake`: opening, option negotiation, SYN/SYN-ACK
//! - `send` / `recv`: the two directions' sequence variables, buffers and windows
//! - `scoreboard` / `recovery`: what is in flight, loss detection and recovery
//! - `rtt`, `timestamps`, `keepalive`: estimators and probes
//! - `timers`: every deadline in one table; `transmit`: what goes out next
//! - `icmp`: ICMP errors about this connection; `mtu_probe`: path MTU probing
//! - `rate`: delivery-rate samples for the controller; `pacing`: departure times

mod chrono;
mod ecn;
mod handshake;
mod icmp;
mod keepalive;
mod mtu_probe;
mod pacing;
mod rate;
mod recovery;
mod recv;
mod rtt;
mod scoreboard;
mod send;
mod state;
#[cfg(test)]
mod test_util;
mod timers;
mod timestamps;
mod transmit;
mod tso;
mod wmem;

pub(crate) use handshake::Handshake;
pub use icmp::{IcmpError, IcmpOutcome};
pub use state::State;
pub use wmem::{sndbuf_for_option, CHUNK_OVERHEAD, MIN_SNDBUF};

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use usnet_wire::{TcpFlags, TcpHeader, TcpOptions, TcpRepr};

use crate::cc::CongestionControl;
use crate::config::TcpConfig;
use crate::hash::tuple_hash;
use crate::payload::Payload;
use crate::seq::Seq;
use crate::sg::{BufSpan, TxData};
use crate::stats::{ConnStats, TcpStats};
use crate::time::Instant;
use chrono::{Chrono, Chronos};
use ecn::EcnState;
use handshake::{Negotiated, SynState};
use keepalive::KeepaliveState;
use mtu_probe::MtuProbe;
use pacing::Pacing;
use rate::RateState;
use recovery::Recovery;
use recv::{AckState, RecvState};
use rtt::RttEstimator;
use scoreboard::Scoreboard;
use send::SendState;
use state::ChallengeLimiter;
use timers::Timers;
use timestamps::Timestamps;
use wmem::Wmem;

/// Why a connection ended abnormally. The stack maps it to its own error type, and
/// that to an errno (`usnet_stack::StackError::errno`).
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
    /// The IP header's ECN field said CE (Congestion Experienced).
    pub ce: bool,
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
            ce: false,
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
    /// Emit one segment from `local` to `remote`; the payload: bytes from the send
    /// ring (two slices: it may wrap) or pieces of pool buffers; `ect`: its IP header's ECN field is
    /// ECT(0) (RFC 3168), else Not-ECT. Return false if it cannot be sent now (no
    /// buffer): the engine leaves its state as if nothing was sent and stops.
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: TxData<'_>,
        ect: bool,
    ) -> bool;

    /// Emit `n` segments of `seg` payload bytes each from `repr.seq` on (a run of
    /// new data, `payload` its `n * seg` bytes from the send ring): each with
    /// `repr`'s header but for its sequence number, PSH (if `repr` has it) on the
    /// last only, as a GSO frame is cut. Returns how many, from the first, it
    /// took (fewer: no room for the rest; the engine commits those). By default
    /// one [`SegmentSink::emit`] each; a sink that builds GSO frames takes the run
    /// at once.
    #[allow(clippy::too_many_arguments)]
    fn emit_run(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
        seg: usize,
        n: usize,
        ect: bool,
    ) -> usize {
        for k in 0..n {
            let r = run_segment(repr, seg, k, n);
            let (a, b) = crate::sg::ring_range(payload, k * seg, seg);
            if !self.emit(local, remote, &r, TxData::Bytes(a, b), ect) {
                return k;
            }
        }
        n
    }

    /// [`SegmentSink::emit_run`] for a run whose payload is pieces of pool buffers
    /// (`spans`, the run's `n * seg` bytes in order). None: the sink takes such a
    /// run one [`SegmentSink::emit`] at a time (the default), as it must when a
    /// segment cannot join a GSO frame; the engine then sends it that way.
    #[allow(clippy::too_many_arguments)]
    fn emit_span_run(
        &mut self,
        _local: SocketAddr,
        _remote: SocketAddr,
        _repr: &TcpRepr,
        _spans: &[BufSpan],
        _seg: usize,
        _n: usize,
        _ect: bool,
    ) -> Option<usize> {
        None
    }
}

/// The header of segment `k` of a run of `n` segments of `seg` bytes whose first
/// has `first`: its sequence number, and PSH only if it is the last.
pub fn run_segment(first: &TcpRepr, seg: usize, k: usize, n: usize) -> TcpRepr {
    let mut r = *first;
    r.seq = first.seq.wrapping_add((k * seg) as u32);
    if k + 1 < n {
        r.flags = TcpFlags(r.flags.0 & !TcpFlags::PSH.0);
    }
    r
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
    /// Segments marked lost, retransmitted or not, not yet SACKed or acknowledged
    /// (Linux's `lost_out`, `tcpi_lost`).
    pub lost_out: u32,
    /// Retransmitted segments in flight (Linux's `retrans_out`, `tcpi_retrans`).
    pub retrans_out: u32,
    /// Reordering estimate in segments (Linux's `tcpi_reordering`, from 3).
    pub reordering: u32,
    /// How often a segment was seen delivered out of order (`tcpi_reord_seen`).
    pub reord_seen: u32,
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
    /// Recovery after a retransmission timeout (or a path MTU drop), Linux's
    /// `TCP_CA_Loss`; `in_recovery` is set too.
    pub in_loss: bool,
    /// Outside recovery, the sender has seen SACKs or duplicate ACKs, or has
    /// retransmitted data still outstanding (Linux's `TCP_CA_Disorder`).
    pub disorder: bool,
    /// Congestion control in use.
    pub congestion: &'static str,
    /// The pacing rate, bytes per second (Linux's `tcpi_pacing_rate`; paced or not).
    pub pacing_rate: u64,
    /// `SO_MAX_PACING_RATE` (`u64::MAX`: none).
    pub max_pacing_rate: u64,
    /// The latest delivery-rate sample, bytes per second (`tcpi_delivery_rate`).
    pub delivery_rate: u64,
    /// That sample was application-limited (`tcpi_delivery_rate_app_limited`).
    pub delivery_rate_app_limited: bool,
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
    /// Data on a SYN was accepted (server) or acknowledged (client) by Fast Open.
    pub syn_data: bool,
    /// Segments delivered (acknowledged or SACKed), the handshake counting one.
    pub delivered: u64,
    /// Time since data (or the SYN-ACK of an active open) last arrived.
    pub last_data_recv: Duration,
    /// ECN negotiated (RFC 3168).
    pub ecn: bool,
    /// A CE mark arrived at some point.
    pub ecn_seen: bool,
    /// The window was reduced for an ECN echo and that window of data is not yet
    /// acknowledged (Linux's CWR state).
    pub in_cwr: bool,
    /// Time with data queued or unacknowledged (Linux's `tcpi_busy_time`, which
    /// includes the two below).
    pub busy_time: Duration,
    /// Of that, time the peer's window stopped the next segment.
    pub rwnd_limited: Duration,
    /// Of that, time a write found the send buffer full.
    pub sndbuf_limited: Duration,
    /// The path MTU the link and ICMP allow (Linux's `tcpi_pmtu`).
    pub pmtu: u32,
    /// While path MTU probing is on (`tcp_mtu_probing`): its search range, the
    /// MTUs (search_low, search_high); `snd_mss` follows search_low.
    pub mtu_search: Option<(u32, u32)>,
}

impl TcpInfo {
    /// Linux's `tcpi_state` number (`include/net/tcp_states.h`).
    pub fn linux_state(&self) -> u8 {
        match self.state {
            State::Established => 1,
            State::SynSent => 2,
            State::SynReceived => 3,
            State::FinWait1 => 4,
            State::FinWait2 => 5,
            State::TimeWait => 6,
            State::Closed => 7,
            State::CloseWait => 8,
            State::LastAck => 9,
            State::Closing => 11,
        }
    }

    /// Linux's `tcpi_ca_state`: Open (0), Disorder (1: SACKs or duplicate ACKs
    /// seen), CWR (2: reduced for an ECN echo), Recovery (3) or Loss (4: after an
    /// RTO).
    pub fn linux_ca_state(&self) -> u8 {
        if self.in_loss {
            4
        } else if self.in_recovery {
            3
        } else if self.in_cwr {
            2
        } else if self.disorder {
            1
        } else {
            0
        }
    }

    /// Linux's `tcpi_options` bits: timestamps (1), SACK (2), window scaling (4),
    /// ECN (8), ECN seen (16), data on the SYN (32).
    pub fn linux_options(&self) -> u8 {
        [
            (self.timestamps, 1),
            (self.sack, 2),
            (self.wscale.is_some(), 4),
            (self.ecn, 8),
            (self.ecn_seen, 16),
            (self.syn_data, 32),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(0, |o, (_, bit)| o | bit)
    }
}

/// A TCP connection.
pub struct Connection {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) state: State,
    /// Shared with the listener that accepted it (and its other children) until an
    /// option is set on this connection alone: 448 bytes an idle connection need not hold.
    pub(crate) cfg: Arc<TcpConfig>,
    pub(crate) error: Option<TcpError>,
    /// An ICMP error since the last new ACK, reported if the connection times out.
    pub(crate) soft_error: Option<TcpError>,
    /// The latest time passed in (never goes back).
    pub(crate) now: Instant,
    /// The application called `close()` (not just `shutdown_write`).
    pub(crate) app_closed: bool,

    /// Our SYN or SYN-ACK (`handshake`).
    pub(crate) syn: SynState,
    /// Window scaling and SACK as negotiated (`handshake`).
    pub(crate) opts: Negotiated,
    /// RFC 7323 timestamps (`timestamps`).
    pub(crate) ts: Timestamps,
    /// SND.*, send buffer, FIN, persist (`send`).
    pub(crate) snd: SendState,
    /// The send buffer's limit as Linux accounts it (`wmem`).
    pub(crate) wmem: Wmem,
    /// What is in flight (`scoreboard`).
    pub(crate) scoreboard: Scoreboard,
    /// Loss recovery, RACK, TLP (`recovery`).
    pub(crate) recovery: Recovery,
    pub(crate) cc: Box<dyn CongestionControl>,
    /// Delivery-rate samples (`rate`).
    pub(crate) rate: RateState,
    /// Departure times of a paced sender (`pacing`).
    pub(crate) pace: Pacing,
    /// RCV.*, receive buffer, reassembly (`recv`).
    pub(crate) rcv: RecvState,
    /// When to acknowledge (`recv`).
    pub(crate) ack: AckState,
    /// SRTT, RTO, back-off (`rtt`).
    pub(crate) rtt: RttEstimator,
    /// Every deadline (`timers`).
    pub(crate) timers: Timers,
    pub(crate) keepalive: KeepaliveState,
    /// ECN (`ecn`).
    pub(crate) ecn: EcnState,
    /// Path MTU probing (`mtu_probe`).
    pub(crate) mtup: MtuProbe,
    /// Busy / window-limited / buffer-limited time (`chrono`).
    pub(crate) chrono: Chronos,
    /// RFC 5961 challenge ACKs sent this second (`state`).
    pub(crate) challenges: ChallengeLimiter,
    /// Reset the connection on the next transmit pass (abort).
    pub(crate) rst_pending: bool,
    /// An RST to send in reply to an unacceptable segment: (seq, ack).
    pub(crate) reply_rst: Option<(Seq, Option<Seq>)>,
    pub(crate) stats: ConnStats,
    /// The pieces of the segment being emitted (zero-copy send queue), reused.
    pub(crate) tx_spans: Vec<BufSpan>,
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
    /// A connection in CLOSED with everything at its start; `connect` and
    /// `from_handshake` go on from here.
    fn blank(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: Arc<TcpConfig>,
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
            app_closed: false,
            syn: SynState::new(now),
            opts: Negotiated::default(),
            ts: Timestamps::new(ts_offset, now),
            snd: SendState::new(iss, cfg.send_buffer, cfg.zero_copy, remote, now),
            wmem: Wmem::new(cfg.send_buffer_initial.min(cfg.send_buffer), iss),
            scoreboard: Scoreboard::new(cfg.send_buffer),
            recovery: Recovery::new(iss),
            cc,
            rate: RateState::default(),
            pace: Pacing::default(),
            rcv: RecvState::new(&cfg, mss, now),
            ack: AckState::new(cfg.quickack_segments),
            rtt: RttEstimator::new(cfg.initial_rto),
            timers: Timers::default(),
            keepalive: KeepaliveState::new(now),
            ecn: EcnState::default(),
            mtup: MtuProbe::new(now, iss),
            chrono: Chronos::default(),
            challenges: ChallengeLimiter::new(now),
            rst_pending: false,
            reply_rst: None,
            tx_spans: Vec::new(),
            stats: ConnStats::default(),
            cfg,
        }
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
    pub fn stats(&self) -> TcpStats {
        self.stats.to_stats()
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

    /// Moves the connection's clock to `now` (never back) before an application
    /// call that records time (a write starts the busy time).
    pub fn advance_clock(&mut self, now: Instant) {
        self.now = self.now.max(now);
    }

    /// A `tcp_info`-like snapshot.
    pub fn info(&self) -> TcpInfo {
        self.info_at(self.now)
    }

    /// [`Connection::info`] with the times in it measured at `now`.
    pub fn info_at(&self, now: Instant) -> TcpInfo {
        TcpInfo {
            last_data_recv: self
                .ack
                .last_rcv
                .map_or(Duration::ZERO, |t| now.max(self.now).saturating_since(t)),
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
            lost_out: self.scoreboard.lost_out(),
            retrans_out: self.scoreboard.retrans_out(self.smss()),
            reordering: self.recovery.reordering,
            reord_seen: self.recovery.reord_seen,
            snd_wnd: self.snd.wnd,
            rcv_wnd: self.rcv.adv.since(self.rcv.nxt),
            rcv_space: self.rcv.space as u32,
            total_retransmits: self.stats.retransmit_segments,
            fast_recoveries: self.stats.fast_recoveries,
            rto_expiries: self.stats.rto_expired,
            sack_blocks: self.stats.rx_sack_blocks,
            in_recovery: self.recovery.in_recovery(),
            in_loss: self.recovery.in_loss(),
            disorder: self.in_disorder(),
            congestion: self.cc.name(),
            pacing_rate: self.pacing_rate(),
            max_pacing_rate: self.pace.max_rate,
            delivery_rate: self.delivery_rate(),
            delivery_rate_app_limited: self.rate.last_app_limited,
            wscale: self.opts.ws.then_some((self.snd.wscale, self.rcv.wscale)),
            timestamps: self.ts.ok,
            sack: self.opts.sack,
            recv_queued: self.rcv.buf.len(),
            send_queued: self.snd.buf.len(),
            syn_data: self.syn.syn_data,
            delivered: self.snd.delivered,
            ecn: self.ecn.ok,
            ecn_seen: self.ecn.seen,
            in_cwr: self.ecn_in_cwr(),
            busy_time: self.chrono.busy(now.max(self.now)),
            rwnd_limited: self.chrono.spent(Chrono::RwndLimited, now.max(self.now)),
            sndbuf_limited: self.chrono.spent(Chrono::SndbufLimited, now.max(self.now)),
            pmtu: self.path_mtu(),
            mtu_search: self.mtu_search(),
        }
    }

    // ------------------------------------------------------------ options

    /// TCP_NODELAY.
    pub fn set_nodelay(&mut self, on: bool) {
        Arc::make_mut(&mut self.cfg).nodelay = on;
        // Setting it flushes pending output, even past a cork (as Linux).
        self.snd.push_once |= on;
    }
    /// TCP_USER_TIMEOUT (see [`TcpConfig::user_timeout`]); takes effect for the data
    /// in flight too.
    pub fn set_user_timeout(&mut self, t: Option<Duration>) {
        Arc::make_mut(&mut self.cfg).user_timeout = t;
    }
    /// SO_LINGER.
    pub fn set_linger(&mut self, linger: Option<Duration>) {
        Arc::make_mut(&mut self.cfg).linger = linger;
    }
    /// Replace the congestion controller (TCP_CONGESTION); takes effect at once.
    pub fn set_congestion_control(&mut self, cc: Box<dyn CongestionControl>) {
        self.cc = cc;
    }
    /// Lower the sender MSS (path MTU decrease). Never raises it above the
    /// negotiated value.
    pub fn clamp_mss(&mut self, mss: u16) {
        if mss < self.cfg.mss {
            Arc::make_mut(&mut self.cfg).mss = mss.max(64);
        }
    }

    /// The next time `poll_transmit` has timer work to do (or `now` if it has output
    /// pending), or None.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.ack.pending
            || self.ack.dupacks_owed > 0
            || self.rst_pending
            || self.reply_rst.is_some()
            || (self.syn.pending && self.syn.xmits == 0)
        {
            return Some(self.now);
        }
        self.timers.next()
    }

    /// Check the scoreboard's cached counters against a recount (tests, fuzzers).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        self.scoreboard.check(self.snd.una, self.snd.nxt)
    }
}

#[cfg(test)]
mod size_tests {
    /// What every idle connection carries inline (docs/benchmarks.md, "Memory per
    /// connection"): 2,864 bytes before its configuration was shared and its rare
    /// counters moved out of line. A field added here is paid 100,000 times over.
    #[test]
    fn an_idle_connection_stays_small() {
        let n = std::mem::size_of::<super::Connection>();
        assert!(n <= 1_900, "Connection is {n} bytes inline");
    }
}
