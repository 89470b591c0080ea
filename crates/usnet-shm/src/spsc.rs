//! The single-producer single-consumer ring index protocol.
//!
//! A ring of `size` slots (a power of two) is described by two free-running `u32`
//! indices in a [`Region`], each on its own cache line:
//!
//! * `head`: the producer's index, written only by the producer;
//! * `tail`: the consumer's index, written only by the consumer.
//!
//! Slot `i` is `i & (size - 1)`. The ring holds `head - tail` items (wrapping
//! arithmetic). **Ownership**: slots in `[tail, head)` belong to the consumer, all others
//! to the producer; each side writes only what it owns. What a slot holds, and where it
//! lives, is the user's business: this module deals in slot numbers.
//!
//! # Memory ordering
//! * The producer writes slot contents, then publishes with `head.store(Release)`, once
//!   per batch. The consumer's `head.load(Acquire)` synchronises with it, so every slot
//!   below the head it read is completely written when it reads it.
//! * The consumer reads slots, then hands them back with `tail.store(Release)`, once per
//!   batch. The producer's `tail.load(Acquire)` synchronises with it, so the consumer's
//!   reads of a slot are done before the producer overwrites it.
//! * Each side keeps a private copy of the other's index and reloads it only when the
//!   copy says "full" (producer) or "empty" (consumer). A busy ring moves items without
//!   touching the other side's cache line on every item, and without system calls.
//!
//! # A peer that lies
//! The indices are the peer's and are not trusted. A head more than `size` ahead of the
//! tail is impossible for a correct producer: the consumer reports it
//! ([`Corrupt`]) and resynchronises (`tail = head`, dropping whatever the ring "held").
//! The slot numbers handed out are always `< size`, whatever the indices say.
//!
//! Waking a consumer that sleeps on an empty ring is the doorbell's job
//! ([`crate::doorbell::Gate`]): publish, then `notify`.

use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::Arc;

use crate::{RangeError, Region, CACHE_LINE};

/// The producer's index says the ring holds more than it can: a broken or hostile peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring indices are inconsistent (head {head}, tail {tail}, size {size})")]
pub struct Corrupt {
    pub head: u32,
    pub tail: u32,
    pub size: u32,
}

/// Where a ring's indices live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingIndices {
    /// Offset of `head` (the producer's index).
    pub head: usize,
    /// Offset of `tail` (the consumer's index); at least a cache line away from `head`.
    pub tail: usize,
    /// Slots in the ring: a power of two.
    pub size: u32,
}

impl RingIndices {
    fn check(&self, region: &Region) -> Result<(), RangeError> {
        region.at::<AtomicU32>(self.head)?;
        region.at::<AtomicU32>(self.tail)?;
        if !self.size.is_power_of_two() || self.head.abs_diff(self.tail) < CACHE_LINE {
            return Err(RangeError {
                off: self.tail,
                len: 4,
                align: CACHE_LINE,
                map_len: region.len(),
            });
        }
        Ok(())
    }
}

/// The producer's end of a ring.
pub struct Producer {
    region: Arc<Region>,
    at: RingIndices,
    /// Our index: items committed so far (only we write `head`).
    head: u32,
    /// The last value stored to the shared `head`.
    published: u32,
    /// Our last view of the consumer's `tail`.
    tail_cache: u32,
}

impl Producer {
    /// Takes the producer's end, continuing from the indices in the region.
    pub fn attach(region: Arc<Region>, at: RingIndices) -> Result<Producer, RangeError> {
        at.check(&region)?;
        let head = region.u32(at.head).load(Acquire);
        let tail = region.u32(at.tail).load(Acquire);
        Ok(Producer {
            region,
            at,
            head,
            published: head,
            tail_cache: tail,
        })
    }

    /// The slot for the next item, or `None` when the ring is full. Reloads the
    /// consumer's `tail` (Acquire) only when the cached copy says full.
    #[inline]
    pub fn reserve(&mut self) -> Option<u32> {
        if self.head.wrapping_sub(self.tail_cache) >= self.at.size {
            self.tail_cache = self.region.u32(self.at.tail).load(Acquire);
            if self.head.wrapping_sub(self.tail_cache) >= self.at.size {
                return None;
            }
        }
        Some(self.head & (self.at.size - 1))
    }

    /// The reserved slot is written: count it. The consumer sees it after [`publish`].
    ///
    /// [`publish`]: Producer::publish
    #[inline]
    pub fn commit(&mut self) {
        self.head = self.head.wrapping_add(1);
    }

    /// Publishes every committed item with one Release store of `head`. Returns whether
    /// there was anything new (then the caller notifies the consumer's doorbell).
    #[inline]
    pub fn publish(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        self.region.u32(self.at.head).store(self.head, Release);
        self.published = self.head;
        true
    }
}

/// The consumer's end of a ring.
pub struct Consumer {
    region: Arc<Region>,
    at: RingIndices,
    /// Our index: items consumed so far (only we write `tail`).
    tail: u32,
    /// The last value stored to the shared `tail`.
    released: u32,
    /// Our last view of the producer's `head`.
    head_cache: u32,
}

impl Consumer {
    /// Takes the consumer's end and discards whatever the ring holds (items meant for a
    /// previous consumer): `tail = head`.
    pub fn attach_discarding(region: Arc<Region>, at: RingIndices) -> Result<Consumer, RangeError> {
        at.check(&region)?;
        let head = region.u32(at.head).load(Acquire);
        region.u32(at.tail).store(head, Release);
        Ok(Consumer {
            region,
            at,
            tail: head,
            released: head,
            head_cache: head,
        })
    }

    /// Whether an item may be ready. Reloads the producer's `head` (Acquire) only when
    /// the cached copy says empty.
    #[inline]
    pub fn pending(&mut self) -> bool {
        if self.head_cache != self.tail {
            return true;
        }
        self.head_cache = self.region.u32(self.at.head).load(Acquire);
        self.head_cache != self.tail
    }

    /// How many items are ready (see [`Consumer::pending`] for when `head` is reloaded).
    /// An impossible `head` is [`Corrupt`]: the ring is resynchronised (`tail = head`,
    /// released at once) and reports no items.
    #[inline]
    pub fn available(&mut self) -> Result<u32, Corrupt> {
        if !self.pending() {
            return Ok(0);
        }
        let n = self.head_cache.wrapping_sub(self.tail);
        if n > self.at.size {
            let e = Corrupt {
                head: self.head_cache,
                tail: self.tail,
                size: self.at.size,
            };
            self.tail = self.head_cache;
            self.release();
            return Err(e);
        }
        Ok(n)
    }

    /// The slot of the `k`-th ready item (`k < available()`).
    #[inline]
    pub fn slot(&self, k: u32) -> u32 {
        self.tail.wrapping_add(k) & (self.at.size - 1)
    }

    /// The first `n` ready items are read: count them. The producer may reuse their
    /// slots after [`release`].
    ///
    /// [`release`]: Consumer::release
    #[inline]
    pub fn consume(&mut self, n: u32) {
        self.tail = self.tail.wrapping_add(n);
    }

    /// Hands every consumed slot back with one Release store of `tail`.
    #[inline]
    pub fn release(&mut self) {
        if self.tail != self.released {
            self.region.u32(self.at.tail).store(self.tail, Release);
            self.released = self.tail;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const HEAD: usize = 0;
    const TAIL: usize = 64;
    const SLOTS: usize = 4096;

    fn ring(size: u32) -> (Arc<Region>, RingIndices) {
        let r = Region::create_memfd(c"spsc", 4096 + size as usize * 8, true).unwrap();
        (
            Arc::new(r),
            RingIndices {
                head: HEAD,
                tail: TAIL,
                size,
            },
        )
    }

    #[test]
    fn fills_back_pressures_and_wraps() {
        let (r, at) = ring(4);
        let mut p = Producer::attach(r.clone(), at).unwrap();
        let mut c = Consumer::attach_discarding(r.clone(), at).unwrap();
        for round in 0..10u64 {
            for k in 0..4 {
                let s = p.reserve().expect("room");
                r.u64(SLOTS + s as usize * 8).store(round * 10 + k, Relaxed);
                p.commit();
            }
            assert_eq!(p.reserve(), None, "full");
            assert_eq!(c.available(), Ok(0), "nothing published yet");
            assert!(p.publish());
            assert!(!p.publish(), "nothing new");
            assert_eq!(c.available(), Ok(4));
            for k in 0..4 {
                let v = r.u64(SLOTS + c.slot(k) as usize * 8).load(Relaxed);
                assert_eq!(v, round * 10 + k as u64);
            }
            c.consume(4);
            assert_eq!(p.reserve(), None, "not released yet");
            c.release();
            assert!(p.reserve().is_some());
        }
    }

    #[test]
    fn impossible_head_is_reported_and_resynchronised() {
        let (r, at) = ring(8);
        let mut c = Consumer::attach_discarding(r.clone(), at).unwrap();
        r.u32(HEAD).store(1000, Release);
        let e = c.available().unwrap_err();
        assert_eq!((e.head, e.tail, e.size), (1000, 0, 8));
        assert_eq!(r.u32(TAIL).load(Acquire), 1000, "tail moved to head");
        assert_eq!(c.available(), Ok(0));
        let mut p = Producer::attach(r.clone(), at).unwrap();
        assert!(p.reserve().is_some(), "the ring works again");
    }

    #[test]
    fn indices_must_be_in_range_and_on_separate_lines() {
        let (r, _) = ring(8);
        let bad = |head, tail, size| RingIndices { head, tail, size };
        assert!(
            Producer::attach(r.clone(), bad(0, 4, 8)).is_err(),
            "same line"
        );
        assert!(
            Producer::attach(r.clone(), bad(0, 64, 6)).is_err(),
            "not a power of two"
        );
        assert!(Consumer::attach_discarding(r.clone(), bad(0, 1 << 20, 8)).is_err());
        assert!(
            Consumer::attach_discarding(r, bad(2, 66, 8)).is_err(),
            "misaligned"
        );
    }

    /// Two threads move 1M sequence numbers through a 64-slot ring in batches: every
    /// item arrives, in order, intact.
    #[test]
    fn two_threads_in_order_nothing_lost() {
        const N: u64 = 1_000_000;
        let (r, at) = ring(64);
        let mut c = Consumer::attach_discarding(r.clone(), at).unwrap();
        let mut p = Producer::attach(r.clone(), at).unwrap();
        let pr = r.clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        let t = std::thread::spawn(move || {
            let mut next = 0u64;
            while next < N {
                assert!(Instant::now() < deadline, "producer stuck at {next}");
                let mut k = 0;
                while k < 16 && next < N {
                    let Some(s) = p.reserve() else { break };
                    pr.u64(SLOTS + s as usize * 8).store(next, Relaxed);
                    p.commit();
                    next += 1;
                    k += 1;
                }
                if !p.publish() {
                    std::thread::yield_now();
                }
            }
        });
        let mut expect = 0u64;
        while expect < N {
            assert!(Instant::now() < deadline, "consumer stuck at {expect}");
            let n = c.available().unwrap();
            for k in 0..n {
                let v = r.u64(SLOTS + c.slot(k) as usize * 8).load(Relaxed);
                assert_eq!(v, expect);
                expect += 1;
            }
            c.consume(n);
            c.release();
            if n == 0 {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }
}
