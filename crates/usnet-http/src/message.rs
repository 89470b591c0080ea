//! Message heads (RFC 9112 §2-§5): the request line or status line and the header
//! fields, parsed strictly. Everything comes from the wire, so every byte is checked
//! and nothing panics; a refusal carries the status code a server answers with.
//! How long the body after a head is, is [`crate::body`]'s business.

/// Why a message head or body was refused: the status code and a short reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    pub why: &'static str,
}

pub(crate) fn bad(why: &'static str) -> HttpError {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ChunkedDecoder;

    fn req(s: &str) -> Result<Option<(RequestHead, usize)>, HttpError> {
        parse_request(s.as_bytes())
    }

    fn status(s: &str) -> u16 {
        req(s).expect_err("must be refused").status
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
