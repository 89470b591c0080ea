//! One host as four shards (`usnet_stack::shard`) on the simulated wire, behind the
//! steering function the AF_PACKET fanout program runs: 1,000 connections both ways
//! over IPv4 and IPv6 with loss, duplication and reordering, every byte echoed and
//! checked; a listener on every shard; every segment a shard sends belongs to a flow
//! it owns; neighbours learned wherever the reply lands; ICMP "fragmentation needed"
//! from a router reaching the shard that owns the connection.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

mod common;

use common::icmp::{icmp_for, tcp_of, Says};
use common::{cfg, pattern, sa};
use usnet_stack::shard::flow_shard;
use usnet_stack::sim::{Faults, Hop, SimNet};
use usnet_stack::{SocketHandle, StackConfig, StackError};

const SHARDS: usize = 4;
/// Connections opened by the peer, and by the shards together.
const EACH_WAY: usize = 500;
/// The router's MTU toward the peer, for frames the shards send.
const ROUTER_MTU: usize = 1280;

fn small(mut c: StackConfig) -> StackConfig {
    c.tcp.send_buffer = 32 << 10;
    c.tcp.recv_buffer = 32 << 10;
    c.tcp.recv_buffer_initial = 32 << 10;
    c
}

/// One connection's client: sends `total` pattern bytes (from `seed`), reads them
/// back, closes at the echo's end.
struct Client {
    stack: usize,
    h: SocketHandle,
    seed: u64,
    total: u64,
    sent: u64,
    got: u64,
    shut: bool,
    done: bool,
}

/// One accepted connection: echoes what it reads, closes after the client's FIN.
struct Echo {
    h: SocketHandle,
    pending: Vec<u8>,
    eof: bool,
    done: bool,
}

fn size(i: usize) -> u64 {
    1 + (i as u64 * 7919) % 24_000
}

fn drive_client(net: &mut SimNet, c: &mut Client, buf: &mut [u8]) {
    let s = net.stack_mut(c.stack);
    while c.sent < c.total {
        let want = (c.total - c.sent).min(buf.len() as u64) as usize;
        for (k, b) in buf[..want].iter_mut().enumerate() {
            *b = pattern(c.seed + c.sent + k as u64);
        }
        match s.tcp_send(c.h, &buf[..want]) {
            Ok(k) => c.sent += k as u64,
            Err(StackError::WouldBlock) => break,
            Err(e) => panic!("client on stack {} send at {}: {e:?}", c.stack, c.sent),
        }
    }
    if c.sent == c.total && !c.shut {
        s.tcp_shutdown_write(c.h).unwrap();
        c.shut = true;
    }
    loop {
        match s.tcp_recv(c.h, buf) {
            Ok(0) => {
                assert_eq!(c.got, c.total, "stack {}: echo ended early", c.stack);
                s.tcp_close(c.h).unwrap();
                c.done = true;
                return;
            }
            Ok(k) => {
                for (j, b) in buf[..k].iter().enumerate() {
                    let at = c.got + j as u64;
                    assert_eq!(
                        *b,
                        pattern(c.seed + at),
                        "stack {}: echo byte {at}",
                        c.stack
                    );
                }
                c.got += k as u64;
            }
            Err(StackError::WouldBlock) => return,
            Err(e) => panic!("client on stack {} recv at {}: {e:?}", c.stack, c.got),
        }
    }
}

fn drive_echo(net: &mut SimNet, stack: usize, e: &mut Echo, buf: &mut [u8]) {
    let s = net.stack_mut(stack);
    loop {
        if !e.pending.is_empty() {
            match s.tcp_send(e.h, &e.pending) {
                Ok(k) => {
                    e.pending.drain(..k);
                }
                Err(StackError::WouldBlock) => return,
                Err(err) => panic!("echo on stack {stack} send: {err:?}"),
            }
            if !e.pending.is_empty() {
                return;
            }
        }
        if e.eof {
            s.tcp_close(e.h).unwrap();
            e.done = true;
            return;
        }
        match s.tcp_recv(e.h, buf) {
            Ok(0) => e.eof = true,
            Ok(k) => e.pending.extend_from_slice(&buf[..k]),
            Err(StackError::WouldBlock) => return,
            Err(err) => panic!("echo on stack {stack} recv: {err:?}"),
        }
    }
}

#[test]
fn four_shards_carry_a_thousand_connections_both_ways() {
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.005,
        reorder: 0.01,
        ..Faults::default()
    };
    let mut net = SimNet::new(0x5a4d, faults);
    let peer = net.add(small(cfg(1))).unwrap();
    let shards = net.add_shards(small(cfg(2)), SHARDS).unwrap();
    let shard_of = |stack: usize| shards.iter().position(|&s| s == stack);

    // The router: frames from the shards larger than its MTU are answered with
    // "fragmentation needed"; every TCP segment a shard sends must be of a flow
    // that shard owns.
    #[derive(Default)]
    struct Seen {
        icmp: usize,
        wrong_shard: Vec<String>,
    }
    let seen = Rc::new(RefCell::new(Seen::default()));
    let s2 = seen.clone();
    let shard_stacks = shards.clone();
    net.middlebox = Some(Box::new(move |from: usize, frame: &[u8]| {
        let Some(i) = shard_stack_index(&shard_stacks, from) else {
            return Hop::Pass;
        };
        let Some(t) = tcp_of(frame) else {
            return Hop::Pass;
        };
        let eth = &frame[14..];
        let l4 = if eth[0] >> 4 == 4 {
            usize::from(eth[0] & 0xf) * 4
        } else {
            40
        };
        let sport = u16::from_be_bytes([eth[l4], eth[l4 + 1]]);
        if flow_shard(sport, t.dport, SHARDS) != i {
            s2.borrow_mut()
                .wrong_shard
                .push(format!("shard {i} sent {sport}->{}", t.dport));
        }
        if t.ip_len > ROUTER_MTU {
            s2.borrow_mut().icmp += 1;
            let says = if eth[0] >> 4 == 4 {
                Says::Unreach4(4, ROUTER_MTU as u16)
            } else {
                Says::TooBig6(ROUTER_MTU as u32)
            };
            return Hop::Answer(icmp_for(frame, says, |_| {}));
        }
        Hop::Pass
    }));

    // A listener on every shard, one on the peer.
    let listeners: Vec<SocketHandle> = shards
        .iter()
        .map(|&s| net.stack_mut(s).tcp_listen(sa("[::]:80"), 1024).unwrap())
        .collect();
    let peer_listener = net.stack_mut(peer).tcp_listen(sa("[::]:7"), 1024).unwrap();

    let mut clients: Vec<Client> = Vec::new();
    let mut echoes: Vec<(usize, Echo)> = Vec::new();
    let mut accepted = [0usize; SHARDS];
    let mut opened = 0usize;
    let mut buf = vec![0u8; 16 << 10];
    let ok = net.run_until(Duration::from_secs(600), |n| {
        // Open connections a batch at a time, each way, IPv4 and IPv6, at most
        // 200 open at once.
        let live = clients.iter().filter(|c| !c.done).count();
        for _ in 0..50.min(200usize.saturating_sub(live)) {
            if opened == 2 * EACH_WAY {
                break;
            }
            let i = opened;
            let v6 = i % 2 == 1;
            let (stack, to): (usize, SocketAddr) = if i % 4 < 2 {
                (peer, sa(if v6 { "[fd00::2]:80" } else { "10.0.0.2:80" }))
            } else {
                let s = shards[(i / 4) % SHARDS];
                (s, sa(if v6 { "[fd00::1]:7" } else { "10.0.0.1:7" }))
            };
            let h = n.stack_mut(stack).tcp_connect(None, to).unwrap();
            clients.push(Client {
                stack,
                h,
                seed: i as u64 * 1_000_003,
                total: size(i),
                sent: 0,
                got: 0,
                shut: false,
                done: false,
            });
            opened += 1;
        }
        for (k, &s) in shards.iter().enumerate() {
            while let Ok(h) = n.stack_mut(s).tcp_accept(listeners[k]) {
                accepted[k] += 1;
                echoes.push((
                    s,
                    Echo {
                        h,
                        pending: Vec::new(),
                        eof: false,
                        done: false,
                    },
                ));
            }
        }
        while let Ok(h) = n.stack_mut(peer).tcp_accept(peer_listener) {
            echoes.push((
                peer,
                Echo {
                    h,
                    pending: Vec::new(),
                    eof: false,
                    done: false,
                },
            ));
        }
        for c in clients.iter_mut().filter(|c| !c.done) {
            drive_client(n, c, &mut buf);
        }
        for (s, e) in echoes.iter_mut().filter(|(_, e)| !e.done) {
            drive_echo(n, *s, e, &mut buf);
        }
        opened == 2 * EACH_WAY
            && clients.iter().all(|c| c.done)
            && echoes.len() == 2 * EACH_WAY
            && echoes.iter().all(|(_, e)| e.done)
    });
    let done = clients.iter().filter(|c| c.done).count();
    assert!(
        ok,
        "stalled: {done} of {} clients done, {} echoes; wire {:?}",
        clients.len(),
        echoes.len(),
        net.stats
    );

    let seen = seen.borrow();
    eprintln!(
        "virtual {:?}, wire {:?}, {} ICMP, accepted {accepted:?}",
        net.now(),
        net.stats,
        seen.icmp
    );
    assert!(
        seen.wrong_shard.is_empty(),
        "segments sent by a shard that does not own the flow: {:?}",
        &seen.wrong_shard[..seen.wrong_shard.len().min(5)]
    );
    let mut by_shard: HashMap<usize, usize> = HashMap::new();
    for c in &clients {
        if let Some(i) = shard_of(c.stack) {
            *by_shard.entry(i).or_default() += 1;
        }
    }
    let mut handed = 0;
    for (k, &s) in shards.iter().enumerate() {
        let c = net.stack(s).counters_snapshot();
        // A listener on every shard took its share of the peer's connections.
        assert!(
            accepted[k] > EACH_WAY / SHARDS / 2,
            "shard {k} accepted {} of {EACH_WAY}",
            accepted[k]
        );
        let asked = (0..2 * EACH_WAY)
            .filter(|i| i % 4 >= 2 && (i / 4) % SHARDS == k)
            .count();
        assert_eq!(by_shard[&k], asked, "shard {k} connected");
        // The router's errors reached every shard's connections: the link sends
        // ICMP to shard 0, which hands each to its owner.
        assert!(
            c.tcp_icmp_mss_clamped > 0,
            "shard {k} never lowered its MSS"
        );
        // Every shard learned the peer's address, though the replies to its own
        // requests landed on shard 0 (which copies them to all).
        let peer_ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        assert!(
            net.stack(s)
                .neighbors()
                .iter()
                .any(|(ip, mac)| *ip == peer_ip && mac.is_some()),
            "shard {k} does not know the peer"
        );
        if k > 0 {
            assert!(c.arp_tx_request > 0, "shard {k} never asked");
            assert!(c.shard_handoff_in > 0, "shard {k} was handed nothing");
        } else {
            assert!(
                c.shard_every_copies > 0,
                "shard 0 copied no neighbour reply"
            );
        }
        handed += c.shard_handoff_out;
    }
    // Only the ICMP errors (which the link steers to shard 0) were handed over:
    // no TCP segment ever landed on the wrong shard.
    let c0 = net.stack(shards[0]).counters_snapshot();
    assert_eq!(handed, c0.shard_handoff_out);
    assert!(
        handed <= seen.icmp as u64,
        "{handed} handoffs, {} ICMP",
        seen.icmp
    );
    // Nothing left behind: the sockets are gone or closing, the pools whole again
    // once the wire is quiet.
    net.run_for(Duration::from_secs(130));
    for &s in shards.iter().chain([peer].iter()) {
        let st = net.stack(s);
        assert_eq!(st.pool().in_use(), 0, "stack {s} holds buffers");
    }
}

fn shard_stack_index(shards: &[usize], stack: usize) -> Option<usize> {
    shards.iter().position(|&s| s == stack)
}

/// Fragmented UDP datagrams both ways: a fragment carries no ports, so the link puts
/// every fragment on shard 0, which reassembles and hands the datagram to the shard
/// that owns it. A server socket on every shard (like `SO_REUSEPORT`), ephemeral
/// client sockets on each shard whose replies come back to them; IPv4 and IPv6;
/// every datagram checked.
#[test]
fn fragmented_datagrams_reach_the_shard_that_owns_them() {
    let mut net = SimNet::new(0x0d6a, Faults::default());
    let peer = net.add(cfg(1)).unwrap();
    let shards = net.add_shards(cfg(2), SHARDS).unwrap();
    let servers: Vec<SocketHandle> = shards
        .iter()
        .map(|&s| net.stack_mut(s).udp_bind(sa("[::]:53")).unwrap())
        .collect();
    let peer_echo = net.stack_mut(peer).udp_bind(sa("[::]:9")).unwrap();
    let datagram =
        |i: usize| -> Vec<u8> { (0..3000 + i).map(|k| pattern((i * 7 + k) as u64)).collect() };
    const EACH: usize = 64;

    // The peer sends from 64 sockets (64 source ports) to the shards' port 53.
    let senders: Vec<SocketHandle> = (0..EACH)
        .map(|_| net.stack_mut(peer).udp_bind(sa("[::]:0")).unwrap())
        .collect();
    // Each shard's ephemeral sockets send to the peer's echo service.
    let mut clients = Vec::new();
    for (k, &s) in shards.iter().enumerate() {
        for j in 0..EACH / SHARDS {
            let i = EACH + k * EACH + j;
            let h = net.stack_mut(s).udp_bind(sa("[::]:0")).unwrap();
            let to = sa(if j % 2 == 0 {
                "10.0.0.1:9"
            } else {
                "[fd00::1]:9"
            });
            net.stack_mut(s).udp_send_to(h, &datagram(i), to).unwrap();
            clients.push((s, h, i));
        }
    }
    let mut buf = vec![0u8; 16 << 10];
    let mut at_server = vec![0usize; SHARDS];
    let mut echoed = 0;
    let want_server = EACH;
    let mut back = 0;
    let mut sent = 0;
    let ok = net.run_until(Duration::from_secs(10), |n| {
        // A few at a time: the first wait for address resolution, which holds a
        // bounded number of packets.
        for _ in 0..4 {
            if sent < senders.len() {
                let to = sa(if sent % 2 == 0 {
                    "10.0.0.2:53"
                } else {
                    "[fd00::2]:53"
                });
                n.stack_mut(peer)
                    .udp_send_to(senders[sent], &datagram(sent), to)
                    .unwrap();
                sent += 1;
            }
        }
        for (k, &s) in shards.iter().enumerate() {
            while let Ok((len, from)) = n.stack_mut(s).udp_recv_from(servers[k], &mut buf) {
                let i = len - 3000;
                assert_eq!(&buf[..len], &datagram(i)[..], "datagram {i}");
                assert_eq!(flow_shard(53, from.port(), SHARDS), k, "from {from}");
                at_server[k] += 1;
            }
        }
        while let Ok((len, from)) = n.stack_mut(peer).udp_recv_from(peer_echo, &mut buf) {
            let d = buf[..len].to_vec();
            n.stack_mut(peer).udp_send_to(peer_echo, &d, from).unwrap();
            echoed += 1;
        }
        for &(s, h, i) in &clients {
            while let Ok((len, _)) = n.stack_mut(s).udp_recv_from(h, &mut buf) {
                assert_eq!(&buf[..len], &datagram(i)[..], "echo of {i}");
                back += 1;
            }
        }
        at_server.iter().sum::<usize>() == want_server && back == clients.len()
    });
    assert!(
        ok,
        "servers got {at_server:?} of {want_server}, {back} of {} echoes back ({echoed} echoed)",
        clients.len()
    );
    assert!(at_server.iter().all(|&n| n > 0), "{at_server:?}");
    let handed: u64 = shards
        .iter()
        .map(|&s| net.stack(s).counters().shard_handoff_out)
        .sum();
    // Every datagram for shards 1..3 was reassembled on shard 0 and handed over.
    let for_others = (at_server.iter().skip(1).sum::<usize>()
        + clients.iter().filter(|c| c.0 != shards[0]).count()) as u64;
    assert_eq!(handed, for_others);
}

/// A virtual link (TAP, a veth under AF_PACKET) hands over frames whose checksum is
/// only partial and says so (`csum_valid`): a shard that receives one and hands it
/// to the owner must hand over that word too, or the owner drops the frame as
/// corrupt. Here the peer's SYNs are caught, their checksums zeroed, and each
/// injected into a shard that does not own it, marked as the device marks them.
#[test]
fn a_handed_frame_keeps_the_checksum_its_device_vouched_for() {
    let mut net = SimNet::new(0xc5, Faults::default());
    let peer = net.add(cfg(1)).unwrap();
    let mut scfg = cfg(2);
    scfg.rx_csum_offload = true;
    let shards = net.add_shards(scfg, 2).unwrap();
    let caught: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let c2 = caught.clone();
    net.middlebox = Some(Box::new(move |from: usize, frame: &[u8]| {
        match tcp_of(frame) {
            Some(t) if from == 0 && t.syn => {
                c2.borrow_mut().push(frame.to_vec());
                Hop::Drop
            }
            _ => Hop::Pass,
        }
    }));
    let listeners: Vec<SocketHandle> = shards
        .iter()
        .map(|&s| net.stack_mut(s).tcp_listen(sa("10.0.0.2:80"), 16).unwrap())
        .collect();
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(
            net.stack_mut(peer)
                .tcp_connect(None, sa("10.0.0.2:80"))
                .unwrap(),
        );
    }
    let mut accepted = 0;
    let ok = net.run_until(Duration::from_secs(5), |n| {
        for f in caught.borrow_mut().drain(..) {
            let mut f = f;
            let l4 = 14 + usize::from(f[14] & 0xf) * 4;
            let sport = u16::from_be_bytes([f[l4], f[l4 + 1]]);
            f[l4 + 16..l4 + 18].fill(0);
            let wrong = shards[1 - flow_shard(80, sport, 2)];
            let s = n.stack_mut(wrong);
            let b = s.pool_mut().alloc_from(&f).unwrap();
            let o = usnet_pool::Offload {
                csum_valid: true,
                ..Default::default()
            };
            s.pool_mut().set_offload(&b, o);
            s.receive(b);
        }
        for (k, &s) in shards.iter().enumerate() {
            while n.stack_mut(s).tcp_accept(listeners[k]).is_ok() {
                accepted += 1;
            }
        }
        accepted == conns.len()
    });
    assert!(ok, "{accepted} of {} accepted", conns.len());
    let handed: u64 = shards
        .iter()
        .map(|&s| net.stack(s).counters().shard_handoff_out)
        .sum();
    assert!(handed >= conns.len() as u64);
}

/// A port whose socket lives on one shard only (a stack-server client on that shard
/// listens): the other shards hand its segments there (`set_port_redirect`). 240
/// connections over a lossy wire from the peer's many ports all end on shard 2,
/// every byte checked; when a listener opens on shard 0 halfway, the connections
/// shard 0 already sent away keep going there and the new ones stay; datagrams to a
/// UDP port bound on shard 1 reach it whichever shard they land on.
#[test]
fn a_port_held_by_some_shards_takes_its_flows_from_every_shard() {
    const N: usize = 3;
    const CONNS: usize = 240;
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.005,
        reorder: 0.01,
        ..Faults::default()
    };
    let mut net = SimNet::new(0x4ed1, faults);
    let peer = net.add(small(cfg(1))).unwrap();
    let shards = net.add_shards(small(cfg(2)), N).unwrap();
    let mut listeners: Vec<Option<SocketHandle>> = vec![None; N];
    listeners[2] = Some(
        net.stack_mut(shards[2])
            .tcp_listen(sa("[::]:80"), 1024)
            .unwrap(),
    );
    for &s in &shards[..2] {
        net.stack_mut(s).set_port_redirect(6, 80, &[2]);
    }
    let dns = net.stack_mut(shards[1]).udp_bind(sa("[::]:53")).unwrap();
    for &s in [shards[0], shards[2]].iter() {
        net.stack_mut(s).set_port_redirect(17, 53, &[1]);
    }

    let mut clients: Vec<Client> = Vec::new();
    let mut echoes: Vec<(usize, Echo)> = Vec::new();
    let mut accepted = [0usize; N];
    let mut buf = vec![0u8; 16 << 10];
    let mut opened_on_0 = false;
    let ok = net.run_until(Duration::from_secs(600), |n| {
        let live = clients.iter().filter(|c| !c.done).count();
        for _ in 0..20.min(100usize.saturating_sub(live)) {
            if clients.len() == CONNS {
                break;
            }
            let i = clients.len();
            let to = sa(if i.is_multiple_of(2) {
                "10.0.0.2:80"
            } else {
                "[fd00::2]:80"
            });
            let h = n.stack_mut(peer).tcp_connect(None, to).unwrap();
            clients.push(Client {
                stack: peer,
                h,
                seed: i as u64 * 7_000_003,
                total: size(i),
                sent: 0,
                got: 0,
                shut: false,
                done: false,
            });
        }
        // Halfway, a client on shard 0 listens too: shard 0 keeps new connections
        // and still forwards the ones it sent to shard 2.
        if !opened_on_0 && clients.len() >= CONNS / 2 {
            opened_on_0 = true;
            let s0 = n.stack_mut(shards[0]);
            listeners[0] = Some(s0.tcp_listen(sa("[::]:80"), 1024).unwrap());
            s0.set_port_redirect(6, 80, &[]);
            n.stack_mut(shards[1]).set_port_redirect(6, 80, &[0, 2]);
        }
        for k in 0..N {
            let Some(l) = listeners[k] else { continue };
            while let Ok(h) = n.stack_mut(shards[k]).tcp_accept(l) {
                accepted[k] += 1;
                echoes.push((
                    shards[k],
                    Echo {
                        h,
                        pending: Vec::new(),
                        eof: false,
                        done: false,
                    },
                ));
            }
        }
        for c in clients.iter_mut().filter(|c| !c.done) {
            drive_client(n, c, &mut buf);
        }
        for (s, e) in echoes.iter_mut().filter(|(_, e)| !e.done) {
            drive_echo(n, *s, e, &mut buf);
        }
        clients.len() == CONNS && clients.iter().all(|c| c.done)
    });
    let done = clients.iter().filter(|c| c.done).count();
    assert!(ok, "stalled: {done} of {CONNS} done, accepted {accepted:?}");
    assert_eq!(accepted.iter().sum::<usize>(), CONNS, "{accepted:?}");
    eprintln!("accepted {accepted:?}");
    assert_eq!(accepted[1], 0, "shard 1 has no listener");
    assert!(accepted[0] > 0 && accepted[2] > CONNS / 2, "{accepted:?}");
    for &s in &shards[..2] {
        assert!(net.stack(s).counters().shard_redirected > 0);
    }
    assert!(net.stack(shards[0]).redirected_flows() > 0);

    // UDP: 60 datagrams from 60 source ports, all at shard 1's socket.
    let senders: Vec<SocketHandle> = (0..60)
        .map(|_| net.stack_mut(peer).udp_bind(sa("0.0.0.0:0")).unwrap())
        .collect();
    for (i, &h) in senders.iter().enumerate() {
        let d = [i as u8; 100];
        net.stack_mut(peer)
            .udp_send_to(h, &d, sa("10.0.0.2:53"))
            .unwrap();
    }
    let mut got = Vec::new();
    let ok = net.run_until(Duration::from_secs(10), |n| {
        while let Ok((len, _)) = n.stack_mut(shards[1]).udp_recv_from(dns, &mut buf) {
            assert_eq!(len, 100);
            got.push(buf[0]);
        }
        got.len() == senders.len()
    });
    got.sort();
    // The wire above is lossy: what arrived arrived whole, and most arrived.
    assert!(ok || got.len() > 50, "{} of 60 datagrams", got.len());
    got.dedup();
    assert!(got.len() > 50, "{} distinct datagrams", got.len());
}

/// A link that queues by a hash of its own (a multi-queue TAP) puts a flow's frames
/// on any shard; the shard there hands each to its owner, which must still redirect
/// it when the port's socket lives on a third place (here: the owner is shard 1, the
/// listener on shard 0 only). Every frame from the peer lands on the shard that
/// does not own it; 8 connections are accepted on shard 0 and carry their bytes.
#[test]
fn a_frame_handed_to_its_owner_follows_the_port_redirect() {
    let mut net = SimNet::new(0x7a9, Faults::default());
    let peer = net.add(cfg(1)).unwrap();
    let shards = net.add_shards(cfg(2), 2).unwrap();
    let caught: Rc<RefCell<Vec<Vec<u8>>>> = Rc::default();
    let c2 = caught.clone();
    net.middlebox = Some(Box::new(move |from: usize, frame: &[u8]| {
        match tcp_of(frame) {
            Some(t) if from == peer && t.dport == 80 => {
                c2.borrow_mut().push(frame.to_vec());
                Hop::Drop
            }
            _ => Hop::Pass,
        }
    }));
    let listener = net
        .stack_mut(shards[0])
        .tcp_listen(sa("10.0.0.2:80"), 16)
        .unwrap();
    net.stack_mut(shards[1]).set_port_redirect(6, 80, &[0]);
    let conns: Vec<SocketHandle> = (0..8)
        .map(|_| {
            net.stack_mut(peer)
                .tcp_connect(None, sa("10.0.0.2:80"))
                .unwrap()
        })
        .collect();
    let mut sent = vec![false; conns.len()];
    let mut accepted = Vec::new();
    let mut got = 0usize;
    let mut buf = [0u8; 256];
    let ok = net.run_until(Duration::from_secs(10), |n| {
        for f in caught.borrow_mut().drain(..) {
            let l4 = 14 + usize::from(f[14] & 0xf) * 4;
            let sport = u16::from_be_bytes([f[l4], f[l4 + 1]]);
            let wrong = shards[1 - flow_shard(80, sport, 2)];
            let s = n.stack_mut(wrong);
            let b = s.pool_mut().alloc_from(&f).unwrap();
            s.receive(b);
        }
        for (k, &c) in conns.iter().enumerate() {
            if !sent[k] && n.stack_mut(peer).tcp_send(c, &[k as u8; 100]).is_ok() {
                sent[k] = true;
            }
        }
        while let Ok(h) = n.stack_mut(shards[0]).tcp_accept(listener) {
            accepted.push(h);
        }
        for &h in &accepted {
            while let Ok(k) = n.stack_mut(shards[0]).tcp_recv(h, &mut buf) {
                if k == 0 {
                    break;
                }
                got += k;
            }
        }
        accepted.len() == conns.len() && got == 100 * conns.len()
    });
    assert!(ok, "{} accepted, {got} bytes", accepted.len());
    assert!(net.stack(shards[1]).counters().shard_redirected > 0);
    assert_eq!(net.stack(shards[1]).counters().tcp_listen_syn_received, 0);
}
