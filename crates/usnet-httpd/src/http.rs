//! The HTTP part every backend shares: the responses (built once at start), where
//! one request ends and the next begins in a byte stream ([`RequestStream`], on
//! `usnet_http`'s strict parser), and the answers owed to a connection in order
//! ([`Outq`]). No I/O here: a backend hands [`RequestStream::feed`] whatever bytes it
//! received (from a kernel socket, from the stack's byte rings, or straight from a
//! received pool buffer) and sends what [`Outq`] gives it.

use std::collections::VecDeque;

use usnet_http::{fill_pattern, parse_request, BodyDecoder, HttpError};

/// The `Server` field: 14 characters, like phttpd's `Apache/2.2.800`, so the
/// default head is phttpd's 81 bytes plus the length and the blank line.
pub const SERVER: &str = "usnet-phttpd/1";

/// Body length of the default response: with the default head, 151 bytes in all
/// (the zero-copy document's response size).
pub const DEFAULT_LENGTH: usize = 64;

/// Longest request head accepted (431 beyond).
pub const MAX_HEAD: usize = 8 << 10;

/// Largest response body (the response is built once, in memory).
pub const MAX_LENGTH: usize = 256 << 20;

/// Pending replies are gathered into one send up to this many bytes.
pub const COALESCE: usize = 16 << 10;

/// What a request is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Head and body; `close`: `Connection: close`, the last answer.
    Full { close: bool },
    /// HEAD: the same head, no body.
    Head { close: bool },
    /// A malformed request: this status, `Connection: close`, no body.
    Error(u16),
}

/// The bytes of every answer, built once.
#[derive(Debug, Clone)]
pub struct Responses {
    full_keep: Box<[u8]>,
    full_close: Box<[u8]>,
    head_len_keep: usize,
    head_len_close: usize,
    errors: Vec<(u16, Box<[u8]>)>,
}

fn head(status: &str, conn: &str, extra: &[String], len: usize) -> String {
    let mut h = format!("HTTP/1.1 {status}\r\nConnection: {conn}\r\nServer: {SERVER}\r\n");
    for e in extra {
        h.push_str(e);
        h.push_str("\r\n");
    }
    h.push_str(&format!("Content-Length: {len}\r\n\r\n"));
    h
}

impl Responses {
    /// Responses of `length` body bytes (the `/bytes/N` pattern of `usnet_http`, so a
    /// client can check every byte), with the static header lines `extra` (each
    /// `Name: value`) after `Server`.
    pub fn new(length: usize, extra: &[String]) -> Result<Responses, String> {
        if length > MAX_LENGTH {
            return Err(format!("a body of {length} bytes: at most {MAX_LENGTH}"));
        }
        for e in extra {
            let ok = e.split_once(':').is_some_and(|(n, _)| {
                !n.is_empty()
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            }) && !e.bytes().any(|b| b == b'\r' || b == b'\n');
            if !ok {
                return Err(format!("bad header line {e:?}: use 'Name: value'"));
            }
            let name = e.split(':').next().unwrap_or("").to_ascii_lowercase();
            if ["content-length", "connection", "transfer-encoding"].contains(&name.as_str()) {
                return Err(format!("{name} is set by the server"));
            }
        }
        let mut body = vec![0u8; length];
        fill_pattern(&mut body, 0);
        let build = |conn: &str| {
            let h = head("200 OK", conn, extra, length);
            let hl = h.len();
            let mut v = h.into_bytes();
            v.extend_from_slice(&body);
            (v.into_boxed_slice(), hl)
        };
        let (full_keep, head_len_keep) = build("keep-alive");
        let (full_close, head_len_close) = build("close");
        let errors = [
            (400, "400 Bad Request"),
            (417, "417 Expectation Failed"),
            (431, "431 Request Header Fields Too Large"),
            (501, "501 Not Implemented"),
            (505, "505 HTTP Version Not Supported"),
        ]
        .into_iter()
        .map(|(s, line)| {
            (
                s,
                head(line, "close", &[], 0).into_bytes().into_boxed_slice(),
            )
        })
        .collect();
        Ok(Responses {
            full_keep,
            full_close,
            head_len_keep,
            head_len_close,
            errors,
        })
    }

    /// The bytes of `r`.
    pub fn bytes(&self, r: Reply) -> &[u8] {
        match r {
            Reply::Full { close: false } => &self.full_keep,
            Reply::Full { close: true } => &self.full_close,
            Reply::Head { close: false } => &self.full_keep[..self.head_len_keep],
            Reply::Head { close: true } => &self.full_close[..self.head_len_close],
            Reply::Error(s) => self
                .errors
                .iter()
                .find(|(x, _)| *x == s)
                .map_or(&self.errors[0].1, |(_, b)| b),
        }
    }

    /// The keep-alive response, as it goes on the wire.
    pub fn response(&self) -> &[u8] {
        &self.full_keep
    }

    /// Length of the keep-alive response's head.
    pub fn head_len(&self) -> usize {
        self.head_len_keep
    }
}

/// Answers owed to one connection, in request order; `off` bytes of the first are
/// sent.
#[derive(Debug, Default)]
pub struct Outq {
    q: VecDeque<Reply>,
    off: usize,
}

impl Outq {
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn push(&mut self, r: Reply) {
        self.q.push_back(r);
    }

    /// The first answer owed and how many of its bytes were sent.
    pub fn front(&self) -> Option<(Reply, usize)> {
        self.q.front().map(|&r| (r, self.off))
    }

    /// Copies the pending bytes, in order, into `dst` as far as they fit; returns
    /// how many. Nothing is consumed: [`Outq::advance`] does that once they are sent.
    /// (A zero-copy backend fills its transmit buffers with it.)
    pub fn fill(&self, resp: &Responses, dst: &mut [u8]) -> usize {
        let mut at = 0;
        let mut off = self.off;
        for r in &self.q {
            let b = &resp.bytes(*r)[off..];
            let n = b.len().min(dst.len() - at);
            dst[at..at + n].copy_from_slice(&b[..n]);
            at += n;
            off = 0;
            if at == dst.len() {
                break;
            }
        }
        at
    }

    /// Pending bytes in all.
    pub fn pending(&self, resp: &Responses) -> usize {
        self.q.iter().map(|r| resp.bytes(*r).len()).sum::<usize>() - self.off
    }

    /// The bytes to send next: the rest of the first answer straight from the
    /// responses when it is the only one or large, else the pending answers gathered
    /// into `scratch` (up to [`COALESCE`] bytes), so pipelined answers leave in one
    /// send (one segment) rather than one short segment each.
    pub fn chunk<'a>(&self, resp: &'a Responses, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        let Some(&first) = self.q.front() else {
            return &[];
        };
        let b = &resp.bytes(first)[self.off..];
        if self.q.len() == 1 || b.len() >= COALESCE {
            return b;
        }
        scratch.resize(COALESCE, 0);
        let n = self.fill(resp, scratch);
        &scratch[..n]
    }

    /// `n` bytes were sent; returns how many answers are now complete.
    pub fn advance(&mut self, resp: &Responses, mut n: usize) -> usize {
        let mut done = 0;
        while let Some(&r) = self.q.front() {
            let left = resp.bytes(r).len() - self.off;
            if n < left {
                self.off += n;
                break;
            }
            n -= left;
            self.off = 0;
            self.q.pop_front();
            done += 1;
        }
        done
    }
}

/// One connection's input side: finds the requests in the byte stream and queues an
/// answer for each, in order. Whole requests are parsed straight from the bytes
/// received; only a request cut by a read boundary is kept (in `partial`).
#[derive(Debug, Default)]
pub struct RequestStream {
    partial: Vec<u8>,
    /// Skipping a request body.
    body: Option<BodyDecoder>,
    /// The last answer is queued (`Connection: close` or an error): input from
    /// here on is thrown away.
    closing: bool,
    /// Requests seen.
    pub requests: u64,
    /// Requests refused as malformed.
    pub errors: u64,
}

impl RequestStream {
    /// No more requests will be answered.
    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Bytes of an unfinished request kept between reads.
    pub fn partial_len(&self) -> usize {
        self.partial.len()
    }

    /// The client stopped sending: a request cut short is not answered.
    pub fn end_of_input(&mut self) {
        self.closing = true;
        self.partial = Vec::new();
    }

    /// Takes received bytes; queues the answers of the requests they complete.
    pub fn feed(&mut self, data: &[u8], out: &mut Outq) {
        if self.closing {
            return;
        }
        if self.partial.is_empty() {
            let used = self.consume(data, out);
            if !self.closing {
                self.partial.extend_from_slice(&data[used..]);
            }
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(data);
            let used = self.consume(&buf, out);
            if !self.closing {
                buf.drain(..used);
                self.partial = buf;
            }
        }
    }

    fn refuse(&mut self, e: HttpError, out: &mut Outq) {
        self.errors += 1;
        self.closing = true;
        out.push(Reply::Error(e.status));
    }

    /// Parses whole requests from `input`; returns the bytes used.
    fn consume(&mut self, input: &[u8], out: &mut Outq) -> usize {
        let mut at = 0;
        while !self.closing {
            if let Some(b) = &mut self.body {
                match b.feed(&input[at..], |_| {}) {
                    Ok(n) => at += n,
                    Err(e) => {
                        self.refuse(e, out);
                        break;
                    }
                }
                if !b.is_done() {
                    break;
                }
                self.body = None;
            }
            match parse_request(&input[at..]) {
                Ok(Some((req, used))) => {
                    at += used;
                    self.requests += 1;
                    let close = !req.keep_alive;
                    out.push(if req.method == "HEAD" {
                        Reply::Head { close }
                    } else {
                        Reply::Full { close }
                    });
                    if req.has_body() {
                        self.body = Some(BodyDecoder::for_request(&req));
                    }
                    if close {
                        self.closing = true;
                    }
                }
                Ok(None) => {
                    if input.len() - at >= MAX_HEAD {
                        self.refuse(
                            HttpError {
                                status: 431,
                                why: "request head too large",
                            },
                            out,
                        );
                    }
                    break;
                }
                Err(e) => {
                    self.refuse(e, out);
                    break;
                }
            }
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnet_http::check_pattern;

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    fn drain(out: &mut Outq, r: &Responses) -> Vec<u8> {
        let mut v = vec![0u8; out.pending(r)];
        let n = out.fill(r, &mut v);
        assert_eq!(n, v.len());
        out.advance(r, n);
        assert!(out.is_empty());
        v
    }

    #[test]
    fn default_response_is_151_bytes_like_phttpd() {
        let r = Responses::new(DEFAULT_LENGTH, &[]).unwrap();
        assert_eq!(r.response().len(), 151);
        assert_eq!(r.head_len(), 87);
        let text = std::str::from_utf8(&r.response()[..87]).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nServer: usnet-phttpd/1\r\nContent-Length: 64\r\n\r\n"
        );
        assert_eq!(check_pattern(&r.response()[87..], 0), None);
        let x = Responses::new(10, &["X-A: b".into()]).unwrap();
        assert!(String::from_utf8_lossy(&x.response()[..x.head_len()])
            .contains("Server: usnet-phttpd/1\r\nX-A: b\r\nContent-Length: 10\r\n\r\n"));
        assert!(Responses::new(1, &["Content-Length: 3".into()]).is_err());
        assert!(Responses::new(1, &["bad".into()]).is_err());
        assert!(Responses::new(1, &["X: a\r\nY: b".into()]).is_err());
        assert!(Responses::new(MAX_LENGTH + 1, &[]).is_err());
    }

    #[test]
    fn pipelined_requests_split_anywhere_get_answers_in_order() {
        let r = Responses::new(100, &[]).unwrap();
        let mut stream = Vec::new();
        stream.extend_from_slice(GET);
        stream.extend_from_slice(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n");
        stream.extend_from_slice(b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
        stream.extend_from_slice(b"GET / HTTP/1.0\r\n\r\n");
        stream.extend_from_slice(GET); // after the close: ignored
        let want: Vec<u8> = [
            r.bytes(Reply::Full { close: false }),
            r.bytes(Reply::Head { close: false }),
            r.bytes(Reply::Full { close: false }),
            r.bytes(Reply::Full { close: true }),
        ]
        .concat();
        for step in [1, 2, 3, 7, 30, 1000] {
            let mut s = RequestStream::default();
            let mut out = Outq::default();
            let mut got = Vec::new();
            for c in stream.chunks(step) {
                s.feed(c, &mut out);
                got.extend(drain(&mut out, &r));
            }
            assert_eq!(got, want, "step {step}");
            assert_eq!(s.requests, 4);
            assert!(s.is_closing());
        }
    }

    #[test]
    fn chunked_bodies_are_skipped() {
        let r = Responses::new(3, &[]).unwrap();
        let mut s = RequestStream::default();
        let mut out = Outq::default();
        s.feed(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
            &mut out,
        );
        assert_eq!(out.len(), 2);
        assert_eq!(s.requests, 2);
        assert!(!s.is_closing());
        drain(&mut out, &r);
    }

    #[test]
    fn malformed_requests_get_an_error_and_close() {
        let r = Responses::new(3, &[]).unwrap();
        for (req, status) in [
            (&b"GET / HTTP/1.1\r\n\r\n"[..], 400), // no Host
            (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
            (b"BAD\r\n\r\n", 400),
        ] {
            let mut s = RequestStream::default();
            let mut out = Outq::default();
            s.feed(GET, &mut out);
            s.feed(req, &mut out);
            s.feed(GET, &mut out);
            let got = drain(&mut out, &r);
            let want = [r.response(), r.bytes(Reply::Error(status))].concat();
            assert_eq!(got, want);
            assert!(String::from_utf8_lossy(r.bytes(Reply::Error(status)))
                .starts_with(&format!("HTTP/1.1 {status} ")));
            assert!(s.is_closing());
        }
        let mut s = RequestStream::default();
        let mut out = Outq::default();
        s.feed(&vec![b'a'; MAX_HEAD + 1], &mut out);
        assert_eq!(out.q.front(), Some(&Reply::Error(431)));
    }

    #[test]
    fn chunk_gathers_pipelined_answers_and_advance_counts() {
        let r = Responses::new(10, &[]).unwrap();
        let mut out = Outq::default();
        let mut scratch = Vec::new();
        for _ in 0..3 {
            out.push(Reply::Full { close: false });
        }
        let one = r.response().len();
        let c = out.chunk(&r, &mut scratch).to_vec();
        assert_eq!(c.len(), 3 * one);
        assert_eq!(out.advance(&r, one + 5), 1);
        assert_eq!(out.pending(&r), 2 * one - 5);
        let c = out.chunk(&r, &mut scratch);
        assert_eq!(c, [&r.response()[5..], r.response()].concat());
        assert_eq!(out.advance(&r, 2 * one - 5), 2);
        assert!(out.is_empty());
        // A large answer is sent straight from the responses.
        let big = Responses::new(64 << 10, &[]).unwrap();
        out.push(Reply::Full { close: false });
        out.push(Reply::Full { close: false });
        assert_eq!(
            out.chunk(&big, &mut scratch).as_ptr(),
            big.response().as_ptr()
        );
    }
}
