//! An address-space limit (`RLIMIT_AS`) that leaves room for the session, and a
//! descriptor limit (`RLIMIT_NOFILE`) the session follows when it rises.
//!
//! On the kernel a socket's buffers are the kernel's memory; under the shim they
//! are the session's, mapped into the program (two rings per socket, 512 MiB of
//! address space for a fresh client's 1,024 sockets, though only the pages in use
//! take memory). A program that caps its own address space, as vsftpd caps each
//! connection's processes at 200 MB, or a shell's `ulimit -v`, would then be out
//! of address space before its first allocation, and a child it forks could not
//! map a session of its own (vsftpd's connection process died at the greeting).
//!
//! So a limit the program sets on itself is raised by the room usnet needs: the
//! session it has and one more of the same size, which a forked child maps
//! beside the inherited one before it lets that go (with no session yet, twice a
//! fresh client's). The program's own allocations stay capped by what it asked
//! for plus that room. Reading the limit back gives what the program set. A
//! raise the hard limit forbids is not made: the program's values go to the
//! kernel as they were.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use libc::{pid_t, rlimit};

/// The room added to the limits last set, and the limits the kernel holds for
/// it (soft, hard): a read that finds those reports the program's own values.
static ADDED: AtomicU64 = AtomicU64::new(0);
static SET_CUR: AtomicU64 = AtomicU64::new(0);
static SET_MAX: AtomicU64 = AtomicU64::new(0);

fn room() -> u64 {
    let s = usnet_posix::session_address_space().max(usnet_posix::default_session_address_space());
    2 * s as u64
}

fn raised(v: u64, by: u64) -> u64 {
    // RLIM_INFINITY is u64::MAX: a sum past it saturates to it.
    v.saturating_add(by)
}

/// The limit the program sees for what the kernel holds.
fn as_set(mut l: rlimit) -> rlimit {
    let by = ADDED.load(Relaxed);
    if by != 0 && l.rlim_cur == SET_CUR.load(Relaxed) && l.rlim_cur != libc::RLIM_INFINITY {
        l.rlim_cur -= by;
    }
    if by != 0 && l.rlim_max == SET_MAX.load(Relaxed) && l.rlim_max != libc::RLIM_INFINITY {
        l.rlim_max -= by;
    }
    l
}

/// Sets this process's `RLIMIT_AS` to `want` plus the room, through `set`
/// (libc's call, given the limit to install); `want` as it is when the raise is
/// refused.
fn set_own(want: &rlimit, set: impl Fn(&rlimit) -> c_int) -> c_int {
    let by = room();
    let more = rlimit {
        rlim_cur: raised(want.rlim_cur, by),
        rlim_max: raised(want.rlim_max, by),
    };
    if set(&more) == 0 {
        ADDED.store(by, Relaxed);
        SET_CUR.store(more.rlim_cur, Relaxed);
        SET_MAX.store(more.rlim_max, Relaxed);
        return 0;
    }
    ADDED.store(0, Relaxed);
    set(want)
}

/// After a change of this process's `RLIMIT_NOFILE` (`r`: the call's result): a
/// descriptor limit raised past the session's room makes the session grow to it
/// (`usnet_posix::grow_session`), as the kernel lets the program hold that many
/// sockets from now on. Not for the layer's own calls (it is inside then).
fn followed(r: c_int) -> c_int {
    if r == 0 {
        if let Some(_g) = crate::enter() {
            usnet_posix::grow_session();
        }
    }
    r
}

fn is_self(pid: pid_t) -> bool {
    // SAFETY: no preconditions.
    pid == 0 || pid == unsafe { libc::getpid() }
}

/// `setrlimit` and `setrlimit64` (one function on 64-bit Linux).
unsafe fn set(
    resource: c_int,
    rl: *const rlimit,
    real: unsafe extern "C" fn(c_int, *const rlimit) -> c_int,
) -> c_int {
    if resource == libc::RLIMIT_NOFILE as c_int {
        // SAFETY: passed on unchanged.
        return followed(unsafe { real(resource, rl) });
    }
    if resource != libc::RLIMIT_AS as c_int || rl.is_null() || crate::is_inside() {
        // SAFETY: passed on unchanged.
        return unsafe { real(resource, rl) };
    }
    // SAFETY: setrlimit's contract: `rl` points at a limit.
    let want = unsafe { *rl };
    // SAFETY: a limit of our own.
    set_own(&want, |l| unsafe { real(resource, l) })
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, rl: *const rlimit) -> c_int {
    let real = real!(setrlimit: fn(c_int, *const rlimit) -> c_int);
    // SAFETY: setrlimit's contract, passed on.
    unsafe { set(resource, rl, real) }
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, rl: *const rlimit) -> c_int {
    let real = real!(setrlimit64: fn(c_int, *const rlimit) -> c_int);
    // SAFETY: as above.
    unsafe { set(resource, rl, real) }
}

/// `getrlimit` and `getrlimit64`: what the program set.
unsafe fn get(
    resource: c_int,
    rl: *mut rlimit,
    real: unsafe extern "C" fn(c_int, *mut rlimit) -> c_int,
) -> c_int {
    // SAFETY: passed on unchanged.
    let r = unsafe { real(resource, rl) };
    if r == 0 && resource == libc::RLIMIT_AS as c_int && !rl.is_null() {
        // SAFETY: libc filled it.
        unsafe { *rl = as_set(*rl) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn getrlimit(resource: c_int, rl: *mut rlimit) -> c_int {
    let real = real!(getrlimit: fn(c_int, *mut rlimit) -> c_int);
    // SAFETY: getrlimit's contract, passed on.
    unsafe { get(resource, rl, real) }
}

#[no_mangle]
pub unsafe extern "C" fn getrlimit64(resource: c_int, rl: *mut rlimit) -> c_int {
    let real = real!(getrlimit64: fn(c_int, *mut rlimit) -> c_int);
    // SAFETY: as above.
    unsafe { get(resource, rl, real) }
}

type Prlimit = unsafe extern "C" fn(pid_t, c_int, *const rlimit, *mut rlimit) -> c_int;

/// `prlimit` and `prlimit64`: on this process's `RLIMIT_AS`, as `setrlimit` and
/// `getrlimit`; anything else (another process's limits) as it is.
unsafe fn pr(
    pid: pid_t,
    resource: c_int,
    new: *const rlimit,
    old: *mut rlimit,
    real: Prlimit,
) -> c_int {
    if resource == libc::RLIMIT_NOFILE as c_int && is_self(pid) && !new.is_null() {
        // SAFETY: passed on unchanged.
        return followed(unsafe { real(pid, resource, new, old) });
    }
    if resource != libc::RLIMIT_AS as c_int || !is_self(pid) || crate::is_inside() {
        // SAFETY: passed on unchanged.
        return unsafe { real(pid, resource, new, old) };
    }
    let mut before = rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads the limit into our own struct.
    let r = unsafe { real(pid, resource, std::ptr::null(), &mut before) };
    if r != 0 {
        return r;
    }
    if !new.is_null() {
        // SAFETY: prlimit's contract: `new` points at a limit.
        let want = unsafe { *new };
        // SAFETY: a limit of our own.
        let r = set_own(&want, |l| unsafe {
            real(pid, resource, l, std::ptr::null_mut())
        });
        if r != 0 {
            return r;
        }
    }
    if !old.is_null() {
        // SAFETY: prlimit's contract: `old` points at room for a limit.
        unsafe { *old = as_set(before) };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn prlimit(
    pid: pid_t,
    resource: c_int,
    new: *const rlimit,
    old: *mut rlimit,
) -> c_int {
    let real = real!(prlimit: fn(pid_t, c_int, *const rlimit, *mut rlimit) -> c_int);
    // SAFETY: prlimit's contract, passed on.
    unsafe { pr(pid, resource, new, old, real) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit64(
    pid: pid_t,
    resource: c_int,
    new: *const rlimit,
    old: *mut rlimit,
) -> c_int {
    let real = real!(prlimit64: fn(pid_t, c_int, *const rlimit, *mut rlimit) -> c_int);
    // SAFETY: as above.
    unsafe { pr(pid, resource, new, old, real) }
}
