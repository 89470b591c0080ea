//! `--api zerocopy`: the same server on usnet's zero-copy rings
//! (`usnet_stack::zerocopy`, PASTE's shape). Each driver turn runs one
//! [`StackApp::poll`]:
//!
//! 1. `zc_sync` takes back the receive buffers handed back last time, queues the
//!    transmit slots and fills the receive ring;
//! 2. every receive slot is parsed **where it lies**, in the buffer the frame
//!    arrived in ([`Session::feed`] on the pool bytes), and handed back by advancing
//!    `head`;
//! 3. the answers owed are written into transmit buffers ([`Outq::fill`] at the
//!    buffer's headroom, pieces of one segment each, so each leaves in place with
//!    its headers written in front) and submitted; a FIN or a close follows as a
//!    slot flag;
//! 4. `zc_sync` again, so the frames leave at the end of this turn.
//!
//! Request bytes are never copied (a request cut by a segment boundary is kept in
//! the session, as in every backend); response bytes are written once, into the
//! buffer that goes on the wire.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use usnet_stack::zerocopy::{
    Slot, ZcPort, NO_BUF, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_MORE, SLOT_NEW, SLOT_SHUT_WR,
};
use usnet_stack::{SocketHandle, Stack};

use crate::conn::LINGER;
use crate::http::{Outq, Responses, Session};
use crate::socket::StackApp;
use crate::{HttpdConfig, Stats};

/// Slots per ring.
const RING_SLOTS: usize = 4096;

#[derive(Debug)]
struct ZConn {
    h: SocketHandle,
    session: Session,
    out: Outq,
    /// The client's FIN arrived.
    eof: bool,
    /// Our FIN is submitted (after the last answer): input is dropped until the
    /// client's FIN or this deadline.
    linger: Option<Instant>,
    /// In the list of connections with answers to write.
    queued: bool,
}

/// The server on the zero-copy rings.
pub struct ZcServer {
    resp: Responses,
    port: ZcPort,
    /// Indexed by the handle's slot (its low 32 bits).
    conns: Vec<Option<ZConn>>,
    live: usize,
    /// Connections with answers (or a FIN or close) to submit.
    writers: Vec<SocketHandle>,
    max_conns: usize,
    stats: Stats,
    next_sweep: Instant,
}

fn slot(h: SocketHandle) -> usize {
    h.raw() as u32 as usize
}

impl ZcServer {
    /// Listens on `cfg.bind` (every address by default) and `cfg.port` through a
    /// zero-copy port.
    pub fn start(stack: &mut Stack, cfg: &HttpdConfig) -> io::Result<ZcServer> {
        let resp = Responses::new(cfg.length, &cfg.headers)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let addr = SocketAddr::new(
            cfg.bind.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            cfg.port,
        );
        let mut port = stack.zc_port(RING_SLOTS, RING_SLOTS);
        stack
            .zc_listen(&mut port, addr, 1024)
            .map_err(|e| io::Error::other(format!("listen on {addr}: {e}")))?;
        Ok(ZcServer {
            resp,
            port,
            conns: Vec::new(),
            live: 0,
            writers: Vec::new(),
            max_conns: cfg.max_conns.max(1),
            stats: Stats::default(),
            next_sweep: Instant::now(),
        })
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.live
    }

    /// What the port counted (slots, bytes, refused slots).
    pub fn port_stats(&self) -> usnet_stack::zerocopy::ZcStats {
        self.port.stats()
    }

    fn conn_mut(&mut self, h: SocketHandle) -> Option<&mut ZConn> {
        self.conns
            .get_mut(slot(h))
            .and_then(Option::as_mut)
            .filter(|c| c.h == h)
    }

    fn mark_writer(&mut self, h: SocketHandle) {
        if let Some(c) = self.conn_mut(h) {
            if !c.queued {
                c.queued = true;
                self.writers.push(h);
            }
        }
    }

    /// Forgets a connection and submits its close (an abort is a close here: the
    /// stack resets a connection closed with unread data, as Linux does).
    fn close(&mut self, h: SocketHandle, failed: bool) -> bool {
        let i = slot(h);
        if self.conns.get(i).and_then(Option::as_ref).map(|c| c.h) != Some(h) {
            return true;
        }
        if !self.port.tx.push(Slot::new(h, NO_BUF, 0, 0, SLOT_CLOSE)) {
            return false;
        }
        self.conns[i] = None;
        self.live -= 1;
        self.stats.closed += 1;
        if failed {
            self.stats.resets += 1;
        }
        true
    }

    /// Handles the receive slots from `head` to `tail`, giving each buffer back.
    fn take_rx(&mut self, stack: &mut Stack) -> bool {
        let mut did = false;
        while self.port.rx.head != self.port.rx.tail {
            did = true;
            let s = *self.port.rx.slot(self.port.rx.head);
            let h = s.handle();
            if s.flags & SLOT_NEW != 0 {
                if self.live >= self.max_conns {
                    self.stats.refused += 1;
                    let _ = self.port.tx.push(Slot::new(h, NO_BUF, 0, 0, SLOT_CLOSE));
                } else {
                    let _ = stack.tcp_set_nodelay(h, true);
                    let i = slot(h);
                    if self.conns.len() <= i {
                        self.conns.resize_with(i + 1, || None);
                    }
                    self.conns[i] = Some(ZConn {
                        h,
                        session: Session::default(),
                        out: Outq::default(),
                        eof: false,
                        linger: None,
                        queued: false,
                    });
                    self.live += 1;
                    self.stats.accepted += 1;
                }
            } else if s.flags & SLOT_ERROR != 0 {
                let _ = self.close(h, true);
            } else if s.len > 0 {
                let stats = &mut self.stats;
                if let (Some(c), Some(bytes)) = (
                    self.conns
                        .get_mut(slot(h))
                        .and_then(Option::as_mut)
                        .filter(|c| c.h == h),
                    stack.zc_bytes(&self.port, &s),
                ) {
                    stats.rx_bytes += bytes.len() as u64;
                    if c.linger.is_none() {
                        let before = (c.session.requests, c.session.errors);
                        c.session.feed(bytes, &mut c.out);
                        stats.requests += c.session.requests - before.0;
                        stats.bad_requests += c.session.errors - before.1;
                    }
                }
                self.mark_writer(h);
            } else if s.flags & SLOT_EOF != 0 {
                if let Some(c) = self.conn_mut(h) {
                    c.eof = true;
                    c.session.end_of_input();
                }
                self.mark_writer(h);
            }
            self.port.rx.head = self.port.rx.next(self.port.rx.head);
        }
        did
    }

    /// Writes the answers owed into transmit buffers; then a FIN after the last
    /// answer, a close after the client's FIN. Connections the ring or the pool
    /// could not take stay listed for the next turn.
    fn write_answers(&mut self, stack: &mut Stack) {
        let head = stack.zc_headroom() as usize;
        let writers = std::mem::take(&mut self.writers);
        for h in writers {
            let Ok(piece) = stack.zc_piece_len(h) else {
                // The socket is gone (reset and reaped): forget it.
                let _ = self.close(h, true);
                continue;
            };
            let resp = &self.resp;
            let Some(c) = self
                .conns
                .get_mut(slot(h))
                .and_then(Option::as_mut)
                .filter(|c| c.h == h)
            else {
                continue;
            };
            let mut blocked = false;
            while !c.out.is_empty() {
                if self.port.tx.tx_space() < 2 {
                    blocked = true;
                    break;
                }
                let Some(b) = stack.zc_alloc(&mut self.port) else {
                    blocked = true;
                    break;
                };
                let buf = stack.zc_buf_mut(&self.port, b).expect("just allocated");
                let n = c.out.fill(resp, &mut buf[head..head + piece as usize]);
                let done = c.out.advance(resp, n);
                self.stats.responses += done as u64;
                self.stats.tx_bytes += n as u64;
                let more = if c.out.is_empty() { 0 } else { SLOT_MORE };
                self.port
                    .tx
                    .push(Slot::new(h, b, head as u32, n as u32, more));
            }
            if !blocked && c.session.is_closing() && c.linger.is_none() {
                if self.port.tx.push(Slot::new(h, NO_BUF, 0, 0, SLOT_SHUT_WR)) {
                    c.linger = Some(Instant::now() + LINGER);
                } else {
                    blocked = true;
                }
            }
            if !blocked && c.eof && c.out.is_empty() {
                blocked = !self.close(h, false);
            }
            if let Some(c) = self.conn_mut(h) {
                c.queued = blocked;
            }
            if blocked {
                self.writers.push(h);
            }
        }
    }

    /// One exchange with the stack; transmit slots it refused (the connection
    /// failed) give their buffers back.
    fn sync(&mut self, stack: &mut Stack) {
        let from = self.port.tx.tail;
        stack.zc_sync(&mut self.port);
        let mut i = from;
        while i != self.port.tx.tail {
            let s = *self.port.tx.slot(i);
            if s.flags & SLOT_ERROR != 0 && s.buf != NO_BUF {
                let _ = stack.zc_free(&mut self.port, s.buf);
            }
            i = self.port.tx.next(i);
        }
    }

    fn sweep(&mut self, now: Instant) {
        let expired: Vec<SocketHandle> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.linger.is_some_and(|d| d <= now))
            .map(|c| c.h)
            .collect();
        for h in expired {
            let _ = self.close(h, false);
        }
    }

    /// Closes every connection and gives the port back (buffers included).
    pub fn shutdown(self, stack: &mut Stack) {
        stack.zc_close_port(self.port);
    }
}

impl StackApp for ZcServer {
    fn poll(&mut self, stack: &mut Stack) -> bool {
        self.sync(stack);
        let did = self.take_rx(stack);
        self.write_answers(stack);
        let now = Instant::now();
        if now >= self.next_sweep {
            self.sweep(now);
            self.next_sweep = now + Duration::from_millis(200);
        }
        if self.port.tx.tail != self.port.tx.head {
            self.sync(stack);
        }
        did || !self.writers.is_empty()
    }

    fn stats(&self) -> Stats {
        self.stats
    }
}
