//! Seeded random and mutation testing of every parser (`usnet-sim`'s generator).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use usnet_sim::SimRng;

use crate::testing::{walk_frame, walk_raw};
use crate::*;

const MAC_A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
const MAC_B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; ETHERNET_HEADER_LEN];
    emit_ethernet(&mut f, MAC_B, MAC_A, ethertype).unwrap();
    f.extend_from_slice(payload);
    f
}

fn v4(protocol: u8, l4: &[u8]) -> Vec<u8> {
    let r = Ipv4Repr {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        protocol,
        payload_len: l4.len(),
        ttl: 64,
        ident: 7,
        dont_frag: true,
        more_frags: false,
        frag_offset: 0,
    };
    let mut p = vec![0u8; 20];
    r.emit(&mut p).unwrap();
    p.extend_from_slice(l4);
    eth(ethertype::IPV4, &p)
}

fn v6(next: u8, rest: &[u8]) -> Vec<u8> {
    let r = Ipv6Repr {
        src: "fe80::1".parse().unwrap(),
        dst: "fe80::2".parse().unwrap(),
        next_header: next,
        payload_len: rest.len(),
        hop_limit: 255,
    };
    let mut p = vec![0u8; 40];
    r.emit(&mut p).unwrap();
    p.extend_from_slice(rest);
    eth(ethertype::IPV6, &p)
}

/// Valid frames of every kind, to mutate.
fn seeds() -> Vec<Vec<u8>> {
    let s4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let d4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let s6: Ipv6Addr = "fe80::1".parse().unwrap();
    let d6: Ipv6Addr = "fe80::2".parse().unwrap();
    let mut out = vec![];

    let mut arp = [0u8; ARP_LEN];
    ArpRepr {
        op: ArpOp::Request,
        sender_mac: MAC_A,
        sender_ip: Ipv4Addr::new(10, 0, 0, 1),
        target_mac: MacAddr::ZERO,
        target_ip: Ipv4Addr::new(10, 0, 0, 2),
    }
    .emit(&mut arp)
    .unwrap();
    out.push(eth(ethertype::ARP, &arp));

    let mut udp = vec![0u8; 8 + 32];
    emit_udp_header(&mut udp, s4, d4, 1000, 2000, true).unwrap();
    out.push(v4(IPPROTO_UDP, &udp));

    let mut icmp = [0u8; 16];
    Icmpv4Repr::EchoRequest {
        ident: 1,
        seq: 2,
        data: b"pingping",
    }
    .emit(&mut icmp)
    .unwrap();
    out.push(v4(IPPROTO_ICMP, &icmp));

    let mut opts = TcpOptions {
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        timestamps: Some((1, 2)),
        ..TcpOptions::default()
    };
    opts.push_sack(10, 20);
    let t = TcpRepr {
        src_port: 1,
        dst_port: 2,
        seq: 3,
        ack: 4,
        flags: TcpFlags::ACK,
        window: 100,
        urgent: 0,
        options: opts,
    };
    let mut tcp = vec![0u8; t.header_len() + 10];
    t.emit(&mut tcp, s4, d4, 10, true).unwrap();
    out.push(v4(IPPROTO_TCP, &tcp));

    let ns = Icmpv6Repr::NeighborSolicit {
        target: d6,
        source_mac: Some(MAC_A),
    };
    let mut b = vec![0u8; ns.buffer_len()];
    ns.emit(&s6, &d6, &mut b).unwrap();
    out.push(v6(IPPROTO_ICMPV6, &b));

    let ra = Icmpv6Repr::RouterAdvert {
        hop_limit: 64,
        router_lifetime: 1800,
        source_mac: Some(MAC_B),
        mtu: Some(1500),
    };
    let mut b = vec![0u8; ra.buffer_len()];
    ra.emit(&s6, &d6, &mut b).unwrap();
    out.push(v6(IPPROTO_ICMPV6, &b));

    // HBH -> Frag(atomic) -> UDP
    let mut chain = vec![IPPROTO_FRAGMENT, 0, 1, 4, 0, 0, 0, 0];
    let mut fh = [0u8; 8];
    emit_ipv6_fragment_header(&mut fh, IPPROTO_UDP, 0, false, 99).unwrap();
    chain.extend_from_slice(&fh);
    let mut udp6 = vec![0u8; 8 + 5];
    emit_udp_header(&mut udp6, s6.into(), d6.into(), 53, 53, true).unwrap();
    chain.extend_from_slice(&udp6);
    out.push(v6(IPPROTO_HOPOPTS, &chain));

    let mut tcp6 = vec![0u8; t.header_len()];
    t.emit(&mut tcp6, s6.into(), d6.into(), 0, true).unwrap();
    out.push(v6(IPPROTO_TCP, &tcp6));

    // VLAN-tagged ARP.
    let mut tagged = vec![0u8; 18];
    emit_ethernet_vlan(&mut tagged, MAC_B, MAC_A, 42, ethertype::ARP).unwrap();
    tagged.extend_from_slice(&arp);
    out.push(tagged);
    out
}

#[test]
fn seeds_walk_fully() {
    let depth: Vec<u32> = seeds().iter().map(|f| walk_frame(f)).collect();
    // ARP: 2; IP + transport: 3; IPv6 + ext walk + transport: 3 (ext walk counted).
    assert_eq!(depth, [2, 3, 3, 3, 4, 4, 4, 4, 2]);
}

#[test]
fn random_and_mutated_inputs_never_panic() {
    const ROUNDS: usize = 200_000;
    let seeds = seeds();
    let mut rng = SimRng::new(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; 2048];
    let mut parsed = 0u64;
    for round in 0..ROUNDS {
        let len;
        if round % 2 == 0 {
            // Pure random bytes, mostly short.
            len = if rng.index(4) == 0 {
                rng.index(1600)
            } else {
                rng.index(96)
            };
            for b in buf[..len].iter_mut() {
                *b = rng.next_u64() as u8;
            }
        } else {
            let s = &seeds[rng.index(seeds.len())];
            len = s.len();
            buf[..len].copy_from_slice(s);
            for _ in 0..1 + rng.index(4) {
                let i = rng.index(len);
                buf[i] = match rng.index(4) {
                    0 => rng.next_u64() as u8,
                    1 => buf[i] ^ (1 << rng.index(8)),
                    2 => [0, 1, 2, 0x7f, 0x80, 0xff][rng.index(6)],
                    _ => buf[i].wrapping_add(1),
                };
            }
        }
        // Also every kind of truncation.
        let cut = if rng.index(3) == 0 {
            rng.index(len + 1)
        } else {
            len
        };
        parsed += u64::from(walk_raw(&buf[..cut]));
    }
    eprintln!("layers parsed: {parsed}");
    // The mutated seeds must get deep often, or the test proves little.
    assert!(parsed > ROUNDS as u64, "only {parsed} layers parsed");
}

#[test]
fn every_truncation_of_every_seed() {
    for s in seeds() {
        let full = walk_frame(&s);
        for n in 0..s.len() {
            assert!(walk_frame(&s[..n]) <= full);
            walk_raw(&s[..n]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..1600)) {
        walk_raw(&data);
    }

    #[test]
    fn arbitrary_ext_chains(first in any::<u8>(), data in proptest::collection::vec(
        prop_oneof![Just(0u8), Just(43), Just(44), Just(51), Just(59), Just(60), Just(6), Just(17), any::<u8>()], 0..200)) {
        if let Ok(u) = skip_ext_headers(first, &data) {
            prop_assert!(u.offset + u.payload.len() <= data.len());
        }
    }
}
