//! UDP multicast in one stack, frame by frame: IGMPv2 and MLDv2 reports and
//! leaves on the link, queries answered, delivery to every member socket on the
//! port (and not to others), sending to a group (MAC, TTL/hop limit, loopback).

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use common::{cfg, sa};
use usnet_stack::{Families, Instant, SocketHandle, Stack, UdpSendMeta};
use usnet_wire::{self as wire, IgmpRepr, Ipv4Repr, Ipv6Repr, MacAddr, MldRepr};

const PEER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 9]);

/// Stack 1 of the shared configurations: 10.0.0.1/24 and fd00::1/64.
fn stack() -> Stack {
    Stack::new(cfg(1)).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Every frame the stack queued for the device.
fn sent(s: &mut Stack) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(f) = s.dequeue_tx() {
        let mut b = Vec::new();
        s.pool().copy_chain(&f, &mut b);
        s.pool_mut().free(f);
        out.push(b);
    }
    out
}

fn feed(s: &mut Stack, frame: &[u8], at: Instant) {
    let b = s.pool_mut().alloc_from(frame).unwrap();
    s.receive(b);
    s.poll(at);
}

fn group_mac(g: IpAddr) -> MacAddr {
    match g {
        IpAddr::V4(a) => {
            let o = a.octets();
            MacAddr([0x01, 0, 0x5e, o[1] & 0x7f, o[2], o[3]])
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
        }
    }
}

/// An Ethernet frame from the peer carrying an IPv4 packet.
fn v4_frame(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, ttl: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20];
    wire::emit_ethernet(
        &mut f,
        group_mac(IpAddr::V4(dst)),
        PEER_MAC,
        wire::ethertype::IPV4,
    )
    .unwrap();
    Ipv4Repr {
        src,
        dst,
        protocol: proto,
        payload_len: l4.len(),
        ttl,
        ident: 1,
        dont_frag: false,
        more_frags: false,
        frag_offset: 0,
    }
    .emit(&mut f[14..])
    .unwrap();
    f.extend_from_slice(l4);
    f
}

fn v6_frame(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hops: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 40];
    wire::emit_ethernet(
        &mut f,
        group_mac(IpAddr::V6(dst)),
        PEER_MAC,
        wire::ethertype::IPV6,
    )
    .unwrap();
    Ipv6Repr {
        src,
        dst,
        next_header: next,
        payload_len: l4.len(),
        hop_limit: hops,
    }
    .emit(&mut f[14..])
    .unwrap();
    f.extend_from_slice(l4);
    f
}

fn udp(from: SocketAddr, to: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut l4 = vec![0u8; 8];
    l4.extend_from_slice(payload);
    wire::emit_udp_header(&mut l4, from.ip(), to.ip(), from.port(), to.port(), true).unwrap();
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => v4_frame(s, d, wire::IPPROTO_UDP, 1, &l4),
        (IpAddr::V6(s), IpAddr::V6(d)) => v6_frame(s, d, wire::IPPROTO_UDP, 1, &l4),
        _ => unreachable!(),
    }
}

/// The IGMP message in `f`, with its IPv4 header (checked: TTL 1, Router Alert).
fn igmp_of(f: &[u8]) -> Option<(MacAddr, Ipv4Addr, IgmpRepr)> {
    let eth = wire::parse_ethernet(f).ok()?;
    let ip4 = wire::parse_ipv4(eth.payload, true).ok()?;
    if ip4.protocol != wire::IPPROTO_IGMP {
        return None;
    }
    assert_eq!(ip4.ttl, 1, "IGMP goes out with TTL 1");
    assert_eq!(ip4.header_len, 24);
    assert_eq!(
        &eth.payload[20..24],
        &wire::IPV4_ROUTER_ALERT,
        "Router Alert"
    );
    assert_eq!(ip4.src, Ipv4Addr::new(10, 0, 0, 1));
    Some((eth.dst, ip4.dst, IgmpRepr::parse(ip4.payload, true).ok()?))
}

/// The MLDv2 records of the report in `f` (checked: hop limit 1, Router Alert,
/// link-local source, to ff02::16 on 33:33:00:00:00:16).
fn mld_of(f: &[u8]) -> Option<Vec<(u8, Ipv6Addr)>> {
    let eth = wire::parse_ethernet(f).ok()?;
    let ip6 = wire::parse_ipv6(eth.payload).ok()?;
    if ip6.next_header != wire::IPPROTO_HOPOPTS {
        return None;
    }
    assert_eq!(ip6.hop_limit, 1);
    assert_eq!(
        &ip6.payload[..8],
        &wire::mld_hop_by_hop(wire::IPPROTO_ICMPV6)
    );
    assert_eq!(ip6.dst, wire::MLDV2_ROUTERS);
    assert_eq!(eth.dst, MacAddr([0x33, 0x33, 0, 0, 0, 0x16]));
    assert_eq!(ip6.src.segments()[0], 0xfe80, "from the link-local address");
    match MldRepr::parse(&ip6.src, &ip6.dst, &ip6.payload[8..], true).ok()? {
        MldRepr::ReportV2 { records, .. } => Some(wire::mld_records(records).collect()),
        _ => None,
    }
}

fn recv(s: &mut Stack, h: SocketHandle) -> Option<(Vec<u8>, SocketAddr)> {
    let mut b = [0u8; 2048];
    s.udp_recv_from(h, &mut b)
        .ok()
        .map(|(n, a)| (b[..n].to_vec(), a))
}

const G4: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

#[test]
fn igmp_report_on_first_join_and_leave_on_last_leave() {
    let mut s = stack();
    let a = s
        .udp_bind_reuse(sa("0.0.0.0:5000"), Families::Both, true)
        .unwrap();
    let b = s
        .udp_bind_reuse(sa("0.0.0.0:5000"), Families::Both, true)
        .unwrap();
    s.udp_join_multicast(a, IpAddr::V4(G4)).unwrap();
    let f = sent(&mut s);
    assert_eq!(f.len(), 1, "one report, no ARP");
    assert_eq!(
        igmp_of(&f[0]),
        Some((
            group_mac(IpAddr::V4(G4)),
            G4,
            IgmpRepr::ReportV2 { group: G4 }
        ))
    );
    // A second socket joining: the interface is a member already.
    s.udp_join_multicast(b, IpAddr::V4(G4)).unwrap();
    assert!(sent(&mut s).is_empty());
    assert_eq!(s.multicast_groups(), vec![(IpAddr::V4(G4), 2)]);
    // Joining twice, leaving what was not joined: Linux's errors.
    assert_eq!(
        s.udp_join_multicast(a, IpAddr::V4(G4)).unwrap_err().errno(),
        usnet_socket_api::errno::EADDRINUSE
    );
    assert!(s.udp_join_multicast(a, ip("10.0.0.9")).is_err());
    assert!(s.udp_leave_multicast(a, ip("239.9.9.9")).is_err());
    s.udp_leave_multicast(a, IpAddr::V4(G4)).unwrap();
    assert!(sent(&mut s).is_empty(), "b is still a member");
    // Closing the last member leaves the group.
    s.close(b).unwrap();
    let f = sent(&mut s);
    assert_eq!(f.len(), 1);
    let leave = igmp_of(&f[0]).unwrap();
    assert_eq!(
        leave,
        (
            MacAddr([0x01, 0, 0x5e, 0, 0, 2]),
            Ipv4Addr::new(224, 0, 0, 2),
            IgmpRepr::Leave { group: G4 }
        )
    );
    assert!(s.multicast_groups().is_empty());
    let c = s.counters();
    assert_eq!((c.igmp_tx_report, c.igmp_tx_leave), (1, 1));
    assert_eq!((c.mcast_joins, c.mcast_leaves), (1, 1));
}

#[test]
fn a_datagram_to_the_group_reaches_every_member_on_the_port_and_no_one_else() {
    let mut s = stack();
    let bind = |s: &mut Stack, a: &str| s.udp_bind_reuse(sa(a), Families::Both, true).unwrap();
    let m1 = bind(&mut s, "0.0.0.0:5000");
    let m2 = bind(&mut s, "239.1.2.3:5000");
    // Not a member, IP_MULTICAST_ALL on (Linux's default): gets it too.
    let all = bind(&mut s, "0.0.0.0:5000");
    // Not a member, IP_MULTICAST_ALL off: only its own groups.
    let own = bind(&mut s, "0.0.0.0:5000");
    s.udp_set_multicast_all(own, false).unwrap();
    // A member on another port; a socket bound to a unicast address on the port;
    // a socket bound to another group on the port.
    let other_port = bind(&mut s, "0.0.0.0:5001");
    let unicast = bind(&mut s, "10.0.0.1:5000");
    let other_group = bind(&mut s, "239.1.2.4:5000");
    for h in [m1, m2, other_port] {
        s.udp_join_multicast(h, IpAddr::V4(G4)).unwrap();
    }
    sent(&mut s);
    let from = sa("10.0.0.9:4000");
    feed(
        &mut s,
        &udp(from, sa("239.1.2.3:5000"), b"hello group"),
        Instant::from_millis(1),
    );
    for h in [m1, m2, all] {
        assert_eq!(recv(&mut s, h), Some((b"hello group".to_vec(), from)));
        assert_eq!(recv(&mut s, h), None, "one copy each");
    }
    for h in [own, other_port, unicast, other_group] {
        assert_eq!(recv(&mut s, h), None);
    }
    assert_eq!(s.counters().udp_rx_mcast_delivered, 3);
    // A group the interface did not join is dropped at IP, and counted.
    feed(
        &mut s,
        &udp(from, sa("239.9.9.9:5000"), b"x"),
        Instant::from_millis(2),
    );
    for h in [m1, m2, all, own] {
        assert_eq!(recv(&mut s, h), None);
    }
    assert_eq!(s.counters().mcast_rx_not_member, 1);
    // Once every member left, the group's datagrams are not for us.
    for h in [m1, m2, other_port] {
        s.udp_leave_multicast(h, IpAddr::V4(G4)).unwrap();
    }
    feed(
        &mut s,
        &udp(from, sa("239.1.2.3:5000"), b"y"),
        Instant::from_millis(3),
    );
    assert_eq!(recv(&mut s, all), None);
    assert_eq!(s.counters().mcast_rx_not_member, 2);
    // Unicast to the shared port still goes to one socket.
    feed(
        &mut s,
        &udp(from, sa("10.0.0.1:5000"), b"u"),
        Instant::from_millis(4),
    );
    let got: usize = [m1, all, own, unicast]
        .iter()
        .map(|&h| recv(&mut s, h).is_some() as usize)
        .sum();
    assert_eq!(got, 1);
}

#[test]
fn queries_are_answered_within_their_maximum_response_time() {
    let mut s = stack();
    let h = s.udp_bind(sa("0.0.0.0:5000")).unwrap();
    s.udp_join_multicast(h, IpAddr::V4(G4)).unwrap();
    s.udp_join_multicast(h, ip("239.5.5.5")).unwrap();
    assert_eq!(sent(&mut s).len(), 2);
    // A general query to 224.0.0.1, max response 1 s.
    let mut q = [0u8; 8];
    IgmpRepr::Query {
        max_resp_code: 10,
        group: Ipv4Addr::UNSPECIFIED,
        v3: false,
    }
    .emit(&mut q)
    .unwrap();
    let router = Ipv4Addr::new(10, 0, 0, 254);
    let t0 = Instant::from_millis(5);
    feed(
        &mut s,
        &v4_frame(router, Ipv4Addr::new(224, 0, 0, 1), 2, 1, &q),
        t0,
    );
    assert_eq!(s.counters().igmp_rx_query, 1);
    let due = s.poll_at().expect("a report is scheduled");
    assert!(due <= t0 + Duration::from_secs(1), "{due:?}");
    let mut groups = Vec::new();
    let mut t = t0;
    while t <= t0 + Duration::from_millis(1001) {
        s.poll(t);
        for f in sent(&mut s) {
            if let Some((_, dst, IgmpRepr::ReportV2 { group })) = igmp_of(&f) {
                assert_eq!(dst, group, "a report goes to its group");
                groups.push(group);
            }
        }
        t = t + Duration::from_millis(1);
    }
    groups.sort();
    assert_eq!(groups, vec![G4, Ipv4Addr::new(239, 5, 5, 5)]);
    // A group-specific query (an IGMPv3 one, read as v2) for G4 only, at G4.
    let mut q3 = [0u8; 12];
    IgmpRepr::Query {
        max_resp_code: 5,
        group: G4,
        v3: true,
    }
    .emit(&mut q3)
    .unwrap();
    feed(&mut s, &v4_frame(router, G4, 2, 1, &q3), t);
    let mut groups = Vec::new();
    let end = t + Duration::from_millis(501);
    while t <= end {
        s.poll(t);
        for f in sent(&mut s) {
            if let Some((_, _, IgmpRepr::ReportV2 { group })) = igmp_of(&f) {
                groups.push(group);
            }
        }
        t = t + Duration::from_millis(1);
    }
    assert_eq!(groups, vec![G4]);
    // The repeat of the unsolicited reports comes within 10 s as well.
    let before = s.counters().igmp_tx_report;
    s.poll(t + Duration::from_secs(11));
    assert!(s.counters().igmp_tx_report >= before);
}

#[test]
fn sending_to_a_group_uses_its_mac_the_socket_ttl_and_loops_back_to_members() {
    let mut s = stack();
    let tx = s.udp_bind(sa("0.0.0.0:6000")).unwrap();
    let to = sa("239.1.2.3:5000");
    s.udp_send_to(tx, b"one", to).unwrap();
    let f = sent(&mut s);
    assert_eq!(f.len(), 1, "no ARP for a group");
    let eth = wire::parse_ethernet(&f[0]).unwrap();
    assert_eq!(eth.dst, MacAddr([0x01, 0, 0x5e, 0x01, 0x02, 0x03]));
    let ip4 = wire::parse_ipv4(eth.payload, true).unwrap();
    assert_eq!(
        (ip4.dst, ip4.ttl),
        (G4, 1),
        "IP_MULTICAST_TTL defaults to 1"
    );
    assert!(wire::verify_udp_checksum(
        IpAddr::V4(ip4.src),
        IpAddr::V4(ip4.dst),
        ip4.payload
    ));
    // High bit of the second octet dropped from the MAC: 239.129.2.3 → 01:00:5e:01:02:03.
    s.udp_send_to(tx, b"x", sa("239.129.2.3:5000")).unwrap();
    let f = sent(&mut s);
    assert_eq!(
        wire::parse_ethernet(&f[0]).unwrap().dst,
        MacAddr([1, 0, 0x5e, 1, 2, 3])
    );
    s.udp_set_multicast_ttl(tx, true, 7).unwrap();
    s.udp_send_to(tx, b"two", to).unwrap();
    let f = sent(&mut s);
    let ip4 = wire::parse_ipv4(&f[0][14..], true).unwrap();
    assert_eq!(ip4.ttl, 7);
    // A local member: loopback delivers a copy (the sender's own socket too, had it
    // joined), and the frame still goes out.
    let rx = s.udp_bind(sa("0.0.0.0:5000")).unwrap();
    s.udp_join_multicast(rx, IpAddr::V4(G4)).unwrap();
    sent(&mut s);
    s.udp_send_to(tx, b"three", to).unwrap();
    assert_eq!(sent(&mut s).len(), 1);
    s.poll(Instant::from_millis(1));
    assert_eq!(
        recv(&mut s, rx),
        Some((b"three".to_vec(), sa("10.0.0.1:6000")))
    );
    assert_eq!(s.counters().udp_tx_mcast_looped, 1);
    s.udp_set_multicast_loop(tx, true, false).unwrap();
    s.udp_send_to(tx, b"four", to).unwrap();
    assert_eq!(sent(&mut s).len(), 1);
    s.poll(Instant::from_millis(2));
    assert_eq!(recv(&mut s, rx), None, "IP_MULTICAST_LOOP off");
    // IP_MULTICAST_IF: an address the stack does not have means its one interface.
    s.udp_set_multicast_if(tx, Some(Ipv4Addr::new(192, 168, 9, 9)))
        .unwrap();
    s.udp_set_multicast_loop(tx, true, true).unwrap();
    s.udp_send_to(tx, b"five", to).unwrap();
    let f = sent(&mut s);
    let ip4 = wire::parse_ipv4(&f[0][14..], true).unwrap();
    assert_eq!(ip4.src, Ipv4Addr::new(10, 0, 0, 1));
}

#[test]
fn ipv6_joins_report_with_mld_and_datagrams_reach_members() {
    let mut s = stack();
    let g = ip("ff12::1234");
    let a = s
        .udp_bind_reuse(sa("[::]:5000"), Families::Both, true)
        .unwrap();
    let b = s
        .udp_bind_reuse(sa("[::]:5000"), Families::V6, true)
        .unwrap();
    let own = s
        .udp_bind_reuse(sa("[::]:5000"), Families::Both, true)
        .unwrap();
    s.udp_set_multicast_all(own, false).unwrap();
    s.udp_join_multicast(a, g).unwrap();
    let f = sent(&mut s);
    assert_eq!(f.len(), 1);
    assert_eq!(
        mld_of(&f[0]),
        Some(vec![(
            wire::mld_record::CHANGE_TO_EXCLUDE,
            "ff12::1234".parse().unwrap()
        )])
    );
    s.udp_join_multicast(b, g).unwrap();
    assert!(sent(&mut s).is_empty());
    let from = sa("[fe80::9]:4000");
    feed(
        &mut s,
        &udp(from, sa("[ff12::1234]:5000"), b"six"),
        Instant::from_millis(1),
    );
    assert_eq!(recv(&mut s, a), Some((b"six".to_vec(), from)));
    assert_eq!(recv(&mut s, b), Some((b"six".to_vec(), from)));
    assert_eq!(recv(&mut s, own), None);
    // Another group with non-link-local scope is not accepted any more.
    feed(
        &mut s,
        &udp(from, sa("[ff0e::99]:5000"), b"no"),
        Instant::from_millis(2),
    );
    assert_eq!(recv(&mut s, a), None);
    // An MLDv1 general query (hop limit 1, link-local source) is answered with an
    // MLDv2 current-state report.
    let router: Ipv6Addr = "fe80::1:2".parse().unwrap();
    let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
    let q = MldRepr::Query {
        max_resp_code: 100,
        group: Ipv6Addr::UNSPECIFIED,
        v2: false,
    };
    let mut qb = [0u8; 24];
    q.emit(&router, &all_nodes, &mut qb).unwrap();
    // With hop limit 64 it is refused.
    feed(
        &mut s,
        &v6_frame(router, all_nodes, 58, 64, &qb),
        Instant::from_millis(3),
    );
    assert_eq!(s.counters().mld_rx_malformed, 1);
    feed(
        &mut s,
        &v6_frame(router, all_nodes, 58, 1, &qb),
        Instant::from_millis(3),
    );
    assert_eq!(s.counters().mld_rx_query, 1);
    let mut recs = Vec::new();
    for t in 3..=104 {
        s.poll(Instant::from_millis(t));
        recs.extend(sent(&mut s).iter().filter_map(|f| mld_of(f)).flatten());
    }
    assert_eq!(
        recs,
        vec![(
            wire::mld_record::MODE_IS_EXCLUDE,
            "ff12::1234".parse().unwrap()
        )]
    );
    // Sending: 33:33 + the low 32 bits, hop limit from IPV6_MULTICAST_HOPS.
    let tx = s.udp_bind(sa("[::]:6000")).unwrap();
    s.udp_set_multicast_ttl(tx, false, 3).unwrap();
    s.udp_set_multicast_loop(tx, false, false).unwrap();
    s.udp_send_to(tx, b"out", sa("[ff12::1234]:5000")).unwrap();
    let f = sent(&mut s);
    assert_eq!(f.len(), 1);
    let eth = wire::parse_ethernet(&f[0]).unwrap();
    assert_eq!(eth.dst, MacAddr([0x33, 0x33, 0, 0, 0x12, 0x34]));
    assert_eq!(wire::parse_ipv6(eth.payload).unwrap().hop_limit, 3);
    // Leaving: the last one out sends a CHANGE_TO_INCLUDE record.
    s.udp_leave_multicast(a, g).unwrap();
    assert!(sent(&mut s).is_empty());
    s.close(b).unwrap();
    let f = sent(&mut s);
    assert_eq!(
        mld_of(&f[0]),
        Some(vec![(
            wire::mld_record::CHANGE_TO_INCLUDE,
            "ff12::1234".parse().unwrap()
        )])
    );
    assert_eq!(
        (s.counters().mld_tx_report, s.counters().mld_tx_leave),
        (2, 1)
    );
}

#[test]
fn a_connected_socket_a_full_queue_and_a_bad_checksum_each_lose_only_their_copy() {
    let mut s = stack();
    let bind = |s: &mut Stack, at: &str| s.udp_bind_reuse(sa(at), Families::Both, true).unwrap();
    // The connected ones are bound to the group: connecting a socket bound to the
    // wildcard gives it the route's source address, and then (as on Linux, whose
    // `__udp_is_mcast_sock` compares `inet_rcv_saddr`) it takes no group's copies.
    let (open, full) = (bind(&mut s, "0.0.0.0:5000"), bind(&mut s, "0.0.0.0:5000"));
    let (conn_other, conn_peer) = (
        bind(&mut s, "239.1.2.3:5000"),
        bind(&mut s, "239.1.2.3:5000"),
    );
    let from = sa("10.0.0.9:4000");
    s.udp_connect(conn_other, sa("10.0.0.8:4000")).unwrap();
    s.udp_connect(conn_peer, from).unwrap();
    s.udp_set_recv_buffer(full, 2048).unwrap();
    s.udp_join_multicast(open, IpAddr::V4(G4)).unwrap();
    sent(&mut s);
    let big = vec![7u8; 1400];
    feed(
        &mut s,
        &udp(from, sa("239.1.2.3:5000"), &big),
        Instant::from_millis(1),
    );
    feed(
        &mut s,
        &udp(from, sa("239.1.2.3:5000"), &big),
        Instant::from_millis(2),
    );
    // `full` holds one 1400-byte datagram in 2048 bytes: the second copy is dropped
    // for it alone.
    for (h, n) in [(open, 2), (full, 1), (conn_peer, 2), (conn_other, 0)] {
        let mut got = 0;
        while recv(&mut s, h).is_some() {
            got += 1;
        }
        assert_eq!(got, n);
    }
    assert_eq!(s.counters().udp_rx_queue_full, 1);
    // A corrupted datagram reaches no one.
    let mut bad = udp(from, sa("239.1.2.3:5000"), b"payload");
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    feed(&mut s, &bad, Instant::from_millis(3));
    assert_eq!(recv(&mut s, open), None);
    assert_eq!(s.counters().udp_rx_bad_checksum, 1);
}

/// `f` with the IPv4 TOS byte set (and the header checksum made right again).
fn with_tos(mut f: Vec<u8>, tos: u8) -> Vec<u8> {
    f[15] = tos;
    f[24..26].fill(0);
    let sum: u32 = f[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    f[24..26].copy_from_slice(&(!(folded as u16)).to_be_bytes());
    f
}

/// What `IP_PKTINFO`, `IP_RECVTTL` and `IP_RECVTOS` report: each datagram keeps
/// where it was sent, its TTL and TOS; a reply's source is that address, or for a
/// group our address toward the sender; a send may choose any of our addresses as
/// its source and no other.
#[test]
fn a_datagram_keeps_its_destination_ttl_and_tos_and_a_send_may_choose_its_source() {
    let mut c = common::cfg(1);
    c.addrs.push("10.0.1.1/24".parse().unwrap());
    let mut s = Stack::new(c).unwrap();
    let h = s
        .udp_bind_reuse(sa("0.0.0.0:5000"), Families::Both, true)
        .unwrap();
    s.udp_join_multicast(h, IpAddr::V4(G4)).unwrap();
    sent(&mut s);
    let from = sa("10.0.1.9:4000");
    let mut unicast = udp(from, sa("10.0.1.1:5000"), b"to us");
    unicast[0..6].copy_from_slice(&s.mac().0);
    unicast[22] = 33; // TTL; `with_tos` makes the checksum right
    let unicast = with_tos(unicast, 0xb9);
    feed(&mut s, &unicast, Instant::from_millis(1));
    feed(
        &mut s,
        &udp(from, sa("239.1.2.3:5000"), b"to the group"),
        Instant::from_millis(2),
    );
    let mut got = Vec::new();
    while let Ok((n, info)) = s.udp_recv_with(h, |_| {}) {
        got.push((n, info, s.udp_reply_source(&info)));
    }
    assert_eq!(got.len(), 2, "{got:?}");
    let (n, info, reply) = got[0];
    assert_eq!((n, info.from, info.dst), (5, from, ip("10.0.1.1")));
    assert_eq!((info.hop_limit, info.tos), (33, 0xb9));
    assert_eq!(reply, Some(ip("10.0.1.1")));
    let (_, info, reply) = got[1];
    assert_eq!((info.dst, info.hop_limit, info.tos), (IpAddr::V4(G4), 1, 0));
    assert_eq!(reply, Some(ip("10.0.1.1")), "our address toward 10.0.1.9");

    // To the group (no neighbour to resolve: the frame leaves at once).
    let to = sa("239.1.2.3:5000");
    for (src, ok) in [
        (Some(ip("10.0.1.1")), true),
        (None, true),
        (Some(ip("0.0.0.0")), true),
        (Some(ip("10.0.0.77")), false),
        (Some(ip("fd00::1")), false),
    ] {
        let meta = UdpSendMeta {
            src,
            ..Default::default()
        };
        let r = s.udp_send_msg(h, b"answer", Some(to), &meta);
        assert_eq!(r.is_ok(), ok, "source {src:?}: {r:?}");
    }
    let sources: Vec<IpAddr> = sent(&mut s)
        .iter()
        .filter(|f| f.len() > 34 && f[12..14] == [8, 0] && f[23] == 17)
        .map(|f| IpAddr::V4(Ipv4Addr::new(f[26], f[27], f[28], f[29])))
        .collect();
    let dflt = ip("10.0.0.1");
    assert_eq!(
        sources,
        vec![ip("10.0.1.1"), dflt, dflt],
        "the chosen source, then the stack's"
    );
}

/// To a group, the hop limit is IP_MULTICAST_TTL's (IP_TTL is for unicast) unless
/// the send chose one; the TOS is the socket's IP_TOS unless the send chose one.
#[test]
fn a_send_to_a_group_takes_the_multicast_ttl_or_its_own_and_the_sockets_tos() {
    let mut s = stack();
    let h = s.udp_bind(sa("0.0.0.0:5000")).unwrap();
    s.udp_set_multicast_ttl(h, true, 4).unwrap();
    s.udp_set_unicast_ttl(h, true, Some(99)).unwrap();
    s.udp_set_tos(h, true, 0x2e).unwrap();
    sent(&mut s);
    let to = sa("239.1.2.3:5000");
    let chosen = UdpSendMeta {
        hop_limit: Some(17),
        tos: Some(0x01),
        ..Default::default()
    };
    for meta in [UdpSendMeta::default(), chosen] {
        s.udp_send_msg(h, b"x", Some(to), &meta).unwrap();
    }
    let frames = sent(&mut s);
    let udp: Vec<_> = frames.iter().filter(|f| f[23] == 17).collect();
    assert_eq!(udp.len(), 2);
    for f in &udp {
        assert_eq!(wire::finish(wire::sum(&f[14..34])), 0, "header checksum");
    }
    let fields: Vec<(u8, u8)> = udp.iter().map(|f| (f[22], f[15])).collect();
    assert_eq!(fields, vec![(4, 0x2e), (17, 0x01)]);
}
