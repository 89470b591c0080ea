//! A hostile client, for tests and the soak bench (`usnet bench soak`): attaches to a
//! stack server by hand, as any program may, and scribbles on its own session:
//! random bytes and words anywhere (header, ring indices, requests, slot words, data
//! area), bytes pushed into send rings without a room check, and random requests
//! aimed at given addresses. The server must survive it, keep serving the others,
//! and may cut it off.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::*;
use std::time::Duration;

use usnet_session::{ServerPage, Session};
use usnet_session_abi::{hdr, op, Request, SockAddr, BELL_EVENTFD};

/// One attached hostile session.
pub struct Hostile {
    /// The control connection: the session's life (the server hangs it up when it
    /// cuts the session off).
    ctl: UnixStream,
    mem: Session,
    page: ServerPage,
    efd: Option<OwnedFd>,
    /// The server's number for the session.
    pub session: u32,
    rng: u64,
}

impl Hostile {
    /// Attaches to the stack server `name` (in `USNET_RUN_DIR`) asking for
    /// `max_sockets` slots of `ring_bytes` per ring (the server caps both); `seed`
    /// seeds the scribbling.
    pub fn attach(name: &str, max_sockets: u64, ring_bytes: u64, seed: u64) -> io::Result<Hostile> {
        let ctl = UnixStream::connect(usnet_session::ctl::socket_path(name))?;
        ctl.set_read_timeout(Some(Duration::from_secs(10)))?;
        let req = format!(
            "{{\"cmd\":\"attach\",\"pid\":{},\"command\":\"hostile\",\"max_sockets\":{max_sockets},\"ring_bytes\":{ring_bytes}}}\n",
            std::process::id()
        );
        (&ctl).write_all(req.as_bytes())?;
        let mut buf = vec![0u8; 4096];
        let (n, fds) = usnet_shm::fdpass::recv_with_fds(&ctl, &mut buf)?;
        let line = String::from_utf8_lossy(&buf[..n]);
        let reply: usnet_session::ctl::msg::AttachReply =
            usnet_session::ctl::parse_answer(line.lines().next().unwrap_or(""))
                .map_err(io::Error::other)?;
        let mut fds = fds.into_iter();
        let missing = || io::Error::other("the attach answer carried no memory");
        let mem = Session::attach(fds.next().ok_or_else(missing)?)?;
        let page = ServerPage::attach(fds.next().ok_or_else(missing)?)?;
        Ok(Hostile {
            ctl,
            mem,
            page,
            efd: fds.next(),
            session: reply.session,
            rng: 0x9e37_79b9_7f4a_7c15 ^ seed,
        })
    }

    fn rnd(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn submit(&self, req: &Request) {
        let head = self.mem.word(hdr::SQ_HEAD).load(Relaxed);
        self.mem.write_request(head, req);
        self.mem
            .word(hdr::SQ_HEAD)
            .store(head.wrapping_add(1), Release);
    }

    /// `ops` random scribbles and requests (binds and connects go to `targets`),
    /// then rings the server.
    pub fn scribble(&mut self, ops: usize, targets: &[SocketAddr]) {
        let total = self.mem.layout().total_len;
        let data_off = self.mem.layout().data_off;
        let r = self.mem.region().clone();
        let g = self.mem.geometry();
        for _ in 0..ops {
            match self.rnd() % 12 {
                0 | 1 => {
                    let off = self.rnd() as usize % total;
                    let len = (self.rnd() % 256) as usize;
                    let bytes: Vec<u8> = (0..len.min(total - off))
                        .map(|_| self.rnd() as u8)
                        .collect();
                    let _ = r.write(off, &bytes);
                }
                2 => {
                    // Indices and counters live in the first pages and the slots.
                    let off = (self.rnd() as usize % (data_off / 8)) * 8;
                    r.u64(off).store(self.rnd(), Relaxed);
                }
                3 => {
                    let off = (self.rnd() as usize % (data_off / 4)) * 4;
                    r.u32(off).store(self.rnd() as u32, Relaxed);
                }
                4 => {
                    // Take the completions (so the server keeps serving us).
                    let head = self.mem.word(hdr::CQ_HEAD).load(Acquire);
                    self.mem.word(hdr::CQ_TAIL).store(head, Release);
                }
                5 => {
                    // Bytes into a send ring, no room check, and a kick.
                    let i = (self.rnd() % g.max_sockets as u64) as u32;
                    let at = self.mem.tx_ring(i);
                    let prod = r.u64(at.prod).load(Relaxed);
                    let len = (self.rnd() % 3000) as usize;
                    let off = at.data + (prod as usize & (at.size - 1));
                    let len = len.min(at.data + at.size - off);
                    let bytes: Vec<u8> = (0..len).map(|_| self.rnd() as u8).collect();
                    let _ = r.write(off, &bytes);
                    r.u64(at.prod).store(prod.wrapping_add(len as u64), Release);
                    self.submit(&Request {
                        op: op::TX_KICK,
                        slot: i,
                        ..Default::default()
                    });
                }
                6 => {
                    // Read everything a receive ring holds, and kick.
                    let i = (self.rnd() % g.max_sockets as u64) as u32;
                    let at = self.mem.rx_ring(i);
                    let prod = r.u64(at.prod).load(Acquire);
                    r.u64(at.cons).store(prod, Release);
                    self.submit(&Request {
                        op: op::RX_KICK,
                        slot: i,
                        ..Default::default()
                    });
                }
                _ => {
                    // Requests: many sockets, binds and connects to the targets,
                    // listens with huge backlogs, anything on any slot.
                    let o = (self.rnd() % (op::MAX as u64 + 2)) as u16;
                    let to = if targets.is_empty() {
                        SocketAddr::from(([127, 0, 0, 1], 7))
                    } else {
                        targets[self.rnd() as usize % targets.len()]
                    };
                    let a = SockAddr::from_std(to).to_args();
                    let args = match o {
                        op::SOCKET => [1 + self.rnd() % 2, 0, 0, 0, 0, 0],
                        op::BIND | op::CONNECT => [a[0], a[1], a[2], a[3], 0, 0],
                        op::LISTEN => [self.rnd() % 100_000, 0, 0, 0, 0, 0],
                        _ => [
                            self.rnd(),
                            self.rnd(),
                            self.rnd(),
                            self.rnd(),
                            self.rnd(),
                            self.rnd(),
                        ],
                    };
                    let req = Request {
                        op: o,
                        flags: self.rnd() as u16,
                        slot: (self.rnd() % (g.max_sockets as u64 + 4)) as u32,
                        tag: self.rnd(),
                        args,
                    };
                    self.submit(&req);
                }
            }
        }
        self.ring();
    }

    /// Rings the server's bell.
    pub fn ring(&self) {
        if self.page.bell_kind() == BELL_EVENTFD {
            if let Some(efd) = &self.efd {
                let one = 1u64.to_ne_bytes();
                // SAFETY: 8 bytes from a live buffer to an eventfd we own.
                let _ = unsafe { libc::write(efd.as_raw_fd(), one.as_ptr().cast(), 8) };
                return;
            }
        }
        self.page.bell().ring();
    }

    /// The whole session memory as it is now, into `out`.
    pub fn snapshot(&self, out: &mut Vec<u8>) {
        out.resize(self.mem.layout().total_len, 0);
        let _ = self.mem.region().read(0, out);
    }

    /// Whether the server hung up the control connection (cut the session off).
    pub fn cut_off(&self) -> bool {
        usnet_shm::poll_fds(&[self.ctl.as_fd()], Duration::ZERO).is_ok_and(|r| r.any())
    }
}
