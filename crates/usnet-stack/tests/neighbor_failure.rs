//! A neighbour on the link that never answers address resolution. As Linux's
//! `ipv4_link_failure` / `ip6_link_failure`, each packet that waited for it
//! comes back to its sender as a host (address) unreachable from ourselves, after
//! the last probe (3 × 1 s): a connection attempt fails with EHOSTUNREACH at
//! once instead of after its SYN retries, a UDP socket with IP_RECVERR and an
//! echo socket find the report on their error queues (ping's "Destination Host
//! Unreachable").

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

mod common;

use common::{cfg, sa};
use usnet_socket_api::errno::EHOSTUNREACH;
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{DgramProto, Families, IpFamily, StackError, ORIGIN_ICMP, ORIGIN_ICMP6};

fn one_stack() -> SimNet {
    let mut net = SimNet::new(11, Faults::default());
    net.add(cfg(1)).unwrap();
    net
}

#[test]
fn packets_to_a_silent_neighbour_come_back_as_host_unreachable() {
    for (absent, fam, ours, origin, ty, code) in [
        ("10.0.0.9", IpFamily::V4, "10.0.0.1", ORIGIN_ICMP, 3u8, 1u8),
        ("fd00::9", IpFamily::V6, "fd00::1", ORIGIN_ICMP6, 1, 3),
    ] {
        let absent: IpAddr = absent.parse().unwrap();
        let ours: IpAddr = ours.parse().unwrap();
        let mut net = one_stack();
        let s = net.stack_mut(0);
        let conn = s.tcp_connect(None, SocketAddr::new(absent, 80)).unwrap();
        let udp = s.udp_bind(sa("[::]:0")).unwrap();
        s.udp_set_recverr(udp, fam, true).unwrap();
        s.udp_send_to(udp, b"probe", SocketAddr::new(absent, 53))
            .unwrap();
        let echo = s
            .dgram_bind(DgramProto::Icmp, sa("[::]:4242"), Families::Both, false)
            .unwrap();
        s.udp_set_recverr(echo, fam, true).unwrap();
        let request = if absent.is_ipv4() { 8 } else { 128 };
        let msg = [request, 0, 0, 0, 0, 0, 0, 1, b'h', b'i'];
        s.udp_send_to(echo, &msg, SocketAddr::new(absent, 0))
            .unwrap();

        // Still resolving: nothing yet.
        net.run_for(Duration::from_millis(2500));
        let s = net.stack_mut(0);
        assert_eq!(s.tcp_error(conn).unwrap(), None, "{absent}: still trying");
        assert_eq!(s.udp_take_error(udp).unwrap(), None);

        net.run_for(Duration::from_millis(1000));
        let s = net.stack_mut(0);
        assert_eq!(
            s.tcp_error(conn).unwrap(),
            Some(StackError::HostUnreachable),
            "{absent}: the connect fails with the resolution"
        );
        assert_eq!(s.counters_snapshot().tcp_syn_retransmits, 2, "{absent}");
        for (h, dest, payload) in [
            (udp, SocketAddr::new(absent, 53), &b"probe"[..]),
            (echo, SocketAddr::new(absent, 0), &msg[..]),
        ] {
            assert_eq!(s.udp_take_error(h).unwrap(), Some(EHOSTUNREACH));
            let r = s.udp_errqueue_pop(h).unwrap().expect("a report").0;
            assert_eq!((r.origin, r.icmp_type, r.code), (origin, ty, code));
            assert_eq!(r.errno, EHOSTUNREACH);
            assert_eq!(r.offender, Some(ours), "{absent}: from ourselves");
            assert_eq!(r.dest, dest);
            // An echo request's identifier is its socket's: the rest as sent.
            let from = if h == echo { 6 } else { 0 };
            assert_eq!(r.payload.len(), payload.len());
            assert_eq!(r.payload[from..], payload[from..]);
        }
        let c = s.counters_snapshot();
        // The SYN and its two retransmissions, the datagram, the echo request.
        assert_eq!(c.neigh_unresolved, 5, "{absent}");
        assert_eq!(c.neigh_unreachable_reported, 5, "{absent}");
        s.tcp_close(conn).unwrap();
    }
}
