//! A backend for packetdrill's `--so_filename` mode: `libusnet_packetdrill.so` exports
//! `packetdrill_interface_init`, which fills packetdrill's `struct packetdrill_interface`
//! (`gtests/net/packetdrill/packetdrill.h`) with functions backed by one usnet
//! [`Stack`] running in virtual time.
//!
//! - `netdev_send` gets an IP packet (IPv4 or IPv6, no link header) from the script; it
//!   is wrapped in an Ethernet header addressed to the stack and fed to it.
//! - `netdev_receive` hands back the next IP packet the stack sends (Ethernet header
//!   stripped). ARP requests and IPv6 neighbour solicitations never reach packetdrill:
//!   they are answered here with a fixed "peer" MAC, so the stack can send anywhere.
//!   When nothing is queued, the virtual clock jumps to the stack's next timer
//!   (retransmission, delayed ACK, ...), so timer-driven packets carry the virtual time
//!   at which the stack sent them.
//! - `usleep` advances the virtual clock (running every stack timer on the way);
//!   `gettimeofday` reads it and advances it by a small tick (default 1 µs, flag
//!   `tick_us=`), because packetdrill spins on the clock for the last microseconds
//!   before an event.
//! - socket calls map to the stack's TCP API; file descriptors are small integers
//!   starting at 3 and are private to this library.
//!
//! Flags (packetdrill's `--so_flags`, comma separated): `local=192.168.0.1/16`,
//! `gateway=192.168.0.2`, `local6=fd3d:fa7b:d17d::1/48`, `gateway6=fd3d:fa7b:d17d::2`,
//! `mtu=1500`, `seed=N`, `tick_us=N`. The defaults are packetdrill's own defaults.
//!
//! Blocking calls (`accept`, `connect`, `read`, `write` and `poll` with a timeout on
//! blocking sockets) wait on a condition variable until another thread — packetdrill
//! runs system calls in their own thread — injects a packet or moves the clock.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_char, c_int, c_long, c_longlong, c_uint, c_ulong, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use libc::{iovec, msghdr, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};
use usnet_stack::{Instant, IpCidr, SocketHandle, Stack, StackConfig, StackError};
use usnet_wire::MacAddr;

/// The C struct, field for field (`packetdrill.h`). Variadic members (`fcntl`,
/// `ioctl`) are declared with one fixed argument: on the x86-64 System V and AArch64
/// Linux ABIs a variadic integer or pointer argument travels in the same register as a
/// named one, which is how packetdrill calls them (one argument at most).
#[repr(C)]
pub struct PacketdrillInterface {
    pub userdata: *mut c_void,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
    pub socket: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int) -> c_int>,
    pub bind: Option<unsafe extern "C" fn(*mut c_void, c_int, *const sockaddr, socklen_t) -> c_int>,
    pub listen: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int) -> c_int>,
    pub accept:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *mut sockaddr, *mut socklen_t) -> c_int>,
    pub connect:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *const sockaddr, socklen_t) -> c_int>,
    pub read: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, size_t) -> ssize_t>,
    pub readv: Option<unsafe extern "C" fn(*mut c_void, c_int, *const iovec, c_int) -> ssize_t>,
    pub recv:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, size_t, c_int) -> ssize_t>,
    pub recvfrom: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut c_void,
            size_t,
            c_int,
            *mut sockaddr,
            *mut socklen_t,
        ) -> ssize_t,
    >,
    pub recvmsg: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut msghdr, c_int) -> ssize_t>,
    pub write: Option<unsafe extern "C" fn(*mut c_void, c_int, *const c_void, size_t) -> ssize_t>,
    pub writev: Option<unsafe extern "C" fn(*mut c_void, c_int, *const iovec, c_int) -> ssize_t>,
    pub send:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *const c_void, size_t, c_int) -> ssize_t>,
    pub sendto: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *const c_void,
            size_t,
            c_int,
            *const sockaddr,
            socklen_t,
        ) -> ssize_t,
    >,
    pub sendmsg: Option<unsafe extern "C" fn(*mut c_void, c_int, *const msghdr, c_int) -> ssize_t>,
    pub fcntl: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int, c_long) -> c_int>,
    pub ioctl: Option<unsafe extern "C" fn(*mut c_void, c_int, c_ulong, *mut c_void) -> c_int>,
    pub close: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    pub shutdown: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int) -> c_int>,
    pub getsockopt: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            c_int,
            c_int,
            *mut c_void,
            *mut socklen_t,
        ) -> c_int,
    >,
    pub setsockopt: Option<
        unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
    >,
    pub poll: Option<unsafe extern "C" fn(*mut c_void, *mut pollfd, libc::nfds_t, c_int) -> c_int>,
    pub netdev_send: Option<unsafe extern "C" fn(*mut c_void, *const c_void, size_t) -> c_int>,
    pub netdev_receive: Option<
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut size_t, *mut c_longlong) -> c_int,
    >,
    pub usleep: Option<unsafe extern "C" fn(*mut c_void, libc::useconds_t) -> c_int>,
    pub gettimeofday: Option<unsafe extern "C" fn(*mut c_void, *mut timeval, *mut c_void) -> c_int>,
    pub epoll_create: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    pub epoll_ctl: Option<
        unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, *mut libc::epoll_event) -> c_int,
    >,
    pub epoll_wait: Option<
        unsafe extern "C" fn(*mut c_void, c_int, *mut libc::epoll_event, c_int, c_int) -> c_int,
    >,
    pub pipe: Option<unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int>,
    pub splice: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut libc::loff_t,
            c_int,
            *mut libc::loff_t,
            size_t,
            c_uint,
        ) -> ssize_t,
    >,
}

/// The MAC this library answers ARP/NDP with: the "other end" of the virtual link.
pub const PEER_MAC: MacAddr = MacAddr([0x02, 0x70, 0x64, 0x00, 0x00, 0x02]);
/// The stack's own MAC.
pub const STACK_MAC: MacAddr = MacAddr([0x02, 0x70, 0x64, 0x00, 0x00, 0x01]);

const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;

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
        }
    }
}

impl Options {
    /// Parses `key=value,...`; unknown keys are an error.
    pub fn parse(flags: &str) -> Result<Options, String> {
        let mut o = Options::default();
        for item in flags.split(',').map(str::trim).filter(|s| !s.is_empty()) {
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
    kind: Kind,
    nonblock: bool,
    v6: bool,
    nodelay: bool,
    reuseaddr: bool,
    /// A pending error (SO_ERROR) taken from a failed non-blocking connect.
    so_error: c_int,
}

/// The backend's state: one stack, the virtual clock, the descriptor table and the
/// packets the stack sent that packetdrill has not read yet.
pub struct Backend {
    stack: Stack,
    /// Virtual time in nanoseconds since the backend was created.
    now_ns: u64,
    /// Wall-clock microseconds at creation: `gettimeofday` returns this + virtual time.
    epoch_us: i64,
    tick_ns: u64,
    fds: BTreeMap<c_int, Fd>,
    out: VecDeque<(Vec<u8>, u64)>,
    scratch: Vec<u8>,
    /// Packets handed to the stack / taken from it / answered here (ARP, NDP).
    pub injected: u64,
    pub sniffed: u64,
    pub resolved: u64,
}

type Res<T> = Result<T, c_int>;

fn map(e: StackError) -> c_int {
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
            ..Default::default()
        };
        let stack = Stack::new(cfg).map_err(|e| format!("{e}"))?;
        let epoch_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(Backend {
            stack,
            now_ns: 0,
            epoch_us,
            tick_ns: o.tick_ns,
            fds: BTreeMap::new(),
            out: VecDeque::new(),
            scratch: Vec::new(),
            injected: 0,
            sniffed: 0,
            resolved: 0,
        })
    }

    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.now_ns)
    }

    /// Virtual microseconds since creation.
    pub fn now_us(&self) -> u64 {
        self.now_ns / 1000
    }

    /// Runs the stack at the current virtual time until it is idle, collecting what it
    /// sends (and answering its ARP/NDP itself).
    fn pump(&mut self) {
        for _ in 0..64 {
            let mut did = self.stack.poll(self.now());
            while let Some(b) = self.stack.dequeue_tx() {
                did = true;
                self.scratch.clear();
                self.stack.pool().copy_chain(b, &mut self.scratch);
                self.stack.pool_mut().free(b);
                let frame = std::mem::take(&mut self.scratch);
                self.on_frame(&frame);
                self.scratch = frame;
            }
            if !did {
                break;
            }
        }
    }

    fn on_frame(&mut self, frame: &[u8]) {
        let Ok(eth) = usnet_wire::parse_ethernet(frame) else {
            return;
        };
        let p = eth.payload;
        match eth.ethertype {
            ETH_ARP => {
                if let Ok(req) = usnet_wire::ArpRepr::parse(p) {
                    if req.op == usnet_wire::ArpOp::Request {
                        let reply = usnet_wire::ArpRepr {
                            op: usnet_wire::ArpOp::Reply,
                            sender_mac: PEER_MAC,
                            sender_ip: req.target_ip,
                            target_mac: req.sender_mac,
                            target_ip: req.sender_ip,
                        };
                        let mut b = [0u8; 28];
                        if reply.emit(&mut b).is_ok() {
                            self.resolved += 1;
                            self.inject_frame(ETH_ARP, &b);
                        }
                    }
                }
            }
            ETH_IPV4 if p.len() >= 20 => {
                let total = u16::from_be_bytes([p[2], p[3]]) as usize;
                let n = total.clamp(20, p.len());
                self.sniffed += 1;
                self.out.push_back((p[..n].to_vec(), self.now_us()));
            }
            ETH_IPV6 if p.len() >= 40 => {
                if let Some(na) = neighbor_advert_for(p) {
                    self.resolved += 1;
                    self.inject_frame(ETH_IPV6, &na);
                    return;
                }
                let n = (40 + u16::from_be_bytes([p[4], p[5]]) as usize).min(p.len());
                // Neighbour/router discovery and MLD are link business, not the script's.
                if p[6] == 58 && n > 40 && (130..=143).contains(&p[40]) {
                    return;
                }
                self.sniffed += 1;
                self.out.push_back((p[..n].to_vec(), self.now_us()));
            }
            _ => {}
        }
    }

    fn inject_frame(&mut self, ethertype: u16, payload: &[u8]) -> bool {
        let mut f = Vec::with_capacity(14 + payload.len());
        f.extend_from_slice(&STACK_MAC.0);
        f.extend_from_slice(&PEER_MAC.0);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        match self.stack.pool_mut().alloc_from(&f) {
            Some(b) => {
                self.stack.receive(b);
                true
            }
            None => false,
        }
    }

    /// `netdev_send`: an IP packet from the script.
    pub fn inject(&mut self, ip: &[u8]) -> Res<()> {
        let et = match ip.first().map(|b| b >> 4) {
            Some(4) => ETH_IPV4,
            Some(6) => ETH_IPV6,
            _ => return Err(libc::EINVAL),
        };
        if !self.inject_frame(et, ip) {
            return Err(libc::ENOBUFS);
        }
        self.injected += 1;
        self.pump();
        Ok(())
    }

    /// Moves the virtual clock to `target_ns`, stopping at every stack deadline on
    /// the way so timers fire at their own time.
    pub fn advance_to(&mut self, target_ns: u64) {
        loop {
            self.pump();
            let next = self.stack.poll_at().map(|t| t.as_nanos());
            match next {
                Some(t) if t > self.now_ns && t <= target_ns => self.now_ns = t,
                Some(t) if t <= self.now_ns => {
                    // Due now but nothing happened in pump: avoid spinning.
                    if self.now_ns >= target_ns {
                        break;
                    }
                    self.now_ns = (self.now_ns + 1_000).min(target_ns);
                }
                _ => {
                    self.now_ns = self.now_ns.max(target_ns);
                    self.pump();
                    break;
                }
            }
        }
    }

    /// `netdev_receive` without blocking: the next packet the stack sent, jumping the
    /// clock to the stack's next timer (at most `horizon_ns` ahead) if none is queued.
    pub fn sniff(&mut self, horizon_ns: u64) -> Option<(Vec<u8>, u64)> {
        self.pump();
        let limit = self.now_ns.saturating_add(horizon_ns);
        while self.out.is_empty() {
            match self.stack.poll_at().map(|t| t.as_nanos()) {
                Some(t) if t <= limit => {
                    let t = t.max(self.now_ns + 1);
                    self.advance_to(t);
                }
                _ => break,
            }
        }
        self.out.pop_front()
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
        let fd = (3..).find(|f| !self.fds.contains_key(f)).unwrap_or(3);
        self.fds.insert(
            fd,
            Fd {
                kind: Kind::Fresh(None),
                nonblock: ty & libc::SOCK_NONBLOCK != 0,
                v6,
                nodelay: false,
                reuseaddr: false,
                so_error: 0,
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
            .stack
            .tcp_listen(addr, backlog.clamp(1, 65535) as usize)
            .map_err(map)?;
        self.fd(fd)?.kind = Kind::Listen(h);
        Ok(())
    }

    /// Non-blocking accept: `EAGAIN` when nothing is queued.
    pub fn try_accept(&mut self, fd: c_int) -> Res<(c_int, SocketAddr)> {
        self.pump();
        let f = self.fd(fd)?;
        let (Kind::Listen(h), v6, nodelay) = (f.kind, f.v6, f.nodelay) else {
            return Err(libc::EINVAL);
        };
        let c = self.stack.tcp_accept(h).map_err(map)?;
        let peer = self.stack.tcp_peer_addr(c).map_err(map)?;
        if nodelay {
            let _ = self.stack.tcp_set_nodelay(c, true);
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
        let h = self.stack.tcp_connect(local, remote).map_err(map)?;
        if nodelay {
            let _ = self.stack.tcp_set_nodelay(h, true);
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
        if let Some(e) = self.stack.tcp_error(h).map_err(map)? {
            return Err(map(e));
        }
        Ok(self.stack.readiness(h).map_err(map)?.connected)
    }

    pub fn try_read(&mut self, fd: c_int, buf: &mut [u8]) -> Res<usize> {
        let h = self.conn(fd)?;
        let r = self.stack.tcp_recv(h, buf).map_err(map);
        self.pump();
        r
    }

    pub fn try_write(&mut self, fd: c_int, data: &[u8]) -> Res<usize> {
        let h = self.conn(fd)?;
        let r = match self.stack.tcp_send(h, data) {
            Ok(0) if !data.is_empty() => Err(libc::EAGAIN),
            r => r.map_err(map),
        };
        self.pump();
        r
    }

    pub fn close(&mut self, fd: c_int) -> Res<()> {
        let f = self.fds.remove(&fd).ok_or(libc::EBADF)?;
        match f.kind {
            Kind::Conn(h) | Kind::Listen(h) => {
                let _ = self.stack.close(h);
            }
            Kind::Fresh(_) => {}
        }
        self.pump();
        Ok(())
    }

    pub fn shutdown(&mut self, fd: c_int, how: c_int) -> Res<()> {
        let h = self.conn(fd)?;
        match how {
            libc::SHUT_WR | libc::SHUT_RDWR => self.stack.tcp_shutdown_write(h).map_err(map)?,
            libc::SHUT_RD => {}
            _ => return Err(libc::EINVAL),
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
        let Ok(r) = self.stack.readiness(h) else {
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
            if matches!(self.stack.tcp_error(h), Ok(Some(_))) {
                ev |= libc::POLLERR;
            }
        }
        ev
    }
}

/// A neighbour advertisement answering `ns` (an IPv6 packet), if it is a solicitation.
fn neighbor_advert_for(ns: &[u8]) -> Option<Vec<u8>> {
    if ns.len() < 40 + 24 || ns[6] != 58 || ns[40] != 135 {
        return None;
    }
    let src: [u8; 16] = ns[8..24].try_into().ok()?;
    let target: [u8; 16] = ns[48..64].try_into().ok()?;
    let dst = if src == [0; 16] {
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets()
    } else {
        src
    };
    let mut icmp = vec![136u8, 0, 0, 0, 0x60, 0, 0, 0];
    icmp.extend_from_slice(&target);
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&PEER_MAC.0);
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&target);
    add(&dst);
    add(&(icmp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(&icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let ck = !(sum as u16);
    icmp[2..4].copy_from_slice(&ck.to_be_bytes());
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    p.extend_from_slice(&[58, 255]);
    p.extend_from_slice(&target);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&icmp);
    Some(p)
}

// ------------------------------------------------------------------ C glue

struct Shared {
    inner: Mutex<Backend>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Backend> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Waits until another thread changes something (a packet, the clock).
    fn wait<'a>(&self, g: MutexGuard<'a, Backend>) -> MutexGuard<'a, Backend> {
        match self.cv.wait_timeout(g, Duration::from_millis(50)) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        }
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f` on the shared state, catching panics (a panic never crosses into C: it
/// becomes `EIO`), and turns `Err(errno)` into `-1` with errno set.
fn with<T: Into<i64>>(ud: *mut c_void, f: impl FnOnce(&Shared) -> Res<T>) -> i64 {
    if ud.is_null() {
        set_errno(libc::EBADF);
        return -1;
    }
    // SAFETY: `ud` is the pointer `packetdrill_interface_init` made from a Box<Shared>
    // and only `free` releases it.
    let shared = unsafe { &*(ud as *const Shared) };
    match catch_unwind(AssertUnwindSafe(|| f(shared))) {
        Ok(Ok(v)) => v.into(),
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// Reads a `sockaddr_in`/`sockaddr_in6`.
///
/// # Safety
/// `addr` must point to `len` readable bytes.
unsafe fn read_sockaddr(addr: *const sockaddr, len: socklen_t) -> Res<SocketAddr> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: non-null, the caller promises `len` bytes; sizes checked before reading.
    unsafe {
        match (*addr).sa_family as c_int {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                let a = &*(addr as *const libc::sockaddr_in);
                Ok(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let a = &*(addr as *const libc::sockaddr_in6);
                Ok(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => Err(libc::EINVAL),
        }
    }
}

/// Writes `sa` into a caller's buffer (truncating like the kernel) and sets `*len`.
///
/// # Safety
/// `addr` must point to `*len` writable bytes (or both may be null).
unsafe fn write_sockaddr(sa: SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: sockaddr_storage is plain data; zeroed is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = match sa {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let s = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let s = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_addr.s6_addr = a.ip().octets();
            s.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    // SAFETY: caller promises `*len` writable bytes at `addr`; we copy at most that.
    unsafe {
        let room = (*len as usize).min(n);
        std::ptr::copy_nonoverlapping(&st as *const _ as *const u8, addr as *mut u8, room);
        *len = n as socklen_t;
    }
}

/// Blocks (for a blocking socket) until `op` stops saying `EAGAIN`.
fn blocking<T>(
    s: &Shared,
    fd: c_int,
    force_nonblock: bool,
    mut op: impl FnMut(&mut Backend) -> Res<T>,
) -> Res<T> {
    let mut g = s.lock();
    loop {
        match op(&mut g) {
            Err(libc::EAGAIN) => {
                let nb = force_nonblock || g.fds.get(&fd).is_none_or(|f| f.nonblock);
                if nb {
                    return Err(libc::EAGAIN);
                }
                g = s.wait(g);
            }
            r => {
                s.cv.notify_all();
                return r;
            }
        }
    }
}

unsafe extern "C" fn pd_free(ud: *mut c_void) {
    if !ud.is_null() {
        // SAFETY: made by Box::into_raw in packetdrill_interface_init; freed once.
        drop(unsafe { Box::from_raw(ud as *mut Shared) });
    }
}

unsafe extern "C" fn pd_socket(ud: *mut c_void, d: c_int, t: c_int, p: c_int) -> c_int {
    with(ud, |s| s.lock().socket(d, t, p)) as c_int
}

unsafe extern "C" fn pd_bind(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        // SAFETY: packetdrill passes a sockaddr of `l` bytes.
        let a = unsafe { read_sockaddr(a, l) }?;
        s.lock().bind(fd, a).map(|_| 0)
    }) as c_int
}

unsafe extern "C" fn pd_listen(ud: *mut c_void, fd: c_int, backlog: c_int) -> c_int {
    with(ud, |s| s.lock().listen(fd, backlog).map(|_| 0)) as c_int
}

unsafe extern "C" fn pd_accept(
    ud: *mut c_void,
    fd: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> c_int {
    with(ud, |s| {
        let (nfd, peer) = blocking(s, fd, false, |b| b.try_accept(fd))?;
        // SAFETY: accept(2) contract: `a` has `*l` bytes (or is null).
        unsafe { write_sockaddr(peer, a, l) };
        Ok(nfd)
    }) as c_int
}

unsafe extern "C" fn pd_connect(
    ud: *mut c_void,
    fd: c_int,
    a: *const sockaddr,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        // SAFETY: connect(2) contract.
        let a = unsafe { read_sockaddr(a, l) }?;
        let mut g = s.lock();
        g.start_connect(fd, a)?;
        s.cv.notify_all();
        if g.fds.get(&fd).is_some_and(|f| f.nonblock) {
            return Err(libc::EINPROGRESS);
        }
        drop(g);
        blocking(s, fd, false, |b| match b.connect_status(fd)? {
            true => Ok(0),
            false => Err(libc::EAGAIN),
        })
    }) as c_int
}

fn do_read(s: &Shared, fd: c_int, buf: &mut [u8], flags: c_int) -> Res<i64> {
    if flags & !(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    blocking(s, fd, flags & libc::MSG_DONTWAIT != 0, |b| {
        b.try_read(fd, buf)
    })
    .map(|n| n as i64)
}

fn do_write(s: &Shared, fd: c_int, data: &[u8], flags: c_int) -> Res<i64> {
    if flags & !(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let mut done = 0;
    // A blocking write returns when everything is queued, like the kernel's.
    let r = blocking(s, fd, flags & libc::MSG_DONTWAIT != 0, |b| {
        let n = b.try_write(fd, &data[done..])?;
        done += n;
        if done < data.len() {
            Err(libc::EAGAIN)
        } else {
            Ok(())
        }
    });
    match r {
        Ok(()) => Ok(done as i64),
        Err(_) if done > 0 => Ok(done as i64),
        Err(e) => Err(e),
    }
}

/// # Safety
/// `buf` must be valid for `n` bytes (or `n == 0`).
unsafe fn slice_mut<'a>(buf: *mut c_void, n: size_t) -> Res<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) })
}

/// # Safety
/// `buf` must be valid for `n` bytes (or `n == 0`).
unsafe fn slice<'a>(buf: *const c_void, n: size_t) -> Res<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, n) })
}

/// Gathers an iovec into one buffer.
///
/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn gather(iov: *const iovec, cnt: c_int) -> Res<Vec<u8>> {
    if cnt < 0 || (cnt > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::new();
    for i in 0..cnt as usize {
        // SAFETY: caller's contract.
        let e = unsafe { &*iov.add(i) };
        // SAFETY: each entry describes readable memory.
        v.extend_from_slice(unsafe { slice(e.iov_base, e.iov_len) }?);
    }
    Ok(v)
}

/// Scatters `data` over an iovec.
///
/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn scatter(iov: *const iovec, cnt: c_int, mut data: &[u8]) -> Res<()> {
    for i in 0..cnt.max(0) as usize {
        if data.is_empty() {
            break;
        }
        // SAFETY: caller's contract.
        let e = unsafe { &*iov.add(i) };
        let n = e.iov_len.min(data.len());
        // SAFETY: each entry describes writable memory.
        unsafe { slice_mut(e.iov_base, n) }?.copy_from_slice(&data[..n]);
        data = &data[n..];
    }
    Ok(())
}

/// # Safety
/// `iov` must hold `cnt` valid entries.
unsafe fn iov_len(iov: *const iovec, cnt: c_int) -> Res<usize> {
    if cnt < 0 || (cnt > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: caller's contract.
    Ok((0..cnt as usize)
        .map(|i| unsafe { (*iov.add(i)).iov_len })
        .sum())
}

unsafe extern "C" fn pd_read(ud: *mut c_void, fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: read(2) contract.
    with(ud, |s| do_read(s, fd, unsafe { slice_mut(buf, n) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_recv(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: recv(2) contract.
    with(ud, |s| do_read(s, fd, unsafe { slice_mut(buf, n) }?, flags)) as ssize_t
}

unsafe extern "C" fn pd_recvfrom(
    ud: *mut c_void,
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    with(ud, |s| {
        // SAFETY: recvfrom(2) contract.
        let r = do_read(s, fd, unsafe { slice_mut(buf, n) }?, flags)?;
        let mut g = s.lock();
        if let Ok(h) = g.conn(fd) {
            if let Ok(peer) = g.stack.tcp_peer_addr(h) {
                // SAFETY: recvfrom(2) contract.
                unsafe { write_sockaddr(peer, a, l) };
            }
        }
        Ok(r)
    }) as ssize_t
}

unsafe extern "C" fn pd_readv(
    ud: *mut c_void,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
) -> ssize_t {
    with(ud, |s| {
        // SAFETY: readv(2) contract.
        let mut tmp = vec![0u8; unsafe { iov_len(iov, cnt) }?];
        let n = do_read(s, fd, &mut tmp, 0)?;
        // SAFETY: readv(2) contract.
        unsafe { scatter(iov, cnt, &tmp[..n as usize]) }?;
        Ok(n)
    }) as ssize_t
}

unsafe extern "C" fn pd_recvmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *mut msghdr,
    flags: c_int,
) -> ssize_t {
    with(ud, |s| {
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: recvmsg(2) contract.
        let m = unsafe { &mut *m };
        let cnt = m.msg_iovlen as c_int;
        // SAFETY: recvmsg(2) contract.
        let mut tmp = vec![0u8; unsafe { iov_len(m.msg_iov, cnt) }?];
        let n = do_read(s, fd, &mut tmp, flags)?;
        // SAFETY: recvmsg(2) contract.
        unsafe { scatter(m.msg_iov, cnt, &tmp[..n as usize]) }?;
        m.msg_controllen = 0;
        m.msg_flags = 0;
        Ok(n)
    }) as ssize_t
}

unsafe extern "C" fn pd_write(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
) -> ssize_t {
    // SAFETY: write(2) contract.
    with(ud, |s| do_write(s, fd, unsafe { slice(buf, n) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_send(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: send(2) contract.
    with(ud, |s| do_write(s, fd, unsafe { slice(buf, n) }?, flags)) as ssize_t
}

unsafe extern "C" fn pd_sendto(
    ud: *mut c_void,
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    _a: *const sockaddr,
    _l: socklen_t,
) -> ssize_t {
    // SAFETY: sendto(2) contract (the address is ignored on a connected TCP socket).
    with(ud, |s| do_write(s, fd, unsafe { slice(buf, n) }?, flags)) as ssize_t
}

unsafe extern "C" fn pd_writev(
    ud: *mut c_void,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
) -> ssize_t {
    // SAFETY: writev(2) contract.
    with(ud, |s| do_write(s, fd, &unsafe { gather(iov, cnt) }?, 0)) as ssize_t
}

unsafe extern "C" fn pd_sendmsg(
    ud: *mut c_void,
    fd: c_int,
    m: *const msghdr,
    flags: c_int,
) -> ssize_t {
    with(ud, |s| {
        if m.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: sendmsg(2) contract.
        let m = unsafe { &*m };
        // SAFETY: sendmsg(2) contract.
        let data = unsafe { gather(m.msg_iov, m.msg_iovlen as c_int) }?;
        do_write(s, fd, &data, flags)
    }) as ssize_t
}

unsafe extern "C" fn pd_fcntl(ud: *mut c_void, fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        let f = g.fd(fd)?;
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDWR | if f.nonblock { libc::O_NONBLOCK } else { 0 }),
            libc::F_SETFL => {
                f.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
                Ok(0)
            }
            libc::F_GETFD | libc::F_SETFD => Ok(0),
            _ => Err(libc::EINVAL),
        }
    }) as c_int
}

unsafe extern "C" fn pd_ioctl(ud: *mut c_void, fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        match req {
            libc::FIONREAD => {
                let h = g.conn(fd)?;
                let n = g.stack.tcp_recv_available(h).map_err(map)?;
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONREAD's argument is an int*.
                unsafe { *(arg as *mut c_int) = n.min(c_int::MAX as usize) as c_int };
                Ok(0)
            }
            libc::FIONBIO => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONBIO's argument is an int*.
                let on = unsafe { *(arg as *const c_int) } != 0;
                g.fd(fd)?.nonblock = on;
                Ok(0)
            }
            _ => Err(libc::ENOTTY),
        }
    }) as c_int
}

unsafe extern "C" fn pd_close(ud: *mut c_void, fd: c_int) -> c_int {
    with(ud, |s| {
        let r = s.lock().close(fd).map(|_| 0);
        s.cv.notify_all();
        r
    }) as c_int
}

unsafe extern "C" fn pd_shutdown(ud: *mut c_void, fd: c_int, how: c_int) -> c_int {
    with(ud, |s| s.lock().shutdown(fd, how).map(|_| 0)) as c_int
}

/// # Safety
/// `v` must have `*l` writable bytes.
unsafe fn put_int(v: *mut c_void, l: *mut socklen_t, x: c_int) -> Res<i32> {
    if v.is_null() || l.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: caller's contract; we write at most `*l` bytes.
    unsafe {
        let b = x.to_ne_bytes();
        let n = (*l as usize).min(4);
        std::ptr::copy_nonoverlapping(b.as_ptr(), v as *mut u8, n);
        *l = n as socklen_t;
    }
    Ok(0)
}

unsafe extern "C" fn pd_getsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    l: *mut socklen_t,
) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        let f = g.fd(fd)?;
        let (kind, nodelay, reuse) = (f.kind, f.nodelay, f.reuseaddr);
        let x = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => {
                let mut e = std::mem::take(&mut g.fd(fd)?.so_error);
                if let (0, Kind::Conn(h)) = (e, kind) {
                    e = g.stack.tcp_error(h).ok().flatten().map_or(0, map);
                }
                e
            }
            (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
            (libc::SOL_SOCKET, libc::SO_REUSEADDR) => reuse as c_int,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => nodelay as c_int,
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => match kind {
                Kind::Conn(h) => g.stack.tcp_info(h).map_err(map)?.snd_mss as c_int,
                _ => g.stack.tcp_config().mss as c_int,
            },
            _ => return Err(libc::ENOPROTOOPT),
        };
        // SAFETY: getsockopt(2) contract.
        unsafe { put_int(v, l, x) }
    }) as c_int
}

unsafe extern "C" fn pd_setsockopt(
    ud: *mut c_void,
    fd: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    l: socklen_t,
) -> c_int {
    with(ud, |s| {
        let int = || -> Res<c_int> {
            if v.is_null() || (l as usize) < 4 {
                return Err(libc::EINVAL);
            }
            // SAFETY: at least 4 readable bytes (checked).
            Ok(unsafe { std::ptr::read_unaligned(v as *const c_int) })
        };
        let mut g = s.lock();
        let kind = g.fd(fd)?.kind;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_REUSEPORT) => {
                g.fd(fd)?.reuseaddr = int()? != 0;
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE | libc::SO_SNDBUF | libc::SO_RCVBUF) => {
                int()?;
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if v.is_null() || (l as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: size checked.
                let lg = unsafe { std::ptr::read_unaligned(v as *const libc::linger) };
                if let Kind::Conn(h) = kind {
                    let d =
                        (lg.l_onoff != 0).then(|| Duration::from_secs(lg.l_linger.max(0) as u64));
                    g.stack.tcp_set_linger(h, d).map_err(map)?;
                }
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
                let on = int()? != 0;
                g.fd(fd)?.nodelay = on;
                if let Kind::Conn(h) = kind {
                    g.stack.tcp_set_nodelay(h, on).map_err(map)?;
                    g.pump();
                }
            }
            _ => return Err(libc::ENOPROTOOPT),
        }
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_poll(
    ud: *mut c_void,
    fds: *mut pollfd,
    n: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    with(ud, |s| {
        if n > 0 && fds.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: poll(2) contract.
        let fds = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        let mut g = s.lock();
        let deadline = (timeout >= 0).then(|| g.now_ns + timeout as u64 * 1_000_000);
        loop {
            g.pump();
            let mut ready = 0;
            for p in fds.iter_mut() {
                p.revents = 0;
                if p.fd < 0 {
                    continue;
                }
                let ev = g.revents(p.fd);
                p.revents = ev & (p.events | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL);
                if p.revents != 0 {
                    ready += 1;
                }
            }
            if ready > 0 || deadline.is_some_and(|d| g.now_ns >= d) {
                return Ok(ready);
            }
            g = s.wait(g);
        }
    }) as c_int
}

unsafe extern "C" fn pd_netdev_send(ud: *mut c_void, buf: *const c_void, n: size_t) -> c_int {
    with(ud, |s| {
        // SAFETY: packetdrill passes `n` bytes of packet.
        let p = unsafe { slice(buf, n) }?;
        let r = s.lock().inject(p).map(|_| 0);
        s.cv.notify_all();
        r
    }) as c_int
}

/// How far `netdev_receive` lets the virtual clock run looking for a packet before it
/// reports "nothing" (packetdrill then asks again, and the clock runs on).
const SNIFF_HORIZON_NS: u64 = 1_000_000_000;

unsafe extern "C" fn pd_netdev_receive(
    ud: *mut c_void,
    buf: *mut c_void,
    count: *mut size_t,
    time_us: *mut c_longlong,
) -> c_int {
    with(ud, |s| {
        if count.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: `*count` is the buffer size (packetdrill.h).
        let room = unsafe { *count };
        // SAFETY: `buf` has `room` bytes.
        let out = unsafe { slice_mut(buf, room) }?;
        let mut g = s.lock();
        let mut got = g.sniff(SNIFF_HORIZON_NS);
        if got.is_none() {
            // Give a system-call thread the chance to make the stack send something.
            g = s.wait(g);
            got = g.sniff(SNIFF_HORIZON_NS);
        }
        s.cv.notify_all();
        let epoch = g.epoch_us;
        drop(g);
        match got {
            Some((p, t)) => {
                let n = p.len().min(room);
                out[..n].copy_from_slice(&p[..n]);
                // SAFETY: out-parameters from the caller.
                unsafe {
                    *count = n;
                    if !time_us.is_null() {
                        *time_us = epoch + t as c_longlong;
                    }
                }
                Ok(0)
            }
            None => {
                // SAFETY: as above.
                unsafe { *count = 0 };
                Err(libc::EAGAIN)
            }
        }
    }) as c_int
}

unsafe extern "C" fn pd_usleep(ud: *mut c_void, us: libc::useconds_t) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        let t = g.now_ns + us as u64 * 1000;
        g.advance_to(t);
        s.cv.notify_all();
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_gettimeofday(ud: *mut c_void, tv: *mut timeval, _tz: *mut c_void) -> c_int {
    with(ud, |s| {
        let mut g = s.lock();
        let t = g.now_ns + g.tick_ns;
        g.advance_to(t);
        let us = g.epoch_us + g.now_us() as i64;
        drop(g);
        s.cv.notify_all();
        if !tv.is_null() {
            // SAFETY: gettimeofday(2) contract.
            unsafe {
                (*tv).tv_sec = us.div_euclid(1_000_000) as libc::time_t;
                (*tv).tv_usec = us.rem_euclid(1_000_000) as libc::suseconds_t;
            }
        }
        Ok(0)
    }) as c_int
}

unsafe extern "C" fn pd_epoll_create(ud: *mut c_void, _size: c_int) -> c_int {
    with(ud, |_| Err::<i32, _>(libc::ENOSYS)) as c_int
}
unsafe extern "C" fn pd_epoll_ctl(
    ud: *mut c_void,
    _e: c_int,
    _o: c_int,
    _f: c_int,
    _ev: *mut libc::epoll_event,
) -> c_int {
    with(ud, |_| Err::<i32, _>(libc::ENOSYS)) as c_int
}
unsafe extern "C" fn pd_epoll_wait(
    ud: *mut c_void,
    _e: c_int,
    _ev: *mut libc::epoll_event,
    _m: c_int,
    _t: c_int,
) -> c_int {
    with(ud, |_| Err::<i32, _>(libc::ENOSYS)) as c_int
}
unsafe extern "C" fn pd_pipe(ud: *mut c_void, _fds: *mut c_int) -> c_int {
    with(ud, |_| Err::<i32, _>(libc::ENOSYS)) as c_int
}
unsafe extern "C" fn pd_splice(
    ud: *mut c_void,
    _a: c_int,
    _b: *mut libc::loff_t,
    _c: c_int,
    _d: *mut libc::loff_t,
    _n: size_t,
    _f: c_uint,
) -> ssize_t {
    with(ud, |_| Err::<i32, _>(libc::ENOSYS)) as ssize_t
}

/// packetdrill's entry point: fills `ifc` (every member, so no call hits a null
/// pointer). On a bad `flags` string it prints why and leaves `userdata` null, so every
/// call then fails with `EBADF`.
///
/// # Safety
/// `ifc` must point to a writable `struct packetdrill_interface`; `flags` is null or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn packetdrill_interface_init(
    flags: *const c_char,
    ifc: *mut PacketdrillInterface,
) {
    if ifc.is_null() {
        return;
    }
    let flags = if flags.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string from packetdrill's command line.
        unsafe { CStr::from_ptr(flags) }
            .to_string_lossy()
            .into_owned()
    };
    let made = catch_unwind(|| {
        let o = Options::parse(&flags)?;
        Backend::new(&o)
    });
    let userdata = match made {
        Ok(Ok(b)) => Box::into_raw(Box::new(Shared {
            inner: Mutex::new(b),
            cv: Condvar::new(),
        })) as *mut c_void,
        Ok(Err(e)) => {
            eprintln!("usnet-packetdrill: {e}");
            std::ptr::null_mut()
        }
        Err(_) => std::ptr::null_mut(),
    };
    let v = PacketdrillInterface {
        userdata,
        free: Some(pd_free),
        socket: Some(pd_socket),
        bind: Some(pd_bind),
        listen: Some(pd_listen),
        accept: Some(pd_accept),
        connect: Some(pd_connect),
        read: Some(pd_read),
        readv: Some(pd_readv),
        recv: Some(pd_recv),
        recvfrom: Some(pd_recvfrom),
        recvmsg: Some(pd_recvmsg),
        write: Some(pd_write),
        writev: Some(pd_writev),
        send: Some(pd_send),
        sendto: Some(pd_sendto),
        sendmsg: Some(pd_sendmsg),
        fcntl: Some(pd_fcntl),
        ioctl: Some(pd_ioctl),
        close: Some(pd_close),
        shutdown: Some(pd_shutdown),
        getsockopt: Some(pd_getsockopt),
        setsockopt: Some(pd_setsockopt),
        poll: Some(pd_poll),
        netdev_send: Some(pd_netdev_send),
        netdev_receive: Some(pd_netdev_receive),
        usleep: Some(pd_usleep),
        gettimeofday: Some(pd_gettimeofday),
        epoll_create: Some(pd_epoll_create),
        epoll_ctl: Some(pd_epoll_ctl),
        epoll_wait: Some(pd_epoll_wait),
        pipe: Some(pd_pipe),
        splice: Some(pd_splice),
    };
    // SAFETY: checked non-null; the caller owns a struct of this layout.
    unsafe { std::ptr::write(ifc, v) };
}

/// The packetdrill.h member count this library fills (checked by the C driver test
/// against `sizeof(struct packetdrill_interface)`).
#[no_mangle]
pub extern "C" fn usnet_packetdrill_interface_size() -> size_t {
    std::mem::size_of::<PacketdrillInterface>()
}
