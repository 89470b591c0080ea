//! Control connections a process can pass on: to a child it forks, and to the
//! program it (or that child) `exec`s or `posix_spawn`s.
//!
//! A client's end of each control connection (its session's, or a fork pin's) is
//! bound to an abstract Unix address that names it: `usnet.<kind>.<pid>.<nonce>.<stack>`
//! (`kind` is `s` for a session, `p` for a pin; `pid` the process that made it). A
//! program started by `exec` has none of its predecessor's memory, but it has its
//! descriptors: it finds the connections it inherited by their names
//! ([`inherited`]) and asks the server, over one of them, for the sockets they
//! hold (`usnet_server::control`: "Requests on an attached connection"). Every
//! request on a connection carries a fresh channel (a socketpair's end, passed with
//! `SCM_RIGHTS`) for its answer, so that nothing is ever written on a connection
//! that another process (the parent, still using its session) reads.
//!
//! With `inheritable` the connections are made without close-on-exec, so they
//! survive `exec`, as the sockets they stand for do on the kernel.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::forklock::ForkRwLock;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// What a connection is, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Session,
    Pin,
}

/// A control connection this process inherited.
#[derive(Debug)]
pub struct Inherited {
    pub stream: UnixStream,
    pub kind: Kind,
    /// The process that made it.
    pub pid: u32,
    /// The stack it talks to.
    pub stack: String,
}

fn kind_char(k: Kind) -> char {
    match k {
        Kind::Session => 's',
        Kind::Pin => 'p',
    }
}

/// The abstract address for a new connection of `kind` to `stack` (tried again
/// with another nonce if taken).
fn name(kind: Kind, stack: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let nonce = t ^ NEXT.fetch_add(1, Relaxed).wrapping_mul(0x9e37_79b9);
    format!(
        "usnet.{}.{}.{nonce:08x}.{stack}",
        kind_char(kind),
        std::process::id()
    )
}

fn parse(n: &[u8]) -> Option<(Kind, u32, String)> {
    let n = std::str::from_utf8(n).ok()?;
    let mut it = n.splitn(5, '.');
    if it.next()? != "usnet" {
        return None;
    }
    let kind = match it.next()? {
        "s" => Kind::Session,
        "p" => Kind::Pin,
        _ => return None,
    };
    let pid = it.next()?.parse().ok()?;
    let _nonce = it.next()?;
    Some((kind, pid, it.next()?.to_string()))
}

/// What a control connection's end is named (its kind, the process that made it
/// and its stack), `None` if `fd` is none of ours.
pub fn named(fd: BorrowedFd<'_>) -> Option<(Kind, u32, String)> {
    let any = rustix::net::getsockname(fd).ok()?;
    let unix = SocketAddrUnix::try_from(any).ok()?;
    parse(unix.abstract_name()?)
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Binds `fd` (an unbound AF_UNIX socket) to a fresh name of `kind`.
fn bind_named(fd: BorrowedFd<'_>, kind: Kind, stack: &str) -> io::Result<()> {
    for _ in 0..8 {
        let addr = SocketAddrUnix::new_abstract_name(name(kind, stack).as_bytes())?;
        match rustix::net::bind(fd, &addr) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::ADDRINUSE) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EADDRINUSE))
}

fn cloexec_flag(inheritable: bool) -> SocketFlags {
    if inheritable {
        SocketFlags::empty()
    } else {
        SocketFlags::CLOEXEC
    }
}

/// Connects to the control socket at `path` from an end named as a session's
/// connection to `stack`.
pub(crate) fn connect(path: &Path, stack: &str, inheritable: bool) -> io::Result<UnixStream> {
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        cloexec_flag(inheritable),
        None,
    )?;
    bind_named(fd.as_fd(), Kind::Session, stack)?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(UnixStream::from(park(fd)))
}

/// Sends `req` on `over` with a new channel whose end named `kind` is returned
/// (the other end goes to the server and is closed here).
pub(crate) fn request(
    over: &UnixStream,
    req: &usnet_session::ctl::Request,
    kind: Kind,
    stack: &str,
    inheritable: bool,
) -> io::Result<UnixStream> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    bind_named(ours.as_fd(), kind, stack)?;
    if inheritable {
        set_cloexec(ours.as_raw_fd(), false)?;
    }
    let line = usnet_session::ctl::request_line(req);
    // The connection may be non-blocking; a request line is far below a socket's
    // buffer, so a short wait is all it can take.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match usnet_shm::fdpass::send_with_fds(over, line.as_bytes(), &[theirs.as_fd()]) {
            Ok(()) => break,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
    drop(theirs);
    let s = UnixStream::from(park(ours));
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    Ok(s)
}

/// The lowest number the client's own descriptors move to ([`park`]).
pub const PARK_FLOOR: RawFd = 300;

/// The client's own descriptors ([`park`] puts them here): number, device and
/// inode, so that a number we closed and the program reused is told apart. Held
/// across a fork by `usnet-posix`'s fork handlers ([`ForkRwLock`]): a child's attach
/// adds to it.
pub static OWN: ForkRwLock<OwnList> = ForkRwLock::new(Vec::new());

pub type OwnList = Vec<(RawFd, u64, u64)>;

fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat buffer for the call.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Whether `fd` is one of the client's own descriptors (a control connection,
/// session memory, the server's eventfd). Programs that close every descriptor
/// they did not open (daemons, sshd after its re-exec, `closefrom`) must not close
/// these: the shim asks here and leaves them open. Cheap for numbers below
/// [`PARK_FLOOR`] (never ours).
pub fn is_own(fd: RawFd) -> bool {
    if fd < PARK_FLOOR || LAYER.with(|l| l.get()) {
        return false;
    }
    let known = OWN.read(|l| l.iter().find(|e| e.0 == fd).copied());
    let Some((_, dev, ino)) = known else {
        return false;
    };
    if identity(fd) == Some((dev, ino)) {
        return true;
    }
    // We closed it and the number went to something else.
    OWN.write(|l| l.retain(|e| e.0 != fd));
    false
}

/// The client's own descriptors in `first..=last` (for `closefrom`/`close_range`).
pub fn own_in(first: RawFd, last: RawFd) -> Vec<RawFd> {
    let nums: Vec<RawFd> = OWN.read(|l| {
        l.iter()
            .map(|e| e.0)
            .filter(|&n| n >= first && n <= last)
            .collect()
    });
    let mut out: Vec<RawFd> = nums.into_iter().filter(|&n| is_own(n)).collect();
    out.sort_unstable();
    out.dedup();
    out
}

thread_local! {
    /// This thread runs the layer's own code outside any call of the program's (a
    /// fork handler): its closes are the layer's, not the program's.
    static LAYER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as the layer's own work: descriptors it closes are closed even if they
/// are the client's own ([`is_own`] says no meanwhile). For code the program does
/// not call directly (fork handlers).
pub fn as_layer<R>(f: impl FnOnce() -> R) -> R {
    let before = LAYER.with(|l| l.replace(true));
    let r = f();
    LAYER.with(|l| l.set(before));
    r
}

fn remember(fd: RawFd) {
    if let Some((dev, ino)) = identity(fd) {
        OWN.write(|own| {
            own.retain(|e| e.0 != fd);
            own.push((fd, dev, ino));
        });
    }
}

/// Moves the client's own descriptor `fd` (a control connection, session memory, an
/// eventfd) to a high number, keeping its close-on-exec flag, and remembers it
/// ([`is_own`]): programs name low numbers themselves (a shell's
/// `exec 3<>/dev/tcp/...` is a `dup2` onto 3) and would replace ours without
/// knowing. Left where it is if the process may not open that many.
pub fn park(fd: OwnedFd) -> OwnedFd {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    if !ok || lim.rlim_cur < (PARK_FLOOR as libc::rlim_t) * 2 {
        return fd;
    }
    // SAFETY: fcntl on a descriptor we own; no memory arguments.
    let cloexec = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC != 0;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: as above; a non-negative result is a new descriptor we own.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, PARK_FLOOR) };
    if moved < 0 {
        return fd;
    }
    remember(moved);
    // SAFETY: just made, owned by nobody else; `fd` closes as it goes.
    unsafe { OwnedFd::from_raw_fd(moved) }
}

pub(crate) fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold; no memory arguments.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    let want = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, want) })?;
    Ok(())
}

/// The usnet control connections among this process's descriptors (found by their
/// names), each taken out of `/proc/self/fd`'s list as an owned stream.
///
/// # Safety
/// Each one returned owns its descriptor: the caller must be the only code in the
/// process that uses those numbers from here (true at a program's start, before
/// `main`, which is where the shim calls this).
pub unsafe fn inherited() -> Vec<Inherited> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    let fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        // SAFETY: a number /proc/self/fd listed, borrowed for one call; one closed
        // meanwhile fails it with EBADF.
        let Some((kind, pid, stack)) = named(unsafe { BorrowedFd::borrow_raw(fd) }) else {
            continue;
        };
        // SAFETY: the caller's promise: this number is ours alone from here.
        let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        out.push(Inherited {
            stream,
            kind,
            pid,
            stack,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hold a fork handler takes on the list of the layer's own descriptors:
    /// the holding thread's own lookups (a close in another library's fork handler)
    /// go through the hold instead of waiting for it forever. (`forklock`'s tests
    /// cover the lock itself.)
    #[test]
    fn the_own_list_is_read_through_a_hold_across_a_fork() {
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = park(OwnedFd::from(null));
        let n = fd.as_raw_fd();
        assert!(n >= PARK_FLOOR, "parked at {n}");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            assert!(OWN.try_hold());
            let seen = (is_own(n), own_in(n, n));
            OWN.release();
            tx.send(seen).unwrap();
        });
        let (seen, listed) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the holding thread's lookups went through its hold");
        assert!(seen);
        assert_eq!(listed, vec![n]);
        assert!(OWN.try_write().is_some(), "let go");
    }

    #[test]
    fn names_parse_back() {
        let n = name(Kind::Pin, "web.1");
        let (k, pid, stack) = parse(n.as_bytes()).expect("parses");
        assert_eq!(k, Kind::Pin);
        assert_eq!(pid, std::process::id());
        assert_eq!(stack, "web.1");
        assert!(parse(b"usnet.x.1.2.s").is_none());
        assert!(parse(b"other.s.1.2.s").is_none());
        assert!(parse(b"usnet.s.notapid.2.s").is_none());
    }

    #[test]
    fn a_channel_end_is_found_by_its_name() {
        let (a, b) = UnixStream::pair().unwrap();
        bind_named(a.as_fd(), Kind::Session, "lineage-test").unwrap();
        let raw = a.as_raw_fd();
        std::mem::forget(a);
        // SAFETY: this test owns every descriptor it lists (the others are the test
        // harness's and are put back untouched below).
        let found = unsafe { inherited() };
        let mut mine = None;
        for f in found {
            if f.stream.as_raw_fd() == raw {
                mine = Some((f.kind, f.pid, f.stack.clone()));
                drop(f.stream);
            } else {
                std::mem::forget(f.stream);
            }
        }
        assert_eq!(
            mine,
            Some((
                Kind::Session,
                std::process::id(),
                "lineage-test".to_string()
            ))
        );
        drop(b);
    }
}
