//! ICMP errors about our TCP segments. The receive path hands over the error and
//! the packet it quotes; the connection is found by the quoted 4-tuple and the
//! engine checks the quoted sequence number (RFC 5927), then:
//!
//! - fragmentation needed / packet too big lowers the connection's MSS (RFC 1191,
//!   RFC 8201) and resends what is in flight at the new size;
//! - port/protocol/host/network unreachable ends a connection attempt at once;
//!   once synchronized they, and time exceeded always, are soft errors (RFC 1122
//!   §4.2.3.9, RFC 5461), reported only if the connection later times out.

use std::net::SocketAddr;

use usnet_tcp::{IcmpError, IcmpOutcome, TcpConfig, TcpError, Wake};
use usnet_wire::{unreach, unreach_v6, QuotedPacket};

use crate::counters::Counters;
use crate::rx::View;
use crate::types::{IcmpMsg, L3Info, TcpTarget, Verdict};
use crate::Stack;

/// Smallest path MTU believed for IPv4. Linux's `min_pmtu` (552): a smaller report
/// is taken as 552, so the MSS never drops below 512.
pub(crate) const MIN_PMTU_V4: usize = 552;
/// IPv6 links carry at least 1280 bytes (RFC 8200 §5); RFC 8201 §4 forbids going
/// lower.
pub(crate) const MIN_PMTU_V6: usize = 1280;

/// RFC 1191 §7 plateaus, for a fragmentation-needed message without an MTU: the
/// largest one below the size of the packet that did not fit.
fn plateau_below(len: usize) -> usize {
    const PLATEAUS: [usize; 10] = [32000, 17914, 8166, 4352, 2002, 1492, 1006, 508, 296, 68];
    PLATEAUS.into_iter().find(|&p| p < len).unwrap_or(68)
}

/// The MSS for a reported path MTU, never below the family's floor.
pub(crate) fn pmtu_mss(mtu: usize, v6: bool) -> u16 {
    let floor = if v6 { MIN_PMTU_V6 } else { MIN_PMTU_V4 };
    TcpConfig::mss_for_mtu(mtu.max(floor), v6)
}

/// What an ICMP message means for TCP; None for codes TCP does not act on.
fn tcp_meaning(msg: IcmpMsg, quoted_len: usize) -> Option<IcmpError> {
    let unreachable = |error, hard| Some(IcmpError::Unreachable { error, hard });
    match msg {
        IcmpMsg::Unreach4 { code, mtu } => match code {
            unreach::FRAG_NEEDED => {
                let mtu = mtu.map_or_else(|| plateau_below(quoted_len), usize::from);
                Some(IcmpError::PacketTooBig {
                    mss: pmtu_mss(mtu, false),
                })
            }
            // BSD reports both as ECONNREFUSED: the host answered and will not talk.
            unreach::PORT | unreach::PROTO => unreachable(TcpError::Refused, true),
            unreach::NET | unreach::NET_UNKNOWN | unreach::NET_PROHIBITED | unreach::NET_TOS => {
                unreachable(TcpError::NetUnreachable, true)
            }
            // RFC 1122 counts source route failed among the soft errors.
            unreach::SOURCE_ROUTE_FAILED => unreachable(TcpError::HostUnreachable, false),
            unreach::HOST
            | unreach::HOST_UNKNOWN
            | unreach::HOST_ISOLATED
            | unreach::HOST_PROHIBITED
            | unreach::HOST_TOS
            | unreach::ADMIN_PROHIBITED
            | unreach::HOST_PRECEDENCE
            | unreach::PRECEDENCE_CUTOFF => unreachable(TcpError::HostUnreachable, true),
            _ => None,
        },
        IcmpMsg::Unreach6 { code } => match code {
            unreach_v6::PORT => unreachable(TcpError::Refused, true),
            unreach_v6::NO_ROUTE => unreachable(TcpError::NetUnreachable, true),
            unreach_v6::ADMIN_PROHIBITED
            | unreach_v6::BEYOND_SCOPE
            | unreach_v6::ADDR
            | unreach_v6::FAILED_POLICY
            | unreach_v6::REJECT_ROUTE => unreachable(TcpError::HostUnreachable, true),
            _ => None,
        },
        IcmpMsg::TooBig6 { mtu } => Some(IcmpError::PacketTooBig {
            mss: pmtu_mss(mtu.min(65535) as usize, true),
        }),
        IcmpMsg::TimeExceeded { .. } => unreachable(TcpError::HostUnreachable, false),
    }
}

impl View<'_> {
    /// An ICMP error about a TCP segment (`q`, quoted whole in `invoking`): a
    /// verdict for the connection it names, or Drop when it names none of ours.
    pub(crate) fn classify_tcp_icmp(
        &self,
        c: &mut Counters,
        l3: &L3Info,
        msg: IcmpMsg,
        q: &QuotedPacket<'_>,
        invoking: &[u8],
    ) -> Verdict {
        c.tcp_icmp_rx += 1;
        // The total length of the quoted IPv4 packet (for the RFC 1191 plateaus).
        let quoted_len = match invoking {
            [_, _, hi, lo, ..] => usize::from(u16::from_be_bytes([*hi, *lo])),
            _ => 0,
        };
        let Some(err) = tcp_meaning(msg, quoted_len) else {
            c.tcp_icmp_other += 1;
            return Verdict::Drop;
        };
        let (sport, dport) = q.ports();
        let local = SocketAddr::new(q.src, sport);
        let remote = SocketAddr::new(q.dst, dport);
        match self.sockets.tcp_lookup(local, remote) {
            TcpTarget::Conn(conn) if l3.unicast => Verdict::TcpIcmp {
                conn,
                seq: q.tcp_seq(),
                err,
            },
            TcpTarget::Listener(listener) if l3.unicast => Verdict::TcpIcmpListener {
                listener,
                local,
                remote,
                seq: q.tcp_seq(),
                err,
            },
            _ => {
                c.tcp_icmp_no_conn += 1;
                Verdict::Drop
            }
        }
    }
}

impl Stack {
    /// An ICMP error about a listener's SYN-ACK: the half-open connection may go
    /// (`usnet_tcp::Listener::icmp_error`).
    pub(crate) fn tcp_icmp_listener_error(
        &mut self,
        idx: u32,
        local: SocketAddr,
        remote: SocketAddr,
        seq: u32,
        err: IcmpError,
    ) {
        let Some(l) = self.sockets.listen_at_mut(idx) else {
            return;
        };
        if let Some(lst) = l.family(remote) {
            lst.icmp_error(local, remote, seq, err);
        }
    }

    /// An ICMP error for connection `idx` whose quoted segment had sequence number
    /// `seq`. A lowered MSS resends at once (in `tcp_settle`).
    pub(crate) fn tcp_icmp_error(&mut self, idx: u32, seq: u32, err: IcmpError) {
        let now = self.core.tcp_now();
        let Some(s) = self.sockets.conn_at_mut(idx) else {
            return;
        };
        let closed = s.conn.icmp_error(now, seq, err) == IcmpOutcome::Aborted;
        self.tcp_settle(
            idx,
            Wake {
                closed,
                ..Wake::default()
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_errors() {
        let m = |msg| tcp_meaning(msg, 1500);
        let u4 = |code| IcmpMsg::Unreach4 { code, mtu: None };
        let hard = |error| Some(IcmpError::Unreachable { error, hard: true });
        assert_eq!(m(u4(unreach::PORT)), hard(TcpError::Refused));
        assert_eq!(m(u4(unreach::PROTO)), hard(TcpError::Refused));
        assert_eq!(m(u4(unreach::NET)), hard(TcpError::NetUnreachable));
        assert_eq!(m(u4(unreach::HOST)), hard(TcpError::HostUnreachable));
        assert_eq!(
            m(u4(unreach::ADMIN_PROHIBITED)),
            hard(TcpError::HostUnreachable)
        );
        assert_eq!(m(u4(200)), None);
        let u6 = |code| IcmpMsg::Unreach6 { code };
        assert_eq!(m(u6(unreach_v6::PORT)), hard(TcpError::Refused));
        assert_eq!(m(u6(unreach_v6::NO_ROUTE)), hard(TcpError::NetUnreachable));
        assert_eq!(
            m(u6(unreach_v6::ADMIN_PROHIBITED)),
            hard(TcpError::HostUnreachable)
        );
        assert_eq!(
            m(IcmpMsg::TimeExceeded { code: 0 }),
            Some(IcmpError::Unreachable {
                error: TcpError::HostUnreachable,
                hard: false
            })
        );
    }

    #[test]
    fn mtu_to_mss_with_floors_and_plateaus() {
        let too_big = |mss| Some(IcmpError::PacketTooBig { mss });
        let frag = |mtu| IcmpMsg::Unreach4 {
            code: unreach::FRAG_NEEDED,
            mtu,
        };
        assert_eq!(tcp_meaning(frag(Some(1280)), 1500), too_big(1240));
        assert_eq!(tcp_meaning(frag(Some(68)), 1500), too_big(512));
        // No MTU in the message: the next plateau below the packet's size.
        assert_eq!(tcp_meaning(frag(None), 1500), too_big(1452));
        assert_eq!(tcp_meaning(frag(None), 1492), too_big(966));
        assert_eq!(tcp_meaning(frag(None), 600), too_big(512));
        assert_eq!(
            tcp_meaning(IcmpMsg::TooBig6 { mtu: 1400 }, 0),
            too_big(1340)
        );
        assert_eq!(tcp_meaning(IcmpMsg::TooBig6 { mtu: 600 }, 0), too_big(1220));
        assert_eq!(
            tcp_meaning(IcmpMsg::TooBig6 { mtu: u32::MAX }, 0),
            too_big(65475)
        );
    }
}
