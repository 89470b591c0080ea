//! usnet's TCP against another implementation: smoltcp (its own Ethernet, ARP, NDP,
//! IPv4, IPv6 and TCP), on one wire in virtual time with delay, reordering, loss and
//! duplication both ways. Each side checks every byte of an echoed stream, in both roles (smoltcp
//! connects to a usnet listener; usnet connects to a smoltcp listener), over IPv4
//! and IPv6. Until now only Linux had talked to usnet's TCP (the interop and
//! packetdrill suites); a second independent peer catches what both usnet and
//! Linux might agree on by accident.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use usnet_stack::{mac_from_seed, SocketHandle, Stack, StackConfig, StackError};

const MTU: usize = 1500;
/// Bytes echoed in each conversation.
const TOTAL: usize = 2_000_000;
/// One-way delay of the wire, and the most a frame is held on top of it (frames
/// overtake each other).
const DELAY_MS: u64 = 5;
const JITTER_MS: u64 = 3;

/// The byte at stream offset `i` (not periodic at small powers of two).
fn pattern(i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9e37_79b9) >> 17) as u8 ^ (i >> 13) as u8
}

/// The stream's bytes from offset `off`.
fn fill(buf: &mut [u8], off: usize) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern(off + k);
    }
}

/// `bytes` are the stream's from offset `off`, as `from` echoed them.
fn check(bytes: &[u8], off: usize, from: &str) {
    for (k, &b) in bytes.iter().enumerate() {
        assert_eq!(b, pattern(off + k), "echoed byte {} from {from}", off + k);
    }
}

/// smoltcp's side of the wire: frames for it, frames from it.
#[derive(Default)]
struct SmolWire {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push_back(buf);
        r
    }
}

impl Device for SmolWire {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(
        &mut self,
        _t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let f = self.rx.pop_front()?;
        Some((Rx(f), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = MTU + 14;
        c
    }
}

/// A deterministic lossy wire: delays, reorders, drops and duplicates frames
/// (xorshift).
struct Faults {
    state: u64,
    dropped: u64,
    duplicated: u64,
}

/// Frames in flight on one direction of the wire: (due at, ms; frame).
type InFlight = Vec<(u64, Vec<u8>)>;

/// The frames of `wire` due by `now`, in order of arrival.
fn due(wire: &mut InFlight, now: u64) -> Vec<Vec<u8>> {
    wire.sort_by_key(|(t, _)| *t);
    let n = wire.partition_point(|(t, _)| *t <= now);
    wire.drain(..n).map(|(_, f)| f).collect()
}

impl Faults {
    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// What arrives of `frame` sent at `now`: nothing (1 %), twice (0.5 %) or once,
    /// after the delay and a jitter.
    fn carry(&mut self, frame: Vec<u8>, now: u64, into: &mut InFlight) {
        let at = |f: &mut Faults| now + DELAY_MS + f.next() % (JITTER_MS + 1);
        match self.next() % 200 {
            0 | 1 => self.dropped += 1,
            2 => {
                self.duplicated += 1;
                into.push((at(self), frame.clone()));
                into.push((at(self), frame));
            }
            _ => into.push((at(self), frame)),
        }
    }
}

/// Both stacks on one wire, stepped 1 ms of virtual time at a time.
struct World {
    usnet: Stack,
    smol_iface: Interface,
    smol_dev: SmolWire,
    smol_sockets: SocketSet<'static>,
    now_ms: u64,
    faults: Faults,
    to_usnet: InFlight,
    to_smol: InFlight,
}

impl World {
    fn new(seed: u64) -> World {
        let usnet = Stack::new(StackConfig {
            mac: mac_from_seed(2),
            addrs: vec![
                "10.0.0.2/24".parse().unwrap(),
                "fd00::2/64".parse().unwrap(),
            ],
            seed,
            ..Default::default()
        })
        .unwrap();
        let mut smol_dev = SmolWire::default();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress([
            0x02, 0, 0, 0, 0, 0x51,
        ])));
        config.random_seed = seed;
        let mut smol_iface = Interface::new(
            config,
            &mut smol_dev,
            smoltcp::time::Instant::from_millis(0),
        );
        smol_iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(IpAddress::v4(10, 0, 0, 1), 24)).unwrap();
            a.push(IpCidr::new(IpAddress::v6(0xfd00, 0, 0, 0, 0, 0, 0, 1), 64))
                .unwrap();
        });
        World {
            usnet,
            smol_iface,
            smol_dev,
            smol_sockets: SocketSet::new(vec![]),
            now_ms: 0,
            faults: Faults {
                state: seed | 1,
                dropped: 0,
                duplicated: 0,
            },
            to_usnet: Vec::new(),
            to_smol: Vec::new(),
        }
    }

    /// What the conversation went through; the wire must have dropped frames, and
    /// usnet must have repaired what it lost.
    fn report(&self, what: &str, server: SocketAddr) {
        let c = self.usnet.counters_snapshot();
        eprintln!(
            "{what} {server}: {TOTAL} B echoed in {} ms of virtual time; wire dropped {}, duplicated {}; usnet retransmitted {}",
            self.now_ms, self.faults.dropped, self.faults.duplicated, c.tcp_retransmit_segments
        );
        assert!(self.faults.dropped > 0, "the wire dropped something");
        assert!(
            c.tcp_retransmit_segments > 0,
            "usnet retransmitted what was lost"
        );
    }

    fn smol_socket(&mut self) -> smoltcp::iface::SocketHandle {
        let buf = || tcp::SocketBuffer::new(vec![0u8; 64 * 1024]);
        self.smol_sockets.add(tcp::Socket::new(buf(), buf()))
    }

    fn smol(&mut self, h: smoltcp::iface::SocketHandle) -> &mut tcp::Socket<'static> {
        self.smol_sockets.get_mut::<tcp::Socket>(h)
    }

    /// One millisecond: frames cross the wire both ways, both stacks run.
    fn step(&mut self) {
        self.now_ms += 1;
        let now = usnet_stack::Instant::ZERO + Duration::from_millis(self.now_ms);
        for f in self.smol_dev.tx.drain(..) {
            self.faults.carry(f, self.now_ms, &mut self.to_usnet);
        }
        for f in due(&mut self.to_usnet, self.now_ms) {
            let b = self.usnet.pool_mut().alloc_from(&f).expect("a pool buffer");
            self.usnet.receive(b);
        }
        for _ in 0..8 {
            if !self.usnet.poll(now) {
                break;
            }
        }
        let mut v = Vec::new();
        while let Some(b) = self.usnet.dequeue_tx() {
            self.usnet.pool().copy_chain(&b, &mut v);
            self.usnet.pool_mut().free(b);
            self.faults
                .carry(std::mem::take(&mut v), self.now_ms, &mut self.to_smol);
        }
        self.smol_dev.rx.extend(due(&mut self.to_smol, self.now_ms));
        let t = smoltcp::time::Instant::from_millis(self.now_ms as i64);
        self.smol_iface
            .poll(t, &mut self.smol_dev, &mut self.smol_sockets);
    }
}

/// The usnet end of an echo: reads what comes and writes it back.
fn usnet_echo(w: &mut World, h: SocketHandle, pending: &mut VecDeque<u8>, buf: &mut [u8]) {
    loop {
        match w.usnet.tcp_recv(h, buf) {
            Ok(0) | Err(StackError::WouldBlock) => break,
            Ok(n) => pending.extend(&buf[..n]),
            Err(e) => panic!("usnet recv: {e:?}"),
        }
    }
    while !pending.is_empty() {
        let (a, _) = pending.as_slices();
        match w.usnet.tcp_send(h, a) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(StackError::WouldBlock) => break,
            Err(e) => panic!("usnet send: {e:?}"),
        }
    }
}

/// smoltcp connects to a usnet listener, sends `TOTAL` bytes and checks the echo.
fn smoltcp_client_usnet_server(server: SocketAddr, seed: u64) {
    let mut w = World::new(seed);
    let l = w.usnet.tcp_listen(server, 8).unwrap();
    let c = w.smol_socket();
    let remote = IpEndpoint::new(
        match server.ip() {
            std::net::IpAddr::V4(a) => IpAddress::Ipv4(a),
            std::net::IpAddr::V6(a) => IpAddress::Ipv6(a),
        },
        server.port(),
    );
    let cx = w.smol_iface.context();
    w.smol_sockets
        .get_mut::<tcp::Socket>(c)
        .connect(cx, remote, 49_500)
        .unwrap();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut accepted = None;
    let mut pending = VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut chunk = vec![0u8; 8 * 1024];
    while got < TOTAL {
        assert!(
            w.now_ms < 120_000,
            "stuck: sent {sent}, echoed {got} ({} dropped)",
            w.faults.dropped
        );
        w.step();
        if accepted.is_none() {
            if let Ok(s) = w.usnet.tcp_accept(l) {
                accepted = Some(s);
            }
        }
        if let Some(s) = accepted {
            usnet_echo(&mut w, s, &mut pending, &mut buf);
        }
        let sock = w.smol(c);
        while sent < TOTAL && sock.can_send() {
            let n = chunk.len().min(TOTAL - sent);
            fill(&mut chunk[..n], sent);
            let took = sock.send_slice(&chunk[..n]).unwrap();
            if took == 0 {
                break;
            }
            sent += took;
        }
        while sock.can_recv() {
            let n = sock.recv_slice(&mut chunk).unwrap();
            check(&chunk[..n], got, "usnet");
            got += n;
        }
    }
    // smoltcp closes; usnet reads the end and closes its side.
    w.smol(c).close();
    let s = accepted.unwrap();
    let mut eof = false;
    while w.smol(c).state() != tcp::State::Closed && w.smol(c).state() != tcp::State::TimeWait {
        assert!(w.now_ms < 200_000, "close stuck in {:?}", w.smol(c).state());
        w.step();
        if !eof {
            match w.usnet.tcp_recv(s, &mut buf) {
                Ok(0) => {
                    eof = true;
                    w.usnet.tcp_close(s).unwrap();
                }
                Ok(n) => panic!("{n} bytes after the stream"),
                Err(_) => {}
            }
        }
    }
    assert!(eof, "usnet saw the end of the stream");
    w.report("smoltcp → usnet", server);
}

/// usnet connects to a smoltcp listener, sends `TOTAL` bytes and checks the echo.
fn usnet_client_smoltcp_server(server: SocketAddr, seed: u64) {
    let mut w = World::new(seed);
    let l = w.smol_socket();
    w.smol(l).listen(server.port()).unwrap();
    let c = w.usnet.tcp_connect(None, server).unwrap();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut echo = VecDeque::new();
    let mut chunk = vec![0u8; 8 * 1024];
    let mut buf = vec![0u8; 16 * 1024];
    while got < TOTAL {
        assert!(
            w.now_ms < 120_000,
            "stuck: sent {sent}, echoed {got} ({} dropped)",
            w.faults.dropped
        );
        w.step();
        // smoltcp echoes.
        let sock = w.smol(l);
        while sock.can_recv() && echo.len() < 64 * 1024 {
            let n = sock.recv_slice(&mut chunk).unwrap();
            echo.extend(&chunk[..n]);
        }
        while !echo.is_empty() && sock.can_send() {
            let (a, _) = echo.as_slices();
            let n = sock.send_slice(a).unwrap();
            if n == 0 {
                break;
            }
            echo.drain(..n);
        }
        // usnet sends and checks.
        if !w.usnet.readiness(c).unwrap().connected {
            continue;
        }
        while sent < TOTAL {
            let n = chunk.len().min(TOTAL - sent);
            fill(&mut chunk[..n], sent);
            match w.usnet.tcp_send(c, &chunk[..n]) {
                Ok(k) => sent += k,
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("usnet send: {e:?}"),
            }
        }
        loop {
            match w.usnet.tcp_recv(c, &mut buf) {
                Ok(0) => panic!("early end of the echo at {got}"),
                Ok(n) => {
                    check(&buf[..n], got, "smoltcp");
                    got += n;
                }
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("usnet recv: {e:?}"),
            }
        }
    }
    // usnet closes; smoltcp sees the end, closes too; usnet reads the end.
    w.usnet.tcp_shutdown_write(c).unwrap();
    let mut eof = false;
    while !eof {
        assert!(w.now_ms < 200_000, "close stuck in {:?}", w.smol(l).state());
        w.step();
        let sock = w.smol(l);
        if !sock.may_recv() && sock.state() == tcp::State::CloseWait {
            sock.close();
        }
        match w.usnet.tcp_recv(c, &mut buf) {
            Ok(0) => eof = true,
            Ok(n) => panic!("{n} bytes after the stream"),
            Err(_) => {}
        }
    }
    w.usnet.tcp_close(c).unwrap();
    w.report("usnet → smoltcp", server);
}

#[test]
fn smoltcp_connects_to_usnet_over_ipv4_and_ipv6() {
    smoltcp_client_usnet_server("10.0.0.2:80".parse().unwrap(), 11);
    smoltcp_client_usnet_server("[fd00::2]:80".parse().unwrap(), 12);
}

#[test]
fn usnet_connects_to_smoltcp_over_ipv4_and_ipv6() {
    usnet_client_smoltcp_server("10.0.0.1:7".parse().unwrap(), 13);
    usnet_client_smoltcp_server("[fd00::1]:7".parse().unwrap(), 14);
}
