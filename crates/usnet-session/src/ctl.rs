//! Finding a running stack and talking to its control socket: a Unix stream socket
//! named after the stack in the run directory, speaking one JSON request line and JSON
//! lines back. `usnet stat`, `usnet ping`, `usnet down` and every client that attaches
//! start here.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where control sockets live: `$USNET_RUN_DIR`, else `/tmp/usnet-<uid>`.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("USNET_RUN_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/usnet-{uid}"))
}

pub fn socket_path(name: &str) -> PathBuf {
    run_dir().join(format!("{name}.ctl"))
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("a stack named '{0}' is already running (choose another --name)")]
    NameInUse(String),
    #[error("bad stack name '{0}': use letters, digits, '-', '_' and '.'")]
    BadName(String),
    #[error("no running stack named '{0}' (start one with `usnet up`)")]
    NoSuchStack(String),
    #[error("no running stack found in {0} (start one with `usnet up`)")]
    NoStacks(String),
    #[error("several stacks are running ({0}): choose one with --stack")]
    Ambiguous(String),
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    #[error("the stack answered something unexpected: {0}")]
    Protocol(String),
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
}

/// Client side: finds the stack to talk to. With no name, the only running stack.
pub fn resolve(name: Option<&str>) -> Result<PathBuf, ControlError> {
    if let Some(n) = name {
        let p = socket_path(n);
        if !p.exists() {
            return Err(ControlError::NoSuchStack(n.to_string()));
        }
        return Ok(p);
    }
    let dir = run_dir();
    let mut live = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "ctl") && UnixStream::connect(&p).is_ok() {
                live.push(p);
            }
        }
    }
    live.sort();
    match live.len() {
        0 => Err(ControlError::NoStacks(dir.display().to_string())),
        1 => Ok(live.remove(0)),
        _ => Err(ControlError::Ambiguous(
            live.iter()
                .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// Sends one request and calls `each` for every JSON line of the answer.
pub fn request(
    path: &Path,
    req: &Value,
    mut each: impl FnMut(&Value) -> bool,
) -> Result<(), ControlError> {
    let mut s = UnixStream::connect(path)?;
    let mut line = serde_json::to_string(req).expect("json");
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let reader = BufReader::new(s);
    for l in reader.lines() {
        let v: Value =
            serde_json::from_str(&l?).map_err(|e| ControlError::Protocol(e.to_string()))?;
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            if v.get("seq").is_none() {
                return Err(ControlError::Protocol(e.to_string()));
            }
        }
        if !each(&v) {
            break;
        }
    }
    Ok(())
}
