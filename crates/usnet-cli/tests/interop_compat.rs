//! Programs nobody tuned for usnet, unchanged under `usnet run`, against Linux on the
//! other side of a TAP (root only): the rows of docs/compat.md that say "works".
//! Each program runs on its default settings; every payload is checked. One stack
//! server serves them all, one program at a time.
//!
//! - the JVM: `com.sun.net.httpserver.HttpServer` on its default wildcard (an
//!   AF_INET6 dual-stack socket) reached over IPv4 and IPv6, and
//!   `java.net.http.HttpClient`;
//! - Node: `http.createServer().listen(port)` (`::`, dual-stack), `cluster` with two
//!   workers (connections handed over with SCM_RIGHTS), and `fetch`;
//! - Python asyncio on a `socket.create_server(dualstack_ipv6=True)` listener;
//! - nginx with a stock-shaped configuration: `user www-data`, 4 workers,
//!   `listen PORT` and `listen [::]:PORT`;
//! - OpenSSH: sshd (re-exec, privilege separation, seccomp sandbox) serving ssh from
//!   Linux, and ssh to Linux's sshd;
//! - socket activation: `systemd-socket-activate --inetd -a cat`, a program
//!   handed its listener with `LISTEN_FDS`, and a datagram socket (`--datagram`)
//!   whose first datagram the activated service reads;
//! - a shell: bash's `/dev/tcp` connection written and read by `cat`, and written
//!   by the builtin `echo` (stdio);
//! - `git daemon` (`upload-pack` writes its connection through stdio), cloned from
//!   Linux;
//! - OpenSSL's `s_server` and `s_client`, each way;
//! - PostgreSQL as its own user (a backend forked per connection, each waiting on
//!   its connection and kernel descriptors at once), psql and pgbench from Linux;
//! - dnsmasq answering DNS (it lists interfaces with `SIOCGIF*` ioctls, and with
//!   `--bind-dynamic` the addresses to bind through rtnetlink); unbound over
//!   UDP and TCP, both families (it sets `IPV6_MTU`);
//! - HAProxy proxying to Linux's web server, memcached (4 threads), lighttpd;
//! - squid with two workers, exec'd by its master in the loader's secure mode:
//!   the shim says so, and `usnet shim install` puts them on usnet;
//! - vsftpd (each connection's processes made by raw `clone`s, under a 200 MB
//!   address-space limit), passive and active FTP over IPv4 and IPv6;
//! - wget and curl; iperf3 over UDP; ping, both families, with usnet its only
//!   network; `ip addr` and `ip route` (rtnetlink) telling the stack's interface;
//! - a statically linked program: runs under `usnet run`'s seccomp supervisor; with
//!   `--via preload`, `usnet run` says its sockets stay on the kernel.

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const TAP: &str = "usntcmp0";
const OURS: &str = "10.51.0.2";
const HOST: &str = "10.51.0.1";
const OURS6: &str = "fd51::2";
const HOST6: &str = "fd51::1";
const STACK: &str = "it-compat";

/// `usnet run --stack STACK -- args` in `d`, with a deadline.
fn shim(d: &Path, args: &[&str], input: &[u8], secs: u64) -> Out {
    let mut c = Command::new(USNET);
    c.args(["run", "--stack", STACK, "--"])
        .args(args)
        .env("USNET_RUN_DIR", d)
        .current_dir(d);
    run_in(&mut c, input, Duration::from_secs(secs))
}

/// curl from Linux: the body, which must come.
fn curl(url: &str) -> Vec<u8> {
    let o = Command::new("curl")
        .args(["-sS", "-g", "--max-time", "10", url])
        .output()
        .expect("curl");
    assert!(
        o.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// A file served by Linux's python http.server in `d/www`.
fn body() -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(7) % 251) as u8)
        .collect()
}

fn java(d: &Path) {
    need("java", "default-jdk-headless");
    std::fs::write(
        d.join("Srv.java"),
        r#"import com.sun.net.httpserver.*;
import java.net.*;
public class Srv {
  public static void main(String[] a) throws Exception {
    HttpServer s = HttpServer.create(new InetSocketAddress(Integer.parseInt(a[0])), 0);
    s.createContext("/", x -> { byte[] b = ("java saw " + x.getRemoteAddress().getAddress().getHostAddress() + "\n").getBytes(); x.sendResponseHeaders(200, b.length); x.getResponseBody().write(b); x.close(); });
    s.start();
    System.out.println("listening");
  }
}
"#,
    )
    .unwrap();
    std::fs::write(
        d.join("Cli.java"),
        r#"import java.net.http.*;
import java.net.*;
import java.security.MessageDigest;
public class Cli {
  public static void main(String[] a) throws Exception {
    HttpResponse<byte[]> r = HttpClient.newHttpClient().send(HttpRequest.newBuilder(URI.create(a[0])).build(), HttpResponse.BodyHandlers.ofByteArray());
    byte[] h = MessageDigest.getInstance("SHA-256").digest(r.body());
    StringBuilder sb = new StringBuilder();
    for (byte b : h) sb.append(String.format("%02x", b));
    System.out.println(r.statusCode() + " " + r.body().length + " " + sb);
  }
}
"#,
    )
    .unwrap();
    let port = 18080u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "java-server",
        "java",
        &["Srv.java", &port.to_string()],
    );
    wait_listening(&mut srv, d, OURS, port);
    let v4 = curl(&format!("http://{OURS}:{port}/"));
    assert_eq!(
        String::from_utf8_lossy(&v4),
        format!("java saw {HOST}\n"),
        "JVM server over IPv4"
    );
    let v6 = curl(&format!("http://[{OURS6}]:{port}/"));
    assert_eq!(
        String::from_utf8_lossy(&v6),
        "java saw fd51:0:0:0:0:0:0:1\n", // Java writes IPv6 addresses in full
        "JVM server over IPv6"
    );
    drop(srv);
    for url in [
        format!("http://{HOST}:18099/f"),
        format!("http://[{HOST6}]:18098/f"),
    ] {
        let o = shim(d, &["java", "Cli.java", &url], &[], 60);
        assert!(o.ok(), "JVM client {url}: {}", o.describe());
        let want = format!("200 {} {}", body().len(), sha256_hex(&body()));
        assert_eq!(o.stdout.trim(), want, "JVM client {url}");
    }
    // `NetworkInterface`: the IPv4 addresses come from SIOCGIFCONF, the IPv6 ones
    // from /proc/net/if_inet6 (the stack's mirror's under the shim): loopback and
    // the stack's interface with both of its addresses, nothing of the host's.
    std::fs::write(
        d.join("Ifs.java"),
        r#"import java.net.*;
import java.util.*;
public class Ifs {
  public static void main(String[] a) throws Exception {
    for (NetworkInterface i : Collections.list(NetworkInterface.getNetworkInterfaces()))
      for (InetAddress x : Collections.list(i.getInetAddresses()))
        System.out.println(i.getName() + " " + x.getHostAddress());
  }
}
"#,
    )
    .unwrap();
    let o = shim(d, &["java", "Ifs.java"], &[], 60);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        o.ok()
            && lines.contains(&format!("{TAP} {OURS}").as_str())
            && lines.contains(&format!("{TAP} fd51:0:0:0:0:0:0:2%{TAP}").as_str())
            && lines
                .iter()
                .all(|l| l.starts_with("lo ") || l.starts_with(&format!("{TAP} ")))
            && !o.stdout.contains("fd51:0:0:0:0:0:0:1"),
        "the JVM's NetworkInterface list under usnet run: {}",
        o.describe()
    );
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The `usnet clients --json` row of the client with process id `pid`.
fn client_row(d: &Path, pid: u32) -> serde_json::Value {
    let o = run_in(
        Command::new(USNET)
            .args(["clients", "--stack", STACK, "--json"])
            .env("USNET_RUN_DIR", d),
        &[],
        Duration::from_secs(10),
    );
    assert!(o.ok(), "usnet clients: {}", o.describe());
    let rows: Vec<serde_json::Value> = serde_json::from_str(&o.stdout).expect("clients JSON");
    rows.into_iter()
        .find(|r| r["pid"] == pid)
        .unwrap_or_else(|| panic!("no client with pid {pid}: {}", o.stdout))
}

/// libuv (Node, uvloop) with its io_uring rings on (`UV_USE_IO_URING=1`) adds and
/// changes its epoll registrations through a ring (`IORING_OP_EPOLL_CTL`), past the
/// shim: the kernel epoll set held the listener's number, a Unix socket that polls
/// as hung up, and the idle server spun (uvicorn's workers: a core's third each,
/// ~40,000 calls a second). The shim refuses `io_uring_setup` (ENOSYS, as a kernel
/// without io_uring), and libuv goes on with `epoll_ctl`.
fn node_with_io_uring(d: &Path) {
    let port = 18083u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "node-io-uring",
        "env",
        &["UV_USE_IO_URING=1", "node", "srv.js", &port.to_string()],
    );
    wait_listening(&mut srv, d, OURS, port);
    assert_eq!(
        String::from_utf8_lossy(&curl(&format!("http://{OURS}:{port}/"))),
        format!("node saw ::ffff:{HOST}\n"),
        "Node server with UV_USE_IO_URING=1"
    );
    // (`usnet run` and `env` exec: the process is node.)
    let pid = srv.0.id();
    let row = client_row(d, pid);
    let rings = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("io_uring"))
        .count();
    assert_eq!(rings, 0, "Node under the shim holds io_uring rings");
    // Idle: the server makes (nearly) no calls; spinning, it made tens of thousands
    // a second.
    let calls = |r: &serde_json::Value| r["stats"]["calls"].as_u64().expect("calls");
    let before = calls(&row);
    std::thread::sleep(Duration::from_secs(1));
    let idle = calls(&client_row(d, pid)) - before;
    assert!(
        idle < 1000,
        "an idle Node server made {idle} calls in a second"
    );
    drop(srv);
}

fn node(d: &Path) {
    need("node", "nodejs");
    std::fs::write(
        d.join("srv.js"),
        "require('http').createServer((q, r) => r.end('node saw ' + q.socket.remoteAddress + '\\n')).listen(+process.argv[2]);\n",
    )
    .unwrap();
    std::fs::write(
        d.join("cli.js"),
        "fetch(process.argv[2]).then(r => r.arrayBuffer()).then(b => { const h = require('crypto').createHash('sha256').update(Buffer.from(b)).digest('hex'); console.log(b.byteLength + ' ' + h); }).catch(e => { console.error(e); process.exit(1); });\n",
    )
    .unwrap();
    let port = 18081u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "node-server",
        "node",
        &["srv.js", &port.to_string()],
    );
    wait_listening(&mut srv, d, OURS, port);
    assert_eq!(
        String::from_utf8_lossy(&curl(&format!("http://{OURS}:{port}/"))),
        format!("node saw ::ffff:{HOST}\n"),
        "Node server over IPv4 (a dual-stack socket sees a v4-mapped peer)"
    );
    assert_eq!(
        String::from_utf8_lossy(&curl(&format!("http://[{OURS6}]:{port}/"))),
        format!("node saw {HOST6}\n"),
        "Node server over IPv6"
    );
    drop(srv);
    node_with_io_uring(d);
    // `cluster`: the primary accepts and hands each connection to a worker with
    // SCM_RIGHTS (round-robin, Node's default); the worker's libuv asks the kernel
    // what the descriptor is (statx) and closes it with syscall(SYS_close).
    std::fs::write(
        d.join("cluster.js"),
        "const c = require('cluster'); let n = 0;\n\
         if (process.argv[3] === 'none') c.schedulingPolicy = c.SCHED_NONE;\n\
         if (c.isPrimary) { for (let i = 0; i < 2; i++) c.fork(); \
         c.on('listening', () => { if (++n == 2) console.log('both listening'); }); }\n\
         else require('http').createServer((q, r) => r.end('worker ' + c.worker.id + '\\n')).listen(+process.argv[2]);\n",
    )
    .unwrap();
    // Round-robin: both workers serve in turn. `none`: the primary passes one
    // bound socket, every worker listens on it, and the kernel (here the stack)
    // picks which accepts.
    for (mode, what, port) in [
        ("rr", "node-cluster", 18086u16),
        ("none", "node-cluster-none", 18088u16),
    ] {
        let mut srv = spawn_prog(
            d,
            Some(STACK),
            what,
            "node",
            &["cluster.js", &port.to_string(), mode],
        );
        wait_log(&mut srv, d, "both listening");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..6 {
            let b = String::from_utf8_lossy(&curl(&format!("http://{OURS}:{port}/"))).into_owned();
            assert!(
                b == "worker 1\n" || b == "worker 2\n",
                "Node cluster ({mode}) answered {b:?}"
            );
            seen.insert(b);
        }
        if mode == "rr" {
            assert_eq!(seen.len(), 2, "both Node cluster workers served: {seen:?}");
        }
        drop(srv);
    }
    for url in [
        format!("http://{HOST}:18099/f"),
        format!("http://[{HOST6}]:18098/f"),
    ] {
        let o = shim(d, &["node", "cli.js", &url], &[], 30);
        assert!(o.ok(), "Node fetch {url}: {}", o.describe());
        assert_eq!(
            o.stdout.trim(),
            format!("{} {}", body().len(), sha256_hex(&body())),
            "Node fetch {url}"
        );
    }
}

fn python_asyncio(d: &Path) {
    std::fs::write(
        d.join("aio.py"),
        r#"import asyncio, socket, sys
async def serve(r, w):
    line = await r.readline()
    peer = w.get_extra_info("peername")[0]
    w.write(b"asyncio saw " + peer.encode() + b" " + line)
    await w.drain()
    w.close()
async def main():
    l = socket.create_server(("", int(sys.argv[1])), family=socket.AF_INET6,
                             dualstack_ipv6=True)
    s = await asyncio.start_server(serve, sock=l)
    print("listening", flush=True)
    async with s:
        await s.serve_forever()
asyncio.run(main())
"#,
    )
    .unwrap();
    let port = 18082u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "python-asyncio",
        "python3",
        &["aio.py", &port.to_string()],
    );
    wait_listening(&mut srv, d, OURS, port);
    for (addr, peer) in [
        (OURS.to_string(), format!("::ffff:{HOST}")),
        (format!("[{OURS6}]"), HOST6.to_string()),
    ] {
        let o = run_in(
            Command::new("socat").args(["-t", "5", "-", &format!("TCP:{addr}:{port}")]),
            b"ping\n",
            Duration::from_secs(10),
        );
        assert_eq!(
            o.stdout,
            format!("asyncio saw {peer} ping\n"),
            "asyncio over {addr}: {}",
            o.describe()
        );
    }
}

fn nginx(d: &Path) {
    nginx_with(d, false);
    nginx_with(d, true);
}

/// nginx as configured by default, or with `listen ... reuseport`: the master
/// then opens one SO_REUSEPORT listener per worker and family, and each worker
/// accepts on its own; the connections spread over the workers (the access
/// log names the worker that served each one).
fn nginx_with(d: &Path, reuseport: bool) {
    need("nginx", "nginx");
    let user = if run("id", &["www-data"], Duration::from_secs(5)).ok() {
        "www-data"
    } else {
        "nobody"
    };
    let www = d.join("www");
    let (port, tag, opt) = if reuseport {
        (18084u16, "nginx-rp", " reuseport")
    } else {
        (18083u16, "nginx", "")
    };
    let conf = d.join(format!("{tag}.conf"));
    std::fs::write(
        &conf,
        format!(
            "user {user};\nworker_processes 4;\npid {p}/{tag}.pid;\nerror_log {p}/{tag}-error.log;\n\
             events {{ worker_connections 768; }}\n\
             http {{ sendfile on; tcp_nopush on; log_format w '$pid';\n\
               access_log {p}/{tag}-access.log w;\n\
               server {{ listen {port}{opt}; listen [::]:{port}{opt}; root {w}; }} }}\n",
            p = d.display(),
            w = www.display()
        ),
    )
    .unwrap();
    // daemon on (the default): the master forks, the workers drop to `user`.
    let o = shim(d, &["nginx", "-c", conf.to_str().unwrap()], &[], 30);
    assert!(o.ok(), "{tag}: {}", o.describe());
    // Stopped, and gone (its pid file removed on exit, within 10 s) before the
    // next instance counts its workers.
    let stop = || {
        let _ = Command::new("nginx")
            .args(["-c", conf.to_str().unwrap(), "-s", "stop"])
            .status();
        let pid = d.join(format!("{tag}.pid"));
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while pid.exists() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut ok = true;
    let fetches = if reuseport { 24 } else { 12 };
    for i in 0..fetches {
        let url = if i % 3 == 2 {
            format!("http://[{OURS6}]:{port}/f")
        } else {
            format!("http://{OURS}:{port}/f")
        };
        let got = Command::new("curl")
            .args(["-sS", "-g", "--max-time", "10", &url])
            .output()
            .expect("curl");
        ok &= got.status.success() && got.stdout == body();
    }
    let log = std::fs::read_to_string(d.join(format!("{tag}-error.log"))).unwrap_or_default();
    let workers = run(
        "pgrep",
        &["-u", user, "-f", "nginx: worker"],
        Duration::from_secs(5),
    );
    stop();
    assert!(
        ok,
        "{tag} (user {user}, 4 workers) served a wrong or no body: {log}"
    );
    assert!(
        workers.stdout.lines().count() == 4,
        "{tag} workers running as {user}: {}",
        workers.describe()
    );
    assert!(!log.contains("[alert]"), "{tag} alerts: {log}");
    if reuseport {
        let access =
            std::fs::read_to_string(d.join(format!("{tag}-access.log"))).unwrap_or_default();
        let served_by: std::collections::HashSet<&str> = access.lines().collect();
        assert!(
            access.lines().count() == fetches && served_by.len() >= 2,
            "{tag}: each worker's listener takes a share (pids per request): {access}"
        );
    }
}

fn openssh(d: &Path) {
    need("sshd", "openssh-server");
    need("ssh", "openssh-client");
    need("ssh-keygen", "openssh-client");
    let _ = std::fs::create_dir_all("/run/sshd");
    for k in ["hostkey", "id"] {
        must(
            "ssh-keygen",
            &[
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                d.join(k).to_str().unwrap(),
            ],
        );
    }
    let conf = |addr6: &str, addr4: &str, port: u16, pid: &str| {
        format!(
            "Port {port}\nListenAddress {addr4}\nListenAddress {addr6}\nHostKey {p}/hostkey\n\
             AuthorizedKeysFile {p}/id.pub\nPermitRootLogin yes\nPasswordAuthentication no\n\
             UsePAM no\nStrictModes no\nPidFile {p}/{pid}\n",
            p = d.display()
        )
    };
    std::fs::write(d.join("sshd_config"), conf(OURS6, OURS, 12222, "sshd.pid")).unwrap();
    std::fs::write(
        d.join("lsshd_config"),
        conf(HOST6, HOST, 12223, "lsshd.pid"),
    )
    .unwrap();
    let sshd = which("sshd");
    let ssh = |prog: Vec<&str>, host: &str, port: u16, shimmed: bool| {
        let key = d.join("id");
        let mut args = prog;
        let p = port.to_string();
        args.extend([
            "-p",
            &p,
            "-i",
            key.to_str().unwrap(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]);
        let target = format!("root@{host}");
        args.extend([target.as_str(), "head -c 1000000 /dev/zero | sha256sum"]);
        if shimmed {
            shim(d, &args, &[], 30)
        } else {
            run_in(
                Command::new(args[0]).args(&args[1..]),
                &[],
                Duration::from_secs(30),
            )
        }
    };
    // 1 MB of zeros, hashed on the far side.
    let want = "d29751f2649b32ff572b5e0a9f541ea660a50f94ff0beedfb0b692b924cc8025";
    let cfg = d.join("sshd_config");
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "sshd",
        &sshd,
        &["-D", "-e", "-f", cfg.to_str().unwrap()],
    );
    wait_log(
        &mut srv,
        d,
        &format!("Server listening on {OURS} port 12222"),
    );
    for host in [OURS, OURS6] {
        let o = ssh(vec!["ssh"], host, 12222, false);
        assert!(
            o.ok() && o.stdout.contains(want),
            "ssh from Linux to sshd under usnet run at {host}: {}\nsshd: {}",
            o.describe(),
            log_of(d, "sshd")
        );
    }
    drop(srv);
    let lcfg = d.join("lsshd_config");
    let mut lin = spawn_prog(
        d,
        None,
        "linux-sshd",
        &sshd,
        &["-D", "-e", "-f", lcfg.to_str().unwrap()],
    );
    wait_log(
        &mut lin,
        d,
        &format!("Server listening on {HOST} port 12223"),
    );
    for host in [HOST, HOST6] {
        let o = ssh(vec!["ssh"], host, 12223, true);
        assert!(
            o.ok() && o.stdout.contains(want),
            "ssh under usnet run to Linux's sshd at {host}: {}",
            o.describe()
        );
    }
}

fn which(prog: &str) -> String {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(prog))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{prog} not found"))
        .to_string_lossy()
        .into_owned()
}

fn socket_activation(d: &Path) {
    need("systemd-socket-activate", "systemd");
    // inetd style: a `cat` per connection, the connection on its stdin and stdout.
    let port = 18084u16;
    let mut inetd = spawn_prog(
        d,
        Some(STACK),
        "socket-activate-inetd",
        "systemd-socket-activate",
        &["-l", &format!("{OURS}:{port}"), "--inetd", "-a", "cat"],
    );
    wait_log(&mut inetd, d, "Listening on");
    for i in 0..3 {
        let line = format!("echo {i}\n");
        let o = run_in(
            Command::new("socat").args(["-t", "3", "-", &format!("TCP:{OURS}:{port}")]),
            line.as_bytes(),
            Duration::from_secs(10),
        );
        assert_eq!(
            o.stdout,
            line,
            "cat activated by systemd-socket-activate: {}",
            o.describe()
        );
    }
    drop(inetd);
    // The listener handed over with LISTEN_FDS (fd 3) to a program that execs.
    std::fs::write(
        d.join("lfd.py"),
        "import os, socket\nassert os.environ['LISTEN_FDS'] == '1'\nl = socket.socket(fileno=3)\nfor _ in range(2):\n    c, a = l.accept()\n    c.sendall(b'activated ' + c.recv(64))\n    c.close()\n",
    )
    .unwrap();
    let port = 18085u16;
    let mut act = spawn_prog(
        d,
        Some(STACK),
        "socket-activate-fds",
        "systemd-socket-activate",
        &["-l", &format!("{OURS}:{port}"), "python3", "lfd.py"],
    );
    wait_log(&mut act, d, "Listening on");
    for i in 0..2 {
        let o = run_in(
            Command::new("socat").args(["-t", "5", "-", &format!("TCP:{OURS}:{port}")]),
            format!("hello {i}").as_bytes(),
            Duration::from_secs(10),
        );
        assert_eq!(
            o.stdout,
            format!("activated hello {i}"),
            "LISTEN_FDS: {}\n{}",
            o.describe(),
            log_of(d, "socket-activate-fds")
        );
    }
    drop(act);
    // A datagram socket (`--datagram`): the activator waits until it is readable,
    // then execs the service on it, which reads the datagram that woke it (it was
    // in the activator's ring: it moves to the reader). Answered to Linux.
    std::fs::write(
        d.join("udpsvc.py"),
        "import socket\ns = socket.socket(fileno=3)\ns.settimeout(10)\nd, a = s.recvfrom(2000)\ns.sendto(b'activated ' + d, a)\n",
    )
    .unwrap();
    let port = 18111u16;
    let mut dgram = spawn_prog(
        d,
        Some(STACK),
        "socket-activate-dgram",
        "systemd-socket-activate",
        &[
            "--datagram",
            "-l",
            &format!("{OURS}:{port}"),
            "python3",
            "udpsvc.py",
        ],
    );
    wait_log(&mut dgram, d, "Listening on");
    let o = run(
        "python3",
        &[
            "-c",
            &format!(
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.settimeout(10)\ns.sendto(b'hello', ('{OURS}', {port}))\nprint(s.recvfrom(100)[0].decode())"
            ),
        ],
        Duration::from_secs(20),
    );
    assert_eq!(
        o.stdout.trim(),
        "activated hello",
        "datagram activation: {}\n{}",
        o.describe(),
        log_of(d, "socket-activate-dgram")
    );
}

fn shell(d: &Path) {
    need("bash", "bash");
    let script = format!(
        "exec 3<>/dev/tcp/{HOST}/18099; printf 'GET /f HTTP/1.0\\r\\n\\r\\n' | cat >&3; cat <&3 > got; echo done"
    );
    let o = shim(d, &["bash", "-c", &script], &[], 30);
    assert!(
        o.ok() && o.stdout.trim() == "done",
        "bash /dev/tcp: {}",
        o.describe()
    );
    let got = std::fs::read(d.join("got")).unwrap();
    let at = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    assert!(
        got[at + 4..] == body(),
        "bash /dev/tcp + cat: the body differs"
    );
    // The builtin `echo` writes through stdio (glibc's internal write).
    let script = format!(
        "exec 3<>/dev/tcp/{HOST}/18099; echo -e 'GET /f HTTP/1.0\\r\\n\\r' >&3; cat <&3 > got2; echo done"
    );
    let o = shim(d, &["bash", "-c", &script], &[], 30);
    assert!(
        o.ok() && o.stdout.trim() == "done",
        "bash builtin echo >&3: {}",
        o.describe()
    );
    let got = std::fs::read(d.join("got2")).unwrap();
    assert!(
        got.ends_with(&body()),
        "bash builtin echo >&3: the body differs"
    );
}

/// `git daemon` under the shim, cloned from Linux: `upload-pack`, exec'd per
/// connection with it on stdin and stdout, writes through stdio.
fn git_daemon(d: &Path) {
    need("git", "git");
    let base = d.join("git");
    let repo = base.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |dir: &Path, args: &[&str]| {
        let o = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "usnet")
            .env("GIT_AUTHOR_EMAIL", "usnet@localhost")
            .env("GIT_COMMITTER_NAME", "usnet")
            .env("GIT_COMMITTER_EMAIL", "usnet@localhost")
            .output()
            .expect("git");
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("f"), body()).unwrap();
    git(&repo, &["add", "f"]);
    git(&repo, &["commit", "-qm", "one"]);
    let port = 18087u16;
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "git-daemon",
        "git",
        &[
            "daemon",
            "--export-all",
            "--reuseaddr",
            &format!("--base-path={}", base.display()),
            &format!("--listen={OURS}"),
            &format!("--port={port}"),
        ],
    );
    wait_listening(&mut srv, d, OURS, port);
    let clone = d.join("git-clone");
    let o = run_in(
        Command::new("git").args([
            "clone",
            "-q",
            &format!("git://{OURS}:{port}/repo"),
            clone.to_str().unwrap(),
        ]),
        &[],
        Duration::from_secs(30),
    );
    assert!(o.ok(), "git clone from git daemon: {}", o.describe());
    assert!(
        std::fs::read(clone.join("f")).unwrap() == body(),
        "git clone: the file differs"
    );
    drop(srv);
}

/// PostgreSQL under the shim as its own user: the postmaster forks a backend per
/// connection, and each backend waits on its connection and on kernel descriptors
/// at once (its latch's signalfd, the postmaster's death pipe) in one epoll set.
/// psql from Linux over IPv4 and IPv6, and pgbench making a connection (a fork) per
/// transaction from four clients at once.
fn postgres(d: &Path) {
    need("psql", "postgresql-client");
    let bin = usnet_bench::preload::postgres_bin()
        .expect("no PostgreSQL server: apt-get install -y postgresql (CI must install it)");
    let data = d.join("pg");
    // Linux, on the far side of the TAP, may connect.
    let allow = [format!("{HOST}/32"), format!("{HOST6}/128")];
    usnet_bench::preload::postgres_cluster(&bin, &data, &[&allow[0], &allow[1]])
        .unwrap_or_else(|e| panic!("a PostgreSQL cluster: {e}"));
    let port = 18089u16;
    let port_s = port.to_string();
    let args =
        usnet_bench::preload::postgres_server_args(&bin, &data, &format!("{OURS},{OURS6}"), port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut srv = spawn_prog(d, Some(STACK), "postgres", "setpriv", &args);
    wait_listening(&mut srv, d, OURS, port);
    for host in [OURS, OURS6] {
        let o = run(
            "psql",
            &[
                "-h",
                host,
                "-p",
                &port_s,
                "-U",
                "postgres",
                "-Atc",
                "select sum(x) from generate_series(1, 1000) x",
            ],
            Duration::from_secs(30),
        );
        assert!(
            o.ok() && o.stdout.trim() == "500500",
            "psql from Linux to PostgreSQL under usnet run at {host}: {}",
            o.describe()
        );
    }
    let pgbench = bin.join("pgbench");
    let pgbench = pgbench.to_str().unwrap();
    let common = ["-h", OURS, "-p", &port_s, "-U", "postgres"];
    let mut init = common.to_vec();
    init.extend(["-i", "-q", "postgres"]);
    let o = run(pgbench, &init, Duration::from_secs(60));
    assert!(o.ok(), "pgbench -i: {}", o.describe());
    let mut load = common.to_vec();
    load.extend(["-c", "4", "-j", "2", "-t", "25", "-C", "postgres"]);
    let o = run(pgbench, &load, Duration::from_secs(120));
    assert!(
        o.ok()
            && o.stdout.contains("actually processed: 100/100")
            && o.stdout.contains("failed transactions: 0 "),
        "pgbench, a connection per transaction: {}",
        o.describe()
    );
    // A fast shutdown, so no backend or shared memory outlives the test.
    // SAFETY: kill(2) on our own child, no memory arguments.
    unsafe { libc::kill(srv.0.id() as i32, libc::SIGINT) };
    assert!(
        reap(&mut srv.0, Duration::from_secs(20)).is_some_and(|s| s.success()),
        "PostgreSQL shuts down: {}",
        log_of(d, srv.1)
    );
}

/// dnsmasq under the shim answering a DNS query from Linux, bound to our address
/// and in its default mode. Bound, it lists the host's interfaces with
/// `SIOCGIFCONF` and friends on one of its sockets, which the shim answers as the
/// kernel would (before: ENOTTY, and dnsmasq stopped). In its default mode it
/// listens on the wildcard address and drops a query whose `IP_PKTINFO` does not
/// name an interface (before: no control message came, and no query was
/// answered).
fn dnsmasq(d: &Path) {
    need("dnsmasq", "dnsmasq-base");
    let listen = format!("--listen-address={OURS}");
    dnsmasq_answers(d, 18090, &["--bind-interfaces", &listen]);
    dnsmasq_answers(d, 18091, &[]);
    // It learns the addresses to bind from rtnetlink: the stack's mirror's (it
    // bound the host's before, and answered nothing on the stack).
    dnsmasq_answers(d, 18092, &["--bind-dynamic"]);
}

/// dnsmasq with `mode` (its options of where to listen) answers an A query.
fn dnsmasq_answers(d: &Path, port: u16, mode: &[&str]) {
    let port_opt = format!("--port={port}");
    let mut args = vec![
        "-k",
        "--no-resolv",
        "--no-hosts",
        &port_opt,
        "--address=/usnet.test/10.9.9.9",
        "-u",
        "nobody",
    ];
    args.extend_from_slice(mode);
    let mut srv = spawn_prog(d, Some(STACK), "dnsmasq", "dnsmasq", &args);
    // One A query for usnet.test, retried while dnsmasq starts.
    let script = [
        "import socket, struct, time",
        "q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b'\\x05usnet\\x04test\\x00' + struct.pack('>HH', 1, 1)",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "s.settimeout(1)",
        "for i in range(15):",
        "    try:",
        "        s.sendto(q, (HOST, PORT))",
        "        d, _ = s.recvfrom(512)",
        "        print(socket.inet_ntoa(d[-4:]))",
        "        break",
        "    except socket.timeout:",
        "        time.sleep(0.2)",
    ]
    .join("\n")
    .replace("HOST", &format!("'{OURS}'"))
    .replace("PORT", &port.to_string());
    let o = run("python3", &["-c", &script], Duration::from_secs(30));
    assert!(
        o.ok() && o.stdout.trim() == "10.9.9.9",
        "a DNS query to dnsmasq {mode:?} under usnet run: {} {}",
        o.describe(),
        log_of(d, srv.1)
    );
    let _ = srv.0.try_wait();
    drop(srv);
}

/// unbound answering from a local zone on the wildcard of both families, over
/// UDP (IPv4 and IPv6) and TCP, queried with dig from Linux. unbound sets
/// `IPV6_MTU` 1,280 on its IPv6 sockets and stops when that fails (before,
/// it was ENOPROTOOPT: "could not open ports").
fn unbound(d: &Path) {
    need("unbound", "unbound");
    need("dig", "bind9-dnsutils");
    let port = 18089u16;
    let cfg = d.join("unbound.conf");
    std::fs::write(
        &cfg,
        format!(
            "server:\n  interface: 0.0.0.0\n  interface: ::0\n  port: {port}\n\
             \x20 access-control: 0.0.0.0/0 allow\n  access-control: ::/0 allow\n\
             \x20 username: \"\"\n  chroot: \"\"\n  directory: \"{d}\"\n  pidfile: \"\"\n\
             \x20 use-syslog: no\n  do-daemonize: no\n\
             \x20 local-zone: \"usnet.test.\" static\n\
             \x20 local-data: \"www.usnet.test. IN A 192.0.2.7\"\n\
             \x20 local-data: \"www.usnet.test. IN AAAA 2001:db8::7\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    let args = ["-d", "-c", cfg.to_str().unwrap()];
    let mut srv = spawn_prog(d, Some(STACK), "unbound", "unbound", &args);
    // Its TCP listener is up once it serves (UDP has nothing to wait on).
    wait_listening(&mut srv, d, OURS, port);
    let port_s = port.to_string();
    for (server, qtype, tcp, want) in [
        (OURS, "A", false, "192.0.2.7"),
        (OURS6, "AAAA", false, "2001:db8::7"),
        (OURS, "A", true, "192.0.2.7"),
        (OURS6, "A", true, "192.0.2.7"),
    ] {
        let at = format!("@{server}");
        let mut a = vec![at.as_str(), "-p", &port_s, "+short", "+time=2", "+tries=3"];
        if tcp {
            a.push("+tcp");
        }
        a.extend(["www.usnet.test", qtype]);
        let o = run("dig", &a, Duration::from_secs(30));
        assert!(
            o.ok() && o.stdout.trim() == want,
            "dig {a:?} to unbound under usnet run: {} {}",
            o.describe(),
            log_of(d, srv.1)
        );
    }
}

/// squid with two workers (SMP). The master runs as root with `proxy` as its
/// effective uid and execs each kid, so every kid starts in the dynamic loader's
/// secure mode, which ignores a preload path. Without the loader's trusted copy of
/// the shim, the shim says so before the exec (the kids' sockets would be the
/// kernel's); with `usnet shim install`, the coordinator kid opens the listener on
/// usnet and hands it to both workers (SCM_RIGHTS), which proxy to Linux's web
/// server over IPv4 and IPv6, and the kernel has no listener on the port.
fn squid_workers(d: &Path) {
    need("squid", "squid");
    let port = 18110u16;
    let sq = d.join("squid");
    std::fs::create_dir_all(&sq).unwrap();
    // The kids run as `proxy`: their logs and pid file are written there.
    must("chmod", &["1777", sq.to_str().unwrap()]);
    // Where the kids' IPC sockets are (systemd-tmpfiles makes it on a booted
    // system).
    std::fs::create_dir_all("/run/squid").unwrap();
    must("chown", &["proxy:proxy", "/run/squid"]);
    let cfg = sq.join("squid.conf");
    std::fs::write(
        &cfg,
        format!(
            "workers 2\nhttp_port {port}\nhttp_access allow all\ncache deny all\ncache_mem 8 MB\n\
             access_log stdio:{p}/access.log\ncache_log {p}/cache.log\npid_filename {p}/squid.pid\n\
             coredump_dir {p}\nshutdown_lifetime 1 seconds\ndns_nameservers 127.0.0.1\n",
            p = sq.display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    let args = ["--foreground", "-d1", "-f", cfg];
    let mut cleanup = Cleanup::default();
    // The master and its kids (their command lines name the configuration).
    cleanup.on_drop(&["pkill", "-KILL", "-f", cfg]);
    let stop = || {
        let _ = run("pkill", &["-KILL", "-f", cfg], Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(300));
        let _ = std::fs::remove_file(sq.join("squid.pid"));
    };
    let shim_cmd = |what: &str| run(USNET, &["shim", what], Duration::from_secs(10));

    // Without the trusted copy: the kids would be on the kernel, and the shim says so.
    assert!(shim_cmd("remove").ok());
    {
        let _srv = spawn_prog(d, Some(STACK), "squid-path", "squid", &args);
        let end = std::time::Instant::now() + Duration::from_secs(15);
        while !log_of(d, "squid-path").contains("secure mode") {
            assert!(
                std::time::Instant::now() < end,
                "squid's kids exec'd in secure mode without a word: {}",
                log_of(d, "squid-path")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        stop();
    }

    // With it: the kids are on usnet.
    cleanup.on_drop(&[USNET, "shim", "remove"]);
    let o = shim_cmd("install");
    assert!(o.ok(), "usnet shim install: {}", o.describe());
    let st = shim_cmd("status");
    assert!(st.stdout.contains("by name"), "{}", st.describe());
    let mut srv = spawn_prog(d, Some(STACK), "squid", "squid", &args);
    wait_listening(&mut srv, d, OURS, port);
    for i in 0..6 {
        let (proxy, url) = if i % 2 == 0 {
            (
                format!("http://{OURS}:{port}"),
                format!("http://{HOST}:18099/f"),
            )
        } else {
            (
                format!("http://[{OURS6}]:{port}"),
                format!("http://[{HOST6}]:18098/f"),
            )
        };
        let o = Command::new("curl")
            .args(["-sS", "-g", "--max-time", "10", "-x", &proxy, &url])
            .output()
            .expect("curl");
        assert!(
            o.status.success() && o.stdout == body(),
            "squid (2 workers) proxying {url}: {} {}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(sq.join("cache.log")).unwrap_or_default()
        );
    }
    let kernel = run(
        "ss",
        &["-Hltn", &format!("sport = :{port}")],
        Duration::from_secs(5),
    );
    assert!(
        kernel.stdout.trim().is_empty(),
        "squid's listener is the kernel's: {}",
        kernel.describe()
    );
    stop();
    drop(srv);
}

/// HAProxy in HTTP mode on its stock-shaped defaults, a frontend on IPv4 and one
/// on IPv6, proxying to Linux's web server: the proxy is a client and a server
/// of the stack at once.
fn haproxy(d: &Path) {
    need("haproxy", "haproxy");
    let (p4, p6) = (18092u16, 18093u16);
    let cfg = d.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n    maxconn 256\n\
             defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
             frontend fe\n    bind :{p4}\n    bind :::{p6} v6only\n    default_backend be\n\
             backend be\n    server linux {HOST}:18099\n"
        ),
    )
    .unwrap();
    let mut srv = spawn_prog(
        d,
        Some(STACK),
        "haproxy",
        "haproxy",
        &["-db", "-f", cfg.to_str().unwrap()],
    );
    wait_listening(&mut srv, d, OURS, p4);
    for url in [
        format!("http://{OURS}:{p4}/f"),
        format!("http://[{OURS6}]:{p6}/f"),
    ] {
        serves_body(d, &srv, &url);
    }
}

/// memcached with 4 threads (libevent), a 500 kB value stored and fetched back.
fn memcached(d: &Path) {
    need("memcached", "memcached");
    let port = 18094u16;
    let p = port.to_string();
    let args = ["-u", "nobody", "-l", OURS, "-p", &p, "-t", "4", "-I", "2m"];
    let mut srv = spawn_prog(d, Some(STACK), "memcached", "memcached", &args);
    wait_listening(&mut srv, d, OURS, port);
    let script = [
        "import socket",
        "s = socket.create_connection((HOST, PORT), timeout=10)",
        "v = bytes((i * 31 + 7) % 251 for i in range(500000))",
        "s.sendall(b'set k 0 0 %d\\r\\n' % len(v) + v + b'\\r\\n')",
        "assert s.recv(100) == b'STORED\\r\\n'",
        "s.sendall(b'get k\\r\\n')",
        "b = b''",
        "while not b.endswith(b'END\\r\\n'):",
        "    d = s.recv(65536)",
        "    assert d, 'closed'",
        "    b += d",
        "assert b == b'VALUE k 0 %d\\r\\n' % len(v) + v + b'\\r\\nEND\\r\\n'",
        "print('ok')",
    ]
    .join("\n")
    .replace("HOST", &format!("'{OURS}'"))
    .replace("PORT", &p);
    let o = run("python3", &["-c", &script], Duration::from_secs(30));
    assert!(
        o.ok() && o.stdout.trim() == "ok",
        "memcached set and get of 500 kB: {} {}",
        o.describe(),
        log_of(d, srv.1)
    );
}

/// lighttpd serving files on IPv4 and IPv6 after dropping to nobody.
fn lighttpd(d: &Path) {
    need("lighttpd", "lighttpd");
    let port = 18095u16;
    let cfg = d.join("lighttpd.conf");
    std::fs::write(
        &cfg,
        format!(
            "server.document-root = \"{w}\"\nserver.port = {port}\nserver.bind = \"{OURS}\"\n\
             $SERVER[\"socket\"] == \"[{OURS6}]:{port}\" {{ }}\n\
             server.username = \"nobody\"\nserver.groupname = \"nogroup\"\n",
            w = d.join("www").display()
        ),
    )
    .unwrap();
    let args = ["-D", "-f", cfg.to_str().unwrap()];
    let mut srv = spawn_prog(d, Some(STACK), "lighttpd", "lighttpd", &args);
    wait_listening(&mut srv, d, OURS, port);
    for url in [
        format!("http://{OURS}:{port}/f"),
        format!("http://[{OURS6}]:{port}/f"),
    ] {
        serves_body(d, &srv, &url);
    }
}

/// vsftpd on its defaults (standalone, dual-stack): each connection's process is
/// made with a raw `clone` system call (no fork handler runs), caps its address
/// space at 200 MB (`RLIMIT_AS`) and makes the one that talks to the client with
/// another clone, in a network namespace of its own, chrooted, as `nobody`.
/// curl fetches a file over IPv4 and IPv6 with passive (EPSV, PASV) and active
/// (PORT/EPRT: vsftpd dials curl) data connections.
/// vsftpd standalone, with `async_abor_enable=YES` (the setting of its
/// INTERNET_SITE example): `F_SETOWN` on every control connection for `SIGURG`,
/// which it treats as fatal if refused (before, it was `EINVAL`: "fcntl").
fn vsftpd(d: &Path) {
    need("vsftpd", "vsftpd");
    let port = 18094u16;
    let empty = d.join("ftp-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let cfg = d.join("vsftpd.conf");
    std::fs::write(
        &cfg,
        format!(
            "listen=NO\nlisten_ipv6=YES\nlisten_port={port}\nanonymous_enable=YES\n\
             anon_root={w}\nlocal_enable=NO\nsecure_chroot_dir={e}\n\
             pasv_min_port=40000\npasv_max_port=40100\n\
             async_abor_enable=YES\n",
            w = d.join("www").display(),
            e = empty.display()
        ),
    )
    .unwrap();
    let mut srv = spawn_prog(d, Some(STACK), "vsftpd", "vsftpd", &[cfg.to_str().unwrap()]);
    wait_listening(&mut srv, d, OURS, port);
    for host in [OURS.to_string(), format!("[{OURS6}]")] {
        for mode in [&[][..], &["-P", "-"], &["--disable-epsv"]] {
            let o = Command::new("curl")
                .args(["-sS", "-g", "--max-time", "10"])
                .args(mode)
                .arg(format!("ftp://{host}:{port}/f"))
                .output()
                .expect("curl");
            assert!(
                o.status.success() && o.stdout == body(),
                "vsftpd {host} {mode:?}: {} ({} bytes) {}",
                String::from_utf8_lossy(&o.stderr),
                o.stdout.len(),
                log_of(d, srv.1)
            );
        }
    }
}

/// BIRD speaking BGP under the shim with Linux's BIRD, both with `ttl security`
/// (RFC 5082: TTL 255 on every segment, `IP_MINTTL` 255 on the socket): the
/// session establishes, which the kernel's side allows only if usnet's segments
/// leave at TTL 255, and each side learns the other's route. The usnet side runs in
/// a network namespace of its own, so usnet is its only network (as for a daemon
/// on a dedicated interface) and BIRD sees no kernel interface on the link.
/// A network namespace with only its loopback (up), where usnet is a program's
/// only network; deleted when the guard goes.
fn empty_netns(ns: &str) -> Cleanup {
    let _ = run("ip", &["netns", "del", ns], Duration::from_secs(10));
    ip(&["netns", "add", ns]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "netns", "del", ns]);
    ip(&["-n", ns, "link", "set", "lo", "up"]);
    cleanup
}

fn bird(d: &Path) {
    need("bird", "bird2");
    need("birdc", "bird2");
    let ns = "usnt-bird";
    let _ns = empty_netns(ns);
    let conf = |me: &str, as_me: u32, peer: &str, as_peer: u32, net: &str, extra: &str| {
        format!(
            "router id {me};\nprotocol device {{ }}\n\
             protocol static {{ ipv4; route {net} blackhole; }}\n\
             protocol bgp peer {{ local {me} as {as_me}; neighbor {peer} as {as_peer}; {extra}\n\
             ttl security on; hold time 9; connect retry time 2;\n\
             ipv4 {{ import all; export all; }}; }}\n"
        )
    };
    let (k_net, u_net) = ("198.51.100.0/24", "192.0.2.0/24");
    std::fs::write(
        d.join("bird-k.conf"),
        conf(HOST, 65001, OURS, 65002, k_net, ""),
    )
    .unwrap();
    // No interface in its namespace: the peer is reached as one hop away.
    let u_conf = conf(OURS, 65002, HOST, 65001, u_net, "multihop 1;");
    std::fs::write(d.join("bird-u.conf"), u_conf).unwrap();
    let path = |f: &str| d.join(f).to_str().unwrap().to_string();
    let (k_ctl, u_ctl) = (path("bird-k.ctl"), path("bird-u.ctl"));
    let k_args = [
        "-f",
        "-c",
        &path("bird-k.conf"),
        "-s",
        &k_ctl,
        "-P",
        &path("bird-k.pid"),
    ];
    let _k = spawn_prog(d, None, "bird-linux", "bird", &k_args);
    let u_conf = path("bird-u.conf");
    let u_args = [
        "netns",
        "exec",
        ns,
        USNET,
        "run",
        "--stack",
        STACK,
        "--",
        "bird",
        "-f",
        "-c",
        &u_conf,
        "-s",
        &u_ctl,
        "-P",
        &path("bird-u.pid"),
    ];
    let _u = spawn_prog(d, None, "bird-usnet", "ip", &u_args);
    let birdc = |ctl: &str, q: &[&str]| {
        let mut a = vec!["-s", ctl];
        a.extend_from_slice(q);
        run("birdc", &a, Duration::from_secs(10)).stdout
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let k = birdc(&k_ctl, &["show", "route", u_net]);
        let u = birdc(&u_ctl, &["show", "route", k_net]);
        if k.contains("AS65002") && u.contains("AS65001") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no BGP session with TTL security: Linux's side {} usnet's side {}\n{}\n{}",
            birdc(&k_ctl, &["show", "protocols", "all", "peer"]),
            birdc(&u_ctl, &["show", "protocols", "all", "peer"]),
            log_of(d, "bird-linux"),
            log_of(d, "bird-usnet"),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// iputils `ping`, both families, in a network namespace whose only network is
/// usnet: it opens ICMP datagram sockets (`SOCK_DGRAM`, `IPPROTO_ICMP`), which the
/// stack carries, and sends each probe after a reply with `MSG_CONFIRM`. To a
/// host on the link that does not exist, ping and a connect hear of the failed
/// address resolution as on Linux.
fn ping(d: &Path) {
    need("ping", "iputils-ping");
    let ns = "usnt-ping";
    let _ns = empty_netns(ns);
    for (flag, to) in [("-4", HOST), ("-6", HOST6)] {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, USNET, "run", "--stack", STACK, "--"])
            .args(["ping", flag, "-c", "3", "-i", "0.2", "-W", "2", to])
            .env("USNET_RUN_DIR", d)
            .current_dir(d);
        let o = run_in(&mut c, &[], Duration::from_secs(30));
        assert!(
            o.ok() && o.stdout.contains("3 received") && o.stdout.contains("ttl=64"),
            "ping {flag} {to} through usnet: {}",
            o.describe()
        );
    }
    // A host on the link that never answers address resolution: each probe
    // comes back as host (address) unreachable from the stack itself, as Linux
    // reports a neighbour that failed; a connect fails with EHOSTUNREACH.
    for (flag, absent, ours, said) in [
        ("-4", "10.51.0.99", OURS, "Destination Host Unreachable"),
        (
            "-6",
            "fd51::99",
            OURS6,
            "Destination unreachable: Address unreachable",
        ),
    ] {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, USNET, "run", "--stack", STACK, "--"])
            .args(["ping", flag, "-c", "2", "-i", "0.2", "-W", "6", absent])
            .env("USNET_RUN_DIR", d)
            .current_dir(d);
        let o = run_in(&mut c, &[], Duration::from_secs(30));
        assert!(
            o.stdout.contains(&format!("From {ours} icmp_seq=1 {said}"))
                && o.stdout.contains("+2 errors"),
            "ping {flag} {absent} (no such host) through usnet: {}",
            o.describe()
        );
    }
    let host = "10.51.0.99";
    let script = format!(
        "import socket\ns = socket.socket()\ns.settimeout(60)\n\
         try:\n    s.connect(('{host}', 80))\nexcept OSError as e:\n    print(e.errno)"
    );
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, USNET, "run", "--stack", STACK, "--"])
        .args(["python3", "-c", &script])
        .env("USNET_RUN_DIR", d)
        .current_dir(d);
    let o = run_in(&mut c, &[], Duration::from_secs(90));
    assert!(
        o.stdout.trim() == libc::EHOSTUNREACH.to_string(),
        "connect to {host} (no such host) through usnet: {}",
        o.describe()
    );
}

/// traceroute (UDP probes) and tracepath, both families, in a network
/// namespace whose only network is usnet, to a host two hops away: Linux on the
/// TAP's other end routes (forwarding on for the two interfaces only) to a
/// namespace behind a veth. The first hop is known by the ICMP time exceeded
/// Linux sends, the last by the port unreachable, both read from the error
/// queue (`IP_RECVERR`, `MSG_ERRQUEUE`); tracepath learns the path MTU from the
/// EMSGSIZE of a probe too big for the link (`IP_PMTUDISC_PROBE`); ping with
/// a TTL of 1 reports the first hop's time exceeded for each probe.
fn traceroutes(d: &Path) {
    need("traceroute", "traceroute");
    need("tracepath", "iputils-tracepath");
    need("fping", "fping");
    need("mtr", "mtr-tiny");
    let (far, far6) = ("10.52.0.2", "fd52::2");
    let (ns, veth) = ("usnt-far", "usntfar0");
    let _ = run("ip", &["link", "del", veth], Duration::from_secs(10));
    let _ns = empty_netns(ns);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", veth]);
    ip(&[
        "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ]);
    ip(&["addr", "add", "10.52.0.1/24", "dev", veth]);
    ip(&["addr", "add", "fd52::1/64", "dev", veth, "nodad"]);
    ip(&["link", "set", veth, "up"]);
    ip(&["-n", ns, "addr", "add", &format!("{far}/24"), "dev", "eth0"]);
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{far6}/64"),
        "dev",
        "eth0",
        "nodad",
    ]);
    ip(&["-n", ns, "link", "set", "eth0", "up"]);
    ip(&["-n", ns, "route", "add", "default", "via", "10.52.0.1"]);
    ip(&["-n", ns, "-6", "route", "add", "default", "via", "fd52::1"]);
    // Forwarding between the two interfaces alone (IPv6's per-interface switch
    // is `force_forwarding`, Linux 6.17 on): the machine's own settings stay.
    let v6_forwarding =
        Path::new(&format!("/proc/sys/net/ipv6/conf/{TAP}/force_forwarding")).exists();
    for dev in [TAP, veth] {
        must(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{dev}.forwarding=1")],
        );
        if v6_forwarding {
            must(
                "sysctl",
                &["-qw", &format!("net.ipv6.conf.{dev}.force_forwarding=1")],
            );
        }
    }
    // Linux, the router here, rate-limits the ICMP errors it sends to one
    // destination (a burst of 6, then one a second for IPv4): the probes of
    // several programs in a row would see `*` for the first hop. Unlimited for
    // the test, the machine's values back after.
    for key in ["net.ipv4.icmp_ratelimit", "net.ipv6.icmp.ratelimit"] {
        let was = run("sysctl", &["-n", key], Duration::from_secs(10));
        let was = was.stdout.trim().to_string();
        if was.is_empty() {
            continue;
        }
        cleanup.on_drop(&["sysctl", "-qw", &format!("{key}={was}")]);
        must("sysctl", &["-qw", &format!("{key}=0")]);
    }
    let trace = |prog: &[&str]| in_usnet_only_netns(d, prog);
    let mut targets = vec![("-4", HOST, far)];
    if v6_forwarding {
        targets.push(("-6", HOST6, far6));
    } else {
        eprintln!("traceroute -6 skipped: this kernel has no IPv6 force_forwarding");
    }
    for (flag, hop1, to) in targets {
        // Linux's neighbours on the veth known first: a probe forwarded while
        // they resolve can be lost, which is not what this test is about.
        let _ = run(
            "ping",
            &[flag, "-c", "1", "-W", "2", to],
            Duration::from_secs(10),
        );
        // UDP probes (a socket each), errors read from the error queue; ICMP
        // probes (-I) on one raw socket, connected, its TTL set between probes
        // sent back to back, the time exceeded read from its error queue and
        // the echo replies as copies.
        for method in [None, Some("-I")] {
            let mut argv = vec!["traceroute", flag];
            argv.extend(method);
            argv.extend(["-n", "-q", "2", "-w", "3", "-m", "4", to]);
            let o = trace(&argv);
            // One line per hop after the header; a lost probe shows as `*`.
            let hops: Vec<String> = o.stdout.lines().skip(1).map(str::to_string).collect();
            let names = |line: &String, addr: &str| line.split_whitespace().any(|w| w == addr);
            assert!(
                o.ok() && hops.len() == 2 && names(&hops[0], hop1) && names(&hops[1], to),
                "{} through usnet: {}",
                argv.join(" "),
                o.describe()
            );
        }
        // fping on a raw ICMP socket; mtr, whose raw IP socket is refused, on
        // echo sockets.
        let o = trace(&["fping", flag, "-c", "2", "-p", "200", to]);
        assert!(
            o.ok() && o.stderr.contains("xmt/rcv/%loss = 2/2/0%"),
            "fping {flag} {to} through usnet: {}",
            o.describe()
        );
        let o = trace(&["mtr", flag, "-n", "-r", "-c", "2", "-m", "4", to]);
        let hop_lines: Vec<&str> = o.stdout.lines().filter(|l| l.contains(".|--")).collect();
        assert!(
            o.ok()
                && hop_lines.len() == 2
                && hop_lines[0].split_whitespace().any(|w| w == hop1)
                && hop_lines[1].split_whitespace().any(|w| w == to),
            "mtr {flag} {to} through usnet: {}",
            o.describe()
        );
        // ping reads the first hop's time exceeded from its echo socket's error
        // queue (each probe's, while its socket blocks in recvmsg).
        let o = trace(&["ping", flag, "-c", "2", "-t", "1", "-W", "3", to]);
        let said = if flag == "-4" {
            "Time to live exceeded"
        } else {
            "Time exceeded: Hop limit"
        };
        assert!(
            (1..=2).all(|k| o
                .stdout
                .contains(&format!("From {hop1} icmp_seq={k} {said}")))
                && o.stdout.contains("+2 errors"),
            "ping {flag} -t 1 {to} through usnet: {}",
            o.describe()
        );
        let o = trace(&["tracepath", flag, "-n", "-m", "4", to]);
        assert!(
            o.ok()
                && o.stdout.contains(&format!("1:  {hop1} "))
                && o.stdout.contains(&format!("2:  {to} "))
                && o.stdout.contains("reached")
                && o.stdout.contains("pmtu 1500"),
            "tracepath {flag} {to} through usnet: {}",
            o.describe()
        );
    }
}

/// `prog` under `usnet run` in a fresh network namespace whose only network is
/// the stack (`usnt-trace`, removed after).
fn in_usnet_only_netns(d: &Path, prog: &[&str]) -> Out {
    let _trial = empty_netns("usnt-trace");
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        "usnt-trace",
        USNET,
        "run",
        "--stack",
        STACK,
        "--",
    ])
    .args(prog)
    .env("USNET_RUN_DIR", d)
    .current_dir(d);
    run_in(&mut c, &[], Duration::from_secs(60))
}

/// Node's `os.networkInterfaces()` (getifaddrs) under the shim, in a namespace
/// whose only network is usnet: loopback and the stack's interface, named after
/// its TAP, with the stack's addresses; nothing of the host's.
fn interfaces(d: &Path) {
    need("node", "nodejs");
    let script = "const i = require('os').networkInterfaces(); \
                  for (const [n, as] of Object.entries(i)) \
                  for (const a of as) console.log(n, a.cidr, a.mac)";
    let o = in_usnet_only_netns(d, &["node", "-e", script]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        o.ok()
            && lines
                .iter()
                .any(|l| l.starts_with(&format!("{TAP} {OURS}/24 ")))
            && lines
                .iter()
                .any(|l| l.starts_with(&format!("{TAP} {OURS6}/64 ")))
            && lines
                .iter()
                .all(|l| l.starts_with(&format!("{TAP} ")) || l.starts_with("lo ")),
        "node's interfaces through usnet: {}",
        o.describe()
    );
}

/// `ip` reads rtnetlink through a socket of its own (as dnsmasq, avahi and Go's
/// `net.Interfaces` do): under `usnet run` that socket is the stack's interface
/// mirror's, so `ip addr` lists loopback and the stack's interface with the
/// stack's addresses, `ip route` the stack's default routes, and nothing of the
/// host's (whose TAP end has the same name and the Linux side's addresses). The
/// mirror is a namespace an admin can look at.
fn rtnetlink(d: &Path) {
    let o = shim(d, &["ip", "-o", "addr", "show"], &[], 10);
    let lines: Vec<&str> = o.stdout.lines().collect();
    // `ip -o` lines: "INDEX: NAME    inet ADDR/PREFIX ...".
    let on = |l: &str, name: &str| l.split_whitespace().nth(1) == Some(name);
    let has = |addr: &str| lines.iter().any(|l| on(l, TAP) && l.contains(addr));
    assert!(
        o.ok()
            && has(&format!("inet {OURS}/24 "))
            && has(&format!("inet6 {OURS6}/64 "))
            && lines.iter().any(|l| on(l, "lo"))
            && lines.iter().all(|l| on(l, "lo") || on(l, TAP))
            && !o.stdout.contains(&format!("{HOST}/24"))
            && !o.stdout.contains(&format!("{HOST6}/64")),
        "ip addr under usnet run: {}",
        o.describe()
    );
    for (family, gw) in [("-4", HOST), ("-6", HOST6)] {
        let o = shim(d, &["ip", family, "route", "show", "default"], &[], 10);
        assert!(
            o.ok() && o.stdout.contains(&format!("default via {gw} dev {TAP}")),
            "ip {family} route under usnet run: {}",
            o.describe()
        );
    }
    // /proc/net's interface files are the mirror's too (cat opens them): each
    // line of if_inet6 ends with its interface's name, each of dev after the
    // two heading lines begins with it.
    let ours = |name: &str| name == "lo" || name == TAP;
    let o = shim(d, &["cat", "/proc/net/if_inet6"], &[], 10);
    assert!(
        o.ok()
            && o.stdout.contains("fd510000000000000000000000000002")
            && !o.stdout.contains("fd510000000000000000000000000001")
            && o.stdout
                .lines()
                .all(|l| ours(l.split_whitespace().last().unwrap_or(""))),
        "/proc/net/if_inet6 under usnet run: {}",
        o.describe()
    );
    let o = shim(d, &["cat", "/proc/self/net/dev"], &[], 10);
    let names: Vec<&str> = o
        .stdout
        .lines()
        .skip(2)
        .map(|l| l.split(':').next().unwrap_or("").trim())
        .collect();
    assert!(
        o.ok() && names.contains(&TAP) && names.iter().all(|n| ours(n)),
        "/proc/self/net/dev under usnet run: {}",
        o.describe()
    );
    let ns = format!("usnet-{STACK}");
    let mut c = Command::new("ip");
    c.args(["-n", &ns, "-o", "addr", "show", "dev", TAP]);
    let o = run_in(&mut c, &[], Duration::from_secs(10));
    assert!(
        o.ok() && o.stdout.contains(&format!("inet {OURS}/24 ")),
        "ip -n {ns} addr: {}",
        o.describe()
    );
}

/// curl from Linux fetches `url` from the program `srv` under the shim: the
/// whole body, or a failure that says what curl and the program said.
fn serves_body(d: &Path, srv: &Bg, url: &str) {
    let o = Command::new("curl")
        .args(["-sS", "-g", "--max-time", "10", url])
        .output()
        .expect("curl");
    assert!(
        o.status.success() && o.stdout == body(),
        "{} {url}: {} ({} bytes) {}",
        srv.1,
        String::from_utf8_lossy(&o.stderr),
        o.stdout.len(),
        log_of(d, srv.1)
    );
}

fn openssl(d: &Path) {
    need("openssl", "openssl");
    let (key, crt) = (d.join("tls.key"), d.join("tls.crt"));
    must(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            crt.to_str().unwrap(),
            "-days",
            "1",
            "-subj",
            "/CN=usnet",
        ],
    );
    let server = |accept: String| -> Vec<String> {
        vec![
            "openssl".into(),
            "s_server".into(),
            "-accept".into(),
            accept,
            "-cert".into(),
            crt.to_str().unwrap().into(),
            "-key".into(),
            key.to_str().unwrap().into(),
            "-naccept".into(),
            "1".into(),
            "-rev".into(),
        ]
    };
    for (shimmed_server, addr) in [
        (true, format!("{OURS}:14433")),
        (false, format!("{HOST}:14434")),
    ] {
        let args = server(addr.clone());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut srv = spawn_prog(
            d,
            shimmed_server.then_some(STACK),
            if shimmed_server {
                "s_server-usnet"
            } else {
                "s_server-linux"
            },
            args[0],
            &args[1..],
        );
        wait_log(&mut srv, d, "ACCEPT");
        // The line, then a pause for the answer before the end of input closes.
        let line = format!(
            "(printf 'hello tls\\n'; sleep 2) | openssl s_client -connect {addr} -quiet -no_ign_eof"
        );
        let cli = ["sh", "-c", line.as_str()];
        let o = if shimmed_server {
            run_in(
                Command::new(cli[0]).args(&cli[1..]),
                &[],
                Duration::from_secs(15),
            )
        } else {
            shim(d, &cli, &[], 15)
        };
        assert!(
            o.stdout.contains("slt olleh"),
            "openssl (server under usnet run: {shimmed_server}): {}",
            o.describe()
        );
    }
}

fn fetchers(d: &Path) {
    need("wget", "wget");
    for url in [
        format!("http://{HOST}:18099/f"),
        format!("http://[{HOST6}]:18098/f"),
    ] {
        let o = shim(d, &["wget", "-q", "-O", "wget.out", &url], &[], 30);
        assert!(o.ok(), "wget {url}: {}", o.describe());
        assert!(
            std::fs::read(d.join("wget.out")).unwrap() == body(),
            "wget {url}: the body differs"
        );
        let o = shim(d, &["curl", "-sS", "-g", "-o", "curl.out", &url], &[], 30);
        assert!(o.ok(), "curl {url}: {}", o.describe());
        assert!(
            std::fs::read(d.join("curl.out")).unwrap() == body(),
            "curl {url}: the body differs"
        );
    }
}

/// A root process without `CAP_DAC_OVERRIDE` (ping after it drops its capabilities,
/// a service with a bounded capability set) attaches: the stack admits root by its
/// peer credentials, and the control socket's mode no longer shuts it out (before,
/// the socket was 0600 and owned by the stack's user, and such a process got
/// EACCES at connect, so every socket call failed with ENETDOWN).
fn root_without_dac_override(d: &Path) {
    need("setpriv", "util-linux");
    let url = format!("http://{HOST}:18099/f");
    let mut c = Command::new("setpriv");
    c.args(["--bounding-set", "-dac_override,-dac_read_search", "--"])
        .args([USNET, "run", "--stack", STACK, "--"])
        .args(["curl", "-sS", "-o", "capped.out", &url])
        .env("USNET_RUN_DIR", d)
        .current_dir(d);
    let o = run_in(&mut c, &[], Duration::from_secs(30));
    assert!(
        o.ok(),
        "curl as root without CAP_DAC_OVERRIDE: {}",
        o.describe()
    );
    assert!(std::fs::read(d.join("capped.out")).unwrap() == body());
}

fn iperf3_udp(d: &Path) {
    need("iperf3", "iperf3");
    let mut srv = spawn_prog(
        d,
        None,
        "iperf3-udp-server",
        "iperf3",
        &["-s", "-1", "--forceflush", "-B", HOST, "-p", "15299"],
    );
    wait_log(&mut srv, d, "Server listening");
    let o = shim(
        d,
        &[
            "iperf3", "-u", "-c", HOST, "-p", "15299", "-t", "2", "-b", "20M", "-J",
        ],
        &[],
        30,
    );
    assert!(o.ok(), "iperf3 -u under usnet run: {}", o.describe());
    let j: serde_json::Value = serde_json::from_str(&o.stdout).expect("iperf3 JSON");
    let sent = j["end"]["sum"]["packets"].as_u64().unwrap_or(0);
    assert!(sent > 1000, "iperf3 -u sent {sent} datagrams: {}", o.stdout);
}

fn static_program(d: &Path) {
    let prog = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(prog) = prog else {
        return;
    };
    // Under the seccomp supervisor (the default for it): it runs and ends as on
    // the kernel.
    let o = shim(d, &[prog, "--version"], &[], 10);
    assert!(
        o.ok() && o.stdout.contains("ldconfig"),
        "a static program under usnet run's supervisor: {}",
        o.describe()
    );
    // With the shim only, it stays on the kernel, and usnet run says so.
    let mut c = Command::new(USNET);
    c.args([
        "run",
        "--stack",
        STACK,
        "--via",
        "preload",
        "--",
        prog,
        "--version",
    ])
    .env("USNET_RUN_DIR", d)
    .current_dir(d);
    let o = run_in(&mut c, &[], Duration::from_secs(10));
    assert!(
        o.stderr.contains("statically linked"),
        "usnet run --via preload says a static program stays on the kernel: {}",
        o.describe()
    );
}

#[test]
fn programs_nobody_tuned_for_usnet_run_unchanged() {
    require_root!();
    need("curl", "curl");
    need("socat", "socat");
    remove_leftovers(&[TAP], &[]);
    let mut cleanup = Cleanup::default();
    cleanup.on_drop(&["ip", "link", "del", TAP]);
    let dir = TempDir::new("compat");
    let d = dir.path();
    // Workers that drop to another user read the files and the run directory.
    must("chmod", &["755", d.to_str().unwrap()]);
    std::fs::create_dir_all(d.join("www")).unwrap();
    std::fs::write(d.join("www/f"), body()).unwrap();
    // PostgreSQL runs as its own user, whom the stack admits by group.
    let pg_gid = usnet_bench::preload::postgres_gid();
    let (ours, ours6) = (format!("{OURS}/24"), format!("{OURS6}/64"));
    let (host, host6) = (format!("{HOST}/24"), format!("{HOST6}/64"));
    let link = format!("tap:{TAP}");
    let mut args = vec![
        "--link",
        &link,
        "--addr",
        &ours,
        "--addr",
        &ours6,
        "--host-addr",
        &host,
        "--host-addr",
        &host6,
        // Linux routes what is not on the link (`traceroutes`).
        "--gateway",
        HOST,
        "--gateway",
        HOST6,
    ];
    if let Some(g) = &pg_gid {
        args.extend(["--group", g.as_str()]);
    }
    let _stack = Daemon::start(d, STACK, &args);
    // Linux's web servers for the clients under test, IPv4 and IPv6.
    let www = d.join("www");
    let www = www.to_str().unwrap();
    let mut py4 = spawn_prog(
        d,
        None,
        "linux-http4",
        "python3",
        &["-m", "http.server", "18099", "--bind", HOST, "-d", www],
    );
    wait_listening(&mut py4, d, HOST, 18099);
    let mut py6 = spawn_prog(
        d,
        None,
        "linux-http6",
        "python3",
        &["-m", "http.server", "18098", "--bind", HOST6, "-d", www],
    );
    wait_listening(&mut py6, d, &format!("[{HOST6}]"), 18098);

    java(d);
    node(d);
    python_asyncio(d);
    nginx(d);
    openssh(d);
    socket_activation(d);
    shell(d);
    git_daemon(d);
    openssl(d);
    postgres(d);
    dnsmasq(d);
    unbound(d);
    haproxy(d);
    squid_workers(d);
    memcached(d);
    lighttpd(d);
    vsftpd(d);
    bird(d);
    fetchers(d);
    root_without_dac_override(d);
    ping(d);
    traceroutes(d);
    interfaces(d);
    rtnetlink(d);
    iperf3_udp(d);
    static_program(d);
}
