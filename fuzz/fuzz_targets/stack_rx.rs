//! Arbitrary frame sequences into one `Stack`, with time passing in between.
//!
//! Input: records of `[ctl: u8][len: u16 LE][len bytes of frame]` (a short last record
//! takes what is left). `ctl & 7` moves the clock (none, 1 ms, 50 ms, 1 s, 3 s, 31 s,
//! 120 s, or 0..255 µs), bit 3 polls right away, bit 4 lets the application read (and
//! bit 5 echo) its UDP datagrams and raw ICMP messages, bit 6 runs the stack until
//! idle, when no deadline may still be due (its loop would spin). At the end the
//! stack settles, the sockets are drained and no packet buffer may still be in use.
#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use usnet_pool::PoolConfig;
use usnet_stack::{mac_from_seed, DgramProto, Families, Instant, Stack, StackConfig};

fn config() -> StackConfig {
    StackConfig {
        mac: mac_from_seed(1),
        addrs: vec![
            "10.0.0.1/24".parse().unwrap(),
            "fd00::1/64".parse().unwrap(),
        ],
        // Small: cheap to create per input, and exhaustion is part of the game.
        pool: PoolConfig {
            count: 96,
            ..PoolConfig::default()
        },
        input_queue_len: 32,
        rx_budget: 8,
        tx_queue_len: 32,
        reasm_memory: 256 << 10,
        reasm_max_datagrams: 8,
        neighbor_cache_size: 16,
        neighbor_pending: 4,
        seed: 1,
        ..StackConfig::default()
    }
}

fn flush(s: &mut Stack) {
    while let Some(b) = s.dequeue_tx() {
        s.pool_mut().free(b);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut s = Stack::new(config()).expect("config");
    let udp = s
        .udp_bind("0.0.0.0:7".parse::<SocketAddr>().unwrap())
        .unwrap();
    let ping = s.ping_open();
    // Raw ICMP sockets of both families: every ICMP message is copied to them.
    let raw = ["0.0.0.0:0", "[::]:0"].map(|a| {
        s.dgram_bind(DgramProto::Raw, a.parse().unwrap(), Families::Both, false)
            .unwrap()
    });
    let mut now = Instant::from_millis(1);
    let mut buf = vec![0u8; 65536];
    let mut rest = data;
    while let Some((&ctl, tail)) = rest.split_first() {
        let len = match tail {
            [a, b, ..] => u16::from_le_bytes([*a, *b]) as usize,
            _ => 0,
        };
        let body = tail.get(2..).unwrap_or(&[]);
        let (frame, next) = body.split_at(len.min(body.len()));
        rest = next;
        if let Some(b) = s.pool_mut().alloc_from(frame) {
            s.receive(b);
        }
        let step = match ctl & 7 {
            0 => Duration::ZERO,
            1 => Duration::from_millis(1),
            2 => Duration::from_millis(50),
            3 => Duration::from_secs(1),
            4 => Duration::from_secs(3),
            5 => Duration::from_secs(31),
            6 => Duration::from_secs(120),
            _ => Duration::from_micros(u64::from(ctl)),
        };
        now = now + step;
        if ctl & 8 != 0 || step > Duration::ZERO {
            s.poll(now);
        }
        if ctl & 64 != 0 {
            if let Err(d) = s.run_until_idle(now) {
                panic!("deadline {d:?} still due at {now:?} after the stack ran idle");
            }
            if let Err(e) = s.tcp_check_invariants() {
                panic!("at {now:?}: {e}");
            }
        }
        if ctl & 16 != 0 {
            while let Ok((n, from)) = s.udp_recv_from(udp, &mut buf) {
                if ctl & 32 != 0 {
                    let d = buf[..n].to_vec();
                    let _ = s.udp_send_to(udp, &d, from);
                }
            }
            while s.ping_recv(ping).is_ok() {}
            for r in raw {
                while let Ok((n, from)) = s.udp_recv_from(r, &mut buf) {
                    if ctl & 32 != 0 {
                        // Sent back whole (an IPv4 copy without its header).
                        let skip = if from.is_ipv4() {
                            usize::from(buf[0] & 15) * 4
                        } else {
                            0
                        };
                        let d = buf[skip.min(n)..n].to_vec();
                        let _ = s.udp_send_to(r, &d, from);
                    }
                }
            }
        }
        flush(&mut s);
    }
    // Settle: everything processed, resolutions failed, reassemblies expired.
    for _ in 0..64 {
        now = now + Duration::from_secs(2);
        s.poll(now);
        flush(&mut s);
    }
    assert_eq!(s.input_len(), 0);
    for h in [udp, raw[0], raw[1]] {
        while s.udp_recv_from(h, &mut buf).is_ok() {}
    }
    assert_eq!(
        s.pool().in_use(),
        0,
        "leaked buffers: {:?}",
        s.pool().stats()
    );
});
