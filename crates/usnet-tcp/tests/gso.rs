//! A receive frame coalesced from several wire segments (GRO, or a GSO frame from a
//! TAP) must not teach the receiver that the peer's MSS is the frame size: with
//! `gso_size` set, it still acknowledges at least every second wire segment.

use std::net::SocketAddr;

use usnet_tcp::testing::{OwnedSegment, VecSink};
use usnet_tcp::{Connection, Instant, ListenEvent, Listener, Payload, Segment, TcpConfig};

fn establish() -> (Connection, Connection, SocketAddr, SocketAddr) {
    let (c, s): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:80".parse().unwrap(),
    );
    let now = Instant::from_millis(1);
    let mut client = Connection::connect(c, s, now, TcpConfig::default());
    // No quick-ACK phase on the receiver, so only the every-second-segment rule acts.
    let scfg = TcpConfig {
        quickack_segments: 0,
        ..TcpConfig::default()
    };
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
    (client, *server, c, s)
}

/// The client's next full segments (one initial window), joined into one frame as GRO
/// would.
fn coalesced(client: &mut Connection) -> (OwnedSegment, u16) {
    let now = Instant::from_millis(2);
    client.send(&vec![7u8; 64 * 1024]);
    let mut sink = VecSink::default();
    client.poll_transmit(now, &mut sink);
    let segs = &sink.segments;
    assert!(segs.len() >= 4, "{} segments", segs.len());
    let mss = segs[0].payload.len() as u16;
    let mut frame = segs[0].clone();
    for s in &segs[1..] {
        frame.payload.extend_from_slice(&s.payload);
    }
    (frame, mss)
}

fn acks_after(server: &mut Connection, frame: &OwnedSegment, gso_size: u16) -> usize {
    let seg = Segment {
        gso_size,
        ..frame.segment()
    };
    let now = Instant::from_millis(3);
    server.input(now, &seg);
    let mut sink = VecSink::default();
    server.poll_transmit(now, &mut sink);
    sink.segments.len()
}

#[test]
fn coalesced_frame_with_gso_size_is_acked_at_once() {
    let (mut client, mut server, ..) = establish();
    let (frame, mss) = coalesced(&mut client);
    assert_eq!(acks_after(&mut server, &frame, mss), 1);
    assert!(server.info().rcv_mss <= u32::from(mss));
}

#[test]
fn without_gso_size_the_frame_looks_like_one_huge_segment() {
    let (mut client, mut server, ..) = establish();
    let (frame, _) = coalesced(&mut client);
    // The receiver believes one segment arrived and delays its ACK: the stall that
    // `gso_size` avoids.
    assert_eq!(acks_after(&mut server, &frame, 0), 0);
    assert!(server.info().rcv_mss as usize >= frame.payload.len().min(65535));
}

/// GRO hands the engine a frame's payload as the list of its wire segments'
/// payloads: the engine must take it exactly as the same bytes in one slice, in
/// order, out of order and partly duplicated, and count wire segments.
#[test]
fn chained_payload_is_taken_like_a_contiguous_one() {
    let (mut client, mut flat_rx, ..) = establish();
    let (_, mut chain_rx, ..) = establish();
    let now = Instant::from_millis(2);
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 + i / 251) as u8).collect();
    client.send(&data);
    let mut sink = VecSink::default();
    client.poll_transmit(now, &mut sink);
    let segs = &sink.segments;
    assert!(segs.len() >= 4);
    let mss = segs[0].payload.len() as u16;
    let parts: Vec<&[u8]> = segs.iter().map(|s| &s.payload[..]).collect();
    let flat: Vec<u8> = parts.concat();
    // Out of order first (everything but the first segment), then the whole frame
    // (its tail a duplicate).
    let steps: [(usize, usize); 2] = [(1, segs.len()), (0, segs.len())];
    let before = chain_rx.stats().rx_segments;
    for (k, &(from, to)) in steps.iter().enumerate() {
        let at = Instant::from_millis(3 + k as u64);
        let off = parts[..from].iter().map(|p| p.len()).sum::<usize>();
        let len = parts[from..to].iter().map(|p| p.len()).sum::<usize>();
        let base = Segment {
            gso_size: mss,
            ..segs[from].segment()
        };
        let one = Segment {
            payload: Payload::new(&flat[off..off + len]),
            ..base
        };
        let many = Segment {
            payload: Payload::chain(&parts[from..to]),
            ..base
        };
        assert_eq!(one.wire_segments(), (to - from) as u32);
        assert_eq!(flat_rx.input(at, &one), chain_rx.input(at, &many));
        let (mut s1, mut s2) = (VecSink::default(), VecSink::default());
        flat_rx.poll_transmit(at, &mut s1);
        chain_rx.poll_transmit(at, &mut s2);
        assert_eq!(s1.segments, s2.segments, "different replies");
    }
    assert_eq!(flat_rx.stats(), chain_rx.stats());
    let wire = 2 * segs.len() as u64 - 1;
    assert_eq!(chain_rx.stats().rx_segments - before, wire);
    assert_eq!(chain_rx.stats().rx_ooo_segments, segs.len() as u64 - 1);
    let mut got = vec![0u8; flat.len() + 1];
    let n = chain_rx.recv(&mut got);
    assert_eq!(&got[..n], &flat[..]);
    assert_eq!(&flat[..], &data[..flat.len()]);
}

/// A coalesced frame may be longer than the receive window: one that starts before
/// RCV.NXT and ends beyond the window is still taken (what fits), as its wire
/// segments in the window would have been, not dropped as out of window.
#[test]
fn a_frame_spanning_the_whole_window_is_taken() {
    let (c, s): (SocketAddr, SocketAddr) = (
        "10.0.0.1:40001".parse().unwrap(),
        "10.0.0.2:81".parse().unwrap(),
    );
    let now = Instant::from_millis(1);
    let mut client = Connection::connect(c, s, now, TcpConfig::default());
    let scfg = TcpConfig {
        recv_buffer: 8 * 1024,
        recv_buffer_initial: 8 * 1024,
        ..TcpConfig::default()
    };
    let mut listener: Listener<u32> = Listener::new(s, scfg, 8, true);
    let mut sink = VecSink::default();
    client.poll_transmit(now, &mut sink);
    listener.input(now, s, c, &sink.segments.remove(0).segment(), &mut sink);
    client.input(now, &sink.segments.remove(0).segment());
    client.poll_transmit(now, &mut sink);
    let ListenEvent::Established(mut server) =
        listener.input(now, s, c, &sink.segments.remove(0).segment(), &mut sink)
    else {
        panic!("handshake did not complete");
    };
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    client.send(&data);
    let mut sink = VecSink::default();
    client.poll_transmit(now, &mut sink);
    // The window limited the client; the frame covers the whole window, adds 10 old
    // bytes in front and 100 beyond the window behind.
    let segs = &sink.segments;
    let sent: usize = segs.iter().map(|s| s.payload.len()).sum();
    let wnd = server.info().rcv_wnd as usize;
    assert!(
        sent <= wnd && wnd <= 8 * 1024 && segs.len() < 10,
        "the window did not limit the client"
    );
    let mut bytes = vec![0u8; 10];
    bytes.extend_from_slice(&data[..wnd + 100]);
    let seg = Segment {
        seq: segs[0].repr.seq.wrapping_sub(10),
        payload: Payload::new(&bytes),
        gso_size: segs[0].payload.len() as u16,
        ..segs[0].segment()
    };
    let before = server.stats().clone();
    server.input(Instant::from_millis(2), &seg);
    let st = server.stats();
    assert_eq!(st.rx_out_of_window, before.rx_out_of_window);
    assert_eq!(st.rx_dup_bytes - before.rx_dup_bytes, 10);
    assert_eq!(
        st.rx_beyond_window_bytes - before.rx_beyond_window_bytes,
        100
    );
    let mut got = vec![0u8; data.len()];
    let n = server.recv(&mut got);
    assert_eq!(&got[..n], &data[..wnd]);
}
