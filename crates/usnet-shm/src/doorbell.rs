//! Doorbells: wake-ups another thread or process rings.
//!
//! * [`EventFd`]: a kernel counter behind a descriptor. Pollable, so it can sit in a
//!   poll or epoll set next to kernel fds (a TAP, a socket, an application's own fds).
//! * [`FutexBell`]: a futex word in a [`Region`], for peers that share memory anyway
//!   and want a wake-up without a descriptor.
//!
//! Ringing costs a system call either way, so a producer should ring only when the
//! consumer may be asleep. [`Gate`] is the protocol that makes that safe: the consumer
//! announces that it may sleep, fences, re-checks for work and only then sleeps; the
//! producer publishes, fences, and rings only if someone announced. The argument that
//! no wake-up is lost is written next to [`Gate::sleep`] and [`Gate::notify`].

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

use crate::futex::{FutexOps, SharedFutex};
use crate::{sys, RangeError, Region};

/// An eventfd doorbell: `ring` from anywhere, `poll_fds` (or epoll) on the fd, `drain`
/// after waking.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A non-blocking, close-on-exec eventfd with nothing pending.
    pub fn new() -> std::io::Result<EventFd> {
        Ok(EventFd {
            fd: sys::eventfd()?,
        })
    }

    /// An eventfd another process made and passed over (`fdpass`): it must be
    /// non-blocking, as [`EventFd::new`] makes them, for `ring` and `drain` never to
    /// block (the flag belongs to the open file, which the passing keeps).
    pub fn from_fd(fd: OwnedFd) -> EventFd {
        EventFd { fd }
    }

    /// Makes the fd readable until the next `drain`. Never blocks.
    pub fn ring(&self) {
        sys::eventfd_add(self.fd.as_fd());
    }

    /// Resets the counter, so the next poll blocks again; returns how many rings were
    /// pending (0: none).
    pub fn drain(&self) -> u64 {
        sys::eventfd_take(self.fd.as_fd())
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The descriptor itself (to move it, as a client parks its own descriptors high).
impl From<EventFd> for OwnedFd {
    fn from(e: EventFd) -> OwnedFd {
        e.fd
    }
}

/// The wake-up protocol on two words: `seq`, the futex word ringers bump, and
/// `sleepers`, how many consumers announced they may sleep (the "needs wake-up" flag is
/// `sleepers != 0`). The words may live in a region shared with another process, and may
/// sit on different cache lines (each is written mostly by one side).
///
/// ```text
/// consumer (Gate::sleep)                   producer (Gate::notify)
/// s = seq (before looking for work)        publish work (e.g. a Release index store)
/// sleepers += 1                            fence(SeqCst)                    (F2)
/// fence(SeqCst)                  (F1)      if sleepers != 0 {
/// if work visible: skip the sleep              seq += 1
/// else FUTEX_WAIT(seq, s)                      FUTEX_WAKE(seq)
/// sleepers -= 1                            }
/// ```
///
/// F1 and F2 are both in the single total order S of SeqCst operations. If F1 comes
/// first, the producer's load of `sleepers` (after F2) sees the increment (before F1),
/// so it bumps `seq` and wakes: the consumer's FUTEX_WAIT either finds `seq != s` and
/// returns at once (the kernel compares and queues under one lock), or it is already
/// queued and is woken. If F2 comes first, the consumer's re-check (after F1) sees the
/// published work and it does not sleep. Either way no wake-up is lost. Without either
/// fence the store buffer may let the `sleepers` load pass the publication (x86 allows
/// exactly that reordering), which is liburing's SQPOLL need-wakeup bug: the submitter
/// read a stale "poller awake" flag after writing the SQ tail.
///
/// Nothing here trusts the words: a peer that scribbles on them can cause a spurious
/// wake-up or a missed one, and every sleep has a timeout, so the worst case is a late
/// wake-up, never a hang.
pub struct Gate<'a, F: FutexOps = SharedFutex> {
    seq: &'a F::Word,
    sleepers: &'a F::Word,
    fx: &'a F,
}

impl<'a> Gate<'a, SharedFutex> {
    /// A gate on two std atomics (usually in a [`Region`]) with the real futex.
    pub fn new(seq: &'a AtomicU32, sleepers: &'a AtomicU32) -> Self {
        Gate {
            seq,
            sleepers,
            fx: &SharedFutex,
        }
    }
}

impl<'a, F: FutexOps> Gate<'a, F> {
    /// A gate whose futex is `fx` (the loom model in usnet-async-syscall's tests).
    pub fn with_futex(seq: &'a F::Word, sleepers: &'a F::Word, fx: &'a F) -> Self {
        Gate { seq, sleepers, fx }
    }

    /// The current `seq`. A consumer reads it *before* it looks for work and passes it to
    /// [`Gate::sleep`]; a ring between the two then makes the sleep return at once.
    #[inline]
    pub fn seq(&self) -> u32 {
        F::load(self.seq, Acquire)
    }

    /// Consumer half: announce, fence (F1), re-check `ready`, sleep while `seq` still
    /// equals `seen`, for at most `timeout`. Returns whether it went to sleep. Callers
    /// re-check their condition afterwards (wake-ups may be spurious, and a timeout
    /// looks the same as a ring).
    pub fn sleep(&self, seen: u32, ready: impl FnOnce() -> bool, timeout: Duration) -> bool {
        F::fetch_add(self.sleepers, 1, SeqCst);
        // F1: orders the announcement before the re-check.
        F::fence();
        let slept = !ready();
        if slept {
            self.fx.wait(self.seq, seen, timeout);
        }
        F::fetch_sub(self.sleepers, 1, Release);
        slept
    }

    /// Producer half, after publishing work: fence (F2), then wake up to `n` sleepers if
    /// any announced themselves. Returns whether it rang (a system call).
    #[inline]
    pub fn notify(&self, n: u32) -> bool {
        // F2: orders the caller's publication before the `sleepers` load.
        F::fence();
        if F::load(self.sleepers, Relaxed) != 0 {
            F::fetch_add(self.seq, 1, Release);
            self.fx.wake(self.seq, n);
            true
        } else {
            false
        }
    }

    /// For a `seq` that counts events (an interrupt line): bump it always, and wake up
    /// to `n` sleepers if any announced themselves. The SeqCst increment and the SeqCst
    /// load take F2's place: if the load misses the announcement, the increment comes
    /// before F1 in S, so the consumer's read of `seq` after F1 (its re-check, or the
    /// kernel's compare) sees it. Returns whether it rang.
    #[inline]
    pub fn bump_and_notify(&self, n: u32) -> bool {
        F::fetch_add(self.seq, 1, SeqCst);
        if F::load(self.sleepers, SeqCst) != 0 {
            self.fx.wake(self.seq, n);
            true
        } else {
            false
        }
    }

    /// Rings whether or not anyone announced: bump `seq` and wake up to `n` sleepers (a
    /// waker, or an exit that every waiter must see).
    pub fn ring(&self, n: u32) {
        F::fetch_add(self.seq, 1, SeqCst);
        self.fx.wake(self.seq, n);
    }
}

/// A futex doorbell in a [`Region`]: a [`Gate`] on two words at fixed offsets. Cheap to
/// clone; clones ring the same bell.
#[derive(Clone)]
pub struct FutexBell {
    region: Arc<Region>,
    seq: usize,
    sleepers: usize,
}

impl std::fmt::Debug for FutexBell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FutexBell")
            .field("seq", &self.seq)
            .field("sleepers", &self.sleepers)
            .finish()
    }
}

impl FutexBell {
    /// The bell whose `seq` word is at `seq_off` and `sleepers` word at `sleepers_off`.
    pub fn new(
        region: Arc<Region>,
        seq_off: usize,
        sleepers_off: usize,
    ) -> Result<FutexBell, RangeError> {
        region.at::<AtomicU32>(seq_off)?;
        region.at::<AtomicU32>(sleepers_off)?;
        Ok(FutexBell {
            region,
            seq: seq_off,
            sleepers: sleepers_off,
        })
    }

    /// The protocol on this bell's words.
    #[inline]
    pub fn gate(&self) -> Gate<'_> {
        Gate::new(self.region.u32(self.seq), self.region.u32(self.sleepers))
    }

    /// The `seq` word itself (to wait on it next to others with `futex::wait_any`).
    pub fn word(&self) -> &AtomicU32 {
        self.region.u32(self.seq)
    }

    /// See [`Gate::seq`].
    #[inline]
    pub fn seq(&self) -> u32 {
        self.gate().seq()
    }

    /// See [`Gate::sleep`].
    pub fn sleep(&self, seen: u32, ready: impl FnOnce() -> bool, timeout: Duration) -> bool {
        self.gate().sleep(seen, ready, timeout)
    }

    /// See [`Gate::notify`] (wakes every sleeper).
    #[inline]
    pub fn notify(&self) -> bool {
        self.gate().notify(u32::MAX)
    }

    /// See [`Gate::bump_and_notify`] (wakes every sleeper).
    #[inline]
    pub fn bump_and_notify(&self) -> bool {
        self.gate().bump_and_notify(u32::MAX)
    }

    /// See [`Gate::ring`] (wakes every sleeper).
    pub fn ring(&self) {
        self.gate().ring(u32::MAX)
    }
}

/// [`Gate::sleep`] on several futex bells at once: announce on every bell, fence
/// (F1 of each gate's argument), re-check `ready`, then sleep until any bell's `seq`
/// moves from the `seen` its caller read before looking for work (futex_waitv), for at
/// most `timeout`. The argument of [`Gate`] holds for each bell separately, so no
/// wake-up on any of them is lost. Returns whether it went to sleep. At most
/// [`crate::futex::WAITV_MAX`] bells.
pub fn sleep_many(
    bells: &[(&FutexBell, u32)],
    ready: impl FnOnce() -> bool,
    timeout: Duration,
) -> std::io::Result<bool> {
    for (b, _) in bells {
        b.region.u32(b.sleepers).fetch_add(1, SeqCst);
    }
    // F1: orders every announcement before the re-check.
    std::sync::atomic::fence(SeqCst);
    let slept = !ready();
    let r = if slept && !bells.is_empty() {
        let words: Vec<(&AtomicU32, u32)> =
            bells.iter().map(|(b, seen)| (b.word(), *seen)).collect();
        crate::futex::wait_any(&words, timeout).map(|_| ())
    } else {
        Ok(())
    };
    for (b, _) in bells {
        b.region.u32(b.sleepers).fetch_sub(1, Release);
    }
    r.map(|()| slept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll_fds;
    use std::time::Instant;

    #[test]
    fn sleep_many_wakes_on_any_bell_and_skips_when_ready() {
        let r = Arc::new(Region::create_memfd(c"bells", 4096, false).unwrap());
        let a = FutexBell::new(r.clone(), 0, 64).unwrap();
        let b = FutexBell::new(r.clone(), 128, 192).unwrap();
        // Ready at the re-check: no sleep.
        let t = Instant::now();
        let slept = sleep_many(
            &[(&a, a.seq()), (&b, b.seq())],
            || true,
            Duration::from_secs(5),
        );
        assert!(!slept.unwrap() && t.elapsed() < Duration::from_secs(1));
        // A ring on the second bell ends the sleep.
        let b2 = b.clone();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b2.notify();
        });
        let t = Instant::now();
        let slept = sleep_many(
            &[(&a, a.seq()), (&b, b.seq())],
            || false,
            Duration::from_secs(5),
        );
        assert!(slept.unwrap());
        assert!(t.elapsed() < Duration::from_secs(4), "woken, not timed out");
        th.join().unwrap();
        // A stale `seen` returns at once; a plain timeout returns at its deadline.
        let t = Instant::now();
        sleep_many(
            &[(&a, a.seq().wrapping_sub(1))],
            || false,
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        let t = Instant::now();
        sleep_many(&[(&a, a.seq())], || false, Duration::from_millis(30)).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert_eq!(r.u32(64).load(SeqCst), 0, "announcements withdrawn");
    }

    #[test]
    fn eventfd_rings_polls_and_drains() {
        let a = EventFd::new().unwrap();
        let b = EventFd::new().unwrap();
        let t = Instant::now();
        let r = poll_fds(&[a.as_fd(), b.as_fd()], Duration::from_millis(20)).unwrap();
        assert!(!r.any() && t.elapsed() >= Duration::from_millis(20));
        b.ring();
        b.ring();
        let r = poll_fds(&[a.as_fd(), b.as_fd()], Duration::from_secs(5)).unwrap();
        assert!(!r.contains(0) && r.contains(1));
        assert_eq!(b.drain(), 2);
        assert_eq!(b.drain(), 0);
        let r = poll_fds(&[a.as_fd(), b.as_fd()], Duration::ZERO).unwrap();
        assert!(!r.any());
    }

    #[test]
    fn eventfd_wakes_a_poller_in_another_thread() {
        let e = Arc::new(EventFd::new().unwrap());
        let e2 = e.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            e2.ring();
        });
        let start = Instant::now();
        while !poll_fds(&[e.as_fd()], Duration::from_millis(200))
            .unwrap()
            .any()
        {
            assert!(start.elapsed() < Duration::from_secs(20), "never rung");
        }
        assert_eq!(e.drain(), 1);
        t.join().unwrap();
    }

    /// A producer and a consumer pass 20000 items through a counter, the consumer
    /// sleeping on the bell whenever it runs dry: a lost wake-up shows up as a consumer
    /// that needs its timeout (1 s) to see an item, which the deadline check catches.
    #[test]
    fn futex_bell_ping_pong_loses_no_wake_up() {
        const N: u64 = 20_000;
        let region = Arc::new(Region::create_memfd(c"bell", 4096, true).unwrap());
        let items = region.clone();
        let bell = FutexBell::new(region.clone(), 0, 64).unwrap();
        let pbell = bell.clone();
        let producer = std::thread::spawn(move || {
            let count = items.u64(128);
            let mut rung = 0u64;
            for i in 1..=N {
                count.store(i, Release);
                rung += pbell.notify() as u64;
                if i % 64 == 0 {
                    std::thread::yield_now();
                }
            }
            rung
        });
        let count = region.u64(128);
        let mut seen = 0u64;
        let mut slow = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen < N {
            assert!(Instant::now() < deadline, "consumer stuck at {seen}");
            let s = bell.seq();
            let c = count.load(Acquire);
            if c > seen {
                seen = c;
                continue;
            }
            let t = Instant::now();
            bell.sleep(s, || count.load(Acquire) > seen, Duration::from_secs(1));
            if t.elapsed() >= Duration::from_millis(900) && count.load(Acquire) > seen {
                slow += 1;
            }
        }
        let rung = producer.join().unwrap();
        assert_eq!(
            slow, 0,
            "a wake-up was lost (the consumer waited for its timeout)"
        );
        assert!(rung <= N);
    }

    #[test]
    fn ring_wakes_a_sleeper_and_notify_skips_when_nobody_sleeps() {
        let region = Arc::new(Region::create_memfd(c"bell2", 4096, true).unwrap());
        let bell = FutexBell::new(region, 0, 4).unwrap();
        assert!(!bell.notify(), "nobody announced: no system call");
        let b2 = bell.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            b2.ring();
        });
        let start = Instant::now();
        let s = bell.seq();
        while bell.seq() == s {
            assert!(start.elapsed() < Duration::from_secs(20), "never rung");
            bell.sleep(s, || false, Duration::from_millis(200));
        }
        t.join().unwrap();
        assert!(FutexBell::new(bell.region.clone(), 4094, 0).is_err());
    }
}
