//! [`BufferArea`]: memory cut into buffers whose bytes are lent out as slices (the
//! packet pool's, and a zero-copy client's view of it).
//!
//! [`Region`](crate::Region) never makes a reference into mapped bytes, which is what
//! keeps it sound whatever a peer does. Packet buffers are read and written in place
//! by parsers, checksums and the kernel (an AF_XDP UMEM), so they need slices. A slice
//! is sound here while nobody else writes the bytes it covers: in this process the
//! borrow rules see to it (`&self` reads, `&mut self` writes); across processes the
//! user's ownership protocol does (a buffer belongs to one side at a time, handed over
//! through a ring whose Release/Acquire orders the accesses: `crate::spsc`). A peer
//! that breaks the protocol garbles bytes it was not owed, never our mapping's extent:
//! a shared area is a memfd sealed against shrinking, so no access can fault.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};

use crate::sys;

/// Buffer memory (see the module docs): private anonymous memory, or a memfd that
/// another process may map.
pub struct BufferArea {
    map: MmapRaw,
    file: Option<File>,
}

impl std::fmt::Debug for BufferArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferArea")
            .field("len", &self.map.len())
            .field("shared", &self.file.is_some())
            .finish()
    }
}

fn empty() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "cannot map an empty area")
}

impl BufferArea {
    /// `len` zero bytes of private anonymous memory.
    pub fn anonymous(len: usize) -> io::Result<BufferArea> {
        if len == 0 {
            return Err(empty());
        }
        let map = MmapOptions::new().len(len).map_anon()?.into();
        Ok(BufferArea { map, file: None })
    }

    /// `len` zero bytes in a memfd whose size is sealed (no shrink, no grow, no
    /// further seals), so a process it is handed to cannot make our accesses fault.
    pub fn create_memfd(name: &CStr, len: usize) -> io::Result<BufferArea> {
        if len == 0 {
            return Err(empty());
        }
        let file = File::from(sys::memfd(name, true)?);
        file.set_len(len as u64)?;
        sys::seal_size(file.as_fd())?;
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(BufferArea {
            map,
            file: Some(file),
        })
    }

    /// Maps all of a memfd another process created, which must be `len` bytes and
    /// sealed against shrinking.
    pub fn attach_memfd(fd: OwnedFd, len: usize) -> io::Result<BufferArea> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if !sys::sealed_against_shrink(fd.as_fd())? {
            return Err(bad("buffer area is not sealed against shrinking"));
        }
        let file = File::from(fd);
        if len == 0 || file.metadata()?.len() != len as u64 {
            return Err(bad("buffer area has a bad size"));
        }
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(BufferArea {
            map,
            file: Some(file),
        })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The memfd behind a shared area.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// The page-aligned start address, for registering the memory with the kernel
    /// (an AF_XDP UMEM); it stays valid and unmoved while `self` lives.
    pub fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    #[inline]
    fn fits(&self, off: usize, len: usize) -> bool {
        off <= self.map.len() && len <= self.map.len() - off
    }

    /// `len` bytes at `off`, or None outside the area.
    #[inline]
    pub fn get(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.fits(off, len) {
            return None;
        }
        // SAFETY: the range is inside the mapping (checked), which lives as long as
        // `self`; the shared borrow of `self` keeps every `&mut` slice of this area
        // away while this one lives (a peer process: module docs).
        Some(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) })
    }

    /// `len` bytes at `off` to write, or None outside the area.
    #[inline]
    pub fn get_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        if !self.fits(off, len) {
            return None;
        }
        // SAFETY: as in `get`; the exclusive borrow of `self` makes this the only
        // slice of the area alive in this process.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_inside_and_two_mappings_share_bytes() {
        let mut a = BufferArea::create_memfd(c"usnet-bufs-test", 8192).unwrap();
        assert!(a.get(8192, 0).is_some());
        assert!(a.get(8190, 4).is_none());
        assert!(a.get(usize::MAX, 2).is_none());
        assert!(a.get_mut(4096, 4097).is_none());
        a.get_mut(4000, 5).unwrap().copy_from_slice(b"hello");
        let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
        let mut b = BufferArea::attach_memfd(fd, 8192).unwrap();
        assert_eq!(b.get(4000, 5).unwrap(), b"hello");
        b.get_mut(0, 2).unwrap().copy_from_slice(b"hi");
        assert_eq!(a.get(0, 2).unwrap(), b"hi");
        assert_eq!(a.addr() % 4096, 0);
    }

    #[test]
    fn a_wrong_size_or_unsealed_memfd_and_empty_areas_are_refused() {
        let a = BufferArea::create_memfd(c"usnet-bufs-test", 8192).unwrap();
        assert!(a.fd().is_some());
        let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
        assert!(BufferArea::attach_memfd(fd, 4096).is_err(), "size");
        let open = File::from(sys::memfd(c"usnet-bufs-open", false).unwrap());
        open.set_len(4096).unwrap();
        assert!(
            BufferArea::attach_memfd(open.into(), 4096).is_err(),
            "unsealed"
        );
        assert!(BufferArea::anonymous(0).is_err());
        let anon = BufferArea::anonymous(4096).unwrap();
        assert!(anon.fd().is_none());
        assert_eq!(anon.get(0, 4096).unwrap(), &[0u8; 4096][..]);
    }
}
