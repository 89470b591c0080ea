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

use std::time::Duration;

use sha2::{Digest, Sha256};
use usnet_stack::{Instant, SocketHandle, Stack, StackError};

use crate::body::BodyDecoder;
use crate::hex;
use crate::message::{parse_request, HttpError, RequestHead};
use crate::pattern::{pattern_slice, PATTERN_CHUNK};

/// The default port of the HTTP service.
pub const DEFAULT_PORT: u16 = 80;

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
    /// Sending `out`, then `pattern` bytes.
    Send,
    /// FIN sent; reading and dropping input until EOF or the deadline.
    Linger,
}

struct Conn {
    h: SocketHandle,
    phase: Phase,
    /// Unparsed input: a partial head, or bytes after a chunked body (bounded).
    inbuf: Vec<u8>,
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
    pub fn start(stack: &mut Stack, cfg: HttpConfig) -> Result<HttpService, StackError> {
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

    /// Does what can be done now; `moved` counts bytes read and written.
    fn step(
        &mut self,
        stack: &mut Stack,
        scratch: &mut [u8],
        cfg: &HttpConfig,
        now: Instant,
        requests: &mut u64,
    ) -> (Step, usize) {
        let mut moved = 0usize;
        while moved < BUDGET {
            match self.phase {
                Phase::Send => {
                    while self.out_pos < self.out.len() {
                        match stack.tcp_send(self.h, &self.out[self.out_pos..]) {
                            Ok(n) => {
                                self.out_pos += n;
                                moved += n;
                            }
                            Err(StackError::WouldBlock) => return (Step::Open, moved),
                            Err(_) => return (Step::Abort, moved),
                        }
                    }
                    self.out.clear();
                    self.out_pos = 0;
                    while self.pattern.0 < self.pattern.1 && moved < BUDGET {
                        let left = self.pattern.1 - self.pattern.0;
                        let s =
                            pattern_slice(self.pattern.0, left.min(PATTERN_CHUNK as u64) as usize);
                        match stack.tcp_send(self.h, s) {
                            Ok(n) => {
                                self.pattern.0 += n as u64;
                                moved += n;
                            }
                            Err(StackError::WouldBlock) => return (Step::Open, moved),
                            Err(_) => return (Step::Abort, moved),
                        }
                    }
                    if self.pattern.0 < self.pattern.1 {
                        return (Step::Open, moved);
                    }
                    *requests += 1;
                    if self.keep_alive {
                        self.phase = Phase::Head;
                        self.idle = true;
                        self.deadline = now + cfg.idle_timeout;
                    } else {
                        if stack.tcp_shutdown_write(self.h).is_err() {
                            return (Step::Abort, moved);
                        }
                        self.inbuf = Vec::new();
                        self.phase = Phase::Linger;
                        self.deadline = now + LINGER;
                    }
                }
                Phase::Head => {
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
                        Ok(0) => {
                            // EOF between requests is the normal end; inside a
                            // head it is the client giving up.
                            return (Step::Close, moved);
                        }
                        Ok(n) => {
                            moved += n;
                            self.inbuf.extend_from_slice(&scratch[..n]);
                        }
                        Err(StackError::WouldBlock) => return (Step::Open, moved),
                        Err(_) => return (Step::Abort, moved),
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
                        Ok(0) => return (Step::Abort, moved),
                        Ok(n) => {
                            moved += n;
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
                        Err(StackError::WouldBlock) => return (Step::Open, moved),
                        Err(_) => return (Step::Abort, moved),
                    }
                }
                Phase::Linger => match stack.tcp_recv(self.h, scratch) {
                    Ok(0) => return (Step::Close, moved),
                    Ok(n) => moved += n,
                    Err(StackError::WouldBlock) => return (Step::Open, moved),
                    Err(_) => return (Step::Close, moved),
                },
            }
        }
        (Step::Open, moved)
    }
}

impl HttpService {
    /// One turn inside the poll loop: accepts connections, then reads, answers and
    /// times out what can be. Returns whether anything moved. The runtime registers
    /// it as a service (`usnet_runtime::ServiceKind::Http`); a program with its own
    /// loop calls it after `Stack::poll`.
    pub fn poll(&mut self, stack: &mut Stack) -> bool {
        let mut did = false;
        let now = stack.now();
        while let Ok(h) = stack.tcp_accept(self.listener) {
            did = true;
            if self.conns.len() >= self.cfg.max_conns {
                let _ = stack.tcp_abort(h);
                continue;
            }
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
                // Idle keep-alive (nothing unread): FIN; anything else (a slow head,
                // a stalled body or reader, a lingering close): RST.
                if matches!(c.phase, Phase::Head) && c.idle && c.inbuf.is_empty() {
                    let _ = stack.tcp_close(c.h);
                } else {
                    let _ = stack.tcp_abort(c.h);
                }
                return false;
            }
            let sending = matches!(c.phase, Phase::Send);
            let progress_possible = r.closed || if sending { r.writable } else { r.readable };
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
