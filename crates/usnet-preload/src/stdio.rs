//! stdio on usnet sockets. glibc's streams write and read with glibc's internal
//! `write` and `read`, which no LD_PRELOAD shim can define: a `printf` to a stdout
//! that is a usnet socket (an inetd-style program exec'd with its connection on 0
//! and 1; a C server that `dup2`s a connection onto 1; bash running a builtin with
//! `>&3`) or an `fprintf` to `fdopen(socket)` would reach the kernel socket that only
//! holds the number. So, for usnet sockets only:
//!
//! - `fdopen` returns a stream made with `fopencookie` whose reads and writes are
//!   the shim's;
//! - `stdin`, `stdout` and `stderr` follow their numbers: while 0, 1 or 2 is a usnet
//!   socket (inherited at start, or after a `dup2`/`dup3` onto it), the variable
//!   names such a stream; when the number is a kernel descriptor again (a `dup2`
//!   back, a `close`), it names glibc's own stream again. Output the old stream held
//!   moves to the new one, as the kernel's stream would have written it to the new
//!   descriptor at its next flush, and the buffering mode carries over.
//!
//! The streams keep their descriptor number (`fileno`), which glibc's cookie
//! streams leave at -1: the shim writes it into the `FILE`, and the places it reads
//! in a `FILE` (the number, the flags, the pending output) are checked once against
//! a stream of glibc's own before any is used.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::*};
use std::sync::OnceLock;

use libc::{size_t, ssize_t, FILE};
use usnet_ffi::socket;

use crate::enter;

#[repr(C)]
struct CookieFns {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, fns: CookieFns) -> *mut FILE;
    fn __fpending(f: *mut FILE) -> size_t;
    fn __fpurge(f: *mut FILE);
}

/// glibc's `struct _IO_FILE`, the fields the shim reads or writes (LP64 offsets of
/// the public `bits/types/struct_FILE.h`).
const FLAGS_AT: usize = 0;
const WRITE_BASE_AT: usize = 32;
const FILENO_AT: usize = 112;
/// `_IO_UNBUFFERED` and `_IO_LINE_BUF` in `_flags`.
const UNBUFFERED: c_int = 0x2;
const LINE_BUF: c_int = 0x200;

/// Whether this libc's `FILE` has those fields where the shim looks, checked once
/// on a stream of its own over a pipe.
fn layout_known() -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let mut p = [0 as c_int; 2];
        // SAFETY: a pipe of our own, a stream over its write end, and reads of that
        // stream's first 116 bytes (a FILE is larger); the stream is closed here.
        unsafe {
            if libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return false;
            }
            let f = libc::fdopen(p[1], c"w".as_ptr());
            if f.is_null() {
                libc::close(p[0]);
                libc::close(p[1]);
                return false;
            }
            libc::setvbuf(f, std::ptr::null_mut(), libc::_IOFBF, 64);
            libc::fputc(b'Q' as c_int, f);
            let base = *(f as *const u8).add(WRITE_BASE_AT).cast::<*const u8>();
            let ok = *(f as *const u8).add(FILENO_AT).cast::<c_int>() == p[1]
                && __fpending(f) == 1
                && !base.is_null()
                && *base == b'Q';
            __fpurge(f);
            libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
            let ok = ok && *(f as *const u8).add(FLAGS_AT).cast::<c_int>() & UNBUFFERED != 0;
            libc::fclose(f);
            libc::close(p[0]);
            ok
        }
    })
}

/// A stream's cookie: its number, and whether the shim let go of the stream (its
/// close then leaves the number alone).
struct Cookie {
    fd: c_int,
    detached: std::sync::atomic::AtomicBool,
}

fn fd_of(c: *mut c_void) -> c_int {
    // SAFETY: every cookie is a `Box<Cookie>` made in `open`, freed only by its close.
    unsafe { (*(c as *const Cookie)).fd }
}

/// One read, as glibc's stream makes it (an `EINTR` is the stream's error, unless
/// the handler had `SA_RESTART`, which the read itself honours).
unsafe extern "C" fn cookie_read(c: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    let fd = fd_of(c);
    let _g = enter();
    if usnet_posix::is_usnet(fd) {
        // SAFETY: glibc hands a buffer of `n` writable bytes.
        unsafe { socket::usnet_read(fd, buf.cast(), n) }
    } else {
        real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf.cast(), n)
    }
}

/// Writes all of it, short writes continued (glibc takes a short answer for an
/// error), or says how much went; an error (`EINTR` too, as glibc's own stream
/// stops there) ends it.
unsafe extern "C" fn cookie_write(c: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    let fd = fd_of(c);
    let _g = enter();
    let mut done = 0usize;
    while done < n {
        // SAFETY: glibc hands `n` readable bytes; `done < n`.
        let at = unsafe { buf.add(done) }.cast::<c_void>();
        let r = if usnet_posix::is_usnet(fd) {
            // SAFETY: as above.
            unsafe { socket::usnet_write(fd, at, n - done) }
        } else {
            real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, at, n - done)
        };
        if r < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        if r == 0 {
            break;
        }
        done += r as usize;
    }
    done as ssize_t
}

unsafe extern "C" fn cookie_close(c: *mut c_void) -> c_int {
    // A standard stream the program closed itself is no longer followed.
    for k in 0..3 {
        if COOKIES[k].load(Acquire) == c.cast() {
            FOLLOWING[k].store(std::ptr::null_mut(), Release);
            COOKIES[k].store(std::ptr::null_mut(), Release);
        }
    }
    // SAFETY: the cookie made in `cookie_stream`; glibc calls close once, last.
    let cookie = unsafe { Box::from_raw(c as *mut Cookie) };
    if cookie.detached.load(Relaxed) {
        return 0;
    }
    let fd = cookie.fd;
    let _g = enter();
    if usnet_posix::is_usnet(fd) {
        socket::usnet_close(fd)
    } else {
        real!(close: fn(c_int) -> c_int)(fd)
    }
}

/// A stream numbered `fd` whose reads and writes go through the shim, and its cookie.
fn cookie_stream(fd: c_int, mode: &CStr) -> Option<(*mut FILE, *mut Cookie)> {
    let cookie = Box::into_raw(Box::new(Cookie {
        fd,
        detached: false.into(),
    }));
    let fns = CookieFns {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: None,
        close: Some(cookie_close),
    };
    // SAFETY: a mode string and functions that take this cookie.
    let f = unsafe { fopencookie(cookie.cast(), mode.as_ptr(), fns) };
    if f.is_null() {
        // SAFETY: not handed to glibc.
        drop(unsafe { Box::from_raw(cookie) });
        return None;
    }
    if layout_known() {
        // SAFETY: the stream's `_fileno` (checked), -1 in a cookie stream.
        unsafe { *(f as *mut u8).add(FILENO_AT).cast::<c_int>() = fd };
    }
    Some((f, cookie))
}

/// `fdopen` of usnet socket `fd` (mode as `fdopen`'s).
pub(crate) fn open(fd: c_int, mode: &CStr) -> *mut FILE {
    cookie_stream(fd, mode).map_or(std::ptr::null_mut(), |(f, _)| f)
}

/// Streams that stand for `stdin`, `stdout`, `stderr` while their numbers are usnet
/// sockets, glibc's streams they stand in for, and their cookies.
static FOLLOWING: [AtomicPtr<FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];
static ORIGINAL: [AtomicPtr<FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];
static COOKIES: [AtomicPtr<Cookie>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// The variable of standard stream `k`.
fn var(k: usize) -> *mut *mut FILE {
    // Addresses of libc's variables (the program's copies, if it has them).
    match k {
        0 => &raw mut stdin,
        1 => &raw mut stdout,
        _ => &raw mut stderr,
    }
}

/// Makes `stdin`/`stdout`/`stderr` (number `fd`, 0 to 2) match what the number is
/// now: a stream over the usnet socket while it is one, glibc's own otherwise.
/// Called inside the shim.
pub(crate) fn follow(fd: c_int) {
    let Ok(k) = usize::try_from(fd) else {
        return;
    };
    if k > 2 {
        return;
    }
    let v = var(k);
    let ours = FOLLOWING[k].load(Acquire);
    // SAFETY: reads and writes of libc's stream variables, on the thread that
    // changed the number (as glibc's own streams are changed: unlocked).
    unsafe {
        let cur = *v;
        if usnet_posix::is_usnet(fd) {
            if !ours.is_null() || cur.is_null() || libc::fileno(cur) != fd {
                return;
            }
            let Some((f, cookie)) = open_std(k, cur) else {
                return;
            };
            COOKIES[k].store(cookie, Release);
            ORIGINAL[k].store(cur, Release);
            FOLLOWING[k].store(f, Release);
            *v = f;
        } else if !ours.is_null() {
            let orig = ORIGINAL[k].load(Acquire);
            if cur == ours {
                *v = orig;
            }
            // What it had not written yet waits in glibc's stream, which writes it
            // where the number leads when it flushes, as it would have on the
            // kernel; then the stream goes, and the number stays.
            move_pending(ours, orig);
            let c = COOKIES[k].swap(std::ptr::null_mut(), AcqRel);
            FOLLOWING[k].store(std::ptr::null_mut(), Release);
            if !c.is_null() {
                (*c).detached.store(true, Relaxed);
            }
            libc::fclose(ours);
        }
    }
}

/// The stream that takes over from glibc's `orig` for standard number `k`: its
/// buffering, and the output `orig` had not written yet.
///
/// # Safety
/// `orig` is a live glibc stream.
unsafe fn open_std(k: usize, orig: *mut FILE) -> Option<(*mut FILE, *mut Cookie)> {
    let mode = if k == 0 { c"r" } else { c"w" };
    let (f, cookie) = cookie_stream(k as c_int, mode)?;
    // SAFETY: `orig` live (the caller's promise); the flags are read only with the
    // known layout (without it the new stream keeps glibc's default buffering).
    unsafe {
        if layout_known() {
            let flags = *(orig as *const u8).add(FLAGS_AT).cast::<c_int>();
            if flags & UNBUFFERED != 0 {
                libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
            } else if flags & LINE_BUF != 0 {
                libc::setvbuf(
                    f,
                    std::ptr::null_mut(),
                    libc::_IOLBF,
                    libc::BUFSIZ as size_t,
                );
            }
        }
        if k != 0 {
            move_pending(orig, f);
        }
    }
    Some((f, cookie))
}

/// Moves the output `from` holds and has not written into `to`'s buffer (whose
/// writes it keeps in order); without the known layout, `from` writes it itself.
///
/// # Safety
/// Both are live streams.
unsafe fn move_pending(from: *mut FILE, to: *mut FILE) {
    // SAFETY: the caller's promise; the fields read are checked by `layout_known`.
    unsafe {
        if !layout_known() {
            libc::fflush(from);
            return;
        }
        let n = __fpending(from);
        let base = *(from as *const u8).add(WRITE_BASE_AT).cast::<*const u8>();
        if n > 0 && !base.is_null() {
            libc::fwrite(base.cast(), 1, n, to);
            __fpurge(from);
            if *(to as *const u8).add(FLAGS_AT).cast::<c_int>() & UNBUFFERED != 0 {
                libc::fflush(to);
            }
        }
    }
}

/// `fdopen`'s modes: `r`, `w` or `a`, then `+`, `b`, `e`, `x`, `m`, `c` in any order.
pub(crate) fn mode_ok(mode: &CStr) -> bool {
    let b = mode.to_bytes();
    matches!(b.first(), Some(b'r' | b'w' | b'a')) && b[1..].iter().all(|c| b"+bexmc".contains(c))
}
