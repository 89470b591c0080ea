//! The messages of the rpc transport: a 32-byte header, then `len` payload bytes.
//!
//! Client → proxy: `HELLO` (cluster geometry), `LISTEN`, `ACCEPT`, `CONNECT`, `WRITE`,
//! `READ`, `SHUTDOWN`, `CLOSE`; each ends with a `REPLY` from the proxy. Inside a
//! `WRITE` the proxy asks for the caller's bytes one copy request at a time
//! (`COPYIN` → `DATA`), inside a `READ` it hands them over the same way
//! (`COPYOUT` → `ACK`): one round trip per MCLNUM clusters of MCLBYTES, the rump
//! kernel's `rumpuser_sp_copyin`/`copyout` structure.

use std::io::{self, Read, Write};

pub const HELLO: u32 = 1;
pub const LISTEN: u32 = 2;
pub const ACCEPT: u32 = 3;
pub const CONNECT: u32 = 4;
pub const WRITE: u32 = 5;
pub const READ: u32 = 6;
pub const SHUTDOWN: u32 = 7;
pub const CLOSE: u32 = 8;
pub const REPLY: u32 = 16;
pub const COPYIN: u32 = 17;
pub const DATA: u32 = 18;
pub const COPYOUT: u32 = 19;
pub const ACK: u32 = 20;

/// Payloads larger than this are refused (a copy request is at most 16 × 64 KiB).
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// One message header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub op: u32,
    pub sock: u32,
    pub len: u32,
    pub arg: i64,
    pub arg2: i64,
}

impl Header {
    pub const SIZE: usize = 32;

    pub fn new(op: u32, sock: u32, arg: i64, arg2: i64) -> Header {
        Header {
            op,
            sock,
            len: 0,
            arg,
            arg2,
        }
    }

    fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&self.op.to_le_bytes());
        b[4..8].copy_from_slice(&self.sock.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.arg.to_le_bytes());
        b[24..32].copy_from_slice(&self.arg2.to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::SIZE]) -> Header {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let i64_at = |i: usize| i64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Header {
            op: u32_at(0),
            sock: u32_at(4),
            len: u32_at(8),
            arg: i64_at(16),
            arg2: i64_at(24),
        }
    }
}

/// Sends a header and its payload (one `writev`-like write of both when small).
pub fn send(w: &mut impl Write, mut h: Header, payload: &[u8]) -> io::Result<()> {
    h.len = u32::try_from(payload.len()).map_err(|_| invalid("payload too large"))?;
    w.write_all(&h.encode())?;
    if !payload.is_empty() {
        w.write_all(payload)?;
    }
    Ok(())
}

/// Receives a header; its payload (if any) is read into `payload` (resized to fit).
pub fn recv(r: &mut impl Read, payload: &mut Vec<u8>) -> io::Result<Header> {
    let mut b = [0u8; Header::SIZE];
    r.read_exact(&mut b)?;
    let h = Header::decode(&b);
    if h.len > MAX_PAYLOAD {
        return Err(invalid("payload too large"));
    }
    payload.resize(h.len as usize, 0);
    r.read_exact(payload)?;
    Ok(h)
}

/// Reads one header, leaving its payload unread.
pub fn read_header(r: &mut impl Read) -> io::Result<Header> {
    let mut b = [0u8; Header::SIZE];
    r.read_exact(&mut b)?;
    let h = Header::decode(&b);
    if h.len > MAX_PAYLOAD {
        return Err(invalid("payload too large"));
    }
    Ok(h)
}

/// Receives a header whose payload goes straight into `dst` (at most `dst.len()`).
pub fn recv_into(r: &mut impl Read, dst: &mut [u8]) -> io::Result<Header> {
    let mut b = [0u8; Header::SIZE];
    r.read_exact(&mut b)?;
    let h = Header::decode(&b);
    if h.len as usize > dst.len() {
        return Err(invalid("payload larger than the caller's buffer"));
    }
    r.read_exact(&mut dst[..h.len as usize])?;
    Ok(h)
}

pub fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A result word: a count, or a negative errno.
pub fn result(r: io::Result<i64>) -> i64 {
    match r {
        Ok(v) => v,
        Err(e) => {
            -(e.raw_os_error().unwrap_or(match e.kind() {
                io::ErrorKind::WouldBlock => libc::EAGAIN,
                io::ErrorKind::TimedOut => libc::ETIMEDOUT,
                io::ErrorKind::ConnectionReset => libc::ECONNRESET,
                io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
                io::ErrorKind::BrokenPipe => libc::EPIPE,
                io::ErrorKind::InvalidInput => libc::EINVAL,
                _ => libc::EIO,
            }) as i64)
        }
    }
}

/// The inverse of [`result`].
pub fn to_io(v: i64) -> io::Result<i64> {
    if v < 0 {
        Err(io::Error::from_raw_os_error((-v) as i32))
    } else {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_payload_round_trip() {
        let mut buf = Vec::new();
        let h = Header::new(WRITE, 7, 65536, -3);
        send(&mut buf, h, b"hello").unwrap();
        let mut payload = Vec::new();
        let got = recv(&mut &buf[..], &mut payload).unwrap();
        assert_eq!(got, Header { len: 5, ..h });
        assert_eq!(payload, b"hello");
    }

    #[test]
    fn oversized_payloads_are_refused() {
        let mut b = Header::new(DATA, 0, 0, 0).encode();
        b[8..12].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        let mut payload = Vec::new();
        assert!(recv(&mut &b[..], &mut payload).is_err());
        let mut small = [0u8; 4];
        let mut b2 = Header::new(DATA, 0, 0, 0).encode().to_vec();
        b2[8..12].copy_from_slice(&5u32.to_le_bytes());
        b2.extend_from_slice(b"12345");
        assert!(recv_into(&mut &b2[..], &mut small).is_err());
    }

    #[test]
    fn errors_travel_as_negative_errno() {
        let e = to_io(result(Err(io::Error::from_raw_os_error(libc::ECONNRESET))));
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::ECONNRESET));
        assert_eq!(to_io(result(Ok(42))).unwrap(), 42);
    }
}
