//! Socket table: UDP and ping (ICMP echo) sockets, their bounded receive queues and the
//! port map that demultiplexes a datagram to its socket in O(1) before any checksum work.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use usnet_pool::PktBuf;

pub(crate) const NONE: u32 = u32::MAX;

/// Names a socket of one stack. Stale handles (of a closed socket whose slot was reused)
/// are detected by the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl SocketHandle {
    /// A stable number for display and for the C ABI.
    pub fn raw(self) -> u64 {
        ((self.gen as u64) << 32) | self.index as u64
    }
    pub fn from_raw(raw: u64) -> Self {
        SocketHandle {
            index: raw as u32,
            gen: (raw >> 32) as u32,
        }
    }
}

/// Per-socket counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketStats {
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    /// Dropped because the receive queue was full (drop 2 of source document 4).
    pub rx_queue_full: u64,
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
}

/// A received datagram: its payload alone in a pool buffer (or chain).
#[derive(Debug)]
pub(crate) struct Datagram {
    pub buf: PktBuf,
    pub len: usize,
    pub from: SocketAddr,
}

#[derive(Debug)]
pub(crate) struct UdpSocket {
    pub local: SocketAddr,
    pub remote: Option<SocketAddr>,
    pub rxq: VecDeque<Datagram>,
    pub rx_queued_bytes: usize,
    pub recv_buffer: usize,
    /// Next socket bound to the same port (a chain through the port map).
    pub next_same_port: u32,
    pub stats: SocketStats,
}

/// An echo reply as a ping socket hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoReply {
    pub from: IpAddr,
    pub ident: u16,
    pub seq: u16,
    /// TTL (IPv4) or hop limit (IPv6) of the reply.
    pub hop_limit: u8,
    /// Echo data length.
    pub len: usize,
    /// The first bytes of the echo data (where ping tools put their send timestamp).
    pub head: [u8; 16],
    /// Stack time when the reply was processed (receive timestamp).
    pub at: crate::Instant,
}

#[derive(Debug)]
pub(crate) struct PingSocket {
    pub ident: u16,
    pub rxq: VecDeque<EchoReply>,
    pub stats: SocketStats,
}

pub(crate) const PING_QUEUE: usize = 256;

#[derive(Debug)]
pub(crate) enum Socket {
    Udp(UdpSocket),
    Ping(PingSocket),
    TcpConn(Box<crate::tcp::TcpConnSock>),
    TcpListen(Box<crate::tcp::TcpListenSock>),
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub gen: u32,
    pub sock: Option<Socket>,
    /// Already in the ready list (edge-triggered readiness).
    pub ready_queued: bool,
}

/// Readiness of one socket, as `poll(2)` would report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    pub readable: bool,
    pub writable: bool,
    /// TCP: the connection is over (POLLHUP/POLLERR): closed, reset or timed out.
    pub closed: bool,
    /// TCP: the handshake completed (a non-blocking connect finished).
    pub connected: bool,
}

pub(crate) struct SocketSet {
    pub slots: Vec<Slot>,
    free: Vec<u32>,
    /// UDP port → first socket index bound to it.
    pub udp_ports: Vec<u32>,
    pub next_ephemeral: u16,
    pub next_ping_ident: u16,
    /// Sockets that became readable since the last `take_ready`.
    pub ready: VecDeque<SocketHandle>,
    /// TCP demux: `(local, remote)` → connection socket index.
    pub tcp_conns: HashMap<(SocketAddr, SocketAddr), u32>,
    /// TCP listeners by local port (usually one per port; several with distinct
    /// addresses).
    pub tcp_listen: HashMap<u16, Vec<u32>>,
}

pub(crate) const EPHEMERAL_FIRST: u16 = 49152;

impl SocketSet {
    pub fn new(seed: u64) -> Self {
        let span = (u16::MAX - EPHEMERAL_FIRST) as u64 + 1;
        SocketSet {
            slots: Vec::new(),
            free: Vec::new(),
            udp_ports: vec![NONE; 65536],
            next_ephemeral: EPHEMERAL_FIRST + (seed % span) as u16,
            next_ping_ident: (seed >> 16) as u16,
            ready: VecDeque::new(),
            tcp_conns: HashMap::new(),
            tcp_listen: HashMap::new(),
        }
    }

    pub fn insert(&mut self, sock: Socket) -> SocketHandle {
        match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                slot.gen = slot.gen.wrapping_add(1);
                slot.sock = Some(sock);
                slot.ready_queued = false;
                SocketHandle {
                    index: i,
                    gen: slot.gen,
                }
            }
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    sock: Some(sock),
                    ready_queued: false,
                });
                SocketHandle {
                    index: self.slots.len() as u32 - 1,
                    gen: 0,
                }
            }
        }
    }

    pub fn get(&self, h: SocketHandle) -> Option<&Socket> {
        self.slots
            .get(h.index as usize)
            .filter(|s| s.gen == h.gen)
            .and_then(|s| s.sock.as_ref())
    }

    pub fn get_mut(&mut self, h: SocketHandle) -> Option<&mut Socket> {
        self.slots
            .get_mut(h.index as usize)
            .filter(|s| s.gen == h.gen)
            .and_then(|s| s.sock.as_mut())
    }

    pub fn udp_at(&self, index: u32) -> Option<&UdpSocket> {
        match self.slots.get(index as usize)?.sock.as_ref()? {
            Socket::Udp(u) => Some(u),
            _ => None,
        }
    }

    pub fn udp_at_mut(&mut self, index: u32) -> Option<&mut UdpSocket> {
        match self.slots.get_mut(index as usize)?.sock.as_mut()? {
            Socket::Udp(u) => Some(u),
            _ => None,
        }
    }

    /// Removes a socket, returning it so the caller can free its buffers.
    pub fn remove(&mut self, h: SocketHandle) -> Option<Socket> {
        let slot = self.slots.get_mut(h.index as usize)?;
        if slot.gen != h.gen {
            return None;
        }
        let sock = slot.sock.take()?;
        if let Socket::Udp(u) = &sock {
            self.unlink_port(h.index, u.local.port(), u.next_same_port);
        }
        self.free.push(h.index);
        Some(sock)
    }

    fn unlink_port(&mut self, index: u32, port: u16, next: u32) {
        let mut cur = self.udp_ports[port as usize];
        if cur == index {
            self.udp_ports[port as usize] = next;
            return;
        }
        while cur != NONE {
            let Some(u) = self.udp_at_mut(cur) else {
                return;
            };
            if u.next_same_port == index {
                u.next_same_port = next;
                return;
            }
            cur = u.next_same_port;
        }
    }

    /// Whether `addr` may be bound: no other socket holds the same port with an
    /// overlapping address (no SO_REUSEADDR semantics).
    pub fn udp_port_free(&self, addr: SocketAddr) -> bool {
        let mut cur = self.udp_ports[addr.port() as usize];
        while cur != NONE {
            let Some(u) = self.udp_at(cur) else {
                return true;
            };
            let a = u.local.ip();
            if a.is_unspecified() || addr.ip().is_unspecified() || a == addr.ip() {
                return false;
            }
            cur = u.next_same_port;
        }
        true
    }

    pub fn link_udp(&mut self, index: u32, port: u16) {
        let head = self.udp_ports[port as usize];
        if let Some(u) = self.udp_at_mut(index) {
            u.next_same_port = head;
        }
        self.udp_ports[port as usize] = index;
    }

    pub fn ephemeral_port(&mut self, ip: IpAddr) -> Option<u16> {
        let span = (u16::MAX - EPHEMERAL_FIRST) as u32 + 1;
        for _ in 0..span {
            let p = self.next_ephemeral;
            self.next_ephemeral = if p == u16::MAX {
                EPHEMERAL_FIRST
            } else {
                p + 1
            };
            if self.udp_port_free(SocketAddr::new(ip, p)) {
                return Some(p);
            }
        }
        None
    }

    /// The best UDP socket for a datagram: connected match first, then a specific local
    /// address, then a wildcard one. Address families match loosely: an unspecified
    /// local address of either family accepts both (like Linux's dual-stack `[::]`).
    #[inline]
    pub fn udp_lookup(&self, dst: IpAddr, dst_port: u16, src: SocketAddr) -> Option<u32> {
        let mut cur = self.udp_ports[dst_port as usize];
        let mut best = None;
        let mut best_score = 0;
        while cur != NONE {
            let u = self.udp_at(cur)?;
            let local = u.local.ip();
            let addr_score = if local == dst {
                2
            } else if local.is_unspecified() {
                1
            } else {
                0
            };
            if addr_score > 0 {
                let score = match u.remote {
                    Some(r) if r == src => addr_score + 4,
                    Some(_) => 0,
                    None => addr_score,
                };
                if score > best_score {
                    best_score = score;
                    best = Some(cur);
                }
            }
            cur = u.next_same_port;
        }
        best
    }

    /// TCP early demux: the connection for this 4-tuple, else the best listener on
    /// the port (a specific address before a wildcard).
    #[inline]
    pub fn tcp_lookup(&self, local: SocketAddr, remote: SocketAddr) -> crate::tcp::TcpTarget {
        if let Some(&i) = self.tcp_conns.get(&(local, remote)) {
            return crate::tcp::TcpTarget::Conn(i);
        }
        let Some(list) = self.tcp_listen.get(&local.port()) else {
            return crate::tcp::TcpTarget::None;
        };
        let mut best = None;
        for &i in list {
            if let Some(Socket::TcpListen(l)) = self.slots[i as usize].sock.as_ref() {
                let a = l.local.ip();
                if a == local.ip() {
                    return crate::tcp::TcpTarget::Listener(i);
                }
                if a.is_unspecified() {
                    best = Some(i);
                }
            }
        }
        best.map_or(crate::tcp::TcpTarget::None, crate::tcp::TcpTarget::Listener)
    }

    pub fn ping_by_ident(&self, ident: u16) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| matches!(&s.sock, Some(Socket::Ping(p)) if p.ident == ident))
            .map(|i| i as u32)
    }

    /// Marks a socket readable in the ready list (once until taken).
    pub fn mark_ready(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        if !slot.ready_queued {
            slot.ready_queued = true;
            let h = SocketHandle {
                index,
                gen: slot.gen,
            };
            self.ready.push_back(h);
        }
    }
}
