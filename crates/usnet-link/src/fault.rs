//! A device wrapper that injects faults — drops, duplicates, bit flips, reordering and
//! delay — from a seeded random generator, so a run can be repeated exactly.

use std::collections::VecDeque;
use std::io;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use usnet_pool::{PacketPool, PktBuf};

use crate::error::LinkError;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

/// What to inject. Probabilities are per frame, in `[0, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultConfig {
    pub drop: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// A reordered frame is held back and overtaken by the next frame.
    pub reorder: f64,
    /// Every frame is held this long before it moves on.
    pub delay: Option<Duration>,
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
            delay: None,
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

impl FromStr for FaultConfig {
    type Err = LinkError;

    /// `drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,delay=5ms,seed=7,dir=rx|tx|both`
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
                "delay" => {
                    c.delay =
                        Some(parse_duration(v).ok_or_else(|| {
                            bad(format!("delay={v}: expected e.g. 5ms, 200us or 1s"))
                        })?)
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
                        "unknown key '{k}' (known: drop, dup, corrupt, reorder, delay, seed, dir)"
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
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub reordered: u64,
    pub delayed: u64,
}

/// Frames of one direction on their way through the injector.
#[derive(Default)]
struct Lane {
    /// Processed, ready to go on (to the stack for rx, to the inner device for tx).
    ready: VecDeque<PktBuf>,
    /// Held back to be overtaken, and for how many calls it has waited.
    held: Option<(PktBuf, u32)>,
    delayed: VecDeque<(Instant, PktBuf)>,
}

impl Lane {
    fn release_due(&mut self, now: Instant) {
        while self.delayed.front().is_some_and(|(t, _)| *t <= now) {
            let (_, f) = self.delayed.pop_front().expect("looked at it");
            self.ready.push_back(f);
        }
    }
    /// End of a call: a held frame that nobody overtook for a whole call goes on.
    fn age_held(&mut self) {
        match &mut self.held {
            Some((_, age)) if *age >= 1 => {
                let (f, _) = self.held.take().expect("matched");
                self.ready.push_back(f);
            }
            Some((_, age)) => *age += 1,
            None => {}
        }
    }
    fn free_all(&mut self, pool: &mut PacketPool) {
        for f in self.ready.drain(..) {
            pool.free(f);
        }
        for (_, f) in self.delayed.drain(..) {
            pool.free(f);
        }
        if let Some((f, _)) = self.held.take() {
            pool.free(f);
        }
    }
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.held.is_none() && self.delayed.is_empty()
    }
}

/// Wraps a device and injects the faults of a [`FaultConfig`] into its traffic.
///
/// Buffers it holds between calls (delayed, reordered) go back to the pool through
/// [`Device::release_buffers`]; call it before dropping the injector if the pool lives on.
pub struct FaultInjector<D: Device> {
    inner: D,
    cfg: FaultConfig,
    rng: StdRng,
    stats: FaultStats,
    rx: Lane,
    tx: Lane,
    scratch: Vec<PktBuf>,
    bytes: Vec<u8>,
}

impl<D: Device> FaultInjector<D> {
    pub fn new(inner: D, cfg: FaultConfig) -> Self {
        FaultInjector {
            inner,
            rng: StdRng::seed_from_u64(cfg.seed),
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

    /// A copy of the chain `f` (data and offload metadata), or `None` if the pool is dry.
    fn copy(&mut self, pool: &mut PacketPool, f: &PktBuf) -> Option<PktBuf> {
        pool.copy_chain(f, &mut self.bytes);
        let c = pool.alloc_from(&self.bytes)?;
        pool.set_offload(&c, pool.offload(f));
        Some(c)
    }

    fn flip_bit(&mut self, pool: &mut PacketPool, f: &PktBuf) {
        let len = pool.chain_len(f);
        if len == 0 {
            return;
        }
        // A damaged frame must not keep a checksum exemption: a receiver that trusted
        // `csum_valid` (or a partial checksum left for offload) would accept it. Without
        // the flags the checksum is verified, and fails, as on a real wire.
        let mut o = pool.offload(f);
        o.csum_valid = false;
        o.needs_csum = false;
        pool.set_offload(f, o);
        // Only a private frame (no fragments: `apply` copies any other) comes here.
        let bit = self.rng.gen_range(0..len * 8);
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

    /// Applies the faults to one frame and moves what is left of it into `rx`/`tx` lane.
    fn apply(&mut self, pool: &mut PacketPool, mut f: PktBuf, is_rx: bool) {
        let cfg = &self.cfg;
        let (drop, corrupt, dup, reorder) = (cfg.drop, cfg.corrupt, cfg.duplicate, cfg.reorder);
        if drop > 0.0 && self.rng.gen::<f64>() < drop {
            pool.free(f);
            self.stats.dropped += 1;
            return;
        }
        if corrupt > 0.0 && self.rng.gen::<f64>() < corrupt {
            // Never flip bits in a buffer someone else still reads (a TCP retransmission
            // queue, a pcap writer): corrupt a private copy instead.
            if !pool.is_private(&f) {
                if let Some(c) = self.copy(pool, &f) {
                    pool.free(std::mem::replace(&mut f, c));
                    self.flip_bit(pool, &f);
                    self.stats.corrupted += 1;
                }
            } else {
                self.flip_bit(pool, &f);
                self.stats.corrupted += 1;
            }
        }
        let twin = if dup > 0.0 && self.rng.gen::<f64>() < dup {
            let c = self.copy(pool, &f);
            if c.is_some() {
                self.stats.duplicated += 1;
            }
            c
        } else {
            None
        };
        let hold = reorder > 0.0 && self.rng.gen::<f64>() < reorder;
        let delay = self.cfg.delay;
        let lane = if is_rx { &mut self.rx } else { &mut self.tx };
        for (i, g) in std::iter::once(f).chain(twin).enumerate() {
            if let Some(d) = delay {
                lane.delayed.push_back((Instant::now() + d, g));
                self.stats.delayed += 1;
                continue;
            }
            if let Some((h, _)) = lane.held.take() {
                lane.ready.push_back(g);
                lane.ready.push_back(h);
                self.stats.reordered += 1;
            } else if hold && i == 0 {
                lane.held = Some((g, 0));
            } else {
                lane.ready.push_back(g);
            }
        }
    }

    /// Moves due delayed tx frames on and gives the inner device what is ready.
    fn pump_tx(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        self.tx.release_due(Instant::now());
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
        self.rx.release_due(Instant::now());
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
        self.rx.age_held();
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
            let Some(f) = frames.pop_front() else { break };
            if self.cfg.apply_tx {
                self.apply(pool, f, false);
            } else {
                self.tx.ready.push_back(f);
            }
            taken += 1;
        }
        self.tx.age_held();
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
        let mut plan = self.inner.prepare_wait();
        // Come back in time to release delayed and held frames.
        let mut cap = |d: Duration| plan.within = Some(plan.within.map_or(d, |w| w.min(d)));
        let now = Instant::now();
        for lane in [&self.rx, &self.tx] {
            if let Some(&(due, _)) = lane.delayed.front() {
                cap(due.saturating_duration_since(now));
            }
            if lane.held.is_some() || (!lane.ready.is_empty()) {
                cap(Duration::from_millis(10));
            }
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
        // Come back in time to release delayed and held frames.
        let mut t = timeout;
        let mut cap = |d: Duration| t = Some(t.map_or(d, |t| t.min(d)));
        let now = Instant::now();
        for lane in [&self.rx, &self.tx] {
            if let Some(&(due, _)) = lane.delayed.front() {
                cap(due.saturating_duration_since(now));
            }
            if lane.held.is_some() || (!lane.ready.is_empty()) {
                cap(Duration::from_millis(10));
            }
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
        while idle < 3 {
            let n = dev.rx_burst(&mut p, &mut got, 32).unwrap();
            idle = if n == 0 { idle + 1 } else { 0 };
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
        for _ in 0..3 {
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
