//! Checks shared by the httpd tests: parse a stream of responses and check every
//! byte against what the server must send.

#![allow(dead_code)]

/// The exact bytes of one response of `len` body bytes (keep-alive or close; head
/// only for HEAD), written out here independently of the server's code.
pub fn expected(len: usize, close: bool, head_only: bool) -> Vec<u8> {
    let conn = if close { "close" } else { "keep-alive" };
    let mut v = format!(
        "HTTP/1.1 200 OK\r\nConnection: {conn}\r\nServer: usnet-phttpd/1\r\nContent-Length: {len}\r\n\r\n"
    )
    .into_bytes();
    if !head_only {
        v.extend((0..len as u64).map(usnet_http::pattern_byte));
    }
    v
}

/// Checks that `got` is exactly `want` (every byte: heads, lengths, bodies), naming
/// the first difference.
pub fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} bytes, want {}; first difference at {at}: got {:?}",
            got.len(),
            want.len(),
            String::from_utf8_lossy(&got[at.saturating_sub(20)..(at + 40).min(got.len())])
        );
    }
}

pub fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

pub const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
pub const GET_CLOSE: &[u8] = b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
pub const HEAD: &[u8] = b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n";
