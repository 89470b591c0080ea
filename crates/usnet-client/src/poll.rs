//! Waiting on many sockets at once, like epoll: register a socket with a token and an
//! interest, then `wait` for events. Level-triggered by default; edge-triggered
//! registrations report a socket again only after its state changed (the server bumps
//! a per-socket event counter on every change). Readiness is read from the sockets'
//! slots; the wait sleeps on the session's bell, which the server rings after it
//! changed anything in the session.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use std::sync::atomic::Ordering::Acquire;
use std::sync::Arc;

use usnet_session_abi::{
    slot, FLAG_ACCEPTABLE, FLAG_CONNECTED, FLAG_ERROR, FLAG_ERRQUEUE, FLAG_HUP, FLAG_RX_EOF,
    FLAG_SNDBUF, FLAG_WRITABLE, KIND_ICMP, KIND_UDP, SLOT_OPEN,
};

use crate::conn::Conn;
use crate::sock::ClientSocket;
use crate::{TcpListener, TcpStream, UdpSocket};

/// The caller's name for a registration.
pub type Token = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    pub readable: bool,
    pub writable: bool,
}

impl Interest {
    pub const READABLE: Interest = Interest {
        readable: true,
        writable: false,
    };
    pub const WRITABLE: Interest = Interest {
        readable: false,
        writable: true,
    };
    pub const BOTH: Interest = Interest {
        readable: true,
        writable: true,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Level,
    Edge,
}

/// One ready socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub token: Token,
    pub readable: bool,
    pub writable: bool,
    /// Hung up or failed (reads return 0 or the error).
    pub closed: bool,
    /// The peer will send no more (its FIN, or the connection is gone): Linux's
    /// `POLLRDHUP`.
    pub rdhup: bool,
    /// An error waits to be reported (`SO_ERROR`): Linux's `POLLERR`.
    pub error: bool,
}

mod sealed {
    /// Sockets a poller can watch (sealed: only this crate's socket types).
    pub trait Sealed {
        fn sock(&self) -> &crate::sock::ClientSocket;
    }
}

/// Something a poller can watch: [`TcpStream`], [`TcpListener`], [`UdpSocket`].
pub trait Source: sealed::Sealed {}

impl sealed::Sealed for TcpStream {
    fn sock(&self) -> &ClientSocket {
        &self.sock
    }
}
impl Source for TcpStream {}

impl sealed::Sealed for TcpListener {
    fn sock(&self) -> &ClientSocket {
        &self.sock
    }
}
impl Source for TcpListener {}

impl sealed::Sealed for UdpSocket {
    fn sock(&self) -> &ClientSocket {
        &self.sock
    }
}
impl Source for UdpSocket {}

struct Reg {
    conn: Arc<Conn>,
    slot: u32,
    gen: u32,
    interest: Interest,
    mode: Mode,
    /// Edge mode: the event counter when last reported.
    seen: Option<u32>,
}

/// An epoll-like readiness poller over one client's sockets.
#[derive(Default)]
pub struct Poller {
    regs: HashMap<Token, Reg>,
}

/// A registration's readiness, read from its slot in shared memory (the ring
/// counters give what is queued each way): (readable, writable, closed, events).
/// `None` once the slot was closed or given to another socket.
/// What a slot says now.
struct Readiness {
    readable: bool,
    writable: bool,
    closed: bool,
    rdhup: bool,
    error: bool,
    events: u32,
}

/// Whether a socket with flags `f` and `tx_queued` of its `size`-byte send ring
/// taken would accept a write: a connection whose send buffer bounds its writes
/// (`FLAG_SNDBUF`) when the stack would take one, any other when its ring has room.
pub(crate) fn send_room(f: u32, tx_queued: u64, size: u64) -> bool {
    if f & FLAG_SNDBUF != 0 {
        f & FLAG_WRITABLE != 0
    } else {
        tx_queued < size
    }
}

fn readiness(r: &Reg) -> Option<Readiness> {
    let m = &r.conn.mem;
    let w = |off| m.slot_word(r.slot, off).load(Acquire);
    if w(slot::GEN) != r.gen || w(slot::STATE) != SLOT_OPEN {
        return None;
    }
    let events = w(slot::EVENTS);
    if r.conn.known_dead() {
        // The stack is gone: every socket reads as reset (POLLIN, POLLOUT,
        // POLLHUP, POLLERR), so a program's wait ends and its calls learn
        // ENETDOWN, while the kernel descriptors in the same wait (a signal's
        // self-pipe) are still looked at.
        return Some(Readiness {
            readable: true,
            writable: true,
            closed: true,
            rdhup: true,
            error: true,
            // A value of its own, so edge-triggered waits report the death once.
            events: events ^ 1 << 31,
        });
    }
    let q = |prod, cons| {
        let p = m.slot_u64(r.slot, prod).load(Acquire);
        let c = m.slot_u64(r.slot, cons).load(Acquire);
        p.wrapping_sub(c)
    };
    let f = w(slot::FLAGS);
    let closed = f & (FLAG_HUP | FLAG_ERROR) != 0;
    let rx_queued = q(slot::RX_PROD, slot::RX_CONS);
    let tx_queued = q(slot::TX_PROD, slot::TX_CONS);
    let size = m.geometry().ring_bytes as u64;
    let readable = rx_queued > 0 || f & (FLAG_RX_EOF | FLAG_ACCEPTABLE) != 0 || closed;
    let datagrams = matches!(w(slot::KIND) as u64, KIND_UDP | KIND_ICMP);
    let can_send = f & FLAG_CONNECTED != 0 || datagrams;
    let writable = closed || (can_send && send_room(f, tx_queued, size));
    Some(Readiness {
        readable,
        writable,
        closed,
        rdhup: closed || f & FLAG_RX_EOF != 0,
        // A datagram socket's pending ICMP error is its ERROR word alone.
        error: (f & FLAG_ERROR != 0 || datagrams) && w(slot::ERROR) != 0
            || f & FLAG_ERRQUEUE != 0
            || r.conn
                .zc_pending(r.slot, m.slot_u64(r.slot, slot::TX_ACKED).load(Acquire)),
        events,
    })
}

impl Reg {
    /// The event to report now, if any (edge mode: only after a change).
    fn check(&self, token: Token) -> Option<(Event, u32)> {
        let Readiness {
            readable: r,
            writable: w,
            closed,
            rdhup,
            error,
            events: ev,
        } = readiness(self)?;
        if !r && self.interest.readable {
            // Waiting to read a shared stream another holder receives: ask for it.
            self.conn.want_stream(self.slot);
        }
        if self.mode == Mode::Edge && self.seen == Some(ev) {
            return None;
        }
        let r = r && self.interest.readable;
        let w = w && self.interest.writable;
        (r || w || closed || error).then_some((
            Event {
                token,
                readable: r,
                writable: w,
                closed,
                rdhup,
                error,
            },
            ev,
        ))
    }
}

impl Poller {
    pub fn new() -> Poller {
        Poller::default()
    }

    /// Registrations held.
    pub fn len(&self) -> usize {
        self.regs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regs.is_empty()
    }

    pub fn register(
        &mut self,
        src: &dyn Source,
        token: Token,
        interest: Interest,
        mode: Mode,
    ) -> io::Result<()> {
        if self.regs.contains_key(&token) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        let s = src.sock();
        self.regs.insert(
            token,
            Reg {
                conn: s.conn.clone(),
                slot: s.slot,
                gen: s.word(slot::GEN),
                interest,
                mode,
                seen: None,
            },
        );
        Ok(())
    }

    pub fn modify(&mut self, token: Token, interest: Interest, mode: Mode) -> io::Result<()> {
        let r = self.regs.get_mut(&token).ok_or(io::ErrorKind::NotFound)?;
        r.interest = interest;
        r.mode = mode;
        r.seen = None;
        Ok(())
    }

    pub fn deregister(&mut self, token: Token) -> io::Result<()> {
        self.regs
            .remove(&token)
            .map(|_| ())
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }

    /// Sleeps until a registered socket may be ready, one of `kernel` (kernel
    /// descriptors) has events, or `timeout` passes, in one `poll(2)` (see
    /// `Conn::sleep_with_kernel`). Reports no socket events itself, so none is
    /// marked as seen: the caller looks at both sides again. Returns how many of
    /// `kernel` have events.
    pub fn sleep_with_kernel(
        &self,
        kernel: &mut [libc::pollfd],
        timeout: Duration,
    ) -> io::Result<usize> {
        let Some(conn) = self.regs.values().next().map(|r| r.conn.clone()) else {
            let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            // SAFETY: `kernel` is a valid array of pollfd for the call.
            let n = unsafe { libc::poll(kernel.as_mut_ptr(), kernel.len() as libc::nfds_t, ms) };
            return Ok(n.max(0) as usize);
        };
        let regs = &self.regs;
        conn.sleep_with_kernel(kernel, timeout, || {
            regs.iter().any(|(&t, r)| r.check(t).is_some())
        })
    }

    /// Waits until a registered socket is ready or `timeout` passes, appends the ready
    /// ones to `events` and returns how many. A closed socket's registration stays
    /// until deregistered and reports nothing.
    pub fn wait(
        &mut self,
        events: &mut Vec<Event>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.wait_inner(events, timeout, false)
    }

    /// [`Poller::wait`] for a poller no other thread changes while it waits (a
    /// `poll(2)`'s own): with one socket registered, the thread sleeps on that
    /// socket's slot (`Conn::wait_until_on`), so the server wakes it for that
    /// socket's news only. (An epoll set's poller is not private: an
    /// `epoll_ctl` from another thread wakes its sleeper through the session's
    /// bell.)
    pub fn wait_private(
        &mut self,
        events: &mut Vec<Event>,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.wait_inner(events, timeout, true)
    }

    fn wait_inner(
        &mut self,
        events: &mut Vec<Event>,
        timeout: Option<Duration>,
        private: bool,
    ) -> io::Result<usize> {
        let deadline = timeout.map(|t| crate::vtime::now() + t);
        loop {
            let before = events.len();
            for (&token, reg) in self.regs.iter_mut() {
                if let Some((e, ev)) = reg.check(token) {
                    reg.seen = Some(ev);
                    events.push(e);
                }
            }
            if events.len() > before {
                return Ok(events.len() - before);
            }
            let Some(conn) = self.regs.values().next().map(|r| r.conn.clone()) else {
                // Nothing registered: just wait out the timeout.
                if let Some(t) = timeout {
                    crate::vtime::sleep(t);
                }
                return Ok(0);
            };
            let regs = &self.regs;
            let any = || regs.iter().any(|(&t, r)| r.check(t).is_some());
            let alone = match regs.values().next() {
                Some(r) if private && regs.len() == 1 => Some(r.slot),
                _ => None,
            };
            if !conn.wait_until_on(alone, deadline, false, any)? {
                return Ok(0);
            }
        }
    }
}
