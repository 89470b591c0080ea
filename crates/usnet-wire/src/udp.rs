//! UDP (RFC 768; checksum rules for IPv6 from RFC 8200 §8.1).

use std::net::IpAddr;

use crate::bytes::{put16, slice, u16_at};
use crate::checksum::{finish, partial_checksum, pseudo, sum, verifies, IPPROTO_UDP};
use crate::WireError;

/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpHeader<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Checksum field as received (0 = none, IPv4 only).
    pub checksum: u16,
    /// Payload, cut to the length field.
    pub payload: &'a [u8],
}

/// Parse a UDP header. The length field must be >= 8 (`BadLength`) and
/// <= `data.len()` (`Truncated`); bytes beyond it are ignored.
pub fn parse_udp(data: &[u8]) -> Result<UdpHeader<'_>, WireError> {
    if data.len() < UDP_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let len = usize::from(u16_at(data, 4)?);
    if len < UDP_HEADER_LEN {
        return Err(WireError::BadLength);
    }
    if len > data.len() {
        return Err(WireError::Truncated);
    }
    Ok(UdpHeader {
        src_port: u16_at(data, 0)?,
        dst_port: u16_at(data, 2)?,
        checksum: u16_at(data, 6)?,
        payload: slice(data, UDP_HEADER_LEN, len)?,
    })
}

/// Check the checksum of `udp_bytes` (header + payload, exactly the length
/// field's worth). Over IPv4 a zero checksum means "none" and passes; over
/// IPv6 it is invalid. Mixed address families use the IPv6 rules.
pub fn verify_udp_checksum(src: IpAddr, dst: IpAddr, udp_bytes: &[u8]) -> bool {
    let Ok(field) = u16_at(udp_bytes, 6) else {
        return false;
    };
    if field == 0 {
        return src.is_ipv4() && dst.is_ipv4();
    }
    let Ok(len) = u32::try_from(udp_bytes.len()) else {
        return false;
    };
    verifies(pseudo(src, dst, IPPROTO_UDP, len) + sum(udp_bytes))
}

/// Fill in the header at `buf[..8]`, where `buf` is exactly header + payload
/// with the payload already in place. Writes ports and length; the checksum
/// is computed over pseudo-header, header and payload if `compute_checksum`
/// (a result of 0 is sent as 0xffff), otherwise set to 0 (for offload,
/// overwrite it with [`udp_partial_checksum`]).
/// `Truncated` if `buf.len() < 8`, `BadLength` if it exceeds 65535.
pub fn emit_udp_header(
    buf: &mut [u8],
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    dst_port: u16,
    compute_checksum: bool,
) -> Result<(), WireError> {
    if buf.len() < UDP_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let len = u16::try_from(buf.len()).map_err(|_| WireError::BadLength)?;
    put16(buf, 0, src_port)?;
    put16(buf, 2, dst_port)?;
    put16(buf, 4, len)?;
    put16(buf, 6, 0)?;
    if compute_checksum {
        let c = finish(pseudo(src, dst, IPPROTO_UDP, u32::from(len)) + sum(buf));
        put16(buf, 6, if c == 0 { 0xffff } else { c })?;
    }
    Ok(())
}

/// Folded, uncomplemented pseudo-header sum for a UDP datagram of `len`
/// bytes (header + payload), for the device to finish (checksum offload).
pub fn udp_partial_checksum(src: IpAddr, dst: IpAddr, len: u32) -> u16 {
    partial_checksum(src, dst, IPPROTO_UDP, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const S4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1));
    const D4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 0, 199));
    const S6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
    const D6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2));

    #[test]
    fn known_checksum_v4() {
        // 10.0.0.1:1234 -> 10.0.0.2:80 "hi": pseudo 0a00+0001+0a00+0002+0011+000a,
        // header 04d2+0050+000a, data 6869 => sum 0x81b3, checksum 0x7e4c.
        let s = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let d = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mut buf = [0, 0, 0, 0, 0, 0, 0, 0, b'h', b'i'];
        emit_udp_header(&mut buf, s, d, 1234, 80, true).unwrap();
        assert_eq!(
            buf,
            [0x04, 0xd2, 0x00, 0x50, 0x00, 0x0a, 0x7e, 0x4c, b'h', b'i']
        );
        assert!(verify_udp_checksum(s, d, &buf));
        let h = parse_udp(&buf).unwrap();
        assert_eq!(
            (h.src_port, h.dst_port, h.checksum, h.payload),
            (1234, 80, 0x7e4c, &b"hi"[..])
        );
    }

    #[test]
    fn roundtrip_both_families() {
        for (s, d) in [(S4, D4), (S6, D6)] {
            for plen in [0usize, 1, 2, 7, 100, 1472] {
                let mut buf = vec![0u8; UDP_HEADER_LEN + plen];
                for (i, b) in buf[8..].iter_mut().enumerate() {
                    *b = i as u8 ^ 0x5a;
                }
                emit_udp_header(&mut buf, s, d, 5353, 53, true).unwrap();
                assert!(verify_udp_checksum(s, d, &buf));
                let h = parse_udp(&buf).unwrap();
                assert_eq!((h.src_port, h.dst_port, h.payload.len()), (5353, 53, plen));
                let last = buf.len() - 1;
                buf[last] ^= 1;
                assert!(!verify_udp_checksum(s, d, &buf) || plen == 0);
            }
        }
    }

    #[test]
    fn zero_checksum_rules() {
        let mut buf = [0u8; 12];
        emit_udp_header(&mut buf, S4, D4, 1, 2, false).unwrap();
        assert!(verify_udp_checksum(S4, D4, &buf));
        emit_udp_header(&mut buf, S6, D6, 1, 2, false).unwrap();
        assert!(!verify_udp_checksum(S6, D6, &buf));
        assert!(!verify_udp_checksum(S4, D4, &buf[..5]));
    }

    #[test]
    fn computed_zero_becomes_ffff() {
        // Choose the source port so that the full sum is 0xffff, i.e. the
        // checksum would be 0: it must be sent as 0xffff and still verify.
        let mut buf = [0u8; 8];
        emit_udp_header(&mut buf, S4, D4, 0, 7, true).unwrap();
        let c = u16::from_be_bytes([buf[6], buf[7]]);
        // Adding c to the source port makes the sum 0xffff -> checksum 0.
        let mut b2 = [0u8; 8];
        emit_udp_header(&mut b2, S4, D4, c, 7, true).unwrap();
        assert_eq!(u16::from_be_bytes([b2[6], b2[7]]), 0xffff);
        assert!(verify_udp_checksum(S4, D4, &b2));
    }

    #[test]
    fn partial_checksum_offload() {
        // Device completes: finish(partial + sum(header with partial in place... ))
        // Linux semantics: the device sums from the UDP header (with the
        // partial value in the checksum field) to the end and complements.
        let mut buf = [0u8; 8 + 5];
        buf[8..].copy_from_slice(b"hello");
        emit_udp_header(&mut buf, S6, D6, 9, 10, false).unwrap();
        let p = udp_partial_checksum(S6, D6, buf.len() as u32);
        buf[6..8].copy_from_slice(&p.to_be_bytes());
        let dev = finish(sum(&buf));
        buf[6..8].copy_from_slice(&dev.to_be_bytes());
        assert!(verify_udp_checksum(S6, D6, &buf));
    }

    #[test]
    fn parse_errors() {
        let mut buf = [0u8; 16];
        emit_udp_header(&mut buf, S4, D4, 1, 2, true).unwrap();
        for n in 0..16 {
            assert_eq!(parse_udp(&buf[..n]), Err(WireError::Truncated), "len {n}");
        }
        buf[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse_udp(&buf), Err(WireError::BadLength));
        assert_eq!(
            emit_udp_header(&mut buf[..7], S4, D4, 1, 2, true),
            Err(WireError::Truncated)
        );
        let mut big = vec![0u8; 65536];
        assert_eq!(
            emit_udp_header(&mut big, S4, D4, 1, 2, true),
            Err(WireError::BadLength)
        );
    }
}
