//! Clock, CPU affinity and the raw TAP descriptor used by the benchmark's contrast path.

use std::fs::File;
use std::io;

/// CLOCK_MONOTONIC in nanoseconds: one time base for both processes.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Busy-waits (no sleep) until the monotonic clock reaches `t`; returns the time seen.
#[inline]
pub fn spin_until(t: u64) -> u64 {
    loop {
        let n = now_ns();
        if n >= t {
            return n;
        }
        std::hint::spin_loop();
    }
}

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

/// Opens `/dev/net/tun` as a TAP (IFF_TAP | IFF_NO_PI) named after `name` (a `%d`
/// pattern is allowed); returns the file and the name the kernel chose.
pub fn open_tap(name: &str) -> io::Result<(File, String)> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is a plain C struct; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    use std::os::fd::AsRawFd;
    // SAFETY: TUNSETIFF reads and writes the ifreq we pass, on the tun fd we own.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let chosen: String = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    Ok((file, chosen))
}
