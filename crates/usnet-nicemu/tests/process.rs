//! The device side in its own process, as in real use (the test binary re-executes
//! itself as the device side, selected through `child_hook`): frames flow, and when the
//! process dies (abort, no clean-up) the driver reports the link down.

use std::time::{Duration, Instant};

use usnet_link::nic::{NicDriver, NicOptions};
use usnet_link::{Device, LinkState};
use usnet_nicemu::{device_command, maybe_run_child, NicemuOptions};
use usnet_pool::{PacketPool, PoolConfig};

/// Entry point of the re-executed device side; a no-op in the normal test run.
#[test]
fn child_hook() {
    maybe_run_child();
}

#[test]
fn device_process_dies_mid_run_and_link_goes_down() {
    let name = format!("t-proc-{}", std::process::id());
    let mut drv = NicDriver::create(
        &name,
        &NicOptions {
            rx_ring: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let mut p = PacketPool::new(&PoolConfig::default()).unwrap();
    let mut o = NicemuOptions::new(&name);
    o.count = 100000;
    o.interval_ns = 20000;
    o.die_after = Some(300);
    o.start_delay_ms = 1;
    o.quiet = true;
    let mut child = device_command(&o)
        .unwrap()
        .args(["child_hook", "--exact", "--nocapture", "--test-threads=1"])
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut got = 0;
    let mut was_up = false;
    let mut out = Vec::new();
    loop {
        drv.wait(Some(Duration::from_millis(5))).unwrap();
        out.clear();
        drv.rx_burst(&mut p, &mut out, 64).unwrap();
        got += out.len();
        for b in out.drain(..) {
            p.free(b);
        }
        match drv.link_state() {
            LinkState::Up => was_up = true,
            LinkState::Down if was_up => break,
            LinkState::Down => {}
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no link down after the device died"
        );
    }
    // The device side aborted (that is how the link went down): reap it, with a deadline.
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            panic!("the device side did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(!status.success(), "the device side aborted");
    // Frames placed before the death are all there.
    out.clear();
    drv.rx_burst(&mut p, &mut out, 1000).unwrap();
    got += out.len();
    for b in out.drain(..) {
        p.free(b);
    }
    assert_eq!(got, 300);
    assert_eq!(p.in_use(), 0);
}
