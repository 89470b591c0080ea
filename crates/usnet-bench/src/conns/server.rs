//! The stack-server case of `usnet bench conns`: what a connection costs a `usnet up`
//! server whose application ends are client sockets, idle and then busy at a low rate.
//!
//! Three processes: the server (`usnet up` on a shm link, measured from outside
//! through `/proc/PID/smaps` and the memfds it holds), the application (a child of
//! the bench: client sessions that listen and accept every connection, then write
//! 100 bytes on each and read the echo, round after round), and the peer (this
//! process: a usnet stack on the other side of the shm link that connects N times
//! and echoes; its memory is not the server's and is not counted).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use usnet_client::{AttachOptions, Client, TcpListener, TcpStream};
use usnet_driver::{Driver, SystemClock};
use usnet_link::{Device, LinkOptions, LinkSpec};
use usnet_stack::{mac_from_seed, SocketHandle, Stack, StackConfig, StackError, TcpState};

use super::{heap_in_use, pipe, BoxErr};

const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const PEER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// Sockets one client session asks for: the server's default cap
/// (`usnet up --client-sockets`), so no flag is needed.
pub(super) const SESSION_SOCKETS: usize = 16_384;
/// Listeners per session: a port takes at most the peer's ephemeral range
/// (16,384 ports) from one address.
const LISTENERS: usize = 2;
const FIRST_PORT: u16 = 21_000;
/// Bytes each way per connection and round, unless asked otherwise.
pub(super) const MSG: usize = 100;

/// The busy phase of the stack-server case.
#[derive(Debug, Clone, Copy)]
pub(super) struct Busy {
    pub rounds: usize,
    /// How long each round's writes are spread over.
    pub period: Duration,
    /// Bytes each way per connection and round.
    pub msg: usize,
    /// Ring bytes the application's sessions ask for (None: the client's default).
    pub ring_bytes: Option<u32>,
}
/// Connections the peer opens before it waits for them to be established (below
/// the listeners' backlog, so no SYN waits for a retransmission).
const BATCH: usize = 512;

/// One look at a process's memory (bytes).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Mem {
    /// Resident set: every mapping's pages present in this process's page tables.
    pub rss: u64,
    pub pss: u64,
    /// Anonymous pages (the heap, thread stacks, anonymous mappings).
    pub anon: u64,
    /// Session memfds: mapped length, and pages present in this process.
    pub session_mapped: u64,
    pub session_rss: u64,
    /// Pages the session memfds hold (whoever touched them: the server or the
    /// client), from the files' block counts.
    pub session_pages: u64,
    /// The packet pool's memfd pages present in this process.
    pub pool_rss: u64,
}

/// Reads `/proc/PID/smaps` (per mapping) and the session memfds the process holds.
pub(super) fn memory_of(pid: u32) -> Result<Mem, BoxErr> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut m = Mem::default();
    // 0: another mapping, 1: a session, 2: the packet pool.
    let mut kind = 0u8;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        if !key.ends_with(':') {
            // A mapping's header: range, perms, offset, device, inode, path.
            kind = if line.contains("memfd:usnet-session") {
                1
            } else if line.contains("memfd:usnet-pool") {
                2
            } else {
                0
            };
            continue;
        }
        let Some(kb) = it.next().and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        let b = kb * 1024;
        match key {
            "Size:" if kind == 1 => m.session_mapped += b,
            "Rss:" => {
                m.rss += b;
                match kind {
                    1 => m.session_rss += b,
                    2 => m.pool_rss += b,
                    _ => {}
                }
            }
            "Pss:" => m.pss += b,
            "Anonymous:" => m.anon += b,
            _ => {}
        }
    }
    m.session_pages = session_file_bytes(pid)?;
    Ok(m)
}

/// Bytes allocated to the session memfds `pid` holds open (each file once).
fn session_file_bytes(pid: u32) -> Result<u64, BoxErr> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !target.to_string_lossy().contains("memfd:usnet-session") {
            continue;
        }
        // Follows the descriptor to the memfd itself.
        let Ok(md) = std::fs::metadata(e.path()) else {
            continue;
        };
        if seen.insert(md.ino()) {
            total += md.blocks() * 512;
        }
    }
    Ok(total)
}

/// What the stack-server case measured at one count (bytes per connection).
#[derive(Debug, Clone, Default)]
pub(super) struct ServerCase {
    pub sessions: usize,
    pub idle: PerConn,
    pub busy: PerConn,
    pub rounds: usize,
    pub setup_s: f64,
}

/// Growth over the baseline, per connection.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PerConn {
    /// The server's anonymous memory (its heap: the stack and the sessions).
    pub server_anon: f64,
    /// Session memory pages that exist (touched by either side).
    pub session_touched: f64,
    /// Session memory mapped (address space, not memory).
    pub session_mapped: f64,
    /// Session pages present in the server's page tables (the pages it touched).
    pub session_in_server: f64,
    /// The server's resident set (anonymous, sessions as mapped here, the pool, the
    /// rest).
    pub server_rss: f64,
    pub server_pss: f64,
    /// The packet pool's resident pages (a fixed area: traffic touches more of it,
    /// up to `--buffers` × `--buf-size`).
    pub pool_rss: f64,
    /// The application's heap (client library: the socket objects).
    pub client_heap: f64,
}

impl PerConn {
    /// What the connection costs the machine: the server's heap, the session pages
    /// and the client library's objects (Linux's slab figure holds the socket, its
    /// inode, file and dentry: the application's descriptor).
    pub fn total(&self) -> f64 {
        self.server_anon + self.session_touched + self.client_heap
    }

    fn from(before: &Mem, after: &Mem, client_heap: i64, n: usize) -> PerConn {
        let d = |a: u64, b: u64| (a as f64 - b as f64) / n as f64;
        PerConn {
            server_anon: d(after.anon, before.anon),
            session_touched: d(after.session_pages, before.session_pages),
            session_mapped: d(after.session_mapped, before.session_mapped),
            session_in_server: d(after.session_rss, before.session_rss),
            server_rss: d(after.rss, before.rss),
            server_pss: d(after.pss, before.pss),
            pool_rss: d(after.pool_rss, before.pool_rss),
            client_heap: client_heap as f64 / n as f64,
        }
    }
}

/// A line-oriented pipe end, read with deadlines.
struct Lines {
    f: std::fs::File,
    buf: Vec<u8>,
}

impl Lines {
    fn new(fd: OwnedFd) -> Lines {
        Lines {
            f: fd.into(),
            buf: Vec::new(),
        }
    }

    /// The next line, waiting at most `timeout` (zero: only what is there).
    fn line(&mut self, timeout: Duration) -> Result<Option<String>, BoxErr> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(String::from_utf8_lossy(&l).trim().to_string()));
            }
            let left = end.saturating_duration_since(Instant::now());
            if !usnet_shm::poll_fds(&[self.f.as_fd()], left)?.any() {
                if left.is_zero() {
                    return Ok(None);
                }
                continue;
            }
            let mut b = [0u8; 256];
            // Readable or hung up: this read does not block.
            let k = self.f.read(&mut b)?;
            if k == 0 {
                return Err("the other process closed its pipe".into());
            }
            self.buf.extend_from_slice(&b[..k]);
        }
    }
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: a pipe end this process owns, handed over once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The application: in a child process, `sessions` client sessions of the stack
/// server `stack`, each listening on its ports; accepts `n` connections, then does
/// rounds when told. Lines to the parent: `L` (listening), `A HEAP` (all accepted),
/// `D HEAP` (a round done), `E WHY`; HEAP is the heap's growth since listening plus
/// the socket objects.
fn application(stack: &str, n: usize, sessions: usize, busy: Busy, cmd: OwnedFd, rep: OwnedFd) {
    let mut out = std::fs::File::from(rep);
    let mut cmds = Lines::new(cmd);
    if let Err(e) = application_inner(stack, n, sessions, busy, &mut cmds, &mut out) {
        let _ = writeln!(out, "E {e}");
    }
}

fn application_inner(
    stack: &str,
    n: usize,
    sessions: usize,
    busy: Busy,
    cmds: &mut Lines,
    out: &mut std::fs::File,
) -> Result<(), BoxErr> {
    let opts = AttachOptions {
        max_sockets: Some(SESSION_SOCKETS as u32),
        ring_bytes: busy.ring_bytes,
        ..AttachOptions::default()
    };
    let mut clients = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        clients.push(Client::attach_with(Some(stack), &opts)?);
    }
    let mut listeners = Vec::with_capacity(sessions * LISTENERS);
    for (s, c) in clients.iter().enumerate() {
        for j in 0..LISTENERS {
            let port = FIRST_PORT + (s * LISTENERS + j) as u16;
            let l = TcpListener::bind_with_backlog(c, (SERVER_ADDR, port).into(), 1024)?;
            l.set_nonblocking(true)?;
            listeners.push(l);
        }
    }
    let mut conns: Vec<TcpStream> = Vec::with_capacity(n);
    let mut got = vec![0u32; n];
    let mut buf = vec![0u8; busy.msg];
    let msg = vec![b'm'; busy.msg];
    let heap0 = heap_in_use() as i64;
    writeln!(out, "L")?;
    let end = Instant::now() + Duration::from_secs(60) + Duration::from_millis(n as u64);
    while conns.len() < n {
        let mut took = 0;
        for l in &listeners {
            loop {
                match l.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(true)?;
                        conns.push(s);
                        took += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(format!("accept: {e}").into()),
                }
            }
        }
        if took == 0 {
            if Instant::now() > end {
                return Err(format!("accepted {} of {n} connections", conns.len()).into());
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    // The socket objects themselves sit in `conns`, whose room was taken before
    // the baseline: they count as the application's too.
    let objects = (n * std::mem::size_of::<TcpStream>()) as i64;
    writeln!(out, "A {}", heap_in_use() as i64 - heap0 + objects)?;
    loop {
        let Some(c) = cmds.line(Duration::from_secs(600))? else {
            return Err("no word from the bench for 10 minutes".into());
        };
        let mut words = c.split_whitespace();
        match words.next() {
            Some("R") => {
                let ms: u64 = words.next().ok_or("R without a period")?.parse()?;
                round(
                    &mut conns,
                    &mut got,
                    &msg,
                    &mut buf,
                    Duration::from_millis(ms),
                )?;
                writeln!(out, "D {}", heap_in_use() as i64 - heap0 + objects)?;
            }
            _ => return Ok(()),
        }
    }
}

/// One round: `msg` out on every connection, spread over `period`, then the echo
/// back on each (into `buf`, as long as `msg`).
fn round(
    conns: &mut [TcpStream],
    got: &mut [u32],
    msg: &[u8],
    buf: &mut [u8],
    period: Duration,
) -> Result<(), BoxErr> {
    let len = msg.len();
    let n = conns.len();
    let t0 = Instant::now();
    const CHUNK: usize = 256;
    for (k, chunk) in conns.chunks_mut(CHUNK).enumerate() {
        let at = t0 + period.mul_f64((k * CHUNK) as f64 / n as f64);
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        for s in chunk {
            // The ring is empty at a round's start: the write takes it all.
            let w = s.write(msg)?;
            if w != len {
                return Err(format!("a write took {w} of {len} bytes").into());
            }
        }
    }
    got.iter_mut().for_each(|g| *g = 0);
    let mut left = n;
    let end = Instant::now() + Duration::from_secs(60);
    while left > 0 {
        let mut moved = false;
        for (i, s) in conns.iter_mut().enumerate() {
            let have = got[i] as usize;
            if have == len {
                continue;
            }
            match s.read(&mut buf[..len - have]) {
                Ok(0) => return Err("a connection ended".into()),
                Ok(k) => {
                    got[i] += k as u32;
                    if got[i] as usize == len {
                        left -= 1;
                    }
                    moved = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("read: {e}").into()),
            }
        }
        if !moved {
            if Instant::now() > end {
                return Err(format!("{left} of {n} echoes missing after 60 s").into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

/// The peer: a usnet stack on the other side of the shm link, driven from this
/// thread; connects, and echoes what it receives.
struct Peer {
    driver: Driver<Box<dyn Device>, SystemClock>,
    conns: Vec<SocketHandle>,
    ready: Vec<SocketHandle>,
    /// Echo bytes the stack's send buffer did not take yet.
    owed: std::collections::HashMap<SocketHandle, Vec<u8>>,
    echoed: u64,
}

impl Peer {
    fn open(link: &str) -> Result<Peer, BoxErr> {
        let spec: LinkSpec = link.parse()?;
        let dev = usnet_link::open(&spec, &LinkOptions::default())?;
        let mut cfg = StackConfig {
            mac: mac_from_seed(0x77_02),
            addrs: vec![format!("{PEER_ADDR}/24").parse()?],
            seed: 0x77_02,
            ..StackConfig::default()
        };
        usnet_driver::fit_to_device(&mut cfg, dev.caps());
        let stack = Stack::new(cfg)?;
        Ok(Peer {
            driver: Driver::new(stack, dev, SystemClock::new()),
            conns: Vec::new(),
            ready: Vec::new(),
            owed: Default::default(),
            echoed: 0,
        })
    }

    /// One turn with the echo; sleeps a little when nothing moved.
    fn pump(&mut self) -> Result<(), BoxErr> {
        let Peer {
            driver,
            ready,
            owed,
            echoed,
            ..
        } = self;
        let t = driver.turn_with(|st| echo(st, ready, owed, echoed))?;
        if !t.busy() {
            driver.wait(Duration::from_millis(1))?;
        }
        Ok(())
    }

    fn pump_for(&mut self, d: Duration) -> Result<(), BoxErr> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.pump()?;
        }
        Ok(())
    }

    /// Opens `n` connections spread over `ports`, a batch at a time, each batch
    /// established before the next.
    fn connect(&mut self, n: usize, ports: &[u16]) -> Result<(), BoxErr> {
        let mut k = 0;
        while k < n {
            // The first one alone: it resolves the server's address, which holds
            // only a few frames meanwhile.
            let to = if k == 0 { 1 } else { (k + BATCH).min(n) };
            let first = self.conns.len();
            for j in k..to {
                let at: SocketAddr = (SERVER_ADDR, ports[j % ports.len()]).into();
                let h = self.driver.stack_mut().tcp_connect(None, at)?;
                self.conns.push(h);
            }
            let end = Instant::now() + Duration::from_secs(30);
            loop {
                self.pump()?;
                let st = self.driver.stack();
                let up = self.conns[first..]
                    .iter()
                    .filter(|&&h| st.tcp_state(h).is_ok_and(|s| s == TcpState::Established))
                    .count();
                if up == to - k {
                    break;
                }
                if Instant::now() > end {
                    return Err(format!(
                        "{} of {} connections established after 30 s",
                        first + up,
                        to
                    )
                    .into());
                }
            }
            k = to;
        }
        Ok(())
    }

    /// Pumps until the application says something (at most `timeout`).
    fn until_line(&mut self, from: &mut Lines, timeout: Duration) -> Result<String, BoxErr> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(l) = from.line(Duration::ZERO)? {
                if let Some(e) = l.strip_prefix("E ") {
                    return Err(format!("the application: {e}").into());
                }
                return Ok(l);
            }
            if Instant::now() > end {
                return Err(format!("the application said nothing within {timeout:?}").into());
            }
            self.pump()?;
        }
    }
}

/// Echoes every byte the ready connections received.
fn echo(
    st: &mut Stack,
    ready: &mut Vec<SocketHandle>,
    owed: &mut std::collections::HashMap<SocketHandle, Vec<u8>>,
    echoed: &mut u64,
) -> bool {
    let mut worked = false;
    owed.retain(|&h, bytes| match st.tcp_send(h, bytes) {
        Ok(k) => {
            bytes.drain(..k);
            worked |= k > 0;
            !bytes.is_empty()
        }
        Err(StackError::WouldBlock) => true,
        Err(_) => false,
    });
    st.take_ready(ready);
    let mut buf = [0u8; 2048];
    for h in ready.drain(..) {
        loop {
            match st.tcp_recv(h, &mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    worked = true;
                    *echoed += k as u64;
                    let sent = match st.tcp_send(h, &buf[..k]) {
                        Ok(s) => s,
                        Err(StackError::WouldBlock) => 0,
                        Err(_) => break,
                    };
                    if sent < k {
                        owed.entry(h).or_default().extend_from_slice(&buf[sent..k]);
                    }
                }
                Err(_) => break,
            }
        }
    }
    worked
}

/// `usnet up` on a shm link, stopped when dropped.
struct UpServer {
    child: Child,
}

impl UpServer {
    fn start(name: &str, link: &str) -> Result<UpServer, BoxErr> {
        let child = Command::new(std::env::current_exe()?)
            .args(["up", "--name", name, "--link", link, "--services", "none"])
            .args(["--addr", &format!("{SERVER_ADDR}/24"), "--quiet"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let mut s = UpServer { child };
        // Up when its control socket answers (a plain connection: no session, no
        // thread in this process, which forks the application next).
        let path = usnet_session::ctl::socket_path(name);
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Ok(s);
            }
            if let Some(st) = s.child.try_wait()? {
                return Err(format!("usnet up exited: {st}").into());
            }
            if Instant::now() > end {
                return Err("usnet up did not come up within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for UpServer {
    fn drop(&mut self) {
        crate::stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// A forked child, killed and reaped when dropped if it has not exited.
struct Forked(i32);

impl Forked {
    fn reap(&mut self, timeout: Duration) {
        if self.0 > 0 {
            super::reap_within(self.0, timeout);
            self.0 = 0;
        }
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        self.reap(Duration::from_secs(5));
    }
}

/// Memory per connection of a stack server with `n` connections, idle and then
/// after the rounds of `busy`.
pub(super) fn server_case(n: usize, busy: Busy) -> Result<ServerCase, BoxErr> {
    let Busy { rounds, period, .. } = busy;
    let t0 = Instant::now();
    let tag = format!("conns-{}-{n}", std::process::id());
    let link = format!("shm:{tag}");
    let server = UpServer::start(&tag, &link)?;
    let sessions = n.div_ceil(SESSION_SOCKETS - LISTENERS);
    let before = memory_of(server.pid())?;
    let (cmd_r, cmd_w) = pipe()?;
    let (rep_r, rep_w) = pipe()?;
    // SAFETY: this process has no other thread here (the server is another
    // process, the peer opens after); the child runs the application and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    if pid == 0 {
        // SAFETY: the parent's ends are not the child's.
        unsafe {
            libc::close(cmd_w);
            libc::close(rep_r);
        }
        application(&tag, n, sessions, busy, owned(cmd_r), owned(rep_w));
        // SAFETY: leaves without the parent's exit handlers (the server handle).
        unsafe { libc::_exit(0) };
    }
    let mut app = Forked(pid);
    // SAFETY: the child's ends are not ours.
    unsafe {
        libc::close(cmd_r);
        libc::close(rep_w);
    }
    let mut to_app = std::fs::File::from(owned(cmd_w));
    let mut from_app = Lines::new(owned(rep_r));
    let r = (|| -> Result<ServerCase, BoxErr> {
        let l = from_app
            .line(Duration::from_secs(30))?
            .ok_or("the application did not listen within 30 s")?;
        if l != "L" {
            return Err(format!("the application: {l}").into());
        }
        let mut peer = Peer::open(&link)?;
        let ports: Vec<u16> = (0..sessions * LISTENERS)
            .map(|i| FIRST_PORT + i as u16)
            .collect();
        peer.connect(n, &ports)?;
        let a = peer.until_line(&mut from_app, Duration::from_secs(120))?;
        let heap_idle: i64 = a
            .strip_prefix("A ")
            .ok_or_else(|| format!("the application: {a}"))?
            .parse()?;
        peer.pump_for(Duration::from_millis(300))?;
        let idle = memory_of(server.pid())?;
        let mut heap_busy = heap_idle;
        for _ in 0..rounds {
            writeln!(to_app, "R {}", period.as_millis())?;
            let d = peer.until_line(&mut from_app, period + Duration::from_secs(120))?;
            heap_busy = d
                .strip_prefix("D ")
                .ok_or_else(|| format!("the application: {d}"))?
                .parse()?;
        }
        peer.pump_for(Duration::from_millis(300))?;
        let after = memory_of(server.pid())?;
        let want = (rounds * n * busy.msg) as u64;
        if peer.echoed != want {
            return Err(format!("the peer echoed {} bytes, not {want}", peer.echoed).into());
        }
        Ok(ServerCase {
            sessions,
            idle: PerConn::from(&before, &idle, heap_idle, n),
            busy: PerConn::from(&before, &after, heap_busy, n),
            rounds,
            setup_s: t0.elapsed().as_secs_f64(),
        })
    })();
    let _ = writeln!(to_app, "Q");
    drop(to_app);
    app.reap(Duration::from_secs(10));
    drop(server);
    // The server gave up root after creating the link's file and its control
    // socket, so it could not remove them.
    let _ = std::fs::remove_file(format!("/dev/shm/usnet-shm-{tag}"));
    let _ = std::fs::remove_file(usnet_session::ctl::socket_path(&tag));
    r
}
