//! Raw ICMP sockets ([`DgramProto::Raw`]): what `traceroute -I`, `fping`, `mtr`
//! and `ping` on a raw socket rely on. A copy of every ICMP message of the
//! socket's family, which the stack still handles itself; an IPv4 copy with its
//! IP header, an IPv6 one without; the filter; what a raw socket sends.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

mod common;

use common::icmp::{icmp_for, Says, ROUTER4, ROUTER6};
use common::{cfg, sa};
use usnet_socket_api::errno::EHOSTUNREACH;
use usnet_stack::sim::{Faults, Hop, SimNet};
use usnet_stack::{
    DgramProto, Families, IcmpFilter, IpFamily, SocketHandle, Stack, RAW_PORT_V4, RAW_PORT_V6,
};
use usnet_wire as wire;

fn pair() -> SimNet {
    let mut net = SimNet::new(5, Faults::default());
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    net
}

fn settle(net: &mut SimNet) {
    net.run_until(Duration::from_millis(100), |_| false);
}

fn raw(s: &mut Stack, any: &str) -> SocketHandle {
    s.dgram_bind(DgramProto::Raw, sa(any), Families::Both, false)
        .unwrap()
}

/// Every message waiting on `h`, with where it came from.
fn drain(s: &mut Stack, h: SocketHandle) -> Vec<(Vec<u8>, SocketAddr)> {
    let mut out = Vec::new();
    loop {
        let mut buf = vec![0u8; 65536];
        match s.udp_recv_from(h, &mut buf) {
            Ok((n, from)) => {
                buf.truncate(n);
                out.push((buf, from));
            }
            Err(_) => return out,
        }
    }
}

/// An ICMPv4 echo request with its checksum, as an application builds it.
fn echo_request_v4(ident: u16, seq: u16, data: &[u8]) -> Vec<u8> {
    let mut m = vec![8, 0, 0, 0];
    m.extend_from_slice(&ident.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(data);
    let c = wire::finish(wire::sum(&m));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

#[test]
fn an_ipv4_raw_socket_reads_every_icmp_message_with_its_header_and_sends_its_own() {
    let mut net = pair();
    let a = raw(net.stack_mut(0), "0.0.0.0:0");
    let a6 = raw(net.stack_mut(0), "[::]:0");
    let b = raw(net.stack_mut(1), "0.0.0.0:0");
    assert_eq!(net.stack(0).udp_local_addr(a).unwrap().port(), RAW_PORT_V4);
    assert_eq!(net.stack(0).udp_local_addr(a6).unwrap().port(), RAW_PORT_V6);

    // The application's own echo request, checksum and all; the peer's stack
    // answers it, and its raw socket sees the request too.
    let req = echo_request_v4(0x4242, 7, b"raw probe");
    let s = net.stack_mut(0);
    assert_eq!(s.udp_send_to(a, &req, sa("10.0.0.2:0")).unwrap(), req.len());
    assert_eq!(s.counters().icmp4_tx_raw, 1);
    settle(&mut net);

    let seen = drain(net.stack_mut(1), b);
    assert_eq!(seen.len(), 1, "the request, once");
    let (pkt, from) = &seen[0];
    assert_eq!(*from, sa("10.0.0.1:0"));
    assert_eq!(pkt[0] >> 4, 4, "an IPv4 header first");
    let ihl = usize::from(pkt[0] & 15) * 4;
    assert_eq!(pkt[9], wire::IPPROTO_ICMP);
    assert_eq!(usize::from(u16::from_be_bytes([pkt[2], pkt[3]])), pkt.len());
    assert_eq!(&pkt[ihl..], &req[..], "the message as sent");

    let got = drain(net.stack_mut(0), a);
    let replies: Vec<_> = got.iter().filter(|(p, _)| p[20] == 0).collect();
    assert_eq!(replies.len(), 1, "the reply the peer's stack sent: {got:?}");
    let (pkt, from) = replies[0];
    assert_eq!(*from, sa("10.0.0.2:0"));
    assert_eq!(&pkt[12..16], &[10, 0, 0, 2], "source in the header");
    assert_eq!(&pkt[24..], &req[4..], "identifier, sequence and data kept");
    assert!(
        drain(net.stack_mut(0), a6).is_empty(),
        "IPv6's socket sees no IPv4"
    );
    assert_eq!(net.stack(0).counters().icmp4_rx_echo_reply, 1);

    // A filter that blocks echo replies; the echo request the peer sends still
    // passes.
    let mut f = IcmpFilter::default();
    f.0[0] = 1 << 0;
    net.stack_mut(0).raw_set_icmp_filter(a, f).unwrap();
    let s = net.stack_mut(0);
    s.udp_send_to(a, &echo_request_v4(1, 1, b"x"), sa("10.0.0.2:0"))
        .unwrap();
    let p = net.stack_mut(1).ping_open();
    net.stack_mut(1)
        .ping_send(p, "10.0.0.1".parse().unwrap(), 3, b"from b")
        .unwrap();
    settle(&mut net);
    let got = drain(net.stack_mut(0), a);
    let types: Vec<u8> = got.iter().map(|(p, _)| p[20]).collect();
    assert_eq!(types, vec![8], "only the peer's request");
    assert_eq!(net.stack_mut(1).ping_recv(p).unwrap().seq, 3, "answered");

    // Connected to another address, it reads nothing from the peer.
    let c = raw(net.stack_mut(0), "0.0.0.0:0");
    net.stack_mut(0).udp_connect(c, sa("10.0.0.9:0")).unwrap();
    net.stack_mut(1)
        .ping_send(p, "10.0.0.1".parse().unwrap(), 4, b"again")
        .unwrap();
    settle(&mut net);
    assert!(drain(net.stack_mut(0), c).is_empty());
    assert_eq!(drain(net.stack_mut(0), a).len(), 1);
    // Nor does it take the other family's address.
    assert!(net
        .stack_mut(0)
        .udp_send_to(a, &req, sa("[fd00::2]:0"))
        .is_err());
}

#[test]
fn an_ipv6_raw_socket_reads_messages_without_a_header_and_the_stack_sums_what_it_sends() {
    let mut net = pair();
    let a = raw(net.stack_mut(0), "[::]:0");
    let b = raw(net.stack_mut(1), "[fd00::2]:0");
    // Echo request with no checksum: the stack computes it (the peer's stack
    // answers only a message whose checksum verifies).
    let mut req = vec![128, 0, 0, 0, 0x12, 0x34, 0, 9];
    req.extend_from_slice(b"six");
    let s = net.stack_mut(0);
    s.udp_send_to(a, &req, sa("[fd00::2]:0")).unwrap();
    settle(&mut net);
    assert_eq!(net.stack(1).counters().icmp6_rx_bad_checksum, 0);
    assert_eq!(net.stack(1).counters().icmp6_rx_echo_request, 1);

    let seen = drain(net.stack_mut(1), b);
    let requests: Vec<_> = seen.iter().filter(|(m, _)| m[0] == 128).collect();
    assert_eq!(requests.len(), 1);
    let (m, from) = requests[0];
    assert_eq!(from.ip(), "fd00::1".parse::<IpAddr>().unwrap());
    assert_eq!(&m[4..], &req[4..], "no IPv6 header before the message");
    let src: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    let dst: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    let sum = wire::pseudo_v6(&src, &dst, wire::IPPROTO_ICMPV6, m.len() as u32) + wire::sum(m);
    assert_eq!(wire::fold(sum), 0xffff, "a checksum that verifies");

    // Neighbour discovery reaches raw sockets too, unless filtered out: block
    // every type but echo reply (ping6's filter).
    let got = drain(net.stack_mut(0), a);
    assert!(got.iter().any(|(m, _)| m[0] == 129), "the reply: {got:?}");
    let mut f = IcmpFilter([u32::MAX; 8]);
    f.0[129 / 32] &= !(1 << (129 % 32));
    net.stack_mut(0).raw_set_icmp_filter(a, f).unwrap();
    assert_eq!(net.stack(0).raw_icmp_filter(a).unwrap(), f);
    let p = net.stack_mut(1).ping_open();
    net.stack_mut(1)
        .ping_send(p, "fd00::1".parse().unwrap(), 1, b"request")
        .unwrap();
    net.stack_mut(0)
        .udp_send_to(a, &req, sa("[fd00::2]:0"))
        .unwrap();
    settle(&mut net);
    let types: Vec<u8> = drain(net.stack_mut(0), a)
        .iter()
        .map(|(m, _)| m[0])
        .collect();
    assert_eq!(types, vec![129]);
    assert!(net.stack(0).counters().raw_rx_delivered >= 2);
    // A UDP socket has no filter.
    let u = net.stack_mut(0).udp_bind(sa("[::]:0")).unwrap();
    assert!(net.stack_mut(0).raw_set_icmp_filter(u, f).is_err());
    // Too short to carry a checksum.
    assert!(net
        .stack_mut(0)
        .udp_send_to(a, &[128, 0], sa("[fd00::2]:0"))
        .is_err());
}

#[test]
fn raw_copies_of_a_reassembled_message_carry_one_whole_header() {
    let mut net = pair();
    let b = raw(net.stack_mut(1), "0.0.0.0:0");
    // An echo request larger than the MTU: fragmented by stack 0, reassembled by
    // stack 1, whose raw socket reads one packet.
    let data = vec![0x5a; 3000];
    let req = echo_request_v4(9, 1, &data);
    let a = raw(net.stack_mut(0), "0.0.0.0:0");
    net.stack_mut(0)
        .udp_send_to(a, &req, sa("10.0.0.2:0"))
        .unwrap();
    settle(&mut net);
    let seen = drain(net.stack_mut(1), b);
    assert_eq!(seen.len(), 1);
    let pkt = &seen[0].0;
    let ihl = usize::from(pkt[0] & 15) * 4;
    assert_eq!(usize::from(u16::from_be_bytes([pkt[2], pkt[3]])), pkt.len());
    assert_eq!(&pkt[6..8], &[0, 0], "no fragment fields");
    assert_eq!(
        wire::fold(wire::sum(&pkt[..ihl])),
        0xffff,
        "header checksum"
    );
    assert_eq!(&pkt[ihl..], &req[..]);
    // And the stack answered it (a reply as large, fragmented back).
    let got = drain(net.stack_mut(0), a);
    assert!(got
        .iter()
        .any(|(p, _)| p[20] == 0 && p.len() == 20 + req.len()));
}

/// A router answers every echo request stack 0 sends with time exceeded.
fn ttl_expires(net: &mut SimNet) {
    net.middlebox = Some(Box::new(|from: usize, frame: &[u8]| {
        let Ok(eth) = wire::parse_ethernet(frame) else {
            return Hop::Pass;
        };
        let echo = match eth.ethertype {
            wire::ethertype::IPV4 => wire::parse_ipv4(eth.payload, false)
                .is_ok_and(|ip| ip.protocol == wire::IPPROTO_ICMP && ip.payload[0] == 8),
            wire::ethertype::IPV6 => wire::parse_ipv6(eth.payload)
                .is_ok_and(|ip| ip.next_header == wire::IPPROTO_ICMPV6 && ip.payload[0] == 128),
            _ => false,
        };
        if from == 0 && echo {
            Hop::Answer(icmp_for(frame, Says::TimeExceeded, |_| {}))
        } else {
            Hop::Pass
        }
    }));
}

/// traceroute -I's way: a raw socket connected to the destination reads a
/// router's time exceeded from its error queue (IP_RECVERR), as Linux's
/// `raw_icmp_error` queues it; an unconnected one reads the error message's
/// copy, and without IP_RECVERR nothing becomes pending (a soft error).
#[test]
fn errors_about_what_a_raw_socket_sent_reach_its_error_queue() {
    for (peer, fam, router, te_type) in [
        ("10.0.0.2", IpFamily::V4, IpAddr::V4(ROUTER4), 11u8),
        ("fd00::2", IpFamily::V6, IpAddr::V6(ROUTER6), 3),
    ] {
        let peer: IpAddr = peer.parse().unwrap();
        let mut net = pair();
        ttl_expires(&mut net);
        let any = if peer.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let s = net.stack_mut(0);
        let traced = raw(s, any);
        s.udp_connect(traced, SocketAddr::new(peer, 0)).unwrap();
        s.udp_set_recverr(traced, fam, true).unwrap();
        let plain = raw(s, any);
        let req = if peer.is_ipv4() {
            echo_request_v4(0x77, 1, b"probe")
        } else {
            let mut m = vec![128, 0, 0, 0, 0, 0x77, 0, 1];
            m.extend_from_slice(b"probe");
            m
        };
        s.udp_send(traced, &req).unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        // Connected to the destination: the router's message is not its copy
        // (the destination's own neighbour discovery is).
        let skip = if peer.is_ipv4() { 20 } else { 0 };
        let copies = drain(s, traced);
        assert!(!copies.iter().any(|(m, _)| m[skip] == te_type), "{peer}");
        assert_eq!(s.udp_take_error(traced).unwrap(), Some(EHOSTUNREACH));
        let (r, _) = s.udp_errqueue_pop(traced).unwrap().expect("a report");
        assert_eq!((r.icmp_type, r.offender), (te_type, Some(router)));
        assert_eq!(r.dest, SocketAddr::new(peer, 0));
        // The whole quoted message (IPv6's with the checksum the stack wrote).
        assert_eq!((&r.payload[..2], &r.payload[4..]), (&req[..2], &req[4..]));
        // Not connected, no IP_RECVERR: the copy, and no pending error.
        let copies = drain(s, plain);
        assert!(copies
            .iter()
            .any(|(m, from)| m[skip] == te_type && from.ip() == router));
        assert_eq!(s.udp_take_error(plain).unwrap(), None);
    }
}
