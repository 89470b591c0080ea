//! The control socket of a stack server: `usnet stat`, `usnet ping`, `usnet down` and
//! `usnet clients` talk to it, and every client attaches through it. A client keeps
//! its connection open for as long as it is attached: when the connection breaks (the
//! process exited or was killed), the server resets and frees everything the client
//! held. Only the stack's owner (or a member of the group given at start) may connect:
//! the socket is mode 0600 (0660 with a group) and every peer's credentials are
//! checked.
//!
//! Requests (one JSON line, typed in `usnet_session::ctl::msg`):
//! `{"cmd":"attach","pid":P,"command":"name"}` (answered with the session memfd, the
//! server page and, for a stack on an fd-based link, the server's eventfd, passed
//! with SCM_RIGHTS), `{"cmd":"stat"}`, `{"cmd":"clients"}`, `{"cmd":"ping",...}` and
//! `{"cmd":"stop"}`.
//!
//! Requests on an attached connection. A client's connection (and a pin's, below)
//! takes requests of its own, each one JSON line sent with `SCM_RIGHTS` carrying a
//! fresh channel: one end of a socketpair the requester made, on which the answer
//! comes. Whoever can write on the connection holds it (the session's process, a
//! child forked from it, or the program one of them exec'd: the kernel gave them
//! the descriptor), so no credentials are checked again: a child that dropped its
//! privileges after `fork` (nginx's workers, sshd) keeps the right its parent was
//! given, and never connects to the control socket, which its new uid may not open.
//!
//! - `{"cmd":"pin"}` on a session's connection pins every socket of the session for
//!   a child (before a `fork`, or by a program after `exec` or `posix_spawn` that
//!   inherited the connection) and answers `{"ok":true,"token":T,"sockets":N}` on
//!   the channel. The channel is the pin's life: the child inherits it, and when
//!   every copy is closed (the child exited without attaching) the pin is dropped.
//!   The same request on a pin's channel answers that pin's token.
//! - `{"cmd":"attach","claim":T,...}` on a pin's channel attaches a new session over
//!   it (the channel is then that session's connection), holding the pinned sockets
//!   too: `"slots": [[parent slot, child slot, tag, role], ...]` in the reply (the
//!   tag is the parent's `usnet_session_abi::slot::TAG`, the role a `usnet_session_abi::role`).
//!   Only the family knows the token: it came over a descriptor only they hold.
//! - `{"cmd":"attach",...}` sent with a fresh channel, on a pin's channel or on a
//!   session's connection: both steps above in one exchange, what a forked child
//!   (or a program after `exec`) sends. On a pin's channel the new session claims
//!   that pin; on a session's connection the server pins the session's sockets
//!   and the new session claims them. The reply (as an attach's, with `"slots"`)
//!   comes on the fresh channel, which is the new session's connection. A fork
//!   costs the parent's pin and this one round trip.
//! - `{"cmd":"pin","slots":[...]}` on a session's connection pins only those slots,
//!   for a process they are passed to with `SCM_RIGHTS` (the pin's channel goes with
//!   them, so its life is the message's, then the receiver's).
//! - `{"cmd":"claim","token":T}` on a session's connection: that (already attached)
//!   session takes the sockets of pin T, as the receiver of passed descriptors does
//!   after asking the token on the pin's channel; `{"ok":true,"slots":[...]}` as
//!   for an attach's claim. The pin must live on the session's shard.
//! - `{"cmd":"netlink","ty":T,"protocol":P}` on a session's connection (or a
//!   connection of its own, by someone the credential check admits):
//!   `{"ok":true}` with a netlink socket made in the stack's interface mirror
//!   ([`crate::mirror`]), or a refusal when the stack has none.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use usnet_session::ctl::msg::{
    self, AttachReply, ClaimReply, Clients, Done, PinReply, PingEvent, Refusal, Request, Stat,
};
use usnet_session::ctl::{run_dir, socket_path, valid_name};
use usnet_session::Session;

use crate::mirror::Mirror;
use crate::session::ServerSession;
use crate::{submit_call, Loop, ServerConfig, ShardLink};

pub use usnet_session::ctl::ControlError;

/// Connections listed by `stat` (the total is always reported).
const STAT_MAX_CONNECTIONS: usize = 256;
/// How long a request line may take to arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a control request waits for the loop.
const LOOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves the control socket until dropped.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub(crate) fn start(
        cfg: &ServerConfig,
        links: Vec<ShardLink>,
        mirror: Option<(msg::Iface, Vec<std::net::IpAddr>)>,
    ) -> Result<ControlServer, ControlError> {
        if !valid_name(&cfg.name) {
            return Err(ControlError::BadName(cfg.name.clone()));
        }
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        sweep_stale(&dir);
        let path = socket_path(&cfg.name);
        if !remove_if_stale(&path) {
            return Err(ControlError::NameInUse(cfg.name.clone()));
        }
        let listener = UnixListener::bind(&path)?;
        // Anyone may connect; who may attach is the peer-credential check in
        // `handle` (the owner, root, the `--group`), as D-Bus's system bus decides.
        // A narrower mode would shut out what that check admits: a root process
        // that dropped CAP_DAC_OVERRIDE (ping, hardened services) cannot open a
        // socket file another user owns.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        if let Some(gid) = cfg.group {
            std::os::unix::fs::chown(&path, None, Some(gid))?;
        }
        listener.set_nonblocking(true)?;
        // The name is ours now, so is the mirror's namespace (a stale one is
        // replaced; a live server's name never gets this far).
        let mirror = mirror.and_then(|(iface, gateways)| {
            match Mirror::create(&cfg.name, &iface, &gateways) {
                Ok(m) => Some(Arc::new(m)),
                Err(e) => {
                    eprintln!(
                        "usnet: no interface mirror ({e}): programs that read rtnetlink \
                         themselves will see the host's interfaces"
                    );
                    None
                }
            }
        });
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Ctx {
            links: Arc::new(links),
            cfg: cfg.clone(),
            next_id: Arc::new(AtomicU32::new(1)),
            homes: Arc::new(Mutex::new(Homes::default())),
            mirror,
        };
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("usnet-control".into())
            .spawn(move || watch_connections(listener, ctx, stop2))?;
        Ok(ControlServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes what stacks killed with SIGKILL left in run directory `dir`: their
/// control (`.ctl`) and rpc baseline (`.rpc`) sockets that nobody answers on.
/// Each stack that starts does it, so such files do not pile up (a benchmark
/// that kills its stacks left three a run). Only sockets older than
/// [`SWEEP_AGE`]: one another stack is starting beside this one exists, bound,
/// before it listens, and refuses connections in between.
pub fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ours = matches!(p.extension().and_then(|x| x.to_str()), Some("ctl" | "rpc"));
        let old = || {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= SWEEP_AGE))
        };
        if ours && e.file_type().is_ok_and(|t| t.is_socket()) && old() {
            remove_if_stale(&p);
        }
    }
}

/// How old a socket must be before [`sweep_stale`] looks at it.
pub const SWEEP_AGE: Duration = Duration::from_secs(10);

/// Removes the socket at `path` if nobody answers on it (one a stopped or dead
/// server left); false when a server does answer, and the socket stays.
pub fn remove_if_stale(path: &Path) -> bool {
    if !path.exists() {
        return true;
    }
    if UnixStream::connect(path).is_ok() {
        return false;
    }
    let _ = std::fs::remove_file(path);
    true
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Clone)]
struct Ctx {
    /// Each shard's loop (one unless the server is sharded).
    links: Arc<Vec<ShardLink>>,
    cfg: ServerConfig,
    next_id: Arc<AtomicU32>,
    /// A leaf lock (the server's lock order: `Host` in lib.rs).
    homes: Arc<Mutex<Homes>>,
    /// Where clients' `NETLINK_ROUTE` sockets are made, if the stack has a mirror.
    mirror: Option<Arc<Mirror>>,
}

/// Which shard each session lives on, and where the next ones go.
#[derive(Default)]
struct Homes {
    of: HashMap<u32, usize>,
    /// The next fresh client's shard (round robin).
    next: usize,
    /// Children that took only listeners, per parent session: they are spread over
    /// the shards from the parent's own.
    children: HashMap<u32, usize>,
}

impl Ctx {
    /// Runs `f` in shard 0's loop (what any shard can answer).
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Loop) -> R + Send + 'static,
    ) -> Option<R> {
        self.call_on(0, f)
    }

    fn call_on<R: Send + 'static>(
        &self,
        shard: usize,
        f: impl FnOnce(&mut Loop) -> R + Send + 'static,
    ) -> Option<R> {
        let l = self.links.get(shard)?;
        submit_call(&l.jobs, &l.bell, LOOP_TIMEOUT, f)
    }

    /// Runs `f` in every shard's loop, in shard order (`None` for a loop that does
    /// not answer).
    fn call_all<R: Send + 'static>(
        &self,
        f: impl Fn(&mut Loop) -> R + Send + Sync + Clone + 'static,
    ) -> Vec<Option<R>> {
        (0..self.links.len())
            .map(|k| self.call_on(k, f.clone()))
            .collect()
    }

    fn homes(&self) -> std::sync::MutexGuard<'_, Homes> {
        self.homes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard session `id` lives on.
    fn home_of(&self, id: u32) -> usize {
        self.homes().of.get(&id).copied().unwrap_or(0)
    }
}

/// An attached client: its connection (watched for hang-up) and its session id; or
/// a pin for a forked child (dropped on hang-up).
struct Attached {
    stream: UnixStream,
    id: u32,
    pin: Option<u128>,
    /// How many sockets `pin` holds (the new session's slots must take them).
    pinned: usize,
    /// The session's shard, or the pin's.
    shard: usize,
}

fn watch_connections(listener: UnixListener, ctx: Ctx, stop: Arc<AtomicBool>) {
    let mut attached: Vec<Attached> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let mut fds = Vec::with_capacity(1 + attached.len());
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for a in &attached {
            fds.push(libc::pollfd {
                fd: a.stream.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call; the
        // descriptors belong to `listener` and `attached`, alive across it.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if n <= 0 {
            continue;
        }
        // Hang-ups and requests first (walk backwards so removal keeps indices valid;
        // what is pushed meanwhile is looked at in the next round).
        for k in (1..fds.len()).rev() {
            if fds[k].revents == 0 {
                continue;
            }
            let hup = fds[k].revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0;
            let said = if hup {
                Said::Gone
            } else {
                read_request(&attached[k - 1].stream)
            };
            match said {
                Said::Nothing => {}
                Said::Pin(channel, only) => {
                    let a = &attached[k - 1];
                    let from = (a.id, a.pin, a.shard);
                    if let Some(a) = pin(channel, from, only, &ctx) {
                        attached.push(a);
                    }
                }
                Said::Claim(channel, token) => {
                    let a = &attached[k - 1];
                    claim(channel, a.id, a.shard, &token, &ctx);
                }
                Said::Netlink(channel, req) => netlink(channel, &req, &ctx),
                Said::Attach(req) if attached[k - 1].id == 0 => {
                    let a = attached.swap_remove(k - 1);
                    let pin_shard = a.shard;
                    if let Some(s) = attach(a.stream, &req, pin_shard, &ctx) {
                        attached.push(s);
                    }
                    // The channel was this pin's life: claimed now, or let go.
                    if let Some(token) = a.pin {
                        let _ = ctx.call_on(pin_shard, move |lp| lp.drop_pin(token));
                    }
                }
                // A session attaches once.
                Said::Attach(_) => {}
                Said::AttachOn(channel, req) => {
                    let a = &attached[k - 1];
                    let from = (a.id, a.pin, a.pinned, a.shard);
                    if let Some(s) = attach_claiming(channel, req, from, &ctx) {
                        attached.push(s);
                    }
                }
                Said::Gone => {
                    let a = attached.swap_remove(k - 1);
                    let (id, shard) = (a.id, a.shard);
                    match a.pin {
                        Some(token) => {
                            let _ = ctx.call_on(shard, move |lp| lp.drop_pin(token));
                        }
                        None if id == 0 => {}
                        None => {
                            let _ = ctx.call_on(shard, move |lp| lp.remove_session(id));
                            ctx.homes().of.remove(&id);
                        }
                    }
                }
            }
        }
        if fds[0].revents & libc::POLLIN != 0 {
            while let Ok((stream, _)) = listener.accept() {
                if let Some(a) = handle(stream, &ctx) {
                    attached.push(a);
                }
            }
        }
    }
}

/// The uid and gid of the process at the other end.
fn peer_ids(s: &UnixStream) -> io::Result<(u32, u32)> {
    let c = rustix::net::sockopt::socket_peercred(s.as_fd())?;
    Ok((c.uid.as_raw(), c.gid.as_raw()))
}

/// The pid of the process that connected (the kernel's word, not the client's).
fn peer_pid(s: &UnixStream) -> Option<u32> {
    let c = rustix::net::sockopt::socket_peercred(s.as_fd()).ok()?;
    Some(c.pid.as_raw_nonzero().get() as u32)
}

/// 128 random bits from the kernel.
fn random_token() -> io::Result<u128> {
    let mut b = [0u8; 16];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the remaining bytes of `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(u128::from_le_bytes(b))
}

/// What an attached connection said (see the module's text).
enum Said {
    /// Hung up, or a read failed.
    Gone,
    /// Nothing yet, or something that is no request (ignored).
    Nothing,
    /// `pin`, with the channel to answer on (and the slots to pin, if not all).
    Pin(UnixStream, Option<Vec<u32>>),
    /// `claim` of a pin's token, with the channel to answer on.
    Claim(UnixStream, String),
    /// `netlink`: a netlink socket in the stack's mirror, sent on the channel.
    Netlink(UnixStream, msg::NetlinkReq),
    Attach(msg::Attach),
    /// `attach` with a channel: a new session over that channel, claiming this
    /// connection's pin (or a pin made of this session's sockets).
    AttachOn(UnixStream, msg::Attach),
}

fn read_request(s: &UnixStream) -> Said {
    let mut buf = [0u8; 4096];
    match usnet_shm::fdpass::recv_with_fds(s, &mut buf) {
        Ok((0, _)) => Said::Gone,
        Ok((n, fds)) => {
            let Ok(req) = serde_json::from_slice::<Request>(buf[..n].trim_ascii_end()) else {
                return Said::Nothing;
            };
            let mut fds = fds.into_iter();
            match (req, fds.next(), fds.next()) {
                (Request::Pin(p), Some(channel), None) => {
                    Said::Pin(UnixStream::from(channel), p.slots)
                }
                (Request::Claim(c), Some(channel), None) => {
                    Said::Claim(UnixStream::from(channel), c.token)
                }
                (Request::Netlink(n), Some(channel), None) => {
                    Said::Netlink(UnixStream::from(channel), n)
                }
                (Request::Attach(a), None, None) => Said::Attach(a),
                (Request::Attach(a), Some(channel), None) => {
                    Said::AttachOn(UnixStream::from(channel), a)
                }
                _ => Said::Nothing,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Said::Nothing,
        Err(_) => Said::Gone,
    }
}

/// A pin request that came on the connection `from` (its session, and its pin if it
/// is a pin's channel), answered on `out`, which is then watched: see the module's
/// text.
fn pin(
    mut out: UnixStream,
    from: (u32, Option<u128>, usize),
    only: Option<Vec<u32>>,
    ctx: &Ctx,
) -> Option<Attached> {
    out.set_nonblocking(false).ok()?;
    out.set_write_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let (session, held, shard) = from;
    if session == 0 {
        // A pin's holder (a forked child, or what it exec'd) asks for its token.
        let Some(token) = held else {
            refuse(&mut out, "this connection holds no pin");
            return None;
        };
        let n = ctx.call_on(shard, move |lp| lp.pin_size(token)).flatten();
        let Some(n) = n else {
            refuse(&mut out, "the pin is gone");
            return None;
        };
        send(&mut out, &pin_reply(token, n)).ok()?;
        out.set_nonblocking(true).ok()?;
        return Some(Attached {
            stream: out,
            id: 0,
            pin: None,
            pinned: 0,
            shard,
        });
    }
    let token = match random_token() {
        Ok(t) => t,
        Err(e) => {
            refuse(&mut out, &format!("no random token: {e}"));
            return None;
        }
    };
    match ctx.call_on(shard, move |lp| lp.pin(session, token, only.as_deref())) {
        Some(Some(n)) => {
            if send(&mut out, &pin_reply(token, n)).is_err() {
                let _ = ctx.call_on(shard, move |lp| lp.drop_pin(token));
                return None;
            }
            out.set_nonblocking(true).ok()?;
            Some(Attached {
                stream: out,
                id: 0,
                pin: Some(token),
                pinned: n,
                shard,
            })
        }
        Some(None) => {
            refuse(&mut out, "no such session");
            None
        }
        None => {
            refuse(&mut out, NO_ANSWER);
            None
        }
    }
}

/// An `attach` with its own channel (`out`) on the connection `from` (its session,
/// its pin and the pin's size, its shard): on a pin's channel the new session
/// claims that pin; on a session's connection the session's sockets are pinned
/// first and the new session claims them. One exchange where `pin` and then
/// `attach` take two.
fn attach_claiming(
    mut out: UnixStream,
    mut req: msg::Attach,
    from: (u32, Option<u128>, usize, usize),
    ctx: &Ctx,
) -> Option<Attached> {
    let (session, held, pinned, shard) = from;
    let (token, pinned, made) = match held {
        Some(token) => (token, pinned, false),
        None if session != 0 => {
            let token = match random_token() {
                Ok(t) => t,
                Err(e) => {
                    refuse(&mut out, &format!("no random token: {e}"));
                    return None;
                }
            };
            match ctx.call_on(shard, move |lp| lp.pin(session, token, None)) {
                Some(Some(n)) => (token, n, true),
                Some(None) => {
                    refuse(&mut out, "no such session");
                    return None;
                }
                None => {
                    refuse(&mut out, NO_ANSWER);
                    return None;
                }
            }
        }
        None => {
            refuse(&mut out, "this connection holds no pin");
            return None;
        }
    };
    req.claim = Some(format!("{token:032x}"));
    // Room for the pinned sockets and as many again as a fresh client gets; a
    // client that asks for fewer (its address space is capped) gets at least
    // room for the pinned ones.
    req.max_sockets = Some(match req.max_sockets {
        None => pinned as u64 + 1024,
        Some(want) => want.max(pinned as u64 + 1),
    });
    let got = attach(out, &req, shard, ctx);
    if got.is_none() && made {
        let _ = ctx.call_on(shard, move |lp| lp.drop_pin(token));
    }
    got
}

/// A `claim` on session `id`'s connection (on `shard`): the session takes the
/// sockets of the pin `token`, answered on `out`. The pin must live on the
/// session's shard (a receiver of passed descriptors on another shard is refused).
fn claim(mut out: UnixStream, id: u32, shard: usize, token: &str, ctx: &Ctx) {
    if out.set_write_timeout(Some(REQUEST_TIMEOUT)).is_err() {
        return;
    }
    if id == 0 {
        refuse(&mut out, "claim is asked on a session's connection");
        return;
    }
    let Ok(token) = u128::from_str_radix(token, 16) else {
        refuse(&mut out, "a pin's token is 32 hex digits");
        return;
    };
    match ctx.call_on(shard, move |lp| lp.claim(id, token)) {
        Some(Some(got)) => {
            let slots = got
                .iter()
                .map(|c| [c.parent_slot, c.slot, c.tag, c.role])
                .collect();
            let _ = send(&mut out, &ClaimReply { ok: true, slots });
        }
        Some(None) => refuse(&mut out, "no such pin on this session's shard"),
        None => refuse(&mut out, NO_ANSWER),
    }
}

/// A `netlink` request: a socket made in the stack's mirror (see [`crate::mirror`]),
/// passed on `out` with [`Done`], or the refusal the client falls back on.
fn netlink(mut out: UnixStream, req: &msg::NetlinkReq, ctx: &Ctx) {
    let Some(m) = &ctx.mirror else {
        return refuse(&mut out, "this stack has no interface mirror");
    };
    match m.socket(req.ty, req.protocol) {
        Ok(fd) => {
            let _ = usnet_shm::fdpass::send_with_fds(&out, &line(&Done::OK), &[fd.as_fd()]);
        }
        Err(e) => refuse(&mut out, &format!("netlink socket in the mirror: {e}")),
    }
}

fn pin_reply(token: u128, sockets: usize) -> PinReply {
    PinReply {
        ok: true,
        token: format!("{token:032x}"),
        sockets: sockets.min(u32::MAX as usize) as u32,
    }
}

/// A zero-copy port for a session (`usnet_session_abi::zc`): only from the session's own
/// process, of the stack's own user or root (the port maps the whole packet pool),
/// on a server started with `zero_copy`. Answered with the pool's memfd and the
/// port's area; the port lives as long as the session.
fn zc_port(mut out: UnixStream, req: &msg::ZcPort, ctx: &Ctx) {
    if !ctx.cfg.zero_copy {
        return refuse(
            &mut out,
            "zero-copy ports are off on this stack (start it with --zero-copy)",
        );
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    if !matches!(peer_ids(&out), Ok((uid, _)) if uid == me || uid == 0) {
        return refuse(
            &mut out,
            "permission denied: a zero-copy port is for the stack's own user",
        );
    }
    let session = req.session;
    let slots = |n: u32| n.min(usnet_session_abi::zc::MAX_SLOTS);
    let g = usnet_session_abi::zc::Geometry {
        rx_slots: slots(req.rx_slots),
        tx_slots: slots(req.tx_slots),
        stash_slots: slots(req.stash_slots),
    };
    let pid = peer_pid(&out);
    let r = ctx.call_on(
        ctx.home_of(session),
        move |lp| -> Result<(std::os::fd::OwnedFd, usnet_session::zc::ZcArea), String> {
            match lp.sessions.get(&session) {
                Some(s) if Some(s.pid) == pid => {}
                Some(_) => return Err("permission denied: not the session's process".into()),
                None => return Err("no such session".into()),
            }
            if lp.sessions[&session].zc.is_some() {
                return Err("the session has a zero-copy port already".into());
            }
            let stack = lp.driver.stack();
            let Some(pool_fd) = stack.pool().memfd_fd() else {
                return Err("the stack's packet pool is not shareable (not a memfd)".into());
            };
            // SAFETY: the pool's descriptor is open for the pool's life, and the pool
            // lives in this loop; the copy is ours.
            let pool = unsafe { std::os::fd::BorrowedFd::borrow_raw(pool_fd) }
                .try_clone_to_owned()
                .map_err(|e| format!("pool memfd: {e}"))?;
            let port =
                crate::zc::ServerZc::new(stack, g).map_err(|e| format!("port memory: {e}"))?;
            let area = port.area.clone();
            if let Some(s) = lp.sessions.get_mut(&session) {
                s.zc = Some(port);
            }
            Ok((pool, area))
        },
    );
    let (pool, area) = match r {
        Some(Ok(x)) => x,
        Some(Err(e)) => return refuse(&mut out, &e),
        None => return refuse(&mut out, NO_ANSWER),
    };
    let bytes = line(&Done::OK);
    let _ = usnet_shm::fdpass::send_with_fds(&out, &bytes, &[pool.as_fd(), area.region().fd()]);
}

/// One control connection: attach is answered here (the stream is then watched);
/// other requests get a thread of their own (a ping takes seconds).
fn handle(stream: UnixStream, ctx: &Ctx) -> Option<Attached> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    match peer_ids(&stream) {
        Ok((uid, gid)) if uid == me || uid == 0 || ctx.cfg.group == Some(gid) => {}
        _ => {
            let mut s = stream;
            refuse(&mut s, "permission denied");
            return None;
        }
    }
    let mut line = String::new();
    {
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        reader.read_line(&mut line).ok()?;
    }
    let mut out = stream;
    let req: Request = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            refuse(&mut out, &format!("bad request: {e}"));
            return None;
        }
    };
    match req {
        Request::Attach(a) => return attach(out, &a, 0, ctx),
        Request::ZcPort(z) => {
            zc_port(out, &z, ctx);
            return None;
        }
        Request::Netlink(n) => {
            netlink(out, &n, ctx);
            return None;
        }
        Request::Pin(_) | Request::Claim(_) => {
            refuse(
                &mut out,
                "pin and claim are asked on an attached client's connection",
            );
            return None;
        }
        Request::Stat | Request::Clients | Request::Ping(_) | Request::Stop => {}
    }
    let ctx = ctx.clone();
    std::thread::spawn(move || {
        let _ = request(&mut out, req, &ctx);
    });
    None
}

/// What a loop that does not take a call in time is told.
const NO_ANSWER: &str = "the server loop does not answer";

/// `v` as one line of the protocol.
fn line(v: &impl Serialize) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).expect("a control message serialises");
    b.push(b'\n');
    b
}

fn send(out: &mut UnixStream, v: &impl Serialize) -> io::Result<()> {
    out.write_all(&line(v))
}

/// Says no (best effort: the connection is dropped after).
fn refuse(out: &mut UnixStream, why: &str) {
    let _ = send(
        out,
        &Refusal {
            error: why.to_string(),
        },
    );
}

/// Attaches a client (`pin_shard`: where the pin it claims lives, if it claims one).
/// A fresh client's home shard is the one it asks for (`"shard"`, modulo the count),
/// else the next in turn; a forked child's is its
/// parent's, unless it took only listeners: such children (a pre-forking server's
/// workers) are spread over the shards starting from the parent's, each holding
/// the listener's copy on its own shard, so each worker accepts what its shard
/// receives.
fn attach(mut out: UnixStream, req: &msg::Attach, pin_shard: usize, ctx: &Ctx) -> Option<Attached> {
    out.set_nonblocking(false).ok()?;
    out.set_write_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    // The kernel's word for who connected, the request's if it has none.
    let pid = peer_pid(&out).unwrap_or(req.pid);
    let claim = match &req.claim {
        Some(t) => match u128::from_str_radix(t, 16) {
            Ok(t) => Some(t),
            Err(_) => {
                refuse(&mut out, "bad fork token");
                return None;
            }
        },
        None => None,
    };
    let command: String = Some(req.command.as_str())
        .filter(|c| !c.is_empty())
        .unwrap_or("?")
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    let (g, cut) = granted_geometry(req, ctx.cfg.geometry);
    let fail = |out: &mut UnixStream, e: String| {
        refuse(out, &e);
        None
    };
    let mem = match Session::create(id, g) {
        Ok(m) => m,
        Err(e) => return fail(&mut out, format!("cannot create session memory: {e}")),
    };
    let limits = ctx.cfg.limits;
    let mut s = match ServerSession::new(id, pid, command, mem.clone(), limits) {
        Ok(s) => s,
        Err(e) => return fail(&mut out, format!("session: {e}")),
    };
    s.stats.quota_geometry += cut as u64;
    // Our copy of the session's eventfd for the reply (the session moves to its
    // shard below).
    let efd = match s.eventfd().try_clone_to_owned() {
        Ok(e) => e,
        Err(e) => return fail(&mut out, format!("session eventfd: {e}")),
    };
    let max = limits.max_sessions;
    let n = ctx.links.len();
    let (home, remote) = match claim {
        // A client that asks for a shard gets it.
        None if req.shard.is_some() => (req.shard.unwrap_or(0) as usize % n, false),
        None => {
            let mut h = ctx.homes();
            let k = h.next % n;
            h.next = h.next.wrapping_add(1);
            (k, false)
        }
        Some(token) if n > 1 => {
            match ctx
                .call_on(pin_shard, move |lp| lp.pin_info(token))
                .flatten()
            {
                Some((parent, true)) => {
                    let mut h = ctx.homes();
                    let c = h.children.entry(parent).or_insert(0);
                    let k = (pin_shard + *c) % n;
                    *c += 1;
                    (k, k != pin_shard)
                }
                _ => (pin_shard, false),
            }
        }
        Some(_) => (pin_shard, false),
    };
    // A child that moves takes copies of the listeners out of the parent's shard.
    let copies = match claim {
        Some(token) if remote => {
            match ctx
                .call_on(pin_shard, move |lp| lp.take_listener_pin(token))
                .flatten()
            {
                Some(c) => Some(c),
                None => return fail(&mut out, "unknown fork token".into()),
            }
        }
        _ => None,
    };
    let added = ctx.call_on(home, move |lp| {
        if lp.sessions.len() >= max {
            lp.quota_sessions += 1;
            return Err("too many clients");
        }
        lp.add_session(s);
        if let Some(c) = copies {
            return Ok(Some(lp.claim_copies(id, c)));
        }
        match claim {
            None => Ok(None),
            Some(token) => match lp.claim(id, token) {
                Some(map) => Ok(Some(map)),
                None => {
                    lp.remove_session(id);
                    Err("unknown fork token")
                }
            },
        }
    });
    let slots = match added {
        Some(Ok(m)) => m,
        Some(Err(e)) => return fail(&mut out, e.into()),
        None => return fail(&mut out, NO_ANSWER.into()),
    };
    let iface = ctx.call_on(home, |lp| lp.iface());
    let bell = &ctx.links[home].bell;
    let bytes = line(&AttachReply {
        ok: true,
        session: id,
        shard: home,
        bell_kind: bell.page().bell_kind(),
        pid: std::process::id(),
        slots: slots.map(|map| map.iter().map(|c| c.words()).collect()),
        iface,
        mirror: ctx.mirror.is_some(),
        mirror_pid: ctx.mirror.as_ref().map_or(0, |m| m.helper_pid()),
    });
    let page = bell.page().region().fd();
    let mut fds = vec![mem.region().fd(), page];
    if let Some(e) = bell.eventfd() {
        fds.push(e);
    }
    // The session's own eventfd comes last (`Conn::attached`).
    fds.push(efd.as_fd());
    if usnet_shm::fdpass::send_with_fds(&out, &bytes, &fds).is_err() {
        let _ = ctx.call_on(home, move |lp| lp.remove_session(id));
        return None;
    }
    ctx.homes().of.insert(id, home);
    out.set_nonblocking(true).ok()?;
    Some(Attached {
        stream: out,
        id,
        pin: None,
        pinned: 0,
        shard: home,
    })
}

/// The session geometry a client gets for what it asked (`cap`: the server's), and
/// whether it asked for more than the caps. Asking for more is not an error: the
/// client gets the caps (they are in its session header) and the cut is counted
/// (`quota_geometry`). Without asking it gets 1024 sockets with 256 KiB rings (or
/// the caps, if smaller).
pub fn granted_geometry(
    req: &msg::Attach,
    cap: usnet_session_abi::Geometry,
) -> (usnet_session_abi::Geometry, bool) {
    let mut g = cap;
    let mut cut = false;
    let want_sockets = req.max_sockets.unwrap_or(1024).max(1);
    // Only what the client asked for can be cut.
    cut |= req.max_sockets.is_some() && want_sockets > cap.max_sockets as u64;
    g.max_sockets = want_sockets.min(cap.max_sockets as u64) as u32;
    g.ring_bytes = match req.ring_bytes {
        Some(r) if r.is_power_of_two() && (4096..=cap.ring_bytes as u64).contains(&r) => r as u32,
        Some(r) => {
            cut |= r > cap.ring_bytes as u64;
            cap.ring_bytes.min(256 * 1024)
        }
        None => cap.ring_bytes.min(256 * 1024),
    };
    (g, cut)
}

fn request(out: &mut UnixStream, req: Request, ctx: &Ctx) -> io::Result<()> {
    match req {
        Request::Stat => {
            let info = Arc::new((
                ctx.cfg.name.clone(),
                ctx.cfg.link.clone(),
                ctx.cfg.services.clone(),
            ));
            let parts = ctx.call_all(move |lp| stat(lp, &info.0, &info.1, &info.2));
            let merged = parts
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .and_then(|v| Stat::merge(v, STAT_MAX_CONNECTIONS));
            match merged {
                Some(s) => send(out, &s),
                None => send(out, &no_answer()),
            }
        }
        Request::Clients => {
            let parts = ctx.call_all(|lp| lp.clients());
            match parts.into_iter().collect::<Option<Vec<_>>>() {
                Some(v) => send(out, &Clients::merge(v)),
                None => send(out, &no_answer()),
            }
        }
        Request::Ping(p) => ping(out, &p, ctx),
        Request::Stop => {
            send(out, &Done::OK)?;
            let _ = ctx.call(|lp| lp.stop());
            Ok(())
        }
        // Answered where the connection is read (`handle`).
        Request::Attach(_)
        | Request::Pin(_)
        | Request::Claim(_)
        | Request::ZcPort(_)
        | Request::Netlink(_) => Ok(()),
    }
}

fn no_answer() -> Refusal {
    Refusal {
        error: NO_ANSWER.into(),
    }
}

/// Everything `usnet stat` shows, from one shard's loop.
fn stat(lp: &mut Loop, name: &str, link: &str, services: &[String]) -> Stat {
    let dev = lp.driver.device_stats();
    let link_state = lp.driver.link_state();
    let device = lp.driver.device().name().to_string();
    let uptime_s = lp.started.elapsed().as_secs_f64();
    let clients = lp.clients();
    let sessions_closed = lp.sessions_closed;
    let sessions_broken = lp.sessions_broken;
    let (shared, pins) = lp.fork_counts();
    let quota_sessions = lp.quota_sessions;
    let limits = lp.cfg.limits;
    let geometry = lp.cfg.geometry;
    let boosted_now = lp.driver.booster().map(|b| b.boosted()).unwrap_or_default();
    let s = lp.stack();
    let prio = s.prio_status();
    let p = s.pool().stats();
    let (live, slots) = s.socket_count();
    let conns = s.tcp_connections();
    Stat {
        name: name.into(),
        link: link.into(),
        device,
        pid: std::process::id(),
        uptime_s,
        link_state: format!("{link_state:?}").to_lowercase(),
        mac: s.mac().to_string(),
        mtu: s.mtu() as u64,
        addrs: s.addrs().iter().map(|a| a.to_string()).collect(),
        services: services.to_vec(),
        counters: s
            .counters_snapshot()
            .entries()
            .into_iter()
            .map(|(n, _, v)| (n.to_string(), v))
            .collect(),
        priority: msg::Priority {
            forced_drop: prio.forced_drop,
            priority: prio.priority,
            set_size: prio.set_size as u64,
            members: prio
                .members
                .iter()
                .map(|m| msg::PrioMember {
                    handle: m.handle,
                    port: m.port,
                    priority: m.priority,
                    owner: m.owner,
                    pid: m.pid,
                })
                .collect(),
            ports: prio.ports,
            forced_drop_active: prio.forced_drop_active,
            boosted: prio.boosted,
            boosted_now,
        },
        device_counters: dev
            .named()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        pool: msg::PoolStat {
            buf_size: s.pool().buf_size() as u64,
            count: s.pool().count() as u64,
            in_use: p.in_use as u64,
            peak_in_use: p.peak_in_use as u64,
            allocs: p.allocs,
            exhausted: p.exhausted,
        },
        neighbors: s
            .neighbors()
            .iter()
            .map(|(ip, mac)| msg::Neighbor {
                ip: ip.to_string(),
                mac: mac.map(|m| m.to_string()),
            })
            .collect(),
        clients,
        sessions_closed,
        sessions_broken,
        shared_sockets: shared as u64,
        fork_pins: pins
            .into_iter()
            .map(|(session, n)| msg::ForkPin {
                session,
                sockets: n as u64,
                shard: None,
            })
            .collect(),
        quota_sessions,
        limits: msg::Limits {
            max_clients: limits.max_sessions as u64,
            client_sockets: geometry.max_sockets,
            ring_bytes: geometry.ring_bytes,
            max_backlog: limits.max_backlog as u64,
            max_rcvbuf: limits.max_rcvbuf as u64,
            max_pool_bufs: u64::from(s.rx_owner_limit().unwrap_or(0)),
        },
        sockets: msg::SocketCount {
            live: live as u64,
            slots: slots as u64,
        },
        tcp_listeners: s
            .tcp_listeners()
            .iter()
            .map(|l| msg::Listener {
                local: l.local.to_string(),
                owner: l.owner.0,
                syn_queue: l.syn_queue as u64,
                accept_queue: l.accept_queue as u64,
                shard: None,
            })
            .collect(),
        tcp_connections_total: conns.len() as u64,
        tcp_connections: conns
            .iter()
            .take(STAT_MAX_CONNECTIONS)
            .map(|c| msg::Connection {
                local: c.local.to_string(),
                remote: c.remote.to_string(),
                owner: c.owner.0,
                state: format!("{:?}", c.info.state),
                orphan: c.orphan,
                srtt_us: c.info.srtt.map(|d| d.as_micros() as u64),
                min_rtt_us: c.info.min_rtt.map(|d| d.as_micros() as u64),
                rto_ms: c.info.rto.as_millis() as u64,
                cwnd: c.info.cwnd,
                ssthresh: c.info.ssthresh,
                mss: c.info.snd_mss,
                in_flight: c.info.bytes_in_flight,
                retransmits: c.info.total_retransmits,
                congestion: c.info.congestion.to_string(),
                recv_q: c.info.recv_queued as u64,
                send_q: c.info.send_queued as u64,
                shard: None,
            })
            .collect(),
        shards: Vec::new(),
    }
}

/// `usnet ping` from the server's own stack: an echo socket in the loop, polled from
/// this thread; round-trip times come from the stack's clock (send and receive times).
fn ping(out: &mut UnixStream, req: &msg::Ping, ctx: &Ctx) -> io::Result<()> {
    let dst = req.dst;
    let count = req.count.min(1_000_000);
    let interval = Duration::from_millis(req.interval_ms);
    let size = req.size.min(65_000) as usize;
    let timeout = Duration::from_millis(req.timeout_ms);
    let Some(h) = ctx.call(|lp| lp.stack().ping_open()) else {
        return send(out, &no_answer());
    };
    let (mut sent, mut received) = (0u64, 0u64);
    let result = (|| -> io::Result<()> {
        for i in 0..count {
            let seq = (i + 1) as u16;
            let t0 = Instant::now();
            let payload = vec![0x5au8; size];
            let r = ctx.call(move |lp| {
                // The clock now, not the stack's last turn (the loop may have slept).
                let at = lp.driver.now();
                lp.stack().advance(at);
                lp.stack().ping_send(h, dst, seq, &payload).map(|()| at)
            });
            match r {
                Some(Ok(at)) => {
                    sent += 1;
                    let reply = loop {
                        if t0.elapsed() > timeout {
                            break None;
                        }
                        let got = ctx.call(move |lp| lp.stack().ping_recv(h).ok()).flatten();
                        match got {
                            Some(r) if r.seq == seq => break Some(r),
                            Some(_) => continue, // a late reply to an earlier request
                            None => std::thread::sleep(Duration::from_micros(200)),
                        }
                    };
                    match reply {
                        Some(r) => {
                            received += 1;
                            let rtt = r.at.saturating_since(at);
                            send(
                                out,
                                &PingEvent::Reply {
                                    seq,
                                    from: r.from,
                                    bytes: r.len as u64 + 8,
                                    ttl: r.hop_limit,
                                    rtt_us: rtt.as_secs_f64() * 1e6,
                                },
                            )?;
                        }
                        None => send(out, &PingEvent::Timeout { seq, timeout: true })?,
                    }
                }
                Some(Err(e)) => send(
                    out,
                    &PingEvent::Failed {
                        seq,
                        error: e.to_string(),
                    },
                )?,
                None => return send(out, &no_answer()),
            }
            if i + 1 < count {
                std::thread::sleep(interval.saturating_sub(t0.elapsed()));
            }
        }
        Ok(())
    })();
    let _ = ctx.call(move |lp| lp.stack().close(h));
    result?;
    send(
        out,
        &PingEvent::Done {
            done: true,
            sent,
            received,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nobody_answers_on_is_removed_and_a_live_one_stays() {
        let dir = std::env::temp_dir().join(format!("usnet-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let live = dir.join("live.ctl");
        let dead = dir.join("dead.ctl");
        let _l = UnixListener::bind(&live).unwrap();
        drop(UnixListener::bind(&dead).unwrap());
        assert!(!remove_if_stale(&live));
        assert!(live.exists());
        assert!(remove_if_stale(&dead));
        assert!(!dead.exists());
        assert!(remove_if_stale(&dir.join("absent.ctl")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_sweep_removes_dead_control_and_rpc_sockets_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("usnet-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _live = UnixListener::bind(dir.join("live.ctl")).unwrap();
        let _live_rpc = UnixListener::bind(dir.join("live.rpc")).unwrap();
        for dead in ["dead.ctl", "dead.rpc", "dead.other", "young.ctl"] {
            drop(UnixListener::bind(dir.join(dead)).unwrap());
        }
        std::fs::write(dir.join("plain.ctl"), "not a socket").unwrap();
        // All but young.ctl made older than the sweep's age (as a killed stack's
        // sockets are by the time the next one starts).
        for name in [
            "live.ctl",
            "live.rpc",
            "dead.ctl",
            "dead.rpc",
            "dead.other",
            "plain.ctl",
        ] {
            let c = std::ffi::CString::new(dir.join(name).into_os_string().into_encoded_bytes())
                .unwrap();
            let old = libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 0,
            };
            // SAFETY: a NUL-terminated path and two valid timespecs.
            let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [old, old].as_ptr(), 0) };
            assert_eq!(r, 0);
        }
        sweep_stale(&dir);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        // A dead socket younger than the sweep's age may be a starting stack's,
        // bound but not yet listening: it stays.
        assert_eq!(
            left,
            [
                "dead.other",
                "live.ctl",
                "live.rpc",
                "plain.ctl",
                "young.ctl"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn cap() -> usnet_session_abi::Geometry {
        usnet_session_abi::Geometry {
            max_sockets: 64,
            ring_bytes: 1 << 20,
            ..Default::default()
        }
    }

    fn ask(max_sockets: Option<u64>, ring_bytes: Option<u64>) -> (u32, u32, bool) {
        let req = msg::Attach {
            max_sockets,
            ring_bytes,
            ..Default::default()
        };
        let (g, cut) = granted_geometry(&req, cap());
        (g.max_sockets, g.ring_bytes, cut)
    }

    #[test]
    fn a_client_gets_what_it_asks_within_the_caps_and_a_cut_is_told() {
        assert_eq!(ask(None, None), (64, 256 << 10, false), "the defaults");
        assert_eq!(ask(Some(8), Some(8192)), (8, 8192, false));
        assert_eq!(ask(Some(0), None).0, 1, "at least one socket");
        assert_eq!(ask(Some(u64::MAX), Some(u64::MAX)), (64, 256 << 10, true));
        assert_eq!(
            ask(None, Some(2 << 20)),
            (64, 256 << 10, true),
            "past the cap"
        );
        // Not a power of two, or below a page: the default, and no cut (it did not
        // ask for more than the caps).
        assert_eq!(ask(None, Some(5000)), (64, 256 << 10, false));
        assert_eq!(ask(None, Some(1024)), (64, 256 << 10, false));
    }
}
