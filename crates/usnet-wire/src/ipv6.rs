//! IPv6 header (RFC 8200), extension-header walk, and address helpers.

use std::net::Ipv6Addr;

use crate::bytes::{get, put, put16, put32, slice, u16_at, u32_at, u8_at};
use crate::checksum::{
    IPPROTO_AH, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_NONE, IPPROTO_ROUTING,
};
use crate::ethernet::MacAddr;
use crate::WireError;

/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a Fragment extension header.
pub const IPV6_FRAG_HEADER_LEN: usize = 8;
/// Most extension headers `skip_ext_headers` walks before giving up.
pub const MAX_EXT_HEADERS: usize = 16;

/// A parsed IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Header<'a> {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// First next-header value (may be an extension header).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length field.
    pub payload_len: usize,
    /// Traffic class (DSCP + ECN).
    pub traffic_class: u8,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// Exactly `payload_len` bytes after the fixed header.
    pub payload: &'a [u8],
}

impl Ipv6Header<'_> {
    /// The emit-side description of this header (class and flow label dropped).
    pub fn repr(&self) -> Ipv6Repr {
        Ipv6Repr {
            src: self.src,
            dst: self.dst,
            next_header: self.next_header,
            payload_len: self.payload_len,
            hop_limit: self.hop_limit,
        }
    }
}

/// Parse the fixed IPv6 header. Payload length 0 with a Hop-by-Hop header
/// signals a jumbogram (RFC 2675): `Unsupported`.
pub fn parse_ipv6(data: &[u8]) -> Result<Ipv6Header<'_>, WireError> {
    let ip = parse_ipv6_prefix(data)?;
    if IPV6_HEADER_LEN + ip.payload_len > data.len() {
        return Err(WireError::Truncated);
    }
    Ok(ip)
}

/// [`parse_ipv6`] for the first bytes of a packet whose rest lies elsewhere (the
/// first buffer of a chained frame): the fixed header must be in `data`, and
/// `payload` is the part of the payload that `data` holds.
pub fn parse_ipv6_prefix(data: &[u8]) -> Result<Ipv6Header<'_>, WireError> {
    let first = u32_at(data, 0)?;
    if first >> 28 != 6 {
        return Err(WireError::BadVersion);
    }
    if data.len() < IPV6_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let payload_len = usize::from(u16_at(data, 4)?);
    let next_header = u8_at(data, 6)?;
    if payload_len == 0 && next_header == IPPROTO_HOPOPTS {
        return Err(WireError::Unsupported);
    }
    let end = (IPV6_HEADER_LEN + payload_len).min(data.len());
    Ok(Ipv6Header {
        src: Ipv6Addr::from(get::<16>(data, 8)?),
        dst: Ipv6Addr::from(get::<16>(data, 24)?),
        next_header,
        hop_limit: u8_at(data, 7)?,
        payload_len,
        traffic_class: (first >> 20) as u8,
        flow_label: first & 0x000f_ffff,
        payload: slice(data, IPV6_HEADER_LEN, end)?,
    })
}

/// Fragment header contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6FragInfo {
    /// Offset in bytes (the wire field times 8).
    pub offset: u16,
    /// M flag.
    pub more: bool,
    /// Identification.
    pub ident: u32,
}

/// Result of walking the extension-header chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Upper<'a> {
    /// Upper-layer protocol, or the header that follows a Fragment header,
    /// or 59 (no next header), or 50 (ESP, opaque).
    pub protocol: u8,
    /// Bytes of extension headers skipped (from the start of the IPv6 payload).
    pub offset: usize,
    /// Set if a Fragment header was met; the walk stops right after it.
    pub frag: Option<Ipv6FragInfo>,
    /// Bytes after the skipped headers (empty for protocol 59).
    pub payload: &'a [u8],
}

/// Walk Hop-by-Hop, Routing, Destination Options and AH headers starting
/// with next-header value `first` over the IPv6 `payload`, until an upper
/// protocol is reached.
///
/// A Fragment header ends the walk: `frag` is set, `protocol` is the Fragment
/// header's next-header value and `payload` is the fragment data. After
/// reassembly (or for an atomic fragment: offset 0, !more) call this again
/// with `(upper.protocol, reassembled)` to continue past any further headers.
///
/// Errors: `Truncated` if a header runs past the payload, `Malformed` for a
/// Hop-by-Hop header that is not first or more than 16 headers.
pub fn skip_ext_headers(first: u8, payload: &[u8]) -> Result<Ipv6Upper<'_>, WireError> {
    let mut proto = first;
    let mut offset = 0usize;
    // One extra round so that an upper protocol after 16 headers is accepted.
    for i in 0..=MAX_EXT_HEADERS {
        let is_ext = matches!(
            proto,
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
        );
        if is_ext && i == MAX_EXT_HEADERS {
            return Err(WireError::Malformed);
        }
        let len = match proto {
            IPPROTO_HOPOPTS if i != 0 => return Err(WireError::Malformed),
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                (usize::from(u8_at(payload, offset + 1)?) + 1) * 8
            }
            // AH counts 4-byte units, minus 2 (RFC 4302 §2.2).
            IPPROTO_AH => (usize::from(u8_at(payload, offset + 1)?) + 2) * 4,
            IPPROTO_FRAGMENT => {
                let h = slice(payload, offset, offset + IPV6_FRAG_HEADER_LEN)?;
                let off_m = u16_at(h, 2)?;
                let frag = Ipv6FragInfo {
                    offset: off_m & !0x7,
                    more: off_m & 1 != 0,
                    ident: u32_at(h, 4)?,
                };
                let next = u8_at(h, 0)?;
                let offset = offset + IPV6_FRAG_HEADER_LEN;
                return Ok(Ipv6Upper {
                    protocol: next,
                    offset,
                    frag: Some(frag),
                    payload: slice(payload, offset, payload.len())?,
                });
            }
            IPPROTO_NONE => {
                return Ok(Ipv6Upper {
                    protocol: IPPROTO_NONE,
                    offset,
                    frag: None,
                    payload: &[],
                })
            }
            _ => {
                return Ok(Ipv6Upper {
                    protocol: proto,
                    offset,
                    frag: None,
                    payload: slice(payload, offset, payload.len())?,
                })
            }
        };
        let end = offset + len;
        if end > payload.len() {
            return Err(WireError::Truncated);
        }
        proto = u8_at(payload, offset)?;
        offset = end;
    }
    Err(WireError::Malformed)
}

/// What to put in an emitted IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Next header.
    pub next_header: u8,
    /// Payload length (everything after the 40-byte header).
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Length `emit` writes.
    pub const fn header_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Write the 40-byte header (traffic class and flow label 0) into
    /// `buf[..40]`. `BadLength` if `payload_len > 65535`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < IPV6_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let plen = u16::try_from(self.payload_len).map_err(|_| WireError::BadLength)?;
        put32(buf, 0, 6 << 28)?;
        put16(buf, 4, plen)?;
        put(buf, 6, &[self.next_header, self.hop_limit])?;
        put(buf, 8, &self.src.octets())?;
        put(buf, 24, &self.dst.octets())
    }
}

/// Write an 8-byte Fragment header. `offset` is in bytes and must be a
/// multiple of 8 (`Malformed` otherwise).
pub fn emit_ipv6_fragment_header(
    buf: &mut [u8],
    next_header: u8,
    offset: u16,
    more: bool,
    ident: u32,
) -> Result<(), WireError> {
    if buf.len() < IPV6_FRAG_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    if offset & 7 != 0 {
        return Err(WireError::Malformed);
    }
    put(buf, 0, &[next_header, 0])?;
    put16(buf, 2, offset | u16::from(more))?;
    put32(buf, 4, ident)
}

/// The solicited-node multicast address ff02::1:ffXX:XXXX (RFC 4291 §2.7.1).
pub fn solicited_node(addr: &Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, o[13], o[14], o[15],
    ])
}

/// fe80::/64 with the modified EUI-64 interface identifier of `mac`
/// (RFC 4291 appendix A: U/L bit flipped, ff:fe in the middle).
pub fn link_local_from_mac(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn packet(next: u8, payload: &[u8]) -> Vec<u8> {
        let r = Ipv6Repr {
            src: a("fe80::1"),
            dst: a("ff02::1"),
            next_header: next,
            payload_len: payload.len(),
            hop_limit: 255,
        };
        let mut p = vec![0u8; 40];
        r.emit(&mut p).unwrap();
        p.extend_from_slice(payload);
        p
    }

    /// The first bytes of a packet that goes on in another buffer: the full parse
    /// refuses them, the prefix parse gives the header and what is here of the
    /// payload; a fixed header cut short is refused by both.
    #[test]
    fn a_prefix_holds_the_header_and_part_of_the_payload() {
        let p = packet(6, &[9; 100]);
        assert_eq!(parse_ipv6(&p[..60]), Err(WireError::Truncated));
        let h = parse_ipv6_prefix(&p[..60]).unwrap();
        assert_eq!(
            (h.payload_len, h.payload.len(), h.next_header),
            (100, 20, 6)
        );
        assert_eq!(parse_ipv6_prefix(&p).unwrap().payload.len(), 100);
        assert_eq!(parse_ipv6_prefix(&p[..39]), Err(WireError::Truncated));
    }

    #[test]
    fn roundtrip_and_padding() {
        let mut p = packet(17, &[1, 2, 3, 4, 5, 6, 7, 8]);
        p.extend_from_slice(&[0, 0]); // link padding
        let h = parse_ipv6(&p).unwrap();
        assert_eq!(h.repr().src, a("fe80::1"));
        assert_eq!((h.next_header, h.hop_limit, h.payload_len), (17, 255, 8));
        assert_eq!(h.payload, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!((h.traffic_class, h.flow_label), (0, 0));
        let mut out = [0u8; 40];
        h.repr().emit(&mut out).unwrap();
        assert_eq!(out[..], p[..40]);
        for n in 0..48 {
            assert!(parse_ipv6(&p[..n]).is_err(), "len {n}");
        }
    }

    #[test]
    fn class_flow_version_jumbo() {
        let mut p = packet(59, &[]);
        p[0..4].copy_from_slice(&0x6ab1_2345u32.to_be_bytes());
        let h = parse_ipv6(&p).unwrap();
        assert_eq!((h.traffic_class, h.flow_label), (0xab, 0x1_2345));
        let rep = h.repr();
        p[0] = 0x45;
        assert_eq!(parse_ipv6(&p), Err(WireError::BadVersion));
        let j = packet(0, &[]);
        assert_eq!(parse_ipv6(&j), Err(WireError::Unsupported));
        let big = Ipv6Repr {
            payload_len: 65536,
            ..rep
        };
        assert_eq!(big.emit(&mut [0u8; 40]), Err(WireError::BadLength));
    }

    #[test]
    fn ext_chain() {
        // HBH (8) -> DstOpts (16) -> Routing (8) -> AH (12) -> UDP
        let mut pl = vec![];
        pl.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]);
        pl.extend_from_slice(&[43, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        pl.extend_from_slice(&[51, 0, 0, 0, 0, 0, 0, 0]);
        pl.extend_from_slice(&[17, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]);
        pl.extend_from_slice(&[9, 9, 9]);
        let u = skip_ext_headers(0, &pl).unwrap();
        assert_eq!((u.protocol, u.offset, u.frag), (17, 44, None));
        assert_eq!(u.payload, &[9, 9, 9]);
        for n in 0..44 {
            assert_eq!(
                skip_ext_headers(0, &pl[..n]),
                Err(WireError::Truncated),
                "len {n}"
            );
        }
        // No extension headers at all.
        let u = skip_ext_headers(6, &[1, 2]).unwrap();
        assert_eq!((u.protocol, u.offset, u.payload), (6, 0, &[1u8, 2][..]));
        // No next header: rest ignored.
        let u = skip_ext_headers(60, &[59, 0, 0, 0, 0, 0, 0, 0, 7, 7]).unwrap();
        assert_eq!((u.protocol, u.offset, u.payload), (59, 8, &[][..]));
    }

    #[test]
    fn fragment_stops_walk() {
        let mut pl = [0u8; 8 + 8 + 4];
        pl[..8].copy_from_slice(&[44, 0, 0, 0, 0, 0, 0, 0]); // DstOpts -> Frag
        emit_ipv6_fragment_header(&mut pl[8..], 60, 1448, true, 0xdead_beef).unwrap();
        let u = skip_ext_headers(60, &pl).unwrap();
        assert_eq!(u.protocol, 60);
        assert_eq!(u.offset, 16);
        assert_eq!(
            u.frag,
            Some(Ipv6FragInfo {
                offset: 1448,
                more: true,
                ident: 0xdead_beef
            })
        );
        assert_eq!(u.payload.len(), 4);
        assert_eq!(
            emit_ipv6_fragment_header(&mut pl, 6, 3, false, 0),
            Err(WireError::Malformed)
        );
        assert_eq!(
            emit_ipv6_fragment_header(&mut pl[..7], 6, 8, false, 0),
            Err(WireError::Truncated)
        );
        // Max offset survives.
        emit_ipv6_fragment_header(&mut pl, 17, 65528, false, 1).unwrap();
        let u = skip_ext_headers(44, &pl).unwrap();
        assert_eq!(u.frag.unwrap().offset, 65528);
        assert!(!u.frag.unwrap().more);
    }

    #[test]
    fn loops_and_misplaced_hbh() {
        // 17 DstOpts headers in a row.
        let mut pl = vec![];
        for _ in 0..17 {
            pl.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
        }
        assert_eq!(skip_ext_headers(60, &pl), Err(WireError::Malformed));
        // 16 headers then UDP is fine.
        pl[15 * 8] = 17;
        assert_eq!(skip_ext_headers(60, &pl).unwrap().protocol, 17);
        let hbh_second = [0u8, 0, 0, 0, 0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(skip_ext_headers(60, &hbh_second), Err(WireError::Malformed));
    }

    #[test]
    fn address_helpers() {
        assert_eq!(
            solicited_node(&a("2001:db8::abcd:1234:5678")),
            a("ff02::1:ff34:5678")
        );
        let mac = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(link_local_from_mac(mac), a("fe80::5054:ff:fe12:3456"));
    }
}
