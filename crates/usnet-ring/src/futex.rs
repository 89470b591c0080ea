//! futex(2) wait/wake on a 32-bit word in the (possibly cross-process)
//! request area. Under loom the futex is emulated by a mutex + condvar with
//! the same contract: `wait` sleeps only if the word still holds `expected`
//! at the moment it is queued, atomically with respect to `wake`.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Per-word futex handle. Zero-sized for the real futex; under loom it holds
/// the emulation's mutex and condvar.
#[derive(Default)]
pub(crate) struct Futex {
    #[cfg(loom)]
    m: loom::sync::Mutex<()>,
    #[cfg(loom)]
    cv: loom::sync::Condvar,
}

#[cfg(not(loom))]
impl Futex {
    /// Sleep while `*word == expected` (or until `timeout`, or a spurious
    /// wake-up). Callers re-check their condition in a loop.
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
        let ts;
        let tsp = match timeout {
            Some(d) => {
                ts = libc::timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                };
                &ts as *const libc::timespec
            }
            None => std::ptr::null(),
        };
        // SAFETY: `word` is a live, 4-byte aligned AtomicU32 (in the shared
        // mapping or in our memory); FUTEX_WAIT only reads it. Not
        // FUTEX_PRIVATE_FLAG: the word may be shared with another process.
        // Errors (EAGAIN: value changed, EINTR, ETIMEDOUT) all mean "return
        // and re-check", so the result is ignored.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                tsp,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wake up to `n` sleepers on `word`.
    pub(crate) fn wake(&self, word: &AtomicU32, n: i32) {
        // SAFETY: as in `wait`; FUTEX_WAKE does not access the word's memory
        // beyond hashing its address.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

#[cfg(loom)]
impl Futex {
    pub(crate) fn wait(&self, word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
        use std::sync::atomic::Ordering::SeqCst;
        let g = self.m.lock().unwrap();
        // The check happens under the lock the waker must take, which makes
        // "check value, then sleep" atomic with respect to `wake`, like the
        // kernel's hash-bucket lock.
        if word.load(SeqCst) != expected {
            return;
        }
        let _g = self.cv.wait(g).unwrap();
    }

    pub(crate) fn wake(&self, _word: &AtomicU32, _n: i32) {
        let _g = self.m.lock().unwrap();
        self.cv.notify_all();
    }
}
