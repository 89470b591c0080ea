//! Compile `examples/c/async_syscall.c` against `include/usnet.h` and the
//! shared library (libusnet.so), run it on a file, check it succeeds.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{find_lib_dir, output_within};

#[test]
fn c_example_reads_file_through_ring() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some(lib_dir) = find_lib_dir() else {
        panic!("libusnet.so not found next to the test binary; build the crate first");
    };
    let out = std::env::temp_dir().join(format!("usnet-async-c-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = output_within(
        Command::new(&cc)
            .arg("-std=c11")
            .arg("-Wall")
            .arg("-Werror")
            .arg("-I")
            .arg(root.join("include"))
            .arg(root.join("examples/c/async_syscall.c"))
            .arg("-L")
            .arg(&lib_dir)
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .args(["-lusnet", "-o"])
            .arg(&out),
        Duration::from_secs(120),
    )
    .status;
    assert!(st.success(), "C example failed to compile");
    let data_path = std::env::temp_dir().join(format!("usnet-async-c-data-{}", std::process::id()));
    let data: Vec<u8> = (0..200_003u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&data_path, &data).unwrap();
    let o = output_within(Command::new(&out).arg(&data_path), Duration::from_secs(60));
    let _ = std::fs::remove_file(&data_path);
    let _ = std::fs::remove_file(&out);
    eprintln!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "C example failed");
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("ok: read 200003 bytes"));
}
