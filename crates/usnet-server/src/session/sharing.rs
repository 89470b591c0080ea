//! The session's side of sockets shared between processes after a fork: pinning a
//! parent's sockets, a child's slots over the same stack sockets, and the received
//! stream passed between holders. The loop's table of holders is `crate::shared`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;

use usnet_session_abi::{
    slot, SockAddr, FLAG_BOUND, FLAG_CONNECTED, FLAG_NOT_RECEIVER, FLAG_SHARED, RECORD_HEADER,
    RECORD_PAD,
};
use usnet_stack::{Owner, SocketHandle, Stack};

use super::{Role, ServerSession, SessionSocket, SessionStats};

/// The stack owner of sockets held by several sessions: no session's death closes
/// them; the loop closes one when its last holder lets go.
pub(crate) const SHARED: Owner = Owner(u32::MAX);

/// A socket pinned for a forked child (`Loop::pin`): what the child's session needs
/// to hold it too.
#[derive(Debug, Clone)]
pub(crate) struct Pinned {
    /// Its slot in the parent's session (the child's descriptors name it so).
    pub parent_slot: u32,
    /// The parent's tag for it ([`slot::TAG`], the client's word), reported back in
    /// the claim so a program after `exec` can find its descriptors.
    pub tag: u32,
    pub kind: u64,
    pub role: Role,
    pub handle: Option<SocketHandle>,
    pub bound: Option<SocketAddr>,
    /// A fresh TCP socket's group (see `SessionSocket::group`).
    pub group: Option<u64>,
}

/// A new group for a fresh TCP socket about to be held by several processes.
fn new_group() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}

/// The records in `raw`, the unread bytes of a UDP receive ring from ring position
/// `start` (of a ring of `size` bytes), laid end to end without the skips at the
/// ring's end, for another holder's ring. Stops at anything that is not a whole
/// record (a corrupt ring loses the rest, not the server).
pub(super) fn udp_records(raw: &[u8], start: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < raw.len() {
        let to_end = size - ((start + at as u64) as usize & (size - 1));
        if to_end < RECORD_HEADER {
            // A tail too short for a header is skipped by rule.
            at += to_end;
            continue;
        }
        if raw.len() - at < RECORD_HEADER {
            break;
        }
        let len = u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
        if len == RECORD_PAD {
            at += to_end;
            continue;
        }
        let rec = usnet_session_abi::record_len(len as usize);
        if rec > to_end || rec > raw.len() - at {
            break;
        }
        out.extend_from_slice(&raw[at..at + rec]);
        at += rec;
    }
    out
}

impl ServerSession {
    /// What a receiver that lets go of a shared socket leaves for the next one: the
    /// bytes of a stream in its receive ring it did not read, or the datagrams
    /// (records, [`udp_records`]), then its carry.
    pub(super) fn salvage(s: &mut SessionSocket, stats: &mut SessionStats) -> Vec<u8> {
        let mut left = Vec::new();
        if s.receiver && matches!(s.role, Role::Conn | Role::Udp) {
            if Self::take_rx(s, &mut left).is_err() {
                stats.corrupt_rings += 1;
                left.clear();
            }
            left.append(&mut s.carry);
        }
        left
    }

    /// The receive ring's unread bytes taken out of it into `out`: a stream's as
    /// they are, a UDP socket's as whole records laid end to end.
    fn take_rx(s: &mut SessionSocket, out: &mut Vec<u8>) -> Result<(), ()> {
        if s.role != Role::Udp {
            return s.rx.take_unread(out).map(drop).map_err(drop);
        }
        let mut raw = Vec::new();
        s.rx.take_unread(&mut raw).map_err(drop)?;
        // Taken back: the producer's position is where the first of them was.
        out.extend(udp_records(&raw, s.rx.position(), s.rx.size()));
        Ok(())
    }

    /// The client is gone: its shared stack sockets, taken out of the session with
    /// what their receive rings held, for the loop to pass on.
    pub fn take_shared(&mut self) -> Vec<(SocketHandle, Vec<u8>)> {
        let mut out = Vec::new();
        for i in 0..self.socks.len() {
            if !self.socks[i].as_ref().is_some_and(|s| s.shared) {
                continue;
            }
            let mut s = self.socks[i].take().expect("checked");
            let h = s.handle.expect("shared sockets have a stack socket");
            self.by_handle.remove(&h);
            self.active.retain(|&x| x != i as u32);
            self.free.push(i as u32);
            out.push((h, Self::salvage(&mut s, &mut self.stats)));
        }
        out
    }

    /// Pins every open socket (or those of `only`) for another process: a child
    /// about to be forked, or the receiver of descriptors passed with `SCM_RIGHTS`.
    /// Each one with a stack socket becomes shared (owned by [`SHARED`]). Returns the
    /// pinned sockets and the stack sockets that became shared just now.
    pub fn pin_all(
        &mut self,
        stack: &mut Stack,
        only: Option<&[u32]>,
    ) -> (Vec<Pinned>, Vec<SocketHandle>) {
        let mut pinned = Vec::new();
        let mut newly = Vec::new();
        let mut shared_now = Vec::new();
        let wanted = |i: usize| only.is_none_or(|o| o.contains(&(i as u32)));
        // A shared socket takes bytes from every holder's ring and gives them to
        // whichever reads: none of them can be its send buffer, nor take what it
        // receives straight.
        for i in 0..self.socks.len() {
            if wanted(i) && self.socks[i].as_ref().is_some_and(|s| !s.closing) {
                self.unlend(stack, i as u32);
                self.end_direct_rx(stack, i as u32);
                // What the process wrote before it forked or passed the socket goes
                // to the stack now, ahead of anything another holder writes after
                // (the kernel's send copied it into the socket's one buffer). A
                // stack that pushes back keeps the rest in this ring.
                self.activate(i as u32);
                for _ in 0..64 {
                    if !self.drain_tx(stack, i as u32) {
                        break;
                    }
                }
            }
        }
        for (i, s) in self.socks.iter_mut().enumerate() {
            let Some(s) = s.as_mut().filter(|s| !s.closing && wanted(i)) else {
                continue;
            };
            if let Some(h) = s.handle {
                if !s.shared {
                    s.shared = true;
                    let _ = stack.set_owner(h, SHARED);
                    if s.role == Role::Listener {
                        // Connections waiting to be accepted are shared too: the
                        // forking process's exit must not reset them.
                        stack.tcp_reown_waiting(h, SHARED);
                    }
                    newly.push(h);
                }
            }
            if s.handle.is_some() {
                shared_now.push(i as u32);
            } else if s.role == Role::Fresh && s.group.is_none() {
                // Its copies are one socket: the first of them to listen makes the
                // listener for all (`op_listen`).
                s.group = Some(new_group());
            }
            pinned.push(Pinned {
                parent_slot: i as u32,
                tag: self.mem.slot_word(i as u32, slot::TAG).load(Relaxed),
                kind: s.kind,
                role: s.role,
                handle: s.handle,
                bound: s.bound,
                group: s.group,
            });
        }
        for i in shared_now {
            self.set_flags(i, FLAG_SHARED, 0);
        }
        (pinned, newly)
    }

    /// A forked child's session takes a pinned socket: a slot of its own over the same
    /// stack socket (or a copy of a socket that has none yet). `receiver`: received
    /// bytes come here, `carry` first (taken only on success). `None` past the quota.
    pub fn add_pinned(
        &mut self,
        stack: &mut Stack,
        p: &Pinned,
        receiver: bool,
        carry: &mut Vec<u8>,
    ) -> Option<u32> {
        let i = self.new_slot(p.kind, p.role)?;
        let s = self.sock(i);
        s.bound = p.bound;
        s.group = p.group;
        s.receiver = receiver;
        s.carry = std::mem::take(carry);
        if !receiver && matches!(p.role, Role::Conn | Role::Udp) && p.handle.is_some() {
            self.set_flags(i, FLAG_NOT_RECEIVER, 0);
        }
        if let Some(b) = p.bound {
            self.mem
                .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(b));
            self.set_flags(i, FLAG_BOUND, 0);
        }
        if let Some(h) = p.handle {
            self.hold_shared(i, h);
            let (local, peer) = match p.role {
                Role::Udp => (stack.udp_local_addr(h).ok(), stack.udp_peer_addr(h).ok()),
                _ => (stack.tcp_local_addr(h).ok(), stack.tcp_peer_addr(h).ok()),
            };
            if let Some(l) = local {
                self.mem
                    .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                self.set_flags(i, FLAG_BOUND, 0);
            }
            if let Some(r) = peer.filter(|_| p.role != Role::Listener) {
                self.mem
                    .set_slot_addr(i, slot::PEER, &SockAddr::from_std(r));
                if p.role == Role::Udp {
                    self.set_flags(i, FLAG_CONNECTED, 0);
                }
            }
            self.refresh(stack, i);
        }
        Some(i)
    }

    /// Slot `i` names shared stack socket `h` (owned by [`SHARED`]).
    pub(super) fn hold_shared(&mut self, i: u32, h: SocketHandle) {
        let s = self.sock(i);
        s.handle = Some(h);
        s.shared = true;
        self.by_handle.insert(h, i);
        self.set_flags(i, FLAG_SHARED, 0);
    }

    /// The listener of fresh-socket group `g`, if one of its holders made it and it
    /// is still there.
    pub(super) fn group_listener(&self, stack: &Stack, g: u64) -> Option<SocketHandle> {
        let groups = self.groups.as_ref()?;
        let h = *groups.lock().unwrap_or_else(|e| e.into_inner()).get(&g)?;
        (stack.tcp_is_listener(h) && stack.owner(h) == Some(SHARED)).then_some(h)
    }

    /// Slot `i`, in group `g`, just made listener `h`: it is shared from now on, so
    /// the group's other holders can name it when they listen, and no one
    /// holder's exit closes it under the others.
    pub(super) fn found_group_listener(
        &mut self,
        stack: &mut Stack,
        i: u32,
        g: u64,
        h: SocketHandle,
    ) {
        let Some(groups) = self.groups.clone() else {
            return;
        };
        let _ = stack.set_owner(h, SHARED);
        self.hold_shared(i, h);
        groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(g, h);
        self.joined.push(h);
    }

    /// Another holder reads shared socket `h` (`op::RX_WANT`): it takes the stream,
    /// or the datagrams, from this session, which receives them, with what this
    /// session's client has not read (and the carry), as on the kernel, where bytes
    /// and datagrams go to whoever reads. `None` if the client is copying out of its ring at this instant (the
    /// other holder asks again).
    pub fn yield_to_reader(&mut self, stack: &mut Stack, h: SocketHandle) -> Option<Vec<u8>> {
        let &i = self.by_handle.get(&h)?;
        let s = self.socks[i as usize].as_mut()?;
        if !s.receiver || !matches!(s.role, Role::Conn | Role::Udp) {
            return None;
        }
        // Dekker's handshake with the client's reads (`slot::RX_BUSY`).
        let steal = self.mem.slot_word(i, slot::RX_STEAL);
        steal.store(1, SeqCst);
        if self.mem.slot_word(i, slot::RX_BUSY).load(SeqCst) != 0 {
            steal.store(0, Release);
            return None;
        }
        let mut out = Vec::new();
        let taken = Self::take_rx(s, &mut out);
        steal.store(0, Release);
        if taken.is_err() {
            self.stats.corrupt_rings += 1;
            return None;
        }
        s.receiver = false;
        out.append(&mut s.carry);
        self.set_flags(i, FLAG_NOT_RECEIVER, 0);
        self.refresh(stack, i);
        Some(out)
    }

    /// Received bytes of shared stack socket `h` come to this session from now on,
    /// `carry` first.
    pub fn become_receiver(&mut self, stack: &mut Stack, h: SocketHandle, carry: Vec<u8>) {
        let Some(&i) = self.by_handle.get(&h) else {
            return;
        };
        let s = self.sock(i);
        s.receiver = true;
        s.carry = carry;
        self.set_flags(i, 0, FLAG_NOT_RECEIVER);
        self.refresh(stack, i);
    }

    /// A shared stack socket's readiness changed through another holder: look again.
    pub fn refresh_handle(&mut self, stack: &mut Stack, h: SocketHandle) {
        if let Some(&i) = self.by_handle.get(&h) {
            self.refresh(stack, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::*;

    use usnet_session_abi::{
        op, slot, Request, SockAddr, FLAG_NOT_RECEIVER, FLAG_SHARED, KIND_TCP, KIND_UDP,
        RECORD_HEADER,
    };
    use usnet_stack::SocketHandle;

    use super::SHARED;
    use crate::fuzzing::{Harness, ADDR};

    fn flags(h: &Harness, i: u32) -> u32 {
        h.mem().slot_word(i, slot::FLAGS).load(Acquire)
    }

    fn handle(h: &mut Harness, id: u32, i: u32) -> SocketHandle {
        h.parts(id).0.socks[i as usize]
            .as_ref()
            .and_then(|s| s.handle)
            .expect("a stack socket")
    }

    /// Bytes into the target session's slot `i`, with the kick.
    fn write(h: &Harness, i: u32, data: &[u8]) {
        h.send_bytes(i, data);
        h.submit(&Request {
            op: op::TX_KICK,
            slot: i,
            ..Default::default()
        });
    }

    fn turns(h: &mut Harness) {
        for _ in 0..4 {
            h.turn();
        }
    }

    /// After a fork both sessions hold the parent's sockets: the same stack sockets,
    /// shared, each holder's writes go out, and the received stream goes to one
    /// holder only (the parent, which had it).
    #[test]
    fn a_socket_shared_after_fork_is_served_for_both_holders() {
        let mut h = Harness::new();
        h.connected_pair(7140);
        h.fork();
        for i in 0..3 {
            let (parent, child) = (handle(&mut h, 1, i), handle(&mut h, 2, i));
            assert_eq!(parent, child, "slot {i}: one stack socket");
            assert_eq!(h.stack().owner(parent), Some(SHARED));
        }
        h.target(2);
        assert_ne!(flags(&h, 1) & FLAG_SHARED, 0);
        assert_ne!(flags(&h, 2) & FLAG_NOT_RECEIVER, 0, "the parent receives");
        write(&h, 1, b"from the child, ");
        turns(&mut h);
        h.target(1);
        write(&h, 1, b"from the parent");
        turns(&mut h);
        assert_eq!(h.recv(2), b"from the child, from the parent");
        h.target(2);
        assert!(h.recv(2).is_empty(), "not the child's stream");
        h.finish();
    }

    /// A connection that sends from its ring (lent) gives the ring back when a fork
    /// shares it: a shared socket takes bytes from every holder's ring, so none of
    /// them can be its send buffer. Both holders' bytes then arrive in order.
    #[test]
    fn a_lent_send_ring_is_given_back_when_its_socket_is_shared() {
        let mut h = Harness::new();
        h.connected_pair(7143);
        write(&h, 1, b"before the fork, ");
        turns(&mut h);
        assert!(h.parts(1).0.sock(1).lent, "the ring is the send buffer");
        h.fork();
        let s = h.parts(1).0.sock(1);
        assert!(!s.lent && !s.lendable);
        assert_eq!(s.tx.unreleased(), 0, "the ring is the client's again");
        h.target(2);
        write(&h, 1, b"from the child, ");
        turns(&mut h);
        assert!(!h.parts(2).0.sock(1).lent, "a shared socket never lends");
        h.target(1);
        write(&h, 1, b"from the parent");
        turns(&mut h);
        assert_eq!(
            h.recv(2),
            b"before the fork, from the child, from the parent"
        );
        h.finish();
    }

    /// A shared socket lives while a holder has it: the parent's close leaves the
    /// listener to the child, which still accepts on it; the child's close, the last
    /// one, closes it.
    #[test]
    fn a_shared_socket_is_closed_when_its_last_holder_lets_go() {
        let mut h = Harness::new();
        h.connected_pair(7141);
        h.fork();
        let listener = handle(&mut h, 1, 0);
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert_eq!(
            h.stack().owner(listener),
            Some(SHARED),
            "the child holds it"
        );
        // The parent connects to it from the slot it freed.
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 0);
        let a = SockAddr::from_std((ADDR, 7141).into()).to_args();
        assert_eq!(h.call(op::CONNECT, 0, [a[0], a[1], a[2], a[3], 0, 0]), 0);
        turns(&mut h);
        h.target(2);
        assert_eq!(h.call(op::ACCEPT, 0, [0; 6]), 3, "still listening");
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert_eq!(
            h.stack().owner(listener),
            None,
            "closed with the last holder"
        );
        h.finish();
    }

    /// A holder that reads a shared stream it does not receive asks for it
    /// (`op::RX_WANT`): the receiver yields, and what it had not read moves to the
    /// asker's ring first, then the new bytes.
    #[test]
    fn the_stream_moves_to_the_holder_that_asks_with_what_was_unread() {
        let mut h = Harness::new();
        h.connected_pair(7142);
        h.fork();
        h.target(1);
        write(&h, 1, b"unread, ");
        turns(&mut h);
        h.target(2);
        h.submit(&Request {
            op: op::RX_WANT,
            slot: 2,
            ..Default::default()
        });
        turns(&mut h);
        assert_eq!(flags(&h, 2) & FLAG_NOT_RECEIVER, 0, "the child receives");
        h.target(1);
        assert_ne!(flags(&h, 2) & FLAG_NOT_RECEIVER, 0, "the parent does not");
        write(&h, 1, b"then new");
        turns(&mut h);
        assert!(h.recv(2).is_empty(), "taken from the parent's ring");
        h.target(2);
        assert_eq!(h.recv(2), b"unread, then new");
        h.finish();
    }

    /// The payload of the first record in `ring` (raw receive-ring bytes).
    fn first_datagram(ring: &[u8]) -> &[u8] {
        assert!(
            ring.len() >= RECORD_HEADER,
            "no record: {} bytes",
            ring.len()
        );
        let len = u32::from_le_bytes(ring[0..4].try_into().unwrap()) as usize;
        &ring[RECORD_HEADER..RECORD_HEADER + len]
    }

    /// A UDP socket handed over once it is readable (inetd's `wait` services,
    /// systemd's datagram socket activation, `ncat -u -k`): the datagram already in
    /// the receiver's ring goes to the holder that reads (`op::RX_WANT`), and one the
    /// receiver leaves unread when it lets go passes to the holder left.
    #[test]
    fn datagrams_move_to_the_holder_that_reads_and_outlive_their_receiver() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]), 0);
        let a = SockAddr::from_std((ADDR, 7150).into()).to_args();
        assert_eq!(h.call(op::BIND, 0, [a[0], a[1], a[2], a[3], 0, 0]), 0);
        let sender = h.parts(1).1.udp_bind((ADDR, 7151).into()).unwrap();
        let send = |h: &mut Harness, what: &[u8]| {
            let (_, stack) = h.parts(1);
            stack
                .udp_send_to(sender, what, (ADDR, 7150).into())
                .unwrap();
            turns(h);
        };
        send(&mut h, b"before the fork");
        h.fork();
        h.target(2);
        assert_ne!(flags(&h, 0) & FLAG_NOT_RECEIVER, 0, "the parent receives");
        h.submit(&Request {
            op: op::RX_WANT,
            slot: 0,
            ..Default::default()
        });
        turns(&mut h);
        assert_eq!(flags(&h, 0) & FLAG_NOT_RECEIVER, 0, "the child receives");
        assert_eq!(first_datagram(&h.recv(0)), b"before the fork");
        h.target(1);
        assert!(h.recv(0).is_empty(), "taken from the parent's ring");
        // The child receives the next one and dies without reading it.
        send(&mut h, b"left unread");
        h.remove(2);
        h.target(1);
        turns(&mut h);
        assert_eq!(
            flags(&h, 0) & FLAG_NOT_RECEIVER,
            0,
            "the parent receives again"
        );
        assert_eq!(first_datagram(&h.recv(0)), b"left unread");
        h.finish();
    }

    /// The receiver dies: the stream passes to the holder left, and the connection
    /// goes on with it.
    #[test]
    fn when_the_receiver_dies_the_stream_passes_to_the_holder_left() {
        let mut h = Harness::new();
        h.connected_pair(7143);
        h.fork();
        h.remove(1);
        h.target(2);
        turns(&mut h);
        assert_eq!(flags(&h, 2) & FLAG_NOT_RECEIVER, 0, "the child receives");
        write(&h, 1, b"after the parent");
        turns(&mut h);
        assert_eq!(h.recv(2), b"after the parent");
        h.finish();
    }
}
