//! Arbitrary segments into an established TCP connection.
//!
//! Setup (fixed): a usnet `Stack` (fed IP packets in Ethernet frames; its ARP for the
//! gateway answered here) listens on 192.168.0.1:8080; the "peer" 192.0.2.1:40000
//! completes a handshake with MSS, SACK-permitted, timestamps and window scaling, the
//! application accepts and queues 3000 bytes.
//!
//! Then each input record becomes one segment with valid IPv4/TCP headers and fuzzed
//! sequence (relative to what the stack last acknowledged), acknowledgment (relative
//! to what it last sent), flags, window, urgent pointer, options and payload; the
//! checksum is right unless the record asks for a corrupt one. Record control bits also
//! move the virtual clock and make the application read, write or shut down. The
//! flag word's spare high bits ask for the frame to arrive as a device's chain of
//! buffers of that many 16-byte units, its checksum vouched for by the device when it
//! is right (the receive path reads a connection's chained segments where they lie).
//! An input of odd length runs the connection on pool-backed queues
//! (`TcpConfig::zero_copy`: its payload kept in the buffers it arrived in, a chain
//! split into them), an even one on the copying rings.
//!
//! Invariants: no panic; every packet the stack sends parses; no deadline is still due
//! once the stack has run to idle (its loop would spin); the connection's scoreboard
//! recounts to its cached counters after every step; after the application
//! closes and (virtual) hours pass, no connection is left and every packet buffer is
//! back in the pool.
#![no_main]

use libfuzzer_sys::fuzz_target;
use usnet_stack::{Instant, SocketHandle, Stack, StackConfig};
use usnet_wire::MacAddr;

const PEER_PORT: u16 = 40000;
const PORT: u16 = 8080;

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}
fn sum(data: &[u8], mut s: u32) -> u32 {
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    s
}

struct Seg<'a> {
    seq: u32,
    ack: u32,
    flags: u16,
    window: u16,
    urgent: u16,
    options: &'a [u8],
    payload: &'a [u8],
    bad_csum: bool,
}

fn packet(s: &Seg) -> Vec<u8> {
    let opt_len = s.options.len().min(40);
    let thl = 20 + opt_len.div_ceil(4) * 4;
    let total = 20 + thl + s.payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[192, 0, 2, 1]);
    p[16..20].copy_from_slice(&[192, 168, 0, 1]);
    let c = fold(sum(&p[..20], 0));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    {
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&PEER_PORT.to_be_bytes());
        t[2..4].copy_from_slice(&PORT.to_be_bytes());
        t[4..8].copy_from_slice(&s.seq.to_be_bytes());
        t[8..12].copy_from_slice(&s.ack.to_be_bytes());
        t[12] = ((thl / 4) as u8) << 4 | ((s.flags >> 8) & 1) as u8;
        t[13] = s.flags as u8;
        t[14..16].copy_from_slice(&s.window.to_be_bytes());
        t[18..20].copy_from_slice(&s.urgent.to_be_bytes());
        t[20..20 + opt_len].copy_from_slice(&s.options[..opt_len]);
        t[thl..].copy_from_slice(s.payload);
    }
    let tlen = (thl + s.payload.len()) as u16;
    let mut pseudo = vec![192, 0, 2, 1, 192, 168, 0, 1, 0, 6];
    pseudo.extend_from_slice(&tlen.to_be_bytes());
    let mut c = fold(sum(&p[20..], sum(&pseudo, 0)));
    if s.bad_csum {
        c ^= 0x5a5a;
    }
    p[36..38].copy_from_slice(&c.to_be_bytes());
    p
}

/// What the stack told us last: (its seq after the segment, its ack).
#[derive(Default)]
struct Peer {
    snd_nxt: u32,
    rcv_nxt: u32,
    ts_recent: u32,
}

const STACK_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
const PEER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

/// The stack, its clock and the link's two ends.
struct Harness {
    st: Stack,
    now: Instant,
}

impl Harness {
    fn new(zero_copy: bool) -> Harness {
        let tcp = usnet_stack::TcpConfig {
            zero_copy,
            ..Default::default()
        };
        let st = Stack::new(StackConfig {
            tcp,
            mac: STACK_MAC,
            addrs: vec!["192.168.0.1/16".parse().unwrap()],
            gateway4: Some("192.168.0.2".parse().unwrap()),
            seed: 1,
            // Frames marked checksum-verified are trusted (as from a TAP or veth).
            rx_csum_offload: true,
            // One connection's windows; not the default 4,096 buffers built for
            // every input.
            pool: usnet_pool::PoolConfig {
                count: 512,
                ..Default::default()
            },
            ..StackConfig::default()
        })
        .expect("config");
        Harness {
            st,
            now: Instant::from_millis(1),
        }
    }

    /// An Ethernet frame from the peer into the stack, then the protocol work.
    fn frame(&mut self, ethertype: u16, payload: &[u8]) {
        self.frame_in_pieces(ethertype, payload, 0, false);
    }

    /// [`Self::frame`] as a chain of buffers of `piece` bytes each (0: as the pool
    /// lays it out), marked checksum-verified by the device if `csum_valid`.
    fn frame_in_pieces(&mut self, ethertype: u16, payload: &[u8], piece: usize, csum_valid: bool) {
        let mut f = Vec::with_capacity(14 + payload.len());
        f.extend_from_slice(&STACK_MAC.0);
        f.extend_from_slice(&PEER_MAC.0);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        let pool = self.st.pool_mut();
        let mut pieces = f.chunks(if piece == 0 { f.len() } else { piece });
        let head = match pieces.next().map(|p| pool.alloc_from(p)) {
            Some(Some(b)) if piece == 0 || pool.is_single(&b) => b,
            Some(Some(b)) => {
                pool.free(b);
                return;
            }
            _ => return,
        };
        let mut last = usnet_pool::BufId::from(&head);
        for p in pieces {
            let Some(b) = pool.alloc_continuation() else {
                pool.free(head);
                return;
            };
            pool.space_mut(&b)[..p.len()].copy_from_slice(p);
            pool.set_len(&b, p.len()).expect("fits");
            let id = usnet_pool::BufId::from(&b);
            pool.set_next(last, Some(b));
            last = id;
        }
        if csum_valid {
            let o = usnet_pool::Offload {
                csum_valid: true,
                ..Default::default()
            };
            pool.set_offload(&head, o);
        }
        self.st.receive(head);
        self.run();
    }

    fn inject(&mut self, ip: &[u8]) {
        self.frame(0x0800, ip);
    }

    /// Runs the stack at the current time until it is idle; no deadline may still
    /// be due then (a real loop would spin), and every connection's scoreboard must
    /// recount to its cached counters.
    fn run(&mut self) {
        if let Err(d) = self.st.run_until_idle(self.now) {
            panic!(
                "deadline {d:?} still due at {:?} after the stack ran idle",
                self.now
            );
        }
        if let Err(e) = self.st.tcp_check_invariants() {
            panic!("at {:?}: {e}", self.now);
        }
    }

    /// Moves the clock to `to`, firing every timer at its own time on the way.
    fn advance_to(&mut self, to: Instant, peer: &mut Peer) {
        while let Some(t) = self.st.poll_at().filter(|&t| t <= to) {
            self.now = self.now.max(t);
            // `run` fails if a deadline is still due (a connection owing a segment it
            // never sends): an error, not something to step over.
            self.run();
            drain(self, peer);
        }
        self.now = self.now.max(to);
        self.run();
    }
}

/// Drains the stack's output, checking each packet and tracking sequence numbers;
/// its ARP requests for the gateway are answered with the peer's MAC.
fn drain(h: &mut Harness, peer: &mut Peer) {
    while let Some(buf) = h.st.dequeue_tx() {
        let mut f = Vec::new();
        h.st.pool().copy_chain(&buf, &mut f);
        h.st.pool_mut().free(buf);
        assert!(f.len() >= 14, "short frame out");
        match u16::from_be_bytes([f[12], f[13]]) {
            0x0806 if f.len() >= 42 && f[21] == 1 => {
                // Who has the target address? The peer's MAC does.
                let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 2];
                arp.extend_from_slice(&PEER_MAC.0);
                arp.extend_from_slice(&f[38..42]);
                arp.extend_from_slice(&STACK_MAC.0);
                arp.extend_from_slice(&f[28..32]);
                h.frame(0x0806, &arp);
            }
            0x0800 => check(&f[14..], peer),
            _ => {}
        }
    }
}

/// One IPv4 packet the stack sent: it parses, and its numbers are tracked.
fn check(p: &[u8], peer: &mut Peer) {
    assert!(p.len() >= 40 && p[0] == 0x45 && p[9] == 6, "bad packet out");
    let t = &p[20..];
    let thl = (t[12] >> 4) as usize * 4;
    assert!(
        (20..=60).contains(&thl) && thl <= t.len(),
        "bad header length"
    );
    let seq = u32::from_be_bytes(t[4..8].try_into().unwrap());
    let flags = t[13];
    let len = (t.len() - thl) as u32 + u32::from(flags & 0x03 != 0);
    let end = seq.wrapping_add(len);
    // A SYN starts the count; later segments move it forward only.
    if flags & 0x02 != 0 || (end.wrapping_sub(peer.snd_nxt) as i32) > 0 {
        peer.snd_nxt = end;
    }
    if flags & 0x10 != 0 {
        peer.rcv_nxt = u32::from_be_bytes(t[8..12].try_into().unwrap());
    }
    // Timestamp option: remember TSval to echo it.
    let mut o = &t[20..thl];
    while let [kind, rest @ ..] = o {
        match *kind {
            0 => break,
            1 => o = rest,
            _ => {
                let Some(&l) = rest.first() else { break };
                let l = l as usize;
                if l < 2 || l > o.len() {
                    break;
                }
                if *kind == 8 && l == 10 {
                    peer.ts_recent = u32::from_be_bytes(o[2..6].try_into().unwrap());
                }
                o = &o[l..];
            }
        }
    }
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(data.len());
    let (a, b) = data.split_at(n);
    *data = b;
    a
}

fuzz_target!(|data: &[u8]| {
    let mut b = Harness::new(data.len() % 2 == 1);
    let mut peer = Peer::default();
    let l: SocketHandle =
        b.st.tcp_listen("192.168.0.1:8080".parse().unwrap(), 4)
            .unwrap();
    let syn_opts = [
        2, 4, 0x05, 0xb4, // MSS 1460
        4, 2, // SACK permitted
        8, 10, 0, 0, 0, 1, 0, 0, 0, 0, // TS val 1
        1, 3, 3, 7, // NOP, WS 7
    ];
    let seg = |seq, ack, flags, options, payload| Seg {
        seq,
        ack,
        flags,
        window: 1000,
        urgent: 0,
        options,
        payload,
        bad_csum: false,
    };
    b.inject(&packet(&seg(1000, 0, 0x02, &syn_opts, b"")));
    drain(&mut b, &mut peer);
    assert_eq!(peer.rcv_nxt, 1001);
    let mut ts_opt = [1u8, 1, 8, 10, 0, 0, 0, 2, 0, 0, 0, 0];
    ts_opt[8..12].copy_from_slice(&peer.ts_recent.to_be_bytes());
    b.inject(&packet(&seg(1001, peer.snd_nxt, 0x10, &ts_opt, b"")));
    drain(&mut b, &mut peer);
    let fd = b.st.tcp_accept(l).expect("established");
    let blob = [0xabu8; 3000];
    let _ = b.st.tcp_send_more(fd, &blob, false);
    b.run();
    drain(&mut b, &mut peer);

    let mut d = data;
    let mut ts_val = 3u32;
    let mut buf = [0u8; 4096];
    while d.len() >= 12 {
        let h = take(&mut d, 12);
        let ctl = h[0];
        let seq_off = i16::from_le_bytes([h[1], h[2]]) as i32;
        let ack_off = i16::from_le_bytes([h[3], h[4]]) as i32;
        let flags = u16::from_le_bytes([h[5], h[6]]) & 0x1ff;
        let piece = usize::from(h[6] >> 1) * 16;
        let window = u16::from_le_bytes([h[7], h[8]]);
        let urgent = u16::from(h[9]);
        let opt_len = (h[10] % 44) as usize;
        let pay_len = (h[11] as usize) * 8;
        let opts_raw = take(&mut d, opt_len.min(40));
        let payload = take(&mut d, pay_len);
        // Mostly a valid timestamp first, then the fuzzed options.
        let mut options = Vec::with_capacity(52);
        if ctl & 0x40 == 0 {
            ts_val = ts_val.wrapping_add(1);
            options.extend_from_slice(&[1, 1, 8, 10]);
            options.extend_from_slice(&ts_val.to_be_bytes());
            options.extend_from_slice(&peer.ts_recent.to_be_bytes());
        }
        options.extend_from_slice(opts_raw);
        options.truncate(40);
        let s = Seg {
            seq: peer.rcv_nxt.wrapping_add(seq_off as u32),
            ack: peer.snd_nxt.wrapping_add(ack_off as u32),
            flags,
            window,
            urgent,
            options: &options,
            payload,
            bad_csum: ctl & 0x0f == 0x0f,
        };
        if piece > 0 {
            b.frame_in_pieces(0x0800, &packet(&s), piece, !s.bad_csum);
        } else {
            b.inject(&packet(&s));
        }
        match ctl >> 4 & 3 {
            1 => {
                let _ = b.st.tcp_recv(fd, &mut buf);
            }
            2 => {
                let more = ctl & 0x40 != 0;
                let _ =
                    b.st.tcp_send_more(fd, &blob[..(ctl as usize & 0x0f) * 100], more);
            }
            3 if ctl & 0x80 != 0 => {
                let _ = b.st.tcp_shutdown_write(fd);
            }
            _ => {}
        }
        b.run();
        drain(&mut b, &mut peer);
        if ctl & 0x80 != 0 {
            let step = [1_000_000u64, 40_000_000, 200_000_000, 1_000_000_000][(ctl & 3) as usize];
            let t = b.now + std::time::Duration::from_nanos(step);
            b.advance_to(t, &mut peer);
        }
        drain(&mut b, &mut peer);
    }

    // The peer opens its window once more, then falls silent. (Without this an orphan
    // stuck behind a zero window would persist-probe forever: a known bug, see
    // found by this target and fixed since.)
    let mut opts = [1u8, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0];
    opts[4..8].copy_from_slice(&ts_val.wrapping_add(1).to_be_bytes());
    opts[8..12].copy_from_slice(&peer.ts_recent.to_be_bytes());
    let mut open = seg(peer.rcv_nxt, peer.snd_nxt, 0x10, &opts, b"");
    open.window = 0xffff;
    b.inject(&packet(&open));
    drain(&mut b, &mut peer);
    // Close and let every timer run out (retransmissions give up, TIME-WAIT ends).
    let _ = b.st.close(fd);
    let _ = b.st.close(l);
    for _ in 0..4 {
        let t = b.now + std::time::Duration::from_secs(3600);
        b.advance_to(t, &mut peer);
        drain(&mut b, &mut peer);
    }
    let st = &b.st;
    assert!(
        st.tcp_connections().is_empty(),
        "connections left after close + 4 h: {:?}",
        st.tcp_connections()
    );
    assert_eq!(st.pool().in_use(), 0, "packet buffers leaked");
});
