//! The application's UDP calls on a [`Stack`]: bind, connect, send, receive.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::socket::udp::Datagram;
use crate::socket::{DgramProto, Families, Owner, Socket, SocketHandle, SocketStats, UdpSocket};
use crate::tx::IpFields;
use crate::types::{UdpRecvInfo, UdpSendMeta};
use crate::{Stack, StackError, MAX_UDP_PAYLOAD};

/// One UDP socket in [`Stack::udp_sockets`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpEntry {
    pub handle: SocketHandle,
    /// UDP, or an ICMP echo socket (whose port is its identifier).
    pub proto: DgramProto,
    pub local: SocketAddr,
    pub remote: Option<SocketAddr>,
    pub owner: Owner,
    /// Payload bytes waiting in its receive queue.
    pub queued: usize,
    pub stats: SocketStats,
}

impl Stack {
    pub(crate) fn udp(&self, h: SocketHandle) -> Result<&UdpSocket, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => Ok(u),
            _ => Err(StackError::WrongType),
        }
    }

    pub(crate) fn udp_mut(&mut self, h: SocketHandle) -> Result<&mut UdpSocket, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => Ok(u),
            _ => Err(StackError::WrongType),
        }
    }

    /// Binds a UDP socket. Port 0 picks an ephemeral port; an unspecified address
    /// accepts datagrams to any local address of either family.
    pub fn udp_bind(&mut self, local: SocketAddr) -> Result<SocketHandle, StackError> {
        self.udp_bind_families(local, Families::Both)
    }

    /// [`Stack::udp_bind`] whose wildcard takes only `fam` (Linux's `AF_INET`
    /// `0.0.0.0`, or `AF_INET6` `::` with or without `IPV6_V6ONLY`: [`Families`]).
    pub fn udp_bind_families(
        &mut self,
        local: SocketAddr,
        fam: Families,
    ) -> Result<SocketHandle, StackError> {
        self.udp_bind_reuse(local, fam, false)
    }

    /// [`Stack::udp_bind_families`]; with `reuse` (SO_REUSEADDR or SO_REUSEPORT)
    /// the address may be shared with other sockets bound with `reuse`, as
    /// multicast receivers on one port do. A unicast datagram then goes to one of
    /// them (the last bound, or by its sender among those with
    /// [`Stack::udp_set_reuseport`]); a multicast one to every member.
    pub fn udp_bind_reuse(
        &mut self,
        local: SocketAddr,
        fam: Families,
        reuse: bool,
    ) -> Result<SocketHandle, StackError> {
        self.dgram_bind(DgramProto::Udp, local, fam, reuse)
    }

    /// SO_REUSEPORT on a socket bound with `reuse`: the unicast datagrams for
    /// its address are shared among such sockets by a hash of the sender's
    /// address and port, where otherwise the last bound takes them all.
    pub fn udp_set_reuseport(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        u.reuseport = on && u.reuse;
        Ok(())
    }

    /// [`Stack::udp_bind_reuse`] for a datagram socket of `proto`: a UDP socket,
    /// or an ICMP echo socket whose port is its echo identifier (0: a free one).
    /// The rest of the `udp_` calls serve both.
    pub fn dgram_bind(
        &mut self,
        proto: DgramProto,
        local: SocketAddr,
        fam: Families,
        reuse: bool,
    ) -> Result<SocketHandle, StackError> {
        // Linux's ping sockets are made with SO_REUSEADDR on: two may bind one
        // identifier (its replies go to the one bound last).
        let reuse = reuse || proto == DgramProto::Icmp;
        let ip = local.ip();
        // A multicast address may be bound (it then receives that group only), as
        // on Linux.
        if !ip.is_unspecified() && !ip.is_multicast() && !self.core.is_local_addr(ip) {
            return Err(StackError::AddrNotAvailable);
        }
        // A raw socket is of its address's family alone, and every one of them
        // shares its protocol's port.
        let (fam, port) = match (proto, ip) {
            (DgramProto::Raw, IpAddr::V4(_)) => (Families::V4, Some(crate::RAW_PORT_V4)),
            (DgramProto::Raw, IpAddr::V6(_)) => (Families::V6, Some(crate::RAW_PORT_V6)),
            _ => (fam, None),
        };
        let port = match port.unwrap_or(local.port()) {
            p if proto == DgramProto::Raw => p,
            0 => self
                .sockets
                .udp_ephemeral_port(proto, ip, fam, self.core.cfg.shard)
                .ok_or(StackError::AddrInUse)?,
            p => {
                if !self.sockets.udp_port_free(proto, local, fam, reuse) {
                    return Err(StackError::AddrInUse);
                }
                p
            }
        };
        let local = SocketAddr::new(ip, port);
        let recv_buffer = self.core.cfg.udp_recv_buffer;
        let u = UdpSocket::new(proto, local, fam, reuse, recv_buffer);
        let h = self.sockets.insert(Socket::Udp(u), Owner::LOCAL);
        self.sockets.link_udp(h.index);
        self.prio_consider(h);
        Ok(h)
    }

    /// Binds a raw socket ([`DgramProto::Raw`]) to another address of its family
    /// (unspecified: all of them): it then reads only what is sent there.
    /// `InvalidInput` for the other family or a connected socket,
    /// `AddrNotAvailable` for an address that is not ours.
    pub fn raw_rebind(&mut self, h: SocketHandle, ip: IpAddr) -> Result<(), StackError> {
        let ours = ip.is_unspecified() || ip.is_multicast() || self.core.is_local_addr(ip);
        let u = self.udp_mut(h)?;
        if u.proto != DgramProto::Raw {
            return Err(StackError::WrongType);
        }
        // (Linux's `raw_bind` refuses a connected socket too.)
        if ip.is_ipv4() != u.local.is_ipv4() || u.remote.is_some() {
            return Err(StackError::InvalidInput);
        }
        if !ours {
            return Err(StackError::AddrNotAvailable);
        }
        u.local.set_ip(ip);
        Ok(())
    }

    /// Every UDP socket, as `ss -u` lists them: address, owner, queue and counters
    /// (drop 2 is `stats.rx_queue_full`).
    pub fn udp_sockets(&self) -> Vec<UdpEntry> {
        self.sockets
            .live()
            .filter_map(|(handle, sock, slot)| match sock {
                Socket::Udp(u) => Some(UdpEntry {
                    handle,
                    proto: u.proto,
                    local: u.local,
                    remote: u.remote,
                    owner: slot.owner,
                    queued: u.rx_queued_bytes,
                    stats: u.stats,
                }),
                _ => None,
            })
            .collect()
    }

    /// Fixes the peer: `udp_send` goes there and only its datagrams are received.
    /// An echo socket's peer has no port (its replies come from port 0).
    pub fn udp_connect(&mut self, h: SocketHandle, remote: SocketAddr) -> Result<(), StackError> {
        let u = self.udp(h)?;
        let icmp = u.proto != DgramProto::Udp;
        if (remote.port() == 0 && !icmp) || remote.ip().is_unspecified() {
            return Err(StackError::InvalidInput);
        }
        if u.proto == DgramProto::Raw && remote.is_ipv4() != u.local.is_ipv4() {
            return Err(StackError::InvalidInput);
        }
        let (src, _) = self.core.route(remote.ip()).ok_or(StackError::NoRoute)?;
        let port = if icmp { 0 } else { remote.port() };
        let u = self.udp_mut(h)?;
        u.remote = Some(SocketAddr::new(remote.ip(), port));
        // A socket bound to the wildcard takes the route's source address, as
        // Linux's `ip4_datagram_connect`/`ip6_datagram_connect` do: `getsockname`
        // then names it, and the socket takes only datagrams sent to it.
        if u.local.ip().is_unspecified() && u.local.is_ipv4() == remote.is_ipv4() {
            u.local.set_ip(src);
            u.addr_from_connect = true;
        }
        Ok(())
    }

    /// Dissolves a connect (`connect` to `AF_UNSPEC`, Linux's `__udp_disconnect`):
    /// datagrams from anyone are received again, a send needs an address, and an
    /// address the connect chose goes back to the wildcard. The port stays (Linux
    /// gives back a port that bind did not choose; usnet keeps it, so a later send
    /// comes from the same one).
    pub fn udp_disconnect(&mut self, h: SocketHandle) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        u.remote = None;
        if std::mem::take(&mut u.addr_from_connect) {
            let any: IpAddr = if u.local.is_ipv4() {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                Ipv6Addr::UNSPECIFIED.into()
            };
            u.local.set_ip(any);
        }
        Ok(())
    }

    pub fn udp_local_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        Ok(self.udp(h)?.local)
    }

    pub fn udp_peer_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        self.udp(h)?.remote.ok_or(StackError::NotConnected)
    }

    /// A raw socket's filter (`ICMP_FILTER`, `ICMP6_FILTER`): the ICMP types it
    /// no longer receives. `WrongType` for any other socket.
    pub fn raw_set_icmp_filter(
        &mut self,
        h: SocketHandle,
        filter: crate::IcmpFilter,
    ) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        if u.proto != DgramProto::Raw {
            return Err(StackError::WrongType);
        }
        u.icmp_filter = filter;
        Ok(())
    }

    pub fn raw_icmp_filter(&self, h: SocketHandle) -> Result<crate::IcmpFilter, StackError> {
        let u = self.udp(h)?;
        if u.proto != DgramProto::Raw {
            return Err(StackError::WrongType);
        }
        Ok(u.icmp_filter)
    }

    /// Sets the receive buffer limit in bytes (SO_RCVBUF).
    pub fn udp_set_recv_buffer(&mut self, h: SocketHandle, bytes: usize) -> Result<(), StackError> {
        self.udp_mut(h)?.recv_buffer = bytes.max(2048);
        Ok(())
    }

    pub fn udp_send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize, StackError> {
        let remote = self.udp(h)?.remote.ok_or(StackError::NotConnected)?;
        self.udp_send_to(h, data, remote)
    }

    /// Sends one datagram. `WouldBlock` when the transmit queue is full (the device is
    /// behind); datagrams larger than the MTU are fragmented.
    pub fn udp_send_to(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        to: SocketAddr,
    ) -> Result<usize, StackError> {
        self.udp_send_msg(h, data, Some(to), &UdpSendMeta::default())
    }

    /// [`Self::udp_send_to`] (`to` None: the connected peer) with what this send
    /// asks of the IP header (`sendmsg`'s control messages): a source address,
    /// which must be one of ours (`InvalidInput`, Linux's EINVAL, when not; an
    /// unspecified one is no choice), a hop limit, a TOS byte.
    pub fn udp_send_msg(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        to: Option<SocketAddr>,
        meta: &UdpSendMeta,
    ) -> Result<usize, StackError> {
        let to = match to {
            Some(to) => to,
            None => self.udp(h)?.remote.ok_or(StackError::NotConnected)?,
        };
        let chosen = meta.src.filter(|a| !a.is_unspecified());
        if let Some(a) = chosen {
            if a.is_ipv4() != to.is_ipv4() || !self.core.is_local_addr(a) {
                return Err(StackError::InvalidInput);
            }
        }
        // An echo socket's message: the echo header and data.
        let proto = self.udp(h)?.proto;
        let echo = match proto {
            DgramProto::Udp | DgramProto::Raw => None,
            DgramProto::Icmp => Some(
                usnet_socket_api::echo::request(to.is_ipv4(), data)
                    .ok_or(StackError::InvalidInput)?,
            ),
        };
        let raw = proto == DgramProto::Raw;
        if raw && to.is_ipv4() != self.udp(h)?.local.is_ipv4() {
            return Err(StackError::InvalidInput);
        }
        let core = &mut self.core;
        if data.len() > MAX_UDP_PAYLOAD {
            core.counters.udp_tx_too_big += 1;
            return Err(StackError::MessageTooLong);
        }
        if (to.port() == 0 && proto == DgramProto::Udp) || to.ip().is_unspecified() {
            return Err(StackError::InvalidInput);
        }
        if core.tx.len() >= core.cfg.tx_queue_len {
            return Err(StackError::WouldBlock);
        }
        let u = match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => u,
            _ => return Err(StackError::WrongType),
        };
        let local = u.local;
        let Some((src, next_hop)) = core.route(to.ip()) else {
            core.counters.ip_tx_no_route += 1;
            return Err(StackError::NoRoute);
        };
        let src = if let Some(a) = chosen {
            a
        } else if local.ip().is_unspecified() || local.ip().is_ipv4() != to.is_ipv4() {
            src
        } else {
            local.ip()
        };
        let family = usize::from(to.is_ipv6());
        let tos = meta.tos.unwrap_or(u.hdr.tos[family]);
        // IPV6_MTU: IPv6 datagrams (of UDP and raw sockets alike) fragment at it.
        let frag_size = if to.is_ipv6() { u.hdr.frag_size_v6 } else { 0 };
        let fields = |ttl: u8| IpFields {
            ttl,
            tos,
            frag_size,
        };
        if let Some((seq, body)) = echo {
            let ttl = meta.hop_limit.or(u.hdr.ttl[family]).unwrap_or(core.cfg.ttl);
            let ip = fields(ttl);
            let ident = local.port();
            core.send_echo_request(src, to.ip(), next_hop, ident, seq, body, ip)?;
        } else if raw {
            let ttl = match to.ip() {
                IpAddr::V4(a) if a.is_multicast() => u.mc.ttl,
                IpAddr::V6(a) if a.is_multicast() => u.mc.hops,
                _ => u.hdr.ttl[family].unwrap_or(core.cfg.ttl),
            };
            let ttl = meta.hop_limit.unwrap_or(ttl);
            core.send_raw_icmp(src, to.ip(), next_hop, data, fields(ttl))?;
        } else if to.ip().is_multicast() {
            // IP_MULTICAST_IF names the source; TTL/hop limit and loopback are the
            // socket's multicast options; local members get a copy (as Linux, only
            // when the interface joined the group).
            let (src, ttl, looped) = match to.ip() {
                IpAddr::V4(_) => (u.mc.if4.map_or(src, IpAddr::V4), u.mc.ttl, u.mc.loop4),
                IpAddr::V6(_) => (src, u.mc.hops, u.mc.loop6),
            };
            let ttl = meta.hop_limit.unwrap_or(ttl);
            let looped = looped && core.mcast.is_member(to.ip());
            let ports = (local.port(), to.port());
            core.send_udp_mcast(src, to.ip(), ports, data, fields(ttl), looped)?;
        } else {
            let ttl = meta.hop_limit.or(u.hdr.ttl[family]).unwrap_or(core.cfg.ttl);
            let ports = (local.port(), to.port());
            core.send_udp(src, to.ip(), next_hop, ports, data, fields(ttl))?;
            core.counters.udp_tx += 1;
        }
        u.stats.tx_datagrams += 1;
        u.stats.tx_bytes += data.len() as u64;
        Ok(data.len())
    }

    /// Takes the oldest datagram off socket `h`'s queue (its buffers are the
    /// caller's now, no longer charged to the owner).
    fn udp_pop(&mut self, h: SocketHandle) -> Result<Datagram, StackError> {
        let u = match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Udp(u) => u,
            _ => return Err(StackError::WrongType),
        };
        let d = u.rxq.pop_front().ok_or(StackError::WouldBlock)?;
        u.rx_queued_bytes -= d.len;
        let bufs = self.core.pool.parts(&d.buf).count() as u32;
        self.sockets.charge_rx(h.index, bufs, false);
        Ok(d)
    }

    /// Takes the oldest datagram: copies its payload into `buf` (truncating, like
    /// `recvfrom` without MSG_TRUNC) and returns the bytes copied and the sender.
    pub fn udp_recv_from(
        &mut self,
        h: SocketHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddr), StackError> {
        let d = self.udp_pop(h)?;
        let pool = &mut self.core.pool;
        let n = if pool.is_single(&d.buf) {
            let src = pool.data(&d.buf);
            let n = src.len().min(buf.len());
            buf[..n].copy_from_slice(&src[..n]);
            n
        } else {
            pool.read_chain(&d.buf, 0, buf)
        };
        pool.free(d.buf);
        Ok((n, d.info.from))
    }

    /// Takes the oldest datagram and hands its payload to `sink` as it lies in its
    /// pool buffers (one slice per buffer): one copy into wherever `sink` puts it.
    /// Returns the payload length and what its IP header said (sender, the
    /// address it was sent to, TTL, TOS).
    pub fn udp_recv_with(
        &mut self,
        h: SocketHandle,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<(usize, UdpRecvInfo), StackError> {
        let d = self.udp_pop(h)?;
        let pool = &mut self.core.pool;
        for part in pool.parts(&d.buf) {
            sink(part);
        }
        pool.free(d.buf);
        Ok((d.len, d.info))
    }

    /// The address a reply to a datagram received with `info` comes from (IPv4's
    /// `ipi_spec_dst`, Linux's `fib_compute_spec_dst`): its destination when that
    /// is one of ours, else (broadcast, multicast) our address toward the sender.
    pub fn udp_reply_source(&self, info: &UdpRecvInfo) -> Option<IpAddr> {
        if self.core.is_local_addr(info.dst) {
            Some(info.dst)
        } else {
            self.core.source_for(info.from.ip())
        }
    }

    // ------------------------------------------------------------ multicast

    /// IP_ADD_MEMBERSHIP / IPV6_JOIN_GROUP: the socket joins `group` (the stack
    /// has one interface). The first socket to join makes the interface a member
    /// and sends an IGMPv2 or MLDv2 report. `InvalidInput` for a non-multicast
    /// address, `AddrInUse` when the socket is a member already (Linux's EINVAL
    /// and EADDRINUSE).
    pub fn udp_join_multicast(&mut self, h: SocketHandle, group: IpAddr) -> Result<(), StackError> {
        if !group.is_multicast() {
            return Err(StackError::InvalidInput);
        }
        let u = self.udp_mut(h)?;
        if u.mc.groups.contains(&group) {
            return Err(StackError::AddrInUse);
        }
        u.mc.groups.push(group);
        self.core.mcast_join(group);
        Ok(())
    }

    /// IP_DROP_MEMBERSHIP / IPV6_LEAVE_GROUP; the last socket to leave sends the
    /// leave. `AddrNotAvailable` when the socket is not a member.
    pub fn udp_leave_multicast(
        &mut self,
        h: SocketHandle,
        group: IpAddr,
    ) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        let Some(i) = u.mc.groups.iter().position(|g| *g == group) else {
            return Err(StackError::AddrNotAvailable);
        };
        u.mc.groups.swap_remove(i);
        self.core.mcast_leave(group);
        Ok(())
    }

    /// The groups `h` joined.
    pub fn udp_multicast_groups(&self, h: SocketHandle) -> Result<Vec<IpAddr>, StackError> {
        Ok(self.udp(h)?.mc.groups.clone())
    }

    /// IP_MULTICAST_TTL (`v4`) or IPV6_MULTICAST_HOPS: the hop limit of the
    /// multicast it sends (default 1).
    pub fn udp_set_multicast_ttl(
        &mut self,
        h: SocketHandle,
        v4: bool,
        ttl: u8,
    ) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        if v4 {
            u.mc.ttl = ttl;
        } else {
            u.mc.hops = ttl;
        }
        Ok(())
    }

    /// IP_TTL (`v4`) or IPV6_UNICAST_HOPS: the hop limit of the unicast it sends
    /// (None: the stack's, [`crate::StackConfig::ttl`]).
    pub fn udp_set_unicast_ttl(
        &mut self,
        h: SocketHandle,
        v4: bool,
        ttl: Option<u8>,
    ) -> Result<(), StackError> {
        self.udp_mut(h)?.hdr.ttl[usize::from(!v4)] = ttl;
        Ok(())
    }

    /// IP_TOS (`v4`) or IPV6_TCLASS: the TOS byte or traffic class of every
    /// datagram it sends, DSCP and ECN bits both (default 0).
    pub fn udp_set_tos(&mut self, h: SocketHandle, v4: bool, tos: u8) -> Result<(), StackError> {
        self.udp_mut(h)?.hdr.tos[usize::from(!v4)] = tos;
        Ok(())
    }

    /// IPV6_MTU: IPv6 datagrams larger than `bytes` leave in fragments of at
    /// most `bytes` (0: the link's MTU; Linux's `frag_size`, which refuses
    /// less than 1,280 before it gets here).
    pub fn udp_set_frag_size_v6(
        &mut self,
        h: SocketHandle,
        bytes: usize,
    ) -> Result<(), StackError> {
        if bytes != 0 && bytes < crate::tcp::icmp::MIN_PMTU_V6 {
            return Err(StackError::InvalidInput);
        }
        self.udp_mut(h)?.hdr.frag_size_v6 = bytes;
        Ok(())
    }

    /// IP_MULTICAST_LOOP (`v4`) or IPV6_MULTICAST_LOOP: whether local members
    /// (this socket included) get a copy of the multicast it sends (default on).
    pub fn udp_set_multicast_loop(
        &mut self,
        h: SocketHandle,
        v4: bool,
        on: bool,
    ) -> Result<(), StackError> {
        let u = self.udp_mut(h)?;
        if v4 {
            u.mc.loop4 = on;
        } else {
            u.mc.loop6 = on;
        }
        Ok(())
    }

    /// IP_MULTICAST_ALL / IPV6_MULTICAST_ALL: with it on (the default), a socket
    /// bound to the port receives every group the interface joined; off, only the
    /// groups it joined itself.
    pub fn udp_set_multicast_all(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        self.udp_mut(h)?.mc.all = on;
        Ok(())
    }

    /// IP_MULTICAST_IF: the source address of the IPv4 multicast it sends
    /// (`None` or 0.0.0.0: the routed one). The stack has one interface, so an
    /// address it does not have (a program naming the host's own interface)
    /// selects it too, with the routed source.
    pub fn udp_set_multicast_if(
        &mut self,
        h: SocketHandle,
        addr: Option<Ipv4Addr>,
    ) -> Result<(), StackError> {
        let addr = addr.filter(|a| self.core.is_local_addr(IpAddr::V4(*a)));
        self.udp_mut(h)?.mc.if4 = addr;
        Ok(())
    }

    /// The interface's multicast groups and how many sockets joined each.
    pub fn multicast_groups(&self) -> Vec<(IpAddr, u32)> {
        self.core
            .mcast
            .groups
            .iter()
            .map(|m| (m.group, m.refs))
            .collect()
    }

    /// Length of the next datagram, if one is queued.
    pub fn udp_peek_len(&self, h: SocketHandle) -> Result<Option<usize>, StackError> {
        Ok(self.udp(h)?.rxq.front().map(|d| d.len))
    }
}
