//! packetdrill's own `getsockopt()` and `sendfile()` on this library's descriptors,
//! answered by this library.
//!
//! For `%{ ... }%` assertions packetdrill reads `TCP_INFO` (then `TCP_CC_INFO` and
//! `SO_MEMINFO`) with the C library's `getsockopt()` on the descriptor number the
//! library handed out, not through `struct packetdrill_interface`. Those numbers are
//! real kernel descriptors (usnet-posix's eventfds), so the kernel would
//! answer `ENOTSOCK`. This module installs a seccomp filter (with
//! `SECCOMP_RET_USER_NOTIF`) on the process that traps `getsockopt` for those three
//! options, and a supervisor thread that answers the trapped calls on this library's
//! descriptors ([`Answer`]). A script's `sendfile()` is the C library's too: it is
//! trapped as well and, with one of our sockets as its destination, written to the
//! socket (`sendfile_to`); every other
//! trapped call continues into the kernel unchanged (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
//!
//! The caller's buffers are in this process: they are read and written with
//! `process_vm_readv/writev` on our own pid, so a bad pointer gives `EFAULT` to the
//! caller instead of a fault here, and only after `SECCOMP_IOCTL_NOTIF_ID_VALID`
//! confirms the call is still waiting. Turned off with `--so_flags=trap=0`; if the
//! kernel refuses the filter, the library says so once and works without it.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use usnet_link::bpf::{jump, op, seccomp, stmt};

/// What answers the trapped calls (the world of `crate::posix`).
pub trait Answer: Send + Sync + 'static {
    /// The value of `(level, name)` on `sock`; None: not this library's descriptor
    /// or not an option it answers (the call goes on to the kernel).
    fn value(&self, sock: c_int, level: c_int, name: c_int) -> Option<Result<Vec<u8>, c_int>>;
    /// Whether `fd` is this library's socket.
    fn owns(&self, fd: c_int) -> bool;
    /// A blocking `write` of `data` to the socket `fd`.
    fn write(&self, fd: c_int, data: &[u8]) -> Result<usize, c_int>;
}

const TCP_CC_INFO: u32 = 26;
const SO_MEMINFO: u32 = 55;

/// The supervisor of the installed filter; stops its thread when dropped.
pub struct Trap {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Installs the filter and starts the supervisor for `shared`.
pub fn install<A: Answer>(shared: Arc<A>) -> Result<Trap, String> {
    let Some(arch) = seccomp::AUDIT_ARCH else {
        return Err("no seccomp architecture constant for this target".into());
    };
    let prog = [
        stmt(op::LD_W_ABS, seccomp::ARCH),
        jump(op::JEQ_K, arch, 0, 8),
        stmt(op::LD_W_ABS, seccomp::NR),
        jump(op::JEQ_K, libc::SYS_sendfile as u32, 5, 0),
        jump(op::JEQ_K, libc::SYS_getsockopt as u32, 0, 5),
        stmt(op::LD_W_ABS, seccomp::arg_lo(2)),
        jump(op::JEQ_K, libc::TCP_INFO as u32, 2, 0),
        jump(op::JEQ_K, TCP_CC_INFO, 1, 0),
        jump(op::JEQ_K, SO_MEMINFO, 0, 1),
        stmt(op::RET_K, libc::SECCOMP_RET_USER_NOTIF),
        stmt(op::RET_K, libc::SECCOMP_RET_ALLOW),
    ];
    let fd = seccomp::install(
        &prog,
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
            | libc::SECCOMP_FILTER_FLAG_TSYNC
            | libc::SECCOMP_FILTER_FLAG_TSYNC_ESRCH,
    )
    .map_err(|e| {
        format!(
            "seccomp user notification: {}",
            std::io::Error::from_raw_os_error(e)
        )
    })?;
    let fd = fd as c_int;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("usnet-pd-trap".into())
        .spawn(move || supervise(fd, &*shared, &stop2))
        .map_err(|e| format!("supervisor thread: {e}"))?;
    Ok(Trap {
        stop,
        thread: Some(thread),
    })
}

/// Answers trapped calls until told to stop (checked every 100 ms of real time).
fn supervise(fd: c_int, shared: &dyn Answer, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 100) };
        if n <= 0 || p.revents & libc::POLLIN == 0 {
            continue;
        }
        // SAFETY: seccomp_notif is plain data; the kernel requires it zeroed.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: NOTIF_RECV fills `req`.
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
            continue;
        }
        let mut resp = answer(fd, shared, &req);
        // SAFETY: NOTIF_SEND reads `resp`; an error means the caller went away.
        unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
    }
    // SAFETY: our listener descriptor, closed once (trapped calls then fail ENOSYS).
    unsafe { libc::close(fd) };
}

/// The answer to one trapped `getsockopt`.
fn answer(fd: c_int, shared: &dyn Answer, req: &libc::seccomp_notif) -> libc::seccomp_notif_resp {
    let mut resp = libc::seccomp_notif_resp {
        id: req.id,
        val: 0,
        error: 0,
        flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    };
    let ours = std::path::Path::new(&format!("/proc/self/task/{}", req.pid)).exists();
    let a = req.data.args;
    if ours && req.data.nr == libc::SYS_sendfile as c_int {
        return sendfile(fd, shared, req, resp);
    }
    if !ours || req.data.nr != libc::SYS_getsockopt as c_int {
        return resp;
    }
    let (sock, level, name) = (a[0] as c_int, a[1] as c_int, a[2] as c_int);
    let bytes = shared.value(sock, level, name);
    let Some(bytes) = bytes else {
        return resp;
    };
    resp.flags = 0;
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => {
            resp.error = -e;
            resp.val = -1;
            return resp;
        }
    };
    let (optval, optlen) = (a[3] as usize, a[4] as usize);
    // SAFETY: NOTIF_ID_VALID reads the id.
    if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &req.id) } != 0 {
        return resp;
    }
    let mut len = [0u8; 4];
    let r = vm_copy(optlen, &mut len, false).and_then(|_| {
        let room = u32::from_ne_bytes(len) as usize;
        let n = room.min(bytes.len());
        let mut out = bytes[..n].to_vec();
        vm_copy(optval, &mut out, true)?;
        let mut l = (n as u32).to_ne_bytes();
        vm_copy(optlen, &mut l, true)
    });
    if let Err(e) = r {
        resp.error = -e;
        resp.val = -1;
    }
    resp
}

/// The most one trapped `sendfile` moves (Linux's `sendfile` moves at most
/// `MAX_RW_COUNT` per call; a caller loops for the rest).
const SENDFILE_MAX: usize = 1 << 20;

/// packetdrill's `sendfile(out_fd, in_fd, offset, count)` (it calls the C library,
/// not `struct packetdrill_interface`) with one of our sockets as `out_fd`: the
/// file's bytes are read here (the descriptor is this process's) and written to
/// the socket as a `write` would (a blocking socket waits for room); `*offset`
/// moves on by what was sent, or without an offset the file position does. Any
/// other `out_fd` goes on to the kernel.
fn sendfile(
    fd: c_int,
    shared: &dyn Answer,
    req: &libc::seccomp_notif,
    mut resp: libc::seccomp_notif_resp,
) -> libc::seccomp_notif_resp {
    let a = req.data.args;
    let (out_fd, in_fd, offp) = (a[0] as c_int, a[1] as c_int, a[2] as usize);
    let count = (a[3] as usize).min(SENDFILE_MAX);
    if !shared.owns(out_fd) {
        return resp;
    }
    resp.flags = 0;
    // SAFETY: NOTIF_ID_VALID reads the id.
    if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &req.id) } != 0 {
        return resp;
    }
    match sendfile_to(shared, out_fd, in_fd, offp, count) {
        Ok(n) => resp.val = n as i64,
        Err(e) => {
            resp.error = -e;
            resp.val = -1;
        }
    }
    resp
}

fn sendfile_to(
    shared: &dyn Answer,
    out_fd: c_int,
    in_fd: c_int,
    offp: usize,
    count: usize,
) -> Result<usize, c_int> {
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    let mut off = [0u8; 8];
    if offp != 0 {
        vm_copy(offp, &mut off, false)?;
    }
    let start = i64::from_ne_bytes(off);
    let mut buf = vec![0u8; count];
    // SAFETY: `buf` has `count` writable bytes; `in_fd` is the caller's descriptor
    // in this process (the kernel checks it).
    let got = unsafe {
        if offp != 0 {
            libc::pread(in_fd, buf.as_mut_ptr().cast(), count, start)
        } else {
            libc::read(in_fd, buf.as_mut_ptr().cast(), count)
        }
    };
    if got < 0 {
        return Err(errno());
    }
    let got = got as usize;
    let sent = if got == 0 {
        0
    } else {
        shared.write(out_fd, &buf[..got])?
    };
    if offp != 0 {
        let mut off = (start + sent as i64).to_ne_bytes();
        vm_copy(offp, &mut off, true)?;
    } else if sent < got {
        // SAFETY: lseek on the caller's descriptor moves its file position back
        // over what was read but not sent.
        unsafe { libc::lseek(in_fd, sent as i64 - got as i64, libc::SEEK_CUR) };
    }
    Ok(sent)
}

/// Copies between `buf` and `addr` in this process with process_vm_readv/writev
/// (`EFAULT` for a bad address instead of a fault).
fn vm_copy(addr: usize, buf: &mut [u8], write: bool) -> Result<(), c_int> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`; the kernel checks `remote` and fails with
    // EFAULT rather than touching a bad address.
    let n = unsafe {
        if write {
            libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0)
        } else {
            libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0)
        }
    };
    if n == buf.len() as isize {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}
