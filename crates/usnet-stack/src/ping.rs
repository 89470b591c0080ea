//! The application's ICMP echo calls on a [`Stack`] (what `ping` needs): a
//! datagram socket of [`DgramProto::Icmp`] ([`Stack::dgram_bind`]) with the echo
//! message taken apart and put together here.

use std::net::{IpAddr, SocketAddr};

use crate::socket::{DgramProto, Families, SocketHandle};
use crate::{Stack, StackError, UdpSendMeta};

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
    /// Stack time when the reply was taken off the socket.
    pub at: crate::Instant,
}

pub(crate) use usnet_socket_api::echo::HEADER as ECHO_HEADER;
use usnet_socket_api::echo::{REQUEST_V4, REQUEST_V6};

impl Stack {
    /// Opens an ICMP echo socket with its own identifier (both IPv4 and IPv6).
    pub fn ping_open(&mut self) -> SocketHandle {
        let any = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0);
        self.dgram_bind(DgramProto::Icmp, any, Families::Both, false)
            .expect("an identifier is free")
    }

    pub fn ping_ident(&self, h: SocketHandle) -> Result<u16, StackError> {
        Ok(self.udp_local_addr(h)?.port())
    }

    /// Sends an echo request with this socket's identifier.
    pub fn ping_send(
        &mut self,
        h: SocketHandle,
        dst: IpAddr,
        seq: u16,
        data: &[u8],
    ) -> Result<(), StackError> {
        let mut msg = Vec::with_capacity(ECHO_HEADER + data.len());
        let kind = if dst.is_ipv4() {
            REQUEST_V4
        } else {
            REQUEST_V6
        };
        msg.extend_from_slice(&[kind, 0, 0, 0, 0, 0]);
        msg.extend_from_slice(&seq.to_be_bytes());
        msg.extend_from_slice(data);
        let to = SocketAddr::new(dst, 0);
        self.udp_send_msg(h, &msg, Some(to), &UdpSendMeta::default())?;
        Ok(())
    }

    pub fn ping_recv(&mut self, h: SocketHandle) -> Result<EchoReply, StackError> {
        let mut msg = [0u8; ECHO_HEADER + 16];
        let mut copied = 0;
        let (n, info) = self.udp_recv_with(h, |part| {
            let k = part.len().min(msg.len() - copied);
            msg[copied..copied + k].copy_from_slice(&part[..k]);
            copied += k;
        })?;
        let mut head = [0u8; 16];
        head[..copied.saturating_sub(ECHO_HEADER)].copy_from_slice(&msg[ECHO_HEADER..copied]);
        Ok(EchoReply {
            from: info.from.ip(),
            ident: u16::from_be_bytes([msg[4], msg[5]]),
            seq: u16::from_be_bytes([msg[6], msg[7]]),
            hop_limit: info.hop_limit,
            len: n.saturating_sub(ECHO_HEADER),
            head,
            at: self.core.now,
        })
    }
}
