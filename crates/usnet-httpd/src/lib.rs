//! `usnet httpd`: a small HTTP/1.1 server in the spirit of phttpd (the netmap/PASTE
//! paper's web server). Every request is answered with the same response, a fixed
//! head and `length` body bytes, so the server measures the network API under it
//! and nothing else.
//!
//! One HTTP part, several backends:
//!
//! - [`http`]: the responses, request boundaries in a byte stream ([`http::RequestStream`],
//!   on `usnet_http`'s parser), the answers owed in order ([`http::Outq`]) — no I/O;
//! - [`conn`]: one connection's life over any call-style [`conn::Transport`];
//! - [`kernel`] (`--api kernel`): Linux sockets and epoll in one thread (phttpd's
//!   socket mode);
//! - [`socket`] (`--api socket`): usnet's stack in the same thread, driven by a
//!   [`usnet_driver::Driver`] whose turn serves the sockets the stack reports ready.
//!
//! - [`zerocopy`] (`--api zerocopy`): the same loop on usnet's zero-copy rings
//!   (`usnet_stack::zerocopy`): [`http::RequestStream::feed`] reads the received buffers
//!   in place, and the answers go out from buffers the responses were written into
//!   once and the server keeps (`SLOT_KEEP`), or are written by [`http::Outq::fill`]
//!   into the buffers that go on the wire.

pub mod conn;
pub mod http;
pub mod kernel;
pub mod socket;
pub mod zerocopy;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

pub use http::{Reply, Responses, DEFAULT_LENGTH};

/// The network API a server runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Linux sockets with epoll.
    Kernel,
    /// usnet's stack through its socket API (copies into and out of byte rings).
    Socket,
    /// usnet's zero-copy rings.
    Zerocopy,
}

impl FromStr for Api {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kernel" => Ok(Api::Kernel),
            "socket" => Ok(Api::Socket),
            "zerocopy" => Ok(Api::Zerocopy),
            _ => Err(format!("unknown api {s:?}: kernel, socket or zerocopy")),
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::Kernel => "kernel",
            Api::Socket => "socket",
            Api::Zerocopy => "zerocopy",
        })
    }
}

/// What a server serves and how it runs.
#[derive(Debug, Clone)]
pub struct HttpdConfig {
    /// Listening port.
    pub port: u16,
    /// Address to listen on (`None`: every address).
    pub bind: Option<IpAddr>,
    /// Response body length (`-l`).
    pub length: usize,
    /// Static header lines added to every response (`Name: value`).
    pub headers: Vec<String>,
    /// Events (ready sockets) handled per loop iteration.
    pub batch: usize,
    /// Connections served at once (more are refused).
    pub max_conns: usize,
    /// `socket` backend: keep turning (busy-poll) this long after the last work
    /// before sleeping on the device, in microseconds.
    pub spin_us: u64,
    /// `zerocopy` backend: send the responses from buffers written once and kept
    /// (`SLOT_KEEP`), as a static file server sends the page cache, where a piece
    /// travels by reference (TSO); otherwise every answer is written into fresh
    /// buffers.
    pub zc_cache: bool,
}

impl Default for HttpdConfig {
    fn default() -> Self {
        HttpdConfig {
            port: 80,
            bind: None,
            length: DEFAULT_LENGTH,
            headers: Vec::new(),
            batch: 64,
            max_conns: 65536,
            spin_us: 0,
            zc_cache: true,
        }
    }
}

/// What a server did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub accepted: u64,
    pub requests: u64,
    /// Answers sent completely.
    pub responses: u64,
    pub bad_requests: u64,
    /// Connections reset by the client or failed.
    pub resets: u64,
    /// Connections closed (any way).
    pub closed: u64,
    /// Connections refused (over `max_conns`).
    pub refused: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.accepted += o.accepted;
        self.requests += o.requests;
        self.responses += o.responses;
        self.bad_requests += o.bad_requests;
        self.resets += o.resets;
        self.closed += o.closed;
        self.refused += o.refused;
        self.rx_bytes += o.rx_bytes;
        self.tx_bytes += o.tx_bytes;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} connections, {} requests, {} responses, {} bad requests, {} resets, {} refused, {} B in, {} B out",
            self.accepted,
            self.requests,
            self.responses,
            self.bad_requests,
            self.resets,
            self.refused,
            self.rx_bytes,
            self.tx_bytes
        )
    }
}

/// Pins the calling thread to `core` (the driver's).
pub use usnet_driver::sched::pin_to_core;
