//! `libusnet_preload.so`: runs an unmodified, dynamically linked program with its
//! AF_INET/AF_INET6 sockets on a usnet stack server (`usnet run -- CMD`, or
//! `LD_PRELOAD=libusnet_preload.so USNET_STACK=NAME CMD`).
//!
//! The shim defines the libc socket and descriptor calls. Each one asks whether its
//! descriptor is a usnet socket (`usnet_posix::is_usnet`) and, if so, hands it to the
//! `usnet_*` C ABI over `usnet-posix` (the same layer `libusnet.so` exposes); every
//! other descriptor goes to the next definition, libc's, found with
//! `dlsym(RTLD_NEXT)`. Every usnet socket is a real kernel descriptor number (a
//! kernel Unix socket of its type holds it), so `select` below `FD_SETSIZE`,
//! `/proc/self/fd`, `fstat` and mixed `poll`/`epoll` sets work.
//!
//! While a thread is inside the shim its own libc calls (the layer's number
//! sockets, its kernel `poll`, the control socket) must reach libc directly: a
//! thread-local flag makes every entry point pass straight through when it is
//! already set.
//!
//! What goes to usnet: `socket(AF_INET|AF_INET6, SOCK_STREAM|SOCK_DGRAM)`, ICMP
//! echo sockets and raw ICMP sockets; a raw socket of any other protocol is
//! `EPERM` (it would see the kernel's network, not the stack's). A socket
//! that is then bound or connected to a loopback address moves to the kernel
//! (`USNET_LOOPBACK=usnet` keeps it): the kernel socket is `dup3`'d onto its number.
//! With no stack server the first such `socket` fails with `ENETDOWN` and one line on
//! stderr, or uses the kernel when `USNET_FALLBACK=kernel`. `USNET_DEBUG=1` names each
//! call the shim refuses. docs/preload.md lists what is not supported.

#![allow(clippy::missing_safety_doc)] // the C functions carry libc's contracts

use std::cell::Cell;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::raw::{c_char, c_int, c_long, c_ulong, c_void};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::Relaxed};

use libc::{size_t, sockaddr, socklen_t, ssize_t};
use usnet_ffi::socket;
use usnet_posix::Errno;

// ------------------------------------------------------------------ re-entry

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Held while a thread runs shim code; its libc calls then pass straight through.
struct Inside;

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(false));
    }
}

/// This thread is running shim code (its libc calls pass straight through).
fn is_inside() -> bool {
    INSIDE.with(|c| c.get())
}

fn enter() -> Option<Inside> {
    INSIDE.with(|c| {
        if c.get() {
            None
        } else {
            c.set(true);
            Some(Inside)
        }
    })
}

/// `Some` (and inside) when `fd` is a usnet descriptor and this is not a nested call.
fn ours(fd: c_int) -> Option<Inside> {
    let g = enter()?;
    usnet_posix::is_usnet(fd).then_some(g)
}

/// [`ours`] for the calls that close or renumber a descriptor or change its flags:
/// `None` too in a child that shares the layer's memory but not its descriptors
/// (`usnet_posix::in_vfork_child`), whose numbers the kernel alone changes.
fn ours_to_renumber(fd: c_int) -> Option<Inside> {
    ours(fd).filter(|_| !usnet_posix::in_vfork_child())
}

// ------------------------------------------------------------------ libc's own

/// The next definition of `name` (libc's), looked up once.
fn next_symbol(cache: &AtomicUsize, name: &CStr) -> usize {
    let p = cache.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if p == 0 {
        // Without libc's definition nothing can go on; say which one and stop.
        let msg = format!("usnet-preload: libc has no {name:?}\n");
        // SAFETY: writes our own buffer to stderr through the raw system call.
        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        std::process::abort();
    }
    cache.store(p, Relaxed);
    p
}

/// libc's definition of `name`, looked up once.
macro_rules! next_of {
    ($name:ident) => {{
        static CACHE: ::std::sync::atomic::AtomicUsize = ::std::sync::atomic::AtomicUsize::new(0);
        const NAME: &::std::ffi::CStr = match ::std::ffi::CStr::from_bytes_with_nul(
            concat!(stringify!($name), "\0").as_bytes(),
        ) {
            Ok(c) => c,
            Err(_) => panic!("symbol name"),
        };
        $crate::next_symbol(&CACHE, NAME)
    }};
}

/// `real!(name: fn(args) -> ret)`: libc's `name` as a callable function pointer
/// (`variadic fn(args) -> ret` for fcntl and ioctl).
macro_rules! real {
    ($name:ident : fn($($t:ty),*) -> $r:ty) => {{
        let p = next_of!($name);
        // SAFETY: `p` is libc's definition of this very function, whose C type is
        // the one written here.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) }
    }};
    ($name:ident : variadic fn($($t:ty),*) -> $r:ty) => {{
        let p = next_of!($name);
        // SAFETY: as above, for a variadic function.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*, ...) -> $r>(p) }
    }};
}

fn set_errno(e: i32) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> i32 {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// With `USNET_DEBUG=1`, one line per refused call (each name once per kind).
fn refused(call: &str, fd: c_int, e: i32) -> c_int {
    if env_is("USNET_DEBUG", "1") {
        eprintln!("usnet-preload: {call} on usnet socket {fd} is not supported (errno {e})");
    }
    set_errno(e);
    -1
}

// ------------------------------------------------------------------ sockets

/// The "no stack server" line is printed once.
static SAID: AtomicBool = AtomicBool::new(false);
/// 0: not tried, 1: attached, 2: no server (kernel fallback in force).
static ATTACH: AtomicU8 = AtomicU8::new(0);

fn for_usnet(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    matches!(
        (domain, ty & usnet_posix::SOCK_TYPE_MASK, protocol),
        (
            libc::AF_INET | libc::AF_INET6,
            libc::SOCK_STREAM,
            0 | libc::IPPROTO_TCP
        ) | (
            libc::AF_INET | libc::AF_INET6,
            libc::SOCK_DGRAM,
            0 | libc::IPPROTO_UDP
        ) | (
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_RAW,
            libc::IPPROTO_ICMP
        ) | (
            libc::AF_INET6,
            libc::SOCK_DGRAM | libc::SOCK_RAW,
            libc::IPPROTO_ICMPV6
        )
    ) && !env_is("USNET_PRELOAD", "off")
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let kernel = || real!(socket: fn(c_int, c_int, c_int) -> c_int)(domain, ty, protocol);
    // rtnetlink in the stack's interface mirror, where the stack has one: it lists
    // the interface `getifaddrs` shows (docs/preload.md, "Interfaces").
    if domain == libc::AF_NETLINK && protocol == libc::NETLINK_ROUTE {
        if let Some(_g) = on_usnet() {
            if let Ok(fd) = usnet_posix::netlink_socket(ty, protocol) {
                return fd;
            }
        }
        return kernel();
    }
    let Some(_g) = enter() else {
        return kernel();
    };
    // A raw IP socket of a protocol usnet does not serve would see the kernel's
    // network, not the stack's: refused as for a process without CAP_NET_RAW, so
    // the program takes its unprivileged way (mtr, fping and ping fall back to
    // ICMP echo sockets, which usnet serves).
    let other_raw = matches!(domain, libc::AF_INET | libc::AF_INET6)
        && ty & usnet_posix::SOCK_TYPE_MASK == libc::SOCK_RAW
        && !env_is("USNET_PRELOAD", "off");
    let ours = for_usnet(domain, ty, protocol);
    if !(ours || other_raw) || ATTACH.load(Relaxed) == 2 {
        return kernel();
    }
    if ATTACH.load(Relaxed) == 0 {
        if let Err(Errno(e)) = usnet_posix::attach(None) {
            if env_is("USNET_FALLBACK", "kernel") {
                ATTACH.store(2, Relaxed);
                return kernel();
            }
            if !SAID.swap(true, Relaxed) {
                let why = usnet_posix::attach_refusal().unwrap_or_else(|| {
                    format!(
                        "cannot attach to a usnet stack ({})",
                        std::io::Error::from_raw_os_error(e)
                    )
                });
                eprintln!(
                    "usnet-preload: {why} (USNET_FALLBACK=kernel puts this program's sockets on the kernel instead)"
                );
            }
            set_errno(libc::ENETDOWN);
            return -1;
        }
        ATTACH.store(1, Relaxed);
    }
    if !ours {
        if env_is("USNET_DEBUG", "1") {
            eprintln!(
                "usnet-preload: socket(SOCK_RAW, protocol {protocol}) is not supported (errno {})",
                libc::EPERM
            );
        }
        set_errno(libc::EPERM);
        return -1;
    }
    socket::usnet_socket(domain, ty, protocol)
}

// ------------------------------------------------------------------ interfaces

/// Inside the shim with the program's network a stack's: attached already, or
/// attaching now (an interface query may come before any socket). None when
/// the thread is in the shim already, or quietly when no stack answers: the
/// kernel's interfaces then.
fn on_usnet() -> Option<Inside> {
    let g = enter()?;
    if env_is("USNET_PRELOAD", "off") {
        return None;
    }
    let attached = match ATTACH.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let ok = usnet_posix::attach(None).is_ok();
            if ok {
                ATTACH.store(1, Relaxed);
            }
            ok
        }
    };
    attached.then_some(g)
}

/// For an open of one of this process's `/proc/net` files of interfaces and
/// routes, the same file of the stack's interface mirror (docs/preload.md,
/// "rtnetlink"): the text is looked at first, so no other open attaches.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn proc_net_instead(path: *const c_char) -> Option<(Inside, std::ffi::CString)> {
    if path.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    let file = usnet_posix::proc_net_file(p)?;
    let g = on_usnet()?;
    Some((g, usnet_posix::mirrored_proc_net(file)?))
}

/// Runs `open` (libc's call) on `path`, or on the mirror's file in its place.
///
/// # Safety
/// As [`proc_net_instead`].
unsafe fn opening<R>(path: *const c_char, open: impl FnOnce(*const c_char) -> R) -> R {
    // SAFETY: per the contract. The guard lives until `open` returns.
    let instead = unsafe { proc_net_instead(path) };
    open(instead.as_ref().map_or(path, |(_, p)| p.as_ptr()))
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let real = real!(open: variadic fn(*const c_char, c_int) -> c_int);
    // SAFETY: open's contract.
    unsafe { opening(path, |p| real(p, flags, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    let real = real!(open64: variadic fn(*const c_char, c_int) -> c_int);
    // SAFETY: open's contract.
    unsafe { opening(path, |p| real(p, flags, mode)) }
}

/// `openat(2)` (a relative path never starts with `/proc/`, so it is left alone).
#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    let real = real!(openat: variadic fn(c_int, *const c_char, c_int) -> c_int);
    // SAFETY: openat's contract.
    unsafe { opening(path, |p| real(dir, p, flags, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    let real = real!(openat64: variadic fn(c_int, *const c_char, c_int) -> c_int);
    // SAFETY: openat's contract.
    unsafe { opening(path, |p| real(dir, p, flags, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let real = real!(fopen: fn(*const c_char, *const c_char) -> *mut libc::FILE);
    // SAFETY: fopen's contract.
    unsafe { opening(path, |p| real(p, mode)) }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let real = real!(fopen64: fn(*const c_char, *const c_char) -> *mut libc::FILE);
    // SAFETY: fopen's contract.
    unsafe { opening(path, |p| real(p, mode)) }
}

/// `getifaddrs(3)`: the kernel's loopback and the stack's interface, not the
/// host's interfaces (glibc asks netlink itself, below any shim). glibc's
/// `freeifaddrs` frees the one block.
#[no_mangle]
pub unsafe extern "C" fn getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let kernel = || real!(getifaddrs: fn(*mut *mut libc::ifaddrs) -> c_int)(out);
    let Some(_g) = on_usnet() else {
        return kernel();
    };
    // SAFETY: per getifaddrs' contract.
    unsafe { usnet_ffi::ifaces::usnet_getifaddrs(out) }
}

#[no_mangle]
pub unsafe extern "C" fn if_nametoindex(name: *const libc::c_char) -> libc::c_uint {
    let kernel = || real!(if_nametoindex: fn(*const libc::c_char) -> libc::c_uint)(name);
    let Some(_g) = on_usnet() else {
        return kernel();
    };
    // SAFETY: per if_nametoindex's contract.
    unsafe { usnet_ffi::ifaces::usnet_if_nametoindex(name) }
}

#[no_mangle]
pub unsafe extern "C" fn if_indextoname(
    index: libc::c_uint,
    buf: *mut libc::c_char,
) -> *mut libc::c_char {
    let kernel = || {
        real!(if_indextoname: fn(libc::c_uint, *mut libc::c_char) -> *mut libc::c_char)(index, buf)
    };
    let Some(_g) = on_usnet() else {
        return kernel();
    };
    // SAFETY: per if_indextoname's contract.
    unsafe { usnet_ffi::ifaces::usnet_if_indextoname(index, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn if_nameindex() -> *mut libc::if_nameindex {
    let kernel = || real!(if_nameindex: fn() -> *mut libc::if_nameindex)();
    let Some(_g) = on_usnet() else {
        return kernel();
    };
    usnet_ffi::ifaces::usnet_if_nameindex()
}

unsafe fn sockaddr_of(a: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    // SAFETY: per the caller's contract (bind/connect's).
    unsafe { usnet_posix::addr::from_raw(a, len) }.ok()
}

fn loopback(a: &SocketAddr) -> bool {
    match a {
        SocketAddr::V4(v) => v.ip().is_loopback(),
        SocketAddr::V6(v) => {
            v.ip().is_loopback() || v.ip().to_ipv4_mapped().is_some_and(|m| m.is_loopback())
        }
    }
}

/// Moves a fresh usnet socket to the kernel under the same number (for loopback).
/// Returns false (errno set) if that failed.
fn to_kernel(fd: c_int) -> bool {
    let s = match usnet_posix::surrender(fd) {
        Ok(s) => s,
        Err(Errno(e)) => {
            set_errno(e);
            return false;
        }
    };
    let sock = real!(socket: fn(c_int, c_int, c_int) -> c_int);
    let fcntl = real!(fcntl: variadic fn(c_int, c_int) -> c_int);
    let nb = if s.nonblock { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain system calls on integers; `k` is closed on every path.
    unsafe {
        let k = sock(s.domain, s.stype | nb | libc::SOCK_CLOEXEC, 0);
        if k < 0 {
            return false;
        }
        let cloexec = fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0;
        let one: c_int = 1;
        let setopt = |level, name, on: bool| {
            if on {
                libc::setsockopt(k, level, name, (&one as *const c_int).cast(), 4);
            }
        };
        setopt(libc::SOL_SOCKET, libc::SO_REUSEADDR, s.reuseaddr);
        setopt(libc::SOL_SOCKET, libc::SO_REUSEPORT, s.reuseport);
        setopt(libc::SOL_SOCKET, libc::SO_KEEPALIVE, s.keepalive);
        if s.stype == libc::SOCK_STREAM {
            setopt(libc::IPPROTO_TCP, libc::TCP_NODELAY, s.nodelay);
        }
        // dup3 replaces the kernel socket that held the number, in one step.
        let r = libc::dup3(k, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
        let e = errno();
        libc::close(k);
        if r < 0 {
            set_errno(e);
            return false;
        }
    }
    renumbered(fd);
    true
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: bind's contract.
        let moved = unsafe { sockaddr_of(a, len) }
            .is_some_and(|sa| loopback(&sa) && !env_is("USNET_LOOPBACK", "usnet"));
        if !moved {
            // SAFETY: bind's contract.
            return unsafe { socket::usnet_bind(fd, a, len) };
        }
        if !to_kernel(fd) {
            return -1;
        }
    }
    real!(bind: fn(c_int, *const sockaddr, socklen_t) -> c_int)(fd, a, len)
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, a: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: connect's contract.
        let moved = unsafe { sockaddr_of(a, len) }
            .is_some_and(|sa| loopback(&sa) && !env_is("USNET_LOOPBACK", "usnet"));
        if !moved || usnet_posix::getsockname(fd).is_ok_and(|l| l.port() != 0) {
            // SAFETY: connect's contract.
            return unsafe { socket::usnet_connect(fd, a, len) };
        }
        if !to_kernel(fd) {
            return -1;
        }
    }
    real!(connect: fn(c_int, *const sockaddr, socklen_t) -> c_int)(fd, a, len)
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if let Some(_g) = ours(fd) {
        return socket::usnet_listen(fd, backlog);
    }
    real!(listen: fn(c_int, c_int) -> c_int)(fd, backlog)
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: accept's contract.
        return unsafe { socket::usnet_accept4(fd, a, len, 0) };
    }
    real!(accept: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int)(fd, a, len)
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: accept4's contract.
        return unsafe { socket::usnet_accept4(fd, a, len, flags) };
    }
    real!(accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int)(fd, a, len, flags)
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(_g) = ours(fd) {
        return socket::usnet_shutdown(fd, how);
    }
    real!(shutdown: fn(c_int, c_int) -> c_int)(fd, how)
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(_g) = ours_to_renumber(fd) {
        let r = socket::usnet_close(fd);
        renumbered(fd);
        return r;
    }
    // The layer's own descriptors stay open when a program closes every number it
    // did not open (daemons; sshd after its re-exec).
    if let Some(_g) = enter() {
        if usnet_client::lineage::is_own(fd) {
            return 0;
        }
    }
    real!(close: fn(c_int) -> c_int)(fd)
}

/// `close_range(2)` (and `closefrom`, built on it): usnet sockets in the range
/// close through the layer, the layer's own descriptors stay open, the rest goes to
/// the kernel in the gaps between.
#[no_mangle]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    let kernel = real!(close_range: fn(libc::c_uint, libc::c_uint, c_int) -> c_int);
    let Some(_g) = enter() else {
        return kernel(first, last, flags);
    };
    let lo = first.min(i32::MAX as libc::c_uint) as c_int;
    let hi = last.min(i32::MAX as libc::c_uint) as c_int;
    // (A vfork-style child closes only its own numbers: `in_vfork_child`.)
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && !usnet_posix::in_vfork_child() {
        for fd in usnet_posix::descriptors_in(lo, hi) {
            socket::usnet_close(fd);
            renumbered(fd);
        }
    }
    let mut from = first;
    for own in usnet_client::lineage::own_in(lo, hi) {
        let own = own as libc::c_uint;
        if own > from {
            let r = kernel(from, own - 1, flags);
            if r != 0 {
                return r;
            }
        }
        from = own + 1;
    }
    if from <= last && from >= first {
        return kernel(from, last, flags);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // SAFETY: as close_range's.
    unsafe { close_range(lowfd.max(0) as libc::c_uint, libc::c_uint::MAX, 0) };
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: getsockname's contract.
        return unsafe { socket::usnet_getsockname(fd, a, len) };
    }
    real!(getsockname: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int)(fd, a, len)
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, a: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: getpeername's contract.
        return unsafe { socket::usnet_getpeername(fd, a, len) };
    }
    real!(getpeername: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int)(fd, a, len)
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: setsockopt's contract.
        let r = unsafe { socket::usnet_setsockopt(fd, level, name, v, len) };
        if r < 0 && errno() == libc::ENOPROTOOPT {
            return refused(
                &format!("setsockopt({level}, {name})"),
                fd,
                libc::ENOPROTOOPT,
            );
        }
        return r;
    }
    real!(setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int)(
        fd, level, name, v, len,
    )
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(_g) = ours(fd) {
        // SAFETY: getsockopt's contract.
        let r = unsafe { socket::usnet_getsockopt(fd, level, name, v, len) };
        if r < 0 && errno() == libc::ENOPROTOOPT {
            return refused(
                &format!("getsockopt({level}, {name})"),
                fd,
                libc::ENOPROTOOPT,
            );
        }
        return r;
    }
    real!(getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int)(
        fd, level, name, v, len,
    )
}

// ------------------------------------------------------------------ data

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: read's contract.
        return unsafe { socket::usnet_read(fd, buf, n) };
    }
    real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, n)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: write's contract.
        return unsafe { socket::usnet_write(fd, buf, n) };
    }
    real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n)
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: readv's contract.
        return unsafe { socket::usnet_readv(fd, iov, n) };
    }
    real!(readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, iov, n)
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: writev's contract.
        return unsafe { socket::usnet_writev(fd, iov, n) };
    }
    real!(writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t)(fd, iov, n)
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: recv's contract.
        return unsafe { socket::usnet_recv(fd, buf, n, flags) };
    }
    real!(recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t)(fd, buf, n, flags)
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: send's contract.
        return unsafe { socket::usnet_send(fd, buf, n, flags) };
    }
    real!(send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t)(fd, buf, n, flags)
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: recvfrom's contract.
        return unsafe { socket::usnet_recvfrom(fd, buf, n, flags, a, len) };
    }
    real!(recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t)(
        fd, buf, n, flags, a, len,
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    if let Some(_g) = ours(fd) {
        // SAFETY: sendto's contract.
        return unsafe { socket::usnet_sendto(fd, buf, n, flags, a, len) };
    }
    real!(sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t)(
        fd, buf, n, flags, a, len,
    )
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    let recv = real!(recvmsg: fn(c_int, *mut libc::msghdr, c_int) -> ssize_t);
    let Some(_g) = enter() else {
        return recv(fd, msg, flags);
    };
    if usnet_posix::is_usnet(fd) {
        // SAFETY: recvmsg's contract.
        return unsafe { socket::usnet_recvmsg(fd, msg, flags) };
    }
    // Usnet sockets passed with SCM_RIGHTS become this process's (inside: the
    // layer's own calls meanwhile go straight to libc).
    // SAFETY: recvmsg's contract.
    unsafe { usnet_posix::pass::recvmsg(fd, msg, flags, |f, m, fl| recv(f, m, fl)) }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    let send = real!(sendmsg: fn(c_int, *const libc::msghdr, c_int) -> ssize_t);
    let Some(_g) = enter() else {
        return send(fd, msg, flags);
    };
    if usnet_posix::is_usnet(fd) {
        // SAFETY: sendmsg's contract.
        return unsafe { socket::usnet_sendmsg(fd, msg, flags) };
    }
    // Usnet sockets among the descriptors passed with SCM_RIGHTS go with a pin.
    // SAFETY: sendmsg's contract.
    match unsafe { usnet_posix::pass::sendmsg(fd, msg, flags, |f, m, fl| send(f, m, fl)) } {
        None => send(fd, msg, flags),
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            set_errno(e.0);
            -1
        }
    }
}

/// `sendmmsg` on a usnet socket: one `sendmsg` per message until one fails; the
/// count sent, or the first error if none was.
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: std::os::raw::c_uint,
    flags: c_int,
) -> c_int {
    if let Some(_g) = ours(fd) {
        let mut done = 0;
        for i in 0..n as usize {
            // SAFETY: sendmmsg's contract: `n` mmsghdrs at `msgs`.
            let m = unsafe { &mut *msgs.add(i) };
            // SAFETY: as above, the message's own contract.
            let r = unsafe { socket::usnet_sendmsg(fd, &m.msg_hdr, flags) };
            if r < 0 {
                return if done > 0 { done } else { -1 };
            }
            m.msg_len = r as std::os::raw::c_uint;
            done += 1;
        }
        return done;
    }
    real!(sendmmsg: fn(c_int, *mut libc::mmsghdr, std::os::raw::c_uint, c_int) -> c_int)(
        fd, msgs, n, flags,
    )
}

/// `recvmmsg` on a usnet socket: the first message as `recvmsg` with `flags`
/// (blocking unless non-blocking), the rest only while more are queued
/// (`MSG_WAITFORONE` is how it always behaves; a timeout is not applied).
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: std::os::raw::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if let Some(_g) = ours(fd) {
        let mut done = 0;
        for i in 0..n as usize {
            let f = if done == 0 {
                flags & !libc::MSG_WAITFORONE
            } else {
                flags | libc::MSG_DONTWAIT
            };
            // SAFETY: recvmmsg's contract: `n` mmsghdrs at `msgs`.
            let m = unsafe { &mut *msgs.add(i) };
            // SAFETY: as above, the message's own contract.
            let r = unsafe { socket::usnet_recvmsg(fd, &mut m.msg_hdr, f) };
            if r < 0 {
                if done > 0 {
                    set_errno(0);
                }
                return if done > 0 { done } else { -1 };
            }
            m.msg_len = r as std::os::raw::c_uint;
            done += 1;
        }
        return done;
    }
    real!(recvmmsg: fn(c_int, *mut libc::mmsghdr, std::os::raw::c_uint, c_int, *mut libc::timespec) -> c_int)(
        fd, msgs, n, flags, timeout,
    )
}

/// `sendfile` to a usnet socket: the file's bytes go straight into the socket's
/// send ring (`usnet_posix::sendfile`), at `*off` if given (which then moves) or
/// from the file's position.
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    if let Some(_g) = ours(out_fd) {
        // SAFETY: the caller's descriptor, borrowed for this call only.
        let file = unsafe { std::os::fd::BorrowedFd::borrow_raw(in_fd) };
        // SAFETY: `off` is NULL or the caller's off_t, per sendfile's contract.
        let off = unsafe { off.as_mut() };
        return match usnet_posix::sendfile(out_fd, file, off, count) {
            Ok(n) => n as ssize_t,
            Err(Errno(e)) => {
                set_errno(e);
                -1
            }
        };
    }
    real!(sendfile: fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t)(
        out_fd, in_fd, off, count,
    )
}

/// `splice` with a usnet socket at either end (the other a pipe):
/// `usnet_posix::splice`.
#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: std::os::raw::c_uint,
) -> ssize_t {
    if let Some(_g) = ours(fd_in).or_else(|| ours(fd_out)) {
        let offsets = !off_in.is_null() || !off_out.is_null();
        return match usnet_posix::splice(fd_in, fd_out, offsets, len, flags) {
            Ok(n) => n as ssize_t,
            Err(Errno(e)) => {
                set_errno(e);
                -1
            }
        };
    }
    real!(splice: fn(c_int, *mut libc::loff_t, c_int, *mut libc::loff_t, size_t, std::os::raw::c_uint) -> ssize_t)(
        fd_in, off_in, fd_out, off_out, len, flags,
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: the same contract (off_t is 64 bits on this target).
    unsafe { sendfile(out_fd, in_fd, off, count) }
}

// The _FORTIFY_SOURCE variants glibc's headers substitute (Debian builds curl, nginx
// and Python with them): the size check, then the plain call.

fn overflow() -> ! {
    let msg = b"usnet-preload: buffer overflow detected\n";
    // SAFETY: writes a static message to stderr through the raw system call.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
    std::process::abort()
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        overflow();
    }
    // SAFETY: read's contract.
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n > buflen {
        overflow();
    }
    // SAFETY: recv's contract.
    unsafe { recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    a: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        overflow();
    }
    // SAFETY: recvfrom's contract.
    unsafe { recvfrom(fd, buf, n, flags, a, len) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
        overflow();
    }
    // SAFETY: poll's contract.
    unsafe { poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
        overflow();
    }
    // SAFETY: ppoll's contract.
    unsafe { ppoll(fds, n, ts, mask) }
}

// ------------------------------------------------------------------ descriptors

/// `fcntl` with an integer or pointer argument (the variadic third argument is read
/// as the register it travels in).
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if let Some(_g) = ours_to_renumber(fd) {
        use usnet_posix::sigio::{F_GETOWN_EX, F_GETSIG, F_SETOWN_EX, F_SETSIG};
        return match cmd {
            libc::F_GETFL
            | libc::F_SETFL
            | libc::F_GETFD
            | libc::F_SETFD
            | libc::F_DUPFD
            | libc::F_DUPFD_CLOEXEC
            | libc::F_GETOWN
            | libc::F_SETOWN
            | F_GETSIG
            | F_SETSIG => socket::usnet_fcntl(fd, cmd, arg as c_long),
            // SAFETY: `arg` is a `struct f_owner_ex *` for these, per fcntl's contract.
            F_GETOWN_EX | F_SETOWN_EX => unsafe { owner_ex(fd, cmd, arg as *mut [c_int; 2]) },
            _ => refused(&format!("fcntl({cmd})"), fd, libc::EINVAL),
        };
    }
    real!(fcntl: variadic fn(c_int, c_int) -> c_int)(fd, cmd, arg)
}

/// `F_GETOWN_EX` and `F_SETOWN_EX` on a usnet socket (`owner` a `struct
/// f_owner_ex`: its type, then the id).
///
/// # Safety
/// `owner` is null or points to two ints.
unsafe fn owner_ex(fd: c_int, cmd: c_int, owner: *mut [c_int; 2]) -> c_int {
    if owner.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let r = if cmd == usnet_posix::sigio::F_GETOWN_EX {
        // SAFETY: per the contract.
        usnet_posix::owner_ex(fd).map(|(kind, id)| unsafe { *owner = [kind, id] })
    } else {
        // SAFETY: per the contract.
        let [kind, id] = unsafe { *owner };
        usnet_posix::set_owner_ex(fd, kind, id)
    };
    match r {
        Ok(()) => 0,
        Err(Errno(e)) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if usnet_posix::is_usnet(fd) {
        // SAFETY: fcntl's contract.
        return unsafe { fcntl(fd, cmd, arg) };
    }
    real!(fcntl64: variadic fn(c_int, c_int) -> c_int)(fd, cmd, arg)
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    if let Some(_g) = ours_to_renumber(fd) {
        // FD_CLOEXEC set and cleared the other way (Python's `set_inheritable`).
        match req {
            libc::FIOCLEX => {
                return socket::usnet_fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC as c_long)
            }
            libc::FIONCLEX => return socket::usnet_fcntl(fd, libc::F_SETFD, 0),
            _ => {}
        }
        use usnet_posix::sigio::{FIOASYNC, FIOGETOWN, FIOSETOWN, SIOCGPGRP, SIOCSPGRP};
        let ints = [
            libc::FIONBIO,
            libc::FIONREAD,
            usnet_posix::SIOCATMARK,
            FIOASYNC,
            FIOSETOWN,
            SIOCSPGRP,
            FIOGETOWN,
            SIOCGPGRP,
        ];
        return if ints.contains(&req) || usnet_posix::INTERFACE_QUERIES.contains(&req) {
            // SAFETY: an int, or an ifreq or ifconf for an interface query, per
            // ioctl's contract.
            unsafe { socket::usnet_ioctl(fd, req, arg) }
        } else {
            refused(&format!("ioctl({req:#x})"), fd, libc::ENOTTY)
        };
    }
    real!(ioctl: variadic fn(c_int, c_ulong) -> c_int)(fd, req, arg)
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if let Some(_g) = ours_to_renumber(fd) {
        return socket::usnet_dup(fd);
    }
    real!(dup: fn(c_int) -> c_int)(fd)
}

/// dup2/dup3 of a usnet socket gives another number for it; of a kernel descriptor
/// onto a usnet socket's number, the kernel's call replaces the socket that held
/// the number in one step, and the layer lets the socket's number go.
unsafe fn dup_onto(old: c_int, new: c_int, flags: Option<c_int>) -> c_int {
    let real_dup = || match flags {
        None => real!(dup2: fn(c_int, c_int) -> c_int)(old, new),
        Some(f) => real!(dup3: fn(c_int, c_int, c_int) -> c_int)(old, new, f),
    };
    // The layer's own dup3 (it holds the descriptor table) goes straight to libc,
    // as a vfork-style child's does (its numbers are its own; `in_vfork_child`).
    let Some(_g) = enter().filter(|_| !usnet_posix::in_vfork_child()) else {
        return real_dup();
    };
    if usnet_posix::is_usnet(old) {
        let r = match flags {
            None => socket::usnet_dup2(old, new),
            Some(f) => socket::usnet_dup3(old, new, f),
        };
        renumbered(new);
        return r;
    }
    let r = real_dup();
    if r >= 0 && old != new && usnet_posix::is_usnet(new) {
        usnet_posix::replaced_by_kernel(new);
        renumbered(new);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: dup2's contract.
    unsafe { dup_onto(old, new, None) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: dup3's contract.
    unsafe { dup_onto(old, new, Some(flags)) }
}

/// Number `fd` changed (closed, or now names another socket or a kernel
/// descriptor): `stdin`, `stdout` or `stderr` follow it (see `stdio`). Keeps errno.
fn renumbered(fd: c_int) {
    if (0..=2).contains(&fd) {
        let e = errno();
        stdio::follow(fd);
        set_errno(e);
    }
}

/// `fdopen(3)` of a usnet socket: a stream whose reads and writes are the shim's
/// (glibc's own would use its internal `read` and `write`; see `stdio`).
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    if let Some(_g) = ours(fd) {
        // SAFETY: fdopen's contract: a NUL-terminated mode.
        let m = unsafe { CStr::from_ptr(mode) };
        if !stdio::mode_ok(m) {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        return stdio::open(fd, m);
    }
    real!(fdopen: fn(c_int, *const libc::c_char) -> *mut libc::FILE)(fd, mode)
}

/// Data calls on a usnet descriptor made through `syscall(3)`, to their definitions
/// here: Debian 12's libuv (1.44, which BIND's `named` links) receives and sends
/// datagrams with `syscall(SYS_recvmmsg)` and `syscall(SYS_sendmmsg)`, which
/// reached the number's kernel socket and found nothing. `None`: another call, or
/// not a usnet descriptor.
///
/// # Safety
/// The program's call carries the system call's contract, the libc function's.
unsafe fn socket_io_syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> Option<c_long> {
    if !usnet_posix::DATA_SYSCALLS.contains(&n) || !usnet_posix::is_usnet(a as c_int) {
        return None;
    }
    let fd = a as c_int;
    // SAFETY (each arm): the caller's contract.
    let r = unsafe {
        match n {
            libc::SYS_read => read(fd, b as *mut c_void, c as size_t) as c_long,
            libc::SYS_write => write(fd, b as *const c_void, c as size_t) as c_long,
            libc::SYS_readv => readv(fd, b as *const libc::iovec, c as c_int) as c_long,
            libc::SYS_writev => writev(fd, b as *const libc::iovec, c as c_int) as c_long,
            libc::SYS_recvfrom => recvfrom(
                fd,
                b as *mut c_void,
                c as size_t,
                d as c_int,
                e as *mut sockaddr,
                f as *mut socklen_t,
            ) as c_long,
            libc::SYS_sendto => sendto(
                fd,
                b as *const c_void,
                c as size_t,
                d as c_int,
                e as *const sockaddr,
                f as socklen_t,
            ) as c_long,
            libc::SYS_recvmsg => recvmsg(fd, b as *mut libc::msghdr, c as c_int) as c_long,
            libc::SYS_sendmsg => sendmsg(fd, b as *const libc::msghdr, c as c_int) as c_long,
            libc::SYS_recvmmsg => c_long::from(recvmmsg(
                fd,
                b as *mut libc::mmsghdr,
                c as std::os::raw::c_uint,
                d as c_int,
                e as *mut libc::timespec,
            )),
            libc::SYS_sendmmsg => c_long::from(sendmmsg(
                fd,
                b as *mut libc::mmsghdr,
                c as std::os::raw::c_uint,
                d as c_int,
            )),
            _ => return None,
        }
    };
    Some(r)
}

/// `syscall(3)`: a program that makes its own system calls through libc's `syscall`
/// reaches the kernel past every other definition here. libuv (Node) closes every
/// descriptor with `syscall(SYS_close, fd)`: the kernel would close the number and
/// the layer would keep the socket under a number it no longer holds, and close
/// whatever the kernel gives that number next. The calls that make, close or
/// renumber a descriptor go through their definitions above, and so do the data calls
/// on a usnet descriptor (`socket_io_syscall`); a `clone`, `clone3` or
/// `fork` that copies the process runs the fork handlers around it (`raw_fork`);
/// `io_uring_setup` is refused (see there); every other number goes to libc's
/// `syscall` as it is (the layer's own raw calls among them).
///
/// The six arguments are read as the registers they travel in (as `fcntl`'s third
/// argument is): a call with fewer leaves the rest unread by the kernel.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    // SAFETY: as below.
    if let Some(r) = unsafe { socket_io_syscall(n, a, b, c, d, e, f) } {
        return r;
    }
    // SAFETY (each arm): the program's call carries the system call's contract,
    // which is the libc function's.
    let r: c_int = match n {
        libc::SYS_close => unsafe { close(a as c_int) },
        libc::SYS_close_range => unsafe {
            close_range(a as libc::c_uint, b as libc::c_uint, c as c_int)
        },
        libc::SYS_dup => unsafe { dup(a as c_int) },
        #[cfg(target_arch = "x86_64")]
        libc::SYS_dup2 => unsafe { dup2(a as c_int, b as c_int) },
        libc::SYS_dup3 => unsafe { dup3(a as c_int, b as c_int, c as c_int) },
        libc::SYS_fcntl => unsafe { fcntl(a as c_int, b as c_int, c as c_ulong) },
        libc::SYS_io_uring_setup if !env_is("USNET_IO_URING", "allow") => {
            // See "io_uring" in docs/preload.md: a ring's socket and epoll
            // operations reach the kernel past the shim, on the numbers' kernel
            // sockets. A program that probes (libuv: Node, uvloop) goes on
            // without one, as on a kernel built without io_uring.
            if env_is("USNET_DEBUG", "1") {
                eprintln!("usnet-preload: io_uring_setup refused (ENOSYS); USNET_IO_URING=allow permits it");
            }
            set_errno(libc::ENOSYS);
            -1
        }
        _ => {
            let real = real!(syscall: variadic fn(c_long) -> c_long);
            #[cfg(target_arch = "x86_64")]
            if n == libc::SYS_vfork {
                // A fork, as the shim's `vfork` is (`raw_fork`).
                return libc::c_long::from(raw_fork::vfork());
            }
            // SAFETY: the program's call: for clone3, `a` and `b` are its arguments.
            if unsafe { raw_fork::copies_process(n, a, b) } {
                // SAFETY: passed on unchanged.
                return raw_fork::as_fork(|| unsafe { real(n, a, b, c, d, e, f) });
            }
            return real(n, a, b, c, d, e, f);
        }
    };
    r as c_long
}

// ------------------------------------------------------------------ waiting

fn any_usnet(fds: &[libc::pollfd]) -> bool {
    fds.iter().any(|p| p.fd >= 0 && usnet_posix::is_usnet(p.fd))
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    if let Some(_g) = enter() {
        // SAFETY: poll's contract: `n` pollfds at `fds`.
        let set = unsafe { slice_of(fds, n as usize) };
        if any_usnet(set) {
            // SAFETY: as above.
            return unsafe { socket::usnet_poll(fds, n, timeout) };
        }
    }
    real!(poll: fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int)(fds, n, timeout)
}

unsafe fn slice_of<'a, T>(p: *mut T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        return &[];
    }
    // SAFETY: per the caller's contract.
    unsafe { std::slice::from_raw_parts(p, n) }
}

fn timeout_ms(ts: *const libc::timespec) -> c_int {
    if ts.is_null() {
        return -1;
    }
    // SAFETY: ppoll/pselect's contract: a readable timespec.
    let t = unsafe { *ts };
    let ms = t.tv_sec.saturating_mul(1000) + (t.tv_nsec + 999_999) / 1_000_000;
    ms.clamp(0, c_int::MAX as i64) as c_int
}

/// Runs a wait with the caller's signal mask in force for its length, as `ppoll`,
/// `pselect` and `epoll_pwait` do in the kernel: a signal the program blocks
/// everywhere else ends the wait (EINTR) and is blocked again after it. One already
/// pending is delivered as the mask opens, and ends the wait before it starts.
unsafe fn with_sigmask(mask: *const libc::sigset_t, wait: impl FnOnce() -> c_int) -> c_int {
    if mask.is_null() {
        return wait();
    }
    let before = usnet_client::signal::mark();
    let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `mask` is a sigset (the caller's contract); `old` receives the mask.
    if unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, old.as_mut_ptr()) } != 0 {
        return wait();
    }
    let r = if usnet_client::signal::interrupted_since(before, false) {
        set_errno(libc::EINTR);
        -1
    } else {
        wait()
    };
    let e = errno();
    // SAFETY: `old` was filled by the call above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old.as_ptr(), std::ptr::null_mut()) };
    set_errno(e);
    r
}

/// ppoll with usnet sockets in the set waits as poll does, under the given mask.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if let Some(_g) = enter() {
        // SAFETY: ppoll's contract.
        let set = unsafe { slice_of(fds, n as usize) };
        if any_usnet(set) {
            // SAFETY: as above.
            return unsafe { with_sigmask(mask, || socket::usnet_poll(fds, n, timeout_ms(ts))) };
        }
    }
    real!(ppoll: fn(*mut libc::pollfd, libc::nfds_t, *const libc::timespec, *const libc::sigset_t) -> c_int)(
        fds, n, ts, mask,
    )
}

/// select over a set holding usnet sockets: the sets become a pollfd list.
unsafe fn select_by_poll(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    let has = |set: *mut libc::fd_set, fd| {
        // SAFETY: select's contract: the set is null or a valid fd_set.
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut list = Vec::new();
    let mut mixed = false;
    for fd in 0..nfds {
        let (a, b, c) = (has(r, fd), has(w, fd), has(x, fd));
        if a || b || c {
            mixed |= usnet_posix::is_usnet(fd);
            let mut events = 0;
            if a {
                events |= libc::POLLIN;
            }
            if b {
                events |= libc::POLLOUT;
            }
            if c {
                events |= libc::POLLPRI;
            }
            list.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    if !mixed {
        return None;
    }
    // SAFETY: our own pollfd list; `mask` is null or a sigset (pselect's contract).
    let n = unsafe {
        with_sigmask(mask, || {
            socket::usnet_poll(list.as_mut_ptr(), list.len() as libc::nfds_t, timeout)
        })
    };
    if n < 0 {
        return Some(-1);
    }
    for set in [r, w, x] {
        if !set.is_null() {
            // SAFETY: as above.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    let mut count = 0;
    for p in &list {
        let bad = p.revents & libc::POLLNVAL != 0;
        if bad {
            set_errno(libc::EBADF);
            return Some(-1);
        }
        let err = p.revents & (libc::POLLERR | libc::POLLHUP) != 0;
        let mut mark = |set: *mut libc::fd_set, asked: i16, got: bool| {
            if p.events & asked != 0 && got {
                // SAFETY: as above.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        };
        mark(r, libc::POLLIN, p.revents & libc::POLLIN != 0 || err);
        mark(w, libc::POLLOUT, p.revents & libc::POLLOUT != 0 || err);
        mark(x, libc::POLLPRI, p.revents & libc::POLLPRI != 0);
    }
    Some(count)
}

#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    if let Some(_g) = enter() {
        let timeout = if tv.is_null() {
            -1
        } else {
            // SAFETY: select's contract: a readable timeval.
            let t = unsafe { *tv };
            (t.tv_sec.saturating_mul(1000) + (t.tv_usec + 999) / 1000).clamp(0, c_int::MAX as i64)
                as c_int
        };
        // SAFETY: select's contract.
        if let Some(n) = unsafe { select_by_poll(nfds, r, w, x, timeout, std::ptr::null()) } {
            return n;
        }
    }
    real!(select: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int)(
        nfds, r, w, x, tv,
    )
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if let Some(_g) = enter() {
        // SAFETY: pselect's contract.
        if let Some(n) = unsafe { select_by_poll(nfds, r, w, x, timeout_ms(ts), mask) } {
            return n;
        }
    }
    real!(pselect: fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *const libc::timespec, *const libc::sigset_t) -> c_int)(
        nfds, r, w, x, ts, mask,
    )
}

/// Every epoll set is made by the layer, so any later mix of usnet sockets and kernel
/// descriptors in it works.
#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    if let Some(_g) = enter() {
        return socket::usnet_epoll_create1(flags);
    }
    real!(epoll_create1: fn(c_int) -> c_int)(flags)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    if let Some(_g) = enter() {
        return socket::usnet_epoll_create(size);
    }
    real!(epoll_create: fn(c_int) -> c_int)(size)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if let Some(_g) = ours(epfd) {
        // SAFETY: epoll_ctl's contract.
        return unsafe { socket::usnet_epoll_ctl(epfd, op, fd, ev) };
    }
    real!(epoll_ctl: fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int)(epfd, op, fd, ev)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    out: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    if let Some(_g) = ours(epfd) {
        // SAFETY: epoll_wait's contract.
        return unsafe { socket::usnet_epoll_wait(epfd, out, max, timeout) };
    }
    real!(epoll_wait: fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int)(
        epfd, out, max, timeout,
    )
}

/// epoll_pwait on a layer's set waits as epoll_wait does; the signal mask is not
/// applied then (docs/preload.md).
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    out: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if let Some(_g) = ours(epfd) {
        // SAFETY: epoll_pwait's contract.
        return unsafe { with_sigmask(mask, || socket::usnet_epoll_wait(epfd, out, max, timeout)) };
    }
    real!(epoll_pwait: fn(c_int, *mut libc::epoll_event, c_int, c_int, *const libc::sigset_t) -> c_int)(
        epfd, out, max, timeout, mask,
    )
}

// ------------------------------------------------------------------ signals
//
// A blocking call on a usnet socket sleeps on the session's bell, where a signal does
// not end it. So that a handler interrupts it as it would a system call (EINTR, or a
// restart under SA_RESTART for the socket calls the kernel restarts), the shim
// installs its own trampoline for every handler the program sets: it notes the
// signal for the interrupted thread (`usnet_client::signal::note`) and calls the
// program's handler with the same arguments. `sigaction` reports the program's own
// handler back, never the trampoline.

const NSIG: usize = 65;
/// The program's handler per signal (0: none of ours installed).
static USER_HANDLER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
/// The program's sa_flags per signal.
static USER_FLAGS: [std::sync::atomic::AtomicI32; NSIG] =
    [const { std::sync::atomic::AtomicI32::new(0) }; NSIG];

extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    if i >= NSIG {
        return;
    }
    let flags = USER_FLAGS[i].load(Relaxed);
    usnet_client::signal::note(flags & libc::SA_RESTART != 0);
    let h = USER_HANDLER[i].load(Relaxed);
    if h == 0 || h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    // SAFETY: `h` is the handler the program installed for this signal, of the kind
    // its SA_SIGINFO flag says.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

fn trampoline_addr() -> libc::sighandler_t {
    trampoline as *const () as libc::sighandler_t
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let kernel = real!(sigaction: fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
    let i = sig as usize;
    if i == 0 || i >= NSIG {
        return kernel(sig, act, old);
    }
    let before = (USER_HANDLER[i].load(Relaxed), USER_FLAGS[i].load(Relaxed));
    let r = if act.is_null() {
        kernel(sig, act, old)
    } else {
        // SAFETY: sigaction's contract: a readable struct sigaction.
        let a = unsafe { *act };
        if a.sa_sigaction == libc::SIG_DFL || a.sa_sigaction == libc::SIG_IGN {
            let r = kernel(sig, act, old);
            if r == 0 {
                USER_HANDLER[i].store(0, Relaxed);
            }
            r
        } else {
            // The handler is known before the trampoline can run.
            USER_FLAGS[i].store(a.sa_flags, Relaxed);
            USER_HANDLER[i].store(a.sa_sigaction, Relaxed);
            let mut mine = a;
            mine.sa_sigaction = trampoline_addr();
            mine.sa_flags |= libc::SA_SIGINFO;
            let r = kernel(sig, &mine, old);
            if r != 0 {
                USER_HANDLER[i].store(before.0, Relaxed);
                USER_FLAGS[i].store(before.1, Relaxed);
            }
            r
        }
    };
    if r == 0 && !old.is_null() {
        // SAFETY: the kernel just filled it.
        let o = unsafe { &mut *old };
        if o.sa_sigaction == trampoline_addr() {
            o.sa_sigaction = before.0;
            o.sa_flags = before.1;
        }
    }
    r
}

/// `signal(2)` as glibc defines it (BSD semantics: SA_RESTART), through `sigaction`
/// above.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: sigaction is plain data; all-zero is a valid empty action.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to our own structs.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

mod privs;
mod raw_fork;
mod rlimit;
mod spawn;
mod stdio;
