//! Who sends next when the transmit queue is the bottleneck.
//!
//! A link that pushes back (a NIC at its line rate, a full shm ring) fills the
//! stack's transmit queue, and the connections it refuses wait for room. Served in
//! the order they were refused, every connection gets an equal turn, so a client of
//! a stack server with 100 busy connections takes 100 turns for another's one: the
//! share of the link follows the number of sockets, as on Linux without a qdisc that
//! knows about processes. Here the turns go round the owners (a stack server's
//! clients; [`crate::Owner`]) and, within an owner, round its connections, each turn
//! worth at most [`QUANTUM`] bytes of payload: every client that has something to
//! send gets an equal share of the link, however many sockets it spreads it over.
//!
//! While connections wait, a connection that is not being served may send no
//! payload (ACKs and other empty segments still go when there is room): an ACK that
//! arrives for a client with many connections would otherwise let it send past the
//! ones that wait.

use std::collections::{HashMap, VecDeque};

use crate::Owner;

/// Payload bytes one connection may send per turn while others wait: enough for a
/// full TSO frame, small beside the queue, so a turn is short.
pub(crate) const QUANTUM: usize = 64 * 1024;

/// Connections (socket table slots) waiting for transmit room, by owner.
#[derive(Debug, Default)]
pub(crate) struct TxWaiters {
    /// Owners with a waiting connection, in the order they are served.
    owners: VecDeque<Owner>,
    /// Each owner's waiting connections, in the order they were refused.
    by_owner: HashMap<Owner, VecDeque<u32>>,
    len: usize,
}

impl TxWaiters {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Connection `idx` of `owner` waits (after the owner's others; an owner that
    /// had none waits after the other owners).
    pub fn push(&mut self, owner: Owner, idx: u32) {
        let q = self.by_owner.entry(owner).or_default();
        if q.is_empty() {
            self.owners.push_back(owner);
        }
        q.push_back(idx);
        self.len += 1;
    }

    /// The next connection to serve: the first waiting one of the owner whose turn
    /// it is; that owner's next turn comes after the others'.
    pub fn pop(&mut self) -> Option<u32> {
        let owner = self.owners.pop_front()?;
        let q = self.by_owner.get_mut(&owner)?;
        let idx = q.pop_front()?;
        self.len -= 1;
        if q.is_empty() {
            self.by_owner.remove(&owner);
        } else {
            self.owners.push_back(owner);
        }
        Some(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_go_round_the_owners_then_round_their_connections() {
        let mut w = TxWaiters::default();
        // Owner 1 has four connections waiting, owner 2 one, owner 3 two.
        for i in 10..14 {
            w.push(Owner(1), i);
        }
        w.push(Owner(2), 20);
        w.push(Owner(3), 30);
        w.push(Owner(3), 31);
        assert_eq!(w.len(), 7);
        let mut order = Vec::new();
        while let Some(i) = w.pop() {
            order.push(i);
            // Owner 2's connection always has more to send: it waits again.
            if i == 20 {
                w.push(Owner(2), 20);
            }
            if order.len() == 10 {
                break;
            }
        }
        assert_eq!(order, [10, 20, 30, 11, 20, 31, 12, 20, 13, 20]);
        assert_eq!(w.len(), 1);
        assert_eq!(w.pop(), Some(20));
        assert!(w.is_empty() && w.pop().is_none());
    }

    #[test]
    fn an_owner_that_comes_back_waits_behind_the_others() {
        let mut w = TxWaiters::default();
        w.push(Owner(1), 1);
        w.push(Owner(2), 2);
        assert_eq!(w.pop(), Some(1));
        w.push(Owner(1), 3);
        assert_eq!(w.pop(), Some(2));
        assert_eq!(w.pop(), Some(3));
        assert_eq!(w.pop(), None);
    }
}
