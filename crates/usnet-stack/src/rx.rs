//! Receive path. `classify` reads a frame without changing anything but counters (so
//! it can borrow the frame's bytes from the pool while the rest of the stack is read),
//! looks the UDP socket up as soon as the ports are known (early demux, before any
//! checksum work), and returns a [`Verdict`]; `execute` then does the work.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use usnet_pool::PktBuf;
use usnet_wire::{
    self as wire, ethertype, ArpOp, ArpRepr, Icmpv4Repr, Icmpv6Repr, MacAddr, WireError,
};

use crate::counters::Counters;
use crate::frag::{FragKey, FragResult};
use crate::socket::{Datagram, EchoReply, Socket, SocketSet, PING_QUEUE};
use crate::tcp::icmp::IcmpMsg;
use crate::{IpCidr, Stack};

/// Why an ICMP "unreachable" is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreach {
    Port,
    Protocol,
}

/// What to do with a received frame; offsets are into the frame (or reassembled data).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Verdict {
    /// Counted already; just free it.
    Drop,
    Arp(ArpRepr),
    Udp {
        sock: u32,
        from: SocketAddr,
        off: usize,
        len: usize,
    },
    UdpQueueFull {
        sock: u32,
    },
    /// A TCP segment (checksum verified) and what the early demux found for it.
    Tcp {
        target: crate::tcp::TcpTarget,
        local: SocketAddr,
        remote: SocketAddr,
        off: usize,
        len: usize,
    },
    /// An ICMP error about a segment of TCP connection `conn`.
    TcpIcmp {
        conn: u32,
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
    EchoReply {
        from: IpAddr,
        ident: u16,
        seq: u16,
        hop_limit: u8,
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
    },
}

/// The read-only parts of the stack that classification needs.
pub(crate) struct View<'a> {
    pub mac: MacAddr,
    pub addrs: &'a [IpCidr],
    pub sockets: &'a SocketSet,
    pub csum_valid: bool,
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
}

impl L3Info {
    /// An echo request to answer; only when sent to one of our unicast addresses (like
    /// Linux's icmp_echo_ignore_broadcasts=1). The echo data follows the 8-byte header.
    fn echo_request(&self, ident: u16, seq: u16, len: usize, l4_off: usize) -> Verdict {
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

    fn echo_reply(&self, ident: u16, seq: u16, len: usize, l4_off: usize) -> Verdict {
        Verdict::EchoReply {
            from: self.src,
            ident,
            seq,
            hop_limit: self.hop_limit,
            off: l4_off + 8,
            len,
        }
    }
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
        let accept = unicast
            || (ip.dst.is_multicast()
                && (ip.dst.segments()[0] & 0xff0f != 0xff02
                    || ip.dst == Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1)
                    || self.addrs.iter().any(|a| match a.addr {
                        IpAddr::V6(a) => wire::solicited_node(&a) == ip.dst,
                        IpAddr::V4(_) => false,
                    })));
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
        // Early demux: find the socket (and drop for a full queue) before spending the
        // checksum work on a datagram that would be thrown away.
        let sock = self.sockets.udp_lookup(l3.dst, udp.dst_port, from);
        if let Some(i) = sock {
            if let Some(u) = self.sockets.udp_at(i) {
                if !u.rxq.is_empty() && u.rx_queued_bytes + udp.payload.len() > u.recv_buffer {
                    c.udp_rx_queue_full += 1;
                    return Verdict::UdpQueueFull { sock: i };
                }
            }
        }
        if !self.csum_valid && !wire::verify_udp_checksum(l3.src, l3.dst, &l4[..udp_len]) {
            c.udp_rx_bad_checksum += 1;
            return Verdict::Drop;
        }
        match sock {
            Some(i) => Verdict::Udp {
                sock: i,
                from,
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
        match icmp {
            Icmpv4Repr::EchoRequest { ident, seq, data } => {
                c.icmp4_rx_echo_request += 1;
                l3.echo_request(ident, seq, data.len(), l4_off)
            }
            Icmpv4Repr::EchoReply { ident, seq, data } => {
                c.icmp4_rx_echo_reply += 1;
                l3.echo_reply(ident, seq, data.len(), l4_off)
            }
            Icmpv4Repr::DstUnreachable { code, invoking } => {
                c.icmp4_rx_unreachable += 1;
                let mtu = wire::icmpv4_frag_needed_mtu(l4);
                self.classify_tcp_icmp(c, l3, IcmpMsg::Unreach4 { code, mtu }, invoking)
            }
            Icmpv4Repr::TimeExceeded { invoking, .. } => {
                c.icmp4_rx_time_exceeded += 1;
                self.classify_tcp_icmp(c, l3, IcmpMsg::TimeExceeded, invoking)
            }
            _ => {
                c.icmp4_rx_other += 1;
                Verdict::Drop
            }
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
        match icmp {
            Icmpv6Repr::EchoRequest { ident, seq, data } => {
                c.icmp6_rx_echo_request += 1;
                l3.echo_request(ident, seq, data.len(), l4_off)
            }
            Icmpv6Repr::EchoReply { ident, seq, data } => {
                c.icmp6_rx_echo_reply += 1;
                l3.echo_reply(ident, seq, data.len(), l4_off)
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
                self.classify_tcp_icmp(c, l3, IcmpMsg::Unreach6 { code }, invoking)
            }
            Icmpv6Repr::PacketTooBig { mtu, invoking } => {
                c.icmp6_rx_packet_too_big += 1;
                self.classify_tcp_icmp(c, l3, IcmpMsg::TooBig6 { mtu }, invoking)
            }
            Icmpv6Repr::TimeExceeded { invoking, .. } => {
                c.icmp6_rx_time_exceeded += 1;
                self.classify_tcp_icmp(c, l3, IcmpMsg::TimeExceeded, invoking)
            }
            _ => {
                c.icmp6_rx_other += 1;
                Verdict::Drop
            }
        }
    }
}

impl Stack {
    pub(crate) fn process_frame(&mut self, buf: PktBuf) {
        let len = self.pool.chain_len(buf);
        self.counters.link_rx_frames += 1;
        self.counters.link_rx_bytes += len as u64;
        let csum_valid = self.pool.offload(buf).csum_valid && self.cfg.rx_csum_offload;
        if self.pool.next(buf).is_some() {
            // A frame larger than one buffer: linearise it once.
            let mut data = std::mem::take(&mut self.frame_scratch);
            self.pool.copy_chain(buf, &mut data);
            self.pool.free(buf);
            let view = View {
                mac: self.cfg.mac,
                addrs: &self.addrs,
                sockets: &self.sockets,
                csum_valid,
            };
            let v = view.classify(&mut self.counters, &data);
            let v = self.gro_flush_then(v);
            self.execute(
                v,
                Src::Owned {
                    data,
                    invoking: Vec::new(),
                },
            );
            return;
        }
        let view = View {
            mac: self.cfg.mac,
            addrs: &self.addrs,
            sockets: &self.sockets,
            csum_valid,
        };
        let v = view.classify(&mut self.counters, self.pool.data(buf));
        if self.cfg.gro {
            if let Some(v) = self.gro_offer(v, buf) {
                self.execute(v, Src::Buf(buf));
            }
            return;
        }
        self.execute(v, Src::Buf(buf));
    }

    pub(crate) fn src_bytes<'a>(pool: &'a usnet_pool::PacketPool, src: &'a Src) -> &'a [u8] {
        match src {
            Src::Buf(b) => pool.data(*b),
            Src::Owned { data, .. } => data,
        }
    }

    pub(crate) fn release(&mut self, src: Src) {
        match src {
            Src::Buf(b) => self.pool.free(b),
            Src::Owned { data, .. } => {
                // Keep the big allocation for the next oversized frame.
                if data.capacity() > self.frame_scratch.capacity() {
                    self.frame_scratch = data;
                }
            }
        }
    }

    /// Copies `range` of the frame into the scratch buffer and releases the frame.
    fn take_bytes(&mut self, src: Src, off: usize, len: usize) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let bytes = Self::src_bytes(&self.pool, &src);
        let end = (off + len).min(bytes.len());
        out.extend_from_slice(&bytes[off.min(end)..end]);
        self.release(src);
        out
    }

    fn execute(&mut self, v: Verdict, src: Src) {
        match v {
            Verdict::Drop => self.release(src),
            Verdict::Udp {
                sock,
                from,
                off,
                len,
            } => self.deliver_udp(sock, from, off, len, src),
            Verdict::Tcp {
                target,
                local,
                remote,
                off,
                len,
            } => self.tcp_input(target, local, remote, off, len, src),
            Verdict::TcpIcmp { conn, seq, err } => {
                self.release(src);
                self.tcp_icmp_error(conn, seq, err);
            }
            Verdict::UdpQueueFull { sock } => {
                if let Some(u) = self.sockets.udp_at_mut(sock) {
                    u.stats.rx_queue_full += 1;
                }
                self.release(src);
            }
            Verdict::Unreachable {
                why,
                src: from,
                dst,
                l3_off,
                l3_len,
            } => {
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
            Verdict::EchoRequest {
                src: from,
                dst,
                ident,
                seq,
                off,
                len,
            } => {
                let data = self.take_bytes(src, off, len);
                let _ = self.send_echo_from(Some(dst), from, ident, seq, &data, false);
                self.scratch = data;
            }
            Verdict::EchoReply {
                from,
                ident,
                seq,
                hop_limit,
                off,
                len,
            } => {
                let mut head = [0u8; 16];
                let bytes = Self::src_bytes(&self.pool, &src);
                let n = len.min(16).min(bytes.len().saturating_sub(off));
                head[..n].copy_from_slice(&bytes[off..off + n]);
                self.release(src);
                match self.sockets.ping_by_ident(ident) {
                    Some(i) => {
                        let Some(Socket::Ping(p)) = self.sockets.slots[i as usize].sock.as_mut()
                        else {
                            return;
                        };
                        if p.rxq.len() >= PING_QUEUE {
                            self.counters.ping_rx_queue_full += 1;
                            p.stats.rx_queue_full += 1;
                            return;
                        }
                        p.stats.rx_datagrams += 1;
                        p.stats.rx_bytes += len as u64;
                        p.rxq.push_back(EchoReply {
                            from,
                            ident,
                            seq,
                            hop_limit,
                            len,
                            head,
                            at: self.now,
                        });
                        self.sockets.mark_ready(i);
                    }
                    None => self.counters.ping_rx_no_socket += 1,
                }
            }
            Verdict::Arp(arp) => {
                self.release(src);
                self.handle_arp(arp);
            }
            Verdict::NeighborSolicit {
                src: from,
                target,
                mac,
            } => {
                self.release(src);
                if let Some(mac) = mac {
                    let from_ip = IpAddr::V6(from);
                    let on_link = crate::is_link_local6(&from)
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
            Verdict::NeighborAdvert { target, mac } => {
                self.release(src);
                let pending = self
                    .neighbors
                    .learn(IpAddr::V6(target), mac, self.now, false);
                self.flush_pending(pending, mac);
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
        let now = self.now;
        let bytes = Self::src_bytes(&self.pool, &src);
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
            FragResult::Incomplete => {}
            FragResult::Overflow => {
                if v4 {
                    c.ip4_reasm_overflow += 1
                } else {
                    c.ip6_reasm_overflow += 1
                }
            }
            FragResult::Bad => {
                if v4 {
                    c.ip4_reasm_bad += 1
                } else {
                    c.ip6_reasm_bad += 1
                }
            }
            FragResult::Complete {
                proto,
                data,
                invoking,
            } => {
                let (s, d) = match key {
                    FragKey::V4 { src, dst, .. } => {
                        c.ip4_reassembled += 1;
                        (IpAddr::V4(src), IpAddr::V4(dst))
                    }
                    FragKey::V6 { src, dst, .. } => {
                        c.ip6_reassembled += 1;
                        (IpAddr::V6(src), IpAddr::V6(dst))
                    }
                };
                let l3 = L3Info {
                    src: s,
                    dst: d,
                    unicast: self.is_local_addr(d),
                    hop_limit,
                    l3_off: 0,
                    l3_len: invoking.len(),
                    eth_src: MacAddr::default(),
                };
                let view = View {
                    mac: self.cfg.mac,
                    addrs: &self.addrs,
                    sockets: &self.sockets,
                    csum_valid: false,
                };
                // IPv6: extension headers may follow the fragment header.
                let (proto, l4_off) = if v4 {
                    (proto, 0)
                } else {
                    match wire::skip_ext_headers(proto, &data) {
                        Ok(up) => (up.protocol, up.offset),
                        Err(_) => {
                            self.counters.ip6_rx_bad_header += 1;
                            return;
                        }
                    }
                };
                let v = view.classify_l4(&mut self.counters, &l3, proto, &data[l4_off..], l4_off);
                self.execute(v, Src::Owned { data, invoking });
            }
        }
    }

    fn deliver_udp(&mut self, sock: u32, from: SocketAddr, off: usize, len: usize, src: Src) {
        let buf = match src {
            Src::Buf(b) => {
                // Zero copy: the frame's buffer becomes the datagram.
                self.pool.trim_front(b, off);
                self.pool.truncate(b, len);
                Some(b)
            }
            Src::Owned { ref data, .. } => {
                let b = self.pool.alloc_from(&data[off..off + len]);
                self.release(src);
                b
            }
        };
        let Some(buf) = buf else {
            self.counters.drop_pool_exhausted += 1;
            return;
        };
        let Some(u) = self.sockets.udp_at_mut(sock) else {
            self.pool.free(buf);
            return;
        };
        let was_empty = u.rxq.is_empty();
        u.rxq.push_back(Datagram { buf, len, from });
        u.rx_queued_bytes += len;
        u.stats.rx_datagrams += 1;
        u.stats.rx_bytes += len as u64;
        self.counters.udp_rx_delivered += 1;
        if was_empty {
            self.sockets.mark_ready(sock);
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
