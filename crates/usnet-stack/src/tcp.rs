//! TCP in the stack: the glue between the socket table and the `usnet-tcp` engine.
//!
//! - **Demux.** `(local, remote)` → connection through a hash map in the socket set,
//!   else the local port → listener (a specific address before a wildcard), else an
//!   RST (never in reply to an RST). The lookup runs in `classify` before the
//!   checksum is verified (early demux, as for UDP).
//! - **Output.** A connection is taken out of its slot while it runs, so its
//!   [`SegmentSink`] can borrow the whole stack: each segment becomes one pool buffer
//!   with the payload copied once and the headers written in front (`send_tcp`). A
//!   full transmit queue or an empty pool refuses the segment; the connection then
//!   goes on the blocked list and is polled again once the queue has room.
//! - **Timers.** A min-heap of `(deadline, slot, generation)`; a socket remembers the
//!   deadline it is queued under, so stale entries are skipped when popped. Only
//!   sockets whose deadline passed are polled.
//! - **Reaping.** A connection that reaches CLOSED leaves the demux table at once;
//!   its slot is freed when the application has closed it (or never accepted it),
//!   after its counters are merged into the stack's totals.

pub(crate) mod icmp;

use std::cmp::Reverse;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_tcp::{
    CcAlgorithm, Connection, Keepalive, ListenEvent, Listener, Segment, SegmentSink, State,
    TcpConfig, TcpError, TcpInfo, TcpRepr, TcpStats, Wake,
};
use usnet_wire as wire;

use crate::rx::Src;
use crate::socket::{Readiness, Socket, SocketHandle, SocketStats, EPHEMERAL_FIRST};
use crate::{Stack, StackError};

/// What the early demux found for a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcpTarget {
    None,
    Conn(u32),
    Listener(u32),
}

/// A connection's slot in the socket table.
pub(crate) struct TcpConnSock {
    /// `None` only while the connection runs (taken out so its sink can borrow the
    /// stack).
    pub conn: Option<Box<Connection>>,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// In the demux table under `(local, remote)`.
    pub in_table: bool,
    /// Deadline (ns) this socket is queued under in the timer heap.
    pub timer: Option<u64>,
    /// The listener whose accept queue holds it, until accepted.
    pub parent: Option<SocketHandle>,
    /// The application closed it; it lives on until CLOSED, then is freed.
    pub orphan: bool,
    /// On the blocked list (its sink was refused).
    pub blocked: bool,
    /// `tcp_shutdown_write` before the handshake completed: FIN once it has.
    pub fin_pending: bool,
}

impl fmt::Debug for TcpConnSock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConnSock")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("state", &self.conn.as_ref().map(|c| c.state()))
            .field("orphan", &self.orphan)
            .finish()
    }
}

/// A listening socket: one engine listener per address family, so each advertises
/// the MSS of its family.
#[derive(Debug)]
pub(crate) struct TcpListenSock {
    pub local: SocketAddr,
    pub v4: Option<Listener<SocketHandle>>,
    pub v6: Option<Listener<SocketHandle>>,
    pub timer: Option<u64>,
}

impl TcpListenSock {
    fn family(&mut self, remote: SocketAddr) -> Option<&mut Listener<SocketHandle>> {
        if remote.is_ipv4() {
            self.v4.as_mut()
        } else {
            self.v6.as_mut()
        }
    }
    fn poll_at(&self) -> Option<usnet_tcp::Instant> {
        [
            self.v4.as_ref().and_then(|l| l.poll_at()),
            self.v6.as_ref().and_then(|l| l.poll_at()),
        ]
        .into_iter()
        .flatten()
        .min()
    }
    fn accept_queue_len(&self) -> usize {
        self.v4.as_ref().map_or(0, |l| l.accept_queue_len())
            + self.v6.as_ref().map_or(0, |l| l.accept_queue_len())
    }
    fn syn_queue_len(&self) -> usize {
        self.v4.as_ref().map_or(0, |l| l.syn_queue_len())
            + self.v6.as_ref().map_or(0, |l| l.syn_queue_len())
    }
    fn merge_stats(&self, into: &mut TcpStats) {
        for l in self.v4.iter().chain(self.v6.iter()) {
            into.merge(l.stats());
        }
    }
}

/// One connection as `tcp_connections` lists it (like a line of `ss -ti`).
#[derive(Debug, Clone)]
pub struct TcpConnEntry {
    pub handle: SocketHandle,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Closed by the application, finishing in the background.
    pub orphan: bool,
    pub info: TcpInfo,
}

/// One listener as `tcp_listeners` lists it.
#[derive(Debug, Clone, Copy)]
pub struct TcpListenEntry {
    pub handle: SocketHandle,
    pub local: SocketAddr,
    pub syn_queue: usize,
    pub accept_queue: usize,
}

/// The stack's TCP state besides the socket table.
#[derive(Debug, Default)]
pub(crate) struct TcpGlobal {
    pub timers: std::collections::BinaryHeap<Reverse<(u64, u32, u32)>>,
    pub blocked: Vec<u32>,
    pub due: Vec<u32>,
    pub next_ephemeral: u16,
    /// Counters of reaped connections and closed listeners.
    pub totals: TcpStats,
    /// Segments a listener produced, sent once the received frame is released.
    pub out: Vec<(SocketAddr, SocketAddr, TcpRepr)>,
    pub secret: usnet_tcp::SecretKey,
    /// TCP sockets alive (for the timer heap's compaction rule).
    pub live: usize,
}

impl TcpGlobal {
    pub fn new(seed: u64) -> Self {
        let span = (u16::MAX - EPHEMERAL_FIRST) as u64 + 1;
        TcpGlobal {
            next_ephemeral: EPHEMERAL_FIRST + ((seed >> 24) % span) as u16,
            secret: usnet_tcp::SecretKey::derive(seed),
            ..Default::default()
        }
    }
}

/// The engine's errors as the stack reports them.
pub(crate) fn tcp_err(e: TcpError) -> StackError {
    match e {
        TcpError::Refused => StackError::ConnectionRefused,
        TcpError::Reset => StackError::ConnectionReset,
        TcpError::TimedOut => StackError::TimedOut,
        TcpError::Aborted => StackError::ConnectionAborted,
        TcpError::HostUnreachable => StackError::HostUnreachable,
        TcpError::NetUnreachable => StackError::NetUnreachable,
    }
}

struct StackSink<'a> {
    stack: &'a mut Stack,
    refused: bool,
    /// With TSO: the GSO frame being built from this pass's segments.
    gso: Option<crate::tx::GsoPending>,
    tso: bool,
}

impl StackSink<'_> {
    fn new(stack: &mut Stack) -> StackSink<'_> {
        let tso = stack.tso_ok();
        StackSink {
            stack,
            refused: false,
            gso: None,
            tso,
        }
    }

    /// Sends the GSO frame in progress (call after the output pass).
    fn flush(&mut self) {
        self.stack.flush_gso(&mut self.gso);
    }
}

impl SegmentSink for StackSink<'_> {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
    ) -> bool {
        let ok = if self.tso {
            self.stack
                .send_tcp_gso(&mut self.gso, local, remote, repr, payload)
        } else {
            self.stack.send_tcp(local, remote, repr, payload)
        };
        self.refused |= !ok;
        ok
    }
}

/// Collects a listener's segments (SYN-ACKs and RSTs carry no payload) while the
/// received frame is still borrowed.
struct CollectSink<'a>(&'a mut Vec<(SocketAddr, SocketAddr, TcpRepr)>);

impl SegmentSink for CollectSink<'_> {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
    ) -> bool {
        debug_assert!(payload.0.is_empty() && payload.1.is_empty());
        self.0.push((local, remote, *repr));
        true
    }
}

fn readiness_of(c: &Connection) -> Readiness {
    let st = c.state();
    let closed = st == State::Closed || c.error().is_some();
    let low_water = (c.config().send_buffer / 4).max(1);
    Readiness {
        readable: c.recv_available() > 0 || c.is_eof() || closed,
        writable: closed
            || (st.is_synchronized() && (!c.may_send() || c.send_capacity() >= low_water)),
        closed,
        connected: st.is_synchronized(),
    }
}

impl Stack {
    pub(crate) fn tcp_now(&self) -> usnet_tcp::Instant {
        usnet_tcp::Instant::from_nanos(self.now.as_nanos())
    }

    fn handle_at(&self, idx: u32) -> SocketHandle {
        SocketHandle {
            index: idx,
            gen: self.sockets.slots[idx as usize].gen,
        }
    }

    fn conn_sock_at(&mut self, idx: u32) -> Option<&mut TcpConnSock> {
        match self.sockets.slots.get_mut(idx as usize)?.sock.as_mut()? {
            Socket::TcpConn(s) => Some(s),
            _ => None,
        }
    }

    fn conn_sock(&self, h: SocketHandle) -> Result<&TcpConnSock, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) if !s.orphan => Ok(s),
            Socket::TcpConn(_) => Err(StackError::InvalidHandle),
            _ => Err(StackError::WrongType),
        }
    }

    fn conn_sock_mut(&mut self, h: SocketHandle) -> Result<&mut TcpConnSock, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) if !s.orphan => Ok(s),
            Socket::TcpConn(_) => Err(StackError::InvalidHandle),
            _ => Err(StackError::WrongType),
        }
    }

    fn conn(&self, h: SocketHandle) -> Result<&Connection, StackError> {
        self.conn_sock(h)?
            .conn
            .as_deref()
            .ok_or(StackError::InvalidHandle)
    }

    fn conn_mut(&mut self, h: SocketHandle) -> Result<&mut Connection, StackError> {
        self.conn_sock_mut(h)?
            .conn
            .as_deref_mut()
            .ok_or(StackError::InvalidHandle)
    }

    fn listen_sock_mut(&mut self, h: SocketHandle) -> Result<&mut TcpListenSock, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => Ok(l),
            _ => Err(StackError::WrongType),
        }
    }

    /// The configuration a new connection or listener starts from: the caller's,
    /// with the stack's secret.
    fn tcp_prepare(&self, mut cfg: TcpConfig) -> TcpConfig {
        cfg.secret = self.tcp.secret;
        cfg
    }

    /// Runs a connection's output after something happened to it, puts it back in
    /// its slot, wakes its waiters, and reschedules or reaps it.
    pub(crate) fn tcp_settle(&mut self, idx: u32, mut conn: Box<Connection>, wake: Wake) {
        let now = self.tcp_now();
        if let Some(s) = self.conn_sock_at(idx) {
            if s.fin_pending && conn.state().is_synchronized() {
                s.fin_pending = false;
                conn.shutdown_write();
            }
        }
        let mut sink = StackSink::new(self);
        let w = conn.poll_transmit(now, &mut sink);
        sink.flush();
        let refused = sink.refused;
        let deadline = conn.poll_at();
        let state = conn.state();
        let Some(s) = self.conn_sock_at(idx) else {
            return;
        };
        s.conn = Some(conn);
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
            self.tcp.blocked.push(idx);
        }
        if notify {
            self.sockets.mark_ready(idx);
        }
        if state == State::Closed {
            self.tcp_on_closed(idx);
        } else {
            self.tcp_schedule(idx, deadline);
        }
    }

    fn tcp_schedule(&mut self, idx: u32, deadline: Option<usnet_tcp::Instant>) {
        let gen = self.sockets.slots[idx as usize].gen;
        let timer = match self.sockets.slots[idx as usize].sock.as_mut() {
            Some(Socket::TcpConn(s)) => &mut s.timer,
            Some(Socket::TcpListen(l)) => &mut l.timer,
            _ => return,
        };
        match deadline {
            None => *timer = None,
            Some(d) => {
                let d = d.as_nanos();
                // A later deadline keeps the earlier entry: when it pops, the socket
                // is polled (nothing to do) and queued under its real deadline.
                if timer.is_none_or(|t| d < t) {
                    *timer = Some(d);
                    self.tcp.timers.push(Reverse((d, idx, gen)));
                }
            }
        }
    }

    /// A connection reached CLOSED: out of the demux table; freed if nobody holds it.
    fn tcp_on_closed(&mut self, idx: u32) {
        let Some(s) = self.conn_sock_at(idx) else {
            return;
        };
        s.timer = None;
        let key = (s.local, s.remote);
        let was_in = std::mem::replace(&mut s.in_table, false);
        let parent = s.parent;
        let orphan = s.orphan;
        if was_in && self.sockets.tcp_conns.get(&key) == Some(&idx) {
            self.sockets.tcp_conns.remove(&key);
        }
        if let Some(p) = parent {
            // Died in the accept queue: nobody will ever accept it.
            let h = self.handle_at(idx);
            if let Ok(l) = self.listen_sock_mut(p) {
                for f in [l.v4.as_mut(), l.v6.as_mut()].into_iter().flatten() {
                    f.retain_accept(|c| *c != h);
                }
            }
            self.tcp_reap(idx);
        } else if orphan {
            self.tcp_reap(idx);
        }
    }

    /// Frees a connection's slot, keeping its counters.
    fn tcp_reap(&mut self, idx: u32) {
        let h = self.handle_at(idx);
        if let Some(Socket::TcpConn(s)) = self.sockets.remove(h) {
            if s.in_table && self.sockets.tcp_conns.get(&(s.local, s.remote)) == Some(&idx) {
                self.sockets.tcp_conns.remove(&(s.local, s.remote));
            }
            if let Some(c) = s.conn {
                self.tcp.totals.merge(c.stats());
            }
            self.tcp.live -= 1;
            self.counters.tcp_conns_reaped += 1;
            self.counters.mirror_tcp(&self.tcp.totals);
        }
    }

    fn tcp_flush_out(&mut self, out: &mut Vec<(SocketAddr, SocketAddr, TcpRepr)>) {
        for (l, r, repr) in out.drain(..) {
            self.send_tcp(l, r, &repr, (&[], &[]));
        }
    }

    /// A checksum-verified segment from the receive path.
    pub(crate) fn tcp_input(
        &mut self,
        target: TcpTarget,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        src: Src,
    ) {
        let now = self.tcp_now();
        match target {
            TcpTarget::Conn(i) => {
                let Some(mut conn) = self.conn_sock_at(i).and_then(|s| s.conn.take()) else {
                    self.release(src);
                    return;
                };
                // None: malformed; Some(None): a SYN that ends a TIME-WAIT.
                let outcome = {
                    let bytes = Self::src_bytes(&self.pool, &src);
                    match wire::parse_tcp(&bytes[off..off + len]) {
                        Err(_) => None,
                        Ok(hdr) => {
                            let mut seg = Segment::from(&hdr);
                            if let Src::Buf(b) = &src {
                                seg.gso_size = self.pool.offload(*b).gso_size;
                            }
                            if conn.state() == State::TimeWait && conn.time_wait_accepts_syn(&seg) {
                                Some(None)
                            } else {
                                Some(Some(conn.input(now, &seg)))
                            }
                        }
                    }
                };
                match outcome {
                    Some(Some(wake)) => {
                        self.release(src);
                        self.tcp_settle(i, conn, wake);
                    }
                    None => {
                        self.counters.tcp_rx_truncated += 1;
                        self.release(src);
                        if let Some(s) = self.conn_sock_at(i) {
                            s.conn = Some(conn);
                        }
                    }
                    Some(None) => {
                        // RFC 6191: the old incarnation goes, the SYN meets the listener.
                        self.counters.tcp_time_wait_reused += 1;
                        let Some(s) = self.conn_sock_at(i) else {
                            self.release(src);
                            return;
                        };
                        s.conn = Some(conn);
                        s.timer = None;
                        let key = (s.local, s.remote);
                        s.in_table = false;
                        let orphan = s.orphan;
                        self.sockets.tcp_conns.remove(&key);
                        if orphan {
                            self.tcp_reap(i);
                        }
                        let t = self.sockets.tcp_lookup(local, remote);
                        if matches!(t, TcpTarget::Conn(_)) {
                            self.release(src);
                            return;
                        }
                        self.tcp_input(t, local, remote, off, len, src);
                    }
                }
            }
            TcpTarget::Listener(i) => {
                let lh = self.handle_at(i);
                let mut out = std::mem::take(&mut self.tcp.out);
                let ev = {
                    let Some(Socket::TcpListen(l)) = self.sockets.slots[i as usize].sock.as_mut()
                    else {
                        self.tcp.out = out;
                        self.release(src);
                        return;
                    };
                    let Some(lst) = l.family(remote) else {
                        self.tcp.out = out;
                        return self.tcp_input(TcpTarget::None, local, remote, off, len, src);
                    };
                    let bytes = Self::src_bytes(&self.pool, &src);
                    match wire::parse_tcp(&bytes[off..off + len]) {
                        Ok(hdr) => Some(lst.input(
                            now,
                            local,
                            remote,
                            &Segment::from(&hdr),
                            &mut CollectSink(&mut out),
                        )),
                        Err(_) => None,
                    }
                };
                self.release(src);
                self.tcp_flush_out(&mut out);
                self.tcp.out = out;
                match ev {
                    None => self.counters.tcp_rx_truncated += 1,
                    Some(ListenEvent::None) => {}
                    Some(ListenEvent::Established(conn)) => self.tcp_adopt(i, lh, conn),
                }
                let d = match self.sockets.slots[i as usize].sock.as_ref() {
                    Some(Socket::TcpListen(l)) => l.poll_at(),
                    _ => None,
                };
                self.tcp_schedule(i, d);
            }
            TcpTarget::None => {
                self.counters.tcp_rx_no_socket += 1;
                let reply = {
                    let bytes = Self::src_bytes(&self.pool, &src);
                    match wire::parse_tcp(&bytes[off..off + len]) {
                        Ok(hdr) => {
                            usnet_tcp::reset_for(local.port(), remote.port(), &Segment::from(&hdr))
                        }
                        Err(_) => {
                            self.counters.tcp_rx_truncated += 1;
                            None
                        }
                    }
                };
                self.release(src);
                if let Some(r) = reply {
                    if self.send_tcp(local, remote, &r, (&[], &[])) {
                        self.counters.tcp_tx_reset_no_socket += 1;
                    }
                }
            }
        }
    }

    /// A handshake completed on listener `li`: the connection joins the table and the
    /// accept queue.
    fn tcp_adopt(&mut self, li: u32, lh: SocketHandle, conn: Box<Connection>) {
        let (local, remote) = (conn.local(), conn.remote());
        let h = self.sockets.insert(Socket::TcpConn(Box::new(TcpConnSock {
            conn: None,
            local,
            remote,
            in_table: true,
            timer: None,
            parent: Some(lh),
            orphan: false,
            blocked: false,
            fin_pending: false,
        })));
        self.tcp.live += 1;
        self.sockets.tcp_conns.insert((local, remote), h.index);
        if let Some(Socket::TcpListen(l)) = self.sockets.slots[li as usize].sock.as_mut() {
            if let Some(f) = l.family(remote) {
                f.push_accept(h);
            }
        }
        self.counters.tcp_passive_opens += 1;
        self.sockets.mark_ready(li);
        self.tcp_settle(h.index, conn, Wake::default());
    }

    fn tcp_poll_one(&mut self, idx: u32) {
        let now = self.tcp_now();
        match self.sockets.slots[idx as usize].sock.as_mut() {
            Some(Socket::TcpConn(s)) => {
                s.blocked = false;
                if let Some(c) = s.conn.take() {
                    self.tcp_settle(idx, c, Wake::default());
                }
            }
            Some(Socket::TcpListen(l)) => {
                let mut out = std::mem::take(&mut self.tcp.out);
                for f in [l.v4.as_mut(), l.v6.as_mut()].into_iter().flatten() {
                    f.poll_transmit(now, &mut CollectSink(&mut out));
                }
                let d = l.poll_at();
                self.tcp_flush_out(&mut out);
                self.tcp.out = out;
                self.tcp_schedule(idx, d);
            }
            _ => {}
        }
    }

    /// Polls the sockets whose deadline passed and the ones waiting for transmit room.
    pub(crate) fn tcp_poll_timers(&mut self) -> bool {
        let now = self.now.as_nanos();
        let mut due = std::mem::take(&mut self.tcp.due);
        while let Some(&Reverse((t, idx, gen))) = self.tcp.timers.peek() {
            if t > now {
                break;
            }
            self.tcp.timers.pop();
            let slot = &mut self.sockets.slots[idx as usize];
            if slot.gen != gen {
                continue;
            }
            let timer = match slot.sock.as_mut() {
                Some(Socket::TcpConn(s)) => &mut s.timer,
                Some(Socket::TcpListen(l)) => &mut l.timer,
                _ => continue,
            };
            if *timer == Some(t) {
                *timer = None;
                due.push(idx);
            }
        }
        let mut did = !due.is_empty();
        for &idx in &due {
            self.tcp_poll_one(idx);
        }
        due.clear();
        self.tcp.due = due;
        if !self.tcp.blocked.is_empty() && self.tx.len() < self.cfg.tx_queue_len {
            let mut blocked = std::mem::take(&mut self.tcp.blocked);
            for &idx in &blocked {
                if let Some(s) = self.conn_sock_at(idx) {
                    if s.blocked {
                        self.tcp_poll_one(idx);
                    }
                }
            }
            blocked.clear();
            if self.tcp.blocked.is_empty() {
                self.tcp.blocked = blocked;
            }
            did = true;
        }
        // Stale entries (deadlines that moved) are dropped when popped; rebuild the
        // heap if they pile up.
        if self.tcp.timers.len() > 4 * self.tcp.live + 1024 {
            let slots = &self.sockets.slots;
            let heap = std::mem::take(&mut self.tcp.timers);
            self.tcp.timers = heap
                .into_iter()
                .filter(|Reverse((t, idx, gen))| {
                    let s = &slots[*idx as usize];
                    s.gen == *gen
                        && match s.sock.as_ref() {
                            Some(Socket::TcpConn(c)) => c.timer == Some(*t),
                            Some(Socket::TcpListen(l)) => l.timer == Some(*t),
                            _ => false,
                        }
                })
                .collect();
        }
        did
    }

    /// The earliest TCP deadline (stale heap entries only make it early).
    pub(crate) fn tcp_poll_at(&self) -> Option<crate::Instant> {
        if !self.tcp.blocked.is_empty() {
            return Some(self.now);
        }
        self.tcp
            .timers
            .peek()
            .map(|Reverse((t, _, _))| crate::Instant::from_nanos(*t))
    }

    fn tcp_ephemeral(&mut self, local_ip: std::net::IpAddr, remote: SocketAddr) -> Option<u16> {
        let span = (u16::MAX - EPHEMERAL_FIRST) as u32 + 1;
        for _ in 0..span {
            let p = self.tcp.next_ephemeral;
            self.tcp.next_ephemeral = if p == u16::MAX {
                EPHEMERAL_FIRST
            } else {
                p + 1
            };
            let local = SocketAddr::new(local_ip, p);
            if self.sockets.tcp_listen.contains_key(&p) {
                continue;
            }
            if remote.port() == 0 || self.tcp_tuple_free(local, remote) {
                return Some(p);
            }
        }
        None
    }

    /// Whether `(local, remote)` may start a new connection: unused, or held by a
    /// closed-by-the-application connection in TIME-WAIT that negotiated timestamps
    /// (then PAWS on both sides tells the incarnations apart, as Linux's
    /// `tcp_tw_reuse`); such a connection is freed now.
    fn tcp_tuple_free(&mut self, local: SocketAddr, remote: SocketAddr) -> bool {
        let Some(&i) = self.sockets.tcp_conns.get(&(local, remote)) else {
            return true;
        };
        let reusable = match self.sockets.slots[i as usize].sock.as_ref() {
            Some(Socket::TcpConn(s)) => {
                s.orphan
                    && s.conn
                        .as_ref()
                        .is_some_and(|c| c.state() == State::TimeWait && c.info().timestamps)
            }
            _ => false,
        };
        if reusable {
            self.counters.tcp_time_wait_reused += 1;
            self.tcp_reap(i);
        }
        reusable
    }

    // ------------------------------------------------------------ public API

    /// Listens on `addr` (an unspecified address accepts both families, like UDP's
    /// wildcard binds; port 0 picks an ephemeral port) with an accept `backlog`.
    /// SYN cookies answer when the SYN queue (`max(backlog, 128)`) overflows.
    pub fn tcp_listen(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
    ) -> Result<SocketHandle, StackError> {
        let cfg = self.cfg.tcp.clone();
        self.tcp_listen_with(addr, backlog, cfg)
    }

    /// `tcp_listen` with a connection configuration other than the stack's template
    /// (buffer sizes, congestion control, timers); accepted connections inherit it.
    pub fn tcp_listen_with(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
        cfg: TcpConfig,
    ) -> Result<SocketHandle, StackError> {
        let ip = addr.ip();
        if !ip.is_unspecified() && !self.is_local_addr(ip) {
            return Err(StackError::AddrNotAvailable);
        }
        let port = match addr.port() {
            0 => self
                .tcp_ephemeral(ip, SocketAddr::new(ip, 0))
                .ok_or(StackError::AddrInUse)?,
            p => p,
        };
        if let Some(list) = self.sockets.tcp_listen.get(&port) {
            for &i in list {
                if let Some(Socket::TcpListen(l)) = self.sockets.slots[i as usize].sock.as_ref() {
                    let a = l.local.ip();
                    if a.is_unspecified() || ip.is_unspecified() || a == ip {
                        return Err(StackError::AddrInUse);
                    }
                }
            }
        }
        let local = SocketAddr::new(ip, port);
        let cfg = self.tcp_prepare(cfg);
        let mtu = self.cfg.mtu;
        let mk = |v6: bool| {
            let mut c = cfg.clone();
            c.mss = c.mss.min(TcpConfig::mss_for_mtu(mtu, v6));
            Listener::new(local, c, backlog, true)
        };
        let (v4, v6) = match ip {
            _ if ip.is_unspecified() => (Some(mk(false)), Some(mk(true))),
            std::net::IpAddr::V4(_) => (Some(mk(false)), None),
            std::net::IpAddr::V6(_) => (None, Some(mk(true))),
        };
        let h = self
            .sockets
            .insert(Socket::TcpListen(Box::new(TcpListenSock {
                local,
                v4,
                v6,
                timer: None,
            })));
        self.tcp.live += 1;
        self.sockets
            .tcp_listen
            .entry(port)
            .or_default()
            .push(h.index);
        Ok(h)
    }

    /// Takes a completed connection from a listener's accept queue.
    pub fn tcp_accept(&mut self, h: SocketHandle) -> Result<SocketHandle, StackError> {
        loop {
            let l = self.listen_sock_mut(h)?;
            let child =
                l.v4.as_mut()
                    .and_then(|f| f.accept())
                    .or_else(|| l.v6.as_mut().and_then(|f| f.accept()))
                    .ok_or(StackError::WouldBlock)?;
            if let Some(Socket::TcpConn(s)) = self.sockets.get_mut(child) {
                if s.parent == Some(h) {
                    s.parent = None;
                    return Ok(child);
                }
            }
        }
    }

    /// Starts an active open to `remote` and returns at once (the SYN is queued);
    /// `readiness().connected` or an error from `tcp_send`/`tcp_recv` tells the
    /// outcome. `local` may fix the address and/or port (port 0: ephemeral).
    pub fn tcp_connect(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
    ) -> Result<SocketHandle, StackError> {
        let cfg = self.cfg.tcp.clone();
        self.tcp_connect_with(local, remote, cfg)
    }

    /// `tcp_connect` with a configuration other than the stack's template.
    pub fn tcp_connect_with(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        cfg: TcpConfig,
    ) -> Result<SocketHandle, StackError> {
        let rip = remote.ip();
        let bad_remote = match rip {
            std::net::IpAddr::V4(a) => a.is_broadcast() || a.is_multicast(),
            std::net::IpAddr::V6(a) => a.is_multicast(),
        };
        if remote.port() == 0 || rip.is_unspecified() || bad_remote {
            return Err(StackError::InvalidInput);
        }
        let Some((src, _)) = self.route(rip) else {
            self.counters.ip_tx_no_route += 1;
            return Err(StackError::NoRoute);
        };
        let lip = match local {
            Some(l) if !l.ip().is_unspecified() => {
                if !self.is_local_addr(l.ip()) || l.is_ipv4() != remote.is_ipv4() {
                    return Err(StackError::AddrNotAvailable);
                }
                l.ip()
            }
            _ => src,
        };
        let lport = match local.map_or(0, |l| l.port()) {
            0 => self
                .tcp_ephemeral(lip, remote)
                .ok_or(StackError::AddrNotAvailable)?,
            p => p,
        };
        let l = SocketAddr::new(lip, lport);
        if !self.tcp_tuple_free(l, remote) {
            return Err(StackError::AddrInUse);
        }
        let mut cfg = self.tcp_prepare(cfg);
        cfg.mss = cfg
            .mss
            .min(TcpConfig::mss_for_mtu(self.cfg.mtu, remote.is_ipv6()));
        let conn = Box::new(Connection::connect(l, remote, self.tcp_now(), cfg));
        let h = self.sockets.insert(Socket::TcpConn(Box::new(TcpConnSock {
            conn: None,
            local: l,
            remote,
            in_table: true,
            timer: None,
            parent: None,
            orphan: false,
            blocked: false,
            fin_pending: false,
        })));
        self.tcp.live += 1;
        self.sockets.tcp_conns.insert((l, remote), h.index);
        self.counters.tcp_active_opens += 1;
        self.tcp_settle(h.index, conn, Wake::default());
        Ok(h)
    }

    /// Runs `f` on a connection, then its output.
    fn with_conn<R>(
        &mut self,
        h: SocketHandle,
        f: impl FnOnce(&mut Connection) -> R,
    ) -> Result<R, StackError> {
        let s = self.conn_sock_mut(h)?;
        let mut c = s.conn.take().ok_or(StackError::InvalidHandle)?;
        let r = f(&mut c);
        self.tcp_settle(h.index, c, Wake::default());
        Ok(r)
    }

    /// Queues data; returns how much was taken (`WouldBlock` when the send buffer is
    /// full, `BrokenPipe` after `tcp_shutdown_write`, the connection's error if it
    /// failed). Data may be queued before the handshake completes.
    pub fn tcp_send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize, StackError> {
        let c = self.conn(h)?;
        if let Some(e) = c.error() {
            return Err(tcp_err(e));
        }
        if !c.may_send() {
            return Err(StackError::BrokenPipe);
        }
        if data.is_empty() {
            return Ok(0);
        }
        if c.send_capacity() == 0 {
            return Err(StackError::WouldBlock);
        }
        self.with_conn(h, |c| c.send(data))
    }

    /// Reads received data: `Ok(0)` at end of stream, `WouldBlock` when nothing is
    /// there yet, the connection's error if it failed.
    pub fn tcp_recv(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<usize, StackError> {
        let c = self.conn_mut(h)?;
        let n = c.recv(buf);
        if n > 0 {
            // The read may open the window: let the connection say so.
            let s = self.conn_sock_mut(h)?;
            let c = s.conn.take().ok_or(StackError::InvalidHandle)?;
            self.tcp_settle(h.index, c, Wake::default());
            return Ok(n);
        }
        if buf.is_empty() || c.is_eof() {
            return Ok(0);
        }
        if let Some(e) = c.error() {
            return Err(tcp_err(e));
        }
        match c.state() {
            State::Closed => Ok(0),
            _ => Err(StackError::WouldBlock),
        }
    }

    /// Bytes `tcp_recv` can return now.
    pub fn tcp_recv_available(&self, h: SocketHandle) -> Result<usize, StackError> {
        Ok(self.conn(h)?.recv_available())
    }

    /// Free space in the send buffer.
    pub fn tcp_send_capacity(&self, h: SocketHandle) -> Result<usize, StackError> {
        Ok(self.conn(h)?.send_capacity())
    }

    /// Sends FIN after the queued data (SHUT_WR); reading continues.
    /// Before the handshake completes the FIN waits for it (queued data is not lost).
    pub fn tcp_shutdown_write(&mut self, h: SocketHandle) -> Result<(), StackError> {
        let st = self.conn(h)?.state();
        if matches!(st, State::SynSent | State::SynReceived) {
            self.conn_sock_mut(h)?.fin_pending = true;
            return Ok(());
        }
        self.with_conn(h, |c| c.shutdown_write())
    }

    /// Closes a TCP socket (close(2)). A connection finishes in the background
    /// (FIN, then TIME-WAIT or CLOSED) and is freed when it reaches CLOSED; unread
    /// data or `linger = 0` make it an abort (RST). A listener aborts the
    /// connections still in its accept queue.
    pub fn tcp_close(&mut self, h: SocketHandle) -> Result<(), StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(_) => {
                let s = self.conn_sock_mut(h)?;
                s.orphan = true;
                let mut c = s.conn.take().ok_or(StackError::InvalidHandle)?;
                c.close();
                self.tcp_settle(h.index, c, Wake::default());
                Ok(())
            }
            Socket::TcpListen(_) => {
                let Some(Socket::TcpListen(mut l)) = self.sockets.remove(h) else {
                    return Err(StackError::InvalidHandle);
                };
                self.tcp.live -= 1;
                if let Some(list) = self.sockets.tcp_listen.get_mut(&l.local.port()) {
                    list.retain(|&i| i != h.index);
                    if list.is_empty() {
                        self.sockets.tcp_listen.remove(&l.local.port());
                    }
                }
                l.merge_stats(&mut self.tcp.totals);
                let mut children = Vec::new();
                for f in [l.v4.as_mut(), l.v6.as_mut()].into_iter().flatten() {
                    while let Some(c) = f.accept() {
                        children.push(c);
                    }
                }
                for c in children {
                    if let Ok(s) = self.conn_sock_mut(c) {
                        s.parent = None;
                        s.orphan = true;
                        if let Some(mut conn) = s.conn.take() {
                            conn.abort();
                            self.tcp_settle(c.index, conn, Wake::default());
                        }
                    }
                }
                self.counters.mirror_tcp(&self.tcp.totals);
                Ok(())
            }
            _ => Err(StackError::WrongType),
        }
    }

    /// Abortive close: RST now, and the handle is gone.
    pub fn tcp_abort(&mut self, h: SocketHandle) -> Result<(), StackError> {
        let s = self.conn_sock_mut(h)?;
        s.orphan = true;
        let mut c = s.conn.take().ok_or(StackError::InvalidHandle)?;
        c.abort();
        self.tcp_settle(h.index, c, Wake::default());
        Ok(())
    }

    pub fn tcp_state(&self, h: SocketHandle) -> Result<State, StackError> {
        Ok(self.conn(h)?.state())
    }

    /// The error that ended the connection, if any (SO_ERROR).
    pub fn tcp_error(&self, h: SocketHandle) -> Result<Option<StackError>, StackError> {
        Ok(self.conn(h)?.error().map(tcp_err))
    }

    pub fn tcp_info(&self, h: SocketHandle) -> Result<TcpInfo, StackError> {
        Ok(self.conn(h)?.info())
    }

    /// The connection's own counters.
    pub fn tcp_conn_stats(&self, h: SocketHandle) -> Result<TcpStats, StackError> {
        Ok(self.conn(h)?.stats().clone())
    }

    pub fn tcp_local_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) => Ok(s.local),
            Socket::TcpListen(l) => Ok(l.local),
            _ => Err(StackError::WrongType),
        }
    }

    pub fn tcp_peer_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        Ok(self.conn_sock(h)?.remote)
    }

    pub fn tcp_set_nodelay(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_nodelay(on))
    }

    pub fn tcp_set_keepalive(
        &mut self,
        h: SocketHandle,
        ka: Option<Keepalive>,
    ) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_keepalive(ka))
    }

    pub fn tcp_set_linger(
        &mut self,
        h: SocketHandle,
        linger: Option<Duration>,
    ) -> Result<(), StackError> {
        self.conn_mut(h)?.set_linger(linger);
        Ok(())
    }

    pub fn tcp_set_congestion_control(
        &mut self,
        h: SocketHandle,
        cc: CcAlgorithm,
    ) -> Result<(), StackError> {
        let c = self.conn_mut(h)?;
        let mss = c.snd_mss();
        let iw = c.config().initial_window;
        c.set_congestion_control(cc.build(mss, iw));
        Ok(())
    }

    /// The template new connections start from (buffer sizes, congestion control,
    /// timers, SACK/timestamps/window scaling).
    pub fn tcp_config(&self) -> &TcpConfig {
        &self.cfg.tcp
    }

    pub fn tcp_config_mut(&mut self) -> &mut TcpConfig {
        &mut self.cfg.tcp
    }

    /// Totals of every connection and listener, live and gone.
    pub fn tcp_stats(&self) -> TcpStats {
        let mut t = self.tcp.totals.clone();
        for slot in &self.sockets.slots {
            match slot.sock.as_ref() {
                Some(Socket::TcpConn(s)) => {
                    if let Some(c) = s.conn.as_ref() {
                        t.merge(c.stats());
                    }
                }
                Some(Socket::TcpListen(l)) => l.merge_stats(&mut t),
                _ => {}
            }
        }
        t
    }

    /// `counters()` with the `tcp_*` engine counters including live connections
    /// (`counters()` itself has them for connections already freed).
    pub fn counters_snapshot(&self) -> crate::Counters {
        let mut c = self.counters.clone();
        c.mirror_tcp(&self.tcp_stats());
        c
    }

    /// Every TCP connection with its `tcp_info` (like `ss -ti`).
    pub fn tcp_connections(&self) -> Vec<TcpConnEntry> {
        self.sockets
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot.sock.as_ref() {
                Some(Socket::TcpConn(s)) => s.conn.as_ref().map(|c| TcpConnEntry {
                    handle: SocketHandle {
                        index: i as u32,
                        gen: slot.gen,
                    },
                    local: s.local,
                    remote: s.remote,
                    orphan: s.orphan,
                    info: c.info(),
                }),
                _ => None,
            })
            .collect()
    }

    pub fn tcp_listeners(&self) -> Vec<TcpListenEntry> {
        self.sockets
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match slot.sock.as_ref() {
                Some(Socket::TcpListen(l)) => Some(TcpListenEntry {
                    handle: SocketHandle {
                        index: i as u32,
                        gen: slot.gen,
                    },
                    local: l.local,
                    syn_queue: l.syn_queue_len(),
                    accept_queue: l.accept_queue_len(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Sockets of any kind that are alive (for leak checks), and slots allocated.
    pub fn socket_count(&self) -> (usize, usize) {
        let live = self
            .sockets
            .slots
            .iter()
            .filter(|s| s.sock.is_some())
            .count();
        (live, self.sockets.slots.len())
    }

    pub(crate) fn tcp_readiness(&self, s: &Socket) -> Option<Readiness> {
        match s {
            Socket::TcpConn(s) => Some(s.conn.as_deref().map(readiness_of).unwrap_or_default()),
            Socket::TcpListen(l) => Some(Readiness {
                readable: l.accept_queue_len() > 0,
                ..Readiness::default()
            }),
            _ => None,
        }
    }

    pub(crate) fn tcp_socket_stats(&self, s: &Socket) -> Option<SocketStats> {
        let st = match s {
            Socket::TcpConn(s) => s.conn.as_ref()?.stats().clone(),
            Socket::TcpListen(l) => {
                let mut t = TcpStats::default();
                l.merge_stats(&mut t);
                t
            }
            _ => return None,
        };
        Some(SocketStats {
            rx_datagrams: st.rx_segments,
            rx_bytes: st.rx_bytes,
            rx_queue_full: st.rx_ooo_full,
            tx_datagrams: st.tx_segments,
            tx_bytes: st.tx_bytes,
        })
    }
}
