//! Benchmarks: each one runs usnet and the Linux kernel on the same machine in the same
//! run, prints a table of medians and ratios, writes JSON and draws a plot.

pub mod async_syscall;
pub mod peer;
pub mod tcp;
pub mod udp;

/// Pins the calling thread to `core` (best effort: a failure only costs accuracy).
pub fn pin_to_core(core: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity
    // reads it for the calling thread (pid 0).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Number of CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
