//! `--api socket`: usnet's stack in the server's own thread. A
//! [`usnet_driver::Driver`] owns the stack, the device and the clock; each turn
//! takes frames in, does the protocol work, then runs the server's
//! [`StackApp::poll`] on the sockets the stack reported ready
//! ([`Stack::take_ready`]), then sends the frames out. Between turns with nothing
//! to do the loop sleeps on the device ([`Driver::wait`]), after spinning for
//! `spin_us` if asked.
//!
//! The loop ([`run`]) takes any [`StackApp`]: [`SocketServer`] serves through the
//! copying socket calls (`tcp_recv`/`tcp_send`); the zero-copy backend is another
//! `StackApp` in the same loop.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use usnet_driver::{Clock, Driver};
use usnet_link::Device;
use usnet_socket_api::SocketApi;
use usnet_stack::{SocketHandle, Stack};

use crate::conn::{Conn, Scratch, Status, Transport};
use crate::http::Responses;
use crate::{HttpdConfig, Stats};

/// A server that runs inside a driver's turn.
pub trait StackApp {
    /// The turn's application work; returns whether it did any (the loop then
    /// turns again at once instead of sleeping).
    fn poll(&mut self, stack: &mut Stack) -> bool;
    fn stats(&self) -> Stats;
}

/// Turns `driver` with `app` until `stop` is set (looked at least every 100 ms).
pub fn run<D: Device, C: Clock>(
    driver: &mut Driver<D, C>,
    app: &mut dyn StackApp,
    spin: Duration,
    stop: &AtomicBool,
) -> io::Result<Stats> {
    let mut window = usnet_driver::SpinWindow::new(spin);
    while !stop.load(Ordering::Relaxed) {
        let t = driver.turn_with(|st| app.poll(st))?;
        if t.busy() {
            window.worked();
            continue;
        }
        if !window.keep_polling() {
            driver.wait(Duration::from_millis(100))?;
        }
    }
    Ok(app.stats())
}

/// One connection's socket calls on the stack.
struct StackIo<'a> {
    stack: &'a mut Stack,
    h: u64,
}

impl Transport for StackIo<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        SocketApi::tcp_recv(self.stack, self.h, buf)
    }
    fn send(&mut self, data: &[u8]) -> io::Result<usize> {
        SocketApi::tcp_send(self.stack, self.h, data)
    }
    fn shutdown_write(&mut self) -> io::Result<()> {
        SocketApi::tcp_shutdown_write(self.stack, self.h)
    }
}

struct SConn {
    h: SocketHandle,
    conn: Conn,
}

/// The server on the stack's socket API.
pub struct SocketServer {
    resp: Responses,
    listener: SocketHandle,
    /// Indexed by the handle's slot (its low 32 bits).
    conns: Vec<Option<SConn>>,
    live: usize,
    /// Sockets to visit: reported ready, or with work left from an earlier turn.
    work: VecDeque<SocketHandle>,
    ready: Vec<SocketHandle>,
    batch: usize,
    max_conns: usize,
    scratch: Scratch,
    stats: Stats,
    next_sweep: Instant,
}

fn slot(h: SocketHandle) -> usize {
    h.raw() as u32 as usize
}

impl SocketServer {
    /// Listens on `cfg.bind` (every address of the stack by default) and `cfg.port`.
    pub fn start(stack: &mut Stack, cfg: &HttpdConfig) -> io::Result<SocketServer> {
        let resp = Responses::new(cfg.length, &cfg.headers)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let addr = SocketAddr::new(
            cfg.bind.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            cfg.port,
        );
        let listener = stack
            .tcp_listen(addr, 1024)
            .map_err(|e| io::Error::other(format!("listen on {addr}: {e}")))?;
        Ok(SocketServer {
            resp,
            listener,
            conns: Vec::new(),
            live: 0,
            work: VecDeque::new(),
            ready: Vec::new(),
            batch: cfg.batch.max(1),
            max_conns: cfg.max_conns.max(1),
            scratch: Scratch::default(),
            stats: Stats::default(),
            next_sweep: Instant::now(),
        })
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.live
    }

    /// Accepts up to a batch; returns whether the accept queue may hold more.
    fn accept(&mut self, stack: &mut Stack) -> bool {
        for _ in 0..self.batch {
            let h = match stack.tcp_accept(self.listener) {
                Ok(h) => h,
                Err(_) => return false,
            };
            if self.live >= self.max_conns {
                self.stats.refused += 1;
                let _ = stack.tcp_abort(h);
                continue;
            }
            let _ = stack.tcp_set_nodelay(h, true);
            let i = slot(h);
            if self.conns.len() <= i {
                self.conns.resize_with(i + 1, || None);
            }
            self.conns[i] = Some(SConn {
                h,
                conn: Conn::default(),
            });
            self.live += 1;
            self.stats.accepted += 1;
            // Input may have arrived before the accept (its readiness was reported
            // for a handle we did not know yet): look now.
            self.visit(stack, h);
        }
        true
    }

    fn close(&mut self, stack: &mut Stack, h: SocketHandle, failed: bool) {
        let i = slot(h);
        if self.conns.get(i).and_then(Option::as_ref).map(|c| c.h) != Some(h) {
            return;
        }
        self.conns[i] = None;
        self.live -= 1;
        self.stats.closed += 1;
        let r = if failed {
            stack.tcp_abort(h)
        } else {
            stack.tcp_close(h)
        };
        if r.is_err() {
            let _ = stack.close(h);
        }
    }

    fn visit(&mut self, stack: &mut Stack, h: SocketHandle) {
        let i = slot(h);
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if c.h != h {
            return;
        }
        let mut io = StackIo { stack, h: h.raw() };
        match c
            .conn
            .service(&mut io, &self.resp, &mut self.scratch, &mut self.stats)
        {
            Status::Idle | Status::Blocked => {}
            Status::More => self.work.push_back(h),
            Status::Done => self.close(stack, h, false),
            Status::Failed => self.close(stack, h, true),
        }
    }

    fn sweep(&mut self, stack: &mut Stack, now: Instant) {
        let expired: Vec<SocketHandle> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.conn.linger_deadline().is_some_and(|d| d <= now))
            .map(|c| c.h)
            .collect();
        for h in expired {
            self.close(stack, h, false);
        }
    }
}

impl StackApp for SocketServer {
    fn poll(&mut self, stack: &mut Stack) -> bool {
        stack.take_ready(&mut self.ready);
        self.work.extend(self.ready.drain(..));
        let mut did = false;
        for _ in 0..self.batch {
            let Some(h) = self.work.pop_front() else {
                break;
            };
            did = true;
            if h == self.listener {
                if self.accept(stack) {
                    self.work.push_back(h);
                }
            } else {
                self.visit(stack, h);
            }
        }
        if !self.work.is_empty() {
            did = true;
        }
        let now = Instant::now();
        if now >= self.next_sweep {
            self.sweep(stack, now);
            self.next_sweep = now + Duration::from_millis(200);
        }
        did
    }

    fn stats(&self) -> Stats {
        self.stats
    }
}
