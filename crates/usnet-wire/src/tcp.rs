//! TCP header and options (RFC 9293, 7323 timestamps/window scale, 2018 SACK).

use std::fmt;
use std::net::IpAddr;
use std::ops::{BitAnd, BitOr, BitOrAssign, Not};

use crate::bytes::{put, put16, put32, slice, u16_at, u32_at, u8_at};
use crate::checksum::{finish, pseudo, sum, verifies, IPPROTO_TCP};
use crate::WireError;

/// Length of a TCP header without options.
pub const TCP_HEADER_LEN: usize = 20;
/// Most option bytes a header can carry (data offset 15).
pub const TCP_MAX_OPTIONS_LEN: usize = 40;
/// Largest window shift allowed (RFC 7323 §2.3); larger received values are clamped.
pub const TCP_MAX_WINDOW_SCALE: u8 = 14;

/// TCP control bits (the low 9 bits of header word 6, NS included).
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u16);

impl TcpFlags {
    /// No more data from sender.
    pub const FIN: TcpFlags = TcpFlags(0x001);
    /// Synchronize sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x002);
    /// Reset.
    pub const RST: TcpFlags = TcpFlags(0x004);
    /// Push.
    pub const PSH: TcpFlags = TcpFlags(0x008);
    /// Acknowledgment field significant.
    pub const ACK: TcpFlags = TcpFlags(0x010);
    /// Urgent pointer significant.
    pub const URG: TcpFlags = TcpFlags(0x020);
    /// ECN echo.
    pub const ECE: TcpFlags = TcpFlags(0x040);
    /// Congestion window reduced.
    pub const CWR: TcpFlags = TcpFlags(0x080);
    /// ECN nonce (historic, RFC 3540).
    pub const NS: TcpFlags = TcpFlags(0x100);
    const MASK: u16 = 0x1ff;

    /// No flags.
    pub const fn empty() -> TcpFlags {
        TcpFlags(0)
    }
    /// All bits of `other` are set.
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// Any bit of `other` is set.
    pub const fn intersects(self, other: TcpFlags) -> bool {
        self.0 & other.0 != 0
    }
    /// Set the bits of `other`.
    pub fn insert(&mut self, other: TcpFlags) {
        self.0 |= other.0;
    }
    /// Clear the bits of `other`.
    pub fn remove(&mut self, other: TcpFlags) {
        self.0 &= !other.0;
    }
    /// FIN set.
    pub const fn fin(self) -> bool {
        self.contains(Self::FIN)
    }
    /// SYN set.
    pub const fn syn(self) -> bool {
        self.contains(Self::SYN)
    }
    /// RST set.
    pub const fn rst(self) -> bool {
        self.contains(Self::RST)
    }
    /// PSH set.
    pub const fn psh(self) -> bool {
        self.contains(Self::PSH)
    }
    /// ACK set.
    pub const fn ack(self) -> bool {
        self.contains(Self::ACK)
    }
    /// URG set.
    pub const fn urg(self) -> bool {
        self.contains(Self::URG)
    }
    /// ECE set.
    pub const fn ece(self) -> bool {
        self.contains(Self::ECE)
    }
    /// CWR set.
    pub const fn cwr(self) -> bool {
        self.contains(Self::CWR)
    }
}

impl BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for TcpFlags {
    type Output = TcpFlags;
    fn bitand(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 & rhs.0)
    }
}

impl Not for TcpFlags {
    type Output = TcpFlags;
    fn not(self) -> TcpFlags {
        TcpFlags(!self.0 & Self::MASK)
    }
}

impl fmt::Debug for TcpFlags {
    /// e.g. `SYN|ACK`, `-` for none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(TcpFlags, &str); 9] = [
            (TcpFlags::FIN, "FIN"),
            (TcpFlags::SYN, "SYN"),
            (TcpFlags::RST, "RST"),
            (TcpFlags::PSH, "PSH"),
            (TcpFlags::ACK, "ACK"),
            (TcpFlags::URG, "URG"),
            (TcpFlags::ECE, "ECE"),
            (TcpFlags::CWR, "CWR"),
            (TcpFlags::NS, "NS"),
        ];
        let mut first = true;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        let extra = self.0 & !Self::MASK;
        if extra != 0 {
            write!(f, "|{extra:#x}")?;
        }
        Ok(())
    }
}

/// A TCP Fast Open option (RFC 7413): kind 34, or the experimental kind 254 with
/// magic 0xF989 that older clients send (`exp`); an empty cookie is a cookie
/// request. Cookies are 4 to 16 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FastOpen {
    /// The cookie, in its first `len` bytes.
    pub cookie: [u8; 16],
    /// Cookie length: 0 (request) or 4..=16.
    pub len: u8,
    /// The experimental encoding (kind 254, magic 0xF989).
    pub exp: bool,
}

impl FastOpen {
    /// A cookie request in the given encoding.
    pub fn request(exp: bool) -> Self {
        FastOpen {
            exp,
            ..FastOpen::default()
        }
    }

    /// A cookie (at most 16 bytes are kept).
    pub fn with_cookie(cookie: &[u8], exp: bool) -> Self {
        let mut c = [0u8; 16];
        let n = cookie.len().min(16);
        c[..n].copy_from_slice(&cookie[..n]);
        FastOpen {
            cookie: c,
            len: n as u8,
            exp,
        }
    }

    /// The cookie bytes.
    pub fn cookie(&self) -> &[u8] {
        &self.cookie[..usize::from(self.len).min(16)]
    }

    /// Option bytes on the wire, before padding.
    fn wire_len(&self) -> usize {
        (if self.exp { 4 } else { 2 }) + self.cookie().len()
    }
}

/// The TCP options usnet understands. Fixed size, no allocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpOptions {
    /// Maximum segment size (kind 2).
    pub mss: Option<u16>,
    /// Window scale shift (kind 3), clamped to 14 on parse.
    pub window_scale: Option<u8>,
    /// SACK permitted (kind 4).
    pub sack_permitted: bool,
    /// SACK blocks (kind 5) as (left, right) edges; only the first
    /// `sack_count` entries are meaningful.
    pub sack_blocks: [(u32, u32); 4],
    /// Number of valid entries in `sack_blocks` (values above 4 act as 4).
    pub sack_count: u8,
    /// Timestamps (kind 8): (TSval, TSecr).
    pub timestamps: Option<(u32, u32)>,
    /// TCP Fast Open (kind 34 or 254/0xF989).
    pub fast_open: Option<FastOpen>,
}

impl TcpOptions {
    /// The meaningful SACK blocks.
    pub fn sacks(&self) -> &[(u32, u32)] {
        let n = usize::from(self.sack_count).min(self.sack_blocks.len());
        self.sack_blocks.get(..n).unwrap_or(&[])
    }

    /// Append a SACK block; false if all four slots are used.
    pub fn push_sack(&mut self, left: u32, right: u32) -> bool {
        let n = usize::from(self.sack_count);
        match self.sack_blocks.get_mut(n) {
            Some(slot) => {
                *slot = (left, right);
                self.sack_count += 1;
                true
            }
            None => false,
        }
    }

    /// Option bytes `emit` writes (a multiple of 4, at most 40) and how many
    /// SACK blocks fit in what the other options leave.
    fn layout(&self) -> (usize, usize) {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.timestamps.is_some() {
            len += 12; // NOP NOP TS, or SACK-permitted + TS
        } else if self.sack_permitted {
            len += 4; // NOP NOP SACK-permitted
        }
        if self.window_scale.is_some() {
            len += 4; // NOP WS
        }
        if let Some(fo) = &self.fast_open {
            len += fo.wire_len().div_ceil(4) * 4; // FO, NOP padding after
        }
        let mut n = 0;
        let room = TCP_MAX_OPTIONS_LEN - len;
        if room >= 12 {
            n = self.sacks().len().min((room - 4) / 8);
            if n > 0 {
                len += 4 + 8 * n; // NOP NOP SACK
            }
        }
        (len, n)
    }
}

impl PartialEq for TcpOptions {
    /// Unused SACK slots are ignored.
    fn eq(&self, o: &Self) -> bool {
        self.mss == o.mss
            && self.window_scale == o.window_scale
            && self.sack_permitted == o.sack_permitted
            && self.timestamps == o.timestamps
            && self.fast_open == o.fast_open
            && self.sacks() == o.sacks()
    }
}

impl Eq for TcpOptions {}

mod opt {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WS: u8 = 3;
    pub const SACK_PERM: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TS: u8 = 8;
    pub const FAST_OPEN: u8 = 34;
    pub const EXP: u8 = 254;
    pub const FAST_OPEN_MAGIC: u16 = 0xF989;
}

/// Parse the option area. TLV structure errors (length < 2 or past the end)
/// are `Malformed`; unknown options and known ones with a wrong length are
/// skipped, as a robust receiver does.
fn parse_options(opts: &[u8]) -> Result<TcpOptions, WireError> {
    let mut o = TcpOptions::default();
    let mut i = 0;
    while i < opts.len() {
        let kind = u8_at(opts, i)?;
        match kind {
            opt::EOL => break,
            opt::NOP => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let len = usize::from(u8_at(opts, i + 1).map_err(|_| WireError::Malformed)?);
        if len < 2 {
            return Err(WireError::Malformed);
        }
        let body = opts.get(i + 2..i + len).ok_or(WireError::Malformed)?;
        match (kind, len) {
            (opt::MSS, 4) => o.mss = Some(u16_at(body, 0)?),
            (opt::WS, 3) => o.window_scale = Some(u8_at(body, 0)?.min(TCP_MAX_WINDOW_SCALE)),
            (opt::SACK_PERM, 2) => o.sack_permitted = true,
            (opt::SACK, l) if l >= 10 && (l - 2) % 8 == 0 => {
                o.sack_count = 0;
                for c in body.chunks_exact(8).take(4) {
                    o.push_sack(u32_at(c, 0)?, u32_at(c, 4)?);
                }
            }
            (opt::TS, 10) => o.timestamps = Some((u32_at(body, 0)?, u32_at(body, 4)?)),
            (opt::FAST_OPEN, l) if l == 2 || (6..=18).contains(&l) => {
                o.fast_open = Some(FastOpen::with_cookie(body, false));
            }
            (opt::EXP, l)
                if (l == 4 || (8..=20).contains(&l))
                    && u16_at(body, 0)? == opt::FAST_OPEN_MAGIC =>
            {
                o.fast_open = Some(FastOpen::with_cookie(&body[2..], true));
            }
            _ => {}
        }
        i += len;
    }
    Ok(o)
}

/// A parsed TCP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpHeader<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (meaningful with ACK).
    pub ack: u32,
    /// Control bits.
    pub flags: TcpFlags,
    /// Window (unscaled).
    pub window: u16,
    /// Checksum as received.
    pub checksum: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Header length in bytes (20..=60).
    pub header_len: usize,
    /// Recognised options.
    pub options: TcpOptions,
    /// Everything after the header.
    pub payload: &'a [u8],
}

impl TcpHeader<'_> {
    /// Sequence space used: payload plus one each for SYN and FIN.
    pub fn seg_len(&self) -> usize {
        self.payload.len() + usize::from(self.flags.syn()) + usize::from(self.flags.fin())
    }

    /// The emit-side description of this header.
    pub fn repr(&self) -> TcpRepr {
        TcpRepr {
            src_port: self.src_port,
            dst_port: self.dst_port,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            window: self.window,
            urgent: self.urgent,
            options: self.options,
        }
    }
}

/// Parse a TCP segment (`data` is exactly the IP payload). The data offset
/// must be >= 5 (`BadLength`) and within `data` (`Truncated`).
pub fn parse_tcp(data: &[u8]) -> Result<TcpHeader<'_>, WireError> {
    if data.len() < TCP_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let word = u16_at(data, 12)?;
    let header_len = usize::from(word >> 12) * 4;
    if header_len < TCP_HEADER_LEN {
        return Err(WireError::BadLength);
    }
    if header_len > data.len() {
        return Err(WireError::Truncated);
    }
    Ok(TcpHeader {
        src_port: u16_at(data, 0)?,
        dst_port: u16_at(data, 2)?,
        seq: u32_at(data, 4)?,
        ack: u32_at(data, 8)?,
        flags: TcpFlags(word & TcpFlags::MASK),
        window: u16_at(data, 14)?,
        checksum: u16_at(data, 16)?,
        urgent: u16_at(data, 18)?,
        header_len,
        options: parse_options(slice(data, TCP_HEADER_LEN, header_len)?)?,
        payload: slice(data, header_len, data.len())?,
    })
}

/// Check the checksum of a whole segment (header + payload) against the
/// pseudo-header for `src`/`dst`.
pub fn verify_tcp_checksum(src: IpAddr, dst: IpAddr, tcp_bytes: &[u8]) -> bool {
    if tcp_bytes.len() < TCP_HEADER_LEN {
        return false;
    }
    let Ok(len) = u32::try_from(tcp_bytes.len()) else {
        return false;
    };
    verifies(pseudo(src, dst, IPPROTO_TCP, len) + sum(tcp_bytes))
}

/// What to put in an emitted TCP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Control bits (low 9 bits used).
    pub flags: TcpFlags,
    /// Window (already scaled down).
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Options to send. SACK blocks that do not fit in 40 bytes beside the
    /// others are dropped from the end, so put the newest block first.
    pub options: TcpOptions,
}

impl TcpRepr {
    /// Header length `emit` writes: 20 + options, padded to 4.
    pub fn header_len(&self) -> usize {
        TCP_HEADER_LEN + self.options.layout().0
    }

    /// Write the header into `buf[..header_len()]`; the payload of
    /// `payload_len` bytes must already follow it. With `compute_checksum`
    /// the checksum covers pseudo-header, header and payload; otherwise it
    /// is 0 (put [`crate::partial_checksum`] there for offload).
    pub fn emit(
        &self,
        buf: &mut [u8],
        src: IpAddr,
        dst: IpAddr,
        payload_len: usize,
        compute_checksum: bool,
    ) -> Result<(), WireError> {
        let (opt_len, n_sack) = self.options.layout();
        let hl = TCP_HEADER_LEN + opt_len;
        let total = hl.checked_add(payload_len).ok_or(WireError::BadLength)?;
        if buf.len() < total {
            return Err(WireError::Truncated);
        }
        let total32 = u32::try_from(total).map_err(|_| WireError::BadLength)?;
        put16(buf, 0, self.src_port)?;
        put16(buf, 2, self.dst_port)?;
        put32(buf, 4, self.seq)?;
        put32(buf, 8, self.ack)?;
        // hl <= 60, so hl / 4 fits the 4-bit data offset.
        put16(
            buf,
            12,
            ((hl as u16 / 4) << 12) | (self.flags.0 & TcpFlags::MASK),
        )?;
        put16(buf, 14, self.window)?;
        put16(buf, 16, 0)?;
        put16(buf, 18, self.urgent)?;

        let o = &self.options;
        let mut at = TCP_HEADER_LEN;
        if let Some(mss) = o.mss {
            put(buf, at, &[opt::MSS, 4])?;
            put16(buf, at + 2, mss)?;
            at += 4;
        }
        if let Some((val, ecr)) = o.timestamps {
            let lead = if o.sack_permitted {
                [opt::SACK_PERM, 2]
            } else {
                [opt::NOP, opt::NOP]
            };
            put(buf, at, &lead)?;
            put(buf, at + 2, &[opt::TS, 10])?;
            put32(buf, at + 4, val)?;
            put32(buf, at + 8, ecr)?;
            at += 12;
        } else if o.sack_permitted {
            put(buf, at, &[opt::NOP, opt::NOP, opt::SACK_PERM, 2])?;
            at += 4;
        }
        if let Some(ws) = o.window_scale {
            put(buf, at, &[opt::NOP, opt::WS, 3, ws])?;
            at += 4;
        }
        if let Some(fo) = &o.fast_open {
            let len = fo.wire_len();
            if fo.exp {
                put(buf, at, &[opt::EXP, len as u8])?;
                put16(buf, at + 2, opt::FAST_OPEN_MAGIC)?;
                put(buf, at + 4, fo.cookie())?;
            } else {
                put(buf, at, &[opt::FAST_OPEN, len as u8])?;
                put(buf, at + 2, fo.cookie())?;
            }
            let padded = len.div_ceil(4) * 4;
            for i in len..padded {
                put(buf, at + i, &[opt::NOP])?;
            }
            at += padded;
        }
        if n_sack > 0 {
            put(
                buf,
                at,
                &[opt::NOP, opt::NOP, opt::SACK, (2 + 8 * n_sack) as u8],
            )?;
            at += 4;
            for &(l, r) in o.sacks().iter().take(n_sack) {
                put32(buf, at, l)?;
                put32(buf, at + 4, r)?;
                at += 8;
            }
        }
        debug_assert_eq!(at, hl);

        if compute_checksum {
            let c = finish(pseudo(src, dst, IPPROTO_TCP, total32) + sum(slice(buf, 0, total)?));
            put16(buf, 16, c)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const S4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    const D4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    const S6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1));
    const D6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2));

    fn syn_opts() -> TcpOptions {
        TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: Some((0x0102_0304, 0)),
            ..TcpOptions::default()
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_repr_roundtrips(
            ports in proptest::prelude::any::<(u16, u16)>(),
            seq_ack in proptest::prelude::any::<(u32, u32)>(),
            flags in 0u16..0x200,
            win_urg in proptest::prelude::any::<(u16, u16)>(),
            mss in proptest::prelude::any::<Option<u16>>(),
            ws in proptest::prelude::any::<Option<u8>>(),
            sack_permitted in proptest::prelude::any::<bool>(),
            sack_blocks in proptest::prelude::any::<[(u32, u32); 4]>(),
            sack_count in 0u8..8,
            timestamps in proptest::prelude::any::<Option<(u32, u32)>>(),
            v6 in proptest::prelude::any::<bool>(),
            plen in 0usize..64,
        ) {
            let r = TcpRepr {
                src_port: ports.0,
                dst_port: ports.1,
                seq: seq_ack.0,
                ack: seq_ack.1,
                flags: TcpFlags(flags),
                window: win_urg.0,
                urgent: win_urg.1,
                options: TcpOptions { mss, window_scale: ws, sack_permitted, sack_blocks, sack_count, timestamps, fast_open: None },
            };
            let (s, d) = if v6 { (S6, D6) } else { (S4, D4) };
            let hl = r.header_len();
            proptest::prop_assert!(hl.is_multiple_of(4) && (20..=60).contains(&hl));
            let mut buf = vec![0x5au8; hl + plen];
            r.emit(&mut buf, s, d, plen, true).unwrap();
            proptest::prop_assert!(verify_tcp_checksum(s, d, &buf));
            let h = parse_tcp(&buf).unwrap();
            let kept = h.options.sacks().len();
            proptest::prop_assert_eq!(h.options.sacks(), &r.options.sacks()[..kept]);
            // Independently: blocks kept = what fits in 40 bytes beside the rest.
            let other = 4 * usize::from(mss.is_some())
                + if timestamps.is_some() { 12 } else { 4 * usize::from(sack_permitted) }
                + 4 * usize::from(ws.is_some());
            let fit = (40 - other).saturating_sub(4) / 8;
            proptest::prop_assert_eq!(kept, usize::from(sack_count).min(4).min(fit));
            let mut want = r;
            want.options.sack_count = kept as u8;
            want.options.window_scale = ws.map(|w| w.min(TCP_MAX_WINDOW_SCALE));
            proptest::prop_assert_eq!(h.repr(), want);
            proptest::prop_assert_eq!(h.payload.len(), plen);
        }
    }

    #[test]
    fn flags() {
        let f = TcpFlags::SYN | TcpFlags::ACK;
        assert!(f.syn() && f.ack() && !f.fin() && !f.rst());
        assert!(f.contains(TcpFlags::SYN) && f.intersects(TcpFlags::ACK | TcpFlags::FIN));
        assert_eq!(format!("{f:?}"), "SYN|ACK");
        assert_eq!(format!("{:?}", TcpFlags::empty()), "-");
        let mut g = f;
        g.remove(TcpFlags::SYN);
        g.insert(TcpFlags::FIN);
        assert_eq!(g, TcpFlags::FIN | TcpFlags::ACK);
        assert_eq!((!TcpFlags::ACK).0, 0x1ef);
    }

    #[test]
    fn fast_open_options_round_trip_in_both_encodings() {
        // RFC 7413 kind 34 with an 8-byte cookie: 10 bytes, then NOP NOP (as Linux);
        // the experimental kind 254 + magic 0xF989: 12 bytes, no padding; a request
        // is an empty cookie.
        for (fo, wire) in [
            (FastOpen::with_cookie(&[1, 2, 3, 4, 5, 6, 7, 8], false), 12),
            (FastOpen::with_cookie(&[1, 2, 3, 4, 5, 6, 7, 8], true), 12),
            (FastOpen::request(false), 4),
            (FastOpen::request(true), 4),
        ] {
            let r = TcpRepr {
                flags: TcpFlags::SYN,
                options: TcpOptions {
                    mss: Some(1460),
                    fast_open: Some(fo),
                    ..TcpOptions::default()
                },
                ..TcpRepr::default()
            };
            assert_eq!(r.header_len(), 20 + 4 + wire);
            let mut buf = vec![0u8; r.header_len()];
            r.emit(&mut buf, S4, D4, 0, true).unwrap();
            let kind = if fo.exp { 254 } else { 34 };
            assert_eq!(buf[24], kind);
            if !fo.exp && fo.len == 8 {
                assert_eq!(&buf[34..36], &[1, 1], "NOP padding after");
            }
            let h = parse_tcp(&buf).unwrap();
            assert_eq!(h.options.fast_open, Some(fo));
        }
        // A cookie of a bad length, or the wrong magic, is not a Fast Open option.
        let mut buf = vec![0u8; 28];
        let r = TcpRepr {
            options: TcpOptions::default(),
            ..TcpRepr::default()
        };
        r.emit(&mut buf[..20], S4, D4, 0, false).unwrap();
        buf[12] = 7 << 4;
        buf[20..28].copy_from_slice(&[34, 5, 1, 2, 3, 1, 1, 1]);
        assert_eq!(parse_tcp(&buf).unwrap().options.fast_open, None);
        buf[20..28].copy_from_slice(&[254, 6, 0xf9, 0x88, 1, 2, 1, 1]);
        assert_eq!(parse_tcp(&buf).unwrap().options.fast_open, None);
    }

    #[test]
    fn known_linux_style_syn() {
        // SYN 10.0.0.1:40000 -> 10.0.0.2:80 with the option block Linux sends:
        // MSS 1460, SACK-permitted+TS, NOP+WS 7.
        let r = TcpRepr {
            src_port: 40000,
            dst_port: 80,
            seq: 0xdead_beef,
            ack: 0,
            flags: TcpFlags::SYN,
            window: 64240,
            urgent: 0,
            options: syn_opts(),
        };
        assert_eq!(r.header_len(), 40);
        let mut buf = [0u8; 40];
        r.emit(&mut buf, S4, D4, 0, true).unwrap();
        let expect_opts = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 1, 2, 3, 4, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        assert_eq!(buf[20..], expect_opts);
        assert_eq!(buf[12], 0xa0); // data offset 10
        assert_eq!(buf[13], 0x02);
        // Independent checksum over a byte-laid-out pseudo-header.
        let mut all = vec![10, 0, 0, 1, 10, 0, 0, 2, 0, 6, 0, 40];
        let mut z = buf;
        z[16..18].fill(0);
        all.extend_from_slice(&z);
        let mut s: u32 = all
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while s > 0xffff {
            s = (s >> 16) + (s & 0xffff);
        }
        assert_eq!(u16::from_be_bytes([buf[16], buf[17]]), !(s as u16));
        assert!(verify_tcp_checksum(S4, D4, &buf));
        let h = parse_tcp(&buf).unwrap();
        assert_eq!(h.repr(), r);
        assert_eq!(h.seg_len(), 1);
    }

    #[test]
    fn roundtrip_variants() {
        let mut with_sacks = TcpOptions {
            timestamps: Some((5, 6)),
            ..TcpOptions::default()
        };
        assert!(with_sacks.push_sack(100, 200));
        assert!(with_sacks.push_sack(300, 400));
        assert!(with_sacks.push_sack(500, 600));
        let mut four = TcpOptions::default();
        for i in 0..4 {
            assert!(four.push_sack(i, i + 1));
        }
        assert!(!four.push_sack(9, 9));
        let cases = [
            TcpOptions::default(),
            syn_opts(),
            TcpOptions {
                mss: Some(536),
                ..TcpOptions::default()
            },
            TcpOptions {
                sack_permitted: true,
                ..TcpOptions::default()
            },
            TcpOptions {
                window_scale: Some(14),
                ..TcpOptions::default()
            },
            with_sacks,
            four,
        ];
        for (i, options) in cases.into_iter().enumerate() {
            for (s, d) in [(S4, D4), (S6, D6)] {
                let r = TcpRepr {
                    src_port: 1,
                    dst_port: 2,
                    seq: 3,
                    ack: 4,
                    flags: TcpFlags::ACK | TcpFlags::PSH,
                    window: 5,
                    urgent: 6,
                    options,
                };
                let hl = r.header_len();
                assert_eq!(hl % 4, 0);
                let mut buf = vec![0u8; hl + 3];
                buf[hl..].copy_from_slice(b"abc");
                r.emit(&mut buf, s, d, 3, true).unwrap();
                assert!(verify_tcp_checksum(s, d, &buf), "case {i}");
                let h = parse_tcp(&buf).unwrap();
                assert_eq!(h.repr(), r, "case {i}");
                assert_eq!(h.payload, b"abc");
                assert_eq!(
                    r.emit(&mut buf[..hl + 2], s, d, 3, true),
                    Err(WireError::Truncated)
                );
                for n in 0..hl {
                    assert!(parse_tcp(&buf[..n]).is_err(), "case {i} len {n}");
                }
            }
        }
    }

    #[test]
    fn sack_blocks_dropped_when_full() {
        let mut o = syn_opts(); // 20 bytes of other options
        for i in 0..4 {
            o.push_sack(i * 10, i * 10 + 5);
        }
        let r = TcpRepr {
            options: o,
            ..TcpRepr::default()
        };
        assert_eq!(r.header_len(), 60);
        let mut buf = [0u8; 60];
        r.emit(&mut buf, S4, D4, 0, false).unwrap();
        let h = parse_tcp(&buf).unwrap();
        assert_eq!(h.options.sacks(), &[(0, 5), (10, 15)]);
        assert_eq!(h.checksum, 0);
    }

    #[test]
    fn option_parsing_rules() {
        let seg = |opts: &[u8]| {
            let mut b = vec![0u8; 20];
            b[12] = (((20 + opts.len()) / 4) << 4) as u8;
            b.extend_from_slice(opts);
            b
        };
        // Zero and one length: malformed.
        assert_eq!(
            parse_tcp(&seg(&[2, 0, 0, 0])).map(|_| ()),
            Err(WireError::Malformed)
        );
        assert_eq!(
            parse_tcp(&seg(&[9, 1, 1, 1])).map(|_| ()),
            Err(WireError::Malformed)
        );
        // Runs past the header.
        assert_eq!(
            parse_tcp(&seg(&[1, 1, 8, 10])).map(|_| ()),
            Err(WireError::Malformed)
        );
        // Kind byte at the very end with no length.
        assert_eq!(
            parse_tcp(&seg(&[1, 1, 1, 30])).map(|_| ()),
            Err(WireError::Malformed)
        );
        // Unknown option skipped, EOL stops parsing (garbage after it ignored).
        let s = seg(&[30, 4, 0, 0, 2, 4, 1, 0, 0, 99, 0, 0]);
        let h = parse_tcp(&s).unwrap();
        assert_eq!(h.options.mss, Some(256));
        // Wrong-length MSS ignored; window scale clamped.
        let s = seg(&[2, 3, 0, 1, 3, 3, 200, 0]);
        let h = parse_tcp(&s).unwrap();
        assert_eq!(h.options.mss, None);
        assert_eq!(h.options.window_scale, Some(14));
        // Bad data offsets.
        let mut b = seg(&[]);
        b[12] = 0x40;
        assert_eq!(parse_tcp(&b).map(|_| ()), Err(WireError::BadLength));
        b[12] = 0x60;
        assert_eq!(parse_tcp(&b).map(|_| ()), Err(WireError::Truncated));
    }
}
