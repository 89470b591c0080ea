//! A byte-stream single-producer single-consumer ring in a [`Region`]: the index
//! protocol of [`crate::spsc`] with byte counters instead of slot counters, for data
//! that flows as a stream (a socket's bytes between a stack server and its client).
//!
//! A ring of `size` bytes (a power of two) at `data` is described by two free-running
//! `u64` byte counters, each on its own cache line: `prod` (bytes written, only the
//! producer stores it) and `cons` (bytes read, only the consumer stores it). Bytes in
//! `[cons, prod)` belong to the consumer, the rest of the ring to the producer; byte
//! `i` lives at `data + (i & (size - 1))`.
//!
//! # Memory ordering
//! As in [`crate::spsc`]: the producer copies bytes in, then publishes `prod` with a
//! Release store (once per batch); the consumer's Acquire load of `prod` makes every
//! byte below it visible. The consumer copies bytes out, then hands them back with a
//! Release store of `cons`; the producer's Acquire load of `cons` orders those reads
//! before it overwrites the bytes.
//!
//! # A peer that lies
//! The other side's counter is not trusted. A `cons` that runs ahead of `prod` or falls
//! behind what it already was, or a `prod` more than `size` ahead of `cons`, is
//! [`ByteCorrupt`]; every copy stays inside the ring's bytes whatever the counters say,
//! so a lying peer can only garble the stream it shares with us.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use crate::{RangeError, Region, CACHE_LINE};

/// The other side's counter is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("byte ring counters are inconsistent (prod {prod}, cons {cons}, size {size})")]
pub struct ByteCorrupt {
    pub prod: u64,
    pub cons: u64,
    pub size: u64,
}

/// Where a byte ring lives in its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRingAt {
    /// Offset of the producer's `u64` counter.
    pub prod: usize,
    /// Offset of the consumer's `u64` counter; at least a cache line from `prod`.
    pub cons: usize,
    /// Offset of the ring's bytes.
    pub data: usize,
    /// Bytes in the ring: a power of two.
    pub size: usize,
}

impl ByteRingAt {
    fn check(&self, region: &Region) -> Result<(), RangeError> {
        region.at::<AtomicU64>(self.prod)?;
        region.at::<AtomicU64>(self.cons)?;
        region.check(self.data, self.size, 1)?;
        if !self.size.is_power_of_two() || self.prod.abs_diff(self.cons) < CACHE_LINE {
            return Err(RangeError {
                off: self.cons,
                len: 8,
                align: CACHE_LINE,
                map_len: region.len(),
            });
        }
        Ok(())
    }

    /// Copies of `len` bytes at ring position `pos`: the one or two region ranges.
    fn spans(&self, pos: u64, len: usize) -> [(usize, usize); 2] {
        let at = (pos as usize) & (self.size - 1);
        let first = len.min(self.size - at);
        [(self.data + at, first), (self.data, len - first)]
    }

    /// Copies `src` into the ring at position `pos` (`src` at most the ring's size).
    fn write(&self, region: &Region, pos: u64, src: &[u8]) {
        let mut done = 0;
        for (off, len) in self.spans(pos, src.len()) {
            if len > 0 {
                region
                    .write(off, &src[done..done + len])
                    .expect("ring checked against the mapping at attach");
                done += len;
            }
        }
    }

    /// Copies the ring's bytes at position `pos` into `dst` (at most the ring's size).
    fn read(&self, region: &Region, pos: u64, dst: &mut [u8]) {
        let mut done = 0;
        for (off, len) in self.spans(pos, dst.len()) {
            if len > 0 {
                region
                    .read(off, &mut dst[done..done + len])
                    .expect("ring checked against the mapping at attach");
                done += len;
            }
        }
    }

    /// Both counters to zero (the ring empty), before either side attaches.
    pub fn reset(&self, region: &Region) -> Result<(), RangeError> {
        self.check(region)?;
        region.u64(self.prod).store(0, Release);
        region.u64(self.cons).store(0, Release);
        Ok(())
    }
}

/// The producer's end of a byte ring.
pub struct ByteProducer {
    region: Arc<Region>,
    at: ByteRingAt,
    prod: u64,
    published: u64,
    /// Our last view of the consumer's `cons`.
    cons: u64,
    /// While a [`TailLoan`] is out: the write position, shared with it (the loan
    /// appends too), and the one to believe over `prod`.
    tail: Option<Arc<AtomicU64>>,
}

impl ByteProducer {
    /// Takes the producer's end, continuing from the counters in the region.
    pub fn attach(region: Arc<Region>, at: ByteRingAt) -> Result<ByteProducer, RangeError> {
        at.check(&region)?;
        let prod = region.u64(at.prod).load(Acquire);
        let cons = region.u64(at.cons).load(Acquire).min(prod);
        Ok(ByteProducer {
            region,
            at,
            prod,
            published: prod,
            cons,
            tail: None,
        })
    }

    /// Takes what a [`TailLoan`] appended: the write position is the shared one.
    fn sync(&mut self) {
        if let Some(t) = &self.tail {
            self.prod = t.load(Relaxed);
        }
    }

    /// Hands the write position back to a [`TailLoan`] after we moved it.
    fn store(&self) {
        if let Some(t) = &self.tail {
            t.store(self.prod, Relaxed);
        }
    }

    /// Lets another party append to the ring after our last byte (a stack server's
    /// connection writing received bytes straight into its client's ring): the
    /// loan and this producer share the write position, so either may push and
    /// the bytes stay in the order they were pushed; [`ByteProducer::publish`]
    /// publishes the loan's bytes too. Not for use from two threads at once.
    pub fn lend_tail(&mut self) -> TailLoan {
        let tail = self
            .tail
            .get_or_insert_with(|| Arc::new(AtomicU64::new(self.prod)))
            .clone();
        TailLoan {
            region: self.region.clone(),
            at: self.at,
            tail,
        }
    }

    /// Ends every [`TailLoan`]: what they appended is ours, and from now on they
    /// have no room (a loan that outlives this writes nothing).
    pub fn end_tail_loans(&mut self) {
        self.sync();
        if let Some(t) = self.tail.take() {
            t.store(TAIL_REVOKED, Relaxed);
        }
    }

    /// Bytes pushed (by us or a loan) and not yet published.
    pub fn unpublished(&self) -> usize {
        (self.position() - self.published) as usize
    }

    /// Room for more bytes: reloads the consumer's counter (Acquire).
    pub fn free(&mut self) -> Result<usize, ByteCorrupt> {
        self.sync();
        let cons = self.region.u64(self.at.cons).load(Acquire);
        if cons < self.cons || cons > self.prod {
            return Err(self.corrupt(cons));
        }
        self.cons = cons;
        Ok(self.at.size - (self.prod - cons) as usize)
    }

    /// Bytes written and not yet read, as last seen (no reload).
    pub fn queued(&self) -> usize {
        (self.position() - self.cons) as usize
    }

    /// Copies as much of `src` as fits (by the last [`ByteProducer::free`]); returns
    /// the count. The consumer sees it after [`ByteProducer::publish`].
    pub fn push(&mut self, src: &[u8]) -> usize {
        self.sync();
        let room = self.at.size - (self.prod - self.cons) as usize;
        let n = src.len().min(room);
        self.at.write(&self.region, self.prod, &src[..n]);
        self.prod += n as u64;
        self.store();
        n
    }

    /// Pushes up to `max` bytes read straight from the file `fd` (at `file_off`, or
    /// from its position): the kernel copies the file's bytes into the ring, with no
    /// buffer between (`sendfile` on a usnet socket). Stops at a short read (the end
    /// of the file). Returns the bytes pushed; an error only if nothing was.
    pub fn push_from_fd(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        file_off: Option<i64>,
        max: usize,
    ) -> std::io::Result<usize> {
        self.sync();
        let room = self.at.size - (self.prod - self.cons) as usize;
        let n = max.min(room);
        let mut done = 0;
        for (off, len) in self.at.spans(self.prod, n) {
            if len == 0 {
                continue;
            }
            let at = file_off.map(|o| o + done as i64);
            let got = match self.region.read_from_fd(off, len, fd, at) {
                Ok(g) => g,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            done += got;
            if got < len {
                break;
            }
        }
        self.prod += done as u64;
        self.store();
        Ok(done)
    }

    /// Publishes every pushed byte with one Release store. Returns whether there was
    /// anything new (then the caller notifies the consumer).
    pub fn publish(&mut self) -> bool {
        self.sync();
        if self.prod == self.published {
            return false;
        }
        self.region.u64(self.at.prod).store(self.prod, Release);
        self.published = self.prod;
        true
    }

    /// Appends to `out` the published bytes the consumer has not read (reloading its
    /// counter), without changing the ring: what a consumer that went away left
    /// behind. At most the ring's size, whatever the counters say.
    pub fn unread(&mut self, out: &mut Vec<u8>) -> Result<usize, ByteCorrupt> {
        self.sync();
        let cons = self.region.u64(self.at.cons).load(Acquire);
        if cons < self.cons || cons > self.published {
            return Err(self.corrupt(cons));
        }
        let n = ((self.published - cons) as usize).min(self.at.size);
        let start = out.len();
        out.resize(start + n, 0);
        self.at.read(&self.region, cons, &mut out[start..]);
        Ok(n)
    }

    /// Moves the published bytes the consumer has not read to `out` and takes them
    /// back out of the ring (the producer's counter back to the consumer's), so that
    /// another consumer gets them instead. The caller makes sure the consumer is not
    /// copying out of the ring meanwhile (`usnet_session_abi::slot::RX_BUSY`). Returns the
    /// count.
    pub fn take_unread(&mut self, out: &mut Vec<u8>) -> Result<usize, ByteCorrupt> {
        let n = self.unread(out)?;
        let cons = self.published - n as u64;
        self.prod = cons;
        self.published = cons;
        self.cons = cons;
        self.store();
        self.region.u64(self.at.prod).store(cons, Release);
        Ok(n)
    }

    /// Bytes written since the ring began.
    pub fn position(&self) -> u64 {
        match &self.tail {
            Some(t) => t.load(Relaxed),
            None => self.prod,
        }
    }

    /// The ring's size in bytes.
    pub fn size(&self) -> usize {
        self.at.size
    }

    /// Overwrites bytes pushed at ring position `pos` that are not yet published (a
    /// record header completed after its payload). Returns false, writing nothing,
    /// when the range is not pushed-and-unpublished.
    pub fn rewrite(&mut self, pos: u64, src: &[u8]) -> bool {
        self.sync();
        if pos < self.published || pos + src.len() as u64 > self.prod {
            return false;
        }
        self.at.write(&self.region, pos, src);
        true
    }

    fn corrupt(&self, cons: u64) -> ByteCorrupt {
        ByteCorrupt {
            prod: self.prod,
            cons,
            size: self.at.size as u64,
        }
    }
}

/// A [`TailLoan`]'s shared position once its producer ended the loan.
const TAIL_REVOKED: u64 = u64::MAX;

/// Appends to a producer's ring after its last byte ([`ByteProducer::lend_tail`]);
/// the producer publishes what it appends. It trusts the consumer's counter no more
/// than the producer does: an impossible one leaves it no room.
pub struct TailLoan {
    region: Arc<Region>,
    at: ByteRingAt,
    tail: Arc<AtomicU64>,
}

impl std::fmt::Debug for TailLoan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TailLoan").field("at", &self.at).finish()
    }
}

impl TailLoan {
    /// Room after the last byte: reloads the consumer's counter (Acquire). None
    /// once the producer ended the loan or when the counters are impossible.
    pub fn free(&self) -> usize {
        let prod = self.tail.load(Relaxed);
        if prod == TAIL_REVOKED {
            return 0;
        }
        let cons = self.region.u64(self.at.cons).load(Acquire);
        match prod.checked_sub(cons) {
            Some(q) if q <= self.at.size as u64 => self.at.size - q as usize,
            _ => 0,
        }
    }

    /// Appends as much of `src` as fits; returns the count.
    pub fn push(&self, src: &[u8]) -> usize {
        let n = src.len().min(self.free());
        if n == 0 {
            return 0;
        }
        let prod = self.tail.load(Relaxed);
        self.at.write(&self.region, prod, &src[..n]);
        self.tail.store(prod + n as u64, Relaxed);
        n
    }
}

/// The consumer's end of a byte ring.
pub struct ByteConsumer {
    region: Arc<Region>,
    at: ByteRingAt,
    cons: u64,
    released: u64,
    /// Our last view of the producer's `prod`.
    prod: u64,
}

impl ByteConsumer {
    /// Takes the consumer's end, continuing from the counters in the region.
    pub fn attach(region: Arc<Region>, at: ByteRingAt) -> Result<ByteConsumer, RangeError> {
        at.check(&region)?;
        let cons = region.u64(at.cons).load(Acquire);
        Ok(ByteConsumer {
            region,
            at,
            cons,
            released: cons,
            prod: cons,
        })
    }

    /// Bytes ready to read: reloads the producer's counter (Acquire).
    pub fn available(&mut self) -> Result<usize, ByteCorrupt> {
        let prod = self.region.u64(self.at.prod).load(Acquire);
        // The producer may take unread bytes back (`ByteProducer::take_unread`), never
        // below what was consumed.
        if prod < self.cons || prod - self.cons > self.at.size as u64 {
            return Err(ByteCorrupt {
                prod,
                cons: self.cons,
                size: self.at.size as u64,
            });
        }
        self.prod = prod;
        Ok((prod - self.cons) as usize)
    }

    /// Bytes ready as last seen (no reload).
    pub fn ready(&self) -> usize {
        (self.prod - self.cons) as usize
    }

    /// Copies up to `dst.len()` ready bytes from `skip` bytes in, without consuming.
    pub fn peek(&self, skip: usize, dst: &mut [u8]) -> usize {
        let ready = self.ready();
        if skip >= ready {
            return 0;
        }
        let n = dst.len().min(ready - skip);
        self.at
            .read(&self.region, self.cons + skip as u64, &mut dst[..n]);
        n
    }

    /// Copies up to `dst.len()` ready bytes out and consumes them; returns the count.
    pub fn read(&mut self, dst: &mut [u8]) -> usize {
        let n = self.peek(0, dst);
        self.cons += n as u64;
        n
    }

    /// Consumes `n` ready bytes without copying them.
    pub fn skip(&mut self, n: usize) {
        self.cons += n.min(self.ready()) as u64;
    }

    /// Hands the consumed bytes back with one Release store. Returns whether there was
    /// anything new (then the caller may tell a producer waiting for room).
    pub fn release(&mut self) -> bool {
        if self.cons == self.released {
            return false;
        }
        self.region.u64(self.at.cons).store(self.cons, Release);
        self.released = self.cons;
        true
    }

    /// Hands back the consumed bytes before `pos` (at most what was consumed) with
    /// one Release store: a consumer that keeps bytes it consumed in the ring (a
    /// [`ByteLoan`]) gives them back as it finishes with them. Returns whether there
    /// was anything new.
    pub fn release_to(&mut self, pos: u64) -> bool {
        let pos = pos.min(self.cons);
        if pos <= self.released {
            return false;
        }
        self.region.u64(self.at.cons).store(pos, Release);
        self.released = pos;
        true
    }

    /// Bytes consumed and not yet handed back.
    pub fn unreleased(&self) -> u64 {
        self.cons - self.released
    }

    /// The ring's bytes to read in place (see [`ByteLoan`]).
    pub fn loan(&self) -> ByteLoan {
        ByteLoan {
            region: self.region.clone(),
            at: self.at,
        }
    }

    /// Bytes consumed since the ring began.
    pub fn position(&self) -> u64 {
        self.cons
    }

    /// The ring's size in bytes.
    pub fn size(&self) -> usize {
        self.at.size
    }
}

/// A consumer's view of its ring's bytes in place: those it consumed and has not
/// released ([`ByteConsumer::release_to`]) stay its own, since the producer writes
/// only where the released counter lets it, so they can be read as slices without a
/// copy (a stack server's TCP connection sends straight from a client's send ring).
/// The consumer asks only for such bytes; the producer's own protocol keeps off
/// them. A producer that breaks it (writes bytes it was not given back) garbles
/// only its own stream: the region is a sealed memfd, so no access can fault.
#[derive(Clone)]
pub struct ByteLoan {
    region: Arc<Region>,
    at: ByteRingAt,
}

impl std::fmt::Debug for ByteLoan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLoan").field("at", &self.at).finish()
    }
}

impl ByteLoan {
    /// Ring positions `[pos, pos + n)` as up to two slices (`n` at most the ring's
    /// size). The caller asks only for bytes it consumed and has not released.
    #[allow(unsafe_code)]
    pub fn slices(&self, pos: u64, n: usize) -> (&[u8], &[u8]) {
        let [(a, la), (b, lb)] = self.at.spans(pos, n.min(self.at.size));
        // SAFETY: the ring was checked against the mapping at attach, so both spans
        // are inside it; the bytes are the consumer's until it releases them (type
        // docs), so nobody writes them while the slices live.
        unsafe {
            (
                self.region.lend(a, la).expect("ring checked at attach"),
                self.region.lend(b, lb).expect("ring checked at attach"),
            )
        }
    }

    /// Where `bytes` (a slice [`ByteLoan::slices`] gave) lie among the ring's
    /// bytes: their offset from its first byte. None for other memory.
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let off = self.region.offset_of(bytes)?.checked_sub(self.at.data)?;
        (off + bytes.len() <= self.at.size).then_some(off)
    }

    /// The ring's bytes `[off, off + len)` by offset from its first byte (not by
    /// ring position): bytes [`ByteLoan::slices`] gave, named again by a frame
    /// that carries them (`usnet_pool::Lender`). None past the ring's end.
    #[allow(unsafe_code)]
    pub fn bytes_at(&self, off: usize, len: usize) -> Option<&[u8]> {
        if off.checked_add(len)? > self.at.size {
            return None;
        }
        // SAFETY: inside the ring (checked here and against the mapping at attach).
        // The bytes were the consumer's when `slices` gave them; a frame may still
        // carry them after the consumer released them (a retransmission queued as
        // their acknowledgment came), when the producer may write them again: they
        // are then only copied (by a device) into a segment its receiver already
        // has and drops, and the mapping is a sealed memfd, so no access can fault.
        unsafe { self.region.lend(self.at.data + off, len).ok() }
    }
}

/// A [`ByteLoan`] whose bytes may be named after the consumer gives the ring
/// back: frames that carry a connection's unacknowledged bytes by reference can
/// wait in a queue while the producer writes over the ring. [`KeptLoan::retire`]
/// copies what the connection held, and from then on those bytes are read from
/// the copy.
#[derive(Debug)]
pub struct KeptLoan {
    loan: ByteLoan,
    /// The ring's bytes as they were when retired, at their offsets (only what
    /// was held is copied; the rest reads as zeros, never asked for).
    kept: OnceLock<Box<[u8]>>,
}

impl KeptLoan {
    pub fn new(loan: ByteLoan) -> KeptLoan {
        KeptLoan {
            loan,
            kept: OnceLock::new(),
        }
    }

    /// [`ByteLoan::bytes_at`], from the copy once retired.
    pub fn bytes_at(&self, off: usize, len: usize) -> Option<&[u8]> {
        match self.kept.get() {
            Some(k) => k.get(off..off.checked_add(len)?),
            None => self.loan.bytes_at(off, len),
        }
    }

    /// [`ByteLoan::offset_of`].
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        self.loan.offset_of(bytes)
    }

    /// The consumer gives the ring back, still holding `held` (slices of it,
    /// from [`ByteLoan::slices`]): they are copied, and read from the copy from
    /// now on. Only the first call copies.
    pub fn retire(&self, held: &[&[u8]]) {
        self.kept.get_or_init(|| {
            // Zeroed pages from the allocator cost nothing until written.
            let mut copy = vec![0u8; self.loan.at.size].into_boxed_slice();
            for bytes in held {
                if let Some(off) = self.loan.offset_of(bytes) {
                    copy[off..off + bytes.len()].copy_from_slice(bytes);
                }
            }
            copy
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: ByteRingAt = ByteRingAt {
        prod: 0,
        cons: 64,
        data: 128,
        size: 256,
    };

    fn region() -> Arc<Region> {
        let r = Arc::new(Region::create_memfd(c"bytes-test", 4096, false).unwrap());
        AT.reset(&r).unwrap();
        r
    }

    #[test]
    fn a_tail_loan_and_its_producer_append_in_turn_and_publish_in_order() {
        let (region, at) = (region(), AT);
        let mut p = ByteProducer::attach(region.clone(), at).unwrap();
        let mut c = ByteConsumer::attach(region, at).unwrap();
        p.free().unwrap();
        assert_eq!(p.push(b"ab"), 2);
        let loan = p.lend_tail();
        assert_eq!(loan.free(), 254);
        assert_eq!(loan.push(b"cde"), 3);
        assert_eq!(p.unpublished(), 5, "the loan's bytes wait for the producer");
        assert_eq!(c.available().unwrap(), 0);
        p.free().unwrap();
        assert_eq!(p.push(b"f"), 1);
        assert_eq!(loan.push(b"g"), 1);
        assert!(p.publish());
        assert_eq!(p.position(), 7);
        let mut out = [0u8; 7];
        assert_eq!(c.available().unwrap(), 7);
        assert_eq!(c.read(&mut out), 7);
        assert_eq!(&out, b"abcdefg");
        c.release();
        // Across the wrap, and only into room the consumer gave back.
        let big = [7u8; 300];
        assert_eq!(loan.push(&big), 256);
        assert_eq!(loan.push(b"x"), 0, "full");
        p.publish();
        let mut got = vec![0u8; 256];
        assert_eq!(c.available().unwrap(), 256);
        assert_eq!(c.read(&mut got), 256);
        assert!(got.iter().all(|&b| b == 7));
        c.release();
        // Ended: the producer owns what was appended; the loan writes nothing more.
        assert_eq!(loan.push(b"y"), 1);
        p.end_tail_loans();
        assert_eq!(p.unpublished(), 1);
        assert_eq!(loan.free(), 0);
        assert_eq!(loan.push(b"z"), 0);
        p.free().unwrap();
        assert_eq!(p.push(b"w"), 1);
        p.publish();
        let mut two = [0u8; 2];
        assert_eq!(c.available().unwrap(), 2);
        c.read(&mut two);
        assert_eq!(&two, b"yw");
    }

    #[test]
    fn a_tail_loan_gives_no_room_when_the_consumer_lies() {
        let (region, at) = (region(), AT);
        let mut p = ByteProducer::attach(region.clone(), at).unwrap();
        let loan = p.lend_tail();
        assert_eq!(loan.push(b"abc"), 3);
        region.u64(at.cons).store(10, Release); // ahead of what was written
        assert_eq!(loan.free(), 0);
        assert_eq!(loan.push(b"d"), 0);
        assert!(p.free().is_err(), "the producer reports it");
    }

    #[test]
    fn loaned_bytes_stay_the_consumers_until_released() {
        let (region, at) = (region(), AT);
        let mut p = ByteProducer::attach(region.clone(), at).unwrap();
        let mut c = ByteConsumer::attach(region, at).unwrap();
        // Near the wrap, so a loan straddles it.
        p.free().unwrap();
        let pad = [0u8; 200];
        assert_eq!(p.push(&pad), 200);
        p.publish();
        c.available().unwrap();
        c.skip(200);
        c.release();
        let data: Vec<u8> = (0..100u8).collect();
        p.free().unwrap();
        assert_eq!(p.push(&data), 100);
        p.publish();
        assert_eq!(c.available().unwrap(), 100);
        // Consumed without a copy, and not handed back: the producer has no room
        // for them, and they read in place across the wrap.
        c.skip(100);
        assert_eq!(c.unreleased(), 100);
        assert_eq!(p.free().unwrap(), 256 - 100);
        let loan = c.loan();
        let (a, b) = loan.slices(200, 100);
        assert_eq!((a.len(), b.len()), (56, 44));
        assert_eq!([a, b].concat(), data);
        // Handed back in part, then past what was consumed (clamped).
        assert!(c.release_to(230));
        assert!(!c.release_to(230), "nothing new");
        assert_eq!(p.free().unwrap(), 256 - 70);
        assert!(c.release_to(u64::MAX));
        assert_eq!(c.unreleased(), 0);
        assert_eq!(p.free().unwrap(), 256);
        let (a, b) = loan.slices(230, 30);
        assert_eq!([a, b].concat(), data[30..60]);
    }

    #[test]
    fn a_loans_slices_are_found_again_by_offset() {
        let (region, at) = (region(), AT);
        let mut p = ByteProducer::attach(region.clone(), at).unwrap();
        let mut c = ByteConsumer::attach(region.clone(), at).unwrap();
        let data: Vec<u8> = (0..=255u8).collect();
        p.free().unwrap();
        assert_eq!(p.push(&data[..200]), 200);
        p.publish();
        c.available().unwrap();
        c.skip(200);
        let loan = c.loan();
        let (a, b) = loan.slices(150, 50);
        assert!(b.is_empty());
        assert_eq!(loan.offset_of(a), Some(150));
        assert_eq!(loan.offset_of(&a[10..20]), Some(160));
        assert_eq!(loan.bytes_at(160, 10), Some(&data[160..170]));
        assert_eq!(loan.bytes_at(250, 7), None, "past the ring's end");
        // Other memory is not the ring's.
        assert_eq!(loan.offset_of(&data[..4]), None);
        // In the mapping, the slice lies at the ring's data offset plus its position.
        assert_eq!(region.offset_of(a), Some(at.data + 150));

        // Kept: once retired, what was held reads from a copy while the producer
        // writes over the ring.
        let kept = KeptLoan::new(loan.clone());
        assert_eq!(kept.bytes_at(150, 50), Some(&data[150..200]));
        let (a, b) = loan.slices(150, 50);
        kept.retire(&[a, b]);
        c.release();
        p.free().unwrap();
        assert_eq!(p.push(&[0xee; 256]), 256);
        p.publish();
        assert_eq!(loan.bytes_at(150, 50), Some(&[0xee; 50][..]));
        assert_eq!(kept.bytes_at(150, 50), Some(&data[150..200]));
        assert_eq!(kept.offset_of(&loan.slices(150, 1).0[..1]), Some(150));
        assert_eq!(kept.bytes_at(250, 7), None);
    }

    #[test]
    fn unread_bytes_taken_back_leave_the_consumer_an_empty_ring() {
        let (region, at) = (region(), AT);
        let mut p = ByteProducer::attach(region.clone(), at).unwrap();
        let mut c = ByteConsumer::attach(region, at).unwrap();
        p.free().unwrap();
        assert_eq!(p.push(b"abcdef"), 6);
        p.publish();
        assert_eq!(c.available().unwrap(), 6);
        let mut two = [0u8; 2];
        assert_eq!(c.read(&mut two), 2);
        c.release();
        let mut out = Vec::new();
        assert_eq!(p.take_unread(&mut out).unwrap(), 4);
        assert_eq!(out, b"cdef");
        // The consumer saw 6 published; the counter went back to 2: not corrupt,
        // just empty.
        assert_eq!(c.available().unwrap(), 0);
        p.free().unwrap();
        assert_eq!(p.push(b"xy"), 2);
        p.publish();
        assert_eq!(c.available().unwrap(), 2);
        assert_eq!(c.read(&mut two), 2);
        assert_eq!(&two, b"xy");
    }

    #[test]
    fn unread_bytes_are_what_the_consumer_left_across_the_wrap() {
        let r = region();
        let mut p = ByteProducer::attach(r.clone(), AT).unwrap();
        let mut c = ByteConsumer::attach(r.clone(), AT).unwrap();
        // Move the counters near the wrap, then leave 40 bytes that straddle it.
        p.free().unwrap();
        p.push(&[0u8; 230]);
        p.publish();
        c.available().unwrap();
        c.skip(230);
        c.release();
        p.free().unwrap();
        let data: Vec<u8> = (0..60u8).collect();
        p.push(&data);
        p.publish();
        c.available().unwrap();
        let mut first = [0u8; 20];
        c.read(&mut first);
        c.release();
        let mut left = Vec::new();
        assert_eq!(p.unread(&mut left).unwrap(), 40);
        assert_eq!(left, &data[20..]);
        // Unpublished bytes are not the consumer's; a lying counter hands nothing over.
        p.free().unwrap();
        p.push(&[9; 5]);
        let mut again = Vec::new();
        assert_eq!(p.unread(&mut again).unwrap(), 40);
        r.u64(AT.cons).store(u64::MAX, Release);
        assert!(p.unread(&mut Vec::new()).is_err());
    }

    #[test]
    fn bytes_arrive_in_order_across_the_wrap_and_space_comes_back() {
        let r = region();
        let mut p = ByteProducer::attach(r.clone(), AT).unwrap();
        let mut c = ByteConsumer::attach(r, AT).unwrap();
        let mut next_in = 0u8;
        let mut next_out = 0u8;
        for round in 0..100 {
            let free = p.free().unwrap();
            let chunk: Vec<u8> = (0..(37 + round % 50).min(free))
                .map(|_| {
                    next_in = next_in.wrapping_add(1);
                    next_in
                })
                .collect();
            assert_eq!(p.push(&chunk), chunk.len());
            assert!(p.publish() || chunk.is_empty());
            let avail = c.available().unwrap();
            let mut buf = vec![0u8; avail.min(29 + round % 40)];
            let n = c.read(&mut buf);
            for b in &buf[..n] {
                next_out = next_out.wrapping_add(1);
                assert_eq!(*b, next_out);
            }
            c.release();
        }
    }

    #[test]
    fn a_file_goes_straight_into_the_ring_across_the_wrap() {
        use std::io::Seek;
        use std::os::fd::AsFd;
        let r = region();
        let mut p = ByteProducer::attach(r.clone(), AT).unwrap();
        let mut c = ByteConsumer::attach(r, AT).unwrap();
        // Move the counters near the wrap.
        p.free().unwrap();
        p.push(&[0u8; 200]);
        p.publish();
        c.available().unwrap();
        c.skip(200);
        c.release();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile_with(&data);
        // At an offset: 256 bytes fit, across the ring's end.
        p.free().unwrap();
        assert_eq!(p.push_from_fd(f.as_fd(), Some(10), 1000).unwrap(), 256);
        p.publish();
        let mut got = vec![0u8; 256];
        c.available().unwrap();
        assert_eq!(c.read(&mut got), 256);
        c.release();
        assert_eq!(got, data[10..266]);
        // From the file's position, which the read moves; the end of the file stops it.
        f.seek(std::io::SeekFrom::Start(900)).unwrap();
        p.free().unwrap();
        assert_eq!(p.push_from_fd(f.as_fd(), None, 256).unwrap(), 100);
        assert_eq!(
            p.push_from_fd(f.as_fd(), None, 256).unwrap(),
            0,
            "end of file"
        );
        p.publish();
        let mut got = vec![0u8; 100];
        c.available().unwrap();
        assert_eq!(c.read(&mut got), 100);
        assert_eq!(got, data[900..]);
    }

    fn tempfile_with(data: &[u8]) -> std::fs::File {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!(
            "usnet-shm-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(data).unwrap();
        f
    }

    #[test]
    fn a_full_ring_takes_nothing_more() {
        let r = region();
        let mut p = ByteProducer::attach(r.clone(), AT).unwrap();
        assert_eq!(p.free().unwrap(), 256);
        assert_eq!(p.push(&[1u8; 300]), 256);
        p.publish();
        assert_eq!(p.free().unwrap(), 0);
        assert_eq!(p.push(&[2u8; 10]), 0);
        let mut c = ByteConsumer::attach(r, AT).unwrap();
        let mut buf = [0u8; 100];
        assert_eq!(c.available().unwrap(), 256);
        assert_eq!(c.read(&mut buf), 100);
        c.release();
        assert_eq!(p.free().unwrap(), 100);
    }

    #[test]
    fn lying_counters_are_reported_and_copies_stay_in_the_ring() {
        let r = region();
        let mut p = ByteProducer::attach(r.clone(), AT).unwrap();
        let mut c = ByteConsumer::attach(r.clone(), AT).unwrap();
        p.push(&[7u8; 10]);
        p.publish();
        // The consumer claims to have read more than was written.
        r.u64(AT.cons).store(1000, Relaxed);
        assert!(p.free().is_err());
        // The producer claims more than the ring can hold.
        r.u64(AT.prod).store(10_000, Relaxed);
        assert!(c.available().is_err());
        // A counter that goes back below what was consumed (back to it or above is
        // the producer taking unread bytes back: `take_unread`).
        r.u64(AT.prod).store(10, Relaxed);
        assert_eq!(c.available().unwrap(), 10);
        let mut buf = [0u8; 8];
        assert_eq!(c.read(&mut buf), 8);
        c.release();
        r.u64(AT.prod).store(5, Relaxed);
        assert!(c.available().is_err());
        r.u64(AT.prod).store(9, Relaxed);
        assert_eq!(c.available().unwrap(), 1);
        // Whatever the counters, reads stay inside the ring's bytes.
        let mut buf = [0u8; 10];
        assert_eq!(c.read(&mut buf), 1);
    }
}
