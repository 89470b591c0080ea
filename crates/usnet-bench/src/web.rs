//! What the HTTP benchmarks (`bench preload`, `bench httpd`) share: servers as
//! background processes in a network namespace pinned to a core, a tuned nginx
//! configuration, waiting until a server answers, and wrk runs with their
//! requests/s, latency and error counts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A background process, stopped (SIGTERM, then SIGKILL) and reaped on drop.
pub(crate) struct Bg(pub Child, pub String);

impl Bg {
    /// Its log so far.
    pub fn log(&self, dir: &Path) -> String {
        std::fs::read_to_string(dir.join(format!("{}.log", self.1))).unwrap_or_default()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        crate::stop_child(&mut self.0, Duration::from_secs(3));
    }
}

/// A command run in namespace `ns` on CPU `core`.
pub(crate) fn in_ns(ns: &str, core: usize) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "taskset", "-c", &core.to_string()]);
    c
}

/// Starts `c` in the background with its output in `dir/what.log`.
pub(crate) fn spawn(mut c: Command, dir: &Path, what: &str) -> Res<Bg> {
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

/// Starts `usnet up --name NAME` in namespace `ns` on CPU `core` with `args` (the
/// link, addresses, options; no built-in services) and waits (at most 20 s) until
/// its control socket answers.
pub(crate) fn start_stack_server(
    ns: &str,
    core: usize,
    dir: &Path,
    name: &str,
    args: &[String],
) -> Res<Bg> {
    let exe = std::env::current_exe()?;
    let mut c = in_ns(ns, core);
    c.arg(&exe)
        .args(["up", "--name", name, "--services", "none", "--quiet"])
        .args(args);
    let what = format!("usnet-up-{name}");
    let mut stack = spawn(c, dir, &what)?;
    wait_stack_server(&mut stack, dir, name)?;
    Ok(stack)
}

/// Waits (at most 20 s) until the control socket of stack server `name`, started as
/// `stack` with `USNET_RUN_DIR` = `dir`, answers; fails with its log if it exits.
pub(crate) fn wait_stack_server(stack: &mut Bg, dir: &Path, name: &str) -> Res<()> {
    let ctl = dir.join(format!("{name}.ctl"));
    let end = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        if let Some(s) = stack.0.try_wait()? {
            return Err(format!("usnet up exited ({s}): {}", stack.log(dir)).into());
        }
        if Instant::now() > end {
            return Err("usnet up did not come up within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Fails naming the package when a tool the benchmark runs is missing.
pub(crate) fn need_tools(tools: &[&str]) -> Res<()> {
    for tool in tools {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map_or(true, |s| !s.success())
        {
            return Err(format!(
                "{tool} is needed (apt install {})",
                if *tool == "taskset" {
                    "util-linux"
                } else {
                    tool
                }
            )
            .into());
        }
    }
    Ok(())
}

/// An nginx configuration: one worker in the foreground (pinned by whoever starts
/// it), epoll, `access_log off`, sendfile, keep-alive without a request limit,
/// serving `www` on `addr:port`; `events` and `http` add directives to those blocks.
pub(crate) fn nginx_conf(
    dir: &Path,
    www: &Path,
    addr: &str,
    port: u16,
    tag: &str,
    events: &str,
    http: &str,
) -> Res<PathBuf> {
    nginx_conf_workers(dir, www, addr, port, tag, events, http, 1)
}

/// [`nginx_conf`] with `workers` worker processes (more than one: a master process
/// starts them, each pinned to its own core by `worker_cpu_affinity auto`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn nginx_conf_workers(
    dir: &Path,
    www: &Path,
    addr: &str,
    port: u16,
    tag: &str,
    events: &str,
    http: &str,
    workers: usize,
) -> Res<PathBuf> {
    let procs = if workers > 1 {
        format!("master_process on;\nworker_processes {workers};\nworker_cpu_affinity auto;")
    } else {
        "master_process off;\nworker_processes 1;".to_string()
    };
    let d = dir.display();
    let conf = dir.join(format!("nginx-{tag}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off;\n{procs}\npid {d}/nginx-{tag}.pid;\n\
             error_log {d}/nginx-{tag}.err warn;\nuser root;\n\
             events {{ worker_connections 4096; use epoll; {events} }}\n\
             http {{\n access_log off;\n sendfile on;\n keepalive_requests 1000000;\n {http}\n\
             client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n\
             uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
             server {{ listen {addr}:{port}; root {}; }}\n}}\n",
            www.display()
        ),
    )?;
    Ok(conf)
}

/// Whether nginx's error log (`dir/nginx-TAG.err`) has alerts; returns them.
pub(crate) fn nginx_alerts(dir: &Path, tag: &str) -> Option<String> {
    let e = std::fs::read_to_string(dir.join(format!("nginx-{tag}.err"))).unwrap_or_default();
    (e.contains("[alert]") || e.contains("[crit]") || e.contains("[emerg]")).then_some(e)
}

/// Polls `ready` every 100 ms until it holds (20 s at most), failing at once with
/// its log if the server `bg` exits meanwhile. `what` names what was awaited.
fn wait_until(bg: &mut Bg, dir: &Path, what: &str, mut ready: impl FnMut() -> bool) -> Res<()> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(s) = bg.0.try_wait()? {
            return Err(format!("{} exited ({s}): {}", bg.1, bg.log(dir)).into());
        }
        if Instant::now() > end {
            return Err(format!("{} {what} within 20 s: {}", bg.1, bg.log(dir)).into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `url` answers curl from namespace `ns` (20 s at most).
pub(crate) fn wait_serving(ns: &str, url: &str, bg: &mut Bg, dir: &Path) -> Res<()> {
    wait_until(bg, dir, &format!("does not answer {url}"), || {
        Command::new("ip")
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
                url,
            ])
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Waits until a TCP server accepts a connection at `addr:port` from namespace `ns`
/// (20 s at most).
pub(crate) fn wait_port(ns: &str, addr: &str, port: u16, bg: &mut Bg, dir: &Path) -> Res<()> {
    let probe = format!("exec 3<>/dev/tcp/{addr}/{port}");
    wait_until(bg, dir, &format!("did not listen on {addr}:{port}"), || {
        Command::new("ip")
            .args(["netns", "exec", ns, "timeout", "2", "bash", "-c", &probe])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// One wrk run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WrkRun {
    pub rps: f64,
    /// Mean and 99th percentile latency, milliseconds.
    pub mean_ms: f64,
    pub p99_ms: f64,
    /// Socket errors (connect, read, write, timeout) plus non-2xx/3xx answers.
    pub errors: u64,
    /// How busy the server's core was during the run (`crate::cpu`).
    pub cpu: Option<crate::cpu::CoreUse>,
}

impl WrkRun {
    /// The server core's CPU per request, user and kernel, in µs.
    pub fn cpu_us_per_req(&self) -> Option<(f64, f64)> {
        self.cpu.map(|c| {
            let (u, k) = c.per_total(self.rps * c.secs);
            (u * 1e6, k * 1e6)
        })
    }
}

/// "6.77ms", "850.00us", "1.20s" in milliseconds.
fn wrk_ms(v: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|x| x * scale)
}

/// Parses wrk's output (run with `--latency`).
pub(crate) fn parse_wrk(text: &str) -> Option<WrkRun> {
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())?;
    let mut r = WrkRun {
        rps,
        ..WrkRun::default()
    };
    for l in text.lines() {
        let l = l.trim();
        if let Some(rest) = l.strip_prefix("Latency ") {
            // "Latency     6.77ms    1.23ms  20.00ms   75.00%"
            if let Some(v) = rest.split_whitespace().next().and_then(wrk_ms) {
                r.mean_ms = v;
            }
        }
        if let Some(rest) = l.strip_prefix("99%") {
            if let Some(v) = wrk_ms(rest.trim()) {
                r.p99_ms = v;
            }
        }
        if let Some(rest) = l.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            r.errors += rest
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
        if let Some(rest) = l.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += rest.trim().parse::<u64>().unwrap_or(0);
        }
    }
    Some(r)
}

/// One wrk run from namespace `ns` on CPU `core`: one thread, `connections`
/// connections, `seconds` long (rounded up to whole seconds), with a deadline. The
/// server's core (`server_core`) is measured meanwhile (`WrkRun::cpu`).
pub(crate) fn wrk(
    ns: &str,
    core: usize,
    server_core: Option<usize>,
    url: &str,
    connections: usize,
    seconds: f64,
) -> Res<WrkRun> {
    wrk_threads(
        ns,
        &core.to_string(),
        1,
        server_core,
        url,
        connections,
        seconds,
    )
}

/// [`wrk`] with `threads` threads on the CPUs `cpus` (a taskset list: `0`, `0-3`).
pub(crate) fn wrk_threads(
    ns: &str,
    cpus: &str,
    threads: usize,
    server_core: Option<usize>,
    url: &str,
    connections: usize,
    seconds: f64,
) -> Res<WrkRun> {
    let secs = seconds.ceil().max(1.0) as u64;
    let (out, cpu) = crate::cpu::measure(server_core, || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "taskset",
                "-c",
                cpus,
                "timeout",
                &(secs + 30).to_string(),
            ])
            .args([
                "wrk",
                &format!("-t{threads}"),
                "--latency",
                &format!("-c{connections}"),
                &format!("-d{secs}s"),
                url,
            ])
            .output()
    });
    let out = out.map_err(|e| format!("cannot run wrk (apt install wrk): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk {url}: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let mut r =
        parse_wrk(&text).ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))?;
    r.cpu = cpu;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_parsed() {
        let text = "Running 1s test @ http://10.0.0.1/\n  1 threads and 100 connections\n\
  Thread Stats   Avg      Stdev     Max   +/- Stdev\n\
    Latency     6.77ms    1.23ms  20.00ms   75.00%\n\
    Req/Sec    14.61k     1.00k   16.00k    70.00%\n\
  Latency Distribution\n     50%  850.00us\n     75%    1.00ms\n     90%    2.00ms\n     99%    1.20s\n\
  14613 requests in 1.00s, 2.00MB read\n\
  Socket errors: connect 0, read 2, write 1, timeout 0\n\
  Non-2xx or 3xx responses: 3\n\
Requests/sec:  14613.00\nTransfer/sec:      2.00MB\n";
        let r = parse_wrk(text).unwrap();
        assert_eq!(r.rps, 14613.0);
        assert!((r.mean_ms - 6.77).abs() < 1e-9);
        assert!((r.p99_ms - 1200.0).abs() < 1e-9);
        assert_eq!(r.errors, 6);
        assert_eq!(wrk_ms("850.00us"), Some(0.85));
        assert!(parse_wrk("nothing").is_none());
    }
}
