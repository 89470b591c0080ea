//! `usnet bench shards`: how a server scales with the cores it is given. For N = 1
//! up to the cores available, wrk (`-tN -c(connections × N)`) in a namespace drives,
//! over one veth:
//!
//! - `usnet httpd --api socket --shards N` and `--api zerocopy --shards N` on
//!   AF_PACKET: N complete stacks, one thread each pinned to its own core, the
//!   kernel's fanout group steering each connection to its shard
//!   (`usnet_link::bpf::shard_steering`);
//! - nginx with N workers under the shim (`usnet run`) on a stack server of N
//!   shards (`usnet up --shards N` on AF_PACKET): each worker on its own shard;
//! - nginx on Linux with N workers (`worker_cpu_affinity auto`) on the same veth.
//!
//! Each point reports requests/s, its ratio to the same server with N = 1 and to
//! nginx with the same N, and two CPU costs per request: the server's own
//! (its process tree's user + system time from /proc) and the machine's (every
//! core's busy time: the server, wrk and the kernel's packet work together). For
//! the usnet servers it also reports the frames handed between shards (0 when the
//! link steers every frame to its owner; the stack server counts the frames it
//! redirected to a shard holding the port too).
//!
//! On a machine with few cores wrk shares them with the server, so N = cores
//! measures how the server shares a saturated machine: the checks there are that N
//! shards are not slower than one and that the CPU per request does not grow with
//! N. With cores to spare (wrk elsewhere), the same table shows the scaling.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde_json::{json, Value};
use usnet_report::{bar_plot_runs, median, write_json, Bar, Table};

use crate::tcp::{ip, is_root, Veth, VETH_ADDR, VETH_USNET};
use crate::web::{
    need_tools, nginx_alerts, nginx_conf_workers, spawn, wait_serving, wait_stack_server,
    wrk_threads, Bg, Res,
};

#[derive(Debug, Clone)]
pub struct ShardsBenchOptions {
    pub out: PathBuf,
    pub runs: usize,
    pub seconds: f64,
    /// wrk connections per shard (per nginx worker).
    pub connections: usize,
    /// Response body lengths (64: the 151-byte response).
    pub lengths: Vec<usize>,
    /// The largest N (default: the cores available).
    pub max_shards: usize,
}

impl Default for ShardsBenchOptions {
    fn default() -> Self {
        ShardsBenchOptions {
            out: PathBuf::from("bench-out/shards"),
            runs: 3,
            seconds: 3.0,
            connections: 100,
            lengths: vec![64, 4096],
            max_shards: crate::cpus(),
        }
    }
}

const NGINX_PORT: u16 = 8089;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sys {
    Socket,
    Zerocopy,
    Shim,
    Nginx,
}

/// The stack server the shim's nginx runs on.
const SHIM_STACK: &str = "bench-shards";

impl Sys {
    fn short(self) -> &'static str {
        match self {
            Sys::Socket => "socket",
            Sys::Zerocopy => "zc",
            Sys::Shim => "shim",
            Sys::Nginx => "nginx",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Sys::Socket => "usnet httpd socket",
            Sys::Zerocopy => "usnet httpd zerocopy",
            Sys::Shim => "nginx (usnet run, up --shards N)",
            Sys::Nginx => "nginx (Linux)",
        }
    }
    fn url(self, len: usize) -> String {
        match self {
            Sys::Nginx => format!("http://{}:{NGINX_PORT}/r{len}", VETH_ADDR[0]),
            Sys::Shim => format!("http://{VETH_USNET}:{NGINX_PORT}/r{len}"),
            _ => format!("http://{VETH_USNET}/r{len}"),
        }
    }
}

/// One wrk run and what it cost.
struct Run {
    rps: f64,
    errors: u64,
    /// CPU µs per request: the server's process tree, the whole machine.
    server_us: Option<f64>,
    machine_us: Option<f64>,
}

struct Point {
    len: usize,
    sys: Sys,
    n: usize,
    runs: Vec<Run>,
    /// Frames handed between shards (usnet), summed over the shards.
    handed: Option<u64>,
}

impl Point {
    fn med(&self, f: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
        let mut v: Vec<f64> = self.runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(&mut v))
    }
}

/// Starts the server: its processes, the one that answers last (the one to wait
/// for) last.
fn start(sys: Sys, n: usize, len: usize, veth: &Veth, dir: &Path, www: &Path) -> Res<Vec<Bg>> {
    let exe = std::env::current_exe()?;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &veth.ns[0]]);
    let what = format!("{}-{n}-{len}", sys.short());
    let nginx_conf = |addr: &str| {
        nginx_conf_workers(
            dir,
            www,
            addr,
            NGINX_PORT,
            &format!("{}{n}", sys.short()),
            "multi_accept on;",
            "tcp_nopush on; tcp_nodelay on; keepalive_timeout 65; server_tokens off; \
             open_file_cache max=64;",
            n,
        )
    };
    match sys {
        Sys::Nginx => {
            let conf = nginx_conf(VETH_ADDR[0])?;
            c.args(["nginx", "-p", &dir.display().to_string(), "-c"])
                .arg(&conf);
            Ok(vec![spawn(c, dir, &what)?])
        }
        Sys::Shim => {
            // The stack server's shards pin themselves from core 0 up, as nginx's
            // workers do (`worker_cpu_affinity auto`).
            let mut up = Command::new("ip");
            up.args(["netns", "exec", &veth.ns[0]]).arg(&exe).args([
                "up",
                "--name",
                SHIM_STACK,
                "--services",
                "none",
                "--quiet",
                "--link",
                &format!("afpacket:{}", veth.dev[0]),
                "--addr",
                &format!("{VETH_USNET}/24"),
                "--shards",
                &n.to_string(),
            ]);
            let mut stack = spawn(up, dir, &format!("up-{what}"))?;
            wait_stack_server(&mut stack, dir, SHIM_STACK)?;
            let conf = nginx_conf(VETH_USNET)?;
            c.arg(&exe)
                .args(["run", "--stack", SHIM_STACK, "--", "nginx", "-p"])
                .arg(dir)
                .arg("-c")
                .arg(&conf);
            Ok(vec![stack, spawn(c, dir, &what)?])
        }
        Sys::Socket | Sys::Zerocopy => {
            let api = if sys == Sys::Socket {
                "socket"
            } else {
                "zerocopy"
            };
            c.arg(&exe).args([
                "httpd",
                "--quiet",
                "--api",
                api,
                "--link",
                &format!("afpacket:{}", veth.dev[0]),
                "--addr",
                &format!("{VETH_USNET}/24"),
                "-p",
                "80",
                "-l",
                &len.to_string(),
                "--shards",
                &n.to_string(),
                "--core",
                "0",
            ]);
            Ok(vec![spawn(c, dir, &what)?])
        }
    }
}

/// The frames the shim's stack server handed or redirected between its shards
/// (`usnet stat`'s rows per shard), summed.
fn stack_handed(dir: &Path) -> Option<u64> {
    let out = Command::new(std::env::current_exe().ok()?)
        .args(["stat", "--json", "--stack", SHIM_STACK])
        .env("USNET_RUN_DIR", dir)
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let c = &v["counters"];
    Some(c["shard_handoff_out"].as_u64()? + c["shard_redirected"].as_u64().unwrap_or(0))
}

/// One curl: the body must be the expected bytes.
fn check_body(sys: Sys, len: usize, veth: &Veth, dir: &Path) -> Res<()> {
    let body = dir.join("check.body");
    let u = sys.url(len);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &veth.ns[1],
            "curl",
            "-sS",
            "--fail",
            "--max-time",
            "10",
            "-o",
        ])
        .arg(&body)
        .arg(&u)
        .output()?;
    if !out.status.success() {
        return Err(format!("curl {u}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let want = usnet_httpd::Responses::new(len, &[])?;
    let want = &want.response()[want.head_len()..];
    if std::fs::read(&body)? != want {
        return Err(format!(
            "{}: the body of {u} is not the expected {len} bytes",
            sys.name()
        )
        .into());
    }
    Ok(())
}

/// The frames a sharded `usnet httpd` handed between its shards, from its log.
fn handed(log: &str) -> Option<u64> {
    let mut total = None;
    for l in log.lines().filter(|l| l.starts_with("usnet httpd: shard ")) {
        let n: u64 = l
            .split(';')
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        *total.get_or_insert(0) += n;
    }
    total
}

pub fn run(a: &ShardsBenchOptions) -> Res<ExitCode> {
    if !is_root() {
        return Err("usnet bench shards needs root (veth pair, namespaces, AF_PACKET)".into());
    }
    crate::check_min("runs", a.runs as u64, 1)?;
    crate::check_min("connections", a.connections as u64, 1)?;
    crate::check_min("max-shards", a.max_shards as u64, 1)?;
    need_tools(&["nginx", "wrk", "curl"])?;
    let cores = crate::cpus();
    let max = a.max_shards.clamp(1, cores.max(1));
    let dir = std::env::temp_dir().join(format!("usnet-bench-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    for &len in &a.lengths {
        let r = usnet_httpd::Responses::new(len, &[])?;
        std::fs::write(www.join(format!("r{len}")), &r.response()[r.head_len()..])?;
    }
    let veth = Veth::create()?;
    let wrk_cpus = format!("0-{}", cores - 1);
    let notes = vec![format!(
        "{cores} cores; servers pinned from core 0 up, wrk -tN -c{}·N on every core \
         (it shares the cores with the server); one server at a time",
        a.connections
    )];
    let mut points = Vec::new();
    for &len in &a.lengths {
        for n in 1..=max {
            for sys in [Sys::Socket, Sys::Zerocopy, Sys::Shim, Sys::Nginx] {
                // A new stack has a new MAC: the client must not keep the last one.
                let _ = ip(&["-n", &veth.ns[1], "neigh", "flush", "all"]);
                let mut bgs = start(sys, n, len, &veth, &dir, &www)?;
                let last = bgs.last_mut().expect("a server");
                wait_serving(&veth.ns[1], &sys.url(len), last, &dir)?;
                check_body(sys, len, &veth, &dir)?;
                let pids: Vec<u32> = bgs.iter().map(|b| b.0.id()).collect();
                let tree = || -> Option<f64> {
                    pids.iter().map(|&p| crate::cpu::process_tree_secs(p)).sum()
                };
                let mut runs = Vec::new();
                for _ in 0..a.runs.max(1) {
                    let before = tree();
                    let machine = crate::cpu::sample_machine();
                    let r = wrk_threads(
                        &veth.ns[1],
                        &wrk_cpus,
                        n,
                        None,
                        &sys.url(len),
                        a.connections * n,
                        a.seconds,
                    )?;
                    let after = tree();
                    let used =
                        machine.and_then(|m| crate::cpu::sample_like(&m).map(|l| m.until(&l)));
                    let reqs = r.rps * a.seconds.ceil().max(1.0);
                    runs.push(Run {
                        rps: r.rps,
                        errors: r.errors,
                        server_us: before
                            .zip(after)
                            .map(|(b, a)| (a - b) / reqs.max(1.0) * 1e6),
                        machine_us: used.map(|u| {
                            let (us, k) = u.per_total(r.rps * u.secs);
                            (us + k) * 1e6
                        }),
                    });
                }
                let shim_handed = (sys == Sys::Shim).then(|| stack_handed(&dir)).flatten();
                // nginx (the last) first, then the stack server it ran on.
                while bgs.pop().is_some() {}
                let log =
                    std::fs::read_to_string(dir.join(format!("{}-{n}-{len}.log", sys.short())))
                        .unwrap_or_default();
                let handed = match sys {
                    Sys::Nginx => None,
                    Sys::Shim => shim_handed,
                    _ => handed(&log),
                };
                points.push(Point {
                    len,
                    sys,
                    n,
                    runs,
                    handed,
                });
            }
        }
    }

    let mut table = Table::new(
        format!(
            "shards: usnet httpd --shards N, nginx with N workers under the shim (up --shards N) and on Linux, wrk -tN -c{}·N, median of {} × {} s",
            a.connections, a.runs, a.seconds
        ),
        [
            "response",
            "server",
            "N",
            "req/s",
            "× N=1",
            "× nginx",
            "server µs/req",
            "machine µs/req",
            "handed",
            "errors",
            "runs (req/s)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut results = Vec::new();
    let mut errors = 0;
    for p in &points {
        let total = usnet_httpd::Responses::new(p.len, &[])?.response().len();
        let rps = p.med(|r| Some(r.rps)).unwrap_or(0.0);
        let rps_of = |sys: Sys, n: usize| {
            points
                .iter()
                .find(|q| q.len == p.len && q.sys == sys && q.n == n)
                .and_then(|q| q.med(|r| Some(r.rps)))
        };
        let x1 = rps_of(p.sys, 1).map(|b| rps / b);
        let xn = rps_of(Sys::Nginx, p.n).map(|b| rps / b);
        let (srv, mach) = (p.med(|r| r.server_us), p.med(|r| r.machine_us));
        let errs: u64 = p.runs.iter().map(|r| r.errors).sum();
        errors += errs;
        table.row(vec![
            format!("{total} B"),
            p.sys.name().into(),
            p.n.to_string(),
            format!("{rps:.0}"),
            x1.map_or("-".into(), |x| format!("{x:.2}")),
            xn.map_or("-".into(), |x| format!("{x:.2}")),
            crate::cpu::cell(srv, 2),
            crate::cpu::cell(mach, 2),
            p.handed.map_or("-".into(), |h| h.to_string()),
            errs.to_string(),
            p.runs
                .iter()
                .map(|r| format!("{:.0}", r.rps))
                .collect::<Vec<_>>()
                .join(" "),
        ]);
        results.push(json!({
            "body_bytes": p.len, "response_bytes": total, "server": p.sys.name(),
            "key": p.sys.short(), "n": p.n, "median_rps": rps, "x_n1": x1, "x_nginx": xn,
            "server_cpu_us_per_req": srv, "machine_cpu_us_per_req": mach,
            "handed": p.handed, "errors": errs,
            "runs": p.runs.iter().map(|r| json!({"rps": r.rps, "errors": r.errors,
                "server_cpu_us_per_req": r.server_us, "machine_cpu_us_per_req": r.machine_us}))
                .collect::<Vec<_>>(),
        }));
    }
    table.print();
    for n in &notes {
        println!("note: {n}");
    }
    std::fs::create_dir_all(&a.out)?;
    let doc: Value = json!({"bench": "shards", "cores": cores, "connections_per_shard": a.connections,
        "seconds": a.seconds, "runs": a.runs, "results": results, "notes": notes});
    write_json(&a.out.join("shards.json"), &doc)?;
    let mut md = table.to_markdown();
    for n in &notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push('\n');
    std::fs::write(a.out.join("shards.md"), md)?;
    let mut plots = Vec::new();
    for (i, &len) in a.lengths.iter().enumerate() {
        // Each against Linux's nginx with as many workers.
        let nginx = |n: usize| {
            points
                .iter()
                .find(|q| q.len == len && q.sys == Sys::Nginx && q.n == n)
                .and_then(|q| q.med(|r| Some(r.rps)))
        };
        let bars: Vec<Bar> = points
            .iter()
            .filter(|p| p.len == len)
            .map(|p| {
                let mut b = Bar::new(
                    format!("{}×{}", p.sys.short(), p.n),
                    p.runs.iter().map(|r| r.rps).collect(),
                );
                b.baseline = nginx(p.n).filter(|_| p.sys != Sys::Nginx);
                b
            })
            .collect();
        let total = usnet_httpd::Responses::new(len, &[])?.response().len();
        let name = if i == 0 {
            "shards.png".to_string()
        } else {
            format!("shards-{total}.png")
        };
        let title = format!(
            "requests/s by shards (workers), {total}-byte responses (median, min–max, ratio to nginx)"
        );
        match bar_plot_runs(&a.out.join(&name), &title, "requests/s", &bars) {
            Ok(()) => plots.push(name),
            Err(e) => eprintln!("plot {name} not drawn: {e}"),
        }
    }
    for n in 1..=max {
        for sys in [Sys::Shim, Sys::Nginx] {
            if let Some(e) = nginx_alerts(&dir, &format!("{}{n}", sys.short())) {
                eprintln!("nginx logged errors:\n{e}");
            }
        }
    }
    println!(
        "wrote {}/shards.json, shards.md, {}",
        a.out.display(),
        plots.join(", ")
    );
    drop(veth);
    let _ = std::fs::remove_dir_all(&dir);
    if errors > 0 {
        eprintln!("usnet bench shards: wrk saw {errors} errors (they must be 0)");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoffs_are_read_from_the_shard_lines() {
        let log = "usnet httpd: shard 0: 1 connections, 2 requests; 3 frames handed out, 0 in, 1 copies to all\n\
                   usnet httpd: shard 1: 1 connections, 2 requests; 4 frames handed out, 3 in, 0 copies to all\n\
                   usnet httpd: 2 connections, 4 requests";
        assert_eq!(handed(log), Some(7));
        assert_eq!(handed("usnet httpd: 2 connections"), None);
    }
}
