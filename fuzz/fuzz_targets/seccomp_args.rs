//! What a supervised program's memory holds when usnet-seccomp reads a call's
//! arguments (`usnet_seccomp::args`): arbitrary msghdr, iovec, sockaddr and
//! control bytes, and an arbitrary datagram (with control messages) written back.
//! The supervisor must not panic, must write only where the call said it may
//! (the iovecs, the name, the msghdr's result fields, the control buffer), and
//! the control messages it writes must read back as what it was given.
#![no_main]

use std::cell::RefCell;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use usnet_posix::DgramMsg;
use usnet_seccomp::args::{self, Mem, MsgAt};

/// The program's memory: `bytes` at address BASE (small, so pointers the fuzzer
/// makes land in it). Every write is recorded.
struct Image {
    bytes: RefCell<Vec<u8>>,
    writes: RefCell<Vec<(u64, usize)>>,
}
const BASE: u64 = 0x100;

impl Mem for Image {
    fn read(&self, at: u64, len: usize) -> Result<Vec<u8>, i32> {
        let b = self.bytes.borrow();
        let o = at.checked_sub(BASE).ok_or(libc::EFAULT)? as usize;
        let end = o.checked_add(len).ok_or(libc::EFAULT)?;
        b.get(o..end).map(<[u8]>::to_vec).ok_or(libc::EFAULT)
    }
    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), i32> {
        let mut b = self.bytes.borrow_mut();
        let o = at.checked_sub(BASE).ok_or(libc::EFAULT)? as usize;
        let end = o.checked_add(bytes.len()).ok_or(libc::EFAULT)?;
        b.get_mut(o..end)
            .ok_or(libc::EFAULT)?
            .copy_from_slice(bytes);
        self.writes.borrow_mut().push((at, bytes.len()));
        Ok(())
    }
}

#[derive(Debug, Arbitrary)]
enum Op {
    RecvMsg {
        at: u16,
        mmsg: bool,
    },
    RecvFrom {
        buf: u16,
        len: u16,
        name: u16,
        lenp: u16,
    },
    SendMsg {
        at: u16,
    },
    Sockaddr {
        at: u16,
        len: u8,
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    image: Vec<u8>,
    op: Op,
    len: u16,
    whole: u16,
    v6: bool,
    port: u16,
    flags: i32,
    control: Vec<(i32, i32, Vec<u8>)>,
}

fn addr(v: u16) -> u64 {
    u64::from(v)
}

fuzz_target!(|inp: Input| {
    if inp.image.len() > 16384 || inp.control.len() > 16 {
        return;
    }
    let img = Image {
        bytes: RefCell::new(inp.image.clone()),
        writes: RefCell::new(Vec::new()),
    };
    let payload: Vec<u8> = (0..inp.len).map(|i| i as u8).collect();
    let from = if inp.v6 {
        SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, inp.port, 0, 0))
    } else {
        SocketAddr::V4(SocketAddrV4::new([10, 0, 0, 1].into(), inp.port))
    };
    let d = DgramMsg {
        len: payload.len(),
        whole: usize::from(inp.whole).max(payload.len()),
        from,
        control: inp
            .control
            .iter()
            .map(|(l, t, v)| (*l, *t, v.iter().copied().take(64).collect()))
            .collect(),
    };
    let (m, mmsg) = match inp.op {
        Op::Sockaddr { at, len } => {
            let _ = args::sockaddr(&img, addr(at), u64::from(len));
            if let Ok(None) = args::connect_addr(&img, addr(at), u64::from(len)) {
                assert!(len >= 2, "AF_UNSPEC needs a family's two bytes");
            }
            assert!(
                img.writes.borrow().is_empty(),
                "reading an address writes nothing"
            );
            return;
        }
        Op::SendMsg { at } => {
            if let Ok(m) = args::msghdr(&img, addr(at)) {
                if let Ok(data) = args::gather(&img, &m) {
                    assert!(data.len() <= m.total().min(args::MAX_DGRAM + 1));
                }
                let _ = args::send_control(&img, &m);
                if m.name != 0 {
                    let _ = args::sockaddr(&img, m.name, m.namelen);
                }
            }
            assert!(img.writes.borrow().is_empty(), "a send writes nothing");
            return;
        }
        Op::RecvMsg { at, mmsg } => match args::msghdr(&img, addr(at)) {
            Ok(m) => (m, mmsg),
            Err(_) => return,
        },
        Op::RecvFrom {
            buf,
            len,
            name,
            lenp,
        } => (
            MsgAt::one(addr(buf), u64::from(len), addr(name), addr(lenp)),
            false,
        ),
    };
    // Where the call may write: decided before anything is written (the program may
    // point an iovec at its own msghdr).
    let mut may: Vec<(u64, u64)> = m
        .iov
        .iter()
        .map(|&(p, l)| (p, p.saturating_add(l as u64)))
        .collect();
    match m.msg {
        Some(h) => {
            may.push((m.name, m.name.saturating_add(m.namelen)));
            may.push((h + 8, h + 12));
            may.push((h + 40, h + 52));
            may.push((m.control, m.control.saturating_add(m.controllen)));
            if mmsg {
                may.push((h + 56, h + 60));
            }
        }
        None => {
            may.push((m.name, m.name.saturating_add(128)));
            may.push((m.namelen, m.namelen + 4));
        }
    }
    let buf = &payload[..payload.len().min(m.total().min(args::MAX_DGRAM))];
    let d = DgramMsg {
        len: buf.len(),
        ..d
    };
    let got = args::deliver(&img, &m, buf, &d, inp.flags, mmsg);
    for &(at, n) in img.writes.borrow().iter() {
        let end = at + n as u64;
        assert!(
            may.iter().any(|&(lo, hi)| lo <= at && end <= hi),
            "a write at {at:#x}+{n} outside {may:x?}"
        );
    }
    let Ok(ret) = got else { return };
    if mmsg {
        assert_eq!(ret, 1);
    } else if inp.flags & libc::MSG_TRUNC != 0 {
        assert_eq!(ret, d.whole as i64);
    } else {
        assert_eq!(ret, d.len as i64);
    }
    // The control messages written read back as a prefix of those given (unless
    // the program pointed its control buffer at the msghdr's result fields, which
    // are written after it).
    if let Some(h) = m.msg {
        let used = u64::from_ne_bytes(img.read(h + 40, 8).unwrap().try_into().unwrap()) as usize;
        let ctl_end = m.control.saturating_add(used as u64);
        if used > 0 && (ctl_end <= h + 40 || m.control >= h + 60) {
            let mut cbuf = img.read(m.control, used).unwrap();
            // SAFETY: plain data; msg_control points at `cbuf` of msg_controllen bytes.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_control = cbuf.as_mut_ptr().cast();
            hdr.msg_controllen = used as _;
            // SAFETY: as above.
            let back = unsafe { usnet_posix::cmsg::each(&hdr) };
            assert!(back.len() <= d.control.len());
            assert_eq!(&back[..], &d.control[..back.len()]);
        }
    }
});
