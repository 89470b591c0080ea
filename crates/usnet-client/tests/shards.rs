//! Clients of a stack server of two shards (`usnet up --shards 2`), in this process on
//! memory links: fresh clients are spread over the shards; a TCP port has one
//! listener host-wide (a second client's listen on it fails as in one stack, and
//! succeeds once the first listener closes); and a client on one shard connects to a
//! listener on the other (local delivery, then the port's redirect), whichever shard
//! each connection's flow belongs to. A client that asks for a shard gets it. A
//! SO_REUSEPORT group may span the shards.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use usnet_client::{Client, TcpListener, TcpStream};
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Polls `f` until it gives `Some`, for at most 10 s.
fn within<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn two_shards_spread_clients_share_ports_and_connect_across() {
    common::run_dir();
    let stack = StackConfig {
        mac: mac_from_seed(11),
        addrs: vec![format!("{}/24", common::ADDR).parse().unwrap()],
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: "shards2".into(),
        link: "mem".into(),
        spin: Duration::from_micros(20),
        ..Default::default()
    };
    let srv = usnet_server::testing::in_memory_shards(stack, cfg, 2).unwrap();
    assert_eq!(srv.shards(), 2);
    let a = Client::attach("shards2").unwrap();
    let b = Client::attach("shards2").unwrap();
    let per_shard: Vec<usize> = (0..2)
        .map(|k| {
            srv.call_on(k, Duration::from_secs(5), |lp| lp.clients().len())
                .unwrap()
        })
        .collect();
    assert_eq!(per_shard, [1, 1], "one client on each shard");
    // A client may ask for its shard (`usnet run --shard K`).
    let asked = usnet_client::Client::attach_with(
        Some("shards2"),
        &usnet_client::AttachOptions {
            shard: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    let on_1 = srv
        .call_on(1, Duration::from_secs(5), |lp| lp.clients().len())
        .unwrap();
    assert_eq!(on_1, 2, "shard 3 of 2 is shard 1");
    drop(asked);

    let l = TcpListener::bind(&a, sa("10.66.0.1:9000")).unwrap();
    // One listener per port host-wide: the other shard's client is refused (once
    // the first shard has told the host, which it does in the pass that listened).
    let e = within("the second listen refused", || {
        TcpListener::bind(&b, sa("10.66.0.1:9000")).err()
    });
    assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
    // A wildcard overlaps it too; another port does not.
    let e = match TcpListener::bind(&b, sa("0.0.0.0:9000")) {
        Err(e) => e,
        Ok(_) => panic!("a wildcard listen on the port was taken"),
    };
    assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
    let other = TcpListener::bind(&b, sa("10.66.0.1:9001")).unwrap();
    drop(other);

    // Client b (the other shard) connects to a's listener 16 times: the flows
    // belong to either shard by their ports; each goes to the listener's.
    l.set_nonblocking(true).unwrap();
    for i in 0..16u32 {
        let s = TcpStream::connect_timeout(&b, sa("10.66.0.1:9000"), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (c, _) = within("accept", || match l.accept() {
            Ok(x) => Some(x),
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => panic!("accept {i}: {e}"),
        });
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let msg = format!("hello {i} across the shards");
        (&s).write_all(msg.as_bytes()).unwrap();
        let mut got = vec![0u8; msg.len()];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(got, msg.as_bytes());
        (&c).write_all(&got).unwrap();
        let mut back = vec![0u8; msg.len()];
        (&s).read_exact(&mut back).unwrap();
        assert_eq!(back, msg.as_bytes());
    }
    let redirected: u64 = (0..2)
        .map(|k| {
            srv.call_on(k, Duration::from_secs(5), |lp| {
                lp.stack().counters().shard_redirected
            })
            .unwrap()
        })
        .sum();
    assert!(redirected > 0, "no flow needed a redirect");

    // Closed, the port is free for the other shard's client.
    drop(l);
    within("the listen after the close", || {
        TcpListener::bind(&b, sa("10.66.0.1:9000")).ok()
    });
}

/// A SO_REUSEPORT group whose members live on two shards (two worker
/// processes' listeners on one port): both listens pass the host-wide check,
/// and the connections of a third client spread over both members, each
/// complete.
#[test]
fn a_reuseport_group_spans_the_shards() {
    common::run_dir();
    let stack = StackConfig {
        mac: mac_from_seed(12),
        addrs: vec![format!("{}/24", common::ADDR).parse().unwrap()],
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: "shards-reuseport".into(),
        link: "mem".into(),
        spin: Duration::from_micros(20),
        ..Default::default()
    };
    let _srv = usnet_server::testing::in_memory_shards(stack, cfg, 2).unwrap();
    let workers = [
        Client::attach("shards-reuseport").unwrap(),
        Client::attach("shards-reuseport").unwrap(),
    ];
    let listen = |c: &Client, reuseport: bool| {
        let s = usnet_client::Socket::new(c, usnet_client::SocketKind::Tcp)?;
        s.bind_reuse(sa("10.66.0.1:9100"), 0, reuseport, reuseport)?;
        s.listen(64)
    };
    let first = listen(&workers[0], true).unwrap();
    // Once the first shard has told the host: refused without the option,
    // taken with it.
    let e = within("a listener without the option refused", || {
        listen(&workers[1], false).err()
    });
    assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
    let second = listen(&workers[1], true).unwrap();
    let members = [first, second];
    for l in &members {
        l.set_nonblocking(true).unwrap();
    }
    let client = Client::attach("shards-reuseport").unwrap();
    let mut took = [0usize; 2];
    for i in 0..24u32 {
        let s = TcpStream::connect_timeout(&client, sa("10.66.0.1:9100"), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
        let (k, c) = within("accept by a member", || {
            members
                .iter()
                .enumerate()
                .find_map(|(k, l)| match l.accept() {
                    Ok((c, _)) => Some((k, c)),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => None,
                    Err(e) => panic!("accept {i}: {e}"),
                })
        });
        took[k] += 1;
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (&s).write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }
    assert!(
        took[0] > 0 && took[1] > 0,
        "both members took some: {took:?}"
    );
}
