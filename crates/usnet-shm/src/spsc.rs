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
//!
//! # The netmap convention
//! The zero-copy port's rings (`usnet_session_abi::zc`) keep netmap's indices instead: each in
//! `[0, size)` (any size from 2), one slot always empty, so `(theirs - mine) mod size`
//! items lie between the two. [`WrappedEnd`] is one side of such a ring.
//!
//! # One implementation, checked
//! Both conventions publish and read indices through [`publish_index`] and
//! [`observe_index`] alone, which `tests/loom_spsc.rs` model-checks on loom's atomics
//! (slots as plain memory, written back by the consumer too: a slot handed back may
//! carry data back, as a zero-copy TX slot the stack marks refused, which the
//! ordering covers as it covers the slot's first contents).

use std::sync::atomic::{AtomicU32, Ordering, Ordering::*};
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

/// The two accesses of the protocol on an index word (std's on shared memory, or
/// loom's in the model), so the loom test (`tests/loom_spsc.rs`) runs this code, not
/// a copy of it.
pub trait IndexOps {
    type Word;
    fn load(w: &Self::Word, o: Ordering) -> u32;
    fn store(w: &Self::Word, v: u32, o: Ordering);
}

/// std atomics on shared memory.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdIndex;

impl IndexOps for StdIndex {
    type Word = AtomicU32;
    #[inline]
    fn load(w: &AtomicU32, o: Ordering) -> u32 {
        w.load(o)
    }
    #[inline]
    fn store(w: &AtomicU32, v: u32, o: Ordering) {
        w.store(v, o)
    }
}

/// Publishes our index `local` with one Release store, if it moved since
/// `*published`: every slot access before it happens-before the peer's Acquire load
/// that sees it. Returns whether it moved.
#[inline]
pub fn publish_index<I: IndexOps>(w: &I::Word, local: u32, published: &mut u32) -> bool {
    if local == *published {
        return false;
    }
    I::store(w, local, Release);
    *published = local;
    true
}

/// The peer's index (Acquire: the slot accesses it published are visible).
#[inline]
pub fn observe_index<I: IndexOps>(w: &I::Word) -> u32 {
    I::load(w, Acquire)
}

/// Our own index word: a private copy, stored once per batch.
#[derive(Debug)]
struct OwnIndex {
    off: usize,
    /// Our index (only we write the word).
    local: u32,
    /// The last value stored to the word.
    published: u32,
}

impl OwnIndex {
    #[inline]
    fn publish(&mut self, region: &Region) -> bool {
        publish_index::<StdIndex>(region.u32(self.off), self.local, &mut self.published)
    }
}

#[inline]
fn peer_index(region: &Region, off: usize) -> u32 {
    observe_index::<StdIndex>(region.u32(off))
}

/// The producer's end of a ring.
pub struct Producer {
    region: Arc<Region>,
    at: RingIndices,
    /// `head`: items committed so far.
    head: OwnIndex,
    /// Our last view of the consumer's `tail`.
    tail_cache: u32,
}

impl Producer {
    /// Takes the producer's end, continuing from the indices in the region.
    pub fn attach(region: Arc<Region>, at: RingIndices) -> Result<Producer, RangeError> {
        at.check(&region)?;
        let head = region.u32(at.head).load(Acquire);
        let tail = peer_index(&region, at.tail);
        Ok(Producer {
            region,
            at,
            head: OwnIndex {
                off: at.head,
                local: head,
                published: head,
            },
            tail_cache: tail,
        })
    }

    /// The slot for the next item, or `None` when the ring is full. Reloads the
    /// consumer's `tail` (Acquire) only when the cached copy says full.
    #[inline]
    pub fn reserve(&mut self) -> Option<u32> {
        let head = self.head.local;
        if head.wrapping_sub(self.tail_cache) >= self.at.size {
            self.tail_cache = peer_index(&self.region, self.at.tail);
            if head.wrapping_sub(self.tail_cache) >= self.at.size {
                return None;
            }
        }
        Some(head & (self.at.size - 1))
    }

    /// The reserved slot is written: count it. The consumer sees it after [`publish`].
    ///
    /// [`publish`]: Producer::publish
    #[inline]
    pub fn commit(&mut self) {
        self.head.local = self.head.local.wrapping_add(1);
    }

    /// Publishes every committed item with one Release store of `head`. Returns whether
    /// there was anything new (then the caller notifies the consumer's doorbell).
    #[inline]
    pub fn publish(&mut self) -> bool {
        self.head.publish(&self.region)
    }
}

/// The consumer's end of a ring.
pub struct Consumer {
    region: Arc<Region>,
    at: RingIndices,
    /// `tail`: items consumed so far.
    tail: OwnIndex,
    /// Our last view of the producer's `head`.
    head_cache: u32,
}

impl Consumer {
    /// Takes the consumer's end and discards whatever the ring holds (items meant for a
    /// previous consumer): `tail = head`.
    pub fn attach_discarding(region: Arc<Region>, at: RingIndices) -> Result<Consumer, RangeError> {
        at.check(&region)?;
        let head = peer_index(&region, at.head);
        region.u32(at.tail).store(head, Release);
        Ok(Consumer {
            region,
            at,
            tail: OwnIndex {
                off: at.tail,
                local: head,
                published: head,
            },
            head_cache: head,
        })
    }

    /// Whether an item may be ready. Reloads the producer's `head` (Acquire) only when
    /// the cached copy says empty.
    #[inline]
    pub fn pending(&mut self) -> bool {
        if self.head_cache != self.tail.local {
            return true;
        }
        self.head_cache = peer_index(&self.region, self.at.head);
        self.head_cache != self.tail.local
    }

    /// How many items are ready (see [`Consumer::pending`] for when `head` is reloaded).
    /// An impossible `head` is [`Corrupt`]: the ring is resynchronised (`tail = head`,
    /// released at once) and reports no items.
    #[inline]
    pub fn available(&mut self) -> Result<u32, Corrupt> {
        if !self.pending() {
            return Ok(0);
        }
        let n = self.head_cache.wrapping_sub(self.tail.local);
        if n > self.at.size {
            let e = Corrupt {
                head: self.head_cache,
                tail: self.tail.local,
                size: self.at.size,
            };
            self.tail.local = self.head_cache;
            self.release();
            return Err(e);
        }
        Ok(n)
    }

    /// The slot of the `k`-th ready item (`k < available()`).
    #[inline]
    pub fn slot(&self, k: u32) -> u32 {
        self.tail.local.wrapping_add(k) & (self.at.size - 1)
    }

    /// The first `n` ready items are read: count them. The producer may reuse their
    /// slots after [`release`].
    ///
    /// [`release`]: Consumer::release
    #[inline]
    pub fn consume(&mut self, n: u32) {
        self.tail.local = self.tail.local.wrapping_add(n);
    }

    /// Hands every consumed slot back with one Release store of `tail`.
    #[inline]
    pub fn release(&mut self) {
        self.tail.publish(&self.region);
    }
}

/// Where the indices of a ring in the netmap convention live, seen from one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrappedIndices {
    /// Offset of our index (only we write it).
    pub mine: usize,
    /// Offset of the peer's index; at least a cache line away from ours.
    pub theirs: usize,
    /// Slots in the ring: at least 2 (one always stays empty).
    pub size: u32,
}

/// One side of a ring in the netmap convention (module docs): the producer fills
/// slots from its index on and advances it, the consumer takes slots from its index
/// up to the producer's. Our index is private until [`WrappedEnd::publish`]; the
/// peer's is read afresh (Acquire) by every [`WrappedEnd::theirs`] and reduced
/// modulo the size, whatever the peer wrote: what it means is the user's to check.
#[derive(Debug)]
pub struct WrappedEnd {
    region: Arc<Region>,
    theirs: usize,
    size: u32,
    mine: OwnIndex,
}

impl WrappedEnd {
    /// Takes one side, continuing from our index as the region holds it.
    pub fn attach(region: Arc<Region>, at: WrappedIndices) -> Result<WrappedEnd, RangeError> {
        region.at::<AtomicU32>(at.mine)?;
        region.at::<AtomicU32>(at.theirs)?;
        if at.size < 2 || at.mine.abs_diff(at.theirs) < CACHE_LINE {
            return Err(RangeError {
                off: at.theirs,
                len: 4,
                align: CACHE_LINE,
                map_len: region.len(),
            });
        }
        let published = region.u32(at.mine).load(Relaxed);
        Ok(WrappedEnd {
            theirs: at.theirs,
            size: at.size,
            mine: OwnIndex {
                off: at.mine,
                local: published % at.size,
                published,
            },
            region,
        })
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// Our index, in `[0, size)`.
    #[inline]
    pub fn mine(&self) -> u32 {
        self.mine.local
    }

    /// The peer's index, loaded now (Acquire), in `[0, size)`.
    #[inline]
    pub fn theirs(&self) -> u32 {
        peer_index(&self.region, self.theirs) % self.size
    }

    /// Slots from `from` up to `to` (both in `[0, size)`), going forward.
    #[inline]
    pub fn distance(&self, from: u32, to: u32) -> u32 {
        if to >= from {
            to - from
        } else {
            to + (self.size - from)
        }
    }

    /// The slot after `i`.
    #[inline]
    pub fn next(&self, i: u32) -> u32 {
        if i + 1 == self.size {
            0
        } else {
            i + 1
        }
    }

    /// Consumer: slots the producer filled and we have not taken (`theirs` loaded now).
    #[inline]
    pub fn ready(&self) -> u32 {
        self.distance(self.mine.local, self.theirs())
    }

    /// Producer: slots we may still fill (`theirs` loaded now; one stays empty).
    #[inline]
    pub fn room(&self) -> u32 {
        self.size - 1 - self.distance(self.theirs(), self.mine.local)
    }

    /// Moves our index past `n` slots; the peer sees it after [`WrappedEnd::publish`].
    #[inline]
    pub fn advance(&mut self, n: u32) {
        self.mine.local =
            ((u64::from(self.mine.local) + u64::from(n)) % u64::from(self.size)) as u32;
    }

    /// Sets our index (reduced modulo the size); published by [`WrappedEnd::publish`].
    #[inline]
    pub fn set_mine(&mut self, i: u32) {
        self.mine.local = i % self.size;
    }

    /// Publishes our index with one Release store, if it moved: every slot written or
    /// read before it is the peer's once it sees the index. Returns whether it moved.
    #[inline]
    pub fn publish(&mut self) -> bool {
        self.mine.publish(&self.region)
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

    /// A netmap-convention ring of `size` slots: (producer's end, consumer's end).
    fn wrapped(size: u32) -> (Arc<Region>, WrappedEnd, WrappedEnd) {
        let (r, _) = ring(size);
        let p = WrappedEnd::attach(
            r.clone(),
            WrappedIndices {
                mine: TAIL,
                theirs: HEAD,
                size,
            },
        )
        .unwrap();
        let c = WrappedEnd::attach(
            r.clone(),
            WrappedIndices {
                mine: HEAD,
                theirs: TAIL,
                size,
            },
        )
        .unwrap();
        (r, p, c)
    }

    #[test]
    fn wrapped_fills_to_one_short_of_its_size_and_wraps() {
        // Not a power of two: the convention allows any size from 2.
        let (r, mut p, mut c) = wrapped(5);
        for round in 0..12u64 {
            assert_eq!(c.ready(), 0, "empty");
            let mut k = 0;
            while p.room() > 0 {
                r.u64(SLOTS + p.mine() as usize * 8)
                    .store(round * 10 + k, Relaxed);
                p.advance(1);
                k += 1;
            }
            assert_eq!(k, 4, "one slot stays empty");
            assert_eq!(c.ready(), 0, "nothing published yet");
            assert!(p.publish());
            assert!(!p.publish(), "nothing new");
            assert_eq!(c.ready(), 4);
            for k in 0..4 {
                let i = (c.mine() + k) % 5;
                assert_eq!(
                    r.u64(SLOTS + i as usize * 8).load(Relaxed),
                    round * 10 + k as u64
                );
                // The consumer may hand data back in a slot it owns.
                r.u64(SLOTS + i as usize * 8).store(!0, Relaxed);
            }
            c.advance(3);
            assert_eq!(c.ready(), 1);
            assert_eq!(p.room(), 0, "not published yet");
            c.publish();
            assert_eq!(p.room(), 3);
            c.advance(1);
            c.publish();
            assert_eq!(p.room(), 4);
            assert_eq!(p.mine(), c.mine());
        }
        assert_eq!(p.mine(), (12 * 4) % 5, "wrapped around many times");
    }

    #[test]
    fn wrapped_arithmetic_and_lying_peers() {
        let (r, mut p, c) = wrapped(6);
        assert_eq!(p.distance(4, 1), 3);
        assert_eq!(p.distance(1, 4), 3);
        assert_eq!(p.next(5), 0);
        p.set_mine(13);
        assert_eq!(p.mine(), 1);
        p.advance(11);
        assert_eq!(p.mine(), 0);
        p.advance(u32::MAX);
        assert_eq!(p.mine(), u32::MAX % 6);
        // Whatever the peer writes, its index comes out in range.
        r.u32(TAIL).store(u32::MAX, Release);
        assert!(c.theirs() < 6);
        assert!(c.ready() < 6);
        r.u32(HEAD).store(1000, Release);
        assert!(p.theirs() < 6);
        assert!(p.room() < 6);
        // Attaching continues from our index as the region holds it.
        let again = WrappedEnd::attach(
            r.clone(),
            WrappedIndices {
                mine: HEAD,
                theirs: TAIL,
                size: 6,
            },
        )
        .unwrap();
        assert_eq!(again.mine(), 1000 % 6);
        let bad = |mine, theirs, size| WrappedIndices { mine, theirs, size };
        assert!(
            WrappedEnd::attach(r.clone(), bad(0, 64, 1)).is_err(),
            "too small"
        );
        assert!(
            WrappedEnd::attach(r.clone(), bad(0, 4, 8)).is_err(),
            "same line"
        );
        assert!(WrappedEnd::attach(r, bad(2, 128, 8)).is_err(), "misaligned");
    }

    /// Two threads move 1M sequence numbers through a 7-slot netmap ring, publishing
    /// in batches: every item arrives, in order, intact.
    #[test]
    fn wrapped_two_threads_in_order_nothing_lost() {
        const N: u64 = 1_000_000;
        let (r, mut p, mut c) = wrapped(7);
        let pr = r.clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        let t = std::thread::spawn(move || {
            let mut next = 0u64;
            while next < N {
                assert!(Instant::now() < deadline, "producer stuck at {next}");
                let room = p.room();
                let mut k = 0;
                while k < room && next < N {
                    pr.u64(SLOTS + p.mine() as usize * 8).store(next, Relaxed);
                    p.advance(1);
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
            let n = c.ready();
            for _ in 0..n {
                let v = r.u64(SLOTS + c.mine() as usize * 8).load(Relaxed);
                assert_eq!(v, expect);
                expect += 1;
                c.advance(1);
            }
            if !c.publish() {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }
}
