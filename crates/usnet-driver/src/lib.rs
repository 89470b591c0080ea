//! The one loop of usnet: a [`Driver`] joins a sans-IO [`Stack`] to a [`Device`] and
//! a [`Clock`], and runs one [`Driver::turn`] at a time — frames in, protocol work,
//! the application's own work, frames out — then tells when the stack next needs a
//! turn. It takes no lock and starts no thread: whoever owns it decides how to wait
//! between turns. Everything that moves frames uses it: the in-process runtime (which
//! puts its mutex around a driver), the stack server, the benchmarks, the emulated
//! NIC's bench and the packetdrill backend (with a [`ManualClock`] in virtual time).

mod clock;
mod memdev;
pub mod sched;
pub mod shards;
mod spin;

pub use clock::{AnyClock, Clock, ManualClock, SystemClock};
pub use memdev::{MemDevice, MemQueues};
pub use sched::{Booster, SchedHook, Setpriority};
pub use shards::{Mailboxes, Shards};
pub use spin::SpinWindow;

use std::sync::Arc;
use std::time::Duration;

use usnet_link::{Device, DeviceStats, Doorbell, LinkState, WaitPlan};
use usnet_pool::PktBuf;
use usnet_stack::{Handoff, Instant, SchedRequest, Stack};

/// Makes a stack configuration fit a real device: the device's MTU and offloads,
/// and real randomness mixed into the seed (a stack on a real link needs
/// unpredictable ISNs, SYN cookies and ports; the core itself stays deterministic).
pub fn fit_to_device(cfg: &mut usnet_stack::StackConfig, caps: usnet_link::DeviceCaps) {
    cfg.seed ^= random_u64();
    cfg.mtu = cfg.mtu.min(caps.mtu);
    cfg.rx_csum_offload = caps.rx_csum_offload;
    cfg.tx_csum_offload = caps.tx_csum_offload;
    // The stack only builds GSO frames when the device takes them.
    cfg.tso = caps.tso;
}

/// 8 bytes from getrandom(2) (falling back to the clock and pid if it fails).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a valid, writable 8-byte buffer for the duration of the call.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ (u64::from(std::process::id()) << 32)
    }
}

/// Frames taken from the device per turn unless set otherwise.
pub const DEFAULT_BURST: usize = 64;

/// Input rounds one turn runs at most: protocol work may queue frames to our own
/// addresses, which are processed in the same turn, but a loop that keeps feeding
/// itself must not hold the turn forever.
const MAX_INPUT_ROUNDS: usize = 64;

/// What one turn did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Turn {
    /// Frames taken from the device.
    pub received: usize,
    /// Frames the device took.
    pub sent: usize,
    /// Frames the device refused (back-pressure): they wait for the next turn.
    pub tx_backlog: usize,
    /// The stack or the application did protocol work (input, timers, sends).
    pub worked: bool,
    /// The device's link state changed during this turn.
    pub link_changed: bool,
    /// With [`Driver::set_phase_timing`]: nanoseconds spent taking frames from the
    /// device, and in protocol and application work (0 otherwise).
    pub rx_ns: u64,
    pub work_ns: u64,
    /// The time this turn ran at (the one clock read of the turn), for a loop's own
    /// spin window and deadlines, so it need not read the clock again.
    pub now: Instant,
}

impl Turn {
    /// Anything moved: a caller that polls should keep polling.
    pub fn busy(&self) -> bool {
        self.received > 0 || self.sent > 0 || self.worked || self.tx_backlog > 0
    }
}

/// A stack, its device and its clock.
pub struct Driver<D: Device, C: Clock = SystemClock> {
    stack: Stack,
    dev: D,
    clock: C,
    rx: Vec<PktBuf>,
    burst: usize,
    link: LinkState,
    phase_timing: bool,
    backlog: bool,
    /// Applies the stack's priority-control requests (mechanism B), if set. It
    /// restores every boost when dropped, so a dropped driver leaves none behind.
    booster: Option<Booster>,
    sched: Vec<SchedRequest>,
    /// This stack's shard index and the host's mailboxes, when it is one of several.
    shard: Option<(usize, Arc<Mailboxes>)>,
    handoffs: Vec<(usize, Handoff)>,
}

impl<D: Device, C: Clock> Driver<D, C> {
    pub fn new(stack: Stack, dev: D, clock: C) -> Self {
        let link = dev.link_state();
        Driver {
            stack,
            dev,
            clock,
            rx: Vec::with_capacity(DEFAULT_BURST),
            burst: DEFAULT_BURST,
            link,
            phase_timing: false,
            backlog: false,
            booster: None,
            sched: Vec::new(),
            shard: None,
            handoffs: Vec::new(),
        }
    }

    /// Makes this driver's stack shard `me` of a host whose shards meet at
    /// `boxes`: each turn delivers the mail other shards posted for it and posts
    /// what it received for them, and [`Driver::wait`] also wakes for mail.
    pub fn join_shards(&mut self, me: usize, boxes: Arc<Mailboxes>) {
        assert!(me < boxes.len());
        self.shard = Some((me, boxes));
    }

    /// Kernel-like receive: each turn empties the device into the stack's input
    /// queue (frames beyond it are drop 1, or forced drop) and then processes one
    /// budget (`rx_budget`), as a NIC interrupt feeds the backlog a softirq works
    /// through. Without it (the default) a turn takes one burst and works until the
    /// input queue is empty, so the backlog waits in the device and the stack never
    /// sees drop 1. Priority-aware receive needs the backlog where the stack sees it.
    pub fn set_backlog(&mut self, on: bool) {
        self.backlog = on;
    }

    /// Hands priority control's requests to `booster` after every turn.
    pub fn set_booster(&mut self, booster: Option<Booster>) {
        self.restore_boosts();
        self.booster = booster;
    }

    pub fn booster(&self) -> Option<&Booster> {
        self.booster.as_ref()
    }

    /// Puts every boosted consumer back (the loop stops; also on drop).
    pub fn restore_boosts(&mut self) {
        if let Some(b) = &mut self.booster {
            b.restore_all();
        }
    }

    fn apply_sched(&mut self) {
        self.stack.take_sched_requests(&mut self.sched);
        match &mut self.booster {
            Some(b) => self.sched.drain(..).for_each(|r| b.apply(r)),
            None => self.sched.clear(),
        }
    }

    /// Lets a device whose buffers are the pool's own memory (AF_XDP: the pool is
    /// the UMEM) register the stack's pool and lend the kernel its first buffers.
    /// Call it once before the first turn, so a device that cannot use this pool
    /// says so at start; without it the device binds on its first burst.
    pub fn bind_device(&mut self) -> std::io::Result<()> {
        self.dev.bind_pool(self.stack.pool_mut())
    }

    /// Frames taken from the device per turn.
    pub fn set_burst(&mut self, burst: usize) {
        self.burst = burst.max(1);
    }

    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Measures each turn's phases (two clock reads per phase) for experiments that
    /// split receive cost into device copy and protocol work.
    pub fn set_phase_timing(&mut self, on: bool) {
        self.phase_timing = on;
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    pub fn stack_mut(&mut self) -> &mut Stack {
        &mut self.stack
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    pub fn device_stats(&self) -> DeviceStats {
        self.dev.stats()
    }

    pub fn link_state(&self) -> LinkState {
        self.link
    }

    /// One turn with no application work of its own.
    pub fn turn(&mut self) -> std::io::Result<Turn> {
        self.turn_with(|_| false)
    }

    /// One turn: frames in (up to the burst), protocol work at the clock's time,
    /// `app` (services, a server's client requests: returns whether it did
    /// anything), frames out. `Err` only for a fatal device error.
    pub fn turn_with(&mut self, app: impl FnOnce(&mut Stack) -> bool) -> std::io::Result<Turn> {
        let t0 = self.phase_timing.then(std::time::Instant::now);
        let mut received = self
            .dev
            .rx_burst(self.stack.pool_mut(), &mut self.rx, self.burst)?;
        let now = self.clock.now();
        // Forced drop reads the time at the entrance.
        self.stack.advance(now);
        for b in self.rx.drain(..) {
            self.stack.receive(b);
        }
        if self.backlog {
            // Bounded, so a flood cannot hold the turn: the rest waits in the device.
            let cap = self.stack.config().input_queue_len * 2;
            let full = self.burst.min(self.dev.caps().max_burst.max(1));
            let mut last = received;
            // A short burst means the device is empty (not every device can say
            // so without a system call).
            while received < cap && last >= full {
                last = self
                    .dev
                    .rx_burst(self.stack.pool_mut(), &mut self.rx, self.burst)?;
                received += last;
                for b in self.rx.drain(..) {
                    self.stack.receive(b);
                }
            }
        }
        if let Some((me, boxes)) = &self.shard {
            received += boxes.deliver_to(*me, &mut self.stack);
        }
        let t1 = self.phase_timing.then(std::time::Instant::now);
        let mut worked = self.stack.poll(now);
        let mut rounds = 1;
        while !self.backlog && self.stack.input_len() > 0 && rounds < MAX_INPUT_ROUNDS {
            worked |= self.stack.poll(now);
            rounds += 1;
        }
        if let Some((_, boxes)) = &self.shard {
            worked |= boxes.post_from(&mut self.stack, &mut self.handoffs) > 0;
        }
        worked |= app(&mut self.stack);
        self.apply_sched();
        let (rx_ns, work_ns) = match (t0, t1) {
            (Some(t0), Some(t1)) => (
                t1.duration_since(t0).as_nanos() as u64,
                t1.elapsed().as_nanos() as u64,
            ),
            _ => (0, 0),
        };
        let sent = self.flush()?;
        let link = self.dev.link_state();
        let link_changed = link != self.link;
        self.link = link;
        Ok(Turn {
            received,
            sent,
            tx_backlog: self.stack.tx_len(),
            worked,
            link_changed,
            rx_ns,
            work_ns,
            now,
        })
    }

    /// Hands the transmit queue to the device; returns how many frames it took.
    pub fn flush(&mut self) -> std::io::Result<usize> {
        if self.stack.tx_len() == 0 {
            return Ok(0);
        }
        let (pool, txq) = self.stack.tx_parts();
        self.dev.tx_burst(pool, txq)
    }

    /// How long the stack can wait for input before its next timer, at most `cap`.
    pub fn idle_timeout(&self, cap: Duration) -> Duration {
        let now = self.clock.now();
        self.stack
            .poll_at()
            .map_or(cap, |t| t.saturating_since(now))
            .min(cap)
    }

    /// Sleeps on the device until a frame may have arrived, its waker fired, or the
    /// stack's next deadline (at most `cap`) is due.
    pub fn wait(&mut self, cap: Duration) -> std::io::Result<()> {
        self.wait_with(&[], || false, cap)
    }

    /// [`Driver::wait`] that also ends when one of the loop's own doorbells rings
    /// (doorbells of the device's kind: see [`usnet_link::wait_device`]);
    /// `extra_ready` re-checks the loop's other work after it announced itself.
    pub fn wait_with(
        &mut self,
        extra: &[Doorbell<'_>],
        extra_ready: impl FnMut() -> bool,
        cap: Duration,
    ) -> std::io::Result<()> {
        if self.stack.tx_len() > 0 {
            // The device pushed back: retry soon rather than sleep.
            std::thread::yield_now();
            return Ok(());
        }
        let timeout = self.idle_timeout(cap);
        if timeout.is_zero() {
            return Ok(());
        }
        match &self.shard {
            None => usnet_link::wait_device(&mut self.dev, extra, extra_ready, timeout),
            Some((me, boxes)) => {
                let mut all = extra.to_vec();
                all.push(boxes.doorbell(*me));
                let mut extra_ready = extra_ready;
                usnet_link::wait_device(
                    &mut self.dev,
                    &all,
                    || extra_ready() || boxes.has_mail(*me),
                    timeout,
                )
            }
        }
    }

    /// For a loop that holds the driver under a lock: what to sleep on and for how
    /// long (at most `cap`), to hand to [`usnet_link::sleep_on`] after the lock is
    /// released. A zero duration means "turn again now".
    pub fn prepare_wait(&mut self, cap: Duration) -> (WaitPlan, Duration) {
        if self.stack.tx_len() > 0 {
            return (WaitPlan::ready(), Duration::ZERO);
        }
        let timeout = self.idle_timeout(cap);
        if timeout.is_zero() {
            return (WaitPlan::ready(), timeout);
        }
        (self.dev.prepare_wait(), timeout)
    }

    /// Turns until `done` says so or `limit` passes (then `false`); between busy-less
    /// turns it sleeps on the device for at most `idle`. For tools and tests that
    /// run a conversation to an end.
    pub fn run_until(
        &mut self,
        limit: Duration,
        idle: Duration,
        mut done: impl FnMut(&mut Stack) -> bool,
    ) -> std::io::Result<bool> {
        let end = std::time::Instant::now() + limit;
        loop {
            if done(&mut self.stack) {
                return Ok(true);
            }
            if std::time::Instant::now() >= end {
                return Ok(false);
            }
            let t = self.turn()?;
            if !t.busy() && !idle.is_zero() {
                self.wait(idle)?;
            }
        }
    }

    /// Gives back to the pool every buffer the device holds between calls (a fault
    /// injector's delayed frames). Call it before the device goes away while the
    /// pool lives on, so the pool's accounting stays exact.
    pub fn release_device_buffers(&mut self) {
        self.dev.release_buffers(self.stack.pool_mut());
    }

    /// The parts, after the device's held buffers went back to the pool.
    pub fn into_parts(mut self) -> (Stack, D) {
        self.release_device_buffers();
        (self.stack, self.dev)
    }
}
