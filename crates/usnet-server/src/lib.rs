//! The usnet stack server: one loop owns a [`Stack`] and its device (through the shared
//! [`Driver`]) and serves client processes through shared-memory sessions
//! (`usnet-session-abi`, `usnet-session`). No lock is shared with a client: a client writes
//! requests into its submission ring and bytes into its sockets' send rings, the loop
//! reads them, calls the stack, and writes completions, received bytes and readiness
//! back into the client's memory, then rings the client's bell if it sleeps.
//!
//! Around the loop: a control thread serves the stack's control socket (attach, stat,
//! ping, stop) and watches every client's connection, so a client that dies is noticed
//! at once and everything it held is reset and given back. Work for the loop from other
//! threads (a new session, a statistics snapshot, a ping) travels as [`Job`]s through a
//! channel, followed by a ring of the loop's bell.
// `usnet stat`'s answer is one json! literal deeper than the default limit.
#![recursion_limit = "256"]

mod bell;
pub mod control;
#[doc(hidden)]
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(any(test, feature = "testing"))]
pub mod hostile;
pub mod mirror;
pub mod privs;
mod session;
mod shared;
mod zc;
mod zc_slots;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use usnet_driver::{AnyClock, Driver, SystemClock};
use usnet_link::Device;
use usnet_session::ctl::msg::{ClientRow, SocketRow};
use usnet_session_abi::{hdr, Geometry};
use usnet_stack::{Owner, SocketHandle, Stack};

pub use bell::ServerBell;
pub use session::SessionStats;
use session::{ServerSession, SHARED};
use shared::Sharing;

/// What a client may use and how the loop shares itself out.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Requests served per client per turn (no client starves another).
    pub budget: usize,
    /// Bytes moved per socket per turn between a ring and the stack: the cluster size
    /// (MCLBYTES) times the clusters one request may carry (MCLNUM).
    pub chunk: usize,
    /// Clients at once.
    pub max_sessions: usize,
    /// The largest listen backlog a client gets (connections that wait in a
    /// listener's accept queue are the client's stack sockets too, outside its slot
    /// quota); a larger request is cut down and counted (`quota_backlog`).
    pub max_backlog: usize,
    /// The largest UDP receive buffer (`SO_RCVBUF`) a client may set: the bytes of
    /// pool buffers one of its sockets may hold while its receive ring is full; a
    /// larger request is cut down and counted (`quota_rcvbuf`).
    pub max_rcvbuf: usize,
    /// The share of the packet pool, in percent, that one client's receive queues
    /// may hold (datagrams waiting while its rings are full); past it the client's
    /// datagrams are dropped and counted, so one client that stops reading cannot
    /// take the pool from the others.
    pub max_pool_percent: u32,
}

impl ServerLimits {
    /// [`ServerLimits::max_pool_percent`] of a pool of `count` buffers, in buffers.
    pub fn pool_share(&self, count: u32) -> u32 {
        (u64::from(count) * u64::from(self.max_pool_percent.min(100)) / 100) as u32
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            budget: 64,
            chunk: 256 * 1024,
            max_sessions: 1024,
            max_backlog: 1024,
            max_rcvbuf: 4 << 20,
            max_pool_percent: 25,
        }
    }
}

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The stack's name (its control socket).
    pub name: String,
    /// The link, as given on the command line (for `stat`).
    pub link: String,
    /// Per-session geometry: rings, sockets per client (the socket quota), ring size.
    pub geometry: Geometry,
    pub limits: ServerLimits,
    /// Busy-poll this long after the last work before sleeping.
    pub spin: Duration,
    /// Besides the stack's owner, members of this group may attach (socket mode 0660).
    pub group: Option<u32>,
    /// Zero-copy ports for clients of the stack's own user (and root): such a
    /// client maps the whole packet pool, so it can read and write every buffer,
    /// other clients' traffic included (netmap's trust model). Off by default.
    pub zero_copy: bool,
    /// Services running as clients of this server (for `stat`).
    pub services: Vec<String>,
    /// Kernel-like receive backlog (`Driver::set_backlog`); on by itself when the
    /// stack's receive policy is on.
    pub backlog: bool,
    /// The loop thread's nice value (None: inherited). A better one than the
    /// applications' gives the protocol work the precedence the kernel's softirq
    /// has over processes; lowering it needs CAP_SYS_NICE or RLIMIT_NICE.
    pub loop_nice: Option<i32>,
    /// Mirror the stack's interface into a network namespace of its own and give
    /// clients their `NETLINK_ROUTE` sockets there ([`mirror`]); needs root. Off
    /// by default here (`usnet up` turns it on when it runs as root).
    pub mirror: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            name: "usnet".into(),
            link: String::new(),
            geometry: Geometry::default(),
            limits: ServerLimits::default(),
            spin: Duration::from_micros(50),
            group: None,
            zero_copy: false,
            services: Vec::new(),
            backlog: false,
            loop_nice: None,
            mirror: false,
        }
    }
}

/// How long the closed sockets of a client that is gone may take to send what their
/// rings still hold (a peer that stopped reading would otherwise pin them).
const DYING_DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Sockets listed per client by `stat`/`clients` (the counts are always whole).
const STAT_MAX_CLIENT_SOCKETS: usize = 256;

/// Work another thread hands to the loop.
pub type Job = Box<dyn FnOnce(&mut Loop) + Send>;

/// The loop's state, as a [`Job`] sees it.
pub struct Loop {
    pub driver: Driver<Box<dyn Device>, AnyClock>,
    sessions: shared::Sessions,
    /// Sessions of clients that are gone, kept while sockets they closed still
    /// drain their send rings, with the time they must be done by.
    dying: Vec<(ServerSession, Instant)>,
    /// Stack sockets held by several sessions, and pins for forked children.
    sharing: Sharing,
    order: Vec<u32>,
    pub cfg: ServerConfig,
    pub started: Instant,
    stop: Arc<AtomicBool>,
    /// Sessions that ended (client gone), for `stat`.
    pub sessions_closed: u64,
    /// Sessions cut off because serving them panicked.
    pub sessions_broken: u64,
    /// Attaches refused because `max_sessions` clients were attached.
    pub quota_sessions: u64,
    /// Passes of the loop that did work: a harness on virtual time reads it twice
    /// around a wait to tell whether the loop was quiet in between.
    pub busy_passes: u64,
    /// This loop's shard, and the host's shards (one: not sharded).
    pub shard: usize,
    host: Arc<Host>,
    /// The ports this shard holds sockets on, as last told to the host.
    published: HashSet<(u8, u16)>,
    ports_read: Instant,
    /// A client bound, listened or closed in this pass: reread the ports now.
    ports_changed: bool,
}

/// A loop's mailbox for jobs, and the bell that wakes it.
#[derive(Clone)]
pub(crate) struct ShardLink {
    pub jobs: Sender<Job>,
    pub bell: ServerBell,
}

/// What the shards of one stack server share, off the per-packet path: a way to
/// hand each other jobs, and the directory of which shards hold a socket on which
/// port (a shard without one hands the port's segments to one with it:
/// `Stack::set_port_redirect`).
///
/// Lock order: the server has three locks and each is a leaf — `ports` and
/// `listeners` here and the control plane's `homes` (`control.rs`): a thread holds
/// at most one of them, never while it takes another, and never across a call
/// into a stack or a session (a shard's loop publishes its listeners, lets go,
/// then publishes its ports). Everything else a loop touches is its own.
pub(crate) struct Host {
    pub links: Vec<ShardLink>,
    /// `(protocol, port)` → a bit per shard holding a socket on it.
    ports: Mutex<HashMap<(u8, u16), u64>>,
    /// Each shard's TCP listeners (address, families, SO_REUSEPORT), as it last
    /// published them.
    listeners: Mutex<Vec<Vec<(std::net::SocketAddr, usnet_stack::Families, bool)>>>,
}

/// What a session of shard `me` checks a TCP bind or listen against: the other
/// shards' listeners (one stack refuses a second listener that shares an address
/// and a family, unless both set SO_REUSEPORT; the host of several does too: the
/// members of a reuseport group on several shards share the port's connections
/// as the redirects spread them). A shard's list is as of its last
/// pass that bound, listened or closed (at most 250 ms old after a client died), so
/// two listens on two shards in the same instant may both pass.
#[derive(Clone)]
pub(crate) struct Elsewhere {
    me: usize,
    host: Arc<Host>,
}

impl Elsewhere {
    pub fn clash(
        &self,
        addr: std::net::SocketAddr,
        fam: usnet_stack::Families,
        reuseport: bool,
    ) -> bool {
        if addr.port() == 0 {
            return false;
        }
        let all = self
            .host
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        all.iter().enumerate().any(|(k, list)| {
            k != self.me
                && list.iter().any(|&(l, f, shared)| {
                    l.port() == addr.port()
                        && !(reuseport && shared)
                        && usnet_stack::Families::overlap(l.ip(), f, addr.ip(), fam)
                })
        })
    }
}

impl Host {
    /// Shard `me` holds sockets on `added` now, and none on `removed`: every shard
    /// learns where the port's segments go.
    fn publish(&self, me: usize, added: &[(u8, u16)], removed: &[(u8, u16)]) {
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        for (key, on) in added
            .iter()
            .map(|k| (k, true))
            .chain(removed.iter().map(|k| (k, false)))
        {
            let bits = ports.entry(*key).or_default();
            if on {
                *bits |= 1 << me;
            } else {
                *bits &= !(1 << me);
            }
            let bits = *bits;
            if bits == 0 {
                ports.remove(key);
            }
            let holders: Vec<usize> = (0..self.links.len())
                .filter(|j| bits & (1 << j) != 0)
                .collect();
            // Sent under the lock: each shard gets the port's news in order.
            for (j, l) in self.links.iter().enumerate() {
                let to = if bits & (1 << j) != 0 {
                    Vec::new()
                } else {
                    holders.clone()
                };
                let (proto, port) = *key;
                let _ = l.jobs.send(Box::new(move |lp: &mut Loop| {
                    lp.stack().set_port_redirect(proto, port, &to)
                }));
                l.bell.ring();
            }
        }
    }
}

/// How often a shard rereads its ports besides after a bind, listen or close.
const PORTS_REREAD: Duration = Duration::from_millis(250);

impl Loop {
    pub fn stack(&mut self) -> &mut Stack {
        self.driver.stack_mut()
    }

    /// The host's shards.
    pub fn shards(&self) -> usize {
        self.host.links.len()
    }

    /// Tells the host which ports this shard holds sockets on, if that changed
    /// (`now`: a client bound, listened or closed; else at most every
    /// [`PORTS_REREAD`]).
    fn publish_ports(&mut self, now: bool) {
        if self.host.links.len() < 2 || (!now && self.ports_read.elapsed() < PORTS_REREAD) {
            return;
        }
        self.ports_read = Instant::now();
        let stack = self.driver.stack();
        // Ports of this shard's ephemeral class need no directory: the link
        // steers their flows here.
        let role = stack.config().shard;
        let listeners = stack.tcp_listeners();
        {
            let mut all = self
                .host
                .listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            all[self.shard] = listeners
                .iter()
                .map(|l| (l.local, l.families, l.reuseport))
                .collect();
        }
        let mut held: HashSet<(u8, u16)> = listeners.iter().map(|l| (6, l.local.port())).collect();
        // (An echo socket's identifier steers its replies by itself: usnet_stack::shard.)
        held.extend(
            stack
                .udp_sockets()
                .iter()
                .filter(|u| u.proto == usnet_stack::DgramProto::Udp)
                .map(|u| (17, u.local.port())),
        );
        held.retain(|&(_, port)| port != 0 && !role.owns_port(port));
        let added: Vec<_> = held.difference(&self.published).copied().collect();
        let removed: Vec<_> = self.published.difference(&held).copied().collect();
        if !added.is_empty() || !removed.is_empty() {
            self.host.publish(self.shard, &added, &removed);
            self.published = held;
        }
    }

    /// The stack's network interface as its clients' programs see it (the attach
    /// reply carries it).
    pub(crate) fn iface(&mut self) -> usnet_session::ctl::msg::Iface {
        use usnet_link::LinkSpec;
        use usnet_session::ctl::msg::Iface;
        let stack = self.driver.stack();
        let cfg = stack.config();
        let device = match self.cfg.link.parse::<LinkSpec>() {
            Ok(LinkSpec::Tap(n) | LinkSpec::AfPacket(n) | LinkSpec::Xdp { ifname: n, .. }) => {
                Some(n)
            }
            _ => None,
        };
        let (name, index) = match device {
            Some(n) if cfg.ifindex != 0 => (n, Iface::index_for(cfg.ifindex)),
            _ => ("usnet0".to_string(), Iface::index_for(0)),
        };
        Iface {
            name,
            index,
            mac: cfg.mac.0,
            mtu: stack.mtu() as u32,
            addrs: stack.addrs().iter().map(|c| c.to_string()).collect(),
        }
    }

    /// Adds an attached client's session.
    fn add_session(&mut self, mut s: ServerSession) {
        s.groups = Some(self.sharing.groups());
        let mtu = self.driver.stack().mtu() as u32;
        s.mem
            .word(usnet_session_abi::hdr::LINK_MTU)
            .store(mtu, Ordering::Release);
        if self.host.links.len() > 1 {
            s.elsewhere = Some(Elsewhere {
                me: self.shard,
                host: self.host.clone(),
            });
        }
        self.order.push(s.id);
        let (owner, pid) = (s.owner(), s.pid);
        self.sessions.insert(s.id, s);
        self.note_owner(owner, pid);
    }

    /// Priority-aware receive: the client's process is its sockets' consumer and
    /// its nice value their priority.
    fn note_owner(&mut self, owner: Owner, pid: u32) {
        // The built-in services attach from the server's own process: boosting it
        // would not help them.
        if !self.driver.stack().config().rx_policy.enabled()
            || pid == 0
            || pid == std::process::id()
        {
            return;
        }
        // A boosted client's nice value is ours, not its own: keep what we had.
        if self
            .driver
            .booster()
            .is_some_and(|b| b.boosted().contains(&pid))
        {
            return;
        }
        let priority = usnet_driver::sched::nice_of(pid).map_or(0, |n| -n);
        self.driver.stack_mut().set_owner_info(
            owner,
            usnet_stack::OwnerInfo {
                pid: Some(pid),
                priority,
            },
        );
    }

    /// Reads every client's nice value again (once per interval, from the loop).
    fn refresh_owners(&mut self) {
        let owners: Vec<(Owner, u32)> =
            self.sessions.values().map(|s| (s.owner(), s.pid)).collect();
        for (o, pid) in owners {
            self.note_owner(o, pid);
        }
    }

    /// A client is gone: reset and free everything it held.
    pub fn remove_session(&mut self, id: u32) {
        if let Some(mut s) = self.sessions.remove(&id) {
            let budget = self.cfg.limits.budget;
            let stack = self.driver.stack_mut();
            // What the client asked just before it went (a last shutdown or close, a
            // last write) still happens, as the kernel finishes a process's calls
            // before its exit closes the rest: those connections end with a FIN.
            let gone = s.depart(stack, budget);
            if let Some(port) = s.zc.take() {
                port.close(stack);
            }
            for h in gone.joined {
                self.sharing.join(h, id);
            }
            // Shared sockets it closed itself close gracefully if it was the last
            // holder; the ones it still held when it died are reset then.
            for (h, left, died) in gone.shared {
                self.release_shared(h, id, left, died);
            }
            let stack = self.driver.stack_mut();
            stack.clear_owner_info(s.owner());
            self.order.retain(|&x| x != id);
            self.sessions_closed += 1;
            self.ports_changed = true;
            s.mem.word(hdr::SERVER_GONE).store(1, Ordering::Release);
            if gone.draining {
                self.dying.push((s, Instant::now() + DYING_DRAIN_LIMIT));
            }
        }
    }

    /// Drains the closed sockets of clients that are gone; a session whose sockets
    /// are all done (or whose time is up: then they are reset) is dropped. Returns
    /// whether bytes moved (else the loop may sleep: the stack's ACKs wake it).
    fn drain_dying(&mut self) -> bool {
        if self.dying.is_empty() {
            // Every turn comes here: no clock read (3.7 % of a busy loop's samples
            // under redis-benchmark) when no client is dying.
            return false;
        }
        let stack = self.driver.stack_mut();
        let now = Instant::now();
        let mut moved = false;
        self.dying.retain_mut(|(s, deadline)| {
            let (left, m) = s.drain_closing(stack);
            moved |= m;
            if left && now < *deadline {
                return true;
            }
            for h in s.handles() {
                let _ = stack.tcp_abort(h);
            }
            false
        });
        moved
    }

    /// One row per attached client (pid, command, sockets, calls served...).
    /// With each row, the client's TCP sockets as `ss -p` shows them and the bytes the
    /// stack holds for it (its sockets' send and receive queues: its share of buffers).
    pub fn clients(&self) -> Vec<ClientRow> {
        let stack = self.driver.stack();
        let conns = stack.tcp_connections();
        let listeners = stack.tcp_listeners();
        let mut v: Vec<_> = self
            .sessions
            .values()
            .map(|s| {
                let owner = s.owner();
                let mut row = s.stats_row();
                let mine: Vec<_> = conns.iter().filter(|c| c.owner == owner).collect();
                row.stack_bytes = mine
                    .iter()
                    .map(|c| (c.info.recv_queued + c.info.send_queued) as u64)
                    .sum();
                row.tcp = listeners
                    .iter()
                    .filter(|l| l.owner == owner)
                    .map(|l| SocketRow {
                        state: "LISTEN".into(),
                        local: l.local.to_string(),
                        remote: "*".into(),
                        recv_q: l.accept_queue as u64,
                        send_q: 0,
                    })
                    .collect();
                row.tcp.extend(
                    mine.iter()
                        .take(STAT_MAX_CLIENT_SOCKETS)
                        .map(|c| SocketRow {
                            state: format!("{:?}", c.info.state),
                            local: c.local.to_string(),
                            remote: c.remote.to_string(),
                            recv_q: c.info.recv_queued as u64,
                            send_q: c.info.send_queued as u64,
                        }),
                );
                row.tcp_connections = mine.len() as u64;
                // Stack sockets the client holds, connections waiting in its
                // listeners' accept queues included.
                row.stack_sockets = stack.sockets_of(owner).len() as u64;
                row.pool_held = u64::from(stack.rx_held(owner));
                row
            })
            .collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Who owns a stack socket, as a client row id (0: the server itself).
    pub fn owner_pid(&self, owner: Owner) -> Option<u32> {
        self.sessions.get(&owner.0).map(|s| s.pid)
    }

    /// Stops every shard's loop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        for l in &self.host.links {
            l.bell.ring();
        }
    }

    /// Serves every session: requests (a budget each), send rings into the stack,
    /// then readiness and received bytes back into the rings. Returns whether
    /// anything was done.
    fn serve_sessions(&mut self, ready: &mut Vec<usnet_stack::SocketHandle>) -> bool {
        let budget = self.cfg.limits.budget;
        let stack = self.driver.stack_mut();
        let mut did = false;
        // Start at a different session each turn, so none always goes first.
        if !self.order.is_empty() {
            self.order.rotate_left(1);
        }
        let mut released = Vec::new();
        let mut touched = Vec::new();
        let mut wants = Vec::new();
        let mut joined = Vec::new();
        let mut broken = Vec::new();
        for id in &self.order {
            if let Some(s) = self.sessions.get_mut(id) {
                match s.serve_contained(stack, budget) {
                    Ok(n) => did |= n > 0,
                    Err(why) => {
                        eprintln!(
                            "usnet: client {} (pid {}, {}): serving it panicked ({why}); its session is cut off, the other clients go on",
                            s.id, s.pid, s.command
                        );
                        broken.push(*id);
                    }
                }
                self.ports_changed |= std::mem::take(&mut s.ports_changed);
                released.extend(s.released.drain(..).map(|(h, left)| (h, *id, left)));
                touched.append(&mut s.touched);
                wants.extend(s.wants.drain(..).map(|h| (h, *id)));
                joined.extend(s.joined.drain(..).map(|h| (h, *id)));
            }
        }
        // Holders first: a session may have listened and closed in one turn.
        for (h, id) in joined {
            self.sharing.join(h, id);
        }
        self.release_all(&mut released);
        for id in broken {
            self.sessions_broken += 1;
            self.remove_session(id);
            did = true;
        }
        let stack = self.driver.stack_mut();
        for (h, id) in wants {
            self.sharing.want(&mut self.sessions, stack, id, h);
        }
        // Zero-copy ports after the requests (a listen or connect just made), before
        // readiness: their sockets' news goes into their RX rings.
        for id in &self.order {
            if let Some(s) = self.sessions.get_mut(id) {
                if let Some(port) = s.zc.as_mut() {
                    if port.wants_sync(stack) && port.sync(stack) {
                        s.dirty = true;
                        did = true;
                    }
                }
            }
        }
        for h in touched {
            // Another holder accepted: every holder's view of the queue is redone.
            for id in self.sharing.holders(h) {
                if let Some(s) = self.sessions.get_mut(id) {
                    s.refresh_handle(stack, h);
                }
            }
        }
        stack.take_ready(ready);
        for h in ready.drain(..) {
            let Some(owner) = stack.owner(h) else {
                continue;
            };
            if owner == SHARED {
                // Readiness reaches every holder (all wake, as the kernel's waiters
                // on one socket do without EPOLLEXCLUSIVE).
                for id in self.sharing.holders(h) {
                    if let Some(s) = self.sessions.get_mut(id) {
                        s.on_ready(stack, h);
                        released.extend(s.released.drain(..).map(|(h, left)| (h, *id, left)));
                        did = true;
                    }
                }
                continue;
            }
            if let Some(s) = self.sessions.get_mut(&owner.0) {
                s.on_ready(stack, h);
                released.extend(s.released.drain(..).map(|(h, left)| (h, owner.0, left)));
                did = true;
            }
        }
        // A close can complete in the readiness pass too (the last bytes of a
        // closed slot went out): its shared socket is let go in this turn, not
        // left to a turn that may come only with the next event.
        self.release_all(&mut released);
        for s in self.sessions.values_mut() {
            s.notify();
        }
        did |= self.drain_dying();
        did
    }

    /// The shared stack sockets sessions closed (stack socket, session, what its
    /// receive ring held) are let go ([`Sharing::release`]): the last holder's
    /// close closes the stack socket. Gathered where the sessions close them, in
    /// their serve and in the readiness pass, not by a walk over every session.
    fn release_all(&mut self, released: &mut Vec<(SocketHandle, u32, Vec<u8>)>) {
        for (h, id, left) in released.drain(..) {
            self.release_shared(h, id, left, false);
        }
    }

    /// Session `id` let go of shared stack socket `h` (see [`Sharing::release`]).
    fn release_shared(&mut self, h: SocketHandle, id: u32, left: Vec<u8>, died: bool) {
        let stack = self.driver.stack_mut();
        self.sharing
            .release(&mut self.sessions, stack, h, id, left, died);
    }

    /// Pins every socket of session `from` (or those of slots `only`) for another
    /// process ([`Sharing::pin`]).
    pub(crate) fn pin(&mut self, from: u32, token: u128, only: Option<&[u32]>) -> Option<usize> {
        let stack = self.driver.stack_mut();
        self.sharing
            .pin(&mut self.sessions, stack, from, token, only)
    }

    /// How many sockets the pin `token` holds, if it is there.
    pub(crate) fn pin_size(&self, token: u128) -> Option<usize> {
        self.sharing.pin_size(token)
    }

    /// A pin nobody will claim ([`Sharing::drop_pin`]).
    pub(crate) fn drop_pin(&mut self, token: u128) {
        let stack = self.driver.stack_mut();
        self.sharing.drop_pin(stack, token);
    }

    /// The forked child's session `id` claims the pin `token` ([`Sharing::claim`]).
    pub(crate) fn claim(
        &mut self,
        id: u32,
        token: u128,
    ) -> Option<Vec<usnet_session_abi::Claimed>> {
        let stack = self.driver.stack_mut();
        self.sharing.claim(&mut self.sessions, stack, id, token)
    }

    /// Who made pin `token`, and whether its child may live on another shard
    /// ([`Sharing::pin_info`]).
    pub(crate) fn pin_info(&self, token: u128) -> Option<(u32, bool)> {
        self.sharing.pin_info(token)
    }

    /// Takes pin `token` for a child on another shard ([`Sharing::take_listener_pin`]).
    pub(crate) fn take_listener_pin(
        &mut self,
        token: u128,
    ) -> Option<Vec<(session::Pinned, Option<usnet_stack::TcpListenCopy>)>> {
        let stack = self.driver.stack_mut();
        self.sharing.take_listener_pin(stack, token)
    }

    /// The child's session `id` takes the listeners' copies on this shard
    /// ([`Sharing::claim_copies`]).
    pub(crate) fn claim_copies(
        &mut self,
        id: u32,
        items: Vec<(session::Pinned, Option<usnet_stack::TcpListenCopy>)>,
    ) -> Vec<usnet_session_abi::Claimed> {
        self.ports_changed = true;
        let stack = self.driver.stack_mut();
        self.sharing
            .claim_copies(&mut self.sessions, stack, id, items)
    }

    /// Stack sockets held by several sessions, and pins waiting for a child (each
    /// with the session that forked and how many sockets it holds).
    pub fn fork_counts(&self) -> (usize, Vec<(u32, usize)>) {
        self.sharing.counts()
    }

    /// The loop-wide invariants of shared sockets (tests and fuzzing).
    pub fn check_shared(&self) {
        self.sharing.check(&self.sessions, self.driver.stack());
    }

    fn has_work(&mut self) -> bool {
        self.sessions.values_mut().any(|s| s.has_work())
    }

    /// Nothing for the sessions to do: no request or bytes to move, no departed
    /// client's sockets draining. (Frames waiting in the device are the device
    /// owner's to know; due timers show as a busy pass.)
    pub fn quiet(&mut self) -> bool {
        !self.has_work() && self.dying.is_empty()
    }

    fn set_asleep(&self, v: u32) {
        for s in self.sessions.values() {
            s.mem.word(hdr::SERVER_ASLEEP).store(v, Ordering::SeqCst);
        }
    }
}

/// Where a server keeps the pids it boosted (see `usnet_driver::sched`).
pub fn boost_state_path(name: &str) -> std::path::PathBuf {
    usnet_session::ctl::run_dir().join(format!("{name}.boosts"))
}

/// Removes what a stopped server `name` left in the run directory: boosted
/// clients get their priorities back (from its state file), and its control and
/// rpc sockets go unless a server answers on them (a new one of the same name).
/// Returns how many priorities were restored.
pub fn clean_up_after(name: &str) -> usize {
    let n = usnet_driver::sched::recover(&boost_state_path(name), &mut usnet_driver::Setpriority);
    let ctl = usnet_session::ctl::socket_path(name);
    for path in [ctl.with_extension("rpc"), ctl] {
        control::remove_if_stale(&path);
    }
    mirror::remove(name);
    n
}

/// A running server.
pub struct ServerHandle {
    links: Vec<ShardLink>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<(), String>>>,
    control: Option<control::ControlServer>,
}

impl ServerHandle {
    /// Starts the loop on `device` with `stack`, and the control socket.
    pub fn start(
        stack: Stack,
        device: Box<dyn Device>,
        cfg: ServerConfig,
    ) -> Result<ServerHandle, control::ControlError> {
        Self::start_on(stack, device, cfg, AnyClock::System(SystemClock::new()))
    }

    /// [`ServerHandle::start`] with the stack's time read from `clock`: a
    /// [`usnet_driver::ManualClock`] runs the server on virtual time that its owner
    /// moves (the packetdrill backend, with [`Loop::quiet`] and
    /// [`Loop::busy_passes`] to know when the loop has settled).
    pub fn start_on(
        stack: Stack,
        device: Box<dyn Device>,
        cfg: ServerConfig,
        clock: AnyClock,
    ) -> Result<ServerHandle, control::ControlError> {
        Self::start_shards(vec![(stack, device)], cfg, clock)
    }

    /// A sharded server: shard `i` is `parts[i]` (its stack's `ShardRole` says
    /// `i` of `parts.len()`, its device is the link's queue `i`), each loop in a
    /// thread of its own pinned to its own core; one control socket. A client lives
    /// on one shard (its home: round robin, or its parent's; see `control`).
    pub fn start_shards(
        parts: Vec<(Stack, Box<dyn Device>)>,
        cfg: ServerConfig,
        clock: AnyClock,
    ) -> Result<ServerHandle, control::ControlError> {
        let n = parts.len();
        let bad = |e: String| control::ControlError::Io(std::io::Error::other(e));
        if n == 0 || n > 64 {
            return Err(bad(format!("{n} shards: from 1 to 64")));
        }
        for (i, (stack, _)) in parts.iter().enumerate() {
            let role = stack.config().shard;
            if usize::from(role.index) != i || usize::from(role.count) != n {
                return Err(bad(format!(
                    "stack {i} of {n} is shard {} of {}",
                    role.index, role.count
                )));
            }
        }
        if let Some(nice) = cfg.loop_nice {
            let own = usnet_driver::sched::nice_of(usnet_driver::sched::gettid()).unwrap_or(0);
            if nice < own {
                usnet_driver::sched::can_boost().map_err(|why| {
                    bad(format!(
                        "the loop's nice value {nice}: {}",
                        why.replace("priority control is off: raising a consumer's", "raising a")
                    ))
                })?;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut links = Vec::with_capacity(n);
        let mut inboxes = Vec::with_capacity(n);
        for (_, device) in &parts {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            links.push(ShardLink {
                jobs: tx,
                bell: ServerBell::new(device.wait_kind())?,
            });
            inboxes.push(rx);
        }
        let host = Arc::new(Host {
            links: links.clone(),
            ports: Mutex::new(HashMap::new()),
            listeners: Mutex::new(vec![Vec::new(); n]),
        });
        let boxes = if n > 1 {
            Some(usnet_driver::Mailboxes::new(n, parts[0].1.wait_kind())?)
        } else {
            None
        };
        // Boosted clients are other processes: if this one dies, the next `usnet
        // up` or `usnet down` of the same name restores them from this file.
        let state = boost_state_path(&cfg.name);
        usnet_driver::sched::recover(&state, &mut usnet_driver::Setpriority);
        let mut loops = Vec::with_capacity(n);
        for (i, (stack, device)) in parts.into_iter().enumerate() {
            let policy = stack.config().rx_policy.clone();
            let mut stack = stack;
            let share = cfg.limits.pool_share(stack.pool().count());
            stack.set_rx_owner_limit(Some(share));
            let mut driver = Driver::new(stack, device, clock.clone());
            driver.set_burst(64);
            driver.set_backlog(cfg.backlog || policy.enabled());
            if let Some(b) = &boxes {
                driver.join_shards(i, b.clone());
            }
            // One booster (shard 0's): the state file is one per server.
            if policy.priority && i == 0 {
                // The caller checked the right to boost (`usnet up` says so in one line).
                if let Ok(b) = usnet_driver::Booster::system(Some(state.clone())) {
                    // A client is a process: a boost raises all of its threads.
                    driver.set_booster(Some(b.whole_processes()));
                }
            }
            loops.push(Loop {
                driver,
                sessions: Default::default(),
                dying: Vec::new(),
                sharing: Sharing::default(),
                order: Vec::new(),
                cfg: cfg.clone(),
                started: Instant::now(),
                stop: stop.clone(),
                sessions_closed: 0,
                sessions_broken: 0,
                quota_sessions: 0,
                busy_passes: 0,
                shard: i,
                host: host.clone(),
                published: HashSet::new(),
                ports_read: Instant::now(),
                ports_changed: false,
            });
        }
        // What the interface mirror shows (made once the control socket is ours).
        let mirror = cfg.mirror.then(|| {
            let lp = &mut loops[0];
            let iface = lp.iface();
            let c = lp.driver.stack().config();
            let gateways: Vec<std::net::IpAddr> =
                [c.gateway4.map(Into::into), c.gateway6.map(Into::into)]
                    .into_iter()
                    .flatten()
                    .collect();
            (iface, gateways)
        });
        let control = control::ControlServer::start(&cfg, links.clone(), mirror)?;
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let mut threads = Vec::with_capacity(n);
        let (prepared_tx, prepared) = std::sync::mpsc::channel::<Result<(), String>>();
        for (i, (lp, rx)) in loops.into_iter().zip(inboxes).enumerate() {
            let bell = links[i].bell.clone();
            let prepared_tx = prepared_tx.clone();
            let name = if n == 1 {
                "usnet-server".to_string()
            } else {
                format!("usnet-shard-{i}")
            };
            let t = std::thread::Builder::new().name(name).spawn(move || {
                if n > 1 {
                    // Best effort: an unpinned shard is slower, not wrong.
                    if let Err(e) = usnet_driver::sched::pin_to_core(i % cores) {
                        eprintln!("usnet: shard {i}: cannot pin to core {}: {e}", i % cores);
                    }
                }
                let p = prepare_loop(&lp.cfg);
                let _ = prepared_tx.send(p.clone());
                p?;
                run(lp, rx, bell)
            });
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop.store(true, Ordering::Release);
                    for l in &links {
                        l.bell.ring();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(control::ControlError::Io(e));
                }
            }
        }
        let handle = ServerHandle {
            links,
            stop,
            threads,
            control: Some(control),
        };
        // Every loop has done what needs the process's privileges before this returns.
        for _ in 0..n {
            match prepared.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(bad(e)),
                Err(_) => return Err(bad("a loop thread did not start".into())),
            }
        }
        Ok(handle)
    }

    /// The server's shards.
    pub fn shards(&self) -> usize {
        self.links.len()
    }

    /// Runs `f` in shard `shard`'s loop and waits for its answer (at most `timeout`).
    pub fn call_on<R: Send + 'static>(
        &self,
        shard: usize,
        timeout: Duration,
        f: impl FnOnce(&mut Loop) -> R + Send + 'static,
    ) -> Option<R> {
        let l = self.links.get(shard)?;
        submit_call(&l.jobs, &l.bell, timeout, f)
    }

    /// Runs `f` in the loop (shard 0's) and waits for its answer (at most `timeout`).
    pub fn call<R: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut Loop) -> R + Send + 'static,
    ) -> Option<R> {
        self.call_on(0, timeout, f)
    }

    pub fn control_path(&self) -> Option<&std::path::Path> {
        self.control.as_ref().map(|c| c.path())
    }

    /// Every shard's loop runs (one that stopped, by `usnet down` or a failed
    /// device, stops the others).
    pub fn is_running(&self) -> bool {
        !self.threads.is_empty() && self.threads.iter().all(|t| !t.is_finished())
    }

    /// Stops the loops (clients see the server go) and waits for them; the first
    /// error any of them ended with.
    pub fn shutdown(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Release);
        for l in &self.links {
            l.bell.ring();
        }
        let mut r = Ok(());
        for t in self.threads.drain(..) {
            let one = t
                .join()
                .unwrap_or_else(|_| Err("server loop panicked".into()));
            if r.is_ok() {
                r = one;
            }
        }
        self.control.take();
        r
    }

    /// Waits until the loop stops by itself (`usnet down`, a failed device).
    pub fn wait(&mut self, poll: Duration) -> Result<(), String> {
        while self.is_running() {
            std::thread::sleep(poll);
        }
        self.shutdown()
    }

    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Sends `f` to the loop and waits for its answer.
pub(crate) fn submit_call<R: Send + 'static>(
    jobs: &Sender<Job>,
    bell: &ServerBell,
    timeout: Duration,
    f: impl FnOnce(&mut Loop) -> R + Send + 'static,
) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    jobs.send(Box::new(move |lp: &mut Loop| {
        let _ = tx.send(f(lp));
    }))
    .ok()?;
    bell.ring();
    rx.recv_timeout(timeout).ok()
}

/// The loop: turn the driver with the sessions' work, run jobs, sleep when idle.
/// What a loop thread does before it serves, with the privileges the process was
/// started with: its nice value. `start_shards` waits for every loop's answer, so a
/// caller that drops privileges after it (`usnet up --user`) drops them after.
fn prepare_loop(cfg: &ServerConfig) -> Result<(), String> {
    if let Some(nice) = cfg.loop_nice {
        use usnet_driver::sched::SchedHook;
        let tid = usnet_driver::sched::gettid();
        usnet_driver::Setpriority
            .set(tid, nice)
            .map_err(|e| format!("the loop's nice value {nice}: {e}"))?;
    }
    Ok(())
}

fn run(mut lp: Loop, jobs: Receiver<Job>, bell: ServerBell) -> Result<(), String> {
    let mut ready = Vec::new();
    // On the wall clock (the stack's may be virtual, and stand still while the loop
    // waits), read only on idle passes.
    let mut spin = usnet_driver::SpinWindow::new(lp.cfg.spin);
    let interval = lp.driver.stack().config().rx_policy.interval;
    let mut owners_read = lp.driver.now();
    let result = loop {
        if lp.stop.load(Ordering::Acquire) {
            break Ok(());
        }
        while let Ok(job) = jobs.try_recv() {
            job(&mut lp);
        }
        let mut served = false;
        let t = match lp.driver.turn() {
            Ok(t) => t,
            Err(e) => break Err(format!("device: {e}")),
        };
        if t.now.saturating_since(owners_read) >= interval {
            owners_read = t.now;
            lp.refresh_owners();
        }
        served |= lp.serve_sessions(&mut ready);
        let ports_changed = std::mem::take(&mut lp.ports_changed);
        lp.publish_ports(ports_changed);
        // What the sessions queued goes out now, not one turn later.
        if let Err(e) = lp.driver.flush() {
            break Err(format!("device: {e}"));
        }
        if t.busy() || served {
            spin.worked();
            lp.busy_passes += 1;
            continue;
        }
        if spin.keep_polling() {
            // Poll, but yield the core on each idle pass: a client process that
            // shares it (the usual case under `usnet run`: the program and the
            // server on one core) runs at once instead of waiting out the window
            // (nginx at 151 B took 7.4–7.9 µs of user time per request on that core
            // with a 50 µs spin, 5.2 without one). Alone on the core, sched_yield
            // returns at once.
            std::thread::yield_now();
            continue;
        }
        // The bell's seq first, then announce the sleep in every session, then look
        // once more (the clients publish, fence, and read the flag: one side always
        // sees the other; a ring after the seq read ends the sleep at once).
        let seen = bell.seq();
        lp.set_asleep(1);
        std::sync::atomic::fence(Ordering::SeqCst);
        if lp.has_work() {
            lp.set_asleep(0);
            continue;
        }
        let extra = bell.doorbell(seen);
        let cap = Duration::from_millis(100);
        let r = {
            let Loop {
                driver, sessions, ..
            } = &mut lp;
            driver.wait_with(
                &[extra],
                || sessions.values_mut().any(|s| s.has_work()),
                cap,
            )
        };
        bell.drain();
        lp.set_asleep(0);
        if let Err(e) = r {
            break Err(format!("wait: {e}"));
        }
    };
    // One shard ending ends them all (the host is one stack to its clients).
    lp.stop.store(true, Ordering::Release);
    for l in &lp.host.links {
        l.bell.ring();
    }
    // Orderly end: every client learns the server is gone.
    let ids: Vec<u32> = lp.sessions.keys().copied().collect();
    for id in ids {
        if let Some(s) = lp.sessions.get(&id) {
            s.mem.word(hdr::SERVER_GONE).store(1, Ordering::Release);
            s.wake_all();
        }
        lp.remove_session(id);
    }
    lp.driver.release_device_buffers();
    lp.driver.restore_boosts();
    result
}

/// For tests of the server and its clients: a stack server in this process on an
/// in-memory link (sockets to the stack's own addresses are delivered locally, so
/// whole conversations need no device and no privileges).
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use super::*;
    use usnet_driver::MemDevice;
    use usnet_link::DeviceCaps;
    use usnet_stack::StackConfig;

    /// Starts a server with `stack` (its addresses, buffers) and `cfg` on a memory link
    /// of MTU 1500 without offloads.
    pub fn in_memory(stack: StackConfig, cfg: ServerConfig) -> Result<ServerHandle, String> {
        in_memory_shards(stack, cfg, 1)
    }

    /// [`in_memory`] as `n` shards, one memory link each (frames between the
    /// shards' own addresses travel by local delivery and the shards' handoffs).
    pub fn in_memory_shards(
        stack: StackConfig,
        cfg: ServerConfig,
        n: usize,
    ) -> Result<ServerHandle, String> {
        let mut parts = Vec::with_capacity(n);
        for i in 0..n {
            let (dev, _queues) =
                MemDevice::new("mem", DeviceCaps::plain(1500)).map_err(|e| e.to_string())?;
            let c = if n > 1 {
                stack.for_shard(i, n)
            } else {
                stack.clone()
            };
            let st = Stack::new(c).map_err(|e| e.to_string())?;
            parts.push((st, Box::new(dev) as Box<dyn Device>));
        }
        let clock = AnyClock::System(SystemClock::new());
        ServerHandle::start_shards(parts, cfg, clock).map_err(|e| e.to_string())
    }
}
