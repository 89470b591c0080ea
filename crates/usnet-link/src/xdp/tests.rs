//! The AF_XDP link against the kernel (root): the steering program loads, verifies
//! and decides like its reference; a device on a veth whose other end sits in a
//! network namespace exchanges frames with Linux, leaves the host's traffic alone,
//! gives every buffer back and takes its program with it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::prog::tests::{cases, steering};
use super::*;
use crate::tap::tests::{arp_exchange, OUR_MAC};
use crate::testutil::pool;

fn root() -> bool {
    if !sys::is_root() {
        eprintln!("skipped: needs root");
        return false;
    }
    true
}

#[test]
fn the_steering_program_loads_verifies_and_decides_like_its_reference() {
    if !root() {
        return;
    }
    let map = bpf::create_xskmap(1).unwrap();
    let s = steering();
    let insns = prog::steering_program(&s, map.as_raw_fd()).unwrap();
    let p = match bpf::load_xdp(&insns, "usnet_test") {
        Ok(p) => p,
        Err((e, log)) => panic!("verifier refused the program: {e}\n{log}"),
    };
    for (what, frame, want) in cases() {
        if frame.len() < 14 {
            continue; // BPF_PROG_TEST_RUN needs an Ethernet header
        }
        // No socket in the map: a redirect falls back to the steering's XDP_DROP.
        let r = bpf::test_run_xdp(&p, &frame).unwrap();
        let want = if want { prog::XDP_DROP } else { prog::XDP_PASS };
        assert_eq!(r, want, "{what}");
        assert_eq!(prog::steers(&s, &frame), want == prog::XDP_DROP, "{what}");
    }
}

const NS: &str = "usnet-xdp-ns";
const OURS: &str = "usnt-xdp0";
const PEER: &str = "usnt-xdp1";

/// A netns holding one end of a veth pair (10.97.0.1/24); the host end carries
/// 10.97.0.3/24 of its own. Removed on drop.
struct Veth;
impl Veth {
    fn new() -> Veth {
        let _ = sys::run_ip(&["netns", "del", NS]);
        let _ = sys::run_ip(&["link", "del", OURS]);
        sys::run_ip(&["netns", "add", NS]).unwrap();
        let v = Veth;
        sys::run_ip(&["link", "add", OURS, "type", "veth", "peer", "name", PEER]).unwrap();
        sys::run_ip(&["link", "set", PEER, "netns", NS]).unwrap();
        sys::run_ip(&["addr", "add", "10.97.0.3/24", "dev", OURS]).unwrap();
        sys::run_ip(&["link", "set", OURS, "up"]).unwrap();
        sys::run_ip(&["-n", NS, "link", "set", PEER, "up"]).unwrap();
        sys::run_ip(&["-n", NS, "addr", "add", "10.97.0.1/24", "dev", PEER]).unwrap();
        v
    }
}
impl Drop for Veth {
    fn drop(&mut self) {
        let _ = sys::run_ip(&["netns", "del", NS]);
        let _ = sys::run_ip(&["link", "del", OURS]);
    }
}

fn opts() -> XdpOptions {
    XdpOptions {
        mac: OUR_MAC,
        ipv4: vec![Ipv4Addr::new(10, 97, 0, 2)],
        ipv6: vec![],
        mode: XdpMode::Auto,
    }
}

fn xdp_attached(ifname: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["-d", "link", "show", "dev", ifname])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

#[test]
fn xdp_on_veth_exchanges_frames_and_cleans_up() {
    if !root() {
        return;
    }
    let _veth = Veth::new();
    let mut dev = XdpDevice::open(OURS, 0, None, &opts()).unwrap();
    assert!(xdp_attached(OURS), "program attached");
    assert_eq!(dev.caps().mtu, 1500);
    // A veth: received checksums may be partial and are trusted; sent ones are whole.
    assert!(dev.caps().rx_csum_offload && !dev.caps().tx_csum_offload);
    // A second stack on the same interface: one clear line.
    let e = XdpDevice::open(OURS, 0, None, &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("already has an XDP program") && !e.contains('\n'),
        "{e}"
    );

    let mut p = pool(1024, 2048);
    dev.bind_pool(&mut p).unwrap();
    let info = dev.info().unwrap();
    assert!(
        info.contains("copy mode"),
        "veth cannot do zero-copy: {info}"
    );
    assert_eq!(dev.lent(), 256, "a full fill ring");
    assert_eq!(p.in_use(), 256);
    // Our ARP request leaves through the TX ring, Linux's answer comes back through
    // the program and the RX ring, in a pool buffer.
    arp_exchange(&mut dev, &mut p, [10, 97, 0, 2], [10, 97, 0, 1]);
    assert!(dev.stats().rx_frames >= 1 && dev.stats().tx_frames == 1);

    // Linux answers for its own address on the same interface: the host's traffic
    // passes the program (ARP for 10.97.0.3 from the namespace).
    let ping = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            NS,
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            "10.97.0.3",
        ])
        .output();
    if let Ok(o) = ping {
        assert!(o.status.success(), "host address unreachable: {o:?}");
    }

    // Many frames to Linux: every TX buffer comes back through the completion ring.
    let mut q: VecDeque<_> = (0..600)
        .map(|_| {
            p.alloc_from(&crate::tap::tests::arp_request(
                [10, 97, 0, 2],
                [10, 97, 0, 1],
            ))
            .unwrap()
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(5);
    while !q.is_empty() && Instant::now() < end {
        dev.tx_burst(&mut p, &mut q).unwrap();
    }
    assert!(q.is_empty());
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        dev.wait(Some(Duration::from_millis(50))).unwrap();
        dev.rx_burst(&mut p, &mut got, 64).unwrap();
        for b in got.drain(..) {
            p.free(b);
        }
        if dev.lent() == 256 {
            break;
        }
    }
    assert_eq!(
        dev.lent(),
        256,
        "sent buffers completed: {}",
        dev.info().unwrap()
    );
    assert_eq!(p.in_use(), 256);

    dev.release_buffers(&mut p);
    assert_eq!(p.in_use(), 0, "every lent buffer back");
    assert!(!xdp_attached(OURS), "program detached on release");
    drop(dev);

    // A stack restarted at once gets the queue, again and again: the kernel lets go
    // of a closed socket's queue only after the close returns, and the bind waits.
    for _ in 0..10 {
        let mut again = XdpDevice::open(OURS, 0, None, &opts()).unwrap();
        again.bind_pool(&mut p).unwrap();
        again.release_buffers(&mut p);
        drop(again);
    }
    assert_eq!(p.in_use(), 0);
}

#[test]
fn a_crashed_owner_leaves_no_program_behind() {
    if !root() {
        return;
    }
    // A child process attaches and is killed: the kernel closes the BPF link with
    // the process, which detaches the program.
    const IF: &str = "usnt-xdpc0";
    let _ = sys::run_ip(&["link", "del", IF]);
    sys::run_ip(&[
        "link",
        "add",
        IF,
        "type",
        "veth",
        "peer",
        "name",
        "usnt-xdpc1",
    ])
    .unwrap();
    struct Del;
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = sys::run_ip(&["link", "del", IF]);
        }
    }
    let _del = Del;
    // The owner is this test binary run again (a fork of the multi-threaded test
    // harness could deadlock in the child): it opens the device and sleeps.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // Its stderr is ours: a failed open shows in this test's output.
    let mut child = Reap(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "xdp::tests::crash_owner_child",
                "--test-threads=1",
                "--nocapture",
            ])
            .env("USNET_XDP_CRASH_CHILD", IF)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(10);
    while !xdp_attached(IF) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(xdp_attached(IF), "the child did not attach its program");
    // SIGKILL: no destructor runs in the child.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while xdp_attached(IF) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!xdp_attached(IF), "program detached after SIGKILL");
}

/// The crash test's child: opens the device on the interface named in
/// `USNET_XDP_CRASH_CHILD` and sleeps until killed (at most 30 s). Does nothing when run
/// as an ordinary test.
#[test]
fn crash_owner_child() {
    let Ok(ifname) = std::env::var("USNET_XDP_CRASH_CHILD") else {
        return;
    };
    let _dev = XdpDevice::open(&ifname, 0, None, &opts()).expect("child opens the device");
    std::thread::sleep(Duration::from_secs(30));
    panic!("the crash test never killed its child");
}
