//! `usnet bench udp`: one sender and one receiver process exchanging 64- and 1472-byte
//! UDP datagrams, usnet over the shm link against Linux UDP over loopback (plain
//! send/recv, and sendmmsg/recvmmsg), in the same run. Packets/s at the receiver and
//! loss; medians over several runs; table, JSON and plot.
//!
//! Each usnet peer is an application with the stack linked in and driven from its own
//! loop (the sans-IO core plus the shm device, no threads, no locks), which is how a
//! latency- or rate-critical usnet application runs. The sender is pinned to one core
//! and the receiver to the other, for usnet and Linux alike.

use std::net::{SocketAddr, UdpSocket as StdUdp};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_driver::{Driver, SystemClock};
use usnet_link::shm::{ShmConfig, ShmDevice};
use usnet_link::{Device, LinkState};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{bar_plot, median, write_json, Table};
use usnet_stack::{mac_from_seed, Stack, StackConfig, StackError};

use crate::peer::{emit, Peer, PeerSpec, PEER_READY};

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
}

impl Default for UdpBenchOptions {
    fn default() -> Self {
        UdpBenchOptions {
            out: PathBuf::from("bench-out/udp"),
            runs: 3,
            seconds: 2.0,
            sizes: vec![64, 1472],
            quick: false,
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
    /// shm link name (usnet) or the receiver's port (Linux).
    pub target: String,
    pub core: Option<usize>,
}

const BATCH: usize = 64;
/// The receiver stops after this much silence once data has flowed.
const IDLE_END: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Usnet,
    LinuxPlain,
    LinuxMmsg,
}

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Usnet => "usnet shm",
            System::LinuxPlain => "Linux loopback send/recv",
            System::LinuxMmsg => "Linux loopback sendmmsg/recvmmsg",
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
    let systems = [System::Usnet, System::LinuxPlain, System::LinuxMmsg];
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
        for sys in systems {
            let mut rs = Vec::new();
            for _ in 0..runs {
                bar.set_message(format!("{} {size} B", sys.label()));
                rs.push(one_run(sys, size, seconds)?);
                bar.inc(1);
            }
            results.push((size, sys, rs));
        }
    }
    bar.finish_and_clear();

    let mut t = Table::new(
        format!(
            "UDP packets/s, one sender and one receiver process (median of {runs} × {seconds} s)"
        ),
        [
            "size",
            "system",
            "packets/s",
            "× Linux send/recv",
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
            let sent: u64 = rs.iter().map(|r| r.sent).sum();
            let recv: u64 = rs.iter().map(|r| r.received).sum();
            let loss = if sent > 0 {
                1.0 - recv as f64 / sent as f64
            } else {
                0.0
            };
            t.row(vec![
                format!("{size} B"),
                sys.label().into(),
                format!("{:.0}", pps),
                format!("{:.2}", pps / base),
                format!("{:.2}%", loss.max(0.0) * 100.0),
                rs.iter()
                    .map(|r| format!("{:.0}", r.pps))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
            bars.push((format!("{} {size}B", short(*sys)), pps));
            json_rows.push(json!({
                "size": size, "system": sys.label(), "median_pps": pps,
                "ratio_vs_linux_plain": pps / base, "loss": loss.max(0.0),
                "runs": rs.iter().map(|r| json!({"sent": r.sent, "received": r.received, "pps": r.pps})).collect::<Vec<_>>(),
            }));
        }
    }
    t.print();
    std::fs::create_dir_all(&a.out)?;
    write_json(
        &a.out.join("udp.json"),
        &json!({"benchmark": "udp", "runs": runs, "seconds": seconds, "cpus": crate::cpus(), "results": json_rows}),
    )?;
    std::fs::write(a.out.join("udp.md"), t.to_markdown())?;
    bar_plot(
        &a.out.join("udp.png"),
        "UDP packets/s at the receiver (median)",
        "packets/s",
        &bars,
    )?;
    println!(
        "wrote {0}/udp.json, {0}/udp.md, {0}/udp.png",
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn short(s: System) -> &'static str {
    match s {
        System::Usnet => "usnet",
        System::LinuxPlain => "linux",
        System::LinuxMmsg => "linux-mmsg",
    }
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

fn peer(
    role: Role,
    mode: LinuxMode,
    size: usize,
    seconds: f64,
    target: &str,
    core: usize,
) -> PeerSpec {
    PeerSpec::Udp(UdpPeerOptions {
        role,
        mode,
        size,
        seconds,
        target: target.to_string(),
        core: (crate::cpus() >= 2).then_some(core),
    })
}

fn one_run(sys: System, size: usize, seconds: f64) -> Res<RunResult> {
    let (rx_role, tx_role, mode) = match sys {
        System::Usnet => (Role::UsnetRx, Role::UsnetTx, LinuxMode::Plain),
        System::LinuxPlain => (Role::LinuxRx, Role::LinuxTx, LinuxMode::Plain),
        System::LinuxMmsg => (Role::LinuxRx, Role::LinuxTx, LinuxMode::Mmsg),
    };
    let tag = format!("bench-udp-{}", std::process::id());
    let mut rx = Peer::spawn(&peer(rx_role, mode, size, seconds, &tag, 1))?;
    let ready = rx.read(PEER_READY)?;
    let target = match sys {
        System::Usnet => tag,
        _ => ready["port"]
            .as_u64()
            .ok_or("receiver sent no port")?
            .to_string(),
    };
    let mut tx = Peer::spawn(&peer(tx_role, mode, size, seconds, &target, 0))?;
    let result = Duration::from_secs_f64(seconds) + PEER_READY;
    let txr = tx.read(result)?;
    let rxr = rx.read(result)?;
    tx.finish(Duration::from_secs(10))?;
    rx.finish(Duration::from_secs(10))?;
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
    if let Some(c) = a.core {
        crate::pin_to_core(c);
    }
    let v = match a.role {
        Role::LinuxRx => linux_rx(a)?,
        Role::LinuxTx => linux_tx(a)?,
        Role::UsnetRx => usnet_rx(a)?,
        Role::UsnetTx => usnet_tx(a)?,
    };
    emit(&v);
    Ok(ExitCode::SUCCESS)
}

// ------------------------------------------------------------------ Linux

fn linux_rx(a: &UdpPeerOptions) -> Res<Value> {
    let sock = StdUdp::bind("127.0.0.1:0")?;
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
    let port: u16 = a.target.parse()?;
    let sock = StdUdp::bind("127.0.0.1:0")?;
    sock.connect(("127.0.0.1", port))?;
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

const RX_ADDR: &str = "10.88.0.2";
const PORT: u16 = 9000;

fn bench_stack(addr: &str, seed: u64, dev: &ShmDevice) -> Res<Stack> {
    let caps = dev.caps();
    Ok(Stack::new(StackConfig {
        rx_csum_offload: caps.rx_csum_offload,
        tx_csum_offload: caps.tx_csum_offload,
        mac: mac_from_seed(seed),
        addrs: vec![format!("{addr}/24").parse()?],
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
    })?)
}

fn usnet_rx(a: &UdpPeerOptions) -> Res<Value> {
    let dev = ShmDevice::open(&a.target, &ShmConfig::default())?;
    let stack = bench_stack(RX_ADDR, 2, &dev)?;
    let mut d = Driver::new(stack, dev, SystemClock::new());
    d.set_burst(BATCH);
    let sock = d
        .stack_mut()
        .udp_bind(SocketAddr::new(RX_ADDR.parse()?, PORT))?;
    emit(&json!({"ready": true}));
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
    let dev = ShmDevice::open(&a.target, &ShmConfig::default())?;
    let stack = bench_stack("10.88.0.1", 1, &dev)?;
    let mut d = Driver::new(stack, dev, SystemClock::new());
    d.set_burst(BATCH);
    let sock = d.stack_mut().udp_bind("0.0.0.0:0".parse()?)?;
    let dst = SocketAddr::new(RX_ADDR.parse()?, PORT);
    let t0 = Instant::now();
    // Resolve the receiver's MAC first (a ping), so timing starts with a warm path.
    let ping = d.stack_mut().ping_open();
    d.stack_mut().ping_send(ping, dst.ip(), 1, b"resolve")?;
    while d.stack_mut().ping_recv(ping).is_err() {
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
