//! ICMP echo ("ping") sockets in the table: one identifier each, replies queued.

use std::collections::VecDeque;
use std::net::IpAddr;

use super::{Socket, SocketSet, SocketStats};

/// Replies a ping socket queues before it drops (`ping_rx_queue_full`).
pub(crate) const PING_QUEUE: usize = 256;

/// An echo reply as a ping socket hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoReply {
    pub from: IpAddr,
    pub ident: u16,
    pub seq: u16,
    /// TTL (IPv4) or hop limit (IPv6) of the reply.
    pub hop_limit: u8,
    /// Echo data length.
    pub len: usize,
    /// The first bytes of the echo data (where ping tools put their send timestamp).
    pub head: [u8; 16],
    /// Stack time when the reply was processed (receive timestamp).
    pub at: crate::Instant,
}

#[derive(Debug)]
pub(crate) struct PingSocket {
    pub ident: u16,
    pub rxq: VecDeque<EchoReply>,
    pub stats: SocketStats,
}

impl SocketSet {
    pub fn ping_by_ident(&self, ident: u16) -> Option<u32> {
        self.slots
            .iter()
            .position(|s| matches!(&s.sock, Some(Socket::Ping(p)) if p.ident == ident))
            .map(|i| i as u32)
    }

    pub fn ping_at_mut(&mut self, index: u32) -> Option<&mut PingSocket> {
        match self.at_mut(index)? {
            Socket::Ping(p) => Some(p),
            _ => None,
        }
    }
}
