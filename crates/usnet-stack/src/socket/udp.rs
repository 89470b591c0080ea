//! Datagram sockets in the table: UDP's, ICMP echo ("ping") sockets, which are
//! the same socket with the echo identifier for a port (as Linux's ping sockets
//! take `inet_sport` for it), and raw ICMP sockets, whose port is the protocol
//! number (as Linux's raw sockets take `inet_num`). Their bounded receive queues,
//! and the port maps (one per protocol) that demultiplex a datagram to its socket
//! in O(1), before any checksum work.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use usnet_pool::PktBuf;

use super::{Families, Socket, SocketSet, SocketStats, EPHEMERAL_SPAN};

/// End of a port chain.
pub(crate) const NONE: u32 = u32::MAX;

/// A received datagram: its payload alone in a pool buffer (or chain).
#[derive(Debug)]
pub(crate) struct Datagram {
    pub buf: PktBuf,
    pub len: usize,
    pub info: crate::types::UdpRecvInfo,
}

/// Why a datagram socket refuses one more datagram ([`SocketSet::udp_no_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// Its receive buffer is full.
    Queue,
    /// Its owner holds its share of the pool.
    Owner,
}

/// What a datagram socket carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DgramProto {
    /// UDP datagrams.
    #[default]
    Udp,
    /// ICMP or ICMPv6 echo: the application sends echo requests (header and data,
    /// the stack sets the identifier, its port, and the checksum) and receives the
    /// echo replies to its identifier, as with Linux's
    /// `socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)`.
    Icmp,
    /// Raw ICMP (`socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)`) or raw ICMPv6
    /// (`AF_INET6`, `IPPROTO_ICMPV6`), one family each: the socket receives a
    /// copy of every ICMP message of its family to its address, which the stack
    /// still handles itself (an IPv4 one with its IP header, an IPv6 one
    /// without, as Linux gives them), less the types its filter blocks; it sends
    /// whole ICMP messages (an IPv4 one with the checksum the application wrote,
    /// an IPv6 one with the checksum the stack computes). Its port is the
    /// protocol number: [`RAW_PORT_V4`] or [`RAW_PORT_V6`].
    Raw,
}

/// The port of a raw ICMP socket: `IPPROTO_ICMP`, what Linux's `getsockname`
/// gives for one.
pub const RAW_PORT_V4: u16 = 1;
/// The port of a raw ICMPv6 socket: `IPPROTO_ICMPV6`.
pub const RAW_PORT_V6: u16 = 58;

impl DgramProto {
    fn index(self) -> usize {
        self as usize
    }

    /// How many protocols there are (the socket table's port maps).
    pub(crate) const COUNT: usize = 3;
}

/// The ICMP types a raw socket does not receive: bit `t % 32` of word `t / 32`
/// set blocks type `t` (Linux's `ICMP6_FILTER`, and `ICMP_FILTER` in word 0 for
/// IPv4, where types from 32 up always pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IcmpFilter(pub [u32; 8]);

impl IcmpFilter {
    pub fn blocks(&self, v4: bool, ty: u8) -> bool {
        if v4 && ty >= 32 {
            return false;
        }
        self.0[usize::from(ty / 32)] & (1 << (ty % 32)) != 0
    }
}

#[derive(Debug)]
pub(crate) struct UdpSocket {
    pub proto: DgramProto,
    pub local: SocketAddr,
    /// The families a wildcard `local` takes ([`Families`]).
    pub families: Families,
    pub remote: Option<SocketAddr>,
    pub rxq: VecDeque<Datagram>,
    pub rx_queued_bytes: usize,
    /// Pool buffers `rxq` holds (charged to the socket's owner: [`SocketSet::rx_held`]).
    pub rx_bufs: u32,
    pub recv_buffer: usize,
    /// Next socket bound to the same port (a chain through the port map).
    pub next_same_port: u32,
    pub stats: SocketStats,
    /// Bound with SO_REUSEADDR/SO_REUSEPORT: shares its address with other such
    /// sockets (as Linux's UDP, where every one of them gets the multicast).
    pub reuse: bool,
    /// SO_REUSEPORT: its unicast datagrams are shared with the other such
    /// sockets on its address ([`SocketSet::udp_lookup`]).
    pub reuseport: bool,
    /// Multicast options and the groups it joined.
    pub mc: crate::mcast::SockMcast,
    /// What the IP headers of the datagrams it sends carry unless a send says
    /// otherwise.
    pub hdr: UdpHeaderOpts,
    /// ICMP errors about what it sent: the pending one, the error queue.
    pub errors: crate::icmp_error::DgramErrors,
    /// A raw socket's filter ([`DgramProto::Raw`]).
    pub icmp_filter: IcmpFilter,
    /// `local`'s address was set by a connect (the socket was bound to the
    /// wildcard): a disconnect gives the wildcard back.
    pub addr_from_connect: bool,
}

impl UdpSocket {
    pub fn new(
        proto: DgramProto,
        local: SocketAddr,
        families: Families,
        reuse: bool,
        recv_buffer: usize,
    ) -> UdpSocket {
        UdpSocket {
            proto,
            local,
            families,
            remote: None,
            rxq: VecDeque::new(),
            rx_queued_bytes: 0,
            rx_bufs: 0,
            recv_buffer,
            next_same_port: NONE,
            stats: SocketStats::default(),
            reuse,
            reuseport: false,
            mc: Default::default(),
            hdr: Default::default(),
            errors: Default::default(),
            icmp_filter: IcmpFilter::default(),
            addr_from_connect: false,
        }
    }
}

/// A UDP socket's IP header options, per family (`[IPv4, IPv6]`; a dual-stack
/// socket sending to an IPv4-mapped peer uses the IPv4 ones, as Linux's).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UdpHeaderOpts {
    /// IP_TTL, IPV6_UNICAST_HOPS: the unicast hop limit (None: the stack's).
    pub ttl: [Option<u8>; 2],
    /// IP_TOS, IPV6_TCLASS: the whole TOS byte or traffic class, ECN bits included.
    pub tos: [u8; 2],
    /// IPV6_MTU: the size IPv6 datagrams are fragmented at when it is below the
    /// link's MTU (0: the link's).
    pub frag_size_v6: usize,
}

/// The demux state of one datagram protocol in a socket table.
pub(crate) struct UdpTable {
    /// Port → first socket index bound to it.
    ports: Vec<u32>,
    next_ephemeral: u16,
}

impl UdpTable {
    pub fn new(seed: u64) -> Self {
        UdpTable {
            ports: vec![NONE; 65536],
            next_ephemeral: super::ephemeral_start(seed),
        }
    }

    /// The raw sockets' table: its ports are protocol numbers.
    pub fn raw() -> Self {
        UdpTable {
            ports: vec![NONE; 256],
            next_ephemeral: 0,
        }
    }
}

impl SocketSet {
    fn ports(&self, proto: DgramProto) -> &[u32] {
        &self.dgram[proto.index()].ports
    }

    fn ports_mut(&mut self, proto: DgramProto) -> &mut [u32] {
        &mut self.dgram[proto.index()].ports
    }

    /// Why datagram socket `index` cannot queue `len` more bytes now, if it
    /// cannot: its receive buffer is full (an empty queue always takes one
    /// datagram), or its owner holds its share of the pool.
    pub fn udp_no_room(&self, index: u32, len: usize) -> Option<NoRoom> {
        let u = self.udp_at(index)?;
        if !u.rxq.is_empty() && u.rx_queued_bytes + len > u.recv_buffer {
            Some(NoRoom::Queue)
        } else if self.owner_rx_full(index) {
            Some(NoRoom::Owner)
        } else {
            None
        }
    }

    pub fn udp_at(&self, index: u32) -> Option<&UdpSocket> {
        match self.at(index)? {
            Socket::Udp(u) => Some(u),
            _ => None,
        }
    }

    pub fn udp_at_mut(&mut self, index: u32) -> Option<&mut UdpSocket> {
        match self.at_mut(index)? {
            Socket::Udp(u) => Some(u),
            _ => None,
        }
    }

    pub(super) fn unlink_udp_port(&mut self, u: &UdpSocket, index: u32) {
        let (port, next) = (u.local.port(), u.next_same_port);
        let mut cur = self.ports(u.proto)[port as usize];
        if cur == index {
            self.ports_mut(u.proto)[port as usize] = next;
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
    /// overlapping address and family, unless both were bound with `reuse`
    /// (SO_REUSEADDR or SO_REUSEPORT, as Linux's UDP).
    pub fn udp_port_free(
        &self,
        proto: DgramProto,
        addr: SocketAddr,
        fam: Families,
        reuse: bool,
    ) -> bool {
        let mut cur = self.ports(proto)[addr.port() as usize];
        while cur != NONE {
            let Some(u) = self.udp_at(cur) else {
                return true;
            };
            if !(reuse && u.reuse) && Families::overlap(u.local.ip(), u.families, addr.ip(), fam) {
                return false;
            }
            cur = u.next_same_port;
        }
        true
    }

    /// Puts socket `index` at the head of its port's chain.
    pub fn link_udp(&mut self, index: u32) {
        let Some(u) = self.udp_at(index) else {
            return;
        };
        let (proto, port) = (u.proto, u.local.port() as usize);
        let head = self.ports(proto)[port];
        if let Some(u) = self.udp_at_mut(index) {
            u.next_same_port = head;
        }
        self.ports_mut(proto)[port] = index;
    }

    /// An ephemeral port free for `ip`, from `shard`'s own class of ports.
    pub fn udp_ephemeral_port(
        &mut self,
        proto: DgramProto,
        ip: IpAddr,
        fam: Families,
        shard: crate::shard::ShardRole,
    ) -> Option<u16> {
        for _ in 0..EPHEMERAL_SPAN {
            let p = super::next_ephemeral(&mut self.dgram[proto.index()].next_ephemeral);
            let free = self.udp_port_free(proto, SocketAddr::new(ip, p), fam, false);
            if shard.owns_ephemeral(p) && free {
                return Some(p);
            }
        }
        None
    }

    /// Whether any UDP socket is bound to `port`.
    pub fn udp_port_used(&self, port: u16) -> bool {
        self.ports(DgramProto::Udp)[port as usize] != NONE
    }

    /// Every socket a datagram to multicast `group`:`port` from `from` goes to, as
    /// Linux's `__udp4_lib_mcast_deliver` chooses them: bound to the port on the
    /// wildcard (of a family it takes) or on the group itself, connected to `from`
    /// or not connected, and either a member of the group itself or with
    /// IP_MULTICAST_ALL on (the default: the interface's membership, checked
    /// before, is enough).
    pub fn udp_mcast_members(
        &self,
        group: IpAddr,
        port: u16,
        from: SocketAddr,
        out: &mut Vec<u32>,
    ) {
        let mut cur = self.ports(DgramProto::Udp)[port as usize];
        while cur != NONE {
            let Some(u) = self.udp_at(cur) else {
                return;
            };
            let local = u.local.ip();
            let addr_ok =
                local == group || (local.is_unspecified() && u.families.takes(local, group));
            let peer_ok = u.remote.is_none_or(|r| r == from);
            if addr_ok && peer_ok && (u.mc.all || u.mc.groups.contains(&group)) {
                out.push(cur);
            }
            cur = u.next_same_port;
        }
    }

    /// The raw sockets of `v4`'s family, with their indices.
    fn raw_chain(&self, v4: bool) -> impl Iterator<Item = (u32, &UdpSocket)> + '_ {
        let port = if v4 { RAW_PORT_V4 } else { RAW_PORT_V6 };
        let mut cur = self.ports(DgramProto::Raw)[usize::from(port)];
        std::iter::from_fn(move || {
            if cur == NONE {
                return None;
            }
            let u = self.udp_at(cur)?;
            let at = cur;
            cur = u.next_same_port;
            Some((at, u))
        })
    }

    /// Whether a raw socket bound to `u.local` takes what is sent to `dst`, and
    /// one connected takes what comes from `from`.
    fn raw_takes(u: &UdpSocket, dst: IpAddr, from: IpAddr) -> bool {
        let local = u.local.ip();
        let addr_ok = local == dst || (local.is_unspecified() && u.families.takes(local, dst));
        addr_ok && u.remote.is_none_or(|r| r.ip() == from)
    }

    /// Every raw socket an ICMP message of type `ty` from `from` to `dst` is copied
    /// to, as Linux's `raw_v4_match` and `raw_v6_match` choose them: bound to
    /// `dst` or to the wildcard of its family, connected to `from` or not
    /// connected, and not filtering the type out.
    pub fn raw_members(&self, dst: IpAddr, from: IpAddr, ty: u8, out: &mut Vec<u32>) {
        out.extend(
            self.raw_chain(dst.is_ipv4())
                .filter(|(_, u)| Self::raw_takes(u, dst, from))
                .filter(|(_, u)| !u.icmp_filter.blocks(dst.is_ipv4(), ty))
                .map(|(i, _)| i),
        );
    }

    /// Every raw socket an ICMP error about a packet from `local` to `remote`
    /// is for (Linux's `raw_icmp_error`): the same match, the packet's source
    /// for the socket's address and its destination for the peer.
    pub fn raw_error_members(&self, local: IpAddr, remote: IpAddr, out: &mut Vec<u32>) {
        out.extend(
            self.raw_chain(local.is_ipv4())
                .filter(|(_, u)| Self::raw_takes(u, local, remote))
                .map(|(i, _)| i),
        );
    }

    /// Whether any raw socket of `v4`'s family is open.
    #[inline]
    pub fn raw_open(&self, v4: bool) -> bool {
        self.raw_chain(v4).next().is_some()
    }

    /// The best socket of `proto` for a datagram: connected match first, then a
    /// specific local address, then a wildcard one. Address families match
    /// loosely: an unspecified local address of either family accepts both (like
    /// Linux's dual-stack `[::]`). An echo reply's port is its identifier, and
    /// its source port 0.
    #[inline]
    pub fn udp_lookup(
        &self,
        proto: DgramProto,
        dst: IpAddr,
        dst_port: u16,
        src: SocketAddr,
    ) -> Option<u32> {
        let head = self.ports(proto)[dst_port as usize];
        let score = |u: &UdpSocket| {
            let local = u.local.ip();
            let addr_score = if local == dst {
                2
            } else if local.is_unspecified() && u.families.takes(local, dst) {
                1
            } else {
                0
            };
            match u.remote {
                _ if addr_score == 0 => 0,
                Some(r) if r == src => addr_score + 4,
                Some(_) => 0,
                None => addr_score,
            }
        };
        let (mut cur, mut best, mut best_score, mut group) = (head, None, 0, 0usize);
        while cur != NONE {
            let u = self.udp_at(cur)?;
            let sc = score(u);
            if sc > best_score {
                (best_score, best, group) = (sc, Some(cur), usize::from(u.reuseport));
            } else if sc == best_score && sc > 0 && u.reuseport {
                group += 1;
            }
            cur = u.next_same_port;
        }
        let first = best?;
        if group < 2 || !self.udp_at(first)?.reuseport {
            return best;
        }
        // A SO_REUSEPORT group: the sender's address picks a member, the same
        // for each of its datagrams while the group stays (Linux's
        // `reuseport_select_sock`: a DNS server's socket per thread).
        let k = super::tcp::reuseport_pick(SocketAddr::new(dst, dst_port), src, group);
        let mut cur = head;
        let mut seen = 0;
        while cur != NONE {
            let u = self.udp_at(cur)?;
            if u.reuseport && score(u) == best_score {
                if seen == k {
                    return Some(cur);
                }
                seen += 1;
            }
            cur = u.next_same_port;
        }
        best
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::socket::Owner;

    pub(crate) fn udp(local: &str, remote: Option<&str>) -> Socket {
        let local = local.parse().unwrap();
        let mut u = UdpSocket::new(DgramProto::Udp, local, Families::Both, false, 4096);
        u.remote = remote.map(|r| r.parse().unwrap());
        Socket::Udp(u)
    }

    fn bind(set: &mut SocketSet, local: &str, remote: Option<&str>) -> u32 {
        let h = set.insert(udp(local, remote), Owner::LOCAL);
        set.link_udp(h.index);
        h.index
    }

    /// SO_REUSEPORT members share their address's unicast by sender, each
    /// sender always reaching the same one; a connected socket still takes its
    /// own peer's; without the option the last bound takes all.
    #[test]
    fn a_reuseport_group_shares_unicast_by_sender() {
        let mut set = SocketSet::new(1);
        let member = |set: &mut SocketSet, reuseport: bool| {
            let i = bind(set, "0.0.0.0:53", None);
            let Some(Socket::Udp(u)) = set.at_mut(i) else {
                unreachable!()
            };
            (u.reuse, u.reuseport) = (true, reuseport);
            i
        };
        let (a, b) = (member(&mut set, true), member(&mut set, true));
        let dst: IpAddr = "10.0.0.1".parse().unwrap();
        let mut took = [0; 2];
        for port in 1000..1064u16 {
            let src = SocketAddr::new("10.0.0.9".parse().unwrap(), port);
            let got = set.udp_lookup(DgramProto::Udp, dst, 53, src).unwrap();
            assert!(got == a || got == b);
            took[usize::from(got == b)] += 1;
            assert_eq!(set.udp_lookup(DgramProto::Udp, dst, 53, src), Some(got));
        }
        assert!(took[0] > 0 && took[1] > 0, "{took:?}");
        let conn = bind(&mut set, "0.0.0.0:53", Some("10.0.0.9:1000"));
        let from = "10.0.0.9:1000".parse().unwrap();
        assert_eq!(set.udp_lookup(DgramProto::Udp, dst, 53, from), Some(conn));
        let mut plain = SocketSet::new(1);
        let first = bind(&mut plain, "0.0.0.0:53", None);
        let last = bind(&mut plain, "0.0.0.0:53", None);
        for port in 1000..1016u16 {
            let src = SocketAddr::new("10.0.0.9".parse().unwrap(), port);
            let got = plain.udp_lookup(DgramProto::Udp, dst, 53, src);
            assert!(got == Some(last) && got != Some(first));
        }
    }

    #[test]
    fn lookup_prefers_connected_then_specific_then_wildcard() {
        let mut set = SocketSet::new(1);
        let wild = bind(&mut set, "0.0.0.0:53", None);
        let spec = bind(&mut set, "10.0.0.1:53", None);
        let conn = bind(&mut set, "10.0.0.1:53", Some("10.0.0.9:1000"));
        let dst: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        let peer = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, dst, 53, peer("10.0.0.9:1000")),
            Some(conn)
        );
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, dst, 53, peer("10.0.0.8:1000")),
            Some(spec)
        );
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, other, 53, peer("10.0.0.8:1")),
            Some(wild)
        );
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, dst, 54, peer("10.0.0.8:1")),
            None
        );
    }

    #[test]
    fn a_wildcard_takes_the_families_it_was_bound_for() {
        let mut set = SocketSet::new(1);
        let v6only = bind(&mut set, "[::]:53", None);
        if let Some(u) = set.udp_at_mut(v6only) {
            u.families = Families::V6;
        }
        let from4: SocketAddr = "10.0.0.9:1000".parse().unwrap();
        let from6: SocketAddr = "[fd00::9]:1000".parse().unwrap();
        let to4: IpAddr = "10.0.0.1".parse().unwrap();
        let to6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, to4, 53, from4),
            None,
            "IPV6_V6ONLY"
        );
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, to6, 53, from6),
            Some(v6only)
        );
        // 0.0.0.0:53 for IPv4 beside [::]:53 for IPv6, as Linux allows.
        assert!(set.udp_port_free(
            DgramProto::Udp,
            "0.0.0.0:53".parse().unwrap(),
            Families::V4,
            false
        ));
        assert!(!set.udp_port_free(
            DgramProto::Udp,
            "0.0.0.0:53".parse().unwrap(),
            Families::Both,
            false
        ));
        let v4 = bind(&mut set, "0.0.0.0:53", None);
        if let Some(u) = set.udp_at_mut(v4) {
            u.families = Families::V4;
        }
        assert_eq!(set.udp_lookup(DgramProto::Udp, to4, 53, from4), Some(v4));
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, to6, 53, from6),
            Some(v6only)
        );
        // A dual [::] takes IPv4 too.
        let dual = bind(&mut set, "[::]:54", None);
        assert_eq!(set.udp_lookup(DgramProto::Udp, to4, 54, from4), Some(dual));
    }

    #[test]
    fn removal_unlinks_from_the_port_chain_and_frees_the_port() {
        let mut set = SocketSet::new(1);
        let a = bind(&mut set, "10.0.0.1:99", None);
        let b = bind(&mut set, "10.0.0.2:99", None);
        let c = bind(&mut set, "10.0.0.3:99", None);
        assert!(!set.udp_port_free(
            DgramProto::Udp,
            "10.0.0.2:99".parse().unwrap(),
            Families::Both,
            false
        ));
        assert!(!set.udp_port_free(
            DgramProto::Udp,
            "0.0.0.0:99".parse().unwrap(),
            Families::Both,
            false
        ));
        // Remove from the middle of the chain, then the head.
        assert!(set.remove(set.handle_at(b)).is_some());
        assert!(set.udp_port_free(
            DgramProto::Udp,
            "10.0.0.2:99".parse().unwrap(),
            Families::Both,
            false
        ));
        let to = |s: &str| s.parse::<IpAddr>().unwrap();
        let from: SocketAddr = "1.2.3.4:5".parse().unwrap();
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, to("10.0.0.1"), 99, from),
            Some(a)
        );
        assert_eq!(
            set.udp_lookup(DgramProto::Udp, to("10.0.0.3"), 99, from),
            Some(c)
        );
        assert!(set.remove(set.handle_at(c)).is_some());
        assert!(set.remove(set.handle_at(a)).is_some());
        assert!(set.udp_port_free(
            DgramProto::Udp,
            "0.0.0.0:99".parse().unwrap(),
            Families::Both,
            false
        ));
    }

    #[test]
    fn ephemeral_ports_skip_bound_ones_and_stay_in_range() {
        let mut set = SocketSet::new(0);
        // Seed 0 starts at the first ephemeral port.
        bind(&mut set, "0.0.0.0:49152", None);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(
            set.udp_ephemeral_port(DgramProto::Udp, ip, Families::Both, Default::default()),
            Some(49153)
        );
        let mut set = SocketSet::new(u16::MAX as u64 - 49152);
        assert_eq!(
            set.udp_ephemeral_port(DgramProto::Udp, ip, Families::Both, Default::default()),
            Some(u16::MAX)
        );
        assert_eq!(
            set.udp_ephemeral_port(DgramProto::Udp, ip, Families::Both, Default::default()),
            Some(49152),
            "wraps"
        );
    }
}
