//! The `extern "C"` surface: packetdrill's function pointers. Each checks and turns
//! the caller's pointers (sockaddrs, buffers, iovecs, out-parameters) into Rust values,
//! calls the backend, and turns `Err(errno)` into `-1` with `errno` set; a panic
//! never crosses into C (it becomes `EIO`). What the calls mean is the backend's
//! business ([`crate::backend`]).

use std::ffi::{c_char, c_int, c_long, c_longlong, c_uint, c_ulong, c_void, CStr};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use libc::{iovec, msghdr, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};

use crate::backend::shared::Shared;
use crate::backend::{Backend, Options, Res};
use crate::layout::PacketdrillInterface;

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f` on the shared state, catching panics (a panic never crosses into C: it
/// becomes `EIO`), and turns `Err(errno)` into `-1` with errno set.
fn with<T: Into<i64>>(ud: *mut c_void, f: impl FnOnce(&Shared) -> Res<T>) -> i64 {
    if ud.is_null() {
        set_errno(libc::EBADF);
        return -1;
    }
    // SAFETY: `ud` is the pointer `packetdrill_interface_init` made from an Arc<Shared>
    // and only `free` releases it.
    let shared = unsafe { &*(ud as *const Shared) };
    let _inside = shared.enter();
    match catch_unwind(AssertUnwindSafe(|| {
        shared.lock().apply_sysctl_file();
        f(shared)
    })) {
        Ok(Ok(v)) => v.into(),
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// Reads a `sockaddr_in`/`sockaddr_in6` with the one sockaddr codec
/// (`usnet_posix::addr`, as `libusnet.so` and the shim read them).
///
/// # Safety
/// `addr` must point to `len` readable bytes.
unsafe fn read_sockaddr(addr: *const sockaddr, len: socklen_t) -> Res<SocketAddr> {
    // SAFETY: the caller's contract is from_raw's.
    unsafe { usnet_posix::addr::from_raw(addr, len) }.map_err(|e| e.0)
}

/// Writes `sa` into a caller's buffer (truncating like the kernel) and sets `*len`.
///
/// # Safety
/// `addr` must point to `*len` writable bytes (or both may be null).
unsafe fn write_sockaddr(sa: SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    // SAFETY: the caller's contract is to_raw's (which cannot fail).
    let _ = unsafe { usnet_posix::addr::to_raw(sa, addr, len) };
}

/// # Safety
/// `buf` must be valid for `n` bytes (or `n == 0`).
unsafe fn slice_mut<'a>(buf: *mut c_void, n: size_t) -> Res<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) })
}

/// # Safety
/// `buf` must be valid for `n` bytes (or `n == 0`).
unsafe fn slice<'a>(buf: *const c_void, n: size_t) -> Res<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, n) })
}

/// Gathers an iovec into one buffer.
///
/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn gather(iov: *const iovec, cnt: c_int) -> Res<Vec<u8>> {
    if cnt < 0 || (cnt > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::new();
    for i in 0..cnt as usize {
        // SAFETY: caller's contract.
        let e = unsafe { &*iov.add(i) };
        // SAFETY: each entry describes readable memory.
        v.extend_from_slice(unsafe { slice(e.iov_base, e.iov_len) }?);
    }
    Ok(v)
}

/// Scatters `data` over an iovec.
///
/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn scatter(iov: *const iovec, cnt: c_int, mut data: &[u8]) -> Res<()> {
    for i in 0..cnt.max(0) as usize {
        if data.is_empty() {
            break;
        }
        // SAFETY: caller's contract.
        let e = unsafe { &*iov.add(i) };
        let n = e.iov_len.min(data.len());
        // SAFETY: each entry describes writable memory.
        unsafe { slice_mut(e.iov_base, n) }?.copy_from_slice(&data[..n]);
        data = &data[n..];
    }
    Ok(())
}

/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn iov_len(iov: *const iovec, cnt: c_int) -> Res<usize> {
    if cnt < 0 || (cnt > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller's contract.
    Ok((0..cnt as usize)
        .map(|i| unsafe { (*iov.add(i)).iov_len })
        .sum())
}

/// # Safety
/// `v` must have `*l` writable bytes.
unsafe fn put_int(v: *mut c_void, l: *mut socklen_t, x: c_int) -> Res<i32> {
    if v.is_null() || l.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract; we write at most `*l` bytes.
    unsafe {
        let b = x.to_ne_bytes();
        let n = (*l as usize).min(4);
        std::ptr::copy_nonoverlapping(b.as_ptr(), v as *mut u8, n);
        *l = n as socklen_t;
    }
    Ok(0)
}

unsafe extern "C" fn pd_free(ud: *mut c_void) {
    if !ud.is_null() {
        // SAFETY: made by Arc::into_raw in packetdrill_interface_init; freed once.
        let shared = unsafe { Arc::from_raw(ud as *const Shared) };
        // Stop the getsockopt supervisor first: it holds the other reference.
        let trap = shared.trap.lock().map(|mut t| t.take()).unwrap_or(None);
        drop(trap);
        drop(shared);
    }
}

unsafe extern "C" fn pd_socket(ud: *mut c_void, d: c_int, t: c_int, p: c_int) -> c_int {
    with(ud, |s| s.call(|b| b.socket(d, t, p))) as c_int
}

unsafe extern "C" fn pd_bind(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        // SAFETY: packetdrill passes a sockaddr of `l` bytes.
        let a = unsafe { read_sockaddr(a, l) }?;
        s.call(|b| b.bind(fd, a)).map(|_| 0)
    }) as c_int
}

unsafe extern "C" fn pd_listen(ud: *mut c_void, fd: c_int, backlog: c_int) -> c_int {
    with(ud, |s| s.call(|b| b.listen(fd, backlog)).map(|_| 0)) as c_int
}

unsafe extern "C" fn pd_accept(
    ud: *mut c_void,
    fd: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> c_int {
    with(ud, |s| {
        let (nfd, peer) = s.accept(fd)?;
        // SAFETY: accept(2) contract: `a` has `*l` bytes (or is null).
        unsafe { write_sockaddr(peer, a, l) };
        Ok(nfd)
    }) as c_int
}

unsafe extern "C" fn pd_connect(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        // SAFETY: connect(2) contract.
        let a = unsafe { read_sockaddr(a, l) }?;
        s.connect(fd, a)
    }) as c_int
}

unsafe extern "C" fn pd_read(ud: *mut c_void, fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: read(2) contract.
    with(ud, |s| s.read(fd, unsafe { slice_mut(buf, n) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_recv(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: recv(2) contract.
    with(ud, |s| s.read(fd, unsafe { slice_mut(buf, n) }?, flags)) as ssize_t
}

unsafe extern "C" fn pd_recvfrom(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    with(ud, |s| {
        // SAFETY: recvfrom(2) contract.
        let (r, peer) = s.recv_from(fd, unsafe { slice_mut(buf, n) }?, flags)?;
        if let Some(peer) = peer {
            // SAFETY: recvfrom(2) contract.
            unsafe { write_sockaddr(peer, a, l) };
        }
        Ok(r)
    }) as ssize_t
}

unsafe extern "C" fn pd_readv(
    ud: *mut c_void,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
) -> ssize_t {
    with(ud, |s| {
        // SAFETY: readv(2) contract.
        let mut tmp = vec![0u8; unsafe { iov_len(iov, cnt) }?];
        let n = s.read(fd, &mut tmp, 0)?;
        // SAFETY: readv(2) contract.
        unsafe { scatter(iov, cnt, &tmp[..n as usize]) }?;
        Ok(n)
    }) as ssize_t
}

unsafe extern "C" fn pd_recvmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *mut msghdr,
    flags: c_int,
) -> ssize_t {
    with(ud, |s| {
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: recvmsg(2) contract.
        let m = unsafe { &mut *m };
        if flags & libc::MSG_ERRQUEUE != 0 {
            match s.call(|b| b.zerocopy_take(fd)) {
                Ok(((lo, hi), v6)) => {
                    // SAFETY: recvmsg(2) contract: msg_control has msg_controllen bytes.
                    unsafe { put_zerocopy_cmsg(m, lo, hi, v6) }?;
                }
                Err(libc::EAGAIN) => {
                    let (stamp, v6) = s.call(|b| b.timestamp_take(fd))?;
                    let wall = stamp.at.map(|at| s.call(|b| b.wall_us(at)));
                    // SAFETY: recvmsg(2) contract: msg_control has msg_controllen bytes.
                    unsafe { put_timestamp_cmsgs(m, &stamp, wall, v6) }?;
                }
                Err(e) => return Err(e),
            }
            return Ok(0);
        }
        let cnt = m.msg_iovlen as c_int;
        // SAFETY: recvmsg(2) contract.
        let mut tmp = vec![0u8; unsafe { iov_len(m.msg_iov, cnt) }?];
        let n = s.read(fd, &mut tmp, flags)?;
        // SAFETY: recvmsg(2) contract.
        unsafe { scatter(m.msg_iov, cnt, &tmp[..n as usize]) }?;
        m.msg_flags = 0;
        match s.call(|b| b.inq(fd)) {
            // SAFETY: recvmsg(2) contract: msg_control has msg_controllen bytes.
            Some(inq) => unsafe {
                put_cmsg(
                    m,
                    libc::IPPROTO_TCP,
                    crate::backend::TCP_INQ,
                    &inq.to_ne_bytes(),
                )
            }?,
            None => m.msg_controllen = 0,
        }
        Ok(n)
    }) as ssize_t
}

/// A `MSG_ZEROCOPY` completion as Linux reports it: one `IP_RECVERR` (or
/// `IPV6_RECVERR`) cmsg holding a `sock_extended_err` with origin
/// `SO_EE_ORIGIN_ZEROCOPY`, code `SO_EE_CODE_ZEROCOPY_COPIED` and the id range in
/// `ee_info..=ee_data`, followed by the offender address (none: zeros, the size of
/// a `sockaddr_in` or `sockaddr_in6`); `msg_flags` is `MSG_ERRQUEUE`.
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` writable bytes.
unsafe fn put_zerocopy_cmsg(m: &mut msghdr, lo: u32, hi: u32, v6: bool) -> Res<()> {
    let (level, ty, ee) = usnet_posix::cmsg::zerocopy_completion(lo, hi, v6);
    m.msg_flags = libc::MSG_ERRQUEUE;
    // SAFETY: per this function's contract.
    unsafe { put_cmsg(m, level, ty, &ee) }
}

/// A transmit timestamp as Linux reports it on TCP (`usnet_posix::cmsg::tx_timestamp`,
/// the time `wall_us` µs of `gettimeofday` time). `msg_flags`: `MSG_ERRQUEUE`, and
/// `MSG_TRUNC` for the packet that came with it (none with `OPT_TSONLY`), which
/// this call does not copy.
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` writable bytes.
unsafe fn put_timestamp_cmsgs(
    m: &mut msghdr,
    s: &crate::backend::Stamp,
    wall_us: Option<i64>,
    v6: bool,
) -> Res<()> {
    let (ts, (level, ty, ee)) =
        usnet_posix::cmsg::tx_timestamp(s.info, s.key, wall_us.map(|us| us * 1000), v6);
    m.msg_flags = libc::MSG_ERRQUEUE | if s.tsonly { 0 } else { libc::MSG_TRUNC };
    // SAFETY: per this function's contract.
    unsafe {
        put_cmsgs(
            m,
            &[
                (libc::SOL_SOCKET, libc::SO_TIMESTAMPING, &ts),
                (level, ty, &ee),
            ],
        )
    }
}

/// Writes one cmsg into `m.msg_control` (`MSG_CTRUNC` when it does not fit).
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` writable bytes.
unsafe fn put_cmsg(m: &mut msghdr, level: c_int, ty: c_int, data: &[u8]) -> Res<()> {
    // SAFETY: per this function's contract.
    unsafe { put_cmsgs(m, &[(level, ty, data)]) }
}

/// Writes cmsgs one after another into `m.msg_control` (`MSG_CTRUNC` and none
/// when they do not all fit).
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` writable bytes.
unsafe fn put_cmsgs(m: &mut msghdr, cmsgs: &[(c_int, c_int, &[u8])]) -> Res<()> {
    // SAFETY: per this function's contract.
    unsafe { usnet_posix::cmsg::put(m, cmsgs) }.map_err(|e| e.0)
}

unsafe extern "C" fn pd_write(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: write(2) contract.
    with(ud, |s| s.write(fd, unsafe { slice(buf, n) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_send(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: send(2) contract.
    with(ud, |s| s.write(fd, unsafe { slice(buf, n) }?, flags)) as ssize_t
}

unsafe extern "C" fn pd_sendto(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> ssize_t {
    with(ud, |s| {
        // SAFETY: sendto(2) contract (the address matters only for MSG_FASTOPEN).
        let to = unsafe { send_addr(a, l, flags) }?;
        // SAFETY: sendto(2) contract.
        s.send_to(fd, unsafe { slice(buf, n) }?, flags, to)
    }) as ssize_t
}

/// The address of a `sendto`/`sendmsg`: None when absent or not needed (a TCP socket
/// ignores it unless `MSG_FASTOPEN` connects); `AF_UNSPEC` with `MSG_FASTOPEN` is
/// `EOPNOTSUPP`, as Linux.
///
/// # Safety
/// `a` is null or points to `l` readable bytes.
unsafe fn send_addr(a: *const sockaddr, l: socklen_t, flags: c_int) -> Res<Option<SocketAddr>> {
    if flags & libc::MSG_FASTOPEN == 0 || a.is_null() || l == 0 {
        return Ok(None);
    }
    // SAFETY: non-null with `l` bytes, per the caller.
    if unsafe { (*a).sa_family } as c_int == libc::AF_UNSPEC {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: as above.
    unsafe { read_sockaddr(a, l) }.map(Some)
}

unsafe extern "C" fn pd_writev(
    ud: *mut c_void,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
) -> ssize_t {
    // SAFETY: writev(2) contract.
    with(ud, |s| s.write(fd, &unsafe { gather(iov, cnt) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_sendmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *const msghdr,
    flags: c_int,
) -> ssize_t {
    with(ud, |s| {
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: sendmsg(2) contract.
        let m = unsafe { &*m };
        // SAFETY: sendmsg(2) contract.
        let data = unsafe { gather(m.msg_iov, m.msg_iovlen as c_int) }?;
        // SAFETY: sendmsg(2) contract.
        let to = unsafe { send_addr(m.msg_name as *const sockaddr, m.msg_namelen, flags) }?;
        let breaks = if flags & libc::MSG_ZEROCOPY != 0 && !m.msg_iov.is_null() {
            let pieces: Vec<(usize, usize)> = (0..(m.msg_iovlen as c_int).max(0) as usize)
                // SAFETY: sendmsg(2) contract (gather checked the entries).
                .map(|i| unsafe { &*m.msg_iov.add(i) })
                .map(|e| (e.iov_base as usize, e.iov_len))
                .collect();
            crate::backend::zerocopy_frag_breaks(&pieces)
        } else {
            Vec::new()
        };
        s.send_to_frags(fd, &data, flags, to, &breaks)
    }) as ssize_t
}

unsafe extern "C" fn pd_fcntl(ud: *mut c_void, fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    with(ud, |s| s.call(|b| b.fcntl(fd, cmd, arg as c_int))) as c_int
}

unsafe extern "C" fn pd_ioctl(ud: *mut c_void, fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        match req {
            libc::FIONREAD => {
                let n = g.readable_bytes(fd)?;
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONREAD's argument is an int*.
                unsafe { *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int };
                Ok(0)
            }
            libc::FIONBIO => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONBIO's argument is an int*.
                let on = unsafe { *(arg as *const c_int) } != 0;
                g.set_nonblocking(fd, on)?;
                Ok(0)
            }
            _ => Err(libc::ENOTTY),
        }
    }) as c_int
}

unsafe extern "C" fn pd_close(ud: *mut c_void, fd: c_int) -> c_int {
    with(ud, |s| s.close(fd)) as c_int
}

unsafe extern "C" fn pd_shutdown(ud: *mut c_void, fd: c_int, how: c_int) -> c_int {
    with(ud, |s| s.call(|b| b.shutdown(fd, how)).map(|_| 0)) as c_int
}

unsafe extern "C" fn pd_getsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    l: *mut socklen_t,
) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        if let Some(bytes) = g.getsockopt_struct(fd, level, name) {
            let bytes = bytes?;
            if v.is_null() || l.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: getsockopt(2) contract: `v` has `*l` writable bytes; we write at
            // most that many and store the length written.
            unsafe {
                let n = (*l as usize).min(bytes.len());
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), v as *mut u8, n);
                *l = n as socklen_t;
            }
            return Ok(0);
        }
        let x = g.getsockopt(fd, level, name)?;
        // SAFETY: getsockopt(2) contract.
        unsafe { put_int(v, l, x) }
    }) as c_int
}

unsafe extern "C" fn pd_setsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        let value = if v.is_null() {
            None
        } else {
            // SAFETY: setsockopt(2) contract: `v` has `l` readable bytes.
            Some(unsafe { slice(v, l as size_t) }?)
        };
        s.call(|b| b.setsockopt(fd, level, name, value)).map(|_| 0)
    }) as c_int
}

unsafe extern "C" fn pd_poll(
    ud: *mut c_void,
    fds: *mut pollfd,
    n: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    with(ud, |s| {
        if n > 0 && fds.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: poll(2) contract.
        let fds = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        s.poll(fds, timeout)
    }) as c_int
}

unsafe extern "C" fn pd_netdev_send(ud: *mut c_void, buf: *const c_void, n: size_t) -> c_int {
    with(ud, |s| {
        // SAFETY: packetdrill passes `n` bytes of packet.
        let p = unsafe { slice(buf, n) }?;
        s.netdev_send(p)
    }) as c_int
}

unsafe extern "C" fn pd_netdev_receive(
    ud: *mut c_void,
    buf: *mut c_void,
    count: *mut size_t,
    time_us: *mut c_longlong,
) -> c_int {
    with(ud, |s| {
        if count.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `*count` is the buffer size (packetdrill.h).
        let room = unsafe { *count };
        // SAFETY: `buf` has `room` bytes.
        let out = unsafe { slice_mut(buf, room) }?;
        match s.netdev_receive(out) {
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
    }) as c_int
}

unsafe extern "C" fn pd_usleep(ud: *mut c_void, us: libc::useconds_t) -> c_int {
    with(ud, |s| {
        s.usleep(us as u64);
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_gettimeofday(ud: *mut c_void, tv: *mut timeval, _tz: *mut c_void) -> c_int {
    with(ud, |s| {
        let us = s.gettimeofday();
        if !tv.is_null() {
            // SAFETY: gettimeofday(2) contract.
            unsafe {
                (*tv).tv_sec = us.div_euclid(1_000_000) as libc::time_t;
                (*tv).tv_usec = us.rem_euclid(1_000_000) as libc::suseconds_t;
            }
        }
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_epoll_create(ud: *mut c_void, size: c_int) -> c_int {
    with(ud, |s| {
        if size <= 0 {
            return Err(libc::EINVAL);
        }
        s.call(|b| b.epoll_create())
    }) as c_int
}

unsafe extern "C" fn pd_epoll_ctl(
    ud: *mut c_void,
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    with(ud, |s| {
        // SAFETY: epoll_ctl(2) contract: `ev` is null or points to an epoll_event.
        let e = (!ev.is_null()).then(|| unsafe {
            let e = std::ptr::read_unaligned(ev);
            (e.events, e.u64)
        });
        s.call(|b| b.epoll_ctl(epfd, op, fd, e))
    }) as c_int
}

unsafe extern "C" fn pd_epoll_wait(
    ud: *mut c_void,
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    with(ud, |s| {
        if ev.is_null() || max <= 0 {
            return Err(libc::EINVAL);
        }
        let got = s.epoll_wait(epfd, max as usize, timeout)?;
        for (i, (events, data)) in got.iter().enumerate() {
            // SAFETY: epoll_wait(2) contract: `ev` has room for `max` entries.
            unsafe {
                std::ptr::write_unaligned(
                    ev.add(i),
                    libc::epoll_event {
                        events: *events,
                        u64: *data,
                    },
                )
            };
        }
        Ok(got.len() as c_int)
    }) as c_int
}

unsafe extern "C" fn pd_pipe(ud: *mut c_void, fds: *mut c_int) -> c_int {
    with(ud, |s| {
        if fds.is_null() {
            return Err(libc::EFAULT);
        }
        let p = s.call(|b| b.pipe())?;
        // SAFETY: pipe(2) contract: `fds` points to two ints.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), fds, 2) };
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_splice(
    ud: *mut c_void,
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // packetdrill passes pointers to the script's offset arguments, which are
    // themselves the pointers its `splice(2)` would get: a script's NULL arrives as
    // a pointer to 0.
    // SAFETY: null or pointers to packetdrill's loff_t values.
    let given = |p: *mut libc::loff_t| !p.is_null() && unsafe { *p } != 0;
    let offsets = given(off_in) || given(off_out);
    with(ud, |s| s.splice(fd_in, fd_out, offsets, n, flags)) as ssize_t
}

/// packetdrill's entry point: fills `ifc` (every member, so no call hits a null
/// pointer). On a bad `flags` string it prints why and leaves `userdata` null, so every
/// call then fails with `EBADF`.
///
/// # Safety
/// `ifc` must point to a writable `struct packetdrill_interface`; `flags` is null or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn packetdrill_interface_init(
    flags: *const c_char,
    ifc: *mut PacketdrillInterface,
) {
    if ifc.is_null() {
        return;
    }
    let flags = if flags.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string from packetdrill's command line.
        unsafe { CStr::from_ptr(flags) }
            .to_string_lossy()
            .into_owned()
    };
    if let Ok(o) = Options::parse(&flags) {
        if o.posix {
            // SAFETY: checked non-null; the caller owns a struct of this layout.
            crate::posix::init(&o, unsafe { &mut *ifc });
            return;
        }
    }
    let made = catch_unwind(|| {
        let o = Options::parse(&flags)?;
        Backend::new(&o).map(|b| (b, o.trap))
    });
    let userdata = match made {
        Ok(Ok((b, trap))) => {
            let shared = Arc::new(Shared::new(b));
            if trap {
                match crate::trap::install(Arc::clone(&shared)) {
                    Ok(t) => {
                        if let Ok(mut slot) = shared.trap.lock() {
                            *slot = Some(t);
                        }
                    }
                    Err(e) => eprintln!(
                        "usnet-packetdrill: packetdrill's own getsockopt(TCP_INFO) will not \
                         see usnet's values: {e}"
                    ),
                }
            }
            Arc::into_raw(shared) as *mut c_void
        }
        Ok(Err(e)) => {
            eprintln!("usnet-packetdrill: {e}");
            std::ptr::null_mut()
        }
        Err(_) => std::ptr::null_mut(),
    };
    let v = PacketdrillInterface {
        userdata,
        free: Some(pd_free),
        socket: Some(pd_socket),
        bind: Some(pd_bind),
        listen: Some(pd_listen),
        accept: Some(pd_accept),
        connect: Some(pd_connect),
        read: Some(pd_read),
        readv: Some(pd_readv),
        recv: Some(pd_recv),
        recvfrom: Some(pd_recvfrom),
        recvmsg: Some(pd_recvmsg),
        write: Some(pd_write),
        writev: Some(pd_writev),
        send: Some(pd_send),
        sendto: Some(pd_sendto),
        sendmsg: Some(pd_sendmsg),
        fcntl: Some(pd_fcntl),
        ioctl: Some(pd_ioctl),
        close: Some(pd_close),
        shutdown: Some(pd_shutdown),
        getsockopt: Some(pd_getsockopt),
        setsockopt: Some(pd_setsockopt),
        poll: Some(pd_poll),
        netdev_send: Some(pd_netdev_send),
        netdev_receive: Some(pd_netdev_receive),
        usleep: Some(pd_usleep),
        gettimeofday: Some(pd_gettimeofday),
        epoll_create: Some(pd_epoll_create),
        epoll_ctl: Some(pd_epoll_ctl),
        epoll_wait: Some(pd_epoll_wait),
        pipe: Some(pd_pipe),
        splice: Some(pd_splice),
    };
    // SAFETY: checked non-null; the caller owns a struct of this layout.
    unsafe { std::ptr::write(ifc, v) };
}

/// The packetdrill.h member count this library fills (checked by the C driver test
/// against `sizeof(struct packetdrill_interface)`).
#[no_mangle]
pub extern "C" fn usnet_packetdrill_interface_size() -> size_t {
    std::mem::size_of::<PacketdrillInterface>()
}
