//! The stack's interface mirrored into a network namespace of its own, for programs
//! that ask rtnetlink about their interfaces themselves: `ip`, Go's `net.Interfaces`
//! and `net.InterfaceAddrs` (the seccomp supervisor's programs), dnsmasq, avahi,
//! systemd-networkd. The shim answers `getifaddrs`, the `if_*` calls and the
//! `SIOCGIF*` ioctls for the stack's interface; a `NETLINK_ROUTE` socket of the
//! kernel's would tell such a program about the host's interfaces instead, whose
//! addresses are not the ones its sockets are on.
//!
//! So a root `usnet up` (unless `--no-mirror`) makes two namespaces: `usnet-NAME`,
//! holding the kernel's loopback and one interface as the shim describes the stack's
//! (its name, index, MAC, MTU, addresses without duplicate address detection, and
//! a default route through each gateway), and `usnet-NAME-wire`, where the other end
//! of that veth pair sits so the mirror's interface has a carrier (this kernel may
//! have no `dummy` driver). Nothing is sent through them; only their tables are
//! read. `ip netns exec usnet-NAME ip addr` shows what a program under `usnet run`
//! is told.
//!
//! A client's `socket(AF_NETLINK, _, NETLINK_ROUTE)` becomes a request on its
//! control connection (`{"cmd":"netlink"}`), answered with a netlink socket made in
//! the mirror. That socket is made by a helper process, forked at start, that
//! entered the mirror and then became `nobody` with no capabilities, so the
//! sockets clients get carry none of the server's privileges (netlink looks at
//! the opener's credentials as well as the sender's), and the server itself keeps
//! its allow-list of `AF_UNIX` sockets after it gives up root. A change through
//! such a socket needs `CAP_NET_ADMIN` of the program that sends it, as on the
//! host: an ordinary user's program reads every table and changes nothing; root's
//! may change the mirror, which changes nothing of the stack. Dump requests,
//! multicast subscriptions, `getsockname` and the rest are the kernel's own, as
//! they are for any netlink socket. The helper ends when the server's end of its
//! socket closes.
//!
//! The helper's pid goes to clients in the attach reply: the shim reads the
//! interface and route files of its own network's `/proc/net` (Java's IPv6
//! interface list is `/proc/net/if_inet6`) from `/proc/HELPER/net`.
//!
//! What stays the kernel's: the mirror is written once at start (the stack's
//! addresses do not change while it runs), `/sys/class/net`, and every other
//! netlink protocol (generic netlink, audit, uevents, `sock_diag`, which `ss`
//! reads).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use usnet_session::ctl::msg::Iface;

/// The user the helper becomes (`nobody` on Debian and Fedora alike).
const NOBODY: u32 = 65534;
/// How long a request to the helper may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

/// A stack's mirror namespaces and the helper that opens sockets in them.
pub struct Mirror {
    ns: String,
    wire: String,
    /// The helper's socket (requests go one at a time: the lock is the turn;
    /// taken on drop, which ends the helper).
    helper: Mutex<Option<OwnedFd>>,
    pid: libc::pid_t,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("ns", &self.ns)
            .field("pid", &self.pid)
            .finish()
    }
}

/// The mirror namespace of stack `stack`.
pub fn namespace_of(stack: &str) -> String {
    format!("usnet-{stack}")
}

fn wire_of(stack: &str) -> String {
    format!("usnet-{stack}-wire")
}

/// Removes stack `stack`'s mirror namespaces, if there are any (a server that was
/// killed leaves them; its janitor and the next `usnet up` of the name call this).
pub fn remove(stack: &str) {
    for ns in [namespace_of(stack), wire_of(stack)] {
        if std::path::Path::new("/run/netns").join(&ns).exists() {
            let _ = usnet_link::run_ip(&["netns", "del", &ns]);
        }
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    usnet_link::run_ip(args).map_err(|e| io::Error::other(e.to_string()))
}

impl Mirror {
    /// Makes the mirror of `iface` (with a default route through each of
    /// `gateways`) for stack `stack` and starts its helper. Needs root.
    pub fn create(stack: &str, iface: &Iface, gateways: &[IpAddr]) -> io::Result<Mirror> {
        let (ns, wire) = (namespace_of(stack), wire_of(stack));
        remove(stack);
        let made = build(&ns, &wire, iface, gateways).and_then(|()| start_helper(&ns));
        match made {
            Ok((helper, pid)) => Ok(Mirror {
                ns,
                wire,
                helper: Mutex::new(Some(helper)),
                pid,
            }),
            Err(e) => {
                remove(stack);
                Err(e)
            }
        }
    }

    /// The mirror's namespace (`ip netns` name).
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// The helper's pid: `/proc/PID/net` describes the mirror.
    pub fn helper_pid(&self) -> u32 {
        self.pid as u32
    }

    /// A new `AF_NETLINK` socket of `ty` (with `SOCK_NONBLOCK` if asked; always
    /// close-on-exec here) and `protocol` (only `NETLINK_ROUTE`) in the mirror.
    pub fn socket(&self, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
        let base = ty & 0xf;
        if protocol != libc::NETLINK_ROUTE
            || !matches!(base, libc::SOCK_RAW | libc::SOCK_DGRAM)
            || ty & !(0xf | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let guard = self.helper.lock().unwrap_or_else(|p| p.into_inner());
        let Some(helper) = guard.as_ref() else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let mut req = [0u8; 8];
        req[..4].copy_from_slice(&ty.to_ne_bytes());
        req[4..].copy_from_slice(&protocol.to_ne_bytes());
        usnet_shm::fdpass::send_with_fds(helper, &req, &[])?;
        if !readable_within(helper.as_raw_fd(), HELPER_TIMEOUT) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the mirror's helper did not answer",
            ));
        }
        let mut answer = [0u8; 4];
        let (n, mut fds) = usnet_shm::fdpass::recv_with_fds(helper, &mut answer)?;
        if n != 4 {
            return Err(io::Error::other("the mirror's helper is gone"));
        }
        match i32::from_ne_bytes(answer) {
            0 => fds
                .pop()
                .ok_or_else(|| io::Error::other("the mirror's helper sent no socket")),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        // Closing our end ends the helper; it is reaped here (killed if it lingers).
        drop(
            self.helper
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r != 0 {
                break;
            }
            if Instant::now() >= deadline {
                // SAFETY: our own child, not yet reaped, so the pid is still its.
                unsafe {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for ns in [&self.ns, &self.wire] {
            let _ = usnet_link::run_ip(&["netns", "del", ns]);
        }
    }
}

/// The namespaces and the interface in them.
fn build(ns: &str, wire: &str, iface: &Iface, gateways: &[IpAddr]) -> io::Result<()> {
    ip(&["netns", "add", ns])?;
    ip(&["netns", "add", wire])?;
    let mac = iface
        .mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let (index, mtu) = (iface.index.to_string(), iface.mtu.to_string());
    #[rustfmt::skip]
    ip(&["-n", ns, "link", "add", &iface.name, "index", &index, "address", &mac, "mtu", &mtu,
         "type", "veth", "peer", "name", "wire", "netns", wire])?;
    // The kernel would add a link-local address of its own and probe every address
    // (a tentative address is not listed as the stack's): the stack's own instead.
    ip(&["-n", ns, "link", "set", &iface.name, "addrgenmode", "none"])?;
    ip(&["-n", wire, "link", "set", "wire", "up"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&["-n", ns, "link", "set", &iface.name, "up"])?;
    for (addr, prefix) in iface.cidrs() {
        let cidr = format!("{addr}/{prefix}");
        match addr {
            IpAddr::V4(_) => ip(&["-n", ns, "addr", "add", &cidr, "dev", &iface.name])?,
            IpAddr::V6(_) => ip(&["-n", ns, "addr", "add", &cidr, "dev", &iface.name, "nodad"])?,
        }
    }
    for gw in gateways {
        let gw = gw.to_string();
        ip(&[
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &gw,
            "dev",
            &iface.name,
        ])?;
    }
    Ok(())
}

/// Forks the helper: it enters namespace `ns`, becomes `nobody` with no
/// capabilities and answers requests on its end of a socket pair until the other
/// end closes. Returns our end and its pid.
fn start_helper(ns: &str) -> io::Result<(OwnedFd, libc::pid_t)> {
    let path = std::ffi::CString::new(format!("/run/netns/{ns}"))?;
    // SAFETY: a NUL-terminated path; the descriptor is ours.
    let nsfd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if nsfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned from here.
    let nsfd = unsafe { OwnedFd::from_raw_fd(nsfd) };
    let mut pair = [0 as RawFd; 2];
    // SAFETY: `pair` has room for the two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both just made, each owned once.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    // SAFETY: the child runs only `helper`, which makes system calls and nothing
    // else (no allocation, no lock): what is safe after fork in a threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the child; never returns.
        unsafe { helper(nsfd.as_raw_fd(), theirs.as_raw_fd()) }
    }
    drop(theirs);
    // The helper's first answer says whether it got into the namespace and gave up
    // its privileges.
    let mut first = [0u8; 4];
    let ok = readable_within(ours.as_raw_fd(), HELPER_TIMEOUT)
        && matches!(
            usnet_shm::fdpass::recv_with_fds(&ours, &mut first),
            Ok((4, _))
        );
    let code = i32::from_ne_bytes(first);
    if !ok || code != 0 {
        // SAFETY: our child, not yet reaped.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Err(if ok {
            io::Error::from_raw_os_error(code)
        } else {
            io::Error::other("the mirror's helper did not start")
        });
    }
    Ok((ours, pid))
}

/// Whether `fd` has something to read (or its peer hung up) within `timeout`.
fn readable_within(fd: RawFd, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        if n > 0 {
            return true;
        }
        // 0: the time is up; -1 is EINTR (or worse), tried again until it is.
        if n == 0 || Instant::now() >= deadline {
            return false;
        }
    }
}

/// The helper's life (in the forked child): system calls only.
///
/// # Safety
/// Call only in a freshly forked child, with `nsfd` a network namespace and `sock`
/// its end of the socket pair.
unsafe fn helper(nsfd: RawFd, sock: RawFd) -> ! {
    unsafe {
        // Its descriptor at 3, every other (the server's links, sockets and
        // memory) closed; signals meant for the server's terminal are not its.
        let ns = libc::fcntl(nsfd, libc::F_DUPFD_CLOEXEC, 10);
        if ns < 0 || libc::dup2(sock, 3) < 0 {
            libc::_exit(1);
        }
        libc::syscall(libc::SYS_close_range, 4, ns - 1, 0);
        libc::syscall(libc::SYS_close_range, ns + 1, u32::MAX, 0);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::prctl(libc::PR_SET_NAME, c"usnet-mirror".as_ptr());
        let mut err = 0;
        if libc::setns(ns, libc::CLONE_NEWNET) != 0 {
            err = *libc::__errno_location();
        }
        libc::close(ns);
        // nobody, no groups, no capabilities (a uid change from root clears them).
        if err == 0
            && (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY) != 0
                || libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY) != 0)
        {
            err = *libc::__errno_location();
        }
        if err == 0 {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        }
        reply(3, err, -1);
        if err != 0 {
            libc::_exit(1);
        }
        loop {
            let mut req = [0u8; 8];
            let n = libc::recv(3, req.as_mut_ptr().cast(), req.len(), libc::MSG_WAITALL);
            if n != 8 {
                libc::_exit(0);
            }
            let ty = i32::from_ne_bytes([req[0], req[1], req[2], req[3]]);
            let proto = i32::from_ne_bytes([req[4], req[5], req[6], req[7]]);
            let fd = libc::socket(libc::AF_NETLINK, ty | libc::SOCK_CLOEXEC, proto);
            if fd < 0 {
                reply(3, *libc::__errno_location(), -1);
            } else {
                reply(3, 0, fd);
                libc::close(fd);
            }
        }
    }
}

/// Sends the 4-byte answer `err` on `sock`, with `fd` if it is one.
///
/// # Safety
/// `sock` is a connected Unix socket; `fd` a descriptor or -1.
unsafe fn reply(sock: RawFd, err: i32, fd: RawFd) {
    let mut bytes = err.to_ne_bytes();
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 4];
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if fd >= 0 {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: a plain query.
        unsafe { libc::geteuid() == 0 }
    }

    /// Dumps the addresses the kernel lists on `sock` (RTM_GETADDR) as text.
    fn dump_addrs(sock: &OwnedFd) -> Vec<String> {
        #[repr(C)]
        struct Req {
            nlh: libc::nlmsghdr,
            ifa: [u8; 8],
        }
        let req = Req {
            nlh: libc::nlmsghdr {
                nlmsg_len: std::mem::size_of::<Req>() as u32,
                nlmsg_type: libc::RTM_GETADDR,
                nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
                nlmsg_seq: 1,
                nlmsg_pid: 0,
            },
            ifa: [0; 8],
        };
        // SAFETY: `req` is plain data of the size given.
        let sent = unsafe {
            libc::send(
                sock.as_raw_fd(),
                (&req as *const Req).cast(),
                std::mem::size_of::<Req>(),
                0,
            )
        };
        assert!(sent > 0, "send: {}", io::Error::last_os_error());
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        'dump: loop {
            // SAFETY: `buf` is writable for its length; the socket has a receive
            // timeout (set by the caller) so this cannot wait for ever.
            let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            assert!(n > 0, "recv: {}", io::Error::last_os_error());
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
                let ty = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().unwrap());
                if ty == libc::NLMSG_DONE as u16 || len < 16 {
                    break 'dump;
                }
                // ifaddrmsg: family, prefixlen, flags, scope, index; then attributes.
                let family = buf[at + 16];
                let mut a = at + 24;
                while a + 4 <= at + len {
                    let alen = u16::from_ne_bytes([buf[a], buf[a + 1]]) as usize;
                    let aty = u16::from_ne_bytes([buf[a + 2], buf[a + 3]]);
                    if alen < 4 {
                        break;
                    }
                    if aty == libc::IFA_ADDRESS {
                        let v = &buf[a + 4..a + alen];
                        out.push(match family as i32 {
                            libc::AF_INET => {
                                std::net::Ipv4Addr::new(v[0], v[1], v[2], v[3]).to_string()
                            }
                            _ => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(v).unwrap())
                                .to_string(),
                        });
                    }
                    a += (alen + 3) & !3;
                }
                at += (len + 3) & !3;
            }
        }
        out
    }

    #[test]
    fn a_socket_from_the_mirror_lists_the_stacks_addresses_and_carries_no_privilege() {
        if !root() {
            eprintln!("skipped: needs root (network namespaces)");
            return;
        }
        let iface = Iface {
            name: "usnmir0".into(),
            index: Iface::OWN_INDEX,
            mac: [2, 0x55, 0, 0, 0, 7],
            mtu: 1500,
            addrs: vec!["10.203.0.2/24".into(), "fd03::2/64".into()],
        };
        let gw: IpAddr = "10.203.0.1".parse().unwrap();
        let m = Mirror::create("mirrortest", &iface, &[gw]).expect("mirror");
        let s = m.socket(libc::SOCK_RAW, libc::NETLINK_ROUTE).unwrap();
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: a timeval for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let addrs = dump_addrs(&s);
        assert!(addrs.contains(&"10.203.0.2".to_string()), "{addrs:?}");
        assert!(addrs.contains(&"fd03::2".to_string()), "{addrs:?}");
        assert!(addrs.contains(&"127.0.0.1".to_string()), "{addrs:?}");
        assert_eq!(addrs.len(), 4, "lo's two and the stack's two: {addrs:?}");
        // Other protocols and types are not the mirror's to give.
        assert!(m.socket(libc::SOCK_RAW, libc::NETLINK_GENERIC).is_err());
        assert!(m.socket(libc::SOCK_STREAM, libc::NETLINK_ROUTE).is_err());
        // The socket carries no privilege of its opener's: a change sent without
        // an address (so netlink checks the opener too) is refused though this
        // test runs as root.
        let refused = try_add_address(&s);
        assert_eq!(refused, Some(libc::EPERM), "a change through the socket");
        let ns = m.namespace().to_string();
        drop(m);
        assert!(!std::path::Path::new("/run/netns").join(ns).exists());
    }

    /// Asks `sock` to add 10.203.0.9/24 to interface `OWN_INDEX`: the error the
    /// kernel's acknowledgement carries (`None` for no answer).
    fn try_add_address(sock: &OwnedFd) -> Option<i32> {
        #[repr(C)]
        struct Req {
            nlh: libc::nlmsghdr,
            ifa: [u8; 8],
            rta_len: u16,
            rta_type: u16,
            addr: [u8; 4],
        }
        let mut ifa = [0u8; 8];
        ifa[0] = libc::AF_INET as u8;
        ifa[1] = 24;
        ifa[4..8].copy_from_slice(&Iface::OWN_INDEX.to_ne_bytes());
        let req = Req {
            nlh: libc::nlmsghdr {
                nlmsg_len: std::mem::size_of::<Req>() as u32,
                nlmsg_type: libc::RTM_NEWADDR,
                nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE) as u16,
                nlmsg_seq: 2,
                nlmsg_pid: 0,
            },
            ifa,
            rta_len: 8,
            rta_type: libc::IFA_LOCAL,
            addr: [10, 203, 0, 9],
        };
        // SAFETY: plain data of the size given; a receive timeout is set.
        unsafe {
            libc::send(
                sock.as_raw_fd(),
                (&req as *const Req).cast(),
                std::mem::size_of::<Req>(),
                0,
            );
            let mut buf = [0u8; 1024];
            let n = libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 20 {
                return None;
            }
            let ty = u16::from_ne_bytes([buf[4], buf[5]]);
            if ty != libc::NLMSG_ERROR as u16 {
                return None;
            }
            Some(-i32::from_ne_bytes(buf[16..20].try_into().unwrap()))
        }
    }
}
