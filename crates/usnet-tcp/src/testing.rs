//! Helpers for tests and tools: a sink that keeps owned copies of segments, and the
//! conversion back into a [`Segment`] (optionally through the real wire encoding).

use std::net::SocketAddr;

use usnet_wire::{parse_tcp, verify_tcp_checksum, TcpRepr};

use crate::conn::{Segment, SegmentSink};
use crate::payload::Payload;

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
}

impl SegmentSink for VecSink {
    fn emit(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        repr: &TcpRepr,
        payload: (&[u8], &[u8]),
        ect: bool,
    ) -> bool {
        if self.refuse {
            return false;
        }
        let mut p = Vec::with_capacity(payload.0.len() + payload.1.len());
        p.extend_from_slice(payload.0);
        p.extend_from_slice(payload.1);
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
