//! The structures a supervised call points at in the program's memory (sockaddr,
//! iovec, msghdr and its control messages), read as the kernel reads them, and the
//! results written back as the kernel writes them. Everything here is untrusted
//! input from the program; it goes through [`Mem`], so the fuzz target
//! `seccomp_args` drives the same code over a byte image.

use std::net::SocketAddr;

use usnet_posix as posix;

/// The program's memory as seen from the supervisor. Errors are errno values
/// (`EFAULT` for an address that is not the program's).
pub trait Mem {
    fn read(&self, at: u64, len: usize) -> Result<Vec<u8>, i32>;
    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), i32>;
}

/// The memory of the thread that made the call (process_vm_readv/writev).
pub struct Thread(pub i32);

impl Mem for Thread {
    fn read(&self, at: u64, len: usize) -> Result<Vec<u8>, i32> {
        crate::notify::read_mem(self.0, at, len).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), i32> {
        crate::notify::write_mem(self.0, at, bytes)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// Linux's UIO_MAXIOV: more iovecs than this is EINVAL (readv/writev) or
/// EMSGSIZE (sendmsg/recvmsg).
pub const MAX_IOV: u64 = 1024;
/// The largest datagram: a send gathers at most one byte more than this (so an
/// oversized one still fails with EMSGSIZE), a receive takes at most this.
pub const MAX_DGRAM: usize = 65536;
/// The most control data a call's msg_control is read or written with (Linux's
/// optmem_max is 20 KiB; usnet's messages are a few dozen bytes).
pub const MAX_CONTROL: usize = 4096;

// struct msghdr on 64-bit Linux.
const MSG_NAME: u64 = 0;
const MSG_NAMELEN: u64 = 8;
const MSG_IOV: u64 = 16;
const MSG_IOVLEN: u64 = 24;
const MSG_CONTROL: u64 = 32;
const MSG_CONTROLLEN: u64 = 40;
const MSG_FLAGS: u64 = 48;
pub const MSGHDR: u64 = 56;
/// struct mmsghdr: a msghdr and the length the call fills in.
pub const MMSGHDR: u64 = 64;

fn u64_at(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], off: u64) -> u32 {
    let o = off as usize;
    u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Where a data call's bytes, address and control messages are, in the program.
#[derive(Clone, Debug, Default)]
pub struct MsgAt {
    pub iov: Vec<(u64, usize)>,
    /// A sockaddr's address; with `msg` it holds `namelen` bytes, without it
    /// (recvfrom) `namelen` is the address of its socklen_t.
    pub name: u64,
    pub namelen: u64,
    pub control: u64,
    pub controllen: u64,
    /// recvmsg: the msghdr, whose msg_namelen, msg_controllen and msg_flags are
    /// written back.
    pub msg: Option<u64>,
}

impl MsgAt {
    /// One buffer (read, write, recv, send, recvfrom, sendto).
    pub fn one(at: u64, len: u64, name: u64, namelen: u64) -> MsgAt {
        MsgAt {
            iov: vec![(at, len as usize)],
            name,
            namelen,
            ..MsgAt::default()
        }
    }

    /// The bytes the iovecs hold together, saturating (the kernel caps a call at
    /// MAX_RW_COUNT in the same way).
    pub fn total(&self) -> usize {
        self.iov.iter().fold(0usize, |t, x| t.saturating_add(x.1))
    }
}

/// `count` iovecs at `at`, as the kernel's import_iovec: a length that is
/// negative as an ssize_t is EINVAL.
pub fn iovecs(mem: &dyn Mem, at: u64, count: u64) -> Result<Vec<(u64, usize)>, i32> {
    if count > MAX_IOV {
        return Err(libc::EINVAL);
    }
    let b = mem.read(at, count as usize * 16)?;
    b.chunks(16)
        .map(|c| {
            let len = u64_at(c, 8);
            if len > isize::MAX as u64 {
                Err(libc::EINVAL)
            } else {
                Ok((u64_at(c, 0), len as usize))
            }
        })
        .collect()
}

/// The msghdr at `at` (sendmsg, recvmsg, and each entry of the mmsg calls).
pub fn msghdr(mem: &dyn Mem, at: u64) -> Result<MsgAt, i32> {
    let b = mem.read(at, MSGHDR as usize)?;
    let iovlen = u64_at(&b, MSG_IOVLEN);
    if iovlen > MAX_IOV {
        return Err(libc::EMSGSIZE);
    }
    Ok(MsgAt {
        iov: iovecs(mem, u64_at(&b, MSG_IOV), iovlen)?,
        name: u64_at(&b, MSG_NAME),
        namelen: u64::from(u32_at(&b, MSG_NAMELEN)),
        control: u64_at(&b, MSG_CONTROL),
        controllen: u64_at(&b, MSG_CONTROLLEN),
        msg: Some(at),
    })
}

/// The sockaddr of `len` bytes at `ptr`.
pub fn sockaddr(mem: &dyn Mem, ptr: u64, len: u64) -> Result<SocketAddr, i32> {
    if len > 128 {
        return Err(libc::EINVAL);
    }
    let b = mem.read(ptr, len as usize)?;
    // SAFETY: `b` holds `len` bytes.
    unsafe { posix::addr::from_raw(b.as_ptr().cast(), len as libc::socklen_t) }.map_err(|e| e.0)
}

/// A connect's address: `None` for `AF_UNSPEC` (dissolve the association).
pub fn connect_addr(mem: &dyn Mem, ptr: u64, len: u64) -> Result<Option<SocketAddr>, i32> {
    if (2..=128).contains(&len) {
        let b = mem.read(ptr, 2)?;
        if u16::from_ne_bytes([b[0], b[1]]) == libc::AF_UNSPEC as u16 {
            return Ok(None);
        }
    }
    sockaddr(mem, ptr, len).map(Some)
}

/// The socklen_t at `at` (an address's or an option value's room).
pub fn socklen(mem: &dyn Mem, at: u64) -> Result<u32, i32> {
    Ok(u32_at(&mem.read(at, 4)?, 0))
}

/// Writes `addr` to a (sockaddr *, socklen_t *) pair, as the kernel's
/// move_addr_to_user: truncated to the room the program gave, the whole length
/// reported. Nothing is written when either pointer is null.
pub fn put_addr(mem: &dyn Mem, ptr: u64, lenp: u64, addr: SocketAddr) -> Result<(), i32> {
    if ptr == 0 || lenp == 0 {
        return Ok(());
    }
    let room = socklen(mem, lenp)? as usize;
    if room > i32::MAX as usize {
        return Err(libc::EINVAL);
    }
    let bytes = posix::addr::to_bytes(addr);
    mem.write(ptr, &bytes[..room.min(bytes.len())])?;
    mem.write(lenp, &(bytes.len() as u32).to_ne_bytes())
}

/// A send's payload: the iovecs' bytes in order, at most `MAX_DGRAM + 1`.
pub fn gather(mem: &dyn Mem, m: &MsgAt) -> Result<Vec<u8>, i32> {
    let mut data = Vec::new();
    for &(p, l) in &m.iov {
        let want = l.min(MAX_DGRAM + 1 - data.len());
        if want == 0 {
            break;
        }
        data.extend_from_slice(&mem.read(p, want)?);
    }
    Ok(data)
}

/// What a send's control messages ask of the datagram (`IP_PKTINFO`, `IP_TTL`,
/// ...), read as usnet-posix reads a program's own (`cmsg::send_control`).
pub fn send_control(mem: &dyn Mem, m: &MsgAt) -> Result<posix::cmsg::SendControl, i32> {
    if m.controllen == 0 {
        return Ok(Default::default());
    }
    if m.controllen > MAX_CONTROL as u64 {
        return Err(libc::ENOBUFS);
    }
    let mut buf = mem.read(m.control, m.controllen as usize)?;
    // SAFETY: plain data; the fields set below make a valid header over `buf`.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_control = buf.as_mut_ptr().cast();
    h.msg_controllen = buf.len() as _;
    // SAFETY: msg_control has msg_controllen readable bytes.
    unsafe { posix::cmsg::send_control(&h) }.map_err(|e| e.0)
}

/// Writes a received datagram (`d`, its first bytes in `buf`) where `m` says,
/// as the kernel's recvmsg does: the payload across the iovecs, the sender's
/// address, and for a msghdr its msg_namelen, the control messages (cut off with
/// MSG_CTRUNC when they do not fit), msg_controllen and msg_flags; for an mmsghdr
/// (`mmsg`) its msg_len too. Returns what the call returns.
pub fn deliver(
    mem: &dyn Mem,
    m: &MsgAt,
    buf: &[u8],
    d: &posix::DgramMsg,
    flags: i32,
    mmsg: bool,
) -> Result<i64, i32> {
    let len = d.len.min(buf.len());
    let mut at = 0;
    for &(p, l) in &m.iov {
        let n = l.min(len - at);
        if n == 0 {
            break;
        }
        mem.write(p, &buf[at..at + n])?;
        at += n;
    }
    let ret = if flags & libc::MSG_TRUNC != 0 {
        d.whole as i64
    } else {
        at as i64
    };
    let Some(msg) = m.msg else {
        // recvfrom's (addr, addrlen *), or no address at all.
        put_addr(mem, m.name, m.namelen, d.from)?;
        return Ok(ret);
    };
    let name = posix::addr::to_bytes(d.from);
    if m.name != 0 {
        mem.write(m.name, &name[..(m.namelen as usize).min(name.len())])?;
    }
    mem.write(msg + MSG_NAMELEN, &(name.len() as u32).to_ne_bytes())?;
    let mut out_flags = if d.whole > at { libc::MSG_TRUNC } else { 0 };
    let mut room = if m.control == 0 {
        0
    } else {
        (m.controllen as usize).min(MAX_CONTROL)
    };
    if !d.control.is_empty() && room > 0 {
        let mut cbuf = vec![0u8; room];
        // SAFETY: plain data; msg_control points at `cbuf` of msg_controllen bytes.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_control = cbuf.as_mut_ptr().cast();
        h.msg_controllen = room as _;
        let cm: Vec<(i32, i32, &[u8])> =
            d.control.iter().map(|(l, t, v)| (*l, *t, &v[..])).collect();
        // SAFETY: as above, msg_controllen writable bytes.
        unsafe { posix::cmsg::put(&mut h, &cm) }.map_err(|e| e.0)?;
        room = h.msg_controllen as usize;
        out_flags |= h.msg_flags;
        mem.write(m.control, &cbuf[..room])?;
    } else {
        if !d.control.is_empty() {
            out_flags |= libc::MSG_CTRUNC;
        }
        room = 0;
    }
    mem.write(msg + MSG_CONTROLLEN, &(room as u64).to_ne_bytes())?;
    mem.write(msg + MSG_FLAGS, &out_flags.to_ne_bytes())?;
    if mmsg {
        mem.write(msg + MSGHDR, &(at as u32).to_ne_bytes())?;
        return Ok(1);
    }
    Ok(ret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A program's memory: `bytes` from address `BASE`.
    struct Image(RefCell<Vec<u8>>);
    const BASE: u64 = 0x1000;

    impl Mem for Image {
        fn read(&self, at: u64, len: usize) -> Result<Vec<u8>, i32> {
            let b = self.0.borrow();
            let o = at.checked_sub(BASE).ok_or(libc::EFAULT)? as usize;
            b.get(o..o.checked_add(len).ok_or(libc::EFAULT)?)
                .map(<[u8]>::to_vec)
                .ok_or(libc::EFAULT)
        }
        fn write(&self, at: u64, bytes: &[u8]) -> Result<(), i32> {
            let mut b = self.0.borrow_mut();
            let o = at.checked_sub(BASE).ok_or(libc::EFAULT)? as usize;
            b.get_mut(o..o + bytes.len())
                .ok_or(libc::EFAULT)?
                .copy_from_slice(bytes);
            Ok(())
        }
    }

    fn put(img: &Image, at: u64, v: &[u8]) {
        img.write(at, v).unwrap();
    }

    #[test]
    fn a_received_datagram_fills_the_msghdr_as_the_kernel_does() {
        let img = Image(RefCell::new(vec![0u8; 1024]));
        let (hdr, iov, b1, b2, name, ctl) = (
            BASE,
            BASE + 64,
            BASE + 128,
            BASE + 160,
            BASE + 192,
            BASE + 256,
        );
        // Two iovecs of 4 and 8 bytes; room for a sockaddr_in; 64 bytes of control.
        put(&img, iov, &b1.to_ne_bytes());
        put(&img, iov + 8, &4u64.to_ne_bytes());
        put(&img, iov + 16, &b2.to_ne_bytes());
        put(&img, iov + 24, &8u64.to_ne_bytes());
        put(&img, hdr + MSG_NAME, &name.to_ne_bytes());
        put(&img, hdr + MSG_NAMELEN, &16u32.to_ne_bytes());
        put(&img, hdr + MSG_IOV, &iov.to_ne_bytes());
        put(&img, hdr + MSG_IOVLEN, &2u64.to_ne_bytes());
        put(&img, hdr + MSG_CONTROL, &ctl.to_ne_bytes());
        put(&img, hdr + MSG_CONTROLLEN, &64u64.to_ne_bytes());
        let m = msghdr(&img, hdr).unwrap();
        assert_eq!(m.total(), 12);
        let d = posix::DgramMsg {
            len: 12,
            whole: 20,
            from: "10.1.2.3:53".parse().unwrap(),
            control: vec![(libc::IPPROTO_IP, libc::IP_TTL, 64i32.to_ne_bytes().to_vec())],
        };
        let payload: Vec<u8> = (0..20).collect();
        assert_eq!(deliver(&img, &m, &payload, &d, 0, false), Ok(12));
        assert_eq!(img.read(b1, 4).unwrap(), &payload[..4]);
        assert_eq!(img.read(b2, 8).unwrap(), &payload[4..12]);
        let sin = img.read(name, 16).unwrap();
        assert_eq!(&sin[2..8], &[0, 53, 10, 1, 2, 3]);
        let flags = i32::from_ne_bytes(img.read(hdr + MSG_FLAGS, 4).unwrap().try_into().unwrap());
        assert_eq!(flags, libc::MSG_TRUNC);
        let used = u64_at(&img.read(hdr + MSG_CONTROLLEN, 8).unwrap(), 0);
        assert_eq!(
            used, 24,
            "one int message: CMSG_SPACE(4), as put_cmsg counts it"
        );
        let c = img.read(ctl, 20).unwrap();
        assert_eq!(u64_at(&c, 0), 20);
        assert_eq!(&c[8..12], &libc::IPPROTO_IP.to_ne_bytes());
        assert_eq!(&c[12..16], &libc::IP_TTL.to_ne_bytes());
        assert_eq!(&c[16..20], &64i32.to_ne_bytes());
        // MSG_TRUNC asks for the whole length.
        assert_eq!(
            deliver(&img, &m, &payload, &d, libc::MSG_TRUNC, false),
            Ok(20)
        );
        // Too little control room: cut off, flagged.
        put(&img, hdr + MSG_CONTROLLEN, &8u64.to_ne_bytes());
        let m = msghdr(&img, hdr).unwrap();
        assert_eq!(deliver(&img, &m, &payload, &d, 0, false), Ok(12));
        let flags = i32::from_ne_bytes(img.read(hdr + MSG_FLAGS, 4).unwrap().try_into().unwrap());
        assert_eq!(flags, libc::MSG_TRUNC | libc::MSG_CTRUNC);
        assert_eq!(u64_at(&img.read(hdr + MSG_CONTROLLEN, 8).unwrap(), 0), 0);
    }

    #[test]
    fn iovec_lengths_the_kernel_refuses_are_refused() {
        let img = Image(RefCell::new(vec![0u8; 256]));
        put(&img, BASE, &BASE.to_ne_bytes());
        put(&img, BASE + 8, &u64::MAX.to_ne_bytes());
        assert_eq!(iovecs(&img, BASE, 1), Err(libc::EINVAL));
        assert_eq!(iovecs(&img, BASE, MAX_IOV + 1), Err(libc::EINVAL));
        // Two huge ones add up without overflowing.
        let half = (isize::MAX as u64).to_ne_bytes();
        put(&img, BASE + 8, &half);
        put(&img, BASE + 16, &BASE.to_ne_bytes());
        put(&img, BASE + 24, &half);
        let m = MsgAt {
            iov: iovecs(&img, BASE, 2).unwrap(),
            ..MsgAt::default()
        };
        assert_eq!(m.total(), usize::MAX - 1);
        let three = MsgAt {
            iov: vec![(BASE, isize::MAX as usize); 3],
            ..MsgAt::default()
        };
        assert_eq!(three.total(), usize::MAX, "saturates");
        // A gather stops one byte past the largest datagram (or at the image's end).
        assert_eq!(gather(&img, &m), Err(libc::EFAULT));
        assert_eq!(sockaddr(&img, BASE, 129), Err(libc::EINVAL));
    }

    #[test]
    fn a_connect_to_af_unspec_is_a_disconnect() {
        let img = Image(RefCell::new(vec![0u8; 64]));
        assert_eq!(connect_addr(&img, BASE, 16), Ok(None));
        assert_eq!(connect_addr(&img, BASE, 2), Ok(None));
        // Too short to hold a family: EINVAL, as Linux's inet_dgram_connect.
        assert_eq!(connect_addr(&img, BASE, 1), Err(libc::EINVAL));
        let sin = posix::addr::to_bytes("10.0.0.7:99".parse().unwrap());
        put(&img, BASE, &sin);
        assert_eq!(
            connect_addr(&img, BASE, sin.len() as u64),
            Ok(Some("10.0.0.7:99".parse().unwrap()))
        );
        assert_eq!(connect_addr(&img, BASE + 4096, 16), Err(libc::EFAULT));
    }
}
