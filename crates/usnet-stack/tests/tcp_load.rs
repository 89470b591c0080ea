//! TCP load in the simulator: 10,000 connections open at the same time between two
//! stacks, each exchanging a few bytes both ways, then all closed, with the packet
//! pool and the socket table back to their baseline afterwards.
//!
//! (100,000 connect/close cycles live in `tests/tcp.rs`:
//! `cargo test --release -p usnet-stack --test tcp -- --ignored`.)

use std::net::SocketAddr;
use std::time::Duration;

use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{mac_from_seed, SocketHandle, StackConfig, StackError};

fn cfg(i: u8) -> StackConfig {
    let mut c = StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64 * 104_729,
        ..Default::default()
    };
    // Small per-connection buffers: 10k connections × (send + receive ring).
    c.tcp.send_buffer = 4 << 10;
    c.tcp.recv_buffer = 4 << 10;
    c.tcp.recv_buffer_initial = 4 << 10;
    c
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn msg(i: usize) -> Vec<u8> {
    format!("hello {i:05}").into_bytes()
}

fn concurrent(n: usize) {
    let mut net = SimNet::new(61, Faults::default());
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    let base: Vec<(usize, u32)> = (0..2)
        .map(|i| (net.stack(i).socket_count().0, net.stack(i).pool().in_use()))
        .collect();
    let l = net.stack_mut(1).tcp_listen(sa("10.0.0.2:7"), 4096).unwrap();

    // Open all n, a batch at a time so SYNs do not outrun the transmit queue; none is
    // closed until every one of them is established.
    let mut clients: Vec<SocketHandle> = Vec::with_capacity(n);
    let mut servers: Vec<SocketHandle> = Vec::with_capacity(n);
    while clients.len() < n {
        for _ in 0..(n - clients.len()).min(500) {
            clients.push(
                net.stack_mut(0)
                    .tcp_connect(None, sa("10.0.0.2:7"))
                    .unwrap(),
            );
        }
        net.run_until(Duration::from_secs(2), |net| {
            while let Ok(h) = net.stack_mut(1).tcp_accept(l) {
                servers.push(h);
            }
            servers.len() == clients.len()
        });
    }
    assert!(net.run_until(Duration::from_secs(60), |net| {
        while let Ok(h) = net.stack_mut(1).tcp_accept(l) {
            servers.push(h);
        }
        servers.len() == n
            && clients
                .iter()
                .all(|&c| net.stack(0).readiness(c).unwrap().connected)
    }));
    assert_eq!(net.stack(0).tcp_connections().len(), n);
    assert_eq!(net.stack(1).tcp_connections().len(), n);
    let peak_pool = (net.stack(0).pool().in_use(), net.stack(1).pool().in_use());

    // Every client says hello; every server echoes what it got; clients check.
    for (i, &c) in clients.iter().enumerate() {
        assert_eq!(net.stack_mut(0).tcp_send(c, &msg(i)).unwrap(), 11);
    }
    let mut echoed = vec![false; n];
    let mut got: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut buf = [0u8; 64];
    assert!(net.run_until(Duration::from_secs(60), |net| {
        for &s in &servers {
            loop {
                match net.stack_mut(1).tcp_recv(s, &mut buf) {
                    Ok(0) | Err(StackError::WouldBlock) => break,
                    Ok(k) => {
                        assert_eq!(net.stack_mut(1).tcp_send(s, &buf[..k]).unwrap(), k);
                    }
                    Err(e) => panic!("server: {e:?}"),
                }
            }
        }
        for (i, &c) in clients.iter().enumerate() {
            if echoed[i] {
                continue;
            }
            match net.stack_mut(0).tcp_recv(c, &mut buf) {
                Ok(k) => {
                    got[i].extend_from_slice(&buf[..k]);
                    echoed[i] = got[i].len() >= 11;
                }
                Err(StackError::WouldBlock) => {}
                Err(e) => panic!("client {i}: {e:?}"),
            }
        }
        echoed.iter().all(|e| *e)
    }));
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &msg(i), "connection {i}");
    }

    // Close: clients first, servers on EOF.
    for &c in &clients {
        net.stack_mut(0).tcp_close(c).unwrap();
    }
    let mut closed = vec![false; n];
    assert!(net.run_until(Duration::from_secs(60), |net| {
        for (i, &s) in servers.iter().enumerate() {
            if !closed[i] && net.stack_mut(1).tcp_recv(s, &mut buf) == Ok(0) {
                net.stack_mut(1).tcp_close(s).unwrap();
                closed[i] = true;
            }
        }
        closed.iter().all(|c| *c)
    }));
    net.stack_mut(1).tcp_close(l).unwrap();
    // TIME-WAIT (60 s) passes; then nothing may be left.
    net.run_for(Duration::from_secs(61));
    for (i, &(socks, bufs)) in base.iter().enumerate() {
        let s = net.stack(i);
        assert!(
            s.tcp_connections().is_empty(),
            "stack {i}: connections left"
        );
        assert_eq!(s.socket_count().0, socks, "stack {i}: sockets left");
        assert_eq!(s.pool().in_use(), bufs, "stack {i}: pool buffers left");
    }
    let c0 = net.stack(0).counters_snapshot();
    let c1 = net.stack(1).counters_snapshot();
    assert_eq!(c0.tcp_active_opens, n as u64);
    assert_eq!(c1.tcp_passive_opens, n as u64);
    assert_eq!(c0.tcp_conns_reaped, n as u64);
    eprintln!(
        "{n} concurrent connections: pool in use at peak {peak_pool:?}, back to {:?}; \
         virtual time {:?}",
        (net.stack(0).pool().in_use(), net.stack(1).pool().in_use()),
        net.now()
    );
}

#[test]
fn ten_thousand_concurrent_connections() {
    concurrent(10_000);
}

/// Connections refused by a full transmit queue wait on the blocked list; when the
/// queue has room for one frame, one of them goes, not a pass over all of them
/// (each refused again: with 100,000 blocked connections a stack server did little
/// else), and every one of them still gets its turn.
#[test]
fn a_frame_of_room_polls_one_blocked_connection_not_all() {
    let n = 64;
    let mut net = SimNet::new(62, Faults::default());
    let mut c = cfg(1);
    c.tx_queue_len = 8;
    net.add(c).unwrap();
    net.add(cfg(2)).unwrap();
    let l = net.stack_mut(1).tcp_listen(sa("10.0.0.2:7"), 256).unwrap();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    // A few at a time: the SYNs fit the short queue.
    while clients.len() < n {
        for _ in 0..4 {
            clients.push(
                net.stack_mut(0)
                    .tcp_connect(None, sa("10.0.0.2:7"))
                    .unwrap(),
            );
        }
        let want = clients.len();
        net.run_until(Duration::from_secs(5), |net| {
            while let Ok(h) = net.stack_mut(1).tcp_accept(l) {
                servers.push(h);
            }
            servers.len() == want
        });
    }
    net.run_for(Duration::from_millis(100));
    assert_eq!(servers.len(), n);
    // Every connection writes; the queue takes 8 segments, the rest are blocked.
    let now = net.now();
    let st = net.stack_mut(0);
    for (i, &h) in clients.iter().enumerate() {
        assert_eq!(st.tcp_send(h, &msg(i)).unwrap(), msg(i).len());
    }
    st.poll(now);
    let refused = st.counters().tcp_tx_blocked;
    assert!(refused >= (n - 8) as u64, "{refused} refused");
    // One frame leaves (lost on the way); the next poll fills that room and stops.
    let gone = st.dequeue_tx().expect("a queued frame");
    st.pool_mut().free(gone);
    st.poll(now);
    let more = st.counters().tcp_tx_blocked - refused;
    assert!(
        more <= 2,
        "{more} blocked connections refused again for one frame of room"
    );
    // The frame that was taken out is lost: its connection retransmits it.
    let mut got = vec![Vec::new(); n];
    net.run_until(Duration::from_secs(10), |net| {
        let st = net.stack_mut(1);
        for (i, &h) in servers.iter().enumerate() {
            let mut b = [0u8; 64];
            while let Ok(k) = st.tcp_recv(h, &mut b) {
                if k == 0 {
                    break;
                }
                got[i].extend_from_slice(&b[..k]);
            }
        }
        got.iter().all(|g| !g.is_empty())
    });
    let mut sent: Vec<Vec<u8>> = (0..n).map(msg).collect();
    sent.sort();
    got.sort();
    assert_eq!(got, sent, "every blocked connection's bytes arrived");
}
