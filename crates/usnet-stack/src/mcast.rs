//! Multicast: the interface's group memberships, reference-counted by the sockets
//! that joined (a socket's own list is in its `UdpSocket::mc`), and the host side of
//! IGMPv2 (RFC 2236) and MLDv2 (RFC 3810) that tells the link about them.
//!
//! - The first socket to join a group sends an unsolicited report at once (IGMPv2
//!   report to the group; MLDv2 report with a CHANGE_TO_EXCLUDE record, no
//!   sources, to ff02::16) and schedules one repeat (robustness 2) at a random
//!   time within the unsolicited report interval (10 s IGMPv2, 1 s MLDv2).
//! - The last socket to leave sends a leave at once (IGMPv2 leave to 224.0.0.2;
//!   MLDv2 report with a CHANGE_TO_INCLUDE record, no sources).
//! - A general query schedules a report for every group of its family, a
//!   group-specific one for that group, each at a random delay within the
//!   query's maximum response time (an earlier pending report is kept). The
//!   delayed reports are current-state reports (IGMPv2 report; MLDv2
//!   MODE_IS_EXCLUDE). Hearing another host's report does not cancel ours (an
//!   IGMPv2 host may suppress it; sending it anyway is allowed and what IGMPv3
//!   and MLDv2 hosts do). MLDv1 and IGMPv1 queries are answered in the same
//!   versions (no compatibility mode).
//! - 224.0.0.1 and ff02::1 are always joined and never reported.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use usnet_wire::{self as wire, ethertype, IgmpRepr, Ipv4Repr, Ipv6Repr, MacAddr, MldRepr};

use crate::core::Core;
use crate::time::Instant;

/// IGMPv2's Unsolicited Report Interval (RFC 2236 §8.10).
const UNSOLICITED_V4: Duration = Duration::from_secs(10);
/// MLDv2's Unsolicited Report Interval (RFC 3810 §9.11).
const UNSOLICITED_V6: Duration = Duration::from_secs(1);

pub(crate) const ALL_SYSTEMS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 1);
pub(crate) const ALL_ROUTERS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 2);
pub(crate) const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// One group the interface has joined.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Membership {
    pub group: IpAddr,
    /// Sockets that joined it.
    pub refs: u32,
    /// A report is due then (a repeat or a query's answer).
    pub due: Option<Instant>,
}

/// The interface's memberships.
#[derive(Debug)]
pub(crate) struct Mcast {
    pub groups: Vec<Membership>,
    rng: u64,
}

impl Mcast {
    pub fn new(seed: u64) -> Mcast {
        Mcast {
            groups: Vec::new(),
            rng: seed ^ 0x9e37_79b9_7f4a_7c15 | 1,
        }
    }

    /// Whether the interface receives `group` (a joined group, or all-systems /
    /// all-nodes).
    pub fn is_member(&self, group: IpAddr) -> bool {
        group == IpAddr::V4(ALL_SYSTEMS)
            || group == IpAddr::V6(ALL_NODES)
            || self.groups.iter().any(|m| m.group == group)
    }

    pub fn next_due(&self) -> Option<Instant> {
        self.groups.iter().filter_map(|m| m.due).min()
    }

    /// A uniformly random delay in `[0, max)` (xorshift64*; seeded from the stack's
    /// seed, so a simulation repeats).
    fn delay(&mut self, max: Duration) -> Duration {
        let n = max.as_nanos() as u64;
        if n == 0 {
            return Duration::ZERO;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        Duration::from_nanos(self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % n)
    }
}

/// Groups that are never reported.
fn silent(group: IpAddr) -> bool {
    group == IpAddr::V4(ALL_SYSTEMS) || group == IpAddr::V6(ALL_NODES)
}

/// Per-socket multicast options and memberships (Linux's defaults: TTL and hop
/// limit 1, loopback on, IP_MULTICAST_ALL on, no IP_MULTICAST_IF).
#[derive(Debug, Clone)]
pub(crate) struct SockMcast {
    pub groups: Vec<IpAddr>,
    pub ttl: u8,
    pub hops: u8,
    pub loop4: bool,
    pub loop6: bool,
    /// IP_MULTICAST_ALL: a wildcard socket on the port receives every group the
    /// interface joined, not only its own.
    pub all: bool,
    /// IP_MULTICAST_IF: the source address of IPv4 multicast.
    pub if4: Option<Ipv4Addr>,
}

impl Default for SockMcast {
    fn default() -> Self {
        SockMcast {
            groups: Vec::new(),
            ttl: 1,
            hops: 1,
            loop4: true,
            loop6: true,
            all: true,
            if4: None,
        }
    }
}

impl Core {
    /// One more socket in `group`; the first sends the report.
    pub(crate) fn mcast_join(&mut self, group: IpAddr) {
        if let Some(m) = self.mcast.groups.iter_mut().find(|m| m.group == group) {
            m.refs += 1;
            return;
        }
        self.counters.mcast_joins += 1;
        let due = if silent(group) {
            None
        } else {
            self.send_report(group, true);
            let interval = if group.is_ipv4() {
                UNSOLICITED_V4
            } else {
                UNSOLICITED_V6
            };
            Some(self.now + self.mcast.delay(interval))
        };
        self.mcast.groups.push(Membership {
            group,
            refs: 1,
            due,
        });
    }

    /// One socket fewer in `group`; the last sends the leave.
    pub(crate) fn mcast_leave(&mut self, group: IpAddr) {
        let Some(i) = self.mcast.groups.iter().position(|m| m.group == group) else {
            return;
        };
        let m = &mut self.mcast.groups[i];
        m.refs -= 1;
        if m.refs > 0 {
            return;
        }
        self.mcast.groups.swap_remove(i);
        self.counters.mcast_leaves += 1;
        if !silent(group) {
            self.send_leave(group);
        }
    }

    /// A query: `group` unspecified asks about every group of its family.
    pub(crate) fn mcast_query(&mut self, group: IpAddr, max: Duration) {
        let now = self.now;
        let mut groups = std::mem::take(&mut self.mcast.groups);
        for m in groups.iter_mut() {
            let asked = if group.is_unspecified() {
                m.group.is_ipv4() == group.is_ipv4()
            } else {
                m.group == group
            };
            if !asked || silent(m.group) {
                continue;
            }
            let at = now + self.mcast.delay(max);
            m.due = Some(m.due.map_or(at, |d| d.min(at)));
        }
        self.mcast.groups = groups;
    }

    /// Sends the reports that are due. Returns whether it sent any.
    pub(crate) fn mcast_timers(&mut self) -> bool {
        let now = self.now;
        let mut due = Vec::new();
        for m in self.mcast.groups.iter_mut() {
            if m.due.is_some_and(|d| d <= now) {
                m.due = None;
                due.push(m.group);
            }
        }
        for &g in &due {
            self.send_report(g, false);
        }
        !due.is_empty()
    }

    /// A report for `group`: IGMPv2 report, or MLDv2 report with one record
    /// (CHANGE_TO_EXCLUDE when `change`, else MODE_IS_EXCLUDE).
    fn send_report(&mut self, group: IpAddr, change: bool) {
        match group {
            IpAddr::V4(g) => {
                if self.send_igmp(IgmpRepr::ReportV2 { group: g }, g) {
                    self.counters.igmp_tx_report += 1;
                }
            }
            IpAddr::V6(g) => {
                let kind = if change {
                    wire::mld_record::CHANGE_TO_EXCLUDE
                } else {
                    wire::mld_record::MODE_IS_EXCLUDE
                };
                if self.send_mld_record(kind, g) {
                    self.counters.mld_tx_report += 1;
                }
            }
        }
    }

    fn send_leave(&mut self, group: IpAddr) {
        match group {
            IpAddr::V4(g) => {
                if self.send_igmp(IgmpRepr::Leave { group: g }, ALL_ROUTERS) {
                    self.counters.igmp_tx_leave += 1;
                }
            }
            IpAddr::V6(g) => {
                if self.send_mld_record(wire::mld_record::CHANGE_TO_INCLUDE, g) {
                    self.counters.mld_tx_leave += 1;
                }
            }
        }
    }

    /// An IGMP message in an IPv4 packet with TTL 1 and the Router Alert option.
    fn send_igmp(&mut self, repr: IgmpRepr, dst: Ipv4Addr) -> bool {
        let Some(src) = self.first_v4() else {
            return false;
        };
        const ETH: usize = wire::ETHERNET_HEADER_LEN;
        let ip_len = wire::IPV4_HEADER_LEN + wire::IPV4_ROUTER_ALERT.len();
        let len = repr.buffer_len();
        let Some(buf) = self.pool.alloc() else {
            self.counters.drop_pool_exhausted += 1;
            return false;
        };
        self.ip_ident = self.ip_ident.wrapping_add(1);
        let ident = self.ip_ident;
        let mac = self.cfg.mac;
        let out = self.pool.append(&buf, ETH + ip_len + len).expect("fits");
        let _ = wire::emit_ethernet(out, MacAddr::default(), mac, ethertype::IPV4);
        let ip = Ipv4Repr {
            src,
            dst,
            protocol: wire::IPPROTO_IGMP,
            payload_len: len,
            ttl: 1,
            ident,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
        };
        let _ = ip.emit_with_options(&wire::IPV4_ROUTER_ALERT, &mut out[ETH..]);
        let _ = repr.emit(&mut out[ETH + ip_len..]);
        self.counters.ip4_tx += 1;
        self.dispatch(buf, IpAddr::V4(dst));
        true
    }

    /// An MLDv2 report with one record, from the link-local address with hop limit
    /// 1 and a hop-by-hop Router Alert.
    fn send_mld_record(&mut self, kind: u8, group: Ipv6Addr) -> bool {
        let dst = wire::MLDV2_ROUTERS;
        let Some(IpAddr::V6(src)) = self.source_for(IpAddr::V6(dst)) else {
            return false;
        };
        let rec = wire::mld_record_bytes(kind, group);
        let repr = MldRepr::ReportV2 {
            count: 1,
            records: &rec,
        };
        const ETH: usize = wire::ETHERNET_HEADER_LEN;
        let l4 = repr.buffer_len();
        let at = ETH + wire::IPV6_HEADER_LEN;
        let Some(buf) = self.pool.alloc() else {
            self.counters.drop_pool_exhausted += 1;
            return false;
        };
        let mac = self.cfg.mac;
        let out = self.pool.append(&buf, at + 8 + l4).expect("fits");
        let _ = wire::emit_ethernet(out, MacAddr::default(), mac, ethertype::IPV6);
        let ip = Ipv6Repr {
            src,
            dst,
            next_header: wire::IPPROTO_HOPOPTS,
            payload_len: 8 + l4,
            hop_limit: 1,
        };
        let _ = ip.emit(&mut out[ETH..]);
        out[at..at + 8].copy_from_slice(&wire::mld_hop_by_hop(wire::IPPROTO_ICMPV6));
        let _ = repr.emit(&src, &dst, &mut out[at + 8..]);
        self.counters.ip6_tx += 1;
        self.dispatch(buf, IpAddr::V6(dst));
        true
    }
}
