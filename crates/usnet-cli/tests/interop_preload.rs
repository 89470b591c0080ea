//! Unmodified programs on a usnet stack server through `usnet run` (the LD_PRELOAD
//! shim), against the Linux stack on the other side of a TAP (root only): curl under
//! the shim fetching from a Linux HTTP server, and Python's http.server and nginx
//! (epoll, sendfile, keep-alive) under the shim serving curl on Linux; then nginx with
//! a master and two workers (fork after listen: the workers share the listener through
//! the server) serving curl and wrk on Linux. Every payload is checked. The same
//! programs run again on a stack server whose connections keep their queues in
//! pool buffers (`usnet up --pool-buffers`).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const TAP: &str = "usntpl0";
const OURS: &str = "10.47.0.2";
const HOST: &str = "10.47.0.1";
const STACK: &str = "it-preload";

/// `curl -s URL... -o OUT...` (under the shim or not); returns the files written.
fn curl(dir: &Path, shim: bool, urls: &[String], tag: &str) -> Vec<PathBuf> {
    let outs: Vec<PathBuf> = (0..urls.len())
        .map(|i| dir.join(format!("{tag}.{i}")))
        .collect();
    let mut args: Vec<String> = vec![
        "-sS".into(),
        "--fail".into(),
        "--max-time".into(),
        "30".into(),
    ];
    for (u, o) in urls.iter().zip(&outs) {
        args.push(u.clone());
        args.push("-o".into());
        args.push(o.display().to_string());
    }
    let mut c = if shim {
        let mut c = Command::new(USNET);
        c.args(["run", "--stack", STACK, "--", "curl"]);
        c
    } else {
        Command::new("curl")
    };
    let o = run_in(
        c.args(&args).env("USNET_RUN_DIR", dir),
        &[],
        Duration::from_secs(60),
    );
    assert!(o.ok(), "curl {urls:?} (shim {shim}): {}", o.describe());
    outs
}

/// nginx with 2 and then 4 workers under the shim on a stack server of two shards
/// (`usnet up --shards 2` on a multi-queue TAP): the workers are spread over the
/// shards (each holds the listener's copy on its own), both shards carry
/// connections, every worker serves, every payload is checked; curl under the shim
/// connects out from whichever shard it lands on.
#[test]
fn nginx_workers_spread_over_a_sharded_stack_server() {
    require_root!();
    need("curl", "curl");
    need("nginx", "nginx");
    need("wrk", "wrk");
    const TAP2: &str = "usntpl1";
    const OURS2: &str = "10.48.0.2";
    const HOST2: &str = "10.48.0.1";
    const STACK2: &str = "it-preload-sh";
    remove_leftovers(&[TAP2], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP2]);
    let dir = TempDir::new("preload-shards");
    let d = dir.path();
    let link = format!("tap:{TAP2}");
    let (ours, host) = (format!("{OURS2}/24"), format!("{HOST2}/24"));
    let mut stack = Daemon::start(
        d,
        STACK2,
        &[
            "--link",
            &link,
            "--addr",
            &ours,
            "--host-addr",
            &host,
            "--shards",
            "2",
        ],
    );
    let www = d.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let file = www.join("file");
    let body: Vec<u8> = (0..1_000_003u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    std::fs::write(&file, &body).unwrap();
    std::fs::write(www.join("small"), b"hello, shards\n").unwrap();
    for workers in [2, 4] {
        let pids = nginx_with_workers(d, &www, &file, STACK2, OURS2, workers);
        assert_eq!(pids.len(), workers);
    }
    // The built-in echo service is one client, on one shard: connections the TAP
    // queues on the other reach it through a port redirect. Each echoes its bytes.
    for i in 0..24u32 {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect_timeout(
            &format!("{OURS2}:7").parse().unwrap(),
            Duration::from_secs(5),
        )
        .expect("connect to the echo service");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let msg: Vec<u8> = (0..1000u32).map(|k| (k * 7 + i) as u8).collect();
        c.write_all(&msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        c.read_exact(&mut back).expect("echo");
        assert_eq!(back, msg, "echo {i}");
    }
    let st = stack.stat();
    assert!(
        counter(&st.counters, "shard_redirected") > 0,
        "no frame went to the echo service's shard by a redirect: {:?}",
        st.shards
    );
    // The workers' shards, while the last nginx ran, are in the clients' rows of the
    // stat taken below only if still attached: check the shards' own counters.
    let shards = st.shards.clone();
    assert_eq!(shards.len(), 2, "{st:?}");
    for sh in &shards {
        assert!(sh.rx_frames > 100, "a shard idle: {shards:?}");
        assert!(sh.tx_frames > 100, "a shard idle: {shards:?}");
    }

    // curl under the shim, out from the sharded stack to Linux, several times (its
    // session lands on one shard or the other).
    let mut linux = spawn_prog(
        d,
        None,
        "linux-http-sh",
        "python3",
        &[
            "-m",
            "http.server",
            "18810",
            "--bind",
            HOST2,
            "--directory",
            www.to_str().unwrap(),
        ],
    );
    wait_listening(&mut linux, d, HOST2, 18810);
    for i in 0..4 {
        let out = d.join(format!("sh-curl.{i}"));
        let o = run_in(
            Command::new(USNET)
                .args([
                    "run",
                    "--stack",
                    STACK2,
                    "--",
                    "curl",
                    "-sS",
                    "--fail",
                    "--max-time",
                    "30",
                ])
                .arg(format!("http://{HOST2}:18810/file"))
                .arg("-o")
                .arg(&out)
                .env("USNET_RUN_DIR", d),
            &[],
            Duration::from_secs(60),
        );
        assert!(o.ok(), "curl under the shim: {}", o.describe());
        same_file(&out, &file);
    }
    drop(linux);
    let c = stack.counters();
    assert_eq!(counter(&c, "drop_pool_exhausted"), 0, "{c:?}");
    stack.down();
}

/// curl under the shim of `stack`, fetching `url` into `out`; whether it worked.
fn shim_curl(d: &Path, stack: &str, url: &str, out: &Path) -> Out {
    run_in(
        Command::new(USNET)
            .args(["run", "--stack", stack, "--", "curl", "-sS", "--fail"])
            .args(["--max-time", "20", url, "-o"])
            .arg(out)
            .env("USNET_RUN_DIR", d),
        &[],
        Duration::from_secs(40),
    )
}

/// `usnet up --shards 2` on a shm link (no root needed), with an unsharded stack on
/// the other side: the sender steers each frame into the ring of the shard that owns
/// it. curl under the shim on each of the sharded stack's shards fetches from Python
/// on the other stack, and curl on the other stack fetches from Python on the sharded
/// one (a single process, so one shard: the other redirects its connections to it).
/// Every body is checked; both shards carry frames; none is handed between shards
/// (every-shard frames, such as an ARP reply, are copied, and counted apart).
#[test]
fn a_sharded_stack_server_over_shm_gets_its_frames_steered_by_the_sender() {
    need("curl", "curl");
    need("python3", "python3");
    let dir = TempDir::new("preload-shm-shards");
    let d = dir.path();
    let link = format!("shm:usnet-shsh-{}", std::process::id());
    let (a_addr, b_addr) = ("10.49.0.1", "10.49.0.2");
    let mut a = Daemon::start(
        d,
        "it-shm-sharded",
        &["--link", &link, "--addr", "10.49.0.1/24", "--shards", "2"],
    );
    let mut b = Daemon::start(
        d,
        "it-shm-single",
        &["--link", &link, "--addr", "10.49.0.2/24"],
    );
    let www = d.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let file = www.join("file");
    let body: Vec<u8> = (0..300_007u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &body).unwrap();
    let www_s = www.to_str().unwrap().to_string();
    for (server, client, addr, port) in [
        ("it-shm-single", "it-shm-sharded", b_addr, "18830"),
        ("it-shm-sharded", "it-shm-single", a_addr, "18831"),
    ] {
        let mut py = spawn_prog(
            d,
            Some(server),
            if port == "18830" {
                "py-single"
            } else {
                "py-sharded"
            },
            "python3",
            &[
                "-m",
                "http.server",
                port,
                "--bind",
                addr,
                "--directory",
                &www_s,
            ],
        );
        let url = format!("http://{addr}:{port}/file");
        let end = Instant::now() + Duration::from_secs(20);
        let first = d.join("first");
        while !shim_curl(d, client, &url, &first).ok() {
            if let Some(s) = py.0.try_wait().unwrap() {
                panic!("python exited ({s}): {}", log_of(d, py.1));
            }
            assert!(
                Instant::now() < end,
                "python never served: {}",
                log_of(d, py.1)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Each `usnet run` is a new client: they alternate between the shards.
        for i in 0..6 {
            let out = d.join(format!("shm-{port}.{i}"));
            let o = shim_curl(d, client, &url, &out);
            assert!(o.ok(), "curl {i} from {client}: {}", o.describe());
            same_file(&out, &file);
        }
        drop(py);
    }
    let st = a.stat();
    let shards = st.shards.clone();
    assert_eq!(shards.len(), 2, "{st:?}");
    for sh in &shards {
        assert!(
            // A downloading shard sends an ACK for several segments: fewer frames out.
            sh.rx_frames > 100 && sh.tx_frames > 20,
            "a shard idle: {shards:?}"
        );
    }
    let handed: u64 = shards.iter().map(|s| s.handoff_out).sum();
    assert_eq!(handed, 0, "frames handed between shards: {shards:?}");
    assert!(
        counter(&st.counters, "shard_redirected") > 0,
        "Python's port on one shard: the other shard's connections reach it by a redirect: {shards:?}"
    );
    b.down();
    assert!(
        shm_link_path(&link).exists(),
        "removed while a stack holds it"
    );
    a.down();
    assert_shm_link_removed(&link);
}

fn same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(
        x == y,
        "{} ({} bytes) differs from {} ({} bytes)",
        a.display(),
        x.len(),
        b.display(),
        y.len()
    );
}

#[test]
fn curl_python_and_nginx_unmodified_on_the_stack_server() {
    require_root!();
    need("curl", "curl");
    need("nginx", "nginx");
    need("python3", "python3");
    need("wrk", "wrk");
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    for pool_buffers in [false, true] {
        let dir = TempDir::new("preload");
        let mut stack = programs_on_the_stack_server(dir.path(), pool_buffers);
        let c = stack.counters();
        let zc = counter(&c, "tcp_zc_tx_attached") + counter(&c, "tcp_zc_tx_in_place");
        let lent = counter(&c, "tcp_tx_lent");
        if pool_buffers {
            // Segments left from the pool buffers the bytes were copied into.
            assert!(zc > 0, "{c:?}");
            assert_eq!(lent, 0, "{c:?}");
        } else {
            assert_eq!(zc, 0, "{c:?}");
            // The programs' bytes rode the TAP's GSO frames from their send rings,
            // and every file above arrived whole.
            assert!(lent > 0, "{c:?}");
        }
        assert_eq!(counter(&c, "drop_pool_exhausted"), 0, "{c:?}");
        stack.down();
    }
}

/// The programs above on a fresh stack server in `d` (with `--pool-buffers` if
/// asked), which it returns for its counters.
fn programs_on_the_stack_server(d: &Path, pool_buffers: bool) -> Daemon {
    let mut args = vec![
        "--link".to_string(),
        format!("tap:{TAP}"),
        "--addr".into(),
        format!("{OURS}/24"),
        "--host-addr".into(),
        format!("{HOST}/24"),
    ];
    if pool_buffers {
        args.push("--pool-buffers".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stack = Daemon::start(d, STACK, &args);
    let www = d.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let file = www.join("file");
    let body: Vec<u8> = (0..3_000_017u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &body).unwrap();
    std::fs::write(www.join("small"), b"hello through the shim\n").unwrap();

    // 1. curl under the shim → Python's http.server on Linux (keep-alive: two URLs).
    let (p1, p2, p3) = (18801u16, 18802u16, 18803u16);
    let mut linux = spawn_prog(
        d,
        None,
        "linux-http",
        "python3",
        &[
            "-m",
            "http.server",
            &p1.to_string(),
            "--bind",
            HOST,
            "--directory",
            www.to_str().unwrap(),
        ],
    );
    wait_listening(&mut linux, d, HOST, p1);
    let urls = [
        format!("http://{HOST}:{p1}/file"),
        format!("http://{HOST}:{p1}/small"),
    ];
    let got = curl(d, true, &urls, "c1");
    same_file(&got[0], &file);
    same_file(&got[1], &www.join("small"));
    assert!(
        log_of(d, "linux-http").contains(&format!("{OURS} - - ")),
        "the requests did not come from the stack's address: {}",
        log_of(d, "linux-http")
    );
    drop(linux);

    // 2. Python's http.server under the shim, curl on Linux.
    let mut py = spawn_prog(
        d,
        Some(STACK),
        "shim-python",
        "python3",
        &[
            "-m",
            "http.server",
            &p2.to_string(),
            "--bind",
            OURS,
            "--directory",
            www.to_str().unwrap(),
        ],
    );
    wait_listening(&mut py, d, OURS, p2);
    for i in 0..3 {
        let got = curl(
            d,
            false,
            &[format!("http://{OURS}:{p2}/file")],
            &format!("c2-{i}"),
        );
        same_file(&got[0], &file);
    }
    drop(py);

    // 3. nginx under the shim: epoll, sendfile, keep-alive; one process.
    let conf = d.join("nginx.conf");
    let dd = d.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {dd}/nginx.pid;\n\
             error_log {dd}/nginx.err info;\nuser root;\nevents {{ worker_connections 64; use epoll; }}\n\
             http {{\n access_log off;\n sendfile on;\n keepalive_requests 1000;\n\
             client_body_temp_path {dd}/cb; proxy_temp_path {dd}/px; fastcgi_temp_path {dd}/fc;\n\
             uwsgi_temp_path {dd}/uw; scgi_temp_path {dd}/sc;\n\
             server {{ listen {OURS}:{p3}; root {}; }}\n}}\n",
            www.display()
        ),
    )
    .unwrap();
    let mut ng = spawn_prog(
        d,
        Some(STACK),
        "shim-nginx",
        "nginx",
        &[
            "-p",
            &dd.to_string(),
            "-c",
            conf.to_str().unwrap(),
            "-e",
            &format!("{dd}/nginx.err"),
        ],
    );
    wait_listening(&mut ng, d, OURS, p3);
    for i in 0..3 {
        let urls = [
            format!("http://{OURS}:{p3}/file"),
            format!("http://{OURS}:{p3}/small"),
            format!("http://{OURS}:{p3}/file"),
        ];
        let got = curl(d, false, &urls, &format!("c3-{i}"));
        same_file(&got[0], &file);
        same_file(&got[1], &www.join("small"));
        same_file(&got[2], &file);
    }
    let err = std::fs::read_to_string(d.join("nginx.err")).unwrap_or_default();
    assert!(
        !err.contains("[alert]") && !err.contains("[crit]"),
        "nginx complained:\n{err}"
    );
    drop(ng);

    // 4. nginx with a master and two workers: the master listens, then forks; both
    //    workers accept from the one listener (each wakes for every connection, as
    //    without EPOLLEXCLUSIVE on the kernel).
    nginx_with_workers(d, &www, &file, STACK, OURS, 2);
    stack
}

/// nginx with a master and `workers` workers on stack `stack` (at `ours`), serving
/// curl and wrk from Linux; every worker must serve. Returns the workers' pids.
fn nginx_with_workers(
    d: &Path,
    www: &Path,
    file: &Path,
    stack: &str,
    ours: &str,
    workers: usize,
) -> Vec<String> {
    let p4 = 18804u16;
    let dd = d.display();
    let _ = std::fs::remove_file(d.join("access2.log"));
    let conf = d.join("nginx2.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {dd}/nginx2.pid;\n\
             error_log {dd}/nginx2.err info;\nuser root;\nevents {{ worker_connections 256; use epoll; }}\n\
             http {{\n log_format w '$pid $status $body_bytes_sent';\n access_log {dd}/access2.log w;\n\
             sendfile on;\n keepalive_requests 1000;\n\
             client_body_temp_path {dd}/cb; proxy_temp_path {dd}/px; fastcgi_temp_path {dd}/fc;\n\
             uwsgi_temp_path {dd}/uw; scgi_temp_path {dd}/sc;\n\
             server {{ listen {ours}:{p4}; root {}; }}\n}}\n",
            www.display()
        ),
    )
    .unwrap();
    let mut ng = spawn_prog(
        d,
        Some(stack),
        "shim-nginx2",
        "nginx",
        &[
            "-p",
            &dd.to_string(),
            "-c",
            conf.to_str().unwrap(),
            "-e",
            &format!("{dd}/nginx2.err"),
        ],
    );
    // The workers are the master's children: stop them through the master (SIGQUIT,
    // a graceful stop) and make sure none outlives the test.
    struct Workers(u32);
    impl Drop for Workers {
        fn drop(&mut self) {
            // The master's children, found before it is told to stop.
            let kids: Vec<i32> = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                    let rest = &stat[stat.rfind(')')? + 2..];
                    let ppid: u32 = rest.split(' ').nth(1)?.parse().ok()?;
                    (ppid == self.0).then(|| e.file_name().to_str()?.parse().ok())?
                })
                .collect();
            // SAFETY: a signal to the nginx master we started.
            unsafe { libc::kill(self.0 as i32, libc::SIGQUIT) };
            let end = Instant::now() + Duration::from_secs(10);
            for pid in kids {
                // SAFETY: signal 0 only asks whether the worker still exists.
                while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(20));
                }
                // SAFETY: a worker of the nginx we started, still there after the
                // master's graceful stop (or already gone: then ESRCH).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let workers_guard = Workers(ng.0.id());
    wait_listening(&mut ng, d, ours, p4);
    // Many requests, new connections and keep-alive, every payload checked.
    for i in 0..4 {
        let urls = [
            format!("http://{ours}:{p4}/file"),
            format!("http://{ours}:{p4}/small"),
            format!("http://{ours}:{p4}/file"),
        ];
        let got = curl(d, false, &urls, &format!("c4-{i}"));
        same_file(&got[0], file);
        same_file(&got[1], &www.join("small"));
        same_file(&got[2], file);
    }
    let w = run_in(
        Command::new("wrk").args([
            "-t2",
            "-c16",
            "-d3s",
            "--timeout",
            "5s",
            &format!("http://{ours}:{p4}/small"),
        ]),
        &[],
        Duration::from_secs(30),
    );
    assert!(w.ok(), "wrk: {}", w.describe());
    assert!(
        !w.stdout.contains("Socket errors") && !w.stdout.contains("Non-2xx"),
        "wrk saw errors: {}",
        w.stdout
    );
    let requests: u64 = w
        .stdout
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(requests >= 100, "wrk: too few requests: {}", w.stdout);
    // After the load, plain requests are still answered (nothing hangs).
    for i in 0..8 {
        let got = curl(
            d,
            false,
            &[format!("http://{ours}:{p4}/small")],
            &format!("c5-{i}"),
        );
        same_file(&got[0], &www.join("small"));
    }
    let log = std::fs::read_to_string(d.join("access2.log")).unwrap_or_default();
    let mut pids: Vec<&str> = log.lines().filter_map(|l| l.split(' ').next()).collect();
    pids.sort();
    pids.dedup();
    assert_eq!(
        pids.len(),
        workers,
        "every worker should have served requests: {pids:?} (wrk: {})",
        w.stdout
    );
    assert!(
        log.lines().all(|l| l.split(' ').nth(1) == Some("200")),
        "a request was not answered with 200"
    );
    let err = std::fs::read_to_string(d.join("nginx2.err")).unwrap_or_default();
    assert!(
        !err.contains("[alert]") && !err.contains("[crit]") && !err.contains("[emerg]"),
        "nginx complained:\n{err}"
    );
    drop(workers_guard);
    drop(ng);
    pids.iter().map(|p| p.to_string()).collect()
}
