//! The client library against a stack server in this process.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use usnet_client::{Client, Event, Interest, Mode, Poller, TcpListener, TcpStream, UdpSocket};
use usnet_socket_api::errno;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn tcp_bytes_flow_both_ways_through_the_server() {
    let srv = std::sync::Arc::new(common::server("tcp-both", |_| {}));
    let srv2 = srv.clone();
    let c = Client::attach("tcp-both").unwrap();
    let l = TcpListener::bind(&c, sa("10.66.0.1:7000")).unwrap();
    assert_eq!(l.local_addr().unwrap(), sa("10.66.0.1:7000"));
    let c2 = c.clone();
    let total: usize = 16 << 20;
    let writer = std::thread::spawn(move || {
        let s = TcpStream::connect(&c2, sa("10.66.0.1:7000")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        // Read the echo while writing (one thread each, as with kernel sockets: a
        // writer that never reads would fill both directions and stall).
        std::thread::scope(|sc| {
            let r = sc.spawn(|| {
                let mut back = Vec::new();
                if let Err(e) = (&s).read_to_end(&mut back) {
                    let st = srv2.call(Duration::from_secs(2), |lp| {
                        let conns: Vec<String> = lp
                            .stack()
                            .tcp_connections()
                            .iter()
                            .map(|c| {
                                format!(
                                    "{} {:?} sendq {} recvq {} wnd {} rwnd {} inflight {}",
                                    c.local,
                                    c.info.state,
                                    c.info.send_queued,
                                    c.info.recv_queued,
                                    c.info.snd_wnd,
                                    c.info.rcv_wnd,
                                    c.info.bytes_in_flight
                                )
                            })
                            .collect();
                        (conns, lp.clients())
                    });
                    panic!("echo reader stalled at {}: {e}; {st:?}", back.len());
                }
                back
            });
            (&s).write_all(&data).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let back = r.join().unwrap();
            assert_eq!(back.len(), total);
            assert!(back == data, "echoed bytes differ");
        });
    });
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer.ip(), sa("10.66.0.1:1").ip());
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut got = 0usize;
    loop {
        let n = match s.read(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                let st = srv.call(Duration::from_secs(2), |lp| {
                    let conns: Vec<String> = lp
                        .stack()
                        .tcp_connections()
                        .iter()
                        .map(|c| {
                            format!(
                                "{} {:?} sendq {} recvq {} wnd {} rwnd {} inflight {}",
                                c.local,
                                c.info.state,
                                c.info.send_queued,
                                c.info.recv_queued,
                                c.info.snd_wnd,
                                c.info.rcv_wnd,
                                c.info.bytes_in_flight
                            )
                        })
                        .collect();
                    (conns, lp.clients())
                });
                panic!("echo server stalled at {got}: {e}; {st:?}");
            }
        };
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n]).unwrap();
        got += n;
    }
    assert_eq!(got, total);
    drop(s);
    writer.join().unwrap();
}

#[test]
fn udp_datagrams_keep_their_boundaries_and_senders() {
    let _srv = common::server("udp-dgrams", |_| {});
    let c = Client::attach("udp-dgrams").unwrap();
    let a = UdpSocket::bind(&c, sa("10.66.0.1:7100")).unwrap();
    let b = UdpSocket::bind(&c, sa("10.66.0.1:0")).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let bport = b.local_addr().unwrap();
    assert_ne!(bport.port(), 0);
    // Sizes that wrap the ring at odd places.
    for (i, len) in [1usize, 100, 1472, 9000, 40000, 7, 65507, 3]
        .iter()
        .enumerate()
    {
        let msg: Vec<u8> = (0..*len).map(|k| (k + i) as u8).collect();
        a.send_to(&msg, bport).unwrap();
        let mut buf = vec![0u8; 70000];
        // MSG_PEEK: the same datagram twice, then it is received.
        for _ in 0..2 {
            let (n, from) = b.peek_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (&msg[..], sa("10.66.0.1:7100")));
        }
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!(n, *len);
        assert_eq!(&buf[..n], &msg[..]);
        assert_eq!(from, sa("10.66.0.1:7100"));
    }
    // Connected: send/recv.
    b.connect(sa("10.66.0.1:7100")).unwrap();
    b.send(b"hello").unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = a.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"hello"[..], bport));
}

/// More datagrams than the receive ring holds: the rest wait in the stack's socket
/// queue and follow as the client reads (the server arms the ring's kick when the
/// next one does not fit; a queue that never empties brings no readiness edge).
#[test]
fn udp_datagrams_beyond_a_full_ring_follow_as_the_client_reads() {
    let _srv = common::server("udp-overflow", |_| {});
    let c = Client::attach("udp-overflow").unwrap();
    let small = Client::attach_with(
        Some("udp-overflow"),
        &usnet_client::AttachOptions {
            ring_bytes: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    let rx = UdpSocket::bind(&small, sa("10.66.0.1:7200")).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let tx = UdpSocket::bind(&c, sa("10.66.0.1:0")).unwrap();
    // 200 records of 100 bytes: some 30 fit in a 4 KiB ring.
    const N: usize = 200;
    for i in 0..N {
        tx.send_to(&[i as u8; 100], sa("10.66.0.1:7200")).unwrap();
        if i % 32 == 31 {
            // Let the server keep up: the socket queue must not overflow here.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Everything reaches the stack's queue and the ring fills before a read.
    std::thread::sleep(Duration::from_millis(200));
    let mut buf = [0u8; 200];
    for i in 0..N {
        let (n, _) = rx
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {i} of {N}: {e}"));
        assert_eq!(
            &buf[..n],
            &[i as u8; 100][..],
            "datagram {i} in order, whole"
        );
    }
}

#[test]
fn the_poller_reports_accepts_reads_and_edges() {
    let _srv = common::server("poller", |_| {});
    let c = Client::attach("poller").unwrap();
    let l = TcpListener::bind(&c, sa("10.66.0.1:7200")).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut p = Poller::new();
    p.register(&l, 1, Interest::READABLE, Mode::Level).unwrap();
    let mut ev: Vec<Event> = Vec::new();
    assert_eq!(p.wait(&mut ev, Some(Duration::from_millis(50))).unwrap(), 0);
    let client = TcpStream::connect(&c, sa("10.66.0.1:7200")).unwrap();
    assert_eq!(p.wait(&mut ev, Some(Duration::from_secs(5))).unwrap(), 1);
    assert!(ev[0].readable && ev[0].token == 1);
    let (srv, _) = l.accept().unwrap();
    srv.set_nonblocking(true).unwrap();
    p.register(&srv, 2, Interest::READABLE, Mode::Edge).unwrap();
    (&client).write_all(b"ping").unwrap();
    ev.clear();
    let t = Instant::now();
    while !ev.iter().any(|e| e.token == 2) {
        p.wait(&mut ev, Some(Duration::from_secs(5))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
    // Edge: no second report without a change.
    p.deregister(1).unwrap();
    ev.clear();
    assert_eq!(p.wait(&mut ev, Some(Duration::from_millis(50))).unwrap(), 0);
    let mut buf = [0u8; 8];
    assert_eq!((&srv).read(&mut buf).unwrap(), 4);
    // Non-blocking read of an empty socket.
    assert_eq!(
        (&srv).read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

#[test]
fn connect_to_a_closed_port_is_refused_and_nop_round_trips() {
    let _srv = common::server("refused", |_| {});
    let c = Client::attach("refused").unwrap();
    c.nop().unwrap();
    let e = TcpStream::connect(&c, sa("10.66.0.1:9")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::ECONNREFUSED), "{e}");
}

#[test]
fn tcp_info_and_options_reach_the_connection() {
    let _srv = common::server("opts", |_| {});
    let c = Client::attach("opts").unwrap();
    let l = TcpListener::bind(&c, sa("10.66.0.1:7300")).unwrap();
    let s = TcpStream::connect(&c, sa("10.66.0.1:7300")).unwrap();
    let (a, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    s.set_keepalive(true).unwrap();
    let info = s.info().unwrap();
    assert_eq!(info.state, 1, "ESTABLISHED");
    assert!(info.snd_mss > 0 && info.cwnd > 0);
    // Linux's tcpi_options: the stack negotiates timestamps, SACK and window
    // scaling with itself; a fresh connection is in the Open state.
    assert_eq!(info.options & 7, 7, "{info:?}");
    assert_eq!(info.ca_state, 0);
    assert!(info.rcv_space > 0 && info.delivered >= 1, "{info:?}");
    assert!(s.take_error().unwrap().is_none());
    assert_eq!(s.peer_addr().unwrap(), sa("10.66.0.1:7300"));
    // BBR sets its own pacing rate; SO_MAX_PACING_RATE caps it.
    s.set_congestion(usnet_session_abi::opt::CC_BBR).unwrap();
    let mut buf = [0u8; 4096];
    (&s).write_all(&[1u8; 4096]).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&a).read_exact(&mut buf).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let info = loop {
        let i = s.info().unwrap();
        if i.delivery_rate > 0 || Instant::now() > end {
            break i;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(info.pacing_rate > 0 && info.delivery_rate > 0, "{info:?}");
    s.set_max_pacing_rate(12_345).unwrap();
    assert_eq!(s.info().unwrap().pacing_rate, 12_345);
    assert_eq!(
        s.set_congestion(99).unwrap_err().raw_os_error(),
        Some(2),
        "ENOENT"
    );
}

#[test]
fn tcp_peek_leaves_the_bytes_in_the_stream() {
    let _srv = common::server("tcp-peek", |_| {});
    let c = Client::attach("tcp-peek").unwrap();
    let l = TcpListener::bind(&c, sa("10.66.0.1:7300")).unwrap();
    let a = TcpStream::connect(&c, sa("10.66.0.1:7300")).unwrap();
    let (b, _) = l.accept().unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&a).write_all(b"peek at me").unwrap();
    let mut buf = [0u8; 64];
    let end = Instant::now() + Duration::from_secs(10);
    // Peek until all ten bytes are there, then read them once.
    loop {
        let n = b.peek(&mut buf).unwrap();
        assert_eq!(&buf[..n], &b"peek at me"[..n]);
        if n == 10 {
            break;
        }
        assert!(Instant::now() < end, "only {n} bytes arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = [0u8; 10];
    (&b).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"peek at me");
}

/// Waits (at most 10 s) until `s` is connected.
fn wait_connected(s: &TcpStream) {
    let end = Instant::now() + Duration::from_secs(10);
    while !s.connected() {
        assert!(s.take_error().unwrap().is_none(), "connect failed");
        assert!(Instant::now() < end, "no handshake");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn fast_open_carries_data_on_the_syn_once_a_cookie_is_cached() {
    use usnet_client::{Socket, SocketKind};
    let _srv = common::server_with(
        "fastopen",
        |st| st.tcp.fastopen = 0x3, // client and server
        |_| {},
    );
    let c = Client::attach("fastopen").unwrap();
    let to = sa("10.66.0.1:7400");
    let l = TcpListener::bind(&c, to).unwrap();
    l.set_fastopen(16).unwrap();
    // No cookie yet: the SYN asks for one and carries nothing.
    let s = Socket::new(&c, SocketKind::Tcp).unwrap();
    assert!(!s.fastopen_ready(to).unwrap());
    let (a, q) = s
        .connect_fastopen(to, b"first")
        .map_err(|(_, e)| e)
        .unwrap();
    assert_eq!(q, 0, "no cookie, no SYN data");
    wait_connected(&a);
    let (b, _) = l.accept().unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&a).write_all(b"first").unwrap();
    let mut buf = [0u8; 16];
    (&b).read_exact(&mut buf[..5]).unwrap();
    assert_eq!(&buf[..5], b"first");
    // The SYN-ACK gave a cookie: the next SYN carries the data.
    let s = Socket::new(&c, SocketKind::Tcp).unwrap();
    assert!(s.fastopen_ready(to).unwrap());
    let (a2, q) = s
        .connect_fastopen(to, b"early")
        .map_err(|(_, e)| e)
        .unwrap();
    assert_eq!(q, 5, "all five bytes ride on the SYN");
    let (b2, _) = l.accept().unwrap();
    b2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&b2).read_exact(&mut buf[..5]).unwrap();
    assert_eq!(&buf[..5], b"early");
    wait_connected(&a2);
    drop((a, b, a2, b2));
}

#[test]
fn a_fast_open_connect_the_stack_refuses_leaves_the_socket_unconnected() {
    use usnet_client::{Socket, SocketKind};
    let _srv = common::server_with("fastopen-off", |st| st.tcp.fastopen = 0, |_| {});
    let c = Client::attach("fastopen-off").unwrap();
    let to = sa("10.66.0.1:7401");
    let _l = TcpListener::bind(&c, to).unwrap();
    let s = Socket::new(&c, SocketKind::Tcp).unwrap();
    let (s, e) = s.connect_fastopen(to, b"x").map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::EOPNOTSUPP), "{e}");
    // The socket comes back and still connects the ordinary way.
    let a = s.connect_start(to).unwrap();
    wait_connected(&a);
}

#[test]
fn maxseg_set_before_connect_reaches_the_syn() {
    use usnet_client::{Socket, SocketKind};
    let _srv = common::server("maxseg-syn", |_| {});
    let c = Client::attach("maxseg-syn").unwrap();
    let to = sa("10.66.0.1:7402");
    let l = TcpListener::bind(&c, to).unwrap();
    let s = Socket::new(&c, SocketKind::Tcp).unwrap();
    s.set_maxseg(1000).unwrap();
    let a = s.connect_start(to).unwrap();
    wait_connected(&a);
    let (b, _) = l.accept().unwrap();
    // The accepting side learned the MSS from the SYN.
    assert!(b.info().unwrap().snd_mss <= 1000, "{:?}", b.info().unwrap());
}

#[test]
fn closing_with_bytes_unread_resets_the_peer() {
    let _srv = common::server("unread-close", |_| {});
    let c = Client::attach("unread-close").unwrap();
    let to = sa("10.66.0.1:7403");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    (&a).write_all(b"never read").unwrap();
    let mut buf = [0u8; 16];
    let end = Instant::now() + Duration::from_secs(10);
    while b.peek(&mut buf).unwrap_or(0) < 10 {
        assert!(Instant::now() < end, "the bytes never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(b);
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let e = (&a).read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

#[test]
fn poll_tells_a_peer_fin_from_a_hang_up() {
    let _srv = common::server("rdhup", |_| {});
    let c = Client::attach("rdhup").unwrap();
    let to = sa("10.66.0.1:7404");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    a.shutdown(std::net::Shutdown::Write).unwrap();
    let mut p = Poller::new();
    p.register(&b, 1, Interest::READABLE, Mode::Level).unwrap();
    let mut ev: Vec<Event> = Vec::new();
    p.wait(&mut ev, Some(Duration::from_secs(10))).unwrap();
    let e = ev.first().expect("the FIN makes it readable");
    assert!(e.readable && e.rdhup, "{e:?}");
    assert!(!e.closed && !e.error, "a FIN is not a hang-up: {e:?}");
}

#[test]
fn zero_copy_sends_complete_once_acknowledged() {
    let _srv = common::server("msgzc", |_| {});
    let c = Client::attach("msgzc").unwrap();
    let to = sa("10.66.0.1:7405");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_zerocopy(true).unwrap();
    for chunk in [&b"one"[..], b"two", b"three"] {
        (&a).write_all(chunk).unwrap();
        a.zerocopy_sent();
    }
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 11];
    (&b).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"onetwothree");
    // The completion arrives with the peer's ACK: the poller reports it as an error
    // event, and the three sends are one range.
    let mut p = Poller::new();
    p.register(&a, 1, Interest::READABLE, Mode::Level).unwrap();
    let mut ev: Vec<Event> = Vec::new();
    p.wait(&mut ev, Some(Duration::from_secs(10))).unwrap();
    assert!(ev.first().is_some_and(|e| e.error), "{ev:?}");
    assert_eq!(a.zerocopy_take(), Some((0, 2)));
    assert_eq!(a.zerocopy_take(), None, "read once");
    // Without SO_ZEROCOPY a send is not numbered.
    a.set_zerocopy(false).unwrap();
    (&a).write_all(b"x").unwrap();
    a.zerocopy_sent();
    assert_eq!(a.zerocopy_take(), None);
}

#[test]
fn a_syn_to_a_port_bound_but_not_listening_is_refused() {
    use usnet_client::{Socket, SocketKind};
    // RFC 9293 §3.10.7.1: a socket in CLOSED state (bound, not listening) answers a
    // SYN with a reset, as a closed port does.
    let _srv = common::server("bound-closed", |_| {});
    let c = Client::attach("bound-closed").unwrap();
    let to = sa("10.66.0.1:7406");
    let s = Socket::new(&c, SocketKind::Tcp).unwrap();
    s.bind(to).unwrap();
    let e = TcpStream::connect(&c, to).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::ECONNREFUSED), "{e}");
    // Listening on it then accepts.
    let l = s.listen(8).unwrap();
    let _a = TcpStream::connect(&c, to).unwrap();
    let _b = l.accept().unwrap();
}

#[test]
fn bytes_that_arrived_before_a_reset_are_read_after_it() {
    let _srv = common::server("reset-data", |_| {});
    let c = Client::attach("reset-data").unwrap();
    let to = sa("10.66.0.1:7407");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    (&a).write_all(b"0123456789").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    a.set_linger(Some(Duration::ZERO)).unwrap();
    drop(a);
    std::thread::sleep(Duration::from_millis(50));
    let (b, _) = l.accept().unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    // As Linux: the bytes, then the reset once, then the end.
    assert_eq!((&b).read(&mut buf).unwrap(), 10);
    assert_eq!(&buf[..10], b"0123456789");
    let e = (&b).read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert_eq!(
        (&b).read(&mut buf).unwrap(),
        0,
        "the error is reported once"
    );
    let e = (&b).write(b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
}

/// Reads `n` bytes from `b` on a thread (with a deadline), for a writer that blocks.
fn read_all_of(b: TcpStream, n: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        b.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = vec![0u8; n];
        (&b).read_exact(&mut got).unwrap();
        got
    })
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn a_chosen_send_buffer_bounds_writes_and_loses_nothing() {
    let _srv = common::server("sndbuf", |_| {});
    let c = Client::attach("sndbuf").unwrap();
    let to = sa("10.66.0.1:7407");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    assert!(
        !a.send_bounded(),
        "the ring buffers writes until a limit is chosen"
    );
    a.set_send_buffer_size(8192).unwrap();
    assert!(a.send_bounded());
    // A non-blocking write takes what the stack's 16 KiB buffer admits (Linux's
    // count: whole chunks while the buffer is below its limit), far less than the
    // ring would.
    a.set_nonblocking(true).unwrap();
    let data = pattern(3 << 20);
    let first = (&a).write(&data).unwrap();
    assert!(first > 0 && first < 200_000, "took {first}");
    let mut poller = Poller::new();
    poller
        .register(&a, 1, Interest::WRITABLE, Mode::Level)
        .unwrap();
    // The rest, waiting for the stack's room each time: every byte arrives once,
    // in order, although the stack refused and the ring dropped many.
    let reader = read_all_of(b, data.len());
    let mut done = first;
    let deadline = Instant::now() + Duration::from_secs(20);
    while done < data.len() {
        assert!(Instant::now() < deadline, "stuck at {done}");
        match (&a).write(&data[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut ev = Vec::new();
                poller.wait(&mut ev, Some(Duration::from_secs(5))).unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
    let got = reader.join().unwrap();
    assert!(got == data, "the bytes arrive as written");
}

#[test]
fn sendfile_and_a_pipe_into_a_bounded_socket_give_up_only_what_was_taken() {
    use std::os::fd::AsFd;
    let _srv = common::server("sndbuf-fd", |_| {});
    let c = Client::attach("sndbuf-fd").unwrap();
    let to = sa("10.66.0.1:7408");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_send_buffer_size(8192).unwrap();
    a.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    // A file read from its position: the position moves by what was taken only.
    let data = pattern(600_000);
    let path = std::env::temp_dir().join(format!("usnet-sndbuf-{}", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    // A pipe: what the stack refused stays in the pipe.
    let (pr, pw) = rustix::pipe::pipe().unwrap();
    let piped = pattern(300_000);
    let feed = {
        let piped = piped.clone();
        std::thread::spawn(move || {
            let mut w = std::fs::File::from(pw);
            w.write_all(&piped).unwrap();
        })
    };
    let reader = read_all_of(b, data.len() + piped.len());
    let mut sent = 0;
    loop {
        let n = a.send_file(file.as_fd(), None, 1 << 20).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    assert_eq!(sent, data.len());
    let mut from_pipe = 0;
    while from_pipe < piped.len() {
        from_pipe += a
            .send_file(pr.as_fd(), None, piped.len() - from_pipe)
            .unwrap();
    }
    feed.join().unwrap();
    let got = reader.join().unwrap();
    assert!(got[..data.len()] == data[..], "the file's bytes, once each");
    assert!(
        got[data.len()..] == piped[..],
        "the pipe's bytes, once each"
    );
}

#[test]
fn msg_more_and_msg_eor_reach_the_stack_with_their_bytes() {
    let _srv = common::server("sendflags", |_| {});
    let c = Client::attach("sendflags").unwrap();
    let to = sa("10.66.0.1:7409");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    assert_eq!(a.send_flagged(b"head ", true, false).unwrap(), 5);
    assert_eq!(a.send_flagged(b"record", false, true).unwrap(), 6);
    assert_eq!(
        a.send_vectored_flagged(&[b"a", b"b", b"c"], false, false)
            .unwrap(),
        3
    );
    (&a).write_all(b" tail").unwrap();
    let got = read_all_of(b, 19).join().unwrap();
    assert_eq!(&got, b"head recordabc tail");
}

#[test]
fn transmit_timestamps_report_each_write_sent_and_acknowledged() {
    // SOF_TIMESTAMPING_TX_SCHED | TX_SOFTWARE | TX_ACK | SOFTWARE | OPT_ID.
    const FLAGS: u32 = (1 << 8) | (1 << 1) | (1 << 9) | (1 << 4) | (1 << 7);
    let _srv = common::server("tstamp", |_| {});
    let c = Client::attach("tstamp").unwrap();
    let to = sa("10.66.0.1:7410");
    let l = TcpListener::bind(&c, to).unwrap();
    let a = TcpStream::connect(&c, to).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_timestamping(FLAGS).unwrap();
    assert!(a.send_bounded(), "stamped writes meet the stack");
    assert_eq!(a.timestamp_take().unwrap(), None);
    let before = usnet_client::vtime::wall_ns();
    (&a).write_all(&[7u8; 1000]).unwrap();
    (&a).write_all(&[8u8; 500]).unwrap();
    let got = read_all_of(b, 1500).join().unwrap();
    assert_eq!(got.len(), 1500);
    // Six reports: sent (SCHED, SND) and acknowledged (ACK) for each write's last
    // byte, keyed by its number; the poller says POLLERR while they wait.
    let mut p = Poller::new();
    p.register(&a, 1, Interest::READABLE, Mode::Level).unwrap();
    let mut stamps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while stamps.len() < 6 {
        assert!(Instant::now() < deadline, "reports so far: {stamps:?}");
        let mut ev: Vec<Event> = Vec::new();
        p.wait(&mut ev, Some(Duration::from_millis(100))).unwrap();
        while let Some(t) = a.timestamp_take().unwrap() {
            stamps.push(t);
        }
    }
    let mut kinds: Vec<(u32, u32)> = stamps.iter().map(|t| (t.key, t.info)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            (999, 0),
            (999, 1),
            (999, 2),
            (1499, 0),
            (1499, 1),
            (1499, 2)
        ]
    );
    let after = usnet_client::vtime::wall_ns();
    for t in &stamps {
        let w = t.wall_ns.expect("software stamps asked for");
        // The server's clock is the one its loop read at the start of a turn, which
        // may lag real time a little on a loaded machine: a second of slack below.
        assert!(
            w >= before - 1_000_000_000 && w <= after,
            "{t:?} outside {before}..{after}"
        );
        assert!(!t.tsonly);
    }
    // Unknown flags are refused, as on Linux.
    assert!(a.set_timestamping(1 << 30).is_err());
}

#[test]
fn bind_holds_the_port_and_port_zero_is_chosen_at_bind() {
    use usnet_client::{Socket, SocketKind};
    let _srv = common::server("bindhold", |_| {});
    let c = Client::attach("bindhold").unwrap();
    // Port 0: the port is chosen at bind, and getsockname says which.
    let a = Socket::new(&c, SocketKind::Tcp).unwrap();
    a.bind(sa("10.66.0.1:0")).unwrap();
    let p = a.local_addr().unwrap().port();
    assert_ne!(p, 0, "an ephemeral port, before listen");
    // The port is held: another bind to it fails, wildcard or not.
    let b = Socket::new(&c, SocketKind::Tcp).unwrap();
    let e = b
        .bind(SocketAddr::new("0.0.0.0".parse().unwrap(), p))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::EADDRINUSE), "{e}");
    // A listener holds it too.
    let l = a.listen(8).unwrap();
    assert_eq!(l.local_addr().unwrap().port(), p);
    let e = b.bind(sa(&format!("10.66.0.1:{p}"))).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::EADDRINUSE), "{e}");
    drop(l);
    // Closed: free again.
    b.bind(sa(&format!("10.66.0.1:{p}"))).unwrap();
    drop(b);
    // SO_REUSEADDR on both lets two sockets be bound to one port; one then listens.
    let x = Socket::new(&c, SocketKind::Tcp).unwrap();
    let y = Socket::new(&c, SocketKind::Tcp).unwrap();
    let to = sa("10.66.0.1:7411");
    x.bind_with(to, 0, true).unwrap();
    y.bind_with(to, 0, true).unwrap();
    let z = Socket::new(&c, SocketKind::Tcp).unwrap();
    assert_eq!(
        z.bind(to).unwrap_err().raw_os_error(),
        Some(errno::EADDRINUSE)
    );
    let lx = x.listen(8).unwrap();
    let _a = TcpStream::connect(&c, to).unwrap();
    let _b = lx.accept().unwrap();
}
