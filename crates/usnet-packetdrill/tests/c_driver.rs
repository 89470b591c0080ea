//! Builds `tests/c/driver.c` with the system C compiler and runs it against this
//! crate's `libusnet_packetdrill.so`: the driver loads the library exactly as
//! packetdrill's `--so_filename` mode does and plays handshake / data / close
//! conversations through the function pointers, checking every byte.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `cmd.output()` with a deadline: a compiler or program that hangs fails the test
/// after `timeout` (killed) instead of hanging it.
fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
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

/// `target/<profile>/libusnet_packetdrill.so`, built by cargo with this test.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    // target/<profile>/deps/c_driver-<hash>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let lib = profile_dir.join("libusnet_packetdrill.so");
    assert!(
        lib.exists(),
        "{} missing: build it with `cargo build -p usnet-packetdrill`",
        lib.display()
    );
    lib
}

#[test]
fn c_driver_plays_handshake_data_and_close() {
    let have_cc = Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|mut c| {
            let end = Instant::now() + Duration::from_secs(30);
            while let Ok(None) = c.try_wait() {
                if Instant::now() >= end {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
        .is_ok();
    if !have_cc {
        eprintln!("SKIP: no C compiler (cc)");
        return;
    }
    let lib = library();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/driver.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("usnet-packetdrill-driver");
    let cc = output_within(
        Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-ldl"),
        Duration::from_secs(120),
    );
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = output_within(Command::new(&out).arg(&lib), Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(run.status.success(), "driver failed: {stdout}{stderr}");
    assert!(stdout.contains("driver: ok"));
}
