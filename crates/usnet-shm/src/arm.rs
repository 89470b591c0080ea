//! The arm/kick handshake of a ring that its consumer stops watching: a stack server
//! watches a socket's send ring only while it has bytes, and fills a receive ring only
//! while it has room. When it stops, it *arms* a word in shared memory; the other side,
//! after it publishes bytes (or makes room), *takes* the word and, if it was armed,
//! posts a kick (a request the server reads at its next turn). No system call on the
//! data path, and no lost kick:
//!
//! ```text
//! watcher (stops watching)                 other side (after publishing)
//! armed.swap(1, SeqCst)                    prod.store(p, Release)   (publish)
//! fence(SeqCst)                  (F1)      fence(SeqCst)                    (F2)
//! if work() { armed.swap(0); go on }       if armed.swap(0) == 1 { kick }
//! else { stop watching }
//! ```
//!
//! It is Dekker's pattern: F1 and F2 are SeqCst fences, so in their single total order
//! one comes first. If F1 precedes F2, the other side's swap (after F2) reads the 1
//! stored before F1 (or a later value: only the other side clears it, apart from the
//! watcher's own withdrawal below) and kicks. If F2 precedes F1, the watcher's
//! `work()` check (after F1) sees the published counter (stored before F2) and goes
//! on watching. Both may happen (a watcher that goes on and a kick): a spare kick
//! costs one request and changes nothing. The withdrawal (`armed.swap(0)` after
//! finding work) can only erase an arm the watcher itself set, and it goes on
//! watching, so nothing waits on that arm.
//!
//! The functions are generic over [`ArmOps`] so the loom test runs this code, not a
//! copy of it (`tests/loom_arm.rs`: `RUSTFLAGS="--cfg loom" cargo test -p usnet-shm
//! --release --test loom_arm`).

use std::sync::atomic::{AtomicU32, Ordering};

/// The atomic operations the handshake needs (std's, or loom's in the model). Every
/// write of the word is a swap: a read-modify-write always reads the latest value in
/// the word's modification order, which keeps the word's history one chain (and lets
/// loom, whose modification order is otherwise partial, see it so). On x86-64 a
/// SeqCst store is an `xchg` anyway.
pub trait ArmOps {
    type Word;
    fn swap(w: &Self::Word, v: u32, o: Ordering) -> u32;
    /// A sequentially consistent fence.
    fn fence();
}

/// std atomics on shared memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdArm;

impl ArmOps for StdArm {
    type Word = AtomicU32;
    #[inline]
    fn swap(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
        w.swap(v, o)
    }
    #[inline]
    fn fence() {
        std::sync::atomic::fence(Ordering::SeqCst)
    }
}

/// Watcher: about to stop watching. Arms, fences (F1) and looks once more: `true`
/// when work appeared meanwhile (the arm is withdrawn; keep watching), `false` when
/// the watcher may stop (the other side will kick).
#[inline]
pub fn arm_or_continue<A: ArmOps>(armed: &A::Word, work: impl FnOnce() -> bool) -> bool {
    A::swap(armed, 1, Ordering::SeqCst);
    A::fence();
    if work() {
        A::swap(armed, 0, Ordering::Relaxed);
        true
    } else {
        false
    }
}

/// Other side: after publishing. Fences (F2) and takes the arm: `true` when the
/// watcher had stopped and must be kicked.
#[inline]
pub fn take_arm<A: ArmOps>(armed: &A::Word) -> bool {
    A::fence();
    A::swap(armed, 0, Ordering::AcqRel) == 1
}

/// [`arm_or_continue`] on a shared word.
#[inline]
pub fn arm(armed: &AtomicU32, work: impl FnOnce() -> bool) -> bool {
    arm_or_continue::<StdArm>(armed, work)
}

/// [`take_arm`] on a shared word.
#[inline]
pub fn take(armed: &AtomicU32) -> bool {
    take_arm::<StdArm>(armed)
}
