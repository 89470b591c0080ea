//! `usnet bench nic`: the measurements of the Mint paper (an OS that plays the NIC for a driver in another), reproduced on the emulated
//! NIC. The benchmark process is the stack side (driver, and for experiment 3 the usnet
//! stack and a UDP application), pinned to core 1; each device side is a child process
//! (this binary re-executed with `usnet_nicemu::device_command`) pinned to core 0.
//!
//! 1. Device-side time to deliver one frame, by size.
//! 2. Interval accuracy: 1000 interrupts at 38 µs, seen by the driver's handler; and the
//!    Linux kernel sending to a TAP at 38 µs, seen by a reader (the "real device" path).
//! 3. Receive success rate against interval (cycles of 5000 frames), throughput at the
//!    first interval with 100% success, receive cost split into copy and protocol work.

use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use usnet_driver::{Driver, SystemClock};

use serde_json::{json, Value};
use usnet_link::nic::{IrqMode, NicDriver, NicOptions};
use usnet_link::Device;
use usnet_nicemu::sys::{now_ns, online_cpus, pin_to_core, set_fifo};
use usnet_nicemu::{device_command, NicemuOptions};
use usnet_pool::{PacketPool, PoolConfig};
use usnet_report::{Series, Table};

/// Options of the NIC benchmark (`usnet bench nic`).
#[derive(Debug, Clone)]
pub struct NicBenchOptions {
    /// Output directory for tables, JSON and plots.
    pub out: PathBuf,
    /// Runs per measurement (the median is reported).
    pub runs: usize,
    /// Fewer packets, runs and cycles: a smoke run.
    pub quick: bool,
    /// Skip the TAP contrast of experiment 2 (needs root).
    pub no_tap: bool,
    /// Run the stack side and the device side in SCHED_FIFO (real-time), so that other
    /// load on the machine cannot preempt them (root).
    pub rt: bool,
    /// Only these experiments (1, 2, 3); empty: all.
    pub only: Vec<u32>,
}

impl Default for NicBenchOptions {
    fn default() -> Self {
        NicBenchOptions {
            out: PathBuf::from("bench-out/nic"),
            runs: 5,
            quick: false,
            no_tap: false,
            rt: false,
            only: Vec::new(),
        }
    }
}

type BoxErr = Box<dyn std::error::Error>;

const DEV_CORE: usize = 0;
const STACK_CORE: usize = 1;
const DOC_DELIVER_US: [(usize, f64); 3] = [(1514, 0.205), (8192, 1.462), (16384, 3.664)];
const DOC_GBPS: [(usize, f64); 3] = [(1514, 6.3), (8192, 22.7), (16384, 30.6)];
const DOC_COPY_US: [(usize, f64, f64); 3] =
    [(1514, 0.272, 1.23), (8192, 1.32, 1.63), (16384, 2.18, 1.75)];
const GOAL_GBPS: [(usize, f64); 3] = [(1514, 10.0), (8192, 30.0), (16384, 40.0)];

struct Ctx {
    exe: PathBuf,
    pin: bool,
    rt: bool,
    seq: u32,
    out: PathBuf,
}

impl Ctx {
    fn name(&mut self) -> String {
        self.seq += 1;
        format!("bench-{}-{}", std::process::id(), self.seq)
    }

    /// Starts the device side as a child process and waits (sleeping, so the child can
    /// run on this core until it has moved itself to its own) until it has attached.
    fn spawn_device(&self, a: &NicemuOptions, drv: &NicDriver) -> Result<Child, BoxErr> {
        let before = drv.device_attaches();
        let mut child = self.spawn_device_raw(a)?;
        let t0 = now_ns();
        // A short run may attach, finish and exit between two looks: count attaches.
        while drv.device_attaches() == before {
            if let Some(st) = child.try_wait()? {
                if drv.device_attaches() != before {
                    break;
                }
                return Err(format!("device side exited before attaching: {st}").into());
            }
            if now_ns() - t0 > 10_000_000_000 {
                crate::kill_and_reap(&mut child, Duration::from_secs(5));
                return Err("device side did not attach within 10 s".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(child)
    }

    fn spawn_device_raw(&self, a: &NicemuOptions) -> Result<Child, BoxErr> {
        let mut a = a.clone();
        a.quiet = true;
        a.rt = self.rt;
        if self.pin {
            a.core = Some(DEV_CORE);
        }
        Ok(device_command(&a)?
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the device side ({}): {e}", self.exe.display()))?)
    }
}

fn read_report(path: &Path) -> Result<Value, BoxErr> {
    let mut s = String::new();
    std::fs::File::open(path)?.read_to_string(&mut s)?;
    Ok(serde_json::from_str(&s)?)
}

fn driver_opts(size: usize, mode: IrqMode, ring: u32) -> NicOptions {
    NicOptions {
        rx_ring: ring,
        tx_ring: 64,
        buf_size: Some(16384),
        mtu: mtu_for(size),
        irq_mode: mode,
        napi_budget: 64,
        record_irqs: 1 << 20,
        ..Default::default()
    }
}

fn mtu_for(size: usize) -> usize {
    if size <= 1514 {
        1500
    } else {
        (size - 14).clamp(9000, 65518)
    }
}

/// When a device side running `a` must have exited: twice its schedule plus 30 s for a
/// loaded machine.
fn exit_deadline(a: &NicemuOptions) -> u64 {
    let ticks = a.count.div_ceil(a.batch.max(1) as u64);
    let schedule = (a.start_delay_ms + a.linger_ms) * 1_000_000 + ticks * a.interval_ns;
    now_ns() + 2 * schedule + 30_000_000_000
}

/// Fails the run (and kills the device side) once `deadline` has passed.
fn check_deadline(child: &mut Child, deadline: u64) -> Result<(), BoxErr> {
    if now_ns() > deadline {
        crate::kill_and_reap(child, Duration::from_secs(5));
        return Err("the device side did not finish in time (killed)".into());
    }
    Ok(())
}

/// Runs the driver alone (receive, free) until the child exits; returns frames received.
fn drive_until_exit(
    drv: &mut NicDriver,
    pool: &mut PacketPool,
    child: &mut Child,
    a: &NicemuOptions,
) -> Result<u64, BoxErr> {
    let mut out = Vec::with_capacity(64);
    let mut n = 0u64;
    let mut last_check = now_ns();
    let deadline = exit_deadline(a);
    loop {
        check_deadline(child, deadline)?;
        drv.wait(Some(Duration::from_millis(2)))?;
        loop {
            out.clear();
            let k = drv.rx_burst(pool, &mut out, 64)?;
            for b in out.drain(..) {
                pool.free(b);
            }
            n += k as u64;
            if k == 0 {
                break;
            }
        }
        let now = now_ns();
        if now - last_check > 2_000_000 {
            last_check = now;
            if let Some(st) = child.try_wait()? {
                // Drain what is left.
                out.clear();
                n += drv.rx_burst(pool, &mut out, usize::MAX)? as u64;
                for b in out.drain(..) {
                    pool.free(b);
                }
                if !st.success() {
                    return Err(format!("device side failed: {st}").into());
                }
                return Ok(n);
            }
        }
    }
}

fn pool_for(size: usize, count: u32) -> Result<PacketPool, BoxErr> {
    let buf_size = if size <= 1514 { 2048 } else { 65536 };
    Ok(PacketPool::new(&PoolConfig {
        buf_size,
        count,
        ..Default::default()
    })?)
}

fn base_args(name: &str, out: &Path, tag: &str) -> NicemuOptions {
    let mut a = NicemuOptions::new(name);
    a.start_delay_ms = 5;
    a.linger_ms = 0;
    a.stats_out = Some(out.join(format!(".dev-{tag}.json")));
    a
}

// ---------------------------------------------------------------- experiment 1

fn exp1(ctx: &mut Ctx, b: &NicBenchOptions, json: &mut Value) -> Result<(), BoxErr> {
    let sizes: &[usize] = if b.quick {
        &[1514, 8192, 16384]
    } else {
        &[64, 1514, 8192, 16384, 65536]
    };
    let count = if b.quick { 1000 } else { 5000 };
    let mut t = Table::new(
        "Experiment 1: device-side time to deliver one frame (descriptor + copy + interrupt), median of runs",
        ["frame B", "line spun (µs)", "futex wake (µs)", "p99 spun (µs)", "document (µs)"]
            .map(String::from)
            .to_vec(),
    );
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for &size in sizes {
        let mut per_mode = Vec::new();
        for mode in [IrqMode::Spin, IrqMode::Futex] {
            let mut med = Vec::new();
            let mut p99 = Vec::new();
            for _ in 0..b.runs {
                let name = ctx.name();
                let mut drv = NicDriver::create(&name, &driver_opts(size, mode, 256))?;
                let mut pool = pool_for(size, 512)?;
                let mut a = base_args(&name, &ctx.out, "e1");
                a.size = size;
                a.count = count;
                a.interval_ns = 20_000 + size as u64; // the driver keeps up: no ring-full
                let mut child = ctx.spawn_device(&a, &drv)?;
                drive_until_exit(&mut drv, &mut pool, &mut child, &a)?;
                let r = read_report(a.stats_out.as_ref().unwrap())?;
                med.push(r["deliver_ns"]["median"].as_f64().unwrap_or(f64::NAN));
                p99.push(r["deliver_ns"]["p99"].as_f64().unwrap_or(f64::NAN));
            }
            per_mode.push((
                usnet_report::median(&mut med),
                usnet_report::median(&mut p99),
            ));
        }
        let doc = DOC_DELIVER_US.iter().find(|d| d.0 == size).map(|d| d.1);
        t.row(vec![
            size.to_string(),
            format!("{:.3}", per_mode[0].0 / 1e3),
            format!("{:.3}", per_mode[1].0 / 1e3),
            format!("{:.3}", per_mode[0].1 / 1e3),
            doc.map_or("-".into(), |d| format!("{d:.3}")),
        ]);
        bars.push((format!("{size} B"), per_mode[0].0 / 1e3));
        rows.push(
            json!({"size": size, "spin_median_ns": per_mode[0].0, "spin_p99_ns": per_mode[0].1,
            "futex_median_ns": per_mode[1].0, "futex_p99_ns": per_mode[1].1, "document_us": doc}),
        );
    }
    t.print();
    let _ = usnet_report::bar_plot(
        &ctx.out.join("exp1_deliver.png"),
        "Device-side time to deliver one frame (line spun)",
        "µs",
        &bars,
    );
    json["exp1_deliver"] =
        json!({"count": count, "runs": b.runs, "rows": rows, "table": t.to_markdown()});
    Ok(())
}

// ---------------------------------------------------------------- experiment 2

struct Accuracy {
    n: usize,
    within_1us: f64,
    worst_ns: i64,
    outliers_6_25: usize,
    errors: Vec<i64>,
}

fn accuracy(times: &[u64], spec_ns: u64) -> Accuracy {
    let errors: Vec<i64> = times
        .windows(2)
        .map(|w| (w[1] - w[0]) as i64 - spec_ns as i64)
        .collect();
    let within = errors.iter().filter(|e| e.abs() <= 1000).count();
    let tol = (spec_ns as f64 * 0.0625) as i64;
    Accuracy {
        n: errors.len(),
        within_1us: if errors.is_empty() {
            0.0
        } else {
            within as f64 / errors.len() as f64
        },
        worst_ns: errors.iter().map(|e| e.abs()).max().unwrap_or(0),
        outliers_6_25: errors.iter().filter(|e| e.abs() > tol).count(),
        errors,
    }
}

fn histogram(errors: &[i64]) -> Vec<(f64, u64)> {
    // 250 ns buckets from -5 µs to +5 µs; everything beyond goes to the end buckets.
    let mut b = vec![0u64; 40];
    for &e in errors {
        let i = ((e as f64 / 250.0).floor() as i64 + 20).clamp(0, 39) as usize;
        b[i] += 1;
    }
    b.iter()
        .enumerate()
        .map(|(i, &c)| ((i as f64 - 20.0) * 0.25, c))
        .collect()
}

fn exp2(ctx: &mut Ctx, b: &NicBenchOptions, json: &mut Value) -> Result<(), BoxErr> {
    const SPEC: u64 = 38_000;
    let count = 1000u64;
    let mut t = Table::new(
        "Experiment 2: 1000 interrupts at 38 µs; observed − specified interval at the handler",
        [
            "path",
            "within ±1 µs",
            "worst |err| (µs)",
            "beyond 6.25%",
            "device raise within ±1 µs",
            "document",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut rows = Vec::new();
    for (label, mode) in [
        ("nicemu, line spun", IrqMode::Spin),
        ("nicemu, futex wake", IrqMode::Futex),
    ] {
        let mut shares = Vec::new();
        let mut dev_shares = Vec::new();
        let mut worst = 0i64;
        let mut outl = Vec::new();
        let mut all_err = Vec::new();
        for _ in 0..b.runs {
            let name = ctx.name();
            let mut drv = NicDriver::create(&name, &driver_opts(1514, mode, 256))?;
            let mut pool = pool_for(1514, 512)?;
            let mut a = base_args(&name, &ctx.out, "e2");
            a.size = 1514;
            a.count = count;
            a.interval_ns = SPEC;
            a.record_raises = true;
            let mut child = ctx.spawn_device(&a, &drv)?;
            drive_until_exit(&mut drv, &mut pool, &mut child, &a)?;
            let recs = drv.take_irq_records();
            // Only RX interrupts of the run: those the device logged as raised during it.
            let r = read_report(a.stats_out.as_ref().unwrap())?;
            let raises: Vec<u64> = r["raises_ns"]
                .as_array()
                .map(|v| v.iter().filter_map(|x| x.as_u64()).collect())
                .unwrap_or_default();
            let (first, last) = (
                raises.first().copied().unwrap_or(0),
                raises.last().copied().unwrap_or(0),
            );
            let handled: Vec<u64> = recs
                .iter()
                .filter(|r| r.handled_ns >= first && r.raised_ns >= first && r.raised_ns <= last)
                .map(|r| r.handled_ns)
                .collect();
            let acc = accuracy(&handled, SPEC);
            let dacc = accuracy(&raises, SPEC);
            shares.push(acc.within_1us * 100.0);
            dev_shares.push(dacc.within_1us * 100.0);
            worst = worst.max(acc.worst_ns);
            outl.push(acc.outliers_6_25 as f64);
            all_err.extend(acc.errors);
            if acc.n + 1 < count as usize {
                eprintln!(
                    "  note: {label}: {} of {count} interrupts reached the handler",
                    acc.n + 1
                );
            }
        }
        let share = usnet_report::median(&mut shares);
        let dshare = usnet_report::median(&mut dev_shares);
        let o = usnet_report::median(&mut outl);
        t.row(vec![
            label.into(),
            format!("{share:.1}%"),
            format!("{:.2}", worst as f64 / 1e3),
            format!("{o:.0}"),
            format!("{dshare:.1}%"),
            "99.6%, 4 outliers ≤ 6.25%".into(),
        ]);
        let _ = usnet_report::histogram_plot(
            &ctx.out.join(format!(
                "exp2_{}.png",
                if mode == IrqMode::Spin {
                    "spin"
                } else {
                    "futex"
                }
            )),
            &format!("Interval error at the handler, {label} (38 µs, all runs)"),
            "observed − specified (µs; end buckets hold everything beyond ±5 µs)",
            &histogram(&all_err),
        );
        rows.push(
            json!({"path": label, "within_1us_pct_median": share, "worst_abs_err_ns": worst,
            "outliers_beyond_6_25pct_median": o, "device_raise_within_1us_pct_median": dshare,
            "histogram_250ns": histogram(&all_err)}),
        );
    }
    // The real-device path: the Linux kernel sends over a TAP, a reader timestamps.
    let tap = if b.no_tap {
        Err("skipped (--no-tap)".to_string())
    } else {
        tap_contrast(ctx, count as usize, SPEC, b.runs)
    };
    match tap {
        Ok(tc) => {
            let (acc, share_med, outl) = (&tc.acc, tc.share_median, tc.outliers_median);
            let lost = if tc.lost + tc.send_errors > 0 {
                format!(" ({} lost, {} sends failed)", tc.lost, tc.send_errors)
            } else {
                String::new()
            };
            t.row(vec![
                format!("Linux → TAP, read by usnet{lost}"),
                format!("{share_med:.1}%"),
                format!("{:.2}", acc.worst_ns as f64 / 1e3),
                format!("{outl:.0}"),
                "-".into(),
                "RTL8169: ±2 µs, rare ~4 s".into(),
            ]);
            let _ = usnet_report::histogram_plot(
                &ctx.out.join("exp2_tap.png"),
                "Interval error seen by usnet, Linux kernel → TAP (38 µs, all runs)",
                "observed − specified (µs)",
                &histogram(&acc.errors),
            );
            rows.push(
                json!({"path": "linux-tap", "within_1us_pct_median": share_med,
                "worst_abs_err_ns": acc.worst_ns, "outliers_beyond_6_25pct_median": outl,
                "lost": tc.lost, "send_errors": tc.send_errors,
                "histogram_250ns": histogram(&acc.errors)}),
            );
        }
        Err(e) => {
            t.row(vec!["Linux → TAP".into(), format!("not run: {e}")]);
            rows.push(json!({"path": "linux-tap", "skipped": e}));
        }
    }
    t.print();
    json["exp2_accuracy"] = json!({"spec_ns": SPEC, "count": count, "runs": b.runs, "rows": rows, "table": t.to_markdown()});
    Ok(())
}

fn ip(args: &[&str]) -> Result<(), String> {
    let st = Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("ip: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("ip {} failed", args.join(" ")))
    }
}

/// What the TAP contrast measured over all its runs.
struct TapContrast {
    acc: Accuracy,
    share_median: f64,
    outliers_median: f64,
    /// Datagrams the sender handed to the kernel and the reader never saw before its
    /// deadline (all runs).
    lost: u64,
    /// `send` calls that failed (socket buffer full, ...; all runs).
    send_errors: u64,
}

/// How long the reader waits past the sender's last scheduled send for stragglers.
const TAP_GRACE: Duration = Duration::from_secs(2);

/// Linux sends UDP at `spec` ns intervals to a neighbour behind a TAP; the reader (this
/// thread, the "usnet side") timestamps each frame as it reads it. Every read waits
/// with a deadline (the send schedule plus [`TAP_GRACE`]): a datagram lost on the way,
/// or one the sender failed to send, is counted instead of stalling the run.
fn tap_contrast(ctx: &Ctx, count: usize, spec: u64, runs: usize) -> Result<TapContrast, String> {
    // Privileges, read from /proc (effective uid).
    if !std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
    {
        return Err("needs root (TAP)".into());
    }
    let (mut tap, ifname) = open_tap("usnic%d").map_err(|e| format!("tap: {e}"))?;
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"),
        "1",
    );
    ip(&["addr", "add", "10.239.0.1/24", "dev", &ifname])?;
    ip(&["link", "set", &ifname, "up"])?;
    ip(&[
        "neigh",
        "replace",
        "10.239.0.2",
        "lladdr",
        "02:00:00:00:00:02",
        "dev",
        &ifname,
        "nud",
        "permanent",
    ])?;
    let mut shares = Vec::new();
    let mut outl = Vec::new();
    let mut all: Option<Accuracy> = None;
    let (mut lost, mut send_errors) = (0u64, 0u64);
    let total = count + 10;
    for _ in 0..runs {
        let (pin, rt) = (ctx.pin, ctx.rt);
        // The sender never blocks (non-blocking socket, busy-paced on the clock), so it
        // ends within its schedule; it reports how many sends failed.
        let sender = std::thread::spawn(move || -> Result<u64, String> {
            if pin {
                let _ = pin_to_core(DEV_CORE);
            }
            if rt {
                let _ = set_fifo(50);
            }
            let s = UdpSocket::bind("10.239.0.1:0").map_err(|e| e.to_string())?;
            s.connect("10.239.0.2:9").map_err(|e| e.to_string())?;
            s.set_nonblocking(true).map_err(|e| e.to_string())?;
            let payload = vec![0x42u8; 1472];
            std::thread::sleep(Duration::from_millis(20));
            let t0 = now_ns();
            let mut failed = 0u64;
            for i in 0..total as u64 {
                spin_until(t0 + i * spec);
                if s.send(&payload).is_err() {
                    failed += 1;
                }
            }
            Ok(failed)
        });
        let schedule = Duration::from_millis(20) + Duration::from_nanos(spec * total as u64);
        let deadline = now_ns() + (schedule + TAP_GRACE).as_nanos() as u64;
        let mut times = Vec::with_capacity(total);
        let mut frame = vec![0u8; 2048];
        while times.len() < total {
            let left = deadline.saturating_sub(now_ns());
            if left == 0 {
                break; // the rest was lost (or never sent): counted below
            }
            let ready = usnet_shm::poll_fds(&[tap.as_fd()], Duration::from_nanos(left))
                .map_err(|e| e.to_string())?;
            if !ready.any() {
                continue;
            }
            let n = tap.read(&mut frame).map_err(|e| e.to_string())?;
            let t = now_ns();
            // UDP to port 9 over IPv4 only (ignore anything else the kernel sends).
            if n >= 42 && frame[12..14] == [8, 0] && frame[23] == 17 && frame[36..38] == [0, 9] {
                times.push(t);
            }
        }
        let failed =
            crate::join_within(sender, TAP_GRACE).map_err(|e| format!("TAP sender: {e}"))??;
        send_errors += failed;
        let missing = (total - times.len()) as u64;
        lost += missing.saturating_sub(failed);
        if missing > 0 {
            eprintln!(
                "  note: Linux → TAP: {missing} of {total} datagrams not read before the deadline ({failed} sends failed)"
            );
        }
        // The first 10 warm the path up; a lost datagram shows as a doubled interval.
        let acc = accuracy(&times[times.len().min(10)..], spec);
        shares.push(acc.within_1us * 100.0);
        outl.push(acc.outliers_6_25 as f64);
        all = Some(match all {
            None => acc,
            Some(mut a) => {
                a.worst_ns = a.worst_ns.max(acc.worst_ns);
                a.errors.extend(acc.errors);
                a
            }
        });
    }
    drop(tap); // a non-persistent TAP disappears with its descriptor
    Ok(TapContrast {
        acc: all.expect("runs >= 1"),
        share_median: usnet_report::median(&mut shares),
        outliers_median: usnet_report::median(&mut outl),
        lost,
        send_errors,
    })
}

/// Busy-waits (no sleep) until the monotonic clock reaches `t`; returns the time seen.
#[inline]
fn spin_until(t: u64) -> u64 {
    loop {
        let n = now_ns();
        if n >= t {
            return n;
        }
        std::hint::spin_loop();
    }
}

/// Opens `/dev/net/tun` as a TAP (IFF_TAP | IFF_NO_PI) named after `name` (a `%d`
/// pattern is allowed); returns the file and the name the kernel chose. A raw TAP, not
/// usnet-link's (no vnet header, no pool): the contrast path reads frames as they come.
fn open_tap(name: &str) -> std::io::Result<(File, String)> {
    use std::os::fd::AsRawFd;
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is a plain C struct; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes the ifreq we pass, on the tun fd we own.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let chosen: String = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    Ok((file, chosen))
}

// ---------------------------------------------------------------- experiment 3

struct Cycle {
    /// The interval the device side actually achieved (it may run late at small ones).
    achieved_ns: f64,
    received: u64,
    sent: u64,
    copy_ns: u64,
    proto_ns: u64,
    missed: u64,
}

/// One stack (usnet-stack) on the NIC driver, with one UDP socket read by the "application"
/// in the same loop.
struct StackSide {
    /// The shared driver loop, timing its phases (device copy, protocol work).
    d: Driver<NicDriver>,
    sock: usnet_stack::SocketHandle,
    name: String,
}

fn stack_side(name: &str, size: usize) -> Result<StackSide, BoxErr> {
    let mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
    let mtu = mtu_for(size);
    let mut cfg = usnet_stack::StackConfig {
        mac: usnet_wire::MacAddr(mac),
        addrs: vec!["10.0.0.2/24".parse()?],
        mtu,
        ..Default::default()
    };
    cfg.pool = PoolConfig {
        buf_size: if size <= 1514 { 2048 } else { 65536 },
        count: if size <= 1514 { 4096 } else { 640 },
        ..Default::default()
    };
    cfg.input_queue_len = 1024;
    let mut stack = usnet_stack::Stack::new(cfg)?;
    let sock = stack
        .udp_bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), 9))
        .map_err(|e| format!("udp_bind: {e}"))?;
    let _ = stack.udp_set_recv_buffer(sock, 64 << 20);
    let mut o = driver_opts(size, IrqMode::Hybrid { spin_ns: 200_000 }, 256);
    o.mac = mac;
    o.mtu = mtu;
    o.record_irqs = 0;
    let drv = NicDriver::create(name, &o)?;
    let mut d = Driver::new(stack, drv, SystemClock::new());
    d.set_phase_timing(true);
    Ok(StackSide {
        d,
        sock,
        name: name.to_string(),
    })
}

fn run_cycle(
    ctx: &Ctx,
    s: &mut StackSide,
    size: usize,
    interval: u64,
    count: u64,
) -> Result<Cycle, BoxErr> {
    let mut a = base_args(&s.name, &ctx.out, "e3");
    a.size = size;
    a.count = count;
    a.interval_ns = interval;
    a.dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 9);
    a.src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4000);
    let mut child = ctx.spawn_device(&a, s.d.device())?;
    let mut app = vec![0u8; 65536];
    let (mut received, mut copy_ns, mut proto_ns) = (0u64, 0u64, 0u64);
    let mut last_check = now_ns();
    let mut finished = false;
    let deadline = exit_deadline(&a);
    let sock = s.sock;
    // The application reads every datagram in the same turn (its time counts as
    // protocol work, as in the document's split of receive cost).
    let mut turn = |d: &mut Driver<NicDriver>, received: &mut u64| {
        d.turn_with(|stack| {
            let mut any = false;
            while stack.udp_recv_from(sock, &mut app).is_ok() {
                *received += 1;
                any = true;
            }
            any
        })
    };
    while !finished {
        check_deadline(&mut child, deadline)?;
        // The NIC's own wait, with its interrupt mode (hybrid spin, then sleep).
        s.d.device_mut().wait(Some(Duration::from_millis(2)))?;
        loop {
            let t = turn(&mut s.d, &mut received)?;
            if t.received == 0 {
                break;
            }
            copy_ns += t.rx_ns;
            proto_ns += t.work_ns;
        }
        let now = now_ns();
        if now - last_check > 2_000_000 {
            last_check = now;
            if let Some(st) = child.try_wait()? {
                if !st.success() {
                    return Err(format!("device side failed: {st}").into());
                }
                finished = true;
            }
        }
    }
    // Frames still in the ring after the device left.
    while turn(&mut s.d, &mut received)?.received > 0 {}
    let r = read_report(a.stats_out.as_ref().unwrap())?;
    let missed = r["counters"]["missed"].as_u64().unwrap_or(0);
    let span = r["last_tick_ns"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(r["first_tick_ns"].as_u64().unwrap_or(0));
    let achieved_ns = (span as f64 / (count.max(2) - 1) as f64).max(interval as f64);
    Ok(Cycle {
        achieved_ns,
        received,
        sent: count,
        copy_ns,
        proto_ns,
        missed,
    })
}

fn exp3(ctx: &mut Ctx, b: &NicBenchOptions, json: &mut Value) -> Result<(), BoxErr> {
    let count = if b.quick { 2000 } else { 5000 };
    let sizes = [1514usize, 8192, 16384];
    let mut t = Table::new(
        format!(
            "Experiment 3: receive success vs interval ({count} frames per cycle), median of runs"
        ),
        [
            "frame B",
            "first 100% interval (µs, achieved)",
            "Gbps there",
            "goal Gbps",
            "document Gbps",
            "copy µs",
            "protocol µs",
            "document copy / protocol µs",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut series = Vec::new();
    let mut rows = Vec::new();
    for &size in &sizes {
        let mut firsts = Vec::new();
        let mut copies = Vec::new();
        let mut protos = Vec::new();
        let mut curve: Vec<(f64, f64)> = Vec::new();
        let mut run_rows = Vec::new();
        for run in 0..b.runs {
            let name = ctx.name();
            let mut s = stack_side(&name, size)?;
            // Start well below the wire time of the copy and lengthen by 10% per cycle.
            let mut interval = (size as u64 / 16).max(100);
            let mut first = None;
            let mut cycles = Vec::new();
            let mut ok_streak = 0;
            for _ in 0..60 {
                let c = run_cycle(ctx, &mut s, size, interval, count)?;
                let rate = c.received as f64 / c.sent as f64;
                if run == 0 {
                    curve.push((c.achieved_ns / 1e3, rate * 100.0));
                }
                cycles.push(json!({"interval_ns": interval, "achieved_ns": c.achieved_ns, "received": c.received, "sent": c.sent, "missed": c.missed}));
                if c.received == c.sent {
                    if first.is_none() {
                        first = Some(c.achieved_ns);
                        if c.received > 0 {
                            copies.push(c.copy_ns as f64 / c.received as f64);
                            protos.push(c.proto_ns as f64 / c.received as f64);
                        }
                    }
                    ok_streak += 1;
                    if ok_streak >= 2 {
                        break;
                    }
                } else {
                    ok_streak = 0;
                }
                interval = (interval as f64 * 1.10).ceil() as u64;
            }
            if let Some(f) = first {
                firsts.push(f);
            }
            run_rows.push(json!({"first_100pct_ns": first, "cycles": cycles, "pool_in_use_after": s.d.stack().pool().in_use()}));
        }
        let first = usnet_report::median(&mut firsts);
        let gbps = size as f64 * 8.0 / first;
        let copy = usnet_report::median(&mut copies);
        let proto = usnet_report::median(&mut protos);
        let doc = DOC_GBPS
            .iter()
            .find(|d| d.0 == size)
            .map(|d| d.1)
            .unwrap_or(f64::NAN);
        let goal = GOAL_GBPS
            .iter()
            .find(|d| d.0 == size)
            .map(|d| d.1)
            .unwrap_or(f64::NAN);
        let dc = DOC_COPY_US
            .iter()
            .find(|d| d.0 == size)
            .copied()
            .unwrap_or((size, f64::NAN, f64::NAN));
        t.row(vec![
            size.to_string(),
            format!("{:.3}", first / 1e3),
            format!("{gbps:.1}"),
            format!("{goal:.0}"),
            format!("{doc:.1}"),
            format!("{:.3}", copy / 1e3),
            format!("{:.3}", proto / 1e3),
            format!("{} / {}", dc.1, dc.2),
        ]);
        series.push(Series::new(format!("{size} B"), curve));
        rows.push(json!({"size": size, "first_100pct_interval_ns_median": first, "gbps": gbps,
            "goal_gbps": goal, "document_gbps": doc, "copy_ns_per_frame": copy, "protocol_ns_per_frame": proto,
            "runs": run_rows}));
    }
    t.print();
    let _ = usnet_report::line_plot(
        &ctx.out.join("exp3_success.png"),
        "Receive success rate vs interval (first run)",
        "interval (µs)",
        "success (%)",
        &series,
        false,
    );
    json["exp3_receive"] =
        json!({"count": count, "runs": b.runs, "rows": rows, "table": t.to_markdown()});
    Ok(())
}

/// `usnet bench nic`.
pub fn run_bench(b: &NicBenchOptions) -> Result<(), BoxErr> {
    crate::check_only(&b.only, &[1, 2, 3])?;
    let mut b = b.clone();
    if b.quick {
        b.runs = b.runs.min(2);
    }
    b.runs = b.runs.max(1);
    std::fs::create_dir_all(&b.out)?;
    let pin = online_cpus() >= 2;
    if pin {
        pin_to_core(STACK_CORE)?;
    }
    if b.rt {
        set_fifo(50)?;
    }
    let mut ctx = Ctx {
        exe: std::env::current_exe()?,
        pin,
        rt: b.rt,
        seq: 0,
        out: b.out.clone(),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "usnet bench nic: device side on core {DEV_CORE}, stack on core {STACK_CORE} (pinned: {pin}, SCHED_FIFO: {}); load average {}",
        b.rt,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let mut json = json!({"cpus": online_cpus(), "pinned": pin, "rt": b.rt, "loadavg_start": load.trim(), "runs": b.runs, "quick": b.quick});
    let want = |n: u32| b.only.is_empty() || b.only.contains(&n);
    if want(1) {
        exp1(&mut ctx, &b, &mut json)?;
    }
    if want(2) {
        exp2(&mut ctx, &b, &mut json)?;
    }
    if want(3) {
        exp3(&mut ctx, &b, &mut json)?;
    }
    json["loadavg_end"] = json!(std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim());
    for e in std::fs::read_dir(&b.out)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(".dev-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    usnet_report::write_json(&b.out.join("nic.json"), &json)?;
    println!("wrote {}", b.out.join("nic.json").display());
    Ok(())
}
