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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_report::{bar_plot, median, write_json, Table};

use crate::tcp::{is_root, Veth, VETH_ADDR, VETH_USNET};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Debug, Clone)]
pub struct PreloadBenchOptions {
    pub out: PathBuf,
    pub runs: usize,
    pub seconds: f64,
    pub connections: usize,
}

const STACK: &str = "bench-preload";
const PORT: u16 = 8089;
const FILES: [(&str, usize); 2] = [("r151", 151), ("r64k", 65536)];

/// A background process, killed and reaped on drop.
struct Bg(Child, String);

impl Drop for Bg {
    fn drop(&mut self) {
        // SAFETY: kill with the pid of a child we own (SIGTERM first: a clean stop).
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(3);
        while let Ok(None) = self.0.try_wait() {
            if Instant::now() > end {
                crate::kill_and_reap(&mut self.0, Duration::from_secs(5));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn in_ns(ns: &str, core: usize) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "taskset", "-c", &core.to_string()]);
    c
}

fn spawn(mut c: Command, dir: &Path, what: &str) -> Res<Bg> {
    let log = std::fs::File::create(dir.join(format!("{what}.log")))?;
    let child = c
        .env("USNET_RUN_DIR", dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    Ok(Bg(child, what.into()))
}

fn nginx_conf(dir: &Path, www: &Path, addr: &str, tag: &str) -> Res<PathBuf> {
    let d = dir.display();
    let conf = dir.join(format!("nginx-{tag}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx-{tag}.pid;\n\
             error_log {d}/nginx-{tag}.err warn;\nuser root;\n\
             events {{ worker_connections 4096; use epoll; }}\n\
             http {{\n access_log off;\n sendfile on;\n keepalive_requests 1000000;\n\
             client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n\
             uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
             server {{ listen {addr}:{PORT}; root {}; }}\n}}\n",
            www.display()
        ),
    )?;
    Ok(conf)
}

/// Waits until `http://addr:PORT/r151` answers from namespace `ns`.
fn wait_serving(ns: &str, addr: &str, bg: &mut Bg, dir: &Path) -> Res<()> {
    let url = format!("http://{addr}:{PORT}/r151");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "--max-time",
                "1",
                "--fail",
                &url,
            ])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        if let Some(s) = bg.0.try_wait()? {
            let log =
                std::fs::read_to_string(dir.join(format!("{}.log", bg.1))).unwrap_or_default();
            return Err(format!("{} exited ({s}): {log}", bg.1).into());
        }
        if Instant::now() > end {
            return Err(format!("{} does not answer {url}", bg.1).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One wrk run: (requests/s, errors: socket errors plus non-2xx answers).
fn wrk(ns: &str, url: &str, a: &PreloadBenchOptions) -> Res<(f64, u64)> {
    let secs = a.seconds.ceil().max(1.0) as u64;
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "taskset",
            "-c",
            "0",
            "timeout",
            &(secs + 30).to_string(),
        ])
        .args([
            "wrk",
            "-t1",
            &format!("-c{}", a.connections),
            &format!("-d{secs}s"),
            url,
        ])
        .output()
        .map_err(|e| format!("cannot run wrk (apt install wrk): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk {url}: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))?;
    let mut errors = 0u64;
    for l in text.lines() {
        if let Some(rest) = l.trim().strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            errors += rest
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
        if let Some(rest) = l.trim().strip_prefix("Non-2xx or 3xx responses:") {
            errors += rest.trim().parse::<u64>().unwrap_or(0);
        }
    }
    Ok((rps, errors))
}

pub fn run(a: &PreloadBenchOptions) -> Res<ExitCode> {
    if !is_root() {
        return Err("usnet bench preload needs root (a veth pair between two namespaces)".into());
    }
    for tool in ["nginx", "wrk", "curl", "taskset"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map_or(true, |s| !s.success())
        {
            return Err(format!(
                "{tool} is needed (apt install {})",
                if tool == "taskset" {
                    "util-linux"
                } else {
                    tool
                }
            )
            .into());
        }
    }
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("usnet-bench-preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    for (name, len) in FILES {
        let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(www.join(name), body)?;
    }
    let veth = Veth::create()?;
    let (server_ns, client_ns) = (veth.ns[0].clone(), veth.ns[1].clone());
    let kernel_addr = VETH_ADDR[0];

    // The kernel's nginx.
    let conf_k = nginx_conf(&dir, &www, kernel_addr, "kernel")?;
    let mut c = in_ns(&server_ns, 1);
    c.args(["nginx", "-p", &dir.display().to_string(), "-c"])
        .arg(&conf_k);
    let mut nginx_k = spawn(c, &dir, "nginx-kernel")?;
    wait_serving(&client_ns, kernel_addr, &mut nginx_k, &dir)?;

    // The usnet stack beside it on the same veth end, and nginx under the shim.
    let mut c = in_ns(&server_ns, 1);
    c.arg(&exe).args([
        "up",
        "--name",
        STACK,
        "--services",
        "none",
        "--quiet",
        "--link",
    ]);
    c.arg(format!("afpacket:{}", veth.dev[0]));
    c.args(["--addr", &format!("{VETH_USNET}/24")]);
    let mut stack = spawn(c, &dir, "usnet-up")?;
    let ctl = dir.join(format!("{STACK}.ctl"));
    let end = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        if let Some(s) = stack.0.try_wait()? {
            let log = std::fs::read_to_string(dir.join("usnet-up.log")).unwrap_or_default();
            return Err(format!("usnet up exited ({s}): {log}").into());
        }
        if Instant::now() > end {
            return Err("usnet up did not come up within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let conf_u = nginx_conf(&dir, &www, VETH_USNET, "usnet")?;
    let mut c = in_ns(&server_ns, 1);
    c.arg(&exe)
        .args([
            "run",
            "--stack",
            STACK,
            "--",
            "nginx",
            "-p",
            &dir.display().to_string(),
            "-c",
        ])
        .arg(&conf_u);
    let mut nginx_u = spawn(c, &dir, "nginx-usnet")?;
    wait_serving(&client_ns, VETH_USNET, &mut nginx_u, &dir)?;

    let systems = [("Linux kernel", kernel_addr), ("usnet (shim)", VETH_USNET)];
    let mut table = Table::new(
        format!(
            "nginx, one worker pinned to core 1; wrk -t1 -c{} on core 0 (median of {} × {} s)",
            a.connections, a.runs, a.seconds
        ),
        [
            "response",
            "system",
            "req/s",
            "× kernel",
            "errors",
            "runs (req/s)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (name, len) in FILES {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        let mut errs = vec![0u64; systems.len()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let (rps, e) = wrk(&client_ns, &format!("http://{addr}:{PORT}/{name}"), a)?;
                per[i].push(rps);
                errs[i] += e;
            }
        }
        let meds: Vec<f64> = per.iter().map(|v| median(&mut v.clone())).collect();
        for (i, (sys, _)) in systems.iter().enumerate() {
            let ratio = meds[i] / meds[0];
            table.row(vec![
                format!("{len} B"),
                sys.to_string(),
                format!("{:.0}", meds[i]),
                format!("{ratio:.2}"),
                errs[i].to_string(),
                per[i]
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
            bars.push((format!("{sys} {len} B"), meds[i]));
            results.push(
                json!({"response_bytes": len, "system": sys, "median_rps": meds[i],
                "x_kernel": ratio, "errors": errs[i], "runs": per[i]}),
            );
        }
    }
    table.print();
    let nginx_errs: Vec<String> = ["kernel", "usnet"]
        .iter()
        .map(|t| std::fs::read_to_string(dir.join(format!("nginx-{t}.err"))).unwrap_or_default())
        .collect();
    std::fs::create_dir_all(&a.out)?;
    let doc: Value = json!({"bench": "preload", "connections": a.connections, "seconds": a.seconds,
        "runs": a.runs, "results": results});
    write_json(&a.out.join("preload.json"), &doc)?;
    std::fs::write(a.out.join("preload.md"), table.to_markdown())?;
    if let Err(e) = bar_plot(
        &a.out.join("preload.png"),
        "nginx: kernel vs usnet (LD_PRELOAD)",
        "requests/s",
        &bars,
    ) {
        eprintln!("plot not drawn: {e}");
    }
    for (t, e) in ["kernel", "usnet"].iter().zip(&nginx_errs) {
        if e.contains("[alert]") || e.contains("[crit]") || e.contains("[emerg]") {
            eprintln!("nginx ({t}) logged errors:\n{e}");
        }
    }
    println!(
        "wrote {}/preload.json, preload.md, preload.png",
        a.out.display()
    );
    drop((nginx_u, nginx_k, stack));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ExitCode::SUCCESS)
}
