//! The usnet core, sans-IO: a [`Stack`] is fed received frames and the current time, and
//! hands out frames to transmit and the next deadline. It owns its packet pool and
//! never blocks, sleeps, reads a clock or makes a system call, so the same inputs give
//! the same outputs and whole conversations can be simulated ([`sim`]).
//!
//! Receive path: `receive` (bounded input queue: drop 1) → `poll` → Ethernet → early
//! demux (the UDP socket is looked up from the headers before checksums are verified)
//! → ARP / IPv4 / IPv6 (+ reassembly) → ICMP / NDP / UDP → socket queue (bounded:
//! drop 2) → application; TCP segments go to their connection or listener (the
//! `usnet-tcp` engine, glued in by `tcp/`). Every drop has a named counter in
//! [`Counters`].
//!
//! Inside, a stack is two parts that borrow independently: the core (`core.rs`:
//! pool, queues, addresses, routes, neighbours, reassembly, counters, clock; the
//! transmit path in `tx.rs`) and the socket table (`socket/`: slots with owners,
//! demux maps, TCP timers). Shared types live in the leaf module `types.rs`. The
//! application's calls are in `udp.rs`, `ping.rs` and `tcp/api.rs`.

#![forbid(unsafe_code)]

mod api;
pub mod config;
mod core;
pub mod counters;
mod error;
pub mod frag;
mod gro;
mod icmp_error;
mod mcast;
pub mod neighbor;
mod ping;
mod prio;
mod rx;
pub mod shard;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod socket;
pub mod soft_offload;
mod tcp;
pub mod time;
mod tx;
pub mod tx_stamps;
mod types;
mod udp;
pub mod zerocopy;

use std::collections::VecDeque;
use std::net::IpAddr;

use usnet_pool::{PacketPool, PktBuf};
use usnet_wire::MacAddr;

pub use config::RxPolicy;
pub use config::{mac_from_seed, IpCidr, StackConfig};
pub use counters::Counters;
pub use error::{ConfigError, StackError};
pub use icmp_error::{IcmpReport, PendingAfter, ORIGIN_ICMP, ORIGIN_ICMP6, ORIGIN_LOCAL};
pub use ping::EchoReply;
pub use prio::{OwnerInfo, PrioMember, PrioStatus, SchedRequest};
pub use shard::{Handoff, ShardRole};
pub use socket::{
    DgramProto, Families, IcmpFilter, IpFamily, Owner, Readiness, SocketHandle, SocketStats,
    TcpIpOpts, RAW_PORT_V4, RAW_PORT_V6,
};
pub use tcp::{TcpConnEntry, TcpListenCopy, TcpListenEntry};
pub use time::Instant;
pub use types::{UdpRecvInfo, UdpSendMeta};
pub use udp::UdpEntry;
pub use usnet_pool::Lender;
pub use usnet_tcp::config::PROFILES as TCP_PROFILES;
/// The TCP engine's types that appear in the stack's API.
pub use usnet_tcp::{
    sndbuf_for_option, CcAlgorithm, Keepalive, LentBytes, RecvSink, State as TcpState, TcpConfig,
    TcpInfo, TcpStats,
};

use crate::core::Core;
use socket::{Socket, SocketSet};

/// Largest UDP payload over IPv4 (65535 − 20 − 8); IPv6 allows 65527 but we keep one
/// limit for both.
pub const MAX_UDP_PAYLOAD: usize = 65507;

/// One network interface's worth of protocol state: the core and the socket table.
pub struct Stack {
    core: Core,
    sockets: SocketSet,
    /// Segments held for receive coalescing; empty outside `poll`.
    gro: gro::Gro,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("mac", &self.core.cfg.mac)
            .field("addrs", &self.core.addrs)
            .finish()
    }
}

impl Stack {
    pub fn new(cfg: StackConfig) -> Result<Stack, ConfigError> {
        let seed = cfg.seed;
        Ok(Stack {
            core: Core::new(cfg)?,
            sockets: SocketSet::new(seed),
            gro: gro::Gro::default(),
        })
    }

    pub fn config(&self) -> &StackConfig {
        &self.core.cfg
    }
    pub fn mac(&self) -> MacAddr {
        self.core.cfg.mac
    }
    /// Configured addresses plus the IPv6 link-local one.
    pub fn addrs(&self) -> &[IpCidr] {
        &self.core.addrs
    }
    pub fn mtu(&self) -> usize {
        self.core.cfg.mtu
    }
    pub fn counters(&self) -> &Counters {
        &self.core.counters
    }
    pub fn pool(&self) -> &PacketPool {
        &self.core.pool
    }
    pub fn pool_mut(&mut self) -> &mut PacketPool {
        &mut self.core.pool
    }
    /// The neighbour table, `(ip, mac)` with `None` while resolving.
    pub fn neighbors(&self) -> Vec<(IpAddr, Option<MacAddr>)> {
        self.core.neighbors.entries()
    }
    /// The time the stack was last given.
    pub fn now(&self) -> Instant {
        self.core.now
    }

    /// `(source, next hop)` for `dst`, or `None` when there is no route.
    pub fn route(&self, dst: IpAddr) -> Option<(IpAddr, IpAddr)> {
        self.core.route(dst)
    }

    // ---------------------------------------------------------------- frames and time

    /// Hands a received frame to the stack (ownership moves). Cheap: it only queues;
    /// protocol work happens in `poll`. A full input queue drops it (drop 1).
    #[inline]
    pub fn receive(&mut self, frame: PktBuf) {
        if !self.core.cfg.shard.sharded() {
            self.core.enqueue(frame);
            return;
        }
        let Some(frame) = self.core.steer(frame) else {
            return;
        };
        if !self.core.redirects.is_empty() {
            if let Some(to) = self.redirect_target(&frame) {
                self.core.redirect(frame, to);
                return;
            }
        }
        self.core.enqueue(frame);
    }

    /// The shard a frame this shard owns must go to because its port's socket
    /// lives there ([`Stack::set_port_redirect`]), if any.
    fn redirect_target(&mut self, frame: &PktBuf) -> Option<usize> {
        let flow = shard::flow_of(self.core.pool.data(frame))?;
        let here = flow.proto == 6
            && self
                .sockets
                .tcp
                .conns
                .contains_key(&(flow.local, flow.remote));
        self.core.redirect_of(&flow, here)
    }

    /// A sharded stack server's directory of who holds which port: segments for
    /// local `port` (`proto` 6 for TCP, 17 for UDP) that this shard owns and has no
    /// socket for go to one of the shards `to` (chosen by the flow's hash; a TCP
    /// connection by its SYN, and remembered). Empty `to`: they stay here. Counted as
    /// `shard_redirected`.
    pub fn set_port_redirect(&mut self, proto: u8, port: u16, to: &[usize]) {
        self.core.redirects.set_port(proto, port, to);
    }

    /// Connections this shard hands to another by a port redirect.
    pub fn redirected_flows(&self) -> usize {
        self.core.redirects.flows()
    }

    /// Takes the frames and datagrams this shard received for other shards
    /// (`(shard, handoff)`), for the host to deliver with [`Stack::receive_handoff`].
    pub fn take_handoffs(&mut self, out: &mut Vec<(usize, Handoff)>) {
        out.append(&mut self.core.handoffs);
    }

    /// Whether handoffs wait to be taken.
    pub fn has_handoffs(&self) -> bool {
        !self.core.handoffs.is_empty()
    }

    /// A frame or datagram another shard handed to this one: processed here, not
    /// steered again. A frame finds no pool buffer: dropped and counted, as at the
    /// device.
    pub fn receive_handoff(&mut self, h: Handoff) {
        self.core.counters.shard_handoff_in += 1;
        match h {
            Handoff::Frame { bytes, offload } => match self.core.pool.alloc_from(&bytes) {
                Some(b) => {
                    self.core.pool.set_offload(&b, offload);
                    // Steered here as its owner (not redirected here: then its
                    // owner is the shard that sent it), it may belong to a port
                    // whose socket lives elsewhere.
                    let n = usize::from(self.core.cfg.shard.count);
                    let me = usize::from(self.core.cfg.shard.index);
                    if !self.core.redirects.is_empty()
                        && shard::owner(&bytes, n) == shard::Owner::Shard(me)
                    {
                        if let Some(to) = self.redirect_target(&b) {
                            self.core.redirect(b, to);
                            return;
                        }
                    }
                    self.core.enqueue(b);
                }
                None => self.core.counters.drop_pool_exhausted += 1,
            },
            Handoff::Datagram {
                src,
                dst,
                proto,
                hop_limit,
                data,
                invoking,
            } => self.deliver_datagram(src, dst, proto, hop_limit, data, invoking, false),
        }
    }

    /// Frames waiting in the input queue.
    pub fn input_len(&self) -> usize {
        self.core.input.len()
    }

    /// Does the protocol work due at `now`: up to `rx_budget` received frames, then
    /// timers. Returns whether anything was processed.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.advance(now);
        let mut did = false;
        for _ in 0..self.core.cfg.rx_budget {
            let Some(buf) = self.core.input.pop_front() else {
                break;
            };
            self.process_frame(buf);
            did = true;
        }
        // Held segments never outlive the poll that took them.
        self.gro_flush();
        did |= self.tcp_poll_timers();
        did |= self.core.run_timers();
        did |= self.prio_poll();
        self.core.counters.neigh_evicted = self.core.neighbors.evicted;
        did
    }

    /// Moves the clock without doing protocol work (sends use the latest time).
    pub fn advance(&mut self, now: Instant) {
        if now > self.core.now {
            self.core.now = now;
        }
    }

    /// When `poll` next has timer work, if ever. Pending input means "now".
    pub fn poll_at(&self) -> Option<Instant> {
        if !self.core.input.is_empty() {
            return Some(self.core.now);
        }
        // TCP deadlines are not rounded to the tick: a due ACK goes out now.
        [
            self.core.timers_at(),
            self.tcp_poll_at(),
            self.core.prio_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Polls at `now` until nothing is left to do (at most 64 passes), then checks
    /// that no deadline is still due: `Err(deadline)` if one is, for then a loop
    /// driving this stack would wake at once for ever without doing anything.
    /// Harnesses (fuzz targets, simulations) call it to catch that class of bug.
    /// A full transmit queue is not idle (the stack waits for the link to take
    /// frames): draining it is the caller's job.
    pub fn run_until_idle(&mut self, now: Instant) -> Result<(), Instant> {
        for _ in 0..64 {
            if !self.poll(now) && self.input_len() == 0 {
                break;
            }
        }
        match self.due_while_idle(now) {
            Some(d) => Err(d),
            None => Ok(()),
        }
    }

    /// For a stack whose last poll at `now` did nothing: a deadline still due, which
    /// would make its loop wake at once for ever (a bug). A full transmit queue is
    /// not counted: the stack then waits for the link to take frames.
    pub fn due_while_idle(&self, now: Instant) -> Option<Instant> {
        let waits_for_link = self.core.tx.len() >= self.core.cfg.tx_queue_len;
        self.poll_at()
            .filter(|&d| d <= now && self.input_len() == 0 && !waits_for_link)
    }

    /// Frames ready for the device.
    pub fn tx_len(&self) -> usize {
        self.core.tx.len()
    }
    pub fn dequeue_tx(&mut self) -> Option<PktBuf> {
        self.core.tx.pop_front()
    }
    /// The pool and the transmit queue together, for a device's `tx_burst`.
    pub fn tx_parts(&mut self) -> (&mut PacketPool, &mut VecDeque<PktBuf>) {
        (&mut self.core.pool, &mut self.core.tx)
    }

    // ---------------------------------------------------------------- sockets of any kind

    pub fn socket_stats(&self, h: SocketHandle) -> Result<SocketStats, StackError> {
        let s = self.sockets.get(h).ok_or(StackError::InvalidHandle)?;
        match s {
            Socket::Udp(u) => Ok(u.stats),
            _ => self.tcp_socket_stats(s).ok_or(StackError::InvalidHandle),
        }
    }

    /// The most pool buffers one owner's receive queues may hold (`None`: no
    /// limit, the default). A stack server sets it so that a client that stops
    /// reading cannot take the pool from the others; past it, that owner's
    /// datagrams are dropped and counted (`udp_rx_owner_full`, and the socket's
    /// `rx_queue_full`).
    pub fn set_rx_owner_limit(&mut self, bufs: Option<u32>) {
        self.sockets.rx_owner_limit = bufs;
    }

    pub fn rx_owner_limit(&self) -> Option<u32> {
        self.sockets.rx_owner_limit
    }

    /// Pool buffers the receive queues of `owner`'s sockets hold.
    pub fn rx_held(&self, owner: Owner) -> u32 {
        self.sockets.rx_held(owner)
    }

    /// Closes a socket of any kind and gives back the buffers it held (for TCP,
    /// `tcp_close`).
    pub fn close(&mut self, h: SocketHandle) -> Result<(), StackError> {
        if matches!(
            self.sockets.get(h),
            Some(Socket::TcpConn(_) | Socket::TcpListen(_))
        ) {
            return self.tcp_close(h);
        }
        match self.sockets.remove(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => {
                for d in u.rxq {
                    self.core.pool.free(d.buf);
                }
                // A closed socket leaves its groups (the last one out sends the leave).
                for g in u.mc.groups {
                    self.core.mcast_leave(g);
                }
            }
            Socket::TcpConn(_) | Socket::TcpListen(_) => {}
        }
        Ok(())
    }

    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness, StackError> {
        let writable = self.core.tx.len() < self.core.cfg.tx_queue_len;
        Ok(
            match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
                Socket::Udp(u) => Readiness {
                    readable: !u.rxq.is_empty(),
                    writable,
                    ..Readiness::default()
                },
                s => self.tcp_readiness(s).unwrap_or_default(),
            },
        )
    }

    /// Sockets that became readable since the last call (edge-triggered, like epoll
    /// with EPOLLET). A socket reappears only after it was drained and filled again...
    /// or simply after this call, if data arrives again.
    pub fn take_ready(&mut self, out: &mut Vec<SocketHandle>) {
        while let Some(h) = self.sockets.ready.pop_front() {
            if let Some(slot) = self.sockets.slots.get_mut(h.index as usize) {
                slot.ready_queued = false;
                if slot.gen == h.gen && slot.sock.is_some() {
                    out.push(h);
                }
            }
        }
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

    // ---------------------------------------------------------------- owners

    /// Who `h` belongs to ([`Owner::LOCAL`] unless set); `None` for a stale handle.
    pub fn owner(&self, h: SocketHandle) -> Option<Owner> {
        self.sockets.owner(h)
    }

    /// Gives `h` to `owner` (a stack server does this for its clients' sockets).
    /// Connections a listener accepts later inherit its owner.
    pub fn set_owner(&mut self, h: SocketHandle, owner: Owner) -> Result<(), StackError> {
        if self.sockets.set_owner(h, owner) {
            self.prio_consider(h);
            Ok(())
        } else {
            Err(StackError::InvalidHandle)
        }
    }

    /// Every TCP connection's internal invariants (its scoreboard recounted against
    /// its cached counters, `Connection::check_invariants`), for the fuzz targets
    /// after each step. The first violation, with the socket.
    pub fn tcp_check_invariants(&self) -> Result<(), String> {
        for (h, sock, _) in self.sockets.live() {
            if let Socket::TcpConn(c) = sock {
                c.conn
                    .check_invariants()
                    .map_err(|e| format!("{h:?} {} → {}: {e}", c.local, c.remote))?;
            }
        }
        Ok(())
    }

    /// The live sockets `owner` holds, orphaned TCP connections (closed, finishing in
    /// the background) left out.
    pub fn sockets_of(&self, owner: Owner) -> Vec<SocketHandle> {
        self.sockets
            .live()
            .filter(|(_, sock, slot)| {
                slot.owner == owner && !matches!(sock, Socket::TcpConn(c) if c.orphan)
            })
            .map(|(h, ..)| h)
            .collect()
    }

    /// Closes everything `owner` holds, as the kernel does for a process that died:
    /// TCP connections are aborted (RST to the peer), listeners closed (their
    /// unaccepted connections reset), UDP and ping sockets freed with their buffers.
    /// Returns how many sockets were closed.
    pub fn close_owner(&mut self, owner: Owner) -> usize {
        self.tcp_unbind_owner(owner);
        let handles = self.sockets_of(owner);
        for &h in &handles {
            let r = match self.sockets.get(h) {
                // Closing a listener earlier in the list reset and freed the
                // connections still in its accept queue.
                None => continue,
                Some(Socket::TcpConn(s)) if s.orphan => continue,
                Some(Socket::TcpConn(_)) => self.tcp_abort(h),
                _ => self.close(h),
            };
            debug_assert!(r.is_ok(), "a live handle closes");
        }
        handles.len()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Give every buffer back so a pool shared with devices sees no leak.
        self.core.release_queues();
        for slot in &mut self.sockets.slots {
            if let Some(Socket::Udp(u)) = slot.sock.take() {
                for d in u.rxq {
                    self.core.pool.free(d.buf);
                }
            }
        }
    }
}
