//! The usnet core, sans-IO: a [`Stack`] is fed received frames and the current time, and
//! hands out frames to transmit and the next deadline. It owns its packet pool and
//! never blocks, sleeps, reads a clock or makes a system call, so the same inputs give
//! the same outputs and whole conversations can be simulated ([`sim`]).
//!
//! Receive path: `receive` (bounded input queue: drop 1) → `poll` → Ethernet → early
//! demux (the UDP socket is looked up from the headers before checksums are verified)
//! → ARP / IPv4 / IPv6 (+ reassembly) → ICMP / NDP / UDP → socket queue (bounded:
//! drop 2) → application; TCP segments go to their connection or listener (the
//! `usnet-tcp` engine, glued in by `tcp.rs`). Every drop has a named counter in
//! [`Counters`].

#![forbid(unsafe_code)]

pub mod config;
pub mod counters;
pub mod frag;
mod gro;
pub mod neighbor;
mod rx;
pub mod sim;
mod socket;
pub mod soft_offload;
mod tcp;
pub mod time;
mod tx;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use usnet_pool::{PacketPool, PktBuf, PoolError};
use usnet_wire::MacAddr;

pub use config::{mac_from_seed, IpCidr, StackConfig};
pub use counters::Counters;
pub use socket::{EchoReply, Readiness, SocketHandle, SocketStats};
pub use tcp::{TcpConnEntry, TcpListenEntry};
pub use time::Instant;
/// The TCP engine's types that appear in the stack's API.
pub use usnet_tcp::{CcAlgorithm, Keepalive, State as TcpState, TcpConfig, TcpInfo, TcpStats};

use frag::Reassembler;
use neighbor::{NeighborCache, NeighborWork};
use socket::{PingSocket, Socket, SocketSet, UdpSocket};

/// Largest UDP payload over IPv4 (65535 − 20 − 8); IPv6 allows 65527 but we keep one
/// limit for both.
pub const MAX_UDP_PAYLOAD: usize = 65507;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StackError {
    #[error("operation would block")]
    WouldBlock,
    #[error("address already in use")]
    AddrInUse,
    #[error("address not available on this stack")]
    AddrNotAvailable,
    #[error("no such socket")]
    InvalidHandle,
    #[error("socket is not connected")]
    NotConnected,
    #[error("no route to host")]
    NoRoute,
    #[error("message too long")]
    MessageTooLong,
    #[error("no packet buffers available")]
    NoBuffers,
    #[error("invalid argument")]
    InvalidInput,
    #[error("wrong socket type for this operation")]
    WrongType,
    #[error("connection refused")]
    ConnectionRefused,
    #[error("connection reset by peer")]
    ConnectionReset,
    #[error("connection aborted")]
    ConnectionAborted,
    #[error("connection timed out")]
    TimedOut,
    #[error("broken pipe: the socket was shut down for writing")]
    BrokenPipe,
    #[error("host unreachable (ICMP)")]
    HostUnreachable,
    #[error("network unreachable (ICMP)")]
    NetUnreachable,
}

impl StackError {
    /// The errno a C caller sees.
    pub fn errno(self) -> i32 {
        match self {
            StackError::WouldBlock => 11,         // EAGAIN
            StackError::AddrInUse => 98,          // EADDRINUSE
            StackError::AddrNotAvailable => 99,   // EADDRNOTAVAIL
            StackError::InvalidHandle => 9,       // EBADF
            StackError::NotConnected => 107,      // ENOTCONN
            StackError::NoRoute => 113,           // EHOSTUNREACH
            StackError::MessageTooLong => 90,     // EMSGSIZE
            StackError::NoBuffers => 105,         // ENOBUFS
            StackError::InvalidInput => 22,       // EINVAL
            StackError::WrongType => 88,          // ENOTSOCK
            StackError::ConnectionRefused => 111, // ECONNREFUSED
            StackError::ConnectionReset => 104,   // ECONNRESET
            StackError::ConnectionAborted => 103, // ECONNABORTED
            StackError::TimedOut => 110,          // ETIMEDOUT
            StackError::BrokenPipe => 32,         // EPIPE
            StackError::HostUnreachable => 113,   // EHOSTUNREACH
            StackError::NetUnreachable => 101,    // ENETUNREACH
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("MTU {0} is out of range (68..=65535, and at least 1280 with IPv6)")]
    BadMtu(usize),
    #[error("the MAC address must be unicast")]
    BadMac,
    #[error("gateway {0} is not inside any configured prefix")]
    GatewayOffLink(IpAddr),
    #[error("packet pool: {0}")]
    Pool(#[from] PoolError),
}

/// One network interface's worth of protocol state.
pub struct Stack {
    cfg: StackConfig,
    pool: PacketPool,
    addrs: Vec<IpCidr>,
    sockets: SocketSet,
    neighbors: NeighborCache,
    reasm4: Reassembler,
    reasm6: Reassembler,
    input: VecDeque<PktBuf>,
    tx: VecDeque<PktBuf>,
    counters: Counters,
    now: Instant,
    ip_ident: u16,
    frag6_ident: u32,
    icmp_tokens: u32,
    icmp_refill: Instant,
    /// Reused buffers so the slow paths allocate once, not per packet.
    scratch: Vec<u8>,
    frame_scratch: Vec<u8>,
    icmp_scratch: Vec<u8>,
    neighbor_work: NeighborWork,
    /// Timers are looked at no more often than `TIMER_TICK` (a kernel-style tick):
    /// the busiest loop then pays for them once per tick, not once per poll.
    timers_checked: Instant,
    tcp: tcp::TcpGlobal,
    /// Segments held for receive coalescing; empty outside `poll`.
    gro: gro::Gro,
}

/// Granularity of the stack's timers (neighbour retries, reassembly expiry).
const TIMER_TICK: std::time::Duration = std::time::Duration::from_millis(1);

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("mac", &self.cfg.mac)
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl Stack {
    pub fn new(cfg: StackConfig) -> Result<Stack, ConfigError> {
        let has_v6 = cfg.addrs.iter().any(|a| a.addr.is_ipv6());
        if !(68..=65535).contains(&cfg.mtu) || (has_v6 && cfg.mtu < 1280) {
            return Err(ConfigError::BadMtu(cfg.mtu));
        }
        if !cfg.mac.is_unicast() {
            return Err(ConfigError::BadMac);
        }
        let mut addrs = cfg.addrs.clone();
        let ll = IpCidr {
            addr: IpAddr::V6(usnet_wire::link_local_from_mac(cfg.mac)),
            prefix: 64,
        };
        if !addrs.contains(&ll) {
            addrs.push(ll);
        }
        for gw in [cfg.gateway4.map(IpAddr::V4), cfg.gateway6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            let link_local = matches!(gw, IpAddr::V6(a) if is_link_local6(&a));
            if !link_local && !addrs.iter().any(|c| c.contains(gw)) {
                return Err(ConfigError::GatewayOffLink(gw));
            }
        }
        let pool = PacketPool::new(&cfg.pool)?;
        Ok(Stack {
            neighbors: NeighborCache::new(
                cfg.neighbor_ttl,
                cfg.neighbor_retry,
                cfg.neighbor_max_probes,
                cfg.neighbor_cache_size,
                cfg.neighbor_pending,
            ),
            reasm4: Reassembler::new(
                cfg.reasm_memory / 2,
                cfg.reasm_max_datagrams,
                cfg.reasm_timeout,
            ),
            reasm6: Reassembler::new(
                cfg.reasm_memory / 2,
                cfg.reasm_max_datagrams,
                cfg.reasm_timeout,
            ),
            sockets: SocketSet::new(cfg.seed),
            input: VecDeque::with_capacity(cfg.input_queue_len),
            tx: VecDeque::with_capacity(cfg.tx_queue_len),
            counters: Counters::default(),
            now: Instant::ZERO,
            ip_ident: cfg.seed as u16,
            frag6_ident: (cfg.seed >> 8) as u32,
            icmp_tokens: cfg.icmp_error_rate,
            icmp_refill: Instant::ZERO,
            scratch: Vec::new(),
            frame_scratch: Vec::new(),
            icmp_scratch: Vec::new(),
            neighbor_work: NeighborWork::default(),
            timers_checked: Instant::ZERO,
            tcp: tcp::TcpGlobal::new(cfg.seed),
            gro: gro::Gro::default(),
            addrs,
            pool,
            cfg,
        })
    }

    pub fn config(&self) -> &StackConfig {
        &self.cfg
    }
    pub fn mac(&self) -> MacAddr {
        self.cfg.mac
    }
    /// Configured addresses plus the IPv6 link-local one.
    pub fn addrs(&self) -> &[IpCidr] {
        &self.addrs
    }
    pub fn mtu(&self) -> usize {
        self.cfg.mtu
    }
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    pub fn pool(&self) -> &PacketPool {
        &self.pool
    }
    pub fn pool_mut(&mut self) -> &mut PacketPool {
        &mut self.pool
    }
    /// The neighbour table, `(ip, mac)` with `None` while resolving.
    pub fn neighbors(&self) -> Vec<(IpAddr, Option<MacAddr>)> {
        self.neighbors.entries()
    }
    /// The time the stack was last given.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Hands a received frame to the stack (ownership moves). Cheap: it only queues;
    /// protocol work happens in `poll`. A full input queue drops it (drop 1).
    #[inline]
    pub fn receive(&mut self, frame: PktBuf) {
        if self.input.len() >= self.cfg.input_queue_len {
            self.counters.drop_input_queue_full += 1;
            self.pool.free(frame);
            return;
        }
        self.input.push_back(frame);
    }

    /// Frames waiting in the input queue.
    pub fn input_len(&self) -> usize {
        self.input.len()
    }

    /// Does the protocol work due at `now`: up to `rx_budget` received frames, then
    /// timers. Returns whether anything was processed.
    pub fn poll(&mut self, now: Instant) -> bool {
        self.advance(now);
        let mut did = false;
        for _ in 0..self.cfg.rx_budget {
            let Some(buf) = self.input.pop_front() else {
                break;
            };
            self.process_frame(buf);
            did = true;
        }
        // Held segments never outlive the poll that took them.
        self.gro_flush();
        did |= self.tcp_poll_timers();
        did |= self.run_timers();
        self.counters.neigh_evicted = self.neighbors.evicted;
        did
    }

    /// Moves the clock without doing protocol work (sends use the latest time).
    pub fn advance(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// When `poll` next has timer work, if ever. Pending input means "now".
    pub fn poll_at(&self) -> Option<Instant> {
        if !self.input.is_empty() {
            return Some(self.now);
        }
        let next_check = self.timers_checked + TIMER_TICK;
        let other = [
            self.neighbors.next_deadline(),
            self.reasm4.next_deadline(),
            self.reasm6.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(next_check));
        // TCP deadlines are not rounded to the tick: a due ACK goes out now.
        [other, self.tcp_poll_at()].into_iter().flatten().min()
    }

    fn run_timers(&mut self) -> bool {
        let now = self.now;
        if now < self.timers_checked + TIMER_TICK && self.timers_checked != Instant::ZERO {
            return false;
        }
        self.timers_checked = now;
        let mut work = std::mem::take(&mut self.neighbor_work);
        self.neighbors.poll(now, &mut work);
        let did = !work.probe.is_empty() || !work.failed.is_empty();
        for ip in work.probe.drain(..) {
            self.send_solicit(ip);
        }
        for b in work.failed.drain(..) {
            self.counters.neigh_unresolved += 1;
            self.pool.free(b);
        }
        self.neighbor_work = work;
        did | self.expire_reassembly()
    }

    /// Frames ready for the device.
    pub fn tx_len(&self) -> usize {
        self.tx.len()
    }
    pub fn dequeue_tx(&mut self) -> Option<PktBuf> {
        self.tx.pop_front()
    }
    /// The pool and the transmit queue together, for a device's `tx_burst`.
    pub fn tx_parts(&mut self) -> (&mut PacketPool, &mut VecDeque<PktBuf>) {
        (&mut self.pool, &mut self.tx)
    }

    // ---------------------------------------------------------------- UDP sockets

    /// Binds a UDP socket. Port 0 picks an ephemeral port; an unspecified address
    /// accepts datagrams to any local address of either family.
    pub fn udp_bind(&mut self, local: SocketAddr) -> Result<SocketHandle, StackError> {
        let ip = local.ip();
        if !ip.is_unspecified() && !self.is_local_addr(ip) {
            return Err(StackError::AddrNotAvailable);
        }
        let port = match local.port() {
            0 => self
                .sockets
                .ephemeral_port(ip)
                .ok_or(StackError::AddrInUse)?,
            p => {
                if !self.sockets.udp_port_free(local) {
                    return Err(StackError::AddrInUse);
                }
                p
            }
        };
        let h = self.sockets.insert(Socket::Udp(UdpSocket {
            local: SocketAddr::new(ip, port),
            remote: None,
            rxq: VecDeque::new(),
            rx_queued_bytes: 0,
            recv_buffer: self.cfg.udp_recv_buffer,
            next_same_port: socket::NONE,
            stats: SocketStats::default(),
        }));
        self.sockets.link_udp(h.index, port);
        Ok(h)
    }

    /// Fixes the peer: `udp_send` goes there and only its datagrams are received.
    pub fn udp_connect(&mut self, h: SocketHandle, remote: SocketAddr) -> Result<(), StackError> {
        if remote.port() == 0 || remote.ip().is_unspecified() {
            return Err(StackError::InvalidInput);
        }
        self.route(remote.ip()).ok_or(StackError::NoRoute)?;
        self.udp_mut(h)?.remote = Some(remote);
        Ok(())
    }

    pub fn udp_local_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        Ok(self.udp(h)?.local)
    }

    pub fn udp_peer_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        self.udp(h)?.remote.ok_or(StackError::NotConnected)
    }

    /// Sets the receive buffer limit in bytes (SO_RCVBUF).
    pub fn udp_set_recv_buffer(&mut self, h: SocketHandle, bytes: usize) -> Result<(), StackError> {
        self.udp_mut(h)?.recv_buffer = bytes.max(2048);
        Ok(())
    }

    pub fn udp_send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize, StackError> {
        let remote = self.udp(h)?.remote.ok_or(StackError::NotConnected)?;
        self.udp_send_to(h, data, remote)
    }

    /// Sends one datagram. `WouldBlock` when the transmit queue is full (the device is
    /// behind); datagrams larger than the MTU are fragmented.
    pub fn udp_send_to(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        to: SocketAddr,
    ) -> Result<usize, StackError> {
        if data.len() > MAX_UDP_PAYLOAD {
            self.counters.udp_tx_too_big += 1;
            return Err(StackError::MessageTooLong);
        }
        if to.port() == 0 || to.ip().is_unspecified() {
            return Err(StackError::InvalidInput);
        }
        if self.tx.len() >= self.cfg.tx_queue_len {
            return Err(StackError::WouldBlock);
        }
        let local = self.udp(h)?.local;
        let (src, next_hop) = self.route(to.ip()).ok_or_else(|| {
            self.counters.ip_tx_no_route += 1;
            StackError::NoRoute
        })?;
        let src = if local.ip().is_unspecified() || local.ip().is_ipv4() != to.is_ipv4() {
            src
        } else {
            local.ip()
        };
        self.send_udp(src, to.ip(), next_hop, local.port(), to.port(), data)?;
        self.counters.udp_tx += 1;
        let u = self.udp_mut(h)?;
        u.stats.tx_datagrams += 1;
        u.stats.tx_bytes += data.len() as u64;
        Ok(data.len())
    }

    /// Takes the oldest datagram: copies its payload into `buf` (truncating, like
    /// `recvfrom` without MSG_TRUNC) and returns the bytes copied and the sender.
    pub fn udp_recv_from(
        &mut self,
        h: SocketHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddr), StackError> {
        let u = self.udp_mut(h)?;
        let d = u.rxq.pop_front().ok_or(StackError::WouldBlock)?;
        u.rx_queued_bytes -= d.len;
        let n = if self.pool.next(d.buf).is_none() {
            let src = self.pool.data(d.buf);
            let n = src.len().min(buf.len());
            buf[..n].copy_from_slice(&src[..n]);
            n
        } else {
            self.pool.read_chain(d.buf, 0, buf)
        };
        self.pool.free(d.buf);
        Ok((n, d.from))
    }

    /// Length of the next datagram, if one is queued.
    pub fn udp_peek_len(&self, h: SocketHandle) -> Result<Option<usize>, StackError> {
        Ok(self.udp(h)?.rxq.front().map(|d| d.len))
    }

    pub fn socket_stats(&self, h: SocketHandle) -> Result<SocketStats, StackError> {
        let s = self.sockets.get(h).ok_or(StackError::InvalidHandle)?;
        match s {
            Socket::Udp(u) => Ok(u.stats),
            Socket::Ping(p) => Ok(p.stats),
            _ => self.tcp_socket_stats(s).ok_or(StackError::InvalidHandle),
        }
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
                    self.pool.free(d.buf);
                }
            }
            Socket::Ping(_) | Socket::TcpConn(_) | Socket::TcpListen(_) => {}
        }
        Ok(())
    }

    pub fn readiness(&self, h: SocketHandle) -> Result<Readiness, StackError> {
        let writable = self.tx.len() < self.cfg.tx_queue_len;
        Ok(
            match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
                Socket::Udp(u) => Readiness {
                    readable: !u.rxq.is_empty(),
                    writable,
                    ..Readiness::default()
                },
                Socket::Ping(p) => Readiness {
                    readable: !p.rxq.is_empty(),
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

    fn udp(&self, h: SocketHandle) -> Result<&UdpSocket, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => Ok(u),
            _ => Err(StackError::WrongType),
        }
    }

    fn udp_mut(&mut self, h: SocketHandle) -> Result<&mut UdpSocket, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => Ok(u),
            _ => Err(StackError::WrongType),
        }
    }

    // ---------------------------------------------------------------- ping sockets

    /// Opens an ICMP echo socket with its own identifier (both IPv4 and IPv6).
    pub fn ping_open(&mut self) -> SocketHandle {
        let mut ident = self.sockets.next_ping_ident;
        while self.sockets.ping_by_ident(ident).is_some() {
            ident = ident.wrapping_add(1);
        }
        self.sockets.next_ping_ident = ident.wrapping_add(1);
        self.sockets.insert(Socket::Ping(PingSocket {
            ident,
            rxq: VecDeque::new(),
            stats: SocketStats::default(),
        }))
    }

    pub fn ping_ident(&self, h: SocketHandle) -> Result<u16, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::Ping(p) => Ok(p.ident),
            _ => Err(StackError::WrongType),
        }
    }

    /// Sends an echo request with this socket's identifier.
    pub fn ping_send(
        &mut self,
        h: SocketHandle,
        dst: IpAddr,
        seq: u16,
        data: &[u8],
    ) -> Result<(), StackError> {
        let ident = self.ping_ident(h)?;
        if data.len() > MAX_UDP_PAYLOAD {
            return Err(StackError::MessageTooLong);
        }
        self.send_echo(dst, ident, seq, data, true)?;
        if let Some(Socket::Ping(p)) = self.sockets.get_mut(h) {
            p.stats.tx_datagrams += 1;
            p.stats.tx_bytes += data.len() as u64;
        }
        Ok(())
    }

    pub fn ping_recv(&mut self, h: SocketHandle) -> Result<EchoReply, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Ping(p) => p.rxq.pop_front().ok_or(StackError::WouldBlock),
            _ => Err(StackError::WrongType),
        }
    }

    // ---------------------------------------------------------------- addressing

    pub(crate) fn is_local_addr(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|c| c.addr == ip)
    }

    pub(crate) fn first_v4(&self) -> Option<Ipv4Addr> {
        self.addrs.iter().find_map(|c| match c.addr {
            IpAddr::V4(a) => Some(a),
            _ => None,
        })
    }

    /// Source address for talking to `dst`: one in the same prefix, else (IPv6) a
    /// global one for global destinations, else any of the family.
    pub(crate) fn source_for(&self, dst: IpAddr) -> Option<IpAddr> {
        if let Some(c) = self.addrs.iter().find(|c| c.contains(dst)) {
            return Some(c.addr);
        }
        match dst {
            IpAddr::V4(_) => self.first_v4().map(IpAddr::V4),
            IpAddr::V6(d) => {
                let want_ll = is_link_local6(&d) || d.is_multicast();
                let v6 = || self.addrs.iter().filter(|c| c.addr.is_ipv6());
                v6().find(|c| matches!(c.addr, IpAddr::V6(a) if is_link_local6(&a) == want_ll))
                    .or_else(|| v6().next())
                    .map(|c| c.addr)
            }
        }
    }

    /// `(source, next hop)` for `dst`, or `None` when there is no route.
    pub fn route(&self, dst: IpAddr) -> Option<(IpAddr, IpAddr)> {
        let src = self.source_for(dst)?;
        let on_link = match dst {
            IpAddr::V4(a) => a.is_broadcast() || a.is_multicast(),
            IpAddr::V6(a) => a.is_multicast() || is_link_local6(&a),
        } || self.addrs.iter().any(|c| c.contains(dst));
        if on_link {
            return Some((src, dst));
        }
        let gw = match dst {
            IpAddr::V4(_) => self.cfg.gateway4.map(IpAddr::V4),
            IpAddr::V6(_) => self.cfg.gateway6.map(IpAddr::V6),
        }?;
        Some((src, gw))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // Give every buffer back so a pool shared with devices sees no leak.
        for b in self.input.drain(..).chain(self.tx.drain(..)) {
            self.pool.free(b);
        }
        for b in self.neighbors.drain_pending() {
            self.pool.free(b);
        }
        for slot in &mut self.sockets.slots {
            if let Some(Socket::Udp(u)) = slot.sock.take() {
                for d in u.rxq {
                    self.pool.free(d.buf);
                }
            }
        }
    }
}

pub(crate) fn is_link_local6(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}
