//! A narrow entry point for fuzzing the server's session processing: one session
//! whose shared memory a hostile client scribbles on between the server's turns, and
//! a stack without a device (frames to the stack's own address are delivered locally,
//! every other frame is dropped at the transmit queue).
//!
//! [`run`] reads its input as commands: raw writes anywhere in the session's memory
//! (header, rings, ring indices, slot words, data area), requests put into the
//! submission ring the way a client would (so the fuzzer reaches the socket code, not
//! only the index checks), bytes and UDP records into a socket's send ring, reads of
//! the receive rings, server turns and the passing of time; and a fork: a second
//! session (the child) claims every socket of the first, as after `fork`, and from
//! then on each command scribbles on one of the two, and either may die. After each
//! turn and at the end it checks what must hold whatever the clients wrote:
//!
//! - the server never panics and never loops forever (every turn returns);
//! - a session never holds more sockets than its quota, and every stack socket the
//!   session names is owned by the session (clean-up and limits apply to it), or is
//!   shared: owned by no session, held by a live holder, named by every holder;
//! - when the clients go, every stack socket they held is closed and, once the stack
//!   has settled, every packet buffer is back in the pool.
//!
//! Session 1 also has a zero-copy port (`usnet_session_abi::zc`): commands scribble on its
//! area (slots, indices, stash and give entries) or act as a client of the rings
//! would (pass RX slots, keep buffers, send held ones), and the server syncs it each
//! turn; its buffers must be back in the pool at the end too.
//!
//! The cargo-fuzz target `fuzz/fuzz_targets/server_session.rs` calls [`run`]; the
//! crate's tests run it on seeded random inputs.

use std::collections::HashMap;
use std::time::Duration;

use usnet_session::Session;
use usnet_session_abi::{
    hdr, op, slot, Geometry, Request, SockAddr, KIND_ICMP, KIND_RAW, KIND_TCP, KIND_UDP,
    RECORD_HEADER,
};
use usnet_stack::{mac_from_seed, Instant, Owner, Stack, StackConfig};

use crate::session::{ServerSession, SHARED};
use crate::shared::Sharing;
use crate::ServerLimits;

/// The stack's address: connections and datagrams to it are delivered locally.
pub(crate) const ADDR: [u8; 4] = [10, 77, 0, 1];
// A UDP record's header holds the length and the address.
const _: () = assert!(RECORD_HEADER >= 8 + SockAddr::LEN);

/// The session the fuzzer attacks: small, so random offsets often hit something.
pub fn geometry() -> Geometry {
    Geometry {
        sq_entries: 8,
        cq_entries: 8,
        max_sockets: 4,
        ring_bytes: 4096,
    }
}

fn limits() -> ServerLimits {
    ServerLimits {
        budget: 16,
        chunk: 8192,
        max_sessions: 2,
        max_backlog: 4,
        max_rcvbuf: 16384,
        max_pool_percent: 25,
    }
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).first().copied()
    }
    fn u16(&mut self) -> u16 {
        let b = self.take(2);
        b.iter().rev().fold(0u16, |a, &x| (a << 8) | x as u16)
    }
    fn u32(&mut self) -> u32 {
        let b = self.take(4);
        b.iter().rev().fold(0u32, |a, &x| (a << 8) | x as u32)
    }
    fn u64(&mut self) -> u64 {
        let b = self.take(8);
        b.iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64)
    }
}

/// Forks that shared at least one socket (the tests check the fuzzer gets there).
static FORKS_WITH_SOCKETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Server-side sessions (the first client, 1, and after a fork its child, 2) and a
/// stack, driven by hand.
pub struct Harness {
    stack: Stack,
    sessions: crate::shared::Sessions,
    sharing: Sharing,
    /// The clients' views of the same memory, by session.
    mems: HashMap<u32, Session>,
    /// The session the next commands write to.
    target: u32,
    forked: bool,
    now: Instant,
    ready: Vec<usnet_stack::SocketHandle>,
    /// Departed sessions whose connections still drain (as `Loop` keeps them).
    dying: Vec<ServerSession>,
    /// The client's view of session 1's zero-copy port.
    zc: usnet_session::zc::ZcArea,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Harness {
        let tcp = usnet_stack::TcpConfig {
            send_buffer: 16 << 10,
            recv_buffer: 16 << 10,
            recv_buffer_initial: 16 << 10,
            ..Default::default()
        };
        let stack = Stack::new(StackConfig {
            mac: mac_from_seed(7),
            addrs: vec![
                format!("{}.{}.{}.{}/24", ADDR[0], ADDR[1], ADDR[2], ADDR[3])
                    .parse()
                    .expect("addr"),
            ],
            pool: usnet_pool::PoolConfig {
                count: 512,
                ..Default::default()
            },
            tcp,
            ..Default::default()
        })
        .expect("stack");
        let port = crate::zc::ServerZc::new(
            &stack,
            usnet_session_abi::zc::Geometry {
                rx_slots: 8,
                tx_slots: 8,
                stash_slots: 4,
            },
        )
        .expect("zero-copy port");
        let zc = port.area.clone();
        let mut h = Harness {
            zc,
            stack,
            sessions: Default::default(),
            sharing: Sharing::default(),
            mems: HashMap::new(),
            target: 1,
            forked: false,
            now: Instant::from_millis(1000),
            ready: Vec::new(),
            dying: Vec::new(),
        };
        h.add_session(1);
        if let Some(s) = h.sessions.get_mut(&1) {
            s.zc = Some(port);
        }
        h
    }

    pub(crate) fn add_session(&mut self, id: u32) {
        let mem = Session::create(id, geometry()).expect("session memory");
        let mut session =
            ServerSession::new(id, 0, "fuzz".into(), mem.clone(), limits()).expect("session");
        session.groups = Some(self.sharing.groups());
        self.sessions.insert(id, session);
        self.mems.insert(id, mem);
    }

    /// The client's view of the session memory the commands write to.
    pub fn mem(&self) -> &Session {
        &self.mems[&self.target]
    }

    /// The first client forks: a second session claims every socket of the first.
    pub fn fork(&mut self) {
        if self.forked || !self.sessions.contains_key(&1) {
            return;
        }
        self.forked = true;
        let n = self
            .sharing
            .pin(&mut self.sessions, &mut self.stack, 1, 7, None);
        if n.is_some_and(|n| n > 0) {
            FORKS_WITH_SOCKETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.add_session(2);
        self.sharing
            .claim(&mut self.sessions, &mut self.stack, 2, 7)
            .expect("the pin is there");
    }

    /// Session `from` passes the sockets of the slots in `mask` (bit k: slot k) to
    /// session `to`, as `SCM_RIGHTS` does: a pin of those slots, claimed there.
    /// Returns what the claim gave.
    pub fn pass(&mut self, from: u32, to: u32, mask: u8) -> Vec<usnet_session_abi::Claimed> {
        let slots: Vec<u32> = (0..8).filter(|k| mask & (1 << k) != 0).collect();
        let token = 0x5ca1ab1e_u128 + u128::from(mask);
        self.sharing
            .pin(
                &mut self.sessions,
                &mut self.stack,
                from,
                token,
                Some(&slots),
            )
            .and_then(|_| {
                self.sharing
                    .claim(&mut self.sessions, &mut self.stack, to, token)
            })
            .unwrap_or_default()
    }

    /// Session `id` is gone, as `Loop::remove_session` ends it.
    pub fn remove(&mut self, id: u32) {
        let Some(mut s) = self.sessions.remove(&id) else {
            return;
        };
        let stack = &mut self.stack;
        let gone = s.depart(stack, limits().budget);
        if let Some(port) = s.zc.take() {
            port.close(stack);
        }
        for h in gone.joined {
            self.sharing.join(h, id);
        }
        for (h, left, died) in gone.shared {
            self.sharing
                .release(&mut self.sessions, stack, h, id, left, died);
        }
        assert!(
            stack.sockets_of(s.owner()).is_empty(),
            "a departed client still holds stack sockets"
        );
        if gone.draining {
            self.dying.push(s);
        }
        if let Some(&other) = self.sessions.keys().next() {
            self.target = other;
        }
    }

    /// One server turn, as the loop runs it for its sessions.
    pub fn turn(&mut self) {
        let stack = &mut self.stack;
        stack.poll(self.now);
        let mut touched = Vec::new();
        let mut wants = Vec::new();
        let mut joined = Vec::new();
        let mut broken = Vec::new();
        for id in [1, 2] {
            if let Some(s) = self.sessions.get_mut(&id) {
                if s.serve_contained(stack, limits().budget).is_err() {
                    broken.push(id);
                }
                touched.append(&mut s.touched);
                wants.extend(s.wants.drain(..).map(|h| (h, id)));
                joined.extend(s.joined.drain(..).map(|h| (h, id)));
            }
        }
        for (h, id) in joined {
            self.sharing.join(h, id);
        }
        self.release_pending();
        let stack = &mut self.stack;
        for (h, id) in wants {
            self.sharing.want(&mut self.sessions, stack, id, h);
        }
        for id in broken {
            self.remove(id);
        }
        let stack = &mut self.stack;
        for h in touched {
            for id in self.sharing.holders(h) {
                if let Some(s) = self.sessions.get_mut(id) {
                    s.refresh_handle(stack, h);
                }
            }
        }
        for s in self.sessions.values_mut() {
            if let Some(port) = s.zc.as_mut() {
                if port.wants_sync(stack) {
                    port.sync(stack);
                }
            }
        }
        for _ in 0..4 {
            if !stack.poll(self.now) {
                break;
            }
        }
        stack.take_ready(&mut self.ready);
        for h in self.ready.drain(..) {
            match stack.owner(h) {
                Some(SHARED) => {
                    for id in self.sharing.holders(h) {
                        if let Some(s) = self.sessions.get_mut(id) {
                            s.on_ready(stack, h);
                        }
                    }
                }
                Some(o) => {
                    if let Some(s) = self.sessions.get_mut(&o.0) {
                        s.on_ready(stack, h);
                    }
                }
                None => {}
            }
        }
        self.release_pending();
        let stack = &mut self.stack;
        for s in self.sessions.values_mut() {
            s.notify();
        }
        // No device: what leaves the stack is dropped.
        while let Some(b) = stack.dequeue_tx() {
            stack.pool_mut().free(b);
        }
        for s in self.sessions.values() {
            s.check_invariants(stack);
        }
        self.sharing.check(&self.sessions, stack);
        // Departed clients' connections drain what their send rings hold.
        self.dying.retain_mut(|s| s.drain_closing(stack).0);
    }

    /// The shared sockets the sessions closed are let go, after serving and after
    /// the readiness pass, as `Loop::serve_sessions` does (`Loop::release_all`).
    fn release_pending(&mut self) {
        let mut released = Vec::new();
        for (id, s) in self.sessions.iter_mut() {
            released.extend(s.released.drain(..).map(|(h, left)| (h, *id, left)));
        }
        for (h, id, left) in released {
            self.sharing
                .release(&mut self.sessions, &mut self.stack, h, id, left, false);
        }
    }

    pub fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
    }

    /// A request as a client puts it in the submission ring (no room check: a
    /// hostile client does not care).
    pub fn submit(&self, r: &Request) {
        let mem = self.mem();
        let head = mem
            .word(hdr::SQ_HEAD)
            .load(std::sync::atomic::Ordering::Relaxed);
        mem.write_request(head, r);
        mem.word(hdr::SQ_HEAD)
            .store(head.wrapping_add(1), std::sync::atomic::Ordering::Release);
    }

    /// Bytes into slot `i`'s send ring as a well-behaved producer writes them.
    pub fn send_bytes(&self, i: u32, data: &[u8]) {
        use std::sync::atomic::Ordering::*;
        let at = self.mem().tx_ring(i);
        let r = self.mem().region();
        let prod = r.u64(at.prod).load(Relaxed);
        let cons = r.u64(at.cons).load(Acquire);
        let free = at.size as u64 - prod.wrapping_sub(cons).min(at.size as u64);
        let n = (data.len() as u64).min(free) as usize;
        for (k, b) in data[..n].iter().enumerate() {
            // `prod` is in memory the client (here: the input) may have scribbled on.
            let off = at.data + ((prod as usize).wrapping_add(k) & (at.size - 1));
            let _ = r.write(off, std::slice::from_ref(b));
        }
        r.u64(at.prod).store(prod.wrapping_add(n as u64), Release);
    }

    /// The client reads everything in slot `i`'s receive ring and the completions,
    /// and kicks where the server asked for it.
    pub fn consume(&self, i: u32) {
        use std::sync::atomic::Ordering::*;
        let mem = self.mem();
        let at = mem.rx_ring(i);
        let r = mem.region();
        let prod = r.u64(at.prod).load(Acquire);
        r.u64(at.cons).store(prod, Release);
        let head = mem.word(hdr::CQ_HEAD).load(Acquire);
        mem.word(hdr::CQ_TAIL).store(head, Release);
        for (armed, kick) in [(slot::RX_ARMED, op::RX_KICK), (slot::TX_ARMED, op::TX_KICK)] {
            if mem.slot_word(i, armed).swap(0, AcqRel) == 1 {
                self.submit(&Request {
                    op: kick,
                    slot: i,
                    ..Default::default()
                });
            }
        }
    }

    /// The client is gone: everything it held is closed, and once the stack settles
    /// every packet buffer is back in the pool.
    pub fn finish(mut self) {
        for id in [1, 2] {
            self.remove(id);
        }
        for o in [Owner(1), Owner(2), SHARED] {
            assert!(
                self.stack.sockets_of(o).is_empty(),
                "a departed client still holds stack sockets"
            );
        }
        assert_eq!(self.sharing.counts().0, 0, "shared sockets left");
        // Until every timer ran out (ARP probes, TIME-WAIT, retransmissions): from
        // one deadline to the next rather than tick by tick (most inputs end with
        // none), for 200 s of virtual time as before, and longer only while a
        // departed client's connection still drains its ring: one still connecting
        // may rightly live on for TCP_SYNCNT 127 at RTO_MAX (120 s), about four
        // hours of SYNs, so the bound is six.
        let short = self.now + Duration::from_secs(200);
        let long = self.now + Duration::from_secs(6 * 3600);
        let mut idle_steps = 0;
        for _ in 0..100_000 {
            let stack = &mut self.stack;
            self.dying.retain_mut(|s| s.drain_closing(stack).0);
            while let Some(b) = self.stack.dequeue_tx() {
                self.stack.pool_mut().free(b);
            }
            let end = if self.dying.is_empty() { short } else { long };
            let next = match self.stack.poll_at() {
                Some(at) if at <= end => at,
                _ if self.dying.is_empty() => break,
                // A departed client's connection still draining with no timer
                // running: time moves on, for 200 s at most (as before).
                _ if idle_steps < 200 => {
                    idle_steps += 1;
                    self.now + Duration::from_secs(1)
                }
                _ => break,
            };
            if next > end {
                break;
            }
            self.now = next.max(self.now + Duration::from_millis(1));
            if let Err(d) = self.stack.run_until_idle(self.now) {
                panic!(
                    "deadline {d:?} still due at {:?} after the stack ran idle: its loop would spin",
                    self.now
                );
            }
        }
        assert!(
            self.dying.is_empty(),
            "a departed client's connection never ended (at {:?})",
            self.now
        );
        let p = self.stack.pool().stats();
        assert_eq!(p.in_use, 0, "packet buffers leaked: {p:?}");
    }
}

/// For the session's unit tests (`crate::session`): the same harness, with calls
/// that wait for their completion and a look inside.
#[cfg(test)]
impl Harness {
    /// Points the client-side helpers at session `id`.
    pub(crate) fn target(&mut self, id: u32) {
        self.target = id;
    }

    /// Hands the stack an ARP reply from `ip` (a made-up MAC) and turns: a
    /// neighbour it asked for is resolved, one it knows confirmed.
    #[cfg(test)]
    pub(crate) fn arp_reply_from(&mut self, ip: [u8; 4]) {
        use usnet_wire::{ethertype, ArpOp, ArpRepr, MacAddr};
        let ours = mac_from_seed(7);
        let theirs = MacAddr([0x02, 0, 0, 0, 0x77, 0x02]);
        let mut frame = vec![0u8; usnet_wire::ETHERNET_HEADER_LEN + 28];
        usnet_wire::emit_ethernet(&mut frame, ours, theirs, ethertype::ARP).expect("room");
        let repr = ArpRepr {
            op: ArpOp::Reply,
            sender_mac: theirs,
            sender_ip: ip.into(),
            target_mac: ours,
            target_ip: ADDR.into(),
        };
        repr.emit(&mut frame[usnet_wire::ETHERNET_HEADER_LEN..])
            .expect("room");
        let buf = self.stack.pool_mut().alloc_from(&frame).expect("a buffer");
        self.stack.receive(buf);
        self.turn();
    }

    pub(crate) fn stack(&self) -> &Stack {
        &self.stack
    }

    /// Session `id` with the stack, to call it or look at its state directly.
    pub(crate) fn parts(&mut self, id: u32) -> (&mut ServerSession, &mut Stack) {
        (
            self.sessions.get_mut(&id).expect("session"),
            &mut self.stack,
        )
    }

    /// Request `op` on `slot`, served: its result. At most 4 turns (a call never
    /// waits for the network: the stack's own address is delivered in the turn).
    pub(crate) fn call(&mut self, op: u16, slot: u32, args: [u64; 6]) -> i64 {
        use std::sync::atomic::Ordering::*;
        let tag = 0xca11_0000_0000 | u64::from(self.mem().word(hdr::SQ_HEAD).load(Relaxed));
        self.submit(&Request {
            op,
            slot,
            tag,
            args,
            ..Default::default()
        });
        for _ in 0..4 {
            self.turn();
            let mem = self.mem();
            let head = mem.word(hdr::CQ_HEAD).load(Acquire);
            let mut tail = mem.word(hdr::CQ_TAIL).load(Relaxed);
            let mut found = None;
            while tail != head {
                let c = mem.read_completion(tail);
                if c.tag == tag {
                    found = Some(c.result);
                }
                tail = tail.wrapping_add(1);
            }
            mem.word(hdr::CQ_TAIL).store(tail, Release);
            if let Some(r) = found {
                return r;
            }
        }
        panic!("op {op} on slot {slot} was never completed");
    }

    /// What slot `i`'s receive ring holds, read as the client reads it (with the
    /// kicks the server asked for).
    pub(crate) fn recv(&self, i: u32) -> Vec<u8> {
        use std::sync::atomic::Ordering::*;
        let at = self.mem().rx_ring(i);
        let r = self.mem().region();
        let prod = r.u64(at.prod).load(Acquire);
        let cons = r.u64(at.cons).load(Relaxed);
        let mut out = vec![0u8; prod.wrapping_sub(cons) as usize];
        for (k, b) in out.iter_mut().enumerate() {
            let off = at.data + ((cons as usize).wrapping_add(k) & (at.size - 1));
            r.read(off, std::slice::from_mut(b)).expect("in the ring");
        }
        self.consume(i);
        out
    }

    /// Session `target`'s slot 0 listens on `port`, slot 1 connects to it and slot
    /// 2 is the accepted connection.
    pub(crate) fn connected_pair(&mut self, port: u16) {
        use std::sync::atomic::Ordering::*;
        let req = |op, slot, args| Request {
            op,
            slot,
            args,
            ..Default::default()
        };
        let a = SockAddr::from_std((ADDR, port).into()).to_args();
        let addr = [a[0], a[1], a[2], a[3], 0, 0];
        self.submit(&req(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]));
        self.submit(&req(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]));
        self.turn();
        self.submit(&req(op::BIND, 0, addr));
        self.submit(&req(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]));
        self.submit(&req(op::CONNECT, 1, addr));
        for _ in 0..4 {
            self.turn();
        }
        self.submit(&req(op::ACCEPT, 0, [0; 6]));
        self.turn();
        assert_eq!(
            self.mem().slot_word(2, slot::STATE).load(Acquire),
            usnet_session_abi::SLOT_OPEN
        );
    }
}

/// An address for a request: mostly the stack's own, so connections and datagrams
/// meet sockets of the same session.
fn addr(inp: &mut Input) -> SockAddr {
    let sel = inp.u8().unwrap_or(0);
    let port = 7000 + (inp.u8().unwrap_or(0) % 8) as u16;
    let sa: std::net::SocketAddr = match sel % 6 {
        0..=2 => (ADDR, port).into(),
        3 => ([0, 0, 0, 0], port).into(),
        4 => ([10, 77, 0, 2], port).into(),
        _ => {
            let mut b = [0u8; SockAddr::LEN];
            b.copy_from_slice(
                &[inp.u64(), inp.u64(), inp.u64(), inp.u64()]
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect::<Vec<_>>()[..SockAddr::LEN],
            );
            return SockAddr::from_bytes(&b);
        }
    };
    SockAddr::from_std(sa)
}

/// Runs the commands in `data` against a fresh session (see the module's doc).
pub fn run(data: &[u8]) {
    let mut h = Harness::new();
    commands(&mut h, data);
    for _ in 0..4 {
        h.turn();
    }
    h.finish();
}

/// Runs the commands of `data` on `h`.
fn commands(h: &mut Harness, data: &[u8]) {
    let g = geometry();
    let total = h.mem().layout().total_len;
    let mut inp = Input(data);
    let mut steps = 0;
    while let Some(cmd) = inp.u8() {
        steps += 1;
        if steps > 4096 {
            break;
        }
        // After the fork, the high bit picks the session the command writes to.
        if h.forked {
            let want = if cmd & 0x80 != 0 { 2 } else { 1 };
            if h.sessions.contains_key(&want) {
                h.target = want;
            }
        }
        match cmd % 13 {
            // Raw bytes anywhere.
            0 => {
                let off = inp.u32() as usize % total;
                let len = inp.u8().unwrap_or(0) as usize;
                let bytes = inp.take(len).to_vec();
                let n = bytes.len().min(total - off);
                let _ = h.mem().region().write(off, &bytes[..n]);
            }
            // A word anywhere: indices, counters, flags.
            1 => {
                let off = (inp.u32() as usize % (total / 8)) * 8;
                let v = inp.u64();
                if inp.u8().unwrap_or(0) & 1 == 0 {
                    h.mem()
                        .region()
                        .u32(off)
                        .store(v as u32, std::sync::atomic::Ordering::Relaxed);
                } else {
                    h.mem()
                        .region()
                        .u64(off)
                        .store(v, std::sync::atomic::Ordering::Relaxed);
                }
            }
            // A request.
            2 => {
                let o = inp.u8().unwrap_or(0) % (op::MAX as u8 + 2);
                let s = inp.u8().unwrap_or(0) as u32 % (g.max_sockets + 1);
                let mut args = [0u64; 6];
                match o as u16 {
                    op::SOCKET => {
                        args[0] = [KIND_TCP, KIND_UDP, KIND_ICMP, KIND_RAW, 0, 9]
                            [inp.u8().unwrap_or(0) as usize % 6]
                    }
                    op::BIND | op::CONNECT | op::ZC_LISTEN | op::ZC_CONNECT => {
                        let a = addr(&mut inp).to_args();
                        args[..4].copy_from_slice(&a);
                    }
                    op::LISTEN | op::SHUTDOWN => args[0] = inp.u8().unwrap_or(0) as u64 % 8,
                    op::SETSOCKOPT | op::GETSOCKOPT => {
                        args[0] = [1, 6, 0][inp.u8().unwrap_or(0) as usize % 3];
                        args[1] = inp.u8().unwrap_or(0) as u64 % 16;
                        args[2] = inp.u64();
                    }
                    _ => args[0] = inp.u64(),
                }
                h.submit(&Request {
                    op: o as u16,
                    flags: 0,
                    slot: s,
                    tag: steps,
                    args,
                });
            }
            // Stream bytes into a send ring.
            3 => {
                let s = inp.u8().unwrap_or(0) as u32 % g.max_sockets;
                let len = inp.u16() as usize % 6000;
                let fill = inp.u8().unwrap_or(0);
                h.send_bytes(s, &vec![fill; len]);
            }
            // A UDP record into a send ring.
            4 => {
                let s = inp.u8().unwrap_or(0) as u32 % g.max_sockets;
                let len = inp.u16() as usize % 3000;
                let to = addr(&mut inp);
                let mut rec = vec![0u8; usnet_session_abi::record_len(len)];
                rec[0..4].copy_from_slice(&(len as u32).to_le_bytes());
                rec[8..8 + SockAddr::LEN].copy_from_slice(&to.to_bytes());
                h.send_bytes(s, &rec);
            }
            // The client reads.
            5 => {
                let s = inp.u8().unwrap_or(0) as u32 % g.max_sockets;
                h.consume(s);
            }
            // Time passes.
            6 => {
                let ms = inp.u8().unwrap_or(0) as u64 * 20;
                h.advance(Duration::from_millis(ms));
                h.turn();
            }
            // The client forks (once); after that, one of the two dies (the other
            // keeps the shared sockets), or passes some of its sockets to the other.
            7 => {
                if !h.forked {
                    h.fork();
                } else if h.sessions.len() == 2 {
                    match inp.u8().unwrap_or(0) % 4 {
                        0 => {
                            let id = h.target;
                            h.remove(id);
                        }
                        1 => {
                            let (from, mask) = (h.target, inp.u8().unwrap_or(0));
                            h.pass(from, 3 - from, mask);
                        }
                        _ => {}
                    }
                }
                h.turn();
            }
            // A word anywhere in the zero-copy port's area.
            11 => {
                let r = h.zc.region();
                let off = (inp.u32() as usize % (r.len() / 4)) * 4;
                r.u32(off)
                    .store(inp.u32(), std::sync::atomic::Ordering::Release);
            }
            // The zero-copy client acts on its rings, well-formed or not.
            12 => zc_client_step(&h.zc, &mut inp),
            _ => h.turn(),
        }
    }
}

/// RX slots with payload a client step saw (the tests check that the zero-copy
/// path was reached).
static ZC_PAYLOAD_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a client of the zero-copy rings does: pass an RX slot (giving its buffer
/// back, or keeping it with a stash buffer in its place), send a stash buffer or a
/// received one on a socket it saw, give a buffer back; then asks for a sync. The
/// input chooses, so it may well be wrong.
fn zc_client_step(area: &usnet_session::zc::ZcArea, inp: &mut Input) {
    use std::sync::atomic::Ordering::*;
    use usnet_session::zc::ZcRing;
    use usnet_session_abi::zc::{Slot, NO_BUF, SLOT_BUF_CHANGED, SLOT_CLOSE, SLOT_KEEP};
    let (rx_head, rx_tail) = area.indices(ZcRing::Rx);
    let (st_head, st_tail) = area.indices(ZcRing::Stash);
    let rn = area.size(ZcRing::Rx);
    let sn = area.size(ZcRing::Stash);
    let h = rx_head.load(Relaxed) % rn;
    let rx = area.read_slot(ZcRing::Rx, h);
    let have_rx = h != rx_tail.load(Acquire) % rn;
    if have_rx && rx.len > 0 {
        ZC_PAYLOAD_SEEN.fetch_add(1, Relaxed);
    }
    let sh = st_head.load(Relaxed) % sn;
    let stash =
        (sh != st_tail.load(Acquire) % sn).then(|| area.entry(ZcRing::Stash, sh).load(Relaxed));
    let take_stash = || st_head.store((sh + 1) % sn, Release);
    let choice = inp.u8().unwrap_or(0);
    let send = |s: Slot| {
        let (tx_head, _) = area.indices(ZcRing::Tx);
        let t = tx_head.load(Relaxed) % area.size(ZcRing::Tx);
        area.write_slot(ZcRing::Tx, t, &s);
        tx_head.store((t + 1) % area.size(ZcRing::Tx), Release);
    };
    match choice % 5 {
        0 if have_rx => rx_head.store((h + 1) % rn, Release),
        1 if have_rx => {
            if let Some(spare) = stash {
                take_stash();
                let mut s = rx;
                s.buf = spare;
                s.flags |= SLOT_BUF_CHANGED;
                area.write_slot(ZcRing::Rx, h, &s);
                rx_head.store((h + 1) % rn, Release);
                // The kept buffer goes straight back out on its socket; or, kept
                // (`SLOT_KEEP`), twice, and the client still holds it after.
                if rx.len > 0 {
                    let mut out = rx;
                    out.flags = 0;
                    if inp.u8().unwrap_or(0) & 1 != 0 {
                        out.flags = SLOT_KEEP;
                        send(out);
                    }
                    send(out);
                }
            }
        }
        2 if have_rx => {
            if let Some(b) = stash {
                take_stash();
                let len = inp.u16() as u32 % 1600;
                send(Slot {
                    buf: b,
                    off: 128,
                    len,
                    // SLOT_MORE, SLOT_CLOSE, SLOT_SHUT_WR, SLOT_KEEP.
                    flags: inp.u8().unwrap_or(0) as u16 & 0xc3,
                    socket: rx.socket,
                });
            }
        }
        3 => {
            if let Some(b) = stash {
                take_stash();
                let (gh, _) = area.indices(ZcRing::Give);
                let g = gh.load(Relaxed) % sn;
                area.entry(ZcRing::Give, g).store(b, Relaxed);
                gh.store((g + 1) % sn, Release);
            }
        }
        4 if have_rx => send(Slot {
            buf: NO_BUF,
            flags: SLOT_CLOSE,
            socket: rx.socket,
            ..Slot::default()
        }),
        _ => {}
    }
    area.word(usnet_session_abi::zc::SYNC).store(1, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::*;
    use usnet_session_abi::{FLAG_BOUND, SLOT_OPEN};

    /// xorshift64*: seeded, so a failure names its input.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn random_commands_and_scribbles_never_break_the_server() {
        for seed in 0..300 {
            let data = bytes(seed, 64 + (seed as usize * 37) % 3000);
            if let Err(e) = std::panic::catch_unwind(|| run(&data)) {
                panic!("seed {seed}: {e:?}");
            }
        }
        assert!(
            FORKS_WITH_SOCKETS.load(Relaxed) > 0,
            "no input forked a session that had sockets"
        );
    }

    /// After a fork the child holds the connection too; when the parent closes its
    /// copy, what the parent had not read reaches the child's ring, then new bytes.
    #[test]
    fn zero_copy_rings_under_random_client_steps_never_break_the_server() {
        for seed in 0..200 {
            let data = bytes(seed ^ 0x5a5a, 64 + (seed as usize * 53) % 2000);
            let r = std::panic::catch_unwind(|| {
                let mut h = Harness::new();
                // A zero-copy listener of session 1 and a connection from its own
                // copying socket, with bytes on the way: the rings have traffic.
                let a = SockAddr::from_std((ADDR, 7002).into()).to_args();
                let req = |op, slot, args| Request {
                    op,
                    slot,
                    args,
                    ..Default::default()
                };
                h.submit(&req(op::ZC_LISTEN, 0, [a[0], a[1], a[2], a[3], 4, 0]));
                h.submit(&req(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]));
                h.turn();
                h.submit(&req(op::CONNECT, 0, [a[0], a[1], a[2], a[3], 0, 0]));
                for _ in 0..4 {
                    h.turn();
                }
                h.send_bytes(0, &vec![7u8; 3000]);
                h.submit(&req(op::TX_KICK, 0, [0; 6]));
                h.zc.word(usnet_session_abi::zc::SYNC).store(1, SeqCst);
                for _ in 0..4 {
                    h.turn();
                }
                commands(&mut h, &data);
                for _ in 0..4 {
                    h.turn();
                }
                h.finish();
            });
            if let Err(e) = r {
                panic!("seed {seed}: {e:?}");
            }
        }
        assert!(
            ZC_PAYLOAD_SEEN.load(Relaxed) > 0,
            "no client step saw zero-copy payload"
        );
    }

    #[test]
    fn a_shared_stream_moves_to_the_child_with_what_the_parent_left_unread() {
        let mut h = Harness::new();
        let req = |op, slot, args| Request {
            op,
            slot,
            args,
            ..Default::default()
        };
        h.connected_pair(7001);
        h.send_bytes(1, b"unread by the parent");
        h.submit(&req(op::TX_KICK, 1, [0; 6]));
        for _ in 0..4 {
            h.turn();
        }
        let parent_rx = h.mem().rx_ring(2);
        assert_eq!(
            h.mem().region().u64(parent_rx.prod).load(Acquire),
            20,
            "the bytes are in the parent's ring"
        );
        h.fork();
        assert_eq!(h.sharing.counts().0, 3, "three stack sockets shared");
        // The parent closes the accepted connection.
        h.submit(&req(op::CLOSE, 2, [0; 6]));
        h.turn();
        h.target = 2;
        // The child's copy of parent slot 2: the claim gives slots in order.
        let child_rx = h.mem().rx_ring(2);
        let r = h.mem().region().clone();
        assert_eq!(r.u64(child_rx.prod).load(Acquire), 20);
        let mut got = [0u8; 20];
        r.read(child_rx.data, &mut got).unwrap();
        assert_eq!(&got, b"unread by the parent");
        h.finish();
    }

    /// A TCP socket bound, not listening, when its process forks is one socket in
    /// both: the child's listen makes the listener, the parent's names it (the
    /// kernel's second listen changes nothing), both hold it, and it closes with
    /// the last of them (Node's cluster with NODE_CLUSTER_SCHED_POLICY=none).
    #[test]
    fn a_socket_bound_before_a_fork_listens_once_for_both_processes() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 0);
        let a = SockAddr::from_std((ADDR, 7020).into()).to_args();
        assert_eq!(h.call(op::BIND, 0, [a[0], a[1], a[2], a[3], 0, 0]), 0);
        h.fork();
        h.target = 2;
        assert_eq!(
            h.call(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]),
            0,
            "the child listens"
        );
        h.target = 1;
        assert_eq!(
            h.call(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]),
            0,
            "so does the parent"
        );
        let listeners = h.stack.tcp_listeners();
        assert_eq!(listeners.len(), 1, "one listener");
        let l = listeners[0].handle;
        assert_eq!(h.sharing.holders(l), &[2, 1], "held by both");
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert_eq!(
            h.stack.tcp_listeners().len(),
            1,
            "the child's copy keeps it"
        );
        h.target = 2;
        assert_eq!(h.call(op::CLOSE, 0, [0; 6]), 0);
        assert!(
            h.stack.tcp_listeners().is_empty(),
            "the last close closes it"
        );
        assert!(
            h.sharing.groups().lock().unwrap().is_empty(),
            "and the group forgets it"
        );
        h.finish();
    }

    /// A socket passed back to a process that holds it already (a child hands its
    /// parent a connection they share): the claim names the slot the parent has,
    /// so no stack socket is named twice in one session; a fresh socket passed
    /// back is the copy the session has.
    #[test]
    fn a_socket_passed_back_to_a_holder_keeps_its_one_slot() {
        let mut h = Harness::new();
        h.connected_pair(7021);
        assert_eq!(
            h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]),
            3,
            "slot 3"
        );
        h.fork();
        // Slots 2 (the accepted connection) and 3 (the fresh socket) come back.
        let got = h.pass(2, 1, 0b1100);
        let slots: Vec<u32> = got.iter().map(|c| c.slot).collect();
        assert_eq!(slots, [2, 3], "the slots session 1 has");
        assert_eq!(h.sessions[&1].socket_count(), 4);
        h.turn();
        h.target = 2;
        assert_eq!(h.call(op::CLOSE, 2, [0; 6]), 0);
        h.finish();
    }

    /// A client that dies while its connection is still connecting, with bytes
    /// in its send ring and TCP_SYNCNT at Linux's most (127): the connection is
    /// kept for those bytes until its SYNs run out (about four hours), then every
    /// socket and buffer comes back. `server_session` found it (fuzz/corpus/
    /// server_session/99149846…-min) when the harness gave such a connection 200 s
    /// and found the SYN held for ARP at the end.
    #[test]
    fn a_dead_clients_connection_may_try_to_connect_for_hours_then_lets_go() {
        use usnet_session_abi::opt::{IPPROTO_TCP, TCP_SYNCNT};
        let mut h = Harness::new();
        let tcp = [usnet_session_abi::KIND_TCP, 0, 0, 0, 0, 0];
        assert_eq!(h.call(op::SOCKET, 0, tcp), 0);
        let syncnt = [IPPROTO_TCP, TCP_SYNCNT, 127, 0, 0, 0];
        assert_eq!(h.call(op::SETSOCKOPT, 0, syncnt), 0);
        // A host that answers ARP (its reply comes once the connect asked) and
        // nothing else. (One that did not answer ARP would fail the connect with
        // EHOSTUNREACH after 3 s, as on Linux.)
        let a = SockAddr::from_std(([10, 77, 0, 2], 7006).into()).to_args();
        h.call(op::CONNECT, 0, [a[0], a[1], a[2], a[3], 0, 0]);
        h.arp_reply_from([10, 77, 0, 2]);
        // More than the connection's send buffer takes before it is established:
        // the rest waits in the ring.
        for _ in 0..8 {
            h.send_bytes(0, &[7; 5000]);
            h.submit(&Request {
                op: op::TX_KICK,
                slot: 0,
                ..Default::default()
            });
            h.turn();
        }
        h.remove(1);
        assert_eq!(h.dying.len(), 1, "its connection is kept for the bytes");
        // Still trying after 10 minutes (eight SYNs so far), its neighbour
        // answering ARP all along.
        for _ in 0..600 {
            h.advance(Duration::from_secs(1));
            h.arp_reply_from([10, 77, 0, 2]);
        }
        assert_eq!(h.dying.len(), 1);
        h.finish();
    }

    /// The input `server_session` found (fuzz/corpus/server_session/2a9b3b1a…):
    /// after a fork, a session's close of a shared connection completed in the
    /// readiness pass and the turn ended with the socket still listing it as a
    /// holder.
    #[test]
    fn the_fuzzers_close_in_a_readiness_pass_keeps_the_sharing_consistent() {
        run(include_bytes!(
            "../../../fuzz/corpus/server_session/2a9b3b1a9bc29741ae436e949dbab76a2a171283"
        ));
    }

    /// A bug that one client's requests reach (here a panic injected into its
    /// serve) cuts off that client only: its session is removed and its sockets
    /// reset, and another client's connection keeps moving bytes.
    #[test]
    fn a_panic_serving_one_client_cuts_off_that_client_only() {
        let mut h = Harness::new();
        h.add_session(2);
        h.target = 2;
        h.connected_pair(7010);
        h.target = 1;
        h.connected_pair(7011);
        assert_eq!(h.stack.sockets_of(Owner(1)).len(), 3);
        h.sessions.get_mut(&1).unwrap().panic_next = true;
        h.turn();
        assert!(!h.sessions.contains_key(&1), "the broken session is gone");
        assert!(h.stack.sockets_of(Owner(1)).is_empty(), "and its sockets");
        assert_eq!(h.target, 2);
        // The other client's connection goes on: slot 1 writes, slot 2 reads.
        h.send_bytes(1, b"still here");
        h.submit(&Request {
            op: op::TX_KICK,
            slot: 1,
            ..Default::default()
        });
        for _ in 0..4 {
            h.turn();
        }
        let rx = h.mem().rx_ring(2);
        let r = h.mem().region().clone();
        assert_eq!(r.u64(rx.prod).load(Acquire), 10);
        let mut got = [0u8; 10];
        r.read(rx.data, &mut got).unwrap();
        assert_eq!(&got, b"still here");
        h.finish();
    }

    /// A client posts TCP_CORK without waiting (nginx's `tcp_nopush` corks and
    /// uncorks around every response): the bytes it wrote before a cork change meet
    /// the stack before the change, even when the server reads the change in the
    /// same turn as the bytes. Written, uncorked, corked again for the next
    /// response: the first response goes out at once (it is not held by the new
    /// cork until the 200 ms cork timer), and what is written under the new cork
    /// waits for its lifting.
    #[test]
    fn a_cork_change_follows_the_bytes_written_before_it() {
        let mut h = Harness::new();
        let req = |op, slot, args| Request {
            op,
            slot,
            args,
            ..Default::default()
        };
        let cork = |on: u64| {
            [
                usnet_session_abi::opt::IPPROTO_TCP,
                usnet_session_abi::opt::TCP_CORK,
                on,
                0,
                0,
                0,
            ]
        };
        h.connected_pair(7002);
        // One turn sees: cork on, 100 bytes, cork off, cork on (the order the
        // client made them in: bytes are in the ring before the requests after them).
        h.submit(&req(op::SETSOCKOPT, 2, cork(1)));
        h.send_bytes(2, &[7u8; 100]);
        h.submit(&req(op::SETSOCKOPT, 2, cork(0)));
        h.submit(&req(op::SETSOCKOPT, 2, cork(1)));
        for _ in 0..4 {
            h.turn();
        }
        let rx = h.mem().rx_ring(1);
        assert_eq!(
            h.mem().region().u64(rx.prod).load(Acquire),
            100,
            "the response written before the uncork arrived without waiting"
        );
        // Under the new cork: held until it is lifted.
        h.send_bytes(2, &[8u8; 50]);
        h.submit(&req(op::TX_KICK, 2, [0; 6]));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(h.mem().region().u64(rx.prod).load(Acquire), 100, "corked");
        h.submit(&req(op::SETSOCKOPT, 2, cork(0)));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(h.mem().region().u64(rx.prod).load(Acquire), 150, "lifted");
        h.finish();
    }

    /// A client posts TCP_CORK on without waiting: it holds the bytes it writes
    /// after it (`slot::TX_HOLD`) until the server has set the cork, so they meet
    /// the cork (one segment with what follows), not an uncorked stack.
    #[test]
    fn bytes_held_for_a_posted_cork_wait_for_it() {
        let mut h = Harness::new();
        let req = |op, slot, args| Request {
            op,
            slot,
            args,
            ..Default::default()
        };
        let cork = |on: u64, hold: u64| {
            [
                usnet_session_abi::opt::IPPROTO_TCP,
                usnet_session_abi::opt::TCP_CORK,
                on,
                hold,
                0,
                0,
            ]
        };
        h.connected_pair(7003);
        let rx = h.mem().rx_ring(1);
        let got = |h: &Harness| h.mem().region().u64(rx.prod).load(Acquire);
        // The hold is set before the bytes and before the request is seen.
        h.mem().slot_u64(2, slot::TX_HOLD).store(1, Release);
        h.send_bytes(2, &[7u8; 100]);
        h.submit(&req(op::TX_KICK, 2, [0; 6]));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(got(&h), 0, "held until the cork's request is served");
        h.submit(&req(op::SETSOCKOPT, 2, cork(1, 1)));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(h.mem().slot_u64(2, slot::TX_HOLD).load(Acquire), 0);
        assert_eq!(got(&h), 0, "in the stack now, under the cork");
        h.submit(&req(op::SETSOCKOPT, 2, cork(0, 0)));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(got(&h), 100, "lifted");
        // A hold nobody serves holds only this socket's bytes; closing lets them go.
        h.mem().slot_u64(2, slot::TX_HOLD).store(101, Release);
        h.send_bytes(2, &[9u8; 10]);
        h.submit(&req(op::TX_KICK, 2, [0; 6]));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(got(&h), 100);
        h.submit(&req(op::CLOSE, 2, [0; 6]));
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(got(&h), 110, "a closing socket's bytes ignore the hold");
        h.finish();
    }

    fn udp_record(len: usize, to: std::net::SocketAddr) -> Vec<u8> {
        let mut rec = vec![0u8; usnet_session_abi::record_len(len)];
        rec[0..4].copy_from_slice(&(len as u32).to_le_bytes());
        rec[8..8 + SockAddr::LEN].copy_from_slice(&SockAddr::from_std(to).to_bytes());
        for (k, b) in rec[RECORD_HEADER..RECORD_HEADER + len]
            .iter_mut()
            .enumerate()
        {
            *b = k as u8;
        }
        rec
    }

    /// sendto on an unbound UDP socket binds it for the session: the stack socket is
    /// the session's (owner clean-up reaches it), the client learns its address, and
    /// replies to it arrive in its receive ring.
    #[test]
    fn sendto_on_an_unbound_udp_socket_binds_it_for_the_session() {
        let mut h = Harness::new();
        let sock = |op, slot, args| Request {
            op,
            slot,
            args,
            ..Default::default()
        };
        // Slot 0: UDP bound to :7000. Slot 1: UDP, unbound.
        h.submit(&sock(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]));
        h.submit(&sock(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]));
        h.turn();
        let a = SockAddr::from_std((ADDR, 7000).into()).to_args();
        h.submit(&sock(op::BIND, 0, [a[0], a[1], a[2], a[3], 0, 0]));
        h.turn();
        for i in [0, 1] {
            assert_eq!(h.mem().slot_word(i, slot::STATE).load(Acquire), SLOT_OPEN);
        }
        assert_eq!(
            h.mem().slot_word(1, slot::FLAGS).load(Acquire) & FLAG_BOUND,
            0
        );
        // sendto from the unbound socket.
        h.consume(1);
        h.send_bytes(1, &udp_record(100, (ADDR, 7000).into()));
        h.submit(&sock(op::TX_KICK, 1, [0; 6]));
        h.turn();
        h.turn();
        assert_ne!(
            h.mem().slot_word(1, slot::FLAGS).load(Acquire) & FLAG_BOUND,
            0,
            "the client is told the socket is bound"
        );
        let local = h.mem().slot_addr(1, slot::LOCAL).to_std().unwrap();
        assert_ne!(local.port(), 0);
        assert_eq!(h.stack.sockets_of(Owner(1)).len(), 2);
        // Slot 0 got the datagram from that address; its reply reaches slot 1.
        let at = h.mem().rx_ring(0);
        let r = h.mem().region().clone();
        assert!(r.u64(at.prod).load(Acquire) > 0, "slot 0 received");
        let mut from = [0u8; SockAddr::LEN];
        r.read(at.data + 8, &mut from).unwrap();
        // Bound to the wildcard address; the datagram came from the stack's own.
        let from = SockAddr::from_bytes(&from).to_std().unwrap();
        assert_eq!(from, (ADDR, local.port()).into());
        h.consume(0);
        h.send_bytes(0, &udp_record(33, from));
        h.submit(&sock(op::TX_KICK, 0, [0; 6]));
        h.turn();
        h.turn();
        let at1 = h.mem().rx_ring(1);
        assert_eq!(
            r.u64(at1.prod).load(Acquire) as usize,
            usnet_session_abi::record_len(33),
            "the reply reached the socket that sendto bound"
        );
        h.finish();
    }
}
