//! A zero-copy port's own area (`usnet_session_abi::zc`), typed: the server creates it, the
//! client attaches it, both reach its rings only through here, and publish and read
//! ring indices only through `usnet_shm::spsc::WrappedEnd`. Indices read from the
//! other side are only ever reduced modulo the ring size; what they mean is checked
//! by the stack (`usnet_stack::zerocopy`).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::Arc;

use usnet_session_abi::zc::{self, Geometry, Layout, Slot, SLOT_BYTES};
use usnet_session_abi::PAGE;
use usnet_shm::spsc::{WrappedEnd, WrappedIndices};
use usnet_shm::Region;

/// The pool geometry a port's header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolGeometry {
    pub buf_size: u32,
    pub buf_count: u32,
    pub headroom: u32,
}

/// One ring of a port: which area, how many entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZcRing {
    Rx,
    Tx,
    Stash,
    Give,
}

/// A zero-copy port's rings in shared memory.
#[derive(Clone)]
pub struct ZcArea {
    region: Arc<Region>,
    layout: Layout,
    pool: PoolGeometry,
}

impl std::fmt::Debug for ZcArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZcArea")
            .field("layout", &self.layout)
            .field("pool", &self.pool)
            .finish()
    }
}

fn bad(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

impl ZcArea {
    /// Server side: a sealed memfd laid out for `g`, its header written.
    pub fn create(g: Geometry, pool: PoolGeometry) -> io::Result<ZcArea> {
        let layout = Layout::new(g).map_err(|_| bad("bad zero-copy geometry"))?;
        let region = Arc::new(Region::create_memfd(
            c"usnet-zc-port",
            layout.total_len,
            true,
        )?);
        let r = &region;
        r.u32(zc::H_VERSION).store(zc::VERSION, Relaxed);
        r.u32(zc::H_RX_SLOTS).store(g.rx_slots, Relaxed);
        r.u32(zc::H_TX_SLOTS).store(g.tx_slots, Relaxed);
        r.u32(zc::H_STASH_SLOTS).store(g.stash_slots, Relaxed);
        r.u32(zc::H_BUF_SIZE).store(pool.buf_size, Relaxed);
        r.u32(zc::H_BUF_COUNT).store(pool.buf_count, Relaxed);
        r.u32(zc::H_HEADROOM).store(pool.headroom, Relaxed);
        r.u64(zc::H_TOTAL_LEN)
            .store(layout.total_len as u64, Relaxed);
        r.u64(zc::H_MAGIC).store(zc::MAGIC, Release);
        Ok(ZcArea {
            region,
            layout,
            pool,
        })
    }

    /// Client side: maps a port area the server sent and checks its header.
    pub fn attach(fd: OwnedFd) -> io::Result<ZcArea> {
        let region = Arc::new(Region::attach_memfd(fd, PAGE, 64 << 20, true)?);
        let r = &region;
        if r.u64(zc::H_MAGIC).load(Acquire) != zc::MAGIC {
            return Err(bad("not a usnet zero-copy port (bad magic)"));
        }
        if r.u32(zc::H_VERSION).load(Relaxed) != zc::VERSION {
            return Err(bad("zero-copy port of another version"));
        }
        let g = Geometry {
            rx_slots: r.u32(zc::H_RX_SLOTS).load(Relaxed),
            tx_slots: r.u32(zc::H_TX_SLOTS).load(Relaxed),
            stash_slots: r.u32(zc::H_STASH_SLOTS).load(Relaxed),
        };
        let layout = Layout::new(g).map_err(|_| bad("bad zero-copy geometry"))?;
        if layout.total_len != r.u64(zc::H_TOTAL_LEN).load(Relaxed) as usize
            || layout.total_len > r.len()
        {
            return Err(bad("zero-copy port header does not match its layout"));
        }
        let pool = PoolGeometry {
            buf_size: r.u32(zc::H_BUF_SIZE).load(Relaxed),
            buf_count: r.u32(zc::H_BUF_COUNT).load(Relaxed),
            headroom: r.u32(zc::H_HEADROOM).load(Relaxed),
        };
        if pool.headroom >= pool.buf_size || pool.buf_count == 0 {
            return Err(bad("zero-copy port with a bad pool geometry"));
        }
        Ok(ZcArea {
            region,
            layout,
            pool,
        })
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    pub fn geometry(&self) -> Geometry {
        self.layout.geometry
    }

    pub fn pool(&self) -> PoolGeometry {
        self.pool
    }

    /// A header word (`usnet_session_abi::zc` offsets).
    pub fn word(&self, off: usize) -> &AtomicU32 {
        self.region.u32(off)
    }

    /// Slots (or entries) of a ring.
    pub fn size(&self, ring: ZcRing) -> u32 {
        let g = self.layout.geometry;
        match ring {
            ZcRing::Rx => g.rx_slots,
            ZcRing::Tx => g.tx_slots,
            ZcRing::Stash | ZcRing::Give => g.stash_slots,
        }
    }

    fn index_offs(ring: ZcRing) -> (usize, usize) {
        match ring {
            ZcRing::Rx => (zc::RX_HEAD, zc::RX_TAIL),
            ZcRing::Tx => (zc::TX_HEAD, zc::TX_TAIL),
            ZcRing::Stash => (zc::STASH_HEAD, zc::STASH_TAIL),
            ZcRing::Give => (zc::GIVE_HEAD, zc::GIVE_TAIL),
        }
    }

    /// The ring's raw (application's `head`, stack's `tail`) words, for tests and
    /// fuzzers that write them wrong on purpose; the sides use [`ZcArea::app_end`]
    /// and [`ZcArea::stack_end`].
    pub fn indices(&self, ring: ZcRing) -> (&AtomicU32, &AtomicU32) {
        let (h, t) = Self::index_offs(ring);
        (self.region.u32(h), self.region.u32(t))
    }

    fn end(&self, ring: ZcRing, mine: usize, theirs: usize) -> WrappedEnd {
        let at = WrappedIndices {
            mine,
            theirs,
            size: self.size(ring),
        };
        WrappedEnd::attach(self.region.clone(), at).expect("checked by Layout::new")
    }

    /// The application's side of a ring: it owns `head`.
    pub fn app_end(&self, ring: ZcRing) -> WrappedEnd {
        let (h, t) = Self::index_offs(ring);
        self.end(ring, h, t)
    }

    /// The stack's side of a ring: it owns `tail`.
    pub fn stack_end(&self, ring: ZcRing) -> WrappedEnd {
        let (h, t) = Self::index_offs(ring);
        self.end(ring, t, h)
    }

    fn slot_off(&self, ring: ZcRing, i: u32) -> usize {
        let i = (i % self.size(ring)) as usize;
        match ring {
            ZcRing::Rx => self.layout.rx_off + i * SLOT_BYTES,
            ZcRing::Tx => self.layout.tx_off + i * SLOT_BYTES,
            ZcRing::Stash => self.layout.stash_off + i * 4,
            ZcRing::Give => self.layout.give_off + i * 4,
        }
    }

    /// Slot `i` (modulo the size) of the RX or TX ring.
    pub fn read_slot(&self, ring: ZcRing, i: u32) -> Slot {
        let mut b = [0u8; SLOT_BYTES];
        self.region
            .read(self.slot_off(ring, i), &mut b)
            .expect("inside the layout");
        Slot::from_bytes(&b)
    }

    pub fn write_slot(&self, ring: ZcRing, i: u32, s: &Slot) {
        self.region
            .write(self.slot_off(ring, i), &s.to_bytes())
            .expect("inside the layout");
    }

    /// Entry `i` (modulo the size) of the stash or give ring: a buffer index.
    pub fn entry(&self, ring: ZcRing, i: u32) -> &AtomicU32 {
        self.region.u32(self.slot_off(ring, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            rx_slots: 8,
            tx_slots: 4,
            stash_slots: 16,
        }
    }

    const POOL: PoolGeometry = PoolGeometry {
        buf_size: 2048,
        buf_count: 64,
        headroom: 128,
    };

    #[test]
    fn a_client_sees_the_slots_the_server_wrote() {
        let s = ZcArea::create(geometry(), POOL).unwrap();
        let c = ZcArea::attach(s.region().fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(c.geometry(), geometry());
        assert_eq!(c.pool(), POOL);
        let slot = Slot {
            buf: 7,
            off: 128,
            len: 1000,
            flags: 0x20,
            socket: (3 << 32) | 9,
        };
        s.write_slot(ZcRing::Rx, 9, &slot); // 9 mod 8 = 1
        assert_eq!(c.read_slot(ZcRing::Rx, 1), slot);
        c.entry(ZcRing::Give, 17).store(5, Relaxed);
        assert_eq!(s.entry(ZcRing::Give, 1).load(Relaxed), 5);
        // The rings do not overlap.
        c.write_slot(ZcRing::Tx, 3, &Slot::default());
        assert_eq!(c.read_slot(ZcRing::Rx, 7), Slot::default());
        assert_eq!(s.read_slot(ZcRing::Rx, 1), slot);
    }

    #[test]
    fn a_lying_header_is_refused() {
        let s = ZcArea::create(geometry(), POOL).unwrap();
        s.word(zc::H_RX_SLOTS).store(1 << 20, Relaxed);
        assert!(ZcArea::attach(s.region().fd().try_clone_to_owned().unwrap()).is_err());
        let s = ZcArea::create(geometry(), POOL).unwrap();
        s.word(zc::H_HEADROOM).store(4096, Relaxed);
        assert!(ZcArea::attach(s.region().fd().try_clone_to_owned().unwrap()).is_err());
    }
}
