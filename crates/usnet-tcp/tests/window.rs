//! The receive window is a promise: a receiver whose buffer stays nearly full (a slow
//! reader, a fast sender) must never advertise a right edge its buffer cannot take.
//! With window scaling every advertisement is rounded to a multiple of 2^wscale; if
//! each rounding goes up, the promise ratchets ahead of the buffer by up to
//! 2^wscale - 1 bytes per ACK (RFC 7323 appendix F). The sender's in-window segments
//! are then trimmed and look lost: on a lossless shm link this caused thousands of
//! out-of-order arrivals and RACK retransmits per GiB.

use std::net::SocketAddr;

use usnet_tcp::testing::VecSink;
use usnet_tcp::{Connection, Instant, ListenEvent, Listener, TcpConfig};

fn establish(scfg: TcpConfig) -> (Connection, Connection) {
    let (c, s): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:80".parse().unwrap(),
    );
    let now = Instant::from_millis(1);
    let mut client = Connection::connect(c, s, now, TcpConfig::default());
    let mut listener: Listener<u32> = Listener::new(s, scfg, 8, true);
    let mut sink = VecSink::default();
    client.poll_transmit(now, &mut sink);
    let syn = sink.segments.remove(0);
    listener.input(now, s, c, &syn.segment(), &mut sink);
    let synack = sink.segments.remove(0);
    client.input(now, &synack.segment());
    client.poll_transmit(now, &mut sink);
    let ack = sink.segments.remove(0);
    let ListenEvent::Established(server) = listener.input(now, s, c, &ack.segment(), &mut sink)
    else {
        panic!("handshake did not complete");
    };
    (client, *server)
}

#[test]
fn a_full_buffer_never_advertises_more_than_it_can_take() {
    let recv_buffer = 4 << 20;
    let scfg = TcpConfig {
        recv_buffer,
        recv_buffer_initial: recv_buffer,
        autotune: false,
        ..TcpConfig::default()
    };
    let (mut client, mut server) = establish(scfg);
    let (_, rcv_ws) = server.info().wscale.expect("window scaling negotiated");
    assert!(
        rcv_ws >= 5,
        "wscale {rcv_ws}: too small to show the rounding"
    );
    let chunk = vec![0x5au8; 256 << 10];
    let mut out = vec![0u8; 1000];
    let mut t = 2_000u64;
    let mut acks = 0u64;
    let mut fullest = 0usize;
    for step in 0..20_000u64 {
        t += 10;
        let now = Instant::from_micros(t);
        client.send(&chunk);
        let mut to_server = VecSink::default();
        client.poll_transmit(now, &mut to_server);
        for seg in &to_server.segments {
            server.input(now, &seg.segment());
            let mut to_client = VecSink::default();
            server.poll_transmit(now, &mut to_client);
            for ack in &to_client.segments {
                // The edge just promised, against the room the buffer really has.
                let wnd = u64::from(ack.repr.window) << rcv_ws;
                let room = (recv_buffer - server.info().recv_queued) as u64;
                assert!(
                    wnd <= room,
                    "step {step}: advertised {wnd} bytes with room for {room}"
                );
                acks += 1;
                fullest = fullest.max(server.info().recv_queued);
                client.input(now, &ack.segment());
            }
        }
        // A reader slower than the sender, in odd-sized reads, keeps the buffer at
        // its limit with rcv_nxt never on a 2^wscale boundary.
        if step % 2 == 0 {
            server.recv(&mut out);
        }
        // Timers (delayed ACKs) run too.
        let mut to_client = VecSink::default();
        server.poll_transmit(now, &mut to_client);
        for ack in &to_client.segments {
            client.input(now, &ack.segment());
        }
    }
    assert!(acks > 1000, "only {acks} ACKs");
    assert!(
        fullest + 4096 > recv_buffer,
        "the buffer never filled: at most {fullest} bytes queued"
    );
    let s = server.stats();
    assert_eq!(s.rx_beyond_window_bytes, 0, "in-window bytes were trimmed");
    assert_eq!(s.rx_out_of_window, 0);
    assert_eq!(s.rx_ooo_segments, 0);
    assert_eq!(client.stats().retransmit_segments, 0);
}

/// Sender SWS avoidance: when the receiver's window edge moves by amounts that are not
/// multiples of the MSS, the sender waits for room for a full segment instead of
/// sending the small remainder at every edge.
#[test]
fn the_sender_does_not_dribble_small_segments_into_a_moving_window() {
    let recv_buffer = 256 << 10;
    let scfg = TcpConfig {
        recv_buffer,
        recv_buffer_initial: recv_buffer,
        autotune: false,
        ..TcpConfig::default()
    };
    let (mut client, mut server) = establish(scfg);
    // Full payload: the MSS less the timestamp option.
    let mss = client.snd_mss() as usize - 12;
    let chunk = vec![0x33u8; 256 << 10];
    // Reads of 7000 bytes: the edge moves by non-multiples of the MSS.
    let mut out = vec![0u8; 7000];
    let (mut t, mut small, mut data) = (2_000u64, 0u64, 0u64);
    for _ in 0..5_000 {
        t += 10;
        let now = Instant::from_micros(t);
        client.send(&chunk);
        let mut to_server = VecSink::default();
        client.poll_transmit(now, &mut to_server);
        for seg in &to_server.segments {
            if !seg.payload.is_empty() {
                data += 1;
                if seg.payload.len() < mss {
                    small += 1;
                }
            }
            server.input(now, &seg.segment());
        }
        server.recv(&mut out);
        let mut to_client = VecSink::default();
        server.poll_transmit(now, &mut to_client);
        for ack in &to_client.segments {
            client.input(now, &ack.segment());
        }
    }
    assert!(data > 1000, "only {data} data segments");
    assert!(
        small * 100 < data,
        "{small} of {data} data segments were smaller than the MSS"
    );
}
