//! The stack's errors. [`StackError::errno`] is the one errno table of usnet: the
//! runtime, the C ABI and the packetdrill backend all report errors through it.

use std::net::IpAddr;

use usnet_pool::PoolError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StackError {
    #[error("operation would block")]
    WouldBlock,
    #[error("address already in use")]
    AddrInUse,
    #[error("address not available on this stack")]
    AddrNotAvailable,
    #[error("no such socket")]
    InvalidHandle,
    #[error("socket is not connected")]
    NotConnected,
    #[error("no route to host")]
    NoRoute,
    #[error("message too long")]
    MessageTooLong,
    #[error("no packet buffers available")]
    NoBuffers,
    #[error("invalid argument")]
    InvalidInput,
    #[error("wrong socket type for this operation")]
    WrongType,
    #[error("connection refused")]
    ConnectionRefused,
    #[error("connection reset by peer")]
    ConnectionReset,
    #[error("connection aborted")]
    ConnectionAborted,
    #[error("connection timed out")]
    TimedOut,
    #[error("broken pipe: the socket was shut down for writing")]
    BrokenPipe,
    #[error("host unreachable (ICMP)")]
    HostUnreachable,
    #[error("network unreachable (ICMP)")]
    NetUnreachable,
}

impl StackError {
    /// The errno a C caller sees.
    pub fn errno(self) -> i32 {
        match self {
            StackError::WouldBlock => 11,         // EAGAIN
            StackError::AddrInUse => 98,          // EADDRINUSE
            StackError::AddrNotAvailable => 99,   // EADDRNOTAVAIL
            StackError::InvalidHandle => 9,       // EBADF
            StackError::NotConnected => 107,      // ENOTCONN
            StackError::NoRoute => 113,           // EHOSTUNREACH
            StackError::MessageTooLong => 90,     // EMSGSIZE
            StackError::NoBuffers => 105,         // ENOBUFS
            StackError::InvalidInput => 22,       // EINVAL
            StackError::WrongType => 88,          // ENOTSOCK
            StackError::ConnectionRefused => 111, // ECONNREFUSED
            StackError::ConnectionReset => 104,   // ECONNRESET
            StackError::ConnectionAborted => 103, // ECONNABORTED
            StackError::TimedOut => 110,          // ETIMEDOUT
            StackError::BrokenPipe => 32,         // EPIPE
            StackError::HostUnreachable => 113,   // EHOSTUNREACH
            StackError::NetUnreachable => 101,    // ENETUNREACH
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("MTU {0} is out of range (68..=65535, and at least 1280 with IPv6)")]
    BadMtu(usize),
    #[error("the MAC address must be unicast")]
    BadMac,
    #[error("gateway {0} is not inside any configured prefix")]
    GatewayOffLink(IpAddr),
    #[error("packet pool: {0}")]
    Pool(#[from] PoolError),
}

impl From<usnet_tcp::TcpError> for StackError {
    /// The engine's reasons a connection ended, as the stack reports them.
    fn from(e: usnet_tcp::TcpError) -> Self {
        use usnet_tcp::TcpError;
        match e {
            TcpError::Refused => StackError::ConnectionRefused,
            TcpError::Reset => StackError::ConnectionReset,
            TcpError::TimedOut => StackError::TimedOut,
            TcpError::Aborted => StackError::ConnectionAborted,
            TcpError::HostUnreachable => StackError::HostUnreachable,
            TcpError::NetUnreachable => StackError::NetUnreachable,
        }
    }
}
