//! Threads asleep in a mixed wait (usnet sockets and kernel descriptors in one
//! `poll(2)`, `Conn::sleep_with_kernel`), and how each of them is woken.
//!
//! Such a thread sleeps on the session's eventfd, which the server writes once
//! after a change. When several threads sleep on it at once (HAProxy's threads,
//! each in an epoll set of its own with its wake-up pipe), the kernel wakes all of
//! them, but each looks at the counter again before it returns: the first to read
//! it empties it, and one that looks after that read finds nothing and sleeps on,
//! its socket ready, until its timeout (a second). So each sleeping thread also
//! polls an eventfd of its own for the length of its sleep, listed here, and the
//! thread that takes the server's write rings every other one listed. A thread
//! lists itself before it announces itself to the server (`WANT_EVENTFD`), so a
//! write made for it finds it listed.
//!
//! The eventfds belong to the session (a sleep takes a spare one and gives it back),
//! so a forked child, which makes a session of its own, never sleeps on one its
//! parent's threads ring.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use usnet_shm::EventFd;

use crate::conn::lock;

/// The eventfds of one session's threads in mixed sleeps.
#[derive(Default)]
pub(crate) struct Sleepers {
    fds: Mutex<Fds>,
}

#[derive(Default)]
struct Fds {
    /// Those of the threads asleep now.
    asleep: Vec<Arc<EventFd>>,
    /// Left by sleeps that ended, for the next ones.
    spare: Vec<Arc<EventFd>>,
}

/// A thread's place in [`Sleepers`] and its eventfd for this sleep; left (the
/// eventfd kept for a later sleep) when dropped.
pub(crate) struct Listed<'a> {
    list: &'a Sleepers,
    own: Arc<EventFd>,
}

impl Sleepers {
    /// Lists a thread about to sleep, with an eventfd of its own (a spare one, or a
    /// new one parked high among the client's own descriptors). None when no
    /// eventfd can be had: the thread then sleeps on the session's eventfd alone.
    pub(crate) fn listed(&self) -> Option<Listed<'_>> {
        let mut fds = lock(&self.fds);
        let own = match fds.spare.pop() {
            Some(e) => e,
            None => {
                let e = EventFd::new().ok()?;
                Arc::new(EventFd::from_fd(crate::lineage::park(e.into())))
            }
        };
        fds.asleep.push(own.clone());
        Some(Listed { list: self, own })
    }

    /// Rings the eventfd of every listed thread but `me` (the caller, if listed).
    pub(crate) fn wake_others(&self, me: Option<&Listed<'_>>) {
        for e in &lock(&self.fds).asleep {
            if !me.is_some_and(|m| Arc::ptr_eq(&m.own, e)) {
                e.ring();
            }
        }
    }
}

impl Listed<'_> {
    /// The eventfd to poll.
    pub(crate) fn fd(&self) -> RawFd {
        self.own.as_raw_fd()
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let mut fds = lock(&self.list.fds);
        if let Some(i) = fds.asleep.iter().position(|e| Arc::ptr_eq(e, &self.own)) {
            fds.asleep.swap_remove(i);
        }
        // The rings this sleep was woken by; one that comes later costs the next
        // sleep a turn at most.
        self.own.drain();
        fds.spare.push(self.own.clone());
    }
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
    /// itself, and a thread whose sleep ended is not rung.
    #[test]
    fn the_thread_that_takes_the_wake_rings_the_others_asleep() {
        let list = Sleepers::default();
        let a = list.listed().expect("an eventfd");
        let b = list.listed().expect("an eventfd");
        let gone = list.listed().expect("an eventfd").fd();
        assert!(a.fd() != b.fd() && a.fd() != gone && b.fd() != gone);
        list.wake_others(Some(&a));
        assert!(!readable(a.fd()), "not itself");
        assert!(readable(b.fd()), "the other sleeper");
        assert!(!readable(gone), "not one whose sleep ended");
        drop((a, b));
        list.wake_others(None);
        assert!(!readable(gone), "nobody listed: nobody rung");
    }

    /// A sleep reuses the eventfd an earlier one left, so a session has as many as
    /// it ever had threads asleep at once.
    #[test]
    fn sleeps_reuse_the_eventfds_of_earlier_ones() {
        let list = Sleepers::default();
        let first = list.listed().expect("an eventfd");
        let fd = first.fd();
        list.wake_others(None);
        drop(first);
        let again = list.listed().expect("an eventfd");
        assert_eq!(again.fd(), fd);
        assert!(!readable(fd), "the ring of the sleep that ended was taken");
    }
}
