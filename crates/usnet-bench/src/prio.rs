//! `usnet bench prio`: the source document's experiment on priority-aware receive
//! (MISSION.md part 4, docs/priority.md). A sender bursts N UDP datagrams (50,000)
//! round robin to several receivers (4), one of them Q with a better nice value,
//! while busy threads load every core, so the receivers and the stack fall behind.
//! Four configurations of the receiving usnet stack — baseline, forced drop,
//! priority control, both — and the same workload on the Linux kernel's UDP over
//! loopback for contrast. Per receiver: datagrams received and drop 2 (its socket
//! queue was full); for the stack: drop 1 (input queue full) and forced drops;
//! totals; ratios against the baseline as in the document's table. Medians of
//! several runs; table, JSON and plot.
//!
//! usnet runs in this process over a shm link without root: the receiving stack is
//! the in-process runtime (its poll thread in kernel-like backlog mode, so the input
//! queue holds the backlog and drop 1 is the stack's), the receivers are threads
//! (nice values and boosts are per thread on Linux), the sender is a second usnet
//! stack driven from its own thread. Priority control needs CAP_SYS_NICE; without
//! it those configurations are skipped with one line.

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use usnet_driver::sched::{can_boost, gettid, SchedHook, Setpriority};
use usnet_driver::{Driver, SystemClock};
use usnet_link::shm::{ShmConfig, ShmDevice};
use usnet_link::{Device, LinkOptions, LinkSpec};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{bar_plot, median, write_json, Table};
use usnet_runtime::{NetStack, RuntimeConfig, UdpSocket};
use usnet_stack::{mac_from_seed, RxPolicy, Stack, StackConfig, StackError};

use crate::join_within;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Options of `usnet bench prio` (the CLI owns the flags).
#[derive(Debug, Clone)]
pub struct PrioBenchOptions {
    /// Directory for prio.json, prio.md and the plots.
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    pub runs: usize,
    /// Datagrams the sender bursts per run.
    pub datagrams: u64,
    pub receivers: usize,
    /// Payload bytes per datagram.
    pub size: usize,
    /// Busy threads that load the cores during a run (0: one per CPU).
    pub load: usize,
    /// Microseconds of work a receiver does per datagram.
    pub work_us: u64,
    /// Nice values of Q and of the other receivers.
    pub q_nice: i32,
    pub other_nice: i32,
    /// The receiving stack's policy knobs (n, probability, boost...), mechanisms off.
    pub policy: RxPolicy,
    pub input_queue: usize,
    /// Frames the receiving stack processes per turn (its softirq budget).
    pub rx_budget: usize,
    /// Datagrams per second the sender keeps to (0: as fast as it can), as a
    /// sender on a wire would.
    pub rate: u64,
    /// Receivers take up to 64 queued datagrams per call (one lock of the
    /// runtime), as recvmmsg does, instead of one per recv_from.
    pub batch: bool,
    /// One short run per configuration.
    pub quick: bool,
    /// Skip the Linux contrast.
    pub no_linux: bool,
    /// As root, also the four configurations with Linux bursting through a TAP.
    pub tap: bool,
    /// The receivers are threads of an in-process runtime instead of client
    /// processes of a stack server.
    pub threads: bool,
    /// The nice value of the stack server's loop and of the sender's thread, so
    /// that protocol work has the precedence over the receivers and the load that
    /// the kernel's softirq has, and the burst (another machine's) is not slowed by
    /// this one's load. None (or no right to lower a nice value): inherited.
    pub stack_nice: Option<i32>,
}

impl Default for PrioBenchOptions {
    fn default() -> Self {
        PrioBenchOptions {
            out: PathBuf::from("bench-out/prio"),
            runs: 5,
            datagrams: 50_000,
            receivers: 4,
            size: 512,
            load: 0,
            work_us: 10,
            q_nice: 0,
            other_nice: 5,
            policy: RxPolicy::default(),
            input_queue: 1000,
            rx_budget: 64,
            rate: 200_000,
            batch: false,
            quick: false,
            no_linux: false,
            tap: false,
            threads: false,
            stack_nice: Some(-10),
        }
    }
}

const BASE_PORT: u16 = 9001;
const ADDR: [&str; 2] = ["10.77.0.1", "10.77.0.2"];
const TAP_HOST: &str = "10.78.0.1";
const TAP_USNET: &str = "10.78.0.2";
/// A receiver stops once the burst is over and its socket stayed empty this long.
const QUIET: Duration = Duration::from_millis(100);
/// No run takes longer than this.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// What the receiving side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mech {
    Baseline,
    ForcedDrop,
    Priority,
    Both,
    /// The Linux kernel's UDP over loopback instead of usnet.
    Linux,
}

impl Mech {
    fn policy(self, base: &RxPolicy) -> RxPolicy {
        RxPolicy {
            forced_drop: matches!(self, Mech::ForcedDrop | Mech::Both),
            priority: matches!(self, Mech::Priority | Mech::Both),
            ..base.clone()
        }
    }
}

/// One configuration: the mechanisms, and whether the burst comes from Linux
/// through a TAP (root) instead of a usnet stack over the shm link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    mech: Mech,
    tap: bool,
}

impl Config {
    fn name(self) -> String {
        let m = match self.mech {
            Mech::Baseline => "usnet baseline",
            Mech::ForcedDrop => "usnet forced drop",
            Mech::Priority => "usnet priority control",
            Mech::Both => "usnet both",
            Mech::Linux => return "Linux (loopback)".into(),
        };
        if self.tap {
            format!("{m}, TAP")
        } else {
            format!("{m}, shm")
        }
    }
    fn key(self) -> String {
        let m = match self.mech {
            Mech::Baseline => "baseline",
            Mech::ForcedDrop => "forced_drop",
            Mech::Priority => "priority",
            Mech::Both => "both",
            Mech::Linux => return "linux".into(),
        };
        format!("{}_{m}", if self.tap { "tap" } else { "shm" })
    }
}

/// One run's figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Run {
    sent: u64,
    /// Per receiver (Q first): received, drop 2.
    received: Vec<u64>,
    drop2: Vec<u64>,
    drop1: u64,
    forced: u64,
    boosts: u64,
    /// Boosts that ended because the queue drained (the rest ran out of time or
    /// ended with the run).
    drained: u64,
    /// Sent but neither received nor counted as a drop by the receiving side (a
    /// TAP's kernel queue, say); per run, since medians of parts do not add up.
    lost: u64,
    seconds: f64,
}

impl Run {
    fn account(mut self) -> Run {
        self.lost = self
            .sent
            .saturating_sub(self.total_received() + self.total_drops());
        self
    }
    fn total_received(&self) -> u64 {
        self.received.iter().sum()
    }
    fn total_drops(&self) -> u64 {
        self.drop1 + self.forced + self.drop2.iter().sum::<u64>()
    }
}

/// Spins on every core until `stop`.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(n: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for i in 0..1000u64 {
                            x = x.wrapping_mul(31).wrapping_add(i);
                        }
                        std::hint::black_box(x);
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = join_within(t, Duration::from_secs(5));
        }
    }
}

/// A receiver's work on one datagram.
fn work(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

fn set_own_nice(nice: i32) {
    // Raising a nice value needs no privilege; lowering it does (Q's may stay).
    let _ = Setpriority.set(gettid(), nice);
}

/// Runs `f` with this thread at `nice` (if given and allowed), then puts it back.
fn with_nice<R>(nice: Option<i32>, f: impl FnOnce() -> R) -> R {
    let Some(nice) = nice else {
        return f();
    };
    let own = usnet_driver::sched::nice_of(gettid()).unwrap_or(0);
    set_own_nice(nice);
    let r = f();
    set_own_nice(own);
    r
}

fn pool(count: u32) -> PoolConfig {
    PoolConfig {
        buf_size: 2048,
        count,
        headroom: DEFAULT_HEADROOM,
        backing: Backing::Anonymous,
    }
}

/// The receiving stack's configuration for `cfg`.
fn rx_stack_config(o: &PrioBenchOptions, cfg: Config, rx_ip: &str) -> Res<StackConfig> {
    Ok(StackConfig {
        mac: mac_from_seed(2),
        addrs: vec![format!("{rx_ip}/24").parse()?],
        pool: pool(16384),
        input_queue_len: o.input_queue,
        rx_budget: o.rx_budget,
        rx_policy: cfg.mech.policy(&o.policy),
        seed: 2,
        ..StackConfig::default()
    })
}

/// The receiving stack's device, the sender and the receiving address: a shm link
/// with a second usnet stack bursting, or (`cfg.tap`) a TAP with Linux bursting.
fn link(
    o: &PrioBenchOptions,
    cfg: Config,
    tag: &str,
) -> Res<(Box<dyn Device>, Sender, &'static str)> {
    Ok(if cfg.tap {
        let ifname = format!("uprio{}", std::process::id() % 100_000);
        let dev = usnet_link::open(
            &LinkSpec::Tap(ifname),
            &LinkOptions {
                tap_host_addrs: vec![format!("{TAP_HOST}/24")],
                ..LinkOptions::default()
            },
        )?;
        (dev, Sender::Linux(StdUdp::bind((TAP_HOST, 0))?), TAP_USNET)
    } else {
        let link = format!("prio-{}-{tag}", std::process::id());
        let shm = ShmConfig {
            // Room for a backlog larger than the input queue: the ring must not be
            // where the burst waits, or the stack would never see drop 1.
            slots: Some((o.input_queue * 4).next_power_of_two()),
            ..ShmConfig::default()
        };
        let rx_dev = ShmDevice::open(&link, &shm)?;
        let tx_dev = ShmDevice::open(&link, &shm)?;
        let tx_stack = Stack::new(StackConfig {
            mac: mac_from_seed(1),
            addrs: vec![format!("{}/24", ADDR[0]).parse()?],
            pool: pool(8192),
            seed: 1,
            ..StackConfig::default()
        })?;
        let mut tx = Driver::new(tx_stack, tx_dev, SystemClock::new());
        tx.set_burst(64);
        (Box::new(rx_dev), Sender::Usnet(Box::new(tx)), ADDR[1])
    })
}

/// The document's experiment on usnet, once, with the receivers as threads of the
/// in-process runtime.
fn usnet_run(o: &PrioBenchOptions, cfg: Config, tag: &str) -> Res<Run> {
    let (rx_dev, mut sender, rx_ip) = link(o, cfg, tag)?;
    let net = NetStack::start(
        rx_dev,
        rx_stack_config(o, cfg, rx_ip)?,
        RuntimeConfig {
            backlog: true,
            ..RuntimeConfig::default()
        },
    )?;
    let rx_ip: std::net::IpAddr = rx_ip.parse()?;

    let n = o.receivers.max(1);
    let burst_over = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for i in 0..n {
        let net = net.clone();
        let (burst_over, ready) = (burst_over.clone(), ready.clone());
        let nice = if i == 0 { o.q_nice } else { o.other_nice };
        let (work_us, batch) = (o.work_us, o.batch);
        handles.push(std::thread::spawn(move || -> Result<(u64, u64), String> {
            set_own_nice(nice);
            let setup = || -> std::io::Result<UdpSocket> {
                let mut sock = UdpSocket::bind(&net, SocketAddr::new(rx_ip, BASE_PORT + i as u16))?;
                // The socket ranks by this thread's nice value; boosts come here.
                sock.set_consumer_thread()?;
                sock.set_read_timeout(Some(QUIET));
                Ok(sock)
            };
            let sock = setup();
            ready.fetch_add(1, Ordering::AcqRel);
            let sock = sock.map_err(|e| e.to_string())?;
            let h = sock.handle();
            let mut buf = vec![0u8; 2048];
            let mut got = 0u64;
            let end = Instant::now() + RUN_LIMIT;
            while Instant::now() < end {
                let n = if batch {
                    // recvmmsg-like: one lock for up to 64 datagrams, the work after.
                    net.with(|s| {
                        let mut n = 0;
                        while n < 64 && s.udp_recv_from(h, &mut buf).is_ok() {
                            n += 1;
                        }
                        n
                    })
                } else {
                    usize::from(sock.recv_from(&mut buf).is_ok())
                };
                if n == 0 {
                    if burst_over.load(Ordering::Acquire) {
                        break;
                    }
                    if batch {
                        net.wait_readable(&[h], Some(QUIET));
                    }
                    continue;
                }
                got += n as u64;
                for _ in 0..n {
                    work(work_us);
                }
            }
            let drop2 = net
                .with(|s| s.socket_stats(h))
                .map_err(|e| format!("{e:?}"))?
                .rx_queue_full;
            Ok((got, drop2))
        }));
    }
    wait_ready(&ready, n)?;
    let load = Load::start(if o.load == 0 { crate::cpus() } else { o.load });
    let t0 = Instant::now();
    let sent = match with_nice(o.stack_nice, || sender.burst(o, n, rx_ip)) {
        Ok(s) => s,
        Err(e) => {
            // Let the receivers go before reporting.
            burst_over.store(true, Ordering::Release);
            net.shutdown();
            return Err(e);
        }
    };
    // The burst is over once the receiving stack has worked through its input.
    let end = Instant::now() + RUN_LIMIT;
    while net.with(|s| s.input_len()) > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut run = end_run(&burst_over, handles, sent, t0)?;
    drop(load);
    let c = net.with(|s| s.counters().clone());
    run.drop1 = c.drop_input_queue_full;
    run.forced = c.prio_forced_drop_drop1 + c.prio_forced_drop_threshold;
    run.boosts = c.prio_boosts;
    run.drained = c.prio_restores_drained;
    net.shutdown();
    Ok(run)
}

/// What a receiving client process of [`server_run`] does (a benchmark peer).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ReceiverOptions {
    /// The stack server to attach to.
    pub stack: String,
    pub bind: SocketAddr,
    /// Its nice value, set before it attaches (the server ranks it by that).
    pub nice: i32,
    pub work_us: u64,
    /// Created by the bench when the burst is over: the receiver stops at its next
    /// quiet moment.
    pub stop_file: PathBuf,
}

/// A receiving client process: attaches, binds, says it is ready, then reads and
/// works until the burst is over. It reads on its main thread, whose id is the
/// process id: that is the thread a boost of the process (setpriority on the pid)
/// reaches.
pub fn run_receiver(o: &ReceiverOptions) -> Res<std::process::ExitCode> {
    set_own_nice(o.nice);
    let client = usnet_client::Client::attach(&o.stack)?;
    let sock = usnet_client::UdpSocket::bind(&client, o.bind)?;
    sock.set_read_timeout(Some(QUIET))?;
    println!("{}", json!({"ready": true}));
    let mut buf = vec![0u8; 2048];
    let got = receive_burst(
        o.work_us,
        || sock.recv_from(&mut buf).map(drop),
        || o.stop_file.exists(),
    )?;
    println!("{}", json!({"received": got}));
    Ok(std::process::ExitCode::SUCCESS)
}

/// A receiver's loop: takes a datagram with `recv` (which times out after a quiet
/// moment) and works on it, until a read times out once the burst is `over()`, or
/// the run's limit. Returns the datagrams received.
fn receive_burst(
    work_us: u64,
    mut recv: impl FnMut() -> std::io::Result<()>,
    over: impl Fn() -> bool,
) -> std::io::Result<u64> {
    let mut got = 0u64;
    let end = Instant::now() + RUN_LIMIT;
    while Instant::now() < end {
        match recv() {
            Ok(()) => {
                got += 1;
                work(work_us);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if over() {
                    break;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The document's experiment on usnet, once, as the document ran it: the
/// receiving stack is a stack server (in this process, its own loop thread) and
/// the receivers are client processes, each reading its sockets' shared-memory
/// rings without a lock shared with the others. A boost raises a whole client
/// process, as the document raises a process.
fn server_run(o: &PrioBenchOptions, cfg: Config, tag: &str) -> Res<Run> {
    use crate::peer::{Peer, PeerSpec, PEER_READY};
    let (rx_dev, mut sender, rx_ip) = link(o, cfg, tag)?;
    let name = format!("prio-{}-{tag}", std::process::id());
    let mut stack_cfg = rx_stack_config(o, cfg, rx_ip)?;
    // Checksum and segmentation offloads as the device has them (a TAP's frames
    // carry partial checksums), as `usnet up` does.
    usnet_driver::fit_to_device(&mut stack_cfg, rx_dev.caps());
    let stack = Stack::new(stack_cfg)?;
    let mut server = usnet_server::ServerHandle::start(
        stack,
        rx_dev,
        usnet_server::ServerConfig {
            name: name.clone(),
            link: if cfg.tap { "tap" } else { "shm" }.into(),
            backlog: true,
            loop_nice: o.stack_nice,
            ..usnet_server::ServerConfig::default()
        },
    )?;
    let stop_file = std::env::temp_dir().join(format!("{name}.over"));
    let _ = std::fs::remove_file(&stop_file);
    let rx_ip: std::net::IpAddr = rx_ip.parse()?;
    let n = o.receivers.max(1);
    let result = (|| -> Res<Run> {
        let mut peers = Vec::new();
        for i in 0..n {
            let spec = PeerSpec::PrioReceiver(ReceiverOptions {
                stack: name.clone(),
                bind: SocketAddr::new(rx_ip, BASE_PORT + i as u16),
                nice: if i == 0 { o.q_nice } else { o.other_nice },
                work_us: o.work_us,
                stop_file: stop_file.clone(),
            });
            peers.push(Peer::spawn(&spec)?);
        }
        for p in &mut peers {
            p.read(PEER_READY)?;
        }
        let calls = Duration::from_secs(5);
        let load = Load::start(if o.load == 0 { crate::cpus() } else { o.load });
        let t0 = Instant::now();
        let sent = with_nice(o.stack_nice, || sender.burst(o, n, rx_ip))?;
        let end = Instant::now() + RUN_LIMIT;
        while server
            .call(calls, |lp| lp.stack().input_len())
            .is_some_and(|l| l > 0)
            && Instant::now() < end
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(QUIET);
        // Drop 2 is final now (nothing arrives any more); read it while the
        // receivers still hold their sockets.
        let (c, socks) = server
            .call(calls, |lp| {
                let s = lp.stack();
                (s.counters().clone(), s.udp_sockets())
            })
            .ok_or("the stack server did not answer")?;
        std::fs::write(&stop_file, b"")?;
        let mut run = Run {
            sent,
            ..Run::default()
        };
        for (i, p) in peers.iter_mut().enumerate() {
            let v = p.read(RUN_LIMIT)?;
            run.received.push(
                v["received"]
                    .as_u64()
                    .ok_or("a receiver's report has no count")?,
            );
            let port = BASE_PORT + i as u16;
            run.drop2.push(
                socks
                    .iter()
                    .filter(|u| u.local.port() == port)
                    .map(|u| u.stats.rx_queue_full)
                    .sum(),
            );
        }
        run.seconds = t0.elapsed().as_secs_f64();
        drop(load);
        for p in peers {
            p.finish(Duration::from_secs(10))?;
        }
        run.drop1 = c.drop_input_queue_full;
        run.forced = c.prio_forced_drop_drop1 + c.prio_forced_drop_threshold;
        run.boosts = c.prio_boosts;
        run.drained = c.prio_restores_drained;
        Ok(run)
    })();
    let _ = std::fs::remove_file(&stop_file);
    server.shutdown()?;
    result
}

/// Keeps a sender to `rate` datagrams per second: sleeps until datagram `sent`
/// is due (a sender on another machine does not take this one's CPU meanwhile).
struct Pacer {
    start: Instant,
    rate: u64,
}

impl Pacer {
    fn new(rate: u64) -> Pacer {
        Pacer {
            start: Instant::now(),
            rate,
        }
    }
    fn wait(&self, sent: u64) {
        if self.rate == 0 {
            return;
        }
        let due = self.start + Duration::from_secs_f64(sent as f64 / self.rate as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}

/// Waits (at most 10 s) until `n` receivers have set up.
/// The burst is over: lets the receivers finish after a quiet moment and collects
/// what each received and dropped (Q first).
fn end_run(
    burst_over: &AtomicBool,
    handles: Vec<std::thread::JoinHandle<Result<(u64, u64), String>>>,
    sent: u64,
    t0: Instant,
) -> Res<Run> {
    std::thread::sleep(QUIET);
    burst_over.store(true, Ordering::Release);
    let mut run = Run {
        sent,
        ..Run::default()
    };
    for h in handles {
        let (got, drop2) = join_within(h, RUN_LIMIT + Duration::from_secs(5))??;
        run.received.push(got);
        run.drop2.push(drop2);
    }
    run.seconds = t0.elapsed().as_secs_f64();
    Ok(run)
}

fn wait_ready(ready: &AtomicUsize, n: usize) -> Res<()> {
    let end = Instant::now() + Duration::from_secs(10);
    while ready.load(Ordering::Acquire) < n {
        if Instant::now() > end {
            return Err("the receivers did not start".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Who bursts at the usnet receiver: a second usnet stack over the shm link, or
/// Linux's UDP through the TAP.
enum Sender {
    Usnet(Box<Driver<ShmDevice>>),
    Linux(StdUdp),
}

impl Sender {
    /// Resolves the receiver, then sends `o.datagrams` round robin to the
    /// receivers' ports as fast as the sender can. Returns how many were sent.
    fn burst(&mut self, o: &PrioBenchOptions, n: usize, dst: std::net::IpAddr) -> Res<u64> {
        match self {
            Sender::Usnet(tx) => usnet_burst(tx, o, n, dst),
            Sender::Linux(sock) => {
                // The kernel resolves the stack's MAC (frames beyond its small
                // unresolved queue would be lost): one datagram, then a pause.
                sock.send_to(b"resolve", (dst, 9))?;
                std::thread::sleep(Duration::from_millis(300));
                let payload = vec![0x5au8; o.size];
                let mut sent = 0;
                let pace = Pacer::new(o.rate);
                for k in 0..o.datagrams {
                    if k % 64 == 0 {
                        pace.wait(k);
                    }
                    let port = BASE_PORT + (k % n as u64) as u16;
                    if sock.send_to(&payload, (dst, port)).is_ok() {
                        sent += 1;
                    }
                }
                Ok(sent)
            }
        }
    }
}

/// The usnet sender: a full ring pushes back, so nothing is lost on the wire.
fn usnet_burst(
    tx: &mut Driver<ShmDevice>,
    o: &PrioBenchOptions,
    n: usize,
    dst_ip: std::net::IpAddr,
) -> Res<u64> {
    let sock = tx.stack_mut().udp_bind("0.0.0.0:0".parse()?)?;
    let ping = tx.stack_mut().ping_open();
    let t0 = Instant::now();
    let mut next_ping = t0;
    let mut seq = 0;
    while tx.stack_mut().ping_recv(ping).is_err() {
        if Instant::now() >= next_ping {
            seq += 1;
            tx.stack_mut().ping_send(ping, dst_ip, seq, b"resolve")?;
            next_ping = Instant::now() + Duration::from_millis(100);
        }
        tx.turn()?;
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("the receiving stack did not answer".into());
        }
    }
    let payload = vec![0x5au8; o.size];
    let mut sent = 0u64;
    let end = Instant::now() + RUN_LIMIT;
    let pace = Pacer::new(o.rate);
    while sent < o.datagrams && Instant::now() < end {
        pace.wait(sent);
        let s = tx.stack_mut();
        for _ in 0..64 {
            if sent == o.datagrams {
                break;
            }
            let port = BASE_PORT + (sent % n as u64) as u16;
            match s.udp_send_to(sock, &payload, SocketAddr::new(dst_ip, port)) {
                Ok(_) => sent += 1,
                Err(StackError::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        tx.turn()?;
    }
    while tx.stack().tx_len() > 0 && Instant::now() < end {
        tx.turn()?;
        std::thread::yield_now();
    }
    Ok(sent)
}

/// The same workload on Linux: kernel UDP sockets on loopback. Drop 2 is each
/// socket's `drops` in /proc/net/udp; drop 1 the backlog drops in
/// /proc/net/softnet_stat.
fn linux_run(o: &PrioBenchOptions) -> Res<Run> {
    let n = o.receivers.max(1);
    let socks: Vec<StdUdp> = (0..n)
        .map(|_| StdUdp::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let ports: Vec<u16> = socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?;
    let burst_over = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicUsize::new(0));
    let drop1_before = softnet_dropped();
    let mut handles = Vec::new();
    for (i, sock) in socks.into_iter().enumerate() {
        let (burst_over, ready) = (burst_over.clone(), ready.clone());
        let nice = if i == 0 { o.q_nice } else { o.other_nice };
        let work_us = o.work_us;
        handles.push(std::thread::spawn(move || -> Result<(u64, u64), String> {
            set_own_nice(nice);
            ready.fetch_add(1, Ordering::AcqRel);
            sock.set_read_timeout(Some(QUIET))
                .map_err(|e| e.to_string())?;
            let port = sock.local_addr().map_err(|e| e.to_string())?.port();
            let mut buf = vec![0u8; 2048];
            let got = receive_burst(
                work_us,
                || sock.recv_from(&mut buf).map(drop),
                || burst_over.load(Ordering::Acquire),
            )
            .map_err(|e| e.to_string())?;
            Ok((got, udp_drops(port).unwrap_or(0)))
        }));
    }
    wait_ready(&ready, n)?;
    let load = Load::start(if o.load == 0 { crate::cpus() } else { o.load });
    let t0 = Instant::now();
    let tx = StdUdp::bind("127.0.0.1:0")?;
    let payload = vec![0x5au8; o.size];
    // On loopback the sender's own system call does the receive side's protocol
    // work (softirq in its context): at the stack's nice value, as for usnet.
    let sent = with_nice(o.stack_nice, || {
        let mut sent = 0;
        let pace = Pacer::new(o.rate);
        for k in 0..o.datagrams {
            if k % 64 == 0 {
                pace.wait(k);
            }
            let port = ports[(k % n as u64) as usize];
            if tx.send_to(&payload, ("127.0.0.1", port)).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    let mut run = end_run(&burst_over, handles, sent, t0)?;
    drop(load);
    run.drop1 = softnet_dropped().saturating_sub(drop1_before);
    Ok(run)
}

/// The `drops` column of the IPv4 UDP socket bound to `port` on loopback.
fn udp_drops(port: u16) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/udp").ok()?;
    let want = format!("0100007F:{port:04X}");
    text.lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// Frames dropped at the kernel's backlog (all CPUs): its drop 1.
fn softnet_dropped() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .map(|t| {
            t.lines()
                .filter_map(|l| l.split_whitespace().nth(1))
                .filter_map(|v| u64::from_str_radix(v, 16).ok())
                .sum()
        })
        .unwrap_or(0)
}

/// Medians over runs of every figure.
fn medians(runs: &[Run]) -> Run {
    let m = |f: &dyn Fn(&Run) -> u64| {
        let mut v: Vec<f64> = runs.iter().map(|r| f(r) as f64).collect();
        median(&mut v).round() as u64
    };
    let n = runs.first().map_or(0, |r| r.received.len());
    Run {
        sent: m(&|r| r.sent),
        received: (0..n).map(|i| m(&|r| r.received[i])).collect(),
        drop2: (0..n).map(|i| m(&|r| r.drop2[i])).collect(),
        drop1: m(&|r| r.drop1),
        forced: m(&|r| r.forced),
        boosts: m(&|r| r.boosts),
        drained: m(&|r| r.drained),
        lost: m(&|r| r.lost),
        seconds: {
            let mut v: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
            median(&mut v)
        },
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.3}×", a / b)
    } else if a == 0.0 {
        "=".into()
    } else {
        "-".into()
    }
}

/// `usnet bench prio`.
pub fn run(o: &PrioBenchOptions) -> Res<std::process::ExitCode> {
    crate::check_min("runs", o.runs as u64, 1)?;
    crate::check_min("datagrams", o.datagrams, 1)?;
    crate::check_min("receivers", o.receivers as u64, 1)?;
    crate::check_min("size", o.size as u64, 1)?;
    let mut o = o.clone();
    if o.quick {
        o.runs = 1;
        o.datagrams = o.datagrams.min(10_000);
    }
    let mut mechs = vec![Mech::Baseline, Mech::ForcedDrop];
    match can_boost() {
        Ok(()) => mechs.extend([Mech::Priority, Mech::Both]),
        Err(why) => {
            println!("usnet bench prio: {why}; its configurations are skipped");
            if o.stack_nice.is_some_and(|n| n < 0) {
                println!(
                    "usnet bench prio: the stack and the sender keep the nice value they have"
                );
                o.stack_nice = None;
            }
        }
    }
    let mut configs: Vec<Config> = mechs
        .iter()
        .map(|&mech| Config { mech, tap: false })
        .collect();
    if o.tap {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            configs.extend(mechs.iter().map(|&mech| Config { mech, tap: true }));
        } else {
            println!("usnet bench prio: the TAP configurations need root; skipped");
        }
    }
    if !o.no_linux {
        configs.push(Config {
            mech: Mech::Linux,
            tap: false,
        });
    }
    println!(
        "usnet bench prio: {} datagrams of {} B at {} /s to {} receivers ({}; Q nice {}, others {}), {} µs of work each, {} load threads, stack and sender at nice {}, interval {} ms, {} run(s) per configuration",
        o.datagrams,
        o.size,
        if o.rate == 0 { "max".to_string() } else { o.rate.to_string() },
        o.receivers,
        if o.threads {
            "threads of an in-process runtime"
        } else {
            "client processes of a stack server"
        },
        o.q_nice,
        o.other_nice,
        o.work_us,
        if o.load == 0 { crate::cpus() } else { o.load },
        o.stack_nice.map_or("(inherited)".to_string(), |n| n.to_string()),
        o.policy.interval.as_millis(),
        o.runs
    );
    let mut results: Vec<(Config, Vec<Run>, Run)> = Vec::new();
    for &c in &configs {
        let mut runs = Vec::new();
        for r in 0..o.runs {
            let run = match c.mech {
                Mech::Linux => linux_run(&o)?,
                _ if o.threads => usnet_run(&o, c, &format!("{}-{r}", c.key()))?,
                _ => server_run(&o, c, &format!("{}-{r}", c.key()))?,
            }
            .account();
            println!(
                "  {:<30} run {}: Q {} received / {} drop 2; all {} received; drop 1 {}, forced {}, boosts {} ({} ended by a drained queue)",
                c.name(),
                r + 1,
                run.received[0],
                run.drop2[0],
                run.total_received(),
                run.drop1,
                run.forced,
                run.boosts,
                run.drained
            );
            runs.push(run);
        }
        let med = medians(&runs);
        results.push((c, runs, med));
    }
    // Ratios against the baseline on the same path.
    let base_of = |tap: bool| {
        results
            .iter()
            .find(|r| {
                r.0 == Config {
                    mech: Mech::Baseline,
                    tap,
                }
            })
            .map(|r| r.2.clone())
    };
    let mut t = Table::new(
        format!(
            "priority-aware receive: {} datagrams to {} receivers, medians of {}",
            o.datagrams, o.receivers, o.runs
        ),
        [
            "configuration",
            "Q received",
            "Q drop 2",
            "others received",
            "others drop 2",
            "drop 1",
            "forced",
            "total received",
            "total drops",
            "lost elsewhere",
            "Q drop 2 ×",
            "Q received ×",
            "total drops ×",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut json_rows = Vec::new();
    for (c, runs, m) in &results {
        let others_recv: u64 = m.received[1..].iter().sum();
        let others_drop2: u64 = m.drop2[1..].iter().sum();
        let base = base_of(c.tap).filter(|_| c.mech != Mech::Linux);
        let vs =
            |f: &dyn Fn(&Run) -> f64| base.as_ref().map_or("-".to_string(), |b| ratio(f(m), f(b)));
        t.row(vec![
            c.name(),
            m.received[0].to_string(),
            m.drop2[0].to_string(),
            others_recv.to_string(),
            others_drop2.to_string(),
            m.drop1.to_string(),
            if c.mech == Mech::Linux {
                "-".into()
            } else {
                m.forced.to_string()
            },
            m.total_received().to_string(),
            m.total_drops().to_string(),
            m.lost.to_string(),
            vs(&|r| r.drop2[0] as f64),
            vs(&|r| r.received[0] as f64),
            vs(&|r| r.total_drops() as f64),
        ]);
        json_rows.push(json!({
            "configuration": c.key(),
            "name": c.name(),
            "median": m,
            "runs": runs,
        }));
    }
    t.print();
    std::fs::create_dir_all(&o.out)?;
    let doc = json!({
        "bench": "prio",
        "datagrams": o.datagrams,
        "receivers": o.receivers,
        "size": o.size,
        "work_us": o.work_us,
        "q_nice": o.q_nice,
        "other_nice": o.other_nice,
        "input_queue": o.input_queue,
        "rx_budget": o.rx_budget,
        "rate": o.rate,
        "batch": o.batch,
        "receivers_as": if o.threads { "threads" } else { "processes" },
        "stack_nice": o.stack_nice,
        "load": if o.load == 0 { crate::cpus() } else { o.load },
        "drain_quiet_ms": o.policy.drain_quiet.as_millis() as u64,
        "interval_ms": o.policy.interval.as_millis() as u64,
        "set_size": o.policy.set_size,
        "drop_probability": o.policy.drop_probability,
        "boost": o.policy.boost,
        "runs": o.runs,
        "results": json_rows,
        "document": {"q_drop2": {"forced_drop": 0.543, "priority": 0.837, "both": 0.397},
                     "q_received": {"forced_drop": 1.24, "priority": 1.12, "both": 1.26}},
    });
    write_json(&o.out.join("prio.json"), &doc)?;
    std::fs::write(o.out.join("prio.md"), t.to_markdown())?;
    let bars = |f: &dyn Fn(&Run) -> u64| -> Vec<(String, f64)> {
        results
            .iter()
            .map(|(c, _, m)| (c.name().replace("usnet ", ""), f(m) as f64))
            .collect()
    };
    bar_plot(
        &o.out.join("prio-q-received.png"),
        "datagrams received by Q (median)",
        "datagrams",
        &bars(&|m| m.received[0]),
    )?;
    bar_plot(
        &o.out.join("prio-q-drop2.png"),
        "Q's drop 2: its socket queue full (median)",
        "datagrams",
        &bars(&|m| m.drop2[0]),
    )?;
    println!(
        "usnet bench prio: wrote {}/prio.json, prio.md, prio-q-received.png, prio-q-drop2.png",
        o.out.display()
    );
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        let r = |q: u64, d: u64| Run {
            sent: 10,
            received: vec![q, 1],
            drop2: vec![d, 0],
            drop1: 2,
            forced: 0,
            boosts: 0,
            drained: 0,
            lost: 0,
            seconds: 1.0,
        };
        let m = medians(&[r(5, 1), r(9, 3), r(7, 2)].map(Run::account));
        assert_eq!(m.lost, 0, "the median of per-run losses 1, 0, 0");
        assert_eq!(m.received, vec![7, 1]);
        assert_eq!(m.drop2, vec![2, 0]);
        assert_eq!(m.total_drops(), 4);
        assert_eq!(ratio(1.0, 2.0), "0.500×");
        assert_eq!(ratio(0.0, 0.0), "=");
    }

    #[test]
    fn reads_the_drops_column_of_proc_net_udp() {
        let s = StdUdp::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        assert_eq!(udp_drops(port), Some(0));
    }
}
