//! Helpers of the C tests: run a command with a deadline, find libusnet.so, compile
//! an example.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `cmd.output()` with a deadline: a compiler or program that hangs fails the test
/// after `timeout` (killed) instead of hanging it.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let so = pipe(Box::new(child.stdout.take().unwrap()));
    let se = pipe(Box::new(child.stderr.take().unwrap()));
    let end = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            panic!("{cmd:?} still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The program has exited and started nothing that keeps its pipes open, so both
    // readers are at EOF; still, wait for them with a deadline.
    let take = |h: std::thread::JoinHandle<Vec<u8>>| {
        let end = Instant::now() + Duration::from_secs(10);
        while !h.is_finished() {
            assert!(
                Instant::now() < end,
                "{cmd:?}: output still open after exit"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        h.join().unwrap()
    };
    Output {
        status,
        stdout: take(so),
        stderr: take(se),
    }
}

pub fn find_lib_dir() -> Option<PathBuf> {
    // The test binary is target/<profile>/deps/<name>; cargo leaves the
    // cdylib in deps/ (and uplifts it to target/<profile>/ on plain builds).
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.to_path_buf(), deps.parent()?.to_path_buf()]
        .into_iter()
        .find(|d| d.join("libusnet.so").exists())
}

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compiles `examples/c/<name>.c` (with `defines`, e.g. `-DUSE_USNET`) against
/// include/usnet.h and libusnet.so into `out`.
pub fn compile(name: &str, defines: &[&str], out: &Path) {
    let root = root();
    let lib_dir = find_lib_dir()
        .expect("libusnet.so not found next to the test binary; build the crate first");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = output_within(
        Command::new(&cc)
            .args(["-std=gnu11", "-O2", "-Wall", "-Werror"])
            .args(defines)
            .arg("-I")
            .arg(root.join("include"))
            .arg("-I")
            .arg(root.join("examples/c"))
            .arg(root.join(format!("examples/c/{name}.c")))
            .arg("-L")
            .arg(&lib_dir)
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            // DT_RPATH, not DT_RUNPATH: cargo's LD_LIBRARY_PATH for tests also names
            // target/<profile>/, whose uplifted libusnet.so is only as new as the
            // last `cargo build`, and would win over a RUNPATH.
            .arg("-Wl,--disable-new-dtags")
            .args(["-lusnet", "-o"])
            .arg(out),
        Duration::from_secs(120),
    );
    assert!(
        o.status.success(),
        "{name}.c failed to compile: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A loopback port P with P..P+span free for TCP and UDP, below the kernel's
/// ephemeral range (32768 and up), so no connection of a test running beside this one
/// takes one of them while the C program uses them (the semantics program binds
/// PORT+1 to PORT+14).
pub fn free_port_block(span: u16) -> u16 {
    let seed = std::process::id() as u64;
    for k in 0..500u64 {
        let p = 20000 + ((seed * 37 + k * 101) % 12000) as u16;
        let free = (p..=p + span).all(|q| {
            std::net::TcpListener::bind(("127.0.0.1", q)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", q)).is_ok()
        });
        if free {
            return p;
        }
    }
    panic!("no free block of {span} loopback ports below 32768");
}
