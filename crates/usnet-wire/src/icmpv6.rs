//! ICMPv6 (RFC 4443) and the Neighbor Discovery subset a host needs (RFC 4861).

use std::net::Ipv6Addr;

use crate::bytes::{get, put, put16, put32, slice, u16_at, u32_at, u8_at};
use crate::checksum::{finish, pseudo_v6, sum, verifies, IPPROTO_ICMPV6};
use crate::ethernet::MacAddr;
use crate::WireError;

/// ICMPv6 message types.
pub mod icmpv6_kind {
    /// Destination unreachable.
    pub const DST_UNREACHABLE: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Router solicitation.
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Router advertisement.
    pub const ROUTER_ADVERT: u8 = 134;
    /// Neighbor solicitation.
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbor advertisement.
    pub const NEIGHBOR_ADVERT: u8 = 136;
}

/// ICMPv6 destination-unreachable codes.
pub mod unreach_v6 {
    /// No route to destination.
    pub const NO_ROUTE: u8 = 0;
    /// Administratively prohibited.
    pub const ADMIN_PROHIBITED: u8 = 1;
    /// Beyond scope of source address.
    pub const BEYOND_SCOPE: u8 = 2;
    /// Address unreachable.
    pub const ADDR: u8 = 3;
    /// Port unreachable.
    pub const PORT: u8 = 4;
    /// Source address failed ingress/egress policy (RFC 4443).
    pub const FAILED_POLICY: u8 = 5;
    /// Reject route to destination (RFC 4443).
    pub const REJECT_ROUTE: u8 = 6;
}

/// ICMPv6 time-exceeded codes.
pub mod time_exceeded_v6 {
    /// Hop limit exceeded in transit.
    pub const HOP_LIMIT: u8 = 0;
    /// Fragment reassembly time exceeded.
    pub const REASSEMBLY: u8 = 1;
}

const OPT_SOURCE_LL: u8 = 1;
const OPT_TARGET_LL: u8 = 2;
const OPT_MTU: u8 = 5;

const NA_ROUTER: u8 = 0x80;
const NA_SOLICITED: u8 = 0x40;
const NA_OVERRIDE: u8 = 0x20;

/// Fixed part of NS/NA: header + reserved/flags + target.
const ND_NEIGHBOR_LEN: usize = 24;
/// Fixed part of an RA.
const ND_RA_LEN: usize = 16;
/// Fixed part of an RS, and of every error/echo message.
const ICMPV6_HEADER_LEN: usize = 8;
/// Link-layer address or MTU option on Ethernet.
const ND_OPT_LEN: usize = 8;

/// An ICMPv6 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv6Repr<'a> {
    /// Type 128.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq: u16,
        /// Echo data.
        data: &'a [u8],
    },
    /// Type 129.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq: u16,
        /// Echo data.
        data: &'a [u8],
    },
    /// Type 1.
    DstUnreachable {
        /// See [`unreach_v6`].
        code: u8,
        /// As much of the invoking packet as fits.
        invoking: &'a [u8],
    },
    /// Type 2.
    PacketTooBig {
        /// MTU of the next-hop link.
        mtu: u32,
        /// As much of the invoking packet as fits.
        invoking: &'a [u8],
    },
    /// Type 3.
    TimeExceeded {
        /// See [`time_exceeded_v6`].
        code: u8,
        /// As much of the invoking packet as fits.
        invoking: &'a [u8],
    },
    /// Type 135.
    NeighborSolicit {
        /// Address being resolved (never multicast).
        target: Ipv6Addr,
        /// Source link-layer address option.
        source_mac: Option<MacAddr>,
    },
    /// Type 136.
    NeighborAdvert {
        /// R flag.
        router: bool,
        /// S flag.
        solicited: bool,
        /// O flag.
        override_: bool,
        /// Address advertised.
        target: Ipv6Addr,
        /// Target link-layer address option.
        target_mac: Option<MacAddr>,
    },
    /// Type 133 (options are validated, then ignored; emitted without options).
    RouterSolicit,
    /// Type 134 (prefix information options are skipped).
    RouterAdvert {
        /// Cur Hop Limit (0 = unspecified).
        hop_limit: u8,
        /// Router lifetime in seconds (0 = not a default router).
        router_lifetime: u16,
        /// Source link-layer address option.
        source_mac: Option<MacAddr>,
        /// MTU option.
        mtu: Option<u32>,
    },
    /// Any other type (including parameter problem); body not interpreted.
    Other {
        /// Type.
        kind: u8,
        /// Code.
        code: u8,
    },
}

/// Walk NDP options (RFC 4861 §4.6), calling `f(type, whole_option)`.
/// Length 0 or an option that runs past the message is `Malformed`.
fn walk_options(
    mut opts: &[u8],
    mut f: impl FnMut(u8, &[u8]) -> Result<(), WireError>,
) -> Result<(), WireError> {
    while !opts.is_empty() {
        let kind = u8_at(opts, 0).map_err(|_| WireError::Malformed)?;
        let units = u8_at(opts, 1).map_err(|_| WireError::Malformed)?;
        if units == 0 {
            return Err(WireError::Malformed);
        }
        let len = usize::from(units) * 8;
        let opt = opts.get(..len).ok_or(WireError::Malformed)?;
        f(kind, opt)?;
        opts = opts.get(len..).unwrap_or(&[]);
    }
    Ok(())
}

/// First occurrence of a link-layer address option of `want` type.
fn find_mac(opts: &[u8], want: u8) -> Result<Option<MacAddr>, WireError> {
    let mut mac = None;
    walk_options(opts, |kind, opt| {
        if kind == want && mac.is_none() {
            mac = Some(MacAddr(get::<6>(opt, 2)?));
        }
        Ok(())
    })?;
    Ok(mac)
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

fn checksum_len(len: usize) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| WireError::BadLength)
}

impl<'a> Icmpv6Repr<'a> {
    /// Parse an ICMPv6 message; `data` is exactly the upper-layer payload,
    /// `src`/`dst` are the IPv6 addresses (for the checksum and NDP rules).
    ///
    /// NDP checks done here: code 0; option lengths; NS/NA target not
    /// multicast; no source link-layer option in an NS from `::`; no S flag
    /// on an NA sent to multicast; RA source link-local. The IP hop limit
    /// must be 255 for NDP: the caller checks that.
    pub fn parse(
        src: &Ipv6Addr,
        dst: &Ipv6Addr,
        data: &'a [u8],
        verify_checksum: bool,
    ) -> Result<Self, WireError> {
        let kind = u8_at(data, 0)?;
        let code = u8_at(data, 1)?;
        if data.len() < 4 {
            return Err(WireError::Truncated);
        }
        if verify_checksum {
            let ph = pseudo_v6(src, dst, IPPROTO_ICMPV6, checksum_len(data.len())?);
            if !verifies(sum(data) + ph) {
                return Err(WireError::BadChecksum);
            }
        }
        let body = |from: usize| slice(data, from, data.len());
        let is_nd = matches!(kind, 133..=136);
        if is_nd && code != 0 {
            return Err(WireError::Malformed);
        }
        use icmpv6_kind as k;
        Ok(match kind {
            k::ECHO_REQUEST => Icmpv6Repr::EchoRequest {
                ident: u16_at(data, 4)?,
                seq: u16_at(data, 6)?,
                data: body(8)?,
            },
            k::ECHO_REPLY => Icmpv6Repr::EchoReply {
                ident: u16_at(data, 4)?,
                seq: u16_at(data, 6)?,
                data: body(8)?,
            },
            k::DST_UNREACHABLE => Icmpv6Repr::DstUnreachable {
                code,
                invoking: body(8)?,
            },
            k::PACKET_TOO_BIG => Icmpv6Repr::PacketTooBig {
                mtu: u32_at(data, 4)?,
                invoking: body(8)?,
            },
            k::TIME_EXCEEDED => Icmpv6Repr::TimeExceeded {
                code,
                invoking: body(8)?,
            },
            k::ROUTER_SOLICIT => {
                walk_options(body(ICMPV6_HEADER_LEN)?, |_, _| Ok(()))?;
                Icmpv6Repr::RouterSolicit
            }
            k::ROUTER_ADVERT => {
                if !is_link_local(src) {
                    return Err(WireError::Malformed);
                }
                let hop_limit = u8_at(data, 4)?;
                let router_lifetime = u16_at(data, 6)?;
                let opts = body(ND_RA_LEN)?;
                let mut source_mac = None;
                let mut mtu = None;
                walk_options(opts, |kind, opt| {
                    match kind {
                        OPT_SOURCE_LL if source_mac.is_none() => {
                            source_mac = Some(MacAddr(get::<6>(opt, 2)?))
                        }
                        OPT_MTU if mtu.is_none() => mtu = Some(u32_at(opt, 4)?),
                        _ => {}
                    }
                    Ok(())
                })?;
                Icmpv6Repr::RouterAdvert {
                    hop_limit,
                    router_lifetime,
                    source_mac,
                    mtu,
                }
            }
            k::NEIGHBOR_SOLICIT => {
                let target = Ipv6Addr::from(get::<16>(data, 8)?);
                let source_mac = find_mac(body(ND_NEIGHBOR_LEN)?, OPT_SOURCE_LL)?;
                if target.is_multicast() || (src.is_unspecified() && source_mac.is_some()) {
                    return Err(WireError::Malformed);
                }
                Icmpv6Repr::NeighborSolicit { target, source_mac }
            }
            k::NEIGHBOR_ADVERT => {
                let flags = u8_at(data, 4)?;
                let target = Ipv6Addr::from(get::<16>(data, 8)?);
                let target_mac = find_mac(body(ND_NEIGHBOR_LEN)?, OPT_TARGET_LL)?;
                let solicited = flags & NA_SOLICITED != 0;
                if target.is_multicast() || (dst.is_multicast() && solicited) {
                    return Err(WireError::Malformed);
                }
                Icmpv6Repr::NeighborAdvert {
                    router: flags & NA_ROUTER != 0,
                    solicited,
                    override_: flags & NA_OVERRIDE != 0,
                    target,
                    target_mac,
                }
            }
            _ => Icmpv6Repr::Other { kind, code },
        })
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        let opt = |o: bool| if o { ND_OPT_LEN } else { 0 };
        match self {
            Icmpv6Repr::EchoRequest { data, .. } | Icmpv6Repr::EchoReply { data, .. } => {
                ICMPV6_HEADER_LEN + data.len()
            }
            Icmpv6Repr::DstUnreachable { invoking, .. }
            | Icmpv6Repr::PacketTooBig { invoking, .. }
            | Icmpv6Repr::TimeExceeded { invoking, .. } => ICMPV6_HEADER_LEN + invoking.len(),
            Icmpv6Repr::NeighborSolicit { source_mac, .. } => {
                ND_NEIGHBOR_LEN + opt(source_mac.is_some())
            }
            Icmpv6Repr::NeighborAdvert { target_mac, .. } => {
                ND_NEIGHBOR_LEN + opt(target_mac.is_some())
            }
            Icmpv6Repr::RouterSolicit | Icmpv6Repr::Other { .. } => ICMPV6_HEADER_LEN,
            Icmpv6Repr::RouterAdvert {
                source_mac, mtu, ..
            } => ND_RA_LEN + opt(source_mac.is_some()) + opt(mtu.is_some()),
        }
    }

    /// Write the message into `buf[..buffer_len()]`, checksum included
    /// (computed over the pseudo-header for `src`/`dst`). Reserved and
    /// unused fields are zero.
    pub fn emit(&self, src: &Ipv6Addr, dst: &Ipv6Addr, buf: &mut [u8]) -> Result<(), WireError> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let buf = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        buf.fill(0);
        use icmpv6_kind as k;
        let ll_opt = |buf: &mut [u8], at: usize, kind: u8, mac: &MacAddr| {
            put(buf, at, &[kind, 1])?;
            put(buf, at + 2, &mac.0)
        };
        match *self {
            Icmpv6Repr::EchoRequest { ident, seq, data }
            | Icmpv6Repr::EchoReply { ident, seq, data } => {
                let kind = if matches!(self, Icmpv6Repr::EchoRequest { .. }) {
                    k::ECHO_REQUEST
                } else {
                    k::ECHO_REPLY
                };
                put(buf, 0, &[kind, 0])?;
                put16(buf, 4, ident)?;
                put16(buf, 6, seq)?;
                put(buf, 8, data)?;
            }
            Icmpv6Repr::DstUnreachable { code, invoking } => {
                put(buf, 0, &[k::DST_UNREACHABLE, code])?;
                put(buf, 8, invoking)?;
            }
            Icmpv6Repr::PacketTooBig { mtu, invoking } => {
                put(buf, 0, &[k::PACKET_TOO_BIG, 0])?;
                put32(buf, 4, mtu)?;
                put(buf, 8, invoking)?;
            }
            Icmpv6Repr::TimeExceeded { code, invoking } => {
                put(buf, 0, &[k::TIME_EXCEEDED, code])?;
                put(buf, 8, invoking)?;
            }
            Icmpv6Repr::NeighborSolicit { target, source_mac } => {
                put(buf, 0, &[k::NEIGHBOR_SOLICIT, 0])?;
                put(buf, 8, &target.octets())?;
                if let Some(mac) = source_mac {
                    ll_opt(buf, ND_NEIGHBOR_LEN, OPT_SOURCE_LL, &mac)?;
                }
            }
            Icmpv6Repr::NeighborAdvert {
                router,
                solicited,
                override_,
                target,
                target_mac,
            } => {
                let mut flags = 0;
                if router {
                    flags |= NA_ROUTER;
                }
                if solicited {
                    flags |= NA_SOLICITED;
                }
                if override_ {
                    flags |= NA_OVERRIDE;
                }
                put(buf, 0, &[k::NEIGHBOR_ADVERT, 0, 0, 0, flags])?;
                put(buf, 8, &target.octets())?;
                if let Some(mac) = target_mac {
                    ll_opt(buf, ND_NEIGHBOR_LEN, OPT_TARGET_LL, &mac)?;
                }
            }
            Icmpv6Repr::RouterSolicit => put(buf, 0, &[k::ROUTER_SOLICIT, 0])?,
            Icmpv6Repr::RouterAdvert {
                hop_limit,
                router_lifetime,
                source_mac,
                mtu,
            } => {
                put(buf, 0, &[k::ROUTER_ADVERT, 0, 0, 0, hop_limit, 0])?;
                put16(buf, 6, router_lifetime)?;
                let mut at = ND_RA_LEN;
                if let Some(mac) = source_mac {
                    ll_opt(buf, at, OPT_SOURCE_LL, &mac)?;
                    at += ND_OPT_LEN;
                }
                if let Some(mtu) = mtu {
                    put(buf, at, &[OPT_MTU, 1])?;
                    put32(buf, at + 4, mtu)?;
                }
            }
            Icmpv6Repr::Other { kind, code } => put(buf, 0, &[kind, code])?,
        }
        let ph = pseudo_v6(src, dst, IPPROTO_ICMPV6, checksum_len(len)?);
        let c = finish(sum(buf) + ph);
        put16(buf, 2, c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// Independent checksum: lay the pseudo-header out as bytes, word-sum.
    fn naive_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u16 {
        let mut all = Vec::new();
        all.extend_from_slice(&src.octets());
        all.extend_from_slice(&dst.octets());
        all.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        all.extend_from_slice(&[0, 0, 0, 58]);
        all.extend_from_slice(msg);
        if all.len() % 2 == 1 {
            all.push(0);
        }
        let mut s: u32 = 0;
        for w in all.chunks(2) {
            s += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while s > 0xffff {
            s = (s >> 16) + (s & 0xffff);
        }
        !(s as u16)
    }

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);

    #[test]
    fn known_neighbor_solicit() {
        // NS from fe80::5054:ff:fe12:3456 for fe80::1, to its solicited-node
        // group, with a source link-layer option (RFC 4861 §4.3 layout).
        let src = a("fe80::5054:ff:fe12:3456");
        let dst = a("ff02::1:ff00:1");
        let mut pkt = vec![135, 0, 0, 0, 0, 0, 0, 0];
        pkt.extend_from_slice(&a("fe80::1").octets());
        pkt.extend_from_slice(&[1, 1, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        let c = naive_checksum(&src, &dst, &pkt);
        pkt[2..4].copy_from_slice(&c.to_be_bytes());
        let r = Icmpv6Repr::parse(&src, &dst, &pkt, true).unwrap();
        assert_eq!(
            r,
            Icmpv6Repr::NeighborSolicit {
                target: a("fe80::1"),
                source_mac: Some(MAC)
            }
        );
        let mut out = [0u8; 32];
        r.emit(&src, &dst, &mut out).unwrap();
        assert_eq!(out[..], pkt[..]);
        // Checksum depends on the pseudo-header.
        assert_eq!(
            Icmpv6Repr::parse(&src, &a("ff02::1"), &pkt, true),
            Err(WireError::BadChecksum)
        );
    }

    #[test]
    fn known_echo_checksum() {
        let src = a("2001:db8::1");
        let dst = a("2001:db8::2");
        let r = Icmpv6Repr::EchoRequest {
            ident: 0x4242,
            seq: 7,
            data: b"ping!",
        };
        let mut buf = [0u8; 13];
        r.emit(&src, &dst, &mut buf).unwrap();
        let mut zeroed = buf;
        zeroed[2..4].fill(0);
        assert_eq!(
            u16::from_be_bytes([buf[2], buf[3]]),
            naive_checksum(&src, &dst, &zeroed)
        );
    }

    #[test]
    fn roundtrip_all() {
        let src = a("fe80::1");
        let dst = a("fe80::2");
        let inv = [0x60u8, 0, 0, 0, 0, 8, 17, 64, 1, 2, 3];
        let reprs = [
            Icmpv6Repr::EchoRequest {
                ident: 1,
                seq: 2,
                data: b"x",
            },
            Icmpv6Repr::EchoReply {
                ident: 3,
                seq: 4,
                data: &[],
            },
            Icmpv6Repr::DstUnreachable {
                code: unreach_v6::PORT,
                invoking: &inv,
            },
            Icmpv6Repr::PacketTooBig {
                mtu: 1280,
                invoking: &inv,
            },
            Icmpv6Repr::TimeExceeded {
                code: time_exceeded_v6::HOP_LIMIT,
                invoking: &[],
            },
            Icmpv6Repr::NeighborSolicit {
                target: a("2001:db8::9"),
                source_mac: None,
            },
            Icmpv6Repr::NeighborSolicit {
                target: a("fe80::9"),
                source_mac: Some(MAC),
            },
            Icmpv6Repr::NeighborAdvert {
                router: true,
                solicited: true,
                override_: false,
                target: a("fe80::1"),
                target_mac: Some(MAC),
            },
            Icmpv6Repr::NeighborAdvert {
                router: false,
                solicited: false,
                override_: true,
                target: a("2001:db8::1"),
                target_mac: None,
            },
            Icmpv6Repr::RouterSolicit,
            Icmpv6Repr::RouterAdvert {
                hop_limit: 64,
                router_lifetime: 1800,
                source_mac: Some(MAC),
                mtu: Some(1500),
            },
            Icmpv6Repr::RouterAdvert {
                hop_limit: 0,
                router_lifetime: 0,
                source_mac: None,
                mtu: Some(9000),
            },
            Icmpv6Repr::Other { kind: 4, code: 1 },
        ];
        for r in reprs {
            let mut buf = [0xaau8; 64];
            let n = r.buffer_len();
            r.emit(&src, &dst, &mut buf).unwrap();
            assert_eq!(
                Icmpv6Repr::parse(&src, &dst, &buf[..n], true),
                Ok(r),
                "{r:?}"
            );
            assert_eq!(
                r.emit(&src, &dst, &mut buf[..n - 1]),
                Err(WireError::Truncated)
            );
            for k in 0..n {
                // Shorter: error (or a shorter valid message), never a panic.
                let _ = Icmpv6Repr::parse(&src, &dst, &buf[..k], false);
                let _ = Icmpv6Repr::parse(&src, &dst, &buf[..k], true);
            }
            for k in 0..4 {
                assert_eq!(
                    Icmpv6Repr::parse(&src, &dst, &buf[..k], false),
                    Err(WireError::Truncated)
                );
            }
        }
    }

    fn ns_with_opts(opts: &[u8]) -> Vec<u8> {
        let mut p = vec![135, 0, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&a("fe80::1").octets());
        p.extend_from_slice(opts);
        p
    }

    #[test]
    fn ndp_validation() {
        let s = a("fe80::2");
        let d = a("ff02::1:ff00:1");
        let p = |o: &[u8]| Icmpv6Repr::parse(&s, &d, ns_with_opts(o).leak(), false);
        // Option length 0.
        assert_eq!(p(&[1, 0, 0, 0, 0, 0, 0, 0]), Err(WireError::Malformed));
        // Option running past the end.
        assert_eq!(p(&[1, 2, 0, 0, 0, 0, 0, 0]), Err(WireError::Malformed));
        assert_eq!(p(&[1]), Err(WireError::Malformed));
        // Unknown option skipped; first source LL option wins.
        let r = p(&[
            14, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6, 1, 1, 9, 9, 9, 9, 9, 9,
        ])
        .unwrap();
        assert_eq!(
            r,
            Icmpv6Repr::NeighborSolicit {
                target: a("fe80::1"),
                source_mac: Some(MacAddr([1, 2, 3, 4, 5, 6]))
            }
        );
        // Non-zero code.
        let mut bad = ns_with_opts(&[]);
        bad[1] = 1;
        assert_eq!(
            Icmpv6Repr::parse(&s, &d, &bad, false),
            Err(WireError::Malformed)
        );
        // Multicast target.
        let mut bad = ns_with_opts(&[]);
        bad[8] = 0xff;
        assert_eq!(
            Icmpv6Repr::parse(&s, &d, &bad, false),
            Err(WireError::Malformed)
        );
        // DAD probe (from ::) must not carry a source LL option.
        let dad = ns_with_opts(&[1, 1, 1, 2, 3, 4, 5, 6]);
        assert_eq!(
            Icmpv6Repr::parse(&Ipv6Addr::UNSPECIFIED, &d, &dad, false),
            Err(WireError::Malformed)
        );
        assert!(Icmpv6Repr::parse(&Ipv6Addr::UNSPECIFIED, &d, &ns_with_opts(&[]), false).is_ok());
        // Solicited NA to a multicast group.
        let na = Icmpv6Repr::NeighborAdvert {
            router: false,
            solicited: true,
            override_: true,
            target: a("fe80::1"),
            target_mac: None,
        };
        let mut buf = [0u8; 24];
        na.emit(&s, &a("ff02::1"), &mut buf).unwrap();
        assert_eq!(
            Icmpv6Repr::parse(&s, &a("ff02::1"), &buf, true),
            Err(WireError::Malformed)
        );
        // RA from a global source.
        let ra = Icmpv6Repr::RouterAdvert {
            hop_limit: 64,
            router_lifetime: 0,
            source_mac: None,
            mtu: None,
        };
        let g = a("2001:db8::1");
        let mut buf = [0u8; 16];
        ra.emit(&g, &d, &mut buf).unwrap();
        assert_eq!(
            Icmpv6Repr::parse(&g, &d, &buf, true),
            Err(WireError::Malformed)
        );
    }
}
