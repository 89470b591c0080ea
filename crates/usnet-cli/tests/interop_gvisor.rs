//! usnet's TCP against gVisor's netstack (gvisor.dev/gvisor/pkg/tcpip), a second
//! independent TCP that runs on a real wire: `interop/gvisor` (a Go program, built
//! here with `go build`) attaches gVisor's stack to one end of a veth pair through
//! an AF_PACKET socket, from inside a network namespace; usnet's stack runs in this
//! process on the other end through its AF_PACKET link. Neither veth end has an IP
//! address, so the kernel answers nothing; ARP and NDP are the two stacks' own.
//!
//! Each family runs six conversations, both streams at once, each side checking
//! every byte it receives against a deterministic pattern. With 1 % of the frames
//! dropped each way at usnet's end (`FaultInjector`): usnet connects to a gVisor
//! listener and gVisor to a usnet listener, 64 MiB each way, both ending with FIN;
//! a SYN answered with a SYN cookie (no window scaling, no SACK); a gVisor that
//! sends its FIN first and then receives 1 MiB half-closed. On a clean wire (a
//! lost RST is never recovered when the reset side's peer has nothing more to
//! send): 4 MiB each way ending with gVisor resetting (SO_LINGER 0) after usnet's
//! FIN, and with usnet resetting after gVisor's FIN; the reset side must read
//! ECONNRESET after the last byte. SACK and window scaling must be negotiated
//! where both are offered, and both stacks must agree on the shifts (usnet's
//! `tcp_info` against what gVisor's TCP probe saw).
//!
//! Needs root ("skipped: needs root" otherwise) and Go (`/usr/local/go/bin/go` or
//! `go` on PATH; skipped with a message if missing). The Go module downloads
//! gVisor through the Go module proxy on a machine whose module cache lacks it.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use usnet_runtime::{TcpListener, TcpStream};

#[macro_use]
mod common;
use common::veth_tcp::*;
use common::*;

/// Streams: usnet sends pattern 1, gVisor pattern 2 (so an echo of our own bytes
/// would not pass).
const USNET_SEED: u64 = 1;
const GVISOR_SEED: u64 = 2;
/// How long any one step (a read, a write, the peer's start or exit) may take.
const STEP: Duration = Duration::from_secs(30);
/// The tests take turns: each moves 100+ MB through two stacks on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());
/// The gVisor program gives up by itself after this.
const PEER_TIMEOUT: &str = "60s";

// ------------------------------------------------------------ the Go program

fn go_binary() -> Option<PathBuf> {
    let fixed = PathBuf::from("/usr/local/go/bin/go");
    if fixed.is_file() {
        return Some(fixed);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("go"))
            .find(|g| g.is_file())
    })
}

/// Builds `interop/gvisor` once per test binary: the program's path, or why not.
fn gvisor_peer() -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let go =
            go_binary().ok_or("Go is not installed (no /usr/local/go/bin/go, no go on PATH)")?;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop/gvisor");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let out = tmp.join("gvisor-peer");
        let mut cmd = Command::new(&go);
        cmd.args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&src)
            // The toolchain installed, never one downloaded for go.mod.
            .env("GOTOOLCHAIN", "local");
        if std::env::var_os("HOME").is_none() {
            // Go needs somewhere for its caches.
            if std::env::var_os("GOCACHE").is_none() {
                cmd.env("GOCACHE", tmp.join("go-cache"));
            }
            if std::env::var_os("GOPATH").is_none() {
                cmd.env("GOPATH", tmp.join("go-path"));
            }
        }
        let t0 = Instant::now();
        let o = run_in(&mut cmd, &[], Duration::from_secs(300));
        assert!(
            o.ok(),
            "go build of interop/gvisor failed: {}",
            o.describe()
        );
        eprintln!("built {} in {:?}", out.display(), t0.elapsed());
        Ok(out)
    })
}

/// The gVisor program, in the namespace, killed on drop. Its stdout lines arrive
/// on `lines`; its stderr goes to a file. It keeps its stack up until its stdin
/// closes ([`Peer::finish`]).
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: PathBuf,
}

impl Peer {
    fn start(exe: &Path, ns: &str, dir: &Path, args: &[String]) -> Peer {
        let stderr = dir.join("gvisor.stderr");
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start the gVisor program");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        // Ends when the program's stdout closes (it exits or is killed on drop).
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Peer {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    fn output(&self) -> String {
        format!(
            "--- gVisor stdout\n{}\n--- gVisor stderr\n{}",
            self.seen.join("\n"),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits (up to `STEP`) for a line starting with `prefix`.
    fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                    assert!(
                        !l.starts_with("error:"),
                        "gVisor failed:\n{}",
                        self.output()
                    );
                }
                Err(_) => panic!("gVisor did not say {prefix:?}:\n{}", self.output()),
            }
        }
    }

    /// Lets the program go (closes its stdin: usnet's side is done and needs no
    /// more answers), waits (up to `STEP`) for it to exit, and returns its summary.
    fn finish(&mut self) -> Value {
        self.stdin = None;
        let line = self.wait_line("{");
        let status = reap(&mut self.child, STEP)
            .unwrap_or_else(|| panic!("gVisor did not exit:\n{}", self.output()));
        assert!(
            status.success(),
            "gVisor exited {status}:\n{}",
            self.output()
        );
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // `ip netns exec` execs the program, so this is its pid.
        let _ = self.child.kill();
        let _ = reap(&mut self.child, Duration::from_secs(5));
    }
}

// ------------------------------------------------------------ usnet's side

/// What is special about a conversation.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// SACK and window scaling on; each side ends after it has the other's bytes.
    Plain,
    /// gVisor listens with an accept queue of 1, so it answers the SYN with a SYN
    /// cookie: no window scaling, no SACK (usnet must not use them).
    SynCookie,
    /// gVisor sends its FIN as soon as its own stream is out, and then receives
    /// half-closed, where netstack sends no SACK blocks.
    GvisorFinEarly,
}

struct Case {
    /// On the wire with 1 % loss each way (the RST endings run on a clean one:
    /// nothing recovers a lost RST when the reset side's peer has nothing more to
    /// send).
    lossy: bool,
    usnet_connects: bool,
    kind: Kind,
    /// Bytes usnet sends, and gVisor.
    usnet_bytes: u64,
    gvisor_bytes: u64,
    usnet_end: End,
    gvisor_end: End,
    port: u16,
}

fn run_case(w: &Wire, v6: bool, c: &Case) {
    let exe = match gvisor_peer() {
        Ok(p) => p,
        Err(why) => panic!("{why}"),
    };
    let (usnet_ip, gvisor_cidr): (IpAddr, &str) = if v6 {
        ("fd71::1".parse().unwrap(), "fd71::2/64")
    } else {
        ("10.71.0.1".parse().unwrap(), "10.71.0.2/24")
    };
    let gvisor_ip: IpAddr = gvisor_cidr.split('/').next().unwrap().parse().unwrap();
    let name = format!(
        "{} {} {} {:?}, {} KiB from usnet, {} KiB from gVisor, usnet {:?}, gVisor {:?}",
        if v6 { "IPv6" } else { "IPv4" },
        if c.lossy { "1% loss" } else { "no loss" },
        if c.usnet_connects {
            "usnet → gVisor"
        } else {
            "gVisor → usnet"
        },
        c.kind,
        c.usnet_bytes >> 10,
        c.gvisor_bytes >> 10,
        c.usnet_end,
        c.gvisor_end
    );
    let t0 = Instant::now();
    let mut args: Vec<String> = [
        "-iface",
        &w.inner,
        "-addr",
        gvisor_cidr,
        "-send",
        &c.gvisor_bytes.to_string(),
        "-recv",
        &c.usnet_bytes.to_string(),
        "-send-seed",
        &GVISOR_SEED.to_string(),
        "-recv-seed",
        &USNET_SEED.to_string(),
        "-close",
        c.gvisor_end.flag(),
        "-peer-close",
        c.usnet_end.flag(),
        "-timeout",
        PEER_TIMEOUT,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    match c.kind {
        Kind::Plain => {}
        Kind::SynCookie => args.extend(["-backlog".into(), "1".into()]),
        Kind::GvisorFinEarly => args.push("-fin-early".into()),
    }
    let (mut peer, stream) = if c.usnet_connects {
        args.extend([
            "-mode".into(),
            "listen".into(),
            "-port".into(),
            c.port.to_string(),
        ]);
        let mut peer = Peer::start(exe, &w.ns, w.dir.path(), &args);
        peer.wait_line("listening");
        let s = TcpStream::connect_timeout(&w.net, SocketAddr::new(gvisor_ip, c.port), STEP)
            .unwrap_or_else(|e| panic!("{name}: connect: {e}\n{}", peer.output()));
        (peer, s)
    } else {
        let addr = SocketAddr::new(usnet_ip, c.port);
        let l = TcpListener::bind(&w.net, addr).expect("listen");
        args.extend([
            "-mode".into(),
            "connect".into(),
            "-peer".into(),
            addr.to_string(),
        ]);
        let peer = Peer::start(exe, &w.ns, w.dir.path(), &args);
        let s = accept_from(w, &l, gvisor_ip, (&name, STEP), &|| peer.output());
        (peer, s)
    };
    let info = stream.info().expect("tcp_info");
    let (snd_shift, rcv_shift) = if c.kind == Kind::SynCookie {
        // RFC 7323 §2.2 and RFC 2018 §2: an option the SYN-ACK lacks is off.
        assert!(
            !info.sack,
            "{name}: SACK without the SYN-ACK's consent: {info:?}"
        );
        assert!(
            info.wscale.is_none(),
            "{name}: window scaling without the SYN-ACK's consent: {info:?}"
        );
        (0, 0)
    } else {
        assert!(info.sack, "{name}: SACK not negotiated: {info:?}");
        info.wscale
            .unwrap_or_else(|| panic!("{name}: window scaling not negotiated: {info:?}"))
    };

    let output = || peer.output();
    let (info, _) = Converse {
        name: &name,
        peer_output: &output,
        peer: "gVisor",
        usnet_seed: USNET_SEED,
        peer_seed: GVISOR_SEED,
        usnet_bytes: c.usnet_bytes,
        peer_bytes: c.gvisor_bytes,
        usnet_end: c.usnet_end,
        peer_end: c.gvisor_end,
        step: STEP,
    }
    .run(stream);

    let g = peer.finish();
    let elapsed = t0.elapsed();
    assert_eq!(g["ok"], true, "{g}");
    assert_eq!(g["sent"].as_u64(), Some(c.gvisor_bytes), "{g}");
    assert_eq!(g["received"].as_u64(), Some(c.usnet_bytes), "{g}");
    assert_eq!(g["peer_close"], c.usnet_end.flag(), "{g}");
    assert_eq!(
        g["sack"],
        c.kind != Kind::SynCookie,
        "{name}: gVisor's view of SACK: {g}"
    );
    assert_eq!(
        g["snd_wscale"].as_u64(),
        Some(u64::from(rcv_shift)),
        "{name}: usnet's window shift as gVisor reads it: {g}"
    );
    assert_eq!(
        g["rcv_wscale"].as_u64(),
        Some(u64::from(snd_shift)),
        "{name}: gVisor's window shift as usnet reads it: {g}"
    );
    let mb_s = (c.usnet_bytes + c.gvisor_bytes) as f64 / elapsed.as_secs_f64() / 1e6;
    eprintln!(
        "{name}: {elapsed:.2?} ({mb_s:.0} MB/s both ways together); usnet: wscale {snd_shift}/{rcv_shift}, {} retransmits, {} fast recoveries, {} RTOs; gVisor: {g}",
        info.as_ref().map_or(0, |i| i.total_retransmits),
        info.as_ref().map_or(0, |i| i.fast_recoveries),
        info.as_ref().map_or(0, |i| i.rto_expiries),
    );
}

/// The conversations of one address family: both roles, three endings, a SYN
/// cookie and a half-closed gVisor receiver.
fn cases(bulk: u64, small: u64) -> Vec<Case> {
    let case =
        |lossy, usnet_connects, kind, usnet_bytes, gvisor_bytes, ends: (End, End), port| Case {
            lossy,
            usnet_connects,
            kind,
            usnet_bytes,
            gvisor_bytes,
            usnet_end: ends.0,
            gvisor_end: ends.1,
            port,
        };
    use End::{Fin, Rst};
    use Kind::*;
    vec![
        case(true, true, Plain, bulk, bulk, (Fin, Fin), 5101),
        case(true, false, Plain, bulk, bulk, (Fin, Fin), 5102),
        case(true, true, SynCookie, small, small, (Fin, Fin), 5105),
        case(
            true,
            true,
            GvisorFinEarly,
            1 << 20,
            64 << 10,
            (Fin, Fin),
            5106,
        ),
        case(false, true, Plain, small, small, (Fin, Rst), 5103),
        case(false, false, Plain, small, small, (Rst, Fin), 5104),
    ]
}

/// Runs `cases` over a lossy and a clean wire (USNET_GVISOR_PCAP=FILE records usnet's
/// side of each in FILE.TAG).
fn run_family(tag: &str, v6: bool, cases: Vec<Case>) {
    run_on_wires(
        ("gv", tag),
        &["10.71.0.1/24", "fd71::1/64"],
        "USNET_GVISOR_PCAP",
        cases,
        |c| c.lossy,
        |w, c| run_case(w, v6, c),
    );
}

/// Both roles and the three endings over IPv4, 64 MiB each way in the two FIN
/// conversations, 1 % loss each way.
#[test]
fn gvisor_tcp_ipv4() {
    gvisor_family("4", false);
}

/// The same over IPv6 (NDP instead of ARP).
#[test]
fn gvisor_tcp_ipv6() {
    gvisor_family("6", true);
}

fn gvisor_family(tag: &str, v6: bool) {
    require_root!();
    if let Err(why) = gvisor_peer() {
        eprintln!("skipped: {why}");
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    run_family(tag, v6, cases(64 << 20, 4 << 20));
    eprintln!("gvisor_tcp_ipv{tag} took {:?}", t0.elapsed());
}
