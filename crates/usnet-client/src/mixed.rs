//! Threads asleep in a mixed wait (usnet sockets and kernel descriptors in one
//! `poll(2)`, `Conn::sleep_with_kernel`), and how each of them is woken.
//!
//! Such a thread sleeps on the session's eventfd, which the server writes once
//! after a change. When several threads sleep on it at once (HAProxy's threads,
//! each in an epoll set of its own with its wake-up pipe), the kernel wakes all of
//! them, but each looks at the counter again before it returns: the first to read
//! it empties it, and one that looks after that read finds nothing and sleeps on,
//! its socket ready, until its timeout (a second). So each sleeping thread also
//! polls an eventfd of its own, listed here while it sleeps, and the thread that
//! takes the server's write rings every other one listed. A thread lists itself
//! before it announces itself to the server (`WANT_EVENTFD`), so a write made
//! for it finds it listed.

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use usnet_shm::EventFd;

/// The own eventfds of the threads asleep on one session's eventfd.
#[derive(Default)]
pub(crate) struct Sleepers {
    fds: Mutex<Vec<RawFd>>,
}

/// A thread's place in [`Sleepers`], left when dropped.
pub(crate) struct Listed<'a> {
    list: &'a Sleepers,
    fd: RawFd,
}

impl Sleepers {
    /// Lists the thread whose own eventfd is `fd` until the guard goes.
    pub(crate) fn listed(&self, fd: RawFd) -> Listed<'_> {
        crate::conn::lock(&self.fds).push(fd);
        Listed { list: self, fd }
    }

    /// Rings every listed thread's eventfd but `own` (the caller's).
    pub(crate) fn wake_others(&self, own: Option<RawFd>) {
        for &fd in crate::conn::lock(&self.fds).iter() {
            if Some(fd) != own {
                ring(fd);
            }
        }
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let mut fds = crate::conn::lock(&self.list.fds);
        if let Some(i) = fds.iter().position(|&f| f == self.fd) {
            fds.swap_remove(i);
        }
    }
}

fn ring(fd: RawFd) {
    let v = 1u64;
    // SAFETY: writes 8 bytes from a local u64 to an eventfd a listed thread holds
    // open while it is listed; a non-blocking eventfd never blocks a writer.
    unsafe { libc::write(fd, (&v as *const u64).cast(), 8) };
}

thread_local! {
    /// This thread's own eventfd, and the process it was made in: a forked child's
    /// copy is its parent's open file, so the child makes its own.
    static OWN: RefCell<Option<(libc::pid_t, EventFd)>> = const { RefCell::new(None) };
}

/// This thread's own eventfd (made at its first mixed sleep, parked high among the
/// client's own descriptors); None if none can be had (the thread then sleeps as
/// before, woken by the session's eventfd alone).
pub(crate) fn own_wake() -> Option<RawFd> {
    // SAFETY: getpid has no preconditions and cannot fail.
    let pid = unsafe { libc::getpid() };
    OWN.try_with(|own| {
        let mut own = own.borrow_mut();
        if own.as_ref().is_none_or(|(p, _)| *p != pid) {
            // A parent's copy (after a fork) is closed as the new one replaces it:
            // the descriptor is this process's, the parent keeps its own.
            let flags = libc::EFD_NONBLOCK | libc::EFD_CLOEXEC;
            // SAFETY: no memory arguments; a non-negative result is ours.
            let fd = unsafe { libc::eventfd(0, flags) };
            if fd < 0 {
                *own = None;
                return None;
            }
            // SAFETY: just made, owned by nobody else.
            let fd = crate::lineage::park(unsafe { OwnedFd::from_raw_fd(fd) });
            *own = Some((pid, EventFd::from_fd(fd)));
        }
        own.as_ref().map(|(_, e)| e.as_raw_fd())
    })
    .ok()
    .flatten()
}

/// Takes the rings of this thread's own eventfd.
pub(crate) fn take_own() {
    let _ = OWN.try_with(|own| {
        if let Some((_, e)) = own.borrow().as_ref() {
            e.drain();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// The thread that takes the server's write rings the others listed, not
    /// itself, and a thread that left the list is not rung.
    #[test]
    fn the_thread_that_takes_the_wake_rings_the_others_asleep() {
        let list = Sleepers::default();
        let [a, b, c] = [(); 3].map(|_| EventFd::new().unwrap());
        let la = list.listed(a.as_raw_fd());
        let lb = list.listed(b.as_raw_fd());
        {
            let _lc = list.listed(c.as_raw_fd());
        }
        list.wake_others(Some(a.as_raw_fd()));
        assert!(!readable(a.as_raw_fd()), "not itself");
        assert!(readable(b.as_raw_fd()), "the other sleeper");
        assert!(!readable(c.as_raw_fd()), "not one that left");
        drop((la, lb));
        b.drain();
        list.wake_others(None);
        assert!(!readable(b.as_raw_fd()), "nobody listed: nobody rung");
    }

    /// A thread's own eventfd is made once, and made again in a forked child
    /// (whose copy is its parent's file).
    #[test]
    fn a_thread_keeps_its_own_eventfd() {
        let first = own_wake().expect("an eventfd");
        assert_eq!(own_wake(), Some(first));
        ring(first);
        assert!(readable(first));
        take_own();
        assert!(!readable(first));
    }
}
