//! The backend: one usnet [`Stack`] in virtual time behind a private descriptor
//! table, with the socket calls' semantics (errno values, non-blocking behaviour,
//! socket options) in Rust types. [`link`] is its virtual link and clock (frames in,
//! protocol work, frames out; ARP/NDP answered); [`shared`] shares it between
//! packetdrill's threads and makes calls on blocking sockets wait.

pub mod link;
pub mod shared;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use usnet_driver::{Clock, Driver, ManualClock, MemDevice, MemQueues};
use usnet_link::DeviceCaps;
use usnet_stack::{IpCidr, SocketHandle, Stack, StackConfig, StackError};

use link::STACK_MAC;

/// The options parsed from `--so_flags`.
#[derive(Debug, Clone)]
pub struct Options {
    pub local: IpCidr,
    pub gateway: Ipv4Addr,
    pub local6: IpCidr,
    pub gateway6: Ipv6Addr,
    pub mtu: usize,
    pub seed: u64,
    pub tick_ns: u64,
    /// Answer packetdrill's own `getsockopt(TCP_INFO)` on our descriptors
    /// (`trap=0` turns it off; see `crate::trap`).
    pub trap: bool,
    /// The TCP template: `profile=NAME`, then any Linux sysctl name
    /// (`tcp_timestamps=0`, `tcp_rmem=4096 87380 6291456`, ...).
    pub tcp: usnet_stack::TcpConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            local: "192.168.0.1/16".parse().expect("literal"),
            gateway: Ipv4Addr::new(192, 168, 0, 2),
            local6: "fd3d:fa7b:d17d::1/48".parse().expect("literal"),
            gateway6: "fd3d:fa7b:d17d::2".parse().expect("literal"),
            mtu: 1500,
            seed: 0x7064_7269_6c6c,
            tick_ns: 1_000,
            trap: true,
            tcp: usnet_stack::TcpConfig::default(),
        }
    }
}

impl Options {
    /// Parses `key=value,...`; unknown keys are an error. `profile=` applies before
    /// the sysctls, wherever it stands.
    pub fn parse(flags: &str) -> Result<Options, String> {
        let mut o = Options::default();
        let items: Vec<&str> = flags
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        for item in &items {
            if let Some(p) = item.strip_prefix("profile=") {
                o.tcp = usnet_stack::TcpConfig::profile(p).ok_or_else(|| {
                    format!(
                        "flag profile={p}: unknown profile (known: {})",
                        usnet_stack::TCP_PROFILES.join(", ")
                    )
                })?;
            }
        }
        for item in items {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("flag {item:?}: expected key=value"))?;
            let bad = |e: &dyn std::fmt::Debug| format!("flag {k}={v}: {e:?}");
            match k {
                "local" => o.local = v.parse().map_err(|e| bad(&e))?,
                "gateway" => o.gateway = v.parse().map_err(|e| bad(&e))?,
                "local6" => o.local6 = v.parse().map_err(|e| bad(&e))?,
                "gateway6" => o.gateway6 = v.parse().map_err(|e| bad(&e))?,
                "mtu" => o.mtu = v.parse().map_err(|e| bad(&e))?,
                "seed" => o.seed = v.parse().map_err(|e| bad(&e))?,
                "tick_us" => {
                    o.tick_ns = v.parse::<u64>().map_err(|e| bad(&e))?.saturating_mul(1000)
                }
                "profile" => {}
                "trap" => o.trap = v != "0",
                _ if k.starts_with("tcp_") => o.tcp.set_sysctl(k, v)?,
                _ => return Err(format!("unknown flag {k:?}")),
            }
        }
        Ok(o)
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `socket()` done; maybe bound.
    Fresh(Option<SocketAddr>),
    Listen(SocketHandle),
    Conn(SocketHandle),
}

#[derive(Debug)]
struct Fd {
    /// The kernel object that holds this descriptor's number (see [`RealFd`]).
    real: RealFd,
    kind: Kind,
    nonblock: bool,
    v6: bool,
    nodelay: bool,
    reuseaddr: bool,
    /// A pending error (SO_ERROR) taken from a failed non-blocking connect.
    so_error: c_int,
    /// TCP_FASTOPEN set before `listen`.
    fastopen: Option<usize>,
    /// TCP_FASTOPEN_KEY set before `listen`.
    fastopen_key: Option<[u8; 16]>,
}

/// A real kernel descriptor that reserves a socket's number, so the numbers this
/// library hands out are the kernel's: nothing else in the process gets them, and
/// packetdrill's own `close()` and `getsockopt()` on them reach a real descriptor
/// (a memfd: each has its own inode, so [`RealFd::still_ours`] can tell whether the
/// number still names it).
#[derive(Debug)]
struct RealFd {
    fd: c_int,
    dev_ino: (u64, u64),
}

impl RealFd {
    fn new() -> Res<RealFd> {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new
        // descriptor or -1.
        let fd =
            unsafe { libc::memfd_create(c"usnet-packetdrill-socket".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        let dev_ino = fstat_id(fd).unwrap_or((0, 0));
        Ok(RealFd { fd, dev_ino })
    }

    /// Whether the number still names the memfd made for it (packetdrill closes the
    /// numbers of sockets the script left open itself).
    fn still_ours(&self) -> bool {
        fstat_id(self.fd) == Some(self.dev_ino)
    }

    fn close(self) {
        if self.still_ours() {
            // SAFETY: the descriptor is the memfd this value made (checked above).
            unsafe { libc::close(self.fd) };
        }
    }
}

fn fstat_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes a `struct stat` into the zeroed buffer or fails.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    }
}

/// The backend's state: one stack, the virtual clock, the descriptor table and the
/// packets the stack sent that packetdrill has not read yet.
pub struct Backend {
    /// The stack on an in-memory link, driven in virtual time.
    driver: Driver<MemDevice, ManualClock>,
    /// The script's end of the link.
    link: MemQueues,
    /// Virtual time since the backend was created; moves only when asked.
    clock: ManualClock,
    /// Wall-clock microseconds at creation: `gettimeofday` returns this + virtual time.
    epoch_us: i64,
    tick_ns: u64,
    fds: BTreeMap<c_int, Fd>,
    out: VecDeque<(Vec<u8>, u64)>,
    /// What packetdrill's threads know about each other ([`shared`]).
    pub(crate) sync: shared::Sync,
    /// Packets handed to the stack / taken from it / answered here (ARP, NDP).
    pub injected: u64,
    pub sniffed: u64,
    pub resolved: u64,
}

/// A result whose error is an errno value.
pub(crate) type Res<T> = Result<T, c_int>;

/// The errno for a stack error.
pub(crate) fn map(e: StackError) -> c_int {
    e.errno()
}

impl Backend {
    pub fn new(o: &Options) -> Result<Backend, String> {
        let cfg = StackConfig {
            mac: STACK_MAC,
            addrs: vec![o.local, o.local6],
            gateway4: Some(o.gateway),
            gateway6: Some(o.gateway6),
            mtu: o.mtu,
            seed: o.seed,
            tcp: o.tcp.clone(),
            ..Default::default()
        };
        let stack = Stack::new(cfg).map_err(|e| format!("{e}"))?;
        let (dev, link) = MemDevice::new(
            "packetdrill",
            DeviceCaps {
                mtu: o.mtu,
                rx_csum_offload: false,
                tx_csum_offload: false,
                tso: false,
                max_burst: 64,
            },
        )
        .map_err(|e| format!("in-memory link: {e}"))?;
        let clock = ManualClock::default();
        let epoch_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(Backend {
            driver: Driver::new(stack, dev, clock.clone()),
            link,
            clock,
            epoch_us,
            tick_ns: o.tick_ns,
            fds: BTreeMap::new(),
            out: VecDeque::new(),
            sync: shared::Sync::default(),
            injected: 0,
            sniffed: 0,
            resolved: 0,
        })
    }

    pub fn stack(&self) -> &Stack {
        self.driver.stack()
    }

    fn stack_mut(&mut self) -> &mut Stack {
        self.driver.stack_mut()
    }

    /// Virtual microseconds since creation.
    pub fn now_us(&self) -> u64 {
        self.now_ns() / 1000
    }

    fn fd(&mut self, fd: c_int) -> Res<&mut Fd> {
        self.fds.get_mut(&fd).ok_or(libc::EBADF)
    }

    pub fn socket(&mut self, domain: c_int, ty: c_int, protocol: c_int) -> Res<c_int> {
        let v6 = match domain {
            libc::AF_INET => false,
            libc::AF_INET6 => true,
            _ => return Err(libc::EAFNOSUPPORT),
        };
        let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        if base != libc::SOCK_STREAM || !(protocol == 0 || protocol == libc::IPPROTO_TCP) {
            return Err(libc::EPROTONOSUPPORT);
        }
        let real = RealFd::new()?;
        let fd = real.fd;
        self.fds.insert(
            fd,
            Fd {
                real,
                kind: Kind::Fresh(None),
                nonblock: ty & libc::SOCK_NONBLOCK != 0,
                v6,
                nodelay: false,
                reuseaddr: false,
                so_error: 0,
                fastopen: None,
                fastopen_key: None,
            },
        );
        Ok(fd)
    }

    pub fn bind(&mut self, fd: c_int, addr: SocketAddr) -> Res<()> {
        let f = self.fd(fd)?;
        match f.kind {
            Kind::Fresh(None) => {
                f.kind = Kind::Fresh(Some(addr));
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    }

    pub fn listen(&mut self, fd: c_int, backlog: c_int) -> Res<()> {
        let f = self.fd(fd)?;
        let v6 = f.v6;
        let addr = match f.kind {
            Kind::Fresh(a) => a.unwrap_or(if v6 {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
            }),
            Kind::Listen(_) => return Ok(()),
            Kind::Conn(_) => return Err(libc::EINVAL),
        };
        let h = self
            .stack_mut()
            .tcp_listen(addr, backlog.clamp(1, 65535) as usize)
            .map_err(map)?;
        let f = self.fd(fd)?;
        f.kind = Kind::Listen(h);
        let (qlen, key) = (f.fastopen, f.fastopen_key);
        if let Some(q) = qlen {
            self.stack_mut().tcp_set_fastopen(h, q).map_err(map)?;
        }
        if let Some(k) = key {
            self.stack_mut().tcp_set_fastopen_key(h, k).map_err(map)?;
        }
        Ok(())
    }

    /// Non-blocking accept: `EAGAIN` when nothing is queued.
    pub fn try_accept(&mut self, fd: c_int) -> Res<(c_int, SocketAddr)> {
        self.pump();
        let f = self.fd(fd)?;
        let (Kind::Listen(h), v6, nodelay) = (f.kind, f.v6, f.nodelay) else {
            return Err(libc::EINVAL);
        };
        let c = self.stack_mut().tcp_accept(h).map_err(map)?;
        let peer = self.stack_mut().tcp_peer_addr(c).map_err(map)?;
        if nodelay {
            let _ = self.stack_mut().tcp_set_nodelay(c, true);
        }
        let nfd = self.socket(
            if v6 { libc::AF_INET6 } else { libc::AF_INET },
            libc::SOCK_STREAM,
            0,
        )?;
        self.fd(nfd)?.kind = Kind::Conn(c);
        Ok((nfd, peer))
    }

    /// Starts a connect; `Ok(())` means the SYN is queued.
    pub fn start_connect(&mut self, fd: c_int, remote: SocketAddr) -> Res<()> {
        let f = self.fd(fd)?;
        let (local, nodelay) = match f.kind {
            Kind::Fresh(a) => (a, f.nodelay),
            Kind::Conn(_) => return Err(libc::EISCONN),
            Kind::Listen(_) => return Err(libc::EINVAL),
        };
        let h = self.stack_mut().tcp_connect(local, remote).map_err(map)?;
        if nodelay {
            let _ = self.stack_mut().tcp_set_nodelay(h, true);
        }
        self.fd(fd)?.kind = Kind::Conn(h);
        self.pump();
        Ok(())
    }

    fn conn(&mut self, fd: c_int) -> Res<SocketHandle> {
        match self.fd(fd)?.kind {
            Kind::Conn(h) => Ok(h),
            _ => Err(libc::ENOTCONN),
        }
    }

    /// `Ok(true)` connected, `Ok(false)` still in progress.
    pub fn connect_status(&mut self, fd: c_int) -> Res<bool> {
        let h = self.conn(fd)?;
        if let Some(e) = self.stack_mut().tcp_take_error(h).map_err(map)? {
            return Err(map(e));
        }
        Ok(self.stack_mut().readiness(h).map_err(map)?.connected)
    }

    pub fn try_read(&mut self, fd: c_int, buf: &mut [u8]) -> Res<usize> {
        let h = self.conn(fd)?;
        let r = self.stack_mut().tcp_recv(h, buf).map_err(map);
        self.pump();
        r
    }

    pub fn try_write(&mut self, fd: c_int, data: &[u8]) -> Res<usize> {
        let h = self.conn(fd)?;
        let r = match self.stack_mut().tcp_send(h, data) {
            Ok(0) if !data.is_empty() => Err(libc::EAGAIN),
            r => r.map_err(map),
        };
        self.pump();
        r
    }

    pub fn close(&mut self, fd: c_int) -> Res<()> {
        let f = self.fds.remove(&fd).ok_or(libc::EBADF)?;
        f.real.close();
        match f.kind {
            Kind::Conn(h) | Kind::Listen(h) => {
                let _ = self.stack_mut().close(h);
            }
            Kind::Fresh(_) => {}
        }
        self.pump();
        Ok(())
    }

    pub fn shutdown(&mut self, fd: c_int, how: c_int) -> Res<()> {
        let h = self.conn(fd)?;
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return Err(libc::EINVAL);
        }
        if how != libc::SHUT_WR {
            self.stack_mut().tcp_shutdown_read(h).map_err(map)?;
        }
        if how != libc::SHUT_RD {
            self.stack_mut().tcp_shutdown_write(h).map_err(map)?;
        }
        self.pump();
        Ok(())
    }

    /// POLLIN/POLLOUT/POLLHUP/POLLERR for `fd`.
    pub fn revents(&mut self, fd: c_int) -> i16 {
        let Some(kind) = self.fds.get(&fd).map(|f| f.kind) else {
            return libc::POLLNVAL;
        };
        let h = match kind {
            Kind::Fresh(_) => return libc::POLLOUT | libc::POLLHUP,
            Kind::Listen(h) | Kind::Conn(h) => h,
        };
        let Ok(r) = self.stack_mut().readiness(h) else {
            return libc::POLLNVAL;
        };
        let mut ev = 0;
        if r.readable {
            ev |= libc::POLLIN;
        }
        if matches!(kind, Kind::Conn(_)) && r.connected && r.writable && !r.closed {
            ev |= libc::POLLOUT;
        }
        if r.closed {
            ev |= libc::POLLHUP;
            if matches!(self.stack_mut().tcp_error(h), Ok(Some(_))) {
                ev |= libc::POLLERR;
            }
        }
        ev
    }

    /// Virtual nanoseconds since creation.
    pub fn now_ns(&self) -> u64 {
        self.clock.now().as_nanos()
    }

    /// Wall-clock microseconds (as `gettimeofday` tells them) at virtual time `t_us`.
    pub fn wall_us(&self, t_us: u64) -> i64 {
        self.epoch_us + t_us as i64
    }

    /// `usleep`: runs the clock `us` microseconds on (every timer on the way fires).
    pub fn sleep_us(&mut self, us: u64) {
        let t = self.now_ns() + us * 1000;
        self.advance_to(t);
    }

    /// `gettimeofday`: moves the clock one tick on and reads it as wall-clock
    /// microseconds.
    pub fn gettimeofday_us(&mut self) -> i64 {
        let t = self.now_ns() + self.tick_ns;
        self.advance_to(t);
        self.wall_us(self.now_us())
    }

    /// Whether `fd` is non-blocking (`None`: no such descriptor).
    pub fn nonblocking(&self, fd: c_int) -> Option<bool> {
        self.fds.get(&fd).map(|f| f.nonblock)
    }

    /// `fcntl`: F_GETFL/F_SETFL (only `O_NONBLOCK` means anything), F_GETFD/F_SETFD
    /// (accepted, no effect).
    pub fn fcntl(&mut self, fd: c_int, cmd: c_int, arg: c_int) -> Res<c_int> {
        let f = self.fd(fd)?;
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDWR | if f.nonblock { libc::O_NONBLOCK } else { 0 }),
            libc::F_SETFL => {
                f.nonblock = arg & libc::O_NONBLOCK != 0;
                Ok(0)
            }
            libc::F_GETFD | libc::F_SETFD => Ok(0),
            _ => Err(libc::EINVAL),
        }
    }

    /// `FIONREAD`: bytes ready to be read.
    pub fn readable_bytes(&mut self, fd: c_int) -> Res<usize> {
        let h = self.conn(fd)?;
        self.stack_mut().tcp_recv_available(h).map_err(map)
    }

    /// `FIONBIO`.
    pub fn set_nonblocking(&mut self, fd: c_int, on: bool) -> Res<()> {
        self.fd(fd)?.nonblock = on;
        Ok(())
    }

    /// The peer of a connected socket.
    pub fn peer_addr(&mut self, fd: c_int) -> Res<SocketAddr> {
        let h = self.conn(fd)?;
        self.stack_mut().tcp_peer_addr(h).map_err(map)
    }

    /// Whether `fd` is one of this backend's descriptors.
    pub fn owns(&self, fd: c_int) -> bool {
        self.fds.contains_key(&fd)
    }

    /// `SO_MEMINFO` (Linux's `sk_meminfo` array of 9 `u32`): receive queue and
    /// buffer, send queue and buffer; the rest 0.
    pub fn meminfo(&mut self, fd: c_int) -> Vec<u8> {
        let mut m = [0u32; 9];
        if let Some(Kind::Conn(h)) = self.fds.get(&fd).map(|f| f.kind) {
            if let Ok(i) = self.stack().tcp_info(h) {
                let cfg = self.stack().tcp_config();
                m[0] = i.recv_queued as u32;
                m[1] = cfg.recv_buffer as u32;
                m[2] = i.send_queued as u32;
                m[3] = cfg.send_buffer as u32;
                m[5] = i.send_queued as u32;
            }
        }
        m.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    /// `getsockopt` of the options whose value is a structure: `TCP_INFO` (Linux's
    /// `struct tcp_info`, [`linux_tcp_info`]) and `TCP_CC_INFO` (empty, as Linux
    /// for CUBIC and Reno). `None`: not one of those (try [`Backend::getsockopt`]).
    pub fn getsockopt_struct(
        &mut self,
        fd: c_int,
        level: c_int,
        name: c_int,
    ) -> Option<Res<Vec<u8>>> {
        if level != libc::IPPROTO_TCP || !(name == libc::TCP_INFO || name == TCP_CC_INFO) {
            return None;
        }
        let kind = match self.fd(fd) {
            Ok(f) => f.kind,
            Err(e) => return Some(Err(e)),
        };
        if name == TCP_CC_INFO {
            return Some(Ok(Vec::new()));
        }
        Some(Ok(match kind {
            Kind::Conn(h) => match self.stack().tcp_info(h) {
                Ok(i) => linux_tcp_info(&i),
                Err(e) => return Some(Err(map(e))),
            },
            Kind::Listen(_) => {
                let mut b = vec![0u8; TCP_INFO_LEN];
                b[0] = 10; // TCP_LISTEN
                b
            }
            Kind::Fresh(_) => {
                let mut b = vec![0u8; TCP_INFO_LEN];
                b[0] = 7; // TCP_CLOSE
                b
            }
        }))
    }

    /// `getsockopt` of the integer options: SO_ERROR (read and cleared), SO_TYPE,
    /// SO_REUSEADDR, TCP_NODELAY, TCP_MAXSEG.
    pub fn getsockopt(&mut self, fd: c_int, level: c_int, name: c_int) -> Res<c_int> {
        let f = self.fd(fd)?;
        let (kind, nodelay, reuse) = (f.kind, f.nodelay, f.reuseaddr);
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                let mut e = std::mem::take(&mut self.fd(fd)?.so_error);
                if let (0, Kind::Conn(h)) = (e, kind) {
                    e = self
                        .stack_mut()
                        .tcp_take_error(h)
                        .ok()
                        .flatten()
                        .map_or(0, map);
                }
                e
            }
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => reuse as c_int,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => nodelay as c_int,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => match kind {
                Kind::Conn(h) => self.stack_mut().tcp_info(h).map_err(map)?.snd_mss as c_int,
                _ => self.stack_mut().tcp_config().mss as c_int,
            },
            _ => return Err(libc::ENOPROTOOPT),
        })
    }

    /// `setsockopt`; `value` is the option's bytes as the caller passed them (`None`:
    /// a null pointer). SO_REUSEADDR/SO_REUSEPORT, SO_LINGER and TCP_NODELAY take
    /// effect; SO_KEEPALIVE, SO_SNDBUF and SO_RCVBUF are accepted and ignored.
    pub fn setsockopt(
        &mut self,
        fd: c_int,
        level: c_int,
        name: c_int,
        value: Option<&[u8]>,
    ) -> Res<()> {
        let field = |off: usize| -> Res<c_int> {
            let b = value
                .and_then(|v| v.get(off..off + 4))
                .ok_or(libc::EINVAL)?;
            Ok(c_int::from_ne_bytes(
                b.try_into().map_err(|_| libc::EINVAL)?,
            ))
        };
        let kind = self.fd(fd)?.kind;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_REUSEPORT) => {
                self.fd(fd)?.reuseaddr = field(0)? != 0;
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE | libc::SO_SNDBUF | libc::SO_RCVBUF) => {
                field(0)?;
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if value.is_none_or(|v| v.len() < std::mem::size_of::<libc::linger>()) {
                    return Err(libc::EINVAL);
                }
                let on = field(std::mem::offset_of!(libc::linger, l_onoff))?;
                let secs = field(std::mem::offset_of!(libc::linger, l_linger))?;
                if let Kind::Conn(h) = kind {
                    let d = (on != 0).then(|| Duration::from_secs(secs.max(0) as u64));
                    self.stack_mut().tcp_set_linger(h, d).map_err(map)?;
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_FASTOPEN) => {
                let q = field(0)?.max(0) as usize;
                match kind {
                    Kind::Listen(h) => self.stack_mut().tcp_set_fastopen(h, q).map_err(map)?,
                    Kind::Fresh(_) => self.fd(fd)?.fastopen = Some(q),
                    Kind::Conn(_) => return Err(libc::EINVAL),
                }
            }
            (libc::IPPROTO_TCP, TCP_FASTOPEN_KEY) => {
                let key: [u8; 16] = value
                    .and_then(|v| v.get(..16))
                    .and_then(|v| v.try_into().ok())
                    .ok_or(libc::EINVAL)?;
                match kind {
                    Kind::Listen(h) => {
                        self.stack_mut().tcp_set_fastopen_key(h, key).map_err(map)?
                    }
                    _ => self.fd(fd)?.fastopen_key = Some(key),
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
                let on = field(0)? != 0;
                self.fd(fd)?.nodelay = on;
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_nodelay(h, on).map_err(map)?;
                    self.pump();
                }
            }
            _ => return Err(libc::ENOPROTOOPT),
        }
        Ok(())
    }
}

/// Linux's `TCP_FASTOPEN_KEY` option number.
const TCP_FASTOPEN_KEY: c_int = 33;

/// Linux's `TCP_CC_INFO` option number.
const TCP_CC_INFO: c_int = 26;

/// The size of Linux's `struct tcp_info` (6.x, through `tcpi_options2`) this library
/// returns; a caller's shorter buffer gets the first bytes, as from Linux.
pub const TCP_INFO_LEN: usize = 280;

/// A [`TcpInfo`](usnet_stack::TcpInfo) in the layout of Linux's `struct tcp_info`
/// (`include/uapi/linux/tcp.h`): windows and thresholds in segments, times in µs.
/// Fields usnet does not track are 0.
pub fn linux_tcp_info(i: &usnet_stack::TcpInfo) -> Vec<u8> {
    use usnet_stack::TcpState as S;
    let mut b = vec![0u8; TCP_INFO_LEN];
    let mut put32 = |off: usize, v: u64| {
        b[off..off + 4].copy_from_slice(&(v.min(u64::from(u32::MAX)) as u32).to_ne_bytes())
    };
    let mss = u64::from(i.snd_mss.max(1));
    let us = |d: std::time::Duration| d.as_micros() as u64;
    put32(8, us(i.rto));
    put32(16, u64::from(i.snd_mss));
    put32(20, u64::from(i.rcv_mss));
    put32(24, u64::from(i.bytes_in_flight).div_ceil(mss));
    put32(28, u64::from(i.sacked_bytes).div_ceil(mss));
    put32(32, u64::from(i.lost_segments));
    put32(68, i.srtt.map_or(0, us));
    put32(72, us(i.rttvar));
    put32(76, u64::from(i.ssthresh) / mss);
    put32(80, u64::from(i.cwnd) / mss);
    put32(84, u64::from(i.snd_mss));
    put32(88, 3);
    put32(96, u64::from(i.rcv_space));
    put32(100, i.total_retransmits);
    put32(148, i.min_rtt.map_or(u64::from(u32::MAX), us));
    put32(228, u64::from(i.snd_wnd));
    put32(232, u64::from(i.rcv_wnd));
    b[0] = match i.state {
        S::Established => 1,
        S::SynSent => 2,
        S::SynReceived => 3,
        S::FinWait1 => 4,
        S::FinWait2 => 5,
        S::TimeWait => 6,
        S::Closed => 7,
        S::CloseWait => 8,
        S::LastAck => 9,
        S::Closing => 11,
    };
    // tcpi_ca_state: Open, or Recovery.
    b[1] = if i.in_recovery { 3 } else { 0 };
    b[4] = i.backoff.min(255) as u8;
    let mut opts = 0u8;
    if i.timestamps {
        opts |= 1;
    }
    if i.sack {
        opts |= 2;
    }
    if i.syn_data {
        opts |= 32; // TCPI_OPT_SYN_DATA
    }
    if let Some((snd, rcv)) = i.wscale {
        opts |= 4;
        b[6] = (snd & 0xf) | ((rcv & 0xf) << 4);
    }
    b[5] = opts;
    b
}

impl Drop for Backend {
    fn drop(&mut self) {
        for (_, f) in std::mem::take(&mut self.fds) {
            f.real.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_options_and_flags() {
        let mut b = Backend::new(&Options::default()).unwrap();
        let fd = b.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let (tcp, sol) = (libc::IPPROTO_TCP, libc::SOL_SOCKET);
        let one = (1 as c_int).to_ne_bytes();
        // The descriptor is checked first, then the option, then its value.
        assert_eq!(b.setsockopt(99, sol, 12345, None), Err(libc::EBADF));
        assert_eq!(b.setsockopt(fd, sol, 12345, None), Err(libc::ENOPROTOOPT));
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_NODELAY, Some(&one[..3])),
            Err(libc::EINVAL)
        );
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_NODELAY), Ok(0));
        assert_eq!(b.setsockopt(fd, tcp, libc::TCP_NODELAY, Some(&one)), Ok(()));
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_NODELAY), Ok(1));
        assert_eq!(
            b.setsockopt(fd, sol, libc::SO_REUSEADDR, Some(&one)),
            Ok(())
        );
        assert_eq!(b.getsockopt(fd, sol, libc::SO_REUSEADDR), Ok(1));
        assert_eq!(
            b.setsockopt(fd, sol, libc::SO_SNDBUF, None),
            Err(libc::EINVAL)
        );
        let linger = [1 as c_int, 5].map(c_int::to_ne_bytes).concat();
        assert_eq!(
            b.setsockopt(fd, sol, libc::SO_LINGER, Some(&linger)),
            Ok(())
        );
        assert_eq!(
            b.setsockopt(fd, sol, libc::SO_LINGER, Some(&linger[..4])),
            Err(libc::EINVAL)
        );
        assert_eq!(b.getsockopt(fd, sol, libc::SO_TYPE), Ok(libc::SOCK_STREAM));
        assert_eq!(b.getsockopt(fd, sol, libc::SO_ERROR), Ok(0));
        assert_eq!(b.getsockopt(fd, sol, 12345), Err(libc::ENOPROTOOPT));
        // fcntl and FIONBIO share the one flag; FIONREAD needs a connection.
        assert_eq!(b.nonblocking(fd), Some(false));
        assert_eq!(b.fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK), Ok(0));
        assert_eq!(
            b.fcntl(fd, libc::F_GETFL, 0),
            Ok(libc::O_RDWR | libc::O_NONBLOCK)
        );
        assert_eq!(b.set_nonblocking(fd, false), Ok(()));
        assert_eq!(b.nonblocking(fd), Some(false));
        assert_eq!(b.fcntl(fd, 12345, 0), Err(libc::EINVAL));
        assert_eq!(b.readable_bytes(fd), Err(libc::ENOTCONN));
        assert_eq!(b.nonblocking(99), None);
    }
}
