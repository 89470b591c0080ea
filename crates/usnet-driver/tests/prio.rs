//! Priority control through the driver: the stack's boost requests reach the
//! scheduler hook after a turn, and every boost is undone when the stack stops —
//! with a fake hook in virtual time, and (as root) with setpriority(2) on a real
//! child process.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use usnet_driver::sched::{can_boost, nice_of, SchedHook};
use usnet_driver::{Booster, Driver, ManualClock, MemDevice, MemQueues, Setpriority};
use usnet_link::DeviceCaps;
use usnet_stack::{mac_from_seed, RxPolicy, SocketHandle, Stack, StackConfig};

fn caps() -> DeviceCaps {
    DeviceCaps::plain(1500)
}

fn end(
    i: u8,
    clock: &ManualClock,
    policy: RxPolicy,
) -> (Driver<MemDevice, ManualClock>, MemQueues) {
    let (dev, q) = MemDevice::new(&format!("mem{i}"), caps()).unwrap();
    let stack = Stack::new(StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.9.0.{i}/24").parse().unwrap()],
        seed: i as u64,
        rx_policy: policy,
        ..Default::default()
    })
    .unwrap();
    (Driver::new(stack, dev, clock.clone()), q)
}

fn carry(a: &MemQueues, b: &MemQueues) {
    while let Some((f, _)) = a.take_sent() {
        b.inject(&f);
    }
    while let Some((f, _)) = b.take_sent() {
        a.inject(&f);
    }
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<HashMap<u32, i32>>>);

impl Fake {
    fn nice(&self, pid: u32) -> i32 {
        *self.0.lock().unwrap().get(&pid).unwrap_or(&0)
    }
}

impl SchedHook for Fake {
    fn get(&mut self, pid: u32) -> io::Result<i32> {
        Ok(*self.0.lock().unwrap().get(&pid).unwrap_or(&0))
    }
    fn set(&mut self, pid: u32, nice: i32) -> io::Result<()> {
        self.0.lock().unwrap().insert(pid, nice);
        Ok(())
    }
}

/// A receiver at 10.9.0.2:7001 whose consumer is `pid`, and a sender that fills
/// its queue past half; returns the receiver's driver and socket.
fn fill_past_half(
    pid: u32,
    booster: Booster,
) -> (Driver<MemDevice, ManualClock>, SocketHandle, ManualClock) {
    let clock = ManualClock::default();
    let policy = RxPolicy {
        priority: true,
        set_size: 1,
        boost: 5,
        ..RxPolicy::default()
    };
    let (mut a, qa) = end(1, &clock, RxPolicy::default());
    let (mut b, qb) = end(2, &clock, policy);
    b.set_booster(Some(booster));
    let h = b
        .stack_mut()
        .udp_bind("10.9.0.2:7001".parse().unwrap())
        .unwrap();
    b.stack_mut().udp_set_recv_buffer(h, 4096).unwrap();
    b.stack_mut().set_socket_consumer(h, Some(pid)).unwrap();
    let s = a
        .stack_mut()
        .udp_bind("10.9.0.1:5000".parse().unwrap())
        .unwrap();
    for _ in 0..40 {
        a.stack_mut()
            .udp_send_to(s, &[0u8; 100], "10.9.0.2:7001".parse().unwrap())
            .unwrap();
        for _ in 0..3 {
            clock.advance(Duration::from_millis(1));
            a.turn().unwrap();
            b.turn().unwrap();
            carry(&qa, &qb);
        }
    }
    assert!(b.stack().socket_stats(h).unwrap().rx_datagrams >= 21);
    (b, h, clock)
}

#[test]
fn a_boost_reaches_the_hook_and_is_undone_when_the_stack_stops() {
    let fake = Fake::default();
    fake.0.lock().unwrap().insert(4242, 2);
    let (b, _h, _clock) = fill_past_half(4242, Booster::new(Box::new(fake.clone()), None));
    assert_eq!(fake.nice(4242), -3, "boosted by 5");
    assert_eq!(b.booster().unwrap().boosted(), vec![4242]);
    assert_eq!(b.stack().counters().prio_boosts, 1);
    // The stack stops with the boost in force (no drain, no timeout): dropping the
    // driver restores it.
    drop(b);
    assert_eq!(fake.nice(4242), 2);
}

#[test]
fn a_boost_ends_through_the_hook_when_the_consumer_catches_up() {
    let fake = Fake::default();
    let (mut b, h, clock) = fill_past_half(77, Booster::new(Box::new(fake.clone()), None));
    assert_eq!(fake.nice(77), -5);
    // The loop that applies the boost (this thread) stays above the consumer.
    let me = usnet_driver::sched::gettid();
    assert_eq!(fake.nice(me), -6);
    let mut buf = [0u8; 128];
    while b.stack_mut().udp_recv_from(h, &mut buf).is_ok() {}
    b.turn().unwrap();
    assert_eq!(fake.nice(77), -5, "drained, but the burst may go on");
    // Nothing arrives for the quiet time: the burst is over.
    clock.advance(usnet_stack::RxPolicy::default().drain_quiet);
    b.turn().unwrap();
    assert_eq!(fake.nice(77), 0, "drained and quiet: restored");
    assert_eq!(fake.nice(me), 0, "and the loop with it");
    assert!(b.booster().unwrap().boosted().is_empty());
    assert_eq!(b.stack().counters().prio_restores_drained, 1);
}

/// A real child process (`sleep`) as the consumer: as root the boost is a real
/// setpriority(2), and stopping the stack puts the child's nice value back.
#[test]
fn a_real_process_is_boosted_and_restored_when_the_stack_stops() {
    if let Err(why) = can_boost() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("sleep");
    let pid = child.id();
    Setpriority.set(pid, 4).unwrap();
    let booster = Booster::system(None).unwrap();
    let (b, _h, _clock) = fill_past_half(pid, booster);
    assert_eq!(nice_of(pid).unwrap(), -1, "boosted by 5");
    drop(b);
    assert_eq!(nice_of(pid).unwrap(), 4, "restored when the stack stopped");
    child.kill().unwrap();
    child.wait().unwrap();
}
