//! Asynchronous host system calls on top of the ring: any system call
//! number with up to six arguments, run by 1..N exec threads with
//! `syscall(2)` semantics (result, or negative errno).
//!
//! # Which calls make sense
//! * **Good fits**: calls that block or take long: `read`/`pread64`,
//!   `write`/`pwrite64`, `readv`/`writev`, `fsync`/`fdatasync`, `openat`,
//!   `close`, `statx`/`newfstatat`, `accept4`, `connect`, `recvfrom`/
//!   `sendto`, `nanosleep`, `futex` waits, `copy_file_range`, `sendfile`.
//!   Several exec threads run them in parallel while the requester goes on.
//! * **Pointless**: cheap non-blocking calls (`getpid`, `clock_gettime` via
//!   vDSO, `gettid`): the exec thread pays the same system call plus the
//!   ring's hand-off, so the requester only saves its own time.
//! * **Different meaning**: thread-specific calls act on the *exec thread*:
//!   `gettid` returns the exec thread's id, `sched_setaffinity(0, ..)`,
//!   `rt_sigprocmask`, `sigaltstack`, `prctl(PR_SET_NAME)`, `setns`,
//!   `unshare`, `capset` and per-thread credentials (raw `setuid`) change
//!   the exec thread, not the caller; which exec thread runs a call is not
//!   specified.
//! * **Refused** (result `-ENOSYS`, never executed) because they would
//!   break the exec thread or the process: `clone`, `clone3`, `fork`,
//!   `vfork`, `exit` (would end the exec thread behind the pool's back),
//!   `rt_sigreturn`, `arch_prctl` (TLS base), `set_tid_address`,
//!   `set_robust_list`, `rseq`. `exit_group` and `execve` are allowed and do
//!   what they do from any thread.
//!
//! Pointers in arguments refer to this process's memory (exec threads are
//! threads of the same process); they must stay valid until the completion
//! is reaped.

use crate::ring::{
    Call, Completion, Error, ErrorCounts, ExecOptions, ExecStats, ExitMode, Ring, WaitPolicy,
};
use std::thread::JoinHandle;
use std::time::Duration;

/// Options for [`AsyncSyscall::with_options`].
#[derive(Debug, Clone, Copy, Default)]
pub struct AsyncOptions {
    /// How the requester waits for completions.
    pub requester_wait: WaitPolicy,
    /// How exec threads wait for work and how many requests they claim.
    pub exec: ExecOptions,
}

/// True for the system calls [`AsyncSyscall`] refuses (`-ENOSYS`).
pub fn is_refused(num: i64) -> bool {
    const COMMON: [libc::c_long; 7] = [
        libc::SYS_clone,
        libc::SYS_clone3,
        libc::SYS_exit,
        libc::SYS_rt_sigreturn,
        libc::SYS_set_tid_address,
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
    ];
    #[cfg(target_arch = "x86_64")]
    const ARCH: [libc::c_long; 3] = [libc::SYS_fork, libc::SYS_vfork, libc::SYS_arch_prctl];
    #[cfg(not(target_arch = "x86_64"))]
    const ARCH: [libc::c_long; 0] = [];
    COMMON.contains(&(num as libc::c_long)) || ARCH.contains(&(num as libc::c_long))
}

/// Run one system call in the calling thread with `syscall(2)` semantics,
/// returning negative errno on failure.
pub fn run_syscall(num: i64, a: [u64; 6]) -> i64 {
    if is_refused(num) {
        return -(libc::ENOSYS as i64);
    }
    // SAFETY: the caller asked for exactly this system call with these
    // arguments; memory referenced by pointer arguments is the caller's
    // responsibility, as with syscall(2) itself. Calls that would break the
    // calling thread's runtime invariants are refused above.
    let r = unsafe { libc::syscall(num as libc::c_long, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        -(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO) as i64)
    } else {
        r
    }
}

/// The asynchronous system call facility: a ring plus its exec threads.
pub struct AsyncSyscall {
    ring: Ring,
    threads: Vec<JoinHandle<ExecStats>>,
    stats: ExecStats,
}

impl AsyncSyscall {
    /// The document's `init`: a ring of `nentries` (power of two) and
    /// `nexec >= 1` exec threads with default options.
    pub fn new(nexec: usize, nentries: u32) -> Result<AsyncSyscall, Error> {
        AsyncSyscall::with_options(nexec, nentries, AsyncOptions::default())
    }

    pub fn with_options(
        nexec: usize,
        nentries: u32,
        opts: AsyncOptions,
    ) -> Result<AsyncSyscall, Error> {
        if nexec == 0 || nexec > 1024 {
            return Err(Error::Invalid("nexec must be in 1..=1024"));
        }
        let ring = Ring::with_policy(nentries, opts.requester_wait)?;
        let mut threads = Vec::with_capacity(nexec);
        for i in 0..nexec {
            let r = ring.clone();
            let eo = opts.exec;
            let t = std::thread::Builder::new()
                .name(format!("usnet-exec-{i}"))
                .spawn(move || r.exec(&eo, |req| run_syscall(req.num as i64, req.args)));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    ring.exit(ExitMode::Cancel);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(Error::Io(e));
                }
            }
        }
        Ok(AsyncSyscall {
            ring,
            threads,
            stats: ExecStats::default(),
        })
    }

    /// The underlying ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Number of exec threads still running (0 after exit).
    pub fn exec_threads(&self) -> usize {
        self.threads.len()
    }

    fn call(num: i64, args: [u64; 6], user_data: u64) -> Result<Call, Error> {
        let num =
            u32::try_from(num).map_err(|_| Error::Invalid("system call number out of range"))?;
        Ok(Call {
            num,
            args,
            user_data,
        })
    }

    /// Queue one system call; its completion carries `user_data`.
    pub fn submit(&self, num: i64, args: [u64; 6], user_data: u64) -> Result<(), Error> {
        self.ring.submit(&Self::call(num, args, user_data)?)
    }

    /// Queue several calls at once (see [`Ring::submit_batch`]).
    pub fn submit_batch(&self, calls: &[Call]) -> Result<usize, Error> {
        self.ring.submit_batch(calls)
    }

    /// Wake exec threads and wait until at least one call completed.
    pub fn wakeup(&self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.ring.wakeup(out)
    }

    /// Wait for one call to complete.
    pub fn wait_one(&self, timeout: Option<Duration>) -> Result<Completion, Error> {
        self.ring.wait_one(timeout)
    }

    /// Wait until at least `min` completions were reaped into `out`.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        self.ring.wait(out, min, timeout)
    }

    /// Reap one completion without waiting.
    pub fn poll(&self) -> Option<Completion> {
        self.ring.poll()
    }

    /// Reap up to `max` completions without waiting.
    pub fn poll_batch(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.ring.poll_batch(out, max)
    }

    /// Submit one call and wait for *its* result (only meaningful when no
    /// other calls are in flight on this facility).
    pub fn call_sync(&self, num: i64, args: [u64; 6]) -> Result<i64, Error> {
        if self.ring.in_flight() != 0 {
            return Err(Error::Invalid("call_sync needs an idle ring"));
        }
        self.submit(num, args, 0)?;
        Ok(self.wait_one(None)?.result)
    }

    pub fn errors(&self) -> ErrorCounts {
        self.ring.errors()
    }

    /// The document's `exit`: [`Ring::exit`], then join the exec threads
    /// (a call blocked in the kernel delays this until it returns), then
    /// cancel anything still queued. Afterwards every submitted call has a
    /// completion to reap (result, or `-ECANCELED`); new submissions fail.
    /// Idempotent; returns the exec threads' totals.
    pub fn exit(&mut self, mode: ExitMode) -> ExecStats {
        self.ring.exit(mode);
        for t in self.threads.drain(..) {
            if let Ok(s) = t.join() {
                self.stats.executed += s.executed;
                self.stats.cancelled += s.cancelled;
            }
        }
        self.stats.cancelled += self.ring.cancel_pending() as u64;
        self.stats
    }
}

impl Drop for AsyncSyscall {
    fn drop(&mut self) {
        self.exit(ExitMode::Cancel);
    }
}
