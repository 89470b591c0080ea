//! Types the receive, transmit and TCP paths share. This module is a leaf: it imports
//! nothing from the rest of the crate, so `rx`, `tx`, `tcp` and `gro` depend on it and
//! not on each other.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use usnet_pool::{PacketPool, PktBuf};
use usnet_wire::{ArpRepr, MacAddr};

use crate::frag::FragKey;

/// What the early demux found for a TCP segment: a connection or a listener, by
/// socket-table index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TcpTarget {
    None,
    Conn(u32),
    Listener(u32),
}

/// Why an ICMP "unreachable" is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreach {
    Port,
    Protocol,
}

/// What the IP header said of a received datagram, kept with it for the
/// receiver's ancillary data (`IP_PKTINFO`, `IP_RECVTTL`, `IP_RECVTOS` and their
/// IPv6 twins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRecvInfo {
    pub from: SocketAddr,
    /// The address it was sent to: one of ours, a broadcast or a multicast group.
    pub dst: IpAddr,
    /// TTL or hop limit as it arrived.
    pub hop_limit: u8,
    /// TOS byte or traffic class (ECN bits included).
    pub tos: u8,
}

/// What one send asks of its datagram's IP header beyond the socket's options
/// (the control messages of `sendmsg`): `IP_PKTINFO`'s or `IPV6_PKTINFO`'s
/// source address, `IP_TTL` or `IPV6_HOPLIMIT`, `IP_TOS` or `IPV6_TCLASS`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpSendMeta {
    /// The source address: one of the stack's (None or unspecified: the routed one).
    pub src: Option<IpAddr>,
    /// The TTL or hop limit (None: the socket's, unicast or multicast).
    pub hop_limit: Option<u8>,
    /// The TOS byte or traffic class (None: the socket's).
    pub tos: Option<u8>,
}

/// What to do with a received frame; offsets are into the frame (or reassembled data).
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// An ICMP message raw sockets take a copy of (from `hdr_off`, which is `off`
    /// but for an IPv4 frame's header, to `off + len`), before `then`.
    RawIcmp {
        ty: u8,
        info: UdpRecvInfo,
        hdr_off: usize,
        off: usize,
        len: usize,
        then: Box<Verdict>,
    },
    /// Counted already; just free it.
    Drop,
    Arp(ArpRepr),
    Udp {
        sock: u32,
        info: UdpRecvInfo,
        off: usize,
        len: usize,
    },
    UdpQueueFull {
        sock: u32,
    },
    /// A UDP datagram to a multicast group the interface joined (checksum
    /// verified): for every member socket on `port`.
    UdpMcast {
        port: u16,
        info: UdpRecvInfo,
        off: usize,
        len: usize,
    },
    /// An IGMP or MLD query (`group` unspecified: a general one) to answer within
    /// `max`.
    McastQuery {
        group: IpAddr,
        max: std::time::Duration,
    },
    /// A TCP segment (checksum verified) and what the early demux found for it.
    Tcp {
        target: TcpTarget,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
        /// The IP header's ECN field was CE (RFC 3168).
        ce: bool,
    },
    /// An ICMP error about a segment of TCP connection `conn`.
    TcpIcmp {
        conn: u32,
        seq: u32,
        err: usnet_tcp::IcmpError,
    },
    /// An ICMP error about a datagram of UDP or echo socket `sock` (`hard`: as
    /// Linux's `icmp_err_convert` judges it).
    DgramIcmp {
        /// Every socket it is for (a UDP socket; or an echo socket and raw ones).
        socks: Vec<u32>,
        hard: bool,
        report: Box<crate::icmp_error::IcmpReport>,
    },
    /// An ICMP error about a segment from listener `listener` (a SYN-ACK of a
    /// half-open connection).
    TcpIcmpListener {
        listener: u32,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        seq: u32,
        err: usnet_tcp::IcmpError,
    },
    Unreachable {
        why: Unreach,
        src: IpAddr,
        dst: IpAddr,
        l3_off: usize,
        l3_len: usize,
    },
    EchoRequest {
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        seq: u16,
        off: usize,
        len: usize,
    },
    Fragment {
        key: FragKey,
        proto: u8,
        offset: usize,
        more: bool,
        off: usize,
        len: usize,
        hdr_off: usize,
        hdr_len: usize,
        hop_limit: u8,
    },
    NeighborSolicit {
        src: Ipv6Addr,
        target: Ipv6Addr,
        mac: Option<MacAddr>,
    },
    NeighborAdvert {
        target: Ipv6Addr,
        mac: MacAddr,
    },
}

/// Where the bytes of a frame being executed live.
pub(crate) enum Src {
    Buf(PktBuf),
    /// A linearised chain or a reassembled datagram (then `invoking` is the first
    /// fragment's header + 8 bytes, for ICMP errors).
    Owned {
        data: Vec<u8>,
        invoking: Vec<u8>,
        /// The device's `gso_size` for a linearised chain (a coalesced frame); 0
        /// otherwise.
        gso_size: u16,
    },
}

impl Src {
    /// The frame's bytes.
    pub fn bytes<'a>(&'a self, pool: &'a PacketPool) -> &'a [u8] {
        match self {
            Src::Buf(b) => pool.data(b),
            Src::Owned { data, .. } => data,
        }
    }
}

/// Facts about the IP packet carrying an upper-layer payload.
#[derive(Clone, Copy)]
pub(crate) struct L3Info {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The destination is one of our unicast addresses (not broadcast/multicast).
    pub unicast: bool,
    pub hop_limit: u8,
    pub l3_off: usize,
    pub l3_len: usize,
    pub eth_src: MacAddr,
    /// The IPv4 TOS byte or IPv6 traffic class, ECN bits included (0 for a
    /// reassembled datagram).
    pub tos: u8,
}

impl L3Info {
    /// An echo request to answer; only when sent to one of our unicast addresses (like
    /// Linux's icmp_echo_ignore_broadcasts=1). The echo data follows the 8-byte header.
    pub(crate) fn echo_request(&self, ident: u16, seq: u16, len: usize, l4_off: usize) -> Verdict {
        if !self.unicast {
            return Verdict::Drop;
        }
        Verdict::EchoRequest {
            src: self.src,
            dst: self.dst,
            ident,
            seq,
            off: l4_off + 8,
            len,
        }
    }
}

/// The ICMP error as the receive path read it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IcmpMsg {
    /// ICMPv4 destination unreachable; `mtu` is the next-hop MTU of a
    /// fragmentation-needed message when the router filled it in.
    Unreach4 { code: u8, mtu: Option<u16> },
    /// ICMPv6 destination unreachable.
    Unreach6 { code: u8 },
    /// ICMPv6 packet too big.
    TooBig6 { mtu: u32 },
    /// Time exceeded (either family): 0 in transit, 1 reassembly.
    TimeExceeded { code: u8 },
}
