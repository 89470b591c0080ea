//! `sendfile` and `splice` into a connection whose send buffer bounds its writes
//! ([`TcpStream::send_bounded`]). The stack may take fewer bytes than the ring
//! received, and the bytes it refuses are dropped from the ring; so the source
//! must give up only what was taken. A file's position is moved back by what was
//! dropped; a pipe cannot be read twice, so its bytes are first copied with `tee`
//! (which leaves them in the pipe) and only the ones taken are then consumed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::tcp::TcpStream;

/// Sends up to `max` bytes of `fd` (at `file_off`, or from its position, which
/// moves by the bytes taken) through the stack. Returns the bytes taken; 0 at the
/// end of the file.
pub(crate) fn send_file_bounded(
    s: &TcpStream,
    fd: BorrowedFd<'_>,
    file_off: Option<i64>,
    max: usize,
) -> io::Result<usize> {
    if file_off.is_some() {
        return s.send_through_stack(max, 0, |tx| tx.push_from_fd(fd, file_off, max));
    }
    match rustix::fs::seek(fd, rustix::fs::SeekFrom::Current(0)) {
        Ok(at) => {
            // Read at the position, then move it by what was taken.
            let at = at as i64;
            let taken = s.send_through_stack(max, 0, |tx| tx.push_from_fd(fd, Some(at), max))?;
            rustix::fs::seek(fd, rustix::fs::SeekFrom::Start((at + taken as i64) as u64))?;
            Ok(taken)
        }
        Err(rustix::io::Errno::SPIPE) => send_pipe_bounded(s, fd, max),
        Err(e) => Err(e.into()),
    }
}

/// A pipe's bytes: copied with `tee` into a pipe of our own, sent from there, and
/// then as many consumed from the source as the stack took.
fn send_pipe_bounded(s: &TcpStream, src: BorrowedFd<'_>, max: usize) -> io::Result<usize> {
    let (r, w): (OwnedFd, OwnedFd) = rustix::pipe::pipe()?;
    let taken = s.send_through_stack(max, 0, |tx| {
        // What an earlier attempt copied and the stack refused is copied again.
        drain(r.as_fd(), usize::MAX)?;
        let want = max.min(tx.free().unwrap_or(0));
        if want == 0 {
            return Ok(0);
        }
        let copied = tee(src, w.as_fd(), want)?;
        if copied == 0 {
            return Ok(0);
        }
        tx.push_from_fd(r.as_fd(), None, copied)
    })?;
    drain(src, taken)?;
    Ok(taken)
}

/// `tee(2)`: duplicates up to `len` bytes of pipe `from` into pipe `to` without
/// consuming them (blocks as `from`'s mode says until there are some).
fn tee(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: two borrowed descriptors; tee has no memory arguments.
    let n = unsafe { libc::tee(from.as_raw_fd(), to.as_raw_fd(), len, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Reads and discards up to `n` bytes of pipe `fd` (what is there, without waiting
/// when `n` is `usize::MAX`).
fn drain(fd: BorrowedFd<'_>, mut n: usize) -> io::Result<()> {
    let all = n == usize::MAX;
    let mut buf = [0u8; 16 * 1024];
    while n > 0 {
        if all {
            let mut queued: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int.
            if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut queued) } < 0 {
                return Err(io::Error::last_os_error());
            }
            if queued == 0 {
                return Ok(());
            }
        }
        let k = n.min(buf.len());
        match rustix::io::read(fd, &mut buf[..k]) {
            Ok(0) => return Ok(()),
            Ok(got) => n -= got,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
