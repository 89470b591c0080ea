//! The POSIX socket layer (usnet-posix) driven through libusnet's C functions
//! (`usnet_socket`, `usnet_setsockopt`, ...; crate usnet-ffi) against a real stack
//! server running in this process (`usnet_server::testing::in_memory`: its own loop
//! thread on the real clock, sessions over shared memory, an in-memory link; the
//! stack delivers to its own addresses, so connections to its own listeners are
//! made for real).
//!
//! Each input is a sequence of calls on eight descriptor slots, with addresses from
//! the stack's own (and a few others), option levels and names from the real ones
//! plus arbitrary ones, option values as arbitrary bytes with arbitrary lengths,
//! NULL pointers and short buffers where the C API lets a caller pass them. Every
//! socket is non-blocking and every wait has a zero timeout: no call may block.
//!
//! Checked: no panic or abort; every failing call's errno is one Linux could give
//! for that call; lengths written back stay within what the caller gave; at the end
//! every descriptor the input was given closes, and the layer's descriptor table
//! is back where it started; the server is still running and takes a new socket.
#![no_main]

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libc::{c_int, socklen_t};
use libfuzzer_sys::fuzz_target;
use usnet::socket as c;
use usnet_posix::sockopt as so;

const ADDR4: &str = "10.71.0.1";
const ADDR6: &str = "fd00:71::1";
const SLOTS: usize = 8;

struct World {
    server: usnet_server::ServerHandle,
    /// A kernel file for `sendfile` to read.
    file: c_int,
    /// The layer's descriptors before any input.
    baseline: Vec<c_int>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // libFuzzer's main is C: Rust's runtime did not set SIGPIPE to SIG_IGN, and
        // a send on a closed stream without MSG_NOSIGNAL raises it, as the kernel does.
        // SAFETY: no memory arguments.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let d = std::env::temp_dir().join(format!("usnet-posix-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server or the client reads it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
        let mut stack = usnet_stack::StackConfig {
            mac: usnet_stack::mac_from_seed(71),
            addrs: vec![
                format!("{ADDR4}/24").parse().unwrap(),
                format!("{ADDR6}/64").parse().unwrap(),
            ],
            ..Default::default()
        };
        // Connections of one input must not hold ports for the next ones for long.
        stack.tcp.time_wait = Duration::from_millis(100);
        stack.tcp.max_retries = 2;
        let name = format!("posix-fuzz-{}", std::process::id());
        let cfg = usnet_server::ServerConfig {
            name: name.clone(),
            link: "mem".into(),
            // The loop sleeps as soon as it is idle: a spinning loop thread takes the
            // core from the calls that would give it work, and its varying
            // iteration counts look like new coverage to libFuzzer on every input.
            spin: Duration::ZERO,
            ..Default::default()
        };
        let server = usnet_server::testing::in_memory(stack, cfg).unwrap();
        let cname = std::ffi::CString::new(name).unwrap();
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { c::usnet_attach(cname.as_ptr()) }, 0, "attach");
        // SAFETY: plain system calls on our own buffers.
        let file = unsafe {
            let fd = libc::memfd_create(c"posix-fuzz".as_ptr(), 0);
            assert!(fd >= 0);
            let data = [0x5au8; 4096];
            assert_eq!(libc::write(fd, data.as_ptr().cast(), data.len()), 4096);
            fd
        };
        World {
            server,
            file,
            baseline: usnet_posix::descriptors_in(0, c_int::MAX),
        }
    })
}

// ------------------------------------------------------------------ inputs

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Fd {
    Slot(u8),
    Bad(BadFd),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum BadFd {
    Minus1,
    Huge,
    /// A kernel descriptor that is no usnet socket (the memfd).
    Kernel,
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Host {
    Own4,
    Own6,
    Mapped4,
    Any4,
    Any6,
    /// On the link, nobody there.
    Neighbour4,
    Neighbour6,
    Loopback4,
    Loopback6,
    Multicast4,
    Broadcast4,
    Raw4(u32),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Port {
    P(u8),
    Zero,
    Raw(u16),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum AddrLen {
    Exact,
    Short(u8),
    Long(u8),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Addr {
    Ip {
        host: Host,
        port: Port,
        len: AddrLen,
        flow: u32,
        scope: u32,
    },
    /// A family other than AF_INET/AF_INET6, or garbage.
    Family {
        family: u16,
        len: u8,
    },
    Null(u8),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum AddrOut {
    Full,
    Short(u8),
    NullBoth,
    NullAddr,
    NullLen,
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Opt {
    Known(u8),
    Raw(i32, i32),
    Level(u8, i32),
}

#[derive(Debug, Arbitrary, Clone)]
enum OptVal {
    Int(i32),
    Byte(u8),
    Bytes(Vec<u8>),
    Timeval(i64, i64),
    Linger(i32, i32),
    Mreq4 {
        group: u8,
        own_if: bool,
        index: Option<i32>,
    },
    Mreq6 {
        group: u8,
        index: u32,
    },
    Congestion(u8),
    FastopenKey([u8; 32], u8),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum ValLen {
    Exact,
    Shorter(u8),
    Zero,
    Null(u16),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum Flags {
    None,
    Known(u8),
    Raw(i32),
}

#[derive(Debug, Arbitrary, Clone, Copy)]
enum IovLen {
    Exact,
    Fewer(u8),
    TooMany,
    Negative,
}

#[derive(Debug, Arbitrary)]
enum Call {
    Socket {
        slot: u8,
        v6: bool,
        dgram: bool,
        cloexec: bool,
        proto: i8,
        junk: Option<i32>,
    },
    BadSocket {
        domain: i32,
        ty: i32,
        proto: i32,
    },
    Bind {
        fd: Fd,
        addr: Addr,
    },
    Listen {
        fd: Fd,
        backlog: i16,
    },
    Accept {
        fd: Fd,
        slot: u8,
        flags: u8,
        out: AddrOut,
        plain: bool,
    },
    Connect {
        fd: Fd,
        addr: Addr,
    },
    Send {
        fd: Fd,
        len: u16,
        flags: Flags,
        null: bool,
        write: bool,
    },
    SendTo {
        fd: Fd,
        len: u16,
        flags: Flags,
        addr: Option<Addr>,
    },
    SendMsg {
        fd: Fd,
        iov: Vec<u16>,
        n: IovLen,
        name: Option<Addr>,
        control: u8,
        flags: Flags,
        null: bool,
    },
    Writev {
        fd: Fd,
        iov: Vec<u16>,
        n: IovLen,
    },
    Recv {
        fd: Fd,
        len: u16,
        flags: Flags,
        null: bool,
        read: bool,
    },
    RecvFrom {
        fd: Fd,
        len: u16,
        flags: Flags,
        out: AddrOut,
    },
    RecvMsg {
        fd: Fd,
        iov: Vec<u16>,
        n: IovLen,
        name: AddrOut,
        control: u8,
        flags: Flags,
        null: bool,
    },
    Readv {
        fd: Fd,
        iov: Vec<u16>,
        n: IovLen,
    },
    SetSockOpt {
        fd: Fd,
        opt: Opt,
        val: OptVal,
        len: ValLen,
    },
    GetSockOpt {
        fd: Fd,
        opt: Opt,
        cap: u16,
        null_val: bool,
        null_len: bool,
    },
    Shutdown {
        fd: Fd,
        how: i8,
    },
    Close {
        fd: Fd,
    },
    Dup {
        fd: Fd,
        slot: u8,
    },
    Dup2 {
        old: Fd,
        new: Fd,
        slot: u8,
    },
    Dup3 {
        old: Fd,
        new: Fd,
        slot: u8,
        flags: i32,
    },
    Fcntl {
        fd: Fd,
        cmd: u8,
        arg: i64,
        slot: u8,
    },
    Ioctl {
        fd: Fd,
        req: u8,
        val: i32,
        null: bool,
    },
    Poll {
        fds: Vec<(Fd, i16)>,
        null: bool,
    },
    EpollCreate {
        slot: u8,
        flags: i32,
        old: Option<i32>,
    },
    EpollCtl {
        ep: Fd,
        op: i8,
        fd: Fd,
        events: u32,
        data: u64,
        null: bool,
    },
    EpollWait {
        ep: Fd,
        max: i8,
        null: bool,
    },
    GetSockName {
        fd: Fd,
        out: AddrOut,
    },
    GetPeerName {
        fd: Fd,
        out: AddrOut,
    },
    SendFile {
        fd: Fd,
        from_file: bool,
        off: Option<i64>,
        count: u16,
    },
    IsSocket {
        fd: Fd,
    },
    /// Lets the server's loop catch up: polls `fd` (timeout 0) until it is ready,
    /// for at most a short while.
    Settle {
        fd: Fd,
        events: i16,
    },
    /// A connection to the stack's own listener, made for real: a listener on
    /// slot `l` (port `port` of the stack's address), a client on slot `c` that
    /// connects to it, and the accepted socket on slot `s`, each step through the
    /// C functions and checked as the others (a step that fails ends it).
    Pair {
        l: u8,
        c: u8,
        s: u8,
        v6: bool,
        port: u8,
    },
}

// ------------------------------------------------------------------ the state

struct St {
    w: &'static World,
    slots: [c_int; SLOTS],
    /// Descriptors the input was given and has not closed.
    open: BTreeSet<c_int>,
}

impl St {
    fn fd(&self, f: Fd) -> c_int {
        match f {
            Fd::Slot(i) => self.slots[i as usize % SLOTS],
            Fd::Bad(BadFd::Minus1) => -1,
            Fd::Bad(BadFd::Huge) => 1 << 24,
            Fd::Bad(BadFd::Kernel) => self.w.file,
        }
    }

    /// A call gave descriptor `fd`: it goes to `slot`.
    fn got(&mut self, slot: u8, fd: c_int) {
        assert!(fd >= 0);
        assert!(usnet_posix::is_usnet(fd), "{fd} given but not in the table");
        self.open.insert(fd);
        self.slots[slot as usize % SLOTS] = fd;
    }
}

fn port(p: Port) -> u16 {
    match p {
        Port::P(i) => 7100 + u16::from(i % 4),
        Port::Zero => 0,
        Port::Raw(r) => r,
    }
}

fn ip(h: Host) -> std::net::IpAddr {
    let s = match h {
        Host::Own4 => ADDR4,
        Host::Own6 => ADDR6,
        Host::Mapped4 => "::ffff:10.71.0.1",
        Host::Any4 => "0.0.0.0",
        Host::Any6 => "::",
        Host::Neighbour4 => "10.71.0.2",
        Host::Neighbour6 => "fd00:71::2",
        Host::Loopback4 => "127.0.0.1",
        Host::Loopback6 => "::1",
        Host::Multicast4 => "224.0.0.251",
        Host::Broadcast4 => "10.71.0.255",
        Host::Raw4(r) => return std::net::Ipv4Addr::from(r).into(),
    };
    s.parse().unwrap()
}

/// The bytes of a `sockaddr` and the length passed with them (the buffer is exactly
/// as long as the length says, so a read beyond it is caught).
fn sockaddr(a: Addr) -> (Option<Vec<u8>>, socklen_t) {
    match a {
        Addr::Ip {
            host,
            port: p,
            len,
            flow,
            scope,
        } => {
            let sa = match ip(host) {
                std::net::IpAddr::V4(v4) => SocketAddr::new(v4.into(), port(p)),
                std::net::IpAddr::V6(v6) => {
                    SocketAddr::V6(std::net::SocketAddrV6::new(v6, port(p), flow, scope))
                }
            };
            let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut l = std::mem::size_of_val(&st) as socklen_t;
            // SAFETY: a sockaddr_storage and its length.
            unsafe { usnet_posix::addr::to_raw(sa, &mut st as *mut _ as *mut _, &mut l) }.unwrap();
            // SAFETY: plain bytes of the storage.
            let bytes = unsafe {
                std::slice::from_raw_parts(&st as *const _ as *const u8, std::mem::size_of_val(&st))
            };
            let n = match len {
                AddrLen::Exact => l as usize,
                AddrLen::Short(k) => (l as usize).saturating_sub(1 + k as usize % l as usize),
                AddrLen::Long(k) => l as usize + k as usize % 64,
            };
            let n = n.min(bytes.len());
            (Some(bytes[..n].to_vec()), n as socklen_t)
        }
        Addr::Family { family, len } => {
            let mut v = vec![0u8; len as usize % 40];
            if v.len() >= 2 {
                v[..2].copy_from_slice(&family.to_ne_bytes());
            }
            let n = v.len() as socklen_t;
            (Some(v), n)
        }
        Addr::Null(l) => (None, socklen_t::from(l)),
    }
}

fn ptr_of(v: &Option<Vec<u8>>) -> *const libc::sockaddr {
    v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr().cast())
}

/// Room for an address written back, and its length word.
struct Out {
    buf: Option<Vec<u8>>,
    len: Option<Box<socklen_t>>,
    cap: usize,
}

impl Out {
    fn new(o: AddrOut) -> Out {
        let full = std::mem::size_of::<libc::sockaddr_storage>();
        let (buf, cap) = match o {
            AddrOut::Full | AddrOut::NullLen => (Some(vec![0u8; full]), full),
            AddrOut::Short(k) => {
                let n = k as usize % 28;
                (Some(vec![0u8; n]), n)
            }
            AddrOut::NullBoth | AddrOut::NullAddr => (None, full),
        };
        let len = match o {
            AddrOut::NullBoth | AddrOut::NullLen => None,
            _ => Some(Box::new(cap as socklen_t)),
        };
        Out { buf, len, cap }
    }
    fn ptr(&mut self) -> *mut libc::sockaddr {
        self.buf
            .as_mut()
            .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr().cast())
    }
    fn len(&mut self) -> *mut socklen_t {
        self.len
            .as_mut()
            .map_or(std::ptr::null_mut(), |l| &mut **l as *mut socklen_t)
    }
    /// After a success: what was written back is an address of at most the full
    /// size of one.
    fn check(&self) {
        if let (Some(b), Some(l)) = (&self.buf, &self.len) {
            let l = **l as usize;
            assert!(
                l <= std::mem::size_of::<libc::sockaddr_in6>(),
                "address length {l}"
            );
            if l > 0 && l <= b.len() && b.len() >= 2 {
                let fam = u16::from_ne_bytes([b[0], b[1]]) as c_int;
                assert!(
                    fam == libc::AF_INET || fam == libc::AF_INET6,
                    "family {fam} written back"
                );
            }
            let _ = self.cap;
        }
    }
}

const KNOWN_OPTS: &[(c_int, c_int)] = &[
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_RCVBUF),
    (libc::SOL_SOCKET, libc::SO_SNDBUF),
    (libc::SOL_SOCKET, libc::SO_RCVTIMEO),
    (libc::SOL_SOCKET, libc::SO_SNDTIMEO),
    (libc::SOL_SOCKET, libc::SO_LINGER),
    (libc::SOL_SOCKET, libc::SO_ERROR),
    (libc::SOL_SOCKET, libc::SO_TYPE),
    (libc::SOL_SOCKET, libc::SO_DOMAIN),
    (libc::SOL_SOCKET, libc::SO_PROTOCOL),
    (libc::SOL_SOCKET, libc::SO_ACCEPTCONN),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_BINDTODEVICE),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_MARK),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT),
    (libc::SOL_SOCKET, libc::SO_ZEROCOPY),
    (libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE),
    (libc::SOL_SOCKET, libc::SO_INCOMING_CPU),
    (libc::SOL_SOCKET, so::SO_INCOMING_NAPI_ID),
    (libc::SOL_SOCKET, so::SO_MEMINFO),
    (libc::SOL_SOCKET, so::SO_TIMESTAMPING),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_CORK),
    (libc::IPPROTO_TCP, libc::TCP_MAXSEG),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    (libc::IPPROTO_TCP, libc::TCP_CONGESTION),
    (libc::IPPROTO_TCP, libc::TCP_INFO),
    (libc::IPPROTO_TCP, libc::TCP_QUICKACK),
    (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
    (libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
    (libc::IPPROTO_TCP, so::TCP_FASTOPEN_CONNECT),
    (libc::IPPROTO_TCP, so::TCP_FASTOPEN_KEY),
    (libc::IPPROTO_TCP, so::TCP_NOTSENT_LOWAT),
    (libc::IPPROTO_TCP, so::TCP_CC_INFO),
    (libc::IPPROTO_TCP, so::TCP_INQ),
    (libc::IPPROTO_TCP, libc::TCP_SYNCNT),
    (libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP),
    (libc::SOL_SOCKET, libc::SO_TIMESTAMP),
    (libc::SOL_SOCKET, libc::SO_TIMESTAMPNS),
    (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE),
    (libc::IPPROTO_IP, libc::IP_TOS),
    (libc::IPPROTO_IP, libc::IP_TTL),
    (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER),
    (libc::IPPROTO_IP, libc::IP_RECVERR),
    (libc::IPPROTO_IP, libc::IP_PKTINFO),
    (libc::IPPROTO_IP, libc::IP_RECVTTL),
    (libc::IPPROTO_IP, libc::IP_RECVTOS),
    (libc::IPPROTO_IP, libc::IP_FREEBIND),
    (libc::IPPROTO_IP, so::IP_BIND_ADDRESS_NO_PORT),
    (libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP),
    (libc::IPPROTO_IP, libc::IP_DROP_MEMBERSHIP),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_IF),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_ALL),
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
    (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP),
    (libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP),
    (libc::IPPROTO_IPV6, libc::IPV6_DROP_MEMBERSHIP),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVERR),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS),
    (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER),
    (libc::IPPROTO_IPV6, so::IPV6_MULTICAST_ALL),
    (libc::IPPROTO_IP, libc::IP_MINTTL),
    (libc::IPPROTO_IPV6, libc::IPV6_MINHOPCOUNT),
];

const LEVELS: &[c_int] = &[
    libc::SOL_SOCKET,
    libc::IPPROTO_TCP,
    libc::IPPROTO_IP,
    libc::IPPROTO_IPV6,
    libc::IPPROTO_UDP,
];

fn opt(o: Opt) -> (c_int, c_int) {
    match o {
        Opt::Known(i) => KNOWN_OPTS[i as usize % KNOWN_OPTS.len()],
        Opt::Raw(l, n) => (l, n),
        Opt::Level(l, n) => (LEVELS[l as usize % LEVELS.len()], n),
    }
}

fn opt_bytes(v: &OptVal) -> Vec<u8> {
    match v {
        OptVal::Int(i) => i.to_ne_bytes().to_vec(),
        OptVal::Byte(b) => vec![*b],
        OptVal::Bytes(b) => b.clone(),
        OptVal::Timeval(s, us) => [s.to_ne_bytes(), us.to_ne_bytes()].concat(),
        OptVal::Linger(on, secs) => [on.to_ne_bytes(), secs.to_ne_bytes()].concat(),
        OptVal::Mreq4 {
            group,
            own_if,
            index,
        } => {
            let g = [224, 0, 0, *group];
            let i: [u8; 4] = if *own_if { [10, 71, 0, 1] } else { [0; 4] };
            let mut v = [g, i].concat();
            if let Some(x) = index {
                v.extend_from_slice(&x.to_ne_bytes());
            }
            v
        }
        OptVal::Mreq6 { group, index } => {
            let mut g = [0u8; 16];
            g[0] = 0xff;
            g[1] = 0x02;
            g[15] = *group;
            [&g[..], &index.to_ne_bytes()[..]].concat()
        }
        OptVal::Congestion(i) => {
            let names: [&[u8]; 6] = [b"cubic", b"reno", b"bbr", b"cubic\0", b"", b"nope"];
            names[*i as usize % names.len()].to_vec()
        }
        OptVal::FastopenKey(k, n) => k[..(*n as usize % 33)].to_vec(),
    }
}

const SEND_FLAGS: &[c_int] = &[
    libc::MSG_DONTWAIT,
    libc::MSG_NOSIGNAL,
    libc::MSG_MORE,
    libc::MSG_EOR,
    libc::MSG_FASTOPEN,
    libc::MSG_ZEROCOPY,
    libc::MSG_OOB,
    libc::MSG_CONFIRM,
];
const RECV_FLAGS: &[c_int] = &[
    libc::MSG_DONTWAIT,
    libc::MSG_PEEK,
    libc::MSG_WAITALL,
    libc::MSG_OOB,
    libc::MSG_TRUNC,
    libc::MSG_ERRQUEUE,
    libc::MSG_NOSIGNAL,
    libc::MSG_CMSG_CLOEXEC,
];

/// How a send with flags `f` is checked.
fn send_kind(f: Flags) -> K {
    if flags(f, SEND_FLAGS) & libc::MSG_FASTOPEN != 0 {
        K::SendFastOpen
    } else {
        K::Send
    }
}

fn flags(f: Flags, table: &[c_int]) -> c_int {
    match f {
        Flags::None => 0,
        Flags::Known(bits) => table
            .iter()
            .enumerate()
            .filter(|(i, _)| bits & (1 << i) != 0)
            .fold(0, |a, (_, f)| a | f),
        Flags::Raw(r) => r,
    }
}

// ------------------------------------------------------------------ errno

use libc::{
    EACCES, EADDRINUSE, EADDRNOTAVAIL, EAFNOSUPPORT, EAGAIN, EALREADY, EBADF, EBUSY, ECONNABORTED,
    ECONNREFUSED, ECONNRESET, EDESTADDRREQ, EEXIST, EFAULT, EHOSTUNREACH, EINPROGRESS, EINTR,
    EINVAL, EISCONN, ELOOP, EMFILE, EMSGSIZE, ENETDOWN, ENETUNREACH, ENFILE, ENOBUFS, ENODEV,
    ENOENT, ENOMEM, ENOPROTOOPT, ENOSPC, ENOTCONN, ENOTSOCK, ENOTTY, EOPNOTSUPP, EPERM, EPIPE,
    EPROTONOSUPPORT, EPROTOTYPE, ESOCKTNOSUPPORT, ESPIPE, ESRCH, ETIMEDOUT,
};

const COMMON: &[c_int] = &[EBADF, ENOTSOCK, EFAULT, EINVAL, ENOMEM, ENOBUFS, EINTR];
/// What a pending error of a connection (SO_ERROR) may say on any data call.
const PENDING: &[c_int] = &[
    ECONNREFUSED,
    ECONNRESET,
    ETIMEDOUT,
    EHOSTUNREACH,
    ENETUNREACH,
    EPIPE,
];

#[derive(Debug, Clone, Copy)]
enum K {
    Socket,
    Bind,
    Listen,
    Accept,
    Connect,
    Send,
    /// A send with MSG_FASTOPEN: on a TCP socket not yet connected it connects
    /// (`tcp_sendmsg_fastopen`), so connect's errors too.
    SendFastOpen,
    Recv,
    Sockopt,
    Shutdown,
    Close,
    Dup,
    Fcntl,
    Ioctl,
    Poll,
    EpollCreate,
    EpollCtl,
    EpollWait,
    Name,
    SendFile,
}

fn allowed(k: K, e: c_int) -> bool {
    if COMMON.contains(&e) {
        return true;
    }
    if let K::SendFastOpen = k {
        return allowed(K::Send, e) || allowed(K::Connect, e);
    }
    let extra: &[c_int] = match k {
        K::Socket => &[
            EAFNOSUPPORT,
            EMFILE,
            ENFILE,
            EPROTONOSUPPORT,
            ESOCKTNOSUPPORT,
            EACCES,
        ],
        K::Bind => &[EACCES, EADDRINUSE, EADDRNOTAVAIL, EAFNOSUPPORT],
        K::Listen => &[EADDRINUSE, EOPNOTSUPP],
        K::Accept => &[
            EAGAIN,
            ECONNABORTED,
            EMFILE,
            ENFILE,
            EOPNOTSUPP,
            EPERM,
            libc::EPROTO,
        ],
        K::Connect => &[
            EACCES,
            EPERM,
            EADDRINUSE,
            EADDRNOTAVAIL,
            EAFNOSUPPORT,
            EAGAIN,
            EALREADY,
            ECONNREFUSED,
            EINPROGRESS,
            EISCONN,
            ENETUNREACH,
            EHOSTUNREACH,
            EPROTOTYPE,
            ETIMEDOUT,
            ECONNRESET,
        ],
        // Checked as a send or a connect above.
        K::SendFastOpen => &[],
        K::Send => &[
            EACCES,
            EAGAIN,
            EALREADY,
            EDESTADDRREQ,
            EISCONN,
            EMSGSIZE,
            ENOTCONN,
            EOPNOTSUPP,
            EPIPE,
            EAFNOSUPPORT,
            EADDRNOTAVAIL,
            EINPROGRESS,
            ECONNREFUSED,
            ECONNRESET,
            ETIMEDOUT,
            EHOSTUNREACH,
            ENETUNREACH,
            EPERM,
        ],
        // EMSGSIZE: recvmsg with more than UIO_MAXIOV pieces (Linux's __copy_msghdr).
        K::Recv => &[EAGAIN, ENOTCONN, EOPNOTSUPP, EMSGSIZE],
        K::Sockopt => &[
            ENOPROTOOPT,
            // SO_RCVTIMEO/SO_SNDTIMEO with tv_usec out of range.
            libc::EDOM,
            // A multicast membership on a TCP socket.
            libc::EPROTO,
            EPERM,
            EOPNOTSUPP,
            ENOENT,
            EBUSY,
            EISCONN,
            EALREADY,
            EADDRINUSE,
            EADDRNOTAVAIL,
            ENODEV,
            ENOTCONN,
            EACCES,
        ],
        K::Shutdown => &[ENOTCONN],
        K::Close => &[libc::EIO],
        K::Dup => &[EBUSY, EMFILE],
        K::Fcntl => &[EMFILE, EACCES, EAGAIN, EPERM, ESRCH],
        K::Ioctl => &[ENOTTY, EOPNOTSUPP],
        K::Poll => &[],
        K::EpollCreate => &[EMFILE, ENFILE],
        K::EpollCtl => &[EEXIST, ELOOP, ENOENT, ENOSPC, EPERM],
        K::EpollWait => &[],
        K::Name => &[ENOTCONN],
        K::SendFile => &[
            EAGAIN,
            EIO,
            EOVERFLOW,
            ESPIPE,
            EPIPE,
            ENOTCONN,
            EDESTADDRREQ,
            EOPNOTSUPP,
            ECONNRESET,
        ],
    };
    if extra.contains(&e) {
        return true;
    }
    matches!(k, K::Send | K::Recv | K::SendFile) && PENDING.contains(&e)
}

use libc::{EIO, EOVERFLOW};

/// Checks a C call's result: -1 with an errno Linux could give for the call.
fn check<T: Into<i64> + Copy>(k: K, r: T, what: &dyn Fn() -> String) -> Option<i64> {
    let r: i64 = r.into();
    if trace() {
        // SAFETY: this thread's errno.
        let e = unsafe { *libc::__errno_location() };
        eprintln!(
            "{} -> {r}{}",
            what(),
            if r < 0 {
                format!(" errno {e}")
            } else {
                String::new()
            }
        );
    }
    if r >= 0 {
        return Some(r);
    }
    assert_eq!(r, -1, "{} returned {r}", what());
    // SAFETY: this thread's errno.
    let e = unsafe { *libc::__errno_location() };
    assert!(e > 0, "{}: errno {e}", what());
    assert!(
        allowed(k, e),
        "{}: errno {e} ({})",
        what(),
        std::io::Error::from_raw_os_error(e)
    );
    // ENETDOWN would mean the session is gone: the server must stay up.
    assert_ne!(e, ENETDOWN);
    None
}

/// `POSIX_CALLS_TRACE=1`: every checked call and its result on stderr (to see
/// what a corpus reaches: `cargo fuzz run posix_calls corpus/posix_calls -- -runs=0`).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("POSIX_CALLS_TRACE").is_some())
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

// ------------------------------------------------------------------ iovecs

struct Iov {
    bufs: Vec<Vec<u8>>,
    iov: Vec<libc::iovec>,
    n: c_int,
}

fn iovecs(lens: &[u16], n: IovLen) -> Iov {
    let mut bufs: Vec<Vec<u8>> = lens
        .iter()
        .take(8)
        .enumerate()
        .map(|(i, &l)| vec![i as u8 + 1; l as usize % 5000])
        .collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: if b.is_empty() {
                std::ptr::null_mut()
            } else {
                b.as_mut_ptr().cast()
            },
            iov_len: b.len(),
        })
        .collect();
    let n = match n {
        IovLen::Exact => iov.len() as c_int,
        IovLen::Fewer(k) => (iov.len() as c_int - c_int::from(k)).max(0),
        IovLen::TooMany => libc::UIO_MAXIOV + 1,
        IovLen::Negative => -1,
    };
    Iov { bufs, iov, n }
}

impl Iov {
    fn ptr(&mut self) -> *mut libc::iovec {
        if self.iov.is_empty() {
            std::ptr::null_mut()
        } else {
            self.iov.as_mut_ptr()
        }
    }
    fn room(&self) -> usize {
        self.iov
            .iter()
            .take(self.n.max(0) as usize)
            .map(|v| v.iov_len)
            .sum()
    }
}

// ------------------------------------------------------------------ one call

fn run(st: &mut St, call: &Call) {
    let dbg = || format!("{call:?}");
    match *call {
        Call::Socket {
            slot,
            v6,
            dgram,
            cloexec,
            proto,
            junk,
        } => {
            let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
            let mut ty = if dgram {
                libc::SOCK_DGRAM
            } else {
                libc::SOCK_STREAM
            } | libc::SOCK_NONBLOCK;
            if cloexec {
                ty |= libc::SOCK_CLOEXEC;
            }
            if let Some(j) = junk {
                // Bits beyond the type and the two flags (EINVAL), never a blocking socket.
                ty |= j & !(0xf | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
            }
            let proto = c_int::from(proto);
            if let Some(fd) = check(K::Socket, c::usnet_socket(domain, ty, proto), &dbg) {
                st.got(slot, fd as c_int);
            }
        }
        Call::BadSocket { domain, ty, proto } => {
            // Only sockets that would be blocking or of no known kind.
            if ty & libc::SOCK_NONBLOCK != 0
                && (domain == libc::AF_INET || domain == libc::AF_INET6)
            {
                return;
            }
            if (domain == libc::AF_INET || domain == libc::AF_INET6)
                && matches!(ty & 0xf, libc::SOCK_STREAM | libc::SOCK_DGRAM)
                && ty & !(0xf | libc::SOCK_CLOEXEC) == 0
                && matches!(proto, 0 | libc::IPPROTO_TCP | libc::IPPROTO_UDP)
            {
                return;
            }
            let r = c::usnet_socket(domain, ty, proto);
            if r >= 0 {
                // A blocking socket of another shape: close it at once.
                st.open.insert(r);
                assert_eq!(c::usnet_close(r), 0);
                st.open.remove(&r);
            } else {
                check(K::Socket, r, &dbg);
            }
        }
        Call::Bind { fd, addr } => {
            let (a, l) = sockaddr(addr);
            // SAFETY: `a` is NULL or has `l` bytes.
            let r = unsafe { c::usnet_bind(st.fd(fd), ptr_of(&a), l) };
            check(K::Bind, r, &dbg);
        }
        Call::Listen { fd, backlog } => {
            check(
                K::Listen,
                c::usnet_listen(st.fd(fd), c_int::from(backlog)),
                &dbg,
            );
        }
        Call::Accept {
            fd,
            slot,
            flags,
            out,
            plain,
        } => {
            let mut o = Out::new(out);
            // SAFETY: `o`'s pointers are NULL or valid for their lengths.
            let r = unsafe {
                if plain && st.fd(fd) >= 0 && !nonblocking(st.fd(fd)) {
                    return;
                } else if plain {
                    c::usnet_accept(st.fd(fd), o.ptr(), o.len())
                } else {
                    // Never without SOCK_NONBLOCK: the new socket must not block.
                    let f = libc::SOCK_NONBLOCK
                        | if flags & 1 != 0 {
                            libc::SOCK_CLOEXEC
                        } else {
                            0
                        }
                        | if flags & 2 != 0 {
                            c_int::from(flags) << 8
                        } else {
                            0
                        };
                    c::usnet_accept4(st.fd(fd), o.ptr(), o.len(), f)
                }
            };
            if let Some(nfd) = check(K::Accept, r, &dbg) {
                let nfd = nfd as c_int;
                st.got(slot, nfd);
                o.check();
                if plain {
                    // usnet_accept gives a blocking socket: make it non-blocking.
                    assert_eq!(c::usnet_fcntl(nfd, libc::F_SETFL, libc::O_NONBLOCK as _), 0);
                }
            }
        }
        Call::Connect { fd, addr } => {
            let (a, l) = sockaddr(addr);
            // SAFETY: `a` is NULL or has `l` bytes.
            let r = unsafe { c::usnet_connect(st.fd(fd), ptr_of(&a), l) };
            check(K::Connect, r, &dbg);
        }
        Call::Send {
            fd,
            len,
            flags: f,
            null,
            write,
        } => {
            let data = vec![0x42u8; len as usize % 70_000];
            let p: *const c_void = if null {
                std::ptr::null()
            } else {
                data.as_ptr().cast()
            };
            // SAFETY: `p` is NULL or has `data.len()` bytes.
            let r = unsafe {
                if write {
                    c::usnet_write(st.fd(fd), p, data.len())
                } else {
                    c::usnet_send(st.fd(fd), p, data.len(), flags(f, SEND_FLAGS))
                }
            };
            let k = if write { K::Send } else { send_kind(f) };
            if let Some(n) = check(k, r as i64, &dbg) {
                assert!(n as usize <= data.len(), "{}: sent {n}", dbg());
            }
        }
        Call::SendTo {
            fd,
            len,
            flags: f,
            addr,
        } => {
            let data = vec![0x43u8; len as usize % 70_000];
            let (a, l) = addr.map_or((None, 0), sockaddr);
            // SAFETY: pointers valid for their lengths.
            let r = unsafe {
                c::usnet_sendto(
                    st.fd(fd),
                    data.as_ptr().cast(),
                    data.len(),
                    flags(f, SEND_FLAGS),
                    ptr_of(&a),
                    l,
                )
            };
            if let Some(n) = check(send_kind(f), r as i64, &dbg) {
                assert!(n as usize <= data.len());
            }
        }
        Call::SendMsg {
            fd,
            ref iov,
            n,
            name,
            control,
            flags: f,
            null,
        } => {
            let mut v = iovecs(iov, n);
            let (a, l) = name.map_or((None, 0), sockaddr);
            let mut ctl = vec![0u8; control as usize % 64];
            // Some sizes carry a source address (`IP_PKTINFO`, `IPV6_PKTINFO`): ours,
            // or with the size's low bits, not ours.
            let pktinfo = |level: c_int, ty: c_int, data: &[u8]| {
                // SAFETY: CMSG_SPACE and CMSG_LEN are arithmetic.
                let (space, len) = unsafe {
                    (
                        libc::CMSG_SPACE(data.len() as u32) as usize,
                        libc::CMSG_LEN(data.len() as u32) as usize,
                    )
                };
                let mut b = vec![0u8; space];
                b[..8].copy_from_slice(&(len as u64).to_ne_bytes());
                b[8..12].copy_from_slice(&level.to_ne_bytes());
                b[12..16].copy_from_slice(&ty.to_ne_bytes());
                b[16..16 + data.len()].copy_from_slice(data);
                b
            };
            match control % 4 {
                1 => {
                    let mut pi = [0u8; 12];
                    let ours: std::net::Ipv4Addr = ADDR4.parse().unwrap();
                    pi[4..8].copy_from_slice(&ours.octets());
                    pi[7] ^= (control >> 2) & 1;
                    ctl = pktinfo(libc::IPPROTO_IP, libc::IP_PKTINFO, &pi);
                }
                2 => {
                    let mut pi = [0u8; 20];
                    let ours: std::net::Ipv6Addr = ADDR6.parse().unwrap();
                    pi[..16].copy_from_slice(&ours.octets());
                    pi[15] ^= (control >> 2) & 1;
                    ctl = pktinfo(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &pi);
                }
                // A hop limit or TOS, in range or not (-1: none for IPv6's).
                3 => {
                    let v = (i32::from(control) >> 3) - 1;
                    let (level, ty) = [
                        (libc::IPPROTO_IP, libc::IP_TTL),
                        (libc::IPPROTO_IP, libc::IP_TOS),
                        (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT),
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
                    ][usize::from(control >> 2) % 4];
                    ctl = pktinfo(level, ty, &v.to_ne_bytes());
                }
                _ => {}
            }
            // SAFETY: a zeroed msghdr is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = v.ptr();
            m.msg_iovlen = v.n as _;
            m.msg_name = ptr_of(&a) as *mut c_void;
            m.msg_namelen = l;
            m.msg_control = if ctl.is_empty() {
                std::ptr::null_mut()
            } else {
                ctl.as_mut_ptr().cast()
            };
            m.msg_controllen = ctl.len() as _;
            let mp = if null {
                std::ptr::null()
            } else {
                &m as *const libc::msghdr
            };
            // SAFETY: the msghdr's pointers are valid for their lengths.
            let r = unsafe { c::usnet_sendmsg(st.fd(fd), mp, flags(f, SEND_FLAGS)) };
            if let Some(k) = check(send_kind(f), r as i64, &dbg) {
                assert!(k as usize <= v.room());
            }
            drop(v.bufs);
        }
        Call::Writev { fd, ref iov, n } => {
            let mut v = iovecs(iov, n);
            // SAFETY: the iovecs are valid for their lengths.
            let r = unsafe { c::usnet_writev(st.fd(fd), v.ptr(), v.n) };
            if let Some(k) = check(K::Send, r as i64, &dbg) {
                assert!(k as usize <= v.room());
            }
        }
        Call::Recv {
            fd,
            len,
            flags: f,
            null,
            read,
        } => {
            let mut buf = vec![0u8; len as usize % 70_000];
            let p: *mut c_void = if null {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            };
            // SAFETY: `p` is NULL or has `buf.len()` bytes.
            let r = unsafe {
                if read {
                    c::usnet_read(st.fd(fd), p, buf.len())
                } else {
                    c::usnet_recv(
                        st.fd(fd),
                        p,
                        buf.len(),
                        flags(f, RECV_FLAGS) | libc::MSG_DONTWAIT,
                    )
                }
            };
            if let Some(n) = check(K::Recv, r as i64, &dbg) {
                assert!(n as usize <= buf.len() || flags(f, RECV_FLAGS) & libc::MSG_TRUNC != 0);
            }
        }
        Call::RecvFrom {
            fd,
            len,
            flags: f,
            out,
        } => {
            let mut buf = vec![0u8; len as usize % 70_000];
            let mut o = Out::new(out);
            // SAFETY: pointers valid for their lengths.
            let r = unsafe {
                c::usnet_recvfrom(
                    st.fd(fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    flags(f, RECV_FLAGS) | libc::MSG_DONTWAIT,
                    o.ptr(),
                    o.len(),
                )
            };
            if let Some(n) = check(K::Recv, r as i64, &dbg) {
                assert!(n as usize <= buf.len() || flags(f, RECV_FLAGS) & libc::MSG_TRUNC != 0);
                o.check();
            }
        }
        Call::RecvMsg {
            fd,
            ref iov,
            n,
            name,
            control,
            flags: f,
            null,
        } => {
            let mut v = iovecs(iov, n);
            let mut o = Out::new(name);
            let mut ctl = vec![0u8; control as usize % 200];
            // SAFETY: a zeroed msghdr is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = v.ptr();
            m.msg_iovlen = v.n as _;
            m.msg_name = o.ptr().cast();
            m.msg_namelen = o.len.as_deref().copied().unwrap_or(0);
            let namelen = m.msg_namelen;
            m.msg_control = if ctl.is_empty() {
                std::ptr::null_mut()
            } else {
                ctl.as_mut_ptr().cast()
            };
            m.msg_controllen = ctl.len() as _;
            let mp = if null {
                std::ptr::null_mut()
            } else {
                &mut m as *mut libc::msghdr
            };
            let fl = flags(f, RECV_FLAGS) | libc::MSG_DONTWAIT;
            // SAFETY: the msghdr's pointers are valid for their lengths.
            let r = unsafe { c::usnet_recvmsg(st.fd(fd), mp, fl) };
            if let Some(k) = check(K::Recv, r as i64, &dbg) {
                assert!(k as usize <= v.room() || fl & libc::MSG_TRUNC != 0);
                assert!(
                    m.msg_controllen as usize <= ctl.len(),
                    "{}: controllen {}",
                    dbg(),
                    m.msg_controllen
                );
                // As Linux: written back only when there is a name to write.
                if m.msg_name.is_null() {
                    assert_eq!(m.msg_namelen, namelen, "{}", dbg());
                } else {
                    assert!(
                        m.msg_namelen as usize <= std::mem::size_of::<libc::sockaddr_in6>(),
                        "{}: namelen {}",
                        dbg(),
                        m.msg_namelen
                    );
                }
            }
        }
        Call::Readv { fd, ref iov, n } => {
            let mut v = iovecs(iov, n);
            // SAFETY: the iovecs are valid for their lengths.
            let r = unsafe { c::usnet_readv(st.fd(fd), v.ptr(), v.n) };
            if let Some(k) = check(K::Recv, r as i64, &dbg) {
                assert!(k as usize <= v.room());
            }
        }
        Call::SetSockOpt {
            fd,
            opt: o,
            ref val,
            len,
        } => {
            let (level, name) = opt(o);
            let mut bytes = opt_bytes(val);
            let (p, l): (*const c_void, socklen_t) = match len {
                ValLen::Exact => (bytes.as_ptr().cast(), bytes.len() as socklen_t),
                ValLen::Shorter(k) => {
                    let n = bytes.len().saturating_sub(1 + k as usize);
                    bytes.truncate(n);
                    (bytes.as_ptr().cast(), n as socklen_t)
                }
                ValLen::Zero => (bytes.as_ptr().cast(), 0),
                ValLen::Null(l) => (std::ptr::null(), socklen_t::from(l)),
            };
            // SAFETY: `p` is NULL or has `l` bytes.
            let r = unsafe { c::usnet_setsockopt(st.fd(fd), level, name, p, l) };
            check(K::Sockopt, r, &dbg);
        }
        Call::GetSockOpt {
            fd,
            opt: o,
            cap,
            null_val,
            null_len,
        } => {
            let (level, name) = opt(o);
            let cap = cap as usize % 400;
            let mut buf = vec![0u8; cap];
            let mut len = cap as socklen_t;
            let p: *mut c_void = if null_val || cap == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            };
            let lp: *mut socklen_t = if null_len {
                std::ptr::null_mut()
            } else {
                &mut len
            };
            // SAFETY: `p` is NULL or has `cap` bytes; `lp` NULL or valid.
            let r = unsafe { c::usnet_getsockopt(st.fd(fd), level, name, p, lp) };
            if check(K::Sockopt, r, &dbg).is_some() {
                assert!(
                    len as usize <= cap,
                    "{}: length {len} for room {cap}",
                    dbg()
                );
            }
        }
        Call::Shutdown { fd, how } => {
            check(
                K::Shutdown,
                c::usnet_shutdown(st.fd(fd), c_int::from(how)),
                &dbg,
            );
        }
        Call::Close { fd } => {
            let f = st.fd(fd);
            let r = c::usnet_close(f);
            if check(K::Close, r, &dbg).is_some() {
                assert!(st.open.remove(&f), "{}: closed {f}, not open", dbg());
            } else {
                assert!(!st.open.contains(&f), "{}: {f} is open", dbg());
            }
        }
        Call::Dup { fd, slot } => {
            if let Some(n) = check(K::Dup, c::usnet_dup(st.fd(fd)), &dbg) {
                st.got(slot, n as c_int);
            }
        }
        Call::Dup2 { old, new, slot } => {
            let (o, n) = (st.fd(old), st.fd(new));
            if !target_ok(st, n) {
                return;
            }
            if let Some(r) = check(K::Dup, c::usnet_dup2(o, n), &dbg) {
                assert_eq!(r as c_int, n);
                st.got(slot, n);
            }
        }
        Call::Dup3 {
            old,
            new,
            slot,
            flags: fl,
        } => {
            let (o, n) = (st.fd(old), st.fd(new));
            if !target_ok(st, n) {
                return;
            }
            if let Some(r) = check(K::Dup, c::usnet_dup3(o, n, fl), &dbg) {
                assert_eq!(r as c_int, n);
                st.got(slot, n);
            }
        }
        Call::Fcntl { fd, cmd, arg, slot } => {
            let cmds = [
                libc::F_GETFL,
                libc::F_SETFL,
                libc::F_GETFD,
                libc::F_SETFD,
                libc::F_DUPFD,
                libc::F_DUPFD_CLOEXEC,
                libc::F_GETLK,
                libc::F_SETOWN,
            ];
            let raw = cmd as usize >= 64;
            let cmd = if raw {
                c_int::from(cmd) - 64
            } else {
                cmds[cmd as usize % cmds.len()]
            };
            let mut arg = arg;
            if cmd == libc::F_SETFL {
                // Never a blocking socket.
                arg |= i64::from(libc::O_NONBLOCK);
            }
            if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
                // Low numbers, or past the limit (EINVAL): never a number far up that
                // only this run would hold.
                arg = if arg < 0 { arg } else { arg % 64 };
            }
            if cmd == libc::F_SETOWN {
                // No owner, or one that does not exist (ESRCH): with O_ASYNC an
                // owner would be sent SIGIO, and this runs as root beside others.
                arg = if arg % 2 == 0 { 0 } else { 0x3fff_fff0 };
            }
            let r = c::usnet_fcntl(st.fd(fd), cmd, arg as libc::c_long);
            if let Some(v) = check(K::Fcntl, r, &dbg) {
                if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
                    st.got(slot, v as c_int);
                }
                if cmd == libc::F_GETFL && is_socket(st.fd(fd)) {
                    // (An epoll set may be blocking: its waits here take 0 ms.)
                    assert_ne!(v as c_int & libc::O_NONBLOCK, 0, "a blocking socket");
                }
            }
        }
        Call::Ioctl { fd, req, val, null } => {
            let reqs = [
                libc::FIONBIO,
                libc::FIONREAD,
                usnet_posix::SIOCATMARK,
                libc::TIOCOUTQ,
                0,
            ];
            let req = reqs[req as usize % reqs.len()];
            let mut v = if req == libc::FIONBIO { val | 1 } else { val };
            let p: *mut c_int = if null { std::ptr::null_mut() } else { &mut v };
            // SAFETY: `p` is NULL or points to an int.
            let r = unsafe { c::usnet_ioctl(st.fd(fd), req, p.cast()) };
            if check(K::Ioctl, r, &dbg).is_some() && req == libc::FIONREAD {
                assert!(v >= 0);
            }
        }
        Call::Poll { ref fds, null } => {
            let mut p: Vec<libc::pollfd> = fds
                .iter()
                .take(16)
                .map(|&(f, ev)| libc::pollfd {
                    fd: st.fd(f),
                    events: ev,
                    revents: 0,
                })
                .collect();
            let (ptr, n) = if null {
                (std::ptr::null_mut(), p.len().max(1) as libc::nfds_t)
            } else if p.is_empty() {
                (std::ptr::null_mut(), 0)
            } else {
                (p.as_mut_ptr(), p.len() as libc::nfds_t)
            };
            // SAFETY: `ptr` is NULL or has `n` pollfds.
            let r = unsafe { c::usnet_poll(ptr, n, 0) };
            if let Some(k) = check(K::Poll, r, &dbg) {
                if !null {
                    let ready = p.iter().filter(|x| x.revents != 0).count();
                    assert_eq!(k as usize, ready, "{}: {p:?}", dbg());
                }
            }
        }
        Call::EpollCreate {
            slot,
            flags: fl,
            old,
        } => {
            let r = match old {
                Some(size) => c::usnet_epoll_create(size),
                None => c::usnet_epoll_create1(fl),
            };
            if let Some(fd) = check(K::EpollCreate, r, &dbg) {
                st.got(slot, fd as c_int);
            }
        }
        Call::EpollCtl {
            ep,
            op,
            fd,
            events,
            data,
            null,
        } => {
            let mut ev = libc::epoll_event { events, u64: data };
            let p: *mut libc::epoll_event = if null { std::ptr::null_mut() } else { &mut ev };
            let op = match op {
                0..=40 => libc::EPOLL_CTL_ADD,
                41..=80 => libc::EPOLL_CTL_MOD,
                81..=120 => libc::EPOLL_CTL_DEL,
                x => c_int::from(x),
            };
            // SAFETY: `p` is NULL or points to an event.
            let r = unsafe { c::usnet_epoll_ctl(st.fd(ep), op, st.fd(fd), p) };
            check(K::EpollCtl, r, &dbg);
        }
        Call::EpollWait { ep, max, null } => {
            let mut evs =
                vec![libc::epoll_event { events: 0, u64: 0 }; (max.max(0) as usize).min(32)];
            let p = if null || evs.is_empty() {
                std::ptr::null_mut()
            } else {
                evs.as_mut_ptr()
            };
            let m = if null {
                c_int::from(max)
            } else {
                (evs.len() as c_int).min(c_int::from(max))
            };
            let m = if evs.is_empty() && !null {
                c_int::from(max.min(0))
            } else {
                m
            };
            // SAFETY: `p` is NULL or has `m` events (m <= evs.len()).
            let r = unsafe { c::usnet_epoll_wait(st.fd(ep), p, m, 0) };
            if let Some(k) = check(K::EpollWait, r, &dbg) {
                assert!(k as usize <= evs.len());
            }
        }
        Call::GetSockName { fd, out } => {
            let mut o = Out::new(out);
            // SAFETY: `o`'s pointers are NULL or valid for their lengths.
            let r = unsafe { c::usnet_getsockname(st.fd(fd), o.ptr(), o.len()) };
            if check(K::Name, r, &dbg).is_some() {
                o.check();
            }
        }
        Call::GetPeerName { fd, out } => {
            let mut o = Out::new(out);
            // SAFETY: `o`'s pointers are NULL or valid for their lengths.
            let r = unsafe { c::usnet_getpeername(st.fd(fd), o.ptr(), o.len()) };
            if check(K::Name, r, &dbg).is_some() {
                o.check();
            }
        }
        Call::SendFile {
            fd,
            from_file,
            off,
            count,
        } => {
            let inf = if from_file { st.w.file } else { -1 };
            let mut o = off.unwrap_or(0);
            let op: *mut libc::off_t = if off.is_some() {
                &mut o
            } else {
                std::ptr::null_mut()
            };
            if off.is_none() && from_file {
                // SAFETY: a seek of our own file.
                unsafe { libc::lseek(inf, 0, libc::SEEK_SET) };
            }
            // SAFETY: `op` is NULL or points to an off_t.
            let r = unsafe { c::usnet_sendfile(st.fd(fd), inf, op, count as usize) };
            if let Some(n) = check(K::SendFile, r as i64, &dbg) {
                assert!(n as usize <= count as usize);
            }
        }
        Call::IsSocket { fd } => {
            let f = st.fd(fd);
            let r = c::usnet_is_socket(f);
            assert_eq!(r != 0, st.open.contains(&f), "{}: is_socket({f})", dbg());
        }
        Call::Settle { fd, events } => {
            let f = st.fd(fd);
            if !st.open.contains(&f) {
                return;
            }
            let ev = if events == 0 {
                libc::POLLIN | libc::POLLOUT
            } else {
                events
            };
            settle(f, ev, Duration::from_micros(500));
        }
        Call::Pair {
            l,
            c: cs,
            s,
            v6,
            port: p,
        } => {
            let host = if v6 { Host::Own6 } else { Host::Own4 };
            let addr = Addr::Ip {
                host,
                port: Port::P(p),
                len: AddrLen::Exact,
                flow: 0,
                scope: 0,
            };
            let before = st.open.len();
            run(
                st,
                &Call::Socket {
                    slot: l,
                    v6,
                    dgram: false,
                    cloexec: false,
                    proto: 0,
                    junk: None,
                },
            );
            if st.open.len() == before {
                return;
            }
            let lfd = st.slots[l as usize % SLOTS];
            let one = 1 as c_int;
            // SAFETY: an int and its length.
            let r = unsafe {
                c::usnet_setsockopt(
                    lfd,
                    libc::SOL_SOCKET,
                    libc::SO_REUSEADDR,
                    (&one as *const c_int).cast(),
                    4,
                )
            };
            check(K::Sockopt, r, &dbg);
            let (a, al) = sockaddr(addr);
            // SAFETY: `a` has `al` bytes.
            if check(K::Bind, unsafe { c::usnet_bind(lfd, ptr_of(&a), al) }, &dbg).is_none() {
                return;
            }
            if check(K::Listen, c::usnet_listen(lfd, 8), &dbg).is_none() {
                return;
            }
            let before = st.open.len();
            run(
                st,
                &Call::Socket {
                    slot: cs,
                    v6,
                    dgram: false,
                    cloexec: false,
                    proto: 0,
                    junk: None,
                },
            );
            if st.open.len() == before {
                return;
            }
            let cfd = st.slots[cs as usize % SLOTS];
            // SAFETY: `a` has `al` bytes.
            check(
                K::Connect,
                unsafe { c::usnet_connect(cfd, ptr_of(&a), al) },
                &dbg,
            );
            settle(lfd, libc::POLLIN, Duration::from_millis(5));
            // SAFETY: NULL address and length.
            let r = unsafe {
                c::usnet_accept4(
                    lfd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK,
                )
            };
            if let Some(n) = check(K::Accept, r, &dbg) {
                st.got(s, n as c_int);
                settle(cfd, libc::POLLOUT, Duration::from_millis(5));
            }
        }
    }
    set_errno(0);
}

/// Polls `f` (timeout 0) until one of `ev` comes or `limit` has passed: lets the
/// server's loop catch up.
fn settle(f: c_int, ev: i16, limit: Duration) {
    let t = Instant::now();
    while t.elapsed() < limit {
        let mut p = [libc::pollfd {
            fd: f,
            events: ev,
            revents: 0,
        }];
        // SAFETY: one pollfd.
        if unsafe { c::usnet_poll(p.as_mut_ptr(), 1, 0) } != 0 {
            break;
        }
        std::thread::yield_now();
    }
}

/// A `dup2`/`dup3` target: one of the input's own descriptors, or -1/huge (EBADF);
/// never a number some other part of the process holds.
fn target_ok(st: &St, n: c_int) -> bool {
    !(0..1 << 20).contains(&n) || st.open.contains(&n)
}

/// A socket, not an epoll set (SO_TYPE answers).
fn is_socket(fd: c_int) -> bool {
    let mut v = 0 as c_int;
    let mut l = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: an int and its length.
    let r = unsafe {
        c::usnet_getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut v as *mut c_int).cast(),
            &mut l,
        )
    };
    r == 0
}

fn nonblocking(fd: c_int) -> bool {
    c::usnet_fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK != 0
}

fuzz_target!(|calls: Vec<Call>| {
    let w = world();
    let mut st = St {
        w,
        slots: [-1; SLOTS],
        open: BTreeSet::new(),
    };
    for call in calls.iter().take(64) {
        run(&mut st, call);
    }
    // Every descriptor the input was given closes once, and the table is back.
    for fd in std::mem::take(&mut st.open) {
        assert_eq!(c::usnet_close(fd), 0, "close({fd}) at the end");
    }
    assert_eq!(
        usnet_posix::descriptors_in(0, c_int::MAX),
        w.baseline,
        "descriptors left"
    );
    // The server is alive and takes a new socket.
    assert!(w.server.is_running(), "the server stopped");
    let s = c::usnet_socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK, 0);
    assert!(
        s >= 0,
        "a fresh socket: errno {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(c::usnet_close(s), 0);
});
