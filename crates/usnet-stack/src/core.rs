//! The stack's core: everything a frame needs on its way in and out that is not a
//! socket — configuration, the packet pool, the input and transmit queues, addresses
//! and routes, the neighbour caches, reassembly, counters and the clock. It knows
//! nothing of the socket table ([`crate::socket::SocketSet`]), so a connection held
//! mutably in the table can send through the core at the same time (the split
//! smoltcp makes between `InterfaceInner` and `SocketSet`). The transmit path
//! (`tx.rs`) is implemented on it.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use usnet_pool::{PacketPool, PktBuf};

use crate::config::{IpCidr, StackConfig};
use crate::counters::Counters;
use crate::frag::Reassembler;
use crate::neighbor::{NeighborCache, NeighborWork};
use crate::time::Instant;
use crate::types::Src;
use crate::ConfigError;

/// Granularity of the core's timers (neighbour retries, reassembly expiry): the
/// busiest loop pays for them once per tick, not once per poll, like a kernel tick.
pub(crate) const TIMER_TICK: Duration = Duration::from_millis(1);

pub(crate) struct Core {
    pub cfg: StackConfig,
    pub pool: PacketPool,
    /// Configured addresses plus the IPv6 link-local one.
    pub addrs: Vec<IpCidr>,
    pub neighbors: NeighborCache,
    pub reasm4: Reassembler,
    pub reasm6: Reassembler,
    /// Received frames not yet processed (bounded: drop 1).
    pub input: VecDeque<PktBuf>,
    /// Frames ready for the device.
    pub tx: VecDeque<PktBuf>,
    pub counters: Counters,
    pub now: Instant,
    pub ip_ident: u16,
    pub frag6_ident: u32,
    /// ICMP error rate limit (a token bucket refilled every second).
    pub icmp_tokens: u32,
    pub icmp_refill: Instant,
    /// Reused buffers so the slow paths allocate once, not per packet.
    pub scratch: Vec<u8>,
    pub frame_scratch: Vec<u8>,
    /// A zero-copy segment's pieces gathered when it cannot go in place.
    pub zc_scratch: Vec<u8>,
    /// Buffers a copying read of a zero-copy connection took, released after the
    /// engine's own reference changes are applied.
    pub zc_taken: Vec<usnet_pool::BufId>,
    pub icmp_scratch: Vec<u8>,
    pub neighbor_work: NeighborWork,
    pub timers_checked: Instant,
    /// Keys ISNs, SYN cookies and timestamp offsets.
    pub tcp_secret: usnet_tcp::SecretKey,
    /// Priority-aware receive: forced drop runs in `receive`.
    pub prio: crate::prio::Prio,
    /// The interface's multicast memberships (`mcast.rs`).
    pub mcast: crate::mcast::Mcast,
    /// Set while a multicast datagram is sent whose copy goes to local members too
    /// (IP_MULTICAST_LOOP): `dispatch` loops each frame back.
    pub mcast_loop: bool,
    pub mcast_scratch: Vec<u8>,
    /// Frames and datagrams for other shards, until the host takes them.
    pub handoffs: Vec<(usize, crate::shard::Handoff)>,
    /// Ports whose sockets live on other shards, and connections sent there.
    pub redirects: crate::shard::Redirects,
}

impl Core {
    pub fn new(cfg: StackConfig) -> Result<Core, ConfigError> {
        let has_v6 = cfg.addrs.iter().any(|a| a.addr.is_ipv6());
        if !(68..=65535).contains(&cfg.mtu) || (has_v6 && cfg.mtu < 1280) {
            return Err(ConfigError::BadMtu(cfg.mtu));
        }
        if !cfg.mac.is_unicast() {
            return Err(ConfigError::BadMac);
        }
        let mut addrs = cfg.addrs.clone();
        let ll = IpCidr {
            addr: IpAddr::V6(usnet_wire::link_local_from_mac(cfg.mac)),
            prefix: 64,
        };
        if !addrs.contains(&ll) {
            addrs.push(ll);
        }
        for gw in [cfg.gateway4.map(IpAddr::V4), cfg.gateway6.map(IpAddr::V6)]
            .into_iter()
            .flatten()
        {
            let link_local = matches!(gw, IpAddr::V6(a) if is_link_local6(&a));
            if !link_local && !addrs.iter().any(|c| c.contains(gw)) {
                return Err(ConfigError::GatewayOffLink(gw));
            }
        }
        let pool = PacketPool::new(&cfg.pool)?;
        let reasm = || {
            Reassembler::new(
                cfg.reasm_memory / 2,
                cfg.reasm_max_datagrams,
                cfg.reasm_timeout,
            )
        };
        Ok(Core {
            neighbors: NeighborCache::new(
                cfg.neighbor_ttl,
                cfg.neighbor_retry,
                cfg.neighbor_max_probes,
                cfg.neighbor_cache_size,
                cfg.neighbor_pending,
            ),
            reasm4: reasm(),
            reasm6: reasm(),
            input: VecDeque::with_capacity(cfg.input_queue_len),
            tx: VecDeque::with_capacity(cfg.tx_queue_len),
            counters: Counters::default(),
            now: Instant::ZERO,
            ip_ident: cfg.seed as u16,
            frag6_ident: (cfg.seed >> 8) as u32,
            icmp_tokens: cfg.icmp_error_rate,
            icmp_refill: Instant::ZERO,
            scratch: Vec::new(),
            frame_scratch: Vec::new(),
            zc_scratch: Vec::new(),
            zc_taken: Vec::new(),
            icmp_scratch: Vec::new(),
            neighbor_work: NeighborWork::default(),
            timers_checked: Instant::ZERO,
            tcp_secret: usnet_tcp::SecretKey::derive(cfg.seed),
            prio: crate::prio::Prio::new(cfg.rx_policy.clone(), cfg.input_queue_len, cfg.seed),
            mcast: crate::mcast::Mcast::new(cfg.seed),
            mcast_loop: false,
            mcast_scratch: Vec::new(),
            handoffs: Vec::new(),
            redirects: Default::default(),
            addrs,
            pool,
            cfg,
        })
    }

    /// Queues a frame this host sent itself (ownership moves): steered like a
    /// received one; a full input queue drops it (drop 1).
    pub fn receive(&mut self, frame: PktBuf) {
        let frame = if self.cfg.shard.sharded() {
            match self.steer(frame) {
                Some(f) => f,
                None => return,
            }
        } else {
            frame
        };
        // A connection to a port of this host whose socket lives on another shard
        // (a client of a sharded stack server connecting to a local service). No
        // connection here can be this flow's unless it was accepted here before the
        // port moved, and then it is not a SYN and was never redirected: the
        // redirect table alone decides.
        if !self.redirects.is_empty() {
            if let Some(to) = crate::shard::flow_of(self.pool.data(&frame))
                .and_then(|flow| self.redirect_of(&flow, false))
            {
                self.redirect(frame, to);
                return;
            }
        }
        self.enqueue(frame);
    }

    /// A sharded stack's entrance: a frame owned by another shard is copied into a
    /// handoff and freed (`None`); an every-shard frame is copied to each other
    /// shard and processed here too.
    pub fn steer(&mut self, frame: PktBuf) -> Option<PktBuf> {
        use crate::shard::{owner, Handoff};
        let own = owner(self.pool.data(&frame), usize::from(self.cfg.shard.count));
        let mut bytes = None;
        let here = self.hand_over(own, |pool| {
            let bytes = bytes.get_or_insert_with(|| {
                let mut v = Vec::new();
                pool.copy_chain(&frame, &mut v);
                v
            });
            Handoff::Frame {
                bytes: bytes.clone(),
                offload: pool.offload(&frame),
            }
        });
        if here {
            Some(frame)
        } else {
            self.pool.free(frame);
            None
        }
    }

    /// The other shard `flow` goes to because its port's socket lives there
    /// (`shard::Redirects`); `has_conn`: this shard has a connection for it.
    pub fn redirect_of(&mut self, flow: &crate::shard::Flow, has_conn: bool) -> Option<usize> {
        let me = usize::from(self.cfg.shard.index);
        let now = self.now;
        self.redirects
            .target(flow, has_conn, now)
            .filter(|&t| t != me)
    }

    /// Hands `frame` to shard `to` as it is (a redirect: that shard holds the
    /// socket its port names), counted.
    pub fn redirect(&mut self, frame: PktBuf, to: usize) {
        let mut bytes = Vec::new();
        self.pool.copy_chain(&frame, &mut bytes);
        let offload = self.pool.offload(&frame);
        self.pool.free(frame);
        self.counters.shard_redirected += 1;
        self.handoffs
            .push((to, crate::shard::Handoff::Frame { bytes, offload }));
    }

    /// Queues a copy (`make`) of what this shard received for each other shard
    /// `owner` names, counted; returns whether this shard processes it too (it owns
    /// it, it landed here, or every shard does).
    pub fn hand_over(
        &mut self,
        owner: crate::shard::Owner,
        mut make: impl FnMut(&PacketPool) -> crate::shard::Handoff,
    ) -> bool {
        use crate::shard::Owner;
        let n = usize::from(self.cfg.shard.count);
        let me = usize::from(self.cfg.shard.index);
        let (targets, here) = match owner {
            Owner::Landing => return true,
            Owner::Shard(s) if s == me => return true,
            Owner::Shard(s) => (s..s + 1, false),
            Owner::Every => (0..n, true),
        };
        for s in targets.filter(|&s| s != me) {
            if here {
                self.counters.shard_every_copies += 1;
            } else {
                self.counters.shard_handoff_out += 1;
            }
            let h = make(&self.pool);
            self.handoffs.push((s, h));
        }
        here
    }

    /// Queues a received frame that is this shard's.
    pub fn enqueue(&mut self, frame: PktBuf) {
        let full = self.input.len() >= self.cfg.input_queue_len;
        if self.prio.cfg.forced_drop {
            // Before drop 1 and before any IP work: the point of forced drop.
            let port = crate::prio::dst_port(self.pool.data(&frame));
            if self.forced_drop(port, full) {
                self.pool.free(frame);
                return;
            }
        }
        if full {
            self.counters.drop_input_queue_full += 1;
            self.pool.free(frame);
            return;
        }
        self.input.push_back(frame);
    }

    pub fn tcp_now(&self) -> usnet_tcp::Instant {
        usnet_tcp::Instant::from_nanos(self.now.as_nanos())
    }

    /// The neighbour and reassembly timers, at most once per [`TIMER_TICK`].
    pub fn run_timers(&mut self) -> bool {
        let now = self.now;
        if now < self.timers_checked + TIMER_TICK && self.timers_checked != Instant::ZERO {
            return false;
        }
        self.timers_checked = now;
        let mut work = std::mem::take(&mut self.neighbor_work);
        self.neighbors.poll(now, &mut work);
        let did = !work.probe.is_empty() || !work.failed.is_empty();
        for ip in work.probe.drain(..) {
            self.send_solicit(ip);
        }
        for b in work.failed.drain(..) {
            self.counters.neigh_unresolved += 1;
            self.report_unresolved(b);
        }
        self.neighbor_work = work;
        did | self.expire_reassembly() | self.mcast_timers()
    }

    /// When the core's own timers next have work (not rounded below the tick).
    pub fn timers_at(&self) -> Option<Instant> {
        let next_check = self.timers_checked + TIMER_TICK;
        [
            self.neighbors.next_deadline(),
            self.reasm4.next_deadline(),
            self.reasm6.next_deadline(),
            self.mcast.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(next_check))
    }

    // ---------------------------------------------------------------- frame bytes

    /// A chained frame as one contiguous copy (the receive path's full
    /// classification, reassembly and the sockets other than connections read
    /// frames whole).
    pub fn linearise(&mut self, buf: PktBuf) -> Src {
        let mut data = std::mem::take(&mut self.frame_scratch);
        self.pool.copy_chain(&buf, &mut data);
        let gso_size = self.pool.offload(&buf).gso_size;
        self.pool.free(buf);
        self.counters.link_rx_linearised += 1;
        Src::Owned {
            data,
            invoking: Vec::new(),
            gso_size,
        }
    }

    /// Gives a frame's bytes back: the buffer to the pool, or a big allocation to the
    /// scratch slot for the next oversized frame.
    pub fn release(&mut self, src: Src) {
        match src {
            Src::Buf(b) => self.pool.free(b),
            Src::Owned { data, .. } => {
                if data.capacity() > self.frame_scratch.capacity() {
                    self.frame_scratch = data;
                }
            }
        }
    }

    /// Copies `off..off+len` of the frame into the scratch buffer and releases the
    /// frame.
    pub fn take_bytes(&mut self, src: Src, off: usize, len: usize) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        let bytes = src.bytes(&self.pool);
        let end = (off + len).min(bytes.len());
        out.extend_from_slice(&bytes[off.min(end)..end]);
        self.release(src);
        out
    }

    // ---------------------------------------------------------------- addressing

    pub fn is_local_addr(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|c| c.addr == ip)
    }

    pub fn first_v4(&self) -> Option<Ipv4Addr> {
        self.addrs.iter().find_map(|c| match c.addr {
            IpAddr::V4(a) => Some(a),
            _ => None,
        })
    }

    /// Source address for talking to `dst`: one in the same prefix, else (IPv6) a
    /// global one for global destinations, else any of the family.
    pub fn source_for(&self, dst: IpAddr) -> Option<IpAddr> {
        if let Some(c) = self.addrs.iter().find(|c| c.contains(dst)) {
            return Some(c.addr);
        }
        match dst {
            IpAddr::V4(_) => self.first_v4().map(IpAddr::V4),
            IpAddr::V6(d) => {
                let want_ll = is_link_local6(&d) || d.is_multicast();
                let v6 = || self.addrs.iter().filter(|c| c.addr.is_ipv6());
                v6().find(|c| matches!(c.addr, IpAddr::V6(a) if is_link_local6(&a) == want_ll))
                    .or_else(|| v6().next())
                    .map(|c| c.addr)
            }
        }
    }

    /// `(source, next hop)` for `dst`, or `None` when there is no route.
    pub fn route(&self, dst: IpAddr) -> Option<(IpAddr, IpAddr)> {
        let src = self.source_for(dst)?;
        let on_link = match dst {
            IpAddr::V4(a) => a.is_broadcast() || a.is_multicast(),
            IpAddr::V6(a) => a.is_multicast() || is_link_local6(&a),
        } || self.addrs.iter().any(|c| c.contains(dst));
        if on_link {
            return Some((src, dst));
        }
        let gw = match dst {
            IpAddr::V4(_) => self.cfg.gateway4.map(IpAddr::V4),
            IpAddr::V6(_) => self.cfg.gateway6.map(IpAddr::V6),
        }?;
        Some((src, gw))
    }

    /// Gives every queued buffer back to the pool.
    pub fn release_queues(&mut self) {
        for b in self.input.drain(..).chain(self.tx.drain(..)) {
            self.pool.free(b);
        }
        for b in self.neighbors.drain_pending() {
            self.pool.free(b);
        }
    }
}

pub(crate) fn is_link_local6(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}
