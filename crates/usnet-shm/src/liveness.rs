//! "Is the process on the other side of this shared memory still alive?"
//!
//! Each party holds a write lock on one byte of the shared file (its *claim*) for as
//! long as it lives: an open-file-description lock (`fcntl(F_OFD_SETLK)`). The kernel
//! drops such a lock when the last descriptor of the open file description closes,
//! which happens however its holder dies (exit, abort, SIGKILL), before the process even
//! becomes a zombie. A peer asks the kernel whether the byte is held
//! (`F_OFD_GETLK`).
//!
//! Why not a pid in shared memory and `kill(pid, 0)`: a pid can be reused by an
//! unrelated process, a zombie still "exists", and pids mean nothing across pid
//! namespaces. Why not a heartbeat: it needs a timing threshold that a loaded machine
//! breaks. Why OFD locks and not classic POSIX locks: POSIX locks belong to the process,
//! so two parties in one process (tests, or both ends of a link in one program) would
//! share them, and closing *any* descriptor of the file drops them all. An OFD lock
//! belongs to one `open()`, so each party opens the file itself.
//!
//! Claims do not block anything: the shared memory stays usable by anyone who maps it.
//! They say who is there.
//!
//! The same locks serialise short critical sections between openers ([`lock_within`]),
//! e.g. "inspect the file, then claim a free side", with a deadline instead of a
//! blocking wait.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::sys;

/// Claims `byte` for this open file description. Ok(false) when another open file
/// description (another party, alive) holds it. Claiming a byte we hold already
/// succeeds.
pub fn try_claim(file: &File, byte: u64) -> io::Result<bool> {
    sys::ofd_setlk(file.as_fd(), byte, true)
}

/// Gives up a claim (nothing happens if we do not hold it; another party's claim on the
/// same byte is untouched). Closing the file does the same.
pub fn release(file: &File, byte: u64) -> io::Result<()> {
    sys::ofd_setlk(file.as_fd(), byte, false).map(|_| ())
}

/// Whether some *other* open file description holds a claim on `byte`: the party that
/// took it is alive. Our own claims do not count. One system call, no shared state.
pub fn claimed_by_other(file: &File, byte: u64) -> io::Result<bool> {
    sys::ofd_held_by_other(file.as_fd(), byte)
}

/// Takes `byte` as a mutual-exclusion lock, retrying every 500 µs until `timeout` has
/// passed (then `TimedOut`): for short critical sections between parties, where a
/// holder that hangs must not hang everyone else. Release it with [`release`].
pub fn lock_within(file: &File, byte: u64, timeout: Duration) -> io::Result<()> {
    let start = Instant::now();
    loop {
        if try_claim(file, byte)? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("lock on byte {byte} still held after {timeout:?}"),
            ));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    fn tmp(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("usnet-shm-live-{}-{tag}", std::process::id()))
    }

    fn open(p: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .unwrap()
    }

    #[test]
    fn claims_are_per_open_and_released_on_close() {
        let p = tmp("open");
        let (a, b) = (open(&p), open(&p));
        assert!(try_claim(&a, 0).unwrap());
        assert!(try_claim(&a, 0).unwrap(), "re-claiming our own byte");
        assert!(!try_claim(&b, 0).unwrap(), "held by a");
        assert!(claimed_by_other(&b, 0).unwrap());
        assert!(
            !claimed_by_other(&a, 0).unwrap(),
            "our own claim does not count"
        );
        assert!(!claimed_by_other(&b, 1).unwrap());
        release(&b, 0).unwrap(); // not b's: nothing happens
        assert!(claimed_by_other(&b, 0).unwrap());
        let dup = a.try_clone().unwrap();
        drop(a);
        assert!(
            claimed_by_other(&b, 0).unwrap(),
            "a dup keeps the description open"
        );
        drop(dup);
        assert!(
            !claimed_by_other(&b, 0).unwrap(),
            "released when the last fd closes"
        );
        assert!(try_claim(&b, 0).unwrap());
        let c = open(&p);
        let t = Instant::now();
        let e = lock_within(&c, 0, Duration::from_millis(20)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(20));
        release(&b, 0).unwrap();
        lock_within(&c, 0, Duration::from_millis(20)).unwrap();
        let _ = std::fs::remove_file(&p);
    }

    /// Not a test by itself: the child of `claim_of_a_child_process_ends_with_it`. It
    /// claims byte 3, then lives until its stdin closes (or 20 s pass).
    #[test]
    fn liveness_child() {
        let Ok(p) = std::env::var("USNET_SHM_LIVENESS_CHILD") else {
            return;
        };
        let f = open(std::path::Path::new(&p));
        assert!(try_claim(&f, 3).unwrap());
        let stdin = std::io::stdin();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            let r = crate::poll_fds(&[stdin.as_fd()], Duration::from_millis(100)).unwrap();
            if r.any() {
                break; // EOF: the parent let go
            }
        }
    }

    #[test]
    fn claim_of_a_child_process_ends_with_it() {
        let p = tmp("child");
        let mine = open(&p);
        for how in ["exit", "kill"] {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "liveness::tests::liveness_child", "--nocapture"])
                .env("USNET_SHM_LIVENESS_CHILD", &p)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let start = Instant::now();
            while !claimed_by_other(&mine, 3).unwrap() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "child never claimed"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(!try_claim(&mine, 3).unwrap());
            let mut stdin = child.stdin.take().unwrap();
            if how == "exit" {
                let _ = stdin.write_all(b"bye");
                drop(stdin);
            } else {
                child.kill().unwrap();
            }
            let start = Instant::now();
            while child.try_wait().unwrap().is_none() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "child did not end"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(
                !claimed_by_other(&mine, 3).unwrap(),
                "{how}: the kernel dropped the dead child's claim"
            );
        }
        let _ = std::fs::remove_file(&p);
    }
}
