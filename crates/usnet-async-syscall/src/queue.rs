//! Bounded multi-producer multi-consumer queue of entry indices (after
//! Dmitry Vyukov's bounded MPMC queue design).
//!
//! Each cell is one `u64`: high 32 bits are the cell's sequence number, low 32
//! bits the payload (an entry index). With capacity `N` and positions `p`
//! (u32, wrapping):
//!
//! * cell for position `p` is *free for the producer* of `p` when `seq == p`;
//! * it holds the item of position `p` when `seq == p + 1`;
//! * the consumer of `p` frees it for lap `p + N` by storing `seq = p + N`.
//!
//! Producers claim positions by CAS on `tail`, consumers by CAS on `head`;
//! the two positions live on separate cache lines. A batch claims `k`
//! consecutive positions with one CAS after checking their `k` cells, so a
//! batch of submissions costs one contended RMW, not `k`.
//!
//! Payload and sequence number are written in one release store and read
//! in one acquire load, so a reader sees a payload exactly when it sees the
//! matching sequence number.
//!
//! Hostile peers: every word may contain garbage. Nothing here can cause UB
//! (all atomics, all indices masked); retry loops are bounded and report
//! [`QueueError::Corrupt`] instead of spinning forever on inconsistent state.

use crate::sync::{spin_hint, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// Retries without progress before the queue is declared corrupt. Genuine
/// retries happen only when another producer/consumer wins a CAS, which is
/// progress for the system; a long streak means inconsistent state.
const MAX_RETRIES: u32 = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueError {
    /// Positions and cells disagree in a way no correct party produces.
    Corrupt,
}

#[inline]
fn seq(c: u64) -> u32 {
    (c >> 32) as u32
}

#[inline]
fn cell(seq: u32, payload: u32) -> u64 {
    ((seq as u64) << 32) | payload as u64
}

/// A view of one queue: its cells and its two positions.
#[derive(Clone, Copy)]
pub(crate) struct Queue<'a> {
    pub cells: &'a [AtomicU64],
    pub head: &'a AtomicU32,
    pub tail: &'a AtomicU32,
    /// Capacity - 1; capacity is a power of two equal to `cells.len()`.
    pub mask: u32,
}

impl<'a> Queue<'a> {
    #[inline]
    fn at(&self, pos: u32) -> &'a AtomicU64 {
        // mask < cells.len() by construction: never out of bounds.
        &self.cells[(pos & self.mask) as usize]
    }

    #[inline]
    fn cap(&self) -> u32 {
        self.mask.wrapping_add(1)
    }

    /// Enqueue a prefix of `items` (at most the capacity); returns how many
    /// were enqueued (0: full).
    pub(crate) fn push(&self, items: &[u32]) -> Result<usize, QueueError> {
        if items.is_empty() {
            return Ok(0);
        }
        let want = items.len().min(self.cap() as usize) as u32;
        let mut retries = 0u32;
        loop {
            let pos = self.tail.load(Relaxed);
            let mut k = 0u32;
            let mut raced = false;
            while k < want {
                let p = pos.wrapping_add(k);
                // Acquire pairs with the consumer's release that freed the
                // cell: its read of the old payload happens before our write.
                let dif = seq(self.at(p).load(Acquire)).wrapping_sub(p) as i32;
                if dif == 0 {
                    k += 1;
                } else if dif < 0 {
                    break; // cell still holds lap p - N: full from here on
                } else {
                    raced = true; // another producer advanced past `pos`
                    break;
                }
            }
            if k == 0 {
                if !raced {
                    return Ok(0);
                }
            } else if self
                .tail
                .compare_exchange_weak(pos, pos.wrapping_add(k), Relaxed, Relaxed)
                .is_ok()
            {
                // Positions pos..pos+k are ours: their cells are only written
                // by us until a consumer takes them.
                for (i, &item) in items[..k as usize].iter().enumerate() {
                    let p = pos.wrapping_add(i as u32);
                    // Release: the entry contents written before the push
                    // become visible to the consumer that acquires this cell.
                    self.at(p).store(cell(p.wrapping_add(1), item), Release);
                }
                return Ok(k as usize);
            }
            retries += 1;
            if retries > MAX_RETRIES {
                return Err(QueueError::Corrupt);
            }
            spin_hint();
        }
    }

    /// Dequeue up to `out.len()` items into `out`; returns how many (0: empty).
    pub(crate) fn pop(&self, out: &mut [u32]) -> Result<usize, QueueError> {
        if out.is_empty() {
            return Ok(0);
        }
        let want = out.len().min(self.cap() as usize) as u32;
        let mut retries = 0u32;
        loop {
            let pos = self.head.load(Relaxed);
            let mut k = 0u32;
            let mut raced = false;
            while k < want {
                let p = pos.wrapping_add(k);
                let c = self.at(p).load(Acquire);
                let dif = seq(c).wrapping_sub(p.wrapping_add(1)) as i32;
                if dif == 0 {
                    out[k as usize] = c as u32;
                    k += 1;
                } else if dif < 0 {
                    break; // not yet produced
                } else {
                    raced = true; // another consumer took `p` already
                    break;
                }
            }
            if k == 0 {
                if !raced {
                    return Ok(0);
                }
            } else if self
                .head
                .compare_exchange_weak(pos, pos.wrapping_add(k), Relaxed, Relaxed)
                .is_ok()
            {
                // The payloads read above are the items of pos..pos+k: a cell
                // holding seq p+1 changes only when the consumer of p (us,
                // now) frees it.
                for i in 0..k {
                    let p = pos.wrapping_add(i);
                    self.at(p)
                        .store(cell(p.wrapping_add(self.cap()), 0), Release);
                }
                return Ok(k as usize);
            }
            retries += 1;
            if retries > MAX_RETRIES {
                return Err(QueueError::Corrupt);
            }
            spin_hint();
        }
    }

    /// True if an item may be available (conservative: anything other than
    /// "the cell at head is clearly not yet produced" counts as available,
    /// so a waiter re-checks rather than sleeps).
    pub(crate) fn maybe_nonempty(&self) -> bool {
        let pos = self.head.load(Relaxed);
        let dif = seq(self.at(pos).load(Acquire)).wrapping_sub(pos.wrapping_add(1)) as i32;
        dif >= 0
    }
}

/// A queue in private memory (the requester's free-entry list).
pub(crate) struct OwnedQueue {
    cells: Box<[AtomicU64]>,
    head: AtomicU32,
    tail: AtomicU32,
    mask: u32,
}

impl OwnedQueue {
    /// Queue of capacity `n` (power of two) pre-filled with `0..n`.
    pub(crate) fn full_of_indices(n: u32) -> OwnedQueue {
        assert!(n.is_power_of_two());
        // Lap 0 fully produced: cell i holds item i with seq i + 1.
        let cells = (0..n).map(|i| AtomicU64::new(cell(i + 1, i))).collect();
        OwnedQueue {
            cells,
            head: AtomicU32::new(0),
            tail: AtomicU32::new(n),
            mask: n - 1,
        }
    }

    pub(crate) fn view(&self) -> Queue<'_> {
        Queue {
            cells: &self.cells,
            head: &self.head,
            tail: &self.tail,
            mask: self.mask,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicU32 as A32;
    use std::sync::Arc;

    fn empty(n: u32) -> OwnedQueue {
        let q = OwnedQueue::full_of_indices(n);
        let mut out = vec![0; n as usize];
        assert_eq!(q.view().pop(&mut out).unwrap(), n as usize);
        q
    }

    #[test]
    fn fifo_and_wrap() {
        let q = empty(4);
        let v = q.view();
        let mut out = [0u32; 8];
        for round in 0..10u32 {
            assert_eq!(v.push(&[round, round + 100, round + 200]).unwrap(), 3);
            assert_eq!(v.push(&[1, 2, 3]).unwrap(), 1); // only one slot left
            assert_eq!(v.push(&[9]).unwrap(), 0);
            assert_eq!(v.pop(&mut out[..2]).unwrap(), 2);
            assert_eq!(&out[..2], &[round, round + 100]);
            assert_eq!(v.pop(&mut out).unwrap(), 2);
            assert_eq!(&out[..2], &[round + 200, 1]);
            assert_eq!(v.pop(&mut out).unwrap(), 0);
            assert!(!v.maybe_nonempty());
        }
    }

    #[test]
    fn mpmc_threads() {
        let q = Arc::new(empty(64));
        let done = Arc::new(A32::new(0));
        let per = 20_000u32;
        let producers: Vec<_> = (0..2u32)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut i = 0;
                    while i < per {
                        let batch: Vec<u32> = (i..(i + 5).min(per)).map(|x| t << 24 | x).collect();
                        i += q.view().push(&batch).unwrap() as u32;
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut out = [0u32; 3];
                    while done.load(Relaxed) < 2 * per {
                        let n = q.view().pop(&mut out).unwrap();
                        got.extend_from_slice(&out[..n]);
                        done.fetch_add(n as u32, Relaxed);
                    }
                    got
                })
            })
            .collect();
        producers.into_iter().for_each(|p| p.join().unwrap());
        let mut all = HashSet::new();
        for c in consumers {
            for x in c.join().unwrap() {
                assert!(all.insert(x), "duplicate {x}");
            }
        }
        assert_eq!(all.len(), 2 * per as usize);
    }

    #[test]
    fn garbage_is_bounded() {
        let q = empty(8);
        // A cell claiming to be far ahead while head stays put: a pop must
        // give up with Corrupt rather than spin forever.
        q.cells[0].store(cell(1000, 7), Relaxed);
        assert_eq!(q.view().pop(&mut [0u32; 1]), Err(QueueError::Corrupt));
        q.cells[0].store(cell(1000, 7), Relaxed);
        q.tail.store(0, Relaxed);
        assert_eq!(q.view().push(&[1]), Err(QueueError::Corrupt));
    }
}
