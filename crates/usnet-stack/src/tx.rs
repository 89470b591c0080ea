//! Transmit path: route → build the frame in one pool buffer (headers written in front
//! of the payload) → fragment when larger than the MTU → resolve the next hop's MAC
//! (or hold the frame while ARP/NDP asks) → transmit queue.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::sync::Arc;

use usnet_pool::{BufId, GsoKind, Lender, Offload, PacketPool, PktBuf};
use usnet_wire::{
    self as wire, ethertype, ArpOp, ArpRepr, Icmpv4Repr, Icmpv6Repr, Ipv4Repr, Ipv6Repr, MacAddr,
    TcpFlags,
};

use crate::core::Core;
use crate::frag::{Expired, FragKey};
use crate::neighbor::{HoldError, Lookup};
use crate::types::Unreach;
use crate::StackError;

const ETH: usize = wire::ETHERNET_HEADER_LEN;
/// Largest IP packet a GSO frame may describe.
const GSO_MAX_IP: usize = 65535;
/// The least payload a frame starts with to carry lent bytes by reference: below
/// it the copy costs less than the device's extra iovec (nginx's 151-byte answers
/// under the shim spent 0.3 µs more kernel time per request by reference).
const LENT_MIN: usize = 1024;
/// Most buffers one GSO frame may chain: a device writes a frame with one iovec per
/// buffer (the TAP allows 64), and 64 KiB in 2 KiB buffers takes 33.
const GSO_MAX_BUFS: usize = 48;

/// A GSO frame being built from consecutive segments of one connection: headers and
/// the first payload in `buf`, the rest in buffers chained after it (or, for
/// zero-copy pieces, every payload as fragments of `buf`).
pub(crate) struct GsoPending {
    buf: PktBuf,
    /// The chain's last buffer, where the next segment's payload goes (owned by the
    /// chain).
    tail: BufId,
    /// Buffers in the chain.
    bufs: usize,
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
    /// The first segment's header (PSH added if a joined segment had it).
    repr: usnet_tcp::TcpRepr,
    next_seq: u32,
    /// Payload bytes per segment (gso_size).
    seg: usize,
    payload: usize,
    segs: usize,
    l3: usize,
    next_hop: IpAddr,
    /// A short or PSH segment ended it: nothing more may join.
    closed: bool,
    /// The TTL and TOS byte (DSCP and ECN) of every segment in it.
    ip: IpFields,
    /// The payload is carried as fragments of `buf` (zero-copy pieces where they
    /// lie, or a lent ring's bytes), not copied into its chain; `bufs` counts the
    /// fragments.
    frags: bool,
}

/// What [`Core::gso_start`] found.
enum GsoStart {
    Unjoinable,
    Refused,
    Head(PktBuf, usize, IpAddr),
}

impl GsoPending {
    #[allow(clippy::too_many_arguments)]
    fn new(
        buf: PktBuf,
        tail: BufId,
        bufs: usize,
        frags: bool,
        (local, remote): (std::net::SocketAddr, std::net::SocketAddr),
        repr: &usnet_tcp::TcpRepr,
        plen: usize,
        (l3, next_hop): (usize, IpAddr),
        ip: IpFields,
    ) -> GsoPending {
        GsoPending {
            buf,
            tail,
            bufs,
            local,
            remote,
            repr: *repr,
            next_seq: repr.seq.wrapping_add(plen as u32),
            seg: plen,
            payload: plen,
            segs: 1,
            l3,
            next_hop,
            closed: repr.flags.contains(TcpFlags::PSH),
            ip,
            frags,
        }
    }

    /// Whether a segment (`plen` payload bytes, `more_bufs` more buffers or
    /// fragments) continues this frame: the next bytes of the same connection with
    /// the same header but for the sequence number and PSH, no longer than the
    /// frame's segments, within the size and buffer limits.
    fn continues(
        &self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        plen: usize,
        ip: IpFields,
        more_bufs: usize,
    ) -> bool {
        let mut same = *repr;
        same.seq = self.repr.seq;
        same.flags = TcpFlags(same.flags.0 & !TcpFlags::PSH.0);
        let mut first = self.repr;
        first.flags = TcpFlags(first.flags.0 & !TcpFlags::PSH.0);
        let fits = self.l3 + repr.header_len() + self.payload + plen <= GSO_MAX_IP
            && self.bufs + more_bufs <= GSO_MAX_BUFS;
        !self.closed
            && self.local == local
            && self.remote == remote
            && repr.seq == self.next_seq
            && same == first
            && self.ip == ip
            && plen > 0
            && plen <= self.seg
            && fits
    }

    /// Counts a segment that joined the frame.
    fn joined(&mut self, repr: &usnet_tcp::TcpRepr, plen: usize, more_bufs: usize) {
        self.joined_run(repr, plen, 1, more_bufs);
    }

    /// How many more full segments (beyond what `continues` checked for one) fit
    /// in the frame: its size limit, and its buffer limit with `tailroom` bytes
    /// left in the last buffer of a pool of `buf_size` buffers.
    fn room_for(&self, hl: usize, tailroom: usize, buf_size: usize) -> usize {
        let by_bufs = tailroom + GSO_MAX_BUFS.saturating_sub(self.bufs) * buf_size;
        self.room_by_size(hl).min(by_bufs) / self.seg.max(1)
    }

    /// Payload bytes the frame's size limit leaves room for.
    fn room_by_size(&self, hl: usize) -> usize {
        GSO_MAX_IP.saturating_sub(self.l3 + hl + self.payload)
    }

    /// Counts `segs` segments, `plen` bytes in all, that joined the frame; `last`
    /// is the last one's header.
    fn joined_run(
        &mut self,
        last: &usnet_tcp::TcpRepr,
        plen: usize,
        segs: usize,
        more_bufs: usize,
    ) {
        self.bufs += more_bufs;
        self.payload += plen;
        self.segs += segs;
        self.next_seq = self.next_seq.wrapping_add(plen as u32);
        if last.flags.contains(TcpFlags::PSH) {
            self.repr.flags = TcpFlags(self.repr.flags.0 | TcpFlags::PSH.0);
            self.closed = true;
        }
        if plen < segs * self.seg {
            self.closed = true;
        }
    }
}

/// A run's zero-copy pieces, taken from the front a segment's worth at a time.
struct SpanCut<'a> {
    spans: &'a [usnet_tcp::BufSpan],
    /// The span the next byte lies in, and how far into it.
    at: usize,
    off: u32,
}

impl<'a> SpanCut<'a> {
    fn new(spans: &'a [usnet_tcp::BufSpan]) -> Self {
        SpanCut {
            spans,
            at: 0,
            off: 0,
        }
    }

    /// How many of the next `max` segments of `seg` bytes lie in at most `frags`
    /// spans (counting each span they touch: an upper bound on the fragments
    /// they add, since a piece that continues the last fragment extends it).
    fn segments_within(&self, seg: usize, max: usize, frags: usize) -> usize {
        let (mut at, mut off) = (self.at, self.off as usize);
        let (mut touched, mut counted) = (0, None);
        for k in 0..max {
            let mut need = seg;
            while need > 0 {
                let Some(s) = self.spans.get(at) else {
                    return k;
                };
                if counted != Some(at) {
                    (touched, counted) = (touched + 1, Some(at));
                }
                let take = need.min(s.len as usize - off);
                need -= take;
                off += take;
                if off == s.len as usize {
                    (at, off) = (at + 1, 0);
                }
            }
            if touched > frags {
                return k;
            }
        }
        max
    }

    /// Attaches the next `bytes` of the pieces to `head` as fragments.
    fn attach(&mut self, pool: &mut PacketPool, head: BufId, mut bytes: usize) {
        while bytes > 0 {
            let s = self.spans[self.at];
            let take = bytes.min((s.len - self.off) as usize);
            let piece = pool.checked(s.buf).expect("checked by the caller");
            pool.attach(head, piece, (s.off + self.off) as usize, take)
                .expect("ranges checked by the caller");
            bytes -= take;
            self.off += take as u32;
            if self.off == s.len {
                (self.at, self.off) = (self.at + 1, 0);
            }
        }
    }
}

/// Carries zero-copy `spans` (checked by the caller) as fragments of `head`.
fn attach_spans(pool: &mut PacketPool, head: BufId, spans: &[usnet_tcp::BufSpan]) {
    for s in spans {
        let piece = pool.checked(s.buf).expect("checked by the caller");
        pool.attach(head, piece, s.off as usize, s.len as usize)
            .expect("ranges checked by the caller");
    }
}

/// `lent` when every byte of `payload` lies in the memory it lends: the payload
/// may then ride a GSO frame by reference ([`usnet_pool::PacketPool::attach_lent`]).
fn lent_payload<'l>(
    lent: Option<&'l Arc<dyn Lender>>,
    payload: (&[u8], &[u8]),
) -> Option<&'l Arc<dyn Lender>> {
    let l = lent?;
    let inside = |s: &[u8]| s.is_empty() || l.offset_of(s).is_some();
    (inside(payload.0) && inside(payload.1)).then_some(l)
}

/// IPv6 fragment header fields for one fragment.
#[derive(Clone, Copy)]
struct FragFields {
    offset: usize,
    more: bool,
    ident: u32,
}

/// The per-packet fields of an IP header a sender chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpFields {
    /// TTL or hop limit.
    pub ttl: u8,
    /// The whole TOS byte or traffic class.
    pub tos: u8,
    /// The largest packet to send whole, when below the link's MTU (a socket's
    /// IPV6_MTU); 0: the link's.
    pub frag_size: usize,
}

impl IpFields {
    /// `ttl` and `tos`, fragments at the link's MTU.
    pub(crate) fn new(ttl: u8, tos: u8) -> IpFields {
        IpFields {
            ttl,
            tos,
            frag_size: 0,
        }
    }

    /// `ttl` and TOS 0.
    pub(crate) fn ttl(ttl: u8) -> IpFields {
        IpFields::new(ttl, 0)
    }

    /// The largest packet to send whole on a link of `mtu`.
    pub(crate) fn mtu_on(&self, mtu: usize) -> usize {
        match self.frag_size {
            0 => mtu,
            f => f.min(mtu),
        }
    }
}

/// The IP ECN codepoint for ECT(0) (RFC 3168 §5).
pub(crate) const ECN_ECT0: u8 = 0b10;

/// Puts the ECN codepoint `ecn` into the IP header `write_headers` wrote after the
/// Ethernet header of `frame` (redoing the IPv4 header checksum).
fn set_ip_ecn(frame: &mut [u8], ecn: u8) {
    if ecn == 0 {
        return;
    }
    // `ecn` is the whole TOS / traffic class byte (DSCP and ECN; the ECN field
    // alone for most callers).
    let ip = &mut frame[ETH..];
    if ip[0] >> 4 == 4 {
        ip[1] = ecn;
        ip[10..12].fill(0);
        let ihl = usize::from(ip[0] & 0xf) * 4;
        let c = wire::finish(wire::sum(&ip[..ihl]));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    } else {
        // The traffic class straddles bytes 0 and 1.
        ip[0] = (ip[0] & 0xf0) | (ecn >> 4);
        ip[1] = (ip[1] & 0x0f) | ((ecn & 0x0f) << 4);
    }
}

fn ip_header_len(dst: IpAddr) -> usize {
    if dst.is_ipv4() {
        wire::IPV4_HEADER_LEN
    } else {
        wire::IPV6_HEADER_LEN
    }
}

fn multicast_mac(dst: IpAddr) -> Option<MacAddr> {
    match dst {
        IpAddr::V4(a) if a.is_broadcast() => Some(MacAddr::BROADCAST),
        IpAddr::V4(a) if a.is_multicast() => {
            let o = a.octets();
            Some(MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]))
        }
        IpAddr::V6(a) if a.is_multicast() => {
            let o = a.octets();
            Some(MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]]))
        }
        _ => None,
    }
}

/// Offload metadata for a frame whose L4 checksum field holds only the pseudo-header
/// sum: the device finishes it from `l4_start`, storing it `csum_offset` bytes in.
fn partial_csum_offload(l4_start: usize, csum_offset: u16) -> Offload {
    Offload {
        needs_csum: true,
        csum_start: l4_start as u16,
        csum_offset,
        ..Offload::default()
    }
}

impl Core {
    fn push_tx(&mut self, buf: PktBuf) {
        self.counters.link_tx_frames += 1;
        self.counters.link_tx_bytes += self.pool.chain_len(&buf) as u64;
        self.tx.push_back(buf);
    }

    /// Writes the Ethernet and IP headers for a packet whose upper-layer bytes are
    /// `l4_len` long, into the first bytes of `out`.
    #[allow(clippy::too_many_arguments)]
    fn write_headers(
        &mut self,
        out: &mut [u8],
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        ttl: u8,
        l4_len: usize,
        frag: Option<FragFields>,
        dont_frag: bool,
    ) {
        let mac = self.cfg.mac;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let _ = wire::emit_ethernet(out, MacAddr::default(), mac, ethertype::IPV4);
                let (ident, more, off) = match frag {
                    Some(f) => (f.ident as u16, f.more, f.offset as u16),
                    None => {
                        self.ip_ident = self.ip_ident.wrapping_add(1);
                        (self.ip_ident, false, 0)
                    }
                };
                let repr = Ipv4Repr {
                    src: s,
                    dst: d,
                    protocol: proto,
                    payload_len: l4_len,
                    ttl,
                    ident,
                    dont_frag,
                    more_frags: more,
                    frag_offset: off,
                };
                let _ = repr.emit(&mut out[ETH..]);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let _ = wire::emit_ethernet(out, MacAddr::default(), mac, ethertype::IPV6);
                let ext = if frag.is_some() { 8 } else { 0 };
                let repr = Ipv6Repr {
                    src: s,
                    dst: d,
                    next_header: if frag.is_some() { 44 } else { proto },
                    payload_len: l4_len + ext,
                    hop_limit: ttl,
                };
                let _ = repr.emit(&mut out[ETH..]);
                if let Some(f) = frag {
                    let at = ETH + wire::IPV6_HEADER_LEN;
                    let _ = wire::emit_ipv6_fragment_header(
                        &mut out[at..],
                        proto,
                        f.offset as u16,
                        f.more,
                        f.ident,
                    );
                }
            }
            _ => unreachable!("route() never mixes families"),
        }
    }

    /// A frame of `src → dst` carrying `l4` (already complete upper-layer bytes).
    #[allow(clippy::too_many_arguments)]
    fn build_frame(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        proto: u8,
        ip: IpFields,
        l4: &[u8],
        frag: Option<FragFields>,
    ) -> Result<PktBuf, StackError> {
        let ttl = ip.ttl;
        let hdr = ETH
            + ip_header_len(dst)
            + if frag.is_some() && dst.is_ipv6() {
                8
            } else {
                0
            };
        let total = hdr + l4.len();
        if total <= self.pool.buf_size() - self.pool.headroom() {
            let Some(buf) = self.pool.alloc() else {
                self.counters.drop_pool_exhausted += 1;
                return Err(StackError::NoBuffers);
            };
            let mut hdr_bytes = [0u8; 128];
            self.write_headers(&mut hdr_bytes, src, dst, proto, ttl, l4.len(), frag, false);
            set_ip_ecn(&mut hdr_bytes, ip.tos);
            let out = self.pool.append(&buf, total).expect("size checked");
            out[..hdr].copy_from_slice(&hdr_bytes[..hdr]);
            out[hdr..].copy_from_slice(l4);
            return Ok(buf);
        }
        // Larger than one buffer (jumbo MTU with small buffers): build, then chain.
        let mut frame = std::mem::take(&mut self.frame_scratch);
        frame.clear();
        frame.resize(hdr, 0);
        self.write_headers(&mut frame, src, dst, proto, ttl, l4.len(), frag, false);
        set_ip_ecn(&mut frame, ip.tos);
        frame.extend_from_slice(l4);
        let buf = self.pool.alloc_from(&frame);
        self.frame_scratch = frame;
        buf.ok_or_else(|| {
            self.counters.drop_pool_exhausted += 1;
            StackError::NoBuffers
        })
    }

    /// Sends complete upper-layer bytes, fragmenting when they exceed the MTU.
    pub(crate) fn send_ip(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        proto: u8,
        ip: IpFields,
        l4: &[u8],
    ) -> Result<(), StackError> {
        let mtu = ip.mtu_on(self.cfg.mtu);
        let v4 = dst.is_ipv4();
        if ip_header_len(dst) + l4.len() <= mtu {
            let buf = self.build_frame(src, dst, proto, ip, l4, None)?;
            if v4 {
                self.counters.ip4_tx += 1;
            } else {
                self.counters.ip6_tx += 1;
            }
            self.dispatch(buf, next_hop);
            return Ok(());
        }
        let chunk = if v4 {
            (mtu - wire::IPV4_HEADER_LEN) & !7
        } else {
            (mtu - wire::IPV6_HEADER_LEN - 8) & !7
        };
        let ident = if v4 {
            self.ip_ident = self.ip_ident.wrapping_add(1);
            self.ip_ident as u32
        } else {
            self.frag6_ident = self.frag6_ident.wrapping_add(1);
            self.frag6_ident
        };
        let mut offset = 0;
        while offset < l4.len() {
            let end = (offset + chunk).min(l4.len());
            let f = FragFields {
                offset,
                more: end < l4.len(),
                ident,
            };
            let buf = self.build_frame(src, dst, proto, ip, &l4[offset..end], Some(f))?;
            if v4 {
                self.counters.ip4_tx += 1;
                self.counters.ip4_tx_fragments += 1;
            } else {
                self.counters.ip6_tx += 1;
                self.counters.ip6_tx_fragments += 1;
            }
            self.dispatch(buf, next_hop);
            offset = end;
        }
        Ok(())
    }

    /// The UDP hot path: one buffer, payload copied once, headers written in front.
    /// `ports`: (source, destination).
    pub(crate) fn send_udp(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        (sport, dport): (u16, u16),
        data: &[u8],
        ip: IpFields,
    ) -> Result<(), StackError> {
        let l3 = ip_header_len(dst);
        let udp_len = wire::UDP_HEADER_LEN + data.len();
        let total = ETH + l3 + udp_len;
        let local = self.is_local_addr(next_hop);
        let mtu = ip.mtu_on(self.cfg.mtu);
        if l3 + udp_len <= mtu && total <= self.pool.buf_size() - self.pool.headroom() {
            let Some(buf) = self.pool.alloc() else {
                self.counters.drop_pool_exhausted += 1;
                return Err(StackError::NoBuffers);
            };
            let mut hdr_bytes = [0u8; 64];
            self.write_headers(
                &mut hdr_bytes,
                src,
                dst,
                wire::IPPROTO_UDP,
                ip.ttl,
                udp_len,
                None,
                false,
            );
            set_ip_ecn(&mut hdr_bytes, ip.tos);
            let offload = self.cfg.tx_csum_offload && !local;
            let out = self.pool.append(&buf, total).expect("size checked");
            out[..ETH + l3].copy_from_slice(&hdr_bytes[..ETH + l3]);
            out[ETH + l3 + wire::UDP_HEADER_LEN..].copy_from_slice(data);
            let udp = &mut out[ETH + l3..];
            let _ = wire::emit_udp_header(udp, src, dst, sport, dport, !offload);
            if offload {
                let partial = wire::udp_partial_checksum(src, dst, udp_len as u32);
                udp[6..8].copy_from_slice(&partial.to_be_bytes());
                self.pool
                    .set_offload(&buf, partial_csum_offload(ETH + l3, 6));
            }
            if dst.is_ipv4() {
                self.counters.ip4_tx += 1;
            } else {
                self.counters.ip6_tx += 1;
            }
            self.dispatch(buf, next_hop);
            return Ok(());
        }
        // Fragmented (or larger than a buffer): assemble the datagram, then split it.
        let mut l4 = std::mem::take(&mut self.scratch);
        l4.clear();
        l4.resize(wire::UDP_HEADER_LEN, 0);
        l4.extend_from_slice(data);
        let _ = wire::emit_udp_header(&mut l4, src, dst, sport, dport, true);
        let r = self.send_ip(src, dst, next_hop, wire::IPPROTO_UDP, ip, &l4);
        self.scratch = l4;
        r
    }

    /// A multicast UDP datagram (its hop limit IP_MULTICAST_TTL /
    /// IPV6_MULTICAST_HOPS unless the send chose one), the checksum computed here
    /// (a looped copy is verified like a received frame), and with `looped` a copy
    /// of every frame into our own input queue for local members.
    pub(crate) fn send_udp_mcast(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        (sport, dport): (u16, u16),
        data: &[u8],
        ip: IpFields,
        looped: bool,
    ) -> Result<(), StackError> {
        let mut l4 = std::mem::take(&mut self.scratch);
        l4.clear();
        l4.resize(wire::UDP_HEADER_LEN, 0);
        l4.extend_from_slice(data);
        let _ = wire::emit_udp_header(&mut l4, src, dst, sport, dport, true);
        self.mcast_loop = looped;
        let r = self.send_ip(src, dst, dst, wire::IPPROTO_UDP, ip, &l4);
        self.mcast_loop = false;
        self.scratch = l4;
        if r.is_ok() {
            self.counters.udp_tx_mcast += 1;
            if looped {
                self.counters.udp_tx_mcast_looped += 1;
            }
        }
        r
    }

    /// One TCP segment from the engine: a pool buffer with the payload copied once
    /// (from up to two slices of the send ring) behind room for the headers, which
    /// are then written in front. DF is set (TCP sizes segments from the MTU and
    /// never fragments); the checksum is left partial when the device completes it.
    /// Returns false, committing nothing, when the transmit queue is full or no
    /// buffer is free: the engine keeps the segment and the stack retries.
    pub(crate) fn send_tcp(
        &mut self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        payload: (&[u8], &[u8]),
        ip: IpFields,
    ) -> bool {
        if self.tx.len() >= self.cfg.tx_queue_len {
            self.counters.tcp_tx_blocked += 1;
            return false;
        }
        let (src, dst) = (local.ip(), remote.ip());
        let Some((_, next_hop)) = self.route(dst) else {
            // Lost, as on a wire; the engine's timers deal with it.
            self.counters.ip_tx_no_route += 1;
            return true;
        };
        let l3 = ip_header_len(dst);
        let hl = repr.header_len();
        let plen = payload.0.len() + payload.1.len();
        let tcp_len = hl + plen;
        let total = ETH + l3 + tcp_len;
        let ttl = ip.ttl;
        if total <= self.pool.buf_size() - self.pool.headroom() {
            let Some(buf) = self.pool.alloc() else {
                // Not a loss: the engine keeps the segment and sends it later.
                self.counters.tcp_tx_blocked += 1;
                return false;
            };
            let out = self.pool.append(&buf, total).expect("size checked");
            let p = ETH + l3 + hl;
            out[p..p + payload.0.len()].copy_from_slice(payload.0);
            out[p + payload.0.len()..].copy_from_slice(payload.1);
            self.write_tcp_headers(&buf, src, dst, repr, ip, plen, next_hop);
            self.finish_tcp_tx(buf, dst, next_hop);
            return true;
        }
        // A segment larger than one buffer (jumbo MTU, small buffers): build, chain.
        let mut frame = std::mem::take(&mut self.frame_scratch);
        frame.clear();
        frame.resize(total, 0);
        self.write_headers(
            &mut frame,
            src,
            dst,
            wire::IPPROTO_TCP,
            ttl,
            tcp_len,
            None,
            true,
        );
        set_ip_ecn(&mut frame, ip.tos);
        let p = ETH + l3 + hl;
        frame[p..p + payload.0.len()].copy_from_slice(payload.0);
        frame[p + payload.0.len()..].copy_from_slice(payload.1);
        let _ = repr.emit(&mut frame[ETH + l3..], src, dst, plen, true);
        let buf = self.pool.alloc_from(&frame);
        self.frame_scratch = frame;
        match buf {
            Some(buf) => {
                self.finish_tcp_tx(buf, dst, next_hop);
                true
            }
            None => {
                self.counters.tcp_tx_blocked += 1;
                false
            }
        }
    }

    /// Writes the Ethernet, IP and TCP headers in front of the `plen` payload bytes
    /// that end `buf`'s data (which starts where the Ethernet header goes).
    #[allow(clippy::too_many_arguments)]
    fn write_tcp_headers(
        &mut self,
        buf: &PktBuf,
        src: IpAddr,
        dst: IpAddr,
        repr: &usnet_tcp::TcpRepr,
        ip: IpFields,
        plen: usize,
        next_hop: IpAddr,
    ) {
        let l3 = ip_header_len(dst);
        let tcp_len = repr.header_len() + plen;
        let mut hdr_bytes = [0u8; 64];
        let ttl = ip.ttl;
        self.write_headers(
            &mut hdr_bytes,
            src,
            dst,
            wire::IPPROTO_TCP,
            ttl,
            tcp_len,
            None,
            true,
        );
        set_ip_ecn(&mut hdr_bytes, ip.tos);
        let offload = self.cfg.tx_csum_offload && !self.is_local_addr(next_hop);
        let out = self.pool.data_mut(buf);
        out[..ETH + l3].copy_from_slice(&hdr_bytes[..ETH + l3]);
        let seg = &mut out[ETH + l3..];
        let _ = repr.emit(seg, src, dst, plen, !offload);
        if offload {
            let partial = wire::partial_checksum(src, dst, wire::IPPROTO_TCP, tcp_len as u32);
            seg[16..18].copy_from_slice(&partial.to_be_bytes());
            self.pool
                .set_offload(buf, partial_csum_offload(ETH + l3, 16));
        }
    }

    /// Sends a segment whose payload is `span` of a pool buffer that only the
    /// sender's queue holds, in place: the headers go into the buffer's headroom and
    /// the frame leaves with a second reference (the queue keeps the first for
    /// retransmission). None when it cannot (another reference is still out, not
    /// enough headroom, no route): the caller copies instead.
    pub(crate) fn send_tcp_in_place(
        &mut self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        span: usnet_tcp::BufSpan,
        ip: IpFields,
    ) -> Option<bool> {
        let (src, dst) = (local.ip(), remote.ip());
        let id = self.pool.checked(span.buf)?;
        let front = ETH + ip_header_len(dst) + repr.header_len();
        let frame_off = (span.off as usize).checked_sub(front)?;
        if self.pool.refcount(id) != 1 || !self.pool.is_single(id) {
            return None;
        }
        let (_, next_hop) = self.route(dst)?;
        if self.tx.len() >= self.cfg.tx_queue_len {
            self.counters.tcp_tx_blocked += 1;
            return Some(false);
        }
        let plen = span.len as usize;
        self.pool.set_data(id, frame_off, front + plen)?;
        self.pool.set_offload(id, Offload::default());
        let buf = self.pool.retain(id);
        self.write_tcp_headers(&buf, src, dst, repr, ip, plen, next_hop);
        self.counters.tcp_zc_tx_in_place += 1;
        self.finish_tcp_tx(buf, dst, next_hop);
        Some(true)
    }

    /// Whether TCP segments may be joined into GSO frames.
    pub(crate) fn tso_ok(&self) -> bool {
        self.cfg.tso && self.cfg.tx_csum_offload
    }

    /// Sends a TCP segment, joining it to `pending` (a GSO frame being built as a chain
    /// of pool buffers) when it continues it. Returns false when it was refused (full
    /// transmit queue or empty pool), like `send_tcp`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_tcp_gso(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        payload: (&[u8], &[u8]),
        ip: IpFields,
        lent: Option<&Arc<dyn Lender>>,
    ) -> bool {
        let plen = payload.0.len() + payload.1.len();
        let lent = lent_payload(lent, payload);
        // One segment is a run of one: PSH, if it has it, is on its last.
        if let Some(joined) =
            self.gso_join_run(pending, local, remote, repr, payload, plen, 0, 1, ip, lent)
        {
            return joined == 1;
        }
        // A small answer is cheaper copied than carried as one more part.
        let lent = lent.filter(|_| plen >= LENT_MIN);
        self.gso_begin(pending, local, remote, repr, payload, ip, lent)
    }

    /// Joins segments `done..n` of a run of `n` segments of `seg` bytes (`repr` the
    /// first's header, `payload` the whole run's bytes) to the GSO frame `pending`
    /// holds, as many as its size and buffer limits take, with one append. None:
    /// segment `done` does not continue the frame; Some(0): the pool ran dry
    /// (counted); else how many joined. With `lent` (the payload lies in memory it
    /// lends, checked by the caller), the bytes join as fragments naming it.
    #[allow(clippy::too_many_arguments)]
    fn gso_join_run(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        payload: (&[u8], &[u8]),
        seg: usize,
        done: usize,
        n: usize,
        ip: IpFields,
        lent: Option<&Arc<dyn Lender>>,
    ) -> Option<usize> {
        let p = pending.as_mut()?;
        let first = usnet_tcp::run_segment(repr, seg, done, n);
        if let Some(lender) = lent {
            // Up to two more fragments per append (the ring may wrap).
            if !p.frags || !p.continues(local, remote, &first, seg, ip, 2) {
                return None;
            }
            let k = (p.room_by_size(repr.header_len()) / seg).clamp(1, n - done);
            let bytes = k * seg;
            let (a, b) = usnet_tcp::ring_range(payload, done * seg, bytes);
            let head = p.buf.id();
            for part in [a, b] {
                self.pool
                    .attach_lent(head, lender, part)
                    .expect("the caller checked the payload lies in lent memory");
            }
            p.bufs = 1 + self.pool.frags(head).len();
            let last = usnet_tcp::run_segment(repr, seg, done + k - 1, n);
            p.joined_run(&last, bytes, k, 0);
            self.counters.tcp_tx_lent += k as u64;
            return Some(k);
        }
        let size = self.pool.buf_size();
        let tailroom = self.pool.tailroom(p.tail);
        let one_more = seg.saturating_sub(tailroom).div_ceil(size);
        if p.frags || !p.continues(local, remote, &first, seg, ip, one_more) {
            return None;
        }
        let k = p
            .room_for(repr.header_len(), tailroom, size)
            .clamp(1, n - done);
        let bytes = k * seg;
        let (a, b) = usnet_tcp::ring_range(payload, done * seg, bytes);
        let Some(tail) = self.pool.extend_chain(p.tail, &[a, b]) else {
            self.counters.tcp_tx_blocked += 1;
            return Some(0);
        };
        p.tail = tail;
        let last = usnet_tcp::run_segment(repr, seg, done + k - 1, n);
        let more_bufs = bytes.saturating_sub(tailroom).div_ceil(size);
        p.joined_run(&last, bytes, k, more_bufs);
        Some(k)
    }

    /// Starts a GSO frame with a segment that does not continue the one being built
    /// (which is sent first), or sends it unjoined. False when it was refused.
    /// With `lent`, as [`Core::gso_join_run`].
    #[allow(clippy::too_many_arguments)]
    fn gso_begin(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        payload: (&[u8], &[u8]),
        ip: IpFields,
        lent: Option<&Arc<dyn Lender>>,
    ) -> bool {
        let plen = payload.0.len() + payload.1.len();
        if let Some(lender) = lent {
            let begun =
                self.gso_begin_frags(pending, local, remote, repr, plen, ip, |pool, head| {
                    for part in [payload.0, payload.1] {
                        pool.attach_lent(head, lender, part)
                            .expect("the caller checked the payload lies in lent memory");
                    }
                });
            return match begun {
                None => self.send_tcp(local, remote, repr, payload, ip),
                Some(ok) => {
                    self.counters.tcp_tx_lent += u64::from(ok);
                    ok
                }
            };
        }
        self.flush_gso(pending);
        let (buf, l3, next_hop) = match self.gso_start(remote, repr, plen) {
            GsoStart::Unjoinable => return self.send_tcp(local, remote, repr, payload, ip),
            GsoStart::Refused => return false,
            GsoStart::Head(buf, l3, next_hop) => (buf, l3, next_hop),
        };
        let more_bufs = plen
            .saturating_sub(self.pool.tailroom(&buf))
            .div_ceil(self.pool.buf_size());
        let Some(tail) = self.pool.extend_chain(&buf, &[payload.0, payload.1]) else {
            self.pool.free(buf);
            self.counters.tcp_tx_blocked += 1;
            return false;
        };
        *pending = Some(GsoPending::new(
            buf,
            tail,
            1 + more_bufs,
            false,
            (local, remote),
            repr,
            plen,
            (l3, next_hop),
            ip,
        ));
        true
    }

    /// Sends a run of `n` full segments of `seg` bytes (`SegmentSink::emit_run`)
    /// as [`Core::send_tcp_gso`] sends each: as many as the GSO frame being built
    /// takes join it in one append, and the next starts a frame of its own.
    /// Returns how many, from the first, went (fewer: the transmit queue or the
    /// pool is full).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_tcp_gso_run(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        payload: (&[u8], &[u8]),
        seg: usize,
        n: usize,
        ip: IpFields,
        lent: Option<&Arc<dyn Lender>>,
    ) -> usize {
        let lent = lent_payload(lent, payload);
        let mut done = 0;
        while done < n {
            match self.gso_join_run(
                pending, local, remote, repr, payload, seg, done, n, ip, lent,
            ) {
                Some(0) => return done,
                Some(k) => done += k,
                None => {
                    // The next segment starts a frame (or goes unjoined).
                    let r = usnet_tcp::run_segment(repr, seg, done, n);
                    let one = usnet_tcp::ring_range(payload, done * seg, seg);
                    if !self.gso_begin(pending, local, remote, &r, one, ip, lent) {
                        return done;
                    }
                    done += 1;
                }
            }
        }
        done
    }

    /// Sends a zero-copy TCP segment whose payload is `spans` of pool buffers the
    /// sender's queue holds, joined to `pending` as fragments: the payload leaves
    /// where it lies, the frame holding a reference to each buffer (the queue keeps
    /// its own for retransmission). None when the segment cannot go that way (not
    /// joinable into a GSO frame, or a span that names no live buffer): the caller
    /// gathers its bytes instead. Otherwise as [`Core::send_tcp_gso`].
    pub(crate) fn send_tcp_gso_spans(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        spans: &[usnet_tcp::BufSpan],
        ip: IpFields,
    ) -> Option<bool> {
        if !self.spans_live(spans) {
            return None;
        }
        let plen: usize = spans.iter().map(|s| s.len as usize).sum();
        if let Some(p) = pending.as_mut() {
            if p.frags && p.continues(local, remote, repr, plen, ip, spans.len()) {
                let head = p.buf.id();
                attach_spans(&mut self.pool, head, spans);
                p.joined(repr, plen, 0);
                // Spans that continue the last fragment extend it: count the parts.
                p.bufs = 1 + self.pool.frags(head).len();
                return Some(true);
            }
        }
        let ok = self.gso_begin_frags(pending, local, remote, repr, plen, ip, |pool, head| {
            attach_spans(pool, head, spans)
        })?;
        self.counters.tcp_zc_tx_attached += u64::from(ok);
        Some(ok)
    }

    /// Every zero-copy piece names a live buffer and lies within it (the engine's
    /// queue holds them; a miss is a bug, and the caller gathers instead).
    pub(crate) fn spans_live(&self, spans: &[usnet_tcp::BufSpan]) -> bool {
        let size = self.pool.buf_size();
        let live = spans
            .iter()
            .all(|s| self.pool.checked(s.buf).is_some() && s.off as usize + s.len as usize <= size);
        debug_assert!(live, "zero-copy piece in a free buffer");
        live
    }

    /// [`Core::send_tcp_gso_spans`] for `allowed` of a run of `n` full-sized
    /// segments of `seg` bytes whose payload is `spans` (checked live by the
    /// caller): each append to the frame being built takes as many segments as its
    /// size and fragment limits let it, with their pieces attached at once, and a
    /// segment that does not fit starts the next frame. The frames are the ones
    /// the segments sent one at a time would make. Returns how many went; None
    /// when the first cannot join a GSO frame (the caller sends them one at a
    /// time).
    pub(crate) fn send_tcp_gso_span_run(
        &mut self,
        pending: &mut Option<GsoPending>,
        (local, remote): (std::net::SocketAddr, std::net::SocketAddr),
        repr: &usnet_tcp::TcpRepr,
        spans: &[usnet_tcp::BufSpan],
        (seg, allowed, n): (usize, usize, usize),
        ip: IpFields,
    ) -> Option<usize> {
        let mut cut = SpanCut::new(spans);
        let hl = repr.header_len();
        let mut done = 0;
        while done < allowed {
            let first = usnet_tcp::run_segment(repr, seg, done, n);
            if let Some(p) = pending
                .as_mut()
                .filter(|p| p.frags && p.continues(local, remote, &first, seg, ip, 1))
            {
                let by_size = (p.room_by_size(hl) / seg).clamp(1, allowed - done);
                let k = cut.segments_within(seg, by_size, GSO_MAX_BUFS - p.bufs);
                if k > 0 {
                    let head = p.buf.id();
                    cut.attach(&mut self.pool, head, k * seg);
                    p.bufs = 1 + self.pool.frags(head).len();
                    let last = usnet_tcp::run_segment(repr, seg, done + k - 1, n);
                    p.joined_run(&last, k * seg, k, 0);
                    done += k;
                    continue;
                }
            }
            let begun =
                self.gso_begin_frags(pending, local, remote, &first, seg, ip, |pool, head| {
                    cut.attach(pool, head, seg)
                });
            match begun {
                None if done == 0 => return None,
                None | Some(false) => break,
                Some(true) => {
                    self.counters.tcp_zc_tx_attached += 1;
                    done += 1;
                }
            }
        }
        Some(done)
    }

    /// Starts a GSO frame, after sending the one being built, whose payload
    /// `attach` carries on its head buffer as fragments (zero-copy pieces, a lent
    /// ring's bytes). None: the segment cannot start one and must go on its own
    /// ([`GsoStart::Unjoinable`]); Some(false): no room (counted).
    #[allow(clippy::too_many_arguments)]
    fn gso_begin_frags(
        &mut self,
        pending: &mut Option<GsoPending>,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        plen: usize,
        ip: IpFields,
        attach: impl FnOnce(&mut PacketPool, BufId),
    ) -> Option<bool> {
        self.flush_gso(pending);
        let (buf, l3, next_hop) = match self.gso_start(remote, repr, plen) {
            GsoStart::Unjoinable => return None,
            GsoStart::Refused => return Some(false),
            GsoStart::Head(buf, l3, next_hop) => (buf, l3, next_hop),
        };
        let head = buf.id();
        attach(&mut self.pool, head);
        let parts = 1 + self.pool.frags(head).len();
        *pending = Some(GsoPending::new(
            buf,
            head,
            parts,
            true,
            (local, remote),
            repr,
            plen,
            (l3, next_hop),
            ip,
        ));
        Some(true)
    }

    /// The head buffer of a new GSO frame for a segment of `plen` payload bytes:
    /// headers reserved, no payload yet. Unjoinable: the segment must go on its own
    /// (control flags, no TSO, a local destination, headers that do not fit a
    /// buffer); Refused: no room (counted).
    fn gso_start(
        &mut self,
        remote: std::net::SocketAddr,
        repr: &usnet_tcp::TcpRepr,
        plen: usize,
    ) -> GsoStart {
        let joinable = plen > 0
            && repr.flags.0
                & (TcpFlags::SYN.0 | TcpFlags::RST.0 | TcpFlags::FIN.0 | TcpFlags::URG.0)
                == 0
            && self.tso_ok();
        if !joinable {
            return GsoStart::Unjoinable;
        }
        if self.tx.len() >= self.cfg.tx_queue_len {
            self.counters.tcp_tx_blocked += 1;
            return GsoStart::Refused;
        }
        let dst = remote.ip();
        let Some((_, next_hop)) = self.route(dst) else {
            // `send_tcp` counts the missing route.
            return GsoStart::Unjoinable;
        };
        let l3 = ip_header_len(dst);
        let hl = repr.header_len();
        // The headers go in the first buffer; a pool whose buffers are too small for
        // them (legal: the pool only promises 64 bytes past the headroom) sends the
        // segment unjoined, built the way `send_tcp` builds oversized ones.
        let fits_headers = ETH + l3 + hl <= self.pool.buf_size() - self.pool.headroom();
        if self.is_local_addr(next_hop) || !fits_headers {
            return GsoStart::Unjoinable;
        }
        let Some(buf) = self.pool.alloc() else {
            self.counters.tcp_tx_blocked += 1;
            return GsoStart::Refused;
        };
        // Headers are written when the frame is finished; reserve their room.
        self.pool
            .append(&buf, ETH + l3 + hl)
            .expect("a buffer holds the headers");
        GsoStart::Head(buf, l3, next_hop)
    }

    /// Finishes the GSO frame being built (headers, partial checksum, offload fields)
    /// and sends it.
    pub(crate) fn flush_gso(&mut self, pending: &mut Option<GsoPending>) {
        let Some(p) = pending.take() else {
            return;
        };
        let (src, dst) = (p.local.ip(), p.remote.ip());
        let hl = p.repr.header_len();
        let tcp_len = hl + p.payload;
        let mut hdr = [0u8; 64];
        let ttl = p.ip.ttl;
        self.write_headers(
            &mut hdr,
            src,
            dst,
            wire::IPPROTO_TCP,
            ttl,
            tcp_len,
            None,
            true,
        );
        set_ip_ecn(&mut hdr, p.ip.tos);
        let l3 = p.l3;
        let out = self.pool.data_mut(&p.buf);
        out[..ETH + l3].copy_from_slice(&hdr[..ETH + l3]);
        // The payload may continue in chained buffers: emit the TCP header alone.
        let seg = &mut out[ETH + l3..ETH + l3 + hl];
        let _ = p.repr.emit(seg, src, dst, 0, false);
        let partial = wire::partial_checksum(src, dst, wire::IPPROTO_TCP, tcp_len as u32);
        seg[16..18].copy_from_slice(&partial.to_be_bytes());
        let mut o = partial_csum_offload(ETH + l3, 16);
        if p.segs > 1 {
            o.gso_size = p.seg as u16;
            o.gso_kind = if dst.is_ipv4() {
                GsoKind::TcpV4
            } else {
                GsoKind::TcpV6
            };
            o.hdr_len = (ETH + l3 + hl) as u16;
            self.counters.tcp_tx_segments += p.segs as u64 - 1;
        }
        self.pool.set_offload(&p.buf, o);
        self.finish_tcp_tx(p.buf, dst, p.next_hop);
    }

    fn finish_tcp_tx(&mut self, buf: PktBuf, dst: IpAddr, next_hop: IpAddr) {
        if dst.is_ipv4() {
            self.counters.ip4_tx += 1;
        } else {
            self.counters.ip6_tx += 1;
        }
        self.counters.tcp_tx_segments += 1;
        self.dispatch(buf, next_hop);
    }

    /// Puts a finished frame on its way: to our own input queue, to the transmit
    /// queue with the next hop's MAC, or into the neighbour's waiting queue.
    pub(crate) fn dispatch(&mut self, buf: PktBuf, next_hop: IpAddr) {
        if self.is_local_addr(next_hop) {
            let mac = self.cfg.mac;
            self.pool.data_mut(&buf)[..6].copy_from_slice(&mac.0);
            self.receive(buf);
            return;
        }
        let subnet_bcast = matches!(next_hop, IpAddr::V4(a) if self.addrs.iter().any(|c| c.broadcast_v4() == Some(a)));
        let mac = if subnet_bcast {
            Some(MacAddr::BROADCAST)
        } else {
            multicast_mac(next_hop)
        };
        if let Some(mac) = mac {
            self.pool.data_mut(&buf)[..6].copy_from_slice(&mac.0);
            if self.mcast_loop {
                // IP_MULTICAST_LOOP: local members get the frame as if received.
                let mut copy = std::mem::take(&mut self.mcast_scratch);
                copy.clear();
                self.pool.copy_chain(&buf, &mut copy);
                match self.pool.alloc_from(&copy) {
                    Some(c) => self.receive(c),
                    None => self.counters.drop_pool_exhausted += 1,
                }
                self.mcast_scratch = copy;
            }
            self.push_tx(buf);
            return;
        }
        match self.neighbors.lookup(next_hop, self.now) {
            Lookup::Found(mac) => {
                self.pool.data_mut(&buf)[..6].copy_from_slice(&mac.0);
                self.push_tx(buf);
            }
            Lookup::FoundStale(mac) => {
                self.pool.data_mut(&buf)[..6].copy_from_slice(&mac.0);
                self.push_tx(buf);
                self.send_solicit(next_hop);
            }
            Lookup::Missing => match self.neighbors.hold(next_hop, buf, self.now) {
                Ok(true) => self.send_solicit(next_hop),
                Ok(false) => {}
                Err(HoldError::QueueFull(b)) => {
                    self.counters.neigh_queue_full += 1;
                    self.pool.free(b);
                }
                Err(HoldError::CacheFull(b)) => {
                    self.counters.neigh_cache_full += 1;
                    self.pool.free(b);
                }
            },
        }
    }

    /// Frames that waited for `mac` go out now.
    pub(crate) fn flush_pending(&mut self, pending: VecDeque<PktBuf>, mac: MacAddr) {
        for b in pending {
            self.pool.data_mut(&b)[..6].copy_from_slice(&mac.0);
            self.push_tx(b);
        }
    }

    /// Asks who has `ip`: an ARP request or an NDP neighbour solicitation.
    pub(crate) fn send_solicit(&mut self, ip: IpAddr) {
        self.counters.neigh_tx_solicit += 1;
        match ip {
            IpAddr::V4(target) => {
                let Some(IpAddr::V4(_)) = self.source_for(ip) else {
                    return;
                };
                self.send_arp(
                    ArpOp::Request,
                    target,
                    MacAddr::default(),
                    target,
                    MacAddr::BROADCAST,
                );
            }
            IpAddr::V6(target) => {
                let Some(src) = self.source_for(ip) else {
                    return;
                };
                let dst = wire::solicited_node(&target);
                let repr = Icmpv6Repr::NeighborSolicit {
                    target,
                    source_mac: Some(self.cfg.mac),
                };
                let ip = IpFields::ttl(255);
                let _ = self.send_icmp6(src, IpAddr::V6(dst), IpAddr::V6(dst), ip, &repr);
            }
        }
    }

    /// Sends an ARP packet. For a request, `target_ip_for_sender` picks our address on
    /// the target's subnet; for a reply it is the address being answered for.
    pub(crate) fn send_arp(
        &mut self,
        op: ArpOp,
        our_ip_hint: Ipv4Addr,
        target_mac: MacAddr,
        target_ip: Ipv4Addr,
        eth_dst: MacAddr,
    ) {
        let sender_ip = match op {
            ArpOp::Reply => our_ip_hint,
            _ => match self.source_for(IpAddr::V4(target_ip)) {
                Some(IpAddr::V4(a)) => a,
                _ => return,
            },
        };
        let Some(buf) = self.pool.alloc() else {
            self.counters.drop_pool_exhausted += 1;
            return;
        };
        let mac = self.cfg.mac;
        // Pad to the 60-byte Ethernet minimum, as real stacks do.
        let out = self.pool.append(&buf, 60).expect("fits");
        out.fill(0);
        let _ = wire::emit_ethernet(out, eth_dst, mac, ethertype::ARP);
        let repr = ArpRepr {
            op,
            sender_mac: mac,
            sender_ip,
            target_mac,
            target_ip,
        };
        let _ = repr.emit(&mut out[ETH..]);
        match op {
            ArpOp::Reply => self.counters.arp_tx_reply += 1,
            _ => self.counters.arp_tx_request += 1,
        }
        self.push_tx(buf);
    }

    pub(crate) fn send_neighbor_advert(
        &mut self,
        dst: Ipv6Addr,
        target: Ipv6Addr,
        solicited: bool,
    ) {
        let repr = Icmpv6Repr::NeighborAdvert {
            router: false,
            solicited,
            override_: true,
            target,
            target_mac: Some(self.cfg.mac),
        };
        if self
            .send_icmp6(
                IpAddr::V6(target),
                IpAddr::V6(dst),
                IpAddr::V6(dst),
                IpFields::ttl(255),
                &repr,
            )
            .is_ok()
        {
            self.counters.icmp6_tx_neighbor_advert += 1;
        }
    }

    fn send_icmp6(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        ip: IpFields,
        repr: &Icmpv6Repr<'_>,
    ) -> Result<(), StackError> {
        let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) else {
            return Err(StackError::InvalidInput);
        };
        let mut msg = std::mem::take(&mut self.icmp_scratch);
        msg.clear();
        msg.resize(repr.buffer_len(), 0);
        let r = match repr.emit(&s, &d, &mut msg) {
            Ok(()) => self.send_ip(src, dst, next_hop, wire::IPPROTO_ICMPV6, ip, &msg),
            Err(_) => Err(StackError::InvalidInput),
        };
        self.icmp_scratch = msg;
        r
    }

    fn send_icmp4(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        ip: IpFields,
        repr: &Icmpv4Repr<'_>,
    ) -> Result<(), StackError> {
        let mut msg = std::mem::take(&mut self.icmp_scratch);
        msg.clear();
        msg.resize(repr.buffer_len(), 0);
        let r = match repr.emit(&mut msg) {
            Ok(()) => self.send_ip(src, dst, next_hop, wire::IPPROTO_ICMP, ip, &msg),
            Err(_) => Err(StackError::InvalidInput),
        };
        self.icmp_scratch = msg;
        r
    }

    /// A raw socket's ICMP message: an IPv4 one goes as the application wrote it
    /// (checksum included, as Linux's raw sockets send it), an IPv6 one with its
    /// checksum computed over the pseudo-header (Linux computes it for every raw
    /// ICMPv6 socket, RFC 3542 §3.1).
    pub(crate) fn send_raw_icmp(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        msg: &[u8],
        ip: IpFields,
    ) -> Result<(), StackError> {
        if dst.is_ipv4() {
            self.send_ip(src, dst, next_hop, wire::IPPROTO_ICMP, ip, msg)?;
            self.counters.icmp4_tx_raw += 1;
            return Ok(());
        }
        if msg.len() < 4 {
            return Err(StackError::InvalidInput);
        }
        let mut m = std::mem::take(&mut self.icmp_scratch);
        m.clear();
        m.extend_from_slice(msg);
        m[2..4].fill(0);
        let sum = wire::pseudo(src, dst, wire::IPPROTO_ICMPV6, m.len() as u32) + wire::sum(&m);
        m[2..4].copy_from_slice(&wire::finish(sum).to_be_bytes());
        let r = self.send_ip(src, dst, next_hop, wire::IPPROTO_ICMPV6, ip, &m);
        self.icmp_scratch = m;
        r?;
        self.counters.icmp6_tx_raw += 1;
        Ok(())
    }

    /// Answers an echo request from `from` to our `to`: the reply comes from the
    /// address the request was sent to.
    pub(crate) fn send_echo_reply(
        &mut self,
        to: IpAddr,
        from: IpAddr,
        ident: u16,
        seq: u16,
        data: &[u8],
    ) -> Result<(), StackError> {
        let Some((_, next_hop)) = self.route(from) else {
            self.counters.ip_tx_no_route += 1;
            return Err(StackError::NoRoute);
        };
        let ip = IpFields::ttl(self.cfg.ttl);
        self.send_echo(to, from, next_hop, ident, seq, data, false, ip)
    }

    /// An echo socket's request, routed by the caller.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_echo_request(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        ident: u16,
        seq: u16,
        data: &[u8],
        ip: IpFields,
    ) -> Result<(), StackError> {
        self.send_echo(src, dst, next_hop, ident, seq, data, true, ip)
    }

    #[allow(clippy::too_many_arguments)]
    fn send_echo(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        next_hop: IpAddr,
        ident: u16,
        seq: u16,
        data: &[u8],
        request: bool,
        ip: IpFields,
    ) -> Result<(), StackError> {
        if dst.is_ipv4() {
            let repr = if request {
                Icmpv4Repr::EchoRequest { ident, seq, data }
            } else {
                Icmpv4Repr::EchoReply { ident, seq, data }
            };
            self.send_icmp4(src, dst, next_hop, ip, &repr)?;
            if request {
                self.counters.icmp4_tx_echo_request += 1;
            } else {
                self.counters.icmp4_tx_echo_reply += 1;
            }
        } else {
            let repr = if request {
                Icmpv6Repr::EchoRequest { ident, seq, data }
            } else {
                Icmpv6Repr::EchoReply { ident, seq, data }
            };
            self.send_icmp6(src, dst, next_hop, ip, &repr)?;
            if request {
                self.counters.icmp6_tx_echo_request += 1;
            } else {
                self.counters.icmp6_tx_echo_reply += 1;
            }
        }
        Ok(())
    }

    /// Token bucket for ICMP errors, refilled once per second of stack time.
    fn icmp_error_allowed(&mut self) -> bool {
        if self.now.saturating_since(self.icmp_refill).as_secs() >= 1 {
            self.icmp_refill = self.now;
            self.icmp_tokens = self.cfg.icmp_error_rate;
        }
        if self.icmp_tokens == 0 {
            self.counters.icmp_tx_rate_limited += 1;
            return false;
        }
        self.icmp_tokens -= 1;
        true
    }

    fn error_target_ok(to: IpAddr) -> bool {
        match to {
            IpAddr::V4(a) => !(a.is_unspecified() || a.is_broadcast() || a.is_multicast()),
            IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
        }
    }

    /// Port or protocol unreachable back to `to`, quoting `invoking`.
    pub(crate) fn send_unreachable(
        &mut self,
        why: Unreach,
        our_addr: IpAddr,
        to: IpAddr,
        invoking: &[u8],
    ) {
        if !Self::error_target_ok(to) || !self.icmp_error_allowed() {
            return;
        }
        let Some((_, next_hop)) = self.route(to) else {
            return;
        };
        if to.is_ipv4() {
            let code = match why {
                Unreach::Port => wire::unreach::PORT,
                Unreach::Protocol => wire::unreach::PROTO,
            };
            let repr = Icmpv4Repr::DstUnreachable { code, invoking };
            if self
                .send_icmp4(our_addr, to, next_hop, IpFields::ttl(self.cfg.ttl), &repr)
                .is_ok()
            {
                self.counters.icmp4_tx_unreachable += 1;
            }
        } else if why == Unreach::Port {
            // RFC 4443: code 4 = port unreachable.
            let repr = Icmpv6Repr::DstUnreachable {
                code: wire::unreach_v6::PORT,
                invoking,
            };
            let ip = IpFields::ttl(self.cfg.ttl);
            if self.send_icmp6(our_addr, to, next_hop, ip, &repr).is_ok() {
                self.counters.icmp6_tx_unreachable += 1;
            }
        }
    }

    /// A frame that waited for a neighbour that never answered. As Linux's
    /// `ipv4_link_failure` and `ip6_link_failure` do, a host (IPv6: address)
    /// unreachable quoting the packet goes to ourselves, where the receive path
    /// hands it to the socket that sent the packet: a connection attempt fails
    /// with EHOSTUNREACH after the last probe instead of after its SYN
    /// retries, ping says "Destination Host Unreachable", a UDP socket with
    /// `IP_RECVERR` finds it on its error queue. Not for an ICMP error or a
    /// later fragment (no error about those, RFC 1122 §3.2.2), nor when the
    /// packet's source is not ours.
    pub(crate) fn report_unresolved(&mut self, frame: PktBuf) {
        let mut data = Vec::new();
        self.pool.copy_chain(&frame, &mut data);
        self.pool.free(frame);
        let Some(l3) = data.get(ETH..) else {
            return;
        };
        // As much of the packet as an error may quote (RFC 1812 §4.3.2.3: 576
        // bytes in all; RFC 4443 §2.4: 1280).
        let quote = |total: usize, max: usize| &l3[..total.min(l3.len()).min(max)];
        match u16::from_be_bytes([data[12], data[13]]) {
            ethertype::IPV4 if l3.len() >= 20 => {
                let src = IpAddr::V4(Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]));
                let ihl = usize::from(l3[0] & 0x0f) * 4;
                let later_fragment = u16::from_be_bytes([l3[6], l3[7]]) & 0x1fff != 0;
                let icmp_error = l3[9] == wire::IPPROTO_ICMP
                    && l3
                        .get(ihl)
                        .is_some_and(|&t| matches!(t, 3 | 4 | 5 | 11 | 12));
                if later_fragment || icmp_error || !self.is_local_addr(src) {
                    return;
                }
                let total = usize::from(u16::from_be_bytes([l3[2], l3[3]]));
                let repr = Icmpv4Repr::DstUnreachable {
                    code: wire::unreach::HOST,
                    invoking: quote(total, 576 - 20 - 8),
                };
                let ip = IpFields::ttl(self.cfg.ttl);
                if self.send_icmp4(src, src, src, ip, &repr).is_ok() {
                    self.counters.neigh_unreachable_reported += 1;
                }
            }
            ethertype::IPV6 if l3.len() >= 40 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&l3[8..24]);
                let src = IpAddr::V6(Ipv6Addr::from(a));
                // The next header right after the fixed one (an ICMPv6 error is
                // never sent behind extension headers here).
                let icmp_error =
                    l3[6] == wire::IPPROTO_ICMPV6 && l3[40..].first().is_some_and(|&t| t < 128);
                if icmp_error || !self.is_local_addr(src) {
                    return;
                }
                let total = 40 + usize::from(u16::from_be_bytes([l3[4], l3[5]]));
                let repr = Icmpv6Repr::DstUnreachable {
                    code: wire::unreach_v6::ADDR,
                    invoking: quote(total, 1280 - 40 - 8),
                };
                let ip = IpFields::ttl(self.cfg.ttl);
                if self.send_icmp6(src, src, src, ip, &repr).is_ok() {
                    self.counters.neigh_unreachable_reported += 1;
                }
            }
            _ => {}
        }
    }

    /// Abandons timed-out reassemblies; sends "fragment reassembly time exceeded" when
    /// the first fragment had arrived (RFC 792 / RFC 8200).
    pub(crate) fn expire_reassembly(&mut self) -> bool {
        let mut expired: Vec<Expired> = Vec::new();
        self.reasm4.poll(self.now, &mut expired);
        self.reasm6.poll(self.now, &mut expired);
        let did = !expired.is_empty();
        for e in expired {
            let (ours, to) = match e.key {
                FragKey::V4 { src, dst, .. } => {
                    self.counters.ip4_reasm_timeout += 1;
                    (IpAddr::V4(dst), IpAddr::V4(src))
                }
                FragKey::V6 { src, dst, .. } => {
                    self.counters.ip6_reasm_timeout += 1;
                    (IpAddr::V6(dst), IpAddr::V6(src))
                }
            };
            if e.invoking.is_empty()
                || !self.is_local_addr(ours)
                || !Self::error_target_ok(to)
                || !self.icmp_error_allowed()
            {
                continue;
            }
            let Some((_, next_hop)) = self.route(to) else {
                continue;
            };
            if to.is_ipv4() {
                let repr = Icmpv4Repr::TimeExceeded {
                    code: 1,
                    invoking: &e.invoking,
                };
                if self
                    .send_icmp4(ours, to, next_hop, IpFields::ttl(self.cfg.ttl), &repr)
                    .is_ok()
                {
                    self.counters.icmp4_tx_time_exceeded += 1;
                }
            } else {
                let repr = Icmpv6Repr::TimeExceeded {
                    code: 1,
                    invoking: &e.invoking,
                };
                let ip = IpFields::ttl(self.cfg.ttl);
                if self.send_icmp6(ours, to, next_hop, ip, &repr).is_ok() {
                    self.counters.icmp6_tx_time_exceeded += 1;
                }
            }
        }
        did
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's pieces are cut a segment's worth at a time: `segments_within`
    /// counts every span a segment touches against the fragment room (a span that
    /// several segments share counts once), and `attach` carries exactly the next
    /// bytes, spans that continue one another merging into one fragment.
    #[test]
    fn a_span_cut_takes_whole_segments_within_the_fragment_room() {
        let mut pool = PacketPool::new(&usnet_pool::PoolConfig {
            count: 8,
            ..Default::default()
        })
        .unwrap();
        let bufs: Vec<PktBuf> = (0..3).map(|_| pool.alloc().unwrap()).collect();
        let span = |b: &PktBuf, off, len| usnet_tcp::BufSpan {
            buf: b.index(),
            off,
            len,
        };
        // Segments of 100 bytes: 0..100 and 100..200 in the first span, 200..300
        // across the first and the second, 300..400 across the second and third.
        let spans = [
            span(&bufs[0], 0, 250),
            span(&bufs[1], 10, 100),
            span(&bufs[2], 0, 50),
        ];
        let mut cut = SpanCut::new(&spans);
        assert_eq!(cut.segments_within(100, 9, 48), 4, "as far as the spans go");
        assert_eq!(cut.segments_within(100, 2, 1), 2, "one span holds two");
        assert_eq!(
            cut.segments_within(100, 4, 1),
            2,
            "the third needs a second"
        );
        assert_eq!(cut.segments_within(100, 4, 2), 3);
        assert_eq!(cut.segments_within(100, 4, 0), 0);
        let head = pool.alloc().unwrap();
        cut.attach(&mut pool, head.id(), 100);
        cut.attach(&mut pool, head.id(), 200);
        let f = pool.frags(head.id()).to_vec();
        assert_eq!(f.len(), 2, "continuing bytes extend the fragment");
        assert_eq!((f[0].buf, f[0].off, f[0].len), (bufs[0].index(), 0, 250));
        assert_eq!((f[1].buf, f[1].off, f[1].len), (bufs[1].index(), 10, 50));
        // From the middle of a span: its rest counts as one more.
        assert_eq!(cut.segments_within(100, 4, 1), 0, "50 + 50 spans two");
        assert_eq!(cut.segments_within(100, 4, 2), 1);
        cut.attach(&mut pool, head.id(), 100);
        assert_eq!((cut.at, cut.off), (3, 0), "all of it taken");
        assert_eq!(cut.segments_within(100, 4, 48), 0);
        pool.free(head);
        for b in bufs {
            pool.free(b);
        }
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn the_tos_byte_goes_whole_into_either_header() {
        // IPv4: the TOS byte, and a header checksum that still adds up.
        let mut f = vec![0u8; ETH + 20];
        f[ETH] = 0x45;
        f[ETH + 8] = 64;
        set_ip_ecn(&mut f, 0x2c | 2);
        assert_eq!(f[ETH + 1], 0x2e);
        assert_eq!(wire::finish(wire::sum(&f[ETH..ETH + 20])), 0);
        // IPv6: the traffic class across the first two bytes, flow label kept.
        let mut f = vec![0u8; ETH + 40];
        f[ETH] = 0x60;
        f[ETH + 1] = 0x0a;
        set_ip_ecn(&mut f, 0xb8 | 2);
        let tc = (f[ETH] & 0x0f) << 4 | f[ETH + 1] >> 4;
        assert_eq!((f[ETH] >> 4, tc, f[ETH + 1] & 0x0f), (6, 0xba, 0x0a));
    }
}
