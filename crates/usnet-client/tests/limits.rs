//! Per-client limits of a stack server (each hit, each counted where `usnet stat`
//! shows it) and many threads of one client using its sockets at once.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnet_client::{AttachOptions, Client, TcpListener, TcpStream, UdpSocket};
use usnet_server::ServerLimits;
use usnet_session::ctl::{
    self,
    msg::{ClientRow, Stat},
};
use usnet_session_abi::{errno, Geometry};
use usnet_stack::Owner;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn stat(path: &std::path::Path) -> Stat {
    ctl::call_one(path, &ctl::Request::Stat).unwrap()
}

fn row(st: &Stat, session: u32) -> ClientRow {
    st.clients
        .iter()
        .find(|r| r.id == session)
        .cloned()
        .unwrap_or_else(|| panic!("session {session} not in stat: {st:?}"))
}

fn until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Clients at once, sockets per client, ring bytes per socket, listen backlog and UDP
/// receive buffer: each limit is configurable, holds when a client asks for more, and
/// is counted in `usnet stat` (per client, and `quota_sessions` for the server).
#[test]
fn per_client_limits_hold_and_are_counted() {
    let (backlog_cap, rcvbuf_cap) = (8usize, 16usize << 10);
    let srv = common::server("quotas", |c| {
        c.geometry = Geometry {
            max_sockets: 64,
            ring_bytes: 64 << 10,
            ..Default::default()
        };
        c.limits = ServerLimits {
            max_sessions: 2,
            max_backlog: backlog_cap,
            max_rcvbuf: rcvbuf_cap,
            ..Default::default()
        };
    });
    let path = srv.control_path().unwrap().to_path_buf();
    // Sessions: two, the third is refused.
    let a = Client::attach_with(
        Some("quotas"),
        &AttachOptions {
            max_sockets: Some(4),
            ring_bytes: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let b = Client::attach_with(
        Some("quotas"),
        &AttachOptions {
            max_sockets: Some(100_000),
            ring_bytes: None,
            ..Default::default()
        },
    )
    .unwrap();
    let e = Client::attach("quotas").unwrap_err();
    assert!(e.to_string().contains("too many clients"), "{e}");
    let st = stat(&path);
    assert_eq!(st.quota_sessions, 1, "{st:?}");
    assert_eq!(st.limits.max_backlog, backlog_cap as u64);
    // Geometry: asking past the caps gets the caps, counted.
    let (ra, rb) = (row(&st, a.session_id()), row(&st, b.session_id()));
    assert_eq!((ra.max_sockets, ra.ring_bytes), (4, 64 << 10));
    assert_eq!(rb.max_sockets, 64);
    assert_eq!(ra.stats.quota_geometry, 1);
    assert_eq!(rb.stats.quota_geometry, 1);

    // Backlog: asked 1000, got the cap; the accept queue never holds more.
    let l = TcpListener::bind_with_backlog(&a, sa("10.66.0.1:7700"), 1000).unwrap();
    let pending: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect_nonblocking(&b, sa("10.66.0.1:7700")).unwrap())
        .collect();
    let queued = || {
        srv.call(Duration::from_secs(2), |lp| {
            lp.stack()
                .tcp_listeners()
                .iter()
                .find(|l| l.local.port() == 7700)
                .map(|l| l.accept_queue)
                .unwrap()
        })
        .unwrap()
    };
    until("a full accept queue", Duration::from_secs(5), || {
        let q = queued();
        assert!(q <= backlog_cap, "accept queue {q}");
        q == backlog_cap
    });
    for _ in 0..20 {
        assert!(queued() <= backlog_cap);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Sockets: the listener and three accepted fill the quota of four; a fifth socket,
    // accepted or new, is EMFILE.
    let mut accepted: Vec<TcpStream> = (0..3).map(|_| l.accept().unwrap().0).collect();
    let emfile = Some(errno::EMFILE as i32);
    assert_eq!(l.accept().unwrap_err().raw_os_error(), emfile);
    assert_eq!(
        TcpStream::connect(&a, sa("10.66.0.1:7700"))
            .unwrap_err()
            .raw_os_error(),
        emfile
    );
    assert_eq!(
        UdpSocket::bind(&a, sa("10.66.0.1:0"))
            .map(|_| ())
            .unwrap_err()
            .raw_os_error(),
        emfile
    );
    let st = stat(&path);
    let ra = row(&st, a.session_id());
    assert_eq!(ra.sockets, 4);
    assert_eq!(ra.stats.quota_sockets, 3, "{ra:?}");
    assert_eq!(ra.stats.quota_backlog, 1, "{ra:?}");
    // The accept queue is the client's too, and bounded by the capped backlog.
    let held = ra.stack_sockets;
    assert!(held <= 4 + backlog_cap as u64, "{ra:?}");

    // Receive buffer: asked 64 MiB, got the cap; a receiver that never reads holds
    // its ring's worth plus the cap in the stack, and the rest is dropped (counted).
    drop(accepted.pop());
    let u = UdpSocket::bind(&a, sa("10.66.0.1:7710")).unwrap();
    u.set_recv_buffer_size(64 << 20).unwrap();
    let sender = UdpSocket::bind(&b, sa("10.66.0.1:0")).unwrap();
    let n = 200u64;
    for i in 0..n {
        sender
            .send_to(&[i as u8; 1000], sa("10.66.0.1:7710"))
            .unwrap();
    }
    let owner = Owner(a.session_id());
    let stats = || {
        srv.call(Duration::from_secs(2), move |lp| {
            let s = lp.stack();
            let h = s
                .sockets_of(owner)
                .into_iter()
                .find(|&h| s.udp_local_addr(h).is_ok_and(|a| a.port() == 7710))
                .unwrap();
            s.socket_stats(h).unwrap()
        })
        .unwrap()
    };
    until("every datagram counted", Duration::from_secs(5), || {
        let s = stats();
        s.rx_datagrams + s.rx_queue_full == n
    });
    let s = stats();
    // A 64 KiB ring holds 63 records of 1000 bytes; the stack 16 KiB more.
    let ring_records = (64 << 10) / usnet_session_abi::record_len(1000) as u64;
    let stack_cap = (rcvbuf_cap / 1000) as u64 + 1;
    assert!(s.rx_queue_full > 0, "{s:?}");
    assert!(s.rx_datagrams <= ring_records + stack_cap, "{s:?}");
    let ra = row(&stat(&path), a.session_id());
    assert_eq!(ra.stats.quota_rcvbuf, 1, "{ra:?}");
    drop(pending);
}

/// Many threads of one client use its sockets at once: eight threads open four
/// connections each and stream 256 KiB through them while one echo thread per
/// accepted connection sends it back and another thread makes round trips; every
/// byte arrives right.
#[test]
fn threads_of_one_client_use_its_sockets_at_once() {
    let _srv = common::server("threads", |_| {});
    let c = Client::attach("threads").unwrap();
    let l = TcpListener::bind(&c, sa("10.66.0.1:7800")).unwrap();
    let (threads, per, len) = (8usize, 4usize, 256usize << 10);
    let acceptor = std::thread::spawn(move || {
        let mut echoes = Vec::new();
        for _ in 0..threads * per {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            echoes.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 16384];
                loop {
                    let n = (&s).read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    (&s).write_all(&buf[..n]).unwrap();
                }
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }));
        }
        for e in echoes {
            e.join().unwrap();
        }
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c2, stop2) = (c.clone(), stop.clone());
    let pinger = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Acquire) {
            c2.nop().unwrap();
            n += 1;
        }
        n
    });
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for k in 0..per {
                    let s = TcpStream::connect(&c, sa("10.66.0.1:7800")).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let data: Vec<u8> = (0..len).map(|i| (i * 13 + t * 7 + k) as u8).collect();
                    std::thread::scope(|sc| {
                        let r = sc.spawn(|| {
                            let mut back = Vec::new();
                            (&s).read_to_end(&mut back).unwrap();
                            back
                        });
                        (&s).write_all(&data).unwrap();
                        s.shutdown(std::net::Shutdown::Write).unwrap();
                        let back = r.join().unwrap();
                        assert!(back == data, "thread {t} connection {k}: bytes differ");
                    });
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    acceptor.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Release);
    assert!(pinger.join().unwrap() > 0);
}

/// One client that stops reading its UDP sockets holds at most its share of the
/// packet pool (`max_pool_percent`): past it its datagrams are dropped and counted,
/// and another client's datagrams keep arriving.
#[test]
fn a_client_that_stops_reading_cannot_take_the_pool() {
    let srv = common::server("poolquota", |c| {
        c.geometry = Geometry {
            ring_bytes: 4096,
            ..Default::default()
        };
        c.limits = ServerLimits {
            max_pool_percent: 2,
            ..Default::default()
        };
    });
    let path = srv.control_path().unwrap().to_path_buf();
    let st = stat(&path);
    let cap = st.limits.max_pool_bufs;
    assert_eq!(cap, st.pool.count * 2 / 100, "{:?}", st.limits);
    let greedy = Client::attach("poolquota").unwrap();
    let other = Client::attach("poolquota").unwrap();
    // Four sockets that never read, each allowed far more than the cap in bytes.
    let stuck: Vec<UdpSocket> = (0..4)
        .map(|i| {
            let u = UdpSocket::bind(&greedy, sa(&format!("10.66.0.1:{}", 7800 + i))).unwrap();
            u.set_recv_buffer_size(4 << 20).unwrap();
            u
        })
        .collect();
    let reader = UdpSocket::bind(&other, sa("10.66.0.1:7810")).unwrap();
    reader
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let sender = UdpSocket::bind(&other, sa("10.66.0.1:0")).unwrap();
    let mut buf = [0u8; 16];
    let rounds = 3 * cap as u32;
    for i in 0..rounds {
        for k in 0..4 {
            let to = sa(&format!("10.66.0.1:{}", 7800 + k));
            sender.send_to(b"x", to).unwrap();
        }
        // The other client's traffic still gets through, every datagram of it.
        sender
            .send_to(&i.to_be_bytes(), sa("10.66.0.1:7810"))
            .unwrap();
        let (n, _) = reader.recv_from(&mut buf).unwrap();
        assert_eq!(buf[..n], i.to_be_bytes());
    }
    let owner = Owner(greedy.session_id());
    until(
        "the stuck client's share taken",
        Duration::from_secs(5),
        || row(&stat(&path), greedy.session_id()).pool_held == cap,
    );
    let dropped = srv
        .call(Duration::from_secs(2), |lp| {
            lp.stack().counters().udp_rx_owner_full
        })
        .unwrap();
    assert!(dropped > 0);
    assert_eq!(
        srv.call(Duration::from_secs(2), move |lp| lp.stack().rx_held(owner))
            .unwrap(),
        cap as u32
    );
    assert_eq!(row(&stat(&path), other.session_id()).pool_held, 0);
    // Closing the sockets gives the buffers back.
    drop(stuck);
    until("the share given back", Duration::from_secs(5), || {
        row(&stat(&path), greedy.session_id()).pool_held == 0
    });
}
