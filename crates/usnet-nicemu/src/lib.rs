//! usnet's emulated NIC, device side (after Mint, where one OS plays the NIC for a driver under test in another): the process that plays
//! the hardware for the usnet driver. It places frames in the buffers the driver posted,
//! completes descriptors, raises the interrupt line and consumes the TX ring, at a chosen
//! interval and count, with fault injection ([`run_device`], `usnet nicemu`).
//!
//! The shared layout and the driver (a `Device`, opened as `nic:NAME`) are
//! `usnet_link::nic`; the shared memory itself is `usnet_shm`'s. The benchmark that
//! reproduces the document's measurements is `usnet_bench::nic`. See `docs/nicemu.md`.
//!
//! `unsafe` lives only in [`sys`] (CPU affinity and scheduling).

pub mod device;
pub mod frame;
pub mod sys;
pub mod tool;

pub use device::{DevCounters, DeviceSide, RingFullPolicy, TxMode};
pub use tool::{
    device_command, maybe_run_child, run_device, run_device_report, DeviceReport, NicemuOptions,
    Summary, CHILD_ENV,
};
pub use usnet_link::nic::NicError;
