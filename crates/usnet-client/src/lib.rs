//! Use a usnet stack server from another process. `Client::attach("usnet0")` (or
//! [`Client::from_env`], reading `USNET_STACK`) connects to a running `usnet up` and
//! maps a session; [`TcpListener`], [`TcpStream`] and [`UdpSocket`] are shaped like
//! std's (blocking `Read`/`Write`, non-blocking mode, timeouts, options, `tcp_info`)
//! and like `usnet-runtime`'s in-process types, so code moves between the two by
//! changing the line that gets the stack; [`Poller`] waits on many sockets at once
//! (register, modify, deregister; level- or edge-triggered).
//!
//! Calls that change a socket (socket, bind, listen, accept, connect, close, options)
//! travel as requests through the session's submission ring; bytes do not: a write
//! copies into the socket's send ring in shared memory and a read copies out of its
//! receive ring, and the server moves them between the rings and its TCP/UDP engine.
//! Readiness is read from the socket's slot, where the server keeps it current. Any
//! thread may use any socket. When the server dies, every blocked or later call fails
//! with `ENETDOWN` within a fraction of a second.

mod conn;
mod fdsend;
pub mod forklock;
pub mod lineage;
mod lockorder;
mod mixed;
pub mod msgzc;
mod net;
mod poll;
pub mod signal;
mod sock;
mod socket;
mod tcp;
mod udp;
pub mod vtime;
pub mod zc;

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use usnet_session::ctl::{resolve, ControlError};

pub use conn::{default_session_bytes, kernel_rlimit};
pub use net::ClientNet;
pub use poll::{Event, Interest, Mode, Poller, Source, Token};
pub use sock::dont_wait;
pub use socket::{Socket, SocketKind};
pub use tcp::{IpHeader, TcpInfo, TcpListener, TcpStream, TxTimestamp};
pub use udp::{IcmpErrorReport, RecvMeta, SendMeta, UdpSocket};
pub use zc::{ZcOptions, ZcPort, ZcSlot};

use conn::Conn;

/// An attached session with a stack server; cloning gives another handle to it.
#[derive(Clone)]
pub struct Client {
    conn: Arc<Conn>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("stack", &self.conn.stack_name)
            .field("session", &self.conn.mem.id())
            .finish()
    }
}

/// A fork pin (see [`Client::pin_for_fork`]): its connection.
pub struct ForkPin {
    stream: UnixStream,
    /// Sockets pinned: the child asks for room for them besides its usual quota.
    sockets: u32,
    path: std::path::PathBuf,
    name: String,
}

impl ForkPin {
    /// The pin's connection (what goes with passed descriptors).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }
}

impl std::os::fd::AsFd for ForkPin {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

impl std::fmt::Debug for ForkPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkPin")
            .field("stack", &self.name)
            .field("fd", &std::os::fd::AsRawFd::as_raw_fd(&self.stream))
            .finish()
    }
}

/// Options of an attach.
#[derive(Debug, Clone, Default)]
pub struct AttachOptions {
    /// Bytes per socket ring (a power of two; the server's size is the most).
    pub ring_bytes: Option<u32>,
    /// Sockets this client may hold at once (the server's quota is the most).
    pub max_sockets: Option<u32>,
    /// The fewest sockets the session may have when it is made smaller to fit the
    /// process's address-space limit (a forked child's pinned sockets and one).
    pub min_sockets: Option<u32>,
    /// The control connections (the session's, and fork pins') are made without
    /// close-on-exec, so that a program this process `exec`s or spawns can take over
    /// the sockets it inherits ([`Client::inherit`]); the BSD socket layer sets it.
    /// Off, the session ends at `exec`.
    pub inheritable: bool,
    /// On a sharded server, the shard to live on (modulo the shard count); `None`:
    /// the server's choice, the next in turn.
    pub shard: Option<u32>,
}

/// A socket a claim gave this session (see [`Client::claim`], [`Client::inherit`]).
pub use usnet_session_abi::Claimed;

impl Client {
    /// Attaches to the stack named `name` (`usnet up --name`, or the interface name).
    pub fn attach(name: &str) -> io::Result<Client> {
        Self::attach_with(Some(name), &AttachOptions::default())
    }

    /// Attaches to the stack named in `USNET_STACK`, or to the only one running.
    pub fn from_env() -> io::Result<Client> {
        let name = std::env::var("USNET_STACK").ok();
        Self::attach_with(name.as_deref(), &AttachOptions::default())
    }

    pub fn attach_with(name: Option<&str>, opts: &AttachOptions) -> io::Result<Client> {
        let path = resolve(name).map_err(|e| match e {
            ControlError::Io(e) => e,
            e => io::Error::new(io::ErrorKind::NotFound, e.to_string()),
        })?;
        let label = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let conn = Conn::attach(&path, &label, opts)?;
        Ok(Client::over(conn))
    }

    fn over(conn: Conn) -> Client {
        let conn = Arc::new(conn);
        let weak = Arc::downgrade(&conn);
        vtime::watch(move || weak.upgrade().map(|c| c.ring_own_bell()).is_some());
        Client { conn }
    }

    /// Bytes of this process's address space the session's memory takes.
    pub fn mapped_bytes(&self) -> usize {
        self.conn.mem.region().len()
    }

    /// Sockets the session has room for.
    pub fn max_sockets(&self) -> u32 {
        self.conn.mem.geometry().max_sockets
    }

    /// The session's number at the server (shown by `usnet stat`).
    pub fn session_id(&self) -> u32 {
        self.conn.mem.id()
    }

    /// The stack's network interface (name, index, MAC, MTU, addresses), as the
    /// program should see it; None from a server that does not say.
    pub fn iface(&self) -> Option<&usnet_session::ctl::msg::Iface> {
        self.conn.iface.as_ref()
    }

    /// Wakes every thread of this process that waits on the session (on its bell
    /// or in `poll(2)` with kernel descriptors), as a change from the server would:
    /// each looks at what it waits for again.
    pub fn wake_waiters(&self) {
        self.conn.ring_own_bell();
    }

    /// Sleeps until `kernel` has events, a thread of this process calls
    /// [`Client::wake_waiters`], the server rings the session, or `timeout`
    /// passes: one `poll(2)` on `kernel` and the session's eventfd. Fills
    /// `kernel`'s `revents`; returns how many have events.
    pub fn sleep_with_kernel(
        &self,
        kernel: &mut [libc::pollfd],
        timeout: std::time::Duration,
    ) -> std::io::Result<usize> {
        self.conn.sleep_with_kernel(kernel, timeout, || false)
    }

    /// A `socket(AF_NETLINK, ty, protocol)` made in the stack's interface mirror
    /// (`usnet_server::mirror`), so rtnetlink tells the program about the stack's
    /// interface. Fails (`ENOENT` if the stack has no mirror) when the caller
    /// should make the kernel's own instead.
    pub fn netlink_socket(&self, ty: i32, protocol: i32) -> io::Result<std::os::fd::OwnedFd> {
        self.conn.netlink_socket(ty, protocol)
    }

    /// A process inside the stack's interface mirror (its `/proc/PID/net` lists
    /// the stack's interface), if the stack has one.
    pub fn mirror_pid(&self) -> Option<u32> {
        (self.conn.mirror_pid != 0).then_some(self.conn.mirror_pid)
    }

    /// Whether the server is still there.
    pub fn is_alive(&self) -> bool {
        !self.conn.is_dead()
    }

    /// Before a `fork`: pins every socket of this session at the server for the
    /// child, which then attaches with [`Client::claim`]. The pin lives while any
    /// copy of its connection is open (close-on-exec): the parent drops its copy
    /// right after the fork; a child that exits or execs without attaching drops the
    /// pin, and its share of the sockets with it.
    pub fn pin_for_fork(&self) -> io::Result<ForkPin> {
        let (stream, _token, sockets) = self.conn.pin()?;
        Ok(ForkPin {
            stream,
            sockets,
            path: self.conn.path.clone(),
            name: self.conn.stack_name.clone(),
        })
    }

    /// Before passing sockets of this session (its slots `slots`) to another process
    /// with `SCM_RIGHTS`: pins them at the server for the receiver, which takes them
    /// with [`Client::take_passed`]. The pin's connection goes with the descriptors
    /// and lives while any copy of it is open, so the sockets outlive the sender's own
    /// close while the message is in flight, and a message never received (its copy
    /// closed with the socket that queued it) lets them go.
    pub fn pin_for_passing(&self, slots: &[u32]) -> io::Result<ForkPin> {
        let (stream, _token, sockets) = self.conn.pin_slots(slots)?;
        Ok(ForkPin {
            stream,
            sockets,
            path: self.conn.path.clone(),
            name: self.conn.stack_name.clone(),
        })
    }

    /// In the receiver of sockets passed with `SCM_RIGHTS`: this session takes the
    /// sockets of the pin whose connection `pin` came with them. What each one
    /// became here (its `tag` names it among the received descriptors).
    pub fn take_passed(&self, pin: &UnixStream) -> io::Result<Vec<Claimed>> {
        let (_answer, token, _) =
            Conn::ask_pin(pin, lineage::Kind::Pin, &self.conn.stack_name, false)?;
        self.conn.claim_pin(&token)
    }

    /// In a forked child: attaches a session of its own that holds the sockets of
    /// `pin` too, asked for on the pin's own connection (so a child that dropped
    /// its privileges after the fork still can). Returns the client and what it got
    /// for each pinned socket: see `forked` on the socket types.
    pub fn claim(pin: ForkPin, opts: &AttachOptions) -> io::Result<(Client, Vec<Claimed>)> {
        let r = Self::claim_over(&pin.stream, pin.sockets, &pin.path, &pin.name, opts);
        drop(pin);
        r
    }

    /// In a program started by `exec` (or `posix_spawn`) from a client: takes over
    /// the sockets of the control connection `from` that it inherited (a session's,
    /// or a fork pin's), in a session of its own. Which of them it still has a
    /// descriptor for, it tells by their tags ([`Claimed::tag`]); the caller closes
    /// the slots of the others. `from` can be closed afterwards.
    pub fn inherit(
        from: &lineage::Inherited,
        opts: &AttachOptions,
    ) -> io::Result<(Client, Vec<Claimed>)> {
        let path = usnet_session::ctl::socket_path(&from.stack);
        Self::claim_over(&from.stream, 0, &path, &from.stack, opts)
    }

    fn claim_over(
        over: &std::os::unix::net::UnixStream,
        pinned: u32,
        path: &std::path::Path,
        name: &str,
        opts: &AttachOptions,
    ) -> io::Result<(Client, Vec<Claimed>)> {
        // The server gives the session room for the pinned sockets too.
        // (An exec's claim does not know how many: the server gives that room.)
        let mut opts = opts.clone();
        if pinned > 0 {
            let want = opts.max_sockets.unwrap_or(1024);
            opts.max_sockets = Some(want.max(pinned.saturating_add(1024)));
            opts.min_sockets = Some(pinned.saturating_add(1));
        }
        let (conn, map) = Conn::attach_claiming(over, path, name, &opts)?;
        Ok((Client::over(conn), map))
    }

    /// In a forked child: this (the parent's) session is never used again from
    /// here. Sockets of it fail with `ENETDOWN`; nothing reaches the server or the
    /// parent's rings.
    pub fn abandon(&self) {
        self.conn.abandon();
    }

    /// Closes the socket at `slot` of this session without an object for it (a
    /// claimed socket no descriptor of the child names).
    #[doc(hidden)]
    pub fn close_slot(&self, slot: u32) {
        let _ = self.conn.post(
            usnet_session_abi::Request {
                op: usnet_session_abi::op::CLOSE,
                slot,
                ..Default::default()
            },
            true,
        );
    }

    /// One request/response round trip through the server (a measure of the call
    /// cost).
    pub fn nop(&self) -> io::Result<()> {
        self.conn
            .call(usnet_session_abi::Request {
                op: usnet_session_abi::op::NOP,
                ..Default::default()
            })
            .map(|_| ())
    }
}
