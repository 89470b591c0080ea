//! Backing memory of a request area: a sealed memfd mapped through
//! `usnet_shm::Region` (threads and processes), or under loom a heap
//! allocation of loom atomics.
//!
//! Both give the ring the same views: the header words by name, the SQ/CQ
//! cells as slices and one entry at a time as [`Entry`]. The real one finds
//! them at the offsets of the `layout` types, checked by the region; no
//! `unsafe` here.

use crate::layout::Geometry;
use crate::sync::{AtomicI64, AtomicU32, AtomicU64};

#[cfg(loom)]
pub(crate) use model::Region;
#[cfg(not(loom))]
pub(crate) use real::Region;

/// A wait word `{seq, waiters}` of the header (see `layout::WaitWord`).
#[derive(Clone, Copy)]
pub(crate) struct WaitRef<'a> {
    pub seq: &'a AtomicU32,
    pub waiters: &'a AtomicU32,
}

/// One entry, the document's `syscall_info` (see `layout::SyscallInfo`).
#[derive(Clone, Copy)]
pub(crate) struct Entry<'a> {
    pub state: &'a AtomicU32,
    pub num: &'a AtomicU32,
    pub arg: &'a [AtomicU64; 6],
    pub ret: &'a AtomicI64,
}

#[cfg(not(loom))]
mod real {
    use super::*;
    use crate::layout::{
        Header, Meta, SyscallInfo, WaitWord, ENTRY_SIZE, HEADER_SIZE, MAGIC, VERSION,
    };
    use std::io;
    use std::mem::offset_of;
    use std::os::fd::{BorrowedFd, OwnedFd};
    use std::sync::atomic::Ordering;

    const META: usize = offset_of!(Header, meta);
    const MAGIC_AT: usize = META + offset_of!(Meta, magic);
    const VERSION_AT: usize = META + offset_of!(Meta, version);
    const NENTRIES_AT: usize = META + offset_of!(Meta, nentries);
    const TOTAL_AT: usize = META + offset_of!(Meta, total_size);
    const SQ_TAIL: usize = offset_of!(Header, sq_tail);
    const SQ_HEAD: usize = offset_of!(Header, sq_head);
    const CQ_TAIL: usize = offset_of!(Header, cq_tail);
    const CQ_HEAD: usize = offset_of!(Header, cq_head);
    const SQ_WAIT: usize = offset_of!(Header, sq_wait);
    const CQ_WAIT: usize = offset_of!(Header, cq_wait);
    const CTL: usize = offset_of!(Header, ctl);
    const E_STATE: usize = offset_of!(SyscallInfo, state);
    const E_NUM: usize = offset_of!(SyscallInfo, num);
    const E_ARG: usize = offset_of!(SyscallInfo, arg);
    const E_RET: usize = offset_of!(SyscallInfo, ret);

    /// A mapped request area.
    pub(crate) struct Region {
        map: usnet_shm::Region,
        geo: Geometry,
    }

    impl Region {
        /// Create a new sealed memfd of the right size and initialise the area.
        pub(crate) fn create(geo: Geometry) -> io::Result<Region> {
            // Sealed against resizing, so no party can shrink the file under a
            // mapping (which would turn accesses into SIGBUS).
            let map = usnet_shm::Region::create_memfd(c"usnet-async-syscall", geo.total, true)?;
            let r = Region { map, geo };
            // Fresh memfd pages are zero: every atomic starts at 0, which is
            // what the header wants. The cells need their initial sequence
            // numbers: cell i starts with seq i (free for lap 0).
            for (i, c) in r.sq().iter().enumerate() {
                c.store((i as u64) << 32, Ordering::Relaxed);
            }
            for (i, c) in r.cq().iter().enumerate() {
                c.store((i as u64) << 32, Ordering::Relaxed);
            }
            r.map
                .u32(NENTRIES_AT)
                .store(geo.nentries, Ordering::Relaxed);
            r.map
                .u64(TOTAL_AT)
                .store(geo.total as u64, Ordering::Relaxed);
            r.map.u32(VERSION_AT).store(VERSION, Ordering::Relaxed);
            r.map.u64(MAGIC_AT).store(MAGIC, Ordering::Release);
            Ok(r)
        }

        /// Attach to an area created elsewhere (another process). Everything
        /// is validated: seals, size, magic, version, geometry.
        pub(crate) fn attach(fd: OwnedFd) -> io::Result<Region> {
            let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
            let map = usnet_shm::Region::attach_memfd(fd, HEADER_SIZE, 1 << 30, true)?;
            if map.u64(MAGIC_AT).load(Ordering::Acquire) != MAGIC {
                return Err(bad("bad magic"));
            }
            if map.u32(VERSION_AT).load(Ordering::Relaxed) != VERSION {
                return Err(bad("unsupported version"));
            }
            let n = map.u32(NENTRIES_AT).load(Ordering::Relaxed);
            let geo = Geometry::new(n).ok_or_else(|| bad("bad entry count"))?;
            if geo.total > map.len() {
                return Err(bad("area smaller than its geometry"));
            }
            Ok(Region { map, geo })
        }

        pub(crate) fn geometry(&self) -> Geometry {
            self.geo
        }

        pub(crate) fn fd(&self) -> BorrowedFd<'_> {
            self.map.fd()
        }

        pub(crate) fn sq_tail(&self) -> &AtomicU32 {
            self.map.u32(SQ_TAIL)
        }
        pub(crate) fn sq_head(&self) -> &AtomicU32 {
            self.map.u32(SQ_HEAD)
        }
        pub(crate) fn cq_tail(&self) -> &AtomicU32 {
            self.map.u32(CQ_TAIL)
        }
        pub(crate) fn cq_head(&self) -> &AtomicU32 {
            self.map.u32(CQ_HEAD)
        }
        pub(crate) fn ctl(&self) -> &AtomicU32 {
            self.map.u32(CTL)
        }
        fn wait(&self, at: usize) -> WaitRef<'_> {
            WaitRef {
                seq: self.map.u32(at + offset_of!(WaitWord, seq)),
                waiters: self.map.u32(at + offset_of!(WaitWord, waiters)),
            }
        }
        pub(crate) fn sq_wait(&self) -> WaitRef<'_> {
            self.wait(SQ_WAIT)
        }
        pub(crate) fn cq_wait(&self) -> WaitRef<'_> {
            self.wait(CQ_WAIT)
        }

        pub(crate) fn sq(&self) -> &[AtomicU64] {
            self.map
                .slice(self.geo.sq_off, self.geo.nentries as usize)
                .expect("geometry validated against the mapping")
        }

        pub(crate) fn cq(&self) -> &[AtomicU64] {
            self.map
                .slice(self.geo.cq_off, self.geo.nentries as usize)
                .expect("geometry validated against the mapping")
        }

        /// Entry `i`; callers range-check `i < nentries` first.
        #[inline]
        pub(crate) fn entry(&self, i: u32) -> Entry<'_> {
            assert!(i < self.geo.nentries, "entry index checked by the caller");
            let e = self.geo.ent_off + i as usize * ENTRY_SIZE;
            Entry {
                state: self.map.u32(e + E_STATE),
                num: self.map.u32(e + E_NUM),
                arg: self
                    .map
                    .at(e + E_ARG)
                    .expect("geometry validated against the mapping"),
                ret: self.map.i64(e + E_RET),
            }
        }

        /// Size of the mapping (cross-process fuzzing).
        pub(crate) fn len(&self) -> usize {
            self.map.len()
        }

        /// Write one byte anywhere in the area, as a buggy or hostile peer
        /// would (cross-process fuzzing). Offsets past the end are ignored.
        pub(crate) fn poke(&self, off: usize, byte: u8) {
            let _ = self.map.write(off, &[byte]);
        }
    }
}

#[cfg(loom)]
mod model {
    use super::*;
    use crate::layout::{Header, Line, Meta, SyscallInfo, WaitWord};
    use std::io;

    /// Heap-allocated area made of loom atomics.
    pub(crate) struct Region {
        geo: Geometry,
        header: Box<Header>,
        sq: Vec<AtomicU64>,
        cq: Vec<AtomicU64>,
        entries: Vec<SyscallInfo>,
    }

    fn ww() -> Line<WaitWord> {
        Line(WaitWord {
            seq: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
        })
    }

    impl Region {
        pub(crate) fn create(geo: Geometry) -> io::Result<Region> {
            use std::sync::atomic::{AtomicU32 as S32, AtomicU64 as S64};
            let n = geo.nentries as usize;
            let header = Box::new(Header {
                meta: Line(Meta {
                    magic: S64::new(crate::layout::MAGIC),
                    version: S32::new(crate::layout::VERSION),
                    nentries: S32::new(geo.nentries),
                    total_size: S64::new(geo.total as u64),
                }),
                sq_tail: Line(AtomicU32::new(0)),
                sq_head: Line(AtomicU32::new(0)),
                cq_tail: Line(AtomicU32::new(0)),
                cq_head: Line(AtomicU32::new(0)),
                sq_wait: ww(),
                cq_wait: ww(),
                ctl: Line(AtomicU32::new(0)),
            });
            let cells = || (0..n).map(|i| AtomicU64::new((i as u64) << 32)).collect();
            let entries = (0..n)
                .map(|_| SyscallInfo {
                    state: AtomicU32::new(0),
                    num: AtomicU32::new(0),
                    arg: std::array::from_fn(|_| AtomicU64::new(0)),
                    ret: AtomicI64::new(0),
                })
                .collect();
            Ok(Region {
                geo,
                header,
                sq: cells(),
                cq: cells(),
                entries,
            })
        }
        pub(crate) fn geometry(&self) -> Geometry {
            self.geo
        }
        pub(crate) fn sq_tail(&self) -> &AtomicU32 {
            &self.header.sq_tail.0
        }
        pub(crate) fn sq_head(&self) -> &AtomicU32 {
            &self.header.sq_head.0
        }
        pub(crate) fn cq_tail(&self) -> &AtomicU32 {
            &self.header.cq_tail.0
        }
        pub(crate) fn cq_head(&self) -> &AtomicU32 {
            &self.header.cq_head.0
        }
        pub(crate) fn ctl(&self) -> &AtomicU32 {
            &self.header.ctl.0
        }
        pub(crate) fn sq_wait(&self) -> WaitRef<'_> {
            let w = &self.header.sq_wait.0;
            WaitRef {
                seq: &w.seq,
                waiters: &w.waiters,
            }
        }
        pub(crate) fn cq_wait(&self) -> WaitRef<'_> {
            let w = &self.header.cq_wait.0;
            WaitRef {
                seq: &w.seq,
                waiters: &w.waiters,
            }
        }
        pub(crate) fn sq(&self) -> &[AtomicU64] {
            &self.sq
        }
        pub(crate) fn cq(&self) -> &[AtomicU64] {
            &self.cq
        }
        pub(crate) fn entry(&self, i: u32) -> Entry<'_> {
            let e = &self.entries[i as usize];
            Entry {
                state: &e.state,
                num: &e.num,
                arg: &e.arg,
                ret: &e.ret,
            }
        }
    }
}
