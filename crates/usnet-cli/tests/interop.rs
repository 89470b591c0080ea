//! Interop with the real Linux stack, through the built `usnet` binary: a TAP device, and
//! an AF_PACKET and an AF_XDP socket on a veth whose other end sits in a network namespace, probed with
//! ping, socat and tshark; and the one-line error messages of `usnet up`.
//!
//! The link tests need root (they print "skipped: needs root" otherwise) and the tools
//! from the Debian packages iproute2, iputils-ping, socat and tshark; a missing tool
//! fails the test naming its package. Every test uses its own interface, namespace and
//! run directory, and cleans up in `Drop` even when it fails.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[macro_use]
mod common;
use common::*;

/// Linux `ping` must get every reply.
fn linux_ping(prefix: &[&str], dst: &str, v6: bool) {
    let mut args: Vec<&str> = prefix.to_vec();
    args.extend(["ping", "-c", "3", "-i", "0.2", "-W", "2"]);
    if v6 {
        args.push("-6");
    }
    args.push(dst);
    let o = run(args[0], &args[1..], Duration::from_secs(20));
    assert!(o.ok(), "{}: {}", args.join(" "), o.describe());
    assert!(
        o.stdout.contains("3 received"),
        "{}: {}",
        args.join(" "),
        o.describe()
    );
}

/// Sends `data` as one datagram with socat and returns what came back. socat cannot
/// know when UDP replies are over, so it waits `-t` after its stdin ends: half a second
/// first, and when fewer than `want` bytes came back, once more with 3 s (a loaded CI
/// machine), so the common case stays fast without being flaky.
fn socat_udp(prefix: &[&str], target: &str, data: &[u8], want: usize) -> Vec<u8> {
    let back = socat_once(prefix, target, data, "0.5");
    if back.len() >= want {
        return back;
    }
    socat_once(prefix, target, data, "3")
}

fn socat_once(prefix: &[&str], target: &str, data: &[u8], wait: &str) -> Vec<u8> {
    let mut args: Vec<&str> = prefix.to_vec();
    args.extend(["socat", "-t", wait, "-b", "65536", "-", target]);
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..]);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn socat");
    // One write, one datagram.
    child.stdin.take().unwrap().write_all(data).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn udp_echo_checks(prefix: &[&str], target: &str) {
    let lines = b"first line\nsecond line\nthird, with more words\n";
    let back = socat_udp(prefix, target, lines, lines.len());
    assert_eq!(
        String::from_utf8_lossy(&back),
        String::from_utf8_lossy(lines),
        "UDP echo via {target}"
    );
    // Larger than the MTU: fragmented by Linux, reassembled by usnet, echoed in
    // fragments, reassembled by Linux.
    let big: Vec<u8> = (0..4000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let back = socat_udp(prefix, target, &big, big.len());
    assert_eq!(back.len(), big.len(), "4000-byte echo via {target}");
    assert!(
        back == big,
        "4000-byte echo via {target} came back different"
    );
}

fn chargen_check(prefix: &[&str], target: &str) {
    let back = socat_udp(prefix, target, b"x\n", 1);
    assert!(!back.is_empty(), "chargen via {target} sent nothing");
    assert!(
        back.iter()
            .all(|&b| (32..127).contains(&b) || b == b'\r' || b == b'\n'),
        "chargen via {target} sent unprintable bytes: {:?}",
        String::from_utf8_lossy(&back)
    );
}

fn usnet_ping(d: &Daemon, dst: &str) {
    let o = d.ctl(
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", dst],
        Duration::from_secs(20),
    );
    assert!(o.ok(), "usnet ping {dst}: {}\n{}", o.describe(), d.logs());
    let rtts = o.stdout.lines().filter(|l| l.contains(" time=")).count();
    assert_eq!(rtts, 3, "usnet ping {dst} RTT lines: {}", o.describe());
    assert!(o.stdout.contains("3 received"), "{}", o.describe());
}

// ------------------------------------------------------------------ TAP

#[test]
fn tap_interop_with_linux() {
    require_root!();
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("socat", "socat"),
        ("tshark", "tshark"),
    ] {
        need(tool, pkg);
    }
    let t0 = Instant::now();
    let tap = "usnt1";
    remove_leftovers(&[tap], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", tap]);
    let dir = TempDir::new("tap");
    let pcap = dir.path().join("tap.pcap");
    let mut d = Daemon::start(
        dir.path(),
        "it-tap",
        &[
            "--link",
            &format!("tap:{tap}"),
            "--addr",
            "10.31.0.2/24",
            "--addr",
            "fd31::2/64",
            "--host-addr",
            "10.31.0.1/24",
            "--host-addr",
            "fd31::1/64",
            "--services",
            "echo,discard,chargen",
            "--pcap",
            pcap.to_str().unwrap(),
        ],
    );

    linux_ping(&[], "10.31.0.2", false);
    linux_ping(&[], "fd31::2", true);
    udp_echo_checks(&[], "UDP:10.31.0.2:7");
    udp_echo_checks(&[], "UDP6:[fd31::2]:7");
    chargen_check(&[], "UDP:10.31.0.2:19");
    chargen_check(&[], "UDP6:[fd31::2]:19");
    // Discard: nothing comes back.
    assert!(socat_udp(&[], "UDP:10.31.0.2:9", b"into the void\n", 0).is_empty());
    usnet_ping(&d, "10.31.0.1");
    usnet_ping(&d, "fd31::1");

    let c = d.counters();
    for (name, at_least) in [
        ("icmp4_rx_echo_request", 3),
        ("icmp6_rx_echo_request", 3),
        ("icmp4_rx_echo_reply", 3),
        ("icmp6_rx_echo_reply", 3),
        ("ip4_reassembled", 1),
        ("ip6_reassembled", 1),
        ("ip4_tx_fragments", 2),
        ("ip6_tx_fragments", 2),
        ("udp_rx_delivered", 7),
    ] {
        assert!(
            counter(&c, name) >= at_least,
            "{name} = {} < {at_least}: {c:?}",
            counter(&c, name)
        );
    }
    let o = d.ctl(&["stat"], Duration::from_secs(10));
    assert!(o.ok(), "usnet stat: {}", o.describe());
    for want in [
        "stack it-tap",
        "icmp4_rx_echo_request",
        "udp_rx_delivered",
        "pool:",
    ] {
        assert!(
            o.stdout.contains(want),
            "usnet stat lacks {want:?}:\n{}",
            o.stdout
        );
    }

    d.down();
    check_pcap(&pcap);
    eprintln!("tap_interop_with_linux took {:?}", t0.elapsed());
}

/// The capture parses with tshark and holds the conversations above.
fn check_pcap(pcap: &Path) {
    let meta = std::fs::metadata(pcap).expect("pcap file written");
    assert!(meta.len() > 24, "pcap file is only {} bytes", meta.len());
    let mut head = [0u8; 24];
    File::open(pcap).unwrap().read_exact(&mut head).unwrap();
    let magic = u32::from_le_bytes(head[..4].try_into().unwrap());
    assert!(
        matches!(magic, 0xa1b2_c3d4 | 0xa1b2_3c4d),
        "pcap magic {magic:#x}"
    );
    assert_eq!(
        u32::from_le_bytes(head[20..24].try_into().unwrap()),
        1,
        "linktype Ethernet"
    );
    let o = run(
        "tshark",
        &["-n", "-r", pcap.to_str().unwrap()],
        Duration::from_secs(60),
    );
    assert!(o.ok(), "tshark -r: {}", o.describe());
    let lines = o.stdout.lines().count();
    assert!(lines >= 20, "tshark saw {lines} frames:\n{}", o.stdout);
    for proto in ["ARP", "ICMP ", "ICMPv6", "UDP", "Echo"] {
        assert!(
            o.stdout.contains(proto),
            "no {proto} in the capture:\n{}",
            o.stdout
        );
    }
    assert!(
        !o.stderr.contains("appears to have been cut short")
            && !o.stderr.to_lowercase().contains("malformed"),
        "tshark complains: {}",
        o.stderr
    );
}

// ------------------------------------------------------------------ AF_PACKET

#[test]
fn af_packet_on_veth_with_a_namespace() {
    require_root!();
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("socat", "socat"),
    ] {
        need(tool, pkg);
    }
    let t0 = Instant::now();
    let (ns, outer, inner) = ("usnetns-x", "usnv0", "usnv1");
    let _cleanup = veth_netns(ns, outer, inner, &["10.32.0.1/24", "fd32::1/64"]);

    let dir = TempDir::new("afp");
    let mut d = Daemon::start(
        dir.path(),
        "it-afp",
        &[
            "--link",
            &format!("afpacket:{outer}"),
            "--addr",
            "10.32.0.2/24",
            "--addr",
            "fd32::2/64",
            "--services",
            "echo,chargen",
        ],
    );
    let nsx = ["ip", "netns", "exec", ns];
    linux_ping(&nsx, "10.32.0.2", false);
    linux_ping(&nsx, "fd32::2", true);
    udp_echo_checks(&nsx, "UDP:10.32.0.2:7");
    udp_echo_checks(&nsx, "UDP6:[fd32::2]:7");
    chargen_check(&nsx, "UDP:10.32.0.2:19");
    usnet_ping(&d, "10.32.0.1");
    usnet_ping(&d, "fd32::1");
    let c = d.counters();
    assert!(counter(&c, "udp_rx_bad_checksum") == 0, "{c:?}");
    assert!(counter(&c, "ip4_reassembled") >= 1, "{c:?}");
    d.down();
    eprintln!("af_packet_on_veth_with_a_namespace took {:?}", t0.elapsed());
}

// ------------------------------------------------------------------ AF_XDP

/// Whether an XDP program is attached to `ifname` (`ip -d link show`).
fn xdp_attached(ifname: &str) -> bool {
    must("ip", &["-d", "link", "show", "dev", ifname])
        .stdout
        .contains("prog/xdp")
}

/// Waits up to `limit` for `cond`.
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--link xdp:` on a veth whose other end sits in a namespace: ping and UDP echo
/// (IPv4 and IPv6, a fragmented datagram), usnet's own ping; Linux's address on the
/// same veth end keeps answering (the steering program passes what is not the
/// stack's); the program is gone after `usnet down` and after a SIGKILL.
#[test]
fn xdp_on_veth_with_a_namespace() {
    require_root!();
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("socat", "socat"),
    ] {
        need(tool, pkg);
    }
    let t0 = Instant::now();
    let (ns, outer, inner) = ("usnetns-xdp", "usnx0", "usnx1");
    let _cleanup = veth_netns(ns, outer, inner, &["10.34.0.1/24", "fd34::1/64"]);
    // Linux's own address on the interface usnet attaches to.
    ip(&["addr", "add", "10.34.0.3/24", "dev", outer]);
    let nsx = ["ip", "netns", "exec", ns];
    let link = format!("xdp:{outer}");
    // One MAC for the three stacks below: the namespace's neighbour entry for
    // 10.34.0.2 stays right across restarts (the stack sends no gratuitous ARP).
    let args = [
        "--mac",
        "02:00:00:34:00:02",
        "--link",
        &link,
        "--addr",
        "10.34.0.2/24",
        "--addr",
        "fd34::2/64",
        "--services",
        "echo,chargen",
    ];

    let dir = TempDir::new("xdp");
    let mut d = Daemon::start(dir.path(), "it-xdp", &args);
    assert!(xdp_attached(outer), "no XDP program on {outer}");
    linux_ping(&nsx, "10.34.0.2", false);
    linux_ping(&nsx, "fd34::2", true);
    udp_echo_checks(&nsx, "UDP:10.34.0.2:7");
    udp_echo_checks(&nsx, "UDP6:[fd34::2]:7");
    chargen_check(&nsx, "UDP:10.34.0.2:19");
    usnet_ping(&d, "10.34.0.1");
    usnet_ping(&d, "fd34::1");
    // The host's own traffic on the same interface: ARP and ICMP for 10.34.0.3 pass
    // the program to Linux, and Linux answers.
    linux_ping(&nsx, "10.34.0.3", false);
    let c = d.counters();
    assert_eq!(counter(&c, "udp_rx_bad_checksum"), 0, "{c:?}");
    assert!(counter(&c, "ip4_reassembled") >= 1, "{c:?}");
    assert!(counter(&c, "link_rx_frames") >= 20, "{c:?}");
    let stat = d.ctl(&["stat"], Duration::from_secs(10));
    assert!(stat.ok(), "{}", stat.describe());
    d.down();
    assert!(
        !xdp_attached(outer),
        "program left on {outer} after usnet down"
    );
    linux_ping(&nsx, "10.34.0.3", false);

    // A stack killed with SIGKILL runs no destructor: the kernel closes its BPF link
    // with the process, and that detaches the program.
    let mut d = Daemon::start(dir.path(), "it-xdp-kill", &args);
    assert!(xdp_attached(outer), "no XDP program on {outer}");
    linux_ping(&nsx, "10.34.0.2", false);
    d.child.kill().unwrap();
    reap(&mut d.child, Duration::from_secs(10)).expect("SIGKILLed usnet up reaped");
    assert!(
        within(Duration::from_secs(5), || !xdp_attached(outer)),
        "program left on {outer} after SIGKILL"
    );
    linux_ping(&nsx, "10.34.0.3", false);
    // And the interface can be taken again at once.
    let mut d = Daemon::start(dir.path(), "it-xdp-again", &args);
    linux_ping(&nsx, "10.34.0.2", false);
    d.down();
    eprintln!("xdp_on_veth_with_a_namespace took {:?}", t0.elapsed());
}

// ------------------------------------------------------------------ error lines

/// Non-zero exit, one clear line (`usnet: ...` or clap's `error: ...`, clap may add
/// its usage hint), no panic.
fn assert_one_error_line(o: &Out, what: &str) {
    assert!(!o.ok(), "{what} succeeded: {}", o.describe());
    assert!(
        !o.stderr.contains("panicked") && !o.stderr.contains("backtrace"),
        "{what} panicked: {}",
        o.describe()
    );
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        !lines.is_empty(),
        "{what}: nothing on stderr: {}",
        o.describe()
    );
    let first = lines[0];
    if first.starts_with("usnet:") {
        assert_eq!(
            lines.len(),
            1,
            "{what}: more than one line: {}",
            o.describe()
        );
    } else {
        assert!(first.starts_with("error:"), "{what}: {}", o.describe());
        assert!(
            lines[1..]
                .iter()
                .all(|l| l.starts_with("Usage:") || l.starts_with("For more information")),
            "{what}: more than one error line: {}",
            o.describe()
        );
    }
    eprintln!("{what}: {first}");
}

fn usnet_up_fails(dir: &Path, args: &[&str], what: &str) -> Out {
    let o = run_in(
        Command::new(USNET)
            .arg("up")
            .args(args)
            .env("USNET_RUN_DIR", dir)
            .env("RUST_BACKTRACE", "1"),
        &[],
        Duration::from_secs(20),
    );
    assert_one_error_line(&o, what);
    o
}

#[test]
fn bad_link_and_bad_address_are_one_line_errors() {
    let dir = TempDir::new("err-args");
    let o = usnet_up_fails(
        dir.path(),
        &["--link", "foo:bar", "--addr", "10.0.0.1/24"],
        "--link foo:bar",
    );
    assert!(o.stderr.contains("foo"), "{}", o.describe());
    let o = usnet_up_fails(
        dir.path(),
        &["--link", "shm:usnet-it-bad", "--addr", "10.0.0.1/99"],
        "--addr 10.0.0.1/99",
    );
    assert!(o.stderr.contains("10.0.0.1/99"), "{}", o.describe());
}

#[test]
fn tap_as_non_root_is_a_one_line_error() {
    require_root!();
    need("setpriv", "util-linux");
    let dir = TempDir::new("err-nobody");
    // The binary may sit below directories `nobody` cannot enter: use a copy.
    let bin = dir.path().join("usnet");
    std::fs::copy(USNET, &bin).unwrap();
    for p in [dir.path(), bin.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", "usnt9"]);
    let o = run_in(
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(&bin)
            .args(["up", "--link", "tap:usnt9", "--addr", "10.39.0.2/24"])
            .env("USNET_RUN_DIR", dir.path().join("run"))
            .env("RUST_BACKTRACE", "1"),
        &[],
        Duration::from_secs(20),
    );
    assert_one_error_line(&o, "tap as nobody");
    let low = o.stderr.to_lowercase();
    assert!(
        low.contains("permission") || low.contains("root") || low.contains("cap_net_admin"),
        "the error should say why: {}",
        o.describe()
    );
}

/// A field of /proc/PID/status (or of one thread's, with `pid/task/TID`), its
/// whitespace collapsed.
fn proc_status(pid: &str, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `usnet up --user nobody`: the server gives up root once its TAP is open, its
/// control socket bound and its loop started. It then runs as nobody with no
/// capabilities, no_new_privs and the seccomp allow-list (`Seccomp: 2`: filter
/// mode; that the filter refuses calls is `usnet_server::privs`' unit test), and
/// still answers Linux (ping, the echo service), its control socket (stat, ping
/// out, down) and clients under the shim, which run as root.
#[test]
fn a_stack_server_that_gave_up_root_keeps_serving() {
    require_root!();
    need("curl", "curl");
    const TAPU: &str = "usntu0";
    remove_leftovers(&[TAPU], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAPU]);
    let dir = TempDir::new("user-nobody");
    let link = format!("tap:{TAPU}");
    let mut d = Daemon::start(
        dir.path(),
        "it-nobody",
        &[
            "--link",
            &link,
            "--addr",
            "10.67.0.2/24",
            "--host-addr",
            "10.67.0.1/24",
            "--user",
            "nobody",
        ],
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let field = |k: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {status}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("Uid:"), "65534 65534 65534 65534", "{status}");
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
    assert_eq!(field("Groups:"), "", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "{status}");
    assert!(
        d.logs().contains("usnet: running as nobody (uid 65534"),
        "{}",
        d.logs()
    );
    // Linux reaches it; it reaches Linux; the echo service (a client) answers.
    let o = run(
        "ping",
        &["-c", "2", "-W", "2", "10.67.0.2"],
        Duration::from_secs(10),
    );
    assert!(o.ok(), "ping: {}", o.describe());
    usnet_ping(&d, "10.67.0.1");
    {
        let mut c = std::net::TcpStream::connect_timeout(
            &"10.67.0.2:7".parse().unwrap(),
            Duration::from_secs(5),
        )
        .expect("the echo service");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"still serving").unwrap();
        let mut back = [0u8; 13];
        c.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"still serving");
    }
    // A root client under the shim: curl out to a Linux server.
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("f"), b"from linux\n").unwrap();
    let mut py = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            "18840",
            "--bind",
            "10.67.0.1",
            "--directory",
        ])
        .arg(&www)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(15);
    let o = loop {
        let o = run_in(
            Command::new(USNET)
                .args(["run", "--stack", "it-nobody", "--", "curl", "-sS", "--fail"])
                .args(["--max-time", "10", "http://10.67.0.1:18840/f"])
                .env("USNET_RUN_DIR", dir.path()),
            &[],
            Duration::from_secs(30),
        );
        if o.ok() || Instant::now() > end {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = py.kill();
    let _ = py.wait();
    assert!(
        o.ok() && o.stdout == "from linux\n",
        "curl under the shim: {}",
        o.describe()
    );
    d.down();
    // Root's run directory is not nobody's to clean; the janitor that kept root
    // removes the control socket once the server is gone.
    gone_within(&dir.path().join("it-nobody.ctl"), Duration::from_secs(5));
}

/// Waits until `path` no longer exists, failing after `limit`.
fn gone_within(path: &std::path::Path, limit: Duration) {
    let end = Instant::now() + limit;
    while path.exists() {
        assert!(Instant::now() < end, "{} is still there", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--rx-policy priority` with `--user`: the loop keeps CAP_SYS_NICE (bit 23) to
/// boost clients, in its permitted and effective sets only; the control thread
/// keeps nothing. Started as root with no `--user`, the server becomes the user who
/// ran sudo, else nobody; `--user root` stays root and says so.
#[test]
fn a_priority_server_keeps_only_cap_sys_nice_and_root_is_given_up_by_default() {
    require_root!();
    const TAPU: &str = "usntu1";
    remove_leftovers(&[TAPU], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAPU]);
    let dir = TempDir::new("user-prio");
    let link = format!("tap:{TAPU}");
    let tap = |more: &[&'static str]| -> Vec<String> {
        let mut a: Vec<String> = ["--link", &link, "--addr", "10.68.0.2/24"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(["--host-addr".into(), "10.68.0.1/24".into()]);
        a.extend(more.iter().map(|s| s.to_string()));
        a
    };
    let start = |name: &str, more: &[&'static str]| {
        let a = tap(more);
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        Daemon::start(dir.path(), name, &a)
    };
    let mut d = start("it-prio", &["--user", "nobody", "--rx-policy", "priority"]);
    let pid = d.child.id().to_string();
    assert_eq!(proc_status(&pid, "Uid:"), "65534 65534 65534 65534");
    assert_eq!(proc_status(&pid, "CapEff:"), "0000000000800000");
    assert_eq!(proc_status(&pid, "CapPrm:"), "0000000000800000");
    assert_eq!(proc_status(&pid, "CapInh:"), "0000000000000000");
    assert_eq!(proc_status(&pid, "CapAmb:"), "0000000000000000");
    assert_eq!(proc_status(&pid, "NoNewPrivs:"), "1");
    assert_eq!(proc_status(&pid, "Seccomp:"), "2");
    let mut seen = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid = format!("{pid}/task/{}", t.file_name().to_string_lossy());
        let comm = std::fs::read_to_string(format!("/proc/{tid}/comm")).unwrap_or_default();
        let want = match comm.trim() {
            "usnet" | "usnet-server" => "0000000000800000",
            _ => "0000000000000000",
        };
        assert_eq!(proc_status(&tid, "CapEff:"), want, "thread {}", comm.trim());
        assert_eq!(proc_status(&tid, "Seccomp:"), "2", "thread {}", comm.trim());
        seen.push(comm.trim().to_string());
    }
    assert!(
        seen.iter().any(|c| c == "usnet-control"),
        "threads: {seen:?}"
    );
    assert!(d.logs().contains("keeping CAP_SYS_NICE"), "{}", d.logs());
    let o = run(
        "ping",
        &["-c", "2", "-W", "2", "10.68.0.2"],
        Duration::from_secs(10),
    );
    assert!(o.ok(), "ping: {}", o.describe());
    // The boost state file was handed to nobody (the booster rewrites it).
    let boosts = dir.path().join("it-prio.boosts");
    assert_eq!(std::fs::metadata(&boosts).unwrap().uid(), 65534);
    d.down();
    gone_within(&boosts, Duration::from_secs(5));
    gone_within(&dir.path().join("it-prio.ctl"), Duration::from_secs(5));
    // No --user: $SUDO_USER if it names a user, else nobody.
    let want = std::env::var("SUDO_USER")
        .ok()
        .filter(|u| !u.is_empty())
        .and_then(|u| {
            let o = run("id", &["-u", &u], Duration::from_secs(5));
            o.ok().then(|| o.stdout.trim().to_string())
        })
        .unwrap_or_else(|| "65534".into());
    let mut d = start("it-default", &[]);
    let pid = d.child.id().to_string();
    assert_eq!(proc_status(&pid, "Uid:"), [want.as_str(); 4].join(" "));
    assert_eq!(proc_status(&pid, "CapEff:"), "0000000000000000");
    assert_eq!(proc_status(&pid, "Seccomp:"), "2");
    usnet_ping(&d, "10.68.0.1");
    d.down();
    // --user root: stays root, no filter, and says so.
    let mut d = start("it-root", &["--user", "root"]);
    let pid = d.child.id().to_string();
    assert_eq!(proc_status(&pid, "Uid:"), "0 0 0 0");
    assert_eq!(proc_status(&pid, "Seccomp:"), "0");
    assert!(d.logs().contains("usnet: running as root"), "{}", d.logs());
    d.down();
}

#[test]
fn duplicate_name_and_third_shm_stack_are_one_line_errors() {
    let dir = TempDir::new("err-shm");
    let link = format!("shm:usnet-it-{}", std::process::id());
    let a = Daemon::start(
        dir.path(),
        "dup",
        &["--link", &link, "--addr", "10.33.0.1/24"],
    );
    // Same --name on another link.
    let other = format!("shm:usnet-it-other-{}", std::process::id());
    let o = usnet_up_fails(
        dir.path(),
        &["--link", &other, "--addr", "10.34.0.1/24", "--name", "dup"],
        "same --name twice",
    );
    assert!(o.stderr.contains("dup"), "{}", o.describe());
    // The shm link takes two stacks; the third is refused.
    let b = Daemon::start(
        dir.path(),
        "second",
        &["--link", &link, "--addr", "10.33.0.2/24"],
    );
    usnet_ping(&b, "10.33.0.1");
    usnet_up_fails(
        dir.path(),
        &["--link", &link, "--addr", "10.33.0.3/24", "--name", "third"],
        "third stack on a shm link",
    );
    // The first two are unharmed.
    usnet_ping(&a, "10.33.0.2");
    drop(b);
    drop(a);
    assert_shm_link_removed(&link);
    assert_shm_link_removed(&other);
}

/// Every subcommand given a bad flag value, a stack that is not running, an address
/// that does not parse or a link it cannot open: non-zero exit, one line that says
/// what is wrong (and, in usnet's own messages, what to do), no panic, and nothing
/// run or written first.
#[test]
fn every_subcommand_answers_bad_input_in_one_line() {
    let dir = TempDir::new("err-every");
    let out = dir.path().join("bench-out");
    let o = out.to_str().unwrap();
    // (arguments, words the line must contain)
    let cases: &[(&[&str], &[&str])] = &[
        // Flag values.
        (&["ping", "10.0.0.999"], &["10.0.0.999"]),
        (&["httpd", "-p", "99999"], &["99999"]),
        (&["httpd", "--shards", "0"], &["shard", "cores"]),
        (&["perf", "--bytes", "abc"], &["abc"]),
        (&["nicemu", "--name", "x", "--count", "abc"], &["abc"]),
        (&["bench", "udp", "--runs", "x", "--out", o], &["--runs"]),
        (&["bench", "nic", "--only", "9", "--out", o], &["9"]),
        (
            &["bench", "udp", "--only", "foo", "--out", o],
            &["foo", "usnet-shm"],
        ),
        (
            &["bench", "httpd", "--only", "foo", "--out", o],
            &["foo", "nginx"],
        ),
        (
            &["bench", "async-syscall", "--only", "foo", "--out", o],
            &["foo", "gettid"],
        ),
        (
            &["bench", "prio", "--datagrams", "0", "--out", o],
            &["--datagrams", "at least"],
        ),
        (
            &["bench", "server", "--sizes", "0", "--out", o],
            &["--sizes", "at least"],
        ),
        (
            &["bench", "preload", "--runs", "0", "--out", o],
            &["--runs", "at least"],
        ),
        // A stack that is not running.
        (&["down", "--stack", "nosuch"], &["nosuch", "usnet up"]),
        (
            &["ping", "--stack", "nosuch", "10.0.0.1"],
            &["nosuch", "usnet up"],
        ),
        (&["stat", "--stack", "nosuch"], &["nosuch", "usnet up"]),
        (&["clients", "--stack", "nosuch"], &["nosuch", "usnet up"]),
        (
            &["get", "--stack", "nosuch", "http://10.0.0.1/"],
            &["nosuch", "usnet up"],
        ),
        (
            &["run", "--stack", "nosuch", "--", "true"],
            &["nosuch", "--fallback-kernel"],
        ),
        (&["run", "--", "true"], &["usnet up", "--fallback-kernel"]),
        (
            &["httpd", "--api", "zerocopy", "--stack", "nosuch"],
            &["nosuch", "usnet up"],
        ),
        // Addresses.
        (
            &["get", "--stack", "nosuch", "notaurl"],
            &["notaurl", "http://"],
        ),
        (
            &["up", "--link", "shm:x", "--addr", "10.0.0.1/99"],
            &["10.0.0.1/99"],
        ),
        (
            &["httpd", "--api", "socket", "--link", "shm:x"],
            &["--addr"],
        ),
        // Links.
        (
            &[
                "up",
                "--link",
                "afpacket:nosuchif0",
                "--addr",
                "10.0.0.1/24",
            ],
            &["nosuchif0", "ip link"],
        ),
        (
            &[
                "up",
                "--link",
                "tap:waytoolonginterfacename",
                "--addr",
                "10.0.0.1/24",
            ],
            &["15"],
        ),
        (
            &[
                "up",
                "--link",
                "shm:x",
                "--addr",
                "10.0.0.1/24",
                "--mtu",
                "10",
            ],
            &["MTU"],
        ),
        (
            &[
                "httpd",
                "--api",
                "socket",
                "--link",
                "nic:x",
                "--addr",
                "10.0.0.2/24",
                "--shards",
                "2",
            ],
            &["shards", "afpacket"],
        ),
        (
            &[
                "up",
                "--link",
                "shm:x",
                "--addr",
                "10.0.0.1/24",
                "--user",
                "no-such-user-here",
            ],
            &["--user", "no-such-user-here"],
        ),
    ];
    for (args, words) in cases {
        let what = args.join(" ");
        let o = run_in(
            Command::new(USNET)
                .args(*args)
                .env("USNET_RUN_DIR", dir.path().join("run"))
                .env_remove("USNET_STACK")
                .env("RUST_BACKTRACE", "1"),
            &[],
            Duration::from_secs(20),
        );
        assert_one_error_line(&o, &what);
        for w in *words {
            assert!(
                o.stderr.contains(w),
                "{what}: the line should say {w:?}: {}",
                o.describe()
            );
        }
    }
    assert!(!out.exists(), "a refused benchmark wrote its results");
}
