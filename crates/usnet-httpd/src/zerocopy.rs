//! `--api zerocopy`: the same server on usnet's zero-copy rings
//! (`usnet_stack::zerocopy`, PASTE's shape). Each driver turn runs one
//! [`StackApp::poll`]:
//!
//! 1. `zc_sync` takes back the receive buffers handed back last time, queues the
//!    transmit slots and fills the receive ring;
//! 2. every receive slot is parsed **where it lies**, in the buffer the frame
//!    arrived in ([`RequestStream::feed`] on the pool bytes), and handed back by advancing
//!    `head`;
//! 3. the answers owed are written into transmit buffers ([`Outq::fill`] at the
//!    buffer's headroom, pieces of one segment each, so each leaves in place with
//!    its headers written in front) and submitted; a FIN or a close follows as a
//!    slot flag;
//! 4. `zc_sync` again, so the frames leave at the end of this turn.
//!
//! Request bytes are never copied (a request cut by a segment boundary is kept in
//! the session, as in every backend); response bytes are written once, into the
//! buffer that goes on the wire.
//!
//! The server's logic ([`ZcLogic`]) sees the rings through [`Rings`], so the same
//! code runs in-process ([`ZcServer`], a [`StackApp`] on the stack's own port) and
//! as a client process of a stack server ([`run_client`], on a
//! `usnet_client::ZcPort` whose rings and pool are shared memory).

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use usnet_session_abi::zc::{
    Slot, NO_BUF, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_KEEP, SLOT_MORE, SLOT_NEW, SLOT_SHUT_WR,
};
use usnet_stack::zerocopy::{self, ZcPort};
use usnet_stack::{SocketHandle, Stack};

use crate::conn::LINGER;
use crate::http::{Outq, Reply, RequestStream, Responses};
use crate::socket::StackApp;
use crate::{HttpdConfig, Stats};

/// Slots per ring.
const RING_SLOTS: usize = 4096;

/// What the server does with its rings: the stack's own port in-process, or a
/// client's port of a stack server. Slots name sockets by their raw handle.
pub trait Rings {
    /// The RX slot at `head`, if one waits.
    fn rx_slot(&self) -> Option<Slot>;
    /// Passes the RX slot at `head` (its buffer goes back at the next sync).
    fn rx_pass(&mut self);
    /// The payload of an RX slot the application holds.
    fn payload(&self, s: &Slot) -> Option<&[u8]>;
    /// TX slots free.
    fn tx_space(&self) -> u32;
    /// Submits a TX slot (false: the ring is full).
    fn send(&mut self, s: Slot) -> bool;
    /// A free buffer, and its memory.
    fn alloc(&mut self) -> Option<u32>;
    fn buf_mut(&mut self, buf: u32) -> Option<&mut [u8]>;
    /// Gives a buffer the application holds back.
    fn free(&mut self, buf: u32);
    /// Where payload starts in a buffer to send.
    fn headroom(&self) -> usize;
    /// Payload bytes a buffer holds after the headroom.
    fn capacity(&self) -> usize;
    /// One exchange with the stack; buffers of refused TX slots come back.
    fn exchange(&mut self);
    /// TX slots submitted and not yet taken.
    fn tx_waiting(&self) -> bool;
}

/// The stack's slot as the rings' common (ABI) slot; the flag bits are the same
/// (usnet-server checks that at compile time).
fn abi_slot(s: &zerocopy::Slot) -> Slot {
    Slot {
        buf: s.buf,
        off: s.off,
        len: s.len,
        flags: s.flags,
        socket: s.socket,
    }
}

fn stack_slot(s: &Slot) -> zerocopy::Slot {
    let h = SocketHandle::from_raw(s.socket);
    zerocopy::Slot::new(h, s.buf, s.off, s.len, s.flags)
}

/// Whether a TX slot the stack handed back refused carries a buffer of its own,
/// which the server gives back: not a flag slot's, and not a kept one's (the
/// cache's buffer stays the server's).
fn refused_owns_buf(flags: u16, buf: u32) -> bool {
    flags & SLOT_ERROR != 0 && flags & SLOT_KEEP == 0 && buf != NO_BUF
}

/// The stack's own port, for one turn.
struct InProcess<'a> {
    stack: &'a mut Stack,
    port: &'a mut ZcPort,
}

impl Rings for InProcess<'_> {
    fn rx_slot(&self) -> Option<Slot> {
        (self.port.rx.head != self.port.rx.tail)
            .then(|| abi_slot(self.port.rx.slot(self.port.rx.head)))
    }
    fn rx_pass(&mut self) {
        self.port.rx.head = self.port.rx.next(self.port.rx.head);
    }
    fn payload(&self, s: &Slot) -> Option<&[u8]> {
        self.stack.zc_bytes(self.port, &stack_slot(s))
    }
    fn tx_space(&self) -> u32 {
        self.port.tx.tx_space()
    }
    fn send(&mut self, s: Slot) -> bool {
        self.port.tx.push(stack_slot(&s))
    }
    fn alloc(&mut self) -> Option<u32> {
        self.stack.zc_alloc(self.port)
    }
    fn buf_mut(&mut self, buf: u32) -> Option<&mut [u8]> {
        self.stack.zc_buf_mut(self.port, buf)
    }
    fn free(&mut self, buf: u32) {
        let _ = self.stack.zc_free(self.port, buf);
    }
    fn headroom(&self) -> usize {
        self.stack.zc_headroom() as usize
    }
    fn capacity(&self) -> usize {
        self.stack.zc_buf_capacity() as usize
    }
    fn exchange(&mut self) {
        let from = self.port.tx.tail;
        self.stack.zc_sync(self.port);
        let mut i = from;
        while i != self.port.tx.tail {
            let s = *self.port.tx.slot(i);
            if refused_owns_buf(s.flags, s.buf) {
                let _ = self.stack.zc_free(self.port, s.buf);
            }
            i = self.port.tx.next(i);
        }
    }
    fn tx_waiting(&self) -> bool {
        self.port.tx.tail != self.port.tx.head
    }
}

impl Rings for usnet_client::ZcPort {
    fn rx_slot(&self) -> Option<Slot> {
        usnet_client::ZcPort::rx_slot(self)
    }
    fn rx_pass(&mut self) {
        self.rx_advance();
    }
    fn payload(&self, s: &Slot) -> Option<&[u8]> {
        usnet_client::ZcPort::payload(self, s)
    }
    fn tx_space(&self) -> u32 {
        usnet_client::ZcPort::tx_space(self)
    }
    fn send(&mut self, s: Slot) -> bool {
        usnet_client::ZcPort::send(self, s)
    }
    fn alloc(&mut self) -> Option<u32> {
        usnet_client::ZcPort::alloc(self)
    }
    fn buf_mut(&mut self, buf: u32) -> Option<&mut [u8]> {
        usnet_client::ZcPort::buf_mut(self, buf)
    }
    fn free(&mut self, buf: u32) {
        usnet_client::ZcPort::free(self, buf);
    }
    fn headroom(&self) -> usize {
        usnet_client::ZcPort::headroom(self) as usize
    }
    fn capacity(&self) -> usize {
        usnet_client::ZcPort::buf_capacity(self) as usize
    }
    fn exchange(&mut self) {
        for s in self.tx_refused() {
            if refused_owns_buf(s.flags, s.buf) {
                self.free(s.buf);
            }
        }
        // A dead server shows in the next wait.
        let _ = self.sync();
    }
    fn tx_waiting(&self) -> bool {
        usnet_client::ZcPort::tx_space(self) + 1 < self.tx_size()
    }
}

/// The most buffers the response cache may take (long bodies in small buffers
/// are written per answer instead: the pool is for traffic first).
const CACHE_MAX_BUFS: usize = 512;

/// The two full responses, written once into buffers the server keeps and sent by
/// reference ([`SLOT_KEEP`]) on every connection, as a static file server sends the
/// page cache with `sendfile`: no answer is written per request. Used where a
/// whole buffer is one piece (TSO: full segments carry pieces as fragments); where
/// a piece must be one segment, a buffer held by several queues could not leave in
/// place and the stack would copy it per frame, so answers are written instead.
#[derive(Debug)]
struct Cache {
    /// Response bytes per buffer (a buffer's room after the headroom).
    chunk: usize,
    keep: Vec<u32>,
    close: Vec<u32>,
}

/// Whether the server has its cache.
#[derive(Debug)]
enum CacheState {
    /// Not built yet (or the pool ran short last time: tried again).
    Unbuilt,
    Ready(Cache),
    /// Off (`--no-cache`) or too large for the pool.
    Off,
}

impl Cache {
    /// Writes both full responses into buffers of `rings`. Err(true): try again
    /// later (the pool ran short; what it took is given back); Err(false): never
    /// (they would take more than [`CACHE_MAX_BUFS`]).
    fn build(rings: &mut impl Rings, resp: &Responses) -> Result<Cache, bool> {
        let (head, chunk) = (rings.headroom(), rings.capacity());
        let both = [false, true].map(|close| resp.bytes(Reply::Full { close }).len());
        if both.iter().map(|n| n.div_ceil(chunk)).sum::<usize>() > CACHE_MAX_BUFS {
            return Err(false);
        }
        let mut cache = Cache {
            chunk,
            keep: Vec::new(),
            close: Vec::new(),
        };
        for close in [false, true] {
            let bytes = resp.bytes(Reply::Full { close });
            for piece in bytes.chunks(chunk) {
                let Some(b) = rings.alloc() else {
                    cache.free(rings);
                    return Err(true);
                };
                let list = if close {
                    &mut cache.close
                } else {
                    &mut cache.keep
                };
                list.push(b);
                let Some(buf) = rings.buf_mut(b) else {
                    cache.free(rings);
                    return Err(true);
                };
                buf[head..head + piece.len()].copy_from_slice(piece);
            }
        }
        Ok(cache)
    }

    fn free(self, rings: &mut impl Rings) {
        for b in self.keep.into_iter().chain(self.close) {
            rings.free(b);
        }
    }

    /// The next piece of answer `r` from its `off`th byte: the buffer, the offset
    /// of the piece in it, and its length (to the buffer's or the answer's end).
    /// None for an error answer (not cached).
    fn piece(
        &self,
        resp: &Responses,
        r: Reply,
        off: usize,
        head: usize,
    ) -> Option<(u32, u32, u32)> {
        let (bufs, close) = match r {
            Reply::Full { close } | Reply::Head { close } => {
                (if close { &self.close } else { &self.keep }, close)
            }
            Reply::Error(_) => return None,
        };
        // A HEAD's answer is the full answer's head: a prefix of the same bytes.
        let len = resp.bytes(r).len();
        debug_assert!(resp.bytes(Reply::Full { close }).starts_with(resp.bytes(r)));
        let (k, within) = (off / self.chunk, off % self.chunk);
        let n = (self.chunk - within).min(len - off);
        Some((*bufs.get(k)?, (head + within) as u32, n as u32))
    }
}

#[derive(Debug)]
struct ZConn {
    h: u64,
    /// Payload bytes that leave as one segment (from the `SLOT_NEW` slot).
    piece: u32,
    session: RequestStream,
    out: Outq,
    /// The client's FIN arrived.
    eof: bool,
    /// Our FIN is submitted (after the last answer): input is dropped until the
    /// client's FIN or this deadline.
    linger: Option<Instant>,
    /// In the list of connections with answers to write.
    queued: bool,
}

/// The server's state over any [`Rings`]: connections, answers owed, counters.
pub struct ZcLogic {
    resp: Responses,
    cache: CacheState,
    /// Indexed by the handle's slot (its low 32 bits).
    conns: Vec<Option<ZConn>>,
    live: usize,
    /// Connections with answers (or a FIN or close) to submit.
    writers: Vec<u64>,
    /// The list a turn walks while `writers` collects the ones still blocked (kept,
    /// so a turn allocates nothing).
    walking: Vec<u64>,
    max_conns: usize,
    stats: Stats,
    next_sweep: Instant,
}

/// The server on the stack's own zero-copy port (in-process).
pub struct ZcServer {
    logic: ZcLogic,
    port: ZcPort,
}

fn slot(h: u64) -> usize {
    h as u32 as usize
}

/// The listening address of `cfg`.
fn listen_addr(cfg: &HttpdConfig) -> SocketAddr {
    SocketAddr::new(
        cfg.bind.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
        cfg.port,
    )
}

impl ZcServer {
    /// Listens on `cfg.bind` (every address by default) and `cfg.port` through a
    /// zero-copy port.
    pub fn start(stack: &mut Stack, cfg: &HttpdConfig) -> io::Result<ZcServer> {
        let logic = ZcLogic::new(cfg)?;
        let addr = listen_addr(cfg);
        let mut port = stack.zc_port(RING_SLOTS, RING_SLOTS);
        stack
            .zc_listen(&mut port, addr, 1024)
            .map_err(|e| io::Error::other(format!("listen on {addr}: {e}")))?;
        Ok(ZcServer { logic, port })
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.logic.live
    }

    /// What the port counted (slots, bytes, refused slots).
    pub fn port_stats(&self) -> usnet_stack::zerocopy::ZcStats {
        self.port.stats()
    }

    /// Closes every connection and gives the port back (buffers included).
    pub fn shutdown(self, stack: &mut Stack) {
        stack.zc_close_port(self.port);
    }
}

impl StackApp for ZcServer {
    fn poll(&mut self, stack: &mut Stack) -> bool {
        let mut rings = InProcess {
            stack,
            port: &mut self.port,
        };
        // Blocked answers keep the loop polling: the stack's turns in between are
        // what frees the ring slots and buffers they wait for.
        self.logic.turn(&mut rings) || self.logic.blocked()
    }

    fn stats(&self) -> Stats {
        self.logic.stats
    }
}

/// Runs the server as a client process of the stack server `stack` (started with
/// `usnet up --zero-copy`) until `stop` is set: its rings and the stack's pool are
/// shared memory, and the stack's loop does the protocol work in its own process.
pub fn run_client(stack: &str, cfg: &HttpdConfig, stop: &AtomicBool) -> io::Result<Stats> {
    let mut logic = ZcLogic::new(cfg)?;
    let net = usnet_client::Client::attach(stack)?;
    let slots = RING_SLOTS as u32;
    let mut port = usnet_client::ZcPort::open(
        &net,
        usnet_client::ZcOptions {
            rx_slots: slots,
            tx_slots: slots,
            // Answers take buffers as fast as they go: a few hundred at hand is
            // plenty, and a stash holds its buffers out of the stack's pool.
            stash_slots: 512,
        },
    )?;
    let addr = listen_addr(cfg);
    port.listen(addr, 1024)
        .map_err(|e| io::Error::new(e.kind(), format!("listen on {addr}: {e}")))?;
    let mut spin = usnet_driver::SpinWindow::new(Duration::from_micros(cfg.spin_us));
    while !stop.load(Ordering::Relaxed) {
        // Taken before the turn looks at the rings: a change the stack makes after
        // it (TX slots taken, the stash refilled) ends the wait below at once.
        let mark = port.changes();
        if logic.turn(&mut port) {
            spin.worked();
            continue;
        }
        // Nothing moved (answers may be blocked on a full TX ring or an empty
        // stash): the stack's loop, which frees both, needs the core, often this
        // one. Trying again at once would ring it and spin in its way.
        if spin.keep_polling() {
            std::hint::spin_loop();
            continue;
        }
        match port.wait_since(mark, Duration::from_millis(100)) {
            // A signal (the stop flag's, say) ends a wait; the loop looks at the flag.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => {
                r?;
            }
        }
    }
    Ok(logic.stats)
}

impl ZcLogic {
    fn new(cfg: &HttpdConfig) -> io::Result<ZcLogic> {
        let resp = Responses::new(cfg.length, &cfg.headers)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Ok(ZcLogic {
            resp,
            cache: if cfg.zc_cache {
                CacheState::Unbuilt
            } else {
                CacheState::Off
            },
            conns: Vec::new(),
            live: 0,
            writers: Vec::new(),
            walking: Vec::new(),
            max_conns: cfg.max_conns.max(1),
            stats: Stats::default(),
            next_sweep: Instant::now(),
        })
    }

    /// What the server did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// One turn: an exchange, the RX slots, the answers, and a second exchange
    /// when TX slots wait (so the frames leave at once). Returns whether it moved
    /// anything (took a slot, submitted one); answers that could not be submitted
    /// show in [`ZcLogic::blocked`].
    pub fn turn(&mut self, rings: &mut impl Rings) -> bool {
        rings.exchange();
        let took = self.take_rx(rings);
        let wrote = self.write_answers(rings);
        let now = Instant::now();
        if now >= self.next_sweep {
            self.sweep(rings, now);
            self.next_sweep = now + Duration::from_millis(200);
        }
        if rings.tx_waiting() {
            rings.exchange();
        }
        took || wrote
    }

    /// Answers (or a FIN or close) wait for TX slots or buffers.
    pub fn blocked(&self) -> bool {
        !self.writers.is_empty()
    }

    fn conn_mut(&mut self, h: u64) -> Option<&mut ZConn> {
        self.conns
            .get_mut(slot(h))
            .and_then(Option::as_mut)
            .filter(|c| c.h == h)
    }

    fn mark_writer(&mut self, h: u64) {
        if let Some(c) = self.conn_mut(h) {
            if !c.queued {
                c.queued = true;
                self.writers.push(h);
            }
        }
    }

    /// Forgets a connection and submits its close (an abort is a close here: the
    /// stack resets a connection closed with unread data, as Linux does).
    fn close(&mut self, rings: &mut impl Rings, h: u64, failed: bool) -> bool {
        let i = slot(h);
        if self.conns.get(i).and_then(Option::as_ref).map(|c| c.h) != Some(h) {
            return true;
        }
        if !rings.send(flag_slot(h, SLOT_CLOSE)) {
            return false;
        }
        self.conns[i] = None;
        self.live -= 1;
        self.stats.closed += 1;
        if failed {
            self.stats.resets += 1;
        }
        true
    }

    /// Handles the receive slots from `head` to `tail`, giving each buffer back.
    fn take_rx(&mut self, rings: &mut impl Rings) -> bool {
        let mut did = false;
        while let Some(s) = rings.rx_slot() {
            did = true;
            let h = s.socket;
            if s.flags & SLOT_NEW != 0 {
                if self.live >= self.max_conns {
                    self.stats.refused += 1;
                    let _ = rings.send(flag_slot(h, SLOT_CLOSE));
                } else {
                    // The answers leave at once anyway: every answer's last slot
                    // is pushed (no SLOT_MORE), as a write with TCP_NODELAY.
                    let i = slot(h);
                    if self.conns.len() <= i {
                        self.conns.resize_with(i + 1, || None);
                    }
                    self.conns[i] = Some(ZConn {
                        h,
                        piece: s.off,
                        session: RequestStream::default(),
                        out: Outq::default(),
                        eof: false,
                        linger: None,
                        queued: false,
                    });
                    self.live += 1;
                    self.stats.accepted += 1;
                }
            } else if s.flags & SLOT_ERROR != 0 {
                let _ = self.close(rings, h, true);
            } else if s.len > 0 {
                let stats = &mut self.stats;
                if let (Some(c), Some(bytes)) = (
                    self.conns
                        .get_mut(slot(h))
                        .and_then(Option::as_mut)
                        .filter(|c| c.h == h),
                    rings.payload(&s),
                ) {
                    stats.rx_bytes += bytes.len() as u64;
                    if c.linger.is_none() {
                        let before = (c.session.requests, c.session.errors);
                        c.session.feed(bytes, &mut c.out);
                        stats.requests += c.session.requests - before.0;
                        stats.bad_requests += c.session.errors - before.1;
                    }
                }
                self.mark_writer(h);
            } else if s.flags & SLOT_EOF != 0 {
                if let Some(c) = self.conn_mut(h) {
                    c.eof = true;
                    c.session.end_of_input();
                }
                self.mark_writer(h);
            }
            rings.rx_pass();
        }
        did
    }

    /// Writes the answers owed into transmit buffers; then a FIN after the last
    /// answer, a close after the client's FIN. Connections the ring or the pool
    /// could not take stay listed for the next turn. Returns whether it submitted a
    /// slot.
    fn write_answers(&mut self, rings: &mut impl Rings) -> bool {
        let head = rings.headroom();
        let mut wrote = false;
        let mut writers = std::mem::take(&mut self.walking);
        std::mem::swap(&mut writers, &mut self.writers);
        for &h in &writers {
            let resp = &self.resp;
            let Some(c) = self
                .conns
                .get_mut(slot(h))
                .and_then(Option::as_mut)
                .filter(|c| c.h == h)
            else {
                continue;
            };
            let mut blocked = false;
            // A whole buffer is one piece here (TSO): the answers can go from the
            // cache, built the first time one can.
            let cached = c.piece == 0 || c.piece as usize >= rings.capacity();
            if cached && matches!(self.cache, CacheState::Unbuilt) {
                match Cache::build(rings, resp) {
                    Ok(cache) => self.cache = CacheState::Ready(cache),
                    Err(false) => self.cache = CacheState::Off,
                    Err(true) => {}
                }
            }
            while !c.out.is_empty() {
                if rings.tx_space() < 2 {
                    blocked = true;
                    break;
                }
                if let (true, CacheState::Ready(cache), Some((r, off))) =
                    (cached, &self.cache, c.out.front())
                {
                    if let Some((buf, at, n)) = cache.piece(resp, r, off, head) {
                        let done = c.out.advance(resp, n as usize);
                        self.stats.responses += done as u64;
                        self.stats.tx_bytes += u64::from(n);
                        let more = if c.out.is_empty() { 0 } else { SLOT_MORE };
                        wrote |= rings.send(Slot {
                            buf,
                            off: at,
                            len: n,
                            flags: more | SLOT_KEEP,
                            socket: h,
                        });
                        continue;
                    }
                }
                let Some(b) = rings.alloc() else {
                    blocked = true;
                    break;
                };
                let Some(buf) = rings.buf_mut(b) else {
                    blocked = true;
                    break;
                };
                // One segment's payload (or the buffer's room, when unknown).
                let room = buf.len() - head;
                let piece = if c.piece == 0 {
                    room
                } else {
                    (c.piece as usize).min(room)
                };
                let n = c.out.fill(resp, &mut buf[head..head + piece]);
                let done = c.out.advance(resp, n);
                self.stats.responses += done as u64;
                self.stats.tx_bytes += n as u64;
                let more = if c.out.is_empty() { 0 } else { SLOT_MORE };
                wrote |= rings.send(Slot {
                    buf: b,
                    off: head as u32,
                    len: n as u32,
                    flags: more,
                    socket: h,
                });
            }
            if !blocked && c.session.is_closing() && c.linger.is_none() {
                if rings.send(flag_slot(h, SLOT_SHUT_WR)) {
                    c.linger = Some(Instant::now() + LINGER);
                    wrote = true;
                } else {
                    blocked = true;
                }
            }
            if !blocked && c.eof && c.out.is_empty() {
                blocked = !self.close(rings, h, false);
                wrote |= !blocked;
            }
            if let Some(c) = self.conn_mut(h) {
                c.queued = blocked;
            }
            if blocked {
                self.writers.push(h);
            }
        }
        writers.clear();
        self.walking = writers;
        wrote
    }

    fn sweep(&mut self, rings: &mut impl Rings, now: Instant) {
        let expired: Vec<u64> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.linger.is_some_and(|d| d <= now))
            .map(|c| c.h)
            .collect();
        for h in expired {
            let _ = self.close(rings, h, false);
        }
    }
}

/// A slot without payload: a close or a shutdown.
fn flag_slot(h: u64, flags: u16) -> Slot {
    Slot {
        buf: NO_BUF,
        flags,
        socket: h,
        ..Slot::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rings scripted by the test: RX slots to hand out, a TX ring of `space`
    /// slots that nothing drains, and buffers of 2 KiB.
    struct Scripted {
        rx: std::collections::VecDeque<(Slot, Vec<u8>)>,
        tx: Vec<Slot>,
        space: u32,
        bufs: Vec<Vec<u8>>,
    }

    impl Rings for Scripted {
        fn rx_slot(&self) -> Option<Slot> {
            self.rx.front().map(|(s, _)| *s)
        }
        fn rx_pass(&mut self) {
            self.rx.pop_front();
        }
        fn payload(&self, _: &Slot) -> Option<&[u8]> {
            self.rx.front().map(|(_, b)| b.as_slice())
        }
        fn tx_space(&self) -> u32 {
            self.space
        }
        fn send(&mut self, s: Slot) -> bool {
            if self.space == 0 {
                return false;
            }
            self.space -= 1;
            self.tx.push(s);
            true
        }
        fn alloc(&mut self) -> Option<u32> {
            self.bufs.push(vec![0; 2048]);
            Some(self.bufs.len() as u32 - 1)
        }
        fn buf_mut(&mut self, buf: u32) -> Option<&mut [u8]> {
            self.bufs.get_mut(buf as usize).map(Vec::as_mut_slice)
        }
        fn headroom(&self) -> usize {
            128
        }
        fn capacity(&self) -> usize {
            2048 - 128
        }
        fn free(&mut self, _: u32) {}
        fn exchange(&mut self) {}
        fn tx_waiting(&self) -> bool {
            false
        }
    }

    fn rx(socket: u64, flags: u16, bytes: &[u8]) -> (Slot, Vec<u8>) {
        let s = Slot {
            buf: if bytes.is_empty() { NO_BUF } else { 0 },
            off: 0,
            len: bytes.len() as u32,
            flags,
            socket,
        };
        (s, bytes.to_vec())
    }

    /// An answer that finds no TX slot is no progress: a client process that took
    /// it for work tried again at once, ringing the stack's loop each time and
    /// spinning on the core that loop needed (0.42× the in-process server at
    /// 64 KiB responses before, 0.9× since).
    #[test]
    fn an_answer_blocked_on_the_tx_ring_is_not_progress() {
        let cfg = HttpdConfig {
            length: 4096,
            ..Default::default()
        };
        let mut logic = ZcLogic::new(&cfg).unwrap();
        let mut rings = Scripted {
            rx: [
                rx(7, SLOT_NEW, b""),
                rx(7, 0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            ]
            .into(),
            tx: Vec::new(),
            space: 0,
            bufs: Vec::new(),
        };
        assert!(logic.turn(&mut rings), "the request was taken");
        assert!(logic.blocked());
        assert!(rings.tx.is_empty());
        assert!(!logic.turn(&mut rings), "nothing moved");
        assert!(logic.blocked());

        rings.space = 64;
        assert!(logic.turn(&mut rings), "the answer went out");
        assert!(!logic.blocked());
        let sent: u32 = rings.tx.iter().map(|s| s.len).sum();
        assert_eq!(sent as usize, logic.resp.response().len());
        assert_eq!(rings.tx.last().unwrap().flags & SLOT_MORE, 0);
        assert!(!logic.turn(&mut rings), "and nothing is left");
    }

    /// The bytes the TX slots sent so far on `socket`, read from the buffers.
    fn sent_bytes(rings: &Scripted, socket: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for s in rings.tx.iter().filter(|s| s.socket == socket && s.len > 0) {
            out.extend_from_slice(&rings.bufs[s.buf as usize][s.off as usize..][..s.len as usize]);
        }
        out
    }

    /// Where a whole buffer is one piece, answers go from buffers written once and
    /// kept (`SLOT_KEEP`): two connections and three answers (one a HEAD, a prefix of
    /// the same bytes) take no buffer beyond the cache, and every byte is the
    /// response's. A connection whose piece is one segment, and a server with the
    /// cache off, write their answers into fresh buffers.
    #[test]
    fn answers_go_from_kept_buffers_where_a_buffer_is_one_piece() {
        let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        let head = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";
        for cache_on in [true, false] {
            let cfg = HttpdConfig {
                length: 5000,
                zc_cache: cache_on,
                ..Default::default()
            };
            let mut logic = ZcLogic::new(&cfg).unwrap();
            let capacity = (2048 - 128) as u32;
            let new = |socket, piece| {
                let (mut s, b) = rx(socket, SLOT_NEW, b"");
                s.off = piece;
                (s, b)
            };
            let mut rings = Scripted {
                rx: [
                    new(1, capacity),
                    new(2, capacity),
                    new(3, 1448),
                    rx(1, 0, get),
                    rx(2, 0, head),
                    rx(2, 0, get),
                    rx(3, 0, get),
                ]
                .into(),
                tx: Vec::new(),
                space: 1024,
                bufs: Vec::new(),
            };
            assert!(logic.turn(&mut rings));
            let full = logic.resp.response().to_vec();
            let head_len = logic.resp.head_len();
            assert_eq!(sent_bytes(&rings, 1), full);
            assert_eq!(
                sent_bytes(&rings, 2),
                [&full[..head_len], &full[..]].concat()
            );
            assert_eq!(sent_bytes(&rings, 3), full);
            let kept = |socket| {
                rings
                    .tx
                    .iter()
                    .filter(|s| s.socket == socket && s.flags & SLOT_KEEP != 0)
                    .count()
            };
            // 5,087 bytes in buffers of 1,920: three pieces an answer.
            let per_answer = full.len().div_ceil(capacity as usize);
            if cache_on {
                assert_eq!((kept(1), kept(2)), (per_answer, 1 + per_answer));
                // The two responses (keep-alive and close), once.
                assert_eq!(rings.bufs.len(), 2 * per_answer + full.len().div_ceil(1448));
            } else {
                assert_eq!((kept(1), kept(2)), (0, 0));
            }
            assert_eq!(kept(3), 0, "a one-segment piece is written, not kept");
            assert!(rings.tx.iter().all(|s| s.len <= capacity));
        }
    }
}
