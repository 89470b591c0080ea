//! Unmodified programs under `libusnet_preload.so` against a stack server in this
//! process (no root): the C program that checks socket semantics, built for the
//! kernel's API and run once on the kernel and once under the shim, must print the
//! same lines; and a Python program (sockets, selectors, a mix with a pipe) runs
//! unchanged.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

const ADDR: &str = "10.71.0.1";
const STACK: &str = "preload-test";

/// One program at a time: the programs share one stack server, and some checks are
/// about timing (a send buffer that stays full across a pause), which a forking
/// program beside them on a loaded two-core machine can upset.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static S: std::sync::Mutex<()> = std::sync::Mutex::new(());
    S.lock().unwrap_or_else(|p| p.into_inner())
}

fn run_dir() -> &'static PathBuf {
    static S: OnceLock<(usnet_server::ServerHandle, PathBuf)> = OnceLock::new();
    &S.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("usnet-preload-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server reads it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
        let stack = StackConfig {
            mac: mac_from_seed(24),
            // (fd71::1: `examples/c/raw_icmp.c`'s IPv6 peer.)
            addrs: vec![
                format!("{ADDR}/24").parse().unwrap(),
                "fd71::1/64".parse().unwrap(),
            ],
            // The in-memory link stands for loopback (index 1): what received
            // datagrams report as their interface (`examples/c/udp_pktinfo.c`).
            ifindex: 1,
            ..Default::default()
        };
        let cfg = ServerConfig {
            name: STACK.into(),
            link: "mem".into(),
            // `usnet up`'s quotas.
            geometry: usnet_session_abi::Geometry {
                max_sockets: usnet_session_abi::DEFAULT_CLIENT_SOCKETS,
                ring_bytes: usnet_session_abi::DEFAULT_MAX_RING_BYTES,
                ..Default::default()
            },
            ..Default::default()
        };
        (usnet_server::testing::in_memory(stack, cfg).unwrap(), d)
    })
    .1
}

/// libusnet_preload.so as cargo built it for this test (next to the test binary).
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .map(|d| d.join("libusnet_preload.so"))
        .find(|p| p.exists())
        .expect("libusnet_preload.so not built")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` with a deadline (killed after it), collecting its output.
/// Runs `cmd` in a process group of its own; past `timeout` the whole group is
/// killed, so children it forked cannot keep the output pipes (and this wait) open.
fn output_within(cmd: &mut Command, timeout: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let end = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            // SAFETY: kill(2) on the process group our child leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // The program exited: what it forked may still hold the pipes.
    // SAFETY: as above; the group may already be empty (ESRCH is fine).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait_with_output().unwrap()
}

fn under_shim(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_PRELOAD", shim())
        .env("USNET_STACK", STACK)
        .env("USNET_RUN_DIR", run_dir())
}

/// `python3 ARGS` under the shim (60 s deadline): its standard output, which it must
/// end successfully.
fn python_under_shim(args: &[&str]) -> String {
    let o = output_within(
        under_shim(Command::new("python3").args(args)),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert!(
        o.status.success(),
        "python: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Builds `examples/c/<name>.c` for the kernel's API, runs it on loopback and under
/// the shim on the stack's address: the outputs must be the same and end "all ok".
fn same_under_the_shim(name: &str, usnet_port: u16) {
    same_under_the_shim_as(name, usnet_port, &[]);
}

/// [`same_under_the_shim`], the kernel's run started by `kernel_wrap` (a command
/// that runs its arguments: the program, then `127.0.0.1 PORT`).
fn same_under_the_shim_as(name: &str, usnet_port: u16, kernel_wrap: &[&str]) {
    run_dir();
    let bin = std::env::temp_dir().join(format!("usnet-preload-{name}-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // A program with a library of its own (`<name>_lib.c`) links it as a shared
    // library: its constructor then runs before the shim's, as a real library's does.
    let lib_src = root().join(format!("examples/c/{name}_lib.c"));
    let lib_dir = bin.with_extension("lib");
    let mut link = Vec::new();
    if lib_src.exists() {
        std::fs::create_dir_all(&lib_dir).unwrap();
        let c = output_within(
            Command::new(&cc)
                .args(["-O1", "-Wall", "-pthread", "-shared", "-fPIC", "-o"])
                .arg(lib_dir.join(format!("lib{name}.so")))
                .arg(&lib_src),
            Duration::from_secs(120),
        );
        assert!(
            c.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&c.stderr)
        );
        let dir = lib_dir.display();
        link = vec![
            format!("-L{dir}"),
            format!("-Wl,-rpath,{dir}"),
            format!("-l{name}"),
        ];
    }
    let c = output_within(
        Command::new(&cc)
            .args(["-O1", "-Wall", "-pthread", "-o"])
            .arg(&bin)
            .arg("-I")
            .arg(root().join("examples/c"))
            .arg(root().join(format!("examples/c/{name}.c")))
            .args(&link),
        Duration::from_secs(120),
    );
    assert!(
        c.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&c.stderr)
    );
    // A block below the ephemeral range: the programs use PORT to PORT+14, and a
    // connection of a test beside this one must not take one of them.
    let port = {
        let seed = std::process::id() as u64 + name.len() as u64 * 7919;
        (0..500u64)
            .map(|k| 20000 + ((seed * 37 + k * 101) % 12000) as u16)
            .find(|&p| {
                (p..=p + 16).all(|q| {
                    std::net::TcpListener::bind(("127.0.0.1", q)).is_ok()
                        && std::net::UdpSocket::bind(("127.0.0.1", q)).is_ok()
                })
            })
            .expect("a free block of loopback ports")
    };
    let mut kernel = match kernel_wrap {
        [] => Command::new(&bin),
        [first, rest @ ..] => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
    };
    let k = output_within(
        kernel.args(["127.0.0.1", &port.to_string()]),
        Duration::from_secs(60),
    );
    let u = output_within(
        under_shim(Command::new(&bin).args([ADDR, &usnet_port.to_string()])),
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_file(&bin);
    let _ = std::fs::remove_dir_all(&lib_dir);
    let (ks, us) = (text(&k), text(&u));
    assert!(
        k.status.success() && ks.ends_with("all ok\n"),
        "kernel: {ks}"
    );
    assert_eq!(
        us,
        ks,
        "under the shim the output differs from the kernel's; stderr: {}",
        String::from_utf8_lossy(&u.stderr)
    );
}

#[test]
fn the_kernel_build_of_the_semantics_program_prints_the_same_under_the_shim() {
    let _serial = serial();
    same_under_the_shim("sockets_errno", 7700);
}

/// epoll, poll and select over a socket and a pipe at once wake for either side
/// (`examples/c/mixed_wait.c`).
#[test]
fn waits_on_sockets_and_pipes_at_once_wake_for_either_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("mixed_wait", 7797);
}

/// Interface queries (`SIOCGIF*`) on usnet sockets answer as on the kernel
/// (`examples/c/ifaces.c`; before, each failed with ENOTTY).
#[test]
fn interface_queries_on_sockets_answer_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("ifaces", 7798);
}

/// A wildcard-bound UDP socket learns where each datagram was sent, with its TTL
/// and TOS, and answers from that address (`examples/c/udp_pktinfo.c`; before,
/// no control message came and a sendmsg with one failed with EOPNOTSUPP).
#[test]
fn udp_ancillary_data_says_where_a_datagram_went_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("udp_pktinfo", 7799);
}

/// The TTL and TOS a UDP socket sends with: its IP_TTL and IP_TOS, one send's
/// control messages, a dual-stack socket to a mapped address
/// (`examples/c/udp_ttl_tos.c`; before, the options were only recorded and a
/// sendmsg with IP_TTL or IP_TOS failed with EOPNOTSUPP).
#[test]
fn udp_ttl_and_tos_per_socket_and_per_send_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("udp_ttl_tos", 7810);
}

/// Signal-driven I/O (`examples/c/sigio.c`): `O_ASYNC` with an owner brings
/// `SIGIO` for a datagram and for a connection waiting on a listener,
/// `F_SETSIG`'s signal carries `si_fd` and `si_band`, and clearing `O_ASYNC` stops
/// them (before, `F_SETOWN` was `EINVAL` and no signal came).
#[test]
fn signal_driven_io_signals_the_owner_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("sigio", 7890);
}

/// `connect` to `AF_UNSPEC` dissolves a UDP socket's association: everyone is
/// heard again, `send` needs an address, the connect's address goes back to the
/// wildcard (`examples/c/udp_disconnect.c`; before, it was `EAFNOSUPPORT`).
#[test]
fn a_udp_disconnect_hears_everyone_again_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("udp_disconnect", 7880);
}

/// Receive timestamps on a UDP socket (SO_TIMESTAMP, SO_TIMESTAMPNS, SO_TIMESTAMPING's
/// software stamp) between the send and the receive, and SOL_SOCKET options Linux
/// takes on any socket (`examples/c/udp_timestamps.c`; before, each was
/// ENOPROTOOPT, which Linux never answers for them).
#[test]
fn udp_receive_timestamps_and_socket_level_options_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("udp_timestamps", 7812);
}

/// A TCP socket's IP_TTL on its SYN and its segments, and IP_MINTTL (RFC 5082's
/// GTSM, as BGP speakers set it) on a listener, before or after listen, inherited
/// by accepted connections; segments below it dropped, their retransmissions with
/// a TTL set since taken (`examples/c/tcp_ttl.c`; before, both options were only
/// recorded and IP_MINTTL was ENOPROTOOPT).
#[test]
fn tcp_ttl_and_minimum_ttl_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("tcp_ttl", 7830);
}

/// ICMP echo ("ping") sockets, `SOCK_DGRAM` `IPPROTO_ICMP`: the stack sets the
/// identifier and checksum of what the program sends, and the whole echo reply
/// comes back (`examples/c/ping_socket.c`; before, the shim left such a socket on
/// the kernel, whose ping_group_range refuses it here, and in a namespace whose
/// only network is usnet ping had nothing to send through). The kernel's run is
/// in a network namespace of its own whose ping_group_range lets root in.
#[test]
fn ping_sockets_as_on_the_kernel() {
    let _serial = serial();
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the kernel's run needs a network namespace (root)");
        return;
    }
    let wrap = "ip link set lo up && sysctl -qw net.ipv4.ping_group_range='0 0' && exec \"$@\"";
    same_under_the_shim_as(
        "ping_socket",
        7840,
        &["unshare", "-n", "sh", "-c", wrap, "sh"],
    );
}

/// Raw ICMP sockets, `SOCK_RAW` `IPPROTO_ICMP` and `IPPROTO_ICMPV6`
/// (`examples/c/raw_icmp.c`): the program's own echo requests go out as
/// written (IPv6's summed by the stack), every socket reads a copy of the
/// replies (IPv4's after the IP header) less what its filter blocks, bind and
/// connect narrow it. Before, the shim left such a socket on the kernel, which
/// in a namespace whose only network is usnet had no route anywhere.
#[test]
fn raw_icmp_sockets_as_on_the_kernel() {
    let _serial = serial();
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the kernel's run needs CAP_NET_RAW (root)");
        return;
    }
    same_under_the_shim("raw_icmp", 7860);
}

/// The interface that carries the program's address tells one story through
/// getifaddrs, the if_* name calls and the SIOCGIF* ioctls
/// (`examples/c/ifaddrs.c`): under the shim it is the stack's interface, with
/// its addresses, MAC and MTU. Before, all of them answered with the host's
/// interfaces, where the stack's address is on none.
#[test]
fn the_stacks_interface_is_the_one_the_program_finds_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("ifaddrs", 7870);
}

/// ICMP errors on UDP sockets (`examples/c/udp_icmp_errors.c`): a port
/// unreachable fails a connected socket's next recv or send with ECONNREFUSED,
/// as POLLERR and SO_ERROR show; with IP_RECVERR each error also waits on the
/// error queue, read whole with recvmsg(MSG_ERRQUEUE) (before, every ICMP error
/// about a datagram was dropped: a resolver waited out its timeout, and
/// traceroute-like programs saw nothing).
#[test]
fn icmp_errors_reach_udp_sockets_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("udp_icmp_errors", 7850);
}

#[test]
fn signal_handlers_interrupt_blocking_calls_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("signals", 7703);
}

/// fork with a library's fork handlers (installed in its constructor, so they run
/// while the shim holds its locks across the fork) making sockets of their own.
#[test]
fn sockets_made_in_a_librarys_fork_handlers_behave_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("fork_handlers", 7760);
}

/// fork: a child that exits untouched, a listener shared by two children accepting
/// from its one queue, a connection handed to a child after the parent closed it.
#[test]
fn sockets_shared_across_fork_behave_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("fork", 7704);
}

/// Processes made without `fork` (the raw `clone` and `clone3` system calls,
/// libc's `clone`) get their own session as a forked child does, and a program
/// that caps its address space (`RLIMIT_AS`, vsftpd's 200 MB per connection)
/// still has room for its children's sessions (`examples/c/raw_fork.c`). Before,
/// a raw clone's child went on with its parent's session, and vsftpd's
/// connection process could not map one of its own (ENOMEM): every FTP
/// greeting was lost.
#[test]
fn processes_made_without_fork_and_a_capped_address_space_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("raw_fork", 7890);
}

/// exec: sockets without FD_CLOEXEC live on in programs started with execv,
/// posix_spawn, system, popen, execve and execle with an empty environment, execl
/// after `environ[0] = NULL`, system after `clearenv`, and a shell's
/// /dev/tcp read by cat; FD_CLOEXEC ones close; as root, a child that drops to
/// nobody right after fork serves its parent's listener.
#[test]
fn sockets_kept_across_exec_behave_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("exec", 7710);
}

/// A program that asks the kernel itself: fstat and a raw statx say "socket", a raw
/// getsockopt gives the type, and close, dup, dup3 and fcntl made with
/// syscall(2) (libuv closes this way) act as their libc functions do.
#[test]
fn sockets_closed_and_numbered_with_raw_system_calls_behave_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("raw_syscalls", 7790);
}

/// stdio on sockets: fdopen'd connections, and stdout, stderr and stdin moved onto
/// connections with dup2 and back (glibc's streams write past any shim).
#[test]
fn stdio_streams_on_sockets_behave_as_on_the_kernel() {
    let _serial = serial();
    same_under_the_shim("stdio", 7795);
}

#[test]
fn udp_with_sendmmsg_and_recvmmsg_prints_the_same_under_the_shim() {
    let _serial = serial();
    same_under_the_shim("udp_mmsg", 7702);
}

/// Python's own socket module, selectors (epoll) over a usnet listener, a usnet
/// connection and a pipe, and getsockname: the stack's address proves the sockets
/// are usnet's; a loopback socket in the same program stays on the kernel.
#[test]
fn python_runs_unchanged_under_the_shim() {
    let _serial = serial();
    run_dir();
    let prog = format!(
        r#"
import os, selectors, socket
sel = selectors.DefaultSelector()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("{ADDR}", 7701)); l.listen(4); l.setblocking(False)
r, w = os.pipe()
sel.register(l, selectors.EVENT_READ, "listener"); sel.register(r, selectors.EVENT_READ, "pipe")
c = socket.create_connection(("{ADDR}", 7701), timeout=10)
print("client", c.getsockname()[0])
ready = [k.data for k, _ in sel.select(10)]
print("ready", ready)
s, peer = l.accept(); s.setblocking(True)
payload = bytes(range(256)) * 4096
c.sendall(payload); c.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(65536)
    if not b: break
    got += b
print("bytes", len(got), got == payload)
os.write(w, b"x")
print("pipe", [k.data for k, _ in sel.select(10)])
lo = socket.socket(); lo.bind(("127.0.0.1", 0)); print("loopback", lo.getsockname()[0])
"#
    );
    let out = python_under_shim(&["-c", &prog]);
    assert_eq!(
        out,
        format!(
            "client {ADDR}\nready ['listener']\nbytes 1048576 True\npipe ['pipe']\nloopback 127.0.0.1\n"
        )
    );
}

/// Python starting programs the way servers do (uvicorn's and gunicorn's workers):
/// a `multiprocessing` "spawn" worker is a new interpreter, started with `vfork`,
/// `close_range` of every number not passed, and `exec`, that takes over a bound
/// listener from its parent; a `subprocess` gets an accepted connection as its
/// stdin and stdout while the parent closes its copy at once. Before, the
/// `close_range` in the `vfork` child (which shares its parent's memory) closed the
/// parent's sockets through the layer, and the worker found a dead number.
#[test]
fn python_spawned_workers_take_over_sockets_under_the_shim() {
    let _serial = serial();
    let dir = run_dir();
    let script = dir.join("spawned_workers.py");
    std::fs::write(
        &script,
        format!(
            r#"
import multiprocessing as mp, socket, subprocess, sys, time

def serve(l):
    l.listen(4)
    s, _ = l.accept()
    s.settimeout(10)
    s.sendall(b"spawned worker got " + s.recv(16))
    s.close()

def dial(port):
    for _ in range(200):
        try:
            return socket.create_connection(("{ADDR}", port), timeout=10)
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise SystemExit("never listening")

if __name__ == "__main__":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("{ADDR}", 7706))
    w = mp.get_context("spawn").Process(target=serve, args=(l,))
    w.start()
    c = dial(7706)
    c.sendall(b"hello")
    print(c.makefile("rb").read().decode())
    w.join(20)
    print("worker exit", w.exitcode)

    l2 = socket.create_server(("{ADDR}", 7707))
    c2 = dial(7707)
    s2, _ = l2.accept()
    c2.sendall(b"ping\n")
    q = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('pong', sys.stdin.readline().strip(), flush=True)"],
        stdin=s2, stdout=s2, close_fds=True)
    s2.close()
    print(c2.makefile("rb").readline().decode().strip())
    print("subprocess exit", q.wait(20))
"#
        ),
    )
    .unwrap();
    let out = python_under_shim(&[script.to_str().unwrap()]);
    assert_eq!(
        out,
        "spawned worker got hello\nworker exit 0\npong ping\nsubprocess exit 0\n"
    );
}

/// Python's view of the descriptor limit for the tests below: `soft`, `hard`, and
/// `want`, the most they raise it to.
const LIMITS: &str = r#"import resource, select, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
assert want >= 3200, f"the hard descriptor limit {hard} is too low for this test"
"#;

/// Python that opens 1,500 connections to the listener `l` (on `port`), accepts
/// each, then moves a byte over each one; prints "opened" and "exchanged" counts.
fn many_pairs(port: u16) -> String {
    format!(
        r#"
pairs = []
for i in range(1500):
    c = socket.create_connection(("{ADDR}", {port}), timeout=10)
    s, _ = l.accept()
    pairs.append((c, s))
print("opened", len(pairs))
n = 0
for c, s in pairs:
    s.settimeout(10)
    c.sendall(b"x")
    n += s.recv(1) == b"x"
print("exchanged", n)
"#
    )
}

/// A server that raises its descriptor limit before its first socket (redis, nginx's
/// `worker_rlimit_nofile` and the JVM do) holds as many sockets as the limit
/// allows, as on the kernel: 1,500 connections to its own listener (3,001 sockets)
/// each carry a byte. Before, every process had a session of 1,024 sockets, and
/// the 513th connection failed with `EMFILE` whatever the limit.
#[test]
fn a_process_holds_as_many_sockets_as_its_descriptor_limit_under_the_shim() {
    let _serial = serial();
    run_dir();
    let prog = format!(
        r#"
{LIMITS}resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
l = socket.create_server(("{ADDR}", 7708), backlog=2048)
{}"#,
        many_pairs(7708)
    );
    let out = python_under_shim(&["-c", &prog]);
    assert_eq!(out, "opened 1500\nexchanged 1500\n");
}

/// A process that raises its descriptor limit after its first sockets (HAProxy
/// after it binds, an nginx worker's `worker_rlimit_nofile` after its fork): the
/// session grows to the new limit, and what the process had before goes on
/// working: a listener watched by an epoll set, a connection with bytes waiting
/// to be read at each end. Before, the session kept its 1,024 slots and the
/// socket past them failed with `EMFILE`.
#[test]
fn a_limit_raised_after_the_first_sockets_makes_the_session_grow_under_the_shim() {
    let _serial = serial();
    run_dir();
    let prog = format!(
        r#"
{LIMITS}resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
l = socket.create_server(("{ADDR}", 7709), backlog=2048)
ep = select.epoll()
ep.register(l.fileno(), select.EPOLLIN)
c0 = socket.create_connection(("{ADDR}", 7709), timeout=10)
s0, _ = l.accept()
c0.sendall(b"before")
s0.sendall(b"back")
resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
s0.settimeout(10)
print("kept", s0.recv(100), c0.recv(100))
c1 = socket.create_connection(("{ADDR}", 7709), timeout=10)
print("watched", [fd == l.fileno() for fd, _ in ep.poll(10)])
l.accept()[0].close()
c1.close()
{}"#,
        many_pairs(7709)
    );
    let out = python_under_shim(&["-c", &prog]);
    assert_eq!(
        out,
        "kept b'before' b'back'\nwatched [True]\nopened 1500\nexchanged 1500\n"
    );
}

/// Python's `socketserver.ForkingTCPServer` under the shim: a process per connection,
/// forked from the server's thread while the main thread's clients (usnet sockets in
/// the same process) wait in `recv`; every line echoed, every stream ended.
#[test]
fn python_forking_server_serves_concurrent_clients_under_the_shim() {
    let _serial = serial();
    run_dir();
    let prog = format!(
        r#"
import socket, socketserver, threading
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(b"echo " + line)
class S(socketserver.ForkingTCPServer):
    allow_reuse_address = True
srv = S(("{ADDR}", 7705), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
ok = []
def client(i):
    s = socket.create_connection(("{ADDR}", 7705), timeout=10)
    f = s.makefile("rwb")
    for k in range(10):
        f.write(b"line %d %d\n" % (i, k)); f.flush()
        if f.readline() != b"echo line %d %d\n" % (i, k):
            return
    s.shutdown(socket.SHUT_WR)
    if f.read() == b"":
        ok.append(i)
ts = [threading.Thread(target=client, args=(i,)) for i in range(6)]
[t.start() for t in ts]; [t.join(20) for t in ts]
print("served", len(ok))
srv.shutdown(); srv.server_close()
"#
    );
    let out = python_under_shim(&["-c", &prog]);
    assert_eq!(out, "served 6\n");
}

/// A program started under an address-space limit it cannot raise (`ulimit -v`,
/// soft and hard, 256 MiB): the shim's session is sized to fit beside it, and a
/// forked child's session too. Before, the attach failed with ENOMEM (a
/// session of 1,024 sockets takes 512 MiB of address space) and every socket
/// call with ENETDOWN.
#[test]
fn a_program_under_ulimit_v_gets_a_session_that_fits() {
    let _serial = serial();
    run_dir();
    let prog = format!(
        r#"
import os, socket
l = socket.create_server(("{ADDR}", 7895), reuse_port=False)
c = socket.create_connection(("{ADDR}", 7895), timeout=10)
s, _ = l.accept()
c.sendall(b"ping")
pid = os.fork()
if pid == 0:
    s.settimeout(10)
    ok = s.recv(4) == b"ping" and s.sendall(b"pong") is None
    os._exit(0 if ok else 1)
s.close()
c.settimeout(10)
print("answered", c.recv(4) == b"pong", "child", os.waitpid(pid, 0)[1])
"#
    );
    let o = output_within(
        under_shim(Command::new("sh").args([
            "-c",
            "ulimit -v 262144 && exec python3 -c \"$0\"",
            &prog,
        ])),
        Duration::from_secs(60),
    );
    let out = text(&o);
    assert_eq!(
        out,
        "answered True child 0\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Sockets passed to another process with `SCM_RIGHTS` (Python's `send_fds` and
/// `recv_fds`, as a process handing connections to workers does): the receiver, a
/// separate program that had no usnet socket before, answers on each connection
/// after the sender closed its copy. The same output on the kernel (loopback) and
/// under the shim.
#[test]
fn connections_passed_with_scm_rights_are_served_by_the_receiver() {
    let _serial = serial();
    run_dir();
    let prog = |addr: &str, port: u16| {
        format!(
            r#"
import os, socket, subprocess, sys, time
path = "/tmp/usnet-pass-%d-%d.sock" % (os.getpid(), {port})
receiver = '''
import os, socket, sys
u = socket.socket(socket.AF_UNIX); u.bind(sys.argv[1]); u.listen(1)
c, _ = u.accept(); c.settimeout(10)
for i in range(3):
    msg, fds, _, _ = socket.recv_fds(c, 100, 4)
    s = socket.socket(fileno=fds[0]); s.settimeout(10)
    s.sendall(b"receiver got " + s.recv(100) + b" with " + msg)
    s.close()
# One the sender kept: answered, then handed back.
msg, fds, _, _ = socket.recv_fds(c, 100, 4)
s = socket.socket(fileno=fds[0]); s.settimeout(10)
s.sendall(b"receiver got " + s.recv(100) + b" and hands it back; ")
socket.send_fds(c, [b"back"], [s.fileno()])
s.close()
print("received", i + 2, flush=True)
'''
r = subprocess.Popen([sys.executable, "-c", receiver, path], stdout=subprocess.PIPE)
u = socket.socket(socket.AF_UNIX)
for _ in range(100):
    try:
        u.connect(path); break
    except OSError:
        time.sleep(0.05)
l = socket.create_server(("{addr}", {port}))
for i in range(3):
    c = socket.create_connection(("{addr}", {port}), timeout=10)
    s, _ = l.accept()
    c.sendall(b"hello %d" % i)
    socket.send_fds(u, [b"message %d" % i], [s.fileno()])
    s.close()
    got = b""
    while True:
        b = c.recv(100)
        if not b: break
        got += b
    print(got.decode())
# A connection the sender keeps while the receiver has it, and gets back.
c = socket.create_connection(("{addr}", {port}), timeout=10)
s, _ = l.accept()
c.sendall(b"hello 3")
socket.send_fds(u, [b"message 3"], [s.fileno()])
u.settimeout(10)
msg, fds, _, _ = socket.recv_fds(u, 100, 4)
back = socket.socket(fileno=fds[0])
back.sendall(b"the sender again, the message " + msg)
back.close()
s.sendall(b"; the first number still works")
s.close()
got = b""
while True:
    b = c.recv(100)
    if not b: break
    got += b
print(got.decode())
print(r.communicate(timeout=20)[0].decode(), end="")
os.unlink(path)
"#
        )
    };
    let k = output_within(
        Command::new("python3").args(["-c", &prog("127.0.0.1", 23719)]),
        Duration::from_secs(60),
    );
    let u = output_within(
        under_shim(Command::new("python3").args(["-c", &prog(ADDR, 7720)])),
        Duration::from_secs(60),
    );
    let (ks, us) = (text(&k), text(&u));
    assert!(
        k.status.success() && ks.ends_with("received 4\n"),
        "kernel: {ks}{}",
        String::from_utf8_lossy(&k.stderr)
    );
    assert_eq!(
        us,
        ks,
        "under the shim the output differs from the kernel's; stderr: {}",
        String::from_utf8_lossy(&u.stderr)
    );
}

/// A process that drops its user and group before its first socket (BIND's
/// `named -u bind`) still reaches the stack: the shim attaches before the change,
/// while the process has its rights. Before, the attach came at the first socket,
/// as uid 65534, and the stack refused it: `socket` failed with ENETDOWN.
#[test]
fn a_process_that_drops_privileges_before_its_first_socket_stays_on_usnet() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to change uid");
        return;
    }
    let _serial = serial();
    let out = python_under_shim(&[
        "-c",
        &format!(
            r#"
import os, socket
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
l = socket.create_server(("{ADDR}", 7720))
# (Not create_connection: its name lookup imports a codec from /root, which
# nobody cannot read.)
c = socket.socket()
c.settimeout(10)
c.connect(("{ADDR}", 7720))
s, _ = l.accept()
s.sendall(b"as nobody")
print(os.getuid(), c.recv(16).decode())
"#
        ),
    ]);
    assert_eq!(out.trim(), "65534 as nobody");
}

/// Data calls made through `syscall(3)` on a usnet socket reach the socket, not
/// the kernel socket that holds its number: Debian 12's libuv (BIND's `named`)
/// receives and sends datagrams with `syscall(SYS_recvmmsg/SYS_sendmmsg)`, which
/// found nothing before. Here `SYS_sendto` and `SYS_recvfrom`, through ctypes.
#[test]
fn socket_data_calls_through_syscall_reach_usnet_sockets() {
    let _serial = serial();
    let out = python_under_shim(&[
        "-c",
        &format!(
            r#"
import ctypes, select, socket
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(("{ADDR}", 7721))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("{ADDR}", 7721))
sent = libc.syscall(L(44), L(s.fileno()), ctypes.c_char_p(b"raw call"), L(8), L(0), L(0), L(0))
assert select.select([r], [], [], 10)[0], "nothing arrived"
buf = ctypes.create_string_buffer(64)
got = libc.syscall(L(45), L(r.fileno()), buf, L(64), L(0), L(0), L(0))
print(sent, got, buf.raw[:got].decode())
"#
        ),
    ]);
    assert_eq!(out.trim(), "8 8 raw call");
}
