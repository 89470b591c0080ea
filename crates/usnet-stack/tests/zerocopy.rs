//! The zero-copy ring API in whole conversations on the simulated wire: loss,
//! duplication, reordering and corruption, every byte checked, the pool back to its
//! baseline afterwards, and a misbehaving application refused without harm.

mod common;

use std::time::Duration;

use common::{cfg, fill, pattern, sa};
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::zerocopy::{
    Slot, ZcPort, NO_BUF, SLOT_BUF_CHANGED, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_KEEP, SLOT_NEW,
    SLOT_SHUT_WR,
};
use usnet_stack::{SocketHandle, Stack, StackError};

fn faults() -> Faults {
    Faults {
        loss: 0.02,
        duplicate: 0.02,
        corrupt: 0.01,
        reorder: 0.05,
        ..Faults::default()
    }
}

fn pair(seed: u64, faults: Faults) -> SimNet {
    pair_with(seed, faults, false)
}

/// Two stacks; with `tso`, both join segments into GSO frames.
fn pair_with(seed: u64, faults: Faults, tso: bool) -> SimNet {
    let mut net = SimNet::new(seed, faults);
    for i in 1..=2 {
        let mut c = cfg(i);
        c.tso = tso;
        c.tx_csum_offload |= tso;
        net.add(c).unwrap();
    }
    net
}

/// Queues `data` on `h` through the port's TX ring, one buffer per piece of at most
/// `piece` bytes; returns how many bytes it submitted (the ring or the pool may run
/// out).
fn submit(s: &mut Stack, port: &mut ZcPort, h: SocketHandle, data: &[u8], piece: usize) -> usize {
    let head = s.zc_headroom();
    let mut done = 0;
    for chunk in data.chunks(piece.min(s.zc_buf_capacity() as usize)) {
        if port.tx.tx_space() == 0 {
            break;
        }
        let Some(b) = s.zc_alloc(port) else { break };
        s.zc_buf_mut(port, b).unwrap()[head as usize..][..chunk.len()].copy_from_slice(chunk);
        assert!(port.tx.push(Slot::new(h, b, head, chunk.len() as u32, 0)));
        done += chunk.len();
    }
    done
}

/// Stack 1 echoes through the ring API, sending back each received buffer itself
/// (no copy: the payload's offset in the received frame leaves room for the
/// headers); stack 0 sends `total` bytes with the copying API and checks the echo.
/// With `tso`, full-sized segments leave as GSO frames that carry the received
/// buffers as fragments (no payload copied), which must hold the buffers exactly
/// as long as the frames live.
fn echo(seed: u64, faults: Faults, total: u64, tso: bool) {
    let clean = faults == Faults::default();
    let mut net = pair_with(seed, faults, tso);
    let server = sa("10.0.0.2:7");
    let base = net.stack(1).pool().in_use();
    let mut port = net.stack(1).zc_port(256, 256);
    net.stack_mut(1).zc_listen(&mut port, server, 16).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
    let (mut sent, mut got, mut echoed) = (0u64, 0u64, 0u64);
    let (mut shut, mut cli_closed, mut srv_closed) = (false, false, false);
    let mut chunk = vec![0u8; 16 * 1024];
    let mut rbuf = vec![0u8; 64 * 1024];
    let mut pending: Vec<Slot> = Vec::new();
    let mut conn = None;
    let ok = net.run_until(Duration::from_secs(600), |n| {
        let s = n.stack_mut(0);
        while sent < total {
            let want = (total - sent).min(chunk.len() as u64) as usize;
            fill(&mut chunk[..want], sent);
            match s.tcp_send(c, &chunk[..want]) {
                Ok(k) => sent += k as u64,
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("client send: {e:?}"),
            }
        }
        if sent == total && !shut {
            s.tcp_shutdown_write(c).unwrap();
            shut = true;
        }
        loop {
            match s.tcp_recv(c, &mut rbuf) {
                Ok(0) => {
                    if !cli_closed {
                        assert_eq!(got, total, "echo ended early");
                        s.tcp_close(c).unwrap();
                        cli_closed = true;
                    }
                    break;
                }
                Ok(k) => {
                    for (j, b) in rbuf[..k].iter().enumerate() {
                        assert_eq!(*b, pattern(got + j as u64), "echo byte {}", got + j as u64);
                    }
                    got += k as u64;
                }
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("client recv: {e:?}"),
            }
        }
        // The server: one sync, then the RX slots; data goes back out as is.
        let s = n.stack_mut(1);
        s.zc_sync(&mut port);
        while port.rx.head != port.rx.tail {
            let slot = *port.rx.slot(port.rx.head);
            if slot.flags & SLOT_NEW != 0 {
                conn = Some(slot.handle());
            } else if slot.flags & SLOT_EOF != 0 {
                pending.push(Slot::new(slot.handle(), NO_BUF, 0, 0, SLOT_CLOSE));
            } else if slot.flags & SLOT_ERROR != 0 {
                panic!("server connection failed");
            } else {
                let bytes = s
                    .zc_bytes(&port, &slot)
                    .expect("the app holds its RX buffer");
                assert_eq!(bytes.len(), slot.len as usize);
                for (j, b) in bytes.iter().enumerate() {
                    assert_eq!(*b, pattern(echoed + j as u64), "server byte");
                }
                echoed += u64::from(slot.len);
                // Keep the buffer (a spare goes back in its place) and send it.
                let spare = s.zc_alloc(&mut port).expect("pool");
                let sl = port.rx.slot_mut(port.rx.head);
                sl.buf = spare;
                sl.flags |= SLOT_BUF_CHANGED;
                pending.push(Slot::new(slot.handle(), slot.buf, slot.off, slot.len, 0));
            }
            port.rx.head = port.rx.next(port.rx.head);
        }
        while let Some(p) = pending.first() {
            if !port.tx.push(*p) {
                break;
            }
            if p.flags & SLOT_CLOSE != 0 {
                srv_closed = true;
            }
            pending.remove(0);
        }
        s.zc_sync(&mut port);
        // A slot the send queue could not take yet stays between tail and head.
        cli_closed && srv_closed && pending.is_empty() && port.tx.tail == port.tx.head
    });
    assert!(
        ok,
        "echo stalled: sent {sent} echoed {echoed} got {got} of {total}; wire {:?}",
        net.stats
    );
    assert!(conn.is_some());
    net.run_for(Duration::from_secs(5));
    let s = net.stack_mut(1);
    s.zc_sync(&mut port);
    assert_eq!(port.stats().bad_slots, 0);
    assert_eq!(port.held_buffers(), 0, "the application holds nothing");
    assert_eq!(port.stats().rx_bytes, total);
    assert_eq!(port.stats().tx_bytes, total);
    let c = s.counters();
    if tso {
        assert!(c.tcp_zc_tx_attached > 0, "GSO frames of fragments");
        if clean {
            // Every full segment joined a frame, every short one left in place.
            assert_eq!(c.tcp_zc_tx_copied, 0, "no payload copied");
        }
    } else {
        assert!(c.tcp_zc_tx_in_place > 0, "segments left in place");
        assert_eq!(c.tcp_zc_tx_attached, 0);
    }
    s.zc_close_port(port);
    assert_eq!(s.pool().in_use(), base, "pool back to its baseline");
}

#[test]
fn echo_through_the_rings_on_a_clean_wire() {
    echo(1, Faults::default(), 1 << 20, false);
}

#[test]
fn echo_through_the_rings_with_tso_sends_the_buffers_as_fragments() {
    echo(11, Faults::default(), 2 << 20, true);
    for seed in [12, 13] {
        echo(seed, faults(), 512 << 10, true);
    }
}

#[test]
fn echo_through_the_rings_under_loss_reorder_duplication_corruption() {
    for seed in [2, 3, 4] {
        echo(seed, faults(), 512 << 10, false);
    }
}

/// Both ends on rings: stack 0 sends `total` bytes in pieces through its TX ring,
/// stack 1 reads them from its RX ring and answers a small response per 64 KiB.
#[test]
fn both_ends_on_rings_under_faults() {
    let mut net = pair(7, faults());
    let server = sa("[fd00::2]:8080");
    let base = (net.stack(0).pool().in_use(), net.stack(1).pool().in_use());
    let mut cport = net.stack(0).zc_port(64, 64);
    let mut sport = net.stack(1).zc_port(64, 64);
    net.stack_mut(1).zc_listen(&mut sport, server, 4).unwrap();
    let c = net.stack_mut(0).zc_connect(&mut cport, server).unwrap();
    let total = 768u64 << 10;
    let (mut sent, mut got, mut back) = (0u64, 0u64, 0u64);
    let mut data = vec![0u8; 8192];
    let (mut cli_done, mut srv_done) = (false, false);
    let ok = net.run_until(Duration::from_secs(600), |n| {
        let s = n.stack_mut(0);
        if sent < total {
            let want = (total - sent).min(data.len() as u64) as usize;
            fill(&mut data[..want], sent);
            // Pieces of 1000 bytes: each leaves as one segment, in place.
            sent += submit(s, &mut cport, c, &data[..want], 1000) as u64;
            if sent == total {
                // Half-close: the responses still come back.
                assert!(cport.tx.push(Slot::new(c, NO_BUF, 0, 0, SLOT_SHUT_WR)));
            }
        }
        s.zc_sync(&mut cport);
        while cport.rx.head != cport.rx.tail {
            let slot = *cport.rx.slot(cport.rx.head);
            if slot.len > 0 {
                let b = s.zc_bytes(&cport, &slot).unwrap();
                assert!(b.iter().all(|&x| x == b'R'));
                back += u64::from(slot.len);
            }
            if slot.flags & SLOT_EOF != 0 {
                assert!(cport.tx.push(Slot::new(c, NO_BUF, 0, 0, SLOT_CLOSE)));
                cli_done = true;
            }
            cport.rx.head = cport.rx.next(cport.rx.head);
        }
        s.zc_sync(&mut cport);
        let s = n.stack_mut(1);
        s.zc_sync(&mut sport);
        while sport.rx.head != sport.rx.tail {
            let slot = *sport.rx.slot(sport.rx.head);
            if slot.len > 0 {
                let b = s.zc_bytes(&sport, &slot).unwrap();
                for (j, x) in b.iter().enumerate() {
                    assert_eq!(*x, pattern(got + j as u64));
                }
                let before = got >> 16;
                got += u64::from(slot.len);
                for _ in before..(got >> 16) {
                    let h = slot.handle();
                    assert_eq!(submit(s, &mut sport, h, &[b'R'; 100], 100), 100);
                }
            }
            if slot.flags & SLOT_EOF != 0 {
                assert!(sport
                    .tx
                    .push(Slot::new(slot.handle(), NO_BUF, 0, 0, SLOT_CLOSE)));
                srv_done = true;
            }
            sport.rx.head = sport.rx.next(sport.rx.head);
        }
        s.zc_sync(&mut sport);
        cli_done && srv_done
    });
    assert!(
        ok,
        "stalled: sent {sent} got {got} back {back}; wire {:?}\n{:?}\n{:?}\n{:?} {:?}\n{:?}\n{:?}",
        net.stats,
        net.stack(0).pool().stats(),
        net.stack(1).pool().stats(),
        cport.stats(),
        sport.stats(),
        net.stack(0).tcp_connections(),
        net.stack(1).tcp_connections()
    );
    assert_eq!(got, total);
    assert_eq!(back, (total >> 16) * 100);
    net.run_for(Duration::from_secs(130));
    assert_eq!((cport.held_buffers(), sport.held_buffers()), (0, 0));
    net.stack_mut(0).zc_close_port(cport);
    net.stack_mut(1).zc_close_port(sport);
    assert_eq!(
        (net.stack(0).pool().in_use(), net.stack(1).pool().in_use()),
        base,
        "pools back to their baseline"
    );
}

/// Two clean stacks, stack 1 listening on `server` through a port of 16 slots, and
/// one connection from stack 0 accepted: the net, the port, the client's handle and
/// the server's.
fn accepted(
    seed: u64,
    server: std::net::SocketAddr,
) -> (SimNet, ZcPort, SocketHandle, SocketHandle) {
    let mut net = pair(seed, Faults::default());
    let mut port = net.stack(1).zc_port(16, 16);
    net.stack_mut(1).zc_listen(&mut port, server, 4).unwrap();
    let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
    let mut conn = None;
    assert!(net.run_until(Duration::from_secs(5), |n| {
        let s = n.stack_mut(1);
        s.zc_sync(&mut port);
        if port.rx.head != port.rx.tail {
            let slot = *port.rx.slot(port.rx.head);
            assert_ne!(slot.flags & SLOT_NEW, 0);
            conn = Some(slot.handle());
            port.rx.head = port.rx.next(port.rx.head);
        }
        conn.is_some()
    }));
    (net, port, c, conn.unwrap())
}

/// Bad indices, a buffer given back twice, a buffer the application never had, a
/// socket that is not the port's, ranges outside the buffer and a `head` past
/// `tail`: each refused and counted; the stack's state and pool are untouched and a
/// transfer afterwards works.
#[test]
fn a_misbehaving_application_is_refused_and_cannot_corrupt_the_stack() {
    let (mut net, mut port, c, h) = accepted(9, sa("10.0.0.2:9"));
    let s = net.stack_mut(1);
    let in_use = s.pool().in_use();
    let mut bad = 0;
    // Indices that name no buffer, and a buffer the application does not hold (the
    // pool hands out low indices first: the last one is free).
    for b in [u32::MAX - 1, s.pool().count(), s.pool().count() - 1] {
        assert!(s.zc_free(&mut port, b).is_err());
        bad += 1;
        assert!(s.zc_buf_mut(&port, b).is_none());
        assert!(port.tx.push(Slot::new(h, b, 200, 10, 0)));
        bad += 1;
    }
    // A buffer given back twice.
    let b = s.zc_alloc(&mut port).unwrap();
    s.zc_free(&mut port, b).unwrap();
    assert!(s.zc_free(&mut port, b).is_err());
    bad += 1;
    // Ranges outside the buffer, and a socket that is not the port's.
    let b = s.zc_alloc(&mut port).unwrap();
    let size = s.pool().buf_size() as u32;
    assert!(port.tx.push(Slot::new(h, b, size - 5, 10, 0)));
    assert!(port.tx.push(Slot::new(h, b, u32::MAX, 2, 0)));
    assert!(port
        .tx
        .push(Slot::new(SocketHandle::from_raw(12345), b, 200, 10, 0)));
    bad += 3;
    s.zc_sync(&mut port);
    // Every refused TX slot says so, and the buffer is still the application's.
    let mut i = 0;
    let mut refused = 0;
    while i != port.tx.tail {
        refused += (port.tx.slot(i).flags & SLOT_ERROR != 0) as u64;
        i = port.tx.next(i);
    }
    assert_eq!(refused, 6);
    assert!(s.zc_buf_mut(&port, b).is_some());
    // `head` moved past `tail`.
    port.rx.head = port.rx.next(port.rx.tail);
    s.zc_sync(&mut port);
    bad += 1;
    assert_eq!(port.rx.head, port.rx.tail, "a bad head is put back");
    assert_eq!(port.stats().bad_slots, bad);
    assert_eq!(s.counters().tcp_zc_bad_slots, bad);
    assert_eq!(s.pool().in_use(), in_use + 1, "only the buffer still held");
    s.zc_free(&mut port, b).unwrap();
    // The connection still works.
    let mut got = Vec::new();
    net.stack_mut(0).tcp_send(c, b"still fine").unwrap();
    assert!(net.run_until(Duration::from_secs(5), |n| {
        let s = n.stack_mut(1);
        s.zc_sync(&mut port);
        while port.rx.head != port.rx.tail {
            let slot = *port.rx.slot(port.rx.head);
            got.extend_from_slice(s.zc_bytes(&port, &slot).unwrap());
            port.rx.head = port.rx.next(port.rx.head);
        }
        s.zc_sync(&mut port);
        got == b"still fine"
    }));
    assert_eq!(port.held_buffers(), 0);
    net.stack_mut(1).zc_close_port(port);
}

mod garbage {
    use super::*;
    use proptest::prelude::*;

    /// What an application may do to its port between syncs.
    #[derive(Debug, Clone)]
    enum Act {
        /// A TX slot with arbitrary fields (the buffer and socket drawn from real
        /// ones, off by a little, or made up).
        Tx {
            buf: u32,
            off: u32,
            len: u32,
            flags: u16,
            sock: u8,
        },
        /// Move the RX head forward by n (possibly past tail).
        RxHead(u32),
        /// Overwrite the RX slot at head before giving it back.
        RxScribble {
            buf: u32,
            flags: u16,
        },
        Free(u32),
        Alloc,
        Step,
    }

    fn act() -> impl Strategy<Value = Act> {
        prop_oneof![
            (0u32..8, 0u32..2100, 0u32..2100, any::<u16>(), 0u8..4).prop_map(
                |(buf, off, len, flags, sock)| Act::Tx {
                    buf,
                    off,
                    len,
                    flags,
                    sock
                }
            ),
            (0u32..20).prop_map(Act::RxHead),
            (0u32..8, any::<u16>()).prop_map(|(buf, flags)| Act::RxScribble { buf, flags }),
            (0u32..8).prop_map(Act::Free),
            Just(Act::Alloc),
            Just(Act::Step),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Whatever the application writes into its rings, the stack neither
        /// panics nor leaks: after the port closes, the pool is back to baseline.
        #[test]
        fn arbitrary_slots_never_hurt_the_stack(acts in proptest::collection::vec(act(), 1..120)) {
            let mut net = pair(11, Faults::default());
            let server = sa("10.0.0.2:11");
            let base = net.stack(1).pool().in_use();
            let mut port = net.stack(1).zc_port(8, 8);
            let l = net.stack_mut(1).zc_listen(&mut port, server, 4).unwrap();
            let c = net.stack_mut(0).tcp_connect(None, server).unwrap();
            let mut mine: Vec<u32> = Vec::new();
            let mut socks = vec![l, SocketHandle::from_raw(99)];
            for a in acts {
                let _ = net.stack_mut(0).tcp_send(c, &[7u8; 3000]);
                let s = net.stack_mut(1);
                match a {
                    Act::Tx { buf, off, len, flags, sock } => {
                        let b = match buf {
                            0..=3 => mine.get(buf as usize).copied().unwrap_or(buf),
                            4 => u32::MAX,
                            n => s.pool().count() - n,
                        };
                        let h = socks[sock as usize % socks.len()];
                        port.tx.push(Slot::new(h, b, off, len, flags));
                    }
                    Act::RxHead(n) => {
                        for _ in 0..n {
                            port.rx.head = port.rx.next(port.rx.head);
                        }
                    }
                    Act::RxScribble { buf, flags } => {
                        let b = mine.get(buf as usize).copied().unwrap_or(buf);
                        let h = port.rx.head;
                        let sl = port.rx.slot_mut(h);
                        sl.buf = b;
                        sl.flags = flags;
                    }
                    Act::Free(k) => {
                        let b = mine.get(k as usize).copied().unwrap_or(k);
                        let _ = s.zc_free(&mut port, b);
                    }
                    Act::Alloc => mine.extend(s.zc_alloc(&mut port)),
                    Act::Step => {
                        net.run_for(Duration::from_millis(5));
                    }
                }
                let s = net.stack_mut(1);
                s.zc_sync(&mut port);
                socks.extend(port.sockets().filter(|h| !socks.contains(h)).collect::<Vec<_>>());
                let _ = net.stack_mut(0).tcp_recv(c, &mut [0u8; 4096]);
                net.run_for(Duration::from_millis(1));
            }
            let _ = net.stack_mut(0).tcp_abort(c);
            net.run_for(Duration::from_secs(2));
            let s = net.stack_mut(1);
            s.zc_close_port(port);
            net.run_for(Duration::from_secs(130));
            prop_assert_eq!(net.stack(1).pool().in_use(), base);
        }
    }
}

/// The copying calls on a zero-copy connection cut the bytes into pieces of the
/// connection's piece length, and a write that ends mid-piece is continued by the
/// next one in the same piece while none of it was sent, so without TSO every
/// segment is one piece, in place: the copy into the pieces is the only one.
/// Before, pieces of a whole buffer straddled segments, and after the first
/// 16 KiB write's short tail every segment did: each was gathered again.
#[test]
fn copying_sends_on_a_zero_copy_connection_leave_in_place() {
    let mut net = pair(21, Faults::default());
    let server = sa("10.0.0.2:9");
    let l = net.stack_mut(1).tcp_listen(server, 4).unwrap();
    let mut port = net.stack(0).zc_port(64, 64);
    let c = net.stack_mut(0).zc_connect(&mut port, server).unwrap();
    let total = 256u64 << 10;
    let (mut sent, mut got) = (0u64, 0u64);
    let mut conn = None;
    let mut chunk = Vec::new();
    let mut rbuf = vec![0u8; 64 * 1024];
    let ok = net.run_until(Duration::from_secs(60), |n| {
        let s = n.stack_mut(0);
        s.zc_sync(&mut port);
        while port.rx.head != port.rx.tail {
            port.rx.head = port.rx.next(port.rx.head);
        }
        // Once established: the piece length follows the negotiated MSS.
        let established = s.tcp_state(c) == Ok(usnet_stack::TcpState::Established);
        if established && chunk.is_empty() {
            // 16 KiB writes: no whole number of pieces.
            chunk = vec![0u8; 16 * 1024];
        }
        while established && sent < total {
            let want = (total - sent).min(chunk.len() as u64) as usize;
            fill(&mut chunk[..want], sent);
            match s.tcp_send(c, &chunk[..want]) {
                Ok(k) => sent += k as u64,
                Err(StackError::WouldBlock) => break,
                Err(e) => panic!("send: {e:?}"),
            }
        }
        let s = n.stack_mut(1);
        if conn.is_none() {
            conn = s.tcp_accept(l).ok();
        }
        if let Some(h) = conn {
            while let Ok(k) = s.tcp_recv(h, &mut rbuf) {
                if k == 0 {
                    break;
                }
                for (j, b) in rbuf[..k].iter().enumerate() {
                    assert_eq!(*b, pattern(got + j as u64), "byte {}", got + j as u64);
                }
                got += k as u64;
            }
        }
        got == total
    });
    assert!(ok, "sent {sent} got {got} of {total}");
    let c = net.stack(0).counters_snapshot();
    assert!(c.tcp_zc_tx_in_place > 0);
    assert_eq!(c.tcp_zc_tx_copied, 0, "every segment in place");
}

/// Two stacks whose connections keep their queues in pool buffers
/// (`TcpConfig::zero_copy` in the stacks' template), with the Fast Open bits
/// `fastopen`.
fn pool_backed_pair(seed: u64, fastopen: u32) -> SimNet {
    let mut net = SimNet::new(seed, Faults::default());
    for i in 1..=2 {
        let mut c = cfg(i);
        c.tcp.zero_copy = true;
        c.tcp.fastopen = fastopen;
        net.add(c).unwrap();
    }
    net
}

/// Both ends zero-copy connections (pool-backed queues) used only through the
/// copying calls, 64 KiB reads of 64 KiB writes: every byte arrives, in order.
/// Before the fix a read that took part of a piece released the part's reference
/// before the queue retained the rest, and the buffer was freed under the queue.
#[test]
fn copying_calls_on_pool_backed_connections_carry_every_byte() {
    let mut net = pool_backed_pair(22, usnet_stack::TcpConfig::default().fastopen);
    common::transfer_with(
        &mut net,
        sa("10.0.0.2:10"),
        1 << 20,
        Duration::from_secs(60),
        |_| {},
    );
}

/// Fast Open between two stacks whose connections keep their queues in pool
/// buffers: the client's SYN carries its data (queued as a piece), and the
/// server's listener keeps the SYN's data in the frame's buffer. Before, the client
/// queued nothing (`Connection::send` takes no bytes on such a connection) and the
/// server dropped the SYN's data (it came without its buffer).
#[test]
fn fast_open_syn_data_on_pool_backed_connections() {
    use usnet_tcp::config::{FASTOPEN_CLIENT, FASTOPEN_SERVER};
    let mut net = pool_backed_pair(23, FASTOPEN_CLIENT | FASTOPEN_SERVER);
    let base = (net.stack(0).pool().in_use(), net.stack(1).pool().in_use());
    let server = sa("10.0.0.2:11");
    let l = net.stack_mut(1).tcp_listen(server, 8).unwrap();
    net.stack_mut(1).tcp_set_fastopen(l, 8).unwrap();
    let mut data = vec![0u8; 1000];
    fill(&mut data, 0);
    let mut rbuf = vec![0u8; 4096];
    for round in 0..2 {
        // The first round fetches a cookie; the second spends it.
        let (c, n) = net
            .stack_mut(0)
            .tcp_connect_fastopen(None, server, &data)
            .unwrap();
        assert_eq!(n, if round == 0 { 0 } else { data.len() }, "round {round}");
        let mut conn = None;
        let mut got = Vec::new();
        let ok = net.run_until(Duration::from_secs(10), |n| {
            let s = n.stack_mut(1);
            if conn.is_none() {
                conn = s.tcp_accept(l).ok();
            }
            if let Some(h) = conn {
                while let Ok(k) = s.tcp_recv(h, &mut rbuf) {
                    if k == 0 {
                        break;
                    }
                    got.extend_from_slice(&rbuf[..k]);
                }
            }
            round == 0 && conn.is_some() || got.len() == data.len()
        });
        assert!(ok, "round {round}: got {} bytes", got.len());
        let h = conn.unwrap();
        if round == 1 {
            assert_eq!(got, data);
            let st = net.stack(1).tcp_conn_stats(h).unwrap();
            assert_eq!(
                st.tfo_syn_data_accepted, 1,
                "the server took the SYN's data"
            );
        }
        net.stack_mut(0).tcp_abort(c).unwrap();
        net.stack_mut(1).tcp_abort(h).unwrap();
        net.run_for(Duration::from_secs(1));
    }
    net.run_for(Duration::from_secs(5));
    assert_eq!(net.stack(0).pool().in_use(), base.0);
    assert_eq!(net.stack(1).pool().in_use(), base.1);
}

/// The bytes of the cached response in [`kept_buffers_go_out_on_many_connections`]:
/// piece `k` of `n` bytes, as the server wrote it once.
fn cached_byte(k: usize, j: usize) -> u8 {
    pattern((k * 7919 + j) as u64)
}

/// A response written once into buffers the application keeps (`SLOT_KEEP`) and
/// sent `rounds` times on each of three connections, under faults: every client
/// reads every byte right, no segment of a shared buffer leaves in place (two frames
/// would write their headers into one headroom), and once everything is
/// acknowledged the application's hold is the buffers' only reference again. With
/// TSO the pieces travel as fragments; without, the stack copies them per frame.
fn kept_buffers(seed: u64, tso: bool) {
    let mut net = pair_with(seed, faults(), tso);
    let server = sa("10.0.0.2:12");
    let base = net.stack(1).pool().in_use();
    let mut port = net.stack(1).zc_port(256, 256);
    net.stack_mut(1).zc_listen(&mut port, server, 8).unwrap();
    let clients: Vec<SocketHandle> = (0..3)
        .map(|_| net.stack_mut(0).tcp_connect(None, server).unwrap())
        .collect();
    // Four pieces of one segment each (the piece length a connection's SLOT_NEW
    // gives), written once when the first connection arrives: without TSO such a
    // piece would leave in place if only the queue held it.
    let (pieces, rounds) = (4usize, 40usize);
    let head = net.stack(1).zc_headroom();
    let mut cache: Vec<u32> = Vec::new();
    let mut piece_len = 0usize;
    // Per server connection: slots still to submit.
    let mut owed: Vec<(SocketHandle, usize)> = Vec::new();
    let mut got = vec![0usize; clients.len()];
    let mut rbuf = vec![0u8; 16 * 1024];
    let ok = net.run_until(Duration::from_secs(600), |n| {
        let s = n.stack_mut(1);
        s.zc_sync(&mut port);
        while port.rx.head != port.rx.tail {
            let slot = *port.rx.slot(port.rx.head);
            assert_eq!(slot.flags & SLOT_ERROR, 0, "server connection failed");
            if slot.flags & SLOT_NEW != 0 {
                owed.push((slot.handle(), pieces * rounds));
                if cache.is_empty() {
                    piece_len = slot.off as usize;
                    for k in 0..pieces {
                        let b = s.zc_alloc(&mut port).unwrap();
                        let mem = s.zc_buf_mut(&port, b).unwrap();
                        for (j, x) in mem[head as usize..][..piece_len].iter_mut().enumerate() {
                            *x = cached_byte(k, j);
                        }
                        cache.push(b);
                    }
                }
            }
            port.rx.head = port.rx.next(port.rx.head);
        }
        for (h, left) in owed.iter_mut() {
            while *left > 0 && port.tx.tx_space() > 0 {
                let k = (pieces * rounds - *left) % pieces;
                let slot = Slot::new(*h, cache[k], head, piece_len as u32, SLOT_KEEP);
                assert!(port.tx.push(slot));
                *left -= 1;
            }
        }
        s.zc_sync(&mut port);
        let s = n.stack_mut(0);
        for (i, &c) in clients.iter().enumerate() {
            while let Ok(k) = s.tcp_recv(c, &mut rbuf) {
                if k == 0 {
                    break;
                }
                for (j, &b) in rbuf[..k].iter().enumerate() {
                    let at = (got[i] + j) % (pieces * piece_len);
                    assert_eq!(
                        b,
                        cached_byte(at / piece_len, at % piece_len),
                        "connection {i} byte {}",
                        got[i] + j
                    );
                }
                got[i] += k;
            }
        }
        let total = pieces * piece_len * rounds;
        total > 0 && got.iter().all(|&g| g == total) && port.tx.tail == port.tx.head
    });
    assert!(ok, "stalled: got {got:?}; wire {:?}", net.stats);
    // Every acknowledgment in: only the application's hold is left.
    net.run_for(Duration::from_secs(5));
    let s = net.stack_mut(1);
    s.zc_sync(&mut port);
    assert_eq!(port.stats().bad_slots, 0);
    assert_eq!(
        port.stats().tx_kept as usize,
        clients.len() * pieces * rounds
    );
    assert_eq!(
        port.held_buffers(),
        pieces,
        "the application still holds its cache"
    );
    for &b in &cache {
        let id = s.pool().checked(b).expect("a kept buffer is live");
        assert_eq!(
            s.pool().refcount(id),
            1,
            "the queues gave their references back"
        );
    }
    let c = s.counters_snapshot();
    assert_eq!(
        c.tcp_zc_tx_in_place, 0,
        "a shared buffer never leaves in place"
    );
    if tso {
        assert!(c.tcp_zc_tx_attached > 0, "GSO frames of the kept buffers");
    }
    for b in cache {
        s.zc_free(&mut port, b).unwrap();
    }
    s.zc_close_port(port);
    // The FINs of the closes leave, and are acknowledged.
    net.run_for(Duration::from_secs(5));
    assert_eq!(
        net.stack(1).pool().in_use(),
        base,
        "pool back to its baseline"
    );
}

#[test]
fn kept_buffers_go_out_on_many_connections() {
    kept_buffers(31, false);
    kept_buffers(32, true);
}

/// A `SLOT_KEEP` send of a buffer whose reference count is near the pool's limit
/// waits, as for room in a send queue, instead of overflowing the count; once
/// references come back it goes out.
#[test]
fn a_kept_send_waits_while_its_buffer_has_too_many_references() {
    use usnet_stack::zerocopy::KEEP_REFS_MAX;
    let (mut net, mut port, c, h) = accepted(33, sa("10.0.0.2:13"));
    let s = net.stack_mut(1);
    let head = s.zc_headroom();
    let b = s.zc_alloc(&mut port).unwrap();
    s.zc_buf_mut(&port, b).unwrap()[head as usize..][..5].copy_from_slice(b"hello");
    let id = s.pool().checked(b).unwrap();
    let extra = KEEP_REFS_MAX - s.pool().refcount(id);
    for _ in 0..extra {
        s.pool_mut().retain_index(id);
    }
    assert!(port.tx.push(Slot::new(h, b, head, 5, SLOT_KEEP)));
    let r = s.zc_sync(&mut port);
    assert_eq!((r.tx, r.tx_waiting), (0, 1), "the slot waits");
    assert_eq!(s.pool().refcount(id), KEEP_REFS_MAX);
    for _ in 0..extra {
        s.pool_mut().release(id);
    }
    let r = s.zc_sync(&mut port);
    assert_eq!(
        (r.tx, r.tx_waiting),
        (1, 0),
        "and goes once references came back"
    );
    let mut got = Vec::new();
    let mut rbuf = [0u8; 64];
    let ok = net.run_until(Duration::from_secs(10), |n| {
        if let Ok(k) = n.stack_mut(0).tcp_recv(c, &mut rbuf) {
            got.extend_from_slice(&rbuf[..k]);
        }
        got.len() == 5
    });
    assert!(ok);
    assert_eq!(got, b"hello");
    assert_eq!(port.stats().bad_slots, 0);
}
