//! The backend driven from Rust (no C): checks the ACK behaviour around a small read.

use usnet_packetdrill::{Backend, Options};

fn csum(data: &[u8], mut sum: u32) -> u32 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    sum
}
fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An IPv4/TCP packet 192.0.2.1:40000 → 192.168.0.1:8080.
fn pkt(seq: u32, ack: u32, flags: u8, opts: &[u8], data: &[u8]) -> Vec<u8> {
    let thl = 20 + opts.len();
    let total = 20 + thl + data.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&[192, 0, 2, 1]);
    p[16..20].copy_from_slice(&[192, 168, 0, 1]);
    let c = fold(csum(&p[..20], 0));
    p[10..12].copy_from_slice(&c.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&8080u16.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = ((thl / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    t[20..thl].copy_from_slice(opts);
    t[thl..].copy_from_slice(data);
    let mut pseudo = vec![192, 0, 2, 1, 192, 168, 0, 1, 0, 6];
    pseudo.extend_from_slice(&((thl + data.len()) as u16).to_be_bytes());
    let c = fold(csum(&p[20..], csum(&pseudo, 0)));
    p[36..38].copy_from_slice(&c.to_be_bytes());
    p
}

fn fields(p: &[u8]) -> (u32, u32, u8, u16, usize) {
    let t = &p[20..];
    let thl = (t[12] >> 4) as usize * 4;
    (
        u32::from_be_bytes(t[4..8].try_into().unwrap()),
        u32::from_be_bytes(t[8..12].try_into().unwrap()),
        t[13],
        u16::from_be_bytes([t[14], t[15]]),
        t.len() - thl,
    )
}

fn established(opts: &[u8]) -> (Backend, i32, u32) {
    let mut b = Backend::new(&Options::default()).unwrap();
    let l = b.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
    b.bind(l, "192.168.0.1:8080".parse().unwrap()).unwrap();
    b.listen(l, 4).unwrap();
    b.inject(&pkt(1000, 0, 0x02, opts, b"")).unwrap();
    let (synack, _) = b.sniff(0).expect("SYN-ACK");
    let (isn, ack, fl, _, _) = fields(&synack);
    assert_eq!((ack, fl), (1001, 0x12));
    b.inject(&pkt(1001, isn + 1, 0x10, &[], b"")).unwrap();
    let (fd, _) = b.try_accept(l).unwrap();
    (b, fd, isn)
}

/// A 5-byte segment is ACKed once; reading those 5 bytes must not send a second,
/// identical ACK (nothing changed that the peer can see).
fn small_read_acks_once(opts: &[u8]) -> Vec<(u32, u32, u8, u16, usize)> {
    let (mut b, fd, isn) = established(opts);
    b.inject(&pkt(1001, isn + 1, 0x18, &[], b"ping!")).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(b.try_read(fd, &mut buf), Ok(5));
    let mut seen = Vec::new();
    while let Some((p, _)) = b.sniff(0) {
        seen.push(fields(&p));
    }
    seen
}

#[test]
fn small_read_acks_once_with_window_scaling() {
    // MSS 1000, NOP, WS 7
    let seen = small_read_acks_once(&[2, 4, 3, 232, 1, 3, 3, 7]);
    assert_eq!(seen.len(), 1, "{seen:?}");
}

/// BUG (usnet-tcp `Connection::after_app_read`): without window scaling every small
/// read sends a duplicate ACK. The update test compares `rcv_nxt + rcv_window_available()`
/// (up to `rcv_space`, 128 KiB) with `rcv_adv`, but the advertised window was clamped
/// to 65535 (no scaling), so the "growth" is never seen by the peer and never shrinks.
#[test]
fn small_read_acks_once_without_window_scaling() {
    let seen = small_read_acks_once(&[2, 4, 3, 232]);
    assert_eq!(seen.len(), 1, "{seen:?}");
}

/// BUG (usnet-tcp persist timer, `conn/output.rs`): unanswered zero-window probes never
/// give up. Here the peer ACKs everything with a zero window and then falls silent; the
/// application writes and closes. Linux aborts such a connection after
/// `tcp_retries2` (or, orphaned, `tcp_orphan_retries`) unanswered probes; usnet keeps
/// the orphan in FIN-WAIT-1 probing forever (backoff capped at `persist_max`), so a peer
/// can pin connections and their send buffers indefinitely. Found by the
/// `tcp_established` fuzz target.
#[test]
fn orphan_behind_zero_window_is_reaped() {
    let (mut b, fd, isn) = established(&[2, 4, 5, 180, 1, 3, 3, 7]);
    assert_eq!(b.try_write(fd, &[7u8; 100], false), Ok(100));
    while b.sniff(0).is_some() {}
    let mut zero = pkt(1001, isn + 101, 0x10, &[], b"");
    zero[34..36].copy_from_slice(&[0, 0]); // window 0
    let c = fields(&zero);
    assert_eq!(c.3, 0);
    // fix the checksum after editing the window
    zero[36..38].copy_from_slice(&[0, 0]);
    let mut pseudo = vec![192, 0, 2, 1, 192, 168, 0, 1, 0, 6];
    pseudo.extend_from_slice(&((zero.len() - 20) as u16).to_be_bytes());
    let ck = fold(csum(&zero[20..], csum(&pseudo, 0)));
    zero[36..38].copy_from_slice(&ck.to_be_bytes());
    b.inject(&zero).unwrap();
    let _ = b.try_write(fd, &[8u8; 700], false);
    b.close(fd).unwrap();
    let hour = 3_600_000_000_000u64;
    b.advance_to(b.now_us() * 1000 + 10 * hour);
    while b.sniff(0).is_some() {}
    let left = b.stack().tcp_connections();
    assert!(left.is_empty(), "{left:?}");
}

/// BUG (usnet-tcp close path): `shutdown(SHUT_WR)`, the peer ACKs the FIN (FIN-WAIT-2),
/// then `close()`: the connection is now an orphan in FIN-WAIT-2 but the orphan
/// FIN-WAIT-2 timeout is not armed, so if the peer never sends its FIN the connection
/// is never reaped (Linux arms `tcp_fin_timeout` in `tcp_close`). Found by the
/// `tcp_established` fuzz target.
#[test]
fn orphan_in_fin_wait_2_after_shutdown_is_reaped() {
    let (mut b, fd, isn) = established(&[2, 4, 5, 180, 1, 3, 3, 7]);
    b.shutdown(fd, libc::SHUT_WR).unwrap();
    let (fin, _) = b.sniff(0).expect("FIN");
    assert_eq!(fields(&fin).2 & 0x01, 0x01);
    b.inject(&pkt(1001, isn + 2, 0x10, &[], b"")).unwrap();
    b.close(fd).unwrap();
    b.advance_to(b.now_us() * 1000 + 3_600_000_000_000);
    while b.sniff(0).is_some() {}
    let left = b.stack().tcp_connections();
    assert!(left.is_empty(), "{left:?}");
}

/// Defect 1: `netdev_receive` must move the clock by its horizon (1 s) when the next
/// stack timer is further away, else packetdrill asks again for ever at the same
/// virtual time. A connect's SYN is retransmitted at 1 s and 3 s: the call made at
/// 1 s returns nothing at 2 s, the next one the SYN at 3 s.
#[test]
fn netdev_receive_moves_the_clock_by_its_horizon() {
    use usnet_packetdrill::backend::shared::{Shared, SNIFF_HORIZON_NS};
    let b = Backend::new(&Options::default()).unwrap();
    let s = Shared::new(b);
    let fd = s.call(|b| b.socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0));
    let fd = fd.unwrap();
    assert_eq!(
        s.connect(fd, "192.0.2.1:8080".parse().unwrap()),
        Err(libc::EINPROGRESS)
    );
    let mut buf = [0u8; 2048];
    let mut at = Vec::new();
    for _ in 0..5 {
        let t0 = s.lock().now_ns();
        let got = s.netdev_receive(&mut buf);
        let t1 = s.lock().now_ns();
        assert!(got.is_some() || t1 > t0, "the clock moved");
        assert!(t1 - t0 <= SNIFF_HORIZON_NS);
        at.push((got.is_some(), t1 / 1_000_000));
    }
    assert_eq!(
        at,
        [
            (true, 0),
            (true, 1000),
            (false, 2000),
            (true, 3000),
            (false, 4000)
        ]
    );
}

/// Defect 2: a blocking read woken by an injected packet completes at the packet's
/// virtual time, even when the main thread sleeps on at once: the clock waits for the
/// woken call to re-poll, and the call's thread reads its completion time.
#[test]
fn a_woken_read_completes_before_the_clock_moves_on() {
    use std::sync::Arc;
    use usnet_packetdrill::backend::shared::Shared;
    for _ in 0..20 {
        let (b, fd, isn) = established(&[2, 4, 3, 232]);
        let s = Arc::new(Shared::new(b));
        let reader = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let _in = s.enter();
                let mut buf = [0u8; 100];
                let n = s.read(fd, &mut buf, 0);
                (n, s.gettimeofday())
            })
        };
        // Let the reader block inside the library.
        while s.waiting() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (sent_at, wall0) = {
            let _in = s.enter();
            s.netdev_send(&pkt(1001, isn + 1, 0x18, &[], b"hello"))
                .unwrap();
            let g = s.lock();
            (g.now_us(), g.wall_us(0))
        };
        {
            let _in = s.enter();
            s.usleep(100_000);
        }
        let (n, t) = reader.join().unwrap();
        assert_eq!(n, Ok(5));
        assert_eq!(t - wall0, sent_at as i64, "completed when the packet came");
    }
}

/// packetdrill records a blocking call's result (an accepted descriptor, which a
/// `%{ }%` right after needs) after the call's thread read its completion time,
/// outside the library and under packetdrill's own lock, which the main thread
/// releases only while it sleeps: the next `usleep` waits for that (a short
/// real-time grace) before the clock moves.
#[test]
fn the_clock_waits_for_a_completed_call_to_be_recorded() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use usnet_packetdrill::backend::shared::{Shared, RECORD_GRACE};
    let (b, fd, isn) = established(&[2, 4, 3, 232]);
    let s = Arc::new(Shared::new(b));
    let recorded = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, recorded) = (Arc::clone(&s), Arc::clone(&recorded));
        std::thread::spawn(move || {
            let n = {
                let _in = s.enter();
                let mut buf = [0u8; 100];
                s.read(fd, &mut buf, 0)
            };
            s.gettimeofday();
            // packetdrill's bookkeeping after the call.
            std::thread::sleep(RECORD_GRACE / 4);
            recorded.store(true, Ordering::SeqCst);
            n
        })
    };
    while s.waiting() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    {
        let _in = s.enter();
        s.netdev_send(&pkt(1001, isn + 1, 0x18, &[], b"hello"))
            .unwrap();
    }
    {
        let _in = s.enter();
        s.usleep(5_000);
    }
    assert!(
        recorded.load(Ordering::SeqCst),
        "usleep waited for the record"
    );
    assert_eq!(reader.join().unwrap(), Ok(5));
}

/// TCP_INFO through the backend's getsockopt, in Linux's `struct tcp_info` layout.
#[test]
fn tcp_info_has_linux_layout() {
    // MSS 1000, NOP, WS 7, SACK-permitted
    let (mut b, fd, _) = established(&[2, 4, 3, 232, 1, 3, 3, 7, 4, 2, 1, 1]);
    let i = b
        .getsockopt_struct(fd, libc::IPPROTO_TCP, libc::TCP_INFO)
        .unwrap()
        .unwrap();
    assert_eq!(i.len(), usnet_packetdrill::backend::TCP_INFO_LEN);
    let u32_at = |o: usize| u32::from_ne_bytes(i[o..o + 4].try_into().unwrap());
    assert_eq!(i[0], 1, "TCP_ESTABLISHED");
    assert_eq!(i[5], 2 | 4, "TCPI_OPT_SACK | TCPI_OPT_WSCALE");
    assert_eq!(i[6] & 0xf, 7, "the peer's shift");
    assert_eq!(u32_at(16), 1000, "tcpi_snd_mss");
    assert_eq!(u32_at(80), 10, "tcpi_snd_cwnd in segments");
    assert_eq!(u32_at(24), 0, "nothing unacknowledged");
    assert!(b
        .getsockopt_struct(fd, libc::SOL_SOCKET, libc::SO_TYPE)
        .is_none());
    assert_eq!(
        b.getsockopt_struct(99, libc::IPPROTO_TCP, libc::TCP_INFO),
        Some(Err(libc::EBADF))
    );
}
