//! TCP and ICMP errors between whole stacks on the simulated wire, with a router-like
//! middlebox on the path (`SimNet::middlebox`): path MTU decreases in the middle of
//! bulk transfers (ICMPv4 fragmentation needed, with and without the MTU field, and
//! ICMPv6 packet too big; with and without TSO), forged and stale ICMP errors,
//! connection attempts refused by ICMP, soft errors on established connections, and
//! a black hole that drops large packets without an ICMP (path MTU probing).
//! Every byte of every transfer is checked.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

mod common;

use common::icmp::{icmp_for, inject, set_quoted_seq, tcp_of, Says};
use common::{cfg, sa, transfer_with};
use usnet_socket_api::errno::{EHOSTUNREACH, ENETUNREACH};
use usnet_stack::sim::{Faults, Hop, SimNet};
use usnet_stack::{StackConfig, StackError, TcpState};
use usnet_wire::{self as wire, unreach, unreach_v6};

fn pair(seed: u64, tso: bool, f: impl Fn(&mut StackConfig)) -> SimNet {
    let mut net = SimNet::new(seed, Faults::default());
    for i in 1..=2 {
        let mut c = cfg(i);
        c.tso = tso;
        c.tx_csum_offload = tso;
        f(&mut c);
        net.add(c).unwrap();
    }
    net
}

// ------------------------------------------------------------------ transfers

/// Sends `total` bytes from stack 0 to `server` on stack 1 and closes both ends,
/// checking every byte. `hook` runs every step (to inject frames).
fn transfer(net: &mut SimNet, server: SocketAddr, total: u64, hook: impl FnMut(&mut SimNet)) {
    transfer_with(net, server, total, Duration::from_secs(120), hook);
}

/// What the router saw and did.
#[derive(Default, Debug)]
struct Router {
    /// Bytes of stack 0's TCP payload it forwarded.
    forwarded: u64,
    icmp_sent: u64,
    /// Largest payload forwarded after the last MTU change took effect.
    largest_after: usize,
    /// The last data frame it saw from stack 0.
    last_data: Option<Vec<u8>>,
}

/// A router on the path from stack 0 whose MTU follows `schedule` (forwarded
/// payload bytes → MTU): packets over the MTU are dropped and answered with
/// `says(mtu)`.
fn router(
    schedule: Vec<(u64, usize)>,
    says: impl Fn(usize) -> Says + 'static,
) -> (Rc<RefCell<Router>>, usnet_stack::sim::Middlebox) {
    let r = Rc::new(RefCell::new(Router::default()));
    let r2 = r.clone();
    let mb = Box::new(move |from: usize, frame: &[u8]| {
        let Some(t) = tcp_of(frame) else {
            return Hop::Pass;
        };
        if from != 0 {
            return Hop::Pass;
        }
        let mut r = r2.borrow_mut();
        let mtu = schedule
            .iter()
            .rev()
            .find(|(at, _)| r.forwarded >= *at)
            .map_or(1500, |s| s.1);
        if t.ip_len > mtu {
            r.icmp_sent += 1;
            r.largest_after = 0;
            return Hop::Answer(icmp_for(frame, says(mtu), |_| {}));
        }
        r.forwarded += t.payload as u64;
        r.largest_after = r.largest_after.max(t.payload);
        if t.payload > 0 {
            r.last_data = Some(frame.to_vec());
        }
        Hop::Pass
    });
    (r, mb)
}

#[test]
fn bulk_transfer_continues_at_the_smaller_mss() {
    struct Case {
        name: &'static str,
        server: &'static str,
        tso: bool,
        schedule: Vec<(u64, usize)>,
        says: fn(usize) -> Says,
        decreases: u64,
        /// Largest payload after the last decrease (MTU − headers − timestamps).
        largest: usize,
    }
    let frag = |mtu: usize| Says::Unreach4(unreach::FRAG_NEEDED, mtu as u16);
    let cases = [
        Case {
            name: "v4 1280 from the start",
            server: "10.0.0.2:5001",
            tso: false,
            schedule: vec![(0, 1280)],
            says: frag,
            decreases: 1,
            largest: 1280 - 52,
        },
        Case {
            name: "v4 1500 → 1400 → 1000 mid-transfer, with TSO",
            server: "10.0.0.2:5001",
            tso: true,
            schedule: vec![(300 << 10, 1400), (900 << 10, 1000)],
            says: frag,
            decreases: 2,
            largest: 1000 - 52,
        },
        Case {
            // A pre-RFC 1191 router leaves the MTU 0: the RFC 1191 plateaus below the
            // packet's size are tried, 1492 then 1006.
            name: "v4 without the MTU field",
            server: "10.0.0.2:5001",
            tso: false,
            schedule: vec![(200 << 10, 1200)],
            says: |_| Says::Unreach4(unreach::FRAG_NEEDED, 0),
            decreases: 2,
            largest: 1006 - 52,
        },
        Case {
            name: "v6 packet too big 1280 mid-transfer",
            server: "[fd00::2]:5001",
            tso: false,
            schedule: vec![(500 << 10, 1280)],
            says: |mtu| Says::TooBig6(mtu as u32),
            decreases: 1,
            largest: 1280 - 72,
        },
        Case {
            // Below IPv6's minimum MTU: 1280 is used (RFC 8201), which this path takes.
            name: "v6 packet too big 1300 reported as 1000",
            server: "[fd00::2]:5001",
            tso: true,
            schedule: vec![(0, 1300)],
            says: |_| Says::TooBig6(1000),
            decreases: 1,
            largest: 1280 - 72,
        },
    ];
    for (k, case) in cases.into_iter().enumerate() {
        let mut net = pair(70 + k as u64, case.tso, |_| {});
        let (r, mb) = router(case.schedule, case.says);
        net.middlebox = Some(mb);
        let t0 = net.now();
        transfer(&mut net, sa(case.server), 2 << 20, |_| {});
        let took = net.now().saturating_since(t0);
        let c = net.stack(0).counters_snapshot();
        let r = r.borrow();
        eprintln!(
            "{}: {took:?}, router {:?} icmp {} largest {}; mss lowered {}, not lowered {}, \
             out of window {}, retransmits {}",
            case.name,
            r.forwarded,
            r.icmp_sent,
            r.largest_after,
            c.tcp_icmp_mss_clamped,
            c.tcp_icmp_mtu_not_lowered,
            c.tcp_icmp_out_of_window,
            c.tcp_retransmit_segments
        );
        assert_eq!(c.tcp_icmp_mss_clamped, case.decreases, "{}", case.name);
        assert_eq!(r.largest_after, case.largest, "{}", case.name);
        assert_eq!(c.tcp_icmp_rx, r.icmp_sent, "{}", case.name);
        // Resent at once, not by a timeout; and not taken for congestion.
        assert_eq!(c.tcp_rto_expired, 0, "{}", case.name);
        assert_eq!(c.tcp_fast_recoveries, 0, "{}", case.name);
        assert!(took < Duration::from_secs(1), "{}: {took:?}", case.name);
        assert_eq!(net.stack(1).counters().tcp_rx_bad_checksum, 0);
    }
}

/// What a black hole on the path saw: packets from stack 0 dropped for their
/// size, and the largest it let through.
#[derive(Default, Debug)]
struct Hole {
    dropped: u64,
    largest: usize,
}

/// A router that silently drops stack 0's packets larger than `mtu` (no ICMP: an
/// ICMP black hole, RFC 2923 §2.1).
fn black_hole(mtu: usize) -> (Rc<RefCell<Hole>>, usnet_stack::sim::Middlebox) {
    let h = Rc::new(RefCell::new(Hole::default()));
    let h2 = h.clone();
    let mb = Box::new(move |from: usize, frame: &[u8]| match tcp_of(frame) {
        Some(t) if from == 0 => {
            let mut h = h2.borrow_mut();
            if t.ip_len > mtu {
                h.dropped += 1;
                return Hop::Drop;
            }
            h.largest = h.largest.max(t.ip_len);
            Hop::Pass
        }
        _ => Hop::Pass,
    });
    (h, mb)
}

#[test]
fn a_silent_black_hole_is_survived_by_path_mtu_probing() {
    let cases = [
        ("10.0.0.2:5001", "1", false),
        ("[fd00::2]:5001", "1", true),
        ("10.0.0.2:5001", "2", true),
        ("[fd00::2]:5001", "2", false),
    ];
    for (k, (server, mode, tso)) in cases.into_iter().enumerate() {
        let mut net = pair(90 + k as u64, tso, |c| {
            c.tcp.set_sysctl("tcp_mtu_probing", mode).unwrap();
        });
        let (h, mb) = black_hole(1200);
        net.middlebox = Some(mb);
        transfer(&mut net, sa(server), 2 << 20, |_| {});
        let t = net.stack(0).tcp_stats();
        let h = h.borrow();
        let name = format!("{server} mode {mode} tso {tso}");
        eprintln!(
            "{name}: {h:?}; rto {} black holes {} probes {} ok {} lost {}",
            t.rto_expired,
            t.mtu_black_holes,
            t.mtu_probes,
            t.mtu_probe_successes,
            t.mtu_probe_failures
        );
        assert!(h.largest <= 1200, "{name}");
        let c = net.stack(0).counters_snapshot();
        assert_eq!(c.tcp_mtu_probes, t.mtu_probes, "{name}: in usnet stat");
        assert_eq!(t.pmtu_decreases, 0, "{name}: no ICMP came");
        if mode == "1" {
            // Full-sized segments vanish until timeouts lower the MSS.
            assert!(h.dropped > 0 && t.mtu_black_holes >= 1, "{name}");
        } else {
            // Probing from tcp_base_mss up finds the limit without a timeout.
            assert_eq!((t.rto_expired, t.mtu_black_holes), (0, 0), "{name}");
            assert!(
                t.mtu_probe_successes > 0 && t.mtu_probe_failures > 0,
                "{name}"
            );
            assert!(h.largest > 1200 - 8, "{name}: within tcp_probe_threshold");
        }
    }
}

#[test]
fn stale_forged_and_unknown_flow_icmp_is_ignored_and_counted() {
    for (seed, server) in [(80, "10.0.0.2:5001"), (81, "[fd00::2]:5001")] {
        let mut net = pair(seed, false, |_| {});
        let (r, mb) = router(vec![], |_| unreachable!("no MTU limit"));
        net.middlebox = Some(mb);
        let v4 = sa(server).is_ipv4();
        let mut done = false;
        let r2 = r.clone();
        transfer(&mut net, sa(server), 1 << 20, |n| {
            let Some(f) = r2.borrow().last_data.clone() else {
                return;
            };
            if done || r2.borrow().forwarded < (300 << 10) {
                return;
            }
            done = true;
            let seq = tcp_of(&f).unwrap().seq;
            let too_big = if v4 {
                Says::Unreach4(unreach::FRAG_NEEDED, 576)
            } else {
                Says::TooBig6(1280)
            };
            let host = if v4 {
                Says::Unreach4(unreach::HOST, 0)
            } else {
                Says::Unreach6(unreach_v6::ADDR)
            };
            // Sequence numbers far ahead of and behind what is in flight.
            for s in [seq.wrapping_add(50_000_000), seq.wrapping_sub(10_000_000)] {
                inject(n, 0, &icmp_for(&f, too_big, |q| set_quoted_seq(q, s)));
                inject(n, 0, &icmp_for(&f, host, |q| set_quoted_seq(q, s)));
            }
            // A flow we do not have (another destination port).
            let other_port = |q: &mut Vec<u8>| {
                let l4 = if v4 { 20 } else { 40 };
                q[l4 + 2..l4 + 4].copy_from_slice(&9u16.to_be_bytes());
            };
            inject(n, 0, &icmp_for(&f, too_big, other_port));
            // Too short to name a flow, and a quote of UDP: not TCP's business.
            inject(
                n,
                0,
                &icmp_for(&f, host, |q| q.truncate(if v4 { 24 } else { 44 })),
            );
            inject(
                n,
                0,
                &icmp_for(&f, host, |q| {
                    if v4 {
                        q[9] = wire::IPPROTO_UDP;
                    } else {
                        q[6] = wire::IPPROTO_UDP;
                    }
                }),
            );
        });
        assert!(done);
        let c = net.stack(0).counters_snapshot();
        assert_eq!(c.tcp_icmp_rx, 5, "{server}");
        assert_eq!(c.tcp_icmp_out_of_window, 4, "{server}");
        assert_eq!(c.tcp_icmp_no_conn, 1, "{server}");
        assert_eq!(c.tcp_icmp_mss_clamped, 0, "{server}");
        assert_eq!(c.tcp_icmp_soft_errors, 0, "{server}");
        let full = if v4 { 1448 } else { 1428 };
        assert_eq!(r.borrow().largest_after, full, "{server}: MSS unchanged");
        assert_eq!(c.tcp_rto_expired, 0);
    }
}

#[test]
fn host_unreachable_in_established_does_not_abort() {
    for (seed, server) in [(90, "10.0.0.2:5001"), (91, "[fd00::2]:5001")] {
        let v4 = sa(server).is_ipv4();
        let mut net = pair(seed, false, |_| {});
        // The router loses its route twice for one packet each (host unreachable,
        // then port unreachable, a hard error before the handshake), then recovers.
        let n = Rc::new(RefCell::new(0u32));
        let n2 = n.clone();
        net.middlebox = Some(Box::new(move |from, frame| {
            let Some(t) = tcp_of(frame) else {
                return Hop::Pass;
            };
            if from != 0 || t.payload == 0 {
                return Hop::Pass;
            }
            *n2.borrow_mut() += 1;
            let says = match (*n2.borrow(), v4) {
                (50, true) => Says::Unreach4(unreach::HOST, 0),
                (80, true) => Says::Unreach4(unreach::PORT, 0),
                (50, false) => Says::Unreach6(unreach_v6::ADDR),
                (80, false) => Says::Unreach6(unreach_v6::PORT),
                _ => return Hop::Pass,
            };
            Hop::Answer(icmp_for(frame, says, |_| {}))
        }));
        transfer(&mut net, sa(server), 1 << 20, |_| {});
        let c = net.stack(0).counters_snapshot();
        assert_eq!(c.tcp_icmp_soft_errors, 2, "{server}");
        assert_eq!(c.tcp_icmp_hard_errors, 0, "{server}");
        assert_eq!(c.tcp_conn_timeouts, 0, "{server}");
    }
}

#[test]
fn a_soft_error_is_what_a_later_timeout_reports() {
    for (seed, server, want) in [
        (95, "10.0.0.2:5001", StackError::HostUnreachable),
        (96, "[fd00::2]:5001", StackError::NetUnreachable),
    ] {
        let v4 = sa(server).is_ipv4();
        let mut net = pair(seed, false, |c| c.tcp.max_retries = 3);
        // The first data segment meets a dead route, and so does everything after it.
        net.middlebox = Some(Box::new(move |from, frame| match tcp_of(frame) {
            Some(t) if from == 0 && t.payload > 0 => {
                let says = if v4 {
                    Says::Unreach4(unreach::HOST, 0)
                } else {
                    Says::Unreach6(unreach_v6::NO_ROUTE)
                };
                Hop::Answer(icmp_for(frame, says, |_| {}))
            }
            _ => Hop::Pass,
        }));
        let l = net.stack_mut(1).tcp_listen(sa(server), 4).unwrap();
        let c = net.stack_mut(0).tcp_connect(None, sa(server)).unwrap();
        assert!(net.run_until(Duration::from_secs(2), |n| n
            .stack(0)
            .readiness(c)
            .unwrap()
            .connected));
        net.stack_mut(0).tcp_send(c, &[1u8; 3000]).unwrap();
        net.run_for(Duration::from_millis(100));
        assert_eq!(net.stack(0).tcp_state(c).unwrap(), TcpState::Established);
        assert_eq!(net.stack(0).tcp_error(c).unwrap(), None);
        assert!(net.run_until(Duration::from_secs(600), |n| n
            .stack(0)
            .readiness(c)
            .unwrap()
            .closed));
        assert_eq!(net.stack(0).tcp_error(c).unwrap(), Some(want), "{server}");
        assert_eq!(
            net.stack_mut(0).tcp_send(c, b"x"),
            Err(want),
            "{server}: the socket reports it"
        );
        assert_eq!(want.errno(), if v4 { EHOSTUNREACH } else { ENETUNREACH });
        let _ = net.stack_mut(0).tcp_close(c);
        let _ = net.stack_mut(1).tcp_close(l);
    }
}

#[test]
fn connect_answered_by_icmp_unreachable_fails_at_once() {
    let cases: [(&str, Says, Option<StackError>); 8] = [
        (
            "10.0.0.2:7",
            Says::Unreach4(unreach::PORT, 0),
            Some(StackError::ConnectionRefused),
        ),
        (
            "[fd00::2]:7",
            Says::Unreach6(unreach_v6::PORT),
            Some(StackError::ConnectionRefused),
        ),
        (
            "10.0.0.2:7",
            Says::Unreach4(unreach::PROTO, 0),
            Some(StackError::ConnectionRefused),
        ),
        (
            "10.0.0.2:7",
            Says::Unreach4(unreach::HOST, 0),
            Some(StackError::HostUnreachable),
        ),
        (
            "10.0.0.2:7",
            Says::Unreach4(unreach::ADMIN_PROHIBITED, 0),
            Some(StackError::HostUnreachable),
        ),
        (
            "10.0.0.2:7",
            Says::Unreach4(unreach::NET, 0),
            Some(StackError::NetUnreachable),
        ),
        (
            "[fd00::2]:7",
            Says::Unreach6(unreach_v6::ADMIN_PROHIBITED),
            Some(StackError::HostUnreachable),
        ),
        // Time exceeded is soft even now: the attempt goes on.
        ("10.0.0.2:7", Says::TimeExceeded, None),
    ];
    for (k, (server, says, want)) in cases.into_iter().enumerate() {
        let mut net = pair(100 + k as u64, false, |_| {});
        net.middlebox = Some(Box::new(move |from, frame| match tcp_of(frame) {
            Some(t) if from == 0 && t.syn && t.dport == 7 => {
                Hop::Answer(icmp_for(frame, says, |_| {}))
            }
            _ => Hop::Pass,
        }));
        let c = net.stack_mut(0).tcp_connect(None, sa(server)).unwrap();
        // Well before the first SYN retransmission (1 s).
        net.run_for(Duration::from_millis(20));
        let r = net.stack(0).readiness(c).unwrap();
        let got = net.stack(0).tcp_error(c).unwrap();
        assert_eq!(got, want, "{server} {says:?}");
        assert_eq!(r.closed, want.is_some(), "{server} {says:?}");
        if let Some(e) = want {
            assert_eq!(net.stack_mut(0).tcp_send(c, b"x"), Err(e));
            let cs = net.stack(0).counters_snapshot();
            assert_eq!(cs.tcp_icmp_hard_errors, 1);
            assert_eq!(cs.tcp_syn_retransmits, 0);
        } else {
            assert_eq!(net.stack(0).tcp_state(c).unwrap(), TcpState::SynSent);
            assert_eq!(net.stack(0).counters_snapshot().tcp_icmp_soft_errors, 1);
        }
        net.stack_mut(0).tcp_close(c).unwrap();
    }
}

#[test]
fn forged_port_unreachable_does_not_stop_a_connect() {
    for (seed, server) in [(110, "10.0.0.2:5001"), (111, "[fd00::2]:5001")] {
        let v4 = sa(server).is_ipv4();
        let mut net = pair(seed, false, |_| {});
        // The first SYN is lost and a blind attacker answers it with a port
        // unreachable whose quoted sequence number is a guess.
        let first = Rc::new(RefCell::new(true));
        net.middlebox = Some(Box::new(move |from, frame| match tcp_of(frame) {
            Some(t) if from == 0 && t.syn && std::mem::take(&mut *first.borrow_mut()) => {
                let says = if v4 {
                    Says::Unreach4(unreach::PORT, 0)
                } else {
                    Says::Unreach6(unreach_v6::PORT)
                };
                let guess = t.seq.wrapping_add(12345);
                Hop::Answer(icmp_for(frame, says, |q| set_quoted_seq(q, guess)))
            }
            _ => Hop::Pass,
        }));
        let l = net.stack_mut(1).tcp_listen(sa(server), 4).unwrap();
        let c = net.stack_mut(0).tcp_connect(None, sa(server)).unwrap();
        assert!(net.run_until(Duration::from_secs(5), |n| n
            .stack(0)
            .readiness(c)
            .unwrap()
            .connected));
        let cs = net.stack(0).counters_snapshot();
        assert_eq!(cs.tcp_icmp_out_of_window, 1);
        assert_eq!(cs.tcp_syn_retransmits, 1);
        net.stack_mut(0).tcp_close(c).unwrap();
        net.stack_mut(1).tcp_close(l).unwrap();
    }
}
