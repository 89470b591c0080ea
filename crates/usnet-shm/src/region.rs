//! [`Region`]: one shared mapping with checked offsets.
//!
//! A region maps a memfd or a file shared (`MAP_SHARED`, read-write) and hands out
//! references to atomics at offsets it has checked against the mapping's length and the
//! type's alignment, plus bounded byte copies in and out. Nothing else touches the
//! mapping, so no user needs a raw pointer. The one exception is crate-private: a
//! byte ring's consumer lends the bytes it holds and the producer may not write
//! ([`crate::bytes::ByteLoan`]), under the ownership rule of [`crate::BufferArea`].
//!
//! Offsets normally come from a layout the user validated when it opened the region, so
//! an offset outside the mapping is a bug in the user: the short accessors (`u32`, `u64`,
//! ...) panic with the offset, the `at`/`slice`/`read`/`write` forms return
//! [`RangeError`]. Values *read* from the region are the peer's and are never trusted;
//! they must be checked before they become offsets.
//!
//! A peer that shares a file under `/dev/shm` can still shrink it, which would turn our
//! accesses into SIGBUS. A memfd can be sealed against that ([`Region::create_memfd`],
//! [`Region::attach_memfd`]); `/dev/shm` files cannot, so only processes of the same
//! user (the file is 0600) can do it to each other.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU16, AtomicU32, AtomicU64, AtomicU8};

use memmap2::{MmapOptions, MmapRaw};

use crate::sys;

/// An offset or range that does not fit the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("shared range {off:#x}+{len} (align {align}) is outside the {map_len}-byte mapping or misaligned")]
pub struct RangeError {
    pub off: usize,
    pub len: usize,
    pub align: usize,
    pub map_len: usize,
}

mod sealed {
    pub trait Sealed {}
}

/// Types a [`Region`] hands out references to: atomics, and arrays of them. Every bit
/// pattern is a valid value of these types and every access is atomic, so a peer
/// writing anything at any time cannot make a reference to one unsound. Sealed: a
/// struct of atomics is reached field by field through its offsets.
pub trait Shared: sealed::Sealed + Sync {}

macro_rules! shared {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Shared for $t {}
    )*};
}
shared!(AtomicU8, AtomicU16, AtomicU32, AtomicI32, AtomicU64, AtomicI64);
impl<T: Shared, const N: usize> sealed::Sealed for [T; N] {}
impl<T: Shared, const N: usize> Shared for [T; N] {}

/// A shared read-write mapping of a file or memfd (see the module docs).
pub struct Region {
    map: MmapRaw,
    file: File,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.map.len())
            .field("fd", &self.file.as_raw_fd())
            .finish()
    }
}

/// Whether to fault every page in when mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Populate {
    /// Pages are faulted in on first touch.
    Lazily,
    /// `MAP_POPULATE`: no page fault (and page zeroing) later, e.g. in a timed run.
    Now,
}

impl Region {
    /// Maps the first `len` bytes of `file`. The file must be at least that long (a
    /// mapping past the end of a file faults on access).
    pub fn map(file: File, len: usize, populate: Populate) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map an empty region",
            ));
        }
        let file_len = file.metadata()?.len();
        if file_len < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is {file_len} bytes, shorter than the {len}-byte mapping"),
            ));
        }
        let mut o = MmapOptions::new();
        o.len(len);
        if populate == Populate::Now {
            o.populate();
        }
        let map = o.map_raw(&file)?;
        Ok(Region { map, file })
    }

    /// Creates a memfd of `len` zero bytes and maps it. With `seal`, its size is sealed
    /// (no shrink, no grow, no further seals), so a process it is handed to can never
    /// make our accesses fault.
    pub fn create_memfd(name: &CStr, len: usize, seal: bool) -> io::Result<Region> {
        let fd = sys::memfd(name, seal)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        if seal {
            sys::seal_size(file.as_fd())?;
        }
        Region::map(file, len, Populate::Lazily)
    }

    /// Maps all of a memfd another process created (received over a socket or inherited).
    /// Its size must be in `min_len..=max_len`; with `require_sealed`, it must be sealed
    /// against shrinking.
    pub fn attach_memfd(
        fd: OwnedFd,
        min_len: usize,
        max_len: usize,
        require_sealed: bool,
    ) -> io::Result<Region> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if require_sealed && !sys::sealed_against_shrink(fd.as_fd())? {
            return Err(bad("shared area is not sealed against shrinking"));
        }
        let file = File::from(fd);
        let len = file.metadata()?.len();
        if len < min_len as u64 || len > max_len as u64 {
            return Err(bad("shared area has a bad size"));
        }
        Region::map(file, len as usize, Populate::Lazily)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The offset at which `bytes` lie in the mapping, when they lie in it (by
    /// address: a slice this region lent, found again).
    pub fn offset_of(&self, bytes: &[u8]) -> Option<usize> {
        let off = (bytes.as_ptr() as usize).checked_sub(self.map.as_ptr() as usize)?;
        (off.checked_add(bytes.len())? <= self.map.len()).then_some(off)
    }

    /// The file behind the mapping (liveness locks are taken on it).
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Checks that `len` bytes at `off` lie inside the mapping and that `off` is a
    /// multiple of `align` (the mapping itself is page aligned).
    #[inline]
    pub fn check(&self, off: usize, len: usize, align: usize) -> Result<(), RangeError> {
        let ok = align.is_power_of_two()
            && off & (align - 1) == 0
            && off
                .checked_add(len)
                .is_some_and(|end| end <= self.map.len());
        if ok {
            Ok(())
        } else {
            Err(RangeError {
                off,
                len,
                align,
                map_len: self.map.len(),
            })
        }
    }

    /// A reference to the `T` at `off`.
    #[inline]
    pub fn at<T: Shared>(&self, off: usize) -> Result<&T, RangeError> {
        self.check(off, std::mem::size_of::<T>(), std::mem::align_of::<T>())?;
        // SAFETY: the range is inside the mapping and aligned for T (checked above; the
        // mapping starts page aligned). The mapping is readable and writable and stays
        // mapped as long as `self` lives, which bounds the reference. T is `Shared`: made
        // of atomics only, valid for every bit pattern and mutated only atomically, so
        // a peer writing the same bytes at any time cannot invalidate the reference.
        Ok(unsafe { &*self.map.as_ptr().add(off).cast::<T>() })
    }

    /// A slice of `n` consecutive `T` starting at `off`.
    #[inline]
    pub fn slice<T: Shared>(&self, off: usize, n: usize) -> Result<&[T], RangeError> {
        let len = n.checked_mul(std::mem::size_of::<T>()).ok_or(RangeError {
            off,
            len: usize::MAX,
            align: std::mem::align_of::<T>(),
            map_len: self.map.len(),
        })?;
        self.check(off, len, std::mem::align_of::<T>())?;
        // SAFETY: as in `at`, for `n` elements: the whole range is inside the mapping
        // and aligned (checked above).
        Ok(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off).cast::<T>(), n) })
    }

    #[inline]
    #[track_caller]
    fn must<T: Shared>(&self, off: usize) -> &T {
        match self.at(off) {
            Ok(r) => r,
            Err(e) => panic!("{e} (a layout bug: offsets are checked at open)"),
        }
    }

    /// The `u32` at `off`; panics if the offset is outside the mapping or misaligned
    /// (offsets come from a layout checked when the region was opened).
    #[inline]
    #[track_caller]
    pub fn u32(&self, off: usize) -> &AtomicU32 {
        self.must(off)
    }

    /// As [`Region::u32`].
    #[inline]
    #[track_caller]
    pub fn i32(&self, off: usize) -> &AtomicI32 {
        self.must(off)
    }

    /// As [`Region::u32`].
    #[inline]
    #[track_caller]
    pub fn u64(&self, off: usize) -> &AtomicU64 {
        self.must(off)
    }

    /// As [`Region::u32`].
    #[inline]
    #[track_caller]
    pub fn i64(&self, off: usize) -> &AtomicI64 {
        self.must(off)
    }

    /// `len` bytes at `off` as a slice, or an error outside the mapping.
    ///
    /// # Safety
    /// Nobody may write these bytes while the slice lives: the caller's protocol
    /// gives them to this process (as a byte ring's consumed, unreleased bytes are
    /// the consumer's), and no `write` of this region covers them meanwhile. A peer
    /// that breaks its protocol garbles bytes it was not owed; the mapping is a
    /// sealed memfd or a private file, so no access can fault.
    pub(crate) unsafe fn lend(&self, off: usize, len: usize) -> Result<&[u8], RangeError> {
        self.check(off, len, 1)?;
        // SAFETY: inside the mapping (checked), which lives as long as `self`; the
        // caller vouches that nobody writes the bytes meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) })
    }

    /// Copies `dst.len()` bytes at `off` out of the mapping. A peer writing the same
    /// bytes meanwhile leaves garbage in `dst`, which callers treat as untrusted data
    /// anyway; no reference into the shared bytes is ever made.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), RangeError> {
        self.check(off, dst.len(), 1)?;
        // SAFETY: the source range is inside the mapping (checked). `dst` cannot overlap
        // it: this type never hands out references to mapped bytes, so `dst` is other
        // memory.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    /// Copies `src` into the mapping at `off`.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), RangeError> {
        self.check(off, src.len(), 1)?;
        // SAFETY: the destination range is inside the writable mapping (checked); `src`
        // is not mapped memory of this region (see `read`), so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.as_mut_ptr().add(off), src.len())
        };
        Ok(())
    }

    /// Reads up to `len` bytes from the file `fd` into the mapping at `off`: at
    /// `file_off` with `pread`, or from its position with `read`. The kernel writes
    /// the mapping; no reference to it is made here. Returns the bytes read (0 at the
    /// end of the file).
    pub fn read_from_fd(
        &self,
        off: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        file_off: Option<i64>,
    ) -> io::Result<usize> {
        self.check(off, len, 1)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the destination range is inside the writable mapping (checked); the
        // kernel writes at most `len` bytes there.
        let r = unsafe {
            let dst = self.map.as_mut_ptr().add(off).cast();
            match file_off {
                Some(o) => libc::pread(fd.as_raw_fd(), dst, len, o as libc::off_t),
                None => libc::read(fd.as_raw_fd(), dst, len),
            }
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Fills `len` bytes at `off` with zeros.
    pub fn zero(&self, off: usize, len: usize) -> Result<(), RangeError> {
        self.check(off, len, 1)?;
        // SAFETY: the range is inside the writable mapping (checked).
        unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(off), 0, len) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn memfd(len: usize) -> Region {
        Region::create_memfd(c"usnet-shm-test", len, true).unwrap()
    }

    #[test]
    fn offsets_out_of_range_or_misaligned_are_rejected() {
        let r = memfd(4096);
        assert!(r.at::<AtomicU32>(4092).is_ok());
        assert!(r.at::<AtomicU32>(4093).is_err(), "misaligned");
        assert!(r.at::<AtomicU32>(4096).is_err(), "past the end");
        assert!(r.at::<AtomicU64>(4092).is_err(), "straddles the end");
        assert!(r.at::<AtomicU64>(usize::MAX - 7).is_err(), "overflow");
        assert!(r.slice::<AtomicU64>(0, 512).is_ok());
        assert!(r.slice::<AtomicU64>(8, 512).is_err());
        assert!(r.slice::<AtomicU64>(0, usize::MAX / 4).is_err());
        assert!(r.at::<[AtomicU64; 6]>(4096 - 48).is_ok());
        assert!(r.at::<[AtomicU64; 6]>(4096 - 40).is_err());
        let mut b = [0u8; 16];
        assert!(r.read(4080, &mut b).is_ok());
        assert!(r.read(4081, &mut b).is_err());
        assert!(r.write(4090, &b).is_err());
        assert!(r.zero(4096, 1).is_err());
        let e = r.at::<AtomicU32>(4096).unwrap_err();
        assert_eq!((e.off, e.len, e.map_len), (4096, 4, 4096));
    }

    #[test]
    #[should_panic(expected = "outside the 4096-byte mapping")]
    fn short_accessor_panics_on_a_layout_bug() {
        memfd(4096).u32(4096);
    }

    #[test]
    fn words_and_bytes_round_trip_through_two_mappings() {
        let a = memfd(8192);
        let fd = a.file().try_clone().unwrap();
        let b = Region::attach_memfd(fd.into(), 4096, 1 << 20, true).unwrap();
        a.u32(64).store(7, Relaxed);
        assert_eq!(b.u32(64).load(Relaxed), 7);
        b.u64(128).store(u64::MAX, Relaxed);
        assert_eq!(a.u64(128).load(Relaxed), u64::MAX);
        a.write(5000, b"hello").unwrap();
        let mut got = [0u8; 5];
        b.read(5000, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        b.zero(5000, 5).unwrap();
        a.read(5000, &mut got).unwrap();
        assert_eq!(got, [0; 5]);
    }

    #[test]
    fn sealed_memfd_cannot_shrink_and_unsealed_is_refused() {
        let a = memfd(4096);
        assert!(a.file().set_len(100).is_err(), "sealed against shrinking");
        let open = Region::create_memfd(c"usnet-shm-open", 4096, false).unwrap();
        let fd = open.file().try_clone().unwrap();
        assert!(Region::attach_memfd(fd.into(), 4096, 8192, true).is_err());
        let fd = a.file().try_clone().unwrap();
        assert!(
            Region::attach_memfd(fd.into(), 8192, 1 << 20, true).is_err(),
            "too small"
        );
    }

    #[test]
    fn mapping_longer_than_the_file_is_refused() {
        let r = memfd(4096);
        let f = r.file().try_clone().unwrap();
        assert!(Region::map(f, 8192, Populate::Now).is_err());
    }
}
