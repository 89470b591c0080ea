//! The device side in its own process, as in real use: frames flow, and when the
//! process dies (abort, no clean-up) the driver reports the link down.

use std::process::Command;
use std::time::{Duration, Instant};

use usnet_link::{Device, LinkState};
use usnet_nicemu::{open_driver, DriverOpts};
use usnet_pool::{PacketPool, PoolConfig};

#[test]
fn device_process_dies_mid_run_and_link_goes_down() {
    let name = format!("t-proc-{}", std::process::id());
    let mut drv = open_driver(
        &name,
        &DriverOpts {
            rx_ring: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let mut p = PacketPool::new(&PoolConfig::default()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_usnet-nicemu"))
        .args([
            "nicemu",
            "--name",
            &name,
            "--count",
            "100000",
            "--interval-ns",
            "20000",
        ])
        .args(["--die-after", "300", "--start-delay-ms", "1", "--quiet"])
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
        for &b in &out {
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
    let status = child.wait().unwrap();
    assert!(!status.success(), "the device side aborted");
    // Frames placed before the death are all there.
    out.clear();
    drv.rx_burst(&mut p, &mut out, 1000).unwrap();
    got += out.len();
    for &b in &out {
        p.free(b);
    }
    assert_eq!(got, 300);
    assert_eq!(p.in_use(), 0);
}
