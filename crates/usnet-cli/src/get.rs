//! `usnet get URL`: an HTTP/1.1 client on a usnet stack (`--link ... --addr ...`
//! as for `usnet up`). The URL names the server by an IPv4 or IPv6 literal
//! (`http://10.0.0.1:8080/x`, `http://[fd00::1]/x`; no DNS). Content-Length,
//! chunked and read-until-close bodies; progress on stderr; the byte count and
//! SHA-256 of the body at the end (`--sha256`: only the hex digest); `-o FILE`
//! writes the body. The exit status is non-zero for HTTP statuses 400 and above,
//! and for a body cut short.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use usnet_runtime::http::{hex, parse_response, ChunkedDecoder, ResponseHead};
use usnet_runtime::{NetStack, TcpStream};
use usnet_stack::IpCidr;

use crate::up::{self, UpArgs};
use crate::CmdResult;

#[derive(Args, Debug)]
pub struct GetArgs {
    /// http://ADDR[:PORT]/PATH, ADDR an IPv4 literal or an [IPv6] literal.
    pub url: String,
    /// Write the body to this file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print only the hex SHA-256 of the body.
    #[arg(long)]
    pub sha256: bool,
    /// The usnet stack's link: tap:IF, shm:NAME, afpacket:IF, nic:NAME.
    #[arg(long)]
    pub link: String,
    /// The usnet stack's addresses (repeatable), e.g. 10.20.0.2/24.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<IpCidr>,
    /// tap only: address(es) for the Linux side of the TAP.
    #[arg(long = "host-addr", value_name = "CIDR")]
    pub host_addrs: Vec<IpCidr>,
    /// Default gateway of the usnet stack (repeatable).
    #[arg(long)]
    pub gateway: Vec<IpAddr>,
    /// L3 MTU of the usnet stack.
    #[arg(long)]
    pub mtu: Option<usize>,
    /// Seconds to wait for the connection and for each read.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Turn off the usnet stack's receive coalescing (GRO), as `usnet up --no-gro`.
    #[arg(long)]
    pub no_gro: bool,
}

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

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`): sends the
/// request (and `body`), reads the response, hands the body to `sink` (after
/// `on_head` saw the head) and hashes it.
pub fn exchange(
    net: &NetStack,
    url: &Url,
    method: &str,
    body: Option<BodyFill<'_>>,
    timeout: Duration,
    on_head: &mut dyn FnMut(&ResponseHead),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<Fetched> {
    let mut s = TcpStream::connect_timeout(net, url.addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
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
    read_response(&mut s, method == "HEAD", on_head, sink)
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
    let mut deliver = |d: &[u8]| -> io::Result<()> {
        hasher.update(d);
        bytes += d.len() as u64;
        sink(d)
    };
    let no_body = head_only || head.status == 204 || head.status == 304;
    let mut pending = used..have;
    if no_body {
    } else if head.chunked {
        let mut dec = ChunkedDecoder::default();
        loop {
            if !pending.is_empty() {
                let mut err = Ok(());
                let chunk = &buf[pending.clone()];
                dec.feed(chunk, |d| {
                    if err.is_ok() {
                        err = deliver(d);
                    }
                })
                .map_err(|e| proto(format!("bad chunked body: {}", e.why)))?;
                err?;
            }
            if dec.is_done() {
                break;
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(proto(format!(
                    "the chunked body ended early, after {bytes} bytes"
                )));
            }
            pending = 0..n;
        }
    } else if let Some(len) = head.content_length {
        let mut left = len;
        loop {
            let take = (left.min(pending.len() as u64)) as usize;
            if take > 0 {
                deliver(&buf[pending.start..pending.start + take])?;
                left -= take as u64;
            }
            if left == 0 {
                break;
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Err(proto(format!(
                    "the body ended early: {} of {len} bytes",
                    len - left
                )));
            }
            pending = 0..n;
        }
    } else {
        // Until the server closes.
        loop {
            if !pending.is_empty() {
                deliver(&buf[pending.clone()])?;
            }
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            pending = 0..n;
        }
    }
    Ok(Fetched {
        head,
        bytes,
        sha256: hasher.finalize().into(),
    })
}

pub fn run(a: GetArgs) -> CmdResult {
    let url = parse_url(&a.url)?;
    let args = UpArgs {
        addrs: a.addrs.clone(),
        host_addrs: a.host_addrs.clone(),
        gateway: a.gateway.clone(),
        mtu: a.mtu,
        no_gro: a.no_gro,
        ..UpArgs::embedded(a.link.clone(), format!("get-{}", std::process::id()))
    };
    let (net, _) = up::start(&args)?;
    let r = fetch(&net, &url, &a);
    net.shutdown();
    r
}

fn fetch(net: &NetStack, url: &Url, a: &GetArgs) -> CmdResult {
    let mut out = match &a.output {
        Some(p) => Some(BufWriter::with_capacity(
            1 << 20,
            File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let bar = if a.sha256 {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    let t0 = Instant::now();
    let timeout = Duration::from_secs_f64(a.timeout.max(0.1));
    let mut on_head = |h: &ResponseHead| {
        if let Some(len) = h.content_length {
            bar.set_length(len);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        } else {
            bar.set_style(
                ProgressStyle::with_template("{spinner} {bytes} {bytes_per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
        }
    };
    let mut sink = |d: &[u8]| -> io::Result<()> {
        bar.inc(d.len() as u64);
        match out.as_mut() {
            Some(w) => w.write_all(d),
            None => Ok(()),
        }
    };
    let r = exchange(net, url, "GET", None, timeout, &mut on_head, &mut sink);
    bar.finish_and_clear();
    let f = r.map_err(|e| format!("GET {}: {e}", a.url))?;
    if let Some(mut w) = out {
        w.flush()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let digest = hex(&f.sha256);
    let summary = if a.sha256 {
        format!("{digest}\n")
    } else {
        format!(
            "usnet get: HTTP {} {}, {} bytes in {secs:.3} s ({:.1} MB/s)\nsha256 {digest}\n",
            f.head.status,
            f.head.reason,
            f.bytes,
            f.bytes as f64 / secs.max(1e-9) / 1e6
        )
    };
    // A reader that stopped early (`| head -1`) is not an error of ours.
    match io::stdout().lock().write_all(summary.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    if f.head.status >= 400 {
        eprintln!(
            "usnet get: {}: HTTP {} {}",
            a.url, f.head.status, f.head.reason
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
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
}
