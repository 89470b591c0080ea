//! TCP and ICMP errors against Linux as a router, through the built `usnet` binary:
//! `usnet perf` (a usnet client on a TAP, MTU 1500) sends to `usnet perf --kernel
//! --server` in a network namespace that Linux reaches over a veth of MTU 1280, with
//! forwarding on. Linux answers the client's 1500-byte packets with ICMP
//! fragmentation needed / packet too big; the transfer must complete with every
//! byte checked by the server and the client's MSS lowered. Then nftables in the
//! namespace rejects connections with ICMP port unreachable and admin prohibited,
//! and `usnet perf`'s connect must fail at once with the matching error.
//!
//! Needs root ("skipped: needs root" otherwise), iproute2 and nftables. Interfaces,
//! the namespace, and the forwarding sysctls are restored in `Drop`, also on failure.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[macro_use]
mod common;
use common::*;

const TAP: &str = "usnt20";
const NS: &str = "usnetns-p";
const OUTER: &str = "usnv20";
const INNER: &str = "usnv21";
const PORT: u16 = 5320;
const REJECT_PORT: u16 = 5321;
const PROHIBIT_PORT: u16 = 5322;

/// Sets a sysctl and restores its old value when `cleanup` drops.
fn sysctl(cleanup: &mut Cleanup, key: &str, value: &str) {
    let old = must("sysctl", &["-n", key]).stdout.trim().to_string();
    cleanup.on_drop(&["sysctl", "-qw", &format!("{key}={old}")]);
    must("sysctl", &["-qw", &format!("{key}={value}")]);
}

/// `usnet perf --kernel --server` in the namespace, killed in `Drop`.
struct Server(Child);

impl Server {
    fn start(dir: &std::path::Path) -> Server {
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", NS, USNET, "perf", "--kernel", "--server"])
            .args(["--port", &PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn usnet perf --kernel --server");
        let s = Server(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = run(
                "ip",
                &[
                    "netns",
                    "exec",
                    NS,
                    "ss",
                    "-Hltn",
                    &format!("sport = :{PORT}"),
                ],
                Duration::from_secs(5),
            );
            if o.stdout.contains(&format!(":{PORT}")) {
                return s;
            }
            assert!(Instant::now() < deadline, "perf server not listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // `ip netns exec` execs the server, so this is its pid.
        let _ = self.0.kill();
        let _ = reap(&mut self.0, Duration::from_secs(5));
    }
}

/// `usnet perf --client` on its own stack on the TAP.
fn client(to: &str, port: u16, bytes: &str, timeout: Duration) -> (Out, f64) {
    let t = Instant::now();
    let o = run(
        USNET,
        &[
            "perf",
            "--client",
            to,
            "--port",
            &port.to_string(),
            "--bytes",
            bytes,
            "--link",
            &format!("tap:{TAP}"),
            "--addr",
            "10.44.0.2/24",
            "--addr",
            "fd44::2/64",
            "--host-addr",
            "10.44.0.1/24",
            "--host-addr",
            "fd44::1/64",
            "--gateway",
            "10.44.0.1",
            "--gateway",
            "fd44::1",
        ],
        timeout,
    );
    (o, t.elapsed().as_secs_f64())
}

/// The `N` in "MSS lowered by ICMP: N," of the client's summary.
fn mss_lowered(out: &str) -> u64 {
    out.split("MSS lowered by ICMP: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn pmtu_through_a_linux_router_and_icmp_refused_connects() {
    require_root!();
    need("ip", "iproute2");
    need("ss", "iproute2");
    need("nft", "nftables");
    let t0 = Instant::now();
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = veth_netns(NS, OUTER, INNER, &["10.45.0.2/24", "fd45::2/64"]);
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    // The router's end of the veth is the 1280-byte link. The server's end keeps
    // 1500, so the server advertises MSS 1460 and only the router knows the path is
    // narrower (the server sends nothing but ACKs and an 8-byte answer back).
    let _ = run(
        "sysctl",
        &["-qw", &format!("net.ipv6.conf.{OUTER}.disable_ipv6=0")],
        Duration::from_secs(5),
    );
    ip(&["addr", "add", "10.45.0.1/24", "dev", OUTER]);
    ip(&["addr", "add", "fd45::1/64", "dev", OUTER, "nodad"]);
    ip(&["link", "set", OUTER, "mtu", "1280"]);
    ip(&["-n", NS, "route", "add", "default", "via", "10.45.0.1"]);
    ip(&["-n", NS, "-6", "route", "add", "default", "via", "fd45::1"]);
    sysctl(&mut cleanup, "net.ipv4.ip_forward", "1");
    sysctl(&mut cleanup, "net.ipv6.conf.all.forwarding", "1");
    // Connections to these ports are refused with ICMP (the namespace goes with them).
    let dir = TempDir::new("pmtu");
    let rules = dir.path().join("reject.nft");
    std::fs::write(
        &rules,
        format!(
            "table inet usnetpmtu {{\n chain in {{\n  type filter hook input priority 0;\n  \
             tcp dport {REJECT_PORT} reject with icmpx type port-unreachable\n  \
             tcp dport {PROHIBIT_PORT} reject with icmpx type admin-prohibited\n }}\n}}\n"
        ),
    )
    .unwrap();
    must(
        "ip",
        &["netns", "exec", NS, "nft", "-f", rules.to_str().unwrap()],
    );

    let server = Server::start(dir.path());
    let mut report = Vec::new();
    for to in ["10.45.0.2", "fd45::2"] {
        let (o, secs) = client(to, PORT, "64M", Duration::from_secs(120));
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        assert!(
            o.ok(),
            "usnet perf to {to}: {}\n--- server\n{log}",
            o.describe()
        );
        assert!(
            o.stdout.contains("server verified 67108864"),
            "{}",
            o.describe()
        );
        let lowered = mss_lowered(&o.stdout);
        assert!(lowered > 0, "the MSS was not lowered: {}", o.describe());
        // 1280 − IP − TCP − timestamps.
        let want = if to.contains(':') {
            "now 1208"
        } else {
            "now 1228"
        };
        assert!(o.stdout.contains(want), "{}", o.describe());
        report.push(format!("{to}: {secs:.1} s: {}", o.stdout.trim()));
    }
    drop(server);

    // Refused by ICMP: fails at once, long before the first SYN retransmission.
    for (to, port, errno) in [
        ("10.45.0.2", REJECT_PORT, "os error 111"),
        ("fd45::2", REJECT_PORT, "os error 111"),
        ("10.45.0.2", PROHIBIT_PORT, "os error 113"),
        ("fd45::2", PROHIBIT_PORT, "os error 113"),
    ] {
        let (o, secs) = client(to, port, "1K", Duration::from_secs(30));
        assert!(
            !o.ok(),
            "connect to {to}:{port} succeeded: {}",
            o.describe()
        );
        assert!(o.stderr.contains(errno), "{to}:{port}: {}", o.describe());
        // Without ICMP it would wait out the SYN retries (10 s, then ETIMEDOUT).
        assert!(secs < 5.0, "{to}:{port}: {secs:.1} s");
        report.push(format!("{to}:{port}: {} in {secs:.2} s", o.stderr.trim()));
    }
    for r in &report {
        eprintln!("{r}");
    }
    eprintln!(
        "pmtu_through_a_linux_router_and_icmp_refused_connects took {:?}",
        t0.elapsed()
    );
}
