//! The stack's errors. [`StackError::errno`] is the one mapping from a stack error to
//! an errno (the runtime and the stack server, so the C ABI and the packetdrill
//! backend too, report errors through it); the numbers are `usnet_socket_api::errno`'s,
//! usnet's one table.

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
        use usnet_socket_api::errno::*;
        match self {
            StackError::WouldBlock => EAGAIN,
            StackError::AddrInUse => EADDRINUSE,
            StackError::AddrNotAvailable => EADDRNOTAVAIL,
            StackError::InvalidHandle => EBADF,
            StackError::NotConnected => ENOTCONN,
            StackError::NoRoute => EHOSTUNREACH,
            StackError::MessageTooLong => EMSGSIZE,
            StackError::NoBuffers => ENOBUFS,
            StackError::InvalidInput => EINVAL,
            StackError::WrongType => ENOTSOCK,
            StackError::ConnectionRefused => ECONNREFUSED,
            StackError::ConnectionReset => ECONNRESET,
            StackError::ConnectionAborted => ECONNABORTED,
            StackError::TimedOut => ETIMEDOUT,
            StackError::BrokenPipe => EPIPE,
            StackError::HostUnreachable => EHOSTUNREACH,
            StackError::NetUnreachable => ENETUNREACH,
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
