//! `usnet demo`: the main job. Two stacks in two processes on a shared-memory link
//! (no root, no set-up): this process is one stack (library mode), a `usnet up` child
//! is the other (with its built-in services and control socket). It runs ping and UDP
//! echo both ways and over both IP versions, a 64 MiB TCP transfer through the
//! peer's TCP echo service with every byte checked, HTTP GET /bytes/N (pattern
//! checked) and POST (SHA-256 compared) against the peer's HTTP service, then prints
//! a summary table.

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use usnet_report::Table;
use usnet_runtime::{NetStack, PingSocket, TcpStream, UdpSocket};
use usnet_session::ctl::msg::{Done, Ping, PingEvent, Request, Stat};
use usnet_session::ctl::{call, call_one, socket_path};

use crate::up::{self, UpArgs};
use crate::CmdResult;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// UDP echo round trips per IP version.
    #[arg(long, default_value_t = 2000)]
    pub datagrams: u32,
    /// MiB sent through the peer's TCP echo service over IPv4 (and an eighth of it
    /// over IPv6).
    #[arg(long, default_value_t = 64)]
    pub tcp_mib: u64,
}

/// One step's outcome: `summary` goes into the table, `detail` (the rest of what was
/// measured, or the whole error) into the notes under it, so the table stays within
/// 80 columns.
struct Row {
    step: String,
    ok: bool,
    summary: String,
    detail: String,
}

impl Row {
    /// The row of a step that gave `(summary, detail)` or failed.
    fn of<E: std::fmt::Display>(step: String, r: Result<(String, String), E>) -> Row {
        match r {
            Ok((summary, detail)) => Row {
                step,
                ok: true,
                summary,
                detail,
            },
            Err(e) => Row::failed(step, e),
        }
    }

    fn failed(step: String, e: impl std::fmt::Display) -> Row {
        Row {
            step,
            ok: false,
            summary: "see the notes".into(),
            detail: e.to_string(),
        }
    }
}

/// Width of the notes (two spaces of indent included).
const NOTES_WIDTH: usize = 80;

/// `text` wrapped at spaces to `width` columns, continuation lines indented by
/// `indent` spaces.
fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut col = 0;
    for word in text.split(' ') {
        let n = word.chars().count();
        if col > indent && col + 1 + n > width {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            col = indent;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += n;
    }
    out
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        // Reap it, but never wait without a deadline.
        let end = Instant::now() + Duration::from_secs(5);
        while let Ok(None) = self.0.try_wait() {
            if Instant::now() >= end {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn up_args(link: &str, name: &str, addrs: [&str; 2], services: &str) -> UpArgs {
    UpArgs {
        addrs: addrs
            .iter()
            .map(|a| a.parse().expect("valid demo address"))
            .collect(),
        services: services.split(',').map(String::from).collect(),
        buffers: 8192,
        ..UpArgs::embedded(link.into(), name.into())
    }
}

pub fn run(a: DemoArgs) -> CmdResult {
    let t0 = Instant::now();
    let tag = format!("demo-{}", std::process::id());
    let link = format!("shm:{tag}");
    let peer_name = format!("{tag}-b");
    println!("usnet demo: two stacks on {link}");
    println!("  this process: 10.77.0.1 / fd77::1; a `usnet up` child: 10.77.0.2 / fd77::2");

    let child = Command::new(std::env::current_exe()?)
        .args([
            "up",
            "--link",
            &link,
            "--name",
            &peer_name,
            "--addr",
            "10.77.0.2/24",
            "--addr",
            "fd77::2/64",
        ])
        .args([
            "--services",
            "echo,discard,chargen,http",
            "--zero-copy",
            "--quiet",
            "--duration",
            "120",
        ])
        .stdin(Stdio::null())
        .spawn()?;
    let mut child = ChildGuard(child);
    let ctl = socket_path(&peer_name);
    let started = Instant::now();
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        if let Some(st) = child.0.try_wait()? {
            return Err(format!("the peer stack exited early ({st})").into());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err("the peer stack did not come up within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let net = up::start(&up_args(
        &link,
        &format!("{tag}-a"),
        ["10.77.0.1/24", "fd77::1/64"],
        "http",
    ))?;
    let mut rows = Vec::new();
    for dst in ["10.77.0.2", "fd77::2"] {
        rows.push(ping_step(&net, dst.parse()?, 5));
    }
    for dst in ["10.77.0.2", "fd77::2"] {
        rows.push(udp_echo_step(
            &net,
            SocketAddr::new(dst.parse()?, 7),
            a.datagrams,
        ));
    }
    rows.push(chargen_step(&net));
    if a.tcp_mib > 0 {
        rows.push(tcp_echo_step(&net, "10.77.0.2:7".parse()?, a.tcp_mib << 20));
        rows.push(tcp_echo_step(&net, "[fd77::2]:7".parse()?, a.tcp_mib << 17));
        rows.push(zerocopy_echo_step(
            &net,
            "10.77.0.2:7".parse()?,
            a.tcp_mib << 18,
        ));
    }
    rows.push(http_step(&net, "http://10.77.0.2/bytes/16777216", 16 << 20));
    rows.push(http_step(&net, "http://[fd77::2]/bytes/1000003", 1_000_003));
    rows.push(http_post_step(&net, "http://10.77.0.2/upload", 4 << 20));
    rows.push(server_client_step(
        &peer_name,
        "http://10.77.0.1/bytes/8388608",
        8 << 20,
    ));
    rows.push(zerocopy_client_step(&net, &peer_name));
    rows.push(peer_ping_step(&ctl));
    rows.push(peer_stat_step(&ctl));

    let _ = call_one::<Done>(&ctl, &Request::Stop);
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.0.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    net.shutdown();

    let mut t = Table::new(
        "usnet demo",
        vec!["step".into(), "result".into(), "summary".into()],
    );
    let mut failed = 0;
    for r in &rows {
        failed += !r.ok as usize;
        t.row(vec![
            r.step.clone(),
            if r.ok { "ok" } else { "FAILED" }.into(),
            r.summary.clone(),
        ]);
    }
    t.print();
    println!("notes");
    for r in rows.iter().filter(|r| !r.detail.is_empty()) {
        println!(
            "  {}",
            wrap(&format!("{}: {}", r.step, r.detail), NOTES_WIDTH - 2, 4)
        );
    }
    println!();
    println!(
        "{} steps, {} failed, {:.1} s",
        rows.len(),
        failed,
        t0.elapsed().as_secs_f64()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn ping_step(net: &NetStack, dst: IpAddr, count: u16) -> Row {
    let sock = PingSocket::open(net);
    let mut rtts = Vec::new();
    for seq in 1..=count {
        if sock.send(dst, seq, 56).is_err() {
            continue;
        }
        if let Ok((r, Some(rtt))) = sock.recv(Duration::from_secs(2)) {
            if r.seq == seq {
                rtts.push(rtt.as_secs_f64() * 1e6);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (summary, detail) = if rtts.is_empty() {
        ("no replies".to_string(), String::new())
    } else {
        rtts.sort_by(f64::total_cmp);
        (
            format!("{}/{count} replies", rtts.len()),
            format!(
                "rtt min/median/max {:.1}/{:.1}/{:.1} µs",
                rtts[0],
                rtts[rtts.len() / 2],
                rtts[rtts.len() - 1]
            ),
        )
    };
    Row {
        step: format!("ping {dst}"),
        ok: rtts.len() == count as usize,
        summary,
        detail,
    }
}

fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8)
        .collect();
    v[..4].copy_from_slice(&seq.to_be_bytes());
    v
}

fn udp_echo_step(net: &NetStack, to: SocketAddr, n: u32) -> Row {
    const SIZES: [usize; 4] = [64, 512, 1472, 4000];
    const WINDOW: u32 = 16;
    let run = || -> std::io::Result<(u32, u32, u64, f64)> {
        let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }
            .parse()
            .expect("addr");
        let mut sock = UdpSocket::bind(net, any)?;
        sock.set_read_timeout(Some(Duration::from_millis(500)));
        let t = Instant::now();
        let (mut sent, mut good, mut bytes) = (0u32, 0u32, 0u64);
        let mut buf = vec![0u8; 65536];
        while sent < n.min(WINDOW) {
            sock.send_to(&payload(sent, SIZES[sent as usize % 4]), to)?;
            sent += 1;
        }
        while good < n {
            let (len, from) = match sock.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
                Err(e) => return Err(e),
            };
            let seq = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes"));
            if from == to && buf[..len] == payload(seq, SIZES[seq as usize % 4])[..] {
                good += 1;
                bytes += len as u64;
            }
            if sent < n {
                sock.send_to(&payload(sent, SIZES[sent as usize % 4]), to)?;
                sent += 1;
            }
        }
        Ok((sent, good, bytes, t.elapsed().as_secs_f64()))
    };
    match run() {
        Ok((sent, good, bytes, secs)) => Row {
            step: format!("udp echo {to}"),
            ok: good == n,
            summary: format!("{good}/{sent} echoed intact"),
            detail: format!(
                "64 B..4000 B, fragments included, {:.0} round trips/s, {:.1} MB/s",
                good as f64 / secs,
                2.0 * bytes as f64 / secs / 1e6
            ),
        },
        Err(e) => Row::failed(format!("udp echo {to}"), e),
    }
}

/// Byte `i` of the TCP test stream (not periodic at small powers of two).
fn tcp_pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 17) as u8 ^ (i >> 13) as u8
}

/// Streams `total` bytes to the peer's TCP echo service from one thread while
/// another reads the echo and checks every byte.
fn tcp_echo_step(net: &NetStack, to: SocketAddr, total: u64) -> Row {
    let step = format!("tcp echo {to}");
    let run = || -> std::io::Result<(f64, String)> {
        use std::io::{Read, Write};
        let t = Instant::now();
        let mut s = TcpStream::connect_timeout(net, to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        // One thread writes, this one reads the echo (`Read`/`Write` for `&TcpStream`).
        let stream = std::sync::Arc::new(s);
        let ws = stream.clone();
        let w = std::thread::spawn(move || -> std::io::Result<()> {
            let mut buf = vec![0u8; 256 << 10];
            let mut sent = 0u64;
            while sent < total {
                let n = (total - sent).min(buf.len() as u64) as usize;
                for (k, b) in buf[..n].iter_mut().enumerate() {
                    *b = tcp_pattern(sent + k as u64);
                }
                (&*ws).write_all(&buf[..n])?;
                sent += n as u64;
            }
            ws.shutdown(std::net::Shutdown::Write)
        });
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        loop {
            let n = (&*stream).read(&mut buf)?;
            if n == 0 {
                break;
            }
            if let Some(k) = (0..n).find(|&k| buf[k] != tcp_pattern(got + k as u64)) {
                return Err(std::io::Error::other(format!(
                    "byte {} came back wrong",
                    got + k as u64
                )));
            }
            got += n as u64;
        }
        // EOF came back, so the writer has shut down its side; the deadline only
        // guards against a writer stuck in a send the peer never drains.
        let end = Instant::now() + Duration::from_secs(10);
        while !w.is_finished() {
            if Instant::now() >= end {
                return Err(std::io::Error::other("the writer is stuck"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        w.join()
            .map_err(|_| std::io::Error::other("writer panicked"))??;
        let secs = t.elapsed().as_secs_f64();
        if got != total {
            return Err(std::io::Error::other(format!(
                "{got} of {total} bytes came back"
            )));
        }
        let i = stream.info()?;
        let detail = format!(
            "rtt {:?}, cwnd {} KiB, retransmits {}",
            i.srtt.unwrap_or_default(),
            i.cwnd >> 10,
            i.total_retransmits
        );
        Ok((secs, detail))
    };
    match run() {
        Ok((secs, detail)) => Row {
            step,
            ok: true,
            summary: format!(
                "{} MiB, {:.0} MB/s each way",
                total >> 20,
                total as f64 / secs / 1e6
            ),
            detail: format!("out and back, every byte checked; {detail}"),
        },
        Err(e) => Row::failed(step, e),
    }
}

/// The same echo through the zero-copy rings: this process writes the pattern into
/// pool buffers it submits in TX slots (each one segment, sent in place) and checks
/// the echo where it lies, in the received frames' buffers.
fn zerocopy_echo_step(net: &NetStack, to: SocketAddr, total: u64) -> Row {
    use usnet_stack::zerocopy::{Slot, NO_BUF, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_SHUT_WR};
    let step = format!("zero-copy tcp echo {to}");
    let in_place_before = net.with(|s| s.counters().tcp_zc_tx_in_place);
    let mut port = net.with(|s| s.zc_port(256, 256));
    let run = |port: &mut usnet_stack::zerocopy::ZcPort| -> Result<f64, String> {
        let t = Instant::now();
        let h = net
            .with(|s| s.zc_connect(port, to))
            .map_err(|e| format!("connect: {e}"))?;
        let end = t + Duration::from_secs(60);
        let connected = net.wait_ready(&[h], Some(Duration::from_secs(5)), |r| r.connected);
        if connected.is_empty() {
            return Err("no connection in 5 s".into());
        }
        let (mut sent, mut got, mut shut, mut eof) = (0u64, 0u64, false, false);
        while !eof {
            if Instant::now() >= end {
                return Err(format!("{got} of {total} bytes back after 60 s"));
            }
            net.with(|s| -> Result<(), String> {
                let head = s.zc_headroom() as usize;
                let piece = s.zc_piece_len(h).map_err(|e| e.to_string())? as u64;
                while sent < total && port.tx.tx_space() > 1 {
                    let Some(b) = s.zc_alloc(port) else { break };
                    let n = (total - sent).min(piece) as usize;
                    let buf = s.zc_buf_mut(port, b).expect("just allocated");
                    for (k, x) in buf[head..head + n].iter_mut().enumerate() {
                        *x = tcp_pattern(sent + k as u64);
                    }
                    port.tx.push(Slot::new(h, b, head as u32, n as u32, 0));
                    sent += n as u64;
                }
                if sent == total && !shut && port.tx.push(Slot::new(h, NO_BUF, 0, 0, SLOT_SHUT_WR))
                {
                    shut = true;
                }
                s.zc_sync(port);
                while port.rx.head != port.rx.tail {
                    let slot = *port.rx.slot(port.rx.head);
                    if slot.flags & SLOT_ERROR != 0 {
                        return Err(format!("connection failed after {got} bytes"));
                    }
                    if slot.flags & SLOT_EOF != 0 {
                        eof = true;
                    }
                    if slot.len > 0 {
                        let bytes = s.zc_bytes(port, &slot).expect("a delivered buffer");
                        if let Some(k) =
                            (0..bytes.len()).find(|&k| bytes[k] != tcp_pattern(got + k as u64))
                        {
                            return Err(format!("byte {} came back wrong", got + k as u64));
                        }
                        got += u64::from(slot.len);
                    }
                    port.rx.head = port.rx.next(port.rx.head);
                }
                s.zc_sync(port);
                Ok(())
            })?;
            net.wait_ready(&[h], Some(Duration::from_millis(2)), |r| r.readable);
        }
        let secs = t.elapsed().as_secs_f64();
        net.with(|s| {
            port.tx.push(Slot::new(h, NO_BUF, 0, 0, SLOT_CLOSE));
            s.zc_sync(port);
        });
        if got != total {
            return Err(format!("{got} of {total} bytes came back"));
        }
        Ok(secs)
    };
    let r = run(&mut port);
    let held = port.held_buffers();
    let bad = port.stats().bad_slots;
    net.with(|s| s.zc_close_port(port));
    let in_place = net.with(|s| s.counters().tcp_zc_tx_in_place) - in_place_before;
    match r {
        Ok(secs) if held == 0 && bad == 0 => Row {
            step,
            ok: true,
            summary: format!(
                "{} MiB, {:.0} MB/s each way",
                total >> 20,
                total as f64 / secs / 1e6
            ),
            detail: format!(
                "ring API (usnet_stack::zerocopy): {in_place} segments sent from the \
                 application's buffers in place, the echo checked where it arrived"
            ),
        },
        Ok(_) => Row::failed(step, format!("{held} buffers still held, {bad} bad slots")),
        Err(e) => Row::failed(step, e),
    }
}

fn chargen_step(net: &NetStack) -> Row {
    let run = || -> std::io::Result<usize> {
        let mut sock = UdpSocket::bind(net, "0.0.0.0:0".parse().expect("addr"))?;
        sock.set_read_timeout(Some(Duration::from_secs(2)));
        let mut total = 0;
        for _ in 0..3 {
            sock.send_to(b"x", "10.77.0.2:19".parse().expect("addr"))?;
            let mut buf = [0u8; 1024];
            let n = sock.recv(&mut buf)?;
            if !buf[..n]
                .iter()
                .all(|&b| (b' '..=b'~').contains(&b) || b == b'\r' || b == b'\n')
            {
                return Err(std::io::Error::other("chargen sent non-printable bytes"));
            }
            total += n;
        }
        Ok(total)
    };
    match run() {
        Ok(n) => Row {
            step: "chargen 10.77.0.2:19".into(),
            ok: true,
            summary: format!("3 replies, {n} characters"),
            detail: "printable, of the RFC 864 pattern".into(),
        },
        Err(e) => Row::failed("chargen 10.77.0.2:19".into(), e),
    }
}

/// A separate process, a client of the peer's stack server, fetches `url` from this
/// process's HTTP service: its bytes cross the link and then the server's shared-memory
/// rings (`usnet get --stack`). The digest must be the pattern's.
fn server_client_step(stack: &str, url: &str, n: usize) -> Row {
    let step = "client process of the peer's server".to_string();
    let run = || -> Result<(String, String), Box<dyn std::error::Error>> {
        let t = Instant::now();
        let mut child = Command::new(std::env::current_exe()?)
            .args(["get", "--stack", stack, "--sha256", "--timeout", "10", url])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the client process did not finish within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let secs = t.elapsed().as_secs_f64();
        let mut out = String::new();
        if let Some(mut o) = child.stdout.take() {
            std::io::Read::read_to_string(&mut o, &mut out)?;
        }
        if !status.success() {
            return Err(format!("usnet get exited with {status}").into());
        }
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        let mut off = 0u64;
        while (off as usize) < n {
            let part = usnet_http::pattern_slice(off, (n - off as usize).min(1 << 16));
            h.update(part);
            off += part.len() as u64;
        }
        let want = usnet_http::hex(h.finalize().as_slice());
        if out.trim() != want {
            return Err(format!("digest {} is not the pattern's {want}", out.trim()).into());
        }
        Ok((
            format!("{} MiB, {:.0} MB/s", n >> 20, n as f64 / secs / 1e6),
            format!(
                "`usnet get --stack {stack} {url}` in its own process: the bytes cross \
                 the link, then the server's shared-memory rings; SHA-256 matches \
                 (the rate includes the process start)"
            ),
        ))
    };
    Row::of(step, run())
}

/// `usnet httpd --api zerocopy --stack PEER`: a client process of the peer's server
/// on its zero-copy rings; this stack fetches from it, every byte checked.
fn zerocopy_client_step(net: &NetStack, stack: &str) -> Row {
    const LEN: u64 = 4 << 20;
    let url = "http://10.77.0.2:8081/";
    let step = "zero-copy client process of the peer's server".to_string();
    let run = || -> Result<(String, String), Box<dyn std::error::Error>> {
        let child = Command::new(std::env::current_exe()?)
            .args(["httpd", "--api", "zerocopy", "--stack", stack, "-p", "8081"])
            .args(["-l", &LEN.to_string(), "--duration", "30", "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let mut child = ChildGuard(child);
        // The server listens once its port is open: try until it answers.
        let deadline = Instant::now() + Duration::from_secs(10);
        let row = loop {
            let row = http_step(net, url, LEN);
            if row.ok || Instant::now() > deadline {
                break row;
            }
            if let Some(st) = child.0.try_wait()? {
                return Err(format!("usnet httpd exited ({st})").into());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Its session ends with it: the server closes the port and takes back every
        // buffer it held (as for a client that dies).
        drop(child);
        if !row.ok {
            return Err(row.summary.into());
        }
        Ok((
            row.summary,
            format!(
                "`usnet httpd --api zerocopy --stack {stack}`: a process with the peer's \
                 packet pool and zero-copy rings mapped; it writes each answer into pool \
                 buffers that the peer's stack sends in place; {}",
                row.detail
            ),
        ))
    };
    Row::of(step, run())
}

fn peer_ping_step(ctl: &std::path::Path) -> Row {
    let mut rtts = Vec::new();
    let req = Request::Ping(Ping {
        count: 3,
        interval_ms: 10,
        ..Ping::to("fd77::1".parse().expect("an address"))
    });
    let r = call(ctl, &req, |ev: PingEvent| match ev {
        PingEvent::Reply { rtt_us, .. } => {
            rtts.push(rtt_us);
            true
        }
        PingEvent::Done { .. } => false,
        _ => true,
    });
    let step = "peer pings fd77::1 (usnet ping)".to_string();
    match r {
        Ok(()) => Row {
            step,
            ok: rtts.len() == 3,
            summary: format!("{}/3 replies", rtts.len()),
            detail: format!(
                "rtts {:?} µs",
                rtts.iter().map(|r| r.round()).collect::<Vec<_>>()
            ),
        },
        Err(e) => Row::failed(step, e),
    }
}

fn peer_stat_step(ctl: &std::path::Path) -> Row {
    let r = call_one::<Stat>(ctl, &Request::Stat);
    let stat = r.as_ref().ok().cloned().unwrap_or_default();
    let c = |k: &str| stat.counters.get(k).copied().unwrap_or(0);
    let drops: u64 = [
        "drop_input_queue_full",
        "udp_rx_queue_full",
        "udp_rx_bad_checksum",
        "drop_pool_exhausted",
    ]
    .iter()
    .map(|k| c(k))
    .sum();
    let step = "peer counters (usnet stat)".to_string();
    if let Err(e) = r {
        return Row::failed(step, e);
    }
    Row {
        step,
        ok: drops == 0,
        summary: format!(
            "drops {drops}, retransmits {}",
            c("tcp_retransmit_segments")
        ),
        detail: format!(
            "udp in {} / out {}, reassembled v4 {} v6 {}, echo replies {}+{}, tcp segments in {} / out {}",
            c("udp_rx"),
            c("udp_tx"),
            c("ip4_reassembled"),
            c("ip6_reassembled"),
            c("icmp4_tx_echo_reply"),
            c("icmp6_tx_echo_reply"),
            c("tcp_rx"),
            c("tcp_tx_segments"),
        ),
    }
}

/// `GET /bytes/N` from the peer's HTTP service, every byte checked against the
/// documented pattern.
fn http_step(net: &NetStack, url: &str, n: u64) -> Row {
    let step = format!("http GET {url}");
    let run = || -> Result<(String, String), Box<dyn std::error::Error>> {
        let u = usnet_http::parse_url(url)?;
        let t = Instant::now();
        let mut off = 0u64;
        let mut bad = None;
        let f = crate::get::exchange(
            net,
            &u,
            "GET",
            None,
            Duration::from_secs(10),
            &mut |_| {},
            &mut |d| {
                if bad.is_none() {
                    bad = usnet_http::check_pattern(d, off);
                }
                off += d.len() as u64;
                Ok(())
            },
        )?;
        let secs = t.elapsed().as_secs_f64();
        if f.head.status != 200 {
            return Err(format!("HTTP {} {}", f.head.status, f.head.reason).into());
        }
        if let Some(at) = bad {
            return Err(format!("byte {at} differs from the pattern").into());
        }
        if f.bytes != n {
            return Err(format!("{} of {n} bytes", f.bytes).into());
        }
        Ok((
            format!("{n} B, {:.0} MB/s", n as f64 / secs / 1e6),
            "every byte checked against the pattern".to_string(),
        ))
    };
    Row::of(step, run())
}

/// `POST` of `n` bytes to the peer's HTTP service, which answers their SHA-256.
fn http_post_step(net: &NetStack, url: &str, n: u64) -> Row {
    use sha2::{Digest, Sha256};
    let step = format!("http POST {url}");
    let run = || -> Result<(String, String), Box<dyn std::error::Error>> {
        let u = usnet_http::parse_url(url)?;
        let mut want = Sha256::new();
        let mut fill = |b: &mut [u8], off: u64| {
            for (k, x) in b.iter_mut().enumerate() {
                *x = tcp_pattern(off + k as u64);
            }
            want.update(&*b);
        };
        let mut answer = Vec::new();
        let t = Instant::now();
        let f = crate::get::exchange(
            net,
            &u,
            "POST",
            Some((n, &mut fill)),
            Duration::from_secs(10),
            &mut |_| {},
            &mut |d| {
                answer.extend_from_slice(d);
                Ok(())
            },
        )?;
        let secs = t.elapsed().as_secs_f64();
        let want = usnet_http::hex(&want.finalize());
        let got = String::from_utf8_lossy(&answer).trim().to_string();
        if f.head.status != 200 {
            return Err(format!("HTTP {} {}: {got}", f.head.status, f.head.reason).into());
        }
        if got != want {
            return Err(format!("the server says sha256 {got}, we computed {want}").into());
        }
        Ok((
            format!("{n} B, {:.0} MB/s", n as f64 / secs / 1e6),
            format!("the server's SHA-256 matches ({}...)", &want[..16]),
        ))
    };
    Row::of(step, run())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_wrap_within_the_width() {
        let text = "peer counters (usnet stat): udp in 4003 / out 4003, reassembled v4 500 v6 1000, echo replies 5+5, tcp segments in 58009 / out 66513";
        let w = wrap(text, 60, 4);
        assert!(w.lines().all(|l| l.chars().count() <= 60), "{w}");
        assert!(w.lines().skip(1).all(|l| l.starts_with("    ")));
        let words: Vec<&str> = w.split_whitespace().collect();
        assert_eq!(words, text.split(' ').collect::<Vec<_>>());
        assert_eq!(wrap("short", 60, 4), "short");
    }
}
