//! Time as the core sees it: a number of nanoseconds passed in by the caller. The core
//! never reads a clock, so a simulation can run hours of protocol time in milliseconds.
//!
//! The type is the TCP engine's (`usnet-tcp` sits below this crate), so the stack and
//! its TCP connections share one clock type and no conversion is needed.

pub use usnet_tcp::Instant;
