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
//! `(31 * i + 7) mod 251` ([`pattern_byte`]). Its period, 251, is prime, so a
//! block delivered at a wrong offset (other than a multiple of 251) is caught; it is
//! served from a precomputed table, so streaming costs no generation work.
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

use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use usnet_stack::{Instant, SocketHandle, Stack, StackError};

use crate::services::Service;

/// The default port of the HTTP service.
pub const DEFAULT_PORT: u16 = 80;

/// Period of the `/bytes/N` pattern.
pub const PATTERN_PERIOD: u64 = 251;

/// Byte `i` of the `/bytes/N` pattern: `(31 * i + 7) mod 251`.
pub fn pattern_byte(i: u64) -> u8 {
    (((i % PATTERN_PERIOD) * 31 + 7) % PATTERN_PERIOD) as u8
}

/// Longest slice [`pattern_slice`] returns.
pub const PATTERN_CHUNK: usize = 64 << 10;

fn table() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        (0..(PATTERN_CHUNK as u64 + PATTERN_PERIOD))
            .map(pattern_byte)
            .collect()
    })
}

/// The pattern from offset `off`, `min(len, PATTERN_CHUNK)` bytes, without copying.
pub fn pattern_slice(off: u64, len: usize) -> &'static [u8] {
    let start = (off % PATTERN_PERIOD) as usize;
    &table()[start..start + len.min(PATTERN_CHUNK)]
}

/// Fills `buf` with the pattern from offset `off`.
pub fn fill_pattern(buf: &mut [u8], mut off: u64) {
    let mut at = 0;
    while at < buf.len() {
        let s = pattern_slice(off, buf.len() - at);
        buf[at..at + s.len()].copy_from_slice(s);
        at += s.len();
        off += s.len() as u64;
    }
}

/// The first offset in `buf` (stream offset `off`) that differs from the pattern.
pub fn check_pattern(buf: &[u8], mut off: u64) -> Option<u64> {
    let mut at = 0;
    while at < buf.len() {
        let s = pattern_slice(off, buf.len() - at);
        if buf[at..at + s.len()] != *s {
            let k = (0..s.len()).find(|&k| buf[at + k] != s[k]).unwrap_or(0);
            return Some(off + k as u64);
        }
        at += s.len();
        off += s.len() as u64;
    }
    None
}

/// Hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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

// ------------------------------------------------------------------ parsing

/// Why a message head or body was refused: the status code and a short reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    pub why: &'static str,
}

fn bad(why: &'static str) -> HttpError {
    HttpError { status: 400, why }
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The path (origin form, query removed; absolute-form targets reduced to it).
    pub path: String,
    /// HTTP/1.1 (else 1.0).
    pub http11: bool,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// Whether the connection stays open after the answer.
    pub keep_alive: bool,
    pub expect_continue: bool,
}

impl RequestHead {
    pub fn has_body(&self) -> bool {
        self.chunked || self.content_length.is_some_and(|n| n > 0)
    }
}

/// Where the head ends: the index after the blank line, if it is in `buf`.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(k) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + k;
        // "\n\n" or "\n\r\n"
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => {}
        }
        i = nl + 1;
    }
    None
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The head's lines (without line ends), checking that CR only appears before LF.
fn lines(head: &[u8]) -> Result<Vec<&[u8]>, HttpError> {
    let mut out = Vec::new();
    for l in head.split(|&b| b == b'\n') {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.contains(&b'\r') {
            return Err(bad("bare CR"));
        }
        out.push(l);
    }
    // The blank line and what split() yields after the final LF.
    while out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    Ok(out)
}

/// One header field: `(lowercase name, value)`; obs-fold and whitespace before the
/// colon are refused (RFC 9112 §5).
fn header(line: &[u8]) -> Result<(String, &str), HttpError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(bad("obsolete line folding"));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(bad("header line without a colon"))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(bad("bad header name"));
    }
    let value = &line[colon + 1..];
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(bad("control character in a header value"));
    }
    let value = std::str::from_utf8(value)
        .map_err(|_| bad("header value is not UTF-8"))?
        .trim_matches([' ', '\t']);
    Ok((String::from_utf8_lossy(name).to_ascii_lowercase(), value))
}

/// A `Content-Length` value: digits only (a list of equal values is accepted, as
/// RFC 9110 §8.6 allows).
fn content_length(v: &str) -> Result<u64, HttpError> {
    let mut out = None;
    for part in v.split(',') {
        let p = part.trim_matches([' ', '\t']);
        if p.is_empty() || p.len() > 19 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("bad Content-Length"));
        }
        let n: u64 = p.parse().map_err(|_| bad("bad Content-Length"))?;
        if out.is_some_and(|o| o != n) {
            return Err(bad("conflicting Content-Length"));
        }
        out = Some(n);
    }
    out.ok_or(bad("bad Content-Length"))
}

/// Headers shared by requests and responses.
#[derive(Debug, Default)]
struct Framing {
    content_length: Option<u64>,
    chunked: bool,
    close: bool,
    keep_alive: bool,
}

fn framing_header(f: &mut Framing, name: &str, value: &str) -> Result<(), HttpError> {
    match name {
        "content-length" => {
            let n = content_length(value)?;
            if f.content_length.is_some_and(|o| o != n) {
                return Err(bad("conflicting Content-Length"));
            }
            f.content_length = Some(n);
        }
        "transfer-encoding" => {
            let codings: Vec<String> = value
                .split(',')
                .map(|c| c.trim_matches([' ', '\t']).to_ascii_lowercase())
                .filter(|c| !c.is_empty())
                .collect();
            if f.chunked || codings.is_empty() {
                return Err(bad("bad Transfer-Encoding"));
            }
            if codings.iter().any(|c| c != "chunked") || codings.len() > 1 {
                return Err(HttpError {
                    status: 501,
                    why: "only the chunked transfer coding is supported",
                });
            }
            f.chunked = true;
        }
        "connection" => {
            for t in value.split(',') {
                let t = t.trim_matches([' ', '\t']);
                if t.eq_ignore_ascii_case("close") {
                    f.close = true;
                } else if t.eq_ignore_ascii_case("keep-alive") {
                    f.keep_alive = true;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Parses a request head at the start of `buf` (leading blank lines are skipped).
/// `Ok(None)`: incomplete (the caller enforces the size limit, 431, when `buf`
/// reaches `max_head` bytes); `Ok(Some((head, used)))`: `used` bytes form the head.
pub fn parse_request(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HttpError> {
    let skip = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let Some(end) = head_end(&buf[skip..]) else {
        return Ok(None);
    };
    let ls = lines(&buf[skip..skip + end])?;
    let (first, rest) = ls.split_first().ok_or(bad("empty request"))?;
    let mut parts = first.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("bad request line"));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(bad("bad method"));
    }
    if target.is_empty() || !target.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err(bad("bad request target"));
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        [b'H', b'T', b'T', b'P', b'/', a, b'.', b] if a.is_ascii_digit() && b.is_ascii_digit() => {
            return Err(HttpError {
                status: 505,
                why: "only HTTP/1.0 and HTTP/1.1 are supported",
            })
        }
        _ => return Err(bad("bad HTTP version")),
    };
    // Both checked ASCII above.
    let method = String::from_utf8_lossy(method).into_owned();
    let target = std::str::from_utf8(target).map_err(|_| bad("bad request target"))?;
    let path = if target.starts_with('/') {
        target
    } else if let Some(r) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("https://"))
    {
        // Absolute form (RFC 9112 §3.2.2): keep the path.
        r.find('/').map_or("/", |i| &r[i..])
    } else if target == "*" && method == "OPTIONS" {
        "*"
    } else {
        return Err(bad("bad request target"));
    };
    let path = path.split(['?', '#']).next().unwrap_or("/").to_string();

    let mut f = Framing::default();
    let mut hosts = 0;
    let mut expect_continue = false;
    if rest.len() > 100 {
        return Err(HttpError {
            status: 431,
            why: "too many header fields",
        });
    }
    for l in rest {
        let (name, value) = header(l)?;
        framing_header(&mut f, &name, value)?;
        match name.as_str() {
            "host" => hosts += 1,
            "expect" => {
                if value.eq_ignore_ascii_case("100-continue") {
                    expect_continue = true;
                } else {
                    return Err(HttpError {
                        status: 417,
                        why: "only 100-continue is understood",
                    });
                }
            }
            _ => {}
        }
    }
    if f.chunked && f.content_length.is_some() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    if f.chunked && !http11 {
        return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
    }
    if http11 && hosts != 1 {
        return Err(bad("an HTTP/1.1 request needs exactly one Host"));
    }
    let keep_alive = if http11 {
        !f.close
    } else {
        f.keep_alive && !f.close
    };
    Ok(Some((
        RequestHead {
            method,
            path,
            http11,
            content_length: f.content_length,
            chunked: f.chunked,
            keep_alive,
            expect_continue: expect_continue && http11,
        },
        skip + end,
    )))
}

/// A parsed response head (for clients such as `usnet get`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: String,
    pub http11: bool,
    pub content_length: Option<u64>,
    pub chunked: bool,
    /// The server keeps the connection open.
    pub keep_alive: bool,
}

/// Parses a response head at the start of `buf`: `Ok(None)` while incomplete.
pub fn parse_response(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, HttpError> {
    let Some(end) = head_end(buf) else {
        return Ok(None);
    };
    let ls = lines(&buf[..end])?;
    let (first, rest) = ls.split_first().ok_or(bad("empty response"))?;
    let first = std::str::from_utf8(first).map_err(|_| bad("bad status line"))?;
    let mut parts = first.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    let reason = parts.next().unwrap_or("").to_string();
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        _ => return Err(bad("bad HTTP version in the status line")),
    };
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("bad status code"));
    }
    let status: u16 = code.parse().map_err(|_| bad("bad status code"))?;
    if !(100..600).contains(&status) {
        return Err(bad("bad status code"));
    }
    let mut f = Framing::default();
    for l in rest {
        let (name, value) = header(l)?;
        framing_header(&mut f, &name, value)?;
    }
    if f.chunked {
        // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length.
        f.content_length = None;
    }
    let keep_alive = if http11 {
        !f.close
    } else {
        f.keep_alive && !f.close
    };
    Ok(Some((
        ResponseHead {
            status,
            reason,
            http11,
            content_length: f.content_length,
            chunked: f.chunked,
            keep_alive,
        },
        end,
    )))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk size (value, digits so far).
    Size(u64, u8),
    /// A chunk extension or whitespace up to the line end (bytes skipped).
    Ext(u16),
    /// CR seen after the size line; LF expected.
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// Trailer section: (length of the current line, total length).
    Trailer(u16, u16),
    Done,
}

/// Decodes a chunked body (RFC 9112 §7.1) incrementally, with bounded state: chunk
/// sizes up to 15 hex digits, extensions up to 4 KiB, trailers up to 8 KiB
/// (skipped).
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    st: Chunk,
    /// Size of the chunk whose size line is being read (kept across `Ext`).
    pending: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder {
            st: Chunk::Size(0, 0),
            pending: 0,
        }
    }
}

impl ChunkedDecoder {
    pub fn is_done(&self) -> bool {
        self.st == Chunk::Done
    }

    /// Feeds `input`; body bytes go to `data`. Returns the bytes consumed (less than
    /// `input.len()` only once done: the rest belongs to what follows the body).
    pub fn feed<'a>(
        &mut self,
        input: &'a [u8],
        mut data: impl FnMut(&'a [u8]),
    ) -> Result<usize, HttpError> {
        let e = |why| Err(bad(why));
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.st {
                Chunk::Done => return Ok(i),
                Chunk::Data(rem) => {
                    let n = (rem.min((input.len() - i) as u64)) as usize;
                    data(&input[i..i + n]);
                    i += n;
                    self.st = if rem == n as u64 {
                        Chunk::DataCr
                    } else {
                        Chunk::Data(rem - n as u64)
                    };
                    continue;
                }
                Chunk::Size(v, digits) => {
                    if let Some(d) = (b as char).to_digit(16) {
                        if digits >= 15 {
                            return e("chunk size too large");
                        }
                        self.st = Chunk::Size(v << 4 | d as u64, digits + 1);
                    } else if digits == 0 {
                        return e("bad chunk size");
                    } else {
                        self.pending = v;
                        self.st = match b {
                            b'\r' => Chunk::SizeLf(v),
                            b'\n' => self.after_size(v),
                            b';' | b' ' | b'\t' => Chunk::Ext(0),
                            _ => return e("bad chunk size"),
                        };
                    }
                }
                Chunk::Ext(n) => {
                    self.st = match b {
                        b'\n' => self.after_size(self.pending),
                        _ if n >= 4096 => return e("chunk extension too long"),
                        _ => Chunk::Ext(n + 1),
                    };
                }
                Chunk::SizeLf(v) => {
                    if b != b'\n' {
                        return e("bad chunk size line");
                    }
                    self.st = self.after_size(v);
                }
                Chunk::DataCr => {
                    self.st = match b {
                        b'\r' => Chunk::DataLf,
                        b'\n' => Chunk::Size(0, 0),
                        _ => return e("chunk data longer than its size"),
                    };
                }
                Chunk::DataLf => {
                    if b != b'\n' {
                        return e("chunk data longer than its size");
                    }
                    self.st = Chunk::Size(0, 0);
                }
                Chunk::Trailer(line, total) => {
                    if total >= 8192 {
                        return e("trailer section too long");
                    }
                    self.st = match b {
                        b'\n' if line == 0 => Chunk::Done,
                        b'\n' => Chunk::Trailer(0, total + 1),
                        b'\r' => Chunk::Trailer(line, total + 1),
                        _ => Chunk::Trailer(line + 1, total + 1),
                    };
                }
            }
            i += 1;
        }
        Ok(i)
    }

    fn after_size(&self, v: u64) -> Chunk {
        if v == 0 {
            Chunk::Trailer(0, 0)
        } else {
            Chunk::Data(v)
        }
    }
}

// ------------------------------------------------------------------ the service

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

enum BodyReader {
    Length(u64),
    Chunked(ChunkedDecoder),
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
    body: BodyReader,
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
            body: BodyReader::Length(0),
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
                self.body = if req.chunked {
                    BodyReader::Chunked(ChunkedDecoder::default())
                } else {
                    BodyReader::Length(req.content_length.unwrap_or(0))
                };
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
        match &mut self.body {
            BodyReader::Length(rem) => {
                let n = (*rem).min(input.len() as u64) as usize;
                if let Some(h) = self.hasher.as_mut() {
                    h.update(&input[..n]);
                }
                *rem -= n as u64;
                Ok(n)
            }
            BodyReader::Chunked(d) => {
                let hasher = &mut self.hasher;
                let used = d.feed(input, |s| {
                    if let Some(h) = hasher.as_mut() {
                        h.update(s);
                    }
                })?;
                Ok(used)
            }
        }
    }

    fn body_done(&self) -> bool {
        match &self.body {
            BodyReader::Length(rem) => *rem == 0,
            BodyReader::Chunked(d) => d.is_done(),
        }
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
                    let want = match &self.body {
                        BodyReader::Length(rem) => (*rem).min(scratch.len() as u64) as usize,
                        BodyReader::Chunked(_) => scratch.len(),
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

impl Service for HttpService {
    fn name(&self) -> &'static str {
        "http"
    }

    fn poll(&mut self, stack: &mut Stack) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<Option<(RequestHead, usize)>, HttpError> {
        parse_request(s.as_bytes())
    }

    fn status(s: &str) -> u16 {
        req(s).expect_err("must be refused").status
    }

    #[test]
    fn pattern_is_the_documented_formula() {
        for i in [0u64, 1, 250, 251, 252, 65535, 65536, 1 << 33, u64::MAX] {
            assert_eq!(
                pattern_byte(i) as u128,
                (31 * i as u128 + 7) % 251,
                "byte {i}"
            );
        }
        for off in [0u64, 1, 250, 251, 70_000, (8 << 30) + 3] {
            let mut b = vec![0u8; 200_000];
            fill_pattern(&mut b, off);
            for (k, x) in b.iter().enumerate().step_by(997) {
                assert_eq!(*x, pattern_byte(off + k as u64));
            }
            assert_eq!(check_pattern(&b, off), None);
            b[100_001] ^= 1;
            assert_eq!(check_pattern(&b, off), Some(off + 100_001));
        }
        assert_eq!(pattern_slice(5, 1 << 30).len(), PATTERN_CHUNK);
    }

    #[test]
    fn parses_a_simple_get() {
        let s = "GET /bytes/10?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: t\r\n\r\nGET";
        let (h, used) = req(s).unwrap().unwrap();
        assert_eq!(used, s.len() - 3);
        assert_eq!(h.method, "GET");
        assert_eq!(h.path, "/bytes/10");
        assert!(h.http11 && h.keep_alive && !h.has_body());
        // Leading blank lines, bare LF, absolute form, HTTP/1.0.
        let (h, _) = req("\r\n\nGET http://x:8/p/q HTTP/1.0\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.path, "/p/q");
        assert!(!h.http11 && !h.keep_alive);
        let (h, _) = req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        let (h, _) = req("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive);
    }

    #[test]
    fn incomplete_heads_wait() {
        let full = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n";
        for cut in 0..full.len() {
            assert_eq!(req(&full[..cut]), Ok(None), "cut at {cut}");
        }
        let (h, _) = req(full).unwrap().unwrap();
        assert_eq!(h.content_length, Some(3));
        assert!(h.has_body());
    }

    #[test]
    fn body_framing() {
        let (h, _) = req("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.chunked && h.expect_continue && h.content_length.is_none());
        let (h, _) = req("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.content_length, Some(5));
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            501
        );
        assert_eq!(
            status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            status("GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n"),
            417
        );
    }

    #[test]
    fn malformed_heads_are_refused() {
        for bad_head in [
            "GET / HTTP/1.1\r\n\r\n",                       // no Host
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", // two Hosts
            "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",           // double space
            "GET / HTTP/1.1 x\r\nHost: a\r\n\r\n",          // extra part
            "GET /\r\n\r\n",                                // HTTP/0.9
            "G(T / HTTP/1.1\r\nHost: a\r\n\r\n",            // bad method
            "GET nopath HTTP/1.1\r\nHost: a\r\n\r\n",       // bad target
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n",           // space before colon
            "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", // obs-fold
            "GET / HTTP/1.1\r\nHost a\r\n\r\n",             // no colon
            "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",         // bare CR
            "GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n",        // NUL
            "GET / http/1.1\r\nHost: a\r\n\r\n",            // version case
            "GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n",        // DEL in target
        ] {
            assert_eq!(status(bad_head), 400, "{bad_head:?}");
        }
        assert_eq!(status("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);
        let many: String = (0..101).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(
            status(&format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n")),
            431
        );
        // Invalid UTF-8 in a value is refused, not a panic.
        let mut raw = b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n".to_vec();
        assert_eq!(parse_request(&raw).unwrap_err().status, 400);
        raw.truncate(4);
        assert_eq!(parse_request(&raw), Ok(None));
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let alphabet = b"GETPOST /:\r\n HTTP/1.01Host-Content-Length0123456789chunked;\t\x00\xff";
        for _ in 0..20_000 {
            let mut v = Vec::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 200) as usize;
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            let _ = parse_request(&v);
            let _ = parse_response(&v);
            let mut d = ChunkedDecoder::default();
            let _ = d.feed(&v, |_| {});
        }
    }

    fn dechunk(input: &[u8], step: usize) -> Result<(Vec<u8>, usize), HttpError> {
        let mut d = ChunkedDecoder::default();
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() && !d.is_done() {
            let end = (at + step).min(input.len());
            at += d.feed(&input[at..end], |s| out.extend_from_slice(s))?;
        }
        assert!(d.is_done(), "not done after {at} bytes");
        Ok((out, at))
    }

    #[test]
    fn chunked_bodies() {
        let body =
            b"5\r\nhello\r\n6;ext=1\r\n world\r\nA \r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, 1000] {
            let (out, used) = dechunk(body, step).unwrap();
            assert_eq!(out, b"hello world0123456789");
            assert_eq!(&body[used..], b"NEXT", "step {step}");
        }
        // Bare LF line ends.
        assert_eq!(dechunk(b"3\nabc\n0\n\n", 1).unwrap().0, b"abc");
        for bad_body in [
            &b"x\r\n"[..],
            b"\r\n",
            b"3\r\nabcd\r\n",
            b"10000000000000000\r\n",
            b"3\rx",
        ] {
            let mut d = ChunkedDecoder::default();
            assert!(d.feed(bad_body, |_| {}).is_err(), "{bad_body:?}");
        }
        let mut d = ChunkedDecoder::default();
        let long_ext = [b"1;".as_slice(), &[b'a'; 5000]].concat();
        assert!(d.feed(&long_ext, |_| {}).is_err());
    }

    #[test]
    fn responses() {
        let (h, used) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nbody")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.content_length, h.keep_alive),
            (200, Some(12), true)
        );
        assert_eq!(used, 39);
        let (h, _) = parse_response(
            b"HTTP/1.0 404 Not Found\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(h.chunked && h.content_length.is_none() && !h.keep_alive);
        assert_eq!(h.reason, "Not Found");
        assert!(parse_response(b"HTTP/1.1 20 OK\r\n\r\n").is_err());
        assert!(parse_response(b"SIP/2.0 200 OK\r\n\r\n").is_err());
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n"), Ok(None));
    }
}
