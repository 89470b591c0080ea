//! The virtual link between the script and the stack: packets from the script enter
//! the stack as Ethernet frames (a script's `--mss` as a GSO frame); frames the
//! stack sends leave as IP packets for the script, except ARP requests and
//! neighbour solicitations, which are answered here with a fixed peer MAC.

use std::net::Ipv6Addr;

use usnet_pool::{GsoKind, Offload};
use usnet_wire::MacAddr;

use crate::config::Res;

/// The MAC this library answers ARP/NDP with: the "other end" of the virtual link.
pub const PEER_MAC: MacAddr = MacAddr([0x02, 0x70, 0x64, 0x00, 0x00, 0x02]);
/// The stack's own MAC.
pub const STACK_MAC: MacAddr = MacAddr([0x02, 0x70, 0x64, 0x00, 0x00, 0x01]);

const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;

/// What becomes of a frame the stack sent.
pub(crate) enum Sorted {
    /// An ARP request or a neighbour solicitation: the answer to hand back to the
    /// stack (ethertype, payload), as from [`PEER_MAC`].
    Answer(u16, Vec<u8>),
    /// An IP packet for the script (Ethernet header and padding stripped).
    ToScript(Vec<u8>),
    /// Link business (router and neighbour discovery, MLD), or not IP.
    Dropped,
}

/// Sorts a frame the stack sent (see [`Sorted`]).
pub(crate) fn sort_frame(frame: &[u8]) -> Sorted {
    let Ok(eth) = usnet_wire::parse_ethernet(frame) else {
        return Sorted::Dropped;
    };
    let p = eth.payload;
    match eth.ethertype {
        ETH_ARP => {
            let Ok(req) = usnet_wire::ArpRepr::parse(p) else {
                return Sorted::Dropped;
            };
            if req.op != usnet_wire::ArpOp::Request {
                return Sorted::Dropped;
            }
            let reply = usnet_wire::ArpRepr {
                op: usnet_wire::ArpOp::Reply,
                sender_mac: PEER_MAC,
                sender_ip: req.target_ip,
                target_mac: req.sender_mac,
                target_ip: req.sender_ip,
            };
            let mut b = [0u8; 28];
            match reply.emit(&mut b) {
                Ok(_) => Sorted::Answer(ETH_ARP, b.to_vec()),
                Err(_) => Sorted::Dropped,
            }
        }
        ETH_IPV4 if p.len() >= 20 => {
            let total = u16::from_be_bytes([p[2], p[3]]) as usize;
            Sorted::ToScript(p[..total.clamp(20, p.len())].to_vec())
        }
        ETH_IPV6 if p.len() >= 40 => {
            if let Some(na) = neighbor_advert_for(p) {
                return Sorted::Answer(ETH_IPV6, na);
            }
            let n = (40 + u16::from_be_bytes([p[4], p[5]]) as usize).min(p.len());
            // Neighbour/router discovery and MLD are link business, not the script's.
            if p[6] == 58 && n > 40 && (130..=143).contains(&p[40]) {
                return Sorted::Dropped;
            }
            Sorted::ToScript(p[..n].to_vec())
        }
        _ => Sorted::Dropped,
    }
}

/// An Ethernet frame to the stack from [`PEER_MAC`].
pub(crate) fn link_frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&STACK_MAC.0);
    f.extend_from_slice(&PEER_MAC.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The frame (and its receive offload) for an IP packet from the script: with
/// `gso_mss` (packetdrill's `--mss`, its tun write) a TCP packet with data is a GSO
/// frame of segments that size.
pub(crate) fn script_frame(ip: &[u8], gso_mss: Option<u16>) -> Res<(Vec<u8>, Offload)> {
    let et = match ip.first().map(|b| b >> 4) {
        Some(4) => ETH_IPV4,
        Some(6) => ETH_IPV6,
        _ => return Err(libc::EINVAL),
    };
    let o = match (gso_mss, tcp_payload_len(ip)) {
        (Some(mss), Some(n)) if n > 0 => Offload {
            gso_size: mss,
            gso_kind: if et == ETH_IPV4 {
                GsoKind::TcpV4
            } else {
                GsoKind::TcpV6
            },
            ..Offload::default()
        },
        _ => Offload::default(),
    };
    Ok((link_frame(et, ip), o))
}

/// The TCP payload length of an IP packet (IPv4, or IPv6 without extension
/// headers); `None` for anything else.
fn tcp_payload_len(ip: &[u8]) -> Option<usize> {
    let (l3, total, proto) = match ip.first()? >> 4 {
        4 => (
            usize::from(ip[0] & 0x0f) * 4,
            usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?])),
            *ip.get(9)?,
        ),
        6 => (
            40,
            40 + usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?])),
            *ip.get(6)?,
        ),
        _ => return None,
    };
    let doff = usize::from(ip.get(l3 + 12)? >> 4) * 4;
    (proto == 6 && total.min(ip.len()) >= l3 + doff).then(|| total.min(ip.len()) - l3 - doff)
}

/// A neighbour advertisement answering `ns` (an IPv6 packet), if it is a solicitation.
fn neighbor_advert_for(ns: &[u8]) -> Option<Vec<u8>> {
    if ns.len() < 40 + 24 || ns[6] != 58 || ns[40] != 135 {
        return None;
    }
    let src: [u8; 16] = ns[8..24].try_into().ok()?;
    let target: [u8; 16] = ns[48..64].try_into().ok()?;
    let dst = if src == [0; 16] {
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets()
    } else {
        src
    };
    let mut icmp = vec![136u8, 0, 0, 0, 0x60, 0, 0, 0];
    icmp.extend_from_slice(&target);
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&PEER_MAC.0);
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&target);
    add(&dst);
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(&icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let ck = !(sum as u16);
    icmp[2..4].copy_from_slice(&ck.to_be_bytes());
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    p.extend_from_slice(&[58, 255]);
    p.extend_from_slice(&target);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&icmp);
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_payload_of_an_injected_packet() {
        // IPv4: 20-byte header, TCP with 12 bytes of options, 100 bytes of data.
        let mut v4 = vec![0u8; 20 + 32 + 100];
        v4[0] = 0x45;
        v4[2..4].copy_from_slice(&(152u16).to_be_bytes());
        v4[9] = 6;
        v4[20 + 12] = 8 << 4;
        assert_eq!(tcp_payload_len(&v4), Some(100));
        v4[9] = 17;
        assert_eq!(tcp_payload_len(&v4), None, "not TCP");
        // IPv6: a pure ACK.
        let mut v6 = vec![0u8; 40 + 20];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&(20u16).to_be_bytes());
        v6[6] = 6;
        v6[40 + 12] = 5 << 4;
        assert_eq!(tcp_payload_len(&v6), Some(0));
        assert_eq!(tcp_payload_len(&v6[..30]), None, "cut short");
    }
}
