//! Helpers for tests and tools: a sink that keeps owned copies of segments, and the
//! conversion back into a [`Segment`] (optionally through the real wire encoding).

use std::net::SocketAddr;

use usnet_wire::{parse_tcp, verify_tcp_checksum, TcpRepr};

use std::cell::RefCell;
use std::rc::Rc;

use crate::conn::{Segment, SegmentSink};
use crate::payload::{Origin, Payload};
use crate::sg::{BufOp, BufSpan, TxData};

/// A segment with its own payload copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedSegment {
    /// Sender address.
    pub local: SocketAddr,
    /// Receiver address.
    pub remote: SocketAddr,
    /// Header.
    pub repr: TcpRepr,
    /// Payload.
    pub payload: Vec<u8>,
    /// Sent ECT(0) (what the engine asked for).
    pub ect: bool,
    /// Arrives CE-marked (set by a test to play a congested router).
    pub ce: bool,
}

impl OwnedSegment {
    /// View as an input segment.
    pub fn segment(&self) -> Segment<'_> {
        Segment {
            seq: self.repr.seq,
            ack: self.repr.ack,
            flags: self.repr.flags,
            window: self.repr.window,
            urgent: self.repr.urgent,
            options: self.repr.options,
            payload: Payload::new(&self.payload),
            gso_size: 0,
            ce: self.ce,
        }
    }

    /// Encode with a checksum, as the stack would put it on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let hl = self.repr.header_len();
        let mut buf = vec![0u8; hl + self.payload.len()];
        buf[hl..].copy_from_slice(&self.payload);
        // Cannot fail: the buffer is exactly header + payload.
        let _ = self.repr.emit(
            &mut buf,
            self.local.ip(),
            self.remote.ip(),
            self.payload.len(),
            true,
        );
        buf
    }

    /// Decode bytes from the wire (checksum verified); None if they do not parse.
    pub fn from_bytes(local: SocketAddr, remote: SocketAddr, bytes: &[u8]) -> Option<Self> {
        if !verify_tcp_checksum(local.ip(), remote.ip(), bytes) {
            return None;
        }
        let h = parse_tcp(bytes).ok()?;
        Some(OwnedSegment {
            local,
            remote,
            repr: h.repr(),
            payload: h.payload.to_vec(),
            ect: false,
            ce: false,
        })
    }
}

/// A sink that collects segments. `refuse` makes it reject (buffer exhaustion).
#[derive(Debug, Default)]
pub struct VecSink {
    /// Collected segments, oldest first.
    pub segments: Vec<OwnedSegment>,
    /// Refuse every segment.
    pub refuse: bool,
    /// Where a zero-copy connection's pieces are read from.
    pub pool: Option<Rc<RefCell<FakePool>>>,
}

/// A stand-in for the stack's packet pool in engine tests of zero-copy connections:
/// buffers with reference counts that check every retain and release.
#[derive(Debug, Default)]
pub struct FakePool {
    bufs: Vec<(Vec<u8>, u32)>,
    free: Vec<u32>,
}

/// Headroom the fake pool leaves in front of the bytes of a buffer.
pub const FAKE_HEADROOM: u32 = 64;

impl FakePool {
    /// A buffer holding `bytes` after [`FAKE_HEADROOM`], with one reference (the
    /// caller's); returns the piece that names the bytes.
    pub fn alloc(&mut self, bytes: &[u8]) -> BufSpan {
        let mut data = vec![0u8; FAKE_HEADROOM as usize];
        data.extend_from_slice(bytes);
        let buf = match self.free.pop() {
            Some(i) => {
                self.bufs[i as usize] = (data, 1);
                i
            }
            None => {
                self.bufs.push((data, 1));
                (self.bufs.len() - 1) as u32
            }
        };
        BufSpan {
            buf,
            off: FAKE_HEADROOM,
            len: bytes.len() as u32,
        }
    }

    /// The bytes a piece names. Panics on a freed buffer (a use after free).
    pub fn bytes(&self, s: BufSpan) -> &[u8] {
        let (data, refs) = &self.bufs[s.buf as usize];
        assert!(*refs > 0, "read of freed buffer {}", s.buf);
        &data[s.off as usize..(s.off + s.len) as usize]
    }

    /// Applies an engine's reference change. Panics on a retain of a free buffer or
    /// a release of one (a double free).
    pub fn apply(&mut self, op: BufOp) {
        match op {
            BufOp::Retain(b) => {
                let r = &mut self.bufs[b as usize].1;
                assert!(*r > 0, "retain of free buffer {b}");
                *r += 1;
            }
            BufOp::Release(b) => self.release(b),
        }
    }

    /// Drops one reference.
    pub fn release(&mut self, b: u32) {
        let r = &mut self.bufs[b as usize].1;
        assert!(*r > 0, "double free of buffer {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    /// Buffers with at least one reference.
    pub fn in_use(&self) -> usize {
        self.bufs.len() - self.free.len()
    }

    /// Where a piece lies, as a payload part's origin.
    pub fn origin(s: BufSpan) -> Origin {
        Origin {
            buf: s.buf,
            off: s.off,
        }
    }
}

impl SegmentSink for VecSink {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: TxData<'_>,
        ect: bool,
    ) -> bool {
        if self.refuse {
            return false;
        }
        let mut p = Vec::with_capacity(payload.len());
        match payload {
            TxData::Bytes(a, b) => {
                p.extend_from_slice(a);
                p.extend_from_slice(b);
            }
            TxData::Bufs { spans, .. } => match &self.pool {
                Some(pool) => {
                    let pool = pool.borrow();
                    for s in spans {
                        p.extend_from_slice(pool.bytes(*s));
                    }
                }
                None => panic!("VecSink got pool buffers but has no FakePool"),
            },
        }
        self.segments.push(OwnedSegment {
            local,
            remote,
            repr: *repr,
            payload: p,
            ect,
            ce: false,
        });
        true
    }
}
