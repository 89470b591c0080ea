//! Priority-aware receive in virtual time: the priority set (ranking, ties, close,
//! outranking, local conversations, the interval), forced drop under a synthetic
//! burst, and the boost/restore requests of priority control.

use std::net::SocketAddr;
use std::time::Duration;

use usnet_stack::{
    mac_from_seed, Instant, Owner, OwnerInfo, RxPolicy, SchedRequest, SocketHandle, Stack,
    StackConfig,
};

fn cfg(i: u8, policy: RxPolicy, input_queue_len: usize) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64 * 31,
        input_queue_len,
        rx_policy: policy,
        ..Default::default()
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn both() -> RxPolicy {
    RxPolicy {
        forced_drop: true,
        priority: true,
        ..RxPolicy::default()
    }
}

fn ms(n: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(n)
}

/// Moves every frame `from` has queued to `to`'s entrance (copied between pools).
fn carry(from: &mut Stack, to: &mut Stack) -> usize {
    let mut n = 0;
    while let Some(b) = from.dequeue_tx() {
        let copy = to
            .pool_mut()
            .alloc_from(from.pool().data(&b))
            .expect("buffer");
        from.pool_mut().free(b);
        to.receive(copy);
        n += 1;
    }
    n
}

/// Two stacks, 10.0.0.1 (sender) and 10.0.0.2 (receiver), with the sender's ARP
/// resolved.
fn pair(policy: RxPolicy, input_queue_len: usize) -> (Stack, Stack) {
    let mut a = Stack::new(cfg(1, RxPolicy::default(), 1000)).unwrap();
    let mut b = Stack::new(cfg(2, policy, input_queue_len)).unwrap();
    let s = a.udp_bind(sa("10.0.0.1:5000")).unwrap();
    let sink = b.udp_bind(sa("10.0.0.2:9")).unwrap();
    a.udp_send_to(s, b"x", sa("10.0.0.2:9")).unwrap();
    for t in 1..20 {
        a.poll(ms(t));
        b.poll(ms(t));
        carry(&mut a, &mut b);
        carry(&mut b, &mut a);
    }
    let mut buf = [0u8; 8];
    assert!(b.udp_recv_from(sink, &mut buf).is_ok(), "the ARP exchange");
    b.close(sink).unwrap();
    a.close(s).unwrap();
    (a, b)
}

fn bind_owned(s: &mut Stack, port: u16, owner: u32, prio: i32) -> SocketHandle {
    let h = s.udp_bind(sa(&format!("10.0.0.2:{port}"))).unwrap();
    s.set_owner(h, Owner(owner)).unwrap();
    s.set_owner_info(
        Owner(owner),
        OwnerInfo {
            pid: Some(1000 + owner),
            priority: prio,
        },
    );
    h
}

fn ports(s: &mut Stack) -> Vec<u16> {
    s.prio_status().ports
}

#[test]
fn the_set_holds_the_top_n_by_priority() {
    let mut s = Stack::new(cfg(2, both(), 1000)).unwrap();
    bind_owned(&mut s, 7001, 1, 0);
    bind_owned(&mut s, 7002, 2, 5);
    bind_owned(&mut s, 7003, 3, 3);
    bind_owned(&mut s, 7004, 4, -2);
    assert_eq!(ports(&mut s), vec![7002, 7003]);
    let st = s.prio_status();
    assert_eq!(st.members[0].priority, 5);
    assert_eq!(st.members[0].pid, Some(1002));
    // A better nice value for owner 4 (a server refreshes it): it outranks 3.
    s.set_owner_info(
        Owner(4),
        OwnerInfo {
            pid: Some(1004),
            priority: 9,
        },
    );
    assert_eq!(ports(&mut s), vec![7002, 7004]);
}

#[test]
fn ties_go_to_the_older_socket() {
    let mut s = Stack::new(cfg(2, both(), 1000)).unwrap();
    for p in [7005, 7001, 7003] {
        s.udp_bind(sa(&format!("0.0.0.0:{p}"))).unwrap();
    }
    assert_eq!(ports(&mut s), vec![7001, 7005]);
    let st = s.prio_status();
    assert_eq!(st.members[0].port, 7005, "the oldest ranks first");
}

#[test]
fn an_older_socket_that_comes_to_tie_a_member_takes_its_place() {
    let policy = RxPolicy {
        set_size: 1,
        ..both()
    };
    let mut s = Stack::new(cfg(2, policy, 1000)).unwrap();
    let a = bind_owned(&mut s, 7001, 1, 0);
    let _b = bind_owned(&mut s, 7002, 1, 0);
    assert_eq!(ports(&mut s), vec![7001]);
    // a marked below its owner: b takes its place...
    s.set_socket_priority(a, Some(-3)).unwrap();
    assert_eq!(ports(&mut s), vec![7002]);
    // ... and the mark taken back, a ties b and is older: S changes back at once,
    // not only at the next interval.
    s.set_socket_priority(a, None).unwrap();
    assert_eq!(ports(&mut s), vec![7001]);
}

#[test]
fn a_member_that_closes_is_replaced_and_a_marked_socket_outranks() {
    let mut s = Stack::new(cfg(2, both(), 1000)).unwrap();
    let a = bind_owned(&mut s, 7001, 1, 4);
    let _b = bind_owned(&mut s, 7002, 2, 3);
    let c = bind_owned(&mut s, 7003, 3, 1);
    assert_eq!(ports(&mut s), vec![7001, 7002]);
    s.close(a).unwrap();
    assert_eq!(ports(&mut s), vec![7002, 7003]);
    let before = s.counters().prio_set_recomputed;
    // A mark that does not outrank anyone changes nothing.
    s.set_socket_priority(c, Some(2)).unwrap();
    let d = s.udp_bind(sa("10.0.0.2:7004")).unwrap();
    s.prio_status();
    assert_eq!(ports(&mut s), vec![7002, 7003]);
    // An explicit mark outranks the owners' priorities.
    s.set_socket_priority(d, Some(50)).unwrap();
    assert_eq!(ports(&mut s), vec![7002, 7004]);
    assert!(s.counters().prio_set_recomputed > before);
    // A TCP listener is a candidate too.
    let l = s.tcp_listen(sa("10.0.0.2:80"), 8).unwrap();
    s.set_socket_priority(l, Some(60)).unwrap();
    assert_eq!(ports(&mut s), vec![80, 7004]);
    s.close(l).unwrap();
    assert_eq!(ports(&mut s), vec![7002, 7004]);
}

#[test]
fn an_owner_talking_locally_lends_its_priority() {
    let mut s = Stack::new(cfg(2, both(), 1000)).unwrap();
    bind_owned(&mut s, 7001, 1, 0);
    bind_owned(&mut s, 7002, 2, 1);
    bind_owned(&mut s, 7003, 3, 2);
    assert_eq!(ports(&mut s), vec![7002, 7003]);
    // Owner 4 (priority 8) talks to owner 1's port through our own address.
    let c = bind_owned(&mut s, 7100, 4, 8);
    s.udp_connect(c, sa("10.0.0.2:7001")).unwrap();
    // Picked up by the once-per-interval recomputation, not per packet.
    s.poll(ms(10));
    let st = s.prio_status();
    let ports: Vec<u16> = st.members.iter().map(|m| m.port).collect();
    // Both rank 8 now; the older socket first.
    assert_eq!(ports, vec![7001, 7100], "{st:?}");
    assert_eq!(st.members[0].priority, 8);
}

/// A burst of `n` datagrams alternating between ports 7001 (in P) and 7002 (not),
/// handed to the receiver's entrance at once (no processing in between).
fn burst(a: &mut Stack, b: &mut Stack, n: usize, t: u64) {
    b.poll(ms(t));
    let s = a.udp_bind(sa("10.0.0.1:0")).unwrap();
    for i in 0..n {
        let port = if i % 2 == 0 { 7001 } else { 7002 };
        a.udp_send_to(s, &[7u8; 64], sa(&format!("10.0.0.2:{port}")))
            .unwrap();
        if a.tx_len() >= 512 {
            carry(a, b);
        }
    }
    carry(a, b);
    a.close(s).unwrap();
    b.poll(ms(t));
    while b.input_len() > 0 {
        b.poll(ms(t));
    }
}

fn drain(b: &mut Stack, h: SocketHandle) -> u64 {
    let mut n = 0;
    let mut buf = [0u8; 128];
    while b.udp_recv_from(h, &mut buf).is_ok() {
        n += 1;
    }
    n
}

fn receivers(b: &mut Stack) -> (SocketHandle, SocketHandle) {
    let q = bind_owned(b, 7001, 1, 5);
    let o = bind_owned(b, 7002, 2, 0);
    // n = 1: only 7001 is in P.
    (q, o)
}

#[test]
fn forced_drop_spares_the_priority_port_under_a_burst() {
    let policy = RxPolicy {
        forced_drop: true,
        set_size: 1,
        drop_probability: 1.0,
        ..RxPolicy::default()
    };
    let run = |policy: RxPolicy| {
        let (mut a, mut b) = pair(policy, 100);
        let (q, o) = receivers(&mut b);
        b.poll(ms(100));
        burst(&mut a, &mut b, 400, 100);
        let c = b.counters().clone();
        (drain(&mut b, q), drain(&mut b, o), c)
    };
    let (q0, o0, c0) = run(RxPolicy::default());
    let (q1, o1, c1) = run(policy);
    // Without the policy the input queue (100) takes the first 100 frames, half each.
    assert_eq!((q0, o0), (50, 50));
    assert_eq!(c0.drop_input_queue_full, 300);
    // With it: from the threshold (50) on, only frames for P enter.
    // Frames 50..400: the 175 for 7002 are forced out, the first 50 of the 175 for
    // 7001 fill the queue and the other 125 meet drop 1.
    assert_eq!(q1, 25 + 50, "{c1:?}");
    assert_eq!(o1, 25);
    assert_eq!(c1.prio_forced_drop_activations, 1);
    assert_eq!(c1.prio_forced_drop_threshold, 175);
    assert_eq!(c1.drop_input_queue_full, 125);
    assert_eq!(
        c1.drop_input_queue_full + c1.prio_forced_drop_threshold,
        300
    );
}

#[test]
fn forced_drop_activates_at_most_once_per_interval_and_then_stops() {
    let policy = RxPolicy {
        forced_drop: true,
        set_size: 1,
        drop_probability: 0.5,
        threshold: 1000,
        ..RxPolicy::default()
    };
    let (mut a, mut b) = pair(policy, 100);
    let (q, o) = receivers(&mut b);
    b.poll(ms(100));
    burst(&mut a, &mut b, 400, 100);
    let c = b.counters().clone();
    assert_eq!(c.prio_forced_drop_activations, 1, "activated by drop 1");
    assert_eq!(c.prio_forced_drop_threshold, 0);
    // Probability 0.5 (seeded) of the 150 frames for 7002 after activation.
    assert!((40..110).contains(&c.prio_forced_drop_drop1), "{c:?}");
    assert_eq!(c.prio_forced_drop_drop1 + c.drop_input_queue_full, 300);
    drain(&mut b, q);
    drain(&mut b, o);
    // Active for the interval, but it drops only while a backlog lasts: a lone frame
    // meeting an empty queue passes.
    let before = b.counters().prio_forced_drop_drop1;
    let s = a.udp_bind(sa("10.0.0.1:0")).unwrap();
    for t in 500..520 {
        a.udp_send_to(s, b"x", sa("10.0.0.2:7002")).unwrap();
        carry(&mut a, &mut b);
        b.poll(ms(t));
    }
    a.close(s).unwrap();
    assert!(b.prio_status().forced_drop_active);
    assert_eq!(b.counters().prio_forced_drop_drop1, before);
    assert_eq!(drain(&mut b, o), 20);
    // Still within the interval (1 s): a second burst does not look again.
    burst(&mut a, &mut b, 400, 900);
    assert_eq!(b.counters().prio_forced_drop_activations, 1);
    assert!(b.prio_status().forced_drop_active);
    drain(&mut b, q);
    drain(&mut b, o);
    // After it: a quiet queue leaves forced drop off...
    b.poll(ms(1200));
    assert!(!b.prio_status().forced_drop_active);
    let before = b.counters().prio_forced_drop_drop1;
    let s = a.udp_bind(sa("10.0.0.1:0")).unwrap();
    a.udp_send_to(s, b"y", sa("10.0.0.2:7002")).unwrap();
    carry(&mut a, &mut b);
    b.poll(ms(1200));
    assert_eq!(b.counters().prio_forced_drop_drop1, before);
    assert_eq!(drain(&mut b, o), 1);
    // ... and the next burst activates it again.
    burst(&mut a, &mut b, 400, 1300);
    assert_eq!(b.counters().prio_forced_drop_activations, 2);
}

#[test]
fn forced_drop_never_touches_other_traffic_or_an_empty_set() {
    // Nothing bound: P is empty, so nothing is forced out (drop 1 only).
    let (mut a, mut b) = pair(
        RxPolicy {
            forced_drop: true,
            ..RxPolicy::default()
        },
        100,
    );
    burst(&mut a, &mut b, 400, 100);
    let c = b.counters();
    assert_eq!(c.prio_forced_drop_drop1 + c.prio_forced_drop_threshold, 0);
    assert_eq!(c.drop_input_queue_full, 300);
}

fn small_queue(b: &mut Stack, h: SocketHandle) {
    // 32 datagrams of 64 bytes fill it; half is passed at the 17th.
    b.udp_set_recv_buffer(h, 2048).unwrap();
}

fn deliver(a: &mut Stack, b: &mut Stack, n: usize, t: u64) {
    let s = a.udp_bind(sa("10.0.0.1:0")).unwrap();
    for _ in 0..n {
        a.udp_send_to(s, &[1u8; 64], sa("10.0.0.2:7001")).unwrap();
    }
    carry(a, b);
    a.close(s).unwrap();
    b.poll(ms(t));
}

#[test]
fn priority_control_boosts_past_half_and_restores_when_drained() {
    let policy = RxPolicy {
        priority: true,
        set_size: 1,
        boost: 7,
        ..RxPolicy::default()
    };
    let (mut a, mut b) = pair(policy, 1000);
    let (q, _o) = receivers(&mut b);
    small_queue(&mut b, q);
    b.poll(ms(100));
    let mut reqs = Vec::new();
    deliver(&mut a, &mut b, 16, 100);
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty(), "exactly half is not past half");
    deliver(&mut a, &mut b, 1, 100);
    b.take_sched_requests(&mut reqs);
    assert_eq!(
        reqs,
        vec![SchedRequest::Boost {
            pid: 1001,
            steps: 7
        }]
    );
    assert_eq!(b.prio_status().boosted, vec![1001]);
    // The deadline is the boost's end.
    assert!(b.poll_at().is_some_and(|t| t <= ms(1100)));
    reqs.clear();
    // More data while boosted asks nothing more.
    deliver(&mut a, &mut b, 2, 150);
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty());
    // Reading it down below a quarter (512 bytes) is not enough while datagrams
    // keep coming: the burst is not over.
    let mut buf = [0u8; 64];
    for _ in 0..12 {
        b.udp_recv_from(q, &mut buf).unwrap();
    }
    b.poll(ms(160));
    b.take_sched_requests(&mut reqs);
    assert!(
        reqs.is_empty(),
        "7 of 32 queued, but the last arrival was 10 ms ago"
    );
    deliver(&mut a, &mut b, 1, 165);
    b.udp_recv_from(q, &mut buf).unwrap();
    b.poll(ms(184));
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty(), "an arrival at 165 ms: quiet until 185 ms");
    // The deadline is the end of the quiet time.
    assert_eq!(b.poll_at(), Some(ms(185)));
    b.poll(ms(185));
    b.take_sched_requests(&mut reqs);
    assert_eq!(reqs, vec![SchedRequest::Restore { pid: 1001 }]);
    assert_eq!(b.counters().prio_restores_drained, 1);
    reqs.clear();
    drain(&mut b, q);
    // Within the interval the consumer is not boosted again...
    deliver(&mut a, &mut b, 17, 500);
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty());
    drain(&mut b, q);
    // ... after it, it is.
    deliver(&mut a, &mut b, 17, 1200);
    b.take_sched_requests(&mut reqs);
    assert_eq!(
        reqs,
        vec![SchedRequest::Boost {
            pid: 1001,
            steps: 7
        }]
    );
}

#[test]
fn a_boost_ends_when_its_time_is_up_or_its_socket_leaves_the_set() {
    let policy = RxPolicy {
        priority: true,
        set_size: 1,
        boost_time: Duration::from_millis(300),
        ..RxPolicy::default()
    };
    let (mut a, mut b) = pair(policy, 1000);
    let (q, _o) = receivers(&mut b);
    small_queue(&mut b, q);
    b.poll(ms(100));
    let mut reqs = Vec::new();
    deliver(&mut a, &mut b, 17, 100);
    b.take_sched_requests(&mut reqs);
    assert_eq!(reqs.len(), 1);
    reqs.clear();
    // Quiet but never read: the drain check comes back every quiet time, never on a
    // deadline already past (a loop would spin on it).
    for t in [120, 140, 160] {
        assert_eq!(b.poll_at(), Some(ms(t)));
        b.poll(ms(t));
        assert!(b.poll_at().is_some_and(|next| next > ms(t)));
    }
    b.poll(ms(399));
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty());
    b.poll(ms(400));
    b.take_sched_requests(&mut reqs);
    assert_eq!(reqs, vec![SchedRequest::Restore { pid: 1001 }]);
    assert_eq!(b.counters().prio_restores_timeout, 1);
    reqs.clear();
    drain(&mut b, q);
    // Boosted again after the interval, then the socket closes: restored at once.
    deliver(&mut a, &mut b, 17, 1200);
    b.take_sched_requests(&mut reqs);
    assert_eq!(reqs.len(), 1);
    reqs.clear();
    b.close(q).unwrap();
    b.poll(ms(1201));
    b.take_sched_requests(&mut reqs);
    assert_eq!(reqs, vec![SchedRequest::Restore { pid: 1001 }]);
    assert_eq!(b.counters().prio_restores_left_set, 1);
    assert!(b.prio_status().boosted.is_empty());
}

#[test]
fn everything_is_off_by_default() {
    let (mut a, mut b) = pair(RxPolicy::default(), 100);
    let (q, _o) = receivers(&mut b);
    small_queue(&mut b, q);
    burst(&mut a, &mut b, 400, 100);
    let mut reqs = Vec::new();
    b.take_sched_requests(&mut reqs);
    assert!(reqs.is_empty());
    let st = b.prio_status();
    assert!(st.members.is_empty() && !st.forced_drop && !st.priority);
    assert_eq!(b.counters().prio_set_recomputed, 0);
}
