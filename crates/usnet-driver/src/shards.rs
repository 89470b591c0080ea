//! Where a host's shards meet (`usnet_stack::shard`): one mailbox per shard for the
//! frames another shard received but this one owns, each with a doorbell its loop
//! sleeps on beside its device. Off the per-packet path: the link steers almost
//! every frame to its owner, and only ICMP errors, reassembled datagrams,
//! every-shard frames (ARP replies, advertisements, multicast) and the first frame of
//! a flow a link hashed elsewhere come through here.
//!
//! No lost wake-up: a poster pushes, then rings; the owner drains the bell, then
//! takes the box. A push after the take rings after the drain, so the next sleep
//! returns at once. A mailbox's doorbell is of the kind its loop's device sleeps on
//! (an eventfd beside a TAP or an AF_PACKET socket, a futex beside a shm link), so
//! the loop sleeps on both in one system call; a futex doorbell is rung only when
//! its loop announced that it may sleep (`usnet_shm::doorbell::Gate`), and the loop
//! re-checks the box after announcing.

use std::sync::{Arc, Mutex};

use usnet_link::{Device, Doorbell, WaitKind};
use usnet_shm::{EventFd, FutexBell, Region};
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
        let kind = drivers
            .first()
            .map_or(WaitKind::Fd, |d| d.device().wait_kind());
        let boxes = Mailboxes::new(drivers.len(), kind)?;
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
    bell: MailBell,
}

/// A mailbox's doorbell, of its loop's device's kind.
enum MailBell {
    Fd(EventFd),
    Futex(FutexBell),
}

/// One shard's mailboxes: where other shards post the frames it owns.
pub struct Mailboxes {
    boxes: Vec<Mailbox>,
    /// Where futex doorbells live (process-private, never shared).
    _words: Option<Arc<Region>>,
}

const BELL_STRIDE: usize = 64;

impl Mailboxes {
    /// `n` mailboxes whose doorbells are of `kind` (the shards' devices').
    pub fn new(n: usize, kind: WaitKind) -> std::io::Result<Arc<Mailboxes>> {
        let words = match kind {
            WaitKind::Fd => None,
            WaitKind::Bell => Some(Arc::new(Region::create_memfd(
                c"usnet-mailboxes",
                (n * BELL_STRIDE).next_multiple_of(4096),
                false,
            )?)),
        };
        let boxes = (0..n)
            .map(|i| {
                let bell = match &words {
                    None => MailBell::Fd(EventFd::new()?),
                    Some(r) => MailBell::Futex(
                        FutexBell::new(r.clone(), i * BELL_STRIDE, i * BELL_STRIDE + 4)
                            .map_err(std::io::Error::other)?,
                    ),
                };
                Ok(Mailbox {
                    q: Mutex::new(Vec::new()),
                    bell,
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Arc::new(Mailboxes {
            boxes,
            _words: words,
        }))
    }

    pub fn len(&self) -> usize {
        self.boxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    /// Posts every frame `stack` handed out to its owner's mailbox and rings it.
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
            match &b.bell {
                MailBell::Fd(e) => e.ring(),
                MailBell::Futex(f) => {
                    f.notify();
                }
            }
        }
        n
    }

    /// Delivers shard `me`'s mail into its stack.
    pub fn deliver_to(&self, me: usize, stack: &mut Stack) -> usize {
        let b = &self.boxes[me];
        if let MailBell::Fd(e) = &b.bell {
            e.drain();
        }
        let mail = std::mem::take(&mut *b.q.lock().unwrap_or_else(|p| p.into_inner()));
        let n = mail.len();
        for h in mail {
            stack.receive_handoff(h);
        }
        n
    }

    pub fn has_mail(&self, me: usize) -> bool {
        !self.boxes[me]
            .q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Shard `me`'s doorbell, to sleep on beside its device. A futex doorbell's `seq`
    /// is read here; the sleeper re-checks [`Mailboxes::has_mail`] after announcing
    /// itself, so a post between this read and the sleep is not lost.
    pub fn doorbell(&self, me: usize) -> Doorbell<'_> {
        use std::os::fd::AsFd;
        match &self.boxes[me].bell {
            MailBell::Fd(e) => Doorbell::Fd(e.as_fd()),
            MailBell::Futex(f) => Doorbell::Bell(f, f.seq()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, MemDevice};
    use usnet_link::DeviceCaps;
    use usnet_stack::{ShardRole, StackConfig};

    fn driver(index: usize, count: usize) -> Driver<MemDevice, ManualClock> {
        let (dev, _q) = MemDevice::new("mem", DeviceCaps::plain(1500)).unwrap();
        Driver::new(
            shard_stack(index, count),
            dev,
            ManualClock::new(usnet_stack::Instant::ZERO),
        )
    }

    /// Shard `index` of `count` of one host.
    fn shard_stack(index: usize, count: usize) -> Stack {
        Stack::new(StackConfig {
            shard: ShardRole::new(index, count),
            addrs: vec!["10.0.0.2/24".parse().unwrap()],
            ..StackConfig::default()
        })
        .unwrap()
    }

    /// An ARP reply lands on `stack`: every shard's cache wants it, so the stack hands
    /// a copy to each other shard.
    fn land_arp_reply(stack: &mut Stack) {
        let mut arp = vec![0xffu8; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 9, 10, 0, 0, 9]);
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 2]);
        let f = stack.pool_mut().alloc_from(&arp).unwrap();
        stack.receive(f);
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
        let boxes = Mailboxes::new(2, WaitKind::Fd).unwrap();
        let mut a = shard_stack(0, 2);
        let mut b = shard_stack(1, 2);
        // An ARP reply lands on shard 0: a copy is posted to shard 1.
        land_arp_reply(&mut a);
        let mut scratch = Vec::new();
        assert_eq!(boxes.post_from(&mut a, &mut scratch), 1);
        assert!(boxes.has_mail(1) && !boxes.has_mail(0));
        match &boxes.boxes[1].bell {
            MailBell::Fd(e) => assert_eq!(e.drain(), 1),
            MailBell::Futex(_) => unreachable!("an eventfd kind"),
        }
        assert_eq!(boxes.deliver_to(1, &mut b), 1);
        assert!(!boxes.has_mail(1));
        assert_eq!(b.counters().shard_handoff_in, 1);
    }

    /// Beside a shm link the doorbell is a futex: a loop asleep on it (announced, as
    /// `Gate` has it) is woken by a post from another shard.
    #[test]
    fn a_futex_mailbox_wakes_its_sleeping_shard() {
        let boxes = Mailboxes::new(2, WaitKind::Bell).unwrap();
        let mut a = shard_stack(0, 2);
        let sleeper = {
            let boxes = boxes.clone();
            std::thread::spawn(move || {
                let Doorbell::Bell(bell, seen) = boxes.doorbell(1) else {
                    panic!("a futex kind");
                };
                let t = std::time::Instant::now();
                let slept = usnet_shm::doorbell::sleep_many(
                    &[(bell, seen)],
                    || boxes.has_mail(1),
                    std::time::Duration::from_secs(10),
                )
                .unwrap();
                (slept, t.elapsed())
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        land_arp_reply(&mut a);
        assert_eq!(boxes.post_from(&mut a, &mut Vec::new()), 1);
        let (slept, waited) = sleeper.join().unwrap();
        assert!(slept, "no mail before the post: it slept");
        assert!(
            waited < std::time::Duration::from_secs(5),
            "woken by the post"
        );
    }
}
