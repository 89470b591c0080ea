//! Small wrappers over the system calls the kernel-backed devices share: the eventfd
//! waker and poll on two descriptors (from usnet-shm), interface lookups and the `ip`
//! command.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::Duration;

use crate::error::LinkError;
use crate::Wake;

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
pub(crate) const IFNAME_MAX: usize = libc::IFNAMSIZ - 1;

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `setsockopt` of a plain-data value.
pub(crate) fn setsockopt<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    val: &T,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live T and its exact size; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// `getsockopt` of a plain-data value.
pub(crate) fn getsockopt<T: Default>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live `v`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// The coarse monotonic clock (the last tick's time: a few ms of resolution, read
/// without the TSC), for checks made on every burst whose period is far above a
/// tick (a peer's liveness every 50 ms).
pub(crate) fn coarse_now() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live local.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The eventfd doorbell `Device::waker` hands out; `wait` polls it next to the device fd.
pub(crate) use usnet_shm::EventFd;

impl Wake for EventFd {
    fn wake(&self) {
        self.ring();
    }
}

/// Longest single wait when the caller gave no timeout: `Device::wait` may return early,
/// and nothing waits without a deadline.
const IDLE_SLICE: Duration = Duration::from_secs(1);

/// Polls `dev` for input and `wake` (an eventfd); returns (dev readable, woken).
pub(crate) fn poll_two(
    dev: BorrowedFd<'_>,
    wake: &EventFd,
    timeout: Option<Duration>,
) -> io::Result<(bool, bool)> {
    let r = usnet_shm::poll_fds(&[dev, wake.as_fd()], timeout.unwrap_or(IDLE_SLICE))?;
    let woken = r.contains(1);
    if woken {
        wake.drain();
    }
    Ok((r.contains(0), woken))
}

pub(crate) fn check_ifname(name: &str) -> Result<(), LinkError> {
    let why = if name.is_empty() {
        "an interface name cannot be empty"
    } else if name.len() > IFNAME_MAX {
        "interface names are at most 15 bytes"
    } else if name
        .bytes()
        .any(|c| c == b'/' || c == b':' || c.is_ascii_whitespace() || c == 0)
    {
        "interface names cannot contain '/', ':', spaces or NUL"
    } else if name == "." || name == ".." {
        "'.' and '..' are not interface names"
    } else {
        return Ok(());
    };
    Err(LinkError::BadName {
        name: name.to_string(),
        why,
    })
}

pub(crate) fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data (a name array and a union of integers/arrays);
    // all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes().take(IFNAME_MAX)) {
        *d = s as libc::c_char;
    }
    req
}

/// The kernel's index of an interface, or `NoSuchInterface`.
pub(crate) fn if_index(name: &str) -> Result<u32, LinkError> {
    check_ifname(name)?;
    let c = std::ffi::CString::new(name).expect("checked: no NUL");
    // SAFETY: c is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(LinkError::NoSuchInterface(name.to_string()));
    }
    Ok(idx)
}

/// The interface's MTU as Linux sees it (SIOCGIFMTU).
pub(crate) fn if_mtu(name: &str) -> io::Result<usize> {
    // SAFETY: socket() with constant arguments returns a new fd or -1.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s was just created and is owned by nothing else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let mut req = ifreq(name);
    // SAFETY: SIOCGIFMTU reads the name from and writes the MTU into `req`, which lives
    // across the call.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut req) })?;
    // SAFETY: the kernel filled the ifru_mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

/// `struct ethtool_drvinfo` (linux/ethtool.h).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// The name of the interface's driver (ETHTOOL_GDRVINFO), e.g. "veth", "ixgbe".
pub(crate) fn if_driver(name: &str) -> io::Result<String> {
    const ETHTOOL_GDRVINFO: u32 = 3;
    // SAFETY: socket() with constant arguments returns a new fd or -1.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s was just created and is owned by nothing else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let mut info = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    // SAFETY: SIOCETHTOOL reads the name and the pointer from `req` and writes at most
    // one `ethtool_drvinfo` through the pointer; `req` and `info` live across the call.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL, &mut req) })?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Runs `ip ARGS...` and turns a failure into one readable line.
pub fn run_ip(args: &[&str]) -> Result<(), LinkError> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| LinkError::Command {
            cmd: cmd.clone(),
            why: format!("cannot run `ip` (is iproute2 installed?): {e}"),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(LinkError::Command {
            cmd,
            why: format!("{} ({})", stderr.trim(), out.status),
        });
    }
    Ok(())
}

/// For a frame whose L4 checksum is partial (kernel-generated, not yet finished), works out
/// where the checksum starts and where it is stored: plain IPv4/IPv6 carrying TCP or UDP.
pub(crate) fn partial_csum_location(frame: &[u8]) -> Option<(u16, u16)> {
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    off += 2;
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([*frame.get(off + 2)?, *frame.get(off + 3)?]);
        off += 4;
    }
    let (proto, l4) = match ethertype {
        0x0800 => {
            let ihl = (*frame.get(off)? & 0x0f) as usize * 4;
            (*frame.get(off + 9)?, off + ihl)
        }
        0x86dd => (*frame.get(off + 6)?, off + 40),
        _ => return None,
    };
    let csum_off = match proto {
        6 => 16,
        17 => 6,
        _ => return None,
    };
    Some((l4 as u16, csum_off))
}
