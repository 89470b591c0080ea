//! The socket calls usnet's built-in services (echo, discard, chargen, HTTP) need, as
//! one non-blocking, handle-based trait. The sans-IO `Stack` implements it (a service
//! in a process's own poll loop), and so does a stack server client
//! (`usnet_client::ClientNet`: the same service as an ordinary client of `usnet up`).
//! Errors are `io::Error`s with the Linux errno; `WouldBlock` means "not now".

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// A socket, as the implementation names it.
pub type Handle = u64;

/// Readiness of one socket, as `poll(2)` would report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    pub readable: bool,
    pub writable: bool,
    /// The connection is over (closed, reset, timed out).
    pub closed: bool,
    /// The handshake completed.
    pub connected: bool,
}

/// Non-blocking socket calls.
pub trait SocketApi {
    /// Monotonic time (for idle and progress timeouts).
    fn now(&self) -> Duration;

    fn tcp_listen(&mut self, addr: SocketAddr, backlog: usize) -> io::Result<Handle>;
    /// A completed connection, or `WouldBlock`.
    fn tcp_accept(&mut self, listener: Handle) -> io::Result<Handle>;
    /// Bytes taken (`WouldBlock` when the send buffer is full).
    fn tcp_send(&mut self, h: Handle, data: &[u8]) -> io::Result<usize>;
    /// Bytes read; `Ok(0)` at end of stream; `WouldBlock` when nothing is there yet.
    fn tcp_recv(&mut self, h: Handle, buf: &mut [u8]) -> io::Result<usize>;
    fn tcp_shutdown_write(&mut self, h: Handle) -> io::Result<()>;
    fn tcp_set_nodelay(&mut self, h: Handle, on: bool) -> io::Result<()>;
    /// Orderly close (queued bytes still go out).
    fn tcp_close(&mut self, h: Handle) -> io::Result<()>;
    /// Abortive close (RST).
    fn tcp_abort(&mut self, h: Handle) -> io::Result<()>;

    fn udp_bind(&mut self, addr: SocketAddr) -> io::Result<Handle>;
    fn udp_send_to(&mut self, h: Handle, data: &[u8], to: SocketAddr) -> io::Result<usize>;
    fn udp_recv_from(&mut self, h: Handle, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)>;

    fn readiness(&self, h: Handle) -> io::Result<Readiness>;
    /// Closes a socket of any kind.
    fn close(&mut self, h: Handle) -> io::Result<()>;
}

/// Linux's errno numbers, usnet's one table: the stack's `StackError::errno`, the
/// stack server's ABI (`usnet_session_abi::errno`) and the client library take them from
/// here. Here because this crate depends on nothing, so the sans-IO stack and the
/// ABI can both use it without the stack importing the server's ABI. Written out
/// rather than taken from `libc`: the ABI's numbers are Linux's on any build, and
/// neither the stack nor the ABI needs libc; a test holds them to `libc`'s.
/// The flags of a zero-copy slot (the PASTE/netmap-style ring API): one table for
/// the sans-IO stack's vocabulary (`usnet_stack::zerocopy`) and the stack server's
/// port layout (`usnet_session_abi::zc`), which pass flags through unchanged. Here
/// because both depend on this crate and neither may depend on the other.
pub mod zc_flags {
    /// TX: more data follows at once (hold a partial segment; no push). A slot
    /// without it is pushed at once: zero-copy sockets run without Nagle.
    pub const SLOT_MORE: u16 = 0x1;
    /// TX: close the socket after this slot's data (the length may be 0).
    pub const SLOT_CLOSE: u16 = 0x2;
    /// RX: the peer finished sending (length 0).
    pub const SLOT_EOF: u16 = 0x4;
    /// RX: the connection failed (reset, timed out; length 0). TX, written back by
    /// the stack: the slot was refused and its buffer is still the application's.
    pub const SLOT_ERROR: u16 = 0x8;
    /// RX: a connection was accepted on one of the port's listeners (length 0);
    /// `socket` is the new connection and `off` its piece length (one segment's
    /// payload: a piece that long leaves in place).
    pub const SLOT_NEW: u16 = 0x10;
    /// RX, set by the application before it advances `head` past the slot: `buf`
    /// now names a spare buffer it owned, which the stack frees; the application
    /// keeps the buffer that was delivered in the slot (PASTE's `NS_BUF_CHANGED`).
    pub const SLOT_BUF_CHANGED: u16 = 0x20;
    /// TX: finish sending after this slot's data (FIN; SHUT_WR): the socket stays
    /// readable and stays the port's until a [`SLOT_CLOSE`].
    pub const SLOT_SHUT_WR: u16 = 0x40;
    /// TX: the application keeps its hold on the buffer; the stack takes a
    /// reference of its own for as long as it needs the bytes (until they are
    /// acknowledged), as `sendfile` sends the page cache. So one buffer (a cached
    /// response) can go out on many connections, or many times, written once. Its
    /// bytes are read whenever a segment is built, so the application must not
    /// change them while a send of them may be in flight. A buffer held more than
    /// once never leaves in place (two frames would write their headers into its
    /// headroom): without TSO the stack copies it into each frame.
    pub const SLOT_KEEP: u16 = 0x80;
    /// `buf` of a slot without a buffer.
    pub const NO_BUF: u32 = u32::MAX;
}

/// What an ICMP echo ("ping") socket accepts from its application, as Linux's
/// `ping_common_sendmsg` does: an echo request of the destination's family with
/// code 0, its header at least (the identifier and checksum are the stack's to
/// set). Here so that the stack (which sends it) and the stack server's client
/// (which must refuse a bad one with EINVAL at the call) keep one rule.
pub mod echo {
    /// The echo header: type, code, checksum, identifier, sequence number.
    pub const HEADER: usize = 8;
    pub const REQUEST_V4: u8 = 8;
    pub const REQUEST_V6: u8 = 128;

    /// `msg`'s sequence number and echo data when an echo socket may send it to
    /// an address of the family `v4` says; `None`: EINVAL.
    pub fn request(v4: bool, msg: &[u8]) -> Option<(u16, &[u8])> {
        let want = if v4 { REQUEST_V4 } else { REQUEST_V6 };
        if msg.len() < HEADER || msg[0] != want || msg[1] != 0 {
            return None;
        }
        Some((u16::from_be_bytes([msg[6], msg[7]]), &msg[HEADER..]))
    }
}

pub mod errno {
    macro_rules! table {
        ($($name:ident = $n:literal,)*) => {
            $(pub const $name: i32 = $n;)*

            #[cfg(all(test, target_os = "linux"))]
            #[test]
            fn numbers_are_linux() {
                $(assert_eq!($name, libc::$name, stringify!($name));)*
            }
        };
    }

    table! {
        EPERM = 1,
        ENOENT = 2,
        EINTR = 4,
        ENXIO = 6,
        EBADF = 9,
        EAGAIN = 11,
        ENOMEM = 12,
        EACCES = 13,
        EFAULT = 14,
        EINVAL = 22,
        EMFILE = 24,
        EPIPE = 32,
        ENOSYS = 38,
        ENONET = 64,
        EPROTO = 71,
        ENOTSOCK = 88,
        EMSGSIZE = 90,
        ENOPROTOOPT = 92,
        ESOCKTNOSUPPORT = 94,
        EOPNOTSUPP = 95,
        EADDRINUSE = 98,
        EADDRNOTAVAIL = 99,
        ENETDOWN = 100,
        ENETUNREACH = 101,
        ECONNABORTED = 103,
        ECONNRESET = 104,
        ENOBUFS = 105,
        EISCONN = 106,
        ENOTCONN = 107,
        ETIMEDOUT = 110,
        ECONNREFUSED = 111,
        EHOSTDOWN = 112,
        EHOSTUNREACH = 113,
        EALREADY = 114,
        EINPROGRESS = 115,
    }
}
