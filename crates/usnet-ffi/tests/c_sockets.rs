//! The C socket API (`usnet_*` in include/usnet.h) from C programs in other
//! processes, against a stack server in this process: the source document's
//! write_server and read_client built against usnet (and against the kernel, by one
//! switch), and a program that checks socket semantics, whose output must be the same
//! on the kernel and on usnet.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use common::{compile, output_within};
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

const ADDR: &str = "10.68.0.1";
const STACK: &str = "c-sockets";

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One server for the whole file (tests of a file run in one process).
fn server() -> &'static (usnet_server::ServerHandle, Dir) {
    static S: std::sync::OnceLock<(usnet_server::ServerHandle, Dir)> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("usnet-c-sockets-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server or any child reads it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
        let stack = StackConfig {
            mac: mac_from_seed(21),
            addrs: vec![format!("{ADDR}/24").parse().unwrap()],
            mtu: 65535 - 28,
            ..Default::default()
        };
        let cfg = ServerConfig {
            name: STACK.into(),
            link: "mem".into(),
            ..Default::default()
        };
        (
            usnet_server::testing::in_memory(stack, cfg).unwrap(),
            Dir(d),
        )
    })
}

fn bin(name: &str, usnet: bool) -> PathBuf {
    let out = std::env::temp_dir().join(format!(
        "usnet-c-{name}-{}-{}",
        if usnet { "usnet" } else { "kernel" },
        std::process::id()
    ));
    compile(name, if usnet { &["-DUSE_USNET"] } else { &[] }, &out);
    out
}

fn run(bin: &PathBuf, args: &[&str]) -> Output {
    let o = output_within(
        Command::new(bin).args(args).env("USNET_STACK", STACK),
        Duration::from_secs(60),
    );
    eprintln!(
        "{} {args:?}:\n{}{}",
        bin.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn field(out: &Output, key: &str) -> u64 {
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.split('.').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {s}"))
}

/// write_server → read_client through the stack server, both built against usnet;
/// then the same pair built against the kernel on loopback.
#[test]
fn write_server_and_read_client_on_usnet_and_on_the_kernel() {
    server();
    for (usnet, addr, port) in [(true, ADDR, "7400"), (false, "127.0.0.1", "0")] {
        let port = if port == "0" {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port().to_string()
        } else {
            port.to_string()
        };
        let ws = bin("write_server", usnet);
        let rc = bin("read_client", usnet);
        let (ws2, addr2, port2) = (ws.clone(), addr.to_string(), port.clone());
        let w = std::thread::spawn(move || run(&ws2, &[&addr2, &port2, "16384", "0.5"]));
        let r = run(&rc, &[addr, &port, "16384"]);
        let w = w.join().unwrap();
        assert!(r.status.success() && w.status.success(), "usnet={usnet}");
        let (sent, got) = (field(&w, "bytes"), field(&r, "bytes"));
        assert!(sent > 0, "usnet={usnet}: nothing sent");
        assert_eq!(sent, got, "usnet={usnet}: bytes written and read differ");
        let stack = if usnet { "stack=usnet" } else { "stack=kernel" };
        assert!(String::from_utf8_lossy(&r.stdout).contains(stack));
        let _ = std::fs::remove_file(ws);
        let _ = std::fs::remove_file(rc);
    }
}

/// The same checks of socket semantics (errno values, non-blocking connect and
/// SO_ERROR, poll and epoll over a pipe and a socket, end of stream, EBADF, fcntl)
/// print the same lines on the kernel and on usnet.
#[test]
fn socket_semantics_match_the_kernel() {
    server();
    let k = bin("sockets_errno", false);
    let u = bin("sockets_errno", true);
    // PORT+1 must be closed on loopback too, and PORT+10..PORT+14 free.
    let port = common::free_port_block(16);
    let ko = run(&k, &["127.0.0.1", &port.to_string()]);
    let uo = run(&u, &[ADDR, "7500"]);
    let (ks, us) = (
        String::from_utf8_lossy(&ko.stdout).to_string(),
        String::from_utf8_lossy(&uo.stdout).to_string(),
    );
    assert!(
        ko.status.success() && ks.ends_with("all ok\n"),
        "kernel: {ks}"
    );
    assert_eq!(us, ks, "usnet's output differs from the kernel's");
    assert!(uo.status.success());
    let _ = std::fs::remove_file(k);
    let _ = std::fs::remove_file(u);
}
