//! UDP multicast between usnet and Linux over a TAP (root only), with unmodified
//! Python programs under `usnet run`: a receiver under the shim (SO_REUSEADDR,
//! bind to the port, IP_ADD_MEMBERSHIP) gets a datagram a Linux sender sends to
//! the group out of the TAP (the stack's IGMPv2 report counted), and a sender
//! under the shim reaches a Linux receiver that joined the group on the TAP. Every
//! payload is checked; every wait has a deadline.

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
    let deadline = Instant::now() + Duration::from_secs(25);
    loop {
        if let Some(s) = bg.0.try_wait().unwrap() {
            let log = log_of(d, bg.1);
            assert!(s.success(), "{} exited with {s}: {log}", bg.1);
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "{} still running: {}",
            bg.1,
            log_of(d, bg.1)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
            "--host-addr",
            &format!("{HOST}/24"),
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
        "no IGMP report for the join: {c}"
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
            "no IGMP leave: {}",
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
    assert!(counter(&c, "udp_tx_mcast") >= 1, "{c}");
}
