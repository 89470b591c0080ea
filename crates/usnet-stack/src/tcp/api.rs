//! The application's TCP calls on a [`Stack`]: listen, accept, connect, send,
//! receive, shutdown, close, options and inspection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use usnet_tcp::{
    CcAlgorithm, Connection, Keepalive, LentBytes, Listener, RecvSink, State, TcpConfig, TcpInfo,
    TcpStats, Wake,
};
use usnet_wire::FastOpen;

use super::readiness_of;
use crate::socket::tcp::IpFamily;
use crate::socket::{
    Families, Owner, Readiness, Socket, SocketHandle, SocketStats, TcpConnSock, TcpIpOpts,
    TcpListenSock, EPHEMERAL_SPAN,
};
use crate::{Stack, StackError};
use usnet_pool::Lender;

/// One connection as `tcp_connections` lists it (like a line of `ss -ti`).
#[derive(Debug, Clone)]
pub struct TcpConnEntry {
    pub handle: SocketHandle,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Closed by the application, finishing in the background.
    pub orphan: bool,
    pub owner: Owner,
    pub info: TcpInfo,
}

/// A listening socket's settings, copied out of one shard to open the same
/// listener in another ([`Stack::tcp_listener_copy`]).
#[derive(Debug)]
pub struct TcpListenCopy {
    local: SocketAddr,
    fam: Families,
    v4: Option<usnet_tcp::Listener<SocketHandle>>,
    v6: Option<usnet_tcp::Listener<SocketHandle>>,
    ip: [TcpIpOpts; 2],
    reuseport: bool,
}

impl TcpListenCopy {
    pub fn local(&self) -> SocketAddr {
        self.local
    }
}

/// One listener as `tcp_listeners` lists it.
#[derive(Debug, Clone, Copy)]
pub struct TcpListenEntry {
    pub handle: SocketHandle,
    pub local: SocketAddr,
    /// The families a wildcard `local` takes.
    pub families: Families,
    /// SO_REUSEPORT: a member of a group that shares the address.
    pub reuseport: bool,
    pub owner: Owner,
    pub syn_queue: usize,
    pub accept_queue: usize,
}

impl Stack {
    fn conn_sock(&self, h: SocketHandle) -> Result<&TcpConnSock, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) if !s.orphan => Ok(s),
            Socket::TcpConn(_) => Err(StackError::InvalidHandle),
            _ => Err(StackError::WrongType),
        }
    }

    pub(crate) fn conn_sock_mut(
        &mut self,
        h: SocketHandle,
    ) -> Result<&mut TcpConnSock, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) if !s.orphan => Ok(s),
            Socket::TcpConn(_) => Err(StackError::InvalidHandle),
            _ => Err(StackError::WrongType),
        }
    }

    pub(crate) fn conn(&self, h: SocketHandle) -> Result<&Connection, StackError> {
        Ok(&self.conn_sock(h)?.conn)
    }

    pub(crate) fn conn_mut(&mut self, h: SocketHandle) -> Result<&mut Connection, StackError> {
        Ok(&mut self.conn_sock_mut(h)?.conn)
    }

    /// Runs `f` on a connection, then its output.
    fn with_conn<R>(
        &mut self,
        h: SocketHandle,
        f: impl FnOnce(&mut Connection) -> R,
    ) -> Result<R, StackError> {
        let r = f(self.conn_mut(h)?);
        self.tcp_settle(h.index, Wake::default());
        Ok(r)
    }

    /// The configuration a new connection or listener starts from: the caller's,
    /// with the stack's secret.
    fn tcp_prepare(&self, mut cfg: TcpConfig) -> TcpConfig {
        cfg.secret = self.core.tcp_secret;
        cfg
    }

    fn tcp_ephemeral(&mut self, local_ip: std::net::IpAddr, remote: SocketAddr) -> Option<u16> {
        for _ in 0..EPHEMERAL_SPAN {
            let p = crate::socket::next_ephemeral(&mut self.sockets.tcp.next_ephemeral);
            if !self.core.cfg.shard.owns_ephemeral(p) {
                continue;
            }
            let local = SocketAddr::new(local_ip, p);
            if self.sockets.tcp.listen.contains_key(&p) || self.sockets.tcp.bound.contains_key(&p) {
                continue;
            }
            if remote.port() == 0 || self.tcp_tuple_free(local, remote) {
                return Some(p);
            }
        }
        None
    }

    /// Whether `(local, remote)` may start a new connection: unused, or held by a
    /// closed-by-the-application connection in TIME-WAIT that negotiated timestamps
    /// (then PAWS on both sides tells the incarnations apart, as Linux's
    /// `tcp_tw_reuse`); such a connection is freed now.
    fn tcp_tuple_free(&mut self, local: SocketAddr, remote: SocketAddr) -> bool {
        let Some(&i) = self.sockets.tcp.conns.get(&(local, remote)) else {
            return true;
        };
        let reusable = self.sockets.conn_at(i).is_some_and(|s| {
            s.orphan && s.conn.state() == State::TimeWait && s.conn.info().timestamps
        });
        if reusable {
            self.core.counters.tcp_time_wait_reused += 1;
            self.tcp_reap(i);
        }
        reusable
    }

    /// `bind` of a TCP socket that neither listens nor connects yet (Linux's bind
    /// hash): holds `addr`'s port for families `fam` (port 0 picks an ephemeral
    /// one) against other binds and listeners, until [`Stack::tcp_unbind`] (the
    /// socket listens, connects or closes) or its owner closes
    /// ([`Stack::close_owner`]). `AddrInUse` when a listener or another binding
    /// shares an address and a family on the port (two bindings may share it when
    /// both set `reuse`, SO_REUSEADDR). With `reuseport` (SO_REUSEPORT) it may
    /// share the port with SO_REUSEPORT listeners too. Returns the address with
    /// its port and the binding's id.
    pub fn tcp_bind(
        &mut self,
        addr: SocketAddr,
        fam: Families,
        (reuse, reuseport): (bool, bool),
        owner: Owner,
    ) -> Result<(SocketAddr, u64), StackError> {
        let ip = addr.ip();
        let reuse = reuse || reuseport;
        let port = self.tcp_claim_port(addr, fam, reuseport)?;
        let clash = self.sockets.tcp.bound.get(&port).is_some_and(|list| {
            list.iter()
                .any(|b| !(reuse && b.reuse) && Families::overlap(b.ip, b.fam, ip, fam))
        });
        if clash {
            return Err(StackError::AddrInUse);
        }
        let t = &mut self.sockets.tcp;
        t.next_binding += 1;
        let id = t.next_binding;
        t.bound
            .entry(port)
            .or_default()
            .push(crate::socket::tcp::TcpBinding {
                id,
                ip,
                fam,
                reuse,
                owner,
            });
        Ok((SocketAddr::new(ip, port), id))
    }

    /// Lets go of the port binding `id` held on `port` ([`Stack::tcp_bind`]).
    pub fn tcp_unbind(&mut self, port: u16, id: u64) {
        if let Some(list) = self.sockets.tcp.bound.get_mut(&port) {
            list.retain(|b| b.id != id);
            if list.is_empty() {
                self.sockets.tcp.bound.remove(&port);
            }
        }
    }

    /// Lets go of every port binding of `owner`.
    pub(crate) fn tcp_unbind_owner(&mut self, owner: Owner) {
        self.sockets.tcp.bound.retain(|_, list| {
            list.retain(|b| b.owner != owner);
            !list.is_empty()
        });
    }

    /// The port `bind` and `listen` take for `addr`: its own (port 0: an ephemeral
    /// one), on a local or wildcard address, with no listener sharing an address and
    /// a family on it (unless both set SO_REUSEPORT, `reuseport`).
    fn tcp_claim_port(
        &mut self,
        addr: SocketAddr,
        fam: Families,
        reuseport: bool,
    ) -> Result<u16, StackError> {
        let ip = addr.ip();
        if !ip.is_unspecified() && !self.core.is_local_addr(ip) {
            return Err(StackError::AddrNotAvailable);
        }
        let port = match addr.port() {
            0 => self
                .tcp_ephemeral(ip, SocketAddr::new(ip, 0))
                .ok_or(StackError::AddrInUse)?,
            p => p,
        };
        if self.tcp_listener_clash(ip, fam, port, reuseport) {
            return Err(StackError::AddrInUse);
        }
        Ok(port)
    }

    /// Whether a listener on `port` shares an address and a family with `ip`/`fam`
    /// (listeners that all set SO_REUSEPORT, `reuseport`, share it).
    fn tcp_listener_clash(
        &self,
        ip: std::net::IpAddr,
        fam: Families,
        port: u16,
        reuseport: bool,
    ) -> bool {
        let Some(list) = self.sockets.tcp.listen.get(&port) else {
            return false;
        };
        list.iter().any(|&i| match self.sockets.at(i) {
            Some(Socket::TcpListen(l)) => {
                !(reuseport && l.reuseport)
                    && Families::overlap(l.local.ip(), l.families_taken(), ip, fam)
            }
            _ => false,
        })
    }

    /// Listens on `addr` (an unspecified address accepts both families, like UDP's
    /// wildcard binds; port 0 picks an ephemeral port) with an accept `backlog`.
    /// SYN cookies answer when the SYN queue (`max(backlog, 128)`) overflows.
    pub fn tcp_listen(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
    ) -> Result<SocketHandle, StackError> {
        let cfg = self.core.cfg.tcp.clone();
        self.tcp_listen_with(addr, backlog, cfg)
    }

    /// `tcp_listen` with a connection configuration other than the stack's template
    /// (buffer sizes, congestion control, timers); accepted connections inherit it.
    pub fn tcp_listen_with(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
        cfg: TcpConfig,
    ) -> Result<SocketHandle, StackError> {
        self.tcp_listen_families(addr, backlog, cfg, Families::Both)
    }

    /// [`Stack::tcp_listen_with`] whose wildcard takes only the families `fam`
    /// (Linux's dual-stack listeners: an `AF_INET` socket on `0.0.0.0` takes IPv4,
    /// an `AF_INET6` one on `::` IPv6 and, without `IPV6_V6ONLY`, IPv4; see
    /// [`Families`]). Two listeners on one port clash only when they share an
    /// address and a family, so `0.0.0.0:P` and a V6-only `[::]:P` live side by side.
    pub fn tcp_listen_families(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
        cfg: TcpConfig,
        fam: Families,
    ) -> Result<SocketHandle, StackError> {
        self.tcp_listen_reuseport(addr, backlog, cfg, fam, false)
    }

    /// [`Stack::tcp_listen_families`]; with `reuseport` (SO_REUSEPORT) it may
    /// share its address and port with other SO_REUSEPORT listeners, a group
    /// among which each new connection's flow picks one (Linux's reuseport
    /// groups: one listener per worker process or thread).
    pub fn tcp_listen_reuseport(
        &mut self,
        addr: SocketAddr,
        backlog: usize,
        cfg: TcpConfig,
        fam: Families,
        reuseport: bool,
    ) -> Result<SocketHandle, StackError> {
        let ip = addr.ip();
        let port = self.tcp_claim_port(addr, fam, reuseport)?;
        let local = SocketAddr::new(ip, port);
        let cfg = self.tcp_prepare(cfg);
        let mtu = self.core.cfg.mtu;
        let mk = |v6: bool| {
            let mut c = cfg.clone();
            c.mss = c.mss.min(TcpConfig::mss_for_mtu(mtu, v6));
            let cookies = c.syn_cookies;
            Listener::new(local, c, backlog, cookies)
        };
        let (take4, take6) = fam.of(ip);
        let v4 = take4.then(|| mk(false));
        let v6 = take6.then(|| mk(true));
        Ok(self.tcp_insert_listener(local, v4, v6, Default::default(), reuseport))
    }

    /// A listener's address, families and settings, to open the same listening
    /// socket in another shard of this host ([`Stack::tcp_listen_copy`]).
    pub fn tcp_listener_copy(&self, h: SocketHandle) -> Result<TcpListenCopy, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => Ok(TcpListenCopy {
                local: l.local,
                fam: l.families_taken(),
                v4: l.v4.as_ref().map(|x| x.copy_settings()),
                v6: l.v6.as_ref().map(|x| x.copy_settings()),
                ip: l.ip,
                reuseport: l.reuseport,
            }),
            _ => Err(StackError::WrongType),
        }
    }

    /// Listens as the copied listener does (same address, families and settings;
    /// nothing queued). Fails as `listen` does if the port is taken here.
    pub fn tcp_listen_copy(&mut self, c: &TcpListenCopy) -> Result<SocketHandle, StackError> {
        let port = self.tcp_claim_port(c.local, c.fam, c.reuseport)?;
        let local = SocketAddr::new(c.local.ip(), port);
        let v4 = c.v4.as_ref().map(|x| x.copy_settings());
        let v6 = c.v6.as_ref().map(|x| x.copy_settings());
        Ok(self.tcp_insert_listener(local, v4, v6, c.ip, c.reuseport))
    }

    fn tcp_insert_listener(
        &mut self,
        local: SocketAddr,
        v4: Option<Listener<SocketHandle>>,
        v6: Option<Listener<SocketHandle>>,
        ip: [TcpIpOpts; 2],
        reuseport: bool,
    ) -> SocketHandle {
        let port = local.port();
        let h = self.sockets.insert(
            Socket::TcpListen(Box::new(TcpListenSock {
                local,
                v4,
                v6,
                timer: None,
                ip,
                reuseport,
            })),
            Owner::LOCAL,
        );
        self.sockets.tcp.live += 1;
        self.sockets
            .tcp
            .listen
            .entry(port)
            .or_default()
            .push(h.index);
        self.prio_consider(h);
        h
    }

    /// TCP_FASTOPEN on a listener (RFC 7413 server): with a server enabled in
    /// `TcpConfig::fastopen`, SYNs with a valid cookie (or, if configured, none)
    /// have their data accepted and the connection is accepted at once; `qlen` 0
    /// turns it off.
    pub fn tcp_set_fastopen(&mut self, h: SocketHandle, qlen: usize) -> Result<(), StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => {
                for f in l.families() {
                    f.set_fastopen(qlen);
                }
                Ok(())
            }
            _ => Err(StackError::WrongType),
        }
    }

    /// TCP_MAXSEG on a listener: its SYN-ACKs advertise (and its connections use)
    /// an MSS of at most `mss`. (For an active open, pass it in the configuration.)
    pub fn tcp_set_listener_mss(&mut self, h: SocketHandle, mss: u16) -> Result<(), StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => {
                for f in l.families() {
                    f.set_mss(mss);
                }
                Ok(())
            }
            _ => Err(StackError::WrongType),
        }
    }

    /// TCP_USER_TIMEOUT (`usnet_tcp::TcpConfig::user_timeout`) on a connection, or
    /// on a listener for the connections it opens (as Linux's children inherit it).
    pub fn tcp_set_user_timeout(
        &mut self,
        h: SocketHandle,
        t: Option<Duration>,
    ) -> Result<(), StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => {
                for f in l.families() {
                    f.set_user_timeout(t);
                }
                Ok(())
            }
            Socket::TcpConn(_) => self.with_conn(h, |c| c.set_user_timeout(t)),
            _ => Err(StackError::WrongType),
        }
    }

    /// TCP_FASTOPEN_KEY on a listener: the key its Fast Open cookies are made with,
    /// and a backup key whose cookies it still accepts.
    pub fn tcp_set_fastopen_key(
        &mut self,
        h: SocketHandle,
        key: [u8; 16],
        backup: Option<[u8; 16]>,
    ) -> Result<(), StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpListen(l) => {
                for f in l.families() {
                    f.set_fastopen_key(key, backup);
                }
                Ok(())
            }
            _ => Err(StackError::WrongType),
        }
    }

    /// Takes a completed connection from a listener's accept queue.
    pub fn tcp_accept(&mut self, h: SocketHandle) -> Result<SocketHandle, StackError> {
        loop {
            let l = match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
                Socket::TcpListen(l) => l,
                _ => return Err(StackError::WrongType),
            };
            let child =
                l.v4.as_mut()
                    .and_then(|f| f.accept())
                    .or_else(|| l.v6.as_mut().and_then(|f| f.accept()))
                    .ok_or(StackError::WouldBlock)?;
            if let Some(Socket::TcpConn(s)) = self.sockets.get_mut(child) {
                if s.parent == Some(h) {
                    s.parent = None;
                    return Ok(child);
                }
            }
        }
    }

    /// Gives the connections waiting in listener `h`'s accept queue to `owner`, as
    /// the listener itself goes to `owner` (a stack server sharing a listener
    /// between processes): a waiting connection then belongs to whoever accepts it,
    /// not to the listener's first owner, whose exit must not reset it. Returns how
    /// many moved.
    pub fn tcp_reown_waiting(&mut self, h: SocketHandle, owner: Owner) -> usize {
        let waiting: Vec<SocketHandle> = self
            .sockets
            .live()
            .filter_map(|(c, s, _)| match s {
                Socket::TcpConn(t) if t.parent == Some(h) => Some(c),
                _ => None,
            })
            .collect();
        for &c in &waiting {
            self.sockets.set_owner(c, owner);
        }
        waiting.len()
    }

    /// Starts an active open to `remote` and returns at once (the SYN is queued);
    /// `readiness().connected` or an error from `tcp_send`/`tcp_recv` tells the
    /// outcome. `local` may fix the address and/or port (port 0: ephemeral).
    pub fn tcp_connect(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
    ) -> Result<SocketHandle, StackError> {
        let cfg = self.core.cfg.tcp.clone();
        self.tcp_connect_with(local, remote, cfg, TcpIpOpts::default())
    }

    /// `tcp_connect` with a configuration other than the stack's template, and
    /// the IP header fields of its packets from the SYN on.
    pub fn tcp_connect_with(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        cfg: TcpConfig,
        ip: TcpIpOpts,
    ) -> Result<SocketHandle, StackError> {
        self.tcp_open(local, remote, cfg, ip, |_, _, _| 0)
            .map(|(h, _)| h)
    }

    /// An active open; `prepare` sees the connection before its SYN goes out.
    fn tcp_open(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        cfg: TcpConfig,
        ip: TcpIpOpts,
        prepare: impl FnOnce(
            &mut Connection,
            &std::collections::HashMap<std::net::IpAddr, crate::socket::FoCacheEntry>,
            &mut usnet_pool::PacketPool,
        ) -> usize,
    ) -> Result<(SocketHandle, usize), StackError> {
        let rip = remote.ip();
        let bad_remote = match rip {
            std::net::IpAddr::V4(a) => a.is_broadcast() || a.is_multicast(),
            std::net::IpAddr::V6(a) => a.is_multicast(),
        };
        if remote.port() == 0 || rip.is_unspecified() || bad_remote {
            return Err(StackError::InvalidInput);
        }
        let Some((src, _)) = self.core.route(rip) else {
            self.core.counters.ip_tx_no_route += 1;
            return Err(StackError::NoRoute);
        };
        let lip = match local {
            Some(l) if !l.ip().is_unspecified() => {
                if !self.core.is_local_addr(l.ip()) || l.is_ipv4() != remote.is_ipv4() {
                    return Err(StackError::AddrNotAvailable);
                }
                l.ip()
            }
            _ => src,
        };
        let lport = match local.map_or(0, |l| l.port()) {
            0 => self
                .tcp_ephemeral(lip, remote)
                .ok_or(StackError::AddrNotAvailable)?,
            p => p,
        };
        if !self.core.cfg.shard.owns_flow(lport, remote.port()) {
            // The replies would land on another shard, which has no such
            // connection: the host must open it there (`shard.rs`).
            self.core.counters.tcp_connect_wrong_shard += 1;
            return Err(StackError::AddrNotAvailable);
        }
        let l = SocketAddr::new(lip, lport);
        if !self.tcp_tuple_free(l, remote) {
            // Linux's `__inet_check_established`: a connection with these four
            // numbers exists (EADDRNOTAVAIL, not a bind's EADDRINUSE).
            return Err(StackError::AddrNotAvailable);
        }
        let mut cfg = self.tcp_prepare(cfg);
        cfg.mss = cfg
            .mss
            .min(TcpConfig::mss_for_mtu(self.core.cfg.mtu, remote.is_ipv6()));
        let mut conn = Connection::connect(l, remote, self.core.tcp_now(), cfg);
        let queued = prepare(&mut conn, &self.sockets.tcp.fo_cache, &mut self.core.pool);
        let mut sock = TcpConnSock::new(conn, None);
        sock.ip = ip;
        if ip.min_ttl != 0 {
            self.sockets.tcp.min_ttl_used = true;
        }
        let h = self
            .sockets
            .insert(Socket::TcpConn(Box::new(sock)), Owner::LOCAL);
        self.sockets.tcp.live += 1;
        self.sockets.tcp.conns.insert((l, remote), h.index);
        self.core.counters.tcp_active_opens += 1;
        self.tcp_settle(h.index, Wake::default());
        Ok((h, queued))
    }

    /// Whether the Fast Open cookie cache holds a cookie for `ip`.
    pub fn tcp_fastopen_cookie_cached(&self, ip: std::net::IpAddr) -> bool {
        self.sockets
            .tcp
            .fo_cache
            .get(&ip)
            .is_some_and(|e| e.cookie.is_some())
    }

    /// Whether a Fast Open connect to `ip` would carry data on its SYN: the client
    /// is enabled and a cookie is cached, or data goes without one (Linux's
    /// `tcp_fastopen_cookie_check`, which `TCP_FASTOPEN_CONNECT` asks).
    pub fn tcp_fastopen_ready(&self, ip: std::net::IpAddr) -> bool {
        let f = self.core.cfg.tcp.fastopen;
        self.tcp_fastopen_client_enabled()
            && (f & usnet_tcp::config::FASTOPEN_CLIENT_NO_COOKIE != 0
                || self.tcp_fastopen_cookie_cached(ip))
    }

    /// Forgets what was learned per destination (the Fast Open cookies and MSS),
    /// as Linux's `ip tcp_metrics flush`.
    pub fn tcp_flush_metrics(&mut self) {
        self.sockets.tcp.fo_cache.clear();
    }

    /// Whether `TcpConfig::fastopen` lets clients use Fast Open.
    pub fn tcp_fastopen_client_enabled(&self) -> bool {
        self.core.cfg.tcp.fastopen & usnet_tcp::config::FASTOPEN_CLIENT != 0
    }

    /// Active open with TCP Fast Open (RFC 7413 §4.1), as Linux's
    /// `sendto(MSG_FASTOPEN)`: with a cookie cached for `remote` the SYN carries the
    /// first bytes of `data` (as many as fit in the peer's cached MSS, or ours, less
    /// 40 bytes of option room); without one the SYN asks for a cookie and carries
    /// none. Returns the handle and the bytes taken (all on the SYN); the rest is the
    /// caller's to send once connected. `WrongType` (EOPNOTSUPP to a C caller is the
    /// caller's mapping) when `TcpConfig::fastopen` has no client bit.
    pub fn tcp_connect_fastopen(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        data: &[u8],
    ) -> Result<(SocketHandle, usize), StackError> {
        let cfg = self.core.cfg.tcp.clone();
        self.tcp_connect_fastopen_with(local, remote, data, cfg, TcpIpOpts::default())
    }

    /// `tcp_connect_fastopen` with a configuration other than the stack's template.
    pub fn tcp_connect_fastopen_with(
        &mut self,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        data: &[u8],
        cfg: TcpConfig,
        ip: TcpIpOpts,
    ) -> Result<(SocketHandle, usize), StackError> {
        if !self.tcp_fastopen_client_enabled() {
            return Err(StackError::WrongType);
        }
        self.tcp_open(local, remote, cfg, ip, |c, cache, pool| {
            let entry = cache.get(&remote.ip()).copied().unwrap_or_default();
            let no_cookie = c.config().fastopen & usnet_tcp::config::FASTOPEN_CLIENT_NO_COOKIE != 0;
            if entry.cookie.is_none() && !no_cookie {
                c.set_fastopen_client(FastOpen::request(entry.try_exp == 1), 0);
                return 0;
            }
            let mss = match entry.mss {
                0 => c.config().mss,
                m => m.min(c.config().mss),
            };
            let room = usize::from(mss).saturating_sub(40).min(data.len());
            let n = if c.is_zero_copy() {
                queue_copied_piece(c, pool, &data[..room])
            } else {
                c.send(&data[..room])
            };
            match entry.cookie {
                Some(cookie) => c.set_fastopen_client(cookie, n),
                // Cookie-less mode: the data rides without an option.
                None => c.set_syn_data(n),
            }
        })
    }

    /// Queues data; returns how much was taken (`WouldBlock` when the send buffer is
    /// full, `BrokenPipe` after `tcp_shutdown_write`, the connection's error if it
    /// failed). Data may be queued before the handshake completes.
    pub fn tcp_send(&mut self, h: SocketHandle, data: &[u8]) -> Result<usize, StackError> {
        self.tcp_send_more(h, data, false)
    }

    /// Whether connection `h` would take a write now, asked by someone who will
    /// wait for it: if not, the ACK that makes room reports it writable (Linux's
    /// `tcp_poll` setting `SOCK_NOSPACE`). Without that, a writer whose bytes were
    /// pushed for it without a refusal (a stack server moving what a client queued)
    /// could find the socket full and never hear that it emptied.
    pub fn tcp_poll_writable(&mut self, h: SocketHandle) -> bool {
        let writable = self.readiness(h).is_ok_and(|r| r.writable);
        if !writable {
            if let Ok(c) = self.conn_mut(h) {
                c.no_space();
            }
        }
        writable
    }

    /// [`Stack::tcp_send`]; `more` (Linux `MSG_MORE`): more data follows at once, so
    /// a partial segment waits and this data's end carries no PSH
    /// (`usnet_tcp::Connection::send_more`).
    pub fn tcp_send_more(
        &mut self,
        h: SocketHandle,
        data: &[u8],
        more: bool,
    ) -> Result<usize, StackError> {
        self.tcp_send_more_with(h, data.len(), more, usnet_tcp::ring::fill_from(data))
    }

    /// [`Stack::tcp_send_more`] of the next `max` bytes of a source that `fill`
    /// copies into the socket's storage in order (each call is handed the next
    /// part and returns what it wrote): the same admission, step by step as Linux's
    /// `tcp_sendmsg`, for bytes that are not one slice (a client's shared ring).
    pub fn tcp_send_more_with(
        &mut self,
        h: SocketHandle,
        max: usize,
        more: bool,
        mut fill: impl FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, StackError> {
        if let Some(e) = self.tcp_report_error(h)? {
            return Err(e);
        }
        let c = self.conn(h)?;
        if !c.may_send() {
            return Err(StackError::BrokenPipe);
        }
        if max == 0 {
            return Ok(0);
        }
        if !c.is_zero_copy() {
            return self.tcp_send_steps(h, max, more, &mut fill);
        }
        if c.send_capacity() == 0 {
            self.conn_mut(h)?.no_space();
            return Err(StackError::WouldBlock);
        }
        {
            let n = self.zc_copy_in(h, max, more, fill);
            if n > 0 {
                // The write's end is a push point, as on a copying connection.
                self.conn_mut(h)?.write_done(more);
            }
            self.tcp_settle(h.index, Wake::default());
            if n == 0 {
                Err(StackError::WouldBlock)
            } else {
                Ok(n)
            }
        }
    }

    /// A write as Linux's `tcp_sendmsg` takes it (`usnet_tcp::Connection::send_step`):
    /// piece by piece, each admitted by the send buffer's limit, transmitting where
    /// a piece at the head of the unsent data fills up, so that what the window lets
    /// out meanwhile makes room. `WouldBlock` when nothing was admitted.
    fn tcp_send_steps(
        &mut self,
        h: SocketHandle,
        max: usize,
        more: bool,
        fill: &mut impl FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, StackError> {
        let now = self.core.tcp_now();
        self.conn_mut(h)?.advance_clock(now);
        let mut done = 0;
        while done < max {
            let (n, push) = self
                .conn_mut(h)?
                .send_step_with(max - done, more, &mut *fill);
            if n == 0 {
                break;
            }
            done += n;
            if push && done < max {
                self.conn_mut(h)?.push_one();
                self.tcp_settle(h.index, Wake::default());
                // The transmission may have ended the connection.
                if self.conn(h).map_or(true, |c| !c.may_send()) {
                    break;
                }
            }
        }
        if done > 0 {
            self.conn_mut(h)?.write_done(more);
        }
        self.tcp_settle(h.index, Wake::default());
        if done == 0 {
            Err(StackError::WouldBlock)
        } else {
            Ok(done)
        }
    }

    /// `MSG_EOR`: the data queued so far ends a record; its last byte ends a
    /// segment, so later data never shares a segment with it.
    pub fn tcp_end_record(&mut self, h: SocketHandle) -> Result<(), StackError> {
        self.with_conn(h, |c| c.end_record())
    }

    /// Reads received data: `Ok(0)` at end of stream, `WouldBlock` when nothing is
    /// there yet, the connection's error if it failed.
    pub fn tcp_recv(&mut self, h: SocketHandle, buf: &mut [u8]) -> Result<usize, StackError> {
        if self.conn(h)?.is_zero_copy() {
            let mut done = 0;
            return self.tcp_recv_with(h, buf.len(), |chunk| {
                buf[done..done + chunk.len()].copy_from_slice(chunk);
                done += chunk.len();
            });
        }
        let c = self.conn_mut(h)?;
        let n = c.recv(buf);
        if n > 0 {
            // The read may open the window: let the connection say so.
            self.tcp_settle(h.index, Wake::default());
            return Ok(n);
        }
        if buf.is_empty() || c.is_eof() {
            return Ok(0);
        }
        let closed = c.state() == State::Closed;
        if let Some(e) = self.tcp_report_error(h)? {
            return Err(e);
        }
        if closed {
            Ok(0)
        } else {
            Err(StackError::WouldBlock)
        }
    }

    /// [`Stack::tcp_recv`] as Linux's `splice` reads a socket (`tcp_read_sock`): it
    /// stops at the urgent mark rather than skip the urgent byte, and there, with
    /// that byte still queued, returns `Ok(0)` instead of waiting
    /// (`usnet_tcp::Connection::recv_to_mark`).
    pub fn tcp_recv_to_mark(
        &mut self,
        h: SocketHandle,
        buf: &mut [u8],
    ) -> Result<usize, StackError> {
        let c = self.conn_mut(h)?;
        if c.at_urgent_mark() {
            return Ok(0);
        }
        if c.is_zero_copy() {
            let mut done = 0;
            return self.tcp_recv_with_inner(h, buf.len(), true, |chunk| {
                buf[done..done + chunk.len()].copy_from_slice(chunk);
                done += chunk.len();
            });
        }
        let n = c.recv_to_mark(buf);
        if n > 0 {
            // The read may open the window: let the connection say so.
            self.tcp_settle(h.index, Wake::default());
            return Ok(n);
        }
        // Nothing queued: end of stream, an error or nothing yet, as a read says.
        self.tcp_recv(h, buf)
    }

    /// [`Stack::tcp_send`] whose bytes `fill` writes straight into the connection's
    /// send buffer (up to `max`, in up to two slices; it returns how much of each it
    /// wrote). A stack server copies a client's shared ring in with it: one copy.
    pub fn tcp_send_with(
        &mut self,
        h: SocketHandle,
        max: usize,
        fill: impl FnMut(&mut [u8]) -> usize,
    ) -> Result<usize, StackError> {
        if !self.tcp_write_admitted(h, max)? {
            return Ok(0);
        }
        if self.conn(h)?.is_zero_copy() {
            let n = self.zc_copy_in(h, max, false, fill);
            self.tcp_settle(h.index, Wake::default());
            return if n == 0 {
                Err(StackError::WouldBlock)
            } else {
                Ok(n)
            };
        }
        self.with_conn(h, |c| c.send_with(max, fill))
    }

    /// In-order bytes connection `h` receives while nothing waits before them go
    /// to `sink` (a stack server's client ring) instead of its receive queue
    /// (`Connection::set_recv_sink`): one copy fewer. `None` takes it away.
    /// Returns the sink it replaces.
    pub fn tcp_set_recv_sink(
        &mut self,
        h: SocketHandle,
        sink: Option<Box<dyn RecvSink>>,
    ) -> Result<Option<Box<dyn RecvSink>>, StackError> {
        Ok(self.conn_mut(h)?.set_recv_sink(sink))
    }

    /// A stack server's shared send ring becomes connection `h`'s send buffer
    /// (`Connection::lend_send_buffer`): the client's bytes are sent from where it
    /// wrote them, one copy fewer. `pos`: the ring position of the next byte to
    /// send; `cap`: the ring's size. `lender`, the same memory as a [`Lender`]:
    /// with TSO, GSO frames then carry the ring's bytes by reference and the
    /// device's own copy (the kernel's, for TAP and AF_PACKET) is the only one
    /// (`tcp_tx_lent`). False when the connection cannot take it (a zero-copy
    /// one, or bytes already queued).
    pub fn tcp_lend_send_buffer(
        &mut self,
        h: SocketHandle,
        src: Box<dyn LentBytes>,
        lender: Option<Arc<dyn Lender>>,
        pos: u64,
        cap: usize,
    ) -> Result<bool, StackError> {
        let s = self.conn_sock_mut(h)?;
        let lent = s.conn.lend_send_buffer(src, pos, cap);
        if lent {
            s.lender = lender;
        }
        Ok(lent)
    }

    /// [`Stack::tcp_send_with`] for a connection whose send buffer is lent: the
    /// next `max` bytes of the ring are queued where they lie.
    pub fn tcp_send_lent(&mut self, h: SocketHandle, max: usize) -> Result<usize, StackError> {
        if !self.tcp_write_admitted(h, max)? {
            return Ok(0);
        }
        self.with_conn(h, |c| c.send_lent(max))
    }

    /// What a write of `max` bytes meets before any byte is queued, in Linux's
    /// order: a pending error, sending over (`BrokenPipe`), nothing to write
    /// (`Ok(false)`), a full send buffer (`WouldBlock`, the writer noted).
    fn tcp_write_admitted(&mut self, h: SocketHandle, max: usize) -> Result<bool, StackError> {
        if let Some(e) = self.tcp_report_error(h)? {
            return Err(e);
        }
        let c = self.conn(h)?;
        if !c.may_send() {
            return Err(StackError::BrokenPipe);
        }
        if max == 0 {
            return Ok(false);
        }
        if c.send_capacity() == 0 {
            self.conn_mut(h)?.no_space();
            return Err(StackError::WouldBlock);
        }
        Ok(true)
    }

    /// The ring position up to which connection `h` is done with its lent send
    /// ring (everything before it acknowledged): the owner may reuse those bytes.
    /// None when the buffer is not lent, or the connection is closed (it reads the
    /// ring no more).
    pub fn tcp_lent_head(&self, h: SocketHandle) -> Option<u64> {
        let c = self.conn(h).ok()?;
        if c.state() == State::Closed {
            return None;
        }
        c.lent_head()
    }

    /// Whether connection `h`'s lent ring holds it back
    /// (`Connection::lent_ring_binds`: full, the send buffer's limit larger, and
    /// the peer's window closed on it or the ring alone capping a flight that meets
    /// no queue).
    pub fn tcp_lent_ring_binds(&self, h: SocketHandle) -> bool {
        self.conn(h).is_ok_and(|c| c.lent_ring_binds())
    }

    /// Connection `h` copies what it holds of its lent ring into a buffer of its
    /// own and gives the ring back (its owner is about to reuse or share it).
    /// Returns whether it was lent.
    pub fn tcp_unlend_send_buffer(&mut self, h: SocketHandle) -> bool {
        let Ok(s) = self.conn_sock_mut(h) else {
            return false;
        };
        if let (Some(lender), Some((a, b))) = (s.lender.take(), s.conn.lent_bytes()) {
            // Frames that carry the ring's bytes may still wait to be sent: they
            // read what the connection held from a copy, as the client writes on.
            lender.retire(&[a, b]);
        }
        let given_back = s.conn.unlend_send_buffer();
        self.core.counters.tcp_lent_given_back += u64::from(given_back);
        given_back
    }

    /// [`Stack::tcp_recv`] that hands up to `max` bytes to `sink` as they lie in the
    /// receive buffer (a few slices, in order): one copy into wherever `sink` puts
    /// them. `Ok(0)` at end of stream (or with `max == 0`).
    pub fn tcp_recv_with(
        &mut self,
        h: SocketHandle,
        max: usize,
        sink: impl FnMut(&[u8]),
    ) -> Result<usize, StackError> {
        self.tcp_recv_with_inner(h, max, false, sink)
    }

    /// [`Stack::tcp_recv_with`] that stops at the urgent mark
    /// (`usnet_tcp::Connection::recv_with_to_mark`): `Ok(0)` there while the urgent
    /// byte waits ([`Stack::tcp_take_urgent_at_mark`] takes it).
    pub fn tcp_recv_with_to_mark(
        &mut self,
        h: SocketHandle,
        max: usize,
        sink: impl FnMut(&[u8]),
    ) -> Result<usize, StackError> {
        if self.conn(h)?.at_urgent_mark() {
            return Ok(0);
        }
        self.tcp_recv_with_inner(h, max, true, sink)
    }

    /// Whether the next byte to read is the urgent byte (not inline).
    pub fn tcp_at_urgent_mark(&self, h: SocketHandle) -> bool {
        self.conn(h).is_ok_and(|c| c.at_urgent_mark())
    }

    /// At the urgent mark: the urgent byte, taken out of the stream.
    pub fn tcp_take_urgent_at_mark(&mut self, h: SocketHandle) -> Result<Option<u8>, StackError> {
        let b = if self.conn(h)?.is_zero_copy() {
            self.zc_take_urgent(h)?
        } else {
            self.conn_mut(h)?.take_urgent_at_mark()
        };
        if b.is_some() {
            // Taking it may open the window: let the connection say so.
            self.tcp_settle(h.index, Wake::default());
        }
        Ok(b)
    }

    fn tcp_recv_with_inner(
        &mut self,
        h: SocketHandle,
        max: usize,
        to_mark: bool,
        sink: impl FnMut(&[u8]),
    ) -> Result<usize, StackError> {
        let n = if self.conn(h)?.is_zero_copy() {
            self.zc_copy_out(h, max, to_mark, sink)?
        } else if to_mark {
            self.conn_mut(h)?.recv_with_to_mark(max, sink)
        } else {
            self.conn_mut(h)?.recv_with(max, sink)
        };
        let c = self.conn_mut(h)?;
        if n > 0 {
            self.tcp_settle(h.index, Wake::default());
            return Ok(n);
        }
        if max == 0 || c.is_eof() {
            return Ok(0);
        }
        let closed = c.state() == State::Closed;
        if let Some(e) = self.tcp_report_error(h)? {
            return Err(e);
        }
        if closed {
            Ok(0)
        } else {
            Err(StackError::WouldBlock)
        }
    }

    /// The error that ended the connection, the first time a call asks (as Linux
    /// reports `sk_err` once): later sends fail with `BrokenPipe` and reads see end
    /// of stream.
    fn tcp_report_error(&mut self, h: SocketHandle) -> Result<Option<StackError>, StackError> {
        let s = self.conn_sock_mut(h)?;
        match s.conn.error() {
            Some(e) if !s.err_reported => {
                s.err_reported = true;
                Ok(Some(e.into()))
            }
            _ => Ok(None),
        }
    }

    /// SO_ERROR: the connection's error if not yet reported, then cleared.
    pub fn tcp_take_error(&mut self, h: SocketHandle) -> Result<Option<StackError>, StackError> {
        self.tcp_report_error(h)
    }

    /// Bytes `tcp_recv` can return now.
    pub fn tcp_recv_available(&self, h: SocketHandle) -> Result<usize, StackError> {
        Ok(self.conn(h)?.recv_available())
    }

    /// Free space in the send buffer.
    pub fn tcp_send_capacity(&self, h: SocketHandle) -> Result<usize, StackError> {
        Ok(self.conn(h)?.send_capacity())
    }

    /// Sends FIN after the queued data (SHUT_WR); reading continues.
    /// Before the handshake completes the FIN waits for it (queued data is not lost).
    pub fn tcp_shutdown_write(&mut self, h: SocketHandle) -> Result<(), StackError> {
        let st = self.conn(h)?.state();
        if matches!(st, State::SynSent | State::SynReceived) {
            self.conn_sock_mut(h)?.fin_pending = true;
            return Ok(());
        }
        self.with_conn(h, |c| c.shutdown_write())
    }

    /// SHUT_RD: `tcp_recv` returns what is queued, then end of stream (0); the
    /// socket reads as readable from then on.
    pub fn tcp_shutdown_read(&mut self, h: SocketHandle) -> Result<(), StackError> {
        self.with_conn(h, |c| c.shutdown_read())
    }

    /// Closes a TCP socket (close(2)). A connection finishes in the background
    /// (FIN, then TIME-WAIT or CLOSED) and is freed when it reaches CLOSED; unread
    /// data or `linger = 0` make it an abort (RST). A listener aborts the
    /// connections still in its accept queue.
    pub fn tcp_close(&mut self, h: SocketHandle) -> Result<(), StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(_) => {
                let s = self.conn_sock_mut(h)?;
                s.orphan = true;
                s.conn.close();
                self.tcp_settle(h.index, Wake::default());
                Ok(())
            }
            Socket::TcpListen(_) => {
                let Some(Socket::TcpListen(mut l)) = self.sockets.remove(h) else {
                    return Err(StackError::InvalidHandle);
                };
                let t = &mut self.sockets.tcp;
                t.live -= 1;
                if let Some(list) = t.listen.get_mut(&l.local.port()) {
                    list.retain(|&i| i != h.index);
                    if list.is_empty() {
                        t.listen.remove(&l.local.port());
                    }
                }
                l.merge_stats(&mut t.totals);
                let mut children = Vec::new();
                for f in l.families() {
                    while let Some(c) = f.accept() {
                        children.push(c);
                    }
                }
                for c in children {
                    // Also one already aborted (orphaned) while it waited: it is
                    // freed now that no accept can return it.
                    if let Some(Socket::TcpConn(s)) = self.sockets.get_mut(c) {
                        s.parent = None;
                        s.orphan = true;
                        s.conn.abort();
                        self.tcp_settle(c.index, Wake::default());
                    }
                }
                self.core.counters.mirror_tcp(&self.sockets.tcp.totals);
                Ok(())
            }
            _ => Err(StackError::WrongType),
        }
    }

    /// Abortive close: RST now, and the handle is gone.
    pub fn tcp_abort(&mut self, h: SocketHandle) -> Result<(), StackError> {
        let s = self.conn_sock_mut(h)?;
        s.orphan = true;
        s.conn.abort();
        self.tcp_settle(h.index, Wake::default());
        Ok(())
    }

    pub fn tcp_state(&self, h: SocketHandle) -> Result<State, StackError> {
        Ok(self.conn(h)?.state())
    }

    /// The error that ended the connection, if any (SO_ERROR).
    pub fn tcp_error(&self, h: SocketHandle) -> Result<Option<StackError>, StackError> {
        Ok(self.conn(h)?.error().map(StackError::from))
    }

    pub fn tcp_info(&self, h: SocketHandle) -> Result<TcpInfo, StackError> {
        Ok(self.conn(h)?.info_at(self.core.tcp_now()))
    }

    /// The connection's own counters.
    pub fn tcp_conn_stats(&self, h: SocketHandle) -> Result<TcpStats, StackError> {
        Ok(self.conn(h)?.stats())
    }

    pub fn tcp_local_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) => Ok(s.local),
            Socket::TcpListen(l) => Ok(l.local),
            _ => Err(StackError::WrongType),
        }
    }

    /// Whether `h` is a live TCP listener.
    pub fn tcp_is_listener(&self, h: SocketHandle) -> bool {
        matches!(self.sockets.get(h), Some(Socket::TcpListen(_)))
    }

    pub fn tcp_peer_addr(&self, h: SocketHandle) -> Result<SocketAddr, StackError> {
        Ok(self.conn_sock(h)?.remote)
    }

    pub fn tcp_set_nodelay(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_nodelay(on))
    }

    /// TCP_CORK (`usnet_tcp::Connection::set_cork`); lifting it sends what waited.
    pub fn tcp_set_cork(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_cork(on))
    }

    /// `SO_SNDBUF`: the send buffer's limit becomes `sndbuf` bytes in Linux's
    /// accounting (the caller doubles the option's value as Linux does:
    /// [`usnet_tcp::sndbuf_for_option`]), without autotuning from now on.
    pub fn tcp_set_send_buffer(&mut self, h: SocketHandle, sndbuf: u32) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_send_buffer_limit(sndbuf))
    }

    /// Whether the connection's send-buffer limit was chosen (`SO_SNDBUF`, a
    /// not-sent low-water mark): `usnet_tcp::Connection::send_limit_chosen`.
    pub fn tcp_send_limit_chosen(&self, h: SocketHandle) -> Result<bool, StackError> {
        Ok(self.conn(h)?.send_limit_chosen())
    }

    /// How many bytes a write would surely have taken whole now
    /// (`usnet_tcp::Connection::sure_write_room`).
    pub fn tcp_sure_write_room(&self, h: SocketHandle) -> Result<u32, StackError> {
        Ok(self.conn(h)?.sure_write_room())
    }

    /// The send buffer's limit now (what Linux's `SO_SNDBUF` reports).
    pub fn tcp_send_buffer(&self, h: SocketHandle) -> Result<u32, StackError> {
        Ok(self.conn(h)?.send_buffer_limit())
    }

    /// `IP_TOS` / `IPV6_TCLASS`: the DSCP bits of the connection's packets (its
    /// ECN bits stay the engine's, as Linux masks them for TCP).
    pub fn tcp_set_tos(&mut self, h: SocketHandle, tos: u8) -> Result<(), StackError> {
        let family = IpFamily::of(self.tcp_peer_addr(h)?.ip());
        let mut ip = self.tcp_ip_opts(h, family)?;
        ip.tos = tos;
        self.tcp_set_ip_opts(h, family, ip)
    }

    /// The IP header fields connection or listener `h` chooses for `family` (a
    /// connection has one family, its peer's: `family` is ignored).
    pub fn tcp_ip_opts(&self, h: SocketHandle, family: IpFamily) -> Result<TcpIpOpts, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) => Ok(s.ip),
            Socket::TcpListen(l) => Ok(l.ip[family.index()]),
            _ => Err(StackError::WrongType),
        }
    }

    /// Sets them: on a connection for its packets from now on (`family` is
    /// ignored: a connection has one), on a listener for the connections it
    /// accepts from then on, their SYN-ACKs included. The TOS keeps only its DSCP
    /// bits. A minimum TTL drops the segments that arrive below it
    /// (`tcp_rx_min_ttl`), as Linux's `IP_MINTTL`.
    pub fn tcp_set_ip_opts(
        &mut self,
        h: SocketHandle,
        family: IpFamily,
        mut ip: TcpIpOpts,
    ) -> Result<(), StackError> {
        ip.tos &= !3;
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::TcpConn(s) => s.ip = ip,
            Socket::TcpListen(l) => l.ip[family.index()] = ip,
            _ => return Err(StackError::WrongType),
        }
        if ip.min_ttl != 0 {
            self.sockets.tcp.min_ttl_used = true;
        }
        Ok(())
    }

    /// `TCP_NOTSENT_LOWAT` (0: the stack's `tcp_notsent_lowat`).
    pub fn tcp_set_notsent_lowat(&mut self, h: SocketHandle, lowat: u32) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_notsent_lowat(lowat))
    }

    /// `TCP_NOTSENT_LOWAT` as set (0: none).
    pub fn tcp_notsent_lowat(&self, h: SocketHandle) -> Result<u32, StackError> {
        Ok(self.conn(h)?.notsent_lowat())
    }

    pub fn tcp_set_keepalive(
        &mut self,
        h: SocketHandle,
        ka: Option<Keepalive>,
    ) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_keepalive(ka))
    }

    /// The application waits for the handshake to send data: the handshake's ACK
    /// waits for that data (Linux's `sk_write_pending`).
    pub fn tcp_set_write_pending(&mut self, h: SocketHandle, on: bool) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_write_pending(on))
    }

    /// TCP_SYNCNT on a connection (its handshake may be under way).
    pub fn tcp_set_syn_retries(&mut self, h: SocketHandle, n: u32) -> Result<(), StackError> {
        self.with_conn(h, |c| c.set_syn_retries(n))
    }

    pub fn tcp_set_linger(
        &mut self,
        h: SocketHandle,
        linger: Option<Duration>,
    ) -> Result<(), StackError> {
        self.conn_mut(h)?.set_linger(linger);
        Ok(())
    }

    pub fn tcp_set_congestion_control(
        &mut self,
        h: SocketHandle,
        cc: CcAlgorithm,
    ) -> Result<(), StackError> {
        let c = self.conn_mut(h)?;
        let mss = c.snd_mss();
        let iw = c.config().initial_window;
        c.set_congestion_control(cc.build(mss, iw));
        Ok(())
    }

    /// SO_MAX_PACING_RATE in bytes per second (None: none); setting one paces the
    /// connection, as Linux's TCP then paces itself.
    pub fn tcp_set_max_pacing_rate(
        &mut self,
        h: SocketHandle,
        rate: Option<u64>,
    ) -> Result<(), StackError> {
        self.conn_mut(h)?.set_max_pacing_rate(rate);
        Ok(())
    }

    /// The template new connections start from (buffer sizes, congestion control,
    /// timers, SACK/timestamps/window scaling).
    pub fn tcp_config(&self) -> &TcpConfig {
        &self.core.cfg.tcp
    }

    pub fn tcp_config_mut(&mut self) -> &mut TcpConfig {
        &mut self.core.cfg.tcp
    }

    /// Totals of every connection and listener, live and gone.
    pub fn tcp_stats(&self) -> TcpStats {
        let mut t = self.sockets.tcp.totals.clone();
        for slot in &self.sockets.slots {
            match slot.sock.as_ref() {
                Some(Socket::TcpConn(s)) => t.merge(&s.conn.stats()),
                Some(Socket::TcpListen(l)) => l.merge_stats(&mut t),
                _ => {}
            }
        }
        t
    }

    /// `counters()` with the `tcp_*` engine counters including live connections
    /// (`counters()` itself has them for connections already freed).
    pub fn counters_snapshot(&self) -> crate::Counters {
        let mut c = self.core.counters.clone();
        c.mirror_tcp(&self.tcp_stats());
        c
    }

    /// Every TCP connection with its `tcp_info` (like `ss -ti`).
    pub fn tcp_connections(&self) -> Vec<TcpConnEntry> {
        self.sockets
            .live()
            .filter_map(|(handle, sock, slot)| match sock {
                Socket::TcpConn(s) => Some(TcpConnEntry {
                    handle,
                    local: s.local,
                    remote: s.remote,
                    orphan: s.orphan,
                    owner: slot.owner,
                    info: s.conn.info(),
                }),
                _ => None,
            })
            .collect()
    }

    pub fn tcp_listeners(&self) -> Vec<TcpListenEntry> {
        self.sockets
            .live()
            .filter_map(|(handle, sock, slot)| match sock {
                Socket::TcpListen(l) => Some(TcpListenEntry {
                    handle,
                    local: l.local,
                    families: l.families_taken(),
                    reuseport: l.reuseport,
                    owner: slot.owner,
                    syn_queue: l.syn_queue_len(),
                    accept_queue: l.accept_queue_len(),
                }),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn tcp_readiness(&self, s: &Socket) -> Option<Readiness> {
        match s {
            Socket::TcpConn(s) => Some(readiness_of(&s.conn)),
            Socket::TcpListen(l) => Some(Readiness {
                readable: l.accept_queue_len() > 0,
                ..Readiness::default()
            }),
            _ => None,
        }
    }

    pub(crate) fn tcp_socket_stats(&self, s: &Socket) -> Option<SocketStats> {
        let st = match s {
            Socket::TcpConn(s) => s.conn.stats(),
            Socket::TcpListen(l) => {
                let mut t = TcpStats::default();
                l.merge_stats(&mut t);
                t
            }
            _ => return None,
        };
        Some(SocketStats {
            rx_datagrams: st.rx_segments,
            rx_bytes: st.rx_bytes,
            rx_queue_full: st.rx_ooo_full,
            tx_datagrams: st.tx_segments,
            tx_bytes: st.tx_bytes,
        })
    }
}

/// Queues `data` (at most a buffer's room) on a pool-backed connection as one piece
/// of a new pool buffer; returns the bytes queued (0 when the pool is empty or the
/// queue refuses them, the buffer then going back).
fn queue_copied_piece(c: &mut Connection, pool: &mut usnet_pool::PacketPool, data: &[u8]) -> usize {
    let head = pool.headroom();
    let n = data.len().min(pool.buf_size() - head);
    if n == 0 {
        return 0;
    }
    let Some(b) = pool.alloc() else {
        return 0;
    };
    pool.whole_mut(&b)[head..head + n].copy_from_slice(&data[..n]);
    let span = usnet_tcp::BufSpan {
        buf: b.index(),
        off: head as u32,
        len: n as u32,
    };
    if c.send_span(span, false) {
        // The queue holds the reference now.
        let _ = b.into_index();
        n
    } else {
        pool.free(b);
        0
    }
}
