//! A backend for packetdrill's `--so_filename` mode: `libusnet_packetdrill.so` exports
//! `packetdrill_interface_init`, which fills packetdrill's `struct packetdrill_interface`
//! (`gtests/net/packetdrill/packetdrill.h`) with functions backed by one usnet
//! [`Stack`] running in virtual time.
//!
//! - `netdev_send` gets an IP packet (IPv4 or IPv6, no link header) from the script; it
//!   is wrapped in an Ethernet header addressed to the stack and fed to it.
//! - `netdev_receive` hands back the next IP packet the stack sends (Ethernet header
//!   stripped). ARP requests and IPv6 neighbour solicitations never reach packetdrill:
//!   they are answered here with a fixed "peer" MAC, so the stack can send anywhere.
//!   When nothing is queued, the virtual clock jumps to the stack's next timer
//!   (retransmission, delayed ACK, ...), so timer-driven packets carry the virtual time
//!   at which the stack sent them.
//! - `usleep` advances the virtual clock (running every stack timer on the way);
//!   `gettimeofday` reads it and advances it by a small tick (default 1 µs, flag
//!   `tick_us=`), because packetdrill spins on the clock for the last microseconds
//!   before an event.
//! - socket calls map to the stack's TCP API; file descriptors are small integers
//!   starting at 3 and are private to this library.
//!
//! Flags (packetdrill's `--so_flags`, comma separated): `local=192.168.0.1/16`,
//! `gateway=192.168.0.2`, `local6=fd3d:fa7b:d17d::1/48`, `gateway6=fd3d:fa7b:d17d::2`,
//! `mtu=1500`, `seed=N`, `tick_us=N`. The defaults are packetdrill's own defaults.
//!
//! Blocking calls (`accept`, `connect`, `read`, `write` and `poll` with a timeout on
//! blocking sockets) wait on a condition variable until another thread — packetdrill
//! runs system calls in their own thread — injects a packet or moves the clock.
//!
//! # Layout
//!
//! - [`layout`]: `struct packetdrill_interface` in C types (the interface layout);
//! - [`backend`]: the stack, the descriptor table and what each socket call means;
//!   [`backend::link`] is the virtual link and clock, [`backend::shared`] the
//!   sharing between packetdrill's threads (blocking calls);
//! - [`ffi`]: the `extern "C"` functions and `packetdrill_interface_init`.

pub mod backend;
pub mod ffi;
pub mod layout;
pub mod posix;
pub mod trap;

pub use backend::link::{PEER_MAC, STACK_MAC};
pub use backend::{Backend, Options};
pub use ffi::{packetdrill_interface_init, usnet_packetdrill_interface_size};
pub use layout::PacketdrillInterface;
