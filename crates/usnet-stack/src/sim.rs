//! Deterministic simulation: N stacks on one simulated Ethernet segment (a hub: every
//! frame reaches every other stack, which filters by MAC), with seeded loss,
//! duplication, reordering, corruption and delay, in virtual time. The same seed gives
//! the same conversation, byte for byte, so a failure can be replayed. The faults are
//! `usnet_sim`'s path model, shared with the TCP engine's own simulation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// The simulations' one random generator (re-exported from `usnet-sim`).
pub use usnet_sim::SimRng;
use usnet_sim::{Path, PathConfig};

use crate::{ConfigError, Instant, Stack, StackConfig};

/// What the simulated wire does to frames. Probabilities are per frame, 0.0..=1.0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// Chance that a frame is held back by up to `reorder_window`.
    pub reorder: f64,
    pub reorder_window: Duration,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Each stack's NIC sends at most this many bytes per second (0: no limit),
    /// taking a frame from the stack's transmit queue only when the last one is out:
    /// the stack, not the wire, holds what waits, as with a NIC at its line rate.
    pub line_rate: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_window: Duration::from_millis(5),
            delay: Duration::from_micros(50),
            line_rate: 0,
        }
    }
}

impl From<Faults> for PathConfig {
    fn from(f: Faults) -> Self {
        PathConfig {
            delay: f.delay,
            loss: f.loss,
            duplicate: f.duplicate,
            corrupt: f.corrupt,
            reorder: f.reorder,
            reorder_window: f.reorder_window,
            // A hub has no bottleneck.
            ..PathConfig::default()
        }
    }
}

/// What the wire did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    pub sent: u64,
    /// A hash (FNV-1a) of every frame sent, in order, with its sender and GSO
    /// segment size: two runs that put the same frames on the wire have the same.
    pub frames_hash: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    /// Deliveries refused because the receiver's pool was empty.
    pub rx_no_buffer: u64,
}

struct InFlight {
    at: Instant,
    seq: u64,
    from: usize,
    bytes: Vec<u8>,
    /// A GSO frame crossing whole (`SimNet::whole_gso`): its segment size.
    gso_size: u16,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// What a middlebox on the wire does with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hop {
    /// On to the other stacks.
    Pass,
    /// Gone (a firewall or a black hole).
    Drop,
    /// Gone, and this frame is sent instead (e.g. an ICMP error back to the sender).
    Answer(Vec<u8>),
}

/// Sees `(sender index, frame)` for every frame a stack puts on the wire.
pub type Middlebox = Box<dyn FnMut(usize, &[u8]) -> Hop>;

pub struct SimNet {
    stacks: Vec<Stack>,
    now: Instant,
    wire: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    rng: SimRng,
    path: Path,
    pub faults: Faults,
    pub stats: WireStats,
    /// A router or firewall on the path, before the faults.
    pub middlebox: Option<Middlebox>,
    /// Groups of stacks that are the shards of one host (`add_shards`).
    groups: Vec<Vec<usize>>,
    group_of: Vec<Option<usize>>,
    handoffs: Vec<(usize, crate::Handoff)>,
    /// With a `line_rate`: when each stack's NIC is done with its last frame.
    nic_busy_until: Vec<Instant>,
    /// GSO frames cross the wire whole and arrive marked checksum-verified, with
    /// their segment size, as over a TAP or a veth with offloads (the receiver's
    /// pool chains them when they exceed a buffer); otherwise the simulated NIC
    /// cuts them into wire segments. The wire's corruption would then go unseen,
    /// as on those links: use it without `Faults::corrupt`.
    pub whole_gso: bool,
}

impl SimNet {
    pub fn new(seed: u64, faults: Faults) -> Self {
        SimNet {
            stacks: Vec::new(),
            now: Instant::from_millis(1),
            wire: BinaryHeap::new(),
            seq: 0,
            rng: SimRng::new(seed),
            path: Path::new(faults.into()),
            faults,
            stats: WireStats::default(),
            middlebox: None,
            groups: Vec::new(),
            group_of: Vec::new(),
            handoffs: Vec::new(),
            nic_busy_until: Vec::new(),
            whole_gso: false,
        }
    }

    /// Adds a stack; returns its index.
    pub fn add(&mut self, cfg: StackConfig) -> Result<usize, ConfigError> {
        let mut s = Stack::new(cfg)?;
        s.advance(self.now);
        self.stacks.push(s);
        self.group_of.push(None);
        self.nic_busy_until.push(self.now);
        Ok(self.stacks.len() - 1)
    }

    /// Adds one host as `n` shards of `cfg` (same MAC and addresses, each its own
    /// seed): the wire hands each frame to the member [`crate::shard::link_queue`]
    /// names, as the AF_PACKET fanout program does, and the shards' handoffs reach
    /// their owners at once (they share a machine, not the wire). Returns the
    /// shards' indices, in shard order.
    pub fn add_shards(&mut self, cfg: StackConfig, n: usize) -> Result<Vec<usize>, ConfigError> {
        let g = self.groups.len();
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let k = self.add(cfg.for_shard(i, n))?;
            self.group_of[k] = Some(g);
            members.push(k);
        }
        self.groups.push(members.clone());
        Ok(members)
    }

    /// Delivers every shard's handoffs to their owners; returns whether any moved.
    fn move_handoffs(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.stacks.len() {
            let Some(g) = self.group_of[i] else {
                continue;
            };
            self.stacks[i].take_handoffs(&mut self.handoffs);
            for (shard, h) in self.handoffs.drain(..) {
                self.stacks[self.groups[g][shard]].receive_handoff(h);
                moved = true;
            }
        }
        moved
    }

    /// Whether stack `j` takes a frame sent by `from`: a shard takes it only if the
    /// link steers it there, and never from its own host.
    fn takes(&self, j: usize, from: usize, frame: &[u8]) -> bool {
        if j == from {
            return false;
        }
        let Some(g) = self.group_of[j] else {
            return true;
        };
        if self.group_of.get(from).copied().flatten() == Some(g) {
            return false;
        }
        let members = &self.groups[g];
        members[crate::shard::link_queue(frame, members.len())] == j
    }

    pub fn stack(&self, i: usize) -> &Stack {
        &self.stacks[i]
    }
    pub fn stack_mut(&mut self, i: usize) -> &mut Stack {
        &mut self.stacks[i]
    }
    pub fn now(&self) -> Instant {
        self.now
    }

    /// One round: every stack polls and transmits, due frames are delivered, then the
    /// clock jumps to the next event if nothing happened. Returns whether work was done.
    pub fn step(&mut self) -> bool {
        self.step_within(None)
    }

    /// [`Self::step`], where a net with nothing scheduled (no deadline, no frame in
    /// flight, no NIC holding frames) jumps to `horizon` instead of ticking 1 ms:
    /// nothing can happen before it. `run_for` steps this way, so an idle stretch
    /// costs one round, not one per millisecond (the fuzz targets run seconds of
    /// idle virtual time per input).
    fn step_within(&mut self, horizon: Option<Instant>) -> bool {
        let mut did = false;
        for i in 0..self.stacks.len() {
            did |= self.stacks[i].poll(self.now);
            while self.nic_busy_until[i] <= self.now {
                let Some(buf) = self.stacks[i].dequeue_tx() else {
                    break;
                };
                let bytes = self.stacks[i].pool().chain_len(&buf) as u64;
                if let Some(ns) = (bytes * 1_000_000_000).checked_div(self.faults.line_rate) {
                    self.nic_busy_until[i] = self.now + Duration::from_nanos(ns);
                }
                let mut bytes = Vec::new();
                self.stacks[i].pool().copy_chain(&buf, &mut bytes);
                let o = self.stacks[i].pool().offload(&buf);
                self.stacks[i].pool_mut().free(buf);
                if self.whole_gso && o.gso_size > 0 {
                    self.launch(i, bytes, o.gso_size);
                } else {
                    // The simulated NIC does what a real one would with offloads
                    // (finish checksums, cut GSO frames into wire segments).
                    for wire_frame in crate::soft_offload::resolve(&bytes, &o) {
                        self.launch(i, wire_frame, 0);
                    }
                }
                did = true;
            }
        }
        while self.wire.peek().is_some_and(|f| f.0.at <= self.now) {
            let Reverse(f) = self.wire.pop().expect("peeked");
            for j in 0..self.stacks.len() {
                if !self.takes(j, f.from, &f.bytes) {
                    continue;
                }
                let s = &mut self.stacks[j];
                match s.pool_mut().alloc_from(&f.bytes) {
                    Some(b) => {
                        if f.gso_size > 0 {
                            let o = usnet_pool::Offload {
                                csum_valid: true,
                                gso_size: f.gso_size,
                                ..Default::default()
                            };
                            s.pool_mut().set_offload(&b, o);
                        }
                        s.receive(b);
                        self.stats.delivered += 1;
                    }
                    None => self.stats.rx_no_buffer += 1,
                }
            }
            did = true;
        }
        did |= self.move_handoffs();
        if did {
            // Work costs a little time, so a busy sender still lets frames arrive.
            self.now = self.now + Duration::from_micros(1);
        } else {
            // A NIC that holds back a stack's frames is an event too.
            let nics = (0..self.stacks.len())
                .filter(|&i| self.stacks[i].tx_len() > 0)
                .map(|i| self.nic_busy_until[i]);
            // A stack that asks for now but did nothing waits at most 1 ms.
            let (now, mut stuck) = (self.now, false);
            // Every stack just polled and did nothing: one whose deadline is still
            // due would make a real loop spin (see `Stack::due_while_idle`).
            for (i, s) in self.stacks.iter().enumerate() {
                if let Some(d) = s.due_while_idle(now) {
                    panic!("stack {i} did nothing at {now:?} with a deadline due ({d:?}): its loop would spin");
                }
            }
            let next = self
                .stacks
                .iter()
                .filter_map(|s| s.poll_at())
                .chain(self.wire.peek().map(|f| f.0.at))
                .chain(nics)
                .filter(|&t| {
                    stuck |= t <= now;
                    t > now
                })
                .min();
            let tick = now + Duration::from_millis(1);
            self.now = match next {
                Some(t) if stuck => t.min(tick),
                Some(t) => t,
                None if !stuck => horizon.filter(|&h| h > now).unwrap_or(tick),
                None => tick,
            };
        }
        did
    }

    fn launch(&mut self, from: usize, mut bytes: Vec<u8>, gso_size: u16) {
        self.stats.sent += 1;
        let mut h = self.stats.frames_hash ^ ((from as u64) << 16 | u64::from(gso_size));
        for &b in &bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        self.stats.frames_hash = h.wrapping_mul(0x100_0000_01b3);
        if let Some(mb) = self.middlebox.as_mut() {
            match mb(from, &bytes) {
                Hop::Pass => {}
                Hop::Drop => return,
                Hop::Answer(reply) => {
                    // From nobody: every stack sees it and its MAC filter decides.
                    self.seq += 1;
                    self.wire.push(Reverse(InFlight {
                        at: self.now + self.faults.delay,
                        seq: self.seq,
                        from: usize::MAX,
                        bytes: reply,
                        gso_size: 0,
                    }));
                    return;
                }
            }
        }
        self.path.config = self.faults.into();
        let fate = self
            .path
            .send(&mut self.rng, self.now.as_nanos(), &mut bytes);
        self.stats.lost += u64::from(fate.lost);
        self.stats.corrupted += u64::from(fate.corrupted);
        self.stats.duplicated += u64::from(fate.duplicated);
        self.stats.reordered += u64::from(fate.reordered);
        for &at in fate.arrivals() {
            self.seq += 1;
            self.wire.push(Reverse(InFlight {
                at: Instant::from_nanos(at),
                seq: self.seq,
                from,
                bytes: bytes.clone(),
                gso_size,
            }));
        }
    }

    /// Steps until `done` holds or `limit` of virtual time passes; true if `done`.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut SimNet) -> bool,
    ) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step_within(Some(end));
        }
    }
}
