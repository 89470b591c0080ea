//! `poll(2)` and epoll over usnet sockets mixed with kernel descriptors.
//!
//! Readiness of usnet sockets comes from their slots in shared memory (through
//! `usnet_client::Poller`, which sleeps on the session's bell); kernel descriptors go
//! to the kernel (`poll(2)`, or the epoll set's own kernel epoll instance). A wait on
//! a mix is one `poll(2)` on the kernel descriptors (or the kernel epoll instance)
//! and the session's eventfd, which the server writes while such a waiter announced
//! itself (`usnet_client::Poller::sleep_with_kernel`): a kernel event and a usnet
//! one wake it alike, and an idle program sleeps.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use usnet_client::{Event, Interest, Mode, Poller, Source};

use crate::{get, insert, lock, new_entry, Entry, Errno, Obj, Res};

fn last_errno() -> Errno {
    Errno(
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

/// Registers `e`'s socket with `p` under `token`; false for objects that have no
/// readiness of their own (fresh or failed sockets: see [`static_events`]).
pub(crate) fn register(
    p: &mut Poller,
    e: &crate::Desc,
    token: u64,
    interest: Interest,
    mode: Mode,
) -> Res<bool> {
    let o = e.read();
    let src: &dyn Source = match &*o {
        Obj::Listener(l) => l,
        Obj::Stream(s) => s,
        Obj::Udp(u) => u,
        _ => return Ok(false),
    };
    p.register(src, token, interest, mode)?;
    Ok(true)
}

/// What `poll` reports for a socket without a live slot: a fresh TCP socket is
/// writable and hung up (as Linux's), a failed one has an error.
fn static_events(e: &Entry) -> i16 {
    match &*e.read() {
        // A deferred Fast Open connect is writable (its first write sends the SYN),
        // as Linux's `tcp_poll` says for `defer_connect`.
        Obj::Fresh(_) if e.deferred_connect() => libc::POLLOUT,
        Obj::Fresh(_) => libc::POLLOUT | libc::POLLHUP,
        Obj::Failed => libc::POLLERR | libc::POLLHUP,
        _ => libc::POLLNVAL,
    }
}

/// An event's `poll` bits, those `asked` (-1: all) and the ones always reported.
pub(crate) fn poll_bits(ev: &Event, asked: i16) -> i16 {
    let mut r = 0;
    if ev.readable {
        r |= libc::POLLIN | libc::POLLRDNORM;
    }
    if ev.writable {
        r |= libc::POLLOUT | libc::POLLWRNORM;
    }
    if ev.closed {
        r |= libc::POLLHUP;
    }
    if ev.rdhup {
        r |= libc::POLLRDHUP;
    }
    if ev.error {
        r |= libc::POLLERR;
    }
    // POLLHUP and POLLERR are reported whether asked or not.
    r & (asked | libc::POLLHUP | libc::POLLERR)
}

fn interest_of(events: i16) -> Interest {
    Interest {
        readable: events & (libc::POLLIN | libc::POLLRDNORM | libc::POLLPRI | libc::POLLRDHUP) != 0,
        writable: events & (libc::POLLOUT | libc::POLLWRNORM) != 0,
    }
}

/// `poll(2)` over any mix of usnet sockets and kernel descriptors. `timeout_ms < 0`
/// waits without end.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Res<usize> {
    let deadline = (timeout_ms >= 0)
        .then(|| usnet_client::vtime::now() + Duration::from_millis(timeout_ms as u64));
    let mut poller = Poller::new();
    let mut kernel: Vec<usize> = Vec::new();
    let mut fixed: Vec<(usize, i16)> = Vec::new();
    for (i, p) in fds.iter_mut().enumerate() {
        p.revents = 0;
        if p.fd < 0 {
            continue;
        }
        match get(p.fd) {
            Ok(e) => {
                if matches!(&*e.read(), Obj::Epoll(_)) {
                    // An epoll set is a kernel epoll fd: poll it there.
                    kernel.push(i);
                } else if !register(
                    &mut poller,
                    &e,
                    i as u64,
                    interest_of(p.events),
                    Mode::Level,
                )? {
                    fixed.push((i, static_events(&e)));
                }
            }
            Err(_) => kernel.push(i),
        }
    }
    let mut events = Vec::new();
    let signals = usnet_client::signal::mark();
    loop {
        events.clear();
        let mut ready = 0;
        for &(i, bits) in &fixed {
            fds[i].revents =
                bits & (fds[i].events | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL);
            ready += (fds[i].revents != 0) as usize;
        }
        poller.wait(&mut events, Some(Duration::ZERO))?;
        for ev in &events {
            let i = ev.token as usize;
            fds[i].revents = poll_bits(ev, fds[i].events);
            ready += (fds[i].revents != 0) as usize;
        }
        if !kernel.is_empty() {
            let mut kfds: Vec<libc::pollfd> = kernel.iter().map(|&i| fds[i]).collect();
            // SAFETY: kfds is a valid array of pollfd for the call.
            let n = unsafe { libc::poll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, 0) };
            if n < 0 {
                return Err(last_errno());
            }
            for (k, &i) in kernel.iter().enumerate() {
                fds[i].revents = kfds[k].revents;
                ready += (kfds[k].revents != 0) as usize;
            }
        }
        if ready > 0 {
            return Ok(ready);
        }
        if usnet_client::signal::interrupted_since(signals, false) {
            return Err(Errno(libc::EINTR));
        }
        let left = match deadline {
            Some(d) => {
                let now = usnet_client::vtime::now();
                if now >= d {
                    return Ok(0);
                }
                d - now
            }
            None => Duration::from_secs(3600),
        };
        if kernel.is_empty() {
            poller.wait_private(&mut events, Some(left))?;
        } else if !poller.is_empty() {
            // One sleep for both sides: the kernel's poll on the kernel descriptors
            // and the session's eventfd; the top of the loop then looks at both.
            let mut kfds: Vec<libc::pollfd> = kernel.iter().map(|&i| fds[i]).collect();
            poller.sleep_with_kernel(&mut kfds, left)?;
        } else {
            // Only kernel descriptors (and fixed ones): let the kernel wait.
            let mut kfds: Vec<libc::pollfd> = kernel.iter().map(|&i| fds[i]).collect();
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: as above.
            let n = unsafe { libc::poll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, ms) };
            if n < 0 {
                return Err(last_errno());
            }
        }
    }
}

// ------------------------------------------------------------------ epoll

/// One `epoll_event` as the kernel lays it out (packed on x86-64).
pub type EpollEvent = libc::epoll_event;

struct Watch {
    events: u32,
    data: u64,
    /// EPOLLONESHOT fired: silent until EPOLL_CTL_MOD.
    disarmed: bool,
    /// In the poller. A socket with no readiness of its own yet (fresh: not
    /// listening or connected) is not; `epoll_wait` reports its fixed events
    /// ([`static_events`]) and registers it once it connects or listens.
    registered: bool,
    /// Edge-triggered: the fixed events were reported (once per ADD/MOD).
    static_seen: bool,
    /// The socket watched. Closing a descriptor takes it out of every epoll set (as
    /// the kernel does): a watch whose socket is gone, or whose number now names
    /// another socket, counts as absent.
    socket: std::sync::Weak<Entry>,
}

impl Watch {
    fn watches(&self, e: &Arc<Entry>) -> bool {
        self.socket.upgrade().is_some_and(|w| Arc::ptr_eq(&w, e))
    }
}

/// An epoll set: a kernel epoll instance (its number is the set's descriptor; kernel
/// fds are added to it directly) and the usnet sockets watched by the layer.
pub(crate) struct Epoll {
    poller: Mutex<Poller>,
    watches: Mutex<HashMap<RawFd, Watch>>,
    /// Watches not in the poller ([`Watch::registered`]).
    unregistered: AtomicUsize,
    /// Kernel descriptors in the kernel epoll instance.
    kernel: AtomicUsize,
    /// Threads asleep in `epoll_wait` while the set has no usnet socket (in a
    /// `poll` on the kernel epoll instance and [`Epoll::wake`]): an `epoll_ctl`
    /// that adds one wakes them.
    kernel_sleepers: AtomicUsize,
    /// The set's own eventfd (a semaphore: each sleeper takes one ring), made
    /// at the first sleep in the kernel: an `epoll_ctl` that adds a usnet
    /// socket, or waits for the poller a sleeper holds, rings it. Not the
    /// session's: the process may have none yet (an event loop whose threads
    /// wait before its first socket exists, as the BEAM's poll threads do,
    /// slept an hour in the kernel), one that is gone, or a sleeper may have no
    /// usnet socket registered to sleep on it for (all its `EPOLLONESHOT`
    /// watches fired: the BEAM's re-arming `EPOLL_CTL_MOD` then waited an hour
    /// for the poller).
    wake: OnceLock<OwnedFd>,
    /// Threads in `epoll_ctl` waiting for `poller`, which a thread asleep in a
    /// mixed wait holds: that sleep lasts until something wakes it, so they wake it
    /// ([`CtlTurn`]) and it lets go before it sleeps again.
    ctl_waiting: AtomicUsize,
}

impl Epoll {
    /// [`Epoll::wake`], made now if need be (None: no descriptor to be had).
    fn wake_fd(&self) -> Option<RawFd> {
        if let Some(fd) = self.wake.get() {
            return Some(fd.as_raw_fd());
        }
        // SAFETY: no memory arguments; a non-negative result is ours.
        let flags = libc::EFD_CLOEXEC | libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE;
        let fd = unsafe { libc::eventfd(0, flags) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fresh descriptor owned by nobody else. Parked high, away from
        // the numbers programs name themselves.
        let owned = usnet_client::lineage::park(unsafe { OwnedFd::from_raw_fd(fd) });
        // Another thread may have made one meanwhile: the first stays.
        Some(self.wake.get_or_init(|| owned).as_raw_fd())
    }

    /// Rings [`Epoll::wake`] `n` times (once per sleeper to wake; a ring left
    /// over costs the next sleeper one turn of its loop).
    fn ring(&self, n: usize) {
        if let Some(fd) = self.wake.get() {
            let v = (n.max(1) as u64).to_ne_bytes();
            // SAFETY: writes 8 bytes from our buffer to our eventfd; never blocks.
            unsafe { libc::write(fd.as_raw_fd(), v.as_ptr().cast(), 8) };
        }
    }

    /// Wakes the threads asleep in the kernel alone (see `kernel_sleepers`).
    fn wake_kernel_sleepers(&self) {
        let n = self.kernel_sleepers.load(SeqCst);
        if n > 0 {
            self.ring(n);
        }
    }

    /// Takes this sleeper's ring of [`Epoll::wake`] if `pfd` (its entry in a
    /// poll) says one is there.
    fn take_ring(&self, pfd: &libc::pollfd) {
        if pfd.revents != 0 {
            let mut b = [0u8; 8];
            // SAFETY: reads 8 bytes into our buffer from our non-blocking eventfd.
            unsafe { libc::read(pfd.fd, b.as_mut_ptr().cast(), 8) };
        }
    }

    /// Sleeps until the kernel epoll instance `kfd` has an event, the set is
    /// rung, a signal comes or `left` passes. False: it could not (no eventfd).
    fn sleep_in_kernel(&self, kfd: RawFd, left: Duration) -> Res<bool> {
        let Some(wake) = self.wake_fd() else {
            return Ok(false);
        };
        let mut fds = [kfd, wake].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: two pollfds of our own.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if r < 0 {
            return Err(last_errno());
        }
        self.take_ring(&fds[1]);
        Ok(true)
    }
}

/// An `epoll_ctl` on the set's usnet side: announced in `ctl_waiting` while it
/// waits for the poller and works on it.
struct CtlTurn<'a>(&'a Epoll);

impl<'a> CtlTurn<'a> {
    /// The set's poller, for this `epoll_ctl`. A thread asleep in a mixed wait
    /// holds it: this rings the set's eventfd, which that sleep polls, and
    /// wakes every waiter of the process (eventfds latch a ring, so the sleeper
    /// cannot miss it); the sleeper, seeing the announcement, lets go before it
    /// sleeps again.
    fn poller(set: &'a Epoll) -> (CtlTurn<'a>, std::sync::MutexGuard<'a, Poller>) {
        set.ctl_waiting.fetch_add(1, SeqCst);
        let turn = CtlTurn(set);
        let guard = match set.poller.try_lock() {
            Ok(g) => g,
            Err(_) => {
                // The holder, and any thread asleep in the kernel alone; one
                // asleep on the session's bell (a set of usnet sockets only)
                // wakes with every waiter of the process.
                set.ring(1 + set.kernel_sleepers.load(SeqCst));
                if let Some(c) = crate::CLIENT.with(|c| c.clone()) {
                    c.wake_waiters();
                }
                lock(&set.poller)
            }
        };
        (turn, guard)
    }
}

impl Drop for CtlTurn<'_> {
    fn drop(&mut self) {
        self.0.ctl_waiting.fetch_sub(1, SeqCst);
    }
}

/// Longest sleep on the bell with only usnet sockets watched: the poller's lock is
/// let go between slices, so other threads' `epoll_ctl` never wait long.
const USNET_SLICE: Duration = Duration::from_millis(20);

/// `epoll_create1(2)`: EPOLL_CLOEXEC in `flags`.
pub fn epoll_create(flags: i32) -> Res<RawFd> {
    if flags & !libc::EPOLL_CLOEXEC != 0 {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: no memory arguments; a non-negative result is ours.
    let fd = unsafe { libc::epoll_create1(flags) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: fresh descriptor owned by nobody else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let set = Epoll {
        unregistered: AtomicUsize::new(0),
        poller: Mutex::new(Poller::new()),
        watches: Mutex::new(HashMap::new()),
        kernel: AtomicUsize::new(0),
        kernel_sleepers: AtomicUsize::new(0),
        ctl_waiting: AtomicUsize::new(0),
        wake: OnceLock::new(),
    };
    Ok(insert(new_entry(owned, Obj::Epoll(set), 0, 0, false)))
}

fn interest_of_epoll(ev: u32) -> Interest {
    Interest {
        readable: ev & (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLRDHUP) as u32 != 0,
        writable: ev & libc::EPOLLOUT as u32 != 0,
    }
}

fn mode_of(ev: u32) -> Mode {
    if ev & libc::EPOLLET as u32 != 0 {
        Mode::Edge
    } else {
        Mode::Level
    }
}

fn with_set<R>(epfd: RawFd, f: impl FnOnce(&Entry, &Epoll) -> Res<R>) -> Res<R> {
    let e = get(epfd)?;
    let o = e.read();
    let Obj::Epoll(set) = &*o else {
        return Err(Errno(libc::EINVAL));
    };
    f(&e, set)
}

/// `epoll_ctl(2)`: ADD, MOD, DEL of usnet sockets or kernel descriptors.
pub fn epoll_ctl(epfd: RawFd, op: i32, fd: RawFd, event: Option<EpollEvent>) -> Res<()> {
    if fd == epfd {
        return Err(Errno(libc::EINVAL));
    }
    let target: Option<Arc<Entry>> = get(fd).ok();
    let is_set = target
        .as_ref()
        .is_some_and(|t| matches!(&*t.read(), Obj::Epoll(_)));
    with_set(epfd, |e, set| {
        let Some(t) = target.filter(|_| !is_set) else {
            // A kernel descriptor (or a nested epoll set, itself a kernel epoll fd).
            let mut ev = event.unwrap_or(EpollEvent { events: 0, u64: 0 });
            // SAFETY: valid epoll fd and event pointer for the call.
            let r = unsafe { libc::epoll_ctl(e.reserve.as_raw_fd(), op, fd, &mut ev) };
            if r < 0 {
                return Err(last_errno());
            }
            match op {
                libc::EPOLL_CTL_ADD => {
                    set.kernel.fetch_add(1, Relaxed);
                }
                libc::EPOLL_CTL_DEL => {
                    set.kernel.fetch_sub(1, Relaxed);
                }
                _ => {}
            }
            return Ok(());
        };
        let (_turn, mut poller) = CtlTurn::poller(set);
        let mut watches = lock(&set.watches);
        if watches.get(&fd).is_some_and(|w| !w.watches(&t)) {
            // Left from a socket closed since: gone, as in the kernel.
            if watches.remove(&fd).is_some_and(|w| !w.registered) {
                set.unregistered.fetch_sub(1, Relaxed);
            }
            let _ = poller.deregister(fd as u64);
        }
        match op {
            libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => {
                let ev = event.ok_or(Errno(libc::EFAULT))?;
                let exists = watches.contains_key(&fd);
                if op == libc::EPOLL_CTL_ADD && exists {
                    return Err(Errno(libc::EEXIST));
                }
                if op == libc::EPOLL_CTL_MOD && !exists {
                    return Err(Errno(libc::ENOENT));
                }
                let _ = poller.deregister(fd as u64);
                let registered = register(
                    &mut poller,
                    &t,
                    fd as u64,
                    interest_of_epoll(ev.events),
                    mode_of(ev.events),
                )?;
                let old = watches.insert(
                    fd,
                    Watch {
                        events: ev.events,
                        data: ev.u64,
                        disarmed: false,
                        registered,
                        static_seen: false,
                        socket: Arc::downgrade(&t),
                    },
                );
                if old.is_some_and(|w| !w.registered) {
                    set.unregistered.fetch_sub(1, Relaxed);
                }
                if !registered {
                    set.unregistered.fetch_add(1, Relaxed);
                }
                drop((watches, poller));
                // A waiter asleep in the kernel alone (the set had no usnet
                // socket) must now look at this one too.
                set.wake_kernel_sleepers();
                Ok(())
            }
            libc::EPOLL_CTL_DEL => {
                let w = watches.remove(&fd).ok_or(Errno(libc::ENOENT))?;
                if !w.registered {
                    set.unregistered.fetch_sub(1, Relaxed);
                }
                let _ = poller.deregister(fd as u64);
                Ok(())
            }
            _ => Err(Errno(libc::EINVAL)),
        }
    })
}

fn epoll_bits(ev: &Event, asked: u32) -> u32 {
    let mut r = 0u32;
    if ev.readable {
        r |= libc::EPOLLIN as u32;
    }
    if ev.writable {
        r |= libc::EPOLLOUT as u32;
    }
    if ev.closed {
        r |= libc::EPOLLHUP as u32;
    }
    if ev.rdhup {
        r |= libc::EPOLLRDHUP as u32;
    }
    if ev.error {
        r |= libc::EPOLLERR as u32;
    }
    r & (asked | (libc::EPOLLHUP | libc::EPOLLERR) as u32)
}

/// Watches whose sockets had no readiness of their own when added: registered
/// once they connect or listen; until then their fixed events
/// ([`static_events`]) are reported (level-triggered: at every wait;
/// edge-triggered: once). Returns how many went into `out`.
fn sync_unregistered(poller: &mut Poller, set: &Epoll, out: &mut [EpollEvent]) -> usize {
    let mut watches = lock(&set.watches);
    let mut n = 0;
    for (&fd, w) in watches.iter_mut() {
        if w.registered || w.disarmed {
            continue;
        }
        let Some(t) = w.socket.upgrade() else {
            continue;
        };
        let interest = interest_of_epoll(w.events);
        if register(poller, &t, fd as u64, interest, mode_of(w.events)).unwrap_or(false) {
            w.registered = true;
            set.unregistered.fetch_sub(1, Relaxed);
            continue;
        }
        let edge = w.events & libc::EPOLLET as u32 != 0;
        if n == out.len() || (edge && w.static_seen) {
            continue;
        }
        let bits = epoll_of_poll(static_events(&t))
            & (w.events | (libc::EPOLLHUP | libc::EPOLLERR) as u32);
        if bits == 0 {
            continue;
        }
        w.static_seen = true;
        out[n] = EpollEvent {
            events: bits,
            u64: w.data,
        };
        n += 1;
        if w.events & libc::EPOLLONESHOT as u32 != 0 {
            w.disarmed = true;
        }
    }
    n
}

/// `poll` bits as epoll bits.
fn epoll_of_poll(p: i16) -> u32 {
    let mut r = 0u32;
    for (pb, eb) in [
        (libc::POLLIN, libc::EPOLLIN),
        (libc::POLLOUT, libc::EPOLLOUT),
        (libc::POLLERR, libc::EPOLLERR),
        (libc::POLLHUP, libc::EPOLLHUP),
    ] {
        if p & pb != 0 {
            r |= eb as u32;
        }
    }
    r
}

/// Turns the poller's events into epoll events in `out` (as many as fit) by the
/// set's watches: asked bits, data, EPOLLONESHOT disarming. Returns how many.
fn deliver(events: &[Event], poller: &mut Poller, set: &Epoll, out: &mut [EpollEvent]) -> usize {
    let mut watches = lock(&set.watches);
    let mut n = 0;
    for ev in events {
        if n == out.len() {
            break;
        }
        let fd = ev.token as RawFd;
        let Some(w) = watches.get_mut(&fd) else {
            continue;
        };
        if w.disarmed {
            continue;
        }
        let bits = epoll_bits(ev, w.events);
        if bits == 0 {
            continue;
        }
        out[n] = EpollEvent {
            events: bits,
            u64: w.data,
        };
        n += 1;
        if w.events & libc::EPOLLONESHOT as u32 != 0 {
            w.disarmed = true;
            let _ = poller.deregister(fd as u64);
        }
    }
    n
}

/// `epoll_wait(2)`: fills `out`; `timeout_ms < 0` waits without end.
pub fn epoll_wait(epfd: RawFd, out: &mut [EpollEvent], timeout_ms: i32) -> Res<usize> {
    if out.is_empty() {
        return Err(Errno(libc::EINVAL));
    }
    let deadline = (timeout_ms >= 0)
        .then(|| usnet_client::vtime::now() + Duration::from_millis(timeout_ms as u64));
    with_set(epfd, |e, set| {
        let kfd = e.reserve.as_raw_fd();
        let mut events = Vec::new();
        let signals = usnet_client::signal::mark();
        loop {
            let mut n = 0;
            {
                let mut poller = lock(&set.poller);
                if set.unregistered.load(Relaxed) > 0 {
                    n += sync_unregistered(&mut poller, set, out);
                }
                events.clear();
                poller.wait(&mut events, Some(Duration::ZERO))?;
                n += deliver(&events, &mut poller, set, &mut out[n..]);
            }
            if n < out.len() {
                // SAFETY: out[n..] is valid for writes of that many events.
                let k = unsafe {
                    libc::epoll_wait(kfd, out[n..].as_mut_ptr(), (out.len() - n) as i32, 0)
                };
                if k < 0 {
                    return Err(last_errno());
                }
                n += k as usize;
            }
            if n > 0 {
                return Ok(n);
            }
            if usnet_client::signal::interrupted_since(signals, false) {
                return Err(Errno(libc::EINTR));
            }
            let left = match deadline {
                Some(d) => {
                    let now = usnet_client::vtime::now();
                    if now >= d {
                        return Ok(0);
                    }
                    d - now
                }
                None => Duration::from_secs(3600),
            };
            let usnet_watched = !lock(&set.watches).is_empty();
            if usnet_watched && set.kernel.load(Relaxed) > 0 {
                // One sleep for both sides: the kernel's poll on the kernel epoll
                // instance and the session's eventfd; the top of the loop then
                // collects from both. An `epoll_ctl` waiting for the poller wakes
                // this sleep (`CtlTurn`): let it have the poller first.
                let p = lock(&set.poller);
                if set.ctl_waiting.load(SeqCst) > 0 {
                    drop(p);
                    std::thread::yield_now();
                    continue;
                }
                // The set's eventfd too: an `epoll_ctl` rings it for the poller,
                // which may have no usnet socket registered to wake this sleep
                // (its EPOLLONESHOT watches fired).
                let mut k = [kfd, set.wake_fd().unwrap_or(-1)].map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                p.sleep_with_kernel(&mut k, left)?;
                set.take_ring(&k[1]);
            } else if usnet_watched {
                // Sleep on the bell.
                let mut p = lock(&set.poller);
                events.clear();
                p.wait(&mut events, Some(left.min(USNET_SLICE)))?;
                // The poller has marked these as reported (edge mode): hand them out
                // now, or an edge would be lost.
                let n = deliver(&events, &mut p, set, out);
                if n > 0 {
                    return Ok(n);
                }
            } else {
                // No usnet socket yet: sleep in the kernel, where another thread's
                // `epoll_ctl` adding one can reach this sleep (the set's eventfd),
                // whether or not the process has a session yet; the top of the
                // loop then collects. Without an eventfd to be had the kernel
                // waits alone.
                set.kernel_sleepers.fetch_add(1, SeqCst);
                let slept = if lock(&set.watches).is_empty() {
                    set.sleep_in_kernel(kfd, left)
                } else {
                    Ok(true)
                };
                set.kernel_sleepers.fetch_sub(1, SeqCst);
                if slept? {
                    continue;
                }
                let ms = left.as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: as above.
                let k = unsafe { libc::epoll_wait(kfd, out.as_mut_ptr(), out.len() as i32, ms) };
                if k < 0 {
                    return Err(last_errno());
                }
                if k > 0 {
                    return Ok(k as usize);
                }
            }
        }
    })
}

/// A blocking `connect` waits here for the handshake's end.
/// [`wait_connected`] for a writer, which the stack knows waits (Linux's
/// `sk_write_pending` in `sk_stream_wait_connect`): the handshake's last ACK then
/// waits for its data.
pub(crate) fn wait_connected_to_write(e: &Entry, deadline: Option<Instant>) -> Res<()> {
    let pending = |on: bool| {
        if let Obj::Stream(s) = &*e.read() {
            let _ = s.set_write_pending(on);
        }
    };
    pending(true);
    let r = wait_connected(e, deadline);
    pending(false);
    r
}

pub(crate) fn wait_connected(e: &Entry, deadline: Option<Instant>) -> Res<()> {
    let mut p = Poller::new();
    if !register(&mut p, e, 0, Interest::WRITABLE, Mode::Level)? {
        return Err(Errno(libc::ECONNABORTED));
    }
    let mut events = Vec::new();
    loop {
        let left = match deadline {
            Some(d) => {
                let now = usnet_client::vtime::now();
                if now >= d {
                    return Err(Errno(libc::EINPROGRESS));
                }
                d - now
            }
            None => Duration::from_secs(3600),
        };
        events.clear();
        p.wait(&mut events, Some(left))?;
        let o = e.read();
        let Obj::Stream(s) = &*o else {
            return Err(Errno(libc::ECONNABORTED));
        };
        if let Ok(Some(err)) = s.take_error() {
            return Err(err.into());
        }
        if s.connected() {
            return Ok(());
        }
        if events.iter().any(|ev| ev.closed) {
            return Err(Errno(libc::ECONNREFUSED));
        }
    }
}

/// A forked child's copy of an epoll set (see `fork.rs`): the same kernel epoll
/// instance (its number, shared with the parent as the kernel shares it), a poller
/// of the child's own over the usnet sockets it watched, looked up in the child's
/// rebuilt table. Locks are only tried: one held by a parent's thread at the fork
/// leaves the set without its usnet watches.
pub(crate) fn forked(set: &Epoll, table: &crate::fork::Table) -> Epoll {
    let mut poller = Poller::new();
    let mut watches = HashMap::new();
    let mut unregistered = 0;
    if let Ok(old) = set.watches.try_lock() {
        for (&fd, w) in old.iter() {
            let Some(t) = table.get(&fd) else {
                continue;
            };
            let registered = !w.disarmed
                && register(
                    &mut poller,
                    t,
                    fd as u64,
                    interest_of_epoll(w.events),
                    mode_of(w.events),
                )
                .unwrap_or(false);
            unregistered += usize::from(!registered);
            watches.insert(
                fd,
                Watch {
                    events: w.events,
                    data: w.data,
                    disarmed: w.disarmed,
                    registered,
                    static_seen: w.static_seen,
                    socket: Arc::downgrade(t),
                },
            );
        }
    }
    Epoll {
        poller: Mutex::new(poller),
        watches: Mutex::new(watches),
        unregistered: AtomicUsize::new(unregistered),
        kernel: AtomicUsize::new(set.kernel.load(Relaxed)),
        kernel_sleepers: AtomicUsize::new(0),
        ctl_waiting: AtomicUsize::new(0),
        wake: OnceLock::new(),
    }
}
