//! The HTTP service against a client that delays its ACKs by 40 ms (Linux's minimum
//! delayed-ACK timeout, which a client waiting for a response uses), in virtual time
//! on the simulator: keep-alive and pipelined requests must not wait for those ACKs.
//! A response sent as a head and then a body made the body wait behind the
//! unacknowledged head (Nagle) for the whole 40 ms, every request.

use std::net::SocketAddr;
use std::time::Duration;

use usnet_http::{check_pattern, parse_response, BodyDecoder, HttpConfig, HttpService};
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{mac_from_seed, SocketHandle, StackConfig, StackError};

const DELAYED_ACK: Duration = Duration::from_millis(40);

fn cfg(i: u8) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64 * 7919,
        ..Default::default()
    }
}

struct Lab {
    net: SimNet,
    svc: HttpService,
    conn: SocketHandle,
}

const CLIENT: usize = 0;
const SERVER: usize = 1;

impl Lab {
    fn new() -> Lab {
        let mut net = SimNet::new(9, Faults::default());
        let mut client = cfg(1);
        // Every ACK the client owes waits for its delayed-ACK timer or for data to
        // ride on (no quick-ACK phase at the start, as a client past it).
        client.tcp.delayed_ack = DELAYED_ACK;
        client.tcp.quickack_segments = 0;
        assert_eq!(net.add(client).unwrap(), CLIENT);
        assert_eq!(net.add(cfg(2)).unwrap(), SERVER);
        let svc = HttpService::start(net.stack_mut(SERVER), HttpConfig::default()).unwrap();
        let server: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let conn = net.stack_mut(CLIENT).tcp_connect(None, server).unwrap();
        let mut lab = Lab { net, svc, conn };
        let ok = lab.run(Duration::from_secs(5), |n, c| {
            n.stack(CLIENT).readiness(c).is_ok_and(|r| r.connected)
        });
        assert!(ok, "no connection");
        lab
    }

    /// Steps the simulator (the service runs in the server's loop) until `done`.
    fn run(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut SimNet, SocketHandle) -> bool,
    ) -> bool {
        let (svc, conn) = (&mut self.svc, self.conn);
        self.net.run_until(limit, |n| {
            svc.poll(n.stack_mut(SERVER));
            done(n, conn)
        })
    }

    /// Writes `requests` at once and reads `answers` responses to `/bytes/N` (each
    /// checked against the pattern and `sizes`); returns the virtual time taken.
    fn exchange(&mut self, requests: &str, sizes: &[u64]) -> Duration {
        let t0 = self.net.now();
        let n = self
            .net
            .stack_mut(CLIENT)
            .tcp_send(self.conn, requests.as_bytes())
            .unwrap();
        assert_eq!(n, requests.len());
        let mut inbuf: Vec<u8> = Vec::new();
        let mut got = 0;
        let mut body: Option<(BodyDecoder, u64)> = None;
        let mut buf = vec![0u8; 64 << 10];
        let ok = self.run(Duration::from_secs(10), |net, c| {
            loop {
                match net.stack_mut(CLIENT).tcp_recv(c, &mut buf) {
                    Ok(0) => panic!("the server closed the connection"),
                    Ok(k) => inbuf.extend_from_slice(&buf[..k]),
                    Err(StackError::WouldBlock) => break,
                    Err(e) => panic!("client recv: {e:?}"),
                }
            }
            loop {
                if body.is_none() {
                    let Some((h, used)) = parse_response(&inbuf).unwrap() else {
                        break;
                    };
                    assert_eq!((h.status, h.content_length), (200, Some(sizes[got])));
                    assert!(h.keep_alive);
                    inbuf.drain(..used);
                    body = Some((BodyDecoder::for_response(&h, false), 0));
                }
                let (d, off) = body.as_mut().expect("a body is being read");
                let mut bad = None;
                let used = d
                    .feed(&inbuf, |s| {
                        bad = bad.or(check_pattern(s, *off));
                        *off += s.len() as u64;
                    })
                    .unwrap();
                assert_eq!(bad, None, "response {got}: byte differs from the pattern");
                inbuf.drain(..used);
                if !d.is_done() {
                    break;
                }
                body = None;
                got += 1;
            }
            got == sizes.len()
        });
        assert!(ok, "{got} of {} responses after 10 s", sizes.len());
        assert!(
            inbuf.is_empty(),
            "{} bytes after the last response",
            inbuf.len()
        );
        self.net.now().saturating_since(t0)
    }
}

fn get(n: u64) -> String {
    format!("GET /bytes/{n} HTTP/1.1\r\nHost: 10.0.0.2\r\n\r\n")
}

#[test]
fn keep_alive_requests_do_not_wait_for_delayed_acks() {
    let mut lab = Lab::new();
    // Small bodies (one segment with the head, or just over), one segment exactly,
    // a few segments, and bodies larger than the service gathers before a send.
    let sizes = [
        151u64,
        0,
        1,
        1000,
        1400,
        1448,
        3000,
        20_000,
        100_000,
        1 << 20,
    ];
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    let mut count = 0u32;
    for round in 0..20 {
        for &n in &sizes {
            let t = lab.exchange(&get(n), &[n]);
            assert!(
                t < DELAYED_ACK / 10,
                "round {round}: GET /bytes/{n} took {t:?} of virtual time"
            );
            worst = worst.max(t);
            total += t;
            count += 1;
        }
    }
    eprintln!(
        "{count} keep-alive requests: mean {:?}, worst {worst:?} (virtual time)",
        total / count
    );
    assert_eq!(lab.svc.requests, u64::from(count));
}

#[test]
fn pipelined_requests_do_not_wait_for_delayed_acks() {
    let mut lab = Lab::new();
    let batches: [&[u64]; 3] = [
        &[151, 151, 151],
        &[151, 2000, 151, 0, 70_000, 151],
        &[0, 1, 1448, 20_000],
    ];
    for round in 0..30 {
        let sizes = batches[round % batches.len()];
        let reqs: String = sizes.iter().map(|&n| get(n)).collect();
        let t = lab.exchange(&reqs, sizes);
        assert!(
            t < DELAYED_ACK / 10,
            "round {round}: {} pipelined requests took {t:?} of virtual time",
            sizes.len()
        );
    }
}
