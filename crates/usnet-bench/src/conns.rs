//! `usnet bench conns`: what an idle established TCP connection costs in memory,
//! usnet against Linux, at several connection counts.
//!
//! - **usnet**: two stacks in this process on the simulated wire (virtual time), one
//!   listening on several ports, the other connecting N times; every connection is
//!   accepted and established, nothing is sent. The cost is the growth of the heap
//!   in use (glibc's `mallinfo2`: bytes in allocated chunks plus mmapped blocks, not
//!   RSS, so what the allocator keeps cached does not count), over 2N connection
//!   ends (both ends hold the same state: a socket entry, the TCP engine's state,
//!   receive and send rings whose storage comes with the first byte).
//! - **Linux**: N loopback connection pairs held by child processes (as many as the
//!   descriptor limit needs), accepted and idle. The
//!   cost is the growth of the kernel's slab memory (`Slab` in `/proc/meminfo`:
//!   `tcp_sock`, the socket inode, the file, the dentry, the hash entries) over 2N
//!   ends, plus the idle sockets' buffer memory (`TCP: mem` in
//!   `/proc/net/sockstat`, pages).
//!
//! - **the stack server** (`server`): a `usnet up` process whose connections'
//!   application ends are client sockets in another process, idle and then busy at
//!   a low rate (a few rounds of 100 bytes each way). Its cost per connection is the
//!   server's anonymous memory, the session memory's pages (slots and rings, whoever
//!   touched them) and the client library's heap, against Linux's slab and socket
//!   buffers for the same number of connections after the same rounds.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use usnet_report::{bar_plot, write_json, Table};
use usnet_stack::sim::{Faults, SimNet};
use usnet_stack::{mac_from_seed, StackConfig, StackError};

mod server;

type BoxErr = Box<dyn std::error::Error>;

/// Ports the listeners use: each takes at most the ephemeral range's worth of
/// connections from one address.
const PORTS: u16 = 8;
const FIRST_PORT: u16 = 20_000;

#[derive(Debug, Clone)]
pub struct ConnsBenchOptions {
    pub out: PathBuf,
    /// Connection counts to measure at.
    pub counts: Vec<usize>,
    pub quick: bool,
    /// Parts to run ([`PARTS`]; empty: all).
    pub only: Vec<String>,
    /// Rounds of the busy phase of the stack-server case.
    pub rounds: usize,
    /// How long each round is spread over (None: 2 s, or longer above 10,000
    /// connections, so the rate stays at about 5,000 exchanges a second).
    pub period: Option<Duration>,
    /// Bytes each way per connection and round.
    pub msg: usize,
    /// Ring bytes the server case's client sessions ask for (None: the client's
    /// default, 256 KiB).
    pub ring_bytes: Option<u32>,
}

impl Default for ConnsBenchOptions {
    fn default() -> Self {
        ConnsBenchOptions {
            out: PathBuf::from("bench-out/conns"),
            counts: vec![10_000, 50_000, 100_000],
            quick: false,
            only: Vec::new(),
            rounds: 3,
            period: None,
            msg: server::MSG,
            ring_bytes: None,
        }
    }
}

/// Heap bytes in use (allocated chunks and mmapped blocks).
pub(crate) fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

fn cfg(i: u8) -> StackConfig {
    StackConfig {
        mac: mac_from_seed(i as u64),
        addrs: vec![format!("10.0.0.{i}/24").parse().unwrap()],
        seed: i as u64 * 7919,
        ..Default::default()
    }
}

/// usnet: bytes per idle connection end, and how long setting them up took.
fn usnet_idle(n: usize) -> Result<(f64, Duration), BoxErr> {
    let t0 = Instant::now();
    let mut net = SimNet::new(1, Faults::default());
    net.add(cfg(1))?;
    net.add(cfg(2))?;
    let mut listeners = Vec::new();
    for p in 0..PORTS {
        let at: SocketAddr = (Ipv4Addr::new(10, 0, 0, 2), FIRST_PORT + p).into();
        listeners.push(net.stack_mut(1).tcp_listen(at, 4096)?);
    }
    // The first connection resolves the neighbours: the baseline is taken after it.
    // The handles are the bench's, not the stacks': their room is taken before the
    // baseline.
    let mut clients = Vec::with_capacity(n + 1);
    let mut servers = Vec::with_capacity(n + 1);
    let mut batch = |net: &mut SimNet, from: usize, to: usize| -> Result<(), BoxErr> {
        for k in from..to {
            let port = FIRST_PORT + (k % PORTS as usize) as u16;
            let at: SocketAddr = (Ipv4Addr::new(10, 0, 0, 2), port).into();
            clients.push(net.stack_mut(0).tcp_connect(None, at)?);
        }
        let want = to;
        let end = net.now() + Duration::from_secs(60);
        while servers.len() < want {
            if !net.step() && net.now() > end {
                return Err(
                    format!("only {} of {want} connections accepted", servers.len()).into(),
                );
            }
            for &l in &listeners {
                loop {
                    match net.stack_mut(1).tcp_accept(l) {
                        Ok(s) => servers.push(s),
                        Err(StackError::WouldBlock) => break,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        // Let the last ACKs settle.
        net.run_for(Duration::from_millis(50));
        Ok(())
    };
    batch(&mut net, 0, 1)?;
    let before = heap_in_use();
    let mut done = 1;
    while done < n + 1 {
        let to = (done + 2_000).min(n + 1);
        batch(&mut net, done, to)?;
        done = to;
    }
    let after = heap_in_use();
    let established = net.stack(0).tcp_connections().len();
    if established < n {
        return Err(format!("{established} of {n} connections established").into());
    }
    let per_end = after.saturating_sub(before) as f64 / (2 * n) as f64;
    Ok((per_end, t0.elapsed()))
}

fn meminfo_kib(key: &str) -> Result<u64, BoxErr> {
    let m = std::fs::read_to_string("/proc/meminfo")?;
    m.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("no {key} in /proc/meminfo").into())
}

/// Pages of TCP socket buffer memory (`TCP: ... mem N` in /proc/net/sockstat).
fn tcp_mem_pages() -> Result<u64, BoxErr> {
    let s = std::fs::read_to_string("/proc/net/sockstat")?;
    let line = s
        .lines()
        .find(|l| l.starts_with("TCP:"))
        .ok_or("no TCP line in /proc/net/sockstat")?;
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == "mem" {
            return Ok(it.next().ok_or("sockstat: mem without a value")?.parse()?);
        }
    }
    Err("sockstat: no mem".into())
}

/// Descriptors one process may hold here (the hard limit may not be raisable).
fn nofile_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads and writes one rlimit struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    r.rlim_cur
}

/// In a child process: `k` loopback connection pairs, accepted; one byte to
/// `ready` when they stand, then they are held until `go` closes. Each `r` byte on
/// `go` is a round: `msg` bytes from each client end, echoed by its server end; a
/// `d` byte to `ready` when it is done.
fn hold_pairs(k: usize, msg: usize, ready: i32, go: i32) -> Result<(), BoxErr> {
    let listeners: Vec<TcpListener> = (0..PORTS)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<_, _>>()?;
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()?;
    let mut pairs = Vec::with_capacity(k);
    for j in 0..k {
        let i = j % PORTS as usize;
        let c = TcpStream::connect(addrs[i])?;
        let (s, _) = listeners[i].accept()?;
        // No read in a round may wait for ever.
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        pairs.push((c, s));
    }
    // One byte each way on one pair: the connections are working ones.
    if let Some((c, s)) = pairs.first_mut() {
        c.write_all(b"x")?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
    }
    let mut f = pipe_file(ready);
    f.write_all(b"r")?;
    let mut g = pipe_file(go);
    let mut b = [0u8; 1];
    // Returns 0 when the parent closes its end.
    while g.read(&mut b)? == 1 && b[0] == b'r' {
        let out = vec![b'm'; msg];
        let mut back = vec![0u8; msg];
        for (c, s) in &mut pairs {
            c.write_all(&out)?;
            s.read_exact(&mut back)?;
            s.write_all(&back)?;
            c.read_exact(&mut back)?;
        }
        f.write_all(b"d")?;
    }
    drop(pairs);
    Ok(())
}

/// Waits for child `pid` to exit, at most `timeout`; then kills it.
pub(crate) fn reap_within(pid: i32, timeout: Duration) {
    let end = Instant::now() + timeout;
    loop {
        // SAFETY: asks about a child of ours without blocking.
        if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != 0 {
            return;
        }
        if Instant::now() > end {
            // SAFETY: a signal to a child of ours, then its reaping (a killed child
            // exits at once).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One byte from `f`, waiting at most `timeout`.
fn byte_within(f: &mut std::fs::File, timeout: Duration) -> Result<u8, BoxErr> {
    use std::os::fd::AsFd;
    if !usnet_shm::poll_fds(&[f.as_fd()], timeout)?.any() {
        return Err(
            format!("a process holding connections said nothing within {timeout:?}").into(),
        );
    }
    let mut b = [0u8; 1];
    match f.read(&mut b)? {
        1 => Ok(b[0]),
        _ => Err("a process holding connections failed (see above)".into()),
    }
}

/// A pipe end as a File that closes it when dropped.
fn pipe_file(fd: i32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: a pipe end this process owns and hands to the File, once.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

pub(crate) fn pipe() -> Result<(i32, i32), BoxErr> {
    let mut p = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok((p[0], p[1]))
}

/// Linux's kernel bytes per connection end: slab and socket buffer pages.
#[derive(Debug, Clone, Copy, Default)]
struct LinuxMem {
    slab: f64,
    bufs: f64,
}

impl LinuxMem {
    fn total(&self) -> f64 {
        self.slab + self.bufs
    }
}

/// Linux: kernel bytes per connection end, idle and after `rounds` rounds of `msg`
/// bytes each way on every connection. The pairs are held by child processes, as
/// many as the descriptor limit needs.
fn linux_case(
    n: usize,
    rounds: usize,
    msg: usize,
) -> Result<(LinuxMem, LinuxMem, Duration), BoxErr> {
    let t0 = Instant::now();
    let per_child = ((nofile_limit().saturating_sub(64)) / 2).clamp(1, 50_000) as usize;
    // Warm the caches (a first pair, slab pages per cpu) before the baseline.
    let warm_l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let warm = TcpStream::connect(warm_l.local_addr()?)?;
    let (warm_s, _) = warm_l.accept()?;
    std::thread::sleep(Duration::from_millis(200));
    let slab0 = meminfo_kib("Slab:")?;
    let mem0 = tcp_mem_pages()?;
    // (pid, the child's "go" end, its "ready" end)
    let mut children: Vec<(i32, std::fs::File, std::fs::File)> = Vec::new();
    let reap = |children: Vec<(i32, std::fs::File, std::fs::File)>| {
        for (pid, go, ready) in children {
            drop(go);
            drop(ready);
            // It exits once its "go" end closes.
            reap_within(pid, Duration::from_secs(30));
        }
    };
    let setup = Duration::from_secs(60) + Duration::from_millis(n as u64);
    let mut left = n;
    while left > 0 {
        let k = left.min(per_child);
        left -= k;
        let (ready_r, ready_w) = pipe()?;
        let (go_r, go_w) = pipe()?;
        // SAFETY: the bench is single-threaded here; the child only runs
        // `hold_pairs` and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if pid == 0 {
            // SAFETY: the parent's ends are not ours.
            unsafe {
                libc::close(ready_r);
                libc::close(go_w);
            }
            // Nor the earlier holders' pipe ends: a copy held here would keep them
            // from seeing the parent close theirs.
            children.clear();
            let code = match hold_pairs(k, msg, ready_w, go_r) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("usnet bench conns: a holder: {e}");
                    1
                }
            };
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: the child's ends are not ours.
        unsafe {
            libc::close(ready_w);
            libc::close(go_r);
        }
        let mut r = pipe_file(ready_r);
        let got = byte_within(&mut r, setup);
        children.push((pid, pipe_file(go_w), r));
        if let Err(e) = got {
            reap(children);
            return Err(e);
        }
    }
    let measure = || -> Result<LinuxMem, BoxErr> {
        std::thread::sleep(Duration::from_millis(200));
        let slab1 = meminfo_kib("Slab:")?;
        let mem1 = tcp_mem_pages()?;
        Ok(LinuxMem {
            slab: (slab1 as f64 - slab0 as f64) * 1024.0 / (2 * n) as f64,
            bufs: (mem1 as f64 - mem0 as f64) * 4096.0 / (2 * n) as f64,
        })
    };
    let rounds_run = (|| -> Result<(LinuxMem, LinuxMem), BoxErr> {
        let idle = measure()?;
        for _ in 0..rounds {
            for (_, go, _) in &mut children {
                go.write_all(b"r")?;
            }
            for (_, _, ready) in &mut children {
                if byte_within(ready, setup)? != b'd' {
                    return Err("a holder's round failed".into());
                }
            }
        }
        let busy = if rounds > 0 { measure()? } else { idle };
        Ok((idle, busy))
    })();
    reap(children);
    drop((warm, warm_s, warm_l));
    let (idle, busy) = rounds_run?;
    Ok((idle, busy, t0.elapsed()))
}

/// `--only` values.
pub const PARTS: [&str; 2] = ["stack", "server"];

pub fn run(o: &ConnsBenchOptions) -> Result<(), BoxErr> {
    crate::check_min(
        "--counts",
        o.counts.iter().copied().min().unwrap_or(0) as u64,
        1,
    )?;
    crate::check_only(&o.only, &PARTS.map(String::from))?;
    crate::check_min("msg", o.msg as u64, 1)?;
    let want = |p: &str| o.only.is_empty() || o.only.iter().any(|x| x == p);
    std::fs::create_dir_all(&o.out)?;
    let counts: Vec<usize> = if o.quick {
        vec![2_000]
    } else {
        o.counts.clone()
    };
    let rounds = if o.quick { 2 } else { o.rounds };
    let mut t = Table::new(
        "Memory per idle established TCP connection end (bytes)",
        [
            "connections",
            "usnet (heap)",
            "Linux (slab)",
            "Linux (socket buffers)",
            "usnet ÷ Linux",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut ts = Table::new(
        format!(
            "Stack server: memory per connection (bytes), idle and after {rounds} rounds of \
             {} B each way",
            o.msg
        ),
        [
            "connections",
            "state",
            "server heap",
            "session pages",
            "client library",
            "usnet total",
            "Linux (slab + buffers)",
            "usnet ÷ Linux",
            "server RSS",
            "pool RSS",
            "session mapped",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut rows = Vec::new();
    let mut srows = Vec::new();
    let mut bars = Vec::new();
    let mut sbars = Vec::new();
    for &n in &counts {
        let stack = if want("stack") {
            Some(usnet_idle(n)?)
        } else {
            None
        };
        let srv = if want("server") {
            // Spread each round so that the machine takes it at a low rate (about
            // 5,000 exchanges a second at most: at 20,000 a second a loaded machine's
            // peer fell behind and the server's blocked connections piled up).
            let period = if o.quick {
                Duration::from_secs(1)
            } else {
                o.period
                    .unwrap_or_else(|| Duration::from_secs_f64((n as f64 / 5_000.0).max(2.0)))
            };
            Some(server::server_case(
                n,
                server::Busy {
                    rounds,
                    period,
                    msg: o.msg,
                    ring_bytes: o.ring_bytes,
                },
            )?)
        } else {
            None
        };
        let (li, lb, lt) = linux_case(n, if srv.is_some() { rounds } else { 0 }, o.msg)?;
        if let Some((u, ut)) = stack {
            let linux = li.total();
            t.row(vec![
                n.to_string(),
                format!("{u:.0}"),
                format!("{:.0}", li.slab),
                format!("{:.0}", li.bufs),
                format!("{:.2}×", u / linux.max(1.0)),
            ]);
            rows.push(json!({
                "connections": n,
                "usnet_heap_bytes_per_end": u,
                "linux_slab_bytes_per_end": li.slab,
                "linux_socket_buffer_bytes_per_end": li.bufs,
                "usnet_setup_s": ut.as_secs_f64(),
                "linux_setup_s": lt.as_secs_f64(),
            }));
            bars.push((format!("usnet {n}"), u));
            bars.push((format!("Linux {n}"), linux));
        }
        if let Some(c) = srv {
            for (state, u, l) in [("idle", c.idle, li), ("busy", c.busy, lb)] {
                ts.row(vec![
                    n.to_string(),
                    state.into(),
                    format!("{:.0}", u.server_anon),
                    format!("{:.0}", u.session_touched),
                    format!("{:.0}", u.client_heap),
                    format!("{:.0}", u.total()),
                    format!("{:.0}", l.total()),
                    format!("{:.2}×", u.total() / l.total().max(1.0)),
                    format!("{:.0}", u.server_rss),
                    format!("{:.0}", u.pool_rss),
                    format!("{:.0}", u.session_mapped),
                ]);
                srows.push(json!({
                    "connections": n,
                    "state": state,
                    "rounds": if state == "idle" { 0 } else { c.rounds },
                    "sessions": c.sessions,
                    "server_anon_bytes_per_conn": u.server_anon,
                    "session_touched_bytes_per_conn": u.session_touched,
                    "session_mapped_bytes_per_conn": u.session_mapped,
                    "session_in_server_bytes_per_conn": u.session_in_server,
                    "client_heap_bytes_per_conn": u.client_heap,
                    "usnet_total_bytes_per_conn": u.total(),
                    "server_rss_bytes_per_conn": u.server_rss,
                    "server_pss_bytes_per_conn": u.server_pss,
                    "pool_rss_bytes_per_conn": u.pool_rss,
                    "linux_slab_bytes_per_end": l.slab,
                    "linux_socket_buffer_bytes_per_end": l.bufs,
                    "server_case_s": c.setup_s,
                }));
                sbars.push((format!("usnet {state} {n}"), u.total()));
                sbars.push((format!("Linux {state} {n}"), l.total()));
            }
        }
    }
    let mut goal = true;
    if !rows.is_empty() {
        t.print();
        let met = rows.iter().all(|r| {
            r["usnet_heap_bytes_per_end"].as_f64().unwrap_or(f64::MAX)
                <= r["linux_slab_bytes_per_end"].as_f64().unwrap_or(0.0)
                    + r["linux_socket_buffer_bytes_per_end"]
                        .as_f64()
                        .unwrap_or(0.0)
        });
        println!(
            "goal {}: usnet ≤ Linux per idle connection at every count",
            if met { "met" } else { "NOT met" }
        );
        goal &= met;
        bar_plot(
            &o.out.join("conns.png"),
            "Memory per idle TCP connection end (lower is better)",
            "bytes",
            &bars,
        )?;
        std::fs::write(o.out.join("conns.md"), t.to_markdown())?;
    }
    if !srows.is_empty() {
        ts.print();
        let met = srows.iter().filter(|r| r["state"] == "idle").all(|r| {
            r["usnet_total_bytes_per_conn"].as_f64().unwrap_or(f64::MAX)
                <= r["linux_slab_bytes_per_end"].as_f64().unwrap_or(0.0)
                    + r["linux_socket_buffer_bytes_per_end"]
                        .as_f64()
                        .unwrap_or(0.0)
        });
        println!(
            "goal {}: the stack server ≤ Linux per idle connection at every count",
            if met { "met" } else { "NOT met" }
        );
        goal &= met;
        bar_plot(
            &o.out.join("conns-server.png"),
            "Stack server: memory per TCP connection (lower is better)",
            "bytes",
            &sbars,
        )?;
        std::fs::write(o.out.join("conns-server.md"), ts.to_markdown())?;
    }
    write_json(
        &o.out.join("conns.json"),
        &json!({"quick": o.quick, "rows": rows, "server_rows": srows, "goal_met": goal}),
    )?;
    println!("wrote {}", o.out.display());
    Ok(())
}
