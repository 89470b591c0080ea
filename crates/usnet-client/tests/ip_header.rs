//! The IP header fields a socket chooses, through a stack server in this process.
//! UDP: IP_TTL, IPV6_UNICAST_HOPS, IP_TOS and IPV6_TCLASS set before the socket
//! is bound (kept by the server until the stack socket exists), each family its
//! own, and one send's choices over them. TCP: the hop limit and minimum hop
//! limit per family on fresh sockets and a dual-stack listener.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use usnet_client::{Client, IpHeader, SendMeta, Socket, SocketKind, TcpStream, UdpSocket};

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

/// Whether a connection started from `s` completes within `within`.
fn connects(s: Socket, to: SocketAddr, within: Duration) -> (bool, TcpStream) {
    let c = s.connect_start(to).unwrap();
    let end = Instant::now() + within;
    while Instant::now() < end {
        if c.connected() {
            return (true, c);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (c.connected(), c)
}

/// A dual-stack listener with IPV6_MINHOPCOUNT 255 and IP_MINTTL 0 takes IPv4
/// SYNs with TTL 64 and IPv6 ones only with hop limit 255; a fresh socket's
/// IPV6_UNICAST_HOPS goes on its SYN, its IP_TTL does not (the other family's),
/// and an accepted connection keeps its family's minimum.
#[test]
fn tcp_hop_limits_per_family_on_syns_and_listeners() {
    let _srv = common::server_with(
        "tcp-header",
        |st| st.addrs.push("fd67::1/64".parse().unwrap()),
        |_| {},
    );
    let c = Client::attach("tcp-header").unwrap();
    let fresh = Socket::new(&c, SocketKind::Tcp).unwrap();
    fresh.bind(sa("[::]:7310")).unwrap();
    fresh.set_ip_header(IpHeader::MinHopCount6(255)).unwrap();
    let l = fresh.listen(8).unwrap();
    let (v4, v6) = (sa("10.66.0.1:7310"), sa("[fd67::1]:7310"));
    let tcp = || Socket::new(&c, SocketKind::Tcp).unwrap();
    let short = Duration::from_millis(300);
    assert!(
        connects(tcp(), v4, Duration::from_secs(5)).0,
        "IPv4: no minimum"
    );
    l.accept().unwrap();
    assert!(!connects(tcp(), v6, short).0, "IPv6 at hop limit 64");
    let wrong = tcp();
    wrong.set_ip_header(IpHeader::Ttl(Some(255))).unwrap();
    assert!(!connects(wrong, v6, short).0, "IP_TTL is not IPv6's");
    let right = tcp();
    right
        .set_ip_header(IpHeader::UnicastHops6(Some(255)))
        .unwrap();
    let (ok, s) = connects(right, v6, Duration::from_secs(5));
    assert!(ok, "IPV6_UNICAST_HOPS 255 on the SYN");
    let (a, _) = l.accept().unwrap();
    // The accepted connection drops what its peer sends one hop further.
    s.set_ip_header(IpHeader::UnicastHops6(Some(254))).unwrap();
    use std::io::{Read, Write};
    (&s).write_all(b"x").unwrap();
    a.set_nonblocking(true).unwrap();
    std::thread::sleep(short);
    let mut b = [0u8; 4];
    assert_eq!(
        (&a).read(&mut b).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    s.set_ip_header(IpHeader::UnicastHops6(None)).unwrap();
    s.set_ip_header(IpHeader::Tclass6(0x20)).unwrap();
    s.set_ip_header(IpHeader::UnicastHops6(Some(255))).unwrap();
    a.set_nonblocking(false).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((&a).read(&mut b).unwrap(), 1, "retransmitted at 255");
}

/// An option set between two sends applies to the later one only, as a kernel
/// socket's does (its send is done when it returns): each datagram below was
/// written under a different IP_TTL, without waiting between them, and
/// arrives with its own (traceroute -I sets the TTL between probes on one
/// socket). Before, a datagram still in the send ring when the next option
/// came went out under the new one.
#[test]
fn an_option_set_between_sends_applies_to_the_later_datagrams_only() {
    let _srv = common::server("udp-ttl-order", |_| {});
    let c = Client::attach("udp-ttl-order").unwrap();
    let rx = UdpSocket::bind(&c, sa("0.0.0.0:7302")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let tx = UdpSocket::bind(&c, sa("0.0.0.0:0")).unwrap();
    let to = sa("10.66.0.1:7302");
    let ttls: Vec<u8> = (1..=40).collect();
    for &t in &ttls {
        tx.set_ttl(Some(t)).unwrap();
        tx.send_to(&[t], to).unwrap();
    }
    let mut got = Vec::new();
    for _ in &ttls {
        let mut buf = [0u8; 4];
        let m = rx.recv_msg(&mut buf, false).unwrap();
        got.push((buf[0], m.hop_limit));
    }
    let want: Vec<(u8, u8)> = ttls.iter().map(|&t| (t, t)).collect();
    assert_eq!(got, want, "(datagram, the TTL it arrived with)");
}
