//! Runs a program that no LD_PRELOAD shim reaches (statically linked, or Go) with
//! its AF_INET/AF_INET6 sockets on a usnet stack server: a seccomp filter hands its
//! socket calls to this process (the supervisor), which answers them with relays
//! (relay.rs) over usnet-posix. Design and limits: docs/seccomp.md.

pub mod args;
mod filter;
mod notify;
mod numbers;
mod relay;
mod threads;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use usnet_posix as posix;

use args::{Mem, MsgAt, Thread};
pub use filter::{DGRAM_BASE, STREAM_BASE};
use notify::{Answer, Call, Listener};
use relay::{Kind, Relay, State};

/// How the supervisor treats loopback addresses (as the shim: they stay on the
/// kernel unless `loopback_usnet`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    pub loopback_usnet: bool,
    pub debug: bool,
}

struct Supervisor {
    listener: Arc<Listener>,
    /// Relays by the inode of the program's end.
    relays: Arc<Mutex<HashMap<u64, Arc<Relay>>>>,
    /// The numbers relays take: datagram relays' range, then streams'.
    numbers: Arc<Mutex<[numbers::Range; 2]>>,
    pidfds: Arc<notify::Pidfds>,
    opts: Options,
}

/// The range of `Supervisor::numbers` a relay of `kind` takes its number from.
fn range_of(kind: Kind) -> usize {
    match kind {
        Kind::Dgram => 0,
        Kind::Stream => 1,
    }
}

/// Runs `cmd` under the supervisor until every process of it has exited; its
/// status is the first process's.
pub fn run(mut cmd: Command, opts: Options) -> io::Result<ExitStatus> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let handover = theirs.as_raw_fd();
    let program = filter::program();
    // SAFETY: the closure makes only async-signal-safe calls (prctl, seccomp,
    // sendmsg, close) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let prog = libc::sock_fprog {
                len: program.len() as u16,
                filter: program.as_ptr() as *mut _,
            };
            let flags = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
                | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
            let lfd = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &prog as *const libc::sock_fprog,
            );
            if lfd < 0 {
                return Err(io::Error::last_os_error());
            }
            // (No allocation on this path: fine between fork and exec.)
            let lfd = OwnedFd::from_raw_fd(lfd as RawFd);
            let sock = std::os::fd::BorrowedFd::borrow_raw(handover);
            usnet_shm::fdpass::send_with_fds(sock, &[0], &[lfd.as_fd()])
        });
    }
    let mut child = cmd.spawn()?;
    drop(theirs);
    let mut byte = [0u8; 1];
    let (_, mut fds) = usnet_shm::fdpass::recv_with_fds(&ours, &mut byte)?;
    let lfd = fds
        .pop()
        .ok_or_else(|| io::Error::other("the program did not hand over its seccomp listener"))?;
    let listener = Arc::new(Listener::new(lfd));
    let pid = child.id() as i32;
    forward_signals(pid);
    let sup = Supervisor {
        listener,
        relays: Arc::new(Mutex::new(HashMap::new())),
        numbers: Arc::new(Mutex::new([
            numbers::Range::new(DGRAM_BASE as i32, STREAM_BASE as i32),
            numbers::Range::new(STREAM_BASE as i32, i32::MAX),
        ])),
        pidfds: Arc::default(),
        opts,
    };
    sup.janitor();
    // Several threads answer calls, as the kernel serves a program's threads at
    // once: a call that waits (for the stack, or to install a relay and start its
    // threads) no longer holds up the others'. Twice the cores: most of a call's
    // time is spent waiting. On two cores, 4 against 1: a Go program's 8
    // goroutines dialling 2,600–2,800 connections a second against 2,200–2,400.
    let serving = std::thread::available_parallelism().map_or(2, |n| 2 * n.get());
    for _ in 1..serving.clamp(2, 16) {
        let sup = sup.clone_handle();
        std::thread::Builder::new()
            .name("usnet-seccomp".into())
            .spawn(move || sup.serve())?;
    }
    sup.serve()?;
    child.wait()
}

/// SIGTERM and SIGHUP sent to `usnet run` go on to the program; SIGINT and SIGQUIT
/// from the terminal reach it on their own (same process group), so they are
/// ignored here.
fn forward_signals(pid: i32) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let Ok(mut sigs) = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT])
    else {
        return;
    };
    std::thread::spawn(move || {
        for s in sigs.forever() {
            if s == SIGTERM || s == SIGHUP {
                // SAFETY: a plain kill of our child.
                unsafe { libc::kill(pid, s) };
            }
        }
    });
}

fn errno_of(e: posix::Errno) -> Answer {
    Answer::Errno(e.0)
}

fn io_errno(e: io::Error) -> Answer {
    Answer::Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

fn is_loopback(a: &SocketAddr) -> bool {
    match a {
        SocketAddr::V4(v) => v.ip().is_loopback(),
        SocketAddr::V6(v) => {
            v.ip().is_loopback() || v.ip().to_ipv4_mapped().is_some_and(|m| m.is_loopback())
        }
    }
}

impl Supervisor {
    fn serve(&self) -> io::Result<()> {
        loop {
            let mut p = [libc::pollfd {
                fd: self.listener.raw(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 1, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            if p[0].revents & libc::POLLIN != 0 {
                if let Some(call) = self.listener.recv()? {
                    let a = self.handle(&call);
                    if let Some(a) = a {
                        self.listener.answer(&call, a);
                    }
                }
                continue;
            }
            // No task carries the filter any more: every process has exited.
            if p[0].revents & libc::POLLHUP != 0 {
                return Ok(());
            }
        }
    }

    /// The answer to `call`, or `None` when it is (or will be) answered elsewhere
    /// (by installing a descriptor, or by a thread that waits for the stack).
    fn handle(&self, call: &Call) -> Option<Answer> {
        let a = call.args;
        if call.nr == libc::SYS_socket {
            return self.socket(call, a[0] as i32, a[1] as i32, a[2] as i32);
        }
        let fd = a[0] as i32;
        let theirs = match self.pidfds.their_file(call.tid, fd) {
            Ok(f) => f,
            Err(_) => return Some(Answer::Continue),
        };
        let Ok(ino) = notify::inode(theirs.as_raw_fd()) else {
            return Some(Answer::Continue);
        };
        let relay = self
            .relays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ino)
            .cloned();
        let Some(r) = relay else {
            return Some(Answer::Continue);
        };
        if self.opts.debug {
            eprintln!("usnet-seccomp: {} on relay fd {fd}", call.nr);
        }
        match call.nr {
            libc::SYS_connect => self.connect(call, &r, fd, ino),
            libc::SYS_bind => self.bind(call, &r, fd, ino),
            libc::SYS_listen => {
                let backlog = a[1] as i32;
                self.in_use_retried(call, &r, move |sup, r| sup.listen(r, ino, backlog))
            }
            libc::SYS_accept | libc::SYS_accept4 => {
                let flags = if call.nr == libc::SYS_accept4 {
                    a[3] as i32
                } else {
                    0
                };
                self.accept(call, &r, theirs, flags)
            }
            libc::SYS_getsockname => Some(self.name(call, posix::getsockname(r.usnet))),
            libc::SYS_getpeername => Some(self.name(call, posix::getpeername(r.usnet))),
            libc::SYS_getsockopt => Some(self.getsockopt(call, &r)),
            libc::SYS_setsockopt => Some(self.setsockopt(call, &r)),
            libc::SYS_shutdown if r.kind == Kind::Stream => Some(Answer::Continue),
            libc::SYS_shutdown => Some(
                posix::shutdown(r.usnet, a[1] as i32).map_or_else(errno_of, |_| Answer::Value(0)),
            ),
            _ if r.kind == Kind::Dgram => self.data(call, &r, theirs),
            _ => Some(Answer::Continue),
        }
    }

    /// Forgets the relay of `ino` (its usnet socket closes under the map's lock:
    /// see `closed_but_held`) and gives its number back to its range.
    fn forget(&self, ino: u64) -> impl FnOnce() + Send + 'static {
        let (relays, numbers) = (Arc::clone(&self.relays), Arc::clone(&self.numbers));
        move || {
            let freed = relays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&ino)
                .map(|r| (r.kind, r.number.load(Relaxed)));
            if let Some((kind, n)) = freed {
                numbers.lock().unwrap_or_else(|p| p.into_inner())[range_of(kind)].give_back(n);
            }
        }
    }

    fn socket(&self, call: &Call, domain: i32, ty: i32, proto: i32) -> Option<Answer> {
        if domain == libc::AF_NETLINK {
            return self.netlink_socket(call, ty, proto);
        }
        let base = ty & 0xf;
        let kind = match (base, proto) {
            (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => Kind::Stream,
            (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => Kind::Dgram,
            // Raw and ping sockets stay on the kernel.
            _ => return Some(Answer::Continue),
        };
        let usnet = match posix::socket(domain, base, proto) {
            Ok(fd) => fd,
            Err(e) => return Some(errno_of(e)),
        };
        let (ours, theirs) = match pair() {
            Ok(p) => p,
            Err(e) => {
                let _ = posix::close(usnet);
                return Some(io_errno(e));
            }
        };
        if ty & libc::SOCK_NONBLOCK != 0 {
            set_nonblocking(theirs.as_raw_fd());
        }
        let relay = Arc::new(Relay::new(kind, domain, usnet, ours, State::Fresh));
        self.install_relay(call, relay, theirs, ty & libc::SOCK_CLOEXEC != 0)
    }

    /// rtnetlink in the stack's interface mirror (Go's `net.Interfaces` asks it
    /// directly), installed at the caller's lowest free number as the kernel's
    /// would be; every other netlink protocol, or a stack without a mirror, is the
    /// kernel's.
    fn netlink_socket(&self, call: &Call, ty: i32, proto: i32) -> Option<Answer> {
        if proto != libc::NETLINK_ROUTE {
            return Some(Answer::Continue);
        }
        let Ok(fd) = posix::netlink_socket(ty | libc::SOCK_CLOEXEC, proto) else {
            return Some(Answer::Continue);
        };
        // SAFETY: just made for this call, ours until closed here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let cloexec = ty & libc::SOCK_CLOEXEC != 0;
        match self
            .listener
            .install(call, fd.as_raw_fd(), None, cloexec, true)
        {
            Ok(_) => None,
            Err(e) => Some(io_errno(e)),
        }
    }

    /// Installs `theirs` in the caller as the call's result, remembering `relay`;
    /// `None` once installed (that answered the call), else the error.
    fn install_relay(
        &self,
        call: &Call,
        relay: Arc<Relay>,
        theirs: OwnedFd,
        cloexec: bool,
    ) -> Option<Answer> {
        // Held until the number is installed: a listing of the table meanwhile
        // (another call answered from a thread of its own) would find it free.
        let mut numbers = self.numbers.lock().unwrap_or_else(|p| p.into_inner());
        let number = match numbers[range_of(relay.kind)].take(&numbers::ProcTable(call.tid)) {
            Ok(n) => n,
            Err(e) => return Some(io_errno(e)),
        };
        relay.number.store(number, Relaxed);
        let Ok(ino) = notify::inode(theirs.as_raw_fd()) else {
            return Some(Answer::Errno(libc::EIO));
        };
        let state = *relay.state.lock().unwrap_or_else(|p| p.into_inner());
        self.relays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ino, Arc::clone(&relay));
        if let Err(e) = self
            .listener
            .install(call, theirs.as_raw_fd(), Some(number), cloexec, true)
        {
            self.relays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&ino);
            numbers[range_of(relay.kind)].give_back(number);
            return Some(io_errno(e));
        }
        drop(numbers);
        match (relay.kind, state) {
            (Kind::Dgram, _) => relay.watch_token(self.forget(ino)),
            (Kind::Stream, State::Connected) => relay.pump(self.forget(ino)),
            // A fresh stream relay: its connect or listen starts the thread that
            // notices its close; the janitor forgets one closed unused.
            _ => {}
        }
        None
    }

    /// Forgets fresh stream relays the program closed without using them.
    fn janitor(&self) {
        let (relays, numbers) = (Arc::clone(&self.relays), Arc::clone(&self.numbers));
        std::thread::spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let mut freed = Vec::new();
            relays
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|_, r| {
                    let keep = *r.state.lock().unwrap_or_else(|p| p.into_inner()) != State::Fresh
                        || !r.program_gone();
                    if !keep {
                        freed.push((r.kind, r.number.load(Relaxed)));
                    }
                    keep
                });
            let mut numbers = numbers.lock().unwrap_or_else(|p| p.into_inner());
            for (kind, n) in freed {
                numbers[range_of(kind)].give_back(n);
            }
        });
    }

    /// Reads the sockaddr of `len` bytes at `ptr` in the caller.
    fn their_addr(&self, call: &Call, ptr: u64, len: u64) -> Result<SocketAddr, Answer> {
        args::sockaddr(&Thread(call.tid), ptr, len).map_err(Answer::Errno)
    }

    /// Writes `addr` to a (sockaddr *, socklen_t *) pair of the caller's.
    fn put_addr(&self, call: &Call, ptr: u64, lenp: u64, addr: SocketAddr) -> Result<(), Answer> {
        args::put_addr(&Thread(call.tid), ptr, lenp, addr).map_err(Answer::Errno)
    }

    /// A loopback address on a fresh relay: the caller's number becomes a kernel
    /// socket (as the shim does), and the kernel does the call.
    fn to_kernel(&self, call: &Call, r: &Relay, fd: i32, ino: u64) -> Answer {
        let s = match posix::surrender(r.usnet) {
            Ok(s) => s,
            Err(e) => return errno_of(e),
        };
        // SAFETY: a plain socket call; the result is checked.
        let k = unsafe { libc::socket(s.domain, s.stype | libc::SOCK_CLOEXEC, 0) };
        if k < 0 {
            return io_errno(io::Error::last_os_error());
        }
        // SAFETY: the kernel just gave it.
        let k = unsafe { OwnedFd::from_raw_fd(k) };
        if s.nonblock {
            set_nonblocking(k.as_raw_fd());
        }
        let on: i32 = 1;
        for (yes, level, name) in [
            (s.reuseaddr, libc::SOL_SOCKET, libc::SO_REUSEADDR),
            (s.reuseport, libc::SOL_SOCKET, libc::SO_REUSEPORT),
            (s.keepalive, libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            (s.nodelay, libc::IPPROTO_TCP, libc::TCP_NODELAY),
        ] {
            if yes {
                // SAFETY: an int option.
                unsafe {
                    libc::setsockopt(k.as_raw_fd(), level, name, (&on as *const i32).cast(), 4)
                };
            }
        }
        let cloexec = notify::fd_flags(call.tid, fd).is_ok_and(|f| f.1);
        if let Err(e) = self
            .listener
            .install(call, k.as_raw_fd(), Some(fd), cloexec, false)
        {
            return io_errno(e);
        }
        self.relays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ino);
        Answer::Continue
    }

    fn connect(&self, call: &Call, r: &Arc<Relay>, fd: i32, ino: u64) -> Option<Answer> {
        let addr = match args::connect_addr(&Thread(call.tid), call.args[1], call.args[2]) {
            Ok(Some(a)) => a,
            // A relayed stream never comes back from a connection: posix answers
            // as it does for the shim (0 when fresh, EOPNOTSUPP when connected).
            Ok(None) => {
                return Some(posix::disconnect(r.usnet).map_or_else(errno_of, |_| Answer::Value(0)))
            }
            Err(e) => return Some(Answer::Errno(e)),
        };
        let fresh = *r.state.lock().unwrap_or_else(|p| p.into_inner()) == State::Fresh;
        if fresh && is_loopback(&addr) && !self.opts.loopback_usnet {
            return Some(self.to_kernel(call, r, fd, ino));
        }
        if r.kind == Kind::Dgram {
            return Some(posix::connect(r.usnet, addr).map_or_else(errno_of, |_| Answer::Value(0)));
        }
        {
            // Looked at and moved on under one lock: two threads of the program
            // may connect the same socket at once, and only one may start.
            let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
            match *st {
                State::Fresh => *st = State::Connecting,
                State::Connecting => return Some(Answer::Errno(libc::EALREADY)),
                State::Connected => return Some(Answer::Errno(libc::EISCONN)),
                State::Listening => return Some(Answer::Errno(libc::EINVAL)),
            }
        }
        // The connect is answered when the stack is done with it (a non-blocking
        // one too: `0` is a valid answer, and Go takes it).
        let (r, listener, call, gone) = (
            Arc::clone(r),
            Arc::clone(&self.listener),
            *call,
            self.forget(ino),
        );
        std::thread::spawn(move || match posix::connect(r.usnet, addr) {
            Ok(()) => {
                *r.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Connected;
                r.pump(gone);
                listener.answer(&call, Answer::Value(0));
            }
            Err(e) => {
                *r.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Fresh;
                listener.answer(&call, errno_of(e));
            }
        });
        None
    }

    fn bind(&self, call: &Call, r: &Arc<Relay>, fd: i32, ino: u64) -> Option<Answer> {
        let addr = match self.their_addr(call, call.args[1], call.args[2]) {
            Ok(a) => a,
            Err(a) => return Some(a),
        };
        let fresh = *r.state.lock().unwrap_or_else(|p| p.into_inner()) == State::Fresh;
        if fresh && is_loopback(&addr) && !self.opts.loopback_usnet {
            return Some(self.to_kernel(call, r, fd, ino));
        }
        self.in_use_retried(call, r, move |_, r| {
            posix::bind(r.usnet, addr).map_or_else(errno_of, |_| Answer::Value(0))
        })
    }

    /// Answers `op`, unless it is `EADDRINUSE` while a socket the program has
    /// closed everywhere is still open here (its relay's thread notices the close
    /// within a fraction of a second): then `op` is tried again from another
    /// thread every 10 ms for up to two seconds (the janitor looks at unused
    /// sockets once a second), and the call answered from there.
    /// A program that closes a listener and binds its port again at once (iperf3
    /// after each test, a server reloading in place) finds it free, as on the
    /// kernel, where the close is synchronous.
    fn in_use_retried(
        &self,
        call: &Call,
        r: &Arc<Relay>,
        op: impl Fn(&Supervisor, &Arc<Relay>) -> Answer + Send + 'static,
    ) -> Option<Answer> {
        let first = op(self, r);
        if first != Answer::Errno(libc::EADDRINUSE) || !self.closed_but_held(r) {
            return Some(first);
        }
        let (sup, r, call) = (self.clone_handle(), Arc::clone(r), *call);
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let answer = loop {
                std::thread::sleep(std::time::Duration::from_millis(10));
                let a = op(&sup, &r);
                if a != Answer::Errno(libc::EADDRINUSE)
                    || std::time::Instant::now() >= deadline
                    || !sup.closed_but_held(&r)
                {
                    break a;
                }
            };
            sup.listener.answer(&call, answer);
        });
        None
    }

    /// Whether a relay other than `r` stands for a socket the program has closed
    /// everywhere, which its thread has yet to close here.
    fn closed_but_held(&self, r: &Arc<Relay>) -> bool {
        self.relays
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|o| !Arc::ptr_eq(o, r) && o.program_gone())
    }

    fn listen(&self, r: &Arc<Relay>, ino: u64, backlog: i32) -> Answer {
        if let Err(e) = posix::listen(r.usnet, backlog) {
            return errno_of(e);
        }
        if let Err(e) = posix::fcntl(r.usnet, libc::F_SETFL, i64::from(libc::O_NONBLOCK)) {
            return errno_of(e);
        }
        let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
        if *st != State::Listening {
            *st = State::Listening;
            drop(st);
            r.watch_token(self.forget(ino));
        }
        Answer::Value(0)
    }

    fn accept(&self, call: &Call, r: &Arc<Relay>, theirs: OwnedFd, flags: i32) -> Option<Answer> {
        if *r.state.lock().unwrap_or_else(|p| p.into_inner()) != State::Listening {
            return Some(Answer::Errno(libc::EINVAL));
        }
        // The usnet listener is non-blocking (see `listen`): another process's
        // waiting accept can take the connection `poll` saw, and this thread serves
        // every call, so it never waits here.
        match self.accept_now(call, r, &theirs, flags) {
            Err(libc::EAGAIN) if !is_nonblocking(theirs.as_raw_fd()) => {
                let sup = self.clone_handle();
                let (r, call) = (Arc::clone(r), *call);
                std::thread::spawn(move || loop {
                    let mut p = [libc::pollfd {
                        fd: r.usnet,
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    let _ = posix::poll(&mut p, -1);
                    match sup.accept_now(&call, &r, &theirs, flags) {
                        Err(libc::EAGAIN) => continue,
                        Err(e) => break sup.listener.answer(&call, Answer::Errno(e)),
                        Ok(Some(a)) => break sup.listener.answer(&call, a),
                        Ok(None) => break,
                    }
                });
                None
            }
            Err(e) => Some(Answer::Errno(e)),
            Ok(a) => a,
        }
    }

    /// A handle for threads that finish a call later.
    fn clone_handle(&self) -> Supervisor {
        Supervisor {
            listener: Arc::clone(&self.listener),
            relays: Arc::clone(&self.relays),
            numbers: Arc::clone(&self.numbers),
            pidfds: Arc::clone(&self.pidfds),
            opts: self.opts,
        }
    }

    fn accept_now(
        &self,
        call: &Call,
        r: &Arc<Relay>,
        theirs: &OwnedFd,
        flags: i32,
    ) -> Result<Option<Answer>, i32> {
        let got = posix::accept4(r.usnet, libc::SOCK_NONBLOCK);
        r.settle_token(theirs.as_raw_fd());
        let (conn, peer) = got.map_err(|e| e.0)?;
        // The relay's pumps want a blocking usnet socket.
        let _ = posix::fcntl(conn, libc::F_SETFL, 0);
        if let Err(a) = self.put_addr(call, call.args[1], call.args[2], peer) {
            let _ = posix::close(conn);
            return Ok(Some(a));
        }
        let (ours, theirs) = match pair() {
            Ok(p) => p,
            Err(e) => {
                let _ = posix::close(conn);
                return Ok(Some(io_errno(e)));
            }
        };
        if flags & libc::SOCK_NONBLOCK != 0 {
            set_nonblocking(theirs.as_raw_fd());
        }
        let relay = Arc::new(Relay::new(
            Kind::Stream,
            r.domain,
            conn,
            ours,
            State::Connected,
        ));
        Ok(self.install_relay(call, relay, theirs, flags & libc::SOCK_CLOEXEC != 0))
    }

    fn name(&self, call: &Call, got: posix::Res<SocketAddr>) -> Answer {
        match got {
            Ok(a) => self
                .put_addr(call, call.args[1], call.args[2], a)
                .map_or_else(|a| a, |_| Answer::Value(0)),
            Err(e) => errno_of(e),
        }
    }

    fn getsockopt(&self, call: &Call, r: &Relay) -> Answer {
        let [_, level, name, val, lenp, _] = call.args;
        if lenp == 0 {
            return Answer::Errno(libc::EFAULT);
        }
        let mem = Thread(call.tid);
        let room = match args::socklen(&mem, lenp) {
            Ok(n) => (n as usize).min(4096),
            Err(e) => return Answer::Errno(e),
        };
        let mut out = vec![0u8; room];
        match posix::getsockopt(r.usnet, level as i32, name as i32, &mut out) {
            Ok(n) => {
                let n = n.min(room);
                mem.write(val, &out[..n])
                    .and_then(|_| mem.write(lenp, &(n as u32).to_ne_bytes()))
                    .map_or_else(Answer::Errno, |_| Answer::Value(0))
            }
            Err(e) => errno_of(e),
        }
    }

    fn setsockopt(&self, call: &Call, r: &Relay) -> Answer {
        let [_, level, name, val, len, _] = call.args;
        if len > 4096 {
            return Answer::Errno(libc::EINVAL);
        }
        match Thread(call.tid).read(val, len as usize) {
            Ok(v) => posix::setsockopt(r.usnet, level as i32, name as i32, &v)
                .map_or_else(errno_of, |_| Answer::Value(0)),
            Err(e) => Answer::Errno(e),
        }
    }
}

// ------------------------------------------------------------ datagram data calls

impl Supervisor {
    /// The data calls on a datagram relay.
    fn data(&self, call: &Call, r: &Arc<Relay>, theirs: OwnedFd) -> Option<Answer> {
        let a = call.args;
        let mem = Thread(call.tid);
        let sent = |m: Result<MsgAt, i32>, flags: i32| -> Answer {
            m.map_or_else(Answer::Errno, |m| self.send(call, r, &m, flags))
        };
        let recv = |m: Result<MsgAt, i32>, flags: i32, mmsg: bool| -> Option<Answer> {
            match m {
                Ok(m) => self.recv(call, r, theirs, m, flags, mmsg),
                Err(e) => Some(Answer::Errno(e)),
            }
        };
        let iov = |at: u64, n: u64| {
            args::iovecs(&mem, at, n).map(|iov| MsgAt {
                iov,
                ..MsgAt::default()
            })
        };
        match call.nr {
            libc::SYS_write => Some(sent(Ok(MsgAt::one(a[1], a[2], 0, 0)), 0)),
            libc::SYS_sendto => Some(sent(Ok(MsgAt::one(a[1], a[2], a[4], a[5])), a[3] as i32)),
            libc::SYS_writev => Some(sent(iov(a[1], a[2]), 0)),
            libc::SYS_sendmsg => Some(sent(args::msghdr(&mem, a[1]), a[2] as i32)),
            libc::SYS_sendmmsg => {
                let mut n = 0u64;
                while n < a[2].min(args::MAX_IOV) {
                    let at = a[1] + n * args::MMSGHDR;
                    match sent(args::msghdr(&mem, at), a[3] as i32) {
                        Answer::Value(len) => {
                            let _ = mem.write(at + args::MSGHDR, &(len as u32).to_ne_bytes());
                            n += 1;
                        }
                        e if n == 0 => return Some(e),
                        _ => break,
                    }
                }
                Some(Answer::Value(n as i64))
            }
            libc::SYS_read => recv(Ok(MsgAt::one(a[1], a[2], 0, 0)), 0, false),
            // (addr, addrlen *): namelen here is the pointer to the length.
            libc::SYS_recvfrom => recv(Ok(MsgAt::one(a[1], a[2], a[4], a[5])), a[3] as i32, false),
            libc::SYS_readv => recv(iov(a[1], a[2]), 0, false),
            libc::SYS_recvmsg => recv(args::msghdr(&mem, a[1]), a[2] as i32, false),
            // recvmmsg: one datagram per call (a valid answer: it returns how many
            // it filled).
            libc::SYS_recvmmsg if a[2] == 0 => Some(Answer::Value(0)),
            libc::SYS_recvmmsg => recv(args::msghdr(&mem, a[1]), a[3] as i32, true),
            _ => Some(Answer::Continue),
        }
    }

    fn send(&self, call: &Call, r: &Relay, m: &MsgAt, flags: i32) -> Answer {
        let mem = Thread(call.tid);
        let sent = || -> Result<usize, i32> {
            let to = if m.name != 0 {
                Some(args::sockaddr(&mem, m.name, m.namelen)?)
            } else {
                None
            };
            let ctl = args::send_control(&mem, m)?;
            let data = args::gather(&mem, m)?;
            posix::sendmsg_with(r.usnet, &[&data], flags | libc::MSG_NOSIGNAL, to, &ctl)
                .map_err(|e| e.0)
        };
        sent().map_or_else(Answer::Errno, |n| Answer::Value(n as i64))
    }

    fn recv(
        &self,
        call: &Call,
        r: &Arc<Relay>,
        theirs: OwnedFd,
        m: MsgAt,
        flags: i32,
        mmsg: bool,
    ) -> Option<Answer> {
        let blocking = flags & libc::MSG_DONTWAIT == 0 && !is_nonblocking(theirs.as_raw_fd());
        let mut buf = vec![0u8; m.total().min(args::MAX_DGRAM)];
        let deliver = move |call: &Call, buf: &[u8], got: posix::Res<posix::DgramMsg>| {
            got.map_err(|e| e.0)
                .and_then(|d| args::deliver(&Thread(call.tid), &m, buf, &d, flags, mmsg))
                .map_or_else(Answer::Errno, Answer::Value)
        };
        match posix::recvmsg_dgram(r.usnet, &mut buf, flags | libc::MSG_DONTWAIT) {
            Err(posix::Errno(libc::EAGAIN)) if blocking => {
                let (sup, r, call) = (self.clone_handle(), Arc::clone(r), *call);
                std::thread::spawn(move || {
                    let got = posix::recvmsg_dgram(r.usnet, &mut buf, flags);
                    let a = deliver(&call, &buf, got);
                    r.settle_token(theirs.as_raw_fd());
                    sup.listener.answer(&call, a);
                });
                None
            }
            got => {
                let a = deliver(call, &buf, got);
                r.settle_token(theirs.as_raw_fd());
                Some(a)
            }
        }
    }
}

/// A connected pair of Unix stream sockets (ours, theirs), close-on-exec here.
fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = std::os::unix::net::UnixStream::pair()?;
    Ok((a.into(), b.into()))
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: plain fcntl calls.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

fn is_nonblocking(fd: RawFd) -> bool {
    // SAFETY: a plain fcntl call.
    unsafe { libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK != 0 }
}
