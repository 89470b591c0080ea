//! Backing memory of a request area: a sealed memfd mapped `MAP_SHARED`
//! (threads and processes), or under loom a heap allocation of loom atomics.
//!
//! This is one of the few modules with `unsafe`: it turns the mapping into
//! references to atomics.

use crate::layout::{Geometry, Header, SyscallInfo};
use crate::sync::AtomicU64;
use std::io;

#[cfg(loom)]
pub(crate) use model::Region;
#[cfg(not(loom))]
pub(crate) use real::Region;

#[cfg(not(loom))]
mod real {
    use super::*;
    use crate::layout::{HEADER_SIZE, MAGIC, VERSION};
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
    use std::ptr::NonNull;
    use std::sync::atomic::Ordering;

    /// A mapped request area.
    pub(crate) struct Region {
        ptr: NonNull<u8>,
        map_len: usize,
        geo: Geometry,
        fd: OwnedFd,
    }

    // SAFETY: the mapping is only accessed through atomics (`&Header`,
    // `&[AtomicU64]`, `&[SyscallInfo]`), which are Sync; the pointer is owned
    // and unmapped once in Drop.
    unsafe impl Send for Region {}
    // SAFETY: see above.
    unsafe impl Sync for Region {}

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    fn map(fd: RawFd, len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh shared mapping of a file we hold open; no existing
        // memory is affected. The result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
    }

    impl Region {
        /// Create a new sealed memfd of the right size and initialise the area.
        pub(crate) fn create(geo: Geometry) -> io::Result<Region> {
            let name = c"usnet-ring";
            // SAFETY: valid NUL-terminated name; flags are plain integers.
            let raw = cvt(unsafe {
                libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            })?;
            // SAFETY: `raw` is a fresh descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: plain syscalls on our descriptor.
            cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), geo.total as libc::off_t) })?;
            // Seal the size so no party can shrink the file under a mapping
            // (which would turn accesses into SIGBUS).
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            // SAFETY: plain fcntl on our descriptor.
            cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
            let ptr = map(fd.as_raw_fd(), geo.total)?;
            let r = Region {
                ptr,
                map_len: geo.total,
                geo,
                fd,
            };
            // Fresh memfd pages are zero: every atomic starts at 0, which is
            // what the header wants. The cells need their initial sequence
            // numbers: cell i starts with seq i (free for lap 0).
            for (i, c) in r.sq().iter().enumerate() {
                c.store((i as u64) << 32, Ordering::Relaxed);
            }
            for (i, c) in r.cq().iter().enumerate() {
                c.store((i as u64) << 32, Ordering::Relaxed);
            }
            let m = &r.header().meta.0;
            m.nentries.store(geo.nentries, Ordering::Relaxed);
            m.total_size.store(geo.total as u64, Ordering::Relaxed);
            m.version.store(VERSION, Ordering::Relaxed);
            m.magic.store(MAGIC, Ordering::Release);
            Ok(r)
        }

        /// Attach to an area created elsewhere (another process). Everything
        /// is validated: seals, size, magic, version, geometry.
        pub(crate) fn attach(fd: OwnedFd) -> io::Result<Region> {
            let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
            // SAFETY: plain fcntl on a descriptor we own.
            let seals = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
            if seals & libc::F_SEAL_SHRINK == 0 {
                return Err(bad("request area is not sealed against shrinking"));
            }
            // SAFETY: zeroed stat is a valid out-parameter for fstat.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid descriptor and out-pointer.
            cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
            let size = st.st_size as usize;
            if !(HEADER_SIZE..=(1 << 30)).contains(&size) {
                return Err(bad("request area has a bad size"));
            }
            let ptr = map(fd.as_raw_fd(), size)?;
            // Build the region with a provisional 1-entry geometry so Drop
            // unmaps on every error path; replaced once validated.
            let mut r = Region {
                ptr,
                map_len: size,
                geo: Geometry::new(1).unwrap(),
                fd,
            };
            let m = &r.header().meta.0;
            if m.magic.load(Ordering::Acquire) != MAGIC {
                return Err(bad("bad magic"));
            }
            if m.version.load(Ordering::Relaxed) != VERSION {
                return Err(bad("unsupported version"));
            }
            let n = m.nentries.load(Ordering::Relaxed);
            let geo = Geometry::new(n).ok_or_else(|| bad("bad entry count"))?;
            if geo.total > size {
                return Err(bad("area smaller than its geometry"));
            }
            r.geo = geo;
            Ok(r)
        }

        pub(crate) fn geometry(&self) -> Geometry {
            self.geo
        }

        pub(crate) fn fd(&self) -> BorrowedFd<'_> {
            use std::os::fd::AsFd;
            self.fd.as_fd()
        }

        pub(crate) fn header(&self) -> &Header {
            // SAFETY: the mapping is at least HEADER_SIZE bytes (checked in
            // create/attach), page aligned (so aligned for Header), lives as
            // long as `self`, and Header consists only of atomics, for which
            // any bit pattern is valid and shared mutation is allowed.
            unsafe { &*self.ptr.as_ptr().cast::<Header>() }
        }

        pub(crate) fn sq(&self) -> &[AtomicU64] {
            // SAFETY: geometry validated against the mapping size; offset is
            // 64-byte aligned; AtomicU64 accepts any bits.
            unsafe {
                std::slice::from_raw_parts(
                    self.ptr.as_ptr().add(self.geo.sq_off).cast::<AtomicU64>(),
                    self.geo.nentries as usize,
                )
            }
        }

        pub(crate) fn cq(&self) -> &[AtomicU64] {
            // SAFETY: as for `sq`.
            unsafe {
                std::slice::from_raw_parts(
                    self.ptr.as_ptr().add(self.geo.cq_off).cast::<AtomicU64>(),
                    self.geo.nentries as usize,
                )
            }
        }

        pub(crate) fn entries(&self) -> &[SyscallInfo] {
            // SAFETY: as for `sq`; SyscallInfo is repr(C) atomics only,
            // 64-byte aligned offset.
            unsafe {
                std::slice::from_raw_parts(
                    self.ptr
                        .as_ptr()
                        .add(self.geo.ent_off)
                        .cast::<SyscallInfo>(),
                    self.geo.nentries as usize,
                )
            }
        }

        /// The whole mapping as a byte pointer and length (the fuzz tests use
        /// it to scribble over the area, as a hostile peer would).
        pub(crate) fn raw(&self) -> (*mut u8, usize) {
            (self.ptr.as_ptr(), self.map_len)
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: unmapping exactly the range we mapped; no references
            // into it outlive `self` (all accessors borrow `self`).
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
            }
        }
    }

    /// Make `fd` survive `exec` in the child spawned by `cmd` (clears
    /// `FD_CLOEXEC` between fork and exec, so other threads' children never
    /// inherit it).
    pub(crate) fn inherit_fd(cmd: &mut std::process::Command, fd: RawFd) {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only calls fcntl, which is async-signal-safe,
        // on an fd number that is open in the forked child.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Take ownership of an inherited descriptor number after validating
    /// that it is open.
    pub(crate) fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
        // SAFETY: F_GETFD on an arbitrary number is harmless.
        if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "inherited fd is not open",
            ));
        }
        // SAFETY: the descriptor is open and, by the child protocol, ours.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

#[cfg(loom)]
mod model {
    use super::*;
    use crate::layout::{Line, Meta, WaitWord};
    use crate::sync::{AtomicI64, AtomicU32};

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
        pub(crate) fn header(&self) -> &Header {
            &self.header
        }
        pub(crate) fn sq(&self) -> &[AtomicU64] {
            &self.sq
        }
        pub(crate) fn cq(&self) -> &[AtomicU64] {
            &self.cq
        }
        pub(crate) fn entries(&self) -> &[SyscallInfo] {
            &self.entries
        }
    }
}

#[cfg(not(loom))]
pub(crate) use real::{adopt_fd, inherit_fd};
