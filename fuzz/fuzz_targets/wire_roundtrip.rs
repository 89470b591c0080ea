//! Arbitrary-derived representations: emit, then parse, must give back the
//! same value (after the documented normalisations), with valid checksums.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use usnet_wire::*;

#[derive(Arbitrary, Debug)]
struct Tcp<'a> {
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u16,
    window: u16,
    urgent: u16,
    mss: Option<u16>,
    ws: Option<u8>,
    sack_perm: bool,
    sacks: [(u32, u32); 4],
    sack_count: u8,
    ts: Option<(u32, u32)>,
    /// Fast Open: cookie length selector, cookie bytes, experimental encoding.
    fo: Option<(u8, [u8; 16], bool)>,
    payload: &'a [u8],
}

#[derive(Arbitrary, Debug)]
enum Input<'a> {
    Ethernet {
        dst: [u8; 6],
        src: [u8; 6],
        ethertype: u16,
        tci: Option<u16>,
        payload: &'a [u8],
    },
    Arp {
        op: u16,
        smac: [u8; 6],
        sip: [u8; 4],
        tmac: [u8; 6],
        tip: [u8; 4],
    },
    Ipv4 {
        src: [u8; 4],
        dst: [u8; 4],
        protocol: u8,
        payload_len: u16,
        ttl: u8,
        ident: u16,
        df: bool,
        mf: bool,
        units: u16,
    },
    Ipv6 {
        src: [u8; 16],
        dst: [u8; 16],
        next: u8,
        payload_len: u16,
        hop: u8,
    },
    Frag6 {
        next: u8,
        units: u16,
        more: bool,
        ident: u32,
        rest: &'a [u8],
    },
    Icmpv4 {
        which: u8,
        kind: u8,
        code: u8,
        ident: u16,
        seq: u16,
        data: &'a [u8],
    },
    Icmpv6 {
        which: u8,
        kind: u8,
        code: u8,
        ident: u16,
        seq: u16,
        mtu: u32,
        data: &'a [u8],
        src: [u8; 16],
        dst: [u8; 16],
        target: [u8; 16],
        mac: Option<[u8; 6]>,
        mac2: Option<[u8; 6]>,
        mtu_opt: Option<u32>,
        flags: u8,
    },
    Udp {
        v6: bool,
        src: [u8; 16],
        dst: [u8; 16],
        sport: u16,
        dport: u16,
        checksum: bool,
        payload: &'a [u8],
    },
    Tcp {
        v6: bool,
        src: [u8; 16],
        dst: [u8; 16],
        tcp: Tcp<'a>,
    },
}

fn addrs(v6: bool, s: [u8; 16], d: [u8; 16]) -> (IpAddr, IpAddr) {
    if v6 {
        (Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into())
    } else {
        let s4 = Ipv4Addr::new(s[0], s[1], s[2], s[3]);
        let d4 = Ipv4Addr::new(d[0], d[1], d[2], d[3]);
        (s4.into(), d4.into())
    }
}

fn run(input: Input<'_>) {
    match input {
        Input::Ethernet {
            dst,
            src,
            ethertype: et,
            tci,
            payload,
        } => {
            if et == ethertype::VLAN || et == ethertype::QINQ {
                return; // would be read as a tag
            }
            let hl = if tci.is_some() { 18 } else { 14 };
            let mut buf = vec![0u8; hl + payload.len()];
            buf[hl..].copy_from_slice(payload);
            match tci {
                Some(t) => emit_ethernet_vlan(&mut buf, MacAddr(dst), MacAddr(src), t, et).unwrap(),
                None => emit_ethernet(&mut buf, MacAddr(dst), MacAddr(src), et).unwrap(),
            }
            let f = parse_ethernet(&buf).unwrap();
            assert_eq!(
                (f.dst, f.src, f.ethertype),
                (MacAddr(dst), MacAddr(src), et)
            );
            assert_eq!(f.vlan, tci.map(|t| t & 0xfff));
            assert_eq!((f.header_len, f.payload), (hl, payload));
        }
        Input::Arp {
            op,
            smac,
            sip,
            tmac,
            tip,
        } => {
            let r = ArpRepr {
                op: ArpOp::from(op),
                sender_mac: MacAddr(smac),
                sender_ip: sip.into(),
                target_mac: MacAddr(tmac),
                target_ip: tip.into(),
            };
            let mut buf = [0u8; ARP_LEN];
            r.emit(&mut buf).unwrap();
            assert_eq!(ArpRepr::parse(&buf), Ok(r));
        }
        Input::Ipv4 {
            src,
            dst,
            protocol,
            payload_len,
            ttl,
            ident,
            df,
            mf,
            units,
        } => {
            let r = Ipv4Repr {
                src: src.into(),
                dst: dst.into(),
                protocol,
                payload_len: usize::from(payload_len) % (65535 - 20 + 1),
                ttl,
                ident,
                dont_frag: df,
                more_frags: mf,
                frag_offset: (units & 0x1fff) * 8,
            };
            let mut buf = vec![0u8; 20 + r.payload_len];
            r.emit(&mut buf).unwrap();
            let h = parse_ipv4(&buf, true).unwrap();
            assert_eq!(h.repr(), r);
        }
        Input::Ipv6 {
            src,
            dst,
            next,
            payload_len,
            hop,
        } => {
            let r = Ipv6Repr {
                src: src.into(),
                dst: dst.into(),
                next_header: next,
                payload_len: payload_len.into(),
                hop_limit: hop,
            };
            let mut buf = vec![0u8; 40 + r.payload_len];
            r.emit(&mut buf).unwrap();
            match parse_ipv6(&buf) {
                Err(WireError::Unsupported) => assert!(next == 0 && payload_len == 0),
                other => assert_eq!(other.unwrap().repr(), r),
            }
        }
        Input::Frag6 {
            next,
            units,
            more,
            ident,
            rest,
        } => {
            let offset = (units & 0x1fff) * 8;
            let mut buf = vec![0u8; 8 + rest.len()];
            buf[8..].copy_from_slice(rest);
            emit_ipv6_fragment_header(&mut buf, next, offset, more, ident).unwrap();
            let u = skip_ext_headers(IPPROTO_FRAGMENT, &buf).unwrap();
            assert_eq!(
                u.frag,
                Some(Ipv6FragInfo {
                    offset,
                    more,
                    ident
                })
            );
            assert_eq!((u.protocol, u.offset, u.payload), (next, 8, rest));
        }
        Input::Icmpv4 {
            which,
            kind,
            code,
            ident,
            seq,
            data,
        } => {
            let r = match which % 5 {
                0 => Icmpv4Repr::EchoRequest { ident, seq, data },
                1 => Icmpv4Repr::EchoReply { ident, seq, data },
                2 => Icmpv4Repr::DstUnreachable {
                    code,
                    invoking: data,
                },
                3 => Icmpv4Repr::TimeExceeded {
                    code,
                    invoking: data,
                },
                _ if matches!(kind, 0 | 3 | 8 | 11) => return,
                _ => Icmpv4Repr::Other { kind, code },
            };
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&mut buf).unwrap();
            assert_eq!(Icmpv4Repr::parse(&buf, true), Ok(r));
        }
        Input::Icmpv6 {
            which,
            kind,
            code,
            ident,
            seq,
            mtu,
            data,
            src,
            dst,
            mut target,
            mac,
            mac2,
            mtu_opt,
            flags,
        } => {
            let mut src = Ipv6Addr::from(src);
            let dst = Ipv6Addr::from(dst);
            if target[0] == 0xff {
                target[0] = 0xfe; // NS/NA targets are never multicast
            }
            let target = Ipv6Addr::from(target);
            let r = match which % 10 {
                0 => Icmpv6Repr::EchoRequest { ident, seq, data },
                1 => Icmpv6Repr::EchoReply { ident, seq, data },
                2 => Icmpv6Repr::DstUnreachable {
                    code,
                    invoking: data,
                },
                3 => Icmpv6Repr::PacketTooBig {
                    mtu,
                    invoking: data,
                },
                4 => Icmpv6Repr::TimeExceeded {
                    code,
                    invoking: data,
                },
                5 => Icmpv6Repr::NeighborSolicit {
                    target,
                    source_mac: if src.is_unspecified() {
                        None
                    } else {
                        mac.map(MacAddr)
                    },
                },
                6 => Icmpv6Repr::NeighborAdvert {
                    router: flags & 1 != 0,
                    solicited: flags & 2 != 0 && !dst.is_multicast(),
                    override_: flags & 4 != 0,
                    target,
                    target_mac: mac.map(MacAddr),
                },
                7 => Icmpv6Repr::RouterSolicit,
                8 => {
                    let mut o = src.octets();
                    o[0] = 0xfe;
                    o[1] = 0x80 | (o[1] & 0x3f);
                    src = Ipv6Addr::from(o);
                    Icmpv6Repr::RouterAdvert {
                        hop_limit: flags,
                        router_lifetime: ident,
                        source_mac: mac2.map(MacAddr),
                        mtu: mtu_opt,
                    }
                }
                _ if matches!(kind, 1..=3 | 128 | 129 | 133..=136) => return,
                _ => Icmpv6Repr::Other { kind, code },
            };
            let mut buf = vec![0u8; r.buffer_len()];
            r.emit(&src, &dst, &mut buf).unwrap();
            assert_eq!(Icmpv6Repr::parse(&src, &dst, &buf, true), Ok(r));
        }
        Input::Udp {
            v6,
            src,
            dst,
            sport,
            dport,
            checksum,
            payload,
        } => {
            if payload.len() > 65535 - 8 {
                return;
            }
            let (s, d) = addrs(v6, src, dst);
            let mut buf = vec![0u8; 8 + payload.len()];
            buf[8..].copy_from_slice(payload);
            emit_udp_header(&mut buf, s, d, sport, dport, checksum).unwrap();
            assert_eq!(verify_udp_checksum(s, d, &buf), checksum || !v6);
            let h = parse_udp(&buf).unwrap();
            assert_eq!((h.src_port, h.dst_port, h.payload), (sport, dport, payload));
            assert!(!checksum || h.checksum != 0);
        }
        Input::Tcp {
            v6,
            src,
            dst,
            tcp: t,
        } => {
            let (s, d) = addrs(v6, src, dst);
            let r = TcpRepr {
                src_port: t.sport,
                dst_port: t.dport,
                seq: t.seq,
                ack: t.ack,
                flags: TcpFlags(t.flags & 0x1ff),
                window: t.window,
                urgent: t.urgent,
                options: TcpOptions {
                    mss: t.mss,
                    window_scale: t.ws,
                    sack_permitted: t.sack_perm,
                    sack_blocks: t.sacks,
                    sack_count: t.sack_count,
                    timestamps: t.ts,
                    // A cookie request (0) or a cookie of 4..=16 bytes (RFC 7413 §4.1.1).
                    fast_open: t.fo.map(|(sel, cookie, exp)| match sel % 14 {
                        0 => FastOpen::request(exp),
                        n => FastOpen::with_cookie(&cookie[..usize::from(n) + 3], exp),
                    }),
                },
            };
            let hl = r.header_len();
            assert!(hl.is_multiple_of(4) && (20..=60).contains(&hl));
            let mut buf = vec![0u8; hl + t.payload.len()];
            buf[hl..].copy_from_slice(t.payload);
            r.emit(&mut buf, s, d, t.payload.len(), true).unwrap();
            assert!(verify_tcp_checksum(s, d, &buf));
            let h = parse_tcp(&buf).unwrap();
            let mut want = r;
            want.options.window_scale = t.ws.map(|w| w.min(TCP_MAX_WINDOW_SCALE));
            let kept = h.options.sacks().len();
            assert!(kept <= r.options.sacks().len());
            assert_eq!(h.options.sacks(), &r.options.sacks()[..kept]);
            want.options.sack_count = kept as u8;
            assert_eq!(h.repr(), want);
            assert_eq!((h.header_len, h.payload), (hl, t.payload));
        }
    }
}

fuzz_target!(|input: Input<'_>| run(input));
