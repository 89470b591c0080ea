//! `--api socket`'s server ([`SocketServer`]) and `--api zerocopy`'s ([`ZcServer`])
//! in a driver's turn, no root: clients on the same stack connect to its own address
//! (delivered locally), so whole conversations run in one thread. Every response
//! byte checked; keep-alive, pipelining, `Connection: close`, a client reset, and
//! many connections; each test runs on both servers.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use usnet_driver::{Driver, MemDevice, SystemClock};
use usnet_httpd::socket::{SocketServer, StackApp};
use usnet_httpd::zerocopy::ZcServer;
use usnet_httpd::HttpdConfig;
use usnet_link::DeviceCaps;
use usnet_stack::{SocketHandle, Stack, StackConfig, StackError};

type Drv = Driver<MemDevice, SystemClock>;

/// What the tests need of a server besides its turn.
trait Server: StackApp {
    fn start(stack: &mut Stack, cfg: &HttpdConfig) -> Self;
    fn connections(&self) -> usize;
    /// Ring slots the stack refused (zero-copy); a correct server has none.
    fn refused_slots(&self) -> u64 {
        0
    }
}

impl Server for SocketServer {
    fn start(stack: &mut Stack, cfg: &HttpdConfig) -> Self {
        SocketServer::start(stack, cfg).unwrap()
    }
    fn connections(&self) -> usize {
        SocketServer::connections(self)
    }
}

impl Server for ZcServer {
    fn start(stack: &mut Stack, cfg: &HttpdConfig) -> Self {
        ZcServer::start(stack, cfg).unwrap()
    }
    fn connections(&self) -> usize {
        ZcServer::connections(self)
    }
    fn refused_slots(&self) -> u64 {
        self.port_stats().bad_slots
    }
}

fn setup<S: Server>(length: usize) -> (Drv, S) {
    setup_batch(length, 8)
}

fn setup_batch<S: Server>(length: usize, batch: usize) -> (Drv, S) {
    let (dev, _q) = MemDevice::new("mem", DeviceCaps::plain(1500)).unwrap();
    let stack = Stack::new(StackConfig {
        addrs: vec!["10.0.0.1/24".parse().unwrap()],
        ..StackConfig::default()
    })
    .unwrap();
    let mut d = Driver::new(stack, dev, SystemClock::new());
    let srv = S::start(
        d.stack_mut(),
        &HttpdConfig {
            port: 80,
            length,
            batch,
            ..HttpdConfig::default()
        },
    );
    (d, srv)
}

const SERVER: &str = "10.0.0.1:80";

/// Turns until `done` (checked on the stack after each turn) or 10 s.
fn turn_until<S: Server>(d: &mut Drv, srv: &mut S, mut done: impl FnMut(&mut Stack, &S) -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        d.turn_with(|st| srv.poll(st)).unwrap();
        if done(d.stack_mut(), srv) {
            return;
        }
        assert!(Instant::now() < end, "no progress within 10 s");
    }
}

/// A client connection on the stack: sends and collects.
struct Client {
    h: SocketHandle,
    got: Vec<u8>,
    eof: bool,
}

impl Client {
    fn new(d: &mut Drv) -> Client {
        let sa: SocketAddr = SERVER.parse().unwrap();
        let h = d.stack_mut().tcp_connect(None, sa).unwrap();
        Client {
            h,
            got: Vec::new(),
            eof: false,
        }
    }

    fn send(&self, st: &mut Stack, data: &[u8]) {
        assert_eq!(st.tcp_send(self.h, data).unwrap(), data.len());
    }

    /// Reads what is there.
    fn pull(&mut self, st: &mut Stack) {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match st.tcp_recv(self.h, &mut buf) {
                Ok(0) => {
                    self.eof = true;
                    return;
                }
                Ok(n) => self.got.extend_from_slice(&buf[..n]),
                Err(StackError::WouldBlock) => return,
                Err(e) => panic!("client recv: {e}"),
            }
        }
    }
}

fn exchange<S: Server>(d: &mut Drv, srv: &mut S, c: &mut Client, req: &[u8], want: &[u8]) {
    c.send(d.stack_mut(), req);
    c.got.clear();
    turn_until(d, srv, |st, _| {
        c.pull(st);
        c.got.len() >= want.len()
    });
    same(&c.got, want, "exchange");
}

/// Instantiates a generic test for both servers.
macro_rules! both {
    ($name:ident, $socket:ident, $zerocopy:ident) => {
        #[test]
        fn $socket() {
            $name::<SocketServer>();
        }
        #[test]
        fn $zerocopy() {
            $name::<ZcServer>();
        }
    };
}

both!(
    keep_alive_pipelining_head_close,
    keep_alive_pipelining_head_close_socket,
    keep_alive_pipelining_head_close_zerocopy
);
both!(
    reset_and_many_connections,
    reset_and_many_connections_socket,
    reset_and_many_connections_zerocopy
);
both!(
    a_batch_of_one_still_serves_everyone_in_order,
    a_batch_of_one_still_serves_everyone_in_order_socket,
    a_batch_of_one_still_serves_everyone_in_order_zerocopy
);

fn keep_alive_pipelining_head_close<S: Server>() {
    for len in [64usize, 4096, 65536] {
        let (mut d, mut srv) = setup::<S>(len);
        let mut c = Client::new(&mut d);
        let one = expected(len, false, false);
        for _ in 0..3 {
            exchange(&mut d, &mut srv, &mut c, GET, &one);
        }
        let want = [one.clone(), expected(len, false, true), one.clone()].concat();
        exchange(&mut d, &mut srv, &mut c, &[GET, HEAD, GET].concat(), &want);
        // Connection: close: the answers, then the server's FIN; what followed the
        // close request is not answered.
        c.send(d.stack_mut(), &[GET, GET_CLOSE, GET].concat());
        c.got.clear();
        turn_until(&mut d, &mut srv, |st, _| {
            c.pull(st);
            c.eof
        });
        same(
            &c.got,
            &[one.clone(), expected(len, true, false)].concat(),
            "close",
        );
        d.stack_mut().tcp_close(c.h).unwrap();
        turn_until(&mut d, &mut srv, |_, s| s.connections() == 0);
        let st = srv.stats();
        assert_eq!(srv.refused_slots(), 0);
        assert_eq!((st.requests, st.responses), (8, 8), "{st}");
        assert_eq!((st.accepted, st.closed, st.resets), (1, 1, 0), "{st}");
    }
}

fn reset_and_many_connections<S: Server>() {
    let (mut d, mut srv) = setup::<S>(151);
    let one = expected(151, false, false);
    // A client that resets with requests unanswered.
    let mut c = Client::new(&mut d);
    exchange(&mut d, &mut srv, &mut c, GET, &one);
    c.send(d.stack_mut(), &[GET; 20].concat());
    d.stack_mut().tcp_abort(c.h).unwrap();
    turn_until(&mut d, &mut srv, |_, s| s.connections() == 0);
    assert_eq!(srv.stats().closed, 1);
    // 100 connections, 5 requests each, served together.
    let mut cs: Vec<Client> = (0..100).map(|_| Client::new(&mut d)).collect();
    for round in 0..5 {
        for c in &mut cs {
            c.got.clear();
            c.send(d.stack_mut(), GET);
        }
        turn_until(&mut d, &mut srv, |st, _| {
            cs.iter_mut().all(|c| {
                c.pull(st);
                c.got.len() >= one.len()
            })
        });
        for c in &cs {
            same(&c.got, &one, &format!("round {round}"));
        }
    }
    for c in &cs {
        d.stack_mut().tcp_close(c.h).unwrap();
    }
    turn_until(&mut d, &mut srv, |_, s| s.connections() == 0);
    let st = srv.stats();
    assert_eq!(st.accepted, 101, "{st}");
    assert_eq!(st.bad_requests, 0, "{st}");
    assert_eq!(srv.refused_slots(), 0);
}

fn a_batch_of_one_still_serves_everyone_in_order<S: Server>() {
    // One ready socket per turn: the rest wait in the server's queue across turns.
    let (mut d, mut srv) = setup_batch::<S>(1000, 1);
    let one = expected(1000, false, false);
    let mut cs: Vec<Client> = (0..30).map(|_| Client::new(&mut d)).collect();
    for c in &mut cs {
        c.send(d.stack_mut(), &[GET, GET, GET].concat());
    }
    turn_until(&mut d, &mut srv, |st, _| {
        cs.iter_mut().all(|c| {
            c.pull(st);
            c.got.len() >= 3 * one.len()
        })
    });
    for c in &cs {
        same(
            &c.got,
            &[one.clone(), one.clone(), one.clone()].concat(),
            "batch 1",
        );
    }
    assert_eq!(srv.stats().responses, 90);
}
