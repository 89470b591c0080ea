//! A stack server that goes away while a program waits on its sockets and on
//! kernel descriptors at once (a process of its own: the server is stopped).

use std::time::{Duration, Instant};

use usnet_posix as px;
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

/// A program's event loop waits on a usnet socket and its self-pipe (where its
/// signal handler writes, as dnsmasq's and nginx's do). The server stops: the wait
/// reports the socket reset and still sees the pipe, so the program learns of its
/// signal. Before, every `poll` failed with ENETDOWN without looking at the pipe,
/// and such a program spun, deaf to SIGTERM.
#[test]
fn a_wait_on_a_dead_stack_reports_its_sockets_reset_and_still_sees_kernel_descriptors() {
    let d = std::env::temp_dir().join(format!("usnet-posix-gone-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    // SAFETY: set once, before the server or the client reads it.
    unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
    let stack = StackConfig {
        mac: mac_from_seed(25),
        addrs: vec!["10.69.1.1/24".parse().unwrap()],
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: "posix-gone".into(),
        link: "mem".into(),
        ..Default::default()
    };
    let server = usnet_server::testing::in_memory(stack, cfg).unwrap();
    px::attach(Some("posix-gone")).unwrap();
    let u = px::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).unwrap();
    px::bind(u, "10.69.1.1:5353".parse().unwrap()).unwrap();
    let mut pipe = [0; 2];
    // SAFETY: a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut fds = [
        libc::pollfd {
            fd: u,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: pipe[0],
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    assert_eq!(px::poll(&mut fds, 0).unwrap(), 0, "nothing yet");
    drop(server);
    // The signal handler's write.
    // SAFETY: one byte from a valid buffer.
    assert_eq!(unsafe { libc::write(pipe[1], b"T".as_ptr().cast(), 1) }, 1);
    let end = Instant::now() + Duration::from_secs(10);
    let n = loop {
        match px::poll(&mut fds, 1000) {
            Ok(n) if fds[1].revents != 0 => break n,
            Ok(_) => {}
            Err(e) => panic!("poll failed instead of reporting: {e:?}"),
        }
        assert!(Instant::now() < end, "the pipe was never reported");
    };
    assert_eq!(n, 2, "{fds:?}");
    assert_eq!(fds[1].revents, libc::POLLIN);
    let reset = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
    assert_eq!(fds[0].revents & reset, reset, "{fds:?}");
    let mut b = [0u8; 16];
    let e = px::recvfrom(u, &mut b, 0).unwrap_err();
    assert_eq!(e.0, libc::ENETDOWN);
    // SAFETY: the pipe's descriptors, ours.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    let _ = std::fs::remove_dir_all(&d);
}
