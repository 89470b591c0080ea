//! The zero-copy ring API (netmap/PASTE shape) on the stack's TCP.
//!
//! An application opens a [`ZcPort`]: a receive ring and a transmit ring of
//! [`Slot`]s `{buffer index, offset, length, flags, socket}` over the stack's pool
//! buffers. Its sockets are zero-copy connections (`TcpConfig::zero_copy`): the
//! engine holds their payload as pieces of pool buffers, so
//!
//! - **receive**: the frame a segment arrived in is the buffer the application
//!   reads: [`Stack::zc_sync`] puts the in-order pieces of each connection into RX
//!   slots, no copy. The application gives buffers back by advancing the RX ring's
//!   `head`, or keeps one by putting a spare buffer it owns into the slot and setting
//!   [`SLOT_BUF_CHANGED`] (PASTE's `NS_BUF_CHANGED`): the spare is freed instead.
//! - **send**: the application takes a buffer ([`Stack::zc_alloc`]), writes the
//!   payload from [`Stack::zc_headroom`] on, and submits it in a TX slot. The stack
//!   queues the buffer itself; a segment that is exactly one such piece leaves in
//!   place (headers written into the headroom), and retransmission reads the same
//!   buffer. The buffer goes back to the pool when its bytes are acknowledged.
//!   With [`SLOT_KEEP`] the application keeps the buffer and the queue takes a
//!   reference of its own, so content written once (a cached response) goes out
//!   on any number of connections (`sendfile`'s shape).
//!
//! The pool counts a buffer's references; the port counts the ones the
//! application holds, so a bad index, a buffer returned twice or one
//! it never had is refused (counted in [`ZcStats::bad_slots`] and the stack's
//! `tcp_zc_bad_slots`, the slot marked [`SLOT_ERROR`]) and cannot corrupt the stack.
//!
//! In-process, the application drives the stack's loop itself (a `Driver`'s turn)
//! and calls `zc_sync` once per turn; it sleeps in the driver's wait, which wakes
//! for frames and timers, i.e. whenever a ring may get work. A sync looks only at
//! the port's sockets whose readiness changed (the stack keeps a second ready list
//! for watched sockets, so the application's own readiness consumer is not
//! disturbed): its cost follows the traffic, not the number of connections.

use std::collections::VecDeque;
use std::net::SocketAddr;

use usnet_tcp::BufSpan;

use crate::socket::Socket;
use crate::tcp::zc::settle_bufs;
use crate::{SocketHandle, Stack, StackError, TcpState};

/// The slot flags (one table with the stack server's port layout).
pub use usnet_socket_api::zc_flags::{
    NO_BUF, SLOT_BUF_CHANGED, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_KEEP, SLOT_MORE, SLOT_NEW,
    SLOT_SHUT_WR,
};

/// The most references a buffer may have for a [`SLOT_KEEP`] send to take one more
/// (the pool counts in 16 bits; the rest is headroom for the frames in flight).
pub const KEEP_REFS_MAX: u16 = u16::MAX / 2;

/// One ring slot. `off` counts from the start of the buffer's memory, so the bytes
/// are `pool.whole(buf)[off..off + len]` ([`Stack::zc_bytes`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Pool buffer index, or [`NO_BUF`].
    pub buf: u32,
    /// First payload byte in the buffer.
    pub off: u32,
    /// Payload bytes.
    pub len: u32,
    /// `SLOT_*` bits.
    pub flags: u16,
    _pad: u16,
    /// The socket ([`SocketHandle::raw`]).
    pub socket: u64,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            buf: NO_BUF,
            off: 0,
            len: 0,
            flags: 0,
            _pad: 0,
            socket: 0,
        }
    }
}

impl Slot {
    /// A slot: `len` bytes of `buf` from `off`, for `socket`.
    pub fn new(socket: SocketHandle, buf: u32, off: u32, len: u32, flags: u16) -> Slot {
        Slot {
            buf,
            off,
            len,
            flags,
            _pad: 0,
            socket: socket.raw(),
        }
    }

    /// The slot's socket.
    pub fn handle(&self) -> SocketHandle {
        SocketHandle::from_raw(self.socket)
    }
}

/// A ring of slots shared by the application and the stack. Indices run modulo the
/// slot count; the ring is full when advancing the producer would make it equal
/// the consumer.
///
/// Ownership (as netmap's `head`/`tail`):
/// - `head` belongs to the application, `tail` to the stack; neither writes the
///   other's index.
/// - **RX**: slots `[head, tail)` hold data for the application (it reads them and
///   advances `head`, which hands their buffers back); the stack fills slots from
///   `tail` on and advances `tail`, never onto `head - 1`... i.e. it leaves one slot
///   empty.
/// - **TX**: slots `[tail, head)` were filled by the application and not yet taken;
///   it fills the slot at `head` and advances `head` (never onto `tail - 1`); at
///   sync the stack takes them in order and advances `tail`. A slot behind `tail`
///   is the application's again; the stack may have set [`SLOT_ERROR`] in it.
#[derive(Debug)]
pub struct Ring {
    slots: Box<[Slot]>,
    /// The application's index.
    pub head: u32,
    /// The stack's index.
    pub tail: u32,
}

impl Ring {
    fn new(n: usize) -> Ring {
        Ring {
            slots: vec![Slot::default(); n.max(2)].into_boxed_slice(),
            head: 0,
            tail: 0,
        }
    }

    /// Slot count.
    pub fn size(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The index after `i`.
    pub fn next(&self, i: u32) -> u32 {
        if i + 1 >= self.size() {
            0
        } else {
            i + 1
        }
    }

    /// Slots from `from` to `to` going forward.
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        (to + self.size() - from) % self.size()
    }

    /// The slot at `i`.
    pub fn slot(&self, i: u32) -> &Slot {
        &self.slots[(i % self.size()) as usize]
    }

    /// The slot at `i`, writable.
    pub fn slot_mut(&mut self, i: u32) -> &mut Slot {
        let n = self.size();
        &mut self.slots[(i % n) as usize]
    }

    /// RX: slots waiting for the application.
    pub fn rx_ready(&self) -> u32 {
        self.distance(self.head, self.tail)
    }

    /// TX: slots the application may still fill.
    pub fn tx_space(&self) -> u32 {
        self.size() - 1 - self.distance(self.tail, self.head)
    }

    /// TX: fills the slot at `head` and advances it; false if the ring is full.
    pub fn push(&mut self, s: Slot) -> bool {
        if self.tx_space() == 0 {
            return false;
        }
        let h = self.head;
        *self.slot_mut(h) = s;
        self.head = self.next(h);
        true
    }
}

/// What a port has seen, for tools and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcStats {
    /// RX slots filled with payload.
    pub rx_slots: u64,
    /// Payload bytes handed over in RX slots.
    pub rx_bytes: u64,
    /// TX slots taken.
    pub tx_slots: u64,
    /// Payload bytes queued from TX slots.
    pub tx_bytes: u64,
    /// TX slots taken with [`SLOT_KEEP`] (the application kept the buffer).
    pub tx_kept: u64,
    /// Slots refused (bad buffer, range, socket, or a buffer returned twice).
    pub bad_slots: u64,
}

/// What one [`Stack::zc_sync`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// RX slots added.
    pub rx: u32,
    /// TX slots taken.
    pub tx: u32,
    /// TX slots left for a later sync (a send queue was full).
    pub tx_waiting: u32,
}

#[derive(Debug)]
struct PortSocket {
    listener: bool,
    eof_told: bool,
    err_told: bool,
    /// In `dirty`.
    queued: bool,
}

impl PortSocket {
    fn new(listener: bool) -> PortSocket {
        PortSocket {
            listener,
            eof_told: false,
            err_told: false,
            queued: false,
        }
    }
}

/// One application's rings and the buffers it holds. Create with
/// [`Stack::zc_port`], give back with [`Stack::zc_close_port`].
#[derive(Debug)]
pub struct ZcPort {
    /// Received payload and events, stack → application.
    pub rx: Ring,
    /// Payload to send and closes, application → stack.
    pub tx: Ring,
    /// `rx.head` as of the last sync: the slots between it and `rx.head` are being
    /// handed back.
    rx_seen: u32,
    /// References the application holds, per pool buffer.
    held: Vec<u16>,
    /// Their sum.
    held_total: usize,
    /// Keyed by the stack's handles (FxHash: the stack assigns every key held, so a
    /// client cannot crowd one bucket).
    sockets: rustc_hash::FxHashMap<SocketHandle, PortSocket>,
    /// Sockets to look at for RX slots: the stack reported them ready, or the RX
    /// ring filled up before they were done. A sync looks only at these, so its
    /// cost follows the traffic, not the number of connections.
    dirty: VecDeque<SocketHandle>,
    stats: ZcStats,
}

impl ZcPort {
    /// Counters so far.
    pub fn stats(&self) -> ZcStats {
        self.stats
    }

    /// Buffers the application holds now.
    pub fn held_buffers(&self) -> usize {
        self.held.iter().filter(|&&n| n > 0).count()
    }

    /// References to buffers the application holds now (a buffer held twice counts
    /// twice); cheap, unlike [`ZcPort::held_buffers`].
    pub fn held_references(&self) -> usize {
        self.held_total
    }

    /// Sockets wait to be looked at (the RX ring filled before they were done).
    pub fn has_pending(&self) -> bool {
        !self.dirty.is_empty()
    }

    fn hold(&mut self, buf: u32) {
        self.held[buf as usize] += 1;
        self.held_total += 1;
    }

    fn unhold(&mut self, buf: u32) {
        self.held[buf as usize] -= 1;
        self.held_total -= 1;
    }

    /// Sockets of the port (listeners and connections not yet closed).
    pub fn sockets(&self) -> impl Iterator<Item = SocketHandle> + '_ {
        self.sockets.keys().copied()
    }

    fn holds(&self, buf: u32) -> bool {
        self.held.get(buf as usize).is_some_and(|&n| n > 0)
    }

    fn owns_conn(&self, h: SocketHandle) -> bool {
        self.sockets.get(&h).is_some_and(|s| !s.listener)
    }

    fn mark(&mut self, h: SocketHandle) {
        if let Some(s) = self.sockets.get_mut(&h) {
            if !s.queued {
                s.queued = true;
                self.dirty.push_back(h);
            }
        }
    }
}

impl Stack {
    /// A port with rings of `rx_slots` and `tx_slots` slots.
    pub fn zc_port(&self, rx_slots: usize, tx_slots: usize) -> ZcPort {
        ZcPort {
            rx: Ring::new(rx_slots),
            tx: Ring::new(tx_slots),
            rx_seen: 0,
            held: vec![0; self.core.pool.count() as usize],
            held_total: 0,
            sockets: Default::default(),
            dirty: VecDeque::new(),
            stats: ZcStats::default(),
        }
    }

    /// Readiness of zero-copy sockets waits for a port's sync.
    pub fn zc_has_ready(&self) -> bool {
        !self.sockets.zc_ready.is_empty()
    }

    /// The offset from which an application writes payload into a buffer it took
    /// with [`Stack::zc_alloc`] (room for the headers in front, for sending in place).
    pub fn zc_headroom(&self) -> u32 {
        self.core.pool.headroom() as u32
    }

    /// Bytes a buffer can hold after [`Stack::zc_headroom`]. A piece no longer than
    /// the connection's MSS leaves as one segment, in place.
    pub fn zc_buf_capacity(&self) -> u32 {
        (self.core.pool.buf_size() - self.core.pool.headroom()) as u32
    }

    /// The piece size an application should write on connection `h`. Without TSO,
    /// one segment per piece, so every piece can leave in place: its full-segment
    /// payload, at most a buffer's capacity. With TSO, full segments leave as
    /// fragments of GSO frames wherever they start in a piece, so a whole buffer's
    /// capacity: fewer pieces per byte. Known once the connection is established.
    pub fn zc_piece_len(&self, h: SocketHandle) -> Result<u32, StackError> {
        let c = self.conn(h)?;
        if self.core.tso_ok() {
            return Ok(self.zc_buf_capacity());
        }
        Ok(c.full_segment_payload().min(self.zc_buf_capacity()))
    }

    /// A zero-copy socket's TCP: payload as pool-buffer pieces, and no Nagle: a TX
    /// slot without [`SLOT_MORE`] is pushed at once; the application batches with
    /// `SLOT_MORE` instead.
    fn zc_tcp_config(&self) -> usnet_tcp::TcpConfig {
        let mut cfg = self.core.cfg.tcp.clone();
        cfg.zero_copy = true;
        // Whole buffers go to the application: an urgent byte stays in them.
        cfg.oob_inline = true;
        cfg.nodelay = true;
        cfg
    }

    /// A zero-copy listener on `addr` for `port`: its connections arrive as
    /// [`SLOT_NEW`] RX slots, already accepted.
    pub fn zc_listen(
        &mut self,
        port: &mut ZcPort,
        addr: SocketAddr,
        backlog: usize,
    ) -> Result<SocketHandle, StackError> {
        let h = self.tcp_listen_with(addr, backlog, self.zc_tcp_config())?;
        self.zc_add(port, h, true);
        Ok(h)
    }

    /// A zero-copy connection to `remote` for `port`.
    pub fn zc_connect(
        &mut self,
        port: &mut ZcPort,
        remote: SocketAddr,
    ) -> Result<SocketHandle, StackError> {
        let h = self.tcp_connect_with(None, remote, self.zc_tcp_config(), Default::default())?;
        self.zc_add(port, h, false);
        Ok(h)
    }

    /// Takes an empty buffer for the application (payload goes from
    /// [`Stack::zc_headroom`] on); None when the pool is empty.
    pub fn zc_alloc(&mut self, port: &mut ZcPort) -> Option<u32> {
        // The reference moves to the port's count.
        let i = self.core.pool.alloc()?.into_index();
        port.hold(i);
        Some(i)
    }

    /// Gives back a buffer the application holds (one it kept after a
    /// [`SLOT_BUF_CHANGED`] swap, or took and did not send).
    pub fn zc_free(&mut self, port: &mut ZcPort, buf: u32) -> Result<(), StackError> {
        if !port.holds(buf) {
            self.zc_bad(port);
            return Err(StackError::InvalidInput);
        }
        port.unhold(buf);
        if let Some(id) = self.core.pool.checked(buf) {
            self.core.pool.release(id);
        }
        Ok(())
    }

    /// The whole memory of a buffer the application holds (read and write).
    pub fn zc_buf_mut(&mut self, port: &ZcPort, buf: u32) -> Option<&mut [u8]> {
        if !port.holds(buf) {
            return None;
        }
        let id = self.core.pool.checked(buf)?;
        Some(self.core.pool.whole_mut(id))
    }

    /// The payload bytes of an RX slot whose buffer the application holds.
    pub fn zc_bytes(&self, port: &ZcPort, slot: &Slot) -> Option<&[u8]> {
        if !port.holds(slot.buf) {
            return None;
        }
        let id = self.core.pool.checked(slot.buf)?;
        self.core
            .pool
            .whole(id)
            .get(slot.off as usize..(slot.off as usize).checked_add(slot.len as usize)?)
    }

    /// Makes `h` one of the port's sockets: its readiness goes to the stack's
    /// zero-copy ready list, and it is looked at in the next sync.
    fn zc_add(&mut self, port: &mut ZcPort, h: SocketHandle, listener: bool) {
        if let Some(slot) = self.sockets.slots.get_mut(h.index as usize) {
            slot.zc_watch = true;
        }
        port.sockets.insert(h, PortSocket::new(listener));
        port.mark(h);
    }

    /// `h` leaves its port: its readiness no longer goes to the zero-copy list
    /// (where no port would take it, and every sync would pass it on again).
    fn zc_unwatch(&mut self, h: SocketHandle) {
        if let Some(slot) = self.sockets.slots.get_mut(h.index as usize) {
            if slot.gen == h.gen {
                slot.zc_watch = false;
            }
        }
    }

    fn zc_bad(&mut self, port: &mut ZcPort) {
        port.stats.bad_slots += 1;
        self.core.counters.tcp_zc_bad_slots += 1;
    }

    /// One exchange with the rings: takes back the RX buffers the application is
    /// done with, queues the TX slots it submitted (then sends), and fills RX slots
    /// with new connections, received payload, end of stream and errors.
    pub fn zc_sync(&mut self, port: &mut ZcPort) -> SyncReport {
        let mut report = SyncReport::default();
        self.zc_take_back(port);
        self.zc_take_tx(port, &mut report);
        self.zc_fill_rx(port, &mut report);
        report
    }

    /// RX slots from the last seen `head` to the current one give their buffer back.
    fn zc_take_back(&mut self, port: &mut ZcPort) {
        let ready = port.rx.distance(port.rx_seen, port.rx.tail);
        let moved = port.rx.distance(port.rx_seen, port.rx.head);
        if moved > ready {
            // `head` ran past `tail`: nothing the stack wrote is there.
            self.zc_bad(port);
            port.rx.head = port.rx_seen;
            return;
        }
        let mut i = port.rx_seen;
        while i != port.rx.head {
            let s = *port.rx.slot(i);
            if s.buf != NO_BUF || s.flags & SLOT_BUF_CHANGED != 0 {
                // A buffer the application does not hold is refused and counted
                // there; the stack's own state is untouched.
                let _ = self.zc_free(port, s.buf);
            }
            i = port.rx.next(i);
        }
        port.rx_seen = port.rx.head;
    }

    /// Whether another reference to `buf` (a [`SLOT_KEEP`] send) leaves its count
    /// far from overflowing.
    fn zc_may_share(&self, buf: u32) -> bool {
        self.core
            .pool
            .checked(buf)
            .is_some_and(|id| self.core.pool.refcount(id) < KEEP_REFS_MAX)
    }

    fn zc_take_tx(&mut self, port: &mut ZcPort, report: &mut SyncReport) {
        let mut touched: Vec<SocketHandle> = Vec::new();
        while port.tx.tail != port.tx.head {
            let t = port.tx.tail;
            let s = *port.tx.slot(t);
            let h = s.handle();
            if !port.owns_conn(h) {
                port.tx.slot_mut(t).flags |= SLOT_ERROR;
                self.zc_bad(port);
                port.tx.tail = port.tx.next(t);
                continue;
            }
            if s.len > 0 {
                let fits = (s.off as usize)
                    .checked_add(s.len as usize)
                    .is_some_and(|end| end <= self.core.pool.buf_size());
                if !port.holds(s.buf) || !fits {
                    port.tx.slot_mut(t).flags |= SLOT_ERROR;
                    self.zc_bad(port);
                    port.tx.tail = port.tx.next(t);
                    continue;
                }
                let keep = s.flags & SLOT_KEEP != 0;
                if keep && !self.zc_may_share(s.buf) {
                    // So many sends of it are out that one more reference could
                    // overflow its count: it waits for acknowledgments, as for room
                    // in a send queue.
                    report.tx_waiting = port.tx.distance(t, port.tx.head);
                    break;
                }
                let span = BufSpan {
                    buf: s.buf,
                    off: s.off,
                    len: s.len,
                };
                let more = s.flags & SLOT_MORE != 0;
                let Ok(c) = self.conn_mut(h) else {
                    port.tx.slot_mut(t).flags |= SLOT_ERROR;
                    port.tx.tail = port.tx.next(t);
                    continue;
                };
                if !c.may_send() {
                    // Closed for sending (or failed): the buffer stays the
                    // application's, the slot says why.
                    port.tx.slot_mut(t).flags |= SLOT_ERROR;
                    port.tx.tail = port.tx.next(t);
                    continue;
                }
                if !c.send_span(span, more) {
                    // Send queue full: the rest waits for the next sync.
                    report.tx_waiting = port.tx.distance(t, port.tx.head);
                    break;
                }
                if keep {
                    // The application's hold stays; the queue gets its own.
                    if let Some(id) = self.core.pool.checked(s.buf) {
                        self.core.pool.retain_index(id);
                    }
                    port.stats.tx_kept += 1;
                    self.core.counters.tcp_zc_tx_kept += 1;
                } else {
                    port.unhold(s.buf);
                }
                port.stats.tx_slots += 1;
                port.stats.tx_bytes += u64::from(s.len);
            }
            if !touched.contains(&h) {
                touched.push(h);
            }
            if s.flags & SLOT_CLOSE != 0 {
                port.sockets.remove(&h);
                self.zc_unwatch(h);
                let _ = self.tcp_close(h);
            } else if s.flags & SLOT_SHUT_WR != 0 {
                let _ = self.tcp_shutdown_write(h);
            }
            report.tx += 1;
            port.tx.tail = port.tx.next(t);
        }
        for h in touched {
            // One output pass per socket for all its slots.
            if self.conn(h).is_ok() {
                self.tcp_settle(h.index, usnet_tcp::Wake::default());
            }
        }
    }

    fn zc_fill_rx(&mut self, port: &mut ZcPort, report: &mut SyncReport) {
        // Readiness of the watched sockets (the stack's second ready list); another
        // port's go back for it.
        let mut foreign = Vec::new();
        while let Some(h) = self.sockets.zc_ready.pop_front() {
            let Some(slot) = self.sockets.slots.get_mut(h.index as usize) else {
                continue;
            };
            slot.zc_queued = false;
            if slot.gen != h.gen || slot.sock.is_none() {
                continue;
            }
            if port.sockets.contains_key(&h) {
                port.mark(h);
            } else {
                foreign.push(h);
            }
        }
        for h in foreign {
            self.sockets.mark_ready(h.index);
        }
        while let Some(&h) = port.dirty.front() {
            if !Self::zc_rx_room(port) {
                // Full: the rest waits for the next sync, this socket first.
                return;
            }
            let done = match port.sockets.get(&h).map(|s| s.listener) {
                Some(true) => self.zc_fill_accepts(port, h, report),
                Some(false) => self.zc_fill_conn(port, h, report),
                None => true,
            };
            if !done {
                return;
            }
            port.dirty.pop_front();
            if let Some(s) = port.sockets.get_mut(&h) {
                s.queued = false;
            }
        }
    }

    fn zc_rx_room(port: &ZcPort) -> bool {
        port.rx.next(port.rx.tail) != port.rx.head
    }

    fn zc_rx_push(port: &mut ZcPort, s: Slot, report: &mut SyncReport) {
        let t = port.rx.tail;
        *port.rx.slot_mut(t) = s;
        port.rx.tail = port.rx.next(t);
        report.rx += 1;
    }

    /// Accepted connections become `SLOT_NEW` slots. Returns whether the listener
    /// is done (false: the ring filled first).
    fn zc_fill_accepts(
        &mut self,
        port: &mut ZcPort,
        lh: SocketHandle,
        report: &mut SyncReport,
    ) -> bool {
        loop {
            if !Self::zc_rx_room(port) {
                return false;
            }
            let Ok(h) = self.tcp_accept(lh) else {
                return true;
            };
            // Data may have come with the handshake: look at it at once.
            self.zc_add(port, h, false);
            let s = Slot {
                flags: SLOT_NEW,
                // The piece length that leaves as one segment, in place.
                off: self.zc_piece_len(h).unwrap_or(0),
                socket: h.raw(),
                ..Slot::default()
            };
            Self::zc_rx_push(port, s, report);
        }
    }

    /// A connection's payload pieces, then its EOF or error, become RX slots.
    /// Returns whether it is done (false: the ring filled first).
    fn zc_fill_conn(
        &mut self,
        port: &mut ZcPort,
        h: SocketHandle,
        report: &mut SyncReport,
    ) -> bool {
        let Some(Socket::TcpConn(sock)) = self.sockets.get_mut(h) else {
            return true;
        };
        let conn = &mut sock.conn;
        let mut got = 0usize;
        let mut full = false;
        loop {
            if !Self::zc_rx_room(port) {
                full = conn.recv_available() > 0;
                break;
            }
            let mut piece = None;
            conn.recv_spans(usize::MAX, 1, |s| piece = Some(s));
            let Some(p) = piece else { break };
            port.hold(p.buf);
            port.stats.rx_slots += 1;
            port.stats.rx_bytes += u64::from(p.len);
            got += p.len as usize;
            let s = Slot::new(h, p.buf, p.off, p.len, 0);
            Self::zc_rx_push(port, s, report);
        }
        let eof = conn.is_eof();
        let failed = conn.error().is_some() || conn.state() == TcpState::Closed;
        settle_bufs(&mut self.core.pool, conn);
        if got > 0 {
            // The reads may open the window: let the connection say so.
            self.tcp_settle(h.index, usnet_tcp::Wake::default());
        }
        if full {
            return false;
        }
        let room = Self::zc_rx_room(port);
        let Some(ps) = port.sockets.get_mut(&h) else {
            return true;
        };
        let event = if failed && !eof && !ps.err_told {
            ps.err_told = true;
            SLOT_ERROR
        } else if eof && !ps.eof_told {
            ps.eof_told = true;
            SLOT_EOF
        } else {
            return true;
        };
        if !room {
            // Told next time.
            if event == SLOT_ERROR {
                ps.err_told = false;
            } else {
                ps.eof_told = false;
            }
            return false;
        }
        let s = Slot {
            flags: event,
            socket: h.raw(),
            ..Slot::default()
        };
        Self::zc_rx_push(port, s, report);
        true
    }

    /// Closes the port: every socket it still has is closed and every buffer the
    /// application holds goes back to the pool.
    pub fn zc_close_port(&mut self, mut port: ZcPort) {
        for (h, _) in std::mem::take(&mut port.sockets) {
            self.zc_unwatch(h);
            let _ = self.tcp_close(h);
        }
        for (i, n) in port.held.iter().enumerate() {
            if let Some(id) = self.core.pool.checked(i as u32) {
                for _ in 0..*n {
                    self.core.pool.release(id);
                }
            }
        }
    }

    /// Queues up to `max` bytes that `fill` writes into pool buffers (one buffer at
    /// a time; it returns how much it wrote, a short count ends it) on a zero-copy
    /// connection: the copying `tcp_send` on such a socket. Returns the bytes queued.
    pub(crate) fn zc_copy_in(
        &mut self,
        h: SocketHandle,
        max: usize,
        more: bool,
        mut fill: impl FnMut(&mut [u8]) -> usize,
    ) -> usize {
        // Pieces of the connection's piece length, so each leaves as one segment in
        // place (or, with TSO, whole buffers that leave as fragments).
        let room = self
            .zc_piece_len(h)
            .map_or(self.zc_buf_capacity(), |p| p.max(1)) as usize;
        let head = self.zc_headroom() as usize;
        let now = self.core.tcp_now();
        if let Ok(c) = self.conn_mut(h) {
            c.advance_clock(now);
        }
        let (mut done, mut blocked) = (0, false);
        while done < max {
            let cap = self.conn(h).map(|c| c.send_capacity()).unwrap_or(0);
            // First the room behind the last piece while none of it was sent: a
            // write that ended mid-piece is filled up, so the pieces stay one
            // segment each. Otherwise a new piece.
            let tail = self.zc_tail_room(h, room);
            let limit = tail.map_or(room, |(_, _, behind)| behind);
            let want = (max - done).min(limit).min(cap);
            if want == 0 {
                blocked = true;
                break;
            }
            let (buf, at, fresh) = match tail {
                Some((id, at, _)) => (id, at, None),
                None => match self.core.pool.alloc() {
                    Some(b) => (b.id(), head, Some(b)),
                    None => {
                        blocked = true;
                        break;
                    }
                },
            };
            let n = fill(&mut self.core.pool.whole_mut(buf)[at..][..want]).min(want);
            let push = more || !(done + n == max || n < want);
            let ok = n > 0
                && self.conn_mut(h).is_ok_and(|c| match &fresh {
                    Some(b) => c.send_span(
                        BufSpan {
                            buf: b.index(),
                            off: head as u32,
                            len: n as u32,
                        },
                        push,
                    ),
                    None => c.extend_tail_piece(n, push),
                });
            match fresh {
                // The queue owns the reference now.
                Some(b) if ok => {
                    let _ = b.into_index();
                }
                Some(b) => self.core.pool.free(b),
                None => {}
            }
            if !ok {
                break;
            }
            done += n;
            if n < want {
                break;
            }
            // A chunk at the head of the unsent data filled: transmit before the
            // next piece, as a copying write does (`tcp_send_steps`).
            if done < max && self.conn_mut(h).is_ok_and(|c| c.take_push_due()) {
                if let Ok(c) = self.conn_mut(h) {
                    c.push_one();
                }
                self.tcp_settle(h.index, usnet_tcp::Wake::default());
                if self.conn(h).map_or(true, |c| !c.may_send()) {
                    break;
                }
            }
        }
        if let Ok(c) = self.conn_mut(h) {
            // What is left to push goes out with the caller's settle.
            c.take_push_due();
            if blocked {
                // The write found no more room (or no buffer): wake the writer when
                // there is, and let the ACKs that make room grow the limit
                // (`wmem_after_transmit`), as a copying write's `send_step` does.
                c.no_space();
            }
        }
        done
    }

    /// Where bytes may still join `h`'s last queued piece: its buffer, the offset
    /// behind its bytes, and how many fit before the piece reaches `room` or the
    /// buffer ends. Only while none of the piece was sent and only the queue holds
    /// its buffer.
    fn zc_tail_room(
        &self,
        h: SocketHandle,
        room: usize,
    ) -> Option<(usnet_pool::BufId, usize, usize)> {
        let t = self.conn(h).ok()?.unsent_tail_piece()?;
        let id = self.core.pool.checked(t.buf)?;
        let at = (t.off + t.len) as usize;
        let behind = room
            .saturating_sub(t.len as usize)
            .min(self.core.pool.buf_size().saturating_sub(at));
        (behind > 0 && self.core.pool.refcount(id) == 1).then_some((id, at, behind))
    }

    /// Copies up to `max` received bytes of a zero-copy connection to `sink` and
    /// gives their buffers back (the copying `tcp_recv` on such a socket). As a
    /// byte ring's read, it takes an urgent byte it comes to out of the stream
    /// (kept for `MSG_OOB`), or with `to_mark` stops there (`splice`).
    pub(crate) fn zc_copy_out(
        &mut self,
        h: SocketHandle,
        max: usize,
        to_mark: bool,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<usize, StackError> {
        let Some(Socket::TcpConn(sock)) = self.sockets.get_mut(h) else {
            return Err(StackError::InvalidHandle);
        };
        let pool = &mut self.core.pool;
        let mut taken = std::mem::take(&mut self.core.zc_taken);
        let mut done = 0;
        while done < max {
            let limit = match sock.conn.bytes_to_urgent_mark() {
                Some(0) if to_mark => break,
                Some(0) => {
                    let Some(s) = sock.conn.take_urgent_piece() else {
                        break;
                    };
                    if let Some(id) = pool.checked(s.buf) {
                        sock.conn.keep_urgent_byte(pool.whole(id)[s.off as usize]);
                        taken.push(id);
                    }
                    continue;
                }
                Some(d) => d.min(max - done),
                None => max - done,
            };
            let n = sock.conn.recv_spans(limit, usize::MAX, |s| {
                if let Some(id) = pool.checked(s.buf) {
                    sink(&pool.whole(id)[s.off as usize..][..s.len as usize]);
                    taken.push(id);
                }
            });
            done += n;
            if n < limit {
                break;
            }
        }
        // The queue's references first: a piece read in part is retained for its
        // rest, and releasing the part's reference before that would free it.
        settle_bufs(pool, &mut sock.conn);
        for id in taken.drain(..) {
            pool.release(id);
        }
        self.core.zc_taken = taken;
        Ok(done)
    }

    /// A zero-copy connection at the urgent mark: its urgent byte, taken out of
    /// the stream (`Stack::tcp_take_urgent_at_mark`).
    pub(crate) fn zc_take_urgent(&mut self, h: SocketHandle) -> Result<Option<u8>, StackError> {
        let Some(Socket::TcpConn(sock)) = self.sockets.get_mut(h) else {
            return Err(StackError::InvalidHandle);
        };
        let pool = &mut self.core.pool;
        let Some(s) = sock.conn.take_urgent_piece() else {
            return Ok(None);
        };
        let b = pool
            .checked(s.buf)
            .map(|id| (id, pool.whole(id)[s.off as usize]));
        settle_bufs(pool, &mut sock.conn);
        if let Some((id, _)) = b {
            pool.release(id);
        }
        Ok(b.map(|(_, b)| b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_indices_leave_one_slot_empty() {
        let mut r = Ring::new(4);
        assert_eq!(r.tx_space(), 3);
        for k in 0..3 {
            assert!(r.push(Slot {
                len: k,
                ..Slot::default()
            }));
        }
        assert!(!r.push(Slot::default()), "full");
        assert_eq!(r.distance(r.tail, r.head), 3);
        r.tail = r.next(r.tail);
        assert_eq!(r.tx_space(), 1);
        assert!(r.push(Slot::default()));
        assert_eq!(r.head, 0, "wrapped");
    }
}
