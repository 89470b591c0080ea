//! The rpc transport: usnet's baseline for the source document's client/server study
//! (rump kernel, `librumpclient`). A client process reaches the stack through one Unix
//! stream socket; every call is a request and a reply, and user data crosses that
//! socket in copy requests of MCLNUM clusters of MCLBYTES each — one round trip per
//! copy request, with a copy into and out of the kernel on each side. The document
//! measured that structure at 10.3 % of Linux's send throughput (24.7 % receive) and
//! studied larger clusters and more clusters per request as the fix; `usnet bench
//! server` reproduces that study beside the shared-memory ring transport
//! (`usnet-client`), which is the answer.
//!
//! `usnet up --rpc` serves it ([`Proxy`]); [`RpcClient`] is the client side, with
//! [`RpcListener`] and [`RpcStream`] (blocking `Read`/`Write`). Only TCP: the study
//! moves a byte stream.

mod client;
mod proxy;
pub mod wire;

pub use client::{RpcClient, RpcListener, RpcStream};
pub use proxy::{rpc_path, Proxy};

/// The largest cluster (MCLBYTES): the document varied 2048 and 4096; usnet allows up
/// to 64 KiB.
pub const MAX_CLUSTER: usize = 65536;
/// The most clusters one copy request may carry (MCLNUM).
pub const MAX_CLUSTERS: usize = 16;
/// The most one READ returns (a caller's larger buffer gets this much at most).
pub const MAX_READ: usize = 1 << 20;

/// Cluster geometry of a connection: copy requests carry `count` clusters of `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clusters {
    /// MCLBYTES.
    pub bytes: usize,
    /// MCLNUM.
    pub count: usize,
}

impl Default for Clusters {
    /// NetBSD's default: one 2 KiB cluster per copy request.
    fn default() -> Self {
        Clusters {
            bytes: 2048,
            count: 1,
        }
    }
}
