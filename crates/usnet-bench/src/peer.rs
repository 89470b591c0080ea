//! Child processes of a benchmark: the current executable re-executed with the peer's
//! options as JSON in [`PEER_ENV`] (its `main` calls [`maybe_run_peer`] first). A peer
//! prints one JSON line when ready and one with its result; the parent reads each with
//! a deadline.

use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Environment variable that makes a re-executed binary a benchmark peer.
pub const PEER_ENV: &str = "USNET_BENCH_PEER";

/// How long a peer may take to say it is ready (and, on top of its run time, to report).
pub const PEER_READY: Duration = Duration::from_secs(30);

/// What a peer process runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum PeerSpec {
    Udp(crate::udp::UdpPeerOptions),
    Tcp(crate::tcp::TcpPeerOptions),
    /// An application of `usnet bench server` (write_server, read_client, round trip).
    App(crate::server::AppOptions),
    /// A receiving client process of `usnet bench prio`.
    PrioReceiver(crate::prio::ReceiverOptions),
    /// A client process of `usnet bench soak`.
    Soak(crate::soak::ChildOptions),
}

/// Call first thing in `main()`: if this process was started as a benchmark peer, run
/// it and exit; otherwise return at once.
pub fn maybe_run_peer() {
    let Ok(json) = std::env::var(PEER_ENV) else {
        return;
    };
    let r = serde_json::from_str::<PeerSpec>(&json)
        .map_err(|e| format!("bad {PEER_ENV}: {e}").into())
        .and_then(|spec| match spec {
            PeerSpec::Udp(o) => crate::udp::run_peer(&o),
            PeerSpec::Tcp(o) => crate::tcp::run_peer(&o),
            PeerSpec::App(o) => crate::server::run_app(&o),
            PeerSpec::PrioReceiver(o) => crate::prio::run_receiver(&o),
            PeerSpec::Soak(o) => crate::soak::run_child(&o),
        });
    let code = match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("usnet bench peer: {e}");
            ExitCode::FAILURE
        }
    };
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
}

pub struct Peer {
    child: Child,
    out: ChildStdout,
    /// Bytes read past the last line returned.
    pending: Vec<u8>,
}

impl Peer {
    pub fn spawn(spec: &PeerSpec) -> std::io::Result<Peer> {
        let json = serde_json::to_string(spec).map_err(std::io::Error::other)?;
        let mut child = Command::new(std::env::current_exe()?)
            .env(PEER_ENV, json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().expect("piped");
        Ok(Peer {
            child,
            out,
            pending: Vec::new(),
        })
    }

    /// The next JSON line the peer prints, waiting at most `timeout` for it.
    pub fn read(&mut self, timeout: Duration) -> std::io::Result<Value> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return serde_json::from_slice(&line).map_err(std::io::Error::other);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("benchmark peer said nothing within {timeout:?}"),
                ));
            }
            if !usnet_shm::poll_fds(&[self.out.as_fd()], left)?.any() {
                continue;
            }
            let mut buf = [0u8; 4096];
            // Readable (or hung up): this read does not block.
            let n = self.out.read(&mut buf)?;
            if n == 0 {
                let status = self.wait_exit(Duration::from_secs(5))?;
                return Err(std::io::Error::other(format!(
                    "benchmark peer exited ({status}) without a result"
                )));
            }
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::io::Result<String> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.to_string());
            }
            if Instant::now() > end {
                return Ok("still running".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn finish(mut self, timeout: Duration) -> std::io::Result<()> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(std::io::Error::other(format!(
                        "benchmark peer failed: {st}"
                    )))
                };
            }
            if Instant::now() > end {
                crate::kill_and_reap(&mut self.child, Duration::from_secs(5));
                return Err(std::io::Error::other("benchmark peer did not stop in time"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            crate::kill_and_reap(&mut self.child, Duration::from_secs(5));
        }
    }
}

/// Prints one JSON line for the parent and flushes it.
pub fn emit(v: &Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}
