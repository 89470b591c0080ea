//! Layout of the shared request area.
//!
//! ```text
//! offset 0        Header: one 64-byte line each for
//!                 meta (magic, version, nentries) | sq tail | sq head |
//!                 cq tail | cq head | sq wait word | cq wait word | control
//! + HEADER_SIZE   SQ cells:  nentries x u64   (seq << 32 | entry index)
//! + ...           CQ cells:  nentries x u64
//! + ...           entries:   nentries x 64-byte SyscallInfo, line aligned
//! ```
//!
//! Every word another party can write is an atomic; everything read from the
//! area is validated before use (see `ring.rs`). The geometry (`nentries`)
//! is read once when a side attaches and then kept in private memory.

use crate::sync::{AtomicI64, AtomicU32, AtomicU64};

/// `b"USNETRNG"` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"USNETRNG");
/// Layout version; bump on any change to this file.
pub const VERSION: u32 = 1;
/// Cache line size assumed for padding.
pub const CACHE_LINE: usize = 64;
/// Largest ring (entries); positions are u32, cells carry 32-bit sequence numbers.
pub const MAX_ENTRIES: u32 = 1 << 16;

/// Entry states (the document's `state`).
pub mod state {
    /// No request; owned by the requester.
    pub const NONE: u32 = 0;
    /// Filled in and queued; waiting for an exec thread.
    pub const HASCALL: u32 = 1;
    /// Claimed by exactly one exec thread, running.
    pub const EXECUTING: u32 = 2;
    /// Result stored in `ret`; waiting to be reaped by the requester.
    pub const COMPLETED: u32 = 3;
}

/// Control word values (exit protocol).
pub mod ctl {
    pub const RUNNING: u32 = 0;
    /// Exit: exec threads finish everything queued, then return.
    pub const EXIT_DRAIN: u32 = 1;
    /// Exit: queued-but-unstarted requests complete with `-ECANCELED`.
    pub const EXIT_CANCEL: u32 = 2;
}

/// One request, the document's `syscall_info`, packed into one cache line:
/// `state`(4) + `num`(4) + `arg[6]`(48) + `ret`(8) = 64 bytes. (The
/// document's struct was 72 bytes with an 8-byte call number; Linux system
/// call numbers fit in 32 bits, which buys line alignment.)
#[repr(C, align(64))]
pub struct SyscallInfo {
    pub state: AtomicU32,
    pub num: AtomicU32,
    pub arg: [AtomicU64; 6],
    pub ret: AtomicI64,
}

/// A value alone on its cache line (producer and consumer positions never
/// share a line).
#[repr(C, align(64))]
pub struct Line<T>(pub T);

/// Futex-based wait word: `seq` is the futex word (bumped by wakers),
/// `waiters` is the needs-wakeup count.
#[repr(C)]
pub struct WaitWord {
    pub seq: AtomicU32,
    pub waiters: AtomicU32,
}

/// Read-only-after-creation geometry. Plain `std` atomics even under loom:
/// they are not part of the concurrent protocol.
#[repr(C)]
pub struct Meta {
    pub magic: std::sync::atomic::AtomicU64,
    pub version: std::sync::atomic::AtomicU32,
    pub nentries: std::sync::atomic::AtomicU32,
    pub total_size: std::sync::atomic::AtomicU64,
}

/// The header at offset 0.
#[repr(C)]
pub struct Header {
    pub meta: Line<Meta>,
    /// SQ producer position (requester side).
    pub sq_tail: Line<AtomicU32>,
    /// SQ consumer position (exec side).
    pub sq_head: Line<AtomicU32>,
    /// CQ producer position (exec side).
    pub cq_tail: Line<AtomicU32>,
    /// CQ consumer position (requester side).
    pub cq_head: Line<AtomicU32>,
    /// Exec threads sleep here waiting for submissions.
    pub sq_wait: Line<WaitWord>,
    /// Requesters sleep here waiting for completions.
    pub cq_wait: Line<WaitWord>,
    /// `ctl::*`.
    pub ctl: Line<AtomicU32>,
}

pub const HEADER_SIZE: usize = std::mem::size_of::<Header>();
pub const ENTRY_SIZE: usize = std::mem::size_of::<SyscallInfo>();

#[cfg(not(loom))]
const _: () = assert!(ENTRY_SIZE == 64);
#[cfg(not(loom))]
const _: () = assert!(HEADER_SIZE & (CACHE_LINE - 1) == 0);

/// Byte offsets of the parts of an area with `n` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub nentries: u32,
    pub sq_off: usize,
    pub cq_off: usize,
    pub ent_off: usize,
    pub total: usize,
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

impl Geometry {
    /// `n` must be a power of two in `1..=MAX_ENTRIES`.
    pub fn new(n: u32) -> Option<Geometry> {
        if n == 0 || n > MAX_ENTRIES || !n.is_power_of_two() {
            return None;
        }
        let cells = n as usize * 8;
        let sq_off = HEADER_SIZE;
        let cq_off = round_up(sq_off + cells, CACHE_LINE);
        let ent_off = round_up(cq_off + cells, CACHE_LINE);
        let total = round_up(ent_off + n as usize * ENTRY_SIZE, 4096);
        Some(Geometry {
            nentries: n,
            sq_off,
            cq_off,
            ent_off,
            total,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        assert_eq!(HEADER_SIZE, 8 * 64);
        let g = Geometry::new(256).unwrap();
        assert_eq!(g.sq_off, 512);
        assert_eq!(g.cq_off, 512 + 2048);
        assert_eq!(g.ent_off % 64, 0);
        assert_eq!(g.total % 4096, 0);
        assert!(g.total >= g.ent_off + 256 * 64);
        assert!(Geometry::new(3).is_none());
        assert!(Geometry::new(0).is_none());
        assert!(Geometry::new(MAX_ENTRIES * 2).is_none());
    }
}
