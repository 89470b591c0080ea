//! Two stacks in one process joined by a shm link, each with its poll thread: the
//! blocking socket API, services, ping, readiness and shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use usnet_link::shm::{ShmConfig, ShmDevice};
use usnet_runtime::{NetStack, PingSocket, RuntimeConfig, ServiceKind, UdpSocket};
use usnet_socket_api::errno;
use usnet_stack::{mac_from_seed, StackConfig};

fn start(link: &str, i: u8) -> NetStack {
    let dev = ShmDevice::open(link, &ShmConfig::default()).unwrap();
    NetStack::start(
        Box::new(dev),
        StackConfig {
            mac: mac_from_seed(i as u64),
            addrs: vec![
                format!("10.66.0.{i}/24").parse().unwrap(),
                format!("fd66::{i}/64").parse().unwrap(),
            ],
            seed: i as u64,
            ..Default::default()
        },
        RuntimeConfig::default(),
    )
    .unwrap()
}

fn pair(tag: &str) -> (NetStack, NetStack) {
    let link = format!("rt-{tag}-{}", std::process::id());
    (start(&link, 1), start(&link, 2))
}

#[test]
fn blocking_udp_echo_and_ping_between_two_stacks() {
    let (a, b) = pair("echo");
    let svc = b.with(|s| ServiceKind::Echo.start(s)).unwrap();
    b.add_service(svc);
    let mut sock = UdpSocket::bind(&a, "[::]:0".parse().unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 9000];
    for (i, dst) in ["10.66.0.2:7", "[fd66::2]:7"].iter().enumerate() {
        let dst: SocketAddr = dst.parse().unwrap();
        for n in [1usize, 100, 1472, 8000] {
            let msg: Vec<u8> = (0..n).map(|k| (k + i) as u8).collect();
            sock.send_to(&msg, dst).unwrap();
            let (len, from) = sock.recv_from(&mut buf).unwrap();
            assert_eq!(from, dst);
            assert_eq!(&buf[..len], &msg[..]);
        }
    }
    let ping = PingSocket::open(&a);
    for seq in 1..=3 {
        ping.send("fd66::2".parse().unwrap(), seq, 56).unwrap();
        let (r, rtt) = ping.recv(Duration::from_secs(5)).unwrap();
        assert_eq!(r.seq, seq);
        assert!(rtt.is_some());
    }
    a.shutdown();
    b.shutdown();
}

#[test]
fn nonblocking_recv_and_timeouts() {
    let (a, b) = pair("nb");
    let s = UdpSocket::bind(&a, "0.0.0.0:4000".parse().unwrap()).unwrap();
    s.set_nonblocking(true);
    let mut buf = [0u8; 16];
    let e = s.recv_from(&mut buf).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::EAGAIN));
    s.set_nonblocking(false);
    let mut t = UdpSocket::bind(&b, "0.0.0.0:4001".parse().unwrap()).unwrap();
    t.set_read_timeout(Some(Duration::from_millis(50)));
    assert_eq!(
        t.recv(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::TimedOut
    );
    // Readiness wait over several sockets.
    let u = UdpSocket::bind(&a, "0.0.0.0:4002".parse().unwrap()).unwrap();
    t.send_to(b"ready?", "10.66.0.1:4002".parse().unwrap())
        .unwrap();
    let ready = a.wait_readable(&[s.handle(), u.handle()], Some(Duration::from_secs(5)));
    assert_eq!(ready, vec![u.handle()]);
    drop((s, t, u));
    a.shutdown();
    b.shutdown();
}

#[test]
fn peer_death_is_seen_as_link_down() {
    let (a, b) = pair("down");
    b.shutdown();
    drop(b);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while a.link_state() != usnet_link::LinkState::Down {
        assert!(std::time::Instant::now() < deadline, "link never went down");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.shutdown();
    assert!(!a.is_running());
}
