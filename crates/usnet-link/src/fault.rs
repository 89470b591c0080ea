//! A device wrapper that injects faults — drops, duplicates, bit flips, reordering,
//! delay and a bottleneck — on the wall clock. The decisions are `usnet-sim`'s path
//! model (the one the simulations use: one model of a faulty path in the house),
//! drawn from its seeded generator, so a run can be repeated exactly; this wrapper
//! applies them to frames in pool buffers (chains, buffers others still read).

use std::collections::VecDeque;
use std::io;
use std::str::FromStr;
use std::time::{Duration, Instant};

use usnet_pool::{PacketPool, PktBuf};
use usnet_sim::{Path, PathConfig, PathStats, SimRng};

use crate::error::LinkError;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

/// What to inject. Probabilities are per frame, in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    pub drop: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// A reordered frame is held back by up to `reorder_window` (uniform), so the
    /// frames after it overtake it.
    pub reorder: f64,
    /// The longest a reordered frame is held back (1 ms by default).
    pub reorder_window: Duration,
    /// Every frame is held this long before it moves on.
    pub delay: Option<Duration>,
    /// A bottleneck of this many bytes per second (None: none), with a drop-tail
    /// queue of `queue` at its rate.
    pub rate: Option<u64>,
    pub queue: Duration,
    /// What a full bottleneck queue does to a frame sent (tx): drop it, as a router
    /// does (the default), or refuse it, so the stack keeps it, as a NIC at its line
    /// rate does (`full=push`): the link is then the stack's own bottleneck.
    pub push_back: bool,
    pub seed: u64,
    pub apply_rx: bool,
    pub apply_tx: bool,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            drop: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_window: Duration::from_millis(1),
            delay: None,
            rate: None,
            queue: Duration::from_millis(50),
            push_back: false,
            seed: 0,
            apply_rx: true,
            apply_tx: true,
        }
    }
}

fn parse_duration(v: &str) -> Option<Duration> {
    let (num, unit) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => v.split_at(i),
        None => (v, "ms"),
    };
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "us" => n / 1e6,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

/// A rate in bits per second as `tc` writes it (`100mbit`, `1gbit`, `500kbit`,
/// `1000000`), in bytes per second.
fn parse_rate(v: &str) -> Option<u64> {
    let (num, unit) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => v.split_at(i),
        None => (v, "bit"),
    };
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n > 0.0)?;
    let mult = match unit {
        "bit" | "bps" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return None,
    };
    Some(((n * mult / 8.0) as u64).max(1))
}

impl FaultConfig {
    /// The path model one direction of the injector runs.
    fn path(&self) -> PathConfig {
        PathConfig {
            delay: self.delay.unwrap_or(Duration::ZERO),
            rate: self.rate.unwrap_or(0),
            queue: self.queue,
            loss: self.drop,
            duplicate: self.duplicate,
            corrupt: self.corrupt,
            reorder: self.reorder,
            reorder_window: self.reorder_window,
            ..PathConfig::default()
        }
    }
}

impl FromStr for FaultConfig {
    type Err = LinkError;

    /// `drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,window=2ms,delay=5ms,`
    /// `rate=100mbit,queue=10ms,full=drop|push,seed=7,dir=rx|tx|both`
    fn from_str(s: &str) -> Result<Self, LinkError> {
        let bad = |why: String| LinkError::BadFault {
            spec: s.to_string(),
            why,
        };
        let mut c = FaultConfig::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            let prob = |v: &str| -> Result<f64, LinkError> {
                v.parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| bad(format!("{k}={v}: expected a probability between 0 and 1")))
            };
            match k {
                "drop" => c.drop = prob(v)?,
                "dup" | "duplicate" => c.duplicate = prob(v)?,
                "corrupt" => c.corrupt = prob(v)?,
                "reorder" => c.reorder = prob(v)?,
                "delay" | "window" | "queue" => {
                    let d = parse_duration(v)
                        .ok_or_else(|| bad(format!("{k}={v}: expected e.g. 5ms, 200us or 1s")))?;
                    match k {
                        "delay" => c.delay = Some(d),
                        "window" => c.reorder_window = d,
                        _ => c.queue = d,
                    }
                }
                "rate" => {
                    c.rate = Some(parse_rate(v).ok_or_else(|| {
                        bad(format!("rate={v}: expected bits per second, e.g. 100mbit or 1gbit"))
                    })?)
                }
                "full" => {
                    c.push_back = match v {
                        "drop" => false,
                        "push" => true,
                        _ => return Err(bad(format!("full={v}: expected drop or push"))),
                    }
                }
                "seed" => {
                    c.seed = v
                        .parse()
                        .map_err(|_| bad(format!("seed={v}: expected an integer")))?
                }
                "dir" => {
                    (c.apply_rx, c.apply_tx) = match v {
                        "rx" => (true, false),
                        "tx" => (false, true),
                        "both" => (true, true),
                        _ => return Err(bad(format!("dir={v}: expected rx, tx or both"))),
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "unknown key '{k}' (known: drop, dup, corrupt, reorder, window, delay, rate, queue, full, seed, dir)"
                    )))
                }
            }
        }
        Ok(c)
    }
}

/// What the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Lost on the way, or (with a `rate`) at the full bottleneck queue.
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub delayed: u64,
}

/// Frames of one direction on their way through the injector.
#[derive(Default)]
struct Lane {
    /// Arrived, ready to go on (to the stack for rx, to the inner device for tx).
    ready: VecDeque<PktBuf>,
    /// On their way: (arrival, order taken, frame), in arrival order.
    delayed: VecDeque<(u64, u64, PktBuf)>,
}

impl Lane {
    fn schedule(&mut self, at: u64, n: u64, f: PktBuf) {
        let i = self.delayed.partition_point(|&(t, k, _)| (t, k) <= (at, n));
        self.delayed.insert(i, (at, n, f));
    }
    fn release_due(&mut self, now: u64) {
        while self.delayed.front().is_some_and(|(t, _, _)| *t <= now) {
            let (_, _, f) = self.delayed.pop_front().expect("looked at it");
            self.ready.push_back(f);
        }
    }
    /// When the next frame on its way arrives.
    fn next_due(&self) -> Option<u64> {
        self.delayed.front().map(|d| d.0)
    }
    fn free_all(&mut self, pool: &mut PacketPool) {
        for f in self.ready.drain(..) {
            pool.free(f);
        }
        for (_, _, f) in self.delayed.drain(..) {
            pool.free(f);
        }
    }
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.delayed.is_empty()
    }
}

/// Wraps a device and injects the faults of a [`FaultConfig`] into its traffic.
///
/// Buffers it holds between calls (delayed, reordered) go back to the pool through
/// [`Device::release_buffers`]; call it before dropping the injector if the pool lives on.
pub struct FaultInjector<D: Device> {
    inner: D,
    cfg: FaultConfig,
    rng: SimRng,
    /// One path model per direction.
    paths: [Path; 2],
    /// The paths' clock starts here.
    t0: Instant,
    /// Frames taken so far (ties in arrival time keep this order).
    taken: u64,
    stats: FaultStats,
    rx: Lane,
    tx: Lane,
    scratch: Vec<PktBuf>,
    bytes: Vec<u8>,
}

impl<D: Device> FaultInjector<D> {
    pub fn new(inner: D, cfg: FaultConfig) -> Self {
        let path = cfg.path();
        Self::with_path_config(inner, cfg, path)
    }

    /// An injector that runs `path` (the whole path model, framing overhead
    /// included) both ways, its decisions seeded with `seed`: a wide-area path
    /// in front of `inner` (`usnet bench tcp --wan`).
    pub fn with_path(inner: D, path: PathConfig, seed: u64) -> Self {
        let cfg = FaultConfig {
            drop: path.loss,
            duplicate: path.duplicate,
            corrupt: path.corrupt,
            reorder: path.reorder,
            reorder_window: path.reorder_window,
            delay: (!path.delay.is_zero()).then_some(path.delay),
            rate: (path.rate > 0).then_some(path.rate),
            queue: path.queue,
            seed,
            ..FaultConfig::default()
        };
        Self::with_path_config(inner, cfg, path)
    }

    fn with_path_config(inner: D, cfg: FaultConfig, path: PathConfig) -> Self {
        FaultInjector {
            inner,
            rng: SimRng::new(cfg.seed),
            paths: [Path::new(path), Path::new(path)],
            t0: Instant::now(),
            taken: 0,
            cfg,
            stats: FaultStats::default(),
            rx: Lane::default(),
            tx: Lane::default(),
            scratch: Vec::new(),
            bytes: Vec::new(),
        }
    }

    pub fn fault_stats(&self) -> FaultStats {
        self.stats
    }
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }
    pub fn inner(&self) -> &D {
        &self.inner
    }
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }
    /// The wrapped device back (release the held buffers first:
    /// [`Device::release_buffers`]).
    pub fn into_inner(self) -> D {
        self.inner
    }
    /// What the path model did on the way in (`rx`) or out.
    pub fn path_stats(&self, rx: bool) -> PathStats {
        *self.paths[usize::from(!rx)].stats()
    }

    /// The paths' clock.
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }

    /// How long until a frame on its way in either direction arrives.
    pub fn next_due_in(&self) -> Option<Duration> {
        let now = self.now();
        [&self.rx, &self.tx]
            .iter()
            .filter_map(|l| l.next_due())
            .min()
            .map(|t| Duration::from_nanos(t.saturating_sub(now)))
    }

    /// A copy of the chain `f` (data and offload metadata), or `None` if the pool is dry.
    fn copy(&mut self, pool: &mut PacketPool, f: &PktBuf) -> Option<PktBuf> {
        pool.copy_chain(f, &mut self.bytes);
        let c = pool.alloc_from(&self.bytes)?;
        pool.set_offload(&c, pool.offload(f));
        Some(c)
    }

    /// Flips `bit` (counted from the chain's first byte) of the private frame `f`.
    fn flip_bit(pool: &mut PacketPool, f: &PktBuf, bit: usize) {
        // A damaged frame must not keep a checksum exemption: a receiver that trusted
        // `csum_valid` (or a partial checksum left for offload) would accept it. Without
        // the flags the checksum is verified, and fails, as on a real wire.
        let mut o = pool.offload(f);
        o.csum_valid = false;
        o.needs_csum = false;
        pool.set_offload(f, o);
        let (mut byte, mask) = (bit / 8, 1u8 << (bit % 8));
        let mut cur = Some(f.id());
        while let Some(c) = cur {
            let n = pool.len(c);
            if byte < n {
                pool.data_mut(c)[byte] ^= mask;
                return;
            }
            byte -= n;
            cur = pool.next(c);
        }
    }

    /// Sends one frame through its direction's path model and schedules what
    /// arrives of it in the `rx`/`tx` lane.
    fn apply(&mut self, pool: &mut PacketPool, mut f: PktBuf, is_rx: bool) {
        let now = self.now();
        let len = pool.chain_len(&f);
        let fate = self.paths[usize::from(!is_rx)].decide(&mut self.rng, now, len);
        if fate.arrivals().is_empty() {
            pool.free(f);
            self.stats.dropped += 1;
            return;
        }
        if let Some(bit) = fate.corrupt_bit {
            // Never flip bits in a buffer someone else still reads (a TCP retransmission
            // queue, a pcap writer): corrupt a private copy instead.
            if !pool.is_private(&f) {
                match self.copy(pool, &f) {
                    Some(c) => pool.free(std::mem::replace(&mut f, c)),
                    None => {
                        // The pool is dry: the frame is lost instead.
                        pool.free(f);
                        self.stats.dropped += 1;
                        return;
                    }
                }
            }
            Self::flip_bit(pool, &f, bit);
            self.stats.corrupted += 1;
        }
        let arrivals = fate.arrivals();
        let twin = if arrivals.len() > 1 {
            let c = self.copy(pool, &f);
            if c.is_some() {
                self.stats.duplicated += 1;
            }
            c
        } else {
            None
        };
        self.stats.reordered += u64::from(fate.reordered);
        for (&at, g) in arrivals.iter().zip(std::iter::once(f).chain(twin)) {
            if self.cfg.delay.is_some() {
                self.stats.delayed += 1;
            }
            self.taken += 1;
            let lane = if is_rx { &mut self.rx } else { &mut self.tx };
            lane.schedule(at, self.taken, g);
        }
    }

    /// Moves due tx frames on and gives the inner device what is ready.
    fn pump_tx(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        let now = self.now();
        self.tx.release_due(now);
        if !self.tx.ready.is_empty() {
            self.inner.tx_burst(pool, &mut self.tx.ready)?;
        }
        Ok(())
    }
}

impl<D: Device> Device for FaultInjector<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        if !self.tx.is_idle() {
            self.pump_tx(pool)?;
        }
        if !self.cfg.apply_rx && self.rx.is_idle() {
            return self.inner.rx_burst(pool, out, max);
        }
        if self.rx.ready.len() < max {
            let mut scratch = std::mem::take(&mut self.scratch);
            let r = self
                .inner
                .rx_burst(pool, &mut scratch, max - self.rx.ready.len());
            for f in scratch.drain(..) {
                if self.cfg.apply_rx {
                    self.apply(pool, f, true);
                } else {
                    self.rx.ready.push_back(f);
                }
            }
            self.scratch = scratch;
            r?;
        }
        let now = self.now();
        self.rx.release_due(now);
        let n = self.rx.ready.len().min(max);
        out.extend(self.rx.ready.drain(..n));
        Ok(n)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        if !self.cfg.apply_tx && self.tx.is_idle() {
            return self.inner.tx_burst(pool, frames);
        }
        // Take frames only while the inner device keeps up, so its back-pressure reaches
        // the caller.
        let k = self.inner.caps().max_burst.max(1);
        let mut taken = 0;
        while self.tx.ready.len() < k {
            // At line rate a full queue refuses what comes next: the stack holds it.
            if self.cfg.push_back && self.cfg.apply_tx && !self.paths[1].has_room(self.now()) {
                break;
            }
            let Some(f) = frames.pop_front() else { break };
            if self.cfg.apply_tx {
                self.apply(pool, f, false);
            } else {
                self.tx.ready.push_back(f);
            }
            taken += 1;
        }
        self.pump_tx(pool)?;
        Ok(taken)
    }

    fn wait_kind(&self) -> crate::WaitKind {
        self.inner.wait_kind()
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        if !self.rx.ready.is_empty() {
            return crate::WaitPlan::ready();
        }
        let due = self.next_due_in();
        let tx_waits = !self.tx.ready.is_empty();
        let mut plan = self.inner.prepare_wait();
        // Come back in time to release frames on their way, and soon for tx frames
        // the inner device pushed back.
        let mut cap = |d: Duration| plan.within = Some(plan.within.map_or(d, |w| w.min(d)));
        if let Some(d) = due {
            cap(d);
        }
        if tx_waits {
            cap(Duration::from_millis(10));
        }
        plan
    }

    fn rx_ready(&mut self) -> bool {
        !self.rx.ready.is_empty() || self.inner.rx_ready()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if !self.rx.ready.is_empty() {
            return Ok(());
        }
        // Come back in time to release frames on their way, and soon for tx frames
        // the inner device pushed back.
        let mut t = timeout;
        let mut cap = |d: Duration| t = Some(t.map_or(d, |t| t.min(d)));
        if let Some(d) = self.next_due_in() {
            cap(d);
        }
        if !self.tx.ready.is_empty() {
            cap(Duration::from_millis(10));
        }
        self.inner.wait(t)
    }
    fn waker(&self) -> Waker {
        self.inner.waker()
    }
    fn link_state(&self) -> LinkState {
        self.inner.link_state()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn bind_pool(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        self.inner.bind_pool(pool)
    }
    fn info(&self) -> Option<String> {
        self.inner.info()
    }
    fn release_buffers(&mut self, pool: &mut PacketPool) {
        self.rx.free_all(pool);
        self.tx.free_all(pool);
        self.inner.release_buffers(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{pool, MemDevice};

    #[test]
    fn parses_cli_spec() {
        let c: FaultConfig = "drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,seed=7"
            .parse()
            .unwrap();
        assert_eq!(
            c,
            FaultConfig {
                drop: 0.01,
                duplicate: 0.001,
                corrupt: 0.001,
                reorder: 0.01,
                seed: 7,
                ..Default::default()
            }
        );
        let c: FaultConfig = "rate=100mbit,queue=10ms,window=2ms".parse().unwrap();
        assert_eq!(c.rate, Some(12_500_000));
        assert_eq!(c.queue, Duration::from_millis(10));
        assert_eq!(c.reorder_window, Duration::from_millis(2));
        let c: FaultConfig = "delay=5ms,dir=tx".parse().unwrap();
        assert_eq!(c.delay, Some(Duration::from_millis(5)));
        assert!(!c.apply_rx && c.apply_tx);
        assert_eq!(
            "delay=250us".parse::<FaultConfig>().unwrap().delay,
            Some(Duration::from_micros(250))
        );
        for bad in [
            "drop=2",
            "drop",
            "loss=0.1",
            "delay=5parsecs",
            "dir=up",
            "seed=x",
            "rate=fast",
            "full=maybe",
            "rate=10furlongs",
        ] {
            let e = bad.parse::<FaultConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("bad fault spec '{bad}'")), "{e}");
        }
    }

    fn frame(i: u32) -> Vec<u8> {
        let mut v = vec![0u8; 64];
        v[..4].copy_from_slice(&i.to_be_bytes());
        v
    }

    #[test]
    fn rx_statistics_with_fixed_seed() {
        const N: u32 = 20_000;
        let mut p = pool(512, 2048);
        let mut mem = MemDevice::new();
        mem.to_rx.extend((0..N).map(frame));
        let cfg = FaultConfig {
            drop: 0.1,
            duplicate: 0.05,
            corrupt: 0.05,
            reorder: 0.05,
            seed: 7,
            ..Default::default()
        };
        let mut dev = FaultInjector::new(mem, cfg.clone());
        let mut got = Vec::new();
        let mut frames = Vec::new();
        let mut idle = 0;
        // Reordered frames are held up to the window (1 ms): read until none is.
        while idle < 3 || !dev.rx.is_idle() {
            let n = dev.rx_burst(&mut p, &mut got, 32).unwrap();
            idle = if n == 0 { idle + 1 } else { 0 };
            if n == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            for b in got.drain(..) {
                let mut v = Vec::new();
                p.copy_chain(&b, &mut v);
                frames.push(v);
                p.free(b);
            }
        }
        let s = dev.fault_stats();
        let near = |x: u64, p: f64| {
            let e = N as f64 * p;
            (x as f64) > e * 0.8 && (x as f64) < e * 1.2
        };
        assert!(near(s.dropped, 0.1), "{s:?}");
        // Later faults apply to the frames that were not dropped.
        assert!(near(s.duplicated, 0.05 * 0.9), "{s:?}");
        assert!(near(s.corrupted, 0.05 * 0.9), "{s:?}");
        assert!(near(s.reordered, 0.05 * 0.9), "{s:?}");
        assert_eq!(frames.len() as u64, N as u64 - s.dropped + s.duplicated);
        // Corruption flips exactly one bit per corrupted frame.
        let flipped: u32 = frames
            .iter()
            .map(|f| {
                let id = u32::from_be_bytes(f[..4].try_into().unwrap());
                let clean = frame(id);
                f.iter()
                    .zip(&clean)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum::<u32>()
            })
            .filter(|&bits| bits > 0)
            .count() as u32;
        assert!(
            flipped as u64 <= s.corrupted + s.duplicated,
            "{flipped} {s:?}"
        );
        // Same seed, same faults.
        let mut mem2 = MemDevice::new();
        mem2.to_rx.extend((0..N).map(frame));
        let mut dev2 = FaultInjector::new(mem2, cfg);
        let mut again = 0usize;
        for _ in 0..2000 {
            dev2.rx_burst(&mut p, &mut got, 32).unwrap();
            for b in got.drain(..) {
                again += 1;
                p.free(b);
            }
        }
        let end = Instant::now() + Duration::from_secs(5);
        while !dev2.rx.is_idle() && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
            dev2.rx_burst(&mut p, &mut got, 32).unwrap();
            for b in got.drain(..) {
                again += 1;
                p.free(b);
            }
        }
        assert_eq!(again, frames.len());
        assert_eq!(dev2.fault_stats(), s);
        dev.release_buffers(&mut p);
        dev2.release_buffers(&mut p);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn tx_faults_keep_shared_buffers_intact_and_never_leak() {
        let mut p = pool(2048, 2048);
        let mem = MemDevice::new();
        let cfg = FaultConfig {
            drop: 0.2,
            duplicate: 0.2,
            corrupt: 0.5,
            reorder: 0.2,
            seed: 1,
            apply_rx: false,
            ..Default::default()
        };
        let mut dev = FaultInjector::new(mem, cfg);
        let mut kept = Vec::new();
        let mut q = VecDeque::new();
        for i in 0..1000u32 {
            let b = p.alloc_from(&frame(i)).unwrap();
            kept.push(p.retain(&b)); // as TCP would, for retransmission
            q.push_back(b);
            if q.len() == 8 {
                while !q.is_empty() {
                    dev.tx_burst(&mut p, &mut q).unwrap();
                }
            }
        }
        // Reordered frames are held up to the window (1 ms).
        let end = Instant::now() + Duration::from_secs(5);
        while !dev.tx.is_idle() && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
            dev.tx_burst(&mut p, &mut q).unwrap();
        }
        for (i, b) in kept.into_iter().enumerate() {
            assert_eq!(p.data(&b), &frame(i as u32)[..], "original untouched");
            p.free(b);
        }
        let s = dev.fault_stats();
        assert!(s.corrupted > 0 && s.reordered > 0 && s.duplicated > 0 && s.dropped > 0);
        assert_eq!(
            dev.inner().sent.len() as u64,
            1000 - s.dropped + s.duplicated
        );
        dev.release_buffers(&mut p);
        assert_eq!(p.in_use(), 0);
    }

    /// Frame `i`, padded to 1000 bytes (1 ms at 1 MB/s).
    fn frame_1000(i: u32) -> Vec<u8> {
        let mut f = frame(i);
        f.resize(1000, 0);
        f
    }

    #[test]
    fn a_bottleneck_queues_at_its_rate_and_drops_past_its_queue() {
        let mut p = pool(128, 2048);
        let cfg = FaultConfig {
            rate: Some(1_000_000),
            queue: Duration::from_millis(10),
            apply_rx: false,
            ..Default::default()
        };
        let mut dev = FaultInjector::new(MemDevice::new(), cfg);
        let mut q: VecDeque<PktBuf> = (0..50u32)
            .map(|i| p.alloc_from(&frame_1000(i)).unwrap())
            .collect();
        dev.tx_burst(&mut p, &mut q).unwrap();
        // 1 ms per frame at 1 MB/s: the first leaves after 1 ms, and a frame that
        // would wait past 10 ms is dropped: 11 get in.
        assert_eq!(dev.fault_stats().dropped, 39);
        assert!(dev.inner().sent.is_empty(), "nothing left before its time");
        let end = Instant::now() + Duration::from_secs(5);
        while !dev.tx.is_idle() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
            dev.tx_burst(&mut p, &mut q).unwrap();
        }
        assert_eq!(dev.inner().sent.len(), 11);
        dev.release_buffers(&mut p);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn at_line_rate_a_full_queue_pushes_back_and_loses_nothing() {
        let mut p = pool(128, 2048);
        let cfg: FaultConfig = "rate=8mbit,queue=10ms,full=push,dir=tx".parse().unwrap();
        assert!(cfg.push_back);
        let mut dev = FaultInjector::new(MemDevice::new(), cfg);
        let mut q: VecDeque<PktBuf> = (0..50u32)
            .map(|i| p.alloc_from(&frame_1000(i)).unwrap())
            .collect();
        let taken = dev.tx_burst(&mut p, &mut q).unwrap();
        // 1 ms per frame at 1 MB/s: what would wait past 10 ms stays with the caller.
        assert!((1..=12).contains(&taken), "{taken}");
        assert_eq!(q.len(), 50 - taken);
        let end = Instant::now() + Duration::from_secs(5);
        while (!q.is_empty() || !dev.tx.is_idle()) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
            dev.tx_burst(&mut p, &mut q).unwrap();
        }
        assert_eq!(dev.fault_stats().dropped, 0);
        let sent = &dev.inner().sent;
        assert_eq!(sent.len(), 50, "every frame, in order");
        for (i, f) in sent.iter().enumerate() {
            assert_eq!(f[..1000], frame_1000(i as u32)[..]);
        }
        dev.release_buffers(&mut p);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn delay_holds_frames_then_releases() {
        let mut p = pool(64, 2048);
        let mut mem = MemDevice::new();
        mem.to_rx.extend((0..4).map(frame));
        let cfg = FaultConfig {
            delay: Some(Duration::from_millis(30)),
            ..Default::default()
        };
        let mut dev = FaultInjector::new(mem, cfg);
        let mut got = Vec::new();
        assert_eq!(dev.rx_burst(&mut p, &mut got, 8).unwrap(), 0);
        let t = Instant::now();
        while got.len() < 4 && t.elapsed() < Duration::from_secs(5) {
            dev.wait(Some(Duration::from_secs(1))).unwrap();
            dev.rx_burst(&mut p, &mut got, 8).unwrap();
        }
        assert_eq!(got.len(), 4);
        assert_eq!(dev.fault_stats().delayed, 4);
        for b in got {
            p.free(b);
        }
        // Something left in flight is given back by release_buffers.
        dev.inner_mut().to_rx.push_back(frame(9));
        dev.rx_burst(&mut p, &mut Vec::new(), 8).unwrap();
        assert_eq!(p.in_use(), 1);
        dev.release_buffers(&mut p);
        assert_eq!(p.in_use(), 0);
    }
}
