//! Sockets passed to another process with `SCM_RIGHTS` over a Unix socket, as Node's
//! `cluster` hands connections and listeners to its workers, and HAProxy and Envoy
//! hand listeners to their successors.
//!
//! The kernel passes what it sees, the kernel socket that holds a usnet socket's
//! number (stamped with the socket's tag, see `exec`); the socket itself lives in the stack
//! server. So:
//!
//! - **The sender** (a `sendmsg` on a kernel socket whose descriptors include usnet
//!   sockets) asks the server to pin those sockets for a receiver, and appends the
//!   pin's connection to the descriptors. The pin lives while a copy of that
//!   connection is open: in flight with the message, the sockets outlive the
//!   sender's own close (a primary closes a connection right after handing it over);
//!   a message never received goes with the socket that queued it, and the pin with
//!   it, as the kernel would drop the passed descriptors.
//! - **The receiver** (a `recvmsg` with room for control data on a kernel socket)
//!   receives into a buffer with room for one more descriptor. If the last one is a
//!   pin's connection, its session takes the pinned sockets
//!   (`Client::take_passed`), each goes under the received numbers whose socket
//!   carries its tag, and the pin's connection is closed and taken out of what the
//!   program sees, which is then exactly what the kernel would have given it.
//!
//! A program that is not under the shim and receives such a message gets one
//! descriptor more than was sent (the pin's connection), and the sockets only as
//! unconnected kernel sockets: usnet sockets are only usable in processes attached
//! to the stack.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use usnet_client::lineage::{self, Kind};

use crate::{client, cmsg, get, Errno, Obj, Res};

/// The room a descriptor takes in an `SCM_RIGHTS` message.
fn fd_space() -> usize {
    // SAFETY: CMSG_SPACE is arithmetic.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// The descriptors of every `SCM_RIGHTS` message in `msg`'s control data.
///
/// # Safety
/// `msg`'s control data is null or `msg_controllen` readable bytes.
unsafe fn rights(msg: &libc::msghdr) -> Vec<RawFd> {
    // SAFETY: the caller's promise.
    unsafe { cmsg::each(msg) }
        .into_iter()
        .filter(|(l, t, _)| *l == libc::SOL_SOCKET && *t == libc::SCM_RIGHTS)
        .flat_map(|(_, _, d)| cmsg::fds_of(&d))
        .collect()
}

/// The stack server's slot of a usnet socket (`None`: not a socket of ours, or an
/// epoll set, which is not passed).
fn slot_of(fd: RawFd) -> Option<u32> {
    let e = get(fd).ok()?;
    let o = e.read();
    match &*o {
        Obj::Fresh(s) => Some(s.fork_slot()),
        Obj::Listener(l) => Some(l.fork_slot()),
        Obj::Stream(s) => Some(s.fork_slot()),
        Obj::Udp(u) => Some(u.fork_slot()),
        _ => None,
    }
}

/// `sendmsg` on a kernel socket: if its descriptors include usnet sockets, they are
/// pinned for the receiver and the pin's connection goes with them (see the
/// module). `None`: nothing of ours in it; the caller sends it as it is.
///
/// # Safety
/// `msg` is null or a valid msghdr, as `sendmsg(2)` requires.
pub unsafe fn sendmsg(
    fd: RawFd,
    msg: *const libc::msghdr,
    flags: i32,
    send: impl FnOnce(RawFd, *const libc::msghdr, i32) -> isize,
) -> Option<Res<isize>> {
    // SAFETY: the caller's promise.
    let m = unsafe { msg.as_ref()? };
    if m.msg_control.is_null() || m.msg_controllen == 0 {
        return None;
    }
    // SAFETY: as above.
    let slots: Vec<u32> = unsafe { rights(m) }
        .into_iter()
        .filter_map(slot_of)
        .collect();
    if slots.is_empty() {
        return None;
    }
    Some(send_pinned(fd, m, flags, &slots, send))
}

fn send_pinned(
    fd: RawFd,
    m: &libc::msghdr,
    flags: i32,
    slots: &[u32],
    send: impl FnOnce(RawFd, *const libc::msghdr, i32) -> isize,
) -> Res<isize> {
    let pin = client()?
        .pin_for_passing(slots)
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::ENOBUFS)))?;
    // The program's control data, then one more SCM_RIGHTS message with the pin's
    // connection (the kernel hands all of a message's descriptors over as one list,
    // in order, so it arrives last).
    // msg_controllen is usize on glibc, u32 on musl.
    #[allow(clippy::unnecessary_cast)]
    let len = m.msg_controllen as usize;
    // The next header starts aligned, where the kernel looks for it (the program's
    // last message may end at its CMSG_LEN).
    let at = (len + 7) & !7;
    let mut control = vec![0u64; (at + fd_space()).div_ceil(8)];
    let bytes = control.as_mut_ptr() as *mut u8;
    // SAFETY: `control` has room for `at` bytes and one more descriptor message;
    // the program's control data is `len` readable bytes (sendmsg's contract).
    unsafe {
        std::ptr::copy_nonoverlapping(m.msg_control as *const u8, bytes, len);
        let c = bytes.add(at) as *mut libc::cmsghdr;
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, pin.stream().as_raw_fd());
    }
    let mut ours = *m;
    ours.msg_control = control.as_mut_ptr().cast();
    ours.msg_controllen = (at + fd_space()) as _;
    let r = send(fd, &ours, flags);
    let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // Our copy of the pin's connection goes: the message holds one now (or, if the
    // send failed, nothing does and the pin is dropped).
    drop(pin);
    if r < 0 {
        return Err(Errno(err));
    }
    Ok(r)
}

/// `recvmsg` on a kernel socket with room for control data: usnet sockets passed
/// in it become this process's (see the module). What the program's `recvmsg`
/// returns.
///
/// # Safety
/// `msg` is null or a valid msghdr, as `recvmsg(2)` requires.
pub unsafe fn recvmsg(
    fd: RawFd,
    msg: *mut libc::msghdr,
    flags: i32,
    recv: impl FnOnce(RawFd, *mut libc::msghdr, i32) -> isize,
) -> isize {
    // SAFETY: the caller's promise.
    let Some(m) = (unsafe { msg.as_mut() }) else {
        return recv(fd, msg, flags);
    };
    if m.msg_control.is_null() || m.msg_controllen == 0 || !is_unix(fd) {
        return recv(fd, msg, flags);
    }
    #[allow(clippy::unnecessary_cast)]
    let room = m.msg_controllen as usize;
    let mut control = vec![0u64; (room + fd_space()).div_ceil(8)];
    let mut ours = *m;
    ours.msg_control = control.as_mut_ptr().cast();
    ours.msg_controllen = (room + fd_space()) as _;
    let r = recv(fd, &mut ours, flags);
    if r < 0 {
        return r;
    }
    // SAFETY: the kernel wrote `ours.msg_controllen` bytes of control data.
    let fds = unsafe { rights(&ours) };
    // The pin's connection, and the process that made it.
    let pin = fds.last().copied().and_then(|p| {
        // SAFETY: a descriptor the kernel just gave this process, borrowed for a call.
        match lineage::named(unsafe { std::os::fd::BorrowedFd::borrow_raw(p) }) {
            Some((Kind::Pin, pid, _)) => Some((p, pid)),
            _ => None,
        }
    });
    if let Some((p, from)) = pin {
        // SAFETY: the pin's connection was just received: ours alone.
        let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(p) });
        if flags & libc::MSG_PEEK == 0 {
            take(&stream, from, &fds[..fds.len() - 1]);
        }
    }
    // The kernel's flags (a cut it made in our larger buffer it would have made in
    // the program's), and the name's length it wrote into the program's buffer.
    m.msg_flags = ours.msg_flags;
    m.msg_namelen = ours.msg_namelen;
    // SAFETY: `ours` holds what the kernel wrote; `m`'s buffer is `room` bytes.
    unsafe { deliver(&ours, m, room, pin.map(|(p, _)| p)) };
    r
}

/// Whether `fd` is a Unix domain socket (descriptors only travel on those).
fn is_unix(fd: RawFd) -> bool {
    let mut d: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `d`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut d as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    r == 0 && d == libc::AF_UNIX
}

/// This process takes the sockets pinned on `pin` (made by process `from`) and puts
/// each under the received numbers of `fds` that carry its tag. A socket this
/// process passed to itself is already its own: those numbers name it as `dup`s
/// would.
fn take(pin: &UnixStream, from: u32, fds: &[RawFd]) {
    let mut tags: HashMap<u32, Vec<RawFd>> = HashMap::new();
    for &fd in fds {
        if let Some(t) = crate::exec::tag_of(fd) {
            tags.entry(t).or_default().push(fd);
        }
    }
    if tags.is_empty() {
        return;
    }
    if from == std::process::id() {
        crate::alias_tagged(&tags);
        return;
    }
    let Ok(c) = client() else {
        return;
    };
    match c.take_passed(pin) {
        Ok(claimed) => crate::exec::install(&c, claimed, &tags),
        Err(e) => {
            if std::env::var("USNET_DEBUG").is_ok_and(|v| v == "1") {
                eprintln!("usnet: sockets passed to this process are lost: {e}");
            }
        }
    }
}

/// Copies the control data of `ours` into the program's buffer of `room` bytes,
/// without the pin's connection `pin`, as the kernel would have delivered it: a
/// descriptor message that does not fit whole keeps the descriptors that fit (the
/// rest are closed), nothing after it is written, and `MSG_CTRUNC` is set.
///
/// # Safety
/// `ours` holds control data the kernel wrote; `m.msg_control` is `room` writable
/// bytes.
unsafe fn deliver(ours: &libc::msghdr, m: &mut libc::msghdr, room: usize, pin: Option<RawFd>) {
    let is_rights = |l: i32, t: i32| l == libc::SOL_SOCKET && t == libc::SCM_RIGHTS;
    let fd_bytes = |fds: &[RawFd]| {
        fds.iter()
            .flat_map(|f| f.to_ne_bytes())
            .collect::<Vec<u8>>()
    };
    // SAFETY: the caller's promise.
    let mut all = unsafe { cmsg::each(ours) };
    for (_, _, d) in all.iter_mut().filter(|(l, t, _)| is_rights(*l, *t)) {
        let fds: Vec<RawFd> = cmsg::fds_of(d)
            .into_iter()
            .filter(|&f| Some(f) != pin)
            .collect();
        *d = fd_bytes(&fds);
    }
    all.retain(|(l, t, d)| !(is_rights(*l, *t) && d.is_empty()));
    let space = |n: usize| {
        // SAFETY: CMSG_SPACE and CMSG_LEN are arithmetic.
        unsafe {
            (
                libc::CMSG_LEN(n as u32) as usize,
                libc::CMSG_SPACE(n as u32) as usize,
            )
        }
    };
    let mut used = 0;
    let mut kept = all.len();
    let mut cut = false;
    for (i, (l, t, d)) in all.iter_mut().enumerate() {
        let (len, sp) = space(d.len());
        if used + len <= room {
            used += sp;
            continue;
        }
        cut = true;
        kept = i;
        if is_rights(*l, *t) {
            let (head, _) = space(0);
            let fit = room.saturating_sub(used + head) / std::mem::size_of::<RawFd>();
            let fds = cmsg::fds_of(d);
            if fit > 0 {
                for &f in &fds[fit.min(fds.len())..] {
                    // SAFETY: a descriptor received here that the program never sees.
                    unsafe { libc::close(f) };
                }
                *d = fd_bytes(&fds[..fit.min(fds.len())]);
                kept = i + 1;
            }
        }
        break;
    }
    // Descriptors that are not delivered are closed, as the kernel closes them.
    for (l, t, d) in &all[kept..] {
        if is_rights(*l, *t) {
            for f in cmsg::fds_of(d) {
                // SAFETY: a descriptor received here that the program never sees.
                unsafe { libc::close(f) };
            }
        }
    }
    let list: Vec<(i32, i32, &[u8])> = all[..kept]
        .iter()
        .map(|(l, t, d)| (*l, *t, d.as_slice()))
        .collect();
    m.msg_controllen = room as _;
    // SAFETY: `m.msg_control` is `room` writable bytes (the caller's promise).
    let _ = unsafe { cmsg::put(m, &list) };
    if cut {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
}
