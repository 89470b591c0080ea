//! `struct sockaddr` ⇄ `SocketAddr`, checked against the caller's length.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::Errno;

/// The address is `AF_UNSPEC` (what `connect` takes to dissolve an association);
/// false when it is too short to hold a family or null.
///
/// # Safety
/// `ptr` is null or points to `len` readable bytes.
pub unsafe fn is_unspec(ptr: *const libc::sockaddr, len: libc::socklen_t) -> bool {
    if ptr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return false;
    }
    // SAFETY: the caller vouches for `len` readable bytes; the family comes first.
    let family = unsafe { std::ptr::read_unaligned(ptr as *const libc::sa_family_t) };
    family as i32 == libc::AF_UNSPEC
}

/// Reads a `sockaddr_in`/`sockaddr_in6` of `len` bytes at `ptr`.
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes (or null, which is `EFAULT`).
pub unsafe fn from_raw(
    ptr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<SocketAddr, Errno> {
    if ptr.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    let len = len as usize;
    if len < std::mem::size_of::<libc::sa_family_t>() {
        return Err(Errno(libc::EINVAL));
    }
    // SAFETY: the caller vouches for `len` readable bytes; the family comes first.
    let family = unsafe { std::ptr::read_unaligned(ptr as *const libc::sa_family_t) };
    match family as i32 {
        libc::AF_INET => {
            if len < std::mem::size_of::<libc::sockaddr_in>() {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: length checked above; read_unaligned copes with any alignment.
            let a = unsafe { std::ptr::read_unaligned(ptr as *const libc::sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            if len < std::mem::size_of::<libc::sockaddr_in6>() {
                return Err(Errno(libc::EINVAL));
            }
            // SAFETY: as above.
            let a = unsafe { std::ptr::read_unaligned(ptr as *const libc::sockaddr_in6) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                u32::from_be(a.sin6_flowinfo),
                a.sin6_scope_id,
            )))
        }
        _ => Err(Errno(libc::EAFNOSUPPORT)),
    }
}

/// `addr` as the bytes of a `struct sockaddr_in` or `struct sockaddr_in6`.
pub fn to_bytes(addr: SocketAddr) -> Vec<u8> {
    let mut b = Vec::with_capacity(std::mem::size_of::<libc::sockaddr_in6>());
    match addr {
        SocketAddr::V4(a) => {
            b.extend_from_slice(&(libc::AF_INET as libc::sa_family_t).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&[0; 8]);
        }
        SocketAddr::V6(a) => {
            b.extend_from_slice(&(libc::AF_INET6 as libc::sa_family_t).to_ne_bytes());
            b.extend_from_slice(&a.port().to_be_bytes());
            b.extend_from_slice(&a.flowinfo().to_be_bytes());
            b.extend_from_slice(&a.ip().octets());
            b.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

/// Writes `addr` at `ptr` as the kernel does: at most `*len` bytes (truncated), and
/// `*len` set to the full size. Null `ptr` writes nothing.
///
/// # Safety
/// `ptr` must be valid for writes of `*len` bytes, `len` for a read and a write.
pub unsafe fn to_raw(
    addr: SocketAddr,
    ptr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> Result<(), Errno> {
    if ptr.is_null() || len.is_null() {
        return Ok(());
    }
    let bytes = to_bytes(addr);
    // SAFETY: `len` is valid per the contract; we copy at most what the caller has.
    unsafe {
        let room = (*len as usize).min(bytes.len());
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, room);
        *len = bytes.len() as libc::socklen_t;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_and_v6_round_trip_and_truncate() {
        for s in ["10.1.2.3:80", "[fd00::1]:8080"] {
            let a: SocketAddr = s.parse().unwrap();
            let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
            unsafe { to_raw(a, &mut st as *mut _ as *mut libc::sockaddr, &mut len).unwrap() };
            let back = unsafe { from_raw(&st as *const _ as *const libc::sockaddr, len).unwrap() };
            assert_eq!(back, a);
            // Too short a buffer: truncated, full length reported.
            let mut small = [0u8; 4];
            let mut l = 4;
            unsafe { to_raw(a, small.as_mut_ptr() as *mut libc::sockaddr, &mut l).unwrap() };
            assert!(l as usize > 4);
        }
        let bad = [0u8; 1];
        assert_eq!(
            unsafe { from_raw(bad.as_ptr() as *const libc::sockaddr, 1) },
            Err(Errno(libc::EINVAL))
        );
        assert_eq!(
            unsafe { from_raw(std::ptr::null(), 16) },
            Err(Errno(libc::EFAULT))
        );
    }
}
