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
use std::sync::Arc;
use std::time::Duration;

use usnet_wire::{FastOpen, TcpFlags, TcpOptions, TcpRepr};

use crate::config::{TcpConfig, FASTOPEN_SERVER, FASTOPEN_SERVER_ALL, FASTOPEN_SERVER_NO_COOKIE};
use crate::conn::{Connection, Handshake, Segment, SegmentSink};
use crate::hash::{fastopen_cookie, initial_sequence, tuple_hash};
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
    /// Challenge ACKs sent for this half-open connection (bounded by
    /// `challenge_ack_limit` over its short life).
    challenges: u32,
    /// A Fast Open cookie for the SYN-ACK (the client asked for one, or sent an
    /// invalid one).
    cookie: Option<FastOpen>,
    /// ECN agreed: the SYN-ACK carries ECE (RFC 3168 §6.1.1).
    ecn: bool,
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
    /// Shared with every connection it accepts (see `Connection::cfg`).
    cfg: Arc<TcpConfig>,
    backlog: usize,
    syn_backlog: usize,
    syn_queue: Vec<SynEntry>,
    accept_queue: VecDeque<H>,
    cookies: bool,
    last_overflow: Option<Instant>,
    /// TCP_FASTOPEN's queue length (0: not asked for).
    fastopen_qlen: usize,
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
            cfg: Arc::new(cfg),
            backlog,
            syn_backlog,
            syn_queue: Vec::with_capacity(syn_backlog),
            accept_queue: VecDeque::with_capacity(backlog),
            cookies,
            last_overflow: None,
            fastopen_qlen: 0,
            stats: TcpStats::default(),
            now: Instant::ZERO,
        }
    }

    /// A listener with this one's address and settings (configuration, backlogs,
    /// cookies, Fast Open) and nothing queued: the same listening socket opened
    /// again elsewhere (another shard of a host).
    pub fn copy_settings<K>(&self) -> Listener<K> {
        Listener {
            local: self.local,
            cfg: self.cfg.clone(),
            backlog: self.backlog,
            syn_backlog: self.syn_backlog,
            syn_queue: Vec::with_capacity(self.syn_backlog),
            accept_queue: VecDeque::with_capacity(self.backlog),
            cookies: self.cookies,
            last_overflow: None,
            fastopen_qlen: self.fastopen_qlen,
            stats: TcpStats::default(),
            now: self.now,
        }
    }

    /// Set the SYN queue limit (tcp_max_syn_backlog).
    pub fn set_syn_backlog(&mut self, n: usize) {
        self.syn_backlog = n;
    }

    /// TCP_FASTOPEN: accept data on SYNs (RFC 7413) when the configuration allows
    /// a server (`FASTOPEN_SERVER`); `qlen` 0 turns it off again (unless
    /// `FASTOPEN_SERVER_ALL`).
    pub fn set_fastopen(&mut self, qlen: usize) {
        self.fastopen_qlen = qlen;
    }

    /// TCP_MAXSEG: the MSS its SYN-ACKs advertise (and its connections use) is at
    /// most `mss`.
    pub fn set_mss(&mut self, mss: u16) {
        let mss = self.cfg.mss.min(mss);
        Arc::make_mut(&mut self.cfg).mss = mss;
    }

    /// TCP_USER_TIMEOUT for the connections it opens (see
    /// [`TcpConfig::user_timeout`]).
    pub fn set_user_timeout(&mut self, t: Option<Duration>) {
        Arc::make_mut(&mut self.cfg).user_timeout = t;
    }

    /// TCP_FASTOPEN_KEY: the key server cookies are made with, and a backup key
    /// whose cookies are still accepted (Linux's 32-byte form; a 16-byte key
    /// clears the backup).
    pub fn set_fastopen_key(&mut self, key: [u8; 16], backup: Option<[u8; 16]>) {
        let cfg = Arc::make_mut(&mut self.cfg);
        cfg.fastopen_key = Some(key);
        cfg.fastopen_backup_key = backup;
    }

    /// The TCP_FASTOPEN queue length set.
    pub fn fastopen(&self) -> usize {
        self.fastopen_qlen
    }

    fn fastopen_on(&self) -> bool {
        let f = self.cfg.fastopen;
        f & FASTOPEN_SERVER != 0 && (self.fastopen_qlen > 0 || f & FASTOPEN_SERVER_ALL != 0)
    }

    /// The cookie a client at `remote` must present (the primary key's).
    fn cookie_for(&self, local: SocketAddr, remote: SocketAddr) -> [u8; 8] {
        let key = self.cfg.fastopen_key.unwrap_or_else(|| {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&self.cfg.secret.0[0].to_le_bytes());
            k[8..].copy_from_slice(&self.cfg.secret.0[1].to_le_bytes());
            k
        });
        fastopen_cookie(&key, remote.ip(), local.ip())
    }

    /// Whether `cookie` is the backup key's for this pair (Linux's
    /// `tcp_fastopen_cookie_gen_check` tries the primary, then the backup).
    fn backup_cookie_matches(&self, local: SocketAddr, remote: SocketAddr, cookie: &[u8]) -> bool {
        self.cfg
            .fastopen_backup_key
            .is_some_and(|k| fastopen_cookie(&k, remote.ip(), local.ip())[..] == *cookie)
    }

    /// RFC 7413 §4.2.2 on a SYN: true: accept its data now (with `cookie` set, the
    /// SYN-ACK carries it: the client's was the backup key's); false: a normal
    /// handshake whose SYN-ACK carries `cookie`.
    fn fastopen_decision(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
        cookie: &mut Option<FastOpen>,
    ) -> bool {
        if !self.fastopen_on() {
            return false;
        }
        let no_cookie_ok = self.cfg.fastopen & FASTOPEN_SERVER_NO_COOKIE != 0;
        let want = self.cookie_for(local, remote);
        match seg.options.fast_open {
            Some(fo) if fo.len == 0 => {
                *cookie = Some(FastOpen::with_cookie(&want, fo.exp));
                false
            }
            Some(fo) if fo.cookie() == want || no_cookie_ok => true,
            // Valid under the backup key: the data is taken and the client gets
            // the primary key's cookie to use from now on.
            Some(fo) if self.backup_cookie_matches(local, remote, fo.cookie()) => {
                *cookie = Some(FastOpen::with_cookie(&want, fo.exp));
                true
            }
            Some(fo) => {
                *cookie = Some(FastOpen::with_cookie(&want, fo.exp));
                false
            }
            None => no_cookie_ok && !seg.payload.is_empty(),
        }
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
        o.fast_open = e.cookie;
        let repr = TcpRepr {
            src_port: e.local.port(),
            dst_port: e.remote.port(),
            seq: e.iss.0,
            ack: (e.irs + 1u32).0,
            flags: if e.ecn {
                TcpFlags::SYN | TcpFlags::ACK | TcpFlags::ECE
            } else {
                TcpFlags::SYN | TcpFlags::ACK
            },
            window: self.initial_window(),
            urgent: 0,
            options: o,
        };
        sink.emit(e.local, e.remote, &repr, crate::sg::TxData::NONE, false)
    }

    /// `<SEQ=SND.NXT><ACK=RCV.NXT><CTL=ACK>` for a half-open connection (RFC 5961
    /// §3.2), with timestamps if the SYN offered them.
    fn send_challenge_ack<S: SegmentSink + ?Sized>(&mut self, e: &SynEntry, sink: &mut S) {
        let mut options = TcpOptions::default();
        if let Some(recent) = e.ts_recent {
            options.timestamps = Some((self.ts_now(e.local, e.remote), recent));
        }
        let repr = TcpRepr {
            src_port: e.local.port(),
            dst_port: e.remote.port(),
            seq: (e.iss + 1u32).0,
            ack: (e.irs + 1u32).0,
            flags: TcpFlags::ACK,
            window: self.initial_window(),
            urgent: 0,
            options,
        };
        if sink.emit(e.local, e.remote, &repr, crate::sg::TxData::NONE, false) {
            self.stats.listen_challenge_acks += 1;
        }
    }

    fn send_rst<S: SegmentSink + ?Sized>(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        seg: &Segment,
        sink: &mut S,
    ) {
        if let Some(r) = crate::reset_for(local.port(), remote.port(), seg) {
            if sink.emit(local, remote, &r, crate::sg::TxData::NONE, false) {
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

    /// An ICMP error quoting a segment from `local` to `remote` with sequence
    /// number `seq`: if it is our SYN-ACK of a half-open connection (`seq` is its
    /// ISS) and the error would end a connection attempt (a hard unreachable), the
    /// half-open connection is dropped silently, as Linux drops such a request (the
    /// peer, if it is there, sends its SYN again). Returns whether one was dropped.
    pub fn icmp_error(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        seq: u32,
        err: crate::IcmpError,
    ) -> bool {
        let Some(i) = self
            .syn_queue
            .iter()
            .position(|e| e.remote == remote && e.local == local)
        else {
            return false;
        };
        if Seq(seq) != self.syn_queue[i].iss {
            self.stats.icmp_out_of_window += 1;
            return false;
        }
        match err {
            crate::IcmpError::Unreachable { hard: true, .. } => {
                self.syn_queue.swap_remove(i);
                self.stats.icmp_hard_errors += 1;
                true
            }
            _ => {
                self.stats.icmp_soft_errors += 1;
                false
            }
        }
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
            // RFC 5961 §3.2: only an exact RST removes a half-open connection; one
            // elsewhere in the window we offered gets a challenge ACK.
            if let Some(i) = pos {
                let e = self.syn_queue[i];
                let rcv_nxt = e.irs + 1u32;
                let seq = Seq(seg.seq);
                if seq == rcv_nxt {
                    self.syn_queue.swap_remove(i);
                    return ListenEvent::None;
                }
                let wnd = u32::from(self.initial_window());
                if seq.in_range(rcv_nxt, rcv_nxt + wnd)
                    && e.challenges < self.cfg.challenge_ack_limit
                {
                    self.syn_queue[i].challenges += 1;
                    self.send_challenge_ack(&e, sink);
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
                        ecn: e.ecn,
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
        // RFC 3168 §6.1.1: an ECN-setup SYN (ECE and CWR) when we accept ECN.
        let ecn = self.cfg.ecn != crate::config::ECN_OFF && f.ece() && f.cwr();
        let mut cookie = None;
        if self.fastopen_decision(local, remote, seg, &mut cookie) {
            let h = Handshake {
                iss: Seq(initial_sequence(
                    self.cfg.secret,
                    local,
                    remote,
                    self.now.as_nanos(),
                )),
                irs: Seq(seg.seq),
                peer_mss: mss,
                peer_wscale: ws,
                sack,
                ts_recent: ts,
                synack_sent: self.now,
                synack_xmits: 0,
                ecn,
            };
            let c =
                Connection::from_tfo_syn(local, remote, self.now, self.cfg.clone(), h, seg, cookie);
            return ListenEvent::Established(Box::new(c));
        }
        if cookie.is_some() {
            self.stats.tfo_cookie_requests += 1;
        }
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
                challenges: 0,
                cookie,
                // A cookie does not remember it.
                ecn: false,
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
            challenges: 0,
            cookie,
            ecn,
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
            ecn: false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::State;
    use crate::testing::{OwnedSegment, VecSink};

    const T0: Instant = Instant::from_millis(1000);

    fn server() -> SocketAddr {
        "10.0.0.2:80".parse().unwrap()
    }

    fn client_addr(port: u16) -> SocketAddr {
        SocketAddr::new("10.0.0.1".parse().unwrap(), port)
    }

    /// A client connecting from `port`, and its SYN.
    fn client(port: u16, cfg: TcpConfig) -> (Connection, OwnedSegment) {
        let mut c = Connection::connect(client_addr(port), server(), T0, cfg);
        let mut sink = VecSink::default();
        c.poll_transmit(T0, &mut sink);
        let syn = sink.segments.remove(0);
        (c, syn)
    }

    /// Feed `seg` (from the client at `port`) to `l`; the event and what `l` sent.
    fn offer(
        l: &mut Listener<u32>,
        now: Instant,
        seg: &OwnedSegment,
    ) -> (ListenEvent, Vec<OwnedSegment>) {
        let mut sink = VecSink::default();
        let ev = l.input(now, server(), seg.local, &seg.segment(), &mut sink);
        (ev, sink.segments)
    }

    /// The client's answer to the SYN-ACK (the handshake's ACK, with `data`).
    fn complete(c: &mut Connection, synack: &OwnedSegment, data: &[u8]) -> OwnedSegment {
        c.input(T0, &synack.segment());
        c.send(data);
        let mut sink = VecSink::default();
        c.poll_transmit(T0, &mut sink);
        sink.segments.remove(0)
    }

    fn established(ev: ListenEvent) -> Box<Connection> {
        match ev {
            ListenEvent::Established(c) => c,
            ListenEvent::None => panic!("no connection"),
        }
    }

    #[test]
    fn a_hard_icmp_error_about_the_syn_ack_drops_the_half_open_connection() {
        use crate::{IcmpError, TcpError};
        let cfg = TcpConfig::default();
        let mut l: Listener<u32> = Listener::new(server(), cfg.clone(), 8, false);
        let (mut c, syn) = client(40002, cfg);
        let (_, out) = offer(&mut l, T0, &syn);
        let iss = out[0].repr.seq;
        let (host, soft) = (
            IcmpError::Unreachable {
                error: TcpError::HostUnreachable,
                hard: true,
            },
            IcmpError::Unreachable {
                error: TcpError::HostUnreachable,
                hard: false,
            },
        );
        let from = syn.local;
        assert!(
            !l.icmp_error(server(), from, iss.wrapping_add(7), host),
            "not ours"
        );
        assert!(!l.icmp_error(server(), from, iss, soft), "soft: kept");
        assert_eq!(l.syn_queue_len(), 1);
        assert!(l.icmp_error(server(), from, iss, host));
        assert_eq!(l.syn_queue_len(), 0);
        // The handshake's ACK then finds nothing: a reset answers it.
        let ack = complete(&mut c, &out[0], b"");
        let (ev, out) = offer(&mut l, T0, &ack);
        assert!(matches!(ev, ListenEvent::None));
        assert!(out.iter().any(|s| s.repr.flags.rst()));
    }

    #[test]
    fn tcp_maxseg_lowers_the_syn_ack_mss() {
        let mut l: Listener<u32> = Listener::new(server(), TcpConfig::default(), 8, false);
        l.set_mss(1100);
        l.set_mss(1300);
        let (_c, syn) = client(40001, TcpConfig::default());
        let (_, out) = offer(&mut l, T0, &syn);
        assert_eq!(out[0].repr.options.mss, Some(1100), "never raised again");
    }

    #[test]
    fn a_syn_is_answered_with_the_negotiated_options_and_queued() {
        let cfg = TcpConfig::default();
        let mut l = Listener::new(server(), cfg.clone(), 8, false);
        let (_, syn) = client(40000, cfg.clone());
        let (ev, out) = offer(&mut l, T0, &syn);
        assert!(matches!(ev, ListenEvent::None));
        assert_eq!(l.syn_queue_len(), 1);
        assert_eq!(out.len(), 1);
        let r = &out[0].repr;
        assert_eq!(r.flags, TcpFlags::SYN | TcpFlags::ACK);
        assert_eq!(r.ack, syn.repr.seq.wrapping_add(1));
        assert_eq!(r.options.mss, Some(cfg.mss));
        assert_eq!(r.options.window_scale, Some(cfg.rcv_wscale()));
        assert!(r.options.sack_permitted);
        let (_, ecr) = r.options.timestamps.unwrap();
        assert_eq!(
            ecr,
            syn.repr.options.timestamps.unwrap().0,
            "the SYN's TSval echoed"
        );
        assert_eq!(r.window, 65535, "unscaled, at most 64 KiB");
        // Without the client's options, none come back.
        let plain = TcpConfig {
            window_scaling: false,
            sack: false,
            timestamps: false,
            ..TcpConfig::default()
        };
        let (_, syn) = client(40001, plain);
        let (_, out) = offer(&mut l, T0, &syn);
        let o = &out[0].repr.options;
        assert!(o.window_scale.is_none() && !o.sack_permitted && o.timestamps.is_none());
        assert_eq!(l.stats().listen_syn_received, 2);
    }

    #[test]
    fn the_completing_ack_hands_over_an_established_connection() {
        let cfg = TcpConfig::default();
        let mut l = Listener::new(server(), cfg.clone(), 8, false);
        let (mut c, syn) = client(40000, cfg);
        let (_, out) = offer(&mut l, T0, &syn);
        let ack = complete(&mut c, &out[0], b"hello");
        assert_eq!(ack.payload, b"hello");
        let (ev, _) = offer(&mut l, T0, &ack);
        let mut conn = established(ev);
        assert_eq!(conn.state(), State::Established);
        assert_eq!(conn.remote(), client_addr(40000));
        assert_eq!(conn.irs(), syn.repr.seq);
        assert_eq!(conn.iss(), out[0].repr.seq);
        let mut buf = [0u8; 16];
        assert_eq!(conn.recv(&mut buf), 5, "the data on the ACK was taken");
        assert_eq!(l.syn_queue_len(), 0);
        // The accept queue is FIFO and can be filtered.
        l.push_accept(1);
        l.push_accept(2);
        l.push_accept(3);
        l.retain_accept(|h| *h != 2);
        assert_eq!(l.accept_queue_len(), 2);
        assert_eq!(
            (l.accept(), l.accept(), l.accept()),
            (Some(1), Some(3), None)
        );
    }

    #[test]
    fn a_retransmitted_syn_gets_the_syn_ack_again_and_a_new_one_replaces_the_entry() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, false);
        let (_, syn) = client(40000, TcpConfig::default());
        let (_, first) = offer(&mut l, T0, &syn);
        let (_, again) = offer(&mut l, T0, &syn);
        assert_eq!(again[0].repr.seq, first[0].repr.seq, "same ISS");
        assert_eq!(l.stats().listen_synack_retransmits, 1);
        assert_eq!(l.syn_queue_len(), 1);
        // A SYN with another ISN from the same port: a new attempt.
        let mut newer = syn.clone();
        newer.repr.seq = syn.repr.seq.wrapping_add(1_000_000);
        let (_, out) = offer(&mut l, T0, &newer);
        assert_eq!(out[0].repr.ack, newer.repr.seq.wrapping_add(1));
        assert_eq!(l.syn_queue_len(), 1);
    }

    #[test]
    fn a_backup_key_cookie_is_accepted_and_refreshed_with_the_primary() {
        use crate::hash::fastopen_cookie;
        use usnet_wire::FastOpen;
        let (old, new) = ([0x11u8; 16], [0x22u8; 16]);
        let cfg = TcpConfig {
            fastopen: crate::config::FASTOPEN_SERVER,
            ..TcpConfig::default()
        };
        let mut l = Listener::new(server(), cfg, 8, false);
        l.set_fastopen(16);
        l.set_fastopen_key(new, Some(old));
        let cookie = |k: &[u8; 16], port| fastopen_cookie(k, client_addr(port).ip(), server().ip());
        let syn_with = |port, k: &[u8; 16]| {
            let (_, mut syn) = client(port, TcpConfig::default());
            syn.repr.options.fast_open = Some(FastOpen::with_cookie(&cookie(k, port), false));
            syn.payload = b"hello".to_vec();
            syn
        };
        // The primary key's cookie: the data is taken, no cookie on the SYN-ACK.
        let (ev, _) = offer(&mut l, T0, &syn_with(40000, &new));
        let ListenEvent::Established(mut c) = ev else {
            panic!("the primary key's cookie was refused")
        };
        let drain = |c: &mut Connection| {
            let mut sink = VecSink::default();
            c.poll_transmit(T0, &mut sink);
            sink.segments
        };
        let out = drain(&mut c);
        assert_eq!(out[0].repr.options.fast_open, None);
        // The backup key's: taken too, and the SYN-ACK hands out the primary's.
        let (ev, _) = offer(&mut l, T0, &syn_with(40001, &old));
        let ListenEvent::Established(mut c) = ev else {
            panic!("the backup key's cookie was refused")
        };
        assert_eq!(c.recv_available(), 5, "the SYN's data");
        let out = drain(&mut c);
        assert!(out[0].repr.flags.syn() && out[0].repr.flags.ack());
        assert_eq!(
            out[0].repr.options.fast_open,
            Some(FastOpen::with_cookie(&cookie(&new, 40001), false))
        );
        // Any other key's: a normal handshake offering the primary's.
        let (ev, out) = offer(&mut l, T0, &syn_with(40002, &[0x33; 16]));
        assert!(matches!(ev, ListenEvent::None));
        assert_eq!(
            out[0].repr.options.fast_open,
            Some(FastOpen::with_cookie(&cookie(&new, 40002), false))
        );
        // A 16-byte key clears the backup.
        l.set_fastopen_key(new, None);
        let (ev, _) = offer(&mut l, T0, &syn_with(40003, &old));
        assert!(matches!(ev, ListenEvent::None));
    }

    #[test]
    fn only_an_exact_rst_removes_a_half_open_entry() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, false);
        let (_, syn) = client(40000, TcpConfig::default());
        offer(&mut l, T0, &syn);
        let mut rst = syn.clone();
        rst.repr.flags = TcpFlags::RST;
        rst.repr.seq = syn.repr.seq.wrapping_add(2);
        let (_, out) = offer(&mut l, T0, &rst);
        assert_eq!(l.syn_queue_len(), 1);
        // In the window but not exact: a challenge ACK (RFC 5961 §3.2).
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].repr.flags, TcpFlags::ACK);
        assert_eq!(out[0].repr.ack, syn.repr.seq.wrapping_add(1), "RCV.NXT");
        assert!(out[0].repr.options.timestamps.is_some());
        assert_eq!(l.stats().listen_challenge_acks, 1);
        // Outside the window: dropped.
        rst.repr.seq = syn.repr.seq.wrapping_add(1 << 20);
        let (_, out) = offer(&mut l, T0, &rst);
        assert!(out.is_empty());
        assert_eq!(l.stats().listen_bad_segments, 1);
        rst.repr.seq = syn.repr.seq.wrapping_add(1);
        let (_, out) = offer(&mut l, T0, &rst);
        assert!(out.is_empty(), "no answer to an RST");
        assert_eq!(l.syn_queue_len(), 0);
    }

    #[test]
    fn wrong_acks_and_syn_acks_are_answered_with_rst() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, false);
        let (mut c, syn) = client(40000, TcpConfig::default());
        let (_, out) = offer(&mut l, T0, &syn);
        let mut ack = complete(&mut c, &out[0], b"");
        ack.repr.ack = ack.repr.ack.wrapping_add(1);
        let (ev, rst) = offer(&mut l, T0, &ack);
        assert!(matches!(ev, ListenEvent::None));
        assert_eq!(rst[0].repr.flags, TcpFlags::RST);
        assert_eq!(rst[0].repr.seq, ack.repr.ack, "SEQ = SEG.ACK");
        assert_eq!(l.syn_queue_len(), 1, "the entry survives a forged ACK");
        // A stray ACK (no entry, no cookies) and a SYN-ACK are reset too.
        let (_, stray_syn) = client(40001, TcpConfig::default());
        let mut stray = stray_syn.clone();
        stray.repr.flags = TcpFlags::ACK;
        assert_eq!(offer(&mut l, T0, &stray).1[0].repr.flags, TcpFlags::RST);
        stray.repr.flags = TcpFlags::SYN | TcpFlags::ACK;
        assert_eq!(offer(&mut l, T0, &stray).1[0].repr.flags, TcpFlags::RST);
        assert_eq!(l.stats().listen_rst_sent, 3);
    }

    #[test]
    fn syn_acks_are_retransmitted_with_back_off_then_the_entry_expires() {
        let cfg = TcpConfig {
            synack_retries: 2,
            ..TcpConfig::default()
        };
        let mut l = Listener::new(server(), cfg, 8, false);
        let (_, syn) = client(40000, TcpConfig::default());
        offer(&mut l, T0, &syn);
        let mut sent_at = Vec::new();
        while let Some(t) = l.poll_at() {
            let mut sink = VecSink::default();
            l.poll_transmit(t, &mut sink);
            if !sink.segments.is_empty() {
                sent_at.push(t.saturating_since(T0).as_millis());
            }
        }
        assert_eq!(sent_at, [1000, 3000]);
        assert_eq!(l.stats().listen_synack_retransmits, 2);
        assert_eq!(l.stats().listen_synack_timeouts, 1);
        assert_eq!(l.syn_queue_len(), 0);
    }

    #[test]
    fn a_full_syn_queue_drops_syns_without_cookies() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, false);
        l.set_syn_backlog(1);
        offer(&mut l, T0, &client(40000, TcpConfig::default()).1);
        let (_, out) = offer(&mut l, T0, &client(40001, TcpConfig::default()).1);
        assert!(out.is_empty());
        assert_eq!(l.syn_queue_len(), 1);
        assert_eq!(l.stats().listen_syn_queue_full, 1);
    }

    #[test]
    fn syn_cookies_carry_the_handshake_when_the_queue_is_full() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, true);
        l.set_syn_backlog(0);
        let (mut c, syn) = client(40000, TcpConfig::default());
        let (_, out) = offer(&mut l, T0, &syn);
        assert_eq!(l.syn_queue_len(), 0, "nothing kept");
        assert_eq!(l.stats().listen_cookies_sent, 1);
        // The MSS index: 1460 is encoded exactly.
        assert_eq!(COOKIE_MSS[((out[0].repr.seq >> 24) & 7) as usize], 1460);
        let ack = complete(&mut c, &out[0], b"x");
        // A forged cookie is refused.
        let mut forged = ack.clone();
        forged.repr.ack ^= 0x0000_0100;
        let (ev, rst) = offer(&mut l, T0, &forged);
        assert!(matches!(ev, ListenEvent::None));
        assert!(rst[0].repr.flags.rst());
        assert_eq!(l.stats().listen_cookies_invalid, 1);
        // The real one: window scale and SACK came back in the timestamp echo.
        let conn = established(offer(&mut l, T0 + Duration::from_millis(5), &ack).0);
        assert_eq!(l.stats().listen_cookies_valid, 1);
        let info = conn.info();
        assert_eq!(
            info.wscale,
            Some((
                TcpConfig::default().rcv_wscale(),
                TcpConfig::default().rcv_wscale()
            ))
        );
        assert!(info.sack && info.timestamps);
        assert_eq!(conn.recv_available(), 1);
        // Too late: cookies are only checked within two periods of an overflow.
        let (mut c2, syn2) = client(40001, TcpConfig::default());
        let (_, out2) = offer(&mut l, T0, &syn2);
        let ack2 = complete(&mut c2, &out2[0], b"");
        let late = T0 + Duration::from_secs(2 * COOKIE_PERIOD_SECS + 1);
        let (ev, _) = offer(&mut l, late, &ack2);
        assert!(matches!(ev, ListenEvent::None));
    }

    #[test]
    fn a_cookie_without_timestamps_has_no_window_scaling_or_sack() {
        let mut l = Listener::new(server(), TcpConfig::default(), 8, true);
        l.set_syn_backlog(0);
        let cfg = TcpConfig {
            timestamps: false,
            ..TcpConfig::default()
        };
        let (mut c, syn) = client(40000, cfg);
        let (_, out) = offer(&mut l, T0, &syn);
        let o = &out[0].repr.options;
        assert!(o.window_scale.is_none() && !o.sack_permitted);
        let ack = complete(&mut c, &out[0], b"");
        let conn = established(offer(&mut l, T0, &ack).0);
        let info = conn.info();
        assert_eq!(info.wscale, None);
        assert!(!info.sack && !info.timestamps);
    }

    #[test]
    fn a_full_accept_queue_keeps_the_entry_for_the_next_ack() {
        let mut l = Listener::new(server(), TcpConfig::default(), 1, false);
        let (mut c, syn) = client(40000, TcpConfig::default());
        let (_, out) = offer(&mut l, T0, &syn);
        // The application has not accepted the one connection the backlog holds.
        l.push_accept(7);
        let ack = complete(&mut c, &out[0], b"");
        let (ev, _) = offer(&mut l, T0, &ack);
        assert!(matches!(ev, ListenEvent::None));
        assert_eq!(l.stats().listen_accept_overflow, 1);
        assert_eq!(l.syn_queue_len(), 1);
        // New SYNs are dropped meanwhile.
        let (_, out2) = offer(&mut l, T0, &client(40001, TcpConfig::default()).1);
        assert!(out2.is_empty());
        assert_eq!(l.stats().listen_accept_overflow, 2);
        // Once the application accepts, the client's next ACK completes.
        assert_eq!(l.accept(), Some(7));
        let conn = established(offer(&mut l, T0, &ack).0);
        assert_eq!(conn.state(), State::Established);
    }
}
