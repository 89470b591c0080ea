//! usnet's built-in services, over UDP and TCP on the same port: echo (RFC 862),
//! discard (RFC 863) and chargen (RFC 864), and the registration of the HTTP service
//! (its code is the `usnet-http` crate). They are written against the small
//! non-blocking [`SocketApi`], so the same code runs as an ordinary client of a stack
//! server (`usnet up` runs each service set in a client thread) or inside a process's
//! own poll loop on the sans-IO `Stack` (`usnet_runtime::NetStack::add_service`).

use std::io;
use std::net::SocketAddr;
use std::str::FromStr;

use usnet_socket_api::{errno, Handle as SocketHandle, SocketApi};

/// A service: `poll` does what is due and returns whether it did work.
pub trait Service: Send {
    fn name(&self) -> &'static str;
    fn poll(&mut self, net: &mut dyn SocketApi) -> bool;
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    Echo,
    Discard,
    Chargen,
    /// The HTTP/1.1 service on this TCP port (see [`usnet_http::server`]).
    Http(u16),
}

impl ServiceKind {
    pub fn port(self) -> u16 {
        match self {
            ServiceKind::Echo => 7,
            ServiceKind::Discard => 9,
            ServiceKind::Chargen => 19,
            ServiceKind::Http(port) => port,
        }
    }

    /// Binds the service's port on every address of `stack` (IPv4 and IPv6), for
    /// UDP and TCP.
    pub fn start(self, stack: &mut dyn SocketApi) -> io::Result<Box<dyn Service>> {
        if let ServiceKind::Http(port) = self {
            let cfg = usnet_http::HttpConfig {
                port,
                ..Default::default()
            };
            return Ok(Box::new(usnet_http::HttpService::start(stack, cfg)?));
        }
        let addr = SocketAddr::from(([0u16; 8], self.port()));
        let sock = stack.udp_bind(addr)?;
        let listener = match stack.tcp_listen(addr, 128) {
            Ok(l) => l,
            Err(e) => {
                let _ = stack.close(sock);
                return Err(e);
            }
        };
        Ok(Box::new(Both {
            udp: UdpService {
                kind: self,
                sock,
                buf: vec![0u8; 65536],
                line: 0,
            },
            tcp: TcpService {
                kind: self,
                listener,
                conns: Vec::new(),
                buf: vec![0u8; 65536],
            },
        }))
    }

    /// Only the UDP service.
    pub fn start_udp(self, stack: &mut dyn SocketApi) -> io::Result<Box<dyn Service>> {
        if let ServiceKind::Http(_) = self {
            return Err(io::Error::from_raw_os_error(errno::ESOCKTNOSUPPORT));
        }
        let sock = stack.udp_bind(SocketAddr::from(([0u16; 8], self.port())))?;
        Ok(Box::new(UdpService {
            kind: self,
            sock,
            buf: vec![0u8; 65536],
            line: 0,
        }))
    }
}

impl FromStr for ServiceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "echo" => Ok(ServiceKind::Echo),
            "discard" => Ok(ServiceKind::Discard),
            "chargen" => Ok(ServiceKind::Chargen),
            "http" => Ok(ServiceKind::Http(usnet_http::DEFAULT_PORT)),
            _ => match s.strip_prefix("http:").map(str::parse::<u16>) {
                Some(Ok(port)) if port != 0 => Ok(ServiceKind::Http(port)),
                Some(_) => Err(format!("bad service '{s}': expected http:PORT (1..65535)")),
                None => Err(format!(
                    "unknown service '{s}': expected echo, discard, chargen, http or http:PORT"
                )),
            },
        }
    }
}

impl Service for usnet_http::HttpService {
    fn name(&self) -> &'static str {
        "http"
    }
    fn poll(&mut self, net: &mut dyn SocketApi) -> bool {
        usnet_http::HttpService::poll(self, net)
    }
}

struct UdpService {
    kind: ServiceKind,
    sock: SocketHandle,
    buf: Vec<u8>,
    /// chargen: where the next reply's pattern starts.
    line: usize,
}

/// The RFC 864 pattern: 72-character lines of printable ASCII, each starting one
/// character later than the one before.
pub fn chargen_line(line: usize, out: &mut Vec<u8>) {
    const FIRST: u8 = b' ';
    const COUNT: usize = 95;
    let start = line % COUNT;
    out.extend((0..72).map(|i| FIRST + ((start + i) % COUNT) as u8));
    out.extend_from_slice(b"\r\n");
}

impl Service for UdpService {
    fn name(&self) -> &'static str {
        match self.kind {
            ServiceKind::Echo => "echo",
            ServiceKind::Discard => "discard",
            ServiceKind::Chargen => "chargen",
            ServiceKind::Http(_) => "http",
        }
    }

    fn poll(&mut self, stack: &mut dyn SocketApi) -> bool {
        let mut did = false;
        // Bounded per poll so one flood cannot starve the loop.
        for _ in 0..256 {
            let (n, from) = match stack.udp_recv_from(self.sock, &mut self.buf) {
                Ok(r) => r,
                Err(_) => break,
            };
            did = true;
            match self.kind {
                ServiceKind::Discard | ServiceKind::Http(_) => {}
                ServiceKind::Echo => {
                    // A full transmit queue drops the echo, as UDP may.
                    let _ = stack.udp_send_to(self.sock, &self.buf[..n], from);
                }
                ServiceKind::Chargen => {
                    // RFC 864: a datagram of 0..512 characters per datagram received.
                    let mut out = Vec::with_capacity(512);
                    let len = (self.line * 37 + n) % 513;
                    while out.len() < len {
                        chargen_line(self.line, &mut out);
                        self.line += 1;
                    }
                    out.truncate(len);
                    let _ = stack.udp_send_to(self.sock, &out, from);
                }
            }
        }
        did
    }
}

struct Both {
    udp: UdpService,
    tcp: TcpService,
}

impl Service for Both {
    fn name(&self) -> &'static str {
        self.udp.name()
    }
    fn poll(&mut self, stack: &mut dyn SocketApi) -> bool {
        self.udp.poll(stack) | self.tcp.poll(stack)
    }
}

/// One TCP client of a service.
struct TcpClient {
    h: SocketHandle,
    /// echo: received bytes not yet sent back.
    pending: Vec<u8>,
    /// chargen: position in the endless character stream.
    pos: u64,
    eof: bool,
}

struct TcpService {
    kind: ServiceKind,
    listener: SocketHandle,
    conns: Vec<TcpClient>,
    buf: Vec<u8>,
}

/// Byte `pos` of the TCP chargen stream: RFC 864 lines back to back.
fn chargen_byte(pos: u64) -> u8 {
    let line = pos / 74;
    match pos % 74 {
        72 => b'\r',
        73 => b'\n',
        col => b' ' + ((line + col) % 95) as u8,
    }
}

/// Bytes a service moves per connection per poll, so one client cannot starve the
/// loop.
const TCP_BUDGET: usize = 256 << 10;

impl TcpService {
    /// Serves one client: `(still open, bytes moved)`.
    fn serve(
        kind: ServiceKind,
        c: &mut TcpClient,
        stack: &mut dyn SocketApi,
        buf: &mut [u8],
    ) -> (bool, usize) {
        let mut moved = 0;
        loop {
            // Echo: send back what is pending before reading more.
            if !c.pending.is_empty() {
                match stack.tcp_send(c.h, &c.pending) {
                    Ok(n) => {
                        c.pending.drain(..n);
                        moved += n;
                    }
                    Err(e) if would_block(&e) => {}
                    Err(_) => {
                        let _ = stack.tcp_close(c.h);
                        return (false, moved);
                    }
                }
                if !c.pending.is_empty() {
                    break;
                }
            }
            if c.eof || moved >= TCP_BUDGET {
                break;
            }
            match stack.tcp_recv(c.h, buf) {
                Ok(0) => c.eof = true,
                Ok(n) => {
                    moved += n;
                    if kind == ServiceKind::Echo {
                        c.pending.extend_from_slice(&buf[..n]);
                    }
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    let _ = stack.tcp_close(c.h);
                    return (false, moved);
                }
            }
        }
        if kind == ServiceKind::Chargen && !c.eof {
            while moved < TCP_BUDGET {
                let chunk = &mut buf[..16 << 10];
                for (i, b) in chunk.iter_mut().enumerate() {
                    *b = chargen_byte(c.pos + i as u64);
                }
                match stack.tcp_send(c.h, chunk) {
                    Ok(n) => {
                        c.pos += n as u64;
                        moved += n;
                    }
                    Err(e) if would_block(&e) => break,
                    Err(_) => {
                        let _ = stack.tcp_close(c.h);
                        return (false, moved);
                    }
                }
            }
        }
        if c.eof && c.pending.is_empty() {
            let _ = stack.tcp_close(c.h);
            return (false, moved);
        }
        (true, moved)
    }
}

impl Service for TcpService {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn poll(&mut self, stack: &mut dyn SocketApi) -> bool {
        let mut did = false;
        while let Ok(h) = stack.tcp_accept(self.listener) {
            did = true;
            self.conns.push(TcpClient {
                h,
                pending: Vec::new(),
                pos: 0,
                eof: false,
            });
        }
        let kind = self.kind;
        let buf = &mut self.buf;
        self.conns.retain_mut(|c| {
            let r = stack.readiness(c.h).unwrap_or_default();
            let wants_room = kind == ServiceKind::Chargen || !c.pending.is_empty();
            if !(r.readable || r.closed || (wants_room && r.writable)) {
                return true;
            }
            let (open, moved) = Self::serve(kind, c, stack, buf);
            did |= moved > 0 || !open;
            open
        });
        did
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chargen_lines_rotate() {
        let mut a = Vec::new();
        chargen_line(0, &mut a);
        assert_eq!(a.len(), 74);
        assert!(a.starts_with(b" !\"#$%"));
        let mut b = Vec::new();
        chargen_line(1, &mut b);
        assert!(b.starts_with(b"!\"#$%&"));
        assert!("bogus".parse::<ServiceKind>().is_err());
        let stream: Vec<u8> = (0..148).map(chargen_byte).collect();
        let mut lines = Vec::new();
        chargen_line(0, &mut lines);
        chargen_line(1, &mut lines);
        assert_eq!(stream, lines);
        assert_eq!("chargen".parse::<ServiceKind>(), Ok(ServiceKind::Chargen));
        assert_eq!("http".parse::<ServiceKind>(), Ok(ServiceKind::Http(80)));
        assert_eq!(
            "http:8080".parse::<ServiceKind>(),
            Ok(ServiceKind::Http(8080))
        );
        assert!("http:0".parse::<ServiceKind>().is_err());
        assert!("http:x".parse::<ServiceKind>().is_err());
    }
}
