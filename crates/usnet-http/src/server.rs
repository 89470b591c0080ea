//! A small HTTP/1.1 server that runs inside the poll loop (`usnet up --services
//! http` on port 80, `http:PORT` for another port): non-blocking, many connections,
//! bounded memory per connection, nothing from the wire trusted.
//!
//! # Resources
//!
//! | request | answer |
//! |---|---|
//! | `GET /` (or `HEAD`) | a short text index |
//! | `GET /bytes/N` (or `HEAD`) | `N` bytes of the pattern below, `Content-Length: N`, streamed (N up to [`HttpConfig::max_bytes`], 1 TiB by default) |
//! | `POST <any path>` | the lowercase hex SHA-256 of the request body and a newline (`Content-Length` or chunked bodies, up to [`HttpConfig::max_body`]) |
//! | any other path | 404; any other method 405 (with `Allow`) |
//!
//! **The pattern**: byte `i` (counting from 0) of `/bytes/N` is
//! `(31 * i + 7) mod 251` ([`crate::pattern`]).
//!
//! # Protocol
//!
//! HTTP/1.1 keep-alive by default (HTTP/1.0 with `Connection: keep-alive`),
//! `Connection: close` honoured, pipelined requests answered in order,
//! `Expect: 100-continue` answered with `100 Continue`. Malformed requests get 400
//! (bad request line, header syntax, obs-fold, conflicting `Content-Length`,
//! `Content-Length` with `Transfer-Encoding`, missing `Host` in HTTP/1.1, bad chunk
//! syntax), 431 for a head over [`HttpConfig::max_head`] (8 KiB), 413 for a body over
//! [`HttpConfig::max_body`], 417 for another expectation, 501 for a transfer coding
//! other than `chunked`, 505 for an HTTP version other than 1.x; these close the
//! connection. The connection is closed gracefully: FIN after the response, then
//! the rest of the input is read and thrown away for up to 2 s (so no RST eats the
//! response).
//!
//! # Timeouts (slowloris)
//!
//! A request head must arrive complete within [`HttpConfig::head_timeout`] (10 s)
//! of its first byte (of the connection, for the first request), however slowly it
//! trickles; a keep-alive connection may wait [`HttpConfig::idle_timeout`] (30 s)
//! for its next request; a body or a response that makes no progress for
//! `idle_timeout` ends the connection (RST). At most [`HttpConfig::max_conns`]
//! connections are served; more are reset at once.
//!
//! # One send per response, and its end pushed (Nagle)
//!
//! The stack runs Nagle's algorithm with Minshall's refinement, as Linux does: a
//! segment shorter than the MSS waits while an earlier short one is unacknowledged.
//! A client waiting for the rest of a response delays its ACKs (Linux: 40 ms). A
//! response handed to the stack as a head and then a body, in two sends, is two short
//! segments, so every keep-alive request for `/bytes/N` used to stall 40 ms. Hence:
//!
//! - A connection gathers what it has to say in one turn (heads, small bodies, the
//!   first [`COALESCE`] bytes of a `/bytes/N` body, the answers to pipelined
//!   requests) and hands it to the stack in one send, at the end of the turn or when
//!   the buffer is full. A small response is one segment; a head never leaves alone.
//! - Connections run with TCP_NODELAY, as nginx's keep-alive connections do, so the
//!   last segment of a response never waits for the ACK of an earlier short one (a
//!   response that spans turns can leave one in flight). While the bulk of a larger
//!   body streams, Nagle is back on, so the stack cuts it into full segments with at
//!   most one short one in flight; TCP_NODELAY returns, which pushes the tail, once
//!   the body's last byte is queued (Linux's TCP_CORK pattern).
//!
//! This is done here, not by corking inside the stack (Linux's autocork holds a short
//! tail while earlier data still waits for the device, and pushes it when the device
//! has taken that): a stack-wide cork needs a push point on every path of every
//! application, while the service knows where its responses end.

use std::time::Duration;

use sha2::{Digest, Sha256};
use std::io;
use std::time::Duration as Instant;

use usnet_socket_api::{Handle as SocketHandle, SocketApi};

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

use crate::body::BodyDecoder;
use crate::hex;
use crate::message::{parse_request, HttpError, RequestHead};
use crate::pattern::{pattern_slice, PATTERN_CHUNK};

/// The default port of the HTTP service.
pub const DEFAULT_PORT: u16 = 80;

/// A connection gathers its output (heads, small bodies, the start of a large body,
/// the answers to pipelined requests) up to this many bytes before one send.
pub const COALESCE: usize = 16 << 10;

/// Tuning and limits of the service.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub port: u16,
    /// Largest request head (request line and headers).
    pub max_head: usize,
    /// Largest POST body.
    pub max_body: u64,
    /// Largest `N` in `/bytes/N`.
    pub max_bytes: u64,
    /// A request head must be complete this long after its first byte.
    pub head_timeout: Duration,
    /// Longest wait for the next request on a keep-alive connection, and longest
    /// stall of a body or a response.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_conns: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            port: DEFAULT_PORT,
            max_head: 8 << 10,
            max_body: 1 << 40,
            max_bytes: 1 << 40,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_conns: 1024,
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

const INDEX: &str = "usnet HTTP service\n\
GET  /          this index\n\
GET  /bytes/N   N bytes of the pattern: byte i = (31 * i + 7) mod 251\n\
POST /any/path  the hex SHA-256 of the request body\n";

/// What a request is answered with.
enum Route {
    Text(u16, String),
    Bytes(u64),
    Hash,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    Head,
    /// Reading a request body.
    Body,
    /// Answering: the head (and a small body) is in `out`, `pattern` bytes follow.
    Send,
    /// The last response is complete: `out` goes out, then the FIN.
    Close,
    /// FIN sent; reading and dropping input until EOF or the deadline.
    Linger,
}

struct Conn {
    h: SocketHandle,
    phase: Phase,
    /// Unparsed input: a partial head, or bytes after a chunked body (bounded).
    inbuf: Vec<u8>,
    /// Output gathered for one send (at most about [`COALESCE`] bytes); `out_pos`
    /// of it is sent.
    out: Vec<u8>,
    out_pos: usize,
    /// Pattern bytes still to send: `(next offset, end)`.
    pattern: (u64, u64),
    /// The connection stays open after the current response.
    keep_alive: bool,
    head_only: bool,
    /// The current request is HTTP/1.1.
    http11: bool,
    /// Answer with the SHA-256 (POST) or discard the body.
    hasher: Option<Sha256>,
    body: BodyDecoder,
    /// Waiting for the next request on a keep-alive connection (no byte of it yet).
    idle: bool,
    /// Nagle is on while the bulk of a body streams (TCP_NODELAY otherwise).
    corked: bool,
    deadline: Instant,
}

/// The HTTP/1.1 service (see the module documentation).
pub struct HttpService {
    cfg: HttpConfig,
    listener: SocketHandle,
    conns: Vec<Conn>,
    scratch: Vec<u8>,
    /// Requests answered (any status), for tests and curiosity.
    pub requests: u64,
}

/// Bytes moved per connection per poll, so one client cannot starve the loop.
const BUDGET: usize = 1 << 20;
/// How long a closing connection's input is drained.
const LINGER: Duration = Duration::from_secs(2);

impl HttpService {
    /// Listens on `cfg.port` on every address of `stack` (IPv4 and IPv6).
    pub fn start(stack: &mut dyn SocketApi, cfg: HttpConfig) -> io::Result<HttpService> {
        let listener = stack.tcp_listen(std::net::SocketAddr::from(([0u16; 8], cfg.port)), 128)?;
        Ok(HttpService {
            cfg,
            listener,
            conns: Vec::new(),
            scratch: vec![0u8; 64 << 10],
            requests: 0,
        })
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }
}

enum Step {
    Open,
    /// Close gracefully (nothing unread is expected).
    Close,
    /// Reset.
    Abort,
}

impl Conn {
    fn new(h: SocketHandle, deadline: Instant) -> Conn {
        Conn {
            h,
            phase: Phase::Head,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            pattern: (0, 0),
            keep_alive: true,
            head_only: false,
            http11: true,
            hasher: None,
            body: BodyDecoder::Length(0),
            idle: false,
            corked: false,
            deadline,
        }
    }

    /// Queues a response head (and a small body) and switches to `Send`.
    fn respond(&mut self, status: u16, ctype: &str, len: u64, body: &[u8], http11: bool) {
        use std::fmt::Write;
        let mut h = String::with_capacity(160);
        let _ = write!(
            h,
            "HTTP/1.1 {status} {}\r\nServer: usnet\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\n",
            reason(status)
        );
        if status == 405 {
            h.push_str("Allow: GET, HEAD, POST\r\n");
        }
        if !self.keep_alive {
            h.push_str("Connection: close\r\n");
        } else if !http11 {
            h.push_str("Connection: keep-alive\r\n");
        }
        h.push_str("\r\n");
        self.out.extend_from_slice(h.as_bytes());
        if !self.head_only {
            self.out.extend_from_slice(body);
        }
        self.phase = Phase::Send;
    }

    fn error(&mut self, e: HttpError) {
        self.keep_alive = false;
        self.head_only = false;
        let body = format!("{} {}: {}\n", e.status, reason(e.status), e.why);
        self.respond(
            e.status,
            "text/plain",
            body.len() as u64,
            body.as_bytes(),
            true,
        );
    }

    /// A complete request head: route it and start the body or the response.
    fn start(&mut self, req: RequestHead, cfg: &HttpConfig, now: Instant) {
        self.keep_alive = req.keep_alive;
        self.head_only = req.method == "HEAD";
        self.http11 = req.http11;
        self.deadline = now + cfg.idle_timeout;
        let route = match (req.method.as_str(), req.path.as_str()) {
            ("GET" | "HEAD", "/") => Route::Text(200, INDEX.to_string()),
            ("GET" | "HEAD", p) if p.starts_with("/bytes/") => {
                let n = &p["/bytes/".len()..];
                let digits =
                    !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit());
                match n.parse::<u64>() {
                    Ok(n) if digits && n <= cfg.max_bytes => Route::Bytes(n),
                    Ok(_) if digits => Route::Text(400, format!("N is above {}\n", cfg.max_bytes)),
                    _ => Route::Text(400, "/bytes/N needs a decimal N\n".into()),
                }
            }
            ("GET" | "HEAD", _) => Route::Text(404, format!("{} is not here\n", req.path)),
            ("POST", _) => Route::Hash,
            _ => Route::Text(405, format!("{} is not allowed\n", req.method)),
        };
        if let Route::Hash = route {
            if req.content_length.is_some_and(|n| n > cfg.max_body) {
                return self.error(HttpError {
                    status: 413,
                    why: "the body is too large",
                });
            }
        }
        if req.has_body() {
            if !matches!(route, Route::Hash) {
                // Not worth reading: answer and close.
                self.keep_alive = false;
            } else {
                if req.expect_continue {
                    self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                self.hasher = Some(Sha256::new());
                self.body = BodyDecoder::for_request(&req);
                self.phase = Phase::Body;
                return;
            }
        }
        match route {
            Route::Text(status, body) => {
                self.respond(
                    status,
                    "text/plain",
                    body.len() as u64,
                    body.as_bytes(),
                    req.http11,
                );
            }
            Route::Bytes(n) => {
                self.respond(200, "application/octet-stream", n, &[], req.http11);
                if !self.head_only {
                    self.pattern = (0, n);
                }
            }
            Route::Hash => {
                // An empty body.
                self.hasher = Some(Sha256::new());
                self.finish_hash(req.http11);
            }
        }
    }

    fn finish_hash(&mut self, http11: bool) {
        let d = self.hasher.take().unwrap_or_default().finalize();
        let body = format!("{}\n", hex(&d));
        self.respond(
            200,
            "text/plain",
            body.len() as u64,
            body.as_bytes(),
            http11,
        );
    }

    /// Feeds body bytes from `input`; returns the bytes consumed.
    fn feed_body(&mut self, input: &[u8]) -> Result<usize, HttpError> {
        let hasher = &mut self.hasher;
        self.body.feed(input, |s| {
            if let Some(h) = hasher.as_mut() {
                h.update(s);
            }
        })
    }

    fn body_done(&self) -> bool {
        self.body.is_done()
    }

    /// Does what can be done now; `moved` counts bytes read and written. What the
    /// turn produced leaves in one send at its end (see the module documentation).
    fn step(
        &mut self,
        stack: &mut dyn SocketApi,
        scratch: &mut [u8],
        cfg: &HttpConfig,
        now: Instant,
        requests: &mut u64,
    ) -> (Step, usize) {
        let mut moved = 0usize;
        let step = match self.work(stack, scratch, cfg, now, requests, &mut moved) {
            Step::Open => match self.flush(stack, &mut moved) {
                Ok(_) => Step::Open,
                Err(()) => Step::Abort,
            },
            s => s,
        };
        (step, moved)
    }

    /// Hands `out` to the stack: `Ok(true)` when all of it is queued, `Ok(false)`
    /// when the send buffer is full.
    fn flush(&mut self, stack: &mut dyn SocketApi, moved: &mut usize) -> Result<bool, ()> {
        while self.out_pos < self.out.len() {
            match stack.tcp_send(self.h, &self.out[self.out_pos..]) {
                Ok(0) => return Ok(false),
                Err(e) if would_block(&e) => return Ok(false),
                Ok(n) => {
                    self.out_pos += n;
                    *moved += n;
                }
                Err(_) => return Err(()),
            }
        }
        self.out_pos = 0;
        if self.out.capacity() > 2 * COALESCE {
            self.out = Vec::new();
        } else {
            self.out.clear();
        }
        Ok(true)
    }

    fn work(
        &mut self,
        stack: &mut dyn SocketApi,
        scratch: &mut [u8],
        cfg: &HttpConfig,
        now: Instant,
        requests: &mut u64,
        moved: &mut usize,
    ) -> Step {
        while *moved < BUDGET {
            match self.phase {
                Phase::Send => {
                    // The head is in `out`: the first body bytes join it, so the head
                    // never leaves as a short segment of its own.
                    let left = self.pattern.1 - self.pattern.0;
                    let room = COALESCE.saturating_sub(self.out.len());
                    let n = left.min(room as u64) as usize;
                    if n > 0 {
                        self.out.extend_from_slice(pattern_slice(self.pattern.0, n));
                        self.pattern.0 += n as u64;
                    }
                    if self.pattern.0 < self.pattern.1 && !self.corked {
                        // A body that does not fit: full segments while it streams.
                        if stack.tcp_set_nodelay(self.h, false).is_err() {
                            return Step::Abort;
                        }
                        self.corked = true;
                    }
                    if self.pattern.0 < self.pattern.1 || self.out.len() >= COALESCE {
                        match self.flush(stack, moved) {
                            Ok(true) => {}
                            Ok(false) => return Step::Open,
                            Err(()) => return Step::Abort,
                        }
                    }
                    // The bulk of a large body, straight from the pattern table.
                    while self.pattern.0 < self.pattern.1 && *moved < BUDGET {
                        let left = self.pattern.1 - self.pattern.0;
                        let s =
                            pattern_slice(self.pattern.0, left.min(PATTERN_CHUNK as u64) as usize);
                        match stack.tcp_send(self.h, s) {
                            Ok(n) => {
                                self.pattern.0 += n as u64;
                                *moved += n;
                            }
                            Err(e) if would_block(&e) => return Step::Open,
                            Err(_) => return Step::Abort,
                        }
                    }
                    if self.pattern.0 < self.pattern.1 {
                        return Step::Open;
                    }
                    if self.corked {
                        // The last byte is queued: TCP_NODELAY pushes the tail now.
                        if stack.tcp_set_nodelay(self.h, true).is_err() {
                            return Step::Abort;
                        }
                        self.corked = false;
                    }
                    // Complete (perhaps still in `out`: the next request's answer may
                    // join it).
                    *requests += 1;
                    if self.keep_alive {
                        self.phase = Phase::Head;
                        self.idle = true;
                        self.deadline = now + cfg.idle_timeout;
                    } else {
                        self.phase = Phase::Close;
                    }
                }
                Phase::Close => {
                    match self.flush(stack, moved) {
                        Ok(true) => {}
                        Ok(false) => return Step::Open,
                        Err(()) => return Step::Abort,
                    }
                    if stack.tcp_shutdown_write(self.h).is_err() {
                        return Step::Abort;
                    }
                    self.inbuf = Vec::new();
                    self.phase = Phase::Linger;
                    self.deadline = now + LINGER;
                }
                Phase::Head => {
                    // Pipelined answers gather in `out`, up to a bound.
                    if self.out.len() >= COALESCE {
                        match self.flush(stack, moved) {
                            Ok(true) => {}
                            Ok(false) => return Step::Open,
                            Err(()) => return Step::Abort,
                        }
                    }
                    if self.idle && !self.inbuf.is_empty() {
                        self.idle = false;
                        self.deadline = now + cfg.head_timeout;
                    }
                    match parse_request(&self.inbuf) {
                        Ok(Some((req, used))) => {
                            self.inbuf.drain(..used);
                            self.idle = false;
                            self.start(req, cfg, now);
                            continue;
                        }
                        Ok(None) if self.inbuf.len() >= cfg.max_head => {
                            self.error(HttpError {
                                status: 431,
                                why: "the request head is too large",
                            });
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.error(e);
                            continue;
                        }
                    }
                    let room = cfg.max_head - self.inbuf.len();
                    let room = room.min(scratch.len());
                    match stack.tcp_recv(self.h, &mut scratch[..room]) {
                        Ok(0) if !self.out.is_empty() => {
                            // The client is done sending; answers are still
                            // gathered: they go out before the FIN.
                            self.keep_alive = false;
                            self.phase = Phase::Close;
                        }
                        Ok(0) => {
                            // EOF between requests is the normal end; inside a
                            // head it is the client giving up.
                            return Step::Close;
                        }
                        Ok(n) => {
                            *moved += n;
                            self.inbuf.extend_from_slice(&scratch[..n]);
                        }
                        Err(e) if would_block(&e) => return Step::Open,
                        Err(_) => return Step::Abort,
                    }
                }
                Phase::Body => {
                    if !self.inbuf.is_empty() {
                        let buf = std::mem::take(&mut self.inbuf);
                        match self.feed_body(&buf) {
                            Ok(used) => self.inbuf = buf[used..].to_vec(),
                            Err(e) => {
                                self.error(e);
                                continue;
                            }
                        }
                    }
                    if self.body_done() {
                        self.finish_hash(self.http11);
                        continue;
                    }
                    let want = match self.body.remaining() {
                        Some(rem) => rem.min(scratch.len() as u64) as usize,
                        None => scratch.len(),
                    };
                    match stack.tcp_recv(self.h, &mut scratch[..want]) {
                        Ok(0) => return Step::Abort,
                        Ok(n) => {
                            *moved += n;
                            self.deadline = now + cfg.idle_timeout;
                            match self.feed_body(&scratch[..n]) {
                                Ok(used) => {
                                    if used < n {
                                        self.inbuf.extend_from_slice(&scratch[used..n]);
                                    }
                                }
                                Err(e) => {
                                    self.error(e);
                                    continue;
                                }
                            }
                        }
                        Err(e) if would_block(&e) => return Step::Open,
                        Err(_) => return Step::Abort,
                    }
                }
                Phase::Linger => match stack.tcp_recv(self.h, scratch) {
                    Ok(0) => return Step::Close,
                    Ok(n) => *moved += n,
                    Err(e) if would_block(&e) => return Step::Open,
                    Err(_) => return Step::Close,
                },
            }
        }
        Step::Open
    }
}

impl HttpService {
    /// One turn inside the poll loop: accepts connections, then reads, answers and
    /// times out what can be. Returns whether anything moved. The runtime registers
    /// it as a service (`usnet_runtime::ServiceKind::Http`); a program with its own
    /// loop calls it after `Stack::poll`.
    pub fn poll(&mut self, stack: &mut dyn SocketApi) -> bool {
        let mut did = false;
        let now = stack.now();
        while let Ok(h) = stack.tcp_accept(self.listener) {
            did = true;
            if self.conns.len() >= self.cfg.max_conns {
                let _ = stack.tcp_abort(h);
                continue;
            }
            // The end of a response is never held back (see the module documentation).
            let _ = stack.tcp_set_nodelay(h, true);
            self.conns.push(Conn::new(h, now + self.cfg.head_timeout));
        }
        let cfg = &self.cfg;
        let scratch = &mut self.scratch;
        let requests = &mut self.requests;
        self.conns.retain_mut(|c| {
            let Ok(r) = stack.readiness(c.h) else {
                return false;
            };
            if now >= c.deadline {
                did = true;
                // Idle keep-alive (nothing unread, nothing unsent): FIN; anything
                // else (a slow head, a stalled body or reader, a lingering close): RST.
                if matches!(c.phase, Phase::Head)
                    && c.idle
                    && c.inbuf.is_empty()
                    && c.out.is_empty()
                {
                    let _ = stack.tcp_close(c.h);
                } else {
                    let _ = stack.tcp_abort(c.h);
                }
                return false;
            }
            let sending = matches!(c.phase, Phase::Send | Phase::Close) || !c.out.is_empty();
            let reading = matches!(c.phase, Phase::Head | Phase::Body | Phase::Linger);
            let progress_possible = r.closed || (sending && r.writable) || (reading && r.readable);
            if !progress_possible {
                return true;
            }
            let (step, moved) = c.step(stack, scratch, cfg, now, requests);
            if moved > 0 && !matches!(c.phase, Phase::Head | Phase::Linger) {
                c.deadline = now + cfg.idle_timeout;
            }
            did |= moved > 0;
            match step {
                Step::Open => true,
                Step::Close => {
                    did = true;
                    let _ = stack.tcp_close(c.h);
                    false
                }
                Step::Abort => {
                    did = true;
                    let _ = stack.tcp_abort(c.h);
                    false
                }
            }
        });
        did
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_pattern, parse_response};
    use std::net::SocketAddr;
    use usnet_stack::sim::{Faults, SimNet};
    use usnet_stack::{mac_from_seed, SocketHandle, StackConfig};

    /// A raw client (stack 0) and the service (stack 1) on the simulator.
    struct Pair {
        net: SimNet,
        svc: HttpService,
        conn: SocketHandle,
    }

    impl Pair {
        fn new() -> Pair {
            let mut net = SimNet::new(3, Faults::default());
            for i in 1..=2u8 {
                net.add(StackConfig {
                    mac: mac_from_seed(i as u64),
                    addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
                    seed: i as u64,
                    ..Default::default()
                })
                .unwrap();
            }
            let svc = HttpService::start(net.stack_mut(1), HttpConfig::default()).unwrap();
            let to: SocketAddr = "10.0.0.2:80".parse().unwrap();
            let conn = net.stack_mut(0).tcp_connect(None, to).unwrap();
            Pair { net, svc, conn }
        }

        fn send(&mut self, b: &[u8]) {
            assert_eq!(self.net.stack_mut(0).tcp_send(self.conn, b), Ok(b.len()));
        }

        /// Runs until `done(received so far, EOF seen)`; returns what arrived.
        fn read_until(&mut self, mut done: impl FnMut(&[u8], bool) -> bool) -> (Vec<u8>, bool) {
            let (svc, c) = (&mut self.svc, self.conn);
            let (mut got, mut eof) = (Vec::new(), false);
            let mut buf = vec![0u8; 64 << 10];
            let ok = self.net.run_until(Duration::from_secs(5), |n| {
                svc.poll(n.stack_mut(1));
                while !eof {
                    match n.stack_mut(0).tcp_recv(c, &mut buf) {
                        Ok(0) => eof = true,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                        Err(_) => break,
                    }
                }
                done(&got, eof)
            });
            assert!(
                ok,
                "gave up after {} bytes: {:?}",
                got.len(),
                String::from_utf8_lossy(&got[..got.len().min(200)])
            );
            (got, eof)
        }
    }

    /// Splits `buf` into responses (status, body).
    fn responses(mut buf: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let (h, used) = parse_response(buf).unwrap().expect("a whole head");
            let mut d = BodyDecoder::for_response(&h, false);
            let mut body = Vec::new();
            let n = d.feed(&buf[used..], |s| body.extend_from_slice(s)).unwrap();
            assert!(d.is_done(), "a whole body");
            out.push((h.status, body));
            buf = &buf[used + n..];
        }
        out
    }

    #[test]
    fn connection_close_sends_everything_then_fin() {
        let mut p = Pair::new();
        p.send(b"GET /bytes/100000 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let (got, _) = p.read_until(|_, eof| eof);
        let r = responses(&got);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1.len()), (200, 100_000));
        assert_eq!(check_pattern(&r[0].1, 0), None);
        assert_eq!(p.svc.requests, 1);
    }

    #[test]
    fn a_half_closed_client_gets_all_its_pipelined_answers() {
        let mut p = Pair::new();
        p.send(b"GET /bytes/5 HTTP/1.1\r\nHost: a\r\n\r\nHEAD /bytes/9 HTTP/1.1\r\nHost: a\r\n\r\nGET /nothing HTTP/1.1\r\nHost: a\r\n\r\n");
        p.net.stack_mut(0).tcp_shutdown_write(p.conn).unwrap();
        let (got, _) = p.read_until(|_, eof| eof);
        let text = String::from_utf8_lossy(&got);
        assert_eq!(text.matches("HTTP/1.1 ").count(), 3, "{text}");
        assert!(text.contains("Content-Length: 9\r\n"), "{text}");
        assert!(text.ends_with("/nothing is not here\n"), "{text}");
        assert_eq!(p.svc.requests, 3);
    }

    #[test]
    fn expect_100_continue_then_the_body_hash() {
        let mut p = Pair::new();
        p.send(b"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
        let (got, _) = p.read_until(|b, _| b.ends_with(b"\r\n\r\n"));
        assert_eq!(got, b"HTTP/1.1 100 Continue\r\n\r\n");
        p.send(b"hello");
        let (got, _) = p.read_until(|b, _| b.ends_with(b"\n") && b.len() > 64);
        let r = responses(&got);
        assert_eq!(r[0].0, 200);
        let want = hex(&Sha256::digest(b"hello"));
        assert_eq!(r[0].1, format!("{want}\n").into_bytes());
    }

    #[test]
    fn a_bad_request_is_answered_then_closed() {
        let mut p = Pair::new();
        p.send(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n");
        let (got, eof) = p.read_until(|_, eof| eof);
        assert!(eof);
        let r = responses(&got);
        assert_eq!(r[0].0, 505);
        assert!(String::from_utf8_lossy(&got).contains("Connection: close\r\n"));
    }
}
