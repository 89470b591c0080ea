//! `usnet httpd` answering curl, wrk and a raw socket, on each backend: `--api
//! kernel` on loopback (no root), `--api socket` and `--api zerocopy` over a TAP and
//! over a veth pair into a network namespace on AF_PACKET and on AF_XDP (root). Every response byte
//! is checked (status line, headers, Content-Length, the body pattern), with keep-alive,
//! pipelining (several requests in one write), `Connection: close` and clients
//! that reset; wrk must see no errors and only 2xx answers.

#[macro_use]
mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LENGTHS: [usize; 3] = [64, 4096, 65536];
/// The backends on usnet's stack: the socket API and the zero-copy rings.
const APIS: [&str; 2] = ["socket", "zerocopy"];

/// A background `usnet httpd`, stopped (SIGTERM, then SIGKILL) and reaped on drop.
struct Httpd(Child, String);

impl Httpd {
    fn start(dir: &Path, tag: &str, ns: Option<&str>, args: &[&str]) -> Httpd {
        Self::start_env(dir, tag, ns, args, &[])
    }

    fn start_env(
        dir: &Path,
        tag: &str,
        ns: Option<&str>,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Httpd {
        let mut c = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, USNET]);
                c
            }
            None => Command::new(USNET),
        };
        let log = dir.join(format!("{tag}.log"));
        let f = File::create(&log).unwrap();
        for (k, v) in env {
            c.env(k, v);
        }
        let child = c
            .arg("httpd")
            .args(args)
            .args(["--duration", "120"])
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        Httpd(child, log.display().to_string())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }

    /// Stops the server and returns its log (with the summary line).
    fn stop(mut self) -> String {
        // SAFETY: kill with the pid of a child we own.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let s = reap(&mut self.0, Duration::from_secs(10));
        assert!(s.is_some(), "usnet httpd did not stop: {}", self.log());
        self.log()
    }
}

impl Drop for Httpd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = reap(&mut self.0, Duration::from_secs(5));
    }
}

/// Runs `cmd args` (in namespace `ns` if given).
fn cmd_in(ns: Option<&str>, prog: &str, args: &[&str], timeout: Duration) -> Out {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, prog]);
            c
        }
        None => Command::new(prog),
    };
    run_in(c.args(args), &[], timeout)
}

/// Waits until the server answers curl.
fn wait_serving(h: &mut Httpd, ns: Option<&str>, url: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let o = cmd_in(
            ns,
            "curl",
            &["-s", "-o", "/dev/null", "--max-time", "1", "--fail", url],
            Duration::from_secs(10),
        );
        if o.ok() {
            return;
        }
        if let Some(s) = h.0.try_wait().unwrap() {
            panic!("usnet httpd exited ({s}): {}", h.log());
        }
        assert!(
            Instant::now() < end,
            "usnet httpd does not answer {url}: {}",
            h.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The exact response of `len` body bytes, written out independently of the server:
/// byte `i` of the body is `(31 * i + 7) mod 251`.
fn expected(len: usize, close: bool, head_only: bool) -> Vec<u8> {
    let conn = if close { "close" } else { "keep-alive" };
    let mut v = format!(
        "HTTP/1.1 200 OK\r\nConnection: {conn}\r\nServer: usnet-phttpd/1\r\nContent-Length: {len}\r\n\r\n"
    )
    .into_bytes();
    if !head_only {
        v.extend((0..len as u64).map(|i| ((31 * i + 7) % 251) as u8));
    }
    v
}

fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} bytes, want {}; first difference at {at}",
            got.len(),
            want.len()
        );
    }
}

/// curl: one URL (head and body checked byte for byte), then three URLs on one
/// connection (keep-alive: curl reports one connect).
fn check_curl(dir: &Path, ns: Option<&str>, base: &str, len: usize) {
    let (hd, body) = (dir.join("h"), dir.join("b"));
    let o = cmd_in(
        ns,
        "curl",
        &[
            "-sS",
            "--fail",
            "--max-time",
            "20",
            "-D",
            hd.to_str().unwrap(),
            "-o",
            body.to_str().unwrap(),
            &format!("{base}/index.html"),
        ],
        Duration::from_secs(30),
    );
    assert!(o.ok(), "curl: {}", o.describe());
    let want = expected(len, false, false);
    let head_len = want.len() - len;
    same(&std::fs::read(&hd).unwrap(), &want[..head_len], "curl head");
    same(
        &std::fs::read(&body).unwrap(),
        &want[head_len..],
        "curl body",
    );
    let o = cmd_in(
        ns,
        "curl",
        &[
            "-sS",
            "--fail",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{num_connects}\\n",
            &format!("{base}/a"),
            &format!("{base}/b"),
            &format!("{base}/c"),
        ],
        Duration::from_secs(30),
    );
    assert!(o.ok(), "curl keep-alive: {}", o.describe());
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("{len} 1").as_str(),
            format!("{len} 0").as_str(),
            format!("{len} 0").as_str()
        ],
        "three transfers of {len} bytes on one connection"
    );
}

/// A raw socket: keep-alive, then GET + HEAD + GET in one write, then a pipelined
/// GET with `Connection: close` (the answers, then EOF).
fn check_raw(addr: SocketAddr, len: usize) {
    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    const HEAD: &[u8] = b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n";
    const CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let one = expected(len, false, false);
    let mut got = vec![0u8; one.len()];
    s.write_all(GET).unwrap();
    s.read_exact(&mut got).unwrap();
    same(&got, &one, "raw keep-alive");
    let want = [one.clone(), expected(len, false, true), one.clone()].concat();
    s.write_all(&[GET, HEAD, GET].concat()).unwrap();
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).unwrap();
    same(&got, &want, "raw pipelined");
    s.write_all(&[GET, CLOSE, GET].concat()).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    same(
        &got,
        &[one, expected(len, true, false)].concat(),
        "raw Connection: close",
    );
}

/// Clients that reset (SO_LINGER 0) in the middle of a request and with answers in
/// flight; the server then still answers a new connection.
fn check_resets(addr: SocketAddr, len: usize) {
    use std::os::fd::AsRawFd;
    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    for req in [&b"GET / HT"[..], &GET.repeat(50)] {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.write_all(req).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let l = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid linger struct for the socket's own descriptor.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
        };
        assert_eq!(r, 0);
        drop(s); // RST
    }
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(GET).unwrap();
    let want = expected(len, false, false);
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).unwrap();
    same(&got, &want, "after resets");
}

/// wrk -c20 for a second: requests made, no socket errors, no non-2xx answers.
fn check_wrk(ns: Option<&str>, url: &str) -> u64 {
    let o = cmd_in(
        ns,
        "wrk",
        &["-t1", "-c20", "-d1s", "--timeout", "5s", url],
        Duration::from_secs(60),
    );
    assert!(o.ok(), "wrk: {}", o.describe());
    assert!(
        !o.stdout.contains("Socket errors") && !o.stdout.contains("Non-2xx"),
        "wrk saw errors:\n{}",
        o.stdout
    );
    let n: u64 = o
        .stdout
        .lines()
        .find_map(|l| {
            l.split_once(" requests in ")
                .map(|(n, _)| n.trim().to_string())
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no request count in wrk's output:\n{}", o.stdout));
    assert!(n > 0, "{}", o.stdout);
    n
}

/// The server's summary: its request count covers wrk's and nothing was malformed.
fn check_summary(log: &str, at_least: u64) {
    let line = log
        .lines()
        .find(|l| l.contains(" requests, "))
        .unwrap_or_else(|| panic!("no summary in the log:\n{log}"));
    let num = |what: &str| -> u64 {
        line.split(", ")
            .find_map(|p| p.trim_start_matches("usnet httpd: ").strip_suffix(what))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what} in {line}"))
    };
    assert!(num(" requests") >= at_least, "{line}");
    assert_eq!(num(" bad requests"), 0, "{line}");
}

/// The checks every server on this host's side passes, then its stop: curl, raw
/// pipelined and resetting clients at `addr`, wrk, and the server's own summary.
fn serves_every_client(mut h: Httpd, dir: &Path, base: &str, addr: &str, len: usize) {
    wait_serving(&mut h, None, base);
    check_curl(dir, None, base, len);
    check_raw(addr.parse().unwrap(), len);
    check_resets(addr.parse().unwrap(), len);
    let n = check_wrk(None, &format!("{base}/"));
    check_summary(&h.stop(), n);
}

#[test]
fn kernel_api_answers_curl_wrk_and_pipelined_requests() {
    let have = |t: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    let tools = have("curl") && have("wrk");
    if !tools && !is_root() {
        // CI runs as root and installs both (scripts/test.sh).
        eprintln!("skipped: needs curl and wrk");
        return;
    }
    need("curl", "curl");
    need("wrk", "wrk");
    let dir = TempDir::new("httpd-kernel");
    for (i, len) in LENGTHS.into_iter().enumerate() {
        let port = 18_931 + i as u16;
        let h = Httpd::start(
            dir.path(),
            &format!("kernel-{len}"),
            None,
            &[
                "--api",
                "kernel",
                "--bind",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-l",
                &len.to_string(),
            ],
        );
        let addr = format!("127.0.0.1:{port}");
        serves_every_client(h, dir.path(), &format!("http://{addr}"), &addr, len);
    }
}

#[test]
fn the_stack_apis_without_a_link_are_refused_clearly() {
    for api in ["socket", "zerocopy"] {
        let o = run(USNET, &["httpd", "--api", api], Duration::from_secs(10));
        assert!(!o.ok());
        assert!(o.stderr.contains("need --link"), "{}", o.describe());
    }
}

#[test]
fn socket_api_over_tap_answers_curl_wrk_and_pipelined_requests() {
    require_root!();
    need("curl", "curl");
    need("wrk", "wrk");
    const TAP: &str = "usnthd0";
    const OURS: &str = "10.57.0.2";
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("httpd-tap");
    for (api, len) in APIS.into_iter().flat_map(|a| LENGTHS.map(|l| (a, l))) {
        let h = Httpd::start(
            dir.path(),
            &format!("tap-{api}-{len}"),
            None,
            &[
                "--api",
                api,
                "--link",
                &format!("tap:{TAP}"),
                "--addr",
                &format!("{OURS}/24"),
                "--host-addr",
                "10.57.0.1/24",
                "-l",
                &len.to_string(),
            ],
        );
        serves_every_client(
            h,
            dir.path(),
            &format!("http://{OURS}"),
            &format!("{OURS}:80"),
            len,
        );
    }
}

#[test]
fn zerocopy_through_a_stack_server_answers_curl_wrk_and_pipelined_requests() {
    require_root!();
    need("curl", "curl");
    need("wrk", "wrk");
    const TAP: &str = "usnthz0";
    const OURS: &str = "10.59.0.2";
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("httpd-zc-server");
    // The server holds the link; the httpd is a client process with a zero-copy port.
    let mut up = Daemon::start(
        dir.path(),
        "hzc",
        &[
            "--link",
            &format!("tap:{TAP}"),
            "--addr",
            &format!("{OURS}/24"),
            "--host-addr",
            "10.59.0.1/24",
            "--zero-copy",
        ],
    );
    for len in LENGTHS {
        let len_arg = len.to_string();
        let mut args = vec!["--api", "zerocopy", "--stack", "hzc", "-l", &len_arg];
        // The shortest answers written per request, the others from the cache.
        if len == LENGTHS[0] {
            args.push("--no-cache");
        }
        let h = Httpd::start_env(
            dir.path(),
            &format!("zc-server-{len}"),
            None,
            &args,
            &[("USNET_RUN_DIR", dir.path())],
        );
        serves_every_client(
            h,
            dir.path(),
            &format!("http://{OURS}"),
            &format!("{OURS}:80"),
            len,
        );
    }
    // Answers written per request left from the client's buffers, in place; the
    // cached ones from buffers the client kept, as fragments of GSO frames.
    let c = up.counters();
    assert!(counter(&c, "tcp_zc_tx_in_place") > 0, "{}", up.logs());
    assert!(counter(&c, "tcp_zc_tx_kept") > 0, "{}", up.logs());
    assert!(counter(&c, "tcp_zc_tx_attached") > 0, "{}", up.logs());
    assert_eq!(counter(&c, "tcp_zc_bad_slots"), 0);
    up.down();
}

#[test]
fn socket_api_on_af_packet_and_af_xdp_answers_curl_and_wrk_from_a_namespace() {
    require_root!();
    need("curl", "curl");
    need("wrk", "wrk");
    const NS: &str = "usnthdns";
    const OUTER: &str = "usnthdo0";
    const OURS: &str = "10.58.0.2";
    let _veth = veth_netns(NS, OUTER, "usnthdi0", &["10.58.0.1/24"]);
    let dir = TempDir::new("httpd-afp");
    for (api, kind, len) in APIS.into_iter().flat_map(|a| {
        ["afpacket", "xdp"]
            .into_iter()
            .flat_map(move |k| LENGTHS.map(|l| (a, k, l)))
    }) {
        // Each server has a MAC of its own: the namespace must not keep the last one.
        ip(&["-n", NS, "neigh", "flush", "all"]);
        let mut h = Httpd::start(
            dir.path(),
            &format!("{api}-{kind}-{len}"),
            None,
            &[
                "--api",
                api,
                "--link",
                &format!("{kind}:{OUTER}"),
                "--addr",
                &format!("{OURS}/24"),
                "-l",
                &len.to_string(),
                "-p",
                "8080",
            ],
        );
        let base = format!("http://{OURS}:8080");
        wait_serving(&mut h, Some(NS), &base);
        check_curl(dir.path(), Some(NS), &base, len);
        let n = check_wrk(Some(NS), &format!("{base}/"));
        check_summary(&h.stop(), n);
    }
}

/// One shard's line in a sharded server's log: `(requests, handed out)`.
fn shard_line(log: &str, i: usize) -> (u64, u64) {
    let line = log
        .lines()
        .find(|l| l.starts_with(&format!("usnet httpd: shard {i}: ")))
        .unwrap_or_else(|| panic!("no line for shard {i} in the log:\n{log}"));
    let num = |what: &str| -> u64 {
        line.split([',', ';'])
            .find_map(|p| p.trim().strip_suffix(what))
            .and_then(|n| n.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {what} in {line}"))
    };
    (num(" requests"), num(" frames handed out"))
}

/// `usnet httpd --shards 2` on AF_PACKET (a fanout group steered by the shards'
/// program), on a multi-queue TAP and on AF_XDP over a two-queue veth: curl with
/// every byte checked and wrk with many connections; both shards serve. On
/// AF_PACKET and on the TAP no frame is handed between shards (the fanout program,
/// the TAP's steering program, steer each to its owner). On AF_XDP the veth's peer
/// picks the queue (its socket's hash), so the frames it puts on the other shard's
/// queue are handed over all along.
#[test]
fn two_shards_on_af_packet_af_xdp_and_a_multi_queue_tap_serve_curl_and_wrk() {
    require_root!();
    need("curl", "curl");
    need("wrk", "wrk");
    const NS: &str = "usnshdns";
    const OUTER: &str = "usnshdo0";
    const TAP: &str = "usnshd0";
    let _veth = veth_netns_queues(NS, OUTER, "usnshdi0", &["10.59.0.1/24"], 2);
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("httpd-shards");
    for (api, kind) in APIS
        .into_iter()
        .flat_map(|a| ["afpacket", "tap", "xdp"].map(|k| (a, k)))
    {
        let len = 4096;
        let (ns, ours, link, extra): (Option<&str>, &str, String, Vec<&str>) = match kind {
            "afpacket" | "xdp" => {
                ip(&["-n", NS, "neigh", "flush", "all"]);
                (Some(NS), "10.59.0.2", format!("{kind}:{OUTER}"), vec![])
            }
            _ => (
                None,
                "10.60.0.2",
                format!("tap:{TAP}"),
                vec!["--host-addr", "10.60.0.1/24"],
            ),
        };
        let addr = format!("{ours}/24");
        let mut args = vec![
            "--api", api, "--link", &link, "--addr", &addr, "-l", "4096", "-p", "8080", "--shards",
            "2",
        ];
        args.extend(extra);
        let mut h = Httpd::start(dir.path(), &format!("shards-{api}-{kind}"), None, &args);
        let base = format!("http://{ours}:8080");
        wait_serving(&mut h, ns, &base);
        check_curl(dir.path(), ns, &base, len);
        let o = cmd_in(
            ns,
            "wrk",
            &[
                "-t2",
                "-c64",
                "-d2s",
                "--timeout",
                "5s",
                &format!("{base}/"),
            ],
            Duration::from_secs(60),
        );
        assert!(
            o.ok() && !o.stdout.contains("Socket errors"),
            "wrk: {}",
            o.describe()
        );
        let log = h.stop();
        for i in 0..2 {
            let (requests, handed) = shard_line(&log, i);
            assert!(
                requests > 0,
                "{api} {kind}: shard {i} served nothing:\n{log}"
            );
            match kind {
                // The fanout program steers every TCP frame to its owner, and what
                // reached a socket before the group was whole (frames still arriving
                // for the previous server) is dropped when the shards open
                // (`AfPacketDevice::open_shards`); the TAP is down until its
                // steering program is attached.
                "afpacket" | "tap" => assert_eq!(handed, 0, "{api} {kind}: shard {i}:\n{log}"),
                _ => {}
            }
        }
        check_summary(&log, 1);
    }
}
