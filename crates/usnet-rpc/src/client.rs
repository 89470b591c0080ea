//! The client side of the rpc transport: calls are serialised over the process's one
//! connection (as `librumpclient`'s calls share one socket), each waits for its reply
//! and answers the proxy's copy requests on the way.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use usnet_session::ctl::{resolve, ControlError};

use crate::wire::{self, Header};
use crate::{proxy::rpc_path, Clusters};

/// Every message has this long to arrive once a call is under way (a blocked read or
/// accept on the stack keeps the proxy silent: those wait in slices of this).
const CALL_DEADLINE: Duration = Duration::from_secs(30);

struct Inner {
    unix: Mutex<UnixStream>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, UnixStream> {
        self.unix.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call without user data: request, then its reply.
    fn call(&self, h: Header, payload: &[u8]) -> io::Result<(i64, Vec<u8>)> {
        let mut u = self.lock();
        wire::send(&mut *u, h, payload)?;
        let mut back = Vec::new();
        let r = wire::recv(&mut *u, &mut back)?;
        if r.op != wire::REPLY {
            return Err(wire::invalid("expected a reply"));
        }
        Ok((wire::to_io(r.arg)?, back))
    }
}

/// A connection to a stack's rpc proxy (`usnet up --rpc`).
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
    clusters: Clusters,
}

impl RpcClient {
    /// Connects to the stack named `stack` (or `USNET_STACK`, or the only one running)
    /// with the given cluster geometry.
    pub fn connect(stack: Option<&str>, clusters: Clusters) -> io::Result<RpcClient> {
        let name = stack
            .map(str::to_string)
            .or_else(|| std::env::var("USNET_STACK").ok());
        let ctl = resolve(name.as_deref()).map_err(|e| match e {
            ControlError::Io(e) => e,
            e => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
        })?;
        let unix = UnixStream::connect(rpc_path(&ctl))?;
        unix.set_read_timeout(Some(CALL_DEADLINE))?;
        unix.set_write_timeout(Some(CALL_DEADLINE))?;
        let inner = Arc::new(Inner {
            unix: Mutex::new(unix),
        });
        inner.call(
            Header::new(wire::HELLO, 0, clusters.bytes as i64, clusters.count as i64),
            &[],
        )?;
        Ok(RpcClient { inner, clusters })
    }

    pub fn clusters(&self) -> Clusters {
        self.clusters
    }

    /// A TCP connection to `addr`.
    pub fn tcp_connect(&self, addr: SocketAddr) -> io::Result<RpcStream> {
        let (id, _) = self.inner.call(
            Header::new(wire::CONNECT, 0, 0, 0),
            addr.to_string().as_bytes(),
        )?;
        Ok(RpcStream {
            inner: self.inner.clone(),
            sock: id as u32,
        })
    }

    /// A TCP listener on `addr`.
    pub fn tcp_listen(&self, addr: SocketAddr, backlog: usize) -> io::Result<RpcListener> {
        let (id, _) = self.inner.call(
            Header::new(wire::LISTEN, 0, backlog as i64, 0),
            addr.to_string().as_bytes(),
        )?;
        Ok(RpcListener {
            inner: self.inner.clone(),
            sock: id as u32,
        })
    }
}

fn close(inner: &Inner, sock: u32) {
    let _ = inner.call(Header::new(wire::CLOSE, sock, 0, 0), &[]);
}

/// A listening socket at the stack.
pub struct RpcListener {
    inner: Arc<Inner>,
    sock: u32,
}

impl RpcListener {
    /// The next connection (blocks at the proxy until one arrives).
    pub fn accept(&self) -> io::Result<(RpcStream, SocketAddr)> {
        let (id, peer) = self
            .inner
            .call(Header::new(wire::ACCEPT, self.sock, 0, 0), &[])?;
        let peer = std::str::from_utf8(&peer)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| wire::invalid("bad peer address"))?;
        Ok((
            RpcStream {
                inner: self.inner.clone(),
                sock: id as u32,
            },
            peer,
        ))
    }
}

impl Drop for RpcListener {
    fn drop(&mut self) {
        close(&self.inner, self.sock);
    }
}

/// A TCP connection at the stack.
pub struct RpcStream {
    inner: Arc<Inner>,
    sock: u32,
}

impl RpcStream {
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let how = match how {
            std::net::Shutdown::Read => 0,
            std::net::Shutdown::Write => 1,
            std::net::Shutdown::Both => 2,
        };
        self.inner
            .call(Header::new(wire::SHUTDOWN, self.sock, how, 0), &[])
            .map(|_| ())
    }
}

impl Drop for RpcStream {
    fn drop(&mut self) {
        close(&self.inner, self.sock);
    }
}

impl Read for &RpcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut u = self.inner.lock();
        wire::send(
            &mut *u,
            Header::new(wire::READ, self.sock, buf.len() as i64, 0),
            &[],
        )?;
        loop {
            // Each COPYOUT lands at its offset in the caller's buffer (copy-out).
            let h = wire::read_header(&mut *u)?;
            match h.op {
                wire::COPYOUT => {
                    let off = usize::try_from(h.arg).map_err(|_| wire::invalid("offset"))?;
                    let end = off
                        .checked_add(h.len as usize)
                        .filter(|&e| e <= buf.len())
                        .ok_or_else(|| wire::invalid("COPYOUT beyond the buffer"))?;
                    u.read_exact(&mut buf[off..end])?;
                    wire::send(&mut *u, Header::new(wire::ACK, self.sock, 0, 0), &[])?;
                }
                wire::REPLY => {
                    skip(&mut u, h.len)?;
                    return wire::to_io(h.arg).map(|n| n as usize);
                }
                _ => return Err(wire::invalid("unexpected message during READ")),
            }
        }
    }
}

impl Write for &RpcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut u = self.inner.lock();
        wire::send(
            &mut *u,
            Header::new(wire::WRITE, self.sock, buf.len() as i64, 0),
            &[],
        )?;
        loop {
            let h = wire::read_header(&mut *u)?;
            match h.op {
                wire::COPYIN => {
                    skip(&mut u, h.len)?;
                    let off = usize::try_from(h.arg).map_err(|_| wire::invalid("offset"))?;
                    let n = usize::try_from(h.arg2).map_err(|_| wire::invalid("length"))?;
                    let part = off
                        .checked_add(n)
                        .and_then(|end| buf.get(off..end))
                        .ok_or_else(|| wire::invalid("COPYIN beyond the buffer"))?;
                    wire::send(&mut *u, Header::new(wire::DATA, self.sock, 0, 0), part)?;
                }
                wire::REPLY => {
                    skip(&mut u, h.len)?;
                    return wire::to_io(h.arg).map(|n| n as usize);
                }
                _ => return Err(wire::invalid("unexpected message during WRITE")),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for RpcStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for RpcStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Discards a payload nobody asked for.
fn skip(u: &mut UnixStream, len: u32) -> io::Result<()> {
    io::copy(&mut (&*u).take(len as u64), &mut io::sink())?;
    Ok(())
}
