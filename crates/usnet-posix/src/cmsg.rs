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

/// What a send's control messages ask of its datagram's IP header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendControl {
    /// `IP_PKTINFO`'s `ipi_spec_dst` or `IPV6_PKTINFO`'s `ipi6_addr` (an
    /// unspecified one chooses nothing).
    pub src: Option<std::net::IpAddr>,
    /// `IP_TTL`, `IP_TOS`: for an IPv4 destination.
    pub ttl: Option<u8>,
    pub tos: Option<u8>,
    /// `IPV6_HOPLIMIT`, `IPV6_TCLASS` (-1 chooses nothing): for an IPv6 one.
    pub hop_limit_v6: Option<u8>,
    pub tclass_v6: Option<u8>,
}

impl SendControl {
    /// The hop limit and TOS asked for a destination of this family: Linux
    /// reads only the IPv4 messages for an IPv4 destination (an IPv4-mapped
    /// one on a dual-stack socket too) and only the IPv6 ones for IPv6.
    pub fn header_for(&self, v4: bool) -> (Option<u8>, Option<u8>) {
        if v4 {
            (self.ttl, self.tos)
        } else {
            (self.hop_limit_v6, self.tclass_v6)
        }
    }
}

/// Reads a send's control messages as Linux's `ip_cmsg_send` and
/// `ip6_datagram_send_ctl` do: `IP_PKTINFO`, `IP_TTL` (an `int`, 1–255),
/// `IP_TOS` (an `int` or a byte, 0–255), `IPV6_PKTINFO`, `IPV6_HOPLIMIT` and
/// `IPV6_TCLASS` (an `int`, -1–255). EINVAL for a message of the wrong size or a
/// value out of range; EOPNOTSUPP for any other message, which usnet does not
/// carry (GSO, timestamps, routing headers).
///
/// # Safety
/// As [`each`].
pub unsafe fn send_control(m: &msghdr) -> Res<SendControl> {
    let mut ctl = SendControl::default();
    if m.msg_controllen == 0 {
        return Ok(ctl);
    }
    let einval = || Errno(libc::EINVAL);
    let int = |d: &[u8], lo: i32| -> Res<Option<u8>> {
        let v = i32::from_ne_bytes(d.try_into().map_err(|_| einval())?);
        match v {
            -1 if lo == -1 => Ok(None),
            _ if (lo.max(0)..=255).contains(&v) => Ok(Some(v as u8)),
            _ => Err(einval()),
        }
    };
    // SAFETY: the caller's promise.
    for (level, ty, d) in unsafe { each(m) } {
        match (level, ty) {
            // struct in_pktinfo: ifindex, spec_dst, addr.
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                let a: [u8; 4] = d.get(4..8).ok_or_else(einval)?.try_into().expect("4");
                ctl.src = Some(a.into());
            }
            // struct in6_pktinfo: addr, ifindex.
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                let a: [u8; 16] = d.get(..16).ok_or_else(einval)?.try_into().expect("16");
                ctl.src = Some(a.into());
            }
            (libc::IPPROTO_IP, libc::IP_TTL) => ctl.ttl = int(&d, 1)?,
            (libc::IPPROTO_IP, libc::IP_TOS) if d.len() == 1 => ctl.tos = Some(d[0]),
            (libc::IPPROTO_IP, libc::IP_TOS) => ctl.tos = int(&d, 0)?,
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => ctl.hop_limit_v6 = int(&d, -1)?,
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => ctl.tclass_v6 = int(&d, -1)?,
            _ => return Err(Errno(libc::EOPNOTSUPP)),
        }
    }
    ctl.src = ctl.src.filter(|a| !a.is_unspecified());
    Ok(ctl)
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

/// The `IP_RECVERR` (`IPV6_RECVERR` on an IPv6 socket) message every error
/// queue report ends with, as Linux's `ip_recv_error` / `ipv6_recv_error` write
/// it: a `struct sock_extended_err` (errno, origin, type, code, pad, info, data),
/// then the offender as a `sockaddr_in` (`sockaddr_in6`, IPv4 mapped, on an IPv6
/// socket), or zeros of that size (`AF_UNSPEC`) when there is none.
fn extended_err(
    errno: u32,
    [origin, ee_type, code]: [u8; 3],
    info: u32,
    data: u32,
    offender: Option<std::net::IpAddr>,
    v6: bool,
) -> (i32, i32, Vec<u8>) {
    let room = if v6 {
        std::mem::size_of::<libc::sockaddr_in6>()
    } else {
        std::mem::size_of::<libc::sockaddr_in>()
    };
    let mut ee = Vec::with_capacity(16 + room);
    ee.extend_from_slice(&errno.to_ne_bytes());
    ee.extend_from_slice(&[origin, ee_type, code, 0]);
    ee.extend_from_slice(&info.to_ne_bytes());
    ee.extend_from_slice(&data.to_ne_bytes());
    match offender {
        Some(std::net::IpAddr::V4(a)) if v6 => ee.extend_from_slice(&crate::addr::to_bytes(
            std::net::SocketAddr::new(a.to_ipv6_mapped().into(), 0),
        )),
        Some(a) => ee.extend_from_slice(&crate::addr::to_bytes(std::net::SocketAddr::new(a, 0))),
        None => ee.resize(16 + room, 0),
    }
    let (level, ty) = if v6 {
        (libc::SOL_IPV6, libc::IPV6_RECVERR)
    } else {
        (libc::SOL_IP, libc::IP_RECVERR)
    };
    (level, ty, ee)
}

/// The extended error of a zero-copy completion: origin `SO_EE_ORIGIN_ZEROCOPY`,
/// code `SO_EE_CODE_ZEROCOPY_COPIED` and the id range `lo..=hi` in
/// `ee_info`/`ee_data`, no offender.
pub fn zerocopy_completion(lo: u32, hi: u32, v6: bool) -> (i32, i32, Vec<u8>) {
    // SO_EE_ORIGIN_ZEROCOPY, SO_EE_CODE_ZEROCOPY_COPIED.
    extended_err(0, [5, 0, 1], lo, hi, None, v6)
}

/// The extended error of an ICMP error report on a datagram socket (`v6`: an
/// IPv6 socket): the report's errno, origin, type, code and info, and the ICMP
/// message's sender (none for a local report).
pub fn icmp_error(r: &usnet_client::IcmpErrorReport, v6: bool) -> (i32, i32, Vec<u8>) {
    let kind = [r.origin, r.icmp_type, r.code];
    extended_err(r.errno as u32, kind, r.info, 0, r.offender, v6)
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
    // SO_EE_ORIGIN_TIMESTAMPING.
    let ee = extended_err(libc::ENOMSG as u32, [4, 0, 0], info, key, None, v6);
    (ts, ee)
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

    /// `msgs` (level, type, data) as a send's control buffer, read back.
    fn read_send(msgs: &[(i32, i32, &[u8])]) -> Res<SendControl> {
        let mut buf = [0u64; 32];
        // SAFETY: zeroed msghdr is valid; the control buffer is ours.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_control = buf.as_mut_ptr().cast();
        m.msg_controllen = std::mem::size_of_val(&buf) as _;
        // SAFETY: msg_control has msg_controllen bytes.
        unsafe { put(&mut m, msgs) }.unwrap();
        assert_eq!(m.msg_flags & libc::MSG_CTRUNC, 0);
        // SAFETY: as above; `put` set msg_controllen to what it wrote.
        unsafe { send_control(&m) }
    }

    #[test]
    fn a_send_reads_ttl_tos_and_source_as_linux_and_refuses_the_rest() {
        let i = |v: i32| v.to_ne_bytes();
        let (ip, ip6) = (libc::IPPROTO_IP, libc::IPPROTO_IPV6);
        let mut pktinfo = [0u8; 12];
        pktinfo[4..8].copy_from_slice(&[10, 0, 0, 2]);
        let ctl = read_send(&[
            (ip, libc::IP_PKTINFO, &pktinfo),
            (ip, libc::IP_TTL, &i(3)),
            (ip, libc::IP_TOS, &[0xb9]),
            (ip6, libc::IPV6_HOPLIMIT, &i(-1)),
            (ip6, libc::IPV6_TCLASS, &i(255)),
        ])
        .unwrap();
        assert_eq!(ctl.src, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(ctl.header_for(true), (Some(3), Some(0xb9)));
        assert_eq!(ctl.header_for(false), (None, Some(255)), "-1: the socket's");
        let tos_int = read_send(&[(ip, libc::IP_TOS, &i(0x22))]).unwrap();
        assert_eq!(tos_int.tos, Some(0x22), "IP_TOS as an int");
        let unspecified = read_send(&[(ip, libc::IP_PKTINFO, &[0u8; 12])]).unwrap();
        assert_eq!(
            unspecified,
            SendControl::default(),
            "0.0.0.0 chooses nothing"
        );
        for bad in [
            (ip, libc::IP_TTL, &i(0)[..]),
            (ip, libc::IP_TTL, &i(256)[..]),
            (ip, libc::IP_TTL, &[7u8][..]),
            (ip, libc::IP_TOS, &i(256)[..]),
            (ip, libc::IP_TOS, &i(-1)[..]),
            (ip6, libc::IPV6_HOPLIMIT, &i(-2)[..]),
            (ip6, libc::IPV6_TCLASS, &i(256)[..]),
            (ip, libc::IP_PKTINFO, &[0u8; 6][..]),
        ] {
            assert_eq!(read_send(&[bad]), Err(Errno(libc::EINVAL)), "{bad:?}");
        }
        // UDP_SEGMENT (GSO): not carried.
        assert_eq!(
            read_send(&[(libc::SOL_UDP, 103, &[0u8, 5][..])]),
            Err(Errno(libc::EOPNOTSUPP))
        );
    }
}
