//! `usnet nicemu`: the device-side tool. Generates frames at a chosen interval and count,
//! busy-waiting on the monotonic clock, optionally pinned to a core, with fault injection.

use std::net::SocketAddrV4;
use std::time::Duration;

use usnet_sim::SimRng;

use crate::device::{DevCounters, DeviceSide, RingFullPolicy, TxMode};
use crate::frame::{FrameSpec, UdpTemplate};
use crate::sys::{now_ns, pin_to_core};
use crate::NicError;

fn parse_prob(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err("a probability is between 0 and 1".into())
    }
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{e}"))?;
    v.try_into().map_err(|_| "a MAC has six bytes".to_string())
}

/// The device-side tool (`usnet nicemu`).
#[derive(Debug, Clone, clap::Args)]
pub struct NicemuArgs {
    /// NIC name: attaches to /dev/shm/usnet-nic-NAME (created by the driver).
    #[arg(long)]
    pub name: String,
    /// Ethernet frame size in bytes (64..=65536; MTU + 14 must allow it).
    #[arg(long, default_value_t = 1514)]
    pub size: usize,
    /// Interval between interrupts (per packet, or per batch with --batch), in ns.
    #[arg(long, default_value_t = 38_000)]
    pub interval_ns: u64,
    /// Frames to generate (0: none, only serve the TX ring for --linger-ms).
    #[arg(long, default_value_t = 1000)]
    pub count: u64,
    /// Frames placed per interval; one interrupt per batch unless --irq-per-packet.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// With --batch > 1: raise an interrupt after every frame.
    #[arg(long)]
    pub irq_per_packet: bool,
    /// Destination of the generated UDP datagrams.
    #[arg(long, default_value = "10.0.0.2:9")]
    pub dst: SocketAddrV4,
    /// Source of the generated UDP datagrams.
    #[arg(long, default_value = "10.0.0.1:4000")]
    pub src: SocketAddrV4,
    /// Source MAC (the destination MAC is the driver's, from the NIC's config block).
    #[arg(long, default_value = "02:00:00:00:00:01", value_parser = parse_mac)]
    pub src_mac: [u8; 6],
    /// Pin the device side to this core.
    #[arg(long)]
    pub core: Option<usize>,
    /// Run the device side in SCHED_FIFO (real-time) so other load cannot preempt it.
    #[arg(long)]
    pub rt: bool,
    /// Wait this long for the driver to create the NIC.
    #[arg(long, default_value_t = 5000)]
    pub wait_ms: u64,
    /// Delay between attaching (link up) and the first frame.
    #[arg(long, default_value_t = 20)]
    pub start_delay_ms: u64,
    /// Keep serving the TX ring this long after the last frame.
    #[arg(long, default_value_t = 100)]
    pub linger_ms: u64,
    /// When the RX ring is full: drop (count as missed, like hardware) or wait.
    #[arg(long, value_enum, default_value_t = RingFullPolicy::Drop)]
    pub ring_full: RingFullPolicy,
    /// What to do with transmitted frames.
    #[arg(long, value_enum, default_value_t = TxMode::Count)]
    pub tx: TxMode,
    /// Fault: probability of dropping a frame.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub drop: f64,
    /// Fault: probability of corrupting a frame's last byte (checksum no longer matches).
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub corrupt: f64,
    /// Fault: probability of placing a frame twice.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub duplicate: f64,
    /// Fault: probability of holding a frame back behind the next one.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub reorder: f64,
    /// Bad descriptor: probability of completing one with a length beyond its buffer.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_len: f64,
    /// Bad descriptor: probability of completing one with a buffer index out of range.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_index: f64,
    /// Bad descriptor: probability of completing a last segment with no first.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_flags: f64,
    /// OWN game: probability of skipping a descriptor it still owns.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub own_skip: f64,
    /// Ring full: every K intervals place a back-to-back burst of --burst-len frames.
    #[arg(long, default_value_t = 0)]
    pub burst_every: u64,
    #[arg(long, default_value_t = 0)]
    pub burst_len: u64,
    /// Link flap: every N frames take the link down for --link-down-pkts frames.
    #[arg(long, default_value_t = 0)]
    pub link_flap_every: u64,
    #[arg(long, default_value_t = 10)]
    pub link_down_pkts: u64,
    /// Die (abort the process, no clean-up) after placing this many frames.
    #[arg(long)]
    pub die_after: Option<u64>,
    /// Seed of the fault generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write a JSON report here.
    #[arg(long)]
    pub stats_out: Option<std::path::PathBuf>,
    /// Include every interrupt's raise time in the JSON report.
    #[arg(long)]
    pub record_raises: bool,
    /// Print nothing.
    #[arg(long)]
    pub quiet: bool,
}

impl NicemuArgs {
    /// Defaults for `name`, as the CLI would give them.
    pub fn new(name: &str) -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: NicemuArgs,
        }
        P::parse_from(["nicemu", "--name", name]).a
    }

    /// The command-line arguments that reproduce these settings (to re-exec the tool).
    pub fn to_cli(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--name".into(),
            self.name.clone(),
            "--size".into(),
            self.size.to_string(),
            "--interval-ns".into(),
            self.interval_ns.to_string(),
            "--count".into(),
            self.count.to_string(),
            "--batch".into(),
            self.batch.to_string(),
            "--dst".into(),
            self.dst.to_string(),
            "--src".into(),
            self.src.to_string(),
            "--wait-ms".into(),
            self.wait_ms.to_string(),
            "--start-delay-ms".into(),
            self.start_delay_ms.to_string(),
            "--linger-ms".into(),
            self.linger_ms.to_string(),
            "--seed".into(),
            self.seed.to_string(),
        ];
        let m = self.src_mac;
        v.push("--src-mac".into());
        v.push(format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        ));
        use clap::ValueEnum;
        v.push("--ring-full".into());
        v.push(
            self.ring_full
                .to_possible_value()
                .unwrap()
                .get_name()
                .into(),
        );
        v.push("--tx".into());
        v.push(self.tx.to_possible_value().unwrap().get_name().into());
        for (flag, p) in [
            ("--drop", self.drop),
            ("--corrupt", self.corrupt),
            ("--duplicate", self.duplicate),
            ("--reorder", self.reorder),
            ("--bad-len", self.bad_len),
            ("--bad-index", self.bad_index),
            ("--bad-flags", self.bad_flags),
            ("--own-skip", self.own_skip),
        ] {
            if p > 0.0 {
                v.push(flag.into());
                v.push(p.to_string());
            }
        }
        for (flag, n) in [
            ("--burst-every", self.burst_every),
            ("--burst-len", self.burst_len),
            ("--link-flap-every", self.link_flap_every),
            ("--link-down-pkts", self.link_down_pkts),
        ] {
            v.push(flag.into());
            v.push(n.to_string());
        }
        if let Some(c) = self.core {
            v.push("--core".into());
            v.push(c.to_string());
        }
        if let Some(n) = self.die_after {
            v.push("--die-after".into());
            v.push(n.to_string());
        }
        if let Some(p) = &self.stats_out {
            v.push("--stats-out".into());
            v.push(p.display().to_string());
        }
        if self.rt {
            v.push("--rt".into());
        }
        if self.irq_per_packet {
            v.push("--irq-per-packet".into());
        }
        if self.record_raises {
            v.push("--record-raises".into());
        }
        if self.quiet {
            v.push("--quiet".into());
        }
        v
    }
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
    a: &'a NicemuArgs,
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
pub fn run_device_report(a: &NicemuArgs) -> Result<DeviceReport, NicError> {
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
    a: &NicemuArgs,
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
pub fn run_device(a: &NicemuArgs) -> Result<(), Box<dyn std::error::Error>> {
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
