//! `usnet bench soak`: everything at once through one stack server over a faulty
//! link, for minutes, while client processes are killed and one scribbles on its own
//! session (issue 27).
//!
//! One `usnet up` on a TAP into a network namespace, with the fault link (1 % loss,
//! 1 % duplication, 1 % reordering, seeded). At once: nginx under the shim served by
//! wrk; redis under the shim with redis-benchmark; iperf3 under the shim, one stream
//! to it and one from it (`-R`); usnet client processes (this executable as a
//! benchmark peer) sending seeded streams to a verifier in the namespace, which checks
//! every byte and answers with a seeded stream the client checks; a usnet client
//! process sending UDP datagrams (sequence number, seeded payload, checksum) to an
//! echo in the namespace and checking what comes back; and a client process that
//! scribbles garbage on its own session (`usnet_server::hostile`). Every
//! `--kill-every` seconds one of the client processes (the programs under the shim
//! included) is SIGKILLed and started again.
//!
//! At the end, with every client gone, it checks that no payload byte was wrong, that
//! no client waited past its deadline, that the pool, the socket table and the
//! server's descriptors are back at their baseline and its RSS within a tolerance of
//! it, and that the byte and datagram counts agree; a failed check fails the run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_report::{line_plot, write_json, Series, Table};
use usnet_session::ctl::msg::{Request, Stat};

use crate::peer::{emit, PeerSpec, PEER_ENV};
use crate::tcp::{enter_netns, ip, is_root};
use crate::web::{
    in_ns, need_tools, nginx_conf, parse_wrk, spawn, start_stack_server, wait_port, wait_serving,
    Bg, Res,
};

/// Options of `usnet bench soak` (the CLI owns the flags).
#[derive(Debug, Clone)]
pub struct SoakBenchOptions {
    /// Directory for soak.json, soak.md and soak.png.
    pub out: PathBuf,
    /// How long the load runs.
    pub seconds: f64,
    /// Seeds the fault link, the streams and the choice of victims.
    pub seed: u64,
    /// Seconds between two kills.
    pub kill_every: f64,
}

impl Default for SoakBenchOptions {
    fn default() -> Self {
        SoakBenchOptions {
            out: PathBuf::from("bench-out/soak"),
            seconds: 120.0,
            seed: 1,
            kill_every: 10.0,
        }
    }
}

const STACK: &str = "bench-soak";
const HOST: &str = "10.96.0.1";
const USNET: &str = "10.96.0.2";
const HTTP_PORT: u16 = 8090;
const REDIS_PORT: u16 = 6391;
/// iperf3 servers under the shim: one receives, one sends (`-R`).
const IPERF_UP: u16 = 5291;
const IPERF_DOWN: u16 = 5292;
const VERIFY_PORT: u16 = 9300;
const ECHO_PORT: u16 = 9301;
/// The deadline of one client operation (a connect, a read, a write). A segment
/// lost three times in a row on the 1 % link costs 0.2 + 0.4 + 0.8 + 1.6 s of
/// backoff; a SYN lost twice 1 + 2 s; 20 s is far beyond any of that (a loss of
/// the same segment five times running is 1 in 10^10).
const OP_DEADLINE: Duration = Duration::from_secs(20);
/// How long the end may take to settle: the server's orphaned connections close
/// (TIME_WAIT is 60 s) before the socket table can be compared.
const SETTLE: Duration = Duration::from_secs(150);
/// When the RSS baseline is taken: TIME_WAIT's length (60 s), or half the run if
/// that is shorter. Until then the connections in TIME_WAIT, and with them the socket
/// table, grow with the run; after it they are at their steady state.
const WARM_UP: Duration = Duration::from_secs(60);
/// The fault link.
const FAULT: &str = "drop=0.01,dup=0.01,reorder=0.01";
/// Stream header magic ("usnsoak1"): a connection without it is not a stream.
const MAGIC: u64 = 0x3161_6f73_6e73_7375;
/// Mixed into a stream's id for the answer.
const REPLY: u64 = 0x5245_504c_5900_0000;
/// Datagrams per UDP batch.
const BATCH: u64 = 32;

/// Every process the bench started, killed by the overall deadline's watchdog.
static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

// ------------------------------------------------------------------ streams

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bytes `off..off + buf.len()` of stream `id`.
fn fill(id: u64, off: u64, buf: &mut [u8]) {
    let (mut p, mut i) = (off, 0);
    while i < buf.len() {
        let w = mix(id ^ (p >> 3).wrapping_mul(0x100_0000_01b3)).to_le_bytes();
        let k = (p & 7) as usize;
        let n = (8 - k).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[k..k + n]);
        i += n;
        p += n as u64;
    }
}

/// How many bytes of `got` (stream `id` from `off`) are wrong.
fn wrong(id: u64, off: u64, got: &[u8], scratch: &mut Vec<u8>) -> u64 {
    scratch.resize(got.len(), 0);
    fill(id, off, scratch);
    got.iter()
        .zip(scratch.iter())
        .filter(|(a, b)| a != b)
        .count() as u64
}

/// FNV-1a, 32 bits: the datagrams' checksum.
fn fnv(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

/// A datagram: sequence number, length, `len` bytes of stream `seq`, checksum.
fn datagram(seq: u64, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; 10 + len + 4];
    d[..8].copy_from_slice(&seq.to_le_bytes());
    d[8..10].copy_from_slice(&(len as u16).to_le_bytes());
    fill(seq, 0, &mut d[10..10 + len]);
    let c = fnv(&d[..10 + len]);
    d[10 + len..].copy_from_slice(&c.to_le_bytes());
    d
}

/// A datagram's sequence number if its checksum holds.
fn datagram_seq(d: &[u8]) -> Option<u64> {
    if d.len() < 14 {
        return None;
    }
    let len = u16::from_le_bytes([d[8], d[9]]) as usize;
    if d.len() != 10 + len + 4 {
        return None;
    }
    let c = u32::from_le_bytes(d[10 + len..].try_into().ok()?);
    (fnv(&d[..10 + len]) == c).then(|| u64::from_le_bytes(d[..8].try_into().unwrap()))
}

// ------------------------------------------------------------------ client processes

/// What a client process of the soak does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Role {
    /// Seeded streams to the verifier, each checked both ways.
    Stream,
    /// UDP batches to the echo, each datagram checked on return.
    Udp,
    /// Garbage on its own session.
    Scribbler,
}

/// One client process (a benchmark peer).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChildOptions {
    pub role: Role,
    pub stack: String,
    /// Distinct per process: seeds its stream ids and sequence numbers.
    pub seed: u64,
}

fn is_deadline(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Entry point of a client process; reports are JSON lines on stdout.
pub fn run_child(o: &ChildOptions) -> Res<ExitCode> {
    match o.role {
        Role::Stream => child_stream(o),
        Role::Udp => child_udp(o),
        Role::Scribbler => child_scribbler(o),
    }
}

/// Reads exactly `buf.len()` bytes (end of stream is an error).
fn read_full(s: &mut impl Read, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match s.read(buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn child_stream(o: &ChildOptions) -> Res<ExitCode> {
    let net = usnet_client::Client::attach(&o.stack)?;
    let to: SocketAddr = format!("{HOST}:{VERIFY_PORT}").parse()?;
    emit(&json!({"kind": "ready"}));
    let mut scratch = Vec::new();
    for n in 0u64.. {
        if !net.is_alive() {
            return Err("the stack server cut this client off".into());
        }
        let id = mix(o.seed ^ mix(n));
        let len = 64 * 1024 + id % (1536 * 1024);
        let t0 = Instant::now();
        let mut step = "connect";
        let r = (|| -> std::io::Result<(u64, u64)> {
            let mut s = usnet_client::TcpStream::connect_timeout(&net, to, OP_DEADLINE)?;
            s.set_read_timeout(Some(OP_DEADLINE))?;
            s.set_write_timeout(Some(OP_DEADLINE))?;
            step = "write";
            let mut head = [0u8; 24];
            head[..8].copy_from_slice(&MAGIC.to_le_bytes());
            head[8..16].copy_from_slice(&id.to_le_bytes());
            head[16..].copy_from_slice(&len.to_le_bytes());
            s.write_all(&head)?;
            let mut buf = vec![0u8; 16384];
            let mut off = 0u64;
            while off < len {
                let k = (len - off).min(buf.len() as u64) as usize;
                fill(id, off, &mut buf[..k]);
                s.write_all(&buf[..k])?;
                off += k as u64;
            }
            step = "read";
            let mut ans = [0u8; 16];
            read_full(&mut s, &mut ans)?;
            let peer_bad = u64::from_le_bytes(ans[..8].try_into().unwrap());
            let back = u64::from_le_bytes(ans[8..].try_into().unwrap());
            let (mut got, mut bad) = (0u64, 0u64);
            while got < back {
                let k = (back - got).min(buf.len() as u64) as usize;
                let m = s.read(&mut buf[..k])?;
                if m == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                bad += wrong(id ^ REPLY, got, &buf[..m], &mut scratch);
                got += m as u64;
            }
            // The verifier closes first (its side keeps TIME_WAIT).
            step = "close";
            if s.read(&mut buf)? != 0 {
                return Err(std::io::Error::other("bytes after the answer"));
            }
            Ok((peer_bad, bad))
        })();
        match r {
            Ok((peer_bad, bad)) => emit(&json!({"kind": "stream", "id": id, "sent": len,
                "back": len / 4, "bad": bad, "peer_bad": peer_bad,
                "ms": t0.elapsed().as_secs_f64() * 1e3})),
            Err(e) if is_deadline(&e) => emit(&json!({"kind": "miss", "op": step, "id": id,
                "ms": t0.elapsed().as_secs_f64() * 1e3})),
            Err(e) => {
                emit(&json!({"kind": "error", "op": step, "id": id, "error": e.to_string()}));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn child_udp(o: &ChildOptions) -> Res<ExitCode> {
    let net = usnet_client::Client::attach(&o.stack)?;
    let to: SocketAddr = format!("{HOST}:{ECHO_PORT}").parse()?;
    let s = usnet_client::UdpSocket::bind(&net, "0.0.0.0:0".parse()?)?;
    s.set_write_timeout(Some(OP_DEADLINE))?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    emit(&json!({"kind": "ready"}));
    let mut buf = vec![0u8; 2048];
    let mut scratch = Vec::new();
    // The top 24 bits name this process, the rest the batch and the datagram.
    let tag = (o.seed & 0xff_ffff) << 40;
    for b in 0u64.. {
        if !net.is_alive() {
            return Err("the stack server cut this client off".into());
        }
        let key = tag | (b << 8);
        let mut missed = false;
        for i in 0..BATCH {
            let seq = key | i;
            let len = 16 + (mix(seq) % 1200) as usize;
            match s.send_to(&datagram(seq, len), to) {
                Ok(_) => {}
                Err(e) if is_deadline(&e) => missed = true,
                Err(e) => return Err(e.into()),
            }
        }
        let (mut seen, mut dup, mut late, mut bad) = (0u64, 0u64, 0u64, 0u64);
        let mut echoed = 0u64;
        let end = Instant::now() + Duration::from_millis(1500);
        while echoed < BATCH && Instant::now() < end {
            let n = match s.recv_from(&mut buf) {
                Ok((n, _)) => n,
                Err(e) if is_deadline(&e) => continue,
                Err(e) => return Err(e.into()),
            };
            let d = &buf[..n];
            let Some(seq) = datagram_seq(d) else {
                bad += n as u64;
                continue;
            };
            bad += wrong(seq, 0, &d[10..n - 4], &mut scratch);
            if seq & !0xff != key || seq & 0xff >= BATCH {
                late += 1;
            } else if seen & (1 << (seq & 0xff)) != 0 {
                dup += 1;
            } else {
                seen |= 1 << (seq & 0xff);
                echoed += 1;
            }
        }
        if missed {
            emit(&json!({"kind": "miss", "op": "send", "key": key}));
        }
        emit(
            &json!({"kind": "udp", "key": key, "sent": BATCH, "echoed": echoed,
            "dup": dup, "late": late, "bad": bad}),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn child_scribbler(o: &ChildOptions) -> Res<ExitCode> {
    let mut h = usnet_server::hostile::Hostile::attach(&o.stack, 256, 4096, o.seed)?;
    emit(&json!({"kind": "ready", "session": h.session}));
    // Its binds go to these too: a port of a server that is killed and started
    // again (nginx's, redis's) would be taken by its random binds the moment it is
    // free, and the server could not start again. So its own ports on the stack, and
    // the verifier and the echo across the link.
    let targets: Vec<SocketAddr> = [
        format!("{USNET}:7000"),
        format!("{USNET}:7001"),
        format!("{HOST}:{VERIFY_PORT}"),
        format!("{HOST}:{ECHO_PORT}"),
    ]
    .iter()
    .map(|a| a.parse().expect("an address"))
    .collect();
    for round in 1u64.. {
        if h.cut_off() {
            emit(&json!({"kind": "cut", "rounds": round}));
            return Ok(ExitCode::SUCCESS);
        }
        h.scribble(64, &targets);
        if round.is_multiple_of(500) {
            emit(&json!({"kind": "scribbled", "rounds": 500}));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(ExitCode::SUCCESS)
}

// ------------------------------------------------------------------ the Linux side

/// What the verifier saw of one stream.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    received: u64,
    bad: u64,
    complete: bool,
}

#[derive(Default)]
struct Verifier {
    streams: Mutex<HashMap<u64, Seen>>,
    /// Connections without the magic (the scribbler's, say).
    foreign: AtomicU64,
    /// Streams cut short (their client was killed, or the connection failed).
    cut: AtomicU64,
}

/// The verifier's side of one connection.
fn verify_conn(mut s: StdStream, v: &Verifier) -> std::io::Result<()> {
    s.set_read_timeout(Some(OP_DEADLINE))?;
    s.set_write_timeout(Some(OP_DEADLINE))?;
    let mut head = [0u8; 24];
    read_full(&mut s, &mut head)?;
    if u64::from_le_bytes(head[..8].try_into().unwrap()) != MAGIC {
        v.foreign.fetch_add(1, Relaxed);
        return Ok(());
    }
    let id = u64::from_le_bytes(head[8..16].try_into().unwrap());
    let len = u64::from_le_bytes(head[16..].try_into().unwrap());
    let (mut buf, mut scratch) = (vec![0u8; 65536], Vec::new());
    let mut seen = Seen::default();
    let r = (|| -> std::io::Result<()> {
        while seen.received < len {
            let k = (len - seen.received).min(buf.len() as u64) as usize;
            let n = s.read(&mut buf[..k])?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            seen.bad += wrong(id, seen.received, &buf[..n], &mut scratch);
            seen.received += n as u64;
        }
        Ok(())
    })();
    seen.complete = r.is_ok();
    v.streams.lock().unwrap().insert(id, seen);
    if let Err(e) = r {
        v.cut.fetch_add(1, Relaxed);
        return Err(e);
    }
    let back = len / 4;
    let mut ans = [0u8; 16];
    ans[..8].copy_from_slice(&seen.bad.to_le_bytes());
    ans[8..].copy_from_slice(&back.to_le_bytes());
    s.write_all(&ans)?;
    let mut off = 0;
    while off < back {
        let k = (back - off).min(buf.len() as u64) as usize;
        fill(id ^ REPLY, off, &mut buf[..k]);
        s.write_all(&buf[..k])?;
        off += k as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    // Until the client closes (a read timeout ends it too).
    while s.read(&mut buf)? > 0 {}
    Ok(())
}

/// `bind` retried for 10 s: the TAP's address may still be on its way.
fn bind_retry<T>(mut bind: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match bind() {
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(100))
            }
            r => return r,
        }
    }
}

/// The stream verifier: accepts in namespace `ns` until `stop`, a thread per stream.
fn verifier(ns: String, v: Arc<Verifier>, stop: Arc<AtomicBool>) -> Res<()> {
    enter_netns(&ns)?;
    let l = bind_retry(|| StdListener::bind(format!("{HOST}:{VERIFY_PORT}")))?;
    l.set_nonblocking(true)?;
    let mut conns = Vec::new();
    while !stop.load(Acquire) {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                let v = v.clone();
                conns.push(std::thread::spawn(move || {
                    let _ = verify_conn(s, &v);
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.into()),
        }
        conns.retain(|h| !h.is_finished());
    }
    // Each connection thread ends within its read deadline.
    for h in conns {
        let _ = crate::join_within(h, OP_DEADLINE * 2);
    }
    Ok(())
}

/// What the UDP echo saw: per batch key, the datagrams (a bit each) that reached it.
#[derive(Default)]
struct Echo {
    reached: Mutex<HashMap<u64, u64>>,
    received: AtomicU64,
    echoed: AtomicU64,
}

/// The UDP echo in namespace `ns`, until `stop`.
fn echo(ns: String, e: Arc<Echo>, stop: Arc<AtomicBool>) -> Res<()> {
    enter_netns(&ns)?;
    let s = bind_retry(|| UdpSocket::bind(format!("{HOST}:{ECHO_PORT}")))?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = vec![0u8; 65536];
    while !stop.load(Acquire) {
        let (n, from) = match s.recv_from(&mut buf) {
            Ok(x) => x,
            Err(err) if is_deadline(&err) => continue,
            Err(err) => return Err(err.into()),
        };
        e.received.fetch_add(1, Relaxed);
        if let Some(seq) = datagram_seq(&buf[..n]).filter(|s| s & 0xff < 64) {
            *e.reached.lock().unwrap().entry(seq & !0xff).or_default() |= 1 << (seq & 0xff);
        }
        if s.send_to(&buf[..n], from).is_ok() {
            e.echoed.fetch_add(1, Relaxed);
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ the load

/// A workload the bench starts and may kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Nginx,
    Redis,
    IperfUp,
    IperfDown,
    Stream(u8),
    Udp,
    Scribbler,
}

const KINDS: [Kind; 8] = [
    Kind::Nginx,
    Kind::Redis,
    Kind::IperfUp,
    Kind::IperfDown,
    Kind::Stream(0),
    Kind::Stream(1),
    Kind::Udp,
    Kind::Scribbler,
];

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Nginx => "nginx (shim)".into(),
            Kind::Redis => "redis-server (shim)".into(),
            Kind::IperfUp => "iperf3 -s receiving (shim)".into(),
            Kind::IperfDown => "iperf3 -s sending (shim)".into(),
            Kind::Stream(i) => format!("stream client {i}"),
            Kind::Udp => "udp client".into(),
            Kind::Scribbler => "scribbler".into(),
        }
    }
    fn tag(self) -> String {
        match self {
            Kind::Nginx => "nginx".into(),
            Kind::Redis => "redis".into(),
            Kind::IperfUp => "iperf-up".into(),
            Kind::IperfDown => "iperf-down".into(),
            Kind::Stream(i) => format!("stream{i}"),
            Kind::Udp => "udp".into(),
            Kind::Scribbler => "scribbler".into(),
        }
    }
}

/// One run of a load generator on the Linux side.
#[derive(Debug, Clone)]
struct LoadRun {
    start: Instant,
    end: Instant,
    /// Requests or bytes it reports (0 when it failed).
    amount: f64,
    /// Errors it counted (wrk's socket errors and non-2xx answers).
    errors: u64,
    failed: bool,
    /// Killed by its deadline (`timeout`).
    timed_out: bool,
}

/// A load generator's runs, one after another until `stop`.
struct LoadLoop {
    name: &'static str,
    /// The server it talks to (a kill of it excuses a failure).
    target: Kind,
    runs: Arc<Mutex<Vec<LoadRun>>>,
    thread: std::thread::JoinHandle<()>,
}

/// Runs `args` in `ns` on CPU 0 under `timeout` (`limit` s, then SIGKILL 5 s later).
fn timed(ns: &str, limit: u64, args: &[String]) -> (Option<i32>, String) {
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "taskset", "-c", "0", "timeout", "-k", "5",
        ])
        .arg(limit.to_string())
        .args(args)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) => (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        ),
        Err(e) => (None, e.to_string()),
    }
}

fn load_loop(
    name: &'static str,
    target: Kind,
    until: Instant,
    mut one: impl FnMut(u64) -> (f64, u64, bool, bool) + Send + 'static,
) -> LoadLoop {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let thread = std::thread::spawn(move || loop {
        let left = until.saturating_duration_since(Instant::now()).as_secs();
        if left < 2 {
            return;
        }
        let start = Instant::now();
        let (amount, errors, failed, timed_out) = one(left);
        r.lock().unwrap().push(LoadRun {
            start,
            end: Instant::now(),
            amount,
            errors,
            failed,
            timed_out,
        });
        if failed {
            // Its server is being restarted: do not spin.
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    LoadLoop {
        name,
        target,
        runs,
        thread,
    }
}

fn start_loads(ns: &str, until: Instant) -> Vec<LoadLoop> {
    let mut loops = Vec::new();
    let n = ns.to_string();
    loops.push(load_loop("wrk", Kind::Nginx, until, move |left| {
        let d = left.min(10);
        let args = ["wrk", "-t1", "-c4", "--latency", "--timeout", "5s"]
            .map(String::from)
            .into_iter()
            .chain([format!("-d{d}s"), format!("http://{USNET}:{HTTP_PORT}/r4k")])
            .collect::<Vec<_>>();
        let (code, out) = timed(&n, d + 20, &args);
        match (code, parse_wrk(&out)) {
            (Some(0), Some(r)) => (r.rps * d as f64, r.errors, false, false),
            (c, _) => (0.0, 0, true, c == Some(124)),
        }
    }));
    let n = ns.to_string();
    loops.push(load_loop(
        "redis-benchmark",
        Kind::Redis,
        until,
        move |_| {
            let port = REDIS_PORT.to_string();
            let args = [
                "redis-benchmark",
                "-h",
                USNET,
                "-p",
                &port,
                "-t",
                "set,get",
                "-n",
                "1000",
                "-c",
                "4",
                "-q",
                "--csv",
            ]
            .map(String::from);
            let (code, out) = timed(&n, 60, &args);
            let ok = code == Some(0)
                && crate::preload::redis_rps(&out, "GET").is_some()
                && crate::preload::redis_rps(&out, "SET").is_some();
            if ok {
                (2000.0, 0, false, false)
            } else {
                (0.0, 0, true, code == Some(124))
            }
        },
    ));
    for (name, port, kind, reverse) in [
        ("iperf3 (to usnet)", IPERF_UP, Kind::IperfUp, false),
        ("iperf3 -R (from usnet)", IPERF_DOWN, Kind::IperfDown, true),
    ] {
        let n = ns.to_string();
        loops.push(load_loop(name, kind, until, move |left| {
            let t = left.min(8);
            let mut args = ["iperf3", "-c", USNET, "-J", "-b", "40M"]
                .map(String::from)
                .to_vec();
            args.extend(["-p".into(), port.to_string(), "-t".into(), t.to_string()]);
            args.extend(["--connect-timeout".into(), "5000".into()]);
            if reverse {
                args.push("-R".into());
            }
            let (code, out) = timed(&n, t + 30, &args);
            let bytes = serde_json::from_str::<Value>(&out)
                .ok()
                .filter(|v| v["error"].is_null())
                .and_then(|v| v["end"]["sum_received"]["bytes"].as_f64());
            match (code, bytes) {
                (Some(0), Some(b)) => (b, 0, false, false),
                (c, _) => (0.0, 0, true, c == Some(124)),
            }
        }));
    }
    loops
}

// ------------------------------------------------------------------ the server's state

/// `stat` from the stack server, with a deadline.
fn stat(dir: &Path) -> Res<Stat> {
    let mut s = std::os::unix::net::UnixStream::connect(dir.join(format!("{STACK}.ctl")))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(usnet_session::ctl::request_line(&Request::Stat).as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(usnet_session::ctl::parse_answer(&line)?)
}

/// A process's resident set and its kernel-private part (/proc/PID/status), bytes.
fn rss(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("RssAnon:"))
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// The server's state compared at the start and the end.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Snapshot {
    pool_in_use: u64,
    sockets: u64,
    clients: u64,
    fds: u64,
    rss: u64,
    rss_anon: u64,
}

/// Descriptors are counted first: the server may hold the `stat` connection a while
/// after it answered.
fn snapshot(dir: &Path, pid: u32) -> Res<Snapshot> {
    let fds = fds(pid);
    let (rss, rss_anon) = rss(pid);
    let st = stat(dir)?;
    Ok(Snapshot {
        pool_in_use: st.pool.in_use,
        sockets: st.sockets.live,
        clients: st.clients.len() as u64,
        fds,
        rss,
        rss_anon,
    })
}

fn link_bytes(st: &Stat) -> u64 {
    st.device_counters.get("rx_bytes").copied().unwrap_or(0)
        + st.device_counters.get("tx_bytes").copied().unwrap_or(0)
}

// ------------------------------------------------------------------ the run

/// What the client processes reported.
#[derive(Default)]
struct Tally {
    /// Completed streams: id → bytes sent.
    streams: Vec<(u64, u64)>,
    stream_bytes: u64,
    stream_back: u64,
    stream_bad: u64,
    stream_peer_bad: u64,
    misses: Vec<String>,
    errors: Vec<String>,
    udp_batches: u64,
    udp_sent: u64,
    udp_echoed: u64,
    udp_dup: u64,
    udp_late: u64,
    udp_bad: u64,
    /// (batch key, echoed) of each batch.
    udp_keys: Vec<(u64, u64)>,
    scribble_rounds: u64,
    cut_offs: u64,
    /// Checked stream bytes per 10 s interval.
    per_interval: Vec<f64>,
}

impl Tally {
    fn take(&mut self, kind: Kind, v: &Value, interval: usize) {
        let u = |k: &str| v[k].as_u64().unwrap_or(0);
        match v["kind"].as_str().unwrap_or("") {
            "stream" => {
                self.streams.push((u("id"), u("sent")));
                self.stream_bytes += u("sent");
                self.stream_back += u("back");
                self.stream_bad += u("bad");
                self.stream_peer_bad += u("peer_bad");
                if self.per_interval.len() <= interval {
                    self.per_interval.resize(interval + 1, 0.0);
                }
                self.per_interval[interval] += (u("sent") + u("back")) as f64;
            }
            "miss" => self.misses.push(format!("{}: {v}", kind.name())),
            "error" => self.errors.push(format!("{}: {v}", kind.name())),
            "udp" => {
                self.udp_batches += 1;
                self.udp_sent += u("sent");
                self.udp_echoed += u("echoed");
                self.udp_dup += u("dup");
                self.udp_late += u("late");
                self.udp_bad += u("bad");
                self.udp_keys.push((u("key"), u("echoed")));
            }
            "scribbled" => self.scribble_rounds += u("rounds"),
            "cut" => {
                self.cut_offs += 1;
                self.scribble_rounds += u("rounds") % 500;
            }
            _ => {}
        }
    }
}

/// A running workload: a server under the shim or a client process.
enum Proc {
    Server(Bg),
    Client(Child),
}

impl Proc {
    fn exited(&mut self) -> bool {
        let c = match self {
            Proc::Server(b) => &mut b.0,
            Proc::Client(c) => c,
        };
        !matches!(c.try_wait(), Ok(None))
    }
    fn kill(&mut self) -> KillPhases {
        let c = match self {
            Proc::Server(b) => &mut b.0,
            Proc::Client(c) => c,
        };
        kill_timed(c)
    }
}

/// How a SIGKILL went: how long until the process was reaped (`None`: not within
/// 10 s) and, when that took over a second, what the process was doing then (its
/// state, the kernel function it waited in, its threads), so a slow exit names a cause.
#[derive(Debug, Default, Clone)]
struct KillPhases {
    reaped_after: Option<Duration>,
    slow: Option<String>,
}

fn kill_timed(c: &mut Child) -> KillPhases {
    let pid = c.id();
    let t = Instant::now();
    let mut reaped = crate::kill_and_reap(c, Duration::from_secs(1));
    let slow = (!reaped).then(|| proc_state(pid));
    if !reaped {
        reaped = crate::reap_within(c, Duration::from_secs(9));
    }
    KillPhases {
        reaped_after: reaped.then(|| t.elapsed()),
        slow,
    }
}

/// `state S, wchan W, N threads (T1 in W1, ...)` from /proc, as far as it can be read.
fn proc_state(pid: u32) -> String {
    let read = |p: String| std::fs::read_to_string(p).unwrap_or_default();
    let state_of = |stat: &str| {
        // The state follows the command's closing parenthesis.
        stat.rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("?")
            .to_string()
    };
    let mut threads = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten().take(16) {
            let tid = e.file_name().to_string_lossy().into_owned();
            let st = state_of(&read(format!("/proc/{pid}/task/{tid}/stat")));
            let w = read(format!("/proc/{pid}/task/{tid}/wchan"));
            threads.push(format!(
                "{tid} {st} in {}",
                if w.is_empty() { "?" } else { &w }
            ));
        }
    }
    format!(
        "state {}, wchan {}, {} threads ({})",
        state_of(&read(format!("/proc/{pid}/stat"))),
        read(format!("/proc/{pid}/wchan")),
        threads.len(),
        threads.join(", ")
    )
}

/// One time a workload went away: killed by the bench or exited on its own.
struct Disturbance {
    kind: Kind,
    why: &'static str,
    /// When it was killed (or found gone).
    gone: Instant,
    /// The kill's own course (nothing for an exit).
    kill: KillPhases,
    /// When it was started again and served (or the restart gave up).
    back: Instant,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A server's `Bg` stops itself; a client process would run on.
        if let Proc::Client(c) = self {
            crate::kill_and_reap(c, Duration::from_secs(5));
        }
    }
}

struct Soak {
    exe: PathBuf,
    dir: PathBuf,
    ns: String,
    seed: u64,
    www: PathBuf,
    events: mpsc::Sender<(Kind, Value)>,
    generation: u64,
}

impl Soak {
    /// Starts `kind`; a server is waited for until it serves (20 s).
    fn start(&mut self, kind: Kind) -> Res<Proc> {
        self.generation += 1;
        let role = match kind {
            Kind::Stream(_) => Some(Role::Stream),
            Kind::Udp => Some(Role::Udp),
            Kind::Scribbler => Some(Role::Scribbler),
            _ => None,
        };
        if let Some(role) = role {
            return self.start_client(kind, role);
        }
        let mut c = in_ns(&self.ns, 1);
        c.arg(&self.exe).args(["run", "--stack", STACK, "--"]);
        let port = match kind {
            Kind::Nginx => {
                let conf = nginx_conf(&self.dir, &self.www, USNET, HTTP_PORT, "soak", "", "")?;
                c.args(["nginx", "-p", &self.dir.display().to_string(), "-c"])
                    .arg(conf);
                HTTP_PORT
            }
            Kind::Redis => {
                c.args(["redis-server", "--port", &REDIS_PORT.to_string()]);
                c.args(["--bind", USNET, "--save", "", "--appendonly", "no"]);
                c.args(["--protected-mode", "no"]);
                REDIS_PORT
            }
            Kind::IperfUp | Kind::IperfDown => {
                let port = if kind == Kind::IperfUp {
                    IPERF_UP
                } else {
                    IPERF_DOWN
                };
                c.args(["iperf3", "-s", "-B", USNET, "-p", &port.to_string()]);
                port
            }
            _ => unreachable!("clients start above"),
        };
        let what = format!("{}-{}", kind.tag(), self.generation);
        let mut bg = spawn(c, &self.dir, &what)?;
        PIDS.lock().unwrap().push(bg.0.id());
        if kind == Kind::Nginx {
            let url = format!("http://{USNET}:{HTTP_PORT}/r4k");
            wait_serving(&self.ns, &url, &mut bg, &self.dir)?;
        } else {
            wait_port(&self.ns, USNET, port, &mut bg, &self.dir)?;
        }
        Ok(Proc::Server(bg))
    }

    fn start_client(&mut self, kind: Kind, role: Role) -> Res<Proc> {
        let spec = PeerSpec::Soak(ChildOptions {
            role,
            stack: STACK.into(),
            seed: mix(self.seed ^ mix(self.generation)),
        });
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", kind.tag())))?;
        let mut child = Command::new(&self.exe)
            .env(PEER_ENV, serde_json::to_string(&spec)?)
            .env("USNET_RUN_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()?;
        PIDS.lock().unwrap().push(child.id());
        let out = child.stdout.take().expect("piped");
        let tx = self.events.clone();
        // Ends when the process does (its stdout closes).
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send((kind, v));
                }
            }
        });
        Ok(Proc::Client(child))
    }

    /// Starts `kind`, trying three times (a killed server's port is free again only
    /// once the stack server has reaped its session).
    fn restart(&mut self, kind: Kind, notes: &mut Vec<String>) -> Option<Proc> {
        for attempt in 1..=3 {
            match self.start(kind) {
                Ok(p) => return Some(p),
                Err(e) => {
                    // The log's last line says why (a port still held, say).
                    let e = e.to_string();
                    let why = e.lines().last().unwrap_or_default();
                    notes.push(format!("{} start {attempt} failed: {why}", kind.name()));
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        None
    }
}

/// A network namespace, removed on drop.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// The overall deadline: if the run is not over by then, everything it started is
/// killed and the process exits with 2.
fn watchdog(limit: Duration, ns: String) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("usnet bench soak: the overall deadline ({limit:?}) passed; stopping");
        for &pid in PIDS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            // SAFETY: kill(2) with a pid this process started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = ip(&["netns", "del", &ns]);
        std::process::exit(2);
    });
}

/// One check: its name, whether it held, and the figures behind it.
struct Check {
    name: &'static str,
    pass: bool,
    figures: String,
}

pub fn run(a: &SoakBenchOptions) -> Res<ExitCode> {
    if !is_root() {
        return Err("usnet bench soak needs root (a TAP into a network namespace)".into());
    }
    if a.seconds < 10.0 || a.kill_every < 1.0 {
        return Err("usnet bench soak: use at least 10 s and a kill every 1 s or more".into());
    }
    need_tools(&[
        "nginx",
        "wrk",
        "curl",
        "redis-server",
        "redis-benchmark",
        "iperf3",
        "taskset",
        "timeout",
    ])?;
    let pid = std::process::id();
    let ns = Netns(format!("usnb-soak-{pid}"));
    // The load, the kills, the settling, and slack for starting and stopping.
    watchdog(
        Duration::from_secs_f64(a.seconds) + SETTLE + Duration::from_secs(240),
        ns.0.clone(),
    );
    ip(&["netns", "add", &ns.0])?;
    ip(&["-n", &ns.0, "link", "set", "lo", "up"])?;
    let dir = std::env::temp_dir().join(format!("usnet-bench-soak-{pid}"));
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::write(
        www.join("r4k"),
        (0..4096)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    )?;

    let fault = format!("{FAULT},seed={}", a.seed);
    let mut stack = start_stack_server(
        &ns.0,
        1,
        &dir,
        STACK,
        &[
            "--link".into(),
            format!("tap:usnsk{}", pid % 100_000),
            "--addr".into(),
            format!("{USNET}/24"),
            "--host-addr".into(),
            format!("{HOST}/24"),
            "--fault".into(),
            fault.clone(),
            // The clients share the server's core: leave them the time.
            "--spin-us".into(),
            "0".into(),
        ],
    )?;
    let server_pid = stack.0.id();
    PIDS.lock().unwrap().push(server_pid);
    // Idle, before any client: what the end must come back to (once the server
    // has closed the connection that found it up).
    std::thread::sleep(Duration::from_millis(300));
    let base = snapshot(&dir, server_pid)?;

    let stop = Arc::new(AtomicBool::new(false));
    let ver = Arc::new(Verifier::default());
    let ech = Arc::new(Echo::default());
    let linux = [
        {
            let (ns, v, s) = (ns.0.clone(), ver.clone(), stop.clone());
            std::thread::spawn(move || verifier(ns, v, s).map_err(|e| e.to_string()))
        },
        {
            let (ns, e, s) = (ns.0.clone(), ech.clone(), stop.clone());
            std::thread::spawn(move || echo(ns, e, s).map_err(|e| e.to_string()))
        },
    ];

    let (tx, rx) = mpsc::channel();
    let mut soak = Soak {
        exe: std::env::current_exe()?,
        dir: dir.clone(),
        ns: ns.0.clone(),
        seed: a.seed,
        www,
        events: tx,
        generation: 0,
    };
    let mut notes = Vec::new();
    let mut procs: HashMap<Kind, Proc> = HashMap::new();
    for k in KINDS {
        procs.insert(k, soak.start(k)?);
    }
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(a.seconds);
    let loads = start_loads(&ns.0, until);
    println!(
        "usnet bench soak: {:.0} s, fault link {fault}, a kill every {} s (logs in {})",
        a.seconds,
        a.kill_every,
        dir.display()
    );

    let mut tally = Tally::default();
    // Every kill and every restart after an exit.
    let mut disturbances: Vec<Disturbance> = Vec::new();
    let mut restart_failures = 0u64;
    let mut rng = mix(a.seed ^ 0x6b69_6c6c);
    let kill_every = Duration::from_secs_f64(a.kill_every);
    let mut next_kill = t0 + kill_every;
    let mut warm: Option<Snapshot> = None;
    let warm_at = t0 + WARM_UP.min(Duration::from_secs_f64(a.seconds / 2.0));
    let mut link_per_interval: Vec<f64> = Vec::new();
    // The server's (VmRSS, RssAnon) every 10 s.
    let mut rss_per_interval: Vec<(u64, u64)> = Vec::new();
    let mut last_link = (t0, stat(&dir).map(|s| link_bytes(&s)).unwrap_or(0));
    let interval = Duration::from_secs(10);
    let mut next_sample = t0 + interval;
    let mut server_died = false;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        let iv = (now - t0).as_secs() as usize / 10;
        while let Ok((k, v)) = rx.try_recv() {
            tally.take(k, &v, iv);
        }
        if let Ok(Some(s)) = stack.0.try_wait() {
            notes.push(format!("the stack server exited: {s}"));
            server_died = true;
            break;
        }
        for k in KINDS {
            let exited = procs.get_mut(&k).is_none_or(|p| p.exited());
            if exited {
                if let Some(mut p) = procs.remove(&k) {
                    p.kill();
                }
                match soak.restart(k, &mut notes) {
                    Some(p) => {
                        procs.insert(k, p);
                    }
                    None => restart_failures += 1,
                }
                disturbances.push(Disturbance {
                    kind: k,
                    why: "exited",
                    gone: now,
                    kill: KillPhases::default(),
                    back: Instant::now(),
                });
            }
        }
        if warm.is_none() && now >= warm_at {
            warm = snapshot(&dir, server_pid).ok();
        }
        if now >= next_kill {
            next_kill += kill_every;
            rng = mix(rng);
            let k = KINDS[rng as usize % KINDS.len()];
            let kill = procs
                .remove(&k)
                .map(|mut p| p.kill()) // SIGKILL, then reaped
                .unwrap_or_default();
            if kill.reaped_after.is_none_or(|d| d > Duration::from_secs(1)) {
                notes.push(format!(
                    "{} at {:.0} s: reaped after {}; at 1 s: {}",
                    k.name(),
                    (now - t0).as_secs_f64(),
                    kill.reaped_after
                        .map_or("more than 10 s".into(), |d| format!(
                            "{:.1} s",
                            d.as_secs_f64()
                        )),
                    kill.slow.as_deref().unwrap_or("-")
                ));
            }
            match soak.restart(k, &mut notes) {
                Some(p) => {
                    procs.insert(k, p);
                }
                None => restart_failures += 1,
            }
            disturbances.push(Disturbance {
                kind: k,
                why: "killed",
                gone: now,
                kill,
                back: Instant::now(),
            });
        }
        if now >= next_sample {
            next_sample += interval;
            rss_per_interval.push(rss(server_pid));
            if let Ok(s) = stat(&dir) {
                let b = link_bytes(&s);
                let secs = (now - last_link.0).as_secs_f64();
                link_per_interval.push(b.saturating_sub(last_link.1) as f64 / secs);
                last_link = (now, b);
            }
        }
    }
    let ran = t0.elapsed();

    // The end: the load generators finish their runs, then every client goes.
    let mut load_runs: Vec<(&'static str, Kind, Vec<LoadRun>)> = Vec::new();
    for l in loads {
        if let Err(e) = crate::join_within(l.thread, Duration::from_secs(90)) {
            notes.push(format!("{}: {e}", l.name));
        }
        let runs = l.runs.lock().unwrap().clone();
        load_runs.push((l.name, l.target, runs));
    }
    for (_, mut p) in procs.drain() {
        p.kill();
    }
    // What the clients said before they went.
    let drain_end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < drain_end {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((k, v)) => tally.take(k, &v, (ran.as_secs() as usize / 10).saturating_sub(1)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    stop.store(true, Release);
    for h in linux {
        match crate::join_within(h, OP_DEADLINE * 3) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => notes.push(format!("linux side: {e}")),
            Err(e) => notes.push(format!("linux side: {e}")),
        }
    }

    // Settle: the orphaned connections close, the sessions go.
    let settle_start = Instant::now();
    let mut end = snapshot(&dir, server_pid).unwrap_or_default();
    while !server_died && settle_start.elapsed() < SETTLE {
        match snapshot(&dir, server_pid) {
            Ok(s) => {
                end = s;
                if s.clients == 0
                    && s.sockets <= base.sockets
                    && s.pool_in_use <= base.pool_in_use
                    && s.fds <= base.fds
                {
                    break;
                }
            }
            Err(e) => {
                notes.push(format!("stat at the end: {e}"));
                server_died = true;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let settled = settle_start.elapsed();
    let final_stat = stat(&dir).ok();
    let broken = final_stat.as_ref().map_or(0, |s| s.sessions_broken);

    // ---- the checks
    let warm = warm.unwrap_or(base);
    // A run that overlapped its server's absence (from its kill until it served
    // again, and a second after) is excused.
    let killed_during = |k: Kind, r: &LoadRun| {
        disturbances
            .iter()
            .any(|d| d.kind == k && d.gone <= r.end && d.back + Duration::from_secs(1) >= r.start)
    };
    let mut load_rows = Vec::new();
    let mut load_misses = 0usize;
    let mut overruns = Vec::new();
    let mut load_unexcused = 0usize;
    for (name, target, runs) in &load_runs {
        let unexcused = runs
            .iter()
            .filter(|r| r.failed && !r.timed_out && !killed_during(*target, r))
            .count();
        let mut miss = 0usize;
        for r in runs
            .iter()
            .filter(|r| r.timed_out && !killed_during(*target, r))
        {
            miss += 1;
            let (from, to) = ((r.start - t0).as_secs_f64(), (r.end - t0).as_secs_f64());
            notes.push(format!(
                "{name} ran past its deadline from {from:.0} s to {to:.0} s"
            ));
            overruns.push(json!({"load": name, "start_s": from, "end_s": to}));
        }
        load_misses += miss;
        load_unexcused += unexcused;
        let amount: f64 = runs.iter().map(|r| r.amount).sum();
        let failed = runs.iter().filter(|r| r.failed).count();
        let errors: u64 = runs.iter().map(|r| r.errors).sum();
        load_rows.push(json!({"load": name, "runs": runs.len(), "failed": failed,
            "failed_without_a_kill": unexcused, "timed_out_without_a_kill": miss,
            "amount": amount, "errors": errors}));
    }
    let seen = ver.streams.lock().unwrap().clone();
    let verifier_bad: u64 = seen.values().map(|s| s.bad).sum();
    let verifier_bytes: u64 = seen.values().map(|s| s.received).sum();
    let mismatched = tally
        .streams
        .iter()
        .filter(|(id, sent)| {
            seen.get(id)
                .is_none_or(|s| !s.complete || s.received != *sent)
        })
        .count();
    let reached = ech.reached.lock().unwrap().clone();
    // Per batch: echoed ≤ reached the echo ≤ sent.
    let (mut udp_reached, mut udp_inconsistent) = (0u64, 0u64);
    for &(key, echoed) in &tally.udp_keys {
        let r = reached.get(&key).map_or(0, |m| m.count_ones() as u64);
        udp_reached += r;
        if echoed > r || r > BATCH {
            udp_inconsistent += 1;
        }
    }
    let lost_out = tally.udp_sent.saturating_sub(udp_reached);
    let lost_back = udp_reached.saturating_sub(tally.udp_echoed);
    let pct = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    // The allocator keeps freed pages (glibc's arenas do not shrink past a live
    // chunk), so the end may stay near the steady state's peak; growth beyond it
    // by more than 10 % or 16 MiB would be memory that the run's length adds.
    let tolerance = |b: u64| b + (b / 10).max(16 << 20);
    let (rss_limit, anon_limit) = (tolerance(warm.rss), tolerance(warm.rss_anon));
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let kills = disturbances.iter().filter(|d| d.why == "killed").count();
    let exits = disturbances.len() - kills;
    let amount_of = |name: &str| {
        load_rows
            .iter()
            .find(|r| r["load"] == name)
            .and_then(|r| r["amount"].as_f64())
            .unwrap_or(0.0)
    };
    let checks = vec![
        Check {
            name: "payload bytes wrong",
            pass: tally.stream_bad + tally.stream_peer_bad + verifier_bad + tally.udp_bad == 0,
            figures: format!(
                "TCP: {} to the verifier ({:.1} MB checked), {} in its answers ({:.1} MB); UDP: {} ({} datagrams back)",
                verifier_bad,
                verifier_bytes as f64 / 1e6,
                tally.stream_bad,
                tally.stream_back as f64 / 1e6,
                tally.udp_bad,
                tally.udp_echoed + tally.udp_dup + tally.udp_late
            ),
        },
        Check {
            name: "clients blocked past their deadline",
            pass: tally.misses.is_empty() && load_misses == 0,
            figures: format!(
                "{} client operations past {} s, {} load runs past their deadline without a kill of their server",
                tally.misses.len(),
                OP_DEADLINE.as_secs(),
                load_misses
            ),
        },
        Check {
            name: "pool buffers in use at the end",
            pass: !server_died && end.pool_in_use <= base.pool_in_use,
            figures: format!("{} (baseline {})", end.pool_in_use, base.pool_in_use),
        },
        Check {
            name: "stack sockets at the end",
            pass: !server_died && end.sockets <= base.sockets && end.clients == 0,
            figures: format!(
                "{} (baseline {}), {} clients; settled {:.0} s after the last client went",
                end.sockets,
                base.sockets,
                end.clients,
                settled.as_secs_f64()
            ),
        },
        Check {
            name: "server descriptors at the end",
            pass: !server_died && end.fds <= base.fds,
            figures: format!("{} (baseline {})", end.fds, base.fds),
        },
        Check {
            name: "server RSS at the end",
            pass: !server_died && end.rss <= rss_limit && end.rss_anon <= anon_limit,
            figures: format!(
                "{:.1} MiB (after warm-up {:.1} MiB, limit {:.1} MiB; idle at the start {:.1} MiB); anonymous {:.1} MiB (after warm-up {:.1}, limit {:.1})",
                mib(end.rss),
                mib(warm.rss),
                mib(rss_limit),
                mib(base.rss),
                mib(end.rss_anon),
                mib(warm.rss_anon),
                mib(anon_limit)
            ),
        },
        Check {
            name: "TCP bytes sent = received by the verifier",
            pass: mismatched == 0 && !tally.streams.is_empty(),
            figures: format!(
                "{} completed streams, {:.1} MB; {} disagree; {} streams cut short by kills",
                tally.streams.len(),
                tally.stream_bytes as f64 / 1e6,
                mismatched,
                ver.cut.load(Relaxed)
            ),
        },
        Check {
            name: "UDP sent = echoed + lost on the way",
            pass: udp_inconsistent == 0
                && tally.udp_echoed > 0
                && pct(lost_out + lost_back, tally.udp_sent) < 10.0,
            figures: format!(
                "{} sent, {} reached the echo, {} came back ({} duplicates, {} late); lost {:.2} % out, {:.2} % back (the link drops 1 % each way); {} batches inconsistent",
                tally.udp_sent,
                udp_reached,
                tally.udp_echoed,
                tally.udp_dup,
                tally.udp_late,
                pct(lost_out, tally.udp_sent),
                pct(lost_back, udp_reached),
                udp_inconsistent
            ),
        },
        Check {
            name: "the server survived; every client restarted",
            pass: !server_died && restart_failures == 0 && broken == 0,
            figures: format!(
                "{kills} kills, {exits} exits ({} scribbler cut-offs), {restart_failures} failed restarts; scribbler {} rounds; {broken} sessions cut off by a panic",
                tally.cut_offs, tally.scribble_rounds
            ),
        },
        Check {
            name: "every workload made progress",
            pass: load_rows.iter().all(|r| r["amount"].as_f64() > Some(0.0))
                && !tally.streams.is_empty()
                && tally.udp_batches > 0,
            figures: format!(
                "wrk {:.0} req, redis {:.0} req, iperf3 {:.1} MB up, {:.1} MB down; {} runs failed without a kill",
                amount_of("wrk"),
                amount_of("redis-benchmark"),
                amount_of("iperf3 (to usnet)") / 1e6,
                amount_of("iperf3 -R (from usnet)") / 1e6,
                load_unexcused
            ),
        },
    ];

    let mut table = Table::new(
        format!(
            "soak: {:.0} s through one stack server, fault link {fault}, a kill every {} s",
            ran.as_secs_f64(),
            a.kill_every
        ),
        ["check", "result", "figures"].map(String::from).to_vec(),
    );
    for c in &checks {
        table.row(vec![
            c.name.to_string(),
            if c.pass { "pass" } else { "FAIL" }.to_string(),
            c.figures.clone(),
        ]);
    }
    table.print();
    for m in tally.misses.iter().chain(&tally.errors).take(20) {
        println!("  {m}");
    }
    for n in notes.iter().take(20) {
        println!("  note: {n}");
    }
    let passed = checks.iter().all(|c| c.pass);

    std::fs::create_dir_all(&a.out)?;
    let doc = json!({
        "bench": "soak", "seconds": ran.as_secs_f64(), "seed": a.seed,
        "kill_every": a.kill_every, "fault": fault, "op_deadline_s": OP_DEADLINE.as_secs(),
        "passed": passed,
        "checks": checks.iter().map(|c| json!({"check": c.name, "pass": c.pass,
            "figures": c.figures})).collect::<Vec<_>>(),
        "baseline": base, "warm": warm, "warm_up_s": (warm_at - t0).as_secs_f64(),
        "end": end, "settle_s": settled.as_secs_f64(),
        "loads": load_rows,
        "streams": {"completed": tally.streams.len(), "bytes": tally.stream_bytes,
            "back": tally.stream_back, "verifier_bytes": verifier_bytes,
            "cut": ver.cut.load(Relaxed), "foreign": ver.foreign.load(Relaxed)},
        "udp": {"batches": tally.udp_batches, "sent": tally.udp_sent, "reached": udp_reached,
            "echoed": tally.udp_echoed, "dup": tally.udp_dup, "late": tally.udp_late,
            "echo_received": ech.received.load(Relaxed), "echo_sent": ech.echoed.load(Relaxed)},
        "disturbances": disturbances.iter().map(|d| json!({"what": d.kind.name(),
            "at_s": (d.gone - t0).as_secs_f64(), "back_after_s": (d.back - d.gone).as_secs_f64(),
            "reaped_after_s": d.kill.reaped_after.map(|r| r.as_secs_f64()),
            "slow_exit": d.kill.slow, "why": d.why})).collect::<Vec<_>>(),
        "overruns": overruns,
        "misses": tally.misses, "errors": tally.errors, "notes": notes,
        "link_bytes_per_s": link_per_interval, "rss_per_interval": rss_per_interval, "stream_bytes_per_interval": tally.per_interval,
        "final_counters": final_stat.as_ref().map(|s| &s.counters),
        "final_device_counters": final_stat.as_ref().map(|s| &s.device_counters),
    });
    write_json(&a.out.join("soak.json"), &doc)?;
    std::fs::write(a.out.join("soak.md"), table.to_markdown())?;
    let series = [
        Series::new(
            "link, both directions",
            link_per_interval
                .iter()
                .enumerate()
                .map(|(i, b)| ((i + 1) as f64 * 10.0, b * 8.0 / 1e6))
                .collect(),
        ),
        Series::new(
            "checked streams (both directions)",
            tally
                .per_interval
                .iter()
                .enumerate()
                .map(|(i, b)| ((i + 1) as f64 * 10.0, b * 8.0 / 10.0 / 1e6))
                .collect(),
        ),
    ];
    if let Err(e) = line_plot(
        &a.out.join("soak.png"),
        "soak: throughput per 10 s through one stack server (1 % loss, dup, reorder)",
        "seconds",
        "Mbit/s",
        &series,
        false,
    ) {
        eprintln!("plot not drawn: {e}");
    }
    println!("wrote {}/soak.json, soak.md, soak.png", a.out.display());
    drop(stack);
    drop(ns);
    if passed {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs kept in {}", dir.display());
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_the_same_in_any_pieces_and_wrong_bytes_are_counted() {
        let mut whole = vec![0u8; 1000];
        fill(7, 3, &mut whole);
        let mut parts = vec![0u8; 1000];
        let (a, b) = parts.split_at_mut(333);
        fill(7, 3, a);
        fill(7, 336, b);
        assert_eq!(whole, parts);
        let mut other = vec![0u8; 1000];
        fill(8, 3, &mut other);
        assert_ne!(whole, other);
        let mut scratch = Vec::new();
        assert_eq!(wrong(7, 3, &whole, &mut scratch), 0);
        whole[10] ^= 1;
        whole[999] ^= 0x80;
        assert_eq!(wrong(7, 3, &whole, &mut scratch), 2);
    }

    #[test]
    fn datagrams_carry_their_sequence_and_a_checksum() {
        let d = datagram(0xabc, 100);
        assert_eq!(d.len(), 114);
        assert_eq!(datagram_seq(&d), Some(0xabc));
        let mut bad = d.clone();
        bad[50] ^= 4;
        assert_eq!(datagram_seq(&bad), None);
        assert_eq!(datagram_seq(&d[..20]), None);
    }
}
