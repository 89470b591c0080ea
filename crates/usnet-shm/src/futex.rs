//! futex(2) on 32-bit words that may live in memory shared with another process.
//!
//! All operations use shared futexes (no `FUTEX_PRIVATE_FLAG`): the kernel keys a
//! shared futex by the page behind the address, so a waiter in one process and a waker
//! in another meet on the same word. Every wait takes a timeout.
//!
//! [`FutexOps`] names the handful of operations the wake-up protocol in
//! [`crate::doorbell::Gate`] needs, so that the protocol exists once: [`SharedFutex`]
//! implements them with std atomics and the real futex; `usnet-async-syscall` implements them
//! with loom's atomics and a model futex, so loom checks the same protocol code.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::sys::timespec;

/// Why a wait returned. Callers re-check their condition whatever it says: a futex
/// wake-up may be spurious.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Woken by a `wake` (or spuriously).
    Woken,
    /// The word no longer held the expected value when the wait began.
    Changed,
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

fn outcome(r: libc::c_long) -> Wait {
    if r >= 0 {
        return Wait::Woken;
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Wait::Changed,
        Some(libc::ETIMEDOUT) => Wait::TimedOut,
        Some(libc::EINTR) => Wait::Interrupted,
        // EFAULT/EINVAL cannot happen for a live, aligned word; treat as a wake-up so
        // the caller re-checks.
        _ => Wait::Woken,
    }
}

/// Sleeps while `*word == expected`, for at most `timeout`. The kernel compares the word
/// and queues the waiter atomically with respect to [`wake`], so a change made before
/// the wait began is never slept through.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wait {
    let ts = timespec(timeout);
    // SAFETY: `word` is a live, 4-byte aligned AtomicU32 (in a shared mapping or our own
    // memory) for the duration of the call; FUTEX_WAIT only reads it. `ts` outlives the
    // call. Not FUTEX_PRIVATE_FLAG: the word may be shared with another process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    outcome(r)
}

/// Wakes up to `n` waiters on `word`; returns how many were woken.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    let n = n.min(i32::MAX as u32) as i32;
    // SAFETY: as in `wait`; FUTEX_WAKE only hashes the word's address to find waiters.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    r.max(0) as usize
}

/// `struct futex_waitv` of linux/futex.h.
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// FUTEX2_SIZE_U32 (the word is 32 bits; shared, since FUTEX2_PRIVATE is not set).
const FUTEX2_SIZE_U32: u32 = 0x02;
/// The kernel's limit on words per futex_waitv call.
pub const WAITV_MAX: usize = 128;

/// Why [`wait_any`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitAny {
    /// The word at this index was woken (others may have been too).
    Woken(usize),
    /// Some word no longer held its expected value when the wait began.
    Changed,
    TimedOut,
    Interrupted,
}

/// Sleeps until one of `words` is woken, for at most `timeout`: each `(word, expected)`
/// is compared and queued atomically, like [`wait`] on each of them at once
/// (futex_waitv, Linux 5.16+). At most [`WAITV_MAX`] words.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) -> io::Result<WaitAny> {
    if words.is_empty() || words.len() > WAITV_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "wait_any takes 1..=128 words",
        ));
    }
    let mut v = Vec::with_capacity(words.len());
    for (w, expected) in words {
        v.push(FutexWaitv {
            val: *expected as u64,
            uaddr: w.as_ptr() as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        });
    }
    // futex_waitv takes an absolute deadline on the clock it is given.
    let deadline = Duration::from_nanos(crate::sys::monotonic_ns()).saturating_add(timeout);
    let ts = timespec(deadline);
    // SAFETY: `v` holds `words.len()` initialised futex_waitv entries whose addresses are
    // live, aligned u32 words borrowed for the duration of the call; `ts` outlives it.
    // The kernel only reads both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            v.as_ptr(),
            v.len() as libc::c_uint,
            0u32,
            &ts as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r >= 0 {
        return Ok(WaitAny::Woken(r as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) => Ok(WaitAny::Changed),
        Some(libc::ETIMEDOUT) => Ok(WaitAny::TimedOut),
        Some(libc::EINTR) => Ok(WaitAny::Interrupted),
        _ => Err(e),
    }
}

/// The operations the wake-up protocol ([`crate::doorbell::Gate`]) runs on its two
/// words. Implemented here for std atomics and the real futex ([`SharedFutex`]), and by
/// `usnet-async-syscall` for loom's model, so loom checks the one protocol implementation.
pub trait FutexOps {
    type Word;
    fn load(w: &Self::Word, o: Ordering) -> u32;
    fn fetch_add(w: &Self::Word, v: u32, o: Ordering) -> u32;
    fn fetch_sub(w: &Self::Word, v: u32, o: Ordering) -> u32;
    /// A sequentially consistent fence.
    fn fence();
    /// Sleeps while `*w == expected`, at most `timeout` (see [`wait`]).
    fn wait(&self, w: &Self::Word, expected: u32, timeout: Duration);
    /// Wakes up to `n` waiters on `w` (see [`wake`]).
    fn wake(&self, w: &Self::Word, n: u32);
}

/// The real thing: std atomics and shared futexes.
#[derive(Debug, Default, Clone, Copy)]
pub struct SharedFutex;

impl FutexOps for SharedFutex {
    type Word = AtomicU32;
    #[inline]
    fn load(w: &AtomicU32, o: Ordering) -> u32 {
        w.load(o)
    }
    #[inline]
    fn fetch_add(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
        w.fetch_add(v, o)
    }
    #[inline]
    fn fetch_sub(w: &AtomicU32, v: u32, o: Ordering) -> u32 {
        w.fetch_sub(v, o)
    }
    #[inline]
    fn fence() {
        std::sync::atomic::fence(Ordering::SeqCst);
    }
    fn wait(&self, w: &AtomicU32, expected: u32, timeout: Duration) {
        wait(w, expected, timeout);
    }
    fn wake(&self, w: &AtomicU32, n: u32) {
        wake(w, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out_and_sees_a_changed_word() {
        let w = AtomicU32::new(5);
        let t = Instant::now();
        assert_eq!(wait(&w, 5, Duration::from_millis(30)), Wait::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert_eq!(wait(&w, 4, Duration::from_secs(5)), Wait::Changed);
        assert_eq!(wake(&w, 1), 0, "nobody waits");
    }

    #[test]
    fn two_threads_wake_each_other_within_a_deadline() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let deadline = Instant::now() + Duration::from_secs(20);
        let t = std::thread::spawn(move || {
            // Wait for 1, then answer 2.
            while w2.load(SeqCst) != 1 {
                assert!(Instant::now() < deadline, "never woken");
                wait(&w2, 0, Duration::from_millis(100));
            }
            w2.store(2, SeqCst);
            wake(&w2, 1);
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, SeqCst);
        wake(&w, 1);
        while w.load(SeqCst) != 2 {
            assert!(Instant::now() < deadline, "no answer");
            wait(&w, 1, Duration::from_millis(100));
        }
        t.join().unwrap();
    }

    #[test]
    fn wait_any_wakes_on_the_second_word() {
        let a = Arc::new(AtomicU32::new(0));
        let b = Arc::new(AtomicU32::new(0));
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.store(1, SeqCst);
            wake(&b2, 1);
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut woke = None;
        while b.load(SeqCst) == 0 {
            assert!(Instant::now() < deadline, "wait_any never returned for b");
            match wait_any(&[(&a, 0), (&b, 0)], Duration::from_millis(200)).unwrap() {
                WaitAny::Woken(i) => woke = Some(i),
                WaitAny::Changed | WaitAny::TimedOut | WaitAny::Interrupted => {}
            }
        }
        t.join().unwrap();
        assert!(matches!(woke, Some(1) | None), "{woke:?}");
        assert_eq!(
            wait_any(&[(&a, 0), (&b, 0)], Duration::from_secs(5)).unwrap(),
            WaitAny::Changed
        );
        let t = Instant::now();
        assert_eq!(
            wait_any(&[(&a, 0)], Duration::from_millis(20)).unwrap(),
            WaitAny::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert!(wait_any(&[], Duration::ZERO).is_err());
    }
}
