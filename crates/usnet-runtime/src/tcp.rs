//! TCP sockets over a running stack, shaped like `std::net::{TcpListener, TcpStream}`
//! so porting code is a change of type (plus the `&NetStack` argument).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use usnet_stack::{CcAlgorithm, Keepalive, SocketHandle, StackError, TcpInfo, TcpState};

use crate::sockets::{blocking, to_io};
use crate::NetStack;

/// A listening TCP socket.
pub struct TcpListener {
    net: NetStack,
    handle: SocketHandle,
    nonblocking: bool,
}

impl TcpListener {
    /// Listens on `addr` with a backlog of 128 (an unspecified address serves both
    /// IPv4 and IPv6; port 0 picks one).
    pub fn bind(net: &NetStack, addr: SocketAddr) -> io::Result<TcpListener> {
        Self::bind_with_backlog(net, addr, 128)
    }

    pub fn bind_with_backlog(
        net: &NetStack,
        addr: SocketAddr,
        backlog: usize,
    ) -> io::Result<TcpListener> {
        let handle = net.with(|s| s.tcp_listen(addr, backlog)).map_err(to_io)?;
        Ok(TcpListener {
            net: net.clone(),
            handle,
            nonblocking: false,
        })
    }

    /// Waits for the next connection (unless non-blocking).
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let h = self.handle;
        let c = blocking(&self.net, self.nonblocking, None, |s| s.tcp_accept(h))?;
        let peer = self.net.with(|s| s.tcp_peer_addr(c)).map_err(to_io)?;
        Ok((TcpStream::from_handle(&self.net, c), peer))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.net
            .with(|s| s.tcp_local_addr(self.handle))
            .map_err(to_io)
    }

    pub fn set_nonblocking(&mut self, nb: bool) -> io::Result<()> {
        self.nonblocking = nb;
        Ok(())
    }

    pub fn handle(&self) -> SocketHandle {
        self.handle
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.net.with(|s| s.tcp_close(h));
    }
}

/// A TCP connection. `Read`/`Write` are implemented for `TcpStream` and `&TcpStream`
/// (one reader and one writer thread may share it).
pub struct TcpStream {
    net: NetStack,
    handle: SocketHandle,
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl TcpStream {
    fn from_handle(net: &NetStack, handle: SocketHandle) -> TcpStream {
        TcpStream {
            net: net.clone(),
            handle,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
        }
    }

    /// Connects and waits until the handshake completes or fails (the SYN is retried
    /// for about two minutes, as on Linux).
    pub fn connect(net: &NetStack, addr: SocketAddr) -> io::Result<TcpStream> {
        Self::connect_timeout(net, addr, Duration::from_secs(130))
    }

    /// Connects, giving up (and dropping the attempt) after `timeout`.
    pub fn connect_timeout(
        net: &NetStack,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        let h = net.with(|s| s.tcp_connect(None, addr)).map_err(to_io)?;
        let stream = TcpStream::from_handle(net, h);
        blocking(net, false, Some(timeout), |s| {
            let r = s.readiness(h)?;
            if r.connected {
                Ok(())
            } else if r.closed {
                Err(s.tcp_error(h)?.unwrap_or(StackError::ConnectionRefused))
            } else {
                Err(StackError::WouldBlock)
            }
        })?;
        Ok(stream)
    }

    pub fn handle(&self) -> SocketHandle {
        self.handle
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.net
            .with(|s| s.tcp_peer_addr(self.handle))
            .map_err(to_io)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.net
            .with(|s| s.tcp_local_addr(self.handle))
            .map_err(to_io)
    }

    /// `Write` half-closes (FIN after the queued data); `Read` is accepted and does
    /// nothing (as `shutdown(SHUT_RD)` on Linux, data keeps arriving); `Both` does both.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match how {
            Shutdown::Read => Ok(()),
            Shutdown::Write | Shutdown::Both => self
                .net
                .with(|s| s.tcp_shutdown_write(self.handle))
                .map_err(to_io),
        }
    }

    pub fn set_nonblocking(&mut self, nb: bool) -> io::Result<()> {
        self.nonblocking = nb;
        Ok(())
    }

    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.read_timeout = t;
        Ok(())
    }

    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.write_timeout = t;
        Ok(())
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.net
            .with(|s| s.tcp_set_nodelay(self.handle, on))
            .map_err(to_io)
    }

    pub fn set_keepalive(&self, ka: Option<Keepalive>) -> io::Result<()> {
        self.net
            .with(|s| s.tcp_set_keepalive(self.handle, ka))
            .map_err(to_io)
    }

    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.net
            .with(|s| s.tcp_set_linger(self.handle, linger))
            .map_err(to_io)
    }

    pub fn set_congestion_control(&self, cc: CcAlgorithm) -> io::Result<()> {
        self.net
            .with(|s| s.tcp_set_congestion_control(self.handle, cc))
            .map_err(to_io)
    }

    /// A `tcp_info`-like snapshot (RTT, cwnd, retransmissions, ...).
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.net.with(|s| s.tcp_info(self.handle)).map_err(to_io)
    }

    /// This connection's own counters (out-of-order arrivals, retransmissions,
    /// window trims, ...), the per-connection part of `usnet stat`.
    pub fn stats(&self) -> io::Result<usnet_stack::TcpStats> {
        self.net
            .with(|s| s.tcp_conn_stats(self.handle))
            .map_err(to_io)
    }

    pub fn state(&self) -> io::Result<TcpState> {
        self.net.with(|s| s.tcp_state(self.handle)).map_err(to_io)
    }

    /// Waits until the peer has acknowledged everything written (or `timeout`).
    pub fn flush_acked(&self, timeout: Duration) -> io::Result<()> {
        let h = self.handle;
        blocking(&self.net, false, Some(timeout), |s| {
            let i = s.tcp_info(h)?;
            if let Some(e) = s.tcp_error(h)? {
                return Err(e);
            }
            if i.send_queued == 0 {
                Ok(())
            } else {
                Err(StackError::WouldBlock)
            }
        })
    }

    fn read_impl(&self, buf: &mut [u8]) -> io::Result<usize> {
        let h = self.handle;
        blocking(&self.net, self.nonblocking, self.read_timeout, |s| {
            s.tcp_recv(h, buf)
        })
    }

    fn write_impl(&self, buf: &[u8]) -> io::Result<usize> {
        let h = self.handle;
        blocking(&self.net, self.nonblocking, self.write_timeout, |s| {
            s.tcp_send(h, buf)
        })
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }
    /// Data is handed to the stack by `write`; nothing is buffered here.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        let h = self.handle;
        let _ = self.net.with(|s| s.tcp_close(h));
    }
}
