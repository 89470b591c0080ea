//! The seccomp user-notification listener: receiving a notification, answering it,
//! installing a descriptor in the caller, and reading and writing the caller's
//! memory. Written over raw ioctls: libseccomp (a C library) has no ADDFD, and
//! seccompiler (BPF filters for Firecracker) has no user notification.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

// <linux/seccomp.h>: _IOWR('!', 0, struct seccomp_notif) and friends.
const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | ((b'!' as u64) << 8) | nr
}
const fn iow(nr: u64, size: u64) -> u64 {
    (1 << 30) | (size << 16) | ((b'!' as u64) << 8) | nr
}
const NOTIF_RECV: u64 = iowr(0, std::mem::size_of::<libc::seccomp_notif>() as u64);
const NOTIF_SEND: u64 = iowr(1, std::mem::size_of::<libc::seccomp_notif_resp>() as u64);
const NOTIF_ADDFD: u64 = iow(3, std::mem::size_of::<libc::seccomp_notif_addfd>() as u64);

/// One notified call: who made it and its arguments.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub id: u64,
    /// The calling thread's id.
    pub tid: i32,
    pub nr: i64,
    pub args: [u64; 6],
}

/// What a call returns to the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Value(i64),
    Errno(i32),
    /// Let the kernel do the call as made (the descriptor is not a relay).
    Continue,
}

pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    pub fn new(fd: OwnedFd) -> Listener {
        Listener { fd }
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The next notification; `Ok(None)` when the caller went away between the
    /// wake-up and the receive (ENOENT) or a signal came (EINTR).
    pub fn recv(&self) -> io::Result<Option<Call>> {
        // SAFETY: plain-old-data, filled by the kernel.
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: the ioctl writes a seccomp_notif into `n`.
        let r = unsafe { libc::ioctl(self.raw(), NOTIF_RECV as _, &mut n) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(Call {
            id: n.id,
            tid: n.pid as i32,
            nr: i64::from(n.data.nr),
            args: n.data.args,
        }))
    }

    /// Answers `call`. A caller that is gone (killed, or its call interrupted) is
    /// not an error.
    pub fn answer(&self, call: &Call, a: Answer) {
        // SAFETY: plain-old-data.
        let mut r: libc::seccomp_notif_resp = unsafe { std::mem::zeroed() };
        r.id = call.id;
        match a {
            Answer::Value(v) => r.val = v,
            Answer::Errno(e) => r.error = -e,
            Answer::Continue => r.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        }
        // SAFETY: the ioctl reads a seccomp_notif_resp.
        unsafe { libc::ioctl(self.raw(), NOTIF_SEND as _, &mut r) };
    }

    /// Installs `file` in the caller at `number` (replacing what is there), or at
    /// its lowest free number when `None`, with FD_CLOEXEC if `cloexec`. With
    /// `answer`, the installed number is the call's result and the call is
    /// answered.
    pub fn install(
        &self,
        call: &Call,
        file: RawFd,
        number: Option<i32>,
        cloexec: bool,
        answer: bool,
    ) -> io::Result<i32> {
        let mut flags = if number.is_some() {
            libc::SECCOMP_ADDFD_FLAG_SETFD as u32
        } else {
            0
        };
        if answer {
            flags |= libc::SECCOMP_ADDFD_FLAG_SEND as u32;
        }
        let a = libc::seccomp_notif_addfd {
            id: call.id,
            flags,
            srcfd: file as u32,
            newfd: number.unwrap_or(0) as u32,
            newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
        };
        // SAFETY: the ioctl reads a seccomp_notif_addfd.
        let r = unsafe { libc::ioctl(self.raw(), NOTIF_ADDFD as _, &a) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
}

/// The program's threads as pidfds, kept between calls: opening one for every
/// notified call (`pidfd_open`, and its close) was about a sixth of the
/// supervisor's time per connection a Go server accepted. A kept pidfd of a thread
/// that has exited (its number perhaps another thread's now) fails with `ESRCH`,
/// and the number is opened again.
#[derive(Default)]
pub struct Pidfds(Mutex<HashMap<i32, Arc<OwnedFd>>>);

/// Threads kept at most (past it, all are let go and opened again as they call).
const PIDFDS_KEPT: usize = 4096;

impl Pidfds {
    fn open(&self, tid: i32) -> io::Result<Arc<OwnedFd>> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = kept.get(&tid) {
            return Ok(Arc::clone(p));
        }
        const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
        // SAFETY: a plain syscall; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid, PIDFD_THREAD) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just gave us.
        let p = Arc::new(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        if kept.len() >= PIDFDS_KEPT {
            kept.clear();
        }
        kept.insert(tid, Arc::clone(&p));
        Ok(p)
    }

    /// The caller's open file at `fd`, as a descriptor of ours (`pidfd_getfd`).
    pub fn their_file(&self, tid: i32, fd: i32) -> io::Result<OwnedFd> {
        let mut again = true;
        loop {
            let pidfd = self.open(tid)?;
            // SAFETY: a plain syscall; the result is checked.
            let f = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
            if f >= 0 {
                // SAFETY: a descriptor the kernel just gave us.
                return Ok(unsafe { OwnedFd::from_raw_fd(f as RawFd) });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) || !std::mem::take(&mut again) {
                return Err(e);
            }
            // Kept from a thread that is gone: open the number afresh.
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&tid);
        }
    }
}

/// The inode of an open file (a socket's identity across dup and fork).
pub fn inode(fd: RawFd) -> io::Result<u64> {
    // SAFETY: fstat fills the struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_ino)
}

/// Reads `len` bytes at `addr` in process `tid`.
pub fn read_mem(tid: i32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is our buffer of `len` bytes; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != len {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(buf)
}

/// Writes `bytes` at `addr` in process `tid`.
pub fn write_mem(tid: i32, addr: u64, bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: the kernel reads `bytes` and checks `remote`.
    let n = unsafe { libc::process_vm_writev(tid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// Whether the caller's descriptor is non-blocking and close-on-exec, from
/// /proc/<tid>/fdinfo/<fd> ("flags:" in octal).
pub fn fd_flags(tid: i32, fd: i32) -> io::Result<(bool, bool)> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}"))?;
    let flags = s
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i64::from_str_radix(v.trim(), 8).ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
    Ok((
        flags & i64::from(libc::O_NONBLOCK) != 0,
        flags & i64::from(libc::O_CLOEXEC) != 0,
    ))
}
