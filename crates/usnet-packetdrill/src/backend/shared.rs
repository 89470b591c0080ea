//! The backend shared between packetdrill's threads (packetdrill runs blocking
//! system calls in their own thread while the main thread injects and sniffs
//! packets and moves the clock).
//!
//! Calls on blocking sockets (`accept`, `connect`, `read`, `write`, `poll` with a
//! timeout) wait on a condition variable until another thread changes something.
//! Virtual time must not move under them unseen:
//!
//! - **Settled before the clock moves.** Every change (a packet, a call, the clock)
//!   starts a new epoch. A waiting call is *settled* once it has re-polled in the
//!   current epoch. The clock moves (`usleep`, `gettimeofday`'s tick, the jumps of
//!   `netdev_receive`) only once every other thread inside the library is a settled
//!   waiter, so a call woken by an injected packet completes at the virtual time of
//!   that packet, not after the main thread's next `usleep` (bounded by a real-time
//!   deadline, [`SETTLE_DEADLINE`]).
//! - **Stamped at completion.** packetdrill reads the clock after a blocking call
//!   returns (`end_syscall` calls `gettimeofday` from the call's thread); that
//!   thread's first `gettimeofday` after a call that waited returns the virtual time
//!   the call completed at.
//! - **Waiters' own deadlines.** A `poll` timeout is a virtual deadline; the clock
//!   stops there (like at a stack timer) so the call returns at its time.

use std::collections::HashMap;
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant as RealInstant};

use libc::pollfd;

use super::{Backend, FastOpenStart, Res};

/// How far one `netdev_receive` lets the virtual clock run looking for a packet
/// before it reports "nothing" (packetdrill then asks again, and the clock runs on).
pub const SNIFF_HORIZON_NS: u64 = 1_000_000_000;

/// Longest real time the clock waits for woken calls to re-poll before it moves
/// anyway (a thread that never comes back must not hang the run).
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(2);

/// Virtual seconds `netdev_receive` runs the clock while nothing at all is scheduled
/// (no stack timer, no waiting call with a deadline, no other thread inside the
/// library) before it gives up: the packet the script waits for can never come, and
/// packetdrill would ask for it forever.
pub const STUCK_AFTER_NS: u64 = 30 * SNIFF_HORIZON_NS;

/// A thread waiting inside a blocking call.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    /// The epoch in which it last re-polled (`u64::MAX`: it needs no re-poll).
    polled: u64,
    /// Its own virtual deadline (a `poll` timeout), ns.
    deadline: Option<u64>,
}

/// What the threads know about each other (kept under the backend's lock).
#[derive(Debug, Default)]
pub struct Sync {
    epoch: u64,
    waiters: HashMap<ThreadId, Waiter>,
    /// Virtual ns at which a thread's blocking call completed, for its next
    /// `gettimeofday`.
    stamps: HashMap<ThreadId, u64>,
    /// Virtual ns `netdev_receive` ran the clock in a row with nothing scheduled.
    idle_run_ns: u64,
    /// packetdrill's main thread (the one that sends and sniffs packets; `usleep`
    /// comes from the system-call thread too).
    main: Option<ThreadId>,
    /// A thread that just collected the completion time of its blocking call, and
    /// when: packetdrill records the call's result (an accepted descriptor) only
    /// after that, outside the library and under its own lock, so the next
    /// `usleep` (which packetdrill makes with that lock released) waits
    /// [`RECORD_GRACE`] of real time (or until the thread calls in again) before
    /// the clock moves.
    recording: Option<(ThreadId, RealInstant)>,
}

/// Real time a thread whose blocking call completed gets to record its result
/// before the virtual clock moves on.
pub const RECORD_GRACE: Duration = Duration::from_millis(20);

impl Sync {
    /// Waiters other than `me` that need no re-poll.
    fn settled_waiters(&self, me: ThreadId) -> usize {
        self.waiters
            .iter()
            .filter(|(t, w)| **t != me && (w.polled == u64::MAX || w.polled == self.epoch))
            .count()
    }

    /// The earliest waiter deadline after `now`.
    fn next_deadline(&self, now: u64) -> Option<u64> {
        self.waiters
            .values()
            .filter_map(|w| w.deadline)
            .filter(|&d| d > now)
            .min()
    }
}

pub struct Shared {
    inner: Mutex<Backend>,
    cv: Condvar,
    /// Threads inside a library call (counted before they take the lock).
    active: AtomicUsize,
    /// The supervisor answering packetdrill's own `getsockopt` (`crate::trap`).
    pub trap: Mutex<Option<crate::trap::Trap>>,
}

/// Counts a thread inside the library for as long as it lives.
pub struct Active<'a>(&'a AtomicUsize);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    pub fn new(b: Backend) -> Shared {
        Shared {
            inner: Mutex::new(b),
            cv: Condvar::new(),
            active: AtomicUsize::new(0),
            trap: Mutex::new(None),
        }
    }

    /// Marks the calling thread as inside the library (the FFI layer holds this for
    /// the duration of every call).
    pub fn enter(&self) -> Active<'_> {
        self.active.fetch_add(1, Ordering::SeqCst);
        Active(&self.active)
    }

    /// How many threads wait inside blocking calls.
    pub fn waiting(&self) -> usize {
        self.lock().sync.waiters.len()
    }

    pub fn lock(&self) -> MutexGuard<'_, Backend> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a change (or `d` of real time).
    fn wait_for<'a>(&self, g: MutexGuard<'a, Backend>, d: Duration) -> MutexGuard<'a, Backend> {
        match self.cv.wait_timeout(g, d) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }

    /// Something changed: a new epoch, and every waiter re-polls.
    fn changed(&self, g: &mut Backend) {
        g.sync.epoch += 1;
        self.cv.notify_all();
    }

    /// Whether every other thread inside the library is a settled waiter.
    fn settled(&self, g: &Backend) -> bool {
        let others = self.active.load(Ordering::SeqCst).saturating_sub(1);
        g.sync.settled_waiters(std::thread::current().id()) >= others
    }

    /// Whether another thread is still finishing a blocking call that completed:
    /// its completion time not yet collected, or its result being recorded.
    fn finishing(&self, g: &Backend) -> bool {
        let me = std::thread::current().id();
        g.sync.stamps.keys().any(|&t| t != me)
            || g.sync
                .recording
                .is_some_and(|(t, at)| t != me && at.elapsed() < RECORD_GRACE)
    }

    /// Waits until the clock may move (see the module documentation).
    /// While it waits, the caller counts as settled for the others (two threads
    /// settling at once must not wait for each other).
    fn settle<'a>(&self, mut g: MutexGuard<'a, Backend>) -> MutexGuard<'a, Backend> {
        if self.settled(&g) {
            return g;
        }
        let me = std::thread::current().id();
        let idle = Waiter {
            polled: u64::MAX,
            deadline: None,
        };
        let had = g.sync.waiters.insert(me, idle);
        let start = RealInstant::now();
        while !self.settled(&g) && start.elapsed() < SETTLE_DEADLINE {
            g = self.wait_for(g, Duration::from_millis(2));
        }
        match had {
            Some(w) => g.sync.waiters.insert(me, w),
            None => g.sync.waiters.remove(&me),
        };
        g
    }

    /// Blocks (for a blocking socket) until `op` stops saying `EAGAIN`; `deadline`
    /// (virtual ns) ends the wait with `EAGAIN`.
    fn blocking<T>(
        &self,
        fd: Option<c_int>,
        force_nonblock: bool,
        deadline: Option<u64>,
        mut op: impl FnMut(&mut Backend) -> Res<T>,
    ) -> Res<T> {
        let me = std::thread::current().id();
        let mut g = self.lock();
        if g.sync.recording.is_some_and(|(t, _)| t == me) {
            g.sync.recording = None;
        }
        let mut waited = false;
        let r = loop {
            let r = op(&mut g);
            let timed_out = deadline.is_some_and(|d| g.now_ns() >= d);
            match r {
                Err(libc::EAGAIN) if !timed_out => {
                    let nb = force_nonblock
                        || fd.is_some_and(|fd| g.nonblocking(fd).is_none_or(|nb| nb));
                    if nb {
                        break Err(libc::EAGAIN);
                    }
                    if g.sync.main == Some(me) {
                        // packetdrill runs a call in its main thread when the script
                        // gives it no time range: it must not block. Only time can
                        // end the wait, and only this thread moves time.
                        match deadline {
                            Some(d) => {
                                g.advance_to(d);
                                continue;
                            }
                            None => {
                                eprintln!(
                                    "usnet-packetdrill: a call the script expects to return \
                                     at once (no time range) would block for ever: EAGAIN"
                                );
                                break Err(libc::EAGAIN);
                            }
                        }
                    }
                    let polled = g.sync.epoch;
                    g.sync.waiters.insert(me, Waiter { polled, deadline });
                    // Someone may wait for this thread to settle.
                    self.cv.notify_all();
                    waited = true;
                    g = self.wait_for(g, Duration::from_millis(50));
                }
                r => break r,
            }
        };
        if waited {
            g.sync.waiters.remove(&me);
            let now = g.now_ns();
            g.sync.stamps.insert(me, now);
        }
        self.changed(&mut g);
        r
    }

    pub fn accept(&self, fd: c_int) -> Res<(c_int, SocketAddr)> {
        self.blocking(Some(fd), false, None, |b| b.try_accept(fd))
    }

    /// `connect`: `EINPROGRESS` on a non-blocking socket, else waits for the
    /// handshake.
    pub fn connect(&self, fd: c_int, to: SocketAddr) -> Res<c_int> {
        let mut g = self.lock();
        let started = g.start_connect(fd, to)?;
        self.changed(&mut g);
        if !started {
            return Ok(0);
        }
        if g.nonblocking(fd) == Some(true) {
            return Err(libc::EINPROGRESS);
        }
        drop(g);
        self.blocking(Some(fd), false, None, |b| match b.connect_status(fd)? {
            true => Ok(0),
            false => Err(libc::EAGAIN),
        })
    }

    /// `read`/`recv`: `MSG_DONTWAIT` and `MSG_NOSIGNAL` are the flags understood.
    pub fn read(&self, fd: c_int, buf: &mut [u8], flags: c_int) -> Res<i64> {
        if flags & !(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        self.blocking(Some(fd), flags & libc::MSG_DONTWAIT != 0, None, |b| {
            b.try_read(fd, buf)
        })
        .map(|n| n as i64)
    }

    /// `splice` between a backend socket and a kernel descriptor, without offsets
    /// (`ESPIPE` with one, as for a pipe). `SPLICE_F_NONBLOCK`, or a non-blocking
    /// socket, does not wait. See `backend::splice`.
    pub fn splice(
        &self,
        fd_in: c_int,
        fd_out: c_int,
        offsets: bool,
        len: usize,
        flags: u32,
    ) -> Res<i64> {
        const SPLICE_F_NONBLOCK: u32 = 2;
        if offsets {
            return Err(libc::ESPIPE);
        }
        let nonblock = flags & SPLICE_F_NONBLOCK != 0;
        let errno = || {
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        let mut buf = vec![0u8; len.min(1 << 16)];
        let (from_socket, to_socket) = self.call(|b| (b.is_socket(fd_in), b.is_socket(fd_out)));
        if from_socket && !to_socket {
            let n = self.blocking(Some(fd_in), nonblock, None, |b| {
                b.try_splice_read(fd_in, &mut buf)
            })?;
            let mut done = 0;
            while done < n {
                // SAFETY: `buf[done..n]` is initialised memory; the kernel checks `fd_out`.
                let w = unsafe { libc::write(fd_out, buf[done..n].as_ptr().cast(), n - done) };
                if w <= 0 {
                    return if done > 0 {
                        Ok(done as i64)
                    } else {
                        Err(errno())
                    };
                }
                done += w as usize;
            }
            Ok(n as i64)
        } else if to_socket && !from_socket {
            // SAFETY: `buf` has buf.len() writable bytes; the kernel checks `fd_in`.
            let n = unsafe { libc::read(fd_in, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                return Err(errno());
            }
            let flags = if nonblock { libc::MSG_DONTWAIT } else { 0 };
            self.write(fd_out, &buf[..n as usize], flags)
        } else {
            Err(libc::EINVAL)
        }
    }

    /// `recvfrom`: [`Shared::read`] and the peer's address, if connected.
    pub fn recv_from(
        &self,
        fd: c_int,
        buf: &mut [u8],
        flags: c_int,
    ) -> Res<(i64, Option<SocketAddr>)> {
        let n = self.read(fd, buf, flags)?;
        Ok((n, self.lock().peer_addr(fd).ok()))
    }

    /// `write`/`send`: a blocking write returns when everything is queued, like the
    /// kernel's.
    pub fn write(&self, fd: c_int, data: &[u8], flags: c_int) -> Res<i64> {
        self.send_to(fd, data, flags, None)
    }

    /// `sendto`/`sendmsg` with an address: with `MSG_FASTOPEN` on an unconnected
    /// socket (or the first write after a deferred TCP_FASTOPEN_CONNECT `connect`) a
    /// Fast Open connect: a non-blocking call returns what rode on the SYN (or
    /// `EINPROGRESS` when nothing did); a blocking one waits for the handshake and
    /// then sends the rest, as Linux.
    pub fn send_to(
        &self,
        fd: c_int,
        data: &[u8],
        flags: c_int,
        to: Option<SocketAddr>,
    ) -> Res<i64> {
        self.send_to_frags(fd, data, flags, to, &[])
    }

    /// [`Shared::send_to`] of data gathered from an iovec: with `MSG_ZEROCOPY` on a
    /// zero-copy socket, `frag_breaks` (offsets where the send's buffer runs out of
    /// page fragments, `zerocopy::frag_breaks`) end segments there, pushed.
    pub fn send_to_frags(
        &self,
        fd: c_int,
        data: &[u8],
        flags: c_int,
        to: Option<SocketAddr>,
        frag_breaks: &[usize],
    ) -> Res<i64> {
        let known = libc::MSG_DONTWAIT
            | libc::MSG_NOSIGNAL
            | libc::MSG_FASTOPEN
            | libc::MSG_ZEROCOPY
            | libc::MSG_EOR
            | libc::MSG_MORE;
        if flags & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let zc = flags & libc::MSG_ZEROCOPY != 0 && self.call(|b| b.zerocopy_on(fd));
        let breaks = if zc { frag_breaks } else { &[] };
        let r = self.send_inner(fd, data, flags & !libc::MSG_ZEROCOPY, to, breaks);
        if flags & libc::MSG_ZEROCOPY != 0 && matches!(r, Ok(n) if n > 0) {
            self.call(|b| b.zerocopy_sent(fd));
        }
        if matches!(r, Ok(n) if n > 0) {
            self.call(|b| b.timestamp_sent(fd));
        }
        r
    }

    fn send_inner(
        &self,
        fd: c_int,
        data: &[u8],
        flags: c_int,
        to: Option<SocketAddr>,
        breaks: &[usize],
    ) -> Res<i64> {
        let fastopen = flags & libc::MSG_FASTOPEN != 0;
        let mut done = 0;
        {
            let mut g = self.lock();
            let start = g.start_fastopen(fd, to, fastopen, data);
            self.changed(&mut g);
            match start {
                Ok(FastOpenStart::Connected) => {}
                Err(libc::ENOTCONN) if !fastopen => {}
                Err(e) => return Err(e),
                Ok(FastOpenStart::Started(q)) => {
                    let nb = flags & libc::MSG_DONTWAIT != 0 || g.nonblocking(fd) != Some(false);
                    if nb {
                        return if q > 0 {
                            Ok(q as i64)
                        } else {
                            Err(libc::EINPROGRESS)
                        };
                    }
                    // Data left over from the SYN waits to go: the handshake's ACK
                    // may wait for it.
                    if q < data.len() {
                        let _ = g.set_write_pending(fd, true);
                    }
                    drop(g);
                    let r =
                        self.blocking(Some(fd), false, None, |b| match b.connect_status(fd)? {
                            true => Ok(()),
                            false => Err(libc::EAGAIN),
                        });
                    let _ = self.call(|b| b.set_write_pending(fd, false));
                    r?;
                    done = q;
                    if done == data.len() {
                        return Ok(done as i64);
                    }
                }
            }
        }
        let flags = flags & !libc::MSG_FASTOPEN;
        let eor = flags & libc::MSG_EOR != 0;
        let more = flags & libc::MSG_MORE != 0;
        // A blocked writer goes on when the socket is writable again (Linux's
        // `sk_stream_wait_memory` sleeps until `sk_stream_write_space` wakes it),
        // not as soon as any room appears.
        let mut blocked = false;
        let r = self.blocking(Some(fd), flags & libc::MSG_DONTWAIT != 0, None, |b| loop {
            if blocked && b.revents(fd) & libc::POLLOUT == 0 {
                break Err(libc::EAGAIN);
            }
            // Up to the next point where the buffer must end (a zero-copy buffer out
            // of fragments), else to the end.
            let end = breaks
                .iter()
                .copied()
                .find(|&x| x > done && x < data.len())
                .unwrap_or(data.len());
            let n = match b.try_write(fd, &data[done..end], more && end == data.len()) {
                Err(libc::EAGAIN) => {
                    blocked = true;
                    break Err(libc::EAGAIN);
                }
                r => r?,
            };
            done += n;
            if done < end {
                blocked = true;
                break Err(libc::EAGAIN);
            }
            if end < data.len() {
                b.end_record(fd)?;
                continue;
            }
            if eor && n > 0 {
                b.end_record(fd)?;
            }
            break Ok(());
        });
        match r {
            Ok(()) => Ok(done as i64),
            Err(_) if done > 0 => Ok(done as i64),
            Err(e) => Err(e),
        }
    }

    pub fn close(&self, fd: c_int) -> Res<c_int> {
        let mut g = self.lock();
        let r = g.close(fd).map(|_| 0);
        self.changed(&mut g);
        r
    }

    /// Runs `f` on the backend under the lock, then wakes the waiters.
    pub fn call<T>(&self, f: impl FnOnce(&mut Backend) -> T) -> T {
        let mut g = self.lock();
        let r = f(&mut g);
        self.changed(&mut g);
        r
    }

    /// `poll`: waits (in virtual time, `timeout` ms; negative: for ever) until one of
    /// `fds` is ready.
    pub fn poll(&self, fds: &mut [pollfd], timeout: c_int) -> Res<c_int> {
        let deadline = (timeout >= 0).then(|| self.lock().now_ns() + timeout as u64 * 1_000_000);
        let r = self.blocking(None, timeout == 0, deadline, |g| {
            g.pump();
            let mut ready = 0;
            for p in fds.iter_mut() {
                p.revents = 0;
                if p.fd < 0 {
                    continue;
                }
                let ev = g.revents(p.fd);
                p.revents = ev & (p.events | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL);
                if p.revents != 0 {
                    ready += 1;
                }
            }
            if ready > 0 {
                Ok(ready)
            } else {
                Err(libc::EAGAIN)
            }
        });
        match r {
            Err(libc::EAGAIN) => Ok(0),
            r => r,
        }
    }

    /// `epoll_wait`: waits like [`Shared::poll`] until an item reports.
    pub fn epoll_wait(&self, epfd: c_int, max: usize, timeout: c_int) -> Res<Vec<(u32, u64)>> {
        if max == 0 {
            return Err(libc::EINVAL);
        }
        let deadline = (timeout >= 0).then(|| self.lock().now_ns() + timeout as u64 * 1_000_000);
        let r = self.blocking(None, timeout == 0, deadline, |g| {
            let v = g.epoll_collect(epfd, max)?;
            if v.is_empty() {
                Err(libc::EAGAIN)
            } else {
                Ok(v)
            }
        });
        match r {
            Err(libc::EAGAIN) => Ok(Vec::new()),
            r => r,
        }
    }

    /// `netdev_send`: a packet from the script.
    pub fn netdev_send(&self, p: &[u8]) -> Res<c_int> {
        let mut g = self.lock();
        g.sync.main = Some(std::thread::current().id());
        let r = g.inject(p).map(|_| 0);
        self.changed(&mut g);
        r
    }

    /// `netdev_receive`: the next packet the stack sent, copied into `out` (cut to
    /// its size), with the wall-clock microseconds it was sent at. With none queued,
    /// the clock runs to the stack's next timer or a waiting call's deadline, at most
    /// [`SNIFF_HORIZON_NS`] per call; `None` when that brought nothing. A run in which
    /// nothing at all can happen any more ends the process (see [`STUCK_AFTER_NS`]).
    pub fn netdev_receive(&self, out: &mut [u8]) -> Option<(usize, i64)> {
        let mut g = self.lock();
        g.sync.main = Some(std::thread::current().id());
        let start = g.now_ns();
        let horizon = start.saturating_add(SNIFF_HORIZON_NS);
        let got = loop {
            g = self.settle(g);
            if let Some(p) = g.take_sent() {
                break Some(p);
            }
            let now = g.now_ns();
            let timer = g.stack_poll_at_ns().filter(|&t| t <= horizon);
            let waiter = g.sync.next_deadline(now).filter(|&t| t <= horizon);
            let quiet = timer.is_none()
                && waiter.is_none()
                && self.active.load(Ordering::SeqCst) <= 1 + g.sync.waiters.len();
            let to = match (timer, waiter) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => horizon,
            };
            g.advance_to(to.max(now + 1).min(horizon.max(now + 1)));
            self.changed(&mut g);
            if !quiet {
                g.sync.idle_run_ns = 0;
            }
            if g.now_ns() >= horizon {
                if quiet && g.stack_poll_at_ns().is_none() && g.out_is_empty() {
                    g.sync.idle_run_ns += g.now_ns() - start;
                    if g.sync.idle_run_ns >= STUCK_AFTER_NS {
                        eprintln!(
                            "usnet-packetdrill: the script waits for a packet, but for {} s of \
                             virtual time nothing was scheduled: the stack will never send it",
                            g.sync.idle_run_ns / 1_000_000_000
                        );
                        std::process::exit(1);
                    }
                }
                g = self.settle(g);
                break g.take_sent();
            }
        };
        let (p, t) = got?;
        g.sync.idle_run_ns = 0;
        let n = p.len().min(out.len());
        out[..n].copy_from_slice(&p[..n]);
        Some((n, g.wall_us(t)))
    }

    /// `usleep`: the clock runs on, stopping at every stack timer and at the
    /// deadlines of waiting calls (which then re-poll before it goes on).
    pub fn usleep(&self, us: u64) {
        // packetdrill sleeps with its own lock released: the moment for a thread
        // whose call completed to record the result (it needs that lock) before
        // the clock moves on.
        let mut g = self.lock();
        let start = RealInstant::now();
        loop {
            g = self.settle(g);
            if !self.finishing(&g) || start.elapsed() >= SETTLE_DEADLINE {
                break;
            }
            g = self.wait_for(g, Duration::from_millis(1));
        }
        let target = g.now_ns().saturating_add(us.saturating_mul(1000));
        loop {
            let now = g.now_ns();
            let stop = g.sync.next_deadline(now).map_or(target, |d| d.min(target));
            g.advance_to(stop);
            self.changed(&mut g);
            if stop >= target {
                break;
            }
            g = self.settle(g);
        }
    }

    /// `gettimeofday` in microseconds since the epoch. The first call from a thread
    /// whose blocking call just completed reads the time it completed at.
    pub fn gettimeofday(&self) -> i64 {
        let me = std::thread::current().id();
        let mut g = self.lock();
        if let Some(t) = g.sync.stamps.remove(&me) {
            g.sync.recording = Some((me, RealInstant::now()));
            return g.wall_us(t / 1000);
        }
        if g.sync.recording.is_some_and(|(t, _)| t == me) {
            g.sync.recording = None;
        }
        g = self.settle(g);
        let us = g.gettimeofday_us();
        self.changed(&mut g);
        us
    }
}
