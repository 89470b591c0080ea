//! usnet-shm: the one place where usnet touches memory shared between processes.
//!
//! Four users share memory with another process: the shm link (`usnet-link`), the
//! emulated NIC (`usnet-link::nic` and `usnet-nicemu`), the request rings
//! (`usnet-async-syscall`) and the zero-copy port with the packet pool it lends
//! (`usnet-session`, `usnet-pool`). They need the same few things, and this crate has
//! each of them once:
//!
//! * [`Region`]: a shared mapping (a memfd, sealed when asked, or a file under
//!   `/dev/shm`) with checked offsets: typed references to atomics and bounded byte
//!   copies, never a raw pointer in a user.
//! * [`futex`]: `wait`, `wake` and `wait_any` (futex_waitv) on shared words.
//! * [`doorbell`]: wake-ups another thread or process rings: an [`EventFd`] (pollable,
//!   fits an epoll set next to kernel fds) or a futex word in a region
//!   ([`FutexBell`]), with the "sleeping flag + fence + re-check" protocol
//!   ([`Gate`]) written once.
//! * [`BufferArea`]: memory cut into buffers lent out as byte slices (the packet
//!   pool's, and a zero-copy client's mapping of it), anonymous or a sealed memfd.
//! * [`poll_fds`]: wait on several fds (a device fd plus doorbell fds) with a deadline.
//! * [`spsc`]: the single-producer single-consumer ring index protocol (free-running
//!   indices, or netmap's for the zero-copy port), and [`bytes`], the same protocol
//!   for a byte stream.
//! * [`arm`]: the arm/kick handshake of a ring its consumer stops watching.
//! * [`fdpass`]: handing a memfd or an eventfd to another process (SCM_RIGHTS).
//! * [`liveness`]: "is the process on the other side still alive", by open-file-
//!   description locks that the kernel drops when their holder dies.
//!
//! # Why this is hand-written
//! The memory layout is shared between processes and must stay valid whatever a peer
//! writes into it: every word is an atomic (any bit pattern is a valid value), every
//! offset is checked against the mapping before a reference is made, and no reference
//! to shared bytes outlives a copy. Mapping crates hand out `&[u8]`/`&mut [u8]` over the
//! whole mapping, which a peer process may change under us; shared-memory IPC crates
//! bring their own layouts and liveness schemes. The shape here is small and fixed, so
//! it is written out, on top of memmap2 (the mapping) and libc (the system calls).
//!
//! Every wait takes a timeout: nothing here sleeps without a deadline.
//!
//! `unsafe` lives only in the mapping (`region`, `buffers`), futex (`futex`) and
//! system-call (`sys`) modules, and in `bytes::ByteLoan::slices` (a consumer's own
//! ring bytes read in place); each block says why it is sound.

#![deny(unsafe_code)]

pub mod arm;
#[allow(unsafe_code)]
mod buffers;
pub mod bytes;
pub mod doorbell;
pub mod fdpass;
#[allow(unsafe_code)]
pub mod futex;
pub mod liveness;
#[allow(unsafe_code)]
mod region;
pub mod spsc;
#[allow(unsafe_code)]
mod sys;

pub use buffers::BufferArea;
pub use bytes::{
    ByteConsumer, ByteCorrupt, ByteLoan, ByteProducer, ByteRingAt, KeptLoan, TailLoan,
};
pub use doorbell::{sleep_many, EventFd, FutexBell, Gate};
pub use region::{Populate, RangeError, Region, Shared};
pub use sys::{adopt_inherited_fd, inherit_fd, monotonic_ns, poll_fds, ReadyFds};

/// Cache line size assumed for padding (x86-64 and most arm64 parts).
pub const CACHE_LINE: usize = 64;
