//! IPv4 header (RFC 791). Options are skipped, never interpreted.

use std::net::Ipv4Addr;

use crate::bytes::{get, put, put16, slice, u16_at, u8_at};
use crate::checksum::{finish, sum, verifies};
use crate::WireError;

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A parsed IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Header<'a> {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Upper-layer protocol.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// Identification (for reassembly).
    pub ident: u16,
    /// Don't Fragment.
    pub dont_frag: bool,
    /// More Fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes (the wire field times 8).
    pub frag_offset: u16,
    /// Header length in bytes including options (20..=60).
    pub header_len: usize,
    /// Total length field.
    pub total_len: usize,
    /// The former TOS byte: DSCP (high 6 bits) and ECN (low 2).
    pub dscp_ecn: u8,
    /// Exactly `total_len - header_len` bytes: link padding is cut off.
    pub payload: &'a [u8],
}

impl Ipv4Header<'_> {
    /// True if this is a fragment (MF set or non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.more_frags || self.frag_offset != 0
    }

    /// The emit-side description of this header (options and DSCP dropped).
    pub fn repr(&self) -> Ipv4Repr {
        Ipv4Repr {
            src: self.src,
            dst: self.dst,
            protocol: self.protocol,
            payload_len: self.payload.len(),
            ttl: self.ttl,
            ident: self.ident,
            dont_frag: self.dont_frag,
            more_frags: self.more_frags,
            frag_offset: self.frag_offset,
        }
    }
}

/// Parse an IPv4 header. Checks version 4, IHL >= 5, IHL*4 <= total length
/// <= `data.len()` and, if `verify_checksum`, the header checksum.
pub fn parse_ipv4(data: &[u8], verify_checksum: bool) -> Result<Ipv4Header<'_>, WireError> {
    let ip = parse_ipv4_prefix(data, verify_checksum)?;
    if ip.total_len > data.len() {
        return Err(WireError::Truncated);
    }
    Ok(ip)
}

/// [`parse_ipv4`] for the first bytes of a packet whose rest lies elsewhere (the
/// first buffer of a chained frame): the whole header must be in `data`, the
/// payload need not be, and `payload` is the part of it that `data` holds (shorter
/// than `total_len - header_len` when the packet goes on).
pub fn parse_ipv4_prefix(data: &[u8], verify_checksum: bool) -> Result<Ipv4Header<'_>, WireError> {
    let vihl = u8_at(data, 0)?;
    if vihl >> 4 != 4 {
        return Err(WireError::BadVersion);
    }
    if data.len() < IPV4_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let header_len = usize::from(vihl & 0x0f) * 4;
    if header_len < IPV4_HEADER_LEN {
        return Err(WireError::BadLength);
    }
    let total_len = usize::from(u16_at(data, 2)?);
    if total_len < header_len {
        return Err(WireError::BadLength);
    }
    let header = slice(data, 0, header_len)?;
    if verify_checksum && !verifies(sum(header)) {
        return Err(WireError::BadChecksum);
    }
    let frag = u16_at(data, 6)?;
    Ok(Ipv4Header {
        src: Ipv4Addr::from(get::<4>(data, 12)?),
        dst: Ipv4Addr::from(get::<4>(data, 16)?),
        protocol: u8_at(data, 9)?,
        ttl: u8_at(data, 8)?,
        ident: u16_at(data, 4)?,
        dont_frag: frag & FLAG_DF != 0,
        more_frags: frag & FLAG_MF != 0,
        // At most 8191 * 8 = 65528: fits.
        frag_offset: (frag & OFFSET_MASK) << 3,
        header_len,
        total_len,
        dscp_ecn: u8_at(data, 1)?,
        payload: slice(data, header_len, total_len.min(data.len()))?,
    })
}

/// What to put in an emitted 20-byte IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Upper-layer protocol.
    pub protocol: u8,
    /// Bytes after the header; total length = 20 + this.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_frag: bool,
    /// More Fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes; must be a multiple of 8.
    pub frag_offset: u16,
}

impl Ipv4Repr {
    /// Length `emit` writes.
    pub const fn header_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Write a 20-byte header (no options, DSCP/ECN 0) with a correct header
    /// checksum into `buf[..20]`. `BadLength` if the total length exceeds
    /// 65535, `Malformed` if `frag_offset` is not a multiple of 8.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < IPV4_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let total = self
            .payload_len
            .checked_add(IPV4_HEADER_LEN)
            .and_then(|t| u16::try_from(t).ok())
            .ok_or(WireError::BadLength)?;
        if self.frag_offset & 7 != 0 {
            return Err(WireError::Malformed);
        }
        let mut frag = self.frag_offset >> 3;
        if self.dont_frag {
            frag |= FLAG_DF;
        }
        if self.more_frags {
            frag |= FLAG_MF;
        }
        put(buf, 0, &[0x45, 0])?;
        put16(buf, 2, total)?;
        put16(buf, 4, self.ident)?;
        put16(buf, 6, frag)?;
        put(buf, 8, &[self.ttl, self.protocol, 0, 0])?;
        put(buf, 12, &self.src.octets())?;
        put(buf, 16, &self.dst.octets())?;
        let c = finish(sum(slice(buf, 0, IPV4_HEADER_LEN)?));
        put16(buf, 10, c)
    }

    /// As [`Ipv4Repr::emit`], with `options` (whole 32-bit words, at most 40
    /// bytes, e.g. [`crate::IPV4_ROUTER_ALERT`]) after the fixed header:
    /// `20 + options.len()` bytes. `payload_len` still counts only the payload.
    pub fn emit_with_options(&self, options: &[u8], buf: &mut [u8]) -> Result<(), WireError> {
        if !options.len().is_multiple_of(4) || options.len() > 40 {
            return Err(WireError::Malformed);
        }
        let hl = IPV4_HEADER_LEN + options.len();
        if buf.len() < hl {
            return Err(WireError::Truncated);
        }
        let with = Ipv4Repr {
            payload_len: self
                .payload_len
                .checked_add(options.len())
                .ok_or(WireError::BadLength)?,
            ..*self
        };
        with.emit(buf)?;
        put(buf, IPV4_HEADER_LEN, options)?;
        buf[0] = 0x40 | (hl / 4) as u8;
        buf[10..12].fill(0);
        let c = finish(sum(slice(buf, 0, hl)?));
        put16(buf, 10, c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The classic textbook header: 192.168.0.1 -> 192.168.0.199, UDP,
    /// total length 0x73, DF, TTL 64, checksum 0xb861.
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    fn packet() -> [u8; 0x73 + 4] {
        // Header, payload, then 4 bytes of link padding.
        let mut p = [0xeeu8; 0x73 + 4];
        p[..20].copy_from_slice(&HDR);
        p
    }

    /// The first bytes of a packet that goes on in another buffer: the full parse
    /// refuses them, the prefix parse gives the header and what is here of the
    /// payload; a header cut short is refused by both.
    #[test]
    fn a_prefix_holds_the_header_and_part_of_the_payload() {
        let p = packet();
        assert_eq!(parse_ipv4(&p[..50], true), Err(WireError::Truncated));
        let h = parse_ipv4_prefix(&p[..50], true).unwrap();
        assert_eq!((h.total_len, h.header_len, h.payload.len()), (0x73, 20, 30));
        assert_eq!(h.src, Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(
            parse_ipv4_prefix(&p, true).unwrap().payload.len(),
            0x73 - 20
        );
        assert_eq!(parse_ipv4_prefix(&p[..19], true), Err(WireError::Truncated));
        let mut bad = p;
        bad[10] ^= 1;
        assert_eq!(
            parse_ipv4_prefix(&bad[..50], true),
            Err(WireError::BadChecksum)
        );
    }

    #[test]
    fn known_header() {
        let p = packet();
        let h = parse_ipv4(&p, true).unwrap();
        assert_eq!(h.src, Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(h.dst, Ipv4Addr::new(192, 168, 0, 199));
        assert_eq!((h.protocol, h.ttl, h.ident), (17, 64, 0));
        assert!(h.dont_frag && !h.more_frags && h.frag_offset == 0 && !h.is_fragment());
        assert_eq!((h.header_len, h.total_len), (20, 0x73));
        assert_eq!(h.payload.len(), 0x73 - 20);
        let mut out = [0u8; 20];
        h.repr().emit(&mut out).unwrap();
        assert_eq!(out, HDR);
    }

    #[test]
    fn checksum_and_fields_checked() {
        let mut p = packet();
        p[11] ^= 1;
        assert_eq!(parse_ipv4(&p, true), Err(WireError::BadChecksum));
        assert!(parse_ipv4(&p, false).is_ok());
        let mut p = packet();
        p[0] = 0x65;
        assert_eq!(parse_ipv4(&p, false), Err(WireError::BadVersion));
        let mut p = packet();
        p[0] = 0x44;
        assert_eq!(parse_ipv4(&p, false), Err(WireError::BadLength));
        let mut p = packet();
        p[2..4].copy_from_slice(&19u16.to_be_bytes());
        assert_eq!(parse_ipv4(&p, false), Err(WireError::BadLength));
        let mut p = packet();
        p[0] = 0x4f; // IHL 60 > total_len 0x73? no: 60 <= 115, but checksum off
        let h = parse_ipv4(&p, false).unwrap();
        assert_eq!((h.header_len, h.payload.len()), (60, 0x73 - 60));
    }

    #[test]
    fn truncations() {
        let p = packet();
        for n in 0..0x73 {
            assert!(parse_ipv4(&p[..n], true).is_err(), "len {n}");
        }
    }

    #[test]
    fn roundtrip_fragment() {
        let r = Ipv4Repr {
            src: Ipv4Addr::new(10, 1, 2, 3),
            dst: Ipv4Addr::new(10, 3, 2, 1),
            protocol: 6,
            payload_len: 1480,
            ttl: 1,
            ident: 0xbeef,
            dont_frag: false,
            more_frags: true,
            frag_offset: 65528,
        };
        let mut buf = [0u8; 1500];
        r.emit(&mut buf).unwrap();
        let h = parse_ipv4(&buf, true).unwrap();
        assert_eq!(h.repr(), r);
        assert!(h.is_fragment());
        assert_eq!(r.emit(&mut buf[..19]), Err(WireError::Truncated));
        let bad = Ipv4Repr {
            frag_offset: 12,
            ..r
        };
        assert_eq!(bad.emit(&mut buf), Err(WireError::Malformed));
        let big = Ipv4Repr {
            payload_len: 65516,
            ..r
        };
        assert_eq!(big.emit(&mut buf), Err(WireError::BadLength));
        let max = Ipv4Repr {
            payload_len: 65515,
            ..r
        };
        assert!(max.emit(&mut buf).is_ok());
    }
}
