//! `--api zerocopy` as a client process of a stack server (`run_client`): the same
//! server logic on a `usnet_client::ZcPort` whose rings and pool are shared memory,
//! against a stack server in this process; a copying client of the same server
//! checks every response byte (keep-alive, pipelining, HEAD, close) at three sizes.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use usnet_client::{Client, TcpStream};
use usnet_httpd::HttpdConfig;
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).expect("the whole answer");
    v
}

#[test]
fn the_zero_copy_server_answers_as_a_client_of_a_stack_server() {
    let dir = std::env::temp_dir().join(format!("usnet-httpd-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: set before any thread of this test binary reads the environment.
    unsafe { std::env::set_var("USNET_RUN_DIR", &dir) };
    let stack = StackConfig {
        mac: mac_from_seed(11),
        addrs: vec!["10.67.0.1/24".parse().unwrap()],
        mtu: 1500,
        pool: usnet_pool::PoolConfig {
            backing: usnet_pool::Backing::Memfd,
            count: 16384,
            ..Default::default()
        },
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: "httpd-zc".into(),
        link: "mem".into(),
        zero_copy: true,
        spin: Duration::from_micros(20),
        ..Default::default()
    };
    let srv = usnet_server::testing::in_memory(stack, cfg).unwrap();
    let in_use = || {
        srv.call(Duration::from_secs(5), |lp| lp.stack().pool().in_use())
            .unwrap()
    };
    let baseline = in_use();
    for len in [64usize, 4096, 65536] {
        let stop = Arc::new(AtomicBool::new(false));
        let port = 8000 + (len % 1000) as u16;
        let httpd = {
            let stop = stop.clone();
            let cfg = HttpdConfig {
                port,
                length: len,
                ..Default::default()
            };
            std::thread::spawn(move || usnet_httpd::zerocopy::run_client("httpd-zc", &cfg, &stop))
        };
        let c = Client::attach("httpd-zc").unwrap();
        let to: SocketAddr = format!("10.67.0.1:{port}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut s = loop {
            match TcpStream::connect(&c, to) {
                Ok(s) => break s,
                // The server thread may not listen yet.
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let one = expected(len, false, false);
        for _ in 0..3 {
            s.write_all(GET).unwrap();
            same(&read_n(&mut s, one.len()), &one, "keep-alive");
        }
        let want = [one.clone(), expected(len, false, true), one.clone()].concat();
        s.write_all(&[GET, HEAD, GET].concat()).unwrap();
        same(&read_n(&mut s, want.len()), &want, "pipelined");
        s.write_all(&[GET, GET_CLOSE, GET].concat()).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        same(
            &rest,
            &[one.clone(), expected(len, true, false)].concat(),
            "close",
        );
        drop(s);
        stop.store(true, Ordering::Relaxed);
        let st = httpd.join().unwrap().unwrap();
        assert_eq!((st.requests, st.responses), (8, 8), "{st}");
        assert_eq!((st.accepted, st.bad_requests), (1, 0), "{st}");
    }
    // Every buffer is back once the ports are closed and the connections done.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = in_use();
        if n <= baseline {
            break;
        }
        assert!(Instant::now() < deadline, "{n} pool buffers in use");
        std::thread::sleep(Duration::from_millis(20));
    }
}
