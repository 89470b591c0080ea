//! Time as a client's waits see it. Normally the monotonic clock. A harness that
//! runs a stack server on virtual time inside this process (packetdrill's backend,
//! which runs the Linux TCP suite through the same socket layer as `usnet run`)
//! installs [`Virtual`] once; from then on:
//!
//! - deadlines (`SO_RCVTIMEO`, `poll` and `epoll_wait` timeouts, connect timeouts)
//!   count virtual time ([`now`]);
//! - every thread that goes to sleep in the client registers, with its deadline and
//!   the harness's *epoch* it last looked at its condition in, so the harness can
//!   move the clock only once each waiting call has looked at the world as it is
//!   ([`Virtual::settled`]): a call woken by an injected packet completes at that
//!   packet's time, not after the next jump of the clock;
//! - sleeps are cut into short real-time slices, so a thread sees a new epoch
//!   ([`Virtual::kick`]) within a slice even when nothing rang its bell.
//!
//! The thread that moves the clock must not sleep in a call that only time can
//! end: its waits go to [`Virtual::set_owner`]'s hook instead, which moves the
//! clock to the deadline (a call with none gives up at once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The longest real-time sleep under virtual time.
pub const SLICE: Duration = Duration::from_millis(1);

type NowFn = Box<dyn Fn() -> u64 + Send + Sync>;
type AdvanceFn = Box<dyn Fn(Option<u64>) + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct Sleeper {
    epoch: u64,
    /// Virtual ns.
    deadline: Option<u64>,
}

#[derive(Default)]
struct State {
    sleepers: HashMap<ThreadId, Sleeper>,
    owner: Option<ThreadId>,
    /// Threads whose call slept since they last asked ([`Virtual::take_slept`]).
    slept: HashMap<ThreadId, ()>,
}

/// Virtual time and the registry of sleeping threads (see the module documentation).
pub struct Virtual {
    base: Instant,
    now_ns: NowFn,
    /// `CLOCK_REALTIME` ns at virtual 0 (what [`wall_ns`] counts from).
    wall_epoch: std::sync::atomic::AtomicI64,
    epoch: AtomicU64,
    state: Mutex<State>,
    changed: Condvar,
    advance: OnceLock<AdvanceFn>,
}

static VIRTUAL: OnceLock<Virtual> = OnceLock::new();

type Waker = Box<dyn Fn() -> bool + Send + Sync>;

/// What wakes a session's sleepers (false once the session is gone).
static WAKERS: Mutex<Vec<Waker>> = Mutex::new(Vec::new());

fn lock_wakers() -> MutexGuard<'static, Vec<Waker>> {
    WAKERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Under virtual time: `wake` rings a session's bell at every [`Virtual::kick`],
/// so its sleepers look again at once (it returns false when the session is gone).
pub(crate) fn watch(wake: impl Fn() -> bool + Send + Sync + 'static) {
    if VIRTUAL.get().is_some() {
        lock_wakers().push(Box::new(wake));
    }
}

/// Installs virtual time for this process: `now_ns` reads it (nanoseconds, never
/// going back). Only the first call installs; later ones return the installed one.
pub fn install(now_ns: impl Fn() -> u64 + Send + Sync + 'static) -> &'static Virtual {
    VIRTUAL.get_or_init(|| Virtual::new(now_ns))
}

/// The installed virtual time, if any.
pub fn installed() -> Option<&'static Virtual> {
    VIRTUAL.get()
}

/// The time deadlines count in: virtual if installed, else the monotonic clock.
#[inline]
pub fn now() -> Instant {
    match VIRTUAL.get() {
        Some(v) => v.now(),
        None => Instant::now(),
    }
}

/// `CLOCK_REALTIME` now, in ns: under virtual time the wall clock moves with it
/// (from [`Virtual::set_wall_epoch`]), as a test's `gettimeofday` does.
pub fn wall_ns() -> i64 {
    match VIRTUAL.get() {
        Some(v) => {
            v.wall_epoch.load(std::sync::atomic::Ordering::Relaxed)
                + (v.now_ns)().min(i64::MAX as u64) as i64
        }
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64),
    }
}

impl Virtual {
    /// The wall-clock time (ns since the Unix epoch) of virtual 0.
    pub fn set_wall_epoch(&self, ns: i64) {
        self.wall_epoch
            .store(ns, std::sync::atomic::Ordering::Relaxed);
    }

    fn new(now_ns: impl Fn() -> u64 + Send + Sync + 'static) -> Virtual {
        Virtual {
            base: Instant::now(),
            now_ns: Box::new(now_ns),
            wall_epoch: std::sync::atomic::AtomicI64::new(0),
            epoch: AtomicU64::new(0),
            state: Mutex::default(),
            changed: Condvar::new(),
            advance: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now(&self) -> Instant {
        self.at((self.now_ns)())
    }

    /// The instant of virtual `ns`.
    pub fn at(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    /// Virtual ns of `t`.
    pub fn ns_of(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Starts a new epoch (the world changed: every sleeper must look again before
    /// it counts as settled), wakes the sleepers to look, and returns it.
    pub fn kick(&self) -> u64 {
        let e = self.epoch.fetch_add(1, SeqCst) + 1;
        lock_wakers().retain(|w| w());
        e
    }

    /// The present epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(SeqCst)
    }

    /// Threads other than `me` asleep after looking in epoch `epoch` or later.
    pub fn settled(&self, epoch: u64, me: ThreadId) -> usize {
        self.lock()
            .sleepers
            .iter()
            .filter(|(t, s)| **t != me && s.epoch >= epoch)
            .count()
    }

    /// Every sleeping thread but `me`.
    pub fn sleeping(&self, me: ThreadId) -> usize {
        self.lock().sleepers.keys().filter(|t| **t != me).count()
    }

    /// Waits (real time, at most `d`) for a thread to go to sleep.
    pub fn wait_for_sleepers(&self, d: Duration) {
        let g = self.lock();
        let _ = self.changed.wait_timeout(g, d);
    }

    /// The earliest deadline of a sleeping thread after virtual `now_ns`.
    pub fn next_deadline(&self, now_ns: u64) -> Option<u64> {
        self.lock()
            .sleepers
            .values()
            .filter_map(|s| s.deadline)
            .filter(|&d| d > now_ns)
            .min()
    }

    /// The thread that moves the clock, and what its waits do instead of sleeping:
    /// `advance(Some(deadline_ns))` moves the clock there; `advance(None)` is told
    /// of a wait only a peer could end (it should say so; the wait gives up).
    pub fn set_owner(
        &self,
        owner: ThreadId,
        advance: impl Fn(Option<u64>) + Send + Sync + 'static,
    ) {
        self.lock().owner = Some(owner);
        let _ = self.advance.set(Box::new(advance));
    }

    /// Whether the calling thread blocked in a call (waited for readiness, not only
    /// for the server's answer) since it last asked.
    pub fn take_slept(&self) -> bool {
        self.lock()
            .slept
            .remove(&std::thread::current().id())
            .is_some()
    }

    /// `blocked`: the thread waits for readiness (its call blocks), not for the
    /// server's answer to a request.
    fn register(&self, epoch: u64, deadline: Option<Instant>, blocked: bool) -> ThreadId {
        let me = std::thread::current().id();
        let deadline = deadline.map(|d| self.ns_of(d));
        let mut g = self.lock();
        g.sleepers.insert(me, Sleeper { epoch, deadline });
        if blocked {
            g.slept.insert(me, ());
        }
        drop(g);
        self.changed.notify_all();
        me
    }

    fn unregister(&self, me: ThreadId) {
        self.lock().sleepers.remove(&me);
    }

    fn is_owner(&self) -> bool {
        self.lock().owner == Some(std::thread::current().id())
    }
}

/// How a client wait goes about one sleep (see [`sleep`]).
pub(crate) enum Plan {
    /// Sleep on the bell for at most this long.
    Sleep(Duration),
    /// The clock's owner: its deadline was reached by moving the clock; look again.
    Moved,
    /// The clock's owner with no deadline: nothing in this thread can end the wait.
    GiveUp,
}

/// Registers the calling thread as a sleeper until the guard drops. `epoch` is the
/// one read before the caller last looked at its condition.
pub(crate) struct Asleep(Option<ThreadId>);

impl Drop for Asleep {
    fn drop(&mut self) {
        if let (Some(me), Some(v)) = (self.0, VIRTUAL.get()) {
            v.unregister(me);
        }
    }
}

/// The epoch to read before looking at a condition (0 without virtual time).
#[inline]
pub(crate) fn epoch() -> u64 {
    VIRTUAL.get().map_or(0, |v| v.epoch.load(SeqCst))
}

thread_local! {
    /// The epoch read by the last [`mark`] on this thread.
    static MARKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Reads the epoch for a wait whose look at its condition spans several calls
/// (read with the bell's sequence, used by the sleep that follows).
#[inline]
pub(crate) fn mark() {
    if VIRTUAL.get().is_some() {
        MARKED.with(|m| m.set(epoch()));
    }
}

/// The epoch the last [`mark`] on this thread read.
pub(crate) fn marked() -> u64 {
    MARKED.with(|m| m.get())
}

/// Registration for a sleep that waits for the server's answer to a request (the
/// server answers without the clock moving, so the clock's owner sleeps too, and
/// does not register: it is the thread that settles).
pub(crate) fn asleep_for_server(epoch: u64) -> Asleep {
    match VIRTUAL.get() {
        Some(v) if !v.is_owner() => Asleep(Some(v.register(epoch, None, false))),
        _ => Asleep(None),
    }
}

/// Before sleeping `left` (real time; `deadline` in [`now`]'s time) after looking in
/// `epoch`: what to do, and the registration to hold while asleep.
pub(crate) fn plan(epoch: u64, left: Duration, deadline: Option<Instant>) -> (Plan, Asleep) {
    let Some(v) = VIRTUAL.get() else {
        return (Plan::Sleep(left), Asleep(None));
    };
    if v.is_owner() {
        let Some(adv) = v.advance.get() else {
            return (Plan::GiveUp, Asleep(None));
        };
        return match deadline {
            Some(d) => {
                adv(Some(v.ns_of(d)));
                (Plan::Moved, Asleep(None))
            }
            None => {
                adv(None);
                (Plan::GiveUp, Asleep(None))
            }
        };
    }
    let me = v.register(epoch, deadline, true);
    (Plan::Sleep(left.min(SLICE)), Asleep(Some(me)))
}

/// `std::thread::sleep` in [`now`]'s time: under virtual time, asleep (registered)
/// until the clock passes the deadline.
pub fn sleep(d: Duration) {
    if VIRTUAL.get().is_none() {
        std::thread::sleep(d);
        return;
    }
    let deadline = now() + d;
    loop {
        let e = epoch();
        let t = now();
        if t >= deadline {
            return;
        }
        match plan(e, deadline - t, Some(deadline)) {
            (Plan::Sleep(left), _asleep) => std::thread::sleep(left),
            (Plan::Moved, _) => {}
            (Plan::GiveUp, _) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_virtual_time_plans_sleep_as_asked() {
        // This test binary never installs virtual time.
        assert!(installed().is_none());
        let (p, g) = plan(epoch(), Duration::from_secs(3), None);
        assert!(matches!(p, Plan::Sleep(d) if d == Duration::from_secs(3)));
        assert!(g.0.is_none());
    }

    #[test]
    fn a_sleeper_is_settled_only_for_the_epochs_it_looked_in() {
        let v = Virtual::new(|| 1_000);
        assert_eq!(v.ns_of(v.now()), 1_000);
        let other = std::thread::spawn(|| {});
        let other_id = other.thread().id();
        other.join().unwrap();
        let e0 = v.epoch();
        let me = v.register(e0, Some(v.at(5_000)), true);
        assert_eq!(v.settled(e0, other_id), 1);
        assert_eq!(v.settled(e0, me), 0, "the caller does not count itself");
        let e1 = v.kick();
        assert_eq!(
            v.settled(e1, other_id),
            0,
            "it has not looked since the kick"
        );
        assert_eq!(v.sleeping(other_id), 1);
        assert_eq!(v.next_deadline(1_000), Some(5_000));
        assert_eq!(v.next_deadline(5_000), None, "only deadlines still ahead");
        assert!(v.take_slept());
        assert!(!v.take_slept(), "asked once");
        v.unregister(me);
        assert_eq!(v.sleeping(other_id), 0);
        // Waiting for the server's answer is not a blocked call.
        v.register(e1, None, false);
        assert!(!v.take_slept());
    }
}
