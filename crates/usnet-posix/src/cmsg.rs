//! Control messages a receive hands back (`recvmsg`'s `msg_control`), laid out as
//! Linux lays them out: for libusnet.so, the shim and the packetdrill backend.

use libc::msghdr;

use crate::{Errno, Res};

/// The control messages of `m` (level, type, data), in order.
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` readable bytes.
pub unsafe fn each(m: &msghdr) -> Vec<(i32, i32, Vec<u8>)> {
    let mut out = Vec::new();
    if m.msg_control.is_null() {
        return out;
    }
    // SAFETY: the caller's promise; the CMSG macros stay inside msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let head = data as usize - c as usize;
            let len = ((*c).cmsg_len as usize).saturating_sub(head);
            let bytes = std::slice::from_raw_parts(data, len).to_vec();
            out.push(((*c).cmsg_level, (*c).cmsg_type, bytes));
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    out
}

/// The source address a send's control messages choose: `IP_PKTINFO`'s
/// `ipi_spec_dst` or `IPV6_PKTINFO`'s `ipi6_addr` (an unspecified one chooses
/// nothing). EINVAL for a message shorter than its structure (as Linux's
/// `ip_cmsg_send`); EOPNOTSUPP for any other message, which usnet does not carry
/// (per-send TTL, TOS, GSO, timestamps).
///
/// # Safety
/// As [`each`].
pub unsafe fn source_address(m: &msghdr) -> Res<Option<std::net::IpAddr>> {
    if m.msg_controllen == 0 {
        return Ok(None);
    }
    let mut src = None;
    // SAFETY: the caller's promise.
    for (level, ty, d) in unsafe { each(m) } {
        let short = || Errno(libc::EINVAL);
        let a: std::net::IpAddr = match (level, ty) {
            // struct in_pktinfo: ifindex, spec_dst, addr.
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                <[u8; 4]>::try_from(d.get(4..8).ok_or_else(short)?)
                    .expect("4")
                    .into()
            }
            // struct in6_pktinfo: addr, ifindex.
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                <[u8; 16]>::try_from(d.get(..16).ok_or_else(short)?)
                    .expect("16")
                    .into()
            }
            _ => return Err(Errno(libc::EOPNOTSUPP)),
        };
        if !a.is_unspecified() {
            src = Some(a);
        }
    }
    Ok(src)
}

/// The descriptors of an `SCM_RIGHTS` message's data.
pub fn fds_of(data: &[u8]) -> Vec<i32> {
    data.chunks_exact(4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Writes `cmsgs` (level, type, data) into `m.msg_control` and sets
/// `m.msg_controllen` to the room used, as Linux's `put_cmsg` does: each message
/// takes `CMSG_SPACE` of its data (the last one at least `CMSG_LEN`); one that does
/// not fit is not written and `MSG_CTRUNC` is set in `m.msg_flags`.
///
/// # Safety
/// `m.msg_control` is null or has `m.msg_controllen` writable bytes.
pub unsafe fn put(m: &mut msghdr, cmsgs: &[(i32, i32, &[u8])]) -> Res<()> {
    // msg_controllen is usize on glibc, u32 on musl.
    #[allow(clippy::unnecessary_cast)]
    let room = if m.msg_control.is_null() {
        0
    } else {
        m.msg_controllen as usize
    };
    let base = m.msg_control as *mut u8;
    let mut used = 0usize;
    for &(level, ty, data) in cmsgs {
        // SAFETY: CMSG_LEN and CMSG_SPACE are pure arithmetic.
        let (len, space) = unsafe {
            (
                libc::CMSG_LEN(data.len() as u32) as usize,
                libc::CMSG_SPACE(data.len() as u32) as usize,
            )
        };
        if room - used < len {
            m.msg_flags |= libc::MSG_CTRUNC;
            break;
        }
        let hdr = libc::cmsghdr {
            cmsg_len: len as _,
            cmsg_level: level,
            cmsg_type: ty,
        };
        let data_off = len - data.len();
        // SAFETY: `len` bytes from `base + used` are within the caller's buffer
        // (checked above); cmsghdr is plain data, written unaligned-safe.
        unsafe {
            std::ptr::write_unaligned(base.add(used) as *mut libc::cmsghdr, hdr);
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(used + data_off), data.len());
        }
        used += space.min(room - used);
    }
    if used == 0 && !cmsgs.is_empty() && m.msg_flags & libc::MSG_CTRUNC == 0 {
        return Err(Errno(libc::EINVAL));
    }
    m.msg_controllen = used as _;
    Ok(())
}

/// The `IP_RECVERR` (IPv6: `IPV6_RECVERR`) message of a zero-copy completion: a
/// `sock_extended_err` with origin `SO_EE_ORIGIN_ZEROCOPY`, code
/// `SO_EE_CODE_ZEROCOPY_COPIED` and the id range `lo..=hi` in `ee_info`/`ee_data`,
/// then the offender address (none: zeros, the size of a `sockaddr_in` or
/// `sockaddr_in6`), as Linux's `ip_recv_error` writes it.
pub fn zerocopy_completion(lo: u32, hi: u32, v6: bool) -> (i32, i32, Vec<u8>) {
    // (ee_info, ee_data) carry the range; `tx_timestamp` reuses the layout.
    let offender = if v6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    // struct sock_extended_err: errno, origin, type, code, pad, info, data.
    let mut ee = vec![0u8; 16 + offender];
    ee[4] = 5; // SO_EE_ORIGIN_ZEROCOPY
    ee[6] = 1; // SO_EE_CODE_ZEROCOPY_COPIED
    ee[8..12].copy_from_slice(&lo.to_ne_bytes());
    ee[12..16].copy_from_slice(&hi.to_ne_bytes());
    let (level, ty) = if v6 {
        (libc::SOL_IPV6, libc::IPV6_RECVERR)
    } else {
        (libc::SOL_IP, libc::IP_RECVERR)
    };
    (level, ty, ee)
}

/// A TCP transmit timestamp as Linux reports it (`recvmsg(MSG_ERRQUEUE)`): the
/// `SCM_TIMESTAMPING` payload (`struct scm_timestamping`: the software time in
/// `ts[0]`, `wall_ns` nanoseconds of `CLOCK_REALTIME`, zeros when the socket asked
/// for none), then the `IP_RECVERR` (`IPV6_RECVERR`) cmsg with `ee_errno` `ENOMSG`,
/// origin `SO_EE_ORIGIN_TIMESTAMPING`, the `SCM_TSTAMP_*` kind in `ee_info`, the key
/// in `ee_data` and an empty offender address. Returns (timestamping payload,
/// (level, type, extended error)).
pub fn tx_timestamp(
    info: u32,
    key: u32,
    wall_ns: Option<i64>,
    v6: bool,
) -> (Vec<u8>, (i32, i32, Vec<u8>)) {
    let mut ts = vec![0u8; 3 * std::mem::size_of::<libc::timespec>()];
    if let Some(ns) = wall_ns {
        let sec = ns.div_euclid(1_000_000_000) as libc::time_t;
        let nsec = ns.rem_euclid(1_000_000_000) as libc::c_long;
        let n = std::mem::size_of::<libc::time_t>();
        ts[..n].copy_from_slice(&sec.to_ne_bytes());
        ts[n..2 * n].copy_from_slice(&nsec.to_ne_bytes());
    }
    let (level, ty, mut ee) = zerocopy_completion(info, key, v6);
    ee[..4].copy_from_slice(&(libc::ENOMSG as u32).to_ne_bytes());
    ee[4] = 4; // SO_EE_ORIGIN_TIMESTAMPING
    ee[6] = 0;
    (ts, (level, ty, ee))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_fits_or_truncates() {
        let (level, ty, data) = zerocopy_completion(3, 7, false);
        assert_eq!(
            (level, ty, data.len()),
            (libc::SOL_IP, libc::IP_RECVERR, 32)
        );
        let mut buf = [0u64; 8];
        // SAFETY: zeroed msghdr is valid; the control buffer is ours.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_control = buf.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&buf) as _;
        // SAFETY: msg_control has msg_controllen bytes.
        unsafe { put(&mut m, &[(level, ty, &data)]) }.unwrap();
        // SAFETY: CMSG_SPACE is arithmetic; CMSG_FIRSTHDR reads our msghdr.
        assert_eq!(m.msg_controllen as u32, unsafe { libc::CMSG_SPACE(32) });
        assert_eq!(m.msg_flags & libc::MSG_CTRUNC, 0);
        let c = unsafe { &*libc::CMSG_FIRSTHDR(&m) };
        assert_eq!(
            (c.cmsg_level, c.cmsg_type),
            (libc::SOL_IP, libc::IP_RECVERR)
        );
        let mut small = [0u64; 2];
        m.msg_control = small.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&small) as _;
        m.msg_flags = 0;
        // SAFETY: as above.
        unsafe { put(&mut m, &[(level, ty, &data)]) }.unwrap();
        assert_eq!(m.msg_controllen as usize, 0);
        assert_ne!(m.msg_flags & libc::MSG_CTRUNC, 0);
        // The last message needs only CMSG_LEN: an int in 20 bytes fits.
        let mut exact = [0u32; 5];
        m.msg_control = exact.as_mut_ptr().cast();
        m.msg_controllen = 20;
        m.msg_flags = 0;
        // SAFETY: as above.
        unsafe { put(&mut m, &[(libc::SOL_TCP, 36, &9000i32.to_ne_bytes())]) }.unwrap();
        assert_eq!((m.msg_controllen as usize, m.msg_flags), (20, 0));
        assert_eq!(exact[4], 9000);
    }
}
