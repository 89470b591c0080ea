//! usnet-sim: what every usnet simulation shares, so that a conversation is the same
//! for the same seed wherever it runs.
//!
//! - [`SimRng`]: one small seeded generator (splitmix64) for every random decision.
//! - [`Path`]: one seeded model of a one-way path: propagation delay, a bottleneck
//!   with a rate and a bounded (drop-tail) queue, and faults (loss, duplication,
//!   corruption, reordering within a window). It decides, for a frame entering at a
//!   time, whether, when and in how many copies it leaves.
//!
//! No dependencies, no clock: times are the caller's nanoseconds.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod path;
mod rng;

pub use path::{Fate, Path, PathConfig, PathStats};
pub use rng::SimRng;
