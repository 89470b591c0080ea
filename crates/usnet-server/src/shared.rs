//! Stack sockets held by several sessions (processes of one family after a fork), and
//! pins that keep a parent's sockets for a child until it attaches. The loop owns one
//! [`Sharing`]; the fuzzing harness drives the same code with two sessions.
//!
//! A shared stack socket belongs to [`SHARED`] in the stack, so no session's death
//! closes it; each holder has a slot of its own (its own rings) over it. Readiness
//! reaches every holder; any holder's accept takes the next connection from the one
//! queue. Received bytes go to one holder at a time, the receiver: the one that had
//! the stream, until it lets go (closes its slot or dies); then the holder that came
//! last, with what the previous one left unread in its ring first. Every holder's
//! writes go out. The last holder to let go closes the stack socket: gracefully after
//! a close, with a reset after a death (as for a socket never shared).

use std::collections::HashMap;

use usnet_session_abi::Claimed;
use usnet_stack::{Owner, SocketHandle, Stack, TcpListenCopy};

use crate::session::{Pinned, Role, ServerSession, SHARED};

/// A stack socket held by several sessions, or pinned for a child.
#[derive(Debug, Default)]
struct SharedSock {
    /// Sessions holding it, in the order they took it.
    holders: Vec<u32>,
    /// Pins (children forked and not attached yet) holding it.
    pins: u32,
    /// The holder its received bytes go to (`None`: none yet; they wait in the stack).
    receiver: Option<u32>,
    /// Bytes a receiver that let go left unread, for the next one.
    carry: Vec<u8>,
}

/// Sockets pinned for a forked child until it attaches (or its pin connection closes).
/// What a claim of pinned socket `p` gave the child at `slot`.
fn claimed(p: &Pinned, slot: u32) -> Claimed {
    Claimed {
        parent_slot: p.parent_slot,
        slot,
        tag: p.tag,
        role: p.role.code(),
    }
}

struct Pin {
    /// The session that forked.
    from: u32,
    socks: Vec<Pinned>,
}

/// The listener each group of fresh TCP sockets made (a socket pinned for another
/// process before it listened: its copies are one socket, and the first `listen`
/// among them makes the listener all of them name). Sessions read it in their
/// `listen`; entries go when their listener closes.
pub(crate) type FreshGroups = std::sync::Arc<std::sync::Mutex<HashMap<u64, SocketHandle>>>;

/// Every shared stack socket and every pin.
#[derive(Default)]
pub(crate) struct Sharing {
    socks: HashMap<SocketHandle, SharedSock>,
    pins: HashMap<u128, Pin>,
    groups: FreshGroups,
}

/// The server's sessions by the ids it hands out (FxHash: no client picks a key).
pub(crate) type Sessions = rustc_hash::FxHashMap<u32, ServerSession>;

/// Closes a stack socket nobody holds any more: gracefully after a close, with a
/// reset (TCP connections) after the last holder died.
fn close_stack_socket(stack: &mut Stack, h: SocketHandle, died: bool) {
    let _ = stack.set_owner(h, Owner::LOCAL);
    let _ = if died && stack.tcp_peer_addr(h).is_ok() {
        stack.tcp_abort(h)
    } else {
        stack.close(h)
    };
}

impl Sharing {
    /// The groups' listeners, for a new session.
    pub fn groups(&self) -> FreshGroups {
        self.groups.clone()
    }

    /// Session `id` holds shared stack socket `h` from now on (a listen that made or
    /// named its group's listener).
    pub fn join(&mut self, h: SocketHandle, id: u32) {
        let sh = self.socks.entry(h).or_default();
        if !sh.holders.contains(&id) {
            sh.holders.push(id);
        }
    }

    /// Shared stack socket `h` is closed: nothing names it any more.
    fn closed(&mut self, stack: &mut Stack, h: SocketHandle, died: bool) {
        self.socks.remove(&h);
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, l| *l != h);
        close_stack_socket(stack, h, died);
    }

    /// The sessions holding `h` (none if it is not shared).
    pub fn holders(&self, h: SocketHandle) -> &[u32] {
        self.socks.get(&h).map_or(&[], |sh| &sh.holders)
    }

    /// Session `id` let go of shared stack socket `h` (closed its slot, or died:
    /// `died`), leaving `left` unread. The stream passes to the holder that came last
    /// (or waits for a child's attach); the last holder closes the socket.
    pub fn release(
        &mut self,
        sessions: &mut Sessions,
        stack: &mut Stack,
        h: SocketHandle,
        id: u32,
        left: Vec<u8>,
        died: bool,
    ) {
        let Some(sh) = self.socks.get_mut(&h) else {
            return;
        };
        sh.holders.retain(|&x| x != id);
        if sh.holders.is_empty() && sh.pins == 0 {
            // A process's exit closes its descriptors as `close` does: the stream
            // ends with a FIN, or with a reset if received bytes were left unread
            // (the kernel's `tcp_close`), whether or not it died holding it.
            let unread = !left.is_empty() || !sh.carry.is_empty();
            self.closed(stack, h, died && unread);
            return;
        }
        if sh.receiver == Some(id) {
            let mut carry = left;
            carry.append(&mut sh.carry);
            sh.receiver = sh.holders.last().copied();
            match sh.receiver.and_then(|r| sessions.get_mut(&r)) {
                Some(s) => s.become_receiver(stack, h, carry),
                None => sh.carry = carry,
            }
        }
    }

    /// Pins every socket of session `from` (or those of slots `only`) for a child it
    /// is about to fork, or a process it passes them to: the sockets stay alive for
    /// the other process until it claims them with `token` (or the pin is dropped).
    /// Returns how many sockets were pinned.
    pub fn pin(
        &mut self,
        sessions: &mut Sessions,
        stack: &mut Stack,
        from: u32,
        token: u128,
        only: Option<&[u32]>,
    ) -> Option<usize> {
        let s = sessions.get_mut(&from)?;
        let (socks, newly) = s.pin_all(stack, only);
        for h in newly {
            self.socks.insert(
                h,
                SharedSock {
                    holders: vec![from],
                    pins: 0,
                    receiver: Some(from),
                    carry: Vec::new(),
                },
            );
        }
        for p in &socks {
            if let Some(sh) = p.handle.and_then(|h| self.socks.get_mut(&h)) {
                sh.pins += 1;
            }
        }
        let n = socks.len();
        self.pins.insert(token, Pin { from, socks });
        Some(n)
    }

    /// How many sockets the pin `token` holds, if it is there.
    pub fn pin_size(&self, token: u128) -> Option<usize> {
        self.pins.get(&token).map(|p| p.socks.len())
    }

    /// A pin nobody will claim (the child exited or exec'd before attaching): its
    /// sockets are let go of, as the child's exit would close its copies.
    pub fn drop_pin(&mut self, stack: &mut Stack, token: u128) {
        let Some(pin) = self.pins.remove(&token) else {
            return;
        };
        for h in pin.socks.iter().filter_map(|p| p.handle) {
            self.unpin(stack, h);
        }
    }

    fn unpin(&mut self, stack: &mut Stack, h: SocketHandle) {
        let Some(sh) = self.socks.get_mut(&h) else {
            return;
        };
        sh.pins = sh.pins.saturating_sub(1);
        if sh.holders.is_empty() && sh.pins == 0 {
            self.closed(stack, h, false);
        }
    }

    /// The forked child's session `id` claims the pin `token`: a slot of its own for
    /// each pinned socket. Returns what it got for each, or `None` for an unknown
    /// token.
    pub fn claim(
        &mut self,
        sessions: &mut Sessions,
        stack: &mut Stack,
        id: u32,
        token: u128,
    ) -> Option<Vec<Claimed>> {
        let pin = self.pins.remove(&token)?;
        let mut map = Vec::new();
        for p in &pin.socks {
            let Some(s) = sessions.get_mut(&id) else {
                // The session went meanwhile: let the rest go.
                if let Some(h) = p.handle {
                    self.unpin(stack, h);
                }
                continue;
            };
            let Some(h) = p.handle else {
                // No stack socket yet (a fresh TCP or unbound UDP socket): a copy,
                // unless the session has one already (passed back to it).
                let have = p.group.and_then(|g| s.slot_in_group(g));
                if let Some(j) = have.or_else(|| s.add_pinned(stack, p, true, &mut Vec::new())) {
                    map.push(claimed(p, j));
                }
                continue;
            };
            if let Some(j) = s.slot_holding(h) {
                // Passed back to a process that holds it already: the slot it has
                // names it (one slot per stack socket in a session).
                map.push(claimed(p, j));
                self.unpin(stack, h);
                continue;
            }
            let Some(sh) = self.socks.get_mut(&h) else {
                continue;
            };
            let receiver = sh.receiver.is_none();
            let mut none = Vec::new();
            let carry = if receiver { &mut sh.carry } else { &mut none };
            match s.add_pinned(stack, p, receiver, carry) {
                Some(j) => {
                    sh.pins = sh.pins.saturating_sub(1);
                    sh.holders.push(id);
                    if receiver {
                        sh.receiver = Some(id);
                    }
                    map.push(claimed(p, j));
                }
                None => self.unpin(stack, h),
            }
        }
        Some(map)
    }

    /// The session that made pin `token`, and whether a child claiming it may live
    /// on another shard: every stack socket it holds is a listener (whose copy the
    /// child can hold there), as a pre-forking server's workers inherit.
    pub fn pin_info(&self, token: u128) -> Option<(u32, bool)> {
        let p = self.pins.get(&token)?;
        let movable = p
            .socks
            .iter()
            .all(|x| x.handle.is_none() || x.role == Role::Listener);
        Some((p.from, movable))
    }

    /// Takes pin `token` for a child that lives on another shard: each pinned
    /// socket with its listener's copy (`None`: no stack socket yet, or not a
    /// listener), the pin let go of here.
    pub fn take_listener_pin(
        &mut self,
        stack: &mut Stack,
        token: u128,
    ) -> Option<Vec<(Pinned, Option<TcpListenCopy>)>> {
        let pin = self.pins.remove(&token)?;
        let mut out = Vec::with_capacity(pin.socks.len());
        for p in pin.socks {
            let copy = p.handle.and_then(|h| stack.tcp_listener_copy(h).ok());
            if let Some(h) = p.handle {
                self.unpin(stack, h);
            }
            out.push((p, copy));
        }
        Some(out)
    }

    /// The child's session `id`, on this shard, claims what
    /// [`Sharing::take_listener_pin`] took on its parent's: each listener's copy
    /// here (shared with the children that made or took it before), each socket
    /// without a stack socket as a copy.
    pub fn claim_copies(
        &mut self,
        sessions: &mut Sessions,
        stack: &mut Stack,
        id: u32,
        items: Vec<(Pinned, Option<TcpListenCopy>)>,
    ) -> Vec<Claimed> {
        let mut map = Vec::new();
        for (mut p, copy) in items {
            let Some(s) = sessions.get_mut(&id) else {
                break;
            };
            let copy = match (p.handle, copy) {
                (None, _) => {
                    if let Some(j) = s.add_pinned(stack, &p, true, &mut Vec::new()) {
                        map.push(claimed(&p, j));
                    }
                    continue;
                }
                (Some(_), None) => continue,
                (Some(_), Some(c)) => c,
            };
            let here = stack
                .tcp_listeners()
                .into_iter()
                .find(|l| l.local == copy.local() && l.owner == SHARED)
                .map(|l| l.handle)
                .filter(|h| self.socks.contains_key(h));
            let h = match here {
                Some(h) => h,
                None => {
                    let Ok(h) = stack.tcp_listen_copy(&copy) else {
                        continue;
                    };
                    let _ = stack.set_owner(h, SHARED);
                    self.socks.insert(h, SharedSock::default());
                    h
                }
            };
            p.handle = Some(h);
            let sh = self.socks.get_mut(&h).expect("just found or made");
            match s.add_pinned(stack, &p, false, &mut Vec::new()) {
                Some(j) => {
                    sh.holders.push(id);
                    sh.receiver.get_or_insert(id);
                    map.push(claimed(&p, j));
                }
                None if sh.holders.is_empty() && sh.pins == 0 => {
                    self.closed(stack, h, false);
                }
                None => {}
            }
        }
        map
    }

    /// Holder `id` reads stream `h` and is not its receiver (`op::RX_WANT`): the
    /// stream comes to it if nobody receives it, or if its receiver never read it
    /// (`ServerSession::yield_to_reader`). Otherwise the receiver, a reader, keeps it.
    pub fn want(&mut self, sessions: &mut Sessions, stack: &mut Stack, id: u32, h: SocketHandle) {
        let Some(sh) = self.socks.get_mut(&h) else {
            return;
        };
        if sh.receiver == Some(id) || !sh.holders.contains(&id) {
            return;
        }
        let mut carry = match sh.receiver {
            None => Vec::new(),
            Some(r) => match sessions
                .get_mut(&r)
                .and_then(|o| o.yield_to_reader(stack, h))
            {
                Some(c) => c,
                None => return,
            },
        };
        carry.append(&mut sh.carry);
        sh.receiver = Some(id);
        if let Some(s) = sessions.get_mut(&id) {
            s.become_receiver(stack, h, carry);
        }
    }

    /// Shared stack sockets, and pins waiting for a child (each with the session that
    /// forked and how many sockets it holds).
    pub fn counts(&self) -> (usize, Vec<(u32, usize)>) {
        let pins = self
            .pins
            .values()
            .map(|p| (p.from, p.socks.len()))
            .collect();
        (self.socks.len(), pins)
    }

    /// What must hold whatever clients do: each shared socket is owned by `SHARED`
    /// and held by someone, every live holder names it, the receiver is a holder.
    pub fn check(&self, sessions: &Sessions, stack: &Stack) {
        for (h, sh) in &self.socks {
            assert_eq!(stack.owner(*h), Some(SHARED), "a shared socket's owner");
            assert!(
                !sh.holders.is_empty() || sh.pins > 0,
                "a shared socket held"
            );
            for id in &sh.holders {
                if let Some(s) = sessions.get(id) {
                    assert!(s.holds(*h), "holder {id} names its shared socket");
                }
            }
            if let Some(r) = sh.receiver {
                assert!(sh.holders.contains(&r), "the receiver holds the socket");
            }
        }
    }
}
