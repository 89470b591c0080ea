//! The packet pool: one contiguous region cut into fixed-size buffers named by a `u32`
//! index (netmap style). Buffers carry headroom so headers can be prepended without a
//! copy, chain for payloads larger than one buffer, and are reference-counted so TCP
//! (or a socket queue and a pcap tap at once) can hold the same buffer.
//!
//! The region is either anonymous memory or a memfd, so the same bytes can later be
//! mapped by another process (shm link, client data area) or lent to the kernel as an
//! AF_XDP UMEM (`usnet_link::xdp`): the region is page-aligned and buffer `i` starts
//! at byte `i * buf_size`, so with a power-of-two buffer size every buffer is one UMEM
//! chunk.
//!
//! Bytes are only ever borrowed buffer by buffer: a slice handed out covers the data
//! of one buffer its caller names, never the whole region. Memory someone else
//! writes while we hold no reference to it — the kernel filling a buffer that sits in
//! an AF_XDP fill ring — is therefore never aliased by a Rust reference.
//!
//! Allocation never touches the heap: the free list is a pre-sized stack of indices.
//! Exhaustion is counted and reported as `None`; it never panics. (The one table that
//! grows is that of fragment lists, below: to the most frames with fragments alive
//! at once, after which its lists are reused.)
//!
//! A frame is its buffer's data, then the data of every buffer chained after it,
//! each buffer's *fragments* following its data. A fragment names a range of
//! another buffer that the frame holds a reference to without owning its data
//! window or its chain: the kernel's `skb_shinfo` frags. That is how a zero-copy
//! TCP segment's payload leaves where it lies: the buffer is still in the
//! connection's send queue (the queue's reference), the frame carries a second
//! reference, and neither touches the other's view of it. [`PacketPool::parts`]
//! walks a frame in order; everything that reads frames goes through it (or
//! [`PacketPool::chain_len`], [`PacketPool::copy_chain`], [`PacketPool::read_chain`],
//! which do).
//!
//! A fragment may also name memory outside the pool that a [`Lender`] keeps
//! mapped (a stack server client's send ring, which is the connection's send
//! buffer): the frame holds the lender alive, and a device that copies the frame
//! (the kernel's copy in `sendmmsg` or `writev`) takes the bytes from where the
//! client wrote them ([`PacketPool::attach_lent`]).
//!
//! The memory itself is a `usnet_shm::BufferArea`: the mapping's `unsafe` lives there.

#![forbid(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use usnet_shm::BufferArea;

/// Buffer sizes a pool may be configured with (BSD's MCLBYTES, the cluster size the rump-kernel client/server study varies).
pub const ALLOWED_BUF_SIZES: [usize; 4] = [2048, 4096, 9216, 65536];
/// Default headroom: room for a virtio-net header, Ethernet, IPv6 plus extension headers
/// and a TCP header with options in front of the payload.
pub const DEFAULT_HEADROOM: usize = 192;
const NONE: u32 = u32::MAX;

/// An owned reference to a pool buffer (one of its reference counts). It is neither
/// `Copy` nor `Clone`: moving it moves the duty to give it back ([`PacketPool::free`],
/// or a queue that frees it later), so the compiler checks buffer ownership along
/// every path, as it will have to once buffers cross process boundaries. A second
/// owner comes from [`PacketPool::retain`].
#[must_use = "a pool buffer must be freed, queued or handed on"]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct PktBuf(u32);

impl PktBuf {
    pub fn index(&self) -> u32 {
        self.0
    }
    /// Names this buffer without owning it.
    pub fn id(&self) -> BufId {
        BufId(self.0)
    }
    /// Hands the reference to an owner that tracks buffers by index (a zero-copy
    /// queue, an application's ring); it gives it back with [`PacketPool::release`].
    pub fn into_index(self) -> u32 {
        self.0
    }
}

/// Names a buffer without owning it: a continuation inside a chain, the last buffer
/// of a chain being extended, a buffer an owner lends for reading. Valid only while
/// an owner holds the buffer (the pool checks indices, so misuse is a wrong read,
/// never memory unsafety).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId(u32);

impl BufId {
    pub fn index(self) -> u32 {
        self.0
    }
}

impl From<&PktBuf> for BufId {
    #[inline]
    fn from(b: &PktBuf) -> BufId {
        BufId(b.0)
    }
}

impl From<&BufId> for BufId {
    #[inline]
    fn from(b: &BufId) -> BufId {
        *b
    }
}

impl From<&mut PktBuf> for BufId {
    #[inline]
    fn from(b: &mut PktBuf) -> BufId {
        BufId(b.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("buffer size {0} is not one of 2048, 4096, 9216, 65536")]
    BadBufSize(usize),
    #[error("headroom {headroom} leaves no room in a {buf_size}-byte buffer")]
    BadHeadroom { headroom: usize, buf_size: usize },
    #[error("a pool needs at least one buffer")]
    Empty,
    #[error("pool region of {0} bytes is too large")]
    TooLarge(usize),
    #[error("cannot create pool memory: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the pool's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory.
    Anonymous,
    /// A memfd, whose descriptor can be passed to another process.
    Memfd,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub buf_size: usize,
    pub count: u32,
    pub headroom: usize,
    pub backing: Backing,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            buf_size: 2048,
            count: 4096,
            headroom: DEFAULT_HEADROOM,
            backing: Backing::Anonymous,
        }
    }
}

/// Offload metadata that travels with a frame (the subset of virtio-net / skb state usnet uses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    /// Receive: the device has verified the L4 checksum.
    pub csum_valid: bool,
    /// Transmit: the L4 checksum is partial; the device must finish it from `csum_start`
    /// and store it at `csum_start + csum_offset`.
    pub needs_csum: bool,
    pub csum_start: u16,
    pub csum_offset: u16,
    /// Transmit: segment this frame into `gso_size` payload pieces (0 = no GSO).
    pub gso_size: u16,
    pub gso_kind: GsoKind,
    /// Length of all headers in front of the payload, for GSO.
    pub hdr_len: u16,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GsoKind {
    #[default]
    None,
    TcpV4,
    TcpV6,
    Udp,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    off: u32,
    len: u32,
    next: u32,
    /// Index of this buffer's fragment list in `PacketPool::frag_lists`, or NONE.
    frags: u32,
    refcnt: u16,
    offload: Offload,
}

const FREE_META: Meta = Meta {
    off: 0,
    len: 0,
    next: NONE,
    frags: NONE,
    refcnt: 0,
    offload: Offload {
        csum_valid: false,
        needs_csum: false,
        csum_start: 0,
        csum_offset: 0,
        gso_size: 0,
        gso_kind: GsoKind::None,
        hdr_len: 0,
    },
};

/// A range of another buffer that a frame carries after a buffer's data (see the
/// module docs): `len` bytes from byte `off` of buffer `buf`, counted from the
/// buffer's start as [`PacketPool::whole`] shows it; or, with `buf` at
/// `u32::MAX - 1`, `len` bytes of a lender's memory ([`PacketPool::attach_lent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frag {
    pub buf: u32,
    pub off: u32,
    pub len: u32,
}

/// Memory outside the pool whose bytes frames may carry by reference
/// ([`PacketPool::attach_lent`]); a frame holds the lender (an `Arc`) until it is
/// freed, so the memory stays mapped however long a device keeps the frame. What
/// the bytes say is the lender's protocol: a stack server's client writes its ring
/// again only after the connection has had those bytes acknowledged (a frame still
/// carrying them then is a duplicate its receiver drops), or after the connection
/// gave the ring back ([`Lender::retire`]).
pub trait Lender: Send + Sync + std::fmt::Debug {
    /// The `len` bytes from offset `off` of the lent memory; None outside it.
    fn lent_bytes(&self, off: usize, len: usize) -> Option<&[u8]>;
    /// The offset at which `bytes` lie in the lent memory, when they lie in it
    /// (found by address: `bytes` came from this memory, through another path).
    fn offset_of(&self, bytes: &[u8]) -> Option<usize>;
    /// The memory goes back to its owner, who will write over it, while frames
    /// built from it may still wait in a queue: from now on they must read
    /// `held` (the bytes the connection had not had acknowledged, slices of this
    /// memory) as they are now, from a copy.
    fn retire(&self, held: &[&[u8]]);
}

/// A stack server client's send ring, lent to the connection that sends from it.
impl Lender for usnet_shm::KeptLoan {
    fn lent_bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.bytes_at(off, len)
    }
    fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        self.offset_of(bytes)
    }
    fn retire(&self, held: &[&[u8]]) {
        self.retire(held);
    }
}

/// A lent range a fragment names ([`Frag`] with `buf == LENT`).
#[derive(Debug)]
struct LentPart {
    lender: Arc<dyn Lender>,
    off: usize,
    len: usize,
}

/// `Frag::buf` of a fragment of lent memory; its `off` indexes `PacketPool::lent`.
const LENT: u32 = u32::MAX - 1;

/// Counters of the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub allocs: u64,
    pub frees: u64,
    /// Allocation attempts that found the pool empty.
    pub exhausted: u64,
    pub in_use: u32,
    pub peak_in_use: u32,
}

pub struct PacketPool {
    /// The bytes, reached only through [`PacketPool::bytes`] and its `_mut` twin, so
    /// no reference ever spans more than one buffer.
    region: BufferArea,
    buf_size: usize,
    headroom: usize,
    meta: Vec<Meta>,
    free: Vec<u32>,
    /// Fragment lists, named by `Meta::frags`; a list given back keeps its capacity
    /// and its index goes to `frag_free`.
    frag_lists: Vec<Vec<Frag>>,
    frag_free: Vec<u32>,
    /// Lent ranges fragments name (`None`: free, its index in `lent_free`).
    lent: Vec<Option<LentPart>>,
    lent_free: Vec<u32>,
    stats: PoolStats,
}

impl std::fmt::Debug for PacketPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketPool")
            .field("buf_size", &self.buf_size)
            .field("count", &self.meta.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl PacketPool {
    pub fn new(cfg: &PoolConfig) -> Result<Self, PoolError> {
        if !ALLOWED_BUF_SIZES.contains(&cfg.buf_size) {
            return Err(PoolError::BadBufSize(cfg.buf_size));
        }
        if cfg.headroom + 64 > cfg.buf_size {
            return Err(PoolError::BadHeadroom {
                headroom: cfg.headroom,
                buf_size: cfg.buf_size,
            });
        }
        if cfg.count == 0 || cfg.count == NONE {
            return Err(PoolError::Empty);
        }
        let bytes = cfg
            .buf_size
            .checked_mul(cfg.count as usize)
            .ok_or(PoolError::TooLarge(usize::MAX))?;
        if bytes > (1usize << 40) {
            return Err(PoolError::TooLarge(bytes));
        }
        let region = match cfg.backing {
            Backing::Anonymous => BufferArea::anonymous(bytes)?,
            // The descriptor may be handed to a client (a zero-copy port): its size is
            // sealed, so nobody it reaches can make our accesses fault.
            Backing::Memfd => BufferArea::create_memfd(c"usnet-pool", bytes)?,
        };
        let mut free: Vec<u32> = (0..cfg.count).collect();
        free.reverse(); // pop hands out low indices first: friendlier to caches and debugging
        Ok(PacketPool {
            region,
            buf_size: cfg.buf_size,
            headroom: cfg.headroom,
            meta: vec![FREE_META; cfg.count as usize],
            free,
            frag_lists: Vec::new(),
            frag_free: Vec::new(),
            lent: Vec::new(),
            lent_free: Vec::new(),
            stats: PoolStats::default(),
        })
    }

    pub fn buf_size(&self) -> usize {
        self.buf_size
    }
    pub fn headroom(&self) -> usize {
        self.headroom
    }
    pub fn count(&self) -> u32 {
        self.meta.len() as u32
    }
    pub fn free_count(&self) -> usize {
        self.free.len()
    }
    pub fn in_use(&self) -> u32 {
        self.stats.in_use
    }
    pub fn stats(&self) -> PoolStats {
        self.stats
    }
    /// The memfd behind the region, if the pool was created with `Backing::Memfd`.
    pub fn memfd_fd(&self) -> Option<RawFd> {
        self.region.fd().map(|f| f.as_raw_fd())
    }
    /// Start address and length of the region, for registering it with the kernel
    /// (an AF_XDP UMEM). The address is page-aligned and stays valid while the pool
    /// lives; the pool never moves or resizes the mapping.
    pub fn region_addr(&self) -> (usize, usize) {
        (self.region.addr(), self.region.len())
    }

    /// Byte offset of a buffer inside the region (for sharing with a peer by offset).
    pub fn region_offset(&self, b: impl Into<BufId>) -> usize {
        let b: BufId = b.into();
        b.0 as usize * self.buf_size
    }

    /// Turns a raw index from an untrusted source into the name of a live buffer.
    pub fn checked(&self, raw: u32) -> Option<BufId> {
        match self.meta.get(raw as usize) {
            Some(m) if m.refcnt > 0 => Some(BufId(raw)),
            _ => None,
        }
    }

    /// Takes a buffer with empty data positioned after the headroom.
    #[inline]
    pub fn alloc(&mut self) -> Option<PktBuf> {
        let Some(i) = self.free.pop() else {
            self.stats.exhausted += 1;
            return None;
        };
        self.meta[i as usize] = Meta {
            off: self.headroom as u32,
            refcnt: 1,
            ..FREE_META
        };
        self.stats.allocs += 1;
        self.stats.in_use += 1;
        self.stats.peak_in_use = self.stats.peak_in_use.max(self.stats.in_use);
        Some(PktBuf(i))
    }

    /// Takes a buffer for the middle or end of a chain: no headroom, so its whole
    /// `buf_size` holds data.
    #[inline]
    pub fn alloc_continuation(&mut self) -> Option<PktBuf> {
        let b = self.alloc()?;
        self.meta[b.0 as usize].off = 0;
        Some(b)
    }

    /// Adds a reference and returns it as a second owner; the buffer returns to the
    /// pool when every owner has freed it.
    pub fn retain(&mut self, b: impl Into<BufId>) -> PktBuf {
        let b: BufId = b.into();
        let m = &mut self.meta[b.0 as usize];
        debug_assert!(m.refcnt > 0, "retain of a free buffer");
        m.refcnt = m.refcnt.saturating_add(1);
        PktBuf(b.0)
    }

    /// Adds a reference for an owner that tracks buffers by index rather than by
    /// `PktBuf` (a zero-copy TCP queue, an application's ring); it gives it back with
    /// [`PacketPool::release`].
    pub fn retain_index(&mut self, b: BufId) {
        let _owned = self.retain(b);
    }

    /// Drops a reference taken with [`PacketPool::retain_index`] (or handed over as
    /// an index).
    pub fn release(&mut self, b: BufId) {
        self.free(PktBuf(b.0));
    }

    pub fn refcount(&self, b: impl Into<BufId>) -> u16 {
        let b: BufId = b.into();
        self.meta[b.0 as usize].refcnt
    }

    /// Drops one reference of `b` and of every buffer chained after it that reaches zero.
    #[inline]
    pub fn free(&mut self, b: PktBuf) {
        let mut cur = b.0;
        while cur != NONE {
            let m = &mut self.meta[cur as usize];
            if m.refcnt == 0 {
                debug_assert!(false, "double free of buffer {cur}");
                return;
            }
            m.refcnt -= 1;
            if m.refcnt > 0 {
                return; // the rest of the chain is still owned through this buffer
            }
            let next = m.next;
            let frags = m.frags;
            m.next = NONE;
            m.frags = NONE;
            self.free.push(cur);
            self.stats.frees += 1;
            self.stats.in_use -= 1;
            if frags != NONE {
                self.release_frags(frags);
            }
            cur = next;
        }
    }

    fn base(&self, b: impl Into<BufId>) -> usize {
        let b: BufId = b.into();
        b.0 as usize * self.buf_size
    }

    /// `len` bytes of the region from byte `start`, all inside one buffer.
    #[inline]
    fn bytes(&self, start: usize, len: usize) -> &[u8] {
        self.region
            .get(start, len)
            .expect("pool range out of bounds")
    }

    #[inline]
    fn bytes_mut(&mut self, start: usize, len: usize) -> &mut [u8] {
        self.region
            .get_mut(start, len)
            .expect("pool range out of bounds")
    }

    /// The frame bytes of this one buffer (not the chain).
    #[inline]
    pub fn data(&self, b: impl Into<BufId>) -> &[u8] {
        let b: BufId = b.into();
        let m = &self.meta[b.0 as usize];
        let start = self.base(b) + m.off as usize;
        self.bytes(start, m.len as usize)
    }

    /// All `buf_size` bytes of one buffer, from its start (pieces a zero-copy queue
    /// or an application names by offset).
    pub fn whole(&self, b: impl Into<BufId>) -> &[u8] {
        let b: BufId = b.into();
        self.bytes(self.base(b), self.buf_size)
    }

    /// [`PacketPool::whole`], writable.
    pub fn whole_mut(&mut self, b: impl Into<BufId>) -> &mut [u8] {
        let b: BufId = b.into();
        self.bytes_mut(self.base(b), self.buf_size)
    }

    #[inline]
    pub fn data_mut(&mut self, b: impl Into<BufId>) -> &mut [u8] {
        let b: BufId = b.into();
        let m = self.meta[b.0 as usize];
        let start = self.base(b) + m.off as usize;
        self.bytes_mut(start, m.len as usize)
    }

    pub fn len(&self, b: impl Into<BufId>) -> usize {
        let b: BufId = b.into();
        self.meta[b.0 as usize].len as usize
    }

    /// Bytes that can still be appended after the data.
    pub fn tailroom(&self, b: impl Into<BufId>) -> usize {
        let b: BufId = b.into();
        let m = &self.meta[b.0 as usize];
        self.buf_size - m.off as usize - m.len as usize
    }

    pub fn headroom_of(&self, b: impl Into<BufId>) -> usize {
        let b: BufId = b.into();
        self.meta[b.0 as usize].off as usize
    }

    /// All writable bytes from the data start to the end of the buffer (for a device that
    /// reads a frame in, followed by `set_len`).
    #[inline]
    pub fn space_mut(&mut self, b: impl Into<BufId>) -> &mut [u8] {
        let b: BufId = b.into();
        let m = self.meta[b.0 as usize];
        let start = self.base(b) + m.off as usize;
        self.bytes_mut(start, self.buf_size - m.off as usize)
    }

    /// Sets the data length; `None` if it would run past the buffer.
    #[inline]
    pub fn set_len(&mut self, b: impl Into<BufId>, len: usize) -> Option<()> {
        let b: BufId = b.into();
        let off = self.meta[b.0 as usize].off as usize;
        if off + len > self.buf_size {
            return None;
        }
        self.meta[b.0 as usize].len = len as u32;
        Some(())
    }

    /// Places the data at byte `off` of the buffer with length `len` (a device that
    /// received a frame where the kernel chose to put it); `None`, changing nothing,
    /// if that would run past the buffer.
    pub fn set_data(&mut self, b: impl Into<BufId>, off: usize, len: usize) -> Option<()> {
        let b: BufId = b.into();
        if off > self.buf_size || len > self.buf_size - off {
            return None;
        }
        let m = &mut self.meta[b.0 as usize];
        m.off = off as u32;
        m.len = len as u32;
        Some(())
    }

    /// Grows the data by `n` bytes at the end and returns them.
    pub fn append(&mut self, b: impl Into<BufId>, n: usize) -> Option<&mut [u8]> {
        let b: BufId = b.into();
        if self.tailroom(b) < n {
            return None;
        }
        let m = &mut self.meta[b.0 as usize];
        let start = m.off as usize + m.len as usize;
        m.len += n as u32;
        let base = self.base(b);
        Some(self.bytes_mut(base + start, n))
    }

    /// Grows the data by `n` bytes at the front (into the headroom) and returns them.
    pub fn prepend(&mut self, b: impl Into<BufId>, n: usize) -> Option<&mut [u8]> {
        let b: BufId = b.into();
        let m = &mut self.meta[b.0 as usize];
        if (m.off as usize) < n {
            return None;
        }
        m.off -= n as u32;
        m.len += n as u32;
        let start = b.0 as usize * self.buf_size + m.off as usize;
        Some(self.bytes_mut(start, n))
    }

    /// Drops `n` bytes from the front of the data (a header consumed).
    pub fn trim_front(&mut self, b: impl Into<BufId>, n: usize) -> Option<()> {
        let b: BufId = b.into();
        let m = &mut self.meta[b.0 as usize];
        if (m.len as usize) < n {
            return None;
        }
        m.off += n as u32;
        m.len -= n as u32;
        Some(())
    }

    /// Keeps only the first `len` bytes of data.
    pub fn truncate(&mut self, b: impl Into<BufId>, len: usize) {
        let b: BufId = b.into();
        let m = &mut self.meta[b.0 as usize];
        m.len = m.len.min(len as u32);
    }

    /// Empties the buffer and puts the data start back after the default headroom.
    pub fn reset(&mut self, b: impl Into<BufId>) {
        let b: BufId = b.into();
        let m = &mut self.meta[b.0 as usize];
        m.off = self.headroom as u32;
        m.len = 0;
        m.offload = Offload::default();
    }

    pub fn offload(&self, b: impl Into<BufId>) -> Offload {
        let b: BufId = b.into();
        self.meta[b.0 as usize].offload
    }
    pub fn set_offload(&mut self, b: impl Into<BufId>, o: Offload) {
        let b: BufId = b.into();
        self.meta[b.0 as usize].offload = o;
    }

    /// The buffer chained after `b`, owned by the chain.
    pub fn next(&self, b: impl Into<BufId>) -> Option<BufId> {
        let b: BufId = b.into();
        match self.meta[b.0 as usize].next {
            NONE => None,
            n => Some(BufId(n)),
        }
    }

    /// Chains `next` after `b`: the chain takes over the caller's reference to
    /// `next` (it is freed with the chain's head).
    pub fn set_next(&mut self, b: impl Into<BufId>, next: Option<PktBuf>) {
        let b: BufId = b.into();
        self.meta[b.0 as usize].next = next.map_or(NONE, |n| n.0);
    }

    /// Splits the chain after `b` into single buffers, appended to `out` in chain
    /// order: the chain's reference to each moves to the caller, who frees them one
    /// by one. Only for a private frame ([`Self::is_private`]): another holder of
    /// the chain would lose its tail.
    pub fn unchain(&mut self, b: &PktBuf, out: &mut Vec<PktBuf>) {
        debug_assert!(self.is_private(b), "unchain of a shared frame");
        let mut cur = b.0;
        loop {
            let next = std::mem::replace(&mut self.meta[cur as usize].next, NONE);
            if next == NONE {
                return;
            }
            out.push(PktBuf(next));
            cur = next;
        }
    }

    /// Total data bytes of the chain starting at `b`.
    pub fn chain_len(&self, b: impl Into<BufId>) -> usize {
        self.parts(b).map(<[u8]>::len).sum()
    }

    /// Copies `bytes` into a new buffer, chaining more buffers when they do not fit in one.
    /// Returns `None` (and frees what it took) when the pool runs dry.
    pub fn alloc_from(&mut self, bytes: &[u8]) -> Option<PktBuf> {
        let head = self.alloc()?;
        let mut cur = head.id();
        let mut rest = bytes;
        loop {
            let room = self.tailroom(cur);
            let take = room.min(rest.len());
            self.append(cur, take)
                .expect("tailroom checked")
                .copy_from_slice(&rest[..take]);
            rest = &rest[take..];
            if rest.is_empty() {
                return Some(head);
            }
            let Some(n) = self.alloc() else {
                self.free(head);
                return None;
            };
            // Continuation buffers need no headroom.
            self.meta[n.0 as usize].off = 0;
            let id = n.id();
            self.set_next(cur, Some(n));
            cur = id;
        }
    }

    /// Appends `parts` (in order) after the data of `tail`, the last buffer of a chain,
    /// chaining continuation buffers (no headroom) when they do not fit. Returns the new
    /// last buffer. When the pool runs dry nothing is changed and `None` comes back, so
    /// a caller can refuse the bytes cleanly.
    pub fn extend_chain(&mut self, tail: impl Into<BufId>, parts: &[&[u8]]) -> Option<BufId> {
        let tail: BufId = tail.into();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let room = self.tailroom(tail);
        let needed = total.saturating_sub(room).div_ceil(self.buf_size);
        if self.free.len() < needed {
            self.stats.exhausted += 1;
            return None;
        }
        let mut cur = tail;
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                if self.tailroom(cur) == 0 {
                    let n = self.alloc_continuation().expect("counted above");
                    let id = n.id();
                    self.set_next(cur, Some(n));
                    cur = id;
                }
                let take = self.tailroom(cur).min(rest.len());
                self.append(cur, take)
                    .expect("tailroom checked")
                    .copy_from_slice(&rest[..take]);
                rest = &rest[take..];
            }
        }
        Some(cur)
    }

    /// Carries `len` bytes from byte `off` of `piece` (counted from the buffer's
    /// start) as a fragment after `b`'s data, with a reference of its own to
    /// `piece`, dropped when `b` is freed. A range that continues `b`'s last
    /// fragment in the same buffer extends it instead (one part, one reference).
    /// `None`, changing nothing, when the range runs past the buffer or `piece` is
    /// free.
    pub fn attach(
        &mut self,
        b: impl Into<BufId>,
        piece: BufId,
        off: usize,
        len: usize,
    ) -> Option<()> {
        let b: BufId = b.into();
        if off > self.buf_size || len > self.buf_size - off || self.checked(piece.0).is_none() {
            return None;
        }
        let list = self.frag_list(b);
        if let Some(last) = self.frag_lists[list as usize].last_mut() {
            if last.buf == piece.0 && last.off + last.len == off as u32 {
                last.len += len as u32;
                return Some(());
            }
        }
        self.retain_index(piece);
        self.frag_lists[list as usize].push(Frag {
            buf: piece.0,
            off: off as u32,
            len: len as u32,
        });
        Some(())
    }

    /// `b`'s fragment list, made if it has none.
    fn frag_list(&mut self, b: BufId) -> u32 {
        match self.meta[b.0 as usize].frags {
            NONE => {
                let i = match self.frag_free.pop() {
                    Some(i) => i,
                    None => {
                        self.frag_lists.push(Vec::new());
                        (self.frag_lists.len() - 1) as u32
                    }
                };
                self.meta[b.0 as usize].frags = i;
                i
            }
            i => i,
        }
    }

    /// Carries `bytes`, which lie in memory `lender` lends, as a fragment after
    /// `b`'s data, holding the lender until `b` is freed (see [`Lender`]). Bytes
    /// that continue `b`'s last fragment in the same lent memory extend it. `None`,
    /// changing nothing, when they do not lie in the lender's memory. Empty bytes
    /// add nothing.
    pub fn attach_lent(
        &mut self,
        b: impl Into<BufId>,
        lender: &Arc<dyn Lender>,
        bytes: &[u8],
    ) -> Option<()> {
        let b: BufId = b.into();
        if bytes.is_empty() {
            return Some(());
        }
        let off = lender.offset_of(bytes)?;
        lender.lent_bytes(off, bytes.len())?;
        let len = u32::try_from(bytes.len()).ok()?;
        let list = self.frag_list(b);
        if let Some(last) = self.frag_lists[list as usize].last_mut() {
            if last.buf == LENT {
                let part = self.lent[last.off as usize]
                    .as_mut()
                    .expect("a fragment names a live lent part");
                if Arc::ptr_eq(&part.lender, lender)
                    && part.off + part.len == off
                    && last.len.checked_add(len).is_some()
                {
                    part.len += bytes.len();
                    last.len += len;
                    return Some(());
                }
            }
        }
        let part = Some(LentPart {
            lender: Arc::clone(lender),
            off,
            len: bytes.len(),
        });
        let i = match self.lent_free.pop() {
            Some(i) => {
                self.lent[i as usize] = part;
                i
            }
            None => {
                self.lent.push(part);
                (self.lent.len() - 1) as u32
            }
        };
        self.frag_lists[list as usize].push(Frag {
            buf: LENT,
            off: i,
            len,
        });
        Some(())
    }

    /// Lent ranges fragments name now (each holds its lender).
    pub fn lent_parts(&self) -> usize {
        self.lent.len() - self.lent_free.len()
    }

    /// The fragments carried after `b`'s data.
    pub fn frags(&self, b: impl Into<BufId>) -> &[Frag] {
        let b: BufId = b.into();
        match self.meta[b.0 as usize].frags {
            NONE => &[],
            i => &self.frag_lists[i as usize],
        }
    }

    /// Drops the references of a freed buffer's fragments and gives its list back.
    fn release_frags(&mut self, list: u32) {
        let mut frags = std::mem::take(&mut self.frag_lists[list as usize]);
        for f in frags.drain(..) {
            if f.buf == LENT {
                self.lent[f.off as usize] = None;
                self.lent_free.push(f.off);
            } else {
                self.free(PktBuf(f.buf));
            }
        }
        self.frag_lists[list as usize] = frags;
        self.frag_free.push(list);
    }

    /// The bytes of a frame in order: each buffer's data, then its fragments, down
    /// the chain. A device gathers a frame from these (one iovec each), a copy
    /// reads them.
    pub fn parts(&self, b: impl Into<BufId>) -> Parts<'_> {
        Parts {
            pool: self,
            cur: Some(b.into()),
            frag: None,
        }
    }

    /// How many slices [`PacketPool::parts`] yields for the frame `b`.
    pub fn part_count(&self, b: impl Into<BufId>) -> usize {
        let mut n = 0;
        let mut cur = Some(b.into());
        while let Some(c) = cur {
            n += 1 + self.frags(c).len();
            cur = self.next(c);
        }
        n
    }

    /// Whether the frame `b` is one buffer: no chain and no fragments.
    pub fn is_single(&self, b: impl Into<BufId>) -> bool {
        let b: BufId = b.into();
        let m = &self.meta[b.0 as usize];
        m.next == NONE && m.frags == NONE
    }

    /// Whether every byte of the frame `b` is reachable through this one reference:
    /// each buffer of its chain held once, no fragment (a fragment's buffer always
    /// has another owner). Only such a frame may be changed in place.
    pub fn is_private(&self, b: impl Into<BufId>) -> bool {
        let mut cur = Some(b.into());
        while let Some(c) = cur {
            let m = &self.meta[c.0 as usize];
            if m.refcnt != 1 || m.frags != NONE {
                return false;
            }
            cur = self.next(c);
        }
        true
    }

    /// Copies the chain's data into `out` (cleared first).
    pub fn copy_chain(&self, b: impl Into<BufId>, out: &mut Vec<u8>) {
        out.clear();
        for d in self.parts(b) {
            out.extend_from_slice(d);
        }
    }

    /// Copies up to `out.len()` bytes of the chain starting `skip` bytes in; returns the count.
    pub fn read_chain(&self, b: impl Into<BufId>, mut skip: usize, out: &mut [u8]) -> usize {
        let mut done = 0;
        for d in self.parts(b) {
            if skip >= d.len() {
                skip -= d.len();
                continue;
            }
            let d = &d[skip..];
            skip = 0;
            let n = d.len().min(out.len() - done);
            out[done..done + n].copy_from_slice(&d[..n]);
            done += n;
            if done == out.len() {
                break;
            }
        }
        done
    }
}

/// The slices of a frame, in order ([`PacketPool::parts`]).
pub struct Parts<'a> {
    pool: &'a PacketPool,
    /// The buffer whose data or fragments come next.
    cur: Option<BufId>,
    /// None: `cur`'s data comes next; Some(i): its fragment `i`.
    frag: Option<usize>,
}

impl<'a> Iterator for Parts<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let pool = self.pool;
        loop {
            let c = self.cur?;
            match self.frag {
                None => {
                    self.frag = Some(0);
                    return Some(pool.data(c));
                }
                Some(i) => match pool.frags(c).get(i) {
                    Some(f) if f.buf == LENT => {
                        self.frag = Some(i + 1);
                        let part = pool.lent[f.off as usize]
                            .as_ref()
                            .expect("a fragment names a live lent part");
                        // Checked when attached; the lender keeps it.
                        return Some(part.lender.lent_bytes(part.off, part.len).unwrap_or(&[]));
                    }
                    Some(f) => {
                        self.frag = Some(i + 1);
                        let whole = pool.whole(BufId(f.buf));
                        return Some(&whole[f.off as usize..][..f.len as usize]);
                    }
                    None => {
                        self.cur = pool.next(c);
                        self.frag = None;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(count: u32) -> PacketPool {
        PacketPool::new(&PoolConfig {
            count,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn a_fragment_follows_its_buffers_data_and_holds_its_own_reference() {
        let mut p = pool(8);
        let head = p.alloc().unwrap();
        p.append(&head, 3).unwrap().copy_from_slice(b"hdr");
        // Two pieces as a zero-copy queue holds them: one reference each.
        let a = p.alloc().unwrap();
        p.whole_mut(&a)[100..105].copy_from_slice(b"hello");
        let b = p.alloc().unwrap();
        p.whole_mut(&b)[7..13].copy_from_slice(b" world");
        p.attach(&head, a.id(), 100, 5).unwrap();
        p.attach(&head, b.id(), 7, 6).unwrap();
        assert!(
            p.attach(&head, a.id(), 2040, 9).is_none(),
            "past the buffer"
        );
        assert_eq!(p.refcount(&a), 2);
        let parts: Vec<&[u8]> = p.parts(&head).collect();
        assert_eq!(parts, [&b"hdr"[..], b"hello", b" world"]);
        assert_eq!(p.part_count(&head), 3);
        assert_eq!(p.chain_len(&head), 14);
        let mut v = Vec::new();
        p.copy_chain(&head, &mut v);
        assert_eq!(v, b"hdrhello world");
        let mut out = [0u8; 6];
        assert_eq!(p.read_chain(&head, 5, &mut out), 6);
        assert_eq!(&out, b"llo wo");
        assert!(!p.is_single(&head) && !p.is_private(&head));
        // The piece's own data window is untouched.
        assert_eq!(p.len(&a), 0);
        // A second owner of the frame (a pcap snapshot) keeps the fragments alive.
        let snap = p.retain(&head);
        p.free(head);
        assert_eq!(p.refcount(&a), 2);
        p.free(snap);
        assert_eq!(p.refcount(&a), 1);
        assert_eq!(p.refcount(&b), 1);
        // The queue's references are the last ones.
        p.free(a);
        p.free(b);
        assert_eq!(p.in_use(), 0);
        // The list is reused, not grown.
        let h2 = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        p.attach(&h2, c.id(), 0, 1).unwrap();
        assert_eq!(p.frag_lists.len(), 1);
        p.free(c);
        p.free(h2);
        assert_eq!(p.in_use(), 0);
    }

    /// Memory outside the pool, lent by address.
    #[derive(Debug)]
    struct VecLender(Vec<u8>);

    impl Lender for VecLender {
        fn lent_bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
            self.0.get(off..off.checked_add(len)?)
        }
        fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
            let base = self.0.as_ptr() as usize;
            let at = (bytes.as_ptr() as usize).checked_sub(base)?;
            (at + bytes.len() <= self.0.len()).then_some(at)
        }
        // Its owner never writes it again.
        fn retire(&self, _held: &[&[u8]]) {}
    }

    #[test]
    fn a_lent_fragment_follows_the_data_and_holds_its_lender_until_freed() {
        let mut p = pool(8);
        let vl = Arc::new(VecLender((0..200u8).collect()));
        let lender: Arc<dyn Lender> = vl.clone();
        let other: Arc<dyn Lender> = Arc::new(VecLender(vec![7; 16]));
        let head = p.alloc_from(b"hdr").unwrap();
        let piece = p.alloc_from(b"piece").unwrap();
        let ring = &vl.0;
        p.attach_lent(&head, &lender, &ring[10..20]).unwrap();
        // Contiguous in the same memory: one part.
        p.attach_lent(&head, &lender, &ring[20..25]).unwrap();
        // Empty: nothing.
        p.attach_lent(&head, &lender, &ring[30..30]).unwrap();
        p.attach(&head, piece.id(), p.headroom(), 2).unwrap();
        // A gap: a second part.
        p.attach_lent(&head, &lender, &ring[0..3]).unwrap();
        // Not the lender's memory: refused, nothing changed.
        assert_eq!(p.attach_lent(&head, &other, &ring[0..3]), None);
        let outside = [1u8; 4];
        assert_eq!(p.attach_lent(&head, &lender, &outside), None);
        assert_eq!(p.frags(&head).len(), 3);
        assert_eq!(p.part_count(&head), 4);
        let mut want = b"hdr".to_vec();
        want.extend_from_slice(&ring[10..25]);
        want.extend_from_slice(b"pi");
        want.extend_from_slice(&ring[0..3]);
        let mut got = Vec::new();
        p.copy_chain(&head, &mut got);
        assert_eq!(got, want);
        assert_eq!(p.chain_len(&head), want.len());
        let mut mid = [0u8; 6];
        assert_eq!(p.read_chain(&head, 15, &mut mid), 6);
        assert_eq!(&mid, &want[15..21]);
        assert!(!p.is_private(&head));
        assert_eq!((p.lent_parts(), Arc::strong_count(&vl)), (2, 4));
        p.free(head);
        assert_eq!((p.lent_parts(), Arc::strong_count(&vl)), (0, 2));
        // The slots are reused, and the piece is its owner's alone again.
        assert_eq!(p.refcount(&piece), 1);
        let h2 = p.alloc().unwrap();
        p.attach_lent(&h2, &lender, &ring[5..6]).unwrap();
        assert_eq!(p.lent.len(), 2);
        p.free(h2);
        p.free(piece);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn a_range_that_continues_the_last_fragment_extends_it() {
        let mut p = pool(4);
        let head = p.alloc().unwrap();
        let a = p.alloc().unwrap();
        p.whole_mut(&a)[10..16].copy_from_slice(b"abcdef");
        p.attach(&head, a.id(), 10, 3).unwrap();
        p.attach(&head, a.id(), 13, 3).unwrap();
        assert_eq!(p.frags(&head).len(), 1);
        assert_eq!(p.refcount(&a), 2, "one reference for the one fragment");
        // Not contiguous: a fragment of its own.
        p.attach(&head, a.id(), 10, 1).unwrap();
        assert_eq!(p.part_count(&head), 3);
        let mut v = Vec::new();
        p.copy_chain(&head, &mut v);
        assert_eq!(v, b"abcdefa");
        p.free(head);
        assert_eq!(p.refcount(&a), 1);
        p.free(a);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn fragments_of_a_chained_buffer_come_before_the_next_buffer() {
        let mut p = pool(8);
        let head = p.alloc_from(b"ab").unwrap();
        let tail = p.alloc_from(b"ef").unwrap();
        let piece = p.alloc().unwrap();
        p.whole_mut(&piece)[0..2].copy_from_slice(b"cd");
        p.attach(&head, piece.id(), 0, 2).unwrap();
        p.set_next(&head, Some(tail));
        let mut v = Vec::new();
        p.copy_chain(&head, &mut v);
        assert_eq!(v, b"abcdef");
        assert!(p.alloc_from(b"x").is_some_and(|x| {
            let private = p.is_private(&x) && p.is_single(&x);
            p.free(x);
            private
        }));
        p.free(head);
        p.free(piece);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn rejects_bad_config() {
        for (size, head, count) in [(1000, 128, 4), (2048, 2040, 4), (2048, 128, 0)] {
            let cfg = PoolConfig {
                buf_size: size,
                headroom: head,
                count,
                backing: Backing::Anonymous,
            };
            assert!(PacketPool::new(&cfg).is_err(), "{size} {head} {count}");
        }
    }

    #[test]
    fn exhaustion_is_counted_not_fatal() {
        let mut p = pool(2);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert!(p.alloc().is_none());
        assert_eq!(p.stats().exhausted, 1);
        p.free(a);
        p.free(b);
        assert_eq!(p.in_use(), 0);
        assert!(p.alloc().is_some());
    }

    #[test]
    fn headroom_prepend_and_trim() {
        let mut p = pool(1);
        let b = p.alloc().unwrap();
        p.append(&b, 4).unwrap().copy_from_slice(b"data");
        p.prepend(&b, 2).unwrap().copy_from_slice(b"hd");
        assert_eq!(p.data(&b), b"hddata");
        p.trim_front(&b, 2).unwrap();
        assert_eq!(p.data(&b), b"data");
        assert!(p.prepend(&b, DEFAULT_HEADROOM + 10).is_none());
        assert!(p.append(&b, 4096).is_none());
    }

    #[test]
    fn chains_hold_large_payloads_and_free_whole() {
        let mut p = pool(64);
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let head = p.alloc_from(&bytes).unwrap();
        assert!(p.next(&head).is_some());
        assert_eq!(p.chain_len(&head), bytes.len());
        let mut out = Vec::new();
        p.copy_chain(&head, &mut out);
        assert_eq!(out, bytes);
        let mut part = [0u8; 3000];
        assert_eq!(p.read_chain(&head, 1500, &mut part), 3000);
        assert_eq!(&part[..], &bytes[1500..4500]);
        p.free(head);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn unchain_hands_each_buffer_of_a_chain_to_the_caller() {
        let mut p = pool(64);
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let head = p.alloc_from(&bytes).unwrap();
        let in_use = p.in_use();
        let mut tail = Vec::new();
        p.unchain(&head, &mut tail);
        assert_eq!(tail.len(), in_use as usize - 1);
        assert!(p.is_single(&head));
        // Each buffer keeps its bytes, in chain order.
        let mut joined = p.data(&head).to_vec();
        for b in &tail {
            assert!(p.is_single(b));
            joined.extend_from_slice(p.data(b));
        }
        assert_eq!(joined, bytes);
        // Freeing the head no longer frees the rest; each goes on its own.
        p.free(head);
        assert_eq!(p.in_use(), in_use - 1);
        for b in tail {
            p.free(b);
        }
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn extend_chain_appends_across_buffers_or_changes_nothing() {
        let mut p = pool(8);
        let head = p.alloc().unwrap();
        p.append(&head, 100).unwrap().fill(1);
        let a: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let b = vec![9u8; 1500];
        let tail = p.extend_chain(&head, &[&a, &b]).unwrap();
        assert_ne!(tail, head.id());
        assert_eq!(p.chain_len(&head), 100 + 3000 + 1500);
        let mut out = Vec::new();
        p.copy_chain(&head, &mut out);
        assert_eq!(&out[100..3100], &a[..]);
        assert_eq!(&out[3100..], &b[..]);
        // Continuation buffers start at offset 0: a full one holds buf_size bytes.
        assert_eq!(p.headroom_of(p.next(&head).unwrap()), 0);
        // Not enough buffers left for 20 KB: refused, chain and pool untouched.
        let in_use = p.in_use();
        let len = p.chain_len(&head);
        assert!(p.extend_chain(tail, &[&vec![0u8; 20_000]]).is_none());
        assert_eq!((p.in_use(), p.chain_len(&head)), (in_use, len));
        p.free(head);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn alloc_from_gives_back_on_exhaustion() {
        let mut p = pool(2);
        assert!(p.alloc_from(&[0u8; 10_000]).is_none());
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn refcount_keeps_buffer_alive() {
        let mut p = pool(1);
        let b = p.alloc().unwrap();
        let i = b.index();
        let second = p.retain(&b);
        p.free(b);
        assert_eq!(p.in_use(), 1);
        assert!(p.checked(i).is_some());
        p.free(second);
        assert_eq!(p.in_use(), 0);
        assert!(p.checked(i).is_none());
        assert!(p.checked(99).is_none());
    }

    #[test]
    fn set_data_places_a_frame_anywhere_in_its_buffer() {
        let mut p = pool(4);
        let b = p.alloc().unwrap();
        p.set_data(&b, 256, 100).unwrap();
        assert_eq!((p.headroom_of(&b), p.len(&b)), (256, 100));
        p.data_mut(&b).fill(7);
        assert_eq!(p.data(&b), &[7u8; 100][..]);
        assert!(p.set_data(&b, 2000, 49).is_none());
        assert!(p.set_data(&b, 2049, 0).is_none());
        assert_eq!((p.headroom_of(&b), p.len(&b)), (256, 100), "unchanged");
        p.set_data(&b, 0, 2048).unwrap();
        assert_eq!(p.tailroom(&b), 0);
        // The region: page-aligned, buffer i at i * buf_size.
        let (addr, len) = p.region_addr();
        assert_eq!(addr % 4096, 0);
        assert_eq!(len, 4 * 2048);
        assert_eq!(p.region_offset(&b), b.index() as usize * 2048);
        p.free(b);
    }

    #[test]
    fn memfd_backing_works() {
        let mut p = PacketPool::new(&PoolConfig {
            count: 8,
            backing: Backing::Memfd,
            ..Default::default()
        })
        .unwrap();
        assert!(p.memfd_fd().is_some());
        let b = p.alloc_from(b"shared").unwrap();
        assert_eq!(p.data(&b), b"shared");
        p.free(b);
    }

    proptest::proptest! {
        #[test]
        fn random_alloc_free_never_leaks(ops in proptest::collection::vec(0u8..4, 0..400)) {
            let mut p = pool(16);
            let mut held = Vec::new();
            for op in ops {
                match op {
                    0 | 1 => if let Some(b) = p.alloc() { held.push(b) },
                    2 => if let Some(b) = held.pop() { p.free(b) },
                    _ => if let Some(b) = held.last() { let b = p.retain(b); held.push(b) },
                }
                proptest::prop_assert_eq!(p.free_count() + p.in_use() as usize, 16);
            }
            for b in held { p.free(b) }
            proptest::prop_assert_eq!(p.in_use(), 0);
        }
    }
}
