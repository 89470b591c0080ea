//! The layer against a stack server in this process: what closing a watched socket
//! does to an epoll set, edge-triggered EPOLLOUT after a full send ring, and usnet's
//! own socket option.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use usnet_posix as px;
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

const ADDR: &str = "10.69.0.1";

/// The tests take turns: one checks which descriptor number the next socket gets.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn attach() -> std::sync::MutexGuard<'static, ()> {
    let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static S: OnceLock<usnet_server::ServerHandle> = OnceLock::new();
    S.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("usnet-posix-epoll-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server or the client reads it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
        let stack = StackConfig {
            mac: mac_from_seed(23),
            addrs: vec![format!("{ADDR}/24").parse().unwrap()],
            ..Default::default()
        };
        let cfg = ServerConfig {
            name: "posix-epoll".into(),
            link: "mem".into(),
            ..Default::default()
        };
        usnet_server::testing::in_memory(stack, cfg).unwrap()
    });
    px::attach(Some("posix-epoll")).unwrap();
    turn
}

fn ev(events: i32, data: u64) -> Option<px::EpollEvent> {
    Some(px::EpollEvent {
        events: events as u32,
        u64: data,
    })
}

#[test]
fn a_closed_socket_leaves_every_epoll_set() {
    let _turn = attach();
    let ep = px::epoll_create(0).unwrap();
    let x = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    px::epoll_ctl(ep, libc::EPOLL_CTL_ADD, x, ev(libc::EPOLLIN, 1)).unwrap();
    // x closes and another socket takes its number in one step. Not by closing x and
    // taking the lowest free number: the server's threads in this process may take
    // that number first.
    let z = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    let y = px::dup2(z, x).unwrap();
    assert_eq!(y, x);
    px::close(z).unwrap();
    // The kernel dropped x from the set when it closed: y can be added, and the set
    // has nothing of x left to modify.
    assert_eq!(
        px::epoll_ctl(ep, libc::EPOLL_CTL_MOD, y, ev(libc::EPOLLIN, 2)),
        Err(px::Errno(libc::ENOENT))
    );
    px::epoll_ctl(ep, libc::EPOLL_CTL_ADD, y, ev(libc::EPOLLIN, 2)).unwrap();
    px::close(y).unwrap();
    px::close(ep).unwrap();
}

#[test]
fn edge_triggered_epollout_comes_when_a_full_send_ring_drains() {
    let _turn = attach();
    let port = 7611;
    let a: SocketAddr = format!("{ADDR}:{port}").parse().unwrap();
    let l = px::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    px::bind(l, a).unwrap();
    px::listen(l, 4).unwrap();
    let c = px::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    px::connect(c, a).unwrap();
    let (s, _) = px::accept4(l, libc::SOCK_NONBLOCK).unwrap();
    px::fcntl(c, libc::F_SETFL, libc::O_NONBLOCK as i64).unwrap();
    let big = vec![7u8; 65536];
    // Fill until a send right after a pause still finds no room: the stack has taken
    // all it can, so the next room comes only when the peer reads.
    let (mut settled, mut filled) = (false, 0usize);
    for _ in 0..50 {
        let mut first = true;
        loop {
            match px::sendto(c, &big, libc::MSG_NOSIGNAL, None) {
                Ok(n) => filled += n,
                Err(px::Errno(libc::EAGAIN)) => break,
                Err(e) => panic!("send: {e:?}"),
            }
            first = false;
        }
        if first {
            settled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(settled, "the send side never filled");
    let ep = px::epoll_create(0).unwrap();
    px::epoll_ctl(
        ep,
        libc::EPOLL_CTL_ADD,
        c,
        ev(libc::EPOLLOUT | libc::EPOLLET, 5),
    )
    .unwrap();
    let mut out = [px::EpollEvent { events: 0, u64: 0 }; 4];
    assert_eq!(
        px::epoll_wait(ep, &mut out, 0).unwrap(),
        0,
        "EPOLLOUT while full"
    );
    // Drain in another thread while this one sleeps in epoll_wait, so the edge
    // arrives during the sleep (where it was once lost).
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let end = Instant::now() + Duration::from_secs(20);
        let mut got = 0usize;
        std::thread::sleep(Duration::from_millis(50));
        while Instant::now() < end && got < filled {
            match px::recvfrom(s, &mut buf, 0) {
                Ok((0, _)) => break,
                Ok((n, _)) => got += n,
                Err(px::Errno(libc::EAGAIN)) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("recv: {e:?}"),
            }
        }
        s
    });
    let n = px::epoll_wait(ep, &mut out, 10_000).unwrap();
    assert_eq!(n, 1, "no EPOLLOUT edge within 10 s");
    let (data, events) = (out[0].u64, out[0].events);
    assert_eq!(data, 5);
    assert!(events & libc::EPOLLOUT as u32 != 0);
    let s = reader.join().unwrap();
    for fd in [ep, c, s, l] {
        px::close(fd).unwrap();
    }
}

#[test]
fn the_priority_mark_reaches_udp_sockets_and_listeners_only() {
    let _turn = attach();
    let set =
        |fd, v: i32| px::setsockopt(fd, px::SOL_USNET, px::USNET_RX_PRIORITY, &v.to_ne_bytes());
    let u = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    assert_eq!(set(u, -4).unwrap_err().0, libc::EINVAL, "not bound yet");
    px::bind(u, format!("{ADDR}:7778").parse().unwrap()).unwrap();
    set(u, -4).unwrap();
    set(u, px::USNET_RX_PRIORITY_NONE).unwrap();
    let t = px::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    assert_eq!(
        set(t, -4).unwrap_err().0,
        libc::EINVAL,
        "not a listener (yet)"
    );
    let a: SocketAddr = format!("{ADDR}:7777").parse().unwrap();
    px::bind(t, a).unwrap();
    px::listen(t, 4).unwrap();
    set(t, -4).unwrap();
    assert_eq!(
        px::setsockopt(u, px::SOL_USNET, 99, &0i32.to_ne_bytes())
            .unwrap_err()
            .0,
        libc::ENOPROTOOPT
    );
    px::close(u).unwrap();
    px::close(t).unwrap();
}

#[test]
fn send_buffer_options_reach_the_stack_and_read_back_as_linux_reports_them() {
    let _turn = attach();
    let a: SocketAddr = format!("{ADDR}:7613").parse().unwrap();
    let l = px::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    px::bind(l, a).unwrap();
    px::listen(l, 4).unwrap();
    let c = px::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    px::connect(c, a).unwrap();
    let (s, _) = px::accept4(l, 0).unwrap();
    let get = |fd, level, name| {
        let mut b = [0u8; 4];
        assert_eq!(px::getsockopt(fd, level, name, &mut b).unwrap(), 4);
        i32::from_ne_bytes(b)
    };
    // Linux doubles SO_SNDBUF, with a floor; TCP_NOTSENT_LOWAT reads back as set.
    px::setsockopt(
        c,
        libc::SOL_SOCKET,
        libc::SO_SNDBUF,
        &21000i32.to_ne_bytes(),
    )
    .unwrap();
    assert_eq!(get(c, libc::SOL_SOCKET, libc::SO_SNDBUF), 42000);
    px::setsockopt(s, libc::SOL_SOCKET, libc::SO_SNDBUF, &1i32.to_ne_bytes()).unwrap();
    assert_eq!(get(s, libc::SOL_SOCKET, libc::SO_SNDBUF), 4608);
    assert_eq!(get(c, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT), 0);
    px::setsockopt(
        c,
        libc::IPPROTO_TCP,
        libc::TCP_NOTSENT_LOWAT,
        &4000i32.to_ne_bytes(),
    )
    .unwrap();
    assert_eq!(get(c, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT), 4000);
    // The connection still carries data under the small limits.
    assert_eq!(px::sendto(c, &[5u8; 3000], 0, None).unwrap(), 3000);
    let mut got = 0;
    let mut buf = [0u8; 4096];
    while got < 3000 {
        got += px::recvfrom(s, &mut buf, 0).unwrap().0;
    }
    for fd in [c, s, l] {
        px::close(fd).unwrap();
    }
}

/// Voluntary context switches of the calling thread so far.
fn own_switches() -> u64 {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

fn pipe() -> (i32, i32) {
    let mut p = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `p`.
    assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (p[0], p[1])
}

fn write_byte(fd: i32) {
    // SAFETY: writes one byte from a local.
    assert_eq!(unsafe { libc::write(fd, [7u8].as_ptr().cast(), 1) }, 1);
}

/// A program's wait on usnet sockets and kernel descriptors at once (an event
/// loop's self-pipe, eventfd or signalfd beside its sockets: nginx, Node, Java,
/// Python's asyncio, PostgreSQL) sleeps in the kernel until either side has
/// something, as `poll` and `epoll_wait` do on the kernel: it does not wake every
/// millisecond to look at the kernel side, and a kernel event or a datagram wakes
/// it. Before, an idle 400 ms wait switched about 400 times.
#[test]
fn a_wait_on_sockets_and_kernel_descriptors_sleeps_until_either_side_has_something() {
    let _turn = attach();
    let at: SocketAddr = format!("{ADDR}:7612").parse().unwrap();
    let u = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    px::bind(u, at).unwrap();
    let sender = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    let (r, w) = pipe();
    let ep = px::epoll_create(0).unwrap();
    px::epoll_ctl(ep, libc::EPOLL_CTL_ADD, u, ev(libc::EPOLLIN, 1)).unwrap();
    px::epoll_ctl(ep, libc::EPOLL_CTL_ADD, r, ev(libc::EPOLLIN, 2)).unwrap();

    // Idle: a 400 ms wait with nothing to report.
    let idle = |wait: &dyn Fn() -> usize| {
        let before = own_switches();
        assert_eq!(wait(), 0, "nothing to report");
        own_switches() - before
    };
    let epoll_idle = idle(&|| {
        let mut out = [px::EpollEvent { events: 0, u64: 0 }; 4];
        px::epoll_wait(ep, &mut out, 400).unwrap()
    });
    let mut fds = [
        libc::pollfd {
            fd: u,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: r,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let poll_idle = idle(&|| {
        let mut f = fds;
        px::poll(&mut f, 400).unwrap()
    });
    assert!(
        epoll_idle < 100 && poll_idle < 100,
        "an idle wait slept in the kernel (switches: epoll {epoll_idle}, poll {poll_idle})"
    );

    // Either side wakes a wait without a deadline's help (the deadline is far).
    for side in ["kernel", "usnet"] {
        let waiter = std::thread::spawn(move || {
            let mut out = [px::EpollEvent { events: 0, u64: 0 }; 4];
            let n = px::epoll_wait(ep, &mut out, 20_000).unwrap();
            out[..n].iter().map(|e| e.u64).collect::<Vec<_>>()
        });
        std::thread::sleep(Duration::from_millis(50));
        match side {
            "kernel" => write_byte(w),
            _ => {
                px::sendto(sender, b"x", 0, Some(at)).unwrap();
            }
        }
        let got = waiter.join().unwrap();
        let want = if side == "kernel" { 2 } else { 1 };
        assert_eq!(got, [want], "woken by the {side} side");
        if side == "kernel" {
            let mut b = [0u8; 1];
            // SAFETY: reads one byte into a local.
            assert_eq!(unsafe { libc::read(r, b.as_mut_ptr().cast(), 1) }, 1);
        }
    }
    // poll too: the datagram is still unread, the pipe empty.
    let n = px::poll(&mut fds, 20_000).unwrap();
    assert_eq!((n, fds[0].revents, fds[1].revents), (1, libc::POLLIN, 0));
    let waiter = std::thread::spawn(move || {
        let mut f = [
            libc::pollfd {
                fd: r,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sender,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        px::poll(&mut f, 20_000).unwrap();
        (f[0].revents, f[1].revents)
    });
    std::thread::sleep(Duration::from_millis(50));
    write_byte(w);
    assert_eq!(waiter.join().unwrap(), (libc::POLLIN, 0));
    // u's datagram read, the pipe's byte too: nothing is ready.
    let mut b = [0u8; 8];
    px::recvfrom(u, &mut b, 0).unwrap();
    // SAFETY: reads one byte into a local.
    assert_eq!(unsafe { libc::read(r, b.as_mut_ptr().cast(), 1) }, 1);
    // Another thread adds a socket that has a datagram waiting while the set's
    // waiter sleeps: the waiter reports it (its sleep holds the set's poller,
    // which the `epoll_ctl` needs: the call wakes it).
    let v = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    let at_v: SocketAddr = format!("{ADDR}:7613").parse().unwrap();
    px::bind(v, at_v).unwrap();
    px::sendto(sender, b"y", 0, Some(at_v)).unwrap();
    let waiter = std::thread::spawn(move || {
        let mut out = [px::EpollEvent { events: 0, u64: 0 }; 4];
        let n = px::epoll_wait(ep, &mut out, 20_000).unwrap();
        out[..n].iter().map(|e| e.u64).collect::<Vec<_>>()
    });
    std::thread::sleep(Duration::from_millis(50));
    px::epoll_ctl(ep, libc::EPOLL_CTL_ADD, v, ev(libc::EPOLLIN, 3)).unwrap();
    assert_eq!(waiter.join().unwrap(), [3], "the socket added meanwhile");
    px::epoll_ctl(ep, libc::EPOLL_CTL_DEL, v, None).unwrap();
    px::close(v).unwrap();

    // A set with only the pipe: its waiter sleeps in the kernel, without end; a
    // socket with a datagram waiting, added from this thread, wakes it.
    let kernel_only = px::epoll_create(0).unwrap();
    px::epoll_ctl(kernel_only, libc::EPOLL_CTL_ADD, r, ev(libc::EPOLLIN, 2)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = [px::EpollEvent { events: 0, u64: 0 }; 4];
        let n = px::epoll_wait(kernel_only, &mut out, -1).unwrap();
        let _ = tx.send(out[..n].iter().map(|e| e.u64).collect::<Vec<_>>());
    });
    std::thread::sleep(Duration::from_millis(50));
    let w2 = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    let at_w2: SocketAddr = format!("{ADDR}:7614").parse().unwrap();
    px::bind(w2, at_w2).unwrap();
    px::sendto(sender, b"z", 0, Some(at_w2)).unwrap();
    px::epoll_ctl(kernel_only, libc::EPOLL_CTL_ADD, w2, ev(libc::EPOLLIN, 4)).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)),
        Ok(vec![4]),
        "a wait on kernel descriptors alone sees a socket added meanwhile"
    );
    px::close(w2).unwrap();
    px::close(kernel_only).unwrap();

    for fd in [u, sender, ep] {
        px::close(fd).unwrap();
    }
    // SAFETY: closing the pipe's two ends, ours.
    unsafe {
        libc::close(r);
        libc::close(w);
    }
}
