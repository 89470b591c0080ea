//! A receive frame coalesced from several wire segments (GRO, or a GSO frame from a
//! TAP) must not teach the receiver that the peer's MSS is the frame size: with
//! `gso_size` set, it still acknowledges at least every second wire segment.

use std::net::SocketAddr;

use usnet_tcp::testing::{OwnedSegment, VecSink};
use usnet_tcp::{Connection, Instant, ListenEvent, Listener, Segment, TcpConfig};

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
