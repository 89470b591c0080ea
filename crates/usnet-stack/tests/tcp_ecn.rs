//! ECN (RFC 3168) between two stacks on the simulated wire: negotiated when the
//! client asks, the sender's new data goes out ECT(0) in the IP header, and a
//! router that marks CE instead of dropping slows the sender down without a loss.

mod common;

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::time::Duration;

use common::*;
use usnet_stack::sim::{Faults, Hop, SimNet};
use usnet_tcp::config::{ECN_ACCEPT, ECN_OFF, ECN_ON};
use usnet_wire as wire;
use wire::ethertype;

fn net(seed: u64, client: u8, server: u8) -> SimNet {
    let mut net = SimNet::new(seed, Faults::default());
    for (i, ecn) in [(1, client), (2, server)] {
        let mut c = cfg(i);
        c.tcp.ecn = ecn;
        net.add(c).unwrap();
    }
    net
}

/// The IP header's offset in `frame` (after Ethernet), whether it is IPv4, and the
/// TCP segment's offset, for TCP frames.
fn tcp_at(frame: &[u8]) -> Option<(usize, bool, usize)> {
    let eth = wire::parse_ethernet(frame).ok()?;
    let ip = frame.len() - eth.payload.len();
    match eth.ethertype {
        ethertype::IPV4 => {
            let h = wire::parse_ipv4(eth.payload, false).ok()?;
            (h.protocol == wire::IPPROTO_TCP).then_some((ip, true, ip + h.header_len))
        }
        ethertype::IPV6 => {
            let h = wire::parse_ipv6(eth.payload).ok()?;
            (h.next_header == wire::IPPROTO_TCP).then_some((ip, false, ip + 40))
        }
        _ => None,
    }
}

fn ecn_of(frame: &[u8], ip: usize, v4: bool) -> u8 {
    if v4 {
        frame[ip + 1] & 3
    } else {
        (frame[ip + 1] >> 4) & 3
    }
}

/// `frame` with its IP ECN field set to CE (the IPv4 checksum redone).
fn mark_ce(frame: &[u8], ip: usize, v4: bool) -> Vec<u8> {
    let mut f = frame.to_vec();
    if v4 {
        f[ip + 1] |= 3;
        f[ip + 10..ip + 12].fill(0);
        let c = wire::finish(wire::sum(&f[ip..ip + 20]));
        f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        f[ip + 1] |= 0x30;
    }
    f
}

/// What the router saw from the client: new data segments and the ECT(0) ones
/// among them, retransmissions (a sequence number seen before) and the marked
/// ones among those, other codepoints, the handshake's ECN flags.
#[derive(Default)]
struct Seen {
    seqs: HashSet<u32>,
    data: u64,
    ect0: u64,
    retrans: u64,
    retrans_ect: u64,
    other_ecn: u64,
    syn_ece_cwr: Option<bool>,
    synack_ece: Option<bool>,
}

/// Transfers `total` bytes client → server through a router that marks every
/// `mark_every`th data segment CE (0: never) and records what it saw.
fn run(net: &mut SimNet, server: &str, total: u64, mark_every: u64) -> Rc<RefCell<Seen>> {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let s2 = seen.clone();
    net.middlebox = Some(Box::new(move |from, frame| {
        let Some((ip, v4, tcp)) = tcp_at(frame) else {
            return Hop::Pass;
        };
        let flags = frame[tcp + 13];
        let (syn, ack, ece, cwr) = (
            flags & 2 != 0,
            flags & 16 != 0,
            flags & 64 != 0,
            flags & 128 != 0,
        );
        let mut s = s2.borrow_mut();
        if syn && !ack && from == 0 {
            s.syn_ece_cwr.get_or_insert(ece && cwr);
        }
        if syn && ack && from == 1 {
            s.synack_ece.get_or_insert(ece);
        }
        let payload = frame.len() - tcp - usize::from(frame[tcp + 12] >> 4) * 4;
        if from != 0 || payload == 0 || syn {
            return Hop::Pass;
        }
        let seq = u32::from_be_bytes([
            frame[tcp + 4],
            frame[tcp + 5],
            frame[tcp + 6],
            frame[tcp + 7],
        ]);
        let ecn = ecn_of(frame, ip, v4);
        if !s.seqs.insert(seq) {
            s.retrans += 1;
            s.retrans_ect += u64::from(ecn != 0);
            return Hop::Pass;
        }
        s.data += 1;
        match ecn {
            0b10 => s.ect0 += 1,
            0 => {}
            _ => s.other_ecn += 1,
        }
        if mark_every > 0 && s.data % mark_every == 0 && ecn_of(frame, ip, v4) == 0b10 {
            return Hop::Answer(mark_ce(frame, ip, v4));
        }
        Hop::Pass
    }));
    transfer_with(net, sa(server), total, Duration::from_secs(60), |_| {});
    seen
}

#[test]
fn negotiated_ecn_marks_new_data_ect0() {
    for (seed, server) in [(1, "10.0.0.2:5001"), (2, "[fd00::2]:5001")] {
        let mut n = net(seed, ECN_ON, ECN_ACCEPT);
        let seen = run(&mut n, server, 256 << 10, 0);
        let s = seen.borrow();
        assert_eq!(s.syn_ece_cwr, Some(true), "{server}: ECN-setup SYN");
        assert_eq!(s.synack_ece, Some(true), "{server}: ECN-setup SYN-ACK");
        assert!(s.data > 100, "{server}");
        assert_eq!(s.ect0, s.data, "{server}: every new data segment ECT(0)");
        assert_eq!(s.other_ecn, 0, "{server}: never ECT(1) or CE");
        assert_eq!(s.retrans_ect, 0, "{server}: retransmissions are Not-ECT");
        assert_eq!(n.stack(0).tcp_stats().ecn_reductions, 0, "{server}");
    }
}

#[test]
fn without_agreement_nothing_is_marked() {
    for (client, server_ecn) in [(ECN_ON, ECN_OFF), (ECN_ACCEPT, ECN_ACCEPT)] {
        let mut n = net(3, client, server_ecn);
        let seen = run(&mut n, "10.0.0.2:5001", 64 << 10, 0);
        let s = seen.borrow();
        assert_eq!(s.synack_ece, Some(false), "{client}/{server_ecn}");
        assert!(s.data > 0);
        assert_eq!(s.ect0 + s.other_ecn, 0, "{client}/{server_ecn}: Not-ECT");
    }
}

#[test]
fn ce_marks_slow_the_sender_without_loss() {
    for (seed, server) in [(4, "10.0.0.2:5001"), (5, "[fd00::2]:5001")] {
        let mut n = net(seed, ECN_ON, ECN_ACCEPT);
        run(&mut n, server, 2 << 20, 50);
        let (cli, srv) = (n.stack(0).tcp_stats(), n.stack(1).tcp_stats());
        assert!(srv.rx_ecn_ce > 0, "{server}: the receiver saw CE");
        assert!(cli.rx_ecn_ece > 0, "{server}: and echoed it");
        assert!(
            cli.ecn_reductions > 0,
            "{server}: the sender reduced its window"
        );
        assert!(
            cli.ecn_reductions <= srv.rx_ecn_ce,
            "{server}: at most once per mark"
        );
        assert_eq!(
            (cli.fast_recoveries, cli.rto_expired),
            (0, 0),
            "{server}: no loss recovery"
        );
    }
}
