//! The script's socket calls go through the socket layer `usnet run` and
//! `libusnet.so` use (usnet-posix, through `libusnet.so`'s own C functions), as a
//! client of a stack server running in this process on virtual time.
//!
//! The server is the real one (`usnet_server::ServerHandle`, its own loop thread,
//! sessions over shared memory) on an in-memory link, its clock a
//! [`ManualClock`] that only this module moves. The client side reads the same
//! virtual time (`usnet_client::vtime`), so `poll` timeouts and `SO_RCVTIMEO` count
//! it, and every thread asleep in a call says so. The clock moves only once the
//! world has *settled* ([`World::settle`]): the server's loop made a pass with
//! nothing to do, no frame waits in the link, and every other thread inside the
//! library sleeps having looked at the world since the last change. A call woken by
//! an injected packet thus completes at that packet's virtual time.
//!
//! The clock's rules: it stops at every stack timer and at a sleeping call's
//! deadline; `gettimeofday` ticks (packetdrill spins on the clock for the last
//! microseconds before an event); `netdev_receive` jumps to the next timer; and a
//! thread whose blocking call completed reads that call's completion time first
//! (packetdrill's `end_syscall`). The link is [`crate::link`].

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_long, c_longlong, c_uint, c_ulong, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant as RealInstant};

use libc::{iovec, msghdr, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};
use usnet_client::vtime::{self, Virtual};
use usnet_driver::{AnyClock, Clock, ManualClock, MemDevice, MemQueues};
use usnet_server::{Loop, ServerConfig, ServerHandle};
use usnet_stack::Stack;

use crate::config::{Options, Res};
use crate::layout::PacketdrillInterface;
use crate::link::{link_frame, script_frame, sort_frame, Sorted};

/// How far one `netdev_receive` lets the virtual clock run looking for a packet
/// before it reports "nothing" (packetdrill then asks again, and the clock runs on).
const SNIFF_HORIZON_NS: u64 = 1_000_000_000;

/// Longest real time the clock waits for woken calls to re-poll before it moves
/// anyway (a thread that never comes back must not hang the run).
const SETTLE_DEADLINE: Duration = Duration::from_secs(2);

/// Virtual seconds `netdev_receive` runs the clock while nothing at all is scheduled
/// (no stack timer, no waiting call with a deadline, no other thread inside the
/// library) before it gives up: the packet the script waits for can never come, and
/// packetdrill would ask for it forever.
const STUCK_AFTER_NS: u64 = 30 * SNIFF_HORIZON_NS;

/// Real time a thread whose blocking call completed gets to record its result
/// before the virtual clock moves on.
const RECORD_GRACE: Duration = Duration::from_millis(20);

/// Longest real time a job on the server's loop may take.
const LOOP_CALL: Duration = Duration::from_secs(5);

/// What the last settle that ended quiet saw.
#[derive(Clone, Copy)]
struct Settled {
    gen: u64,
    busy: u64,
    epoch: u64,
}

#[derive(Default)]
struct St {
    /// Packets the stack sent, for the script, with the virtual ns they left at.
    out: VecDeque<(Vec<u8>, u64)>,
    /// Virtual ns at which a thread's call that slept completed (its next
    /// `gettimeofday` reads it).
    stamps: HashMap<ThreadId, u64>,
    /// A thread that just collected the completion time of its call, and when:
    /// packetdrill records the call's result (an accepted descriptor) only after
    /// that, outside the library and under its own lock, so the next `usleep` waits
    /// [`RECORD_GRACE`] of real time (or until the thread calls in again) before
    /// the clock moves.
    recording: Option<(ThreadId, RealInstant)>,
    idle_run_ns: u64,
    sysctl_seen: usize,
}

/// The server, its link and its clock (see the module documentation).
pub struct World {
    server: Mutex<Option<ServerHandle>>,
    /// The supervisor answering packetdrill's own `getsockopt` (`crate::trap`).
    trap: Mutex<Option<crate::trap::Trap>>,
    queues: MemQueues,
    clock: ManualClock,
    vt: &'static Virtual,
    epoch_us: i64,
    tick_ns: u64,
    gso_mss: Option<u16>,
    sysctl_file: Option<String>,
    /// Threads inside a library call.
    active: AtomicUsize,
    /// Counts what changes the world for the loop and the sleepers: socket calls,
    /// injected frames, clock moves.
    gen: AtomicU64,
    settled: Mutex<Option<Settled>>,
    st: Mutex<St>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    /// Starts the server on virtual time and attaches this process to it.
    pub fn new(o: &Options) -> Result<Arc<World>, String> {
        let stack = Stack::new(crate::config::stack_config(o)).map_err(|e| format!("{e}"))?;
        let (dev, queues) = MemDevice::new("packetdrill", crate::config::device_caps(o))
            .map_err(|e| format!("in-memory link: {e}"))?;
        let clock = ManualClock::default();
        let name = format!("packetdrill-{}", std::process::id());
        let cfg = ServerConfig {
            name: name.clone(),
            link: "packetdrill".into(),
            // The loop answers the clock's many probes without waking from sleep.
            spin: Duration::from_millis(1),
            ..ServerConfig::default()
        };
        let server =
            ServerHandle::start_on(stack, Box::new(dev), cfg, AnyClock::Manual(clock.clone()))
                .map_err(|e| format!("stack server: {e}"))?;
        let reader = clock.clone();
        let vt = vtime::install(move || reader.now().as_nanos());
        let epoch_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        // Transmit timestamps read the wall clock as `gettimeofday` does.
        vt.set_wall_epoch(epoch_us * 1000);
        let w = Arc::new(World {
            server: Mutex::new(Some(server)),
            trap: Mutex::new(None),
            queues,
            clock,
            vt,
            epoch_us,
            tick_ns: o.tick_ns,
            gso_mss: o.gso_mss,
            sysctl_file: o.sysctl_file.clone(),
            active: AtomicUsize::new(0),
            gen: AtomicU64::new(0),
            settled: Mutex::new(None),
            st: Mutex::default(),
        });
        usnet_posix::attach(Some(&name)).map_err(|e| format!("attach: errno {}", e.0))?;
        let weak = Arc::downgrade(&w);
        vt.set_owner(std::thread::current().id(), move |deadline| {
            let Some(w) = weak.upgrade() else { return };
            match deadline {
                Some(d) => w.advance_to(d),
                None => eprintln!(
                    "usnet-packetdrill: a call the script expects to return at once (no \
                     time range) would block for ever: EAGAIN"
                ),
            }
        });
        if o.trap {
            match crate::trap::install(Arc::clone(&w)) {
                Ok(t) => *lock(&w.trap) = Some(t),
                Err(e) => eprintln!(
                    "usnet-packetdrill: packetdrill's own getsockopt(TCP_INFO) will not see \
                     usnet's values: {e}"
                ),
            }
        }
        Ok(w)
    }

    fn on_loop<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Loop) -> R + Send + 'static,
    ) -> Option<R> {
        lock(&self.server).as_ref()?.call(LOOP_CALL, f)
    }

    fn now_ns(&self) -> u64 {
        self.clock.now().as_nanos()
    }

    fn set_now(&self, ns: u64) {
        self.gen.fetch_add(1, SeqCst);
        self.clock.set(usnet_stack::Instant::from_nanos(ns));
    }

    fn wall_us(&self, ns: u64) -> i64 {
        self.epoch_us + (ns / 1000) as i64
    }

    /// The loop's count of busy passes, and whether it has nothing to do.
    fn probe(&self) -> Option<(u64, bool)> {
        self.on_loop(|lp| (lp.busy_passes, lp.quiet()))
    }

    /// Takes what the stack sent: ARP and NDP are answered, IP packets queued for
    /// the script at the present virtual time.
    fn collect(&self) {
        let now = self.now_ns();
        while let Some((f, _)) = self.queues.take_sent() {
            match sort_frame(&f) {
                Sorted::Answer(et, reply) => self.queues.inject(&link_frame(et, &reply)),
                Sorted::ToScript(ip) => lock(&self.st).out.push_back((ip, now)),
                Sorted::Dropped => {}
            }
        }
    }

    /// Waits until the world has settled (see the module documentation), at most
    /// [`SETTLE_DEADLINE`] of real time.
    fn settle(&self) {
        let me = std::thread::current().id();
        let gen = self.gen.load(SeqCst);
        if self.still_settled(gen, me) {
            return;
        }
        let start = RealInstant::now();
        loop {
            let before = self.probe();
            let epoch = self.vt.kick();
            loop {
                let others = self.active.load(SeqCst).saturating_sub(1);
                if self.vt.settled(epoch, me) >= others || start.elapsed() >= SETTLE_DEADLINE {
                    break;
                }
                self.vt.wait_for_sleepers(Duration::from_millis(1));
            }
            let after = self.probe();
            self.collect();
            let quiet = self.queues.rx_pending() == 0
                && matches!((before, after), (Some((a, _)), Some((b, true))) if a == b);
            if quiet {
                *lock(&self.settled) = after.map(|(busy, _)| Settled { gen, busy, epoch });
            }
            if quiet || start.elapsed() >= SETTLE_DEADLINE {
                if !quiet && std::env::var_os("USNET_PD_DEBUG").is_some() {
                    eprintln!(
                        "usnet-packetdrill: settle gave up: active {} asleep {} since-kick {} \
                         loop {:?} -> {:?} rx {}",
                        self.active.load(SeqCst),
                        self.vt.sleeping(me),
                        self.vt.settled(epoch, me),
                        before,
                        after,
                        self.queues.rx_pending()
                    );
                }
                return;
            }
        }
    }

    /// Nothing happened since the last settle that ended quiet: no call, frame or
    /// clock move (`gen`), no busy pass of the loop, every other thread inside the
    /// library asleep since then.
    fn still_settled(&self, gen: u64, me: ThreadId) -> bool {
        let Some(last) = *lock(&self.settled) else {
            return false;
        };
        let others = self.active.load(SeqCst).saturating_sub(1);
        last.gen == gen
            && self.queues.rx_pending() == 0
            && self.vt.settled(last.epoch, me) >= others
            && self.probe() == Some((last.busy, true))
    }

    fn poll_at_ns(&self) -> Option<u64> {
        self.on_loop(|lp| lp.stack().poll_at().map(|t| t.as_nanos()))
            .flatten()
    }

    /// Moves the clock to `target_ns`, stopping at every stack timer on the way.
    fn advance_to(&self, target_ns: u64) {
        loop {
            self.settle();
            let now = self.now_ns();
            match self.poll_at_ns() {
                Some(t) if t > now && t <= target_ns => self.set_now(t),
                Some(t) if t <= now => {
                    if now >= target_ns {
                        break;
                    }
                    self.set_now((now + 1_000).min(target_ns));
                }
                _ => {
                    self.set_now(target_ns);
                    self.settle();
                    break;
                }
            }
        }
    }

    /// Applies the sysctl lines appended to the script's sysctl file since the last
    /// call to the server's stack.
    fn apply_sysctl_file(&self) {
        let Some(path) = &self.sysctl_file else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        let lines = {
            let mut st = lock(&self.st);
            if text.len() <= st.sysctl_seen {
                return;
            }
            let new = &text[st.sysctl_seen..];
            let upto = new.rfind('\n').map_or(0, |i| i + 1);
            st.sysctl_seen += upto;
            new[..upto].to_string()
        };
        if lines.is_empty() {
            return;
        }
        let _ = self.on_loop(move |lp| {
            for line in lines.lines() {
                crate::config::apply_sysctl_line(lp.stack(), line);
            }
        });
    }

    fn take_sent(&self) -> Option<(Vec<u8>, u64)> {
        lock(&self.st).out.pop_front()
    }

    fn netdev_send(&self, ip: &[u8]) -> Res<c_int> {
        let (f, o) = script_frame(ip, self.gso_mss)?;
        self.gen.fetch_add(1, SeqCst);
        self.queues.inject_with(&f, o);
        self.settle();
        Ok(0)
    }

    /// The next packet the stack sent, with the wall-clock µs it left at: the
    /// clock runs to the next thing that can happen (a stack timer, a sleeping
    /// call's deadline), at most [`SNIFF_HORIZON_NS`] per call; `None` when that
    /// brought nothing. A run in which nothing at all can happen any more ends the
    /// process (see [`STUCK_AFTER_NS`]).
    fn netdev_receive(&self, out: &mut [u8]) -> Option<(usize, i64)> {
        let start = self.now_ns();
        let horizon = start.saturating_add(SNIFF_HORIZON_NS);
        let got = loop {
            self.settle();
            if let Some(p) = self.take_sent() {
                break Some(p);
            }
            let now = self.now_ns();
            let timer = self.poll_at_ns().filter(|&t| t <= horizon);
            let waiter = self.vt.next_deadline(now).filter(|&t| t <= horizon);
            let me = std::thread::current().id();
            let quiet = timer.is_none()
                && waiter.is_none()
                && self.active.load(SeqCst) <= 1 + self.vt.sleeping(me);
            let to = match (timer, waiter) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => horizon,
            };
            self.advance_to(to.max(now + 1).min(horizon.max(now + 1)));
            if !quiet {
                lock(&self.st).idle_run_ns = 0;
            }
            if self.now_ns() >= horizon {
                if quiet && self.poll_at_ns().is_none() && lock(&self.st).out.is_empty() {
                    let mut st = lock(&self.st);
                    st.idle_run_ns += self.now_ns() - start;
                    if st.idle_run_ns >= STUCK_AFTER_NS {
                        eprintln!(
                            "usnet-packetdrill: the script waits for a packet, but for {} s of \
                             virtual time nothing was scheduled: the stack will never send it",
                            st.idle_run_ns / 1_000_000_000
                        );
                        std::process::exit(1);
                    }
                }
                self.settle();
                break self.take_sent();
            }
        };
        let (p, t) = got?;
        lock(&self.st).idle_run_ns = 0;
        let n = p.len().min(out.len());
        out[..n].copy_from_slice(&p[..n]);
        Some((n, self.wall_us(t)))
    }

    /// Whether another thread still finishes a call that slept (its completion time
    /// not yet collected, or its result not yet recorded).
    fn finishing(&self) -> bool {
        let me = std::thread::current().id();
        let st = lock(&self.st);
        st.stamps.keys().any(|&t| t != me)
            || st
                .recording
                .is_some_and(|(t, at)| t != me && at.elapsed() < RECORD_GRACE)
    }

    fn usleep(&self, us: u64) {
        let start = RealInstant::now();
        loop {
            self.settle();
            if !self.finishing() || start.elapsed() >= SETTLE_DEADLINE {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let target = self.now_ns().saturating_add(us.saturating_mul(1000));
        loop {
            let now = self.now_ns();
            let stop = self.vt.next_deadline(now).map_or(target, |d| d.min(target));
            self.advance_to(stop);
            if stop >= target {
                break;
            }
        }
    }

    fn gettimeofday(&self) -> i64 {
        let me = std::thread::current().id();
        {
            let mut st = lock(&self.st);
            if let Some(t) = st.stamps.remove(&me) {
                st.recording = Some((me, RealInstant::now()));
                return self.wall_us(t);
            }
            if st.recording.is_some_and(|(t, _)| t == me) {
                st.recording = None;
            }
        }
        self.settle();
        self.advance_to(self.now_ns() + self.tick_ns);
        self.wall_us(self.now_ns())
    }

    /// Runs one of packetdrill's calls: counted as inside the library, the sysctl
    /// file applied first; a call that slept leaves its completion time for the
    /// thread's next `gettimeofday`.
    fn call<T>(&self, f: impl FnOnce() -> T) -> T {
        self.active.fetch_add(1, SeqCst);
        let me = std::thread::current().id();
        {
            let mut st = lock(&self.st);
            if st.recording.is_some_and(|(t, _)| t == me) {
                st.recording = None;
            }
        }
        self.apply_sysctl_file();
        let r = f();
        if self.vt.take_slept() {
            let now = self.now_ns();
            lock(&self.st).stamps.insert(me, now);
        }
        self.active.fetch_sub(1, SeqCst);
        r
    }

    fn shutdown(&self) {
        // The supervisor holds a reference to the world: stop it first.
        let trap = lock(&self.trap).take();
        drop(trap);
        if let Some(mut s) = lock(&self.server).take() {
            let _ = s.shutdown();
        }
    }
}

impl crate::trap::Answer for World {
    fn value(&self, sock: c_int, level: c_int, name: c_int) -> Option<Result<Vec<u8>, c_int>> {
        if !usnet_posix::is_usnet(sock) {
            return None;
        }
        let mut buf = vec![0u8; 512];
        Some(self.call(|| {
            usnet_posix::getsockopt(sock, level, name, &mut buf)
                .map(|n| buf[..n].to_vec())
                .map_err(|e| e.0)
        }))
    }

    fn owns(&self, fd: c_int) -> bool {
        usnet_posix::is_usnet(fd)
    }

    fn write(&self, fd: c_int, data: &[u8]) -> Result<usize, c_int> {
        self.call(|| usnet_posix::sendto(fd, data, 0, None).map_err(|e| e.0))
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f` (a `libusnet.so` call that sets errno itself) as one of the world's
/// calls; a panic becomes `EIO`.
fn with<T: From<i8>>(ud: *mut c_void, f: impl FnOnce(&World) -> T) -> T {
    run(ud, true, f)
}

/// [`with`] for the world's own calls (the link and the clock), which return
/// `Res` and change the world themselves where they do.
fn with_res(ud: *mut c_void, f: impl FnOnce(&World) -> Res<c_int>) -> c_int {
    run(ud, false, |w| match f(w) {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// A call into the world; `socket_call`: a socket call (it may change what the
/// loop and the sleepers see).
fn run<T: From<i8>>(ud: *mut c_void, socket_call: bool, f: impl FnOnce(&World) -> T) -> T {
    if ud.is_null() {
        set_errno(libc::EBADF);
        return T::from(-1);
    }
    // SAFETY: `ud` is the pointer `init` made from an Arc<World>; only free releases it.
    let w = unsafe { &*(ud as *const World) };
    let r = catch_unwind(AssertUnwindSafe(|| w.call(|| f(w))));
    if socket_call {
        w.gen.fetch_add(1, SeqCst);
    }
    match r {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            T::from(-1)
        }
    }
}

unsafe extern "C" fn px_free(ud: *mut c_void) {
    if !ud.is_null() {
        // SAFETY: made by Arc::into_raw in `init`; freed once.
        let w = unsafe { Arc::from_raw(ud as *const World) };
        w.shutdown();
    }
}

unsafe extern "C" fn px_socket(ud: *mut c_void, d: c_int, t: c_int, p: c_int) -> c_int {
    with(ud, |_| usnet_ffi::socket::usnet_socket(d, t, p))
}

unsafe extern "C" fn px_bind(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    // SAFETY: bind(2) contract, passed on.
    with(ud, |_| unsafe { usnet_ffi::socket::usnet_bind(fd, a, l) })
}

unsafe extern "C" fn px_listen(ud: *mut c_void, fd: c_int, backlog: c_int) -> c_int {
    with(ud, |_| usnet_ffi::socket::usnet_listen(fd, backlog))
}

unsafe extern "C" fn px_accept(
    ud: *mut c_void,
    fd: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> c_int {
    // SAFETY: accept(2) contract, passed on.
    with(ud, |_| unsafe { usnet_ffi::socket::usnet_accept(fd, a, l) })
}

unsafe extern "C" fn px_connect(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    // SAFETY: connect(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_connect(fd, a, l)
    })
}

unsafe extern "C" fn px_read(ud: *mut c_void, fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: read(2) contract, passed on.
    with(ud, |_| unsafe { usnet_ffi::socket::usnet_read(fd, buf, n) })
}

unsafe extern "C" fn px_readv(ud: *mut c_void, fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: readv(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_readv(fd, iov, n)
    })
}

unsafe extern "C" fn px_recv(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: recv(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_recv(fd, buf, n, flags)
    })
}

unsafe extern "C" fn px_recvfrom(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    // SAFETY: recvfrom(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_recvfrom(fd, buf, n, flags, a, l)
    })
}

unsafe extern "C" fn px_recvmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *mut msghdr,
    flags: c_int,
) -> ssize_t {
    // SAFETY: recvmsg(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_recvmsg(fd, m, flags)
    })
}

unsafe extern "C" fn px_write(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: write(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_write(fd, buf, n)
    })
}

unsafe extern "C" fn px_writev(ud: *mut c_void, fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    // SAFETY: writev(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_writev(fd, iov, n)
    })
}

unsafe extern "C" fn px_send(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: send(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_send(fd, buf, n, flags)
    })
}

unsafe extern "C" fn px_sendto(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> ssize_t {
    // SAFETY: sendto(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_sendto(fd, buf, n, flags, a, l)
    })
}

unsafe extern "C" fn px_sendmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *const msghdr,
    flags: c_int,
) -> ssize_t {
    // SAFETY: sendmsg(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_sendmsg(fd, m, flags)
    })
}

unsafe extern "C" fn px_fcntl(ud: *mut c_void, fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    with(ud, |_| usnet_ffi::socket::usnet_fcntl(fd, cmd, arg))
}

unsafe extern "C" fn px_ioctl(ud: *mut c_void, fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: FIONREAD/FIONBIO take an int*; the layer checks the request.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_ioctl(fd, req, arg.cast())
    })
}

unsafe extern "C" fn px_close(ud: *mut c_void, fd: c_int) -> c_int {
    with(ud, |_| {
        if usnet_posix::is_usnet(fd) {
            usnet_ffi::socket::usnet_close(fd)
        } else {
            // A script's pipe is the kernel's, as under the shim.
            // SAFETY: close has no memory arguments.
            unsafe { libc::close(fd) }
        }
    })
}

unsafe extern "C" fn px_shutdown(ud: *mut c_void, fd: c_int, how: c_int) -> c_int {
    with(ud, |_| usnet_ffi::socket::usnet_shutdown(fd, how))
}

unsafe extern "C" fn px_getsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    l: *mut socklen_t,
) -> c_int {
    // SAFETY: getsockopt(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_getsockopt(fd, level, name, v, l)
    })
}

unsafe extern "C" fn px_setsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    l: socklen_t,
) -> c_int {
    // SAFETY: setsockopt(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_setsockopt(fd, level, name, v, l)
    })
}

unsafe extern "C" fn px_poll(
    ud: *mut c_void,
    fds: *mut pollfd,
    n: libc::nfds_t,
    t: c_int,
) -> c_int {
    // SAFETY: poll(2) contract, passed on.
    with(ud, |_| unsafe { usnet_ffi::socket::usnet_poll(fds, n, t) })
}

unsafe extern "C" fn px_netdev_send(ud: *mut c_void, buf: *const c_void, n: size_t) -> c_int {
    with_res(ud, |w| {
        if buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: packetdrill passes `n` bytes of packet.
        let p = unsafe { std::slice::from_raw_parts(buf as *const u8, n) };
        w.netdev_send(p)
    })
}

unsafe extern "C" fn px_netdev_receive(
    ud: *mut c_void,
    buf: *mut c_void,
    count: *mut size_t,
    time_us: *mut c_longlong,
) -> c_int {
    with_res(ud, |w| {
        if count.is_null() || buf.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `*count` is the size of `buf` (packetdrill.h).
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, *count) };
        match w.netdev_receive(out) {
            Some((n, t)) => {
                // SAFETY: out-parameters from the caller.
                unsafe {
                    *count = n;
                    if !time_us.is_null() {
                        *time_us = t as c_longlong;
                    }
                }
                Ok(0)
            }
            None => {
                // SAFETY: as above.
                unsafe { *count = 0 };
                Err(libc::EAGAIN)
            }
        }
    })
}

unsafe extern "C" fn px_usleep(ud: *mut c_void, us: libc::useconds_t) -> c_int {
    with_res(ud, |w| {
        w.usleep(us as u64);
        Ok(0)
    })
}

unsafe extern "C" fn px_gettimeofday(ud: *mut c_void, tv: *mut timeval, _tz: *mut c_void) -> c_int {
    with_res(ud, |w| {
        let us = w.gettimeofday();
        if !tv.is_null() {
            // SAFETY: gettimeofday(2) contract.
            unsafe {
                (*tv).tv_sec = us.div_euclid(1_000_000) as libc::time_t;
                (*tv).tv_usec = us.rem_euclid(1_000_000) as libc::suseconds_t;
            }
        }
        Ok(0)
    })
}

unsafe extern "C" fn px_epoll_create(ud: *mut c_void, size: c_int) -> c_int {
    with(ud, |_| usnet_ffi::socket::usnet_epoll_create(size))
}

unsafe extern "C" fn px_epoll_ctl(
    ud: *mut c_void,
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    // SAFETY: epoll_ctl(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_epoll_ctl(epfd, op, fd, ev)
    })
}

unsafe extern "C" fn px_epoll_wait(
    ud: *mut c_void,
    epfd: c_int,
    out: *mut libc::epoll_event,
    max: c_int,
    t: c_int,
) -> c_int {
    // SAFETY: epoll_wait(2) contract, passed on.
    with(ud, |_| unsafe {
        usnet_ffi::socket::usnet_epoll_wait(epfd, out, max, t)
    })
}

unsafe extern "C" fn px_pipe(ud: *mut c_void, fds: *mut c_int) -> c_int {
    // SAFETY: pipe(2) contract: the kernel's.
    with(ud, |_| unsafe { libc::pipe(fds) })
}

unsafe extern "C" fn px_splice(
    ud: *mut c_void,
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // packetdrill passes pointers to the script's offset arguments: a script's
    // NULL arrives as a pointer to 0 (see `crate::ffi`'s splice).
    // SAFETY: null or pointers to packetdrill's loff_t values.
    let given = |p: *mut libc::loff_t| !p.is_null() && unsafe { *p } != 0;
    let offsets = given(off_in) || given(off_out);
    with(ud, |_| {
        match usnet_posix::splice(fd_in, fd_out, offsets, n, flags) {
            Ok(n) => n as ssize_t,
            Err(e) => {
                set_errno(e.0);
                -1
            }
        }
    })
}

/// packetdrill's entry point: fills `ifc` (every member, so no call hits a null
/// pointer). On a bad `flags` string, or a world that cannot start, it prints why
/// and leaves `userdata` null, so every call then fails with `EBADF`.
///
/// # Safety
/// `ifc` must point to a writable `struct packetdrill_interface`; `flags` is null or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn packetdrill_interface_init(
    flags: *const std::ffi::c_char,
    ifc: *mut PacketdrillInterface,
) {
    if ifc.is_null() {
        return;
    }
    let flags = if flags.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string from packetdrill's command line.
        unsafe { std::ffi::CStr::from_ptr(flags) }
            .to_string_lossy()
            .into_owned()
    };
    let made = catch_unwind(|| Options::parse(&flags).and_then(|o| World::new(&o)));
    // SAFETY: checked non-null; the caller owns a struct of this layout.
    init(made, unsafe { &mut *ifc });
}

/// The packetdrill.h member count this library fills (checked by the C driver test
/// against `sizeof(struct packetdrill_interface)`).
#[no_mangle]
pub extern "C" fn usnet_packetdrill_interface_size() -> size_t {
    std::mem::size_of::<PacketdrillInterface>()
}

/// Fills `ifc` with this module's functions over the world `made` (if it started).
fn init(made: std::thread::Result<Result<Arc<World>, String>>, ifc: &mut PacketdrillInterface) {
    let userdata = match made {
        Ok(Ok(w)) => Arc::into_raw(w) as *mut c_void,
        Ok(Err(e)) => {
            eprintln!("usnet-packetdrill: {e}");
            std::ptr::null_mut()
        }
        Err(_) => std::ptr::null_mut(),
    };
    *ifc = PacketdrillInterface {
        userdata,
        free: Some(px_free),
        socket: Some(px_socket),
        bind: Some(px_bind),
        listen: Some(px_listen),
        accept: Some(px_accept),
        connect: Some(px_connect),
        read: Some(px_read),
        readv: Some(px_readv),
        recv: Some(px_recv),
        recvfrom: Some(px_recvfrom),
        recvmsg: Some(px_recvmsg),
        write: Some(px_write),
        writev: Some(px_writev),
        send: Some(px_send),
        sendto: Some(px_sendto),
        sendmsg: Some(px_sendmsg),
        fcntl: Some(px_fcntl),
        ioctl: Some(px_ioctl),
        close: Some(px_close),
        shutdown: Some(px_shutdown),
        getsockopt: Some(px_getsockopt),
        setsockopt: Some(px_setsockopt),
        poll: Some(px_poll),
        netdev_send: Some(px_netdev_send),
        netdev_receive: Some(px_netdev_receive),
        usleep: Some(px_usleep),
        gettimeofday: Some(px_gettimeofday),
        epoll_create: Some(px_epoll_create),
        epoll_ctl: Some(px_epoll_ctl),
        epoll_wait: Some(px_epoll_wait),
        pipe: Some(px_pipe),
        splice: Some(px_splice),
    };
}
