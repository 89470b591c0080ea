//! The socket calls: a slot made, bound, listening, accepting or connecting, shut
//! down or closed, each checked against the slot's role before it reaches the stack.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;

use usnet_session_abi::{
    errno, slot, SockAddr, AF_UNSPEC, FAM_V4, FAM_V6, FLAG_BOUND, FLAG_CONNECTED, FLAG_RX_EOF,
    KIND_ICMP, KIND_RAW, KIND_TCP, KIND_UDP, SHUT_RD, SHUT_RDWR, SHUT_WR, SLOT_CLOSING,
};
use usnet_stack::{Families, IpFamily, SocketHandle, Stack, StackError};

use super::{err, Role, ServerSession, SessionSocket};

impl ServerSession {
    pub(super) fn op_socket(&mut self, kind: u64) -> i64 {
        let role = match kind {
            KIND_TCP => Role::Fresh,
            KIND_UDP | KIND_ICMP | KIND_RAW => Role::Udp,
            _ => return -errno::EINVAL,
        };
        match self.new_slot(kind, role) {
            Some(i) => i as i64,
            None => -errno::EMFILE,
        }
    }

    pub(super) fn op_bind(
        &mut self,
        stack: &mut Stack,
        i: u32,
        a: SockAddr,
        fam: Families,
        (reuse, reuseport): (bool, bool),
    ) -> i64 {
        let Some(addr) = a.to_std() else {
            return -errno::EINVAL;
        };
        let owner = self.owner();
        let clash = self
            .elsewhere
            .as_ref()
            .is_some_and(|e| e.clash(addr, fam, reuseport));
        let s = self.sock(i);
        if let (Some(h), usnet_stack::DgramProto::Raw) = (s.handle, s.dgram_proto()) {
            // A raw socket may be bound again, to another address of its family
            // (Linux's `raw_bind` sets the receive address each time).
            return match stack.raw_rebind(h, addr.ip()) {
                Ok(()) => {
                    let local = stack.udp_local_addr(h).unwrap_or(addr);
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
                    0
                }
                Err(e) => err(e),
            };
        }
        if s.handle.is_some() || s.bound.is_some() {
            return -errno::EINVAL;
        }
        match s.role {
            Role::Udp => match stack.dgram_bind(s.dgram_proto(), addr, fam, reuse) {
                Ok(h) => {
                    let _ = stack.udp_set_reuseport(h, reuseport);
                    self.adopt(stack, i, h);
                    let local = stack.udp_local_addr(h).unwrap_or(addr);
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
                    self.set_flags(i, FLAG_BOUND, 0);
                    0
                }
                Err(e) => err(e),
            },
            // The port is held now, as Linux's bind takes it: a clash is
            // EADDRINUSE here, and port 0 gets its ephemeral port here.
            Role::Fresh if clash => -errno::EADDRINUSE,
            Role::Fresh => match stack.tcp_bind(addr, fam, (reuse, reuseport), owner) {
                Ok((local, id)) => {
                    s.bound = Some(local);
                    s.binding = Some(id);
                    s.reuseport = reuseport;
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
                    self.set_flags(i, FLAG_BOUND, 0);
                    0
                }
                Err(e) => err(e),
            },
            _ => -errno::EINVAL,
        }
    }

    /// A socket held by several processes (passed or forked before it listened)
    /// is one socket: once another holder's listen made it a listener, fresh slot
    /// `i` names that listener too, whatever it is asked next (a `listen` changes
    /// nothing, an `accept` takes from it, a `connect` is refused), as every
    /// descriptor of the kernel's socket sees it listening. Returns whether it
    /// joined.
    pub(super) fn join_group_listener(&mut self, stack: &mut Stack, i: u32) -> bool {
        let s = self.sock(i);
        if s.role != Role::Fresh {
            return false;
        }
        // (A session holding two copies of the socket names its listener once: the
        // other copy stays fresh, as a client that aliases does not ask.)
        let listener = s
            .group
            .and_then(|g| self.group_listener(stack, g))
            .filter(|&h| !self.holds(h));
        let Some(h) = listener else {
            return false;
        };
        let s = self.sock(i);
        unbind(stack, s);
        s.role = Role::Listener;
        self.hold_shared(i, h);
        if let Ok(local) = stack.tcp_local_addr(h) {
            self.mem
                .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
        }
        self.set_flags(i, FLAG_BOUND, 0);
        self.refresh(stack, i);
        self.joined.push(h);
        true
    }

    pub(super) fn op_listen(&mut self, stack: &mut Stack, i: u32, backlog: u64, fam: u64) -> i64 {
        let s = self.sock(i);
        if s.role == Role::Listener {
            return 0;
        }
        if s.role != Role::Fresh {
            return -errno::EINVAL;
        }
        // (A group that listens elsewhere made this slot its listener already:
        // `join_group_listener`, before every call on a slot.)
        // Unbound: the wildcard of the socket's family (an AF_INET6 socket's is `::`).
        let any = if fam & FAM_V6 != 0 {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let addr = s.bound.unwrap_or_else(|| any.parse().expect("addr"));
        let reuseport = s.reuseport;
        if self
            .elsewhere
            .as_ref()
            .is_some_and(|e| e.clash(addr, families(fam), reuseport))
        {
            return -errno::EADDRINUSE;
        }
        let s = self.sock(i);
        unbind(stack, s);
        let max = self.limits.max_backlog.max(1);
        if backlog > max as u64 {
            self.stats.quota_backlog += 1;
        }
        let backlog = backlog.clamp(1, max as u64) as usize;
        let cfg = stack.tcp_config().clone();
        match stack.tcp_listen_reuseport(addr, backlog, cfg, families(fam), reuseport) {
            Ok(h) => {
                self.sock(i).role = Role::Listener;
                for f in [IpFamily::V4, IpFamily::V6] {
                    let ip = self.sock(i).tcp_ip[f.index()];
                    if ip != Default::default() {
                        let _ = stack.tcp_set_ip_opts(h, f, ip);
                    }
                }
                self.adopt(stack, i, h);
                if let Ok(local) = stack.tcp_local_addr(h) {
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
                }
                self.set_flags(i, FLAG_BOUND, 0);
                if let Some(g) = self.sock(i).group {
                    self.found_group_listener(stack, i, g, h);
                }
                0
            }
            Err(e) => err(e),
        }
    }

    pub(super) fn op_accept(&mut self, stack: &mut Stack, i: u32) -> i64 {
        let Some(h) = self
            .sock(i)
            .handle
            .filter(|_| self.sock(i).role == Role::Listener)
        else {
            return -errno::EINVAL;
        };
        // A slot first: a connection taken from the accept queue must have a home.
        if self.free.is_empty() {
            self.stats.quota_sockets += 1;
            return -errno::EMFILE;
        }
        let child = match stack.tcp_accept(h) {
            Ok(c) => c,
            Err(e) => {
                self.refresh(stack, i);
                return err(e);
            }
        };
        if self.sock(i).shared {
            self.touched.push(h);
        }
        let j = self
            .new_slot(KIND_TCP, Role::Conn)
            .expect("a slot was free");
        // The stack's child took the listener's IP fields; so does its slot.
        self.sock(j).tcp_ip = self.sock(i).tcp_ip;
        self.adopt(stack, j, child);
        if let Ok(l) = stack.tcp_local_addr(child) {
            self.mem
                .set_slot_addr(j, slot::LOCAL, &SockAddr::from_std(l));
        }
        if let Ok(p) = stack.tcp_peer_addr(child) {
            self.mem
                .set_slot_addr(j, slot::PEER, &SockAddr::from_std(p));
        }
        self.refresh(stack, j);
        self.refresh(stack, i);
        j as i64
    }

    /// Slot `i` became the active open `h` to `peer`: a connection, with its
    /// addresses and readiness in the slot.
    fn connecting(&mut self, stack: &mut Stack, i: u32, h: SocketHandle, peer: &SockAddr) {
        self.sock(i).role = Role::Conn;
        self.adopt(stack, i, h);
        if let Some(n) = self.sock(i).syn_retries {
            let _ = stack.tcp_set_syn_retries(h, n);
        }
        if let Ok(l) = stack.tcp_local_addr(h) {
            self.mem
                .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
        }
        self.mem.set_slot_addr(i, slot::PEER, peer);
        self.refresh(stack, i);
    }

    /// A Fast Open connect (see `op::CONNECT`): the SYN takes what it can of the
    /// bytes staged in the send ring; the rest are dropped.
    pub(super) fn op_connect_fastopen(&mut self, stack: &mut Stack, i: u32, a: SockAddr) -> i64 {
        let Some(remote) = a.to_std() else {
            return -errno::EINVAL;
        };
        let chunk = self.limits.chunk;
        let s = self.sock(i);
        if s.kind != KIND_TCP || s.role != Role::Fresh {
            return -errno::EINVAL;
        }
        if s.handle.is_some() {
            return -errno::EISCONN;
        }
        let staged = s.tx.available().unwrap_or(0).min(chunk);
        let mut data = vec![0u8; staged];
        let got = s.tx.read(&mut data);
        data.truncate(got);
        let rest = s.tx.available().unwrap_or(0);
        s.tx.skip(rest);
        s.tx.release();
        let cfg = connect_config(stack, s.connect_mss);
        unbind(stack, s);
        let ip = s.tcp_ip[IpFamily::of(remote.ip()).index()];
        match stack.tcp_connect_fastopen_with(s.bound, remote, &data, cfg, ip) {
            Ok((h, q)) => {
                self.sock(i).written += q as u64;
                self.connecting(stack, i, h, &a);
                q as i64
            }
            Err(StackError::WrongType) => -errno::EOPNOTSUPP,
            Err(e) => err(e),
        }
    }

    pub(super) fn op_connect(&mut self, stack: &mut Stack, i: u32, a: SockAddr) -> i64 {
        if a.family == AF_UNSPEC {
            return self.disconnect(stack, i);
        }
        let Some(remote) = a.to_std() else {
            return -errno::EINVAL;
        };
        let s = self.sock(i);
        match s.role {
            Role::Fresh => {
                if s.handle.is_some() {
                    return -errno::EISCONN;
                }
                let cfg = connect_config(stack, s.connect_mss);
                unbind(stack, s);
                let ip = s.tcp_ip[IpFamily::of(remote.ip()).index()];
                match stack.tcp_connect_with(s.bound, remote, cfg, ip) {
                    Ok(h) => {
                        self.connecting(stack, i, h, &a);
                        0
                    }
                    Err(e) => err(e),
                }
            }
            Role::Conn => -errno::EISCONN,
            Role::Listener => -errno::EINVAL,
            Role::Udp => {
                let h = match s.handle {
                    Some(h) => h,
                    None => {
                        let any: SocketAddr = if remote.is_ipv4() {
                            "0.0.0.0:0".parse().expect("addr")
                        } else {
                            "[::]:0".parse().expect("addr")
                        };
                        match stack.dgram_bind(s.dgram_proto(), any, Families::Both, false) {
                            Ok(h) => {
                                self.adopt(stack, i, h);
                                self.set_flags(i, FLAG_BOUND, 0);
                                h
                            }
                            Err(e) => return err(e),
                        }
                    }
                };
                match stack.udp_connect(h, remote) {
                    Ok(()) => {
                        if let Ok(l) = stack.udp_local_addr(h) {
                            self.mem
                                .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                        }
                        self.mem.set_slot_addr(i, slot::PEER, &a);
                        self.set_flags(i, FLAG_CONNECTED, 0);
                        0
                    }
                    Err(e) => err(e),
                }
            }
        }
    }

    /// `connect` to `AF_UNSPEC`: a UDP socket forgets its peer (and an address the
    /// connect chose); a TCP socket that never connected has nothing to dissolve.
    /// Linux aborts a connected TCP socket and lets it connect again; usnet's
    /// sockets do not come back from a connection, so that is `EOPNOTSUPP`.
    fn disconnect(&mut self, stack: &mut Stack, i: u32) -> i64 {
        let s = self.sock(i);
        match (s.role, s.handle) {
            (Role::Udp, Some(h)) => {
                if let Err(e) = stack.udp_disconnect(h) {
                    return err(e);
                }
                if let Ok(l) = stack.udp_local_addr(h) {
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                }
                self.mem.set_slot_addr(i, slot::PEER, &SockAddr::default());
                self.set_flags(i, 0, FLAG_CONNECTED);
                0
            }
            (Role::Udp, None) | (Role::Fresh, None) => 0,
            (Role::Listener, _) => -errno::EINVAL,
            _ => -errno::EOPNOTSUPP,
        }
    }

    pub(super) fn op_shutdown(&mut self, stack: &mut Stack, i: u32, how: u64) -> i64 {
        if !matches!(how, SHUT_RD | SHUT_WR | SHUT_RDWR) {
            return -errno::EINVAL;
        }
        let s = self.sock(i);
        if s.role != Role::Conn || s.handle.is_none() {
            return -errno::ENOTCONN;
        }
        if how != SHUT_RD {
            s.shut_wr = true;
            self.activate(i);
            self.drain_tx(stack, i);
        }
        if how != SHUT_WR {
            self.set_flags(i, FLAG_RX_EOF, 0);
        }
        0
    }

    pub(super) fn op_close(&mut self, stack: &mut Stack, i: u32) -> i64 {
        self.sock(i).closing = true;
        self.end_direct_rx(stack, i);
        self.mem
            .slot_word(i, slot::STATE)
            .store(SLOT_CLOSING, Release);
        // What the send ring holds still goes out, then the socket closes.
        self.activate(i);
        self.drain_tx(stack, i);
        0
    }
}

/// A bound TCP socket that listens, connects or closes lets go of the port hold
/// `bind` took (the listener or connection holds the port from then on).
pub(super) fn unbind(stack: &mut Stack, s: &mut SessionSocket) {
    if let (Some(id), Some(b)) = (s.binding.take(), s.bound) {
        stack.tcp_unbind(b.port(), id);
    }
}

/// The stack's TCP template for an active open, its MSS capped by the TCP_MAXSEG
/// set before `connect`.
fn connect_config(stack: &Stack, mss: Option<u16>) -> usnet_stack::TcpConfig {
    let mut cfg = stack.tcp_config().clone();
    if let Some(m) = mss {
        cfg.mss = cfg.mss.min(m);
    }
    cfg
}

/// The families of a BIND's or LISTEN's argument (`FAM_V4 | FAM_V6`; 0: both).
pub(super) fn families(f: u64) -> Families {
    match f & (FAM_V4 | FAM_V6) {
        FAM_V4 => Families::V4,
        FAM_V6 => Families::V6,
        _ => Families::Both,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::*;

    use usnet_session_abi::{
        errno, op, slot, SockAddr, FLAG_BOUND, FLAG_CONNECTED, FLAG_RX_EOF, KIND_TCP, KIND_UDP,
        SHUT_WR, SLOT_FREE,
    };

    use crate::fuzzing::{Harness, ADDR};

    const TCP: [u64; 6] = [KIND_TCP, 0, 0, 0, 0, 0];

    fn at(port: u16) -> [u64; 6] {
        let a = SockAddr::from_std((ADDR, port).into()).to_args();
        [a[0], a[1], a[2], a[3], 0, 0]
    }

    fn flags(h: &Harness, i: u32) -> u32 {
        h.mem().slot_word(i, slot::FLAGS).load(Acquire)
    }

    #[test]
    fn a_second_bind_to_a_held_port_is_eaddrinuse_until_the_holder_closes() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, TCP), 0);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 1);
        assert_eq!(h.call(op::BIND, 0, at(7100)), 0);
        assert_ne!(flags(&h, 0) & FLAG_BOUND, 0);
        assert_eq!(
            h.mem().slot_addr(0, slot::LOCAL).to_std(),
            Some((ADDR, 7100).into())
        );
        assert_eq!(h.call(op::BIND, 1, at(7100)), -errno::EADDRINUSE);
        assert_eq!(h.call(op::BIND, 0, at(7101)), -errno::EINVAL, "bound twice");
        // Closing the holder lets go of the port.
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert_eq!(h.call(op::BIND, 1, at(7100)), 0);
        h.finish();
    }

    #[test]
    fn a_call_on_a_slot_that_is_not_open_is_ebadf_and_counted() {
        let mut h = Harness::new();
        let listen = [4, 0, 0, 0, 0, 0];
        assert_eq!(h.call(op::LISTEN, 3, listen), -errno::EBADF, "never opened");
        assert_eq!(
            h.call(op::LISTEN, 99, listen),
            -errno::EBADF,
            "no such slot"
        );
        assert_eq!(h.call(op::SOCKET, 0, TCP), 0);
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert_eq!(h.mem().slot_word(0, slot::STATE).load(Acquire), SLOT_FREE);
        assert_eq!(h.call(op::LISTEN, 0, listen), -errno::EBADF, "closed");
        assert_eq!(h.call(op::MAX + 1, 0, [0; 6]), -errno::ENOSYS);
        assert_eq!(h.parts(1).0.stats.bad_requests, 4);
        h.finish();
    }

    #[test]
    fn sockets_past_the_quota_are_emfile() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [9, 0, 0, 0, 0, 0]), -errno::EINVAL);
        for i in 0..4 {
            let kind = if i % 2 == 0 { KIND_TCP } else { KIND_UDP };
            assert_eq!(h.call(op::SOCKET, 0, [kind, 0, 0, 0, 0, 0]), i);
        }
        assert_eq!(h.call(op::SOCKET, 0, TCP), -errno::EMFILE);
        assert_eq!(h.parts(1).0.stats.quota_sockets, 1);
        h.finish();
    }

    #[test]
    fn listen_connect_and_accept_make_a_connection_with_its_addresses() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, TCP), 0);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 1);
        assert_eq!(
            h.call(op::ACCEPT, 0, [0; 6]),
            -errno::EINVAL,
            "not listening"
        );
        assert_eq!(h.call(op::BIND, 0, at(7102)), 0);
        assert_eq!(h.call(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]), 0);
        assert_eq!(h.call(op::ACCEPT, 0, [0; 6]), -errno::EAGAIN, "nobody yet");
        assert_eq!(h.call(op::CONNECT, 1, at(7102)), 0);
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(h.call(op::ACCEPT, 0, [0; 6]), 2);
        h.turn();
        let local = |h: &Harness, i| h.mem().slot_addr(i, slot::LOCAL).to_std();
        let peer = |h: &Harness, i| h.mem().slot_addr(i, slot::PEER).to_std();
        assert_eq!(local(&h, 2), Some((ADDR, 7102).into()));
        assert_eq!(peer(&h, 1), Some((ADDR, 7102).into()));
        assert_eq!(peer(&h, 2), local(&h, 1));
        for i in [1, 2] {
            assert_ne!(flags(&h, i) & FLAG_CONNECTED, 0, "slot {i} connected");
        }
        assert_eq!(h.call(op::CONNECT, 1, at(7102)), -errno::EISCONN);
        assert_eq!(h.call(op::LISTEN, 1, [4, 0, 0, 0, 0, 0]), -errno::EINVAL);
        h.finish();
    }

    #[test]
    fn shutdown_checks_its_argument_and_role_then_ends_the_stream() {
        let mut h = Harness::new();
        h.connected_pair(7103);
        assert_eq!(h.call(op::SOCKET, 0, TCP), 3);
        assert_eq!(
            h.call(op::SHUTDOWN, 3, [SHUT_WR, 0, 0, 0, 0, 0]),
            -errno::ENOTCONN
        );
        assert_eq!(h.call(op::SHUTDOWN, 1, [7, 0, 0, 0, 0, 0]), -errno::EINVAL);
        assert_eq!(flags(&h, 2) & FLAG_RX_EOF, 0);
        assert_eq!(h.call(op::SHUTDOWN, 1, [SHUT_WR, 0, 0, 0, 0, 0]), 0);
        for _ in 0..4 {
            h.turn();
        }
        assert_ne!(flags(&h, 2) & FLAG_RX_EOF, 0, "the peer saw the FIN");
        h.finish();
    }
}
