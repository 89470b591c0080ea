//! usnet-async-syscall: shared-memory request rings and asynchronous system calls.
//!
//! The asynchronous system call design (an in-kernel `async_syscall` mechanism with a shared request area, in the line of FlexSC's exception-less system calls) recast for
//! userspace: a request area of `syscall_info` entries (state, call number,
//! six arguments, result) in a sealed memfd, shared between threads or
//! processes, with the state machine NONE → HASCALL → EXECUTING → COMPLETED
//! → NONE enforced by compare-and-swap, plus what the document lacked:
//! submission and completion index queues (no scans), batching, cache-line
//! layout, adaptive spinning and futex sleeps without lost wake-ups.
//!
//! * [`Ring`]: the four operations — [`Ring::new`] (init), [`Ring::exec`],
//!   [`Ring::wakeup`], [`Ring::exit`] — plus [`Ring::submit_batch`],
//!   [`Ring::wait_one`], [`Ring::poll`].
//! * [`AsyncSyscall`]: host system calls run by 1..N exec threads.
//! * [`maybe_run_child`]: two-process peers (call at the start of `main`).
//!
//! See `docs/async-syscall.md` for the design and measurements.

pub mod layout;
mod queue;
mod ring;
mod shm;
mod sync;
#[cfg(not(loom))]
mod syscall;

#[cfg(not(loom))]
mod child;

#[cfg(all(test, loom))]
mod loom_tests;

pub use ring::{
    Call, Completion, Error, ErrorCounts, ExecOptions, ExecStats, ExitMode, Request, Ring,
    WaitPolicy,
};

#[cfg(not(loom))]
pub use child::{echo_result, maybe_run_child, spawn_child, CHILD_ENV};
#[cfg(not(loom))]
pub use syscall::{is_refused, run_syscall, AsyncOptions, AsyncSyscall};
