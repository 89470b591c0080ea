//! A listening socket: SYN queue (half-open connections), accept backlog, and SYN
//! cookies when the SYN queue overflows (RFC 4987 §3.6).
//!
//! Cookie layout (our own): the server ISN is `t(5) | mss_index(3) | mac(24)` where
//! `t` is a 64-second counter mod 32 and `mac` a SipHash of the 4-tuple, the full
//! counter and the client ISN. When the client offered timestamps, the low 6 bits of
//! the SYN-ACK's TSval carry window scale (4 bits, 15 = none) and SACK-permitted
//! (1 bit); the client echoes them in the TSecr of its ACK.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_wire::{TcpFlags, TcpOptions, TcpRepr};

use crate::config::TcpConfig;
use crate::conn::{Connection, Handshake, Segment, SegmentSink};
use crate::hash::{initial_sequence, tuple_hash};
use crate::seq::Seq;
use crate::stats::TcpStats;
use crate::time::{earliest, Instant};

/// MSS values a cookie can encode (3 bits).
const COOKIE_MSS: [u16; 8] = [216, 536, 1024, 1220, 1360, 1440, 1460, 8960];
const COOKIE_PERIOD_SECS: u64 = 64;

#[derive(Debug, Clone, Copy)]
struct SynEntry {
    local: SocketAddr,
    remote: SocketAddr,
    irs: Seq,
    iss: Seq,
    peer_mss: u16,
    peer_wscale: Option<u8>,
    sack: bool,
    ts_recent: Option<u32>,
    sent: Instant,
    xmits: u32,
    next: Instant,
}

/// What a segment to a listener produced.
#[derive(Debug)]
pub enum ListenEvent {
    /// Nothing for the application (a SYN queued, a reply sent, or a drop).
    None,
    /// A handshake completed. The connection has already processed the completing
    /// ACK (and any data on it). The stack inserts it into its connection table and
    /// then calls [`Listener::push_accept`] with its handle.
    Established(Box<Connection>),
}

/// A listening endpoint. `H` is the stack's connection handle type, kept in the
/// accept queue until the application accepts it.
#[derive(Debug)]
pub struct Listener<H = u64> {
    local: SocketAddr,
    cfg: TcpConfig,
    backlog: usize,
    syn_backlog: usize,
    syn_queue: Vec<SynEntry>,
    accept_queue: VecDeque<H>,
    cookies: bool,
    last_overflow: Option<Instant>,
    stats: TcpStats,
    now: Instant,
}

impl<H> Listener<H> {
    /// Listen on `local` (its port; the address may be unspecified) with an accept
    /// `backlog`. The SYN queue holds up to `max(backlog, 128)` half-open connections;
    /// beyond that SYN cookies answer (if `cookies`).
    pub fn new(local: SocketAddr, cfg: TcpConfig, backlog: usize, cookies: bool) -> Self {
        let backlog = backlog.clamp(1, 65535);
        let syn_backlog = backlog.max(128);
        Listener {
            local,
            cfg,
            backlog,
            syn_backlog,
            syn_queue: Vec::with_capacity(syn_backlog),
            accept_queue: VecDeque::with_capacity(backlog),
            cookies,
            last_overflow: None,
            stats: TcpStats::default(),
            now: Instant::ZERO,
        }
    }

    /// Set the SYN queue limit (tcp_max_syn_backlog).
    pub fn set_syn_backlog(&mut self, n: usize) {
        self.syn_backlog = n;
    }

    /// Local address.
    pub fn local(&self) -> SocketAddr {
        self.local
    }
    /// Counters.
    pub fn stats(&self) -> &TcpStats {
        &self.stats
    }
    /// Half-open connections.
    pub fn syn_queue_len(&self) -> usize {
        self.syn_queue.len()
    }
    /// Completed connections not yet accepted.
    pub fn accept_queue_len(&self) -> usize {
        self.accept_queue.len()
    }
    /// Queue a completed connection's handle for `accept`.
    pub fn push_accept(&mut self, h: H) {
        self.accept_queue.push_back(h);
    }
    /// Take the oldest completed connection.
    pub fn accept(&mut self) -> Option<H> {
        self.accept_queue.pop_front()
    }
    /// Remove queued handles (e.g. when the stack reaps a connection that died in the
    /// queue).
    pub fn retain_accept(&mut self, f: impl FnMut(&H) -> bool) {
        self.accept_queue.retain(f);
    }

    fn accept_full(&self) -> bool {
        self.accept_queue.len() >= self.backlog
    }

    fn ts_now(&self, local: SocketAddr, remote: SocketAddr) -> u32 {
        let off = if self.cfg.ts_random_offset {
            tuple_hash(self.cfg.secret, local, remote, b"ts") as u32
        } else {
            0
        };
        (self.now.as_millis() as u32).wrapping_add(off)
    }

    fn initial_window(&self) -> u16 {
        let space = if self.cfg.autotune {
            self.cfg.recv_buffer_initial.min(self.cfg.recv_buffer)
        } else {
            self.cfg.recv_buffer
        };
        space.min(65535) as u16
    }

    fn send_synack<S: SegmentSink + ?Sized>(
        &mut self,
        e: &SynEntry,
        tsval: Option<u32>,
        sink: &mut S,
    ) -> bool {
        let mut o = TcpOptions {
            mss: Some(self.cfg.mss),
            ..TcpOptions::default()
        };
        if e.peer_wscale.is_some() {
            o.window_scale = Some(self.cfg.rcv_wscale());
        }
        o.sack_permitted = e.sack;
        if let Some(recent) = e.ts_recent {
            o.timestamps = Some((
                tsval.unwrap_or_else(|| self.ts_now(e.local, e.remote)),
                recent,
            ));
        }
        let repr = TcpRepr {
            src_port: e.local.port(),
            dst_port: e.remote.port(),
            seq: e.iss.0,
            ack: (e.irs + 1u32).0,
            flags: TcpFlags::SYN | TcpFlags::ACK,
            window: self.initial_window(),
            urgent: 0,
            options: o,
        };
        sink.emit(e.local, e.remote, &repr, (&[], &[]))
    }

    fn send_rst<S: SegmentSink + ?Sized>(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
        sink: &mut S,
    ) {
        if let Some(r) = crate::reset_for(local.port(), remote.port(), seg) {
            if sink.emit(local, remote, &r, (&[], &[])) {
                self.stats.listen_rst_sent += 1;
            }
        }
    }

    fn negotiate(&self, seg: &Segment) -> (u16, Option<u8>, bool, Option<u32>) {
        let o = &seg.options;
        let mss = o
            .mss
            .unwrap_or(if seg_is_v6(self.local) { 1220 } else { 536 });
        let ws = if self.cfg.window_scaling {
            o.window_scale
        } else {
            None
        };
        let sack = self.cfg.sack && o.sack_permitted;
        let ts = if self.cfg.timestamps {
            o.timestamps.map(|t| t.0)
        } else {
            None
        };
        (mss, ws, sack, ts)
    }

    /// Process a segment addressed to this listener (no connection matched its
    /// 4-tuple). `local` is the segment's actual destination. SYN-ACKs and RSTs go
    /// straight into `sink`.
    pub fn input<S: SegmentSink + ?Sized>(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
        sink: &mut S,
    ) -> ListenEvent {
        self.now = self.now.max(now);
        let f = seg.flags;
        let pos = self
            .syn_queue
            .iter()
            .position(|e| e.remote == remote && e.local == local);
        if f.rst() {
            // RFC 5961: only an exact RST removes a half-open connection.
            if let Some(i) = pos {
                if Seq(seg.seq) == self.syn_queue[i].irs + 1u32 {
                    self.syn_queue.swap_remove(i);
                    return ListenEvent::None;
                }
            }
            self.stats.listen_bad_segments += 1;
            return ListenEvent::None;
        }
        if f.ack() && !f.syn() {
            let ack = Seq(seg.ack);
            let hs = match pos {
                Some(i) => {
                    let e = self.syn_queue[i];
                    if ack != e.iss + 1u32
                        || !Seq(seg.seq).in_range(e.irs + 1u32, e.irs + 1u32 + 65536u32)
                    {
                        self.send_rst(local, remote, seg, sink);
                        return ListenEvent::None;
                    }
                    if self.accept_full() {
                        // Keep the entry; the SYN-ACK retransmission will bring the
                        // client back (as Linux does with tcp_abort_on_overflow=0).
                        self.stats.listen_accept_overflow += 1;
                        return ListenEvent::None;
                    }
                    self.syn_queue.swap_remove(i);
                    Handshake {
                        iss: e.iss,
                        irs: e.irs,
                        peer_mss: e.peer_mss,
                        peer_wscale: e.peer_wscale,
                        sack: e.sack,
                        ts_recent: e.ts_recent,
                        synack_sent: e.sent,
                        synack_xmits: e.xmits,
                    }
                }
                None => match self.check_cookie(local, remote, seg) {
                    Some(h) => {
                        if self.accept_full() {
                            self.stats.listen_accept_overflow += 1;
                            return ListenEvent::None;
                        }
                        self.stats.listen_cookies_valid += 1;
                        h
                    }
                    None => {
                        self.send_rst(local, remote, seg, sink);
                        return ListenEvent::None;
                    }
                },
            };
            let mut c = Connection::from_handshake(local, remote, self.now, self.cfg.clone(), hs);
            c.input(self.now, seg);
            return ListenEvent::Established(Box::new(c));
        }
        if !f.syn() || f.ack() {
            if f.syn() {
                // SYN-ACK to a listener: RST <SEQ=SEG.ACK>.
                self.send_rst(local, remote, seg, sink);
            } else {
                self.stats.listen_bad_segments += 1;
            }
            return ListenEvent::None;
        }
        // A SYN.
        self.stats.listen_syn_received += 1;
        if let Some(i) = pos {
            let e = self.syn_queue[i];
            if Seq(seg.seq) == e.irs {
                // Retransmitted SYN: our SYN-ACK may be lost.
                if self.send_synack(&e, None, sink) {
                    self.syn_queue[i].xmits += 1;
                    self.stats.listen_synack_retransmits += 1;
                }
                return ListenEvent::None;
            }
            self.syn_queue.swap_remove(i);
        }
        if self.accept_full() {
            self.stats.listen_accept_overflow += 1;
            return ListenEvent::None;
        }
        let (mss, ws, sack, ts) = self.negotiate(seg);
        if self.syn_queue.len() >= self.syn_backlog {
            if !self.cookies {
                self.stats.listen_syn_queue_full += 1;
                return ListenEvent::None;
            }
            self.last_overflow = Some(self.now);
            let (iss, tsval) = self.make_cookie(local, remote, seg, mss, ws, sack, ts.is_some());
            let e = SynEntry {
                local,
                remote,
                irs: Seq(seg.seq),
                iss,
                peer_mss: mss,
                // Without timestamps a cookie cannot carry these.
                peer_wscale: ws.filter(|_| ts.is_some()),
                sack: sack && ts.is_some(),
                ts_recent: ts,
                sent: self.now,
                xmits: 1,
                next: self.now,
            };
            if self.send_synack(&e, tsval, sink) {
                self.stats.listen_cookies_sent += 1;
            }
            return ListenEvent::None;
        }
        let e = SynEntry {
            local,
            remote,
            irs: Seq(seg.seq),
            iss: Seq(initial_sequence(
                self.cfg.secret,
                local,
                remote,
                self.now.as_nanos(),
            )),
            peer_mss: mss,
            peer_wscale: ws,
            sack,
            ts_recent: ts,
            sent: self.now,
            xmits: 1,
            next: self.now + self.cfg.initial_rto,
        };
        self.send_synack(&e, None, sink);
        self.syn_queue.push(e);
        ListenEvent::None
    }

    fn cookie_mac(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        period: u64,
        client_isn: u32,
    ) -> u32 {
        let mut extra = [0u8; 12];
        extra[..8].copy_from_slice(&period.to_be_bytes());
        extra[8..].copy_from_slice(&client_isn.to_be_bytes());
        (tuple_hash(self.cfg.secret, local, remote, &extra) as u32) & 0x00ff_ffff
    }

    #[allow(clippy::too_many_arguments)]
    fn make_cookie(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
        mss: u16,
        ws: Option<u8>,
        sack: bool,
        ts: bool,
    ) -> (Seq, Option<u32>) {
        let period = self.now.as_nanos() / 1_000_000_000 / COOKIE_PERIOD_SECS;
        let idx = COOKIE_MSS.iter().rposition(|&m| m <= mss).unwrap_or(0) as u32;
        let mac = self.cookie_mac(local, remote, period, seg.seq);
        let cookie = ((period as u32 & 0x1f) << 27) | (idx << 24) | mac;
        let tsval = ts.then(|| {
            let bits = u32::from(ws.unwrap_or(15).min(15)) | if sack { 0x10 } else { 0 };
            (self.ts_now(local, remote).wrapping_sub(64) & !0x3f) | bits
        });
        (Seq(cookie), tsval)
    }

    fn check_cookie(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
    ) -> Option<Handshake> {
        let recent = self.last_overflow.is_some_and(|t| {
            self.now.saturating_since(t) < Duration::from_secs(2 * COOKIE_PERIOD_SECS)
        });
        if !self.cookies || !recent {
            return None;
        }
        let cookie = seg.ack.wrapping_sub(1);
        let client_isn = seg.seq.wrapping_sub(1);
        let t = cookie >> 27;
        let cur = self.now.as_nanos() / 1_000_000_000 / COOKIE_PERIOD_SECS;
        let ok = [cur, cur.wrapping_sub(1)].into_iter().any(|p| {
            (p as u32 & 0x1f) == t
                && self.cookie_mac(local, remote, p, client_isn) == cookie & 0x00ff_ffff
        });
        if !ok {
            self.stats.listen_cookies_invalid += 1;
            return None;
        }
        let mss = COOKIE_MSS[((cookie >> 24) & 7) as usize];
        let (peer_wscale, sack, ts_recent) = match (self.cfg.timestamps, seg.options.timestamps) {
            (true, Some((val, ecr))) => {
                let ws = (ecr & 0xf) as u8;
                (
                    (ws != 15 && self.cfg.window_scaling).then_some(ws.min(14)),
                    ecr & 0x10 != 0 && self.cfg.sack,
                    Some(val),
                )
            }
            _ => (None, false, None),
        };
        Some(Handshake {
            iss: Seq(cookie),
            irs: Seq(client_isn),
            peer_mss: mss,
            peer_wscale,
            sack,
            ts_recent,
            synack_sent: self.now,
            synack_xmits: 2,
        })
    }

    /// Retransmit SYN-ACKs that are due and expire entries that ran out of retries.
    pub fn poll_transmit<S: SegmentSink + ?Sized>(&mut self, now: Instant, sink: &mut S) {
        self.now = self.now.max(now);
        let mut i = 0;
        while i < self.syn_queue.len() {
            let e = self.syn_queue[i];
            if e.next > self.now {
                i += 1;
                continue;
            }
            if e.xmits > self.cfg.synack_retries {
                self.stats.listen_synack_timeouts += 1;
                self.syn_queue.swap_remove(i);
                continue;
            }
            if !self.send_synack(&e, None, sink) {
                break;
            }
            self.stats.listen_synack_retransmits += 1;
            let shift = e.xmits.min(16);
            let d = (self.cfg.initial_rto * (1u32 << shift)).min(self.cfg.max_rto);
            let s = &mut self.syn_queue[i];
            s.xmits += 1;
            s.sent = self.now;
            s.next = self.now + d;
            i += 1;
        }
    }

    /// Next SYN-ACK retransmission time.
    pub fn poll_at(&self) -> Option<Instant> {
        self.syn_queue
            .iter()
            .fold(None, |t, e| earliest(t, Some(e.next)))
    }
}

fn seg_is_v6(a: SocketAddr) -> bool {
    a.is_ipv6()
}
