//! What the whole-stack tests share: stack configurations, the byte pattern and a
//! checked one-way transfer.
#![allow(dead_code)] // each test file uses a different part

pub mod icmp;

use std::net::SocketAddr;
use std::time::Duration;

use usnet_stack::sim::SimNet;
use usnet_stack::{mac_from_seed, SocketHandle, Stack, StackConfig, StackError};

pub fn cfg(i: u8) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![
            format!("10.0.0.{i}/24").parse().unwrap(),
            format!("fd00::{i}/64").parse().unwrap(),
        ],
        seed: i as u64 * 7919,
        ..Default::default()
    }
}

pub fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The byte at stream offset `i`: not periodic at any small power of two, so a
/// misplaced segment shows.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 17) as u8 ^ (i >> 13) as u8
}

pub fn fill(buf: &mut [u8], off: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern(off + k as u64);
    }
}

/// A one-way transfer of `total` bytes from stack 0 to stack 1, every byte checked,
/// then an orderly close from both ends; `hook` runs before each step (a test's
/// middlebox or injections). Returns the virtual time it took.
pub fn transfer_with(
    net: &mut SimNet,
    server: SocketAddr,
    total: u64,
    limit: Duration,
    hook: impl FnMut(&mut SimNet),
) -> Duration {
    let mut chunk = vec![0u8; 64 * 1024];
    transfer_by(net, server, total, limit, hook, |s, c, sent| {
        let want = (total - sent).min(chunk.len() as u64) as usize;
        fill(&mut chunk[..want], sent);
        match s.tcp_send(c, &chunk[..want]) {
            Ok(k) => k,
            Err(StackError::WouldBlock) => 0,
            Err(e) => panic!("client send at {sent}: {e:?}"),
        }
    })
}

/// [`transfer_with`] whose client queues the pattern with `write(stack, conn,
/// sent)`: the count of bytes from stream offset `sent` on it queued (0: none
/// now), called until all are.
pub fn transfer_by(
    net: &mut SimNet,
    server: SocketAddr,
    total: u64,
    limit: Duration,
    mut hook: impl FnMut(&mut SimNet),
    mut write: impl FnMut(&mut Stack, SocketHandle, u64) -> usize,
) -> Duration {
    let start = net.now();
    let l = net.stack_mut(1).tcp_listen(server, 16).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
    let mut srv: Option<SocketHandle> = None;
    let (mut sent, mut got) = (0u64, 0u64);
    let (mut shut, mut srv_closed, mut cli_closed) = (false, false, false);
    let mut rbuf = vec![0u8; 64 * 1024];
    let ok = net.run_until(limit, |n| {
        hook(n);
        // Client: push the pattern, then FIN.
        if !cli_closed {
            let s = n.stack_mut(0);
            while sent < total {
                match write(s, c, sent) {
                    0 => break,
                    k => sent += k as u64,
                }
            }
            if sent == total && !shut {
                s.tcp_shutdown_write(c).unwrap();
                shut = true;
            }
        }
        // Server: accept, read and check every byte, close at EOF.
        let s = n.stack_mut(1);
        if srv.is_none() {
            srv = s.tcp_accept(l).ok();
        }
        if let (Some(h), false) = (srv, srv_closed) {
            loop {
                match s.tcp_recv(h, &mut rbuf) {
                    Ok(0) => {
                        assert_eq!(got, total, "EOF early");
                        s.tcp_close(h).unwrap();
                        srv_closed = true;
                        break;
                    }
                    Ok(k) => {
                        for (j, b) in rbuf[..k].iter().enumerate() {
                            let at = got + j as u64;
                            assert_eq!(*b, pattern(at), "byte {at} of {total} is wrong");
                        }
                        got += k as u64;
                    }
                    Err(StackError::WouldBlock) => break,
                    Err(e) => panic!("server recv at {got}: {e:?}"),
                }
            }
        }
        // Client: the server's FIN ends the stream.
        if shut && !cli_closed {
            let s = n.stack_mut(0);
            match s.tcp_recv(c, &mut rbuf) {
                Ok(0) => {
                    s.tcp_close(c).unwrap();
                    cli_closed = true;
                }
                Ok(_) => panic!("server sent data"),
                Err(StackError::WouldBlock) => {}
                Err(e) => panic!("client recv: {e:?}"),
            }
        }
        srv_closed && cli_closed
    });
    assert!(
        ok,
        "transfer stalled: sent {sent} got {got} of {total}; wire {:?}; client {:?}",
        net.stats,
        net.stack(0).tcp_connections()
    );
    net.stack_mut(1).tcp_close(l).unwrap();
    net.now().saturating_since(start)
}
