//! The shard steering function: which of `n` queues a received frame belongs to,
//! computed from its bytes alone, so that every party that steers frames (the stack's
//! shards, the AF_PACKET fanout program, a sending shm link) agrees without talking.
//! The rules (ephemeral ports name their shard, server ports spread by a hash of both
//! ports) are explained in `usnet_stack::shard`, which builds on this.

use crate::checksum::{IPPROTO_TCP as PROTO_TCP, IPPROTO_UDP as PROTO_UDP};
use crate::ethernet::ethertype::{IPV4 as ETHERTYPE_IPV4, IPV6 as ETHERTYPE_IPV6};
use crate::ethernet::ETHERNET_HEADER_LEN as ETH_HDR;

/// First ephemeral port (IANA's dynamic range, 49152..=65535).
pub const EPHEMERAL_FIRST: u16 = 49152;

/// The value a flow's shard is taken from (modulo the shard count), seen from this
/// host: `local` is our port. An ephemeral local port is its own value; otherwise the
/// two ports are mixed (a multiplicative hash), since a peer's ports need not vary
/// in their low bits (Linux gives `connect` even ports only).
#[inline]
pub fn flow_value(local: u16, remote: u16) -> u32 {
    if local >= EPHEMERAL_FIRST {
        u32::from(local)
    } else {
        u32::from(local ^ remote).wrapping_mul(0x9e37_79b1) >> 16
    }
}

/// The shard of a TCP or UDP flow among `n`, seen from this host.
#[inline]
pub fn flow_shard(local: u16, remote: u16, n: usize) -> usize {
    flow_value(local, remote) as usize % n
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The queue (shard) a link steers a frame to, seen from the host that receives it:
/// for unfragmented TCP and UDP the raw value the AF_PACKET fanout program returns
/// (the kernel takes it modulo the group size), 0 for the rest.
pub fn link_queue_value(frame: &[u8]) -> u32 {
    let ports = |at: usize| -> Option<u32> {
        let src = be16(frame, at)?;
        let dst = be16(frame, at + 2)?;
        Some(flow_value(dst, src))
    };
    let v = match be16(frame, 12) {
        Some(ETHERTYPE_IPV4) => {
            let frag = be16(frame, ETH_HDR + 6).unwrap_or(0x3fff);
            let proto = frame.get(ETH_HDR + 9).copied();
            let ihl = usize::from(frame.get(ETH_HDR).copied().unwrap_or(0) & 0x0f) * 4;
            match proto {
                Some(PROTO_TCP | PROTO_UDP) if frag & 0x3fff == 0 => ports(ETH_HDR + ihl),
                _ => None,
            }
        }
        Some(ETHERTYPE_IPV6) => match frame.get(ETH_HDR + 6).copied() {
            Some(PROTO_TCP | PROTO_UDP) => ports(ETH_HDR + 40),
            _ => None,
        },
        _ => None,
    };
    v.unwrap_or(0)
}

/// [`link_queue_value`] for `n` queues.
#[inline]
pub fn link_queue(frame: &[u8], n: usize) -> usize {
    link_queue_value(frame) as usize % n.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4(src: u16, dst: u16, frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[14 + 6..14 + 8].copy_from_slice(&frag.to_be_bytes());
        f[14 + 9] = PROTO_TCP;
        f[34..36].copy_from_slice(&src.to_be_bytes());
        f[36..38].copy_from_slice(&dst.to_be_bytes());
        f
    }

    #[test]
    fn an_ephemeral_destination_names_its_queue_and_fragments_go_to_zero() {
        assert_eq!(link_queue(&tcp4(80, 50001, 0), 4), 50001 % 4);
        assert_eq!(link_queue(&tcp4(50001, 80, 0), 4), flow_shard(80, 50001, 4));
        // More fragments, or an offset: no ports to read.
        assert_eq!(link_queue(&tcp4(80, 50001, 0x2000), 4), 0);
        assert_eq!(link_queue(&tcp4(80, 50001, 0x0010), 4), 0);
        // Don't-fragment is not a fragment.
        assert_eq!(link_queue(&tcp4(80, 50001, 0x4000), 4), 50001 % 4);
        assert_eq!(link_queue(&[0u8; 10], 4), 0);
    }
}
