//! setsockopt and getsockopt. An option set before the stack socket exists is kept
//! on the slot and applied when it is made (TCP_MAXSEG, TCP_SYNCNT, multicast).

use std::sync::atomic::Ordering::*;
use std::time::Duration;

use usnet_session_abi::{errno, opt, slot, tcp_info, SockAddr, KIND_TCP};
use usnet_stack::{CcAlgorithm, IpFamily, Keepalive, SocketHandle, Stack, StackError};

use super::{err, Role, ServerSession, SessionSocket};

impl ServerSession {
    pub(super) fn op_setsockopt(&mut self, stack: &mut Stack, i: u32, a: &[u64; 6]) -> i64 {
        let (level, name, value) = (a[0], a[1], a[2]);
        let s = self.sock(i);
        let h = s.handle;
        let tcp_conn = s.kind == KIND_TCP && s.role == Role::Conn;
        let r = match (level, name) {
            // Posted by clients without waiting, like lifting a cork (below).
            (opt::IPPROTO_TCP, opt::TCP_NODELAY) if tcp_conn => {
                self.activate(i);
                self.drain_tx(stack, i);
                stack.tcp_set_nodelay(h.expect("conn"), value != 0)
            }
            (opt::IPPROTO_TCP, opt::TCP_NODELAY) => Ok(()),
            // What the client wrote before it changed the cork meets the stack
            // first, so the cork holds (or lifting it sends) exactly those bytes, as
            // on the kernel, though clients post the lifting without waiting.
            (opt::IPPROTO_TCP, opt::TCP_CORK) if tcp_conn => {
                self.activate(i);
                self.drain_tx(stack, i);
                let r = stack.tcp_set_cork(h.expect("conn"), value != 0);
                // The bytes the client held back for this cork may go now (the
                // turn's drain moves them).
                if a[3] != 0 {
                    let _ = self.mem.slot_u64(i, slot::TX_HOLD).compare_exchange(
                        a[3],
                        0,
                        std::sync::atomic::Ordering::AcqRel,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    self.activate(i);
                }
                r
            }
            (opt::IPPROTO_TCP, opt::TCP_CORK) => Ok(()),
            (opt::SOL_SOCKET, opt::SO_KEEPALIVE) if tcp_conn => {
                // args[3..6]: TCP_KEEPIDLE, TCP_KEEPINTVL (s), TCP_KEEPCNT; 0: default.
                let d = Keepalive::default();
                let secs = |v: u64, d: Duration| {
                    if v == 0 {
                        d
                    } else {
                        Duration::from_secs(v.min(32767))
                    }
                };
                let ka = Keepalive {
                    idle: secs(a[3], d.idle),
                    interval: secs(a[4], d.interval),
                    count: if a[5] == 0 {
                        d.count
                    } else {
                        a[5].min(127) as u32
                    },
                };
                stack.tcp_set_keepalive(h.expect("conn"), (value != 0).then_some(ka))
            }
            (opt::IPPROTO_TCP, opt::TCP_USER_TIMEOUT) => match (s.role, h) {
                (Role::Conn | Role::Listener, Some(h)) if s.kind == KIND_TCP => {
                    let t = (value != 0).then(|| Duration::from_millis(value.min(u32::MAX as u64)));
                    stack.tcp_set_user_timeout(h, t)
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_CONGESTION) if tcp_conn => {
                let cc = match value {
                    opt::CC_CUBIC => CcAlgorithm::Cubic,
                    opt::CC_RENO => CcAlgorithm::NewReno,
                    opt::CC_BBR => CcAlgorithm::Bbr,
                    _ => return -errno::ENOENT,
                };
                stack.tcp_set_congestion_control(h.expect("conn"), cc)
            }
            (opt::SOL_SOCKET, opt::SO_MAX_PACING_RATE) if tcp_conn => stack
                .tcp_set_max_pacing_rate(h.expect("conn"), (value != u64::MAX).then_some(value)),
            (opt::SOL_SOCKET, opt::SO_TIMESTAMPING) => {
                let acked = match (s.role, h) {
                    (Role::Conn, Some(h)) => match stack.tcp_info(h) {
                        Ok(info) => s.written.saturating_sub(info.send_queued as u64),
                        Err(e) => return err(e),
                    },
                    // OPT_ID needs a connection (Linux: EINVAL in CLOSE and LISTEN).
                    _ if value & u64::from(usnet_stack::tx_stamps::OPT_ID) != 0 => {
                        return -errno::EINVAL
                    }
                    _ => 0,
                };
                let written = s.written;
                let st = s.stamps.get_or_insert_with(Default::default);
                let r = st.set(value.min(u64::from(u32::MAX)) as u32, acked, written);
                if st.wants_tx() && !self.ts_watched.contains(&i) {
                    self.ts_watched.push(i);
                }
                r
            }
            (opt::SOL_SOCKET, opt::SO_ZEROCOPY) => {
                s.zc_watch = value != 0 && tcp_conn;
                if s.zc_watch && !self.zc_watched.contains(&i) {
                    self.zc_watched.push(i);
                }
                Ok(())
            }
            (opt::IPPROTO_TCP, opt::TCP_FASTOPEN) => match (s.role, h) {
                (Role::Listener, Some(h)) => {
                    stack.tcp_set_fastopen(h, value.min(i32::MAX as u64) as usize)
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_FASTOPEN_KEY | opt::TCP_FASTOPEN_KEYS) => {
                match (s.role, h) {
                    (Role::Listener, Some(h)) => {
                        let key = |lo: u64, hi: u64| {
                            let mut k = [0u8; 16];
                            k[..8].copy_from_slice(&lo.to_le_bytes());
                            k[8..].copy_from_slice(&hi.to_le_bytes());
                            k
                        };
                        let backup = (name == opt::TCP_FASTOPEN_KEYS).then(|| key(a[4], a[5]));
                        stack.tcp_set_fastopen_key(h, key(a[2], a[3]), backup)
                    }
                    _ => Ok(()),
                }
            }
            (opt::IPPROTO_TCP, opt::TCP_MAXSEG) => match (s.role, h) {
                // Linux's range: 88..=32767 (0 clears it: nothing to do here).
                (Role::Listener, Some(h)) if (88..=32767).contains(&value) => {
                    stack.tcp_set_listener_mss(h, value as u16)
                }
                (Role::Fresh, _) => {
                    s.connect_mss = (88..=32767).contains(&value).then_some(value as u16);
                    Ok(())
                }
                _ => Ok(()),
            },
            (opt::IPPROTO_TCP, opt::TCP_SYNCNT) => match (s.role, h) {
                (Role::Fresh, _) => {
                    s.syn_retries = Some(value.clamp(1, 127) as u32);
                    Ok(())
                }
                (Role::Conn, Some(h)) => stack.tcp_set_syn_retries(h, value.clamp(1, 127) as u32),
                _ => Ok(()),
            },
            (level, name) if s.kind == KIND_TCP && tcp_ip_opt(level, name) => {
                let family = if level == opt::IPPROTO_IPV6 {
                    IpFamily::V6
                } else {
                    IpFamily::V4
                };
                let ip = &mut s.tcp_ip[family.index()];
                match name {
                    opt::IP_TOS | opt::IPV6_TCLASS => ip.tos = value as u8 & !3,
                    opt::IP_TTL | opt::IPV6_UNICAST_HOPS => {
                        ip.ttl = (value <= 255).then_some(value as u8)
                    }
                    _ => ip.min_ttl = value.min(255) as u8,
                }
                let ip = *ip;
                match (s.role, h) {
                    (Role::Listener, Some(h)) => stack.tcp_set_ip_opts(h, family, ip),
                    // A connection takes the options of its peer's family.
                    (Role::Conn, Some(h)) => match stack.tcp_peer_addr(h) {
                        Ok(p) if IpFamily::of(p.ip()) == family => {
                            stack.tcp_set_ip_opts(h, family, ip)
                        }
                        _ => Ok(()),
                    },
                    // A fresh socket's are taken at connect or listen.
                    _ => Ok(()),
                }
            }
            (opt::SOL_SOCKET, opt::SO_LINGER) if tcp_conn => {
                // value: seconds, or u64::MAX for "off".
                let l = (value != u64::MAX).then(|| Duration::from_secs(value.min(3600)));
                stack.tcp_set_linger(h.expect("conn"), l)
            }
            (opt::SOL_SOCKET, opt::SO_RCVBUF) => match (s.role, h) {
                (Role::Udp, Some(h)) => {
                    let max = self.limits.max_rcvbuf;
                    if value > max as u64 {
                        self.stats.quota_rcvbuf += 1;
                    }
                    stack.udp_set_recv_buffer(h, value.min(max as u64) as usize)
                }
                _ => Ok(()),
            },
            // The stack's limit behind the shared ring, as Linux's (doubled).
            (opt::SOL_SOCKET, opt::SO_SNDBUF) if tcp_conn => {
                s.sndbuf_set = true;
                stack.tcp_set_send_buffer(
                    h.expect("conn"),
                    usnet_stack::sndbuf_for_option(value.min(i32::MAX as u64) as i32),
                )
            }
            (opt::IPPROTO_TCP, opt::TCP_NOTSENT_LOWAT) if tcp_conn => {
                s.sndbuf_set = true;
                stack.tcp_set_notsent_lowat(h.expect("conn"), value.min(u64::from(u32::MAX)) as u32)
            }
            (opt::IPPROTO_TCP, opt::TCP_NOTSENT_LOWAT) => Ok(()),
            (opt::SOL_SOCKET, opt::SO_SNDBUF | opt::SO_REUSEADDR | opt::SO_KEEPALIVE)
            | (opt::SOL_SOCKET, opt::SO_LINGER) => Ok(()),
            (level, name) if is_udp_opt(level, name) => match (s.role, h) {
                (Role::Udp, Some(h)) => apply_udp_opt(stack, h, a),
                (Role::Udp, None) => {
                    // Not in the stack yet: applied when it is.
                    s.deferred.push(*a);
                    Ok(())
                }
                _ => Ok(()),
            },
            (opt::SOL_USNET, opt::USNET_WRITE_PENDING) if tcp_conn => {
                stack.tcp_set_write_pending(h.expect("conn"), value != 0)
            }
            (opt::SOL_USNET, opt::USNET_RX_PRIORITY) => {
                let Some(h) = h.filter(|_| matches!(s.role, Role::Udp | Role::Listener)) else {
                    return -errno::EINVAL;
                };
                let mark = (value != opt::RX_PRIORITY_NONE)
                    .then(|| (value as i64).clamp(i32::MIN as i64, i32::MAX as i64) as i32);
                if let Some(p) = mark {
                    // Ranking above its own process is raising a priority.
                    let own = usnet_driver::sched::nice_of(self.pid).map_or(0, |n| -n);
                    if p > own && !usnet_driver::sched::pid_may_raise(self.pid, -p) {
                        return -errno::EPERM;
                    }
                }
                stack.set_socket_priority(h, mark)
            }
            _ => return -errno::ENOPROTOOPT,
        };
        if tcp_conn {
            // SO_SNDBUF and TCP_NOTSENT_LOWAT change how writes meet the stack.
            self.send_flags(stack, i);
        }
        match r {
            Ok(()) => 0,
            Err(e) => err(e),
        }
    }

    pub(super) fn op_getsockopt(&mut self, stack: &mut Stack, i: u32, a: &[u64; 6]) -> i64 {
        let (level, name) = (a[0], a[1]);
        let ring = self.mem.geometry().ring_bytes as i64;
        let s = self.sock(i);
        let h = s.handle;
        let conn = (s.kind == KIND_TCP && s.role == Role::Conn)
            .then_some(h)
            .flatten();
        match (level, name) {
            (opt::SOL_SOCKET, opt::SO_ERROR) => {
                let e = self.mem.slot_word(i, slot::ERROR).swap(0, AcqRel);
                e as i64
            }
            (opt::SOL_SOCKET, opt::SO_RCVBUF | opt::SO_SNDBUF) => ring,
            (opt::IPPROTO_TCP, opt::TCP_MAXSEG) => match conn.map(|h| stack.tcp_info(h)) {
                Some(Ok(info)) => info.snd_mss as i64,
                _ => stack.tcp_config().mss as i64,
            },
            (opt::SOL_USNET, opt::USNET_FASTOPEN_READY) => {
                let ready = SockAddr::from_args(&[a[2], a[3], a[4], a[5], 0, 0])
                    .to_std()
                    .is_some_and(|r| stack.tcp_fastopen_ready(r.ip()));
                (stack.tcp_fastopen_client_enabled() as i64) | (ready as i64) << 1
            }
            (opt::IPPROTO_TCP, opt::TCP_INFO) => {
                let Some(Ok(info)) = conn.map(|h| stack.tcp_info(h)) else {
                    return -errno::ENOTCONN;
                };
                let mut b = [0u8; tcp_info::LEN];
                let mut put =
                    |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_le_bytes());
                let us = |d: Duration| d.as_micros().min(u32::MAX as u128) as u32;
                put(tcp_info::STATE, u32::from(info.linux_state()));
                put(tcp_info::RTT_US, info.srtt.map_or(0, us));
                put(tcp_info::RTTVAR_US, us(info.rttvar));
                put(tcp_info::RTO_US, us(info.rto));
                put(tcp_info::SND_MSS, info.snd_mss);
                put(tcp_info::RCV_MSS, info.rcv_mss);
                put(tcp_info::CWND, info.cwnd);
                put(tcp_info::SSTHRESH, info.ssthresh);
                put(tcp_info::BYTES_IN_FLIGHT, info.bytes_in_flight);
                put(tcp_info::TOTAL_RETRANS, info.total_retransmits as u32);
                put(tcp_info::SND_WND, info.snd_wnd);
                put(tcp_info::RCV_WND, info.rcv_wnd);
                put(tcp_info::MIN_RTT_US, info.min_rtt.map_or(0, us));
                let (ws, wr) = info.wscale.unwrap_or((0, 0));
                put(
                    tcp_info::CA_OPTIONS,
                    u32::from_le_bytes([
                        info.linux_ca_state(),
                        info.linux_options(),
                        (ws & 0xf) | ((wr & 0xf) << 4),
                        info.backoff.min(255) as u8,
                    ]),
                );
                let mss = info.snd_mss.max(1);
                put(tcp_info::SACKED, info.sacked_bytes.div_ceil(mss));
                put(tcp_info::LOST, info.lost_out);
                put(tcp_info::RETRANS, info.retrans_out);
                put(tcp_info::REORDERING, info.reordering);
                put(tcp_info::REORD_SEEN, info.reord_seen);
                put(tcp_info::RCV_SPACE, info.rcv_space);
                put(
                    tcp_info::LAST_DATA_RECV_MS,
                    info.last_data_recv.as_millis().min(u32::MAX as u128) as u32,
                );
                put(
                    tcp_info::DELIVERED,
                    info.delivered.min(u32::MAX as u64) as u32,
                );
                for (off, d) in [
                    (tcp_info::BUSY_US, info.busy_time),
                    (tcp_info::RWND_LIMITED_US, info.rwnd_limited),
                    (tcp_info::SNDBUF_LIMITED_US, info.sndbuf_limited),
                ] {
                    let v = d.as_micros().min(u64::MAX as u128) as u64;
                    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
                let limited = if info.delivery_rate_app_limited {
                    tcp_info::APP_LIMITED
                } else {
                    0
                };
                for (off, v) in [
                    (tcp_info::PACING_RATE, info.pacing_rate),
                    (
                        tcp_info::DELIVERY_RATE,
                        (info.delivery_rate & !tcp_info::APP_LIMITED) | limited,
                    ),
                ] {
                    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
                self.mem.write_info(i, &b);
                tcp_info::LEN as i64
            }
            _ => -errno::ENOPROTOOPT,
        }
    }
}

/// The IP header options a TCP socket keeps per family ([`usnet_stack::TcpIpOpts`]).
fn tcp_ip_opt(level: u64, name: u64) -> bool {
    matches!(
        (level, name),
        (opt::IPPROTO_IP, opt::IP_TOS | opt::IP_TTL | opt::IP_MINTTL)
            | (
                opt::IPPROTO_IPV6,
                opt::IPV6_TCLASS | opt::IPV6_UNICAST_HOPS | opt::IPV6_MINHOPCOUNT
            )
    )
}

/// The options of a UDP socket the stack keeps: its IP header's and multicast's
/// (`usnet_session_abi::opt`).
fn is_udp_opt(level: u64, name: u64) -> bool {
    match level {
        opt::IPPROTO_IP => matches!(
            name,
            opt::IP_TTL
                | opt::IP_TOS
                | opt::IP_RECVERR
                | opt::IP_MULTICAST_IF
                | opt::IP_MULTICAST_TTL
                | opt::IP_MULTICAST_LOOP
                | opt::IP_ADD_MEMBERSHIP
                | opt::IP_DROP_MEMBERSHIP
                | opt::IP_MULTICAST_ALL
        ),
        opt::IPPROTO_IPV6 => matches!(
            name,
            opt::IPV6_UNICAST_HOPS
                | opt::IPV6_TCLASS
                | opt::IPV6_MTU
                | opt::IPV6_RECVERR
                | opt::IPV6_MULTICAST_HOPS
                | opt::IPV6_MULTICAST_LOOP
                | opt::IPV6_ADD_MEMBERSHIP
                | opt::IPV6_DROP_MEMBERSHIP
                | opt::IPV6_MULTICAST_ALL
        ),
        opt::SOL_RAW => name == opt::ICMP_FILTER,
        opt::IPPROTO_ICMPV6 => name == opt::ICMP6_FILTER,
        _ => false,
    }
}

/// A UDP option ([`is_udp_opt`]) on stack socket `h` (`a`: the SETSOCKOPT
/// arguments).
fn apply_udp_opt(stack: &mut Stack, h: SocketHandle, a: &[u64; 6]) -> Result<(), StackError> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use usnet_stack::IpFamily;
    let v4 = IpAddr::V4(Ipv4Addr::from((a[2] as u32).to_be_bytes()));
    let v6 = IpAddr::V6(Ipv6Addr::from((u128::from(a[2]) << 64) | u128::from(a[3])));
    let ttl = a[2].min(255) as u8;
    let unicast_ttl = u8::try_from(a[2]).ok();
    match (a[0], a[1]) {
        (opt::IPPROTO_IP, opt::IP_TTL) => stack.udp_set_unicast_ttl(h, true, unicast_ttl),
        (opt::IPPROTO_IPV6, opt::IPV6_UNICAST_HOPS) => {
            stack.udp_set_unicast_ttl(h, false, unicast_ttl)
        }
        (opt::SOL_RAW, opt::ICMP_FILTER) => {
            let mut f = usnet_stack::IcmpFilter::default();
            f.0[0] = a[2] as u32;
            stack.raw_set_icmp_filter(h, f)
        }
        (opt::IPPROTO_ICMPV6, opt::ICMP6_FILTER) => {
            let mut f = usnet_stack::IcmpFilter::default();
            for (i, w) in a[2..6].iter().enumerate() {
                f.0[2 * i] = *w as u32;
                f.0[2 * i + 1] = (*w >> 32) as u32;
            }
            stack.raw_set_icmp_filter(h, f)
        }
        (opt::IPPROTO_IP, opt::IP_TOS) => stack.udp_set_tos(h, true, a[2] as u8),
        (opt::IPPROTO_IPV6, opt::IPV6_TCLASS) => stack.udp_set_tos(h, false, a[2] as u8),
        (opt::IPPROTO_IPV6, opt::IPV6_MTU) => {
            let bytes = usize::try_from(a[2]).map_err(|_| StackError::InvalidInput)?;
            stack.udp_set_frag_size_v6(h, bytes)
        }
        (opt::IPPROTO_IP, opt::IP_RECVERR) => stack.udp_set_recverr(h, IpFamily::V4, a[2] != 0),
        (opt::IPPROTO_IPV6, opt::IPV6_RECVERR) => stack.udp_set_recverr(h, IpFamily::V6, a[2] != 0),
        (opt::IPPROTO_IP, opt::IP_ADD_MEMBERSHIP) => stack.udp_join_multicast(h, v4),
        (opt::IPPROTO_IP, opt::IP_DROP_MEMBERSHIP) => stack.udp_leave_multicast(h, v4),
        (opt::IPPROTO_IPV6, opt::IPV6_ADD_MEMBERSHIP) => stack.udp_join_multicast(h, v6),
        (opt::IPPROTO_IPV6, opt::IPV6_DROP_MEMBERSHIP) => stack.udp_leave_multicast(h, v6),
        (opt::IPPROTO_IP, opt::IP_MULTICAST_IF) => match v4 {
            IpAddr::V4(a) => stack.udp_set_multicast_if(h, Some(a)),
            IpAddr::V6(_) => unreachable!(),
        },
        (opt::IPPROTO_IP, opt::IP_MULTICAST_TTL) => stack.udp_set_multicast_ttl(h, true, ttl),
        (opt::IPPROTO_IPV6, opt::IPV6_MULTICAST_HOPS) => stack.udp_set_multicast_ttl(h, false, ttl),
        (opt::IPPROTO_IP, opt::IP_MULTICAST_LOOP) => {
            stack.udp_set_multicast_loop(h, true, a[2] != 0)
        }
        (opt::IPPROTO_IPV6, opt::IPV6_MULTICAST_LOOP) => {
            stack.udp_set_multicast_loop(h, false, a[2] != 0)
        }
        (_, opt::IP_MULTICAST_ALL | opt::IPV6_MULTICAST_ALL) => {
            stack.udp_set_multicast_all(h, a[2] != 0)
        }
        _ => Err(StackError::InvalidInput),
    }
}

/// UDP options set before the stack socket `h` of `s` existed.
pub(super) fn apply_deferred(stack: &mut Stack, s: &mut SessionSocket, h: SocketHandle) {
    for a in std::mem::take(&mut s.deferred) {
        let _ = apply_udp_opt(stack, h, &a);
    }
}

#[cfg(test)]
mod tests {
    use usnet_session_abi::{errno, op, opt, tcp_info, SockAddr, KIND_TCP, KIND_UDP};

    use crate::fuzzing::{Harness, ADDR};

    fn at(port: u16) -> [u64; 6] {
        let a = SockAddr::from_std((ADDR, port).into()).to_args();
        [a[0], a[1], a[2], a[3], 0, 0]
    }

    #[test]
    fn an_unknown_option_is_enoprotoopt_both_ways() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 0);
        let bogus = [0xdead, 1, 1, 0, 0, 0];
        assert_eq!(h.call(op::SETSOCKOPT, 0, bogus), -errno::ENOPROTOOPT);
        assert_eq!(h.call(op::GETSOCKOPT, 0, bogus), -errno::ENOPROTOOPT);
        h.finish();
    }

    #[test]
    fn tcp_info_needs_a_connection_and_reports_it_established() {
        let mut h = Harness::new();
        h.connected_pair(7110);
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 3);
        let info = [opt::IPPROTO_TCP, opt::TCP_INFO, 0, 0, 0, 0];
        assert_eq!(h.call(op::GETSOCKOPT, 3, info), -errno::ENOTCONN);
        assert_eq!(h.call(op::GETSOCKOPT, 1, info), tcp_info::LEN as i64);
        let mut b = [0u8; tcp_info::LEN];
        h.mem().read_info(1, &mut b);
        let state = u32::from_le_bytes(b[tcp_info::STATE..][..4].try_into().unwrap());
        assert_eq!(state, 1, "TCP_ESTABLISHED");
        h.finish();
    }

    /// TCP_MAXSEG set before `connect` is kept on the slot and caps the MSS the SYN
    /// offers: the accepting side sends segments no larger.
    #[test]
    fn tcp_maxseg_before_connect_caps_the_mss_offered() {
        let mut h = Harness::new();
        let tcp = [KIND_TCP, 0, 0, 0, 0, 0];
        assert_eq!(h.call(op::SOCKET, 0, tcp), 0);
        assert_eq!(h.call(op::SOCKET, 0, tcp), 1);
        assert_eq!(h.call(op::BIND, 0, at(7111)), 0);
        assert_eq!(h.call(op::LISTEN, 0, [4, 0, 0, 0, 0, 0]), 0);
        let maxseg = [opt::IPPROTO_TCP, opt::TCP_MAXSEG, 500, 0, 0, 0];
        assert_eq!(h.call(op::SETSOCKOPT, 1, maxseg), 0);
        assert_eq!(
            h.parts(1).0.socks[1].as_ref().unwrap().connect_mss,
            Some(500)
        );
        assert_eq!(h.call(op::CONNECT, 1, at(7111)), 0);
        for _ in 0..4 {
            h.turn();
        }
        assert_eq!(h.call(op::ACCEPT, 0, [0; 6]), 2);
        let mss = h.call(op::GETSOCKOPT, 2, maxseg);
        assert!(mss > 0 && mss <= 500, "the accepted side's MSS is {mss}");
        h.finish();
    }

    #[test]
    fn a_receive_buffer_past_the_limit_is_cut_and_counted() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]), 0);
        assert_eq!(h.call(op::BIND, 0, at(7112)), 0);
        let rcvbuf = |v| [opt::SOL_SOCKET, opt::SO_RCVBUF, v, 0, 0, 0];
        assert_eq!(h.call(op::SETSOCKOPT, 0, rcvbuf(4096)), 0);
        assert_eq!(h.parts(1).0.stats.quota_rcvbuf, 0);
        assert_eq!(h.call(op::SETSOCKOPT, 0, rcvbuf(1 << 30)), 0);
        assert_eq!(h.parts(1).0.stats.quota_rcvbuf, 1);
        h.finish();
    }

    /// A multicast option on a UDP socket that has no stack socket yet waits on the
    /// slot and is applied when the bind makes one.
    #[test]
    fn a_multicast_option_before_bind_waits_for_the_stack_socket() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_UDP, 0, 0, 0, 0, 0]), 0);
        let ttl = [opt::IPPROTO_IP, opt::IP_MULTICAST_TTL, 5, 0, 0, 0];
        assert_eq!(h.call(op::SETSOCKOPT, 0, ttl), 0);
        let deferred = |h: &mut Harness| h.parts(1).0.socks[0].as_ref().unwrap().deferred.len();
        assert_eq!(deferred(&mut h), 1);
        assert_eq!(h.call(op::BIND, 0, at(7113)), 0);
        assert_eq!(deferred(&mut h), 0, "applied at bind");
        // Bound: applied at once.
        assert_eq!(h.call(op::SETSOCKOPT, 0, ttl), 0);
        assert_eq!(deferred(&mut h), 0);
        h.finish();
    }
}
