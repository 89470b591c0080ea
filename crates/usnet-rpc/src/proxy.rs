//! The server side of the rpc transport: `usnet up --rpc` listens on
//! `<run dir>/<name>.rpc`; each connection is one client process, served by a thread
//! that owns a session with the stack server (through `usnet-client`, as any client)
//! and turns each message into the matching socket call. User data crosses the Unix
//! socket one copy request at a time, so a call costs what it cost the source
//! document's rump client: a round trip per call and one per MCLNUM clusters.
//!
//! The session the thread uses adds the ring transport's own (small) cost to every
//! call; `usnet bench server` measures that transport alone beside this one.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use usnet_client::{Client, TcpListener, TcpStream};

use crate::wire::{self, Header};
use crate::{Clusters, MAX_CLUSTER, MAX_CLUSTERS};

/// How often blocked threads look whether their client left or the proxy stops.
const SLICE: Duration = Duration::from_millis(100);
/// A client that started a message must finish it within this.
const MESSAGE_DEADLINE: Duration = Duration::from_secs(10);

/// The listening proxy; dropping it stops the listener (served connections end when
/// their client leaves or the stack goes).
pub struct Proxy {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The rpc socket of the stack whose control socket is `control`.
pub fn rpc_path(control: &Path) -> PathBuf {
    control.with_extension("rpc")
}

impl Proxy {
    /// Listens for rpc clients of the stack named `stack` (its control socket must
    /// exist: the proxy attaches to it like any client). Only the stack's owner may
    /// connect (mode 0600), or also members of `group` (0660): unlike the control
    /// socket (0666, gated by the server's peer-credential check), this one has no
    /// check of its own, so its mode is the gate.
    pub fn start(stack: &str, group: Option<u32>) -> io::Result<Proxy> {
        let path = rpc_path(&usnet_session::ctl::socket_path(stack));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(&path, None, Some(gid))?;
        }
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let stack = stack.to_string();
        let thread = std::thread::Builder::new()
            .name("usnet-rpc".into())
            .spawn(move || listen(listener, &stack, &stop2))?;
        Ok(Proxy {
            path,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // The listener wakes every SLICE: the join is bounded.
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn listen(listener: UnixListener, stack: &str, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((conn, _)) => {
                let stack = stack.to_string();
                let _ = std::thread::Builder::new()
                    .name("usnet-rpc-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve(conn, &stack) {
                            if e.kind() != io::ErrorKind::UnexpectedEof {
                                eprintln!("usnet rpc: client ended: {e}");
                            }
                        }
                    });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = usnet_shm::poll_fds(&[listener.as_fd()], SLICE);
            }
            Err(e) => {
                eprintln!("usnet rpc: accept: {e}");
                std::thread::sleep(SLICE);
            }
        }
    }
}

enum ProxySocket {
    Listener(TcpListener),
    Stream(TcpStream),
}

struct Conn {
    unix: UnixStream,
    client: Client,
    clusters: Clusters,
    socks: HashMap<u32, ProxySocket>,
    next: u32,
    buf: Vec<u8>,
}

/// Waits (idle, without a deadline: a client may hold its connection as long as it
/// likes) until the client sends something or leaves.
fn wait_message(unix: &UnixStream) -> io::Result<()> {
    while !usnet_shm::poll_fds(&[unix.as_fd()], SLICE)?.any() {}
    Ok(())
}

/// Whether the client hung up (checked while a call blocks on the stack).
fn hung_up(unix: &UnixStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(unix),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

fn serve(unix: UnixStream, stack: &str) -> io::Result<()> {
    unix.set_read_timeout(Some(MESSAGE_DEADLINE))?;
    unix.set_write_timeout(Some(MESSAGE_DEADLINE))?;
    let mut payload = Vec::new();
    wait_message(&unix)?;
    let h = wire::recv(&mut &unix, &mut payload)?;
    if h.op != wire::HELLO {
        return Err(wire::invalid("the first message must be HELLO"));
    }
    let clusters = Clusters {
        bytes: (h.arg as usize).clamp(512, MAX_CLUSTER),
        count: (h.arg2 as usize).clamp(1, MAX_CLUSTERS),
    };
    let client = match Client::attach(stack) {
        Ok(c) => c,
        Err(e) => {
            let r = wire::result(Err(e));
            wire::send(&mut &unix, Header::new(wire::REPLY, 0, r, 0), &[])?;
            return Ok(());
        }
    };
    wire::send(&mut &unix, Header::new(wire::REPLY, 0, 0, 0), &[])?;
    let mut c = Conn {
        buf: vec![0u8; clusters.bytes * clusters.count],
        unix,
        client,
        clusters,
        socks: HashMap::new(),
        next: 1,
    };
    loop {
        wait_message(&c.unix)?;
        let h = match wire::recv(&mut &c.unix, &mut payload) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let (r, extra) = c.call(h, &payload)?;
        wire::send(
            &mut &c.unix,
            Header::new(wire::REPLY, h.sock, r, 0),
            extra.as_bytes(),
        )?;
    }
}

fn addr(payload: &[u8]) -> io::Result<SocketAddr> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

fn ebadf() -> io::Error {
    io::Error::from_raw_os_error(libc::EBADF)
}

impl Conn {
    /// Serves one call; returns its result word and a payload for the reply. Errors
    /// are those of the rpc connection itself (the call's own go in the result).
    fn call(&mut self, h: Header, payload: &[u8]) -> io::Result<(i64, String)> {
        let mut extra = String::new();
        let r = match h.op {
            wire::LISTEN => addr(payload).and_then(|a| {
                let l = TcpListener::bind_with_backlog(&self.client, a, h.arg.max(1) as usize)?;
                Ok(self.add(ProxySocket::Listener(l)))
            }),
            wire::CONNECT => addr(payload).and_then(|a| {
                let s = TcpStream::connect_timeout(&self.client, a, Duration::from_secs(30))?;
                Ok(self.add(ProxySocket::Stream(s)))
            }),
            wire::ACCEPT => match self.accept(h.sock) {
                Ok((s, peer)) => {
                    extra = peer.to_string();
                    Ok(self.add(ProxySocket::Stream(s)))
                }
                Err(e) => Err(e),
            },
            wire::WRITE => return self.write(h).map(|r| (r, extra)),
            wire::READ => return self.read(h).map(|r| (r, extra)),
            wire::SHUTDOWN => match self.socks.get(&h.sock) {
                Some(ProxySocket::Stream(s)) => s
                    .shutdown(match h.arg {
                        0 => std::net::Shutdown::Read,
                        1 => std::net::Shutdown::Write,
                        _ => std::net::Shutdown::Both,
                    })
                    .map(|()| 0),
                _ => Err(ebadf()),
            },
            wire::CLOSE => match self.socks.remove(&h.sock) {
                Some(_) => Ok(0),
                None => Err(ebadf()),
            },
            _ => Err(io::Error::from_raw_os_error(libc::ENOSYS)),
        };
        Ok((wire::result(r), extra))
    }

    fn add(&mut self, s: ProxySocket) -> i64 {
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        self.socks.insert(id, s);
        id as i64
    }

    fn accept(&self, sock: u32) -> io::Result<(TcpStream, SocketAddr)> {
        let Some(ProxySocket::Listener(l)) = self.socks.get(&sock) else {
            return Err(ebadf());
        };
        l.set_nonblocking(true)?;
        loop {
            match l.accept() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if hung_up(&self.unix) || !self.client.is_alive() {
                        return Err(io::Error::from_raw_os_error(libc::ECONNABORTED));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                r => return r,
            }
        }
    }

    /// `WRITE(sock, total)`: fetch the caller's bytes one copy request (MCLNUM
    /// clusters) at a time and give each to the socket.
    fn write(&mut self, h: Header) -> io::Result<i64> {
        let total = h.arg.max(0) as usize;
        let chunk = self.clusters.bytes * self.clusters.count;
        let Some(ProxySocket::Stream(s)) = self.socks.get(&h.sock) else {
            return Ok(wire::result(Err(ebadf())));
        };
        s.set_write_timeout(Some(SLICE))?;
        let mut off = 0;
        while off < total {
            let n = chunk.min(total - off);
            wire::send(
                &mut &self.unix,
                Header::new(wire::COPYIN, h.sock, off as i64, n as i64),
                &[],
            )?;
            let d = wire::recv_into(&mut &self.unix, &mut self.buf[..n])?;
            if d.op != wire::DATA || d.len as usize != n {
                return Err(wire::invalid("expected DATA for COPYIN"));
            }
            if let Err(e) = write_all_watch(s, &self.buf[..n], &self.unix) {
                return Ok(if off > 0 {
                    off as i64
                } else {
                    wire::result(Err(e))
                });
            }
            off += n;
        }
        Ok(total as i64)
    }

    /// `READ(sock, max)`: what the socket has (waiting for at least one byte or end of
    /// stream), handed to the caller one copy request at a time.
    fn read(&mut self, h: Header) -> io::Result<i64> {
        let max = (h.arg.max(0) as usize).min(crate::MAX_READ);
        let chunk = self.clusters.bytes * self.clusters.count;
        let Some(ProxySocket::Stream(s)) = self.socks.get(&h.sock) else {
            return Ok(wire::result(Err(ebadf())));
        };
        s.set_read_timeout(Some(SLICE))?;
        let mut data = vec![0u8; max];
        let n = loop {
            match (&*s).read(&mut data) {
                Ok(n) => break n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if hung_up(&self.unix) {
                        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Ok(wire::result(Err(e))),
            }
        };
        let mut payload = Vec::new();
        for (i, part) in data[..n].chunks(chunk).enumerate() {
            wire::send(
                &mut &self.unix,
                Header::new(wire::COPYOUT, h.sock, (i * chunk) as i64, 0),
                part,
            )?;
            let a = wire::recv(&mut &self.unix, &mut payload)?;
            if a.op != wire::ACK {
                return Err(wire::invalid("expected ACK for COPYOUT"));
            }
        }
        Ok(n as i64)
    }
}

/// Writes all of `data`, giving up when the rpc client leaves.
fn write_all_watch(s: &TcpStream, mut data: &[u8], unix: &UnixStream) -> io::Result<()> {
    while !data.is_empty() {
        match (&*s).write(data) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EPIPE)),
            Ok(n) => data = &data[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if hung_up(unix) {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
