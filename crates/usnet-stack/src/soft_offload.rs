//! What a NIC (or the kernel behind a TAP) does with a frame the stack handed over
//! with offloads: finish a partial L4 checksum, and cut a TCP GSO frame into wire
//! segments of `gso_size` payload bytes. The simulator uses it so TSO conversations
//! run in virtual time; a device without the offload could use it the same way.

use usnet_pool::{GsoKind, Offload};
use usnet_wire as wire;

const ETH: usize = 14;

/// The wire frames `frame` stands for. Frames without offloads come back unchanged;
/// a GSO frame whose headers do not parse comes back as-is (a NIC would drop it, and
/// so will the receiver).
pub fn resolve(frame: &[u8], o: &Offload) -> Vec<Vec<u8>> {
    if o.gso_size > 0 && matches!(o.gso_kind, GsoKind::TcpV4 | GsoKind::TcpV6) {
        if let Some(segs) = segment(frame, o) {
            return segs;
        }
        return vec![frame.to_vec()];
    }
    let mut f = frame.to_vec();
    if o.needs_csum {
        finish_checksum(&mut f, o.csum_start as usize, o.csum_offset as usize);
    }
    vec![f]
}

/// Completes a partial checksum: the field holds the pseudo-header sum; the sum from
/// `start` to the end of the frame, complemented, replaces it.
fn finish_checksum(f: &mut [u8], start: usize, offset: usize) {
    let at = start + offset;
    if at + 2 > f.len() {
        return;
    }
    let c = wire::finish(wire::sum(&f[start..]));
    f[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

fn segment(frame: &[u8], o: &Offload) -> Option<Vec<Vec<u8>>> {
    let mss = o.gso_size as usize;
    let hdr = o.hdr_len as usize;
    let l3 = o.csum_start as usize;
    if hdr > frame.len() || l3 < ETH || l3 + wire::TCP_HEADER_LEN > hdr || mss == 0 {
        return None;
    }
    let v4 = match o.gso_kind {
        GsoKind::TcpV4 => true,
        GsoKind::TcpV6 => false,
        // UDP fragmentation offload is not something the stack asks for.
        GsoKind::None | GsoKind::Udp => return None,
    };
    let payload = &frame[hdr..];
    let seq0 = u32::from_be_bytes(frame[l3 + 4..l3 + 8].try_into().ok()?);
    let flags0 = frame[l3 + 13];
    let n = payload.len().div_ceil(mss).max(1);
    let mut out = Vec::with_capacity(n);
    for (k, chunk) in payload.chunks(mss).enumerate() {
        let mut f = Vec::with_capacity(hdr + chunk.len());
        f.extend_from_slice(&frame[..hdr]);
        f.extend_from_slice(chunk);
        let tcp_len = hdr - l3 + chunk.len();
        if v4 {
            let ihl = l3 - ETH;
            let total = (ihl + tcp_len) as u16;
            f[ETH + 2..ETH + 4].copy_from_slice(&total.to_be_bytes());
            // Each segment gets its own IP ID, as Linux's GSO does.
            let id = u16::from_be_bytes([f[ETH + 4], f[ETH + 5]]).wrapping_add(k as u16);
            f[ETH + 4..ETH + 6].copy_from_slice(&id.to_be_bytes());
            f[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
            let c = wire::finish(wire::sum(&f[ETH..ETH + ihl]));
            f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            let plen = (l3 - ETH - wire::IPV6_HEADER_LEN + tcp_len) as u16;
            f[ETH + 4..ETH + 6].copy_from_slice(&plen.to_be_bytes());
        }
        let seq = seq0.wrapping_add((k * mss) as u32);
        f[l3 + 4..l3 + 8].copy_from_slice(&seq.to_be_bytes());
        // FIN and PSH belong to the last segment, CWR to the first.
        let last = (k + 1) * mss >= payload.len();
        let mut flags = flags0;
        if !last {
            flags &= !(wire::TcpFlags::FIN.0 | wire::TcpFlags::PSH.0) as u8;
        }
        if k > 0 {
            flags &= !0x80;
        }
        f[l3 + 13] = flags;
        let (src, dst) = addrs(&f, v4)?;
        let pseudo = wire::pseudo(src, dst, wire::IPPROTO_TCP, tcp_len as u32);
        f[l3 + 16..l3 + 18].copy_from_slice(&[0, 0]);
        let c = wire::finish(pseudo + wire::sum(&f[l3..]));
        f[l3 + 16..l3 + 18].copy_from_slice(&c.to_be_bytes());
        out.push(f);
    }
    Some(out)
}

fn addrs(f: &[u8], v4: bool) -> Option<(std::net::IpAddr, std::net::IpAddr)> {
    if v4 {
        let s: [u8; 4] = f.get(ETH + 12..ETH + 16)?.try_into().ok()?;
        let d: [u8; 4] = f.get(ETH + 16..ETH + 20)?.try_into().ok()?;
        Some((s.into(), d.into()))
    } else {
        let s: [u8; 16] = f.get(ETH + 8..ETH + 24)?.try_into().ok()?;
        let d: [u8; 16] = f.get(ETH + 24..ETH + 40)?.try_into().ok()?;
        Some((s.into(), d.into()))
    }
}
