//! The control socket of a stack server: `usnet stat`, `usnet ping`, `usnet down` and
//! `usnet clients` talk to it, and every client attaches through it. A client keeps
//! its connection open for as long as it is attached: when the connection breaks (the
//! process exited or was killed), the server resets and frees everything the client
//! held. Only the stack's owner (or a member of the group given at start) may connect:
//! the socket is mode 0600 (0660 with a group) and every peer's credentials are
//! checked.
//!
//! Requests (one JSON line): `{"cmd":"attach","pid":P,"command":"name"}` (answered
//! with the session memfd, the server page and, for a stack on an fd-based link, the
//! server's eventfd, passed with SCM_RIGHTS), `{"cmd":"stat"}`, `{"cmd":"clients"}`,
//! `{"cmd":"ping",...}` and `{"cmd":"stop"}`.
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
//!   tag is the parent's `usnet_abi::slot::TAG`, the role a `usnet_abi::role`).
//!   Only the family knows the token: it came over a descriptor only they hold.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_session::ctl::{run_dir, socket_path, valid_name};
use usnet_session::Session;

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
    ) -> Result<ControlServer, ControlError> {
        if !valid_name(&cfg.name) {
            return Err(ControlError::BadName(cfg.name.clone()));
        }
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        let path = socket_path(&cfg.name);
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(ControlError::NameInUse(cfg.name.clone()));
            }
            // A stale socket left by a stack that died.
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)?;
        let mode = if cfg.group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if let Some(gid) = cfg.group {
            std::os::unix::fs::chown(&path, None, Some(gid))?;
        }
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = Ctx {
            links: Arc::new(links),
            cfg: cfg.clone(),
            next_id: Arc::new(AtomicU32::new(1)),
            homes: Arc::new(Mutex::new(Homes::default())),
        };
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("usnet-control".into())
            .spawn(move || serve(listener, ctx, stop2))?;
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
    /// The session's shard, or the pin's.
    shard: usize,
}

fn serve(listener: UnixListener, ctx: Ctx, stop: Arc<AtomicBool>) {
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
                Said::Pin(channel) => {
                    let a = &attached[k - 1];
                    let from = (a.id, a.pin, a.shard);
                    if let Some(a) = pin(channel, from, &ctx) {
                        attached.push(a);
                    }
                }
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
    /// `pin`, with the channel to answer on.
    Pin(UnixStream),
    Attach(Value),
}

fn read_request(s: &UnixStream) -> Said {
    let mut buf = [0u8; 4096];
    match usnet_shm::fdpass::recv_with_fds(s, &mut buf) {
        Ok((0, _)) => Said::Gone,
        Ok((n, fds)) => {
            let Ok(req) = serde_json::from_slice::<Value>(buf[..n].trim_ascii_end()) else {
                return Said::Nothing;
            };
            let mut fds = fds.into_iter();
            match (req["cmd"].as_str(), fds.next(), fds.next()) {
                (Some("pin"), Some(channel), None) => Said::Pin(UnixStream::from(channel)),
                (Some("attach"), None, None) => Said::Attach(req),
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
fn pin(mut out: UnixStream, from: (u32, Option<u128>, usize), ctx: &Ctx) -> Option<Attached> {
    out.set_nonblocking(false).ok()?;
    out.set_write_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let (session, held, shard) = from;
    if session == 0 {
        // A pin's holder (a forked child, or what it exec'd) asks for its token.
        let Some(token) = held else {
            let _ = send(&mut out, &json!({"error": "this connection holds no pin"}));
            return None;
        };
        let n = ctx.call_on(shard, move |lp| lp.pin_size(token)).flatten();
        let Some(n) = n else {
            let _ = send(&mut out, &json!({"error": "the pin is gone"}));
            return None;
        };
        let reply = json!({"ok": true, "token": format!("{token:032x}"), "sockets": n});
        send(&mut out, &reply).ok()?;
        out.set_nonblocking(true).ok()?;
        return Some(Attached {
            stream: out,
            id: 0,
            pin: None,
            shard,
        });
    }
    let token = match random_token() {
        Ok(t) => t,
        Err(e) => {
            let _ = send(&mut out, &json!({"error": format!("no random token: {e}")}));
            return None;
        }
    };
    match ctx.call_on(shard, move |lp| lp.pin(session, token)) {
        Some(Some(n)) => {
            let reply = json!({"ok": true, "token": format!("{token:032x}"), "sockets": n});
            if send(&mut out, &reply).is_err() {
                let _ = ctx.call_on(shard, move |lp| lp.drop_pin(token));
                return None;
            }
            out.set_nonblocking(true).ok()?;
            Some(Attached {
                stream: out,
                id: 0,
                pin: Some(token),
                shard,
            })
        }
        Some(None) => {
            let _ = send(&mut out, &json!({"error": "no such session"}));
            None
        }
        None => {
            let _ = send(
                &mut out,
                &json!({"error": "the server loop does not answer"}),
            );
            None
        }
    }
}

/// A zero-copy port for a session (`usnet_abi::zc`): only from the session's own
/// process, of the stack's own user or root (the port maps the whole packet pool),
/// on a server started with `zero_copy`. Answered with the pool's memfd and the
/// port's area; the port lives as long as the session.
fn zc_port(mut out: UnixStream, req: &Value, ctx: &Ctx) {
    let refuse = |out: &mut UnixStream, e: &str| {
        let _ = send(out, &json!({ "error": e }));
    };
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
    let Some(session) = req["session"].as_u64().map(|v| v as u32) else {
        return refuse(&mut out, "zc_port needs a session");
    };
    let slots = |k: &str| {
        req[k]
            .as_u64()
            .unwrap_or(256)
            .min(usnet_abi::zc::MAX_SLOTS as u64) as u32
    };
    let g = usnet_abi::zc::Geometry {
        rx_slots: slots("rx_slots"),
        tx_slots: slots("tx_slots"),
        stash_slots: slots("stash_slots"),
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
        None => return refuse(&mut out, "the server loop does not answer"),
    };
    let mut bytes = serde_json::to_string(&json!({"ok": true}))
        .expect("json")
        .into_bytes();
    bytes.push(b'\n');
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
            let _ = send(&mut s, &json!({"error": "permission denied"}));
            return None;
        }
    }
    let mut line = String::new();
    {
        let mut reader = BufReader::new(stream.try_clone().ok()?);
        reader.read_line(&mut line).ok()?;
    }
    let mut out = stream;
    let req: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            let _ = send(&mut out, &json!({"error": format!("bad request: {e}")}));
            return None;
        }
    };
    if req["cmd"].as_str() == Some("attach") {
        return attach(out, &req, 0, ctx);
    }
    if req["cmd"].as_str() == Some("zc_port") {
        zc_port(out, &req, ctx);
        return None;
    }
    let ctx = ctx.clone();
    std::thread::spawn(move || {
        let _ = request(&mut out, &req, &ctx);
    });
    None
}

fn send(out: &mut UnixStream, v: &Value) -> io::Result<()> {
    let mut s = serde_json::to_string(v).expect("json");
    s.push('\n');
    out.write_all(s.as_bytes())
}

/// Attaches a client (`pin_shard`: where the pin it claims lives, if it claims one).
/// A fresh client's home shard is the one it asks for (`"shard"`, modulo the count),
/// else the next in turn; a forked child's is its
/// parent's, unless it took only listeners: such children (a pre-forking server's
/// workers) are spread over the shards starting from the parent's, each holding
/// the listener's copy on its own shard, so each worker accepts what its shard
/// receives.
fn attach(mut out: UnixStream, req: &Value, pin_shard: usize, ctx: &Ctx) -> Option<Attached> {
    out.set_nonblocking(false).ok()?;
    out.set_write_timeout(Some(REQUEST_TIMEOUT)).ok()?;
    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
    // The kernel's word for who connected, the request's if it has none.
    let pid = peer_pid(&out).unwrap_or(req["pid"].as_u64().unwrap_or(0) as u32);
    let claim = match req["claim"].as_str() {
        Some(t) => match u128::from_str_radix(t, 16) {
            Ok(t) => Some(t),
            Err(_) => {
                let _ = send(&mut out, &json!({"error": "bad fork token"}));
                return None;
            }
        },
        None => None,
    };
    let command: String = req["command"]
        .as_str()
        .unwrap_or("?")
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    // The server's geometry is the most a client may ask for; without asking it
    // gets 1024 sockets with 256 KiB rings (or the caps, if smaller).
    let cap = ctx.cfg.geometry;
    let mut g = cap;
    // Asking for more than the caps is not an error: the client gets the caps (they
    // are in its session header) and the cut is counted (`quota_geometry`).
    let mut cut = false;
    let want_sockets = req["max_sockets"].as_u64().unwrap_or(1024).max(1);
    cut |= want_sockets > cap.max_sockets as u64;
    g.max_sockets = want_sockets.min(cap.max_sockets as u64) as u32;
    g.ring_bytes = match req["ring_bytes"].as_u64() {
        Some(r) if r.is_power_of_two() && (4096..=cap.ring_bytes as u64).contains(&r) => r as u32,
        Some(r) => {
            cut |= r > cap.ring_bytes as u64;
            cap.ring_bytes.min(256 * 1024)
        }
        None => cap.ring_bytes.min(256 * 1024),
    };
    let fail = |out: &mut UnixStream, e: String| {
        let _ = send(out, &json!({"error": e}));
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
    let max = limits.max_sessions;
    let n = ctx.links.len();
    let (home, remote) = match claim {
        // A client that asks for a shard gets it.
        None if req["shard"].is_u64() => (req["shard"].as_u64().unwrap_or(0) as usize % n, false),
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
        None => return fail(&mut out, "the server loop does not answer".into()),
    };
    let bell = &ctx.links[home].bell;
    let mut reply = json!({
        "ok": true,
        "session": id,
        "shard": home,
        "bell_kind": bell.page().bell_kind(),
        "pid": std::process::id(),
    });
    if let Some(map) = slots {
        reply["slots"] = map
            .iter()
            .map(|c| json!(c.words()))
            .collect::<Vec<_>>()
            .into();
    }
    let mut bytes = serde_json::to_string(&reply).expect("json").into_bytes();
    bytes.push(b'\n');
    let page = bell.page().region().fd();
    let mut fds = vec![mem.region().fd(), page];
    if let Some(e) = bell.eventfd() {
        fds.push(e);
    }
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
        shard: home,
    })
}

fn request(out: &mut UnixStream, req: &Value, ctx: &Ctx) -> io::Result<()> {
    match req["cmd"].as_str() {
        Some("stat") => {
            let info = Arc::new((
                ctx.cfg.name.clone(),
                ctx.cfg.link.clone(),
                ctx.cfg.services.clone(),
            ));
            let parts = ctx.call_all(move |lp| stat(lp, &info.0, &info.1, &info.2));
            match parts.into_iter().collect::<Option<Vec<_>>>() {
                Some(v) => send(out, &merge_stats(v)),
                None => send(out, &json!({"error": "the server loop does not answer"})),
            }
        }
        Some("clients") => {
            let parts = ctx.call_all(|lp| lp.clients());
            match parts.into_iter().collect::<Option<Vec<_>>>() {
                Some(v) => send(out, &json!({ "clients": tag_rows(v) })),
                None => send(out, &json!({"error": "the server loop does not answer"})),
            }
        }
        Some("ping") => ping(out, req, ctx),
        Some("stop") => {
            send(out, &json!({"ok": true}))?;
            let _ = ctx.call(|lp| lp.stop());
            Ok(())
        }
        other => send(out, &json!({"error": format!("unknown command {other:?}")})),
    }
}

/// Rows from each shard (in shard order) as one list, each row with its shard.
fn tag_rows(parts: Vec<Vec<Value>>) -> Vec<Value> {
    if parts.len() == 1 {
        return parts.into_iter().flatten().collect();
    }
    let mut rows: Vec<Value> = parts
        .into_iter()
        .enumerate()
        .flat_map(|(k, v)| tagged(v, k))
        .collect();
    rows.sort_by_key(|r| r["id"].as_u64());
    rows
}

/// `rows`, each with `"shard": k`.
fn tagged(rows: Vec<Value>, k: usize) -> impl Iterator<Item = Value> {
    rows.into_iter().map(move |mut r| {
        r["shard"] = k.into();
        r
    })
}

/// Adds `b`'s numbers into `a`'s, key by key (objects of counters).
fn add_numbers(a: &mut Value, b: &Value) {
    let (Some(a), Some(b)) = (a.as_object_mut(), b.as_object()) else {
        return;
    };
    for (k, v) in b {
        match (a.get_mut(k), v.as_u64()) {
            (Some(x), Some(y)) => *x = (x.as_u64().unwrap_or(0) + y).into(),
            (None, Some(y)) => {
                a.insert(k.clone(), y.into());
            }
            _ => {}
        }
    }
}

/// One `stat` from every shard's: totals (counters, pool, sockets, clients,
/// listeners and connections, each row with its shard) and, for a sharded server,
/// a row per shard.
fn merge_stats(parts: Vec<Value>) -> Value {
    let mut it = parts.into_iter();
    let Some(mut all) = it.next() else {
        return json!({"error": "no shards"});
    };
    let rest: Vec<Value> = it.collect();
    if rest.is_empty() {
        return all;
    }
    let shard_row = |k: usize, v: &Value| {
        let c = &v["counters"];
        json!({
            "shard": k,
            "clients": v["clients"].as_array().map_or(0, |a| a.len()),
            "tcp_connections": v["tcp_connections_total"],
            "pool_in_use": v["pool"]["in_use"],
            "rx_frames": v["device_counters"]["rx_frames"],
            "tx_frames": v["device_counters"]["tx_frames"],
            "handoff_out": c["shard_handoff_out"],
            "handoff_in": c["shard_handoff_in"],
            "redirected": c["shard_redirected"],
            "every_copies": c["shard_every_copies"],
        })
    };
    let mut rows = vec![shard_row(0, &all)];
    let tag = |list: &Value, k: usize| -> Vec<Value> {
        tagged(list.as_array().cloned().unwrap_or_default(), k).collect()
    };
    let mut lists: Vec<(&str, Vec<Value>)> =
        ["clients", "tcp_listeners", "tcp_connections", "fork_pins"]
            .iter()
            .map(|&key| (key, tag(&all[key], 0)))
            .collect();
    for (k, v) in rest.iter().enumerate() {
        let k = k + 1;
        rows.push(shard_row(k, v));
        for key in ["counters", "device_counters", "pool", "sockets"] {
            let add = v[key].clone();
            add_numbers(&mut all[key], &add);
        }
        for key in [
            "tcp_connections_total",
            "sessions_closed",
            "sessions_broken",
            "shared_sockets",
            "quota_sessions",
        ] {
            all[key] = (all[key].as_u64().unwrap_or(0) + v[key].as_u64().unwrap_or(0)).into();
        }
        for (key, list) in lists.iter_mut() {
            list.extend(tag(&v[*key], k));
        }
    }
    for (key, mut list) in lists {
        if key == "clients" {
            list.sort_by_key(|r| r["id"].as_u64());
        }
        if key == "tcp_connections" {
            list.truncate(STAT_MAX_CONNECTIONS);
        }
        all[key] = list.into();
    }
    // A pool's buffer size is not a sum.
    all["pool"]["buf_size"] = rest[0]["pool"]["buf_size"].clone();
    all["shards"] = rows.into();
    all
}

/// Everything `usnet stat` shows, as JSON.
fn stat(lp: &mut Loop, name: &str, link: &str, services: &[String]) -> Value {
    let dev = lp.driver.device_stats();
    let link_state = lp.driver.link_state();
    let device = lp.driver.device().name().to_string();
    let uptime = lp.started.elapsed().as_secs_f64();
    let clients = lp.clients();
    let closed = lp.sessions_closed;
    let broken = lp.sessions_broken;
    let (shared, pins) = lp.fork_counts();
    let quota_sessions = lp.quota_sessions;
    let limits = lp.cfg.limits;
    let geometry = lp.cfg.geometry;
    let boosted = lp.driver.booster().map(|b| b.boosted()).unwrap_or_default();
    let s = lp.stack();
    let mut priority = serde_json::to_value(s.prio_status()).expect("status serialises");
    // What the scheduler hook holds (the stack's view is `boosted`).
    priority["boosted_now"] = boosted.into();
    let p = s.pool().stats();
    json!({
        "name": name,
        "link": link,
        "device": device,
        "pid": std::process::id(),
        "uptime_s": uptime,
        "link_state": format!("{link_state:?}").to_lowercase(),
        "mac": s.mac().to_string(),
        "mtu": s.mtu(),
        "addrs": s.addrs().iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "services": services,
        "counters": serde_json::to_value(s.counters_snapshot()).expect("counters serialise"),
        "priority": priority,
        "device_counters": dev.named().into_iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect::<serde_json::Map<_, _>>(),
        "pool": {
            "buf_size": s.pool().buf_size(), "count": s.pool().count(),
            "in_use": p.in_use, "peak_in_use": p.peak_in_use,
            "allocs": p.allocs, "exhausted": p.exhausted,
        },
        "neighbors": s.neighbors().iter().map(|(ip, mac)| json!({
            "ip": ip.to_string(),
            "mac": mac.map(|m| m.to_string()),
        })).collect::<Vec<_>>(),
        "clients": clients,
        "sessions_closed": closed,
        "sessions_broken": broken,
        "shared_sockets": shared,
        "fork_pins": pins,
        "quota_sessions": quota_sessions,
        "limits": {
            "max_clients": limits.max_sessions,
            "client_sockets": geometry.max_sockets,
            "ring_bytes": geometry.ring_bytes,
            "max_backlog": limits.max_backlog,
            "max_rcvbuf": limits.max_rcvbuf,
        },
        "sockets": {"live": s.socket_count().0, "slots": s.socket_count().1},
        "tcp_listeners": s.tcp_listeners().iter().map(|l| json!({
            "local": l.local.to_string(),
            "owner": l.owner.0,
            "syn_queue": l.syn_queue,
            "accept_queue": l.accept_queue,
        })).collect::<Vec<_>>(),
        "tcp_connections_total": s.tcp_connections().len(),
        "tcp_connections": s.tcp_connections().iter().take(STAT_MAX_CONNECTIONS).map(|c| json!({
            "local": c.local.to_string(),
            "remote": c.remote.to_string(),
            "owner": c.owner.0,
            "state": format!("{:?}", c.info.state),
            "orphan": c.orphan,
            "srtt_us": c.info.srtt.map(|d| d.as_micros() as u64),
            "rto_ms": c.info.rto.as_millis() as u64,
            "cwnd": c.info.cwnd,
            "ssthresh": c.info.ssthresh,
            "mss": c.info.snd_mss,
            "in_flight": c.info.bytes_in_flight,
            "retransmits": c.info.total_retransmits,
            "congestion": c.info.congestion,
            "recv_q": c.info.recv_queued,
            "send_q": c.info.send_queued,
        })).collect::<Vec<_>>(),
    })
}

/// `usnet ping` from the server's own stack: an echo socket in the loop, polled from
/// this thread; round-trip times come from the stack's clock (send and receive times).
fn ping(out: &mut UnixStream, req: &Value, ctx: &Ctx) -> io::Result<()> {
    let dst: IpAddr = match req["dst"].as_str().and_then(|s| s.parse().ok()) {
        Some(d) => d,
        None => return send(out, &json!({"error": "ping needs an IP address"})),
    };
    let count = req["count"].as_u64().unwrap_or(4).min(1_000_000);
    let interval = Duration::from_millis(req["interval_ms"].as_u64().unwrap_or(1000));
    let size = req["size"].as_u64().unwrap_or(56).min(65_000) as usize;
    let timeout = Duration::from_millis(req["timeout_ms"].as_u64().unwrap_or(2000));
    let Some(h) = ctx.call(|lp| lp.stack().ping_open()) else {
        return send(out, &json!({"error": "the server loop does not answer"}));
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
                                &json!({
                                    "seq": seq, "from": r.from.to_string(), "bytes": r.len + 8,
                                    "ttl": r.hop_limit,
                                    "rtt_us": rtt.as_secs_f64() * 1e6,
                                }),
                            )?;
                        }
                        None => send(out, &json!({"seq": seq, "timeout": true}))?,
                    }
                }
                Some(Err(e)) => send(out, &json!({"seq": seq, "error": e.to_string()}))?,
                None => return send(out, &json!({"error": "the server loop does not answer"})),
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
        &json!({"done": true, "sent": sent, "received": received}),
    )
}
