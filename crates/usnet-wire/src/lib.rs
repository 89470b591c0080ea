//! usnet-wire: packet formats for the usnet stack.
//!
//! Every parser takes a byte slice it does not trust, checks every length and
//! returns a typed view or a [`WireError`]; every emitter writes into a caller
//! buffer and fails (never panics) if it is too short. No allocation, no I/O.
//!
//! Parsers borrow payloads from the input (`&'a [u8]`); emitters write headers
//! in front of payloads the caller has already placed in the buffer, so a
//! packet is built in place without copies.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmpv4;
pub mod icmpv6;
pub mod igmp;
pub mod ipv4;
pub mod ipv6;
pub mod mld;
pub mod quoted;
pub mod steer;
pub mod tcp;
pub mod udp;

mod bytes;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod testing;

pub use arp::*;
pub use checksum::*;
pub use ethernet::*;
pub use icmpv4::*;
pub use icmpv6::*;
pub use igmp::*;
pub use ipv4::*;
pub use ipv6::*;
pub use mld::*;
pub use quoted::*;
pub use tcp::*;
pub use udp::*;

/// Why a packet could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before the structure does (or an emit buffer is too short).
    #[error("truncated packet or buffer too short")]
    Truncated,
    /// A length field is inconsistent (too small, or too large to encode).
    #[error("bad length field")]
    BadLength,
    /// The checksum does not verify.
    #[error("bad checksum")]
    BadChecksum,
    /// Wrong IP version nibble.
    #[error("bad version")]
    BadVersion,
    /// Well-formed but not something this crate handles (e.g. non-Ethernet ARP, jumbograms).
    #[error("unsupported")]
    Unsupported,
    /// Structurally invalid (bad option lengths, forbidden field values, header loops).
    #[error("malformed packet")]
    Malformed,
}

#[cfg(test)]
mod robustness;
