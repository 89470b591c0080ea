//! IGMP (RFC 2236, IGMPv2) as a host speaks it: membership queries (v1, v2 and
//! v3 queries, RFC 3376 §4.1, read as a v2 host reads them), v1/v2 reports and
//! leave messages. IGMPv3 reports are recognised and not interpreted.

use std::net::Ipv4Addr;

use crate::bytes::{get, put, put16, u8_at};
use crate::checksum::{finish, sum, verifies};
use crate::WireError;

/// IP protocol number of IGMP.
pub const IPPROTO_IGMP: u8 = 2;
/// Length of an IGMPv1/v2 message (and of a v2 host's every message).
pub const IGMP_LEN: usize = 8;
/// Least length of an IGMPv3 query.
pub const IGMPV3_QUERY_LEN: usize = 12;

/// IGMP message types.
pub mod igmp_kind {
    /// Membership query (every version).
    pub const QUERY: u8 = 0x11;
    /// IGMPv1 membership report.
    pub const REPORT_V1: u8 = 0x12;
    /// IGMPv2 membership report.
    pub const REPORT_V2: u8 = 0x16;
    /// IGMPv2 leave group.
    pub const LEAVE: u8 = 0x17;
    /// IGMPv3 membership report.
    pub const REPORT_V3: u8 = 0x22;
}

/// The IPv4 Router Alert option (RFC 2113) IGMP messages carry: 4 bytes, a whole
/// 32-bit word of options.
pub const IPV4_ROUTER_ALERT: [u8; 4] = [0x94, 0x04, 0, 0];

/// An IGMP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgmpRepr {
    /// Type 0x11. `group` is unspecified for a general query.
    Query {
        /// The Max Resp Code as sent (tenths of a second; a v3 query's code
        /// may be a floating-point value, see [`IgmpRepr::max_resp_tenths`]).
        max_resp_code: u8,
        /// The group asked about (0.0.0.0: every group).
        group: Ipv4Addr,
        /// An IGMPv3 query (12 bytes or more; its sources are not kept).
        v3: bool,
    },
    /// Type 0x12.
    ReportV1 {
        /// The group reported.
        group: Ipv4Addr,
    },
    /// Type 0x16.
    ReportV2 {
        /// The group reported.
        group: Ipv4Addr,
    },
    /// Type 0x17.
    Leave {
        /// The group left.
        group: Ipv4Addr,
    },
    /// Type 0x22 (records not interpreted: a host ignores other hosts' reports).
    ReportV3,
}

impl IgmpRepr {
    /// Parse an IGMP message; `data` is exactly the IP payload. The checksum
    /// covers the whole message. A query of 9 to 11 bytes is `Malformed`
    /// (RFC 3376 §7.1 says to ignore it); a v1/v2 message longer than 8 bytes
    /// is read from its first 8 (RFC 2236 §2.5).
    pub fn parse(data: &[u8], verify_checksum: bool) -> Result<IgmpRepr, WireError> {
        if data.len() < IGMP_LEN {
            return Err(WireError::Truncated);
        }
        if verify_checksum && !verifies(sum(data)) {
            return Err(WireError::BadChecksum);
        }
        let kind = u8_at(data, 0)?;
        let code = u8_at(data, 1)?;
        let group = Ipv4Addr::from(get::<4>(data, 4)?);
        let checked = |r: IgmpRepr| {
            if group.is_multicast() {
                Ok(r)
            } else {
                Err(WireError::Malformed)
            }
        };
        use igmp_kind as k;
        match kind {
            k::QUERY => {
                let v3 = match data.len() {
                    IGMP_LEN => false,
                    n if n >= IGMPV3_QUERY_LEN => true,
                    _ => return Err(WireError::Malformed),
                };
                if !group.is_unspecified() && !group.is_multicast() {
                    return Err(WireError::Malformed);
                }
                Ok(IgmpRepr::Query {
                    max_resp_code: code,
                    group,
                    v3,
                })
            }
            k::REPORT_V1 => checked(IgmpRepr::ReportV1 { group }),
            k::REPORT_V2 => checked(IgmpRepr::ReportV2 { group }),
            k::LEAVE => checked(IgmpRepr::Leave { group }),
            k::REPORT_V3 => Ok(IgmpRepr::ReportV3),
            _ => Err(WireError::Unsupported),
        }
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            IgmpRepr::Query { v3: true, .. } | IgmpRepr::ReportV3 => IGMPV3_QUERY_LEN,
            _ => IGMP_LEN,
        }
    }

    /// Write the message (checksum included) into `buf[..buffer_len()]`. A v3
    /// query goes out without sources (QRV 0, QQIC 0); a v3 report without
    /// records.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let len = self.buffer_len();
        let out = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        out.fill(0);
        use igmp_kind as k;
        let (kind, code, group) = match *self {
            IgmpRepr::Query {
                max_resp_code,
                group,
                ..
            } => (k::QUERY, max_resp_code, group),
            IgmpRepr::ReportV1 { group } => (k::REPORT_V1, 0, group),
            IgmpRepr::ReportV2 { group } => (k::REPORT_V2, 0, group),
            IgmpRepr::Leave { group } => (k::LEAVE, 0, group),
            IgmpRepr::ReportV3 => (k::REPORT_V3, 0, Ipv4Addr::UNSPECIFIED),
        };
        put(out, 0, &[kind, code])?;
        put(out, 4, &group.octets())?;
        let c = finish(sum(out));
        put16(out, 2, c)
    }

    /// A query's maximum response time in tenths of a second (a v3 code of 128
    /// or more is a floating-point value, RFC 3376 §4.1.1; a v1 query's 0 means
    /// 10 s, RFC 2236 §4); 0 for anything else.
    pub fn max_resp_tenths(&self) -> u32 {
        match *self {
            IgmpRepr::Query {
                max_resp_code: 0, ..
            } => 100,
            IgmpRepr::Query {
                max_resp_code: c,
                v3: true,
                ..
            } if c >= 128 => float_code(u32::from(c), 4),
            IgmpRepr::Query { max_resp_code, .. } => u32::from(max_resp_code),
            _ => 0,
        }
    }
}

/// A maximum response code in the floating-point form IGMPv3 (RFC 3376 §4.1.1)
/// and MLDv2 (RFC 3810 §5.1.3) share: a 3-bit exponent above a `mant_bits`-bit
/// mantissa, worth `(mant | 1 << mant_bits) << (exp + 3)`.
pub(crate) fn float_code(code: u32, mant_bits: u32) -> u32 {
    let exp = (code >> mant_bits) & 7;
    let mant = code & ((1 << mant_bits) - 1);
    (mant | 1 << mant_bits) << (exp + 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_and_a_leave_round_trip_and_check_their_length() {
        let g = Ipv4Addr::new(239, 1, 2, 3);
        for r in [
            IgmpRepr::ReportV2 { group: g },
            IgmpRepr::Leave { group: g },
            IgmpRepr::ReportV1 { group: g },
            IgmpRepr::Query {
                max_resp_code: 100,
                group: Ipv4Addr::UNSPECIFIED,
                v3: false,
            },
            IgmpRepr::Query {
                max_resp_code: 200,
                group: g,
                v3: true,
            },
        ] {
            let mut b = [0u8; 12];
            r.emit(&mut b).unwrap();
            assert_eq!(IgmpRepr::parse(&b[..r.buffer_len()], true), Ok(r));
            assert_eq!(
                IgmpRepr::parse(&b[..7], false),
                Err(WireError::Truncated),
                "{r:?}"
            );
            let mut bad = b;
            bad[5] ^= 1;
            assert_eq!(
                IgmpRepr::parse(&bad[..r.buffer_len()], true),
                Err(WireError::BadChecksum)
            );
        }
        let mut b = [0u8; 8];
        IgmpRepr::ReportV2 { group: g }.emit(&mut b).unwrap();
        assert_eq!(&b, &[0x16, 0, 0xf8, 0xfa, 239, 1, 2, 3]);
        assert_eq!(
            IgmpRepr::ReportV2 { group: g }.emit(&mut b[..7]),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn odd_queries_and_unicast_groups_are_refused() {
        let mut b = [0u8; 12];
        IgmpRepr::Query {
            max_resp_code: 10,
            group: Ipv4Addr::UNSPECIFIED,
            v3: true,
        }
        .emit(&mut b)
        .unwrap();
        // 10 bytes: neither a v2 nor a v3 query.
        assert_eq!(IgmpRepr::parse(&b[..10], false), Err(WireError::Malformed));
        let mut r = [0u8; 8];
        IgmpRepr::ReportV2 {
            group: Ipv4Addr::new(10, 0, 0, 1),
        }
        .emit(&mut r)
        .unwrap();
        assert_eq!(IgmpRepr::parse(&r, true), Err(WireError::Malformed));
        r[0] = 0x42;
        assert_eq!(IgmpRepr::parse(&r, false), Err(WireError::Unsupported));
    }

    #[test]
    fn max_response_times_decode() {
        let q = |c, v3| IgmpRepr::Query {
            max_resp_code: c,
            group: Ipv4Addr::UNSPECIFIED,
            v3,
        };
        assert_eq!(q(0, false).max_resp_tenths(), 100);
        assert_eq!(q(100, false).max_resp_tenths(), 100);
        assert_eq!(q(200, false).max_resp_tenths(), 200);
        // 0x80: exp 0, mant 0 → 0x10 << 3 = 128.
        assert_eq!(q(0x80, true).max_resp_tenths(), 128);
        assert_eq!(q(0xff, true).max_resp_tenths(), 31 << 10);
    }
}
