//! `usnet shim [status|install|remove]`: the shim where the dynamic loader takes it
//! even in its secure mode.
//!
//! A program starts in the loader's secure mode (`AT_SECURE`) when it gains or keeps
//! other privileges at `exec`: a set-user-ID or set-group-ID program, one with file
//! capabilities, or any program exec'd by a process whose effective uid or gid is not
//! its real one (squid's workers, exec'd by a root master that runs as `proxy`). The
//! loader then ignores every `LD_PRELOAD` entry with a `/` in it, so the program's
//! sockets would be the kernel's. It still preloads a bare name found in its system
//! search path, if that file has the set-user-ID bit (glibc's rule for exactly this
//! case; VirtualGL and OpenOnload install their preload libraries this way).
//! `usnet shim install` copies the shim there, root's and mode 4755; `usnet run`
//! then preloads it by its bare name while that copy is the one it ships with.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::CmdResult;

pub use usnet_posix::secure_exec::SHIM_FILE as SHIM_NAME;

#[derive(clap::Args)]
pub struct ShimArgs {
    #[command(subcommand)]
    what: Option<ShimCmd>,
}

#[derive(clap::Subcommand)]
enum ShimCmd {
    /// Which shim `usnet run` preloads, and whether programs in the loader's secure
    /// mode get it (the default).
    Status,
    /// Copy this build's shim into the loader's system search path, root's and
    /// set-user-ID (root only).
    Install,
    /// Remove the copy `install` made.
    Remove,
}

/// The loader's system search path, in its order: what `ld.so --help` lists as
/// "(system search path)". In secure mode these are the only directories a bare
/// `LD_PRELOAD` name is looked up in.
fn system_search_path() -> Result<Vec<PathBuf>, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    let loader = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ld-linux"))
        })
        .ok_or("this process has no dynamic loader mapped")?;
    let out = std::process::Command::new(loader)
        .arg("--help")
        .output()
        .map_err(|e| format!("cannot run {loader} --help: {e}"))?;
    let dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_suffix("(system search path)"))
        .map(|d| PathBuf::from(d.trim()))
        .collect();
    if dirs.is_empty() {
        return Err(format!("{loader} --help lists no system search path"));
    }
    Ok(dirs)
}

/// Where `install` puts the shim: the first directory of the system search path
/// that exists.
pub fn trusted_path() -> Result<PathBuf, String> {
    system_search_path()?
        .into_iter()
        .find(|d| d.is_dir())
        .map(|d| d.join(SHIM_NAME))
        .ok_or_else(|| "no directory of the loader's system search path exists".into())
}

/// Whether the trusted copy is there, the loader would take it in secure mode
/// (root's, set-user-ID) and it is byte for byte `built`.
pub fn trusted_copy_current(trusted: &Path, built: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(t), Ok(b)) = (std::fs::metadata(trusted), std::fs::metadata(built)) else {
        return false;
    };
    if t.uid() != 0 || t.mode() & libc::S_ISUID == 0 || t.len() != b.len() {
        return false;
    }
    matches!((std::fs::read(trusted), std::fs::read(built)), (Ok(x), Ok(y)) if x == y)
}

pub fn run(a: ShimArgs) -> CmdResult {
    let built = crate::run::built_shim()?;
    let trusted = trusted_path()?;
    match a.what.unwrap_or(ShimCmd::Status) {
        ShimCmd::Status => {
            let current = trusted_copy_current(&trusted, &built);
            println!("this build's shim: {}", built.display());
            println!(
                "the loader's trusted copy: {} ({})",
                trusted.display(),
                if current {
                    "installed, this build's"
                } else if trusted.exists() {
                    "there, but not this build's or not root's set-user-ID file: `usnet shim install` again"
                } else {
                    "not installed"
                }
            );
            if current {
                println!("usnet run preloads {SHIM_NAME} by name: programs in the loader's secure mode (set-user-ID, file capabilities, exec'd with an effective uid or gid not the real one) get it too");
            } else {
                println!("usnet run preloads {}: programs in the loader's secure mode do not get it, and their sockets are the kernel's", built.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        ShimCmd::Install => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(
                    "usnet shim install writes to the loader's system directory: run it as root"
                        .into(),
                );
            }
            install(&built, &trusted)?;
            println!(
                "installed {} (root's, mode 4755); usnet run now preloads {SHIM_NAME} by name",
                trusted.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ShimCmd::Remove => {
            match std::fs::remove_file(&trusted) {
                Ok(()) => println!("removed {}", trusted.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("{} was not there", trusted.display())
                }
                Err(e) => return Err(format!("cannot remove {}: {e}", trusted.display()).into()),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Copies `built` to `trusted` through a temporary name in the same directory, so a
/// program starting meanwhile maps the old file or the new one, never half of one.
fn install(built: &Path, trusted: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = trusted.with_extension(format!("so.{}", std::process::id()));
    let fail = |what: &str, e: std::io::Error| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot {what} {}: {e}", tmp.display())
    };
    std::fs::copy(built, &tmp).map_err(|e| fail("write", e))?;
    std::os::unix::fs::chown(&tmp, Some(0), Some(0)).map_err(|e| fail("chown", e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o4755))
        .map_err(|e| fail("chmod", e))?;
    std::fs::rename(&tmp, trusted).map_err(|e| fail("rename", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trusted_directory_is_one_the_loader_searches() {
        let dirs = system_search_path().expect("ld.so --help");
        let t = trusted_path().unwrap();
        assert!(
            dirs.iter().any(|d| t.parent() == Some(d.as_path())),
            "{t:?} in {dirs:?}"
        );
    }

    #[test]
    fn a_copy_counts_only_when_root_owned_set_user_id_and_identical() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("usnet-shim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.so"), dir.join("b.so"));
        std::fs::write(&a, b"one build").unwrap();
        std::fs::write(&b, b"one build").unwrap();
        let mode = |m| std::fs::set_permissions(&b, std::fs::Permissions::from_mode(m)).unwrap();
        mode(0o755);
        assert!(!trusted_copy_current(&b, &a), "no set-user-ID bit");
        mode(0o4755);
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(
            trusted_copy_current(&b, &a),
            root,
            "owned by root only when root made it"
        );
        std::fs::write(&a, b"another b").unwrap();
        assert!(!trusted_copy_current(&b, &a), "same length, other bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
