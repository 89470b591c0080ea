//! ICMP for IPv4 (RFC 792): echo, destination unreachable, time exceeded.

use crate::bytes::{put, put16, put32, slice, u16_at, u8_at};
use crate::checksum::{finish, sum, verifies};
use crate::WireError;

/// ICMPv4 message types.
pub mod icmpv4_kind {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
}

/// Destination-unreachable codes.
pub mod unreach {
    /// Network unreachable.
    pub const NET: u8 = 0;
    /// Host unreachable.
    pub const HOST: u8 = 1;
    /// Protocol unreachable.
    pub const PROTO: u8 = 2;
    /// Port unreachable.
    pub const PORT: u8 = 3;
    /// Fragmentation needed and DF set (next-hop MTU in bytes 6..8).
    pub const FRAG_NEEDED: u8 = 4;
    /// Source route failed.
    pub const SOURCE_ROUTE_FAILED: u8 = 5;
    /// Destination network unknown.
    pub const NET_UNKNOWN: u8 = 6;
    /// Destination host unknown.
    pub const HOST_UNKNOWN: u8 = 7;
    /// Source host isolated.
    pub const HOST_ISOLATED: u8 = 8;
    /// Network administratively prohibited.
    pub const NET_PROHIBITED: u8 = 9;
    /// Host administratively prohibited.
    pub const HOST_PROHIBITED: u8 = 10;
    /// Network unreachable for the type of service.
    pub const NET_TOS: u8 = 11;
    /// Host unreachable for the type of service.
    pub const HOST_TOS: u8 = 12;
    /// Communication administratively prohibited (RFC 1812).
    pub const ADMIN_PROHIBITED: u8 = 13;
    /// Host precedence violation (RFC 1812).
    pub const HOST_PRECEDENCE: u8 = 14;
    /// Precedence cutoff in effect (RFC 1812).
    pub const PRECEDENCE_CUTOFF: u8 = 15;
}

/// Time-exceeded codes.
pub mod time_exceeded {
    /// TTL exceeded in transit.
    pub const TTL: u8 = 0;
    /// Fragment reassembly time exceeded.
    pub const REASSEMBLY: u8 = 1;
}

/// Length of the ICMP header (type, code, checksum, 4 bytes of rest-of-header).
pub const ICMP_HEADER_LEN: usize = 8;

/// An ICMPv4 message. `data`/`invoking` borrow the bytes after the 8-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    /// Type 8.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq: u16,
        /// Echo data.
        data: &'a [u8],
    },
    /// Type 0.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq: u16,
        /// Echo data.
        data: &'a [u8],
    },
    /// Type 3.
    DstUnreachable {
        /// See [`unreach`].
        code: u8,
        /// The invoking packet's IP header and leading payload.
        invoking: &'a [u8],
    },
    /// Type 11.
    TimeExceeded {
        /// See [`time_exceeded`].
        code: u8,
        /// The invoking packet's IP header and leading payload.
        invoking: &'a [u8],
    },
    /// Any other type; the body is not interpreted.
    Other {
        /// Type.
        kind: u8,
        /// Code.
        code: u8,
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Parse an ICMPv4 message; `data` is exactly the IP payload.
    pub fn parse(data: &'a [u8], verify_checksum: bool) -> Result<Self, WireError> {
        if data.len() < ICMP_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if verify_checksum && !verifies(sum(data)) {
            return Err(WireError::BadChecksum);
        }
        let kind = u8_at(data, 0)?;
        let code = u8_at(data, 1)?;
        let body = slice(data, ICMP_HEADER_LEN, data.len())?;
        Ok(match kind {
            icmpv4_kind::ECHO_REQUEST => Icmpv4Repr::EchoRequest {
                ident: u16_at(data, 4)?,
                seq: u16_at(data, 6)?,
                data: body,
            },
            icmpv4_kind::ECHO_REPLY => Icmpv4Repr::EchoReply {
                ident: u16_at(data, 4)?,
                seq: u16_at(data, 6)?,
                data: body,
            },
            icmpv4_kind::DST_UNREACHABLE => Icmpv4Repr::DstUnreachable {
                code,
                invoking: body,
            },
            icmpv4_kind::TIME_EXCEEDED => Icmpv4Repr::TimeExceeded {
                code,
                invoking: body,
            },
            _ => Icmpv4Repr::Other { kind, code },
        })
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        ICMP_HEADER_LEN
            + match self {
                Icmpv4Repr::EchoRequest { data, .. } | Icmpv4Repr::EchoReply { data, .. } => {
                    data.len()
                }
                Icmpv4Repr::DstUnreachable { invoking, .. }
                | Icmpv4Repr::TimeExceeded { invoking, .. } => invoking.len(),
                Icmpv4Repr::Other { .. } => 0,
            }
    }

    /// Write the message into `buf[..buffer_len()]` with its checksum.
    /// Unused rest-of-header bytes (and the body of `Other`) are zero.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let (kind, code, rest, body): (u8, u8, u32, &[u8]) = match *self {
            Icmpv4Repr::EchoRequest { ident, seq, data } => (
                icmpv4_kind::ECHO_REQUEST,
                0,
                u32::from(ident) << 16 | u32::from(seq),
                data,
            ),
            Icmpv4Repr::EchoReply { ident, seq, data } => (
                icmpv4_kind::ECHO_REPLY,
                0,
                u32::from(ident) << 16 | u32::from(seq),
                data,
            ),
            Icmpv4Repr::DstUnreachable { code, invoking } => {
                (icmpv4_kind::DST_UNREACHABLE, code, 0, invoking)
            }
            Icmpv4Repr::TimeExceeded { code, invoking } => {
                (icmpv4_kind::TIME_EXCEEDED, code, 0, invoking)
            }
            Icmpv4Repr::Other { kind, code } => (kind, code, 0, &[][..]),
        };
        put(buf, 0, &[kind, code, 0, 0])?;
        put32(buf, 4, rest)?;
        put(buf, ICMP_HEADER_LEN, body)?;
        let c = finish(sum(slice(buf, 0, len)?));
        put16(buf, 2, c)
    }
}

/// For a "fragmentation needed" message (type 3 code 4, RFC 1191), the
/// next-hop MTU from bytes 6..8 of the raw ICMP message; `None` otherwise or
/// if the router left it 0 (pre-RFC 1191).
pub fn icmpv4_frag_needed_mtu(data: &[u8]) -> Option<u16> {
    let is_frag_needed = u8_at(data, 0).ok()? == icmpv4_kind::DST_UNREACHABLE
        && u8_at(data, 1).ok()? == unreach::FRAG_NEEDED;
    let mtu = u16_at(data, 6).ok()?;
    (is_frag_needed && mtu != 0).then_some(mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_echo() {
        // Echo request id 0x1234 seq 1 "abcd": checksum 0x2104 (hand-summed).
        let pkt = [
            8, 0, 0x21, 0x04, 0x12, 0x34, 0x00, 0x01, b'a', b'b', b'c', b'd',
        ];
        let r = Icmpv4Repr::parse(&pkt, true).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::EchoRequest {
                ident: 0x1234,
                seq: 1,
                data: b"abcd"
            }
        );
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, pkt);
        // Bare echo request: checksum is !0x0800.
        let mut bare = [0u8; 8];
        Icmpv4Repr::EchoRequest {
            ident: 0,
            seq: 0,
            data: &[],
        }
        .emit(&mut bare)
        .unwrap();
        assert_eq!(bare, [8, 0, 0xf7, 0xff, 0, 0, 0, 0]);
        let mut bad = pkt;
        bad[9] ^= 0x40;
        assert_eq!(Icmpv4Repr::parse(&bad, true), Err(WireError::BadChecksum));
        assert!(Icmpv4Repr::parse(&bad, false).is_ok());
    }

    #[test]
    fn frag_needed_mtu() {
        let m = [3, 4, 0, 0, 0, 0, 0x05, 0xdc, 0x45];
        assert_eq!(icmpv4_frag_needed_mtu(&m), Some(1500));
        assert_eq!(icmpv4_frag_needed_mtu(&m[..7]), None);
        assert_eq!(icmpv4_frag_needed_mtu(&[3, 3, 0, 0, 0, 0, 5, 0xdc]), None);
        assert_eq!(icmpv4_frag_needed_mtu(&[3, 4, 0, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn roundtrip_all() {
        let inv = [0x45u8, 0, 0, 28, 1, 2, 3, 4, 5];
        let reprs = [
            Icmpv4Repr::EchoRequest {
                ident: 1,
                seq: 2,
                data: b"hello",
            },
            Icmpv4Repr::EchoReply {
                ident: 0xffff,
                seq: 0,
                data: &[],
            },
            Icmpv4Repr::DstUnreachable {
                code: unreach::PORT,
                invoking: &inv,
            },
            Icmpv4Repr::TimeExceeded {
                code: time_exceeded::REASSEMBLY,
                invoking: &inv[..8],
            },
            Icmpv4Repr::Other { kind: 13, code: 0 },
        ];
        for r in reprs {
            let mut buf = [0u8; 64];
            let n = r.buffer_len();
            r.emit(&mut buf).unwrap();
            assert_eq!(Icmpv4Repr::parse(&buf[..n], true), Ok(r));
            assert_eq!(r.emit(&mut buf[..n - 1]), Err(WireError::Truncated));
            for k in 0..ICMP_HEADER_LEN {
                assert_eq!(
                    Icmpv4Repr::parse(&buf[..k], false),
                    Err(WireError::Truncated)
                );
            }
            // Any shorter message still parses or errors, never panics.
            for k in ICMP_HEADER_LEN..n {
                let _ = Icmpv4Repr::parse(&buf[..k], true);
            }
        }
    }
}
