//! `exec`: sockets without `FD_CLOEXEC` live on in the program that `execve`,
//! `posix_spawn`, `system` or `popen` starts, as on the kernel.
//!
//! Nothing runs at the `exec` itself (glibc's spawn path calls its internal execve,
//! which no shim can see), so everything the new program needs is in what the
//! kernel keeps across `exec`, its descriptors:
//!
//! - **The control connections** of the layer's sessions (and of fork pins) are made
//!   without close-on-exec ([`attach_options`]) and are named by their abstract
//!   Unix addresses (`usnet_client::lineage`). The server does not see the session
//!   end at `exec`, since the new program holds the connection.
//! - **Each socket's number** is a kernel socket stamped with the socket's *tag*
//!   ([`tag`]: a marker bit, the domain, and a number unique in the process;
//!   [`number_socket`]) and whose O_NONBLOCK is the socket's. The same tag is in
//!   the socket's slot (`usnet_session_abi::slot::TAG`), where the server can read
//!   it.
//!
//! The new program (the shim's constructor, before `main`) calls [`inherit`]: it
//! finds the control connections and the tagged numbers it holds, asks the server
//! over one connection (a pin's if it has one: a forked child that exec'd before
//! its first socket call; else a session's: its own from before `exec`, or its
//! parent's after `posix_spawn`) to pin that session's sockets and give them to a
//! new session of its own, and puts each socket back under every number whose
//! socket carries its tag. Sockets it has no number for (they were close-on-exec)
//! are closed in its session; then it closes the inherited connections, so a parent
//! that exits later is seen to go.
//!
//! What does not survive: the options the layer keeps for itself (`Opts`: what
//! `getsockopt` reports back; the stack keeps what it applied), and epoll sets
//! (kernel epoll instances are inherited, but their usnet members are the layer's).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;

use usnet_client::lineage::{self, Kind};
use usnet_client::{
    AttachOptions, Claimed, Client, Socket, SocketKind, TcpListener, TcpStream, UdpSocket,
};

use crate::{lock, new_desc, Obj, CLIENT};

/// Set in every tag.
const TAG_MARK: u32 = 1 << 31;
/// Set in the tag of an AF_INET6 socket.
const TAG_INET6: u32 = 1 << 30;
const TAG_NUMBER: u32 = TAG_INET6 - 1;

/// A new tag for a socket of `domain`.
pub(crate) fn tag(domain: i32) -> u32 {
    // Numbers start somewhere an inherited tag is unlikely to be (a tag is only
    // looked for among this process's descriptors), then count up.
    static SEED: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = *SEED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ std::process::id().rotate_left(16))
            .unwrap_or(0)
    });
    let n = seed.wrapping_add(NEXT.fetch_add(1, Relaxed));
    let inet6 = if domain == libc::AF_INET6 {
        TAG_INET6
    } else {
        0
    };
    TAG_MARK | inet6 | (n & TAG_NUMBER)
}

/// O_NONBLOCK of a socket's number follows the socket's own (read after `exec`).
pub(crate) fn mirror_nonblock(fd: RawFd, nb: bool) {
    // SAFETY: fcntl on a descriptor the table holds; no memory arguments.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            let want = if nb {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            libc::fcntl(fd, libc::F_SETFL, want);
        }
    }
}

/// How the layer attaches: connections that survive `exec`, and room for as many
/// sockets as the process may open descriptors ([`session_sockets`]).
pub(crate) fn attach_options() -> AttachOptions {
    AttachOptions {
        inheritable: true,
        max_sockets: Some(session_sockets()),
        // `usnet run --shard K`.
        shard: std::env::var("USNET_SHARD")
            .ok()
            .and_then(|v| v.parse().ok()),
        ..AttachOptions::default()
    }
}

/// A session's fewest sockets (what a client that asks for nothing gets) and most
/// (the stack's default quota per client, `usnet up --client-sockets`).
const SESSION_SOCKETS: std::ops::RangeInclusive<u64> =
    1024..=usnet_session_abi::DEFAULT_CLIENT_SOCKETS as u64;

/// The sockets a session of this process has room for: its descriptor limit
/// (`RLIMIT_NOFILE`'s soft value when it attaches) within [`SESSION_SOCKETS`].
/// On the kernel a program may hold as many sockets as it may open descriptors;
/// each usnet socket's number is a kernel descriptor too, so the limit binds here
/// as it does there and a session larger than it would go unused. A server that
/// raises its limit before its first socket (redis, nginx's
/// `worker_rlimit_nofile`, the JVM) gets the room; one left at the usual 1,024
/// gets the session it always had. (Raised after the first socket, the limit is
/// not followed: a session does not grow.)
pub(crate) fn session_sockets() -> u32 {
    let soft = usnet_client::kernel_rlimit(libc::RLIMIT_NOFILE).map_or(0, |l| l.rlim_cur);
    soft.clamp(*SESSION_SOCKETS.start(), *SESSION_SOCKETS.end()) as u32
}

static REFUSAL: Mutex<Option<String>> = Mutex::new(None);

/// Notes, in words a user can act on, why attaching to `stack` failed.
pub(crate) fn say_refused(stack: Option<&str>, e: &std::io::Error) {
    let name = stack.unwrap_or("(the only running stack)");
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let why = match e.kind() {
        std::io::ErrorKind::PermissionDenied => format!(
            "the stack {name} refused this process (uid {uid}, {e}): its control socket admits \
             the user who started `usnet up`, root, and the group given with `usnet up --group`; \
             run the program as that user or start the stack with --group, or make the first \
             socket before dropping privileges (a process forked from one that is attached \
             keeps its parent's right)"
        ),
        std::io::ErrorKind::NotFound => format!(
            "no running stack {name} in {} ({e}); is `usnet up` running? A process that \
             changed its uid looks in its own run directory: set USNET_RUN_DIR",
            usnet_session::ctl::run_dir().display()
        ),
        _ => format!("cannot attach to the stack {name} ({e}); is `usnet up` running?"),
    };
    *lock(&REFUSAL) = Some(why);
}

/// Why the last attach failed, in a line a user can act on.
pub fn attach_refusal() -> Option<String> {
    lock(&REFUSAL).clone()
}

/// The high half of the `SO_MAX_PACING_RATE` of a socket's number; the low half is
/// the tag. A program's own sockets keep the kernel's default (no limit, all ones)
/// or a real rate, far below this.
const STAMP: u64 = 0x7573_6e74 << 32; // "usnt"

/// A kernel socket to hold a usnet socket's number: a Unix socket of the same type
/// (`SOCK_STREAM` or `SOCK_DGRAM`), never bound or connected, stamped with `tag` in
/// a value that survives `dup`, `fork`, `exec` and `SCM_RIGHTS` as the socket does.
/// `fstat`, a raw `statx` and a raw `getsockopt(SO_TYPE)` then say what the program
/// made; the calls that name the family (`getsockname`, `SO_DOMAIN`) come to the
/// shim. A Unix socket rather than an AF_INET one because a write the shim cannot see
/// (glibc's stdio writes with its internal `write`) fails there with `ENOTCONN`,
/// where an unconnected TCP socket raises `SIGPIPE` and kills the program. Made with
/// raw system calls, past any shim.
pub(crate) fn number_socket(
    stype: i32,
    cloexec: bool,
    nonblock: bool,
    tag: u32,
) -> std::io::Result<OwnedFd> {
    let ty = stype
        | if nonblock { libc::SOCK_NONBLOCK } else { 0 }
        | if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    // SAFETY: socket(2) has no memory arguments; a non-negative result is a new
    // descriptor this process owns.
    let fd = unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX, ty, 0) } as RawFd;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just returned by the kernel, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let v: u64 = STAMP | u64::from(tag);
    // SAFETY: setsockopt reads `size_of::<u64>()` bytes from `v`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &v as *const u64,
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if r < 0 && std::env::var("USNET_DEBUG").is_ok_and(|v| v == "1") {
        // The socket still works; only `exec` and `SCM_RIGHTS` cannot find it.
        eprintln!(
            "usnet: cannot stamp a socket's number ({}): it is not carried across exec",
            std::io::Error::last_os_error()
        );
    }
    Ok(fd)
}

/// The tagged numbers among this process's descriptors: tag → numbers.
fn tagged_descriptors() -> HashMap<u32, Vec<RawFd>> {
    let mut out: HashMap<u32, Vec<RawFd>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else {
            continue;
        };
        if let Some(c) = tag_of(fd) {
            out.entry(c).or_default().push(fd);
        }
    }
    out
}

/// The tag of `fd`, if it is a socket stamped as one of our numbers
/// ([`number_socket`]).
pub(crate) fn tag_of(fd: RawFd) -> Option<u32> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v` and its length into `len`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &mut v as *mut u64,
            &mut len as *mut libc::socklen_t,
        )
    };
    if r < 0 || len as usize != std::mem::size_of::<u64>() || v & !0xffff_ffff != STAMP {
        return None;
    }
    Some(v as u32).filter(|c| c & TAG_MARK != 0)
}

/// Held across `posix_spawn`, `system` and `popen` (see [`pin_for_spawn`]).
pub struct SpawnPin(#[allow(dead_code)] Option<usnet_client::ForkPin>);

/// Before a call that starts a program without running fork handlers
/// (`posix_spawn`, and `system` and `popen`, which glibc builds on it): pins every
/// socket of this process's session, as a fork does, for the program to claim.
/// Without it, a parent that closes its copy right after the call returns (a server
/// handing a connection over) could close the socket before the new program has
/// asked for it. The pin's connection survives the `exec` in the child; the caller
/// drops this (its own copy) when the call has returned. Nothing to pin without
/// usnet sockets.
pub fn pin_for_spawn() -> SpawnPin {
    crate::fork::own_session();
    let any = !crate::read_table(|t| t.is_empty());
    let c = CLIENT.with(|c| c.clone()).filter(|c| any && c.is_alive());
    SpawnPin(c.and_then(|c| c.pin_for_fork().ok()))
}

/// At a program's start (the shim calls it before `main`): takes over the sockets
/// it inherited across `exec`; see the module's text. Does nothing else in a program
/// that inherited no control connection, but install the fork handlers: installed
/// this early, before the handlers installed after `main` starts, the prepare
/// handler runs after those and the child's and parent's before them, so the
/// locks it holds across the fork are held as briefly as can be (fork.rs).
pub fn inherit() {
    crate::fork::register();
    usnet_client::lineage::as_layer(inherit_now);
}

fn inherit_now() {
    // SAFETY: called once, before `main`: no other code of the program uses the
    // control connections' numbers (they are the layer's).
    let found = unsafe { lineage::inherited() };
    if found.is_empty() {
        return;
    }
    let tags = tagged_descriptors();
    let me = std::process::id();
    // A pin first (a forked child that exec'd before attaching), then this
    // process's own session from before the exec, then a parent's (after vfork).
    // A connection that cannot answer (a pin already claimed) gives way to the next.
    let mut order: Vec<&lineage::Inherited> = found.iter().collect();
    order.sort_by_key(|f| match (f.kind, f.pid == me) {
        (Kind::Pin, _) => 0,
        (Kind::Session, true) => 1,
        (Kind::Session, false) => 2,
    });
    if !tags.is_empty() {
        let mut last = None;
        for from in order {
            match Client::inherit(from, &attach_options()) {
                Ok((client, claimed)) => {
                    adopt(client, claimed, &tags);
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            eprintln!(
                "usnet: the {} usnet socket(s) this program inherited are lost: {e}",
                tags.len()
            );
        }
    }
    // The connections go: a pin claimed (or not wanted), a parent's session copy.
    drop(found);
}

fn adopt(client: Client, claimed: Vec<Claimed>, tags: &HashMap<u32, Vec<RawFd>>) {
    install(&client, claimed, tags);
    CLIENT.with(|c| *c = Some(client));
    crate::fork::register();
}

/// Puts each socket `client` claimed under every number of `tags` (tagged
/// number sockets this process holds and nothing else knows of) carrying its tag; the
/// slots of those it has no number for are closed.
pub(crate) fn install(client: &Client, claimed: Vec<Claimed>, tags: &HashMap<u32, Vec<RawFd>>) {
    let olds = crate::write_table(|t| {
        // Sockets this process holds already (passed away and back): the server
        // names the slot the session has, and the numbers name the socket as dups.
        let held = crate::by_tag(t);
        let mut olds = Vec::new();
        for c in claimed {
            if let Some(d) = held.get(&c.tag) {
                let fds = tags.get(&c.tag).map_or(&[][..], |v| v.as_slice());
                olds.extend(crate::number_as_dups(t, d, fds));
                continue;
            }
            let Some(fds) = tags.get(&c.tag).filter(|_| c.tag & TAG_MARK != 0) else {
                client.close_slot(c.slot);
                continue;
            };
            let domain = if c.tag & TAG_INET6 != 0 {
                libc::AF_INET6
            } else {
                libc::AF_INET
            };
            // SAFETY: fcntl on an inherited descriptor; no memory arguments.
            let nb = unsafe { libc::fcntl(fds[0], libc::F_GETFL) } & libc::O_NONBLOCK != 0;
            let made = match c.role {
                usnet_session_abi::role::LISTENER => {
                    TcpListener::inherited(client, c.slot).map(|l| {
                        l.set_exec_tag(c.tag);
                        (Obj::Listener(l), libc::SOCK_STREAM)
                    })
                }
                usnet_session_abi::role::CONN => TcpStream::inherited(client, c.slot).map(|s| {
                    s.set_exec_tag(c.tag);
                    let _ = s.set_nonblocking(nb);
                    (Obj::Stream(s), libc::SOCK_STREAM)
                }),
                usnet_session_abi::role::UDP => UdpSocket::inherited(client, c.slot).map(|u| {
                    u.set_exec_tag(c.tag);
                    let _ = u.set_nonblocking(nb);
                    let ty = if u.is_raw() {
                        libc::SOCK_RAW
                    } else {
                        libc::SOCK_DGRAM
                    };
                    (Obj::Udp(u), ty)
                }),
                usnet_session_abi::role::FRESH => {
                    Socket::inherited(client, c.slot, SocketKind::Tcp).map(|s| {
                        s.set_exec_tag(c.tag);
                        (Obj::Fresh(s), libc::SOCK_STREAM)
                    })
                }
                _ => {
                    client.close_slot(c.slot);
                    continue;
                }
            };
            let Ok((obj, stype)) = made else {
                client.close_slot(c.slot);
                continue;
            };
            let desc = new_desc(obj, domain, stype, nb, c.tag);
            olds.extend(crate::number_as_dups(t, &desc, fds));
        }
        olds
    });
    drop(olds);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_carry_the_mark_and_the_domain_and_differ() {
        let a = tag(libc::AF_INET);
        let b = tag(libc::AF_INET6);
        let c = tag(libc::AF_INET);
        assert_ne!(a & TAG_MARK, 0);
        assert_eq!(a & TAG_INET6, 0);
        assert_ne!(b & TAG_INET6, 0);
        assert_ne!(a, c);
    }

    #[test]
    fn a_number_is_a_socket_of_its_kind_found_by_its_tag() {
        let t = tag(libc::AF_INET6);
        let n = number_socket(libc::SOCK_DGRAM, true, false, t).unwrap();
        let fd = n.as_raw_fd();
        // SAFETY: fstat writes into `st`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFSOCK);
        let found = tagged_descriptors();
        assert_eq!(found.get(&t), Some(&vec![fd]));
        // A program's own socket carries no tag, and neither does a pipe.
        let own = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(tag_of(own.as_raw_fd()), None);
        let (r, _w) = std::io::pipe().unwrap();
        assert_eq!(tag_of(r.as_raw_fd()), None);
        // A dup carries it too.
        let d = n.try_clone().unwrap();
        assert_eq!(tag_of(d.as_raw_fd()), Some(t));
    }
}
