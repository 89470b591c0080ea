//! Benchmarks: each one runs usnet and the Linux kernel on the same machine in the same
//! run, prints a table of medians and ratios, writes JSON and draws a plot.

pub mod async_syscall;
pub mod cpu;
pub mod httpd;
pub mod nic;
pub mod peer;
pub mod preload;
pub mod prio;
pub mod server;
pub mod shards;
pub mod tcp;
pub mod udp;
mod web;

/// Pins the calling thread to `core` (best effort: a failure only costs accuracy).
pub fn pin_to_core(core: usize) {
    let _ = usnet_driver::sched::pin_to_core(core);
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Joins `h` if it finishes within `timeout`. A thread still running then is left
/// behind (std threads cannot be stopped) and reported: nothing waits without a deadline.
pub fn join_within<T>(
    h: std::thread::JoinHandle<T>,
    timeout: std::time::Duration,
) -> Result<T, String> {
    let end = std::time::Instant::now() + timeout;
    while !h.is_finished() {
        if std::time::Instant::now() >= end {
            return Err(format!("thread still running after {timeout:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    h.join().map_err(|_| "thread panicked".to_string())
}

/// Kills a child process and reaps it, waiting at most `timeout` for it to go.
pub fn kill_and_reap(child: &mut std::process::Child, timeout: std::time::Duration) {
    let _ = child.kill();
    let end = std::time::Instant::now() + timeout;
    while let Ok(None) = child.try_wait() {
        if std::time::Instant::now() >= end {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
