//! Whole conversations between stacks on the simulated wire, in virtual time, with
//! injected loss, reordering, duplication and corruption.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{
    mac_from_seed, DgramProto, Families, Stack, StackConfig, StackError, UdpSendMeta,
};

fn cfg(i: u8, extra: &[&str]) -> StackConfig {
    let mut addrs = vec![
        format!("10.0.0.{i}/24").parse().unwrap(),
        format!("fd00::{i}/64").parse().unwrap(),
    ];
    for a in extra {
        addrs.push(a.parse().unwrap());
    }
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs,
        seed: i as u64,
        ..Default::default()
    }
}

fn pair(seed: u64, faults: Faults) -> SimNet {
    let mut net = SimNet::new(seed, faults);
    net.add(cfg(1, &[])).unwrap();
    net.add(cfg(2, &[])).unwrap();
    net
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Pings from stack 0 to `dst`; returns how many replies came back.
fn ping(net: &mut SimNet, dst: IpAddr, count: u16, size: usize) -> usize {
    let h = net.stack_mut(0).ping_open();
    let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut got = 0;
    for seq in 0..count {
        net.stack_mut(0).ping_send(h, dst, seq, &data).unwrap();
        let ok = net.run_until(Duration::from_secs(3), |n| {
            n.stack_mut(0)
                .ping_recv(h)
                .map(|r| assert_eq!(r.seq, seq))
                .is_ok()
        });
        got += ok as usize;
    }
    got
}

#[test]
fn ping_v4_resolves_arp_and_gets_replies() {
    let mut net = pair(1, Faults::default());
    assert_eq!(ping(&mut net, ip("10.0.0.2"), 5, 56), 5);
    let c = net.stack(0).counters();
    assert_eq!(c.arp_tx_request, 1);
    assert_eq!(c.icmp4_rx_echo_reply, 5);
    assert_eq!(net.stack(1).counters().arp_tx_reply, 1);
    assert_eq!(net.stack(1).counters().icmp4_tx_echo_reply, 5);
    assert!(net
        .stack(0)
        .neighbors()
        .iter()
        .any(|(a, m)| *a == ip("10.0.0.2") && m.is_some()));
}

#[test]
fn ping_v6_resolves_ndp_global_and_link_local() {
    let mut net = pair(2, Faults::default());
    assert_eq!(ping(&mut net, ip("fd00::2"), 3, 56), 3);
    let ll = net
        .stack(1)
        .addrs()
        .iter()
        .find(|c| matches!(c.addr, IpAddr::V6(a) if a.segments()[0] == 0xfe80))
        .unwrap()
        .addr;
    assert_eq!(ping(&mut net, ll, 3, 56), 3);
    assert!(net.stack(1).counters().icmp6_rx_neighbor_solicit >= 1);
    assert!(net.stack(0).counters().icmp6_rx_neighbor_advert >= 1);
}

#[test]
fn large_pings_are_fragmented_and_reassembled_both_families() {
    let mut net = pair(3, Faults::default());
    assert_eq!(ping(&mut net, ip("10.0.0.2"), 2, 4000), 2);
    assert_eq!(ping(&mut net, ip("fd00::2"), 2, 9000), 2);
    assert!(net.stack(1).counters().ip4_reassembled >= 2);
    assert!(net.stack(0).counters().ip6_reassembled >= 2);
    assert!(net.stack(0).counters().ip4_tx_fragments >= 6);
}

/// An ICMP echo socket (Linux's `SOCK_DGRAM`/`IPPROTO_ICMP`): the application's
/// message leaves under the socket's identifier (its port) with a checksum the
/// stack computed, whatever the application put there; the whole reply comes
/// back from port 0; identifiers are a namespace of their own; anything but an
/// echo request of the destination's family is refused.
#[test]
fn echo_sockets_send_and_receive_whole_messages_under_their_identifier() {
    for (dst, request, reply) in [("10.0.0.2", 8u8, 0u8), ("fd00::2", 128, 129)] {
        let mut net = pair(4, Faults::default());
        let s = net.stack_mut(0);
        let udp = s.udp_bind(sa("[::]:4242")).unwrap();
        // Taken by another echo socket first (Linux's ping sockets share an
        // identifier: the one bound last gets the replies).
        let first = s
            .dgram_bind(DgramProto::Icmp, sa("[::]:4242"), Families::Both, false)
            .unwrap();
        let h = s
            .dgram_bind(DgramProto::Icmp, sa("[::]:4242"), Families::Both, false)
            .unwrap();
        let mut msg = vec![request, 0, 0xde, 0xad, 0xbe, 0xef, 0, 7];
        msg.extend_from_slice(b"payload");
        // The port is not the echo's: ignored.
        let to = SocketAddr::new(ip(dst), 9);
        let mut wrong = msg.clone();
        wrong[0] = reply;
        assert_eq!(s.udp_send_to(h, &wrong, to), Err(StackError::InvalidInput));
        wrong[0] = if request == 8 { 128 } else { 8 };
        assert_eq!(s.udp_send_to(h, &wrong, to), Err(StackError::InvalidInput));
        assert_eq!(
            s.udp_send_to(h, &msg[..7], to),
            Err(StackError::InvalidInput)
        );
        s.udp_connect(h, to).unwrap();
        assert_eq!(s.udp_peer_addr(h).unwrap(), SocketAddr::new(ip(dst), 0));
        assert_eq!(s.udp_send(h, &msg).unwrap(), msg.len());
        let mut got = None;
        net.run_until(Duration::from_secs(3), |n| {
            let mut buf = [0u8; 64];
            match n.stack_mut(0).udp_recv_from(h, &mut buf) {
                Ok((k, from)) => {
                    got = Some((buf[..k].to_vec(), from));
                    true
                }
                Err(_) => false,
            }
        });
        let (answer, from) = got.expect("an echo reply");
        assert_eq!(from, SocketAddr::new(ip(dst), 0));
        assert_eq!(answer[..2], [reply, 0]);
        assert_eq!(
            answer[4..6],
            4242u16.to_be_bytes(),
            "the socket's identifier"
        );
        assert_eq!(answer[6..8], [0, 7], "the application's sequence number");
        assert_eq!(&answer[8..], b"payload");
        let mut buf = [0u8; 64];
        assert_eq!(
            net.stack_mut(0).udp_recv_from(udp, &mut buf),
            Err(StackError::WouldBlock),
            "UDP's port 4242 is another socket"
        );
        assert_eq!(
            net.stack_mut(0).udp_recv_from(first, &mut buf),
            Err(StackError::WouldBlock),
            "the identifier's socket bound last takes its replies"
        );
        let peer = net.stack(1).counters();
        assert_eq!(
            peer.icmp4_tx_echo_reply + peer.icmp6_tx_echo_reply,
            1,
            "the request's checksum was the stack's"
        );
    }
}

/// ICMP errors about UDP datagrams, by Linux's rules: a port unreachable fails a
/// connected socket's next call with ECONNREFUSED and is ignored by an
/// unconnected one; with IP_RECVERR / IPV6_RECVERR it waits on the error queue
/// as a whole report (the quoted payload included), and reading it leaves no
/// error pending.
#[test]
fn icmp_errors_reach_udp_sockets_as_linux_reports_them() {
    use usnet_socket_api::errno::ECONNREFUSED;
    use usnet_stack::{IpFamily, ORIGIN_ICMP, ORIGIN_ICMP6};
    for (dst, fam, origin, icmp_type, code) in [
        ("10.0.0.2", IpFamily::V4, ORIGIN_ICMP, 3u8, 3u8),
        ("fd00::2", IpFamily::V6, ORIGIN_ICMP6, 1, 4),
    ] {
        let mut net = pair(11, Faults::default());
        let closed = SocketAddr::new(ip(dst), 9999);
        let settle = |net: &mut SimNet| {
            net.run_until(Duration::from_millis(200), |_| false);
        };
        // Connected, without IP_RECVERR: the hard error is pending, once.
        let c = net.stack_mut(0).udp_bind(sa("[::]:0")).unwrap();
        net.stack_mut(0).udp_connect(c, closed).unwrap();
        net.stack_mut(0).udp_send(c, b"probe").unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_take_error(c).unwrap(), Some(ECONNREFUSED), "{dst}");
        assert_eq!(s.udp_take_error(c).unwrap(), None);
        assert_eq!(s.udp_errqueue_len(c).unwrap(), 0);
        // Unconnected, without: ignored.
        let u = s.udp_bind(sa("[::]:0")).unwrap();
        s.udp_send_to(u, b"probe", closed).unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_take_error(u).unwrap(), None);
        assert!(s.counters().dgram_icmp_ignored >= 1);
        // With IP_RECVERR (of the error's family): queued whole, and pending.
        s.udp_set_recverr(u, fam, true).unwrap();
        s.udp_send_to(u, b"second probe", closed).unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_errqueue_len(u).unwrap(), 1);
        let (r, after) = s.udp_errqueue_pop(u).unwrap().expect("a report");
        assert_eq!(after, usnet_stack::PendingAfter::Cleared);
        assert_eq!(r.errno, ECONNREFUSED);
        assert_eq!((r.origin, r.icmp_type, r.code), (origin, icmp_type, code));
        assert_eq!(r.offender, Some(ip(dst)), "the host that answered");
        assert_eq!(r.dest, closed, "the quoted destination");
        assert_eq!(r.payload, b"second probe");
        assert_eq!(
            s.udp_take_error(u).unwrap(),
            None,
            "reading the report took the pending error"
        );
        assert_eq!(s.udp_errqueue_pop(u).unwrap(), None);
        // A send over the path MTU under IP_PMTUDISC_DO: a local report, the
        // MTU in ee_info, no payload, no pending error; reading it leaves the
        // pending error alone.
        s.udp_local_error(u, usnet_socket_api::errno::EMSGSIZE, closed, 1500)
            .unwrap();
        let (r, after) = s.udp_errqueue_pop(u).unwrap().expect("a local report");
        assert_eq!(
            (r.origin, r.info, r.offender),
            (usnet_stack::ORIGIN_LOCAL, 1500, None)
        );
        assert!(r.payload.is_empty());
        assert_eq!(after, usnet_stack::PendingAfter::Unchanged);
        // Turning it off empties the queue.
        s.udp_send_to(u, b"third", closed).unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_errqueue_len(u).unwrap(), 1);
        s.udp_set_recverr(u, fam, false).unwrap();
        assert_eq!(s.udp_errqueue_len(u).unwrap(), 0);
    }
}

fn udp_pair(net: &mut SimNet, port: u16) -> (usnet_stack::SocketHandle, usnet_stack::SocketHandle) {
    let a = net
        .stack_mut(0)
        .udp_bind("0.0.0.0:0".parse().unwrap())
        .unwrap();
    let b = net
        .stack_mut(1)
        .udp_bind(SocketAddr::new(ip("::"), port))
        .unwrap();
    (a, b)
}

/// A UDP socket bound to the wildcard names its route's source address once it
/// is connected (Linux's datagram connect), in both families.
#[test]
fn a_connected_udp_socket_names_its_source_address() {
    let mut net = pair(7, Faults::default());
    for (any, peer, ours) in [
        ("0.0.0.0:0", "10.0.0.2:53", "10.0.0.1"),
        ("[::]:0", "[fd00::2]:53", "fd00::1"),
    ] {
        let s = net.stack_mut(0);
        let h = s.udp_bind(sa(any)).unwrap();
        let before = s.udp_local_addr(h).unwrap();
        assert!(before.ip().is_unspecified());
        s.udp_connect(h, sa(peer)).unwrap();
        let after = s.udp_local_addr(h).unwrap();
        assert_eq!(after.ip(), ip(ours));
        assert_eq!(after.port(), before.port());
    }
}

/// A connect to `AF_UNSPEC` dissolves the association, as Linux's
/// `__udp_disconnect`: a datagram from another sender, dropped while connected,
/// is received after it; a send needs an address again; the address the connect
/// chose goes back to the wildcard, the bound port stays.
#[test]
fn a_disconnected_udp_socket_hears_everyone_again() {
    let mut net = pair(8, Faults::default());
    let h = net.stack_mut(0).udp_bind(sa("0.0.0.0:5300")).unwrap();
    let peer = net.stack_mut(1).udp_bind(sa("0.0.0.0:53")).unwrap();
    let other = net.stack_mut(1).udp_bind(sa("0.0.0.0:54")).unwrap();
    let s = net.stack_mut(0);
    s.udp_connect(h, sa("10.0.0.2:53")).unwrap();
    assert_eq!(s.udp_local_addr(h).unwrap(), sa("10.0.0.1:5300"));
    let mut buf = [0u8; 64];
    let mut heard = |net: &mut SimNet, from: usnet_stack::SocketHandle, msg: &[u8]| -> bool {
        net.stack_mut(1)
            .udp_send_to(from, msg, sa("10.0.0.1:5300"))
            .unwrap();
        net.run_for(Duration::from_millis(20));
        match net.stack_mut(0).udp_recv_from(h, &mut buf) {
            Ok((n, _)) => &buf[..n] == msg,
            Err(_) => false,
        }
    };
    assert!(heard(&mut net, peer, b"from the peer"));
    assert!(
        !heard(&mut net, other, b"from another"),
        "connected: only the peer"
    );
    net.stack_mut(0).udp_disconnect(h).unwrap();
    assert_eq!(
        net.stack_mut(0).udp_local_addr(h).unwrap(),
        sa("0.0.0.0:5300")
    );
    assert!(matches!(
        net.stack_mut(0).udp_send(h, b"x"),
        Err(StackError::NotConnected)
    ));
    assert!(
        heard(&mut net, other, b"from another"),
        "disconnected: anyone"
    );
    // A socket bound to an address of its own keeps it.
    let b = net.stack_mut(0).udp_bind(sa("10.0.0.1:5301")).unwrap();
    net.stack_mut(0).udp_connect(b, sa("10.0.0.2:53")).unwrap();
    net.stack_mut(0).udp_disconnect(b).unwrap();
    assert_eq!(
        net.stack_mut(0).udp_local_addr(b).unwrap(),
        sa("10.0.0.1:5301")
    );
}

/// Sends `n` datagrams of varying size; returns those received intact (all payloads
/// carry their index and a pattern so corruption would be seen).
fn udp_transfer(net: &mut SimNet, dst: IpAddr, n: u32, max: usize) -> (u32, u32) {
    let (a, b) = udp_pair(net, 9000);
    let to = SocketAddr::new(dst, 9000);
    let mut received = 0;
    let mut sent = 0;
    let mut buf = vec![0u8; 70_000];
    // Resolve the neighbour first, as any sender's first datagrams would.
    net.stack_mut(0)
        .udp_send_to(a, &u32::MAX.to_be_bytes(), to)
        .unwrap();
    net.run_for(Duration::from_millis(20));
    while net.stack_mut(1).udp_recv_from(b, &mut buf).is_ok() {}
    for i in 0..n {
        let len = 4 + (i as usize * 7919) % max;
        let mut msg: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
        msg[..4].copy_from_slice(&i.to_be_bytes());
        loop {
            match net.stack_mut(0).udp_send_to(a, &msg, to) {
                Ok(_) => break,
                Err(StackError::WouldBlock) => {
                    net.step();
                }
                Err(e) => panic!("{e}"),
            }
        }
        sent += 1;
        // About 10k datagrams/s: reordering (up to 5 ms) then spans ~50 datagrams,
        // inside the reassembly limits, as on a real lossy path.
        net.run_for(Duration::from_micros(100));
        while let Ok((len, from)) = net.stack_mut(1).udp_recv_from(b, &mut buf) {
            assert_eq!(from.ip().is_ipv4(), dst.is_ipv4());
            let idx = u32::from_be_bytes(buf[..4].try_into().unwrap());
            let bad: Vec<usize> = (4..len)
                .filter(|&k| buf[k] != (k as u32 ^ idx) as u8)
                .collect();
            assert!(
                bad.is_empty(),
                "datagram {idx} corrupted: len {len} expected {} bad at {:?} ({} bytes)",
                4 + (idx as usize * 7919) % max,
                &bad[..bad.len().min(5)],
                bad.len()
            );
            received += 1;
        }
    }
    net.run_for(Duration::from_secs(1));
    while let Ok((len, _)) = net.stack_mut(1).udp_recv_from(b, &mut buf) {
        let idx = u32::from_be_bytes(buf[..4].try_into().unwrap());
        assert!((4..len).all(|k| buf[k] == (k as u32 ^ idx) as u8));
        received += 1;
    }
    (sent, received)
}

#[test]
fn udp_clean_link_delivers_everything_v4_and_v6() {
    for dst in ["10.0.0.2", "fd00::2"] {
        let mut net = pair(4, Faults::default());
        let (sent, got) = udp_transfer(&mut net, ip(dst), 2000, 1472);
        assert_eq!((sent, got), (2000, 2000), "{dst}");
    }
}

#[test]
fn udp_with_fragments_under_loss_reorder_dup_never_delivers_garbage() {
    let faults = Faults {
        loss: 0.03,
        duplicate: 0.02,
        reorder: 0.1,
        ..Default::default()
    };
    for dst in ["10.0.0.2", "fd00::2"] {
        let mut net = pair(5, faults);
        let (sent, got) = udp_transfer(&mut net, ip(dst), 1500, 20_000);
        // Datagrams are lost, never damaged (asserted inside); duplicates may arrive.
        let c = net.stack(1).counters();
        assert!(got > sent / 2, "{dst}: {got}/{sent} {:?}", net.stats);
        assert!(c.ip4_reassembled + c.ip6_reassembled > 500);
        assert!(net.stats.lost > 0 && net.stats.reordered > 0 && net.stats.duplicated > 0);
    }
}

/// One flipped bit per frame is always caught by the Internet checksum, so with
/// single-frame datagrams nothing damaged may be delivered. (Two flips in one
/// reassembled datagram can cancel out in a one's-complement sum; that is the
/// checksum's known limit, not something a stack can fix.)
#[test]
fn udp_corruption_is_always_caught_for_single_frames() {
    let faults = Faults {
        corrupt: 0.2,
        ..Default::default()
    };
    for dst in ["10.0.0.2", "fd00::2"] {
        let mut net = pair(6, faults);
        let (sent, got) = udp_transfer(&mut net, ip(dst), 1500, 1400);
        let c = net.stack(1).counters();
        let caught = c.udp_rx_bad_checksum
            + c.ip4_rx_bad_checksum
            + c.ip6_rx_not_for_us
            + c.ip4_rx_not_for_us
            + c.eth_rx_not_for_us
            + c.eth_rx_unknown_type
            + c.ip4_rx_bad_header
            + c.ip6_rx_bad_header
            + c.ip4_rx_truncated
            + c.ip6_rx_truncated
            + c.udp_rx_truncated
            + c.udp_rx_no_socket;
        assert!(caught > 200, "{dst}: {caught}");
        assert!(got >= sent * 7 / 10, "{dst}: {got}/{sent}");
    }
}

#[test]
fn closed_port_gets_icmp_unreachable_both_families() {
    let mut net = pair(6, Faults::default());
    let a = net
        .stack_mut(0)
        .udp_bind("[::]:0".parse().unwrap())
        .unwrap();
    for dst in ["10.0.0.2:99", "[fd00::2]:99"] {
        net.stack_mut(0)
            .udp_send_to(a, b"hello", dst.parse().unwrap())
            .unwrap();
        net.run_for(Duration::from_millis(100));
    }
    assert_eq!(net.stack(1).counters().udp_rx_no_socket, 2);
    assert_eq!(net.stack(1).counters().icmp4_tx_unreachable, 1);
    assert_eq!(net.stack(1).counters().icmp6_tx_unreachable, 1);
    assert_eq!(net.stack(0).counters().icmp4_rx_unreachable, 1);
    assert_eq!(net.stack(0).counters().icmp6_rx_unreachable, 1);
}

/// IP_TTL / IPV6_UNICAST_HOPS and IP_TOS / IPV6_TCLASS: the socket's own, each
/// family its own, then one send's (`sendmsg`'s IP_TTL, IP_TOS, IPV6_HOPLIMIT,
/// IPV6_TCLASS); a fragmented datagram carries them too.
#[test]
fn a_udp_socket_and_one_send_choose_hop_limit_and_tos_per_family() {
    let mut net = pair(21, Faults::default());
    let a = net.stack_mut(0).udp_bind(sa("[::]:0")).unwrap();
    let b = net.stack_mut(1).udp_bind(sa("[::]:7100")).unwrap();
    let (v4, v6) = (sa("10.0.0.2:7100"), sa("[fd00::2]:7100"));
    let seen = |net: &mut SimNet, to: SocketAddr, len: usize, meta: UdpSendMeta| {
        net.stack_mut(0)
            .udp_send_msg(a, &vec![5u8; len], Some(to), &meta)
            .unwrap();
        net.run_for(Duration::from_millis(100));
        let (n, info) = net.stack_mut(1).udp_recv_with(b, |_| {}).unwrap();
        assert_eq!(n, len);
        (info.hop_limit, info.tos)
    };
    let none = UdpSendMeta::default();
    assert_eq!(seen(&mut net, v4, 10, none), (64, 0), "the defaults");
    assert_eq!(seen(&mut net, v6, 10, none), (64, 0));
    let s = net.stack_mut(0);
    s.udp_set_unicast_ttl(a, true, Some(7)).unwrap();
    s.udp_set_tos(a, true, 0xb8).unwrap();
    s.udp_set_unicast_ttl(a, false, Some(9)).unwrap();
    s.udp_set_tos(a, false, 0x29).unwrap();
    assert_eq!(
        seen(&mut net, v4, 10, none),
        (7, 0xb8),
        "the socket's IPv4 ones"
    );
    assert_eq!(
        seen(&mut net, v6, 10, none),
        (9, 0x29),
        "the socket's IPv6 ones"
    );
    assert_eq!(seen(&mut net, v4, 3000, none), (7, 0xb8), "fragmented");
    assert_eq!(seen(&mut net, v6, 3000, none), (9, 0x29), "fragmented");
    let chosen = UdpSendMeta {
        hop_limit: Some(3),
        tos: Some(0x01),
        ..Default::default()
    };
    assert_eq!(seen(&mut net, v4, 10, chosen), (3, 0x01), "the send's");
    assert_eq!(seen(&mut net, v6, 10, chosen), (3, 0x01));
    let tos_only = UdpSendMeta {
        tos: Some(0x02),
        ..Default::default()
    };
    assert_eq!(seen(&mut net, v4, 10, tos_only), (7, 0x02));
    net.stack_mut(0).udp_set_unicast_ttl(a, true, None).unwrap();
    assert_eq!(
        seen(&mut net, v4, 10, none),
        (64, 0xb8),
        "back to the stack's"
    );
}

#[test]
fn full_socket_queue_drops_are_counted_as_drop2() {
    let mut net = pair(7, Faults::default());
    let (a, b) = udp_pair(&mut net, 7000);
    net.stack_mut(1).udp_set_recv_buffer(b, 10_000).unwrap();
    for _ in 0..50 {
        net.stack_mut(0)
            .udp_send_to(a, &[7u8; 1000], "10.0.0.2:7000".parse().unwrap())
            .unwrap();
        net.step();
    }
    net.run_for(Duration::from_millis(100));
    let c = net.stack(1).counters();
    assert_eq!(c.udp_rx_delivered + c.udp_rx_queue_full, 50);
    assert!(c.udp_rx_queue_full >= 39, "{}", c.udp_rx_queue_full);
    assert_eq!(
        net.stack(1).socket_stats(b).unwrap().rx_queue_full,
        c.udp_rx_queue_full
    );
}

#[test]
fn input_queue_overflow_is_drop1() {
    let mut s = Stack::new(StackConfig {
        input_queue_len: 8,
        ..cfg(1, &[])
    })
    .unwrap();
    for _ in 0..20 {
        let b = s.pool_mut().alloc_from(&[0u8; 60]).unwrap();
        s.receive(b);
    }
    assert_eq!(s.input_len(), 8);
    assert_eq!(s.counters().drop_input_queue_full, 12);
    s.poll(usnet_stack::Instant::from_millis(1));
    assert_eq!(s.pool().in_use(), 0);
}

#[test]
fn unresolvable_neighbour_drops_after_probes_without_leaking() {
    let mut net = pair(8, Faults::default());
    let a = net
        .stack_mut(0)
        .udp_bind("0.0.0.0:0".parse().unwrap())
        .unwrap();
    for _ in 0..3 {
        net.stack_mut(0)
            .udp_send_to(a, b"x", "10.0.0.77:5".parse().unwrap())
            .unwrap();
    }
    net.run_for(Duration::from_secs(5));
    let c = net.stack(0).counters();
    assert_eq!(c.neigh_unresolved, 3);
    assert_eq!(c.arp_tx_request, 3);
    assert_eq!(net.stack(0).pool().in_use(), 0);
    assert_eq!(
        net.stack_mut(0)
            .udp_send_to(a, b"x", "192.168.9.9:5".parse().unwrap()),
        Err(StackError::NoRoute)
    );
}

#[test]
fn gateway_routes_off_link_traffic() {
    let mut net = SimNet::new(9, Faults::default());
    net.add(StackConfig {
        gateway4: Some("10.0.0.2".parse().unwrap()),
        ..cfg(1, &[])
    })
    .unwrap();
    // The "router" owns the far address too, so it answers for it.
    net.add(cfg(2, &["192.168.50.1/24"])).unwrap();
    assert_eq!(ping(&mut net, ip("192.168.50.1"), 2, 56), 2);
}

#[test]
fn missing_fragment_times_out_with_icmp_time_exceeded() {
    let faults = Faults::default();
    let mut net = pair(10, faults);
    assert_eq!(ping(&mut net, ip("10.0.0.2"), 1, 56), 1);
    // Drop everything from now on after the first fragment leaves.
    let a = net
        .stack_mut(0)
        .udp_bind("0.0.0.0:0".parse().unwrap())
        .unwrap();
    net.stack_mut(0)
        .udp_send_to(a, &[1u8; 3000], "10.0.0.2:9".parse().unwrap())
        .unwrap();
    // Throw away the last fragment(s) so reassembly cannot finish.
    let first = net.stack_mut(0).dequeue_tx().unwrap();
    while let Some(b) = net.stack_mut(0).dequeue_tx() {
        net.stack_mut(0).pool_mut().free(b);
    }
    let mut bytes = Vec::new();
    net.stack(0).pool().copy_chain(&first, &mut bytes);
    net.stack_mut(0).pool_mut().free(first);
    let b = net.stack_mut(1).pool_mut().alloc_from(&bytes).unwrap();
    net.stack_mut(1).receive(b);
    net.run_for(Duration::from_secs(31));
    assert_eq!(net.stack(1).counters().ip4_reasm_timeout, 1);
    assert_eq!(net.stack(1).counters().icmp4_tx_time_exceeded, 1);
    assert_eq!(net.stack(0).counters().icmp4_rx_time_exceeded, 1);
}

#[test]
fn same_seed_same_conversation() {
    let run = || {
        let mut net = pair(
            11,
            Faults {
                loss: 0.05,
                reorder: 0.2,
                ..Default::default()
            },
        );
        let r = udp_transfer(&mut net, ip("10.0.0.2"), 300, 3000);
        (r, net.stats, net.stack(1).counters().clone())
    };
    assert_eq!(run(), run());
}

#[test]
fn pool_exhaustion_is_counted_not_fatal() {
    let mut net = SimNet::new(12, Faults::default());
    net.add(cfg(1, &[])).unwrap();
    let mut small = cfg(2, &[]);
    small.pool.count = 16;
    net.add(small).unwrap();
    let (a, _b) = udp_pair(&mut net, 5000);
    for _ in 0..200 {
        let _ = net
            .stack_mut(0)
            .udp_send_to(a, &[0u8; 100], "10.0.0.2:5000".parse().unwrap());
    }
    net.run_for(Duration::from_millis(200));
    assert!(net.stats.rx_no_buffer > 0 || net.stack(1).counters().udp_rx_queue_full > 0);
    assert_eq!(
        ping(&mut net, ip("10.0.0.2"), 1, 56),
        0,
        "queue of 16 buffers is full of unread datagrams"
    );
}

#[test]
fn bind_rules() {
    let mut s = Stack::new(cfg(1, &[])).unwrap();
    let a = s.udp_bind("0.0.0.0:53".parse().unwrap()).unwrap();
    assert_eq!(
        s.udp_bind("10.0.0.1:53".parse().unwrap()),
        Err(StackError::AddrInUse)
    );
    assert_eq!(
        s.udp_bind("10.9.9.9:54".parse().unwrap()),
        Err(StackError::AddrNotAvailable)
    );
    s.close(a).unwrap();
    assert!(s.udp_bind("10.0.0.1:53".parse().unwrap()).is_ok());
    assert_eq!(s.close(a), Err(StackError::InvalidHandle), "stale handle");
    let e = s.udp_bind("[::]:0".parse().unwrap()).unwrap();
    assert!(s.udp_local_addr(e).unwrap().port() >= 49152);
}

#[test]
fn readiness_events_are_edge_triggered() {
    let mut net = pair(13, Faults::default());
    let (a, b) = udp_pair(&mut net, 6000);
    let mut ready = Vec::new();
    net.stack_mut(1).take_ready(&mut ready);
    assert!(ready.is_empty());
    for _ in 0..3 {
        net.stack_mut(0)
            .udp_send_to(a, b"x", "10.0.0.2:6000".parse().unwrap())
            .unwrap();
    }
    net.run_for(Duration::from_millis(50));
    net.stack_mut(1).take_ready(&mut ready);
    assert_eq!(ready, vec![b]);
    assert!(net.stack(1).readiness(b).unwrap().readable);
    ready.clear();
    net.stack_mut(1).take_ready(&mut ready);
    assert!(ready.is_empty());
}

/// IPV6_MTU (Linux's `frag_size`): a socket's IPv6 datagrams larger than it
/// leave in fragments no larger than it, though the link's MTU would carry them
/// whole; its IPv4 datagrams and other sockets' are untouched; below IPv6's
/// minimum MTU it is refused.
#[test]
fn a_sockets_ipv6_mtu_fragments_its_datagrams_below_the_links() {
    let mut net = pair(40, Faults::default());
    let s = net.stack_mut(1);
    let rx = s.udp_bind(sa("[::]:7000")).unwrap();
    let s = net.stack_mut(0);
    let capped = s.udp_bind(sa("[::]:7001")).unwrap();
    let plain = s.udp_bind(sa("[::]:7002")).unwrap();
    assert_eq!(
        s.udp_set_frag_size_v6(capped, 1000),
        Err(StackError::InvalidInput)
    );
    s.udp_set_frag_size_v6(capped, 1280).unwrap();
    let data: Vec<u8> = (0..1400).map(|i| i as u8).collect();
    let sent = |net: &mut SimNet, from, to: &str| {
        let before =
            net.stack(0).counters().ip6_tx_fragments + net.stack(0).counters().ip4_tx_fragments;
        net.stack_mut(0).udp_send_to(from, &data, sa(to)).unwrap();
        let mut buf = [0u8; 2000];
        let mut got = None;
        net.run_until(Duration::from_secs(3), |n| {
            match n.stack_mut(1).udp_recv_from(rx, &mut buf) {
                Ok((k, _)) => {
                    got = Some(buf[..k].to_vec());
                    true
                }
                Err(_) => false,
            }
        });
        assert_eq!(
            got.as_deref(),
            Some(&data[..]),
            "the whole datagram to {to}"
        );
        net.stack(0).counters().ip6_tx_fragments + net.stack(0).counters().ip4_tx_fragments - before
    };
    // 40 + 8 + 1,400 bytes: two fragments of at most 1,280 (the link's 1,500 would
    // carry it whole).
    assert_eq!(sent(&mut net, capped, "[fd00::2]:7000"), 2);
    assert_eq!(sent(&mut net, plain, "[fd00::2]:7000"), 0);
    assert_eq!(sent(&mut net, capped, "10.0.0.2:7000"), 0);
    net.stack_mut(0).udp_set_frag_size_v6(capped, 0).unwrap();
    assert_eq!(sent(&mut net, capped, "[fd00::2]:7000"), 0);
}
