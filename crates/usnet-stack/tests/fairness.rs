//! Sharing a link that is the bottleneck between owners (a stack server's clients):
//! one owner sending as fast as it can on many connections does not push another
//! owner's single connection below an equal split of the link.
//!
//! The simulated NIC sends at a fixed line rate and takes a frame from the stack's
//! transmit queue only when the last one is out, so the queue fills and the
//! stack's scheduler (`tcp/fair.rs`) decides who sends next.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{mac_from_seed, Owner, SocketHandle, StackConfig, StackError};

const RATE: u64 = 1_250_000; // 10 Mbit/s

fn cfg(i: u8) -> StackConfig {
    let mut c = StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64 * 7_919,
        // A short queue behind the scheduler, as a NIC's ring: what waits, waits
        // in the scheduler's turns, not in a FIFO all owners share.
        tx_queue_len: 16,
        ..Default::default()
    };
    c.tcp.send_buffer = 256 << 10;
    c
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Bytes each owner got through in `measure` after `warm` of virtual time, with
/// `greedy` connections for owner 1 and one for owner 2, all sending without pause.
fn shares(greedy: usize, warm: Duration, measure: Duration) -> (u64, u64) {
    let faults = Faults {
        line_rate: RATE,
        delay: Duration::from_millis(2),
        ..Faults::default()
    };
    let mut net = SimNet::new(17, faults);
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    let l = net.stack_mut(1).tcp_listen(sa("10.0.0.2:9"), 1024).unwrap();
    let mut senders: Vec<(SocketHandle, Owner)> = Vec::new();
    for i in 0..=greedy {
        let owner = if i < greedy { Owner(1) } else { Owner(2) };
        let h = net
            .stack_mut(0)
            .tcp_connect(None, sa("10.0.0.2:9"))
            .unwrap();
        net.stack_mut(0).set_owner(h, owner).unwrap();
        senders.push((h, owner));
    }
    let by_port: HashMap<u16, Owner> = senders
        .iter()
        .map(|&(h, o)| (net.stack(0).tcp_local_addr(h).unwrap().port(), o))
        .collect();
    let mut receivers: Vec<(SocketHandle, Owner)> = Vec::new();
    let mut got: HashMap<Owner, u64> = HashMap::new();
    let chunk = vec![0x5a; 16 << 10];
    let mut buf = vec![0; 64 << 10];
    let mut pump = |net: &mut SimNet, count: bool| {
        for &(h, _) in &senders {
            while net.stack_mut(0).tcp_send(h, &chunk).is_ok_and(|n| n > 0) {}
        }
        while let Ok(h) = net.stack_mut(1).tcp_accept(l) {
            let port = net.stack(1).tcp_peer_addr(h).unwrap().port();
            receivers.push((h, by_port[&port]));
        }
        for &(h, owner) in &receivers {
            loop {
                match net.stack_mut(1).tcp_recv(h, &mut buf) {
                    Ok(n) if n > 0 => {
                        if count {
                            *got.entry(owner).or_default() += n as u64;
                        }
                    }
                    Ok(_) | Err(StackError::WouldBlock) => break,
                    Err(e) => panic!("receive: {e:?}"),
                }
            }
        }
    };
    net.run_until(warm, |net| {
        pump(net, false);
        false
    });
    net.run_until(measure, |net| {
        pump(net, true);
        false
    });
    assert_eq!(receivers.len(), greedy + 1, "every connection accepted");
    (
        got.get(&Owner(1)).copied().unwrap_or(0),
        got.get(&Owner(2)).copied().unwrap_or(0),
    )
}

#[test]
fn a_client_with_many_connections_gets_no_more_than_an_equal_split() {
    let measure = Duration::from_secs(8);
    let (greedy, quiet) = shares(100, Duration::from_secs(2), measure);
    let total = greedy + quiet;
    eprintln!("greedy (100 connections) {greedy} B, quiet (1) {quiet} B");
    // The link stays busy: at least 90 % of the line rate arrives as payload
    // (headers take 3 % of a full segment).
    let line = RATE * measure.as_secs();
    assert!(total * 10 >= line * 9, "{total} of {line}");
    // Equal split: the quiet client gets at least 0.8 × half.
    assert!(quiet * 10 >= total / 2 * 8, "quiet {quiet} of {total}");
    // And it does not take more than its half either (its turns are bounded).
    assert!(greedy * 10 >= total / 2 * 8, "greedy {greedy} of {total}");
}

/// One owner that stops reading its UDP sockets holds at most its share of the
/// pool; another owner's datagrams keep arriving, and the charges follow the
/// buffers (read, moved to another owner, closed).
#[test]
fn an_owner_that_stops_reading_holds_no_more_than_its_share_of_the_pool() {
    let mut net = SimNet::new(23, Faults::default());
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    let base = net.stack(1).pool().in_use();
    let cap = 64;
    net.stack_mut(1).set_rx_owner_limit(Some(cap));
    // Owner 1: four sockets, each with room for far more than the cap in bytes.
    let stuck: Vec<SocketHandle> = (0..4)
        .map(|i| {
            let h = net
                .stack_mut(1)
                .udp_bind(sa(&format!("10.0.0.2:{}", 5000 + i)))
                .unwrap();
            net.stack_mut(1).set_owner(h, Owner(1)).unwrap();
            net.stack_mut(1).udp_set_recv_buffer(h, 4 << 20).unwrap();
            h
        })
        .collect();
    let reader = net.stack_mut(1).udp_bind(sa("10.0.0.2:6000")).unwrap();
    net.stack_mut(1).set_owner(reader, Owner(2)).unwrap();
    let tx = net.stack_mut(0).udp_bind(sa("10.0.0.1:0")).unwrap();
    let mut buf = [0u8; 64];
    let (mut sent, mut read) = (0u32, 0u32);
    for round in 0..100u32 {
        for i in 0..4 {
            let to = sa(&format!("10.0.0.2:{}", 5000 + i));
            net.stack_mut(0).udp_send_to(tx, b"x", to).unwrap();
        }
        net.stack_mut(0)
            .udp_send_to(tx, &round.to_be_bytes(), sa("10.0.0.2:6000"))
            .unwrap();
        sent += 1;
        net.run_for(Duration::from_millis(1));
        while let Ok((n, _)) = net.stack_mut(1).udp_recv_from(reader, &mut buf) {
            assert_eq!(buf[..n], read.to_be_bytes());
            read += 1;
        }
    }
    assert_eq!(read, sent, "the other owner got every datagram");
    assert_eq!(net.stack(1).rx_held(Owner(1)), cap);
    assert_eq!(net.stack(1).rx_held(Owner(2)), 0);
    assert_eq!(net.stack(1).counters().udp_rx_owner_full, 400 - cap as u64);
    // Reading one gives one back; moving a socket moves its charge; closing frees it.
    net.stack_mut(1).udp_recv_from(stuck[0], &mut buf).unwrap();
    assert_eq!(net.stack(1).rx_held(Owner(1)), cap - 1);
    let moved = net.stack(1).rx_held(Owner(1));
    net.stack_mut(1).set_owner(stuck[1], Owner(3)).unwrap();
    let on_3 = net.stack(1).rx_held(Owner(3));
    assert!(on_3 > 0);
    assert_eq!(net.stack(1).rx_held(Owner(1)) + on_3, moved);
    for &h in &stuck {
        net.stack_mut(1).close(h).unwrap();
    }
    assert_eq!(net.stack(1).rx_held(Owner(1)), 0);
    assert_eq!(net.stack(1).rx_held(Owner(3)), 0);
    assert_eq!(net.stack(1).pool().in_use(), base);
}
