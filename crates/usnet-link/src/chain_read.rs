//! Reading one frame of a length known only after the read (up to a bound) straight
//! into pool buffers: the free space of a head buffer, continuation buffers kept
//! ready between reads, and a scratch for what the pool could not give. TAP's
//! `readv` and AF_PACKET's copy path (`recvmsg` of a frame too large for a ring
//! frame) read this way, so the kernel's copy is the frame's only one.

use usnet_pool::{PacketPool, PktBuf};

/// The most iovecs a read uses (the kernel's `UIO_MAXIOV` is far above).
pub(crate) const MAX_IOV: usize = 64;

/// Continuation buffers and a scratch, reused from read to read.
pub(crate) struct ChainRead {
    spare: Vec<PktBuf>,
    scratch: Vec<u8>,
}

impl ChainRead {
    /// For frames of at most `largest` bytes.
    pub(crate) fn new(largest: usize) -> ChainRead {
        ChainRead {
            spare: Vec::new(),
            scratch: vec![0u8; largest],
        }
    }

    /// The scratch, for reads that throw a frame away.
    pub(crate) fn scratch(&mut self) -> &mut [u8] {
        &mut self.scratch
    }

    /// Fills `iov` with where a frame of at most `largest` bytes goes: `head`'s
    /// free space, as many continuation buffers as it needs (taken from the pool
    /// now, kept if unused), then the scratch. Returns how many iovecs it used
    /// (at most `iov.len()`, which must leave room for two).
    pub(crate) fn iovecs(
        &mut self,
        pool: &mut PacketPool,
        head: &PktBuf,
        largest: usize,
        iov: &mut [libc::iovec],
    ) -> usize {
        let first_space = pool.buf_size() - pool.headroom();
        let want = largest
            .saturating_sub(first_space)
            .div_ceil(pool.buf_size())
            .min(iov.len() - 2);
        while self.spare.len() < want {
            match pool.alloc_continuation() {
                Some(c) => self.spare.push(c),
                None => break, // the scratch takes what the chain cannot
            }
        }
        let mut at = |k: usize, b: &mut [u8]| {
            iov[k] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
        };
        at(0, pool.space_mut(head));
        let mut n = 1;
        for c in &self.spare[..want.min(self.spare.len())] {
            at(n, pool.space_mut(c));
            n += 1;
        }
        at(n, &mut self.scratch);
        n + 1
    }

    /// After `len` bytes were read into [`Self::iovecs`]' iovecs for `head`: sets
    /// the buffers' lengths and chains them behind `head`, the scratch's bytes
    /// copied into buffers of their own. False when the pool could not hold them
    /// (the caller frees `head` and counts the frame lost).
    pub(crate) fn finish(&mut self, pool: &mut PacketPool, head: &PktBuf, len: usize) -> bool {
        let space = pool.buf_size() - pool.headroom();
        let first = len.min(space);
        pool.set_len(head, first)
            .expect("fits: read into this space");
        let mut rest = len - first;
        let mut used = 0;
        while rest > 0 && used < self.spare.len() {
            let take = rest.min(pool.buf_size());
            pool.set_len(&self.spare[used], take)
                .expect("a continuation buffer's space");
            rest -= take;
            used += 1;
        }
        let mut tail = head.id();
        for c in self.spare.drain(..used) {
            let id = c.id();
            pool.set_next(tail, Some(c));
            tail = id;
        }
        if rest > 0 {
            match pool.alloc_from(&self.scratch[..rest]) {
                Some(t) => pool.set_next(tail, Some(t)),
                None => return false,
            }
        }
        true
    }

    /// Gives the continuation buffers back (the device lets go of the pool).
    pub(crate) fn release(&mut self, pool: &mut PacketPool) {
        for c in self.spare.drain(..) {
            pool.free(c);
        }
    }
}
