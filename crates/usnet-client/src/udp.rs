//! UDP over a stack server, shaped like `std::net::UdpSocket`. Datagrams travel through
//! the socket's rings as records (`usnet_session_abi::RecordHeader`: length, peer
//! address, our address and what the IP header said, then the payload padded to 8
//! bytes; a record never wraps).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::time::Duration;

use usnet_session_abi::{
    errno, hdr, op, opt, record_len, slot, RecordHeader, SockAddr, FLAG_BOUND, FLAG_ERROR,
    KIND_ICMP, KIND_RAW, KIND_UDP, RECORD_HEADER, RECORD_PAD,
};
use usnet_shm::{ByteConsumer, ByteProducer};

use crate::conn::errno_err;
use crate::sock::ClientSocket;
use crate::Client;

/// Largest UDP payload.
pub const MAX_PAYLOAD: usize = 65507;

pub struct UdpSocket {
    pub(crate) sock: ClientSocket,
    /// `IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER` (`[IPv4, IPv6]`) say DO, PROBE
    /// or INTERFACE: a datagram over the MTU fails with EMSGSIZE instead of
    /// leaving in fragments.
    strict_pmtu: [AtomicBool; 2],
    /// `IPV6_MTU`: IPv6 datagrams fragment at it (0: the link's MTU).
    frag_size_v6: AtomicU32,
}

/// What one send asks of its datagram's IP header (`sendmsg`'s control
/// messages); None: the socket's options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendMeta {
    /// The source address (`IP_PKTINFO`'s `ipi_spec_dst`, `IPV6_PKTINFO`'s
    /// address): one of the stack's.
    pub src: Option<IpAddr>,
    /// `IP_TTL`, `IPV6_HOPLIMIT`.
    pub hop_limit: Option<u8>,
    /// `IP_TOS`, `IPV6_TCLASS`.
    pub tos: Option<u8>,
}

/// A received datagram: what `recvmsg` reports of it, ancillary data included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes copied into the caller's buffer.
    pub len: usize,
    /// The datagram's whole length (more than `len` when the buffer was short).
    pub whole: usize,
    pub from: SocketAddr,
    /// The address it was sent to (`IP_PKTINFO`'s `ipi_addr`).
    pub local: Option<IpAddr>,
    /// The host's index of the interface it came in on (0: none).
    pub ifindex: u32,
    /// IPv4: the address a reply would come from (`ipi_spec_dst`).
    pub spec_dst: Ipv4Addr,
    /// TTL or hop limit it arrived with.
    pub hop_limit: u8,
    /// TOS byte or traffic class.
    pub tos: u8,
    /// When the server queued it for the socket (ns since the Unix epoch, on
    /// CLOCK_REALTIME; 0: unknown).
    pub stamp_ns: u64,
}

/// An ICMP error report from the socket's error queue (`recvmsg(MSG_ERRQUEUE)`
/// once `IP_RECVERR` / `IPV6_RECVERR` is on): Linux's `sock_extended_err` and
/// what comes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpErrorReport {
    /// `ee_errno`.
    pub errno: i32,
    /// `ee_origin` (`SO_EE_ORIGIN_ICMP` 2, `SO_EE_ORIGIN_ICMP6` 3), `ee_type`,
    /// `ee_code`, `ee_info`.
    pub origin: u8,
    pub icmp_type: u8,
    pub code: u8,
    pub info: u32,
    /// Who sent the ICMP message (`SO_EE_OFFENDER`; None: a local report).
    pub offender: Option<IpAddr>,
    /// Where the datagram it quotes was going (the message's name).
    pub dest: SocketAddr,
    /// The ICMP packet's TTL or hop limit and TOS byte.
    pub hop_limit: u8,
    pub tos: u8,
    /// Bytes of the quoted payload copied into the caller's buffer, and its
    /// whole length (more: the buffer, or the server's area, was short).
    pub len: usize,
    pub whole: usize,
}

/// Bytes from the ring position to the end of the ring.
fn to_end(pos: u64, size: usize) -> usize {
    size - (pos as usize & (size - 1))
}

impl UdpSocket {
    pub(crate) fn wrap(sock: ClientSocket) -> UdpSocket {
        UdpSocket {
            sock,
            strict_pmtu: Default::default(),
            frag_size_v6: AtomicU32::new(0),
        }
    }

    /// Its slot in the session (what a fork's claim maps).
    #[doc(hidden)]
    pub fn fork_slot(&self) -> u32 {
        self.sock.slot
    }

    /// The same socket in a forked child's session (`Client::claim` put it at
    /// `slot`), blocking mode and timeouts kept; in a real child, [`Self::disown`]
    /// the parent's copy.
    #[doc(hidden)]
    pub fn forked(&self, client: &Client, slot: u32) -> io::Result<UdpSocket> {
        Ok(UdpSocket::wrap(self.sock.forked(&client.conn, slot)?))
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
    pub fn inherited(client: &Client, slot: u32) -> io::Result<UdpSocket> {
        Ok(UdpSocket::wrap(ClientSocket::from_slot(
            &client.conn,
            slot,
        )?))
    }

    /// Never closes or posts again (a forked child's copy that has no slot of its own).
    #[doc(hidden)]
    pub fn disown(&self) {
        self.sock.disown();
    }

    pub fn bind(client: &Client, addr: SocketAddr) -> io::Result<UdpSocket> {
        let sock = ClientSocket::open(&client.conn, KIND_UDP)?;
        let a = SockAddr::from_std(addr).to_args();
        sock.call(op::BIND, [a[0], a[1], a[2], a[3], 0, 0])?;
        Ok(UdpSocket::wrap(sock))
    }

    /// Whether it is an ICMP echo socket ([`crate::SocketKind::Icmp`]): its
    /// datagrams are whole echo messages and its port is its identifier.
    pub fn is_echo(&self) -> bool {
        u64::from(self.sock.word(slot::KIND)) == KIND_ICMP
    }

    /// A raw socket's filter (`ICMP_FILTER`: word 0 for IPv4; `ICMP6_FILTER`):
    /// a set bit blocks its ICMP type.
    pub fn set_icmp_filter(&self, v6: bool, filter: &[u32; 8]) -> io::Result<()> {
        let mut a = [0u64; 6];
        if v6 {
            a[0] = opt::IPPROTO_ICMPV6;
            a[1] = opt::ICMP6_FILTER;
            for (i, w) in filter.chunks(2).enumerate() {
                a[2 + i] = u64::from(w[0]) | u64::from(w[1]) << 32;
            }
        } else {
            a[0] = opt::SOL_RAW;
            a[1] = opt::ICMP_FILTER;
            a[2] = u64::from(filter[0]);
        }
        self.sock.call(op::SETSOCKOPT, a).map(|_| ())
    }

    /// Whether it is a raw ICMP socket ([`crate::SocketKind::Raw`]): its
    /// datagrams are whole ICMP messages, an IPv4 one received after its IP
    /// header.
    pub fn is_raw(&self) -> bool {
        u64::from(self.sock.word(slot::KIND)) == KIND_RAW
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::LOCAL)
    }

    /// Binds a socket made unbound ([`crate::Socket::into_udp`]).
    pub fn bind_to(&self, addr: SocketAddr) -> io::Result<()> {
        self.bind_families(addr, 0)
    }

    /// [`UdpSocket::bind_to`] whose wildcard address takes only `families`
    /// (`usnet_session_abi::FAM_V4` | `FAM_V6`; 0: both).
    pub fn bind_families(&self, addr: SocketAddr, families: u64) -> io::Result<()> {
        self.bind_reuse(addr, families, false)
    }

    /// [`UdpSocket::bind_families`]; with `reuse` (SO_REUSEADDR or SO_REUSEPORT
    /// set) the address may be shared with other sockets bound with it, as
    /// multicast receivers on one port are.
    pub fn bind_reuse(&self, addr: SocketAddr, families: u64, reuse: bool) -> io::Result<()> {
        self.bind_reuseport(addr, families, reuse, false)
    }

    /// [`UdpSocket::bind_reuse`] that also says whether SO_REUSEPORT was set
    /// (`reuseport`): unicast datagrams to the address are then shared among
    /// the sockets that set it, by a hash of the sender (a DNS server's socket
    /// per thread), rather than all going to the last bound.
    pub fn bind_reuseport(
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

    /// A UDP option the server keeps for the stack socket (SETSOCKOPT).
    fn udp_opt(&self, level: u64, name: u64, args: [u64; 3]) -> io::Result<()> {
        self.sock
            .call(op::SETSOCKOPT, [level, name, args[0], args[1], args[2], 0])
            .map(|_| ())
    }

    /// IP_ADD_MEMBERSHIP (as `std::net::UdpSocket::join_multicast_v4`): the
    /// stack joins `group` (IGMPv2 report on the first join) and delivers its
    /// datagrams to this socket. `interface` is ignored (one interface).
    pub fn join_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        let g = u64::from(u32::from_be_bytes(group.octets()));
        let i = u64::from(u32::from_be_bytes(interface.octets()));
        self.udp_opt(opt::IPPROTO_IP, opt::IP_ADD_MEMBERSHIP, [g, i, 0])
    }

    /// IP_DROP_MEMBERSHIP.
    pub fn leave_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        let g = u64::from(u32::from_be_bytes(group.octets()));
        let i = u64::from(u32::from_be_bytes(interface.octets()));
        self.udp_opt(opt::IPPROTO_IP, opt::IP_DROP_MEMBERSHIP, [g, i, 0])
    }

    /// IPV6_JOIN_GROUP (MLDv2 report on the first join); `interface` ignored.
    pub fn join_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        let g = u128::from_be_bytes(group.octets());
        let args = [(g >> 64) as u64, g as u64, u64::from(interface)];
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_ADD_MEMBERSHIP, args)
    }

    /// IPV6_LEAVE_GROUP.
    pub fn leave_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        let g = u128::from_be_bytes(group.octets());
        let args = [(g >> 64) as u64, g as u64, u64::from(interface)];
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_DROP_MEMBERSHIP, args)
    }

    /// IP_MULTICAST_TTL (default 1).
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        let v = u64::from(ttl.min(255));
        self.udp_opt(opt::IPPROTO_IP, opt::IP_MULTICAST_TTL, [v, 0, 0])
    }

    /// IPV6_MULTICAST_HOPS (default 1).
    pub fn set_multicast_hops_v6(&self, hops: u32) -> io::Result<()> {
        let v = u64::from(hops.min(255));
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_MULTICAST_HOPS, [v, 0, 0])
    }

    /// IP_TTL: the TTL of the IPv4 unicast it sends (None: the stack's).
    pub fn set_ttl(&self, ttl: Option<u8>) -> io::Result<()> {
        let v = ttl.map_or(u64::MAX, u64::from);
        self.udp_opt(opt::IPPROTO_IP, opt::IP_TTL, [v, 0, 0])
    }

    /// IPV6_UNICAST_HOPS: the hop limit of the IPv6 unicast it sends (None: the
    /// stack's).
    pub fn set_unicast_hops_v6(&self, hops: Option<u8>) -> io::Result<()> {
        let v = hops.map_or(u64::MAX, u64::from);
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_UNICAST_HOPS, [v, 0, 0])
    }

    /// IP_TOS: the whole TOS byte (DSCP and ECN) of the IPv4 datagrams it sends.
    pub fn set_tos(&self, tos: u8) -> io::Result<()> {
        self.udp_opt(opt::IPPROTO_IP, opt::IP_TOS, [u64::from(tos), 0, 0])
    }

    /// IPV6_MTU: IPv6 datagrams larger than `bytes` leave in fragments of at
    /// most `bytes`, and under a strict MTU discovery mode are EMSGSIZE (0: the
    /// link's MTU; else at least 1,280, EINVAL otherwise).
    pub fn set_frag_size_v6(&self, bytes: u32) -> io::Result<()> {
        if bytes != 0 && bytes < 1280 {
            return Err(errno_err(errno::EINVAL));
        }
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_MTU, [u64::from(bytes), 0, 0])?;
        self.frag_size_v6.store(bytes, Relaxed);
        Ok(())
    }

    /// IPV6_TCLASS: the traffic class of the IPv6 datagrams it sends.
    pub fn set_tclass_v6(&self, tclass: u8) -> io::Result<()> {
        let v = u64::from(tclass);
        self.udp_opt(opt::IPPROTO_IPV6, opt::IPV6_TCLASS, [v, 0, 0])
    }

    /// IP_MULTICAST_LOOP (default on).
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.udp_opt(opt::IPPROTO_IP, opt::IP_MULTICAST_LOOP, [on as u64, 0, 0])
    }

    /// IPV6_MULTICAST_LOOP (default on).
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        self.udp_opt(
            opt::IPPROTO_IPV6,
            opt::IPV6_MULTICAST_LOOP,
            [on as u64, 0, 0],
        )
    }

    /// IP_MULTICAST_IF: the source address of IPv4 multicast (0.0.0.0: the
    /// routed one); `EADDRNOTAVAIL` for an address the stack does not have.
    pub fn set_multicast_if_v4(&self, addr: &Ipv4Addr) -> io::Result<()> {
        let a = u64::from(u32::from_be_bytes(addr.octets()));
        self.udp_opt(opt::IPPROTO_IP, opt::IP_MULTICAST_IF, [a, 0, 0])
    }

    /// IP_MULTICAST_ALL (default on: every group the interface joined reaches a
    /// socket bound to the port; off: only the socket's own groups).
    pub fn set_multicast_all(&self, on: bool) -> io::Result<()> {
        self.udp_opt(opt::IPPROTO_IP, opt::IP_MULTICAST_ALL, [on as u64, 0, 0])
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.addr(slot::PEER)
    }

    /// Fixes the peer: `send` goes there and only its datagrams are received.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        let a = SockAddr::from_std(addr).to_args();
        self.sock
            .call(op::CONNECT, [a[0], a[1], a[2], a[3], 0, 0])
            .map(|_| ())
    }

    /// Dissolves a `connect` (Linux's `connect` to `AF_UNSPEC`): datagrams from
    /// anyone are received again, `send` needs an address, and an address the
    /// connect chose goes back to the wildcard (the port stays).
    pub fn disconnect(&self) -> io::Result<()> {
        let a = SockAddr::default().to_args();
        self.sock
            .call(op::CONNECT, [a[0], a[1], a[2], a[3], 0, 0])
            .map(|_| ())
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

    /// The stack's receive queue limit for this socket (SO_RCVBUF).
    /// IP_RECVERR (`v6` false) or IPV6_RECVERR: ICMP errors of that family
    /// wait on the error queue ([`UdpSocket::recv_error_report`]) and each
    /// becomes the pending error. Off (the default), only a hard error on a
    /// connected socket is reported, as the next call's error.
    pub fn set_recverr(&self, v6: bool, on: bool) -> io::Result<()> {
        let (level, name) = if v6 {
            (opt::IPPROTO_IPV6, opt::IPV6_RECVERR)
        } else {
            (opt::IPPROTO_IP, opt::IP_RECVERR)
        };
        self.udp_opt(level, name, [on as u64, 0, 0])
    }

    /// `IP_MTU_DISCOVER` (`v6` false) or `IPV6_MTU_DISCOVER` as Linux numbers
    /// its modes: with DO (2), PROBE (3) or INTERFACE (4) a datagram that would
    /// not fit the link's MTU fails with EMSGSIZE (and, with IP_RECVERR, leaves
    /// a local report carrying the MTU); otherwise it leaves in fragments.
    pub fn set_mtu_discover(&self, v6: bool, mode: i32) {
        self.strict_pmtu[usize::from(v6)].store(matches!(mode, 2..=4), Relaxed);
    }

    /// The MTU of the link the stack sends on (`IP_MTU`; 0: not known).
    pub fn link_mtu(&self) -> u32 {
        self.sock.conn.mem.word(hdr::LINK_MTU).load(Acquire)
    }

    /// Linux's `ip_append_data` check under a strict MTU discovery mode: a
    /// datagram of `len` bytes to `to` that would not fit the MTU is EMSGSIZE,
    /// after a local report for the error queue.
    fn over_mtu(&self, len: usize, to: SocketAddr) -> io::Result<()> {
        let v6 = !to.is_ipv4();
        let mtu = match (
            self.link_mtu() as usize,
            self.frag_size_v6.load(Relaxed) as usize,
        ) {
            (link, frag) if v6 && frag != 0 && link != 0 => link.min(frag),
            (link, _) => link,
        };
        // (IPv4's UDP refuses more than 64 KiB before it looks at the MTU.)
        if !self.strict_pmtu[usize::from(v6)].load(Relaxed) || mtu == 0 || !v6 && len > 0xffff {
            return Ok(());
        }
        // An echo or raw socket's message carries its own ICMP header.
        let l4 = if self.is_echo() || self.is_raw() {
            0
        } else {
            8
        };
        let ip = if v6 { 40 } else { 20 };
        if ip + l4 + len <= mtu {
            return Ok(());
        }
        let a = SockAddr::from_std(to).to_args();
        let emsgsize = errno::EMSGSIZE as u64;
        self.sock.call(
            op::LOCAL_ERROR,
            [a[0], a[1], a[2], a[3], emsgsize, mtu as u64],
        )?;
        Err(errno_err(errno::EMSGSIZE))
    }

    /// Takes the pending error (`SO_ERROR`): what an ICMP error left for the
    /// next call, which fails with it once.
    pub fn take_error(&self) -> Option<io::Error> {
        self.sock.take_error_word()
    }

    /// The oldest report on the error queue, its quoted payload into `buf`
    /// (`recvmsg(MSG_ERRQUEUE)`; never waits: `WouldBlock` when none is there).
    pub fn recv_error_report(&self, buf: &mut [u8]) -> io::Result<IcmpErrorReport> {
        // Under the send lock: the area holds one report at a time.
        self.sock.with_tx(|_| {
            self.sock.call(op::ERRQUEUE, [0; 6])?;
            let r = self.sock.conn.mem.read_err_report(self.sock.slot, buf);
            let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad error report");
            Ok(IcmpErrorReport {
                errno: r.errno as i32,
                origin: r.origin,
                icmp_type: r.icmp_type,
                code: r.code,
                info: r.info,
                offender: r.offender.to_std().map(|a| a.ip()),
                dest: r.dest.to_std().ok_or_else(bad)?,
                hop_limit: r.hop_limit,
                tos: r.tos,
                len: usize::from(r.len).min(buf.len()),
                whole: r.whole as usize,
            })
        })
    }

    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        self.sock
            .call(
                op::SETSOCKOPT,
                [opt::SOL_SOCKET, opt::SO_RCVBUF, bytes as u64, 0, 0, 0],
            )
            .map(|_| ())
    }

    /// Priority-aware receive (docs/priority.md): ranks this socket with
    /// `priority` (the scale of `-nice`) instead of its process's priority; `None`
    /// takes the mark back. Above the process's own priority it needs CAP_SYS_NICE
    /// or RLIMIT_NICE (`EPERM` otherwise).
    pub fn set_rx_priority(&self, priority: Option<i32>) -> io::Result<()> {
        set_rx_priority(&self.sock, priority)
    }

    pub fn send_to(&self, data: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.send_record(data, Some(to), &SendMeta::default())
    }

    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.peer_addr()?;
        self.send_record(data, None, &SendMeta::default())
    }

    /// One datagram to `to` (None: the connected peer) with what `meta` asks
    /// of its IP header. The stack checks a chosen source when it sends: one
    /// that is not among its addresses loses the datagram (counted), where
    /// Linux's `sendmsg` fails with EINVAL.
    pub fn send_msg(
        &self,
        data: &[u8],
        to: Option<SocketAddr>,
        meta: &SendMeta,
    ) -> io::Result<usize> {
        if to.is_none() {
            self.peer_addr()?;
        }
        self.send_record(data, to, meta)
    }

    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_with(buf, true).map(|m| (m.len, m.from))
    }

    /// The next datagram with all that is known of it (left queued with
    /// `peek`).
    pub fn recv_msg(&self, buf: &mut [u8], peek: bool) -> io::Result<RecvMeta> {
        self.recv_with(buf, !peek)
    }

    /// Like `recv_from`, but the datagram stays queued (`MSG_PEEK`, std's
    /// `peek_from`).
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_with(buf, false).map(|m| (m.len, m.from))
    }

    /// The next datagram (left queued with `peek`): the bytes copied into `buf`,
    /// the datagram's whole length (more than copied when `buf` is short: what
    /// `MSG_TRUNC` reports) and the sender.
    pub fn recv_from_whole(
        &self,
        buf: &mut [u8],
        peek: bool,
    ) -> io::Result<(usize, usize, SocketAddr)> {
        self.recv_with(buf, !peek).map(|m| (m.len, m.whole, m.from))
    }

    fn recv_with(&self, buf: &mut [u8], consume: bool) -> io::Result<RecvMeta> {
        let deadline = self.sock.read_deadline();
        loop {
            self.sock.conn.check_alive()?;
            if let Some(e) = self.take_error() {
                return Err(e);
            }
            if let Some(r) = self
                .sock
                .with_rx(|rx| take_record(rx, buf, consume))
                .flatten()
            {
                return r;
            }
            if self.sock.flags() & FLAG_ERROR != 0 {
                if let Some(e) = self.sock.failure() {
                    return Err(e);
                }
            }
            // An ICMP error that becomes pending ends the wait too (Linux's
            // `sk_error_report` wakes the socket's readers).
            let s = &self.sock;
            s.block(deadline, || s.rx_ready() > 0 || s.word(slot::ERROR) != 0)?;
        }
    }

    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    /// A datagram waits to be received.
    pub fn readable(&self) -> bool {
        self.sock.rx_ready() > 0
    }

    /// Linux's autobind (`inet_send_prepare`): an unbound socket's first send
    /// binds it to an ephemeral port (an echo socket: identifier) at once, so
    /// `getsockname` names it as soon as the send returns. (A connected socket is
    /// bound by its connect.)
    fn autobind(&self, to: Option<SocketAddr>) -> io::Result<()> {
        let bound = || self.sock.flags() & FLAG_BOUND != 0;
        let Some(to) = to.filter(|_| !bound()) else {
            return Ok(());
        };
        let any = if to.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        match self.bind_to(any) {
            // Another thread's send bound it first.
            Err(_) if bound() => Ok(()),
            r => r,
        }
    }

    fn send_record(
        &self,
        data: &[u8],
        to: Option<SocketAddr>,
        meta: &SendMeta,
    ) -> io::Result<usize> {
        // As Linux's `sock_alloc_send_skb`: a pending ICMP error fails the send
        // of a UDP or echo socket. A raw socket's send allocates without that
        // check (`ip_append_data` with no transport header), so the error stays
        // for its next receive: traceroute -I's probe that follows a time
        // exceeded still goes.
        if !self.is_raw() {
            if let Some(e) = self.take_error() {
                return Err(e);
            }
        }
        self.autobind(to)?;
        let dest = match to {
            Some(a) => a,
            None => self.peer_addr()?,
        };
        if self.is_echo() && usnet_socket_api::echo::request(dest.is_ipv4(), data).is_none() {
            return Err(errno_err(errno::EINVAL));
        }
        // A raw ICMPv6 message must have room for the checksum the stack writes
        // (Linux's `rawv6_push_pending_frames`).
        if self.is_raw() && !dest.is_ipv4() && data.len() < 4 {
            return Err(errno_err(errno::EINVAL));
        }
        self.over_mtu(data.len(), dest)?;
        if data.len() > MAX_PAYLOAD {
            return Err(errno_err(errno::EMSGSIZE));
        }
        let hdr = RecordHeader {
            len: data.len() as u32,
            peer: to.map(SockAddr::from_std).unwrap_or_default(),
            local: meta.src,
            hop_limit: meta.hop_limit,
            tos: meta.tos,
            ..Default::default()
        };
        let deadline = self.sock.write_deadline();
        loop {
            self.sock.conn.check_alive()?;
            let sent = self.sock.with_tx(|tx| put_record(tx, data, &hdr))?;
            if sent {
                return Ok(data.len());
            }
            let s = &self.sock;
            let room = record_len(data.len()) * 2;
            s.block(deadline, || s.tx_room() >= room || s.hung_up())?;
        }
    }
}

/// Writes one record (a skip to the ring's start first if it would not fit before the
/// end). Returns false, writing nothing, when the ring has no room for it.
fn put_record(tx: &mut ByteProducer, data: &[u8], hdr: &RecordHeader) -> io::Result<bool> {
    let free = tx
        .free()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "socket ring corrupt"))?;
    let rec = record_len(data.len());
    let end = to_end(tx.position(), tx.size());
    let need = if rec > end { end + rec } else { rec };
    if need > free {
        return Ok(false);
    }
    if rec > end {
        let mut tail = vec![0u8; end];
        if end >= RECORD_HEADER {
            tail[0..4].copy_from_slice(&RECORD_PAD.to_le_bytes());
        }
        tx.push(&tail);
    }
    tx.push(&hdr.to_bytes());
    tx.push(data);
    let pad = rec - RECORD_HEADER - data.len();
    if pad > 0 {
        tx.push(&[0u8; 8][..pad]);
    }
    Ok(true)
}

/// Takes the next record, if one is complete: its payload into `buf` (truncated like
/// `recvfrom`) and what its header says; `consume`: it leaves the ring (else it
/// stays, for `MSG_PEEK`).
fn take_record(
    rx: &mut ByteConsumer,
    buf: &mut [u8],
    consume: bool,
) -> Option<io::Result<RecvMeta>> {
    let bad = || {
        Some(Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "socket ring corrupt",
        )))
    };
    loop {
        let avail = match rx.available() {
            Ok(n) => n,
            Err(_) => return bad(),
        };
        let end = to_end(rx.position(), rx.size());
        if end < RECORD_HEADER {
            if avail < end {
                return None;
            }
            rx.skip(end);
            continue;
        }
        if avail < RECORD_HEADER {
            return None;
        }
        let mut h = [0u8; RECORD_HEADER];
        rx.peek(0, &mut h);
        let hdr = RecordHeader::from_bytes(&h);
        let len = hdr.len;
        if len == RECORD_PAD {
            if avail < end {
                return None;
            }
            rx.skip(end);
            continue;
        }
        let rec = record_len(len as usize);
        if len as usize > MAX_PAYLOAD || rec > end {
            rx.skip(avail);
            return bad();
        }
        if avail < rec {
            return None;
        }
        let n = (len as usize).min(buf.len());
        rx.peek(RECORD_HEADER, &mut buf[..n]);
        if consume {
            rx.skip(rec);
        }
        return Some(match hdr.peer.to_std() {
            Some(from) => Ok(RecvMeta {
                len: n,
                whole: len as usize,
                from,
                local: hdr.local,
                ifindex: hdr.ifindex,
                spec_dst: hdr.spec_dst,
                hop_limit: hdr.hop_limit.unwrap_or(0),
                tos: hdr.tos.unwrap_or(0),
                stamp_ns: hdr.stamp_ns,
            }),
            None => Err(io::Error::new(io::ErrorKind::InvalidData, "bad sender")),
        });
    }
}

/// The `USNET_RX_PRIORITY` option on a UDP socket or a listener.
pub(crate) fn set_rx_priority(sock: &ClientSocket, priority: Option<i32>) -> io::Result<()> {
    let v = priority.map_or(opt::RX_PRIORITY_NONE, |p| i64::from(p) as u64);
    sock.call(
        op::SETSOCKOPT,
        [opt::SOL_USNET, opt::USNET_RX_PRIORITY, v, 0, 0, 0],
    )
    .map(|_| ())
}
