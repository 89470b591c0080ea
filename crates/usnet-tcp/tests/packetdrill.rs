//! A packetdrill-like script runner in virtual time. Every `tests/scripts/*.pkt` file
//! is one scenario. Grammar (one event per line, `//` or `#` comments):
//!
//! ```text
//! 0.000 config sack false          // before listen/connect: TcpConfig knobs
//! 0.000 listen                     // passive open on 192.168.0.1:8080 (remote 192.0.2.1:40000)
//! 0.000 connect                    // or: active open
//! 0.100 < S 0:0(0) win 65535 <mss 1460,sackOK,TS val 100 ecr 0,nop,wscale 7>
//! 0.100 > S. 0:0(0) ack 1 <mss 1460,sackOK,TS val * ecr 100,nop,wscale 7>
//! +0.05 < . 1:1(0) ack 1 win 257
//! +0 accept
//! +0 write 1000                    // or write 1000 = 500 (expected return)
//! +0 read 1000
//! +0 shutdown | close | abort
//! +0 state ESTABLISHED             // and: error RESET|REFUSED|TIMEDOUT|ABORTED|none
//! +0 stat rx_paws_rejected 1       // a TcpStats counter of the connection (lstat: listener)
//! ```
//!
//! As in packetdrill: inbound (`<`) sequence numbers are the script's own (the remote
//! ISN is whatever the script's SYN says), inbound ACK numbers and SACK blocks are
//! relative to our ISN; outbound (`>`) sequence numbers are relative to our ISN and
//! outbound ACK numbers and SACK blocks are in the script's space. Flags are S F R P U
//! and `.` for ACK. An outbound line must match the next segment the engine emits, at
//! its time within the tolerance (4 ms, `tolerance_ms N` changes it); a segment
//! emitted when none is expected fails the script. Timestamps: `TSval` is the time in
//! milliseconds (no random offset); `TS val *` skips the check.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_tcp::testing::{OwnedSegment, VecSink};
use usnet_tcp::{
    CcAlgorithm, Connection, Instant, Keepalive, ListenEvent, Listener, Segment, State, TcpConfig,
    TcpError, TcpFlags, TcpOptions, TcpStats,
};

fn stat(s: &TcpStats, name: &str) -> Option<u64> {
    s.entries().into_iter().find(|e| e.0 == name).map(|e| e.2)
}

struct Runner {
    name: String,
    cfg: TcpConfig,
    local: SocketAddr,
    remote: SocketAddr,
    now: Instant,
    conn: Option<Connection>,
    listener: Option<Listener<u32>>,
    pending: Option<Connection>,
    iss: Option<u32>,
    out: VecDeque<(Instant, OwnedSegment)>,
    tol: Duration,
    backlog: usize,
    syn_backlog: Option<usize>,
    cookies: bool,
}

#[derive(Default)]
struct PktSpec {
    flags: TcpFlags,
    start: u32,
    len: u32,
    ack: Option<u32>,
    win: Option<u16>,
    urg: Option<u16>,
    opts: Option<OptSpec>,
}

#[derive(Default, Debug)]
struct OptSpec {
    mss: Option<u16>,
    ws: Option<u8>,
    sack_ok: bool,
    ts: Option<(Option<u32>, Option<u32>)>,
    sacks: Vec<(u32, u32)>,
}

fn parse_flags(s: &str) -> Result<TcpFlags, String> {
    let mut f = TcpFlags::empty();
    for c in s.chars() {
        f |= match c {
            'S' => TcpFlags::SYN,
            'F' => TcpFlags::FIN,
            'R' => TcpFlags::RST,
            'P' => TcpFlags::PSH,
            'U' => TcpFlags::URG,
            '.' => TcpFlags::ACK,
            _ => return Err(format!("bad flag {c:?}")),
        };
    }
    Ok(f)
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse::<T>().map_err(|_| format!("bad number {s:?}"))
}

fn parse_opts(s: &str) -> Result<OptSpec, String> {
    let mut o = OptSpec::default();
    for item in s.split(',') {
        let w: Vec<&str> = item.split_whitespace().collect();
        match w.as_slice() {
            ["nop"] | ["eol"] | [] => {}
            ["mss", v] => o.mss = Some(num(v)?),
            ["wscale", v] => o.ws = Some(num(v)?),
            ["sackOK"] => o.sack_ok = true,
            ["TS", "val", v, "ecr", e] => {
                let p = |x: &str| if x == "*" { Ok(None) } else { num(x).map(Some) };
                o.ts = Some((p(v)?, p(e)?));
            }
            ["sack", blocks @ ..] => {
                for b in blocks {
                    let (l, r) = b.split_once(':').ok_or("bad sack block")?;
                    o.sacks.push((num(l)?, num(r)?));
                }
            }
            _ => return Err(format!("unknown option {item:?}")),
        }
    }
    Ok(o)
}

fn parse_pkt(rest: &str) -> Result<PktSpec, String> {
    let (head, opts) = match rest.find('<') {
        Some(i) => {
            let j = rest.rfind('>').ok_or("unclosed <")?;
            (&rest[..i], Some(parse_opts(&rest[i + 1..j])?))
        }
        None => (rest, None),
    };
    let t: Vec<&str> = head.split_whitespace().collect();
    let mut p = PktSpec {
        flags: parse_flags(t.first().ok_or("no flags")?)?,
        opts,
        ..PktSpec::default()
    };
    let seq = t.get(1).ok_or("no seq")?;
    let (a, rest) = seq.split_once(':').ok_or("bad seq")?;
    let (_b, l) = rest.split_once('(').ok_or("bad seq")?;
    p.start = num(a)?;
    p.len = num(l.trim_end_matches(')'))?;
    let mut i = 2;
    while i < t.len() {
        let v = t.get(i + 1).ok_or("missing value")?;
        match t[i] {
            "ack" => p.ack = Some(num(v)?),
            "win" => p.win = Some(num(v)?),
            "urg" => p.urg = Some(num(v)?),
            k => return Err(format!("unknown field {k:?}")),
        }
        i += 2;
    }
    Ok(p)
}

impl Runner {
    fn new(name: &str) -> Self {
        Runner {
            name: name.to_string(),
            cfg: TcpConfig {
                ts_random_offset: false,
                ..TcpConfig::default()
            },
            local: "192.168.0.1:8080".parse().unwrap(),
            remote: "192.0.2.1:40000".parse().unwrap(),
            now: Instant::ZERO,
            conn: None,
            listener: None,
            pending: None,
            iss: None,
            out: VecDeque::new(),
            tol: Duration::from_millis(4),
            backlog: 16,
            syn_backlog: None,
            cookies: true,
        }
    }

    fn config(&mut self, k: &str, v: &str) -> Result<(), String> {
        let b = || v == "true" || v == "on" || v == "1";
        let ms = || num::<u64>(v).map(Duration::from_millis);
        match k {
            "nodelay" => self.cfg.nodelay = b(),
            "sack" => self.cfg.sack = b(),
            "timestamps" => self.cfg.timestamps = b(),
            "wscale" => self.cfg.window_scaling = b(),
            "tlp" => self.cfg.tlp = b(),
            "autotune" => self.cfg.autotune = b(),
            "mss" => self.cfg.mss = num(v)?,
            "recv_buffer" => {
                self.cfg.recv_buffer = num(v)?;
                self.cfg.recv_buffer_initial = self.cfg.recv_buffer;
            }
            "send_buffer" => self.cfg.send_buffer = num(v)?,
            "time_wait_ms" => self.cfg.time_wait = ms()?,
            "initial_rto_ms" => self.cfg.initial_rto = ms()?,
            "min_rto_ms" => self.cfg.min_rto = ms()?,
            "syn_retries" => self.cfg.syn_retries = num(v)?,
            "max_retries" => self.cfg.max_retries = num(v)?,
            "linger_ms" => self.cfg.linger = Some(ms()?),
            "keepalive_s" => {
                let s = Duration::from_secs(num(v)?);
                self.cfg.keepalive = Some(Keepalive {
                    idle: s,
                    interval: s,
                    count: 3,
                });
            }
            "cc" => {
                self.cfg.congestion = match v {
                    "newreno" => CcAlgorithm::NewReno,
                    "cubic" => CcAlgorithm::Cubic,
                    _ => return Err(format!("cc {v}")),
                }
            }
            "ipv6" => {
                if b() {
                    self.local = "[2001:db8::1]:8080".parse().unwrap();
                    self.remote = "[2001:db8::2]:40000".parse().unwrap();
                }
            }
            "backlog" => self.backlog = num(v)?,
            "syn_backlog" => self.syn_backlog = Some(num(v)?),
            "cookies" => self.cookies = b(),
            "quickack" => self.cfg.quickack_segments = num(v)?,
            _ => return Err(format!("unknown config {k}")),
        }
        Ok(())
    }

    /// Advance the engine to `t`, firing timers and queueing outputs.
    fn run_until(&mut self, t: Instant) {
        loop {
            let mut next = self.conn.as_ref().and_then(|c| c.poll_at());
            if let Some(l) = self.listener.as_ref().and_then(|l| l.poll_at()) {
                next = Some(next.map_or(l, |n: Instant| n.min(l)));
            }
            match next {
                Some(n) if n <= t => {
                    self.now = self.now.max(n);
                    let before = self.out.len();
                    self.poll();
                    if self.out.len() == before && next == Some(self.now) {
                        // A deadline that produced nothing: make sure we move on.
                        let again = self.conn.as_ref().and_then(|c| c.poll_at());
                        if again == Some(self.now) {
                            break;
                        }
                    }
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
    }

    fn poll(&mut self) {
        let mut sink = VecSink::default();
        if let Some(c) = self.conn.as_mut() {
            c.poll_transmit(self.now, &mut sink);
        }
        if let Some(l) = self.listener.as_mut() {
            l.poll_transmit(self.now, &mut sink);
        }
        for s in sink.segments {
            if self.iss.is_none() && s.repr.flags.syn() {
                self.iss = Some(s.repr.seq);
            }
            self.out.push_back((self.now, s));
        }
    }

    fn conn(&mut self) -> Result<&mut Connection, String> {
        self.conn
            .as_mut()
            .ok_or_else(|| "no connection".to_string())
    }

    fn inject(&mut self, p: &PktSpec) -> Result<(), String> {
        let iss = self.iss.unwrap_or(0);
        let mut o = TcpOptions::default();
        if let Some(s) = &p.opts {
            o.mss = s.mss;
            o.window_scale = s.ws;
            o.sack_permitted = s.sack_ok;
            o.timestamps = s.ts.map(|(v, e)| (v.unwrap_or(0), e.unwrap_or(0)));
            for &(l, r) in &s.sacks {
                o.push_sack(l.wrapping_add(iss), r.wrapping_add(iss));
            }
        }
        let payload = vec![b'x'; p.len as usize];
        let seg = Segment {
            seq: p.start,
            ack: p.ack.map_or(0, |a| a.wrapping_add(iss)),
            flags: p.flags,
            window: p.win.unwrap_or(65535),
            urgent: p.urg.unwrap_or(0),
            options: o,
            payload: usnet_tcp::Payload::new(&payload),
            gso_size: 0,
            ce: false,
        };
        // Through the real encoding, as a stack would see it.
        let wire = OwnedSegment {
            local: self.remote,
            remote: self.local,
            repr: usnet_tcp::TcpRepr {
                src_port: self.remote.port(),
                dst_port: self.local.port(),
                seq: seg.seq,
                ack: seg.ack,
                flags: seg.flags,
                window: seg.window,
                urgent: seg.urgent,
                options: seg.options,
            },
            payload: payload.clone(),
            ect: false,
            ce: false,
        };
        let back =
            OwnedSegment::from_bytes(self.remote, self.local, &wire.to_bytes()).ok_or("encode")?;
        let seg = back.segment();
        if let Some(c) = self.conn.as_mut() {
            c.input(self.now, &seg);
        } else if let Some(l) = self.listener.as_mut() {
            let mut sink = VecSink::default();
            if let ListenEvent::Established(c) =
                l.input(self.now, self.local, self.remote, &seg, &mut sink)
            {
                l.push_accept(1);
                self.pending = Some(*c);
            }
            for s in sink.segments {
                if s.repr.flags.syn() {
                    self.iss = Some(s.repr.seq);
                }
                self.out.push_back((self.now, s));
            }
            if let Some(c) = self.pending.take() {
                self.conn = Some(c);
            }
        } else {
            return Err("no socket".into());
        }
        self.poll();
        Ok(())
    }

    fn expect(&mut self, t: Instant, p: &PktSpec) -> Result<(), String> {
        if self.out.is_empty() {
            self.run_until(t + self.tol);
        }
        let (at, s) = self
            .out
            .pop_front()
            .ok_or_else(|| "expected an outbound packet, none was sent".to_string())?;
        let dt = if at > t { at - t } else { t - at };
        if dt > self.tol {
            return Err(format!(
                "packet at {:.6} s, expected at {:.6} s: {:?}",
                secs(at),
                secs(t),
                s.repr
            ));
        }
        let r = &s.repr;
        let iss = self.iss.unwrap_or(0);
        let mut errs = Vec::new();
        if r.flags != p.flags {
            errs.push(format!("flags {:?} != {:?}", r.flags, p.flags));
        }
        let rel = r.seq.wrapping_sub(iss);
        if rel != p.start {
            errs.push(format!("seq {rel} != {}", p.start));
        }
        if s.payload.len() as u32 != p.len {
            errs.push(format!("len {} != {}", s.payload.len(), p.len));
        }
        if let Some(a) = p.ack {
            if r.ack != a || !r.flags.ack() {
                errs.push(format!("ack {} != {a}", r.ack));
            }
        }
        if let Some(w) = p.win {
            if r.window != w {
                errs.push(format!("win {} != {w}", r.window));
            }
        }
        if let Some(o) = &p.opts {
            let a = &r.options;
            if a.mss != o.mss {
                errs.push(format!("mss {:?} != {:?}", a.mss, o.mss));
            }
            if a.window_scale != o.ws {
                errs.push(format!("wscale {:?} != {:?}", a.window_scale, o.ws));
            }
            if a.sack_permitted != o.sack_ok {
                errs.push("sackOK differs".into());
            }
            match (a.timestamps, o.ts) {
                (None, None) => {}
                (Some((v, e)), Some((ev, ee))) => {
                    if ev.is_some_and(|x| x != v) || ee.is_some_and(|x| x != e) {
                        errs.push(format!("TS val {v} ecr {e} != {ev:?} {ee:?}"));
                    }
                }
                (x, y) => errs.push(format!("TS {x:?} != {y:?}")),
            }
            let got: Vec<(u32, u32)> = a.sacks().to_vec();
            if got != o.sacks {
                errs.push(format!("sack {got:?} != {:?}", o.sacks));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} in {:?} payload {}",
                errs.join(", "),
                r,
                s.payload.len()
            ))
        }
    }

    fn no_unexpected(&mut self, t: Instant) -> Result<(), String> {
        self.run_until(t);
        if let Some((at, s)) = self.out.front() {
            return Err(format!(
                "unexpected packet at {:.6} s: {:?} seq(rel) {} len {}",
                secs(*at),
                s.repr,
                s.repr.seq.wrapping_sub(self.iss.unwrap_or(0)),
                s.payload.len()
            ));
        }
        Ok(())
    }

    fn line(&mut self, t: Instant, rest: &str) -> Result<(), String> {
        if let Some(p) = rest.strip_prefix('>') {
            let spec = parse_pkt(p)?;
            return self.expect(t, &spec);
        }
        self.no_unexpected(t)?;
        if let Some(p) = rest.strip_prefix('<') {
            let spec = parse_pkt(p)?;
            return self.inject(&spec);
        }
        let w: Vec<&str> = rest.split_whitespace().collect();
        let cmd = w.first().copied().unwrap_or("").trim_end_matches("()");
        let arg = |i: usize| {
            w.get(i)
                .copied()
                .ok_or_else(|| format!("{cmd}: missing argument"))
        };
        match cmd {
            "config" => self.config(arg(1)?, arg(2)?)?,
            "tolerance_ms" => self.tol = Duration::from_millis(num(arg(1)?)?),
            "listen" => {
                let mut l = Listener::new(self.local, self.cfg.clone(), self.backlog, self.cookies);
                if let Some(n) = self.syn_backlog {
                    l.set_syn_backlog(n);
                }
                self.listener = Some(l);
            }
            "connect" => {
                self.conn = Some(Connection::connect(
                    self.local,
                    self.remote,
                    self.now,
                    self.cfg.clone(),
                ));
                self.poll();
            }
            "accept" => {
                let l = self.listener.as_mut().ok_or("no listener")?;
                l.accept().ok_or("accept: nothing to accept")?;
            }
            "write" => {
                let n: usize = num(arg(1)?.trim_start_matches('(').trim_end_matches(')'))?;
                let want = if w.get(2) == Some(&"=") {
                    num(arg(3)?)?
                } else {
                    n
                };
                let got = self.conn()?.send(&vec![b'y'; n]);
                if got != want {
                    return Err(format!("write returned {got}, expected {want}"));
                }
                self.poll();
            }
            "read" => {
                let n: usize = num(arg(1)?)?;
                let want = if w.get(2) == Some(&"=") {
                    num(arg(3)?)?
                } else {
                    n
                };
                let mut b = vec![0u8; n];
                let got = self.conn()?.recv(&mut b);
                if got != want {
                    return Err(format!("read returned {got}, expected {want}"));
                }
                self.poll();
            }
            "oob" => {
                let want = arg(1)?;
                let got = self.conn()?.recv_urgent();
                let ok = match want {
                    "none" => got.is_none(),
                    c => got == c.bytes().next(),
                };
                if !ok {
                    return Err(format!("oob {got:?}, expected {want}"));
                }
            }
            "shutdown" => {
                self.conn()?.shutdown_write();
                self.poll();
            }
            "close" => {
                self.conn()?.close();
                self.poll();
            }
            "abort" => {
                self.conn()?.abort();
                self.poll();
            }
            "state" => {
                let got = self.conn.as_ref().map_or(State::Closed, |c| c.state());
                if got.name() != arg(1)? {
                    return Err(format!("state {got}, expected {}", arg(1)?));
                }
            }
            "error" => {
                let got = self.conn.as_ref().and_then(|c| c.error());
                let name = match got {
                    None => "none",
                    Some(TcpError::Reset) => "RESET",
                    Some(TcpError::Refused) => "REFUSED",
                    Some(TcpError::TimedOut) => "TIMEDOUT",
                    Some(TcpError::Aborted) => "ABORTED",
                    Some(TcpError::HostUnreachable) => "HOSTUNREACH",
                    Some(TcpError::NetUnreachable) => "NETUNREACH",
                };
                if name != arg(1)? {
                    return Err(format!("error {name}, expected {}", arg(1)?));
                }
            }
            "stat" | "lstat" => {
                let stats = if cmd == "stat" {
                    self.conn.as_ref().map(|c| c.stats().clone())
                } else {
                    self.listener.as_ref().map(|l| l.stats().clone())
                }
                .ok_or("no socket")?;
                let key = arg(1)?;
                let got = stat(&stats, key).ok_or_else(|| format!("no counter {key}"))?;
                let want: u64 = num(arg(2)?)?;
                if got != want {
                    return Err(format!("{} = {got}, expected {want}", arg(1)?));
                }
            }
            "info" => {
                let c = self.conn.as_ref().ok_or("no connection")?;
                let i = c.info();
                let got: u64 = match arg(1)? {
                    "cwnd" => u64::from(i.cwnd),
                    "ssthresh" => u64::from(i.ssthresh),
                    "rto_ms" => i.rto.as_millis() as u64,
                    "snd_wnd" => u64::from(i.snd_wnd),
                    "in_flight" => u64::from(i.bytes_in_flight),
                    "backoff" => u64::from(i.backoff),
                    k => return Err(format!("unknown info {k}")),
                };
                let want: u64 = num(arg(2)?)?;
                if got != want {
                    return Err(format!("info {} = {got}, expected {want}", arg(1)?));
                }
            }
            "" => {}
            c => return Err(format!("unknown command {c:?}")),
        }
        Ok(())
    }

    fn run(&mut self, text: &str) -> Result<(), String> {
        let mut last = 0f64;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split("//").next().unwrap_or("");
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (ts, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let t = if let Some(r) = ts.strip_prefix('+') {
                last + num::<f64>(r)?
            } else {
                num::<f64>(ts)?
            };
            last = t;
            let at = Instant::from_nanos((t * 1e9).round() as u64);
            self.line(at, rest.trim())
                .map_err(|e| format!("{}:{}: {}\n    {}", self.name, n + 1, e, raw.trim()))?;
        }
        Ok(())
    }
}

fn secs(t: Instant) -> f64 {
    t.as_nanos() as f64 / 1e9
}

#[test]
fn scripts() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "pkt"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let only = std::env::var("PKT").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        ran += 1;
        if let Err(e) = Runner::new(&name).run(&text) {
            failures.push(e);
        }
    }
    eprintln!("{ran} scripts, {} failed", failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
