//! The backend: one usnet [`Stack`] in virtual time behind a private descriptor
//! table, with the socket calls' semantics (errno values, non-blocking behaviour,
//! socket options) in Rust types. [`link`] is its virtual link and clock (frames in,
//! protocol work, frames out; ARP/NDP answered); [`shared`] shares it between
//! packetdrill's threads and makes calls on blocking sockets wait.

mod epoll;
pub mod link;
pub mod shared;
mod splice;
mod timestamping;
mod zerocopy;
pub use timestamping::Stamp;
pub use usnet_client::msgzc::frag_breaks as zerocopy_frag_breaks;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use usnet_driver::{Clock, Driver, ManualClock, MemDevice, MemQueues};
use usnet_link::DeviceCaps;
use usnet_stack::{IpCidr, SocketHandle, Stack, StackConfig, StackError, TcpState};

use link::STACK_MAC;
use usnet_posix::sockopt;

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
    /// `sysctl_file=PATH`: a file of `tcp_name=value` lines that grows while the
    /// script runs (its mid-script sysctl commands append to it); each system call
    /// first applies the lines added since the last one.
    pub sysctl_file: Option<String>,
    /// `gso_mss=N` (a script's `--mss=N`): packetdrill hands every TCP packet it
    /// injects to the kernel as a GSO frame of `N`-byte segments; the backend gives
    /// the stack such frames with that `gso_size`, as a device that coalesced them.
    pub gso_mss: Option<u16>,
    /// `layer=posix`: socket calls go through usnet-posix to a stack server in this
    /// process (`crate::posix`) instead of this module's own socket layer.
    pub posix: bool,
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
            sysctl_file: None,
            gso_mss: None,
            posix: false,
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
                "gso_mss" => o.gso_mss = Some(v.parse().map_err(|e| bad(&e))?),
                "sysctl_file" => o.sysctl_file = Some(v.to_string()),
                "layer" => {
                    o.posix = match v {
                        "posix" => true,
                        "backend" => false,
                        _ => return Err(format!("flag layer={v}: expected posix or backend")),
                    }
                }
                _ if k.starts_with("tcp_") => o.tcp.set_sysctl(k, v)?,
                _ => return Err(format!("unknown flag {k:?}")),
            }
        }
        Ok(o)
    }
}

/// The stack a script runs against: packetdrill's addresses, the options' MTU,
/// seed and TCP template.
pub(crate) fn stack_config(o: &Options) -> StackConfig {
    StackConfig {
        mac: STACK_MAC,
        addrs: vec![o.local, o.local6],
        gateway4: Some(o.gateway),
        gateway6: Some(o.gateway6),
        mtu: o.mtu,
        seed: o.seed,
        tcp: o.tcp.clone(),
        ..Default::default()
    }
}

/// The in-memory link: the options' MTU, no offloads.
pub(crate) fn device_caps(o: &Options) -> DeviceCaps {
    DeviceCaps {
        mtu: o.mtu,
        rx_csum_offload: false,
        tx_csum_offload: false,
        tso: false,
        max_burst: 64,
    }
}

/// One line of the script's sysctl file: `tcp_name=value`, or the line that
/// flushes the stack's TCP metrics.
pub(crate) fn apply_sysctl_line(stack: &mut Stack, line: &str) {
    if line.trim() == FLUSH_METRICS {
        stack.tcp_flush_metrics();
        return;
    }
    if let Some((k, v)) = line.trim().split_once('=') {
        if let Err(e) = stack.tcp_config_mut().set_sysctl(k.trim(), v.trim()) {
            eprintln!("usnet-packetdrill: sysctl {k}={v}: {e}");
        }
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
    /// TCP_FASTOPEN_CONNECT: `connect` with a cookie cached defers the SYN to the
    /// first write, which carries data on it.
    fastopen_connect: bool,
    /// Such a deferred `connect`'s peer.
    deferred: Option<SocketAddr>,
    /// TCP_SYNCNT.
    syn_retries: Option<u32>,
    /// SO_KEEPALIVE, and TCP_KEEPIDLE / TCP_KEEPINTVL (s) / TCP_KEEPCNT.
    keepalive: bool,
    keep: [Option<u32>; 3],
    /// SO_ZEROCOPY and the `MSG_ZEROCOPY` completions ([`zerocopy`]).
    zc: zerocopy::ZeroCopy,
    /// SO_TIMESTAMPING and its reports ([`timestamping`]).
    ts: timestamping::Timestamping,
    /// TCP_INQ: `recvmsg` reports the bytes left to read (a `TCP_CM_INQ` cmsg).
    inq: bool,
    /// TCP_MAXSEG.
    user_mss: Option<u16>,
    /// TCP_USER_TIMEOUT, ms (0: none).
    user_timeout: u32,
    /// TCP_CORK.
    cork: bool,
    /// SO_SNDBUF as Linux keeps it (doubled), if set.
    sndbuf: Option<u32>,
    /// TCP_NOTSENT_LOWAT (0: the sysctl's).
    notsent_lowat: u32,
    /// TCP_CONGESTION, if set (applied when the socket connects).
    congestion: Option<sockopt::Congestion>,
    /// The options only recorded and reported back (IP_FREEBIND, IP_MTU_DISCOVER,
    /// ...: `sockopt::Opt::Recorded`).
    recorded: BTreeMap<(c_int, c_int), c_int>,
    /// IP_TOS (IPv4 packets), IPV6_TCLASS (IPv6 packets), IP_MTU_DISCOVER.
    ip: IpOptions,
}

/// The IP-level options of a socket that take effect.
#[derive(Debug, Default, Clone, Copy)]
struct IpOptions {
    tos: u8,
    tclass: u8,
}

impl IpOptions {
    /// The TOS / traffic class byte for a connection of this family.
    fn byte(&self, v6: bool) -> u8 {
        if v6 {
            self.tclass
        } else {
            self.tos
        }
    }
}

/// How a send with Fast Open (`MSG_FASTOPEN`, or the first write after a deferred
/// `connect`) went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FastOpenStart {
    /// A connect started; this many bytes ride on its SYN.
    Started(usize),
    /// The socket is connected: an ordinary send.
    Connected,
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
    /// `Options::gso_mss`.
    gso_mss: Option<u16>,
    fds: BTreeMap<c_int, Fd>,
    out: VecDeque<(Vec<u8>, u64)>,
    /// What packetdrill's threads know about each other ([`shared`]).
    pub(crate) sync: shared::Sync,
    /// Packets handed to the stack / taken from it / answered here (ARP, NDP).
    pub injected: u64,
    pub sniffed: u64,
    pub resolved: u64,
    /// `Options::sysctl_file` and how many of its bytes were applied.
    sysctl_file: Option<(String, usize)>,
    /// epoll instances ([`epoll`]).
    epolls: BTreeMap<c_int, epoll::Epoll>,
    /// Wake-ups per socket from the stack's ready list (edge-triggered epoll).
    wakes: HashMap<SocketHandle, u64>,
    /// Pipes `pipe()` made ([`splice`]).
    pipes: splice::Pipes,
}

/// A result whose error is an errno value.
pub(crate) type Res<T> = Result<T, c_int>;

/// The errno for a stack error.
pub(crate) fn map(e: StackError) -> c_int {
    e.errno()
}

impl Backend {
    pub fn new(o: &Options) -> Result<Backend, String> {
        let stack = Stack::new(stack_config(o)).map_err(|e| format!("{e}"))?;
        let (dev, link) = MemDevice::new("packetdrill", device_caps(o))
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
            gso_mss: o.gso_mss,
            fds: BTreeMap::new(),
            out: VecDeque::new(),
            sync: shared::Sync::default(),
            injected: 0,
            sniffed: 0,
            resolved: 0,
            sysctl_file: o.sysctl_file.clone().map(|p| (p, 0)),
            epolls: BTreeMap::new(),
            wakes: HashMap::new(),
            pipes: Default::default(),
        })
    }

    /// Applies the sysctl lines appended to `Options::sysctl_file` since the last
    /// call to the stack's TCP template (new connections and listeners see them).
    pub fn apply_sysctl_file(&mut self) {
        let Some((path, seen)) = self.sysctl_file.as_mut() else {
            return;
        };
        let Ok(text) = std::fs::read_to_string(&*path) else {
            return;
        };
        if text.len() <= *seen {
            return;
        }
        let new = text[*seen..].to_string();
        // Only whole lines: a partly written one waits for the next call.
        let upto = new.rfind('\n').map_or(0, |i| i + 1);
        *seen += upto;
        for line in new[..upto].lines() {
            apply_sysctl_line(self.stack_mut(), line);
        }
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
                fastopen_connect: false,
                deferred: None,
                syn_retries: None,
                keepalive: false,
                keep: [None; 3],
                zc: Default::default(),
                ts: Default::default(),
                inq: false,
                user_mss: None,
                user_timeout: 0,
                cork: false,
                sndbuf: None,
                notsent_lowat: 0,
                congestion: None,
                recorded: BTreeMap::new(),
                ip: IpOptions::default(),
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
        let (qlen, key, mss, ut) = (f.fastopen, f.fastopen_key, f.user_mss, f.user_timeout);
        if let Some(m) = mss {
            self.stack_mut().tcp_set_listener_mss(h, m).map_err(map)?;
        }
        if ut > 0 {
            let t = Some(Duration::from_millis(ut.into()));
            self.stack_mut().tcp_set_user_timeout(h, t).map_err(map)?;
        }
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
        // Socket flags the listener had are the new socket's (as Linux clones them).
        let (zc, keepalive, keep, user_timeout, sndbuf, lowat, ip, cc, mut recorded) = {
            let l = self.fd(fd)?;
            (
                l.zc.on,
                l.keepalive,
                l.keep,
                l.user_timeout,
                l.sndbuf,
                l.notsent_lowat,
                l.ip,
                l.congestion,
                l.recorded.clone(),
            )
        };
        for key in sockopt::NOT_INHERITED {
            recorded.remove(&key);
        }
        self.apply_buffer_options(c, sndbuf, lowat);
        if let Some(cc) = cc {
            let _ = self
                .stack_mut()
                .tcp_set_congestion_control(c, algorithm(cc));
        }
        let _ = self.stack_mut().tcp_set_tos(c, ip.byte(v6));
        let n = self.fd(nfd)?;
        n.user_timeout = user_timeout;
        n.sndbuf = sndbuf;
        n.notsent_lowat = lowat;
        n.kind = Kind::Conn(c);
        n.nodelay = nodelay;
        n.zc.on = zc;
        n.keepalive = keepalive;
        n.keep = keep;
        n.ip = ip;
        n.congestion = cc;
        n.recorded = recorded;
        Ok((nfd, peer))
    }

    /// Starts a connect; `Ok(true)` means the SYN is queued, `Ok(false)` that it
    /// waits for the first write (TCP_FASTOPEN_CONNECT with a cookie cached: Linux's
    /// `connect` then returns 0 at once).
    pub fn start_connect(&mut self, fd: c_int, remote: SocketAddr) -> Res<bool> {
        let f = self.fd(fd)?;
        let (local, nodelay) = match f.kind {
            Kind::Fresh(_) if f.deferred.is_some() => return Err(libc::EISCONN),
            Kind::Fresh(a) => (a, f.nodelay),
            Kind::Conn(h) => {
                // As Linux: a connect under way answers EALREADY.
                return Err(match self.stack().tcp_state(h) {
                    Ok(TcpState::SynSent) => libc::EALREADY,
                    _ => libc::EISCONN,
                });
            }
            Kind::Listen(_) => return Err(libc::EINVAL),
        };
        let f = self.fd(fd)?;
        if f.fastopen_connect {
            if self.stack().tcp_fastopen_cookie_cached(remote.ip()) {
                self.fd(fd)?.deferred = Some(remote);
                return Ok(false);
            }
            // No cookie: the SYN goes now and asks for one.
            self.fastopen_open(fd, local, nodelay, remote, &[])?;
            return Ok(true);
        }
        let cfg = self.fd_config(fd)?;
        let h = self
            .stack_mut()
            .tcp_connect_with(local, remote, cfg)
            .map_err(map)?;
        self.connected_fd(fd, h, nodelay)?;
        Ok(true)
    }

    /// Client Fast Open for a send: `to` is `sendto`'s address (`MSG_FASTOPEN`), or
    /// None for a plain write (then only a deferred `connect` starts one). A socket
    /// whose connect is under way answers `EALREADY` (Linux).
    pub fn start_fastopen(
        &mut self,
        fd: c_int,
        to: Option<SocketAddr>,
        fastopen: bool,
        data: &[u8],
    ) -> Res<FastOpenStart> {
        let f = self.fd(fd)?;
        let (kind, nodelay, deferred) = (f.kind, f.nodelay, f.deferred);
        match kind {
            Kind::Fresh(local) => {
                let Some(remote) = deferred.or(if fastopen { to } else { None }) else {
                    return Err(if fastopen {
                        libc::EDESTADDRREQ
                    } else {
                        libc::ENOTCONN
                    });
                };
                self.fd(fd)?.deferred = None;
                let q = self.fastopen_open(fd, local, nodelay, remote, data)?;
                Ok(FastOpenStart::Started(q))
            }
            Kind::Conn(_) if fastopen && !self.connect_status(fd)? => Err(libc::EALREADY),
            Kind::Conn(_) => Ok(FastOpenStart::Connected),
            Kind::Listen(_) => Err(libc::ENOTCONN),
        }
    }

    fn fastopen_open(
        &mut self,
        fd: c_int,
        local: Option<SocketAddr>,
        nodelay: bool,
        remote: SocketAddr,
        data: &[u8],
    ) -> Res<usize> {
        let cfg = self.fd_config(fd)?;
        let (h, q) = self
            .stack_mut()
            .tcp_connect_fastopen_with(local, remote, data, cfg)
            .map_err(|e| match e {
                StackError::WrongType => libc::EOPNOTSUPP,
                e => map(e),
            })?;
        self.connected_fd(fd, h, nodelay)?;
        self.fd(fd)?.zc.written += q as u64;
        Ok(q)
    }

    /// The stack's TCP template with this socket's options (TCP_SYNCNT, keepalive).
    fn fd_config(&mut self, fd: c_int) -> Res<usnet_stack::TcpConfig> {
        let mut cfg = self.stack().tcp_config().clone();
        let ka = self.keepalive_of(fd)?;
        let f = self.fd(fd)?;
        if let Some(n) = f.syn_retries {
            cfg.syn_retries = n;
        }
        if let Some(m) = f.user_mss {
            cfg.mss = cfg.mss.min(m);
        }
        cfg.user_timeout =
            (f.user_timeout > 0).then(|| Duration::from_millis(f.user_timeout.into()));
        cfg.keepalive = ka;
        Ok(cfg)
    }

    /// The keepalive a socket's options ask for (None: SO_KEEPALIVE off).
    fn keepalive_of(&mut self, fd: c_int) -> Res<Option<usnet_stack::Keepalive>> {
        let d = self.stack().tcp_config().keepalive_defaults;
        let f = self.fd(fd)?;
        if !f.keepalive {
            return Ok(None);
        }
        let secs =
            |v: Option<u32>, dflt: Duration| v.map_or(dflt, |s| Duration::from_secs(s.into()));
        Ok(Some(usnet_stack::Keepalive {
            idle: secs(f.keep[0], d.idle),
            interval: secs(f.keep[1], d.interval),
            count: f.keep[2].unwrap_or(d.count),
        }))
    }

    /// SO_KEEPALIVE with TCP_KEEPIDLE/INTVL/CNT as set onto `fd`'s connection, if
    /// it has one.
    fn apply_keepalive(&mut self, fd: c_int, kind: Kind) -> Res<()> {
        if let Kind::Conn(h) = kind {
            let ka = self.keepalive_of(fd)?;
            self.stack_mut().tcp_set_keepalive(h, ka).map_err(map)?;
            self.pump();
        }
        Ok(())
    }

    /// SO_SNDBUF and TCP_NOTSENT_LOWAT onto a new connection.
    fn apply_buffer_options(&mut self, h: SocketHandle, sndbuf: Option<u32>, lowat: u32) {
        if let Some(b) = sndbuf {
            let _ = self.stack_mut().tcp_set_send_buffer(h, b);
        }
        if lowat != 0 {
            let _ = self.stack_mut().tcp_set_notsent_lowat(h, lowat);
        }
    }

    fn connected_fd(&mut self, fd: c_int, h: SocketHandle, nodelay: bool) -> Res<()> {
        if nodelay {
            let _ = self.stack_mut().tcp_set_nodelay(h, true);
        }
        let (sndbuf, lowat) = {
            let f = self.fd(fd)?;
            (f.sndbuf, f.notsent_lowat)
        };
        self.apply_buffer_options(h, sndbuf, lowat);
        if self.fd(fd)?.cork {
            let _ = self.stack_mut().tcp_set_cork(h, true);
        }
        if let Some(cc) = self.fd(fd)?.congestion {
            let _ = self
                .stack_mut()
                .tcp_set_congestion_control(h, algorithm(cc));
        }
        let (ip, v6) = (self.fd(fd)?.ip, self.fd(fd)?.v6);
        let _ = self.stack_mut().tcp_set_tos(h, ip.byte(v6));
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
        // A deferred TCP_FASTOPEN_CONNECT connect is "connecting" to Linux.
        if self.fd(fd)?.deferred.is_some() {
            return Err(libc::EAGAIN);
        }
        let h = self.conn(fd)?;
        let r = self.stack_mut().tcp_recv(h, buf).map_err(map);
        self.pump();
        r
    }

    /// A non-blocking write; `more`: `MSG_MORE`.
    pub fn try_write(&mut self, fd: c_int, data: &[u8], more: bool) -> Res<usize> {
        // As Linux: a TCP socket that is not connected (nor connecting) is EPIPE.
        if matches!(self.fd(fd)?.kind, Kind::Fresh(_)) {
            return Err(libc::EPIPE);
        }
        let h = self.conn(fd)?;
        // As Linux: no data is queued before the handshake is complete.
        if matches!(self.stack_mut().tcp_state(h), Ok(TcpState::SynSent)) {
            return Err(libc::EAGAIN);
        }
        let r = match self.stack_mut().tcp_send_more(h, data, more) {
            Ok(0) if !data.is_empty() => Err(libc::EAGAIN),
            r => r.map_err(map),
        };
        if let Ok(n) = r {
            self.fd(fd)?.zc.written += n as u64;
        }
        self.pump();
        r
    }

    /// A blocking Fast Open send waits for the handshake with data to send.
    pub fn set_write_pending(&mut self, fd: c_int, on: bool) -> Res<()> {
        let h = self.conn(fd)?;
        self.stack_mut().tcp_set_write_pending(h, on).map_err(map)
    }

    /// `MSG_EOR`: the data written so far ends a record.
    pub fn end_record(&mut self, fd: c_int) -> Res<()> {
        let h = self.conn(fd)?;
        self.stack_mut().tcp_end_record(h).map_err(map)?;
        self.pump();
        Ok(())
    }

    pub fn close(&mut self, fd: c_int) -> Res<()> {
        if self.close_epoll(fd) || self.close_pipe(fd) {
            return Ok(());
        }
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
            Kind::Fresh(_) if self.fds[&fd].deferred.is_some() => return libc::POLLOUT,
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
        // As Linux's tcp_poll: a connection that is over is writable (the write
        // then reports its error), one whose handshake is under way is not.
        if matches!(kind, Kind::Conn(_)) && ((r.connected && r.writable) || r.closed) {
            ev |= libc::POLLOUT;
        }
        // The peer's FIN arrived (or the connection is over): POLLRDHUP.
        if matches!(kind, Kind::Conn(_))
            && matches!(
                self.stack().tcp_state(h),
                Ok(TcpState::CloseWait
                    | TcpState::LastAck
                    | TcpState::Closing
                    | TcpState::TimeWait
                    | TcpState::Closed)
            )
        {
            ev |= libc::POLLRDHUP;
        }
        if self.zerocopy_pending(fd) || self.timestamp_pending(fd) {
            ev |= libc::POLLERR;
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

    /// With TCP_INQ on: what `recvmsg` reports in its `TCP_CM_INQ` cmsg (the bytes
    /// left to read; 1 when none are left and the peer's FIN arrived, as Linux).
    pub fn inq(&mut self, fd: c_int) -> Option<c_int> {
        let f = self.fds.get(&fd)?;
        let (true, Kind::Conn(h)) = (f.inq, f.kind) else {
            return None;
        };
        let n = self.stack().tcp_recv_available(h).unwrap_or(0);
        let done = matches!(
            self.stack().tcp_state(h),
            Ok(TcpState::CloseWait
                | TcpState::LastAck
                | TcpState::Closing
                | TcpState::TimeWait
                | TcpState::Closed)
        );
        Some(if n == 0 && done {
            1
        } else {
            n.min(c_int::MAX as usize) as c_int
        })
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
    /// After a send with `MSG_ZEROCOPY` that queued bytes: its completion id.
    /// Whether `fd` has `SO_ZEROCOPY` on (a `MSG_ZEROCOPY` send is then zero-copy).
    pub fn zerocopy_on(&mut self, fd: c_int) -> bool {
        self.fd(fd).is_ok_and(|f| f.zc.on)
    }

    pub fn zerocopy_sent(&mut self, fd: c_int) {
        if let Ok(f) = self.fd(fd) {
            if f.zc.on {
                f.zc.record();
            }
        }
    }

    pub fn owns(&self, fd: c_int) -> bool {
        self.fds.contains_key(&fd) || self.epolls.contains_key(&fd)
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
        let tcp_struct = [libc::TCP_INFO, TCP_CC_INFO, libc::TCP_CONGESTION];
        if level != libc::IPPROTO_TCP || !tcp_struct.contains(&name) {
            return None;
        }
        let (kind, cc) = match self.fd(fd) {
            Ok(f) => (f.kind, f.congestion),
            Err(e) => return Some(Err(e)),
        };
        match name {
            TCP_CC_INFO => return Some(Ok(Vec::new())),
            libc::TCP_CONGESTION => {
                let cc = cc.unwrap_or(match self.stack().tcp_config().congestion {
                    usnet_stack::CcAlgorithm::NewReno => sockopt::Congestion::Reno,
                    _ => sockopt::Congestion::Cubic,
                });
                return Some(Ok(sockopt::congestion_name(cc)));
            }
            _ => {}
        }
        Some(Ok(match kind {
            Kind::Conn(h) => match self.stack().tcp_info(h) {
                Ok(i) => linux_tcp_info(&i).to_bytes(),
                Err(e) => return Some(Err(map(e))),
            },
            Kind::Listen(_) => sockopt::LinuxTcpInfo::unconnected(true).to_bytes(),
            Kind::Fresh(_) => sockopt::LinuxTcpInfo::unconnected(false).to_bytes(),
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
            (libc::IPPROTO_TCP, TCP_INQ) => self.fd(fd)?.inq as c_int,
            (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) => self.fd(fd)?.user_timeout as c_int,
            (libc::IPPROTO_TCP, libc::TCP_CORK) => self.fd(fd)?.cork as c_int,
            (libc::SOL_IP, libc::IP_TOS) => c_int::from(self.fd(fd)?.ip.tos),
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => c_int::from(self.fd(fd)?.ip.tclass),
            (libc::SOL_SOCKET, sockopt::SO_TIMESTAMPING) => self.fd(fd)?.ts.flags as c_int,
            (libc::IPPROTO_TCP, TCP_NOTSENT_LOWAT) => match kind {
                Kind::Conn(h) => self.stack().tcp_notsent_lowat(h).map_err(map)? as c_int,
                _ => self.fd(fd)?.notsent_lowat as c_int,
            },
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => match (kind, self.fd(fd)?.sndbuf) {
                (Kind::Conn(h), _) => self.stack().tcp_send_buffer(h).map_err(map)? as c_int,
                (_, Some(b)) => b as c_int,
                _ => self.stack().tcp_config().send_buffer_initial as c_int,
            },
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => match (kind, self.fd(fd)?.user_mss) {
                (Kind::Conn(h), _) => self.stack_mut().tcp_info(h).map_err(map)?.snd_mss as c_int,
                (_, Some(m)) => c_int::from(m),
                _ => self.stack_mut().tcp_config().mss as c_int,
            },
            _ => {
                let v6 = self.fd(fd)?.v6;
                let kept = self.fd(fd)?.recorded.get(&(level, name)).copied();
                sockopt::get(level, name, kept, true, v6).map_err(|e| e.0)?
            }
        })
    }

    /// `setsockopt`; `value` is the option's bytes as the caller passed them (`None`:
    /// a null pointer, read as no bytes). The option is decoded and checked by the
    /// one option table, `usnet_posix::sockopt` (the one `libusnet.so` and the shim
    /// use), then applied to the stack's socket here.
    pub fn setsockopt(
        &mut self,
        fd: c_int,
        level: c_int,
        name: c_int,
        value: Option<&[u8]>,
    ) -> Res<()> {
        use sockopt::Opt;
        let (kind, v6) = {
            let f = self.fd(fd)?;
            (f.kind, f.v6)
        };
        let sk = sockopt::SockKind { stream: true, v6 };
        let opt = sockopt::decode(level, name, value.unwrap_or(&[]), sk).map_err(|e| e.0)?;
        match opt {
            Opt::ReuseAddr(on) | Opt::ReusePort(on) => self.fd(fd)?.reuseaddr = on,
            // The stack's receive buffer is its template's (tcp_rmem).
            Opt::RcvBuf(_) => {}
            Opt::Tos(tos) => {
                self.fd(fd)?.ip.tos = tos;
                if let (Kind::Conn(h), false) = (kind, v6) {
                    self.stack_mut().tcp_set_tos(h, tos).map_err(map)?;
                }
            }
            Opt::TrafficClass(tclass) => {
                self.fd(fd)?.ip.tclass = tclass;
                if let (Kind::Conn(h), true) = (kind, v6) {
                    self.stack_mut().tcp_set_tos(h, tclass).map_err(map)?;
                }
            }
            Opt::SndBuf(v) => {
                let b = usnet_stack::sndbuf_for_option(v);
                self.fd(fd)?.sndbuf = Some(b);
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_send_buffer(h, b).map_err(map)?;
                    self.pump();
                }
            }
            Opt::NotsentLowat(v) => {
                self.fd(fd)?.notsent_lowat = v;
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_notsent_lowat(h, v).map_err(map)?;
                    self.pump();
                }
            }
            Opt::ZeroCopy(on) => self.fd(fd)?.zc.on = on,
            Opt::Timestamping(flags) => self.set_timestamping(fd, flags)?,
            Opt::KeepAlive(on) => {
                self.fd(fd)?.keepalive = on;
                self.apply_keepalive(fd, kind)?;
            }
            Opt::Keep(i, v) => {
                self.fd(fd)?.keep[i] = Some(v);
                self.apply_keepalive(fd, kind)?;
            }
            Opt::Inq(on) => self.fd(fd)?.inq = on,
            Opt::UserTimeout(v) => {
                self.fd(fd)?.user_timeout = v;
                let t = (v > 0).then(|| Duration::from_millis(u64::from(v)));
                if let Kind::Conn(h) | Kind::Listen(h) = kind {
                    self.stack_mut().tcp_set_user_timeout(h, t).map_err(map)?;
                    self.pump();
                }
            }
            Opt::MaxSeg(m) => {
                self.fd(fd)?.user_mss = m;
                if let (Kind::Listen(h), Some(m)) = (kind, m) {
                    self.stack_mut().tcp_set_listener_mss(h, m).map_err(map)?;
                }
            }
            Opt::SynCount(v) => {
                self.fd(fd)?.syn_retries = Some(v);
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_syn_retries(h, v).map_err(map)?;
                }
            }
            Opt::Linger(l) => {
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_linger(h, l).map_err(map)?;
                }
            }
            Opt::FastOpen(q) => match kind {
                Kind::Listen(h) => self
                    .stack_mut()
                    .tcp_set_fastopen(h, q as usize)
                    .map_err(map)?,
                Kind::Fresh(_) => self.fd(fd)?.fastopen = Some(q as usize),
                Kind::Conn(_) => return Err(libc::EINVAL),
            },
            Opt::FastOpenConnect(on) => {
                if !self.stack().tcp_fastopen_client_enabled() {
                    return Err(libc::EOPNOTSUPP);
                }
                match kind {
                    Kind::Fresh(_) => self.fd(fd)?.fastopen_connect = on,
                    _ => return Err(libc::EISCONN),
                }
            }
            Opt::FastOpenKey(key) => match kind {
                Kind::Listen(h) => self.stack_mut().tcp_set_fastopen_key(h, key).map_err(map)?,
                _ => self.fd(fd)?.fastopen_key = Some(key),
            },
            Opt::Cork(on) => {
                self.fd(fd)?.cork = on;
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_cork(h, on).map_err(map)?;
                    self.pump();
                }
            }
            Opt::NoDelay(on) => {
                self.fd(fd)?.nodelay = on;
                if let Kind::Conn(h) = kind {
                    self.stack_mut().tcp_set_nodelay(h, on).map_err(map)?;
                    self.pump();
                }
            }
            Opt::Congestion(cc) => {
                self.fd(fd)?.congestion = Some(cc);
                if let Kind::Conn(h) = kind {
                    self.stack_mut()
                        .tcp_set_congestion_control(h, algorithm(cc))
                        .map_err(map)?;
                }
            }
            Opt::Recorded { level, name, kept } => {
                self.fd(fd)?.recorded.insert((level, name), kept);
            }
            // What a TCP socket of this library has no use for: timeouts (calls
            // block in virtual time), a device, multicast, IPV6_V6ONLY (IPv4-mapped
            // sockets are not supported here).
            Opt::RcvTimeo(_)
            | Opt::SndTimeo(_)
            | Opt::BindToDevice(_)
            | Opt::V6Only(_)
            | Opt::MulticastIf(_)
            | Opt::Membership { .. } => return Err(libc::ENOPROTOOPT),
        }
        Ok(())
    }
}

/// The stack's congestion control for a `TCP_CONGESTION` name.
fn algorithm(c: sockopt::Congestion) -> usnet_stack::CcAlgorithm {
    match c {
        sockopt::Congestion::Cubic => usnet_stack::CcAlgorithm::Cubic,
        sockopt::Congestion::Reno => usnet_stack::CcAlgorithm::NewReno,
    }
}

/// The `sysctl_file` line for a script's `ip tcp_metrics flush`: the stack forgets
/// its per-destination metrics (Fast Open cookies).
pub const FLUSH_METRICS: &str = "tcp_metrics_flush";

use sockopt::{TCP_CC_INFO, TCP_NOTSENT_LOWAT};
pub use sockopt::{TCP_INFO_LEN, TCP_INQ};

/// A [`TcpInfo`](usnet_stack::TcpInfo) in Linux's `struct tcp_info` terms (the
/// layout is the one option table's, [`sockopt::LinuxTcpInfo`]).
pub fn linux_tcp_info(i: &usnet_stack::TcpInfo) -> sockopt::LinuxTcpInfo {
    use sockopt::LinuxTcpInfo;
    let mss = i.snd_mss.max(1);
    let sat = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
    LinuxTcpInfo {
        state: i.linux_state(),
        ca_state: i.linux_ca_state(),
        backoff: i.backoff.min(255) as u8,
        options: i.linux_options(),
        wscale: i.wscale.unwrap_or((0, 0)),
        rto_us: sat(us(i.rto)),
        snd_mss: i.snd_mss,
        rcv_mss: i.rcv_mss,
        unacked: i.bytes_in_flight.div_ceil(mss),
        sacked: i.sacked_bytes.div_ceil(mss),
        lost: i.lost_out,
        retrans: i.retrans_out,
        last_data_recv_ms: sat(i.last_data_recv.as_millis() as u64),
        rtt_us: sat(i.srtt.map_or(0, us)),
        rttvar_us: sat(us(i.rttvar)),
        snd_ssthresh: LinuxTcpInfo::ssthresh_segments(i.ssthresh, mss),
        snd_cwnd: LinuxTcpInfo::segments(i.cwnd, mss),
        advmss: i.snd_mss,
        reordering: i.reordering,
        rcv_space: i.rcv_space,
        total_retrans: sat(i.total_retransmits),
        min_rtt_us: i.min_rtt.map_or(u32::MAX, |d| sat(us(d))),
        busy_time_us: us(i.busy_time),
        rwnd_limited_us: us(i.rwnd_limited),
        sndbuf_limited_us: us(i.sndbuf_limited),
        delivered: sat(i.delivered),
        reord_seen: i.reord_seen,
        snd_wnd: i.snd_wnd,
        rcv_wnd: i.rcv_wnd,
    }
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
    fn tcp_info_reports_an_untouched_ssthresh_as_linux_infinity() {
        let mut b = Backend::new(&Options::default()).unwrap();
        let fd = b.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        b.fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK).unwrap();
        let _ = b.start_connect(fd, "192.0.2.1:8080".parse().unwrap());
        let info = b
            .getsockopt_struct(fd, libc::IPPROTO_TCP, libc::TCP_INFO)
            .unwrap()
            .unwrap();
        let ssthresh = u32::from_ne_bytes(info[76..80].try_into().unwrap());
        assert_eq!(ssthresh, sockopt::TCP_INFINITE_SSTHRESH);
    }

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
        // The one option table's options: TCP_CONGESTION by name, recorded hints.
        let name = |b: &mut Backend| b.getsockopt_struct(fd, tcp, libc::TCP_CONGESTION);
        assert_eq!(name(&mut b).unwrap().unwrap()[..6], *b"cubic\0");
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_CONGESTION, Some(b"reno")),
            Ok(())
        );
        assert_eq!(name(&mut b).unwrap().unwrap()[..5], *b"reno\0");
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_CONGESTION, Some(b"vegas")),
            Err(libc::ENOENT)
        );
        let prio = (6 as c_int).to_ne_bytes();
        assert_eq!(
            b.setsockopt(fd, sol, libc::SO_PRIORITY, Some(&prio)),
            Ok(())
        );
        assert_eq!(b.getsockopt(fd, sol, libc::SO_PRIORITY), Ok(6));
        assert_eq!(b.getsockopt(fd, libc::SOL_IP, libc::IP_MTU_DISCOVER), Ok(1));
        // IP-level options: one byte is enough, TCP keeps the ECN bits.
        assert_eq!(
            b.setsockopt(fd, libc::SOL_IP, libc::IP_TOS, Some(&[0x2f])),
            Ok(())
        );
        assert_eq!(b.getsockopt(fd, libc::SOL_IP, libc::IP_TOS), Ok(0x2c));
        let tclass = (0x28 as c_int).to_ne_bytes();
        let v6 = libc::IPPROTO_IPV6;
        // An IPv6-level option on an AF_INET socket: Linux's ip_setsockopt says
        // ENOPROTOOPT.
        assert_eq!(
            b.setsockopt(fd, v6, libc::IPV6_TCLASS, Some(&tclass)),
            Err(libc::ENOPROTOOPT)
        );
        let fd6 = b.socket(libc::AF_INET6, libc::SOCK_STREAM, 0).unwrap();
        assert_eq!(
            b.setsockopt(fd6, v6, libc::IPV6_TCLASS, Some(&tclass)),
            Ok(())
        );
        assert_eq!(b.getsockopt(fd6, v6, libc::IPV6_TCLASS), Ok(0x28));
        let bad = (256 as c_int).to_ne_bytes();
        assert_eq!(
            b.setsockopt(fd6, v6, libc::IPV6_TCLASS, Some(&bad)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            b.setsockopt(fd, libc::SOL_IP, libc::IP_MTU_DISCOVER, Some(&[0])),
            Ok(())
        );
        assert_eq!(
            b.setsockopt(fd, libc::SOL_IP, libc::IP_MTU_DISCOVER, Some(&[9])),
            Err(libc::EINVAL)
        );
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
        // SO_SNDBUF: tcp_wmem's default until set, then doubled (with Linux's floor).
        let sndbuf0 = b.stack().tcp_config().send_buffer_initial as c_int;
        assert_eq!(b.getsockopt(fd, sol, libc::SO_SNDBUF), Ok(sndbuf0));
        let v = (21000 as c_int).to_ne_bytes();
        assert_eq!(b.setsockopt(fd, sol, libc::SO_SNDBUF, Some(&v)), Ok(()));
        assert_eq!(b.getsockopt(fd, sol, libc::SO_SNDBUF), Ok(42000));
        assert_eq!(b.setsockopt(fd, sol, libc::SO_SNDBUF, Some(&one)), Ok(()));
        assert_eq!(b.getsockopt(fd, sol, libc::SO_SNDBUF), Ok(4608));
        // TCP_NOTSENT_LOWAT: any 32-bit value, read back as set.
        assert_eq!(b.getsockopt(fd, tcp, TCP_NOTSENT_LOWAT), Ok(0));
        let max = (-1 as c_int).to_ne_bytes();
        assert_eq!(b.setsockopt(fd, tcp, TCP_NOTSENT_LOWAT, Some(&max)), Ok(()));
        assert_eq!(b.getsockopt(fd, tcp, TCP_NOTSENT_LOWAT), Ok(-1));
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
        assert_eq!(b.getsockopt(fd, tcp, TCP_INQ), Ok(0));
        assert_eq!(b.setsockopt(fd, tcp, TCP_INQ, Some(&one)), Ok(()));
        assert_eq!(b.getsockopt(fd, tcp, TCP_INQ), Ok(1));
        assert_eq!(b.inq(fd), None, "no cmsg without a connection");
        // Keepalive and SYN-count options check their ranges, as Linux.
        let zero = (0 as c_int).to_ne_bytes();
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_SYNCNT, Some(&zero)),
            Err(libc::EINVAL)
        );
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_KEEPIDLE, Some(&zero)),
            Err(libc::EINVAL)
        );
        assert_eq!(b.setsockopt(fd, tcp, libc::TCP_KEEPCNT, Some(&one)), Ok(()));
        assert_eq!(b.setsockopt(fd, sol, libc::SO_ZEROCOPY, Some(&one)), Ok(()));
        // TCP_MAXSEG before connect/listen: kept, reported, checked.
        let m = (1100 as c_int).to_ne_bytes();
        assert_eq!(b.setsockopt(fd, tcp, libc::TCP_MAXSEG, Some(&m)), Ok(()));
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_MAXSEG), Ok(1100));
        assert_eq!(b.fd_config(fd).map(|c| c.mss), Ok(1100));
        let small = (50 as c_int).to_ne_bytes();
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_MAXSEG, Some(&small)),
            Err(libc::EINVAL)
        );
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_CORK), Ok(0));
        assert_eq!(b.setsockopt(fd, tcp, libc::TCP_CORK, Some(&one)), Ok(()));
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_CORK), Ok(1));
        // TCP_USER_TIMEOUT: milliseconds, kept for the connection, never negative.
        let ut = (3000 as c_int).to_ne_bytes();
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_USER_TIMEOUT), Ok(0));
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_USER_TIMEOUT, Some(&ut)),
            Ok(())
        );
        assert_eq!(b.getsockopt(fd, tcp, libc::TCP_USER_TIMEOUT), Ok(3000));
        assert_eq!(
            b.fd_config(fd).map(|c| c.user_timeout),
            Ok(Some(Duration::from_secs(3)))
        );
        let neg = (-1 as c_int).to_ne_bytes();
        assert_eq!(
            b.setsockopt(fd, tcp, libc::TCP_USER_TIMEOUT, Some(&neg)),
            Err(libc::EINVAL)
        );
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
