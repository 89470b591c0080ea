//! Bad input never crashes the stack: one `Stack` is fed a million random and mutated
//! frames (mutations of real ARP, IPv4/IPv6 ICMP echo, UDP, fragments, NDP and
//! VLAN-tagged frames), with time moving on in between so reassembly and neighbour
//! timers run. Afterwards no buffer may be leaked, the drops must have been counted,
//! and the stack must still answer a clean peer's ping and UDP datagram.
//!
//! Seeded (`USNET_ROBUST_SEED`, `USNET_ROBUST_FRAMES` override), so a failure replays.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use usnet_stack::sim::{Faults, SimNet, SimRng};
use usnet_stack::{mac_from_seed, Counters, Instant, SocketHandle, Stack, StackConfig};

const FRAMES: u64 = 1_000_000;

fn target_cfg() -> StackConfig {
    StackConfig {
        mac: mac_from_seed(1),
        addrs: vec![
            "10.0.0.1/24".parse().unwrap(),
            "fd00::1/64".parse().unwrap(),
        ],
        seed: 1,
        ..Default::default()
    }
}

fn peer_cfg(i: u8) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![
            format!("10.0.0.{i}/24").parse().unwrap(),
            format!("fd00::{i}/64").parse().unwrap(),
        ],
        seed: i as u64,
        ..Default::default()
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ------------------------------------------------------------------ seed corpus

/// Moves frames between two stand-alone stacks until both are quiet, recording every
/// frame (both directions: the target's own frames make good "not for us" input).
fn exchange(a: &mut Stack, b: &mut Stack, now: &mut Instant, log: &mut Vec<Vec<u8>>) {
    let mut quiet = 0;
    let mut bytes = Vec::new();
    while quiet < 50 {
        *now = *now + Duration::from_millis(1);
        let mut did = a.poll(*now) | b.poll(*now);
        did |= forward(a, b, &mut bytes, log);
        did |= forward(b, a, &mut bytes, log);
        quiet = if did { 0 } else { quiet + 1 };
    }
}

fn forward(src: &mut Stack, dst: &mut Stack, bytes: &mut Vec<u8>, log: &mut Vec<Vec<u8>>) -> bool {
    let mut did = false;
    while let Some(f) = src.dequeue_tx() {
        src.pool().copy_chain(&f, bytes);
        src.pool_mut().free(f);
        log.push(bytes.clone());
        if let Some(nb) = dst.pool_mut().alloc_from(bytes) {
            dst.receive(nb);
        }
        did = true;
    }
    did
}

/// Real conversations between a copy of the target and a peer, captured frame by frame.
fn seed_corpus() -> Vec<Vec<u8>> {
    let mut t = Stack::new(target_cfg()).unwrap();
    let mut p = Stack::new(peer_cfg(2)).unwrap();
    let mut now = Instant::from_millis(1);
    let mut log = Vec::new();
    let t_echo = t.udp_bind(sa("0.0.0.0:7")).unwrap();
    let t_ping = t.ping_open();
    let p_udp = p.udp_bind(sa("0.0.0.0:0")).unwrap();
    let p_ping = p.ping_open();
    let t_udp = t.udp_bind(sa("0.0.0.0:0")).unwrap();
    let p_sink = p.udp_bind(sa("0.0.0.0:5000")).unwrap();
    let mut buf = vec![0u8; 70_000];
    {
        for dst in [ip("10.0.0.1"), ip("fd00::1")] {
            // Echo requests small and fragmented, both ways (replies to the target's
            // ping socket come back too).
            for (seq, size) in [(1u16, 56usize), (2, 4000), (3, 0)] {
                let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
                p.ping_send(p_ping, dst, seq, &data).unwrap();
                exchange(&mut p, &mut t, &mut now, &mut log);
                let back = if dst.is_ipv4() {
                    ip("10.0.0.2")
                } else {
                    ip("fd00::2")
                };
                t.ping_send(t_ping, back, seq, &data).unwrap();
                exchange(&mut p, &mut t, &mut now, &mut log);
            }
            // UDP to the open echo port, small and fragmented, and to a closed port
            // (port unreachable comes back).
            for (port, size) in [(7u16, 32usize), (7, 4000), (7, 1), (9, 64), (7, 20_000)] {
                let data: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
                p.udp_send_to(p_udp, &data, SocketAddr::new(dst, port))
                    .unwrap();
                exchange(&mut p, &mut t, &mut now, &mut log);
            }
            while let Ok((n, from)) = t.udp_recv_from(t_echo, &mut buf) {
                let data = buf[..n].to_vec();
                t.udp_send_to(t_echo, &data, from).unwrap();
            }
            exchange(&mut p, &mut t, &mut now, &mut log);
            // The target sends to the peer's closed port: an ICMP error comes to it.
            let back = if dst.is_ipv4() {
                sa("10.0.0.2:9999")
            } else {
                sa("[fd00::2]:9999")
            };
            t.udp_send_to(t_udp, b"closed?", back).unwrap();
            exchange(&mut p, &mut t, &mut now, &mut log);
            t.udp_send_to(t_udp, &[9u8; 3000], SocketAddr::new(back.ip(), 5000))
                .unwrap();
            exchange(&mut p, &mut t, &mut now, &mut log);
        }
    }
    while p.udp_recv_from(p_sink, &mut buf).is_ok() {}
    // Link-local IPv6 makes NS/NA to solicited-node addresses.
    let ll = t
        .addrs()
        .iter()
        .find(|c| matches!(c.addr, IpAddr::V6(a) if a.segments()[0] == 0xfe80))
        .unwrap()
        .addr;
    p.ping_send(p_ping, ll, 9, b"link-local").unwrap();
    exchange(&mut p, &mut t, &mut now, &mut log);
    // Let the neighbour entries go stale and be probed again.
    now = now + Duration::from_secs(120);
    p.ping_send(p_ping, ip("10.0.0.1"), 10, b"again").unwrap();
    p.ping_send(p_ping, ip("fd00::1"), 11, b"again").unwrap();
    exchange(&mut p, &mut t, &mut now, &mut log);
    // TCP: the peer talks to the target's listener over both families (handshake,
    // data both ways, orderly close) and knocks on a closed port (RST).
    let t_listen = t.tcp_listen(sa("0.0.0.0:80"), 8).unwrap();
    for dst in [sa("10.0.0.1:80"), sa("[fd00::1]:80")] {
        let c = p.tcp_connect(None, dst).unwrap();
        exchange(&mut p, &mut t, &mut now, &mut log);
        let s = t.tcp_accept(t_listen).unwrap();
        let data: Vec<u8> = (0..5000).map(|i| (i * 3) as u8).collect();
        assert_eq!(p.tcp_send(c, &data).unwrap(), data.len());
        exchange(&mut p, &mut t, &mut now, &mut log);
        let mut got = 0;
        while let Ok(n) = t.tcp_recv(s, &mut buf[got..]) {
            if n == 0 {
                break;
            }
            got += n;
        }
        assert_eq!(&buf[..got], &data[..]);
        t.tcp_send(s, b"tcp reply").unwrap();
        exchange(&mut p, &mut t, &mut now, &mut log);
        assert_eq!(p.tcp_recv(c, &mut buf).unwrap(), 9);
        p.tcp_close(c).unwrap();
        exchange(&mut p, &mut t, &mut now, &mut log);
        assert_eq!(t.tcp_recv(s, &mut buf).unwrap(), 0);
        t.tcp_close(s).unwrap();
        exchange(&mut p, &mut t, &mut now, &mut log);
        let r = p.tcp_connect(None, SocketAddr::new(dst.ip(), 81)).unwrap();
        exchange(&mut p, &mut t, &mut now, &mut log);
        assert_eq!(p.tcp_state(r).unwrap(), usnet_stack::TcpState::Closed);
        p.tcp_close(r).unwrap();
    }
    t.tcp_close(t_listen).unwrap();
    log
}

// ------------------------------------------------------------------ frame surgery

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn csum_finish(sum: u32) -> u16 {
    let mut s = sum;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Where the L3 header starts and which EtherType it is, after up to two VLAN tags.
fn l3_of(f: &[u8]) -> Option<(usize, u16)> {
    let mut off = 12;
    let mut et = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
    let mut tags = 0;
    while (et == 0x8100 || et == 0x88a8) && tags < 2 {
        off += 4;
        et = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
        tags += 1;
    }
    Some((off + 2, et))
}

/// Where the upper layer of an IPv6 packet starts (walking HBH/routing/dst-options) and
/// which protocol it is; `None` for fragments and anything odd.
fn ipv6_upper(f: &[u8], l3: usize) -> Option<(usize, u8)> {
    if f.len() < l3 + 40 {
        return None;
    }
    let mut nh = f[l3 + 6];
    let mut off = l3 + 40;
    for _ in 0..8 {
        match nh {
            0 | 43 | 60 => {
                nh = *f.get(off)?;
                off += (*f.get(off + 1)? as usize + 1) * 8;
            }
            44 => return None,
            _ => return Some((off, nh)),
        }
    }
    None
}

/// Recomputes the IPv4 header checksum and the UDP/ICMP/ICMPv6 checksum (when the
/// packet is not a fragment), so a mutated frame gets past the checks and reaches the
/// deeper layers. Never panics on garbage.
fn fix_checksums(f: &mut [u8]) {
    let Some((l3, et)) = l3_of(f) else { return };
    match et {
        0x0800 => {
            let Some(&vihl) = f.get(l3) else { return };
            let ihl = (vihl & 0x0f) as usize * 4;
            if ihl < 20 || f.len() < l3 + ihl {
                return;
            }
            f[l3 + 10] = 0;
            f[l3 + 11] = 0;
            let c = csum_finish(csum_add(0, &f[l3..l3 + ihl]));
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            let total = u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]) as usize;
            let frag = u16::from_be_bytes([f[l3 + 6], f[l3 + 7]]);
            if frag & 0x3fff != 0 || total < ihl {
                return;
            }
            let end = (l3 + total).min(f.len());
            let l4 = l3 + ihl;
            if end < l4 {
                return;
            }
            let proto = f[l3 + 9];
            let (pos, pseudo) = match proto {
                1 => (2, None),
                6 => (16, Some(6u8)),
                17 => (6, Some(17u8)),
                _ => return,
            };
            if end < l4 + pos + 2 {
                return;
            }
            f[l4 + pos] = 0;
            f[l4 + pos + 1] = 0;
            let mut s = 0;
            if let Some(p) = pseudo {
                s = csum_add(s, &f[l3 + 12..l3 + 20]);
                s = csum_add(s, &[0, p]);
                s = csum_add(s, &((end - l4) as u16).to_be_bytes());
            }
            let mut c = csum_finish(csum_add(s, &f[l4..end]));
            if c == 0 && proto == 17 {
                c = 0xffff;
            }
            f[l4 + pos..l4 + pos + 2].copy_from_slice(&c.to_be_bytes());
        }
        0x86dd => {
            let Some((l4, nh)) = ipv6_upper(f, l3) else {
                return;
            };
            let pos = match nh {
                58 => 2,
                6 => 16,
                17 => 6,
                _ => return,
            };
            if f.len() < l3 + 40 {
                return;
            }
            let plen = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]) as usize;
            let end = (l3 + 40 + plen).min(f.len());
            if end < l4 + pos + 2 {
                return;
            }
            f[l4 + pos] = 0;
            f[l4 + pos + 1] = 0;
            let mut s = csum_add(0, &f[l3 + 8..l3 + 40]);
            s = csum_add(s, &((end - l4) as u32).to_be_bytes());
            s = csum_add(s, &[0, 0, 0, nh]);
            let mut c = csum_finish(csum_add(s, &f[l4..end]));
            if c == 0 {
                c = 0xffff;
            }
            f[l4 + pos..l4 + pos + 2].copy_from_slice(&c.to_be_bytes());
        }
        _ => {}
    }
}

fn is_fragment(f: &[u8]) -> Option<Vec<u8>> {
    let (l3, et) = l3_of(f)?;
    match et {
        0x0800 => {
            let frag = u16::from_be_bytes([*f.get(l3 + 6)?, *f.get(l3 + 7)?]);
            (frag & 0x3fff != 0).then(|| f[l3 + 4..l3 + 6].to_vec())
        }
        0x86dd => (*f.get(l3 + 6)? == 44).then(|| f.get(l3 + 44..l3 + 48).map(|s| s.to_vec()))?,
        _ => None,
    }
}

/// Produces the frames to inject.
struct Mutator {
    corpus: Vec<Vec<u8>>,
    /// Fragments of one datagram each, in order.
    frag_groups: Vec<Vec<Vec<u8>>>,
    target_mac: [u8; 6],
    kinds: BTreeMap<&'static str, u64>,
}

impl Mutator {
    fn new(corpus: Vec<Vec<u8>>, target_mac: [u8; 6]) -> Self {
        let mut groups: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
        for f in &corpus {
            if let Some(key) = is_fragment(f) {
                groups.entry(key).or_default().push(f.clone());
            }
        }
        let frag_groups: Vec<_> = groups.into_values().filter(|g| g.len() > 1).collect();
        assert!(
            frag_groups.len() >= 4,
            "the corpus has fragmented datagrams"
        );
        Mutator {
            corpus,
            frag_groups,
            target_mac,
            kinds: BTreeMap::new(),
        }
    }

    fn count(&mut self, k: &'static str) {
        *self.kinds.entry(k).or_default() += 1;
    }

    /// A batch of frames: usually one mutated frame, sometimes a whole fragment storm.
    fn next(&mut self, r: &mut SimRng, out: &mut Vec<Vec<u8>>) {
        match r.below(100) {
            0..=3 => self.fragment_storm(r, out),
            4..=6 => {
                self.count("random");
                let max = if r.chance(0.9) { 128 } else { 9000 };
                let len = r.below(max) as usize;
                let mut f: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
                if r.chance(0.5) && f.len() >= 6 {
                    f[..6].copy_from_slice(&self.target_mac);
                }
                out.push(f);
            }
            _ => {
                let mut f = self.corpus[r.below(self.corpus.len() as u64) as usize].clone();
                // Half the corpus is the target's own output (to the peer's MAC): aim
                // most of it at the target so it gets past the Ethernet filter.
                if f.len() >= 6 && f[0] & 1 == 0 && r.chance(0.8) {
                    f[..6].copy_from_slice(&self.target_mac);
                }
                let rounds = 1 + r.below(3);
                for _ in 0..rounds {
                    self.mutate(r, &mut f);
                }
                if r.chance(0.6) {
                    fix_checksums(&mut f);
                }
                out.push(f);
            }
        }
    }

    fn mutate(&mut self, r: &mut SimRng, f: &mut Vec<u8>) {
        let l3 = l3_of(f);
        match r.below(22) {
            0..=3 => {
                self.count("bitflip");
                for _ in 0..1 + r.below(8) {
                    if !f.is_empty() {
                        let i = r.below(f.len() as u64) as usize;
                        f[i] ^= 1 << r.below(8);
                    }
                }
            }
            4 => {
                self.count("byte");
                if !f.is_empty() {
                    let i = r.below(f.len() as u64) as usize;
                    f[i] = [0, 0xff, 0x7f, 0x80, r.next_u64() as u8][r.below(5) as usize];
                }
            }
            5..=6 => {
                self.count("truncate");
                let n = r.below(f.len() as u64 + 1) as usize;
                f.truncate(n);
            }
            7 => {
                self.count("extend");
                let n = r.below(64) as usize;
                let zero = r.chance(0.5);
                f.extend((0..n).map(|_| if zero { 0 } else { r.next_u64() as u8 }));
            }
            8 => {
                self.count("ethertype");
                if f.len() >= 14 {
                    let et: u16 = match r.below(6) {
                        0 => 0x0800,
                        1 => 0x86dd,
                        2 => 0x0806,
                        3 => 0x8100,
                        4 => 0x88a8,
                        _ => r.next_u64() as u16,
                    };
                    f[12..14].copy_from_slice(&et.to_be_bytes());
                }
            }
            9..=10 => {
                self.count("vlan");
                if f.len() >= 12 {
                    let tpid: u16 = if r.chance(0.8) { 0x8100 } else { 0x88a8 };
                    let tci = (r.next_u64() as u16).to_be_bytes();
                    let mut tag = tpid.to_be_bytes().to_vec();
                    tag.extend_from_slice(&tci);
                    f.splice(12..12, tag);
                }
            }
            11 => {
                self.count("dst_mac");
                if f.len() >= 6 {
                    let m: [u8; 6] = match r.below(4) {
                        0 => [0xff; 6],
                        1 => [0x33, 0x33, 0xff, 0, 0, 1],
                        2 => [0x01, 0x00, 0x5e, 0, 0, 1],
                        _ => self.target_mac,
                    };
                    f[..6].copy_from_slice(&m);
                }
            }
            12..=13 => {
                self.count("length_field");
                if let Some((l3, et)) = l3 {
                    let lie = |r: &mut SimRng, v: u16| -> u16 {
                        match r.below(6) {
                            0 => 0,
                            1 => 0xffff,
                            2 => v.wrapping_add(1 + r.below(16) as u16),
                            3 => v.wrapping_sub(1 + r.below(16) as u16),
                            4 => r.below(64) as u16,
                            _ => r.next_u64() as u16,
                        }
                    };
                    let pos = match (et, r.below(2)) {
                        (0x0800, 0) => l3 + 2,
                        (0x86dd, 0) => l3 + 4,
                        (0x0800, _) => {
                            // The UDP length.
                            let ihl = f.get(l3).map(|b| (b & 15) as usize * 4).unwrap_or(20);
                            l3 + ihl + 4
                        }
                        (0x86dd, _) => l3 + 44,
                        _ => l3,
                    };
                    if f.len() >= pos + 2 {
                        let v = u16::from_be_bytes([f[pos], f[pos + 1]]);
                        f[pos..pos + 2].copy_from_slice(&lie(r, v).to_be_bytes());
                    }
                }
            }
            14 => {
                self.count("ihl");
                if let Some((l3, 0x0800)) = l3 {
                    if let Some(b) = f.get_mut(l3) {
                        *b = (*b & 0xf0) | r.below(16) as u8;
                    }
                }
            }
            15 => {
                self.count("frag_field");
                if let Some((l3, et)) = l3 {
                    if et == 0x0800 && f.len() >= l3 + 8 {
                        let v: u16 = match r.below(4) {
                            0 => 0x2000 | r.below(0x2000) as u16, // MF + offset
                            1 => r.below(0x2000) as u16,          // last fragment
                            2 => 0x4000,                          // DF
                            _ => r.next_u64() as u16,
                        };
                        f[l3 + 6..l3 + 8].copy_from_slice(&v.to_be_bytes());
                    } else if et == 0x86dd && f.len() >= l3 + 40 {
                        // Turn it into a fragment: insert a fragment header.
                        let nh = f[l3 + 6];
                        let off_m = (r.below(0x2000) as u16) << 3 | r.below(2) as u16;
                        let mut fh = vec![nh, 0];
                        fh.extend_from_slice(&off_m.to_be_bytes());
                        fh.extend_from_slice(&(r.next_u64() as u32).to_be_bytes());
                        f.splice(l3 + 40..l3 + 40, fh);
                        f[l3 + 6] = 44;
                        let plen = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]).wrapping_add(8);
                        f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
                    }
                }
            }
            16 => {
                self.count("ext_header");
                if let Some((l3, 0x86dd)) = l3 {
                    if f.len() >= l3 + 40 {
                        let nh = f[l3 + 6];
                        let kind = [0u8, 43, 60, 60, 59][r.below(5) as usize];
                        let words = r.below(3) as usize;
                        let mut h = vec![nh, words as u8];
                        h.resize(8 * (words + 1), 0);
                        if kind == 0 || kind == 60 {
                            // A PadN option covering the rest, or garbage options.
                            h[2] = if r.chance(0.8) { 1 } else { r.next_u64() as u8 };
                            h[3] = (h.len() - 4) as u8;
                        } else if kind == 43 {
                            h[2] = r.below(5) as u8; // routing type
                            h[3] = r.below(3) as u8; // segments left
                        }
                        let n = h.len() as u16;
                        f.splice(l3 + 40..l3 + 40, h);
                        f[l3 + 6] = kind;
                        let plen = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]).wrapping_add(n);
                        f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
                    }
                }
            }
            17 => {
                self.count("ndp");
                // NDP: hop limit, code and option lengths (zero-length options loop
                // forever in a careless parser).
                if let Some((l3, 0x86dd)) = l3 {
                    if let Some((l4, 58)) = ipv6_upper(f, l3) {
                        match r.below(4) {
                            0 => f[l3 + 7] = [255, 254, 64, 1][r.below(4) as usize],
                            1 => {
                                if let Some(b) = f.get_mut(l4 + 1) {
                                    *b = r.below(3) as u8;
                                }
                            }
                            2 => {
                                if let Some(b) = f.get_mut(l4 + 25) {
                                    *b = [0, 1, 2, 255][r.below(4) as usize];
                                }
                            }
                            _ => {
                                if let Some(b) = f.get_mut(l4) {
                                    *b = [133, 134, 135, 136, 137, 128, 129, 1, 3]
                                        [r.below(9) as usize];
                                }
                            }
                        }
                    }
                }
            }
            18 => {
                self.count("src_addr");
                // Odd sources: unspecified, multicast, broadcast, our own address.
                if let Some((l3, et)) = l3 {
                    if et == 0x0800 && f.len() >= l3 + 16 {
                        let a: [u8; 4] = match r.below(4) {
                            0 => [0, 0, 0, 0],
                            1 => [224, 0, 0, 1],
                            2 => [255, 255, 255, 255],
                            _ => [10, 0, 0, 1],
                        };
                        f[l3 + 12..l3 + 16].copy_from_slice(&a);
                    } else if et == 0x86dd && f.len() >= l3 + 24 {
                        let mut a = [0u8; 16];
                        match r.below(3) {
                            0 => {}
                            1 => {
                                a[0] = 0xff;
                                a[1] = 0x02;
                                a[15] = 1;
                            }
                            _ => {
                                a[0] = 0xfd;
                                a[15] = 1;
                            }
                        }
                        f[l3 + 8..l3 + 24].copy_from_slice(&a);
                    } else if et == 0x0806 && f.len() >= l3 + 28 {
                        // ARP sender IP.
                        let a: [u8; 4] =
                            [[0, 0, 0, 0], [10, 0, 0, 1], [10, 0, 0, 77]][r.below(3) as usize];
                        f[l3 + 14..l3 + 18].copy_from_slice(&a);
                    }
                }
            }
            19 => {
                self.count("splice");
                let other = &self.corpus[r.below(self.corpus.len() as u64) as usize];
                let cut = r.below(f.len() as u64 + 1) as usize;
                let from = r.below(other.len() as u64 + 1) as usize;
                f.truncate(cut);
                f.extend_from_slice(&other[from..]);
            }
            20 => {
                self.count("icmp_type");
                if let Some((l3, et)) = l3 {
                    let l4 = match et {
                        0x0800 => f.get(l3).map(|b| l3 + (b & 15) as usize * 4),
                        0x86dd => ipv6_upper(f, l3).map(|u| u.0),
                        _ => None,
                    };
                    if let Some(l4) = l4 {
                        if let Some(b) = f.get_mut(l4) {
                            *b = r.below(256) as u8;
                        }
                        if let Some(b) = f.get_mut(l4 + 1) {
                            *b = r.below(20) as u8;
                        }
                    }
                }
            }
            _ => {
                self.count("port");
                if let Some((l3, et)) = l3 {
                    let l4 = match et {
                        0x0800 => f.get(l3).map(|b| l3 + (b & 15) as usize * 4),
                        0x86dd => ipv6_upper(f, l3).map(|u| u.0),
                        _ => None,
                    };
                    if let Some(l4) = l4 {
                        let p: u16 = [0, 7, 9, 19, 53, 65535][r.below(6) as usize];
                        let at = l4 + 2 * r.below(2) as usize;
                        if f.len() >= at + 2 {
                            f[at..at + 2].copy_from_slice(&p.to_be_bytes());
                        }
                    }
                }
            }
        }
    }

    /// The fragments of one datagram, shuffled, duplicated, dropped, overlapped, with
    /// lying offsets or MF bits, under a fresh identification.
    fn fragment_storm(&mut self, r: &mut SimRng, out: &mut Vec<Vec<u8>>) {
        self.count("frag_storm");
        let g = self.frag_groups[r.below(self.frag_groups.len() as u64) as usize].clone();
        let ident = r.next_u64() as u32;
        let mut frags = Vec::new();
        let clean = r.chance(0.3);
        for mut f in g {
            let Some((l3, et)) = l3_of(&f) else { continue };
            // (position of the offset field, position of the ident, ident width)
            let (off_at, id_at, id_len) = if et == 0x0800 {
                (l3 + 6, l3 + 4, 2)
            } else {
                (l3 + 42, l3 + 44, 4)
            };
            f[id_at..id_at + id_len].copy_from_slice(&ident.to_be_bytes()[4 - id_len..]);
            if !clean {
                match r.below(10) {
                    0 => continue, // lost: the datagram times out
                    1 => frags.push(f.clone()),
                    2 => {
                        // Overlap: move the offset a little.
                        let v = u16::from_be_bytes([f[off_at], f[off_at + 1]]);
                        let delta = (1 + r.below(4) as u16) << if et == 0x0800 { 0 } else { 3 };
                        let nv = if r.chance(0.5) {
                            v.wrapping_add(delta)
                        } else {
                            v.wrapping_sub(delta)
                        };
                        f[off_at..off_at + 2].copy_from_slice(&nv.to_be_bytes());
                    }
                    3 => {
                        // Flip MF.
                        f[off_at + 1 - (et == 0x0800) as usize] ^=
                            if et == 0x0800 { 0x20 } else { 0x01 };
                    }
                    4 => {
                        // Short (not a multiple of 8) or truncated fragment.
                        let n = f.len().saturating_sub(1 + r.below(40) as usize);
                        f.truncate(n.max(l3 + 20));
                        if et == 0x0800 {
                            let tot = (f.len() - l3) as u16;
                            f[l3 + 2..l3 + 4].copy_from_slice(&tot.to_be_bytes());
                        } else if f.len() >= l3 + 40 {
                            let plen = (f.len() - l3 - 40) as u16;
                            f[l3 + 4..l3 + 6].copy_from_slice(&plen.to_be_bytes());
                        }
                    }
                    5 => self.mutate(r, &mut f),
                    6 => {
                        // Huge offset: past 65535 once reassembled.
                        let v = u16::from_be_bytes([f[off_at], f[off_at + 1]]);
                        let nv = if et == 0x0800 {
                            (v & 0xe000) | 0x1fff
                        } else {
                            (v & 0x7) | 0xfff8
                        };
                        f[off_at..off_at + 2].copy_from_slice(&nv.to_be_bytes());
                    }
                    _ => {}
                }
            }
            fix_checksums(&mut f);
            frags.push(f);
        }
        if !clean || r.chance(0.5) {
            for i in (1..frags.len()).rev() {
                let j = r.below(i as u64 + 1) as usize;
                frags.swap(i, j);
            }
        }
        out.extend(frags);
    }
}

// ------------------------------------------------------------------ the test

fn drain_udp(s: &mut Stack, h: SocketHandle, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while s.udp_recv_from(h, buf).is_ok() {
        n += 1;
    }
    n
}

/// Pings the target (stack 0) from stack `from`; true when the reply came.
fn ping_ok(net: &mut SimNet, from: usize, dst: IpAddr, seq: u16) -> bool {
    let h = net.stack_mut(from).ping_open();
    net.stack_mut(from)
        .ping_send(h, dst, seq, b"are you still alive?")
        .unwrap();
    let ok = net.run_until(Duration::from_secs(5), |n| {
        n.stack_mut(from).ping_recv(h).is_ok_and(|r| r.seq == seq)
    });
    net.stack_mut(from).close(h).unwrap();
    ok
}

/// A datagram from `from` to the target's port 7, echoed by the test, comes back.
fn udp_ok(net: &mut SimNet, from: usize, echo: SocketHandle, dst: SocketAddr) -> bool {
    let h = net.stack_mut(from).udp_bind(sa("0.0.0.0:0")).unwrap();
    let msg = b"hello after the storm";
    net.stack_mut(from).udp_send_to(h, msg, dst).unwrap();
    let mut buf = [0u8; 256];
    let mut got = None;
    if !net.run_until(Duration::from_secs(5), |n| {
        got = n.stack_mut(0).udp_recv_from(echo, &mut buf).ok();
        got.is_some()
    }) {
        return false;
    }
    let (len, peer) = got.unwrap();
    assert_eq!(&buf[..len], msg);
    net.stack_mut(0)
        .udp_send_to(echo, msg, peer)
        .expect("echo back");
    let ok = net.run_until(Duration::from_secs(5), |n| {
        n.stack_mut(from)
            .udp_recv_from(h, &mut buf)
            .is_ok_and(|(l, _)| &buf[..l] == msg)
    });
    net.stack_mut(from).close(h).unwrap();
    ok
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a storm left behind.
struct Storm {
    net: SimNet,
    echo: SocketHandle,
    counters: Counters,
    injected: u64,
    /// Frames the test could not even put in a buffer (the pool was empty).
    no_buf: u64,
}

/// Feeds `total` frames to a stack built from `target` (index 0 of a `SimNet`), then
/// lets it settle and checks that no buffer is held but by the (drained) sockets.
fn storm(seed: u64, total: u64, target: StackConfig) -> Storm {
    let t0 = std::time::Instant::now();
    let corpus = seed_corpus();
    assert!(corpus.len() > 40, "seed corpus has {} frames", corpus.len());
    if let Some(dir) = std::env::var_os("USNET_FUZZ_SEEDS") {
        write_fuzz_seeds(std::path::Path::new(&dir), &corpus);
    }
    let mut m = Mutator::new(corpus, target.mac.0);

    let mut net = SimNet::new(seed, Faults::default());
    assert_eq!(net.add(target).unwrap(), 0);
    let echo = net.stack_mut(0).udp_bind(sa("0.0.0.0:7")).unwrap();
    let echo6 = net.stack_mut(0).udp_bind(sa("[fd00::1]:5000")).unwrap();
    let ping = net.stack_mut(0).ping_open();
    let listener = net.stack_mut(0).tcp_listen(sa("0.0.0.0:80"), 16).unwrap();
    let mut r = SimRng::new(seed);
    let mut batch = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let (mut injected, mut no_buf, mut received) = (0u64, 0u64, 0u64);
    while injected < total {
        // Most rounds carry a few frames; some exceed the receive budget or even the
        // input queue (drop 1).
        let frames = match r.below(200) {
            0 => 300 + r.below(1200),
            1..=20 => 32 + r.below(200),
            _ => 1 + r.below(8),
        };
        batch.clear();
        while (batch.len() as u64) < frames {
            m.next(&mut r, &mut batch);
        }
        let s = net.stack_mut(0);
        for f in &batch {
            injected += 1;
            match s.pool_mut().alloc_from(f) {
                Some(b) => s.receive(b),
                None => no_buf += 1,
            }
        }
        // Time moves on: mostly a little, sometimes past the neighbour retries,
        // sometimes past the 30 s reassembly limit.
        match r.below(1000) {
            0..=2 => net.run_for(Duration::from_secs(31)),
            3..=30 => net.run_for(Duration::from_millis(1 + r.below(3000))),
            _ => {
                net.step();
            }
        }
        // The application: reads now and then, sometimes answering (to whatever the
        // mutated source was: neighbour resolution for odd addresses is exercised).
        if r.chance(0.2) {
            let s = net.stack_mut(0);
            for h in [echo, echo6] {
                for _ in 0..r.below(64) {
                    match s.udp_recv_from(h, &mut buf) {
                        Ok((n, from)) => {
                            received += 1;
                            if r.chance(0.1) {
                                let data = buf[..n].to_vec();
                                let _ = s.udp_send_to(h, &data, from);
                            }
                        }
                        Err(_) => break,
                    }
                }
            }
            while s.ping_recv(ping).is_ok() {}
            while let Ok(c) = s.tcp_accept(listener) {
                let _ = s.tcp_recv(c, &mut buf);
                let _ = s.tcp_close(c);
            }
        }
    }
    let fuzz_time = t0.elapsed();

    // Settle: input processed, resolutions given up, reassemblies expired.
    net.run_for(Duration::from_secs(40));
    let s = net.stack_mut(0);
    assert_eq!(s.input_len(), 0);
    received += drain_udp(s, echo, &mut buf) as u64;
    received += drain_udp(s, echo6, &mut buf) as u64;
    while s.ping_recv(ping).is_ok() {}
    // Only live sockets may hold buffers, and they are drained.
    assert_eq!(
        s.pool().in_use(),
        0,
        "buffers leaked: {:?}",
        s.pool().stats()
    );
    let counters = s.counters().clone();
    print_counters(&counters);
    eprintln!("mutations: {:?}", m.kinds);
    eprintln!(
        "{injected} frames injected ({no_buf} found the pool empty), {received} datagrams read, \
         fuzzing took {fuzz_time:?}"
    );
    // Every frame that got a buffer was either processed or dropped at the entrance;
    // the rest of `link_rx_frames` are packets the stack sent to its own address
    // (mutated sources), which `dispatch` loops back through `receive`.
    let c = &counters;
    let seen = c.link_rx_frames + c.drop_input_queue_full;
    assert!(
        seen >= injected - no_buf,
        "frame accounting: {seen} < {injected} - {no_buf}"
    );
    assert!(
        seen - (injected - no_buf) <= c.ip4_tx + c.ip6_tx,
        "frame accounting: {seen} frames seen for {injected} injected"
    );
    Storm {
        net,
        echo,
        counters,
        injected,
        no_buf,
    }
}

/// A clean peer that never saw the storm still gets answers, and the exchange leaves
/// no buffer behind.
fn clean_peer_is_answered(st: &mut Storm) {
    let net = &mut st.net;
    let echo = st.echo;
    let peer = net.add(peer_cfg(3)).unwrap();
    assert!(ping_ok(net, peer, ip("10.0.0.1"), 1), "IPv4 ping");
    assert!(ping_ok(net, peer, ip("fd00::1"), 2), "IPv6 ping");
    assert!(udp_ok(net, peer, echo, sa("10.0.0.1:7")), "UDP over IPv4");
    assert!(udp_ok(net, peer, echo, sa("[fd00::1]:7")), "UDP over IPv6");
    net.run_for(Duration::from_secs(5));
    let s = net.stack_mut(0);
    drain_udp(s, echo, &mut [0u8; 2048]);
    assert_eq!(s.pool().in_use(), 0, "buffers after the clean exchange");
}

#[test]
fn a_million_bad_frames_do_not_hurt() {
    let t0 = std::time::Instant::now();
    let seed = env_u64("USNET_ROBUST_SEED", 0x0bad_f00d);
    let total = env_u64("USNET_ROBUST_FRAMES", FRAMES);
    let mut st = storm(seed, total, target_cfg());
    let c = &st.counters;
    // The drops were counted, under the names one would look for.
    for (name, v) in [
        ("drop_input_queue_full", c.drop_input_queue_full),
        ("eth_rx_truncated", c.eth_rx_truncated),
        ("eth_rx_not_for_us", c.eth_rx_not_for_us),
        ("eth_rx_unknown_type", c.eth_rx_unknown_type),
        ("eth_rx_vlan_tagged", c.eth_rx_vlan_tagged),
        ("arp_rx_malformed", c.arp_rx_malformed),
        ("ip4_rx_truncated", c.ip4_rx_truncated),
        ("ip4_rx_bad_checksum", c.ip4_rx_bad_checksum),
        ("ip4_rx_bad_header", c.ip4_rx_bad_header),
        ("ip4_rx_not_for_us", c.ip4_rx_not_for_us),
        ("ip4_rx_unknown_proto", c.ip4_rx_unknown_proto),
        ("ip4_reassembled", c.ip4_reassembled),
        ("ip4_reasm_timeout", c.ip4_reasm_timeout),
        ("ip4_reasm_bad", c.ip4_reasm_bad),
        ("ip6_rx_truncated", c.ip6_rx_truncated),
        ("ip6_rx_bad_header", c.ip6_rx_bad_header),
        ("ip6_rx_not_for_us", c.ip6_rx_not_for_us),
        ("ip6_rx_unknown_proto", c.ip6_rx_unknown_proto),
        ("ip6_reassembled", c.ip6_reassembled),
        ("ip6_reasm_timeout", c.ip6_reasm_timeout),
        ("ip6_reasm_bad", c.ip6_reasm_bad),
        ("icmp4_rx_bad_checksum", c.icmp4_rx_bad_checksum),
        ("icmp4_rx_malformed", c.icmp4_rx_malformed),
        ("icmp6_rx_bad_checksum", c.icmp6_rx_bad_checksum),
        ("icmp6_rx_malformed", c.icmp6_rx_malformed),
        ("icmp6_rx_ndp_invalid", c.icmp6_rx_ndp_invalid),
        ("udp_rx_truncated", c.udp_rx_truncated),
        ("udp_rx_bad_checksum", c.udp_rx_bad_checksum),
        ("udp_rx_no_socket", c.udp_rx_no_socket),
        ("udp_rx_delivered", c.udp_rx_delivered),
        ("icmp4_tx_echo_reply", c.icmp4_tx_echo_reply),
        ("icmp6_tx_echo_reply", c.icmp6_tx_echo_reply),
        ("icmp6_tx_neighbor_advert", c.icmp6_tx_neighbor_advert),
        ("arp_tx_reply", c.arp_tx_reply),
    ] {
        assert!(
            v > 0 || total < 100_000,
            "counter {name} never moved in {} frames",
            st.injected
        );
    }
    clean_peer_is_answered(&mut st);
    eprintln!("total {:?}", t0.elapsed());
}

/// The same storm into a stack with a tiny pool and short queues: allocation failures
/// on every path (device, reassembly delivery, replies) must be counted, not leak.
#[test]
fn a_storm_into_a_starved_pool_leaks_nothing() {
    let seed = env_u64("USNET_ROBUST_SEED", 0x5ca2_ce00);
    let total = env_u64("USNET_ROBUST_FRAMES", FRAMES) / 5;
    let cfg = StackConfig {
        pool: usnet_pool::PoolConfig {
            count: 32,
            ..Default::default()
        },
        // Longer than the pool: frames waiting for `poll` can drain it.
        input_queue_len: 64,
        rx_budget: 16,
        tx_queue_len: 16,
        neighbor_pending: 4,
        neighbor_cache_size: 8,
        reasm_max_datagrams: 4,
        reasm_memory: 64 << 10,
        udp_recv_buffer: 8192,
        ..target_cfg()
    };
    let mut st = storm(seed, total, cfg);
    let c = &st.counters;
    assert!(st.no_buf > 0, "the pool never ran dry");
    for (name, v) in [
        ("drop_pool_exhausted", c.drop_pool_exhausted),
        ("udp_rx_queue_full", c.udp_rx_queue_full),
        (
            "ip4_reasm_overflow",
            c.ip4_reasm_overflow + c.ip4_reasm_evicted,
        ),
        (
            "ip6_reasm_overflow",
            c.ip6_reasm_overflow + c.ip6_reasm_evicted,
        ),
    ] {
        assert!(v > 0 || total < 20_000, "counter {name} never moved");
    }
    clean_peer_is_answered(&mut st);
}

/// Seeds for `fuzz/fuzz_targets/stack_rx.rs` (its input format: `[ctl][len u16 LE]
/// [frame]` records): the captured conversations, a few frames per file, so the fuzzer
/// starts from valid ARP/NDP/ICMP/UDP/fragments instead of from nothing.
/// `USNET_FUZZ_SEEDS=fuzz/corpus/stack_rx cargo test -p usnet-stack --test robustness`
fn write_fuzz_seeds(dir: &std::path::Path, corpus: &[Vec<u8>]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, chunk) in corpus.chunks(6).enumerate() {
        let mut data = Vec::new();
        for (j, f) in chunk.iter().enumerate() {
            // Poll now; the last record of a file also moves the clock a little.
            data.push(if j + 1 == chunk.len() { 0x19 } else { 0x08 });
            data.extend_from_slice(&(f.len() as u16).to_le_bytes());
            data.extend_from_slice(f);
        }
        std::fs::write(dir.join(format!("seed-{i:03}")), data).unwrap();
    }
}

fn print_counters(c: &Counters) {
    for (name, _, v) in c.entries() {
        if v != 0 {
            eprintln!("{v:>12} {name}");
        }
    }
}

/// BUG (neighbor.rs): a full neighbour cache never makes room. Entries stay for 4×TTL
/// (`NeighborCache::poll` forgets `Reachable` ones only after `ttl * 4`), and `learn`
/// and `hold` refuse new entries when `max_entries` is reached, so anyone on the link
/// who sends one ARP request per spoofed sender address (any address: `handle_arp` does
/// not check that the sender is on-link) locks every new neighbour out for four
/// minutes: the stack answers their ARP request but its own echo reply finds no cache
/// entry and is dropped. Linux instead evicts unreferenced entries when the table is
/// full (forced garbage collection at gc_thresh3).
#[test]
fn spoofed_arp_requests_do_not_lock_out_new_neighbours() {
    let mut net = SimNet::new(7, Faults::default());
    net.add(target_cfg()).unwrap();
    let size = target_cfg().neighbor_cache_size;
    for i in 0..size as u32 {
        // ARP request "who has 10.0.0.1? tell 172.16.x.y", each from its own MAC.
        let mut f = vec![0xff; 6];
        let mac = [0x02, 0xee, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8];
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[172, 16 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&[10, 0, 0, 1]);
        let s = net.stack_mut(0);
        let b = s.pool_mut().alloc_from(&f).unwrap();
        s.receive(b);
        if s.input_len() >= 256 {
            net.step();
        }
    }
    // A minute later (past the TTL, well before the 4×TTL expiry) a new peer comes.
    net.run_for(Duration::from_secs(61));
    let peer = net.add(peer_cfg(3)).unwrap();
    let ok4 = ping_ok(&mut net, peer, ip("10.0.0.1"), 1);
    let ok6 = ping_ok(&mut net, peer, ip("fd00::1"), 2);
    assert!(
        ok4 && ok6,
        "a new neighbour gets no answer once spoofed ARP filled the cache \
         (IPv4 ok: {ok4}, IPv6 ok: {ok6}; neighbours: {})",
        net.stack(0).neighbors().len()
    );
}
