//! Errors a user can make when opening a link, each one line that says what to do.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(
        "unknown link '{0}': expected tap:NAME, shm:NAME, afpacket:IFNAME, xdp:IFNAME[@QUEUE] or nic:NAME"
    )]
    UnknownKind(String),
    #[error("{spec} needs root (CAP_NET_ADMIN): run as root or use --link shm:NAME")]
    NeedsRoot { spec: String },
    #[error(
        "shm link '{name}' is in use: both sides are held by live processes \
         (pids {pid_a} and {pid_b}); stop one of them or pick another name"
    )]
    ShmInUse {
        name: String,
        pid_a: i32,
        pid_b: i32,
    },
    #[error("shm link '{name}' was created with {what}; open it with the same settings or pick another name")]
    ShmMismatch { name: String, what: String },
    #[error(
        "shm link '{name}' has {queues} queues per side, fewer than the {shards} shards \
         opening it: the first side to open a link sets its layout, so open it first with \
         --shm-queues {shards}, or pick another name"
    )]
    ShmQueues {
        name: String,
        queues: usize,
        shards: usize,
    },
    #[error("bad shm queue count {0}: must be between 1 and 16")]
    BadQueues(usize),
    #[error("bad link name '{name}': {why}")]
    BadName { name: String, why: &'static str },
    #[error("interface '{0}' not found: check `ip link` for its name")]
    NoSuchInterface(String),
    #[error("{0} cannot carry several shards yet: use afpacket:IFNAME, tap:NAME, shm:NAME or xdp:IFNAME (all its queues from 0), or one shard")]
    NoShards(String),
    #[error("bad MTU {mtu}: must be between {min} and {max}")]
    BadMtu { mtu: usize, min: usize, max: usize },
    #[error("bad shm slot count {0}: must be a power of two between 2 and 65536")]
    BadSlots(usize),
    #[error("bad fault spec '{spec}': {why}")]
    BadFault { spec: String, why: String },
    #[error("`{cmd}` failed: {why}")]
    Command { cmd: String, why: String },
    /// An AF_XDP link that cannot run as asked (the message says why and what to do).
    #[error("{0}")]
    Xdp(String),
    #[error(transparent)]
    Nic(#[from] crate::nic::NicError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl LinkError {
    /// An I/O error with what was being done when it happened.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        LinkError::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<LinkError> for io::Error {
    fn from(e: LinkError) -> Self {
        match e {
            LinkError::Io { source, context } => {
                io::Error::new(source.kind(), format!("{context}: {source}"))
            }
            LinkError::NeedsRoot { .. } => {
                io::Error::new(io::ErrorKind::PermissionDenied, e.to_string())
            }
            LinkError::ShmInUse { .. } | LinkError::Nic(crate::nic::NicError::Busy(_)) => {
                io::Error::new(io::ErrorKind::AddrInUse, e.to_string())
            }
            LinkError::NoSuchInterface(_) => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}
