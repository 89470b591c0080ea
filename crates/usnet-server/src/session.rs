//! One client session at the server: its shared memory, the server's ends of its rings,
//! and the server-side state of each of its sockets. Everything the client wrote is
//! checked here: opcodes, slot numbers and generations, addresses, ring counters and
//! record lengths. A bad value is answered with an errno or counted and dropped; it
//! never reaches the stack unchecked.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

use usnet_abi::{
    errno, op, opt, slot, tcp_info, Completion, Request, SockAddr, BIND_REUSE, CONNECT_FASTOPEN,
    FAM_V4, FAM_V6, FLAG_ACCEPTABLE, FLAG_BOUND, FLAG_CONNECTED, FLAG_ERROR, FLAG_ERRQUEUE,
    FLAG_HUP, FLAG_NOT_RECEIVER, FLAG_RX_EOF, FLAG_SHARED, FLAG_SNDBUF, FLAG_WRITABLE,
    FLAG_WR_SHUT, KIND_TCP, KIND_UDP, RECORD_HEADER, RECORD_PAD, SEND_ASYNC, SEND_EOR, SEND_MORE,
    SHUT_RD, SHUT_RDWR, SHUT_WR, SLOT_CLOSING, SLOT_FREE, SLOT_OPEN, STAMP_TIMED, STAMP_TSONLY,
};
use usnet_session::ctl::msg::{ClientRow, ZcPortStat};
use usnet_session::Session;
use usnet_shm::spsc::{Consumer, Producer};
use usnet_shm::{ByteConsumer, ByteProducer, FutexBell};
use usnet_stack::{CcAlgorithm, Families, Keepalive, Owner, SocketHandle, Stack, StackError};

use crate::ServerLimits;

/// What a session's socket is at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A TCP socket before listen or connect (maybe bound).
    Fresh,
    Listener,
    Conn,
    Udp,
}

impl Role {
    /// Its number in a claim's slot map (`usnet_abi::role`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Role::Fresh => usnet_abi::role::FRESH,
            Role::Listener => usnet_abi::role::LISTENER,
            Role::Conn => usnet_abi::role::CONN,
            Role::Udp => usnet_abi::role::UDP,
        }
    }
}

/// What a departed client leaves for the loop ([`ServerSession::depart`]).
pub struct Departure {
    /// The stack sockets it shared with other sessions: the stream bytes it left
    /// unread (for the next receiver), and whether it still held the socket when it
    /// went (a last holder that died resets; one that had closed it closes).
    pub shared: Vec<(SocketHandle, Vec<u8>, bool)>,
    /// Connections it left still draining their send rings: the session must be
    /// kept ([`ServerSession::drain_closing`]) until they are done.
    pub draining: bool,
}

struct Sock {
    kind: u64,
    role: Role,
    handle: Option<SocketHandle>,
    /// `bind` before `listen`/`connect` (TCP) records the address here.
    bound: Option<SocketAddr>,
    /// The stack's hold on that port until the socket listens, connects or closes
    /// (`Stack::tcp_bind`).
    binding: Option<u64>,
    /// TCP_MAXSEG set before `connect`: the SYN's MSS is at most this.
    connect_mss: Option<u16>,
    /// TCP_SYNCNT set before `connect`.
    syn_retries: Option<u32>,
    rx: ByteProducer,
    tx: ByteConsumer,
    /// The send ring may hold bytes: the server looks at it every turn.
    tx_active: bool,
    /// SO_ZEROCOPY: `slot::TX_ACKED` is kept current.
    zc_watch: bool,
    /// The program set `SO_SNDBUF` or `TCP_NOTSENT_LOWAT`: its writes meet the
    /// stack's send buffer (`FLAG_SNDBUF`, `op::SEND`).
    sndbuf_set: bool,
    /// A write went through `op::SEND` (`MSG_MORE`, `MSG_EOR`, or bounded):
    /// `FLAG_WRITABLE` is kept current, since such a writer waits for it.
    send_used: bool,
    /// Bytes of the send ring that `op::SEND` dropped (the stack refused them),
    /// as (ring position, length), while SO_ZEROCOPY maps the stack's
    /// acknowledged bytes back to ring positions.
    tx_gaps: TxGaps,
    /// Bytes this connection's stack socket took from the program (what
    /// `SO_TIMESTAMPING` keys and marks count in).
    written: u64,
    /// `SO_TIMESTAMPING`: transmit reports wait here for `op::ERRQUEUE`.
    stamps: Option<Box<usnet_stack::tx_stamps::TxStamps>>,
    /// The receive ring was full: wait for the client's RX_KICK.
    rx_blocked: bool,
    /// The client closed it: send what the send ring holds, then close.
    closing: bool,
    /// `shutdown(SHUT_WR)` waits for the send ring to drain.
    shut_wr: bool,
    /// End of stream reached and told to the client.
    eof: bool,
    flags: u32,
    /// A UDP datagram taken from the send ring that the stack refused for now.
    pending_dgram: Option<(Vec<u8>, Option<SocketAddr>)>,
    /// The stack socket is held by several sessions (after a fork): it belongs to
    /// [`SHARED`], and the loop's table of shared sockets names every holder.
    shared: bool,
    /// Received bytes come to this slot (always, unless the socket is shared and
    /// another holder has the stream: see `Loop::release_shared`).
    receiver: bool,
    /// Stream bytes to hand over before what the stack holds: what the previous
    /// receiver left unread in its ring when it let go.
    carry: Vec<u8>,
    /// Multicast options set on a UDP socket before the stack socket existed:
    /// applied, in order, when it is made (bind, connect, first send).
    deferred: Vec<[u64; 6]>,
}

/// The stack owner of sockets held by several sessions: no session's death closes
/// them; the loop closes one when its last holder lets go.
pub(crate) const SHARED: Owner = Owner(u32::MAX);

/// A socket pinned for a forked child (`Loop::pin`): what the child's session needs
/// to hold it too.
#[derive(Debug, Clone)]
pub(crate) struct Pinned {
    /// Its slot in the parent's session (the child's descriptors name it so).
    pub parent_slot: u32,
    /// The parent's tag for it ([`slot::TAG`], the client's word), reported back in
    /// the claim so a program after `exec` can find its descriptors.
    pub tag: u32,
    pub kind: u64,
    pub role: Role,
    pub handle: Option<SocketHandle>,
    pub bound: Option<SocketAddr>,
}

/// Counters of one session (shown by `usnet stat`): the control protocol's type.
pub use usnet_session::ctl::msg::SessionStats;

pub(crate) struct ServerSession {
    pub id: u32,
    pub pid: u32,
    pub command: String,
    pub mem: Session,
    sq: Consumer,
    cq: Producer,
    bell: FutexBell,
    socks: Vec<Option<Sock>>,
    free: Vec<u32>,
    by_handle: HashMap<SocketHandle, u32>,
    /// Slots whose send ring the server looks at each turn.
    active: Vec<u32>,
    /// Connections with SO_ZEROCOPY on (`slot::TX_ACKED` published every pass).
    zc_watched: Vec<u32>,
    /// Connections with SO_TIMESTAMPING transmit reports (looked at every pass).
    ts_watched: Vec<u32>,
    /// Slots whose receive ring has room while the stack still holds bytes for them
    /// (the per-turn budget ran out): refreshed again next turn.
    rx_again: Vec<u32>,
    /// Completions that did not fit the completion ring (bounded by the SQ budget).
    backlog: std::collections::VecDeque<Completion>,
    /// Something changed for the client this turn: notify its bell.
    pub dirty: bool,
    pub stats: SessionStats,
    scratch: Vec<u8>,
    limits: ServerLimits,
    /// Shared stack sockets whose slot this session closed, with the bytes its
    /// receive ring still held: the loop passes them on (or closes the socket).
    pub(crate) released: Vec<(SocketHandle, Vec<u8>)>,
    /// Shared stack sockets whose readiness a call of this session changed (an
    /// accept): the loop refreshes the other holders' view.
    pub(crate) touched: Vec<SocketHandle>,
    /// Shared streams this session reads without being their receiver
    /// (`op::RX_WANT`): the loop decides whether they come here.
    pub(crate) wants: Vec<SocketHandle>,
    /// A bind, listen or close happened (a sharded server rereads its ports).
    pub(crate) ports_changed: bool,
    /// A sharded server's listeners on the other shards (`None`: one shard): a
    /// TCP bind or listen that would clash with one fails as it would in one stack.
    pub(crate) elsewhere: Option<crate::Elsewhere>,
    /// The session's zero-copy port, if the client opened one.
    pub(crate) zc: Option<crate::zc::ServerZc>,
    /// Serving this session panicked: it is cut off without running its requests
    /// again (see [`ServerSession::serve_contained`]).
    pub(crate) broken: bool,
    /// Tests: the next serve panics, as a bug reached by this client's requests would.
    #[cfg(test)]
    pub(crate) panic_next: bool,
}

fn err(e: StackError) -> i64 {
    -(e.errno() as i64)
}

impl ServerSession {
    pub fn new(
        id: u32,
        pid: u32,
        command: String,
        mem: Session,
        limits: ServerLimits,
    ) -> std::io::Result<ServerSession> {
        let region = mem.region().clone();
        let sq = Consumer::attach_discarding(region.clone(), mem.sq())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let cq =
            Producer::attach(region, mem.cq()).map_err(|e| std::io::Error::other(e.to_string()))?;
        let n = mem.geometry().max_sockets;
        let bell = mem.client_bell();
        Ok(ServerSession {
            id,
            pid,
            command,
            sq,
            cq,
            bell,
            socks: (0..n).map(|_| None).collect(),
            free: (0..n).rev().collect(),
            by_handle: HashMap::new(),
            active: Vec::new(),
            zc_watched: Vec::new(),
            ts_watched: Vec::new(),
            rx_again: Vec::new(),
            backlog: Default::default(),
            dirty: false,
            stats: SessionStats::default(),
            scratch: Vec::new(),
            limits,
            mem,
            released: Vec::new(),
            touched: Vec::new(),
            wants: Vec::new(),
            ports_changed: false,
            elsewhere: None,
            zc: None,
            broken: false,
            #[cfg(test)]
            panic_next: false,
        })
    }

    /// [`ServerSession::serve`] and [`ServerSession::drain_all`], with a panic kept
    /// inside this session: a broken invariant that one client's requests reach (a
    /// bug) ends that client's session, not the server and every other client's
    /// connections. `Err` carries the panic's message; the session is then marked
    /// `broken` and its owner removes it. Best effort, as a kernel oops that kills one
    /// process is: the stack's state is as the panic left it, so the panic is
    /// reported loudly (`sessions_broken` in `usnet stat`, a line on stderr).
    pub fn serve_contained(&mut self, stack: &mut Stack, budget: usize) -> Result<usize, String> {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let n = self.serve(stack, budget);
            self.drain_all(stack);
            n
        }));
        r.map_err(|p| {
            self.broken = true;
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into())
        })
    }

    pub fn owner(&self) -> Owner {
        Owner(self.id)
    }

    /// Whether one of this session's slots holds stack socket `h`.
    pub fn holds(&self, h: SocketHandle) -> bool {
        self.by_handle.contains_key(&h)
    }

    pub fn socket_count(&self) -> usize {
        self.socks.iter().filter(|s| s.is_some()).count()
    }

    /// Requests or stream work waiting (the loop must not sleep).
    pub fn has_work(&mut self) -> bool {
        self.zc.as_ref().is_some_and(|z| z.asked())
            || !self.active.is_empty()
            || !self.rx_again.is_empty()
            || !self.backlog.is_empty()
            || self.sq.pending()
    }

    /// Tells the client that something changed: the bell's `seq` always moves (so a
    /// client that read it before looking at its sockets never sleeps through a
    /// change), and a sleeping client is woken.
    pub fn notify(&mut self) {
        if self.dirty {
            self.dirty = false;
            if self.bell.bump_and_notify() {
                self.stats.notifies += 1;
            }
        }
    }

    // ------------------------------------------------------------ requests

    /// Serves up to `budget` requests. Returns how many. A client that does not
    /// read its completions stops being served once [`BACKLOG_MAX`] wait.
    pub fn serve(&mut self, stack: &mut Stack, budget: usize) -> usize {
        #[cfg(test)]
        if std::mem::take(&mut self.panic_next) {
            panic!("injected: a bug reached by this client's requests");
        }
        self.flush_backlog();
        let mut done = 0;
        while done < budget && self.backlog.len() < BACKLOG_MAX {
            let n = match self.sq.available() {
                Ok(0) => break,
                Ok(n) => n,
                Err(_) => {
                    self.stats.corrupt_rings += 1;
                    break;
                }
            };
            let take = n.min((budget - done) as u32);
            for k in 0..take {
                let req = self.mem.read_request(self.sq.slot(k));
                if let Some((result, aux)) = self.call(stack, &req) {
                    self.complete(Completion {
                        tag: req.tag,
                        result,
                        aux,
                    });
                }
            }
            self.sq.consume(take);
            self.sq.release();
            done += take as usize;
        }
        done
    }

    fn complete(&mut self, c: Completion) {
        self.dirty = true;
        if !self.backlog.is_empty() {
            self.backlog.push_back(c);
            return;
        }
        match self.cq.reserve() {
            Some(k) => {
                self.mem.write_completion(k, &c);
                self.cq.commit();
                self.cq.publish();
            }
            None => self.backlog.push_back(c),
        }
    }

    fn flush_backlog(&mut self) {
        while let Some(c) = self.backlog.front().copied() {
            let Some(k) = self.cq.reserve() else {
                break;
            };
            self.mem.write_completion(k, &c);
            self.cq.commit();
            self.backlog.pop_front();
        }
        if self.cq.publish() {
            self.dirty = true;
        }
    }

    /// Runs one request; `None` for the kicks, which complete nothing.
    fn call(&mut self, stack: &mut Stack, req: &Request) -> Option<(i64, [u64; 2])> {
        self.stats.calls += 1;
        let ok = |v: i64| Some((v, [0, 0]));
        if req.op > op::MAX {
            self.stats.bad_requests += 1;
            return ok(-errno::ENOSYS);
        }
        if matches!(req.op, op::BIND | op::LISTEN | op::CLOSE | op::ZC_LISTEN) {
            self.ports_changed = true;
        }
        match req.op {
            op::NOP => ok(0),
            op::SOCKET => ok(self.op_socket(req.args[0])),
            op::ZC_CLOSE => match self.zc.take() {
                Some(port) => {
                    port.close(stack);
                    ok(0)
                }
                None => ok(-errno::ENXIO),
            },
            op::ZC_LISTEN | op::ZC_CONNECT => {
                let owner = self.owner();
                let Some(port) = self.zc.as_mut() else {
                    return ok(-errno::ENXIO);
                };
                let Some(addr) = SockAddr::from_args(&req.args).to_std() else {
                    return ok(-errno::EINVAL);
                };
                let made = if req.op == op::ZC_LISTEN {
                    let backlog = (req.args[4] as usize).clamp(1, self.limits.max_backlog);
                    port.listen(stack, owner, addr, backlog)
                } else {
                    port.connect(stack, owner, addr)
                };
                match made {
                    Ok(h) => Some((0, [h.raw(), 0])),
                    Err(e) => ok(err(e)),
                }
            }
            op::RX_WANT => {
                self.stats.calls -= 1;
                if let Some(i) = self.slot_of(req) {
                    if let Some(s) = self.socks[i as usize].as_ref() {
                        if let (true, false, Role::Conn, Some(h)) =
                            (s.shared, s.receiver, s.role, s.handle)
                        {
                            self.wants.push(h);
                        }
                    }
                }
                None
            }
            op::TX_KICK | op::RX_KICK => {
                self.stats.calls -= 1;
                self.stats.kicks += 1;
                if let Some(i) = self.slot_of(req) {
                    if req.op == op::TX_KICK {
                        self.activate(i);
                    } else if let Some(s) = self.socks[i as usize].as_mut() {
                        s.rx_blocked = false;
                        self.refresh(stack, i);
                    }
                }
                None
            }
            _ => {
                let Some(i) = self.slot_of(req) else {
                    self.stats.bad_requests += 1;
                    return ok(-errno::EBADF);
                };
                ok(match req.op {
                    op::BIND => self.op_bind(
                        stack,
                        i,
                        SockAddr::from_args(&req.args),
                        families(req.args[4]),
                        req.args[5] & BIND_REUSE != 0,
                    ),
                    op::LISTEN => self.op_listen(stack, i, req.args[0], req.args[1]),
                    op::ACCEPT => self.op_accept(stack, i),
                    op::CONNECT if req.args[4] & CONNECT_FASTOPEN != 0 => {
                        self.op_connect_fastopen(stack, i, SockAddr::from_args(&req.args))
                    }
                    op::CONNECT => self.op_connect(stack, i, SockAddr::from_args(&req.args)),
                    op::SHUTDOWN => self.op_shutdown(stack, i, req.args[0]),
                    op::CLOSE => self.op_close(stack, i),
                    op::SETSOCKOPT => self.op_setsockopt(stack, i, &req.args),
                    op::SEND => {
                        let [start, end, flags, ..] = req.args;
                        self.op_send(stack, i, start, end, flags)
                    }
                    op::ERRQUEUE => return self.op_errqueue(stack, i),
                    op::GETSOCKOPT => self.op_getsockopt(stack, i, &req.args),
                    _ => -errno::ENOSYS,
                })
            }
        }
    }

    /// The slot a request names, if it is one of this session's open sockets.
    fn slot_of(&self, req: &Request) -> Option<u32> {
        let i = req.slot;
        if !self.mem.valid_slot(i) {
            return None;
        }
        let s = self.socks[i as usize].as_ref()?;
        (!s.closing).then_some(i)
    }

    fn sock(&mut self, i: u32) -> &mut Sock {
        self.socks[i as usize].as_mut().expect("checked by slot_of")
    }

    /// Takes a free slot and readies its rings. `None` when the quota is reached.
    fn new_slot(&mut self, kind: u64, role: Role) -> Option<u32> {
        let Some(i) = self.free.pop() else {
            self.stats.quota_sockets += 1;
            return None;
        };
        self.mem.reset_slot(i);
        let region = self.mem.region().clone();
        let rx = ByteProducer::attach(region.clone(), self.mem.rx_ring(i)).expect("layout");
        let tx = ByteConsumer::attach(region, self.mem.tx_ring(i)).expect("layout");
        self.mem
            .slot_word(i, slot::KIND)
            .store(kind as u32, Relaxed);
        // The server is not looking at the send ring yet: the first bytes kick it.
        self.mem.slot_word(i, slot::TX_ARMED).store(1, Relaxed);
        self.mem.slot_word(i, slot::STATE).store(SLOT_OPEN, Release);
        self.socks[i as usize] = Some(Sock {
            kind,
            role,
            handle: None,
            bound: None,
            binding: None,
            connect_mss: None,
            syn_retries: None,
            rx,
            tx,
            tx_active: false,
            zc_watch: false,
            sndbuf_set: false,
            send_used: false,
            tx_gaps: Default::default(),
            written: 0,
            stamps: None,
            rx_blocked: false,
            closing: false,
            shut_wr: false,
            eof: false,
            flags: 0,
            pending_dgram: None,
            shared: false,
            receiver: true,
            carry: Vec::new(),
            deferred: Vec::new(),
        });
        Some(i)
    }

    fn adopt(&mut self, stack: &mut Stack, i: u32, h: SocketHandle) {
        let _ = stack.set_owner(h, self.owner());
        self.by_handle.insert(h, i);
        let s = self.sock(i);
        s.handle = Some(h);
        apply_deferred(stack, s, h);
    }

    fn set_flags(&mut self, i: u32, set: u32, clear: u32) {
        let s = self.sock(i);
        let f = (s.flags | set) & !clear;
        if f != s.flags {
            s.flags = f;
            self.mem.slot_word(i, slot::FLAGS).store(f, Release);
            self.bump(i);
        }
    }

    fn bump(&mut self, i: u32) {
        self.mem.slot_word(i, slot::EVENTS).fetch_add(1, Release);
        self.dirty = true;
    }

    fn op_socket(&mut self, kind: u64) -> i64 {
        let role = match kind {
            KIND_TCP => Role::Fresh,
            KIND_UDP => Role::Udp,
            _ => return -errno::EINVAL,
        };
        match self.new_slot(kind, role) {
            Some(i) => i as i64,
            None => -errno::EMFILE,
        }
    }

    fn op_bind(
        &mut self,
        stack: &mut Stack,
        i: u32,
        a: SockAddr,
        fam: Families,
        reuse: bool,
    ) -> i64 {
        let Some(addr) = a.to_std() else {
            return -errno::EINVAL;
        };
        let owner = self.owner();
        let clash = self.elsewhere.as_ref().is_some_and(|e| e.clash(addr, fam));
        let s = self.sock(i);
        if s.handle.is_some() || s.bound.is_some() {
            return -errno::EINVAL;
        }
        match s.role {
            Role::Udp => match stack.udp_bind_reuse(addr, fam, reuse) {
                Ok(h) => {
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
            Role::Fresh => match stack.tcp_bind(addr, fam, reuse, owner) {
                Ok((local, id)) => {
                    s.bound = Some(local);
                    s.binding = Some(id);
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

    fn op_listen(&mut self, stack: &mut Stack, i: u32, backlog: u64, fam: u64) -> i64 {
        let s = self.sock(i);
        if s.role == Role::Listener {
            return 0;
        }
        if s.role != Role::Fresh {
            return -errno::EINVAL;
        }
        // Unbound: the wildcard of the socket's family (an AF_INET6 socket's is `::`).
        let any = if fam & FAM_V6 != 0 {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let addr = s.bound.unwrap_or_else(|| any.parse().expect("addr"));
        if self
            .elsewhere
            .as_ref()
            .is_some_and(|e| e.clash(addr, families(fam)))
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
        match stack.tcp_listen_families(addr, backlog, cfg, families(fam)) {
            Ok(h) => {
                self.sock(i).role = Role::Listener;
                self.adopt(stack, i, h);
                if let Ok(local) = stack.tcp_local_addr(h) {
                    self.mem
                        .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(local));
                }
                self.set_flags(i, FLAG_BOUND, 0);
                0
            }
            Err(e) => err(e),
        }
    }

    fn op_accept(&mut self, stack: &mut Stack, i: u32) -> i64 {
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
    fn op_connect_fastopen(&mut self, stack: &mut Stack, i: u32, a: SockAddr) -> i64 {
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
        match stack.tcp_connect_fastopen_with(s.bound, remote, &data, cfg) {
            Ok((h, q)) => {
                self.sock(i).written += q as u64;
                self.connecting(stack, i, h, &a);
                q as i64
            }
            Err(StackError::WrongType) => -errno::EOPNOTSUPP,
            Err(e) => err(e),
        }
    }

    fn op_connect(&mut self, stack: &mut Stack, i: u32, a: SockAddr) -> i64 {
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
                match stack.tcp_connect_with(s.bound, remote, cfg) {
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
                        match stack.udp_bind(any) {
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

    fn op_shutdown(&mut self, stack: &mut Stack, i: u32, how: u64) -> i64 {
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

    fn op_close(&mut self, stack: &mut Stack, i: u32) -> i64 {
        self.sock(i).closing = true;
        self.mem
            .slot_word(i, slot::STATE)
            .store(SLOT_CLOSING, Release);
        // What the send ring holds still goes out, then the socket closes.
        self.activate(i);
        self.drain_tx(stack, i);
        0
    }

    fn op_setsockopt(&mut self, stack: &mut Stack, i: u32, a: &[u64; 6]) -> i64 {
        let (level, name, value) = (a[0], a[1], a[2]);
        let s = self.sock(i);
        let h = s.handle;
        let tcp_conn = s.kind == KIND_TCP && s.role == Role::Conn;
        let r = match (level, name) {
            // Posted by clients without waiting, like lifting a cork (below).
            (opt::IPPROTO_TCP, opt::TCP_NODELAY) if tcp_conn => {
                self.activate(i);
                self.drain_tx(stack, i);
                stack.tcp_set_nodelay(h.expect("conn"), value != 0)
            }
            (opt::IPPROTO_TCP, opt::TCP_NODELAY) => Ok(()),
            // What the client wrote before it changed the cork meets the stack
            // first, so the cork holds (or lifting it sends) exactly those bytes, as
            // on the kernel, though clients post the lifting without waiting.
            (opt::IPPROTO_TCP, opt::TCP_CORK) if tcp_conn => {
                self.activate(i);
                self.drain_tx(stack, i);
                let r = stack.tcp_set_cork(h.expect("conn"), value != 0);
                // The bytes the client held back for this cork may go now (the
                // turn's drain moves them).
                if a[3] != 0 {
                    let _ = self.mem.slot_u64(i, slot::TX_HOLD).compare_exchange(
                        a[3],
                        0,
                        std::sync::atomic::Ordering::AcqRel,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    self.activate(i);
                }
                r
            }
            (opt::IPPROTO_TCP, opt::TCP_CORK) => Ok(()),
            (opt::SOL_SOCKET, opt::SO_KEEPALIVE) if tcp_conn => {
                // args[3..6]: TCP_KEEPIDLE, TCP_KEEPINTVL (s), TCP_KEEPCNT; 0: default.
                let d = Keepalive::default();
                let secs = |v: u64, d: Duration| {
                    if v == 0 {
                        d
                    } else {
                        Duration::from_secs(v.min(32767))
                    }
                };
                let ka = Keepalive {
                    idle: secs(a[3], d.idle),
                    interval: secs(a[4], d.interval),
                    count: if a[5] == 0 {
                        d.count
                    } else {
                        a[5].min(127) as u32
                    },
                };
                stack.tcp_set_keepalive(h.expect("conn"), (value != 0).then_some(ka))
            }
            (opt::IPPROTO_TCP, opt::TCP_USER_TIMEOUT) => match (s.role, h) {
                (Role::Conn | Role::Listener, Some(h)) if s.kind == KIND_TCP => {
                    let t = (value != 0).then(|| Duration::from_millis(value.min(u32::MAX as u64)));
                    stack.tcp_set_user_timeout(h, t)
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_CONGESTION) if tcp_conn => {
                let cc = match value {
                    opt::CC_CUBIC => CcAlgorithm::Cubic,
                    opt::CC_RENO => CcAlgorithm::NewReno,
                    opt::CC_BBR => CcAlgorithm::Bbr,
                    _ => return -errno::ENOENT,
                };
                stack.tcp_set_congestion_control(h.expect("conn"), cc)
            }
            (opt::SOL_SOCKET, opt::SO_MAX_PACING_RATE) if tcp_conn => stack
                .tcp_set_max_pacing_rate(h.expect("conn"), (value != u64::MAX).then_some(value)),
            (opt::SOL_SOCKET, opt::SO_TIMESTAMPING) => {
                let acked = match (s.role, h) {
                    (Role::Conn, Some(h)) => match stack.tcp_info(h) {
                        Ok(info) => s.written.saturating_sub(info.send_queued as u64),
                        Err(e) => return err(e),
                    },
                    // OPT_ID needs a connection (Linux: EINVAL in CLOSE and LISTEN).
                    _ if value & u64::from(usnet_stack::tx_stamps::OPT_ID) != 0 => {
                        return -errno::EINVAL
                    }
                    _ => 0,
                };
                let written = s.written;
                let st = s.stamps.get_or_insert_with(Default::default);
                let r = st.set(value.min(u64::from(u32::MAX)) as u32, acked, written);
                if st.wants_tx() && !self.ts_watched.contains(&i) {
                    self.ts_watched.push(i);
                }
                r
            }
            (opt::SOL_SOCKET, opt::SO_ZEROCOPY) => {
                s.zc_watch = value != 0 && tcp_conn;
                if s.zc_watch && !self.zc_watched.contains(&i) {
                    self.zc_watched.push(i);
                }
                Ok(())
            }
            (opt::IPPROTO_TCP, opt::TCP_FASTOPEN) => match (s.role, h) {
                (Role::Listener, Some(h)) => {
                    stack.tcp_set_fastopen(h, value.min(i32::MAX as u64) as usize)
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_FASTOPEN_KEY | opt::TCP_FASTOPEN_KEYS) => {
                match (s.role, h) {
                    (Role::Listener, Some(h)) => {
                        let key = |lo: u64, hi: u64| {
                            let mut k = [0u8; 16];
                            k[..8].copy_from_slice(&lo.to_le_bytes());
                            k[8..].copy_from_slice(&hi.to_le_bytes());
                            k
                        };
                        let backup = (name == opt::TCP_FASTOPEN_KEYS).then(|| key(a[4], a[5]));
                        stack.tcp_set_fastopen_key(h, key(a[2], a[3]), backup)
                    }
                    _ => Ok(()),
                }
            }
            (opt::IPPROTO_TCP, opt::TCP_MAXSEG) => match (s.role, h) {
                // Linux's range: 88..=32767 (0 clears it: nothing to do here).
                (Role::Listener, Some(h)) if (88..=32767).contains(&value) => {
                    stack.tcp_set_listener_mss(h, value as u16)
                }
                (Role::Fresh, _) => {
                    s.connect_mss = (88..=32767).contains(&value).then_some(value as u16);
                    Ok(())
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_SYNCNT) => match (s.role, h) {
                (Role::Fresh, _) => {
                    s.syn_retries = Some(value.clamp(1, 127) as u32);
                    Ok(())
                }
                (Role::Conn, Some(h)) => stack.tcp_set_syn_retries(h, value.clamp(1, 127) as u32),
                _ => Ok(()),
            },
            (opt::IPPROTO_IP, opt::IP_TOS) | (opt::IPPROTO_IPV6, opt::IPV6_TCLASS) if tcp_conn => {
                stack.tcp_set_tos(h.expect("conn"), value as u8)
            }
            (opt::SOL_SOCKET, opt::SO_LINGER) if tcp_conn => {
                // value: seconds, or u64::MAX for "off".
                let l = (value != u64::MAX).then(|| Duration::from_secs(value.min(3600)));
                stack.tcp_set_linger(h.expect("conn"), l)
            }
            (opt::SOL_SOCKET, opt::SO_RCVBUF) => match (s.role, h) {
                (Role::Udp, Some(h)) => {
                    let max = self.limits.max_rcvbuf;
                    if value > max as u64 {
                        self.stats.quota_rcvbuf += 1;
                    }
                    stack.udp_set_recv_buffer(h, value.min(max as u64) as usize)
                }
                _ => Ok(()),
            },
            // The stack's limit behind the shared ring, as Linux's (doubled).
            (opt::SOL_SOCKET, opt::SO_SNDBUF) if tcp_conn => {
                s.sndbuf_set = true;
                stack.tcp_set_send_buffer(
                    h.expect("conn"),
                    usnet_stack::sndbuf_for_option(value.min(i32::MAX as u64) as i32),
                )
            }
            (opt::IPPROTO_TCP, opt::TCP_NOTSENT_LOWAT) if tcp_conn => {
                s.sndbuf_set = true;
                stack.tcp_set_notsent_lowat(h.expect("conn"), value.min(u64::from(u32::MAX)) as u32)
            }
            (opt::IPPROTO_TCP, opt::TCP_NOTSENT_LOWAT) => Ok(()),
            (opt::SOL_SOCKET, opt::SO_SNDBUF | opt::SO_REUSEADDR | opt::SO_KEEPALIVE)
            | (opt::SOL_SOCKET, opt::SO_LINGER) => Ok(()),
            (level, name) if is_mcast_opt(level, name) => match (s.role, h) {
                (Role::Udp, Some(h)) => apply_mcast(stack, h, a),
                (Role::Udp, None) => {
                    // Not in the stack yet: applied when it is.
                    s.deferred.push(*a);
                    Ok(())
                }
                _ => Ok(()),
            },
            (opt::SOL_USNET, opt::USNET_WRITE_PENDING) if tcp_conn => {
                stack.tcp_set_write_pending(h.expect("conn"), value != 0)
            }
            (opt::SOL_USNET, opt::USNET_RX_PRIORITY) => {
                let Some(h) = h.filter(|_| matches!(s.role, Role::Udp | Role::Listener)) else {
                    return -errno::EINVAL;
                };
                let mark = (value != opt::RX_PRIORITY_NONE)
                    .then(|| (value as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32);
                if let Some(p) = mark {
                    // Ranking above its own process is raising a priority.
                    let own = usnet_driver::sched::nice_of(self.pid).map_or(0, |n| -n);
                    if p > own && !usnet_driver::sched::pid_may_raise(self.pid, -p) {
                        return -errno::EPERM;
                    }
                }
                stack.set_socket_priority(h, mark)
            }
            _ => return -errno::ENOPROTOOPT,
        };
        if tcp_conn {
            // SO_SNDBUF and TCP_NOTSENT_LOWAT change how writes meet the stack.
            self.send_flags(stack, i);
        }
        match r {
            Ok(()) => 0,
            Err(e) => err(e),
        }
    }

    fn op_getsockopt(&mut self, stack: &mut Stack, i: u32, a: &[u64; 6]) -> i64 {
        let (level, name) = (a[0], a[1]);
        let ring = self.mem.geometry().ring_bytes as i64;
        let s = self.sock(i);
        let h = s.handle;
        let conn = (s.kind == KIND_TCP && s.role == Role::Conn)
            .then_some(h)
            .flatten();
        match (level, name) {
            (opt::SOL_SOCKET, opt::SO_ERROR) => {
                let e = self.mem.slot_word(i, slot::ERROR).swap(0, AcqRel);
                e as i64
            }
            (opt::SOL_SOCKET, opt::SO_RCVBUF | opt::SO_SNDBUF) => ring,
            (opt::IPPROTO_TCP, opt::TCP_MAXSEG) => match conn.map(|h| stack.tcp_info(h)) {
                Some(Ok(info)) => info.snd_mss as i64,
                _ => stack.tcp_config().mss as i64,
            },
            (opt::SOL_USNET, opt::USNET_FASTOPEN_READY) => {
                let ready = SockAddr::from_args(&[a[2], a[3], a[4], a[5], 0, 0])
                    .to_std()
                    .is_some_and(|r| stack.tcp_fastopen_ready(r.ip()));
                (stack.tcp_fastopen_client_enabled() as i64) | (ready as i64) << 1
            }
            (opt::IPPROTO_TCP, opt::TCP_INFO) => {
                let Some(Ok(info)) = conn.map(|h| stack.tcp_info(h)) else {
                    return -errno::ENOTCONN;
                };
                let mut b = [0u8; tcp_info::LEN];
                let mut put =
                    |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
                let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
                put(tcp_info::STATE, u32::from(info.linux_state()));
                put(tcp_info::RTT_US, info.srtt.map_or(0, us));
                put(tcp_info::RTTVAR_US, us(info.rttvar));
                put(tcp_info::RTO_US, us(info.rto));
                put(tcp_info::SND_MSS, info.snd_mss);
                put(tcp_info::RCV_MSS, info.rcv_mss);
                put(tcp_info::CWND, info.cwnd);
                put(tcp_info::SSTHRESH, info.ssthresh);
                put(tcp_info::BYTES_IN_FLIGHT, info.bytes_in_flight);
                put(tcp_info::TOTAL_RETRANS, info.total_retransmits as u32);
                put(tcp_info::SND_WND, info.snd_wnd);
                put(tcp_info::RCV_WND, info.rcv_wnd);
                put(tcp_info::MIN_RTT_US, info.min_rtt.map_or(0, us));
                let (ws, wr) = info.wscale.unwrap_or((0, 0));
                put(
                    tcp_info::CA_OPTIONS,
                    u32::from_le_bytes([
                        info.linux_ca_state(),
                        info.linux_options(),
                        (ws & 0xf) | ((wr & 0xf) << 4),
                        info.backoff.min(255) as u8,
                    ]),
                );
                let mss = info.snd_mss.max(1);
                put(tcp_info::SACKED, info.sacked_bytes.div_ceil(mss));
                put(tcp_info::LOST, info.lost_out);
                put(tcp_info::RETRANS, info.retrans_out);
                put(tcp_info::REORDERING, info.reordering);
                put(tcp_info::REORD_SEEN, info.reord_seen);
                put(tcp_info::RCV_SPACE, info.rcv_space);
                put(
                    tcp_info::LAST_DATA_RECV_MS,
                    info.last_data_recv.as_millis().min(u32::MAX as u128) as u32,
                );
                put(
                    tcp_info::DELIVERED,
                    info.delivered.min(u32::MAX as u64) as u32,
                );
                for (off, d) in [
                    (tcp_info::BUSY_US, info.busy_time),
                    (tcp_info::RWND_LIMITED_US, info.rwnd_limited),
                    (tcp_info::SNDBUF_LIMITED_US, info.sndbuf_limited),
                ] {
                    let v = d.as_micros().min(u64::MAX as u128) as u64;
                    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
                let limited = if info.delivery_rate_app_limited {
                    tcp_info::APP_LIMITED
                } else {
                    0
                };
                for (off, v) in [
                    (tcp_info::PACING_RATE, info.pacing_rate),
                    (
                        tcp_info::DELIVERY_RATE,
                        (info.delivery_rate & !tcp_info::APP_LIMITED) | limited,
                    ),
                ] {
                    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
                self.mem.write_info(i, &b);
                tcp_info::LEN as i64
            }
            _ => -errno::ENOPROTOOPT,
        }
    }
}

/// The families of a BIND's or LISTEN's argument (`FAM_V4 | FAM_V6`; 0: both).
/// UDP multicast options (`usnet_abi::opt`).
fn is_mcast_opt(level: u64, name: u64) -> bool {
    match level {
        opt::IPPROTO_IP => matches!(
            name,
            opt::IP_MULTICAST_IF
                | opt::IP_MULTICAST_TTL
                | opt::IP_MULTICAST_LOOP
                | opt::IP_ADD_MEMBERSHIP
                | opt::IP_DROP_MEMBERSHIP
                | opt::IP_MULTICAST_ALL
        ),
        opt::IPPROTO_IPV6 => matches!(
            name,
            opt::IPV6_MULTICAST_HOPS
                | opt::IPV6_MULTICAST_LOOP
                | opt::IPV6_ADD_MEMBERSHIP
                | opt::IPV6_DROP_MEMBERSHIP
                | opt::IPV6_MULTICAST_ALL
        ),
        _ => false,
    }
}

/// A multicast option on UDP socket `h` (`a`: the SETSOCKOPT arguments).
fn apply_mcast(stack: &mut Stack, h: SocketHandle, a: &[u64; 6]) -> Result<(), StackError> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let v4 = IpAddr::V4(Ipv4Addr::from((a[2] as u32).to_be_bytes()));
    let v6 = IpAddr::V6(Ipv6Addr::from((u128::from(a[2]) << 64) | u128::from(a[3])));
    let ttl = a[2].min(255) as u8;
    match (a[0], a[1]) {
        (opt::IPPROTO_IP, opt::IP_ADD_MEMBERSHIP) => stack.udp_join_multicast(h, v4),
        (opt::IPPROTO_IP, opt::IP_DROP_MEMBERSHIP) => stack.udp_leave_multicast(h, v4),
        (opt::IPPROTO_IPV6, opt::IPV6_ADD_MEMBERSHIP) => stack.udp_join_multicast(h, v6),
        (opt::IPPROTO_IPV6, opt::IPV6_DROP_MEMBERSHIP) => stack.udp_leave_multicast(h, v6),
        (opt::IPPROTO_IP, opt::IP_MULTICAST_IF) => match v4 {
            IpAddr::V4(a) => stack.udp_set_multicast_if(h, Some(a)),
            IpAddr::V6(_) => unreachable!(),
        },
        (opt::IPPROTO_IP, opt::IP_MULTICAST_TTL) => stack.udp_set_multicast_ttl(h, true, ttl),
        (opt::IPPROTO_IPV6, opt::IPV6_MULTICAST_HOPS) => stack.udp_set_multicast_ttl(h, false, ttl),
        (opt::IPPROTO_IP, opt::IP_MULTICAST_LOOP) => {
            stack.udp_set_multicast_loop(h, true, a[2] != 0)
        }
        (opt::IPPROTO_IPV6, opt::IPV6_MULTICAST_LOOP) => {
            stack.udp_set_multicast_loop(h, false, a[2] != 0)
        }
        (_, opt::IP_MULTICAST_ALL | opt::IPV6_MULTICAST_ALL) => {
            stack.udp_set_multicast_all(h, a[2] != 0)
        }
        _ => Err(StackError::InvalidInput),
    }
}

/// The stack's TCP template for an active open, its MSS capped by the TCP_MAXSEG
/// set before `connect`.
/// A bound TCP socket that listens, connects or closes lets go of the port hold
/// `bind` took (the listener or connection holds the port from then on).
fn unbind(stack: &mut Stack, s: &mut Sock) {
    if let (Some(id), Some(b)) = (s.binding.take(), s.bound) {
        stack.tcp_unbind(b.port(), id);
    }
}

fn connect_config(stack: &Stack, mss: Option<u16>) -> usnet_stack::TcpConfig {
    let mut cfg = stack.tcp_config().clone();
    if let Some(m) = mss {
        cfg.mss = cfg.mss.min(m);
    }
    cfg
}

/// Multicast options set before the stack socket `h` of `s` existed.
fn apply_deferred(stack: &mut Stack, s: &mut Sock, h: SocketHandle) {
    for a in std::mem::take(&mut s.deferred) {
        let _ = apply_mcast(stack, h, &a);
    }
}

fn families(f: u64) -> Families {
    match f & (FAM_V4 | FAM_V6) {
        FAM_V4 => Families::V4,
        FAM_V6 => Families::V6,
        _ => Families::Both,
    }
}

/// Completions a client may leave unread before the server stops serving it.
pub const BACKLOG_MAX: usize = 1024;

// ---------------------------------------------------------------- streams

impl ServerSession {
    fn activate(&mut self, i: u32) {
        if let Some(s) = self.socks[i as usize].as_mut() {
            if !s.tx_active {
                s.tx_active = true;
                self.active.push(i);
            }
        }
    }

    /// Moves bytes from the send rings of active sockets into the stack, at most
    /// `chunk` bytes per socket (the cluster size × clusters per request).
    pub fn drain_all(&mut self, stack: &mut Stack) {
        for i in std::mem::take(&mut self.rx_again) {
            self.refresh(stack, i);
        }
        self.publish_acked(stack);
        let mut k = 0;
        while k < self.ts_watched.len() {
            if self.stamp_progress(stack, self.ts_watched[k]) {
                k += 1;
            } else {
                self.ts_watched.swap_remove(k);
            }
        }
        let mut k = 0;
        while k < self.active.len() {
            let i = self.active[k];
            if self.drain_tx(stack, i) {
                k += 1;
            } else {
                self.active.swap_remove(k);
            }
        }
    }

    /// For each SO_ZEROCOPY connection: how far the peer acknowledged the send
    /// ring's bytes (`slot::TX_ACKED`; `u64::MAX` once it can send no more), with an
    /// event when it moved.
    fn publish_acked(&mut self, stack: &mut Stack) {
        let mut k = 0;
        while k < self.zc_watched.len() {
            let i = self.zc_watched[k];
            let Some((h, consumed)) = self.socks[i as usize]
                .as_ref()
                .filter(|s| s.zc_watch)
                .and_then(|s| s.handle.map(|h| (h, s.tx.position())))
            else {
                self.zc_watched.swap_remove(k);
                continue;
            };
            k += 1;
            let s = self.socks[i as usize].as_mut().expect("watched");
            let acked = match stack.tcp_info(h) {
                Ok(info) if info.state != usnet_stack::TcpState::Closed => {
                    s.tx_gaps.acked(consumed, info.send_queued as u64)
                }
                _ => u64::MAX,
            };
            let w = self.mem.slot_u64(i, slot::TX_ACKED);
            if w.load(Relaxed) != acked {
                w.store(acked, Release);
                self.bump(i);
            }
        }
    }

    /// Moves what slot `i`'s send ring holds into the stack. Returns whether the socket
    /// stays active (more bytes, or the stack pushed back).
    fn drain_tx(&mut self, stack: &mut Stack, i: u32) -> bool {
        let chunk = self.limits.chunk;
        let Some(s) = self.socks[i as usize].as_mut() else {
            return false;
        };
        if !s.tx_active {
            return false;
        }
        let mut avail = match s.tx.available() {
            Ok(n) => n,
            Err(_) => {
                self.stats.corrupt_rings += 1;
                0
            }
        };
        // Bytes past a hold wait for the request that set it (`slot::TX_HOLD`);
        // a closing socket's go regardless.
        let hold = self.mem.slot_u64(i, slot::TX_HOLD).load(Acquire);
        let mut held = false;
        if hold != 0 && !s.closing {
            let room = (hold - 1).saturating_sub(s.tx.position());
            let room = usize::try_from(room).unwrap_or(usize::MAX);
            held = avail > room;
            avail = avail.min(room);
        }
        let mut moved = 0usize;
        let mut pushed_back = false;
        match (s.role, s.handle) {
            (Role::Conn, Some(h)) if avail > 0 => {
                let want = avail.min(chunk);
                let tx = &mut s.tx;
                match stack.tcp_send_with(h, want, |dst| tx.read(dst)) {
                    Ok(n) => {
                        moved = n;
                        s.written += n as u64;
                        pushed_back = n < want;
                    }
                    Err(StackError::WouldBlock) => pushed_back = true,
                    Err(_) => {
                        // The connection failed or was shut down: the bytes can never
                        // go out; drop them as the kernel would.
                        s.tx.skip(avail);
                    }
                }
                s.tx.release();
            }
            (Role::Udp, _) if avail > 0 || s.pending_dgram.is_some() => {
                let owner = Owner(self.id);
                let mut bound = None;
                let (m, back) = Self::drain_udp(
                    stack,
                    s,
                    owner,
                    &mut bound,
                    &mut self.scratch,
                    chunk,
                    &mut self.stats,
                );
                moved = m;
                pushed_back = back;
                if let Some(h) = bound {
                    // sendto bound the socket: it is the client's like any other
                    // (owner clean-up, readiness, received datagrams), and the client
                    // learns its address now.
                    self.by_handle.insert(h, i);
                    self.refresh(stack, i);
                }
            }
            (_, _) if avail > 0 => {
                // Bytes on a socket that cannot send (not connected): discard them.
                s.tx.skip(avail);
                s.tx.release();
            }
            _ => {}
        }
        self.stats.bytes_in += moved as u64;
        let s = self.socks[i as usize].as_mut().expect("still here");
        if held && !pushed_back {
            // The rest waits for the request that set the hold, which activates
            // the socket again (a client that never sends it only holds itself).
            s.tx_active = false;
            if moved > 0 {
                self.bump(i);
            }
            return false;
        }
        let left = s.tx.ready();
        if pushed_back || left > 0 || s.pending_dgram.is_some() {
            if moved > 0 {
                self.bump(i);
            }
            return true;
        }
        // Drained. A close or SHUT_WR that waited for it happens now.
        let (closing, shut_wr) = (s.closing, s.shut_wr);
        if closing {
            self.finish_close(stack, i);
            return false;
        }
        if shut_wr {
            if let Some(h) = s.handle.filter(|_| s.role == Role::Conn) {
                s.shut_wr = false;
                let _ = stack.tcp_shutdown_write(h);
                self.set_flags(i, FLAG_WR_SHUT, 0);
            }
        }
        // Arm the kick, then look once more (Dekker with the client's publish:
        // usnet_shm::arm).
        let s = self.socks[i as usize].as_mut().expect("still here");
        let armed = self.mem.slot_word(i, slot::TX_ARMED);
        if usnet_shm::arm::arm(armed, || s.tx.available().unwrap_or(0) > 0) {
            return true;
        }
        s.tx_active = false;
        if moved > 0 {
            self.bump(i);
        }
        false
    }

    /// `op::SEND`: the write that lies in slot `i`'s send ring from `start` to `end`,
    /// taken by the stack as Linux's `tcp_sendmsg` takes one (chunk by chunk within
    /// the send buffer's limit, `MSG_MORE`, `MSG_EOR`). Bytes before `start` go in
    /// first, as [`Self::drain_tx`] moves them; what the stack refuses of the write
    /// is dropped from the ring (the client tells the program it was not taken).
    /// Returns the bytes of the write the stack took.
    fn op_send(&mut self, stack: &mut Stack, i: u32, start: u64, end: u64, flags: u64) -> i64 {
        let chunk = self.limits.chunk;
        let Some(s) = self.socks[i as usize].as_mut() else {
            return -errno::EBADF;
        };
        let (Role::Conn, Some(h)) = (s.role, s.handle) else {
            return -errno::EPIPE;
        };
        let Ok(avail) = s.tx.available() else {
            self.stats.corrupt_rings += 1;
            return -errno::EINVAL;
        };
        s.send_used = true;
        let pos = s.tx.position();
        if start > end || end > pos + avail as u64 || end - start > s.tx.size() as u64 {
            self.stats.bad_requests += 1;
            return -errno::EINVAL;
        }
        // Bytes written before this write, in the usual way (a drain may also have
        // taken some of this write's already: the stack took them).
        let mut at = pos;
        while at < start {
            let want = ((start - at) as usize).min(chunk);
            let tx = &mut s.tx;
            match stack.tcp_send_with(h, want, |dst| tx.read(dst)) {
                Ok(n) if n > 0 => at += n as u64,
                _ => break,
            }
        }
        s.written += at - pos;
        let before = at.saturating_sub(start).min(end - start);
        let mut leftover = false;
        let mut took = before;
        let mut moved = at - pos;
        let left = end - at.max(start);
        if at >= start && left > 0 {
            let n = left as usize;
            if self.scratch.len() < n {
                self.scratch.resize(n, 0);
            }
            let got = s.tx.peek(0, &mut self.scratch[..n]);
            let more = flags & SEND_MORE != 0;
            let r = stack.tcp_send_more(h, &self.scratch[..got], more);
            let k = match r {
                Ok(k) => k,
                Err(StackError::WouldBlock) => 0,
                Err(_) if flags & SEND_ASYNC != 0 => 0,
                Err(e) => {
                    s.tx.skip(got);
                    s.tx.release();
                    return err(e);
                }
            };
            if flags & SEND_EOR != 0 && k == got && k > 0 {
                let _ = stack.tcp_end_record(h);
            }
            if flags & SEND_ASYNC != 0 {
                // The client counted every byte as taken: what the stack did not
                // take (it should not happen within the credit) goes out later by
                // the usual drain, never dropped.
                s.tx.skip(k);
                if k < got {
                    leftover = true;
                }
            } else {
                s.tx.skip(got);
                if k < got && s.zc_watch {
                    s.tx_gaps
                        .push(s.tx.position() - (got - k) as u64, (got - k) as u64);
                }
            }
            took += k as u64;
            moved += k as u64;
            s.written += k as u64;
        } else if left > 0 && flags & SEND_ASYNC != 0 {
            leftover = true;
        } else if left > 0 {
            // Older bytes still wait: the write gets nothing now, and is dropped.
            let n = left as usize;
            s.tx.skip(n);
            if s.zc_watch {
                s.tx_gaps.push(s.tx.position() - n as u64, n as u64);
            }
        }
        s.tx.release();
        if took > 0 {
            // Linux's `tcp_tx_timestamp`: the write's last byte is marked.
            if let Some(st) = s.stamps.as_mut() {
                st.record(s.written);
            }
        }
        self.stats.bytes_in += moved;
        if moved > 0 {
            self.bump(i);
        }
        if leftover {
            self.activate(i);
        }
        // The marked byte may have left already.
        self.stamp_progress(stack, i);
        self.send_flags(stack, i);
        took as i64
    }

    /// Feeds connection `i`'s transmit timestamps what its stack socket sent and
    /// had acknowledged; `FLAG_ERRQUEUE` while reports wait. Returns whether it
    /// still has something to watch.
    fn stamp_progress(&mut self, stack: &Stack, i: u32) -> bool {
        let now = stack.now().as_nanos();
        let Some(s) = self.socks[i as usize].as_mut() else {
            return false;
        };
        let written = s.written;
        let Some(st) = s.stamps.as_mut() else {
            return false;
        };
        if st.marked() {
            let progress = match (s.role, s.handle) {
                (Role::Conn, Some(h)) => stack
                    .tcp_info(h)
                    .ok()
                    .filter(|i| i.state != usnet_stack::TcpState::Closed),
                _ => None,
            };
            let (sent, acked) = match progress {
                Some(info) => {
                    let acked = written.saturating_sub(info.send_queued as u64);
                    let sent = (acked + u64::from(info.bytes_in_flight)).min(written);
                    (sent, Some(acked))
                }
                None => (0, None),
            };
            st.progress(sent, acked, now);
        }
        let (queued, watch) = (st.queued(), st.wants_tx() || st.queued());
        if queued != (s.flags & FLAG_ERRQUEUE != 0) {
            let (set, clear) = if queued {
                (FLAG_ERRQUEUE, 0)
            } else {
                (0, FLAG_ERRQUEUE)
            };
            self.set_flags(i, set, clear);
        }
        watch
    }

    /// `slot::TX_CREDIT` of connection `i` (whose writes meet the stack when
    /// `bounded`): the ring position up to which a write would surely be taken
    /// whole, so the client posts it without waiting.
    fn publish_credit(&mut self, stack: &Stack, i: u32, bounded: bool) {
        let s = self.sock(i);
        let credit = match s.handle {
            Some(h) if bounded => {
                s.tx.position() + u64::from(stack.tcp_sure_write_room(h).unwrap_or(0))
            }
            _ => 0,
        };
        let w = self.mem.slot_u64(i, slot::TX_CREDIT);
        if w.load(Relaxed) != credit {
            w.store(credit, Release);
        }
    }

    /// `op::ERRQUEUE`: the oldest transmit timestamp of connection `i`.
    fn op_errqueue(&mut self, stack: &Stack, i: u32) -> Option<(i64, [u64; 2])> {
        let now = stack.now().as_nanos();
        let stamp = self.sock(i).stamps.as_mut().and_then(|st| st.take());
        self.stamp_progress(stack, i);
        let Some(st) = stamp else {
            return Some((-errno::EAGAIN, [0, 0]));
        };
        let mut aux0 = u64::from(st.key);
        if st.tsonly {
            aux0 |= STAMP_TSONLY;
        }
        let age = match st.at {
            Some(at) => {
                aux0 |= STAMP_TIMED;
                now.saturating_sub(at)
            }
            None => 0,
        };
        Some((i64::from(st.info), [aux0, age]))
    }

    /// Keeps `FLAG_SNDBUF` and `FLAG_WRITABLE` of connection `i` current: whether
    /// its send-buffer limit was chosen, and then whether the stack would take a
    /// write (a change bumps the event counter: an edge-triggered `EPOLLOUT`).
    fn send_flags(&mut self, stack: &mut Stack, i: u32) {
        let s = self.sock(i);
        let Some(h) = s.handle.filter(|_| s.role == Role::Conn) else {
            return;
        };
        let (set, clear) = send_bits(stack, s, h);
        self.publish_credit(stack, i, set & FLAG_SNDBUF != 0);
        self.set_flags(i, set, clear);
    }

    /// UDP records from the send ring into the stack. Returns (bytes, pushed back).
    #[allow(clippy::too_many_arguments)]
    fn drain_udp(
        stack: &mut Stack,
        s: &mut Sock,
        owner: Owner,
        bound: &mut Option<SocketHandle>,
        scratch: &mut Vec<u8>,
        chunk: usize,
        stats: &mut SessionStats,
    ) -> (usize, bool) {
        let mut moved = 0;
        loop {
            if let Some((data, to)) = s.pending_dgram.take() {
                let Some(h) = s.handle else {
                    return (moved, false);
                };
                let r = match to {
                    Some(to) => stack.udp_send_to(h, &data, to),
                    None => stack.udp_send(h, &data),
                };
                match r {
                    Err(StackError::WouldBlock) => {
                        s.pending_dgram = Some((data, to));
                        return (moved, true);
                    }
                    // Other errors lose the datagram, as a kernel send would report
                    // them to the caller; the counters tell.
                    _ => moved += data.len(),
                }
            }
            if moved >= chunk {
                return (moved, true);
            }
            let avail = s.tx.ready();
            // Records never wrap: fewer bytes than a header before the ring's end are
            // skipped without a marker.
            let size = ring_size(s);
            let to_end = size - (s.tx.position() as usize & (size - 1));
            if to_end < RECORD_HEADER && avail >= to_end {
                s.tx.skip(to_end);
                s.tx.release();
                continue;
            }
            if avail < RECORD_HEADER {
                if avail > 0 {
                    // A partial header means a broken producer: resynchronise.
                    stats.corrupt_rings += 1;
                    s.tx.skip(avail);
                    s.tx.release();
                }
                return (moved, false);
            }
            let mut h = [0u8; RECORD_HEADER];
            s.tx.peek(0, &mut h);
            let len = u32::from_le_bytes(h[0..4].try_into().expect("4"));
            if len == RECORD_PAD {
                // Skip to the start of the ring.
                s.tx.skip(to_end.min(avail));
                s.tx.release();
                continue;
            }
            let rec = usnet_abi::record_len(len as usize);
            if len as usize > usnet_stack::MAX_UDP_PAYLOAD || rec > avail {
                stats.corrupt_rings += 1;
                s.tx.skip(avail);
                s.tx.release();
                return (moved, false);
            }
            let addr = SockAddr::from_bytes(h[8..36].try_into().expect("28"));
            scratch.resize(len as usize, 0);
            s.tx.peek(RECORD_HEADER, scratch);
            s.tx.skip(rec);
            s.tx.release();
            let to = if addr.family == 0 {
                None
            } else {
                addr.to_std()
            };
            s.pending_dgram = Some((std::mem::take(scratch), to));
            if s.handle.is_none() {
                // sendto on an unbound UDP socket binds it to an ephemeral port.
                let v6 = to.is_some_and(|a| a.is_ipv6());
                let any: SocketAddr = if v6 { "[::]:0" } else { "0.0.0.0:0" }
                    .parse()
                    .expect("addr");
                match stack.udp_bind(any) {
                    Ok(h) => {
                        let _ = stack.set_owner(h, owner);
                        s.handle = Some(h);
                        apply_deferred(stack, s, h);
                        *bound = Some(h);
                    }
                    Err(_) => {
                        s.pending_dgram = None;
                        return (moved, false);
                    }
                }
            }
        }
    }

    /// A stack socket's readiness changed (or the client made room): bring the
    /// client's view up to date.
    pub fn on_ready(&mut self, stack: &mut Stack, h: SocketHandle) {
        if let Some(&i) = self.by_handle.get(&h) {
            // A new UDP binding made by sendto: tell the client its address.
            self.refresh(stack, i);
            if self.socks[i as usize].as_ref().is_some_and(|s| s.tx_active) {
                // Writable again: the stack took what it refused before.
                self.drain_tx(stack, i);
            }
        }
    }

    /// Moves received data into slot `i`'s receive ring and updates its flags.
    fn refresh(&mut self, stack: &mut Stack, i: u32) {
        let chunk = self.limits.chunk;
        let Some(s) = self.socks[i as usize].as_mut() else {
            return;
        };
        let Some(h) = s.handle else {
            return;
        };
        let mut moved = 0usize;
        let mut set = 0u32;
        let mut clear = 0u32;
        let mut error = None;
        let mut again = false;
        match s.role {
            Role::Conn => {
                // After SHUT_RD what arrives is still queued for reading, as on
                // Linux (reads of an empty ring then see the end).
                if !s.rx_blocked && s.receiver {
                    // Pull into the ring until the stack has nothing more, the stream
                    // ended, or the ring is full and stays full after arming the kick.
                    // The room found after arming is filled at once: the client's read
                    // that made it saw the kick unarmed and will not ask, and the last
                    // bytes of a stream bring no further readiness from the stack.
                    loop {
                        let free = match s.rx.free() {
                            Ok(f) => f,
                            Err(_) => {
                                self.stats.corrupt_rings += 1;
                                break;
                            }
                        };
                        let mut room = free.min(chunk.saturating_sub(moved));
                        let mut drained = false;
                        if !s.carry.is_empty() {
                            // What the previous receiver left unread comes first.
                            let k = room.min(s.carry.len());
                            let n = s.rx.push(&s.carry[..k]);
                            s.carry.drain(..n);
                            moved += n;
                            room -= n;
                        }
                        while room > 0 && s.carry.is_empty() {
                            let rx = &mut s.rx;
                            match stack.tcp_recv_with_to_mark(h, room, |c| {
                                rx.push(c);
                            }) {
                                // At the urgent mark: the client learns where it is
                                // (before anything after it is published) and gets
                                // the byte for MSG_OOB; the stream goes on.
                                Ok(0) if stack.tcp_at_urgent_mark(h) => {
                                    if let Ok(Some(b)) = stack.tcp_take_urgent_at_mark(h) {
                                        let mark = s.rx.position() + 1;
                                        self.mem
                                            .slot_u64(i, slot::RX_URG_MARK)
                                            .store(mark, Release);
                                        self.mem
                                            .slot_word(i, slot::RX_OOB)
                                            .store(0x100 | u32::from(b), Release);
                                    }
                                }
                                // The call that finds nothing also tells end-of-stream.
                                Ok(0) => {
                                    if !s.eof {
                                        s.eof = true;
                                        set |= FLAG_RX_EOF;
                                    }
                                    drained = true;
                                    break;
                                }
                                Ok(n) => {
                                    moved += n;
                                    room -= n;
                                }
                                Err(StackError::WouldBlock) => {
                                    drained = true;
                                    break;
                                }
                                Err(e) => {
                                    error = Some(e);
                                    drained = true;
                                    break;
                                }
                            }
                        }
                        s.rx.publish();
                        if drained || s.eof {
                            break;
                        }
                        if s.rx.free().unwrap_or(0) > 0 {
                            // The per-turn budget ran out with room left: the rest
                            // comes next turn (`drain_all`).
                            again = true;
                            break;
                        }
                        // Full ring with more to tell: arm the kick, then look once more;
                        // room that appeared meanwhile is filled at once.
                        let armed = self.mem.slot_word(i, slot::RX_ARMED);
                        if !usnet_shm::arm::arm(armed, || s.rx.free().unwrap_or(0) > 0) {
                            s.rx_blocked = true;
                            break;
                        }
                    }
                }
                if let Ok(r) = stack.readiness(h) {
                    if r.connected {
                        set |= FLAG_CONNECTED;
                    }
                    if r.closed {
                        set |= FLAG_HUP;
                    }
                }
                if let Ok(Some(e)) = stack.tcp_error(h) {
                    error = Some(e);
                }
                let (s_set, s_clear) = send_bits(stack, s, h);
                set |= s_set;
                clear |= s_clear;
                let credit = if s_set & FLAG_SNDBUF != 0 {
                    s.tx.position() + u64::from(stack.tcp_sure_write_room(h).unwrap_or(0))
                } else {
                    0
                };
                self.mem.slot_u64(i, slot::TX_CREDIT).store(credit, Release);
            }
            Role::Listener => {
                let r = stack.readiness(h).unwrap_or_default();
                if r.readable {
                    set |= FLAG_ACCEPTABLE;
                } else {
                    clear |= FLAG_ACCEPTABLE;
                }
            }
            Role::Udp => {
                if !s.rx_blocked && s.receiver {
                    loop {
                        moved += Self::fill_udp(stack, s, h, chunk - moved.min(chunk));
                        s.rx.publish();
                        let Ok(Some(len)) = stack.udp_peek_len(h) else {
                            break;
                        };
                        if moved >= chunk {
                            // The per-turn budget ran out: the rest comes next turn.
                            again = true;
                            break;
                        }
                        // The next datagram does not fit: arm the kick, then look once
                        // more (the client may have made room meanwhile). Without the
                        // kick a queue that never empties would never be moved again.
                        let armed = self.mem.slot_word(i, slot::RX_ARMED);
                        if !usnet_shm::arm::arm(armed, || udp_record_fits(&mut s.rx, len)) {
                            s.rx_blocked = true;
                            break;
                        }
                    }
                }
                s.rx.publish();
                if s.flags & FLAG_BOUND == 0 {
                    if let Ok(l) = stack.udp_local_addr(h) {
                        self.mem
                            .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                        set |= FLAG_BOUND;
                    }
                }
            }
            Role::Fresh => {}
        }
        if let Some(e) = error {
            let old = self.mem.slot_word(i, slot::ERROR).load(Relaxed);
            if old == 0 && self.sock(i).flags & FLAG_ERROR == 0 {
                self.mem
                    .slot_word(i, slot::ERROR)
                    .store(e.errno() as u32, Release);
            }
            set |= FLAG_ERROR | FLAG_HUP;
        }
        self.stats.bytes_out += moved as u64;
        if moved > 0 {
            self.bump(i);
        }
        if again && !self.rx_again.contains(&i) {
            self.rx_again.push(i);
        }
        self.set_flags(i, set, clear);
    }

    /// Datagrams from the stack's queue into the receive ring as records, while they
    /// fit. Returns the payload bytes moved.
    fn fill_udp(stack: &mut Stack, s: &mut Sock, h: SocketHandle, chunk: usize) -> usize {
        let size = s.rx.size();
        let mut moved = 0;
        while moved < chunk {
            let Ok(Some(len)) = stack.udp_peek_len(h) else {
                break;
            };
            if !udp_record_fits(&mut s.rx, len) {
                break;
            }
            let rec = usnet_abi::record_len(len);
            let pos = s.rx.position() as usize & (size - 1);
            let to_end = size - pos;
            if rec > to_end {
                // Records never wrap: mark the tail skipped (a pad header when one
                // fits; a shorter tail is skipped by rule) and start over at 0.
                let mut tail = vec![0u8; to_end];
                if to_end >= RECORD_HEADER {
                    tail[0..4].copy_from_slice(&RECORD_PAD.to_le_bytes());
                }
                s.rx.push(&tail);
            }
            // The sender is known only once the datagram is taken: the header is
            // completed after the payload, before the record is published.
            let start_pos = s.rx.position();
            let mut hdr = [0u8; RECORD_HEADER];
            hdr[0..4].copy_from_slice(&(len as u32).to_le_bytes());
            s.rx.push(&hdr);
            let rx = &mut s.rx;
            let Ok((n, from)) = stack.udp_recv_with(h, |c| {
                rx.push(c);
            }) else {
                break;
            };
            let pad = rec - RECORD_HEADER - n;
            if pad > 0 {
                s.rx.push(&[0u8; 8][..pad]);
            }
            hdr[0..4].copy_from_slice(&(n as u32).to_le_bytes());
            hdr[8..36].copy_from_slice(&SockAddr::from_std(from).to_bytes());
            s.rx.rewrite(start_pos, &hdr);
            moved += n;
        }
        moved
    }

    /// The client closed slot `i` and its send ring is empty: close the stack socket
    /// and give the slot back.
    fn finish_close(&mut self, stack: &mut Stack, i: u32) {
        let Some(mut s) = self.socks[i as usize].take() else {
            return;
        };
        unbind(stack, &mut s);
        if let (Some(h), true) = (s.handle, s.shared) {
            // Other sessions may hold it: the loop decides (`Loop::release_shared`).
            self.by_handle.remove(&h);
            let mut s = s;
            let left = Self::salvage(&mut s, &mut self.stats);
            self.released.push((h, left));
        } else if let Some(h) = s.handle {
            self.by_handle.remove(&h);
            let mut s = s;
            // Received bytes the client never read (in its ring, or carried): the
            // kernel answers such a close with a reset (RFC 2525 §2.17), and so do we.
            let unread = s.role == Role::Conn
                && (!s.carry.is_empty() || s.rx.free().is_ok_and(|f| f < s.rx.size()));
            if unread {
                let _ = stack.tcp_abort(h);
            } else {
                // The client closed it: the close goes on gracefully even if the
                // client exits now (as the kernel's orphaned sockets do), so the
                // socket is no longer the client's (`depart` closes what a client
                // leaves open the same way).
                let _ = stack.set_owner(h, usnet_stack::Owner::LOCAL);
                let _ = stack.close(h);
            }
        }
        self.mem.slot_word(i, slot::STATE).store(SLOT_FREE, Release);
        self.mem.slot_word(i, slot::EVENTS).fetch_add(1, Release);
        self.free.push(i);
        self.dirty = true;
    }

    /// The client is gone, and its process closed every descriptor, as the kernel
    /// closes a process's sockets when it exits (a program may exit without closing
    /// them; socat does). So each TCP connection it held closes as after `close`:
    /// what its send ring still holds goes out first (those bytes were written, and
    /// the kernel sends what is in a closed socket's buffer), then a FIN, or an RST
    /// if received data was left unread; a connection with bytes left stops being
    /// the client's and keeps draining ([`ServerSession::drain_closing`]).
    /// Everything else the client held (listeners, datagram sockets) is closed and
    /// given back. Returns whether any connection is still draining.
    pub fn close_dead(&mut self, stack: &mut Stack) -> bool {
        let mut draining = false;
        for i in 0..self.socks.len() {
            let Some(x) = self.socks[i].as_mut() else {
                continue;
            };
            match x.handle {
                Some(h) if x.role == Role::Conn => {
                    x.closing = true;
                    if x.tx.available().unwrap_or(0) > 0 {
                        let _ = stack.set_owner(h, usnet_stack::Owner::LOCAL);
                        x.tx_active = true;
                        if !self.active.contains(&(i as u32)) {
                            self.active.push(i as u32);
                        }
                        draining = true;
                    } else {
                        self.finish_close(stack, i as u32);
                    }
                }
                _ => self.socks[i] = None,
            }
        }
        let socks = &self.socks;
        self.by_handle.retain(|_, i| socks[*i as usize].is_some());
        self.active.retain(|i| socks[*i as usize].is_some());
        self.rx_again.clear();
        stack.close_owner(self.owner());
        draining
    }

    /// The stack sockets the session's slots still name.
    pub fn handles(&self) -> Vec<SocketHandle> {
        self.socks
            .iter()
            .flatten()
            .filter_map(|s| s.handle)
            .collect()
    }

    /// After [`ServerSession::close_dead`]: moves what the closed sockets' send
    /// rings still hold into the stack (each closes gracefully once its ring is
    /// empty). Returns whether any is still draining, and whether bytes moved.
    pub fn drain_closing(&mut self, stack: &mut Stack) -> (bool, bool) {
        let before = self.stats.bytes_in;
        self.drain_all(stack);
        (
            self.socks.iter().any(Option::is_some),
            self.stats.bytes_in != before,
        )
    }

    /// What a receiver that lets go of a shared stream leaves for the next one: the
    /// bytes in its receive ring it did not read, then its carry. (Datagrams are not
    /// handed on: records are not moved between rings.)
    fn salvage(s: &mut Sock, stats: &mut SessionStats) -> Vec<u8> {
        let mut left = Vec::new();
        if s.receiver && s.role == Role::Conn {
            if s.rx.unread(&mut left).is_err() {
                stats.corrupt_rings += 1;
                left.clear();
            }
            left.append(&mut s.carry);
        }
        left
    }

    /// The client is gone: its shared stack sockets, taken out of the session with
    /// what their receive rings held, for the loop to pass on.
    pub fn take_shared(&mut self) -> Vec<(SocketHandle, Vec<u8>)> {
        let mut out = Vec::new();
        for i in 0..self.socks.len() {
            if !self.socks[i].as_ref().is_some_and(|s| s.shared) {
                continue;
            }
            let mut s = self.socks[i].take().expect("checked");
            let h = s.handle.expect("shared sockets have a stack socket");
            self.by_handle.remove(&h);
            self.active.retain(|&x| x != i as u32);
            self.free.push(i as u32);
            out.push((h, Self::salvage(&mut s, &mut self.stats)));
        }
        out
    }

    /// Pins every open socket for a child about to be forked: each one with a stack
    /// socket becomes shared (owned by [`SHARED`]). Returns the pinned sockets and
    /// the stack sockets that became shared just now.
    pub fn pin_all(&mut self, stack: &mut Stack) -> (Vec<Pinned>, Vec<SocketHandle>) {
        let mut pinned = Vec::new();
        let mut newly = Vec::new();
        let mut shared_now = Vec::new();
        for (i, s) in self.socks.iter_mut().enumerate() {
            let Some(s) = s.as_mut().filter(|s| !s.closing) else {
                continue;
            };
            if let Some(h) = s.handle {
                if !s.shared {
                    s.shared = true;
                    let _ = stack.set_owner(h, SHARED);
                    if s.role == Role::Listener {
                        // Connections waiting to be accepted are shared too: the
                        // forking process's exit must not reset them.
                        stack.tcp_reown_waiting(h, SHARED);
                    }
                    newly.push(h);
                }
            }
            if s.handle.is_some() {
                shared_now.push(i as u32);
            }
            pinned.push(Pinned {
                parent_slot: i as u32,
                tag: self.mem.slot_word(i as u32, slot::TAG).load(Relaxed),
                kind: s.kind,
                role: s.role,
                handle: s.handle,
                bound: s.bound,
            });
        }
        for i in shared_now {
            self.set_flags(i, FLAG_SHARED, 0);
        }
        (pinned, newly)
    }

    /// A forked child's session takes a pinned socket: a slot of its own over the same
    /// stack socket (or a copy of a socket that has none yet). `receiver`: received
    /// bytes come here, `carry` first (taken only on success). `None` past the quota.
    pub fn add_pinned(
        &mut self,
        stack: &mut Stack,
        p: &Pinned,
        receiver: bool,
        carry: &mut Vec<u8>,
    ) -> Option<u32> {
        let i = self.new_slot(p.kind, p.role)?;
        let s = self.sock(i);
        s.bound = p.bound;
        s.receiver = receiver;
        s.carry = std::mem::take(carry);
        if !receiver && p.role == Role::Conn && p.handle.is_some() {
            self.set_flags(i, FLAG_NOT_RECEIVER, 0);
        }
        if let Some(b) = p.bound {
            self.mem
                .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(b));
            self.set_flags(i, FLAG_BOUND, 0);
        }
        if let Some(h) = p.handle {
            let s = self.sock(i);
            s.handle = Some(h);
            s.shared = true;
            self.by_handle.insert(h, i);
            self.set_flags(i, FLAG_SHARED, 0);
            let (local, peer) = match p.role {
                Role::Udp => (stack.udp_local_addr(h).ok(), stack.udp_peer_addr(h).ok()),
                _ => (stack.tcp_local_addr(h).ok(), stack.tcp_peer_addr(h).ok()),
            };
            if let Some(l) = local {
                self.mem
                    .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                self.set_flags(i, FLAG_BOUND, 0);
            }
            if let Some(r) = peer.filter(|_| p.role != Role::Listener) {
                self.mem
                    .set_slot_addr(i, slot::PEER, &SockAddr::from_std(r));
                if p.role == Role::Udp {
                    self.set_flags(i, FLAG_CONNECTED, 0);
                }
            }
            self.refresh(stack, i);
        }
        Some(i)
    }

    /// Another holder reads shared stream `h` (`op::RX_WANT`): it takes the stream
    /// from this session, which receives it, with the bytes this session's client
    /// has not read (and the carry), as on the kernel, where bytes go to whoever
    /// reads. `None` if the client is copying out of its ring at this instant (the
    /// other holder asks again).
    pub fn yield_to_reader(&mut self, stack: &mut Stack, h: SocketHandle) -> Option<Vec<u8>> {
        let &i = self.by_handle.get(&h)?;
        let s = self.socks[i as usize].as_mut()?;
        if !s.receiver || s.role != Role::Conn {
            return None;
        }
        // Dekker's handshake with the client's reads (`slot::RX_BUSY`).
        let steal = self.mem.slot_word(i, slot::RX_STEAL);
        steal.store(1, SeqCst);
        if self.mem.slot_word(i, slot::RX_BUSY).load(SeqCst) != 0 {
            steal.store(0, Release);
            return None;
        }
        let mut out = Vec::new();
        let taken = s.rx.take_unread(&mut out);
        steal.store(0, Release);
        if taken.is_err() {
            self.stats.corrupt_rings += 1;
            return None;
        }
        s.receiver = false;
        out.append(&mut s.carry);
        self.set_flags(i, FLAG_NOT_RECEIVER, 0);
        self.refresh(stack, i);
        Some(out)
    }

    /// Received bytes of shared stack socket `h` come to this session from now on,
    /// `carry` first.
    pub fn become_receiver(&mut self, stack: &mut Stack, h: SocketHandle, carry: Vec<u8>) {
        let Some(&i) = self.by_handle.get(&h) else {
            return;
        };
        let s = self.sock(i);
        s.receiver = true;
        s.carry = carry;
        self.set_flags(i, 0, FLAG_NOT_RECEIVER);
        self.refresh(stack, i);
    }

    /// A shared stack socket's readiness changed through another holder: look again.
    pub fn refresh_handle(&mut self, stack: &mut Stack, h: SocketHandle) {
        if let Some(&i) = self.by_handle.get(&h) {
            self.refresh(stack, i);
        }
    }

    /// The client is gone (its process closed every descriptor): what it had
    /// already submitted is served, its own connections close
    /// ([`ServerSession::close_dead`]), and what it shared with other sessions is
    /// handed back for the loop to release. The one sequence `Loop::remove_session`
    /// and the fuzzing harness both run.
    pub fn depart(&mut self, stack: &mut Stack, budget: usize) -> Departure {
        // A broken session's requests are not run again: its sockets are only reset.
        if !self.broken {
            self.serve(stack, budget);
            self.drain_all(stack);
        }
        let released = std::mem::take(&mut self.released);
        let closed = released.len();
        let mut shared = Vec::with_capacity(closed);
        for (k, (h, left)) in released.into_iter().chain(self.take_shared()).enumerate() {
            shared.push((h, left, k >= closed));
        }
        let draining = self.close_dead(stack);
        Departure { shared, draining }
    }

    /// What must hold whatever the client wrote (checked by the fuzzing harness and
    /// tests): the session holds no more sockets than its quota, every stack socket it
    /// names is its own (so clean-up and limits reach it) and named once.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn check_invariants(&self, stack: &Stack) {
        let quota = self.mem.geometry().max_sockets as usize;
        assert!(self.socket_count() <= quota, "more sockets than the quota");
        assert_eq!(self.socket_count() + self.free.len(), quota, "slots lost");
        for (&h, &i) in &self.by_handle {
            let s = self.socks[i as usize]
                .as_ref()
                .expect("a named slot is open");
            let owner = if s.shared { SHARED } else { self.owner() };
            assert_eq!(
                stack.owner(h),
                Some(owner),
                "slot {i}'s stack socket is not the session's (nor shared)"
            );
            assert_eq!(s.handle, Some(h), "slot {i} names another socket");
        }
        for (i, s) in self.socks.iter().enumerate() {
            if let Some(h) = s.as_ref().and_then(|s| s.handle) {
                assert_eq!(
                    self.by_handle.get(&h),
                    Some(&(i as u32)),
                    "slot {i}'s stack socket is not in the session's map"
                );
            }
        }
    }

    pub fn stats_row(&self) -> ClientRow {
        ClientRow {
            id: self.id,
            pid: self.pid,
            command: self.command.clone(),
            sockets: self.socket_count() as u64,
            max_sockets: self.mem.geometry().max_sockets,
            ring_bytes: self.mem.geometry().ring_bytes,
            stats: self.stats,
            zero_copy: self.zc.as_ref().map(|z| ZcPortStat {
                held_buffers: z.held_references() as u64,
                bad_slots: z.bad_slots(),
            }),
            ..ClientRow::default()
        }
    }
}

/// `FLAG_SNDBUF` and `FLAG_WRITABLE` of connection `s` as (set, clear): whether its
/// send-buffer limit was chosen, and whether the stack would take a write now
/// (kept only while someone may wait for it).
fn send_bits(stack: &mut Stack, s: &Sock, h: SocketHandle) -> (u32, u32) {
    // Transmit timestamps mark the last byte of each write: the stack must see
    // the writes.
    let stamped = s.stamps.as_ref().is_some_and(|st| st.wants_tx());
    let bounded = s.sndbuf_set || stamped || stack.tcp_send_limit_chosen(h).unwrap_or(false);
    let mut set = if bounded { FLAG_SNDBUF } else { 0 };
    // The client waits on this flag: a "no" arms the stack's wake for the ACK that
    // makes room (`tcp_poll_writable`), or a write pushed for the client later (its
    // queued bytes) could fill the socket with nothing left to report it emptied.
    if (bounded || s.send_used) && stack.tcp_poll_writable(h) {
        set |= FLAG_WRITABLE;
    }
    (set, (FLAG_SNDBUF | FLAG_WRITABLE) & !set)
}

/// The bytes of a send ring that `op::SEND` dropped (the stack refused them), kept
/// while SO_ZEROCOPY maps the stack's acknowledged bytes back to ring positions.
#[derive(Debug, Default)]
struct TxGaps {
    /// (ring position, length), in order, not yet passed by the acknowledgements.
    list: std::collections::VecDeque<(u64, u64)>,
    /// The length of the gaps already passed.
    passed: u64,
}

impl TxGaps {
    fn push(&mut self, pos: u64, len: u64) {
        self.list.push_back((pos, len));
    }

    /// The ring position up to which the peer acknowledged everything, from the
    /// ring's consumed position and the bytes the stack still holds. A gap right
    /// at the acknowledged point counts as acknowledged: nothing of it waits.
    fn acked(&mut self, consumed: u64, queued: u64) -> u64 {
        let dropped = self.passed + self.list.iter().map(|g| g.1).sum::<u64>();
        // Bytes the stack took and the peer acknowledged, then as ring positions.
        let mut at = consumed.saturating_sub(dropped).saturating_sub(queued) + self.passed;
        while let Some(&(pos, len)) = self.list.front() {
            if pos > at {
                break;
            }
            at += len;
            self.passed += len;
            self.list.pop_front();
        }
        at
    }
}

fn ring_size(s: &Sock) -> usize {
    s.tx.size()
}

/// Whether a datagram of `len` bytes fits in the receive ring as one record (with
/// the skip to the ring's start that a record too long for the tail needs).
fn udp_record_fits(rx: &mut ByteProducer, len: usize) -> bool {
    let rec = usnet_abi::record_len(len);
    let Ok(free) = rx.free() else {
        return false;
    };
    let size = rx.size();
    let to_end = size - (rx.position() as usize & (size - 1));
    let need = if rec > to_end { to_end + rec } else { rec };
    need <= free
}

#[cfg(test)]
mod tests {
    use super::TxGaps;

    #[test]
    fn dropped_bytes_are_stepped_over_when_mapping_acknowledgements() {
        let mut g = TxGaps::default();
        assert_eq!(g.acked(100, 40), 60, "no gaps: ring and stack agree");
        // Ring 0..100 taken; 100..130 dropped; 130..200 taken.
        g.push(100, 30);
        // The stack holds 90 unacknowledged bytes of the 170 it took: 80 acked.
        assert_eq!(g.acked(200, 90), 80);
        // All of the first 100 acknowledged: the gap right after counts too.
        assert_eq!(g.acked(200, 70), 130);
        assert_eq!(g.acked(200, 50), 150);
        // The passed gap is forgotten, its length kept.
        assert!(g.list.is_empty());
        g.push(200, 10);
        assert_eq!(g.acked(260, 50), 200 + 10, "everything before the new gap");
        assert_eq!(g.acked(260, 0), 260);
    }
}
