//! The client side, as `usnet get` and `usnet demo` use it: `http://` URLs with IP
//! literals, one request per connection (`Connection: close`), and a response read
//! to its end through the shared parser and body framing, hashed on the way. It works
//! on any `Read + Write` stream (a usnet `TcpStream`, a std one, a test buffer).

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};

use sha2::{Digest, Sha256};

use crate::body::BodyDecoder;
use crate::message::{parse_response, ResponseHead};

/// A parsed `http://` URL: where to connect, the Host header and the request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
}

pub fn parse_url(u: &str) -> Result<Url, String> {
    let rest = match u.split_once("://") {
        Some((s, r)) if s.eq_ignore_ascii_case("http") => r,
        Some((s, _)) => return Err(format!("'{s}' URLs are not supported: only http://")),
        None => return Err(format!("bad URL '{u}': expected http://ADDR[:PORT]/PATH")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    if auth.contains('@') {
        return Err("user names in URLs are not supported".into());
    }
    let (ip, port) = if let Some(v6) = auth.strip_prefix('[') {
        let (a, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("bad URL '{u}': no ']' after the IPv6 address"))?;
        let ip: IpAddr = a
            .parse()
            .map_err(|_| format!("bad IPv6 address '{a}' in '{u}'"))?;
        if !ip.is_ipv6() {
            return Err(format!("bad IPv6 address '{a}' in '{u}'"));
        }
        (ip, after)
    } else {
        let (a, p) = match auth.rsplit_once(':') {
            Some((a, _)) => (a, &auth[a.len()..]),
            None => (auth, ""),
        };
        let ip: IpAddr = a.parse().map_err(|_| {
            format!("'{a}' is not an IP address (usnet get has no DNS: use a literal)")
        })?;
        (ip, p)
    };
    let port = match port {
        "" | ":" => 80,
        p => p
            .strip_prefix(':')
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("bad port in '{u}'"))?,
    };
    let path = path.split('#').next().unwrap_or("");
    let path = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if !path.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(format!("bad path in '{u}': encode spaces and non-ASCII"));
    }
    Ok(Url {
        addr: SocketAddr::new(ip, port),
        host: auth.to_string(),
        path,
    })
}

/// What came back.
pub struct Fetched {
    pub head: ResponseHead,
    pub bytes: u64,
    pub sha256: [u8; 32],
}

/// A request body: its length and a function filling `buf` from offset `off`.
pub type BodyFill<'a> = (u64, &'a mut dyn FnMut(&mut [u8], u64));

/// Writes one request: the head (`Connection: close`, `Content-Length` when there is
/// a body) in one write, then the body in 256 KiB pieces.
pub fn write_request<W: Write>(
    s: &mut W,
    url: &Url,
    method: &str,
    body: Option<BodyFill<'_>>,
) -> io::Result<()> {
    let mut req = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: usnet-get/{}\r\nAccept: */*\r\nConnection: close\r\n",
        url.path,
        url.host,
        env!("CARGO_PKG_VERSION")
    );
    if let Some((len, _)) = &body {
        req.push_str(&format!("Content-Length: {len}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    if let Some((len, fill)) = body {
        let mut buf = vec![0u8; 256 << 10];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            fill(&mut buf[..n], off);
            s.write_all(&buf[..n])?;
            off += n as u64;
        }
    }
    Ok(())
}

/// One HTTP/1.1 exchange on a fresh connection `s`: sends the request (and `body`),
/// reads the response, hands the body to `sink` (after `on_head` saw the head) and
/// hashes it.
pub fn exchange<S: Read + Write>(
    s: &mut S,
    url: &Url,
    method: &str,
    body: Option<BodyFill<'_>>,
    on_head: &mut dyn FnMut(&ResponseHead),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<Fetched> {
    write_request(s, url, method, body)?;
    read_response(s, method == "HEAD", on_head, sink)
}

fn proto(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads a response head (skipping 1xx ones) and its body.
pub fn read_response<R: Read>(
    s: &mut R,
    head_only: bool,
    on_head: &mut dyn FnMut(&ResponseHead),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<Fetched> {
    const MAX_HEAD: usize = 64 << 10;
    let mut buf = vec![0u8; 256 << 10];
    let mut have = 0usize;
    let (head, used) = loop {
        match parse_response(&buf[..have]).map_err(|e| proto(format!("bad response: {}", e.why)))? {
            Some((h, used)) if (100..200).contains(&h.status) => {
                buf.copy_within(used..have, 0);
                have -= used;
                continue;
            }
            Some(r) => break r,
            None if have >= MAX_HEAD => {
                return Err(proto("the response head is over 64 KiB".into()));
            }
            None => {}
        }
        let n = s.read(&mut buf[have..MAX_HEAD])?;
        if n == 0 {
            return Err(proto("the connection closed before a response head".into()));
        }
        have += n;
    };
    on_head(&head);
    let mut hasher = Sha256::new();
    let mut bytes = 0u64;
    let mut body = BodyDecoder::for_response(&head, head_only);
    let mut pending = used..have;
    loop {
        if !pending.is_empty() {
            let mut err = Ok(());
            body.feed(&buf[pending.clone()], |d| {
                if err.is_ok() {
                    hasher.update(d);
                    bytes += d.len() as u64;
                    err = sink(d);
                }
            })
            .map_err(|e| proto(format!("bad chunked body: {}", e.why)))?;
            err?;
        }
        if body.is_done() {
            break;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            if let BodyDecoder::UntilClose = body {
                // The normal end of a body without a length.
                break;
            }
            return Err(proto(match (&body, head.content_length) {
                (BodyDecoder::Length(left), Some(len)) => {
                    format!("the body ended early: {} of {len} bytes", len - left)
                }
                _ => format!("the chunked body ended early, after {bytes} bytes"),
            }));
        }
        pending = 0..n;
    }
    Ok(Fetched {
        head,
        bytes,
        sha256: hasher.finalize().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://10.0.0.1:8080/bytes/5?x#frag").unwrap();
        assert_eq!(u.addr, "10.0.0.1:8080".parse().unwrap());
        assert_eq!(
            (u.host.as_str(), u.path.as_str()),
            ("10.0.0.1:8080", "/bytes/5?x")
        );
        let u = parse_url("http://[fd00::1]/").unwrap();
        assert_eq!(u.addr, "[fd00::1]:80".parse().unwrap());
        assert_eq!(u.host, "[fd00::1]");
        let u = parse_url("HTTP://[fd00::1]:81").unwrap();
        assert_eq!((u.addr.port(), u.path.as_str()), (81, "/"));
        assert_eq!(parse_url("http://1.2.3.4?q").unwrap().path, "/?q");
        for bad in [
            "https://1.2.3.4/",
            "1.2.3.4/x",
            "http://example.com/",
            "http://[10.0.0.1]/",
            "http://[fd00::1/",
            "http://1.2.3.4:0/",
            "http://1.2.3.4:99999/",
            "http://u@1.2.3.4/",
            "http://1.2.3.4/a b",
            "http://fd00::1/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    fn read(resp: &[u8]) -> io::Result<(Fetched, Vec<u8>)> {
        let mut body = Vec::new();
        // One byte per read, to cross every boundary.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || b.is_empty() {
                    return Ok(0);
                }
                b[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let f = read_response(&mut Trickle(resp), false, &mut |_| {}, &mut |d| {
            body.extend_from_slice(d);
            Ok(())
        })?;
        Ok((f, body))
    }

    #[test]
    fn response_bodies() {
        let (f, b) = read(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef",
        )
        .unwrap();
        assert_eq!((f.head.status, b.as_slice()), (200, &b"abc"[..]));
        assert_eq!(f.sha256, <[u8; 32]>::from(Sha256::digest(b"abc")));
        let (_, b) = read(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(b, b"abc");
        let (_, b) = read(b"HTTP/1.0 200 OK\r\n\r\nuntil close").unwrap();
        assert_eq!(b, b"until close");
        assert!(read(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab").is_err());
        assert!(read(b"garbage\r\n\r\n").is_err());
    }

    /// An in-memory connection: what the client wrote, and a canned answer.
    struct Canned {
        sent: Vec<u8>,
        answer: io::Cursor<Vec<u8>>,
    }
    impl Read for Canned {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.answer.read(b)
        }
    }
    impl Write for Canned {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.sent.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn requests_parse_with_the_server_parser() {
        let url = parse_url("http://[fd00::1]:8080/upload?x=1").unwrap();
        let mut c = Canned {
            sent: Vec::new(),
            answer: io::Cursor::new(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc".to_vec()),
        };
        let mut fill = |b: &mut [u8], off: u64| crate::fill_pattern(b, off);
        let f = exchange(
            &mut c,
            &url,
            "POST",
            Some((300_000, &mut fill)),
            &mut |_| {},
            &mut |_| Ok(()),
        )
        .unwrap();
        assert_eq!((f.head.status, f.bytes), (200, 3));
        let (req, used) = crate::parse_request(&c.sent).unwrap().unwrap();
        assert_eq!(
            (req.method.as_str(), req.path.as_str()),
            ("POST", "/upload")
        );
        assert!(req.http11 && !req.keep_alive);
        assert_eq!(req.content_length, Some(300_000));
        assert_eq!(c.sent.len() - used, 300_000);
        assert_eq!(crate::check_pattern(&c.sent[used..], 0), None);
    }
}
