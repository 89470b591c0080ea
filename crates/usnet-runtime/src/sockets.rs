//! Blocking and non-blocking socket handles over a running stack, shaped like
//! `std::net::UdpSocket` so porting code is a change of type.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use usnet_stack::{EchoReply, SocketHandle, Stack, StackError};

use crate::{Inner, NetStack, Shared};

pub(crate) fn to_io(e: StackError) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

/// Blocks on the condition variable until notified or `deadline`; `None` on timeout
/// or when the stack stopped.
pub(crate) fn wait<'a>(
    shared: &'a Shared,
    mut g: MutexGuard<'a, Inner>,
    deadline: Option<std::time::Instant>,
) -> Option<MutexGuard<'a, Inner>> {
    if shared.stop.load(Ordering::Acquire) {
        return None;
    }
    g.waiters += 1;
    let g = match deadline {
        None => shared.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
        Some(d) => {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                g.waiters -= 1;
                return None;
            }
            shared
                .cond
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0
        }
    };
    let mut g = g;
    g.waiters -= 1;
    Some(g)
}

/// Runs `op` until it stops saying `WouldBlock`, waiting for the poll loop between
/// tries, unless non-blocking.
pub(crate) fn blocking<T>(
    net: &NetStack,
    nonblocking: bool,
    timeout: Option<Duration>,
    mut op: impl FnMut(&mut Stack) -> Result<T, StackError>,
) -> io::Result<T> {
    let shared = &net.shared;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut g = shared.lock();
    loop {
        match op(g.stack()) {
            Err(StackError::WouldBlock) if !nonblocking => {}
            Ok(v) => {
                drop(g);
                shared.waker.wake();
                return Ok(v);
            }
            Err(e) => return Err(to_io(e)),
        }
        if let Some(f) = &g.failed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, f.clone()));
        }
        g = match wait(shared, g, deadline) {
            Some(g) => g,
            None if shared.stop.load(Ordering::Acquire) => {
                return Err(io::Error::new(io::ErrorKind::NotConnected, "stack stopped"))
            }
            None => return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
        };
    }
}

/// A UDP socket on a usnet stack.
pub struct UdpSocket {
    net: NetStack,
    handle: SocketHandle,
    nonblocking: Arc<AtomicBool>,
    read_timeout: Option<Duration>,
}

impl UdpSocket {
    pub fn bind(net: &NetStack, addr: SocketAddr) -> io::Result<UdpSocket> {
        let handle = net.with(|s| s.udp_bind(addr)).map_err(to_io)?;
        Ok(UdpSocket {
            net: net.clone(),
            handle,
            nonblocking: Arc::new(AtomicBool::new(false)),
            read_timeout: None,
        })
    }

    pub fn handle(&self) -> SocketHandle {
        self.handle
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.net
            .with(|s| s.udp_local_addr(self.handle))
            .map_err(to_io)
    }

    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        self.net
            .with(|s| s.udp_connect(self.handle, addr))
            .map_err(to_io)
    }

    pub fn set_nonblocking(&self, nb: bool) {
        self.nonblocking.store(nb, Ordering::Relaxed);
    }

    /// Priority-aware receive: names the calling thread as this socket's consumer
    /// (priority control boosts it) and ranks the socket by that thread's
    /// scheduling priority (`-nice`), unless [`UdpSocket::set_priority`] marks it.
    pub fn set_consumer_thread(&self) -> io::Result<()> {
        let tid = usnet_driver::sched::gettid();
        let nice = usnet_driver::sched::nice_of(tid)?;
        self.net
            .with(|s| {
                s.set_socket_consumer(self.handle, Some(tid))?;
                s.set_socket_priority(self.handle, Some(-nice))
            })
            .map_err(to_io)
    }

    /// Marks this socket's priority explicitly (higher is more important, on the
    /// scale of `-nice`), or clears the mark with `None`.
    pub fn set_priority(&self, priority: Option<i32>) -> io::Result<()> {
        self.net
            .with(|s| s.set_socket_priority(self.handle, priority))
            .map_err(to_io)
    }

    pub fn set_read_timeout(&mut self, t: Option<Duration>) {
        self.read_timeout = t;
    }

    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        self.net
            .with(|s| s.udp_set_recv_buffer(self.handle, bytes))
            .map_err(to_io)
    }

    pub fn send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<usize> {
        let h = self.handle;
        blocking(&self.net, self.nb(), None, |s| s.udp_send_to(h, data, to))
    }

    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        let h = self.handle;
        blocking(&self.net, self.nb(), None, |s| s.udp_send(h, data))
    }

    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let h = self.handle;
        blocking(&self.net, self.nb(), self.read_timeout, |s| {
            s.udp_recv_from(h, buf)
        })
    }

    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    fn nb(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.net.with(|s| s.close(h));
    }
}

/// An ICMP echo socket (both families), for ping.
pub struct PingSocket {
    net: NetStack,
    handle: SocketHandle,
}

impl PingSocket {
    pub fn open(net: &NetStack) -> PingSocket {
        PingSocket {
            handle: net.with(|s| s.ping_open()),
            net: net.clone(),
        }
    }

    pub fn ident(&self) -> u16 {
        self.net.with(|s| s.ping_ident(self.handle)).unwrap_or(0)
    }

    /// Sends an echo request whose data starts with the send time, so the reply
    /// carries it back.
    pub fn send(&self, dst: IpAddr, seq: u16, size: usize) -> io::Result<()> {
        let mut data = vec![0u8; size];
        for (i, b) in data.iter_mut().enumerate().skip(8) {
            *b = i as u8;
        }
        let h = self.handle;
        let shared = self.net.shared.clone();
        blocking(&self.net, false, None, |s| {
            let ts = shared.now().as_nanos().to_be_bytes();
            let n = data.len().min(8);
            data[..n].copy_from_slice(&ts[..n]);
            s.ping_send(h, dst, seq, &data)
        })
    }

    /// Waits for the next reply; its round-trip time (when the data carried a send
    /// time) is `reply.at - sent`.
    pub fn recv(&self, timeout: Duration) -> io::Result<(EchoReply, Option<Duration>)> {
        let h = self.handle;
        let r = blocking(&self.net, false, Some(timeout), |s| s.ping_recv(h))?;
        let rtt = (r.len >= 8).then(|| {
            let sent = u64::from_be_bytes(r.head[..8].try_into().expect("8 bytes"));
            Duration::from_nanos(r.at.as_nanos().saturating_sub(sent))
        });
        Ok((r, rtt))
    }
}

impl Drop for PingSocket {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.net.with(|s| s.close(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_errors_reach_io_as_their_kinds() {
        use io::ErrorKind as K;
        for (e, k) in [
            (StackError::ConnectionRefused, K::ConnectionRefused),
            (StackError::HostUnreachable, K::HostUnreachable),
            (StackError::NetUnreachable, K::NetworkUnreachable),
            (StackError::TimedOut, K::TimedOut),
        ] {
            assert_eq!(to_io(e).kind(), k, "{e:?}");
        }
    }
}
