//! UDP multicast between usnet and Linux over a TAP (root only), with unmodified
//! Python programs under `usnet run`: a receiver under the shim (SO_REUSEADDR,
//! bind to the port, IP_ADD_MEMBERSHIP) gets a datagram a Linux sender sends to
//! the group out of the TAP (the stack's IGMPv2 report counted), and a sender
//! under the shim reaches a Linux receiver that joined the group on the TAP; then
//! the same both ways over IPv6 (ff12::23, the TAP named by its index, MLDv2
//! report counted). Every payload is checked; every wait has a deadline.

#[macro_use]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const TAP: &str = "usntmc0";
const OURS: &str = "10.49.0.2";
const HOST: &str = "10.49.0.1";
const STACK: &str = "it-mcast";
const GROUP: &str = "239.23.0.1";
const OURS6: &str = "fd49::2";
const HOST6: &str = "fd49::1";
const GROUP6: &str = "ff12::23";

/// Joins GROUP on the interface with address argv[2] (0.0.0.0: any), then prints
/// the first datagram to argv[1] (payload and sender) and exits; 20 s at most.
const RECEIVER: &str = r#"
import socket, struct, sys
port, ifaddr, group = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", port))
mreq = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(ifaddr))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
print("joined", flush=True)
s.settimeout(20)
data, src = s.recvfrom(2048)
print("got", data.decode(), "from", src[0], flush=True)
s.setsockopt(socket.IPPROTO_IP, socket.IP_DROP_MEMBERSHIP, mreq)
s.close()
"#;

/// IPv6: joins argv[3] on interface index argv[2] (0: any), prints the first
/// datagram to argv[1]; 20 s at most.
const RECEIVER6: &str = r#"
import socket, struct, sys
port, ifindex, group = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", port))
mreq = socket.inet_pton(socket.AF_INET6, group) + struct.pack("@I", ifindex)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
print("joined", flush=True)
s.settimeout(20)
data, src = s.recvfrom(2048)
print("got", data.decode(), "from", src[0].split("%")[0], flush=True)
s.close()
"#;

/// IPv6: sends argv[3] to argv[4]:argv[1] out of interface index argv[2] (0: the
/// default), hop limit 1, every 100 ms for 3 s (errors while the host's addresses
/// finish DAD are skipped).
const SENDER6: &str = r#"
import socket, sys, time
port, ifindex, msg, group = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 1)
if ifindex:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
sent = 0
for _ in range(30):
    try:
        s.sendto(msg.encode(), (group, port))
        sent += 1
    except OSError as e:
        print("send:", e, flush=True)
    time.sleep(0.1)
print("sent", sent, flush=True)
"#;

/// Sends argv[3] to GROUP:argv[1] from the interface with address argv[2] (empty:
/// the default), TTL 1, ten times 100 ms apart.
const SENDER: &str = r#"
import socket, sys, time
port, ifaddr, msg, group = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
if ifaddr:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ifaddr))
for _ in range(10):
    s.sendto(msg.encode(), (group, port))
    time.sleep(0.1)
print("sent", flush=True)
"#;

fn python(stack: Option<&str>, d: &std::path::Path, script: &str, args: &[&str]) -> Out {
    let mut c = match stack {
        Some(s) => {
            let mut c = Command::new(USNET);
            c.args(["run", "--stack", s, "--", "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    c.arg("-c").arg(script).args(args).env("USNET_RUN_DIR", d);
    run_in(&mut c, &[], Duration::from_secs(30))
}

/// Waits (25 s at most) for a background program to exit; its log.
fn finish(bg: &mut Bg, d: &std::path::Path) -> String {
    let s = reap(&mut bg.0, Duration::from_secs(25));
    let log = log_of(d, bg.1);
    let s = s.unwrap_or_else(|| panic!("{} still running: {log}", bg.1));
    assert!(s.success(), "{} exited with {s}: {log}", bg.1);
    log
}

#[test]
fn multicast_both_ways_between_programs_under_the_shim_and_linux() {
    require_root!();
    need("python3", "python3");
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("mcast");
    let d = dir.path();
    let stack = Daemon::start(
        d,
        STACK,
        &[
            "--link",
            &format!("tap:{TAP}"),
            "--addr",
            &format!("{OURS}/24"),
            "--addr",
            &format!("{OURS6}/64"),
            "--host-addr",
            &format!("{HOST}/24"),
            "--host-addr",
            &format!("{HOST6}/64"),
        ],
    );

    // Linux → a receiver under the shim.
    let before = counter(&stack.counters(), "igmp_tx_report");
    let port = 15400u16;
    let mut rx = spawn_prog(
        d,
        Some(STACK),
        "shim-mcast-rx",
        "python3",
        &["-c", RECEIVER, &port.to_string(), "0.0.0.0", GROUP],
    );
    wait_log(&mut rx, d, "joined");
    let c = stack.counters();
    assert!(
        counter(&c, "igmp_tx_report") > before,
        "no IGMP report for the join: {c:?}"
    );
    let o = python(
        None,
        d,
        SENDER,
        &[&port.to_string(), HOST, "from-linux", GROUP],
    );
    assert!(o.ok(), "Linux sender: {}", o.describe());
    let log = finish(&mut rx, d);
    assert!(
        log.contains(&format!("got from-linux from {HOST}")),
        "the receiver under the shim: {log}"
    );
    // It dropped its membership and closed: the group is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&stack.counters(), "igmp_tx_leave") == 0 {
        assert!(
            Instant::now() < deadline,
            "no IGMP leave: {:?}",
            stack.counters()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A sender under the shim → a Linux receiver joined on the TAP.
    let port = 15401u16;
    let mut lin = spawn_prog(
        d,
        None,
        "linux-mcast-rx",
        "python3",
        &["-c", RECEIVER, &port.to_string(), HOST, GROUP],
    );
    wait_log(&mut lin, d, "joined");
    let o = python(
        Some(STACK),
        d,
        SENDER,
        &[&port.to_string(), "", "from-usnet", GROUP],
    );
    assert!(o.ok(), "sender under the shim: {}", o.describe());
    let log = finish(&mut lin, d);
    assert!(
        log.contains(&format!("got from-usnet from {OURS}")),
        "the Linux receiver: {log}"
    );
    let c = stack.counters();
    assert!(counter(&c, "udp_tx_mcast") >= 1, "{c:?}");

    // IPv6 both ways: MLDv2 for the join, the TAP named by its index on Linux.
    let ifindex = std::fs::read_to_string(format!("/sys/class/net/{TAP}/ifindex"))
        .unwrap()
        .trim()
        .to_string();
    let before = counter(&stack.counters(), "mld_tx_report");
    let port = 15402u16;
    let mut rx = spawn_prog(
        d,
        Some(STACK),
        "shim-mcast6-rx",
        "python3",
        &["-c", RECEIVER6, &port.to_string(), "0", GROUP6],
    );
    wait_log(&mut rx, d, "joined");
    assert!(counter(&stack.counters(), "mld_tx_report") > before);
    let o = python(
        None,
        d,
        SENDER6,
        &[&port.to_string(), &ifindex, "from-linux6", GROUP6],
    );
    assert!(o.ok(), "Linux IPv6 sender: {}", o.describe());
    let log = finish(&mut rx, d);
    assert!(
        log.contains("got from-linux6 from "),
        "the IPv6 receiver under the shim: {log}"
    );
    let port = 15403u16;
    let mut lin = spawn_prog(
        d,
        None,
        "linux-mcast6-rx",
        "python3",
        &["-c", RECEIVER6, &port.to_string(), &ifindex, GROUP6],
    );
    wait_log(&mut lin, d, "joined");
    let o = python(
        Some(STACK),
        d,
        SENDER6,
        &[&port.to_string(), "0", "from-usnet6", GROUP6],
    );
    assert!(o.ok(), "IPv6 sender under the shim: {}", o.describe());
    let log = finish(&mut lin, d);
    assert!(
        log.contains("got from-usnet6 from fe80::"),
        "the Linux IPv6 receiver (from the stack's link-local address): {log}"
    );
}
