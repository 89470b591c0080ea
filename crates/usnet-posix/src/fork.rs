//! `fork`: a session per process, sockets shared through the server.
//!
//! A child must not use its parent's session: the rings are single-producer,
//! single-consumer, and the parent's client state (tags, cached counters, locks) was
//! copied at the fork. So:
//!
//! - **Before the fork** (the `pthread_atfork` prepare handler, an ordinary context
//!   in the forking thread): if this process has a session, it asks the server to pin
//!   every socket of it for the child (`Client::pin_for_fork`). The pin is a
//!   control connection (close-on-exec) and a random token, kept in a thread-local.
//!   Pinning before the fork matters: a parent that closes its copy right after
//!   forking (a fork-per-connection server) must not take the socket away from the
//!   child, which may not have run yet.
//! - **Right after it**, in the parent: drop its copy of the pin connection. In the
//!   child: only an atomic store (the "forked" flag) and moving the pin from the
//!   thread-local to a global, with `try_lock`. Nothing else: in a multi-threaded
//!   parent, any lock another thread held at the fork (the descriptor table's, a
//!   socket's, the session's) stays held forever in the child, and POSIX allows only
//!   async-signal-safe calls there.
//! - **The child's first usnet call** (any call that looks up a usnet descriptor, or
//!   makes a socket), in an ordinary context, attaches a session of its own with the
//!   pin's token: the server gives it a slot for each pinned socket. Every descriptor
//!   of the table is rebuilt over the new slots (under the same numbers; the
//!   parent's objects are disowned and never post anything), epoll sets re-register
//!   their usnet sockets, pinned sockets that no descriptor names any more are
//!   closed, and the parent's session is abandoned (its memory unmapped once nothing
//!   refers to it). Locks are only tried there: a descriptor whose lock a parent's
//!   thread held at the fork becomes a failed socket in the child.
//! - **The table, the session's lock and the client's list of its own descriptors
//!   (`lineage`) are held across the fork** by the forking
//!   thread (taken in the prepare handler, let go in the parent's and the child's):
//!   otherwise another thread in the middle of a socket call at that instant leaves
//!   them held forever in the child, whose rebuild then cannot happen (its sockets
//!   stay on the parent's abandoned session and fail with `ENETDOWN`) and whose next
//!   new socket waits forever for the table. Taking them waits a bounded time: the
//!   forking thread may itself be in a socket call (a fork from a signal handler),
//!   and then the fork goes on without them.
//! - **A child of a single-threaded process attaches at once**, in the child
//!   handler (no other thread can have held a lock at the fork): a child may lock
//!   itself in before its first socket call (sshd's privilege-separated child:
//!   chroot, one descriptor, a seccomp filter), where an attach would fail.
//! - A child that never makes a usnet call (it exits) never attaches: its pin
//!   connection closes with it and the server lets the pinned sockets go, as the
//!   kernel would close the child's copies. One that execs passes the pin (or its
//!   session) on to the new program (see `exec`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::*};
use std::sync::{Arc, Mutex, Once, RwLock};
use std::time::{Duration, Instant};

use usnet_client::{Client, ForkPin};

use crate::{lock, poll, table, Desc, Entry, Obj, CLIENT};

/// Set in a child by the fork handler; cleared once it has its own session.
static FORKED: AtomicBool = AtomicBool::new(false);
/// One thread of a child attaches; the others wait for it.
static ADOPT: Mutex<()> = Mutex::new(());
/// The pin the child claims.
static CHILD_PIN: Mutex<Option<ForkPin>> = Mutex::new(None);
static REGISTER: Once = Once::new();
/// The process had one thread when it last forked (see `child`).
static SINGLE_THREADED: AtomicBool = AtomicBool::new(false);

/// How long the prepare handler waits for a lock to hold across the fork.
const HOLD_WAIT: Duration = Duration::from_millis(500);

thread_local! {
    /// The pin made by this thread's fork (the handlers run in the forking thread).
    static PIN: RefCell<Option<ForkPin>> = const { RefCell::new(None) };
    /// This thread is the one attaching the child's session.
    static ADOPTING: Cell<bool> = const { Cell::new(false) };
}

/// The process this layer's memory belongs to (0: not known yet). Set at the
/// program's start and in a forked child.
static OWNER: AtomicI32 = AtomicI32::new(0);

fn note_owner() {
    // SAFETY: getpid has no preconditions and cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Relaxed);
}

/// This process runs in the memory of the process the layer serves without being
/// it: a child of `clone` with `CLONE_VM` (a `vfork`-style child, such as one a
/// spawn library makes with `CLONE_VM | CLONE_VFORK`) before its `exec`. Its
/// descriptor table is its own, the layer's table and sessions are its parent's:
/// the descriptor calls it makes (closing what the new program is not to have,
/// moving numbers with `dup2`, `FD_CLOEXEC`) go to the kernel alone, which changes
/// the child's numbers, and the tagged numbers it keeps are what the new program
/// takes over (`exec`). Through the layer they would close or renumber the parent's
/// sockets. (A plain `vfork` is made a `fork` by the shim, so the fork handlers
/// pin the sockets for the program it starts.) One `getpid`; asked only by the
/// calls that close or renumber a descriptor.
pub fn in_vfork_child() -> bool {
    let owner = OWNER.load(Relaxed);
    // SAFETY: getpid has no preconditions and cannot fail.
    owner != 0 && owner != unsafe { libc::getpid() }
}

/// Installs the fork handlers (once, at the first attach).
pub(crate) fn register() {
    REGISTER.call_once(|| {
        note_owner();
        // SAFETY: three `extern "C"` functions that live as long as the process.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

extern "C" fn prepare() {
    usnet_client::lineage::as_layer(prepare_now);
}

fn prepare_now() {
    // A child that forks again before any usnet call attaches first: it pins its
    // own session's sockets, never its parent's.
    own_session();
    // The session's lock first, as `adopt` takes them: held while pinning, so no
    // other thread attaches or replaces the session meanwhile. Then the table and
    // the client's list of its own descriptors, all let go by `release_held`.
    let client = within(|| CLIENT.try_hold())
        .then(|| CLIENT.with(|c| c.clone()))
        .flatten()
        .filter(|c| c.is_alive());
    if let Some(c) = client {
        SINGLE_THREADED.store(threads() == 1, Relaxed);
        match c.pin_for_fork() {
            Ok(pin) => PIN.with(|p| *p.borrow_mut() = Some(pin)),
            Err(e) => {
                if std::env::var("USNET_DEBUG").is_ok_and(|v| v == "1") {
                    eprintln!("usnet: fork: the child will not have the sockets ({e})");
                }
            }
        }
    }
    within(|| table().try_hold());
    within(|| usnet_client::lineage::OWN.try_hold());
}

/// Tries `hold` until it holds or [`HOLD_WAIT`] passes. Other threads hold these
/// locks for a lookup or an insert; only this thread's own (a fork from a signal
/// handler inside a socket call) can last, and must not hang the fork.
fn within(mut hold: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + HOLD_WAIT;
    loop {
        if hold() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::yield_now();
    }
}

/// Lets go of the locks held across the fork (in the parent, and in the child:
/// unlocking is an atomic store and perhaps a futex wake, safe after a fork). The
/// reverse of the order they were taken in.
fn release_held() {
    usnet_client::lineage::OWN.release();
    table().release();
    CLIENT.release();
}

extern "C" fn parent() {
    usnet_client::lineage::as_layer(parent_now);
}

fn parent_now() {
    // The parent's copy of the pin connection: the child holds the pin now.
    // First: closing the pin's connection passes through the shim's `close`, which
    // reads the table.
    release_held();
    let pin = PIN.with(|p| p.borrow_mut().take());
    drop(pin);
}

extern "C" fn child() {
    usnet_client::lineage::as_layer(child_now);
}

fn child_now() {
    note_owner();
    release_held();
    FORKED.store(true, Release);
    let pin = PIN.with(|p| p.borrow_mut().take());
    let pinned = pin.is_some();
    if let Ok(mut g) = CHILD_PIN.try_lock() {
        *g = pin;
    } else {
        std::mem::forget(pin);
    }
    // The child of a single-threaded process can attach right here: no other
    // thread held a lock at the fork. It must, for children that lock themselves
    // in before their first socket call (sshd's privilege-separated child chroots,
    // drops to one descriptor and installs a seccomp filter that forbids the
    // socketpair an attach needs).
    if pinned && SINGLE_THREADED.load(Relaxed) {
        own_session();
    }
}

/// A process made by a call that runs no fork handlers: a raw `clone` or `clone3`
/// without `CLONE_VM` (vsftpd's per-connection child, namespace tools), or
/// `syscall(SYS_fork)`. Its child is a copy of this process as after `fork`, and
/// would go on with the parent's session (whose rings have one producer each), so
/// the caller runs this layer's fork handlers around it: [`RawFork::begin`] before
/// the call, then [`RawFork::parent`] or [`RawFork::child`].
#[must_use = "the parent's or the child's handler lets go of what begin holds"]
pub struct RawFork {
    /// The handlers are installed (the process has attached), so they run.
    armed: bool,
}

impl RawFork {
    /// The prepare handler, where `fork` would run it.
    pub fn begin() -> RawFork {
        let armed = REGISTER.is_completed();
        if armed {
            prepare();
        }
        RawFork { armed }
    }

    /// In the parent, after the call whatever it returned (a failed call runs the
    /// parent's handler too, as `fork`'s does).
    pub fn parent(self) {
        if self.armed {
            parent();
        }
    }

    /// In the child, before it runs anything of the program's.
    pub fn child(self) {
        if self.armed {
            child();
        }
    }
}

/// The process's thread count (`/proc/self/task`), 0 if unknown.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Called by every entry point: in a child that has not attached yet, attach now.
pub(crate) fn own_session() {
    if !FORKED.load(Acquire) || ADOPTING.with(|a| a.get()) {
        return;
    }
    let _g = lock(&ADOPT);
    if !FORKED.load(Acquire) {
        return;
    }
    ADOPTING.with(|a| a.set(true));
    adopt();
    ADOPTING.with(|a| a.set(false));
    FORKED.store(false, Release);
}

fn adopt() {
    let pin = CHILD_PIN.try_lock().ok().and_then(|mut g| g.take());
    let Some(mut current) = CLIENT.try_lock() else {
        return;
    };
    if let Some(old) = current.take() {
        old.abandon();
    }
    let (new, map) = match pin {
        Some(p) => match Client::claim(p, &crate::exec::attach_options()) {
            Ok((c, m)) => (Some(c), m),
            Err(e) => {
                if std::env::var("USNET_DEBUG").is_ok_and(|v| v == "1") {
                    eprintln!("usnet: fork: the child cannot attach ({e})");
                }
                (None, Vec::new())
            }
        },
        None => (None, Vec::new()),
    };
    let Some(mut t) = table().try_write() else {
        *current = new;
        return;
    };
    let (olds, unused) = rebuild(&mut t, new.as_ref(), map);
    drop(t);
    drop(olds);
    close_unused(new.as_ref(), unused);
    *current = new;
}

/// The process raised its descriptor limit (`setrlimit`, `prlimit`) past the room
/// its session has: its sockets move into a session sized for the new limit, as a
/// forked child takes its parent's (pinned, claimed, every descriptor rebuilt
/// under its number over the new slots), and the old session is let go, which the
/// server treats as a holder leaving: what its send rings held goes out, what its
/// receive rings held goes to the new slots. Only in a process of one thread
/// (another could be inside a call on a socket that moves), and not in a child
/// that has not attached yet (it attaches sized for the new limit). Programs that
/// raise their limit after their first socket: HAProxy after it binds, an nginx
/// worker (`worker_rlimit_nofile`) after its fork. Returns whether it moved.
pub fn grow_session() -> bool {
    own_session();
    if in_vfork_child() {
        return false;
    }
    let want = crate::exec::session_sockets();
    let Some(old) = CLIENT
        .with(|c| c.clone())
        .filter(|c| c.is_alive() && c.max_sockets() < want)
    else {
        return false;
    };
    if threads() != 1 {
        return false;
    }
    let _g = lock(&ADOPT);
    let debug = std::env::var("USNET_DEBUG").is_ok_and(|v| v == "1");
    let claimed = old
        .pin_for_fork()
        .and_then(|pin| Client::claim(pin, &crate::exec::attach_options()));
    let (new, map) = match claimed {
        Ok(x) => x,
        Err(e) => {
            if debug {
                eprintln!(
                    "usnet: the session stays at {} sockets ({e})",
                    old.max_sockets()
                );
            }
            return false;
        }
    };
    if debug {
        eprintln!(
            "usnet: the descriptor limit rose: the session grows from {} to {} sockets",
            old.max_sockets(),
            new.max_sockets()
        );
    }
    CLIENT.with(|current| {
        let (olds, unused) = table().write(|t| rebuild(t, Some(&new), map));
        // The old objects were disowned (they post nothing).
        drop(olds);
        close_unused(Some(&new), unused);
        *current = Some(new);
    });
    // The last reference to the old session: its control connection closes.
    drop(old);
    true
}

/// Rebuilds every descriptor of `t` over the slots `map` gave `new` for the old
/// session's (a failed socket where there is none), epoll sets last. Returns the
/// old entries and the claimed slots no descriptor names, both for after the
/// table's lock is let go (dropping an entry may close a descriptor, and a close
/// comes back through the shim, which reads the table; see [`close_unused`]).
fn rebuild(
    t: &mut Table,
    new: Option<&Client>,
    map: Vec<usnet_client::Claimed>,
) -> (Vec<Arc<Entry>>, Vec<u32>) {
    let map: HashMap<u32, u32> = map.into_iter().map(|c| (c.parent_slot, c.slot)).collect();
    let mut used = HashSet::new();
    let mut fds: Vec<RawFd> = t.keys().copied().collect();
    fds.sort_unstable();
    let mut sets = Vec::new();
    let mut olds = Vec::new();
    // Numbers that were dup'd from one another share the new description too.
    let mut made: HashMap<*const Desc, Arc<Desc>> = HashMap::new();
    for fd in fds {
        let old = t.get(&fd).cloned().expect("listed");
        // Epoll sets come last: they look their sockets up in the rebuilt table.
        let made_now = described(&mut made, &old, |o| match o {
            Obj::Epoll(_) => None,
            o => Some(remake(o, old.tag, new, &map, &mut used)),
        });
        let Some(desc) = made_now else {
            sets.push(fd);
            continue;
        };
        olds.extend(t.insert(fd, Arc::new(renumbered(&old, fd, desc))));
    }
    for fd in sets {
        let old = t.get(&fd).cloned().expect("listed");
        let desc = described(&mut made, &old, |o| {
            Some(match o {
                Obj::Epoll(set) => Obj::Epoll(poll::forked(set, t)),
                _ => Obj::Failed,
            })
        })
        .expect("always made");
        olds.extend(t.insert(fd, Arc::new(renumbered(&old, fd, desc))));
    }
    let unused = map.into_values().filter(|s| !used.contains(s)).collect();
    (olds, unused)
}

/// Closes the claimed slots no descriptor names (after the table's lock is let
/// go: a post may write to the server's eventfd through the shim, which reads
/// the table).
fn close_unused(c: Option<&Client>, unused: Vec<u32>) {
    if let Some(c) = c {
        for slot in unused {
            c.close_slot(slot);
        }
    }
}

/// The child's object for a parent's one: over the claimed slot, or failed.
fn remake(
    o: &Obj,
    tag: u32,
    c: Option<&Client>,
    map: &HashMap<u32, u32>,
    used: &mut HashSet<u32>,
) -> Obj {
    let mut slot_for = |parent: u32| {
        let j = *map.get(&parent)?;
        used.insert(j);
        Some((c?, j))
    };
    // The child's slot carries the socket's tag too, for an `exec` of its own.
    let r = match o {
        Obj::Fresh(s) => {
            s.disown();
            slot_for(s.fork_slot())
                .and_then(|(c, j)| s.forked(c, j).ok())
                .map(|s| {
                    s.set_exec_tag(tag);
                    Obj::Fresh(s)
                })
        }
        Obj::Listener(l) => {
            l.disown();
            slot_for(l.fork_slot())
                .and_then(|(c, j)| l.forked(c, j).ok())
                .map(|l| {
                    l.set_exec_tag(tag);
                    Obj::Listener(l)
                })
        }
        Obj::Stream(s) => {
            s.disown();
            slot_for(s.fork_slot())
                .and_then(|(c, j)| s.forked(c, j).ok())
                .map(|s| {
                    s.set_exec_tag(tag);
                    Obj::Stream(s)
                })
        }
        Obj::Udp(u) => {
            u.disown();
            slot_for(u.fork_slot())
                .and_then(|(c, j)| u.forked(c, j).ok())
                .map(|u| {
                    u.set_exec_tag(tag);
                    Obj::Udp(u)
                })
        }
        _ => None,
    };
    r.unwrap_or(Obj::Failed)
}

/// A new entry under the same number naming `desc`; the old one keeps the number
/// open when it goes.
fn renumbered(old: &Entry, fd: RawFd, desc: Arc<Desc>) -> Entry {
    old.keep_number.store(true, Relaxed);
    // SAFETY: `fd` is the number the old entry held and no longer closes; the new
    // entry owns it from here.
    crate::numbered(unsafe { OwnedFd::from_raw_fd(fd) }, desc)
}

/// The child's description for `old`'s, made once for all the numbers that were
/// dup'd from one another (`made`, by the parent's description): `make` builds its
/// object from the parent's (`None`: not now). A description whose lock a parent's
/// thread held at the fork gets a failed socket.
fn described(
    made: &mut HashMap<*const Desc, Arc<Desc>>,
    old: &Entry,
    make: impl FnOnce(&Obj) -> Option<Obj>,
) -> Option<Arc<Desc>> {
    let key = Arc::as_ptr(&old.desc);
    if let Some(d) = made.get(&key) {
        return Some(d.clone());
    }
    let obj = match old.obj.try_read() {
        Ok(o) => make(&o)?,
        Err(_) => Obj::Failed,
    };
    let d = redescribed(old, obj);
    made.insert(key, d.clone());
    Some(d)
}

/// The child's description for a parent's one, around `obj`.
fn redescribed(old: &Desc, obj: Obj) -> Arc<Desc> {
    Arc::new(Desc {
        obj: RwLock::new(obj),
        domain: old.domain,
        stype: old.stype,
        nonblock: AtomicBool::new(old.nonblocking()),
        error: AtomicI32::new(old.error.load(Relaxed)),
        opts: Mutex::new(old.opts.try_lock().map(|o| o.clone()).unwrap_or_default()),
        // The settings, not the watch: the process that set O_ASYNC signals.
        sigio: Mutex::new(old.sigio.try_lock().map(|s| *s).unwrap_or_default()),
        tag: old.tag,
    })
}

/// For the table's users: the entries by number (epoll's rebuild looks them up).
pub(crate) type Table = HashMap<RawFd, Arc<Entry>>;
