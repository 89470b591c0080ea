//! Two processes: the test binary re-executes itself as the exec peer
//! (selected through `child_hook`, which calls `maybe_run_child`).

#![cfg(not(loom))]

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};
use usnet_async_syscall::*;

/// Waits for a child that must exit within `d`; kills it and fails otherwise.
fn wait_within(child: &mut Child, d: Duration) -> ExitStatus {
    let end = Instant::now() + d;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            panic!("child still running after {d:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

const HOOK: [&str; 4] = ["child_hook", "--exact", "--nocapture", "--test-threads=1"];

/// Entry point of the re-executed peer; a no-op in the normal test run.
#[test]
fn child_hook() {
    maybe_run_child();
}

fn scale() -> u64 {
    std::env::var("USNET_RING_STRESS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[test]
fn stress_two_processes() {
    let ring = Ring::new(512).unwrap();
    let mut child = spawn_child(&ring, "echo", "sleep:32", &HOOK).unwrap();
    let total = 2_000_000 * scale();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut out = Vec::new();
    let mut calls = Vec::with_capacity(64);
    let mut seen = vec![false; total as usize];
    while done < total {
        calls.clear();
        while calls.len() < 64 && next < total {
            calls.push(Call {
                num: (next % 300) as u32,
                args: [next, next * 3, 0, 0, 7, !next],
                user_data: next,
            });
            next += 1;
        }
        let mut k = 0;
        while k < calls.len() {
            match ring.submit_batch(&calls[k..]) {
                Ok(n) => k += n,
                Err(Error::Full) => {
                    ring.wait(&mut out, 1, Some(Duration::from_secs(10)))
                        .unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
        ring.poll_batch(&mut out, usize::MAX);
        for c in out.drain(..) {
            let id = c.user_data;
            assert!(!seen[id as usize], "duplicate {id}");
            seen[id as usize] = true;
            let req = Request {
                index: 0,
                num: (id % 300) as u32,
                args: [id, id * 3, 0, 0, 7, !id],
            };
            assert_eq!(c.result, echo_result(&req));
            done += 1;
        }
        if next == total && done < total {
            ring.wait(&mut out, 1, Some(Duration::from_secs(10)))
                .unwrap();
        }
    }
    ring.exit(ExitMode::Drain);
    assert!(wait_within(&mut child, Duration::from_secs(20)).success());
    assert_eq!(ring.errors().total(), 0);
}

/// Cross-process hostile peer: a second child writes random bytes all over
/// the area while an echo child serves requests. The parent must neither
/// crash nor hang; violations are counted.
#[test]
fn fuzz_two_processes() {
    let ring = Ring::new(64).unwrap();
    let mut echo = spawn_child(&ring, "echo", "sleep:4", &HOOK).unwrap();
    let mut fuzz = spawn_child(&ring, "fuzz", "99:1200", &HOOK).unwrap();
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        let batch: Vec<Call> = (0..8)
            .map(|k| Call {
                num: 2,
                args: [i + k; 6],
                user_data: i + k,
            })
            .collect();
        i += 8;
        let _ = ring.submit_batch(&batch);
        let _ = ring.wait(&mut out, 1, Some(Duration::from_millis(2)));
        out.clear();
    }
    assert!(wait_within(&mut fuzz, Duration::from_secs(20)).success());
    ring.exit(ExitMode::Cancel);
    // The echo child may have been told garbage (e.g. a corrupted control
    // word); give it a moment, then make sure it is gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while echo.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        ring.exit(ExitMode::Cancel);
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = echo.kill();
    wait_within(&mut echo, Duration::from_secs(5));
    eprintln!("fuzz2: errors {:?}", ring.errors());
    assert!(ring.errors().total() > 0);
}
