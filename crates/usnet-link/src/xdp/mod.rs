//! The AF_XDP link (`xdp:IFNAME[@QUEUE]`): an XDP socket on one RX queue of an
//! interface whose UMEM is the stack's own packet pool, so the frame the kernel (copy
//! mode) or the NIC (zero-copy) writes is the pool buffer the stack parses, and a
//! frame the stack built leaves from the buffer it was built in.
//!
//! **Who owns a pool buffer when** (every lent buffer sits in `Umem::lent`, indexed by
//! buffer, as the `PktBuf` the pool handed out; nothing else names it meanwhile):
//! 1. the device allocates it from the pool and puts its address on the **fill ring**:
//!    lent to the kernel;
//! 2. the kernel writes a frame into it and puts it on the **RX ring**; `rx_burst`
//!    takes it out of `lent`, sets its data to the frame (offset and length from the
//!    descriptor) and hands the `PktBuf` to the stack, which owns it now;
//! 3. the stack frees it to the pool, or queues a frame in it (or any other buffer)
//!    for `tx_burst`, which puts it on the **TX ring** and into `lent` again;
//! 4. the kernel sends it and returns its address on the **completion ring**; the
//!    device takes it out of `lent` and frees it to the pool.
//!
//! `release_buffers` closes the socket first (no kernel path touches the UMEM after
//! that in copy mode) and then gives every lent buffer back; in zero-copy mode a NIC
//! may still hold posted buffers until the kernel's deferred teardown, so those stay
//! out of the pool for good rather than be reused under a DMA.
//!
//! The steering program ([`prog`]) is attached through a BPF link: it is detached when
//! the link's descriptor closes, which the kernel does when the process exits however
//! it exits (see docs/architecture.md). Promiscuous mode, needed on a real NIC for
//! frames to the stack's own MAC, is held as a membership of a packet socket, which
//! the kernel also drops with the process.
//!
//! Checksums: computed by the stack on send; verified by the stack on receive, except
//! on a veth, whose frames carry the partial checksums the sending kernel left (they
//! never crossed a wire: they are marked checked, as Linux itself treats them).
//!
//! Limits: one buffer per frame (no XDP multi-buffer): the interface MTU must leave
//! room for the frame behind XDP's 256-byte headroom (1774 bytes of IP with 2048-byte
//! buffers, 3822 with 4096); one
//! usnet stack per interface (the program is exclusive).

pub mod bpf;
pub mod prog;
pub mod ring;

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{Offload, PacketPool, PktBuf};

use crate::error::LinkError;
use crate::sys::{self, cvt, getsockopt, setsockopt, EventFd};
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

use ring::Ring;

/// `XDP_PACKET_HEADROOM`: the kernel puts a received frame this far into its chunk.
pub const XDP_HEADROOM: usize = 256;
pub const XDP_MAX_BURST: usize = 64;
/// Largest ring (fill, completion, RX, TX) the device asks for.
const MAX_RING: u32 = 2048;
/// Smallest ring: a pool needs four times this many buffers.
const MIN_RING: u32 = 64;
/// How long a bind waits for a queue a closed socket still holds.
const XSK_QUEUE_RELEASE_WAIT: Duration = Duration::from_secs(2);
/// Ethernet header plus one VLAN tag.
const L2_MAX: usize = 18;

/// How to bind and attach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// Native XDP if the driver has it (else generic); zero-copy if the driver can,
    /// else copy.
    #[default]
    Auto,
    /// Native (else generic) XDP, copy mode.
    Copy,
    /// Native XDP and zero-copy, or an error.
    ZeroCopy,
    /// Generic (SKB) XDP, copy mode: works on any interface.
    Generic,
}

impl std::str::FromStr for XdpMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(XdpMode::Auto),
            "copy" => Ok(XdpMode::Copy),
            "zerocopy" | "zero-copy" => Ok(XdpMode::ZeroCopy),
            "generic" | "skb" => Ok(XdpMode::Generic),
            _ => Err(format!(
                "unknown xdp mode '{s}': expected auto, copy, zerocopy or generic"
            )),
        }
    }
}

/// What the steering program needs to know about the stack, and how to run.
#[derive(Debug, Clone, Default)]
pub struct XdpOptions {
    /// The stack's MAC (frames to it are the stack's).
    pub mac: [u8; 6],
    /// The stack's IPv4 addresses (ARP requests for them are the stack's).
    pub ipv4: Vec<Ipv4Addr>,
    /// The stack's IPv6 addresses (neighbour solicitations for them, and for the
    /// link-local address derived from `mac`, are the stack's).
    pub ipv6: Vec<Ipv6Addr>,
    pub mode: XdpMode,
}

/// One mmap'd ring area.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this struct alone; moving it moves that ownership.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; the rings that point into
        // it are dropped with the same `Umem`, before it (field order).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The rings and the lent buffers, once the pool is bound.
struct Umem {
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    // After the rings, which point into them.
    _maps: Vec<Mapping>,
    /// Start of the pool's region (to check every call passes the same pool).
    region_addr: usize,
    buf_size: usize,
    /// The buffers the kernel owns now (fill, RX, TX or completion ring), by index.
    lent: Vec<Option<PktBuf>>,
    lent_count: usize,
    zerocopy: bool,
    /// Refills that found the pool empty.
    fill_short: u64,
    /// Frames copied into a fresh buffer before sending (a chain, or a buffer already
    /// in flight).
    tx_copied: u64,
    /// Impossible ring indices seen.
    broken: u64,
    /// sendto/recvfrom wake-ups.
    kicks: u64,
}

impl Umem {
    fn lend(&mut self, b: PktBuf) -> u64 {
        let i = b.index() as usize;
        debug_assert!(self.lent[i].is_none());
        self.lent[i] = Some(b);
        self.lent_count += 1;
        (i * self.buf_size) as u64
    }

    /// The buffer behind a kernel address (fill/completion: the chunk; RX/TX: inside
    /// it), if we lent it; with the offset inside the chunk.
    fn take(&mut self, addr: u64) -> Option<(PktBuf, usize)> {
        let i = (addr / self.buf_size as u64) as usize;
        let off = (addr % self.buf_size as u64) as usize;
        let b = self.lent.get_mut(i)?.take()?;
        self.lent_count -= 1;
        Some((b, off))
    }

    /// Frees every buffer the kernel has sent.
    fn reap(&mut self, pool: &mut PacketPool) {
        let n = match self.comp.available(u32::MAX) {
            Ok(n) => n,
            Err(_) => {
                self.broken += 1;
                return;
            }
        };
        for k in 0..n {
            match self.take(self.comp.peek(k)) {
                Some((b, _)) => pool.free(b),
                // Not a buffer we lent: nothing to free.
                None => self.broken += 1,
            }
        }
        if n > 0 {
            self.comp.release(n);
        }
    }
}

pub struct XdpDevice {
    label: String,
    ifname: String,
    ifindex: u32,
    queue: u32,
    mtu: usize,
    if_mtu: usize,
    /// The interface is a veth: its frames come from another kernel stack in this
    /// machine's memory, never from a wire (see `trust_csum` in `open`).
    veth: bool,
    mode: XdpMode,
    native: bool,
    /// The BPF link holding the program on the interface: first to go on drop (the
    /// program leaves the interface with the last queue's device).
    link: Option<Arc<OwnedFd>>,
    /// The XSKMAP and the program, shared by the devices of every queue opened
    /// together ([`XdpDevice::open_queues`]).
    map: Arc<OwnedFd>,
    _prog: Arc<OwnedFd>,
    umem: Option<Umem>,
    /// The XDP socket; shared with wait plans. `None` after `release_buffers`.
    sock: Option<Arc<OwnedFd>>,
    ev: Arc<EventFd>,
    /// A packet socket whose membership keeps the interface promiscuous.
    _promisc: Option<Arc<OwnedFd>>,
    down: bool,
    stats: DeviceStats,
}

impl std::fmt::Debug for XdpDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpDevice")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("native", &self.native)
            .field("zerocopy", &self.umem.as_ref().map(|u| u.zerocopy))
            .finish()
    }
}

/// Number of RX queues of an interface (from sysfs), if it can be read.
fn rx_queues(ifname: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{ifname}/queues")).ok()?;
    let n = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    Some(n as u32)
}

/// A socket that holds the interface in promiscuous mode while it is open, so a NIC
/// accepts frames to the stack's MAC. It receives nothing (protocol 0).
fn promisc_holder(ifindex: u32) -> io::Result<OwnedFd> {
    // SAFETY: socket() with constant arguments returns a new fd or -1.
    let fd = cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex as libc::c_int,
        mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
        mr_alen: 0,
        mr_address: [0; 8],
    };
    setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)?;
    Ok(fd)
}

fn needs_root(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

impl XdpDevice {
    /// Opens an XDP socket for RX queue `queue` of `ifname` and attaches the steering
    /// program. The pool is bound later ([`Device::bind_pool`], or the first burst).
    /// `mtu` may lower the MTU the stack uses below the interface's.
    pub fn open(
        ifname: &str,
        queue: u32,
        mtu: Option<usize>,
        opts: &XdpOptions,
    ) -> Result<XdpDevice, LinkError> {
        let mut v = XdpDevice::open_at(ifname, &[queue], mtu, opts)?;
        Ok(v.remove(0))
    }

    /// Opens an XDP socket on each of RX queues `0..n` of `ifname`, one device per
    /// queue (the shards of one stack), with one steering program and one XSKMAP
    /// for all of them: a frame goes to the socket of the queue it arrived on.
    pub fn open_queues(
        ifname: &str,
        n: usize,
        mtu: Option<usize>,
        opts: &XdpOptions,
    ) -> Result<Vec<XdpDevice>, LinkError> {
        let queues: Vec<u32> = (0..n as u32).collect();
        XdpDevice::open_at(ifname, &queues, mtu, opts)
    }

    fn open_at(
        ifname: &str,
        queues: &[u32],
        mtu: Option<usize>,
        opts: &XdpOptions,
    ) -> Result<Vec<XdpDevice>, LinkError> {
        let label = |queue: u32| {
            if queue == 0 {
                format!("xdp:{ifname}")
            } else {
                format!("xdp:{ifname}@{queue}")
            }
        };
        let top = queues.iter().copied().max().unwrap_or(0);
        let spec = label(queues.first().copied().unwrap_or(0));
        let fail = |why: String| LinkError::Xdp(format!("{spec}: {why}"));
        let ifindex = sys::if_index(ifname)?;
        if let Some(n) = rx_queues(ifname) {
            if top >= n {
                return Err(fail(format!(
                    "{ifname} has {n} RX queue{} (0..{}): pick one of them with @QUEUE",
                    if n == 1 { "" } else { "s" },
                    n.saturating_sub(1)
                )));
            }
        }
        let if_mtu = sys::if_mtu(ifname)
            .map_err(|e| LinkError::io(format!("{spec}: cannot read the MTU"), e))?;
        let mtu = match mtu {
            Some(m) if !(68..=if_mtu).contains(&m) => {
                return Err(LinkError::BadMtu {
                    mtu: m,
                    min: 68,
                    max: if_mtu,
                })
            }
            Some(m) => m,
            None => if_mtu,
        };
        if opts.mac == [0; 6] || opts.mac[0] & 1 != 0 {
            return Err(fail(
                "the steering program needs the stack's unicast MAC (LinkOptions::mac)".into(),
            ));
        }
        let map = bpf::create_xskmap(top + 1).map_err(|e| {
            if needs_root(&e) {
                LinkError::NeedsRoot { spec: spec.clone() }
            } else {
                LinkError::io(format!("{spec}: cannot create the XSKMAP"), e)
            }
        })?;
        let steering = prog::Steering {
            mac: opts.mac,
            ipv4: opts.ipv4.clone(),
            ipv6: opts.ipv6.clone(),
            fallback: prog::XDP_PASS,
        };
        let insns = prog::steering_program(&steering, map.as_raw_fd()).ok_or_else(|| {
            fail(format!(
                "too many addresses for the steering program (at most {} per IP version)",
                prog::MAX_ADDRS
            ))
        })?;
        let prog_fd = bpf::load_xdp(&insns, "usnet_steer").map_err(|(e, log)| {
            let last = log
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            fail(format!(
                "the kernel refused the steering program: {e} ({last})"
            ))
        })?;
        let (link, native) =
            attach(&prog_fd, ifindex, opts.mode).map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) | Some(libc::EEXIST) => fail(format!(
                    "{ifname} already has an XDP program: another usnet stack runs on it, \
                     or a tool attached one (`ip link set dev {ifname} xdp off` removes that)"
                )),
                _ if needs_root(&e) => LinkError::NeedsRoot { spec: spec.clone() },
                _ => LinkError::io(format!("{spec}: cannot attach the XDP program"), e),
            })?;
        let promisc = promisc_holder(ifindex)
            .map_err(|e| LinkError::io(format!("{spec}: cannot enter promiscuous mode"), e))?;
        // A veth hands XDP the bytes the peer's stack wrote, and that stack leaves
        // TCP/UDP checksums partial (veth offers checksum offload, and Linux's own
        // veth receive path trusts such frames, CHECKSUM_PARTIAL). Received frames on
        // a veth are therefore marked as checked, as the shm link's are: they crossed
        // memory, not a wire. On every other interface the stack verifies checksums.
        let veth = sys::if_driver(ifname).is_ok_and(|d| d == "veth");
        let (map, prog_fd, link, promisc) = (
            Arc::new(map),
            Arc::new(prog_fd),
            Arc::new(link),
            Arc::new(promisc),
        );
        let mut out = Vec::with_capacity(queues.len());
        for &queue in queues {
            let spec = label(queue);
            // SAFETY: socket() with constant arguments returns a new fd or -1.
            let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return Err(if needs_root(&e) {
                    LinkError::NeedsRoot { spec }
                } else if e.raw_os_error() == Some(libc::EAFNOSUPPORT) {
                    fail("this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS)".into())
                } else {
                    LinkError::io(format!("{spec}: cannot open an XDP socket"), e)
                });
            }
            // SAFETY: fd was just created and is owned by nothing else.
            let sock = unsafe { OwnedFd::from_raw_fd(fd) };
            let ev =
                Arc::new(EventFd::new().map_err(|e| LinkError::io(format!("{spec}: eventfd"), e))?);
            out.push(XdpDevice {
                label: spec,
                ifname: ifname.to_string(),
                ifindex,
                queue,
                mtu,
                if_mtu,
                veth,
                mode: opts.mode,
                native,
                link: Some(link.clone()),
                map: map.clone(),
                _prog: prog_fd.clone(),
                umem: None,
                sock: Some(Arc::new(sock)),
                ev,
                _promisc: Some(promisc.clone()),
                down: false,
                stats: DeviceStats::default(),
            });
        }
        Ok(out)
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Whether the program runs in the driver (native XDP) rather than generic XDP.
    pub fn native(&self) -> bool {
        self.native
    }

    /// Whether the socket runs zero-copy (`None` before the pool is bound).
    pub fn zerocopy(&self) -> Option<bool> {
        self.umem.as_ref().map(|u| u.zerocopy)
    }

    /// Buffers the kernel holds now (fill, RX, TX and completion rings).
    pub fn lent(&self) -> usize {
        self.umem.as_ref().map_or(0, |u| u.lent_count)
    }

    fn sock(&self) -> io::Result<&OwnedFd> {
        self.sock
            .as_deref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "xdp device closed"))
    }

    fn bind(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        let sock = self.sock()?;
        let bad = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {why}", self.label),
            )
        };
        let bs = pool.buf_size();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        if !bs.is_power_of_two() || bs > page {
            return Err(bad(format!(
                "pool buffers of {bs} bytes cannot be UMEM chunks: use --buf-size 2048 or 4096"
            )));
        }
        if self.if_mtu + L2_MAX + XDP_HEADROOM > bs {
            return Err(bad(format!(
                "MTU {} of {} does not fit one {bs}-byte buffer behind XDP's {XDP_HEADROOM}-byte \
                 headroom (at most {}): lower it (`ip link set dev {} mtu 1500`){}",
                self.if_mtu,
                self.ifname,
                bs - L2_MAX - XDP_HEADROOM,
                self.ifname,
                if bs < page {
                    " or use --buf-size 4096"
                } else {
                    ""
                }
            )));
        }
        let quarter = pool.count() / 4;
        if quarter < MIN_RING {
            return Err(bad(format!(
                "a pool of {} buffers is too small: the rings need at least {}",
                pool.count(),
                MIN_RING * 4
            )));
        }
        let ring = (1u32 << (31 - quarter.leading_zeros())).min(MAX_RING);
        let (addr, len) = pool.region_addr();
        let reg = libc::xdp_umem_reg {
            addr: addr as u64,
            len: len as u64,
            chunk_size: bs as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(sock, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: cannot register the pool as UMEM: {e}", self.label),
            )
        })?;
        for opt in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(sock, libc::SOL_XDP, opt, &ring)?;
        }
        let off: libc::xdp_mmap_offsets = getsockopt_offsets(sock)?;
        let map = |pgoff: u64, desc: u64, entry: usize| -> io::Result<Mapping> {
            let len = desc as usize + ring as usize * entry;
            // SAFETY: maps a ring the kernel allocated for this socket at its page
            // offset, with the length it implies; the result is checked.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    sock.as_raw_fd(),
                    pgoff as libc::off_t,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            Ok(Mapping {
                base: base.cast(),
                len,
            })
        };
        let desc = std::mem::size_of::<libc::xdp_desc>();
        let m_fill = map(libc::XDP_UMEM_PGOFF_FILL_RING, off.fr.desc, 8)?;
        let m_comp = map(libc::XDP_UMEM_PGOFF_COMPLETION_RING, off.cr.desc, 8)?;
        let m_rx = map(libc::XDP_PGOFF_RX_RING as u64, off.rx.desc, desc)?;
        let m_tx = map(libc::XDP_PGOFF_TX_RING as u64, off.tx.desc, desc)?;
        let o = |x: u64| x as usize;
        // SAFETY: each mapping holds the ring the offsets describe (producer,
        // consumer, flags words and `ring` entries, as the kernel reported them); the
        // mappings live in the same `Umem` as the rings and are dropped after them.
        let (fill, comp, rx, tx) = unsafe {
            (
                Ring::<u64>::new(
                    m_fill.base,
                    o(off.fr.producer),
                    o(off.fr.consumer),
                    o(off.fr.flags),
                    o(off.fr.desc),
                    ring,
                )
                .as_producer(),
                Ring::<u64>::new(
                    m_comp.base,
                    o(off.cr.producer),
                    o(off.cr.consumer),
                    o(off.cr.flags),
                    o(off.cr.desc),
                    ring,
                ),
                Ring::<libc::xdp_desc>::new(
                    m_rx.base,
                    o(off.rx.producer),
                    o(off.rx.consumer),
                    o(off.rx.flags),
                    o(off.rx.desc),
                    ring,
                ),
                Ring::<libc::xdp_desc>::new(
                    m_tx.base,
                    o(off.tx.producer),
                    o(off.tx.consumer),
                    o(off.tx.flags),
                    o(off.tx.desc),
                    ring,
                )
                .as_producer(),
            )
        };
        let mut umem = Umem {
            fill,
            comp,
            rx,
            tx,
            _maps: vec![m_fill, m_comp, m_rx, m_tx],
            region_addr: addr,
            buf_size: bs,
            lent: (0..pool.count()).map(|_| None).collect(),
            lent_count: 0,
            zerocopy: false,
            fill_short: 0,
            tx_copied: 0,
            broken: 0,
            kicks: 0,
        };
        // Lend the kernel a full fill ring before it can receive.
        refill(&mut umem, pool);
        let copy_flag = match self.mode {
            XdpMode::Copy | XdpMode::Generic => libc::XDP_COPY,
            XdpMode::ZeroCopy => libc::XDP_ZEROCOPY,
            // Neither: the kernel tries zero-copy and falls back to copy itself.
            XdpMode::Auto => 0,
        };
        let sxdp = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_USE_NEED_WAKEUP | copy_flag,
            sxdp_ifindex: self.ifindex,
            sxdp_queue_id: self.queue,
            sxdp_shared_umem_fd: 0,
        };
        // A socket on this queue closed a moment ago may still hold it: the kernel
        // lets go of a queue after the close returns (`xp_release_deferred`), so a
        // server restarted at once would find it taken. Busy is retried for a while.
        let busy_until = std::time::Instant::now() + XSK_QUEUE_RELEASE_WAIT;
        let r = loop {
            // SAFETY: binds to a valid sockaddr_xdp of the stated size.
            let r = cvt(unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    (&sxdp as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            });
            match &r {
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && std::time::Instant::now() < busy_until =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break r,
            }
        };
        if let Err(e) = r {
            // Nothing was lent yet as far as the kernel is concerned: take them back.
            give_back(&mut umem, pool);
            let why = match (e.raw_os_error(), self.mode) {
                (Some(libc::EBUSY), _) => format!(
                    "queue {} of {} is taken by another AF_XDP socket",
                    self.queue, self.ifname
                ),
                (Some(libc::EOPNOTSUPP) | Some(libc::EINVAL), XdpMode::ZeroCopy) => format!(
                    "the driver of {} cannot do zero-copy: use --xdp-mode copy or auto",
                    self.ifname
                ),
                _ => format!("cannot bind the XDP socket: {e}"),
            };
            return Err(io::Error::new(e.kind(), format!("{}: {why}", self.label)));
        }
        let opts: XdpOpts = getsockopt(sock, libc::SOL_XDP, libc::XDP_OPTIONS)?;
        umem.zerocopy = opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0;
        bpf::map_update_u32(&self.map, self.queue, sock.as_raw_fd() as u32).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: cannot add the socket to the XSKMAP: {e}", self.label),
            )
        })?;
        self.umem = Some(umem);
        Ok(())
    }

    /// Binds on first use, and checks every later call passes the same pool.
    fn ready(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        match &self.umem {
            Some(u) if u.region_addr == pool.region_addr().0 => Ok(()),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: called with another pool than the one bound as UMEM",
                    self.label
                ),
            )),
            None => self.bind(pool),
        }
    }

    /// Asks the kernel to send what the TX ring holds (copy mode sends in this call;
    /// zero-copy drivers are woken). Loops while the kernel says "more" (a copy-mode
    /// call sends at most a batch), reaping completions in between.
    fn kick_tx(&mut self, pool: &mut PacketPool) {
        let Some(sock) = self.sock.as_ref().map(|s| s.as_raw_fd()) else {
            return;
        };
        let u = self.umem.as_mut().expect("bound");
        for _ in 0..16 {
            if u.tx.outstanding() == 0 {
                break;
            }
            u.kicks += 1;
            // SAFETY: sendto with no data on our own socket: only a wake-up.
            let r = unsafe {
                libc::sendto(
                    sock,
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                break;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    // More than one batch, or the completion ring is full.
                    u.reap(pool);
                }
                Some(libc::ENETDOWN) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
                    self.down = true;
                    break;
                }
                // EBUSY (a frame the device dropped), ENOBUFS: try again next turn.
                _ => {
                    self.stats.tx_full += 1;
                    break;
                }
            }
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct XdpOpts {
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct XdpStats {
    rx_dropped: u64,
    rx_invalid_descs: u64,
    tx_invalid_descs: u64,
    rx_ring_full: u64,
    rx_fill_ring_empty_descs: u64,
    tx_ring_empty_descs: u64,
}

fn getsockopt_offsets(sock: &OwnedFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: xdp_mmap_offsets is plain old data; all-zero is valid.
    let mut v: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live `v`.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut v as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    })?;
    if len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel too old: XDP rings without a flags word (need_wakeup needs Linux 5.4)",
        ));
    }
    Ok(v)
}

/// Attaches natively, else generically (as `mode` allows). Returns the link and
/// whether it is native.
fn attach(prog: &OwnedFd, ifindex: u32, mode: XdpMode) -> io::Result<(OwnedFd, bool)> {
    if mode != XdpMode::Generic {
        match bpf::link_xdp(prog, ifindex, bpf::XDP_FLAGS_DRV_MODE) {
            Ok(l) => return Ok((l, true)),
            Err(e)
                if mode == XdpMode::ZeroCopy
                    || matches!(
                        e.raw_os_error(),
                        Some(libc::EBUSY | libc::EEXIST | libc::EPERM | libc::EACCES)
                    ) =>
            {
                return Err(e)
            }
            Err(_) => {}
        }
    }
    bpf::link_xdp(prog, ifindex, bpf::XDP_FLAGS_SKB_MODE).map(|l| (l, false))
}

/// Fills the fill ring with fresh pool buffers.
fn refill(u: &mut Umem, pool: &mut PacketPool) -> u32 {
    let room = u.fill.free(u.fill.size());
    let mut n = 0;
    while n < room {
        let Some(b) = pool.alloc() else {
            u.fill_short += 1;
            break;
        };
        let addr = u.lend(b);
        u.fill.push(addr);
        n += 1;
    }
    if n > 0 {
        u.fill.submit();
    }
    n
}

/// Takes back every lent buffer (only when the kernel can no longer touch them).
fn give_back(u: &mut Umem, pool: &mut PacketPool) {
    for slot in u.lent.iter_mut() {
        if let Some(b) = slot.take() {
            pool.free(b);
        }
    }
    u.lent_count = 0;
}

impl Device for XdpDevice {
    fn name(&self) -> &str {
        &self.label
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            rx_csum_offload: self.veth,
            tx_csum_offload: false,
            tso: false,
            max_burst: XDP_MAX_BURST,
        }
    }

    fn bind_pool(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        self.ready(pool)
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        self.ready(pool)?;
        let u = self.umem.as_mut().expect("bound");
        u.reap(pool);
        if u.tx.outstanding() > 0 {
            // Frames a previous kick left in the TX ring.
            self.kick_tx(pool);
        }
        let u = self.umem.as_mut().expect("bound");
        let n = match u.rx.available(max.min(u32::MAX as usize) as u32) {
            Ok(n) => n,
            Err(_) => {
                u.broken += 1;
                self.stats.rx_errors += 1;
                0
            }
        };
        let mut got = 0;
        for k in 0..n {
            let d = u.rx.peek(k);
            let Some((b, off)) = u.take(d.addr) else {
                // Not a buffer we lent: nothing to take.
                self.stats.rx_errors += 1;
                continue;
            };
            let len = d.len as usize;
            if d.options & libc::XDP_PKT_CONTD != 0
                || len < 14
                || pool.set_data(&b, off, len).is_none()
            {
                // A multi-buffer piece (never asked for) or a bad length.
                self.stats.rx_errors += 1;
                pool.free(b);
                continue;
            }
            pool.set_offload(
                &b,
                Offload {
                    csum_valid: self.veth,
                    ..Offload::default()
                },
            );
            out.push(b);
            got += 1;
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += len as u64;
        }
        if n > 0 {
            u.rx.release(n);
        }
        refill(u, pool);
        if u.zerocopy && u.fill.needs_wakeup() {
            if let Some(sock) = &self.sock {
                u.kicks += 1;
                // SAFETY: recvfrom with no buffer on our own socket: only a wake-up.
                unsafe {
                    libc::recvfrom(
                        sock.as_raw_fd(),
                        std::ptr::null_mut(),
                        0,
                        libc::MSG_DONTWAIT,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                };
            }
        }
        Ok(got)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        self.ready(pool)?;
        let max_frame = self.mtu + L2_MAX;
        let u = self.umem.as_mut().expect("bound");
        u.reap(pool);
        let room = u.tx.free(frames.len().min(u32::MAX as usize) as u32);
        let mut sent = 0u32;
        while sent < room {
            let Some(f) = frames.front() else { break };
            let len = pool.chain_len(f);
            if !(14..=max_frame).contains(&len) {
                let f = frames.pop_front().expect("looked at it");
                pool.free(f);
                self.stats.tx_dropped += 1;
                continue;
            }
            let in_place = pool.is_single(f) && u.lent[f.index() as usize].is_none();
            let b = if in_place {
                frames.pop_front().expect("looked at it")
            } else {
                // A chain, or a second reference to a buffer already in flight: copy
                // it into a fresh buffer.
                let Some(c) = pool.alloc() else {
                    break; // the pool is dry: retry next turn
                };
                let f = frames.pop_front().expect("looked at it");
                if pool.tailroom(&c) < len {
                    pool.free(c);
                    pool.free(f);
                    self.stats.tx_dropped += 1;
                    continue;
                }
                let mut tmp = [0u8; 256];
                let mut done = 0;
                while done < len {
                    let k = pool.read_chain(&f, done, &mut tmp);
                    if k == 0 {
                        break;
                    }
                    pool.append(&c, k)
                        .expect("tailroom checked")
                        .copy_from_slice(&tmp[..k]);
                    done += k;
                }
                pool.free(f);
                u.tx_copied += 1;
                c
            };
            let addr = pool.region_offset(&b) + pool.headroom_of(&b);
            let dlen = pool.len(&b);
            u.lend(b);
            u.tx.push(libc::xdp_desc {
                addr: addr as u64,
                len: dlen as u32,
                options: 0,
            });
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += dlen as u64;
        }
        if sent > 0 {
            u.tx.submit();
        }
        if !frames.is_empty() {
            self.stats.tx_full += 1;
        }
        let u = self.umem.as_mut().expect("bound");
        if u.tx.outstanding() > 0 && (u.tx.needs_wakeup() || !u.zerocopy) {
            self.kick_tx(pool);
        }
        Ok(sent as usize)
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        let Some(sock) = self.sock.clone() else {
            return crate::WaitPlan::ready();
        };
        match &self.umem {
            // Not bound yet: the next turn binds.
            None => crate::WaitPlan {
                within: Some(Duration::from_millis(1)),
                ..crate::WaitPlan::fds(sock, Some(self.ev.clone()))
            },
            Some(u) if u.rx.has_entries() => crate::WaitPlan::ready(),
            // Readable when the RX ring is not empty; a poll also sends what the TX
            // ring holds and wakes a zero-copy driver that asked for it.
            Some(_) => crate::WaitPlan::fds(sock, Some(self.ev.clone())),
        }
    }

    fn rx_ready(&mut self) -> bool {
        self.umem.as_ref().is_some_and(|u| u.rx.has_entries())
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.rx_ready() {
            return Ok(());
        }
        let sock = self.sock()?.as_fd();
        sys::poll_two(sock, &self.ev, timeout).map(|_| ())
    }

    fn waker(&self) -> Waker {
        self.ev.clone()
    }

    fn link_state(&self) -> LinkState {
        if self.down {
            LinkState::Down
        } else {
            LinkState::Up
        }
    }

    fn stats(&self) -> DeviceStats {
        // The kernel's counts are cumulative: frames it dropped for a full RX ring
        // or for no fill-ring buffer.
        let ring_drops = self
            .sock
            .as_ref()
            .and_then(|s| getsockopt::<XdpStats>(s, libc::SOL_XDP, libc::XDP_STATISTICS).ok())
            .map_or(0, |st| st.rx_dropped + st.rx_ring_full);
        DeviceStats {
            rx_ring_drops: ring_drops,
            ..self.stats
        }
    }

    fn info(&self) -> Option<String> {
        let attach = if self.native {
            "native XDP"
        } else {
            "generic XDP"
        };
        let Some(u) = &self.umem else {
            return Some(format!(
                "{attach}, queue {}, pool not bound yet",
                self.queue
            ));
        };
        let mut s = format!(
            "{attach}, {}, queue {}, rings of {}, {} buffers lent to the kernel",
            if u.zerocopy { "zero-copy" } else { "copy mode" },
            self.queue,
            u.fill.size(),
            u.lent_count,
        );
        if let Some(sock) = &self.sock {
            if let Ok(st) = getsockopt::<XdpStats>(sock, libc::SOL_XDP, libc::XDP_STATISTICS) {
                s += &format!(
                    "; kernel: rx_dropped {}, rx_ring_full {}, fill_ring_empty {}, invalid rx/tx {}/{}",
                    st.rx_dropped,
                    st.rx_ring_full,
                    st.rx_fill_ring_empty_descs,
                    st.rx_invalid_descs,
                    st.tx_invalid_descs
                );
            }
        }
        s += &format!(
            "; fill_short {}, tx_copied {}, kicks {}, broken_ring {}",
            u.fill_short, u.tx_copied, u.kicks, u.broken
        );
        Some(s)
    }

    fn release_buffers(&mut self, pool: &mut PacketPool) {
        let Some(mut u) = self.umem.take() else {
            return;
        };
        // Stop the kernel using the UMEM: no more redirects, no program, no socket.
        let _ = bpf::map_delete_u32(&self.map, self.queue);
        self.link = None;
        let closed = match self.sock.take() {
            // Closing unbinds the socket and waits for the receive path to let go
            // (synchronize_net in xsk_release).
            Some(s) => Arc::try_unwrap(s).is_ok(),
            None => false,
        };
        if closed && !u.zerocopy && u.region_addr == pool.region_addr().0 {
            give_back(&mut u, pool);
        }
        // Otherwise (zero-copy, or a wait plan still holds the socket) the lent
        // buffers stay out of the pool: a device may still write into them.
    }
}

#[cfg(test)]
mod tests;
