//! Helpers for the connection's unit tests: a handshake through a real [`Listener`],
//! and moving segments between the two ends in virtual time.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Connection, State};
use crate::testing::{OwnedSegment, VecSink};
use crate::time::Instant;
use crate::{ListenEvent, Listener, TcpConfig};

pub(crate) fn addrs() -> (SocketAddr, SocketAddr) {
    (
        "10.0.0.1:40000".parse().unwrap(),
        "10.0.0.2:80".parse().unwrap(),
    )
}

/// The time the tests start at.
pub(crate) const T0: Instant = Instant::from_millis(1000);

/// Full-sized segments: 1460 bytes less the 12 of the timestamp option.
pub(crate) const MSS: usize = 1448;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Everything `c` sends at `now`.
pub(crate) fn drain(c: &mut Connection, now: Instant) -> Vec<OwnedSegment> {
    let mut sink = VecSink::default();
    c.poll_transmit(now, &mut sink);
    sink.segments
}

/// Feed `segs` into `c` at `now`.
pub(crate) fn feed(c: &mut Connection, now: Instant, segs: &[OwnedSegment]) {
    for s in segs {
        c.input(now, &s.segment());
    }
}

/// A client and a server in ESTABLISHED after a handshake at [`T0`] with no delay.
pub(crate) fn pair(ccfg: TcpConfig, scfg: TcpConfig) -> (Connection, Connection) {
    pair_with_rtt(ccfg, scfg, Duration::ZERO)
}

/// [`pair`] whose handshake takes `rtt`: the SYN-ACK and the final ACK arrive at
/// `T0 + rtt`, so both ends start with that RTT sample.
pub(crate) fn pair_with_rtt(
    ccfg: TcpConfig,
    scfg: TcpConfig,
    rtt: Duration,
) -> (Connection, Connection) {
    let (c, s) = addrs();
    let mut client = Connection::connect(c, s, T0, ccfg);
    let mut listener: Listener<u32> = Listener::new(s, scfg, 8, false);
    let mut back = VecSink::default();
    for syn in drain(&mut client, T0) {
        listener.input(T0, s, c, &syn.segment(), &mut back);
    }
    let t1 = T0 + rtt;
    feed(&mut client, t1, &back.segments);
    let mut server = None;
    for ack in drain(&mut client, t1) {
        if let ListenEvent::Established(x) = listener.input(t1, s, c, &ack.segment(), &mut back) {
            server = Some(*x);
        }
    }
    let server = server.expect("handshake completed");
    assert_eq!(client.state(), State::Established);
    assert_eq!(server.state(), State::Established);
    (client, server)
}

/// [`pair`] with default configurations.
pub(crate) fn default_pair() -> (Connection, Connection) {
    pair(TcpConfig::default(), TcpConfig::default())
}
