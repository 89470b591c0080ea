//! BSD-socket semantics over a usnet stack server, once, for every C-shaped user: the C
//! ABI of `libusnet.so` (`usnet_socket`, `usnet_connect`, ...) and, next, the
//! LD_PRELOAD shim. Calls are plain functions over one process-wide descriptor table;
//! any thread may call any of them at any time.
//!
//! **Every usnet socket is a real kernel file descriptor number.** `socket` opens a
//! kernel (Unix) socket of the same type, never bound or connected
//! ([`exec::number_socket`]), and the usnet socket lives under its number until
//! `close`: `fstat` says "socket", nothing else in the
//! process can be given that number, `select` with `FD_SETSIZE` works, `/proc/self/fd`
//! shows it, `F_GETFD`/`F_SETFD` (`FD_CLOEXEC`) act on it directly, and a program can
//! tell a usnet descriptor from a kernel one by asking the table ([`is_usnet`]). An
//! epoll set is a real kernel epoll instance, so kernel descriptors are added to it
//! as they are; usnet sockets in it are watched by the layer.
//!
//! Errors are [`Errno`] values with Linux's numbers; the C ABI turns them into `-1`
//! and `errno`. Blocking calls block (with `SO_RCVTIMEO`/`SO_SNDTIMEO` deadlines),
//! non-blocking ones (`O_NONBLOCK`, `SOCK_NONBLOCK`, `MSG_DONTWAIT`) return `EAGAIN`.
//! A call on a stream whose peer is gone raises `SIGPIPE` unless `MSG_NOSIGNAL`, as
//! the kernel does.
//!
//! **Lock order.** The descriptor table's lock is held only to look a number up
//! or change the table (never while a socket's locks are taken); a socket's object
//! (`Desc::obj`, its `RwLock`) is taken before its options (`Desc::opts`), in
//! every call (the other order against a `connect`, which holds the object while
//! it reads the options, can deadlock).
//!
//! Waiting on a mix of usnet sockets and kernel descriptors (`poll`, `epoll_wait`)
//! sleeps on the session's bell in slices of at most 1 ms and looks at the kernel
//! descriptors between slices: usnet readiness wakes it at once, kernel readiness
//! within a millisecond. A set of usnet sockets only sleeps on the bell.

pub mod addr;
pub mod cmsg;
mod exec;
mod fork;
mod ifaces;
pub mod pass;
mod poll;
pub mod secure_exec;
pub mod sigio;
pub mod sockopt;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::Duration;

use usnet_client::forklock::{ForkMutex, ForkRwLock};
use usnet_client::{Client, IpHeader, Socket, SocketKind, TcpListener, TcpStream, UdpSocket};

pub use exec::{attach_refusal, inherit, pin_for_spawn, SpawnPin};
pub use fork::{grow_session, in_vfork_child, RawFork};
pub use poll::{epoll_create, epoll_ctl, epoll_wait, poll, EpollEvent};

/// A Linux errno value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

pub type Res<T> = Result<T, Errno>;

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Errno {
        if let Some(n) = e.raw_os_error() {
            return Errno(n);
        }
        Errno(match e.kind() {
            io::ErrorKind::WouldBlock => libc::EAGAIN,
            io::ErrorKind::TimedOut => libc::EAGAIN,
            io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
            io::ErrorKind::ConnectionReset => libc::ECONNRESET,
            io::ErrorKind::ConnectionAborted => libc::ECONNABORTED,
            io::ErrorKind::NotConnected => libc::ENOTCONN,
            io::ErrorKind::AddrInUse => libc::EADDRINUSE,
            io::ErrorKind::AddrNotAvailable => libc::EADDRNOTAVAIL,
            io::ErrorKind::BrokenPipe => libc::EPIPE,
            io::ErrorKind::InvalidInput => libc::EINVAL,
            io::ErrorKind::NotFound => libc::ENOENT,
            io::ErrorKind::PermissionDenied => libc::EACCES,
            io::ErrorKind::Interrupted => libc::EINTR,
            io::ErrorKind::Unsupported => libc::EOPNOTSUPP,
            io::ErrorKind::InvalidData => libc::EIO,
            _ => libc::EIO,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ------------------------------------------------------------------ the session

/// The session. Held across a fork by the forking thread (fork.rs), whose calls in
/// other fork handlers go through its hold.
static CLIENT: ForkMutex<Option<Client>> = ForkMutex::new(None);

/// Attaches this process to the stack named `stack` (`None`: `USNET_STACK`, or the only
/// one running). The first socket call attaches on its own if this was not called.
pub fn attach(stack: Option<&str>) -> Res<()> {
    fork::own_session();
    CLIENT.with(|c| attach_into(c, stack))
}

fn attach_into(c: &mut Option<Client>, stack: Option<&str>) -> Res<()> {
    if c.as_ref().is_some_and(|c| c.is_alive()) {
        return Ok(());
    }
    let name = stack
        .map(String::from)
        .or_else(|| std::env::var("USNET_STACK").ok());
    let client = Client::attach_with(name.as_deref(), &exec::attach_options())
        .inspect_err(|e| exec::say_refused(name.as_deref(), e))
        .map_err(|e| match e.raw_os_error() {
            Some(n) => Errno(n),
            None => Errno(libc::ENETDOWN),
        })?;
    *c = Some(client);
    fork::register();
    Ok(())
}

pub use ifaces::{flags as iface_flags, netmask_v4};
pub use usnet_session::ctl::msg::Iface;

/// The attached stack's network interface (attaching first if need be); None
/// without a stack.
pub fn stack_iface() -> Option<Iface> {
    client().ok()?.iface().cloned()
}

/// Bytes of address space this process's usnet session takes now: none before it
/// attaches, else its mapped memory (sockets × two rings, 512 MiB for a fresh
/// client's 1,024 sockets). Nothing is attached to find out.
pub fn session_address_space() -> usize {
    CLIENT.with(|c| c.as_ref().map_or(0, Client::mapped_bytes))
}

/// The address space a fresh client's session takes (the server's default
/// geometry for a client that asks for nothing).
pub fn default_session_address_space() -> usize {
    usnet_client::default_session_bytes() as usize
}

fn client() -> Res<Client> {
    fork::own_session();
    CLIENT.with(|c| {
        if c.is_none() {
            attach_into(c, None)?;
        }
        c.clone().ok_or(Errno(libc::ENETDOWN))
    })
}

// ------------------------------------------------------------------ the table

enum Obj {
    /// `socket()` made it; not yet bound for good, listening or connected.
    Fresh(Socket),
    Listener(TcpListener),
    Stream(TcpStream),
    Udp(UdpSocket),
    Epoll(poll::Epoll),
    /// A blocking connect failed: only `close` (and `SO_ERROR`) remain.
    Failed,
    /// Taken out during a state change (never seen by another call: the change holds
    /// the entry's write lock).
    Moving,
}

/// Socket options the layer keeps itself (what it reports back, and applies when the
/// socket becomes a stream).
#[derive(Default, Clone)]
struct Opts {
    reuseaddr: bool,
    reuseport: bool,
    keepalive: bool,
    nodelay: bool,
    cork: bool,
    rcvbuf: Option<i32>,
    sndbuf: Option<i32>,
    /// TCP_NOTSENT_LOWAT (0: the stack's default).
    notsent_lowat: u32,
    rcvtimeo: Option<Duration>,
    sndtimeo: Option<Duration>,
    linger: Option<Duration>,
    /// TCP_KEEPIDLE, TCP_KEEPINTVL (s), TCP_KEEPCNT (None: 7200, 75, 9).
    keep: [Option<u32>; 3],
    /// TCP_USER_TIMEOUT (ms, 0: none).
    user_timeout: u32,
    /// TCP_CONGESTION (`usnet_session_abi::opt::CC_*`; None: the stack's, cubic).
    congestion: Option<sockopt::Congestion>,
    /// TCP_MAXSEG as set (None: none).
    maxseg: Option<i32>,
    /// SO_MAX_PACING_RATE (None: none).
    max_pacing_rate: Option<u64>,
    /// IP_TOS, IPV6_TCLASS as set.
    tos: Option<u8>,
    tclass: Option<u8>,
    /// IPV6_V6ONLY (an AF_INET6 socket's wildcard takes IPv6 only).
    v6only: bool,
    /// SO_BINDTODEVICE (empty: none).
    device: Vec<u8>,
    /// ICMP_FILTER (word 0) or ICMP6_FILTER of a raw socket.
    icmp_filter: [u32; 8],
    /// IP_MULTICAST_IF's address.
    mcast_if: [u8; 4],
    /// Multicast groups joined (as `sockopt::membership` keys them).
    groups: Vec<Vec<u8>>,
    /// Options only recorded and reported back (`sockopt`).
    recorded: HashMap<(i32, i32), i32>,
    /// SO_ZEROCOPY.
    zerocopy: bool,
    /// TCP_INQ: each `recvmsg` says how many bytes are left to read.
    inq: bool,
    /// SO_TIMESTAMPING flags.
    timestamping: u32,
    /// TCP_FASTOPEN_KEY as set (a listener's): the primary key and a backup.
    fastopen_key: Option<([u8; 16], Option<[u8; 16]>)>,
    /// `connect` with TCP_FASTOPEN_CONNECT and a cookie at hand: the SYN waits for
    /// the first write, to this address (Linux's deferred connect).
    deferred: Option<SocketAddr>,
}

impl Opts {
    /// What an accepted connection inherits from its listener: everything, as
    /// Linux's children copy the listener's socket, but the listener's own
    /// (TCP_DEFER_ACCEPT, TCP_FASTOPEN, multicast groups); TCP_QUICKACK starts on.
    fn inherited(&self) -> Opts {
        let mut o = self.clone();
        o.groups.clear();
        for key in sockopt::NOT_INHERITED {
            o.recorded.remove(&key);
        }
        o
    }
}

/// One descriptor number. Numbers made by `dup` share one [`Desc`], as the kernel's
/// dup'd descriptors share one open file description: the socket, O_NONBLOCK, the
/// options. FD_CLOEXEC is the number's own (its reserve's flag).
struct Entry {
    /// Holds the descriptor number (closed with the entry unless [`surrender`] kept it).
    reserve: std::mem::ManuallyDrop<OwnedFd>,
    /// Set by [`surrender`]: the number outlives the entry.
    keep_number: AtomicBool,
    desc: Arc<Desc>,
}

/// What dup'd descriptors share. The socket closes when the last number naming it
/// is closed (the last `Arc` goes).
struct Desc {
    obj: RwLock<Obj>,
    domain: i32,
    stype: i32,
    nonblock: AtomicBool,
    /// A connect's failure, for `SO_ERROR` (taken once).
    error: AtomicI32,
    opts: Mutex<Opts>,
    /// `O_ASYNC`, the owner and the signal (per description, as Linux's).
    sigio: Mutex<sigio::SigIo>,
    /// The socket's name across `exec` ([`exec::tag`]); 0 for an epoll set.
    tag: u32,
}

/// The descriptor table. Held across a fork by the forking thread (fork.rs), whose
/// calls in other fork handlers (a close) read and change it through its hold.
fn table() -> &'static ForkRwLock<fork::Table> {
    static T: OnceLock<ForkRwLock<fork::Table>> = OnceLock::new();
    T.get_or_init(|| ForkRwLock::new(HashMap::new()))
}

/// Reads the descriptor table.
fn read_table<R>(f: impl FnOnce(&fork::Table) -> R) -> R {
    table().read(f)
}

/// Changes the descriptor table. What `f` takes out of it must be dropped after this
/// returns: dropping an entry closes its number, and that close comes back through
/// the shim, which reads the table.
fn write_table<R>(f: impl FnOnce(&mut fork::Table) -> R) -> R {
    table().write(f)
}

/// The sockets this process has, by tag (epoll sets have none).
fn by_tag(t: &fork::Table) -> HashMap<u32, Arc<Desc>> {
    t.values()
        .filter(|e| e.desc.tag != 0)
        .map(|e| (e.desc.tag, Arc::clone(&e.desc)))
        .collect()
}

/// Numbers `fds`, received with a message or inherited across `exec` (each a number
/// socket carrying `desc`'s tag), name `desc`, as `dup`s would. Returns the entries
/// they replaced, to be dropped after the table's lock (see [`write_table`]).
fn number_as_dups(t: &mut fork::Table, desc: &Arc<Desc>, fds: &[RawFd]) -> Vec<Arc<Entry>> {
    let mut olds = Vec::new();
    for &fd in fds {
        // SAFETY: a number the kernel gave this process, which nothing else here
        // knows of (the caller's promise); the entry owns it from here.
        let e = numbered(unsafe { OwnedFd::from_raw_fd(fd) }, Arc::clone(desc));
        olds.extend(t.insert(fd, Arc::new(e)));
    }
    olds
}

/// Received numbers whose socket carries the tag of a socket this process already
/// has (it passed the socket to itself, `pass`): each names that socket, as a `dup`
/// would.
fn alias_tagged(tags: &HashMap<u32, Vec<RawFd>>) {
    let olds = write_table(|t| {
        let held = by_tag(t);
        let mut olds = Vec::new();
        for (tag, fds) in tags {
            if let Some(d) = held.get(tag) {
                olds.extend(number_as_dups(t, d, fds));
            }
        }
        olds
    });
    drop(olds);
}

fn get(fd: RawFd) -> Res<Arc<Entry>> {
    fork::own_session();
    read_table(|t| t.get(&fd).cloned()).ok_or(Errno(libc::EBADF))
}

/// The system calls that move a socket's data: what the shim's `syscall(3)` sends to
/// its own definitions for a usnet descriptor, and what the seccomp supervisor's
/// filter notifies for datagram relays.
pub const DATA_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendmmsg,
];

/// Whether `fd` is a usnet socket or epoll set of this process.
pub fn is_usnet(fd: RawFd) -> bool {
    read_table(|t| t.contains_key(&fd))
}

/// The usnet descriptors numbered `lo..=hi` (for `close_range`).
pub fn descriptors_in(lo: RawFd, hi: RawFd) -> Vec<RawFd> {
    let mut v: Vec<RawFd> = read_table(|t| {
        t.keys()
            .copied()
            .filter(|&fd| fd >= lo && fd <= hi)
            .collect()
    });
    v.sort_unstable();
    v
}

/// A descriptor number for a socket of type `stype`: a kernel socket of that type
/// stamped with the socket's `tag`, whose O_NONBLOCK follows the socket's (so a
/// program after `exec` finds both; see [`exec::number_socket`]).
fn reserve(stype: i32, cloexec: bool, nonblock: bool, tag: u32) -> Res<OwnedFd> {
    exec::number_socket(stype, cloexec, nonblock, tag)
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EMFILE)))
}

fn insert(e: Entry) -> RawFd {
    let fd = e.reserve.as_raw_fd();
    let replaced = write_table(|t| t.insert(fd, Arc::new(e)));
    drop(replaced);
    fd
}

impl std::ops::Deref for Entry {
    type Target = Desc;
    fn deref(&self) -> &Desc {
        &self.desc
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.keep_number.load(Relaxed) {
            // SAFETY: dropped exactly once, here, and never used again.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.reserve) };
        }
    }
}

fn new_entry(reserve: OwnedFd, obj: Obj, domain: i32, stype: i32, nonblock: bool) -> Entry {
    numbered(reserve, new_desc(obj, domain, stype, nonblock, 0))
}

fn new_desc(obj: Obj, domain: i32, stype: i32, nonblock: bool, tag: u32) -> Arc<Desc> {
    Arc::new(Desc {
        obj: RwLock::new(obj),
        domain,
        stype,
        nonblock: AtomicBool::new(nonblock),
        error: AtomicI32::new(0),
        opts: Mutex::new(Opts::default()),
        sigio: Mutex::default(),
        tag,
    })
}

/// An entry for number `reserve` naming `desc`.
fn numbered(reserve: OwnedFd, desc: Arc<Desc>) -> Entry {
    Entry {
        reserve: std::mem::ManuallyDrop::new(reserve),
        keep_number: AtomicBool::new(false),
        desc,
    }
}

impl Entry {
    /// A `connect` with TCP_FASTOPEN_CONNECT deferred the SYN to the first write.
    fn deferred_connect(&self) -> bool {
        lock(&self.opts).deferred.is_some()
    }
}

impl Desc {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Obj> {
        self.obj.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Obj> {
        self.obj.write().unwrap_or_else(|p| p.into_inner())
    }
    fn nonblocking(&self) -> bool {
        self.nonblock.load(Relaxed)
    }
}

fn ebadf_kind() -> Errno {
    Errno(libc::ENOTSOCK)
}

// ------------------------------------------------------------------ calls

pub const SOCK_TYPE_MASK: i32 = 0xf;

/// `socket(AF_NETLINK, ty, protocol)` made in the attached stack's interface
/// mirror (`usnet_server::mirror`): rtnetlink then lists the stack's interface,
/// as `getifaddrs` does under the shim. An error (`ENOENT`: the stack has none)
/// means the caller makes the kernel's own socket instead.
pub fn netlink_socket(ty: i32, protocol: i32) -> Res<RawFd> {
    use std::os::fd::IntoRawFd;
    let c = client()?;
    // The socket comes close-on-exec; the program's flag decides.
    let fd = c
        .netlink_socket(ty & !libc::SOCK_CLOEXEC, protocol)?
        .into_raw_fd();
    if ty & libc::SOCK_CLOEXEC == 0 {
        // SAFETY: `fd` was just received and is ours.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    }
    Ok(fd)
}

/// The files of `/proc/net` that describe interfaces and routes (Java lists its
/// IPv6 addresses from `if_inet6`; `netstat -i`, `route` and monitoring agents
/// read the others).
const MIRRORED_PROC_NET: &[&str] = &[
    "dev",
    "if_inet6",
    "route",
    "ipv6_route",
    "dev_mcast",
    "igmp",
    "igmp6",
];

/// Which of [`MIRRORED_PROC_NET`] `path` names in this process's own network's
/// `/proc` (`/proc/net/X`, `/proc/self/net/X`, `/proc/thread-self/net/X`,
/// `/proc/PID/net/X` with this pid), if any: a check of the text alone.
pub fn proc_net_file(path: &[u8]) -> Option<&'static str> {
    let rest = path.strip_prefix(b"/proc/")?;
    let file = [b"net/".as_slice(), b"self/net/", b"thread-self/net/"]
        .iter()
        .find_map(|p| rest.strip_prefix(*p))
        .or_else(|| {
            let me = std::process::id().to_string();
            rest.strip_prefix(me.as_bytes())?.strip_prefix(b"/net/")
        })?;
    MIRRORED_PROC_NET
        .iter()
        .find(|f| f.as_bytes() == file)
        .copied()
}

/// The path of `file` (one of [`MIRRORED_PROC_NET`]) in the attached stack's
/// interface mirror (`/proc/HELPER/net/FILE`), if the stack has one, so a program
/// reading its network's `/proc/net` is told of the stack's interface, as
/// rtnetlink and `getifaddrs` tell it.
pub fn mirrored_proc_net(file: &str) -> Option<std::ffi::CString> {
    static CHECKED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let pid = client().ok()?.mirror_pid()?;
    if CHECKED.load(Relaxed) != pid {
        // The pid is the server's pid namespace's: here it must name the helper.
        if std::fs::read(format!("/proc/{pid}/comm")).ok()? != b"usnet-mirror\n" {
            return None;
        }
        CHECKED.store(pid, Relaxed);
    }
    std::ffi::CString::new(format!("/proc/{pid}/net/{file}")).ok()
}

/// `socket(2)`: AF_INET/AF_INET6 × SOCK_STREAM/SOCK_DGRAM, with SOCK_NONBLOCK and
/// SOCK_CLOEXEC.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> Res<RawFd> {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(Errno(libc::EAFNOSUPPORT));
    }
    let base = ty & SOCK_TYPE_MASK;
    let kind = match (base, protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) => SocketKind::Tcp,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) => SocketKind::Udp,
        // Ping sockets. Linux lets only ping_group_range's groups make them; the
        // stack's own policy is who may attach to it.
        (libc::SOCK_DGRAM, libc::IPPROTO_ICMP) if domain == libc::AF_INET => SocketKind::Icmp,
        (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6) if domain == libc::AF_INET6 => SocketKind::Icmp,
        // Raw ICMP sockets. Linux asks for CAP_NET_RAW; here too the stack's own
        // policy is who may attach to it.
        (libc::SOCK_RAW, libc::IPPROTO_ICMP) if domain == libc::AF_INET => SocketKind::Raw,
        (libc::SOCK_RAW, libc::IPPROTO_ICMPV6) if domain == libc::AF_INET6 => SocketKind::Raw,
        (libc::SOCK_STREAM | libc::SOCK_DGRAM | libc::SOCK_RAW, _) => {
            return Err(Errno(libc::EPROTONOSUPPORT))
        }
        _ => return Err(Errno(libc::ESOCKTNOSUPPORT)),
    };
    if ty & !(SOCK_TYPE_MASK | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return Err(Errno(libc::EINVAL));
    }
    let c = client()?;
    let s = Socket::new(&c, kind)?;
    let nb = ty & libc::SOCK_NONBLOCK != 0;
    let tag = exec::tag(domain);
    s.set_exec_tag(tag);
    // (The number is an AF_UNIX socket's, which has no SOCK_RAW.)
    let number_type = if base == libc::SOCK_RAW {
        libc::SOCK_DGRAM
    } else {
        base
    };
    let r = reserve(number_type, ty & libc::SOCK_CLOEXEC != 0, nb, tag)?;
    let obj = match kind {
        SocketKind::Tcp => Obj::Fresh(s),
        SocketKind::Udp | SocketKind::Icmp | SocketKind::Raw => Obj::Udp(s.into_udp()),
    };
    if let Obj::Udp(u) = &obj {
        u.set_nonblocking(nb)?;
        // A raw socket receives from the start, as Linux hashes it at creation:
        // bound now to its family's wildcard (a bind later narrows it).
        if kind == SocketKind::Raw {
            let any = match domain {
                libc::AF_INET => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
                _ => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
            };
            u.bind_reuse(any, 0, false)?;
        }
    }
    Ok(insert(numbered(r, new_desc(obj, domain, base, nb, tag))))
}

/// `bind(2)`.
pub fn bind(fd: RawFd, addr: SocketAddr) -> Res<()> {
    let e = get(fd)?;
    let addr = stack_addr(&e, addr).map_err(|err| match err.0 {
        libc::ENETUNREACH => Errno(libc::EINVAL),
        _ => err,
    })?;
    let fam = families_for(&e, addr);
    let (reuse, reuseport) = {
        let o = lock(&e.opts);
        (o.reuseaddr || o.reuseport, o.reuseport)
    };
    let mut o = e.write();
    match &mut *o {
        Obj::Fresh(s) => Ok(s.bind_reuse(addr, fam, reuse, reuseport)?),
        Obj::Udp(_) => {
            // A UDP socket is bound once; a second bind is EINVAL as in the kernel.
            let Obj::Udp(u) = std::mem::replace(&mut *o, Obj::Moving) else {
                unreachable!()
            };
            let r = bind_udp(&u, addr, fam, (reuse, reuseport));
            *o = Obj::Udp(u);
            r
        }
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::EINVAL)),
    }
}

/// `reuse`: SO_REUSEADDR or SO_REUSEPORT is set (sockets with it share a port,
/// as multicast receivers do).
fn bind_udp(u: &UdpSocket, addr: SocketAddr, fam: u64, reuse: (bool, bool)) -> Res<()> {
    // (A raw socket is bound from the start, and may be bound again.)
    if u.local_addr().is_ok_and(|a| a.port() != 0) && !u.is_raw() {
        return Err(Errno(libc::EINVAL));
    }
    Ok(u.bind_reuseport(addr, fam, reuse.0, reuse.1)?)
}

fn check_family(e: &Entry, addr: SocketAddr) -> Res<()> {
    // An AF_INET6 socket takes IPv4 peers too (as v4-mapped); an AF_INET one does not.
    if e.domain == libc::AF_INET && addr.is_ipv6() {
        return Err(Errno(libc::EAFNOSUPPORT));
    }
    Ok(())
}

// Dual-stack AF_INET6 sockets (Linux with net.ipv6.bindv6only = 0). The design: the
// stack sees plain addresses only, and this layer maps. An address an AF_INET6
// socket is given as `::ffff:a.b.c.d` goes to the stack as `a.b.c.d` (bind binds
// IPv4, connect and sendto go out over IPv4), and every IPv4 address the stack
// reports to an AF_INET6 socket (accept's peer, recvfrom's sender, getsockname,
// getpeername) comes back mapped. A wildcard bind tells the stack which families it
// takes (`usnet_stack::Families`, carried by the ABI's BIND and LISTEN): `::` both
// unless IPV6_V6ONLY, a mapped or AF_INET address IPv4 only; the stack's listener
// demux then sends an IPv4 SYN that finds no IPv4 listener to a `::` listener that
// takes IPv4.

/// `addr` as the stack takes it from socket `e`: a v4-mapped address of an AF_INET6
/// socket is its IPv4 address (EAFNOSUPPORT with IPV6_V6ONLY, as Linux's connect
/// and bind refuse one then).
fn stack_addr(e: &Entry, addr: SocketAddr) -> Res<SocketAddr> {
    check_family(e, addr)?;
    // A raw ICMPv6 socket is IPv6's alone: an IPv4 address is too short a
    // `sockaddr_in6` (EINVAL), and a mapped one stays an IPv6 address, as Linux's
    // `rawv6_sendmsg` takes them.
    if e.stype == libc::SOCK_RAW && e.domain == libc::AF_INET6 {
        return match addr {
            SocketAddr::V4(_) => Err(Errno(libc::EINVAL)),
            SocketAddr::V6(_) => Ok(addr),
        };
    }
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) if e.domain == libc::AF_INET6 => {
                if lock(&e.opts).v6only {
                    return Err(Errno(libc::ENETUNREACH));
                }
                Ok(SocketAddr::new(v4.into(), a.port()))
            }
            _ => Ok(addr),
        },
        _ => Ok(addr),
    }
}

/// An address from the stack as socket family `domain` reports it: IPv4 mapped
/// into IPv6 for an AF_INET6 socket.
fn user_addr(domain: i32, addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if domain == libc::AF_INET6 => {
            SocketAddr::new(a.ip().to_ipv6_mapped().into(), a.port())
        }
        _ => addr,
    }
}

/// The families a bind of socket `e` to `addr` (as the stack takes it) holds.
fn families_for(e: &Entry, addr: SocketAddr) -> u64 {
    use usnet_session_abi::{FAM_V4, FAM_V6};
    if addr.is_ipv4() || e.domain == libc::AF_INET {
        FAM_V4
    } else if lock(&e.opts).v6only {
        FAM_V6
    } else {
        FAM_V4 | FAM_V6
    }
}

/// `listen(2)`.
pub fn listen(fd: RawFd, backlog: i32) -> Res<()> {
    let e = get(fd)?;
    let mut o = e.write();
    match &*o {
        Obj::Fresh(_) => {
            let Obj::Fresh(s) = std::mem::replace(&mut *o, Obj::Moving) else {
                unreachable!()
            };
            let bound = s
                .local_addr()
                .ok()
                .filter(|a| a.port() != 0 || !a.ip().is_unspecified())
                .unwrap_or_else(|| unspecified(e.domain));
            let fam = families_for(&e, bound);
            match s.listen_families(backlog.clamp(1, 4096) as usize, fam) {
                Ok(l) => {
                    l.set_nonblocking(e.nonblocking())?;
                    // Options set before listen that the listener carries.
                    let (ut, mss, fastopen, key) = {
                        let op = lock(&e.opts);
                        let fo = op.recorded.get(&(libc::IPPROTO_TCP, libc::TCP_FASTOPEN));
                        (op.user_timeout, op.maxseg, fo.copied(), op.fastopen_key)
                    };
                    if ut != 0 {
                        let _ = l.set_user_timeout(ut);
                    }
                    if let Some(m) = mss.filter(|&m| m != 0) {
                        let _ = l.set_maxseg(m as u16);
                    }
                    if let Some((k, backup)) = key {
                        let _ = l.set_fastopen_key(k, backup);
                    }
                    if let Some(q) = fastopen.filter(|&q| q > 0) {
                        let _ = l.set_fastopen(q as u32);
                    }
                    *o = Obj::Listener(l);
                    Ok(())
                }
                Err(err) => {
                    *o = Obj::Failed;
                    Err(err.into())
                }
            }
        }
        Obj::Listener(_) => Ok(()),
        Obj::Udp(_) => Err(Errno(libc::EOPNOTSUPP)),
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::EINVAL)),
    }
}

/// `accept4(2)`: SOCK_NONBLOCK and SOCK_CLOEXEC in `flags`.
pub fn accept4(fd: RawFd, flags: i32) -> Res<(RawFd, SocketAddr)> {
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return Err(Errno(libc::EINVAL));
    }
    let e = get(fd)?;
    let (s, peer) = {
        let o = e.read();
        let Obj::Listener(l) = &*o else {
            return Err(match &*o {
                Obj::Epoll(_) => ebadf_kind(),
                _ => Errno(libc::EINVAL),
            });
        };
        l.set_nonblocking(e.nonblocking())?;
        l.accept()?
    };
    let nb = flags & libc::SOCK_NONBLOCK != 0;
    s.set_nonblocking(nb)?;
    let tag = exec::tag(e.domain);
    s.set_exec_tag(tag);
    let r = reserve(libc::SOCK_STREAM, flags & libc::SOCK_CLOEXEC != 0, nb, tag)?;
    let ne = numbered(
        r,
        new_desc(Obj::Stream(s), e.domain, libc::SOCK_STREAM, nb, tag),
    );
    // Accepted sockets inherit the listener's options, as Linux's do.
    let inherited = lock(&e.opts).inherited();
    *lock(&ne.opts) = inherited;
    if let Obj::Stream(s) = &*ne.read() {
        apply_stream_opts(&ne, s);
    }
    Ok((insert(ne), user_addr(e.domain, peer)))
}

/// Options set before the socket became a stream (or on its listener) take effect
/// on it; only those away from the default cost a request.
fn apply_stream_opts(e: &Entry, s: &TcpStream) {
    let o = lock(&e.opts);
    if o.nodelay {
        let _ = s.set_nodelay(true);
    }
    if o.cork {
        let _ = s.set_cork(true);
    }
    if o.keepalive {
        let _ = set_keepalive(&o, s);
    }
    if o.user_timeout != 0 {
        let _ = s.set_user_timeout(o.user_timeout);
    }
    if let Some(cc) = o.congestion {
        let _ = s.set_congestion(abi_congestion(cc));
    }
    if let Some(r) = o.max_pacing_rate {
        let _ = s.set_max_pacing_rate(r);
    }
    if o.linger.is_some() {
        let _ = s.set_linger(o.linger);
    }
    if let Some(b) = o.sndbuf {
        let _ = s.set_send_buffer_size(b);
    }
    if o.timestamping != 0 {
        let _ = s.set_timestamping(o.timestamping);
    }
    if o.notsent_lowat != 0 {
        let _ = s.set_notsent_lowat(o.notsent_lowat);
    }
    if o.zerocopy {
        let _ = s.set_zerocopy(true);
    }
}

/// `connect(2)`: blocking waits for the handshake (`SO_SNDTIMEO` bounds it);
/// non-blocking returns `EINPROGRESS`, and `SO_ERROR` tells the outcome.
pub fn connect(fd: RawFd, addr: SocketAddr) -> Res<()> {
    let e = get(fd)?;
    let addr = stack_addr(&e, addr)?;
    {
        let mut o = e.write();
        match &*o {
            // Linux's deferred connect counts as connected: connect again is EISCONN.
            Obj::Fresh(_) if e.deferred_connect() => return Err(Errno(libc::EISCONN)),
            Obj::Fresh(s) if fastopen_connect_defers(&e, s, addr) => {
                // TCP_FASTOPEN_CONNECT with a cookie at hand: the SYN goes with the
                // first write, and connect succeeds at once (Linux's deferred connect).
                lock(&e.opts).deferred = Some(addr);
                return Ok(());
            }
            Obj::Fresh(_) => {
                let Obj::Fresh(s) = std::mem::replace(&mut *o, Obj::Moving) else {
                    unreachable!()
                };
                // TCP_FASTOPEN_CONNECT without a cookie: the SYN asks for one.
                let started = if fastopen_connect_on(&e) {
                    s.connect_fastopen(addr, &[])
                        .map(|(st, _)| st)
                        .map_err(|(_, err)| err)
                } else {
                    s.connect_start(addr)
                };
                match started {
                    Ok(st) => {
                        apply_stream_opts(&e, &st);
                        st.set_nonblocking(e.nonblocking())?;
                        *o = Obj::Stream(st);
                    }
                    Err(err) => {
                        *o = Obj::Failed;
                        return Err(err.into());
                    }
                }
                if e.nonblocking() {
                    return Err(Errno(libc::EINPROGRESS));
                }
            }
            Obj::Udp(u) => return Ok(u.connect(addr)?),
            Obj::Stream(s) => {
                return Err(Errno(if s.connected() {
                    libc::EISCONN
                } else {
                    libc::EALREADY
                }))
            }
            Obj::Epoll(_) => return Err(ebadf_kind()),
            _ => return Err(Errno(libc::EINVAL)),
        }
    }
    // Blocking: wait for the outcome.
    let deadline = lock(&e.opts)
        .sndtimeo
        .map(|t| usnet_client::vtime::now() + t);
    let r = poll::wait_connected(&e, deadline);
    if let Err(err) = r {
        if err.0 != libc::EINPROGRESS {
            *e.write() = Obj::Failed;
        }
        return Err(err);
    }
    Ok(())
}

/// `connect(2)` to `AF_UNSPEC`: a datagram socket forgets its peer (see
/// `op::CONNECT`); a stream socket that never connected has nothing to dissolve;
/// a connected one is `EOPNOTSUPP` (Linux aborts it and lets it connect again).
pub fn disconnect(fd: RawFd) -> Res<()> {
    let e = get(fd)?;
    let o = e.read();
    match &*o {
        Obj::Udp(u) => Ok(u.disconnect()?),
        Obj::Fresh(_) if !e.deferred_connect() => Ok(()),
        Obj::Listener(_) => Err(Errno(libc::EINVAL)),
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::EOPNOTSUPP)),
    }
}

/// `MSG_*` flags the layer honours; others are `EOPNOTSUPP`. On a stream,
/// `MSG_MORE` and `MSG_EOR` reach the stack with the bytes (`TcpStream::send_flagged`);
/// on a datagram socket they change nothing. `MSG_CONFIRM` (the neighbour is
/// reachable: a hint that saves Linux a probe, which the stack's cache does not
/// need) and `MSG_DONTROUTE` (the stack has one link and sends on it, as with
/// `SO_DONTROUTE`) are taken and change nothing; ping sends every probe after a
/// reply with `MSG_CONFIRM`.
const SEND_FLAGS: i32 = libc::MSG_DONTWAIT
    | libc::MSG_NOSIGNAL
    | libc::MSG_MORE
    | libc::MSG_EOR
    | libc::MSG_FASTOPEN
    | libc::MSG_ZEROCOPY
    | libc::MSG_CONFIRM
    | libc::MSG_DONTROUTE;
const RECV_FLAGS: i32 = libc::MSG_DONTWAIT | libc::MSG_WAITALL | libc::MSG_NOSIGNAL | libc::MSG_OOB;

fn maybe_dontwait<R>(flags: i32, f: impl FnOnce() -> R) -> R {
    if flags & libc::MSG_DONTWAIT != 0 {
        usnet_client::dont_wait(f)
    } else {
        f()
    }
}

fn sigpipe(flags: i32, err: Errno) -> Errno {
    if err.0 == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raise has no memory arguments.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    err
}

/// `sendto(2)` (and `send`, `write` with `to = None`, `flags = 0`).
pub fn sendto(fd: RawFd, buf: &[u8], flags: i32, to: Option<SocketAddr>) -> Res<usize> {
    send_iov(fd, &[buf], flags, to)
}

/// `sendmsg(2)` of the pieces `bufs`, to `to` if given: one datagram, or on a
/// connected stream one write (the address ignored, as Linux's `tcp_sendmsg` does);
/// on an unconnected stream `to` is where `MSG_FASTOPEN` connects.
pub fn sendmsg(fd: RawFd, bufs: &[&[u8]], flags: i32, to: Option<SocketAddr>) -> Res<usize> {
    if to.is_none() || matches!(&*get(fd)?.read(), Obj::Stream(_)) {
        return writev(fd, bufs, flags);
    }
    send_iov(fd, bufs, flags, to)
}

/// `sendmsg(2)` on a datagram socket with what its control messages ask of the
/// IP header ([`cmsg::send_control`]): the source address (`IP_PKTINFO`'s
/// `ipi_spec_dst`, `IPV6_PKTINFO`'s address; an IPv4-mapped one on a dual-stack
/// socket is its IPv4 address), and for the destination's family the TTL or hop
/// limit and the TOS byte or traffic class. Any other socket sends as
/// [`sendmsg`] does, the messages ignored, as Linux's TCP ignores IP-level
/// control messages.
pub fn sendmsg_with(
    fd: RawFd,
    bufs: &[&[u8]],
    flags: i32,
    to: Option<SocketAddr>,
    ctl: &cmsg::SendControl,
) -> Res<usize> {
    let e = get(fd)?;
    if !matches!(&*e.read(), Obj::Udp(_)) {
        return sendmsg(fd, bufs, flags, to);
    }
    if flags & !SEND_FLAGS != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    let to = to.map(|a| stack_addr(&e, a)).transpose()?;
    let src = ctl.src.map(|src| match src {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(src, IpAddr::V4),
        v4 => v4,
    });
    let o = e.read();
    let Obj::Udp(u) = &*o else {
        return Err(Errno(libc::EBADF));
    };
    let v4 = match to {
        Some(to) => to.is_ipv4(),
        None => u
            .peer_addr()
            .map_err(|_| Errno(libc::EDESTADDRREQ))?
            .is_ipv4(),
    };
    let (hop_limit, tos) = ctl.header_for(v4);
    let meta = usnet_client::SendMeta {
        src,
        hop_limit,
        tos,
    };
    u.set_write_timeout(lock(&e.opts).sndtimeo)?;
    let buf = bufs.concat();
    maybe_dontwait(flags, || u.send_msg(&buf, to, &meta)).map_err(|err| match err.kind() {
        io::ErrorKind::NotConnected => Errno(libc::EDESTADDRREQ),
        _ => Errno::from(err),
    })
}

/// The receive timestamps a datagram's `recvmsg` reports, first of its control
/// messages as in Linux's `__sock_recv_timestamp`: `SCM_TIMESTAMPNS` (a
/// `timespec`) with `SO_TIMESTAMPNS`, else `SCM_TIMESTAMP` (a `timeval`) with
/// `SO_TIMESTAMP`; then `SCM_TIMESTAMPING` (three `timespec`s, the software one
/// first) with `SO_TIMESTAMPING`'s `SOFTWARE` and `RX_SOFTWARE` flags. `stamp_ns`:
/// when the server queued the datagram (0: unknown, nothing reported).
fn receive_stamps(o: &Opts, stamp_ns: u64, control: &mut Vec<(i32, i32, Vec<u8>)>) {
    if stamp_ns == 0 {
        return;
    }
    let sol = libc::SOL_SOCKET;
    let on = |name| o.recorded.get(&(sol, name)).is_some_and(|&v| v != 0);
    let secs = (stamp_ns / 1_000_000_000) as i64;
    let nanos = (stamp_ns % 1_000_000_000) as i64;
    let pair = |a: i64, b: i64| [a.to_ne_bytes(), b.to_ne_bytes()].concat();
    if on(libc::SO_TIMESTAMPNS) {
        control.push((sol, libc::SCM_TIMESTAMPNS, pair(secs, nanos)));
    } else if on(libc::SO_TIMESTAMP) {
        control.push((sol, libc::SCM_TIMESTAMP, pair(secs, nanos / 1000)));
    }
    let rx = sockopt::SOF_TIMESTAMPING_SOFTWARE | sockopt::SOF_TIMESTAMPING_RX_SOFTWARE;
    if o.timestamping & rx == rx {
        let mut b = pair(secs, nanos);
        b.resize(48, 0);
        control.push((sol, sockopt::SO_TIMESTAMPING, b));
    }
}

/// A received datagram as `recvmsg(2)` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DgramMsg {
    /// Bytes copied.
    pub len: usize,
    /// The datagram's whole length (`MSG_TRUNC`).
    pub whole: usize,
    pub from: SocketAddr,
    /// The control messages the socket's options ask for, in Linux's order:
    /// (level, type, data).
    pub control: Vec<(i32, i32, Vec<u8>)>,
}

/// `recvmsg(2)` on a UDP socket: the datagram into `buf` (`MSG_PEEK`,
/// `MSG_DONTWAIT`, `MSG_TRUNC` as for [`recvfrom`]) and the control messages its
/// options ask for: `IP_PKTINFO`, `IP_RECVTTL`, `IP_RECVTOS`, and on an IPv6
/// socket `IPV6_RECVPKTINFO`, `IPV6_RECVHOPLIMIT`, `IPV6_RECVTCLASS` (an IPv4
/// datagram on a dual-stack socket gets the IPv4 ones and an `IPV6_PKTINFO` with
/// the mapped address, as Linux's `udpv6_recvmsg` gives). Any other socket
/// answers as [`recvfrom`] does, without control messages.
pub fn recvmsg_dgram(fd: RawFd, buf: &mut [u8], flags: i32) -> Res<DgramMsg> {
    let e = get(fd)?;
    let o = e.read();
    let udp = match &*o {
        Obj::Udp(u) if flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE) == 0 => Some(u),
        _ => None,
    };
    let Some(u) = udp else {
        drop(o);
        let (whole, from) = recvfrom(fd, buf, flags | libc::MSG_TRUNC)?;
        return Ok(DgramMsg {
            len: whole.min(buf.len()),
            whole,
            from: from.ok_or(Errno(libc::ENOTCONN))?,
            control: Vec::new(),
        });
    };
    if flags & !(RECV_FLAGS | libc::MSG_PEEK | libc::MSG_TRUNC) != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    u.set_read_timeout(lock(&e.opts).rcvtimeo)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let m = maybe_dontwait(flags, || u.recv_msg(buf, peek))?;
    let opts = lock(&e.opts);
    let mut control = Vec::new();
    receive_stamps(&opts, m.stamp_ns, &mut control);
    ip_control(&opts, e.domain, &m, true, &mut control);
    Ok(DgramMsg {
        len: m.len,
        whole: m.whole,
        from: user_addr(e.domain, m.from),
        control,
    })
}

/// The control messages of the IP header a datagram (or an ICMP error report)
/// came with, as the socket's options ask (`IP_PKTINFO` and `IPV6_PKTINFO` only
/// with `pktinfo`).
fn ip_control(
    opts: &Opts,
    domain: i32,
    m: &usnet_client::RecvMeta,
    pktinfo: bool,
    control: &mut Vec<(i32, i32, Vec<u8>)>,
) {
    let on = |level, name| opts.recorded.get(&(level, name)).is_some_and(|&v| v != 0);
    let v4 = m.from.is_ipv4();
    let ip = libc::IPPROTO_IP;
    let ip6 = libc::IPPROTO_IPV6;
    if v4 {
        if pktinfo && on(ip, libc::IP_PKTINFO) {
            let dst = match m.local {
                Some(IpAddr::V4(a)) => a,
                _ => Ipv4Addr::UNSPECIFIED,
            };
            let mut b = Vec::with_capacity(12);
            b.extend_from_slice(&(m.ifindex as i32).to_ne_bytes());
            b.extend_from_slice(&m.spec_dst.octets());
            b.extend_from_slice(&dst.octets());
            control.push((ip, libc::IP_PKTINFO, b));
        }
        if on(ip, libc::IP_RECVTTL) {
            control.push((
                ip,
                libc::IP_TTL,
                i32::from(m.hop_limit).to_ne_bytes().to_vec(),
            ));
        }
        if on(ip, libc::IP_RECVTOS) {
            control.push((ip, libc::IP_TOS, vec![m.tos]));
        }
    }
    if domain == libc::AF_INET6 {
        if pktinfo && on(ip6, libc::IPV6_RECVPKTINFO) {
            let dst = match m.local {
                Some(IpAddr::V4(a)) => a.to_ipv6_mapped(),
                Some(IpAddr::V6(a)) => a,
                None => Ipv6Addr::UNSPECIFIED,
            };
            let mut b = Vec::with_capacity(20);
            b.extend_from_slice(&dst.octets());
            b.extend_from_slice(&m.ifindex.to_ne_bytes());
            control.push((ip6, libc::IPV6_PKTINFO, b));
        }
        if !v4 && on(ip6, libc::IPV6_RECVHOPLIMIT) {
            let v = i32::from(m.hop_limit).to_ne_bytes().to_vec();
            control.push((ip6, libc::IPV6_HOPLIMIT, v));
        }
        if !v4 && on(ip6, libc::IPV6_2292HOPLIMIT) {
            let v = i32::from(m.hop_limit).to_ne_bytes().to_vec();
            control.push((ip6, libc::IPV6_2292HOPLIMIT, v));
        }
        if !v4 && on(ip6, libc::IPV6_RECVTCLASS) {
            control.push((
                ip6,
                libc::IPV6_TCLASS,
                i32::from(m.tos).to_ne_bytes().to_vec(),
            ));
        }
    }
}

/// `recvmsg(MSG_ERRQUEUE)` on a datagram socket: its oldest ICMP error report
/// (`IP_RECVERR`), the quoted payload into `buf`, the quoted destination as the
/// name, and the control messages Linux gives with it (the ICMP packet's TTL
/// and TOS as the options ask, then the extended error). `EAGAIN` when none
/// waits; None for a socket of another kind.
pub fn recvmsg_errqueue(fd: RawFd, buf: &mut [u8]) -> Res<Option<DgramMsg>> {
    let e = get(fd)?;
    let o = e.read();
    let Obj::Udp(u) = &*o else {
        return Ok(None);
    };
    let r = u.recv_error_report(buf)?;
    let mut control = Vec::new();
    // The ICMP packet's header, as a datagram's (a local report has none).
    if let Some(offender) = r.offender {
        let icmp = usnet_client::RecvMeta {
            len: r.len,
            whole: r.whole,
            from: SocketAddr::new(offender, 0),
            local: None,
            ifindex: 0,
            spec_dst: Ipv4Addr::UNSPECIFIED,
            hop_limit: r.hop_limit,
            tos: r.tos,
            stamp_ns: 0,
        };
        ip_control(&lock(&e.opts), e.domain, &icmp, false, &mut control);
    }
    control.push(cmsg::icmp_error(&r, e.domain == libc::AF_INET6));
    Ok(Some(DgramMsg {
        len: r.len,
        whole: r.whole,
        from: user_addr(e.domain, r.dest),
        control,
    }))
}

/// A send of the pieces `bufs` (one datagram, or one stream write).
fn send_iov(fd: RawFd, bufs: &[&[u8]], flags: i32, to: Option<SocketAddr>) -> Res<usize> {
    // One datagram, or the data of a Fast Open SYN, is one slice; a stream write
    // takes the pieces as they are (joining them would copy every byte once more).
    let joined = || -> std::borrow::Cow<'_, [u8]> {
        match bufs {
            [one] => std::borrow::Cow::Borrowed(*one),
            _ => std::borrow::Cow::Owned(bufs.concat()),
        }
    };
    if flags & !SEND_FLAGS != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    let e = get(fd)?;
    let to = to.map(|a| stack_addr(&e, a)).transpose()?;
    let deferred = lock(&e.opts).deferred;
    if matches!(&*e.read(), Obj::Fresh(_)) && e.stype == libc::SOCK_STREAM {
        // A Fast Open connect: MSG_FASTOPEN on an unconnected stream, or the first
        // write after a deferred TCP_FASTOPEN_CONNECT `connect`.
        if let Some(to) = deferred.or(to.filter(|_| flags & libc::MSG_FASTOPEN != 0)) {
            return fastopen_send(&e, to, &joined(), flags).map_err(|err| sigpipe(flags, err));
        }
        if flags & libc::MSG_FASTOPEN != 0 {
            return Err(Errno(libc::EDESTADDRREQ));
        }
    }
    if flags & libc::MSG_FASTOPEN != 0 {
        if let Obj::Stream(s) = &*e.read() {
            if !s.connected() && !s.hung_up() {
                // A second Fast Open "connect" while the first is in progress.
                return Err(Errno(libc::EALREADY));
            }
        }
    }
    let o = e.read();
    let r: Res<usize> = match &*o {
        Obj::Stream(s) => {
            apply_timeouts(&e, s)?;
            // Linux's `sk_stream_wait_connect`: a write on an active open still in
            // SYN-SENT waits for the handshake, or says EAGAIN on a non-blocking
            // socket (a passive Fast Open connection in SYN-RECV writes at once).
            let syn_sent = |s: &TcpStream| {
                s.info()
                    .is_ok_and(|i| i.state == u32::from(sockopt::tcp_state::SYN_SENT))
            };
            if !s.connected() && !s.hung_up() && syn_sent(s) {
                if e.nonblocking() || flags & libc::MSG_DONTWAIT != 0 {
                    return Err(Errno(libc::EAGAIN));
                }
                let deadline = lock(&e.opts)
                    .sndtimeo
                    .map(|t| usnet_client::vtime::now() + t);
                poll::wait_connected_to_write(&e, deadline).map_err(|err| match err.0 {
                    libc::EINPROGRESS => Errno(libc::EAGAIN),
                    _ => err,
                })?;
            }
            let n = maybe_dontwait(flags, || write_stream(s, bufs, flags)).map_err(Errno::from)?;
            if flags & libc::MSG_ZEROCOPY != 0 && n > 0 {
                s.zerocopy_sent();
            }
            Ok(n)
        }
        Obj::Udp(u) => {
            u.set_write_timeout(lock(&e.opts).sndtimeo)?;
            let buf = joined();
            maybe_dontwait(flags, || match to {
                Some(a) => u.send_to(&buf, a),
                None => u.send(&buf),
            })
            .map_err(|err| match err.kind() {
                io::ErrorKind::NotConnected => Errno(libc::EDESTADDRREQ),
                _ => Errno::from(err),
            })
        }
        // Linux's `sk_stream_wait_connect`: a stream that is not connecting says
        // EPIPE (with SIGPIPE), not ENOTCONN.
        Obj::Fresh(_) | Obj::Failed | Obj::Listener(_) => Err(Errno(libc::EPIPE)),
        Obj::Epoll(_) => Err(Errno(libc::EINVAL)),
        Obj::Moving => Err(Errno(libc::EBADF)),
    };
    r.map_err(|err| sigpipe(flags, err))
}

/// `sendfile(2)` to a usnet socket: up to `count` bytes of `in_fd`, read at `*off`
/// (which then moves) or from the file's position. On a stream the file's bytes go
/// straight into the socket's send ring (the kernel copies them there; no buffer
/// between). A blocking socket takes every byte up to the end of the file; a
/// non-blocking one what fits (`EAGAIN` if nothing does). A datagram socket sends
/// one datagram of what it reads (at most 64 KiB).
pub fn sendfile(
    fd: RawFd,
    in_fd: std::os::fd::BorrowedFd<'_>,
    off: Option<&mut i64>,
    count: usize,
) -> Res<usize> {
    let e = get(fd)?;
    let o = e.read();
    let start = off.as_deref().copied();
    let r: Res<usize> = match &*o {
        Obj::Stream(s) => {
            apply_timeouts(&e, s)?;
            let mut done = 0;
            while done < count {
                match s.send_file(in_fd, start.map(|o| o + done as i64), count - done) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(_) if done > 0 => break,
                    Err(err) => return Err(sigpipe(0, Errno::from(err))),
                }
            }
            Ok(done)
        }
        Obj::Udp(_) => {
            drop(o);
            let mut buf = vec![0u8; count.min(64 * 1024)];
            // SAFETY: reads into our own buffer.
            let got = unsafe {
                match start {
                    Some(at) => libc::pread(
                        in_fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        at as libc::off_t,
                    ),
                    None => libc::read(in_fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()),
                }
            };
            if got < 0 {
                return Err(Errno::from(io::Error::last_os_error()));
            }
            return sendto(fd, &buf[..got as usize], 0, None).inspect(|&n| {
                if let Some(off) = off {
                    *off += n as i64;
                }
            });
        }
        Obj::Fresh(_) | Obj::Failed | Obj::Listener(_) => Err(Errno(libc::ENOTCONN)),
        Obj::Epoll(_) => Err(Errno(libc::EINVAL)),
        Obj::Moving => Err(Errno(libc::EBADF)),
    };
    if let (Ok(n), Some(off)) = (&r, off) {
        *off += *n as i64;
    }
    r
}

/// A stream write as the kernel's: a blocking socket takes every byte before it
/// returns (a program may rightly treat a short count as lost bytes: socat warns
/// and goes on without them); a signal, a timeout or, on a non-blocking socket, a
/// full buffer after some bytes went returns the count that went.
/// Whether `connect` on a socket with TCP_FASTOPEN_CONNECT defers the SYN: only
/// when the first write's data can ride on it.
fn fastopen_connect_defers(e: &Entry, s: &Socket, addr: SocketAddr) -> bool {
    fastopen_connect_on(e) && s.fastopen_ready(addr).unwrap_or(false)
}

/// TCP_FASTOPEN_CONNECT is set.
fn fastopen_connect_on(e: &Entry) -> bool {
    lock(&e.opts)
        .recorded
        .get(&(libc::IPPROTO_TCP, sockopt::TCP_FASTOPEN_CONNECT))
        .is_some_and(|&v| v != 0)
}

/// A Fast Open connect to `to` with `buf` (RFC 7413, as Linux's
/// `sendto(MSG_FASTOPEN)`): the SYN carries what it can when a cookie is cached. A
/// non-blocking call returns that count, or `EINPROGRESS` when nothing rode; a
/// blocking one waits for the handshake and then writes the rest.
fn fastopen_send(e: &Entry, to: SocketAddr, buf: &[u8], flags: i32) -> Res<usize> {
    let q = {
        let mut o = e.write();
        let Obj::Fresh(_) = &*o else {
            return Err(Errno(libc::EALREADY));
        };
        let Obj::Fresh(s) = std::mem::replace(&mut *o, Obj::Moving) else {
            unreachable!()
        };
        lock(&e.opts).deferred = None;
        match s.connect_fastopen(to, buf) {
            Ok((st, q)) => {
                apply_stream_opts(e, &st);
                st.set_nonblocking(e.nonblocking())?;
                *o = Obj::Stream(st);
                q
            }
            Err((s, err)) => {
                *o = Obj::Fresh(s);
                return Err(err.into());
            }
        }
    };
    let zerocopy = |n: usize| {
        if flags & libc::MSG_ZEROCOPY != 0 && n > 0 {
            if let Obj::Stream(s) = &*e.read() {
                s.zerocopy_sent();
            }
        }
        n
    };
    if e.nonblocking() || flags & libc::MSG_DONTWAIT != 0 {
        return if q > 0 {
            Ok(zerocopy(q))
        } else {
            Err(Errno(libc::EINPROGRESS))
        };
    }
    let deadline = lock(&e.opts)
        .sndtimeo
        .map(|t| usnet_client::vtime::now() + t);
    if q == buf.len() {
        poll::wait_connected(e, deadline)?;
        return Ok(zerocopy(q));
    }
    // Data left over from the SYN waits to go: the handshake's ACK waits for it.
    poll::wait_connected_to_write(e, deadline)?;
    let r = {
        let o = e.read();
        let Obj::Stream(s) = &*o else {
            return Err(Errno(libc::ECONNABORTED));
        };
        apply_timeouts(e, s)?;
        match write_stream(s, &[&buf[q..]], flags) {
            Ok(n) => Ok(q + n),
            Err(_) if q > 0 => Ok(q),
            Err(err) => Err(err.into()),
        }
    };
    r.map(zerocopy)
}

/// `splice(2)` between a usnet stream and a pipe (one end must be each, as on
/// Linux, where one end must be a pipe). Socket to pipe: what the socket has, up
/// to `len` and to the room the pipe has (nothing read is ever dropped); pipe to
/// socket: up to `len` bytes straight from the pipe into the send ring, as
/// [`sendfile`] moves them. `offsets`: an offset was given (`ESPIPE`: neither a
/// socket nor a pipe has one). `SPLICE_F_NONBLOCK` does not wait for the pipe or
/// the socket; otherwise the socket's mode decides.
pub fn splice(fd_in: RawFd, fd_out: RawFd, offsets: bool, len: usize, flags: u32) -> Res<usize> {
    const SPLICE_F_NONBLOCK: u32 = 2;
    let is_pipe = |fd: RawFd| {
        // SAFETY: fstat fills a plain struct for any descriptor number.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) } == 0) && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    };
    let nonblock = flags & SPLICE_F_NONBLOCK != 0;
    let dontwait = if nonblock { libc::MSG_DONTWAIT } else { 0 };
    match (is_usnet(fd_in), is_usnet(fd_out)) {
        (true, false) if is_pipe(fd_out) => {
            if offsets {
                return Err(Errno(libc::ESPIPE));
            }
            let room = pipe_room(fd_out, nonblock)?;
            let mut buf = vec![0u8; len.min(room)];
            if buf.is_empty() {
                return Ok(0);
            }
            let n = {
                let e = get(fd_in)?;
                let o = e.read();
                let Obj::Stream(s) = &*o else {
                    return Err(Errno(libc::EINVAL));
                };
                apply_timeouts(&e, s)?;
                // Linux's `tcp_read_sock`: stops at the urgent mark, 0 there.
                maybe_dontwait(dontwait, || s.read_to_mark(&mut buf))?
            };
            let mut done = 0;
            while done < n {
                // SAFETY: `buf[done..n]` is initialised; the kernel checks `fd_out`.
                let w = unsafe { libc::write(fd_out, buf[done..n].as_ptr().cast(), n - done) };
                if w <= 0 {
                    // The room was there a moment ago; another writer took it.
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(last_os_errno())
                    };
                }
                done += w as usize;
            }
            Ok(n)
        }
        (false, true) if is_pipe(fd_in) => {
            if offsets {
                return Err(Errno(libc::ESPIPE));
            }
            // SAFETY: the caller's descriptor, borrowed for this call only.
            let pipe = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd_in) };
            let e = get(fd_out)?;
            let o = e.read();
            let Obj::Stream(s) = &*o else {
                return Err(Errno(libc::EINVAL));
            };
            apply_timeouts(&e, s)?;
            maybe_dontwait(dontwait, || s.send_file(pipe, None, len))
                .map_err(|err| sigpipe(0, Errno::from(err)))
        }
        _ => Err(Errno(libc::EINVAL)),
    }
}

/// The bytes pipe `fd` can take now; with `nonblock` false, waits until it can
/// take some.
fn pipe_room(fd: RawFd, nonblock: bool) -> Res<usize> {
    loop {
        // SAFETY: F_GETPIPE_SZ and FIONREAD read plain integers from a pipe.
        let size = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
        let mut queued: libc::c_int = 0;
        let q = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) };
        if size < 0 || q < 0 {
            return Err(last_os_errno());
        }
        let room = (size as usize).saturating_sub(queued as usize);
        if room > 0 || nonblock {
            return if room > 0 {
                Ok(room)
            } else {
                Err(Errno(libc::EAGAIN))
            };
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
            return Err(last_os_errno());
        }
    }
}

fn write_stream(s: &TcpStream, bufs: &[&[u8]], flags: i32) -> io::Result<usize> {
    let more = flags & libc::MSG_MORE != 0;
    let eor = flags & libc::MSG_EOR != 0;
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0;
    while done < total {
        let rest = iov_from(bufs, done);
        // Flags take the stack's path; either way the vector is one write.
        let r = if more || eor {
            s.send_vectored_flagged(&rest, more, eor)
        } else {
            s.write_pieces(&rest)
        };
        match r {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

/// The pieces of `bufs` from byte `skip` on.
fn iov_from<'a>(bufs: &[&'a [u8]], mut skip: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(bufs.len());
    for b in bufs {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        out.push(&b[skip..]);
        skip = 0;
    }
    out
}

fn apply_timeouts(e: &Entry, s: &TcpStream) -> Res<()> {
    let o = lock(&e.opts);
    s.set_read_timeout(o.rcvtimeo)?;
    s.set_write_timeout(o.sndtimeo)?;
    Ok(())
}

/// `recvfrom(2)` (and `recv`, `read`): the byte count and, for datagrams, the sender.
///
/// `MSG_TRUNC`: a datagram's whole length is returned even when `buf` is shorter;
/// a stream's bytes are taken and thrown away, not copied (Linux's `tcp_recvmsg`).
/// `MSG_ERRQUEUE`: the oldest error-queue report is taken (its control message has
/// no room here: 0 bytes), `EAGAIN` when there is none.
pub fn recvfrom(fd: RawFd, buf: &mut [u8], flags: i32) -> Res<(usize, Option<SocketAddr>)> {
    let peek = flags & libc::MSG_PEEK != 0;
    let trunc = flags & libc::MSG_TRUNC != 0;
    if flags & !(RECV_FLAGS | libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_ERRQUEUE) != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    if flags & libc::MSG_ERRQUEUE != 0 {
        if let Some(d) = recvmsg_errqueue(fd, buf)? {
            return Ok((if trunc { d.whole } else { d.len }, Some(d.from)));
        }
        error_queue(fd)?;
        return Ok((0, None));
    }
    let e = get(fd)?;
    let o = e.read();
    match &*o {
        // A deferred Fast Open connect is connecting, as Linux sees it: nothing to
        // read yet.
        Obj::Fresh(_) if e.deferred_connect() => Err(Errno(libc::EAGAIN)),
        // TCP urgent data: the byte the server kept at the mark.
        Obj::Stream(s) if flags & libc::MSG_OOB != 0 => {
            let b = s.recv_oob()?;
            match buf.first_mut() {
                Some(first) => {
                    *first = b;
                    Ok((1, None))
                }
                None => Ok((0, None)),
            }
        }
        _ if flags & libc::MSG_OOB != 0 => Err(Errno(libc::EINVAL)),
        Obj::Stream(_) if trunc => {
            // Discarded: the bytes go through a scratch buffer, never the caller's.
            drop(o);
            // (At most 1 MiB a call: a longer request is a short read.)
            let mut scratch = vec![0u8; buf.len().min(1 << 20)];
            let (n, _) = recvfrom(fd, &mut scratch, flags & !libc::MSG_TRUNC)?;
            Ok((n, None))
        }
        Obj::Stream(s) if peek => {
            apply_timeouts(&e, s)?;
            Ok((maybe_dontwait(flags, || s.peek(buf))?, None))
        }
        Obj::Stream(s) => {
            apply_timeouts(&e, s)?;
            let mut got = 0;
            loop {
                let r = maybe_dontwait(flags, || io::Read::read(&mut &*s, &mut buf[got..]));
                match r {
                    Ok(0) => return Ok((got, None)),
                    Ok(n) => {
                        got += n;
                        if flags & libc::MSG_WAITALL == 0 || got == buf.len() {
                            return Ok((got, None));
                        }
                    }
                    Err(err) if got > 0 => {
                        let _ = err;
                        return Ok((got, None));
                    }
                    Err(err) => return Err(err.into()),
                }
            }
        }
        Obj::Udp(u) => {
            u.set_read_timeout(lock(&e.opts).rcvtimeo)?;
            let (n, whole, from) = maybe_dontwait(flags, || u.recv_from_whole(buf, peek))?;
            Ok((
                if trunc { whole } else { n },
                Some(user_addr(e.domain, from)),
            ))
        }
        Obj::Fresh(_) | Obj::Failed | Obj::Listener(_) => Err(Errno(libc::ENOTCONN)),
        Obj::Epoll(_) => Err(Errno(libc::EINVAL)),
        Obj::Moving => Err(Errno(libc::EBADF)),
    }
}

/// `writev(2)`: the pieces in order, as one write (a non-blocking socket stops
/// where its buffer is full).
pub fn writev(fd: RawFd, bufs: &[&[u8]], flags: i32) -> Res<usize> {
    if matches!(&*get(fd)?.read(), Obj::Udp(_)) {
        // A datagram is one record: the pieces gathered.
        let data: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        return sendto(fd, &data, flags, None);
    }
    let zerocopy = match &*get(fd)?.read() {
        Obj::Stream(s) => s.zerocopy_on(),
        _ => false,
    };
    if zerocopy && flags & libc::MSG_ZEROCOPY != 0 {
        let pieces: Vec<(usize, usize)> = bufs
            .iter()
            .map(|b| (b.as_ptr() as usize, b.len()))
            .collect();
        let breaks = usnet_client::msgzc::frag_breaks(&pieces);
        if !breaks.is_empty() {
            return send_zerocopy_frags(fd, bufs, flags, &breaks);
        }
    }
    // One write for the whole vector, as Linux's `tcp_sendmsg` takes it.
    send_iov(fd, bufs, flags, None)
}

/// A `MSG_ZEROCOPY` send whose pages would not fit one of Linux's buffers
/// (`msgzc::frag_breaks`): each run of pieces up to a break goes as a write that
/// ends a record (Linux pushes and closes the buffer there, so later bytes never
/// join its last segment); numbered as one send.
fn send_zerocopy_frags(fd: RawFd, bufs: &[&[u8]], flags: i32, breaks: &[usize]) -> Res<usize> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let piece_flags = flags & !libc::MSG_ZEROCOPY;
    let mut done = 0;
    for end in breaks.iter().copied().chain(std::iter::once(total)) {
        let run: Vec<&[u8]> = iov_from(bufs, done)
            .into_iter()
            .scan(end - done, |left, b| {
                let k = b.len().min(*left);
                *left -= k;
                (k > 0).then(|| &b[..k])
            })
            .collect();
        let f = if end < total {
            piece_flags | libc::MSG_EOR
        } else {
            piece_flags
        };
        match send_iov(fd, &run, f, None) {
            Ok(n) => {
                done += n;
                if done < end {
                    break;
                }
            }
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    if done > 0 {
        if let Obj::Stream(s) = &*get(fd)?.read() {
            s.zerocopy_sent();
        }
    }
    Ok(done)
}

/// With TCP_INQ on a stream: the bytes left to read (Linux's `tcp_inq_hint`,
/// counted in what the socket's receive ring holds), for `recvmsg`'s `TCP_CM_INQ`.
pub fn inq(fd: RawFd) -> Res<Option<i32>> {
    let e = get(fd)?;
    if !lock(&e.opts).inq {
        return Ok(None);
    }
    let left = match &*e.read() {
        // Linux's `tcp_inq_hint`: after the FIN, 1 rather than 0, so the program
        // reads on and sees the end.
        Obj::Stream(s) => match s.available() {
            0 if s.fin_received() => 1,
            n => n.min(i32::MAX as usize) as i32,
        },
        _ => 0,
    };
    Ok(Some(left))
}

/// What `recvmsg(MSG_ERRQUEUE)` takes from a stream's error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrReport {
    /// The oldest completed range `[lo, hi]` of its `MSG_ZEROCOPY` sends (reported
    /// with `SO_EE_CODE_ZEROCOPY_COPIED`: every send is copied into the session's
    /// ring).
    ZeroCopy { lo: u32, hi: u32 },
    /// A transmit timestamp (`SO_TIMESTAMPING`).
    Timestamp(usnet_client::TxTimestamp),
}

/// `recvmsg(MSG_ERRQUEUE)` on a stream: its oldest report, zero-copy completions
/// first; `EAGAIN` when none waits.
pub fn error_queue(fd: RawFd) -> Res<ErrReport> {
    let e = get(fd)?;
    let o = e.read();
    match &*o {
        Obj::Stream(s) => {
            if let Some((lo, hi)) = s.zerocopy_take() {
                return Ok(ErrReport::ZeroCopy { lo, hi });
            }
            s.timestamp_take()?
                .map(ErrReport::Timestamp)
                .ok_or(Errno(libc::EAGAIN))
        }
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::EAGAIN)),
    }
}

/// `readv(2)`: fills the pieces in order with what is there (blocking only for the
/// first byte).
pub fn readv(fd: RawFd, bufs: &mut [&mut [u8]], flags: i32) -> Res<usize> {
    let mut total = 0;
    for b in bufs.iter_mut() {
        if b.is_empty() {
            continue;
        }
        let f = if total > 0 {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        };
        match recvfrom(fd, b, f) {
            Ok((0, _)) => break,
            Ok((n, _)) => {
                total += n;
                if n < b.len() {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// `shutdown(2)`.
pub fn shutdown(fd: RawFd, how: i32) -> Res<()> {
    let how = match how {
        libc::SHUT_RD => Shutdown::Read,
        libc::SHUT_WR => Shutdown::Write,
        libc::SHUT_RDWR => Shutdown::Both,
        _ => return Err(Errno(libc::EINVAL)),
    };
    let e = get(fd)?;
    let o = e.read();
    match &*o {
        Obj::Stream(s) => Ok(s.shutdown(how)?),
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::ENOTCONN)),
    }
}

/// `close(2)`: the socket closes (a stream's queued bytes still go out) and the number
/// is free again.
pub fn close(fd: RawFd) -> Res<()> {
    // A forked child's first call may be a close: its objects must be its own first
    // (dropping one of the parent's would close the parent's socket).
    fork::own_session();
    let e = write_table(|t| t.remove(&fd)).ok_or(Errno(libc::EBADF))?;
    // Another thread blocked in a call on it still holds the entry: the socket and the
    // number go when that call returns.
    drop(e);
    Ok(())
}

/// `dup(2)`: the lowest free number, naming the same socket (its flags and options
/// shared; FD_CLOEXEC clear). The socket closes when the last of its numbers does.
pub fn dup(fd: RawFd) -> Res<RawFd> {
    dup_from(fd, 0, false)
}

/// `fcntl(F_DUPFD / F_DUPFD_CLOEXEC)`: the lowest free number at or above `min`.
pub fn dup_from(fd: RawFd, min: RawFd, cloexec: bool) -> Res<RawFd> {
    let e = get(fd)?;
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // The kernel picks the number: a dup of the reserve holds it from here.
    // SAFETY: fcntl on a descriptor this entry owns, with an integer argument.
    let n = unsafe { libc::fcntl(e.reserve.as_raw_fd(), cmd, min) };
    if n < 0 {
        return Err(last_os_errno());
    }
    // SAFETY: `n` was just returned by the kernel and is owned by nobody else.
    let reserve = unsafe { OwnedFd::from_raw_fd(n) };
    Ok(insert(numbered(reserve, e.desc.clone())))
}

/// `dup3(2)` (`dup2` is `flags` 0 and allows `old == new`): `new` names `old`'s
/// socket; whatever `new` was is closed first, in one step (a usnet socket there
/// goes from the table, a kernel descriptor is closed by the kernel's dup3).
pub fn dup3(old: RawFd, new: RawFd, flags: i32) -> Res<RawFd> {
    if flags & !libc::O_CLOEXEC != 0 || old == new {
        return Err(Errno(libc::EINVAL));
    }
    let e = get(old)?;
    let replaced = write_table(|t| {
        // SAFETY: dup3 on a descriptor this entry owns onto a number; no memory
        // arguments.
        let n = unsafe { libc::dup3(e.reserve.as_raw_fd(), new, flags) };
        if n < 0 {
            return Err(last_os_errno());
        }
        // SAFETY: `new` now holds a dup of our reserve; this entry owns it from here.
        let entry = numbered(unsafe { OwnedFd::from_raw_fd(new) }, e.desc.clone());
        Ok(t.insert(new, Arc::new(entry)))
    })?;
    if let Some(r) = replaced {
        // The kernel's dup3 already closed its number socket: its number is the new
        // entry's now.
        r.keep_number.store(true, Relaxed);
    }
    Ok(new)
}

/// `dup2(2)`: [`dup3`], and `old == new` gives `new` back if it is open.
pub fn dup2(old: RawFd, new: RawFd) -> Res<RawFd> {
    if old == new {
        get(old)?;
        return Ok(new);
    }
    dup3(old, new, 0)
}

/// A kernel descriptor was just dup'd onto `fd` (`dup2`/`dup3` of a kernel
/// descriptor onto a usnet socket's number, by the caller): `fd` is no longer a usnet
/// socket, and the number stays with the kernel's descriptor.
pub fn replaced_by_kernel(fd: RawFd) {
    let e = write_table(|t| t.remove(&fd));
    if let Some(e) = e {
        e.keep_number.store(true, Relaxed);
    }
}

fn last_os_errno() -> Errno {
    Errno(
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF),
    )
}

/// What a socket was, for a caller that re-creates it on the kernel: see [`surrender`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Surrendered {
    pub domain: i32,
    /// SOCK_STREAM or SOCK_DGRAM.
    pub stype: i32,
    pub nonblock: bool,
    pub reuseaddr: bool,
    pub reuseport: bool,
    pub keepalive: bool,
    pub nodelay: bool,
}

/// Gives up a socket that has not been bound or connected yet but keeps its number
/// open (the kernel socket that holds it), so the caller can `dup3` a kernel socket onto
/// that number without a window in which another thread could take it. The LD_PRELOAD
/// shim does this when a socket turns out to be for a loopback address, which stays
/// on the kernel. `EISCONN` for a socket that is already bound, listening or connected.
pub fn surrender(fd: RawFd) -> Res<Surrendered> {
    let e = get(fd)?;
    match &*e.read() {
        Obj::Fresh(_) => {}
        Obj::Udp(u) if u.local_addr().map_or(true, |a| a.port() == 0) => {}
        Obj::Epoll(_) => return Err(ebadf_kind()),
        _ => return Err(Errno(libc::EISCONN)),
    }
    let o = lock(&e.opts);
    let what = Surrendered {
        domain: e.domain,
        stype: e.stype,
        nonblock: e.nonblocking(),
        reuseaddr: o.reuseaddr,
        reuseport: o.reuseport,
        keepalive: o.keepalive,
        nodelay: o.nodelay,
    };
    drop(o);
    e.keep_number.store(true, Relaxed);
    let removed = write_table(|t| t.remove(&fd));
    drop(removed);
    Ok(what)
}

/// `getsockname(2)`.
pub fn getsockname(fd: RawFd) -> Res<SocketAddr> {
    let e = get(fd)?;
    let o = e.read();
    let r = match &*o {
        Obj::Fresh(s) => s.local_addr(),
        Obj::Listener(l) => l.local_addr(),
        Obj::Stream(s) => s.local_addr(),
        Obj::Udp(u) => u.local_addr(),
        Obj::Epoll(_) => return Err(ebadf_kind()),
        _ => return Err(Errno(libc::EINVAL)),
    };
    Ok(r.map_or_else(|_| unspecified(e.domain), |a| user_addr(e.domain, a)))
}

fn unspecified(domain: i32) -> SocketAddr {
    if domain == libc::AF_INET6 {
        "[::]:0".parse().expect("literal")
    } else {
        "0.0.0.0:0".parse().expect("literal")
    }
}

/// `getpeername(2)`.
pub fn getpeername(fd: RawFd) -> Res<SocketAddr> {
    let e = get(fd)?;
    let o = e.read();
    match &*o {
        Obj::Stream(s) if s.connected() => Ok(user_addr(e.domain, s.peer_addr()?)),
        Obj::Udp(u) => u
            .peer_addr()
            .map(|a| user_addr(e.domain, a))
            .map_err(|_| Errno(libc::ENOTCONN)),
        Obj::Epoll(_) => Err(ebadf_kind()),
        _ => Err(Errno(libc::ENOTCONN)),
    }
}

/// `fcntl(2)`: F_GETFL/F_SETFL (O_NONBLOCK), F_GETFD/F_SETFD (on the kernel number).
pub fn fcntl(fd: RawFd, cmd: i32, arg: i64) -> Res<i32> {
    let e = get(fd)?;
    match cmd {
        libc::F_GETFL => {
            let nb = if e.nonblocking() { libc::O_NONBLOCK } else { 0 };
            let on = if lock(&e.sigio).on { libc::O_ASYNC } else { 0 };
            Ok(libc::O_RDWR | nb | on)
        }
        libc::F_SETFL => {
            set_nonblocking(&e, arg as i32 & libc::O_NONBLOCK != 0)?;
            set_async(&e, fd, arg as i32 & libc::O_ASYNC != 0);
            Ok(0)
        }
        libc::F_GETOWN => Ok(lock(&e.sigio).getown()),
        libc::F_SETOWN => set_owner(&e, arg as i32).map(|()| 0),
        sigio::F_GETSIG => Ok(lock(&e.sigio).sig),
        sigio::F_SETSIG => {
            if !(0..=64).contains(&arg) {
                return Err(Errno(libc::EINVAL));
            }
            lock(&e.sigio).sig = arg as i32;
            Ok(0)
        }
        libc::F_GETFD | libc::F_SETFD => {
            // SAFETY: fcntl on a descriptor this entry owns, with an integer argument.
            let r = unsafe { libc::fcntl(e.reserve.as_raw_fd(), cmd, arg as libc::c_int) };
            if r < 0 {
                Err(Errno(
                    io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EINVAL),
                ))
            } else {
                Ok(r)
            }
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => dup_from(
            fd,
            arg.clamp(0, i32::MAX as i64) as i32,
            cmd == libc::F_DUPFD_CLOEXEC,
        ),
        _ => Err(Errno(libc::EINVAL)),
    }
}

/// `O_ASYNC` on or off for `e` (number `fd`): watched for signals while on.
fn set_async(e: &Arc<Entry>, fd: RawFd, on: bool) {
    let was = std::mem::replace(&mut lock(&e.sigio).on, on);
    match (was, on) {
        (false, true) => sigio::watch(&e.desc, fd),
        (true, false) => sigio::unwatch(&e.desc),
        _ => {}
    }
}

/// `F_SETOWN` (and its ioctls): a pid, or minus a process group's id, that exists.
fn set_owner(e: &Entry, who: i32) -> Res<()> {
    exists(who)?;
    lock(&e.sigio).setown(who);
    Ok(())
}

/// `F_SETOWN`'s check: a pid or process group that exists (0: none), else ESRCH.
fn exists(who: i32) -> Res<()> {
    // SAFETY: signal 0 only checks.
    if who != 0
        && unsafe { libc::kill(who, 0) } != 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return Err(Errno(libc::ESRCH));
    }
    Ok(())
}

/// `F_GETOWN_EX`: the owner's kind (`sigio::F_OWNER_*`) and id.
pub fn owner_ex(fd: RawFd) -> Res<(i32, i32)> {
    let e = get(fd)?;
    let s = *lock(&e.sigio);
    Ok((
        if s.owner_kind == 0 && s.owner == 0 {
            sigio::F_OWNER_PID
        } else {
            s.owner_kind
        },
        s.owner,
    ))
}

/// `F_SETOWN_EX`: a thread, a process or a process group.
pub fn set_owner_ex(fd: RawFd, kind: i32, id: i32) -> Res<()> {
    let e = get(fd)?;
    match kind {
        sigio::F_OWNER_TID | sigio::F_OWNER_PID => exists(id)?,
        sigio::F_OWNER_PGRP => exists(id.saturating_neg())?,
        _ => return Err(Errno(libc::EINVAL)),
    }
    let mut s = lock(&e.sigio);
    (s.owner_kind, s.owner) = (kind, id);
    Ok(())
}

fn set_nonblocking(e: &Entry, nb: bool) -> Res<()> {
    if e.nonblock.swap(nb, Relaxed) != nb {
        exec::mirror_nonblock(e.reserve.as_raw_fd(), nb);
    }
    match &*e.read() {
        Obj::Listener(l) => l.set_nonblocking(nb)?,
        Obj::Stream(s) => s.set_nonblocking(nb)?,
        Obj::Udp(u) => u.set_nonblocking(nb)?,
        _ => {}
    }
    Ok(())
}

/// Linux's `SIOCATMARK` (`asm-generic/sockios.h`; the libc crate lacks it).
pub const SIOCATMARK: u64 = 0x8905;

/// `ioctl(2)`: FIONBIO, FIONREAD and SIOCATMARK.
pub fn ioctl_int(fd: RawFd, req: u64, value: i32) -> Res<i32> {
    let e = get(fd)?;
    match req {
        r if r == libc::FIONBIO => {
            set_nonblocking(&e, value != 0)?;
            Ok(0)
        }
        r if r == libc::FIONREAD => match &*e.read() {
            Obj::Stream(s) => Ok(s.available().min(i32::MAX as usize) as i32),
            // The next datagram's size would need a peek at the ring's record header,
            // which the client does not offer yet.
            Obj::Udp(_) => Err(Errno(libc::EOPNOTSUPP)),
            _ => Err(Errno(libc::EINVAL)),
        },
        sigio::FIOASYNC => {
            set_async(&e, fd, value != 0);
            Ok(0)
        }
        sigio::FIOSETOWN | sigio::SIOCSPGRP => set_owner(&e, value).map(|()| 0),
        sigio::FIOGETOWN | sigio::SIOCGPGRP => Ok(lock(&e.sigio).getown()),
        r if r == SIOCATMARK => match &*e.read() {
            Obj::Stream(s) => Ok(s.at_urgent_mark() as i32),
            Obj::Fresh(_) | Obj::Listener(_) | Obj::Failed => Ok(0),
            _ => Err(Errno(libc::EINVAL)),
        },
        _ => Err(Errno(libc::ENOTTY)),
    }
}

/// The interface queries (`SIOCGIF*`: the interface list, a name's index, flags,
/// address, netmask, MTU, hardware address) a program makes on any socket.
pub const INTERFACE_QUERIES: [u64; 14] = [
    0x8910, // SIOCGIFNAME
    0x8912, // SIOCGIFCONF
    0x8913, // SIOCGIFFLAGS
    0x8915, // SIOCGIFADDR
    0x8917, // SIOCGIFDSTADDR
    0x8919, // SIOCGIFBRDADDR
    0x891b, // SIOCGIFNETMASK
    0x891d, // SIOCGIFMETRIC
    0x8921, // SIOCGIFMTU
    0x8927, // SIOCGIFHWADDR
    0x8933, // SIOCGIFINDEX
    0x8935, // SIOCGIFPFLAGS
    0x8942, // SIOCGIFTXQLEN
    0x8970, // SIOCGIFMAP
];

/// An interface query ([`INTERFACE_QUERIES`]) on a usnet socket. The stack's
/// interface ([`stack_iface`]: by its name, or by its index for `SIOCGIFNAME`) is
/// answered from what the stack said of it; `SIOCGIFCONF` lists the kernel's
/// loopback and the stack's IPv4 addresses, as `getifaddrs` under the shim does.
/// Any other interface is answered by the kernel, on a kernel socket of the
/// socket's domain and type made for the call.
///
/// # Safety
/// `arg` is what the request's contract says (an `ifreq` or an `ifconf`).
pub unsafe fn interface_query(fd: RawFd, req: u64, arg: *mut libc::c_void) -> Res<i32> {
    let e = get(fd)?;
    if matches!(&*e.read(), Obj::Epoll(_)) {
        return Err(Errno(libc::ENOTTY));
    }
    if let Some(i) = stack_iface() {
        // SAFETY: the caller's promise about `arg`; the kernel gets what
        // `answer` passes it (the caller's `arg`, or an ifconf of its own).
        let kernel = |a| unsafe { kernel_query(&e, req, a) };
        // SAFETY: the caller's promise about `arg`.
        if let Some(r) = unsafe { ifaces::answer(&i, req, arg, kernel) } {
            return r;
        }
    }
    // SAFETY: the caller's promise about `arg`.
    unsafe { kernel_query(&e, req, arg) }
}

/// An interface query answered by the kernel on a socket of `e`'s kind.
///
/// # Safety
/// `arg` is what the request's contract says.
unsafe fn kernel_query(e: &Entry, req: u64, arg: *mut libc::c_void) -> Res<i32> {
    // SAFETY: socket(2) has no memory arguments; a non-negative result is ours.
    let k = unsafe { libc::syscall(libc::SYS_socket, e.domain, e.stype | libc::SOCK_CLOEXEC, 0) }
        as RawFd;
    if k < 0 {
        return Err(last_os_errno());
    }
    // SAFETY: the caller's promise about `arg`; `k` is a socket we own.
    let r = unsafe { libc::syscall(libc::SYS_ioctl, k, req, arg) };
    let err = last_os_errno();
    // SAFETY: closing the socket made above, with a raw call past any shim.
    unsafe { libc::syscall(libc::SYS_close, k) };
    if r < 0 {
        return Err(err);
    }
    Ok(r as i32)
}

/// `setsockopt(2)`: the option is decoded and checked by the one table
/// ([`sockopt::decode`]), then applied to the socket (or kept for when it becomes a
/// stream). Takes effect: SO_REUSEADDR, SO_REUSEPORT, SO_KEEPALIVE, SO_RCVBUF,
/// SO_SNDBUF (the stack's send-buffer limit for the connection, doubled as Linux
/// does), SO_RCVTIMEO, SO_SNDTIMEO, SO_LINGER; TCP_NODELAY, TCP_CORK,
/// TCP_NOTSENT_LOWAT, TCP_KEEPIDLE/INTVL/CNT, TCP_USER_TIMEOUT, TCP_CONGESTION,
/// TCP_MAXSEG; IP_TOS, IPV6_TCLASS, IPV6_V6ONLY, multicast memberships and
/// IP_MULTICAST_IF. Recorded and reported back: SO_BINDTODEVICE and the options
/// [`sockopt`] records. The table is in docs/preload.md.
pub fn setsockopt(fd: RawFd, level: i32, name: i32, value: &[u8]) -> Res<()> {
    let e = get(fd)?;
    if matches!(&*e.read(), Obj::Epoll(_)) {
        return Err(ebadf_kind());
    }
    // The lock order (module documentation): the object, then the options.
    let obj = e.read();
    let mut o = lock(&e.opts);
    let stream = match &*obj {
        Obj::Stream(s) => Some(s),
        _ => None,
    };
    if level == SOL_USNET {
        if name != USNET_RX_PRIORITY {
            return Err(Errno(libc::ENOPROTOOPT));
        }
        let v = sockopt::int(value)?;
        let mark = (v != USNET_RX_PRIORITY_NONE).then_some(v);
        return match &*obj {
            Obj::Udp(u) => Ok(u.set_rx_priority(mark)?),
            Obj::Listener(l) => Ok(l.set_rx_priority(mark)?),
            _ => Err(Errno(libc::EINVAL)),
        };
    }
    let kind = sockopt::SockKind {
        stream: e.stype == libc::SOCK_STREAM,
        v6: e.domain == libc::AF_INET6,
        raw: e.stype == libc::SOCK_RAW,
    };
    let record = |o: &mut Opts, name: i32, v: i32| {
        o.recorded.insert((libc::IPPROTO_TCP, name), v);
    };
    use sockopt::Opt;
    match sockopt::decode(level, name, value, kind)? {
        Opt::ReuseAddr(on) => o.reuseaddr = on,
        Opt::ReusePort(on) => o.reuseport = on,
        Opt::KeepAlive(on) => {
            o.keepalive = on;
            if let Some(s) = stream {
                set_keepalive(&o, s)?;
            }
        }
        Opt::RcvBuf(v) => {
            o.rcvbuf = Some(v);
            if let Obj::Udp(u) = &*obj {
                u.set_recv_buffer_size(v as usize)?;
            }
        }
        Opt::SndBuf(v) => {
            o.sndbuf = Some(v);
            if let Some(s) = stream {
                s.set_send_buffer_size(v)?;
            }
        }
        Opt::NotsentLowat(v) => {
            o.notsent_lowat = v;
            if let Some(s) = stream {
                s.set_notsent_lowat(v)?;
            }
        }
        Opt::RcvTimeo(d) => o.rcvtimeo = d,
        Opt::SndTimeo(d) => o.sndtimeo = d,
        Opt::Linger(l) => {
            o.linger = l;
            if let Some(s) = stream {
                s.set_linger(l)?;
            }
        }
        Opt::NoDelay(on) => {
            o.nodelay = on;
            if let Some(s) = stream {
                s.set_nodelay(on)?;
            }
        }
        Opt::Cork(on) => {
            o.cork = on;
            if let Some(s) = stream {
                s.set_cork(on)?;
            }
        }
        Opt::Keep(i, v) => {
            o.keep[i] = Some(v);
            if let (Some(s), true) = (stream, o.keepalive) {
                set_keepalive(&o, s)?;
            }
        }
        Opt::UserTimeout(v) => {
            o.user_timeout = v;
            match &*obj {
                Obj::Stream(s) => s.set_user_timeout(v)?,
                Obj::Listener(l) => l.set_user_timeout(v)?,
                _ => {}
            }
        }
        Opt::Congestion(cc) => {
            o.congestion = Some(cc);
            if let Some(s) = stream {
                s.set_congestion(abi_congestion(cc))?;
            }
        }
        Opt::MaxPacingRate(r) => {
            o.max_pacing_rate = (r != u64::MAX).then_some(r);
            if let Some(s) = stream {
                s.set_max_pacing_rate(r)?;
            }
        }
        Opt::MaxSeg(m) => {
            o.maxseg = m.map(i32::from);
            match (&*obj, m) {
                (Obj::Listener(l), Some(m)) => l.set_maxseg(m)?,
                (Obj::Fresh(s), m) => s.set_maxseg(m.unwrap_or(0))?,
                _ => {}
            }
        }
        Opt::Tos(v) => {
            o.tos = Some(v);
            tcp_ip_header(&obj, IpHeader::Tos(v))?;
            if let Obj::Udp(u) = &*obj {
                u.set_tos(v)?;
            }
        }
        Opt::TrafficClass(v) => {
            o.tclass = Some(v);
            tcp_ip_header(&obj, IpHeader::Tclass6(v))?;
            if let Obj::Udp(u) = &*obj {
                u.set_tclass_v6(v)?;
            }
        }
        // A stream takes it and sends as before (Linux's TCP sizes its segments
        // from the path's MTU, not from this).
        Opt::FragSizeV6(v) => {
            if let Obj::Udp(u) = &*obj {
                u.set_frag_size_v6(v)?;
            }
        }
        Opt::V6Only(on) => {
            // Fixed once the socket is bound, as Linux's.
            let bound = match &*obj {
                Obj::Fresh(s) => s.local_addr().is_ok_and(|a| a.port() != 0),
                Obj::Udp(u) => u.local_addr().is_ok_and(|a| a.port() != 0),
                _ => true,
            };
            if bound {
                return Err(Errno(libc::EINVAL));
            }
            o.v6only = on;
        }
        // Recorded: the stack has one interface (and the name is the kernel's).
        Opt::BindToDevice(name) => o.device = name,
        Opt::IcmpFilter(f) => {
            if let Obj::Udp(u) = &*obj {
                u.set_icmp_filter(e.domain == libc::AF_INET6, &f)?;
            }
            o.icmp_filter = f;
        }
        Opt::MulticastIf(a) => {
            o.mcast_if = a;
            if let Obj::Udp(u) = &*obj {
                u.set_multicast_if_v4(&Ipv4Addr::from(a))?;
            }
        }
        Opt::Membership { join, key } => {
            let group = sockopt::membership_group(&key);
            let had = o
                .groups
                .iter()
                .position(|g| sockopt::membership_group(g) == group);
            match (join, had) {
                (true, None) => {
                    if let Obj::Udp(u) = &*obj {
                        membership_to_stack(u, true, &key)?;
                    }
                    o.groups.push(key)
                }
                (true, Some(_)) => return Err(Errno(libc::EADDRINUSE)),
                (false, Some(i)) => {
                    if let Obj::Udp(u) = &*obj {
                        membership_to_stack(u, false, &o.groups[i])?;
                    }
                    o.groups.remove(i);
                }
                (false, None) => return Err(Errno(libc::EADDRNOTAVAIL)),
            }
        }
        Opt::SynCount(v) => {
            record(&mut o, libc::TCP_SYNCNT, v as i32);
            match &*obj {
                Obj::Fresh(s) => s.set_syn_count(v as u8)?,
                Obj::Stream(s) => s.set_syn_count(v as u8)?,
                _ => {}
            }
        }
        // Fast Open: a listener's queue and key go to the stack now (or at listen).
        Opt::FastOpen(q) => {
            record(&mut o, libc::TCP_FASTOPEN, q as i32);
            if let Obj::Listener(l) = &*obj {
                l.set_fastopen(q)?;
            }
        }
        Opt::FastOpenKey(k, backup) => {
            o.fastopen_key = Some((k, backup));
            if let Obj::Listener(l) = &*obj {
                l.set_fastopen_key(k, backup)?;
            }
        }
        Opt::FastOpenConnect(on) => {
            // Linux: EOPNOTSUPP unless `tcp_fastopen` has the client bit, EINVAL
            // once the socket is connecting or connected.
            match &*obj {
                Obj::Fresh(s) if !s.fastopen_client_enabled()? => {
                    return Err(Errno(libc::EOPNOTSUPP))
                }
                Obj::Fresh(_) => {}
                _ => return Err(Errno(libc::EINVAL)),
            }
            record(&mut o, sockopt::TCP_FASTOPEN_CONNECT, on as i32)
        }
        Opt::Recorded { level, name, kept } => {
            if let Obj::Udp(u) = &*obj {
                udp_option_to_stack(u, level, name, kept)?;
            }
            if let Some(f) = tcp_ip_option(level, name, kept) {
                tcp_ip_header(&obj, f)?;
            }
            o.recorded.insert((level, name), kept);
            // Linux keeps one receive timestamp format: SO_TIMESTAMP on clears
            // SO_TIMESTAMPNS, SO_TIMESTAMPNS on reads SO_TIMESTAMP as off, and
            // either off turns both off.
            let sol = libc::SOL_SOCKET;
            if level == sol && matches!(name, libc::SO_TIMESTAMP | libc::SO_TIMESTAMPNS) {
                let other = libc::SO_TIMESTAMP + libc::SO_TIMESTAMPNS - name;
                o.recorded.insert((sol, other), 0);
                if kept == 0 {
                    o.recorded.insert((sol, name), 0);
                }
            }
        }
        Opt::ZeroCopy(on) => {
            o.zerocopy = on;
            if let Some(s) = stream {
                s.set_zerocopy(on)?;
            }
        }
        Opt::Inq(on) => o.inq = on,
        // Transmit timestamps of a connection's writes (the stack server keeps them:
        // `TcpStream::set_timestamping`); set before `connect`, at `connect`.
        Opt::Timestamping(flags) => {
            match stream {
                Some(s) => s.set_timestamping(flags)?,
                // OPT_ID counts from a connection's bytes: Linux's EINVAL without one.
                None if flags & sockopt::SOF_TIMESTAMPING_OPT_ID != 0 => {
                    return Err(Errno(libc::EINVAL))
                }
                None if flags & !sockopt::SOF_TIMESTAMPING_MASK != 0 => {
                    return Err(Errno(libc::EINVAL))
                }
                None => {}
            }
            o.timestamping = flags;
        }
    }
    Ok(())
}

/// The ABI's number for a congestion control algorithm.
fn abi_congestion(c: sockopt::Congestion) -> u64 {
    match c {
        sockopt::Congestion::Cubic => usnet_session_abi::opt::CC_CUBIC,
        sockopt::Congestion::Reno => usnet_session_abi::opt::CC_RENO,
        sockopt::Congestion::Bbr => usnet_session_abi::opt::CC_BBR,
    }
}

/// A multicast membership (`sockopt::membership`'s key: `ip_mreq`/`ip_mreqn` or
/// `ipv6_mreq` bytes) joined or left in the stack. Two joins of one group through
/// different interfaces are one membership there (the stack has one interface):
/// the second is EADDRINUSE.
fn membership_to_stack(u: &UdpSocket, join: bool, key: &[u8]) -> Res<()> {
    if key.len() == 20 && key[0] == 0xff {
        let mut g = [0u8; 16];
        g.copy_from_slice(&key[..16]);
        let ifindex = u32::from_ne_bytes([key[16], key[17], key[18], key[19]]);
        let g = std::net::Ipv6Addr::from(g);
        if join {
            u.join_multicast_v6(&g, ifindex)?
        } else {
            u.leave_multicast_v6(&g, ifindex)?
        }
        return Ok(());
    }
    let g = Ipv4Addr::new(key[0], key[1], key[2], key[3]);
    let i = Ipv4Addr::new(key[4], key[5], key[6], key[7]);
    if join {
        u.join_multicast_v4(&g, &i)?
    } else {
        u.leave_multicast_v4(&g, &i)?
    }
    Ok(())
}

/// The recorded multicast options that take effect in the stack, with the value
/// kept (`-1` already turned into the default).
fn udp_option_to_stack(u: &UdpSocket, level: i32, name: i32, kept: i32) -> Res<()> {
    let v = kept.clamp(0, 255) as u32;
    match (level, name) {
        (libc::IPPROTO_IP, libc::IP_TTL) => u.set_ttl(Some(v as u8))?,
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS) => u.set_unicast_hops_v6(Some(v as u8))?,
        (libc::IPPROTO_IP, libc::IP_RECVERR) => u.set_recverr(false, kept != 0)?,
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER) => u.set_mtu_discover(false, kept),
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER) => u.set_mtu_discover(true, kept),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) => u.set_recverr(true, kept != 0)?,
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL) => u.set_multicast_ttl_v4(v)?,
        (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP) => u.set_multicast_loop_v4(kept != 0)?,
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS) => u.set_multicast_hops_v6(v)?,
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP) => u.set_multicast_loop_v6(kept != 0)?,
        (libc::IPPROTO_IP, libc::IP_MULTICAST_ALL)
        | (libc::IPPROTO_IPV6, sockopt::IPV6_MULTICAST_ALL) => u.set_multicast_all(kept != 0)?,
        _ => {}
    }
    Ok(())
}

/// The recorded options that set an IP header field of a TCP socket, with the
/// value kept (`-1` already turned into the default).
fn tcp_ip_option(level: i32, name: i32, kept: i32) -> Option<IpHeader> {
    let v = kept.clamp(0, 255) as u8;
    Some(match (level, name) {
        (libc::IPPROTO_IP, libc::IP_TTL) => IpHeader::Ttl(Some(v)),
        (libc::IPPROTO_IP, libc::IP_MINTTL) => IpHeader::MinTtl(v),
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS) => IpHeader::UnicastHops6(Some(v)),
        (libc::IPPROTO_IPV6, libc::IPV6_MINHOPCOUNT) => IpHeader::MinHopCount6(v),
        _ => return None,
    })
}

/// Gives a TCP socket (fresh, listening or connected) an IP header field; the
/// server keeps it per family, for the SYN of a `connect`, a listener's
/// connections or a connection's next packets. Nothing for other objects.
fn tcp_ip_header(obj: &Obj, f: IpHeader) -> io::Result<()> {
    match obj {
        Obj::Fresh(s) => s.set_ip_header(f),
        Obj::Listener(l) => l.set_ip_header(f),
        Obj::Stream(s) => s.set_ip_header(f),
        _ => Ok(()),
    }
}

/// SO_KEEPALIVE on with TCP_KEEPIDLE/INTVL/CNT as set (or off) on a stream.
fn set_keepalive(o: &Opts, s: &TcpStream) -> io::Result<()> {
    let [idle, intvl, cnt] = o.keep.map(|k| k.unwrap_or(0));
    s.set_keepalive_with(o.keepalive, idle, intvl, cnt)
}

/// usnet's own socket options (`usnet.h`: `USNET_SOL_USNET`).
pub const SOL_USNET: i32 = usnet_session_abi::opt::SOL_USNET as i32;
/// Priority-aware receive (docs/priority.md): an `int` priority on the scale of
/// `-nice` for a bound UDP socket or a listener (`EINVAL` before), or
/// [`USNET_RX_PRIORITY_NONE`].
pub const USNET_RX_PRIORITY: i32 = usnet_session_abi::opt::USNET_RX_PRIORITY as i32;
/// Takes a socket's priority mark back (it ranks as its process again).
pub const USNET_RX_PRIORITY_NONE: i32 = i32::MIN;

/// `getsockopt(2)`: what `setsockopt` takes, plus SO_ERROR, SO_TYPE, SO_DOMAIN,
/// SO_PROTOCOL, SO_ACCEPTCONN and TCP_INFO (Linux's `struct tcp_info`). Writes into
/// `out` and returns the length written (truncated to `out`, as the kernel does).
pub fn getsockopt(fd: RawFd, level: i32, name: i32, out: &mut [u8]) -> Res<usize> {
    let e = get(fd)?;
    let obj = e.read();
    if matches!(&*obj, Obj::Epoll(_)) {
        return Err(ebadf_kind());
    }
    let o = lock(&e.opts);
    let int = sockopt::int_bytes;
    let stream = match &*obj {
        Obj::Stream(s) => Some(s),
        _ => None,
    };
    let udp = match &*obj {
        Obj::Udp(u) => Some(u),
        _ => None,
    };
    let tcp = e.stype == libc::SOCK_STREAM;
    let raw = e.stype == libc::SOCK_RAW;
    let v6 = e.domain == libc::AF_INET6;
    let bytes: Vec<u8> = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => {
            let mut err = e.error.swap(0, Relaxed);
            if err == 0 {
                if let Some(s) = stream {
                    if let Ok(Some(x)) = s.take_error() {
                        err = Errno::from(x).0;
                    }
                }
                if let Some(x) = udp.and_then(|u| u.take_error()) {
                    err = Errno::from(x).0;
                }
            }
            int(err)
        }
        // The path MTU of a connected datagram socket: the link's.
        (libc::IPPROTO_IP, libc::IP_MTU) | (libc::IPPROTO_IPV6, libc::IPV6_MTU)
            if udp.is_some() =>
        {
            match udp.filter(|u| u.peer_addr().is_ok()) {
                Some(u) => int(u.link_mtu() as i32),
                None => return Err(Errno(libc::ENOTCONN)),
            }
        }
        (libc::SOL_SOCKET, libc::SO_TYPE) => int(e.stype),
        (sockopt::SOL_RAW, sockopt::ICMP_FILTER) if raw && e.domain == libc::AF_INET => {
            o.icmp_filter[0].to_ne_bytes().to_vec()
        }
        (libc::IPPROTO_ICMPV6, sockopt::ICMP6_FILTER) if raw && e.domain == libc::AF_INET6 => {
            o.icmp_filter.iter().flat_map(|w| w.to_ne_bytes()).collect()
        }
        // Where the stack puts a raw ICMPv6 message's checksum (always).
        (sockopt::SOL_RAW | libc::IPPROTO_IPV6, libc::IPV6_CHECKSUM)
            if raw && e.domain == libc::AF_INET6 =>
        {
            int(2)
        }
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => int(e.domain),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => int(match &*obj {
            Obj::Udp(u) if (u.is_echo() || u.is_raw()) && e.domain == libc::AF_INET6 => {
                libc::IPPROTO_ICMPV6
            }
            Obj::Udp(u) if u.is_echo() || u.is_raw() => libc::IPPROTO_ICMP,
            _ if e.stype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
            _ => libc::IPPROTO_UDP,
        }),
        (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => int(matches!(&*obj, Obj::Listener(_)) as i32),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => int(o.reuseaddr as i32),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => int(o.reuseport as i32),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => int(o.keepalive as i32),
        (libc::SOL_SOCKET, libc::SO_ZEROCOPY) => int(o.zerocopy as i32),
        (libc::IPPROTO_TCP, sockopt::TCP_INQ) if tcp => int(o.inq as i32),
        // Linux reports twice what was set (its bookkeeping overhead); so do we, so
        // programs that check the doubling keep working.
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(o.rcvbuf.map_or(131072, |v| v * 2)),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(o.sndbuf.map_or(16384, sockopt::linux_sndbuf)),
        (libc::IPPROTO_TCP, sockopt::TCP_NOTSENT_LOWAT) if e.stype == libc::SOCK_STREAM => {
            int(o.notsent_lowat as i32)
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => sockopt::timeval(o.rcvtimeo),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => sockopt::timeval(o.sndtimeo),
        (libc::SOL_SOCKET, libc::SO_LINGER) => sockopt::linger(o.linger),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) if e.stype == libc::SOCK_STREAM => {
            int(o.nodelay as i32)
        }
        (libc::IPPROTO_TCP, libc::TCP_CORK) if e.stype == libc::SOCK_STREAM => int(o.cork as i32),
        (libc::SOL_SOCKET, sockopt::SO_TIMESTAMPING) => int(o.timestamping as i32),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL | libc::TCP_KEEPCNT)
            if tcp =>
        {
            let i = (name - libc::TCP_KEEPIDLE) as usize;
            int(o.keep[i].unwrap_or([7200, 75, 9][i]) as i32)
        }
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) if tcp => int(o.user_timeout as i32),
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) if tcp => {
            sockopt::congestion_name(o.congestion.unwrap_or(sockopt::Congestion::Cubic))
        }
        // Linux answers a 4-byte buffer with the value capped at ~0U.
        (libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE) => {
            let r = o.max_pacing_rate.unwrap_or(u64::MAX);
            if out.len() >= 8 {
                r.to_ne_bytes().to_vec()
            } else {
                int(r.min(u64::from(u32::MAX)) as u32 as i32)
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) if tcp => match stream {
            // Connected: the MSS in use; otherwise what was set, or TCP_MSS_DEFAULT.
            Some(s) => int(s.info().map(|i| i.snd_mss as i32).unwrap_or(536)),
            None => int(o.maxseg.unwrap_or(536)),
        },
        (libc::IPPROTO_IP, libc::IP_TOS) => int(i32::from(o.tos.unwrap_or(0))),
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if v6 => int(i32::from(o.tclass.unwrap_or(0))),
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) if v6 => int(o.v6only as i32),
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => {
            let mut b = o.device.clone();
            if !b.is_empty() {
                b.push(0);
            }
            b
        }
        (libc::IPPROTO_IP, libc::IP_MULTICAST_IF) => o.mcast_if.to_vec(),
        // Linux's `sk_meminfo`: the receive queue and buffer, the send buffer and
        // the bytes queued to send (in flight here: the rest waits in the session's
        // ring, which is this process's memory, not the stack's).
        (libc::SOL_SOCKET, sockopt::SO_MEMINFO) => {
            let (rmem, queued) = match stream {
                Some(s) => (s.available() as u32, s.info()?.bytes_in_flight),
                None => (0, 0),
            };
            let rcvbuf = o.rcvbuf.map_or(131072, |v| v * 2) as u32;
            let sndbuf = o.sndbuf.map_or(16384, sockopt::linux_sndbuf) as u32;
            [rmem, rcvbuf, queued, sndbuf, 0, queued, 0, 0, 0]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect()
        }
        // Linux's CUBIC and Reno keep no `tcp_cc_info` (only Vegas, DCTCP and BBR do):
        // an empty answer, as the kernel gives.
        (libc::IPPROTO_TCP, sockopt::TCP_CC_INFO) if tcp => Vec::new(),
        (libc::IPPROTO_TCP, libc::TCP_INFO) if e.stype == libc::SOCK_STREAM => match stream {
            Some(s) => sockopt::LinuxTcpInfo {
                max_pacing_rate: o.max_pacing_rate.unwrap_or(u64::MAX),
                ..linux_tcp_info(&s.info()?)
            }
            .to_bytes(),
            None => {
                sockopt::LinuxTcpInfo::unconnected(matches!(&*obj, Obj::Listener(_))).to_bytes()
            }
        },
        _ => {
            let known = match level {
                libc::SOL_SOCKET | libc::IPPROTO_IP => true,
                libc::IPPROTO_TCP => tcp,
                libc::IPPROTO_IPV6 => v6,
                _ => false,
            };
            if !known {
                return Err(sockopt::get_level_errno(level, tcp, v6));
            }
            let kept = o.recorded.get(&(level, name)).copied();
            int(sockopt::get(level, name, kept, tcp, v6)?)
        }
    };
    Ok(copy_out(&bytes, out))
}

fn copy_out(b: &[u8], out: &mut [u8]) -> usize {
    let n = b.len().min(out.len());
    out[..n].copy_from_slice(&b[..n]);
    n
}

/// What a session reports of a connection, in Linux's `tcp_info` terms (the
/// server gives windows in bytes; Linux counts segments).
fn linux_tcp_info(i: &usnet_client::TcpInfo) -> sockopt::LinuxTcpInfo {
    use sockopt::LinuxTcpInfo as L;
    let us = |d: Duration| d.as_micros().min(u128::from(u32::MAX)) as u32;
    L {
        state: i.state as u8,
        rto_us: us(i.rto),
        snd_mss: i.snd_mss,
        rcv_mss: i.rcv_mss,
        advmss: i.snd_mss,
        unacked: i.bytes_in_flight.div_ceil(i.snd_mss.max(1)),
        rtt_us: us(i.rtt),
        rttvar_us: us(i.rttvar),
        min_rtt_us: if i.min_rtt.is_zero() {
            u32::MAX
        } else {
            us(i.min_rtt)
        },
        snd_ssthresh: L::ssthresh_segments(i.ssthresh, i.snd_mss),
        snd_cwnd: L::segments(i.cwnd, i.snd_mss),
        total_retrans: i.total_retransmits,
        snd_wnd: i.snd_wnd,
        rcv_wnd: i.rcv_wnd,
        ca_state: i.ca_state,
        options: i.options,
        wscale: i.wscale,
        backoff: i.backoff,
        sacked: i.sacked,
        lost: i.lost,
        retrans: i.retrans,
        reordering: i.reordering,
        reord_seen: i.reord_seen,
        rcv_space: i.rcv_space,
        last_data_recv_ms: i.last_data_recv.as_millis().min(u128::from(u32::MAX)) as u32,
        delivered: i.delivered,
        busy_time_us: i.busy_time.as_micros().min(u128::from(u64::MAX)) as u64,
        rwnd_limited_us: i.rwnd_limited.as_micros().min(u128::from(u64::MAX)) as u64,
        sndbuf_limited_us: i.sndbuf_limited.as_micros().min(u128::from(u64::MAX)) as u64,
        pacing_rate: i.pacing_rate,
        max_pacing_rate: u64::MAX,
        delivery_rate: i.delivery_rate,
        delivery_rate_app_limited: i.delivery_rate_app_limited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proc_net_files_of_interfaces_are_told_by_their_names_alone() {
        let me = std::process::id();
        assert_eq!(proc_net_file(b"/proc/net/if_inet6"), Some("if_inet6"));
        assert_eq!(proc_net_file(b"/proc/self/net/dev"), Some("dev"));
        assert_eq!(proc_net_file(b"/proc/thread-self/net/route"), Some("route"));
        let own = format!("/proc/{me}/net/ipv6_route");
        assert_eq!(proc_net_file(own.as_bytes()), Some("ipv6_route"));
        let other = format!("/proc/{}/net/dev", me + 1);
        for p in [
            "/proc/net/tcp",
            other.as_str(),
            "/proc/self/maps",
            "/proc/net/dev/x",
            "/proc/netdev",
            "/proc/self/net/if_inet6x",
            "/etc/passwd",
            "proc/net/dev",
        ] {
            assert_eq!(proc_net_file(p.as_bytes()), None, "{p}");
        }
    }

    #[test]
    fn io_errors_map_to_linux_errno() {
        assert_eq!(
            Errno::from(io::Error::from(io::ErrorKind::WouldBlock)),
            Errno(libc::EAGAIN)
        );
        assert_eq!(
            Errno::from(io::Error::from_raw_os_error(libc::ECONNRESET)),
            Errno(libc::ECONNRESET)
        );
        assert_eq!(
            Errno::from(io::Error::from(io::ErrorKind::ConnectionRefused)),
            Errno(libc::ECONNREFUSED)
        );
    }

    #[test]
    fn unknown_descriptors_are_ebadf_and_bad_arguments_einval() {
        assert_eq!(close(987_654), Err(Errno(libc::EBADF)));
        assert_eq!(
            socket(libc::AF_UNIX, libc::SOCK_STREAM, 0),
            Err(Errno(libc::EAFNOSUPPORT))
        );
        assert_eq!(
            socket(libc::AF_INET, libc::SOCK_RAW, 0),
            Err(Errno(libc::EPROTONOSUPPORT))
        );
        assert_eq!(
            socket(libc::AF_INET, libc::SOCK_SEQPACKET, 0),
            Err(Errno(libc::ESOCKTNOSUPPORT))
        );
        assert_eq!(shutdown(987_654, 99), Err(Errno(libc::EINVAL)));
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 2_000_000,
        };
        let b = unsafe {
            std::slice::from_raw_parts(&tv as *const _ as *const u8, std::mem::size_of_val(&tv))
        };
        assert_eq!(sockopt::timeval_value(b), Err(Errno(libc::EDOM)));
    }
}
