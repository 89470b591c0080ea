//! Finding a running stack and talking to its control socket: a Unix stream socket
//! named after the stack in the run directory, speaking one JSON request line and JSON
//! lines back. `usnet stat`, `usnet ping`, `usnet down` and every client that attaches
//! start here. The messages are typed in [`msg`].

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

pub mod msg;

pub use msg::Request;

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
    #[error("the stack refused: {0}")]
    Refused(String),
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

/// One request line (what [`call`] writes).
pub fn request_line(req: &Request) -> String {
    let mut line = serde_json::to_string(req).expect("a request serialises");
    line.push('\n');
    line
}

/// The answer line `line` as an `R`, or the stack's refusal (`{"error": ...}` with
/// nothing else the answer could be: a ping's failed request carries its `seq`).
pub fn parse_answer<R: DeserializeOwned>(line: &str) -> Result<R, ControlError> {
    let v: Value =
        serde_json::from_str(line.trim()).map_err(|e| ControlError::Protocol(e.to_string()))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        if v.get("seq").is_none() {
            return Err(ControlError::Refused(e.to_string()));
        }
    }
    serde_json::from_value(v).map_err(|e| ControlError::Protocol(e.to_string()))
}

/// Sends one request and calls `each` for every line of the answer, read as `R`,
/// until it returns false or the stack closes.
pub fn call<R: DeserializeOwned>(
    path: &Path,
    req: &Request,
    mut each: impl FnMut(R) -> bool,
) -> Result<(), ControlError> {
    let mut s = UnixStream::connect(path)?;
    s.write_all(request_line(req).as_bytes())?;
    for l in BufReader::new(s).lines() {
        if !each(parse_answer(&l?)?) {
            break;
        }
    }
    Ok(())
}

/// Sends one request whose answer is one line.
pub fn call_one<R: DeserializeOwned>(path: &Path, req: &Request) -> Result<R, ControlError> {
    let mut got = None;
    call(path, req, |r| {
        got = Some(r);
        false
    })?;
    got.ok_or_else(|| ControlError::Protocol("no answer".into()))
}
