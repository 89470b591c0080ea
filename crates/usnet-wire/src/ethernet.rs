//! Ethernet II framing, with up to two 802.1Q / 802.1ad VLAN tags on receive.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use crate::bytes::{get, put, put16, u16_at};
use crate::WireError;

/// A 48-bit IEEE MAC address.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// All ones.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group bit set (includes broadcast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Group bit clear.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// The Ethernet group address for an IPv6 multicast address
    /// (RFC 2464 §7): 33:33 followed by the last four bytes.
    pub fn ipv6_multicast(addr: &Ipv6Addr) -> MacAddr {
        let o = addr.octets();
        MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = WireError;

    /// Six two-digit hex groups separated by ':' or '-'.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for o in out.iter_mut() {
            let p = parts.next().ok_or(WireError::Malformed)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(WireError::Malformed);
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| WireError::Malformed)?;
        }
        if parts.next().is_some() {
            return Err(WireError::Malformed);
        }
        Ok(MacAddr(out))
    }
}

/// EtherType values.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// IPv6.
    pub const IPV6: u16 = 0x86DD;
    /// 802.1Q VLAN tag (C-tag).
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service tag (S-tag, Q-in-Q).
    pub const QINQ: u16 = 0x88A8;
}

/// Length of an untagged Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of a VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;

/// A parsed Ethernet frame (FCS not included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetFrame<'a> {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address.
    pub src: MacAddr,
    /// EtherType after any VLAN tags.
    pub ethertype: u16,
    /// VLAN ID (12 bits, PCP/DEI stripped) of the innermost tag, if tagged.
    pub vlan: Option<u16>,
    /// 14, 18 or 22.
    pub header_len: usize,
    /// Everything after the header (may include link padding).
    pub payload: &'a [u8],
}

fn is_tag(t: u16) -> bool {
    t == ethertype::VLAN || t == ethertype::QINQ
}

/// Parse an Ethernet II frame, accepting at most two VLAN tags.
/// Three or more tags give `Unsupported`.
pub fn parse_ethernet(frame: &[u8]) -> Result<EthernetFrame<'_>, WireError> {
    let dst = MacAddr(get::<6>(frame, 0)?);
    let src = MacAddr(get::<6>(frame, 6)?);
    let mut ethertype = u16_at(frame, 12)?;
    let mut header_len = ETHERNET_HEADER_LEN;
    let mut vlan = None;
    let mut tags = 0;
    while is_tag(ethertype) {
        if tags == 2 {
            return Err(WireError::Unsupported);
        }
        let tci = u16_at(frame, header_len)?;
        ethertype = u16_at(frame, header_len + 2)?;
        vlan = Some(tci & 0x0fff);
        header_len += VLAN_TAG_LEN;
        tags += 1;
    }
    let payload = frame.get(header_len..).ok_or(WireError::Truncated)?;
    Ok(EthernetFrame {
        dst,
        src,
        ethertype,
        vlan,
        header_len,
        payload,
    })
}

/// Write a 14-byte untagged header into `buf[..14]`.
/// `Truncated` if `buf.len() < 14`; the rest of `buf` is untouched.
pub fn emit_ethernet(
    buf: &mut [u8],
    dst: MacAddr,
    src: MacAddr,
    ethertype: u16,
) -> Result<(), WireError> {
    if buf.len() < ETHERNET_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    put(buf, 0, &dst.0)?;
    put(buf, 6, &src.0)?;
    put16(buf, 12, ethertype)
}

/// Write an 18-byte 802.1Q-tagged header (`tci` = PCP/DEI/VID as on the wire).
pub fn emit_ethernet_vlan(
    buf: &mut [u8],
    dst: MacAddr,
    src: MacAddr,
    tci: u16,
    ethertype: u16,
) -> Result<(), WireError> {
    if buf.len() < ETHERNET_HEADER_LEN + VLAN_TAG_LEN {
        return Err(WireError::Truncated);
    }
    emit_ethernet(buf, dst, src, self::ethertype::VLAN)?;
    put16(buf, 14, tci)?;
    put16(buf, 16, ethertype)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x01]);
    const B: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

    #[test]
    fn mac_basics() {
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(A.is_unicast());
        assert!(MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_multicast());
        assert_eq!(B.to_string(), "52:54:00:12:34:56");
        assert_eq!(format!("{B:?}"), "52:54:00:12:34:56");
        assert_eq!("52:54:00:12:34:56".parse::<MacAddr>(), Ok(B));
        assert_eq!("52-54-00-12-34-56".parse::<MacAddr>(), Ok(B));
        assert_eq!(
            "52:54:00:12:34".parse::<MacAddr>(),
            Err(WireError::Malformed)
        );
        assert_eq!(
            "52:54:00:12:34:56:78".parse::<MacAddr>(),
            Err(WireError::Malformed)
        );
        assert_eq!(
            "52:54:00:12:34:5".parse::<MacAddr>(),
            Err(WireError::Malformed)
        );
        assert_eq!(
            "52:54:00:12:34:+5".parse::<MacAddr>(),
            Err(WireError::Malformed)
        );
        assert_eq!("".parse::<MacAddr>(), Err(WireError::Malformed));
        let a: Ipv6Addr = "ff02::1:ff12:3456".parse().unwrap();
        assert_eq!(
            MacAddr::ipv6_multicast(&a),
            MacAddr([0x33, 0x33, 0xff, 0x12, 0x34, 0x56])
        );
    }

    #[test]
    fn roundtrip_untagged() {
        let mut buf = [0u8; 20];
        buf[14..].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        emit_ethernet(&mut buf, B, A, ethertype::IPV4).unwrap();
        let f = parse_ethernet(&buf).unwrap();
        assert_eq!(
            (f.dst, f.src, f.ethertype, f.vlan, f.header_len),
            (B, A, 0x0800, None, 14)
        );
        assert_eq!(f.payload, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            emit_ethernet(&mut buf[..13], B, A, 1),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn single_and_double_tag() {
        let mut buf = [0u8; 24];
        emit_ethernet_vlan(&mut buf, B, A, 0xa00a, ethertype::ARP).unwrap();
        let f = parse_ethernet(&buf).unwrap();
        assert_eq!(
            (f.ethertype, f.vlan, f.header_len),
            (ethertype::ARP, Some(0x00a), 18)
        );
        assert_eq!(f.payload.len(), 6);

        // S-tag 100, C-tag 200, IPv6.
        let mut q = [0u8; 22];
        emit_ethernet(&mut q, B, A, ethertype::QINQ).unwrap();
        q[14..16].copy_from_slice(&100u16.to_be_bytes());
        q[16..18].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        q[18..20].copy_from_slice(&200u16.to_be_bytes());
        q[20..22].copy_from_slice(&ethertype::IPV6.to_be_bytes());
        let f = parse_ethernet(&q).unwrap();
        assert_eq!(
            (f.ethertype, f.vlan, f.header_len),
            (ethertype::IPV6, Some(200), 22)
        );
        assert!(f.payload.is_empty());

        // A third tag is refused.
        let mut t = [0u8; 30];
        t[..22].copy_from_slice(&q);
        t[20..22].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        t[24..26].copy_from_slice(&ethertype::IPV4.to_be_bytes());
        assert_eq!(parse_ethernet(&t), Err(WireError::Unsupported));
    }

    #[test]
    fn truncations() {
        let mut q = [0u8; 22];
        emit_ethernet(&mut q, B, A, ethertype::QINQ).unwrap();
        q[16..18].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        q[20..22].copy_from_slice(&ethertype::IPV6.to_be_bytes());
        for n in 0..q.len() {
            assert_eq!(
                parse_ethernet(&q[..n]),
                Err(WireError::Truncated),
                "len {n}"
            );
        }
        assert!(parse_ethernet(&q).is_ok());
    }
}
