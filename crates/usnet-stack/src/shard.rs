//! Shards: one host's stack cut into N complete stacks, one per core, that share
//! nothing on the per-packet path (each its own pool, timers, connection table).
//!
//! Which shard a frame belongs to is a pure function of its bytes, so the link (a
//! kernel fanout program, a queue per shard), the simulator and the stack agree
//! without talking:
//!
//! - a TCP or UDP segment belongs to [`flow_shard`]`(local port, remote port)`: an
//!   ephemeral local port names its shard directly (`port % n`, and each shard picks
//!   its ephemeral ports, ping identifiers likewise, from its own residue class), any
//!   other local port (a server's) spreads its connections by a hash of both ports;
//! - an ICMP error belongs where the packet it quotes came from; an echo reply to its
//!   identifier's shard;
//! - an ARP reply, a neighbour or router advertisement, and anything sent to a
//!   multicast or broadcast address belongs to every shard ([`Owner::Every`]);
//! - the rest (ARP and neighbour requests, echo requests, fragments before
//!   reassembly) is answered wherever it lands ([`Owner::Landing`]).
//!
//! [`link_queue`] is the cheap part a link can run for every frame (the AF_PACKET
//! fanout program in `usnet-link` is the same function in classic BPF): ports for
//! unfragmented TCP/UDP, shard 0 for the rest. A shard that gets a frame owned by
//! another hands it over ([`Handoff`]), copied: the one place where shards meet,
//! taken only by frames the link cannot steer (ICMP errors, reassembled datagrams,
//! every-shard frames, links that steer by a hash of their own), and counted.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::time::Instant;
use usnet_wire::steer::EPHEMERAL_FIRST;

/// This stack's place among the shards of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRole {
    pub index: u16,
    pub count: u16,
}

impl Default for ShardRole {
    fn default() -> Self {
        ShardRole { index: 0, count: 1 }
    }
}

impl ShardRole {
    pub fn new(index: usize, count: usize) -> ShardRole {
        assert!(count >= 1 && index < count && count <= usize::from(u16::MAX));
        ShardRole {
            index: index as u16,
            count: count as u16,
        }
    }

    /// More than one shard.
    pub fn sharded(&self) -> bool {
        self.count > 1
    }

    /// Whether a TCP/UDP flow with this local port belongs here.
    pub fn owns_flow(&self, local: u16, remote: u16) -> bool {
        flow_shard(local, remote, self.count.into()) == usize::from(self.index)
    }

    /// Whether this shard may pick `port` as an ephemeral port (or ping identifier).
    pub fn owns_ephemeral(&self, port: u16) -> bool {
        usize::from(port) % usize::from(self.count) == usize::from(self.index)
    }

    /// Whether every flow to local `port` belongs here whatever the remote port:
    /// an ephemeral port of this shard's class.
    pub fn owns_port(&self, port: u16) -> bool {
        port >= EPHEMERAL_FIRST && self.owns_ephemeral(port)
    }
}

pub use usnet_wire::steer::{flow_shard, flow_value, link_queue, link_queue_value};

/// Who must process a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Shard(usize),
    /// Every shard: the landing one processes it and hands a copy to each other.
    Every,
    /// Whichever shard it landed on.
    Landing,
}

/// A frame or datagram handed from the shard it landed on to the one that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// A whole Ethernet frame, with what the device said of it (a checksum the
    /// device verified, or that a virtual link left partial, stays trusted).
    Frame {
        bytes: Vec<u8>,
        offload: usnet_pool::Offload,
    },
    /// A datagram reassembled from fragments on another shard: the transport
    /// payload (for IPv6, with any extension headers after the fragment header) and
    /// the start of the original packet (for ICMP errors about it).
    Datagram {
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        hop_limit: u8,
        data: Vec<u8>,
        invoking: Vec<u8>,
    },
}

const ETH_HDR: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ARP: u16 = 0x0806;
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Who must process `frame` among `n` shards.
pub fn owner(frame: &[u8], n: usize) -> Owner {
    match be16(frame, 12) {
        Some(ETHERTYPE_ARP) => match be16(frame, ETH_HDR + 6) {
            Some(2) => Owner::Every,
            _ => Owner::Landing,
        },
        Some(ETHERTYPE_IPV4) => owner_v4(&frame[ETH_HDR..], n).unwrap_or(Owner::Landing),
        Some(ETHERTYPE_IPV6) => owner_v6(&frame[ETH_HDR..], n).unwrap_or(Owner::Landing),
        _ => Owner::Landing,
    }
}

/// The owner of a transport header at `l4` carried by a packet we received
/// (`quoted`: a header we sent, quoted by an ICMP error: its source is ours).
fn transport_owner(proto: u8, l4: &[u8], quoted: bool, n: usize) -> Option<Owner> {
    match proto {
        PROTO_TCP | PROTO_UDP => {
            let (a, b) = (be16(l4, 0)?, be16(l4, 2)?);
            let (local, remote) = if quoted { (a, b) } else { (b, a) };
            Some(Owner::Shard(flow_shard(local, remote, n)))
        }
        // Echo request (8, 128) and reply (0, 129): the identifier is ours when we
        // sent the request (quoted) or receive the reply.
        PROTO_ICMP | PROTO_ICMPV6 => {
            let t = *l4.first()?;
            let ours = if quoted {
                t == 8 || t == 128
            } else {
                t == 0 || t == 129
            };
            ours.then(|| Some(Owner::Shard(usize::from(be16(l4, 4)?) % n)))
                .flatten()
        }
        _ => None,
    }
}

fn owner_v4(ip: &[u8], n: usize) -> Option<Owner> {
    let ihl = usize::from(*ip.first()? & 0x0f) * 4;
    let proto = *ip.get(9)?;
    let dst = ip.get(16..20)?;
    if be16(ip, 6)? & 0x3fff != 0 {
        // A fragment: the datagram is steered once reassembled.
        return Some(Owner::Landing);
    }
    if dst[0] >= 224 || dst == [255, 255, 255, 255] {
        // Multicast and broadcast: every shard's sockets may want it. (A subnet's
        // broadcast address is not known here: such a datagram goes to the shard
        // its ports name, like any other.)
        return Some(Owner::Every);
    }
    let l4 = ip.get(ihl..)?;
    if proto == PROTO_ICMP {
        let t = *l4.first()?;
        if matches!(t, 3 | 4 | 5 | 11 | 12) {
            let inner = l4.get(8..)?;
            let ihl2 = usize::from(*inner.first()? & 0x0f) * 4;
            return transport_owner(*inner.get(9)?, inner.get(ihl2..)?, true, n);
        }
    }
    transport_owner(proto, l4, false, n)
}

fn owner_v6(ip: &[u8], n: usize) -> Option<Owner> {
    let next = *ip.get(6)?;
    let dst_multicast = *ip.get(24)? == 0xff;
    let l4 = ip.get(40..)?;
    if next == PROTO_ICMPV6 {
        let t = *l4.first()?;
        return match t {
            // Router, neighbour advertisements, redirects: every cache.
            134 | 136 | 137 => Some(Owner::Every),
            // Solicitations: one answer.
            133 | 135 => Some(Owner::Landing),
            // MLD queries and reports: every shard's memberships.
            130..=132 | 143 => Some(Owner::Every),
            1..=4 => {
                let inner = l4.get(8..)?;
                transport_owner(*inner.get(6)?, inner.get(40..)?, true, n)
            }
            _ if dst_multicast => Some(Owner::Landing),
            _ => transport_owner(next, l4, false, n),
        };
    }
    if dst_multicast {
        // Multicast datagrams, MLD behind a hop-by-hop header.
        return Some(Owner::Every);
    }
    transport_owner(next, l4, false, n)
}

/// A received unfragmented TCP or UDP segment's flow, as the link steered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub proto: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// A TCP SYN without ACK: a connection's first segment.
    pub syn: bool,
}

/// The flow of an unfragmented, unicast TCP or UDP frame (`None` for the rest).
pub fn flow_of(frame: &[u8]) -> Option<Flow> {
    let (proto, src, dst, l4): (u8, IpAddr, IpAddr, &[u8]) = match be16(frame, 12)? {
        ETHERTYPE_IPV4 => {
            let ip = frame.get(ETH_HDR..)?;
            if be16(ip, 6)? & 0x3fff != 0 {
                return None;
            }
            let ihl = usize::from(*ip.first()? & 0x0f) * 4;
            let a = |at: usize| -> Option<IpAddr> {
                let b: [u8; 4] = ip.get(at..at + 4)?.try_into().ok()?;
                Some(Ipv4Addr::from(b).into())
            };
            (*ip.get(9)?, a(12)?, a(16)?, ip.get(ihl..)?)
        }
        ETHERTYPE_IPV6 => {
            let ip = frame.get(ETH_HDR..)?;
            let a = |at: usize| -> Option<IpAddr> {
                let b: [u8; 16] = ip.get(at..at + 16)?.try_into().ok()?;
                Some(Ipv6Addr::from(b).into())
            };
            (*ip.get(6)?, a(8)?, a(24)?, ip.get(40..)?)
        }
        _ => return None,
    };
    if !matches!(proto, PROTO_TCP | PROTO_UDP) || dst.is_multicast() {
        return None;
    }
    let (sport, dport) = (be16(l4, 0)?, be16(l4, 2)?);
    let syn = proto == PROTO_TCP && (*l4.get(13)? & 0x12) == 0x02;
    Some(Flow {
        proto,
        local: SocketAddr::new(dst, dport),
        remote: SocketAddr::new(src, sport),
        syn,
    })
}

/// How long a redirected connection's entry outlives its last frame.
const REDIRECT_IDLE_SECS: u64 = 300;

/// Ports whose sockets live on other shards only, and the connections this shard
/// sent there. A sharded stack server listens on the shards where a client of it
/// lives, not on all: a segment the link steers to a shard without the port's
/// socket is handed to a shard with it, a TCP connection by its SYN (the choice is
/// remembered, so its later segments follow even if the port's shards change).
#[derive(Debug, Default)]
pub(crate) struct Redirects {
    /// `(protocol, local port)` → the shards that hold a socket on it.
    ports: HashMap<(u8, u16), Vec<u16>>,
    /// TCP connections handed over by their SYN: `(local, remote)` → (shard, last seen).
    flows: HashMap<(SocketAddr, SocketAddr), (u16, Instant)>,
    swept: Instant,
}

impl Redirects {
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.flows.is_empty()
    }

    /// Segments to `port` go to `to` (empty: stay here).
    pub fn set_port(&mut self, proto: u8, port: u16, to: &[usize]) {
        if to.is_empty() {
            self.ports.remove(&(proto, port));
        } else {
            let to = to.iter().map(|&s| s as u16).collect();
            self.ports.insert((proto, port), to);
        }
    }

    /// The shard `flow` goes to, if not this one. `local_conn`: this shard has a
    /// connection for it (it stays).
    pub fn target(&mut self, flow: &Flow, local_conn: bool, now: Instant) -> Option<usize> {
        let key = (flow.local, flow.remote);
        if flow.proto == PROTO_TCP {
            if local_conn {
                return None;
            }
            if let Some(e) = self.flows.get_mut(&key) {
                let held = self
                    .ports
                    .get(&(flow.proto, flow.local.port()))
                    .is_some_and(|to| to.contains(&e.0));
                // A connection's segments follow its SYN's choice, whatever the port's
                // holders now (it lives there until it closes); so does its SYN sent
                // again. A SYN on a remembered pair whose shard no longer holds the
                // port opens a new connection (the old one is over): decide again.
                if !flow.syn || held {
                    e.1 = now;
                    return Some(usize::from(e.0));
                }
                self.flows.remove(&key);
            }
        }
        let to = self.ports.get(&(flow.proto, flow.local.port()))?;
        let pick = flow_value(flow.local.port(), flow.remote.port()) as usize % to.len();
        let shard = to[pick];
        if flow.proto == PROTO_TCP {
            // Only a SYN opens a connection elsewhere; any other segment of an
            // unknown flow is answered here (a reset), as it would be unsharded.
            if !flow.syn {
                return None;
            }
            self.sweep(now);
            self.flows.insert(key, (shard, now));
        }
        Some(usize::from(shard))
    }

    /// Forgets connections idle for [`REDIRECT_IDLE_SECS`] (at most every 10 s).
    fn sweep(&mut self, now: Instant) {
        if now.saturating_since(self.swept).as_secs() < 10 {
            return;
        }
        self.swept = now;
        self.flows
            .retain(|_, (_, seen)| now.saturating_since(*seen).as_secs() < REDIRECT_IDLE_SECS);
    }

    /// Connections remembered (for `stat`).
    pub fn flows(&self) -> usize {
        self.flows.len()
    }
}

/// The owner of a reassembled datagram's transport payload (`l4` after any
/// extension headers).
pub(crate) fn datagram_owner(proto: u8, dst: IpAddr, l4: &[u8], n: usize) -> Owner {
    let multicast = match dst {
        IpAddr::V4(a) => a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_multicast(),
    };
    if multicast {
        return Owner::Every;
    }
    transport_owner(proto, l4, false, n).unwrap_or(Owner::Landing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn v4(proto: u8, dst: [u8; 4], frag: u16, l4: &[u8]) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 0, 0, 0];
        ip.extend_from_slice(&frag.to_be_bytes());
        ip.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1]);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(l4);
        eth(ETHERTYPE_IPV4, &ip)
    }

    fn ports(src: u16, dst: u16) -> Vec<u8> {
        let mut p = src.to_be_bytes().to_vec();
        p.extend_from_slice(&dst.to_be_bytes());
        p.extend_from_slice(&[0; 16]);
        p
    }

    #[test]
    fn a_remembered_flow_follows_its_syn_until_a_new_syn_finds_the_port_moved() {
        let mut r = Redirects::default();
        let t = Instant::ZERO;
        let flow = |syn| Flow {
            proto: PROTO_TCP,
            local: "10.0.0.2:80".parse().unwrap(),
            remote: "10.0.0.1:40000".parse().unwrap(),
            syn,
        };
        r.set_port(PROTO_TCP, 80, &[2]);
        assert_eq!(r.target(&flow(true), false, t), Some(2));
        assert_eq!(r.target(&flow(false), false, t), Some(2));
        // The port's only listener moved back here: the connection lives on on shard
        // 2, and its segments (a SYN sent again included while 2 holds the port) go
        // there.
        r.set_port(PROTO_TCP, 80, &[]);
        assert_eq!(r.target(&flow(false), false, t), Some(2));
        // A new SYN on the same pair is a new connection: it stays, and the pair is
        // forgotten.
        assert_eq!(r.target(&flow(true), false, t), None);
        assert_eq!(r.flows(), 0);
        assert_eq!(r.target(&flow(false), false, t), None);
        // Held elsewhere again, by shard 2 among others: a retransmitted SYN keeps
        // its first choice.
        r.set_port(PROTO_TCP, 80, &[1]);
        assert_eq!(r.target(&flow(true), false, t), Some(1));
        r.set_port(PROTO_TCP, 80, &[1, 3]);
        assert_eq!(r.target(&flow(true), false, t), Some(1));
        // A local connection always keeps its segments.
        assert_eq!(r.target(&flow(false), true, t), None);
    }

    #[test]
    fn a_flow_is_owned_by_one_shard_and_the_link_agrees() {
        for n in 1..=8 {
            for (sport, dport) in [(40000u16, 80u16), (80, 50001), (443, 65535), (1, 2)] {
                let f = v4(PROTO_TCP, [10, 0, 0, 2], 0, &ports(sport, dport));
                let want = flow_shard(dport, sport, n);
                assert_eq!(owner(&f, n), Owner::Shard(want));
                assert_eq!(link_queue(&f, n), want, "{sport}->{dport} n={n}");
            }
        }
    }

    #[test]
    fn ephemeral_ports_name_their_shard_and_server_ports_spread() {
        let role = ShardRole::new(3, 4);
        let mine: Vec<u16> = (EPHEMERAL_FIRST..EPHEMERAL_FIRST + 16)
            .filter(|&p| role.owns_ephemeral(p))
            .collect();
        assert_eq!(mine.len(), 4);
        for p in mine {
            // Whatever the remote port.
            assert!(role.owns_flow(p, 80) && role.owns_flow(p, 12345));
        }
        // A server port's connections spread, even when the peer's ports are all
        // even (Linux's connect).
        for n in [2, 3, 4, 8] {
            let mut per = vec![0; n];
            for r in (40000..40000 + 64 * n as u16).step_by(2) {
                per[flow_shard(80, r, n)] += 1;
            }
            assert!(per.iter().all(|&k| k >= 32 / 2), "{n}: {per:?}");
        }
    }

    #[test]
    fn icmp_errors_go_where_the_quoted_packet_came_from() {
        // We (port 50001, shard 50001 % 4 = 1) sent to 10.0.0.9:80; the router says
        // fragmentation needed, quoting our header.
        let mut quoted = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0];
        quoted.extend_from_slice(&[10, 0, 0, 2, 10, 0, 0, 9]);
        quoted.extend_from_slice(&ports(50001, 80)[..8]);
        let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
        icmp.extend_from_slice(&quoted);
        let f = v4(PROTO_ICMP, [10, 0, 0, 2], 0, &icmp);
        assert_eq!(owner(&f, 4), Owner::Shard(50001 % 4));
        assert_eq!(link_queue(&f, 4), 0);
        // An echo reply to identifier 7.
        let f = v4(PROTO_ICMP, [10, 0, 0, 2], 0, &[0, 0, 0, 0, 0, 7, 0, 1]);
        assert_eq!(owner(&f, 4), Owner::Shard(3));
        // An echo request is answered where it lands.
        let f = v4(PROTO_ICMP, [10, 0, 0, 2], 0, &[8, 0, 0, 0, 0, 7, 0, 1]);
        assert_eq!(owner(&f, 4), Owner::Landing);
    }

    #[test]
    fn neighbours_multicast_and_fragments() {
        let arp = |op: u16| {
            let mut a = vec![0, 1, 8, 0, 6, 4];
            a.extend_from_slice(&op.to_be_bytes());
            a.extend_from_slice(&[0; 20]);
            eth(ETHERTYPE_ARP, &a)
        };
        assert_eq!(owner(&arp(1), 4), Owner::Landing);
        assert_eq!(owner(&arp(2), 4), Owner::Every);
        assert_eq!(link_queue(&arp(2), 4), 0);
        let mc = v4(PROTO_UDP, [239, 1, 2, 3], 0, &ports(5000, 5000));
        assert_eq!(owner(&mc, 4), Owner::Every);
        let frag = v4(PROTO_UDP, [10, 0, 0, 2], 0x2000, &ports(40000, 53));
        assert_eq!(owner(&frag, 4), Owner::Landing);
        assert_eq!(link_queue(&frag, 4), 0);
        // IPv6 neighbour advertisement and solicitation.
        let nd = |t: u8| {
            let mut ip = vec![0x60, 0, 0, 0, 0, 32, PROTO_ICMPV6, 255];
            ip.extend_from_slice(&[0; 16]);
            let mut dst = [0u8; 16];
            dst[0] = 0xfd;
            ip.extend_from_slice(&dst);
            ip.extend_from_slice(&[t, 0, 0, 0]);
            ip.extend_from_slice(&[0; 28]);
            eth(ETHERTYPE_IPV6, &ip)
        };
        assert_eq!(owner(&nd(136), 4), Owner::Every);
        assert_eq!(owner(&nd(135), 4), Owner::Landing);
        // Truncated garbage lands.
        assert_eq!(owner(&[0x08, 0x00], 4), Owner::Landing);
        assert_eq!(link_queue(&[1, 2, 3], 4), 0);
    }
}
