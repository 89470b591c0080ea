//! Atomics, fences and threads: `std` normally, `loom` under `--cfg loom`.
//!
//! Only the words that take part in the cross-thread protocol (ring
//! positions, index cells, entry words, wait words, the control word) use
//! these types, so loom can explore every interleaving of the protocol.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64};

/// A hint inside spin loops (under loom: a yield, so the model makes progress).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}
