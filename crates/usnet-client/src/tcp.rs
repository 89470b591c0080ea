//! TCP over a stack server, shaped like `std::net` (and like usnet-runtime's
//! in-process types).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::{Duration, Instant};

use usnet_session_abi::{
    op, opt, slot, tcp_info, SockAddr, FLAG_ACCEPTABLE, FLAG_CONNECTED, FLAG_ERROR, FLAG_ERRQUEUE,
    FLAG_HUP, FLAG_RX_EOF, FLAG_SNDBUF, FLAG_WRITABLE, FLAG_WR_SHUT, KIND_TCP, SEND_EOR, SEND_MORE,
    SHUT_RD, SHUT_RDWR, SHUT_WR, STAMP_TIMED, STAMP_TSONLY,
};

use crate::conn::errno_err;
use crate::sock::ClientSocket;
use crate::Client;

/// How a read takes bytes from the receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadMode {
    Read,
    Peek,
    /// Stops at the urgent mark (`splice`).
    ToMark,
}

/// A transmit timestamp (`SO_TIMESTAMPING`, as Linux reports one on TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxTimestamp {
    /// `SCM_TSTAMP_SND` (0), `SCM_TSTAMP_SCHED` (1) or `SCM_TSTAMP_ACK` (2).
    pub info: u32,
    /// `OPT_ID`: the stamped byte's number (0 without it).
    pub key: u32,
    /// When it happened, ns of `CLOCK_REALTIME` (None: no software stamps asked).
    pub wall_ns: Option<i64>,
    /// `OPT_TSONLY`: no packet comes with it.
    pub tsonly: bool,
}

/// A listening TCP socket.
pub struct TcpListener {
    pub(crate) sock: ClientSocket,
}

impl TcpListener {
    /// Its slot in the session (what a fork's claim maps).
    #[doc(hidden)]
    pub fn fork_slot(&self) -> u32 {
        self.sock.slot
    }

    /// The same socket in a forked child's session (`Client::claim` put it at
    /// `slot`), blocking mode and timeouts kept; in a real child, [`Self::disown`]
    /// the parent's copy.
    #[doc(hidden)]
    pub fn forked(&self, client: &Client, slot: u32) -> io::Result<TcpListener> {
        Ok(TcpListener {
            sock: self.sock.forked(&client.conn, slot)?,
        })
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
    pub fn inherited(client: &Client, slot: u32) -> io::Result<TcpListener> {
        Ok(TcpListener {
            sock: ClientSocket::from_slot(&client.conn, slot)?,
        })
    }

    /// Never closes or posts again (a forked child's copy that has no slot of its own).
    #[doc(hidden)]
    pub fn disown(&self) {
        self.sock.disown();
    }

    /// Priority-aware receive: ranks this listener (and the connections it
    /// accepts, which share its port) with `priority`; see
    /// [`crate::UdpSocket::set_rx_priority`].
    pub fn set_rx_priority(&self, priority: Option<i32>) -> io::Result<()> {
        crate::udp::set_rx_priority(&self.sock, priority)
    }

    /// TCP_USER_TIMEOUT (ms, 0: none) for the connections it accepts.
    pub fn set_user_timeout(&self, ms: u32) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [
                    opt::IPPROTO_TCP,
                    opt::TCP_USER_TIMEOUT,
                    u64::from(ms),
                    0,
                    0,
                    0,
                ],
            )
            .map(|_| ())
    }

    /// An IP header field of the connections it accepts from now on, their
    /// SYN-ACKs included, or a minimum TTL for the segments it takes ([`IpHeader`]).
    pub fn set_ip_header(&self, f: IpHeader) -> io::Result<()> {
        self.sock.set_ip_header(f)
    }

    /// TCP_MAXSEG: its SYN-ACKs advertise (and its connections use) at most `mss`.
    pub fn set_maxseg(&self, mss: u16) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::IPPROTO_TCP, opt::TCP_MAXSEG, u64::from(mss), 0, 0, 0],
            )
            .map(|_| ())
    }

    /// TCP_FASTOPEN: the Fast Open queue length (0: off; RFC 7413 server, as the
    /// stack's `tcp_fastopen` server bits allow).
    pub fn set_fastopen(&self, qlen: u32) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [
                    opt::IPPROTO_TCP,
                    opt::TCP_FASTOPEN,
                    u64::from(qlen),
                    0,
                    0,
                    0,
                ],
            )
            .map(|_| ())
    }

    /// TCP_FASTOPEN_KEY: the key this listener's cookies are made with.
    pub fn set_fastopen_key(&self, key: [u8; 16], backup: Option<[u8; 16]>) -> io::Result<()> {
        let halves = |k: &[u8; 16]| {
            (
                u64::from_le_bytes(k[..8].try_into().expect("8 bytes")),
                u64::from_le_bytes(k[8..].try_into().expect("8 bytes")),
            )
        };
        let (lo, hi) = halves(&key);
        let (name, (blo, bhi)) = match &backup {
            Some(b) => (opt::TCP_FASTOPEN_KEYS, halves(b)),
            None => (opt::TCP_FASTOPEN_KEY, (0, 0)),
        };
        self.sock
            .call(op::SETSOCKOPT, [opt::IPPROTO_TCP, name, lo, hi, blo, bhi])
            .map(|_| ())
    }

    /// Binds and listens (backlog 128); port 0 picks one.
    pub fn bind(client: &Client, addr: SocketAddr) -> io::Result<TcpListener> {
        Self::bind_with_backlog(client, addr, 128)
    }

    pub fn bind_with_backlog(
        client: &Client,
        addr: SocketAddr,
        backlog: usize,
    ) -> io::Result<TcpListener> {
        let sock = ClientSocket::open(&client.conn, KIND_TCP)?;
        let a = SockAddr::from_std(addr).to_args();
        sock.call(op::BIND, [a[0], a[1], a[2], a[3], 0, 0])?;
        sock.call(op::LISTEN, [backlog as u64, 0, 0, 0, 0, 0])?;
        Ok(TcpListener { sock })
    }

    /// Takes a connection (blocking unless non-blocking).
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            match self.sock.call(op::ACCEPT, [0; 6]) {
                Ok(s) => {
                    let sock = ClientSocket::from_slot(&self.sock.conn, s as u32)?;
                    let peer = sock.addr(slot::PEER)?;
                    return Ok((TcpStream { sock }, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let s = &self.sock;
                    s.block(None, || s.flags() & FLAG_ACCEPTABLE != 0)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::LOCAL)
    }

    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nb);
        Ok(())
    }

    /// Connections are waiting to be accepted.
    pub fn acceptable(&self) -> bool {
        self.sock.flags() & FLAG_ACCEPTABLE != 0
    }
}

/// An IP header field a TCP socket chooses, kept per address family as Linux
/// keeps them (the IPv4 ones for an IPv4 or IPv4-mapped peer, the IPv6 ones for
/// an IPv6 peer). On a fresh socket it takes effect at `connect` (the SYN
/// carries it) or `listen`; on a listener, for the connections it accepts from
/// then on; on a connection of its family, from its next packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpHeader {
    /// `IP_TOS`: the DSCP bits (TCP keeps the ECN bits).
    Tos(u8),
    /// `IP_TTL` (None: the stack's).
    Ttl(Option<u8>),
    /// `IP_MINTTL`: segments that arrive with a lower TTL are dropped (RFC 5082,
    /// GTSM; 0: none).
    MinTtl(u8),
    /// `IPV6_TCLASS`.
    Tclass6(u8),
    /// `IPV6_UNICAST_HOPS` (None: the stack's).
    UnicastHops6(Option<u8>),
    /// `IPV6_MINHOPCOUNT`.
    MinHopCount6(u8),
}

impl IpHeader {
    /// The option's level, name and value in a `SETSOCKOPT` request.
    pub(crate) fn request(self) -> [u64; 3] {
        let hops = |h: Option<u8>| h.map_or(u64::MAX, u64::from);
        match self {
            IpHeader::Tos(v) => [opt::IPPROTO_IP, opt::IP_TOS, u64::from(v)],
            IpHeader::Ttl(v) => [opt::IPPROTO_IP, opt::IP_TTL, hops(v)],
            IpHeader::MinTtl(v) => [opt::IPPROTO_IP, opt::IP_MINTTL, u64::from(v)],
            IpHeader::Tclass6(v) => [opt::IPPROTO_IPV6, opt::IPV6_TCLASS, u64::from(v)],
            IpHeader::UnicastHops6(v) => [opt::IPPROTO_IPV6, opt::IPV6_UNICAST_HOPS, hops(v)],
            IpHeader::MinHopCount6(v) => [opt::IPPROTO_IPV6, opt::IPV6_MINHOPCOUNT, u64::from(v)],
        }
    }
}

/// What `TcpStream::info` reports (a subset of Linux's `tcp_info`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Linux's `tcpi_state` numbering (1 = ESTABLISHED).
    pub state: u32,
    pub rtt: Duration,
    pub rttvar: Duration,
    pub min_rtt: Duration,
    pub rto: Duration,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub cwnd: u32,
    pub ssthresh: u32,
    pub bytes_in_flight: u32,
    pub total_retransmits: u32,
    pub snd_wnd: u32,
    pub rcv_wnd: u32,
    /// Linux's `tcpi_ca_state` and `tcpi_options` numbering.
    pub ca_state: u8,
    pub options: u8,
    /// Window scales (send, receive).
    pub wscale: (u8, u8),
    pub backoff: u8,
    /// Segments selectively acknowledged, lost, retransmitted in flight.
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub reordering: u32,
    pub reord_seen: u32,
    pub rcv_space: u32,
    pub last_data_recv: Duration,
    /// Segments delivered.
    pub delivered: u32,
    /// Time busy (data queued or unacknowledged), and of that limited by the
    /// peer's window and by the send buffer.
    pub busy_time: Duration,
    pub rwnd_limited: Duration,
    pub sndbuf_limited: Duration,
    /// Bytes per second: the pacing rate, and the latest delivery-rate sample
    /// (which was application-limited if the flag says so).
    pub pacing_rate: u64,
    pub delivery_rate: u64,
    pub delivery_rate_app_limited: bool,
}

/// A TCP connection. `Read`/`Write` are implemented for `TcpStream` and `&TcpStream`,
/// so one thread may read while another writes.
pub struct TcpStream {
    pub(crate) sock: ClientSocket,
}

impl TcpStream {
    /// Its slot in the session (what a fork's claim maps).
    #[doc(hidden)]
    pub fn fork_slot(&self) -> u32 {
        self.sock.slot
    }

    /// The same socket in a forked child's session (`Client::claim` put it at
    /// `slot`), blocking mode and timeouts kept; in a real child, [`Self::disown`]
    /// the parent's copy.
    #[doc(hidden)]
    pub fn forked(&self, client: &Client, slot: u32) -> io::Result<TcpStream> {
        Ok(TcpStream {
            sock: self.sock.forked(&client.conn, slot)?,
        })
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
    pub fn inherited(client: &Client, slot: u32) -> io::Result<TcpStream> {
        Ok(TcpStream {
            sock: ClientSocket::from_slot(&client.conn, slot)?,
        })
    }

    /// Never closes or posts again (a forked child's copy that has no slot of its own).
    #[doc(hidden)]
    pub fn disown(&self) {
        self.sock.disown();
    }

    /// Connects and waits for the handshake.
    pub fn connect(client: &Client, addr: SocketAddr) -> io::Result<TcpStream> {
        Self::connect_inner(client, addr, None)
    }

    pub fn connect_timeout(
        client: &Client,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        Self::connect_inner(client, addr, Some(crate::vtime::now() + timeout))
    }

    /// Starts a connection and returns at once (like a non-blocking `connect`):
    /// [`TcpStream::connected`] or a write/read tells the outcome.
    pub fn connect_nonblocking(client: &Client, addr: SocketAddr) -> io::Result<TcpStream> {
        let sock = ClientSocket::open(&client.conn, KIND_TCP)?;
        let a = SockAddr::from_std(addr).to_args();
        sock.call(op::CONNECT, [a[0], a[1], a[2], a[3], 0, 0])?;
        sock.set_nonblocking(true);
        Ok(TcpStream { sock })
    }

    fn connect_inner(
        client: &Client,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> io::Result<TcpStream> {
        let sock = ClientSocket::open(&client.conn, KIND_TCP)?;
        let a = SockAddr::from_std(addr).to_args();
        sock.call(op::CONNECT, [a[0], a[1], a[2], a[3], 0, 0])?;
        let done = || sock.flags() & (FLAG_CONNECTED | FLAG_ERROR | FLAG_HUP) != 0;
        if !client.conn.wait_until(deadline, true, done)? {
            return Err(io::ErrorKind::TimedOut.into());
        }
        if let Some(e) = sock.failure() {
            return Err(e);
        }
        if sock.flags() & FLAG_CONNECTED == 0 {
            return Err(errno_err(usnet_session_abi::errno::ECONNREFUSED));
        }
        Ok(TcpStream { sock })
    }

    /// The handshake completed.
    pub fn connected(&self) -> bool {
        self.sock.flags() & FLAG_CONNECTED != 0
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::PEER)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::LOCAL)
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let h = match how {
            Shutdown::Read => SHUT_RD,
            Shutdown::Write => SHUT_WR,
            Shutdown::Both => SHUT_RDWR,
        };
        self.sock.call(op::SHUTDOWN, [h, 0, 0, 0, 0, 0]).map(|_| ())
    }

    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.sock.set_nonblocking(nb);
        Ok(())
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(t)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.sock.set_write_timeout(t)
    }

    /// SO_ZEROCOPY: `MSG_ZEROCOPY` sends are numbered and complete on the error
    /// queue once acknowledged ([`TcpStream::zerocopy_sent`],
    /// [`TcpStream::zerocopy_take`]; `crate::msgzc`).
    pub fn set_zerocopy(&self, on: bool) -> io::Result<()> {
        let mut zc = self.sock.conn.zc.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            self.sock
                .conn
                .zc_used
                .store(true, std::sync::atomic::Ordering::Release);
            zc.entry(self.sock.slot).or_default();
        } else {
            zc.remove(&self.sock.slot);
        }
        drop(zc);
        self.setopt(opt::SOL_SOCKET, opt::SO_ZEROCOPY, on as u64)
    }

    /// A `MSG_ZEROCOPY` send just wrote its bytes: it gets the next id (nothing
    /// without SO_ZEROCOPY, as Linux ignores the flag then).
    pub fn zerocopy_sent(&self) {
        let end = self.sock.tx_position();
        let mut zc = self.sock.conn.zc.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(z) = zc.get_mut(&self.sock.slot) {
            z.record(end);
        }
    }

    /// `SO_TIMESTAMPING` (`SOF_TIMESTAMPING_*` flags): with a transmit flag, the last
    /// byte of each write is stamped when it leaves and when it is acknowledged
    /// ([`Self::timestamp_take`]); the writes then meet the stack as
    /// [`Self::send_bounded`] says. `EINVAL` for unknown flags.
    pub fn set_timestamping(&self, flags: u32) -> io::Result<()> {
        self.setopt(opt::SOL_SOCKET, opt::SO_TIMESTAMPING, u64::from(flags))
    }

    /// The oldest transmit timestamp waiting (`recvmsg(MSG_ERRQUEUE)`), if any.
    pub fn timestamp_take(&self) -> io::Result<Option<TxTimestamp>> {
        if self.sock.flags() & FLAG_ERRQUEUE == 0 {
            return Ok(None);
        }
        self.sock.live()?;
        let req = self.sock.request(op::ERRQUEUE, [0; 6]);
        match self.sock.conn.call(req) {
            Ok((info, [aux, age])) => Ok(Some(TxTimestamp {
                info: info as u32,
                key: aux as u32,
                tsonly: aux & STAMP_TSONLY != 0,
                wall_ns: (aux & STAMP_TIMED != 0)
                    .then(|| crate::vtime::wall_ns() - age.min(i64::MAX as u64) as i64),
            })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// SO_ZEROCOPY is on (a `MSG_ZEROCOPY` send is numbered).
    pub fn zerocopy_on(&self) -> bool {
        let zc = self.sock.conn.zc.lock().unwrap_or_else(|p| p.into_inner());
        zc.contains_key(&self.sock.slot)
    }

    /// `recvmsg(MSG_ERRQUEUE)`: the oldest completed range of zero-copy send ids.
    pub fn zerocopy_take(&self) -> Option<(u32, u32)> {
        let acked = self.sock.tx_acked();
        let mut zc = self.sock.conn.zc.lock().unwrap_or_else(|p| p.into_inner());
        zc.get_mut(&self.sock.slot)?.take(acked)
    }

    /// Closed, reset or failed: nothing more will come or go.
    pub fn hung_up(&self) -> bool {
        self.sock.hung_up()
    }

    /// The peer's FIN arrived (reads end once the ring is empty).
    pub fn fin_received(&self) -> bool {
        self.sock.flags() & FLAG_RX_EOF != 0
    }

    /// TCP_NODELAY, posted without waiting for the server (nginx turns it off
    /// before every corked response and on after it): it cannot fail on a
    /// connection, and the server moves what was written before it into the stack
    /// first, so those bytes meet the setting they were written under.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.post_opt(opt::TCP_NODELAY, on as u64)
    }

    /// A TCP option posted without waiting (see [`Self::set_nodelay`]).
    fn post_opt(&self, name: u64, value: u64) -> io::Result<()> {
        self.sock.live()?;
        let req = self
            .sock
            .request(op::SETSOCKOPT, [opt::IPPROTO_TCP, name, value, 0, 0, 0]);
        self.sock.conn.post(req, true).map(|_| ())
    }

    /// TCP_CORK: hold partial segments until the cork is lifted (which sends them) or
    /// for at most 200 ms. Posted without waiting for the server either way (a
    /// server that corks and uncorks around every response, nginx's `tcp_nopush`,
    /// would wait for the stack twice per response): setting it holds the bytes
    /// written after it in the ring until the server has set it
    /// (`slot::TX_HOLD`); lifting it cannot fail on a connection, and the server
    /// moves what was written before it into the stack first, so those bytes go out
    /// at once (bytes written after it may meet the cork for the rest of that turn).
    pub fn set_cork(&self, on: bool) -> io::Result<()> {
        if on {
            // The bytes written from here on wait in the ring for the cork
            // (`slot::TX_HOLD`), so setting it need not wait either.
            self.sock.live()?;
            let hold = self.sock.tx_position() + 1;
            self.sock
                .conn
                .mem
                .slot_u64(self.sock.slot, slot::TX_HOLD)
                .store(hold, std::sync::atomic::Ordering::Release);
            let req = self.sock.request(
                op::SETSOCKOPT,
                [opt::IPPROTO_TCP, opt::TCP_CORK, 1, hold, 0, 0],
            );
            return self.sock.conn.post(req, true).map(|_| ());
        }
        self.post_opt(opt::TCP_CORK, 0)
    }

    /// SO_SNDBUF as the application passed it: the stack's send-buffer limit for
    /// this connection becomes twice that (Linux's accounting), without autotuning.
    pub fn set_send_buffer_size(&self, bytes: i32) -> io::Result<()> {
        self.setopt(opt::SOL_SOCKET, opt::SO_SNDBUF, bytes.max(0) as u64)
    }

    /// TCP_NOTSENT_LOWAT: at most `bytes` wait unsent in the stack (0: the stack's
    /// `tcp_notsent_lowat`).
    pub fn set_notsent_lowat(&self, bytes: u32) -> io::Result<()> {
        self.setopt(opt::IPPROTO_TCP, opt::TCP_NOTSENT_LOWAT, u64::from(bytes))
    }

    pub fn set_keepalive(&self, on: bool) -> io::Result<()> {
        self.set_keepalive_with(on, 0, 0, 0)
    }

    /// SO_KEEPALIVE with TCP_KEEPIDLE and TCP_KEEPINTVL (seconds) and TCP_KEEPCNT
    /// (each 0: the default, 7200 s, 75 s, 9). Posted without waiting, as
    /// [`Self::set_nodelay`]: the server cannot refuse it (it sets the connection's
    /// timers), and Go sets it and its three timers on every connection it accepts
    /// or dials, each a round trip to the server when waited for.
    pub fn set_keepalive_with(&self, on: bool, idle: u32, intvl: u32, cnt: u32) -> io::Result<()> {
        self.sock.live()?;
        let req = self.sock.request(
            op::SETSOCKOPT,
            [
                opt::SOL_SOCKET,
                opt::SO_KEEPALIVE,
                on as u64,
                u64::from(idle),
                u64::from(intvl),
                u64::from(cnt),
            ],
        );
        self.sock.conn.post(req, true).map(|_| ())
    }

    /// TCP_USER_TIMEOUT in milliseconds (0: none).
    pub fn set_user_timeout(&self, ms: u32) -> io::Result<()> {
        self.setopt(opt::IPPROTO_TCP, opt::TCP_USER_TIMEOUT, u64::from(ms))
    }

    /// TCP_CONGESTION: `opt::CC_CUBIC`, `opt::CC_RENO` or `opt::CC_BBR`.
    pub fn set_congestion(&self, cc: u64) -> io::Result<()> {
        self.setopt(opt::IPPROTO_TCP, opt::TCP_CONGESTION, cc)
    }

    /// SO_MAX_PACING_RATE in bytes per second (`u64::MAX`: none).
    pub fn set_max_pacing_rate(&self, rate: u64) -> io::Result<()> {
        self.setopt(opt::SOL_SOCKET, opt::SO_MAX_PACING_RATE, rate)
    }

    /// IP_TOS (IPV6_TCLASS on an IPv6 connection): the DSCP bits of the
    /// connection's packets.
    pub fn set_tos(&self, tos: u8) -> io::Result<()> {
        let f = match self.peer_addr()? {
            SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_none() => IpHeader::Tclass6(tos),
            _ => IpHeader::Tos(tos),
        };
        self.set_ip_header(f)
    }

    /// An IP header field of the connection's packets ([`IpHeader`]).
    pub fn set_ip_header(&self, f: IpHeader) -> io::Result<()> {
        self.sock.set_ip_header(f)
    }

    /// `Some(0)`: close resets the connection; `None`: orderly close.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let v = linger.map_or(u64::MAX, |d| d.as_secs());
        self.setopt(opt::SOL_SOCKET, opt::SO_LINGER, v)
    }

    fn setopt(&self, level: u64, name: u64, value: u64) -> io::Result<()> {
        self.sock
            .call(op::SETSOCKOPT, [level, name, value, 0, 0, 0])
            .map(|_| ())
    }

    /// The pending socket error (SO_ERROR), cleared by reading it.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        let e = self
            .sock
            .call(op::GETSOCKOPT, [opt::SOL_SOCKET, opt::SO_ERROR, 0, 0, 0, 0])?;
        Ok((e != 0).then(|| io::Error::from_raw_os_error(e as i32)))
    }

    /// The connection's `tcp_info`.
    pub fn info(&self) -> io::Result<TcpInfo> {
        self.sock.call(
            op::GETSOCKOPT,
            [opt::IPPROTO_TCP, opt::TCP_INFO, 0, 0, 0, 0],
        )?;
        let mut b = [0u8; tcp_info::LEN];
        self.sock.conn.mem.read_info(self.sock.slot, &mut b);
        let u = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let us = |o: usize| Duration::from_micros(u(o) as u64);
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let us64 = |o: usize| Duration::from_micros(u64_at(o));
        Ok(TcpInfo {
            state: u(tcp_info::STATE),
            rtt: us(tcp_info::RTT_US),
            rttvar: us(tcp_info::RTTVAR_US),
            min_rtt: us(tcp_info::MIN_RTT_US),
            rto: us(tcp_info::RTO_US),
            snd_mss: u(tcp_info::SND_MSS),
            rcv_mss: u(tcp_info::RCV_MSS),
            cwnd: u(tcp_info::CWND),
            ssthresh: u(tcp_info::SSTHRESH),
            bytes_in_flight: u(tcp_info::BYTES_IN_FLIGHT),
            total_retransmits: u(tcp_info::TOTAL_RETRANS),
            snd_wnd: u(tcp_info::SND_WND),
            rcv_wnd: u(tcp_info::RCV_WND),
            ca_state: b[tcp_info::CA_OPTIONS],
            options: b[tcp_info::CA_OPTIONS + 1],
            wscale: (
                b[tcp_info::CA_OPTIONS + 2] & 0xf,
                b[tcp_info::CA_OPTIONS + 2] >> 4,
            ),
            backoff: b[tcp_info::CA_OPTIONS + 3],
            sacked: u(tcp_info::SACKED),
            lost: u(tcp_info::LOST),
            retrans: u(tcp_info::RETRANS),
            reordering: u(tcp_info::REORDERING),
            reord_seen: u(tcp_info::REORD_SEEN),
            rcv_space: u(tcp_info::RCV_SPACE),
            last_data_recv: Duration::from_millis(u64::from(u(tcp_info::LAST_DATA_RECV_MS))),
            delivered: u(tcp_info::DELIVERED),
            busy_time: us64(tcp_info::BUSY_US),
            rwnd_limited: us64(tcp_info::RWND_LIMITED_US),
            sndbuf_limited: us64(tcp_info::SNDBUF_LIMITED_US),
            pacing_rate: u64_at(tcp_info::PACING_RATE),
            delivery_rate: u64_at(tcp_info::DELIVERY_RATE) & !tcp_info::APP_LIMITED,
            delivery_rate_app_limited: u64_at(tcp_info::DELIVERY_RATE) & tcp_info::APP_LIMITED != 0,
        })
    }

    /// Bytes that can be read now without blocking.
    pub fn available(&self) -> usize {
        self.sock.rx_ready()
    }

    /// Like `read`, but the bytes stay in the stream (`MSG_PEEK`, std's `peek`).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(buf, ReadMode::Peek)
    }

    fn read_inner(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(buf, ReadMode::Read)
    }

    /// A read as `splice` makes it (Linux's `tcp_read_sock`): it stops at the
    /// urgent mark, and there returns 0 at once while the mark stays.
    pub fn read_to_mark(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(buf, ReadMode::ToMark)
    }

    /// `SIOCATMARK`: the next byte to read is where the urgent byte was.
    pub fn at_urgent_mark(&self) -> bool {
        self.sock.rx_at_mark()
    }

    /// `recv(MSG_OOB)`: the urgent byte (TCP urgent data, not inline), once;
    /// `EINVAL` when there is none, as Linux says.
    pub fn recv_oob(&self) -> io::Result<u8> {
        self.sock
            .rx_take_oob()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn read_with(&self, buf: &mut [u8], mode: ReadMode) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if mode == ReadMode::ToMark && self.sock.rx_at_mark() {
            return Ok(0);
        }
        let deadline = self.sock.read_deadline();
        loop {
            // A server that is gone can neither have delivered nor deliver more.
            self.sock.conn.check_alive()?;
            // Flags before the ring: the server publishes the bytes before it sets
            // end-of-stream, so seeing the flag means seeing every byte.
            let f = self.sock.flags();
            let n = match mode {
                ReadMode::Peek => self.sock.rx_peek(buf)?,
                ReadMode::Read => self.sock.rx_read(buf, false)?,
                ReadMode::ToMark => self.sock.rx_read(buf, true)?,
            };
            if n > 0 || (mode == ReadMode::ToMark && self.sock.rx_at_mark()) {
                return Ok(n);
            }
            if f & FLAG_RX_EOF != 0 {
                return Ok(0);
            }
            if let Some(e) = self.sock.failure() {
                return Err(e);
            }
            if f & FLAG_HUP != 0 {
                return Ok(0);
            }
            let s = &self.sock;
            s.block(deadline, || {
                s.rx_ready() > 0 || s.flags() & (FLAG_RX_EOF | FLAG_ERROR | FLAG_HUP) != 0
            })?;
        }
    }

    /// `sendfile`: sends up to `max` bytes of the file `fd`, read at `file_off` (or
    /// from the file's position, which moves) straight into the send ring, with no
    /// buffer between. Blocks as a write does until some bytes went (or the
    /// non-blocking mode's `WouldBlock`); returns 0 at the end of the file.
    pub fn send_file(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        file_off: Option<i64>,
        max: usize,
    ) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        if self.send_bounded() {
            return crate::fdsend::send_file_bounded(self, fd, file_off, max);
        }
        self.send_with(|| self.sock.tx_write_from_fd(fd, file_off, max))
    }

    /// A send with Linux's `MSG_MORE` (`more`: more follows at once, so a partial
    /// segment may wait and no push ends it) or `MSG_EOR` (`eor`: it ends a record,
    /// whose last byte never shares a segment with what follows). The stack takes
    /// it at once, as Linux's `tcp_sendmsg` (see [`Self::send_bounded`]).
    pub fn send_flagged(&self, buf: &[u8], more: bool, eor: bool) -> io::Result<usize> {
        if !more && !eor {
            return self.write_inner(buf);
        }
        let flags = if more { SEND_MORE } else { 0 } | if eor { SEND_EOR } else { 0 };
        self.send_through_stack(buf.len(), flags, |tx| Ok(tx.push(buf)))
    }

    /// [`Self::send_flagged`] of the pieces `bufs` as one write (as Linux's
    /// `tcp_sendmsg` takes an iovec: one push point, at its end).
    pub fn send_vectored_flagged(
        &self,
        bufs: &[&[u8]],
        more: bool,
        eor: bool,
    ) -> io::Result<usize> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if want == 0 {
            return Ok(0);
        }
        let flags = if more { SEND_MORE } else { 0 } | if eor { SEND_EOR } else { 0 };
        self.send_through_stack(want, flags, |tx| Ok(crate::sock::push_pieces(tx, bufs)))
    }

    /// TCP_SYNCNT on a connection whose handshake may be under way.
    pub fn set_syn_count(&self, n: u8) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::IPPROTO_TCP, opt::TCP_SYNCNT, u64::from(n), 0, 0, 0],
            )
            .map(drop)
    }

    /// A writer waits for the handshake to finish (`on`), or no longer (Linux's
    /// `sk_write_pending`): the ACK of the SYN-ACK then waits to ride on its data.
    pub fn set_write_pending(&self, on: bool) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::SOL_USNET, opt::USNET_WRITE_PENDING, on as u64, 0, 0, 0],
            )
            .map(drop)
    }

    /// The program chose the send buffer's limit (`SO_SNDBUF`, `TCP_NOTSENT_LOWAT`,
    /// or the stack's `tcp_notsent_lowat`): a write is handed to the stack before it
    /// returns and takes what Linux's would, and the socket polls writable when the
    /// stack's buffer has room, not when the ring has. Otherwise the send ring
    /// buffers writes on its own (as a larger send buffer would).
    pub fn send_bounded(&self) -> bool {
        self.sock.flags() & FLAG_SNDBUF != 0
    }

    /// `writev`: the pieces `bufs` as one write (blocking as a write does until
    /// some bytes went); the server sees them together, so no segment boundary
    /// falls between pieces that Linux's one `tcp_sendmsg` would not make.
    pub fn write_pieces(&self, bufs: &[&[u8]]) -> io::Result<usize> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        if want == 0 {
            return Ok(0);
        }
        if self.send_bounded() {
            return self.send_vectored_flagged(bufs, false, false);
        }
        self.send_with(|| Ok(Some(self.sock.tx_write_vectored(bufs)?).filter(|&n| n > 0)))
    }

    fn write_inner(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.send_bounded() {
            return self.send_through_stack(buf.len(), 0, |tx| Ok(tx.push(buf)));
        }
        self.send_with(|| Ok(Some(self.sock.tx_write(buf)?).filter(|&n| n > 0)))
    }

    /// A send the stack takes before it returns (`op::SEND`): `fill` puts up to
    /// `want` bytes in the send ring; what the stack refuses is dropped and not
    /// counted. When it takes nothing, waits (as the socket's mode and timeout say)
    /// until the stack's buffer has room again, as Linux's `sk_stream_wait_memory`.
    /// Returns the bytes taken; `fill` may be called again after a wait.
    pub(crate) fn send_through_stack(
        &self,
        want: usize,
        flags: u64,
        mut fill: impl FnMut(&mut usnet_shm::ByteProducer) -> io::Result<usize>,
    ) -> io::Result<usize> {
        self.send_through_stack_put(want, flags, &mut fill)
            .map(|(_, taken)| taken)
    }

    /// [`Self::send_through_stack`], returning also the bytes `fill` put in the
    /// ring in the attempt that went (some may have been dropped).
    pub(crate) fn send_through_stack_put(
        &self,
        want: usize,
        flags: u64,
        fill: &mut dyn FnMut(&mut usnet_shm::ByteProducer) -> io::Result<usize>,
    ) -> io::Result<(usize, usize)> {
        let deadline = self.sock.write_deadline();
        let mut synced = false;
        loop {
            self.may_write()?;
            // Room measured first: it only grows meanwhile, so a fill that then puts
            // nothing found its source empty, not the ring full.
            let had_room = self.sock.tx_room() > 0;
            if !had_room && want > 0 && !synced {
                // Writes posted without waiting still fill the ring: an empty call
                // behind them returns once the server took them (requests are
                // served in order); the stack's room is not in question yet.
                synced = true;
                self.sock.tx_send(0, flags, |_| Ok(0))?;
                continue;
            }
            synced = false;
            let (put, taken) = self.sock.tx_send(want, flags, &mut *fill)?;
            if taken > 0 || (put == 0 && want > 0 && had_room) {
                // Taken; or the source had nothing (the end of a file).
                return Ok((put, taken));
            }
            let s = &self.sock;
            s.block(deadline, || {
                let f = s.flags();
                (f & FLAG_WRITABLE != 0 && s.tx_room() > 0) || s.hung_up()
            })?;
        }
    }

    /// What a send checks first: the server is there (bytes written into the ring
    /// of a server that is gone would be lost), the connection did not fail, and
    /// writing is not over.
    fn may_write(&self) -> io::Result<()> {
        self.sock.conn.check_alive()?;
        if let Some(e) = self.sock.failure() {
            return Err(e);
        }
        if self.sock.flags() & (FLAG_WR_SHUT | FLAG_HUP) != 0 {
            return Err(errno_err(usnet_session_abi::errno::EPIPE));
        }
        Ok(())
    }

    /// What every send does: fails as a write must (server gone, connection failed
    /// or shut), then tries `put`, which says None when the send ring is full; then
    /// it blocks (as the socket's mode and timeout say) until there is room.
    fn send_with(&self, mut put: impl FnMut() -> io::Result<Option<usize>>) -> io::Result<usize> {
        let deadline = self.sock.write_deadline();
        loop {
            self.may_write()?;
            if let Some(n) = put()? {
                return Ok(n);
            }
            let s = &self.sock;
            s.block(deadline, || s.tx_room() > 0 || s.hung_up())?;
        }
    }
}

impl Read for TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf)
    }
}

impl Read for &TcpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_inner(buf)
    }
}

impl Write for TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &TcpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_inner(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream")
            .field("slot", &self.sock.slot)
            .field("local", &self.local_addr().ok())
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}
