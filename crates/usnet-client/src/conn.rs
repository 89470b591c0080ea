//! The client's half of a session: submitting requests, collecting completions,
//! waiting on the client bell, ringing the server, and noticing that the server died.

use std::collections::{HashMap, HashSet};
use std::io;

use crate::lockorder::{self, Rank};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use usnet_session::ctl::{self, msg, ControlError};
use usnet_session::{ServerPage, Session};
use usnet_session_abi::{errno, hdr, slot, Completion, Request, BELL_EVENTFD};
use usnet_shm::spsc::{Consumer, Producer};
use usnet_shm::FutexBell;

use crate::vtime;

/// How long one sleep lasts before the client looks at the server's liveness.
pub(crate) const LIVENESS_SLICE: Duration = Duration::from_millis(50);
/// The longest a blocked call on one socket sleeps between looks at the server's
/// liveness: its slices double from [`LIVENESS_SLICE`] while nothing happens. A
/// server that exits in order wakes every sleeper at once; only one killed outright
/// is noticed this late. Each look is a wake-up, and a process with a thread per
/// connection (a supervised Go program's relays, a JVM's blocking reads) has
/// thousands asleep at once: at 50 ms, 4,000 of them took a whole core doing nothing.
pub(crate) const LIVENESS_SLICE_MAX: Duration = Duration::from_secs(1);
/// Longest sleep on the bell, in slices, while kernel descriptors wait too and the
/// session has no eventfd (or time is virtual): the kernel side is looked at
/// between slices.
pub const MIX_SLICE: Duration = Duration::from_millis(1);
/// Longest single `poll(2)` of a mixed wait on the eventfd (the control connection
/// in the same poll says when the server dies; this bounds the rest).
const MIXED_SLEEP_MAX: Duration = Duration::from_secs(1);
/// How often a read or write that does not sleep looks at the control connection (a
/// system call): a server that died is noticed by the first call after this.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How often a holder that is not its stream's receiver asks for it again.
const WANT_EVERY: Duration = Duration::from_millis(2);

struct Submit {
    sq: Producer,
    next_tag: u64,
}

struct Completions {
    cq: Consumer,
    done: HashMap<u64, Completion>,
    /// Tags nobody waits for (a close from a destructor): dropped on arrival.
    discard: HashSet<u64>,
}

/// A live session with a stack server.
pub(crate) struct Conn {
    pub mem: Session,
    page: ServerPage,
    server_efd: Option<OwnedFd>,
    ctl: UnixStream,
    bell: FutexBell,
    /// The session's eventfd, which the server writes (besides bumping the bell)
    /// while a thread announced it waits in `poll(2)` with kernel descriptors
    /// ([`Conn::sleep_with_kernel`]). `None` from a server that sends none.
    efd: Option<usnet_shm::EventFd>,
    /// The threads asleep on `efd` (`crate::mixed`).
    mixed: crate::mixed::Sleepers,
    submit: Mutex<Submit>,
    comp: Mutex<Completions>,
    dead: AtomicBool,
    /// When [`Conn::check_alive`] last probed the control connection (ns since
    /// `epoch`).
    epoch: Instant,
    last_probe: AtomicU64,
    /// When each socket last asked for its stream ([`Conn::want_stream`]).
    wants: Mutex<HashMap<u32, u64>>,
    /// Each SO_ZEROCOPY socket's zero-copy sends, by slot (`crate::msgzc`).
    pub(crate) zc: Mutex<HashMap<u32, crate::msgzc::ZcSends>>,
    /// Some socket ever turned SO_ZEROCOPY on: without it, readiness checks
    /// (every registered socket on every `epoll_wait`) skip the lock above.
    pub(crate) zc_used: std::sync::atomic::AtomicBool,
    pub stack_name: String,
    /// The control socket (a zero-copy port is asked for there).
    pub path: PathBuf,
    /// Control connections survive `exec` ([`crate::AttachOptions::inheritable`]).
    inheritable: bool,
    /// The stack's network interface (from the attach reply).
    pub iface: Option<usnet_session::ctl::msg::Iface>,
    /// Whether the stack has an interface mirror (from the attach reply).
    mirror: bool,
    /// The mirror's helper process (0: none; from the attach reply).
    pub mirror_pid: u32,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn proto(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

/// The answer line `line` to `what`, or why not.
fn answer<R: serde::de::DeserializeOwned>(line: &str, what: &str) -> io::Result<R> {
    ctl::parse_answer(line).map_err(|e| match e {
        ControlError::Refused(m) => refused(&m),
        e => proto(&format!("{what} reply: {e}")),
    })
}

/// The server refused to attach us, for the reason it gave.
fn refused(why: &str) -> io::Error {
    let kind = if why.contains("permission denied") {
        io::ErrorKind::PermissionDenied
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, format!("attach refused: {why}"))
}

pub(crate) fn errno_err(e: i64) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The server is gone.
pub(crate) fn down() -> io::Error {
    errno_err(errno::ENETDOWN)
}

/// An attach request for this process with `opts`.
fn attach_request(opts: &crate::AttachOptions) -> msg::Attach {
    let command = std::env::args()
        .next()
        .and_then(|a| {
            Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "?".into());
    let mut req = msg::Attach {
        pid: std::process::id(),
        command,
        ring_bytes: opts.ring_bytes.map(|r| r as u64),
        max_sockets: opts.max_sockets.map(|m| m as u64),
        shard: opts.shard.map(|k| k as u64),
        claim: None,
    };
    if let Some(room) = address_space_room() {
        let (sockets, ring) = fitted(
            room / 2,
            req.max_sockets.unwrap_or(DEFAULT_SOCKETS),
            req.ring_bytes.unwrap_or(DEFAULT_RING_BYTES),
            opts.min_sockets.unwrap_or(1) as u64,
        );
        req.max_sockets = Some(sockets);
        req.ring_bytes = Some(ring);
    }
    req
}

/// What a client that asks for nothing gets (the server's `granted_geometry`).
const DEFAULT_SOCKETS: u64 = 1024;
const DEFAULT_RING_BYTES: u64 = 256 * 1024;

/// Bytes of address space a session of `sockets` with rings of `ring` bytes
/// takes (`u64::MAX`: no such session).
fn session_bytes(sockets: u64, ring: u64) -> u64 {
    let g = usnet_session_abi::Geometry {
        max_sockets: sockets.min(65536) as u32,
        ring_bytes: ring as u32,
        ..Default::default()
    };
    usnet_session_abi::Layout::new(g).map_or(u64::MAX, |l| l.total_len as u64)
}

/// Bytes of address space a fresh client's session takes.
pub fn default_session_bytes() -> u64 {
    session_bytes(DEFAULT_SOCKETS, DEFAULT_RING_BYTES)
}

/// This process's `resource` limit as the kernel holds it (`None`: unreadable),
/// asked with a raw `prlimit64`: past the shim's `getrlimit`, which answers what the
/// program set, without the room it adds for the session.
pub fn kernel_rlimit(resource: libc::__rlimit_resource_t) -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 on this process, reading into our own struct.
    let r = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            resource,
            std::ptr::null::<libc::rlimit>(),
            &mut lim as *mut libc::rlimit,
        )
    };
    (r == 0).then_some(lim)
}

/// Bytes of address space this process may still map under its `RLIMIT_AS`
/// (`None`: no limit).
fn address_space_room() -> Option<u64> {
    let lim = kernel_rlimit(libc::RLIMIT_AS)?;
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    // The first field of statm: the address space in use, in pages.
    let used = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * usnet_session_abi::PAGE as u64;
    Some(lim.rlim_cur.saturating_sub(used))
}

/// The sockets and ring size of a session that takes at most `budget` bytes of
/// address space, from the `sockets` and `ring` wanted: fewer sockets first (to
/// 64, or `floor` if more), then smaller rings (to 16 KiB). A program that caps
/// its address space (`ulimit -v`) gets a session that fits beside it rather
/// than none; past both floors it asks for the floors and the attach says why
/// it failed.
fn fitted(budget: u64, mut sockets: u64, mut ring: u64, floor: u64) -> (u64, u64) {
    let floor = floor.max(64).min(sockets);
    while session_bytes(sockets, ring) > budget {
        if sockets > floor {
            sockets = (sockets / 2).max(floor);
        } else if ring > 16 * 1024 {
            ring /= 2;
        } else {
            break;
        }
    }
    (sockets, ring)
}

impl Conn {
    /// Connects to the control socket at `path` and attaches a session.
    pub fn attach(path: &Path, name: &str, opts: &crate::AttachOptions) -> io::Result<Conn> {
        let ctl = crate::lineage::connect(path, name, opts.inheritable)?;
        ctl.set_read_timeout(Some(Duration::from_secs(10)))?;
        let req = ctl::Request::Attach(attach_request(opts));
        let line = ctl::request_line(&req);
        use std::io::{Read, Write};
        if let Err(e) = (&ctl).write_all(line.as_bytes()) {
            // The server refuses a peer it does not admit before reading its request,
            // and closes: its answer, already on the way, says why.
            let mut buf = [0u8; 512];
            if let Ok(n) = (&ctl).read(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]);
                let first = text.lines().next().unwrap_or("");
                if let Err(ControlError::Refused(m)) = ctl::parse_answer::<msg::Done>(first) {
                    return Err(refused(&m));
                }
            }
            return Err(e);
        }
        Self::attached(ctl, path, name, opts).map(|(c, _)| c)
    }

    /// In a forked child (`over`: the pin's channel) or a program after `exec`
    /// (`over`: the session connection it inherited): attaches a session of its
    /// own that holds the pinned sockets (a pin of the session's, made by the
    /// server), in one exchange: the request goes on `over` with a fresh channel,
    /// which becomes the session's connection.
    pub fn attach_claiming(
        over: &UnixStream,
        path: &Path,
        name: &str,
        opts: &crate::AttachOptions,
    ) -> io::Result<(Conn, Vec<crate::Claimed>)> {
        let req = ctl::Request::Attach(attach_request(opts));
        let kind = crate::lineage::Kind::Session;
        let ch = crate::lineage::request(over, &req, kind, name, opts.inheritable)?;
        Self::attached(ch, path, name, opts)
    }

    /// The attach reply on `ctl` (the session's connection from now on): maps the
    /// session's memory and makes the connection.
    fn attached(
        ctl: UnixStream,
        path: &Path,
        name: &str,
        opts: &crate::AttachOptions,
    ) -> io::Result<(Conn, Vec<crate::Claimed>)> {
        use std::io::Read;
        let mut buf = vec![0u8; 4096];
        let (mut n, fds) = usnet_shm::fdpass::recv_with_fds(&ctl, &mut buf)?;
        if n == 0 {
            return Err(proto("the stack closed the control connection"));
        }
        // A long reply (a claim's slot map) comes in more than one piece.
        while !buf[..n].contains(&b'\n') && n < 1 << 20 {
            if n == buf.len() {
                buf.resize(n * 2, 0);
            }
            let k = (&ctl).read(&mut buf[n..])?;
            if k == 0 {
                break;
            }
            n += k;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        let first = text.lines().next().unwrap_or("");
        let reply: msg::AttachReply = answer(first, "attach")?;
        let mut fds = fds.into_iter();
        let (Some(mem_fd), Some(page_fd)) = (fds.next(), fds.next()) else {
            return Err(proto("attach reply without its memory"));
        };
        use crate::lineage::park;
        let mem = Session::attach(park(mem_fd))?;
        let page = ServerPage::attach(park(page_fd))?;
        let server_efd = if page.bell_kind() == BELL_EVENTFD {
            Some(
                fds.next()
                    .map(park)
                    .ok_or_else(|| proto("attach reply without the server's eventfd"))?,
            )
        } else {
            None
        };
        // The session's own eventfd comes last.
        let efd = fds.next().map(|f| usnet_shm::EventFd::from_fd(park(f)));
        let region = mem.region().clone();
        let sq = Producer::attach(region.clone(), mem.sq()).map_err(|e| proto(&e.to_string()))?;
        let cq =
            Consumer::attach_discarding(region, mem.cq()).map_err(|e| proto(&e.to_string()))?;
        let slots = reply
            .slots
            .unwrap_or_default()
            .iter()
            .filter_map(|w| crate::Claimed::from_words(&w.map(Some)))
            .collect();
        ctl.set_nonblocking(true)?;
        let bell = mem.client_bell();
        let conn = Conn {
            mem,
            page,
            server_efd,
            ctl,
            bell,
            efd,
            submit: Mutex::new(Submit { sq, next_tag: 1 }),
            comp: Mutex::new(Completions {
                cq,
                done: HashMap::new(),
                discard: HashSet::new(),
            }),
            dead: AtomicBool::new(false),
            epoch: Instant::now(),
            last_probe: AtomicU64::new(0),
            wants: Mutex::new(HashMap::new()),
            zc: Mutex::new(HashMap::new()),
            mixed: Default::default(),
            zc_used: std::sync::atomic::AtomicBool::new(false),
            stack_name: name.to_string(),
            path: path.to_path_buf(),
            inheritable: opts.inheritable,
            iface: reply.iface,
            mirror: reply.mirror,
            mirror_pid: reply.mirror_pid,
        };
        Ok((conn, slots))
    }

    /// Pins every socket of this session for a child about to be forked (see
    /// `usnet_server::control`): asked on the session's own connection. The
    /// returned channel is the pin's life.
    pub fn pin(&self) -> io::Result<(UnixStream, String, u32)> {
        Self::ask_pin(
            &self.ctl,
            crate::lineage::Kind::Pin,
            &self.stack_name,
            self.inheritable,
        )
    }

    /// Pins the sockets of `slots` for a process they are passed to (see
    /// `usnet_server::control`): like [`Conn::pin`], for some sockets only.
    pub fn pin_slots(&self, slots: &[u32]) -> io::Result<(UnixStream, String, u32)> {
        let req = ctl::Request::Pin(msg::PinReq {
            slots: Some(slots.to_vec()),
        });
        Self::ask_as(
            &self.ctl,
            &req,
            crate::lineage::Kind::Pin,
            &self.stack_name,
            self.inheritable,
        )
    }

    /// Takes into this session the sockets of the pin `token` (a pin made for
    /// passing): what each one became.
    pub fn claim_pin(&self, token: &str) -> io::Result<Vec<usnet_session_abi::Claimed>> {
        use std::io::BufRead;
        let req = ctl::Request::Claim(msg::ClaimReq {
            token: token.into(),
        });
        let ch = self.ask_on_own_connection(&req)?;
        let mut reply = String::new();
        std::io::BufReader::new(&ch).read_line(&mut reply)?;
        let v: msg::ClaimReply = answer(&reply, "claim")?;
        Ok(v.slots
            .iter()
            .map(
                |&[parent_slot, slot, tag, role]| usnet_session_abi::Claimed {
                    parent_slot,
                    slot,
                    tag,
                    role,
                },
            )
            .collect())
    }

    /// Sends `req` on the session's connection with a fresh channel, on which the
    /// answer comes (not inherited: it lives for this one exchange).
    fn ask_on_own_connection(&self, req: &ctl::Request) -> io::Result<UnixStream> {
        crate::lineage::request(
            &self.ctl,
            req,
            crate::lineage::Kind::Session,
            &self.stack_name,
            false,
        )
    }

    /// A netlink socket made in the stack's interface mirror: see
    /// [`crate::Client::netlink_socket`].
    pub fn netlink_socket(&self, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        // Without one, the kernel's socket, without asking every time.
        if !self.mirror {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let req = ctl::Request::Netlink(msg::NetlinkReq { ty, protocol });
        let ch = self.ask_on_own_connection(&req)?;
        let mut buf = [0u8; 1024];
        let (n, mut fds) = usnet_shm::fdpass::recv_with_fds(&ch, &mut buf)?;
        let text = String::from_utf8_lossy(&buf[..n]);
        match ctl::parse_answer::<msg::Done>(text.lines().next().unwrap_or("")) {
            Ok(_) => fds
                .pop()
                .ok_or_else(|| proto("netlink reply without its socket")),
            // No mirror (an older server answers nothing it knows: the same).
            Err(_) => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    /// Asks for a pin on the control connection `over` (a session's: pins its
    /// sockets; a pin's: its token again): the answer's channel (named `kind`), the
    /// token and how many sockets the pin holds.
    pub fn ask_pin(
        over: &UnixStream,
        kind: crate::lineage::Kind,
        stack: &str,
        inheritable: bool,
    ) -> io::Result<(UnixStream, String, u32)> {
        Self::ask_as(
            over,
            &ctl::Request::Pin(msg::PinReq::default()),
            kind,
            stack,
            inheritable,
        )
    }

    fn ask_as(
        over: &UnixStream,
        req: &ctl::Request,
        kind: crate::lineage::Kind,
        stack: &str,
        inheritable: bool,
    ) -> io::Result<(UnixStream, String, u32)> {
        use std::io::BufRead;
        let ch = crate::lineage::request(over, req, kind, stack, inheritable)?;
        let mut reply = String::new();
        // The server writes this one line and nothing more until asked again.
        std::io::BufReader::new(&ch).read_line(&mut reply)?;
        let v: msg::PinReply = answer(&reply, "pin")?;
        Ok((ch, v.token, v.sockets))
    }

    /// Asks for the session's zero-copy port: returns the pool's memfd and the
    /// port's area (see `usnet_session_abi::zc`).
    pub fn zc_port(&self, opts: crate::ZcOptions) -> io::Result<(OwnedFd, OwnedFd)> {
        use std::io::Write;
        let ctl = UnixStream::connect(&self.path)?;
        ctl.set_read_timeout(Some(Duration::from_secs(10)))?;
        let req = ctl::Request::ZcPort(msg::ZcPort {
            session: self.mem.id(),
            rx_slots: opts.rx_slots,
            tx_slots: opts.tx_slots,
            stash_slots: opts.stash_slots,
        });
        (&ctl).write_all(ctl::request_line(&req).as_bytes())?;
        let mut buf = vec![0u8; 4096];
        let (n, fds) = usnet_shm::fdpass::recv_with_fds(&ctl, &mut buf)?;
        let text = String::from_utf8_lossy(&buf[..n]);
        match ctl::parse_answer::<msg::Done>(text.lines().next().unwrap_or("")) {
            Ok(_) => {}
            Err(ControlError::Refused(e)) => {
                let kind = refused(&e).kind();
                return Err(io::Error::new(kind, format!("zero-copy port refused: {e}")));
            }
            Err(e) => return Err(proto(&format!("zc_port reply: {e}"))),
        }
        let mut fds = fds.into_iter();
        match (fds.next(), fds.next()) {
            (Some(pool), Some(area)) => Ok((pool, area)),
            _ => Err(proto("zc_port reply without its memory")),
        }
    }

    /// Forgets this session without a word to the server: a forked child's copy of
    /// its parent's session, which only the parent may use.
    pub fn abandon(&self) {
        self.dead.store(true, Relaxed);
        // Our copy of the control connection would keep the parent's session alive
        // after the parent is gone (a daemon's parent exits at once): put /dev/null
        // under its number (closing it could hand the number to someone else before
        // this object goes), so only the parent's copy holds the session.
        // SAFETY: plain system calls on descriptors we own; `dup3` replaces our
        // control descriptor atomically and the number stays ours.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, self.ctl.as_raw_fd(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }

    /// The server was found gone (no probe: what [`Self::check_alive`] and
    /// [`Self::is_dead`] last learnt).
    pub(crate) fn known_dead(&self) -> bool {
        self.dead.load(Relaxed)
    }

    /// A wait's liveness check ([`Self::check_alive`]): false while the server
    /// lives; once it is gone, true when `ready` holds, for the sockets of a dead
    /// session read as reset (`poll::readiness`) and a wait on them ends to report
    /// so (with the kernel side looked at); else the error, which ends other waits.
    fn gone_but_ready(&self, mut ready: impl FnMut() -> bool) -> io::Result<bool> {
        match self.check_alive() {
            Ok(()) => Ok(false),
            Err(_) if ready() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Whether the server is gone (it said so, or its end of the control connection
    /// closed).
    pub fn is_dead(&self) -> bool {
        if self.dead.load(Relaxed) {
            return true;
        }
        let gone = self.mem.word(hdr::SERVER_GONE).load(Acquire) != 0 || {
            let mut p = libc::pollfd {
                fd: self.ctl.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            };
            // SAFETY: one valid pollfd, the control stream alive for the call.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            n > 0
                && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR | libc::POLLIN) != 0
        };
        if gone {
            self.dead.store(true, Relaxed);
            // Wake every thread of ours that sleeps on the bell or in `poll(2)`.
            self.ring_own_bell();
        }
        gone
    }

    /// `ENETDOWN` once the server is gone; cheap enough for every read and write: a
    /// flag and the header's `SERVER_GONE` word each time, the control connection (a
    /// `poll`) at most every [`PROBE_EVERY`]. A server killed with SIGKILL writes no
    /// `SERVER_GONE`; its control connection closes with it.
    pub fn check_alive(&self) -> io::Result<()> {
        if self.dead.load(Relaxed) || self.mem.word(hdr::SERVER_GONE).load(Acquire) != 0 {
            self.is_dead();
            return Err(down());
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.last_probe.load(Relaxed);
        if now.saturating_sub(last) >= PROBE_EVERY.as_nanos() as u64 {
            self.last_probe.store(now, Relaxed);
            if self.is_dead() {
                return Err(down());
            }
        }
        Ok(())
    }

    /// This process reads (or waits to read) the shared stream at `slot`, whose
    /// bytes go to another holder (`FLAG_NOT_RECEIVER`): asks for it
    /// (`op::RX_WANT`), with what that holder has not read, as the kernel gives a
    /// socket's bytes to whoever reads. Asked again at most every [`WANT_EVERY`]
    /// per socket: the receiver may have been copying out of its ring when the
    /// server tried.
    pub(crate) fn want_stream(&self, slot: u32) {
        if !self.mem.valid_slot(slot)
            || self
                .mem
                .slot_word(slot, usnet_session_abi::slot::FLAGS)
                .load(Acquire)
                & usnet_session_abi::FLAG_NOT_RECEIVER
                == 0
        {
            return;
        }
        let now = self.epoch.elapsed().as_nanos() as u64 + 1;
        {
            let mut w = lock(&self.wants);
            let last = w.entry(slot).or_insert(0);
            if *last != 0 && now - *last < WANT_EVERY.as_nanos() as u64 {
                return;
            }
            *last = now;
        }
        let _ = self.post(
            Request {
                op: usnet_session_abi::op::RX_WANT,
                slot,
                ..Default::default()
            },
            false,
        );
    }

    /// Rings the server if it announced that it may sleep.
    pub fn ring_server(&self) {
        fence(SeqCst);
        if self.mem.word(hdr::SERVER_ASLEEP).load(Relaxed) == 0 {
            return;
        }
        match &self.server_efd {
            Some(fd) => {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live buffer to our eventfd.
                let _ = unsafe { libc::write(fd.as_fd().as_raw_fd(), one.as_ptr().cast(), 8) };
            }
            None => self.page.bell().ring(),
        }
    }

    /// Queues a request (waiting for room in the submission ring) and rings the
    /// server. Returns its tag.
    pub fn post(&self, mut req: Request, discard: bool) -> io::Result<u64> {
        if self.dead.load(Relaxed) {
            // Also a forked child's copy of its parent's session: its rings are the
            // parent's, not to be touched.
            return Err(down());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        // Completions nobody waits for (closes from destructors) must not fill the
        // completion ring: collect what arrived on every post.
        self.collect();
        loop {
            self.check_alive()?;
            {
                let mut s = lockorder::lock(&self.submit, Rank::Submit);
                if let Some(k) = s.sq.reserve() {
                    req.tag = s.next_tag;
                    s.next_tag += 1;
                    if discard {
                        lockorder::lock(&self.comp, Rank::Completions)
                            .discard
                            .insert(req.tag);
                    }
                    self.mem.write_request(k, &req);
                    s.sq.commit();
                    s.sq.publish();
                    drop(s);
                    self.ring_server();
                    return Ok(req.tag);
                }
            }
            // Full: the server has not caught up. Nudge it and wait a little.
            self.ring_server();
            if Instant::now() > deadline {
                return Err(errno_err(errno::EAGAIN));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Moves arrived completions into the table.
    fn collect(&self) {
        let mut c = lockorder::lock(&self.comp, Rank::Completions);
        let Ok(n) = c.cq.available() else {
            return;
        };
        for k in 0..n {
            let x = self.mem.read_completion(c.cq.slot(k));
            if !c.discard.remove(&x.tag) {
                c.done.insert(x.tag, x);
            }
        }
        c.cq.consume(n);
        c.cq.release();
    }

    /// Waits for the completion of `tag`.
    pub fn wait(&self, tag: u64) -> io::Result<Completion> {
        loop {
            let epoch = vtime::epoch();
            let seen = self.bell.seq();
            self.collect();
            if let Some(c) = lockorder::lock(&self.comp, Rank::Completions)
                .done
                .remove(&tag)
            {
                return Ok(c);
            }
            self.check_alive()?;
            let ready = || {
                self.collect();
                lockorder::lock(&self.comp, Rank::Completions)
                    .done
                    .contains_key(&tag)
            };
            // The server answers without the clock moving: even the clock's owner
            // sleeps here (a quiet server has answered).
            let left = if vtime::installed().is_some() {
                vtime::SLICE
            } else {
                LIVENESS_SLICE
            };
            let _asleep = vtime::asleep_for_server(epoch);
            self.bell.sleep(seen, ready, left);
        }
    }

    /// A request and its result: the value, or the errno as an error.
    pub fn call(&self, req: Request) -> io::Result<(u64, [u64; 2])> {
        let tag = self.post(req, false)?;
        let c = self.wait(tag)?;
        if c.result < 0 {
            Err(errno_err(-c.result))
        } else {
            Ok((c.result as u64, c.aux))
        }
    }

    /// Whether slot `slot`'s zero-copy sends have a completion to report, the
    /// peer having acknowledged `acked` bytes of its send ring.
    pub(crate) fn zc_pending(&self, slot: u32, acked: u64) -> bool {
        self.zc_used.load(Acquire) && lock(&self.zc).get(&slot).is_some_and(|z| z.pending(acked))
    }

    /// Wakes this process's sleepers on the session's bell (as a server ring does).
    pub(crate) fn ring_own_bell(&self) {
        self.bell.ring();
        if let Some(e) = &self.efd {
            e.ring();
        }
    }

    /// Sleeps until the server rings this session, one of `kernel` (kernel
    /// descriptors) has events, `ready` holds or `timeout` passes, in one `poll(2)`
    /// on `kernel` and the session's eventfd: the wait of a program whose poll or
    /// epoll set mixes usnet sockets with kernel descriptors (a self-pipe, an
    /// eventfd, a signalfd, a pipe to a parent). Fills `kernel`'s `revents` and
    /// returns how many have events (0 also when the bell rang or nothing did).
    ///
    /// The wake-up is `usnet_shm::doorbell::Gate`'s with the eventfd for the futex:
    /// the thread reads `seq`, announces itself in `WANT_EVENTFD`, fences and looks
    /// again (at `seq` and at `ready`) before it sleeps; the server bumps `seq`, then
    /// reads `WANT_EVENTFD` (both SeqCst) and writes the eventfd if anyone
    /// announced. Either the server sees the announcement, or this thread sees
    /// `seq` move. Without an eventfd (an older server) or on virtual time, the
    /// bell is slept on in slices of [`MIX_SLICE`] and the kernel side looked at
    /// between them.
    pub fn sleep_with_kernel(
        &self,
        kernel: &mut [libc::pollfd],
        timeout: Duration,
        ready: impl Fn() -> bool,
    ) -> io::Result<usize> {
        if self.gone_but_ready(&ready)? {
            return Ok(0);
        }
        let poll_kernel = |fds: &mut [libc::pollfd], ms: i32| -> io::Result<usize> {
            // SAFETY: `fds` is a valid array of pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                // A signal: the caller decides whether its call is interrupted.
                return if e.kind() == io::ErrorKind::Interrupted {
                    Ok(0)
                } else {
                    Err(e)
                };
            }
            Ok(n as usize)
        };
        let Some(efd) = self.efd.as_ref().filter(|_| vtime::installed().is_none()) else {
            let seen = self.bell.seq();
            if poll_kernel(kernel, 0)? > 0 {
                return Ok(kernel.iter().filter(|p| p.revents != 0).count());
            }
            let epoch = vtime::epoch();
            if let (vtime::Plan::Sleep(left), _asleep) =
                vtime::plan(epoch, timeout.min(MIX_SLICE), Some(vtime::now() + timeout))
            {
                self.bell.sleep(seen, &ready, left);
            }
            return Ok(0);
        };
        let seen = self.bell.seq();
        if ready() {
            return Ok(0);
        }
        // Listed before the announcement, so the thread that takes the server's
        // write for it finds it (see `crate::mixed`).
        let own = self.mixed.listed();
        let want = self.mem.word(hdr::WANT_EVENTFD);
        want.fetch_add(1, SeqCst);
        fence(SeqCst);
        let r = if self.bell.seq() != seen || ready() {
            Ok(0)
        } else {
            let mut fds = Vec::with_capacity(kernel.len() + 3);
            fds.extend_from_slice(kernel);
            fds.push(libc::pollfd {
                fd: efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // The control connection hangs up when the server dies (SIGKILL
            // writes no SERVER_GONE): wake for that too.
            fds.push(libc::pollfd {
                fd: self.ctl.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            });
            if let Some(own) = &own {
                fds.push(libc::pollfd {
                    fd: own.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // Whole milliseconds, rounded up, so a short timeout does not spin.
            let ms = timeout
                .min(MIXED_SLEEP_MAX)
                .as_micros()
                .div_ceil(1000)
                .min(i32::MAX as u128) as i32;
            poll_kernel(&mut fds, ms).map(|_| {
                for (k, p) in kernel.iter_mut().zip(&fds) {
                    k.revents = p.revents;
                }
                if fds[kernel.len()].revents != 0 && efd.drain() > 0 {
                    // The kernel wakes every thread asleep on the eventfd, but
                    // one that looks after this read emptied it sleeps on: wake
                    // the others through their own.
                    self.mixed.wake_others(own.as_ref());
                }
                kernel.iter().filter(|p| p.revents != 0).count()
            })
        };
        want.fetch_sub(1, Release);
        r
    }

    pub fn bell_seq(&self) -> u32 {
        vtime::mark();
        self.bell.seq()
    }

    /// Sleeps until the bell moves from `seen` (the server changed something in the
    /// session) or `timeout` passes.
    pub fn sleep_bell(&self, seen: u32, timeout: Duration) -> io::Result<()> {
        self.check_alive()?;
        self.collect();
        let deadline = vtime::now() + timeout;
        match vtime::plan(
            vtime::marked(),
            timeout.min(LIVENESS_SLICE * 4),
            Some(deadline),
        ) {
            (vtime::Plan::Sleep(left), _asleep) => {
                self.bell.sleep(seen, || false, left);
            }
            (vtime::Plan::Moved | vtime::Plan::GiveUp, _) => {}
        }
        Ok(())
    }

    /// Sleeps until `ready` holds or `deadline` passes (then false). The server rings
    /// the bell after every change it makes to this session.
    ///
    /// A signal handler that ran on this thread meanwhile ends the wait with
    /// `Interrupted` (see [`crate::signal`]): any handler, or with `restartable` only
    /// one installed without SA_RESTART.
    pub fn wait_until(
        &self,
        deadline: Option<Instant>,
        restartable: bool,
        ready: impl FnMut() -> bool,
    ) -> io::Result<bool> {
        self.wait_until_on(None, deadline, restartable, ready)
    }

    /// [`Conn::wait_until`] for a `ready` that only the socket in slot `on` makes
    /// true (a blocking call on it): the thread sleeps on that slot's words
    /// (`slot::SLEEPERS`), so the server wakes it for this socket's news only and
    /// a process with a thread per connection is not woken whole on every turn.
    /// Under virtual time it sleeps on the session's bell, which the clock rings.
    pub fn wait_until_on(
        &self,
        on: Option<u32>,
        deadline: Option<Instant>,
        restartable: bool,
        mut ready: impl FnMut() -> bool,
    ) -> io::Result<bool> {
        let signals = crate::signal::mark();
        let slot_gate = on.filter(|_| vtime::installed().is_none()).map(|i| {
            usnet_shm::Gate::new(
                self.mem.slot_word(i, slot::EVENTS),
                self.mem.slot_word(i, slot::SLEEPERS),
            )
        });
        let mut slice = LIVENESS_SLICE;
        loop {
            let epoch = vtime::epoch();
            let seen = match &slot_gate {
                Some(g) => g.seq(),
                None => self.bell.seq(),
            };
            if ready() {
                return Ok(true);
            }
            if self.gone_but_ready(&mut ready)? {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => {
                    let now = vtime::now();
                    if now >= d {
                        return Ok(false);
                    }
                    (d - now).min(slice)
                }
                None => slice,
            };
            slice = (slice * 2).min(LIVENESS_SLICE_MAX);
            match vtime::plan(epoch, left, deadline) {
                (vtime::Plan::Sleep(left), _asleep) => match &slot_gate {
                    Some(g) => {
                        g.sleep(seen, &mut ready, left);
                    }
                    None => {
                        self.bell.sleep(seen, &mut ready, left);
                    }
                },
                (vtime::Plan::Moved, _) => continue,
                (vtime::Plan::GiveUp, _) => return Ok(ready()),
            }
            if crate::signal::interrupted_since(signals, restartable) && !ready() {
                return Err(io::ErrorKind::Interrupted.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fitted;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_session_shrinks_to_fit_the_address_space_left() {
        // Unlimited room: what was asked.
        assert_eq!(fitted(u64::MAX, 1024, 256 * 1024, 1), (1024, 256 * 1024));
        // 150 MiB: fewer sockets first, the rings as they are.
        assert_eq!(fitted(150 * MIB, 1024, 256 * 1024, 1), (256, 256 * 1024));
        // 20 MiB: 64 sockets, then smaller rings.
        assert_eq!(fitted(20 * MIB, 1024, 256 * 1024, 1), (64, 128 * 1024));
        // A forked child's pinned sockets are kept.
        assert_eq!(fitted(20 * MIB, 1224, 256 * 1024, 201), (201, 32 * 1024));
        // Nothing fits: the floors, and the attach says why.
        assert_eq!(fitted(MIB, 1024, 256 * 1024, 1), (64, 16 * 1024));
    }
}
