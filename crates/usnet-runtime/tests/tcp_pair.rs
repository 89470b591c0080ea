//! TCP between two stacks in one process joined by a shm link, each with its poll
//! thread: `TcpListener`/`TcpStream` with blocking I/O, the TCP services, errors.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use usnet_link::shm::{ShmConfig, ShmDevice};
use usnet_runtime::{NetStack, RuntimeConfig, ServiceKind, TcpListener, TcpStream};
use usnet_stack::{mac_from_seed, StackConfig, TcpState};

fn start(link: &str, i: u8) -> NetStack {
    let dev = ShmDevice::open(link, &ShmConfig::default()).unwrap();
    NetStack::start(
        Box::new(dev),
        StackConfig {
            mac: mac_from_seed(i as u64),
            addrs: vec![
                format!("10.67.0.{i}/24").parse().unwrap(),
                format!("fd67::{i}/64").parse().unwrap(),
            ],
            seed: i as u64,
            ..Default::default()
        },
        RuntimeConfig::default(),
    )
    .unwrap()
}

fn pair(tag: &str) -> (NetStack, NetStack) {
    let link = format!("rt-tcp-{tag}-{}", std::process::id());
    (start(&link, 1), start(&link, 2))
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 17) as u8 ^ (i >> 13) as u8
}

#[test]
fn stream_transfer_every_byte_both_families() {
    let (a, b) = pair("bulk");
    for (k, addr) in ["10.67.0.2:5001", "[fd67::2]:5002"].iter().enumerate() {
        let addr: SocketAddr = addr.parse().unwrap();
        let l = TcpListener::bind(&b, addr).unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        let total: u64 = if k == 0 { 16 << 20 } else { 2 << 20 };
        let server = std::thread::spawn(move || {
            let (mut s, peer) = l.accept().unwrap();
            assert_eq!(s.peer_addr().unwrap(), peer);
            // A stalled transfer fails the test instead of hanging it.
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0u64;
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                for (j, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, pattern(got + j as u64), "byte {}", got + j as u64);
                }
                got += n as u64;
            }
            s.write_all(b"done").unwrap();
            got
        });
        let t0 = Instant::now();
        let mut c = TcpStream::connect_timeout(&a, addr, Duration::from_secs(5)).unwrap();
        c.set_nodelay(true).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(c.state().unwrap(), TcpState::Established);
        let mut buf = vec![0u8; 64 << 10];
        let mut sent = 0u64;
        while sent < total {
            let n = (total - sent).min(buf.len() as u64) as usize;
            for (j, b) in buf[..n].iter_mut().enumerate() {
                *b = pattern(sent + j as u64);
            }
            c.write_all(&buf[..n]).unwrap();
            sent += n as u64;
        }
        c.shutdown(Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"done");
        assert_eq!(server.join().unwrap(), total);
        let secs = t0.elapsed().as_secs_f64();
        let info = c.info().unwrap();
        eprintln!(
            "{addr}: {} MiB in {secs:.2} s = {:.0} MB/s; retransmits {}",
            total >> 20,
            total as f64 / secs / 1e6,
            info.total_retransmits
        );
    }
    let c = a.with(|s| s.counters_snapshot());
    assert_eq!(c.tcp_active_opens, 2);
    assert_eq!(c.tcp_rx_bad_checksum, 0);
    a.shutdown();
    b.shutdown();
}

#[test]
fn tcp_services_and_errors() {
    let (a, b) = pair("svc");
    for kind in [
        ServiceKind::Echo,
        ServiceKind::Discard,
        ServiceKind::Chargen,
    ] {
        let svc = b.with(|s| kind.start(s)).unwrap();
        b.add_service(svc);
    }
    // Echo: what goes in comes back, across many segments.
    let mut e = TcpStream::connect(&a, "10.67.0.2:7".parse().unwrap()).unwrap();
    e.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let msg: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let msg = msg.clone();
        let mut w = TcpStream::connect(&a, "[fd67::2]:7".parse().unwrap()).unwrap();
        w.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        std::thread::spawn(move || {
            w.write_all(&msg).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
            let mut back = Vec::new();
            w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            w.read_to_end(&mut back).unwrap();
            back
        })
    };
    e.write_all(b"hello tcp echo").unwrap();
    let mut buf = [0u8; 14];
    e.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello tcp echo");
    assert_eq!(writer.join().unwrap(), msg);
    // Chargen: RFC 864 lines.
    let mut g = TcpStream::connect(&a, "10.67.0.2:19".parse().unwrap()).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut lines = vec![0u8; 74 * 3];
    g.read_exact(&mut lines).unwrap();
    let mut want = Vec::new();
    for i in 0..3 {
        usnet_runtime::chargen_line(i, &mut want);
    }
    assert_eq!(lines, want);
    drop(g);
    // Discard swallows.
    let mut d = TcpStream::connect(&a, "10.67.0.2:9".parse().unwrap()).unwrap();
    d.write_all(&vec![7u8; 1 << 20]).unwrap();
    d.flush_acked(Duration::from_secs(10)).unwrap();
    // Refused, and a read timeout.
    let err = TcpStream::connect(&a, "10.67.0.2:4444".parse().unwrap())
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    let l = TcpListener::bind(&b, "0.0.0.0:4445".parse().unwrap()).unwrap();
    let mut t = TcpStream::connect(&a, "10.67.0.2:4445".parse().unwrap()).unwrap();
    t.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let err = t.read(&mut buf).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    t.set_nonblocking(true).unwrap();
    assert_eq!(t.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
    let (s, _) = l.accept().unwrap();
    let ready = a.wait_writable(&[t.handle()], Some(Duration::from_secs(1)));
    assert_eq!(ready, vec![t.handle()]);
    drop(s);
    let ready = a.wait_readable(&[t.handle()], Some(Duration::from_secs(5)));
    assert_eq!(ready, vec![t.handle()]);
    t.set_nonblocking(false).unwrap();
    assert_eq!(t.read(&mut buf).unwrap(), 0, "EOF after the peer closed");
    a.shutdown();
    b.shutdown();
}
