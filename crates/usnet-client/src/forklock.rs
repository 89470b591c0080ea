//! Locks that a forking thread holds across the `fork`, reading and changing what
//! they guard through its hold meanwhile.
//!
//! Why: a lock another thread holds at a fork's instant stays held forever in the
//! child, where its holder does not exist. So the prepare handler of
//! `pthread_atfork` takes the layer's few process-wide locks and the parent's and
//! the child's handlers let them go, as glibc does with malloc's arenas. Between the
//! two, the forking thread's own socket calls (a close or a new socket in another
//! library's fork handler) must not wait for the lock it holds: they go through the
//! hold. Every other thread waits for the lock as usual.
//!
//! The holder is told by `pthread_self`, which a thread keeps across the fork (the
//! child's handlers run in the same thread) and which can be read at any time, even
//! while the thread's locals are being destroyed. Outside a fork the only cost is
//! one atomic load per access.

use std::cell::UnsafeCell;
use std::ops::DerefMut;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockWriteGuard, TryLockError};

/// A lock's guard, kept by the thread holding it across a fork.
struct Hold<G> {
    /// `pthread_self` of the holding thread; 0: nobody holds it.
    holder: AtomicUsize,
    /// The holder is inside [`Hold::through`]: a nested call must not reach the
    /// guard a second time (it waits for the lock instead, as before the hold).
    busy: AtomicBool,
    guard: UnsafeCell<Option<G>>,
}

// SAFETY: `guard` is only touched by the thread named in `holder` (`keep`, `through`
// and `release` check it), which set it; every other thread sees `holder` differ and
// never reaches it.
unsafe impl<G> Sync for Hold<G> {}

fn me() -> usize {
    // SAFETY: no preconditions; a thread's handle is never 0.
    unsafe { libc::pthread_self() as usize }
}

impl<G: DerefMut> Hold<G> {
    const fn new() -> Self {
        Hold {
            holder: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            guard: UnsafeCell::new(None),
        }
    }

    /// Keeps `g` (a guard of the lock, so no other thread can hold it now).
    fn keep(&self, g: G) {
        // SAFETY: only the lock's owner gets here, and it has not published itself
        // yet, so nobody else reads `guard`.
        unsafe { *self.guard.get() = Some(g) };
        self.holder.store(me(), Release);
    }

    fn is_mine(&self) -> bool {
        let h = self.holder.load(Acquire);
        h != 0 && h == me()
    }

    /// Runs `f` through this thread's hold; `None` if it holds nothing (or is
    /// already inside the hold).
    fn through<R>(&self, f: impl FnOnce(&mut G::Target) -> R) -> Option<R> {
        if !self.is_mine() || self.busy.swap(true, Relaxed) {
            return None;
        }
        // SAFETY: this thread is the holder and `busy` keeps the borrow unique.
        let r = unsafe { (*self.guard.get()).as_deref_mut().map(f) };
        self.busy.store(false, Relaxed);
        r
    }

    /// Lets go of this thread's hold (nothing if it holds nothing).
    fn release(&self) {
        if !self.is_mine() || self.busy.load(Relaxed) {
            return;
        }
        // SAFETY: this thread is the holder and is not inside `through`.
        let g = unsafe { (*self.guard.get()).take() };
        self.holder.store(0, Release);
        drop(g);
    }
}

/// A guard from a `try_lock`, a poisoned lock's included.
fn taken<G>(r: Result<G, TryLockError<G>>) -> Option<G> {
    match r {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// A `RwLock` that a forking thread can hold across the fork (see the module).
pub struct ForkRwLock<T: 'static> {
    lock: RwLock<T>,
    hold: Hold<RwLockWriteGuard<'static, T>>,
}

impl<T: 'static> ForkRwLock<T> {
    pub const fn new(v: T) -> Self {
        ForkRwLock {
            lock: RwLock::new(v),
            hold: Hold::new(),
        }
    }

    /// Reads the value (through this thread's hold, if it has one).
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let mut f = Some(f);
        if let Some(Some(r)) = self.hold.through(|v| f.take().map(|f| f(v))) {
            return r;
        }
        (f.expect("not run"))(&self.lock.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Changes the value (as [`ForkRwLock::read`]).
    pub fn write<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut f = Some(f);
        if let Some(Some(r)) = self.hold.through(|v| f.take().map(|f| f(v))) {
            return r;
        }
        (f.expect("not run"))(&mut self.lock.write().unwrap_or_else(|p| p.into_inner()))
    }

    /// The write lock if it is free now (a forked child's rebuild only tries).
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        taken(self.lock.try_write())
    }

    /// For a fork about to happen: takes the write lock if it is free (one try) and
    /// holds it in this thread until [`ForkRwLock::release`]. Whether it is held.
    pub fn try_hold(&'static self) -> bool {
        taken(self.lock.try_write())
            .map(|g| self.hold.keep(g))
            .is_some()
    }

    /// Lets go of this thread's hold (nothing if it holds nothing).
    pub fn release(&self) {
        self.hold.release();
    }
}

// SAFETY: the guard a hold keeps is never moved with the lock: holding needs a
// `&'static` borrow of it, after which it cannot be moved at all. Otherwise this is
// the `RwLock` and an empty hold.
unsafe impl<T: Send> Send for ForkRwLock<T> {}

/// A `Mutex` that a forking thread can hold across the fork (see the module).
pub struct ForkMutex<T: 'static> {
    lock: Mutex<T>,
    hold: Hold<MutexGuard<'static, T>>,
}

impl<T: 'static> ForkMutex<T> {
    pub const fn new(v: T) -> Self {
        ForkMutex {
            lock: Mutex::new(v),
            hold: Hold::new(),
        }
    }

    /// Runs `f` on the value under the lock (through this thread's hold, if it has one).
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut f = Some(f);
        if let Some(Some(r)) = self.hold.through(|v| f.take().map(|f| f(v))) {
            return r;
        }
        (f.expect("not run"))(&mut self.lock.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        taken(self.lock.try_lock())
    }

    /// As [`ForkRwLock::try_hold`].
    pub fn try_hold(&'static self) -> bool {
        taken(self.lock.try_lock())
            .map(|g| self.hold.keep(g))
            .is_some()
    }

    /// Lets go of this thread's hold (nothing if it holds nothing).
    pub fn release(&self) {
        self.hold.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    static L: ForkRwLock<Vec<u32>> = ForkRwLock::new(Vec::new());
    static M: ForkMutex<u32> = ForkMutex::new(0);

    /// Runs `f` in another thread and says whether it finished within a second
    /// (it waits for the lock otherwise; the thread is left to finish later).
    fn finishes_elsewhere(f: impl FnOnce() + Send + 'static) -> bool {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(1)).is_ok()
    }

    /// Runs `f` in a thread of its own and waits for it at most five seconds:
    /// `None` if it hung (waiting for a lock it holds itself, say).
    fn in_time<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    #[test]
    fn the_holder_goes_through_its_hold_and_other_threads_wait_for_it() {
        let seen = in_time(|| {
            assert!(L.try_hold());
            // Another thread is not the holder: a hold is refused to it.
            assert!(!in_time(|| L.try_hold()).expect("a try returns"));
            // The holder reads and changes through its hold instead of waiting for
            // the lock it holds.
            L.write(|v| v.push(7));
            let n = L.read(|v| v.len());
            // Another thread waits for the lock until the holder lets go.
            let waited = !finishes_elsewhere(|| L.write(|v| v.push(8)));
            L.release();
            (n, waited)
        });
        assert_eq!(
            seen,
            Some((1, true)),
            "the holder hung or another thread got in"
        );
        // Released: the waiting writer gets in.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while L.read(|v| v.len()) < 2 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(L.read(|v| v.clone()), vec![7, 8]);
    }

    #[test]
    fn a_mutex_held_across_a_fork_is_used_through_the_hold() {
        let seen = in_time(|| {
            assert!(M.try_hold());
            M.with(|v| *v += 1);
            let waited = !finishes_elsewhere(|| M.with(|v| *v += 10));
            // Releasing from another thread lets go of nothing.
            assert!(finishes_elsewhere(|| M.release()));
            let still = M.try_lock().is_none();
            M.release();
            (waited, still)
        });
        assert_eq!(seen, Some((true, true)));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while M.with(|v| *v) != 11 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(M.with(|v| *v), 11);
    }
}
