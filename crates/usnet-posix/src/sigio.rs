//! Signal-driven I/O on usnet sockets: `O_ASYNC` (`F_SETFL`, `FIOASYNC`), the
//! owner (`F_SETOWN`, `F_SETOWN_EX`, `FIOSETOWN`, `SIOCSPGRP`) and the signal
//! (`F_SETSIG`).
//!
//! Linux signals a socket's owner from the socket's wake-up (`sock_wake_async` →
//! `kill_fasync`) each time data arrives, room opens or the connection changes
//! state. No kernel code runs for a usnet socket, so here a thread of the process,
//! started by the first `O_ASYNC` and gone once no socket has it, waits on every
//! such socket in edge mode (`usnet_client::Poller`: a change the server
//! published) and sends the signal: `SIGIO` by default (no extra information, as
//! the kernel's), or the `F_SETSIG` signal queued with `si_fd` and `si_band` set.
//! The kernel lets only a thread queue itself a signal with a kernel `si_code`, so
//! that one comes with `si_code` `SI_QUEUE` rather than `POLL_IN` and the rest;
//! programs read the band and the descriptor. A socket that gets `O_ASYNC` before
//! it connects or listens is watched from then on; setting it signals nothing by
//! itself, as on Linux.

use std::collections::{HashMap, HashSet};
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use usnet_client::{Interest, Mode, Poller};

use crate::{lock, Desc};

/// `F_SETSIG`, `F_GETSIG`, `F_SETOWN_EX`, `F_GETOWN_EX` (asm-generic/fcntl.h).
pub const F_SETSIG: i32 = 10;
pub const F_GETSIG: i32 = 11;
pub const F_SETOWN_EX: i32 = 15;
pub const F_GETOWN_EX: i32 = 16;
/// `f_owner_ex.type`.
pub const F_OWNER_TID: i32 = 0;
pub const F_OWNER_PID: i32 = 1;
pub const F_OWNER_PGRP: i32 = 2;
/// The socket ioctls for the owner (asm-generic/sockios.h), and `FIOASYNC`.
pub const FIOSETOWN: u64 = 0x8901;
pub const SIOCSPGRP: u64 = 0x8902;
pub const FIOGETOWN: u64 = 0x8903;
pub const SIOCGPGRP: u64 = 0x8904;
pub const FIOASYNC: u64 = 0x5452;

/// A description's signal-driven I/O settings (Linux keeps them per open file).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SigIo {
    /// `O_ASYNC`.
    pub on: bool,
    /// `F_OWNER_*` and the pid, process group or thread (0: no owner, no signal).
    pub owner_kind: i32,
    pub owner: i32,
    /// `F_SETSIG`'s signal (0: `SIGIO`, without extra information).
    pub sig: i32,
}

impl SigIo {
    /// `F_GETOWN`: a process as its pid, a group as minus its id.
    pub fn getown(&self) -> i32 {
        match self.owner_kind {
            F_OWNER_PGRP => -self.owner,
            _ => self.owner,
        }
    }

    /// `F_SETOWN`: a pid, or minus a process group's id.
    pub fn setown(&mut self, who: i32) {
        (self.owner_kind, self.owner) = if who < 0 {
            (F_OWNER_PGRP, who.saturating_neg())
        } else {
            (F_OWNER_PID, who)
        };
    }
}

/// The sockets watched: each with the number `O_ASYNC` was set on (`si_fd`).
#[derive(Default)]
struct Watched {
    socks: HashMap<u64, (Weak<Desc>, RawFd)>,
    next: u64,
    /// The process whose thread serves them (a forked child has none yet).
    thread_of: u32,
    /// Sockets whose state when `O_ASYNC` was set the thread has taken (or found
    /// not yet there to take: no slot before a connect or listen).
    looked_at: HashSet<u64>,
}

fn watched() -> &'static Mutex<Watched> {
    static W: OnceLock<Mutex<Watched>> = OnceLock::new();
    W.get_or_init(Mutex::default)
}

/// Rung when the thread has looked at new sockets.
fn looked() -> &'static Condvar {
    static C: Condvar = Condvar::new();
    &C
}

/// How long `O_ASYNC` waits for the thread's first look.
const FIRST_LOOK: Duration = Duration::from_secs(2);

/// `O_ASYNC` set on `desc` through number `fd`: watch it (once per description).
pub(crate) fn watch(desc: &Arc<Desc>, fd: RawFd) {
    let mut w = lock(watched());
    if w.socks
        .values()
        .any(|(d, _)| std::ptr::eq(d.as_ptr(), Arc::as_ptr(desc)))
    {
        return;
    }
    w.next += 1;
    let token = w.next;
    w.socks.insert(token, (Arc::downgrade(desc), fd));
    let me = std::process::id();
    if w.thread_of != me {
        let started = std::thread::Builder::new()
            .name("usnet-sigio".into())
            .spawn(serve);
        if started.is_ok() {
            w.thread_of = me;
        }
    }
    // The thread may be asleep on the sockets it had: it looks again. The call
    // returns once it has taken the socket's state, so what happens after it is
    // news (a connection that arrives right after `O_ASYNC` is signalled).
    let deadline = std::time::Instant::now() + FIRST_LOOK;
    while !w.looked_at.contains(&token) && w.thread_of == me {
        if let Ok(c) = crate::client() {
            c.wake_waiters();
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let step = left.min(Duration::from_millis(50));
        w = looked()
            .wait_timeout(w, step)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// `O_ASYNC` cleared on `desc`.
pub(crate) fn unwatch(desc: &Arc<Desc>) {
    lock(watched())
        .socks
        .retain(|_, (d, _)| !std::ptr::eq(d.as_ptr(), Arc::as_ptr(desc)));
}

/// The thread: registers what is watched, waits for changes, signals owners.
fn serve() {
    let mut poller = Poller::new();
    let mut registered: HashSet<u64> = HashSet::new();
    let mut events = Vec::new();
    // Rounds in a row with a socket that has no slot yet (looked at ever less often).
    let mut fresh_rounds = 0u32;
    loop {
        // What to watch now: registrations for new sockets that have a slot
        // (connected or listening), none for those gone or cleared.
        let socks = {
            let mut w = lock(watched());
            w.socks.retain(|_, (d, _)| d.strong_count() > 0);
            let Watched {
                socks, looked_at, ..
            } = &mut *w;
            looked_at.retain(|t| socks.contains_key(t));
            if w.socks.is_empty() {
                w.thread_of = 0;
                looked().notify_all();
                return;
            }
            w.socks.clone()
        };
        registered.retain(|t| {
            let kept = socks.contains_key(t);
            if !kept {
                let _ = poller.deregister(*t);
            }
            kept
        });
        let mut added = Vec::new();
        let mut unregistered = false;
        for (&t, (d, _)) in &socks {
            if registered.contains(&t) {
                continue;
            }
            let Some(d) = d.upgrade() else { continue };
            let interest = Interest {
                readable: true,
                writable: true,
            };
            if crate::poll::register(&mut poller, &d, t, interest, Mode::Edge).unwrap_or(false) {
                registered.insert(t);
                added.push(t);
            } else {
                unregistered = true;
            }
        }
        events.clear();
        if !added.is_empty() {
            // Their state now is no news: only a change after this is signalled.
            let _ = poller.wait(&mut events, Some(Duration::ZERO));
            events.retain(|e| !added.contains(&e.token));
        }
        {
            let mut w = lock(watched());
            let before = w.looked_at.len();
            w.looked_at.extend(socks.keys().copied());
            if w.looked_at.len() != before {
                looked().notify_all();
            }
        }
        if events.is_empty() {
            // A socket without a slot yet is looked at again soon (20 ms, then
            // less often up to about a second); the rest wake this thread when the
            // server publishes a change (or `watch` does).
            fresh_rounds = if unregistered { fresh_rounds + 1 } else { 0 };
            let wait = if unregistered {
                Duration::from_millis(20 << fresh_rounds.min(6))
            } else {
                Duration::from_secs(1)
            };
            if poller.is_empty() {
                std::thread::sleep(wait);
                continue;
            }
            if poller.wait(&mut events, Some(wait)).is_err() {
                std::thread::sleep(wait);
                continue;
            }
        }
        for e in &events {
            let Some((d, fd)) = socks.get(&e.token) else {
                continue;
            };
            let Some(d) = d.upgrade() else { continue };
            let s = *lock(&d.sigio);
            if s.on && s.owner != 0 {
                signal(&s, *fd, i64::from(crate::poll::poll_bits(e, -1)));
            }
        }
    }
}

/// Sends `s`'s signal to its owner for descriptor `fd`.
fn signal(s: &SigIo, fd: RawFd, band: i64) {
    let sig = if s.sig == 0 { libc::SIGIO } else { s.sig };
    // SAFETY: plain system calls on integers; `info` is a whole siginfo_t.
    unsafe {
        let me = libc::getpid();
        if s.sig == 0 || s.owner_kind == F_OWNER_PGRP {
            match s.owner_kind {
                F_OWNER_TID => libc::syscall(libc::SYS_tgkill, me, s.owner, sig),
                F_OWNER_PGRP => libc::kill(-s.owner, sig) as libc::c_long,
                _ => libc::kill(s.owner, sig) as libc::c_long,
            };
            return;
        }
        let mut info: libc::siginfo_t = std::mem::zeroed();
        info.si_signo = sig;
        info.si_code = libc::SI_QUEUE;
        // The SIGPOLL fields of the union: si_band (a long) then si_fd (an int).
        let fields = (&mut info as *mut libc::siginfo_t).cast::<u8>().add(16);
        std::ptr::write_unaligned(fields.cast::<i64>(), band);
        std::ptr::write_unaligned(fields.add(8).cast::<i32>(), fd);
        if s.owner_kind == F_OWNER_TID {
            libc::syscall(libc::SYS_rt_tgsigqueueinfo, me, s.owner, sig, &info);
        } else {
            libc::syscall(libc::SYS_rt_sigqueueinfo, s.owner, sig, &info);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_read_back_as_set() {
        let mut s = SigIo::default();
        assert_eq!(s.getown(), 0);
        s.setown(1234);
        assert_eq!(
            (s.owner_kind, s.owner, s.getown()),
            (F_OWNER_PID, 1234, 1234)
        );
        s.setown(-77);
        assert_eq!((s.owner_kind, s.owner, s.getown()), (F_OWNER_PGRP, 77, -77));
        s.setown(i32::MIN);
        assert_eq!(s.owner, i32::MAX);
    }
}
