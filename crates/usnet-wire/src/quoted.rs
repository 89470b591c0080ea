//! The invoking packet an ICMP error quotes (RFC 792: the IP header and at least 8
//! bytes of its payload; RFC 4443: as much as fits in 1280 bytes). It is nearly
//! always cut short, so lengths are not checked against the buffer and the header
//! checksum is not verified (routers may have changed the TTL).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{get, slice, u16_at, u8_at};
use crate::ipv6::skip_ext_headers;
use crate::WireError;

/// An invoking packet: its addresses, its upper-layer protocol, and the first bytes
/// of that protocol's header (for TCP and UDP: the ports, and TCP's sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotedPacket<'a> {
    /// Source of the invoking packet (our address, for a packet we sent).
    pub src: IpAddr,
    /// Its destination.
    pub dst: IpAddr,
    /// Upper-layer protocol.
    pub protocol: u8,
    /// The upper-layer bytes that were quoted (at least 8).
    pub l4: &'a [u8],
}

impl QuotedPacket<'_> {
    /// `(source port, destination port)` of a TCP or UDP header.
    pub fn ports(&self) -> (u16, u16) {
        (
            u16::from_be_bytes([self.l4[0], self.l4[1]]),
            u16::from_be_bytes([self.l4[2], self.l4[3]]),
        )
    }

    /// Bytes 4..8 of the upper-layer header: TCP's sequence number.
    pub fn tcp_seq(&self) -> u32 {
        u32::from_be_bytes([self.l4[4], self.l4[5], self.l4[6], self.l4[7]])
    }
}

/// Bytes of the upper-layer header a quote must hold (RFC 792's 64 bits).
const QUOTED_L4_MIN: usize = 8;

/// Read the IPv4 packet quoted by an ICMPv4 error. A non-first fragment (no
/// upper-layer header) is `Unsupported`.
pub fn parse_quoted_ipv4(b: &[u8]) -> Result<QuotedPacket<'_>, WireError> {
    let vihl = u8_at(b, 0)?;
    if vihl >> 4 != 4 {
        return Err(WireError::BadVersion);
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(WireError::Malformed);
    }
    if u16_at(b, 6)? & 0x1fff != 0 {
        return Err(WireError::Unsupported);
    }
    let protocol = u8_at(b, 9)?;
    let src = Ipv4Addr::from(get::<4>(b, 12)?);
    let dst = Ipv4Addr::from(get::<4>(b, 16)?);
    let l4 = slice(b, ihl, b.len())?;
    if l4.len() < QUOTED_L4_MIN {
        return Err(WireError::Truncated);
    }
    Ok(QuotedPacket {
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
        protocol,
        l4,
    })
}

/// Read the IPv6 packet quoted by an ICMPv6 error, past any extension headers. A
/// non-first fragment is `Unsupported`.
pub fn parse_quoted_ipv6(b: &[u8]) -> Result<QuotedPacket<'_>, WireError> {
    if u8_at(b, 0)? >> 4 != 6 {
        return Err(WireError::BadVersion);
    }
    let next = u8_at(b, 6)?;
    let src = Ipv6Addr::from(get::<16>(b, 8)?);
    let dst = Ipv6Addr::from(get::<16>(b, 24)?);
    let up = skip_ext_headers(next, slice(b, 40, b.len())?)?;
    if up.frag.is_some_and(|f| f.offset != 0) {
        return Err(WireError::Unsupported);
    }
    if up.payload.len() < QUOTED_L4_MIN {
        return Err(WireError::Truncated);
    }
    Ok(QuotedPacket {
        src: IpAddr::V6(src),
        dst: IpAddr::V6(dst),
        protocol: up.protocol,
        l4: up.payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Ipv4Repr, Ipv6Repr, IPPROTO_FRAGMENT, IPPROTO_TCP, IPPROTO_UDP};

    fn v4_packet(frag_offset: u16, l4: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 20 + l4.len()];
        Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 2),
            dst: Ipv4Addr::new(10, 9, 0, 1),
            protocol: IPPROTO_TCP,
            payload_len: 1400,
            ttl: 64,
            ident: 7,
            dont_frag: frag_offset == 0,
            more_frags: false,
            frag_offset,
        }
        .emit(&mut b)
        .unwrap();
        b[20..].copy_from_slice(l4);
        b
    }

    #[test]
    fn ipv4_quote_cut_after_eight_bytes() {
        let l4 = [0x9c, 0x40, 0x00, 0x50, 0x12, 0x34, 0x56, 0x78];
        let b = v4_packet(0, &l4);
        let q = parse_quoted_ipv4(&b).unwrap();
        assert_eq!(q.src, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(q.dst, IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(q.protocol, IPPROTO_TCP);
        assert_eq!(q.ports(), (40000, 80));
        assert_eq!(q.tcp_seq(), 0x1234_5678);
        assert_eq!(
            parse_quoted_ipv4(&b[..27]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            parse_quoted_ipv4(&v4_packet(1480, &l4)).unwrap_err(),
            WireError::Unsupported
        );
        let mut v6 = b.clone();
        v6[0] = 0x65;
        assert_eq!(parse_quoted_ipv4(&v6).unwrap_err(), WireError::BadVersion);
        // A header with options: the upper layer starts after them.
        let mut opt = b[..20].to_vec();
        opt[0] = 0x46;
        opt.extend_from_slice(&[1, 1, 1, 0]);
        opt.extend_from_slice(&l4);
        assert_eq!(parse_quoted_ipv4(&opt).unwrap().tcp_seq(), 0x1234_5678);
        for k in 0..b.len() {
            let _ = parse_quoted_ipv4(&b[..k]);
        }
    }

    #[test]
    fn ipv6_quote_with_and_without_extension_headers() {
        let src: Ipv6Addr = "fd00::2".parse().unwrap();
        let dst: Ipv6Addr = "fd09::1".parse().unwrap();
        let l4 = [0x00, 0x35, 0xc0, 0x00, 0, 0, 0, 1];
        let mut b = vec![0u8; 40];
        Ipv6Repr {
            src,
            dst,
            next_header: IPPROTO_UDP,
            payload_len: 1400,
            hop_limit: 64,
        }
        .emit(&mut b)
        .unwrap();
        let mut plain = b.clone();
        plain.extend_from_slice(&l4);
        let q = parse_quoted_ipv6(&plain).unwrap();
        assert_eq!((q.src, q.dst), (IpAddr::V6(src), IpAddr::V6(dst)));
        assert_eq!(q.protocol, IPPROTO_UDP);
        assert_eq!(q.ports(), (53, 0xc000));
        // Destination options (8 bytes) before the UDP header.
        let mut ext = b.clone();
        ext[6] = 60;
        ext.extend_from_slice(&[IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0]);
        ext.extend_from_slice(&l4);
        assert_eq!(parse_quoted_ipv6(&ext).unwrap().ports(), (53, 0xc000));
        // A non-first fragment carries no UDP header.
        let mut frag = b.clone();
        frag[6] = IPPROTO_FRAGMENT;
        frag.extend_from_slice(&[IPPROTO_UDP, 0, 0x05, 0xa8, 0, 0, 0, 9]);
        frag.extend_from_slice(&l4);
        assert_eq!(
            parse_quoted_ipv6(&frag).unwrap_err(),
            WireError::Unsupported
        );
        assert_eq!(
            parse_quoted_ipv6(&plain[..47]).unwrap_err(),
            WireError::Truncated
        );
        for k in 0..ext.len() {
            let _ = parse_quoted_ipv6(&ext[..k]);
        }
    }
}
