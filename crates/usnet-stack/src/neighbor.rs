//! ARP and NDP neighbour cache: IP → MAC with expiry, and a bounded queue of frames
//! waiting for resolution. Protocol-neutral: the stack sends the ARP request or the
//! neighbour solicitation that `poll` asks for.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use usnet_pool::PktBuf;
use usnet_wire::MacAddr;

use crate::time::Instant;

#[derive(Debug)]
enum State {
    /// Resolution under way: `probes` sent so far, the next one due at `next_probe`.
    Incomplete { probes: u32, next_probe: Instant },
    /// Known; trusted until `confirmed + ttl`, then refreshed by a probe while still used.
    Reachable {
        mac: MacAddr,
        confirmed: Instant,
        last_probe: Option<Instant>,
    },
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// Complete Ethernet frames whose destination MAC is filled in on resolution.
    pending: VecDeque<PktBuf>,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Found(MacAddr),
    /// Found, but old: use it and send a refresh probe.
    FoundStale(MacAddr),
    Missing,
}

pub struct NeighborCache {
    map: HashMap<IpAddr, Entry>,
    /// Entries forgotten early to make room in a full cache.
    pub evicted: u64,
    /// New entries refused because the cache was full of unresolved ones.
    pub refused: u64,
    ttl: Duration,
    retry: Duration,
    max_probes: u32,
    max_entries: usize,
    max_pending: usize,
}

/// Why a frame could not be held for resolution (the frame comes back).
#[derive(Debug, PartialEq, Eq)]
pub enum HoldError {
    /// This neighbour's waiting queue is full.
    QueueFull(PktBuf),
    /// The cache is full of neighbours still being resolved.
    CacheFull(PktBuf),
}

/// Work that `poll` hands back to the stack.
#[derive(Debug, Default)]
pub struct NeighborWork {
    pub probe: Vec<IpAddr>,
    /// Frames whose resolution failed: the stack frees and counts them.
    pub failed: Vec<PktBuf>,
}

impl NeighborCache {
    pub fn new(
        ttl: Duration,
        retry: Duration,
        max_probes: u32,
        max_entries: usize,
        max_pending: usize,
    ) -> Self {
        NeighborCache {
            map: HashMap::new(),
            evicted: 0,
            refused: 0,
            ttl,
            retry,
            max_probes: max_probes.max(1),
            max_entries,
            max_pending,
        }
    }

    /// Ensures there is room for one more entry: when full, forgets the reachable
    /// entry confirmed longest ago that has nothing waiting (Linux's forced garbage
    /// collection at gc_thresh3), so a flood of spoofed neighbours cannot lock new
    /// ones out. Counts a refusal when every entry is busy resolving.
    fn make_room(&mut self) -> bool {
        if self.map.len() < self.max_entries {
            return true;
        }
        let victim = self
            .map
            .iter()
            .filter_map(|(ip, e)| match e.state {
                State::Reachable { confirmed, .. } if e.pending.is_empty() => {
                    Some((confirmed, *ip))
                }
                _ => None,
            })
            .min()
            .map(|(_, ip)| ip);
        match victim {
            Some(ip) => {
                self.map.remove(&ip);
                self.evicted += 1;
                true
            }
            None => {
                self.refused += 1;
                false
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn lookup(&mut self, ip: IpAddr, now: Instant) -> Lookup {
        match self.map.get_mut(&ip) {
            Some(Entry {
                state:
                    State::Reachable {
                        mac,
                        confirmed,
                        last_probe,
                    },
                ..
            }) => {
                if now.saturating_since(*confirmed) < self.ttl {
                    Lookup::Found(*mac)
                } else if last_probe.is_none_or(|t| now.saturating_since(t) >= self.retry) {
                    *last_probe = Some(now);
                    Lookup::FoundStale(*mac)
                } else {
                    Lookup::Found(*mac)
                }
            }
            _ => Lookup::Missing,
        }
    }

    /// Queues a frame until `ip` resolves. `Ok(true)` means a probe should go out now
    /// (a new resolution started); `Err` gives the frame back when the queue is full.
    pub fn hold(&mut self, ip: IpAddr, frame: PktBuf, now: Instant) -> Result<bool, HoldError> {
        if !self.map.contains_key(&ip) && !self.make_room() {
            return Err(HoldError::CacheFull(frame));
        }
        let retry = self.retry;
        let max_pending = self.max_pending;
        let mut started = false;
        let entry = self.map.entry(ip).or_insert_with(|| {
            started = true;
            Entry {
                state: State::Incomplete {
                    probes: 1,
                    next_probe: now + retry,
                },
                pending: VecDeque::new(),
            }
        });
        if entry.pending.len() >= max_pending {
            return Err(HoldError::QueueFull(frame));
        }
        entry.pending.push_back(frame);
        Ok(started)
    }

    /// Records `ip` → `mac`. Creates an entry only when `create` (we were asked, or we
    /// asked); otherwise only refreshes an existing one, as RFC 826 suggests.
    /// Returns frames that were waiting for this neighbour.
    pub fn learn(
        &mut self,
        ip: IpAddr,
        mac: MacAddr,
        now: Instant,
        create: bool,
    ) -> VecDeque<PktBuf> {
        if !mac.is_unicast() {
            return VecDeque::new();
        }
        if let Some(e) = self.map.get_mut(&ip) {
            e.state = State::Reachable {
                mac,
                confirmed: now,
                last_probe: None,
            };
            return std::mem::take(&mut e.pending);
        }
        if create && self.make_room() {
            self.map.insert(
                ip,
                Entry {
                    state: State::Reachable {
                        mac,
                        confirmed: now,
                        last_probe: None,
                    },
                    pending: VecDeque::new(),
                },
            );
        }
        VecDeque::new()
    }

    /// Retries and expiries due at `now`.
    pub fn poll(&mut self, now: Instant, work: &mut NeighborWork) {
        let max_probes = self.max_probes;
        let retry = self.retry;
        let forget_after = self.ttl * 4;
        self.map.retain(|ip, e| match &mut e.state {
            State::Incomplete { probes, next_probe } => {
                if now < *next_probe {
                    return true;
                }
                if *probes >= max_probes {
                    work.failed.extend(e.pending.drain(..));
                    return false;
                }
                *probes += 1;
                *next_probe = now + retry;
                work.probe.push(*ip);
                true
            }
            State::Reachable { confirmed, .. } => now.saturating_since(*confirmed) < forget_after,
        });
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.map
            .values()
            .filter_map(|e| match e.state {
                State::Incomplete { next_probe, .. } => Some(next_probe),
                State::Reachable { .. } => None,
            })
            .min()
    }

    /// All entries as `(ip, Some(mac) | None while resolving)`, for display.
    pub fn entries(&self) -> Vec<(IpAddr, Option<MacAddr>)> {
        let mut v: Vec<_> = self
            .map
            .iter()
            .map(|(ip, e)| match e.state {
                State::Reachable { mac, .. } => (*ip, Some(mac)),
                State::Incomplete { .. } => (*ip, None),
            })
            .collect();
        v.sort_by_key(|(ip, _)| *ip);
        v
    }

    /// Every held frame, for a stack being torn down.
    pub fn drain_pending(&mut self) -> Vec<PktBuf> {
        self.map
            .values_mut()
            .flat_map(|e| e.pending.drain(..))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnet_pool::{PacketPool, PoolConfig};

    fn cache() -> NeighborCache {
        NeighborCache::new(Duration::from_secs(60), Duration::from_secs(1), 3, 4, 2)
    }

    #[test]
    fn resolution_flushes_pending_and_bounds_queue() {
        let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
        let mut c = cache();
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let t = Instant::ZERO;
        assert_eq!(c.lookup(ip, t), Lookup::Missing);
        assert_eq!(c.hold(ip, pool.alloc().unwrap(), t), Ok(true));
        assert_eq!(c.hold(ip, pool.alloc().unwrap(), t), Ok(false));
        let third = pool.alloc().unwrap();
        let id = third.index();
        match c.hold(ip, third, t) {
            Err(HoldError::QueueFull(b)) => {
                assert_eq!(b.index(), id, "the refused frame comes back");
                pool.free(b);
            }
            other => panic!("{other:?}"),
        }
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        let flushed = c.learn(ip, mac, t, false);
        assert_eq!(flushed.len(), 2);
        for b in flushed {
            pool.free(b);
        }
        assert_eq!(c.lookup(ip, t), Lookup::Found(mac));
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn failed_resolution_gives_frames_back_after_max_probes() {
        let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
        let mut c = cache();
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        c.hold(ip, pool.alloc().unwrap(), Instant::ZERO).unwrap();
        let mut probes = 0;
        let mut failed = Vec::new();
        for s in 1..10 {
            let mut w = NeighborWork::default();
            c.poll(Instant::from_millis(s * 1000), &mut w);
            probes += w.probe.len();
            failed.extend(w.failed);
        }
        assert_eq!(probes, 2, "initial probe by the caller + 2 retries = 3");
        assert_eq!(failed.len(), 1);
        pool.free(failed.remove(0));
        assert!(c.is_empty());
    }

    #[test]
    fn a_cache_full_of_unresolved_entries_refuses_and_counts() {
        let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
        let mut c = cache();
        for i in 0..4u8 {
            c.hold(
                IpAddr::from([10, 0, 1, i]),
                pool.alloc().unwrap(),
                Instant::ZERO,
            )
            .unwrap();
        }
        let b = pool.alloc().unwrap();
        let id = b.index();
        match c.hold("10.0.2.1".parse().unwrap(), b, Instant::ZERO) {
            Err(HoldError::CacheFull(b)) => {
                assert_eq!(b.index(), id);
                pool.free(b);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.refused, 1);
        for b in c.drain_pending() {
            pool.free(b);
        }
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn stale_entries_still_resolve_and_ask_for_refresh() {
        let mut c = cache();
        let ip: IpAddr = "fe80::1".parse().unwrap();
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        c.learn(ip, mac, Instant::ZERO, true);
        assert_eq!(
            c.lookup(ip, Instant::from_millis(61_000)),
            Lookup::FoundStale(mac)
        );
        assert_eq!(
            c.lookup(ip, Instant::from_millis(61_001)),
            Lookup::Found(mac)
        );
        assert_eq!(
            c.lookup(ip, Instant::from_millis(62_500)),
            Lookup::FoundStale(mac)
        );
    }

    #[test]
    fn unsolicited_learning_does_not_create_and_cache_is_bounded() {
        let mut c = cache();
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        c.learn("10.0.0.1".parse().unwrap(), mac, Instant::ZERO, false);
        assert!(c.is_empty());
        for i in 0..10u8 {
            c.learn(
                IpAddr::from([10, 0, 0, i]),
                mac,
                Instant::from_millis(i as u64),
                true,
            );
        }
        // Full: the oldest confirmed entries made room for the newest.
        assert_eq!(c.len(), 4);
        assert_eq!(c.evicted, 6);
        assert_eq!(
            c.lookup(IpAddr::from([10, 0, 0, 9]), Instant::from_millis(10)),
            Lookup::Found(mac)
        );
        assert_eq!(
            c.lookup(IpAddr::from([10, 0, 0, 0]), Instant::from_millis(10)),
            Lookup::Missing
        );
        c.learn(
            "10.0.0.1".parse().unwrap(),
            MacAddr::BROADCAST,
            Instant::ZERO,
            true,
        );
    }
}
