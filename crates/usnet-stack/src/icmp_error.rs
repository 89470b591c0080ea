//! ICMP errors about packets we sent. The quoted packet names the protocol: TCP's
//! are its engine's (`tcp/icmp.rs`); UDP's and echo sockets' are here, with
//! Linux's rules (`__udp4_lib_err`, `__udp6_lib_err`, `ping_err`):
//!
//! - the error is found by the quoted 4-tuple, on a connected or a bound socket;
//! - with `IP_RECVERR` / `IPV6_RECVERR` (per family) it waits on the socket's
//!   error queue, a report as `recvmsg(MSG_ERRQUEUE)` gives it, and becomes the
//!   socket's pending error (`sk_err`), whatever its kind;
//! - without, only a hard error on a connected socket becomes the pending error
//!   (a connected UDP socket's next `recv` or `send` fails with `ECONNREFUSED`
//!   after a port unreachable); the rest are ignored.
//!
//! Reading a report from the queue leaves the next one's errno pending, or none
//! (Linux's `sock_dequeue_err_skb`), so a traceroute's next probe is not failed
//! by the error it already read.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use usnet_socket_api::errno;
use usnet_wire::{self as wire, unreach, unreach_v6, QuotedPacket};

use crate::counters::Counters;
use crate::rx::View;
use crate::socket::udp::DgramProto;
use crate::types::{IcmpMsg, L3Info, Verdict};
use crate::{IpFamily, SocketHandle, Stack, StackError};

/// `ee_origin` of a report: who sent it (Linux's `SO_EE_ORIGIN_*`): the stack
/// itself (a send over the path MTU with `IP_PMTUDISC_DO`), or an ICMP message.
pub const ORIGIN_LOCAL: u8 = 1;
pub const ORIGIN_ICMP: u8 = 2;
pub const ORIGIN_ICMP6: u8 = 3;

/// What a report costs the socket's receive buffer beyond its quoted bytes (a
/// stand-in for the kernel's `truesize`).
const REPORT_OVERHEAD: usize = 256;

/// One ICMP error on a datagram socket's error queue: what Linux's
/// `recvmsg(MSG_ERRQUEUE)` reads (`struct sock_extended_err`, the offender, the
/// quoted destination as the message's name, the quoted payload as its data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcmpReport {
    /// `ee_errno`.
    pub errno: i32,
    /// `ee_origin`: [`ORIGIN_ICMP`] or [`ORIGIN_ICMP6`].
    pub origin: u8,
    /// `ee_type`, `ee_code`: the ICMP message's.
    pub icmp_type: u8,
    pub code: u8,
    /// `ee_info`: the next-hop MTU of "fragmentation needed" and "packet too
    /// big", else 0.
    pub info: u32,
    /// Who sent the ICMP message (`SO_EE_OFFENDER`; None for a local error).
    pub offender: Option<IpAddr>,
    /// The quoted packet's destination and port (an echo request's: port 0).
    pub dest: SocketAddr,
    /// The ICMP packet's own TTL or hop limit and TOS (`IP_RECVTTL` and the like
    /// on the error queue).
    pub hop_limit: u8,
    pub tos: u8,
    /// The quoted datagram's payload as far as the ICMP message carried it (an
    /// echo request's: the whole ICMP message, header included).
    pub payload: Vec<u8>,
}

/// What reading a report did to the socket's pending error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingAfter {
    Unchanged,
    /// It became this errno (the next report's).
    Set(i32),
    Cleared,
}

/// A datagram socket's error state (in [`crate::socket::udp::UdpSocket`]).
#[derive(Debug, Default)]
pub(crate) struct DgramErrors {
    /// IP_RECVERR, IPV6_RECVERR (`[IPv4, IPv6]`, by the error's family).
    pub recverr: [bool; 2],
    /// The pending error (`sk_err`), an errno.
    pub pending: Option<i32>,
    pub queue: VecDeque<IcmpReport>,
    /// What `queue` charges the receive buffer.
    pub queued_bytes: usize,
}

/// An ICMP error's errno and whether it is hard, as Linux's UDP reads it.
fn dgram_meaning(msg: IcmpMsg) -> (i32, bool) {
    match msg {
        // Path MTU discovery is on by default (IP_PMTUDISC_WANT): the
        // datagram was too big, a hard error.
        IcmpMsg::Unreach4 {
            code: unreach::FRAG_NEEDED,
            ..
        } => (errno::EMSGSIZE, true),
        // Linux's `icmp_err_convert`.
        IcmpMsg::Unreach4 { code, .. } => match code {
            unreach::NET => (errno::ENETUNREACH, false),
            unreach::HOST => (errno::EHOSTUNREACH, false),
            unreach::PROTO => (errno::ENOPROTOOPT, true),
            unreach::PORT => (errno::ECONNREFUSED, true),
            unreach::SOURCE_ROUTE_FAILED => (errno::EOPNOTSUPP, false),
            unreach::NET_UNKNOWN => (errno::ENETUNREACH, true),
            unreach::HOST_UNKNOWN => (errno::EHOSTDOWN, true),
            unreach::HOST_ISOLATED => (errno::ENONET, true),
            unreach::NET_PROHIBITED => (errno::ENETUNREACH, true),
            unreach::HOST_PROHIBITED => (errno::EHOSTUNREACH, true),
            unreach::NET_TOS => (errno::ENETUNREACH, false),
            unreach::HOST_TOS => (errno::EHOSTUNREACH, false),
            unreach::ADMIN_PROHIBITED | unreach::HOST_PRECEDENCE | unreach::PRECEDENCE_CUTOFF => {
                (errno::EHOSTUNREACH, true)
            }
            _ => (errno::EHOSTUNREACH, false),
        },
        // Linux's `icmpv6_err_convert`.
        IcmpMsg::Unreach6 { code } => match code {
            unreach_v6::NO_ROUTE => (errno::ENETUNREACH, false),
            unreach_v6::ADMIN_PROHIBITED => (errno::EACCES, true),
            unreach_v6::BEYOND_SCOPE | unreach_v6::ADDR => (errno::EHOSTUNREACH, false),
            unreach_v6::PORT => (errno::ECONNREFUSED, true),
            unreach_v6::FAILED_POLICY | unreach_v6::REJECT_ROUTE => (errno::EACCES, true),
            _ => (errno::EPROTO, true),
        },
        IcmpMsg::TooBig6 { .. } => (errno::EMSGSIZE, true),
        IcmpMsg::TimeExceeded { .. } => (errno::EHOSTUNREACH, false),
    }
}

/// `ee_type`, `ee_code` and `ee_info` of a message from a router of `family`.
fn type_code_info(msg: IcmpMsg, v6: bool) -> (u8, u8, u32) {
    match msg {
        IcmpMsg::Unreach4 { code, mtu } => (3, code, mtu.map_or(0, u32::from)),
        IcmpMsg::Unreach6 { code } => (1, code, 0),
        IcmpMsg::TooBig6 { mtu } => (2, 0, mtu),
        IcmpMsg::TimeExceeded { code } => (if v6 { 3 } else { 11 }, code, 0),
    }
}

impl View<'_> {
    /// An ICMP error (`invoking` is the packet it quotes): a verdict for the
    /// socket it is about, or Drop when it names none of ours.
    pub(crate) fn classify_icmp_error(
        &self,
        c: &mut Counters,
        l3: &L3Info,
        msg: IcmpMsg,
        invoking: &[u8],
    ) -> Verdict {
        let q = if l3.src.is_ipv4() {
            wire::parse_quoted_ipv4(invoking)
        } else {
            wire::parse_quoted_ipv6(invoking)
        };
        let Ok(q) = q else {
            return Verdict::Drop;
        };
        match q.protocol {
            wire::IPPROTO_TCP => self.classify_tcp_icmp(c, l3, msg, &q, invoking),
            wire::IPPROTO_UDP => self.classify_dgram_icmp(c, l3, msg, &q, DgramProto::Udp),
            wire::IPPROTO_ICMP | wire::IPPROTO_ICMPV6 => {
                self.classify_dgram_icmp(c, l3, msg, &q, DgramProto::Icmp)
            }
            _ => Verdict::Drop,
        }
    }

    /// An ICMP error about a datagram: a UDP one goes to its socket; an ICMP
    /// message (`proto` Icmp) to the echo socket of an echo request's identifier
    /// and to every raw socket of the family whose addresses the quoted packet
    /// names (Linux's `ping_err` and `raw_icmp_error`; a raw socket's copy of
    /// the error message itself is [`crate::socket::DgramProto::Raw`]'s).
    fn classify_dgram_icmp(
        &self,
        c: &mut Counters,
        l3: &L3Info,
        msg: IcmpMsg,
        q: &QuotedPacket<'_>,
        proto: DgramProto,
    ) -> Verdict {
        let v6 = !l3.src.is_ipv4();
        let mut socks = Vec::new();
        // Where it was sent, and the payload the report carries.
        let (dest, payload) = match proto {
            DgramProto::Udp => {
                c.udp_icmp_rx += 1;
                let (sport, dport) = q.ports();
                let dest = SocketAddr::new(q.dst, dport);
                socks.extend(self.sockets.udp_lookup(proto, q.src, sport, dest));
                (dest, &q.l4[wire::UDP_HEADER_LEN..])
            }
            DgramProto::Icmp | DgramProto::Raw => {
                let dest = SocketAddr::new(q.dst, 0);
                // An echo request's identifier is its echo socket's port.
                let request = if v6 {
                    usnet_socket_api::echo::REQUEST_V6
                } else {
                    usnet_socket_api::echo::REQUEST_V4
                };
                if q.l4[0] == request {
                    let ident = u16::from_be_bytes([q.l4[4], q.l4[5]]);
                    let echo = self
                        .sockets
                        .udp_lookup(DgramProto::Icmp, q.src, ident, dest);
                    socks.extend(echo);
                }
                self.sockets.raw_error_members(q.src, q.dst, &mut socks);
                (dest, q.l4)
            }
        };
        if socks.is_empty() {
            c.dgram_icmp_no_socket += 1;
            return Verdict::Drop;
        }
        if !l3.unicast {
            return Verdict::Drop;
        }
        let (errno, hard) = dgram_meaning(msg);
        let (icmp_type, code, info) = type_code_info(msg, v6);
        Verdict::DgramIcmp {
            socks,
            hard,
            report: Box::new(IcmpReport {
                errno,
                origin: if v6 { ORIGIN_ICMP6 } else { ORIGIN_ICMP },
                icmp_type,
                code,
                info,
                offender: Some(l3.src),
                dest,
                hop_limit: l3.hop_limit,
                tos: l3.tos,
                payload: payload.to_vec(),
            }),
        }
    }
}

impl Stack {
    /// Linux's rule for an ICMP error on datagram socket `idx` (the module's
    /// header).
    pub(crate) fn dgram_icmp_error(&mut self, idx: u32, report: IcmpReport, hard: bool) {
        let counters = &mut self.core.counters;
        let Some(u) = self.sockets.udp_at_mut(idx) else {
            return;
        };
        let fam = IpFamily::of(report.dest.ip()).index();
        let e = &mut u.errors;
        let errno = report.errno;
        if e.recverr[fam] {
            let cost = report.payload.len() + REPORT_OVERHEAD;
            if e.queued_bytes + cost > u.recv_buffer {
                counters.dgram_icmp_queue_full += 1;
            } else {
                e.queued_bytes += cost;
                e.queue.push_back(report);
                counters.dgram_icmp_queued += 1;
            }
        } else if !hard || u.remote.is_none() {
            counters.dgram_icmp_ignored += 1;
            return;
        }
        e.pending = Some(errno);
        self.sockets.mark_ready(idx);
    }

    fn dgram_errors(&mut self, h: SocketHandle) -> Result<&mut DgramErrors, StackError> {
        Ok(&mut self.udp_mut(h)?.errors)
    }

    /// `IP_RECVERR` (`family` V4) or `IPV6_RECVERR` (V6): ICMP errors of that
    /// family wait on the socket's error queue. Turning it off empties the
    /// queue, as on Linux.
    pub fn udp_set_recverr(
        &mut self,
        h: SocketHandle,
        family: IpFamily,
        on: bool,
    ) -> Result<(), StackError> {
        let e = self.dgram_errors(h)?;
        e.recverr[family.index()] = on;
        if !on {
            e.queue.clear();
            e.queued_bytes = 0;
        }
        Ok(())
    }

    /// Takes the socket's pending error (`SO_ERROR`; what the next `recv` or
    /// `send` fails with), an errno.
    pub fn udp_take_error(&mut self, h: SocketHandle) -> Result<Option<i32>, StackError> {
        Ok(self.dgram_errors(h)?.pending.take())
    }

    /// Reports waiting on the error queue.
    pub fn udp_errqueue_len(&self, h: SocketHandle) -> Result<usize, StackError> {
        Ok(self.udp(h)?.errors.queue.len())
    }

    /// The oldest report on the error queue (`recvmsg(MSG_ERRQUEUE)`), and
    /// what became of the pending error (Linux's `sock_dequeue_err_skb`): the
    /// next ICMP report's errno, or none once no ICMP report is left behind an
    /// ICMP one; a local report leaves it.
    pub fn udp_errqueue_pop(
        &mut self,
        h: SocketHandle,
    ) -> Result<Option<(IcmpReport, PendingAfter)>, StackError> {
        let e = self.dgram_errors(h)?;
        let Some(r) = e.queue.pop_front() else {
            return Ok(None);
        };
        e.queued_bytes -= r.payload.len() + REPORT_OVERHEAD;
        let is_icmp = |r: &IcmpReport| r.origin != ORIGIN_LOCAL;
        let after = match e.queue.front() {
            Some(next) if is_icmp(next) => PendingAfter::Set(next.errno),
            _ if is_icmp(&r) => PendingAfter::Cleared,
            _ => PendingAfter::Unchanged,
        };
        match after {
            PendingAfter::Set(errno) => e.pending = Some(errno),
            PendingAfter::Cleared => e.pending = None,
            PendingAfter::Unchanged => {}
        }
        Ok(Some((r, after)))
    }

    /// A send refused for the path MTU (`EMSGSIZE` under `IP_PMTUDISC_DO` or
    /// `PROBE`): with `IP_RECVERR` of `dest`'s family, a local report waits on
    /// the error queue with the MTU in `ee_info` and no payload (Linux's
    /// `ip_local_error`, `ipv6_local_error`); it leaves no pending error.
    pub fn udp_local_error(
        &mut self,
        h: SocketHandle,
        errno: i32,
        dest: SocketAddr,
        mtu: u32,
    ) -> Result<(), StackError> {
        let fam = IpFamily::of(dest.ip()).index();
        let u = self.udp_mut(h)?;
        let e = &mut u.errors;
        if !e.recverr[fam] || e.queued_bytes + REPORT_OVERHEAD > u.recv_buffer {
            return Ok(());
        }
        e.queued_bytes += REPORT_OVERHEAD;
        e.queue.push_back(IcmpReport {
            errno,
            origin: ORIGIN_LOCAL,
            icmp_type: 0,
            code: 0,
            info: mtu,
            offender: None,
            dest,
            hop_limit: 0,
            tos: 0,
            payload: Vec::new(),
        });
        self.sockets.mark_ready(h.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_errnos_and_hardness() {
        let u4 = |code| dgram_meaning(IcmpMsg::Unreach4 { code, mtu: None });
        assert_eq!(u4(unreach::PORT), (errno::ECONNREFUSED, true));
        assert_eq!(u4(unreach::NET), (errno::ENETUNREACH, false));
        assert_eq!(u4(unreach::HOST), (errno::EHOSTUNREACH, false));
        assert_eq!(u4(unreach::FRAG_NEEDED), (errno::EMSGSIZE, true));
        assert_eq!(u4(unreach::ADMIN_PROHIBITED), (errno::EHOSTUNREACH, true));
        assert_eq!(u4(200), (errno::EHOSTUNREACH, false));
        let u6 = |code| dgram_meaning(IcmpMsg::Unreach6 { code });
        assert_eq!(u6(unreach_v6::PORT), (errno::ECONNREFUSED, true));
        assert_eq!(u6(unreach_v6::ADMIN_PROHIBITED), (errno::EACCES, true));
        assert_eq!(u6(unreach_v6::ADDR), (errno::EHOSTUNREACH, false));
        assert_eq!(u6(99), (errno::EPROTO, true));
        assert_eq!(
            dgram_meaning(IcmpMsg::TimeExceeded { code: 0 }),
            (errno::EHOSTUNREACH, false)
        );
        assert_eq!(
            dgram_meaning(IcmpMsg::TooBig6 { mtu: 1280 }),
            (errno::EMSGSIZE, true)
        );
        assert_eq!(
            type_code_info(IcmpMsg::TimeExceeded { code: 1 }, true),
            (3, 1, 0)
        );
        assert_eq!(
            type_code_info(
                IcmpMsg::Unreach4 {
                    code: 4,
                    mtu: Some(1400)
                },
                false
            ),
            (3, 4, 1400)
        );
    }
}
