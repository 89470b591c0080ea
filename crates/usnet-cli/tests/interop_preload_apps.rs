//! More unmodified programs through `usnet run` (the LD_PRELOAD shim) against the
//! Linux stack on the other side of a TAP (root only): redis-server under the shim
//! with redis-benchmark and redis-cli on Linux (values read back and compared),
//! redis-cli under the shim against redis on Linux, iperf3 both ways (`-R`, and
//! `-P 4` from under the shim; the receiver must count what was sent, but for the
//! bytes in flight when the time was up), and socat
//! relaying TCP and UDP under the shim (every byte compared).

#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

const TAP: &str = "usntpa0";
const OURS: &str = "10.48.0.2";
const HOST: &str = "10.48.0.1";
const STACK: &str = "it-preload-apps";

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    // Printable, so it travels through redis-cli and socat's line modes unchanged.
    (0..n as u32)
        .map(|i| b'a' + ((i.wrapping_mul(2_654_435_761) ^ seed) >> 27) as u8 % 26)
        .collect()
}

/// `redis-cli -h H -p P args` (under the shim when `stack` is set), input on stdin.
fn redis_cli(
    stack: Option<&str>,
    dir: &std::path::Path,
    host: &str,
    port: u16,
    args: &[&str],
    input: &[u8],
) -> String {
    let mut c = match stack {
        Some(s) => {
            let mut c = Command::new(USNET);
            c.args(["run", "--stack", s, "--", "redis-cli"]);
            c
        }
        None => Command::new("redis-cli"),
    };
    c.args(["-h", host, "-p", &port.to_string()]).args(args);
    let o = run_in(c.env("USNET_RUN_DIR", dir), input, Duration::from_secs(30));
    assert!(o.ok(), "redis-cli {args:?}: {}", o.describe());
    o.stdout
}

fn redis(d: &std::path::Path) {
    let port = 16399u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "shim-redis",
        "redis-server",
        &[
            "--port",
            &port.to_string(),
            "--bind",
            OURS,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
    );
    wait_listening(&mut srv, d, OURS, port);
    // Values of several sizes set and read back from Linux (-x: the value on stdin).
    for (k, n) in [(1u32, 10usize), (2, 4000), (3, 300_000)] {
        let v = pattern(n, k);
        let key = format!("k{k}");
        assert_eq!(
            redis_cli(None, d, OURS, port, &["-x", "set", &key], &v).trim(),
            "OK"
        );
        let got = redis_cli(None, d, OURS, port, &["--raw", "get", &key], &[]);
        assert!(
            got.trim_end().as_bytes() == v,
            "value {key} ({n} bytes) came back different"
        );
    }
    // redis-benchmark from Linux: every request answered, none failed.
    let o = run(
        "redis-benchmark",
        &[
            "-h",
            OURS,
            "-p",
            &port.to_string(),
            "-t",
            "set,get",
            "-n",
            "5000",
            "-P",
            "8",
            "-q",
            "--csv",
        ],
        Duration::from_secs(60),
    );
    assert!(o.ok(), "redis-benchmark: {}", o.describe());
    for t in ["SET", "GET"] {
        assert!(
            o.stdout.contains(&format!("\"{t}\"")),
            "no {t} result: {}",
            o.describe()
        );
    }
    let info = redis_cli(None, d, OURS, port, &["info", "stats"], &[]);
    let processed = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        processed >= 10_000,
        "redis processed {processed} commands: {info}"
    );
    drop(srv);

    // redis-cli under the shim against redis on Linux.
    let lport = 16398u16;
    let mut lin = spawn_prog(
        d,
        None,
        "linux-redis",
        "redis-server",
        &[
            "--port",
            &lport.to_string(),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
    );
    wait_listening(&mut lin, d, HOST, lport);
    let v = pattern(100_000, 9);
    assert_eq!(
        redis_cli(Some(STACK), d, HOST, lport, &["-x", "set", "far"], &v).trim(),
        "OK"
    );
    let got = redis_cli(Some(STACK), d, HOST, lport, &["--raw", "get", "far"], &[]);
    assert!(
        got.trim_end().as_bytes() == v,
        "the value read under the shim differs"
    );
    drop(lin);
}

/// The bytes both ends of an iperf3 run counted (`-J`). The receiver stops counting
/// when the test time is up, so what was still in flight is missing from its sum.
fn iperf_bytes(json: &str) -> (u64, u64) {
    let v: Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("iperf3 JSON: {e}\n{json}"));
    let end = &v["end"];
    assert!(v["error"].is_null(), "iperf3 failed: {}", v["error"]);
    (
        end["sum_sent"]["bytes"].as_u64().unwrap_or(0),
        end["sum_received"]["bytes"].as_u64().unwrap_or(0),
    )
}

fn iperf3(d: &std::path::Path) {
    // Server under the shim, client on Linux, both directions.
    for (i, reverse) in [false, true].into_iter().enumerate() {
        let port = 15201 + i as u16;
        let mut s = spawn_prog(
            d,
            Some(STACK),
            "shim-iperf3",
            "iperf3",
            &[
                "-s",
                "-1",
                "--forceflush",
                "-B",
                OURS,
                "-p",
                &port.to_string(),
            ],
        );
        wait_log(&mut s, d, "Server listening");
        let mut args = vec!["-c", OURS, "-p", "0", "-t", "2", "-J"];
        let p = port.to_string();
        args[3] = &p;
        if reverse {
            args.push("-R");
        }
        let o = run("iperf3", &args, Duration::from_secs(60));
        assert!(o.ok(), "iperf3 -c (reverse {reverse}): {}", o.describe());
        let (sent, got) = iperf_bytes(&o.stdout);
        assert!(
            sent > 1 << 20 && got <= sent && got * 10 >= sent * 9,
            "reverse {reverse}: sent {sent}, received {got}"
        );
        let _ = reap(&mut s.0, Duration::from_secs(10));
    }
    // Client under the shim with 4 streams, server on Linux.
    let port = 15203u16;
    let mut s = spawn_prog(
        d,
        None,
        "linux-iperf3",
        "iperf3",
        &[
            "-s",
            "-1",
            "--forceflush",
            "-B",
            HOST,
            "-p",
            &port.to_string(),
        ],
    );
    wait_log(&mut s, d, "Server listening");
    let o = run_in(
        Command::new(USNET)
            .args([
                "run",
                "--stack",
                STACK,
                "--",
                "iperf3",
                "-c",
                HOST,
                "-p",
                &port.to_string(),
                "-t",
                "2",
                "-P",
                "4",
                "-J",
            ])
            .env("USNET_RUN_DIR", d),
        &[],
        Duration::from_secs(60),
    );
    assert!(o.ok(), "iperf3 -c under the shim: {}", o.describe());
    let (sent, got) = iperf_bytes(&o.stdout);
    assert!(
        sent > 1 << 20 && got <= sent && got * 10 >= sent * 9,
        "-P 4: sent {sent}, received {got}"
    );
}

fn socat(d: &std::path::Path) {
    // TCP: socat under the shim echoes one connection back (PIPE); Linux sends a file.
    let port = 15301u16;
    let mut s = spawn_prog(
        d,
        Some(STACK),
        "shim-socat-tcp",
        "socat",
        &[
            "-d",
            "-d",
            &format!("TCP-LISTEN:{port},bind={OURS},reuseaddr"),
            "PIPE",
        ],
    );
    // (Not a probe connection: socat without `fork` serves one connection.)
    wait_log(&mut s, d, "listening on");
    let data = pattern(2_000_000, 7);
    let o = run_in(
        Command::new("socat").args(["-t", "5", "-", &format!("TCP:{OURS}:{port}")]),
        &data,
        Duration::from_secs(60),
    );
    assert!(o.ok(), "socat tcp: {}", o.describe());
    assert!(
        o.stdout.as_bytes() == data,
        "the TCP echo differs ({} of {} bytes): {}",
        o.stdout.len(),
        data.len(),
        log_of(d, "shim-socat-tcp")
    );
    drop(s);
    // UDP: datagrams echoed back by socat under the shim.
    let port = 15302u16;
    let mut u = spawn_prog(
        d,
        Some(STACK),
        "shim-socat-udp",
        "socat",
        &[
            "-d",
            "-d",
            &format!("UDP-LISTEN:{port},bind={OURS}"),
            "PIPE",
        ],
    );
    wait_log(&mut u, d, "listening on");
    let line = pattern(1200, 3);
    let o = run_in(
        Command::new("socat").args(["-t", "2", "-", &format!("UDP:{OURS}:{port}")]),
        &line,
        Duration::from_secs(30),
    );
    assert!(o.ok(), "socat udp: {}", o.describe());
    assert!(
        o.stdout.as_bytes() == line,
        "the UDP echo differs: {} bytes back",
        o.stdout.len()
    );
}

#[test]
fn redis_iperf3_and_socat_unmodified_on_the_stack_server() {
    require_root!();
    need("redis-server", "redis-server");
    need("redis-cli", "redis-tools");
    need("redis-benchmark", "redis-tools");
    need("iperf3", "iperf3");
    need("socat", "socat");
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("preload-apps");
    let d = dir.path();
    let _stack = Daemon::start(
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
    redis(d);
    iperf3(d);
    socat(d);
}
