//! Receive-path walkers shared by the randomized tests and the cargo-fuzz
//! targets. Not part of the stable API.
//!
//! Besides exercising every parser, they check invariants and panic (on
//! purpose: that is what a fuzzer reports) when one breaks: whatever parses
//! must re-emit and parse back to the same value, with a valid checksum.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::*;

/// Scratch space for re-emitting; larger packets skip the re-emit checks.
const SCRATCH: usize = 4096;

/// Parse `frame` as Ethernet and walk down as a receive path would.
/// Returns how many layers parsed.
pub fn walk_frame(frame: &[u8]) -> u32 {
    let Ok(eth) = parse_ethernet(frame) else {
        return 0;
    };
    assert!(eth.header_len == 14 || eth.header_len == 18 || eth.header_len == 22);
    1 + match eth.ethertype {
        ethertype::ARP => walk_arp(eth.payload),
        ethertype::IPV4 => walk_ipv4(eth.payload),
        ethertype::IPV6 => walk_ipv6(eth.payload),
        _ => 0,
    }
}

/// Feed `data` straight to every parser, as each kind of payload.
pub fn walk_raw(data: &[u8]) -> u32 {
    let mut n = walk_frame(data) + walk_arp(data) + walk_ipv4(data) + walk_ipv6(data);
    let _ = parse_ipv4(data, true);
    if let Some((&first, rest)) = data.split_first() {
        if let Ok(u) = skip_ext_headers(first, rest) {
            assert!(u.offset <= rest.len());
            n += 1;
        }
    }
    let v4 = (
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    );
    let v6 = (
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1)),
    );
    for (s, d) in [v4, v6] {
        for proto in [
            IPPROTO_ICMP,
            IPPROTO_ICMPV6,
            IPPROTO_IGMP,
            IPPROTO_UDP,
            IPPROTO_TCP,
        ] {
            n += walk_transport(proto, s, d, data);
        }
        let _ = verify_udp_checksum(s, d, data);
        let _ = verify_tcp_checksum(s, d, data);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(m) = s.parse::<MacAddr>() {
            assert_eq!(m.to_string().parse::<MacAddr>(), Ok(m));
        }
    }
    n
}

fn walk_arp(data: &[u8]) -> u32 {
    let Ok(a) = ArpRepr::parse(data) else {
        return 0;
    };
    let mut buf = [0u8; ARP_LEN];
    a.emit(&mut buf).expect("arp emit");
    assert_eq!(ArpRepr::parse(&buf), Ok(a));
    1
}

fn walk_ipv4(data: &[u8]) -> u32 {
    let Ok(ip) = parse_ipv4(data, false) else {
        return 0;
    };
    assert_eq!(ip.payload.len(), ip.total_len - ip.header_len);
    let mut buf = [0u8; SCRATCH];
    let total = IPV4_HEADER_LEN + ip.payload.len();
    if let Some(b) = buf.get_mut(..total) {
        let r = ip.repr();
        r.emit(b).expect("ipv4 emit");
        let back = parse_ipv4(b, true).expect("ipv4 reparse");
        assert_eq!(back.repr(), r);
    }
    // Non-first fragments carry no transport header.
    if ip.frag_offset != 0 {
        return 1;
    }
    1 + walk_transport(ip.protocol, ip.src.into(), ip.dst.into(), ip.payload)
}

fn walk_ipv6(data: &[u8]) -> u32 {
    let Ok(ip) = parse_ipv6(data) else {
        return 0;
    };
    let mut buf = [0u8; IPV6_HEADER_LEN];
    ip.repr().emit(&mut buf).expect("ipv6 emit");
    assert_eq!(buf[..8], {
        let mut h = [0u8; 8];
        h.copy_from_slice(&data[..8]);
        h[0] = 0x60;
        h[1] = 0;
        h[2] = 0;
        h[3] = 0;
        h
    });
    let Ok(up) = skip_ext_headers(ip.next_header, ip.payload) else {
        return 1;
    };
    assert!(up.offset + up.payload.len() <= ip.payload.len());
    match up.frag {
        Some(f) if f.offset != 0 || f.more => 2,
        _ => 2 + walk_transport(up.protocol, ip.src.into(), ip.dst.into(), up.payload),
    }
}

/// Parse `data` as the transport `proto` over `src`/`dst`, re-emit, re-parse.
pub fn walk_transport(proto: u8, src: IpAddr, dst: IpAddr, data: &[u8]) -> u32 {
    let mut buf = [0u8; SCRATCH];
    match (proto, src, dst) {
        (IPPROTO_ICMP, IpAddr::V4(_), IpAddr::V4(_)) => {
            let Ok(r) = Icmpv4Repr::parse(data, false) else {
                return 0;
            };
            if let Some(b) = buf.get_mut(..r.buffer_len()) {
                r.emit(b).expect("icmpv4 emit");
                assert_eq!(Icmpv4Repr::parse(b, true), Ok(r));
            }
            1
        }
        (IPPROTO_ICMPV6, IpAddr::V6(s), IpAddr::V6(d)) => {
            let Ok(r) = Icmpv6Repr::parse(&s, &d, data, false) else {
                return 0;
            };
            if let Some(b) = buf.get_mut(..r.buffer_len()) {
                r.emit(&s, &d, b).expect("icmpv6 emit");
                assert_eq!(Icmpv6Repr::parse(&s, &d, b, true), Ok(r));
            }
            if let Ok(m) = MldRepr::parse(&s, &d, data, false) {
                if let Some(b) = buf.get_mut(..m.buffer_len()) {
                    m.emit(&s, &d, b).expect("mld emit");
                    let back = MldRepr::parse(&s, &d, b, true).expect("mld reparse");
                    assert_eq!(back, m);
                    if let MldRepr::ReportV2 { count, records } = m {
                        assert!(mld_records(records).count() <= usize::from(count));
                    }
                }
                return 2;
            }
            1
        }
        (IPPROTO_IGMP, IpAddr::V4(_), IpAddr::V4(_)) => {
            let Ok(r) = IgmpRepr::parse(data, false) else {
                return 0;
            };
            if let Some(b) = buf.get_mut(..r.buffer_len()) {
                r.emit(b).expect("igmp emit");
                assert_eq!(IgmpRepr::parse(b, true), Ok(r));
            }
            1
        }
        (IPPROTO_UDP, ..) => {
            let Ok(u) = parse_udp(data) else {
                return 0;
            };
            let len = UDP_HEADER_LEN + u.payload.len();
            let _ = verify_udp_checksum(src, dst, &data[..len]);
            if let Some(b) = buf.get_mut(..len) {
                b[UDP_HEADER_LEN..].copy_from_slice(u.payload);
                emit_udp_header(b, src, dst, u.src_port, u.dst_port, true).expect("udp emit");
                assert!(verify_udp_checksum(src, dst, b));
                let back = parse_udp(b).expect("udp reparse");
                assert_eq!(
                    (back.src_port, back.dst_port, back.payload),
                    (u.src_port, u.dst_port, u.payload)
                );
            }
            1
        }
        (IPPROTO_TCP, ..) => {
            let Ok(t) = parse_tcp(data) else {
                return 0;
            };
            assert!(t.header_len >= TCP_HEADER_LEN && t.header_len <= 60);
            let _ = verify_tcp_checksum(src, dst, data);
            let r = t.repr();
            let hl = r.header_len();
            assert!(hl <= 60 && hl % 4 == 0);
            if let Some(b) = buf.get_mut(..hl + t.payload.len()) {
                b[hl..].copy_from_slice(t.payload);
                r.emit(b, src, dst, t.payload.len(), true)
                    .expect("tcp emit");
                assert!(verify_tcp_checksum(src, dst, b));
                let back = parse_tcp(b).expect("tcp reparse");
                let mut want = r;
                // SACK blocks that did not fit were dropped from the end.
                let kept = back.options.sacks().len();
                assert!(kept <= r.options.sacks().len());
                want.options.sack_count = kept as u8;
                assert_eq!(back.repr(), want);
                assert_eq!(back.payload, t.payload);
            }
            1
        }
        _ => 0,
    }
}
