//! Message bodies (RFC 9112 §6-§7): how long the body after a head is
//! ([`BodyDecoder`]: a length, chunked or until the connection closes) and the
//! incremental chunked decoder. The server reads request bodies and the client reads
//! response bodies through the same decoder, with bounded state whatever the peer
//! sends.

use crate::message::{bad, HttpError, RequestHead, ResponseHead};

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

/// Where the body after a head ends, decoded as bytes arrive.
#[derive(Debug, Clone)]
pub enum BodyDecoder {
    /// This many bytes are still to come (`Content-Length`; 0: no body).
    Length(u64),
    Chunked(ChunkedDecoder),
    /// Until the connection closes (a response with neither length nor chunking).
    UntilClose,
}

impl BodyDecoder {
    /// The body of a request: chunked, `Content-Length` or none (a request never
    /// runs until close).
    pub fn for_request(h: &RequestHead) -> BodyDecoder {
        if h.chunked {
            BodyDecoder::Chunked(ChunkedDecoder::default())
        } else {
            BodyDecoder::Length(h.content_length.unwrap_or(0))
        }
    }

    /// The body of a response (RFC 9112 §6.3): none for a HEAD request
    /// (`head_only`), 1xx, 204 and 304; else chunked, `Content-Length` or until
    /// close.
    pub fn for_response(h: &ResponseHead, head_only: bool) -> BodyDecoder {
        if head_only || (100..200).contains(&h.status) || h.status == 204 || h.status == 304 {
            BodyDecoder::Length(0)
        } else if h.chunked {
            BodyDecoder::Chunked(ChunkedDecoder::default())
        } else if let Some(n) = h.content_length {
            BodyDecoder::Length(n)
        } else {
            BodyDecoder::UntilClose
        }
    }

    /// The whole body has been seen (never for [`BodyDecoder::UntilClose`]: only the
    /// end of the stream ends that).
    pub fn is_done(&self) -> bool {
        match self {
            BodyDecoder::Length(rem) => *rem == 0,
            BodyDecoder::Chunked(d) => d.is_done(),
            BodyDecoder::UntilClose => false,
        }
    }

    /// Body bytes still expected, where the framing says (`Content-Length`).
    pub fn remaining(&self) -> Option<u64> {
        match self {
            BodyDecoder::Length(rem) => Some(*rem),
            _ => None,
        }
    }

    /// Feeds `input`; body bytes go to `data`. Returns the bytes consumed: less than
    /// `input.len()` only once the body is complete (the rest is the next message).
    pub fn feed<'a>(
        &mut self,
        input: &'a [u8],
        mut data: impl FnMut(&'a [u8]),
    ) -> Result<usize, HttpError> {
        match self {
            BodyDecoder::Length(rem) => {
                let n = (*rem).min(input.len() as u64) as usize;
                if n > 0 {
                    data(&input[..n]);
                }
                *rem -= n as u64;
                Ok(n)
            }
            BodyDecoder::Chunked(d) => d.feed(input, data),
            BodyDecoder::UntilClose => {
                if !input.is_empty() {
                    data(input);
                }
                Ok(input.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn body_lengths() {
        let resp = |s: &str| crate::parse_response(s.as_bytes()).unwrap().unwrap().0;
        let get = |s: &str| crate::parse_request(s.as_bytes()).unwrap().unwrap().0;
        let ok = resp("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(BodyDecoder::for_response(&ok, false).remaining(), Some(5));
        assert_eq!(BodyDecoder::for_response(&ok, true).remaining(), Some(0));
        for st in ["100 Continue", "204 No Content", "304 Not Modified"] {
            let h = resp(&format!("HTTP/1.1 {st}\r\nContent-Length: 5\r\n\r\n"));
            assert!(BodyDecoder::for_response(&h, false).is_done(), "{st}");
        }
        let close = resp("HTTP/1.0 200 OK\r\n\r\n");
        let mut d = BodyDecoder::for_response(&close, false);
        assert!(matches!(d, BodyDecoder::UntilClose));
        let mut got = Vec::new();
        assert_eq!(d.feed(b"abc", |s| got.extend_from_slice(s)), Ok(3));
        assert!(!d.is_done() && got == b"abc");
        let chunked = resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let mut d = BodyDecoder::for_response(&chunked, false);
        assert_eq!(d.feed(b"1\r\nx\r\n0\r\n\r\nNEXT", |_| {}), Ok(11));
        assert!(d.is_done());
        // A request body stops at its length; what follows is the next request.
        let post = get("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n");
        let mut d = BodyDecoder::for_request(&post);
        let mut got = Vec::new();
        assert_eq!(d.feed(b"abcGET", |s| got.extend_from_slice(s)), Ok(3));
        assert!(d.is_done() && got == b"abc");
        assert!(BodyDecoder::for_request(&get("GET / HTTP/1.1\r\nHost: a\r\n\r\n")).is_done());
    }
}
