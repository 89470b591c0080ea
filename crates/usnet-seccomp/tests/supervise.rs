//! Statically linked programs under the supervisor against a stack server in this
//! process (no root).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

const ADDR: &str = "10.73.0.1";

fn stack() {
    static S: OnceLock<(usnet_server::ServerHandle, PathBuf)> = OnceLock::new();
    S.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("usnet-seccomp-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server and the client read it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
        unsafe { std::env::set_var("USNET_STACK", "seccomp-test") };
        let stack = StackConfig {
            mac: mac_from_seed(25),
            addrs: vec![format!("{ADDR}/24").parse().unwrap()],
            ..Default::default()
        };
        let cfg = ServerConfig {
            name: "seccomp-test".into(),
            link: "mem".into(),
            // The interface mirror needs root (network namespaces).
            mirror: root(),
            ..Default::default()
        };
        (usnet_server::testing::in_memory(stack, cfg).unwrap(), d)
    });
}

fn root() -> bool {
    // SAFETY: a plain query.
    unsafe { libc::geteuid() == 0 }
}

/// `prog` under timeout(1): a lost packet ends the test at the deadline, not never.
fn deadline(prog: &std::path::Path) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", "60"]).arg(prog);
    c
}

fn static_program(src: &str) -> Option<PathBuf> {
    let out = std::env::temp_dir().join(format!("usnet-seccomp-prog-{}", std::process::id()));
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(src);
    let ok = Command::new("cc")
        .args(["-static", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(out)
}

#[test]
fn a_static_program_talks_to_itself_over_usnet() {
    stack();
    let Some(prog) = static_program("selfconn.c") else {
        eprintln!("skipped: no static libc to build with");
        return;
    };
    let mut cmd = deadline(&prog);
    cmd.arg(ADDR);
    let out_path = std::env::temp_dir().join(format!("usnet-seccomp-out-{}", std::process::id()));
    cmd.stdout(std::fs::File::create(&out_path).unwrap());
    let status = usnet_seccomp::run(
        cmd,
        usnet_seccomp::Options {
            debug: true,
            ..Default::default()
        },
    )
    .unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    eprintln!("{out}");
    assert!(status.success(), "{status:?}");
    let kernel = deadline(&prog).arg("127.0.0.1").output().unwrap();
    assert_eq!(out, String::from_utf8_lossy(&kernel.stdout));
}

/// A Go program, built static (CGO_ENABLED=0), if a Go toolchain is here.
fn go_program() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goprog");
    let out = std::env::temp_dir().join(format!("usnet-seccomp-go-{}", std::process::id()));
    let go = ["go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .find(|g| {
            Command::new(g)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })?;
    let ok = Command::new(go)
        .current_dir(&dir)
        .env("CGO_ENABLED", "0")
        .env(
            "GOCACHE",
            std::env::temp_dir().join("usnet-seccomp-gocache"),
        )
        .env("GOPATH", std::env::temp_dir().join("usnet-seccomp-gopath"))
        .args(["build", "-o"])
        .arg(&out)
        .arg("main.go")
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(out)
}

#[test]
fn a_go_program_talks_to_itself_over_usnet() {
    stack();
    let Some(prog) = go_program() else {
        eprintln!("skipped: no Go toolchain");
        return;
    };
    let out_path = std::env::temp_dir().join(format!("usnet-seccomp-goout-{}", std::process::id()));
    let mut cmd = deadline(&prog);
    cmd.arg(ADDR)
        .stdout(std::fs::File::create(&out_path).unwrap());
    let status = usnet_seccomp::run(cmd, usnet_seccomp::Options::default()).unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    eprintln!("{out}");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        out,
        format!("dialed {ADDR}:7811\ntcp: \"echo hello from go\" <nil>\nudp: \"ping\" from our dialer: true <nil>\nudp back: \"pong\" <nil>\n")
    );
}

/// Go's `net.Interfaces` reads rtnetlink through a socket of its own: under the
/// supervisor that socket is the stack's mirror's (root only), so the program is
/// told of loopback and the stack's interface with the stack's address, and of
/// none of the host's.
#[test]
fn a_go_program_lists_the_stacks_interface() {
    if !root() {
        eprintln!("skipped: the interface mirror needs root");
        return;
    }
    stack();
    let Some(prog) = go_program() else {
        eprintln!("skipped: no Go toolchain");
        return;
    };
    let out_path = std::env::temp_dir().join(format!("usnet-seccomp-goif-{}", std::process::id()));
    let mut cmd = deadline(&prog);
    cmd.arg("interfaces")
        .stdout(std::fs::File::create(&out_path).unwrap());
    let status = usnet_seccomp::run(cmd, usnet_seccomp::Options::default()).unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    assert!(status.success(), "{status:?}: {out}");
    let mac = mac_from_seed(25).0.map(|b| format!("{b:02x}")).join(":");
    // Index, name, MTU, MAC, address: the stack's (an interface without a
    // kernel device has index 0x7fff0000, as `if_nametoindex` says under the shim).
    let (index, cidr) = (0x7fff_0000u32.to_string(), format!("{ADDR}/24"));
    let lines: Vec<&str> = out.lines().collect();
    let ours = |l: &&str| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() == 5 && f[0] == index && f[1] == "usnet0" && f[3] == mac && f[4] == cidr
    };
    assert!(
        lines.iter().any(ours),
        "no {index} usnet0 _ {mac} {cidr} in {out}"
    );
    assert!(lines.iter().any(|l| l.starts_with("1 lo ")), "{out}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("1 lo ") || l.contains(" usnet0 ")),
        "only loopback and the stack's interface: {out}"
    );
    // The test's server lives until the process ends, so its mirror would outlive
    // it: no other test here asks for one.
    usnet_server::mirror::remove("seccomp-test");
}
