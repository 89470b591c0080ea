//! The system calls behind the safe modules: memfd and seals, eventfd, ppoll,
//! open-file-description locks, descriptor inheritance and the monotonic clock.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new memfd (close-on-exec; sealable when `sealable`).
pub(crate) fn memfd(name: &CStr, sealable: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::MFD_CLOEXEC;
    if sealable {
        flags |= libc::MFD_ALLOW_SEALING;
    }
    // SAFETY: `name` is a valid NUL-terminated string for the call; flags are integers.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), flags) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals the size of a memfd: no shrink (which would fault a peer's accesses), no grow,
/// no further seals.
pub(crate) fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we borrow; no memory is passed.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

pub(crate) fn sealed_against_shrink(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: fcntl on a descriptor we borrow; no memory is passed.
    let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    Ok(seals & libc::F_SEAL_SHRINK != 0)
}

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes an initial value and flags and returns a new fd or -1.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd's counter. EAGAIN (counter saturated) means a wake-up is
/// already pending, which is all a ringer wants, so errors are ignored.
pub(crate) fn eventfd_add(fd: BorrowedFd<'_>) {
    let v = 1u64;
    // SAFETY: writes 8 bytes from a local u64 to an eventfd we borrow.
    unsafe { libc::write(fd.as_raw_fd(), (&v as *const u64).cast(), 8) };
}

/// Reads (and so resets) an eventfd's counter; 0 when nothing was pending.
pub(crate) fn eventfd_take(fd: BorrowedFd<'_>) -> u64 {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a local u64 from a non-blocking eventfd we borrow.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    if r == 8 {
        v
    } else {
        0
    }
}

pub(crate) fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Which of the descriptors given to [`poll_fds`] are ready (bit `i` for `fds[i]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadyFds(pub u64);

impl ReadyFds {
    /// Whether `fds[i]` is readable (or has an error or hang-up: a read will not block).
    pub fn contains(&self, i: usize) -> bool {
        i < 64 && self.0 & (1 << i) != 0
    }
    pub fn any(&self) -> bool {
        self.0 != 0
    }
}

/// Waits until one of `fds` (at most 64) is readable, or `timeout` passes; ppoll(2),
/// so the timeout has nanosecond resolution. An interrupted wait returns no fd ready
/// (callers loop).
pub fn poll_fds(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<ReadyFds> {
    if fds.len() > 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "poll_fds takes at most 64 descriptors",
        ));
    }
    let mut p = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 64];
    for (slot, fd) in p.iter_mut().zip(fds) {
        slot.fd = fd.as_raw_fd();
        slot.events = libc::POLLIN;
    }
    let ts = timespec(timeout);
    // SAFETY: `p` holds `fds.len()` initialised pollfds and outlives the call; `ts` is a
    // valid timespec; a null signal mask leaves the mask alone.
    let r = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(ReadyFds(0));
        }
        return Err(e);
    }
    let mut ready = 0u64;
    for (i, slot) in p[..fds.len()].iter().enumerate() {
        if slot.revents != 0 {
            ready |= 1 << i;
        }
    }
    Ok(ReadyFds(ready))
}

fn flock_for(byte: u64, ty: libc::c_short) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    fl.l_pid = 0; // must be 0 for OFD locks
    fl
}

/// F_OFD_SETLK: a write lock (`lock`) or an unlock on one byte, without waiting.
/// Ok(false) when another open file description holds it.
pub(crate) fn ofd_setlk(fd: BorrowedFd<'_>, byte: u64, lock: bool) -> io::Result<bool> {
    let ty = if lock { libc::F_WRLCK } else { libc::F_UNLCK };
    let fl = flock_for(byte, ty as libc::c_short);
    // SAFETY: F_OFD_SETLK reads the flock struct we pass, on a descriptor we borrow.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// F_OFD_GETLK: whether another open file description holds a lock on `byte` (our own
/// locks never conflict with us, so they do not count).
pub(crate) fn ofd_held_by_other(fd: BorrowedFd<'_>, byte: u64) -> io::Result<bool> {
    let mut fl = flock_for(byte, libc::F_WRLCK as libc::c_short);
    // SAFETY: F_OFD_GETLK fills the flock struct we pass, on a descriptor we borrow.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) })?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Makes `fd` survive `exec` in the child `cmd` spawns: clears `FD_CLOEXEC` between
/// fork and exec, so children other threads spawn meanwhile never inherit it.
pub fn inherit_fd(cmd: &mut std::process::Command, fd: BorrowedFd<'_>) {
    use std::os::unix::process::CommandExt;
    let fd = fd.as_raw_fd();
    // SAFETY: the closure calls only fcntl, which is async-signal-safe, on a descriptor
    // number that is open in the forked child (it was open in the parent at fork).
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Takes ownership of a descriptor number inherited from the parent (see
/// [`inherit_fd`]) after checking that it is open.
pub fn adopt_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD on an arbitrary number only reports whether it is open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "inherited fd is not open",
        ));
    }
    // SAFETY: the descriptor is open and, by the parent/child protocol that passed its
    // number, belongs to nothing else in this process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// CLOCK_MONOTONIC in nanoseconds: the time base two processes sharing a region agree on
/// (timestamps written into shared memory by one are compared by the other).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
