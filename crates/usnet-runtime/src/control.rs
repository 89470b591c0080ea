//! The control socket of a running stack: a Unix stream socket named after the stack
//! in the run directory, speaking one JSON request line and JSON lines back. It is how
//! `usnet stat`, `usnet ping` and `usnet down` reach a stack in another process.
//!
//! Requests: `{"cmd":"stat"}`, `{"cmd":"ping","dst":"10.0.0.2","count":3,
//! "interval_ms":1000,"size":56,"timeout_ms":2000}`, `{"cmd":"stop"}`.

use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{NetStack, PingSocket};

/// Connections listed by `stat` (the total is always reported).
const STAT_MAX_CONNECTIONS: usize = 256;

/// Where control sockets live: `$USNET_RUN_DIR`, else `/tmp/usnet-<uid>`.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("USNET_RUN_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/usnet-{uid}"))
}

pub fn socket_path(name: &str) -> PathBuf {
    run_dir().join(format!("{name}.ctl"))
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("a stack named '{0}' is already running (choose another --name)")]
    NameInUse(String),
    #[error("bad stack name '{0}': use letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("no running stack named '{0}' (start one with `usnet up`)")]
    NoSuchStack(String),
    #[error("no running stack found in {0} (start one with `usnet up`)")]
    NoStacks(String),
    #[error("several stacks are running ({0}): choose one with --stack")]
    Ambiguous(String),
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    #[error("the stack answered something unexpected: {0}")]
    Protocol(String),
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
}

/// Static facts about a stack, reported by `stat`.
#[derive(Debug, Clone)]
pub struct StackInfo {
    pub name: String,
    pub link: String,
    pub services: Vec<String>,
}

/// Serves the control socket until dropped.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(net: NetStack, info: StackInfo) -> Result<ControlServer, ControlError> {
        if !valid_name(&info.name) {
            return Err(ControlError::BadName(info.name));
        }
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        let path = socket_path(&info.name);
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(ControlError::NameInUse(info.name));
            }
            // A stale socket left by a stack that died.
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let started = std::time::Instant::now();
        let thread = std::thread::Builder::new()
            .name("usnet-control".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let net = net.clone();
                            let info = info.clone();
                            std::thread::spawn(move || {
                                let _ = handle(stream, &net, &info, started);
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })?;
        Ok(ControlServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn handle(
    stream: UnixStream,
    net: &NetStack,
    info: &StackInfo,
    started: std::time::Instant,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let req: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => return send(&mut out, &json!({"error": format!("bad request: {e}")})),
    };
    match req["cmd"].as_str() {
        Some("stat") => send(&mut out, &stat(net, info, started)),
        Some("ping") => ping(&mut out, net, &req),
        Some("stop") => {
            send(&mut out, &json!({"ok": true}))?;
            net.shutdown();
            Ok(())
        }
        other => send(
            &mut out,
            &json!({"error": format!("unknown command {other:?}")}),
        ),
    }
}

fn send(out: &mut UnixStream, v: &Value) -> io::Result<()> {
    let mut s = serde_json::to_string(v).expect("json");
    s.push('\n');
    out.write_all(s.as_bytes())
}

/// Everything `usnet stat` shows, as JSON.
pub fn stat(net: &NetStack, info: &StackInfo, started: std::time::Instant) -> Value {
    let dev = net.device_stats();
    let link_state = net.link_state();
    net.with(|s| {
        let p = s.pool().stats();
        json!({
            "name": info.name,
            "link": info.link,
            "device": net.device_name(),
            "pid": std::process::id(),
            "uptime_s": started.elapsed().as_secs_f64(),
            "link_state": format!("{link_state:?}").to_lowercase(),
            "mac": s.mac().to_string(),
            "mtu": s.mtu(),
            "addrs": s.addrs().iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "services": info.services,
            "counters": serde_json::to_value(s.counters_snapshot()).expect("counters serialise"),
            "priority": serde_json::to_value(s.prio_status()).expect("status serialises"),
            "device_counters": dev.named().into_iter()
                .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
                .collect::<serde_json::Map<_, _>>(),
            "pool": {
                "buf_size": s.pool().buf_size(), "count": s.pool().count(),
                "in_use": p.in_use, "peak_in_use": p.peak_in_use,
                "allocs": p.allocs, "exhausted": p.exhausted,
            },
            "neighbors": s.neighbors().iter().map(|(ip, mac)| json!({
                "ip": ip.to_string(),
                "mac": mac.map(|m| m.to_string()),
            })).collect::<Vec<_>>(),
            "tcp_listeners": s.tcp_listeners().iter().map(|l| json!({
                "local": l.local.to_string(),
                "syn_queue": l.syn_queue,
                "accept_queue": l.accept_queue,
            })).collect::<Vec<_>>(),
            // Like `ss -ti`, capped so a stack with 10,000 connections answers quickly.
            "tcp_connections_total": s.tcp_connections().len(),
            "tcp_connections": s.tcp_connections().iter().take(STAT_MAX_CONNECTIONS).map(|c| json!({
                "local": c.local.to_string(),
                "remote": c.remote.to_string(),
                "state": format!("{:?}", c.info.state),
                "orphan": c.orphan,
                "srtt_us": c.info.srtt.map(|d| d.as_micros() as u64),
                "rto_ms": c.info.rto.as_millis() as u64,
                "cwnd": c.info.cwnd,
                "ssthresh": c.info.ssthresh,
                "mss": c.info.snd_mss,
                "in_flight": c.info.bytes_in_flight,
                "retransmits": c.info.total_retransmits,
                "congestion": c.info.congestion,
                "recv_q": c.info.recv_queued,
                "send_q": c.info.send_queued,
            })).collect::<Vec<_>>(),
        })
    })
}

fn ping(out: &mut UnixStream, net: &NetStack, req: &Value) -> io::Result<()> {
    let dst: IpAddr = match req["dst"].as_str().and_then(|s| s.parse().ok()) {
        Some(d) => d,
        None => return send(out, &json!({"error": "ping needs an IP address"})),
    };
    let count = req["count"].as_u64().unwrap_or(4).min(1_000_000);
    let interval = Duration::from_millis(req["interval_ms"].as_u64().unwrap_or(1000));
    let size = req["size"].as_u64().unwrap_or(56).min(65_000) as usize;
    let timeout = Duration::from_millis(req["timeout_ms"].as_u64().unwrap_or(2000));
    let sock = PingSocket::open(net);
    let (mut sent, mut received) = (0u64, 0u64);
    for i in 0..count {
        let seq = (i + 1) as u16;
        let t0 = std::time::Instant::now();
        if let Err(e) = sock.send(dst, seq, size) {
            send(out, &json!({"seq": seq, "error": e.to_string()}))?;
        } else {
            sent += 1;
            loop {
                let left = timeout.saturating_sub(t0.elapsed());
                match sock.recv(left) {
                    Ok((r, rtt)) if r.seq == seq => {
                        received += 1;
                        send(
                            out,
                            &json!({
                                "seq": seq, "from": r.from.to_string(), "bytes": r.len + 8,
                                "ttl": r.hop_limit,
                                "rtt_us": rtt.map(|d| d.as_secs_f64() * 1e6),
                            }),
                        )?;
                        break;
                    }
                    Ok(_) => continue, // a late reply to an earlier request
                    Err(_) => {
                        send(out, &json!({"seq": seq, "timeout": true}))?;
                        break;
                    }
                }
            }
        }
        if i + 1 < count {
            std::thread::sleep(interval.saturating_sub(t0.elapsed()));
        }
    }
    send(
        out,
        &json!({"done": true, "sent": sent, "received": received}),
    )
}

/// Client side: finds the stack to talk to. With no name, the only running stack.
pub fn resolve(name: Option<&str>) -> Result<PathBuf, ControlError> {
    if let Some(n) = name {
        let p = socket_path(n);
        if !p.exists() {
            return Err(ControlError::NoSuchStack(n.to_string()));
        }
        return Ok(p);
    }
    let dir = run_dir();
    let mut live = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "ctl") && UnixStream::connect(&p).is_ok() {
                live.push(p);
            }
        }
    }
    live.sort();
    match live.len() {
        0 => Err(ControlError::NoStacks(dir.display().to_string())),
        1 => Ok(live.remove(0)),
        _ => Err(ControlError::Ambiguous(
            live.iter()
                .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// Sends one request and calls `each` for every JSON line of the answer.
pub fn request(
    path: &Path,
    req: &Value,
    mut each: impl FnMut(&Value) -> bool,
) -> Result<(), ControlError> {
    let mut s = UnixStream::connect(path)?;
    let mut line = serde_json::to_string(req).expect("json");
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let reader = BufReader::new(s);
    for l in reader.lines() {
        let v: Value =
            serde_json::from_str(&l?).map_err(|e| ControlError::Protocol(e.to_string()))?;
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            if v.get("seq").is_none() {
                return Err(ControlError::Protocol(e.to_string()));
            }
        }
        if !each(&v) {
            break;
        }
    }
    Ok(())
}
