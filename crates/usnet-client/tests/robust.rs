//! Robustness of the stack server against its clients, and of clients against the
//! server, across processes: a client killed with SIGKILL mid-transfer, the server
//! killed mid-transfer, a hostile client scribbling on its shared memory, many client
//! processes at once, and who may attach.
//!
//! The other processes are this test binary run again with `USNET_ROBUST_ROLE` set: it
//! then runs only the ignored test `helper`, which plays the role (see `helper`).
//! Every wait has a deadline, and a helper dies with the test (PR_SET_PDEATHSIG and a
//! kill on drop).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use usnet_client::{AttachOptions, Client, Event, Interest, Mode, Poller, TcpListener};
use usnet_client::{TcpStream, UdpSocket};
use usnet_server::{ServerConfig, ServerHandle, ServerLimits};
use usnet_session_abi::{errno, Geometry};
use usnet_stack::{mac_from_seed, Owner, StackConfig};

const ADDR: [u8; 4] = [10, 66, 0, 1];
const ROLE: &str = "USNET_ROBUST_ROLE";
/// How long a call to the test's server may take.
const WITHIN: Duration = Duration::from_secs(1);
/// The bound for noticing a death, in both directions: the mechanism's is a liveness
/// slice (50 ms) and the goal one second, but a test on a loaded two-core CI
/// machine can lose its core for longer than that. A wait this long is a death not
/// noticed, not a slow machine; the notice's speed is measured, not asserted.
const NOTICED: Duration = Duration::from_secs(5);

fn at(port: u16) -> SocketAddr {
    (ADDR, port).into()
}

static RUN_DIR: Once = Once::new();

/// One private run directory per test process; helpers inherit it.
fn run_dir() {
    RUN_DIR.call_once(|| {
        if std::env::var_os(ROLE).is_some() {
            return;
        }
        let d = std::env::temp_dir().join(format!("usnet-robust-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // Other users must reach the control sockets for the permission test to test
        // the sockets' modes, not the directory's.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: called once, before this process spawns helpers or reads it.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
    });
}

/// A stack server in this process on an in-memory link (sockets to its own address
/// are delivered locally), with small TCP buffers so thousands of connections fit.
fn server(name: &str, tweak: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    run_dir();
    let tcp = usnet_stack::TcpConfig {
        send_buffer: 256 << 10,
        recv_buffer: 256 << 10,
        recv_buffer_initial: 64 << 10,
        ..Default::default()
    };
    let stack = StackConfig {
        mac: mac_from_seed(11),
        addrs: vec![
            format!("{}.{}.{}.{}/24", ADDR[0], ADDR[1], ADDR[2], ADDR[3])
                .parse()
                .unwrap(),
        ],
        mtu: 65535 - 28,
        pool: usnet_pool::PoolConfig {
            count: 16384,
            ..Default::default()
        },
        tcp,
        ..Default::default()
    };
    let mut cfg = ServerConfig {
        name: name.into(),
        link: "mem".into(),
        spin: Duration::from_micros(20),
        ..Default::default()
    };
    tweak(&mut cfg);
    usnet_server::testing::in_memory(stack, cfg).unwrap()
}

// ------------------------------------------------------------------ helpers

/// A helper process: its stdout lines arrive on a channel; killed and reaped on drop.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    status: Option<ExitStatus>,
}

impl Proc {
    fn spawn(role: &str, args: &[String]) -> Proc {
        run_dir();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ])
            .env(ROLE, role)
            .env("USNET_ROBUST_ARGS", args.join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            status: None,
        }
    }

    /// The first line starting with `tag` (its rest), within `timeout`.
    fn expect(&mut self, tag: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(tag) {
                        return rest.trim().to_string();
                    }
                }
                Err(_) => panic!(
                    "helper {}: no '{tag}' line within {timeout:?} (exit: {:?})",
                    self.child.id(),
                    self.child.try_wait()
                ),
            }
        }
    }

    fn kill(&mut self) {
        // SAFETY: kill(2) on our own child, which is not reaped yet (the pid is ours).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
    }

    /// Closes the helper's stdin (its cue to finish).
    fn release(&mut self) {
        drop(self.child.stdin.take());
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let end = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.status = Some(s);
                return s;
            }
            if Instant::now() > end {
                self.kill();
                panic!(
                    "helper {} did not finish within {timeout:?}",
                    self.child.id()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill();
            let _ = self.child.wait();
        }
    }
}

fn args() -> Vec<String> {
    std::env::var("USNET_ROBUST_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Blocks until stdin closes (the parent's cue), at most `max`.
fn wait_for_release(max: Duration) {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut b = [0u8; 16];
        while matches!(std::io::stdin().read(&mut b), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(max);
}

/// The byte at stream position `i` of a checked transfer: a marker every 64 bytes, so
/// another client that ever sees these bytes can tell.
const MARKER: &[u8; 16] = b"GOOD-CLIENT-DATA";

fn pattern(i: u64) -> u8 {
    let k = (i % 64) as usize;
    if k < 16 {
        MARKER[k]
    } else {
        (i.wrapping_mul(31) >> 3) as u8
    }
}

fn fill(buf: &mut [u8], pos: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern(pos + k as u64);
    }
}

/// Runs in helper processes (this binary run again with `USNET_ROBUST_ROLE`).
#[test]
#[ignore = "a helper process of the other tests, not a test"]
fn helper() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    // Die with the parent.
    // SAFETY: prctl with an integer signal number has no memory-safety preconditions.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let a = args();
    let code = match role.as_str() {
        "stream" => role_stream(&a[0], a[1].parse().unwrap()),
        "server" => role_server(&a[0]),
        "hostile" => role_hostile(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "many" => role_many(
            &a[0],
            a[1].parse().unwrap(),
            a[2].parse().unwrap(),
            a[3].parse().unwrap(),
        ),
        "as-user" => role_as_user(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "write-close-exit" => {
            role_write_close_exit(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap())
        }
        r => panic!("unknown role {r}"),
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // Straight out: no exit handlers racing the test harness's own threads (a helper
    // that changed its uid crashed in them now and then).
    // SAFETY: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(code) };
}

/// Connects to `port` and streams both ways until killed.
fn role_stream(name: &str, port: u16) -> i32 {
    let c = Client::attach(name).unwrap();
    let s = Arc::new(TcpStream::connect(&c, at(port)).unwrap());
    println!("ready {}", c.session_id());
    let s2 = s.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut pos = 0u64;
        loop {
            fill(&mut buf, pos);
            match (&*s2).write(&buf) {
                Ok(n) => pos += n as u64,
                Err(_) => return,
            }
        }
    });
    let mut buf = vec![0u8; 65536];
    while matches!((&*s).read(&mut buf), Ok(n) if n > 0) {}
    0
}

/// Connects to `port`, writes `n` bytes of the pattern, closes and exits at once
/// (with bytes still in its send ring: the peer reads slowly).
fn role_write_close_exit(name: &str, port: u16, n: u64) -> i32 {
    let c = Client::attach(name).unwrap();
    let s = TcpStream::connect(&c, at(port)).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut pos = 0u64;
    while pos < n {
        let k = (n - pos).min(buf.len() as u64) as usize;
        fill(&mut buf[..k], pos);
        pos += (&s).write(&buf[..k]).unwrap() as u64;
    }
    drop(s);
    0
}

/// A stack server in this process until killed.
fn role_server(name: &str) -> i32 {
    let _srv = server(name, |_| {});
    println!("ready");
    wait_for_release(Duration::from_secs(60));
    0
}

// ------------------------------------------------------------------ 1. client killed

/// A client that writes, closes and exits while its send ring still holds bytes
/// (its peer reads slowly): the bytes still go out and the peer sees every one, then
/// EOF, as with a kernel socket closed by a process that exits.
#[test]
fn a_client_that_closes_and_exits_still_delivers_what_it_wrote() {
    let name = "close-exit";
    let _srv = server(name, |_| {});
    let peer = Client::attach(name).unwrap();
    let l = TcpListener::bind(&peer, at(7410)).unwrap();
    let n: u64 = 6 << 20;
    let mut p = Proc::spawn(
        "write-close-exit",
        &[name.into(), "7410".into(), n.to_string()],
    );
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A slow reader: the writer's ring stays full, so it closes and exits with
    // bytes still there.
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16384];
        let mut pos = 0u64;
        loop {
            let k = (&s).read(&mut buf).expect("read after the writer exited");
            if k == 0 {
                return pos;
            }
            for (j, &b) in buf[..k].iter().enumerate() {
                assert_eq!(b, pattern(pos + j as u64), "byte {}", pos + j as u64);
            }
            pos += k as u64;
            std::thread::sleep(Duration::from_micros(300));
        }
    });
    let st = p.wait(Duration::from_secs(30));
    assert!(st.success(), "writer: {st}");
    let pos = reader.join().expect("reader");
    assert_eq!(pos, n, "bytes before EOF");
}

/// A client process killed with SIGKILL while it streams both ways: within 1 s its
/// connection is reset toward its peer (who sees ECONNRESET or EOF, reading and
/// writing), its session and sockets are gone from the server; another client's
/// transfer running across the kill completes with every byte right; once all is
/// idle, the stack's socket count and packet pool are back where they were.
#[test]
fn a_client_killed_mid_transfer_is_reset_and_reclaimed() {
    let name = "kill-client";
    let srv = server(name, |_| {});
    let base_pool = srv
        .call(WITHIN, |lp| lp.stack().pool().stats().in_use)
        .unwrap();
    let peer = Client::attach(name).unwrap();
    let l = TcpListener::bind(&peer, at(7400)).unwrap();

    // The bystander: its own session, a checked transfer that spans the kill.
    let other = Client::attach(name).unwrap();
    let ol = TcpListener::bind(&other, at(7401)).unwrap();
    let tx_side = TcpStream::connect(&other, at(7401)).unwrap();
    let (rx_side, _) = ol.accept().unwrap();
    rx_side
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let (stop2, moved2) = (stop.clone(), moved.clone());
    let writer = std::thread::spawn(move || {
        let mut buf = vec![0u8; 32768];
        let mut pos = 0u64;
        while !stop2.load(Acquire) || pos < (4 << 20) {
            fill(&mut buf, pos);
            let n = (&tx_side).write(&buf).expect("bystander write");
            pos += n as u64;
        }
        tx_side.shutdown(std::net::Shutdown::Write).unwrap();
        pos
    });
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut pos = 0u64;
        loop {
            let n = (&rx_side).read(&mut buf).expect("bystander read");
            if n == 0 {
                return pos;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(
                    b,
                    pattern(pos + k as u64),
                    "bystander byte {}",
                    pos + k as u64
                );
            }
            pos += n as u64;
            moved2.store(pos, Release);
        }
    });

    let sockets_before = srv.call(WITHIN, |lp| lp.stack().socket_count().0).unwrap();
    let mut victim = Proc::spawn("stream", &[name.into(), "7400".into()]);
    let (conn, _) = l.accept().unwrap();
    let session: u32 = victim
        .expect("ready", Duration::from_secs(10))
        .parse()
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let conn = Arc::new(conn);
    // The peer streams too, and reads, until the connection breaks.
    let (ended_tx, ended) = channel();
    let (c1, c2) = (conn.clone(), conn.clone());
    let et = ended_tx.clone();
    let peer_reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut got = 0u64;
        let r = loop {
            match (&*c1).read(&mut buf) {
                Ok(0) => break Ok(0),
                Ok(n) => got += n as u64,
                Err(e) => break Err(e),
            }
            if got >= (1 << 20) {
                let _ = et.send(("progress", Instant::now(), None));
            }
        };
        let _ = et.send(("read", Instant::now(), r.err().map(|e| e.raw_os_error())));
    });
    let peer_writer = std::thread::spawn(move || {
        let buf = vec![7u8; 65536];
        let e = loop {
            if let Err(e) = (&*c2).write(&buf) {
                break e;
            }
        };
        let _ = ended_tx.send(("write", Instant::now(), Some(e.raw_os_error())));
    });
    // Mid-transfer: the peer has read a MiB and the bystander moved bytes too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (what, _, _) = ended.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(
            what, "progress",
            "the victim's connection broke before the kill"
        );
        if moved.load(Acquire) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the bystander moves nothing");
    }
    let moved_at_kill = moved.load(Acquire);
    victim.kill();
    let t0 = Instant::now();
    victim.wait(Duration::from_secs(5));

    // The peer sees the reset, reading and writing.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (what, when, e) = ended
            .recv_timeout(2 * NOTICED)
            .expect("the peer never saw the connection end");
        if what == "progress" {
            continue;
        }
        let took = when.duration_since(t0);
        assert!(took < NOTICED, "{what} ended {took:?} after the kill");
        match (what, e) {
            ("read", None) => {}
            ("read", Some(e)) => assert_eq!(e, Some(errno::ECONNRESET as i32), "read"),
            ("write", Some(e)) => assert!(
                [errno::ECONNRESET, errno::EPIPE]
                    .map(|x| Some(x as i32))
                    .contains(&e),
                "write failed with {e:?}"
            ),
            other => panic!("unexpected {other:?}"),
        }
        seen.push(what);
    }
    peer_reader.join().unwrap();
    peer_writer.join().unwrap();
    // Its session and sockets are gone, within the same second.
    loop {
        let (listed, held, total) = srv
            .call(WITHIN, move |lp| {
                let listed = lp.clients().iter().any(|r| r.id == session);
                let held = lp.stack().sockets_of(Owner(session)).len();
                (listed, held, lp.stack().socket_count().0)
            })
            .unwrap();
        // Before the victim: the two listeners and the bystander's two ends; now
        // also the peer's end of the reset connection (still open here).
        if !listed && held == 0 && total == sockets_before + 1 {
            break;
        }
        assert!(
            t0.elapsed() < NOTICED,
            "not reclaimed: listed {listed}, holds {held}, stack sockets {total} \
             (before {sockets_before})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The bystander kept going and gets every byte.
    let end = Instant::now() + Duration::from_secs(10);
    while moved.load(Acquire) < moved_at_kill + (1 << 20) {
        assert!(Instant::now() < end, "the bystander stalled after the kill");
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Release);
    let sent = writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), sent);
    // All idle: every packet buffer back in the pool.
    drop((conn, l, ol));
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let in_use = srv
            .call(WITHIN, |lp| lp.stack().pool().stats().in_use)
            .unwrap();
        if in_use == base_pool {
            break;
        }
        assert!(
            Instant::now() < end,
            "pool in use {in_use}, {base_pool} before"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(srv.is_running());
}

// ------------------------------------------------------------------ 2. server killed

fn is_clear(e: &std::io::Error) -> bool {
    [errno::ENETDOWN, errno::ECONNRESET, errno::EPIPE]
        .map(|x| Some(x as i32))
        .contains(&e.raw_os_error())
}

/// The server process killed with SIGKILL while this process is blocked reading,
/// writing, accepting and polling: each blocked call fails within 1 s with
/// ENETDOWN/ECONNRESET/EPIPE (the poll wakes to the socket reset, and a read
/// then fails so), every later call fails at once the same way, and dropping
/// everything does not hang.
#[test]
fn a_server_killed_mid_transfer_fails_every_call() {
    let name = "kill-server";
    let mut srv = Proc::spawn("server", &[name.into()]);
    srv.expect("ready", Duration::from_secs(10));
    let c = Client::attach(name).unwrap();
    let l = TcpListener::bind(&c, at(7500)).unwrap();
    let a1 = TcpStream::connect(&c, at(7500)).unwrap();
    let (a2, _) = l.accept().unwrap();
    let b1 = TcpStream::connect(&c, at(7500)).unwrap();
    let (b2, _) = l.accept().unwrap();
    let u = UdpSocket::bind(&c, at(7501)).unwrap();
    let (a1, b1, l, u) = (Arc::new(a1), Arc::new(b1), Arc::new(l), Arc::new(u));
    let (done_tx, done) = channel::<(&str, Instant, std::io::Error)>();
    let written = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    {
        // Blocked in read: nothing ever comes.
        let (ra, tx) = (a1.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            let mut b = [0u8; 64];
            let r = (&*ra).read(&mut b);
            let _ = tx.send(("read", Instant::now(), r.expect_err("read returned")));
        }));
        // Blocked in write: nobody reads b2.
        let (b1, tx, w) = (b1.clone(), done_tx.clone(), written.clone());
        threads.push(std::thread::spawn(move || {
            let buf = vec![1u8; 65536];
            let e = loop {
                match (&*b1).write(&buf) {
                    Ok(n) => {
                        w.fetch_add(n as u64, Release);
                    }
                    Err(e) => break e,
                }
            };
            let _ = tx.send(("write", Instant::now(), e));
        }));
        // Blocked in accept and in recv_from.
        let (l2, tx) = (l.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            let r = l2.accept().map(|_| ());
            let _ = tx.send(("accept", Instant::now(), r.expect_err("accept returned")));
        }));
        let (u2, tx) = (u.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            let mut b = [0u8; 64];
            let r = u2.recv_from(&mut b).map(|_| ());
            let _ = tx.send(("recv_from", Instant::now(), r.expect_err("recv returned")));
        }));
        // Blocked in a poller: it wakes to the socket reset (readable, hung up,
        // in error, as a kernel poll reports a reset connection; a wait that also
        // holds kernel descriptors goes on seeing them), and the read then fails.
        let (pa, tx) = (a1.clone(), done_tx.clone());
        threads.push(std::thread::spawn(move || {
            let mut p = Poller::new();
            p.register(&*pa, 1, Interest::READABLE, Mode::Level)
                .unwrap();
            let mut ev: Vec<Event> = Vec::new();
            loop {
                match p.wait(&mut ev, Some(Duration::from_secs(30))) {
                    Ok(0) => continue,
                    Ok(_) => break,
                    Err(e) => panic!("the poller failed instead of reporting: {e}"),
                }
            }
            let when = Instant::now();
            let e = ev[0];
            assert!(e.readable && e.closed && e.error, "{e:?}");
            let mut b = [0u8; 8];
            let r = (&*pa).read(&mut b).expect_err("read after the reset");
            let _ = tx.send(("poll", when, r));
        }));
    }
    drop(done_tx);
    // The writer is blocked once the rings and windows are full: no progress.
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = (written.load(Acquire), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let w = written.load(Acquire);
        if w != last.0 {
            last = (w, Instant::now());
        } else if w > 0 && last.1.elapsed() > Duration::from_millis(300) {
            break;
        }
        assert!(Instant::now() < end, "the writer never blocked");
    }
    srv.kill();
    let t0 = Instant::now();
    srv.wait(Duration::from_secs(5));
    let mut ended = Vec::new();
    for _ in 0..5 {
        let (what, when, e) = done
            .recv_timeout(2 * NOTICED)
            .unwrap_or_else(|_| panic!("blocked calls still blocked; ended: {ended:?}"));
        let took = when.duration_since(t0);
        assert!(took < NOTICED, "{what} failed {took:?} after the kill");
        assert!(is_clear(&e), "{what}: {e}");
        ended.push(what);
    }
    for t in threads {
        t.join().unwrap();
    }
    // Every later call fails at once with a clear errno.
    let t1 = Instant::now();
    let mut b = [0u8; 16];
    let later: Vec<(&str, std::io::Error)> = vec![
        ("write", (&*a1).write(b"x").unwrap_err()),
        ("read", (&b2).read(&mut b).unwrap_err()),
        ("read2", (&a2).read(&mut b).unwrap_err()),
        ("send_to", u.send_to(b"x", at(9)).unwrap_err()),
        ("connect", TcpStream::connect(&c, at(7500)).unwrap_err()),
        ("bind", UdpSocket::bind(&c, at(0)).map(|_| ()).unwrap_err()),
        ("nop", c.nop().unwrap_err()),
        ("accept", l.accept().map(|_| ()).unwrap_err()),
    ];
    for (what, e) in &later {
        assert!(is_clear(e), "{what}: {e}");
    }
    assert!(
        t1.elapsed() < NOTICED,
        "later calls took {:?}",
        t1.elapsed()
    );
    assert!(!c.is_alive());
    // Nothing hangs on the way out.
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        drop((a1, a2, b1, b2, l, u, c));
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("dropping sockets of a dead server hangs");
}

// ------------------------------------------------------------------ 3. hostile client

/// Attaches by hand (as any program may) and scribbles on the session for `secs`
/// (`usnet_server::hostile`: random bytes and words anywhere, header, ring indices,
/// requests, slot words, data area, and random requests aimed at the good client's
/// ports); after each round it looks for the good client's bytes anywhere in its
/// memory (prints "leak" if found).
fn role_hostile(name: &str, secs: f64, good_port: u16) -> i32 {
    let mut h =
        usnet_server::hostile::Hostile::attach(name, 100_000, 4096, std::process::id() as u64)
            .unwrap();
    println!("session {}", h.session);
    let targets: Vec<SocketAddr> = [good_port]
        .into_iter()
        .chain((0..16).map(|k| 7000 + k))
        .map(at)
        .collect();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut snap = Vec::new();
    let mut rounds = 0u64;
    while Instant::now() < end {
        rounds += 1;
        h.scribble(64, &targets);
        h.snapshot(&mut snap);
        if snap.windows(MARKER.len()).any(|w| w == MARKER) {
            println!("leak");
            return 3;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    println!("done {rounds}");
    wait_for_release(Duration::from_secs(30));
    0
}

/// A hostile client process scribbles on its rings, indices, slot words and data area
/// and fires random requests for seconds while a good client moves checked bytes: the
/// server keeps running and serving (the good transfer never stalls and every byte is
/// right), the hostile client never sees the good client's bytes, never holds more
/// sockets than its quota (its slots; in the stack, its slots plus its listeners'
/// capped backlogs), its abuse is counted, and all it held is gone when it goes.
#[test]
fn a_hostile_client_cannot_crash_stall_or_read_others() {
    let name = "hostile";
    let quota = 16u32;
    let max_backlog = 4usize;
    let srv = server(name, |c| {
        c.geometry = Geometry {
            max_sockets: quota,
            ring_bytes: 64 << 10,
            ..Default::default()
        };
        c.limits = ServerLimits {
            max_backlog,
            ..Default::default()
        };
    });
    let good = Client::attach(name).unwrap();
    let l = TcpListener::bind(&good, at(7600)).unwrap();
    let tx_side = TcpStream::connect(&good, at(7600)).unwrap();
    let (rx_side, _) = l.accept().unwrap();
    drop(l);
    rx_side
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let (stop2, moved2) = (stop.clone(), moved.clone());
    let writer = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16384];
        let mut pos = 0u64;
        while !stop2.load(Acquire) {
            fill(&mut buf, pos);
            pos += (&tx_side).write(&buf).expect("good write") as u64;
        }
        tx_side.shutdown(std::net::Shutdown::Write).unwrap();
        pos
    });
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut pos = 0u64;
        loop {
            // A stall of 5 s fails here.
            let n = (&rx_side).read(&mut buf).expect("good read stalled");
            if n == 0 {
                return pos;
            }
            for (k, &b) in buf[..n].iter().enumerate() {
                assert_eq!(b, pattern(pos + k as u64), "good byte {}", pos + k as u64);
            }
            pos += n as u64;
            moved2.store(pos, Release);
        }
    });
    let mut h = Proc::spawn("hostile", &[name.into(), "3".into(), "7600".into()]);
    let session: u32 = h
        .expect("session", Duration::from_secs(10))
        .parse()
        .unwrap();
    // Watch the hostile session while it works.
    let mut worst = (0u64, 0u64);
    let mut row = None;
    let mut moved_during = 0u64;
    let start_moved = moved.load(Acquire);
    let (done_tx, done_rx) = channel();
    let lines = std::mem::replace(&mut h.lines, channel().1);
    std::thread::spawn(move || {
        for l in lines.iter() {
            if l.starts_with("done") || l.starts_with("leak") {
                let _ = done_tx.send(l);
                return;
            }
        }
    });
    let end = Instant::now() + Duration::from_secs(30);
    let verdict = loop {
        if let Ok(l) = done_rx.try_recv() {
            break l;
        }
        assert!(Instant::now() < end, "the hostile helper never finished");
        assert!(srv.is_running(), "the server died");
        let r = srv
            .call(Duration::from_secs(5), move |lp| {
                lp.clients().into_iter().find(|r| r.id == session)
            })
            .expect("the server loop does not answer");
        if let Some(r) = r {
            worst.0 = worst.0.max(r.sockets);
            worst.1 = worst.1.max(r.stack_sockets);
            row = Some(r);
        }
        moved_during = moved.load(Acquire) - start_moved;
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        verdict.starts_with("done"),
        "the hostile client read: {verdict}"
    );
    // Still attached: its final counters.
    let r = srv
        .call(WITHIN, move |lp| {
            lp.clients().into_iter().find(|r| r.id == session)
        })
        .unwrap()
        .or(row)
        .expect("the hostile session is listed");
    let row = r;
    h.release();
    assert!(h.wait(Duration::from_secs(10)).success());
    eprintln!(
        "hostile: {row:?}; most slots {}, stack sockets {}; good bytes meanwhile {moved_during}",
        worst.0, worst.1
    );
    assert!(
        moved_during > 0,
        "the good transfer made no progress meanwhile"
    );
    assert!(worst.0 <= quota as u64, "hostile held {} slots", worst.0);
    let listeners_max = quota as u64;
    assert!(
        worst.1 <= quota as u64 + listeners_max * max_backlog as u64,
        "hostile held {} stack sockets",
        worst.1
    );
    assert_eq!(row.max_sockets, quota, "{row:?}");
    let st = &row.stats;
    assert!(st.quota_geometry > 0, "{row:?}");
    assert!(st.quota_sockets > 0, "{row:?}");
    assert!(st.quota_backlog > 0, "{row:?}");
    assert!(st.bad_requests + st.corrupt_rings > 0, "{row:?}");
    // Gone: everything it held is closed.
    let end = Instant::now() + Duration::from_secs(5);
    while srv
        .call(WITHIN, move |lp| {
            lp.stack().sockets_of(Owner(session)).len()
        })
        .unwrap()
        > 0
    {
        assert!(Instant::now() < end, "the hostile client's sockets stay");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Release);
    let sent = writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), sent);
    assert!(srv.is_running());
}

// ------------------------------------------------------------------ 5. many clients

/// Client `k` of `n`: listens on port 20000+k and echoes what its `conns` accepted
/// connections send; opens `conns` connections to client k+1's listener, sends each a
/// payload of its own and checks the echo.
fn role_many(name: &str, k: u16, n: u16, conns: usize) -> i32 {
    let c = Client::attach_with(
        Some(name),
        &AttachOptions {
            ring_bytes: Some(4096),
            max_sockets: Some(2 * conns as u32 + 8),
            ..Default::default()
        },
    )
    .unwrap();
    const LEN: usize = 1000;
    let l = TcpListener::bind_with_backlog(&c, at(20000 + k), 2 * conns).unwrap();
    let echo = std::thread::spawn(move || {
        let mut keep = Vec::new();
        for _ in 0..conns {
            let (s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut b = vec![0u8; LEN];
            (&s).read_exact(&mut b).unwrap();
            (&s).write_all(&b).unwrap();
            keep.push(s);
        }
        keep
    });
    let to = at(20000 + (k + 1) % n);
    let end = Instant::now() + Duration::from_secs(30);
    let mut streams = Vec::new();
    for j in 0..conns {
        let s = loop {
            match TcpStream::connect(&c, to) {
                Ok(s) => break s,
                // The next client's listener is not up yet.
                Err(e) if e.raw_os_error() == Some(errno::ECONNREFUSED as i32) => {
                    assert!(Instant::now() < end, "client {k}: {to} never listened");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("client {k} connection {j}: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let payload: Vec<u8> = (0..LEN)
            .map(|i| (i as u64 * 7 + j as u64 * 131 + k as u64 * 9973) as u8)
            .collect();
        (&s).write_all(&payload).unwrap();
        streams.push((s, payload));
    }
    for (j, (s, payload)) in streams.iter().enumerate() {
        let mut back = vec![0u8; LEN];
        (&*s).read_exact(&mut back).unwrap();
        assert!(back == *payload, "client {k} connection {j}: echo differs");
    }
    let kept = echo.join().unwrap();
    assert_eq!(kept.len(), conns);
    println!("ok {k}");
    // Stay until every client is done: our going would reset connections whose
    // echoes another client has not read yet.
    wait_for_release(Duration::from_secs(60));
    0
}

/// 64 client processes with 100 connections each on one server, every connection
/// echoing a payload of its own through another process: all complete with every
/// payload right, and when the processes are gone so are their sessions and sockets.
#[test]
fn sixty_four_client_processes_with_a_hundred_connections_each() {
    let name = "many";
    let (n, conns) = (64u16, 100usize);
    let srv = server(name, |_| {});
    let t = Instant::now();
    let mut procs: Vec<Proc> = (0..n)
        .map(|k| {
            Proc::spawn(
                "many",
                &[name.into(), k.to_string(), n.to_string(), conns.to_string()],
            )
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(50);
    for p in procs.iter_mut() {
        let left = end.saturating_duration_since(Instant::now());
        p.expect("ok", left);
    }
    eprintln!("64 × {conns} connections in {:?}", t.elapsed());
    let (sessions, conns_live) = srv
        .call(WITHIN, |lp| {
            (lp.clients().len(), lp.stack().tcp_connections().len())
        })
        .unwrap();
    assert_eq!(sessions, n as usize);
    assert!(
        conns_live >= 2 * n as usize * conns,
        "{conns_live} connections"
    );
    for p in procs.iter_mut() {
        p.release();
    }
    for (k, p) in procs.iter_mut().enumerate() {
        let s = p.wait(Duration::from_secs(10));
        assert!(s.success(), "client {k}: {s}");
    }
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let (clients, live) = srv
            .call(WITHIN, |lp| {
                let live = lp
                    .stack()
                    .tcp_connections()
                    .iter()
                    .filter(|c| !c.orphan)
                    .count();
                (lp.clients().len(), live)
            })
            .unwrap();
        if clients == 0 && live == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "{clients} sessions and {live} connections left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ------------------------------------------------------------------ 6. who may attach

/// Drops to `uid`/`gid` (no supplementary groups) and tries to attach.
fn role_as_user(name: &str, uid: u32, gid: u32) -> i32 {
    // SAFETY: plain system calls on this process's credentials.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
        assert_eq!(libc::setgid(gid), 0);
        assert_eq!(libc::setuid(uid), 0);
    }
    match Client::attach(name) {
        Ok(c) => {
            c.nop().unwrap();
            println!("result attached");
        }
        Err(e) => println!("result refused {:?} {e}", e.kind()),
    }
    0
}

fn attach_as(name: &str, uid: u32, gid: u32) -> String {
    let mut p = Proc::spawn("as-user", &[name.into(), uid.to_string(), gid.to_string()]);
    let r = p.expect("result", Duration::from_secs(10));
    let s = p.wait(Duration::from_secs(10));
    assert!(s.success(), "helper as {uid}:{gid} ({r}): {s}");
    r
}

/// The control socket is mode 0600 (0660 and the given group with `group`); as root,
/// a process of another user is refused, by the socket's mode and, with the mode
/// opened up, by the server's check of the peer's credentials; a member of the given
/// group attaches and a non-member does not.
#[test]
fn only_the_owner_or_the_given_group_may_attach() {
    use std::os::unix::fs::MetadataExt;
    let srv = server("owner-only", |_| {});
    let path = srv.control_path().unwrap().to_path_buf();
    // Anyone may connect: the server's peer-credential check is the gate (a
    // narrower mode would shut out root without CAP_DAC_OVERRIDE, which it admits).
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!(m.mode() & 0o777, 0o666);
    let gid = 4242u32;
    let gsrv = server("group-ok", |c| c.group = Some(gid));
    let gpath = gsrv.control_path().unwrap().to_path_buf();
    let gm = std::fs::metadata(&gpath).unwrap();
    assert_eq!((gm.mode() & 0o777, gm.gid()), (0o666, gid));
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("not root: the other-user half of this test needs root");
        return;
    }
    let nobody = 65534u32;
    // Another user connects and is refused by the server's check, in words.
    let r = attach_as("owner-only", nobody, nobody);
    assert!(
        r.starts_with("refused PermissionDenied")
            && r.contains("attach refused: permission denied"),
        "{r}"
    );
    // The group: a member attaches, a stranger does not.
    assert_eq!(attach_as("group-ok", nobody, gid), "attached");
    let r = attach_as("group-ok", nobody, gid + 1);
    assert!(r.starts_with("refused"), "{r}");
    // The owner (root here) still attaches.
    let c = Client::attach("owner-only").unwrap();
    c.nop().unwrap();
}
