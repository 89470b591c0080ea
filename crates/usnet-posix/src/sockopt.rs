//! Socket options the layer only records and reports back, as Linux reports them:
//! hints to a kernel that the stack has no use for (or does otherwise), which a
//! correct program may set and read and must not fail on. The options that take
//! effect in the stack are in `setsockopt`/`getsockopt` in the crate root; the
//! table of both is in docs/preload.md.

use crate::{Errno, Res};

/// Linux's option numbers the `libc` crate may lack.
pub const TCP_FASTOPEN_CONNECT: i32 = 30;
pub const SO_INCOMING_NAPI_ID: i32 = 56;
pub const IP_BIND_ADDRESS_NO_PORT: i32 = 24;
pub const IPV6_MULTICAST_ALL: i32 = 29;
/// `SOCK_MIN_RCVBUF / 2`: the least TCP_WINDOW_CLAMP Linux keeps.
const MIN_WINDOW_CLAMP: i32 = 1152;

fn einval() -> Errno {
    Errno(libc::EINVAL)
}

/// How one recorded option reads and writes.
#[derive(Clone, Copy)]
enum Kind {
    /// Any value; reported as 0 or 1.
    Bool,
    /// Any value, reported as set.
    Int,
    /// `-1` (the default) or `lo..=hi`, else EINVAL.
    Ranged(i32, i32),
    /// `lo..=hi`, else EINVAL.
    Strict(i32, i32),
    /// TCP_DEFER_ACCEPT: seconds, kept as SYN-ACK retransmissions as Linux does
    /// (so 5 reads back as 7).
    DeferAccept,
    /// TCP_WINDOW_CLAMP: 0, or at least half of SOCK_MIN_RCVBUF.
    WindowClamp,
    /// SO_RCVLOWAT: negative is INT_MAX, 0 is 1.
    RcvLowat,
    /// Read-only.
    ReadOnly,
}

/// `(default, kind)` of a recorded option on a socket of this type and family;
/// `Err` is what Linux answers when the option does not apply (ENOPROTOOPT).
fn entry(level: i32, name: i32, stream: bool, v6: bool) -> Res<(i32, Kind)> {
    use Kind::*;
    let none = Err(Errno(libc::ENOPROTOOPT));
    Ok(match level {
        libc::SOL_SOCKET => match name {
            libc::SO_RCVLOWAT => (1, RcvLowat),
            libc::SO_BROADCAST => (0, Bool),
            libc::SO_PRIORITY => (0, Int),
            libc::SO_MARK => (0, Int),
            libc::SO_INCOMING_CPU => (-1, Int),
            SO_INCOMING_NAPI_ID => (0, ReadOnly),
            _ => return none,
        },
        libc::IPPROTO_TCP if stream => match name {
            libc::TCP_QUICKACK => (1, Bool),
            libc::TCP_DEFER_ACCEPT => (0, DeferAccept),
            libc::TCP_FASTOPEN => (0, Strict(0, i32::MAX)),
            TCP_FASTOPEN_CONNECT => (0, Strict(0, 1)),
            libc::TCP_WINDOW_CLAMP => (0, WindowClamp),
            _ => return none,
        },
        libc::IPPROTO_IP => match name {
            libc::IP_TTL => (64, Ranged(1, 255)),
            libc::IP_RECVERR => (0, Bool),
            libc::IP_PKTINFO => (0, Bool),
            libc::IP_MTU_DISCOVER => (1, Strict(0, 5)),
            libc::IP_FREEBIND => (0, Bool),
            IP_BIND_ADDRESS_NO_PORT => (0, Bool),
            libc::IP_MULTICAST_TTL => (1, Ranged(0, 255)),
            libc::IP_MULTICAST_LOOP => (1, Bool),
            libc::IP_MULTICAST_ALL => (1, Strict(0, 1)),
            _ => return none,
        },
        libc::IPPROTO_IPV6 if v6 => match name {
            libc::IPV6_UNICAST_HOPS => (64, Ranged(0, 255)),
            libc::IPV6_RECVERR => (0, Bool),
            libc::IPV6_RECVPKTINFO => (0, Bool),
            libc::IPV6_MTU_DISCOVER => (1, Strict(0, 5)),
            libc::IPV6_MULTICAST_LOOP => (1, Strict(0, 1)),
            libc::IPV6_MULTICAST_HOPS => (1, Ranged(0, 255)),
            libc::IPV6_MULTICAST_IF => (0, Int),
            IPV6_MULTICAST_ALL => (1, Bool),
            _ => return none,
        },
        _ => return none,
    })
}

/// The value to keep for a recorded option set to `v`.
pub fn set(level: i32, name: i32, v: i32, stream: bool, v6: bool) -> Res<i32> {
    let (default, kind) = entry(level, name, stream, v6)?;
    // Multicast sending options a stream reads but does not take.
    match (level, name) {
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL) if stream => return Err(einval()),
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS | libc::IPV6_MULTICAST_IF) if stream => {
            return Err(Errno(libc::ENOPROTOOPT))
        }
        _ => {}
    }
    Ok(match kind {
        Kind::Bool => (v != 0) as i32,
        Kind::Int => v,
        Kind::Ranged(lo, hi) => match v {
            -1 => default,
            _ if (lo..=hi).contains(&v) => v,
            _ => return Err(einval()),
        },
        Kind::Strict(lo, hi) if (lo..=hi).contains(&v) => v,
        Kind::Strict(..) => return Err(einval()),
        Kind::DeferAccept => secs_to_retrans(v),
        Kind::WindowClamp if v == 0 => 0,
        Kind::WindowClamp => v.max(MIN_WINDOW_CLAMP),
        Kind::RcvLowat if v < 0 => i32::MAX,
        Kind::RcvLowat => v.max(1),
        Kind::ReadOnly => return Err(Errno(libc::ENOPROTOOPT)),
    })
}

/// What a recorded option reads: `kept` (as [`set`] returned it) or its default.
pub fn get(level: i32, name: i32, kept: Option<i32>, stream: bool, v6: bool) -> Res<i32> {
    let (default, kind) = entry(level, name, stream, v6)?;
    let v = kept.unwrap_or(default);
    Ok(match kind {
        Kind::DeferAccept => retrans_to_secs(v),
        _ => v,
    })
}

/// Linux's `secs_to_retrans` with TCP_TIMEOUT_INIT 1 s and TCP_RTO_MAX 120 s.
fn secs_to_retrans(secs: i32) -> i32 {
    if secs <= 0 {
        return 0;
    }
    let (mut timeout, mut period, mut res) = (1, 1, 1);
    while secs > period && res < 255 {
        res += 1;
        timeout = (timeout * 2).min(120);
        period += timeout;
    }
    res
}

/// Linux's `retrans_to_secs`.
fn retrans_to_secs(retrans: i32) -> i32 {
    if retrans <= 0 {
        return 0;
    }
    let (mut timeout, mut period) = (1, 1);
    for _ in 1..retrans {
        timeout = (timeout * 2).min(120);
        period += timeout;
    }
    period
}

/// The errno of a `getsockopt` at a level the socket has no such option at:
/// Linux's IPv4 sockets say EOPNOTSUPP for a level they do not know (a TCP level
/// on a UDP socket, IPv6 on an AF_INET socket), IPv6 sockets ENOPROTOOPT.
pub fn get_level_errno(level: i32, stream: bool, v6: bool) -> Errno {
    let known = match level {
        libc::SOL_SOCKET | libc::IPPROTO_IP => true,
        libc::IPPROTO_TCP => stream,
        libc::IPPROTO_UDP => !stream,
        libc::IPPROTO_IPV6 => v6,
        _ => false,
    };
    Errno(if known || v6 {
        libc::ENOPROTOOPT
    } else {
        libc::EOPNOTSUPP
    })
}

/// An option's integer: an `int`, or for the IP level a single byte as Linux
/// takes it.
pub fn int_value(level: i32, v: &[u8]) -> Res<i32> {
    match v.len() {
        n if n >= 4 => Ok(i32::from_ne_bytes([v[0], v[1], v[2], v[3]])),
        1..=3 if level == libc::IPPROTO_IP => Ok(i32::from(v[0])),
        _ => Err(einval()),
    }
}

/// A multicast membership (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP` and their
/// drops): the group and the interface as given (the key `setsockopt` records and
/// carries to the stack, which joins the group on its one interface and tells
/// the link with IGMPv2/MLDv2).
pub fn membership(level: i32, name: i32, v: &[u8]) -> Res<Option<(bool, Vec<u8>)>> {
    let join = match (level, name) {
        (libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP) => true,
        (libc::IPPROTO_IP, libc::IP_DROP_MEMBERSHIP) => false,
        (libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP) => true,
        (libc::IPPROTO_IPV6, libc::IPV6_DROP_MEMBERSHIP) => false,
        _ => return Ok(None),
    };
    let key = if level == libc::IPPROTO_IP {
        // ip_mreq (group, interface address) or ip_mreqn (…, ifindex).
        if v.len() < 8 {
            return Err(einval());
        }
        if v[0] & 0xf0 != 0xe0 {
            return Err(einval());
        }
        v[..v.len().min(12)].to_vec()
    } else {
        // ipv6_mreq: group, ifindex.
        if v.len() < 20 {
            return Err(einval());
        }
        if v[0] != 0xff {
            return Err(einval());
        }
        v[..20].to_vec()
    };
    Ok(Some((join, key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_linux_reports_them() {
        // TCP_DEFER_ACCEPT rounds up to a whole number of SYN-ACK retransmissions.
        assert_eq!(retrans_to_secs(secs_to_retrans(5)), 7);
        assert_eq!(retrans_to_secs(secs_to_retrans(100)), 127);
        assert_eq!(retrans_to_secs(secs_to_retrans(-3)), 0);
        let tcp = |name, v| set(libc::IPPROTO_TCP, name, v, true, false);
        assert_eq!(tcp(libc::TCP_WINDOW_CLAMP, 100), Ok(1152));
        assert_eq!(tcp(libc::TCP_QUICKACK, 5), Ok(1));
        assert_eq!(tcp(TCP_FASTOPEN_CONNECT, 2), Err(Errno(libc::EINVAL)));
        let ip = |name, v| set(libc::IPPROTO_IP, name, v, false, false);
        assert_eq!(ip(libc::IP_TTL, -1), Ok(64));
        assert_eq!(ip(libc::IP_TTL, 0), Err(Errno(libc::EINVAL)));
        assert_eq!(ip(libc::IP_MTU_DISCOVER, 6), Err(Errno(libc::EINVAL)));
        assert_eq!(
            set(libc::SOL_SOCKET, libc::SO_RCVLOWAT, -5, false, false),
            Ok(i32::MAX)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, SO_INCOMING_NAPI_ID, 0, true, false),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_INCOMING_CPU, None, true, false),
            Ok(-1)
        );
        // IPv4 multicast on a stream: EINVAL; IPv6 options on an AF_INET socket: none.
        assert_eq!(
            set(libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 3, true, false),
            Err(Errno(libc::EINVAL))
        );
        assert_eq!(
            set(libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, 3, false, false),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            get_level_errno(libc::IPPROTO_TCP, false, false),
            Errno(libc::EOPNOTSUPP)
        );
        assert_eq!(
            get_level_errno(libc::IPPROTO_TCP, false, true),
            Errno(libc::ENOPROTOOPT)
        );
    }
}
