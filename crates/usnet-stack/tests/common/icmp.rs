//! What a router on the simulated path says: TCP segments as a middlebox sees them,
//! the ICMP errors it sends back, and frames injected as if from the wire.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use usnet_stack::sim::SimNet;
use usnet_wire::{self as wire, ethertype, Icmpv4Repr, Icmpv6Repr, Ipv4Repr, Ipv6Repr};

pub const ROUTER4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
pub const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xfe);

/// A TCP segment on the wire, as the middlebox sees it.
pub struct Seen {
    /// IP packet length.
    pub ip_len: usize,
    pub src: IpAddr,
    pub dport: u16,
    pub seq: u32,
    pub syn: bool,
    pub payload: usize,
}

pub fn tcp_of(frame: &[u8]) -> Option<Seen> {
    let eth = wire::parse_ethernet(frame).ok()?;
    let (ip_len, src, tcp) = match eth.ethertype {
        ethertype::IPV4 => {
            let ip = wire::parse_ipv4(eth.payload, false).ok()?;
            if ip.protocol != wire::IPPROTO_TCP {
                return None;
            }
            (ip.total_len, ip.src.into(), ip.payload)
        }
        ethertype::IPV6 => {
            let ip = wire::parse_ipv6(eth.payload).ok()?;
            if ip.next_header != wire::IPPROTO_TCP {
                return None;
            }
            (40 + ip.payload_len, ip.src.into(), ip.payload)
        }
        _ => return None,
    };
    let hl = usize::from(tcp[12] >> 4) * 4;
    Some(Seen {
        ip_len,
        src,
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        syn: tcp[13] & 0x02 != 0,
        payload: tcp.len() - hl,
    })
}

/// The source address of an IP frame.
pub fn src_of(frame: &[u8]) -> IpAddr {
    let eth = wire::parse_ethernet(frame).unwrap();
    if eth.ethertype == ethertype::IPV4 {
        wire::parse_ipv4(eth.payload, false).unwrap().src.into()
    } else {
        wire::parse_ipv6(eth.payload).unwrap().src.into()
    }
}

/// What a router says about a frame it could not forward.
#[derive(Clone, Copy, Debug)]
pub enum Says {
    /// ICMPv4 destination unreachable with this code (and next-hop MTU field).
    Unreach4(u8, u16),
    Unreach6(u8),
    TooBig6(u32),
    TimeExceeded,
}

/// The ICMP error a router on the path sends back to the sender of `frame`, quoting
/// as much of it as Linux does (up to 576 bytes in all for IPv4, 1280 for IPv6).
/// `edit` may change the quoted bytes (to forge them).
pub fn icmp_for(frame: &[u8], says: Says, edit: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let eth = wire::parse_ethernet(frame).unwrap();
    let pkt = eth.payload;
    let v4 = eth.ethertype == ethertype::IPV4;
    let (l3, limit) = if v4 { (20, 576 - 28) } else { (40, 1280 - 48) };
    let mut quote = pkt[..pkt.len().min(limit)].to_vec();
    edit(&mut quote);
    let icmp_len = 8 + quote.len();
    let mut out = vec![0u8; 14 + l3 + icmp_len];
    let et = if v4 { ethertype::IPV4 } else { ethertype::IPV6 };
    wire::emit_ethernet(&mut out, eth.src, eth.dst, et).unwrap();
    let icmp = &mut out[14 + l3..];
    if v4 {
        let IpAddr::V4(to) = src_of(frame) else {
            unreachable!()
        };
        let (repr, mtu) = match says {
            Says::Unreach4(code, mtu) => (
                Icmpv4Repr::DstUnreachable {
                    code,
                    invoking: &quote,
                },
                mtu,
            ),
            Says::TimeExceeded => (
                Icmpv4Repr::TimeExceeded {
                    code: 0,
                    invoking: &quote,
                },
                0,
            ),
            other => panic!("{other:?} is ICMPv6"),
        };
        repr.emit(icmp).unwrap();
        if mtu != 0 {
            // The next-hop MTU (RFC 1191) is not part of the repr: patch it in.
            icmp[6..8].copy_from_slice(&mtu.to_be_bytes());
            icmp[2..4].fill(0);
            let c = wire::finish(wire::sum(icmp));
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
        }
        Ipv4Repr {
            src: ROUTER4,
            dst: to,
            protocol: wire::IPPROTO_ICMP,
            payload_len: icmp_len,
            ttl: 64,
            ident: 1,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
        }
        .emit(&mut out[14..])
        .unwrap();
    } else {
        let IpAddr::V6(to) = src_of(frame) else {
            unreachable!()
        };
        let repr = match says {
            Says::Unreach6(code) => Icmpv6Repr::DstUnreachable {
                code,
                invoking: &quote,
            },
            Says::TooBig6(mtu) => Icmpv6Repr::PacketTooBig {
                mtu,
                invoking: &quote,
            },
            Says::TimeExceeded => Icmpv6Repr::TimeExceeded {
                code: 0,
                invoking: &quote,
            },
            other => panic!("{other:?} is ICMPv4"),
        };
        repr.emit(&ROUTER6, &to, icmp).unwrap();
        Ipv6Repr {
            src: ROUTER6,
            dst: to,
            next_header: wire::IPPROTO_ICMPV6,
            payload_len: icmp_len,
            hop_limit: 64,
        }
        .emit(&mut out[14..])
        .unwrap();
    }
    out
}

/// Sets the TCP sequence number in a quoted packet.
pub fn set_quoted_seq(q: &mut [u8], seq: u32) {
    let l4 = if q[0] >> 4 == 4 {
        usize::from(q[0] & 0xf) * 4
    } else {
        40
    };
    q[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
}

/// Hands a frame to stack `i` as if it came off the wire.
pub fn inject(net: &mut SimNet, i: usize, frame: &[u8]) {
    let s = net.stack_mut(i);
    let b = s.pool_mut().alloc_from(frame).unwrap();
    s.receive(b);
}
