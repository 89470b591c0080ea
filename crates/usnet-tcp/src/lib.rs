//! usnet-tcp: a pure, deterministic TCP engine.
//!
//! - [`Connection`]: one TCB. Segments in with [`Connection::input`], out with
//!   [`Connection::poll_transmit`] into a [`SegmentSink`], timers via
//!   [`Connection::poll_at`]; `send`/`recv`/`shutdown_write`/`close`/`abort` for the
//!   application; [`Connection::info`] and [`Connection::stats`] for tools.
//! - [`Listener`]: SYN queue, accept backlog, SYN cookies.
//! - Congestion control behind [`CongestionControl`]: [`NewReno`] and [`Cubic`].
//!
//! No I/O, no clock, no `unsafe`, no allocation per segment: buffers are sized when a
//! connection is created. See `docs/tcp.md` for the design.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cc;
pub mod config;
mod conn;
pub mod hash;
mod listener;
pub mod payload;
pub mod ring;
pub mod seq;
pub mod sg;
pub mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;

pub use cc::{CcAlgorithm, CongestionControl, Cubic, NewReno};
pub use config::{Keepalive, TcpConfig};
pub use conn::{
    run_segment, sndbuf_for_option, Connection, IcmpError, IcmpOutcome, Segment, SegmentSink,
    State, TcpError, TcpInfo, Wake, CHUNK_OVERHEAD, MIN_SNDBUF,
};
pub use hash::SecretKey;
pub use listener::{ListenEvent, Listener};
pub use payload::{Origin, Payload};
pub use seq::Seq;
pub use sg::{ring_range, BufOp, BufSpan, LentBytes, RecvSink, TxData};
pub use stats::TcpStats;
pub use time::Instant;
pub use usnet_wire::{TcpFlags, TcpOptions, TcpRepr};

/// The reply a host sends to a segment for which no connection or listener exists
/// (RFC 9293 §3.10.7.1): none to an RST; `<SEQ=SEG.ACK><CTL=RST>` to an ACK;
/// otherwise `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`.
pub fn reset_for(local_port: u16, remote_port: u16, seg: &Segment) -> Option<TcpRepr> {
    if seg.flags.rst() {
        return None;
    }
    let (seq, ack, flags) = if seg.flags.ack() {
        (seg.ack, 0, TcpFlags::RST)
    } else {
        (
            0,
            seg.seq.wrapping_add(seg.seg_len()),
            TcpFlags::RST | TcpFlags::ACK,
        )
    };
    Some(TcpRepr {
        src_port: local_port,
        dst_port: remote_port,
        seq,
        ack,
        flags,
        window: 0,
        urgent: 0,
        options: TcpOptions::default(),
    })
}
