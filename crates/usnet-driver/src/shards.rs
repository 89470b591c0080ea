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

use usnet_link::Device;
use usnet_shm::EventFd;
use usnet_stack::{Handoff, Stack};

use crate::{Clock, Driver};

/// The drivers of one sharded host, joined to one set of [`Mailboxes`]: shard `i`
/// is `drivers[i]` (its stack's `ShardRole` must say so, and its device must be the
/// link's queue `i`).
pub struct Shards<D: Device, C: Clock> {
    drivers: Vec<Driver<D, C>>,
}

impl<D: Device + Send, C: Clock + Send> Shards<D, C> {
    pub fn new(mut drivers: Vec<Driver<D, C>>) -> std::io::Result<Shards<D, C>> {
        let boxes = Mailboxes::new(drivers.len())?;
        for (i, d) in drivers.iter_mut().enumerate() {
            let role = d.stack().config().shard;
            if usize::from(role.index) != i || usize::from(role.count) != boxes.len() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "driver {i} of {} is shard {} of {}",
                        boxes.len(),
                        role.index,
                        role.count
                    ),
                ));
            }
            d.join_shards(i, boxes.clone());
        }
        Ok(Shards { drivers })
    }

    pub fn len(&self) -> usize {
        self.drivers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.drivers.is_empty()
    }

    pub fn driver_mut(&mut self, i: usize) -> &mut Driver<D, C> {
        &mut self.drivers[i]
    }

    /// Runs `f(i, driver)` for every shard at once, each in a thread of its own
    /// (pinned to core `first_core + i`, modulo the cores, when `first_core` is
    /// given), and returns each shard's result in shard order (`Err`: its thread
    /// did not start or panicked). It returns when every `f` has.
    #[allow(clippy::type_complexity)]
    pub fn run<T: Send>(
        &mut self,
        first_core: Option<usize>,
        f: impl Fn(usize, &mut Driver<D, C>) -> T + Sync,
    ) -> Vec<Result<T, String>> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let f = &f;
        std::thread::scope(|s| {
            let threads: Vec<_> = self
                .drivers
                .iter_mut()
                .enumerate()
                .map(|(i, d)| {
                    std::thread::Builder::new()
                        .name(format!("usnet-shard-{i}"))
                        .spawn_scoped(s, move || {
                            if let Some(c) = first_core.map(|c| (c + i) % cores) {
                                // Best effort: an unpinned shard is slower, not wrong
                                // (a cpuset may leave out the core asked for).
                                if let Err(e) = crate::sched::pin_to_core(c) {
                                    eprintln!("usnet: shard {i}: cannot pin to core {c}: {e}");
                                }
                            }
                            f(i, d)
                        })
                })
                .collect();
            threads
                .into_iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Ok(t) => t.join().map_err(|_| format!("shard {i} panicked")),
                    Err(e) => Err(format!("shard {i}: cannot start its thread: {e}")),
                })
                .collect()
        })
    }

    pub fn into_drivers(self) -> Vec<Driver<D, C>> {
        self.drivers
    }
}

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
    use crate::{ManualClock, MemDevice};
    use usnet_link::DeviceCaps;
    use usnet_stack::{ShardRole, StackConfig};

    fn driver(index: usize, count: usize) -> Driver<MemDevice, ManualClock> {
        let (dev, _q) = MemDevice::new(
            "mem",
            DeviceCaps {
                mtu: 1500,
                rx_csum_offload: false,
                tx_csum_offload: false,
                tso: false,
                max_burst: 64,
            },
        )
        .unwrap();
        let stack = Stack::new(StackConfig {
            shard: ShardRole::new(index, count),
            addrs: vec!["10.0.0.2/24".parse().unwrap()],
            ..StackConfig::default()
        })
        .unwrap();
        Driver::new(stack, dev, ManualClock::new(usnet_stack::Instant::ZERO))
    }

    #[test]
    fn shards_run_each_driver_in_its_own_thread() {
        let mut shards = Shards::new(vec![driver(0, 2), driver(1, 2)]).unwrap();
        let main = std::thread::current().id();
        let got = shards.run(None, |i, d| {
            assert_ne!(std::thread::current().id(), main);
            i * 10 + usize::from(d.stack().config().shard.index)
        });
        assert_eq!(got, vec![Ok(0), Ok(11)]);
        assert_eq!(shards.into_drivers().len(), 2);
    }

    #[test]
    fn drivers_out_of_order_are_refused() {
        assert!(Shards::new(vec![driver(1, 2), driver(0, 2)]).is_err());
        assert!(Shards::new(vec![driver(0, 3), driver(1, 3)]).is_err());
    }

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
