//! Built-in UDP services that run inside the poll loop: echo (RFC 862), discard
//! (RFC 863) and chargen (RFC 864). Running in the loop means no thread hand-off:
//! a request is answered in the same burst it arrived in.

use std::net::SocketAddr;
use std::str::FromStr;

use usnet_stack::{SocketHandle, Stack, StackError};

/// Something that runs inside the poll loop; `poll` returns whether it did work.
pub trait Service: Send {
    fn name(&self) -> &'static str;
    fn poll(&mut self, stack: &mut Stack) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    Echo,
    Discard,
    Chargen,
}

impl ServiceKind {
    pub fn port(self) -> u16 {
        match self {
            ServiceKind::Echo => 7,
            ServiceKind::Discard => 9,
            ServiceKind::Chargen => 19,
        }
    }

    /// Binds the service's port on every address of `stack` (IPv4 and IPv6).
    pub fn start(self, stack: &mut Stack) -> Result<Box<dyn Service>, StackError> {
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
            _ => Err(format!(
                "unknown service '{s}': expected echo, discard or chargen"
            )),
        }
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
        }
    }

    fn poll(&mut self, stack: &mut Stack) -> bool {
        let mut did = false;
        // Bounded per poll so one flood cannot starve the loop.
        for _ in 0..256 {
            let (n, from) = match stack.udp_recv_from(self.sock, &mut self.buf) {
                Ok(r) => r,
                Err(_) => break,
            };
            did = true;
            match self.kind {
                ServiceKind::Discard => {}
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
        assert_eq!("chargen".parse::<ServiceKind>(), Ok(ServiceKind::Chargen));
    }
}
