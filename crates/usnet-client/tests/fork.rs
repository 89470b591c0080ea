//! Sockets shared after a fork, without forking: a second client in this process
//! plays the child (it claims the parent's pin as a forked child would), so the server
//! side of sharing is tested under the test harness's threads. The real fork (the
//! pin around `fork()`, the child's lazy claim) is tested by `examples/c/fork.c`
//! through the shim (crates/usnet-preload/tests/preload.rs).

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use usnet_client::{AttachOptions, Client, TcpListener, TcpStream};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The child's copy of each pinned socket: (parent slot, child slot) → child slot.
fn child_slot(map: &[usnet_client::Claimed], parent: u32) -> u32 {
    map.iter()
        .find(|c| c.parent_slot == parent)
        .map(|c| c.slot)
        .expect("the socket was pinned")
}

/// Accepts on a non-blocking listener until `deadline`.
fn accept_by(l: &TcpListener, deadline: Instant) -> TcpStream {
    loop {
        match l.accept() {
            Ok((s, _)) => return s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no connection to accept");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn stat(server: &usnet_server::ServerHandle) -> (usize, usize) {
    server
        .call(Duration::from_secs(5), |lp| {
            lp.check_shared();
            let (shared, pins) = lp.fork_counts();
            (shared, pins.len())
        })
        .unwrap()
}

/// Waits (at most 5 s) until no socket is shared and no pin waits: closes are posted
/// without waiting for the server.
fn settled(server: &usnet_server::ServerHandle) {
    let t = Instant::now();
    while stat(server) != (0, 0) {
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", stat(server));
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_listener_shared_by_two_children_serves_both_and_outlives_the_parent() {
    let server = common::server("fork-listen", |_| {});
    let parent = Client::attach("fork-listen").unwrap();
    let l = TcpListener::bind(&parent, sa(&format!("{}:7100", common::ADDR))).unwrap();
    let mut kids = Vec::new();
    for _ in 0..2 {
        let pin = parent.pin_for_fork().unwrap();
        let (c, map) = Client::claim(pin, &AttachOptions::default()).unwrap();
        let cl = l.forked(&c, child_slot(&map, l.fork_slot())).unwrap();
        cl.set_nonblocking(true).unwrap();
        kids.push((c, cl));
    }
    assert_eq!(stat(&server), (1, 0), "one shared listener, no pin left");
    // The parent closes its copy: the children's still listen.
    drop(l);
    let peer = Client::attach("fork-listen").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut served = [0usize; 2];
    for round in 0..6 {
        let mut c = TcpStream::connect(&peer, sa(&format!("{}:7100", common::ADDR))).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(format!("hello {round}").as_bytes()).unwrap();
        // Alternate which child takes it; both see the one accept queue.
        let k = round % 2;
        let mut s = accept_by(&kids[k].1, deadline);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, format!("hello {round}").as_bytes());
        s.write_all(b"ok").unwrap();
        let mut b2 = [0u8; 2];
        c.read_exact(&mut b2).unwrap();
        assert_eq!(&b2, b"ok");
        served[k] += 1;
    }
    assert_eq!(served, [3, 3]);
    // The last holder closes: the port is free again.
    drop(kids);
    let t = Instant::now();
    loop {
        match TcpListener::bind(&peer, sa(&format!("{}:7100", common::ADDR))) {
            Ok(_) => break,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(5), "port still held: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    settled(&server);
}

#[test]
fn a_connection_handed_to_the_child_keeps_its_unread_bytes() {
    let server = common::server("fork-conn", |_| {});
    let parent = Client::attach("fork-conn").unwrap();
    let l = TcpListener::bind(&parent, sa(&format!("{}:7101", common::ADDR))).unwrap();
    let peer = Client::attach("fork-conn").unwrap();
    let mut c = TcpStream::connect(&peer, sa(&format!("{}:7101", common::ADDR))).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"request").unwrap();
    let (s, _) = l.accept().unwrap();
    // The request reaches the parent's ring before the fork.
    let t = Instant::now();
    while s.available() < 7 {
        assert!(t.elapsed() < Duration::from_secs(5), "request not received");
        std::thread::sleep(Duration::from_millis(1));
    }
    let pin = parent.pin_for_fork().unwrap();
    let (child, map) = Client::claim(pin, &AttachOptions::default()).unwrap();
    let mut cs = s.forked(&child, child_slot(&map, s.fork_slot())).unwrap();
    cs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The child has the listener too, and closes its copy (as a forking server's
    // child does).
    drop(l.forked(&child, child_slot(&map, l.fork_slot())).unwrap());
    // While the parent holds it, the stream is the parent's: the child reads nothing.
    cs.set_nonblocking(true).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(
        cs.read(&mut b).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    cs.set_nonblocking(false).unwrap();
    // The parent closes its copy (and its listener): the child gets what it left.
    drop(s);
    drop(l);
    let mut buf = [0u8; 7];
    cs.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"request");
    // More from the peer goes to the child now, and the child's answer to the peer.
    c.write_all(b" more").unwrap();
    let mut more = [0u8; 5];
    cs.read_exact(&mut more).unwrap();
    assert_eq!(&more, b" more");
    cs.write_all(b"response").unwrap();
    let mut r = [0u8; 8];
    c.read_exact(&mut r).unwrap();
    assert_eq!(&r, b"response");
    // The child closes: the peer sees the end of the stream (a FIN, not a reset).
    drop(cs);
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    settled(&server);
}

#[test]
fn a_pin_nobody_claims_lets_go_and_a_dead_holder_does_not_reset_the_others() {
    let server = common::server("fork-pin", |_| {});
    let parent = Client::attach("fork-pin").unwrap();
    let l = TcpListener::bind(&parent, sa(&format!("{}:7102", common::ADDR))).unwrap();
    let peer = Client::attach("fork-pin").unwrap();
    let mut c = TcpStream::connect(&peer, sa(&format!("{}:7102", common::ADDR))).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A child that exits (or execs) without a usnet call: its pin goes with it.
    let pin = parent.pin_for_fork().unwrap();
    assert_eq!(stat(&server), (2, 1));
    drop(pin);
    let t = Instant::now();
    while stat(&server).1 != 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the pin stays");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The parent still has both, and they still work.
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    // A child that claims, then its parent dies: the child's copy is not reset.
    let pin = parent.pin_for_fork().unwrap();
    let (child, map) = Client::claim(pin, &AttachOptions::default()).unwrap();
    let mut cs = s.forked(&child, child_slot(&map, s.fork_slot())).unwrap();
    cs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sid = parent.session_id();
    std::mem::forget(s);
    std::mem::forget(l);
    drop(parent);
    // The parent "dies": the server drops its session as on a hang-up.
    server
        .call(Duration::from_secs(5), move |lp| lp.remove_session(sid))
        .unwrap();
    c.write_all(b"still").unwrap();
    let mut b = [0u8; 5];
    cs.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"still");
    cs.write_all(b"alive").unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"alive");
    drop(cs);
    drop(child);
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

/// Both processes write to one shared connection at the same time: the peer gets
/// every byte of both, nothing else, each writer's bytes in its own order.
#[test]
fn two_holders_writing_at_once_lose_and_garble_nothing() {
    let server = common::server("fork-write", |_| {});
    let parent = Client::attach("fork-write").unwrap();
    let l = TcpListener::bind(&parent, sa(&format!("{}:7103", common::ADDR))).unwrap();
    let peer = Client::attach("fork-write").unwrap();
    let mut c = TcpStream::connect(&peer, sa(&format!("{}:7103", common::ADDR))).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (s, _) = l.accept().unwrap();
    let pin = parent.pin_for_fork().unwrap();
    let (child, map) = Client::claim(pin, &AttachOptions::default()).unwrap();
    let cs = s.forked(&child, child_slot(&map, s.fork_slot())).unwrap();
    drop(l.forked(&child, child_slot(&map, l.fork_slot())).unwrap());
    const N: usize = 300_000;
    // Each writer sends its own letter with a running counter byte after it.
    let writer = |mut w: TcpStream, tag: u8| {
        std::thread::spawn(move || {
            let mut buf = Vec::with_capacity(2 * N);
            for k in 0..N {
                buf.push(tag);
                buf.push(k as u8);
            }
            // Records of two bytes never split across writes: write in even pieces.
            for piece in buf.chunks(4096) {
                w.write_all(piece).unwrap();
            }
            w
        })
    };
    let (a, b) = (writer(s, b'P'), writer(cs, b'C'));
    let mut got = vec![0u8; 4 * N];
    c.read_exact(&mut got).unwrap();
    let mut next = [0u8; 2];
    for rec in got.chunks(2) {
        let k = match rec[0] {
            b'P' => 0,
            b'C' => 1,
            x => panic!("a byte that nobody wrote: {x}"),
        };
        assert_eq!(rec[1], next[k], "writer {k}'s bytes out of order");
        next[k] = next[k].wrapping_add(1);
    }
    drop(a.join().unwrap());
    drop(b.join().unwrap());
    drop(child);
    drop(l);
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    settled(&server);
}

/// A UDP socket shared after a fork: datagrams go to the holder that had it, then,
/// once it closes its copy, to the child.
#[test]
fn a_shared_udp_socket_delivers_to_one_holder_then_the_next() {
    let _server = common::server("fork-udp", |_| {});
    let parent = Client::attach("fork-udp").unwrap();
    let to = sa(&format!("{}:7104", common::ADDR));
    let u = usnet_client::UdpSocket::bind(&parent, to).unwrap();
    u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let pin = parent.pin_for_fork().unwrap();
    let (child, map) = Client::claim(pin, &AttachOptions::default()).unwrap();
    let cu = u.forked(&child, child_slot(&map, u.fork_slot())).unwrap();
    cu.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let peer = Client::attach("fork-udp").unwrap();
    let p = usnet_client::UdpSocket::bind(&peer, sa(&format!("{}:0", common::ADDR))).unwrap();
    p.send_to(b"first", to).unwrap();
    let mut buf = [0u8; 16];
    let (n, _) = u.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"first");
    drop(u);
    // The parent's close reaches the server before the next datagram does.
    std::thread::sleep(Duration::from_millis(50));
    p.send_to(b"second", to).unwrap();
    let (n, _) = cu.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"second");
    // The child answers from the same address.
    cu.send_to(b"reply", p.local_addr().unwrap()).unwrap();
    p.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (n, from) = p.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"reply"[..], to));
}

/// A connection passed to another process (`SCM_RIGHTS`), played by a second client
/// that is already attached: the sender pins only that socket, closes its copy
/// while the pin is in flight, and the receiver's session takes it with its unread
/// bytes and answers on it. The sender's other sockets stay its own.
#[test]
fn a_connection_passed_to_an_attached_process_keeps_its_unread_bytes() {
    let server = common::server("pass-conn", |_| {});
    let sender = Client::attach("pass-conn").unwrap();
    let receiver = Client::attach("pass-conn").unwrap();
    let l = TcpListener::bind(&sender, sa(&format!("{}:7110", common::ADDR))).unwrap();
    let peer = Client::attach("pass-conn").unwrap();
    let mut c = TcpStream::connect(&peer, sa(&format!("{}:7110", common::ADDR))).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"request").unwrap();
    let (s, _) = l.accept().unwrap();
    let pin = sender.pin_for_passing(&[s.fork_slot()]).unwrap();
    // Only the passed socket is shared; the listener stays the sender's alone.
    assert_eq!(stat(&server), (1, 1), "one socket pinned for the receiver");
    drop(s);
    let got = receiver
        .take_passed(pin_stream(&pin))
        .expect("the receiver takes the passed socket");
    drop(pin);
    assert_eq!(got.len(), 1, "{got:?}");
    let mut r = TcpStream::inherited(&receiver, got[0].slot).unwrap();
    r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 7];
    r.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"request");
    r.write_all(b"answer").unwrap();
    let mut b2 = [0u8; 6];
    c.read_exact(&mut b2).unwrap();
    assert_eq!(&b2, b"answer");
    // A second pin of the same kind, never taken: dropping it lets the socket go
    // with the sender's close, as a message never received would.
    let mut c2 = TcpStream::connect(&peer, sa(&format!("{}:7110", common::ADDR))).unwrap();
    c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (s2, _) = l.accept().unwrap();
    let pin2 = sender.pin_for_passing(&[s2.fork_slot()]).unwrap();
    drop(s2);
    drop(pin2);
    let mut b3 = [0u8; 1];
    assert_eq!(
        c2.read(&mut b3).unwrap(),
        0,
        "the unclaimed connection closes"
    );
    drop((r, l));
    settled(&server);
}

fn pin_stream(p: &usnet_client::ForkPin) -> &std::os::unix::net::UnixStream {
    p.stream()
}
