//! `usnet bench udp`: one sender and one receiver process exchanging 64- and 1472-byte
//! UDP datagrams. usnet over the shm link against Linux UDP over loopback (plain
//! send/recv, and sendmmsg/recvmmsg); as root also usnet on real links against Linux
//! at the other end (AF_XDP and AF_PACKET on a veth pair between two namespaces, and
//! TAP), beside Linux↔Linux over the same veth pair, in the same run. Packets/s at the
//! receiver and loss; medians over several runs; table, JSON and plot.
//!
//! Each usnet peer is an application with the stack linked in and driven from its own
//! loop (the sans-IO core plus the device, no threads, no locks), which is how a
//! latency- or rate-critical usnet application runs. The sender is pinned to one core
//! and the receiver to the other, for usnet and Linux alike. Linux ends on real links
//! use sendmmsg/recvmmsg, the fastest the kernel offers a plain socket.

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_driver::{Driver, SystemClock};
use usnet_link::{Device, LinkOptions, LinkSpec, LinkState};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{bar_plot_runs, median, write_json, Bar, Table};
use usnet_stack::{mac_from_seed, Stack, StackConfig, StackError};

use crate::peer::{emit, Peer, PeerSpec, PEER_READY};
use crate::tcp::{enter_netns, ip, is_root, Veth, VETH_ADDR, VETH_USNET};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Options of `usnet bench udp` (the CLI owns the flags).
#[derive(Debug, Clone)]
pub struct UdpBenchOptions {
    /// Directory for udp.json, udp.md and udp.png.
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    pub runs: usize,
    /// Seconds the sender sends per run.
    pub seconds: f64,
    /// Datagram payload sizes.
    pub sizes: Vec<usize>,
    /// One short run per configuration (for CI smoke tests).
    pub quick: bool,
    /// Only these configurations (short names: usnet-shm, linux-lo, linux-lo-mmsg,
    /// linux-veth, usnet-tap-tx, usnet-tap-rx, usnet-afp-tx, usnet-afp-rx,
    /// usnet-xdp-tx, usnet-xdp-rx); empty: all that can run.
    pub only: Vec<String>,
    /// Skip the configurations that need root even when root.
    pub no_root: bool,
}

impl Default for UdpBenchOptions {
    fn default() -> Self {
        UdpBenchOptions {
            out: PathBuf::from("bench-out/udp"),
            runs: 3,
            seconds: 2.0,
            sizes: vec![64, 1472],
            quick: false,
            only: Vec::new(),
            no_root: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Role {
    UsnetRx,
    UsnetTx,
    LinuxRx,
    LinuxTx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LinuxMode {
    Plain,
    Mmsg,
}

/// One end of a run, in a child process (see [`crate::peer`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UdpPeerOptions {
    pub role: Role,
    pub mode: LinuxMode,
    pub size: usize,
    pub seconds: f64,
    /// usnet: the link ("shm:NAME", "tap:NAME", "xdp:IF", "afpacket:IF").
    pub link: Option<String>,
    /// This end's address (usnet: its stack's; Linux: where it binds).
    pub addr: String,
    /// Sender: the receiver's address and port.
    pub target: Option<String>,
    /// TAP: the Linux side's address (CIDR).
    pub host_addr: Option<String>,
    /// Run in this network namespace.
    pub netns: Option<String>,
    pub core: Option<usize>,
}

const BATCH: usize = 64;
/// The receiver stops after this much silence once data has flowed.
const IDLE_END: Duration = Duration::from_millis(300);
/// A usnet receiver's port.
const PORT: u16 = 9000;
const SHM_ADDR: [&str; 2] = ["10.88.0.1", "10.88.0.2"];
const TAP_HOST: &str = "10.91.0.1";
const TAP_USNET: &str = "10.91.0.2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Usnet,
    LinuxPlain,
    LinuxMmsg,
    /// Linux → Linux across the veth pair (sendmmsg/recvmmsg).
    LinuxVeth,
    /// usnet sends to Linux over TAP; Linux sends to usnet over TAP.
    UsnetTapTx,
    UsnetTapRx,
    /// usnet on the first namespace's veth end (AF_PACKET / AF_XDP), Linux in the
    /// second namespace.
    UsnetAfpTx,
    UsnetAfpRx,
    UsnetXdpTx,
    UsnetXdpRx,
}

impl System {
    const ALL: [System; 10] = [
        System::Usnet,
        System::LinuxPlain,
        System::LinuxMmsg,
        System::LinuxVeth,
        System::UsnetTapTx,
        System::UsnetTapRx,
        System::UsnetAfpTx,
        System::UsnetAfpRx,
        System::UsnetXdpTx,
        System::UsnetXdpRx,
    ];

    fn label(self) -> &'static str {
        match self {
            System::Usnet => "usnet shm",
            System::LinuxPlain => "Linux loopback send/recv",
            System::LinuxMmsg => "Linux loopback sendmmsg/recvmmsg",
            System::LinuxVeth => "Linux→Linux veth (mmsg)",
            System::UsnetTapTx => "usnet→Linux TAP",
            System::UsnetTapRx => "Linux→usnet TAP",
            System::UsnetAfpTx => "usnet→Linux AF_PACKET (veth)",
            System::UsnetAfpRx => "Linux→usnet AF_PACKET (veth)",
            System::UsnetXdpTx => "usnet→Linux AF_XDP (veth)",
            System::UsnetXdpRx => "Linux→usnet AF_XDP (veth)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            System::Usnet => "usnet-shm",
            System::LinuxPlain => "linux-lo",
            System::LinuxMmsg => "linux-lo-mmsg",
            System::LinuxVeth => "linux-veth",
            System::UsnetTapTx => "usnet-tap-tx",
            System::UsnetTapRx => "usnet-tap-rx",
            System::UsnetAfpTx => "usnet-afp-tx",
            System::UsnetAfpRx => "usnet-afp-rx",
            System::UsnetXdpTx => "usnet-xdp-tx",
            System::UsnetXdpRx => "usnet-xdp-rx",
        }
    }

    fn needs_root(self) -> bool {
        !matches!(self, System::Usnet | System::LinuxPlain | System::LinuxMmsg)
    }

    fn on_veth(self) -> bool {
        matches!(
            self,
            System::LinuxVeth
                | System::UsnetAfpTx
                | System::UsnetAfpRx
                | System::UsnetXdpTx
                | System::UsnetXdpRx
        )
    }

    /// The Linux configuration over the same path, for the "× Linux same path" column.
    fn linux_same_path(self) -> Option<System> {
        match self {
            System::Usnet => Some(System::LinuxMmsg),
            System::UsnetAfpTx | System::UsnetAfpRx | System::UsnetXdpTx | System::UsnetXdpRx => {
                Some(System::LinuxVeth)
            }
            _ => None,
        }
    }
}

struct RunResult {
    sent: u64,
    received: u64,
    pps: f64,
}

pub fn run(a: &UdpBenchOptions) -> Res<ExitCode> {
    let (runs, seconds) = if a.quick {
        (1, 0.5)
    } else {
        (a.runs.max(1), a.seconds)
    };
    let root = is_root() && !a.no_root;
    crate::check_only(&a.only, &System::ALL.map(|s| s.short().to_string()))?;
    let wanted = |s: System| a.only.is_empty() || a.only.iter().any(|o| o == s.short());
    let mut notes = Vec::new();
    if !root && System::ALL.iter().any(|&s| s.needs_root() && wanted(s)) {
        notes.push("not root (or --no-root): only usnet shm vs Linux loopback".to_string());
    }
    let veth = if root && System::ALL.iter().any(|&s| s.on_veth() && wanted(s)) {
        match Veth::create() {
            Ok(v) => Some(v),
            Err(e) => {
                notes.push(format!(
                    "veth pair unavailable ({e}): veth configurations skipped"
                ));
                None
            }
        }
    } else {
        None
    };
    let systems: Vec<System> = System::ALL
        .into_iter()
        .filter(|&s| wanted(s) && (!s.needs_root() || root) && (!s.on_veth() || veth.is_some()))
        .collect();
    let net = Net {
        ns: veth.as_ref().map(|v| v.ns.clone()),
        veth_dev: veth.as_ref().map(|v| v.dev[0].clone()),
    };
    let total = (a.sizes.len() * systems.len() * runs) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:40} [{bar:30}] {pos}/{len}")
            .expect("template")
            .progress_chars("=> "),
    );
    let mut results: Vec<(usize, System, Vec<RunResult>)> = Vec::new();
    for &size in &a.sizes {
        if !(1..=1472).contains(&size) {
            return Err(format!("size {size}: use 1..=1472 (one frame)").into());
        }
        for &sys in &systems {
            let mut rs = Vec::new();
            for _ in 0..runs {
                bar.set_message(format!("{} {size} B", sys.label()));
                rs.push(one_run(sys, size, seconds, &net)?);
                bar.inc(1);
            }
            results.push((size, sys, rs));
        }
    }
    bar.finish_and_clear();
    drop(veth);

    let mut t = Table::new(
        format!(
            "UDP packets/s, one sender and one receiver process (median of {runs} × {seconds} s)"
        ),
        [
            "size",
            "system",
            "packets/s",
            "× Linux send/recv",
            "× Linux same path",
            "loss",
            "runs (packets/s)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut json_rows = Vec::new();
    let mut bars = Vec::new();
    for &size in &a.sizes {
        let base = med_pps(&results, size, System::LinuxPlain);
        for (s, sys, rs) in results.iter().filter(|r| r.0 == size) {
            let pps = med_pps(&results, *s, *sys);
            let same = sys
                .linux_same_path()
                .map(|l| med_pps(&results, size, l))
                .filter(|&l| l > 0.0);
            let sent: u64 = rs.iter().map(|r| r.sent).sum();
            let recv: u64 = rs.iter().map(|r| r.received).sum();
            let loss = if sent > 0 {
                1.0 - recv as f64 / sent as f64
            } else {
                0.0
            };
            let ratio = |b: f64| if b > 0.0 { Some(pps / b) } else { None };
            let show = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}"));
            t.row(vec![
                format!("{size} B"),
                sys.label().into(),
                format!("{:.0}", pps),
                show(ratio(base)),
                show(same.map(|l| pps / l)),
                format!("{:.2}%", loss.max(0.0) * 100.0),
                rs.iter()
                    .map(|r| format!("{:.0}", r.pps))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
            let mut bar = Bar::new(
                format!("{} {size}B", sys.short()),
                rs.iter().map(|r| r.pps).collect(),
            );
            bar.baseline = ratio(base).map(|_| base);
            bars.push(bar);
            json_rows.push(json!({
                "size": size, "system": sys.label(), "short": sys.short(), "median_pps": pps,
                "ratio_vs_linux_plain": ratio(base),
                "ratio_vs_linux_same_path": same.map(|l| pps / l),
                "loss": loss.max(0.0),
                "runs": rs.iter().map(|r| json!({"sent": r.sent, "received": r.received, "pps": r.pps})).collect::<Vec<_>>(),
            }));
        }
    }
    t.print();
    for n in &notes {
        println!("note: {n}");
    }
    std::fs::create_dir_all(&a.out)?;
    write_json(
        &a.out.join("udp.json"),
        &json!({"benchmark": "udp", "runs": runs, "seconds": seconds, "cpus": crate::cpus(),
                "notes": notes, "results": json_rows}),
    )?;
    std::fs::write(a.out.join("udp.md"), t.to_markdown())?;
    bar_plot_runs(
        &a.out.join("udp.png"),
        "UDP packets/s at the receiver (median, min–max, ratio to plain Linux)",
        "packets/s",
        &bars,
    )?;
    println!(
        "wrote {0}/udp.json, {0}/udp.md, {0}/udp.png",
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn med_pps(results: &[(usize, System, Vec<RunResult>)], size: usize, sys: System) -> f64 {
    let mut v: Vec<f64> = results
        .iter()
        .filter(|r| r.0 == size && r.1 == sys)
        .flat_map(|r| r.2.iter().map(|x| x.pps))
        .collect();
    if v.is_empty() {
        0.0
    } else {
        median(&mut v)
    }
}

/// Where the link configurations run.
struct Net {
    /// The veth pair's namespaces.
    ns: Option<[String; 2]>,
    /// The veth end in `ns[0]`.
    veth_dev: Option<String>,
}

fn peer(role: Role, mode: LinuxMode, size: usize, seconds: f64, core: usize) -> UdpPeerOptions {
    UdpPeerOptions {
        role,
        mode,
        size,
        seconds,
        link: None,
        addr: "127.0.0.1".into(),
        target: None,
        host_addr: None,
        netns: None,
        core: (crate::cpus() >= 2).then_some(core),
    }
}

/// The receiver's and the sender's options (the sender's target is filled in once the
/// receiver has told its port).
type Ends = (UdpPeerOptions, UdpPeerOptions);

fn ends(sys: System, size: usize, seconds: f64, net: &Net) -> Res<Ends> {
    use {LinuxMode::*, Role::*};
    let p = |role, mode, core| peer(role, mode, size, seconds, core);
    let pid = std::process::id();
    let ns = |i: usize| -> Res<Option<String>> {
        Ok(Some(net.ns.as_ref().ok_or("no veth")?[i].clone()))
    };
    let on_veth = |kind: &str, role| -> Res<UdpPeerOptions> {
        let dev = net.veth_dev.as_deref().ok_or("no veth")?;
        Ok(UdpPeerOptions {
            link: Some(format!("{kind}:{dev}")),
            addr: VETH_USNET.into(),
            netns: ns(0)?,
            ..p(role, Plain, if role == UsnetRx { 1 } else { 0 })
        })
    };
    let linux_b = |role| -> Res<UdpPeerOptions> {
        Ok(UdpPeerOptions {
            addr: VETH_ADDR[1].into(),
            netns: ns(1)?,
            ..p(role, Mmsg, if role == LinuxRx { 1 } else { 0 })
        })
    };
    let tap = || UdpPeerOptions {
        link: Some(format!("tap:usnbu{}", pid % 100_000)),
        addr: TAP_USNET.into(),
        host_addr: Some(format!("{TAP_HOST}/24")),
        ..p(UsnetRx, Plain, 0)
    };
    Ok(match sys {
        System::Usnet => {
            let link = Some(format!("shm:bench-udp-{pid}"));
            (
                UdpPeerOptions {
                    link: link.clone(),
                    addr: SHM_ADDR[1].into(),
                    ..p(UsnetRx, Plain, 1)
                },
                UdpPeerOptions {
                    link,
                    addr: SHM_ADDR[0].into(),
                    ..p(UsnetTx, Plain, 0)
                },
            )
        }
        System::LinuxPlain => (p(LinuxRx, Plain, 1), p(LinuxTx, Plain, 0)),
        System::LinuxMmsg => (p(LinuxRx, Mmsg, 1), p(LinuxTx, Mmsg, 0)),
        System::LinuxVeth => (
            linux_b(LinuxRx)?,
            UdpPeerOptions {
                addr: VETH_ADDR[0].into(),
                netns: ns(0)?,
                ..p(LinuxTx, Mmsg, 0)
            },
        ),
        System::UsnetTapTx => (
            // The TAP (and its host address) appears only when the usnet sender opens
            // it: bind to any address; the sender aims at the host address.
            UdpPeerOptions {
                addr: "0.0.0.0".into(),
                target: Some(TAP_HOST.into()),
                ..p(LinuxRx, Mmsg, 1)
            },
            UdpPeerOptions {
                core: (crate::cpus() >= 2).then_some(0),
                role: UsnetTx,
                ..tap()
            },
        ),
        System::UsnetTapRx => (
            UdpPeerOptions {
                core: (crate::cpus() >= 2).then_some(1),
                ..tap()
            },
            UdpPeerOptions {
                addr: TAP_HOST.into(),
                ..p(LinuxTx, Mmsg, 0)
            },
        ),
        System::UsnetAfpTx => (linux_b(LinuxRx)?, on_veth("afpacket", UsnetTx)?),
        System::UsnetAfpRx => (on_veth("afpacket", UsnetRx)?, linux_b(LinuxTx)?),
        System::UsnetXdpTx => (linux_b(LinuxRx)?, on_veth("xdp", UsnetTx)?),
        System::UsnetXdpRx => (on_veth("xdp", UsnetRx)?, linux_b(LinuxTx)?),
    })
}

fn one_run(sys: System, size: usize, seconds: f64, net: &Net) -> Res<RunResult> {
    if let (Some(ns), true) = (&net.ns, sys.on_veth()) {
        // Every usnet end is a new process with a new MAC: forget the previous one's,
        // or the Linux end keeps sending to it until its neighbour entry goes stale.
        ip(&["-n", &ns[1], "neigh", "flush", "to", VETH_USNET])?;
    }
    let (rx_opts, mut tx_opts) = ends(sys, size, seconds, net)?;
    let mut rx = Peer::spawn(&PeerSpec::Udp(rx_opts.clone()))?;
    let ready = rx.read(PEER_READY)?;
    if let Some(e) = ready["error"].as_str() {
        return Err(format!("{}: receiver: {e}", sys.label()).into());
    }
    let port = ready["port"].as_u64().ok_or("receiver sent no port")?;
    // A receiver bound to any address names where to send (in its `target`).
    let rx_ip = rx_opts.target.as_deref().unwrap_or(&rx_opts.addr);
    tx_opts.target = Some(format!("{rx_ip}:{port}"));
    let mut tx = Peer::spawn(&PeerSpec::Udp(tx_opts))?;
    let result = Duration::from_secs_f64(seconds) + PEER_READY;
    let txr = tx.read(result)?;
    let rxr = rx.read(result)?;
    tx.finish(Duration::from_secs(10))?;
    rx.finish(Duration::from_secs(10))?;
    for (end, v) in [("sender", &txr), ("receiver", &rxr)] {
        if let Some(e) = v["error"].as_str() {
            return Err(format!("{}: {end}: {e}", sys.label()).into());
        }
    }
    let received = rxr["received"].as_u64().unwrap_or(0);
    let window = rxr["window_s"].as_f64().unwrap_or(0.0);
    Ok(RunResult {
        sent: txr["sent"].as_u64().unwrap_or(0),
        received,
        pps: if window > 0.0 {
            received as f64 / window
        } else {
            0.0
        },
    })
}

/// Entry point of a child process.
pub fn run_peer(a: &UdpPeerOptions) -> Res<ExitCode> {
    if let Some(ns) = &a.netns {
        enter_netns(ns)?;
    }
    if let Some(c) = a.core {
        crate::pin_to_core(c);
    }
    let r = match a.role {
        Role::LinuxRx => linux_rx(a),
        Role::LinuxTx => linux_tx(a),
        Role::UsnetRx => usnet_rx(a),
        Role::UsnetTx => usnet_tx(a),
    };
    match r {
        Ok(v) => emit(&v),
        Err(e) => emit(&json!({"error": e.to_string()})),
    }
    Ok(ExitCode::SUCCESS)
}

// ------------------------------------------------------------------ Linux

fn linux_rx(a: &UdpPeerOptions) -> Res<Value> {
    let sock = StdUdp::bind((a.addr.as_str(), 0))?;
    emit(&json!({"ready": true, "port": sock.local_addr()?.port()}));
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let fd = sock.as_raw_fd();
    let mut bufs = vec![[0u8; 2048]; BATCH];
    let (mut received, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
    loop {
        let n = match a.mode {
            LinuxMode::Plain => match sock.recv(&mut bufs[0]) {
                Ok(_) => 1,
                Err(e) if is_timeout(&e) => 0,
                Err(e) => return Err(e.into()),
            },
            LinuxMode::Mmsg => recvmmsg(fd, &mut bufs)?,
        };
        if n == 0 {
            if first.is_some() {
                break;
            }
            return Err("no datagram arrived".into());
        }
        if first.is_none() {
            first = Some(Instant::now());
            sock.set_read_timeout(Some(IDLE_END))?;
        }
        received += n as u64;
        last = Instant::now();
    }
    let window = last.duration_since(first.expect("data seen")).as_secs_f64();
    Ok(json!({"received": received, "window_s": window}))
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn recvmmsg(fd: i32, bufs: &mut [[u8; 2048]]) -> Res<usize> {
    let mut iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
    let mut msgs: Vec<libc::mmsghdr> = (0..bufs.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: msgs and their iovecs point into live buffers of the given lengths for
    // the duration of the call; the kernel writes at most that much.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            msgs.len() as u32,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if is_timeout(&e) {
            return Ok(0);
        }
        return Err(e.into());
    }
    Ok(n as usize)
}

fn linux_tx(a: &UdpPeerOptions) -> Res<Value> {
    let to: SocketAddr = a.target.as_deref().ok_or("no target")?.parse()?;
    let sock = StdUdp::bind((a.addr.as_str(), 0))?;
    // Resolve the receiver's MAC first, so the measured stream does not start with
    // datagrams queued (and dropped) behind an ARP request: one datagram to the
    // discard port from another socket (a connected one would see the ICMP error).
    StdUdp::bind((a.addr.as_str(), 0))?.send_to(b"warm-up", SocketAddr::new(to.ip(), 9))?;
    std::thread::sleep(Duration::from_millis(50));
    sock.connect(to)?;
    let payload = vec![0x5au8; a.size];
    let fd = sock.as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut _,
        iov_len: payload.len(),
    };
    // SAFETY: plain data, filled below.
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    for m in msgs.iter_mut() {
        m.msg_hdr.msg_iov = &mut iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut sent = 0u64;
    while Instant::now() < end {
        match a.mode {
            LinuxMode::Plain => {
                for _ in 0..BATCH {
                    // ECONNREFUSED can't happen while the receiver lives; ENOBUFS is loss.
                    if sock.send(&payload).is_ok() {
                        sent += 1;
                    }
                }
            }
            LinuxMode::Mmsg => {
                // SAFETY: every header points at the one live payload iovec.
                let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), BATCH as u32, 0) };
                if n > 0 {
                    sent += n as u64;
                }
            }
        }
    }
    Ok(json!({"sent": sent}))
}

// ------------------------------------------------------------------ usnet

/// A usnet application on the peer's link: its stack and device, driven from this loop.
fn usnet_app(a: &UdpPeerOptions, seed: u64) -> Res<Driver<Box<dyn Device>>> {
    let link: LinkSpec = a.link.as_deref().ok_or("no link")?.parse()?;
    let addr: usnet_stack::IpCidr = format!("{}/24", a.addr).parse()?;
    let mac = mac_from_seed(seed ^ (std::process::id() as u64) << 8);
    let dev = usnet_link::open(
        &link,
        &LinkOptions {
            tap_host_addrs: a.host_addr.iter().cloned().collect(),
            mac: Some(mac.0),
            addrs: vec![addr.addr],
            ..LinkOptions::default()
        },
    )?;
    let caps = dev.caps();
    let stack = Stack::new(StackConfig {
        rx_csum_offload: caps.rx_csum_offload,
        tx_csum_offload: caps.tx_csum_offload,
        mac,
        mtu: caps.mtu,
        addrs: vec![addr],
        // 2048-byte buffers: one frame each, and AF_XDP's UMEM chunk size.
        pool: PoolConfig {
            buf_size: 2048,
            count: 8192,
            headroom: DEFAULT_HEADROOM,
            backing: Backing::Anonymous,
        },
        input_queue_len: 4096,
        udp_recv_buffer: 4 << 20,
        seed,
        ..StackConfig::default()
    })?;
    let mut d = Driver::new(stack, dev, SystemClock::new());
    d.bind_device()?;
    d.set_burst(BATCH);
    Ok(d)
}

fn usnet_rx(a: &UdpPeerOptions) -> Res<Value> {
    let mut d = usnet_app(a, 2)?;
    let sock = d
        .stack_mut()
        .udp_bind(SocketAddr::new(a.addr.parse()?, PORT))?;
    emit(&json!({"ready": true, "port": PORT}));
    let t0 = Instant::now();
    let mut buf = vec![0u8; 2048];
    let (mut received, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
    let give_up = t0 + Duration::from_secs(20);
    loop {
        let n = d.turn()?.received;
        let mut got = 0;
        while d.stack_mut().udp_recv_from(sock, &mut buf).is_ok() {
            got += 1;
        }
        if got > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            received += got;
        }
        if n == 0 && got == 0 {
            let now = Instant::now();
            if first.is_some() && (now - last > IDLE_END || d.link_state() == LinkState::Down) {
                break;
            }
            if now > give_up {
                return Err("no datagram arrived".into());
            }
            d.wait(Duration::from_millis(1))?;
        }
    }
    let window = last.duration_since(first.expect("data seen")).as_secs_f64();
    let c = d.stack().counters();
    Ok(json!({
        "received": received, "window_s": window,
        "drop1": c.drop_input_queue_full, "drop2": c.udp_rx_queue_full,
        "bad_checksum": c.udp_rx_bad_checksum,
    }))
}

fn usnet_tx(a: &UdpPeerOptions) -> Res<Value> {
    let mut d = usnet_app(a, 1)?;
    let sock = d.stack_mut().udp_bind("0.0.0.0:0".parse()?)?;
    let dst: SocketAddr = a.target.as_deref().ok_or("no target")?.parse()?;
    let t0 = Instant::now();
    // Resolve the receiver's MAC first (a ping), so timing starts with a warm path.
    let ping = d.stack_mut().ping_open();
    let mut seq = 0;
    let mut next_ping = t0;
    while d.stack_mut().ping_recv(ping).is_err() {
        if Instant::now() >= next_ping {
            seq += 1;
            d.stack_mut().ping_send(ping, dst.ip(), seq, b"resolve")?;
            next_ping = Instant::now() + Duration::from_millis(200);
        }
        d.turn()?;
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("receiver did not answer".into());
        }
    }
    let payload = vec![0x5au8; a.size];
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut sent = 0u64;
    while Instant::now() < end {
        let s = d.stack_mut();
        for _ in 0..BATCH {
            match s.udp_send_to(sock, &payload, dst) {
                Ok(_) => sent += 1,
                Err(StackError::WouldBlock) => break,
                Err(e) => return Err(e.into()),
            }
        }
        d.turn()?;
    }
    // Let the queued tail drain into the ring.
    let drain_end = Instant::now() + Duration::from_secs(2);
    while d.stack().tx_len() > 0 && Instant::now() < drain_end {
        d.turn()?;
    }
    Ok(json!({"sent": sent}))
}
