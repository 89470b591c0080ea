//! Exhaustive interleaving checks with loom. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p usnet-async-syscall --release --lib loom`.
//!
//! Spinning is disabled under loom, so every wait goes through the
//! announce / fence / re-check / futex path: a lost wake-up shows up as a
//! loom deadlock ("all threads blocked").

use crate::ring::{Call, Completion, ExecOptions, ExitMode, Ring, WaitPolicy};
use loom::sync::atomic::{AtomicU32, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b.check(f);
}

fn call(i: u64) -> Call {
    Call {
        num: 7,
        args: [i, 0, 0, 0, 0, 0],
        user_data: i,
    }
}

fn opts() -> ExecOptions {
    ExecOptions {
        batch: 1,
        wait: WaitPolicy::SLEEP,
    }
}

/// Check a set of completions: each user_data 0..n exactly once, result
/// either the handler's (`arg0 + 100`) or -ECANCELED if `allow_cancel`.
fn check(c: &[Completion], n: u64, allow_cancel: bool) {
    let mut seen = vec![false; n as usize];
    for x in c {
        assert!(!seen[x.user_data as usize], "completed twice: {x:?}");
        seen[x.user_data as usize] = true;
        let ok = x.result == x.user_data as i64 + 100
            || (allow_cancel && x.result == -(libc::ECANCELED as i64));
        assert!(ok, "bad result {x:?}");
    }
    assert!(seen.iter().all(|&s| s), "missing completion: {c:?}");
}

/// Submit, sleep-wait for completion, exit: no lost wake-up in either
/// direction, each request completed exactly once.
#[test]
fn loom_submit_wait_one_exec() {
    model(|| {
        let ring = Ring::with_policy(2, WaitPolicy::SLEEP).unwrap();
        let r2 = ring.clone();
        let ran = Arc::new(AtomicU32::new(0));
        let ran2 = ran.clone();
        let t = thread::spawn(move || {
            r2.exec(&opts(), |req| {
                ran2.fetch_add(1, SeqCst);
                req.args[0] as i64 + 100
            })
        });
        ring.submit(&call(0)).unwrap();
        let c = ring.wait_one(None).unwrap();
        check(&[c], 1, false);
        ring.exit(ExitMode::Drain);
        let st = t.join().unwrap();
        assert_eq!(st.executed, 1);
        assert_eq!(ran.load(SeqCst), 1);
    });
}

/// Two exec threads, a batch of two requests: no request runs twice, both
/// complete, wakeup() returns once at least one is done.
#[test]
fn loom_two_exec_threads_batch() {
    model(|| {
        let ring = Ring::with_policy(2, WaitPolicy::SLEEP).unwrap();
        let ran = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let r = ring.clone();
                let ran = ran.clone();
                thread::spawn(move || {
                    r.exec(&opts(), |req| {
                        ran[req.args[0] as usize].fetch_add(1, SeqCst);
                        req.args[0] as i64 + 100
                    })
                })
            })
            .collect();
        assert_eq!(ring.submit_batch(&[call(0), call(1)]).unwrap(), 2);
        let mut out = Vec::new();
        assert!(ring.wakeup(&mut out).unwrap() >= 1);
        while out.len() < 2 {
            ring.wait(&mut out, 1, None).unwrap();
        }
        check(&out, 2, false);
        ring.exit(ExitMode::Drain);
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(ran[0].load(SeqCst), 1);
        assert_eq!(ran[1].load(SeqCst), 1);
    });
}

/// exit(Cancel) racing with pending work and a running exec thread: every
/// request completes exactly once (run or -ECANCELED), the exec thread
/// returns, the waiter is woken and then sees Closed.
#[test]
fn loom_exit_with_work_pending() {
    model(|| {
        let ring = Ring::with_policy(2, WaitPolicy::SLEEP).unwrap();
        let r2 = ring.clone();
        let t = thread::spawn(move || r2.exec(&opts(), |req| req.args[0] as i64 + 100));
        assert_eq!(ring.submit_batch(&[call(0), call(1)]).unwrap(), 2);
        let r3 = ring.clone();
        let exiter = thread::spawn(move || r3.exit(ExitMode::Cancel));
        let mut out = Vec::new();
        loop {
            match ring.wait(&mut out, 1, None) {
                Ok(_) => {}
                Err(crate::Error::Closed) | Err(crate::Error::Idle) => break,
                Err(e) => panic!("{e}"),
            }
        }
        exiter.join().unwrap();
        let st = t.join().unwrap();
        // Whatever the exec thread did not take was cancelled by it or is
        // still queued (exec thread saw exit first): the requester cancels.
        ring.cancel_pending();
        ring.poll_batch(&mut out, 8);
        check(&out, 2, true);
        assert!(st.executed + st.cancelled <= 2);
    });
}

/// A submission racing with exit (Drain) is never stranded: either the
/// exec thread runs it, or the submitter sees the exit and cancels it, or
/// the submit is refused.
#[test]
fn loom_submit_races_exit() {
    model(|| {
        let ring = Ring::with_policy(2, WaitPolicy::SLEEP).unwrap();
        let r2 = ring.clone();
        let t = thread::spawn(move || r2.exec(&opts(), |req| req.args[0] as i64 + 100));
        let r3 = ring.clone();
        let exiter = thread::spawn(move || r3.exit(ExitMode::Drain));
        let submitted = ring.submit(&call(0)).is_ok();
        exiter.join().unwrap();
        t.join().unwrap();
        if submitted {
            // No exec thread is left: the completion must already be there.
            let c = ring.poll().expect("stranded request");
            check(&[c], 1, true);
        }
        assert_eq!(ring.in_flight(), 0);
    });
}
