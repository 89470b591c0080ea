//! Section "sockets": `usnet_socket`, `usnet_connect`, ... over `usnet-posix`, with the
//! kernel's argument types and errno semantics (`-1` and `errno` on failure). The
//! descriptors are real kernel numbers reserved for usnet sockets; pass them only to
//! `usnet_*` calls (a plain `read`/`write` on one reaches an unconnected kernel socket).

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::raw::{c_char, c_int, c_void};

use usnet_posix::{addr, Errno};

use crate::guard;

fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e.0 };
}

/// `Ok(v)` → `v`; `Err(e)` → `-1` with `errno = e`.
fn ret<T: TryInto<isize>>(r: Result<T, Errno>) -> isize {
    match r {
        Ok(v) => v.try_into().unwrap_or(isize::MAX),
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Linux looks the descriptor up before it reads an argument: a call on a
/// descriptor that is not a socket here fails with `EBADF` whatever else is wrong
/// (checked only on the way out of a failure, so a success costs nothing).
fn fd_first<T>(fd: c_int, r: Result<T, Errno>) -> Result<T, Errno> {
    match r {
        Err(_) if !usnet_posix::is_usnet(fd) => Err(Errno(libc::EBADF)),
        r => r,
    }
}

fn ret_int<T: TryInto<isize>>(r: Result<T, Errno>) -> c_int {
    ret(r) as c_int
}

unsafe fn sockaddr_in(a: *const libc::sockaddr, len: libc::socklen_t) -> Result<SocketAddr, Errno> {
    // SAFETY: per the calling function's contract.
    unsafe { addr::from_raw(a, len) }
}

unsafe fn sockaddr_out(
    a: SocketAddr,
    out: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> Result<(), Errno> {
    // SAFETY: per the calling function's contract.
    unsafe { addr::to_raw(a, out, len) }
}

unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller vouches for `len` readable bytes at `buf`.
    Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, len) })
}

unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller vouches for `len` writable bytes at `buf`.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) })
}

/// Attaches this process to the stack server `stack` (NULL: `USNET_STACK`, or the only
/// one running). Optional: the first socket call attaches by itself.
///
/// # Safety
/// `stack` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn usnet_attach(stack: *const c_char) -> c_int {
    guard(-1, || {
        let name = if stack.is_null() {
            None
        } else {
            // SAFETY: per the contract.
            match unsafe { CStr::from_ptr(stack) }.to_str() {
                Ok(s) => Some(s),
                Err(_) => return ret_int::<i32>(Err(Errno(libc::EINVAL))),
            }
        };
        ret_int(usnet_posix::attach(name).map(|()| 0))
    })
}

/// Whether `fd` is a usnet socket (or usnet epoll set) of this process.
#[no_mangle]
pub extern "C" fn usnet_is_socket(fd: c_int) -> c_int {
    usnet_posix::is_usnet(fd) as c_int
}

#[no_mangle]
pub extern "C" fn usnet_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::socket(domain, ty, protocol)))
}

/// # Safety
/// `a` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_bind(
    fd: c_int,
    a: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        ret_int(fd_first(
            fd,
            unsafe { sockaddr_in(a, len) }
                .and_then(|a| usnet_posix::bind(fd, a))
                .map(|()| 0),
        ))
    })
}

#[no_mangle]
pub extern "C" fn usnet_listen(fd: c_int, backlog: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::listen(fd, backlog).map(|()| 0)))
}

/// # Safety
/// `a`/`len` are NULL or valid for the peer's address (`*len` bytes at `a`).
#[no_mangle]
pub unsafe extern "C" fn usnet_accept4(
    fd: c_int,
    a: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    guard(-1, || {
        ret_int(fd_first(
            fd,
            usnet_posix::accept4(fd, flags).and_then(|(nfd, peer)| {
                // SAFETY: per the contract.
                unsafe { sockaddr_out(peer, a, len) }?;
                Ok(nfd)
            }),
        ))
    })
}

/// # Safety
/// As [`usnet_accept4`].
#[no_mangle]
pub unsafe extern "C" fn usnet_accept(
    fd: c_int,
    a: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { usnet_accept4(fd, a, len, 0) }
}

/// # Safety
/// `a` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_connect(
    fd: c_int,
    a: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        if unsafe { addr::is_unspec(a, len) } {
            return ret_int(fd_first(fd, usnet_posix::disconnect(fd).map(|()| 0)));
        }
        // SAFETY: per the contract.
        ret_int(fd_first(
            fd,
            unsafe { sockaddr_in(a, len) }
                .and_then(|a| usnet_posix::connect(fd, a))
                .map(|()| 0),
        ))
    })
}

/// # Safety
/// `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_send(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        ret(fd_first(
            fd,
            unsafe { bytes(buf, len) }.and_then(|b| usnet_posix::sendto(fd, b, flags, None)),
        ))
    })
}

/// # Safety
/// `buf` points to `len` readable bytes; `a` is NULL or points to `alen` bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    a: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                // SAFETY: per the contract.
                let b = unsafe { bytes(buf, len) }?;
                // The family is read only when `alen` covers it (a shorter address is
                // EINVAL below, from `sockaddr_in`).
                let has_family = alen as usize >= std::mem::size_of::<libc::sa_family_t>();
                // SAFETY: non-null, with `alen` readable bytes per the contract, which
                // cover the family; read unaligned as the caller's buffer may be.
                if !a.is_null()
                    && has_family
                    && unsafe { std::ptr::read_unaligned(std::ptr::addr_of!((*a).sa_family)) }
                        == libc::AF_UNSPEC as u16
                {
                    // Linux's answer to a Fast Open "connect" to no address.
                    if flags & libc::MSG_FASTOPEN != 0 {
                        return Err(Errno(libc::EOPNOTSUPP));
                    }
                }
                let to = if a.is_null() {
                    None
                } else {
                    // SAFETY: per the contract.
                    Some(unsafe { sockaddr_in(a, alen) }?)
                };
                usnet_posix::sendto(fd, b, flags, to)
            })(),
        ))
    })
}

/// # Safety
/// `buf` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_write(fd: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: same contract.
    unsafe { usnet_send(fd, buf, len, 0) }
}

/// # Safety
/// `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_recv(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        ret(fd_first(fd, {
            // `recv(fd, NULL, n, MSG_TRUNC)` on a stream throws n bytes away.
            let mut scratch = Vec::new();
            let b = if buf.is_null() && flags & libc::MSG_TRUNC != 0 {
                scratch.resize(len.min(1 << 20), 0);
                Ok(&mut scratch[..])
            } else {
                unsafe { bytes_mut(buf, len) }
            };
            b.and_then(|b| usnet_posix::recvfrom(fd, b, flags).map(|(n, _)| n))
        }))
    })
}

/// # Safety
/// `buf` points to `len` writable bytes; `a`/`alen` are NULL or valid for the sender.
#[no_mangle]
pub unsafe extern "C" fn usnet_recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    a: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                // SAFETY: per the contract.
                let b = unsafe { bytes_mut(buf, len) }?;
                let (n, from) = usnet_posix::recvfrom(fd, b, flags)?;
                match from {
                    // SAFETY: per the contract.
                    Some(f) => unsafe { sockaddr_out(f, a, alen) }?,
                    // As Linux: the length is written back only with an address
                    // buffer (0: a stream has no sender address).
                    None => {
                        if !a.is_null() && !alen.is_null() {
                            // SAFETY: per the contract.
                            unsafe { *alen = 0 };
                        }
                    }
                }
                Ok(n)
            })(),
        ))
    })
}

/// # Safety
/// `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_read(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: same contract.
    unsafe { usnet_recv(fd, buf, len, 0) }
}

unsafe fn iov_slices<'a>(iov: *const libc::iovec, n: c_int) -> Result<Vec<&'a mut [u8]>, Errno> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: per the caller's contract.
    unsafe { iov_pieces(iov, n as usize) }
}

/// A `msghdr`'s pieces: more than `UIO_MAXIOV` is `EMSGSIZE` for sendmsg and
/// recvmsg (where readv and writev say `EINVAL`), and the count is a `size_t`.
unsafe fn msg_iov_slices<'a>(m: &libc::msghdr) -> Result<Vec<&'a mut [u8]>, Errno> {
    if m.msg_iovlen > libc::UIO_MAXIOV as usize {
        return Err(Errno(libc::EMSGSIZE));
    }
    // SAFETY: per the caller's contract.
    unsafe { iov_pieces(m.msg_iov, m.msg_iovlen) }
}

unsafe fn iov_pieces<'a>(iov: *const libc::iovec, n: usize) -> Result<Vec<&'a mut [u8]>, Errno> {
    if n > 0 && iov.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller vouches for `n` iovecs, each valid for its length.
        let io = unsafe { &*iov.add(i) };
        v.push(unsafe { bytes_mut(io.iov_base, io.iov_len) }?);
    }
    Ok(v)
}

/// # Safety
/// `iov` points to `n` iovecs, each valid for reads of its length.
#[no_mangle]
pub unsafe extern "C" fn usnet_writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                // SAFETY: per the contract (only read through).
                let v = unsafe { iov_slices(iov, n) }?;
                let r: Vec<&[u8]> = v.iter().map(|s| &**s).collect();
                usnet_posix::writev(fd, &r, 0)
            })(),
        ))
    })
}

/// # Safety
/// `iov` points to `n` iovecs, each valid for writes of its length.
#[no_mangle]
pub unsafe extern "C" fn usnet_readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                // SAFETY: per the contract.
                let mut v = unsafe { iov_slices(iov, n) }?;
                usnet_posix::readv(fd, &mut v, 0)
            })(),
        ))
    })
}

/// `sendmsg`: the iovecs, to `msg_name` if given (datagrams). Control messages: a
/// datagram's source address (`IP_PKTINFO`'s `ipi_spec_dst`, `IPV6_PKTINFO`'s
/// address), `IP_TTL`, `IP_TOS`, `IPV6_HOPLIMIT`, `IPV6_TCLASS`; others are
/// EOPNOTSUPP.
///
/// # Safety
/// `msg` points to a valid msghdr whose pointers are valid as for `sendmsg(2)`.
#[no_mangle]
pub unsafe extern "C" fn usnet_sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                if msg.is_null() {
                    return Err(Errno(libc::EFAULT));
                }
                // SAFETY: per the contract.
                let m = unsafe { &*msg };
                // SAFETY: per the contract: msg_control has msg_controllen bytes.
                let ctl = unsafe { usnet_posix::cmsg::send_control(m) }?;
                // SAFETY: per the contract.
                let v = unsafe { msg_iov_slices(m) }?;
                let to = if m.msg_name.is_null() {
                    None
                } else {
                    // SAFETY: per the contract.
                    Some(unsafe {
                        sockaddr_in(m.msg_name as *const libc::sockaddr, m.msg_namelen)
                    }?)
                };
                let r: Vec<&[u8]> = v.iter().map(|s| &**s).collect();
                if ctl == usnet_posix::cmsg::SendControl::default() {
                    usnet_posix::sendmsg(fd, &r, flags, to)
                } else {
                    usnet_posix::sendmsg_with(fd, &r, flags, to, &ctl)
                }
            })(),
        ))
    })
}

/// Copies `data` into the pieces in order, as far as they hold it.
fn scatter(pieces: &mut [&mut [u8]], data: &[u8]) {
    let mut off = 0;
    for s in pieces.iter_mut() {
        let k = s.len().min(data.len() - off);
        s[..k].copy_from_slice(&data[off..off + k]);
        off += k;
    }
}

/// A received datagram (or error-queue report) `d`, its bytes at the start of
/// `data`, into the caller's message: the bytes into the pieces `v`, its name,
/// its control messages (in the `room` bytes the caller gave), `MSG_TRUNC` when it
/// was longer than the pieces. Returns what `recvmsg` returns: its length, or
/// its whole length with `MSG_TRUNC` in `flags`.
///
/// # Safety
/// `m`'s `msg_name` and `msg_control` are valid as for `recvmsg(2)`, the latter
/// for `room` bytes.
unsafe fn put_dgram(
    m: &mut libc::msghdr,
    v: &mut [&mut [u8]],
    data: &[u8],
    d: &usnet_posix::DgramMsg,
    room: usize,
    flags: c_int,
) -> Result<usize, Errno> {
    scatter(v, &data[..d.len]);
    if d.whole > d.len {
        m.msg_flags |= libc::MSG_TRUNC;
    }
    if !m.msg_name.is_null() {
        // SAFETY: per the contract.
        unsafe {
            sockaddr_out(
                d.from,
                m.msg_name as *mut libc::sockaddr,
                &mut m.msg_namelen,
            )
        }?;
    }
    if !d.control.is_empty() {
        m.msg_controllen = room;
        let cm: Vec<(i32, i32, &[u8])> =
            d.control.iter().map(|(l, t, b)| (*l, *t, &b[..])).collect();
        // SAFETY: per the contract: msg_control has `room` bytes.
        unsafe { usnet_posix::cmsg::put(m, &cm) }?;
    }
    Ok(if flags & libc::MSG_TRUNC != 0 {
        d.whole
    } else {
        d.len
    })
}

/// `recvmsg`: into the iovecs, the sender into `msg_name` (datagrams); control
/// messages: a datagram's `IP_PKTINFO`, `IP_TTL`, `IP_TOS`, `IPV6_PKTINFO`,
/// `IPV6_HOPLIMIT`, `IPV6_TCLASS` as its socket's options ask, a stream's
/// `TCP_CM_INQ`, the error queue's reports.
///
/// # Safety
/// `msg` points to a valid msghdr whose pointers are valid as for `recvmsg(2)`.
#[no_mangle]
pub unsafe extern "C" fn usnet_recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    guard(-1, || {
        ret(fd_first(
            fd,
            (|| {
                if msg.is_null() {
                    return Err(Errno(libc::EFAULT));
                }
                // SAFETY: per the contract.
                let m = unsafe { &mut *msg };
                // As Linux, a successful call writes `msg_namelen` back only when
                // there is a `msg_name` (0 where no address is given: a stream, the
                // error queue's zero-copy and timestamp reports); without one it is
                // left as the caller set it.
                if flags & libc::MSG_ERRQUEUE != 0 {
                    // A datagram socket's ICMP error reports (IP_RECVERR).
                    // SAFETY: per the contract.
                    let mut v = unsafe { msg_iov_slices(m) }?;
                    let cap: usize = v.iter().map(|s| s.len()).sum();
                    let mut tmp = vec![0u8; cap];
                    if let Some(d) = usnet_posix::recvmsg_errqueue(fd, &mut tmp)? {
                        m.msg_flags = libc::MSG_ERRQUEUE;
                        let room = m.msg_controllen;
                        // SAFETY: per the contract.
                        return unsafe { put_dgram(m, &mut v, &tmp, &d, room, flags) };
                    }
                    // Zero-copy completions and transmit timestamps (`usnet_posix`).
                    let report = usnet_posix::error_queue(fd)?;
                    if !m.msg_name.is_null() {
                        m.msg_namelen = 0;
                    }
                    let mut dom = [0u8; 4];
                    usnet_posix::getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, &mut dom)?;
                    let v6 = i32::from_ne_bytes(dom) == libc::AF_INET6;
                    match report {
                        usnet_posix::ErrReport::ZeroCopy { lo, hi } => {
                            let (level, ty, ee) =
                                usnet_posix::cmsg::zerocopy_completion(lo, hi, v6);
                            m.msg_flags = libc::MSG_ERRQUEUE;
                            // SAFETY: per the contract: msg_control has msg_controllen bytes.
                            unsafe { usnet_posix::cmsg::put(m, &[(level, ty, &ee)]) }?;
                        }
                        usnet_posix::ErrReport::Timestamp(t) => {
                            let (ts, (level, ty, ee)) =
                                usnet_posix::cmsg::tx_timestamp(t.info, t.key, t.wall_ns, v6);
                            // The packet that came with it (none with OPT_TSONLY) is
                            // not copied: MSG_TRUNC, as Linux says for a short buffer.
                            m.msg_flags =
                                libc::MSG_ERRQUEUE | if t.tsonly { 0 } else { libc::MSG_TRUNC };
                            // SAFETY: per the contract: msg_control has msg_controllen bytes.
                            unsafe {
                                usnet_posix::cmsg::put(
                                    m,
                                    &[
                                        (libc::SOL_SOCKET, libc::SO_TIMESTAMPING, &ts),
                                        (level, ty, &ee),
                                    ],
                                )
                            }?;
                        }
                    }
                    return Ok(0);
                }
                // The room for control messages (none is written but TCP_CM_INQ).
                let control = m.msg_controllen;
                m.msg_controllen = 0;
                m.msg_flags = 0;
                // SAFETY: per the contract.
                let mut v = unsafe { msg_iov_slices(m) }?;
                let dgram = {
                    let mut ty = [0u8; 4];
                    usnet_posix::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, &mut ty)?;
                    matches!(i32::from_ne_bytes(ty), libc::SOCK_DGRAM | libc::SOCK_RAW)
                };
                if dgram {
                    let cap: usize = v.iter().map(|s| s.len()).sum();
                    let mut tmp = vec![0u8; cap.max(1)];
                    // The whole length too: a longer datagram is MSG_TRUNC in msg_flags.
                    let d = usnet_posix::recvmsg_dgram(fd, &mut tmp[..cap], flags)?;
                    // SAFETY: per the contract.
                    return unsafe { put_dgram(m, &mut v, &tmp, &d, control, flags) };
                }
                let n = usnet_posix::readv(fd, &mut v, flags)?;
                if !m.msg_name.is_null() {
                    m.msg_namelen = 0;
                }
                if let Some(left) = usnet_posix::inq(fd)? {
                    m.msg_controllen = control;
                    let cm = [(
                        libc::SOL_TCP,
                        usnet_posix::sockopt::TCP_INQ,
                        &left.to_ne_bytes()[..],
                    )];
                    // SAFETY: per the contract: msg_control has msg_controllen bytes.
                    unsafe { usnet_posix::cmsg::put(m, &cm) }?;
                }
                Ok(n)
            })(),
        ))
    })
}

#[no_mangle]
pub extern "C" fn usnet_shutdown(fd: c_int, how: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::shutdown(fd, how).map(|()| 0)))
}

#[no_mangle]
pub extern "C" fn usnet_close(fd: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::close(fd).map(|()| 0)))
}

/// `dup`: a new number for the same socket (closed when its last number is).
#[no_mangle]
pub extern "C" fn usnet_dup(fd: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::dup(fd)))
}

/// `sendfile`: up to `count` bytes of the file `in_fd` (at `*off`, which then
/// moves, or from the file's position) go straight into the socket's send ring.
///
/// # Safety
/// `off` is NULL or points to a writable `off_t`.
#[no_mangle]
pub unsafe extern "C" fn usnet_sendfile(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut libc::off_t,
    count: usize,
) -> isize {
    guard(-1, || {
        if in_fd < 0 {
            return ret::<usize>(Err(Errno(libc::EBADF)));
        }
        // SAFETY: the caller's descriptor, borrowed for this call only.
        let file = unsafe { std::os::fd::BorrowedFd::borrow_raw(in_fd) };
        // SAFETY: per the contract.
        let off = unsafe { off.as_mut() };
        ret(usnet_posix::sendfile(out_fd, file, off, count))
    })
}

/// `splice` between a usnet stream and a pipe (`usnet_posix::splice`); an offset
/// (`off_in`/`off_out` not NULL) is `ESPIPE`, as for any socket or pipe.
#[no_mangle]
pub extern "C" fn usnet_splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: usize,
    flags: std::ffi::c_uint,
) -> isize {
    let offsets = !off_in.is_null() || !off_out.is_null();
    guard(-1, || {
        ret(usnet_posix::splice(fd_in, fd_out, offsets, len, flags))
    })
}

/// `dup2`: `new` names `old`'s socket (what `new` was is closed first).
#[no_mangle]
pub extern "C" fn usnet_dup2(old: c_int, new: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::dup2(old, new)))
}

/// `dup3`: [`usnet_dup2`] with `O_CLOEXEC` in `flags`; `old == new` is `EINVAL`.
#[no_mangle]
pub extern "C" fn usnet_dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::dup3(old, new, flags)))
}

/// # Safety
/// `v` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    guard(-1, || {
        ret_int(fd_first(
            fd,
            // SAFETY: per the contract.
            unsafe { bytes(v, len as usize) }
                .and_then(|b| usnet_posix::setsockopt(fd, level, name, b))
                .map(|()| 0),
        ))
    })
}

/// # Safety
/// `v` points to `*len` writable bytes; `len` is valid.
#[no_mangle]
pub unsafe extern "C" fn usnet_getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    guard(-1, || {
        ret_int(fd_first(
            fd,
            (|| {
                if len.is_null() {
                    return Err(Errno(libc::EFAULT));
                }
                // SAFETY: per the contract.
                let cap = unsafe { *len } as usize;
                let out = unsafe { bytes_mut(v, cap) }?;
                let n = usnet_posix::getsockopt(fd, level, name, out)?;
                // SAFETY: per the contract.
                unsafe { *len = n as libc::socklen_t };
                Ok(0)
            })(),
        ))
    })
}

/// # Safety
/// `a`/`len` valid as for `getsockname(2)`.
#[no_mangle]
pub unsafe extern "C" fn usnet_getsockname(
    fd: c_int,
    a: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard(-1, || {
        ret_int(fd_first(
            fd,
            usnet_posix::getsockname(fd).and_then(|x| {
                if a.is_null() || len.is_null() {
                    return Err(Errno(libc::EFAULT));
                }
                // SAFETY: per the contract.
                unsafe { sockaddr_out(x, a, len) }.map(|()| 0)
            }),
        ))
    })
}

/// # Safety
/// `a`/`len` valid as for `getpeername(2)`.
#[no_mangle]
pub unsafe extern "C" fn usnet_getpeername(
    fd: c_int,
    a: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard(-1, || {
        ret_int(fd_first(
            fd,
            usnet_posix::getpeername(fd).and_then(|x| {
                if a.is_null() || len.is_null() {
                    return Err(Errno(libc::EFAULT));
                }
                // SAFETY: per the contract.
                unsafe { sockaddr_out(x, a, len) }.map(|()| 0)
            }),
        ))
    })
}

/// `fcntl` with an integer argument: F_GETFL, F_SETFL (O_NONBLOCK, O_ASYNC), F_GETFD,
/// F_SETFD, F_DUPFD, F_DUPFD_CLOEXEC, F_GETOWN, F_SETOWN, F_GETSIG, F_SETSIG.
#[no_mangle]
pub extern "C" fn usnet_fcntl(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    guard(-1, || ret_int(usnet_posix::fcntl(fd, cmd, arg)))
}

/// `ioctl` FIONBIO (`*arg` the new mode), FIONREAD (`*arg` set to the bytes
/// readable), SIOCATMARK (`*arg` set to 1 at the urgent mark), FIOASYNC (`*arg`
/// the new `O_ASYNC`), FIOSETOWN and SIOCSPGRP (`*arg` the owner, as `F_SETOWN`),
/// FIOGETOWN and SIOCGPGRP (`*arg` set to it), and the
/// interface queries (`usnet_posix::INTERFACE_QUERIES`: `arg` an `ifreq` or an
/// `ifconf`), which the kernel answers.
///
/// # Safety
/// `arg` points to what the request takes: a readable and writable int, or the
/// query's `ifreq` or `ifconf`.
#[no_mangle]
pub unsafe extern "C" fn usnet_ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int {
    guard(-1, || {
        ret_int((|| {
            if arg.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            if usnet_posix::INTERFACE_QUERIES.contains(&req) {
                // SAFETY: per the contract.
                return unsafe { usnet_posix::interface_query(fd, req, arg) };
            }
            let arg = arg.cast::<c_int>();
            // SAFETY: per the contract.
            let v = unsafe { *arg };
            let r = usnet_posix::ioctl_int(fd, req, v)?;
            use usnet_posix::sigio::{FIOGETOWN, SIOCGPGRP};
            if [
                libc::FIONREAD,
                usnet_posix::SIOCATMARK,
                FIOGETOWN,
                SIOCGPGRP,
            ]
            .contains(&req)
            {
                // SAFETY: per the contract.
                unsafe { *arg = r };
            }
            Ok(0)
        })())
    })
}

/// # Safety
/// `fds` points to `n` pollfd structures.
#[no_mangle]
pub unsafe extern "C" fn usnet_poll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        ret_int((|| {
            if n > 0 && fds.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            let s = if n == 0 {
                &mut []
            } else {
                // SAFETY: per the contract.
                unsafe { std::slice::from_raw_parts_mut(fds, n as usize) }
            };
            usnet_posix::poll(s, timeout_ms)
        })())
    })
}

#[no_mangle]
pub extern "C" fn usnet_epoll_create1(flags: c_int) -> c_int {
    guard(-1, || ret_int(usnet_posix::epoll_create(flags)))
}

#[no_mangle]
pub extern "C" fn usnet_epoll_create(size: c_int) -> c_int {
    if size <= 0 {
        set_errno(Errno(libc::EINVAL));
        return -1;
    }
    usnet_epoll_create1(0)
}

/// # Safety
/// `ev` is NULL (EPOLL_CTL_DEL) or points to a readable epoll_event.
#[no_mangle]
pub unsafe extern "C" fn usnet_epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract; epoll_event is read by value.
        let e = if ev.is_null() {
            None
        } else {
            Some(unsafe { std::ptr::read_unaligned(ev) })
        };
        ret_int(usnet_posix::epoll_ctl(epfd, op, fd, e).map(|()| 0))
    })
}

/// # Safety
/// `out` points to `max` writable epoll_events.
#[no_mangle]
pub unsafe extern "C" fn usnet_epoll_wait(
    epfd: c_int,
    out: *mut libc::epoll_event,
    max: c_int,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        ret_int((|| {
            if max <= 0 {
                return Err(Errno(libc::EINVAL));
            }
            if out.is_null() {
                return Err(Errno(libc::EFAULT));
            }
            // SAFETY: per the contract.
            let s = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
            usnet_posix::epoll_wait(epfd, s, timeout_ms)
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` bytes that end where an inaccessible page begins: reading past them
    /// faults.
    struct Guarded {
        base: *mut u8,
        page: usize,
    }

    impl Guarded {
        fn new() -> Guarded {
            // SAFETY: sysconf has no memory arguments.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
            // SAFETY: a fresh anonymous mapping of two pages, the second made
            // inaccessible.
            let base = unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    2 * page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                assert_eq!(
                    libc::mprotect(p.cast::<u8>().add(page).cast(), page, libc::PROT_NONE),
                    0
                );
                p.cast::<u8>()
            };
            Guarded { base, page }
        }
        fn last(&self, n: usize) -> *mut u8 {
            // SAFETY: within the first page.
            unsafe { self.base.add(self.page - n) }
        }
    }

    impl Drop for Guarded {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`.
            unsafe { libc::munmap(self.base.cast(), 2 * self.page) };
        }
    }

    fn errno() -> i32 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() }
    }

    /// Found by the posix_calls fuzz target: `sendto` with a one-byte address read
    /// the two-byte family past the caller's buffer (ASan: heap-buffer-overflow).
    #[test]
    fn sendto_with_a_one_byte_address_reads_only_that_byte() {
        let g = Guarded::new();
        let a = g.last(1);
        // SAFETY: `a` has one readable byte, as passed.
        let r = unsafe {
            *a = libc::AF_UNSPEC as u8;
            usnet_sendto(-1, b"x".as_ptr().cast(), 1, libc::MSG_FASTOPEN, a.cast(), 1)
        };
        assert_eq!(r, -1);
        assert!(
            [libc::EINVAL, libc::EBADF].contains(&errno()),
            "errno {}",
            errno()
        );
    }

    /// Linux looks the descriptor up first: a bad one is EBADF even when an
    /// argument is bad too (here a NULL buffer and an address too short).
    #[test]
    fn a_bad_descriptor_is_ebadf_whatever_else_is_wrong() {
        type Call = Box<dyn Fn() -> isize>;
        let calls: [(&str, Call); 4] = [
            (
                "sendto",
                // SAFETY: every pointer is NULL or valid for its length.
                Box::new(|| unsafe {
                    usnet_sendto(-1, std::ptr::null(), 10, 0, std::ptr::null(), 1)
                }),
            ),
            (
                "recvfrom",
                Box::new(|| unsafe {
                    usnet_recvfrom(
                        -1,
                        std::ptr::null_mut(),
                        10,
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                }),
            ),
            (
                "bind",
                Box::new(|| unsafe { usnet_bind(-1, std::ptr::null(), 3) as isize }),
            ),
            (
                "getsockopt",
                Box::new(|| unsafe {
                    usnet_getsockopt(-1, 1, 1, std::ptr::null_mut(), std::ptr::null_mut()) as isize
                }),
            ),
        ];
        for (name, call) in calls {
            assert_eq!(call(), -1, "{name}");
            assert_eq!(errno(), libc::EBADF, "{name}");
        }
    }
}
