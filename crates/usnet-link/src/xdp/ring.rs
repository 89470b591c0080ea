//! The index protocol of AF_XDP's four rings (fill, completion, RX, TX), one side of
//! it: single producer, single consumer, free-running `u32` indices, a power-of-two
//! size.
//!
//! Each ring is shared with the kernel through a mapping of the socket: a producer
//! index, a consumer index, a flags word (`XDP_RING_NEED_WAKEUP`) and the entries.
//! We produce into the fill and TX rings and consume from the RX and completion rings.
//! The rules, at each load and store:
//! - **Producer**: writes entries at `cached_prod & mask`, then publishes them with
//!   one Release store of the producer index per batch, so the kernel, which loads
//!   the index with Acquire, sees the entries. Free room comes from an Acquire load
//!   of the consumer index (the kernel is done with the entries before it, so they
//!   may be overwritten), cached until it runs out.
//! - **Consumer**: an Acquire load of the producer index makes the entries before it
//!   readable; after reading them, one Release store of the consumer index per batch
//!   hands their slots back.
//! - Indices wrap at `u32`: distances are `wrapping_sub`, never compared directly.
//!   A producer index more than `size` ahead of ours is impossible; it is reported
//!   (never trusted) so a broken ring cannot make us read past the entries.
//! - **need_wakeup**: after publishing, a producer reads the flags word; when the
//!   kernel set `XDP_RING_NEED_WAKEUP` it has stopped looking and waits for a system
//!   call (sendto for TX, recvfrom/poll for the fill ring). A full fence between the
//!   publish and the flags load pairs with the kernel's barrier between setting the
//!   flag and its last look at the ring, so either it sees our entries or we see its
//!   flag.

use std::sync::atomic::{fence, AtomicU32, Ordering};

/// `XDP_RING_NEED_WAKEUP`.
pub const NEED_WAKEUP: u32 = 1;

/// One side of one ring, over memory the kernel (or a test) shares with us.
pub struct Ring<T: Copy> {
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    size: u32,
    mask: u32,
    /// Producer side: our producer index. Consumer side: the last producer index seen.
    cached_prod: u32,
    /// Consumer side: our consumer index. Producer side: the last consumer index seen
    /// plus `size` (the first index we may not write).
    cached_cons: u32,
}

// SAFETY: the pointers refer to a mapping owned by the device that owns this ring
// (the ring moves with it); only that owner touches our side of the ring.
unsafe impl<T: Copy + Send> Send for Ring<T> {}

/// A ring whose indices are impossible (the producer more than `size` ahead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokenRing {
    pub producer: u32,
    pub consumer: u32,
}

impl<T: Copy> Ring<T> {
    /// # Safety
    /// `base + off_*` must point at a producer word, a consumer word, a flags word
    /// (each an aligned `u32`) and `size` entries of `T`, all inside one mapping that
    /// outlives the ring; `size` must be a power of two. Only this ring may act as
    /// its side of the protocol.
    pub unsafe fn new(
        base: *mut u8,
        off_producer: usize,
        off_consumer: usize,
        off_flags: usize,
        off_entries: usize,
        size: u32,
    ) -> Ring<T> {
        assert!(size.is_power_of_two(), "ring size {size}");
        // SAFETY: by the caller's contract all offsets are inside the mapping.
        let (producer, consumer, flags, entries) = unsafe {
            (
                base.add(off_producer) as *const AtomicU32,
                base.add(off_consumer) as *const AtomicU32,
                base.add(off_flags) as *const AtomicU32,
                base.add(off_entries) as *mut T,
            )
        };
        let mut r = Ring {
            producer,
            consumer,
            flags,
            entries,
            size,
            mask: size - 1,
            cached_prod: 0,
            cached_cons: 0,
        };
        // Start from the indices in memory (zero for a fresh socket).
        r.cached_prod = r.prod().load(Ordering::Acquire);
        r.cached_cons = r.cons().load(Ordering::Acquire);
        r
    }

    fn prod(&self) -> &AtomicU32 {
        // SAFETY: an aligned u32 inside the live mapping (constructor contract),
        // shared with the kernel, so only ever accessed atomically.
        unsafe { &*self.producer }
    }
    fn cons(&self) -> &AtomicU32 {
        // SAFETY: as for `prod`.
        unsafe { &*self.consumer }
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    // ---------------------------------------------------------- producer side

    /// A producer's view: call once after `new` (the first index we may not write is
    /// the consumer's plus the size).
    pub fn as_producer(mut self) -> Self {
        self.cached_cons = self.cached_cons.wrapping_add(self.size);
        self
    }

    /// Free slots, at least `want` if there are that many (reloads the consumer index
    /// only when the cached room is smaller).
    pub fn free(&mut self, want: u32) -> u32 {
        let room = self.cached_cons.wrapping_sub(self.cached_prod);
        if room >= want {
            return room;
        }
        // Acquire: the kernel finished with the entries before this index.
        self.cached_cons = self.cons().load(Ordering::Acquire).wrapping_add(self.size);
        self.cached_cons
            .wrapping_sub(self.cached_prod)
            .min(self.size)
    }

    /// Writes one entry at the next producer slot (not yet visible: see `submit`).
    /// The caller checked `free` first.
    pub fn push(&mut self, v: T) {
        debug_assert!(self.cached_cons.wrapping_sub(self.cached_prod) > 0);
        let i = (self.cached_prod & self.mask) as usize;
        // SAFETY: i < size, so the slot is inside the entries; the kernel does not
        // read it before the producer index passes it.
        unsafe { self.entries.add(i).write_volatile(v) };
        self.cached_prod = self.cached_prod.wrapping_add(1);
    }

    /// Publishes every pushed entry (one Release store).
    pub fn submit(&mut self) {
        self.prod().store(self.cached_prod, Ordering::Release);
    }

    /// Entries published but not yet taken by the kernel (reloads its index).
    pub fn outstanding(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.cons().load(Ordering::Acquire))
            .min(self.size)
    }

    /// After `submit`: whether the kernel asked for a system call to look again.
    pub fn needs_wakeup(&self) -> bool {
        fence(Ordering::SeqCst);
        // SAFETY: as for `prod`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & NEED_WAKEUP != 0
    }

    // ---------------------------------------------------------- consumer side

    /// Entries ready to read (up to `max`), reloading the producer index when the
    /// cached ones are used up. `Err` when the indices are impossible.
    pub fn available(&mut self, max: u32) -> Result<u32, BrokenRing> {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            // Acquire: the entries before the producer index are written.
            self.cached_prod = self.prod().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        if n > self.size {
            let b = BrokenRing {
                producer: self.cached_prod,
                consumer: self.cached_cons,
            };
            // Forget what we saw; look again next time.
            self.cached_prod = self.cached_cons;
            return Err(b);
        }
        Ok(n.min(max))
    }

    /// Whether an entry is ready (a cheap look for `rx_ready`).
    pub fn has_entries(&self) -> bool {
        self.cached_prod != self.cached_cons
            || self.prod().load(Ordering::Acquire) != self.cached_cons
    }

    /// Reads the `k`-th entry from our consumer index (`k` < what `available` said).
    pub fn peek(&self, k: u32) -> T {
        let i = (self.cached_cons.wrapping_add(k) & self.mask) as usize;
        // SAFETY: i < size: inside the entries; the kernel published this entry
        // (available) and does not rewrite it before we release it.
        unsafe { self.entries.add(i).read_volatile() }
    }

    /// Hands `n` read entries back (one Release store).
    pub fn release(&mut self, n: u32) {
        self.cached_cons = self.cached_cons.wrapping_add(n);
        self.cons().store(self.cached_cons, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ring memory as the kernel lays it out: producer, consumer, flags on their own
    /// cache lines, then the entries.
    struct Mem {
        words: Vec<u64>,
    }
    const P: usize = 0;
    const C: usize = 64;
    const F: usize = 128;
    const E: usize = 192;

    impl Mem {
        fn new(size: u32, start: u32) -> Mem {
            let mut m = Mem {
                words: vec![0u64; (E + size as usize * 16) / 8],
            };
            m.set(P, start);
            m.set(C, start);
            m
        }
        fn base(&mut self) -> *mut u8 {
            self.words.as_mut_ptr().cast()
        }
        fn set(&mut self, off: usize, v: u32) {
            // SAFETY: off is one of the aligned word offsets inside `words`.
            unsafe { (self.base().add(off) as *const AtomicU32).as_ref() }
                .unwrap()
                .store(v, Ordering::SeqCst);
        }
        /// Our side and the other side (playing the kernel) over the same memory.
        fn pair<T: Copy>(&mut self, size: u32) -> (Ring<T>, Ring<T>) {
            let b = self.base();
            // SAFETY: the offsets are inside `words`, which outlives both rings in
            // each test; size is a power of two.
            unsafe {
                (
                    Ring::new(b, P, C, F, E, size),
                    Ring::new(b, P, C, F, E, size),
                )
            }
        }
    }

    #[test]
    fn producer_fills_to_size_then_waits_for_the_consumer() {
        let mut m = Mem::new(8, 0);
        let (p, mut c) = m.pair::<u64>(8);
        let mut p = p.as_producer();
        assert_eq!(p.free(1), 8);
        for v in 0..8 {
            p.push(v);
        }
        assert_eq!(p.free(1), 0);
        assert_eq!(c.available(64), Ok(0), "nothing published yet");
        p.submit();
        assert_eq!(p.outstanding(), 8);
        assert_eq!(c.available(3), Ok(3));
        assert_eq!((c.peek(0), c.peek(2)), (0, 2));
        c.release(3);
        assert_eq!(p.free(1), 3);
        assert_eq!(p.outstanding(), 5);
        assert_eq!(c.available(64), Ok(5));
        assert_eq!(c.peek(4), 7);
    }

    #[test]
    fn indices_wrap_at_u32() {
        for start in [u32::MAX - 3, u32::MAX, 0, 7] {
            let mut m = Mem::new(4, start);
            let (p, mut c) = m.pair::<(u64, u32, u32)>(4);
            let mut p = p.as_producer();
            let mut next = 0u64;
            let mut want = 0u64;
            for round in 0..50u32 {
                let n = p.free(4).min(1 + round % 4);
                for _ in 0..n {
                    p.push((next, next as u32, !(next as u32)));
                    next += 1;
                }
                p.submit();
                let k = c.available(u32::MAX).unwrap();
                let take = k.min(1 + round % 3);
                for i in 0..take {
                    assert_eq!(c.peek(i).0, want, "start {start} round {round}");
                    want += 1;
                }
                c.release(take);
            }
            assert!(next > 40 && want > 30, "start {start}: {next} {want}");
        }
    }

    #[test]
    fn an_impossible_producer_index_is_reported_not_trusted() {
        let mut m = Mem::new(8, 100);
        let (_, mut c) = m.pair::<u64>(8);
        m.set(P, 100 + 9);
        assert_eq!(
            c.available(64),
            Err(BrokenRing {
                producer: 109,
                consumer: 100
            })
        );
        // Behind us (a producer that went backwards) is as impossible.
        m.set(P, 99);
        assert!(c.available(64).is_err());
        m.set(P, 102);
        assert_eq!(c.available(64), Ok(2));
        assert!(c.has_entries());
    }

    #[test]
    fn need_wakeup_follows_the_flags_word() {
        let mut m = Mem::new(4, 0);
        let (p, _) = m.pair::<u64>(4);
        assert!(!p.needs_wakeup());
        m.set(F, NEED_WAKEUP);
        assert!(p.needs_wakeup());
    }
}
