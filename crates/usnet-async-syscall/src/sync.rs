//! Atomics, fences, threads and the futex: `std` and `usnet_shm` normally,
//! `loom` under `--cfg loom`.
//!
//! Only the words that take part in the cross-thread protocol (ring
//! positions, index cells, entry words, wait words, the control word) use
//! these types, so loom can explore every interleaving of the protocol.
//! The wake-up protocol itself is `usnet_shm::doorbell::Gate`, generic over
//! [`usnet_shm::futex::FutexOps`]: the ring runs it on the real futex, and
//! loom runs the same code on [`Futex`]'s model below.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64};

/// The futex the ring's wait words use: shared (cross-process) futexes.
#[cfg(not(loom))]
pub(crate) type Futex = usnet_shm::futex::SharedFutex;
#[cfg(loom)]
pub(crate) use model::Futex;

/// A hint inside spin loops (under loom: a yield, so the model makes progress).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

#[cfg(loom)]
mod model {
    use super::AtomicU32;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// The futex modelled by a mutex + condvar per word with the kernel's
    /// contract: `wait` sleeps only if the word still holds `expected` at the
    /// moment it is queued, atomically with respect to `wake`. Timeouts are
    /// not modelled (loom has no time): a lost wake-up is a deadlock, which
    /// loom reports.
    #[derive(Default)]
    pub(crate) struct Futex {
        m: loom::sync::Mutex<()>,
        cv: loom::sync::Condvar,
    }

    impl usnet_shm::futex::FutexOps for Futex {
        type Word = AtomicU32;
        fn load(w: &AtomicU32, o: Ordering) -> u32 {
            w.load(o)
        }
        fn fetch_add(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
            w.fetch_add(v, o)
        }
        fn fetch_sub(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
            w.fetch_sub(v, o)
        }
        fn fence() {
            super::fence(Ordering::SeqCst);
        }
        fn wait(&self, w: &AtomicU32, expected: u32, _timeout: Duration) {
            let g = self.m.lock().unwrap();
            // The check happens under the lock the waker must take, which makes
            // "check value, then sleep" atomic with respect to `wake`, like the
            // kernel's hash-bucket lock.
            if w.load(Ordering::SeqCst) != expected {
                return;
            }
            let _g = self.cv.wait(g).unwrap();
        }
        fn wake(&self, _w: &AtomicU32, _n: u32) {
            let _g = self.m.lock().unwrap();
            self.cv.notify_all();
        }
    }
}
