//! `usnet nicemu`: the device-side tool. Generates frames at a chosen interval and count,
//! busy-waiting on the monotonic clock, optionally pinned to a core, with fault injection.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use usnet_link::nic::NicError;
use usnet_sim::SimRng;

use crate::device::{DevCounters, DeviceSide, RingFullPolicy, TxMode};
use crate::frame::{FrameSpec, UdpTemplate};
use crate::sys::{now_ns, pin_to_core};

/// What the device-side tool does (`usnet nicemu`; the CLI owns the flags and fills
/// this in). `Default` gives the CLI's defaults, with an empty name.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NicemuOptions {
    /// NIC name: attaches to /dev/shm/usnet-nic-NAME (created by the driver).
    pub name: String,
    /// Ethernet frame size in bytes (64..=65536; MTU + 14 must allow it).
    pub size: usize,
    /// Interval between interrupts (per packet, or per batch with `batch`), in ns.
    pub interval_ns: u64,
    /// Frames to generate (0: none, only serve the TX ring for `linger_ms`).
    pub count: u64,
    /// Frames placed per interval; one interrupt per batch unless `irq_per_packet`.
    pub batch: u32,
    /// With `batch` > 1: raise an interrupt after every frame.
    pub irq_per_packet: bool,
    /// Destination of the generated UDP datagrams.
    pub dst: SocketAddrV4,
    /// Source of the generated UDP datagrams.
    pub src: SocketAddrV4,
    /// Source MAC (the destination MAC is the driver's, from the NIC's config block).
    pub src_mac: [u8; 6],
    /// Pin the device side to this core.
    pub core: Option<usize>,
    /// Run the device side in SCHED_FIFO (real-time) so other load cannot preempt it.
    pub rt: bool,
    /// Wait this long for the driver to create the NIC.
    pub wait_ms: u64,
    /// Delay between attaching (link up) and the first frame.
    pub start_delay_ms: u64,
    /// Keep serving the TX ring this long after the last frame.
    pub linger_ms: u64,
    /// When the RX ring is full: drop (count as missed, like hardware) or wait.
    pub ring_full: RingFullPolicy,
    /// What to do with transmitted frames.
    pub tx: TxMode,
    /// Fault: probability of dropping a frame.
    pub drop: f64,
    /// Fault: probability of corrupting a frame's last byte (checksum no longer matches).
    pub corrupt: f64,
    /// Fault: probability of placing a frame twice.
    pub duplicate: f64,
    /// Fault: probability of holding a frame back behind the next one.
    pub reorder: f64,
    /// Bad descriptor: probability of completing one with a length beyond its buffer.
    pub bad_len: f64,
    /// Bad descriptor: probability of completing one with a buffer index out of range.
    pub bad_index: f64,
    /// Bad descriptor: probability of completing a last segment with no first.
    pub bad_flags: f64,
    /// OWN game: probability of skipping a descriptor it still owns.
    pub own_skip: f64,
    /// Ring full: every K intervals place a back-to-back burst of `burst_len` frames.
    pub burst_every: u64,
    pub burst_len: u64,
    /// Link flap: every N frames take the link down for `link_down_pkts` frames.
    pub link_flap_every: u64,
    pub link_down_pkts: u64,
    /// Die (abort the process, no clean-up) after placing this many frames.
    pub die_after: Option<u64>,
    /// Seed of the fault generator.
    pub seed: u64,
    /// Write a JSON report here.
    pub stats_out: Option<std::path::PathBuf>,
    /// Include every interrupt's raise time in the JSON report.
    pub record_raises: bool,
    /// Print nothing.
    pub quiet: bool,
}

impl Default for NicemuOptions {
    fn default() -> Self {
        NicemuOptions {
            name: String::new(),
            size: 1514,
            interval_ns: 38_000,
            count: 1000,
            batch: 1,
            irq_per_packet: false,
            dst: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 9),
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4000),
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            core: None,
            rt: false,
            wait_ms: 5000,
            start_delay_ms: 20,
            linger_ms: 100,
            ring_full: RingFullPolicy::Drop,
            tx: TxMode::Count,
            drop: 0.0,
            corrupt: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            bad_len: 0.0,
            bad_index: 0.0,
            bad_flags: 0.0,
            own_skip: 0.0,
            burst_every: 0,
            burst_len: 0,
            link_flap_every: 0,
            link_down_pkts: 10,
            die_after: None,
            seed: 1,
            stats_out: None,
            record_raises: false,
            quiet: false,
        }
    }
}

impl NicemuOptions {
    /// The defaults, for NIC `name`.
    pub fn new(name: &str) -> Self {
        NicemuOptions {
            name: name.to_string(),
            ..Default::default()
        }
    }
}

/// Environment variable that makes a re-executed binary a device side: it holds the
/// [`NicemuOptions`] as JSON.
pub const CHILD_ENV: &str = "USNET_NICEMU_CHILD";

/// A command that runs the device side `o` in a child process: the current executable,
/// re-executed with the options in [`CHILD_ENV`]. Its `main` (or, in a test binary, the
/// test selected by extra arguments) must call [`maybe_run_child`] first. Callers add
/// arguments and stdio and spawn it.
pub fn device_command(o: &NicemuOptions) -> std::io::Result<std::process::Command> {
    let json = serde_json::to_string(o).map_err(std::io::Error::other)?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.env(CHILD_ENV, json);
    Ok(cmd)
}

/// Call first thing in `main()`: if this process was started by [`device_command`], run
/// the device side and exit (status 0, 1 on error; an abort with `die_after`);
/// otherwise return at once.
pub fn maybe_run_child() {
    let Ok(json) = std::env::var(CHILD_ENV) else {
        return;
    };
    let code = match serde_json::from_str::<NicemuOptions>(&json) {
        Ok(o) => match run_device(&o) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("usnet nicemu ({}): {e}", o.name);
                1
            }
        },
        Err(e) => {
            eprintln!("usnet nicemu: bad {CHILD_ENV}: {e}");
            2
        }
    };
    std::process::exit(code);
}

/// Summary of per-interval delivery times (ns per frame).
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    pub mean: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(v: &[f64]) -> Summary {
        if v.is_empty() {
            return Summary::default();
        }
        let mut s = v.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| s[((s.len() - 1) as f64 * p).round() as usize];
        Summary {
            n: s.len(),
            min: s[0],
            median: q(0.5),
            mean: s.iter().sum::<f64>() / s.len() as f64,
            p99: q(0.99),
            max: s[s.len() - 1],
        }
    }
}

/// What one run of the device side did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceReport {
    pub name: String,
    pub size: usize,
    pub interval_ns: u64,
    pub batch: u32,
    pub counters: DevCounters,
    /// Device-side time to deliver one frame (descriptor update + copy + interrupt), ns,
    /// measured per interval and divided by the frames it placed.
    pub deliver_ns: Summary,
    /// Intervals that started more than one interval late (the schedule stays absolute).
    pub late_ticks: u64,
    pub max_late_ns: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// When the first and the last interval actually began (the achieved rate).
    pub first_tick_ns: u64,
    pub last_tick_ns: u64,
    /// Raise time of every interval's interrupt (with --record-raises).
    pub raises_ns: Vec<u64>,
    /// The run stopped early (driver gone, or --die-after in a thread).
    pub aborted: Option<String>,
}

struct Gen<'a> {
    dev: &'a mut DeviceSide,
    t: &'a UdpTemplate,
    a: &'a NicemuOptions,
    rng: SimRng,
    next_seq: u64,
    held: Option<(u64, bool)>,
    link_down_left: u64,
}

impl Gen<'_> {
    /// Generates one frame with faults applied; returns frames placed.
    fn one(&mut self) -> Result<u32, NicError> {
        let a = self.a;
        let seq = self.next_seq;
        self.next_seq += 1;
        let c = &mut self.dev.counters;
        c.generated += 1;
        if a.link_flap_every > 0 && seq % a.link_flap_every == a.link_flap_every - 1 {
            self.dev.counters.link_flaps += 1;
            self.dev.set_link(false);
            self.link_down_left = a.link_down_pkts.max(1);
        }
        if self.link_down_left > 0 {
            self.dev.counters.dropped_link_down += 1;
            self.link_down_left -= 1;
            if self.link_down_left == 0 {
                self.dev.set_link(true);
            }
            return Ok(0);
        }
        if self.rng.chance(a.drop) {
            self.dev.counters.dropped_fault += 1;
            return Ok(0);
        }
        if self.rng.chance(a.bad_len) {
            self.dev.inject_bad_len()?;
        }
        if self.rng.chance(a.bad_index) {
            self.dev.inject_bad_index()?;
        }
        if self.rng.chance(a.bad_flags) {
            self.dev.inject_bad_flags()?;
        }
        if self.rng.chance(a.own_skip) {
            self.dev.inject_own_skip()?;
        }
        let corrupt = self.rng.chance(a.corrupt);
        if self.held.is_none() && self.rng.chance(a.reorder) {
            self.held = Some((seq, corrupt));
            self.dev.counters.reordered += 1;
            return Ok(0);
        }
        let mut placed = self.place(seq, corrupt)?;
        if self.rng.chance(a.duplicate) {
            self.dev.counters.duplicated += 1;
            placed += self.place(seq, corrupt)?;
        }
        if let Some((s, c)) = self.held.take() {
            placed += self.place(s, c)?;
        }
        Ok(placed)
    }

    fn place(&mut self, seq: u64, corrupt: bool) -> Result<u32, NicError> {
        Ok(self.dev.place_generated(self.t, seq, corrupt)? as u32)
    }

    fn flush(&mut self) -> Result<u32, NicError> {
        match self.held.take() {
            Some((s, c)) => self.place(s, c),
            None => Ok(0),
        }
    }
}

/// Runs the device side in the calling thread and returns its report. `--die-after`
/// makes it return at that point without clean-up (the liveness lock goes with it).
pub fn run_device_report(a: &NicemuOptions) -> Result<DeviceReport, NicError> {
    if let Some(core) = a.core {
        pin_to_core(core).map_err(NicError::Io)?;
    }
    if a.rt {
        crate::sys::set_fifo(50).map_err(NicError::Io)?;
    }
    if a.batch == 0 {
        return Err(NicError::Config("--batch must be at least 1".into()));
    }
    let mut dev = DeviceSide::attach(&a.name, Duration::from_millis(a.wait_ms))?;
    if a.size > dev.mtu + 18 || a.size < crate::frame::MIN_GEN_FRAME {
        return Err(NicError::Config(format!(
            "frame size {} does not fit the NIC's MTU {} (64..=MTU+18)",
            a.size, dev.mtu
        )));
    }
    dev.tx_mode = a.tx;
    dev.ring_policy = a.ring_full;
    let t = UdpTemplate::new(&FrameSpec {
        size: a.size,
        src_mac: a.src_mac,
        dst_mac: dev.driver_mac,
        src: a.src,
        dst: a.dst,
    })
    .map_err(NicError::Config)?;
    let ticks = a.count.div_ceil(a.batch as u64);
    let mut deliver = Vec::with_capacity(ticks.min(10_000_000) as usize);
    let mut raises = Vec::with_capacity(if a.record_raises {
        ticks.min(10_000_000) as usize
    } else {
        0
    });
    let mut g = Gen {
        t: &t,
        a,
        rng: SimRng::new(a.seed),
        next_seq: 0,
        held: None,
        link_down_left: 0,
        dev: &mut dev,
    };
    let t0 = now_ns() + a.start_delay_ms * 1_000_000;
    // Serve TX while waiting for the start.
    idle_until(&mut g, t0)?;
    let (mut late_ticks, mut max_late) = (0u64, 0u64);
    let (mut first_tick, mut last_tick) = (0u64, 0u64);
    let mut aborted = None;
    let mut left = a.count;
    'run: for tick in 0..ticks {
        let target = t0 + tick * a.interval_ns;
        let start = match idle_until(&mut g, target) {
            Ok(s) => s,
            Err(e) => {
                aborted = Some(e.to_string());
                break;
            }
        };
        if tick == 0 {
            first_tick = start;
        }
        last_tick = start;
        let late = start - target;
        if late > a.interval_ns.max(1_000) {
            late_ticks += 1;
        }
        max_late = max_late.max(late);
        let mut n = a.batch as u64;
        if a.burst_every > 0 && tick % a.burst_every == a.burst_every - 1 {
            g.dev.counters.bursts += 1;
            n += a.burst_len;
            left += a.burst_len;
        }
        let n = n.min(left);
        left -= n;
        let mut placed = 0u32;
        for k in 0..n {
            let r = g.one().and_then(|p| {
                if k + 1 == n && left == 0 {
                    Ok(p + g.flush()?)
                } else {
                    Ok(p)
                }
            });
            match r {
                Ok(p) => placed += p,
                Err(e) => {
                    aborted = Some(e.to_string());
                    break 'run;
                }
            }
            if a.irq_per_packet && placed > 0 {
                g.dev.rx_done(placed, now_ns());
                placed = 0;
            }
            if let Some(d) = a.die_after {
                if g.dev.counters.placed >= d {
                    aborted = Some("died (--die-after)".into());
                    break 'run;
                }
            }
        }
        let raised_at = now_ns();
        g.dev.rx_done(placed, raised_at);
        let end = now_ns();
        if n > 0 {
            deliver.push((end - start) as f64 / n as f64);
        }
        if a.record_raises {
            raises.push(raised_at);
        }
    }
    if aborted.as_deref() == Some("died (--die-after)") {
        // No clean-up at all: the link register stays "up"; only the lock tells.
        let counters = dev.counters;
        drop(dev);
        return Ok(report(
            a,
            counters,
            &deliver,
            (late_ticks, max_late),
            (t0, first_tick, last_tick),
            raises,
            aborted,
        ));
    }
    let end_gen = now_ns();
    if aborted.is_none() {
        let _ = idle_until(&mut g, end_gen + a.linger_ms * 1_000_000);
    }
    dev.publish_generated(dev.counters.generated);
    let counters = dev.detach();
    Ok(report(
        a,
        counters,
        &deliver,
        (late_ticks, max_late),
        (t0, first_tick, last_tick),
        raises,
        aborted,
    ))
}

fn report(
    a: &NicemuOptions,
    counters: DevCounters,
    deliver: &[f64],
    (late_ticks, max_late_ns): (u64, u64),
    (start_ns, first_tick_ns, last_tick_ns): (u64, u64, u64),
    raises_ns: Vec<u64>,
    aborted: Option<String>,
) -> DeviceReport {
    DeviceReport {
        name: a.name.clone(),
        size: a.size,
        interval_ns: a.interval_ns,
        batch: a.batch,
        counters,
        deliver_ns: Summary::of(deliver),
        late_ticks,
        max_late_ns,
        start_ns,
        end_ns: now_ns(),
        first_tick_ns,
        last_tick_ns,
        raises_ns,
        aborted,
    }
}

/// Busy-waits until `t` while serving the TX ring and moderated interrupts.
fn idle_until(g: &mut Gen<'_>, t: u64) -> Result<u64, NicError> {
    let mut spins = 0u32;
    loop {
        let now = now_ns();
        if now >= t {
            return Ok(now);
        }
        spins = spins.wrapping_add(1);
        if spins & 15 == 0 {
            g.dev.service_tx()?;
            g.dev.try_raise(now);
            if !g.dev.driver_alive(now, false) {
                return Err(NicError::DriverGone);
            }
        }
        std::hint::spin_loop();
    }
}

/// The `usnet nicemu` entry point: runs the device side, prints a summary, writes the
/// JSON report if asked. With `--die-after` the process aborts at that point.
pub fn run_device(a: &NicemuOptions) -> Result<(), Box<dyn std::error::Error>> {
    let r = run_device_report(a)?;
    if a.die_after.is_some() && r.aborted.is_some() {
        std::process::abort();
    }
    if let Some(p) = &a.stats_out {
        std::fs::write(p, serde_json::to_vec_pretty(&r)?)?;
    }
    if !a.quiet {
        let c = &r.counters;
        println!(
            "nicemu {}: generated {} placed {} missed {} dropped(fault {} link {}) dup {} reord {} corrupt {} | irqs {} (masked {}, futex wakes {}) | tx {} (verify ok {} bad {}, looped {})",
            a.name, c.generated, c.placed, c.missed, c.dropped_fault, c.dropped_link_down,
            c.duplicated, c.reordered, c.corrupted, c.irqs_raised, c.irqs_masked, c.futex_wakes,
            c.tx_frames, c.tx_verify_ok, c.tx_verify_bad, c.tx_looped
        );
        println!(
            "deliver per frame: median {:.0} ns, mean {:.0} ns, p99 {:.0} ns; late intervals {} (worst {} ns){}",
            r.deliver_ns.median, r.deliver_ns.mean, r.deliver_ns.p99, r.late_ticks, r.max_late_ns,
            r.aborted.as_ref().map(|s| format!("; stopped: {s}")).unwrap_or_default()
        );
    }
    Ok(())
}
