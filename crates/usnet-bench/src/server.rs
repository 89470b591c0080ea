//! `usnet bench server`: the source document's client/server study (rump kernel),
//! redone for the usnet stack server. `write_server` keeps writing `size`-byte buffers
//! to `read_client`, which reads with the same size and reports the throughput; the
//! buffer size goes from 1 KiB to 64 KiB. Each application runs over one of:
//!
//! - **linux**: the kernel's sockets;
//! - **server**: `usnet-client`, a client process of a `usnet up` stack server (the
//!   shared-memory ring transport);
//! - **in-process**: `usnet-runtime`, the stack linked into the application (the
//!   reference the server must match), with the configuration `usnet up` builds;
//! - **rpc**: `usnet-rpc`, the rump-style baseline (a Unix-socket round trip per call
//!   and per copy request of MCLNUM clusters of MCLBYTES), at MCLBYTES 2048 and 4096 ×
//!   MCLNUM 1, 4, 8, 16.
//!
//! Configurations: Linux↔Linux over a veth pair between two network namespaces (the
//! document's native–native); one side usnet ↔ Linux on the host side of a TAP (send:
//! the usnet application writes; receive: it reads), for server, in-process and rpc;
//! usnet on both sides over the shm link (two stack servers, or two in-process
//! stacks). Every application is its own process (the bench's peers), every stack
//! server a `usnet up` child. The stream carries an 8-byte stamp at every KiB, checked
//! by the reader, and both ends' byte counts must agree.
//!
//! Also the cost of one call: 64-byte request/response round trips (an echo server
//! thread and a client thread in one process) through the stack server's own address,
//! in-process, and over Linux loopback.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_link::{LinkOptions, LinkSpec};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_report::{line_plot, median, percentile, write_json, Series, Table};
use usnet_stack::{mac_from_seed, StackConfig};

use crate::peer::{emit, Peer, PeerSpec, PEER_READY};
use crate::tcp::{enter_netns, is_root, stamp_check, stamp_fill, Veth, STRIDE, VETH_ADDR};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const TAP_HOST: &str = "10.94.0.1";
const TAP_USNET: &str = "10.94.0.2";
const SHM_ADDR: [&str; 2] = ["10.95.0.1", "10.95.0.2"];
const PORT: u16 = 9100;
/// Pool of every usnet stack in the study (servers and in-process alike): 64 KiB
/// buffers (one TSO frame or one jumbo shm frame each).
const BUF_SIZE: usize = 65536;
const BUFFERS: u32 = 2048;

/// Options of `usnet bench server` (the CLI owns the flags).
#[derive(Debug, Clone)]
pub struct ServerBenchOptions {
    /// Directory for server.json, server.md and the plots.
    pub out: PathBuf,
    /// Buffer sizes (write and read size of the applications).
    pub sizes: Vec<usize>,
    /// Runs per point (the median is reported).
    pub runs: usize,
    /// Seconds per run.
    pub seconds: f64,
    /// Seconds per rpc run (they are slow and many).
    pub rpc_seconds: f64,
    /// Request/response transactions per run.
    pub transactions: usize,
    /// Run the rpc study.
    pub rpc: bool,
    /// Only configurations whose label contains one of these (all when empty).
    pub only: Vec<String>,
}

impl Default for ServerBenchOptions {
    fn default() -> Self {
        ServerBenchOptions {
            out: PathBuf::from("bench-results"),
            sizes: vec![1024, 4096, 16384, 65536],
            runs: 5,
            seconds: 1.0,
            rpc_seconds: 0.5,
            transactions: 20_000,
            rpc: true,
            only: Vec::new(),
        }
    }
}

// ------------------------------------------------------------------ peers

/// Which socket implementation an application uses.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Transport {
    Linux,
    /// A client of the stack server named `stack`.
    Server {
        stack: String,
    },
    /// The rpc baseline to the stack server named `stack`.
    Rpc {
        stack: String,
        mclbytes: usize,
        mclnum: usize,
    },
    /// A stack in the process on `link` (`cidr` its address).
    InProcess {
        link: String,
        cidr: String,
        host_cidr: Option<String>,
        mtu: Option<usize>,
    },
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub enum Role {
    WriteServer,
    ReadClient,
    /// An echo thread and a client thread in one process (64-byte round trips).
    RoundTrip,
}

/// What one application process does.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AppOptions {
    pub role: Role,
    pub transport: Transport,
    pub size: usize,
    pub seconds: f64,
    pub transactions: usize,
    /// Listen address (write server, round trip) or the one to connect to.
    pub addr: String,
    pub netns: Option<String>,
}

/// A connected stream of any transport.
trait Conn: Send {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    fn shutdown_write(&mut self) -> io::Result<()>;
}

macro_rules! conn_impl {
    ($t:ty) => {
        impl Conn for $t {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                Read::read(self, buf)
            }
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                Write::write(self, buf)
            }
            fn shutdown_write(&mut self) -> io::Result<()> {
                self.shutdown(std::net::Shutdown::Write)
            }
        }
    };
}
conn_impl!(StdStream);
conn_impl!(usnet_client::TcpStream);
conn_impl!(usnet_runtime::TcpStream);
conn_impl!(usnet_rpc::RpcStream);

fn write_all(c: &mut dyn Conn, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match c.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_exact(c: &mut dyn Conn, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match c.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An application's view of its network.
enum Net {
    Linux,
    Server(usnet_client::Client),
    Rpc(usnet_rpc::RpcClient),
    InProcess(usnet_runtime::NetStack),
}

enum Listener {
    Linux(StdListener),
    Server(usnet_client::TcpListener),
    Rpc(usnet_rpc::RpcListener),
    InProcess(usnet_runtime::TcpListener),
}

/// The configuration `usnet up --buf-size BUF_SIZE --buffers BUFFERS` builds (see
/// `usnet up`'s `open`): the in-process reference runs the stack the server runs.
fn inprocess_config(cidr: &str, mtu: Option<usize>) -> Res<StackConfig> {
    let seed = std::process::id() as u64;
    Ok(StackConfig {
        mac: mac_from_seed(seed),
        addrs: vec![cidr.parse()?],
        mtu: mtu.unwrap_or(65535),
        pool: PoolConfig {
            buf_size: BUF_SIZE,
            count: BUFFERS,
            headroom: DEFAULT_HEADROOM,
            backing: Backing::Memfd,
        },
        seed,
        ..StackConfig::default()
    })
}

impl Net {
    fn open(t: &Transport) -> Res<Net> {
        Ok(match t {
            Transport::Linux => Net::Linux,
            Transport::Server { stack } => Net::Server(usnet_client::Client::attach(stack)?),
            Transport::Rpc {
                stack,
                mclbytes,
                mclnum,
            } => Net::Rpc(usnet_rpc::RpcClient::connect(
                Some(stack),
                usnet_rpc::Clusters {
                    bytes: *mclbytes,
                    count: *mclnum,
                },
            )?),
            Transport::InProcess {
                link,
                cidr,
                host_cidr,
                mtu,
            } => {
                let spec: LinkSpec = link.parse()?;
                let dev = usnet_link::open(
                    &spec,
                    &LinkOptions {
                        mtu: *mtu,
                        tap_host_addrs: host_cidr.iter().cloned().collect(),
                        tso: true,
                        ..LinkOptions::default()
                    },
                )?;
                let net = usnet_runtime::NetStack::start(
                    dev,
                    inprocess_config(cidr, *mtu)?,
                    usnet_runtime::RuntimeConfig::default(),
                )?;
                Net::InProcess(net)
            }
        })
    }

    fn listen(&self, addr: SocketAddr) -> Res<Listener> {
        Ok(match self {
            Net::Linux => {
                let l = StdListener::bind(addr)?;
                l.set_nonblocking(true)?;
                Listener::Linux(l)
            }
            Net::Server(c) => {
                let l = usnet_client::TcpListener::bind(c, addr)?;
                l.set_nonblocking(true)?;
                Listener::Server(l)
            }
            Net::Rpc(c) => Listener::Rpc(c.tcp_listen(addr, 16)?),
            Net::InProcess(n) => {
                let mut l = usnet_runtime::TcpListener::bind(n, addr)?;
                l.set_nonblocking(true)?;
                Listener::InProcess(l)
            }
        })
    }

    /// Connects, retrying refusals (the listener may be a moment late) until `end`.
    fn connect(&self, addr: SocketAddr, idle: Duration, end: Instant) -> Res<Box<dyn Conn>> {
        loop {
            let r: io::Result<Box<dyn Conn>> = match self {
                Net::Linux => {
                    StdStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|s| {
                        s.set_read_timeout(Some(idle))?;
                        s.set_write_timeout(Some(idle))?;
                        s.set_nodelay(true)?;
                        Ok(Box::new(s) as Box<dyn Conn>)
                    })
                }
                Net::Server(c) => {
                    usnet_client::TcpStream::connect_timeout(c, addr, Duration::from_secs(5))
                        .and_then(|s| {
                            s.set_read_timeout(Some(idle))?;
                            s.set_write_timeout(Some(idle))?;
                            s.set_nodelay(true)?;
                            Ok(Box::new(s) as Box<dyn Conn>)
                        })
                }
                Net::Rpc(c) => c.tcp_connect(addr).map(|s| Box::new(s) as Box<dyn Conn>),
                Net::InProcess(n) => {
                    usnet_runtime::TcpStream::connect_timeout(n, addr, Duration::from_secs(5))
                        .and_then(|mut s| {
                            s.set_read_timeout(Some(idle))?;
                            s.set_write_timeout(Some(idle))?;
                            s.set_nodelay(true)?;
                            Ok(Box::new(s) as Box<dyn Conn>)
                        })
                }
            };
            match r {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() < end && e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(format!("connect {addr}: {e}").into()),
            }
        }
    }
}

impl Listener {
    /// One connection, waiting at most until `end`.
    fn accept(&self, idle: Duration, end: Instant) -> Res<Box<dyn Conn>> {
        loop {
            let r: io::Result<Box<dyn Conn>> = match self {
                Listener::Linux(l) => l.accept().and_then(|(s, _)| {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(idle))?;
                    s.set_write_timeout(Some(idle))?;
                    s.set_nodelay(true)?;
                    Ok(Box::new(s) as Box<dyn Conn>)
                }),
                Listener::Server(l) => l.accept().and_then(|(s, _)| {
                    s.set_read_timeout(Some(idle))?;
                    s.set_write_timeout(Some(idle))?;
                    s.set_nodelay(true)?;
                    Ok(Box::new(s) as Box<dyn Conn>)
                }),
                // The proxy blocks until a connection comes; the rpc call's own
                // deadline bounds the wait.
                Listener::Rpc(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Conn>),
                Listener::InProcess(l) => l.accept().and_then(|(mut s, _)| {
                    s.set_nonblocking(false)?;
                    s.set_read_timeout(Some(idle))?;
                    s.set_write_timeout(Some(idle))?;
                    s.set_nodelay(true)?;
                    Ok(Box::new(s) as Box<dyn Conn>)
                }),
            };
            match r {
                Ok(c) => return Ok(c),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < end => {
                    std::thread::sleep(Duration::from_micros(500));
                }
                Err(e) => return Err(format!("accept: {e}").into()),
            }
        }
    }
}

/// Entry point of an application process.
pub fn run_app(a: &AppOptions) -> Res<ExitCode> {
    if let Some(ns) = &a.netns {
        enter_netns(ns)?;
    }
    let r = Net::open(&a.transport).and_then(|net| {
        let v = match a.role {
            Role::WriteServer => write_server(&net, a),
            Role::ReadClient => read_client(&net, a),
            Role::RoundTrip => round_trip(&net, a),
        };
        // An in-process stack's poll thread holds its link until stopped; left to
        // the process's exit, the last end out never closes a shm link (its file
        // would stay in /dev/shm).
        if let Net::InProcess(n) = &net {
            n.shutdown();
        }
        v
    });
    match r {
        Ok(v) => emit(&v),
        Err(e) => emit(&json!({"error": e.to_string()})),
    }
    Ok(ExitCode::SUCCESS)
}

fn idle(a: &AppOptions) -> Duration {
    Duration::from_secs_f64(a.seconds + 15.0)
}

/// Keeps writing `size`-byte buffers (stamped) for `seconds`, then ends the stream.
fn write_server(net: &Net, a: &AppOptions) -> Res<Value> {
    let l = net.listen(a.addr.parse()?)?;
    emit(&json!({"ready": true}));
    let mut c = l.accept(idle(a), Instant::now() + PEER_READY)?;
    let size = a.size.div_ceil(STRIDE) * STRIDE;
    let mut buf = vec![0x5au8; size];
    let mut off = 0u64;
    let t0 = Instant::now();
    let run = Duration::from_secs_f64(a.seconds);
    while t0.elapsed() < run {
        stamp_fill(&mut buf, off, STRIDE);
        write_all(&mut *c, &buf)?;
        off += size as u64;
    }
    c.shutdown_write()?;
    // Wait for the reader's end of stream, so the close does not cut queued bytes.
    let mut scratch = [0u8; 64];
    let _ = c.read(&mut scratch);
    Ok(json!({"bytes": off}))
}

/// Reads until end of stream with `size`-byte reads; checks every stamp; the rate is
/// from the first byte to the end.
fn read_client(net: &Net, a: &AppOptions) -> Res<Value> {
    emit(&json!({"ready": true}));
    let mut c = net.connect(a.addr.parse()?, idle(a), Instant::now() + PEER_READY)?;
    let mut buf = vec![0u8; a.size];
    let mut off = 0u64;
    let mut first = None;
    loop {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        if let Some(bad) = stamp_check(&buf[..n], off, STRIDE) {
            return Err(format!("stream byte {bad} is wrong").into());
        }
        off += n as u64;
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    c.shutdown_write()?;
    Ok(json!({"bytes": off, "seconds": secs}))
}

/// 64-byte (`size`) request/response: an echo thread and a client thread.
fn round_trip(net: &Net, a: &AppOptions) -> Res<Value> {
    let addr: SocketAddr = a.addr.parse()?;
    let l = net.listen(addr)?;
    let size = a.size;
    let idle = idle(a);
    let end = Instant::now() + PEER_READY;
    let lat = std::thread::scope(|sc| -> Res<Vec<f64>> {
        let echo = sc.spawn(move || -> Result<(), String> {
            let mut c = l.accept(idle, end).map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; size];
            loop {
                match read_exact(&mut *c, &mut buf) {
                    Ok(()) => write_all(&mut *c, &buf).map_err(|e| e.to_string())?,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        });
        let mut c = net.connect(addr, idle, end)?;
        let mut req = vec![0u8; size];
        let mut resp = vec![0u8; size];
        let mut lat = Vec::with_capacity(a.transactions);
        for i in 0..a.transactions + a.transactions / 10 {
            req[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let t = Instant::now();
            write_all(&mut *c, &req)?;
            read_exact(&mut *c, &mut resp)?;
            // The first tenth warms up.
            if i >= a.transactions / 10 {
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
            if resp != req {
                return Err("echo differs".into());
            }
        }
        c.shutdown_write()?;
        drop(c);
        // The echo thread ends at our end of stream; its reads have a deadline.
        echo.join().map_err(|_| "echo thread panicked")??;
        Ok(lat)
    })?;
    let mut lat = lat;
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok(json!({"p50_us": percentile(&lat, 50.0), "p99_us": percentile(&lat, 99.0)}))
}

// ------------------------------------------------------------------ the study

/// A stack server child (`usnet up`), stopped when dropped.
struct StackServer {
    child: Child,
    name: String,
}

impl StackServer {
    fn start(name: &str, args: &[&str]) -> Res<StackServer> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args([
            "up",
            "--name",
            name,
            "--services",
            "none",
            "--rpc",
            "--quiet",
        ])
        .args(["--buf-size", &BUF_SIZE.to_string()])
        .args(["--buffers", &BUFFERS.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let mut child = cmd.spawn()?;
        // Ready when a client can attach.
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if usnet_client::Client::attach(name).is_ok() {
                break;
            }
            if let Some(st) = child.try_wait()? {
                return Err(format!("usnet up ({name}) exited: {st}").into());
            }
            if Instant::now() > end {
                crate::kill_and_reap(&mut child, Duration::from_secs(5));
                return Err(format!("usnet up ({name}) did not come up").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(StackServer {
            child,
            name: name.into(),
        })
    }
}

impl Drop for StackServer {
    fn drop(&mut self) {
        // SIGTERM: a clean stop (the control socket is removed); then make sure.
        if !crate::stop_child(&mut self.child, Duration::from_secs(5)) {
            eprintln!("usnet up ({}) did not stop; killed", self.name);
        }
    }
}

/// One bulk configuration: who writes, who reads.
#[derive(Clone)]
struct Pair {
    label: String,
    writer: Transport,
    writer_ns: Option<String>,
    reader: Transport,
    reader_ns: Option<String>,
    /// The address the writer listens on.
    listen: String,
    /// The address the reader connects to.
    connect: String,
}

/// One bulk run: bits/s at the reader, and the machine's CPU per GB over the run
/// (user and kernel seconds, every core: nothing in this bench is pinned).
fn bulk(p: &Pair, size: usize, seconds: f64) -> Res<(f64, Option<(f64, f64)>)> {
    let spec = |role, transport: &Transport, ns: &Option<String>| {
        PeerSpec::App(AppOptions {
            role,
            transport: transport.clone(),
            size,
            seconds,
            transactions: 0,
            addr: if role == Role::WriteServer {
                p.listen.clone()
            } else {
                p.connect.clone()
            },
            netns: ns.clone(),
        })
    };
    let before = crate::cpu::sample_machine();
    let mut w = Peer::spawn(&spec(Role::WriteServer, &p.writer, &p.writer_ns))?;
    ready(&mut w, "write_server")?;
    let mut r = Peer::spawn(&spec(Role::ReadClient, &p.reader, &p.reader_ns))?;
    ready(&mut r, "read_client")?;
    let deadline = PEER_READY + Duration::from_secs_f64(seconds * 4.0 + 10.0);
    let rv = r.read(deadline)?;
    let wv = w.read(deadline)?;
    let used = before.and_then(|b| crate::cpu::sample_like(&b).map(|a| b.until(&a)));
    for v in [&rv, &wv] {
        if let Some(e) = v["error"].as_str() {
            return Err(format!("{}: {e}", p.label).into());
        }
    }
    let (got, sent) = (
        rv["bytes"].as_u64().unwrap_or(0),
        wv["bytes"].as_u64().unwrap_or(1),
    );
    if got != sent {
        return Err(format!("{}: read {got} bytes of {sent}", p.label).into());
    }
    r.finish(Duration::from_secs(10))?;
    w.finish(Duration::from_secs(10))?;
    let secs = rv["seconds"].as_f64().unwrap_or(0.0);
    let bps = if secs > 0.0 {
        got as f64 * 8.0 / secs
    } else {
        0.0
    };
    Ok((bps, used.map(|u| u.per_total(got as f64 / 1e9))))
}

fn ready(p: &mut Peer, what: &str) -> Res<()> {
    let v = p.read(PEER_READY)?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("{what}: {e}").into());
    }
    Ok(())
}

fn round_trip_p50(transport: &Transport, addr: &str, o: &ServerBenchOptions) -> Res<(f64, f64)> {
    let mut p = Peer::spawn(&PeerSpec::App(AppOptions {
        role: Role::RoundTrip,
        transport: transport.clone(),
        size: 64,
        seconds: 0.0,
        transactions: o.transactions,
        addr: addr.into(),
        netns: None,
    }))?;
    let v = p.read(PEER_READY + Duration::from_secs(60))?;
    if let Some(e) = v["error"].as_str() {
        return Err(e.to_string().into());
    }
    p.finish(Duration::from_secs(10))?;
    Ok((
        v["p50_us"].as_f64().unwrap_or(f64::NAN),
        v["p99_us"].as_f64().unwrap_or(f64::NAN),
    ))
}

/// One configuration's points: (buffer size, median Gbit/s, every run's Gbit/s,
/// the median machine CPU s/GB, user and kernel).
type Points = Vec<(usize, f64, Vec<f64>, Option<(f64, f64)>)>;

/// Medians of `runs` bulk runs per size (Gbit/s); a failed run is reported and
/// counted out.
fn series(p: &Pair, o: &ServerBenchOptions, seconds: f64) -> Points {
    let mut out = Vec::new();
    if !o.only.is_empty() && !o.only.iter().any(|w| p.label.contains(w.as_str())) {
        return out;
    }
    for &size in &o.sizes {
        let mut runs = Vec::new();
        let mut cpu = Vec::new();
        for _ in 0..o.runs {
            match bulk(p, size, seconds) {
                Ok((bps, used)) => {
                    runs.push(bps / 1e9);
                    cpu.extend(used);
                }
                Err(e) => eprintln!("  {} at {} B: {e}", p.label, size),
            }
        }
        let cpu = crate::cpu::median_pair(cpu);
        let m = if runs.is_empty() {
            f64::NAN
        } else {
            median(&mut runs.clone())
        };
        eprintln!("  {:<34} {:>6} B  {:>8.3} Gbit/s", p.label, size, m);
        out.push((size, m, runs, cpu));
    }
    out
}

pub fn run(o: &ServerBenchOptions) -> Res<ExitCode> {
    crate::check_min("runs", o.runs as u64, 1)?;
    for &s in &o.sizes {
        crate::check_min("sizes", s as u64, 1)?;
    }
    std::fs::create_dir_all(&o.out)?;
    let pid = std::process::id();
    let root = is_root();
    let mut results: Vec<(String, Points)> = Vec::new();
    let mut rr: Vec<(String, f64, f64)> = Vec::new();
    let linux_addr = |a: &str| format!("{a}:{PORT}");

    // Linux ↔ Linux over veth (the document's native–native).
    if root {
        let v = Veth::create()?;
        let p = Pair {
            label: "Linux↔Linux veth".into(),
            writer: Transport::Linux,
            writer_ns: Some(v.ns[0].clone()),
            reader: Transport::Linux,
            reader_ns: Some(v.ns[1].clone()),
            listen: linux_addr(VETH_ADDR[0]),
            connect: linux_addr(VETH_ADDR[0]),
        };
        results.push((p.label.clone(), series(&p, o, o.seconds)));
    } else {
        eprintln!("not root: no veth or TAP configurations (only usnet over shm)");
    }
    match round_trip_p50(&Transport::Linux, "127.0.0.1:9190", o) {
        Ok((p50, p99)) => rr.push(("Linux loopback".into(), p50, p99)),
        Err(e) => eprintln!("  rr Linux loopback: {e}"),
    }

    // One side usnet ↔ Linux on a TAP: first in-process (the application owns the
    // TAP), then the stack server on the same TAP.
    if root {
        let tap = format!("usnbs{}", pid % 100_000);
        let inproc = Transport::InProcess {
            link: format!("tap:{tap}"),
            cidr: format!("{TAP_USNET}/24"),
            host_cidr: Some(format!("{TAP_HOST}/24")),
            mtu: None,
        };
        for pair in one_side("in-process", &inproc) {
            results.push((pair.label.clone(), series(&pair, o, o.seconds)));
        }
        match round_trip_p50(&inproc, &linux_addr(TAP_USNET), o) {
            Ok((p50, p99)) => rr.push(("usnet in-process".into(), p50, p99)),
            Err(e) => eprintln!("  rr in-process: {e}"),
        }
        let name = format!("usnb-tap-{pid}");
        let _srv = StackServer::start(
            &name,
            &[
                "--link",
                &format!("tap:{tap}"),
                "--addr",
                &format!("{TAP_USNET}/24"),
                "--host-addr",
                &format!("{TAP_HOST}/24"),
            ],
        )?;
        let server = Transport::Server {
            stack: name.clone(),
        };
        for pair in one_side("server", &server) {
            results.push((pair.label.clone(), series(&pair, o, o.seconds)));
        }
        match round_trip_p50(&server, &linux_addr(TAP_USNET), o) {
            Ok((p50, p99)) => rr.push(("usnet server".into(), p50, p99)),
            Err(e) => eprintln!("  rr server: {e}"),
        }
        if o.rpc {
            for mclbytes in [2048, 4096] {
                for mclnum in [1, 4, 8, 16] {
                    let t = Transport::Rpc {
                        stack: name.clone(),
                        mclbytes,
                        mclnum,
                    };
                    let what = format!("rpc {mclbytes}×{mclnum}");
                    for pair in one_side(&what, &t) {
                        results.push((pair.label.clone(), series(&pair, o, o.rpc_seconds)));
                    }
                }
            }
        }
    }

    // usnet on both sides over the shm link: two in-process stacks, then two servers.
    let shm = format!("usnbs-{pid}");
    let shm_mtu = crate::tcp::SHM_MTU;
    let ends: Vec<Transport> = (0..2)
        .map(|i| Transport::InProcess {
            link: format!("shm:{shm}"),
            cidr: format!("{}/24", SHM_ADDR[i]),
            host_cidr: None,
            mtu: Some(shm_mtu),
        })
        .collect();
    let p = Pair {
        label: "in-process↔in-process shm".into(),
        writer: ends[0].clone(),
        writer_ns: None,
        reader: ends[1].clone(),
        reader_ns: None,
        listen: linux_addr(SHM_ADDR[0]),
        connect: linux_addr(SHM_ADDR[0]),
    };
    results.push((p.label.clone(), series(&p, o, o.seconds)));
    {
        let names = [format!("usnb-shm-a-{pid}"), format!("usnb-shm-b-{pid}")];
        let mtu = shm_mtu.to_string();
        let mut servers = Vec::new();
        for i in 0..2 {
            servers.push(StackServer::start(
                &names[i],
                &[
                    "--link",
                    &format!("shm:{shm}-srv"),
                    "--addr",
                    &format!("{}/24", SHM_ADDR[i]),
                    "--mtu",
                    &mtu,
                ],
            )?);
        }
        let p = Pair {
            label: "server↔server shm".into(),
            writer: Transport::Server {
                stack: names[0].clone(),
            },
            writer_ns: None,
            reader: Transport::Server {
                stack: names[1].clone(),
            },
            reader_ns: None,
            listen: linux_addr(SHM_ADDR[0]),
            connect: linux_addr(SHM_ADDR[0]),
        };
        results.push((p.label.clone(), series(&p, o, o.seconds)));
    }

    report(o, &results, &rr)
}

/// The send (usnet writes) and receive (usnet reads) pairs of a transport against
/// Linux on the TAP's host side.
fn one_side(what: &str, t: &Transport) -> [Pair; 2] {
    [
        Pair {
            label: format!("{what}→Linux TAP"),
            writer: t.clone(),
            writer_ns: None,
            reader: Transport::Linux,
            reader_ns: None,
            listen: format!("{TAP_USNET}:{PORT}"),
            connect: format!("{TAP_USNET}:{PORT}"),
        },
        Pair {
            label: format!("Linux→{what} TAP"),
            writer: Transport::Linux,
            writer_ns: None,
            reader: t.clone(),
            reader_ns: None,
            // The TAP may not exist yet (an in-process reader opens it): listen on
            // every address.
            listen: format!("0.0.0.0:{PORT}"),
            connect: format!("{TAP_HOST}:{PORT}"),
        },
    ]
}

fn human(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} B")
    }
}

fn report(
    o: &ServerBenchOptions,
    results: &[(String, Points)],
    rr: &[(String, f64, f64)],
) -> Res<ExitCode> {
    let get = |label: &str, size: usize| -> f64 {
        results
            .iter()
            .find(|(l, _)| l == label)
            .and_then(|(_, s)| s.iter().find(|p| p.0 == size))
            .map_or(f64::NAN, |p| p.1)
    };
    let native = "Linux↔Linux veth";
    let mut t = Table::new(
        "usnet bench server: write_server → read_client, Gbit/s (median)",
        vec![
            "configuration".into(),
            "buffer".into(),
            "Gbit/s".into(),
            "× native".into(),
            "machine CPU s/GB (user/kernel)".into(),
            "runs".into(),
        ],
    );
    for (label, s) in results {
        for (size, m, runs, cpu) in s {
            t.row(vec![
                label.clone(),
                human(*size),
                format!("{m:.3}"),
                format!("{:.2}", m / get(native, *size)),
                crate::cpu::pair_cell(*cpu, 3),
                runs.iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
        }
    }
    t.print();
    let mut rt = Table::new(
        "64-byte request/response",
        vec![
            "path".into(),
            "p50 µs".into(),
            "p99 µs".into(),
            "p50 × in-process".into(),
            "p50 × Linux loopback".into(),
        ],
    );
    let rr_of = |l: &str| rr.iter().find(|r| r.0 == l).map_or(f64::NAN, |r| r.1);
    for (l, p50, p99) in rr {
        rt.row(vec![
            l.clone(),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{:.2}", p50 / rr_of("usnet in-process")),
            format!("{:.2}", p50 / rr_of("Linux loopback")),
        ]);
    }
    rt.print();

    // Goals.
    let mut goals: Vec<(String, bool)> = Vec::new();
    let mut check = |what: String, ratio: f64, target: f64| {
        let met = ratio >= target;
        goals.push((format!("{what}: {ratio:.2}× (goal ≥ {target}×)"), met));
    };
    for &size in &o.sizes {
        let h = human(size);
        for (srv, inp) in [
            ("server→Linux TAP", "in-process→Linux TAP"),
            ("Linux→server TAP", "Linux→in-process TAP"),
            ("server↔server shm", "in-process↔in-process shm"),
        ] {
            let r = get(srv, size) / get(inp, size);
            if r.is_finite() {
                check(format!("{h}: {srv} vs {inp}"), r, 0.9);
            }
        }
        for srv in ["server→Linux TAP", "Linux→server TAP", "server↔server shm"] {
            let r = get(srv, size) / get(native, size);
            if r.is_finite() {
                check(format!("{h}: {srv} vs {native}"), r, 1.0);
            }
        }
        for (srv, rpc) in [
            ("server→Linux TAP", "rpc 2048×1→Linux TAP"),
            ("Linux→server TAP", "Linux→rpc 2048×1 TAP"),
        ] {
            let r = get(srv, size) / get(rpc, size);
            if r.is_finite() {
                check(format!("{h}: {srv} vs {rpc}"), r, 5.0);
            }
        }
    }
    // The document's study: the mean over buffer sizes of each geometry against the
    // default (2048×1), per direction.
    let mean = |label: &str| -> f64 {
        let v: Vec<f64> = o.sizes.iter().map(|&s| get(label, s)).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let mut study = Vec::new();
    let mut st = Table::new(
        "rpc baseline: MCLBYTES × MCLNUM, mean over buffer sizes, vs 2048×1",
        vec![
            "MCLBYTES×MCLNUM".into(),
            "send Gbit/s".into(),
            "send change".into(),
            "receive Gbit/s".into(),
            "receive change".into(),
        ],
    );
    if o.rpc {
        let base = (mean("rpc 2048×1→Linux TAP"), mean("Linux→rpc 2048×1 TAP"));
        for mclbytes in [2048, 4096] {
            for mclnum in [1, 4, 8, 16] {
                let s = mean(&format!("rpc {mclbytes}×{mclnum}→Linux TAP"));
                let r = mean(&format!("Linux→rpc {mclbytes}×{mclnum} TAP"));
                let (ds, dr) = (100.0 * (s / base.0 - 1.0), 100.0 * (r / base.1 - 1.0));
                st.row(vec![
                    format!("{mclbytes}×{mclnum}"),
                    format!("{s:.3}"),
                    format!("{ds:+.1} %"),
                    format!("{r:.3}"),
                    format!("{dr:+.1} %"),
                ]);
                study.push(json!({"mclbytes": mclbytes, "mclnum": mclnum,
                    "send_gbps": s, "send_change_pct": ds, "recv_gbps": r, "recv_change_pct": dr}));
            }
        }
        st.print();
    }
    for (g, met) in &goals {
        println!("- goal {}: {g}", if *met { "met" } else { "NOT met" });
    }

    let json_results: Vec<Value> = results
        .iter()
        .map(|(l, s)| {
            json!({"configuration": l, "points": s.iter().map(|(size, m, runs, cpu)| json!({
                "size": size, "gbps_median": m, "gbps_runs": runs,
                "machine_cpu_s_per_gb": cpu,
            })).collect::<Vec<_>>()})
        })
        .collect();
    write_json(
        &o.out.join("server.json"),
        &json!({
            "bench": "server",
            "runs": o.runs, "seconds": o.seconds, "rpc_seconds": o.rpc_seconds,
            "buf_size": BUF_SIZE, "buffers": BUFFERS,
            "results": json_results,
            "round_trip_64b": rr.iter().map(|(l, p50, p99)| json!({"path": l, "p50_us": p50, "p99_us": p99})).collect::<Vec<_>>(),
            "rpc_study": study,
            "goals": goals.iter().map(|(g, m)| json!({"goal": g, "met": m})).collect::<Vec<_>>(),
        }),
    )?;
    let mut md = t.to_markdown();
    md += "\n";
    md += &rt.to_markdown();
    if o.rpc {
        md += "\n";
        md += &st.to_markdown();
    }
    md += "\n";
    for (g, met) in &goals {
        md += &format!("- goal {}: {g}\n", if *met { "met" } else { "NOT met" });
    }
    std::fs::write(o.out.join("server.md"), md)?;
    let lines: Vec<Series> = results
        .iter()
        .filter(|(l, _)| !l.starts_with("rpc") && !l.starts_with("Linux→rpc"))
        .map(|(l, s)| {
            Series::new(
                l.clone(),
                s.iter()
                    .filter(|p| p.1.is_finite())
                    .map(|p| ((p.0 / 1024) as f64, p.1))
                    .collect(),
            )
        })
        .collect();
    line_plot(
        &o.out.join("server.png"),
        "write_server → read_client",
        "buffer size (KiB)",
        "Gbit/s",
        &lines,
        true,
    )?;
    if o.rpc {
        let rpc_lines: Vec<Series> = results
            .iter()
            .filter(|(l, _)| l.contains("rpc") || l.contains("server"))
            .map(|(l, s)| {
                Series::new(
                    l.clone(),
                    s.iter()
                        .filter(|p| p.1.is_finite())
                        .map(|p| ((p.0 / 1024) as f64, p.1))
                        .collect(),
                )
            })
            .collect();
        line_plot(
            &o.out.join("server-rpc.png"),
            "ring transport vs the rpc baseline (MCLBYTES×MCLNUM)",
            "buffer size (KiB)",
            "Gbit/s",
            &rpc_lines,
            true,
        )?;
    }
    println!(
        "wrote {}, server.md, server.png",
        o.out.join("server.json").display()
    );
    Ok(ExitCode::SUCCESS)
}
