//! Receive coalescing (GRO, `StackConfig::gro`): whole conversations on the simulated
//! wire with every byte checked, GRO on against GRO off, with loss, reordering,
//! duplication and corruption; and hand-fed bursts showing which segments merge and
//! that the engine's per-segment counters still count wire segments.

use std::net::SocketAddr;
use std::time::Duration;

use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{
    mac_from_seed, Counters, Instant, IpFamily, SocketHandle, Stack, StackConfig, StackError,
    TcpIpOpts,
};
use usnet_wire::{self as wire, TcpFlags};

fn cfg(i: u8, gro: bool) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![
            format!("10.0.0.{i}/24").parse().unwrap(),
            format!("fd00::{i}/64").parse().unwrap(),
        ],
        seed: i as u64 * 7919,
        gro,
        ..Default::default()
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Byte `i` of a stream; `dir` tells the two directions apart.
fn pattern(dir: u8, i: u64) -> u8 {
    ((i.wrapping_mul(0x9e37_79b9) >> 17) as u8 ^ (i >> 13) as u8).wrapping_add(dir)
}

/// One side of a transfer: what it sent and what it received (checked).
#[derive(Default)]
struct End {
    sent: u64,
    got: u64,
    shut: bool,
    eof: bool,
    closed: bool,
}

impl End {
    /// Sends its pattern up to `total`, reads and checks the peer's; closes after
    /// both its FIN went out and the peer's arrived.
    fn run(&mut self, s: &mut Stack, h: SocketHandle, dir: u8, total: u64, expect: u64) {
        if self.closed {
            return;
        }
        let mut chunk = [0u8; 16 * 1024];
        while self.sent < total {
            let n = (total - self.sent).min(chunk.len() as u64) as usize;
            for (k, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern(dir, self.sent + k as u64);
            }
            match s.tcp_send(h, &chunk[..n]) {
                Ok(k) => self.sent += k as u64,
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("send at {}: {e:?}", self.sent),
            }
        }
        // An end with nothing to send closes after the peer's FIN, so the
        // peer's data meets an ESTABLISHED connection (a FIN first would make it
        // FIN-WAIT-2).
        if self.sent == total && !self.shut && (total > 0 || self.eof) {
            s.tcp_shutdown_write(h).unwrap();
            self.shut = true;
        }
        while !self.eof {
            match s.tcp_recv(h, &mut chunk) {
                Ok(0) => {
                    assert_eq!(self.got, expect, "EOF early");
                    self.eof = true;
                }
                Ok(k) => {
                    for (j, b) in chunk[..k].iter().enumerate() {
                        let at = self.got + j as u64;
                        assert_eq!(*b, pattern(1 - dir, at), "byte {at} of {expect}");
                    }
                    self.got += k as u64;
                }
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("recv at {}: {e:?}", self.got),
            }
        }
        if self.shut && self.eof {
            s.tcp_close(h).unwrap();
            self.closed = true;
        }
    }
}

/// What a conversation left behind: the receiver's counters, the bytes each end
/// got, and the virtual time it took.
struct Outcome {
    rx: Counters,
    tx: Counters,
    got: (u64, u64),
    took: Duration,
}

/// `up` bytes from stack 0 to stack 1 and `down` back, over `faults`.
fn conversation(seed: u64, faults: Faults, gro: bool, server: &str, up: u64, down: u64) -> Outcome {
    let mut net = SimNet::new(seed, faults);
    net.add(cfg(1, gro)).unwrap();
    net.add(cfg(2, gro)).unwrap();
    let start = net.now();
    let server = sa(server);
    let l = net.stack_mut(1).tcp_listen(server, 4).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
    let mut srv = None;
    let (mut a, mut b) = (End::default(), End::default());
    let ok = net.run_until(Duration::from_secs(600), |n| {
        a.run(n.stack_mut(0), c, 0, up, down);
        if srv.is_none() {
            srv = n.stack_mut(1).tcp_accept(l).ok();
        }
        if let Some(h) = srv {
            b.run(n.stack_mut(1), h, 1, down, up);
        }
        a.closed && b.closed
    });
    assert!(
        ok,
        "stalled (gro {gro}): client {}/{} server {}/{}; wire {:?}",
        a.sent, b.got, b.sent, a.got, net.stats
    );
    let took = net.now().saturating_since(start);
    // Let the last ACKs land, then every buffer must be back in the pools.
    net.run_for(Duration::from_secs(61));
    for i in 0..2 {
        assert!(net.stack(i).tcp_connections().is_empty());
    }
    net.stack_mut(1).tcp_close(l).unwrap();
    Outcome {
        rx: net.stack(1).counters_snapshot(),
        tx: net.stack(0).counters_snapshot(),
        got: (a.got, b.got),
        took,
    }
}

/// The same conversation with GRO on and off: identical streams (every byte checked
/// in both), merges only with GRO on.
fn on_and_off(seed: u64, faults: Faults, server: &str, up: u64, down: u64) -> (Outcome, Outcome) {
    let on = conversation(seed, faults, true, server, up, down);
    let off = conversation(seed, faults, false, server, up, down);
    assert_eq!(on.got, (down, up));
    assert_eq!(off.got, on.got);
    assert!(
        on.rx.tcp_gro_merged > 0 && on.rx.tcp_gro_frames > 0,
        "no merges"
    );
    assert!(on.rx.tcp_gro_merged >= on.rx.tcp_gro_frames);
    for c in [&off.rx, &off.tx] {
        assert_eq!((c.tcp_gro_merged, c.tcp_gro_frames), (0, 0));
    }
    (on, off)
}

#[test]
fn clean_bulk_merges_and_counts_wire_segments() {
    let (on, off) = on_and_off(1, Faults::default(), "10.0.0.2:80", 8 << 20, 0);
    // Nearly every data segment is merged into a bigger frame.
    let data_segs = (8u64 << 20) / 1448;
    assert!(
        on.rx.tcp_gro_merged > data_segs / 2,
        "{}",
        on.rx.tcp_gro_merged
    );
    // Per-segment counters still count wire segments: everything the receiver's
    // connections processed arrived as a frame classified by the stack.
    for o in [&on, &off] {
        assert!(o.rx.tcp_engine_rx_segments >= data_segs);
        assert!(o.rx.tcp_engine_rx_segments <= o.rx.tcp_rx);
    }
    // Fewer frames reach the engine, so fewer ACKs go back; no loss either way.
    assert!(on.rx.tcp_engine_tx_segments < off.rx.tcp_engine_tx_segments);
    assert_eq!(on.tx.tcp_retransmit_segments, 0);
    assert_eq!(on.rx.tcp_rx_ooo_segments, 0);
    eprintln!(
        "clean 8 MiB: gro on {:?} ({} merged into {} frames, {} ACK segments), off {:?} ({} ACK segments)",
        on.took,
        on.rx.tcp_gro_merged,
        on.rx.tcp_gro_frames,
        on.rx.tcp_engine_tx_segments,
        off.took,
        off.rx.tcp_engine_tx_segments
    );
}

/// One ACK per coalesced frame (a stretch ACK) must not slow the sender down: on a
/// path with a real RTT, slow start still doubles the window per round trip.
#[test]
fn stretch_acks_keep_slow_start_fast() {
    let faults = Faults {
        delay: Duration::from_millis(1),
        ..Faults::default()
    };
    for total in [1u64 << 20, 8 << 20] {
        let (on, off) = on_and_off(1, faults, "10.0.0.2:80", total, 0);
        assert!(
            on.took.as_secs_f64() <= off.took.as_secs_f64() * 1.25,
            "{total} bytes: gro on {:?}, off {:?}",
            on.took,
            off.took
        );
        assert!(on.rx.tcp_engine_tx_segments * 4 < off.rx.tcp_engine_tx_segments);
    }
}

#[test]
fn lossy_reordered_duplicated_corrupted_bulk_v4_and_v6() {
    let faults = Faults {
        loss: 0.02,
        duplicate: 0.02,
        corrupt: 0.02,
        reorder: 0.05,
        reorder_window: Duration::from_micros(300),
        ..Faults::default()
    };
    for (seed, server) in [
        (2, "10.0.0.2:80"),
        (3, "[fd00::2]:80"),
        (4, "10.0.0.2:80"),
        (5, "[fd00::2]:80"),
    ] {
        let (on, off) = on_and_off(seed, faults, server, 3 << 20, 0);
        // Corrupted frames die at the checksum, one wire segment at a time.
        assert!(on.rx.tcp_rx_bad_checksum > 0 && off.rx.tcp_rx_bad_checksum > 0);
        // Out-of-order arrivals are merged too (after a loss every segment is).
        assert!(on.rx.tcp_rx_ooo_segments > 0);
        assert!(on.rx.tcp_rx_dup_bytes > 0);
    }
}

#[test]
fn data_both_ways_under_faults() {
    let faults = Faults {
        loss: 0.01,
        duplicate: 0.01,
        corrupt: 0.01,
        reorder: 0.02,
        reorder_window: Duration::from_micros(200),
        ..Faults::default()
    };
    for seed in 6..9 {
        let (on, _) = on_and_off(seed, faults, "10.0.0.2:80", 2 << 20, 2 << 20);
        // The client receives (and merges) too.
        assert!(on.tx.tcp_gro_merged > 0);
    }
}

// ------------------------------------------------------------------ hand-fed bursts

/// Two stacks wired by hand, so a test decides which frames arrive in one poll.
struct Pair {
    a: Stack,
    b: Stack,
    now: Instant,
}

impl Pair {
    fn new(gro: bool) -> Pair {
        let mut p = Pair {
            a: Stack::new(cfg(1, gro)).unwrap(),
            b: Stack::new(cfg(2, gro)).unwrap(),
            now: Instant::from_millis(1),
        };
        p.a.advance(p.now);
        p.b.advance(p.now);
        p
    }

    fn frames(s: &mut Stack) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while let Some(b) = s.dequeue_tx() {
            let mut f = Vec::new();
            s.pool().copy_chain(&b, &mut f);
            s.pool_mut().free(b);
            v.push(f);
        }
        v
    }

    fn feed(s: &mut Stack, frames: &[Vec<u8>]) {
        for f in frames {
            let b = s.pool_mut().alloc_from(f).unwrap();
            s.receive(b);
        }
    }

    /// Moves frames both ways until both are quiet (1 µs per round).
    fn settle(&mut self) {
        for _ in 0..1000 {
            self.now = self.now + Duration::from_micros(1);
            self.a.poll(self.now);
            let fa = Self::frames(&mut self.a);
            Self::feed(&mut self.b, &fa);
            self.b.poll(self.now);
            let fb = Self::frames(&mut self.b);
            Self::feed(&mut self.a, &fb);
            if fa.is_empty() && fb.is_empty() && self.a.input_len() == 0 {
                return;
            }
        }
        panic!("no quiet");
    }

    /// An established connection client (on `a`) → server (on `b`).
    fn connect(&mut self) -> (SocketHandle, SocketHandle) {
        let l = self.b.tcp_listen(sa("10.0.0.2:80"), 4).unwrap();
        let c = self.a.tcp_connect(None, sa("10.0.0.2:80")).unwrap();
        self.settle();
        (c, self.b.tcp_accept(l).unwrap())
    }
}

/// The TCP segment of an Ethernet + IPv4 frame, edited and re-checksummed.
fn edit(frame: &mut [u8], f: impl FnOnce(&mut wire::TcpRepr)) {
    let l4 = &mut frame[14 + 20..];
    let h = wire::parse_tcp(l4).unwrap();
    let mut repr = h.repr();
    let plen = h.payload.len();
    f(&mut repr);
    assert_eq!(
        repr.header_len(),
        h.header_len,
        "an edit must keep the length"
    );
    let ip =
        |o: usize| std::net::IpAddr::from([frame[o], frame[o + 1], frame[o + 2], frame[o + 3]]);
    let (src, dst) = (ip(14 + 12), ip(14 + 16));
    repr.emit(&mut frame[14 + 20..], src, dst, plen, true)
        .unwrap();
}

const BURST: usize = 6;

/// A burst of six full segments from the client, `change` applied to them, fed to
/// the server in one poll. Returns the server's (merged, frames) counter growth
/// and checks that the data arrived intact and was counted per wire segment.
fn burst(gro: bool, change: impl FnOnce(&mut Vec<Vec<u8>>)) -> (u64, u64) {
    let mut p = Pair::new(gro);
    let (c, s) = p.connect();
    let mss = p.a.tcp_info(c).unwrap().snd_mss as usize;
    let data: Vec<u8> = (0..BURST * mss).map(|i| pattern(0, i as u64)).collect();
    assert_eq!(p.a.tcp_send(c, &data).unwrap(), data.len());
    let mut frames = Pair::frames(&mut p.a);
    assert_eq!(frames.len(), BURST);
    change(&mut frames);
    let before = p.b.counters_snapshot();
    Pair::feed(&mut p.b, &frames);
    p.now = p.now + Duration::from_micros(1);
    p.b.poll(p.now);
    let after = p.b.counters_snapshot();
    let wire_segs = frames.len() as u64;
    assert_eq!(after.tcp_rx - before.tcp_rx, wire_segs);
    assert_eq!(
        after.tcp_engine_rx_segments - before.tcp_engine_rx_segments,
        wire_segs,
        "the engine counts wire segments"
    );
    p.settle();
    let mut got = vec![0u8; data.len() + 1];
    let mut n = 0;
    while let Ok(k) = p.b.tcp_recv(s, &mut got[n..]) {
        if k == 0 {
            break;
        }
        n += k;
    }
    assert_eq!(&got[..n], &data[..], "the server got other bytes");
    (
        after.tcp_gro_merged - before.tcp_gro_merged,
        after.tcp_gro_frames - before.tcp_gro_frames,
    )
}

#[test]
fn a_clean_burst_becomes_one_segment() {
    assert_eq!(burst(true, |_| {}), (BURST as u64 - 1, 1));
    assert_eq!(burst(false, |_| {}), (0, 0));
}

#[test]
fn segments_that_differ_are_not_merged() {
    // Segment 3 differs from the others: 0-2 merge, 3 stays alone, 4-5 merge.
    let split = (3, 2);
    type Edit = Box<dyn Fn(&mut wire::TcpRepr)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("ack", Box::new(|r| r.ack = r.ack.wrapping_sub(1))),
        ("window", Box::new(|r| r.window -= 1)),
        (
            "tsecr",
            Box::new(|r| {
                let (v, e) = r.options.timestamps.unwrap();
                r.options.timestamps = Some((v, e.wrapping_sub(1)));
            }),
        ),
        ("urg", Box::new(|r| r.flags |= TcpFlags::URG)),
        ("ece", Box::new(|r| r.flags |= TcpFlags::ECE)),
        ("cwr", Box::new(|r| r.flags |= TcpFlags::CWR)),
    ];
    for (what, f) in cases {
        let got = burst(true, |fr| edit(&mut fr[3], |r| f(r)));
        assert_eq!(got, split, "{what}");
    }
    // A newer TSval from segment 3 on: 0-2 and 3-5.
    let got = burst(true, |fr| {
        for f in &mut fr[3..] {
            edit(f, |r| {
                let (v, e) = r.options.timestamps.unwrap();
                r.options.timestamps = Some((v.wrapping_add(1), e));
            });
        }
    });
    assert_eq!(got, (4, 2), "tsval");
    // PSH ends a batch after it: 0-3 and 4-5.
    let got = burst(true, |fr| edit(&mut fr[3], |r| r.flags |= TcpFlags::PSH));
    assert_eq!(got, (4, 2), "psh");
    // A gap (segment 3 lost): 0-2 and 4-5 (out of order, still merged).
    let got = {
        let mut p = Pair::new(true);
        let (c, _) = p.connect();
        let mss = p.a.tcp_info(c).unwrap().snd_mss as usize;
        p.a.tcp_send(c, &vec![1u8; BURST * mss]).unwrap();
        let mut frames = Pair::frames(&mut p.a);
        frames.remove(3);
        let before = p.b.counters_snapshot();
        Pair::feed(&mut p.b, &frames);
        p.b.poll(p.now + Duration::from_micros(1));
        let after = p.b.counters_snapshot();
        assert_eq!(after.tcp_rx_ooo_segments - before.tcp_rx_ooo_segments, 2);
        (
            after.tcp_gro_merged - before.tcp_gro_merged,
            after.tcp_gro_frames - before.tcp_gro_frames,
        )
    };
    assert_eq!(got, (3, 2), "gap");
    // A corrupted segment is dropped at the checksum and splits the batch.
    let got = {
        let mut p = Pair::new(true);
        let (c, _) = p.connect();
        let mss = p.a.tcp_info(c).unwrap().snd_mss as usize;
        p.a.tcp_send(c, &vec![1u8; BURST * mss]).unwrap();
        let mut frames = Pair::frames(&mut p.a);
        let n = frames[3].len();
        frames[3][n - 1] ^= 0x40;
        let before = p.b.counters();
        let bad = before.tcp_rx_bad_checksum;
        let (m, f) = (before.tcp_gro_merged, before.tcp_gro_frames);
        Pair::feed(&mut p.b, &frames);
        p.b.poll(p.now + Duration::from_micros(1));
        let after = p.b.counters();
        assert_eq!(after.tcp_rx_bad_checksum - bad, 1);
        (after.tcp_gro_merged - m, after.tcp_gro_frames - f)
    };
    assert_eq!(got, (3, 2), "corrupt");
}

#[test]
fn a_shorter_segment_ends_the_batch_and_fin_is_not_merged() {
    // The client's last segment is short (and carries PSH: it ends the queued data).
    let mut p = Pair::new(true);
    let (c, s) = p.connect();
    let mss = p.a.tcp_info(c).unwrap().snd_mss as usize;
    let data: Vec<u8> = (0..4 * mss + 100).map(|i| pattern(0, i as u64)).collect();
    p.a.tcp_send(c, &data).unwrap();
    p.a.tcp_shutdown_write(c).unwrap();
    let frames = Pair::frames(&mut p.a);
    let hdrs: Vec<_> = frames
        .iter()
        .map(|f| wire::parse_tcp(&f[34..]).unwrap())
        .collect();
    assert_eq!(hdrs.iter().filter(|h| h.flags.fin()).count(), 1);
    // FIN rides on the short segment or comes alone; either way it is not merged.
    let short_has_fin = hdrs.iter().any(|h| h.flags.fin() && !h.payload.is_empty());
    Pair::feed(&mut p.b, &frames);
    p.b.poll(p.now + Duration::from_micros(1));
    let k = p.b.counters();
    // Four full segments, then the short one joins as the last (unless it has FIN).
    let merged = if short_has_fin { 3 } else { 4 };
    assert_eq!((k.tcp_gro_frames, k.tcp_gro_merged), (1, merged));
    p.settle();
    let mut got = vec![0u8; data.len() + 1];
    let mut n = 0;
    loop {
        match p.b.tcp_recv(s, &mut got[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(&got[..n], &data[..]);
}

/// A frame a device coalesced (GRO offload, `gso_size` set) arrives as one long
/// chained frame: the engine still takes the peer's segment size from `gso_size`
/// (Linux's `tcp_measure_rcv_mss`), not from the frame's length.
#[test]
fn a_device_coalesced_frame_keeps_its_segment_size() {
    let mut p = Pair::new(false);
    let (c, s) = p.connect();
    let mss = p.a.tcp_info(c).unwrap().snd_mss as usize;
    let data: Vec<u8> = (0..BURST * mss).map(|i| pattern(0, i as u64)).collect();
    assert_eq!(p.a.tcp_send(c, &data).unwrap(), data.len());
    let frames = Pair::frames(&mut p.a);
    assert_eq!(frames.len(), BURST);
    // One frame: the first one's headers, every payload.
    let hl = 14 + 20 + usize::from(frames[0][14 + 20 + 12] >> 4) * 4;
    let mut big = frames[0][..hl].to_vec();
    for f in &frames {
        big.extend_from_slice(&f[hl..]);
    }
    let ip_len = (big.len() - 14) as u16;
    big[14 + 2..14 + 4].copy_from_slice(&ip_len.to_be_bytes());
    big[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
    let mut sum: u32 = big[14..34]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    big[14 + 10..14 + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    edit(&mut big, |_| {});
    let b = p.b.pool_mut().alloc_from(&big).unwrap();
    assert!(p.b.pool().next(&b).is_some(), "a chained frame");
    let o = usnet_pool::Offload {
        gso_size: mss as u16,
        ..Default::default()
    };
    p.b.pool_mut().set_offload(&b, o);
    p.b.receive(b);
    p.now = p.now + Duration::from_micros(1);
    p.b.poll(p.now);
    assert_eq!(p.b.tcp_info(s).unwrap().rcv_mss as usize, mss);
    let mut got = vec![0u8; data.len() + 1];
    assert_eq!(p.b.tcp_recv(s, &mut got).unwrap(), data.len());
    assert_eq!(&got[..data.len()], &data[..]);
}

/// `Stack::tcp_set_tos`: the connection's packets carry the DSCP bits under the
/// engine's ECN field.
#[test]
fn a_connection_sends_with_its_tos() {
    let mut p = Pair::new(false);
    let (c, _s) = p.connect();
    p.a.tcp_set_tos(c, 0x2f).unwrap();
    assert_eq!(p.a.tcp_send(c, b"hello").unwrap(), 5);
    let frames = Pair::frames(&mut p.a);
    assert_eq!(frames.len(), 1);
    // The ECN bits were masked off; this connection negotiated no ECN.
    assert_eq!(frames[0][14 + 1], 0x2c);
}

/// Pair `p` with its neighbours resolved for `server`'s family (a connection to
/// port 9 of its address), so the next frame a test takes is its own.
fn resolved(server: &str) -> Pair {
    let mut p = Pair::new(false);
    let mut warm = sa(server);
    warm.set_port(9);
    let l = p.b.tcp_listen(warm, 1).unwrap();
    p.a.tcp_connect(None, warm).unwrap();
    p.settle();
    p.b.tcp_accept(l).unwrap();
    p
}

/// The TTL (hop limit) and TOS (traffic class) byte of an Ethernet + IP frame.
fn ttl_tos(frame: &[u8]) -> (u8, u8) {
    let ip = &frame[14..];
    if ip[0] >> 4 == 4 {
        (ip[8], ip[1])
    } else {
        (ip[7], (ip[0] & 0x0f) << 4 | ip[1] >> 4)
    }
}

/// `TcpIpOpts`: a connection's TTL and TOS from its SYN on; a listener's, per
/// family, on its SYN-ACKs and on the connections it accepts (Linux's child socket
/// copies them); the stack's TTL for a socket that chose none.
#[test]
fn a_socket_chooses_its_ttl_and_a_listener_passes_its_fields_on() {
    for (server, v4) in [("10.0.0.2:80", true), ("[fd00::2]:80", false)] {
        let mut p = resolved(server);
        let l = p.b.tcp_listen(sa(server), 4).unwrap();
        let mine = TcpIpOpts {
            tos: 0x20,
            ttl: Some(200),
            min_ttl: 0,
        };
        let (fam, other) = if v4 {
            (IpFamily::V4, IpFamily::V6)
        } else {
            (IpFamily::V6, IpFamily::V4)
        };
        p.b.tcp_set_ip_opts(l, fam, mine).unwrap();
        assert_eq!(p.b.tcp_ip_opts(l, fam).unwrap(), mine);
        assert_eq!(p.b.tcp_ip_opts(l, other).unwrap(), TcpIpOpts::default());
        let cfg = p.a.tcp_config().clone();
        let ours = TcpIpOpts {
            tos: 0x4b, // the ECN bits are the engine's: masked
            ttl: Some(255),
            min_ttl: 0,
        };
        let c = p.a.tcp_connect_with(None, sa(server), cfg, ours).unwrap();
        let syn = Pair::frames(&mut p.a);
        assert_eq!(syn.len(), 1);
        assert_eq!(ttl_tos(&syn[0]), (255, 0x48), "the SYN, v4 {v4}");
        Pair::feed(&mut p.b, &syn);
        p.now = p.now + Duration::from_micros(1);
        p.b.poll(p.now);
        let syn_ack = Pair::frames(&mut p.b);
        assert_eq!(syn_ack.len(), 1);
        assert_eq!(ttl_tos(&syn_ack[0]), (200, 0x20), "the SYN-ACK, v4 {v4}");
        Pair::feed(&mut p.a, &syn_ack);
        p.settle();
        let s = p.b.tcp_accept(l).unwrap();
        assert_eq!(p.b.tcp_ip_opts(s, fam).unwrap(), mine, "inherited");
        assert_eq!(p.b.tcp_send(s, b"hi").unwrap(), 2);
        assert_eq!(p.a.tcp_send(c, b"hello").unwrap(), 5);
        p.now = p.now + Duration::from_micros(1);
        p.b.poll(p.now);
        p.a.poll(p.now);
        assert_eq!(ttl_tos(&Pair::frames(&mut p.b)[0]), (200, 0x20));
        assert_eq!(ttl_tos(&Pair::frames(&mut p.a)[0]), (255, 0x48));
        // Back to the stack's TTL.
        p.a.tcp_set_ip_opts(c, fam, TcpIpOpts::default()).unwrap();
        assert_eq!(p.a.tcp_send(c, b"again").unwrap(), 5);
        p.now = p.now + Duration::from_millis(300);
        p.a.poll(p.now);
        assert_eq!(ttl_tos(&Pair::frames(&mut p.a)[0]), (64, 0));
    }
}

/// `TcpIpOpts::min_ttl` (RFC 5082): a listener drops SYNs that arrive below it,
/// so only a peer that sends with a high enough TTL connects; a connection drops
/// its segments that do; each drop counted, none answered.
#[test]
fn segments_below_a_sockets_minimum_ttl_are_dropped() {
    for (server, fam) in [
        ("10.0.0.2:80", IpFamily::V4),
        ("[fd00::2]:80", IpFamily::V6),
    ] {
        let mut p = resolved(server);
        let l = p.b.tcp_listen(sa(server), 4).unwrap();
        let gtsm = TcpIpOpts {
            min_ttl: 255,
            ..Default::default()
        };
        p.b.tcp_set_ip_opts(l, fam, gtsm).unwrap();
        // TTL 64: the SYN is dropped, nothing answers.
        let low = p.a.tcp_connect(None, sa(server)).unwrap();
        let syn = Pair::frames(&mut p.a);
        Pair::feed(&mut p.b, &syn);
        p.now = p.now + Duration::from_micros(1);
        p.b.poll(p.now);
        assert!(
            Pair::frames(&mut p.b).is_empty(),
            "answered a SYN below the minimum"
        );
        assert_eq!(p.b.counters().tcp_rx_min_ttl, 1);
        p.a.tcp_abort(low).unwrap();
        let _ = Pair::frames(&mut p.a);
        // TTL 255: connects.
        let cfg = p.a.tcp_config().clone();
        let high = TcpIpOpts {
            ttl: Some(255),
            ..Default::default()
        };
        let c = p.a.tcp_connect_with(None, sa(server), cfg, high).unwrap();
        p.settle();
        let s = p.b.tcp_accept(l).unwrap();
        assert_eq!(p.b.tcp_ip_opts(s, fam).unwrap().min_ttl, 255);
        assert_eq!(p.a.tcp_send(c, b"one").unwrap(), 3);
        p.settle();
        let mut got = [0u8; 8];
        assert_eq!(p.b.tcp_recv(s, &mut got).unwrap(), 3);
        // A segment one hop further is dropped.
        p.a.tcp_set_ip_opts(
            c,
            fam,
            TcpIpOpts {
                ttl: Some(254),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.a.tcp_send(c, b"two").unwrap(), 3);
        p.now = p.now + Duration::from_micros(1);
        p.a.poll(p.now);
        let seg = Pair::frames(&mut p.a);
        Pair::feed(&mut p.b, &seg);
        p.b.poll(p.now);
        assert!(matches!(
            p.b.tcp_recv(s, &mut got),
            Err(StackError::WouldBlock)
        ));
        assert_eq!(p.b.counters().tcp_rx_min_ttl, 2);
    }
}
