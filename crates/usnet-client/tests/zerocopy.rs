//! Zero-copy rings for a client process (`usnet_client::zc`) against a stack server
//! in this process: payload checked byte for byte, pool buffers back at their
//! baseline after every test, and a client that writes nonsense into its rings
//! refused without harm to the stack or to another client.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

use usnet_client::zc::{NO_BUF, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_NEW};
use usnet_client::{Client, TcpStream, ZcOptions, ZcPort, ZcSlot};
use usnet_pool::Backing;
use usnet_server::ServerHandle;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn zc_server(name: &str) -> ServerHandle {
    common::server_with(
        name,
        |st| st.pool.backing = Backing::Memfd,
        |cfg| cfg.zero_copy = true,
    )
}

fn pool_in_use(srv: &ServerHandle) -> u32 {
    srv.call(Duration::from_secs(5), |lp| lp.stack().pool().in_use())
        .expect("the loop answers")
}

/// Waits (at most 10 s) for the pool to come back to `baseline`.
fn pool_back_to(srv: &ServerHandle, baseline: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = pool_in_use(srv);
        if now <= baseline {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "pool buffers in use: {now}, baseline {baseline}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

/// An echo over the rings: every received buffer is kept and sent back where it
/// lies. Runs until the peer closed (and the close went out) or `deadline`.
fn zc_echo(port: &mut ZcPort, deadline: Instant) -> (usize, usize) {
    let (mut conns, mut bytes) = (0, 0);
    let mut open = 0usize;
    loop {
        assert!(Instant::now() < deadline, "zero-copy echo stalled");
        while let Some(s) = port.rx_slot() {
            if s.flags & SLOT_NEW != 0 {
                conns += 1;
                open += 1;
                port.rx_advance();
            } else if s.flags & (SLOT_EOF | SLOT_ERROR) != 0 {
                if !port.send(ZcSlot {
                    buf: NO_BUF,
                    flags: SLOT_CLOSE,
                    socket: s.socket,
                    ..ZcSlot::default()
                }) {
                    break;
                }
                open -= 1;
                port.rx_advance();
            } else {
                if port.tx_space() == 0 {
                    break;
                }
                let Some(kept) = port.rx_keep() else { break };
                bytes += s.len as usize;
                assert!(port.send(ZcSlot { buf: kept, ..s }));
            }
        }
        for r in port.tx_refused() {
            if r.buf != NO_BUF {
                port.free(r.buf);
            }
        }
        port.sync().unwrap();
        if conns > 0 && open == 0 {
            return (conns, bytes);
        }
        port.wait(Duration::from_millis(20)).unwrap();
    }
}

#[test]
fn a_client_echoes_through_its_zero_copy_rings() {
    let srv = zc_server("zc-echo");
    let baseline = pool_in_use(&srv);
    let c = Client::attach("zc-echo").unwrap();
    let mut port = ZcPort::open(&c, ZcOptions::default()).unwrap();
    port.listen(sa("10.66.0.1:7100"), 64).unwrap();
    let total = 4 << 20;
    let peer = std::thread::spawn(move || {
        // Another session, with the copying API.
        let c2 = Client::attach("zc-echo").unwrap();
        let s = TcpStream::connect(&c2, sa("10.66.0.1:7100")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let data = pattern(total);
        std::thread::scope(|sc| {
            let r = sc.spawn(|| {
                let mut back = Vec::new();
                (&s).read_to_end(&mut back).unwrap();
                back
            });
            (&s).write_all(&data).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let back = r.join().unwrap();
            assert_eq!(back.len(), total);
            assert!(back == data, "echoed bytes differ");
        });
    });
    let (conns, bytes) = zc_echo(&mut port, Instant::now() + Duration::from_secs(30));
    peer.join().unwrap();
    assert_eq!((conns, bytes), (1, total));
    assert_eq!(port.bad_slots(), 0);
    // The echo left from the buffers it arrived in.
    let (in_place, copied) = srv
        .call(Duration::from_secs(5), |lp| {
            let c = lp.stack().counters();
            (c.tcp_zc_tx_in_place, c.tcp_zc_tx_copied)
        })
        .unwrap();
    assert!(in_place > 0, "in place {in_place}, copied {copied}");
    drop(port);
    pool_back_to(&srv, baseline);
}

#[test]
fn a_zero_copy_client_connects_and_reads_in_place() {
    let srv = zc_server("zc-connect");
    let baseline = pool_in_use(&srv);
    let c = Client::attach("zc-connect").unwrap();
    // A copying server in another session sends a known stream.
    let c2 = Client::attach("zc-connect").unwrap();
    let l = usnet_client::TcpListener::bind(&c2, sa("10.66.0.1:7101")).unwrap();
    let total = 1 << 20;
    let sender = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        (&s).write_all(&pattern(total)).unwrap();
        let mut back = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        (&s).read_to_end(&mut back).unwrap();
        back
    });
    let mut port = ZcPort::open(&c, ZcOptions::default()).unwrap();
    let h = port.connect(sa("10.66.0.1:7101")).unwrap();
    // A request written into a buffer of the stash, sent in place.
    let request = b"hello from the rings";
    let deadline = Instant::now() + Duration::from_secs(30);
    let buf = loop {
        if let Some(b) = port.alloc() {
            break b;
        }
        port.sync().unwrap();
        port.wait(Duration::from_millis(20)).unwrap();
        assert!(Instant::now() < deadline, "no buffer in the stash");
    };
    let head = port.headroom() as usize;
    port.buf_mut(buf).unwrap()[head..head + request.len()].copy_from_slice(request);
    assert!(port.send(ZcSlot {
        buf,
        off: head as u32,
        len: request.len() as u32,
        flags: 0,
        socket: h,
    }));
    let mut got = Vec::new();
    let mut closed = false;
    while got.len() < total || !closed {
        assert!(Instant::now() < deadline, "stalled at {} bytes", got.len());
        while let Some(s) = port.rx_slot() {
            assert_eq!(s.socket, h);
            assert_eq!(s.flags & SLOT_ERROR, 0, "connection failed");
            got.extend_from_slice(port.payload(&s).expect("a buffer we hold"));
            port.rx_advance();
        }
        if got.len() == total && !closed {
            closed = port.send(ZcSlot {
                buf: NO_BUF,
                flags: SLOT_CLOSE,
                socket: h,
                ..ZcSlot::default()
            });
        }
        port.sync().unwrap();
        port.wait(Duration::from_millis(20)).unwrap();
    }
    assert!(got == pattern(total), "received bytes differ");
    assert_eq!(sender.join().unwrap(), request);
    assert!(port.tx_refused().is_empty());
    drop(port);
    pool_back_to(&srv, baseline);
}

#[test]
fn zero_copy_ports_are_refused_unless_the_server_allows_them() {
    let _srv = common::server_with("zc-off", |st| st.pool.backing = Backing::Memfd, |_| {});
    let c = Client::attach("zc-off").unwrap();
    let e = ZcPort::open(&c, ZcOptions::default()).unwrap_err();
    assert!(e.to_string().contains("--zero-copy"), "{e}");
    // A stack whose pool is private memory cannot share it.
    let _srv = common::server_with("zc-anon", |_| {}, |cfg| cfg.zero_copy = true);
    let c = Client::attach("zc-anon").unwrap();
    let e = ZcPort::open(&c, ZcOptions::default()).unwrap_err();
    assert!(e.to_string().contains("not shareable"), "{e}");
}

#[test]
fn a_session_that_ends_with_its_port_open_gives_every_buffer_back() {
    let srv = zc_server("zc-gone");
    let baseline = pool_in_use(&srv);
    let c = Client::attach("zc-gone").unwrap();
    let mut port = ZcPort::open(&c, ZcOptions::default()).unwrap();
    port.listen(sa("10.66.0.1:7102"), 8).unwrap();
    // Hold stash buffers and received ones, then vanish without closing anything.
    let c2 = Client::attach("zc-gone").unwrap();
    let s = TcpStream::connect(&c2, sa("10.66.0.1:7102")).unwrap();
    (&s).write_all(&pattern(64 << 10)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = 0;
    while held < 64 << 10 {
        assert!(Instant::now() < deadline, "nothing received");
        while let Some(sl) = port.rx_slot() {
            held += sl.len as usize;
            // Kept, never given back.
            if sl.len > 0 && port.rx_keep().is_none() {
                break;
            }
            if sl.len == 0 {
                port.rx_advance();
            }
        }
        port.sync().unwrap();
        port.wait(Duration::from_millis(20)).unwrap();
    }
    assert!(pool_in_use(&srv) > baseline);
    // What the control thread does when the client's connection hangs up.
    let id = c.session_id();
    srv.call(Duration::from_secs(5), move |lp| lp.remove_session(id))
        .unwrap();
    drop(s);
    drop(c2);
    pool_back_to(&srv, baseline);
    drop(port);
}

#[test]
fn nonsense_in_the_rings_is_refused_and_hurts_nobody() {
    let srv = zc_server("zc-junk");
    let baseline = pool_in_use(&srv);
    let c = Client::attach("zc-junk").unwrap();
    let port = ZcPort::open(&c, ZcOptions::default()).unwrap();
    let lh = port.listen(sa("10.66.0.1:7103"), 8).unwrap();
    // A checked transfer of another client runs meanwhile.
    let c2 = Client::attach("zc-junk").unwrap();
    let l = usnet_client::TcpListener::bind(&c2, sa("10.66.0.1:7104")).unwrap();
    let other = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut got = Vec::new();
        (&s).read_to_end(&mut got).unwrap();
        got
    });
    let c3 = Client::attach("zc-junk").unwrap();
    let w = TcpStream::connect(&c3, sa("10.66.0.1:7104")).unwrap();
    let area = port.area().clone();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..200 {
        // Slots naming buffers we do not hold, out-of-range offsets, the listener
        // or unknown sockets; indices anywhere; give entries of any buffer.
        let ring = [
            usnet_session::zc::ZcRing::Rx,
            usnet_session::zc::ZcRing::Tx,
            usnet_session::zc::ZcRing::Stash,
            usnet_session::zc::ZcRing::Give,
        ][round % 4];
        let v = next();
        let slot = usnet_session_abi::zc::Slot {
            buf: (v % 5000) as u32,
            off: (v >> 12) as u32 % 3000,
            len: (v >> 24) as u32 % 3000,
            flags: (v >> 40) as u16,
            socket: if v & 1 == 0 { lh } else { next() },
        };
        match ring {
            usnet_session::zc::ZcRing::Rx | usnet_session::zc::ZcRing::Tx => {
                area.write_slot(ring, next() as u32, &slot)
            }
            _ => area.entry(ring, next() as u32).store(slot.buf, Relaxed),
        }
        area.indices(ring).0.store(next() as u32, Release);
        if round % 3 == 0 {
            // The server's own words too: it never reads them back.
            area.indices(ring).1.store(next() as u32, Release);
        }
        area.word(usnet_session_abi::zc::SYNC).store(1, SeqCst);
        // A round trip rings the server (port.sync would publish our own indices).
        c.nop().unwrap();
        (&w).write_all(&pattern(4096)).unwrap();
    }
    w.shutdown(std::net::Shutdown::Write).unwrap();
    let got = other.join().unwrap();
    assert!(
        got == pattern(4096).repeat(200),
        "the other client's bytes differ"
    );
    // The server is fine: a round trip still works, and it refused slots.
    c.nop().unwrap();
    assert!(port.bad_slots() > 0, "nothing was refused");
    drop(port);
    drop(w);
    pool_back_to(&srv, baseline);
}
