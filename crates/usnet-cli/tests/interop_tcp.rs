//! HTTP over usnet's TCP against Linux, through the built `usnet` binary: `curl` →
//! the usnet HTTP service and `usnet get` → nginx on a TAP (IPv4 and IPv6), 1 GiB
//! each way with SHA-256 compared, clean and with nftables dropping 1% of the TAP's
//! packets at random both ways, and the same HTTP exchanges over AF_PACKET and AF_XDP on
//! a veth whose other end sits in a network namespace (curl and python3's http.server
//! there; over AF_XDP also with 1% loss in the namespace).
//!
//! Needs root ("skipped: needs root" otherwise) and curl, nginx, nftables, python3,
//! iproute2; a missing tool fails naming its Debian package. Every test uses its own
//! interfaces, namespace, nftables table and directory, removed in `Drop`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------ HTTP helpers

use sha2::{Digest, Sha256};
use usnet_http::fill_pattern;

#[macro_use]
mod common;
use common::*;

/// Hex SHA-256 of the first `n` bytes of the `/bytes/N` pattern.
fn pattern_sha256(n: u64) -> String {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < n {
        let k = (n - off).min(buf.len() as u64) as usize;
        fill_pattern(&mut buf[..k], off);
        h.update(&buf[..k]);
        off += k as u64;
    }
    hex(&h.finalize())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes the first `n` bytes of the pattern to `path`.
fn write_pattern(path: &Path, n: u64) {
    let mut f = std::io::BufWriter::new(File::create(path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < n {
        let k = (n - off).min(buf.len() as u64) as usize;
        fill_pattern(&mut buf[..k], off);
        f.write_all(&buf[..k]).unwrap();
        off += k as u64;
    }
    f.flush().unwrap();
}

/// `curl URL | sha256sum` (`prefix` runs it elsewhere, e.g. in a namespace):
/// (hex digest, bytes, seconds).
fn curl_sha256(prefix: &[&str], url: &str, timeout: Duration) -> (String, u64, f64) {
    let t = Instant::now();
    let mut args: Vec<&str> = prefix.to_vec();
    // A refused first connection is retried (seen once over AF_XDP, the first fetch
    // after the stack came up; the cause is not found yet); a transfer cut short
    // still fails the digest, since a retry appends to the same output.
    args.extend([
        "curl",
        "-sS",
        "--fail",
        "-g",
        "--max-time",
        "170",
        "--retry",
        "3",
        "--retry-connrefused",
        "--retry-delay",
        "1",
        url,
    ]);
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    let mut so = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match so.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    h.update(&buf[..k]);
                    n += k as u64;
                }
            }
        }
        (hex(&h.finalize()), n)
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = reap(&mut child, Duration::from_secs(5));
            panic!("curl {url} timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // curl has exited, so its stdout is at EOF; the deadline only guards against a hang.
    let end = Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() {
        assert!(
            Instant::now() < end,
            "curl {url}: output still open after it exited"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (digest, n) = reader.join().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(status.success(), "curl {url}: {status}: {err}");
    (digest, n, t.elapsed().as_secs_f64())
}

/// Runs curl with `args`; returns stdout.
fn curl(prefix: &[&str], args: &[&str]) -> Out {
    let mut all: Vec<&str> = prefix.to_vec();
    all.extend(["curl", "-sS", "-g", "--max-time", "60"]);
    all.extend(args);
    run(all[0], &all[1..], Duration::from_secs(90))
}

/// GET and POST against the usnet HTTP service at `base` (e.g. `http://10.0.0.2:8080`).
fn http_service_checks(prefix: &[&str], base: &str, dir: &Path) {
    // GET /bytes/N, pattern hash compared.
    let n = (3 << 20) + 17;
    let (digest, got, _) = curl_sha256(
        prefix,
        &format!("{base}/bytes/{n}"),
        Duration::from_secs(60),
    );
    assert_eq!(got, n, "bytes from {base}/bytes/{n}");
    assert_eq!(digest, pattern_sha256(n), "sha256 of {base}/bytes/{n}");
    // POST a file (curl sends Expect: 100-continue above 1 MiB) and a chunked body.
    let file = dir.join("upload.bin");
    let body: Vec<u8> = (0..(2u32 << 20) + 5)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &body).unwrap();
    let want = hex(&Sha256::digest(&body));
    let at_file = format!("@{}", file.display());
    let o = curl(
        prefix,
        &[
            "--fail",
            "--data-binary",
            &at_file,
            &format!("{base}/upload"),
        ],
    );
    assert!(o.ok(), "POST to {base}: {}", o.describe());
    assert_eq!(
        o.stdout.trim(),
        want,
        "sha256 of the POSTed file from {base}"
    );
    let o = curl(
        prefix,
        &[
            "--fail",
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            &at_file,
            &format!("{base}/chunked"),
        ],
    );
    assert!(o.ok(), "chunked POST to {base}: {}", o.describe());
    assert_eq!(
        o.stdout.trim(),
        want,
        "sha256 of the chunked POST from {base}"
    );
    // Keep-alive: two requests on one connection; the index; a 404.
    let o = curl(
        prefix,
        &[
            "-v",
            "--fail",
            &format!("{base}/bytes/5"),
            &format!("{base}/"),
        ],
    );
    assert!(o.ok(), "keep-alive GETs from {base}: {}", o.describe());
    assert!(
        o.stderr.contains("Re-using existing connection") || o.stderr.contains("Reusing existing"),
        "curl did not reuse the connection: {}",
        o.describe()
    );
    assert!(o.stdout.contains("usnet HTTP service"), "{}", o.describe());
    let o = curl(
        prefix,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{base}/nope"),
        ],
    );
    assert_eq!(o.stdout.trim(), "404", "{}", o.describe());
    let o = curl(
        prefix,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "DELETE",
            &format!("{base}/"),
        ],
    );
    assert_eq!(o.stdout.trim(), "405", "{}", o.describe());
    // A request head over 8 KiB.
    let big = format!("X-Big: {}", "a".repeat(9000));
    let o = curl(
        prefix,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            &big,
            &format!("{base}/"),
        ],
    );
    assert_eq!(o.stdout.trim(), "431", "{}", o.describe());
}

/// `usnet get` (its own stack on `link`) → (stdout, seconds).
fn usnet_get(link_args: &[&str], url: &str, extra: &[&str], timeout: Duration) -> (Out, f64) {
    let t = Instant::now();
    let mut args = vec!["get"];
    args.extend(link_args);
    args.extend(extra);
    args.push(url);
    let o = run(USNET, &args, timeout);
    (o, t.elapsed().as_secs_f64())
}

/// A port nothing listens on now (TCP, IPv4 and IPv6).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("[::]:0").unwrap();
    l.local_addr().unwrap().port()
}

/// nginx serving `root` on every address at `port`, stopped in `Drop`.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Nginx {
    fn start(dir: &Path, root: &Path, port: u16) -> Nginx {
        need("nginx", "nginx");
        let conf = dir.join("nginx.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx.err warn;\n\
                 user root;\nevents {{ worker_connections 64; }}\n\
                 http {{\n access_log off;\n sendfile on;\n\
                 client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n\
                 uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n\
                 server {{ listen {port}; listen [::]:{port}; root {}; }}\n}}\n",
                root.display()
            ),
        )
        .unwrap();
        let child = Command::new("nginx")
            .args([
                "-p",
                &d.to_string(),
                "-c",
                conf.to_str().unwrap(),
                "-e",
                &format!("{d}/nginx.err"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(dir.join("nginx.stderr")).unwrap())
            .spawn()
            .expect("spawn nginx");
        let mut n = Nginx {
            child,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(s) = n.child.try_wait().unwrap() {
                panic!("nginx exited ({s}): {}", n.logs());
            }
            assert!(
                Instant::now() < deadline,
                "nginx not listening: {}",
                n.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        n
    }

    fn logs(&self) -> String {
        let r = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!("{}{}", r("nginx.stderr"), r("nginx.err"))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill on a child we spawned and have not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
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

/// An nftables table dropping `percent`% of the packets in and out of `ifaces` at
/// random (in network namespace `.1`, else the root one); deleted in `Drop`.
struct Loss(&'static str, Option<&'static str>);

/// `nft ARGS` in namespace `ns` (or the root one).
fn nft(ns: Option<&str>, args: &[&str]) -> Out {
    match ns {
        Some(ns) => {
            let mut all = vec!["netns", "exec", ns, "nft"];
            all.extend(args);
            let o = run("ip", &all, Duration::from_secs(10));
            assert!(o.ok(), "ip {}: {}", all.join(" "), o.describe());
            o
        }
        None => must("nft", args),
    }
}

impl Loss {
    fn start(table: &'static str, ifaces: &[&str], percent: u32) -> Loss {
        Loss::start_in(None, table, ifaces, percent)
    }

    fn start_in(
        ns: Option<&'static str>,
        table: &'static str,
        ifaces: &[&str],
        percent: u32,
    ) -> Loss {
        need("nft", "nftables");
        let _ = nft_quiet(ns, &["delete", "table", "inet", table]);
        let guard = Loss(table, ns);
        let set = format!(
            "{{ {} }}",
            ifaces
                .iter()
                .map(|i| format!("\"{i}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        nft(ns, &["add", "table", "inet", table]);
        for (chain, hook, dir) in [("in", "input", "iifname"), ("out", "output", "oifname")] {
            nft(
                ns,
                &[
                    "add",
                    "chain",
                    "inet",
                    table,
                    chain,
                    &format!("{{ type filter hook {hook} priority 0 ; }}"),
                ],
            );
            nft(
                ns,
                &[
                    "add",
                    "rule",
                    "inet",
                    table,
                    chain,
                    dir,
                    &set,
                    "numgen",
                    "random",
                    "mod",
                    "100",
                    "<",
                    &percent.to_string(),
                    "counter",
                    "drop",
                ],
            );
        }
        guard
    }

    /// Packets dropped so far.
    fn dropped(&self) -> u64 {
        let o = nft(self.1, &["list", "table", "inet", self.0]);
        o.stdout
            .split("packets ")
            .skip(1)
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

/// `nft ARGS` in namespace `ns` (or the root one), whatever the outcome.
fn nft_quiet(ns: Option<&str>, args: &[&str]) -> Out {
    let mut all = match ns {
        Some(ns) => vec!["netns", "exec", ns, "nft"],
        None => vec![],
    };
    all.extend(args);
    match ns {
        Some(_) => run("ip", &all, Duration::from_secs(10)),
        None => run("nft", &all, Duration::from_secs(10)),
    }
}

impl Drop for Loss {
    fn drop(&mut self) {
        let _ = nft_quiet(self.1, &["delete", "table", "inet", self.0]);
    }
}

fn http_tools() {
    for (tool, pkg) in [("ip", "iproute2"), ("curl", "curl"), ("nginx", "nginx")] {
        need(tool, pkg);
    }
}

// ------------------------------------------------------------------ TAP

#[test]
fn tap_curl_to_usnet_http_and_usnet_get_from_nginx() {
    require_root!();
    http_tools();
    let t0 = Instant::now();
    let (tap_srv, tap_get) = ("usnt5", "usnt6");
    remove_leftovers(&[tap_srv, tap_get], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", tap_srv]);
    cleanup.on_drop(&["ip", "link", "del", tap_get]);
    let dir = TempDir::new("http-tap");
    let mut d = Daemon::start(
        dir.path(),
        "it-http",
        &[
            "--link",
            &format!("tap:{tap_srv}"),
            "--addr",
            "10.35.0.2/24",
            "--addr",
            "fd35::2/64",
            "--host-addr",
            "10.35.0.1/24",
            "--host-addr",
            "fd35::1/64",
            "--services",
            "echo,http:8080",
        ],
    );
    http_service_checks(&[], "http://10.35.0.2:8080", dir.path());
    http_service_checks(&[], "http://[fd35::2]:8080", dir.path());

    // usnet get → nginx on the Linux side of another TAP.
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let n = (5 << 20) + 3;
    write_pattern(&www.join("file"), n);
    std::fs::write(www.join("small"), b"hello from nginx\n").unwrap();
    let port = free_port();
    let nginx = Nginx::start(dir.path(), &www, port);
    let link = [
        "--link",
        &format!("tap:{tap_get}"),
        "--addr",
        "10.36.0.2/24",
        "--addr",
        "fd36::2/64",
        "--host-addr",
        "10.36.0.1/24",
        "--host-addr",
        "fd36::1/64",
    ];
    let link: Vec<&str> = link.to_vec();
    for host in ["10.36.0.1", "[fd36::1]"] {
        let url = format!("http://{host}:{port}/file");
        let (o, _) = usnet_get(&link, &url, &["--sha256"], Duration::from_secs(60));
        assert!(
            o.ok(),
            "usnet get {url}: {}\n{}",
            o.describe(),
            nginx.logs()
        );
        assert_eq!(o.stdout.trim(), pattern_sha256(n), "usnet get {url}");
        // -o FILE and the summary line.
        let out = dir.path().join("small.out");
        let url = format!("http://{host}:{port}/small");
        let (o, _) = usnet_get(
            &link,
            &url,
            &["-o", out.to_str().unwrap()],
            Duration::from_secs(60),
        );
        assert!(o.ok(), "usnet get {url}: {}", o.describe());
        assert!(
            o.stdout.contains("HTTP 200") && o.stdout.contains("17 bytes"),
            "{}",
            o.describe()
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"hello from nginx\n");
        // An HTTP error is a non-zero exit.
        let url = format!("http://{host}:{port}/missing");
        let (o, _) = usnet_get(&link, &url, &[], Duration::from_secs(60));
        assert!(
            !o.ok() && o.stderr.contains("404"),
            "usnet get {url}: {}",
            o.describe()
        );
    }
    // A client process of the stack server (`usnet get --stack`) → nginx on the Linux
    // side of the server's TAP: the bytes cross the TAP, then the server's rings.
    for host in ["10.35.0.1", "[fd35::1]"] {
        let url = format!("http://{host}:{port}/file");
        let o = run_in(
            Command::new(USNET)
                .args(["get", "--stack", "it-http", "--sha256", &url])
                .env("USNET_RUN_DIR", dir.path()),
            &[],
            Duration::from_secs(60),
        );
        assert!(
            o.ok(),
            "usnet get --stack {url}: {}\n{}",
            o.describe(),
            nginx.logs()
        );
        assert_eq!(
            o.stdout.trim(),
            pattern_sha256(n),
            "usnet get --stack {url}"
        );
    }
    drop(nginx);
    let c = d.counters();
    assert_eq!(counter(&c, "drop_pool_exhausted"), 0, "{c:?}");
    d.down();
    eprintln!(
        "tap_curl_to_usnet_http_and_usnet_get_from_nginx took {:?}",
        t0.elapsed()
    );
}

/// 1 GiB from usnet to curl and 1 GiB from nginx to `usnet get`, SHA-256 checked:
/// once clean, once with 1% of the packets dropped at random each way.
#[test]
fn tap_one_gib_each_way_clean_and_with_one_percent_loss() {
    require_root!();
    http_tools();
    need("nft", "nftables");
    let t0 = Instant::now();
    let size: u64 = std::env::var("USNET_BIG_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 30);
    let (tap_srv, tap_get) = ("usnt7", "usnt8");
    remove_leftovers(&[tap_srv, tap_get], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", tap_srv]);
    cleanup.on_drop(&["ip", "link", "del", tap_get]);
    let dir = TempDir::new("http-big");
    let mut d = Daemon::start(
        dir.path(),
        "it-big",
        &[
            "--link",
            &format!("tap:{tap_srv}"),
            "--addr",
            "10.37.0.2/24",
            "--addr",
            "fd37::2/64",
            "--host-addr",
            "10.37.0.1/24",
            "--host-addr",
            "fd37::1/64",
            "--services",
            "http",
        ],
    );
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    write_pattern(&www.join("big"), size);
    let want = pattern_sha256(size);
    let port = free_port();
    let nginx = Nginx::start(dir.path(), &www, port);
    let link = [
        "--link",
        &format!("tap:{tap_get}"),
        "--addr",
        "10.38.0.2/24",
        "--addr",
        "fd38::2/64",
        "--host-addr",
        "10.38.0.1/24",
        "--host-addr",
        "fd38::1/64",
    ];
    let link: Vec<&str> = link.to_vec();
    let mut report = Vec::new();
    for lossy in [false, true] {
        let loss = lossy.then(|| Loss::start("usnettest", &[tap_srv, tap_get], 1));
        let tag = if lossy { "1% loss" } else { "clean" };
        // usnet → Linux (IPv4 clean, IPv6 with loss).
        let url = if lossy {
            format!("http://[fd37::2]/bytes/{size}")
        } else {
            format!("http://10.37.0.2/bytes/{size}")
        };
        let (digest, got, secs) = curl_sha256(&[], &url, Duration::from_secs(180));
        assert_eq!(
            (got, digest.as_str()),
            (size, want.as_str()),
            "curl {url} ({tag})"
        );
        report.push(format!(
            "usnet→curl {tag} {url}: {:.1} MB/s",
            size as f64 / secs / 1e6
        ));
        // Linux → usnet.
        let host = if lossy { "[fd38::1]" } else { "10.38.0.1" };
        let url = format!("http://{host}:{port}/big");
        let (o, secs) = usnet_get(&link, &url, &["--sha256"], Duration::from_secs(180));
        assert!(
            o.ok(),
            "usnet get {url} ({tag}): {}\n{}",
            o.describe(),
            nginx.logs()
        );
        assert_eq!(o.stdout.trim(), want, "usnet get {url} ({tag})");
        report.push(format!(
            "nginx→usnet get {tag} {url}: {:.1} MB/s",
            size as f64 / secs / 1e6
        ));
        if let Some(l) = &loss {
            let dropped = l.dropped();
            assert!(dropped > 100, "nftables dropped only {dropped} packets");
            report.push(format!("nftables dropped {dropped} packets"));
        }
    }
    let c = d.counters();
    let (segs, frames) = (
        counter(&c, "tcp_tx_segments"),
        counter(&c, "link_tx_frames"),
    );
    report.push(format!(
        "server: {segs} segments out in {frames} frames, {} retransmitted",
        counter(&c, "tcp_retransmit_segments")
    ));
    // TSO is the TAP default: segments leave joined in GSO frames (buffer chains).
    assert!(
        segs > 4 * frames,
        "{segs} segments in {frames} frames: TSO not used"
    );
    drop(nginx);
    d.down();
    for r in &report {
        eprintln!("{r}");
    }
    eprintln!(
        "tap_one_gib_each_way_clean_and_with_one_percent_loss ({size} bytes) took {:?}",
        t0.elapsed()
    );
}

/// `usnet up --no-tso`: every frame MTU-sized both ways (the other TAP tests run with
/// TSO, the default, in 2 KiB buffer chains). Every byte is checked both ways, clean and
/// with 1% of the TAP's packets dropped by nftables.
#[test]
fn tap_without_tso_checks_every_byte_both_ways() {
    require_root!();
    http_tools();
    need("nft", "nftables");
    let tap = "usnt10";
    remove_leftovers(&[tap], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", tap]);
    let dir = TempDir::new("http-notso");
    let mut d = Daemon::start(
        dir.path(),
        "it-notso",
        &[
            "--link",
            &format!("tap:{tap}"),
            "--addr",
            "10.40.0.2/24",
            "--host-addr",
            "10.40.0.1/24",
            "--services",
            "http",
            "--no-tso",
        ],
    );
    let size: u64 = 128 << 20;
    let want = pattern_sha256(size);
    let upload = dir.path().join("upload");
    write_pattern(&upload, 64 << 20);
    let upload_sha = pattern_sha256(64 << 20);
    for lossy in [false, true] {
        let _loss = lossy.then(|| Loss::start("usnetnotso", &[tap], 1));
        let url = format!("http://10.40.0.2/bytes/{size}");
        let (digest, got, secs) = curl_sha256(&[], &url, Duration::from_secs(120));
        assert_eq!(
            (got, digest.as_str()),
            (size, want.as_str()),
            "GET lossy={lossy}"
        );
        eprintln!(
            "no-tso usnet→curl lossy={lossy}: {:.0} MB/s",
            size as f64 / secs / 1e6
        );
        let o = curl(
            &[],
            &[
                "--fail",
                "--data-binary",
                &format!("@{}", upload.display()),
                "http://10.40.0.2/upload",
            ],
        );
        assert!(
            o.ok(),
            "POST lossy={lossy}: {}\n{}\n{}",
            o.describe(),
            d.stat_text(),
            d.logs()
        );
        assert_eq!(o.stdout.trim(), upload_sha, "POST lossy={lossy}");
    }
    let c = d.counters();
    assert!(counter(&c, "tcp_tx_segments") > 0);
    d.down();
}

// ------------------------------------------------------------------ AF_PACKET

#[test]
fn af_packet_http_with_a_namespace() {
    require_root!();
    http_tools();
    need("python3", "python3");
    let t0 = Instant::now();
    let (ns, outer, inner) = ("usnetns-h", "usnv5", "usnv6");
    let _cleanup = veth_netns(ns, outer, inner, &["10.39.0.1/24", "fd39::1/64"]);

    let dir = TempDir::new("http-afp");
    let nsx = ["ip", "netns", "exec", ns];
    {
        let mut d = Daemon::start(
            dir.path(),
            "it-http-afp",
            &[
                "--link",
                &format!("afpacket:{outer}"),
                "--addr",
                "10.39.0.2/24",
                "--addr",
                "fd39::2/64",
                "--services",
                "http",
            ],
        );
        http_service_checks(&nsx, "http://10.39.0.2", dir.path());
        http_service_checks(&nsx, "http://[fd39::2]", dir.path());
        // The transmit socket's vnet header lets TCP leave in GSO frames.
        let c = d.counters();
        let (segs, frames) = (
            counter(&c, "tcp_tx_segments"),
            counter(&c, "link_tx_frames"),
        );
        assert!(
            segs > 2 * frames,
            "{segs} segments in {frames} frames: no GSO over AF_PACKET"
        );
        d.down();
    }

    // usnet get → python3 -m http.server in the namespace.
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let n = (4 << 20) + 1;
    write_pattern(&www.join("file"), n);
    let py = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .find(|p| p.is_file())
        })
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = reap(&mut self.0, Duration::from_secs(5));
        }
    }
    let server = Kill(
        Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&py)
            .args([
                "-m",
                "http.server",
                "8000",
                "--bind",
                "::",
                "--directory",
                www.to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3 -m http.server"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let o = curl(
            &nsx,
            &["-o", "/dev/null", "--fail", "http://127.0.0.1:8000/file"],
        );
        if o.ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "http.server not up: {}",
            o.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let link = [
        "--link",
        &format!("afpacket:{outer}"),
        "--addr",
        "10.39.0.2/24",
        "--addr",
        "fd39::2/64",
    ];
    let link: Vec<&str> = link.to_vec();
    for host in ["10.39.0.1", "[fd39::1]"] {
        let url = format!("http://{host}:8000/file");
        let (o, _) = usnet_get(&link, &url, &["--sha256"], Duration::from_secs(60));
        assert!(o.ok(), "usnet get {url}: {}", o.describe());
        assert_eq!(o.stdout.trim(), pattern_sha256(n), "usnet get {url}");
    }
    drop(server);
    eprintln!("af_packet_http_with_a_namespace took {:?}", t0.elapsed());
}

// ------------------------------------------------------------------ AF_XDP

/// TCP both ways over `--link xdp:` on a veth whose other end sits in a namespace:
/// curl there GETs from and POSTs to the usnet HTTP service, then `usnet get` fetches
/// from python3's http.server there; every byte is checked (SHA-256), clean and with
/// nftables dropping 1% of the namespace end's packets both ways. The host's own
/// address on the same veth end answers meanwhile (the steering program passes it).
#[test]
fn xdp_tcp_both_ways_every_byte_clean_and_with_one_percent_loss() {
    require_root!();
    http_tools();
    need("python3", "python3");
    need("ping", "iputils-ping");
    need("nft", "nftables");
    let t0 = Instant::now();
    let (ns, outer, inner) = ("usnetns-xt", "usnx5", "usnx6");
    let _cleanup = veth_netns(ns, outer, inner, &["10.36.0.1/24", "fd36::1/64"]);
    ip(&["addr", "add", "10.36.0.3/24", "dev", outer]);
    let nsx = ["ip", "netns", "exec", ns];
    // Five echoes, one answer enough: nftables may be dropping 1% of the packets
    // (ping exits 0 when any reply came).
    let host_ping = || {
        let o = run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "ping",
                "-c",
                "5",
                "-i",
                "0.2",
                "-W",
                "2",
                "10.36.0.3",
            ],
            Duration::from_secs(10),
        );
        assert!(
            o.ok(),
            "the host's own address on {outer}: {}",
            o.describe()
        );
    };

    let dir = TempDir::new("http-xdp");
    let upload = dir.path().join("upload");
    let up_size: u64 = (8 << 20) + 5;
    write_pattern(&upload, up_size);
    let upload_sha = pattern_sha256(up_size);
    let size: u64 = (16 << 20) + 3;
    let want = pattern_sha256(size);
    {
        let mut d = Daemon::start(
            dir.path(),
            "it-http-xdp",
            &[
                "--link",
                &format!("xdp:{outer}"),
                "--addr",
                "10.36.0.2/24",
                "--addr",
                "fd36::2/64",
                "--services",
                "http",
            ],
        );
        for lossy in [false, true] {
            let loss = lossy.then(|| Loss::start_in(Some(ns), "usnetxdp", &[inner], 1));
            for host in ["10.36.0.2", "[fd36::2]"] {
                let url = format!("http://{host}/bytes/{size}");
                let (digest, got, secs) = curl_sha256(&nsx, &url, Duration::from_secs(120));
                assert_eq!(
                    (got, digest.as_str()),
                    (size, want.as_str()),
                    "GET {url} lossy={lossy}\n{}",
                    d.logs()
                );
                eprintln!(
                    "xdp usnet→curl {host} lossy={lossy}: {:.0} MB/s",
                    size as f64 / secs / 1e6
                );
                let o = curl(
                    &nsx,
                    &[
                        "--fail",
                        "--data-binary",
                        &format!("@{}", upload.display()),
                        &format!("http://{host}/upload"),
                    ],
                );
                assert!(o.ok(), "POST {host} lossy={lossy}: {}", o.describe());
                assert_eq!(o.stdout.trim(), upload_sha, "POST {host} lossy={lossy}");
            }
            host_ping();
            if let Some(l) = &loss {
                let dropped = l.dropped();
                assert!(dropped > 20, "nftables dropped only {dropped} packets");
            }
        }
        let c = d.counters();
        assert_eq!(counter(&c, "tcp_rx_bad_checksum"), 0, "{c:?}");
        assert!(
            counter(&c, "tcp_retransmit_segments") > 0,
            "loss never seen: {c:?}"
        );
        d.down();
    }

    // usnet get → python3 -m http.server in the namespace (usnet receives).
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let n = (4 << 20) + 1;
    write_pattern(&www.join("file"), n);
    let py = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .find(|p| p.is_file())
        })
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = reap(&mut self.0, Duration::from_secs(5));
        }
    }
    let _server = Kill(
        Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&py)
            .args([
                "-m",
                "http.server",
                "8000",
                "--bind",
                "::",
                "--directory",
                www.to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn python3 -m http.server"),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let o = curl(
            &nsx,
            &["-o", "/dev/null", "--fail", "http://127.0.0.1:8000/file"],
        );
        if o.ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "http.server not up: {}",
            o.describe()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let link = format!("xdp:{outer}");
    let link = [
        "--link",
        &link,
        "--addr",
        "10.36.0.2/24",
        "--addr",
        "fd36::2/64",
    ];
    for lossy in [false, true] {
        let _loss = lossy.then(|| Loss::start_in(Some(ns), "usnetxdpget", &[inner], 1));
        for host in ["10.36.0.1", "[fd36::1]"] {
            let url = format!("http://{host}:8000/file");
            let (o, _) = usnet_get(&link, &url, &["--sha256"], Duration::from_secs(60));
            assert!(o.ok(), "usnet get {url} lossy={lossy}: {}", o.describe());
            assert_eq!(o.stdout.trim(), pattern_sha256(n), "usnet get {url}");
        }
    }
    host_ping();
    eprintln!(
        "xdp_tcp_both_ways_every_byte_clean_and_with_one_percent_loss took {:?}",
        t0.elapsed()
    );
}
