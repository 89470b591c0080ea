//! `usnet run -- CMD`: runs an unmodified program with its AF_INET/AF_INET6 sockets on
//! a usnet stack server, through the LD_PRELOAD shim (`libusnet_preload.so`,
//! crates/usnet-preload; docs/preload.md), or, for a program the shim cannot reach
//! (statically linked, Go), through the seccomp supervisor (crates/usnet-seccomp;
//! docs/seccomp.md).

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
    /// How the program's calls reach usnet: `preload` (the LD_PRELOAD shim), `seccomp`
    /// (a supervisor that answers the program's socket calls; any program, at the
    /// cost of a relay), or `auto`: the shim, unless the program is statically
    /// linked or a Go program.
    #[arg(long, value_enum, default_value = "auto")]
    via: Via,
    /// On a sharded stack server (`usnet up --shards N`), live on this shard
    /// (modulo N) rather than the next in turn (USNET_SHARD). Its forked children
    /// that inherit only listeners still spread from there.
    #[arg(long)]
    shard: Option<u32>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    cmd: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Via {
    Auto,
    Preload,
    Seccomp,
}

/// What `LD_PRELOAD` names: `USNET_PRELOAD_LIB` if set; else the shim by its bare
/// name while the loader's trusted copy (`usnet shim install`) is this build's, so
/// programs in the loader's secure mode get it too; else this build's by its path.
fn preload_entry() -> Result<std::ffi::OsString, String> {
    if let Some(p) = std::env::var_os("USNET_PRELOAD_LIB") {
        return Ok(p);
    }
    let built = built_shim()?;
    if crate::shim::trusted_path().is_ok_and(|t| crate::shim::trusted_copy_current(&t, &built)) {
        return Ok(crate::shim::SHIM_NAME.into());
    }
    Ok(built.into_os_string())
}

/// This build's shim: next to this executable (cargo puts both in
/// target/<profile>/), else in ../lib beside it (an installed layout).
pub fn built_shim() -> Result<PathBuf, String> {
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

/// The program `cmd` names: a path, or the first match in `PATH`.
fn program_path(cmd: &str) -> Option<PathBuf> {
    usnet_posix::secure_exec::find_program(std::path::Path::new(cmd))
}

/// Why the shim could not reach a program's sockets, if it cannot: a statically
/// linked executable (no dynamic loader reads `LD_PRELOAD`), or a Go program (its
/// runtime makes the system calls itself, not through libc). Scripts and other
/// files are not judged (their interpreter is).
fn out_of_reach(path: &std::path::Path) -> Option<String> {
    use object::Object;
    let bytes = std::fs::read(path).ok()?;
    let file = object::File::parse(&*bytes).ok()?;
    let dynamic = match &file {
        object::File::Elf64(e) => program_has_interp(e.elf_program_headers(), e.endian()),
        object::File::Elf32(e) => program_has_interp(e.elf_program_headers(), e.endian()),
        _ => return None,
    };
    let go = file.section_by_name(".go.buildinfo").is_some()
        || file.section_by_name(".note.go.buildid").is_some();
    let name = path.display();
    if go {
        Some(format!(
            "usnet run: {name} is a Go program: Go makes its system calls itself, past any LD_PRELOAD shim, so its sockets stay on the kernel (leave out --via preload to use the seccomp supervisor)"
        ))
    } else if !dynamic {
        Some(format!(
            "usnet run: {name} is statically linked: no LD_PRELOAD shim can reach it, so its sockets stay on the kernel (leave out --via preload to use the seccomp supervisor)"
        ))
    } else {
        None
    }
}

/// Runs the program under the seccomp supervisor, which stays its parent, and
/// ends as the program did (its exit code, or the signal that ended it).
fn supervise(a: &RunArgs) -> CmdResult {
    if let Some(k) = a.shard {
        std::env::set_var("USNET_SHARD", k.to_string());
    }
    if let Err(e) = usnet_posix::attach(a.stack.as_deref()) {
        if !a.fallback_kernel {
            return Err(format!(
                "cannot attach to the stack: errno {}; or add --fallback-kernel to leave the program on the kernel",
                e.0
            )
            .into());
        }
        let e = Command::new(&a.cmd[0]).args(&a.cmd[1..]).exec();
        return Err(format!("cannot run {}: {e}", a.cmd[0]).into());
    }
    let mut c = Command::new(&a.cmd[0]);
    c.args(&a.cmd[1..]);
    let opts = usnet_seccomp::Options {
        loopback_usnet: a.loopback_usnet,
        debug: a.debug,
    };
    let status =
        usnet_seccomp::run(c, opts).map_err(|e| format!("cannot run {}: {e}", a.cmd[0]))?;
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        // SAFETY: back to the default action, then the same signal to ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    std::process::exit(status.code().unwrap_or(1));
}

fn program_has_interp<P: object::read::elf::ProgramHeader>(
    headers: &[P],
    endian: P::Endian,
) -> bool {
    headers
        .iter()
        .any(|h| h.p_type(endian) == object::elf::PT_INTERP)
}

pub fn run(a: RunArgs) -> CmdResult {
    // A stack that is not there would make every socket of the program fail with
    // ENETDOWN, long after it started: say so now, in one line.
    if !a.fallback_kernel {
        let name = a
            .stack
            .clone()
            .or_else(|| std::env::var("USNET_STACK").ok());
        let hint = "or add --fallback-kernel to leave the program on the kernel";
        let p = usnet_session::ctl::resolve(name.as_deref()).map_err(|e| format!("{e}; {hint}"))?;
        if std::os::unix::net::UnixStream::connect(&p).is_err() {
            return Err(format!(
                "the stack at {} does not answer (is its `usnet up` still running?); {hint}",
                p.display()
            )
            .into());
        }
    }
    let program = program_path(&a.cmd[0]);
    let out_of_reach = program.as_deref().and_then(out_of_reach);
    match (a.via, out_of_reach) {
        (Via::Seccomp, _) | (Via::Auto, Some(_)) => return supervise(&a),
        (Via::Preload, Some(why)) => eprintln!("{why}"),
        _ => {}
    }
    let mut preload = preload_entry()?;
    let by_name = preload == crate::shim::SHIM_NAME;
    if let Some(why) = program
        .filter(|_| !by_name)
        .and_then(|p| usnet_posix::secure_exec::reason(&p))
    {
        eprintln!(
            "usnet run: {} starts in the dynamic loader's secure mode ({why}), which ignores a preload path: its sockets stay on the kernel unless the shim is installed where the loader takes it (`usnet shim install`, as root)",
            a.cmd[0]
        );
    }
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
    if let Some(k) = a.shard {
        c.env("USNET_SHARD", k.to_string());
    }
    if a.loopback_usnet {
        c.env("USNET_LOOPBACK", "usnet");
    }
    if a.debug {
        c.env("USNET_DEBUG", "1");
    }
    // A process that changes its uid (a server's workers) still looks for the stack
    // where this one found it.
    if std::env::var_os("USNET_RUN_DIR").is_none() {
        c.env("USNET_RUN_DIR", usnet_session::ctl::run_dir());
    }
    // exec only returns on failure.
    let e = c.exec();
    Err(format!("cannot run {}: {e}", a.cmd[0]).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_is_in_reach_and_a_static_one_is_not() {
        let sh = program_path("sh").expect("sh in PATH");
        assert_eq!(out_of_reach(&sh), None, "{}", sh.display());
        // This test binary is dynamically linked too.
        let me = std::env::current_exe().unwrap();
        assert_eq!(out_of_reach(&me), None);
        // A static one: build it if a C compiler and a static libc are there.
        let dir = std::env::temp_dir().join(format!("usnet-run-static-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("s.c");
        std::fs::write(&src, "int main(void){return 0;}\n").unwrap();
        let exe = dir.join("s");
        let built = std::process::Command::new("cc")
            .args(["-static", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .is_ok_and(|s| s.success());
        if built {
            let why = out_of_reach(&exe).expect("a static program is out of reach");
            assert!(why.contains("statically linked"), "{why}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
