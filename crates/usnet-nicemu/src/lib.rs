//! usnet's emulated NIC (source document 3, Mint): a NIC whose state lives in shared
//! memory (descriptor rings, packet buffers, a register page, an interrupt line), the usnet
//! driver for it ([`NicDriver`], a [`usnet_link::Device`]), the device side that plays the
//! hardware from another process ([`run_device`], `usnet nicemu`), and the benchmark that
//! reproduces the document's measurements ([`run_bench`], `usnet bench nic`).
//!
//! `unsafe` lives only in [`shm`] (mapping, atomics, futex, locks) and [`sys`] (clock,
//! affinity, TAP ioctl). See `docs/nicemu.md`.

pub mod bench;
pub mod device;
pub mod driver;
pub mod frame;
pub mod layout;
pub mod shm;
pub mod sys;
pub mod tool;

pub use bench::{run_bench, NicBenchArgs};
pub use device::{DevCounters, DeviceSide, RingFullPolicy, TxMode};
pub use driver::{open_driver, DriverOpts, IrqMode, IrqRecord, NicDriver, NicStats};
pub use tool::{run_device, run_device_report, DeviceReport, NicemuArgs};

#[derive(Debug, thiserror::Error)]
pub enum NicError {
    #[error("bad NIC name {0:?} (letters, digits, '-', '_', '.'; at most 64)")]
    BadName(String),
    #[error("NIC {0} is already held by a live driver or device side")]
    Busy(String),
    #[error("NIC {0} does not exist (start the driver side first)")]
    NotFound(String),
    #[error("NIC {0} was never made ready by its driver")]
    NotReady(String),
    #[error("the driver of this NIC is gone")]
    DriverGone,
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
