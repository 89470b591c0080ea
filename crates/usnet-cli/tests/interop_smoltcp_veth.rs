//! usnet's TCP against smoltcp 0.13 on a real wire: smoltcp runs in a thread of
//! this process on one end of a veth pair, through its own `phy::RawSocket`
//! (AF_PACKET) opened inside a network namespace; usnet's stack runs on the other
//! end through its AF_PACKET link, as in `interop_gvisor.rs` (common/veth_tcp.rs).
//! Neither veth end has an IP address, so the kernel answers nothing; ARP and NDP
//! are the two stacks' own. (`crates/usnet-stack/tests/interop_smoltcp.rs` holds the
//! same two stacks in virtual time.)
//!
//! Each family runs four conversations, both streams at once, each side checking
//! every byte it receives against a deterministic pattern. With 1 % of the frames
//! dropped each way at usnet's end (`FaultInjector`): usnet connects to a smoltcp
//! listener and smoltcp to a usnet listener, `BULK` each way, ending with FIN both
//! ways. On a clean wire (nothing recovers a lost RST when the reset side's peer
//! has nothing more to send): 4 MiB each way ending with smoltcp's `abort()` after
//! usnet's FIN, and with usnet's RST (SO_LINGER 0) after smoltcp's FIN; the reset
//! side must see the reset after the last byte. smoltcp offers SACK-permitted and
//! window scaling in every SYN; both must be negotiated, and the shifts usnet's
//! `tcp_info` reports must be the ones on the wire (smoltcp's side of the wire is
//! parsed as it sends and receives, which also counts its retransmissions, the
//! SACK blocks in its ACKs and the segments from usnet that it had acknowledged
//! already). smoltcp's packet socket gets an 8 MiB receive buffer: with the
//! default, the kernel drops frames for it even on the clean wire (each run
//! prints those drops).
//!
//! Needs root ("skipped: needs root" otherwise).

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, ChecksumCapabilities, DeviceCapabilities, Medium, RawSocket};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, HardwareAddress, IpAddress, IpCidr,
    IpEndpoint, IpProtocol, Ipv4Packet, Ipv6Packet, TcpControl, TcpPacket, TcpRepr,
};
use usnet_runtime::{TcpListener, TcpStream};

#[macro_use]
mod common;
use common::veth_tcp::*;
use common::*;

/// Streams: usnet sends pattern 1, smoltcp pattern 3.
const USNET_SEED: u64 = 1;
const SMOL_SEED: u64 = 3;
/// How long any one step (a read, a write, the peer's start or end) may take.
const STEP: Duration = Duration::from_secs(30);
/// smoltcp's thread gives up by itself after this.
const PEER_TIMEOUT: Duration = Duration::from_secs(90);
/// The tests take turns: each moves 100+ MB through two stacks on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());
/// smoltcp's socket buffers (each way): its window shift is log2 of this less 16.
const SMOL_BUF: usize = 1 << 20;
/// smoltcp's packet socket's receive buffer (SO_RCVBUFFORCE).
const RAW_RCVBUF: libc::c_int = 8 << 20;
/// Bytes each way in the two lossy conversations of a family.
const BULK: u64 = 64 << 20;
/// Bytes each way in the two RST conversations.
const SMALL: u64 = 4 << 20;

/// The window shift smoltcp offers for a receive buffer of `SMOL_BUF` bytes
/// (`tcp::Socket::new`: the buffer's bit length less 16).
fn smol_shift() -> u8 {
    (usize::BITS - SMOL_BUF.leading_zeros()).saturating_sub(16) as u8
}

// ------------------------------------------------------------ smoltcp's wire

/// What crossed smoltcp's end of the wire, read from the TCP headers.
#[derive(Default, Debug, Clone)]
struct WireLog {
    /// Data segments smoltcp sent, and of those the ones starting below the
    /// highest sequence number it had sent (retransmissions).
    data_out: u64,
    retransmits: u64,
    /// Segments smoltcp sent with SACK blocks, and received with them.
    sack_out: u64,
    sack_in: u64,
    /// Of `sack_out`, those with more than one block.
    multi_sack_out: u64,
    /// (window scale, SACK-permitted) of smoltcp's SYN and of usnet's.
    syn_out: Option<(Option<u8>, bool)>,
    syn_in: Option<(Option<u8>, bool)>,
    /// RSTs smoltcp sent and received.
    rst_out: u64,
    rst_in: u64,
    snd_max: Option<u32>,
    /// Data segments smoltcp received that lay wholly below what it had already
    /// acknowledged (usnet sent them again needlessly, or the copy overtook).
    stale_in: u64,
    /// The highest acknowledgment number smoltcp has sent.
    ack_max: Option<u32>,
}

/// `a` is before `b` in sequence space.
fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

impl WireLog {
    /// Looks at one frame smoltcp sent (`out`) or received.
    fn note(&mut self, frame: &[u8], out: bool) {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return;
        };
        let with = |this: &mut WireLog, src: IpAddress, dst: IpAddress, payload: &[u8]| {
            let Ok(p) = TcpPacket::new_checked(payload) else {
                return;
            };
            let Ok(r) = TcpRepr::parse(&p, &src, &dst, &ChecksumCapabilities::ignored()) else {
                return;
            };
            this.segment(&r, out);
        };
        match eth.ethertype() {
            EthernetProtocol::Ipv4 => {
                if let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) {
                    if ip.next_header() == IpProtocol::Tcp {
                        let (s, d) = (ip.src_addr().into(), ip.dst_addr().into());
                        with(self, s, d, ip.payload());
                    }
                }
            }
            EthernetProtocol::Ipv6 => {
                if let Ok(ip) = Ipv6Packet::new_checked(eth.payload()) {
                    if ip.next_header() == IpProtocol::Tcp {
                        let (s, d) = (ip.src_addr().into(), ip.dst_addr().into());
                        with(self, s, d, ip.payload());
                    }
                }
            }
            _ => {}
        }
    }

    fn segment(&mut self, r: &TcpRepr, out: bool) {
        let sack = r.sack_ranges[0].is_some();
        let syn = (r.window_scale, r.sack_permitted);
        match (out, r.control) {
            (true, TcpControl::Syn) => self.syn_out = Some(syn),
            (false, TcpControl::Syn) => self.syn_in = Some(syn),
            (true, TcpControl::Rst) => self.rst_out += 1,
            (false, TcpControl::Rst) => self.rst_in += 1,
            _ => {}
        }
        if out {
            self.sack_out += u64::from(sack);
            self.multi_sack_out += u64::from(r.sack_ranges[1].is_some());
        } else {
            self.sack_in += u64::from(sack);
        }
        if let (true, Some(a)) = (out, r.ack_number) {
            let a = a.0 as u32;
            if self.ack_max.is_none_or(|m| seq_lt(m, a)) {
                self.ack_max = Some(a);
            }
        }
        if !out && !r.payload.is_empty() {
            let end = (r.seq_number.0 as u32).wrapping_add(r.payload.len() as u32);
            if self.ack_max.is_some_and(|m| !seq_lt(m, end)) {
                self.stale_in += 1;
            }
        }
        if out && !r.payload.is_empty() {
            let seq = r.seq_number.0 as u32;
            let end = seq.wrapping_add(r.payload.len() as u32);
            self.data_out += 1;
            match self.snd_max {
                Some(m) if seq_lt(seq, m) => {
                    self.retransmits += 1;
                    if seq_lt(m, end) {
                        self.snd_max = Some(end);
                    }
                }
                _ => self.snd_max = Some(end),
            }
        }
    }
}

/// smoltcp's `RawSocket` with every frame noted in a [`WireLog`].
struct Tap {
    dev: RawSocket,
    log: Rc<RefCell<WireLog>>,
}

struct TapRx<T>(T, Rc<RefCell<WireLog>>);
struct TapTx<T>(T, Rc<RefCell<WireLog>>);

impl<T: phy::RxToken> phy::RxToken for TapRx<T> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let log = self.1;
        self.0.consume(|b| {
            log.borrow_mut().note(b, false);
            f(b)
        })
    }
}

impl<T: phy::TxToken> phy::TxToken for TapTx<T> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let log = self.1;
        self.0.consume(len, |b| {
            let r = f(b);
            log.borrow_mut().note(b, true);
            r
        })
    }
}

impl phy::Device for Tap {
    type RxToken<'a> = TapRx<<RawSocket as phy::Device>::RxToken<'a>>;
    type TxToken<'a> = TapTx<<RawSocket as phy::Device>::TxToken<'a>>;

    fn receive(
        &mut self,
        t: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let (rx, tx) = self.dev.receive(t)?;
        Some((TapRx(rx, self.log.clone()), TapTx(tx, self.log.clone())))
    }

    fn transmit(&mut self, t: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(TapTx(self.dev.transmit(t)?, self.log.clone()))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.dev.capabilities()
    }
}

// ------------------------------------------------------------ smoltcp's side

/// What smoltcp's thread is to do.
#[derive(Clone)]
struct SmolJob {
    ns: String,
    iface: String,
    /// smoltcp's address and prefix length.
    addr: IpAddr,
    prefix: u8,
    /// Listen on this port, or connect to usnet here.
    listen: Option<u16>,
    connect: Option<SocketAddr>,
    send: u64,
    recv: u64,
    end: End,
}

/// What smoltcp's thread saw.
#[derive(Debug)]
struct SmolSummary {
    sent: u64,
    received: u64,
    /// How usnet's stream ended as smoltcp saw it.
    peer_end: End,
    wire: WireLog,
    /// Frames the kernel dropped because smoltcp's packet socket was full.
    raw_drops: u64,
}

enum Msg {
    Listening,
    Done(Result<SmolSummary, String>),
}

/// smoltcp in a thread; stopped (and joined, up to 5 s) on drop. It keeps its
/// stack up after its conversation until then, so a retransmitted FIN still gets
/// an answer.
struct SmolPeer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    msgs: Receiver<Msg>,
    status: Arc<Mutex<String>>,
}

impl SmolPeer {
    fn start(job: SmolJob) -> SmolPeer {
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(String::from("starting")));
        let (tx, msgs) = mpsc::channel();
        let thread = {
            let (stop, status) = (stop.clone(), status.clone());
            std::thread::spawn(move || {
                let r = smol_main(&job, &stop, &status, &tx);
                if let Err(e) = r {
                    let _ = tx.send(Msg::Done(Err(e)));
                }
            })
        };
        SmolPeer {
            stop,
            thread: Some(thread),
            msgs,
            status,
        }
    }

    fn output(&self) -> String {
        format!("--- smoltcp: {}", self.status.lock().unwrap())
    }

    fn wait_listening(&self) {
        match self.msgs.recv_timeout(STEP) {
            Ok(Msg::Listening) => {}
            Ok(Msg::Done(r)) => panic!("smoltcp did not listen: {r:?}"),
            Err(e) => panic!("smoltcp did not listen: {e}\n{}", self.output()),
        }
    }

    /// Waits (up to `STEP`) for smoltcp's end of the conversation.
    fn finish(&self) -> SmolSummary {
        match self.msgs.recv_timeout(STEP) {
            Ok(Msg::Done(Ok(s))) => s,
            Ok(Msg::Done(Err(e))) => panic!("smoltcp failed: {e}\n{}", self.output()),
            Ok(Msg::Listening) => panic!("smoltcp said listening twice"),
            Err(e) => panic!("smoltcp did not finish: {e}\n{}", self.output()),
        }
    }
}

impl Drop for SmolPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Some(t) = self.thread.take() {
            if t.is_finished() {
                let _ = t.join();
            } else if Instant::now() < deadline {
                self.thread = Some(t);
                std::thread::sleep(Duration::from_millis(10));
            } else {
                // It stops by itself at PEER_TIMEOUT; never wait without a deadline.
                eprintln!("smoltcp's thread did not stop within 5 s; left behind");
            }
        }
    }
}

/// Moves this thread into network namespace `ns` (`ip netns add` made it).
fn enter_netns(ns: &str) -> Result<(), String> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}"))
        .map_err(|e| format!("open netns {ns}: {e}"))?;
    // SAFETY: setns on a descriptor we own; only this thread changes namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {ns}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The frames the kernel has dropped for packet socket `fd` since it was opened
/// (PACKET_STATISTICS; reading it once, at the end).
fn packet_drops(fd: std::os::fd::RawFd) -> u64 {
    let mut st = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
    // SAFETY: `st` and `len` describe a writable tpacket_stats.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut st as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if r == 0 {
        u64::from(st.tp_drops)
    } else {
        u64::MAX
    }
}

fn smol_ip(a: IpAddr) -> IpAddress {
    match a {
        IpAddr::V4(a) => IpAddress::Ipv4(a),
        IpAddr::V6(a) => IpAddress::Ipv6(a),
    }
}

fn smol_main(
    job: &SmolJob,
    stop: &AtomicBool,
    status: &Mutex<String>,
    tx: &Sender<Msg>,
) -> Result<(), String> {
    let hard = Instant::now() + PEER_TIMEOUT;
    enter_netns(&job.ns)?;
    let raw = RawSocket::new(&job.iface, Medium::Ethernet)
        .map_err(|e| format!("raw socket on {}: {e}", job.iface))?;
    let fd = raw.as_raw_fd();
    // smoltcp reads one frame a system call and sees its own frames too (ETH_P_ALL):
    // with the default buffer of ~200 KiB the kernel drops frames for it at a few
    // percent even on the clean wire. Root may set more than rmem_max.
    let rcvbuf: libc::c_int = RAW_RCVBUF;
    // SAFETY: an int option on a socket we own.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&rcvbuf as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let log = Rc::new(RefCell::new(WireLog::default()));
    let mut dev = Tap {
        dev: raw,
        log: log.clone(),
    };
    let now = smoltcp::time::Instant::now;
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress([
        0x02, 0, 0, 0, 0x5c, 0x01,
    ])));
    config.random_seed = u64::from(std::process::id());
    let mut iface = Interface::new(config, &mut dev, now());
    iface.update_ip_addrs(|a| {
        a.push(IpCidr::new(smol_ip(job.addr), job.prefix)).unwrap();
    });
    let mut sockets = SocketSet::new(vec![]);
    let buf = || tcp::SocketBuffer::new(vec![0u8; SMOL_BUF]);
    let h = sockets.add(tcp::Socket::new(buf(), buf()));
    {
        let s = sockets.get_mut::<tcp::Socket>(h);
        if let Some(port) = job.listen {
            s.listen(port).map_err(|e| format!("listen: {e:?}"))?;
            let _ = tx.send(Msg::Listening);
        } else {
            let to = job.connect.expect("listen or connect");
            let remote = IpEndpoint::new(smol_ip(to.ip()), to.port());
            s.connect(iface.context(), remote, 49_152 + to.port())
                .map_err(|e| format!("connect: {e:?}"))?;
        }
    }

    let (mut sent, mut received) = (0u64, 0u64);
    let mut chunk = vec![0u8; 64 << 10];
    let mut fin_seen = false;
    let mut was_connected = false;
    let mut ended = false;
    let mut reported = false;
    let mut last_status = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() > hard {
            return Err(format!(
                "gave up after {PEER_TIMEOUT:?}: {}",
                status.lock().unwrap()
            ));
        }
        iface.poll(now(), &mut dev, &mut sockets);
        let s = sockets.get_mut::<tcp::Socket>(h);
        was_connected |= s.may_send() || s.may_recv();
        let mut busy = false;
        // smoltcp's stream.
        while sent < job.send && s.can_send() {
            let n = chunk.len().min((job.send - sent) as usize);
            for (j, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern(SMOL_SEED, sent + j as u64);
            }
            let took = s.send_slice(&chunk[..n]).map_err(|e| format!("{e:?}"))?;
            if took == 0 {
                break;
            }
            sent += took as u64;
            busy = true;
        }
        // usnet's stream, checked.
        while !fin_seen && was_connected {
            match s.recv_slice(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    for (j, &b) in chunk[..n].iter().enumerate() {
                        let i = received + j as u64;
                        let p = pattern(USNET_SEED, i);
                        if b != p || i >= job.recv {
                            return Err(format!(
                                "byte {i} of {} from usnet is {b:#04x}, not {p:#04x}",
                                job.recv
                            ));
                        }
                    }
                    received += n as u64;
                    busy = true;
                }
                Err(tcp::RecvError::Finished) => {
                    if received != job.recv {
                        return Err(format!("FIN after {received} of {} bytes", job.recv));
                    }
                    fin_seen = true;
                    busy = true;
                }
                Err(tcp::RecvError::InvalidState) => break,
            }
        }
        let state = s.state();
        if was_connected && !fin_seen && state == tcp::State::Closed && received < job.recv {
            return Err(format!(
                "reset after {received} of {} bytes from usnet",
                job.recv
            ));
        }
        // smoltcp's end, once it has everything and everything of its own is
        // acknowledged (an abort discards what is unacknowledged).
        if !ended && sent == job.send && received == job.recv {
            match job.end {
                End::Fin => {
                    s.close();
                    ended = true;
                    busy = true;
                }
                End::Rst if fin_seen && s.send_queue() == 0 => {
                    s.abort();
                    ended = true;
                    busy = true;
                }
                End::Rst => {}
            }
        }
        // usnet's end as smoltcp sees it: its FIN read, or a reset (closed
        // without a FIN).
        let peer_end = if fin_seen {
            matches!(state, tcp::State::TimeWait | tcp::State::Closed).then_some(End::Fin)
        } else if ended && job.end == End::Fin && state == tcp::State::Closed {
            Some(End::Rst)
        } else {
            None
        };
        let done = match (job.end, peer_end) {
            (End::Rst, Some(e)) => ended && log.borrow().rst_out > 0 && e == End::Fin,
            (End::Fin, Some(_)) => true,
            (_, None) => false,
        };
        if done && !reported {
            reported = true;
            let _ = tx.send(Msg::Done(Ok(SmolSummary {
                sent,
                received,
                peer_end: peer_end.unwrap(),
                wire: log.borrow().clone(),
                raw_drops: packet_drops(fd),
            })));
        }
        if last_status.elapsed() > Duration::from_millis(100) {
            last_status = Instant::now();
            *status.lock().unwrap() = format!(
                "{state}, sent {sent} of {}, received {received} of {}, fin seen {fin_seen}, ended {ended}; {:?}",
                job.send,
                job.recv,
                log.borrow()
            );
        }
        if !busy {
            let delay = iface
                .poll_delay(now(), &sockets)
                .unwrap_or(smoltcp::time::Duration::from_millis(50))
                .min(smoltcp::time::Duration::from_millis(50));
            phy::wait(fd, Some(delay)).map_err(|e| format!("wait: {e}"))?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------ the conversations

struct Case {
    /// On the wire with 1 % loss each way (the RST endings run on a clean one).
    lossy: bool,
    usnet_connects: bool,
    /// Bytes usnet sends, and smoltcp.
    usnet_bytes: u64,
    smol_bytes: u64,
    usnet_end: End,
    smol_end: End,
    port: u16,
}

fn run_case(w: &Wire, v6: bool, c: &Case) {
    let (usnet_ip, smol_ip, prefix): (IpAddr, IpAddr, u8) = if v6 {
        ("fd72::1".parse().unwrap(), "fd72::2".parse().unwrap(), 64)
    } else {
        (
            "10.72.0.1".parse().unwrap(),
            "10.72.0.2".parse().unwrap(),
            24,
        )
    };
    let name = format!(
        "{} {} {}, {} KiB each way, usnet {:?}, smoltcp {:?}",
        if v6 { "IPv6" } else { "IPv4" },
        if c.lossy { "1% loss" } else { "no loss" },
        if c.usnet_connects {
            "usnet → smoltcp"
        } else {
            "smoltcp → usnet"
        },
        c.usnet_bytes >> 10,
        c.usnet_end,
        c.smol_end
    );
    let t0 = Instant::now();
    let job = SmolJob {
        ns: w.ns.clone(),
        iface: w.inner.clone(),
        addr: smol_ip,
        prefix,
        listen: None,
        connect: None,
        send: c.smol_bytes,
        recv: c.usnet_bytes,
        end: c.smol_end,
    };
    let (peer, stream) = if c.usnet_connects {
        let peer = SmolPeer::start(SmolJob {
            listen: Some(c.port),
            ..job
        });
        peer.wait_listening();
        let s = TcpStream::connect_timeout(&w.net, SocketAddr::new(smol_ip, c.port), STEP)
            .unwrap_or_else(|e| panic!("{name}: connect: {e}\n{}", peer.output()));
        (peer, s)
    } else {
        let addr = SocketAddr::new(usnet_ip, c.port);
        let l = TcpListener::bind(&w.net, addr).expect("listen");
        let peer = SmolPeer::start(SmolJob {
            connect: Some(addr),
            ..job
        });
        let s = accept_from(w, &l, smol_ip, (&name, STEP), &|| peer.output());
        (peer, s)
    };
    let info = stream.info().expect("tcp_info");
    // smoltcp offers both in every SYN (and in its SYN-ACK when usnet did).
    assert!(info.sack, "{name}: SACK not negotiated: {info:?}");
    let (snd_shift, rcv_shift) = info
        .wscale
        .unwrap_or_else(|| panic!("{name}: window scaling not negotiated: {info:?}"));
    assert_eq!(
        snd_shift,
        smol_shift(),
        "{name}: smoltcp's window shift as usnet reads it"
    );

    let output = || peer.output();
    let (info, stats) = Converse {
        name: &name,
        peer_output: &output,
        peer: "smoltcp",
        usnet_seed: USNET_SEED,
        peer_seed: SMOL_SEED,
        usnet_bytes: c.usnet_bytes,
        peer_bytes: c.smol_bytes,
        usnet_end: c.usnet_end,
        peer_end: c.smol_end,
        step: STEP,
    }
    .run(stream);

    let g = peer.finish();
    drop(peer);
    let elapsed = t0.elapsed();
    assert_eq!(g.sent, c.smol_bytes, "{name}: {g:?}");
    assert_eq!(g.received, c.usnet_bytes, "{name}: {g:?}");
    assert_eq!(
        g.peer_end, c.usnet_end,
        "{name}: usnet's end as smoltcp saw it"
    );
    // Both SYNs as they crossed the wire: what each side offered is what the other
    // uses.
    assert_eq!(
        g.wire.syn_out,
        Some((Some(smol_shift()), true)),
        "{name}: smoltcp's SYN"
    );
    assert_eq!(
        g.wire.syn_in,
        Some((Some(rcv_shift), true)),
        "{name}: usnet's SYN as smoltcp received it (usnet's receive shift)"
    );
    let info = info.expect("usnet's tcp_info");
    let st = stats.unwrap_or_default();
    if c.lossy {
        // smoltcp reports out-of-order data in SACK blocks, and usnet gets them.
        assert!(g.wire.sack_out > 0, "{name}: smoltcp sent no SACK blocks");
        assert!(
            info.sack_blocks > 0,
            "{name}: usnet received no SACK blocks"
        );
    }
    let mb_s = (c.usnet_bytes + c.smol_bytes) as f64 / elapsed.as_secs_f64() / 1e6;
    eprintln!(
        "{name}: {elapsed:.2?} ({mb_s:.0} MB/s both ways together); usnet: wscale {snd_shift}/{rcv_shift}, {} retransmits, {} fast recoveries, {} RTOs ({} lost by RACK, {} by the dupthresh, {} TLPs, {} D-SACKs in), {} SACK blocks in, {} segments smoltcp had acknowledged already; smoltcp: {} data segments, {} retransmitted, {} ACKs with SACK blocks ({} with more than one), {} RSTs out, {} in; its packet socket dropped {}",
        info.total_retransmits,
        info.fast_recoveries,
        info.rto_expiries,
        st.rack_losses,
        st.dupthresh_losses,
        st.tlp_probes,
        st.rx_dsack,
        info.sack_blocks,
        g.wire.stale_in,
        g.wire.data_out,
        g.wire.retransmits,
        g.wire.sack_out,
        g.wire.multi_sack_out,
        g.wire.rst_out,
        g.wire.rst_in,
        g.raw_drops,
    );
}

/// The conversations of one address family: both roles with FIN both ways under
/// loss, and each side's RST on a clean wire.
fn cases(bulk: u64, small: u64) -> Vec<Case> {
    let case = |lossy, usnet_connects, bytes, ends: (End, End), port| Case {
        lossy,
        usnet_connects,
        usnet_bytes: bytes,
        smol_bytes: bytes,
        usnet_end: ends.0,
        smol_end: ends.1,
        port,
    };
    use End::{Fin, Rst};
    vec![
        case(true, true, bulk, (Fin, Fin), 5201),
        case(true, false, bulk, (Fin, Fin), 5202),
        case(false, true, small, (Fin, Rst), 5203),
        case(false, false, small, (Rst, Fin), 5204),
    ]
}

/// Runs `cases` over a lossy and a clean wire (USNET_SMOLTCP_PCAP=FILE records usnet's
/// side of each in FILE.TAG).
fn run_family(tag: &str, v6: bool, cases: Vec<Case>) {
    run_on_wires(
        ("sm", tag),
        &["10.72.0.1/24", "fd72::1/64"],
        "USNET_SMOLTCP_PCAP",
        cases,
        |c| c.lossy,
        |w, c| run_case(w, v6, c),
    );
}

/// One family's conversations, taking turns with the other's.
fn family(test: &str, v6: bool) {
    require_root!();
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    run_family(if v6 { "6" } else { "4" }, v6, cases(BULK, SMALL));
    eprintln!("{test} took {:?}", t0.elapsed());
}

/// Both roles and both resets over IPv4, `BULK` each way under 1 % loss each way.
#[test]
fn smoltcp_veth_tcp_ipv4() {
    family("smoltcp_veth_tcp_ipv4", false);
}

/// The same over IPv6 (NDP instead of ARP).
#[test]
fn smoltcp_veth_tcp_ipv6() {
    family("smoltcp_veth_tcp_ipv6", true);
}
