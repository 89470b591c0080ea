//! Builds `tests/c/driver.c` with the system C compiler and runs it against this
//! crate's `libusnet_packetdrill.so`: the driver loads the library exactly as
//! packetdrill's `--so_filename` mode does and plays handshake / data / close
//! conversations through the function pointers, checking every byte.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIP: no C compiler (cc)");
        return;
    }
    let lib = library();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/driver.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("usnet-packetdrill-driver");
    let cc = Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&out).arg(&lib).output().expect("run driver");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(run.status.success(), "driver failed: {stdout}{stderr}");
    assert!(stdout.contains("driver: ok"));
}
