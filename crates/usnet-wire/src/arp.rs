//! ARP for Ethernet/IPv4 (RFC 826).

use std::net::Ipv4Addr;

use crate::bytes::{get, put, put16, u16_at, u8_at};
use crate::ethernet::MacAddr;
use crate::WireError;

/// Length of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// 1
    Request,
    /// 2
    Reply,
    /// Anything else (RARP, InARP, ...), kept so callers can count it.
    Other(u16),
}

impl From<u16> for ArpOp {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            o => ArpOp::Other(o),
        }
    }
}

impl From<ArpOp> for u16 {
    fn from(op: ArpOp) -> u16 {
        match op {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
            ArpOp::Other(o) => o,
        }
    }
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Operation.
    pub op: ArpOp,
    /// Sender hardware address.
    pub sender_mac: MacAddr,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in requests).
    pub target_mac: MacAddr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

impl ArpRepr {
    /// Parse an ARP packet. Anything other than Ethernet (htype 1, hlen 6)
    /// over IPv4 (ptype 0x0800, plen 4) is `Unsupported`. Trailing bytes
    /// (Ethernet padding) are ignored.
    pub fn parse(data: &[u8]) -> Result<Self, WireError> {
        let htype = u16_at(data, 0)?;
        let ptype = u16_at(data, 2)?;
        let hlen = u8_at(data, 4)?;
        let plen = u8_at(data, 5)?;
        if htype != HTYPE_ETHERNET || ptype != PTYPE_IPV4 || hlen != 6 || plen != 4 {
            return Err(WireError::Unsupported);
        }
        if data.len() < ARP_LEN {
            return Err(WireError::Truncated);
        }
        Ok(ArpRepr {
            op: ArpOp::from(u16_at(data, 6)?),
            sender_mac: MacAddr(get::<6>(data, 8)?),
            sender_ip: Ipv4Addr::from(get::<4>(data, 14)?),
            target_mac: MacAddr(get::<6>(data, 18)?),
            target_ip: Ipv4Addr::from(get::<4>(data, 24)?),
        })
    }

    /// Length `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        ARP_LEN
    }

    /// Write the 28-byte packet into `buf[..28]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < ARP_LEN {
            return Err(WireError::Truncated);
        }
        put16(buf, 0, HTYPE_ETHERNET)?;
        put16(buf, 2, PTYPE_IPV4)?;
        put(buf, 4, &[6, 4])?;
        put16(buf, 6, u16::from(self.op))?;
        put(buf, 8, &self.sender_mac.0)?;
        put(buf, 14, &self.sender_ip.octets())?;
        put(buf, 18, &self.target_mac.0)?;
        put(buf, 24, &self.target_ip.octets())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who has 192.168.1.1? Tell 192.168.1.100 (from 00:0c:29:3e:5b:7a),
    /// as captured after the Ethernet header, with 18 bytes of link padding.
    const REQUEST: [u8; 46] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // eth, ipv4, 6, 4, request
        0x00, 0x0c, 0x29, 0x3e, 0x5b, 0x7a, 192, 168, 1, 100, // sender
        0, 0, 0, 0, 0, 0, 192, 168, 1, 1, // target
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // padding
    ];

    #[test]
    fn known_request() {
        let r = ArpRepr::parse(&REQUEST).unwrap();
        assert_eq!(r.op, ArpOp::Request);
        assert_eq!(r.sender_mac, MacAddr([0x00, 0x0c, 0x29, 0x3e, 0x5b, 0x7a]));
        assert_eq!(r.sender_ip, Ipv4Addr::new(192, 168, 1, 100));
        assert_eq!(r.target_mac, MacAddr::ZERO);
        assert_eq!(r.target_ip, Ipv4Addr::new(192, 168, 1, 1));
        let mut out = [0u8; ARP_LEN];
        r.emit(&mut out).unwrap();
        assert_eq!(out[..], REQUEST[..ARP_LEN]);
    }

    #[test]
    fn roundtrip_and_ops() {
        for op in [
            ArpOp::Request,
            ArpOp::Reply,
            ArpOp::Other(3),
            ArpOp::Other(0xffff),
        ] {
            let r = ArpRepr {
                op,
                sender_mac: MacAddr([2, 0, 0, 0, 0, 2]),
                sender_ip: Ipv4Addr::new(10, 0, 0, 2),
                target_mac: MacAddr([2, 0, 0, 0, 0, 1]),
                target_ip: Ipv4Addr::new(10, 0, 0, 1),
            };
            let mut buf = [0u8; ARP_LEN];
            r.emit(&mut buf).unwrap();
            assert_eq!(ArpRepr::parse(&buf), Ok(r));
            assert_eq!(r.emit(&mut buf[..ARP_LEN - 1]), Err(WireError::Truncated));
        }
    }

    #[test]
    fn truncations_and_unsupported() {
        for n in 0..ARP_LEN {
            assert!(ArpRepr::parse(&REQUEST[..n]).is_err(), "len {n}");
        }
        let mut p = REQUEST;
        p[4] = 8; // hlen 8
        assert_eq!(ArpRepr::parse(&p), Err(WireError::Unsupported));
        let mut p = REQUEST;
        p[1] = 6; // IEEE 802 htype
        assert_eq!(ArpRepr::parse(&p), Err(WireError::Unsupported));
    }
}
