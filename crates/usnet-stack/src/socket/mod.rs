//! The socket table, apart from the core: slots named by generation-checked handles,
//! each with an [`Owner`], the edge-triggered ready list, and per-protocol demux
//! tables (the datagram port maps, UDP's and ping identifiers, in [`udp`], TCP 4-tuple and
//! listener maps plus the TCP timer heap in [`tcp`]). It never sends a frame: the
//! stack pairs it with the core ([`crate::core::Core`]) to do protocol work.

pub(crate) mod tcp;
pub(crate) mod udp;

use std::collections::{HashMap, VecDeque};

pub(crate) use tcp::{FoCacheEntry, TcpConnSock, TcpListenSock, TcpTable};
pub use tcp::{IpFamily, TcpIpOpts};
pub(crate) use udp::{Datagram, UdpSocket, UdpTable};
pub use udp::{DgramProto, IcmpFilter, RAW_PORT_V4, RAW_PORT_V6};

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

/// Which address families a socket bound to a wildcard address takes (a socket
/// bound to a specific address takes that address's family only).
///
/// Linux's dual-stack sockets (`net.ipv6.bindv6only = 0`): an `AF_INET` socket on
/// `0.0.0.0` takes IPv4 ([`Families::V4`]); an `AF_INET6` socket on `::` takes IPv6
/// and, unless `IPV6_V6ONLY` is set, IPv4 too, whose peers its application sees as
/// `::ffff:a.b.c.d` ([`Families::Both`]; with `IPV6_V6ONLY`, [`Families::V6`]). The
/// stack keeps the flag on the socket (a listener builds one engine listener per
/// family it takes; a UDP socket is matched only for a family it takes), so an IPv4
/// SYN or datagram that finds no IPv4 socket on its port falls back to a `::` one
/// that takes IPv4, and `0.0.0.0:P` and a `[::]:P` with `IPV6_V6ONLY` can be bound
/// side by side, as on Linux. The stack sees plain addresses only: the BSD-socket
/// layer (`usnet-posix`) maps `::ffff:a.b.c.d` to and from `a.b.c.d`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Families {
    /// Both families (the stack's own callers' default for any wildcard).
    #[default]
    Both,
    V4,
    V6,
}

impl Families {
    /// Whether a socket bound to `local` with these families takes traffic of
    /// `ip`'s family.
    pub fn takes(self, local: std::net::IpAddr, ip: std::net::IpAddr) -> bool {
        if !local.is_unspecified() {
            return local.is_ipv4() == ip.is_ipv4();
        }
        match self {
            Families::Both => true,
            Families::V4 => ip.is_ipv4(),
            Families::V6 => ip.is_ipv6(),
        }
    }
    /// (IPv4, IPv6) taken by a socket bound to `local`.
    pub fn of(self, local: std::net::IpAddr) -> (bool, bool) {
        let v4: std::net::IpAddr = std::net::Ipv4Addr::UNSPECIFIED.into();
        let v6: std::net::IpAddr = std::net::Ipv6Addr::UNSPECIFIED.into();
        (self.takes(local, v4), self.takes(local, v6))
    }
    /// Whether two sockets on one port, bound to `a` and `b`, would take the same
    /// traffic: an address in common and a family in common.
    pub fn overlap(a: std::net::IpAddr, fa: Families, b: std::net::IpAddr, fb: Families) -> bool {
        let addr = a.is_unspecified() || b.is_unspecified() || a == b;
        let (a4, a6) = fa.of(a);
        let (b4, b6) = fb.of(b);
        addr && ((a4 && b4) || (a6 && b6))
    }
}

/// Who a socket belongs to: the application in this process ([`Owner::LOCAL`]) or a
/// client of a stack server (its session number). Accepted connections inherit their
/// listener's owner, so per-owner limits and clean-up cover them too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner(pub u32);

impl Owner {
    /// The process that embeds the stack.
    pub const LOCAL: Owner = Owner(0);
}

/// Per-socket counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketStats {
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    /// Dropped because the receive queue was full (drop 2 of the priority-aware
    /// receive design: protocol work was already spent on it).
    pub rx_queue_full: u64,
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
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

/// A datagram socket stays inline (its demux and receive path read it for every
/// datagram); TCP's larger state is boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Socket {
    Udp(UdpSocket),
    TcpConn(Box<TcpConnSock>),
    TcpListen(Box<TcpListenSock>),
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub gen: u32,
    pub sock: Option<Socket>,
    /// Already in the ready list (edge-triggered readiness).
    pub ready_queued: bool,
    pub owner: Owner,
    /// Priority mark and consumer (priority-aware receive, `prio.rs`).
    pub mark: crate::prio::SockMark,
    /// In the priority set S.
    pub prio_member: bool,
    /// Creation order: priority ties go to the older socket.
    pub seq: u64,
    /// A zero-copy port watches this socket: readiness also goes to `zc_ready`.
    pub zc_watch: bool,
    /// Already in `zc_ready`.
    pub zc_queued: bool,
}

impl Slot {
    /// Pool buffers its receive queue holds.
    fn rx_bufs(&self) -> u32 {
        match &self.sock {
            Some(Socket::Udp(u)) => u.rx_bufs,
            _ => 0,
        }
    }
}

pub(crate) struct SocketSet {
    pub slots: Vec<Slot>,
    free: Vec<u32>,
    /// Sockets whose readiness changed since the last `take_ready`.
    pub ready: VecDeque<SocketHandle>,
    /// The same for sockets that zero-copy ports watch, since the last
    /// `zc_take_ready` (a second list, so a port and the application's own
    /// readiness consumer, such as the runtime's poll loop, do not take each
    /// other's events).
    pub zc_ready: VecDeque<SocketHandle>,
    /// The datagram port maps, by [`DgramProto`].
    pub dgram: [UdpTable; DgramProto::COUNT],
    pub tcp: TcpTable,
    /// A member of the priority set was removed: S must be recomputed.
    pub prio_dirty: bool,
    next_seq: u64,
    /// Pool buffers each owner's receive queues hold (UDP datagrams waiting to be
    /// read), and the most one owner may hold (`None`: no limit). One client of a
    /// stack server that stops reading must not take the pool from the others.
    rx_held: HashMap<Owner, u32>,
    pub rx_owner_limit: Option<u32>,
}

/// First port of the ephemeral range (IANA's, RFC 6335); the shards' steering names it.
pub(crate) use usnet_wire::steer::EPHEMERAL_FIRST;

/// Starts an ephemeral-port cursor somewhere in the range, from a seed.
pub(crate) fn ephemeral_start(seed: u64) -> u16 {
    let span = (u16::MAX - EPHEMERAL_FIRST) as u64 + 1;
    EPHEMERAL_FIRST + (seed % span) as u16
}

/// Advances an ephemeral-port cursor, wrapping within the range.
pub(crate) fn next_ephemeral(cursor: &mut u16) -> u16 {
    let p = *cursor;
    *cursor = if p == u16::MAX {
        EPHEMERAL_FIRST
    } else {
        p + 1
    };
    p
}

/// How many ports the ephemeral range holds.
pub(crate) const EPHEMERAL_SPAN: u32 = (u16::MAX - EPHEMERAL_FIRST) as u32 + 1;

impl SocketSet {
    pub fn new(seed: u64) -> Self {
        SocketSet {
            slots: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
            zc_ready: VecDeque::new(),
            dgram: [
                UdpTable::new(seed),
                UdpTable::new(seed >> 16),
                UdpTable::raw(),
            ],
            tcp: TcpTable::new(seed),
            prio_dirty: false,
            next_seq: 0,
            rx_held: HashMap::new(),
            rx_owner_limit: None,
        }
    }

    pub fn insert(&mut self, sock: Socket, owner: Owner) -> SocketHandle {
        let seq = self.next_seq;
        self.next_seq += 1;
        match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                slot.gen = slot.gen.wrapping_add(1);
                slot.sock = Some(sock);
                slot.ready_queued = false;
                slot.owner = owner;
                slot.mark = Default::default();
                slot.prio_member = false;
                slot.seq = seq;
                slot.zc_watch = false;
                slot.zc_queued = false;
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
                    owner,
                    mark: Default::default(),
                    prio_member: false,
                    seq,
                    zc_watch: false,
                    zc_queued: false,
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

    /// The socket in slot `index`, whatever its generation (for demux results,
    /// which name slots).
    pub fn at_mut(&mut self, index: u32) -> Option<&mut Socket> {
        self.slots.get_mut(index as usize)?.sock.as_mut()
    }

    pub fn at(&self, index: u32) -> Option<&Socket> {
        self.slots.get(index as usize)?.sock.as_ref()
    }

    /// Every live socket, with its current handle and its slot (owner, marks).
    pub fn live(&self) -> impl Iterator<Item = (SocketHandle, &Socket, &Slot)> {
        self.slots.iter().enumerate().filter_map(|(i, slot)| {
            let h = SocketHandle {
                index: i as u32,
                gen: slot.gen,
            };
            Some((h, slot.sock.as_ref()?, slot))
        })
    }

    /// The current handle of slot `index`.
    pub fn handle_at(&self, index: u32) -> SocketHandle {
        SocketHandle {
            index,
            gen: self.slots[index as usize].gen,
        }
    }

    pub fn owner(&self, h: SocketHandle) -> Option<Owner> {
        self.slots
            .get(h.index as usize)
            .filter(|s| s.gen == h.gen && s.sock.is_some())
            .map(|s| s.owner)
    }

    pub fn set_owner(&mut self, h: SocketHandle, owner: Owner) -> bool {
        match self.slots.get_mut(h.index as usize) {
            Some(s) if s.gen == h.gen && s.sock.is_some() => {
                let (old, held) = (s.owner, s.rx_bufs());
                s.owner = owner;
                // What its queue holds goes with it.
                self.uncharge(old, held);
                *self.rx_held.entry(owner).or_default() += held;
                true
            }
            _ => false,
        }
    }

    /// Pool buffers the receive queues of `owner`'s sockets hold.
    pub fn rx_held(&self, owner: Owner) -> u32 {
        self.rx_held.get(&owner).copied().unwrap_or(0)
    }

    /// Whether the owner of socket `index` holds its share of the pool already.
    pub fn owner_rx_full(&self, index: u32) -> bool {
        self.rx_owner_limit
            .is_some_and(|cap| self.rx_held(self.slots[index as usize].owner) >= cap)
    }

    /// Charges (`add`) or releases pool buffers queued on UDP socket `index` to
    /// its owner.
    pub fn charge_rx(&mut self, index: u32, bufs: u32, add: bool) {
        let slot = &mut self.slots[index as usize];
        let owner = slot.owner;
        if let Some(Socket::Udp(u)) = slot.sock.as_mut() {
            if add {
                u.rx_bufs += bufs;
                *self.rx_held.entry(owner).or_default() += bufs;
            } else {
                u.rx_bufs -= bufs;
                self.uncharge(owner, bufs);
            }
        }
    }

    fn uncharge(&mut self, owner: Owner, bufs: u32) {
        if bufs == 0 {
            return;
        }
        if let Some(n) = self.rx_held.get_mut(&owner) {
            *n -= bufs;
            if *n == 0 {
                self.rx_held.remove(&owner);
            }
        }
    }

    /// Removes a socket, returning it so the caller can free its buffers.
    pub fn remove(&mut self, h: SocketHandle) -> Option<Socket> {
        let slot = self.slots.get_mut(h.index as usize)?;
        if slot.gen != h.gen {
            return None;
        }
        let sock = slot.sock.take()?;
        if slot.prio_member {
            slot.prio_member = false;
            self.prio_dirty = true;
        }
        let owner = slot.owner;
        if let Socket::Udp(u) = &sock {
            self.unlink_udp_port(u, h.index);
            // The caller frees what its queue held.
            self.uncharge(owner, u.rx_bufs);
        }
        self.free.push(h.index);
        Some(sock)
    }

    /// Marks a socket in the ready list (once until taken).
    pub fn mark_ready(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let h = SocketHandle {
            index,
            gen: slot.gen,
        };
        if !slot.ready_queued {
            slot.ready_queued = true;
            self.ready.push_back(h);
        }
        if slot.zc_watch && !slot.zc_queued {
            slot.zc_queued = true;
            self.zc_ready.push_back(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ping(ident: u16) -> Socket {
        udp::tests::udp(&format!("0.0.0.0:{ident}"), None)
    }

    #[test]
    fn stale_handles_are_refused_after_reuse() {
        let mut set = SocketSet::new(3);
        let a = set.insert(ping(1), Owner(5));
        assert_eq!(set.owner(a), Some(Owner(5)));
        assert!(set.remove(a).is_some());
        assert!(set.remove(a).is_none(), "removed twice");
        let b = set.insert(ping(2), Owner::LOCAL);
        assert_eq!(b.index, a.index, "the slot is reused");
        assert!(set.get(a).is_none(), "the old handle is stale");
        assert_eq!(set.owner(a), None);
        assert!(!set.set_owner(a, Owner(9)));
        assert_eq!(set.owner(b), Some(Owner::LOCAL));
        assert!(set.set_owner(b, Owner(9)));
        assert_eq!(set.owner(b), Some(Owner(9)));
        assert_eq!(SocketHandle::from_raw(b.raw()), b);
    }

    #[test]
    fn ready_list_holds_a_socket_once_until_taken() {
        let mut set = SocketSet::new(3);
        let a = set.insert(ping(1), Owner::LOCAL);
        set.mark_ready(a.index);
        set.mark_ready(a.index);
        assert_eq!(set.ready.len(), 1);
        assert_eq!(set.ready.pop_front(), Some(a));
    }
}
