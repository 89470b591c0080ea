//! `usnet bench httpd`: the netmap/PASTE document's web-server measurement. wrk
//! (one thread, `-c100` by default) in a network namespace drives a phttpd-like
//! server that answers every request with the same response: 151 bytes in all (the
//! document's size; 64 body bytes), 4 KiB and 64 KiB bodies. The servers:
//!
//! - `nginx (Linux)`: nginx on the kernel, tuned (one worker, `access_log off`,
//!   keep-alive without a request limit, sendfile), serving the same body bytes from
//!   a file, at the server namespace's veth end;
//! - `httpd kernel`: `usnet httpd --api kernel` (Linux sockets, epoll) beside it;
//! - `httpd socket afpacket` / `httpd socket xdp`: `usnet httpd --api socket`, its
//!   own usnet stack on the same veth end through AF_PACKET / AF_XDP, with an
//!   address of its own;
//! - `httpd socket tap`: the same on a TAP whose Linux side is in wrk's namespace;
//! - `httpd zerocopy afpacket` / `xdp` / `tap`: `usnet httpd --api zerocopy`, the
//!   same server on usnet's zero-copy rings (requests parsed in the received
//!   buffers, answers written once into buffers sent in place), on the same links;
//! - `httpd zerocopy client afpacket`: the zero-copy server as a client process of a
//!   stack server (`usnet up --zero-copy` on the veth end, `usnet httpd --api
//!   zerocopy --stack`): the rings and the pool are shared memory, and the stack
//!   runs in another process on the same CPU.
//!
//! The server runs on CPU 1 (both processes, for the client configuration) and wrk
//! on CPU 0. One server runs at a time (an
//! AF_PACKET socket sees every frame of the veth, so a usnet stack left running
//! would tax the others); nginx stays up, idle while the others are measured.
//! Before wrk, one curl per configuration checks the response bytes. The table shows
//! medians over the runs, mean and p99 latency, wrk's errors (socket errors and
//! non-2xx answers: they must be 0) and the ratio to nginx measured in the same run.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde_json::{json, Value};
use usnet_report::{bar_plot_runs, median, write_json, Bar, Table};

use crate::tcp::{ip, is_root, Veth, VETH_ADDR, VETH_USNET};
use crate::web::{
    in_ns, need_tools, nginx_alerts, nginx_conf, spawn, start_stack_server, wait_serving, wrk, Bg,
    Res, WrkRun,
};

#[derive(Debug, Clone)]
pub struct HttpdBenchOptions {
    pub out: PathBuf,
    pub runs: usize,
    pub seconds: f64,
    pub connections: usize,
    /// Response body lengths (64: the 151-byte response).
    pub lengths: Vec<usize>,
    /// Only these servers: nginx, kernel, afpacket, xdp, tap (default: all).
    pub only: Vec<String>,
    /// `usnet httpd --batch`.
    pub batch: usize,
    /// `usnet httpd --spin-us` (socket api).
    pub spin_us: u64,
    /// `usnet httpd --buf-size` for the servers on AF_PACKET and TAP (AF_XDP keeps
    /// 2048: its chunks are at most a page).
    pub buf_size: usize,
}

impl Default for HttpdBenchOptions {
    fn default() -> Self {
        HttpdBenchOptions {
            out: PathBuf::from("bench-out/httpd"),
            runs: 5,
            seconds: 5.0,
            connections: 100,
            lengths: vec![64, 4096, 65536],
            only: Vec::new(),
            batch: 64,
            spin_us: 0,
            buf_size: 2048,
        }
    }
}

const NGINX_PORT: u16 = 8089;
/// nginx tuned for many small keep-alive requests (on top of [`nginx_conf`]'s
/// one worker, `access_log off`, sendfile and unlimited keep-alive requests).
const NGINX_EVENTS: &str = "multi_accept on;";
const NGINX_HTTP: &str = "tcp_nopush on; tcp_nodelay on; keepalive_timeout 65; \
    server_tokens off; open_file_cache max=64;";
const KERNEL_PORT: u16 = 8090;
const TAP_HOST: &str = "10.92.0.1";
const TAP_USNET: &str = "10.92.0.2";

/// Where a usnet httpd's stack sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    AfPacket,
    Xdp,
    Tap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sys {
    Nginx,
    Kernel,
    /// `--api socket` on a link.
    Socket(Link),
    /// `--api zerocopy` on a link.
    Zerocopy(Link),
    /// `--api zerocopy --stack`: a client of `usnet up --zero-copy` on AF_PACKET.
    ZcClient,
}

const SYSTEMS: [Sys; 9] = [
    Sys::Nginx,
    Sys::Kernel,
    Sys::Socket(Link::AfPacket),
    Sys::Zerocopy(Link::AfPacket),
    Sys::ZcClient,
    Sys::Socket(Link::Xdp),
    Sys::Zerocopy(Link::Xdp),
    Sys::Socket(Link::Tap),
    Sys::Zerocopy(Link::Tap),
];

impl Sys {
    fn short(self) -> &'static str {
        match self {
            Sys::Nginx => "nginx",
            Sys::Kernel => "kernel",
            Sys::Socket(Link::AfPacket) => "afpacket",
            Sys::Socket(Link::Xdp) => "xdp",
            Sys::Socket(Link::Tap) => "tap",
            Sys::Zerocopy(Link::AfPacket) => "zc-afpacket",
            Sys::Zerocopy(Link::Xdp) => "zc-xdp",
            Sys::Zerocopy(Link::Tap) => "zc-tap",
            Sys::ZcClient => "zc-client",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sys::Nginx => "nginx (Linux)",
            Sys::Kernel => "httpd kernel",
            Sys::Socket(Link::AfPacket) => "httpd socket afpacket",
            Sys::Socket(Link::Xdp) => "httpd socket xdp",
            Sys::Socket(Link::Tap) => "httpd socket tap",
            Sys::Zerocopy(Link::AfPacket) => "httpd zerocopy afpacket",
            Sys::Zerocopy(Link::Xdp) => "httpd zerocopy xdp",
            Sys::Zerocopy(Link::Tap) => "httpd zerocopy tap",
            Sys::ZcClient => "httpd zerocopy client afpacket",
        }
    }

    /// The usnet stack's link, for the socket and zero-copy servers.
    fn link(self) -> Option<Link> {
        match self {
            Sys::Socket(l) | Sys::Zerocopy(l) => Some(l),
            Sys::ZcClient => Some(Link::AfPacket),
            _ => None,
        }
    }
}

struct Net {
    veth: Veth,
    tap: String,
}

impl Net {
    fn server_ns(&self) -> &str {
        &self.veth.ns[0]
    }
    fn client_ns(&self) -> &str {
        &self.veth.ns[1]
    }
}

/// Where `sys` serves a body of `len` bytes.
fn url(sys: Sys, len: usize) -> String {
    match sys {
        Sys::Nginx => format!("http://{}:{NGINX_PORT}/r{len}", VETH_ADDR[0]),
        Sys::Kernel => format!("http://{}:{KERNEL_PORT}/r{len}", VETH_ADDR[0]),
        Sys::Socket(Link::Tap) | Sys::Zerocopy(Link::Tap) => {
            format!("http://{TAP_USNET}/r{len}")
        }
        Sys::Socket(_) | Sys::Zerocopy(_) | Sys::ZcClient => {
            format!("http://{VETH_USNET}/r{len}")
        }
    }
}

/// The stack server of [`Sys::ZcClient`].
const ZC_STACK: &str = "bench-httpd-zc";

/// Starts `usnet httpd` for `sys` (nginx runs all along); for the zero-copy
/// client, the stack server first. The httpd comes first in the list (it stops
/// before the stack server).
fn start_httpd(
    sys: Sys,
    len: usize,
    net: &Net,
    dir: &Path,
    a: &HttpdBenchOptions,
    core: usize,
) -> Res<Vec<Bg>> {
    let exe = std::env::current_exe()?;
    let ns = if sys.link() == Some(Link::Tap) {
        net.client_ns()
    } else {
        net.server_ns()
    };
    let mut c = in_ns(ns, core);
    c.arg(&exe).args([
        "httpd",
        "--quiet",
        "-l",
        &len.to_string(),
        "--batch",
        &a.batch.to_string(),
        "--core",
        &core.to_string(),
    ]);
    let mut stack = None;
    match sys {
        Sys::Nginx => unreachable!("nginx is not usnet httpd"),
        Sys::ZcClient => {
            stack = Some(start_stack_server(
                net.server_ns(),
                core,
                dir,
                ZC_STACK,
                &[
                    "--link".into(),
                    format!("afpacket:{}", net.veth.dev[0]),
                    "--addr".into(),
                    format!("{VETH_USNET}/24"),
                    "--zero-copy".into(),
                    // The two processes share the core: a loop that polls after
                    // its work takes the time the other one needs to answer.
                    "--spin-us".into(),
                    a.spin_us.to_string(),
                ],
            )?);
            c.args(["--api", "zerocopy", "--stack", ZC_STACK, "-p", "80"]);
            c.args(["--spin-us", &a.spin_us.to_string()]);
        }
        Sys::Kernel => {
            c.args(["--api", "kernel", "--bind", VETH_ADDR[0]]);
            c.args(["-p", &KERNEL_PORT.to_string()]);
        }
        Sys::Socket(link) | Sys::Zerocopy(link) => {
            let api = if matches!(sys, Sys::Zerocopy(_)) {
                "zerocopy"
            } else {
                "socket"
            };
            if link != Link::Xdp {
                c.args(["--buf-size", &a.buf_size.to_string()]);
            }
            c.args(["--api", api, "--link"]);
            match link {
                Link::AfPacket | Link::Xdp => {
                    let kind = if link == Link::Xdp { "xdp" } else { "afpacket" };
                    c.arg(format!("{kind}:{}", net.veth.dev[0]));
                    c.args(["--addr", &format!("{VETH_USNET}/24"), "-p", "80"]);
                }
                Link::Tap => {
                    c.arg(format!("tap:{}", net.tap));
                    c.args(["--addr", &format!("{TAP_USNET}/24")]);
                    c.args(["--host-addr", &format!("{TAP_HOST}/24"), "-p", "80"]);
                }
            }
            c.args(["--spin-us", &a.spin_us.to_string()]);
        }
    }
    let httpd = spawn(c, dir, &format!("httpd-{}-{len}", sys.short()))?;
    Ok(std::iter::once(httpd).chain(stack).collect())
}

/// One curl from wrk's namespace: the response must be the expected bytes (usnet
/// httpd: head and body exactly; nginx: status 200, the length and the body).
fn check_bytes(sys: Sys, len: usize, net: &Net, dir: &Path) -> Res<()> {
    let (hd, body) = (dir.join("check.head"), dir.join("check.body"));
    let u = url(sys, len);
    let out = Command::new("ip")
        .args(["netns", "exec", net.client_ns(), "curl", "-sS", "--fail"])
        .args(["--max-time", "10", "-D"])
        .arg(&hd)
        .arg("-o")
        .arg(&body)
        .arg(&u)
        .output()?;
    if !out.status.success() {
        return Err(format!("curl {u}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let want = usnet_httpd::Responses::new(len, &[])?;
    let want = want.response();
    let (got_h, got_b) = (std::fs::read(&hd)?, std::fs::read(&body)?);
    let hl = want.len() - len;
    if got_b != want[hl..] {
        return Err(format!(
            "{}: the body of {u} is not the expected {len} bytes",
            sys.name()
        )
        .into());
    }
    let head = String::from_utf8_lossy(&got_h);
    let ok = if sys == Sys::Nginx {
        head.starts_with("HTTP/1.1 200 OK\r\n")
            && head
                .to_ascii_lowercase()
                .contains(&format!("content-length: {len}\r\n"))
    } else {
        got_h == want[..hl]
    };
    if !ok {
        return Err(format!("{}: unexpected head from {u}:\n{head}", sys.name()).into());
    }
    Ok(())
}

struct Point {
    len: usize,
    sys: Sys,
    runs: Vec<WrkRun>,
}

impl Point {
    fn med(&self, f: impl Fn(&WrkRun) -> f64) -> f64 {
        median(&mut self.runs.iter().map(f).collect::<Vec<_>>())
    }
    fn errors(&self) -> u64 {
        self.runs.iter().map(|r| r.errors).sum()
    }
    /// Median CPU per request on the server's core, user and kernel (µs).
    fn cpu_us_per_req(&self) -> Option<(f64, f64)> {
        crate::cpu::median_pair(self.runs.iter().filter_map(|r| r.cpu_us_per_req()))
    }
}

pub fn run(a: &HttpdBenchOptions) -> Res<ExitCode> {
    if !is_root() {
        return Err("usnet bench httpd needs root (veth pair, namespaces, TAP, AF_XDP)".into());
    }
    need_tools(&["nginx", "wrk", "curl", "taskset"])?;
    crate::check_only(&a.only, &SYSTEMS.map(|s| s.short().to_string()))?;
    let systems: Vec<Sys> = SYSTEMS
        .into_iter()
        .filter(|s| a.only.is_empty() || a.only.iter().any(|o| o == s.short()))
        .collect();
    let (server_core, client_core) = if crate::cpus() >= 2 { (1, 0) } else { (0, 0) };
    let dir = std::env::temp_dir().join(format!("usnet-bench-httpd-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    for &len in &a.lengths {
        let r = usnet_httpd::Responses::new(len, &[])?;
        std::fs::write(www.join(format!("r{len}")), &r.response()[r.head_len()..])?;
    }
    let net = Net {
        veth: Veth::create()?,
        tap: format!("usnbht{}", std::process::id() % 100_000),
    };
    let mut notes = vec![format!(
        "server on CPU {server_core}, wrk -t1 -c{} on CPU {client_core}; one server at a time",
        a.connections
    )];

    let mut nginx = None;
    if systems.contains(&Sys::Nginx) {
        let conf = nginx_conf(
            &dir,
            &www,
            VETH_ADDR[0],
            NGINX_PORT,
            "kernel",
            NGINX_EVENTS,
            NGINX_HTTP,
        )?;
        let mut c = in_ns(net.server_ns(), server_core);
        c.args(["nginx", "-p", &dir.display().to_string(), "-c"])
            .arg(&conf);
        let mut bg = spawn(c, &dir, "nginx")?;
        wait_serving(
            net.client_ns(),
            &url(Sys::Nginx, a.lengths[0]),
            &mut bg,
            &dir,
        )?;
        nginx = Some(bg);
    }

    let mut points: Vec<Point> = Vec::new();
    for &len in &a.lengths {
        for &sys in &systems {
            let mut server = None;
            if sys != Sys::Nginx {
                // A new stack has a new MAC: the client must not keep the last one.
                let _ = ip(&["-n", net.client_ns(), "neigh", "flush", "all"]);
                let mut bg = start_httpd(sys, len, &net, &dir, a, server_core)?;
                if let Err(e) = wait_serving(net.client_ns(), &url(sys, len), &mut bg[0], &dir) {
                    notes.push(format!(
                        "{} with {len}-byte bodies skipped: {e}",
                        sys.name()
                    ));
                    eprintln!("usnet bench httpd: {}", notes.last().unwrap());
                    continue;
                }
                server = Some(bg);
            }
            check_bytes(sys, len, &net, &dir)?;
            let mut runs = Vec::new();
            for _ in 0..a.runs.max(1) {
                runs.push(wrk(
                    net.client_ns(),
                    client_core,
                    (server_core != client_core).then_some(server_core),
                    &url(sys, len),
                    a.connections,
                    a.seconds,
                )?);
            }
            points.push(Point { len, sys, runs });
            drop(server);
        }
    }
    drop(nginx);

    let mut table = Table::new(
        format!(
            "usnet httpd vs nginx on Linux: wrk -t1 -c{}, median of {} × {} s",
            a.connections, a.runs, a.seconds
        ),
        [
            "response",
            "server",
            "req/s",
            "× nginx",
            "× socket",
            "user µs/req",
            "kernel µs/req",
            "mean ms",
            "p99 ms",
            "errors",
            "runs (req/s)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut results = Vec::new();
    let mut bars = Vec::new();
    let mut total_errors = 0;
    for p in &points {
        let total = usnet_httpd::Responses::new(p.len, &[])?.response().len();
        let rps = p.med(|r| r.rps);
        let base = points
            .iter()
            .find(|q| q.len == p.len && q.sys == Sys::Nginx)
            .map(|q| q.med(|r| r.rps));
        let ratio = base.map(|b| rps / b);
        // The zero-copy server against the socket server on the same link.
        let vs_socket = match (p.sys, p.sys.link()) {
            (Sys::Zerocopy(_) | Sys::ZcClient, Some(l)) => points
                .iter()
                .find(|q| q.len == p.len && q.sys == Sys::Socket(l))
                .map(|q| rps / q.med(|r| r.rps)),
            _ => None,
        };
        let (mean, p99) = (p.med(|r| r.mean_ms), p.med(|r| r.p99_ms));
        let cpu = p.cpu_us_per_req();
        let (cpu_user, cpu_kernel) = (cpu.map(|c| c.0), cpu.map(|c| c.1));
        total_errors += p.errors();
        table.row(vec![
            format!("{total} B ({} B body)", p.len),
            p.sys.name().to_string(),
            format!("{rps:.0}"),
            ratio.map_or("-".into(), |r| format!("{r:.2}")),
            vs_socket.map_or("-".into(), |r| format!("{r:.2}")),
            crate::cpu::cell(cpu_user, 2),
            crate::cpu::cell(cpu_kernel, 2),
            format!("{mean:.3}"),
            format!("{p99:.3}"),
            p.errors().to_string(),
            p.runs
                .iter()
                .map(|r| format!("{:.0}", r.rps))
                .collect::<Vec<_>>()
                .join(" "),
        ]);
        let mut bar = Bar::new(p.sys.short(), p.runs.iter().map(|r| r.rps).collect());
        bar.baseline = base;
        bars.push((p.len, total, bar));
        results.push(json!({
            "body_bytes": p.len, "response_bytes": total, "server": p.sys.name(),
            "key": p.sys.short(), "median_rps": rps, "x_nginx": ratio,
            "x_socket": vs_socket,
            "mean_ms": mean, "p99_ms": p99, "errors": p.errors(),
            "cpu_user_us_per_req": cpu_user, "cpu_kernel_us_per_req": cpu_kernel,
            "runs": p.runs.iter().map(|r| json!({"rps": r.rps, "mean_ms": r.mean_ms,
                "p99_ms": r.p99_ms, "errors": r.errors,
                "cpu_us_per_req": r.cpu_us_per_req()})).collect::<Vec<_>>(),
        }));
    }
    table.print();
    for n in &notes {
        println!("note: {n}");
    }
    std::fs::create_dir_all(&a.out)?;
    let doc: Value = json!({"bench": "httpd", "connections": a.connections,
        "seconds": a.seconds, "runs": a.runs, "batch": a.batch, "spin_us": a.spin_us, "buf_size": a.buf_size,
        "results": results, "notes": notes});
    write_json(&a.out.join("httpd.json"), &doc)?;
    let mut md = table.to_markdown();
    for n in &notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push('\n');
    std::fs::write(a.out.join("httpd.md"), md)?;
    // One plot per response size (five bars each); httpd.png is the first size's.
    let mut plots = Vec::new();
    for (i, &len) in a.lengths.iter().enumerate() {
        let b: Vec<Bar> = bars
            .iter()
            .filter(|x| x.0 == len)
            .map(|x| x.2.clone())
            .collect();
        let Some(total) = bars.iter().find(|x| x.0 == len).map(|x| x.1) else {
            continue;
        };
        let name = if i == 0 {
            "httpd.png".to_string()
        } else {
            format!("httpd-{total}.png")
        };
        let title = format!(
            "usnet httpd vs nginx on Linux, {total}-byte responses (wrk -c{}; median, min–max, ratio to nginx)",
            a.connections
        );
        match bar_plot_runs(&a.out.join(&name), &title, "requests/s", &b) {
            Ok(()) => plots.push(name),
            Err(e) => eprintln!("plot {name} not drawn: {e}"),
        }
    }
    if let Some(e) = nginx_alerts(&dir, "kernel") {
        eprintln!("nginx logged errors:\n{e}");
    }
    println!(
        "wrote {}/httpd.json, httpd.md, {}",
        a.out.display(),
        plots.join(", ")
    );
    drop(net);
    let _ = std::fs::remove_dir_all(&dir);
    if total_errors > 0 {
        eprintln!("usnet bench httpd: wrk saw {total_errors} errors (they must be 0)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
