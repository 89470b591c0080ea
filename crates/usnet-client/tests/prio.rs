//! Priority control through a stack server, with a real client process as the
//! consumer (as root: real setpriority(2)). The client is this test binary again,
//! run with `PRIO_CHILD` set: it attaches, binds a UDP socket, says so, and reads
//! nothing until its stdin closes, so its queue fills past half.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use usnet_client::{Client, UdpSocket};
use usnet_driver::sched::{can_boost, nice_of};

const CHILD_ENV: &str = "PRIO_CHILD";
const CHILD_NICE: i32 = 5;
const PORT: u16 = 7300;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The client process's part (does nothing in a normal test run).
#[test]
fn prio_child() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Its nice value before it attaches, on the main thread (the server ranks the
    // process by that) and on this one (libtest's, which reads).
    let me = usnet_driver::sched::gettid();
    for tid in [std::process::id(), me] {
        // SAFETY: plain system call on integers.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, CHILD_NICE) };
    }
    let c = Client::attach(&name).unwrap();
    let s = UdpSocket::bind(&c, sa(&format!("{}:{PORT}", common::ADDR))).unwrap();
    s.set_recv_buffer_size(8192).unwrap();
    println!("ready {} {me}", std::process::id());
    // Reads nothing; ends when the parent closes stdin (or dies).
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(s);
}

#[test]
fn a_client_process_is_boosted_past_half_and_restored_when_the_server_stops() {
    if can_boost().is_err() {
        eprintln!("skipped: needs CAP_SYS_NICE (root)");
        return;
    }
    let name = "prio-boost";
    let mut srv = common::server_with(
        name,
        |stack| {
            stack.rx_policy.priority = true;
            stack.rx_policy.boost = 10;
        },
        |_| {},
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "prio_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, name)
        .env("USNET_RUN_DIR", std::env::var_os("USNET_RUN_DIR").unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Its "ready" line, read by a thread so the wait has a deadline.
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // libtest may have started the line ("test prio_child ... ").
            if let Some(at) = line.find("ready ") {
                let ids: Vec<u32> = line[at + 6..]
                    .split_whitespace()
                    .map(|v| v.parse().unwrap())
                    .collect();
                let _ = tx.send((ids[0], ids[1]));
            }
        }
    });
    let (pid, reader) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the client is ready");
    assert_eq!(pid, child.id());
    assert_eq!(nice_of(pid).unwrap(), CHILD_NICE);
    assert_eq!(nice_of(reader).unwrap(), CHILD_NICE);

    // Fill its queue past half: it is boosted by 10 steps.
    let c = Client::attach(name).unwrap();
    let tx = UdpSocket::bind(&c, sa(&format!("{}:0", common::ADDR))).unwrap();
    let to = sa(&format!("{}:{PORT}", common::ADDR));
    let end = Instant::now() + Duration::from_secs(10);
    while nice_of(pid).unwrap() == CHILD_NICE && Instant::now() < end {
        tx.send_to(&[7u8; 1000], to).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(nice_of(pid).unwrap(), CHILD_NICE - 10, "boosted");
    assert_eq!(
        nice_of(reader).unwrap(),
        CHILD_NICE - 10,
        "the whole process: its reading thread too"
    );
    let boosted = srv
        .call(Duration::from_secs(5), |lp| {
            (
                lp.driver.booster().map(|b| b.boosted()),
                lp.stack().prio_status().boosted,
            )
        })
        .unwrap();
    assert_eq!(boosted, (Some(vec![pid]), vec![pid]));

    // The server stops with the boost in force (no drain: the client reads
    // nothing): the client is put back.
    srv.shutdown().unwrap();
    assert_eq!(
        nice_of(pid).unwrap(),
        CHILD_NICE,
        "restored when the server stopped"
    );
    assert_eq!(nice_of(reader).unwrap(), CHILD_NICE);
    assert!(
        !usnet_server::boost_state_path(name).exists(),
        "nothing left to recover"
    );
    drop(child.stdin.take());
    let end = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the client did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_marks_its_sockets_priority_within_its_own_rights() {
    let name = "prio-mark";
    let srv = common::server_with(
        name,
        |stack| {
            stack.rx_policy.forced_drop = true;
            stack.rx_policy.set_size = 1;
        },
        |_| {},
    );
    let c = Client::attach(name).unwrap();
    let a = UdpSocket::bind(&c, sa(&format!("{}:7401", common::ADDR))).unwrap();
    let b = UdpSocket::bind(&c, sa(&format!("{}:7402", common::ADDR))).unwrap();
    let set = |srv: &usnet_server::ServerHandle| {
        srv.call(Duration::from_secs(5), |lp| {
            lp.stack()
                .prio_status()
                .members
                .iter()
                .map(|m| (m.port, m.priority))
                .collect::<Vec<_>>()
        })
        .unwrap()
    };
    // Both rank as this process (ties to the older socket): a is S.
    let own = -nice_of(std::process::id()).unwrap();
    assert_eq!(set(&srv), vec![(7401, own)]);
    // Ranking a below its process needs no right: b takes its place.
    a.set_rx_priority(Some(own - 3)).unwrap();
    assert_eq!(set(&srv), vec![(7402, own)]);
    // The mark taken back: a ranks as its process again, and is older.
    a.set_rx_priority(None).unwrap();
    assert_eq!(set(&srv), vec![(7401, own)]);
    // Above its own priority it needs CAP_SYS_NICE, as setpriority does.
    let r = b.set_rx_priority(Some(own + 5));
    if can_boost().is_ok() {
        r.unwrap();
        assert_eq!(set(&srv), vec![(7402, own + 5)]);
    } else {
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert_eq!(set(&srv), vec![(7401, own)]);
    }
    // A listener takes a mark too (its accepted connections share its port).
    let l = usnet_client::TcpListener::bind(&c, sa(&format!("{}:7403", common::ADDR))).unwrap();
    let mark = if can_boost().is_ok() { own + 50 } else { own };
    l.set_rx_priority(Some(mark)).unwrap();
    if can_boost().is_ok() {
        assert_eq!(set(&srv), vec![(7403, own + 50)]);
    }
}
