//! Handing descriptors (a session's memfd, an eventfd) to another process over a Unix
//! socket with SCM_RIGHTS, next to a message. rustix does the cmsg work.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Sends `bytes` with `fds` attached (all of `bytes` in one message: keep it small).
pub fn send_with_fds(sock: impl AsFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "cmsg space"));
    }
    let n = sendmsg(sock, &[IoSlice::new(bytes)], &mut cmsg, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one message into `buf` and the descriptors sent with it (close-on-exec).
/// Returns the byte count (0: the peer closed).
pub fn recv_with_fds(sock: impl AsFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    Ok((r.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_memfd_crosses_a_socket_and_maps_the_same_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let r = crate::Region::create_memfd(c"fdpass", 4096, true).unwrap();
        r.write(100, b"hello").unwrap();
        send_with_fds(&a, b"take this", &[r.fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"take this");
        assert_eq!(fds.len(), 1);
        let other = crate::Region::attach_memfd(fds.remove(0), 4096, 4096, true).unwrap();
        let mut got = [0u8; 5];
        other.read(100, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        // Plain bytes still flow on the same socket.
        (&a).write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        (&b).read_exact(&mut one).unwrap();
        drop(a);
        let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
        assert_eq!((n, fds.len()), (0, 0), "peer closed");
    }
}
