//! `--api kernel` on loopback (no root): every response byte checked, keep-alive,
//! pipelining (several requests in one write), `Connection: close`, a request cut
//! by a read boundary, a peer that resets, and many connections at once.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use usnet_httpd::kernel::KernelServer;
use usnet_httpd::{HttpdConfig, Stats};

struct Running {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    h: Option<std::thread::JoinHandle<Stats>>,
}

impl Running {
    fn start(length: usize) -> Running {
        let cfg = HttpdConfig {
            port: 0,
            bind: Some("127.0.0.1".parse().unwrap()),
            length,
            ..HttpdConfig::default()
        };
        let mut srv = KernelServer::bind(&cfg).unwrap();
        let addr = srv.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::spawn(move || srv.run(&s).unwrap());
        Running {
            addr,
            stop,
            h: Some(h),
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn finish(mut self) -> Stats {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.h.take().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while !h.is_finished() {
            assert!(Instant::now() < end, "server did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        h.join().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads exactly `n` bytes (the read timeout bounds every wait).
fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).unwrap();
    v
}

fn read_to_eof(s: &mut TcpStream) -> Vec<u8> {
    let mut v = Vec::new();
    s.read_to_end(&mut v).unwrap();
    v
}

#[test]
fn keep_alive_pipelining_head_and_close() {
    for len in [64usize, 4096, 65536] {
        let srv = Running::start(len);
        let mut s = srv.connect();
        let one = expected(len, false, false);
        // Keep-alive: three requests one after the other.
        for _ in 0..3 {
            s.write_all(GET).unwrap();
            same(&read_n(&mut s, one.len()), &one, "keep-alive");
        }
        // Pipelined: GET, HEAD, GET in one write.
        s.write_all(&[GET, HEAD, GET].concat()).unwrap();
        let want = [one.clone(), expected(len, false, true), one.clone()].concat();
        same(&read_n(&mut s, want.len()), &want, "pipelined");
        // A request cut anywhere.
        let (a, b) = GET.split_at(9);
        s.write_all(a).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        s.write_all(b).unwrap();
        same(&read_n(&mut s, one.len()), &one, "split request");
        // Connection: close after a pipelined GET: both answers, then EOF.
        s.write_all(&[GET, GET_CLOSE, GET].concat()).unwrap();
        let want = [one.clone(), expected(len, true, false)].concat();
        same(&read_to_eof(&mut s), &want, "close");
        let st = srv.finish();
        assert_eq!(st.requests, 9, "{st}");
        assert_eq!(st.responses, 9, "{st}");
        assert_eq!(st.bad_requests, 0);
    }
}

#[test]
fn client_half_close_bad_request_and_reset() {
    let srv = Running::start(100);
    // The client sends and shuts its side: the answer still comes, then EOF.
    let mut s = srv.connect();
    s.write_all(&[GET, GET].concat()).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    same(
        &read_to_eof(&mut s),
        &[expected(100, false, false), expected(100, false, false)].concat(),
        "half close",
    );
    // A malformed request: 400, Connection: close, EOF.
    let mut s = srv.connect();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let got = read_to_eof(&mut s);
    assert!(
        got.starts_with(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // A client that resets mid-request (SO_LINGER 0), then one that resets with
    // answers in flight: the server goes on serving others.
    for req in [&b"GET / HT"[..], &[GET; 50].concat()] {
        let s = srv.connect();
        (&s).write_all(req).unwrap();
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: a valid linger struct for the socket's own descriptor.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
        };
        drop(s);
    }
    let mut s = srv.connect();
    s.write_all(GET).unwrap();
    let want = expected(100, false, false);
    same(&read_n(&mut s, want.len()), &want, "after resets");
    drop(s);
    let st = srv.finish();
    assert_eq!(st.bad_requests, 1, "{st}");
}

#[test]
fn many_connections_at_once() {
    let srv = Running::start(151);
    let one = expected(151, false, false);
    let mut conns: Vec<TcpStream> = (0..200).map(|_| srv.connect()).collect();
    for round in 0..5 {
        for s in &mut conns {
            s.write_all(GET).unwrap();
        }
        for s in &mut conns {
            same(&read_n(s, one.len()), &one, &format!("round {round}"));
        }
    }
    drop(conns);
    let st = srv.finish();
    assert_eq!(st.accepted, 200);
    assert_eq!(st.responses, 1000);
}
