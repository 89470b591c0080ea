//! TCP sockets in the table: connection and listener slots, the 4-tuple and
//! listener demux maps, and the timer heap that names sockets by slot.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use usnet_pool::Lender;
use usnet_tcp::{Connection, Listener, TcpRepr, TcpStats};

use super::{Socket, SocketHandle, SocketSet};
use crate::types::TcpTarget;

/// The IP header fields a TCP socket chooses for one address family, kept per
/// socket and family as Linux keeps them (`IP_TOS` / `IPV6_TCLASS`, `IP_TTL` /
/// `IPV6_UNICAST_HOPS`, `IP_MINTTL` / `IPV6_MINHOPCOUNT`). A listener's are
/// its connections' from the SYN-ACK on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpIpOpts {
    /// The DSCP bits of the TOS / traffic class byte (the ECN bits are the
    /// engine's, as Linux masks them for TCP).
    pub tos: u8,
    /// The TTL / hop limit of its packets (None: the stack's).
    pub ttl: Option<u8>,
    /// Segments that arrive with a lower TTL / hop limit are dropped (RFC 5082,
    /// the Generalized TTL Security Mechanism); 0 drops none.
    pub min_ttl: u8,
}

/// One address family, where a socket keeps options per family (a listener's
/// [`TcpIpOpts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4 = 0,
    V6 = 1,
}

impl IpFamily {
    /// `a`'s family: IPv4-mapped IPv6 travels as IPv4.
    pub fn of(a: std::net::IpAddr) -> IpFamily {
        match a {
            std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => IpFamily::V6,
            _ => IpFamily::V4,
        }
    }
    /// Its index in per-family arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A connection's slot in the socket table.
pub(crate) struct TcpConnSock {
    pub conn: Connection,
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
    /// The connection's error was reported to the application (once, as Linux).
    pub err_reported: bool,
    /// The IP header fields it chooses for its family.
    pub ip: TcpIpOpts,
    /// What keeps a lent send ring mapped (`Stack::tcp_lend_send_buffer`), for
    /// frames that carry its bytes by reference.
    pub lender: Option<Arc<dyn Lender>>,
}

impl TcpConnSock {
    pub fn new(conn: Connection, parent: Option<SocketHandle>) -> Self {
        TcpConnSock {
            local: conn.local(),
            remote: conn.remote(),
            conn,
            in_table: true,
            timer: None,
            parent,
            orphan: false,
            blocked: false,
            fin_pending: false,
            err_reported: false,
            ip: TcpIpOpts::default(),
            lender: None,
        }
    }
}

impl fmt::Debug for TcpConnSock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpConnSock")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("state", &self.conn.state())
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
    /// The IP header fields per family ([`IpFamily::index`]).
    pub ip: [TcpIpOpts; 2],
    /// SO_REUSEPORT: one of a group of listeners on the same address and port,
    /// which share its connections ([`SocketSet::tcp_lookup`]).
    pub reuseport: bool,
}

impl TcpListenSock {
    /// The families its wildcard takes (see [`super::Families`]).
    pub fn families_taken(&self) -> super::Families {
        match (&self.v4, &self.v6) {
            (Some(_), None) => super::Families::V4,
            (None, Some(_)) => super::Families::V6,
            _ => super::Families::Both,
        }
    }
    pub fn family(&mut self, remote: SocketAddr) -> Option<&mut Listener<SocketHandle>> {
        if remote.is_ipv4() {
            self.v4.as_mut()
        } else {
            self.v6.as_mut()
        }
    }
    pub fn families(&mut self) -> impl Iterator<Item = &mut Listener<SocketHandle>> {
        [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten()
    }
    pub fn poll_at(&self) -> Option<usnet_tcp::Instant> {
        [
            self.v4.as_ref().and_then(|l| l.poll_at()),
            self.v6.as_ref().and_then(|l| l.poll_at()),
        ]
        .into_iter()
        .flatten()
        .min()
    }
    pub fn accept_queue_len(&self) -> usize {
        self.v4.as_ref().map_or(0, |l| l.accept_queue_len())
            + self.v6.as_ref().map_or(0, |l| l.accept_queue_len())
    }
    pub fn syn_queue_len(&self) -> usize {
        self.v4.as_ref().map_or(0, |l| l.syn_queue_len())
            + self.v6.as_ref().map_or(0, |l| l.syn_queue_len())
    }
    pub fn merge_stats(&self, into: &mut TcpStats) {
        for l in self.v4.iter().chain(self.v6.iter()) {
            into.merge(l.stats());
        }
    }
}

/// The TCP demux maps and timers of a socket table.
#[derive(Debug, Default)]
pub(crate) struct TcpTable {
    /// `(local, remote)` → connection slot.
    pub conns: HashMap<(SocketAddr, SocketAddr), u32>,
    /// Listeners by local port (usually one per port; several with distinct
    /// addresses).
    pub listen: HashMap<u16, Vec<u32>>,
    /// `(deadline ns, slot, generation)`; stale entries are skipped when popped.
    pub timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// Connections whose output was refused (full transmit queue or empty pool),
    /// served owner by owner as room comes.
    pub blocked: crate::tcp::fair::TxWaiters,
    /// The waiting connection whose turn it is (its output is not held back).
    pub serving: Option<u32>,
    /// Reused list of sockets whose deadline passed.
    pub due: Vec<u32>,
    pub next_ephemeral: u16,
    /// Counters of reaped connections and closed listeners.
    pub totals: TcpStats,
    /// Segments a listener produced, sent once the received frame is released.
    pub out: Vec<(SocketAddr, SocketAddr, TcpRepr)>,
    /// TCP sockets alive (for the timer heap's compaction rule).
    pub live: usize,
    /// Client Fast Open cookie cache (RFC 7413 §4.1.1): per peer address, the MSS
    /// and cookie its last Fast Open SYN-ACK carried.
    pub fo_cache: HashMap<std::net::IpAddr, FoCacheEntry>,
    /// Ports held by `bind` before a socket listens or connects (Linux's bind
    /// hash), by port.
    pub bound: HashMap<u16, Vec<TcpBinding>>,
    pub next_binding: u64,
    /// Some socket was given a minimum TTL (`TcpIpOpts::min_ttl`): only then does
    /// the receive path look at each segment's.
    pub min_ttl_used: bool,
}

/// A port a socket holds by `bind` alone ([`crate::Stack::tcp_bind`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpBinding {
    pub id: u64,
    pub ip: std::net::IpAddr,
    pub fam: crate::Families,
    /// SO_REUSEADDR or SO_REUSEPORT: another such binding may share the port.
    pub reuse: bool,
    pub owner: crate::Owner,
}

/// A Fast Open cookie cache entry.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FoCacheEntry {
    /// The peer's MSS option (0: none seen).
    pub mss: u16,
    /// Its cookie, if it gave one.
    pub cookie: Option<usnet_wire::FastOpen>,
    /// Without a cookie, which encoding the next request uses (Linux's `try_exp`):
    /// 0 the standard option (kind 34), 1 the experimental one (kind 254) after
    /// the standard one went unanswered, 2 the standard one again after both did.
    pub try_exp: u8,
}

impl TcpTable {
    pub fn new(seed: u64) -> Self {
        TcpTable {
            next_ephemeral: super::ephemeral_start(seed >> 24),
            ..Default::default()
        }
    }
}

impl SocketSet {
    pub fn conn_at_mut(&mut self, index: u32) -> Option<&mut TcpConnSock> {
        match self.at_mut(index)? {
            Socket::TcpConn(s) => Some(s),
            _ => None,
        }
    }

    pub fn conn_at(&self, index: u32) -> Option<&TcpConnSock> {
        match self.at(index)? {
            Socket::TcpConn(s) => Some(s),
            _ => None,
        }
    }

    pub fn listen_at_mut(&mut self, index: u32) -> Option<&mut TcpListenSock> {
        match self.at_mut(index)? {
            Socket::TcpListen(l) => Some(l),
            _ => None,
        }
    }

    /// TCP early demux: the connection for this 4-tuple, else the best listener on
    /// the port (a specific address before a wildcard that takes the SYN's family).
    #[inline]
    /// Whether a segment from `remote` with TTL / hop limit `ttl` is below the
    /// minimum of the socket it is for (`TcpIpOpts::min_ttl`; Linux checks it
    /// after the lookup, for listeners too, and drops the segment silently).
    pub fn tcp_below_min_ttl(&self, target: TcpTarget, remote: SocketAddr, ttl: u8) -> bool {
        if !self.tcp.min_ttl_used {
            return false;
        }
        let min = match target {
            TcpTarget::Conn(i) => self.conn_at(i).map_or(0, |s| s.ip.min_ttl),
            TcpTarget::Listener(i) => match self.at(i) {
                Some(Socket::TcpListen(l)) => l.ip[IpFamily::of(remote.ip()).index()].min_ttl,
                _ => 0,
            },
            TcpTarget::None => 0,
        };
        ttl < min
    }

    pub fn tcp_lookup(&self, local: SocketAddr, remote: SocketAddr) -> TcpTarget {
        if let Some(&i) = self.tcp.conns.get(&(local, remote)) {
            return TcpTarget::Conn(i);
        }
        let Some(list) = self.tcp.listen.get(&local.port()) else {
            return TcpTarget::None;
        };
        // A listener on the segment's address, else a wildcard that takes its
        // family (an IPv4 SYN finds a `[::]` listener without IPV6_V6ONLY; see
        // `Families`).
        let class = |l: &TcpListenSock| {
            let a = l.local.ip();
            let takes = if local.is_ipv4() {
                l.v4.is_some()
            } else {
                l.v6.is_some()
            };
            if a == local.ip() {
                2
            } else if a.is_unspecified() && takes {
                1
            } else {
                0
            }
        };
        let listeners = || {
            list.iter().filter_map(|&i| match self.at(i) {
                Some(Socket::TcpListen(l)) => Some((i, l)),
                _ => None,
            })
        };
        let (mut best, mut first, mut members) = (0, None, 0usize);
        for (i, l) in listeners() {
            let c = class(l);
            if c > best {
                (best, first, members) = (c, Some(i), 1);
            } else if c == best && c > 0 {
                members += 1;
            }
        }
        let Some(first) = first else {
            return TcpTarget::None;
        };
        if members == 1 {
            return TcpTarget::Listener(first);
        }
        // A SO_REUSEPORT group (only its members share an address and family):
        // the flow picks one, the same for every segment of a handshake while
        // the group stays as it is (Linux's `reuseport_select_sock`).
        let k = reuseport_pick(local, remote, members);
        listeners()
            .filter(|(_, l)| class(l) == best)
            .nth(k)
            .map_or(TcpTarget::Listener(first), |(i, _)| TcpTarget::Listener(i))
    }

    /// Queues socket `index` in the timer heap under `deadline`. A later deadline
    /// keeps the earlier entry: when it pops, the socket is polled (nothing to do)
    /// and queued under its real deadline.
    pub fn tcp_schedule(&mut self, index: u32, deadline: Option<usnet_tcp::Instant>) {
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return;
        };
        let gen = slot.gen;
        let timer = match slot.sock.as_mut() {
            Some(Socket::TcpConn(s)) => &mut s.timer,
            Some(Socket::TcpListen(l)) => &mut l.timer,
            _ => return,
        };
        match deadline {
            None => *timer = None,
            Some(d) => {
                let d = d.as_nanos();
                if timer.is_none_or(|t| d < t) {
                    *timer = Some(d);
                    self.tcp.timers.push(Reverse((d, index, gen)));
                }
            }
        }
    }

    /// Moves the sockets whose deadline passed by `now` (ns) into `due`.
    pub fn tcp_expired(&mut self, now: u64, due: &mut Vec<u32>) {
        while let Some(&Reverse((t, idx, gen))) = self.tcp.timers.peek() {
            if t > now {
                break;
            }
            self.tcp.timers.pop();
            let Some(slot) = self.slots.get_mut(idx as usize) else {
                continue;
            };
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
    }

    /// Drops stale heap entries (deadlines that moved) when they pile up.
    pub fn tcp_compact_timers(&mut self) {
        if self.tcp.timers.len() <= 4 * self.tcp.live + 1024 {
            return;
        }
        let heap = std::mem::take(&mut self.tcp.timers);
        let slots = &self.slots;
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
}

/// Which of `members` sockets of a SO_REUSEPORT group takes the flow `remote`
/// → `local`: a hash of the four-tuple, so the SYN and the ACK that completes
/// its handshake (or returns its cookie) find the same listener, and a UDP
/// sender's datagrams the same socket.
pub(crate) fn reuseport_pick(local: SocketAddr, remote: SocketAddr, members: usize) -> usize {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(&match remote.ip() {
        std::net::IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(a) => a.octets(),
    });
    h.write_u16(remote.port());
    h.write_u16(local.port());
    (h.finish() % members as u64) as usize
}
