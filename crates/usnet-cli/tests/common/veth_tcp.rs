//! usnet's side of a TCP interop test on a real wire: a veth pair whose inner end
//! sits in a network namespace for the other stack, usnet's stack on the outer end
//! through its AF_PACKET link (offloads off, optionally 1 % loss each way), and the
//! usnet half of a conversation that checks every byte against a pattern.
//! `interop_gvisor.rs` and `interop_smoltcp_veth.rs` use it.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use usnet_link::af_packet::AfPacketDevice;
use usnet_link::fault::FaultConfig;
use usnet_link::{Device, DeviceCaps, LinkOptions};
use usnet_runtime::{NetStack, RuntimeConfig, TcpStream};
use usnet_stack::{mac_from_seed, StackConfig, TcpInfo, TcpState, TcpStats};

use super::*;

/// The byte at offset `i` of stream `seed`; `interop/gvisor/main.go`'s `patternByte`
/// computes the same.
pub fn pattern(seed: u64, i: u64) -> u8 {
    let x = i
        .wrapping_add(seed << 40)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i >> 13) as u8
}

/// usnet's AF_PACKET link without its checksum and segmentation offloads: the
/// kernel passes a frame that a packet socket sent with a partial checksum or as
/// one 64 KiB GSO frame over the veth as it is, and the peer reads the other end
/// through a packet socket too (no virtio header), so it would see bad checksums
/// and oversized frames. With these caps the stack sends finished frames.
pub struct NoOffload(pub Box<dyn Device>);

impl Device for NoOffload {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            tx_csum_offload: false,
            tso: false,
            ..self.0.caps()
        }
    }
    fn rx_burst(
        &mut self,
        pool: &mut usnet_pool::PacketPool,
        out: &mut Vec<usnet_pool::PktBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        self.0.rx_burst(pool, out, max)
    }
    fn tx_burst(
        &mut self,
        pool: &mut usnet_pool::PacketPool,
        frames: &mut std::collections::VecDeque<usnet_pool::PktBuf>,
    ) -> std::io::Result<usize> {
        self.0.tx_burst(pool, frames)
    }
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.0.wait(timeout)
    }
    fn waker(&self) -> usnet_link::Waker {
        self.0.waker()
    }
    fn prepare_wait(&mut self) -> usnet_link::WaitPlan {
        self.0.prepare_wait()
    }
    fn rx_ready(&mut self) -> bool {
        self.0.rx_ready()
    }
    fn wait_kind(&self) -> usnet_link::WaitKind {
        self.0.wait_kind()
    }
    fn link_state(&self) -> usnet_link::LinkState {
        self.0.link_state()
    }
    fn stats(&self) -> usnet_link::DeviceStats {
        self.0.stats()
    }
    fn bind_pool(&mut self, pool: &mut usnet_pool::PacketPool) -> std::io::Result<()> {
        self.0.bind_pool(pool)
    }
    fn info(&self) -> Option<String> {
        self.0.info()
    }
    fn release_buffers(&mut self, pool: &mut usnet_pool::PacketPool) {
        self.0.release_buffers(pool)
    }
}

/// The wire: a namespace holding the peer's veth end, usnet's stack on the other.
pub struct Wire {
    pub net: NetStack,
    pub ns: String,
    pub inner: String,
    pub dir: TempDir,
    // Dropped last: the stack stops before its interface goes.
    _veth: Cleanup,
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.net.shutdown();
    }
}

/// A wire named after `peer` (a short word) and `tag` whose usnet end drops 1 % of
/// the frames each way if `lossy`. usnet has `addrs`; `pcap_var` names the
/// environment variable that, set to FILE, records usnet's side in FILE.TAG.
pub fn wire(peer: &str, tag: &str, lossy: bool, addrs: &[&str], pcap_var: &str) -> Wire {
    let pid = std::process::id() % 100_000;
    let ns = format!("usnet-{peer}{tag}-{pid}");
    let (outer, inner) = (format!("u{peer}{tag}a{pid}"), format!("u{peer}{tag}b{pid}"));
    let veth = veth_netns(&ns, &outer, &inner, &[]);
    // No address on either end, and no IPv6 of the kernel's own (router
    // solicitations, MLD) on the peer's.
    must(
        "ip",
        &[
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{inner}.disable_ipv6=1"),
        ],
    );
    let dev = AfPacketDevice::open(&outer, None).expect("af_packet on the veth");
    let opts = LinkOptions {
        fault: lossy.then(|| FaultConfig {
            drop: 0.01,
            seed: u64::from(pid),
            ..Default::default()
        }),
        pcap: std::env::var_os(pcap_var)
            .map(|f| PathBuf::from(format!("{}.{tag}", f.to_string_lossy()))),
        ..Default::default()
    };
    let dev = usnet_link::wrap(Box::new(dev), &opts).expect("fault injector");
    let net = NetStack::start(
        Box::new(NoOffload(dev)),
        StackConfig {
            mac: mac_from_seed(0x6776),
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            ..Default::default()
        },
        RuntimeConfig::default(),
    )
    .expect("usnet stack");
    Wire {
        net,
        ns,
        inner,
        dir: TempDir::new(&format!("{peer}-{tag}")),
        _veth: veth,
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum End {
    Fin,
    Rst,
}

impl End {
    pub fn flag(self) -> &'static str {
        match self {
            End::Fin => "fin",
            End::Rst => "rst",
        }
    }
}

/// Writes `n` bytes of stream `seed`.
pub fn send_stream(s: &TcpStream, seed: u64, n: u64) -> Result<(), String> {
    let mut buf = vec![0u8; 256 << 10];
    let mut off = 0u64;
    let mut w = s;
    while off < n {
        let k = (n - off).min(buf.len() as u64) as usize;
        for (j, b) in buf[..k].iter_mut().enumerate() {
            *b = pattern(seed, off + j as u64);
        }
        w.write_all(&buf[..k])
            .map_err(|e| format!("write at {off}: {e}"))?;
        off += k as u64;
    }
    Ok(())
}

/// Reads and checks `n` bytes of stream `seed` from `peer`.
pub fn recv_stream(s: &TcpStream, seed: u64, n: u64, peer: &str) -> Result<(), String> {
    let mut buf = vec![0u8; 256 << 10];
    let mut off = 0u64;
    let mut r = s;
    while off < n {
        let want = (n - off).min(buf.len() as u64) as usize;
        let k = r
            .read(&mut buf[..want])
            .map_err(|e| format!("read at {off} of {n}: {e}"))?;
        if k == 0 {
            return Err(format!("EOF after {off} of {n} bytes"));
        }
        for (j, &b) in buf[..k].iter().enumerate() {
            let i = off + j as u64;
            let p = pattern(seed, i);
            if b != p {
                return Err(format!("byte {i} from {peer} is {b:#04x}, not {p:#04x}"));
            }
        }
        off += k as u64;
    }
    Ok(())
}

/// Reads past the end of the peer's stream: EOF for its FIN, ECONNRESET for its RST.
pub fn recv_end(s: &TcpStream, end: End) -> Result<(), String> {
    let mut r = s;
    let mut one = [0u8; 1];
    match (end, r.read(&mut one)) {
        (End::Fin, Ok(0)) => Ok(()),
        (End::Rst, Err(e)) if e.kind() == ErrorKind::ConnectionReset => Ok(()),
        (want, got) => Err(format!(
            "after the last byte: {got:?}, expected the peer's {want:?}"
        )),
    }
}

/// Waits (up to `step`) until `f` holds; `why` says what was going on if not.
pub fn wait_until(
    what: &str,
    step: Duration,
    mut f: impl FnMut() -> bool,
    why: impl Fn() -> String,
) {
    let deadline = Instant::now() + step;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            why()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// usnet's half of a conversation on an established `stream`.
pub struct Converse<'a> {
    /// Names the conversation in failures.
    pub name: &'a str,
    /// What the peer has to say when something fails.
    pub peer_output: &'a dyn Fn() -> String,
    /// The peer's name in messages.
    pub peer: &'a str,
    pub usnet_seed: u64,
    pub peer_seed: u64,
    pub usnet_bytes: u64,
    pub peer_bytes: u64,
    pub usnet_end: End,
    pub peer_end: End,
    /// How long any one step (a read, a write, the close) may take.
    pub step: Duration,
}

impl Converse<'_> {
    /// Both streams at once; usnet ends only after it has the peer's bytes, then
    /// closes with `usnet_end` and reads the peer's `peer_end`. Returns usnet's
    /// `tcp_info` and counters once everything is acknowledged (or the last seen).
    pub fn run(&self, stream: TcpStream) -> (Option<TcpInfo>, Option<TcpStats>) {
        let (name, step) = (self.name, self.step);
        let mut stream = stream;
        stream.set_read_timeout(Some(step)).unwrap();
        stream.set_write_timeout(Some(step)).unwrap();
        let stream = Arc::new(stream);
        let result = Arc::new(Mutex::new(None));
        let writer = {
            let (s, r, seed, n) = (
                stream.clone(),
                result.clone(),
                self.usnet_seed,
                self.usnet_bytes,
            );
            std::thread::spawn(move || *r.lock().unwrap() = Some(send_stream(&s, seed, n)))
        };
        let received = recv_stream(&stream, self.peer_seed, self.peer_bytes, self.peer);
        let why = || {
            format!(
                "usnet: {:?}\n{:?}\n{}",
                stream.info(),
                stream.stats(),
                (self.peer_output)()
            )
        };
        if let Err(e) = received {
            panic!("{name}: {e}\n{}", why());
        }
        wait_until("usnet's writer", step, || writer.is_finished(), why);
        let _ = writer.join();
        let sent = result.lock().unwrap().take().expect("writer result");
        if let Err(e) = sent {
            panic!("{name}: {e}\n{}", why());
        }
        if self.usnet_end == End::Fin {
            stream.shutdown(Shutdown::Write).expect("shutdown");
        }
        if let Err(e) = recv_end(&stream, self.peer_end) {
            panic!("{name}: {e}\n{}", why());
        }
        let mut info = stream.info().ok();
        let mut stats = stream.stats().ok();
        match (self.usnet_end, self.peer_end) {
            (End::Fin, End::Fin) => wait_until(
                "usnet's side closed",
                step,
                || {
                    matches!(
                        stream.state(),
                        Ok(TcpState::TimeWait | TcpState::Closed) | Err(_)
                    )
                },
                why,
            ),
            (End::Rst, _) => {
                stream.flush_acked(step).expect("usnet's data acknowledged");
                stream.set_linger(Some(Duration::ZERO)).unwrap();
            }
            (End::Fin, End::Rst) => {}
        }
        // The counters once everything is acknowledged (a connection gone already
        // keeps the earlier ones).
        if let Ok(i) = stream.info() {
            info = Some(i);
        }
        if let Ok(s) = stream.stats() {
            stats = Some(s);
        }
        // The last handle: closing it sends the RST when lingering 0.
        drop(Arc::into_inner(stream).expect("one handle"));
        (info, stats)
    }
}

/// Runs `cases` on two wires for `peer` (see [`wire`]): a lossy one for those
/// `lossy` picks and a clean one for the rest; `run` holds one conversation.
/// `pcap_var` set to FILE records usnet's side of each wire in FILE.TAG.
pub fn run_on_wires<C>(
    (peer, tag): (&str, &str),
    addrs: &[&str],
    pcap_var: &str,
    cases: Vec<C>,
    lossy: impl Fn(&C) -> bool,
    run: impl Fn(&Wire, &C),
) {
    let lossy_wire = wire(peer, &format!("{tag}l"), true, addrs, pcap_var);
    let clean_wire = wire(peer, &format!("{tag}c"), false, addrs, pcap_var);
    for c in cases {
        run(if lossy(&c) { &lossy_wire } else { &clean_wire }, &c);
    }
    for (what, w) in [("lossy", &lossy_wire), ("clean", &clean_wire)] {
        eprintln!("usnet's {what} link: {:?}", w.net.device_stats());
    }
}

/// The peer's connection on `l` (waiting up to `step`), which must come from
/// `from`; `what` names the conversation and `why` says what the peer was doing.
pub fn accept_from(
    w: &Wire,
    l: &usnet_runtime::TcpListener,
    from: std::net::IpAddr,
    (what, step): (&str, Duration),
    why: &dyn Fn() -> String,
) -> TcpStream {
    let ready = w.net.wait_readable(&[l.handle()], Some(step));
    assert!(!ready.is_empty(), "{what}: no connection\n{}", why());
    let (s, peer) = l.accept().expect("accept");
    assert_eq!(peer.ip(), from, "{what}: connection from elsewhere");
    s
}
