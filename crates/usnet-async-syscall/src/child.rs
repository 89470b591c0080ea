//! Two-process support: re-executing the current binary as an exec (or
//! fuzzing) peer that inherits the ring's memfd.
//!
//! The child is selected by the environment variable [`CHILD_ENV`]:
//! `echo:<fd>:<spin|sleep|adaptive>:<batch>[:cpu1]` runs an exec loop whose handler returns
//! [`echo_result`], until the ring exits; `fuzz:<fd>:<seed>:<millis>`
//! writes random bytes over random offsets of the area for `millis` ms.

use crate::ring::{ExecOptions, Request, Ring, WaitPolicy};
use std::io;
use std::os::fd::AsRawFd;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use usnet_shm::{adopt_inherited_fd, inherit_fd};

/// Environment variable marking a re-executed ring peer.
pub const CHILD_ENV: &str = "USNET_RING_CHILD";

/// The result the echo peer computes for a request (requesters check it).
pub fn echo_result(req: &Request) -> i64 {
    let mut h = (req.num as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for a in req.args {
        h = (h ^ a).wrapping_mul(0x100_0000_01B3);
    }
    (h >> 2) as i64
}

/// Call first thing in `main()`: if this process was started as a ring
/// peer, run the peer and exit; otherwise return at once.
pub fn maybe_run_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let code = match run_child(&spec) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("usnet-async-syscall child ({spec}): {e}");
            2
        }
    };
    std::process::exit(code);
}

fn field<T: std::str::FromStr>(f: Option<&str>, what: &str) -> io::Result<T> {
    f.and_then(|s| s.parse().ok()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad {what} in {CHILD_ENV}"),
        )
    })
}

fn run_child(spec: &str) -> io::Result<()> {
    let mut it = spec.split(':');
    let mode = it.next().unwrap_or("");
    let fd = adopt_inherited_fd(field(it.next(), "fd")?)?;
    match mode {
        "echo" => {
            let wait = match it.next() {
                Some("spin") => WaitPolicy::SPIN,
                Some("sleep") => WaitPolicy::SLEEP,
                _ => WaitPolicy::default(),
            };
            let batch: usize = field(it.next(), "batch")?;
            if it.next() == Some("cpu1") {
                let mask: u64 = 2;
                let r = crate::run_syscall(
                    libc::SYS_sched_setaffinity,
                    [0, 8, &mask as *const u64 as u64, 0, 0, 0],
                );
                if r < 0 {
                    eprintln!("usnet-async-syscall child: could not pin to CPU 1 ({r})");
                }
            }
            let ring = Ring::from_fd(fd, wait).map_err(io::Error::other)?;
            ring.exec(&ExecOptions { batch, wait }, echo_result);
            Ok(())
        }
        "fuzz" => {
            let seed: u64 = field(it.next(), "seed")?;
            let ms: u64 = field(it.next(), "millis")?;
            let ring = Ring::from_fd(fd, WaitPolicy::SLEEP).map_err(io::Error::other)?;
            let len = ring.fuzz_area_len();
            let mut x = seed | 1;
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end {
                for _ in 0..64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (x >> 16) as usize % len;
                    // The other process sees arbitrary bytes, as intended.
                    ring.fuzz_poke(off, x as u8);
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            Ok(())
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown child mode {mode:?}"),
        )),
    }
}

/// Start a peer process for `ring` (re-executing the current binary).
/// `spec_tail` is the part of the spec after `<mode>:<fd>`, e.g.
/// `spawn_child(&ring, "echo", "spin:32", &[])`. `args` are passed to the
/// binary (test harnesses need a filter selecting a test that calls
/// [`maybe_run_child`]).
pub fn spawn_child(ring: &Ring, mode: &str, spec_tail: &str, args: &[&str]) -> io::Result<Child> {
    let fd = ring.fd().as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args)
        .env(CHILD_ENV, format!("{mode}:{fd}:{spec_tail}"));
    inherit_fd(&mut cmd, ring.fd());
    cmd.spawn()
}
