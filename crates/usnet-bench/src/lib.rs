//! Benchmarks: each one runs usnet and the Linux kernel on the same machine in the same
//! run, prints a table of medians and ratios, writes JSON and draws a plot.

pub mod async_syscall;
pub mod conns;
pub mod cpu;
pub mod httpd;
pub mod nic;
pub mod peer;
pub mod preload;
pub mod prio;
pub mod server;
pub mod shards;
pub mod soak;
pub mod tcp;
pub mod udp;
pub mod wan;
mod web;

/// Pins the calling thread to `core` (best effort: a failure only costs accuracy).
pub fn pin_to_core(core: usize) {
    let _ = usnet_driver::sched::pin_to_core(core);
}

/// Checks a benchmark's `--only` values against the ones it knows, before anything
/// runs: an unknown one is a one-line error that lists them (not a run that
/// measures nothing).
pub(crate) fn check_only<T: PartialEq + std::fmt::Display>(
    given: &[T],
    known: &[T],
) -> Result<(), String> {
    match given.iter().find(|g| !known.contains(g)) {
        None => Ok(()),
        Some(bad) => {
            let names: Vec<String> = known.iter().map(|k| k.to_string()).collect();
            let list = match names.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                _ => names.join(""),
            };
            Err(format!("--only {bad}: use {list}"))
        }
    }
}

/// `--flag` must be at least `min` (a count of runs, datagrams, bytes).
pub(crate) fn check_min(flag: &str, value: u64, min: u64) -> Result<(), String> {
    if value < min {
        return Err(format!("--{flag} {value}: use at least {min}"));
    }
    Ok(())
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
/// Stops a child cleanly: SIGTERM, up to `grace` for it to exit, then
/// [`kill_and_reap`]. Returns false when it had to be killed.
pub fn stop_child(child: &mut std::process::Child, grace: std::time::Duration) -> bool {
    // SAFETY: a signal to a child we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let end = std::time::Instant::now() + grace;
    while let Ok(None) = child.try_wait() {
        if std::time::Instant::now() > end {
            kill_and_reap(child, std::time::Duration::from_secs(5));
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

/// SIGKILL, then [`reap_within`] `timeout`.
pub fn kill_and_reap(child: &mut std::process::Child, timeout: std::time::Duration) -> bool {
    let _ = child.kill();
    reap_within(child, timeout)
}

/// Waits up to `timeout` for `child` to exit and reaps it; whether it did.
pub fn reap_within(child: &mut std::process::Child, timeout: std::time::Duration) -> bool {
    let end = std::time::Instant::now() + timeout;
    while let Ok(None) = child.try_wait() {
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_only_values_and_small_counts_are_one_line_errors() {
        let known = ["a", "b", "c"].map(String::from);
        assert_eq!(check_only(&["b".to_string()], &known), Ok(()));
        assert_eq!(check_only::<String>(&[], &known), Ok(()));
        assert_eq!(
            check_only(&["x".to_string()], &known),
            Err("--only x: use a, b or c".to_string())
        );
        assert_eq!(check_only(&[4], &[1]), Err("--only 4: use 1".to_string()));
        assert_eq!(check_min("runs", 1, 1), Ok(()));
        assert_eq!(
            check_min("runs", 0, 1),
            Err("--runs 0: use at least 1".to_string())
        );
    }
}
