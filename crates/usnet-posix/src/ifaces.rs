//! Interface queries (`SIOCGIF*`) about the stack's own interface, answered from
//! what the stack said of it at attach ([`Iface`]), so a program that looks its
//! interfaces up by `ioctl` (Java's `NetworkInterface`, dnsmasq, ntpd) sees the
//! same one `getifaddrs` shows it under the shim.

use std::ffi::{c_char, c_int, c_void};
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr};

use crate::{Errno, Iface, Res};

const SIOCGIFNAME: u64 = 0x8910;
const SIOCGIFCONF: u64 = 0x8912;
const SIOCGIFFLAGS: u64 = 0x8913;
const SIOCGIFADDR: u64 = 0x8915;
const SIOCGIFDSTADDR: u64 = 0x8917;
const SIOCGIFBRDADDR: u64 = 0x8919;
const SIOCGIFNETMASK: u64 = 0x891b;
const SIOCGIFMETRIC: u64 = 0x891d;
const SIOCGIFMTU: u64 = 0x8921;
const SIOCGIFHWADDR: u64 = 0x8927;
const SIOCGIFINDEX: u64 = 0x8933;
const SIOCGIFPFLAGS: u64 = 0x8935;
const SIOCGIFTXQLEN: u64 = 0x8942;
const SIOCGIFMAP: u64 = 0x8970;

/// The flags it has: up and running, with broadcast and multicast (and, in
/// `getifaddrs`, `IFF_LOWER_UP`, which the ioctl's short cannot carry).
pub fn flags() -> c_int {
    libc::IFF_UP | libc::IFF_BROADCAST | libc::IFF_RUNNING | libc::IFF_MULTICAST
}

/// Its IPv4 addresses with their netmasks.
fn v4_addrs(i: &Iface) -> Vec<(Ipv4Addr, u32)> {
    i.cidrs()
        .filter_map(|(ip, prefix)| match ip {
            IpAddr::V4(ip) => Some((ip, netmask_v4(prefix))),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The netmask of an IPv4 prefix length.
pub fn netmask_v4(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr {
    // SAFETY: all-zero is a valid sockaddr_in; a sockaddr_in is as large as a
    // sockaddr, so the one read as the other is whole.
    unsafe {
        let mut s: libc::sockaddr_in = std::mem::zeroed();
        s.sin_family = libc::AF_INET as libc::sa_family_t;
        s.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
        std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(s)
    }
}

fn name_of(r: &libc::ifreq) -> &[u8] {
    // SAFETY: c_char and u8 have one layout.
    let n: &[u8; libc::IFNAMSIZ] = unsafe { &*(&r.ifr_name as *const _ as *const _) };
    let len = n.iter().position(|&b| b == 0).unwrap_or(n.len());
    &n[..len]
}

/// The answer to `req` on `arg` when it is about interface `i` (by name, or by
/// index for `SIOCGIFNAME`; `SIOCGIFCONF` always: the kernel's loopback from
/// `kernel`, then `i`'s addresses); None when it is about another interface.
///
/// # Safety
/// `arg` is what the request's contract says (an `ifreq` or an `ifconf`).
pub unsafe fn answer(
    i: &Iface,
    req: u64,
    arg: *mut c_void,
    kernel: impl Fn(*mut c_void) -> Res<i32>,
) -> Option<Res<i32>> {
    if arg.is_null() {
        return None;
    }
    if req == SIOCGIFCONF {
        // SAFETY: per the contract, an ifconf.
        return Some(unsafe { conf(i, &mut *(arg as *mut libc::ifconf), kernel) });
    }
    // SAFETY: per the contract, an ifreq.
    let r = unsafe { &mut *(arg as *mut libc::ifreq) };
    if req == SIOCGIFNAME {
        // SAFETY: the index is the union's field for this request.
        if unsafe { r.ifr_ifru.ifru_ifindex } as u32 != i.index {
            return None;
        }
        let n = i.name.len().min(libc::IFNAMSIZ - 1);
        r.ifr_name = [0; libc::IFNAMSIZ];
        for (d, s) in r.ifr_name.iter_mut().zip(&i.name.as_bytes()[..n]) {
            *d = *s as c_char;
        }
        return Some(Ok(0));
    }
    if name_of(r) != i.name.as_bytes() {
        return None;
    }
    let first = v4_addrs(i).first().copied();
    let u = &mut r.ifr_ifru;
    Some(match req {
        SIOCGIFFLAGS => {
            u.ifru_flags = flags() as i16;
            Ok(0)
        }
        SIOCGIFPFLAGS | SIOCGIFMETRIC => {
            u.ifru_metric = 0;
            Ok(0)
        }
        SIOCGIFINDEX => {
            u.ifru_ifindex = i.index as c_int;
            Ok(0)
        }
        SIOCGIFMTU => {
            u.ifru_mtu = i.mtu as c_int;
            Ok(0)
        }
        SIOCGIFTXQLEN => {
            u.ifru_ifindex = 1000;
            Ok(0)
        }
        SIOCGIFMAP => {
            // SAFETY: all-zero is a valid ifmap (no memory-mapped device).
            u.ifru_map = unsafe { std::mem::zeroed() };
            Ok(0)
        }
        SIOCGIFHWADDR => {
            // SAFETY: all-zero is a valid sockaddr.
            let mut hw: libc::sockaddr = unsafe { std::mem::zeroed() };
            hw.sa_family = libc::ARPHRD_ETHER;
            for (d, s) in hw.sa_data.iter_mut().zip(i.mac) {
                *d = s as c_char;
            }
            u.ifru_hwaddr = hw;
            Ok(0)
        }
        // Linux's answers for an interface without an IPv4 address.
        SIOCGIFADDR | SIOCGIFDSTADDR | SIOCGIFBRDADDR | SIOCGIFNETMASK => match first {
            None => Err(Errno(libc::EADDRNOTAVAIL)),
            Some((a, mask)) => {
                u.ifru_addr = sockaddr_in(match req {
                    SIOCGIFNETMASK => Ipv4Addr::from(mask),
                    SIOCGIFBRDADDR => Ipv4Addr::from(u32::from(a) | !mask),
                    _ => a,
                });
                Ok(0)
            }
        },
        _ => return None,
    })
}

/// `SIOCGIFCONF`: the kernel's loopback entries, then one per IPv4 address of
/// `i`; with no buffer, the length all of them take.
unsafe fn conf(
    i: &Iface,
    c: &mut libc::ifconf,
    kernel: impl Fn(*mut c_void) -> Res<i32>,
) -> Res<i32> {
    const REQ: usize = size_of::<libc::ifreq>();
    // The kernel's list, into a buffer of our own.
    let mut room: Vec<libc::ifreq> = Vec::with_capacity(64);
    // SAFETY: an ifconf whose buffer is `room`'s capacity.
    let mut k: libc::ifconf = unsafe { std::mem::zeroed() };
    k.ifc_len = (room.capacity() * REQ) as c_int;
    k.ifc_ifcu.ifcu_req = room.as_mut_ptr();
    kernel(&mut k as *mut libc::ifconf as *mut c_void)?;
    // SAFETY: the kernel wrote `ifc_len` bytes of whole entries.
    unsafe { room.set_len((k.ifc_len as usize / REQ).min(room.capacity())) };
    let mut all: Vec<libc::ifreq> = room
        .into_iter()
        .filter(|r| {
            // SAFETY: SIOCGIFCONF entries carry an IPv4 address.
            let a = unsafe { r.ifr_ifru.ifru_addr };
            a.sa_data[2] as u8 == 127
        })
        .collect();
    for (a, _) in v4_addrs(i) {
        // SAFETY: all-zero is a valid ifreq.
        let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in r
            .ifr_name
            .iter_mut()
            .zip(i.name.bytes().take(libc::IFNAMSIZ - 1))
        {
            *d = s as c_char;
        }
        r.ifr_ifru.ifru_addr = sockaddr_in(a);
        all.push(r);
    }
    // SAFETY: reading the union as the caller set it (a buffer or NULL).
    let buf = unsafe { c.ifc_ifcu.ifcu_req };
    if buf.is_null() {
        c.ifc_len = (all.len() * REQ) as c_int;
        return Ok(0);
    }
    let fit = (c.ifc_len.max(0) as usize / REQ).min(all.len());
    // SAFETY: the caller's buffer has room for `ifc_len` bytes; `fit` whole
    // entries are within it.
    unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), buf, fit) };
    c.ifc_len = (fit * REQ) as c_int;
    Ok(0)
}
