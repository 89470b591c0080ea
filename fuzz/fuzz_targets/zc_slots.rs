//! Whatever an application writes into its zero-copy rings (`usnet_stack::zerocopy`):
//! arbitrary TX slots, RX slot scribbles, `head` moves, frees and allocations,
//! while a peer stack keeps sending to the port's connection over the simulated
//! wire. The stack must not panic, and once the port is closed and the connections
//! are gone, every pool buffer must be back.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::zerocopy::Slot;
use usnet_stack::{mac_from_seed, SocketHandle, StackConfig};

#[derive(Debug, Arbitrary)]
enum Act {
    Tx {
        buf: u8,
        off: u16,
        len: u16,
        flags: u16,
        sock: u8,
    },
    RxHead(u8),
    RxScribble {
        buf: u8,
        off: u16,
        len: u16,
        flags: u16,
    },
    Free(u8),
    Alloc,
    Step(u8),
    PeerSend(u16),
}

fn cfg(i: u8) -> StackConfig {
    let mut c = StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64,
        // Enough for the windows in flight; building the default 4,096 buffers
        // (page faults, clearing) was 14 % of every input.
        pool: usnet_pool::PoolConfig {
            count: 1024,
            ..Default::default()
        },
        ..StackConfig::default()
    };
    // Short TIME-WAIT and retries: every connection is gone soon after the end.
    c.tcp.time_wait = Duration::from_millis(200);
    c.tcp.max_retries = 3;
    c
}

fuzz_target!(|acts: Vec<Act>| {
    let mut net = SimNet::new(1, Faults::default());
    net.add(cfg(1)).unwrap();
    net.add(cfg(2)).unwrap();
    let server = "10.0.0.2:80".parse().unwrap();
    let base = net.stack(1).pool().in_use();
    let mut port = net.stack(1).zc_port(8, 8);
    let l = net.stack_mut(1).zc_listen(&mut port, server, 4).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
    let mut mine: Vec<u32> = Vec::new();
    let mut socks = vec![l, SocketHandle::from_raw(0x1_0000_0003)];
    for a in acts.into_iter().take(400) {
        let count = net.stack(1).pool().count();
        let pick = |b: u8, mine: &[u32]| match b {
            0..=15 => mine.get(b as usize).copied().unwrap_or(u32::from(b)),
            16..=31 => count.wrapping_sub(u32::from(b - 15)),
            _ => u32::from(b) << 24,
        };
        match a {
            Act::Tx {
                buf,
                off,
                len,
                flags,
                sock,
            } => {
                let h = socks[sock as usize % socks.len()];
                let b = pick(buf, &mine);
                port.tx
                    .push(Slot::new(h, b, u32::from(off), u32::from(len), flags));
            }
            Act::RxHead(n) => {
                for _ in 0..n % 16 {
                    port.rx.head = port.rx.next(port.rx.head);
                }
            }
            Act::RxScribble {
                buf,
                off,
                len,
                flags,
            } => {
                let b = pick(buf, &mine);
                let h = port.rx.head;
                let s = port.rx.slot_mut(h);
                s.buf = b;
                s.off = u32::from(off);
                s.len = u32::from(len);
                s.flags = flags;
            }
            Act::Free(b) => {
                let b = pick(b, &mine);
                let _ = net.stack_mut(1).zc_free(&mut port, b);
            }
            Act::Alloc => {
                if let Some(b) = net.stack_mut(1).zc_alloc(&mut port) {
                    mine.push(b);
                }
            }
            Act::Step(ms) => net.run_for(Duration::from_millis(u64::from(ms))),
            Act::PeerSend(n) => {
                let _ = net.stack_mut(0).tcp_send(c, &vec![7u8; usize::from(n)]);
            }
        }
        net.stack_mut(1).zc_sync(&mut port);
        for h in port.sockets() {
            if !socks.contains(&h) {
                socks.push(h);
            }
        }
        let _ = net.stack_mut(0).tcp_recv(c, &mut [0u8; 2048]);
        net.run_for(Duration::from_millis(1));
    }
    let _ = net.stack_mut(0).tcp_abort(c);
    net.run_for(Duration::from_secs(1));
    net.stack_mut(1).zc_close_port(port);
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.stack(1).pool().in_use(), base, "pool buffers leaked");
});
