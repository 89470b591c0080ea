//! UDP multicast through a stack server in this process: options set before bind
//! (kept by the server until the stack socket exists), two receivers sharing a port
//! (SO_REUSEADDR), a sender whose datagram loops back to them, the loopback turned
//! off, and closing sockets leaving the group.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use usnet_client::{Client, Socket, SocketKind, UdpSocket};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const G: Ipv4Addr = Ipv4Addr::new(239, 7, 7, 7);

fn unbound(c: &Client) -> UdpSocket {
    Socket::new(c, SocketKind::Udp).unwrap().into_udp()
}

#[test]
fn members_sharing_a_port_receive_a_looped_datagram_and_closing_leaves() {
    let srv = common::server("udp-mcast", |_| {});
    let c = Client::attach("udp-mcast").unwrap();
    let any = Ipv4Addr::UNSPECIFIED;
    // Joined before bind: the server applies it at bind.
    let r1 = unbound(&c);
    r1.join_multicast_v4(&G, &any).unwrap();
    r1.bind_reuse(sa("0.0.0.0:7200"), 0, true).unwrap();
    let r2 = unbound(&c);
    r2.bind_reuse(sa("0.0.0.0:7200"), 0, true).unwrap();
    r2.join_multicast_v4(&G, &any).unwrap();
    // Without reuse the port is taken.
    assert!(UdpSocket::bind(&c, sa("0.0.0.0:7200")).is_err());
    let groups = srv.call(Duration::from_secs(5), |lp| {
        let s = lp.stack();
        (s.multicast_groups(), s.counters().igmp_tx_report)
    });
    assert_eq!(groups.unwrap(), (vec![(IpAddr::V4(G), 2)], 1));
    let tx = UdpSocket::bind(&c, sa("10.66.0.1:0")).unwrap();
    tx.set_multicast_ttl_v4(4).unwrap();
    tx.send_to(b"to the group", SocketAddr::new(IpAddr::V4(G), 7200))
        .unwrap();
    let from = tx.local_addr().unwrap();
    for r in [&r1, &r2] {
        r.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        let (n, f) = r.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], f), (&b"to the group"[..], from));
    }
    // An unbound sender with IP_MULTICAST_LOOP off (kept until its first send
    // binds it): nothing comes back.
    let quiet = unbound(&c);
    quiet.set_multicast_loop_v4(false).unwrap();
    quiet
        .send_to(b"quiet", SocketAddr::new(IpAddr::V4(G), 7200))
        .unwrap();
    tx.send_to(b"loud", SocketAddr::new(IpAddr::V4(G), 7200))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = r1.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"loud", "the quiet datagram did not loop back");
    // Closing both members leaves the group: one IGMP leave.
    drop(r1);
    drop(r2);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = srv
            .call(Duration::from_secs(5), |lp| {
                let s = lp.stack();
                (s.multicast_groups().len(), s.counters().igmp_tx_leave)
            })
            .unwrap();
        if st == (0, 1) {
            break;
        }
        assert!(Instant::now() < deadline, "still {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
