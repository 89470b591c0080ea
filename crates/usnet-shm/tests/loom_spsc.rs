//! Exhaustive interleavings (loom) of the ring index protocol, `usnet_shm::spsc`: a
//! producer fills slots and publishes its index once per batch, a consumer reads the
//! slots below the index it saw and publishes its own. The slots are plain memory
//! (loom's `UnsafeCell`, which reports any access not ordered by happens-before), so
//! the model checks that the one Release store and the one Acquire load per batch are
//! all the ordering the slots need, in both directions. It runs the real
//! `publish_index`/`observe_index` on loom's atomics. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p usnet-shm --release --test loom_spsc`.
#![cfg(loom)]

use std::sync::atomic::Ordering::{self, Relaxed};

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use loom::thread;
use usnet_shm::spsc::{observe_index, publish_index, IndexOps};

struct LoomIndex;

impl IndexOps for LoomIndex {
    type Word = AtomicU32;
    fn load(w: &AtomicU32, o: Ordering) -> u32 {
        w.load(o)
    }
    fn store(w: &AtomicU32, v: u32, o: Ordering) {
        w.store(v, o)
    }
}

/// The protocol with every access Relaxed: slot accesses race, and loom must say so.
struct Unordered;

impl IndexOps for Unordered {
    type Word = AtomicU32;
    fn load(w: &AtomicU32, _: Ordering) -> u32 {
        w.load(Relaxed)
    }
    fn store(w: &AtomicU32, v: u32, _: Ordering) {
        w.store(v, Relaxed)
    }
}

const SIZE: u32 = 2;

struct Slots([UnsafeCell<u32>; SIZE as usize]);
// SAFETY: loom's cells check every access; sharing them is what the model is about.
unsafe impl Sync for Slots {}

/// `items` sequence numbers through a ring of two slots with free-running indices;
/// the consumer writes each slot back (a slot handed back may carry data back, as a
/// zero-copy TX slot the stack marks refused), which the producer reads before it
/// refills the slot.
fn transfer<I: IndexOps<Word = AtomicU32> + 'static>(items: u32) {
    let head = Arc::new(AtomicU32::new(0));
    let tail = Arc::new(AtomicU32::new(0));
    let slots = Arc::new(Slots([UnsafeCell::new(0), UnsafeCell::new(0)]));
    let producer = {
        let (head, tail, slots) = (head.clone(), tail.clone(), slots.clone());
        thread::spawn(move || {
            let (mut h, mut published) = (0u32, 0u32);
            while h < items {
                let t = observe_index::<I>(&tail);
                if h.wrapping_sub(t) >= SIZE {
                    thread::yield_now();
                    continue;
                }
                // A batch: every free slot, then one publication.
                while h < items && h.wrapping_sub(t) < SIZE {
                    slots.0[(h % SIZE) as usize].with_mut(|p| {
                        // SAFETY: loom checks the access (the model's point).
                        let back = unsafe { *p };
                        assert!(h < SIZE || back == !(h - SIZE), "handed-back data lost");
                        unsafe { *p = h }
                    });
                    h += 1;
                }
                publish_index::<I>(&head, h, &mut published);
            }
        })
    };
    let (mut t, mut published) = (0u32, 0u32);
    while t < items {
        let h = observe_index::<I>(&head);
        if h == t {
            thread::yield_now();
            continue;
        }
        while t != h {
            slots.0[(t % SIZE) as usize].with_mut(|p| {
                // SAFETY: as above.
                assert_eq!(unsafe { *p }, t, "slot read before it was written");
                unsafe { *p = !t }
            });
            t += 1;
        }
        publish_index::<I>(&tail, t, &mut published);
    }
    producer.join().unwrap();
}

/// Runs `f` under loom; returns how many interleavings it explored.
fn model(f: impl Fn() + Sync + Send + 'static) -> usize {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = runs.clone();
    b.check(move || {
        r.fetch_add(1, Relaxed);
        f()
    });
    runs.load(Relaxed)
}

#[test]
fn loom_spsc_slots_are_ordered_both_ways() {
    for items in [1, 2, 3, 4] {
        let n = model(move || transfer::<LoomIndex>(items));
        eprintln!("{items} items: {n} interleavings");
        assert!(n > 2, "the model explored only {n} interleavings");
    }
}

#[test]
fn loom_spsc_without_ordering_is_caught() {
    let r = std::panic::catch_unwind(|| model(|| transfer::<Unordered>(2)));
    assert!(r.is_err(), "loom found no race in the unordered protocol");
}
