//! Clock, CPU affinity and real-time scheduling for the device side (and the benchmark
//! that starts it).

use std::io;

/// CLOCK_MONOTONIC in nanoseconds: the time base both processes share.
pub use usnet_shm::monotonic_ns as now_ns;

/// Pins the calling thread to one core.
pub fn pin_to_core(core: usize) -> io::Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "core out of range",
        ));
    }
    // SAFETY: cpu_set_t is a plain bitmask; zeroed is the empty set; CPU_SET stays in
    // bounds (checked above); sched_setaffinity(0, ..) applies to the calling thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Puts the calling thread in SCHED_FIFO at `prio` (needs root or CAP_SYS_NICE). The
/// kernel's RT throttling (95% by default) still leaves other tasks a share. Children
/// forked later start back in SCHED_OTHER (SCHED_RESET_ON_FORK).
pub fn set_fifo(prio: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: sched_setscheduler reads the param struct we pass; pid 0 = calling thread.
    let r =
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &p) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Number of online CPUs.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}
