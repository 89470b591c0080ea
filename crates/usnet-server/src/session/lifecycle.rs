//! How a slot and a session end: a closed slot's stack socket closed once its send
//! ring is drained, a dead client's sockets closed (or reset) and its slots given
//! back, and a panic while serving one client kept to that client's session.

use std::sync::atomic::Ordering::*;

use usnet_session_abi::{slot, SLOT_FREE};
use usnet_stack::{SocketHandle, Stack};

use super::{calls::unbind, Role, ServerSession};

/// What a departed client leaves for the loop ([`ServerSession::depart`]).
pub struct Departure {
    /// The stack sockets it shared with other sessions: the stream bytes it left
    /// unread (for the next receiver), and whether it still held the socket when it
    /// went (a last holder that died resets; one that had closed it closes).
    pub shared: Vec<(SocketHandle, Vec<u8>, bool)>,
    /// Group listeners its last requests made or named (`ServerSession::joined`,
    /// not yet seen by the loop): the loop counts it among their holders before
    /// it lets go of `shared`, or the last holder's departure would leave them open.
    pub joined: Vec<SocketHandle>,
    /// Connections it left still draining their send rings: the session must be
    /// kept ([`ServerSession::drain_closing`]) until they are done.
    pub draining: bool,
}

impl ServerSession {
    /// [`ServerSession::serve`] and [`ServerSession::drain_all`], with a panic kept
    /// inside this session: a broken invariant that one client's requests reach (a
    /// bug) ends that client's session, not the server and every other client's
    /// connections. `Err` carries the panic's message; the session is then marked
    /// `broken` and its owner removes it. Best effort, as a kernel oops that kills one
    /// process is: the stack's state is as the panic left it, so the panic is
    /// reported loudly (`sessions_broken` in `usnet stat`, a line on stderr).
    pub fn serve_contained(&mut self, stack: &mut Stack, budget: usize) -> Result<usize, String> {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let n = self.serve_requests(stack, budget);
            self.drain_all(stack);
            n
        }));
        r.map_err(|p| {
            self.broken = true;
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into())
        })
    }

    /// The client closed slot `i` and its send ring is empty: close the stack socket
    /// and give the slot back.
    pub(super) fn finish_close(&mut self, stack: &mut Stack, i: u32) {
        // The slot's rings are about to be reused: a connection sending from one
        // keeps what it still holds in a buffer of its own, and one receiving into
        // the other stops.
        self.unlend(stack, i);
        self.end_direct_rx(stack, i);
        let Some(mut s) = self.socks[i as usize].take() else {
            return;
        };
        unbind(stack, &mut s);
        if let (Some(h), true) = (s.handle, s.shared) {
            // Other sessions may hold it: the loop decides (`Loop::release_shared`).
            self.by_handle.remove(&h);
            let mut s = s;
            let left = Self::salvage(&mut s, &mut self.stats);
            self.released.push((h, left));
        } else if let Some(h) = s.handle {
            self.by_handle.remove(&h);
            let mut s = s;
            // Received bytes the client never read (in its ring, or carried): the
            // kernel answers such a close with a reset (RFC 2525 §2.17), and so do we.
            let unread = s.role == Role::Conn
                && (!s.carry.is_empty() || s.rx.free().is_ok_and(|f| f < s.rx.size()));
            if unread {
                let _ = stack.tcp_abort(h);
            } else {
                // The client closed it: the close goes on gracefully even if the
                // client exits now (as the kernel's orphaned sockets do), so the
                // socket is no longer the client's (`depart` closes what a client
                // leaves open the same way).
                let _ = stack.set_owner(h, usnet_stack::Owner::LOCAL);
                let _ = stack.close(h);
            }
        }
        self.mem.slot_word(i, slot::STATE).store(SLOT_FREE, Release);
        self.bump(i);
        self.free.push(i);
    }

    /// The client is gone, and its process closed every descriptor, as the kernel
    /// closes a process's sockets when it exits (a program may exit without closing
    /// them; socat does). So each TCP connection it held closes as after `close`:
    /// what its send ring still holds goes out first (those bytes were written, and
    /// the kernel sends what is in a closed socket's buffer), then a FIN, or an RST
    /// if received data was left unread; a connection with bytes left stops being
    /// the client's and keeps draining ([`ServerSession::drain_closing`]).
    /// Everything else the client held (listeners, datagram sockets) is closed and
    /// given back. Returns whether any connection is still draining.
    pub fn close_dead(&mut self, stack: &mut Stack) -> bool {
        let mut draining = false;
        for i in 0..self.socks.len() {
            let Some(x) = self.socks[i].as_mut() else {
                continue;
            };
            match x.handle {
                Some(h) if x.role == Role::Conn => {
                    x.closing = true;
                    self.end_direct_rx(stack, i as u32);
                    let x = self.socks[i].as_mut().expect("looked at it");
                    if x.tx.available().unwrap_or(0) > 0 {
                        let _ = stack.set_owner(h, usnet_stack::Owner::LOCAL);
                        x.tx_active = true;
                        if !self.active.contains(&(i as u32)) {
                            self.active.push(i as u32);
                        }
                        draining = true;
                    } else {
                        self.finish_close(stack, i as u32);
                    }
                }
                _ => self.socks[i] = None,
            }
        }
        let socks = &self.socks;
        self.by_handle.retain(|_, i| socks[*i as usize].is_some());
        self.active.retain(|i| socks[*i as usize].is_some());
        self.rx_again.clear();
        stack.close_owner(self.owner());
        draining
    }

    /// The stack sockets the session's slots still name.
    pub fn handles(&self) -> Vec<SocketHandle> {
        self.socks
            .iter()
            .flatten()
            .filter_map(|s| s.handle)
            .collect()
    }

    /// After [`ServerSession::close_dead`]: moves what the closed sockets' send
    /// rings still hold into the stack (each closes gracefully once its ring is
    /// empty). Returns whether any is still draining, and whether bytes moved.
    pub fn drain_closing(&mut self, stack: &mut Stack) -> (bool, bool) {
        let before = self.stats.bytes_in;
        self.drain_all(stack);
        (
            self.socks.iter().any(Option::is_some),
            self.stats.bytes_in != before,
        )
    }

    /// The client is gone (its process closed every descriptor): what it had
    /// already submitted is served, its own connections close
    /// ([`ServerSession::close_dead`]), and what it shared with other sessions is
    /// handed back for the loop to release. The one sequence `Loop::remove_session`
    /// and the fuzzing harness both run.
    pub fn depart(&mut self, stack: &mut Stack, budget: usize) -> Departure {
        // A broken session's requests are not run again: its sockets are only reset.
        if !self.broken {
            self.serve_requests(stack, budget);
            self.drain_all(stack);
        }
        let released = std::mem::take(&mut self.released);
        let closed = released.len();
        let mut shared = Vec::with_capacity(closed);
        for (k, (h, left)) in released.into_iter().chain(self.take_shared()).enumerate() {
            shared.push((h, left, k >= closed));
        }
        let draining = self.close_dead(stack);
        let joined = std::mem::take(&mut self.joined);
        Departure {
            shared,
            joined,
            draining,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::*;

    use usnet_session_abi::{
        errno, op, slot, SockAddr, FLAG_ERROR, FLAG_RX_EOF, KIND_TCP, KIND_UDP, SLOT_FREE,
    };
    use usnet_stack::Owner;

    use crate::fuzzing::{Harness, ADDR};

    const TCP: [u64; 6] = [KIND_TCP, 0, 0, 0, 0, 0];

    fn at(port: u16) -> [u64; 6] {
        let a = SockAddr::from_std((ADDR, port).into()).to_args();
        [a[0], a[1], a[2], a[3], 0, 0]
    }

    fn flags(h: &Harness, i: u32) -> u32 {
        h.mem().slot_word(i, slot::FLAGS).load(Acquire)
    }

    /// Session 2's slot 0 listens on `port` and its slot 1 is the connection from
    /// session 1's slot 0.
    fn across(h: &mut Harness, port: u16) {
        h.add_session(2);
        h.target(2);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 0);
        assert_eq!(h.call(op::BIND, 0, at(port)), 0);
        assert_eq!(h.call(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]), 0);
        h.target(1);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 0);
        assert_eq!(h.call(op::CONNECT, 0, at(port)), 0);
        for _ in 0..4 {
            h.turn();
        }
        h.target(2);
        assert_eq!(h.call(op::ACCEPT, 0, [0; 6]), 1);
    }

    /// A closed connection's slot is given back once what its send ring held went
    /// out, followed by a FIN (not a reset), and the next socket takes the slot.
    #[test]
    fn a_closed_slot_is_given_back_after_its_bytes_went_out() {
        let mut h = Harness::new();
        h.connected_pair(7130);
        h.send_bytes(1, &[3u8; 3000]);
        assert_eq!(h.call(op::CLOSE, 1, [0; 6]), 0);
        let mut got = Vec::new();
        for _ in 0..8 {
            h.turn();
            got.extend(h.recv(2));
        }
        assert_eq!(got, vec![3u8; 3000]);
        assert_ne!(flags(&h, 2) & FLAG_RX_EOF, 0, "a FIN");
        assert_eq!(flags(&h, 2) & FLAG_ERROR, 0, "not a reset");
        assert_eq!(h.mem().slot_word(1, slot::STATE).load(Acquire), SLOT_FREE);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 1, "the slot is reused");
        h.finish();
    }

    /// A client dies with received bytes unread: its connection is reset (as the
    /// kernel's close does), its datagram socket's port is free again, and it holds
    /// no stack socket.
    #[test]
    fn a_dead_client_with_unread_bytes_resets_and_lets_go_of_everything() {
        let mut h = Harness::new();
        across(&mut h, 7131);
        h.target(1);
        assert_eq!(h.call(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]), 1);
        assert_eq!(h.call(op::BIND, 1, at(7132)), 0);
        h.target(2);
        h.send_bytes(1, b"never read");
        h.submit(&usnet_session_abi::Request {
            op: op::TX_KICK,
            slot: 1,
            ..Default::default()
        });
        for _ in 0..4 {
            h.turn();
        }
        h.remove(1);
        assert!(h.stack().sockets_of(Owner(1)).is_empty());
        for _ in 0..4 {
            h.turn();
        }
        assert_ne!(flags(&h, 1) & FLAG_ERROR, 0, "the peer was reset");
        let e = h.mem().slot_word(1, slot::ERROR).load(Acquire);
        assert_eq!(i64::from(e), errno::ECONNRESET);
        assert_eq!(h.call(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]), 2);
        assert_eq!(h.call(op::BIND, 2, at(7132)), 0, "the dead client's port");
        h.finish();
    }

    /// A client dies with bytes in its send ring the server had not taken yet: they
    /// still go out (the kernel sends a closed socket's buffer), then a FIN.
    #[test]
    fn a_dead_clients_unsent_bytes_go_out_before_its_fin() {
        let mut h = Harness::new();
        across(&mut h, 7133);
        h.target(1);
        // No kick: the server has not looked at the ring when the client dies.
        h.send_bytes(0, &[9u8; 3000]);
        h.remove(1);
        let mut got = Vec::new();
        for _ in 0..8 {
            h.turn();
            got.extend(h.recv(1));
        }
        assert_eq!(got, vec![9u8; 3000]);
        assert_ne!(flags(&h, 1) & FLAG_RX_EOF, 0, "a FIN");
        assert_eq!(flags(&h, 1) & FLAG_ERROR, 0, "not a reset");
        h.finish();
    }

    /// A panic while serving is caught and marks the session broken; its departure
    /// then runs none of the requests it had left (a healthy one's runs them).
    #[test]
    fn a_panic_is_contained_and_the_broken_session_runs_nothing_more() {
        let mut h = Harness::new();
        h.add_session(2);
        let socket = usnet_session_abi::Request {
            op: op::SOCKET,
            args: TCP,
            ..Default::default()
        };
        for id in [1, 2] {
            h.target(id);
            h.submit(&socket);
            h.submit(&socket);
        }
        let (s, stack) = h.parts(1);
        s.panic_next = true;
        let e = s
            .serve_contained(stack, 16)
            .expect_err("the panic is caught");
        assert!(e.contains("injected"), "{e}");
        assert!(s.broken);
        s.depart(stack, 16);
        assert_eq!(s.stats.calls, 0, "nothing run after the panic");
        let (s, stack) = h.parts(2);
        s.depart(stack, 16);
        assert_eq!(s.stats.calls, 2, "a healthy session's are served");
        assert_eq!(s.socket_count(), 0, "and closed with it");
        h.finish();
    }
}
