//! Exhaustive interleavings (loom) of the two wake-up handshakes of a stack server's
//! session, showing that no wake-up is lost. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p usnet-shm --release --test loom_arm`.
//!
//! 1. Streams: the server stops watching a socket's ring and arms `tx_armed`
//!    (`rx_armed`); the client publishes bytes (or room) and takes the arm to post a
//!    kick. This runs the real code, `usnet_shm::arm`, on loom's atomics.
//! 2. The server's sleep: it reads its bell's `seq`, sets `server_asleep` in the
//!    session, fences and looks for requests once more before sleeping on the bell
//!    (futex_waitv on `seq == seen`); a client publishes a request, fences, and rings
//!    (bumps `seq`, wakes) if it reads `server_asleep` set. A model of
//!    `usnet-server/src/lib.rs` (`run`) and `usnet-client/src/conn.rs`
//!    (`ring_server`), line for line.
//!
//! The server → client direction is `usnet_shm::doorbell::Gate` (the client announces
//! itself in `client_sleepers`), which usnet-async-syscall's loom tests check on a model futex.
#![cfg(loom)]

use std::sync::atomic::Ordering::{self, *};

use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
use loom::sync::Arc;
use loom::thread;
use usnet_shm::arm::{arm_or_continue, take_arm, ArmOps};

struct LoomArm;

impl ArmOps for LoomArm {
    type Word = AtomicU32;
    fn swap(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
        w.swap(v, o)
    }
    fn fence() {
        fence(SeqCst)
    }
}

/// The handshake without its fences: the store-buffering outcome (each side misses
/// the other's store) is allowed, and loom must find it.
struct Unfenced;

impl ArmOps for Unfenced {
    type Word = AtomicU32;
    fn swap(w: &AtomicU32, v: u32, _: Ordering) -> u32 {
        w.swap(v, Relaxed)
    }
    fn fence() {}
}

/// A client writes `writes` times into a ring the server is draining; the server
/// serves kicks, drains, and stops watching through the arm. After both, the server's
/// next turn (which a pending kick guarantees: handshake 2) must find nothing stranded.
fn stream<A: ArmOps<Word = AtomicU32> + 'static>(writes: u64, server_rounds: usize) {
    let prod = Arc::new(AtomicU64::new(0));
    let armed = Arc::new(AtomicU32::new(0));
    let kicks = Arc::new(AtomicU32::new(0));
    let client = {
        let (prod, armed, kicks) = (prod.clone(), armed.clone(), kicks.clone());
        thread::spawn(move || {
            for _ in 0..writes {
                // Publish (the client is the only writer of `prod`).
                let p = prod.load(Relaxed);
                prod.store(p + 1, Release);
                if take_arm::<A>(&armed) {
                    // The kick is a request in the submission ring.
                    kicks.fetch_add(1, Release);
                }
            }
        })
    };
    // The server: watching (the socket was active), drains, stops through the arm.
    let mut cons = 0u64;
    let mut watching = true;
    for _ in 0..server_rounds {
        if kicks.swap(0, AcqRel) > 0 {
            watching = true;
        }
        if !watching {
            continue;
        }
        cons = prod.load(Acquire);
        if !arm_or_continue::<A>(&armed, || prod.load(Acquire) > cons) {
            watching = false;
        }
    }
    client.join().unwrap();
    // The server's next turn.
    if kicks.swap(0, AcqRel) > 0 {
        watching = true;
    }
    if watching {
        cons = prod.load(Acquire);
    }
    assert_eq!(
        cons,
        prod.load(Acquire),
        "lost kick: bytes stranded in a ring the server does not watch"
    );
}

/// Runs `f` under loom; returns how many interleavings it explored.
fn model(f: impl Fn() + Sync + Send + 'static) -> usize {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    b.check(move || {
        r.fetch_add(1, Relaxed);
        f()
    });
    runs.load(Relaxed)
}

#[test]
fn loom_arm_kick_loses_no_bytes() {
    for (writes, rounds) in [(1, 2), (2, 2), (2, 3), (3, 3)] {
        let n = model(move || stream::<LoomArm>(writes, rounds));
        eprintln!("{writes} writes, {rounds} server rounds: {n} interleavings");
        assert!(n > 10, "the model explored only {n} interleavings");
    }
}

#[test]
fn loom_arm_kick_without_fences_is_caught() {
    // The model can fail: without F1/F2 a kick is lost in some interleaving.
    let r = std::panic::catch_unwind(|| model(|| stream::<Unfenced>(1, 1)));
    assert!(
        r.is_err(),
        "loom found no lost kick in the unfenced handshake"
    );
}

/// The server's sleep against a client's request. Returns whether the wake-up was
/// lost: the server sleeps on `seq == seen` with a request waiting and nobody moved
/// `seq` since it read it (a futex wait on `seen` would then block forever; a moved
/// `seq` makes it return at once or be woken by the ring that moved it).
fn doorbell(fenced: bool) {
    let sq_head = Arc::new(AtomicU32::new(0));
    let asleep = Arc::new(AtomicU32::new(0));
    let seq = Arc::new(AtomicU32::new(0));
    let client = {
        let (sq_head, asleep, seq) = (sq_head.clone(), asleep.clone(), seq.clone());
        thread::spawn(move || {
            // Conn::post: the request, then ring_server.
            sq_head.store(1, Release);
            if fenced {
                fence(SeqCst);
            }
            if asleep.load(Relaxed) != 0 {
                // FutexBell::ring: bump seq, then futex wake.
                seq.fetch_add(1, Release);
            }
        })
    };
    // run(): seq first, then announce in every session, fence, look once more.
    let seen = seq.load(Acquire);
    asleep.store(1, if fenced { SeqCst } else { Release });
    if fenced {
        fence(SeqCst);
    }
    let work = sq_head.load(if fenced { Acquire } else { Relaxed }) != 0;
    let sleeps = !work;
    client.join().unwrap();
    if sleeps {
        assert_ne!(
            seq.load(Acquire),
            seen,
            "lost wake-up: the server sleeps with a request waiting"
        );
    }
}

#[test]
fn loom_server_sleep_misses_no_request() {
    let n = model(|| doorbell(true));
    assert!(n > 3, "the model explored only {n} interleavings");
}

#[test]
fn loom_server_sleep_without_fences_is_caught() {
    let r = std::panic::catch_unwind(|| model(|| doorbell(false)));
    assert!(
        r.is_err(),
        "loom found no lost wake-up in the unfenced sleep"
    );
}
