//! The client library's lock order, and its check in debug builds.
//!
//! A thread takes these locks only in increasing [`Rank`]: a socket's send ring
//! (`ClientSocket::tx`, held for a whole write as Linux holds the socket's lock, so the
//! write's request goes out under it), then the session's submission queue
//! (`Conn::submit`), then its completion table (`Conn::comp`). Every other lock of
//! the library is a leaf, taken with none of its own held after it: a socket's
//! receive ring (`ClientSocket::rx`, released before any request), its timeouts, the
//! session's `wants` and `zc` tables, virtual time's state.
//!
//! [`lock`] takes a ranked lock; in debug builds, and with the `lock-order-check`
//! feature (which this crate's and usnet-posix's tests turn on, so the release-mode
//! test suite checks it too), it checks per thread that the rank is above every
//! ranked lock the thread holds, so a change that takes them the other way panics
//! in the first test that runs it instead of deadlocking one day under load.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// Where a lock stands in the order (lower first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    SockTx = 1,
    Submit = 2,
    Completions = 3,
}

#[cfg(any(debug_assertions, feature = "lock-order-check"))]
thread_local! {
    static HELD: std::cell::RefCell<Vec<Rank>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A held ranked lock; the rank is released with it.
pub(crate) struct Ranked<'a, T> {
    guard: MutexGuard<'a, T>,
    #[cfg(any(debug_assertions, feature = "lock-order-check"))]
    rank: Rank,
}

/// Takes `m`, of rank `rank` (a poisoned lock is taken as it is: the data it
/// guards is rings and tables that stay consistent between statements).
#[cfg_attr(
    not(any(debug_assertions, feature = "lock-order-check")),
    allow(unused_variables)
)]
pub(crate) fn lock<T>(m: &Mutex<T>, rank: Rank) -> Ranked<'_, T> {
    #[cfg(any(debug_assertions, feature = "lock-order-check"))]
    HELD.with(|h| {
        let h = &mut *h.borrow_mut();
        if let Some(top) = h.iter().max() {
            assert!(
                rank > *top,
                "lock order: {rank:?} taken while holding {top:?} (see usnet-client/src/lockorder.rs)"
            );
        }
        h.push(rank);
    });
    Ranked {
        guard: m.lock().unwrap_or_else(|p| p.into_inner()),
        #[cfg(any(debug_assertions, feature = "lock-order-check"))]
        rank,
    }
}

impl<T> Drop for Ranked<'_, T> {
    fn drop(&mut self) {
        #[cfg(any(debug_assertions, feature = "lock-order-check"))]
        HELD.with(|h| {
            let h = &mut *h.borrow_mut();
            if let Some(i) = h.iter().rposition(|r| *r == self.rank) {
                h.remove(i);
            }
        });
    }
}

impl<T> Deref for Ranked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Ranked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_kept() {
        let (a, b, c) = (Mutex::new(1), Mutex::new(2), Mutex::new(3));
        let x = lock(&a, Rank::SockTx);
        let y = lock(&b, Rank::Submit);
        drop(y);
        let z = lock(&c, Rank::Completions);
        assert_eq!(*x + *z, 4);
        drop(x);
        drop(z);
        // Released in any order, the next one starts from nothing held.
        let _again = lock(&b, Rank::Submit);
    }

    #[test]
    #[cfg(any(debug_assertions, feature = "lock-order-check"))]
    #[should_panic(expected = "lock order")]
    fn the_other_way_panics_in_debug_builds() {
        let (a, b) = (Mutex::new(()), Mutex::new(()));
        let _c = lock(&a, Rank::Completions);
        let _s = lock(&b, Rank::Submit);
    }
}
