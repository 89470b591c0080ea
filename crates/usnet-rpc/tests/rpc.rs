//! The rpc transport against a stack server in this process (in-memory link, local
//! delivery): a stream both ways with every byte checked, at several cluster
//! geometries, and errors carried as errno.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Once;

use usnet_rpc::{Clusters, Proxy, RpcClient};
use usnet_server::{ServerConfig, ServerHandle};
use usnet_stack::{mac_from_seed, StackConfig};

const ADDR: &str = "10.67.0.1";

fn server(name: &str) -> ServerHandle {
    static RUN_DIR: Once = Once::new();
    RUN_DIR.call_once(|| {
        let d = std::env::temp_dir().join(format!("usnet-rpc-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: called once, before any test thread reads the environment here.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
    });
    let stack = StackConfig {
        mac: mac_from_seed(11),
        addrs: vec![format!("{ADDR}/24").parse().unwrap()],
        mtu: 65535 - 28,
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: name.into(),
        link: "mem".into(),
        ..Default::default()
    };
    usnet_server::testing::in_memory(stack, cfg).unwrap()
}

fn sa(port: u16) -> SocketAddr {
    format!("{ADDR}:{port}").parse().unwrap()
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) % 251) as u8
}

#[test]
fn a_stream_crosses_at_every_geometry_with_every_byte_checked() {
    let _srv = server("rpc-stream");
    let _proxy = Proxy::start("rpc-stream", None).unwrap();
    for (i, (bytes, count)) in [(2048, 1), (2048, 16), (4096, 4), (65536, 2)]
        .into_iter()
        .enumerate()
    {
        let cl = Clusters { bytes, count };
        let port = 7100 + i as u16;
        let server = RpcClient::connect(Some("rpc-stream"), cl).unwrap();
        let l = server.tcp_listen(sa(port), 8).unwrap();
        let total = 3 << 20;
        let writer = std::thread::spawn(move || {
            let c = RpcClient::connect(Some("rpc-stream"), cl).unwrap();
            let s = c.tcp_connect(sa(port)).unwrap();
            let data: Vec<u8> = (0..total).map(pattern).collect();
            // Odd write sizes: copy requests split them at cluster boundaries.
            for part in data.chunks(10_007) {
                (&s).write_all(part).unwrap();
            }
            s.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let (s, peer) = l.accept().unwrap();
        assert_eq!(peer.ip().to_string(), ADDR);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            let n = (&s).read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.join().unwrap();
        assert_eq!(got.len(), total, "bytes at {cl:?}");
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == pattern(i)),
            "data at {cl:?}"
        );
    }
}

#[test]
fn errors_come_back_as_errno() {
    let _srv = server("rpc-errors");
    let _proxy = Proxy::start("rpc-errors", None).unwrap();
    let c = RpcClient::connect(Some("rpc-errors"), Clusters::default()).unwrap();
    let e = c
        .tcp_connect(sa(9))
        .err()
        .expect("nobody listens on port 9");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
    let _l = c.tcp_listen(sa(7200), 4).unwrap();
    let e = c.tcp_listen(sa(7200), 4).err().expect("address in use");
    assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE));
    // The connection still works after errors.
    let l2 = c.tcp_listen(sa(7201), 4).unwrap();
    drop(l2);
    assert!(RpcClient::connect(Some("no-such-stack"), Clusters::default()).is_err());
}
