//! Frames the device side builds (Ethernet / IPv4 / UDP), checks (TX verify) and echoes.
//!
//! The UDP payload starts with `"NICE"` and a big-endian u64 sequence number, followed by
//! a fixed pattern; the UDP checksum is updated for each sequence number from a
//! precomputed partial sum, so building frame `n` costs one copy and a few adds.

use std::net::{Ipv4Addr, SocketAddrV4};

pub const ETH_HDR: usize = 14;
pub const IP_HDR: usize = 20;
pub const UDP_HDR: usize = 8;
pub const HDRS: usize = ETH_HDR + IP_HDR + UDP_HDR;
pub const PAYLOAD_MAGIC: [u8; 4] = *b"NICE";
/// Offset of the sequence number inside the frame.
pub const SEQ_OFF: usize = HDRS + 4;
/// Smallest frame the generator builds (headers + magic + sequence number, padded to 64).
pub const MIN_GEN_FRAME: usize = 64;

/// Sum of big-endian 16-bit words (odd tail padded with zero), not folded.
pub fn sum16(data: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        s += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        s += (*last as u64) << 8;
    }
    s
}

pub fn fold(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// A UDP frame of a fixed size, re-stamped with a sequence number per packet.
#[derive(Debug, Clone)]
pub struct UdpTemplate {
    pub frame: Vec<u8>,
    /// One's-complement sum of the UDP pseudo header, header (checksum 0) and payload with
    /// the sequence number zeroed.
    base_sum: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct FrameSpec {
    pub size: usize,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
}

impl UdpTemplate {
    /// `size` is the whole Ethernet frame (without FCS), `MIN_GEN_FRAME..=65536`.
    pub fn new(spec: &FrameSpec) -> Result<Self, String> {
        if !(MIN_GEN_FRAME..=usnet_link::nic::layout::MAX_FRAME).contains(&spec.size) {
            return Err(format!(
                "frame size {} outside {MIN_GEN_FRAME}..={}",
                spec.size,
                usnet_link::nic::layout::MAX_FRAME
            ));
        }
        let size = spec.size;
        let mut f = vec![0u8; size];
        f[0..6].copy_from_slice(&spec.dst_mac);
        f[6..12].copy_from_slice(&spec.src_mac);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip_len = (size - ETH_HDR) as u16;
        let ip = &mut f[ETH_HDR..ETH_HDR + IP_HDR];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&spec.src.ip().octets());
        ip[16..20].copy_from_slice(&spec.dst.ip().octets());
        let c = !fold(sum16(ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let udp_len = ip_len - IP_HDR as u16;
        let u = ETH_HDR + IP_HDR;
        f[u..u + 2].copy_from_slice(&spec.src.port().to_be_bytes());
        f[u + 2..u + 4].copy_from_slice(&spec.dst.port().to_be_bytes());
        f[u + 4..u + 6].copy_from_slice(&udp_len.to_be_bytes());
        f[HDRS..HDRS + 4].copy_from_slice(&PAYLOAD_MAGIC);
        for (i, b) in f[SEQ_OFF + 8..].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(7);
        }
        let base_sum = pseudo_sum(spec.src.ip(), spec.dst.ip(), udp_len) + sum16(&f[u..]);
        Ok(UdpTemplate { frame: f, base_sum })
    }

    pub fn len(&self) -> usize {
        self.frame.len()
    }
    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }

    /// The sequence number bytes and the UDP checksum for frame `seq`.
    #[inline]
    pub fn stamp(&self, seq: u64) -> ([u8; 8], [u8; 2]) {
        let s = seq.to_be_bytes();
        let mut c = !fold(self.base_sum + sum16(&s));
        if c == 0 {
            c = 0xffff;
        }
        (s, c.to_be_bytes())
    }

    /// Writes a complete frame for `seq` into `out` (`out.len() == self.len()`).
    pub fn build_into(&self, seq: u64, out: &mut [u8]) {
        out.copy_from_slice(&self.frame);
        let (s, c) = self.stamp(seq);
        out[SEQ_OFF..SEQ_OFF + 8].copy_from_slice(&s);
        out[ETH_HDR + IP_HDR + 6..ETH_HDR + IP_HDR + 8].copy_from_slice(&c);
    }
}

fn pseudo_sum(src: &Ipv4Addr, dst: &Ipv4Addr, udp_len: u16) -> u64 {
    sum16(&src.octets()) + sum16(&dst.octets()) + 17 + udp_len as u64
}

/// The sequence number of a generated frame, if it looks like one.
pub fn seq_of(frame: &[u8]) -> Option<u64> {
    if frame.len() >= SEQ_OFF + 8 && frame[HDRS..HDRS + 4] == PAYLOAD_MAGIC {
        Some(u64::from_be_bytes(
            frame[SEQ_OFF..SEQ_OFF + 8].try_into().ok()?,
        ))
    } else {
        None
    }
}

/// Checks an IPv4/UDP frame's lengths and both checksums (TX verify mode).
pub fn verify_udp4(f: &[u8]) -> bool {
    if f.len() < HDRS || f[12..14] != [0x08, 0x00] {
        return false;
    }
    let ip = &f[ETH_HDR..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ip[0] >> 4 != 4 || ihl < IP_HDR || ip.len() < ihl + UDP_HDR {
        return false;
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if total > ip.len() || total < ihl + UDP_HDR || fold(sum16(&ip[..ihl])) != 0xffff {
        return false;
    }
    if ip[9] != 17 {
        return false;
    }
    let udp = &ip[ihl..total];
    let ulen = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if ulen != udp.len() {
        return false;
    }
    if udp[6..8] == [0, 0] {
        return true;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    fold(pseudo_sum(&src, &dst, ulen as u16) + sum16(udp)) == 0xffff
}

/// Turns an IPv4/UDP frame into its reply in place: MACs, addresses and ports swapped.
/// Both checksums stay valid (the sums are commutative). Returns false if not IPv4/UDP.
pub fn echo_swap(f: &mut [u8]) -> bool {
    if f.len() < HDRS || f[12..14] != [0x08, 0x00] || f[ETH_HDR + 9] != 17 {
        return false;
    }
    let ihl = (f[ETH_HDR] & 0x0f) as usize * 4;
    if ihl < IP_HDR || f.len() < ETH_HDR + ihl + UDP_HDR {
        return false;
    }
    for i in 0..6 {
        f.swap(i, 6 + i);
    }
    for i in 0..4 {
        f.swap(ETH_HDR + 12 + i, ETH_HDR + 16 + i);
    }
    let u = ETH_HDR + ihl;
    for i in 0..2 {
        f.swap(u + i, u + 2 + i);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: usize) -> FrameSpec {
        FrameSpec {
            size,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: "10.0.0.1:4000".parse().unwrap(),
            dst: "10.0.0.2:9".parse().unwrap(),
        }
    }

    #[test]
    fn stamped_frames_verify_at_every_size() {
        for size in [64, 65, 1514, 8192, 16384, 65536] {
            let t = UdpTemplate::new(&spec(size)).unwrap();
            let mut f = vec![0; size];
            for seq in [0u64, 1, 0xffff, 0x1234_5678_9abc_def0, u64::MAX] {
                t.build_into(seq, &mut f);
                assert!(verify_udp4(&f), "size {size} seq {seq}");
                assert_eq!(seq_of(&f), Some(seq));
                let mut e = f.clone();
                assert!(echo_swap(&mut e));
                assert!(verify_udp4(&e));
                assert_eq!(&e[0..6], &f[6..12]);
            }
            f[size - 1] ^= 0x40;
            assert!(!verify_udp4(&f));
        }
        assert!(UdpTemplate::new(&spec(63)).is_err());
        assert!(UdpTemplate::new(&spec(65537)).is_err());
    }
}
