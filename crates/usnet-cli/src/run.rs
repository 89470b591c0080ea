//! `usnet run -- CMD`: runs an unmodified program with its AF_INET/AF_INET6 sockets on
//! a usnet stack server, through the LD_PRELOAD shim (`libusnet_preload.so`,
//! crates/usnet-preload; docs/preload.md).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::CmdResult;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The stack server to use (default: USNET_STACK, or the only one running).
    #[arg(long)]
    stack: Option<String>,
    /// If no stack server can be reached, the program's sockets use the kernel instead
    /// of failing with ENETDOWN.
    #[arg(long)]
    fallback_kernel: bool,
    /// Loopback addresses go to usnet too (by default a socket bound or connected to
    /// 127.0.0.0/8 or ::1 stays on the kernel).
    #[arg(long)]
    loopback_usnet: bool,
    /// Print a line for each call the shim does not support.
    #[arg(long)]
    debug: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<String>,
}

/// The shim: `USNET_PRELOAD_LIB`, else next to this executable (cargo puts both in
/// target/<profile>/), else in ../lib beside it (an installed layout).
fn shim() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("USNET_PRELOAD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let dir = exe.parent().ok_or("this executable has no directory")?;
    [
        dir.join("libusnet_preload.so"),
        dir.join("../lib/libusnet_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .ok_or_else(|| {
        format!(
            "libusnet_preload.so is not next to {} (build it with `cargo build --release -p usnet-preload`, or name it in USNET_PRELOAD_LIB)",
            exe.display()
        )
    })
}

pub fn run(a: RunArgs) -> CmdResult {
    let lib = shim()?;
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let mut c = Command::new(&a.cmd[0]);
    c.args(&a.cmd[1..]).env("LD_PRELOAD", preload);
    if let Some(s) = &a.stack {
        c.env("USNET_STACK", s);
    }
    if a.fallback_kernel {
        c.env("USNET_FALLBACK", "kernel");
    }
    if a.loopback_usnet {
        c.env("USNET_LOOPBACK", "usnet");
    }
    if a.debug {
        c.env("USNET_DEBUG", "1");
    }
    // exec only returns on failure.
    let e = c.exec();
    Err(format!("cannot run {}: {e}", a.cmd[0]).into())
}
