//! Where a host's shards meet (`usnet_stack::shard`): one mailbox per shard for the
//! frames another shard received but this one owns, each with a doorbell its loop
//! sleeps on beside its device. Off the per-packet path: the link steers almost
//! every frame to its owner, and only ICMP errors, reassembled datagrams,
//! every-shard frames (ARP replies, advertisements, multicast) and the first frame of
//! a flow a link hashed elsewhere come through here.
//!
//! No lost wake-up: a poster pushes, then rings; the owner drains the bell, then
//! takes the box. A push after the take rings after the drain, so the next sleep
//! returns at once.

use std::sync::{Arc, Mutex};

use usnet_shm::EventFd;
use usnet_stack::{Handoff, Stack};

struct Mailbox {
    q: Mutex<Vec<Handoff>>,
    bell: EventFd,
}

/// The mailboxes of `n` shards, shared by their loops.
pub struct Mailboxes {
    boxes: Vec<Mailbox>,
}

impl Mailboxes {
    pub fn new(n: usize) -> std::io::Result<Arc<Mailboxes>> {
        let boxes = (0..n)
            .map(|_| {
                Ok(Mailbox {
                    q: Mutex::new(Vec::new()),
                    bell: EventFd::new()?,
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Arc::new(Mailboxes { boxes }))
    }

    pub fn len(&self) -> usize {
        self.boxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    /// Posts what `stack` received for other shards; returns how many.
    pub fn post_from(&self, stack: &mut Stack, scratch: &mut Vec<(usize, Handoff)>) -> usize {
        if !stack.has_handoffs() {
            return 0;
        }
        stack.take_handoffs(scratch);
        let n = scratch.len();
        for (to, h) in scratch.drain(..) {
            let Some(b) = self.boxes.get(to) else {
                continue;
            };
            b.q.lock().unwrap_or_else(|p| p.into_inner()).push(h);
            b.bell.ring();
        }
        n
    }

    /// Hands shard `me`'s mail to its stack; returns how many.
    pub fn deliver_to(&self, me: usize, stack: &mut Stack) -> usize {
        let b = &self.boxes[me];
        b.bell.drain();
        let mail = std::mem::take(&mut *b.q.lock().unwrap_or_else(|p| p.into_inner()));
        let n = mail.len();
        for h in mail {
            stack.receive_handoff(h);
        }
        n
    }

    /// Whether shard `me` has mail (a loop's re-check before it sleeps).
    pub fn has_mail(&self, me: usize) -> bool {
        !self.boxes[me]
            .q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Shard `me`'s doorbell, readable while mail may wait.
    pub fn bell(&self, me: usize) -> &EventFd {
        &self.boxes[me].bell
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnet_stack::{ShardRole, StackConfig};

    #[test]
    fn mail_reaches_its_shard_and_rings_it() {
        let boxes = Mailboxes::new(2).unwrap();
        let mut a = Stack::new(StackConfig {
            shard: ShardRole::new(0, 2),
            addrs: vec!["10.0.0.2/24".parse().unwrap()],
            ..StackConfig::default()
        })
        .unwrap();
        let mut b = Stack::new(StackConfig {
            shard: ShardRole::new(1, 2),
            addrs: vec!["10.0.0.2/24".parse().unwrap()],
            ..StackConfig::default()
        })
        .unwrap();
        // An ARP reply lands on shard 0: a copy is posted to shard 1.
        let mut arp = vec![0xffu8; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 9, 10, 0, 0, 9]);
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 2]);
        let f = a.pool_mut().alloc_from(&arp).unwrap();
        a.receive(f);
        let mut scratch = Vec::new();
        assert_eq!(boxes.post_from(&mut a, &mut scratch), 1);
        assert!(boxes.has_mail(1) && !boxes.has_mail(0));
        assert_eq!(boxes.bell(1).drain(), 1);
        assert_eq!(boxes.deliver_to(1, &mut b), 1);
        assert!(!boxes.has_mail(1));
        assert_eq!(b.counters().shard_handoff_in, 1);
    }
}
