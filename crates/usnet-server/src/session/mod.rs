//! One client session at the server: its shared memory, the server's ends of its rings,
//! and the server-side state of each of its sockets. Everything the client wrote is
//! checked here: opcodes, slot numbers and generations, addresses, ring counters and
//! record lengths. A bad value is answered with an errno or counted and dropped; it
//! never reaches the stack unchecked.
//!
//! This module holds the session, its slots and the dispatch of requests; the work is
//! split by job, each module owning its part of the state:
//!
//! - `calls`: the socket calls (socket, bind, listen, accept, connect, shutdown, close)
//! - `options`: setsockopt and getsockopt
//! - `streams`: bytes between the slots' rings and the stack's sockets, both ways,
//!   with the send-side reports (credit, SO_ZEROCOPY, SO_TIMESTAMPING)
//! - `lifecycle`: a slot's close, the client's death, a panic kept to one session
//! - `sharing`: stack sockets held by several sessions after a fork

mod calls;
mod lifecycle;
mod options;
mod sharing;
mod streams;

pub(crate) use sharing::{Pinned, SHARED};

use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;

use std::os::fd::{AsFd, BorrowedFd};
use usnet_session::ctl::msg::{ClientRow, ZcPortStat};
use usnet_session::Session;
use usnet_session_abi::{
    errno, op, slot, Completion, Request, SockAddr, BIND_REUSE, BIND_REUSEPORT, CONNECT_FASTOPEN,
    SLOT_OPEN,
};
use usnet_shm::spsc::{Consumer, Producer};
use usnet_shm::{ByteConsumer, ByteProducer, EventFd, FutexBell};
use usnet_stack::{Owner, SocketHandle, Stack, StackError};

use crate::ServerLimits;
use calls::families;
use options::apply_deferred;
use streams::TxGaps;

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
    /// Its number in a claim's slot map (`usnet_session_abi::role`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Role::Fresh => usnet_session_abi::role::FRESH,
            Role::Listener => usnet_session_abi::role::LISTENER,
            Role::Conn => usnet_session_abi::role::CONN,
            Role::Udp => usnet_session_abi::role::UDP,
        }
    }
}

/// A UDP datagram taken from a send ring that the stack refused for now.
#[derive(Debug)]
struct PendingDgram {
    data: Vec<u8>,
    /// None: the connected peer.
    to: Option<SocketAddr>,
    /// What the sender chose of its IP header (`sendmsg`'s control messages).
    meta: usnet_stack::UdpSendMeta,
}

struct SessionSocket {
    kind: u64,
    role: Role,
    handle: Option<SocketHandle>,
    flags: u32,

    // Before the stack socket exists (`calls`, `options`).
    /// `bind` before `listen`/`connect` (TCP) records the address here.
    bound: Option<SocketAddr>,
    /// A fresh TCP socket pinned for another process: every copy of it (in each
    /// process that holds it) is in this group, and the first to listen makes the
    /// listener the others then name ([`crate::shared::FreshGroups`]).
    group: Option<u64>,
    /// The stack's hold on that port until the socket listens, connects or closes
    /// (`Stack::tcp_bind`).
    binding: Option<u64>,
    /// SO_REUSEPORT at `bind`: its listener joins a reuseport group.
    reuseport: bool,
    /// TCP_MAXSEG set before `connect`: the SYN's MSS is at most this.
    connect_mss: Option<u16>,
    /// TCP_SYNCNT set before `connect`.
    syn_retries: Option<u32>,
    /// A TCP socket's IP header fields per family ([`usnet_stack::IpFamily::index`]), as set: a
    /// fresh socket's go to the stack at connect or listen, a listener's are its
    /// accepted connections'.
    tcp_ip: [usnet_stack::TcpIpOpts; 2],
    /// Multicast options set on a UDP socket before the stack socket existed:
    /// applied, in order, when it is made (bind, connect, first send).
    deferred: Vec<[u64; 6]>,

    // The send direction (`streams`).
    tx: ByteConsumer,
    /// The connection sends from the send ring in place (its send buffer is the
    /// ring: `Stack::tcp_lend_send_buffer`); ring bytes go back to the client as
    /// they are acknowledged, not as they are taken.
    lent: bool,
    /// The ring may still be lent: not tried yet, and nothing (a bounded write,
    /// sharing, a refusal, a ring taken back) ruled it out.
    lendable: bool,
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
    /// `shutdown(SHUT_WR)` waits for the send ring to drain.
    shut_wr: bool,
    /// A UDP datagram taken from the send ring that the stack refused for now.
    pending_dgram: Option<PendingDgram>,

    // The receive direction (`streams`).
    rx: ByteProducer,
    /// The receive ring was full: wait for the client's RX_KICK.
    rx_blocked: bool,
    /// The connection writes what it receives in order straight into the receive
    /// ring (`Stack::tcp_set_recv_sink` with a `TailLoan` of it), where it would
    /// queue it for `refresh` to copy: one copy fewer per byte received.
    rx_direct: bool,
    /// End of stream reached and told to the client.
    eof: bool,

    // Closing (`lifecycle`).
    /// The client closed it: send what the send ring holds, then close.
    closing: bool,

    // Sharing after a fork (`sharing`).
    /// The stack socket is held by several sessions (after a fork): it belongs to
    /// [`SHARED`], and the loop's table of shared sockets names every holder.
    shared: bool,
    /// Received bytes come to this slot (always, unless the socket is shared and
    /// another holder has the stream: see `Loop::release_shared`).
    receiver: bool,
    /// Stream bytes to hand over before what the stack holds: what the previous
    /// receiver left unread in its ring when it let go.
    carry: Vec<u8>,
}

impl SessionSocket {
    /// What its stack socket carries, when it is a datagram socket.
    fn dgram_proto(&self) -> usnet_stack::DgramProto {
        match self.kind {
            usnet_session_abi::KIND_ICMP => usnet_stack::DgramProto::Icmp,
            usnet_session_abi::KIND_RAW => usnet_stack::DgramProto::Raw,
            _ => usnet_stack::DgramProto::Udp,
        }
    }
}

/// Counters of one session (shown by `usnet stat`): the control protocol's type.
pub use usnet_session::ctl::msg::SessionStats;

pub(crate) struct ServerSession {
    pub id: u32,
    pub pid: u32,
    pub command: String,
    pub mem: Session,
    limits: ServerLimits,
    pub stats: SessionStats,

    // Requests and completions (the dispatch, here).
    sq: Consumer,
    cq: Producer,
    bell: FutexBell,
    /// The session's eventfd (sent to the client at attach): written as well as
    /// the bell while the client announces a thread that waits in `poll(2)` on
    /// kernel descriptors too (`hdr::WANT_EVENTFD`).
    efd: EventFd,
    /// Completions that did not fit the completion ring (bounded by the SQ budget).
    backlog: std::collections::VecDeque<Completion>,
    /// Something changed for the client this turn: notify its bell.
    pub dirty: bool,
    /// Slots whose `EVENTS` moved this turn while a client thread slept on that
    /// socket alone (`slot::SLEEPERS`): woken at [`ServerSession::notify`].
    slot_wakes: Vec<u32>,

    // Slots (here; `calls` opens them, `lifecycle` gives them back).
    /// One entry per slot of the geometry, boxed: a client gets room for 1,024
    /// sockets (up to 65,536) and most use a few, so an empty slot costs a pointer
    /// here, not a whole socket's state (several hundred bytes).
    socks: Vec<Option<Box<SessionSocket>>>,
    free: Vec<u32>,
    /// Keyed by the stack's handles (FxHash: no client picks a key).
    by_handle: FxHashMap<SocketHandle, u32>,
    /// A bind, listen or close happened (a sharded server rereads its ports).
    pub(crate) ports_changed: bool,
    /// A sharded server's listeners on the other shards (`None`: one shard): a
    /// TCP bind or listen that would clash with one fails as it would in one stack.
    pub(crate) elsewhere: Option<crate::Elsewhere>,

    // Stream work (`streams`).
    /// Slots whose send ring the server looks at each turn.
    active: Vec<u32>,
    /// Connections with SO_ZEROCOPY on (`slot::TX_ACKED` published every pass).
    zc_watched: Vec<u32>,
    /// Connections sending from a lent send ring that still holds bytes not given
    /// back (looked at every pass: what was acknowledged returns to the client).
    lent_held: Vec<u32>,
    /// Connections with SO_TIMESTAMPING transmit reports (looked at every pass).
    ts_watched: Vec<u32>,
    /// Slots whose receive ring has room while the stack still holds bytes for them
    /// (the per-turn budget ran out): refreshed again next turn.
    rx_again: Vec<u32>,
    scratch: Vec<u8>,

    // What the loop settles between sessions (`sharing`).
    /// Shared stack sockets whose slot this session closed, with the bytes its
    /// receive ring still held: the loop passes them on (or closes the socket).
    pub(crate) released: Vec<(SocketHandle, Vec<u8>)>,
    /// Shared stack sockets whose readiness a call of this session changed (an
    /// accept): the loop refreshes the other holders' view.
    pub(crate) touched: Vec<SocketHandle>,
    /// Shared streams this session reads without being their receiver
    /// (`op::RX_WANT`): the loop decides whether they come here.
    pub(crate) wants: Vec<SocketHandle>,
    /// Shared stack sockets this session began to hold in its turn (a listen that
    /// named its group's listener, or made it): the loop adds it to their holders.
    pub(crate) joined: Vec<SocketHandle>,
    /// The loop's listeners of fresh sockets held by several processes.
    pub(crate) groups: Option<crate::shared::FreshGroups>,

    /// The session's zero-copy port, if the client opened one (`crate::zc`).
    pub(crate) zc: Option<crate::zc::ServerZc>,

    // Panic containment (`lifecycle`).
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

/// Completions a client may leave unread before the server stops serving it.
pub const BACKLOG_MAX: usize = 1024;

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
            efd: EventFd::new()?,
            socks: (0..n).map(|_| None).collect(),
            free: (0..n).rev().collect(),
            by_handle: FxHashMap::default(),
            active: Vec::new(),
            zc_watched: Vec::new(),
            lent_held: Vec::new(),
            ts_watched: Vec::new(),
            rx_again: Vec::new(),
            backlog: Default::default(),
            dirty: false,
            slot_wakes: Vec::new(),
            stats: SessionStats::default(),
            scratch: Vec::new(),
            limits,
            mem,
            released: Vec::new(),
            touched: Vec::new(),
            wants: Vec::new(),
            joined: Vec::new(),
            groups: None,
            ports_changed: false,
            elsewhere: None,
            zc: None,
            broken: false,
            #[cfg(test)]
            panic_next: false,
        })
    }

    pub fn owner(&self) -> Owner {
        Owner(self.id)
    }

    /// Whether one of this session's slots holds stack socket `h`.
    pub fn holds(&self, h: SocketHandle) -> bool {
        self.by_handle.contains_key(&h)
    }

    /// The slot holding this session's copy of fresh-socket group `g`, if one does.
    pub fn slot_in_group(&self, g: u64) -> Option<u32> {
        self.socks
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.group == Some(g) && !s.closing))
            .map(|i| i as u32)
    }

    /// The slot that holds stack socket `h`, if one does.
    pub fn slot_holding(&self, h: SocketHandle) -> Option<u32> {
        self.by_handle.get(&h).copied()
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
            if !self.slot_wakes.is_empty() {
                self.slot_wakes.sort_unstable();
                self.slot_wakes.dedup();
                for &i in &self.slot_wakes {
                    usnet_shm::futex::wake(self.mem.slot_word(i, slot::EVENTS), u32::MAX);
                    self.stats.notifies += 1;
                }
                self.slot_wakes.clear();
            }
            if self.bell.bump_and_notify() {
                self.stats.notifies += 1;
            }
            // After the SeqCst bump, a SeqCst look at the announcement
            // (`usnet_client`'s `Conn::sleep_with_kernel` has the other half).
            if self
                .mem
                .word(usnet_session_abi::hdr::WANT_EVENTFD)
                .load(SeqCst)
                != 0
            {
                self.efd.ring();
                self.stats.notifies += 1;
            }
        }
    }

    /// Wakes every thread of the client, asleep on the bell, on one socket
    /// (`slot::SLEEPERS`) or in `poll(2)` (the server is going). Each slot's
    /// `EVENTS` moves whether or not a sleeper is announced yet: one about to sleep
    /// read it before and returns at once.
    pub fn wake_all(&self) {
        for i in 0..self.socks.len() as u32 {
            usnet_shm::Gate::new(
                self.mem.slot_word(i, slot::EVENTS),
                self.mem.slot_word(i, slot::SLEEPERS),
            )
            .bump_and_notify(u32::MAX);
        }
        self.bell.ring();
        self.efd.ring();
    }

    /// The session's eventfd, which the client gets at attach.
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    // ------------------------------------------------------------ requests

    /// Serves up to `budget` requests. Returns how many. A client that does not
    /// read its completions stops being served once [`BACKLOG_MAX`] wait.
    pub fn serve_requests(&mut self, stack: &mut Stack, budget: usize) -> usize {
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
                        if let (true, false, Role::Conn | Role::Udp, Some(h)) =
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
                self.join_group_listener(stack, i);
                if req.op != op::SEND {
                    self.flush_dgrams(stack, i);
                }
                ok(match req.op {
                    op::BIND => self.op_bind(
                        stack,
                        i,
                        SockAddr::from_args(&req.args),
                        families(req.args[4]),
                        (
                            req.args[5] & BIND_REUSE != 0,
                            req.args[5] & BIND_REUSEPORT != 0,
                        ),
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
                    op::LOCAL_ERROR => self.op_local_error(stack, i, &req.args),
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

    // ------------------------------------------------------------ slots

    fn sock(&mut self, i: u32) -> &mut SessionSocket {
        self.socks[i as usize]
            .as_deref_mut()
            .expect("checked by slot_of")
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
        self.socks[i as usize] = Some(Box::new(SessionSocket {
            kind,
            role,
            handle: None,
            bound: None,
            group: None,
            binding: None,
            reuseport: false,
            connect_mss: None,
            syn_retries: None,
            tcp_ip: Default::default(),
            rx,
            tx,
            lent: false,
            lendable: true,
            tx_active: false,
            zc_watch: false,
            sndbuf_set: false,
            send_used: false,
            tx_gaps: Default::default(),
            written: 0,
            stamps: None,
            rx_blocked: false,
            rx_direct: false,
            closing: false,
            shut_wr: false,
            eof: false,
            flags: 0,
            pending_dgram: None,
            shared: false,
            receiver: true,
            carry: Vec::new(),
            deferred: Vec::new(),
        }));
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
        // Gate's producer half on the slot's words (usnet_shm::doorbell): the SeqCst
        // bump, then a SeqCst look at the announcement of a thread that sleeps on
        // this socket alone; the wake itself waits for the end of the turn.
        self.mem.slot_word(i, slot::EVENTS).fetch_add(1, SeqCst);
        if self.mem.slot_word(i, slot::SLEEPERS).load(SeqCst) != 0 {
            self.slot_wakes.push(i);
        }
        self.dirty = true;
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::*;

    use usnet_session_abi::{hdr, op, Request};

    use crate::fuzzing::Harness;

    /// The completions in the ring, taken as the client takes them.
    fn completions(h: &Harness) -> Vec<u64> {
        let mem = h.mem();
        let head = mem.word(hdr::CQ_HEAD).load(Acquire);
        let mut tail = mem.word(hdr::CQ_TAIL).load(Relaxed);
        let mut tags = Vec::new();
        while tail != head {
            tags.push(mem.read_completion(tail).tag);
            tail = tail.wrapping_add(1);
        }
        mem.word(hdr::CQ_TAIL).store(tail, Release);
        tags
    }

    fn nop(tag: u64) -> Request {
        Request {
            op: op::NOP,
            tag,
            ..Default::default()
        }
    }

    /// Completions that do not fit the completion ring (8 entries here) wait in the
    /// backlog and reach the client, in order, once it makes room.
    #[test]
    fn completions_past_a_full_ring_wait_and_keep_their_order() {
        let mut h = Harness::new();
        for tag in 1..=8 {
            h.submit(&nop(tag));
        }
        h.turn();
        for tag in 9..=12 {
            h.submit(&nop(tag));
        }
        h.turn();
        assert_eq!(h.parts(1).0.backlog.len(), 4);
        assert!(h.parts(1).0.has_work(), "the backlog is work");
        assert_eq!(completions(&h), (1..=8).collect::<Vec<_>>());
        h.turn();
        assert_eq!(completions(&h), (9..=12).collect::<Vec<_>>());
        assert_eq!(h.parts(1).0.stats.calls, 12);
        h.finish();
    }

    /// Kicks complete nothing and are counted apart from calls; a kick for a slot
    /// that is not open is ignored.
    #[test]
    fn kicks_complete_nothing_and_are_not_calls() {
        let mut h = Harness::new();
        for (op, slot) in [(op::TX_KICK, 0), (op::RX_KICK, 3), (op::NOP, 0)] {
            h.submit(&Request {
                op,
                slot,
                tag: 77,
                ..Default::default()
            });
        }
        h.turn();
        assert_eq!(completions(&h), [77], "only the NOP completes");
        let stats = h.parts(1).0.stats;
        assert_eq!((stats.calls, stats.kicks, stats.bad_requests), (1, 2, 0));
        h.finish();
    }

    /// The server writes the session's eventfd when, and only when, a client thread
    /// announced that it waits in `poll(2)` with kernel descriptors
    /// (`hdr::WANT_EVENTFD`); the bell's `seq` moves either way.
    #[test]
    fn the_eventfd_is_written_while_a_client_waits_with_kernel_descriptors() {
        use usnet_session_abi::hdr;
        let mem =
            usnet_session::Session::create(1, usnet_session_abi::Geometry::default()).unwrap();
        let mut s =
            super::ServerSession::new(1, 0, "t".into(), mem, crate::ServerLimits::default())
                .unwrap();
        let readable = |s: &super::ServerSession| {
            let mut p = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&s.eventfd()),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        let seq = |s: &super::ServerSession| s.mem.word(hdr::CLIENT_BELL_SEQ).load(SeqCst);
        let before = seq(&s);
        s.dirty = true;
        s.notify();
        assert_ne!(seq(&s), before, "the bell moves");
        assert!(!readable(&s), "nobody announced: no write");
        s.mem.word(hdr::WANT_EVENTFD).store(1, SeqCst);
        s.dirty = true;
        s.notify();
        assert!(readable(&s), "a waiter announced: written");
        s.efd.drain();
        s.notify();
        assert!(!readable(&s), "nothing changed: nothing written");
        s.wake_all();
        assert!(readable(&s), "the server going wakes everyone");
    }

    /// A session and a client thread asleep on its slot 3 alone (a futex wait on
    /// that slot's `EVENTS`, for up to 20 s), announced when this returns; the
    /// receiver says whether it slept, once it wakes.
    fn a_sleeper_on_slot_3() -> (
        super::ServerSession,
        std::sync::mpsc::Receiver<bool>,
        std::thread::JoinHandle<()>,
    ) {
        use std::time::Duration;
        use usnet_session_abi::slot;
        let mem =
            usnet_session::Session::create(1, usnet_session_abi::Geometry::default()).unwrap();
        let s = super::ServerSession::new(1, 0, "t".into(), mem, crate::ServerLimits::default())
            .unwrap();
        let region = s.mem.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            let g = usnet_shm::Gate::new(
                region.slot_word(3, slot::EVENTS),
                region.slot_word(3, slot::SLEEPERS),
            );
            let seen = g.seq();
            let slept = g.sleep(seen, || false, Duration::from_secs(20));
            tx.send(slept).unwrap();
        });
        let asleep = std::time::Instant::now() + Duration::from_secs(20);
        while s.mem.slot_word(3, slot::SLEEPERS).load(SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < asleep,
                "the thread never announced"
            );
            std::thread::yield_now();
        }
        (s, rx, sleeper)
    }

    /// A client thread asleep on one socket (`slot::SLEEPERS`, a futex wait on
    /// its `EVENTS`) is woken by that socket's news and by no other socket's: a
    /// thread-per-connection program is not woken whole on every turn.
    #[test]
    fn a_thread_asleep_on_one_socket_is_woken_by_its_news_alone() {
        let (mut s, rx, sleeper) = a_sleeper_on_slot_3();
        let before = s.stats.notifies;
        s.bump(5);
        s.notify();
        assert_eq!(s.stats.notifies, before, "another socket's news: no wake");
        s.bump(3);
        s.bump(3);
        s.notify();
        assert_eq!(s.stats.notifies, before + 1, "its own: one wake per turn");
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(20)),
            Ok(true)
        );
        sleeper.join().unwrap();
    }

    /// A server that goes wakes the threads asleep on one socket too, not only
    /// those on the session's bell: they would otherwise learn it only at their
    /// next look at the control connection (up to `LIVENESS_SLICE_MAX` in
    /// usnet-client, 1 s; the sleeper here waits 20 s).
    #[test]
    fn a_server_that_goes_wakes_the_threads_asleep_on_one_socket() {
        let (s, rx, sleeper) = a_sleeper_on_slot_3();
        s.wake_all();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(10)),
            Ok(true),
            "woken by the server's going, not by its 20 s timeout"
        );
        sleeper.join().unwrap();
    }

    /// A session's socket table costs a pointer per slot until the slot is used: a
    /// client gets room for 1,024 sockets unless it asks (up to the server's cap),
    /// and most use a few. Held inline, every empty slot took a whole socket's
    /// state: 16,384 slots of a session with 2,000 connections were megabytes, about
    /// 3 KB per connection (`usnet bench conns`, docs/benchmarks.md).
    #[test]
    fn an_empty_slot_costs_a_pointer_not_a_socket() {
        use usnet_session_abi::Geometry;
        let slots = 16_384;
        let g = Geometry {
            max_sockets: slots,
            ring_bytes: 4096,
            ..Geometry::default()
        };
        let mem = usnet_session::Session::create(1, g).unwrap();
        let s = super::ServerSession::new(1, 0, "t".into(), mem, crate::ServerLimits::default())
            .unwrap();
        let table = s.socks.capacity() * std::mem::size_of_val(&s.socks[0])
            + s.free.capacity() * std::mem::size_of::<u32>();
        let per_slot = table / slots as usize;
        assert!(per_slot <= 16, "{per_slot} bytes per empty slot");
        assert!(
            std::mem::size_of::<super::SessionSocket>() > 16 * per_slot,
            "a socket's state is much larger than an empty slot"
        );
    }
}
