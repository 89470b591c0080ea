//! The driver on in-memory devices: two stacks whose frames a test carries across,
//! in virtual time.

use std::time::Duration;

use usnet_driver::{Clock, Driver, ManualClock, MemDevice, MemQueues};
use usnet_link::DeviceCaps;
use usnet_stack::{mac_from_seed, Stack, StackConfig, StackError, TcpState};

fn caps() -> DeviceCaps {
    DeviceCaps::plain(1500)
}

fn end(i: u8, clock: &ManualClock) -> (Driver<MemDevice, ManualClock>, MemQueues) {
    let (dev, q) = MemDevice::new(&format!("mem{i}"), caps()).unwrap();
    let stack = Stack::new(StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.9.0.{i}/24").parse().unwrap()],
        seed: i as u64,
        ..Default::default()
    })
    .unwrap();
    (Driver::new(stack, dev, clock.clone()), q)
}

/// Carries every frame each side sent to the other; returns how many.
fn carry(a: &MemQueues, b: &MemQueues) -> usize {
    let mut n = 0;
    while let Some((f, _)) = a.take_sent() {
        b.inject(&f);
        n += 1;
    }
    while let Some((f, _)) = b.take_sent() {
        a.inject(&f);
        n += 1;
    }
    n
}

#[test]
fn two_drivers_move_a_checked_tcp_stream_in_virtual_time() {
    let clock = ManualClock::default();
    let (mut a, qa) = end(1, &clock);
    let (mut b, qb) = end(2, &clock);
    let l = b
        .stack_mut()
        .tcp_listen("10.9.0.2:80".parse().unwrap(), 4)
        .unwrap();
    let c = a
        .stack_mut()
        .tcp_connect(None, "10.9.0.2:80".parse().unwrap())
        .unwrap();
    let total = 1 << 20;
    let (mut sent, mut got) = (0usize, 0usize);
    let mut srv = None;
    let mut buf = vec![0u8; 16384];
    for _ in 0..200_000 {
        if sent < total {
            let chunk: Vec<u8> = (sent..(sent + 8192).min(total)).map(|i| i as u8).collect();
            match a.stack_mut().tcp_send(c, &chunk) {
                Ok(k) => sent += k,
                Err(StackError::WouldBlock) => {}
                Err(e) => panic!("send: {e:?}"),
            }
        }
        let ta = a.turn().unwrap();
        let tb = b
            .turn_with(|s| {
                if srv.is_none() {
                    srv = s.tcp_accept(l).ok();
                }
                let mut did = false;
                if let Some(h) = srv {
                    while let Ok(k) = s.tcp_recv(h, &mut buf) {
                        if k == 0 {
                            break;
                        }
                        for (j, x) in buf[..k].iter().enumerate() {
                            assert_eq!(*x, (got + j) as u8, "byte {}", got + j);
                        }
                        got += k;
                        did = true;
                    }
                }
                did
            })
            .unwrap();
        let moved = carry(&qa, &qb);
        if got == total {
            break;
        }
        if moved == 0 && !ta.busy() && !tb.busy() {
            // Idle: jump to the earliest timer (delayed ACKs and the like).
            let next = [a.stack().poll_at(), b.stack().poll_at()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(clock.now() + Duration::from_millis(1));
            clock.set(next.max(clock.now() + Duration::from_micros(1)));
        }
    }
    assert_eq!(got, total);
    assert_eq!(a.stack().tcp_state(c), Ok(TcpState::Established));
    // The in-memory wire never loses a frame.
    assert_eq!(a.stack().tcp_info(c).unwrap().total_retransmits, 0);
    assert!(a.device_stats().tx_frames > 0 && b.device_stats().rx_frames > 0);
}

#[test]
fn run_until_gives_up_at_its_limit_and_wait_returns_at_the_deadline() {
    let clock = ManualClock::default();
    let (mut a, _qa) = end(1, &clock);
    let t0 = std::time::Instant::now();
    let done = a
        .run_until(Duration::from_millis(30), Duration::from_millis(5), |_| {
            false
        })
        .unwrap();
    assert!(!done);
    assert!(t0.elapsed() >= Duration::from_millis(30));
    // Nothing to do and nothing arriving: the wait ends at its cap.
    a.wait(Duration::from_millis(10)).unwrap();
}

#[test]
fn a_waker_ends_a_wait_and_an_injected_frame_is_received() {
    let clock = ManualClock::default();
    let (mut a, qa) = end(1, &clock);
    let (mut b, qb) = end(2, &clock);
    let w = usnet_link::Device::waker(a.device());
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        w.wake();
    });
    a.wait(Duration::from_secs(5)).unwrap();
    t.join().unwrap();
    // A ping from b: ARP, then the echo, each carried by hand.
    let p = b.stack_mut().ping_open();
    b.stack_mut()
        .ping_send(p, "10.9.0.1".parse().unwrap(), 1, b"hi")
        .unwrap();
    for _ in 0..10 {
        b.turn().unwrap();
        carry(&qa, &qb);
        a.turn().unwrap();
        carry(&qa, &qb);
    }
    assert_eq!(b.stack_mut().ping_recv(p).unwrap().seq, 1);
}
