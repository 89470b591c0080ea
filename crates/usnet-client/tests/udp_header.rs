//! The IP header fields of the datagrams a UDP socket sends, through a stack
//! server in this process: IP_TTL, IPV6_UNICAST_HOPS, IP_TOS and IPV6_TCLASS
//! set before the socket is bound (kept by the server until the stack socket
//! exists), each family its own, and one send's choices over them.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use usnet_client::{Client, SendMeta, Socket, SocketKind, UdpSocket};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn ttl_and_tos_per_family_and_per_send_reach_the_receiver() {
    let _srv = common::server_with(
        "udp-header",
        |st| st.addrs.push("fd66::1/64".parse().unwrap()),
        |_| {},
    );
    let c = Client::attach("udp-header").unwrap();
    let rx = UdpSocket::bind(&c, sa("[::]:7300")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Unbound: the server keeps the options until the first send binds it.
    let tx = Socket::new(&c, SocketKind::Udp).unwrap().into_udp();
    tx.set_ttl(Some(7)).unwrap();
    tx.set_tos(0xb8).unwrap();
    tx.set_unicast_hops_v6(Some(9)).unwrap();
    tx.set_tclass_v6(0x29).unwrap();
    let (v4, v6) = (sa("10.66.0.1:7300"), sa("[fd66::1]:7300"));
    let seen = |to: SocketAddr, meta: SendMeta| {
        tx.send_msg(b"x", Some(to), &meta).unwrap();
        let mut buf = [0u8; 8];
        let m = rx.recv_msg(&mut buf, false).unwrap();
        assert_eq!(m.from.ip().to_canonical().is_ipv4(), to.is_ipv4());
        (m.hop_limit, m.tos)
    };
    let none = SendMeta::default();
    assert_eq!(seen(v4, none), (7, 0xb8), "IPv4: IP_TTL, IP_TOS");
    assert_eq!(
        seen(v6, none),
        (9, 0x29),
        "IPv6: IPV6_UNICAST_HOPS, IPV6_TCLASS"
    );
    let chosen = SendMeta {
        hop_limit: Some(3),
        tos: Some(0x01),
        ..Default::default()
    };
    assert_eq!(seen(v4, chosen), (3, 0x01), "the send's");
    assert_eq!(seen(v6, chosen), (3, 0x01), "the send's");
    tx.set_ttl(None).unwrap();
    tx.set_unicast_hops_v6(None).unwrap();
    assert_eq!(seen(v4, none), (64, 0xb8), "the stack's TTL again");
    assert_eq!(seen(v6, none), (64, 0x29), "the stack's hop limit again");
}
