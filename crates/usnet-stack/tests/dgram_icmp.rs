//! ICMP errors from a router on the path about datagrams: time exceeded for a
//! UDP probe and for an echo request (what traceroute, tracepath and ping read
//! from their error queues), and the soft error a connected socket without
//! IP_RECVERR does not report. (Port unreachable from the peer itself:
//! `conversations.rs`.)

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

mod common;

use common::icmp::{icmp_for, Says, ROUTER4, ROUTER6};
use common::{cfg, sa};
use usnet_socket_api::errno::EHOSTUNREACH;
use usnet_stack::sim::{Faults, Hop, SimNet};
use usnet_stack::{DgramProto, Families, IpFamily, ORIGIN_ICMP, ORIGIN_ICMP6};
use usnet_wire::{self as wire, ethertype};

fn pair() -> SimNet {
    let mut net = SimNet::new(3, Faults::default());
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    net
}

/// Whether `frame` is a UDP datagram (`proto` UDP) or an echo request (ICMP,
/// ICMPv6: not neighbour discovery, which must pass).
fn carries(frame: &[u8], proto: u8) -> bool {
    let Ok(eth) = wire::parse_ethernet(frame) else {
        return false;
    };
    let (p, l4) = match eth.ethertype {
        ethertype::IPV4 => match wire::parse_ipv4(eth.payload, false) {
            Ok(ip) => (ip.protocol, ip.payload),
            Err(_) => return false,
        },
        ethertype::IPV6 => match wire::parse_ipv6(eth.payload) {
            Ok(ip) => (ip.next_header, ip.payload),
            Err(_) => return false,
        },
        _ => return false,
    };
    p == proto && (proto == wire::IPPROTO_UDP || matches!(l4.first(), Some(8 | 128)))
}

/// A router that answers every frame of `proto` from stack 0 with time exceeded.
fn ttl_expires_for(net: &mut SimNet, proto: u8) {
    net.middlebox = Some(Box::new(move |from: usize, frame: &[u8]| {
        if from == 0 && carries(frame, proto) {
            Hop::Answer(icmp_for(frame, Says::TimeExceeded, |_| {}))
        } else {
            Hop::Pass
        }
    }));
}

fn settle(net: &mut SimNet) {
    net.run_until(Duration::from_millis(100), |_| false);
}

#[test]
fn time_exceeded_reaches_udp_and_echo_sockets_that_ask_for_errors() {
    for (peer, fam, router, origin, te_type) in [
        (
            "10.0.0.2",
            IpFamily::V4,
            IpAddr::V4(ROUTER4),
            ORIGIN_ICMP,
            11u8,
        ),
        (
            "fd00::2",
            IpFamily::V6,
            IpAddr::V6(ROUTER6),
            ORIGIN_ICMP6,
            3,
        ),
    ] {
        let peer: IpAddr = peer.parse().unwrap();
        // UDP: a connected socket without IP_RECVERR ignores a soft error.
        let mut net = pair();
        ttl_expires_for(&mut net, wire::IPPROTO_UDP);
        let s = net.stack_mut(0);
        let c = s.udp_bind(sa("[::]:0")).unwrap();
        s.udp_connect(c, SocketAddr::new(peer, 33434)).unwrap();
        s.udp_send(c, b"probe").unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_take_error(c).unwrap(), None, "{peer}: soft");
        // With IP_RECVERR: the report names the router and the probe's port.
        s.udp_set_recverr(c, fam, true).unwrap();
        s.udp_send(c, b"probe 2").unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        assert_eq!(s.udp_take_error(c).unwrap(), Some(EHOSTUNREACH));
        let r = s.udp_errqueue_pop(c).unwrap().expect("a report").0;
        assert_eq!((r.origin, r.icmp_type, r.code), (origin, te_type, 0));
        assert_eq!(r.errno, EHOSTUNREACH);
        assert_eq!(r.offender, Some(router));
        assert_eq!(r.dest, SocketAddr::new(peer, 33434));
        assert_eq!(r.payload, b"probe 2");
        assert_eq!(r.hop_limit, 64, "the ICMP packet's own");

        // An echo socket: the report quotes the whole echo request.
        let mut net = pair();
        let icmp = if peer.is_ipv4() {
            wire::IPPROTO_ICMP
        } else {
            wire::IPPROTO_ICMPV6
        };
        ttl_expires_for(&mut net, icmp);
        let s = net.stack_mut(0);
        let h = s
            .dgram_bind(DgramProto::Icmp, sa("[::]:777"), Families::Both, false)
            .unwrap();
        s.udp_set_recverr(h, fam, true).unwrap();
        let request = if peer.is_ipv4() { 8 } else { 128 };
        let msg = [request, 0, 0, 0, 0, 0, 0, 5, b'h', b'i'];
        s.udp_send_to(h, &msg, SocketAddr::new(peer, 0)).unwrap();
        settle(&mut net);
        let s = net.stack_mut(0);
        let r = s.udp_errqueue_pop(h).unwrap().expect("an echo report").0;
        assert_eq!((r.origin, r.icmp_type), (origin, te_type));
        assert_eq!(r.dest, SocketAddr::new(peer, 0));
        assert_eq!(r.payload.len(), msg.len());
        assert_eq!(r.payload[0], request);
        assert_eq!(r.payload[4..6], 777u16.to_be_bytes(), "its identifier");
        assert_eq!(r.payload[6..], msg[6..]);
    }
}
