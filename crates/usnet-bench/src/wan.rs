//! `usnet bench tcp --wan`: bulk TCP over an emulated wide-area path, usnet's
//! congestion controllers against Linux's over the same path in the same run.
//!
//! The path is `usnet-sim`'s model (the one the simulation tests use) run on the
//! wall clock by the link's fault injector (`usnet_link::fault::FaultInjector`, as
//! `usnet up --fault` runs it) in front of the far end, with a forwarding thread
//! between the two ends: a bottleneck of `rate` with a drop-tail queue
//! of `queue` at its entrance, `rtt / 2` of propagation delay each way, and random
//! loss each way. Its far end is a TAP interface in a network namespace where a
//! Linux socket receives; its near end is either a TAP in a second namespace (a
//! Linux sender) or a shm link to a usnet stack in this process (a usnet sender):
//!
//! ```text
//! Linux sender (ns A) ─ tap ─┐                 ┌─ tap ─ Linux receiver (ns B)
//!                            ├─ path emulator ─┤
//! usnet sender ──────── shm ─┘                 
//! ```
//!
//! This machine's kernel has no `netem` and no `fq` qdisc, hence the emulator in
//! user space; it holds frames in place in pool buffers, and its timing error
//! (a sleep's slack, tens of microseconds) is small beside a 50 ms round trip.
//! Each run sends for `seconds` with one controller; the receiver's goodput (first
//! byte to EOF) and the sender's retransmitted segments are reported.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_driver::{Driver, SystemClock};
use usnet_link::fault::FaultInjector;
use usnet_link::{Device, LinkOptions, LinkSpec};
use usnet_pool::{Backing, PacketPool, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{bar_plot_runs, median, write_json, Bar, Table};
use usnet_sim::PathConfig;
use usnet_stack::{mac_from_seed, CcAlgorithm, Stack, StackConfig, StackError};

use crate::tcp::{enter_netns, ip, is_root, linux_tcp_info};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NS: [&str; 2] = ["usnet-wan-a", "usnet-wan-b"];
const TAP: [&str; 2] = ["usnwan-a", "usnwan-b"];
const LINUX_SENDER: &str = "10.77.0.1";
const RECEIVER: &str = "10.77.0.2";
const USNET_SENDER: &str = "10.77.0.3";
const PORT: u16 = 5201;
const WRITE: usize = 64 << 10;
/// The sender goes on this long past the measured window, so that the window
/// ends full.
const SEND_EXTRA: f64 = 1.0;

/// Options of `usnet bench tcp --wan`.
#[derive(Debug, Clone)]
pub struct WanOptions {
    /// Directory for wan.json, wan.md and wan.png.
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    pub runs: usize,
    /// Seconds each sender sends.
    pub seconds: f64,
    /// Round-trip propagation delay.
    pub rtt: Duration,
    /// Bottleneck rate, bits per second.
    pub rate_bps: u64,
    /// Random loss each way.
    pub loss: f64,
    /// The bottleneck queue, in time at the rate.
    pub queue: Duration,
    /// Controllers to compare (Linux names).
    pub ccs: Vec<String>,
}

impl Default for WanOptions {
    fn default() -> Self {
        WanOptions {
            out: PathBuf::from("bench-out/tcp-wan"),
            runs: 3,
            seconds: 10.0,
            rtt: Duration::from_millis(50),
            rate_bps: 100_000_000,
            loss: 0.01,
            queue: Duration::from_millis(10),
            ccs: vec!["bbr".into(), "cubic".into()],
        }
    }
}

impl WanOptions {
    fn path(&self) -> PathConfig {
        PathConfig {
            delay: self.rtt / 2,
            rate: self.rate_bps / 8,
            // Preamble, inter-frame gap and FCS: what a frame takes on a wire
            // beyond the bytes the TAP hands over.
            overhead: 24,
            queue: self.queue,
            loss: self.loss,
            ..PathConfig::default()
        }
    }
}

/// The two namespaces with a TAP each; removed on drop.
struct Netns;

impl Netns {
    fn create() -> Res<Netns> {
        let n = Netns;
        for ns in NS {
            let _ = ip(&["netns", "del", ns]);
            ip(&["netns", "add", ns]).map_err(|e| e.to_string())?;
            ip(&["-n", ns, "link", "set", "lo", "up"]).map_err(|e| e.to_string())?;
        }
        Ok(n)
    }

    /// Moves TAP `i` (opened by this process) into namespace `i` with `addr`.
    fn place(&self, i: usize, addr: &str) -> Res<()> {
        let run = |a: &[&str]| ip(a).map_err(|e| e.to_string());
        run(&["link", "set", TAP[i], "netns", NS[i]])?;
        run(&[
            "-n",
            NS[i],
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            TAP[i],
        ])?;
        run(&["-n", NS[i], "link", "set", TAP[i], "up"])?;
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in NS {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// What the emulator's path did, per direction (A→B, B→A).
#[derive(Debug, Default, Clone, Copy)]
struct EmuStats {
    lost: [u64; 2],
    queue_drops: [u64; 2],
}

/// Forwards frames between `near` and `far` until `stop`, through the path model
/// in front of `far` (the link's fault injector: what A sends goes out through
/// its tx path, what B sends comes in through its rx path). Returns what the path
/// did, and `far` for the next run.
fn emulate(
    near: &mut dyn Device,
    far: Box<dyn Device>,
    cfg: PathConfig,
    seed: u64,
    stop: &AtomicBool,
) -> Res<(EmuStats, Box<dyn Device>)> {
    let mut pool = PacketPool::new(&PoolConfig {
        buf_size: 2048,
        count: 16384,
        headroom: DEFAULT_HEADROOM,
        backing: Backing::Anonymous,
    })?;
    let mut far = FaultInjector::with_path(far, cfg, seed);
    let (mut rx, mut to_far, mut to_near) = (Vec::new(), VecDeque::new(), VecDeque::new());
    let mut run = || -> Res<()> {
        while !stop.load(Ordering::Relaxed) {
            let mut got = near.rx_burst(&mut pool, &mut rx, 64)?;
            to_far.extend(rx.drain(..));
            // Also moves on what is due of the frames on their way to B.
            far.tx_burst(&mut pool, &mut to_far)?;
            got += far.rx_burst(&mut pool, &mut rx, 64)?;
            to_near.extend(rx.drain(..));
            if !to_near.is_empty() {
                near.tx_burst(&mut pool, &mut to_near)?;
            }
            if got == 0 {
                // Nothing came in: sleep until the next arrival is due, at most
                // 100 µs (a new frame waits that long at worst; the model
                // timestamps it on arrival, so the bottleneck's rate is kept).
                let wait = far
                    .next_due_in()
                    .unwrap_or(Duration::MAX)
                    .min(Duration::from_micros(100));
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
            }
        }
        Ok(())
    };
    let r = run();
    for b in to_far.drain(..).chain(to_near.drain(..)) {
        pool.free(b);
    }
    far.release_buffers(&mut pool);
    r?;
    let (out, back) = (far.path_stats(false), far.path_stats(true));
    let stats = EmuStats {
        lost: [out.lost, back.lost],
        queue_drops: [out.queue_drops, back.queue_drops],
    };
    Ok((stats, far.into_inner()))
}

/// What the receiver saw: bytes in the measured window (from the first byte, for
/// `seconds` or to EOF if that came first), the window's length, and all bytes.
struct Received {
    window_bytes: u64,
    window_secs: f64,
    total: u64,
}

/// The receiver in namespace B: reads until EOF, measuring the first `window`.
fn receive(l: &StdListener, window: Duration, limit: Duration) -> Res<Received> {
    l.set_nonblocking(false)?;
    let (mut s, _) = {
        let end = Instant::now() + Duration::from_secs(15);
        l.set_nonblocking(true)?;
        loop {
            match l.accept() {
                Ok(c) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > end {
                        return Err("no connection came".into());
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(limit))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    let mut window_end = None;
    loop {
        let k = s.read(&mut buf)?;
        let t = Instant::now();
        let start = *first.get_or_insert(t);
        if window_end.is_none() && (k == 0 || t.duration_since(start) >= window) {
            window_end = Some((total, t.duration_since(start).as_secs_f64()));
        }
        if k == 0 {
            break;
        }
        total += k as u64;
    }
    let (window_bytes, window_secs) = window_end.unwrap_or((total, 0.0));
    Ok(Received {
        window_bytes,
        window_secs,
        total,
    })
}

fn set_linux_cc(s: &StdStream, cc: &str) -> Res<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the option value is `cc`'s bytes, valid for the given length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(format!("TCP_CONGESTION {cc}: {}", std::io::Error::last_os_error()).into());
    }
    Ok(())
}

fn linux_retransmits(s: &StdStream) -> u64 {
    linux_tcp_info(s).map_or(0, |ti| u64::from(ti.tcpi_total_retrans))
}

/// The Linux sender in namespace A: returns (segments retransmitted, bytes sent).
fn linux_send(cc: &str, seconds: f64) -> Res<(u64, u64)> {
    let to: SocketAddr = format!("{RECEIVER}:{PORT}").parse()?;
    let mut s = StdStream::connect_timeout(&to, Duration::from_secs(5))?;
    set_linux_cc(&s, cc)?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let buf = vec![0x5au8; WRITE];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    while Instant::now() < end {
        s.write_all(&buf)?;
        sent += WRITE as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Until the receiver's EOF: everything delivered, retransmissions final.
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut b = [0u8; 64];
    while s.read(&mut b)? > 0 {}
    Ok((linux_retransmits(&s), sent))
}

/// The usnet sender on the shm link: returns (segments retransmitted, bytes sent).
fn usnet_send(link: &str, cc: CcAlgorithm, seconds: f64) -> Res<(u64, u64)> {
    let dev = usnet_link::open(
        &LinkSpec::Shm(link.into()),
        &LinkOptions {
            mtu: Some(1500),
            ..LinkOptions::default()
        },
    )?;
    let caps = dev.caps();
    let mut tcp = StackConfig::default().tcp;
    tcp.congestion = cc;
    // Linux's tcp_wmem (16 KiB, grown with the window, at most 4 MiB).
    tcp.send_buffer = 4 << 20;
    tcp.send_buffer_initial = 16 << 10;
    let stack = Stack::new(StackConfig {
        rx_csum_offload: caps.rx_csum_offload,
        // Complete checksums: the frames end in a kernel behind a TAP, and a shm
        // slot carries no partial checksum's location for it to finish.
        tx_csum_offload: false,
        mac: mac_from_seed(0x3a77),
        mtu: caps.mtu,
        addrs: vec![format!("{USNET_SENDER}/24").parse()?],
        tso: false,
        pool: PoolConfig {
            buf_size: 2048,
            count: 16384,
            headroom: DEFAULT_HEADROOM,
            backing: Backing::Anonymous,
        },
        tx_queue_len: 2048,
        seed: 0x3a77,
        tcp,
        ..StackConfig::default()
    })?;
    let mut d = Driver::new(stack, dev, SystemClock::new());
    d.bind_device()?;
    let to: SocketAddr = format!("{RECEIVER}:{PORT}").parse()?;
    let h = d.stack_mut().tcp_connect(None, to)?;
    let turn = |d: &mut Driver<Box<dyn Device>, SystemClock>| -> Res<()> {
        let t = d.turn()?;
        if t.received == 0 && t.sent == 0 {
            d.wait(Duration::from_millis(1))?;
        }
        Ok(())
    };
    let connect_by = Instant::now() + Duration::from_secs(5);
    loop {
        turn(&mut d)?;
        if let Some(e) = d.stack_mut().tcp_error(h)? {
            return Err(format!("connect: {e}").into());
        }
        if d.stack_mut().readiness(h)?.connected {
            break;
        }
        if Instant::now() > connect_by {
            let c = d.stack().counters_snapshot();
            let nonzero: Vec<String> = c
                .entries()
                .into_iter()
                .filter(|e| e.2 != 0)
                .map(|(n, _, v)| format!("{n}={v}"))
                .collect();
            return Err(format!("connect timed out; stack counters: {}", nonzero.join(" ")).into());
        }
    }
    let buf = vec![0x5au8; WRITE];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    let mut off = 0;
    while Instant::now() < end {
        match d.stack_mut().tcp_send(h, &buf[off..]) {
            Ok(k) => {
                sent += k as u64;
                off = (off + k) % WRITE;
            }
            Err(StackError::WouldBlock) => {}
            Err(e) => return Err(e.into()),
        }
        turn(&mut d)?;
    }
    d.stack_mut().tcp_shutdown_write(h)?;
    let drained_by = Instant::now() + Duration::from_secs(60);
    loop {
        turn(&mut d)?;
        let info = d.stack().tcp_info(h)?;
        if info.send_queued == 0 && info.bytes_in_flight == 0 {
            break;
        }
        if Instant::now() > drained_by {
            return Err("the send queue did not drain".into());
        }
    }
    let rtx = d.stack().tcp_info(h)?.total_retransmits;
    if std::env::var_os("USNET_WAN_DEBUG").is_some() {
        let st = d.stack().tcp_conn_stats(h)?;
        eprintln!("usnet sender: {st:?}");
    }
    let _ = d.stack_mut().tcp_close(h);
    for _ in 0..100 {
        turn(&mut d)?;
    }
    Ok((rtx, sent))
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Run {
    goodput_bps: f64,
    retransmits: u64,
    segments: u64,
    emu: EmuStats,
}

fn one_run(
    o: &WanOptions,
    linux: bool,
    cc: &str,
    tap_a: &mut dyn Device,
    tap_b: &mut Option<Box<dyn Device>>,
    seed: u64,
) -> Res<Run> {
    let stop = AtomicBool::new(false);
    let link = format!("usnet-wan-{}", std::process::id());
    // The emulator's end of the shm link is opened first (it creates the file).
    let mut shm = if linux {
        None
    } else {
        Some(usnet_link::open(
            &LinkSpec::Shm(link.clone()),
            &LinkOptions {
                mtu: Some(1500),
                ..LinkOptions::default()
            },
        )?)
    };
    let cc_algo = CcAlgorithm::from_name(cc).ok_or_else(|| format!("no controller {cc}"))?;
    let limit = Duration::from_secs_f64(o.seconds + 60.0);
    let listener = {
        let h = std::thread::spawn(move || -> Res<StdListener> {
            enter_netns(NS[1]).map_err(|e| e.to_string())?;
            Ok(StdListener::bind(SocketAddr::new(RECEIVER.parse()?, PORT))?)
        });
        h.join().map_err(|_| "receiver setup panicked")??
    };
    let near: &mut dyn Device = match shm.as_mut() {
        Some(s) => s.as_mut(),
        None => tap_a,
    };
    let far = tap_b
        .take()
        .ok_or("the receiver's TAP was lost in an earlier run")?;
    let path = o.path();
    std::thread::scope(|sc| -> Res<Run> {
        let emu = sc.spawn(|| emulate(near, far, path, seed, &stop));
        let window = Duration::from_secs_f64(o.seconds);
        let rx = sc.spawn(move || receive(&listener, window, limit));
        let tx = sc.spawn(|| -> Res<(u64, u64)> {
            if linux {
                enter_netns(NS[0]).map_err(|e| e.to_string())?;
                linux_send(cc, o.seconds + SEND_EXTRA)
            } else {
                usnet_send(&link, cc_algo, o.seconds + SEND_EXTRA)
            }
        });
        let sent = tx.join().map_err(|_| "sender panicked");
        let got = rx.join().map_err(|_| "receiver panicked");
        stop.store(true, Ordering::Relaxed);
        let (emu, far) = emu.join().map_err(|_| "emulator panicked")??;
        *tap_b = Some(far);
        let (rtx, sent) = sent??;
        let got = got??;
        if got.total != sent {
            return Err(format!("sent {sent} bytes, {} arrived", got.total).into());
        }
        Ok(Run {
            goodput_bps: got.window_bytes as f64 * 8.0 / got.window_secs.max(1e-9),
            retransmits: rtx,
            segments: sent.div_ceil(1448),
            emu,
        })
    })
}

/// Runs the comparison: every controller in `o.ccs`, usnet and Linux, `o.runs`
/// times each, interleaved.
pub fn run(o: &WanOptions) -> Res<ExitCode> {
    if !is_root() {
        println!("bench tcp --wan needs root (namespaces and TAP interfaces): skipped");
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::create_dir_all(&o.out)?;
    let ns = Netns::create()?;
    let mut tap_a = usnet_link::open(&LinkSpec::Tap(TAP[0].into()), &LinkOptions::default())?;
    let mut tap_b = Some(usnet_link::open(
        &LinkSpec::Tap(TAP[1].into()),
        &LinkOptions::default(),
    )?);
    ns.place(0, LINUX_SENDER)?;
    ns.place(1, RECEIVER)?;
    let mut results: Vec<(String, bool, Vec<Run>)> = Vec::new();
    for cc in &o.ccs {
        for linux in [false, true] {
            results.push((cc.clone(), linux, Vec::new()));
        }
    }
    println!(
        "path: {} ms RTT, {} Mbit/s, {} % loss each way, {} ms queue; {} s per run",
        o.rtt.as_millis(),
        o.rate_bps / 1_000_000,
        o.loss * 100.0,
        o.queue.as_millis(),
        o.seconds
    );
    for r in 0..o.runs {
        for (i, (cc, linux, runs)) in results.iter_mut().enumerate() {
            let run = one_run(
                o,
                *linux,
                cc,
                tap_a.as_mut(),
                &mut tap_b,
                (r * 16 + i) as u64 + 1,
            )?;
            println!(
                "  run {}: {} {cc}: {:.1} Mbit/s, {} retransmitted",
                r + 1,
                if *linux { "linux" } else { "usnet" },
                run.goodput_bps / 1e6,
                run.retransmits
            );
            runs.push(run);
        }
    }
    let mut table = Table::new(
        "bulk TCP over the emulated path (medians)",
        vec![
            "sender".into(),
            "controller".into(),
            "goodput".into(),
            "vs Linux".into(),
            "retransmitted (segments)".into(),
            "vs Linux".into(),
            "path drops (loss + queue)".into(),
            "retransmitted − dropped".into(),
        ],
    );
    let mut json_rows = Vec::new();
    let mut bars = Vec::new();
    let med =
        |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(&mut rs.iter().map(f).collect::<Vec<_>>());
    for (cc, linux, runs) in &results {
        let g = med(runs, &|r| r.goodput_bps);
        let x = med(runs, &|r| r.retransmits as f64);
        // Retransmitted segments per segment sent, percent.
        let pct = |r: &Run| 100.0 * r.retransmits as f64 / r.segments.max(1) as f64;
        let xp = med(runs, &pct);
        let (lg, lxp) = results
            .iter()
            .find(|(c, l, _)| c == cc && *l)
            .map(|(_, _, rs)| (med(rs, &|r| r.goodput_bps), med(rs, &pct)))
            .unwrap_or((f64::NAN, f64::NAN));
        let who = if *linux { "linux" } else { "usnet" };
        let drops = med(runs, &|r| (r.emu.lost[0] + r.emu.queue_drops[0]) as f64);
        let queue = med(runs, &|r| r.emu.queue_drops[0] as f64);
        // Retransmissions the path's drops do not account for (spurious ones; a
        // dropped frame that was no data makes it negative).
        let excess = med(runs, &|r| {
            r.retransmits as f64 - (r.emu.lost[0] + r.emu.queue_drops[0]) as f64
        });
        table.row(vec![
            who.into(),
            cc.clone(),
            format!("{:.1} Mbit/s", g / 1e6),
            if *linux {
                "1.00×".into()
            } else {
                format!("{:.2}×", g / lg)
            },
            format!("{xp:.2} % ({x:.0})"),
            if *linux {
                "1.00×".into()
            } else {
                format!("{:.2}×", xp / lxp)
            },
            format!("{drops:.0} ({queue:.0} at the queue)"),
            format!("{excess:+.0}"),
        ]);
        let bar = Bar::new(
            format!("{who} {cc}"),
            runs.iter().map(|r| r.goodput_bps).collect(),
        );
        bars.push(if *linux { bar } else { bar.against(lg) });
        json_rows.push(json!({
            "sender": who,
            "cc": cc,
            "goodput_bps": runs.iter().map(|r| r.goodput_bps).collect::<Vec<_>>(),
            "retransmits": runs.iter().map(|r| r.retransmits).collect::<Vec<_>>(),
            "segments_sent": runs.iter().map(|r| r.segments).collect::<Vec<_>>(),
            "median_retransmit_percent": xp,
            "retransmit_percent_vs_linux": xp / lxp,
            "path_lost": runs.iter().map(|r| r.emu.lost[0]).collect::<Vec<_>>(),
            "path_queue_drops": runs.iter().map(|r| r.emu.queue_drops[0]).collect::<Vec<_>>(),
            "median_retransmits_beyond_drops": excess,
            "median_goodput_bps": g,
            "goodput_vs_linux": g / lg,
        }));
    }
    table.print();
    let md = format!(
        "path: {} ms RTT, {} Mbit/s, {} % loss each way, {} ms queue\n\n{}",
        o.rtt.as_millis(),
        o.rate_bps / 1_000_000,
        o.loss * 100.0,
        o.queue.as_millis(),
        table.to_markdown()
    );
    std::fs::write(o.out.join("wan.md"), md)?;
    let v: Value = json!({
        "rtt_ms": o.rtt.as_secs_f64() * 1e3,
        "rate_bps": o.rate_bps,
        "loss": o.loss,
        "queue_ms": o.queue.as_secs_f64() * 1e3,
        "seconds": o.seconds,
        "rows": json_rows,
    });
    write_json(&o.out.join("wan.json"), &v)?;
    bar_plot_runs(
        &o.out.join("wan.png"),
        &format!(
            "bulk TCP, {} ms / {} Mbit/s / {} % loss (median)",
            o.rtt.as_millis(),
            o.rate_bps / 1_000_000,
            o.loss * 100.0
        ),
        "goodput, bit/s (median, min–max)",
        &bars,
    )?;
    drop((tap_a, tap_b));
    drop(ns);
    Ok(ExitCode::SUCCESS)
}
