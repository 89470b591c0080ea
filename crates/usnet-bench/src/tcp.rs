//! `usnet bench tcp`: bulk throughput and request/response latency of usnet's TCP
//! against the Linux kernel's, measured in the same run.
//!
//! Configurations (a client process and a server process each, pinned to different
//! cores when there are two):
//! - **usnet shm**: usnet ↔ usnet over the shm link (two processes). The link and the
//!   stacks use a jumbo MTU ([`SHM_MTU`]: one 64 KiB pool buffer per frame), which the
//!   shm link allows and which cuts the per-segment cost.
//! - **Linux loopback**: plain sockets over 127.0.0.1 (always available).
//! - **Linux veth** (root): sockets in two network namespaces joined by a veth pair
//!   (MTU 1500), each peer entering its namespace with `setns(2)`.
//! - **usnet→Linux TAP / Linux→usnet TAP** (root): a usnet stack on a TAP interface
//!   (`usnet-link` tap device, MTU 1500) talking to a Linux socket on the host side.
//! - **usnet→Linux / Linux→usnet over AF_XDP and over AF_PACKET** (root): a usnet
//!   stack on the first namespace's end of the Linux veth pair (its own address,
//!   10.89.0.3, beside Linux's 10.89.0.1 there), talking to a Linux socket in the
//!   second namespace. AF_XDP runs in copy mode there (veth has no zero-copy).
//!
//! Each usnet peer is an application with the stack linked in and driven from its own
//! spin loop (sans-IO `Stack` + device: no threads, no locks). Linux peers use blocking
//! sockets (TCP_NODELAY for request/response).
//!
//! Bulk: the client writes `size`-byte messages (the application's write size; the
//! server reads with the same size) for the run's duration, shuts down its write side
//! and waits for the server's EOF; the server measures from its first byte to EOF.
//! Verification: every run checks the byte count both ends agree on and an 8-byte
//! stamp (the stream offset, mixed) at every 1 KiB of the stream, so lost, duplicated
//! or reordered data is caught at negligible cost; `--verify` stamps every 8 bytes,
//! i.e. checks every byte (slower: the table then measures the check as well).
//!
//! Request/response: the client writes `size` bytes, reads the `size`-byte echo
//! (checked), and records the round trip; transactions/s, p50 and p99.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_driver::{Driver, SpinWindow, SystemClock};
use usnet_link::{Device, LinkOptions, LinkSpec, LinkState};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{bar_plot_runs, median, percentile, write_json, Bar, Table};
use usnet_stack::{mac_from_seed, SocketHandle, Stack, StackConfig, StackError};

use crate::peer::{emit, Peer, PeerSpec, PEER_READY};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Pool buffer size of the shm configuration.
const SHM_BUF: usize = 65536;
/// L3 MTU of the shm configuration: a whole frame fits one 64 KiB pool buffer.
pub const SHM_MTU: usize = SHM_BUF - DEFAULT_HEADROOM - 14;
const BURST: usize = 64;
const PORT: u16 = 9000;
/// Bulk stamp stride: one 8-byte stamp per KiB (default) or every 8 bytes (--verify).
pub(crate) const STRIDE: usize = 1024;
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Options of `usnet bench tcp` (the CLI owns the flags).
#[derive(Debug, Clone)]
pub struct TcpBenchOptions {
    /// Directory for tcp.json, tcp.md, tcp.png and tcp-rr.png.
    pub out: PathBuf,
    /// Runs per configuration (the tables show medians).
    pub runs: usize,
    /// Seconds per run.
    pub seconds: f64,
    /// Bulk message (write) sizes in bytes, multiples of 1024.
    pub sizes: Vec<usize>,
    /// Request/response message sizes in bytes.
    pub rr_sizes: Vec<usize>,
    /// One short run per configuration (for CI smoke tests, under a minute).
    pub quick: bool,
    /// Check every byte of the bulk streams (default: byte counts plus a stamp per KiB).
    pub verify: bool,
    /// Skip the configurations that need root (veth, TAP) even when root.
    pub no_root: bool,
    /// Only these configurations (short names: usnet-shm, linux-lo, linux-veth,
    /// usnet-tap-tx, usnet-tap-rx, usnet-afp-tx, usnet-afp-rx, usnet-xdp-tx,
    /// usnet-xdp-rx); empty: all.
    pub only: Vec<String>,
    /// Skip the request/response part.
    pub no_rr: bool,
    /// Skip the bulk part.
    pub no_bulk: bool,
    /// TAP without TCP segmentation offload (usnet sends MTU-sized frames and the
    /// kernel sends it MTU-sized frames), to measure what TSO/GSO brings.
    pub no_tso: bool,
    /// How long a usnet end on a TAP keeps polling its device after the last frame
    /// before it sleeps on it, in microseconds. Ends on shm always poll.
    pub spin_us: u64,
    /// usnet ends hold their connections' queues in pool buffers
    /// (`TcpConfig::zero_copy`) and use the copying calls on them.
    pub pool_buffers: bool,
    /// Pool buffer size of the usnet ends, instead of the link's default.
    pub buf_size: Option<usize>,
    /// Slots per ring of the shm link, instead of its default.
    pub shm_slots: Option<usize>,
}

impl Default for TcpBenchOptions {
    fn default() -> Self {
        TcpBenchOptions {
            out: PathBuf::from("bench-out/tcp"),
            runs: 3,
            seconds: 3.0,
            sizes: vec![1024, 16384, 65536, 1 << 20],
            rr_sizes: vec![1, 64],
            quick: false,
            verify: false,
            no_root: false,
            only: Vec::new(),
            no_rr: false,
            no_bulk: false,
            no_tso: false,
            spin_us: DEFAULT_SPIN_US,
            pool_buffers: false,
            buf_size: None,
            shm_slots: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PeerRole {
    UsnetServer,
    UsnetClient,
    LinuxServer,
    LinuxClient,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Test {
    Bulk,
    Rr,
}

/// One end of a run, in a child process (see [`crate::peer`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TcpPeerOptions {
    pub role: PeerRole,
    pub test: Test,
    /// usnet: shm:NAME or tap:IF.
    pub link: Option<String>,
    /// usnet: the stack's address; Linux server: the address to bind.
    pub addr: String,
    /// Client: the server's address:port.
    pub target: Option<String>,
    /// tap: the host side's CIDR.
    pub host_addr: Option<String>,
    pub size: usize,
    pub seconds: f64,
    pub stride: usize,
    pub core: Option<usize>,
    /// tap: negotiate TSO (GSO frames both ways) and let the stack emit them.
    pub tso: bool,
    /// Enter this network namespace (/run/netns/NAME) first.
    pub netns: Option<String>,
    /// usnet: microseconds of polling after the last frame before sleeping.
    pub spin_us: u64,
    /// usnet: connections hold their queues in pool buffers.
    #[serde(default)]
    pub pool_buffers: bool,
    /// usnet: pool buffer size, instead of the link's default.
    #[serde(default)]
    pub buf_size: Option<usize>,
    /// usnet on shm: slots per ring, instead of the link's default.
    #[serde(default)]
    pub shm_slots: Option<usize>,
}

/// Polling window of a usnet end, microseconds. Measured on the 2-vCPU machine
/// (docs/benchmarks.md): 20-30 µs keeps 1 KiB Linux→usnet at ≥ 0.8× veth while
/// letting the Linux sender's kernel work have the second core at 1 MiB.
const DEFAULT_SPIN_US: u64 = 25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sys {
    UsnetShm,
    LinuxLo,
    LinuxVeth,
    /// usnet client sends to a Linux server over TAP.
    UsnetTapTx,
    /// Linux client sends to a usnet server over TAP.
    UsnetTapRx,
    /// usnet client (AF_XDP on a veth end) sends to a Linux server in a namespace.
    UsnetXdpTx,
    /// Linux client in a namespace sends to a usnet server (AF_XDP on a veth end).
    UsnetXdpRx,
    /// As the XDP pair, over AF_PACKET.
    UsnetAfpTx,
    UsnetAfpRx,
}

impl Sys {
    fn label(self, test: Test) -> &'static str {
        match (self, test) {
            (Sys::UsnetShm, _) => "usnet↔usnet shm (jumbo)",
            (Sys::LinuxLo, _) => "Linux↔Linux loopback",
            (Sys::LinuxVeth, _) => "Linux↔Linux veth",
            (Sys::UsnetTapTx, Test::Bulk) => "usnet→Linux TAP",
            (Sys::UsnetTapTx, Test::Rr) => "usnet client, Linux server, TAP",
            (Sys::UsnetTapRx, Test::Bulk) => "Linux→usnet TAP",
            (Sys::UsnetTapRx, Test::Rr) => "Linux client, usnet server, TAP",
            (Sys::UsnetXdpTx, Test::Bulk) => "usnet→Linux AF_XDP (veth)",
            (Sys::UsnetXdpTx, Test::Rr) => "usnet client, Linux server, AF_XDP",
            (Sys::UsnetXdpRx, Test::Bulk) => "Linux→usnet AF_XDP (veth)",
            (Sys::UsnetXdpRx, Test::Rr) => "Linux client, usnet server, AF_XDP",
            (Sys::UsnetAfpTx, Test::Bulk) => "usnet→Linux AF_PACKET (veth)",
            (Sys::UsnetAfpTx, Test::Rr) => "usnet client, Linux server, AF_PACKET",
            (Sys::UsnetAfpRx, Test::Bulk) => "Linux→usnet AF_PACKET (veth)",
            (Sys::UsnetAfpRx, Test::Rr) => "Linux client, usnet server, AF_PACKET",
        }
    }
    fn short(self) -> &'static str {
        match self {
            Sys::UsnetShm => "usnet-shm",
            Sys::LinuxLo => "linux-lo",
            Sys::LinuxVeth => "linux-veth",
            Sys::UsnetTapTx => "usnet-tap-tx",
            Sys::UsnetTapRx => "usnet-tap-rx",
            Sys::UsnetXdpTx => "usnet-xdp-tx",
            Sys::UsnetXdpRx => "usnet-xdp-rx",
            Sys::UsnetAfpTx => "usnet-afp-tx",
            Sys::UsnetAfpRx => "usnet-afp-rx",
        }
    }
    fn needs_root(self) -> bool {
        self != Sys::UsnetShm && self != Sys::LinuxLo
    }
    /// Runs over the veth pair (needs it created).
    fn on_veth(self) -> bool {
        matches!(
            self,
            Sys::LinuxVeth | Sys::UsnetXdpTx | Sys::UsnetXdpRx | Sys::UsnetAfpTx | Sys::UsnetAfpRx
        )
    }
}

/// Two network namespaces joined by a veth pair; removed on drop.
pub(crate) struct Veth {
    pub(crate) ns: [String; 2],
    /// The veth ends, in `ns[0]` and `ns[1]`.
    pub(crate) dev: [String; 2],
}

pub(crate) const VETH_ADDR: [&str; 2] = ["10.89.0.1", "10.89.0.2"];
/// A usnet stack's address on the first namespace's veth end (beside Linux's).
pub(crate) const VETH_USNET: &str = "10.89.0.3";
const TAP_HOST: &str = "10.90.0.1";
const TAP_USNET: &str = "10.90.0.2";
const SHM_ADDR: [&str; 2] = ["10.88.0.1", "10.88.0.2"];

pub(crate) fn ip(args: &[&str]) -> Res<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

impl Veth {
    pub(crate) fn create() -> Res<Veth> {
        let pid = std::process::id();
        let (a, b) = (
            format!("usnbva{}", pid % 100_000),
            format!("usnbvb{}", pid % 100_000),
        );
        let v = Veth {
            ns: [format!("usnb-a-{pid}"), format!("usnb-b-{pid}")],
            dev: [a.clone(), b.clone()],
        };
        ip(&["netns", "add", &v.ns[0]])?;
        ip(&["netns", "add", &v.ns[1]])?;
        ip(&[
            "link", "add", &a, "netns", &v.ns[0], "type", "veth", "peer", "name", &b, "netns",
            &v.ns[1],
        ])?;
        for (ns, dev, addr) in [(&v.ns[0], &a, VETH_ADDR[0]), (&v.ns[1], &b, VETH_ADDR[1])] {
            let cidr = format!("{addr}/24");
            ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(v)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[derive(Debug, Clone, Default)]
struct Run {
    /// Bulk: bits/s at the server. RR: transactions/s at the client.
    rate: f64,
    bytes: u64,
    p50_us: f64,
    p99_us: f64,
    /// Segments both ends retransmitted (a Linux end's from TCP_INFO).
    retransmits: u64,
    /// TCP segments both ends sent, retransmissions included (a Linux end's
    /// `tcpi_segs_out`).
    segments: u64,
    /// The usnet ends' counters ({"client": .., "server": ..}; null for Linux).
    diag: Value,
    /// CPU of the client's core (0) and the server's (1) per unit of work, user
    /// and kernel: seconds per GB (bulk) or µs per transaction (request/response).
    cpu: [Option<(f64, f64)>; 2],
}

/// The median of one core's user and kernel CPU per unit over runs.
fn cpu_median(rs: &[Run], core: usize) -> Option<(f64, f64)> {
    crate::cpu::median_pair(rs.iter().filter_map(|r| r.cpu[core]))
}

pub fn run(a: &TcpBenchOptions) -> Res<ExitCode> {
    let (runs, seconds) = if a.quick {
        (1, 0.4)
    } else {
        (a.runs.max(1), a.seconds)
    };
    for &s in &a.sizes {
        if s == 0 || !s.is_multiple_of(STRIDE) {
            return Err(format!("bulk size {s}: use a multiple of {STRIDE}").into());
        }
    }
    for &s in &a.rr_sizes {
        if !(1..=65536).contains(&s) {
            return Err(format!("request/response size {s}: use 1..=65536").into());
        }
    }
    let root = is_root() && !a.no_root;
    let mut notes = Vec::new();
    let veth = if root {
        match Veth::create() {
            Ok(v) => Some(v),
            Err(e) => {
                notes.push(format!("veth configurations skipped: {e}"));
                None
            }
        }
    } else {
        None
    };
    if !root {
        notes.push(
            "not root (or --no-root): only usnet shm vs Linux loopback; veth and TAP need root"
                .to_string(),
        );
    }
    let wanted = |s: Sys| a.only.is_empty() || a.only.iter().any(|o| o == s.short());
    let avail = |s: Sys| wanted(s) && (!s.needs_root() || root) && (!s.on_veth() || veth.is_some());
    let bulk_sys: Vec<Sys> = [
        Sys::UsnetShm,
        Sys::LinuxLo,
        Sys::LinuxVeth,
        Sys::UsnetTapTx,
        Sys::UsnetTapRx,
        Sys::UsnetAfpTx,
        Sys::UsnetAfpRx,
        Sys::UsnetXdpTx,
        Sys::UsnetXdpRx,
    ]
    .into_iter()
    .filter(|&s| avail(s))
    .collect();
    let rr_sys: Vec<Sys> = [
        Sys::UsnetShm,
        Sys::LinuxLo,
        Sys::LinuxVeth,
        Sys::UsnetTapTx,
        Sys::UsnetAfpTx,
        Sys::UsnetXdpTx,
    ]
    .into_iter()
    .filter(|&s| avail(s))
    .collect();
    let stride = if a.verify { 8 } else { STRIDE };
    let bulk_sizes: &[usize] = if a.no_bulk { &[] } else { &a.sizes };
    let rr_sizes: &[usize] = if a.no_rr { &[] } else { &a.rr_sizes };
    let total = ((bulk_sizes.len() * bulk_sys.len() + rr_sizes.len() * rr_sys.len()) * runs) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:48} [{bar:30}] {pos}/{len}")
            .expect("template")
            .progress_chars("=> "),
    );
    let ns = veth.as_ref().map(|v| v.ns.clone());
    let veth_dev = veth.as_ref().map(|v| v.dev[0].clone());
    let opts = RunOpts {
        veth_dev: veth_dev.as_deref(),
        seconds,
        stride,
        ns: ns.as_ref(),
        tso: !a.no_tso,
        spin_us: a.spin_us,
        pool_buffers: a.pool_buffers,
        buf_size: a.buf_size,
        shm_slots: a.shm_slots,
    };
    let mut results: Vec<(Test, usize, Sys, Vec<Run>)> = Vec::new();
    for (test, sizes, systems) in [
        (Test::Bulk, bulk_sizes, &bulk_sys),
        (Test::Rr, rr_sizes, &rr_sys),
    ] {
        for &size in sizes {
            for &sys in systems.iter() {
                let mut rs = Vec::new();
                for _ in 0..runs {
                    bar.set_message(format!("{} {size} B", sys.label(test)));
                    let r = one_run(test, sys, size, &opts)
                        .map_err(|e| format!("{} {size} B: {e}", sys.label(test)))?;
                    rs.push(r);
                    bar.inc(1);
                }
                results.push((test, size, sys, rs));
            }
        }
    }
    bar.finish_and_clear();
    drop(veth);

    let med = |test: Test, size: usize, sys: Sys, f: fn(&Run) -> f64| -> Option<f64> {
        let mut v: Vec<f64> = results
            .iter()
            .filter(|r| r.0 == test && r.1 == size && r.2 == sys)
            .flat_map(|r| r.3.iter().map(f))
            .collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    let ratio =
        |x: f64, base: Option<f64>| base.map_or("-".to_string(), |b| format!("{:.2}", x / b));
    let verify_note = if a.verify {
        "every byte checked"
    } else {
        "byte counts + a stamp per KiB checked"
    };

    let mut bulk_t = Table::new(
        format!(
            "TCP bulk throughput at the receiver, one connection (median of {runs} × {seconds} s; {verify_note})"
        ),
        [
            "write size",
            "configuration",
            "Gbit/s",
            "× Linux veth",
            "× Linux loopback",
            "runs (Gbit/s)",
            "segments sent",
            "retransmits",
            "% retransmitted",
            "server core CPU s/GB (user/kernel)",
            "client core CPU s/GB (user/kernel)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut json_bulk = Vec::new();
    let mut bars = Vec::new();
    for &size in bulk_sizes {
        let veth_b = med(Test::Bulk, size, Sys::LinuxVeth, |r| r.rate);
        let lo_b = med(Test::Bulk, size, Sys::LinuxLo, |r| r.rate);
        for (_, _, sys, rs) in results.iter().filter(|r| r.0 == Test::Bulk && r.1 == size) {
            let g = med(Test::Bulk, size, *sys, |r| r.rate).unwrap_or(0.0);
            bulk_t.row(vec![
                human(size),
                sys.label(Test::Bulk).into(),
                format!("{:.2}", g / 1e9),
                ratio(g, veth_b),
                ratio(g, lo_b),
                rs.iter()
                    .map(|r| format!("{:.2}", r.rate / 1e9))
                    .collect::<Vec<_>>()
                    .join(" "),
                rs.iter()
                    .map(|r| r.segments.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                rs.iter()
                    .map(|r| r.retransmits.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                rtx_percent(rs),
                crate::cpu::pair_cell(cpu_median(rs, 1), 3),
                crate::cpu::pair_cell(cpu_median(rs, 0), 3),
            ]);
            let mut bar = Bar::new(
                format!("{} {}", sys.short(), human(size)),
                rs.iter().map(|r| r.rate).collect(),
            );
            bar.baseline = veth_b.or(lo_b);
            bars.push(bar);
            json_bulk.push(json!({
                "size": size, "config": sys.short(), "label": sys.label(Test::Bulk),
                "median_bits_per_s": g,
                "ratio_vs_linux_veth": veth_b.map(|b| g / b),
                "ratio_vs_linux_loopback": lo_b.map(|b| g / b),
                "cpu_s_per_gb": {"server_core": cpu_median(rs, 1), "client_core": cpu_median(rs, 0)},
                "runs": rs.iter().map(|r| json!({"bits_per_s": r.rate, "bytes": r.bytes, "retransmits": r.retransmits, "segments": r.segments, "usnet": r.diag, "cpu_s_per_gb": {"server_core": r.cpu[1], "client_core": r.cpu[0]}})).collect::<Vec<_>>(),
            }));
        }
    }
    let mut rr_t = Table::new(
        format!("TCP request/response, one connection, echo of the request (median of {runs} × {seconds} s)"),
        [
            "size",
            "configuration",
            "transactions/s",
            "p50 µs",
            "p99 µs",
            "p50 × Linux loopback",
            "p50 × Linux veth",
            "retransmits",
            "server core CPU µs/txn (user/kernel)",
            "client core CPU µs/txn (user/kernel)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut json_rr = Vec::new();
    let mut rr_bars = Vec::new();
    for &size in rr_sizes {
        let lo_p = med(Test::Rr, size, Sys::LinuxLo, |r| r.p50_us);
        let veth_p = med(Test::Rr, size, Sys::LinuxVeth, |r| r.p50_us);
        for (_, _, sys, rs) in results.iter().filter(|r| r.0 == Test::Rr && r.1 == size) {
            let tps = med(Test::Rr, size, *sys, |r| r.rate).unwrap_or(0.0);
            let p50 = med(Test::Rr, size, *sys, |r| r.p50_us).unwrap_or(0.0);
            let p99 = med(Test::Rr, size, *sys, |r| r.p99_us).unwrap_or(0.0);
            rr_t.row(vec![
                format!("{size} B"),
                sys.label(Test::Rr).into(),
                format!("{tps:.0}"),
                format!("{p50:.1}"),
                format!("{p99:.1}"),
                ratio(p50, lo_p),
                ratio(p50, veth_p),
                rs.iter()
                    .map(|r| r.retransmits.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                crate::cpu::pair_cell(cpu_median(rs, 1), 2),
                crate::cpu::pair_cell(cpu_median(rs, 0), 2),
            ]);
            let mut bar = Bar::new(
                format!("{} {size}B", sys.short()),
                rs.iter().map(|r| r.p50_us).collect(),
            );
            bar.baseline = veth_p.or(lo_p);
            rr_bars.push(bar);
            json_rr.push(json!({
                "size": size, "config": sys.short(), "label": sys.label(Test::Rr),
                "median_transactions_per_s": tps, "median_p50_us": p50, "median_p99_us": p99,
                "p50_ratio_vs_linux_loopback": lo_p.map(|b| p50 / b),
                "p50_ratio_vs_linux_veth": veth_p.map(|b| p50 / b),
                "cpu_us_per_transaction": {"server_core": cpu_median(rs, 1), "client_core": cpu_median(rs, 0)},
                "runs": rs.iter().map(|r| json!({"transactions_per_s": r.rate, "p50_us": r.p50_us, "p99_us": r.p99_us, "transactions": r.bytes, "retransmits": r.retransmits, "segments": r.segments, "usnet": r.diag, "cpu_us_per_transaction": {"server_core": r.cpu[1], "client_core": r.cpu[0]}})).collect::<Vec<_>>(),
            }));
        }
    }

    // Goals, quoted from the medians.
    let mut goals = Vec::new();
    for &size in bulk_sizes {
        let shm = med(Test::Bulk, size, Sys::UsnetShm, |r| r.rate);
        let veth_b = med(Test::Bulk, size, Sys::LinuxVeth, |r| r.rate);
        let lo_b = med(Test::Bulk, size, Sys::LinuxLo, |r| r.rate);
        if let (Some(s), Some(v)) = (shm, veth_b) {
            goals.push(goal(
                format!("bulk {}: usnet shm ≥ 1.5× Linux veth", human(size)),
                s / v,
                1.5,
                true,
            ));
        }
        if let Some((_, _, _, rs)) = results
            .iter()
            .find(|r| r.0 == Test::Bulk && r.1 == size && r.2 == Sys::UsnetShm)
        {
            let seg: u64 = rs.iter().map(|r| r.segments).sum();
            let rtx: u64 = rs.iter().map(|r| r.retransmits).sum();
            let share = if seg == 0 {
                0.0
            } else {
                rtx as f64 / seg as f64
            };
            let met = seg > 0 && share <= 1e-4;
            goals.push((
                format!(
                    "goal {}: bulk {}: usnet shm retransmits ≤ 0.01 % of its segments: {rtx} of {seg} ({:.4} %)",
                    if met { "met" } else { "NOT met" },
                    human(size),
                    share * 100.0
                ),
                share,
                met,
            ));
        }
        if let (Some(s), Some(l)) = (shm, lo_b) {
            goals.push(goal(
                format!(
                    "bulk {}: usnet shm vs Linux loopback (reference, goal 1.5×)",
                    human(size)
                ),
                s / l,
                1.5,
                true,
            ));
        }
        for sys in [
            Sys::UsnetTapTx,
            Sys::UsnetTapRx,
            Sys::UsnetXdpTx,
            Sys::UsnetXdpRx,
        ] {
            if let (Some(t), Some(v)) = (med(Test::Bulk, size, sys, |r| r.rate), veth_b) {
                goals.push(goal(
                    format!(
                        "bulk {}: {} ≥ 0.8× Linux veth",
                        human(size),
                        sys.label(Test::Bulk)
                    ),
                    t / v,
                    0.8,
                    true,
                ));
            }
        }
    }
    for &size in rr_sizes {
        if let (Some(s), Some(l)) = (
            med(Test::Rr, size, Sys::UsnetShm, |r| r.p50_us),
            med(Test::Rr, size, Sys::LinuxLo, |r| r.p50_us),
        ) {
            goals.push(goal(
                format!("request/response {size} B: usnet shm p50 ≤ 0.5× Linux loopback"),
                s / l,
                0.5,
                false,
            ));
        }
    }

    if !bulk_sizes.is_empty() {
        bulk_t.print();
    }
    if !rr_sizes.is_empty() {
        rr_t.print();
    }
    let goal_lines: Vec<String> = goals.iter().map(|g| g.0.clone()).collect();
    for l in notes.iter().chain(goal_lines.iter()) {
        println!("{l}");
    }
    std::fs::create_dir_all(&a.out)?;
    write_json(
        &a.out.join("tcp.json"),
        &json!({
            "benchmark": "tcp", "runs": runs, "seconds": seconds, "cpus": crate::cpus(),
            "verify": if a.verify { "every byte" } else { "byte counts + stamp per KiB" },
            "shm_mtu": SHM_MTU, "tap_mtu": 1500, "veth_mtu": 1500, "pool_buffers": a.pool_buffers, "buf_size": a.buf_size, "shm_slots": a.shm_slots,
            "notes": notes,
            "goals": goals.iter().map(|g| json!({"goal": g.0, "ratio": g.1, "met": g.2})).collect::<Vec<_>>(),
            "bulk": json_bulk, "request_response": json_rr,
        }),
    )?;
    let mut md = String::new();
    if !bulk_sizes.is_empty() {
        md.push_str(&bulk_t.to_markdown());
        md.push('\n');
    }
    if !rr_sizes.is_empty() {
        md.push_str(&rr_t.to_markdown());
        md.push('\n');
    }
    for l in notes.iter().chain(goal_lines.iter()) {
        md.push_str(&format!("- {l}\n"));
    }
    std::fs::write(a.out.join("tcp.md"), md)?;
    if !bars.is_empty() {
        bar_plot_runs(
            &a.out.join("tcp.png"),
            "TCP bulk throughput (median, min–max; ratio to Linux veth, else loopback)",
            "bit/s",
            &bars,
        )?;
    }
    if !rr_bars.is_empty() {
        bar_plot_runs(
            &a.out.join("tcp-rr.png"),
            "TCP request/response p50 latency (median, min–max; ratio to Linux veth, else loopback)",
            "µs",
            &rr_bars,
        )?;
    }
    println!(
        "wrote {0}/tcp.json, {0}/tcp.md, {0}/tcp.png, {0}/tcp-rr.png",
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Retransmitted segments as a percentage of the segments sent, over all runs.
fn rtx_percent(rs: &[Run]) -> String {
    let seg: u64 = rs.iter().map(|r| r.segments).sum();
    let rtx: u64 = rs.iter().map(|r| r.retransmits).sum();
    if seg == 0 {
        "-".to_string()
    } else {
        format!("{:.4}", rtx as f64 * 100.0 / seg as f64)
    }
}

/// A goal line: (text, ratio, met).
fn goal(what: String, ratio: f64, target: f64, at_least: bool) -> (String, f64, bool) {
    let met = if at_least {
        ratio >= target
    } else {
        ratio <= target
    };
    (
        format!(
            "goal {}: {what}: {ratio:.2}×",
            if met { "met" } else { "NOT met" }
        ),
        ratio,
        met,
    )
}

fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// A peer with the settings every run shares; the caller fills in its link,
/// addresses and namespace.
fn peer(role: PeerRole, test: Test, size: usize, core: usize, o: &RunOpts) -> TcpPeerOptions {
    TcpPeerOptions {
        role,
        test,
        link: None,
        addr: String::new(),
        target: None,
        host_addr: None,
        size,
        seconds: o.seconds,
        stride: o.stride,
        core: (crate::cpus() >= 2).then_some(core),
        tso: false,
        netns: None,
        spin_us: o.spin_us,
        pool_buffers: o.pool_buffers,
        buf_size: o.buf_size,
        shm_slots: o.shm_slots,
    }
}

/// What every run of one bench invocation shares.
#[derive(Clone, Copy)]
struct RunOpts<'a> {
    seconds: f64,
    stride: usize,
    /// The two veth namespaces, when root.
    ns: Option<&'a [String; 2]>,
    /// The veth end in the first namespace.
    veth_dev: Option<&'a str>,
    tso: bool,
    spin_us: u64,
    pool_buffers: bool,
    buf_size: Option<usize>,
    shm_slots: Option<usize>,
}

fn one_run(test: Test, sys: Sys, size: usize, o: &RunOpts) -> Res<Run> {
    let RunOpts {
        seconds, ns, tso, ..
    } = *o;
    let pid = std::process::id();
    let shm = format!("shm:bench-tcp-{pid}");
    let tap = format!("tap:usnbt{}", pid % 100_000);
    let host_cidr = format!("{TAP_HOST}/24");
    // A usnet end on the first namespace's veth end (xdp or afpacket).
    let on_veth = |kind: &str, role: PeerRole, target: Option<String>, core: usize| -> Res<_> {
        let dev = o.veth_dev.ok_or("no veth")?;
        Ok(TcpPeerOptions {
            link: Some(format!("{kind}:{dev}")),
            addr: VETH_USNET.into(),
            target,
            netns: Some(ns.ok_or("no veth")?[0].clone()),
            ..peer(role, test, size, core, o)
        })
    };
    // The Linux end of those, in the second namespace.
    let linux_in_b = |role: PeerRole, addr: &str, target: Option<String>, core: usize| -> Res<_> {
        Ok(TcpPeerOptions {
            addr: addr.into(),
            target,
            netns: Some(ns.ok_or("no veth")?[1].clone()),
            ..peer(role, test, size, core, o)
        })
    };
    if matches!(
        sys,
        Sys::UsnetXdpTx | Sys::UsnetXdpRx | Sys::UsnetAfpTx | Sys::UsnetAfpRx
    ) {
        // Every usnet end is a new process with a new MAC: forget the previous one's,
        // or the Linux end keeps sending to it until its neighbour entry goes stale.
        ip(&[
            "-n",
            &ns.ok_or("no veth")?[1],
            "neigh",
            "flush",
            "to",
            VETH_USNET,
        ])?;
    }
    let server = match sys {
        Sys::UsnetXdpTx | Sys::UsnetAfpTx => {
            linux_in_b(PeerRole::LinuxServer, VETH_ADDR[1], None, 1)?
        }
        Sys::UsnetXdpRx => on_veth("xdp", PeerRole::UsnetServer, None, 1)?,
        Sys::UsnetAfpRx => on_veth("afpacket", PeerRole::UsnetServer, None, 1)?,
        Sys::UsnetShm => TcpPeerOptions {
            link: Some(shm.clone()),
            addr: SHM_ADDR[1].into(),
            ..peer(PeerRole::UsnetServer, test, size, 1, o)
        },
        Sys::LinuxLo => TcpPeerOptions {
            addr: "127.0.0.1".into(),
            ..peer(PeerRole::LinuxServer, test, size, 1, o)
        },
        Sys::LinuxVeth => TcpPeerOptions {
            addr: VETH_ADDR[1].into(),
            netns: Some(ns.ok_or("no veth")?[1].clone()),
            ..peer(PeerRole::LinuxServer, test, size, 1, o)
        },
        Sys::UsnetTapTx => TcpPeerOptions {
            addr: "0.0.0.0".into(),
            ..peer(PeerRole::LinuxServer, test, size, 1, o)
        },
        Sys::UsnetTapRx => TcpPeerOptions {
            link: Some(tap.clone()),
            addr: TAP_USNET.into(),
            host_addr: Some(host_cidr.clone()),
            tso,
            ..peer(PeerRole::UsnetServer, test, size, 1, o)
        },
    };
    let mut server = Peer::spawn(&PeerSpec::Tcp(server))?;
    let ready = server.read(PEER_READY)?;
    let port = ready["port"].as_u64().ok_or("server sent no port")?;
    let client = match sys {
        Sys::UsnetXdpTx => on_veth(
            "xdp",
            PeerRole::UsnetClient,
            Some(format!("{}:{port}", VETH_ADDR[1])),
            0,
        )?,
        Sys::UsnetAfpTx => on_veth(
            "afpacket",
            PeerRole::UsnetClient,
            Some(format!("{}:{port}", VETH_ADDR[1])),
            0,
        )?,
        Sys::UsnetXdpRx | Sys::UsnetAfpRx => linux_in_b(
            PeerRole::LinuxClient,
            VETH_ADDR[1],
            Some(format!("{VETH_USNET}:{port}")),
            0,
        )?,
        Sys::UsnetShm => TcpPeerOptions {
            link: Some(shm),
            addr: SHM_ADDR[0].into(),
            target: Some(format!("{}:{port}", SHM_ADDR[1])),
            ..peer(PeerRole::UsnetClient, test, size, 0, o)
        },
        Sys::LinuxLo => TcpPeerOptions {
            addr: "127.0.0.1".into(),
            target: Some(format!("127.0.0.1:{port}")),
            ..peer(PeerRole::LinuxClient, test, size, 0, o)
        },
        Sys::LinuxVeth => TcpPeerOptions {
            addr: VETH_ADDR[0].into(),
            target: Some(format!("{}:{port}", VETH_ADDR[1])),
            netns: Some(ns.ok_or("no veth")?[0].clone()),
            ..peer(PeerRole::LinuxClient, test, size, 0, o)
        },
        Sys::UsnetTapTx => TcpPeerOptions {
            link: Some(tap),
            addr: TAP_USNET.into(),
            host_addr: Some(host_cidr),
            target: Some(format!("{TAP_HOST}:{port}")),
            tso,
            ..peer(PeerRole::UsnetClient, test, size, 0, o)
        },
        Sys::UsnetTapRx => TcpPeerOptions {
            addr: TAP_HOST.into(),
            target: Some(format!("{TAP_USNET}:{port}")),
            ..peer(PeerRole::LinuxClient, test, size, 0, o)
        },
    };
    // Both cores' counters over the client's life (its connect, the transfer, its
    // end): every peer is pinned, the client to core 0 and the server to core 1.
    let cores = crate::cpus() >= 2;
    let before = [0, 1].map(|c| cores.then(|| crate::cpu::sample(c)).flatten());
    let mut client = Peer::spawn(&PeerSpec::Tcp(client))?;
    let limit = Duration::from_secs_f64(seconds + 20.0);
    let cr = client.read(limit + PEER_READY)?;
    let sr = server.read(limit + PEER_READY)?;
    let used = before.map(|b| b.and_then(|b| crate::cpu::sample_like(&b).map(|a| b.until(&a))));
    client.finish(limit)?;
    server.finish(limit)?;
    if let Some(e) = cr["error"].as_str().or(sr["error"].as_str()) {
        return Err(e.to_string().into());
    }
    let rtx = cr["retransmits"].as_u64().unwrap_or(0) + sr["retransmits"].as_u64().unwrap_or(0);
    let segments = cr["segments"].as_u64().unwrap_or(0) + sr["segments"].as_u64().unwrap_or(0);
    let side = |r: &Value| {
        r.get("counters").map(|_| {
            json!({"segments": r["segments"], "retransmits": r["retransmits"],
                   "counters": r["counters"], "device": r["device"]})
        })
    };
    let diag = json!({"client": side(&cr), "server": side(&sr)});
    match test {
        Test::Bulk => {
            let sent = cr["bytes"].as_u64().unwrap_or(0);
            let got = sr["bytes"].as_u64().unwrap_or(0);
            if sent != got || got == 0 {
                return Err(format!("sent {sent} bytes, the server received {got}").into());
            }
            let w = sr["window_s"].as_f64().unwrap_or(0.0);
            Ok(Run {
                rate: if w > 0.0 { got as f64 * 8.0 / w } else { 0.0 },
                bytes: got,
                retransmits: rtx,
                segments,
                diag,
                cpu: used.map(|u| u.map(|u| u.per_total(got as f64 / 1e9))),
                ..Run::default()
            })
        }
        Test::Rr => {
            let n = cr["transactions"].as_u64().unwrap_or(0);
            let served = sr["transactions"].as_u64().unwrap_or(0);
            if n != served || n == 0 {
                return Err(
                    format!("{n} transactions completed, the server served {served}").into(),
                );
            }
            let w = cr["window_s"].as_f64().unwrap_or(0.0);
            Ok(Run {
                rate: if w > 0.0 { n as f64 / w } else { 0.0 },
                bytes: n,
                p50_us: cr["p50_us"].as_f64().unwrap_or(0.0),
                p99_us: cr["p99_us"].as_f64().unwrap_or(0.0),
                retransmits: rtx,
                segments,
                diag,
                cpu: used.map(|u| {
                    u.map(|u| {
                        let (us, ks) = u.per_total(n as f64);
                        (us * 1e6, ks * 1e6)
                    })
                }),
            })
        }
    }
}

// ------------------------------------------------------------------ the stream

/// The 8-byte stamp at stamp index `k` of the bulk stream.
fn stamp(k: u64) -> [u8; 8] {
    (k.wrapping_add(1).wrapping_mul(K) ^ (k >> 7)).to_le_bytes()
}

/// Writes the stamps of the stream bytes `off..off + buf.len()` into `buf`
/// (`off` and the length multiples of `stride`).
pub(crate) fn stamp_fill(buf: &mut [u8], off: u64, stride: usize) {
    let base = off / stride as u64;
    for (j, c) in buf.chunks_mut(stride).enumerate() {
        c[..8].copy_from_slice(&stamp(base + j as u64));
    }
}

/// The first stream offset in `buf` (holding stream bytes from `off`) whose stamp byte
/// is wrong.
pub(crate) fn stamp_check(buf: &[u8], off: u64, stride: usize) -> Option<u64> {
    let s = stride as u64;
    let end = off + buf.len() as u64;
    let mut k = off / s;
    while k * s < end {
        let st = stamp(k);
        for (j, &b) in st.iter().enumerate() {
            let p = k * s + j as u64;
            if p >= off && p < end && buf[(p - off) as usize] != b {
                return Some(p);
            }
        }
        k += 1;
    }
    None
}

// ------------------------------------------------------------------ peers

/// Entry point of a child process.
pub fn run_peer(a: &TcpPeerOptions) -> Res<ExitCode> {
    if let Some(ns) = &a.netns {
        enter_netns(ns)?;
    }
    if let Some(c) = a.core {
        crate::pin_to_core(c);
    }
    let r = match a.role {
        PeerRole::LinuxServer => linux_server(a),
        PeerRole::LinuxClient => linux_client(a),
        PeerRole::UsnetServer | PeerRole::UsnetClient => usnet_peer(a),
    };
    match r {
        Ok(v) => emit(&v),
        Err(e) => emit(&json!({"error": e.to_string()})),
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn enter_netns(name: &str) -> Res<()> {
    let f = std::fs::File::open(format!("/run/netns/{name}"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: setns with a valid namespace fd; affects only this (single-threaded)
    // process.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn lat_summary(lat: &mut [f64]) -> (f64, f64) {
    lat.sort_by(|a, b| a.total_cmp(b));
    (percentile(lat, 50.0), percentile(lat, 99.0))
}

/// Accepts one connection, waiting at most `timeout` for it.
fn accept_within(l: &StdListener, timeout: Duration) -> Res<StdStream> {
    l.set_nonblocking(true)?;
    let end = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= end {
                    return Err(format!("no client connected within {timeout:?}").into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A Linux end's segments sent and retransmitted (TCP_INFO's `tcpi_segs_out` and
/// `tcpi_total_retrans`), as the JSON fields a usnet end reports.
/// A Linux socket's `tcp_info`.
pub(crate) fn linux_tcp_info(s: &StdStream) -> Option<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is a valid value of the plain C struct.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `ti` is writable for `len` bytes and outlives the call; the kernel
    // writes at most `len` bytes and stores the length it wrote.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut ti as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(ti)
}

fn linux_counts(s: &StdStream) -> Value {
    match linux_tcp_info(s) {
        Some(ti) => json!({"segments": ti.tcpi_segs_out, "retransmits": ti.tcpi_total_retrans}),
        None => json!({}),
    }
}

/// Merges `extra`'s fields into the object `v`.
fn with(mut v: Value, extra: Value) -> Value {
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

/// Reads and writes of a Linux peer fail after this much silence (a peer that died).
fn idle_limit(a: &TcpPeerOptions) -> Option<Duration> {
    Some(Duration::from_secs_f64(a.seconds + 15.0))
}

fn linux_server(a: &TcpPeerOptions) -> Res<Value> {
    let l = StdListener::bind(SocketAddr::new(a.addr.parse()?, 0))?;
    emit(&json!({"ready": true, "port": l.local_addr()?.port()}));
    let mut s = accept_within(&l, Duration::from_secs(30))?;
    s.set_read_timeout(idle_limit(a))?;
    s.set_write_timeout(idle_limit(a))?;
    match a.test {
        Test::Bulk => {
            let mut buf = vec![0u8; a.size];
            let (mut got, mut first, mut bad) = (0u64, None::<Instant>, None);
            loop {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                first.get_or_insert_with(Instant::now);
                if bad.is_none() {
                    bad = stamp_check(&buf[..n], got, a.stride);
                }
                got += n as u64;
            }
            let w = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
            if let Some(at) = bad {
                return Err(format!("stream byte {at} is wrong").into());
            }
            Ok(with(json!({"bytes": got, "window_s": w}), linux_counts(&s)))
        }
        Test::Rr => {
            s.set_nodelay(true)?;
            let mut buf = vec![0u8; a.size];
            let mut n = 0u64;
            loop {
                match s.read_exact(&mut buf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e.into()),
                }
                s.write_all(&buf)?;
                n += 1;
            }
            Ok(with(json!({"transactions": n}), linux_counts(&s)))
        }
    }
}

fn linux_client(a: &TcpPeerOptions) -> Res<Value> {
    let to: SocketAddr = a.target.as_deref().ok_or("--target")?.parse()?;
    let mut s = StdStream::connect_timeout(&to, Duration::from_secs(10))?;
    s.set_read_timeout(idle_limit(a))?;
    s.set_write_timeout(idle_limit(a))?;
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    match a.test {
        Test::Bulk => {
            let mut buf = vec![0u8; a.size];
            let mut sent = 0u64;
            while Instant::now() < end {
                stamp_fill(&mut buf, sent, a.stride);
                s.write_all(&buf)?;
                sent += buf.len() as u64;
            }
            s.shutdown(std::net::Shutdown::Write)?;
            let mut b = [0u8; 16];
            while s.read(&mut b)? > 0 {}
            Ok(with(json!({"bytes": sent}), linux_counts(&s)))
        }
        Test::Rr => {
            s.set_nodelay(true)?;
            let mut req = vec![0u8; a.size];
            let mut resp = vec![0u8; a.size];
            let mut lat = Vec::with_capacity(1 << 20);
            let t0 = Instant::now();
            while Instant::now() < end {
                let tag = lat.len() as u8;
                req.iter_mut().for_each(|b| *b = tag);
                let t = Instant::now();
                s.write_all(&req)?;
                s.read_exact(&mut resp)?;
                lat.push(t.elapsed().as_nanos() as f64 / 1e3);
                if resp != req {
                    return Err("echo differs from the request".into());
                }
            }
            let w = t0.elapsed().as_secs_f64();
            s.shutdown(std::net::Shutdown::Write)?;
            let mut b = [0u8; 16];
            while s.read(&mut b)? > 0 {}
            let n = lat.len();
            let (p50, p99) = lat_summary(&mut lat);
            Ok(with(
                json!({"transactions": n, "window_s": w, "p50_us": p50, "p99_us": p99}),
                linux_counts(&s),
            ))
        }
    }
}

/// A usnet application: a stack and its device, driven from this loop.
struct App {
    driver: Driver<Box<dyn Device>>,
    /// When the last turn ran: the loops' deadlines read no clock of their own.
    now: usnet_stack::Instant,
    /// How long a turn keeps polling after the last frame before it sleeps on the
    /// device, like the runtime's poll thread.
    spin: SpinWindow,
}

impl App {
    fn open(a: &TcpPeerOptions) -> Res<App> {
        let link: LinkSpec = a.link.as_deref().ok_or("--link")?.parse()?;
        let shm = match &link {
            LinkSpec::Shm(_) => true,
            LinkSpec::Tap(_) | LinkSpec::Xdp { .. } | LinkSpec::AfPacket(_) => false,
            other => {
                return Err(format!(
                    "bench tcp runs on shm, tap, xdp or afpacket links, not {other}"
                )
                .into())
            }
        };
        // Pool buffers of 64 KiB: one jumbo frame (shm) or one GSO frame (TAP with TSO).
        // AF_XDP needs UMEM chunks of at most a page: 2048-byte buffers.
        let big = shm || (a.tso && matches!(link, LinkSpec::Tap(_)));
        let seed = (std::process::id() as u64) << 8 | a.role as u64;
        let addr: usnet_stack::IpCidr = format!("{}/24", a.addr).parse()?;
        let dev = usnet_link::open(
            &link,
            &LinkOptions {
                mtu: shm.then_some(SHM_MTU),
                shm_slots: a.shm_slots.filter(|_| shm),
                mac: Some(mac_from_seed(seed).0),
                tap_host_addrs: a.host_addr.iter().cloned().collect(),
                tso: a.tso,
                addrs: vec![addr.addr],
                ..LinkOptions::default()
            },
        )?;
        let caps = dev.caps();
        let mut tcp = StackConfig::default().tcp;
        tcp.zero_copy = a.pool_buffers;
        if shm {
            tcp.mss = u16::MAX;
        }
        if big {
            // 64 KiB segments: the window must hold many of them from the start (the
            // engine ACKs every two segments of the largest size seen).
            tcp.send_buffer = 4 << 20;
            tcp.recv_buffer = 8 << 20;
            tcp.recv_buffer_initial = 1 << 20;
        }
        let stack = Stack::new(StackConfig {
            rx_csum_offload: caps.rx_csum_offload,
            tx_csum_offload: caps.tx_csum_offload,
            mac: mac_from_seed(seed),
            mtu: caps.mtu,
            addrs: vec![addr],
            tso: caps.tso,
            pool: if let Some(buf_size) = a.buf_size {
                PoolConfig {
                    buf_size,
                    count: ((64usize << 20) / buf_size).max(1024) as u32,
                    headroom: DEFAULT_HEADROOM,
                    backing: Backing::Anonymous,
                }
            } else if big {
                PoolConfig {
                    buf_size: SHM_BUF,
                    count: 1024,
                    headroom: DEFAULT_HEADROOM,
                    backing: Backing::Anonymous,
                }
            } else {
                PoolConfig {
                    buf_size: 2048,
                    count: 16384,
                    headroom: DEFAULT_HEADROOM,
                    backing: Backing::Anonymous,
                }
            },
            input_queue_len: 4096,
            tx_queue_len: if big { 256 } else { 2048 },
            seed,
            tcp,
            ..StackConfig::default()
        })?;
        let mut driver = Driver::new(stack, dev, SystemClock::new());
        driver.bind_device()?;
        driver.set_burst(BURST);
        let now = driver.now();
        Ok(App {
            driver,
            now,
            // Two usnet ends over shm each have a core and no kernel work to make room
            // for: a futex sleep there only adds wake-up latency (64 KiB bulk: 52 vs
            // 88 Gbit/s), so they poll without sleeping.
            spin: SpinWindow::new(if shm {
                Duration::MAX
            } else {
                Duration::from_micros(a.spin_us)
            }),
        })
    }

    fn stack(&mut self) -> &mut Stack {
        self.driver.stack_mut()
    }

    /// One turn of the shared driver; sleeps on the device when idle past the spin
    /// window.
    fn turn(&mut self) -> Res<usize> {
        let t = self.driver.turn()?;
        self.now = t.now;
        if t.received > 0 || t.sent > 0 || t.tx_backlog > 0 {
            self.spin.worked();
        } else if !self.spin.keep_polling() {
            // Idle past the spin window: sleep on the device instead of taking a core
            // the peer (on this 2-core machine, the Linux side) needs.
            self.driver.wait(Duration::from_millis(1))?;
        }
        Ok(t.received)
    }

    /// A deadline `d` from now, in the turns' time.
    fn deadline(&self, d: Duration) -> usnet_stack::Instant {
        self.driver.now() + d
    }

    /// Whether the last turn ran at or after `end`.
    fn past(&self, end: usnet_stack::Instant) -> bool {
        self.now >= end
    }

    fn check_link(&self) -> Res<()> {
        if self.driver.link_state() == LinkState::Down {
            return Err("link went down".into());
        }
        Ok(())
    }

    /// Turns until `f` returns Some (or the deadline passes).
    fn until<T>(
        &mut self,
        limit: Duration,
        what: &str,
        mut f: impl FnMut(&mut Stack) -> Result<Option<T>, StackError>,
    ) -> Res<T> {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = f(self.driver.stack_mut())? {
                return Ok(v);
            }
            self.turn()?;
            if Instant::now() > end {
                return Err(format!("timed out waiting for {what}").into());
            }
        }
    }

    /// Lets the last segments (FIN, ACKs) leave before the process exits.
    fn linger(&mut self, h: SocketHandle) {
        let _ = self.stack().tcp_close(h);
        let end = Instant::now() + Duration::from_millis(50);
        while Instant::now() < end {
            if self.turn().is_err() {
                break;
            }
        }
    }

    fn retransmits(&self, h: SocketHandle) -> u64 {
        self.driver
            .stack()
            .tcp_info(h)
            .map(|i| i.total_retransmits)
            .unwrap_or(0)
    }

    /// What the stack and the device counted: the TCP segments this end sent, every
    /// non-zero stack counter and the device's statistics, so a run's retransmissions
    /// can be traced to where frames went missing.
    fn diag(&self) -> Value {
        let c = self.driver.stack().counters_snapshot();
        let d = self.driver.device_stats();
        let nonzero: serde_json::Map<String, Value> = c
            .entries()
            .into_iter()
            .filter(|e| e.2 != 0)
            .map(|(n, _, v)| (n.to_string(), json!(v)))
            .collect();
        json!({
            "segments": c.tcp_engine_tx_segments,
            "counters": nonzero,
            "device": d.named().into_iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>(),
        })
    }
}

fn would_block<T>(r: Result<T, StackError>) -> Result<Option<T>, StackError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StackError::WouldBlock) => Ok(None),
        Err(e) => Err(e),
    }
}

fn usnet_peer(a: &TcpPeerOptions) -> Res<Value> {
    let mut app = App::open(a)?;
    let wait = Duration::from_secs_f64(a.seconds + 15.0);
    let h = if a.role == PeerRole::UsnetServer {
        let l = app
            .stack()
            .tcp_listen(SocketAddr::new(a.addr.parse::<IpAddr>()?, PORT), 16)?;
        emit(&json!({"ready": true, "port": PORT}));
        app.until(wait, "a connection", |s| would_block(s.tcp_accept(l)))?
    } else {
        let to: SocketAddr = a.target.as_deref().ok_or("--target")?.parse()?;
        let h = app.stack().tcp_connect(None, to)?;
        app.until(Duration::from_secs(10), "the handshake", |s| {
            let r = s.readiness(h)?;
            if let Some(e) = s.tcp_error(h)? {
                return Err(e);
            }
            Ok(r.connected.then_some(()))
        })?;
        h
    };
    let v = match (a.role, a.test) {
        (PeerRole::UsnetServer, Test::Bulk) => usnet_bulk_server(&mut app, h, a, wait)?,
        (PeerRole::UsnetServer, Test::Rr) => usnet_rr_server(&mut app, h, a, wait)?,
        (_, Test::Bulk) => usnet_bulk_client(&mut app, h, a, wait)?,
        (_, Test::Rr) => usnet_rr_client(&mut app, h, a, wait)?,
    };
    let v = with(v, app.diag());
    app.linger(h);
    Ok(v)
}

fn usnet_bulk_server(
    app: &mut App,
    h: SocketHandle,
    a: &TcpPeerOptions,
    wait: Duration,
) -> Res<Value> {
    let mut buf = vec![0u8; a.size];
    let (mut got, mut first, mut bad) = (0u64, None::<Instant>, None);
    let end = app.deadline(wait);
    loop {
        match app.stack().tcp_recv(h, &mut buf) {
            Ok(0) => break,
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                if bad.is_none() {
                    bad = stamp_check(&buf[..n], got, a.stride);
                }
                got += n as u64;
                continue;
            }
            Err(StackError::WouldBlock) => {}
            Err(e) => return Err(e.into()),
        }
        app.turn()?;
        if app.past(end) {
            return Err("the stream did not end".into());
        }
        app.check_link()?;
    }
    let w = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    if let Some(at) = bad {
        return Err(format!("stream byte {at} is wrong").into());
    }
    Ok(json!({"bytes": got, "window_s": w, "retransmits": app.retransmits(h)}))
}

fn usnet_bulk_client(
    app: &mut App,
    h: SocketHandle,
    a: &TcpPeerOptions,
    wait: Duration,
) -> Res<Value> {
    let mut buf = vec![0u8; a.size];
    let mut sent = 0u64;
    let mut pos = 0usize; // bytes of the current message already taken
    stamp_fill(&mut buf, 0, a.stride);
    let end = app.deadline(Duration::from_secs_f64(a.seconds));
    while !app.past(end) {
        loop {
            match app.stack().tcp_send(h, &buf[pos..]) {
                Ok(n) => {
                    pos += n;
                    if pos == buf.len() {
                        sent += buf.len() as u64;
                        pos = 0;
                        stamp_fill(&mut buf, sent, a.stride);
                    }
                }
                Err(StackError::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        app.turn()?;
    }
    // Finish the message in progress so the stream is whole messages.
    while pos != 0 {
        match app.stack().tcp_send(h, &buf[pos..]) {
            Ok(n) => {
                pos += n;
                if pos == buf.len() {
                    sent += buf.len() as u64;
                    pos = 0;
                }
            }
            Err(StackError::WouldBlock) => {
                app.turn()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    app.stack().tcp_shutdown_write(h)?;
    let mut b = [0u8; 64];
    app.until(wait, "the server's EOF", |s| {
        would_block(s.tcp_recv(h, &mut b)).map(|r| (r == Some(0)).then_some(()))
    })?;
    Ok(json!({"bytes": sent, "retransmits": app.retransmits(h)}))
}

/// Reads exactly `buf.len()` bytes; false at EOF.
fn usnet_read_exact(app: &mut App, h: SocketHandle, buf: &mut [u8], end: Instant) -> Res<bool> {
    let mut at = 0;
    while at < buf.len() {
        match app.stack().tcp_recv(h, &mut buf[at..]) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                at += n;
                continue;
            }
            Err(StackError::WouldBlock) => {}
            Err(e) => return Err(e.into()),
        }
        app.turn()?;
        if Instant::now() > end {
            return Err("timed out reading".into());
        }
    }
    Ok(true)
}

fn usnet_write_all(app: &mut App, h: SocketHandle, buf: &[u8]) -> Res<()> {
    let mut at = 0;
    while at < buf.len() {
        match app.stack().tcp_send(h, &buf[at..]) {
            Ok(n) => at += n,
            Err(StackError::WouldBlock) => {
                app.turn()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Push it out now rather than on the next turn.
    app.turn()?;
    Ok(())
}

fn usnet_rr_server(
    app: &mut App,
    h: SocketHandle,
    a: &TcpPeerOptions,
    wait: Duration,
) -> Res<Value> {
    app.stack().tcp_set_nodelay(h, true)?;
    let mut buf = vec![0u8; a.size];
    let end = Instant::now() + wait;
    let mut n = 0u64;
    while usnet_read_exact(app, h, &mut buf, end)? {
        usnet_write_all(app, h, &buf)?;
        n += 1;
    }
    Ok(json!({"transactions": n, "retransmits": app.retransmits(h)}))
}

fn usnet_rr_client(
    app: &mut App,
    h: SocketHandle,
    a: &TcpPeerOptions,
    wait: Duration,
) -> Res<Value> {
    app.stack().tcp_set_nodelay(h, true)?;
    let mut req = vec![0u8; a.size];
    let mut resp = vec![0u8; a.size];
    let mut lat = Vec::with_capacity(1 << 20);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(a.seconds);
    let limit = t0 + wait;
    while Instant::now() < end {
        let tag = lat.len() as u8;
        req.iter_mut().for_each(|b| *b = tag);
        let t = Instant::now();
        usnet_write_all(app, h, &req)?;
        if !usnet_read_exact(app, h, &mut resp, limit)? {
            return Err("EOF in the middle of a transaction".into());
        }
        lat.push(t.elapsed().as_nanos() as f64 / 1e3);
        if resp != req {
            return Err("echo differs from the request".into());
        }
    }
    let w = t0.elapsed().as_secs_f64();
    app.stack().tcp_shutdown_write(h)?;
    let mut b = [0u8; 64];
    app.until(wait, "the server's EOF", |s| {
        would_block(s.tcp_recv(h, &mut b)).map(|r| (r == Some(0)).then_some(()))
    })?;
    let n = lat.len();
    let (p50, p99) = lat_summary(&mut lat);
    Ok(
        json!({"transactions": n, "window_s": w, "p50_us": p50, "p99_us": p99, "retransmits": app.retransmits(h)}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_fill_and_check_agree() {
        for stride in [8usize, 1024] {
            let mut b = vec![0u8; 4 * stride];
            stamp_fill(&mut b, 8 * stride as u64, stride);
            let off = 8 * stride as u64;
            assert_eq!(stamp_check(&b, off, stride), None);
            // Any split of the buffer checks the same.
            for cut in [1usize, 3, 7, 9, stride + 5] {
                assert_eq!(stamp_check(&b[..cut], off, stride), None);
                assert_eq!(stamp_check(&b[cut..], off + cut as u64, stride), None);
            }
            b[stride + 2] ^= 1;
            assert_eq!(stamp_check(&b, off, stride), Some(off + stride as u64 + 2));
            assert!(stamp_check(&b, off + stride as u64, stride).is_some());
        }
    }
}
