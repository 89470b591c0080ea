//! Relays: a usnet socket (in this process, through usnet-posix) standing behind
//! the Unix socket end installed in the program.
//!
//! A stream relay moves bytes both ways with two threads; its program end carries
//! the data, so the program's read/write/epoll/close act on it natively. A
//! listener's or datagram socket's program end carries one "readable" byte (the
//! token) while the usnet socket has something to take, so the program's
//! poll/epoll see the truth; the data itself moves in the notified calls.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use usnet_posix as posix;

use crate::threads::Threads;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Stream,
    Dgram,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Fresh,
    Connecting,
    Connected,
    Listening,
}

pub struct Relay {
    pub kind: Kind,
    pub domain: i32,
    /// The usnet socket (a usnet-posix descriptor of this process).
    pub usnet: RawFd,
    /// This process's end of the pair.
    pub ours: OwnedFd,
    /// The number the program's end was installed at (-1 before), given back to
    /// its range when the relay is forgotten.
    pub number: AtomicI32,
    pub state: Mutex<State>,
    /// Whether the token byte is in the program end's queue.
    token: Mutex<bool>,
    token_taken: Condvar,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = posix::close(self.usnet);
    }
}

const STACK: usize = 128 * 1024;

impl Relay {
    pub fn new(kind: Kind, domain: i32, usnet: RawFd, ours: OwnedFd, state: State) -> Relay {
        Relay {
            kind,
            domain,
            usnet,
            ours,
            number: AtomicI32::new(-1),
            state: Mutex::new(state),
            token: Mutex::new(false),
            token_taken: Condvar::new(),
        }
    }

    fn usnet_readable(&self, timeout_ms: i32) -> bool {
        let mut p = [libc::pollfd {
            fd: self.usnet,
            events: libc::POLLIN,
            revents: 0,
        }];
        posix::poll(&mut p, timeout_ms).is_ok_and(|n| n > 0)
    }

    /// Waits up to `timeout_ms` for the usnet socket to be readable; true if it is
    /// or (a listener) the program closed its end. A listener's wait watches the
    /// program's end too, a kernel descriptor, so the close is seen at once and
    /// the port is free for the program's next bind (iperf3 closes its listener
    /// after each test and listens again); such a wait sleeps on the session's
    /// eventfd, which every server turn rings, a price paid by listeners only. A
    /// datagram socket waits on its own slot and sees the close within
    /// `timeout_ms` (a bind meanwhile is retried: `in_use_retried`).
    fn readable_or_closed(&self, timeout_ms: i32) -> bool {
        if *self.state.lock().unwrap_or_else(|p| p.into_inner()) != State::Listening {
            return self.usnet_readable(timeout_ms);
        }
        let mut p = [
            libc::pollfd {
                fd: self.usnet,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.ours.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        posix::poll(&mut p, timeout_ms).is_ok_and(|n| n > 0)
    }

    /// Whether the program has closed its end everywhere.
    pub(crate) fn program_gone(&self) -> bool {
        self.hung_up_within(0)
    }

    /// Whether our end of the pair reports it hung up (nothing more can move
    /// either way) within `timeout_ms` (-1: waits until it does, or fails).
    fn hung_up_within(&self, timeout_ms: i32) -> bool {
        loop {
            let mut p = [libc::pollfd {
                fd: self.ours.as_raw_fd(),
                events: 0,
                revents: 0,
            }];
            // SAFETY: one pollfd.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 1, timeout_ms) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return n > 0 && p[0].revents & libc::POLLHUP != 0;
        }
    }

    /// After a notified call took from the usnet socket (`theirs`: the program's
    /// end, as fetched for the call): takes the token back if nothing is left.
    pub fn settle_token(&self, theirs: RawFd) {
        if self.usnet_readable(0) {
            return;
        }
        let mut t = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if *t {
            let mut b = [0u8; 1];
            // SAFETY: a one-byte read, never blocking.
            unsafe { libc::recv(theirs, b.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
            *t = false;
            self.token_taken.notify_all();
        }
    }

    /// Keeps the token in step with the usnet socket until the program closes its
    /// end; then `gone` runs (it forgets the relay).
    pub fn watch_token(self: &Arc<Self>, gone: impl FnOnce() + Send + 'static) {
        let r = Arc::clone(self);
        let run = move || {
            loop {
                if r.program_gone() {
                    break;
                }
                if !r.readable_or_closed(200) {
                    continue;
                }
                if r.program_gone() {
                    break;
                }
                let mut t = r.token.lock().unwrap_or_else(|p| p.into_inner());
                if !*t {
                    // SAFETY: a one-byte send on our end.
                    let n = unsafe {
                        libc::send(
                            r.ours.as_raw_fd(),
                            [1u8].as_ptr().cast(),
                            1,
                            libc::MSG_NOSIGNAL,
                        )
                    };
                    if n == 1 {
                        *t = true;
                    }
                }
                while *t && !r.program_gone() {
                    t = r
                        .token_taken
                        .wait_timeout(t, Duration::from_millis(200))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            // The supervisor's map then holds the last reference: forgetting the
            // relay closes the usnet socket under the map's lock, so a bind that
            // looks for closed sockets still held never misses this one.
            drop(r);
            gone();
        };
        spawn(run);
    }

    /// Starts moving bytes between the program end and the usnet stream; `gone`
    /// runs when both directions are done.
    pub fn pump(self: &Arc<Self>, gone: impl FnOnce() + Send + 'static) {
        let up = Arc::clone(self);
        let down = Arc::clone(self);
        let gone = Arc::new(Mutex::new(Some(gone)));
        let gone2 = Arc::clone(&gone);
        let done = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let done2 = Arc::clone(&done);
        spawn(move || {
            up.program_to_usnet();
            if done.fetch_add(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                if let Some(g) = gone.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    g();
                }
            }
        });
        spawn(move || {
            down.usnet_to_program();
            if done2.fetch_add(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                if let Some(g) = gone2.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    g();
                }
            }
        });
    }

    fn program_to_usnet(&self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: reads into our buffer.
            let n =
                unsafe { libc::read(self.ours.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            if n <= 0 {
                // The program shut down its side (or closed it): FIN.
                let _ = posix::shutdown(self.usnet, libc::SHUT_WR);
                self.until_nothing_moves();
                return;
            }
            let mut sent = 0;
            while sent < n as usize {
                match posix::sendto(self.usnet, &buf[sent..n as usize], libc::MSG_NOSIGNAL, None) {
                    Ok(k) => sent += k,
                    Err(posix::Errno(libc::EINTR)) => {}
                    Err(_) => {
                        // The connection is gone: the program's reads end.
                        // SAFETY: plain shutdown of our end.
                        unsafe { libc::shutdown(self.ours.as_raw_fd(), libc::SHUT_RDWR) };
                        return;
                    }
                }
            }
        }
    }

    /// After the program's end read EOF: waits (in the kernel, costing nothing)
    /// until nothing more can move either way on the pair, that is until the
    /// program has closed its end everywhere or the other thread has ended its
    /// direction too; then, if the program is gone, ends the usnet socket's reading
    /// side, which wakes the other thread at once (it reads the end and leaves).
    /// So that thread need not look for the program's close on a timer, and an
    /// idle connection's two threads never wake.
    fn until_nothing_moves(&self) {
        if self.hung_up_within(-1) {
            let _ = posix::shutdown(self.usnet, libc::SHUT_RD);
        }
    }

    fn usnet_to_program(&self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // Either side can end it: data or FIN from the peer, or the program
            // closing its end everywhere (then the usnet socket closes with it).
            // The wait is on the usnet socket alone, so the server wakes this
            // thread for this connection's news only (a wait that also watched
            // the program's end, a kernel descriptor, would sleep on the session's
            // eventfd, and every turn would wake every relay's thread). The
            // program's close comes as the end of the usnet socket's reading side:
            // the other thread, which sees it first, shuts that side
            // (`until_nothing_moves`); the look on a timer is a backstop. Waking
            // once a second, 4,000 idle connections kept a third of a core busy.
            let mut p = [libc::pollfd {
                fd: self.usnet,
                events: libc::POLLIN,
                revents: 0,
            }];
            match posix::poll(&mut p, 30_000) {
                Err(posix::Errno(libc::EINTR)) => continue,
                Err(_) => return,
                Ok(0) => {
                    if self.program_gone() {
                        return;
                    }
                    continue;
                }
                Ok(_) => {}
            }
            let n = match posix::recvfrom(self.usnet, &mut buf, libc::MSG_DONTWAIT) {
                Ok((n, _)) => n,
                Err(posix::Errno(libc::EAGAIN | libc::EINTR)) => continue,
                Err(_) => 0,
            };
            if n == 0 {
                // SAFETY: plain shutdown of our end: the program reads EOF.
                unsafe { libc::shutdown(self.ours.as_raw_fd(), libc::SHUT_WR) };
                return;
            }
            let mut sent = 0;
            while sent < n {
                // SAFETY: sends from our buffer; blocks while the program's end is full.
                let k = unsafe {
                    libc::send(
                        self.ours.as_raw_fd(),
                        buf[sent..n].as_ptr().cast(),
                        n - sent,
                        libc::MSG_NOSIGNAL,
                    )
                };
                if k < 0 {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    return;
                }
                sent += k as usize;
            }
        }
    }
}

/// Relay threads; one whose relay ended waits this long for the next relay.
static THREADS: Threads = Threads::new(STACK, Duration::from_secs(10));

fn spawn(f: impl FnOnce() + Send + 'static) {
    THREADS.run(f).expect("a relay thread");
}
