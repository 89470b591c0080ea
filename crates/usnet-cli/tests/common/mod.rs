//! Helpers shared by the integration tests that drive the built `usnet` binary
//! against the Linux stack: running commands with timeouts, temporary directories,
//! clean-up guards, a `usnet up` daemon handle and counter lookups.

#![allow(dead_code)] // each test file uses its own subset

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use usnet_session::ctl::msg::Stat;

pub mod veth_tcp;

pub const USNET: &str = env!("CARGO_BIN_EXE_usnet");

// ------------------------------------------------------------------ helpers

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[allow(unused_macros)] // not every test file needs root
macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

/// Fails naming the Debian package when a tool is missing (CI must install it).
pub fn need(tool: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{tool}` is not installed: apt-get install -y {package} (CI must install it)"
    );
}

pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
    pub fn describe(&self) -> String {
        format!(
            "{}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Reads a pipe to its end in a thread. A grandchild that inherited the pipe can keep it
/// open after the child exits, so the reader is given a deadline, not joined blindly.
pub struct Collector {
    buf: Arc<Mutex<Vec<u8>>>,
    h: std::thread::JoinHandle<()>,
}

pub fn collect(mut r: impl Read + Send + 'static) -> Collector {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    Collector { buf, h }
}

impl Collector {
    /// What was read by EOF, or by `timeout` if the pipe stays open (the reader thread
    /// is then left behind).
    pub fn take(self, timeout: Duration) -> Vec<u8> {
        let end = Instant::now() + timeout;
        while !self.h.is_finished() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::mem::take(&mut *self.buf.lock().unwrap())
    }
}

/// Waits up to `timeout` for a child to exit (after a kill, or when it should be done).
pub fn reap(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + timeout;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long the pipes may stay open after the command exits.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Runs a command with `input` on stdin, killing it after `timeout`.
pub fn run_in(cmd: &mut Command, input: &[u8], timeout: Duration) -> Out {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Dropped unjoined: a child that never reads its stdin ends the write with EPIPE
    // when it exits.
    let _writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let r1 = collect(child.stdout.take().unwrap());
    let r2 = collect(child.stderr.take().unwrap());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let s = reap(&mut child, PIPE_GRACE);
            panic!(
                "{what} timed out after {timeout:?} ({})\n--- stdout\n{}--- stderr\n{}",
                s.map_or("not reaped after SIGKILL".into(), |s| s.to_string()),
                String::from_utf8_lossy(&r1.take(PIPE_GRACE)),
                String::from_utf8_lossy(&r2.take(PIPE_GRACE))
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Out {
        status,
        stdout: String::from_utf8_lossy(&r1.take(PIPE_GRACE)).into(),
        stderr: String::from_utf8_lossy(&r2.take(PIPE_GRACE)).into(),
    }
}

pub fn run(prog: &str, args: &[&str], timeout: Duration) -> Out {
    run_in(Command::new(prog).args(args), &[], timeout)
}

/// Runs a command that must succeed.
pub fn must(prog: &str, args: &[&str]) -> Out {
    let o = run(prog, args, Duration::from_secs(20));
    assert!(o.ok(), "{prog} {}: {}", args.join(" "), o.describe());
    o
}

pub fn ip(args: &[&str]) {
    must("ip", args);
}

/// A private directory (run dir, logs, pcap files) removed at the end.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("usnet-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Commands undoing what a test set up (interfaces, namespaces), run in `Drop`.
#[derive(Default)]
pub struct Cleanup(pub Vec<Vec<String>>);

impl Cleanup {
    pub fn on_drop(&mut self, args: &[&str]) {
        self.0.push(args.iter().map(|s| s.to_string()).collect());
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in self.0.iter().rev() {
            let _ = Command::new(&c[0])
                .args(&c[1..])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A running `usnet up`, killed in `Drop` if the test did not stop it.
pub struct Daemon {
    pub child: Child,
    pub name: String,
    pub dir: PathBuf,
    /// Started with `--quiet`: no "serving clients" line to wait for.
    quiet: bool,
}

impl Daemon {
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Daemon {
        let log = |s: &str| File::create(dir.join(format!("{name}.{s}"))).unwrap();
        let child = Command::new(USNET)
            .arg("up")
            .args(["--name", name])
            .args(args)
            .env("USNET_RUN_DIR", dir)
            .stdin(Stdio::null())
            .stdout(log("out"))
            .stderr(log("err"))
            .spawn()
            .expect("spawn usnet up");
        let mut d = Daemon {
            child,
            name: name.to_string(),
            dir: dir.to_path_buf(),
            quiet: args.iter().any(|a| *a == "-q" || *a == "--quiet"),
        };
        d.wait_ready();
        d
    }

    pub fn logs(&self) -> String {
        let read = |s: &str| {
            std::fs::read_to_string(self.dir.join(format!("{}.{s}", self.name))).unwrap_or_default()
        };
        format!(
            "--- usnet up stdout\n{}--- usnet up stderr\n{}",
            read("out"),
            read("err")
        )
    }

    /// Polls until the control socket answers and `usnet up` has said it serves
    /// clients (or the process died). The control socket opens before the built-in
    /// services have attached and listen; the line comes after them, so a test's
    /// first connection to a service is not refused. (A `--quiet` daemon says
    /// nothing: only its control socket is waited for.)
    pub fn wait_ready(&mut self) {
        let sock = self.dir.join(format!("{}.ctl", self.name));
        let out = self.dir.join(format!("{}.out", self.name));
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let said = std::fs::read_to_string(&out)
                .is_ok_and(|s| s.contains("usnet: serving clients at"))
                || self.quiet;
            if said && UnixStream::connect(&sock).is_ok() {
                return;
            }
            if let Some(s) = self.child.try_wait().unwrap() {
                panic!("usnet up exited early ({s}):\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "usnet up not ready after 15 s:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `usnet <args> --stack NAME` with this daemon's run directory.
    pub fn ctl(&self, args: &[&str], timeout: Duration) -> Out {
        run_in(
            Command::new(USNET)
                .args(args)
                .args(["--stack", &self.name])
                .env("USNET_RUN_DIR", &self.dir),
            &[],
            timeout,
        )
    }

    pub fn counters(&self) -> Counters {
        self.stat().counters
    }

    /// `usnet stat --json`, read as the control protocol's answer.
    pub fn stat(&self) -> Stat {
        let o = self.ctl(&["stat", "--json"], Duration::from_secs(10));
        assert!(o.ok(), "usnet stat --json: {}", o.describe());
        serde_json::from_str(&o.stdout).expect("stat JSON")
    }

    /// `usnet stat` as a person reads it (every counter, sockets, clients), for a
    /// failed assertion to show what the stack saw.
    pub fn stat_text(&self) -> String {
        let o = self.ctl(&["stat", "--all"], Duration::from_secs(10));
        format!("--- usnet stat --all\n{}{}", o.stdout, o.stderr)
    }

    /// `usnet down`, then waits for a clean exit.
    pub fn down(&mut self) {
        let o = self.ctl(&["down"], Duration::from_secs(10));
        assert!(o.ok(), "usnet down: {}", o.describe());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "usnet up exited with {s}:\n{}", self.logs());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "usnet up still running 10 s after `usnet down`:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first so it closes its link and pcap file; SIGKILL if it hangs.
            // SAFETY: kill on a child we spawned and have not reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = reap(&mut self.child, Duration::from_secs(5));
        }
    }
}

/// A stack's counters by name.
pub type Counters = std::collections::BTreeMap<String, u64>;

pub fn counter(c: &Counters, name: &str) -> u64 {
    *c.get(name)
        .unwrap_or_else(|| panic!("no counter {name} in {c:?}"))
}

/// Removes what a crashed earlier run may have left behind.
pub fn remove_leftovers(links: &[&str], netns: &[&str]) {
    for l in links {
        let _ = run("ip", &["link", "del", l], Duration::from_secs(10));
    }
    for n in netns {
        let _ = run("ip", &["netns", "del", n], Duration::from_secs(10));
    }
}

/// A veth pair with `inner` moved into a fresh network namespace `ns` that holds
/// `addrs` (IPv6 ones without DAD), and `outer` left up in the root namespace with no
/// address, for usnet to attach to with af_packet. The returned guard deletes both.
pub fn veth_netns(ns: &str, outer: &str, inner: &str, addrs: &[&str]) -> Cleanup {
    veth_netns_queues(ns, outer, inner, addrs, 1)
}

/// [`veth_netns`] with `queues` RX and TX queues on each end.
pub fn veth_netns_queues(
    ns: &str,
    outer: &str,
    inner: &str,
    addrs: &[&str],
    queues: usize,
) -> Cleanup {
    remove_leftovers(&[outer], &[ns]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "netns", "del", ns]);
    cleanup.on_drop(&["ip", "link", "del", outer]);
    ip(&["netns", "add", ns]);
    let q = queues.to_string();
    ip(&[
        "link",
        "add",
        outer,
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        inner,
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
    ]);
    ip(&["link", "set", inner, "netns", ns]);
    for a in addrs {
        if a.contains(':') {
            ip(&["-n", ns, "addr", "add", a, "dev", inner, "nodad"]);
        } else {
            ip(&["-n", ns, "addr", "add", a, "dev", inner]);
        }
    }
    ip(&["-n", ns, "link", "set", "lo", "up"]);
    ip(&["-n", ns, "link", "set", inner, "up"]);
    // The root end carries no address: only usnet answers on it.
    let _ = run(
        "sysctl",
        &["-qw", &format!("net.ipv6.conf.{outer}.disable_ipv6=1")],
        Duration::from_secs(5),
    );
    ip(&["link", "set", outer, "up"]);
    cleanup
}

// ------------------------------------------------------- programs under the shim

/// A background program, killed (and reaped) on drop.
pub struct Bg(pub Child, pub &'static str);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = reap(&mut self.0, Duration::from_secs(5));
    }
}

/// `usnet run --stack STACK -- prog args` (`shim`) or plain `prog args`, in the
/// background, output in `DIR/WHAT.log`.
pub fn spawn_prog(
    dir: &Path,
    stack: Option<&str>,
    what: &'static str,
    prog: &str,
    args: &[&str],
) -> Bg {
    let mut c = match stack {
        Some(s) => {
            let mut c = Command::new(USNET);
            c.args(["run", "--stack", s, "--", prog]);
            c
        }
        None => Command::new(prog),
    };
    let log = File::create(dir.join(format!("{what}.log"))).unwrap();
    let child = c
        .args(args)
        .env("USNET_RUN_DIR", dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {prog}: {e}"));
    Bg(child, what)
}

/// What a background program wrote.
pub fn log_of(dir: &Path, what: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{what}.log"))).unwrap_or_default()
}

/// Waits (15 s at most) until `addr:port` accepts a TCP connection from the kernel.
pub fn wait_listening(bg: &mut Bg, dir: &Path, addr: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let sa: std::net::SocketAddr = format!("{addr}:{port}").parse().unwrap();
    while std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(200)).is_err() {
        if let Some(s) = bg.0.try_wait().unwrap() {
            panic!("{} exited ({s}): {}", bg.1, log_of(dir, bg.1));
        }
        assert!(
            Instant::now() < deadline,
            "{} not listening on {sa}: {}",
            bg.1,
            log_of(dir, bg.1)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (15 s at most) until a background program's log contains `needle` (for a
/// server a probe connection would disturb, such as `iperf3 -s -1`).
pub fn wait_log(bg: &mut Bg, dir: &Path, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !log_of(dir, bg.1).contains(needle) {
        if let Some(s) = bg.0.try_wait().unwrap() {
            panic!("{} exited ({s}): {}", bg.1, log_of(dir, bg.1));
        }
        assert!(
            Instant::now() < deadline,
            "{} did not say {needle:?}: {}",
            bg.1,
            log_of(dir, bg.1)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The file of shm link `link` (`shm:NAME`).
pub fn shm_link_path(link: &str) -> PathBuf {
    usnet_link::shm::shm_path(link.trim_start_matches("shm:"))
}

/// Waits up to 10 s for the file of shm link `link` (`shm:NAME`) to be gone once
/// the stacks on it have stopped: the last one out removes it, or, when it gave up
/// root (as root, by default), its clean-up process does.
pub fn assert_shm_link_removed(link: &str) {
    let path = shm_link_path(link);
    let end = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        assert!(Instant::now() < end, "{} left behind", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}
