//! The backend shared between packetdrill's threads (packetdrill runs system calls
//! in their own thread while the main thread injects and sniffs packets). Calls on
//! blocking sockets (`accept`, `connect`, `read`, `write`, `poll` with a timeout)
//! wait on a condition variable until another thread injects a packet or moves the
//! clock; whatever changes the backend wakes the waiters.

use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use libc::pollfd;

use super::{Backend, Res};

/// How far `netdev_receive` lets the virtual clock run looking for a packet before it
/// reports "nothing" (packetdrill then asks again, and the clock runs on).
const SNIFF_HORIZON_NS: u64 = 1_000_000_000;

pub struct Shared {
    inner: Mutex<Backend>,
    cv: Condvar,
}

impl Shared {
    pub fn new(b: Backend) -> Shared {
        Shared {
            inner: Mutex::new(b),
            cv: Condvar::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Backend> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until another thread changes something (a packet, the clock).
    fn wait<'a>(&self, g: MutexGuard<'a, Backend>) -> MutexGuard<'a, Backend> {
        match self.cv.wait_timeout(g, Duration::from_millis(50)) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }

    /// Wakes the threads waiting in a blocking call.
    fn changed(&self) {
        self.cv.notify_all();
    }

    /// Blocks (for a blocking socket) until `op` stops saying `EAGAIN`.
    fn blocking<T>(
        &self,
        fd: c_int,
        force_nonblock: bool,
        mut op: impl FnMut(&mut Backend) -> Res<T>,
    ) -> Res<T> {
        let mut g = self.lock();
        loop {
            match op(&mut g) {
                Err(libc::EAGAIN) => {
                    let nb = force_nonblock || g.nonblocking(fd).is_none_or(|nb| nb);
                    if nb {
                        return Err(libc::EAGAIN);
                    }
                    g = self.wait(g);
                }
                r => {
                    self.changed();
                    return r;
                }
            }
        }
    }

    pub fn accept(&self, fd: c_int) -> Res<(c_int, SocketAddr)> {
        self.blocking(fd, false, |b| b.try_accept(fd))
    }

    /// `connect`: `EINPROGRESS` on a non-blocking socket, else waits for the
    /// handshake.
    pub fn connect(&self, fd: c_int, to: SocketAddr) -> Res<c_int> {
        let mut g = self.lock();
        g.start_connect(fd, to)?;
        self.changed();
        if g.nonblocking(fd) == Some(true) {
            return Err(libc::EINPROGRESS);
        }
        drop(g);
        self.blocking(fd, false, |b| match b.connect_status(fd)? {
            true => Ok(0),
            false => Err(libc::EAGAIN),
        })
    }

    /// `read`/`recv`: `MSG_DONTWAIT` and `MSG_NOSIGNAL` are the flags understood.
    pub fn read(&self, fd: c_int, buf: &mut [u8], flags: c_int) -> Res<i64> {
        if flags & !(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        self.blocking(fd, flags & libc::MSG_DONTWAIT != 0, |b| b.try_read(fd, buf))
            .map(|n| n as i64)
    }

    /// `recvfrom`: [`Shared::read`] and the peer's address, if connected.
    pub fn recv_from(
        &self,
        fd: c_int,
        buf: &mut [u8],
        flags: c_int,
    ) -> Res<(i64, Option<SocketAddr>)> {
        let n = self.read(fd, buf, flags)?;
        Ok((n, self.lock().peer_addr(fd).ok()))
    }

    /// `write`/`send`: a blocking write returns when everything is queued, like the
    /// kernel's.
    pub fn write(&self, fd: c_int, data: &[u8], flags: c_int) -> Res<i64> {
        if flags & !(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let mut done = 0;
        let r = self.blocking(fd, flags & libc::MSG_DONTWAIT != 0, |b| {
            let n = b.try_write(fd, &data[done..])?;
            done += n;
            if done < data.len() {
                Err(libc::EAGAIN)
            } else {
                Ok(())
            }
        });
        match r {
            Ok(()) => Ok(done as i64),
            Err(_) if done > 0 => Ok(done as i64),
            Err(e) => Err(e),
        }
    }

    pub fn close(&self, fd: c_int) -> Res<c_int> {
        let r = self.lock().close(fd).map(|_| 0);
        self.changed();
        r
    }

    /// `poll`: waits (in virtual time, `timeout` ms; negative: for ever) until one of
    /// `fds` is ready.
    pub fn poll(&self, fds: &mut [pollfd], timeout: c_int) -> Res<c_int> {
        let mut g = self.lock();
        let deadline = (timeout >= 0).then(|| g.now_ns() + timeout as u64 * 1_000_000);
        loop {
            g.pump();
            let mut ready = 0;
            for p in fds.iter_mut() {
                p.revents = 0;
                if p.fd < 0 {
                    continue;
                }
                let ev = g.revents(p.fd);
                p.revents = ev & (p.events | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL);
                if p.revents != 0 {
                    ready += 1;
                }
            }
            if ready > 0 || deadline.is_some_and(|d| g.now_ns() >= d) {
                return Ok(ready);
            }
            g = self.wait(g);
        }
    }

    /// `netdev_send`: a packet from the script.
    pub fn netdev_send(&self, p: &[u8]) -> Res<c_int> {
        let r = self.lock().inject(p).map(|_| 0);
        self.changed();
        r
    }

    /// `netdev_receive`: the next packet the stack sent, copied into `out` (cut to
    /// its size), with the wall-clock microseconds it was sent at; `None` if there is
    /// none even after giving the system-call threads a turn.
    pub fn netdev_receive(&self, out: &mut [u8]) -> Option<(usize, i64)> {
        let mut g = self.lock();
        let mut got = g.sniff(SNIFF_HORIZON_NS);
        if got.is_none() {
            // Give a system-call thread the chance to make the stack send something.
            g = self.wait(g);
            got = g.sniff(SNIFF_HORIZON_NS);
        }
        self.changed();
        let (p, t) = got?;
        let n = p.len().min(out.len());
        out[..n].copy_from_slice(&p[..n]);
        Some((n, g.wall_us(t)))
    }

    pub fn usleep(&self, us: u64) {
        let mut g = self.lock();
        g.sleep_us(us);
        self.changed();
    }

    /// `gettimeofday` in microseconds since the epoch.
    pub fn gettimeofday(&self) -> i64 {
        let us = self.lock().gettimeofday_us();
        self.changed();
        us
    }
}
