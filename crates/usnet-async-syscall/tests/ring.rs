//! Functional and stress tests of the ring and the async syscall facility.
//! `USNET_RING_STRESS=<n>` scales the stress sizes (default 1).

#![cfg(not(loom))]

use std::collections::HashSet;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use usnet_async_syscall::*;

/// Joins a thread that must end within `d` (a lost wake-up would otherwise hang the
/// test instead of failing it).
fn join_within<T>(h: JoinHandle<T>, d: Duration) -> T {
    let end = Instant::now() + d;
    while !h.is_finished() {
        assert!(Instant::now() < end, "thread still running after {d:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    h.join().unwrap()
}

fn scale() -> u64 {
    std::env::var("USNET_RING_STRESS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn check_echo(c: &Completion, n: &Call) {
    let req = Request {
        index: 0,
        num: n.num,
        args: n.args,
    };
    assert_eq!(c.result, echo_result(&req), "{c:?}");
}

#[test]
fn state_machine_basics() {
    let ring = Ring::new(4).unwrap();
    assert!(matches!(
        ring.wait_one(Some(Duration::from_millis(1))),
        Err(Error::Idle)
    ));
    let calls: Vec<Call> = (0..6)
        .map(|i| Call {
            num: 1,
            args: [i; 6],
            user_data: i,
        })
        .collect();
    assert_eq!(ring.submit_batch(&calls).unwrap(), 4); // only 4 entries
    assert!(matches!(ring.submit(&calls[0]), Err(Error::Full)));
    assert_eq!(ring.in_flight(), 4);
    assert!(matches!(
        ring.wait_one(Some(Duration::from_millis(5))),
        Err(Error::TimedOut)
    ));
    let r2 = ring.clone();
    let t = std::thread::spawn(move || r2.exec(&ExecOptions::default(), |r| r.args[0] as i64 * 10));
    let mut out = Vec::new();
    ring.wakeup(&mut out).unwrap();
    while out.len() < 4 {
        ring.wait(&mut out, 1, Some(Duration::from_secs(10)))
            .unwrap();
    }
    let mut got: Vec<_> = out.iter().map(|c| (c.user_data, c.result)).collect();
    got.sort();
    assert_eq!(got, vec![(0, 0), (1, 10), (2, 20), (3, 30)]);
    ring.exit(ExitMode::Drain);
    assert_eq!(join_within(t, Duration::from_secs(10)).executed, 4);
    assert!(matches!(ring.submit(&calls[0]), Err(Error::Exiting)));
    assert!(matches!(
        ring.wait_one(Some(Duration::from_secs(5))),
        Err(Error::Closed)
    ));
    assert_eq!(ring.errors().total(), 0);
}

#[test]
fn exit_cancel_with_pending_and_no_exec_threads() {
    let ring = Ring::new(8).unwrap();
    let calls: Vec<Call> = (0..5)
        .map(|i| Call {
            num: 1,
            args: [0; 6],
            user_data: i,
        })
        .collect();
    ring.submit_batch(&calls).unwrap();
    ring.exit(ExitMode::Cancel);
    assert_eq!(ring.cancel_pending(), 5);
    let mut out = Vec::new();
    ring.wait(&mut out, 5, Some(Duration::from_secs(10)))
        .unwrap();
    assert!(out.iter().all(|c| c.result == -(libc::ECANCELED as i64)));
    assert!(matches!(
        ring.wait_one(Some(Duration::from_secs(5))),
        Err(Error::Closed)
    ));
}

#[test]
fn async_syscall_gettid_and_read() {
    let mut a = AsyncSyscall::new(2, 64).unwrap();
    let me = run_syscall(libc::SYS_gettid, [0; 6]);
    let tid = a.call_sync(libc::SYS_gettid, [0; 6]).unwrap();
    assert!(tid > 0 && tid != me, "gettid runs on an exec thread");
    assert_eq!(
        a.call_sync(libc::SYS_getpid, [0; 6]).unwrap(),
        std::process::id() as i64
    );
    // errors come back as negative errno
    assert_eq!(
        a.call_sync(libc::SYS_close, [u64::MAX >> 1, 0, 0, 0, 0, 0])
            .unwrap(),
        -(libc::EBADF as i64)
    );
    assert_eq!(
        a.call_sync(libc::SYS_clone, [0; 6]).unwrap(),
        -(libc::ENOSYS as i64)
    );
    assert_eq!(
        a.call_sync(libc::SYS_exit, [0; 6]).unwrap(),
        -(libc::ENOSYS as i64)
    );
    // read a file in pieces with pread64 through the ring
    let path =
        std::env::temp_dir().join(format!("usnet-async-syscall-read-{}", std::process::id()));
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; data.len()];
    let piece = 10_000;
    let calls: Vec<Call> = (0..10)
        .map(|i| Call {
            num: libc::SYS_pread64 as u32,
            args: [
                f.as_raw_fd() as u64,
                buf[i * piece..].as_mut_ptr() as u64,
                piece as u64,
                (i * piece) as u64,
                0,
                0,
            ],
            user_data: i as u64,
        })
        .collect();
    assert_eq!(a.submit_batch(&calls).unwrap(), 10);
    let mut out = Vec::new();
    a.wait(&mut out, 10, Some(Duration::from_secs(10))).unwrap();
    assert!(out.iter().all(|c| c.result == piece as i64), "{out:?}");
    assert_eq!(buf, data);
    std::fs::remove_file(&path).unwrap();
    let st = a.exit(ExitMode::Drain);
    assert!(st.executed >= 15);
    assert!(matches!(
        a.submit(libc::SYS_getpid, [0; 6], 0),
        Err(Error::Exiting)
    ));
}

/// Several requester threads share one ring; several exec threads.
/// Every request completes exactly once with its own result.
#[test]
fn stress_threads() {
    let per_thread = 500_000 * scale();
    let nreq = 3u64;
    let ring = Ring::new(256).unwrap();
    let execs: Vec<_> = (0..2)
        .map(|_| {
            let r = ring.clone();
            std::thread::spawn(move || {
                r.exec(
                    &ExecOptions {
                        batch: 8,
                        ..Default::default()
                    },
                    echo_result,
                )
            })
        })
        .collect();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
    let reqs: Vec<_> = (0..nreq)
        .map(|t| {
            let r = ring.clone();
            std::thread::spawn(move || {
                let mut next = 0u64;
                let mut out = Vec::new();
                let mut mine = Vec::new();
                let mut batch = Vec::new();
                while next < per_thread {
                    batch.clear();
                    for _ in 0..(1 + next % 32).min(per_thread - next) {
                        let id = t << 40 | next;
                        batch.push(Call {
                            num: (next % 500) as u32,
                            args: [id, !id, 3, 4, 5, id ^ 77],
                            user_data: id,
                        });
                        next += 1;
                    }
                    let mut done = 0;
                    while done < batch.len() {
                        match r.submit_batch(&batch[done..]) {
                            Ok(k) => done += k,
                            Err(Error::Full) => {
                                let _ = r.wait(&mut out, 1, Some(Duration::from_millis(10)));
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    r.poll_batch(&mut out, usize::MAX);
                    mine.append(&mut out);
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in reqs {
        all.extend(join_within(t, Duration::from_secs(60)));
    }
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while ring.in_flight() > 0 {
        assert!(
            Instant::now() < end,
            "{} requests never completed",
            ring.in_flight()
        );
        let _ = ring.wait(&mut out, 1, Some(Duration::from_millis(100)));
    }
    all.extend(out);
    ring.exit(ExitMode::Drain);
    let mut executed = 0;
    for e in execs {
        executed += join_within(e, Duration::from_secs(10)).executed;
    }
    let total = per_thread * nreq;
    assert_eq!(all.len() as u64, total);
    assert_eq!(executed, total);
    let mut s = seen.lock().unwrap();
    for c in &all {
        assert!(s.insert(c.user_data), "duplicate completion {c:?}");
        let next = c.user_data & ((1 << 40) - 1);
        let id = c.user_data;
        check_echo(
            c,
            &Call {
                num: (next % 500) as u32,
                args: [id, !id, 3, 4, 5, id ^ 77],
                user_data: id,
            },
        );
    }
    assert_eq!(ring.errors(), ErrorCounts::default());
}

/// In-process hostile peer: a thread scribbles random values over the
/// shared area (typed atomic stores) while a requester and exec threads
/// run. No crash, no hang, errors counted.
#[test]
fn fuzz_peer_in_process() {
    let ring = Ring::with_policy(64, WaitPolicy::default()).unwrap();
    let execs: Vec<_> = (0..2)
        .map(|_| {
            let r = ring.clone();
            std::thread::spawn(move || {
                r.exec(
                    &ExecOptions {
                        batch: 4,
                        ..Default::default()
                    },
                    echo_result,
                )
            })
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fz = {
        let r = ring.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut seed = 0x1234_5678u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                r.fuzz_scribble(seed, 4);
                std::thread::sleep(Duration::from_micros(20));
            }
        })
    };
    let start = std::time::Instant::now();
    let mut completions = 0u64;
    let mut out = Vec::new();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_millis(1500) {
        let batch: Vec<Call> = (0..8)
            .map(|k| Call {
                num: 1,
                args: [i + k; 6],
                user_data: i + k,
            })
            .collect();
        i += 8;
        match ring.submit_batch(&batch) {
            Ok(_) | Err(Error::Full) | Err(Error::Exiting) => {}
            Err(e) => panic!("{e}"),
        }
        match ring.wait(&mut out, 1, Some(Duration::from_millis(2))) {
            Ok(_) | Err(Error::TimedOut) | Err(Error::Idle) | Err(Error::Closed) => {}
            Err(e) => panic!("{e}"),
        }
        completions += out.len() as u64;
        out.clear();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    join_within(fz, Duration::from_secs(10));
    ring.exit(ExitMode::Cancel);
    for e in execs {
        join_within(e, Duration::from_secs(10));
    }
    let errs = ring.errors();
    eprintln!("fuzz: {completions} completions, errors {errs:?}");
    assert!(errs.total() > 0, "the scribbler must have been noticed");
}
