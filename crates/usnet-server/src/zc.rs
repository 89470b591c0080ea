//! A session's zero-copy port (`usnet_session_abi::zc`): the stack's [`ZcPort`] mirrored into
//! the client's port area. The port itself stays in the server's memory; each sync
//! copies the slots the client wrote (24 bytes each, never payload) into it, runs
//! [`Stack::zc_sync`], and copies the slots the stack wrote back out. So the stack's
//! checks see exactly what the client asked, and nothing the client writes later can
//! change a slot the stack already took. The server's own indices live here too (its
//! side, `tail`, of each ring: `usnet_shm::spsc::WrappedEnd`) and are only ever
//! stored into the area, never read back from it.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;

use usnet_session::zc::{PoolGeometry, ZcArea, ZcRing};
use usnet_session_abi::zc::{self, Geometry};
use usnet_shm::spsc::WrappedEnd;
use usnet_stack::zerocopy::ZcPort;
use usnet_stack::{Owner, SocketHandle, Stack, StackError};

use crate::zc_slots::{from_abi, to_abi};

pub(crate) struct ServerZc {
    pub area: ZcArea,
    port: ZcPort,
    /// Our side (`tail`) of each ring. RX's and TX's follow the stack's port.
    rx: WrappedEnd,
    tx: WrappedEnd,
    stash: WrappedEnd,
    give: WrappedEnd,
    /// References to pool buffers the client may hold at once (delivered, kept,
    /// stashed; at most a quarter of the pool): beyond it the stash is not refilled.
    quota: usize,
}

impl ServerZc {
    /// A port with rings of `g`'s sizes over `stack`'s pool (which must be a memfd:
    /// the caller hands it to the client).
    pub fn new(stack: &Stack, g: Geometry) -> io::Result<ServerZc> {
        let pool = stack.pool();
        let area = ZcArea::create(
            g,
            PoolGeometry {
                buf_size: pool.buf_size() as u32,
                buf_count: pool.count(),
                headroom: pool.headroom() as u32,
            },
        )?;
        // At most a quarter of the pool: the stack must keep buffers to receive into.
        let quota = ((g.rx_slots + g.tx_slots + g.stash_slots) as usize)
            .min((pool.count() as usize / 4).max(64));
        Ok(ServerZc {
            rx: area.stack_end(ZcRing::Rx),
            tx: area.stack_end(ZcRing::Tx),
            stash: area.stack_end(ZcRing::Stash),
            give: area.stack_end(ZcRing::Give),
            area,
            port: stack.zc_port(g.rx_slots as usize, g.tx_slots as usize),
            quota,
        })
    }

    /// Whether a sync could do something: the client asked, a socket of some port
    /// has news, or sockets of this one wait for room in its RX ring.
    pub fn wants_sync(&self, stack: &Stack) -> bool {
        self.asked() || stack.zc_has_ready() || self.port.has_pending()
    }

    /// The client asked for a sync (the loop must not sleep).
    pub fn asked(&self) -> bool {
        self.area.word(zc::SYNC).load(Acquire) != 0
    }

    pub fn listen(
        &mut self,
        stack: &mut Stack,
        owner: Owner,
        addr: SocketAddr,
        backlog: usize,
    ) -> Result<SocketHandle, StackError> {
        let h = stack.zc_listen(&mut self.port, addr, backlog)?;
        let _ = stack.set_owner(h, owner);
        Ok(h)
    }

    pub fn connect(
        &mut self,
        stack: &mut Stack,
        owner: Owner,
        remote: SocketAddr,
    ) -> Result<SocketHandle, StackError> {
        let h = stack.zc_connect(&mut self.port, remote)?;
        let _ = stack.set_owner(h, owner);
        Ok(h)
    }

    /// References to pool buffers the client holds (delivered, kept, stashed).
    pub fn held_references(&self) -> usize {
        self.port.held_references()
    }

    /// Slots the stack refused so far.
    pub fn bad_slots(&self) -> u64 {
        self.port.stats().bad_slots
    }

    /// One exchange: given-back buffers, RX `head`, TX slots in; the stack's sync;
    /// RX and TX slots, indices and stash out. Returns whether anything changed for
    /// the client (then its bell rings).
    pub fn sync(&mut self, stack: &mut Stack) -> bool {
        self.area.word(zc::SYNC).store(0, SeqCst);
        let mut changed = self.take_given(stack);
        let area = &self.area;
        let port = &mut self.port;

        // RX: the slots the client passed (it may have swapped buffers in them).
        let rx_head = self.rx.theirs();
        let passed = port.rx.distance(port.rx.head, rx_head);
        if passed <= port.rx.distance(port.rx.head, port.rx.tail) {
            let mut i = port.rx.head;
            while i != rx_head {
                *port.rx.slot_mut(i) = from_abi(area.read_slot(ZcRing::Rx, i));
                i = port.rx.next(i);
            }
        }
        // (Past `tail`: the stack refuses it and puts `head` back.)
        port.rx.head = rx_head;

        // TX: every slot from the stack's `tail` to the client's `head`.
        let tx_head = self.tx.theirs();
        let mut i = port.tx.tail;
        while i != tx_head {
            *port.tx.slot_mut(i) = from_abi(area.read_slot(ZcRing::Tx, i));
            i = port.tx.next(i);
        }
        port.tx.head = tx_head;

        let (rx_tail, tx_tail) = (port.rx.tail, port.tx.tail);
        let report = stack.zc_sync(port);

        // The TX slots taken, with any SLOT_ERROR the stack set, then `tail`.
        let mut i = tx_tail;
        while i != port.tx.tail {
            area.write_slot(ZcRing::Tx, i, &to_abi(port.tx.slot(i)));
            i = port.tx.next(i);
        }
        self.tx.set_mine(port.tx.tail);
        self.tx.publish();
        // The RX slots filled, then `tail`. (`head` stays the client's own word: one
        // that ran past `tail` is refused again at every sync until the client fixes it.)
        let mut i = rx_tail;
        while i != port.rx.tail {
            area.write_slot(ZcRing::Rx, i, &to_abi(port.rx.slot(i)));
            i = port.rx.next(i);
        }
        self.rx.set_mine(port.rx.tail);
        self.rx.publish();
        area.region()
            .u64(zc::BAD_SLOTS)
            .store(port.stats().bad_slots, Relaxed);
        changed |= report.rx > 0 || report.tx > 0 || tx_tail != port.tx.tail;
        changed |= self.refill_stash(stack);
        changed
    }

    /// Buffers the client gave back on the give ring.
    fn take_given(&mut self, stack: &mut Stack) -> bool {
        let head = self.give.theirs();
        let mut t = self.give.mine();
        while t != head {
            let buf = self.area.entry(ZcRing::Give, t).load(Relaxed);
            // One the client does not hold is refused and counted by the stack.
            let _ = stack.zc_free(&mut self.port, buf);
            t = self.give.next(t);
        }
        self.give.set_mine(t);
        self.give.publish()
    }

    /// Fills the stash with free buffers up to the client's quota.
    fn refill_stash(&mut self, stack: &mut Stack) -> bool {
        let head = self.stash.theirs();
        let mut t = self.stash.mine();
        while self.stash.next(t) != head && self.port.held_references() < self.quota {
            let Some(buf) = stack.zc_alloc(&mut self.port) else {
                break;
            };
            self.area.entry(ZcRing::Stash, t).store(buf, Relaxed);
            t = self.stash.next(t);
        }
        self.stash.set_mine(t);
        self.stash.publish()
    }

    /// The client is gone or closed the port: its sockets close (what their send
    /// queues hold still goes out) and every buffer it held goes back to the pool.
    pub fn close(self, stack: &mut Stack) {
        stack.zc_close_port(self.port);
    }
}
