//! Which descriptor number a relay takes in the program. Relays live in fixed
//! ranges the filter knows (`DGRAM_BASE..STREAM_BASE`, `STREAM_BASE..`), and each
//! gets the lowest number its range has free, as the kernel gives numbers, so a
//! program's table stays as small as it would be and under its descriptor limit.
//!
//! Finding that number by listing the program's whole table (`/proc/TID/fd`) for
//! every socket made a program with n connections pay O(n) per `accept`: a Go
//! server taking 6,000 connections kept the supervisor's core busy for 22 s, and
//! its backlog overflowed meanwhile (clients' SYNs were retried after 1 s). A
//! [`Range`] keeps the gaps it knows of (from its last listing, and the numbers of
//! relays it forgot since) and the number above the highest it has seen in use;
//! each candidate is checked in the table by itself (one `lstat`), and the table is
//! listed again only after as many numbers were taken from above as the listing
//! found open, so the listings cost O(1) per socket over time. Numbers it cannot
//! see closed (a relay the program turned into a kernel socket, a `dup2` onto a
//! number) come back at the next listing.

use std::collections::BTreeSet;
use std::io;

/// A process's descriptor table, as far as numbers go.
pub trait Table {
    /// Whether `n` is open.
    fn is_open(&self, n: i32) -> bool;
    /// Every open number at or above `from`.
    fn open_from(&self, from: i32) -> io::Result<Vec<i32>>;
}

/// The table of the process thread `tid` belongs to, read through `/proc`.
pub struct ProcTable(pub i32);

impl Table for ProcTable {
    fn is_open(&self, n: i32) -> bool {
        // A number that cannot be looked at counts as taken: never install over it.
        !matches!(
            std::fs::symlink_metadata(format!("/proc/{}/fd/{n}", self.0)),
            Err(e) if e.kind() == io::ErrorKind::NotFound
        )
    }

    fn open_from(&self, from: i32) -> io::Result<Vec<i32>> {
        Ok(std::fs::read_dir(format!("/proc/{}/fd", self.0))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|n| *n >= from)
            .collect())
    }
}

/// Fewest numbers taken from above between two listings.
const MIN_BUDGET: usize = 64;

/// The numbers of one range, `from..below`.
pub struct Range {
    from: i32,
    below: i32,
    /// Numbers below `high` believed free (each is checked before use).
    gaps: BTreeSet<i32>,
    /// Above the highest number seen in use.
    high: i32,
    /// Numbers still to take from `high` up before the table is listed again.
    budget: usize,
}

impl Range {
    pub fn new(from: i32, below: i32) -> Range {
        Range {
            from,
            below,
            gaps: BTreeSet::new(),
            high: from,
            budget: 0,
        }
    }

    /// The lowest number of the range that `t` has free (racy against the
    /// program's other threads opening files this high, which programs do not do),
    /// or `EMFILE`.
    pub fn take(&mut self, t: &impl Table) -> io::Result<i32> {
        let mut listed = false;
        loop {
            if let Some(n) = self.gaps.pop_first() {
                if !t.is_open(n) {
                    return Ok(n);
                }
                continue;
            }
            if self.budget == 0 || self.high >= self.below {
                if listed {
                    // Listed in this call, and every number since was taken: the
                    // range is full (or its numbers cannot be looked at, which
                    // counts as taken: never a loop over the whole range).
                    return Err(io::Error::from_raw_os_error(libc::EMFILE));
                }
                self.relist(t)?;
                listed = true;
                continue;
            }
            let n = self.high;
            self.high += 1;
            self.budget = self.budget.saturating_sub(1);
            if !t.is_open(n) {
                return Ok(n);
            }
        }
    }

    /// A number a forgotten relay held: likely free again.
    pub fn give_back(&mut self, n: i32) {
        if (self.from..self.high).contains(&n) {
            self.gaps.insert(n);
        }
    }

    fn relist(&mut self, t: &impl Table) -> io::Result<()> {
        let mut open: Vec<i32> = t
            .open_from(self.from)?
            .into_iter()
            .filter(|&n| n < self.below)
            .collect();
        open.sort_unstable();
        self.gaps.clear();
        let mut next = self.from;
        for &n in &open {
            self.gaps.extend(next..n);
            next = n + 1;
        }
        self.high = next;
        self.budget = open.len().max(MIN_BUDGET);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A table in memory that counts its listings and lookups.
    #[derive(Default)]
    struct Fake {
        open: RefCell<BTreeSet<i32>>,
        listings: Cell<usize>,
        lookups: Cell<usize>,
    }

    impl Table for Fake {
        fn is_open(&self, n: i32) -> bool {
            self.lookups.set(self.lookups.get() + 1);
            self.open.borrow().contains(&n)
        }
        fn open_from(&self, from: i32) -> io::Result<Vec<i32>> {
            self.listings.set(self.listings.get() + 1);
            Ok(self.open.borrow().range(from..).copied().collect())
        }
    }

    fn take(r: &mut Range, t: &Fake) -> i32 {
        let n = r.take(t).unwrap();
        assert!(t.open.borrow_mut().insert(n), "{n} was open");
        n
    }

    #[test]
    fn the_lowest_free_number_is_taken_as_the_kernel_would() {
        let t = Fake::default();
        t.open.borrow_mut().extend([10, 11, 13, 200]);
        let mut r = Range::new(10, 100);
        assert_eq!(take(&mut r, &t), 12);
        assert_eq!(take(&mut r, &t), 14);
        assert_eq!(take(&mut r, &t), 15);
        // The program opens 16 itself, unseen: the check skips it.
        t.open.borrow_mut().insert(16);
        assert_eq!(take(&mut r, &t), 17);
        // A relay forgotten: its number comes first again.
        t.open.borrow_mut().remove(&12);
        r.give_back(12);
        assert_eq!(take(&mut r, &t), 12);
        // Numbers outside the range are never handed back into it.
        r.give_back(5);
        r.give_back(150);
        assert_eq!(take(&mut r, &t), 18);
    }

    #[test]
    fn many_sockets_cost_few_listings_of_the_table() {
        let t = Fake::default();
        let mut r = Range::new(384, i32::MAX);
        for _ in 0..10_000 {
            take(&mut r, &t);
        }
        // Listings double the room they leave: about log2(10,000 / 64) + 1.
        assert!(t.listings.get() <= 10, "{} listings", t.listings.get());
        assert_eq!(t.lookups.get(), 10_000);
        assert_eq!(*t.open.borrow().last().unwrap(), 384 + 9_999);
    }

    #[test]
    fn numbers_closed_unseen_come_back_at_the_next_listing() {
        let t = Fake::default();
        let mut r = Range::new(0, 1_000);
        for _ in 0..100 {
            take(&mut r, &t);
        }
        // The program closed 0..50 without the supervisor knowing (kernel sockets
        // it was given at a loopback connect, say).
        t.open.borrow_mut().retain(|&n| n >= 50);
        let mut next = Vec::new();
        for _ in 0..200 {
            next.push(take(&mut r, &t));
        }
        assert!(
            next.iter().any(|&n| n < 50),
            "the closed numbers were found again"
        );
        assert_eq!(t.open.borrow().len(), 250);
        assert!(*t.open.borrow().last().unwrap() < 250 + 100);
    }

    /// A table whose numbers cannot be looked at (a program that made itself
    /// undumpable, so `/proc/PID/fd` is closed to us) is taken as full.
    struct Unreadable;

    impl Table for Unreadable {
        fn is_open(&self, _: i32) -> bool {
            true
        }
        fn open_from(&self, _: i32) -> io::Result<Vec<i32>> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn numbers_that_cannot_be_looked_at_end_in_emfile_not_a_loop() {
        let mut r = Range::new(384, i32::MAX);
        let e = r.take(&Unreadable).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
    }

    #[test]
    fn a_full_range_says_emfile() {
        let t = Fake::default();
        let mut r = Range::new(256, 260);
        for n in 256..260 {
            assert_eq!(take(&mut r, &t), n);
        }
        let e = r.take(&t).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        // One closed: found by the listing the next try makes.
        t.open.borrow_mut().remove(&258);
        assert_eq!(take(&mut r, &t), 258);
    }
}
