//! `usnet bench preload`: the same nginx, unmodified, on the Linux kernel and on a
//! usnet stack server through the LD_PRELOAD shim (`usnet run`), driven by wrk.
//!
//! Both servers sit in one network namespace on one end of a veth pair: nginx on the
//! kernel at that end's address, the usnet stack beside it on the same end through
//! AF_PACKET with its own address, nginx under the shim on the stack. wrk runs in the
//! other namespace. The servers (nginx, and the stack) are pinned to one core and wrk
//! to the other; the two systems take turns run by run. Responses of a small file
//! (151 bytes, the size of the zero-copy document's responses) and of 64 KiB,
//! keep-alive, `-c` connections; wrk's error counts are reported (they must be 0).
//!
//! Then, the same way, redis-server on the kernel and under the shim, driven by
//! redis-benchmark (GET and SET, without and with pipelining), and iperf3's server
//! on both, one stream each way (the client on Linux sends, then with `-R`
//! receives). Parts whose programs are not installed are skipped with one line.
//!
//! `via` [`Via::Seccomp`] puts the usnet side under the seccomp supervisor
//! (`usnet run --via seccomp`, which carries static and Go programs) instead of
//! the shim, to measure what that path costs on the same programs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use usnet_report::{bar_plot, median, write_json, Table};

use crate::tcp::{is_root, Veth, VETH_ADDR, VETH_USNET};
use crate::web::{
    in_ns, need_tools, nginx_alerts, nginx_conf, spawn, start_stack_server, wait_port,
    wait_serving, wrk, Bg, Res,
};

#[derive(Debug, Clone)]
pub struct PreloadBenchOptions {
    pub out: PathBuf,
    pub runs: usize,
    pub seconds: f64,
    pub connections: usize,
    /// Requests per redis-benchmark run and test.
    pub redis_requests: usize,
    /// `usnet up --spin-us` for the stack server.
    pub stack_spin_us: u64,
    /// `usnet up --pool-buffers` for the stack server.
    pub pool_buffers: bool,
    /// Only these parts ([`PARTS`]); empty: all.
    pub only: Vec<String>,
    /// How the usnet side's programs reach the stack: `usnet run --via`
    /// (`preload`: the LD_PRELOAD shim; `seccomp`: the supervisor that carries
    /// static and Go programs, measured here on the same dynamic programs).
    pub via: Via,
}

/// `usnet run --via` for the programs on usnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Preload,
    Seccomp,
}

impl Via {
    fn arg(self) -> &'static str {
        match self {
            Via::Preload => "preload",
            Via::Seccomp => "seccomp",
        }
    }

    /// The usnet system's name in the table.
    fn system(self) -> &'static str {
        match self {
            Via::Preload => "usnet (shim)",
            Via::Seccomp => "usnet (seccomp)",
        }
    }
}

/// The parts `--only` names: nginx's two files, redis, iperf3 (`iperf3` sends
/// to the server, `iperf3-R` receives from it), and PostgreSQL (pgbench).
pub const PARTS: [&str; 6] = [
    "nginx-151",
    "nginx-64k",
    "redis",
    "iperf3",
    "iperf3-R",
    "postgres",
];

impl PreloadBenchOptions {
    /// Whether `--only` leaves `part` in.
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// One measured row: a workload on one system.
struct Row {
    workload: String,
    system: &'static str,
    unit: &'static str,
    runs: Vec<f64>,
    errors: u64,
    /// Server-core CPU per unit of work of each measured run, user and kernel,
    /// in `CPU_UNIT`s of the workload's unit (µs per request, s per GB).
    cpu: Vec<(f64, f64)>,
}

impl Row {
    /// The unit the CPU columns are in.
    fn cpu_unit(&self) -> &'static str {
        if self.unit == "req/s" {
            "µs/req"
        } else {
            "s/GB"
        }
    }

    /// Median CPU per unit, user and kernel.
    fn cpu_median(&self) -> Option<(f64, f64)> {
        crate::cpu::median_pair(self.cpu.iter().copied())
    }
}

/// The server core: every server (the kernel's and usnet's, its stack server
/// too) is pinned to it, and its counters are what the CPU columns show.
const SERVER_CORE: usize = 1;

/// The server core, when the load generators have another one to run on.
fn server_core() -> Option<usize> {
    (crate::cpus() >= 2).then_some(SERVER_CORE)
}

const STACK: &str = "bench-preload";
const PORT: u16 = 8089;
/// nginx's files: the part's name, the file's name and its length.
const FILES: [(&str, &str, usize); 2] = [("nginx-151", "r151", 151), ("nginx-64k", "r64k", 65536)];
const REDIS_PORT: u16 = 6390;
const IPERF_PORT: u16 = 5290;
const PG_PORT: u16 = 5490;

pub fn run(a: &PreloadBenchOptions) -> Res<ExitCode> {
    crate::check_min("runs", a.runs as u64, 1)?;
    crate::check_only(&a.only, &PARTS.map(String::from))?;
    if !is_root() {
        return Err("usnet bench preload needs root (a veth pair between two namespaces)".into());
    }
    need_tools(&["nginx", "wrk", "curl", "taskset"])?;
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("usnet-bench-preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    for (_, name, len) in FILES {
        let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(www.join(name), body)?;
    }
    let veth = Veth::create()?;
    let (server_ns, client_ns) = (veth.ns[0].clone(), veth.ns[1].clone());
    let kernel_addr = VETH_ADDR[0];

    // The kernel's nginx.
    let conf_k = nginx_conf(&dir, &www, kernel_addr, PORT, "kernel", "", "")?;
    let mut c = in_ns(&server_ns, 1);
    c.args(["nginx", "-p", &dir.display().to_string(), "-c"])
        .arg(&conf_k);
    let mut nginx_k = spawn(c, &dir, "nginx-kernel")?;
    wait_serving(
        &client_ns,
        &format!("http://{kernel_addr}:{PORT}/r151"),
        &mut nginx_k,
        &dir,
    )?;

    // The usnet stack beside it on the same veth end, and nginx under the shim.
    // PostgreSQL runs as its own user, whom the stack admits by group.
    let pg_group = postgres_gid()
        .filter(|_| a.wants("postgres"))
        .map(|g| vec!["--group".to_string(), g])
        .unwrap_or_default();
    let stack = start_stack_server(
        &server_ns,
        1,
        &dir,
        STACK,
        &[
            "--link".into(),
            format!("afpacket:{}", veth.dev[0]),
            "--addr".into(),
            format!("{VETH_USNET}/24"),
            "--spin-us".into(),
            a.stack_spin_us.to_string(),
        ]
        .into_iter()
        .chain(a.pool_buffers.then(|| "--pool-buffers".to_string()))
        .chain(pg_group)
        .collect::<Vec<_>>(),
    )?;
    let conf_u = nginx_conf(&dir, &www, VETH_USNET, PORT, "usnet", "", "")?;
    let mut c = in_ns(&server_ns, 1);
    c.arg(&exe)
        .args([
            "run",
            "--stack",
            STACK,
            "--via",
            a.via.arg(),
            "--",
            "nginx",
            "-p",
            &dir.display().to_string(),
            "-c",
        ])
        .arg(&conf_u);
    let mut nginx_u = spawn(c, &dir, "nginx-usnet")?;
    wait_serving(
        &client_ns,
        &format!("http://{VETH_USNET}:{PORT}/r151"),
        &mut nginx_u,
        &dir,
    )?;

    let systems = [("Linux kernel", kernel_addr), (a.via.system(), VETH_USNET)];
    let mut rows: Vec<Row> = Vec::new();
    for (_, name, len) in FILES.into_iter().filter(|f| a.wants(f.0)) {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        let mut cpu: Vec<Vec<(f64, f64)>> = vec![Vec::new(); systems.len()];
        let mut errs = vec![0u64; systems.len()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let r = wrk(
                    &client_ns,
                    0,
                    server_core(),
                    &format!("http://{addr}:{PORT}/{name}"),
                    a.connections,
                    a.seconds,
                )?;
                per[i].push(r.rps);
                cpu[i].extend(r.cpu_us_per_req());
                errs[i] += r.errors;
            }
        }
        for (i, (sys, _)) in systems.iter().enumerate() {
            rows.push(Row {
                workload: format!("nginx {len} B, wrk -c{}", a.connections),
                system: sys,
                unit: "req/s",
                runs: per[i].clone(),
                errors: errs[i],
                cpu: cpu[i].clone(),
            });
        }
    }
    for t in ["kernel", "usnet"] {
        if let Some(e) = nginx_alerts(&dir, t) {
            eprintln!("nginx ({t}) logged errors:\n{e}");
        }
    }
    drop((nginx_u, nginx_k));

    let at = Setting {
        exe: &exe,
        dir: &dir,
        server_ns: &server_ns,
        client_ns: &client_ns,
        systems,
        via: a.via,
    };
    if a.wants("redis") {
        if need_tools(&["redis-server", "redis-benchmark", "redis-cli"]).is_ok() {
            rows.extend(redis(a, &at)?);
        } else {
            println!(
                "usnet bench preload: redis-server/redis-benchmark not installed: redis skipped"
            );
        }
    }
    if a.wants("postgres") {
        match postgres_bin() {
            Some(bin) if postgres_gid().is_some() => rows.extend(postgres(a, &at, &bin)?),
            _ => println!("usnet bench preload: PostgreSQL not installed: postgres skipped"),
        }
    }
    if a.wants("iperf3") || a.wants("iperf3-R") {
        if need_tools(&["iperf3"]).is_ok() {
            rows.extend(iperf3(a, &at)?);
        } else {
            println!("usnet bench preload: iperf3 not installed: iperf3 skipped");
        }
    }

    let mut table = Table::new(
        format!(
            "servers pinned to core 1, load generators on core 0 (median of {} runs)",
            a.runs
        ),
        [
            "workload",
            "system",
            "median",
            "unit",
            "× kernel",
            "CPU user",
            "CPU kernel",
            "CPU unit",
            "errors",
            "runs",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for pair in rows.chunks(2) {
        let kernel = median(&mut pair[0].runs.clone());
        for r in pair {
            let m = median(&mut r.runs.clone());
            let ratio = m / kernel;
            let cpu = r.cpu_median();
            let (cpu_user, cpu_kernel) = (cpu.map(|c| c.0), cpu.map(|c| c.1));
            table.row(vec![
                r.workload.clone(),
                r.system.to_string(),
                format!("{m:.0}"),
                r.unit.to_string(),
                format!("{ratio:.2}"),
                crate::cpu::cell(cpu_user, 2),
                crate::cpu::cell(cpu_kernel, 2),
                r.cpu_unit().to_string(),
                r.errors.to_string(),
                r.runs
                    .iter()
                    .map(|v| format!("{v:.0}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
            bars.push((format!("{} {}", r.system, r.workload), ratio));
            results.push(
                json!({"workload": r.workload, "system": r.system, "unit": r.unit,
                "median": m, "x_kernel": ratio, "errors": r.errors, "runs": r.runs,
                "cpu_unit": r.cpu_unit(), "cpu_user": cpu_user, "cpu_kernel": cpu_kernel,
                "cpu_runs": r.cpu}),
            );
        }
    }
    table.print();
    std::fs::create_dir_all(&a.out)?;
    let doc: Value = json!({"bench": "preload", "connections": a.connections, "seconds": a.seconds,
        "runs": a.runs, "redis_requests": a.redis_requests, "stack_spin_us": a.stack_spin_us, "pool_buffers": a.pool_buffers, "only": a.only, "via": a.via.arg(),
        "results": results});
    write_json(&a.out.join("preload.json"), &doc)?;
    std::fs::write(a.out.join("preload.md"), table.to_markdown())?;
    if let Err(e) = bar_plot(
        &a.out.join("preload.png"),
        "unmodified programs: usnet (LD_PRELOAD) against the kernel",
        "× the kernel",
        &bars,
    ) {
        eprintln!("plot not drawn: {e}");
    }
    println!(
        "wrote {}/preload.json, preload.md, preload.png",
        a.out.display()
    );
    drop(stack);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ExitCode::SUCCESS)
}

/// A server program in `ns` on core 1: on usnet through `via`, or (`None`) on the kernel.
fn server_cmd(
    exe: &std::path::Path,
    ns: &str,
    via: Option<Via>,
    prog: &str,
) -> std::process::Command {
    let mut c = in_ns(ns, 1);
    if let Some(via) = via {
        c.arg(exe)
            .args(["run", "--stack", STACK, "--via", via.arg(), "--", prog]);
    } else {
        c.arg(prog);
    }
    c
}

/// Runs `args` in `ns` on core 0 with a deadline; its standard output.
fn client_run(ns: &str, args: &[&str], limit: Duration) -> Res<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "taskset", "-c", "0", "timeout"])
        .arg(limit.as_secs().to_string())
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// redis-benchmark's `--csv` line for `test`: its requests/s.
pub(crate) fn redis_rps(csv: &str, test: &str) -> Option<f64> {
    csv.lines().find_map(|l| {
        let mut f = l.split(',').map(|v| v.trim_matches('"'));
        (f.next()? == test).then_some(())?;
        f.next()?.parse().ok()
    })
}

/// Where the servers and the load generators of one sitting run.
struct Setting<'a> {
    exe: &'a std::path::Path,
    dir: &'a std::path::Path,
    server_ns: &'a str,
    client_ns: &'a str,
    /// The kernel's and usnet's: name and address.
    systems: [(&'static str, &'static str); 2],
    via: Via,
}

impl Setting<'_> {
    /// `prog` with `args(address)` on both systems, each once it listens on `port`.
    fn start_servers(
        &self,
        prog: &str,
        port: u16,
        args: impl Fn(&str) -> Vec<String>,
    ) -> Res<Vec<Bg>> {
        let mut servers = Vec::new();
        for (i, (_, addr)) in self.systems.iter().enumerate() {
            let mut c = server_cmd(self.exe, self.server_ns, (i == 1).then_some(self.via), prog);
            c.args(args(addr));
            let mut bg = spawn(c, self.dir, &format!("{prog}-{i}"))?;
            wait_port(self.client_ns, addr, port, &mut bg, self.dir)?;
            servers.push(bg);
        }
        Ok(servers)
    }
}

/// redis-server on both systems; redis-benchmark GET and SET, -P 1 and -P 16.
fn redis(a: &PreloadBenchOptions, at: &Setting) -> Res<Vec<Row>> {
    let (client_ns, systems) = (at.client_ns, &at.systems);
    let servers = at.start_servers("redis-server", REDIS_PORT, |addr| {
        ["--port", &REDIS_PORT.to_string(), "--bind", addr]
            .into_iter()
            .chain(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .map(String::from)
            .collect()
    })?;
    let mut rows = Vec::new();
    for pipeline in [1usize, 16] {
        // Per test and system: requests/s of each run.
        let mut per = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        let mut cpu = [Vec::new(), Vec::new()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let n = (a.redis_requests * pipeline.min(4)).to_string();
                let (out, used) = crate::cpu::measure(server_core(), || {
                    client_run(
                        client_ns,
                        &[
                            "redis-benchmark",
                            "-h",
                            addr,
                            "-p",
                            &REDIS_PORT.to_string(),
                            "-t",
                            "set,get",
                            "-n",
                            &n,
                            "-c",
                            "50",
                            "-P",
                            &pipeline.to_string(),
                            "-q",
                            "--csv",
                        ],
                        Duration::from_secs(300),
                    )
                });
                let out = out?;
                // One run makes n SETs then n GETs: its CPU per request is shared.
                if let Some(u) = used {
                    let (us, ks) = u.per_total(2.0 * n.parse::<f64>().unwrap_or(0.0));
                    cpu[i].push((us * 1e6, ks * 1e6));
                }
                for (t, test) in ["GET", "SET"].iter().enumerate() {
                    let rps = redis_rps(&out, test)
                        .ok_or_else(|| format!("redis-benchmark printed no {test}: {out}"))?;
                    per[t][i].push(rps);
                }
            }
        }
        for (t, test) in ["GET", "SET"].iter().enumerate() {
            for (i, (sys, _)) in systems.iter().enumerate() {
                rows.push(Row {
                    workload: format!("redis {test} -c50 -P{pipeline}"),
                    system: sys,
                    unit: "req/s",
                    runs: per[t][i].clone(),
                    errors: 0,
                    cpu: cpu[i].clone(),
                });
            }
        }
    }
    drop(servers);
    Ok(rows)
}

/// iperf3's server on both systems; one stream from Linux, then one to it (`-R`).
fn iperf3(a: &PreloadBenchOptions, at: &Setting) -> Res<Vec<Row>> {
    let (client_ns, systems) = (at.client_ns, &at.systems);
    let servers = at.start_servers("iperf3", IPERF_PORT, |addr| {
        ["-s", "-B", addr, "-p", &IPERF_PORT.to_string()]
            .map(String::from)
            .to_vec()
    })?;
    let secs = a.seconds.ceil().max(1.0) as u64;
    let mut rows = Vec::new();
    let parts = [(false, "iperf3"), (true, "iperf3-R")];
    for reverse in parts.into_iter().filter(|p| a.wants(p.1)).map(|p| p.0) {
        let mut per = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let mut args = vec!["iperf3", "-c", addr, "-J"];
                let (p, t) = (IPERF_PORT.to_string(), secs.to_string());
                args.extend(["-p", &p, "-t", &t]);
                if reverse {
                    args.push("-R");
                }
                let (out, used) = crate::cpu::measure(server_core(), || {
                    client_run(client_ns, &args, Duration::from_secs(secs + 60))
                });
                let out = out?;
                let v: Value = serde_json::from_str(&out)?;
                if !v["error"].is_null() {
                    return Err(format!("iperf3: {}", v["error"]).into());
                }
                let bps = v["end"]["sum_received"]["bits_per_second"]
                    .as_f64()
                    .ok_or("iperf3 reported no received rate")?;
                per[i].push(bps / 1e6);
                // CPU seconds per GB moved in the window.
                let bytes = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
                if let Some(u) = used {
                    cpu[i].push(u.per_total(bytes / 1e9));
                }
            }
        }
        for (i, (sys, _)) in systems.iter().enumerate() {
            rows.push(Row {
                workload: if reverse {
                    "iperf3 -R: the server sends".into()
                } else {
                    "iperf3: the server receives".into()
                },
                system: sys,
                unit: "Mbit/s",
                runs: per[i].clone(),
                errors: 0,
                cpu: cpu[i].clone(),
            });
        }
    }
    drop(servers);
    Ok(rows)
}

/// The directory of the newest PostgreSQL server installed (Debian's layout).
pub fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("postgres").is_file())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// The group of the `postgres` user, if there is one.
pub fn postgres_gid() -> Option<String> {
    let o = std::process::Command::new("id")
        .args(["-g", "postgres"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// `setpriv` arguments that run the rest of its command line as the `postgres` user.
const AS_POSTGRES: [&str; 6] = [
    "--reuid",
    "postgres",
    "--regid",
    "postgres",
    "--init-groups",
    "--",
];

/// A PostgreSQL cluster in `dir/data`, made by `initdb` (within 120 s) as the
/// `postgres` user, who is given `dir`; it trusts clients from the networks `allow`
/// names (`ADDRESS/BITS`).
pub fn postgres_cluster(bin: &Path, dir: &Path, allow: &[&str]) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    let st = std::process::Command::new("chown")
        .arg("postgres:postgres")
        .arg(dir)
        .status()?;
    if !st.success() {
        return Err("chown of PostgreSQL's directory failed".into());
    }
    let db = dir.join("data");
    let o = std::process::Command::new("timeout")
        .arg("120")
        .arg("setpriv")
        .args(AS_POSTGRES)
        .arg(bin.join("initdb"))
        .arg("-D")
        .arg(&db)
        .args(["-A", "trust", "-U", "postgres", "--no-sync"])
        .output()?;
    if !o.status.success() {
        return Err(format!("initdb: {}", String::from_utf8_lossy(&o.stderr)).into());
    }
    let hba = db.join("pg_hba.conf");
    let mut rules = std::fs::read_to_string(&hba)?;
    for net in allow {
        rules.push_str(&format!("host all all {net} trust\n"));
    }
    std::fs::write(&hba, rules)?;
    Ok(())
}

/// The arguments of `setpriv` that run the server of the cluster in `dir`
/// ([`postgres_cluster`]) as the `postgres` user, listening on `listen` (a
/// comma-separated list) at `port`, its Unix socket in `dir`.
pub fn postgres_server_args(bin: &Path, dir: &Path, listen: &str, port: u16) -> Vec<String> {
    let mut args: Vec<String> = AS_POSTGRES.map(String::from).to_vec();
    args.push(bin.join("postgres").display().to_string());
    args.extend([
        "-D".to_string(),
        dir.join("data").display().to_string(),
        "-c".into(),
        format!("listen_addresses={listen}"),
        "-p".into(),
        port.to_string(),
        "-c".into(),
        format!("unix_socket_directories={}", dir.display()),
        "-c".into(),
        "fsync=off".into(),
    ]);
    args
}

/// The value after `key` in pgbench's report (`tps = `, `actually processed: `).
fn pgbench_value(out: &str, key: &str) -> Option<f64> {
    let rest = &out[out.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// PostgreSQL on both systems, as its own user, a data directory each; pgbench's
/// read-only transactions from 4 clients, on kept connections and on a new
/// connection (a forked backend) per transaction.
fn postgres(a: &PreloadBenchOptions, at: &Setting, bin: &Path) -> Res<Vec<Row>> {
    let (client_ns, systems) = (at.client_ns, &at.systems);
    let mut servers = Vec::new();
    for (i, (_, addr)) in systems.iter().enumerate() {
        let data = at.dir.join(format!("pg-{i}"));
        postgres_cluster(bin, &data, &["0.0.0.0/0"])?;
        let mut c = server_cmd(at.exe, at.server_ns, (i == 1).then_some(at.via), "setpriv");
        c.args(postgres_server_args(bin, &data, addr, PG_PORT));
        let mut bg = spawn(c, at.dir, &format!("postgres-{i}"))?;
        wait_port(client_ns, addr, PG_PORT, &mut bg, at.dir)?;
        servers.push(bg);
    }
    let pgbench = bin.join("pgbench");
    let pgbench = pgbench.to_str().ok_or("PostgreSQL's path is not UTF-8")?;
    let port = PG_PORT.to_string();
    for (_, addr) in systems.iter() {
        client_run(
            client_ns,
            &[
                pgbench, "-h", addr, "-p", &port, "-U", "postgres", "-i", "-q", "postgres",
            ],
            Duration::from_secs(120),
        )?;
    }
    let secs = (a.seconds.ceil().max(1.0) as u64).to_string();
    let mut rows = Vec::new();
    for reconnect in [false, true] {
        let mut per = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let mut args = vec![pgbench, "-h", addr, "-p", &port, "-U", "postgres"];
                args.extend(["-S", "-c", "4", "-j", "2", "-T", &secs]);
                if reconnect {
                    args.push("-C");
                }
                args.push("postgres");
                let (out, used) = crate::cpu::measure(server_core(), || {
                    client_run(client_ns, &args, Duration::from_secs(120))
                });
                let out = out?;
                let tps = pgbench_value(&out, "tps = ")
                    .ok_or_else(|| format!("pgbench printed no rate: {out}"))?;
                let done = pgbench_value(&out, "actually processed: ").unwrap_or(0.0);
                per[i].push(tps);
                if let Some(u) = used {
                    let (us, ks) = u.per_total(done);
                    cpu[i].push((us * 1e6, ks * 1e6));
                }
            }
        }
        for (i, (sys, _)) in systems.iter().enumerate() {
            rows.push(Row {
                workload: if reconnect {
                    "pgbench -S -c4, a connection per transaction".into()
                } else {
                    "pgbench -S -c4".into()
                },
                system: sys,
                unit: "req/s",
                runs: per[i].clone(),
                errors: 0,
                cpu: cpu[i].clone(),
            });
        }
    }
    for mut bg in servers {
        // A fast shutdown, so no backend or shared memory outlives the bench.
        // SAFETY: kill(2) on our own child, no memory arguments.
        unsafe { libc::kill(bg.0.id() as i32, libc::SIGINT) };
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while bg.0.try_wait()?.is_none() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pgbench_reports() {
        let out = "number of transactions actually processed: 1234\nlatency average = 0.6 ms\ntps = 6492.867446 (without initial connection time)\n";
        assert_eq!(pgbench_value(out, "tps = "), Some(6492.867446));
        assert_eq!(pgbench_value(out, "actually processed: "), Some(1234.0));
        assert_eq!(pgbench_value(out, "nothing: "), None);
    }

    #[test]
    fn reads_redis_benchmarks_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"41666.67\",\"0.6\"\n\"GET\",\"45454.55\",\"0.5\"\n";
        assert_eq!(redis_rps(csv, "GET"), Some(45454.55));
        assert_eq!(redis_rps(csv, "SET"), Some(41666.67));
        assert_eq!(redis_rps(csv, "LPUSH"), None);
    }
}
