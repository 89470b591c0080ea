//! Receive coalescing (GRO). While one `poll` drains the input queue, consecutive
//! in-order data segments of one connection that takes data (ESTABLISHED, or
//! FIN-WAIT-1/2: the peer may send after our FIN) are held back, then handed to
//! the engine as one segment: its payload is the list of the frames' payloads, read in
//! place from the pool buffers (no copy besides the engine's own into its receive
//! ring), and `gso_size` is the first segment's payload length, so the engine keeps
//! the peer's real MSS (it ACKs each coalesced frame at once, as Linux does) and
//! counts wire segments. Its ACKs are stretch ACKs; the sender's slow start credits
//! them in full (`usnet_tcp::cc`), or GRO would slow a usnet peer down.
//!
//! A segment joins the held ones only when it is safe, with the rules of Linux's
//! `tcp_gro_receive`:
//! - same connection (4-tuple), and its sequence number continues the held data;
//! - ACK set and no other flag but PSH (no SYN/FIN/RST/URG/ECE/CWR, no reserved bits);
//! - the same ACK number, window, header length and option bytes. Timestamps are
//!   compared too (as Linux does): TSval ticks once per millisecond, so a burst shares
//!   it, and a merged segment then means exactly what its parts meant (PAWS,
//!   TS.Recent, RTT samples);
//! - every segment but the last as long as the first; a shorter one or a PSH ends
//!   the batch; at most 64 KiB of payload and [`MAX_SEGS`] segments.
//!
//! Checksums were verified per frame by `classify` (or trusted from the device's
//! offload flag). Anything else first delivers the held segments, then goes its usual
//! way, so the engine sees everything in arrival order. A frame the device already
//! coalesced (offload `gso_size`) or a chained one is never held.

use std::net::SocketAddr;

use usnet_pool::PktBuf;
use usnet_tcp::{Payload, Segment, State, TcpFlags};
use usnet_wire as wire;

use crate::types::{Src, TcpTarget, Verdict};
use crate::Stack;

/// Most payload bytes in one coalesced segment.
const MAX_BYTES: usize = 65535;
/// Most wire segments in one coalesced segment (bounds the slice list on the stack).
const MAX_SEGS: usize = 64;

const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// What [`inspect`] reads from a TCP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegInfo {
    pub seq: u32,
    pub ack: u32,
    /// Header length byte, flags without PSH, window: must match the batch's.
    pub word: [u8; 4],
    pub psh: bool,
    pub hdr_len: usize,
    pub payload_len: usize,
}

/// Reads just enough of a TCP segment (header and payload, checksum already checked)
/// to decide whether it may be coalesced; `None` means "deliver it as it is".
pub(crate) fn inspect(l4: &[u8]) -> Option<SegInfo> {
    if l4.len() < wire::TCP_HEADER_LEN {
        return None;
    }
    let hdr_len = usize::from(l4[12] >> 4) * 4;
    let flags = l4[13];
    if hdr_len < wire::TCP_HEADER_LEN
        || hdr_len >= l4.len()
        || l4[12] & 0x0f != 0
        || flags & !(ACK | PSH) != 0
        || flags & ACK == 0
    {
        return None;
    }
    Some(SegInfo {
        seq: u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]),
        ack: u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]),
        word: [l4[12], flags & !PSH, l4[14], l4[15]],
        psh: flags & PSH != 0,
        hdr_len,
        payload_len: l4.len() - hdr_len,
    })
}

/// A held frame: its buffer and where its TCP segment lies in it.
#[derive(Debug)]
struct Held {
    buf: PktBuf,
    l4_off: usize,
    l4_len: usize,
    hdr_len: usize,
}

/// The batch being built.
#[derive(Debug, Clone, Copy)]
struct Head {
    conn: u32,
    local: SocketAddr,
    remote: SocketAddr,
    next_seq: u32,
    ack: u32,
    word: [u8; 4],
    /// The first segment's option bytes (the header length fixes how many).
    opts: [u8; 40],
    seg_size: usize,
    bytes: usize,
    /// The last segment carried PSH.
    psh: bool,
}

/// The coalescing state of a stack: empty between polls.
#[derive(Debug, Default)]
pub(crate) struct Gro {
    head: Option<Head>,
    /// Kept between batches for its capacity.
    held: Vec<Held>,
}

/// What happened to a frame offered to GRO.
enum Offer {
    /// Held (or merged and delivered).
    Taken,
    /// Not for GRO: execute it (the buffer comes back).
    Refused(PktBuf),
}

impl Stack {
    /// Takes a single-buffer frame and its verdict. Returns both when the frame is to
    /// be executed now (after any held segments were delivered), or `None` when GRO
    /// kept the frame.
    pub(crate) fn gro_offer(&mut self, v: Verdict, buf: PktBuf) -> Option<(Verdict, PktBuf)> {
        let mut v = v;
        let mut buf = buf;
        if self.gro.head.is_some() {
            match self.gro_join(&v, buf) {
                Offer::Taken => return None,
                Offer::Refused(b) => buf = b,
            }
            v = self.gro_flush_then(v);
        }
        match self.gro_start(&v, buf) {
            Offer::Taken => None,
            Offer::Refused(b) => Some((v, b)),
        }
    }

    /// Delivers the held segments, if any, and returns `v` with its TCP demux redone
    /// when that happened (the delivery may have closed the connection it found).
    pub(crate) fn gro_flush_then(&mut self, v: Verdict) -> Verdict {
        if !self.gro_flush() {
            return v;
        }
        match v {
            Verdict::Tcp {
                local,
                remote,
                off,
                len,
                ce,
                ..
            } => Verdict::Tcp {
                target: self.sockets.tcp_lookup(local, remote),
                local,
                remote,
                off,
                len,
                ce,
            },
            v => v,
        }
    }

    /// The frame's TCP segment and header facts, if it is a data segment for
    /// connection `i` that GRO may hold.
    fn gro_candidate(&self, v: &Verdict, buf: &PktBuf) -> Option<(u32, SegInfo)> {
        let Verdict::Tcp {
            target: TcpTarget::Conn(i),
            off,
            len,
            ce,
            ..
        } = *v
        else {
            return None;
        };
        // A CE mark is the engine's to see on its own segment (RFC 3168 §6.1.3).
        if ce || self.core.pool.offload(buf).gso_size != 0 {
            return None;
        }
        let data = self.core.pool.data(buf);
        inspect(data.get(off..off + len)?).map(|info| (i, info))
    }

    /// Starts a batch with this frame if it may be held.
    fn gro_start(&mut self, v: &Verdict, buf: PktBuf) -> Offer {
        let Some((i, info)) = self.gro_candidate(v, &buf) else {
            return Offer::Refused(buf);
        };
        let Verdict::Tcp {
            local, remote, off, ..
        } = *v
        else {
            return Offer::Refused(buf);
        };
        // A PSH segment alone gains nothing from waiting.
        if info.psh {
            return Offer::Refused(buf);
        }
        // The states that take data (the peer may still send after our FIN).
        let takes_data = self.sockets.conn_at(i).is_some_and(|s| {
            matches!(
                s.conn.state(),
                State::Established | State::FinWait1 | State::FinWait2
            )
        });
        if !takes_data {
            return Offer::Refused(buf);
        }
        let mut opts = [0u8; 40];
        let ol = info.hdr_len - wire::TCP_HEADER_LEN;
        let data = self.core.pool.data(&buf);
        opts[..ol].copy_from_slice(&data[off + wire::TCP_HEADER_LEN..off + info.hdr_len]);
        self.gro.head = Some(Head {
            conn: i,
            local,
            remote,
            next_seq: info.seq.wrapping_add(info.payload_len as u32),
            ack: info.ack,
            word: info.word,
            opts,
            seg_size: info.payload_len,
            bytes: info.payload_len,
            psh: false,
        });
        self.gro.held.push(Held {
            buf,
            l4_off: off,
            l4_len: info.hdr_len + info.payload_len,
            hdr_len: info.hdr_len,
        });
        Offer::Taken
    }

    /// Adds this frame to the batch if it continues it.
    fn gro_join(&mut self, v: &Verdict, buf: PktBuf) -> Offer {
        let (Some(head), Some((i, info))) = (self.gro.head, self.gro_candidate(v, &buf)) else {
            return Offer::Refused(buf);
        };
        let Verdict::Tcp { off, .. } = *v else {
            return Offer::Refused(buf);
        };
        let ol = info.hdr_len - wire::TCP_HEADER_LEN;
        let same = i == head.conn
            && info.seq == head.next_seq
            && info.ack == head.ack
            && info.word == head.word
            && info.payload_len <= head.seg_size
            && head.bytes + info.payload_len <= MAX_BYTES
            && self.gro.held.len() < MAX_SEGS
            && self.core.pool.data(&buf)[off + wire::TCP_HEADER_LEN..off + info.hdr_len]
                == head.opts[..ol];
        if !same {
            return Offer::Refused(buf);
        }
        self.gro.held.push(Held {
            buf,
            l4_off: off,
            l4_len: info.hdr_len + info.payload_len,
            hdr_len: info.hdr_len,
        });
        let bytes = head.bytes + info.payload_len;
        let full = self.gro.held.len() == MAX_SEGS || bytes + head.seg_size > MAX_BYTES;
        self.gro.head = Some(Head {
            next_seq: info.seq.wrapping_add(info.payload_len as u32),
            bytes,
            psh: info.psh,
            ..head
        });
        if info.psh || info.payload_len < head.seg_size || full {
            // Nothing can follow this one.
            self.gro_flush();
        }
        Offer::Taken
    }

    /// Delivers the held segments: a lone one as it is, several as one coalesced
    /// segment. Returns whether anything was held.
    pub(crate) fn gro_flush(&mut self) -> bool {
        let Some(head) = self.gro.head.take() else {
            return false;
        };
        let mut held = std::mem::take(&mut self.gro.held);
        if held.len() == 1 {
            let h = held.pop().expect("one held");
            self.gro.held = held;
            self.tcp_input(
                TcpTarget::Conn(head.conn),
                head.local,
                head.remote,
                h.l4_off,
                h.l4_len,
                Src::Buf(h.buf),
                false,
            );
            return true;
        }
        if !self.gro_deliver(&head, &mut held) {
            // Doubtful (the header does not parse): each frame goes its usual way.
            for h in held.drain(..) {
                let target = self.sockets.tcp_lookup(head.local, head.remote);
                self.tcp_input(
                    target,
                    head.local,
                    head.remote,
                    h.l4_off,
                    h.l4_len,
                    Src::Buf(h.buf),
                    false,
                );
            }
        }
        held.clear();
        if self.gro.held.capacity() < held.capacity() {
            self.gro.held = held;
        }
        true
    }

    /// Hands several held segments to their connection as one; frees their buffers
    /// (leaving `held` empty). False (nothing done, buffers kept) if the first header
    /// does not parse.
    fn gro_deliver(&mut self, head: &Head, held: &mut Vec<Held>) -> bool {
        let i = head.conn;
        let now = self.core.tcp_now();
        let Some(s) = self.sockets.conn_at_mut(i) else {
            return false;
        };
        let wake = {
            let pool = &self.core.pool;
            let mut parts: [&[u8]; MAX_SEGS] = [&[]; MAX_SEGS];
            let mut origins = [usnet_tcp::Origin::default(); MAX_SEGS];
            for ((p, o), h) in parts.iter_mut().zip(origins.iter_mut()).zip(held.iter()) {
                *p = &pool.data(&h.buf)[h.l4_off + h.hdr_len..h.l4_off + h.l4_len];
                *o = crate::tcp::zc::origin_in(pool, &h.buf, p);
            }
            let first = &held[0];
            match wire::parse_tcp(&pool.data(&first.buf)[first.l4_off..first.l4_off + first.l4_len])
            {
                Ok(hdr) => {
                    let mut seg = Segment::from(&hdr);
                    seg.payload =
                        Payload::chain_with_origins(&parts[..held.len()], &origins[..held.len()]);
                    seg.gso_size = head.seg_size as u16;
                    if head.psh {
                        seg.flags |= TcpFlags::PSH;
                    }
                    s.conn.input(now, &seg)
                }
                Err(_) => return false,
            }
        };
        crate::tcp::zc::settle_bufs(&mut self.core.pool, &mut s.conn);
        let n = held.len();
        for h in held.drain(..) {
            self.core.pool.free(h.buf);
        }
        self.core.counters.tcp_gro_frames += 1;
        self.core.counters.tcp_gro_merged += n as u64 - 1;
        self.tcp_settle(i, wake);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use usnet_wire::{TcpOptions, TcpRepr};

    fn seg(flags: TcpFlags, options: TcpOptions, payload: usize) -> Vec<u8> {
        let repr = TcpRepr {
            src_port: 1000,
            dst_port: 80,
            seq: 0x1234_5678,
            ack: 0x9abc_def0,
            flags,
            window: 512,
            urgent: 0,
            options,
        };
        let hl = repr.header_len();
        let mut b = vec![7u8; hl + payload];
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        repr.emit(&mut b, a, a, payload, true).unwrap();
        b
    }

    #[test]
    fn inspect_takes_plain_data_segments() {
        let ts = TcpOptions {
            timestamps: Some((5, 6)),
            ..TcpOptions::default()
        };
        let s = seg(TcpFlags::ACK, ts, 100);
        let i = inspect(&s).unwrap();
        assert_eq!(
            (i.seq, i.ack, i.hdr_len, i.payload_len, i.psh),
            (0x1234_5678, 0x9abc_def0, 32, 100, false)
        );
        let p = inspect(&seg(TcpFlags::ACK | TcpFlags::PSH, ts, 100)).unwrap();
        assert!(p.psh);
        // PSH does not take part in the comparison.
        assert_eq!(p.word, i.word);
    }

    #[test]
    fn inspect_refuses_control_flags_and_empty_segments() {
        let o = TcpOptions::default();
        for f in [
            TcpFlags::SYN | TcpFlags::ACK,
            TcpFlags::FIN | TcpFlags::ACK,
            TcpFlags::RST | TcpFlags::ACK,
            TcpFlags::URG | TcpFlags::ACK,
            TcpFlags::ECE | TcpFlags::ACK,
            TcpFlags::CWR | TcpFlags::ACK,
            TcpFlags::PSH,
            TcpFlags(0),
        ] {
            assert!(inspect(&seg(f, o, 10)).is_none(), "{f:?}");
        }
        // A pure ACK is never merged.
        assert!(inspect(&seg(TcpFlags::ACK, o, 0)).is_none());
        // NS / reserved bits.
        let mut s = seg(TcpFlags::ACK, o, 10);
        s[12] |= 1;
        assert!(inspect(&s).is_none());
        // Header length beyond the bytes, or too short.
        let mut s = seg(TcpFlags::ACK, o, 10);
        s[12] = 0xf0;
        assert!(inspect(&s).is_none());
        s[12] = 0x40;
        assert!(inspect(&s).is_none());
        assert!(inspect(&s[..19]).is_none());
    }
}
