//! TCP in the stack: the glue between the socket table and the `usnet-tcp` engine.
//!
//! - **Demux.** `(local, remote)` → connection through a hash map in the socket
//!   table, else the local port → listener (a specific address before a wildcard),
//!   else an RST (never in reply to an RST). The lookup runs in `classify` before the
//!   checksum is verified (early demux, as for UDP).
//! - **Output.** A connection stays in its slot while it runs: the table and the core
//!   are separate fields of the stack, so the connection (borrowed from the table)
//!   sends through a [`CoreSink`] (borrowing the core): each segment becomes one
//!   pool buffer with the payload copied once and the headers written in front
//!   (`send_tcp`). A full transmit queue or an empty pool refuses the segment; the
//!   connection then goes on the blocked list and is polled again once the queue has
//!   room, owner by owner ([`fair`]).
//! - **Timers.** A min-heap of `(deadline, slot, generation)` in the table; a socket
//!   remembers the deadline it is queued under, so stale entries are skipped when
//!   popped. Only sockets whose deadline passed are polled.
//! - **Reaping.** A connection that reaches CLOSED leaves the demux table at once;
//!   its slot is freed when the application has closed it (or never accepted it),
//!   after its counters are merged into the stack's totals.
//!
//! The application's calls are in [`api`]; ICMP errors in [`icmp`].

mod api;
pub(crate) mod fair;
pub(crate) mod icmp;
pub(crate) mod zc;

use std::net::SocketAddr;
use std::sync::Arc;

use usnet_pool::{BufId, Lender, PacketPool, PktBuf};
use usnet_tcp::{ListenEvent, Origin, Payload, Segment, SegmentSink, State, TcpRepr, TxData, Wake};
use usnet_wire as wire;

use crate::core::Core;
use crate::socket::tcp::IpFamily;
use crate::socket::TcpIpOpts;
use crate::socket::{Readiness, Socket, TcpConnSock};
use crate::tx::{GsoPending, IpFields};
use crate::types::{Src, TcpTarget};
use crate::Stack;

pub use api::{TcpConnEntry, TcpListenCopy, TcpListenEntry};

/// The engine's output path: segments go through the core's transmit path.
pub(crate) struct CoreSink<'a> {
    core: &'a mut Core,
    refused: bool,
    /// With TSO: the GSO frame being built from this pass's segments.
    gso: Option<GsoPending>,
    tso: bool,
    /// The connection's TTL and DSCP bits (`TcpConnSock::ip`); each segment's
    /// ECN field goes under them.
    ip: IpFields,
    /// Payload bytes this pass may still send (`None`: no limit). While connections
    /// wait for transmit room, one that is not being served gets 0 and the one whose
    /// turn it is [`fair::QUANTUM`].
    budget: Option<usize>,
    /// With TSO, the memory the connection's lent send ring lies in: its payload
    /// rides GSO frames by reference.
    lent: Option<&'a Arc<dyn Lender>>,
}

impl CoreSink<'_> {
    fn new(core: &mut Core, ip: TcpIpOpts, budget: Option<usize>) -> CoreSink<'_> {
        let tso = core.tso_ok();
        let ip = core.tcp_ip_fields(ip);
        CoreSink {
            core,
            refused: false,
            gso: None,
            tso,
            ip,
            budget,
            lent: None,
        }
    }

    /// The IP fields of a segment (`ect`: ECN-capable transport, RFC 3168).
    fn fields(&self, ect: bool) -> IpFields {
        IpFields::new(
            self.ip.ttl,
            self.ip.tos | if ect { crate::tx::ECN_ECT0 } else { 0 },
        )
    }

    /// Sends the GSO frame in progress (call after the output pass).
    fn flush(&mut self) {
        self.core.flush_gso(&mut self.gso);
    }
}

impl SegmentSink for CoreSink<'_> {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: TxData<'_>,
        ect: bool,
    ) -> bool {
        if let Some(left) = self.budget.as_mut() {
            let len = payload.len();
            if len > 0 && *left == 0 {
                // Deferred like a segment the full queue refused: it waits its turn.
                self.core.counters.tcp_tx_blocked += 1;
                self.refused = true;
                return false;
            }
            *left = left.saturating_sub(len);
        }
        // The TTL and the whole TOS / traffic class byte: DSCP and ECN.
        let ip = self.fields(ect);
        let payload = match payload {
            TxData::Bytes(a, b) => (a, b),
            TxData::Bufs {
                spans,
                at_piece_start,
            } => {
                // With TSO, a full-sized segment is joined with the next ones into
                // one GSO frame (one device write for 64 KiB) that carries the pieces
                // as fragments, where they lie; a short one (a small response), or
                // any without TSO, goes in place.
                let l3 = if remote.is_ipv4() { 20 } else { 40 };
                let full =
                    l3 + repr.header_len() + spans.iter().map(|s| s.len as usize).sum::<usize>()
                        >= self.core.cfg.mtu;
                if self.tso && full {
                    if let Some(ok) =
                        self.core
                            .send_tcp_gso_spans(&mut self.gso, local, remote, repr, spans, ip)
                    {
                        self.refused |= !ok;
                        return ok;
                    }
                } else if let ([one], true) = (spans, at_piece_start) {
                    // Frames leave in order: what is being joined goes first.
                    self.flush();
                    if let Some(ok) = self.core.send_tcp_in_place(local, remote, repr, *one, ip) {
                        self.refused |= !ok;
                        return ok;
                    }
                }
                self.core.counters.tcp_zc_tx_copied += 1;
                let mut bytes = std::mem::take(&mut self.core.zc_scratch);
                bytes.clear();
                for s in spans {
                    // A piece names bytes from its buffer's start (the data window
                    // moves when the buffer is sent in place).
                    match self.core.pool.checked(s.buf) {
                        Some(id) => bytes.extend_from_slice(
                            &self.core.pool.whole(id)[s.off as usize..][..s.len as usize],
                        ),
                        None => debug_assert!(false, "zero-copy piece in a free buffer"),
                    }
                }
                let ok = self.send_bytes(local, remote, repr, (&bytes, &[]), ip);
                self.core.zc_scratch = bytes;
                return ok;
            }
        };
        self.send_bytes(local, remote, repr, payload, ip)
    }

    /// A run of `n` segments of `seg` bytes (`SegmentSink::emit_run`) within the
    /// pass's budget: with TSO into GSO frames, a frame's worth per append;
    /// without, one segment at a time. Returns how many went.
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
        let allowed = self.run_allowed(seg, n);
        let ip = self.fields(ect);
        let sent = if self.tso {
            self.core.send_tcp_gso_run(
                &mut self.gso,
                local,
                remote,
                repr,
                payload,
                seg,
                allowed,
                ip,
                self.lent,
            )
        } else {
            let mut k = 0;
            while k < allowed {
                let r = usnet_tcp::run_segment(repr, seg, k, n);
                let one = usnet_tcp::ring_range(payload, k * seg, seg);
                if !self.core.send_tcp(local, remote, &r, one, ip) {
                    break;
                }
                k += 1;
            }
            k
        };
        self.run_done(sent, allowed, n);
        sent
    }

    /// A run of full-sized zero-copy segments: with TSO, the pieces ride GSO
    /// frames as fragments, a frame's worth per append (`Core::send_tcp_gso_span_run`);
    /// without, or when a piece names no live buffer, one `emit` at a time.
    fn emit_span_run(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        spans: &[usnet_tcp::BufSpan],
        seg: usize,
        n: usize,
        ect: bool,
    ) -> Option<usize> {
        if !self.tso || !self.core.spans_live(spans) {
            return None;
        }
        let saved = self.budget;
        let allowed = self.run_allowed(seg, n);
        let ip = self.fields(ect);
        let sent = self.core.send_tcp_gso_span_run(
            &mut self.gso,
            (local, remote),
            repr,
            spans,
            (seg, allowed, n),
            ip,
        );
        let Some(sent) = sent else {
            // Not joinable (a local destination): one at a time, budget untouched.
            self.budget = saved;
            return None;
        };
        self.run_done(sent, allowed, n);
        Some(sent)
    }
}

impl CoreSink<'_> {
    /// The budget's share of a run of `n` segments of `seg` bytes: each goes while
    /// some budget is left, as one segment at a time would.
    fn run_allowed(&mut self, seg: usize, n: usize) -> usize {
        let Some(left) = self.budget.as_mut() else {
            return n;
        };
        let allowed = n.min(left.div_ceil(seg));
        *left = left.saturating_sub(allowed * seg);
        allowed
    }

    /// After a run: `sent` of `n` went, `allowed` of them within the budget.
    fn run_done(&mut self, sent: usize, allowed: usize, n: usize) {
        if sent < n {
            if sent == allowed {
                // Deferred like a segment the full queue refused: it waits its turn.
                self.core.counters.tcp_tx_blocked += 1;
            }
            self.refused = true;
        }
    }

    fn send_bytes(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
        ip: IpFields,
    ) -> bool {
        let ok = if self.tso {
            self.core
                .send_tcp_gso(&mut self.gso, local, remote, repr, payload, ip, self.lent)
        } else {
            self.core.send_tcp(local, remote, repr, payload, ip)
        };
        self.refused |= !ok;
        ok
    }
}

/// Collects a listener's segments (SYN-ACKs and RSTs carry no payload) while the
/// received frame is still borrowed from the pool.
struct CollectSink<'a>(&'a mut Vec<(SocketAddr, SocketAddr, TcpRepr)>);

impl SegmentSink for CollectSink<'_> {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: TxData<'_>,
        _ect: bool,
    ) -> bool {
        // SYN-ACKs and RSTs: never ECT.
        debug_assert!(payload.is_empty());
        self.0.push((local, remote, *repr));
        true
    }
}

pub(crate) fn readiness_of(c: &usnet_tcp::Connection) -> Readiness {
    let st = c.state();
    let closed = st == State::Closed || c.error().is_some();
    Readiness {
        readable: c.recv_available() > 0 || c.is_eof() || closed,
        // Linux's rule (`sk_stream_is_writeable`): a third of the send buffer's
        // limit free and the unsent bytes under half TCP_NOTSENT_LOWAT.
        writable: closed || (st.is_synchronized() && (!c.may_send() || c.is_writable())),
        closed,
        connected: st.is_synchronized(),
    }
}

impl Core {
    /// The IP fields of a socket's segments, ECN aside: its TTL or the stack's,
    /// its DSCP bits.
    pub(crate) fn tcp_ip_fields(&self, ip: TcpIpOpts) -> IpFields {
        IpFields::new(ip.ttl.unwrap_or(self.cfg.ttl), ip.tos & !3)
    }

    /// Sends what a listener with IP fields `ip` (per family) collected.
    fn send_collected(
        &mut self,
        out: &mut Vec<(SocketAddr, SocketAddr, TcpRepr)>,
        ip: [TcpIpOpts; 2],
    ) {
        for (l, r, repr) in out.drain(..) {
            let f = self.tcp_ip_fields(ip[IpFamily::of(r.ip()).index()]);
            self.send_tcp(l, r, &repr, (&[], &[]), f);
        }
    }
}

impl Stack {
    /// Runs connection `idx`'s output after something happened to it, wakes its
    /// waiters, and reschedules or reaps it.
    pub(crate) fn tcp_settle(&mut self, idx: u32, wake: Wake) {
        let now = self.core.tcp_now();
        let Some(s) = self.sockets.conn_at_mut(idx) else {
            return;
        };
        if s.fin_pending && s.conn.state().is_synchronized() {
            s.fin_pending = false;
            s.conn.shutdown_write();
        }
        // While connections wait for room, only the one whose turn it is sends payload.
        let budget = if self.sockets.tcp.serving == Some(idx) {
            Some(fair::QUANTUM)
        } else if !self.sockets.tcp.blocked.is_empty() {
            Some(0)
        } else {
            None
        };
        let Some(s) = self.sockets.conn_at_mut(idx) else {
            return;
        };
        let mut sink = CoreSink::new(&mut self.core, s.ip, budget);
        if sink.tso && s.conn.lent_head().is_some() {
            sink.lent = s.lender.as_ref();
        }
        let w = s.conn.poll_transmit(now, &mut sink);
        sink.flush();
        let learned = s.conn.take_fastopen_learned().map(|l| (s.remote.ip(), l));
        let try_exp = s.conn.take_fastopen_try_exp();
        let refused = sink.refused;
        zc::settle_bufs(&mut self.core.pool, &mut s.conn);
        let deadline = s.conn.poll_at();
        let state = s.conn.state();
        let mut newly_blocked = false;
        if refused && !s.blocked {
            s.blocked = true;
            newly_blocked = true;
        }
        let notify = !s.orphan
            && (wake.readable
                || wake.writable
                || wake.closed
                || w.readable
                || w.writable
                || w.closed);
        if newly_blocked {
            let owner = self.sockets.slots[idx as usize].owner;
            self.sockets.tcp.blocked.push(owner, idx);
        }
        // Client Fast Open: the SYN-ACK's MSS and cookie go to the cache.
        if let Some((ip, (mss, cookie))) = learned {
            let e = self.sockets.tcp.fo_cache.entry(ip).or_default();
            if mss != 0 {
                e.mss = mss;
            }
            if cookie.is_some() {
                e.cookie = cookie;
            } else if let Some(t) = try_exp {
                // No cookie in either encoding yet: the other encoding next (once).
                if e.cookie.is_none() && t > e.try_exp {
                    e.try_exp = t;
                }
            }
        }
        if notify {
            self.sockets.mark_ready(idx);
        }
        if state == State::Closed {
            self.tcp_on_closed(idx);
        } else {
            self.sockets.tcp_schedule(idx, deadline);
        }
    }

    /// A connection reached CLOSED: out of the demux table; freed if nobody holds it.
    fn tcp_on_closed(&mut self, idx: u32) {
        let Some(s) = self.sockets.conn_at_mut(idx) else {
            return;
        };
        s.timer = None;
        let key = (s.local, s.remote);
        let was_in = std::mem::replace(&mut s.in_table, false);
        let parent = s.parent;
        let orphan = s.orphan;
        if was_in && self.sockets.tcp.conns.get(&key) == Some(&idx) {
            self.sockets.tcp.conns.remove(&key);
        }
        if parent.is_some() {
            // Died in the accept queue: it stays there, as in Linux, so `accept`
            // returns it and its reads report what ended it (the queue is bounded by
            // the backlog; closing the listener frees it).
        } else if orphan {
            self.tcp_reap(idx);
        }
    }

    /// Frees a connection's slot, keeping its counters.
    fn tcp_reap(&mut self, idx: u32) {
        let h = self.sockets.handle_at(idx);
        if let Some(Socket::TcpConn(mut s)) = self.sockets.remove(h) {
            s.conn.release_buffers();
            zc::settle_bufs(&mut self.core.pool, &mut s.conn);
            let t = &mut self.sockets.tcp;
            if s.in_table && t.conns.get(&(s.local, s.remote)) == Some(&idx) {
                t.conns.remove(&(s.local, s.remote));
            }
            t.totals.merge(&s.conn.stats());
            t.live -= 1;
            self.core.counters.tcp_conns_reaped += 1;
            self.core.counters.mirror_tcp(&t.totals);
        }
    }

    /// A checksum-verified segment from the receive path (`ce`: its IP header was
    /// CE-marked).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tcp_input(
        &mut self,
        target: TcpTarget,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        src: Src,
        ce: bool,
    ) {
        match target {
            TcpTarget::Conn(i) => self.tcp_input_conn(i, local, remote, off, len, src, ce),
            TcpTarget::Listener(i) => self.tcp_input_listener(i, local, remote, off, len, src),
            TcpTarget::None => self.tcp_input_no_socket(local, remote, off, len, src),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn tcp_input_conn(
        &mut self,
        i: u32,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        src: Src,
        ce: bool,
    ) {
        let now = self.core.tcp_now();
        let Some(s) = self.sockets.conn_at_mut(i) else {
            self.core.release(src);
            return;
        };
        // A zero-copy connection keeps the payload's buffers, and a buffer it kept must
        // not lead on to the rest of a chain: a chain is split into its buffers
        // (`tail`, freed after the input), each holding its part where it lies. A
        // chain someone else also holds, or a SYN (which may leave for a listener
        // that reads the segment whole), is linearised and copied into buffers of
        // its own instead.
        let mut tail = Vec::new();
        let src = match src {
            Src::Buf(b) if s.conn.is_zero_copy() && !self.core.pool.is_single(&b) => {
                let pool = &mut self.core.pool;
                let syn = pool
                    .data(&b)
                    .get(off + 13)
                    .is_some_and(|f| f & wire::TcpFlags::SYN.0 as u8 != 0);
                if pool.is_private(&b) && !syn {
                    pool.unchain(&b, &mut tail);
                    Src::Buf(b)
                } else {
                    self.core.linearise(b)
                }
            }
            src => src,
        };
        if !tail.is_empty() || matches!(&src, Src::Buf(b) if !self.core.pool.is_single(b)) {
            self.core.counters.tcp_rx_chained += 1;
        }
        let mut staged = Vec::new();
        let mut origins = Vec::new();
        if s.conn.is_zero_copy() {
            if let Src::Owned { data, .. } = &src {
                if let Ok(hdr) = wire::parse_tcp(&data[off..off + len]) {
                    zc::stage(&mut self.core.pool, hdr.payload, &mut staged, &mut origins);
                    self.core.counters.tcp_zc_rx_staged += 1;
                }
            }
        }
        // None: malformed; Some(None): a SYN that ends a TIME-WAIT.
        let outcome = {
            let pool = &self.core.pool;
            let bytes = src.bytes(pool);
            // A chained frame's first buffer holds the header and the payload's start.
            let head_end = (off + len).min(bytes.len());
            match wire::parse_tcp(&bytes[off..head_end]) {
                Err(_) => None,
                Ok(hdr) => {
                    let mut seg = Segment::from(&hdr);
                    seg.ce = ce;
                    let mut parts: Vec<&[u8]> = Vec::new();
                    if let Src::Owned { gso_size, .. } = &src {
                        seg.gso_size = *gso_size;
                    }
                    if let Src::Buf(b) = &src {
                        seg.gso_size = pool.offload(b).gso_size;
                        if !tail.is_empty() {
                            let total = len - hdr.header_len;
                            split_payload(
                                pool,
                                b,
                                hdr.payload,
                                &tail,
                                total,
                                &mut parts,
                                &mut origins,
                            );
                            seg.payload = Payload::chain_with_origins(&parts, &origins);
                        } else if !pool.is_single(b) {
                            chained_payload(pool, b, hdr.payload, len - hdr.header_len, &mut parts);
                            seg.payload = Payload::chain(&parts);
                        } else if s.conn.is_zero_copy() {
                            seg.payload = Payload::with_origin(
                                hdr.payload,
                                zc::origin_in(pool, b, hdr.payload),
                            );
                        }
                    } else if !origins.is_empty() {
                        parts.extend(hdr.payload.chunks(pool.buf_size()));
                        seg.payload = Payload::chain_with_origins(&parts, &origins);
                    }
                    if s.conn.state() == State::TimeWait && s.conn.time_wait_accepts_syn(&seg) {
                        Some(None)
                    } else {
                        Some(Some(s.conn.input(now, &seg)))
                    }
                }
            }
        };
        zc::settle_bufs(&mut self.core.pool, &mut s.conn);
        for b in staged.into_iter().chain(tail) {
            self.core.pool.free(b);
        }
        match outcome {
            Some(Some(wake)) => {
                self.core.release(src);
                self.tcp_settle(i, wake);
            }
            None => {
                self.core.counters.tcp_rx_truncated += 1;
                self.core.release(src);
            }
            Some(None) => {
                // RFC 6191: the old incarnation goes, the SYN meets the listener.
                self.core.counters.tcp_time_wait_reused += 1;
                s.timer = None;
                s.in_table = false;
                let key = (s.local, s.remote);
                let orphan = s.orphan;
                self.sockets.tcp.conns.remove(&key);
                if orphan {
                    self.tcp_reap(i);
                }
                let t = self.sockets.tcp_lookup(local, remote);
                if matches!(t, TcpTarget::Conn(_)) {
                    self.core.release(src);
                    return;
                }
                // A listener reads the segment whole.
                let src = match src {
                    Src::Buf(b) if !self.core.pool.is_single(&b) => self.core.linearise(b),
                    src => src,
                };
                self.tcp_input(t, local, remote, off, len, src, ce);
            }
        }
    }

    fn tcp_input_listener(
        &mut self,
        i: u32,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        src: Src,
    ) {
        let now = self.core.tcp_now();
        let lh = self.sockets.handle_at(i);
        let mut out = std::mem::take(&mut self.sockets.tcp.out);
        let ev = {
            let Some(l) = self.sockets.listen_at_mut(i) else {
                self.sockets.tcp.out = out;
                self.core.release(src);
                return;
            };
            let Some(lst) = l.family(remote) else {
                self.sockets.tcp.out = out;
                return self.tcp_input_no_socket(local, remote, off, len, src);
            };
            let pool = &self.core.pool;
            let bytes = src.bytes(pool);
            match wire::parse_tcp(&bytes[off..off + len]) {
                Ok(hdr) => {
                    let mut seg = Segment::from(&hdr);
                    // Data on the ACK that completes the handshake of a zero-copy
                    // listener's child, or on a Fast Open SYN it accepts, stays in
                    // its buffer (a linearised chain's data is not taken: the peer
                    // sends it again). Only a child the listener returns at once
                    // takes payload (a SYN-queue entry keeps none), and its
                    // references are settled below, before the frame is freed.
                    if let Src::Buf(b) = &src {
                        seg.payload =
                            Payload::with_origin(hdr.payload, zc::origin_in(pool, b, hdr.payload));
                    }
                    Some(lst.input(now, local, remote, &seg, &mut CollectSink(&mut out)))
                }
                Err(_) => None,
            }
        };
        let ev = match ev {
            Some(ListenEvent::Established(mut conn)) => {
                zc::settle_bufs(&mut self.core.pool, &mut conn);
                Some(ListenEvent::Established(conn))
            }
            other => other,
        };
        self.core.release(src);
        let ip = self
            .sockets
            .listen_at_mut(i)
            .map_or_else(Default::default, |l| l.ip);
        self.core.send_collected(&mut out, ip);
        self.sockets.tcp.out = out;
        match ev {
            None => self.core.counters.tcp_rx_truncated += 1,
            Some(ListenEvent::None) => {}
            Some(ListenEvent::Established(conn)) => self.tcp_adopt(i, lh, *conn),
        }
        let d = self.sockets.listen_at_mut(i).and_then(|l| l.poll_at());
        self.sockets.tcp_schedule(i, d);
    }

    /// No connection and no listener: an RST (never for an RST).
    fn tcp_input_no_socket(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        src: Src,
    ) {
        self.core.counters.tcp_rx_no_socket += 1;
        let reply = {
            let bytes = src.bytes(&self.core.pool);
            match wire::parse_tcp(&bytes[off..off + len]) {
                Ok(hdr) => usnet_tcp::reset_for(local.port(), remote.port(), &Segment::from(&hdr)),
                Err(_) => {
                    self.core.counters.tcp_rx_truncated += 1;
                    None
                }
            }
        };
        self.core.release(src);
        if let Some(r) = reply {
            let f = IpFields::ttl(self.core.cfg.ttl);
            if self.core.send_tcp(local, remote, &r, (&[], &[]), f) {
                self.core.counters.tcp_tx_reset_no_socket += 1;
            }
        }
    }

    /// A handshake completed on listener `li`: the connection joins the table (with
    /// the listener's owner) and the accept queue.
    fn tcp_adopt(&mut self, li: u32, lh: crate::SocketHandle, conn: usnet_tcp::Connection) {
        let key = (conn.local(), conn.remote());
        let owner = self.sockets.slots[li as usize].owner;
        let mut sock = TcpConnSock::new(conn, Some(lh));
        // The listener's IP fields for the peer's family, as Linux's child
        // socket copies its parent's.
        if let Some(l) = self.sockets.listen_at_mut(li) {
            sock.ip = l.ip[IpFamily::of(key.1.ip()).index()];
        }
        let h = self.sockets.insert(Socket::TcpConn(Box::new(sock)), owner);
        self.sockets.tcp.live += 1;
        self.sockets.tcp.conns.insert(key, h.index);
        if let Some(f) = self.sockets.listen_at_mut(li).and_then(|l| l.family(key.1)) {
            f.push_accept(h);
        }
        self.core.counters.tcp_passive_opens += 1;
        self.sockets.mark_ready(li);
        self.tcp_settle(h.index, Wake::default());
    }

    fn tcp_poll_one(&mut self, idx: u32) {
        let slot = self.sockets.slots.get_mut(idx as usize);
        match slot.and_then(|s| s.sock.as_mut()) {
            // A waiting connection stays on the list (`blocked`) until its turn.
            Some(Socket::TcpConn(_)) => self.tcp_settle(idx, Wake::default()),
            Some(Socket::TcpListen(l)) => {
                let now = self.core.tcp_now();
                let mut out = std::mem::take(&mut self.sockets.tcp.out);
                for f in l.families() {
                    f.poll_transmit(now, &mut CollectSink(&mut out));
                }
                let (d, ip) = (l.poll_at(), l.ip);
                self.core.send_collected(&mut out, ip);
                self.sockets.tcp.out = out;
                self.sockets.tcp_schedule(idx, d);
            }
            _ => {}
        }
    }

    /// Polls the sockets whose deadline passed and the ones waiting for transmit room.
    pub(crate) fn tcp_poll_timers(&mut self) -> bool {
        let now = self.core.now.as_nanos();
        let mut due = std::mem::take(&mut self.sockets.tcp.due);
        self.sockets.tcp_expired(now, &mut due);
        let mut did = !due.is_empty();
        for &idx in &due {
            self.tcp_poll_one(idx);
        }
        due.clear();
        self.sockets.tcp.due = due;
        if !self.sockets.tcp.blocked.is_empty() && self.core.tx.len() < self.core.cfg.tx_queue_len {
            self.tcp_serve_waiters();
            did = true;
        }
        self.sockets.tcp_compact_timers();
        did
    }

    /// Gives the waiting connections their turns ([`fair`]) while the transmit
    /// queue has room: a turn is one connection's output, at most a quantum of
    /// payload; one that has more waits again behind its owner's others.
    fn tcp_serve_waiters(&mut self) {
        // Each waiting connection about twice (a turn ends at a quantum or a full
        // queue, so this bounds the pass, not the rate).
        let mut turns = 2 * self.sockets.tcp.blocked.len() + 16;
        while turns > 0 && self.core.tx.len() < self.core.cfg.tx_queue_len {
            let Some(idx) = self.sockets.tcp.blocked.pop() else {
                break;
            };
            turns -= 1;
            match self.sockets.conn_at_mut(idx) {
                Some(s) if s.blocked => s.blocked = false,
                _ => continue, // closed, or a slot reused since
            }
            let queued = self.core.tx.len();
            self.sockets.tcp.serving = Some(idx);
            self.tcp_poll_one(idx);
            self.sockets.tcp.serving = None;
            // Refused with room in the queue and nothing sent: the pool is dry;
            // wait for the next pass.
            if self.core.tx.len() == queued && self.sockets.conn_at(idx).is_some_and(|s| s.blocked)
            {
                break;
            }
        }
    }

    /// The earliest TCP deadline (stale heap entries only make it early).
    pub(crate) fn tcp_poll_at(&self) -> Option<crate::Instant> {
        if !self.sockets.tcp.blocked.is_empty() {
            return Some(self.core.now);
        }
        self.sockets
            .tcp
            .timers
            .peek()
            .map(|std::cmp::Reverse((t, _, _))| crate::Instant::from_nanos(*t))
    }
}

/// The payload of a TCP segment in a chain split into single buffers (`head`, then
/// `tail`), as parts where they lie and the origin of each: `first` (its part in
/// `head`), then the bytes of each tail buffer, `total` bytes in all (link padding
/// left out).
fn split_payload<'p>(
    pool: &'p PacketPool,
    head: &PktBuf,
    first: &'p [u8],
    tail: &[PktBuf],
    total: usize,
    parts: &mut Vec<&'p [u8]>,
    origins: &mut Vec<Origin>,
) {
    let mut left = total;
    for (buf, data) in std::iter::once((head, first)).chain(tail.iter().map(|b| (b, pool.data(b))))
    {
        let part = &data[..data.len().min(left)];
        if part.is_empty() {
            continue;
        }
        parts.push(part);
        origins.push(zc::origin_in(pool, buf, part));
        left -= part.len();
    }
}

/// The payload of a TCP segment in a chained frame, read where it lies: `first` (its
/// part in the head buffer `head`), then the bytes of the buffers chained after it,
/// `total` bytes in all (link padding after them left out).
fn chained_payload<'p>(
    pool: &'p PacketPool,
    head: &PktBuf,
    first: &'p [u8],
    total: usize,
    parts: &mut Vec<&'p [u8]>,
) {
    let mut left = total;
    let mut part = &first[..first.len().min(left)];
    let mut at = Some(BufId::from(head));
    while let Some(b) = at {
        if !part.is_empty() {
            parts.push(part);
            left -= part.len();
        }
        at = pool.next(b);
        if let Some(n) = at {
            let data = pool.data(n);
            part = &data[..data.len().min(left)];
        }
    }
}
