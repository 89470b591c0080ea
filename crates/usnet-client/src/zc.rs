//! Zero-copy rings for a client process: the netmap/PASTE ring API of
//! `usnet_stack::zerocopy` over a stack server (`usnet_session_abi::zc`).
//!
//! The server hands the client its packet pool and the port's rings. Received
//! payload is read in the buffer the frame arrived in; payload to send is written
//! into a pool buffer that the stack sends in place and keeps until it is
//! acknowledged. No byte is copied between the client and the stack.
//!
//! Trust: the client maps the whole pool read-write, so it could read or write any
//! buffer, other clients' traffic included. The server therefore grants ports only
//! to processes of its own user (and root), and only when started with
//! `--zero-copy`, as netmap grants its buffers to whoever may open `/dev/netmap`.
//! What the client writes into slots is still checked by the stack, so a bad slot
//! cannot corrupt the stack's queues or the pool's accounting.
//!
//! Ownership of a buffer moves only through the rings (see `usnet_session_abi::zc`). The
//! references [`ZcPort::payload`] and [`ZcPort::buf_mut`] give are into the shared
//! pool; they are sound because the stack never touches a buffer while the
//! application holds it, and an application that uses a buffer it does not hold
//! only garbles its own data.

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

use usnet_session::zc::{PoolGeometry, ZcArea, ZcRing};
use usnet_session_abi::zc::{self, Geometry, SLOT_BUF_CHANGED};
use usnet_session_abi::{op, Request, SockAddr};
use usnet_shm::spsc::WrappedEnd;
use usnet_shm::BufferArea;

use crate::Client;

pub use usnet_session_abi::zc::{
    Slot as ZcSlot, NO_BUF, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_KEEP, SLOT_MORE, SLOT_NEW,
    SLOT_SHUT_WR,
};

/// Ring sizes of a port.
#[derive(Debug, Clone, Copy)]
pub struct ZcOptions {
    pub rx_slots: u32,
    pub tx_slots: u32,
    /// Free buffers the server keeps ready for [`ZcPort::alloc`].
    pub stash_slots: u32,
}

impl Default for ZcOptions {
    fn default() -> Self {
        ZcOptions {
            rx_slots: 256,
            tx_slots: 256,
            stash_slots: 256,
        }
    }
}

/// A zero-copy port of a session (one per session at a time). Dropping it closes
/// it at the server: its sockets close and every buffer it held goes back.
pub struct ZcPort {
    net: Client,
    area: ZcArea,
    pool: BufferArea,
    geo: PoolGeometry,
    /// Our side (`head`) of each ring; the area holds what we published.
    rx: WrappedEnd,
    tx: WrappedEnd,
    stash: WrappedEnd,
    give: WrappedEnd,
    /// TX slots up to here were looked at by [`ZcPort::tx_refused`].
    tx_seen: u32,
    /// Buffers we hold and do not use, handed out again by [`ZcPort::alloc`].
    spare: Vec<u32>,
}

impl std::fmt::Debug for ZcPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcPort")
            .field("area", &self.area)
            .field("spare", &self.spare.len())
            .finish()
    }
}

fn proto(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

impl ZcPort {
    /// Opens the session's zero-copy port (the server must run with `--zero-copy`,
    /// as the same user).
    pub fn open(net: &Client, opts: ZcOptions) -> io::Result<ZcPort> {
        let (pool_fd, area_fd) = net.conn.zc_port(opts)?;
        let area = ZcArea::attach(area_fd)?;
        let geo = area.pool();
        let pool = map_pool(pool_fd, geo)?;
        let g: Geometry = area.geometry();
        if g.rx_slots < 2 || g.tx_slots < 2 {
            return Err(proto("zero-copy port without rings"));
        }
        Ok(ZcPort {
            net: net.clone(),
            rx: area.app_end(ZcRing::Rx),
            tx: area.app_end(ZcRing::Tx),
            stash: area.app_end(ZcRing::Stash),
            give: area.app_end(ZcRing::Give),
            area,
            pool,
            geo,
            tx_seen: 0,
            spare: Vec::new(),
        })
    }

    /// A zero-copy listener: its connections arrive as [`SLOT_NEW`] RX slots, already
    /// accepted. Returns the socket as slots name it.
    pub fn listen(&self, addr: SocketAddr, backlog: u32) -> io::Result<u64> {
        let mut args = [0u64; 6];
        args[..4].copy_from_slice(&SockAddr::from_std(addr).to_args());
        args[4] = u64::from(backlog);
        self.call(op::ZC_LISTEN, args)
    }

    /// A zero-copy connection to `remote`: payload, or [`SLOT_ERROR`] if it fails,
    /// arrives in the RX ring; send once it is established (a TX slot before that
    /// waits in the stack's send queue, as a write before the handshake ends).
    pub fn connect(&self, remote: SocketAddr) -> io::Result<u64> {
        let mut args = [0u64; 6];
        args[..4].copy_from_slice(&SockAddr::from_std(remote).to_args());
        self.call(op::ZC_CONNECT, args)
    }

    fn call(&self, code: u16, args: [u64; 6]) -> io::Result<u64> {
        let (_, aux) = self.net.conn.call(Request {
            op: code,
            args,
            ..Default::default()
        })?;
        Ok(aux[0])
    }

    /// Where payload starts in a buffer to send (room for the headers in front).
    pub fn headroom(&self) -> u32 {
        self.geo.headroom
    }

    /// Payload bytes a buffer can carry from [`ZcPort::headroom`] on.
    pub fn buf_capacity(&self) -> u32 {
        self.geo.buf_size - self.geo.headroom
    }

    // ------------------------------------------------------------ RX

    /// RX slots waiting for the application.
    pub fn rx_ready(&self) -> u32 {
        self.rx.ready()
    }

    /// The first RX slot waiting, if any.
    pub fn rx_slot(&self) -> Option<ZcSlot> {
        (self.rx_ready() > 0).then(|| self.area.read_slot(ZcRing::Rx, self.rx.mine()))
    }

    /// Done with the first RX slot: its buffer goes back to the stack at the next
    /// sync.
    pub fn rx_advance(&mut self) {
        if self.rx_ready() > 0 {
            self.rx.advance(1);
        }
    }

    /// Keeps the first RX slot's buffer (PASTE's `NS_BUF_CHANGED`): a spare buffer
    /// of ours takes its place in the slot, and the slot is passed. Returns the kept
    /// buffer, or None when the ring is empty or no spare buffer is at hand.
    pub fn rx_keep(&mut self) -> Option<u32> {
        let mut s = self.rx_slot()?;
        let spare = self.alloc()?;
        let kept = s.buf;
        s.buf = spare;
        s.flags |= SLOT_BUF_CHANGED;
        self.area.write_slot(ZcRing::Rx, self.rx.mine(), &s);
        self.rx_advance();
        Some(kept)
    }

    /// The payload of a slot whose buffer the application holds.
    pub fn payload(&self, s: &ZcSlot) -> Option<&[u8]> {
        if s.buf >= self.geo.buf_count {
            return None;
        }
        let start = s.buf as usize * self.geo.buf_size as usize + s.off as usize;
        let end = start.checked_add(s.len as usize)?;
        if s.off as usize + s.len as usize > self.geo.buf_size as usize {
            return None;
        }
        self.pool.get(start, end - start)
    }

    // ------------------------------------------------------------ TX

    /// A free buffer to write and send (write from [`ZcPort::headroom`] on); None
    /// when none is at hand (a sync brings the stash up again).
    pub fn alloc(&mut self) -> Option<u32> {
        if let Some(b) = self.spare.pop() {
            return Some(b);
        }
        if self.stash.ready() == 0 {
            return None;
        }
        let b = self
            .area
            .entry(ZcRing::Stash, self.stash.mine())
            .load(Relaxed);
        self.stash.advance(1);
        // At once, not at the next sync: the server refills the stash whenever it
        // syncs the port, also on its own.
        self.stash.publish();
        Some(b)
    }

    /// The whole memory of a buffer (write payload from [`ZcPort::headroom`] on).
    pub fn buf_mut(&mut self, buf: u32) -> Option<&mut [u8]> {
        if buf >= self.geo.buf_count {
            return None;
        }
        let size = self.geo.buf_size as usize;
        let start = buf as usize * size;
        self.pool.get_mut(start, size)
    }

    /// Gives a held buffer back (one kept from RX, or allocated and not sent). It
    /// stays at hand for the next [`ZcPort::alloc`]; beyond the stash's size it goes
    /// back to the stack.
    pub fn free(&mut self, buf: u32) {
        if self.spare.len() < self.area.size(ZcRing::Stash) as usize {
            self.spare.push(buf);
            return;
        }
        if self.give.room() == 0 {
            // The give ring is full until the next sync: keep it.
            self.spare.push(buf);
            return;
        }
        self.area
            .entry(ZcRing::Give, self.give.mine())
            .store(buf, Relaxed);
        self.give.advance(1);
    }

    /// Slots of the TX ring (one always stays empty).
    pub fn tx_size(&self) -> u32 {
        self.area.size(ZcRing::Tx)
    }

    /// TX slots the application may still fill.
    pub fn tx_space(&self) -> u32 {
        self.tx.room()
    }

    /// Submits a TX slot: `len` bytes of `buf` from `off` for `socket`, with
    /// `SLOT_MORE`, `SLOT_SHUT_WR` or `SLOT_CLOSE` (`buf` [`NO_BUF`] and `len` 0 for
    /// a close or shutdown alone), and `SLOT_KEEP` to keep holding `buf` (send it
    /// again later, on any socket; give it back with [`ZcPort::free`] when done).
    /// False when the ring is full.
    pub fn send(&mut self, s: ZcSlot) -> bool {
        if self.tx_space() == 0 {
            return false;
        }
        self.area.write_slot(ZcRing::Tx, self.tx.mine(), &s);
        self.tx.advance(1);
        true
    }

    /// TX slots the stack refused since the last call (their buffers are still the
    /// application's).
    pub fn tx_refused(&mut self) -> Vec<ZcSlot> {
        let tail = self.tx.theirs();
        let mut out = Vec::new();
        while self.tx_seen != tail {
            let s = self.area.read_slot(ZcRing::Tx, self.tx_seen);
            if s.flags & SLOT_ERROR != 0 {
                out.push(s);
            }
            self.tx_seen = self.tx.next(self.tx_seen);
        }
        out
    }

    /// The port's shared area (tests and tools that look at the raw rings).
    #[doc(hidden)]
    pub fn area(&self) -> &ZcArea {
        &self.area
    }

    /// Slots the server refused so far (bad buffer, range, socket or index).
    pub fn bad_slots(&self) -> u64 {
        self.area.region().u64(zc::BAD_SLOTS).load(Relaxed)
    }

    // ------------------------------------------------------------ sync

    /// Publishes what the application did (RX slots passed, TX slots, buffers given
    /// back) and asks the server for a sync, which also fills the RX ring.
    pub fn sync(&mut self) -> io::Result<()> {
        self.net.conn.check_alive()?;
        self.rx.publish();
        self.tx.publish();
        self.give.publish();
        self.area.word(zc::SYNC).store(1, SeqCst);
        self.net.conn.ring_server();
        Ok(())
    }

    /// Sleeps until the RX ring has slots, the server changed something else for
    /// this session (TX slots taken, the stash refilled), or `timeout` passes.
    /// Returns whether RX slots wait.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        self.wait_since(self.changes(), timeout)
    }

    /// A mark of the server's changes to this session so far, for
    /// [`ZcPort::wait_since`].
    pub fn changes(&self) -> u32 {
        self.net.conn.bell_seq()
    }

    /// As [`ZcPort::wait`], but a change the server made after `mark` was taken
    /// ends the wait at once: an application that found its TX ring full or its
    /// stash empty takes the mark before it looks, so a refill in between is not
    /// slept through.
    pub fn wait_since(&self, mark: u32, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        let seen = mark;
        if self.rx_ready() > 0 {
            return Ok(true);
        }
        self.net.conn.check_alive()?;
        self.net.conn.wait_until(Some(deadline), true, || {
            self.rx_ready() > 0 || self.net.conn.bell_seq() != seen
        })?;
        Ok(self.rx_ready() > 0)
    }
}

impl Drop for ZcPort {
    fn drop(&mut self) {
        let _ = self.net.conn.post(
            Request {
                op: op::ZC_CLOSE,
                ..Default::default()
            },
            true,
        );
    }
}

/// The server sealed the pool's size, so the mapping stays backed; the bytes are
/// shared with the stack under the ring protocol (module docs).
fn map_pool(fd: OwnedFd, g: PoolGeometry) -> io::Result<BufferArea> {
    let want = u64::from(g.buf_size) * u64::from(g.buf_count);
    let len = usize::try_from(want).map_err(|_| proto("the pool is too large"))?;
    BufferArea::attach_memfd(fd, len)
        .map_err(|_| proto("the pool's memfd does not match the port's geometry"))
}
