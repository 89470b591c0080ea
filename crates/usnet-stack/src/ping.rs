//! The application's ICMP echo calls on a [`Stack`] (what `ping` needs).

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::socket::{EchoReply, Owner, PingSocket, Socket, SocketHandle, SocketStats};
use crate::{Stack, StackError, MAX_UDP_PAYLOAD};

impl Stack {
    /// Opens an ICMP echo socket with its own identifier (both IPv4 and IPv6).
    pub fn ping_open(&mut self) -> SocketHandle {
        let mut ident = self.sockets.next_ping_ident;
        let shard = self.core.cfg.shard;
        while self.sockets.ping_by_ident(ident).is_some() || !shard.owns_ephemeral(ident) {
            ident = ident.wrapping_add(1);
        }
        self.sockets.next_ping_ident = ident.wrapping_add(1);
        self.sockets.insert(
            Socket::Ping(PingSocket {
                ident,
                rxq: VecDeque::new(),
                stats: SocketStats::default(),
            }),
            Owner::LOCAL,
        )
    }

    pub fn ping_ident(&self, h: SocketHandle) -> Result<u16, StackError> {
        match self.sockets.get(h).ok_or(StackError::InvalidHandle)? {
            Socket::Ping(p) => Ok(p.ident),
            _ => Err(StackError::WrongType),
        }
    }

    /// Sends an echo request with this socket's identifier.
    pub fn ping_send(
        &mut self,
        h: SocketHandle,
        dst: IpAddr,
        seq: u16,
        data: &[u8],
    ) -> Result<(), StackError> {
        let ident = self.ping_ident(h)?;
        if data.len() > MAX_UDP_PAYLOAD {
            return Err(StackError::MessageTooLong);
        }
        self.core.send_echo(dst, ident, seq, data, true)?;
        if let Some(Socket::Ping(p)) = self.sockets.get_mut(h) {
            p.stats.tx_datagrams += 1;
            p.stats.tx_bytes += data.len() as u64;
        }
        Ok(())
    }

    pub fn ping_recv(&mut self, h: SocketHandle) -> Result<EchoReply, StackError> {
        match self.sockets.get_mut(h).ok_or(StackError::InvalidHandle)? {
            Socket::Ping(p) => p.rxq.pop_front().ok_or(StackError::WouldBlock),
            _ => Err(StackError::WrongType),
        }
    }
}
