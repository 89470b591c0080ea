//! `pipe` and `splice` between a backend socket and a kernel descriptor (a pipe
//! this library made, or any other): `splice` from a socket reads as Linux's
//! `tcp_splice_read` does (`tcp_read_sock`: it stops at the urgent mark, and there,
//! with the urgent byte still queued, returns 0 instead of waiting) and writes what
//! it read to the other descriptor; `splice` to a socket reads the other
//! descriptor and writes to the socket as `write` does.

use std::collections::BTreeSet;
use std::ffi::c_int;

use super::{map, Backend, Res};

/// The pipes `pipe()` made, closed with the backend.
#[derive(Debug, Default)]
pub(crate) struct Pipes(BTreeSet<c_int>);

impl Pipes {
    fn close_all(&mut self) {
        for fd in std::mem::take(&mut self.0) {
            // SAFETY: a descriptor pipe2 made for this backend, closed once.
            unsafe { libc::close(fd) };
        }
    }
}

impl Drop for Pipes {
    fn drop(&mut self) {
        self.close_all();
    }
}

impl Backend {
    /// `pipe`: a kernel pipe (its numbers cannot clash with the sockets', which
    /// are kernel descriptors too).
    pub fn pipe(&mut self) -> Res<[c_int; 2]> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        self.pipes.0.extend(fds);
        Ok(fds)
    }

    /// `close` of one of the pipe's ends; false: not one of them.
    pub(crate) fn close_pipe(&mut self, fd: c_int) -> bool {
        if !self.pipes.0.remove(&fd) {
            return false;
        }
        // SAFETY: a descriptor pipe2 made for this backend, closed once.
        unsafe { libc::close(fd) };
        true
    }

    /// Whether `fd` is one of this backend's sockets (not a pipe).
    pub(crate) fn is_socket(&self, fd: c_int) -> bool {
        self.fds.contains_key(&fd)
    }

    /// A non-blocking read of a socket as `splice` reads it (see the module
    /// documentation).
    pub fn try_splice_read(&mut self, fd: c_int, buf: &mut [u8]) -> Res<usize> {
        let h = self.conn(fd)?;
        let r = self.stack_mut().tcp_recv_to_mark(h, buf).map_err(map);
        self.pump();
        r
    }
}
