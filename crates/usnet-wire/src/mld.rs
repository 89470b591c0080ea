//! Multicast Listener Discovery as a host speaks it: MLDv1 (RFC 2710) and MLDv2
//! (RFC 3810) queries, MLDv1 reports and done messages, MLDv2 reports (whose
//! records without sources are what a host that does no source filtering sends).
//! These are ICMPv6 messages (types 130, 131, 132, 143); [`crate::Icmpv6Repr`]
//! reads them as `Other`.

use std::net::Ipv6Addr;

use crate::bytes::{get, put, put16, slice, u16_at, u8_at};
use crate::checksum::{finish, pseudo_v6, sum, verifies, IPPROTO_ICMPV6};
use crate::WireError;

/// MLD message types (ICMPv6).
pub mod mld_kind {
    /// Multicast listener query (MLDv1 and MLDv2).
    pub const QUERY: u8 = 130;
    /// MLDv1 report.
    pub const REPORT_V1: u8 = 131;
    /// MLDv1 done.
    pub const DONE_V1: u8 = 132;
    /// MLDv2 report.
    pub const REPORT_V2: u8 = 143;
}

/// MLDv2 multicast address record types (RFC 3810 §5.2.12).
pub mod mld_record {
    /// Current state: include (the listed sources only).
    pub const MODE_IS_INCLUDE: u8 = 1;
    /// Current state: exclude (every source but the listed ones).
    pub const MODE_IS_EXCLUDE: u8 = 2;
    /// Filter mode change to include (with no sources: leaving).
    pub const CHANGE_TO_INCLUDE: u8 = 3;
    /// Filter mode change to exclude (with no sources: joining).
    pub const CHANGE_TO_EXCLUDE: u8 = 4;
}

/// Length of an MLDv1 message and of an MLDv2 query without sources' end.
pub const MLDV1_LEN: usize = 24;
/// Least length of an MLDv2 query.
pub const MLDV2_QUERY_LEN: usize = 28;
/// Header of an MLDv2 report (type … number of records).
pub const MLDV2_REPORT_HEADER: usize = 8;
/// One MLDv2 record without sources or auxiliary data.
pub const MLDV2_RECORD_LEN: usize = 20;
/// Where MLDv2 reports go: all MLDv2-capable routers.
pub const MLDV2_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);

/// The hop-by-hop options header every MLD message carries: a Router Alert
/// (RFC 2711, value 0: MLD) and PadN, 8 bytes, then `next`.
pub fn mld_hop_by_hop(next: u8) -> [u8; 8] {
    [next, 0, 5, 2, 0, 0, 1, 0]
}

/// An MLDv2 record for `group` of type `kind` ([`mld_record`]), no sources.
pub fn mld_record_bytes(kind: u8, group: Ipv6Addr) -> [u8; MLDV2_RECORD_LEN] {
    let mut r = [0u8; MLDV2_RECORD_LEN];
    r[0] = kind;
    r[4..].copy_from_slice(&group.octets());
    r
}

/// An MLD message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MldRepr<'a> {
    /// Type 130. `group` is unspecified for a general query.
    Query {
        /// Maximum Response Code as sent (see [`MldRepr::max_resp_ms`]).
        max_resp_code: u16,
        /// The group asked about (`::`: every group).
        group: Ipv6Addr,
        /// An MLDv2 query (28 bytes or more; its sources are not kept).
        v2: bool,
    },
    /// Type 131.
    ReportV1 {
        /// The group reported.
        group: Ipv6Addr,
    },
    /// Type 132.
    DoneV1 {
        /// The group left.
        group: Ipv6Addr,
    },
    /// Type 143: `count` records, their bytes checked to add up
    /// ([`mld_records`] reads them).
    ReportV2 {
        /// Number of records.
        count: u16,
        /// The records, exactly.
        records: &'a [u8],
    },
}

/// Length of the MLDv2 record at the start of `r`, checked.
fn record_len(r: &[u8]) -> Result<usize, WireError> {
    let aux = usize::from(u8_at(r, 1)?) * 4;
    let nsrc = usize::from(u16_at(r, 2)?);
    let len = MLDV2_RECORD_LEN + nsrc * 16 + aux;
    if r.len() < len {
        return Err(WireError::Truncated);
    }
    Ok(len)
}

/// The `(record type, group)` of each record of an MLDv2 report (sources and
/// auxiliary data skipped). Stops at the first bad record (a parsed report has
/// none).
pub fn mld_records(records: &[u8]) -> impl Iterator<Item = (u8, Ipv6Addr)> + '_ {
    let mut rest = records;
    std::iter::from_fn(move || {
        let len = record_len(rest).ok()?;
        let kind = rest[0];
        let group = Ipv6Addr::from(get::<16>(rest, 4).ok()?);
        rest = &rest[len..];
        Some((kind, group))
    })
}

impl<'a> MldRepr<'a> {
    /// Parse an MLD message; `data` is exactly the ICMPv6 message, `src`/`dst`
    /// the IPv6 addresses (for the checksum). `Unsupported` for other ICMPv6
    /// types. The caller checks the IP rules (link-local source, hop limit 1).
    pub fn parse(
        src: &Ipv6Addr,
        dst: &Ipv6Addr,
        data: &'a [u8],
        verify_checksum: bool,
    ) -> Result<MldRepr<'a>, WireError> {
        let kind = u8_at(data, 0)?;
        if !matches!(
            kind,
            mld_kind::QUERY | mld_kind::REPORT_V1 | mld_kind::DONE_V1 | mld_kind::REPORT_V2
        ) {
            return Err(WireError::Unsupported);
        }
        let min = if kind == mld_kind::REPORT_V2 {
            MLDV2_REPORT_HEADER
        } else {
            MLDV1_LEN
        };
        if data.len() < min {
            return Err(WireError::Truncated);
        }
        if verify_checksum {
            let len = u32::try_from(data.len()).map_err(|_| WireError::BadLength)?;
            if !verifies(sum(data) + pseudo_v6(src, dst, IPPROTO_ICMPV6, len)) {
                return Err(WireError::BadChecksum);
            }
        }
        if u8_at(data, 1)? != 0 {
            return Err(WireError::Malformed);
        }
        if kind == mld_kind::REPORT_V2 {
            let count = u16_at(data, 6)?;
            let mut at = MLDV2_REPORT_HEADER;
            for _ in 0..count {
                at += record_len(data.get(at..).ok_or(WireError::Truncated)?)?;
            }
            return Ok(MldRepr::ReportV2 {
                count,
                records: slice(data, MLDV2_REPORT_HEADER, at)?,
            });
        }
        let group = Ipv6Addr::from(get::<16>(data, 8)?);
        let multicast = |r: MldRepr<'a>| {
            if group.is_multicast() {
                Ok(r)
            } else {
                Err(WireError::Malformed)
            }
        };
        match kind {
            mld_kind::QUERY => {
                let v2 = match data.len() {
                    MLDV1_LEN => false,
                    n if n >= MLDV2_QUERY_LEN => {
                        let nsrc = usize::from(u16_at(data, 26)?);
                        if n < MLDV2_QUERY_LEN + nsrc * 16 {
                            return Err(WireError::Truncated);
                        }
                        true
                    }
                    _ => return Err(WireError::Malformed),
                };
                if !group.is_unspecified() && !group.is_multicast() {
                    return Err(WireError::Malformed);
                }
                Ok(MldRepr::Query {
                    max_resp_code: u16_at(data, 4)?,
                    group,
                    v2,
                })
            }
            mld_kind::REPORT_V1 => multicast(MldRepr::ReportV1 { group }),
            _ => multicast(MldRepr::DoneV1 { group }),
        }
    }

    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            MldRepr::Query { v2: true, .. } => MLDV2_QUERY_LEN,
            MldRepr::ReportV2 { records, .. } => MLDV2_REPORT_HEADER + records.len(),
            _ => MLDV1_LEN,
        }
    }

    /// Write the message, checksum included, into `buf[..buffer_len()]`. An MLDv2
    /// query goes out without sources (QRV 0, QQIC 0).
    pub fn emit(&self, src: &Ipv6Addr, dst: &Ipv6Addr, buf: &mut [u8]) -> Result<(), WireError> {
        let len = self.buffer_len();
        let out = buf.get_mut(..len).ok_or(WireError::Truncated)?;
        out.fill(0);
        match *self {
            MldRepr::Query {
                max_resp_code,
                group,
                ..
            } => {
                out[0] = mld_kind::QUERY;
                put16(out, 4, max_resp_code)?;
                put(out, 8, &group.octets())?;
            }
            MldRepr::ReportV1 { group } | MldRepr::DoneV1 { group } => {
                out[0] = if matches!(self, MldRepr::ReportV1 { .. }) {
                    mld_kind::REPORT_V1
                } else {
                    mld_kind::DONE_V1
                };
                put(out, 8, &group.octets())?;
            }
            MldRepr::ReportV2 { count, records } => {
                out[0] = mld_kind::REPORT_V2;
                put16(out, 6, count)?;
                put(out, MLDV2_REPORT_HEADER, records)?;
            }
        }
        let l = u32::try_from(len).map_err(|_| WireError::BadLength)?;
        let c = finish(sum(out) + pseudo_v6(src, dst, IPPROTO_ICMPV6, l));
        put16(out, 2, c)
    }

    /// A query's maximum response delay in milliseconds (an MLDv2 code of 32768
    /// or more is a floating-point value, RFC 3810 §5.1.3); 0 for anything else.
    pub fn max_resp_ms(&self) -> u32 {
        match *self {
            MldRepr::Query {
                max_resp_code: c,
                v2: true,
                ..
            } if c >= 0x8000 => crate::igmp::float_code(u32::from(c), 12),
            MldRepr::Query { max_resp_code, .. } => u32::from(max_resp_code),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    #[test]
    fn messages_round_trip_with_their_checksums() {
        let (s, d) = (a("fe80::1"), MLDV2_ROUTERS);
        let g = a("ff12::1234");
        let mut recs = Vec::new();
        recs.extend_from_slice(&mld_record_bytes(mld_record::CHANGE_TO_EXCLUDE, g));
        recs.extend_from_slice(&mld_record_bytes(mld_record::MODE_IS_EXCLUDE, a("ff05::2")));
        for r in [
            MldRepr::Query {
                max_resp_code: 10000,
                group: Ipv6Addr::UNSPECIFIED,
                v2: true,
            },
            MldRepr::Query {
                max_resp_code: 1000,
                group: g,
                v2: false,
            },
            MldRepr::ReportV1 { group: g },
            MldRepr::DoneV1 { group: g },
            MldRepr::ReportV2 {
                count: 2,
                records: &recs,
            },
        ] {
            let mut b = [0u8; 64];
            let n = r.buffer_len();
            r.emit(&s, &d, &mut b).unwrap();
            assert_eq!(MldRepr::parse(&s, &d, &b[..n], true), Ok(r));
            assert_eq!(
                MldRepr::parse(&s, &a("ff02::1"), &b[..n], true),
                Err(WireError::BadChecksum)
            );
            assert!(MldRepr::parse(&s, &d, &b[..n - 1], false).is_err());
            assert_eq!(r.emit(&s, &d, &mut b[..n - 1]), Err(WireError::Truncated));
        }
        let got: Vec<_> = mld_records(&recs).collect();
        assert_eq!(
            got,
            vec![
                (mld_record::CHANGE_TO_EXCLUDE, g),
                (mld_record::MODE_IS_EXCLUDE, a("ff05::2"))
            ]
        );
    }

    #[test]
    fn a_report_whose_records_overrun_is_truncated() {
        let (s, d) = (a("fe80::1"), MLDV2_ROUTERS);
        let rec = mld_record_bytes(mld_record::CHANGE_TO_EXCLUDE, a("ff12::1"));
        let r = MldRepr::ReportV2 {
            count: 1,
            records: &rec,
        };
        let mut b = [0u8; 28];
        r.emit(&s, &d, &mut b).unwrap();
        // Two records announced, one present.
        b[7] = 2;
        assert_eq!(MldRepr::parse(&s, &d, &b, false), Err(WireError::Truncated));
        // One record that claims a source it does not carry.
        b[7] = 1;
        b[8 + 3] = 1;
        assert_eq!(MldRepr::parse(&s, &d, &b, false), Err(WireError::Truncated));
    }

    #[test]
    fn max_response_delays_decode() {
        let q = |c| MldRepr::Query {
            max_resp_code: c,
            group: Ipv6Addr::UNSPECIFIED,
            v2: true,
        };
        assert_eq!(q(10000).max_resp_ms(), 10000);
        assert_eq!(q(0x8000).max_resp_ms(), 0x1000 << 3);
    }
}
