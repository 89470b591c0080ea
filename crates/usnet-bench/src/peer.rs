//! Child processes of a benchmark: started by re-executing the `usnet` binary with a
//! hidden subcommand, they print one JSON line when ready and one with their result.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub struct Peer {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Peer {
    pub fn spawn(args: &[String]) -> std::io::Result<Peer> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Peer { child, out })
    }

    /// The next JSON line the peer prints.
    pub fn read(&mut self) -> std::io::Result<Value> {
        let mut line = String::new();
        if self.out.read_line(&mut line)? == 0 {
            let status = self.child.wait()?;
            return Err(std::io::Error::other(format!(
                "benchmark peer exited ({status}) without a result"
            )));
        }
        serde_json::from_str(&line).map_err(std::io::Error::other)
    }

    pub fn finish(mut self, timeout: Duration) -> std::io::Result<()> {
        let end = std::time::Instant::now() + timeout;
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
            if std::time::Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(std::io::Error::other("benchmark peer did not stop in time"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
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
