//! Opening a connection (RFC 9293 §3.5): active open (`connect`, SYN-SENT), the
//! passive open the listener started (SYN-RECEIVED), simultaneous open, option
//! negotiation (MSS, window scale RFC 7323 §2, SACK-permitted RFC 2018, timestamps
//! RFC 7323 §3), SYN/SYN-ACK (re)transmission and the move to ESTABLISHED.

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;

use usnet_wire::{FastOpen, TcpFlags, TcpOptions};

use super::timers::Timer;
use super::{Connection, Segment, SegmentSink, State, TcpError};
use crate::config::TcpConfig;
use crate::hash::initial_sequence;
use crate::seq::Seq;
use crate::time::Instant;

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
    /// ECN agreed (the SYN was ECN-setup and the listener accepts ECN).
    pub ecn: bool,
}

/// Options both sides agreed on in the handshake (timestamps: `Timestamps::ok`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Negotiated {
    /// Window scaling (RFC 7323 §2): the shifts are `SendState::wscale` and
    /// `RecvState::wscale`.
    pub ws: bool,
    /// SACK (RFC 2018).
    pub sack: bool,
}

/// Our SYN (or SYN-ACK) and its retransmissions.
#[derive(Debug, Clone)]
pub(crate) struct SynState {
    /// It is due: the next transmit pass sends it.
    pub pending: bool,
    /// Transmissions so far.
    pub xmits: u32,
    /// When the latest one went out.
    pub sent_at: Instant,
    /// When our first SYN went out (an active open's SYN-ACK must echo a
    /// timestamp from then on).
    pub first_sent_at: Option<Instant>,
    /// A passive open whose SYN carried an accepted Fast Open request (RFC 7413):
    /// the connection exists (and may send) before our SYN-ACK is acknowledged.
    pub tfo_child: bool,
    /// Data on a SYN was accepted (server) or acknowledged (client):
    /// `TCPI_OPT_SYN_DATA`.
    pub syn_data: bool,
    /// Client Fast Open (RFC 7413 §4.1): the option on our first SYN, a cookie or
    /// a cookie request; None: an ordinary SYN. On a server's Fast Open child:
    /// the cookie its SYN-ACK carries, if any.
    pub fo: Option<FastOpen>,
    /// With a cookie: at most this much of the send buffer rides on the first SYN.
    pub fo_max: usize,
    /// Bytes the first SYN carried.
    pub fo_sent: u32,
    /// The end of the data a Fast Open SYN carried, while part of it that the
    /// SYN-ACK did not take is still to be sent again (RFC 7413 §4.1.3); None once
    /// it went out, and for every other connection. A sequence number may only be
    /// compared with it while it is set: 2^31 bytes into the stream a serial
    /// comparison with the start of the stream turns round.
    pub fo_resend_end: Option<Seq>,
    /// What the SYN-ACK taught about Fast Open to this peer (its MSS, its cookie if
    /// it sent one), until the owner takes it for its cookie cache.
    pub fo_learned: Option<(u16, Option<FastOpen>)>,
    /// Our first SYN asked for a cookie (or carried one) and its SYN-ACK, to a SYN
    /// never retransmitted, brought none: 1 after the standard option (try the
    /// experimental encoding next), 2 after the experimental one (back to the
    /// standard one for good), as Linux's `try_exp`.
    pub fo_try_exp: Option<u8>,
    /// The application waits for the handshake to send data (`set_write_pending`).
    pub write_pending: bool,
}

impl SynState {
    pub(crate) fn new(now: Instant) -> Self {
        SynState {
            pending: false,
            xmits: 0,
            sent_at: now,
            first_sent_at: None,
            tfo_child: false,
            syn_data: false,
            fo: None,
            fo_max: 0,
            fo_sent: 0,
            fo_resend_end: None,
            fo_learned: None,
            fo_try_exp: None,
            write_pending: false,
        }
    }
}

impl Connection {
    /// Active open: a connection in SYN-SENT whose SYN goes out on the next
    /// `poll_transmit`. The ISN follows RFC 6528.
    pub fn connect(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: impl Into<Arc<TcpConfig>>,
    ) -> Self {
        let cfg = cfg.into();
        let iss = Seq(initial_sequence(cfg.secret, local, remote, now.as_nanos()));
        let mut c = Connection::blank(local, remote, now, cfg, iss);
        c.state = State::SynSent;
        c.snd.nxt = iss + 1u32;
        c.syn.pending = true;
        c.rcv.wscale = if c.cfg.window_scaling {
            c.cfg.rcv_wscale()
        } else {
            0
        };
        c
    }

    /// Client Fast Open (RFC 7413 §4.1) for an active open whose SYN has not gone out
    /// yet: the first SYN carries `fo`. With a cookie, up to `max_data` bytes of the
    /// send buffer ride on it (queue them with `send` first); with a cookie request
    /// (`fo.len == 0`) it carries none. A retransmitted SYN is an ordinary one
    /// without data (the data then follows the handshake). Returns how many bytes
    /// the SYN will carry.
    pub fn set_fastopen_client(&mut self, fo: FastOpen, max_data: usize) -> usize {
        if self.state != State::SynSent || self.syn.xmits > 0 {
            return 0;
        }
        self.syn.fo = Some(fo);
        self.syn.fo_max = if fo.len > 0 { max_data } else { 0 };
        self.syn.fo_max.min(self.snd.buf.len())
    }

    /// Cookie-less Fast Open (RFC 7413 §4.1 allows a server to take SYN data
    /// without a cookie; Linux's client side is `tcp_fastopen` bit 0x4): the first
    /// SYN carries up to `max_data` bytes of the send buffer and no option. As with
    /// a cookie, a retransmitted SYN carries none. Returns how many bytes it carries.
    pub fn set_syn_data(&mut self, max_data: usize) -> usize {
        if self.state != State::SynSent || self.syn.xmits > 0 {
            return 0;
        }
        self.syn.fo = None;
        self.syn.fo_max = max_data;
        self.syn.fo_max.min(self.snd.buf.len())
    }

    /// The application is blocked until the handshake completes, to send data at
    /// once (Linux's `sk_write_pending`, set by a blocking Fast Open `sendto`): the
    /// ACK of the SYN-ACK waits for that data (or the delayed-ACK timer).
    pub fn set_write_pending(&mut self, on: bool) {
        self.syn.write_pending = on;
    }

    /// TCP_SYNCNT: how many times the SYN is retransmitted before the connect
    /// fails (takes effect for a handshake under way too).
    pub fn set_syn_retries(&mut self, n: u32) {
        Arc::make_mut(&mut self.cfg).syn_retries = n;
    }

    /// After a Fast Open SYN was answered: the peer's MSS (0: none) and the cookie
    /// its SYN-ACK carried (None: none), for the owner's cookie cache. Taken once.
    pub fn take_fastopen_learned(&mut self) -> Option<(u16, Option<FastOpen>)> {
        self.syn.fo_learned.take()
    }

    /// After a Fast Open SYN was answered without a cookie: which encoding of the
    /// option the owner's cache should try next (see `SynState::fo_try_exp`).
    /// Taken once.
    pub fn take_fastopen_try_exp(&mut self) -> Option<u8> {
        self.syn.fo_try_exp.take()
    }

    /// A passively opened connection in SYN-RECEIVED whose SYN-ACK the listener has
    /// sent; the listener feeds it the completing ACK next.
    pub(crate) fn from_handshake(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: Arc<TcpConfig>,
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
            c.opts.ws = true;
            c.snd.wscale = ws;
            c.rcv.wscale = c.cfg.rcv_wscale();
        }
        c.opts.sack = h.sack;
        c.ecn.ok = h.ecn;
        if let Some(ts) = h.ts_recent {
            c.ts.ok = true;
            c.ts.set_recent(ts, now);
        }
        // The SYN-ACK advertised an unscaled window of at most 65535.
        let w = c.rcv_window_available().min(65535);
        c.rcv.adv = c.rcv.nxt + w;
        c.syn.xmits = h.synack_xmits;
        c.syn.sent_at = h.synack_sent;
        c
    }

    /// A passive open from a SYN carrying an accepted Fast Open request (RFC 7413
    /// §4.2.2): the connection starts in SYN-RECEIVED with the SYN's data queued and
    /// sends its SYN-ACK (acknowledging that data) on the first `poll_transmit`. It
    /// may send data before the SYN-ACK is acknowledged; the listener hands it to
    /// the application at once.
    pub(crate) fn from_tfo_syn(
        local: SocketAddr,
        remote: SocketAddr,
        now: Instant,
        cfg: Arc<TcpConfig>,
        h: Handshake,
        seg: &Segment,
        cookie: Option<FastOpen>,
    ) -> Self {
        let mut c = Connection::from_handshake(local, remote, now, cfg, h);
        // The SYN-ACK is this connection's to send, and data may follow it at once:
        // the send buffer starts after our SYN. It carries `cookie` if the
        // listener gave one (a fresh one for a client whose was the backup key's).
        c.syn.xmits = 0;
        c.syn.pending = true;
        c.syn.tfo_child = true;
        c.syn.fo = cookie;
        // It may send before the handshake completes: congestion control for the
        // negotiated MSS from the start (Linux's `tcp_init_transfer` in
        // `tcp_fastopen_create_child`).
        c.cc = c.cfg.congestion.build(c.smss(), c.cfg.initial_window);
        c.snd.una = h.iss + 1u32;
        // A SYN's window is never scaled.
        c.snd.wnd = u32::from(seg.window);
        c.snd.max_wnd = c.snd.wnd;
        c.snd.wl1 = h.irs;
        c.snd.wl2 = h.iss;
        if !seg.payload.is_empty() || seg.flags.fin() {
            // The SYN's data is queued without growing the window clamp (Linux's
            // `tcp_fastopen_add_skb`).
            let clamp = c.rcv.ssthresh;
            c.receive_text(seg, h.irs + 1u32, seg.flags.fin());
            c.rcv.ssthresh = clamp;
            c.syn.syn_data = !seg.payload.is_empty();
            c.stats.rare().tfo_syn_data_accepted += 1;
        }
        c
    }

    /// The options of the peer's SYN against ours.
    fn negotiate(&mut self, seg: &Segment) {
        let o = &seg.options;
        self.set_peer_mss(o.mss);
        match (self.cfg.window_scaling, o.window_scale) {
            (true, Some(ws)) => {
                self.opts.ws = true;
                self.snd.wscale = ws.min(14);
                self.rcv.wscale = self.cfg.rcv_wscale();
            }
            _ => {
                self.opts.ws = false;
                self.snd.wscale = 0;
                self.rcv.wscale = 0;
            }
        }
        self.opts.sack = self.cfg.sack && o.sack_permitted;
        match (self.cfg.timestamps, o.timestamps) {
            (true, Some((val, _))) => {
                self.ts.ok = true;
                self.ts.set_recent(val, self.now);
            }
            _ => self.ts.ok = false,
        }
    }

    /// A SYN-ACK in SYN-SENT (acceptable, `ack` checked): the part of the data on
    /// a Fast Open SYN that it acknowledges leaves the send buffer, the rest is sent
    /// again as ordinary data after the handshake (RFC 7413 §4.1.3: SND.NXT goes
    /// back to the ACK); a cookie it carries is learned.
    fn fastopen_synack(&mut self, seg: &Segment, ack: Seq) {
        let acked = ack.since(self.snd.iss + 1u32) as usize;
        if acked > 0 {
            self.snd.buf.consume(acked);
        }
        let sent = self.syn.fo_sent as usize;
        if sent > 0 {
            if acked >= sent {
                self.syn.syn_data = true;
                self.stats.rare().tfo_syn_data_acked += 1;
            } else {
                self.stats.rare().tfo_syn_data_resent += 1;
                self.syn.fo_resend_end = Some(self.snd.iss + 1u32 + self.syn.fo_sent);
            }
        }
        self.snd.nxt = ack;
        // The peer's MSS sizes later SYN data (cookie-less too); a cookie is taken
        // only in answer to our option (an unsolicited one is not cached, as Linux).
        if self.syn.fo.is_some() || self.syn.fo_max > 0 {
            let cookie = seg
                .options
                .fast_open
                .filter(|f| f.len > 0 && self.syn.fo.is_some());
            self.syn.fo_learned = Some((seg.options.mss.unwrap_or(0), cookie));
            if let (Some(ours), None) = (self.syn.fo, cookie) {
                if self.syn.xmits == 1 {
                    self.syn.fo_try_exp = Some(if ours.exp { 2 } else { 1 });
                }
            }
        }
    }

    /// An RTT sample from the handshake, if our SYN (SYN-ACK) went out once (Karn).
    fn syn_rtt_sample(&mut self) {
        if self.syn.xmits == 1 {
            let r = self.now.saturating_since(self.syn.sent_at);
            self.rtt.sample(r, &self.cfg);
        }
    }

    /// RFC 9293 §3.10.7.3: a segment in SYN-SENT.
    pub(crate) fn input_syn_sent(&mut self, seg: &Segment) {
        let f = seg.flags;
        let ack = Seq(seg.ack);
        if f.ack() && (ack.le(self.snd.iss) || ack.gt(self.snd.nxt)) {
            if !f.rst() {
                self.stats.rare().rx_bad_syn_ack += 1;
                self.reply_rst = Some((ack, None));
            }
            return;
        }
        if f.ack() && !self.echoes_our_syn_timestamp(seg) {
            // It cannot answer our SYN (RFC 7323 §5's reasoning, Linux's active
            // PAWS check): reset it like an unacceptable ACK, stay in SYN-SENT.
            if !f.rst() {
                self.stats.rare().rx_bad_syn_ack += 1;
                self.reply_rst = Some((ack, None));
            }
            return;
        }
        if f.rst() {
            // RFC 5961 §3.2: acceptable only if it acknowledges our SYN.
            if f.ack() {
                self.stats.rare().conn_refused += 1;
                self.enter_closed(Some(TcpError::Refused));
            } else {
                self.stats.rare().rx_rst_out_of_window += 1;
            }
            return;
        }
        if !f.syn() {
            return;
        }
        self.rcv.irs = Seq(seg.seq);
        self.rcv.nxt = self.rcv.irs + 1u32;
        // Our SYN offered an unscaled window: data on the peer's SYN may fill it.
        self.rcv.adv = self.rcv.nxt + self.rcv_window_available().min(65535);
        self.ack.last_sent = self.rcv.nxt;
        self.negotiate(seg);
        // A SYN's window is never scaled.
        self.snd.wnd = u32::from(seg.window);
        self.snd.max_wnd = self.snd.wnd;
        self.snd.wl1 = Seq(seg.seq);
        self.snd.wl2 = ack;
        if f.ack() {
            self.ack.last_rcv = Some(self.now);
            self.ecn_synack_received(f);
            self.fastopen_synack(seg, ack);
            self.snd.una = ack;
            self.syn_rtt_sample();
            self.establish();
            if self.syn.write_pending {
                // The application waits to send (Linux sk_write_pending): its data
                // will carry the ACK; it goes alone only if the delayed-ACK timer
                // fires first. A reply sent now counts as interactive.
                self.timers
                    .set(Timer::DelayedAck, self.now + self.cfg.delayed_ack);
                self.ack.last_data_rx = Some(self.now);
            } else {
                self.ack.pending = true;
            }
        } else {
            // Simultaneous open: SYN-ACK with our original ISS (RFC 3168 has no
            // ECN negotiation for it).
            self.state = State::SynReceived;
            self.syn.pending = true;
        }
        // RFC 9293 §3.10.7.3: other controls or text on the SYN are processed as in
        // the sixth step on: the data after the SYN is queued (delivered once the
        // connection is established), a FIN remembered.
        if !seg.payload.is_empty() || f.fin() {
            self.receive_text(seg, Seq(seg.seq) + 1u32, f.fin());
            self.ack.pending = true;
            if self.state == State::Established {
                self.check_fin(seg);
            }
        }
    }

    /// In SYN-SENT, whether an ACK's timestamp echo (if it has one, and we offered
    /// timestamps) is one of ours: a TSval we sent between our first SYN and now.
    fn echoes_our_syn_timestamp(&self, seg: &Segment) -> bool {
        let (Some((_, ecr)), Some(first)) = (seg.options.timestamps, self.syn.first_sent_at) else {
            return true;
        };
        if !self.cfg.timestamps || ecr == 0 {
            return true;
        }
        let lo = self.ts.clock(first);
        ecr.wrapping_sub(lo) <= self.ts.clock(self.now).wrapping_sub(lo)
    }

    /// In SYN-RECEIVED, a segment carrying the peer's SYN again: in a simultaneous
    /// open its SYN-ACK, which acknowledges our SYN and completes the handshake (as
    /// Linux takes it); otherwise a retransmitted SYN, meaning our SYN-ACK was lost.
    /// Breaks when it was one of those.
    pub(crate) fn syn_received_syn(&mut self, seg: &Segment) -> ControlFlow<()> {
        let f = seg.flags;
        let seq = Seq(seg.seq);
        if self.state != State::SynReceived || !f.syn() || seq != self.rcv.irs {
            return ControlFlow::Continue(());
        }
        if f.ack() && Seq(seg.ack) == self.snd.nxt && !f.rst() {
            self.snd.una = self.snd.nxt;
            self.set_send_window(seq, self.snd.nxt, seg.window);
            self.establish();
            // A FIN that came with the peer's SYN takes effect now.
            self.check_fin(seg);
        } else if !f.ack() {
            self.syn.pending = true;
        }
        ControlFlow::Break(())
    }

    /// RFC 9293 §3.10.7.4 fifth check in SYN-RECEIVED: an ACK of our SYN moves to
    /// ESTABLISHED (and the ACK is then processed as usual); any other ACK is answered
    /// with `<SEQ=SEG.ACK><CTL=RST>`.
    pub(crate) fn complete_passive_open(&mut self, seg: &Segment) -> ControlFlow<()> {
        let ack = Seq(seg.ack);
        if self.syn.tfo_child {
            // SND.UNA is already past our SYN (data may be in flight): an ACK of
            // the SYN, or of some of that data, completes the handshake, and the
            // ACK processing that follows retires the data.
            if !(ack.ge(self.snd.una) && ack.le(self.snd.nxt)) {
                self.reply_rst = Some((ack, None));
                return ControlFlow::Break(());
            }
            self.syn_rtt_sample();
            self.set_send_window(Seq(seg.seq), ack, seg.window);
            self.establish();
            return ControlFlow::Continue(());
        }
        if !(ack.gt(self.snd.una) && ack.le(self.snd.nxt)) {
            self.reply_rst = Some((ack, None));
            return ControlFlow::Break(());
        }
        self.snd.una = ack;
        self.syn_rtt_sample();
        self.set_send_window(Seq(seg.seq), ack, seg.window);
        self.establish();
        ControlFlow::Continue(())
    }

    /// The handshake is complete: ESTABLISHED (or FIN-WAIT-1 if the application
    /// already shut down writing), congestion control for the negotiated MSS.
    pub(crate) fn establish(&mut self) {
        let active = self.state == State::SynSent;
        self.state = if self.snd.fin_queued {
            State::FinWait1
        } else {
            State::Established
        };
        self.stats.conn_established += 1;
        // Our SYN (or SYN-ACK) was delivered.
        self.snd.delivered += 1;
        // Before congestion control: mode 2 starts at tcp_base_mss.
        self.mtup_init(active);
        // A Fast Open child has sent with its congestion control since its SYN-ACK
        // (built for the negotiated MSS then); it keeps it, as Linux's does.
        if !self.syn.tfo_child {
            self.cc = self
                .cfg
                .congestion
                .build(self.smss(), self.cfg.initial_window);
        }
        self.recovery.rack.end_seq = self.snd.una;
        self.recovery.rack.fack = self.snd.una;
        self.recovery.point = self.snd.una;
        self.timers.clear(Timer::Rto);
        self.rtt.backoff = 0;
        self.syn.pending = false;
        self.ack.quickack = self.cfg.quickack_segments;
        if self.rcv.adv.lt(self.rcv.nxt) {
            self.rcv.adv = self.rcv.nxt;
        }
        self.arm_keepalive();
        self.snd.last_tx = self.now;
    }

    /// The SYN or SYN-ACK was not answered: send it again, or give up after
    /// `syn_retries` / `synack_retries`.
    pub(crate) fn on_syn_timeout(&mut self) {
        let limit = if self.state == State::SynSent {
            self.cfg.syn_retries
        } else {
            self.cfg.synack_retries
        };
        if self.syn.xmits > limit {
            self.stats.rare().conn_timeouts += 1;
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        self.rtt.backoff += 1;
        self.syn.pending = true;
        self.stats.syn_retransmits += 1;
    }

    /// Send the SYN (SYN-SENT) or SYN-ACK (SYN-RECEIVED) if it is due. None: not due.
    pub(crate) fn send_syn<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> Option<bool> {
        if !self.syn.pending {
            return None;
        }
        let synack = self.state == State::SynReceived;
        let flags = if synack {
            TcpFlags::SYN | TcpFlags::ACK
        } else {
            TcpFlags::SYN | self.ecn_syn_flags()
        };
        let mut opts = self.syn_options(synack);
        // Client Fast Open: only the first SYN carries the option and data. A Fast
        // Open child's SYN-ACK carries the cookie its listener chose, if any.
        let mut data = 0;
        if !synack && self.syn.xmits == 0 {
            opts.fast_open = self.syn.fo;
            data = self.syn.fo_max.min(self.snd.buf.len());
        } else if synack && self.syn.tfo_child {
            opts.fast_open = self.syn.fo;
        }
        if !self.emit(sink, flags, self.snd.iss, 0, data, opts) {
            return Some(false);
        }
        if !synack && self.syn.xmits == 0 {
            self.snd.nxt = self.snd.iss + 1u32 + data as u32;
            self.syn.fo_sent = data as u32;
            if data > 0 {
                self.stats.tx_data_segments += 1;
                self.stats.tx_bytes += data as u64;
            }
        }
        self.syn.pending = false;
        if self.syn.xmits == 0 {
            self.syn.first_sent_at = Some(self.now);
        }
        self.syn.xmits += 1;
        self.syn.sent_at = self.now;
        self.timers
            .set(Timer::Rto, self.now + self.rto_backed_off());
        Some(true)
    }

    /// A SYN offers what the configuration allows; a SYN-ACK (simultaneous open)
    /// answers with what was negotiated.
    fn syn_options(&self, synack: bool) -> TcpOptions {
        let mut o = TcpOptions {
            mss: Some(self.cfg.mss),
            ..TcpOptions::default()
        };
        let ws = if synack {
            self.opts.ws
        } else {
            self.cfg.window_scaling
        };
        if ws {
            o.window_scale = Some(self.rcv.wscale);
        }
        o.sack_permitted = if synack {
            self.opts.sack
        } else {
            self.cfg.sack
        };
        let ts = if synack {
            self.ts.ok
        } else {
            self.cfg.timestamps
        };
        if ts {
            let echo = if synack { self.ts.recent } else { 0 };
            o.timestamps = Some((self.ts.clock(self.now), echo));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::testing::{OwnedSegment, VecSink};
    use std::time::Duration;

    fn client(cfg: TcpConfig) -> Connection {
        let (c, s) = addrs();
        Connection::connect(c, s, T0, cfg)
    }

    fn syn_ack_for(syn: &OwnedSegment, ack: u32, opts: TcpOptions) -> OwnedSegment {
        OwnedSegment {
            local: syn.remote,
            remote: syn.local,
            repr: usnet_wire::TcpRepr {
                src_port: syn.repr.dst_port,
                dst_port: syn.repr.src_port,
                seq: 5000,
                ack,
                flags: TcpFlags::SYN | TcpFlags::ACK,
                window: 1000,
                urgent: 0,
                options: opts,
            },
            payload: Vec::new(),
            ect: false,
            ce: false,
        }
    }

    #[test]
    fn a_syn_ack_echoing_a_timestamp_we_never_sent_is_reset_and_ignored() {
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0).remove(0);
        let (tsval, _) = syn.repr.options.timestamps.expect("timestamps offered");
        let opts = |ecr| TcpOptions {
            timestamps: Some((77, ecr)),
            ..TcpOptions::default()
        };
        let bad = syn_ack_for(&syn, cli.iss() + 1, opts(tsval.wrapping_add(9999)));
        let now = T0 + Duration::from_millis(10);
        feed(&mut cli, now, &[bad]);
        assert_eq!(cli.state(), State::SynSent);
        let rst = drain(&mut cli, now);
        assert_eq!(rst.len(), 1);
        assert_eq!(rst[0].repr.flags, TcpFlags::RST);
        assert_eq!(rst[0].repr.seq, cli.iss() + 1);
        // One that echoes our SYN's TSval completes the handshake.
        let good = syn_ack_for(&syn, cli.iss() + 1, opts(tsval));
        feed(&mut cli, now, &[good]);
        assert_eq!(cli.state(), State::Established);
    }

    #[test]
    fn the_syn_offers_every_configured_option() {
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0);
        assert_eq!(syn.len(), 1);
        let r = &syn[0].repr;
        assert_eq!(r.flags, TcpFlags::SYN);
        assert_eq!(r.seq, cli.iss());
        assert_eq!(r.options.mss, Some(1460));
        assert_eq!(
            r.options.window_scale,
            Some(TcpConfig::default().rcv_wscale())
        );
        assert!(r.options.sack_permitted);
        assert!(r.options.timestamps.is_some());
    }

    #[test]
    fn syn_data_sent_again_is_no_small_segment_for_nagle() {
        let mut cli = client(TcpConfig::default());
        assert_eq!(cli.send(&[7u8; 1000]), 1000);
        let fo = FastOpen::with_cookie(&[1, 2, 3, 4], false);
        assert_eq!(cli.set_fastopen_client(fo, 1000), 1000);
        let syn = drain(&mut cli, T0).remove(0);
        assert_eq!(syn.payload.len(), 1000);
        // The SYN-ACK takes only the SYN: the 1000 bytes go again, a partial
        // segment, but a retransmission of what the SYN carried.
        let opts = TcpOptions {
            mss: Some(1460),
            ..TcpOptions::default()
        };
        let mut synack = syn_ack_for(&syn, cli.iss() + 1, opts);
        synack.repr.window = 65535;
        feed(&mut cli, T0 + ms(10), &[synack]);
        let out = drain(&mut cli, T0 + ms(10));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].payload.len(), 1000);
        // More data: its small tail is not held behind that resend.
        cli.send(&[8u8; 2000]);
        let out = drain(&mut cli, T0 + ms(11));
        let sent: usize = out.iter().map(|s| s.payload.len()).sum();
        assert_eq!(sent, 2000);
    }

    #[test]
    fn fast_open_syn_carries_data_and_a_partial_ack_resends_the_rest() {
        let mut cli = client(TcpConfig::default());
        assert_eq!(cli.send(&[7u8; 3000]), 3000);
        let fo = FastOpen::with_cookie(&[1, 2, 3, 4], false);
        assert_eq!(cli.set_fastopen_client(fo, 1420), 1420);
        let syn = drain(&mut cli, T0).remove(0);
        assert_eq!(syn.repr.flags, TcpFlags::SYN);
        assert_eq!(syn.repr.options.fast_open, Some(fo));
        assert_eq!(syn.payload.len(), 1420);
        // The SYN-ACK acknowledges 100 bytes and brings a new cookie.
        let newc = FastOpen::with_cookie(&[9; 8], false);
        let opts = TcpOptions {
            mss: Some(1000),
            fast_open: Some(newc),
            ..TcpOptions::default()
        };
        let synack = syn_ack_for(&syn, cli.iss() + 101, opts);
        feed(&mut cli, T0 + ms(10), &[synack]);
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.take_fastopen_learned(), Some((1000, Some(newc))));
        assert_eq!(cli.take_fastopen_learned(), None, "taken once");
        assert!(
            !cli.syn.syn_data,
            "not all of the SYN's data was acknowledged"
        );
        // The rest goes out as ordinary data from the acknowledged point on.
        let out = drain(&mut cli, T0 + ms(10));
        assert_eq!(out[0].repr.seq, cli.iss() + 101);
        let sent: usize = out.iter().map(|s| s.payload.len()).sum();
        assert!(sent > 0 && out.iter().all(|s| !s.repr.flags.syn()));
        assert_eq!(out[0].payload.len(), 1000, "at the SYN-ACK's MSS");
    }

    #[test]
    fn a_fast_open_syn_too_big_for_the_path_is_sent_again_at_once_without_data() {
        use crate::conn::{IcmpError, IcmpOutcome};
        let mut cli = client(TcpConfig::default());
        cli.send(&[7u8; 1000]);
        cli.set_fastopen_client(FastOpen::with_cookie(&[1, 2, 3, 4], false), 1420);
        let syn = drain(&mut cli, T0).remove(0);
        assert_eq!(syn.payload.len(), 1000);
        assert_eq!(syn.repr.options.mss, Some(1460));
        // Fragmentation needed, MTU 800: an MSS of 760 fits.
        let pmtu = IcmpError::PacketTooBig { mss: 760 };
        let at = T0 + ms(10);
        assert_eq!(
            cli.icmp_error(at, syn.repr.seq, pmtu),
            IcmpOutcome::MssLowered
        );
        let again = drain(&mut cli, at);
        assert_eq!(again.len(), 1, "at once, not after the RTO");
        assert_eq!(again[0].repr.flags, TcpFlags::SYN);
        assert!(
            again[0].payload.is_empty(),
            "the data follows the handshake"
        );
        assert_eq!(again[0].repr.options.mss, Some(760), "the MSS that fits");
        assert_eq!(cli.rtt.backoff, 0, "not congestion");
        // The data then goes in segments that fit.
        let opts = TcpOptions {
            mss: Some(1040),
            ..TcpOptions::default()
        };
        let synack = syn_ack_for(&again[0], cli.iss() + 1, opts);
        feed(&mut cli, at + ms(10), &[synack]);
        let data = drain(&mut cli, at + ms(10));
        assert!(data.iter().all(|d| d.payload.len() <= 760));
        assert_eq!(data.iter().map(|d| d.payload.len()).sum::<usize>(), 1000);
    }

    #[test]
    fn cookie_less_syn_data_carries_no_option() {
        let mut cli = client(TcpConfig::default());
        cli.send(&[5u8; 800]);
        assert_eq!(cli.set_syn_data(1000), 800);
        let syn = drain(&mut cli, T0).remove(0);
        assert_eq!(syn.payload.len(), 800);
        assert_eq!(syn.repr.options.fast_open, None);
        let again = cli.poll_at().unwrap();
        let syn = drain(&mut cli, again).remove(0);
        assert!(
            syn.repr.flags.syn() && syn.payload.is_empty(),
            "not on a retransmission"
        );
    }

    #[test]
    fn an_unanswered_cookie_request_says_which_encoding_to_try_next() {
        for (exp, next) in [(false, 1), (true, 2)] {
            let mut cli = client(TcpConfig::default());
            cli.set_fastopen_client(FastOpen::request(exp), 0);
            let syn = drain(&mut cli, T0).remove(0);
            assert_eq!(syn.repr.options.fast_open, Some(FastOpen::request(exp)));
            let synack = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
            feed(&mut cli, T0 + Duration::from_millis(10), &[synack]);
            assert_eq!(cli.state(), State::Established);
            assert_eq!(cli.take_fastopen_try_exp(), Some(next));
            assert_eq!(cli.take_fastopen_try_exp(), None, "taken once");
        }
    }

    #[test]
    fn fast_open_cookie_request_carries_no_data_and_a_retransmitted_syn_no_option() {
        let mut cli = client(TcpConfig::default());
        cli.send(&[1u8; 500]);
        assert_eq!(cli.set_fastopen_client(FastOpen::request(false), 1420), 0);
        let syn = drain(&mut cli, T0).remove(0);
        assert_eq!(syn.repr.options.fast_open, Some(FastOpen::request(false)));
        assert!(syn.payload.is_empty());
        // Retransmission after the initial RTO: plain SYN.
        let again = drain(&mut cli, T0 + Duration::from_secs(1));
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].repr.options.fast_open, None);
        assert!(again[0].payload.is_empty());
        // A SYN-ACK without a cookie: learned as "none"; all 500 bytes then go.
        let synack = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
        feed(&mut cli, T0 + Duration::from_millis(1100), &[synack]);
        assert_eq!(cli.take_fastopen_learned(), Some((0, None)));
        assert_eq!(
            cli.take_fastopen_try_exp(),
            None,
            "the SYN was retransmitted: no verdict on the option"
        );
        let out = drain(&mut cli, T0 + Duration::from_millis(1100));
        assert_eq!(out.iter().map(|s| s.payload.len()).sum::<usize>(), 500);
        assert_eq!(out[0].repr.seq, cli.iss() + 1);
    }

    #[test]
    fn a_pending_write_carries_the_handshake_ack_and_makes_the_exchange_interactive() {
        let mut cli = client(TcpConfig::default());
        cli.set_write_pending(true);
        let syn = drain(&mut cli, T0).remove(0);
        let synack = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
        feed(&mut cli, T0 + ms(10), std::slice::from_ref(&synack));
        assert_eq!(cli.state(), State::Established);
        assert_eq!(cli.info().delivered, 1, "the SYN");
        assert_eq!(
            cli.info_at(T0 + ms(30)).last_data_recv,
            ms(20),
            "since the SYN-ACK"
        );
        assert!(
            drain(&mut cli, T0 + ms(10)).is_empty(),
            "the ACK waits for the data"
        );
        cli.set_write_pending(false);
        cli.send(&[1u8; 100]);
        let out = drain(&mut cli, T0 + ms(10));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].payload.len(), 100);
        assert!(out[0].repr.flags.ack());
        // The peer's reply is acknowledged with the delayed-ACK timer, not at once.
        let mut reply = synack;
        reply.repr.flags = TcpFlags::ACK | TcpFlags::PSH;
        reply.repr.seq += 1;
        reply.repr.ack = cli.iss() + 101;
        reply.payload = vec![2u8; 50];
        feed(&mut cli, T0 + ms(20), &[reply]);
        assert_eq!(cli.info().delivered, 2, "the SYN and one data segment");
        assert_eq!(cli.info_at(T0 + ms(25)).last_data_recv, ms(5));
        assert!(
            drain(&mut cli, T0 + ms(20)).is_empty(),
            "pingpong: no quick-ack"
        );
        let late = drain(&mut cli, T0 + ms(20) + TcpConfig::default().delayed_ack);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].repr.ack, 5000 + 1 + 50);
    }

    #[test]
    fn a_peer_without_options_gets_none() {
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0).remove(0);
        let synack = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
        feed(&mut cli, T0 + ms(10), &[synack]);
        assert_eq!(cli.state(), State::Established);
        assert!(!cli.opts.ws && !cli.opts.sack && !cli.ts.ok);
        assert_eq!((cli.snd.wscale, cli.rcv.wscale), (0, 0));
        assert_eq!(cli.snd.peer_mss, 536, "the IPv4 default");
        assert_eq!(cli.snd.wnd, 1000);
        assert_eq!(cli.rtt.srtt, Some(ms(10)), "sampled from the SYN");
        // The handshake's ACK goes out at once.
        let ack = drain(&mut cli, T0 + ms(10));
        assert_eq!(ack.len(), 1);
        assert_eq!(ack[0].repr.ack, 5001);
    }

    #[test]
    fn a_syn_ack_for_something_else_is_answered_with_rst() {
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0).remove(0);
        let bogus = syn_ack_for(&syn, cli.iss() + 7, TcpOptions::default());
        feed(&mut cli, T0, &[bogus]);
        assert_eq!(cli.state(), State::SynSent);
        assert_eq!(cli.stats().rx_bad_syn_ack, 1);
        let rst = drain(&mut cli, T0);
        assert_eq!(rst.len(), 1);
        assert_eq!(rst[0].repr.flags, TcpFlags::RST);
        assert_eq!(rst[0].repr.seq, cli.iss() + 7, "SEQ = SEG.ACK");
    }

    #[test]
    fn rst_ack_in_syn_sent_refuses_and_a_bare_rst_is_ignored() {
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0).remove(0);
        let mut rst = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
        rst.repr.flags = TcpFlags::RST;
        feed(&mut cli, T0, std::slice::from_ref(&rst));
        assert_eq!(cli.state(), State::SynSent);
        assert_eq!(cli.stats().rx_rst_out_of_window, 1);
        rst.repr.flags = TcpFlags::RST | TcpFlags::ACK;
        feed(&mut cli, T0, &[rst]);
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::Refused));
    }

    #[test]
    fn the_syn_is_retransmitted_with_back_off_then_connect_times_out() {
        let cfg = TcpConfig {
            syn_retries: 2,
            ..TcpConfig::default()
        };
        let mut cli = client(cfg);
        let mut sent = Vec::new();
        let mut now = T0;
        loop {
            if !drain(&mut cli, now).is_empty() {
                sent.push(now.saturating_since(T0));
            }
            match cli.poll_at() {
                Some(t) => now = t,
                None => break,
            }
        }
        assert_eq!(sent, [ms(0), ms(1000), ms(3000)], "1 s, doubled");
        assert_eq!(cli.state(), State::Closed);
        assert_eq!(cli.error(), Some(TcpError::TimedOut));
        assert_eq!(cli.stats().syn_retransmits, 2);
        assert_eq!(now.saturating_since(T0), ms(7000));
    }

    #[test]
    fn simultaneous_open_establishes_both_ends() {
        let (a, b) = addrs();
        let mut x = Connection::connect(a, b, T0, TcpConfig::default());
        let mut y = Connection::connect(b, a, T0, TcpConfig::default());
        let sx = drain(&mut x, T0);
        let sy = drain(&mut y, T0);
        // The SYNs cross: each end answers with a SYN-ACK.
        feed(&mut x, T0, &sy);
        feed(&mut y, T0, &sx);
        assert_eq!(
            (x.state(), y.state()),
            (State::SynReceived, State::SynReceived)
        );
        let ax = drain(&mut x, T0);
        let ay = drain(&mut y, T0);
        assert_eq!(ax[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
        assert_eq!(ax[0].repr.seq, x.iss(), "the same ISS again");
        feed(&mut x, T0, &ay);
        feed(&mut y, T0, &ax);
        assert_eq!(
            (x.state(), y.state()),
            (State::Established, State::Established)
        );
        assert!(x.opts.sack && x.ts.ok && x.opts.ws);
    }

    /// A client that sent its SYN, the listener's SYN-ACK to it, and the server's
    /// connection in SYN-RECEIVED built from that handshake (as the listener does).
    fn syn_received() -> (Connection, Connection, OwnedSegment) {
        let (c, s) = addrs();
        let mut cli = client(TcpConfig::default());
        let mut lst: crate::Listener<u32> = crate::Listener::new(s, TcpConfig::default(), 8, false);
        let mut back = VecSink::default();
        for syn in drain(&mut cli, T0) {
            lst.input(T0, s, c, &syn.segment(), &mut back);
        }
        let synack = back.segments.remove(0);
        let h = Handshake {
            iss: Seq(synack.repr.seq),
            irs: Seq(synack.repr.ack.wrapping_sub(1)),
            peer_mss: 1460,
            peer_wscale: None,
            sack: false,
            ts_recent: None,
            synack_sent: T0,
            synack_xmits: 1,
            ecn: false,
        };
        let srv = Connection::from_handshake(s, c, T0, TcpConfig::default().into(), h);
        (cli, srv, synack)
    }

    #[test]
    fn an_unacceptable_segment_in_syn_received_gets_one_ack_and_no_busy_deadline() {
        let (mut cli, mut srv, synack) = syn_received();
        feed(&mut cli, T0, std::slice::from_ref(&synack));
        let mut late = drain(&mut cli, T0).remove(0);
        // Data far outside the receive window: not acceptable, answered by an ACK.
        late.repr.seq = late.repr.seq.wrapping_add(1 << 30);
        late.payload = vec![7; 100];
        let t = T0 + ms(10);
        feed(&mut srv, t, &[late]);
        assert_eq!(srv.state(), State::SynReceived);
        let out = drain(&mut srv, t);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].repr.flags, TcpFlags::ACK);
        assert_eq!(out[0].repr.seq, synack.repr.seq.wrapping_add(1));
        assert_eq!(out[0].repr.ack, synack.repr.ack);
        // Nothing else is owed: no deadline at or before now.
        assert!(srv.poll_at().is_none_or(|d| d > t), "{:?}", srv.poll_at());
        assert!(drain(&mut srv, t).is_empty());
    }

    #[test]
    fn passive_open_completes_only_with_the_right_ack() {
        let (mut cli, mut srv, synack) = syn_received();
        assert_eq!(srv.state(), State::SynReceived);
        // An ACK of something never sent: RST <SEQ=SEG.ACK>.
        feed(&mut cli, T0, &[synack]);
        let mut ack = drain(&mut cli, T0).remove(0);
        ack.repr.ack = ack.repr.ack.wrapping_add(100);
        feed(&mut srv, T0, std::slice::from_ref(&ack));
        assert_eq!(srv.state(), State::SynReceived);
        let rst = drain(&mut srv, T0);
        assert_eq!(rst[0].repr.flags, TcpFlags::RST);
        assert_eq!(rst[0].repr.seq, ack.repr.ack);
        // The right one.
        ack.repr.ack = ack.repr.ack.wrapping_sub(100);
        feed(&mut srv, T0 + ms(3), &[ack]);
        assert_eq!(srv.state(), State::Established);
        assert_eq!(srv.rtt.srtt, Some(ms(3)), "sampled from the SYN-ACK");
    }

    #[test]
    fn a_retransmitted_syn_in_syn_received_resends_the_syn_ack() {
        let (a, b) = addrs();
        let mut x = Connection::connect(a, b, T0, TcpConfig::default());
        let mut y = Connection::connect(b, a, T0, TcpConfig::default());
        let sy = drain(&mut y, T0);
        drain(&mut x, T0);
        feed(&mut x, T0, &sy);
        assert_eq!(drain(&mut x, T0).len(), 1, "the SYN-ACK");
        feed(&mut x, T0, &sy);
        let again = drain(&mut x, T0);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].repr.flags, TcpFlags::SYN | TcpFlags::ACK);
    }

    #[test]
    fn data_on_a_syn_ack_is_queued() {
        // RFC 9293 §3.10.7.3: the text of a SYN-ACK is processed, not discarded.
        let mut cli = client(TcpConfig::default());
        let syn = drain(&mut cli, T0).remove(0);
        let mut synack = syn_ack_for(&syn, cli.iss() + 1, TcpOptions::default());
        synack.payload = b"hello".to_vec();
        synack.repr.flags |= TcpFlags::FIN;
        feed(&mut cli, T0, &[synack]);
        assert_eq!(cli.state(), State::CloseWait, "the FIN is taken too");
        let mut b = [0u8; 16];
        assert_eq!(cli.recv(&mut b), 5);
        assert_eq!(&b[..5], b"hello");
        let ack = drain(&mut cli, T0);
        assert_eq!(ack.len(), 1);
        assert_eq!(ack[0].repr.ack, 5001 + 5 + 1, "SYN, data and FIN");
    }

    #[test]
    fn data_on_the_peers_syn_in_a_simultaneous_open_is_queued() {
        let (a, b) = addrs();
        let mut x = Connection::connect(a, b, T0, TcpConfig::default());
        let mut y = Connection::connect(b, a, T0, TcpConfig::default());
        let sx = drain(&mut x, T0);
        let mut sy = drain(&mut y, T0);
        sy[0].payload = b"early".to_vec();
        feed(&mut x, T0, &sy);
        feed(&mut y, T0, &sx);
        assert_eq!(x.state(), State::SynReceived);
        let ax = drain(&mut x, T0);
        assert_eq!(
            ax[0].repr.ack,
            y.iss().wrapping_add(6),
            "the data is acknowledged"
        );
        let ay = drain(&mut y, T0);
        feed(&mut x, T0, &ay);
        assert_eq!(x.state(), State::Established);
        let mut buf = [0u8; 16];
        assert_eq!(x.recv(&mut buf), 5);
        assert_eq!(&buf[..5], b"early");
    }
}
