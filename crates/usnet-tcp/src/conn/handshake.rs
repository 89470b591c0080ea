//! Opening a connection (RFC 9293 §3.5): active open (`connect`, SYN-SENT), the
//! passive open the listener started (SYN-RECEIVED), simultaneous open, option
//! negotiation (MSS, window scale RFC 7323 §2, SACK-permitted RFC 2018, timestamps
//! RFC 7323 §3), SYN/SYN-ACK (re)transmission and the move to ESTABLISHED.

use std::net::SocketAddr;
use std::ops::ControlFlow;

use usnet_wire::{TcpFlags, TcpOptions};

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
    /// A passive open whose SYN carried an accepted Fast Open request (RFC 7413):
    /// the connection exists (and may send) before our SYN-ACK is acknowledged.
    pub tfo_child: bool,
    /// Data on a SYN was accepted (server) or acknowledged (client):
    /// `TCPI_OPT_SYN_DATA`.
    pub syn_data: bool,
}

impl SynState {
    pub(crate) fn new(now: Instant) -> Self {
        SynState {
            pending: false,
            xmits: 0,
            sent_at: now,
            tfo_child: false,
            syn_data: false,
        }
    }
}

impl Connection {
    /// Active open: a connection in SYN-SENT whose SYN goes out on the next
    /// `poll_transmit`. The ISN follows RFC 6528.
    pub fn connect(local: SocketAddr, remote: SocketAddr, now: Instant, cfg: TcpConfig) -> Self {
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
            c.opts.ws = true;
            c.snd.wscale = ws;
            c.rcv.wscale = c.cfg.rcv_wscale();
        }
        c.opts.sack = h.sack;
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
        cfg: TcpConfig,
        h: Handshake,
        seg: &Segment,
    ) -> Self {
        let mut c = Connection::from_handshake(local, remote, now, cfg, h);
        // The SYN-ACK is this connection's to send, and data may follow it at once:
        // the send buffer starts after our SYN.
        c.syn.xmits = 0;
        c.syn.pending = true;
        c.syn.tfo_child = true;
        c.snd.una = h.iss + 1u32;
        // A SYN's window is never scaled.
        c.snd.wnd = u32::from(seg.window);
        c.snd.max_wnd = c.snd.wnd;
        c.snd.wl1 = h.irs;
        c.snd.wl2 = h.iss;
        if !seg.payload.is_empty() || seg.flags.fin() {
            c.receive_text(seg, h.irs + 1u32, seg.flags.fin());
            c.syn.syn_data = !seg.payload.is_empty();
            c.stats.tfo_syn_data_accepted += 1;
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
            self.snd.una = ack;
            self.syn_rtt_sample();
            self.establish();
            self.ack.pending = true;
        } else {
            // Simultaneous open: SYN-ACK with our original ISS.
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
            self.stats.conn_timeouts += 1;
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
            TcpFlags::SYN
        };
        let opts = self.syn_options(synack);
        if !self.emit(sink, flags, self.snd.iss, 0, 0, opts) {
            return Some(false);
        }
        self.syn.pending = false;
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
        }
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

    #[test]
    fn passive_open_completes_only_with_the_right_ack() {
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
        };
        let mut srv = Connection::from_handshake(s, c, T0, TcpConfig::default(), h);
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
