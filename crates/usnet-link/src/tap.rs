//! A TAP interface (`/dev/net/tun`) with virtio-net headers, so checksum offload and
//! segmentation metadata travel with each frame between usnet and the Linux kernel.
//!
//! The interface is created if missing, brought up with the requested MTU and the
//! configured host addresses, and disappears when the device is dropped (it is not made
//! persistent).

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{GsoKind, Offload, PacketPool, PktBuf};

use crate::chain_read::{ChainRead, MAX_IOV};
use crate::error::LinkError;
use crate::sys::{self, cvt, EventFd};
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

/// Size of the virtio-net header we ask for (`virtio_net_hdr_mrg_rxbuf`).
pub const VNET_HDR_LEN: usize = 12;
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
pub const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;
pub const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
pub const VIRTIO_NET_HDR_GSO_UDP: u8 = 3;
pub const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
pub const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
pub const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;
pub const TAP_MIN_MTU: usize = 68;
/// Largest MTU Linux allows on a TAP (65535 minus the Ethernet header).
pub const TAP_MAX_MTU: usize = 65521;
pub const TAP_MAX_BURST: usize = 64;
/// Largest frame the kernel may hand us (a GSO super-frame).
const MAX_READ: usize = 65536 + 256;

#[derive(Debug, Clone, Default)]
pub struct TapConfig {
    /// MTU for both sides (default: keep the interface's, 1500 for a new one).
    pub mtu: Option<usize>,
    /// CIDRs to give the Linux side, e.g. "10.20.0.1/24", "fd00:20::1/64".
    pub host_addrs: Vec<String>,
    /// Accept TCP segmentation offload: the kernel may hand us TSO super-frames and
    /// `caps().tso` is advertised. Off by default.
    pub tso: bool,
}

/// The 12-byte virtio-net header, in native byte order (legacy TUN convention).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> VnetHdr {
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    pub fn emit(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    /// The header for transmitting a frame with this offload metadata.
    pub fn from_offload(o: &Offload) -> VnetHdr {
        let mut h = VnetHdr::default();
        if o.needs_csum {
            h.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
            h.csum_start = o.csum_start;
            h.csum_offset = o.csum_offset;
        }
        if o.gso_size != 0 {
            h.gso_type = match o.gso_kind {
                GsoKind::None => VIRTIO_NET_HDR_GSO_NONE,
                GsoKind::TcpV4 => VIRTIO_NET_HDR_GSO_TCPV4,
                GsoKind::TcpV6 => VIRTIO_NET_HDR_GSO_TCPV6,
                GsoKind::Udp => VIRTIO_NET_HDR_GSO_UDP_L4,
            };
            if h.gso_type != VIRTIO_NET_HDR_GSO_NONE {
                h.gso_size = o.gso_size;
                h.hdr_len = o.hdr_len;
            }
        }
        h
    }

    /// Offload metadata of a received frame; `None` for a GSO type we do not know.
    ///
    /// NEEDS_CSUM (the kernel left the checksum partial: the field holds only the
    /// pseudo-header sum) sets `csum_valid` *and* `needs_csum` with the location, so the
    /// stack does not verify it and a forwarder that sends the frame on gets the checksum
    /// finished by its device.
    pub fn to_offload(&self) -> Option<Offload> {
        let mut o = Offload::default();
        if self.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
            o.csum_valid = true;
            o.needs_csum = true;
            o.csum_start = self.csum_start;
            o.csum_offset = self.csum_offset;
        }
        if self.flags & VIRTIO_NET_HDR_F_DATA_VALID != 0 {
            o.csum_valid = true;
        }
        let kind = match self.gso_type & !VIRTIO_NET_HDR_GSO_ECN {
            VIRTIO_NET_HDR_GSO_NONE => GsoKind::None,
            VIRTIO_NET_HDR_GSO_TCPV4 => GsoKind::TcpV4,
            VIRTIO_NET_HDR_GSO_TCPV6 => GsoKind::TcpV6,
            VIRTIO_NET_HDR_GSO_UDP | VIRTIO_NET_HDR_GSO_UDP_L4 => GsoKind::Udp,
            _ => return None,
        };
        if kind != GsoKind::None {
            o.gso_kind = kind;
            o.gso_size = self.gso_size;
            o.hdr_len = self.hdr_len;
        }
        Some(o)
    }
}

pub struct TapDevice {
    label: String,
    ifname: String,
    /// Shared with wait plans, so a loop may sleep on it without the device.
    fd: Arc<OwnedFd>,
    ev: Arc<EventFd>,
    mtu: usize,
    tso: bool,
    /// Where a read puts a frame: a pool buffer and continuation buffers (a GSO
    /// frame from the kernel lands in a chain without a copy), kept between calls
    /// (an idle poll would otherwise take and return them every time);
    /// `release_buffers` gives them back.
    read: ChainRead,
    down: bool,
    stats: DeviceStats,
}

impl std::fmt::Debug for TapDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapDevice")
            .field("ifname", &self.ifname)
            .field("mtu", &self.mtu)
            .finish()
    }
}

fn is_link_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADFD) | Some(libc::EIO) | Some(libc::ENXIO) | Some(libc::ENODEV)
    )
}

/// `TUNSETSTEERINGEBPF` (`_IOR('T', 224, int)`).
const TUNSETSTEERINGEBPF: libc::c_ulong = 0x8004_54e0;

/// Installs the shards' steering program on a multi-queue TAP (one for all its
/// queues): the kernel then puts each frame it sends into the TAP on the queue of
/// the shard that owns it (`usnet_wire::steer::link_queue`), from a flow's first
/// frame on. The TAP keeps the program until it is replaced or the TAP goes.
fn set_steering(fd: &OwnedFd) -> Result<(), String> {
    let prog = crate::xdp::bpf::load_socket_filter(&crate::ebpf::tap_steering(), "usnet_tap_steer")
        .map_err(|(e, log)| {
            format!(
                "cannot load it: {e}{}",
                if log.is_empty() {
                    String::new()
                } else {
                    format!(": {log}")
                }
            )
        })?;
    let raw: libc::c_int = prog.as_raw_fd();
    // SAFETY: TUNSETSTEERINGEBPF reads an int (the program's fd) from the pointer,
    // which lives across the call; the TAP takes its own reference to the program.
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETSTEERINGEBPF, &raw) } < 0 {
        return Err(format!("cannot attach it: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// Opens one queue of the TAP interface `ifname` (creating it if needed) with the
/// vnet header and checksum (and with `tso`, segmentation) offloads.
fn open_queue(
    ifname: &str,
    spec: &str,
    tso: bool,
    multi_queue: bool,
) -> Result<OwnedFd, LinkError> {
    let needs_root = || LinkError::NeedsRoot {
        spec: spec.to_string(),
    };
    let path = CString::new("/dev/net/tun").expect("no NUL");
    // SAFETY: open with a valid C string and flags; returns a new fd or -1.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => needs_root(),
            _ => LinkError::io(
                format!("{spec}: cannot open /dev/net/tun (is the tun module loaded?)"),
                e,
            ),
        });
    }
    // SAFETY: fd was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = sys::ifreq(ifname);
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
    if multi_queue {
        flags |= libc::IFF_MULTI_QUEUE;
    }
    req.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF reads the name and flags from `req` (and may write the name
    // back); `req` lives across the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => needs_root(),
            Some(libc::EBUSY) => LinkError::io(
                format!("{spec}: interface is busy (another process has it open?)"),
                e,
            ),
            _ => LinkError::io(format!("{spec}: cannot create the TAP interface"), e),
        });
    }
    let hdr_len: libc::c_int = VNET_HDR_LEN as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads an int from the pointer, which lives across the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) })
        .map_err(|e| LinkError::io(format!("{spec}: cannot set the vnet header size"), e))?;
    let mut offload = libc::TUN_F_CSUM;
    if tso {
        offload |= libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
    }
    // SAFETY: TUNSETOFFLOAD takes the flags by value; no memory is passed.
    cvt(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            offload as libc::c_ulong,
        )
    })
    .map_err(|e| LinkError::io(format!("{spec}: cannot set offloads"), e))?;

    Ok(fd)
}

impl TapDevice {
    /// Creates (or attaches to) the TAP interface `ifname` and configures the Linux side.
    pub fn open(ifname: &str, cfg: &TapConfig) -> Result<TapDevice, LinkError> {
        let mut q = TapDevice::open_queues(ifname, cfg, 1)?;
        Ok(q.remove(0))
    }

    /// [`TapDevice::open`] with `n` queues (`IFF_MULTI_QUEUE` when `n` > 1), one
    /// device per queue: the shards of one stack. The kernel sends each flow to the
    /// queue that last wrote one of its frames (its flow table, learned from our
    /// writes), and a new flow to a queue by its hash, so after a shard's first
    /// reply the flow's frames reach that shard.
    pub fn open_queues(
        ifname: &str,
        cfg: &TapConfig,
        n: usize,
    ) -> Result<Vec<TapDevice>, LinkError> {
        sys::check_ifname(ifname)?;
        if let Some(mtu) = cfg.mtu {
            if !(TAP_MIN_MTU..=TAP_MAX_MTU).contains(&mtu) {
                return Err(LinkError::BadMtu {
                    mtu,
                    min: TAP_MIN_MTU,
                    max: TAP_MAX_MTU,
                });
            }
        }
        let spec = format!("tap:{ifname}");
        let fds = (0..n.max(1))
            .map(|_| open_queue(ifname, &spec, cfg.tso, n > 1))
            .collect::<Result<Vec<OwnedFd>, LinkError>>()?;
        if n > 1 {
            // Best effort: without the program the kernel's own hash and flow table
            // choose the queue, and the shards hand over what lands elsewhere.
            if let Err(why) = set_steering(&fds[0]) {
                eprintln!(
                    "usnet: {spec}: no steering program ({why}): a flow's first frames may land on another shard and be handed over"
                );
            }
        }
        match cfg.mtu {
            Some(m) => sys::run_ip(&["link", "set", "dev", ifname, "mtu", &m.to_string(), "up"])?,
            None => sys::run_ip(&["link", "set", "dev", ifname, "up"])?,
        }
        for cidr in &cfg.host_addrs {
            let mut args = vec!["addr", "replace", cidr.as_str(), "dev", ifname];
            if cidr.contains(':') {
                args.push("nodad"); // usable at once, no duplicate address detection delay
            }
            sys::run_ip(&args)?;
        }
        let mtu = match cfg.mtu {
            Some(m) => m,
            None => sys::if_mtu(ifname)
                .map_err(|e| LinkError::io(format!("{spec}: cannot read the MTU"), e))?,
        };
        fds.into_iter()
            .map(|fd| {
                let ev = Arc::new(
                    EventFd::new().map_err(|e| LinkError::io(format!("{spec}: eventfd"), e))?,
                );
                Ok(TapDevice {
                    label: spec.clone(),
                    ifname: ifname.to_string(),
                    fd: Arc::new(fd),
                    ev,
                    mtu,
                    tso: cfg.tso,
                    read: ChainRead::new(MAX_READ),
                    down: false,
                    stats: DeviceStats::default(),
                })
            })
            .collect()
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn max_frame(&self) -> usize {
        self.mtu + 18
    }

    /// Reads and throws away one frame (when no pool buffer is free), so a full pool does
    /// not leave the descriptor readable forever. Returns false when nothing was pending.
    fn discard_one(&mut self) -> bool {
        let scratch = self.read.scratch();
        // SAFETY: reads into our own scratch buffer of the given length.
        let r = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                scratch.as_mut_ptr().cast(),
                scratch.len(),
            )
        };
        r > 0
    }
}

impl Device for TapDevice {
    fn name(&self) -> &str {
        &self.label
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            rx_csum_offload: true,
            tx_csum_offload: true,
            tso: self.tso,
            max_burst: TAP_MAX_BURST,
        }
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        // The largest frame the kernel may hand us.
        let largest = if self.tso { MAX_READ } else { self.max_frame() };
        let mut n = 0;
        while n < max {
            let Some(b) = pool.alloc() else {
                if self.discard_one() {
                    self.stats.rx_no_buffer += 1;
                    continue;
                }
                break;
            };
            let mut hdr = [0u8; VNET_HDR_LEN];
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV];
            iov[0] = libc::iovec {
                iov_base: hdr.as_mut_ptr().cast(),
                iov_len: VNET_HDR_LEN,
            };
            let cnt = 1 + self.read.iovecs(pool, &b, largest, &mut iov[1..]);
            // SAFETY: every iovec points at live, writable memory of the stated length:
            // a local header, the free space of pool buffers we hold (distinct buffers,
            // so no overlap), and our scratch.
            let r = unsafe { libc::readv(self.fd.as_raw_fd(), iov.as_ptr(), cnt as libc::c_int) };
            if r < 0 {
                pool.free(b);
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ if is_link_gone(&e) => {
                        self.down = true;
                        break;
                    }
                    _ => return Err(e),
                }
            }
            let r = r as usize;
            if r < VNET_HDR_LEN + 14 {
                pool.free(b);
                self.stats.rx_errors += 1;
                continue;
            }
            let Some(offload) = VnetHdr::parse(&hdr).to_offload() else {
                pool.free(b);
                self.stats.rx_errors += 1;
                continue;
            };
            let frame_len = r - VNET_HDR_LEN;
            if !self.read.finish(pool, &b, frame_len) {
                pool.free(b);
                self.stats.rx_no_buffer += 1;
                continue;
            }
            pool.set_offload(&b, offload);
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += frame_len as u64;
            out.push(b);
            n += 1;
        }
        Ok(n)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        let mut sent = 0;
        while let Some(f) = frames.front().map(|f| f.id()) {
            let len = pool.chain_len(f);
            let off = pool.offload(f);
            if len < 14 || (len > self.max_frame() && off.gso_size == 0) || len > MAX_READ {
                pool.free(frames.pop_front().expect("the frame looked at"));
                self.stats.tx_dropped += 1;
                continue;
            }
            let hdr = VnetHdr::from_offload(&off).emit();
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV + 1];
            iov[0] = libc::iovec {
                iov_base: hdr.as_ptr() as *mut libc::c_void,
                iov_len: VNET_HDR_LEN,
            };
            if pool.part_count(f) > MAX_IOV {
                // A frame of more than 64 parts: not something the stack produces.
                pool.free(frames.pop_front().expect("the frame looked at"));
                self.stats.tx_dropped += 1;
                continue;
            }
            let mut cnt = 1;
            for d in pool.parts(f) {
                iov[cnt] = libc::iovec {
                    iov_base: d.as_ptr() as *mut libc::c_void,
                    iov_len: d.len(),
                };
                cnt += 1;
            }
            // SAFETY: every iovec points at live bytes (the local header and the frame's
            // buffers, which stay allocated until we free them below); writev only reads.
            let r = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), cnt as libc::c_int) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        self.stats.tx_full += 1;
                        break;
                    }
                    Some(libc::EINTR) => continue,
                    _ => {
                        if is_link_gone(&e) {
                            self.down = true;
                        }
                        pool.free(frames.pop_front().expect("the frame looked at"));
                        self.stats.tx_dropped += 1;
                        continue;
                    }
                }
            }
            pool.free(frames.pop_front().expect("the frame looked at"));
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        sys::poll_two(self.fd.as_fd(), &self.ev, timeout).map(|_| ())
    }

    fn waker(&self) -> Waker {
        self.ev.clone()
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        crate::WaitPlan::fds(self.fd.clone(), Some(self.ev.clone()))
    }

    fn link_state(&self) -> LinkState {
        if self.down {
            LinkState::Down
        } else {
            LinkState::Up
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }

    fn release_buffers(&mut self, pool: &mut PacketPool) {
        self.read.release(pool);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testutil::pool;
    use std::time::Instant;

    pub(crate) const OUR_MAC: [u8; 6] = [0x02, 0, 0x5e, 0, 0x10, 0x01];

    /// A broadcast ARP request "who has `target`? tell `sender`".
    pub(crate) fn arp_request(sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&OUR_MAC);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
        f.extend_from_slice(&OUR_MAC);
        f.extend_from_slice(&sender);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target);
        f.resize(60, 0);
        f
    }

    /// Is `f` an ARP reply from `from` to us?
    pub(crate) fn is_arp_reply(f: &[u8], from: [u8; 4]) -> bool {
        f.len() >= 42
            && f[12..14] == [0x08, 0x06]
            && f[20..22] == [0, 2]
            && f[28..32] == from
            && f[32..38] == OUR_MAC
    }

    /// Sends an ARP request and waits up to 3 s for the reply.
    pub(crate) fn arp_exchange(
        dev: &mut dyn Device,
        p: &mut usnet_pool::PacketPool,
        sender: [u8; 4],
        target: [u8; 4],
    ) {
        let mut q = VecDeque::new();
        q.push_back(p.alloc_from(&arp_request(sender, target)).unwrap());
        assert_eq!(dev.tx_burst(p, &mut q).unwrap(), 1);
        let start = Instant::now();
        let mut got = Vec::new();
        let mut seen = false;
        let mut v = Vec::new();
        while !seen && start.elapsed() < Duration::from_secs(3) {
            dev.wait(Some(Duration::from_millis(100))).unwrap();
            dev.rx_burst(p, &mut got, 64).unwrap();
            for b in got.drain(..) {
                p.copy_chain(&b, &mut v);
                assert!(
                    !(v[6..12] == OUR_MAC && v[12..14] == [0x08, 0x06] && v[20..22] == [0, 1]),
                    "saw our own request"
                );
                seen |= is_arp_reply(&v, target);
                p.free(b);
            }
        }
        assert!(seen, "no ARP reply from {target:?}");
    }

    #[test]
    fn vnet_header_round_trip() {
        let o = Offload {
            needs_csum: true,
            csum_start: 34,
            csum_offset: 16,
            gso_size: 1448,
            gso_kind: GsoKind::TcpV4,
            hdr_len: 66,
            ..Default::default()
        };
        let h = VnetHdr::from_offload(&o);
        assert_eq!(h.flags, VIRTIO_NET_HDR_F_NEEDS_CSUM);
        assert_eq!(h.gso_type, VIRTIO_NET_HDR_GSO_TCPV4);
        let back = VnetHdr::parse(&h.emit());
        assert_eq!(back, h);
        let rx = back.to_offload().unwrap();
        assert!(rx.csum_valid && rx.needs_csum);
        assert_eq!(
            (rx.csum_start, rx.csum_offset, rx.gso_size, rx.hdr_len),
            (34, 16, 1448, 66)
        );
        let dv = VnetHdr {
            flags: VIRTIO_NET_HDR_F_DATA_VALID,
            ..Default::default()
        };
        assert!(dv.to_offload().unwrap().csum_valid);
        let bad = VnetHdr {
            gso_type: 9,
            ..Default::default()
        };
        assert!(bad.to_offload().is_none());
    }

    #[test]
    fn tap_arp_with_linux() {
        if !sys::is_root() {
            eprintln!("skipped tap_arp_with_linux: needs root");
            return;
        }
        let name = "usnett0";
        let mut p = pool(256, 2048);
        {
            let mut dev = TapDevice::open(
                name,
                &TapConfig {
                    mtu: Some(1500),
                    host_addrs: vec!["10.99.0.1/24".into(), "fd00:99::1/64".into()],
                    tso: false,
                },
            )
            .unwrap();
            assert_eq!(dev.caps().mtu, 1500);
            assert_eq!(sys::if_mtu(name).unwrap(), 1500);
            arp_exchange(&mut dev, &mut p, [10, 99, 0, 2], [10, 99, 0, 1]);
            // The waker interrupts a long wait.
            let w = dev.waker();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                w.wake();
            });
            let start = Instant::now();
            let mut got = Vec::new();
            while start.elapsed() < Duration::from_millis(50) {
                dev.wait(Some(Duration::from_secs(5))).unwrap();
                dev.rx_burst(&mut p, &mut got, 64).unwrap();
            }
            t.join().unwrap();
            assert!(start.elapsed() < Duration::from_secs(4));
            for b in got {
                p.free(b);
            }
            assert!(dev.stats().tx_frames == 1 && dev.stats().rx_frames >= 1);
        }
        // Dropping the device removed the interface.
        assert!(sys::if_index(name).is_err());
        assert_eq!(p.in_use(), 0);
    }

    /// A two-queue TAP with the steering program: every datagram the kernel sends
    /// into it, from a flow's first on, arrives on the queue that owns it.
    #[test]
    fn tap_queues_get_each_frame_on_the_queue_that_owns_it() {
        if !sys::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let name = "usnett2";
        let mut p = pool(1024, 2048);
        let mut devs = TapDevice::open_queues(
            name,
            &TapConfig {
                mtu: Some(1500),
                host_addrs: vec!["10.98.0.1/24".into()],
                tso: false,
            },
            2,
        )
        .unwrap();
        // A neighbour the kernel need not ask for: datagrams leave at once.
        sys::run_ip(&[
            "neigh",
            "replace",
            "10.98.0.2",
            "lladdr",
            "02:00:00:00:98:02",
            "dev",
            name,
        ])
        .unwrap();
        let mut senders = Vec::new();
        let mut sent = 0;
        for dst in [7u16, 80, 443, 5353, 49152, 49153, 50000, 61001] {
            for _ in 0..8 {
                // A port the kernel picks: a fixed one can be held by anything
                // else on the machine (CI once found one taken). 64 flows all
                // hashing to one queue has a chance of 2^-63.
                // Kept open to the end, so each flow has a port of its own.
                let s = std::net::UdpSocket::bind(("10.98.0.1", 0)).unwrap();
                s.send_to(b"steer me", ("10.98.0.2", dst)).unwrap();
                senders.push(s);
                sent += 1;
            }
        }
        let mut got = [0usize; 2];
        let end = Instant::now() + Duration::from_secs(5);
        let mut frames = Vec::new();
        let mut v = Vec::new();
        while got[0] + got[1] < sent && Instant::now() < end {
            for (q, dev) in devs.iter_mut().enumerate() {
                dev.rx_burst(&mut p, &mut frames, 64).unwrap();
                for f in frames.drain(..) {
                    p.copy_chain(&f, &mut v);
                    p.free(f);
                    // Only our datagrams (the kernel may also send IPv6 chatter).
                    if v.len() > 42 && v[12..14] == [0x08, 0x00] && v[23] == 17 {
                        assert_eq!(usnet_wire::steer::link_queue(&v, 2), q, "{:02x?}", &v[..42]);
                        got[q] += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(got[0] + got[1], sent, "every datagram arrived");
        assert!(got[0] > 0 && got[1] > 0, "both queues: {got:?}");
        drop(senders);
        drop(devs);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn tap_bad_mtu_is_clear() {
        let e = TapDevice::open(
            "usnett9",
            &TapConfig {
                mtu: Some(70000),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "bad MTU 70000: must be between 68 and 65521");
    }

    /// Child half of `tap_without_root_says_so` (runs as an unprivileged user).
    #[test]
    fn tap_nonroot_child() {
        if std::env::var("USNET_TAP_NONROOT").is_err() {
            return;
        }
        let e = TapDevice::open("usnett1", &TapConfig::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "tap:usnett1 needs root (CAP_NET_ADMIN): run as root or use --link shm:NAME"
        );
        let e = crate::af_packet::AfPacketDevice::open("lo", None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "afpacket:lo needs root (CAP_NET_ADMIN): run as root or use --link shm:NAME"
        );
    }

    #[test]
    fn tap_without_root_says_so() {
        use std::os::unix::process::CommandExt;
        if !sys::is_root() {
            // Already unprivileged: check directly.
            std::env::set_var("USNET_TAP_NONROOT", "1");
            tap_nonroot_child();
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tap::tests::tap_nonroot_child",
                "--test-threads=1",
            ])
            .env("USNET_TAP_NONROOT", "1")
            .uid(65534)
            .gid(65534)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("Permission denied") => {
                eprintln!("skipped: the test binary is not executable by nobody")
            }
            Ok(o) => panic!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("skipped: cannot run the test binary as nobody: {e}"),
        }
    }
}
