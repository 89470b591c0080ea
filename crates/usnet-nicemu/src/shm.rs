//! The one module that touches the shared mapping, the futex and file locks.
//!
//! A [`Region`] maps `/dev/shm/usnet-nic-NAME` and hands out bounds-checked atomic views of
//! its words and bounded byte copies in and out. Every access checks its offset against
//! the mapping's length, so a wrong offset computed from untrusted data panics in our code
//! at worst (and the callers validate before that); it never reads outside the mapping.
//!
//! Liveness uses open-file-description locks on two bytes of the file: the driver holds a
//! write lock on byte 0 and the device side on byte 1 for as long as they live. The kernel
//! drops a lock when its holder dies, however it dies, so a peer probes the other's byte to
//! learn whether it is still there (no pid reuse, no heartbeat timing).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// Byte of the file locked by the driver while it lives.
pub const LOCK_DRIVER: i64 = 0;
/// Byte of the file locked by the device side while it lives.
pub const LOCK_DEVICE: i64 = 1;

pub struct Region {
    ptr: *mut u8,
    len: usize,
    file: File,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or
// bounded copies, so moving the handle to or sharing it with another thread is as safe as
// sharing it with the other process.
unsafe impl Send for Region {}
// SAFETY: see above; `&Region` only offers atomic views and copies.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("len", &self.len).finish()
    }
}

impl Region {
    /// Creates (or re-creates) the file at `path` with `len` zero bytes and maps it.
    /// Fails with `WouldBlock` if a live driver already holds it.
    pub fn create(path: &Path, len: usize) -> io::Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        lock_byte(&file, LOCK_DRIVER)?;
        // Zero the old content: a stale file from a dead driver is re-initialised.
        file.set_len(0)?;
        file.set_len(len as u64)?;
        Self::map(file, len)
    }

    /// Opens an existing file and maps all of it.
    pub fn open(path: &Path) -> io::Result<Region> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if len < crate::layout::PAGE as u64 || len > (1u64 << 36) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad NIC file size",
            ));
        }
        Self::map(file, len as usize)
    }

    fn map(file: File, len: usize) -> io::Result<Region> {
        // SAFETY: mapping a file descriptor we own, with a length the file has; the result
        // is checked against MAP_FAILED. The mapping is MAP_SHARED so the peer sees writes.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                // Populated up front: no page fault (and page zeroing) on the first touch
                // of a packet buffer in the middle of a timed run.
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr as *mut u8,
            len,
            file,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes this side's liveness lock (device side: `LOCK_DEVICE`). `WouldBlock` when
    /// another live holder has it.
    pub fn lock(&self, byte: i64) -> io::Result<()> {
        lock_byte(&self.file, byte)
    }

    /// Whether some open file description (another process, or another `open` in this
    /// process) holds the lock on `byte`.
    pub fn peer_alive(&self, byte: i64) -> bool {
        let mut fl = flock_for(byte, libc::F_WRLCK as i16);
        // SAFETY: F_OFD_GETLK fills the flock struct we pass; the fd is ours and open.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        r == 0 && fl.l_type != libc::F_UNLCK as i16
    }

    #[inline]
    fn check(&self, off: usize, size: usize) {
        assert!(
            off & (size - 1) == 0 && off.checked_add(size).is_some_and(|e| e <= self.len),
            "shared word {off:#x} out of the mapping"
        );
    }

    #[inline]
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: in bounds and 4-aligned (checked; the mapping is page aligned); the
        // memory stays mapped while `&self` lives; AtomicU32 has u32's layout and every
        // access to shared words, by either process, is atomic.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    #[inline]
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: as for `u32_at`, with 8-byte alignment checked.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// Copies `dst.len()` bytes at `off` out of the mapping. The peer may be writing the
    /// same bytes (a buggy device): the copy then holds garbage, which callers treat as
    /// untrusted data anyway.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(
            off.checked_add(dst.len()).is_some_and(|e| e <= self.len),
            "read out of the mapping"
        );
        // SAFETY: source range checked to be inside the mapping; `dst` is a distinct
        // local buffer, so the ranges do not overlap; no reference into the shared bytes
        // outlives the copy.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `src` into the mapping at `off`.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) {
        assert!(
            off.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "write out of the mapping"
        );
        // SAFETY: destination range checked to be inside the mapping (which is writable);
        // `src` is never inside the mapping (callers pass local or pool memory).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
    }

    /// Flips the bits of one byte in place (fault injection: corrupt a placed frame).
    pub fn xor_byte(&self, off: usize, mask: u8) {
        let mut b = [0u8];
        self.read(off, &mut b);
        b[0] ^= mask;
        self.write(off, &b);
    }

    /// FUTEX_WAIT on the u32 at `off` while it equals `expected`, for at most `timeout`.
    pub fn futex_wait(&self, off: usize, expected: u32, timeout: Duration) {
        let word = self.u32_at(off);
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the futex word is a valid, aligned u32 in a shared mapping (so no
        // FUTEX_PRIVATE_FLAG); the timespec lives across the call. Errors (EAGAIN when the
        // value already changed, EINTR, ETIMEDOUT) all mean "go and look again".
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
            );
        }
    }

    /// FUTEX_WAKE one waiter on the u32 at `off`.
    pub fn futex_wake(&self, off: usize) {
        let word = self.u32_at(off);
        // SAFETY: valid aligned futex word in the shared mapping; FUTEX_WAKE only reads it.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no references into it outlive
        // `self` (all views borrow `&self`).
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

fn flock_for(byte: i64, ty: i16) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = byte;
    fl.l_len = 1;
    fl.l_pid = 0; // required 0 for OFD locks
    fl
}

fn lock_byte(file: &File, byte: i64) -> io::Result<()> {
    let fl = flock_for(byte, libc::F_WRLCK as i16);
    // SAFETY: F_OFD_SETLK with a valid flock struct on our own open descriptor.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "already held by a live peer",
            ))
        } else {
            Err(e)
        }
    }
}
