//! `--api kernel`: Linux sockets with epoll, one thread (phttpd's socket mode and
//! the shape of nginx's worker). Level-triggered: a connection is watched for
//! input, or for output while its answers wait for room in the send buffer.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::conn::{Conn, Scratch, Status, Transport};
use crate::http::Responses;
use crate::{HttpdConfig, Stats};

impl Transport for TcpStream {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }
    fn send(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write(data)
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// An epoll instance, closed on drop.
struct Epoll(i32);

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll(fd))
    }

    fn ctl(&self, op: i32, fd: i32, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; the
        // kernel checks both descriptors.
        let r = unsafe { libc::epoll_ctl(self.0, op, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, evs: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        // SAFETY: `evs` is valid, writable memory for `evs.len()` events.
        let n = unsafe {
            libc::epoll_wait(
                self.0,
                evs.as_mut_ptr(),
                evs.len().min(i32::MAX as usize) as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

const IN: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
const OUT: u32 = libc::EPOLLOUT as u32;

struct KConn {
    stream: TcpStream,
    conn: Conn,
    /// Watched for output (answers wait), not input.
    out: bool,
}

/// The server: a listening socket and its connections.
pub struct KernelServer {
    listener: TcpListener,
    ep: Epoll,
    resp: Responses,
    /// Indexed by descriptor.
    conns: Vec<Option<KConn>>,
    live: usize,
    batch: usize,
    max_conns: usize,
    scratch: Scratch,
    stats: Stats,
}

impl KernelServer {
    /// Listens on `cfg.bind` (every address, IPv6 and IPv4, by default) and `cfg.port`.
    pub fn bind(cfg: &HttpdConfig) -> io::Result<KernelServer> {
        let resp = Responses::new(cfg.length, &cfg.headers)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let addr = SocketAddr::new(
            cfg.bind.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            cfg.port,
        );
        let listener = match TcpListener::bind(addr) {
            // A kernel without IPv6: every IPv4 address.
            Err(_) if cfg.bind.is_none() => {
                TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], cfg.port)))?
            }
            r => r?,
        };
        listener.set_nonblocking(true)?;
        let ep = Epoll::new()?;
        ep.ctl(
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            libc::EPOLLIN as u32,
        )?;
        Ok(KernelServer {
            listener,
            ep,
            resp,
            conns: Vec::new(),
            live: 0,
            batch: cfg.batch.max(1),
            max_conns: cfg.max_conns.max(1),
            scratch: Scratch::default(),
            stats: Stats::default(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    fn accept(&mut self) {
        for _ in 0..self.batch {
            let s = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(_) => return,
            };
            if self.live >= self.max_conns {
                self.stats.refused += 1;
                continue;
            }
            let fd = s.as_raw_fd();
            if s.set_nonblocking(true).is_err()
                || s.set_nodelay(true).is_err()
                || self.ep.ctl(libc::EPOLL_CTL_ADD, fd, IN).is_err()
            {
                continue;
            }
            let fd = fd as usize;
            if self.conns.len() <= fd {
                self.conns.resize_with(fd + 1, || None);
            }
            self.conns[fd] = Some(KConn {
                stream: s,
                conn: Conn::default(),
                out: false,
            });
            self.live += 1;
            self.stats.accepted += 1;
        }
    }

    fn close(&mut self, fd: usize) {
        if let Some(k) = self.conns.get_mut(fd).and_then(Option::take) {
            // Closing the descriptor takes it out of the epoll set.
            drop(k);
            self.live -= 1;
            self.stats.closed += 1;
        }
    }

    /// Serves connection `fd`; returns whether it wants another visit soon.
    fn visit(&mut self, fd: usize) -> bool {
        let Some(k) = self.conns.get_mut(fd).and_then(Option::as_mut) else {
            return false;
        };
        let st = k.conn.service(
            &mut k.stream,
            &self.resp,
            &mut self.scratch,
            &mut self.stats,
        );
        let want_out = st == Status::Blocked;
        match st {
            Status::Done | Status::Failed => {
                self.close(fd);
                false
            }
            _ => {
                if want_out != k.out {
                    k.out = want_out;
                    let ev = if want_out { OUT } else { IN };
                    let _ = self.ep.ctl(libc::EPOLL_CTL_MOD, fd as i32, ev);
                }
                st == Status::More
            }
        }
    }

    /// Closes connections whose linger deadline passed.
    fn sweep(&mut self, now: Instant) {
        let expired: Vec<usize> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(fd, k)| {
                k.as_ref()
                    .and_then(|k| k.conn.linger_deadline())
                    .filter(|d| *d <= now)
                    .map(|_| fd)
            })
            .collect();
        for fd in expired {
            self.close(fd);
        }
    }

    /// Serves until `stop` is set (looked at least every 100 ms).
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<Stats> {
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; self.batch];
        let lfd = self.listener.as_raw_fd() as u64;
        let mut again: Vec<usize> = Vec::new();
        let mut next_sweep = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let timeout = if again.is_empty() { 100 } else { 0 };
            let n = self.ep.wait(&mut evs, timeout)?;
            let mut more = Vec::new();
            for ev in &evs[..n] {
                let fd = ev.u64;
                if fd == lfd {
                    self.accept();
                } else if self.visit(fd as usize) {
                    more.push(fd as usize);
                }
            }
            for fd in again.drain(..) {
                if self.visit(fd) {
                    more.push(fd);
                }
            }
            again = more;
            let now = Instant::now();
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + Duration::from_millis(200);
            }
        }
        Ok(self.stats)
    }
}
