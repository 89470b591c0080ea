//! TCP conversations between whole stacks on the simulated wire (`SimNet`), in
//! virtual time: handshakes over IPv4 and IPv6, bulk transfers under loss,
//! reordering, duplication and corruption with every byte checked, refused
//! connections, many connections at once, listener backlog, TIME-WAIT, and
//! connect/close cycles that must leave the pool and the socket table as they were.
//!
//! The big ones are `#[ignore]`d; CI runs them in release:
//! `cargo test --release -p usnet-stack --test tcp -- --ignored`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::{cfg, fill, sa, transfer_by, transfer_with};
use usnet_shm::{ByteConsumer, ByteLoan, ByteProducer, ByteRingAt, KeptLoan, Region};
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{Families, Lender, LentBytes, Owner, SocketHandle, StackError, TcpState};

fn pair(seed: u64, faults: Faults) -> SimNet {
    let mut net = SimNet::new(seed, faults);
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    net
}

/// `common::transfer_with` without a hook.
fn transfer(net: &mut SimNet, server: SocketAddr, total: u64, limit: Duration) -> Duration {
    transfer_with(net, server, total, limit, |_| {})
}

/// After everything closed (and TIME-WAIT passed), nothing is left behind.
fn assert_clean(net: &mut SimNet, baseline: &[(usize, u32)]) {
    net.run_for(Duration::from_secs(61));
    for (i, &(socks, bufs)) in baseline.iter().enumerate() {
        let s = net.stack(i);
        assert!(
            s.tcp_connections().is_empty(),
            "stack {i}: {:?}",
            s.tcp_connections()
        );
        assert_eq!(s.socket_count().0, socks, "stack {i}: sockets left");
        assert_eq!(s.pool().in_use(), bufs, "stack {i}: pool buffers left");
    }
}

fn baseline(net: &SimNet) -> Vec<(usize, u32)> {
    (0..2)
        .map(|i| (net.stack(i).socket_count().0, net.stack(i).pool().in_use()))
        .collect()
}

#[test]
fn handshake_data_and_close_v4_and_v6() {
    for (k, server) in ["10.0.0.2:80", "[fd00::2]:80"].into_iter().enumerate() {
        let mut net = pair(10 + k as u64, Faults::default());
        let base = baseline(&net);
        let server = sa(server);
        let l = net.stack_mut(1).tcp_listen(sa("[::]:80"), 8).unwrap();
        let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
        assert_eq!(net.stack(0).tcp_state(c).unwrap(), TcpState::SynSent);
        assert!(net.run_until(Duration::from_secs(2), |n| n
            .stack(1)
            .readiness(l)
            .unwrap()
            .readable));
        assert!(net.stack(0).readiness(c).unwrap().connected);
        let s = net.stack_mut(1).tcp_accept(l).unwrap();
        assert!(!net.stack(1).readiness(l).unwrap().readable);
        assert_eq!(net.stack(1).tcp_state(s).unwrap(), TcpState::Established);
        assert_eq!(net.stack(1).tcp_local_addr(s).unwrap(), server);
        assert_eq!(
            net.stack(1).tcp_peer_addr(s).unwrap(),
            net.stack(0).tcp_local_addr(c).unwrap()
        );
        let info = net.stack(0).tcp_info(c).unwrap();
        assert!(info.sack && info.timestamps && info.wscale.is_some());
        let mss = if server.is_ipv4() {
            1460 - 12
        } else {
            1440 - 12
        };
        assert_eq!(info.snd_mss, mss);
        // Both ways.
        assert_eq!(net.stack_mut(0).tcp_send(c, b"hello").unwrap(), 5);
        let mut buf = [0u8; 64];
        assert!(net.run_until(Duration::from_secs(1), |n| n
            .stack(1)
            .readiness(s)
            .unwrap()
            .readable));
        assert_eq!(net.stack_mut(1).tcp_recv(s, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(
            net.stack_mut(1).tcp_recv(s, &mut buf),
            Err(StackError::WouldBlock)
        );
        net.stack_mut(1).tcp_send(s, b"world!").unwrap();
        assert!(net.run_until(Duration::from_secs(1), |n| n
            .stack_mut(0)
            .tcp_recv_available(c)
            .unwrap()
            == 6));
        assert_eq!(net.stack_mut(0).tcp_recv(c, &mut buf).unwrap(), 6);
        // Orderly close: client first (it gets TIME-WAIT).
        net.stack_mut(0).tcp_close(c).unwrap();
        assert!(net.run_until(Duration::from_secs(1), |n| n
            .stack_mut(1)
            .tcp_recv(s, &mut buf)
            == Ok(0)));
        assert_eq!(net.stack(1).tcp_state(s).unwrap(), TcpState::CloseWait);
        net.stack_mut(1).tcp_close(s).unwrap();
        net.run_for(Duration::from_millis(100));
        let conns = net.stack(0).tcp_connections();
        assert_eq!(conns.len(), 1);
        assert_eq!(conns[0].info.state, TcpState::TimeWait);
        assert!(conns[0].orphan);
        assert!(net.stack(1).tcp_connections().is_empty(), "LAST-ACK done");
        // Stale handles are refused.
        assert_eq!(
            net.stack_mut(0).tcp_send(c, b"x"),
            Err(StackError::InvalidHandle)
        );
        net.stack_mut(1).tcp_close(l).unwrap();
        assert_clean(&mut net, &base);
        let c0 = net.stack(0).counters_snapshot();
        assert_eq!(c0.tcp_active_opens, 1);
        assert_eq!(c0.tcp_time_wait_entered, 1);
        assert_eq!(c0.tcp_conns_reaped, 1);
        assert_eq!(net.stack(1).counters().tcp_passive_opens, 1);
        assert_eq!(c0.tcp_rx_bad_checksum, 0);
    }
}

/// Linux's dual-stack listeners (`Families`): a `[::]` listener that takes both
/// families accepts an IPv4 SYN (the connection is plain IPv4 in the stack); one
/// with IPV6_V6ONLY refuses it (RST) and still takes IPv6; `0.0.0.0` for IPv4 may
/// then share its port, and a dual `[::]` clashes with `0.0.0.0` on one port.
#[test]
fn a_dual_stack_listener_takes_ipv4_and_a_v6only_one_refuses_it() {
    use usnet_stack::Families;
    let mut net = pair(31, Faults::default());
    let tcfg = net.stack(1).tcp_config().clone();
    let dual = net
        .stack_mut(1)
        .tcp_listen_families(sa("[::]:90"), 8, tcfg.clone(), Families::Both)
        .unwrap();
    let v6only = net
        .stack_mut(1)
        .tcp_listen_families(sa("[::]:91"), 8, tcfg.clone(), Families::V6)
        .unwrap();
    assert_eq!(
        net.stack_mut(1)
            .tcp_listen_families(sa("0.0.0.0:90"), 8, tcfg.clone(), Families::V4),
        Err(StackError::AddrInUse),
        "a dual [::] holds the IPv4 wildcard too"
    );

    // IPv4 to the dual listener: accepted, an IPv4 connection.
    let c = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:90"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(1)
        .readiness(dual)
        .unwrap()
        .readable));
    let s = net.stack_mut(1).tcp_accept(dual).unwrap();
    assert_eq!(net.stack(1).tcp_local_addr(s).unwrap(), sa("10.0.0.2:90"));
    assert_eq!(
        net.stack(1).tcp_peer_addr(s).unwrap(),
        net.stack(0).tcp_local_addr(c).unwrap()
    );
    assert!(net.stack(0).readiness(c).unwrap().connected);

    // IPv4 to the V6-only listener: refused.
    let r = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:91"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(0)
        .readiness(r)
        .unwrap()
        .closed));
    let mut buf = [0u8; 4];
    assert_eq!(
        net.stack_mut(0).tcp_recv(r, &mut buf),
        Err(StackError::ConnectionRefused)
    );
    assert!(!net.stack(1).readiness(v6only).unwrap().readable);

    // IPv6 to it: accepted.
    let c6 = net
        .stack_mut(0)
        .tcp_connect(None, sa("[fd00::2]:91"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(1)
        .readiness(v6only)
        .unwrap()
        .readable));
    assert!(net.stack_mut(1).tcp_accept(v6only).is_ok());
    assert!(net.stack(0).readiness(c6).unwrap().connected);

    // 0.0.0.0:91 for IPv4 beside the V6-only [::]:91, as Linux allows; IPv4 goes
    // to it.
    let v4 = net
        .stack_mut(1)
        .tcp_listen_families(sa("0.0.0.0:91"), 8, tcfg, Families::V4)
        .unwrap();
    let c4 = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:91"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(1)
        .readiness(v4)
        .unwrap()
        .readable));
    assert!(net.stack_mut(1).tcp_accept(v4).is_ok());
    assert!(net.stack(0).readiness(c4).unwrap().connected);
    assert!(!net.stack(1).readiness(v6only).unwrap().readable);

    // The other way round (the V6-only wildcard listening last): the demux still
    // takes the wildcard of the SYN's family.
    let tcfg = net.stack(1).tcp_config().clone();
    let v4b = net
        .stack_mut(1)
        .tcp_listen_families(sa("0.0.0.0:92"), 8, tcfg.clone(), Families::V4)
        .unwrap();
    net.stack_mut(1)
        .tcp_listen_families(sa("[::]:92"), 8, tcfg, Families::V6)
        .unwrap();
    let c4b = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:92"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(1)
        .readiness(v4b)
        .unwrap()
        .readable));
    assert!(net.stack(0).readiness(c4b).unwrap().connected);
}

#[test]
fn refused_connect_gets_rst_and_rst_gets_nothing() {
    let mut net = pair(3, Faults::default());
    let c = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:81"))
        .unwrap();
    let mut buf = [0u8; 8];
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(0)
        .readiness(c)
        .unwrap()
        .closed));
    assert_eq!(
        net.stack_mut(0).tcp_recv(c, &mut buf),
        Err(StackError::ConnectionRefused)
    );
    // The error is reported once (as Linux's sk_err): then the socket is just closed.
    assert_eq!(
        net.stack_mut(0).tcp_send(c, b"x"),
        Err(StackError::BrokenPipe)
    );
    assert_eq!(net.stack_mut(0).tcp_recv(c, &mut buf), Ok(0));
    assert_eq!(
        StackError::ConnectionRefused.errno(),
        usnet_socket_api::errno::ECONNREFUSED
    );
    let c1 = net.stack(1).counters();
    assert_eq!(c1.tcp_rx_no_socket, 1);
    assert_eq!(c1.tcp_tx_reset_no_socket, 1);
    // The RST itself was not answered.
    assert_eq!(net.stack(0).counters().tcp_tx_reset_no_socket, 0);
    net.stack_mut(0).tcp_close(c).unwrap();
    assert_eq!(net.stack(0).socket_count().0, 0);
    // Connecting to nowhere.
    assert_eq!(
        net.stack_mut(0).tcp_connect(None, sa("192.168.9.9:80")),
        Err(StackError::NoRoute)
    );
    // A port with a socket bound to it that does not listen is a closed port
    // (RFC 9293 §3.10.7.1): the SYN gets a RST, as Linux answers.
    net.stack_mut(1)
        .tcp_bind(
            sa("0.0.0.0:82"),
            Families::Both,
            (false, false),
            Owner::LOCAL,
        )
        .unwrap();
    let c2 = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:82"))
        .unwrap();
    assert!(net.run_until(Duration::from_secs(2), |n| n
        .stack(0)
        .readiness(c2)
        .unwrap()
        .closed));
    assert_eq!(
        net.stack_mut(0).tcp_recv(c2, &mut buf),
        Err(StackError::ConnectionRefused)
    );
    assert_eq!(net.stack(1).counters().tcp_tx_reset_no_socket, 2);
    // Port in use.
    let l = net.stack_mut(1).tcp_listen(sa("0.0.0.0:80"), 1).unwrap();
    assert_eq!(
        net.stack_mut(1).tcp_listen(sa("10.0.0.2:80"), 1),
        Err(StackError::AddrInUse)
    );
    assert_eq!(net.stack_mut(1).tcp_accept(l), Err(StackError::WouldBlock));
    // A second connection with the same four numbers: EADDRNOTAVAIL, as Linux's
    // connect says (`__inet_check_established`).
    let from = Some(sa("10.0.0.1:4000"));
    net.stack_mut(0)
        .tcp_connect(from, sa("10.0.0.2:80"))
        .unwrap();
    assert_eq!(
        net.stack_mut(0).tcp_connect(from, sa("10.0.0.2:80")),
        Err(StackError::AddrNotAvailable)
    );
}

#[test]
fn bulk_clean_4mib_v4() {
    let mut net = pair(20, Faults::default());
    let base = baseline(&net);
    let t = transfer(
        &mut net,
        sa("10.0.0.2:5001"),
        4 << 20,
        Duration::from_secs(30),
    );
    eprintln!("4 MiB clean in {t:?} virtual");
    assert_clean(&mut net, &base);
}

fn lossy(loss: f64, seed: u64, server: &str, total: u64) {
    let faults = Faults {
        loss,
        ..Faults::default()
    };
    let mut net = pair(seed, faults);
    let base = baseline(&net);
    transfer(&mut net, sa(server), total, Duration::from_secs(600));
    let c = net.stack(0).counters_snapshot();
    eprintln!(
        "loss {loss}: retransmits {} rto {} fast {} wire {:?}",
        c.tcp_retransmit_segments, c.tcp_rto_expired, c.tcp_fast_recoveries, net.stats
    );
    if loss > 0.0 {
        assert!(c.tcp_retransmit_segments > 0);
    }
    assert_clean(&mut net, &base);
}

#[test]
fn bulk_1pct_loss_v4() {
    lossy(0.01, 21, "10.0.0.2:5001", 3 << 20);
}

#[test]
fn bulk_5pct_loss_v6() {
    lossy(0.05, 22, "[fd00::2]:5001", 2 << 20);
}

#[test]
fn bulk_10pct_loss_v4() {
    lossy(0.10, 23, "10.0.0.2:5001", 1 << 20);
}

#[test]
fn bulk_reorder_duplicate_corrupt() {
    for (seed, server) in [(24, "10.0.0.2:5001"), (25, "[fd00::2]:5001")] {
        let faults = Faults {
            loss: 0.01,
            duplicate: 0.02,
            corrupt: 0.02,
            reorder: 0.05,
            reorder_window: Duration::from_millis(2),
            ..Faults::default()
        };
        let mut net = pair(seed, faults);
        let base = baseline(&net);
        transfer(&mut net, sa(server), 2 << 20, Duration::from_secs(600));
        assert!(net.stats.corrupted > 0 && net.stats.duplicated > 0);
        let bad = net.stack(0).counters().tcp_rx_bad_checksum
            + net.stack(1).counters().tcp_rx_bad_checksum;
        assert!(bad > 0, "corruption was caught by the checksum");
        assert_clean(&mut net, &base);
    }
}

/// 128 MiB at 1 % loss with reordering; in release (`cargo test --release -p
/// usnet-stack --test tcp -- --ignored`).
#[test]
#[ignore]
fn bulk_128mib_lossy_release() {
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.005,
        corrupt: 0.001,
        reorder: 0.01,
        ..Faults::default()
    };
    let mut net = pair(26, faults);
    let base = baseline(&net);
    let t = transfer(
        &mut net,
        sa("10.0.0.2:5001"),
        128 << 20,
        Duration::from_secs(3600),
    );
    eprintln!("128 MiB in {t:?} virtual; wire {:?}", net.stats);
    assert_clean(&mut net, &base);
}

/// `n` clients on stack 0 each send `per` bytes to an echo-less sink on stack 1 and
/// close; stack 1 closes after EOF.
fn many(n: usize, per: usize, backlog: usize, accept_late: bool) {
    let mut net = pair(30, Faults::default());
    for i in 0..2 {
        let t = net.stack_mut(i).tcp_config_mut();
        t.send_buffer = 16 << 10;
        t.recv_buffer = 16 << 10;
        t.recv_buffer_initial = 16 << 10;
    }
    let base = baseline(&net);
    let l = net
        .stack_mut(1)
        .tcp_listen(sa("0.0.0.0:7000"), backlog)
        .unwrap();
    let clients: Vec<SocketHandle> = (0..n)
        .map(|_| {
            net.stack_mut(0)
                .tcp_connect(None, sa("10.0.0.2:7000"))
                .unwrap()
        })
        .collect();
    if accept_late {
        // Nobody accepts for a while: the backlog fills and the rest wait (their
        // handshakes are retried), then everything completes once accepted.
        net.run_for(Duration::from_millis(500));
        let ls = net.stack(1).tcp_listeners();
        assert_eq!(ls[0].accept_queue, backlog);
        assert!(net.stack(1).counters_snapshot().tcp_listen_accept_overflow > 0);
    }
    let mut data = vec![0u8; per];
    let mut sent = vec![0usize; n];
    let mut closed = vec![false; n];
    let mut servers: Vec<(SocketHandle, usize, bool)> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let ok = net.run_until(Duration::from_secs(120), |net| {
        let s0 = net.stack_mut(0);
        for (i, &c) in clients.iter().enumerate() {
            if closed[i] || !s0.readiness(c).unwrap().connected {
                continue;
            }
            while sent[i] < per {
                fill(&mut data[..per - sent[i]], (i * per + sent[i]) as u64);
                match s0.tcp_send(c, &data[..per - sent[i]]) {
                    Ok(k) => sent[i] += k,
                    Err(StackError::WouldBlock) => break,
                    Err(e) => panic!("client {i}: {e:?}"),
                }
            }
            if sent[i] == per {
                s0.tcp_close(c).unwrap();
                closed[i] = true;
            }
        }
        let s1 = net.stack_mut(1);
        while let Ok(h) = s1.tcp_accept(l) {
            servers.push((h, 0, false));
        }
        for (h, got, done) in servers.iter_mut() {
            while !*done {
                match s1.tcp_recv(*h, &mut buf) {
                    Ok(0) => {
                        assert_eq!(*got, per);
                        s1.tcp_close(*h).unwrap();
                        *done = true;
                    }
                    Ok(k) => *got += k,
                    Err(StackError::WouldBlock) => break,
                    Err(e) => panic!("server: {e:?}"),
                }
            }
        }
        servers.len() == n && servers.iter().all(|s| s.2) && closed.iter().all(|c| *c)
    });
    assert!(
        ok,
        "accepted {} of {n}, done {}",
        servers.len(),
        servers.iter().filter(|s| s.2).count()
    );
    net.stack_mut(1).tcp_close(l).unwrap();
    assert_clean(&mut net, &base);
    let c0 = net.stack(0).counters_snapshot();
    assert_eq!(c0.tcp_active_opens, n as u64);
    assert_eq!(c0.tcp_conns_reaped, n as u64);
    assert_eq!(net.stack(1).counters().tcp_passive_opens, n as u64);
}

#[test]
fn a_thousand_concurrent_connections() {
    many(1000, 3000, 1024, false);
}

#[test]
fn listener_backlog_holds_completed_handshakes_until_accepted() {
    many(40, 100, 8, true);
}

/// Connect, exchange a little, close; `n` times in a row. The server closes first
/// half of the time, so TIME-WAIT sits on both sides and old 4-tuples are reused
/// (RFC 6191). Afterwards the pool and the socket table are back to where they began.
fn cycles(n: usize) {
    let mut net = pair(40, Faults::default());
    for i in 0..2 {
        let t = net.stack_mut(i).tcp_config_mut();
        t.send_buffer = 4 << 10;
        t.recv_buffer = 4 << 10;
        t.recv_buffer_initial = 4 << 10;
    }
    let base = baseline(&net);
    let l = net.stack_mut(1).tcp_listen(sa("0.0.0.0:9000"), 64).unwrap();
    let base_slots = net.stack(0).socket_count().1;
    let mut buf = [0u8; 64];
    for i in 0..n {
        let c = net
            .stack_mut(0)
            .tcp_connect(None, sa("10.0.0.2:9000"))
            .unwrap();
        let mut s = None;
        assert!(net.run_until(Duration::from_secs(5), |net| {
            if s.is_none() {
                s = net.stack_mut(1).tcp_accept(l).ok();
            }
            s.is_some() && net.stack(0).readiness(c).unwrap().connected
        }));
        let s = s.unwrap();
        net.stack_mut(0).tcp_send(c, b"ping").unwrap();
        assert!(net.run_until(Duration::from_secs(5), |net| net
            .stack_mut(1)
            .tcp_recv(s, &mut buf)
            == Ok(4)));
        let (first, second, fh, sh) = if i % 2 == 0 {
            (0, 1, c, s)
        } else {
            (1, 0, s, c)
        };
        net.stack_mut(first).tcp_close(fh).unwrap();
        assert!(net.run_until(Duration::from_secs(5), |net| net
            .stack_mut(second)
            .tcp_recv(sh, &mut buf)
            == Ok(0)));
        net.stack_mut(second).tcp_close(sh).unwrap();
    }
    net.stack_mut(1).tcp_close(l).unwrap();
    assert_clean(&mut net, &base);
    // The slot table grew only to the TIME-WAIT population, not with every cycle.
    let slots = net.stack(0).socket_count().1;
    assert!(slots <= base_slots + 20_000, "{slots} slots");
    eprintln!(
        "{n} cycles: slots {slots}, reused TIME-WAIT {} / {}",
        net.stack(0).counters().tcp_time_wait_reused,
        net.stack(1).counters().tcp_time_wait_reused
    );
}

#[test]
fn connect_close_cycles() {
    cycles(2000);
}

/// 100,000 connect/close cycles (`--release -- --ignored`).
#[test]
#[ignore]
fn connect_close_100k_cycles_release() {
    cycles(100_000);
}

/// TSO: the sender joins consecutive segments into GSO frames built as chains of
/// 2 KiB pool buffers; the simulated NIC cuts them into wire segments (checksums
/// finished there), which then meet loss, reordering, duplication and corruption.
#[test]
fn bulk_with_tso_frames_in_buffer_chains() {
    // (seed, server, faults, least segments per frame: in loss recovery segments
    // leave one per ACK, so fewer join)
    for (seed, server, faults, ratio) in [
        (40, "10.0.0.2:5001", Faults::default(), 4),
        (
            41,
            "[fd00::2]:5001",
            Faults {
                loss: 0.01,
                duplicate: 0.01,
                corrupt: 0.01,
                reorder: 0.03,
                reorder_window: Duration::from_millis(1),
                ..Faults::default()
            },
            1,
        ),
    ] {
        let mut net = SimNet::new(seed, faults);
        for i in 1..=2 {
            let mut c = cfg(i);
            c.tso = true;
            c.tx_csum_offload = true;
            assert_eq!(c.pool.buf_size, 2048);
            net.add(c).unwrap();
        }
        let base = baseline(&net);
        transfer(&mut net, sa(server), 8 << 20, Duration::from_secs(600));
        let c = net.stack(0).counters_snapshot();
        eprintln!(
            "tso seed {seed}: {} segments in {} frames, {} retransmitted, wire {:?}",
            c.tcp_tx_segments, c.link_tx_frames, c.tcp_retransmit_segments, net.stats
        );
        assert!(
            c.tcp_tx_segments > ratio * c.link_tx_frames + c.link_tx_frames / 2,
            "{} segments in {} frames: few GSO frames",
            c.tcp_tx_segments,
            c.link_tx_frames
        );
        assert_clean(&mut net, &base);
    }
}

/// Runs of full segments (`TcpConfig::send_runs`) go into GSO frames a frame's
/// worth per append (`Core::send_tcp_gso_run`; from pool-backed, zero-copy,
/// queues with their pieces attached a frame's worth at a time,
/// `Core::send_tcp_gso_span_run`), or one segment at a time without TSO: the
/// frames on the wire are the same as when each segment is emitted on its own,
/// through loss, duplication and reordering, over IPv4 and IPv6.
#[test]
fn send_runs_build_the_same_frames() {
    let lossy = lossy_gso_path();
    for (k, (server, tso, zero_copy)) in [
        ("10.0.0.2:5006", true, false),
        ("[fd00::2]:5006", true, false),
        ("10.0.0.2:5006", false, false),
        ("[fd00::2]:5006", true, true),
        ("10.0.0.2:5006", true, true),
    ]
    .into_iter()
    .enumerate()
    {
        let [on, off] = [true, false].map(|runs| {
            let mut net = offload_pair(61 + k as u64, lossy, tso, |t| {
                t.send_runs = runs;
                t.zero_copy = zero_copy;
            });
            let base = baseline(&net);
            transfer(&mut net, sa(server), 4 << 20, Duration::from_secs(600));
            let tcp = net.stack(0).tcp_stats();
            assert_clean(&mut net, &base);
            (net.stats, tcp.tx_run_segments, tcp.tx_data_segments)
        });
        eprintln!(
            "{server} tso {tso} zero-copy {zero_copy}: {} of {} segments sent in runs, {} frames",
            on.1, on.2, on.0.sent
        );
        assert!(on.1 * 4 > on.2, "{} of {} segments in runs", on.1, on.2);
        assert_eq!(off.1, 0);
        assert_eq!(
            on.0, off.0,
            "{server} tso {tso} zero-copy {zero_copy}: the wire differs"
        );
    }
}

/// A stack server client's send ring as its connection reads it in place.
#[derive(Debug)]
struct RingLoan(ByteLoan);

impl LentBytes for RingLoan {
    fn slices(&self, pos: u64, n: usize) -> (&[u8], &[u8]) {
        self.0.slices(pos, n)
    }
}

/// A bulk transfer of `total` bytes to `server` whose sender writes into a
/// shared ring of 256 KiB that is its connection's send buffer, as a stack
/// server does for its clients (acknowledged bytes go back to the writer, which
/// writes over them). `by_reference`: the stack also gets the ring as a
/// [`Lender`], so GSO frames carry its bytes where they lie. Once the connection
/// took `unlend_at` bytes in place, it gives the ring back in the middle of the
/// stream, as a stack server does when the ring binds, and the writer at once
/// writes over all of it (frames just built from it have not left yet); the rest
/// is copied in. `when_bound`: it also gives the ring back where a stack server
/// would, when the ring is full and binds (`Stack::tcp_lent_ring_binds`). Returns
/// the ring as that lender (the count of its references tells who still holds
/// it).
fn lent_transfer(
    net: &mut SimNet,
    server: SocketAddr,
    total: u64,
    by_reference: bool,
    unlend_at: u64,
    when_bound: bool,
) -> Arc<dyn Lender> {
    const SIZE: usize = 256 << 10;
    let at = ByteRingAt {
        prod: 0,
        cons: 64,
        data: 4096,
        size: SIZE,
    };
    let region = Arc::new(Region::create_memfd(c"lent-ring", 4096 + SIZE, true).unwrap());
    at.reset(&region).unwrap();
    let mut prod = ByteProducer::attach(region.clone(), at).unwrap();
    let mut cons = ByteConsumer::attach(region, at).unwrap();
    let lender: Arc<dyn Lender> = Arc::new(KeptLoan::new(cons.loan()));
    let (mut written, mut in_place) = (0u64, 0u64);
    let (mut lent, mut given_back) = (false, false);
    let mut chunk = vec![0u8; 16 << 10];
    // The writer: the pattern into the ring, as far as it has room.
    let mut write = move |prod: &mut ByteProducer| {
        let want = (total - written).min(chunk.len() as u64) as usize;
        let room = want.min(prod.free().unwrap());
        fill(&mut chunk[..room], written);
        written += prod.push(&chunk[..room]) as u64;
        prod.publish();
    };
    transfer_by(
        net,
        server,
        total,
        Duration::from_secs(600),
        |_| {},
        |s, c, _sent| {
            if !lent && !given_back {
                if !s.readiness(c).unwrap().connected {
                    return 0;
                }
                let by_ref = by_reference.then(|| lender.clone());
                let src = Box::new(RingLoan(cons.loan()));
                assert!(s
                    .tcp_lend_send_buffer(c, src, by_ref, cons.position(), SIZE)
                    .unwrap());
                lent = true;
            }
            if let Some(head) = s.tcp_lent_head(c) {
                cons.release_to(head);
            }
            write(&mut prod);
            let ready = cons.available().unwrap();
            let took = if lent {
                s.tcp_send_lent(c, ready)
            } else {
                s.tcp_send_with(c, ready, |dst| cons.read(dst))
            };
            let k = match took {
                Ok(k) => k,
                Err(StackError::WouldBlock) => 0,
                Err(e) => panic!("send: {e:?}"),
            };
            if !lent {
                cons.release();
                return k;
            }
            cons.skip(k);
            in_place += k as u64;
            let bound =
                when_bound && cons.unreleased() as usize >= SIZE && s.tcp_lent_ring_binds(c);
            if in_place >= unlend_at || bound {
                assert!(s.tcp_unlend_send_buffer(c));
                (lent, given_back) = (false, true);
                cons.release();
                write(&mut prod);
            }
            k
        },
    );
    lender
}

#[test]
fn a_lent_ring_rides_gso_frames_by_reference() {
    let lossy = lossy_gso_path();
    for (k, (server, faults, unlend_at)) in [
        ("10.0.0.2:5007", Faults::default(), u64::MAX),
        ("[fd00::2]:5007", lossy, u64::MAX),
        ("10.0.0.2:5007", lossy, u64::MAX),
        ("10.0.0.2:5007", Faults::default(), 1 << 20),
        ("[fd00::2]:5007", lossy, 1 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        let [by_ref, copied] = [true, false].map(|by_reference| {
            let mut net = offload_pair(71 + k as u64, faults, true, |_| {});
            let base = baseline(&net);
            let ring = lent_transfer(
                &mut net,
                sa(server),
                3 << 20,
                by_reference,
                unlend_at,
                false,
            );
            let lent = net.stack(0).counters().tcp_tx_lent;
            let given_back = net.stack(0).counters().tcp_lent_given_back;
            assert_eq!(given_back, u64::from(unlend_at != u64::MAX));
            let segs = net.stack(0).tcp_stats().tx_data_segments;
            assert_clean(&mut net, &base);
            assert_eq!(net.stack(0).pool().lent_parts(), 0, "{server}: a part left");
            // Only the test's own reference is left: no frame or socket holds it.
            (net.stats, lent, segs, Arc::strong_count(&ring) - 1)
        });
        eprintln!(
            "{server} given back at {unlend_at}: {} of {} segments by reference, {} frames",
            by_ref.1, by_ref.2, by_ref.0.sent
        );
        // While lent, nearly every segment (not the handshake's) leaves by
        // reference, and the frames are the copying path's.
        let lent_share = if unlend_at == u64::MAX { 9 } else { 2 };
        assert!(
            by_ref.1 * 10 > by_ref.2 * lent_share,
            "{} of {}",
            by_ref.1,
            by_ref.2
        );
        assert_eq!(copied.1, 0);
        assert_eq!(by_ref.0, copied.0, "{server}: the wire differs");
        assert_eq!(
            (by_ref.3, copied.3),
            (0, 0),
            "the stack still holds the ring"
        );
    }
}

/// A bulk stream keeps its lent ring where the flight it caps already waits in a
/// queue (a short path behind a slower link, as a veth behind a busy core): a
/// larger buffer there only adds delay, and the ring saves a copy per byte. On a
/// long path, whose bandwidth-delay product is far above the ring, the ring would
/// cap the rate: it binds, and the connection's own buffer grows as Linux's does.
#[test]
fn a_lent_ring_binds_on_a_long_path_and_not_behind_a_queue() {
    for (name, faults, binds) in [
        (
            "20 ms RTT",
            Faults {
                delay: Duration::from_millis(10),
                ..Faults::default()
            },
            true,
        ),
        (
            "100 MB/s, 100 µs RTT",
            Faults {
                line_rate: 100_000_000,
                ..Faults::default()
            },
            false,
        ),
    ] {
        let mut net = offload_pair(81, faults, true, |_| {});
        let base = baseline(&net);
        lent_transfer(&mut net, sa("10.0.0.2:5008"), 8 << 20, true, u64::MAX, true);
        let c = net.stack(0).counters();
        eprintln!(
            "{name}: {} segments by reference, {} rings given back",
            c.tcp_tx_lent, c.tcp_lent_given_back
        );
        assert_eq!(c.tcp_lent_given_back, u64::from(binds), "{name}");
        assert!(c.tcp_tx_lent > 0, "{name}");
        assert_clean(&mut net, &base);
    }
}

/// Loss, duplication and reordering for the GSO conversations (no corruption:
/// frames that cross whole are trusted, as on a TAP).
fn lossy_gso_path() -> Faults {
    Faults {
        loss: 0.01,
        duplicate: 0.01,
        reorder: 0.03,
        reorder_window: Duration::from_millis(1),
        ..Faults::default()
    }
}

/// Two stacks that, with `tso`, send TSO frames that cross the wire whole,
/// checksum-verified (as over a TAP or a veth with offloads); `tcp` sets their
/// TCP configuration.
fn offload_pair(
    seed: u64,
    faults: Faults,
    tso: bool,
    tcp: impl Fn(&mut usnet_stack::TcpConfig),
) -> SimNet {
    let mut net = SimNet::new(seed, faults);
    net.whole_gso = tso;
    for i in 1..=2 {
        let mut c = cfg(i);
        c.tso = tso;
        c.tx_csum_offload = tso;
        c.rx_csum_offload = tso;
        tcp(&mut c.tcp);
        net.add(c).unwrap();
    }
    net
}

/// Two stacks sending TSO frames that cross the wire whole; `zero_copy`:
/// pool-backed queues.
fn whole_gso_pair(seed: u64, faults: Faults, zero_copy: bool) -> SimNet {
    offload_pair(seed, faults, true, |t| t.zero_copy = zero_copy)
}

/// Bulk transfers of `bytes` over [`whole_gso_pair`] to `port`, seeds from
/// `first_seed`, in four configurations (IPv4 and IPv6, clean and with loss,
/// duplication and reordering): every byte arrives in order and every buffer comes
/// back; most frames reach the connection as chains (`tcp_rx_chained`) and only
/// what reaches the listener (a first flight that arrives with the handshake's last
/// ACK) is linearised. `check` gets each run's receiver counters.
fn chained_gso_transfers(
    first_seed: u64,
    port: u16,
    zero_copy: bool,
    bytes: u64,
    check: impl Fn(u64, &usnet_stack::Counters),
) {
    let lossy = lossy_gso_path();
    for (k, (server, faults)) in [
        ("10.0.0.2", Faults::default()),
        ("[fd00::2]", Faults::default()),
        ("10.0.0.2", lossy),
        ("[fd00::2]", lossy),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = first_seed + k as u64;
        let mut net = whole_gso_pair(seed, faults, zero_copy);
        let base = baseline(&net);
        let server = format!("{server}:{port}");
        transfer(&mut net, sa(&server), bytes, Duration::from_secs(600));
        let rx = net.stack(1).counters_snapshot();
        eprintln!(
            "seed {seed}: {} chained segments read in place, {} staged, {} frames linearised, {} frames",
            rx.tcp_rx_chained, rx.tcp_zc_rx_staged, rx.link_rx_linearised, rx.link_rx_frames
        );
        assert!(
            rx.tcp_rx_chained * 4 > rx.link_rx_frames,
            "{} of {} frames read in place",
            rx.tcp_rx_chained,
            rx.link_rx_frames
        );
        assert!(
            rx.link_rx_linearised * 20 < rx.tcp_rx_chained,
            "{} frames linearised",
            rx.link_rx_linearised
        );
        check(seed, &rx);
        assert_clean(&mut net, &base);
    }
}

/// GSO frames that cross whole (as over a TAP or a veth with offloads) arrive as
/// chains of 2 KiB buffers; their segments reach the connection where they lie,
/// without being linearised first, and every byte arrives in order, through loss,
/// reordering and duplication, over IPv4 and IPv6.
#[test]
fn chained_gso_frames_are_read_in_place() {
    chained_gso_transfers(45, 5004, false, 8 << 20, |_, _| {});
}

/// A pool-backed (zero-copy) connection keeps the buffers its segments arrived in.
/// A chained GSO frame is split into its buffers, each part kept where it lies (a
/// kept buffer must not lead on into the rest of a chain), not linearised and
/// copied into buffers of its own: every byte arrives, through loss, reordering and
/// duplication, over IPv4 and IPv6, and every buffer comes back.
#[test]
fn chained_gso_frames_to_a_pool_backed_connection_are_kept_in_place() {
    chained_gso_transfers(49, 5005, true, 4 << 20, |seed, rx| {
        assert!(
            rx.tcp_zc_rx_staged * 20 < rx.tcp_rx_chained,
            "seed {seed}: {} segments staged",
            rx.tcp_zc_rx_staged
        );
    });
}

/// A legal pool whose buffers hold only the promised 64 bytes past the headroom is
/// too small for a GSO frame's headers (Ethernet + IPv6 + TCP with options): TSO then
/// sends unjoined segments built as chains instead of panicking, and every byte
/// arrives.
#[test]
fn tso_with_buffers_too_small_for_gso_headers() {
    for server in ["10.0.0.2:5003", "[fd00::2]:5003"] {
        let mut net = SimNet::new(43, Faults::default());
        for i in 1..=2 {
            let mut c = cfg(i);
            c.tso = true;
            c.tx_csum_offload = true;
            c.pool.buf_size = 2048;
            c.pool.headroom = 2048 - 64;
            net.add(c).unwrap();
        }
        let base = baseline(&net);
        transfer(&mut net, sa(server), 256 << 10, Duration::from_secs(120));
        assert_clean(&mut net, &base);
    }
}

/// Sockets carry an owner: accepted connections inherit their listener's, and
/// `close_owner` resets the owner's connections toward their peers and gives back
/// every socket and buffer (a connection still in a listener's accept queue too,
/// whichever of the two it reaches first), while another owner's sockets live on.
#[test]
fn owners_are_inherited_and_closed_together() {
    use usnet_stack::Owner;
    let mut net = pair(44, Faults::default());
    let base = baseline(&net);
    let (a, b) = (Owner(7), Owner(8));
    let s = net.stack_mut(1);
    let la = s.tcp_listen(sa("10.0.0.2:6001"), 8).unwrap();
    let lb = s.tcp_listen(sa("10.0.0.2:6002"), 8).unwrap();
    s.set_owner(la, a).unwrap();
    s.set_owner(lb, b).unwrap();
    let u = s.udp_bind(sa("10.0.0.2:6003")).unwrap();
    s.set_owner(u, a).unwrap();
    assert_eq!(s.owner(la), Some(a));
    let ca = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:6001"))
        .unwrap();
    let cb = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:6002"))
        .unwrap();
    // A second connection to a's listener that is never accepted.
    let ca2 = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:6001"))
        .unwrap();
    let cu = net.stack_mut(0).udp_bind(sa("10.0.0.1:0")).unwrap();
    net.stack_mut(0)
        .udp_send_to(cu, b"held in a's queue", sa("10.0.0.2:6003"))
        .unwrap();
    let ok = net.run_until(Duration::from_secs(5), |n| {
        [ca, ca2, cb]
            .iter()
            .all(|&c| n.stack(0).tcp_state(c) == Ok(TcpState::Established))
            && [la, lb, u]
                .iter()
                .all(|&h| n.stack(1).readiness(h).is_ok_and(|r| r.readable))
    });
    assert!(ok, "handshakes");
    let s = net.stack_mut(1);
    let acc_a = s.tcp_accept(la).unwrap();
    let acc_b = s.tcp_accept(lb).unwrap();
    assert_eq!(s.owner(acc_a), Some(a), "inherited from the listener");
    assert_eq!(s.owner(acc_b), Some(b));
    let mut of_a = s.sockets_of(a);
    of_a.sort_by_key(|h| h.raw());
    // The one a did not accept, still queued on its listener.
    let queued: Vec<_> = of_a
        .iter()
        .copied()
        .filter(|h| ![la, u, acc_a].contains(h))
        .collect();
    assert_eq!(queued.len(), 1, "{of_a:?}");
    let mut want = vec![la, u, acc_a, queued[0]];
    want.sort_by_key(|h| h.raw());
    assert_eq!(of_a, want);
    assert!(s.pool().in_use() > base[1].1, "the datagram holds a buffer");

    assert_eq!(s.close_owner(a), 4);
    assert!(s.sockets_of(a).is_empty());
    assert_eq!(s.owner(acc_a), None, "the handle is gone");
    net.run_for(Duration::from_millis(50));
    assert_eq!(
        net.stack(0).tcp_error(ca),
        Ok(Some(StackError::ConnectionReset)),
        "the peer of a's connection saw an RST"
    );
    assert_eq!(
        net.stack(0).tcp_error(ca2),
        Ok(Some(StackError::ConnectionReset)),
        "so did the peer of the one left in the accept queue"
    );
    assert_eq!(net.stack(0).tcp_state(cb), Ok(TcpState::Established));
    assert_eq!(net.stack(1).tcp_state(acc_b), Ok(TcpState::Established));
    // Owner b's connection still carries data.
    net.stack_mut(0).tcp_send(cb, b"still here").unwrap();
    net.run_for(Duration::from_millis(50));
    let mut buf = [0u8; 32];
    let n = net.stack_mut(1).tcp_recv(acc_b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"still here");
    // Close the rest; nothing is left on either side.
    let s1 = net.stack_mut(1);
    assert_eq!(s1.close_owner(b), 2);
    let s0 = net.stack_mut(0);
    s0.tcp_close(ca).unwrap();
    s0.tcp_close(ca2).unwrap();
    s0.tcp_close(cb).unwrap();
    s0.close(cu).unwrap();
    assert_clean(&mut net, &base);
}

/// Bytes pushed into a connection for a writer without a refusal (a stack server
/// moving what its client queued) may leave it full; a poll that then finds it not
/// writable (`tcp_poll_writable`, Linux's `tcp_poll` setting `SOCK_NOSPACE`) must
/// hear when it empties, or the writer waiting on that answer waits forever (the
/// stall `sendfile_and_a_pipe_into_a_bounded_socket_give_up_only_what_was_taken`
/// once hit in CI). Without the poll nobody asked, and the stack stays quiet, as
/// Linux's does.
#[test]
fn a_connection_a_poll_found_full_reports_when_it_empties() {
    for poll in [false, true] {
        let mut net = pair(41, Faults::default());
        let l = net.stack_mut(1).tcp_listen(sa("10.0.0.2:90"), 4).unwrap();
        let c = net
            .stack_mut(0)
            .tcp_connect(None, sa("10.0.0.2:90"))
            .unwrap();
        let mut srv = None;
        assert!(net.run_until(Duration::from_secs(2), |n| {
            srv = srv.or_else(|| n.stack_mut(1).tcp_accept(l).ok());
            srv.is_some() && n.stack(0).readiness(c).unwrap().connected
        }));
        let srv = srv.unwrap();
        net.stack_mut(0).tcp_set_send_buffer(c, 16_384).unwrap();
        let data = vec![7u8; 12_000];
        let n = net
            .stack_mut(0)
            .tcp_send_with(c, data.len(), |dst| {
                let k = dst.len().min(data.len());
                dst[..k].copy_from_slice(&data[..k]);
                k
            })
            .unwrap();
        assert_eq!(n, data.len(), "pushed whole: no refusal");
        let mut ready = Vec::new();
        net.stack_mut(0).take_ready(&mut ready);
        if poll {
            assert!(
                !net.stack_mut(0).tcp_poll_writable(c),
                "full after the push"
            );
        }
        // The peer reads everything; its ACKs empty the send buffer.
        let mut got = 0;
        let mut buf = vec![0u8; 4096];
        let mut reported = false;
        assert!(net.run_until(Duration::from_secs(5), |n| {
            while let Ok(k) = n.stack_mut(1).tcp_recv(srv, &mut buf) {
                got += k;
            }
            n.stack_mut(0).take_ready(&mut ready);
            // A report that finds it writable (others, before, do not count).
            let writable = n.stack(0).readiness(c).unwrap().writable;
            reported |= ready.drain(..).any(|h| h == c) && writable;
            got == data.len() && n.stack(0).tcp_connections()[0].info.send_queued == 0
        }));
        assert!(net.stack(0).readiness(c).unwrap().writable);
        assert_eq!(
            reported, poll,
            "poll {poll}: reported writable when it emptied"
        );
    }
}

/// Stack 0 connects to a listener of stack 1's on `port`: the two ends, once
/// accepted (within 2 s of virtual time).
fn connected(net: &mut SimNet, port: u16) -> (SocketHandle, SocketHandle) {
    let at = SocketAddr::from(([10, 0, 0, 2], port));
    let l = net.stack_mut(1).tcp_listen(at, 4).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, at).unwrap();
    let mut srv = None;
    assert!(net.run_until(Duration::from_secs(2), |n| {
        srv = n.stack_mut(1).tcp_accept(l).ok();
        srv.is_some()
    }));
    (c, srv.expect("accepted"))
}

/// The segment ends a sender's write puts PSH on, relative to its first byte, with
/// its queues copying or pool-backed (`TcpConfig::zero_copy`): one write of
/// `len` bytes to a peer with a 8 KiB window, the segments seen on the wire.
fn push_points(zero_copy: bool, len: usize) -> Vec<u32> {
    use std::cell::RefCell;
    use std::rc::Rc;
    let mut net = SimNet::new(50, Faults::default());
    let mut c0 = cfg(1);
    c0.tcp.zero_copy = zero_copy;
    let mut c1 = cfg(2);
    c1.tcp.recv_buffer = 8192;
    c1.tcp.recv_buffer_initial = 8192;
    c1.tcp.autotune = false;
    net.add(c0).unwrap();
    net.add(c1).unwrap();
    // (sequence number after the segment, PSH) of every data segment stack 0 sends.
    let seen: Rc<RefCell<Vec<(u32, bool)>>> = Rc::default();
    let isn = Rc::new(RefCell::new(None::<u32>));
    let (s2, i2) = (seen.clone(), isn.clone());
    net.middlebox = Some(Box::new(move |from, f| {
        if from == 0 && f.len() > 54 && f[12..14] == [8, 0] && f[23] == 6 {
            let ihl = usize::from(f[14] & 15) * 4;
            let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
            let t = &f[14 + ihl..];
            let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
            let thl = usize::from(t[12] >> 4) * 4;
            if t[13] & 0x02 != 0 {
                *i2.borrow_mut() = Some(seq);
            }
            let payload = total - ihl - thl;
            if payload > 0 {
                s2.borrow_mut()
                    .push((seq.wrapping_add(payload as u32), t[13] & 0x08 != 0));
            }
        }
        usnet_stack::sim::Hop::Pass
    }));
    let (c, srv) = connected(&mut net, 5006);
    let data = vec![5u8; len];
    let (mut sent, mut got) = (0, 0);
    let mut buf = vec![0u8; 65536];
    assert!(net.run_until(Duration::from_secs(10), |n| {
        if sent < len {
            if let Ok(k) = n.stack_mut(0).tcp_send_more(c, &data[sent..], false) {
                sent += k;
            }
        }
        while let Ok(k @ 1..) = n.stack_mut(1).tcp_recv(srv, &mut buf) {
            got += k;
        }
        got == len
    }));
    let first = isn.borrow().expect("SYN seen").wrapping_add(1);
    let mut ends: Vec<u32> = seen
        .borrow()
        .iter()
        .filter(|s| s.1)
        .map(|s| s.0.wrapping_sub(first))
        .collect();
    ends.dedup();
    ends
}

/// A pool-backed connection puts PSH where a copying one does: on a chunk a forced
/// push marks (half the peer's largest window unpushed) and at the end of each
/// write (Linux's `tcp_mark_push` and `tcp_push`; packetdrill's
/// `timestamping/partial` and `notsent_lowat` scripts cover a write the send buffer
/// cut short).
#[test]
fn pool_backed_writes_push_where_copying_writes_do() {
    // Writes the send buffer takes whole (beyond that, what one call admits
    // differs: pool buffers are charged as Linux charges its pages, a ring by bytes).
    for len in [6000, 7000] {
        let copying = push_points(false, len);
        let pooled = push_points(true, len);
        assert!(copying.len() >= 2, "{len}: {copying:?}");
        assert_eq!(pooled, copying, "{len}");
    }
}

/// What a reader gets of `abcdefghij` sent with its last byte urgent (a middlebox
/// sets URG and the urgent pointer on the first data segment) and then `KLM`,
/// with the receiver's queues copying or pool-backed: the bytes a read to the
/// urgent mark gets (as `splice` reads), whether it then stands at the mark, the
/// urgent byte taken there, and the rest. With `splice_like` false a plain read
/// takes everything instead, and the urgent byte must be left out.
fn urgent_read(zero_copy: bool, splice_like: bool) -> (Vec<u8>, bool, Option<u8>, Vec<u8>) {
    use std::cell::Cell;
    use std::rc::Rc;
    let mut net = SimNet::new(51, Faults::default());
    net.add(cfg(1)).unwrap();
    let mut c1 = cfg(2);
    c1.tcp.zero_copy = zero_copy;
    net.add(c1).unwrap();
    let marked = Rc::new(Cell::new(false));
    let m2 = marked.clone();
    net.middlebox = Some(Box::new(move |from, f| {
        if from != 0 || m2.get() || f.len() <= 54 || f[12..14] != [8, 0] || f[23] != 6 {
            return usnet_stack::sim::Hop::Pass;
        }
        let ihl = usize::from(f[14] & 15) * 4;
        let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
        let t = 14 + ihl;
        let thl = usize::from(f[t + 12] >> 4) * 4;
        let payload = total - ihl - thl;
        if payload == 0 {
            return usnet_stack::sim::Hop::Pass;
        }
        m2.set(true);
        // URG and the pointer (BSD: the byte after the urgent one), with the
        // checksum updated for the two changed words (RFC 1624).
        let mut g = f.to_vec();
        let word = |g: &[u8], at: usize| u16::from_be_bytes([g[at], g[at + 1]]);
        let mut sum = u32::from(!word(&g, t + 16));
        for (at, new) in [(t + 12, word(&g, t + 12) | 0x20), (t + 18, payload as u16)] {
            sum += u32::from(!word(&g, at)) + u32::from(new);
            g[at..at + 2].copy_from_slice(&new.to_be_bytes());
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        g[t + 16..t + 18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        usnet_stack::sim::Hop::Answer(g)
    }));
    let (c, srv) = connected(&mut net, 5007);
    assert_eq!(net.stack_mut(0).tcp_send(c, b"abcdefghij"), Ok(10));
    net.run_for(Duration::from_millis(200));
    assert!(marked.get(), "the middlebox marked a segment");
    assert_eq!(net.stack_mut(0).tcp_send(c, b"KLM"), Ok(3));
    net.run_for(Duration::from_millis(200));
    let s = net.stack_mut(1);
    let read_all = |s: &mut usnet_stack::Stack| {
        let (mut out, mut buf) = (Vec::new(), [0u8; 64]);
        while let Ok(n @ 1..) = s.tcp_recv(srv, &mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    };
    let mut buf = [0u8; 64];
    if !splice_like {
        return (read_all(s), false, None, Vec::new());
    }
    let mut to_mark = Vec::new();
    while let Ok(n @ 1..) = s.tcp_recv_to_mark(srv, &mut buf) {
        to_mark.extend_from_slice(&buf[..n]);
    }
    let at_mark = s.tcp_at_urgent_mark(srv);
    let urgent = s.tcp_take_urgent_at_mark(srv).unwrap();
    (to_mark, at_mark, urgent, read_all(s))
}

/// A pool-backed receive queue read through the copying calls treats urgent data
/// as a byte ring does (SO_OOBINLINE off, Linux's default): a read leaves the
/// urgent byte out, a read to the mark stops there and the byte is taken apart
/// (packetdrill's `splice/tcp_splice_loop_test` with pool-backed queues). Before,
/// a pool-backed connection kept the urgent byte inline.
#[test]
fn pool_backed_reads_take_the_urgent_byte_out_as_copying_ones_do() {
    for zero_copy in [false, true] {
        assert_eq!(
            urgent_read(zero_copy, false),
            (b"abcdefghiKLM".to_vec(), false, None, Vec::new()),
            "zero_copy {zero_copy}: a plain read"
        );
        assert_eq!(
            urgent_read(zero_copy, true),
            (b"abcdefghi".to_vec(), true, Some(b'j'), b"KLM".to_vec()),
            "zero_copy {zero_copy}: a read to the mark"
        );
    }
}

/// How much of one 200,000-byte write the send buffer (50,000 bytes) takes at
/// once, right after the handshake, with the sender's queues copying or
/// pool-backed, and then of a second such write after the peer acknowledged what
/// went out.
fn writes_taken(zero_copy: bool) -> (usize, usize) {
    let mut net = SimNet::new(52, Faults::default());
    let mut c0 = cfg(1);
    c0.tcp.zero_copy = zero_copy;
    c0.tcp.send_buffer_initial = 50_000;
    net.add(c0).unwrap();
    let mut c1 = cfg(2);
    c1.tcp.recv_buffer = 65536;
    c1.tcp.recv_buffer_initial = 65536;
    c1.tcp.autotune = false;
    net.add(c1).unwrap();
    let (c, srv) = connected(&mut net, 5008);
    let data = vec![3u8; 200_000];
    let first = net.stack_mut(0).tcp_send(c, &data).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        while let Ok(k @ 1..) = n.stack_mut(1).tcp_recv(srv, &mut buf) {
            got += k;
        }
        got == first
    }));
    let second = net.stack_mut(0).tcp_send(c, &data).unwrap();
    (first, second)
}

/// A pool-backed write is admitted as a copying one is: where a chunk at the head
/// of the unsent data fills, it transmits before queuing more (Linux's
/// `tcp_push_one`), so the chunk is cut where the window stopped it and the rest
/// joins the next one (packetdrill's `epoll_out_edge` scripts, `blocking-write`
/// and `cubic-bulk-166k` with pool-backed queues). Before, a pool-backed write
/// queued whole chunks without transmitting and took less: 48,000 bytes of
/// `epoll_out_edge`'s 59,000 where Linux takes 58,000.
#[test]
fn a_pool_backed_write_is_admitted_as_a_copying_one_is() {
    let copying = writes_taken(false);
    let pooled = writes_taken(true);
    assert!(copying.0 > 50_000 && copying.0 < 200_000, "{copying:?}");
    assert_eq!(pooled, copying);
}

/// SO_REUSEPORT listeners on one address and port (a worker each) share its
/// connections, over a lossy link too (the SYN and the ACK that completes the
/// handshake reach the same member); a listener without the option beside them
/// is refused; when one member closes, the other takes the new connections.
#[test]
fn reuseport_listeners_share_the_connections_of_their_port() {
    let faults = Faults {
        loss: 0.05,
        ..Faults::default()
    };
    let mut net = pair(31, faults);
    let cfg = net.stack(1).tcp_config().clone();
    let listen = |net: &mut SimNet, reuseport: bool| {
        net.stack_mut(1).tcp_listen_reuseport(
            sa("0.0.0.0:8080"),
            64,
            cfg.clone(),
            Families::Both,
            reuseport,
        )
    };
    let members = [
        listen(&mut net, true).unwrap(),
        listen(&mut net, true).unwrap(),
    ];
    assert_eq!(listen(&mut net, false), Err(StackError::AddrInUse));
    assert_eq!(
        net.stack_mut(1).tcp_listen(sa("10.0.0.2:8080"), 8),
        Err(StackError::AddrInUse),
        "nor one on its address without the option"
    );
    let conns: Vec<SocketHandle> = (0..40)
        .map(|_| {
            net.stack_mut(0)
                .tcp_connect(None, sa("10.0.0.2:8080"))
                .unwrap()
        })
        .collect();
    let mut took = [0usize; 2];
    let done = net.run_until(Duration::from_secs(30), |n| {
        for (k, &l) in members.iter().enumerate() {
            while let Ok(c) = n.stack_mut(1).tcp_accept(l) {
                took[k] += 1;
                n.stack_mut(1).tcp_close(c).unwrap();
            }
        }
        took[0] + took[1] == conns.len()
    });
    assert!(done, "every connection accepted: {took:?}");
    assert!(took[0] > 0 && took[1] > 0, "shared: {took:?}");
    net.stack_mut(1).tcp_close(members[0]).unwrap();
    let c = net
        .stack_mut(0)
        .tcp_connect(None, sa("10.0.0.2:8080"))
        .unwrap();
    let mut got = None;
    assert!(net.run_until(Duration::from_secs(10), |n| {
        got = n.stack_mut(1).tcp_accept(members[1]).ok();
        got.is_some()
    }));
    let _ = c;
}
