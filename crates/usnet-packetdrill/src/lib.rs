//! A backend for packetdrill's `--so_filename` mode: `libusnet_packetdrill.so` exports
//! `packetdrill_interface_init`, which fills packetdrill's `struct packetdrill_interface`
//! (`gtests/net/packetdrill/packetdrill.h`) with functions that run the script's
//! socket calls through usnet-posix, the socket layer of `libusnet.so` and of the
//! `usnet run` shim, against a usnet stack server in this process on virtual time.
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
//! - socket calls are `libusnet.so`'s C functions (`usnet_socket`, `usnet_recvmsg`,
//!   ...); descriptors are real kernel descriptor numbers, as under the shim.
//!
//! Flags (packetdrill's `--so_flags`, comma separated): `local=192.168.0.1/16`,
//! `gateway=192.168.0.2`, `local6=fd3d:fa7b:d17d::1/48`, `gateway6=fd3d:fa7b:d17d::2`,
//! `mtu=1500`, `seed=N`, `tick_us=N`, `profile=NAME`, any `tcp_*` sysctl,
//! `sysctl_file=PATH`, `gso_mss=N`, `trap=0`. The defaults are packetdrill's own.
//!
//! # Layout
//!
//! - [`layout`]: `struct packetdrill_interface` in C types;
//! - [`config`]: the flags, the stack and link they describe, sysctl lines;
//! - [`link`]: the virtual link (script packets in, stack frames out, ARP/NDP);
//! - [`posix`]: the stack server on virtual time, the settle protocol, the
//!   `extern "C"` functions and `packetdrill_interface_init`;
//! - [`trap`]: packetdrill's own `getsockopt(TCP_INFO)` and `sendfile` on our
//!   descriptors.

pub mod config;
pub mod layout;
pub mod link;
pub mod posix;
pub mod trap;

pub use config::Options;
pub use layout::PacketdrillInterface;
pub use link::{PEER_MAC, STACK_MAC};
pub use posix::{packetdrill_interface_init, usnet_packetdrill_interface_size};
