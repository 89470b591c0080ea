//! Receive path. `classify` reads a frame without changing anything but counters (so
//! it can borrow the frame's bytes from the pool while the rest of the stack is read),
//! looks the UDP socket up as soon as the ports are known (early demux, before any
//! checksum work), and returns a [`Verdict`]; `execute` then does the work.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use usnet_pool::{PacketPool, PktBuf};
use usnet_wire::{
    self as wire, ethertype, ArpOp, ArpRepr, Icmpv4Repr, Icmpv6Repr, IgmpRepr, MacAddr, MldRepr,
    WireError,
};

use crate::core::Core;
use crate::counters::Counters;
use crate::frag::{FragKey, FragResult};
use crate::ping::ECHO_HEADER;
use crate::socket::udp::NoRoom;
use crate::socket::{Datagram, DgramProto, SocketSet};
use crate::types::{IcmpMsg, L3Info, Src, TcpTarget, UdpRecvInfo, Unreach, Verdict};
use crate::{IpCidr, Stack};

/// The read-only parts of the stack that classification needs: the core's
/// addresses and the socket table (for early demux).
pub(crate) struct View<'a> {
    pub mac: MacAddr,
    pub addrs: &'a [IpCidr],
    pub sockets: &'a SocketSet,
    pub mcast: &'a crate::mcast::Mcast,
    pub csum_valid: bool,
}

impl View<'_> {
    fn is_local(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|c| c.addr == ip)
    }

    pub fn classify(&self, c: &mut Counters, frame: &[u8]) -> Verdict {
        let eth = match wire::parse_ethernet(frame) {
            Ok(e) => e,
            Err(_) => {
                c.eth_rx_truncated += 1;
                return Verdict::Drop;
            }
        };
        if eth.vlan.is_some() {
            c.eth_rx_vlan_tagged += 1;
        }
        if eth.dst != self.mac && !eth.dst.is_multicast() {
            c.eth_rx_not_for_us += 1;
            return Verdict::Drop;
        }
        let base = eth.header_len;
        match eth.ethertype {
            ethertype::IPV4 => self.classify_ipv4(c, eth.payload, base, eth.src),
            ethertype::IPV6 => self.classify_ipv6(c, eth.payload, base, eth.src),
            ethertype::ARP => self.classify_arp(c, eth.payload),
            _ => {
                c.eth_rx_unknown_type += 1;
                Verdict::Drop
            }
        }
    }

    /// A TCP segment for one of this stack's connections, in a frame that arrived
    /// in several buffers, classified from its first buffer (`head`; `frame_len` is
    /// the whole chain's). `None` for anything else: another protocol or socket, a
    /// VLAN tag, IPv6 extension headers, headers running past the first buffer, or
    /// a checksum the device did not vouch for (verifying it would read every byte
    /// anyway). The caller then linearises the frame and classifies it in full, so
    /// every unusual frame still takes the one checked path.
    fn classify_chained_tcp(
        &self,
        c: &mut Counters,
        head: &[u8],
        frame_len: usize,
    ) -> Option<Verdict> {
        if !self.csum_valid {
            return None;
        }
        let eth = wire::parse_ethernet(head).ok()?;
        if eth.vlan.is_some() || eth.dst != self.mac {
            return None;
        }
        let base = eth.header_len;
        let (src, dst, ip_hdr, l3_len, ecn, ttl) = match eth.ethertype {
            ethertype::IPV4 => {
                let ip = wire::parse_ipv4_prefix(eth.payload, true).ok()?;
                if ip.is_fragment()
                    || ip.protocol != wire::IPPROTO_TCP
                    || ip.src.is_multicast()
                    || ip.src.is_broadcast()
                {
                    return None;
                }
                let (src, dst) = (IpAddr::V4(ip.src), IpAddr::V4(ip.dst));
                (
                    src,
                    dst,
                    ip.header_len,
                    ip.total_len,
                    ip.dscp_ecn & 3,
                    ip.ttl,
                )
            }
            ethertype::IPV6 => {
                let ip = wire::parse_ipv6_prefix(eth.payload).ok()?;
                if ip.next_header != wire::IPPROTO_TCP || ip.src.is_multicast() {
                    return None;
                }
                let (src, dst) = (IpAddr::V6(ip.src), IpAddr::V6(ip.dst));
                let l3_len = wire::IPV6_HEADER_LEN + ip.payload_len;
                (
                    src,
                    dst,
                    wire::IPV6_HEADER_LEN,
                    l3_len,
                    ip.traffic_class & 3,
                    ip.hop_limit,
                )
            }
            _ => return None,
        };
        if base + l3_len > frame_len || !self.is_local(dst) {
            return None;
        }
        let l4_off = base + ip_hdr;
        let l4 = head.get(l4_off..)?;
        let tcp_hdr = usize::from(*l4.get(12)? >> 4) * 4;
        if tcp_hdr < wire::TCP_HEADER_LEN || tcp_hdr > l4.len() || tcp_hdr > l3_len - ip_hdr {
            return None;
        }
        let remote = SocketAddr::new(src, u16::from_be_bytes([l4[0], l4[1]]));
        let local = SocketAddr::new(dst, u16::from_be_bytes([l4[2], l4[3]]));
        let target = self.sockets.tcp_lookup(local, remote);
        if !matches!(target, TcpTarget::Conn(_)) {
            return None;
        }
        if src.is_ipv4() {
            c.ip4_rx += 1;
        } else {
            c.ip6_rx += 1;
        }
        c.tcp_rx += 1;
        if self.sockets.tcp_below_min_ttl(target, remote, ttl) {
            c.tcp_rx_min_ttl += 1;
            return Some(Verdict::Drop);
        }
        Some(Verdict::Tcp {
            target,
            local,
            remote,
            off: l4_off,
            len: l3_len - ip_hdr,
            ce: ecn == 3,
        })
    }

    fn classify_arp(&self, c: &mut Counters, payload: &[u8]) -> Verdict {
        c.arp_rx += 1;
        match ArpRepr::parse(payload) {
            Ok(arp) => {
                if arp.op == ArpOp::Request && !self.is_local(IpAddr::V4(arp.target_ip)) {
                    c.arp_rx_not_for_us += 1;
                }
                Verdict::Arp(arp)
            }
            Err(_) => {
                c.arp_rx_malformed += 1;
                Verdict::Drop
            }
        }
    }

    fn classify_ipv4(
        &self,
        c: &mut Counters,
        payload: &[u8],
        base: usize,
        eth_src: MacAddr,
    ) -> Verdict {
        c.ip4_rx += 1;
        let ip = match wire::parse_ipv4(payload, true) {
            Ok(ip) => ip,
            Err(WireError::BadChecksum) => {
                c.ip4_rx_bad_checksum += 1;
                return Verdict::Drop;
            }
            Err(WireError::BadVersion) | Err(WireError::Malformed) => {
                c.ip4_rx_bad_header += 1;
                return Verdict::Drop;
            }
            Err(_) => {
                c.ip4_rx_truncated += 1;
                return Verdict::Drop;
            }
        };
        if ip.src.is_multicast() || ip.src.is_broadcast() {
            c.ip4_rx_bad_header += 1;
            return Verdict::Drop;
        }
        let dst = IpAddr::V4(ip.dst);
        let unicast = self.is_local(dst);
        if ip.dst.is_multicast() && !self.mcast.is_member(dst) {
            c.mcast_rx_not_member += 1;
            return Verdict::Drop;
        }
        let accept = unicast
            || ip.dst.is_broadcast()
            || ip.dst.is_multicast()
            || self.addrs.iter().any(|a| a.broadcast_v4() == Some(ip.dst));
        if !accept {
            c.ip4_rx_not_for_us += 1;
            return Verdict::Drop;
        }
        let l4_off = base + ip.header_len;
        if ip.more_frags || ip.frag_offset != 0 {
            c.ip4_rx_fragments += 1;
            return Verdict::Fragment {
                key: FragKey::V4 {
                    src: ip.src,
                    dst: ip.dst,
                    proto: ip.protocol,
                    ident: ip.ident,
                },
                proto: ip.protocol,
                offset: ip.frag_offset as usize,
                more: ip.more_frags,
                off: l4_off,
                len: ip.payload.len(),
                hdr_off: base,
                hdr_len: ip.header_len,
                hop_limit: ip.ttl,
            };
        }
        let l3 = L3Info {
            src: IpAddr::V4(ip.src),
            dst,
            unicast,
            hop_limit: ip.ttl,
            l3_off: base,
            l3_len: ip.total_len,
            eth_src,
            tos: ip.dscp_ecn,
        };
        self.classify_l4(c, &l3, ip.protocol, ip.payload, l4_off)
    }

    fn classify_ipv6(
        &self,
        c: &mut Counters,
        payload: &[u8],
        base: usize,
        eth_src: MacAddr,
    ) -> Verdict {
        c.ip6_rx += 1;
        let ip = match wire::parse_ipv6(payload) {
            Ok(ip) => ip,
            Err(WireError::BadVersion) | Err(WireError::Unsupported) => {
                c.ip6_rx_bad_header += 1;
                return Verdict::Drop;
            }
            Err(_) => {
                c.ip6_rx_truncated += 1;
                return Verdict::Drop;
            }
        };
        if ip.src.is_multicast() {
            c.ip6_rx_bad_header += 1;
            return Verdict::Drop;
        }
        let dst = IpAddr::V6(ip.dst);
        let unicast = self.is_local(dst);
        // Multicast: all-nodes, our solicited-node groups, and the groups joined.
        let multicast_ok = ip.dst.is_multicast()
            && (self.mcast.is_member(dst)
                || self.addrs.iter().any(|a| match a.addr {
                    IpAddr::V6(a) => wire::solicited_node(&a) == ip.dst,
                    IpAddr::V4(_) => false,
                }));
        if ip.dst.is_multicast() && !multicast_ok {
            c.mcast_rx_not_member += 1;
            return Verdict::Drop;
        }
        let accept = unicast || multicast_ok;
        if !accept {
            c.ip6_rx_not_for_us += 1;
            return Verdict::Drop;
        }
        let up = match wire::skip_ext_headers(ip.next_header, ip.payload) {
            Ok(up) => up,
            Err(_) => {
                c.ip6_rx_bad_header += 1;
                return Verdict::Drop;
            }
        };
        let mut up = up;
        let mut l4_off = base + wire::IPV6_HEADER_LEN + up.offset;
        if let Some(f) = up.frag {
            // An atomic fragment (offset 0, no more) is a whole datagram (RFC 6946);
            // the walk stopped at its fragment header, so continue it.
            if f.offset == 0 && !f.more {
                match wire::skip_ext_headers(up.protocol, up.payload) {
                    Ok(inner) => {
                        l4_off += inner.offset;
                        up = inner;
                    }
                    Err(_) => {
                        c.ip6_rx_bad_header += 1;
                        return Verdict::Drop;
                    }
                }
            } else {
                c.ip6_rx_fragments += 1;
                return Verdict::Fragment {
                    key: FragKey::V6 {
                        src: ip.src,
                        dst: ip.dst,
                        ident: f.ident,
                    },
                    proto: up.protocol,
                    offset: f.offset as usize,
                    more: f.more,
                    off: l4_off,
                    len: up.payload.len(),
                    hdr_off: base,
                    hdr_len: wire::IPV6_HEADER_LEN + up.offset,
                    hop_limit: ip.hop_limit,
                };
            }
        }
        let l3 = L3Info {
            src: IpAddr::V6(ip.src),
            dst,
            unicast,
            hop_limit: ip.hop_limit,
            l3_off: base,
            l3_len: wire::IPV6_HEADER_LEN + ip.payload_len,
            eth_src,
            tos: ip.traffic_class,
        };
        self.classify_l4(c, &l3, up.protocol, up.payload, l4_off)
    }

    /// Upper layer, from a frame or from a reassembled datagram (`l4_off` is where
    /// `l4` starts in those bytes).
    pub fn classify_l4(
        &self,
        c: &mut Counters,
        l3: &L3Info,
        proto: u8,
        l4: &[u8],
        l4_off: usize,
    ) -> Verdict {
        match (proto, l3.src) {
            (wire::IPPROTO_UDP, _) => self.classify_udp(c, l3, l4, l4_off),
            (wire::IPPROTO_TCP, _) => self.classify_tcp(c, l3, l4, l4_off),
            (wire::IPPROTO_ICMP, IpAddr::V4(_)) => self.classify_icmp4(c, l3, l4, l4_off),
            (wire::IPPROTO_ICMPV6, IpAddr::V6(_)) => self.classify_icmp6(c, l3, l4, l4_off),
            (wire::IPPROTO_IGMP, IpAddr::V4(_)) => classify_igmp(c, l3, l4, self.csum_valid),
            (59, IpAddr::V6(_)) => Verdict::Drop, // No Next Header: nothing to do
            _ => {
                if l3.src.is_ipv4() {
                    c.ip4_rx_unknown_proto += 1;
                } else {
                    c.ip6_rx_unknown_proto += 1;
                }
                if l3.unicast {
                    Verdict::Unreachable {
                        why: Unreach::Protocol,
                        src: l3.src,
                        dst: l3.dst,
                        l3_off: l3.l3_off,
                        l3_len: l3.l3_len,
                    }
                } else {
                    Verdict::Drop
                }
            }
        }
    }

    #[inline]
    fn classify_udp(&self, c: &mut Counters, l3: &L3Info, l4: &[u8], l4_off: usize) -> Verdict {
        c.udp_rx += 1;
        let udp = match wire::parse_udp(l4) {
            Ok(u) => u,
            Err(_) => {
                c.udp_rx_truncated += 1;
                return Verdict::Drop;
            }
        };
        let udp_len = wire::UDP_HEADER_LEN + udp.payload.len();
        let from = SocketAddr::new(l3.src, udp.src_port);
        let info = UdpRecvInfo {
            from,
            dst: l3.dst,
            hop_limit: l3.hop_limit,
            tos: l3.tos,
        };
        if l3.dst.is_multicast() {
            // To every member socket on the port (`execute` finds them).
            if !self.sockets.udp_port_used(udp.dst_port) {
                c.udp_rx_no_socket += 1;
                return Verdict::Drop;
            }
            if !self.csum_valid && !wire::verify_udp_checksum(l3.src, l3.dst, &l4[..udp_len]) {
                c.udp_rx_bad_checksum += 1;
                return Verdict::Drop;
            }
            return Verdict::UdpMcast {
                port: udp.dst_port,
                info,
                off: l4_off + wire::UDP_HEADER_LEN,
                len: udp.payload.len(),
            };
        }
        // Early demux: find the socket (and drop for a full queue) before spending the
        // checksum work on a datagram that would be thrown away.
        let sock = self
            .sockets
            .udp_lookup(DgramProto::Udp, l3.dst, udp.dst_port, from);
        if let Some(i) = sock {
            if let Some(why) = self.sockets.udp_no_room(i, udp.payload.len()) {
                match why {
                    NoRoom::Queue => c.udp_rx_queue_full += 1,
                    NoRoom::Owner => c.udp_rx_owner_full += 1,
                }
                return Verdict::UdpQueueFull { sock: i };
            }
        }
        if !self.csum_valid && !wire::verify_udp_checksum(l3.src, l3.dst, &l4[..udp_len]) {
            c.udp_rx_bad_checksum += 1;
            return Verdict::Drop;
        }
        match sock {
            Some(i) => Verdict::Udp {
                sock: i,
                info,
                off: l4_off + wire::UDP_HEADER_LEN,
                len: udp.payload.len(),
            },
            None => {
                c.udp_rx_no_socket += 1;
                if l3.unicast {
                    Verdict::Unreachable {
                        why: Unreach::Port,
                        src: l3.src,
                        dst: l3.dst,
                        l3_off: l3.l3_off,
                        l3_len: l3.l3_len,
                    }
                } else {
                    Verdict::Drop
                }
            }
        }
    }

    #[inline]
    fn classify_tcp(&self, c: &mut Counters, l3: &L3Info, l4: &[u8], l4_off: usize) -> Verdict {
        c.tcp_rx += 1;
        if l4.len() < wire::TCP_HEADER_LEN {
            c.tcp_rx_truncated += 1;
            return Verdict::Drop;
        }
        if !l3.unicast {
            // TCP is unicast only (RFC 9293 §3.10.7.1 also forbids an RST reply).
            c.tcp_rx_not_unicast += 1;
            return Verdict::Drop;
        }
        let remote = SocketAddr::new(l3.src, u16::from_be_bytes([l4[0], l4[1]]));
        let local = SocketAddr::new(l3.dst, u16::from_be_bytes([l4[2], l4[3]]));
        // Early demux from the ports and addresses, before the checksum work.
        let target = self.sockets.tcp_lookup(local, remote);
        if self.sockets.tcp_below_min_ttl(target, remote, l3.hop_limit) {
            c.tcp_rx_min_ttl += 1;
            return Verdict::Drop;
        }
        if !self.csum_valid && !wire::verify_tcp_checksum(l3.src, l3.dst, l4) {
            c.tcp_rx_bad_checksum += 1;
            return Verdict::Drop;
        }
        Verdict::Tcp {
            target,
            local,
            remote,
            off: l4_off,
            len: l4.len(),
            ce: l3.tos & 3 == 3,
        }
    }

    fn classify_icmp4(&self, c: &mut Counters, l3: &L3Info, l4: &[u8], l4_off: usize) -> Verdict {
        c.icmp4_rx += 1;
        let icmp = match Icmpv4Repr::parse(l4, !self.csum_valid) {
            Ok(i) => i,
            Err(WireError::BadChecksum) => {
                c.icmp4_rx_bad_checksum += 1;
                return Verdict::Drop;
            }
            Err(_) => {
                c.icmp4_rx_malformed += 1;
                return Verdict::Drop;
            }
        };
        let v = match icmp {
            Icmpv4Repr::EchoRequest { ident, seq, data } => {
                c.icmp4_rx_echo_request += 1;
                l3.echo_request(ident, seq, data.len(), l4_off)
            }
            Icmpv4Repr::EchoReply { ident, data, .. } => {
                c.icmp4_rx_echo_reply += 1;
                self.classify_echo_reply(c, l3, ident, data.len(), l4_off)
            }
            Icmpv4Repr::DstUnreachable { code, invoking } => {
                c.icmp4_rx_unreachable += 1;
                let mtu = wire::icmpv4_frag_needed_mtu(l4);
                self.classify_icmp_error(c, l3, IcmpMsg::Unreach4 { code, mtu }, invoking)
            }
            Icmpv4Repr::TimeExceeded { code, invoking } => {
                c.icmp4_rx_time_exceeded += 1;
                self.classify_icmp_error(c, l3, IcmpMsg::TimeExceeded { code }, invoking)
            }
            _ => {
                c.icmp4_rx_other += 1;
                Verdict::Drop
            }
        };
        self.with_raw_copies(l3, l4, l4_off, v)
    }

    /// `v`, preceded by a copy of the ICMP message for the raw sockets of its
    /// family when there are any ([`DgramProto::Raw`]): the stack handles the
    /// message itself as well, as Linux's `raw_local_deliver` runs before
    /// `icmp_rcv`.
    fn with_raw_copies(&self, l3: &L3Info, l4: &[u8], l4_off: usize, v: Verdict) -> Verdict {
        let v4 = l3.src.is_ipv4();
        if !self.sockets.raw_open(v4) {
            return v;
        }
        Verdict::RawIcmp {
            ty: l4[0],
            info: UdpRecvInfo {
                from: SocketAddr::new(l3.src, 0),
                dst: l3.dst,
                hop_limit: l3.hop_limit,
                tos: l3.tos,
            },
            // An IPv4 copy starts with its IP header: where the frame has it (none
            // for a reassembled datagram: the first fragment's is in `invoking`).
            hdr_off: if v4 { l3.l3_off } else { l4_off },
            off: l4_off,
            len: l4.len(),
            then: Box::new(v),
        }
    }

    /// An echo reply goes to the ping socket of its identifier
    /// ([`DgramProto::Icmp`]) as one datagram: the whole ICMP message, header and
    /// data, from port 0 (what Linux's ping sockets read).
    fn classify_echo_reply(
        &self,
        c: &mut Counters,
        l3: &L3Info,
        ident: u16,
        data_len: usize,
        l4_off: usize,
    ) -> Verdict {
        let from = SocketAddr::new(l3.src, 0);
        let Some(sock) = self
            .sockets
            .udp_lookup(DgramProto::Icmp, l3.dst, ident, from)
        else {
            c.ping_rx_no_socket += 1;
            return Verdict::Drop;
        };
        let len = ECHO_HEADER + data_len;
        if self.sockets.udp_no_room(sock, len).is_some() {
            c.ping_rx_queue_full += 1;
            return Verdict::UdpQueueFull { sock };
        }
        let info = UdpRecvInfo {
            from,
            dst: l3.dst,
            hop_limit: l3.hop_limit,
            tos: l3.tos,
        };
        Verdict::Udp {
            sock,
            info,
            off: l4_off,
            len,
        }
    }

    fn classify_icmp6(&self, c: &mut Counters, l3: &L3Info, l4: &[u8], l4_off: usize) -> Verdict {
        c.icmp6_rx += 1;
        let (IpAddr::V6(src), IpAddr::V6(dst)) = (l3.src, l3.dst) else {
            return Verdict::Drop;
        };
        let icmp = match Icmpv6Repr::parse(&src, &dst, l4, !self.csum_valid) {
            Ok(i) => i,
            Err(WireError::BadChecksum) => {
                c.icmp6_rx_bad_checksum += 1;
                return Verdict::Drop;
            }
            Err(_) => {
                c.icmp6_rx_malformed += 1;
                return Verdict::Drop;
            }
        };
        let v = match icmp {
            Icmpv6Repr::EchoRequest { ident, seq, data } => {
                c.icmp6_rx_echo_request += 1;
                l3.echo_request(ident, seq, data.len(), l4_off)
            }
            Icmpv6Repr::EchoReply { ident, data, .. } => {
                c.icmp6_rx_echo_reply += 1;
                self.classify_echo_reply(c, l3, ident, data.len(), l4_off)
            }
            Icmpv6Repr::NeighborSolicit { target, source_mac } => {
                c.icmp6_rx_neighbor_solicit += 1;
                // RFC 4861 7.1.1: hop limit 255 proves the sender is on-link.
                if l3.hop_limit != 255 || target.is_multicast() {
                    c.icmp6_rx_ndp_invalid += 1;
                    return Verdict::Drop;
                }
                if !self.is_local(IpAddr::V6(target)) {
                    return Verdict::Drop;
                }
                let dad = src.is_unspecified();
                if dad && source_mac.is_some() {
                    c.icmp6_rx_ndp_invalid += 1;
                    return Verdict::Drop;
                }
                Verdict::NeighborSolicit {
                    src,
                    target,
                    mac: if dad {
                        None
                    } else {
                        source_mac.or(Some(l3.eth_src))
                    },
                }
            }
            Icmpv6Repr::NeighborAdvert {
                target, target_mac, ..
            } => {
                c.icmp6_rx_neighbor_advert += 1;
                if l3.hop_limit != 255 || target.is_multicast() {
                    c.icmp6_rx_ndp_invalid += 1;
                    return Verdict::Drop;
                }
                Verdict::NeighborAdvert {
                    target,
                    mac: target_mac.unwrap_or(l3.eth_src),
                }
            }
            Icmpv6Repr::DstUnreachable { code, invoking } => {
                c.icmp6_rx_unreachable += 1;
                self.classify_icmp_error(c, l3, IcmpMsg::Unreach6 { code }, invoking)
            }
            Icmpv6Repr::PacketTooBig { mtu, invoking } => {
                c.icmp6_rx_packet_too_big += 1;
                self.classify_icmp_error(c, l3, IcmpMsg::TooBig6 { mtu }, invoking)
            }
            Icmpv6Repr::TimeExceeded { code, invoking } => {
                c.icmp6_rx_time_exceeded += 1;
                self.classify_icmp_error(c, l3, IcmpMsg::TimeExceeded { code }, invoking)
            }
            Icmpv6Repr::Other {
                kind: 130..=132 | 143,
                ..
            } => classify_mld(c, l3, &src, &dst, l4),
            _ => {
                c.icmp6_rx_other += 1;
                Verdict::Drop
            }
        };
        self.with_raw_copies(l3, l4, l4_off, v)
    }
}

/// IGMP: a query becomes [`Verdict::McastQuery`]; other hosts' reports and leaves
/// are counted and dropped.
fn classify_igmp(c: &mut Counters, l3: &L3Info, l4: &[u8], csum_valid: bool) -> Verdict {
    c.igmp_rx += 1;
    match IgmpRepr::parse(l4, !csum_valid) {
        Ok(q @ IgmpRepr::Query { group, .. }) => {
            c.igmp_rx_query += 1;
            // A group-specific query goes to the group itself (RFC 2236 §2.1).
            if !group.is_unspecified() && l3.dst != IpAddr::V4(group) {
                c.igmp_rx_malformed += 1;
                return Verdict::Drop;
            }
            Verdict::McastQuery {
                group: IpAddr::V4(group),
                max: Duration::from_millis(u64::from(q.max_resp_tenths()) * 100),
            }
        }
        Ok(_) => {
            c.igmp_rx_other += 1;
            Verdict::Drop
        }
        Err(_) => {
            c.igmp_rx_malformed += 1;
            Verdict::Drop
        }
    }
}

/// MLD (the ICMPv6 checksum is verified already): only from a link-local source
/// with hop limit 1 (RFC 3810 §5.1.14, §5.2.13); a query becomes
/// [`Verdict::McastQuery`].
fn classify_mld(
    c: &mut Counters,
    l3: &L3Info,
    src: &Ipv6Addr,
    dst: &Ipv6Addr,
    l4: &[u8],
) -> Verdict {
    c.mld_rx += 1;
    if l3.hop_limit != 1 || !crate::core::is_link_local6(src) {
        c.mld_rx_malformed += 1;
        return Verdict::Drop;
    }
    match MldRepr::parse(src, dst, l4, false) {
        Ok(q @ MldRepr::Query { group, .. }) => {
            c.mld_rx_query += 1;
            Verdict::McastQuery {
                group: IpAddr::V6(group),
                max: Duration::from_millis(u64::from(q.max_resp_ms())),
            }
        }
        Ok(_) => {
            c.mld_rx_other += 1;
            Verdict::Drop
        }
        Err(_) => {
            c.mld_rx_malformed += 1;
            Verdict::Drop
        }
    }
}

/// What [`Stack::queue_copies`] did with its copies.
#[derive(Default)]
struct Copies {
    queued: u64,
    /// Refused: the socket's receive buffer is full.
    queue_full: u64,
    /// Refused: its owner holds its share of the pool.
    owner_full: u64,
}

impl Stack {
    pub(crate) fn process_frame(&mut self, buf: PktBuf) {
        let core = &mut self.core;
        let len = core.pool.chain_len(&buf);
        core.counters.link_rx_frames += 1;
        core.counters.link_rx_bytes += len as u64;
        let csum_valid = core.pool.offload(&buf).csum_valid && core.cfg.rx_csum_offload;
        if !core.pool.is_single(&buf) {
            // A frame larger than one buffer (a device's GSO frame). A segment for a
            // connection goes to it where it lies; anything else is linearised once.
            let v = self.with_view(csum_valid, |view, c, pool| {
                view.classify_chained_tcp(c, pool.data(&buf), len)
            });
            if let Some(v) = v {
                let v = self.gro_flush_then(v);
                if let Verdict::Tcp {
                    target: target @ TcpTarget::Conn(_),
                    local,
                    remote,
                    off,
                    len,
                    ce,
                } = v
                {
                    self.tcp_input(target, local, remote, off, len, Src::Buf(buf), ce);
                    return;
                }
                // The flush ended the connection: the segment, classified already,
                // goes to its new target whole.
                let src = self.core.linearise(buf);
                self.execute(v, src);
                return;
            }
            let src = self.core.linearise(buf);
            let v = self.with_view(csum_valid, |view, c, pool| {
                view.classify(c, src.bytes(pool))
            });
            let v = self.gro_flush_then(v);
            self.execute(v, src);
            return;
        }
        let v = self.with_view(csum_valid, |view, c, pool| {
            view.classify(c, pool.data(&buf))
        });
        if self.core.cfg.gro {
            if let Some((v, buf)) = self.gro_offer(v, buf) {
                self.execute(v, Src::Buf(buf));
            }
            return;
        }
        self.execute(v, Src::Buf(buf));
    }

    /// Runs `f` with a classification view over the core and the socket table, the
    /// counters to update, and the pool (where the frame's bytes live).
    #[inline]
    fn with_view<R>(
        &mut self,
        csum_valid: bool,
        f: impl FnOnce(&View<'_>, &mut Counters, &PacketPool) -> R,
    ) -> R {
        let Stack { core, sockets, .. } = self;
        let Core {
            cfg,
            addrs,
            pool,
            counters,
            mcast,
            ..
        } = core;
        let view = View {
            mac: cfg.mac,
            addrs,
            sockets,
            mcast,
            csum_valid,
        };
        f(&view, counters, pool)
    }

    fn execute(&mut self, v: Verdict, src: Src) {
        match v {
            Verdict::Drop => self.core.release(src),
            Verdict::RawIcmp {
                ty,
                info,
                hdr_off,
                off,
                len,
                then,
            } => {
                self.deliver_raw_copies(ty, info, hdr_off, off, len, &src);
                self.execute(*then, src);
            }
            Verdict::Udp {
                sock,
                info,
                off,
                len,
            } => self.deliver_udp(sock, info, off, len, src),
            Verdict::UdpMcast {
                port,
                info,
                off,
                len,
            } => self.deliver_udp_mcast(port, info, off, len, src),
            Verdict::McastQuery { group, max } => {
                self.core.release(src);
                self.core.mcast_query(group, max);
            }
            Verdict::Tcp {
                target,
                local,
                remote,
                off,
                len,
                ce,
            } => self.tcp_input(target, local, remote, off, len, src, ce),
            Verdict::TcpIcmp { conn, seq, err } => {
                self.core.release(src);
                self.tcp_icmp_error(conn, seq, err);
            }
            Verdict::DgramIcmp {
                socks,
                hard,
                report,
            } => {
                self.core.release(src);
                for sock in socks {
                    self.dgram_icmp_error(sock, (*report).clone(), hard);
                }
            }
            Verdict::TcpIcmpListener {
                listener,
                local,
                remote,
                seq,
                err,
            } => {
                self.core.release(src);
                self.tcp_icmp_listener_error(listener, local, remote, seq, err);
            }
            Verdict::UdpQueueFull { sock } => {
                if let Some(u) = self.sockets.udp_at_mut(sock) {
                    u.stats.rx_queue_full += 1;
                }
                self.core.release(src);
            }
            Verdict::Unreachable {
                why,
                src: from,
                dst,
                l3_off,
                l3_len,
            } => self
                .core
                .answer_unreachable(why, from, dst, l3_off, l3_len, src),
            Verdict::EchoRequest {
                src: from,
                dst,
                ident,
                seq,
                off,
                len,
            } => {
                let core = &mut self.core;
                let data = core.take_bytes(src, off, len);
                let _ = core.send_echo_reply(dst, from, ident, seq, &data);
                core.scratch = data;
            }
            Verdict::Arp(arp) => {
                self.core.release(src);
                self.core.handle_arp(arp);
            }
            Verdict::NeighborSolicit {
                src: from,
                target,
                mac,
            } => {
                self.core.release(src);
                self.core.handle_neighbor_solicit(from, target, mac);
            }
            Verdict::NeighborAdvert { target, mac } => {
                let core = &mut self.core;
                core.release(src);
                let pending = core
                    .neighbors
                    .learn(IpAddr::V6(target), mac, core.now, false);
                core.flush_pending(pending, mac);
            }
            Verdict::Fragment {
                key,
                proto,
                offset,
                more,
                off,
                len,
                hdr_off,
                hdr_len,
                hop_limit,
            } => self.reassemble(
                src, key, proto, offset, more, off, len, hdr_off, hdr_len, hop_limit,
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reassemble(
        &mut self,
        src: Src,
        key: FragKey,
        proto: u8,
        offset: usize,
        more: bool,
        off: usize,
        len: usize,
        hdr_off: usize,
        hdr_len: usize,
        hop_limit: u8,
    ) {
        let Some((proto, data, invoking)) = self
            .core
            .reassemble(src, key, proto, offset, more, off, len, hdr_off, hdr_len)
        else {
            return;
        };
        let (s, d) = match key {
            FragKey::V4 { src, dst, .. } => (IpAddr::V4(src), IpAddr::V4(dst)),
            FragKey::V6 { src, dst, .. } => (IpAddr::V6(src), IpAddr::V6(dst)),
        };
        self.deliver_datagram(s, d, proto, hop_limit, data, invoking, true);
    }

    /// A reassembled datagram (`data`: the transport payload, for IPv6 with any
    /// extension headers after the fragment header) to its socket; a sharded stack
    /// first hands it to the shard that owns it (`steer`: not yet steered).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver_datagram(
        &mut self,
        s: IpAddr,
        d: IpAddr,
        proto: u8,
        hop_limit: u8,
        data: Vec<u8>,
        invoking: Vec<u8>,
        steer: bool,
    ) {
        // IPv6: extension headers may follow the fragment header.
        let (l4_proto, l4_off) = if s.is_ipv4() {
            (proto, 0)
        } else {
            match wire::skip_ext_headers(proto, &data) {
                Ok(up) => (up.protocol, up.offset),
                Err(_) => {
                    self.core.counters.ip6_rx_bad_header += 1;
                    return;
                }
            }
        };
        let n = usize::from(self.core.cfg.shard.count);
        if steer && n > 1 {
            let owner = crate::shard::datagram_owner(l4_proto, d, &data[l4_off..], n);
            let here = self
                .core
                .hand_over(owner, |_| crate::shard::Handoff::Datagram {
                    src: s,
                    dst: d,
                    proto,
                    hop_limit,
                    data: data.clone(),
                    invoking: invoking.clone(),
                });
            if !here {
                return;
            }
            // A UDP port whose socket lives on another shard (a reassembled
            // datagram to a sharded server's port).
            let l4 = &data[l4_off..];
            if l4_proto == 17 && l4.len() >= 4 && !self.core.redirects.is_empty() {
                let flow = crate::shard::Flow {
                    proto: 17,
                    local: SocketAddr::new(d, u16::from_be_bytes([l4[2], l4[3]])),
                    remote: SocketAddr::new(s, u16::from_be_bytes([l4[0], l4[1]])),
                    syn: false,
                };
                if let Some(to) = self.core.redirect_of(&flow, false) {
                    self.core.counters.shard_redirected += 1;
                    self.core.handoffs.push((
                        to,
                        crate::shard::Handoff::Datagram {
                            src: s,
                            dst: d,
                            proto,
                            hop_limit,
                            data,
                            invoking,
                        },
                    ));
                    return;
                }
            }
        }
        // The TOS and hop limit of the first fragment's header, as Linux takes
        // the head fragment's.
        let (hop_limit, tos) = match (s.is_ipv4(), invoking.as_slice()) {
            (true, [_, tos, _, _, _, _, _, _, ttl, ..]) => (*ttl, *tos),
            (false, [b0, b1, _, _, _, _, _, hops, ..]) => (*hops, (b0 & 0x0f) << 4 | b1 >> 4),
            _ => (hop_limit, 0),
        };
        let l3 = L3Info {
            src: s,
            dst: d,
            unicast: self.core.is_local_addr(d),
            hop_limit,
            l3_off: 0,
            l3_len: invoking.len(),
            eth_src: MacAddr::default(),
            tos,
        };
        let v = self.with_view(false, |view, c, _| {
            view.classify_l4(c, &l3, l4_proto, &data[l4_off..], l4_off)
        });
        self.execute(
            v,
            Src::Owned {
                data,
                invoking,
                gso_size: 0,
            },
        );
    }

    /// A copy of an ICMP message (`off`, `len` in `src`) to every raw socket that
    /// takes it ([`SocketSet::raw_members`]); an IPv4 copy with the IP header
    /// from `hdr_off` (a reassembled datagram's rebuilt from its first
    /// fragment's, with the whole length and no fragment fields, as Linux's raw
    /// sockets read one). A full queue drops its copy alone.
    fn deliver_raw_copies(
        &mut self,
        ty: u8,
        info: UdpRecvInfo,
        hdr_off: usize,
        off: usize,
        len: usize,
        src: &Src,
    ) {
        let mut members = Vec::new();
        self.sockets
            .raw_members(info.dst, info.from.ip(), ty, &mut members);
        if members.is_empty() {
            return;
        }
        let bytes = src.bytes(&self.core.pool);
        let mut copy = std::mem::take(&mut self.core.scratch);
        copy.clear();
        match src {
            Src::Owned { invoking, .. } if info.dst.is_ipv4() && hdr_off == off => {
                let ihl = usize::from(invoking.first().map_or(0, |b| b & 0x0f)) * 4;
                if ihl < wire::IPV4_HEADER_LEN || ihl > invoking.len() {
                    self.core.scratch = copy;
                    return;
                }
                copy.extend_from_slice(&invoking[..ihl]);
                let total = (ihl + len).min(usize::from(u16::MAX)) as u16;
                copy[2..4].copy_from_slice(&total.to_be_bytes());
                copy[6..8].fill(0);
                copy[10..12].fill(0);
                let sum = wire::finish(wire::sum(&copy));
                copy[10..12].copy_from_slice(&sum.to_be_bytes());
                copy.extend_from_slice(&bytes[off..off + len]);
            }
            _ => copy.extend_from_slice(&bytes[hdr_off..off + len]),
        }
        let done = self.queue_copies(members, &copy, info);
        let c = &mut self.core.counters;
        c.raw_rx_delivered += done.queued;
        c.raw_rx_queue_full += done.queue_full + done.owner_full;
        self.core.scratch = copy;
    }

    /// A copy of `data` queued on each socket of `members` that has room for it
    /// ([`SocketSet::udp_no_room`]): a full one drops its copy alone (counted in
    /// its stats), an exhausted pool the rest.
    fn queue_copies(&mut self, members: Vec<u32>, data: &[u8], info: UdpRecvInfo) -> Copies {
        let mut done = Copies::default();
        for i in members {
            if let Some(why) = self.sockets.udp_no_room(i, data.len()) {
                if let Some(u) = self.sockets.udp_at_mut(i) {
                    u.stats.rx_queue_full += 1;
                }
                match why {
                    NoRoom::Queue => done.queue_full += 1,
                    NoRoom::Owner => done.owner_full += 1,
                }
                continue;
            }
            let Some(buf) = self.core.pool.alloc_from(data) else {
                self.core.counters.drop_pool_exhausted += 1;
                break;
            };
            done.queued += 1;
            self.queue_udp(i, buf, data.len(), info);
        }
        done
    }

    /// A multicast datagram: a copy to every member socket on the port
    /// ([`SocketSet::udp_mcast_members`]); a full queue drops its copy alone.
    fn deliver_udp_mcast(
        &mut self,
        port: u16,
        info: UdpRecvInfo,
        off: usize,
        len: usize,
        src: Src,
    ) {
        let mut members = Vec::new();
        self.sockets
            .udp_mcast_members(info.dst, port, info.from, &mut members);
        if members.is_empty() {
            self.core.counters.udp_rx_no_socket += 1;
            self.core.release(src);
            return;
        }
        let data = self.core.take_bytes(src, off, len);
        let done = self.queue_copies(members, &data, info);
        let c = &mut self.core.counters;
        c.udp_rx_mcast_delivered += done.queued;
        c.udp_rx_queue_full += done.queue_full;
        c.udp_rx_owner_full += done.owner_full;
        self.core.scratch = data;
    }

    fn deliver_udp(&mut self, sock: u32, info: UdpRecvInfo, off: usize, len: usize, src: Src) {
        let core = &mut self.core;
        let buf = match src {
            Src::Buf(b) => {
                // Zero copy: the frame's buffer becomes the datagram.
                core.pool.trim_front(&b, off);
                core.pool.truncate(&b, len);
                Some(b)
            }
            Src::Owned { ref data, .. } => {
                let b = core.pool.alloc_from(&data[off..off + len]);
                core.release(src);
                b
            }
        };
        let Some(buf) = buf else {
            core.counters.drop_pool_exhausted += 1;
            return;
        };
        self.queue_udp(sock, buf, len, info);
    }

    /// Queues a datagram's buffer on socket `sock`, which has room for it.
    fn queue_udp(&mut self, sock: u32, buf: PktBuf, len: usize, info: UdpRecvInfo) {
        let core = &mut self.core;
        let Some(u) = self.sockets.udp_at_mut(sock) else {
            core.pool.free(buf);
            return;
        };
        let was_empty = u.rxq.is_empty();
        let bufs = core.pool.parts(&buf).count() as u32;
        u.rxq.push_back(Datagram { buf, len, info });
        u.rx_queued_bytes += len;
        u.stats.rx_datagrams += 1;
        u.stats.rx_bytes += len as u64;
        let high = u.rx_queued_bytes * 2 > u.recv_buffer;
        if u.proto == DgramProto::Udp {
            core.counters.udp_rx_delivered += 1;
        }
        self.sockets.charge_rx(sock, bufs, true);
        if was_empty {
            self.sockets.mark_ready(sock);
        }
        // Priority control: past half the limit, the consumer should hurry; a boosted
        // consumer stays boosted while datagrams keep coming.
        if self.prio_watch(sock) {
            self.core.prio_arrival(sock);
            if high {
                self.core.prio_queue_high(sock);
            }
        }
    }
}

impl Core {
    /// Answers a datagram for a closed port or an unknown protocol (rate-limited).
    fn answer_unreachable(
        &mut self,
        why: Unreach,
        from: IpAddr,
        dst: IpAddr,
        l3_off: usize,
        l3_len: usize,
        src: Src,
    ) {
        let invoking = match &src {
            Src::Owned { invoking, .. } if !invoking.is_empty() => invoking.clone(),
            _ => {
                // As much of the offending packet as fits in a minimum MTU.
                let limit = if from.is_ipv4() { 576 - 28 } else { 1280 - 48 };
                self.take_bytes(src, l3_off, l3_len.min(limit))
            }
        };
        self.send_unreachable(why, dst, from, &invoking);
        self.scratch = invoking;
    }

    fn handle_neighbor_solicit(&mut self, from: Ipv6Addr, target: Ipv6Addr, mac: Option<MacAddr>) {
        if let Some(mac) = mac {
            let from_ip = IpAddr::V6(from);
            let on_link = crate::core::is_link_local6(&from)
                || self.addrs.iter().any(|c| c.contains(from_ip));
            let pending = self.neighbors.learn(from_ip, mac, self.now, on_link);
            self.flush_pending(pending, mac);
        }
        let dad = from.is_unspecified();
        let dst = if dad {
            Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1)
        } else {
            from
        };
        self.send_neighbor_advert(dst, target, !dad);
    }

    /// Adds a fragment to its datagram; the whole datagram (protocol, bytes, and the
    /// first fragment's header + 8 bytes for ICMP errors) once it is complete.
    #[allow(clippy::too_many_arguments)]
    fn reassemble(
        &mut self,
        src: Src,
        key: FragKey,
        proto: u8,
        offset: usize,
        more: bool,
        off: usize,
        len: usize,
        hdr_off: usize,
        hdr_len: usize,
    ) -> Option<(u8, Vec<u8>, Vec<u8>)> {
        let now = self.now;
        let bytes = src.bytes(&self.pool);
        let payload = &bytes[off..off + len];
        let first_end = (off + 8).min(off + len);
        let header = &bytes[hdr_off..first_end.max(hdr_off + hdr_len)];
        let v4 = matches!(key, FragKey::V4 { .. });
        let r = if v4 {
            &mut self.reasm4
        } else {
            &mut self.reasm6
        };
        let evicted_before = r.evicted;
        let result = r.insert(now, key, proto, offset, more, payload, header);
        let evicted = r.evicted - evicted_before;
        self.release(src);
        let c = &mut self.counters;
        if v4 {
            c.ip4_reasm_evicted += evicted;
        } else {
            c.ip6_reasm_evicted += evicted;
        }
        match result {
            FragResult::Incomplete => None,
            FragResult::Overflow => {
                if v4 {
                    c.ip4_reasm_overflow += 1
                } else {
                    c.ip6_reasm_overflow += 1
                }
                None
            }
            FragResult::Bad => {
                if v4 {
                    c.ip4_reasm_bad += 1
                } else {
                    c.ip6_reasm_bad += 1
                }
                None
            }
            FragResult::Complete {
                proto,
                data,
                invoking,
            } => {
                if v4 {
                    c.ip4_reassembled += 1;
                } else {
                    c.ip6_reassembled += 1;
                }
                Some((proto, data, invoking))
            }
        }
    }

    fn handle_arp(&mut self, arp: ArpRepr) {
        if arp.sender_ip.is_unspecified() || !arp.sender_mac.is_unicast() {
            return; // ARP probe (RFC 5227) or nonsense: nothing to learn
        }
        let for_us = self.is_local_addr(IpAddr::V4(arp.target_ip));
        // Only on-link senders become entries; an off-link sender is spoofed or
        // misconfigured, and we would never send to it directly anyway.
        let sender = IpAddr::V4(arp.sender_ip);
        let on_link = self.addrs.iter().any(|c| c.contains(sender));
        let pending = self
            .neighbors
            .learn(sender, arp.sender_mac, self.now, for_us && on_link);
        self.flush_pending(pending, arp.sender_mac);
        if arp.op == ArpOp::Request && for_us {
            self.send_arp(
                ArpOp::Reply,
                arp.target_ip,
                arp.sender_mac,
                arp.sender_ip,
                arp.sender_mac,
            );
        }
    }
}
