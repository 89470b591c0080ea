//! The emulated NIC (after Mint, where one OS plays the NIC for a driver in another) as a link: a NIC whose state lives in
//! shared memory (descriptor rings, packet buffers, a register page, an interrupt line),
//! and its driver, a [`Device`](crate::Device) like any other (`nic:NAME`).
//!
//! [`layout`] is the contract between the driver and the device side, which plays the
//! hardware from another process (`usnet nicemu`, in the usnet-nicemu crate). See
//! `docs/nicemu.md`.

pub mod driver;
pub mod layout;

pub use driver::{IrqMode, IrqRecord, NicDriver, NicOptions, NicStats};

/// Errors of the emulated NIC, for both of its sides.
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
    Range(#[from] usnet_shm::RangeError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
