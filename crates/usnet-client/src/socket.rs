//! A socket before it is a listener, a stream or a bound datagram socket, as
//! `socket(2)` returns it: bind it, then listen or connect (TCP), or use it for
//! datagrams (UDP). The POSIX layer (`usnet-posix`) builds `socket`/`bind`/`listen`/
//! `connect` on this; Rust code normally uses the typed constructors instead.

use std::io;
use std::net::SocketAddr;

use usnet_session_abi::{
    op, opt, slot, SockAddr, CONNECT_FASTOPEN, KIND_ICMP, KIND_RAW, KIND_TCP, KIND_UDP,
};

use crate::sock::ClientSocket;
use crate::{Client, TcpListener, TcpStream, UdpSocket};

/// What a [`Socket`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketKind {
    Tcp,
    Udp,
    /// An ICMP echo socket (Linux's `SOCK_DGRAM` `IPPROTO_ICMP`): a [`UdpSocket`]
    /// whose datagrams are whole echo messages and whose port is its identifier.
    Icmp,
    /// A raw ICMP socket (Linux's `SOCK_RAW` `IPPROTO_ICMP` or `IPPROTO_ICMPV6`):
    /// a [`UdpSocket`] of one family (its first bind's) that reads a copy of
    /// every ICMP message of the family (an IPv4 one after its IP header) and
    /// sends whole ICMP messages.
    Raw,
}

/// A fresh socket at the server.
pub struct Socket {
    sock: ClientSocket,
    kind: SocketKind,
}

impl Socket {
    pub fn new(client: &Client, kind: SocketKind) -> io::Result<Socket> {
        let k = match kind {
            SocketKind::Tcp => KIND_TCP,
            SocketKind::Udp => KIND_UDP,
            SocketKind::Icmp => KIND_ICMP,
            SocketKind::Raw => KIND_RAW,
        };
        Ok(Socket {
            sock: ClientSocket::open(&client.conn, k)?,
            kind,
        })
    }

    /// Its slot in the session (what a fork's claim maps).
    #[doc(hidden)]
    pub fn fork_slot(&self) -> u32 {
        self.sock.slot
    }

    /// Names this socket across `exec` (`usnet_session_abi::slot::TAG`; the BSD layer's
    /// tag for it).
    #[doc(hidden)]
    pub fn set_exec_tag(&self, tag: u32) {
        self.sock.set_tag(tag);
    }

    /// The socket this program inherited at `slot` of its session
    /// ([`crate::Client::inherit`]).
    #[doc(hidden)]
    pub fn inherited(client: &Client, slot: u32, kind: SocketKind) -> io::Result<Socket> {
        Ok(Socket {
            sock: ClientSocket::from_slot(&client.conn, slot)?,
            kind,
        })
    }

    /// The same socket in a forked child's session (see `TcpStream::forked`).
    #[doc(hidden)]
    pub fn forked(&self, client: &Client, slot: u32) -> io::Result<Socket> {
        Ok(Socket {
            sock: self.sock.forked(&client.conn, slot)?,
            kind: self.kind,
        })
    }

    #[doc(hidden)]
    pub fn disown(&self) {
        self.sock.disown();
    }

    pub fn kind(&self) -> SocketKind {
        self.kind
    }

    /// Gives the socket its local address (port 0: the server picks one, which
    /// [`Self::local_addr`] reports). A TCP socket holds the port from now on, as
    /// Linux's: `EADDRINUSE` when a listener or another bound socket has it.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        self.bind_with(addr, 0, false)
    }

    /// [`Self::bind`] for the wildcard's `families` (`usnet_session_abi::FAM_V4` |
    /// `FAM_V6`; 0: both) with `reuse` (SO_REUSEADDR: two sockets that both set it
    /// may be bound to one port while neither listens).
    pub fn bind_with(&self, addr: SocketAddr, families: u64, reuse: bool) -> io::Result<()> {
        self.bind_reuse(addr, families, reuse, false)
    }

    /// [`Self::bind_with`] that also says whether SO_REUSEPORT was set
    /// (`reuseport`): its listener may then share its address and port with other
    /// SO_REUSEPORT listeners, each taking a share of the new connections.
    pub fn bind_reuse(
        &self,
        addr: SocketAddr,
        families: u64,
        reuse: bool,
        reuseport: bool,
    ) -> io::Result<()> {
        let a = SockAddr::from_std(addr).to_args();
        let flags = usnet_session_abi::bind_flags(reuse, reuseport);
        self.sock
            .call(op::BIND, [a[0], a[1], a[2], a[3], families, flags])
            .map(|_| ())
    }

    /// The bound address, if any.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::LOCAL)
    }

    /// A TCP socket starts listening (bound first, or on an ephemeral port).
    pub fn listen(self, backlog: usize) -> io::Result<TcpListener> {
        self.listen_families(backlog, 0)
    }

    /// [`Socket::listen`] whose wildcard address takes only `families`
    /// (`usnet_session_abi::FAM_V4` | `FAM_V6`; 0: both): Linux's `AF_INET` `0.0.0.0`, or
    /// `AF_INET6` `::` with or without `IPV6_V6ONLY`.
    pub fn listen_families(self, backlog: usize, families: u64) -> io::Result<TcpListener> {
        self.sock
            .call(op::LISTEN, [backlog as u64, families, 0, 0, 0, 0])?;
        Ok(TcpListener { sock: self.sock })
    }

    /// A TCP socket starts connecting and returns at once, as a non-blocking
    /// `connect`: the stream's `connected()`, `take_error()` or a read/write tell
    /// the outcome. Blocking mode and timeouts can be set on the stream after.
    pub fn connect_start(self, addr: SocketAddr) -> io::Result<TcpStream> {
        let a = SockAddr::from_std(addr).to_args();
        self.sock
            .call(op::CONNECT, [a[0], a[1], a[2], a[3], 0, 0])?;
        Ok(TcpStream { sock: self.sock })
    }

    /// A Fast Open connect (RFC 7413), as Linux's `sendto(MSG_FASTOPEN)`: the SYN
    /// carries what it can of `data` when a cookie for `addr` is cached (the
    /// returned count; 0 when the SYN asks for a cookie instead). The rest of
    /// `data` is the caller's to write once connected. `EOPNOTSUPP` when the stack's
    /// `tcp_fastopen` has no client bit. On failure the socket comes back as it was
    /// (unconnected), as Linux leaves it.
    #[allow(clippy::result_large_err)]
    pub fn connect_fastopen(
        self,
        addr: SocketAddr,
        data: &[u8],
    ) -> Result<(TcpStream, usize), (Socket, io::Error)> {
        if let Err(e) = self.sock.tx_stage(data) {
            return Err((self, e));
        }
        let a = SockAddr::from_std(addr).to_args();
        match self
            .sock
            .call(op::CONNECT, [a[0], a[1], a[2], a[3], CONNECT_FASTOPEN, 0])
        {
            Ok(q) => Ok((TcpStream { sock: self.sock }, q as usize)),
            Err(e) => Err((self, e)),
        }
    }

    /// An IP header field for the connection or listener it becomes
    /// ([`crate::IpHeader`]): the SYN of a `connect` carries it.
    pub fn set_ip_header(&self, f: crate::IpHeader) -> io::Result<()> {
        self.sock.set_ip_header(f)
    }

    /// TCP_MAXSEG before `connect`: the SYN's MSS (and the connection's) is at most
    /// `mss` (Linux's range 88..=32767; 0 clears it).
    pub fn set_maxseg(&self, mss: u16) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::IPPROTO_TCP, opt::TCP_MAXSEG, u64::from(mss), 0, 0, 0],
            )
            .map(|_| ())
    }

    /// TCP_SYNCNT before `connect`: the SYN is sent at most `n` times more.
    pub fn set_syn_count(&self, n: u8) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::IPPROTO_TCP, opt::TCP_SYNCNT, u64::from(n), 0, 0, 0],
            )
            .map(|_| ())
    }

    /// Whether a Fast Open connect to `addr` would carry data on its SYN (a cookie
    /// is cached, or the stack sends data without one): Linux's
    /// `TCP_FASTOPEN_CONNECT` defers the SYN to the first write only then.
    pub fn fastopen_ready(&self, addr: SocketAddr) -> io::Result<bool> {
        let a = SockAddr::from_std(addr).to_args();
        let q = [
            opt::SOL_USNET,
            opt::USNET_FASTOPEN_READY,
            a[0],
            a[1],
            a[2],
            a[3],
        ];
        Ok(self.sock.call(op::GETSOCKOPT, q)? & 2 != 0)
    }

    /// Whether the stack's `tcp_fastopen` lets clients use Fast Open.
    pub fn fastopen_client_enabled(&self) -> io::Result<bool> {
        let q = [opt::SOL_USNET, opt::USNET_FASTOPEN_READY, 0, 0, 0, 0];
        Ok(self.sock.call(op::GETSOCKOPT, q)? & 1 != 0)
    }

    /// A UDP socket as a datagram socket (bound already, or bound to an ephemeral
    /// port by its first `send_to`).
    pub fn into_udp(self) -> UdpSocket {
        UdpSocket::wrap(self.sock)
    }
}
