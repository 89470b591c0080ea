//! The network interfaces a program on a usnet stack sees: the kernel's loopback
//! (loopback sockets stay on the kernel) and the stack's one interface, with its
//! addresses, MAC and MTU (`usnet_posix::Iface`, from the attach reply).
//! `usnet_getifaddrs` and the `if_*` name calls answer from it, as glibc's
//! answer from the kernel's netlink; the shim exports them under libc's names.
//! Without a stack (none to attach to) they are the kernel's.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::mem::size_of;
use std::net::IpAddr;
use std::ptr;

use usnet_posix::Iface;

/// The stack's interface, when a stack is attached (or can be).
fn stack_iface() -> Option<Iface> {
    usnet_posix::stack_iface()
}

/// One `struct ifaddrs` entry before it is laid out.
struct Entry {
    name: Vec<u8>,
    flags: c_uint,
    addr: Option<Vec<u8>>,
    netmask: Option<Vec<u8>>,
    broadcast: Option<Vec<u8>>,
}

fn bytes_of<T>(v: &T) -> Vec<u8> {
    // SAFETY: plain-old-data socket address structures, read as bytes.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
}

fn sin(a: [u8; 4]) -> Vec<u8> {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    s.sin_family = libc::AF_INET as libc::sa_family_t;
    s.sin_addr.s_addr = u32::from_ne_bytes(a);
    bytes_of(&s)
}

fn sin6(a: [u8; 16], scope: u32) -> Vec<u8> {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut s: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    s.sin6_addr.s6_addr = a;
    s.sin6_scope_id = scope;
    bytes_of(&s)
}

/// The stack interface's entries: its link (`AF_PACKET`, with the MAC), then
/// each address (`AF_INET` with netmask and broadcast; `AF_INET6` with netmask,
/// a link-local one scoped to the interface), in glibc's order by family.
fn stack_entries(i: &Iface) -> [Vec<Entry>; 3] {
    let flags = (usnet_posix::iface_flags() | libc::IFF_LOWER_UP) as c_uint;
    let name = i.name.as_bytes().to_vec();
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_ifindex = i.index as c_int;
    ll.sll_hatype = libc::ARPHRD_ETHER;
    ll.sll_halen = 6;
    ll.sll_addr[..6].copy_from_slice(&i.mac);
    let mut bcast_ll = ll;
    bcast_ll.sll_addr[..6].fill(0xff);
    let link = Entry {
        name: name.clone(),
        flags,
        addr: Some(bytes_of(&ll)),
        netmask: None,
        broadcast: Some(bytes_of(&bcast_ll)),
    };
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for (ip, prefix) in i.cidrs() {
        match ip {
            IpAddr::V4(a) => {
                let mask = usnet_posix::netmask_v4(prefix);
                let bits = u32::from(a);
                v4.push(Entry {
                    name: name.clone(),
                    flags,
                    addr: Some(sin(a.octets())),
                    netmask: Some(sin(mask.to_be_bytes())),
                    broadcast: Some(sin((bits | !mask).to_be_bytes())),
                });
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(prefix.min(128)))
                    .unwrap_or(0);
                let scope = if a.segments()[0] & 0xffc0 == 0xfe80 {
                    i.index
                } else {
                    0
                };
                v6.push(Entry {
                    name: name.clone(),
                    flags,
                    addr: Some(sin6(a.octets(), scope)),
                    netmask: Some(sin6(mask.to_be_bytes(), 0)),
                    broadcast: None,
                });
            }
        }
    }
    [vec![link], v4, v6]
}

/// The kernel's loopback entries, by family (AF_PACKET, AF_INET, AF_INET6).
fn loopback_entries() -> [Vec<Entry>; 3] {
    let mut out: [Vec<Entry>; 3] = Default::default();
    let mut list: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: getifaddrs fills `list` on success; freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let copy = |sa: *const libc::sockaddr| -> Option<Vec<u8>> {
        if sa.is_null() {
            return None;
        }
        // SAFETY: a socket address of its family's size, from the kernel's list.
        let len = match unsafe { (*sa).sa_family } as c_int {
            libc::AF_INET => size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
            libc::AF_PACKET => size_of::<libc::sockaddr_ll>(),
            _ => return None,
        };
        // SAFETY: as above.
        Some(unsafe { std::slice::from_raw_parts(sa as *const u8, len) }.to_vec())
    };
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: an entry of the list getifaddrs returned.
        let e = unsafe { &*cur };
        cur = e.ifa_next;
        if e.ifa_flags & libc::IFF_LOOPBACK as c_uint == 0 || e.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: checked non-null; ifa_name is a C string.
        let (family, name) = unsafe { ((*e.ifa_addr).sa_family, CStr::from_ptr(e.ifa_name)) };
        let k = match family as c_int {
            libc::AF_PACKET => 0,
            libc::AF_INET => 1,
            libc::AF_INET6 => 2,
            _ => continue,
        };
        out[k].push(Entry {
            name: name.to_bytes().to_vec(),
            flags: e.ifa_flags,
            addr: copy(e.ifa_addr),
            netmask: copy(e.ifa_netmask),
            broadcast: copy(e.ifa_ifu),
        });
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// Lays `entries` out in one `malloc` block, the first `struct ifaddrs` at its
/// start, as glibc's `getifaddrs` does: its `freeifaddrs` (a `free`) releases it.
fn lay_out(entries: &[Entry]) -> *mut libc::ifaddrs {
    const SA: usize = size_of::<libc::sockaddr_storage>();
    let head = entries.len() * size_of::<libc::ifaddrs>();
    let names: usize = entries.iter().map(|e| e.name.len() + 1).sum();
    let total = head + entries.len() * 3 * SA + names;
    // SAFETY: a fresh block of `total` bytes, zeroed, written below within it.
    let block = unsafe { libc::calloc(1, total) } as *mut u8;
    if block.is_null() {
        return ptr::null_mut();
    }
    let mut addr_at = head;
    let mut name_at = head + entries.len() * 3 * SA;
    for (k, e) in entries.iter().enumerate() {
        // SAFETY: every offset written stays below `total` (sizes counted above);
        // the block is malloc-aligned, and entries come first at their own size.
        unsafe {
            let ifa = (block as *mut libc::ifaddrs).add(k);
            let mut put = |b: &Option<Vec<u8>>| -> *mut libc::sockaddr {
                let at = addr_at;
                addr_at += SA;
                match b {
                    Some(b) => {
                        ptr::copy_nonoverlapping(b.as_ptr(), block.add(at), b.len().min(SA));
                        block.add(at) as *mut libc::sockaddr
                    }
                    None => ptr::null_mut(),
                }
            };
            (*ifa).ifa_addr = put(&e.addr);
            (*ifa).ifa_netmask = put(&e.netmask);
            (*ifa).ifa_ifu = put(&e.broadcast);
            ptr::copy_nonoverlapping(e.name.as_ptr(), block.add(name_at), e.name.len());
            (*ifa).ifa_name = block.add(name_at) as *mut c_char;
            name_at += e.name.len() + 1;
            (*ifa).ifa_flags = e.flags;
            (*ifa).ifa_data = ptr::null_mut();
            (*ifa).ifa_next = if k + 1 < entries.len() {
                ifa.add(1)
            } else {
                ptr::null_mut()
            };
        }
    }
    block as *mut libc::ifaddrs
}

/// `getifaddrs(3)` as a program on the stack sees it: the kernel's loopback and
/// the stack's interface. `freeifaddrs(3)` releases the list. The kernel's list
/// when no stack is attached.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn usnet_getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let Some(iface) = stack_iface() else {
        // SAFETY: per the contract.
        return unsafe { libc::getifaddrs(out) };
    };
    let lo = loopback_entries();
    let ours = stack_entries(&iface);
    let entries: Vec<Entry> = lo
        .into_iter()
        .zip(ours)
        .flat_map(|(l, o)| l.into_iter().chain(o))
        .collect();
    let list = lay_out(&entries);
    if list.is_null() {
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return -1;
    }
    // SAFETY: per the contract.
    unsafe { *out = list };
    0
}

/// `if_nametoindex(3)`: the stack's interface by its name, else the kernel's.
///
/// # Safety
/// `name` is a C string.
#[no_mangle]
pub unsafe extern "C" fn usnet_if_nametoindex(name: *const c_char) -> c_uint {
    if let Some(i) = stack_iface() {
        // SAFETY: per the contract.
        if unsafe { CStr::from_ptr(name) }.to_bytes() == i.name.as_bytes() {
            return i.index;
        }
    }
    // SAFETY: per the contract.
    unsafe { libc::if_nametoindex(name) }
}

/// `if_indextoname(3)`: the stack's interface by its index, else the kernel's.
///
/// # Safety
/// `buf` has room for `IF_NAMESIZE` bytes.
#[no_mangle]
pub unsafe extern "C" fn usnet_if_indextoname(index: c_uint, buf: *mut c_char) -> *mut c_char {
    if let Some(i) = stack_iface().filter(|i| i.index == index) {
        let n = i.name.len().min(libc::IF_NAMESIZE - 1);
        // SAFETY: per the contract, `n + 1 <= IF_NAMESIZE` bytes.
        unsafe {
            ptr::copy_nonoverlapping(i.name.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
        return buf;
    }
    // SAFETY: per the contract.
    unsafe { libc::if_indextoname(index, buf) }
}

/// `if_nameindex(3)`: the kernel's loopback and the stack's interface (the
/// kernel's list without a stack). `if_freenameindex(3)` releases it: one
/// `malloc` for the array and one per name, as glibc's.
#[no_mangle]
pub extern "C" fn usnet_if_nameindex() -> *mut libc::if_nameindex {
    let Some(i) = stack_iface() else {
        // SAFETY: no arguments.
        return unsafe { libc::if_nameindex() };
    };
    let mut names: Vec<(c_uint, Vec<u8>)> = Vec::new();
    // SAFETY: a constant C string.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo != 0 {
        names.push((lo, b"lo".to_vec()));
    }
    names.push((i.index, i.name.into_bytes()));
    // SAFETY: a fresh zeroed array with room for the terminating entry.
    let arr = unsafe { libc::calloc(names.len() + 1, size_of::<libc::if_nameindex>()) }
        as *mut libc::if_nameindex;
    if arr.is_null() {
        return arr;
    }
    for (k, (index, name)) in names.iter().enumerate() {
        // SAFETY: `k` is within the array; each name is a fresh block of its
        // length plus a NUL (calloc zeroes it).
        unsafe {
            let n = libc::calloc(1, name.len() + 1) as *mut u8;
            if n.is_null() {
                libc::if_freenameindex(arr);
                return ptr::null_mut();
            }
            ptr::copy_nonoverlapping(name.as_ptr(), n, name.len());
            (*arr.add(k)).if_index = *index;
            (*arr.add(k)).if_name = n as *mut c_char;
        }
    }
    arr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface() -> Iface {
        Iface {
            name: "usntap0".into(),
            index: 7,
            mac: [2, 0, 0, 0, 0, 9],
            mtu: 1500,
            addrs: vec![
                "10.1.2.3/24".into(),
                "fd00::3/64".into(),
                "fe80::1/64".into(),
            ],
        }
    }

    #[test]
    fn a_stacks_interface_lays_out_as_getifaddrs_does() {
        let groups = stack_entries(&iface());
        let entries: Vec<Entry> = groups.into_iter().flatten().collect();
        let list = lay_out(&entries);
        assert!(!list.is_null());
        let mut seen = Vec::new();
        let mut cur = list;
        while !cur.is_null() {
            // SAFETY: the list just laid out.
            let e = unsafe { &*cur };
            let name = unsafe { CStr::from_ptr(e.ifa_name) }
                .to_str()
                .unwrap()
                .to_string();
            let fam = unsafe { (*e.ifa_addr).sa_family } as c_int;
            let text = match fam {
                libc::AF_INET => {
                    let a = unsafe { &*(e.ifa_addr as *const libc::sockaddr_in) };
                    let m = unsafe { &*(e.ifa_netmask as *const libc::sockaddr_in) };
                    let b = unsafe { &*(e.ifa_ifu as *const libc::sockaddr_in) };
                    format!(
                        "{} {} {}",
                        std::net::Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                        std::net::Ipv4Addr::from(m.sin_addr.s_addr.to_ne_bytes()),
                        std::net::Ipv4Addr::from(b.sin_addr.s_addr.to_ne_bytes())
                    )
                }
                libc::AF_INET6 => {
                    let a = unsafe { &*(e.ifa_addr as *const libc::sockaddr_in6) };
                    let m = unsafe { &*(e.ifa_netmask as *const libc::sockaddr_in6) };
                    format!(
                        "{}%{} {}",
                        std::net::Ipv6Addr::from(a.sin6_addr.s6_addr),
                        a.sin6_scope_id,
                        std::net::Ipv6Addr::from(m.sin6_addr.s6_addr)
                    )
                }
                libc::AF_PACKET => {
                    let l = unsafe { &*(e.ifa_addr as *const libc::sockaddr_ll) };
                    format!("index {} mac {:?}", l.sll_ifindex, &l.sll_addr[..6])
                }
                f => format!("family {f}"),
            };
            assert_ne!(e.ifa_flags & libc::IFF_UP as c_uint, 0);
            seen.push(format!("{name} {text}"));
            cur = e.ifa_next;
        }
        // SAFETY: the block lay_out allocated.
        unsafe { libc::free(list as *mut libc::c_void) };
        assert_eq!(
            seen,
            [
                "usntap0 index 7 mac [2, 0, 0, 0, 0, 9]",
                "usntap0 10.1.2.3 255.255.255.0 10.1.2.255",
                "usntap0 fd00::3%0 ffff:ffff:ffff:ffff::",
                "usntap0 fe80::1%7 ffff:ffff:ffff:ffff::",
            ]
        );
    }
}
