//! An AF_PACKET socket bound to one interface (a veth end, a spare NIC): receive through
//! a TPACKET_V2 ring mapped into our memory, transmit with `sendmmsg` (one system call
//! per burst).
//!
//! Why V2 and not V3: a V3 block reaches user space only when it is full or when its
//! retire timer fires, and that timer's floor is 1 ms, so a lone frame (a request, an
//! ACK) waited up to 1 ms and one TCP connection doing request/response got 1000
//! transactions/s. A V2 frame is ours as soon as the kernel sets its status word. We
//! copy each frame into a pool buffer either way, so V3's variable-size packing bought
//! only ring memory.
//!
//! Ring frames are sized for the MTU. A frame that does not fit (a 64 KiB GSO packet
//! that a veth peer's TCP or a NIC's GRO hands over whole) comes through the kernel's
//! copy path: with PACKET_COPY_THRESH the ring frame is marked TP_STATUS_COPY and the
//! whole packet is queued on the socket, in the same order, for one `recv`.
//!
//! Why not a TX ring: with `sendmmsg` a burst already costs one system call, frames are
//! gathered straight from pool buffers (no copy into a ring slot first), and chained
//! frames need no special casing; a TX ring would save only the per-frame copy the kernel
//! makes into its skb, which it still makes with a TX ring on a veth.
//!
//! The interface should carry no IP configuration of its own on this host: Linux would
//! also answer the frames we receive.

use std::collections::VecDeque;
use std::io;
use std::mem::offset_of;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{Offload, PacketPool, PktBuf};

use crate::chain_read::{ChainRead, MAX_IOV};
use crate::error::LinkError;
use crate::sys::{self, cvt, getsockopt, setsockopt, EventFd};
use crate::tap::VnetHdr;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

pub const AF_PACKET_MAX_BURST: usize = 64;
const TPACKET_V2: libc::c_int = 1;
const BLOCK_NR: usize = 16;
const MIN_BLOCK_SIZE: usize = 256 * 1024;
/// Room in a ring frame before the Ethernet header: the tpacket2 header and a
/// sockaddr_ll, aligned (the kernel puts the MAC header at offset 66 for Ethernet).
const FRAME_HEADROOM: usize = 128;
/// The largest packet the copy path receives: 64 KiB of IP plus Ethernet and VLAN tags.
const MAX_BIG_FRAME: usize = 65535 + 22;
/// Socket receive buffer for packets on the copy path (the default would hold three).
const COPY_PATH_RCVBUF: libc::c_int = 16 << 20;
const MAX_SEGS: usize = 256;
const MAX_MSGS: usize = AF_PACKET_MAX_BURST;
/// PACKET_VNET_HDR frames start with the plain 10-byte `struct virtio_net_hdr` (no
/// `num_buffers`, unlike the TAP's 12-byte one).
const VNET_TX_HDR_LEN: usize = 10;

// Kernel ABI offsets inside a ring frame (`struct tpacket2_hdr`).
const PKT_STATUS: usize = offset_of!(libc::tpacket2_hdr, tp_status);
const PKT_LEN: usize = offset_of!(libc::tpacket2_hdr, tp_len);
const PKT_SNAPLEN: usize = offset_of!(libc::tpacket2_hdr, tp_snaplen);
const PKT_MAC: usize = offset_of!(libc::tpacket2_hdr, tp_mac);

/// The mmap'd RX ring: `frame_nr` frames of `frame_size` bytes, back to back (a block
/// holds a whole number of frames, so frame `i` starts at `i * frame_size`).
struct RxRing {
    base: *mut u8,
    len: usize,
    frame_size: usize,
    frame_nr: usize,
}

// SAFETY: the mapping is owned by this struct alone (no aliases are handed out beyond a
// borrow of the device); moving it to another thread moves that ownership.
unsafe impl Send for RxRing {}

impl RxRing {
    fn frame(&self, i: usize) -> *mut u8 {
        assert!(i < self.frame_nr);
        // SAFETY: i < frame_nr, so the frame lies inside the mapping.
        unsafe { self.base.add(i * self.frame_size) }
    }
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the status word is an aligned u32 at the start of the frame, shared
        // with the kernel, so it is only ever accessed atomically.
        unsafe { &*(self.frame(i).add(PKT_STATUS) as *const AtomicU32) }
    }
    fn read_u32(&self, i: usize, off: usize) -> u32 {
        assert!(off + 4 <= self.frame_size);
        // SAFETY: in bounds (checked); the kernel does not write a frame while it is ours.
        unsafe { std::ptr::read_unaligned(self.frame(i).add(off) as *const u32) }
    }
    fn read_u16(&self, i: usize, off: usize) -> u16 {
        assert!(off + 2 <= self.frame_size);
        // SAFETY: as for read_u32.
        unsafe { std::ptr::read_unaligned(self.frame(i).add(off) as *const u16) }
    }
    fn bytes(&self, i: usize, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.frame_size);
        // SAFETY: in bounds (checked); the frame is ours until we hand it back.
        unsafe { std::slice::from_raw_parts(self.frame(i).add(off), len) }
    }
    fn is_ours(&self, i: usize) -> bool {
        // Acquire: the kernel wrote the frame before it set TP_STATUS_USER.
        self.status(i).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; nothing borrows the ring now.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

pub struct AfPacketDevice {
    label: String,
    ifname: String,
    ifindex: u32,
    ring: RxRing,
    // Declared after the ring: the mapping goes before the socket closes.
    /// Shared with wait plans, so a loop may sleep on it without the device.
    fd: Arc<OwnedFd>,
    /// An unbound packet socket with PACKET_VNET_HDR for transmitting: each frame goes
    /// with a virtio-net header, so a partial checksum or a 64 KiB TCP GSO frame is
    /// finished or cut by the kernel (a veth passes GSO frames on whole). `None` when
    /// the kernel refuses the option: frames then go through `fd`, checksummed and
    /// MTU-sized.
    tx_vnet: Option<OwnedFd>,
    ev: Arc<EventFd>,
    mtu: usize,
    /// The next ring frame to look at.
    next: usize,
    /// Where a packet on the copy path (too large for a ring frame: a GSO frame)
    /// is received: straight into pool buffers.
    read: ChainRead,
    down: bool,
    stats: DeviceStats,
    /// Frames the kernel dropped because the RX ring was full, as read so far
    /// (PACKET_STATISTICS resets the kernel's count on each read).
    ring_drops: std::cell::Cell<u64>,
}

/// `struct tpacket_stats` (PACKET_STATISTICS for a TPACKET_V2 socket).
#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

impl std::fmt::Debug for AfPacketDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AfPacketDevice")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl AfPacketDevice {
    /// Binds to `ifname`. `mtu` may lower the MTU the stack uses below the interface's.
    pub fn open(ifname: &str, mtu: Option<usize>) -> Result<AfPacketDevice, LinkError> {
        let spec = format!("afpacket:{ifname}");
        let ifindex = sys::if_index(ifname)?;
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
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // Protocol 0: the socket receives nothing until `bind` below names the
        // protocol and the interface together. Opened with ETH_P_ALL it would take
        // every interface's frames (loopback's too) into its ring in between.
        // SAFETY: socket() with constant arguments returns a new fd or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => LinkError::NeedsRoot { spec },
                _ => LinkError::io(format!("{spec}: cannot open a packet socket"), e),
            });
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ctx = |what: &str| format!("{spec}: {what}");

        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &TPACKET_V2)
            .map_err(|e| LinkError::io(ctx("cannot select TPACKET_V2"), e))?;
        // Powers of two, so a block holds a whole number of frames (at least four).
        let frame_size = (FRAME_HEADROOM + mtu + 18).next_power_of_two();
        let block_size = MIN_BLOCK_SIZE.max(4 * frame_size);
        let frame_nr = block_size / frame_size * BLOCK_NR;
        let req = libc::tpacket_req {
            tp_block_size: block_size as u32,
            tp_block_nr: BLOCK_NR as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: frame_nr as u32,
        };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
            .map_err(|e| LinkError::io(ctx("cannot set up the RX ring"), e))?;
        let len = block_size * BLOCK_NR;
        // SAFETY: maps the ring the kernel just allocated for this socket; length as
        // requested; the result is checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED,
                fd.as_raw_fd(),
                0,
            )
        };
        let base = if base == libc::MAP_FAILED {
            // MAP_LOCKED may exceed RLIMIT_MEMLOCK; fall back to a plain mapping.
            // SAFETY: as above, without MAP_LOCKED.
            let b = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if b == libc::MAP_FAILED {
                return Err(LinkError::io(
                    ctx("cannot map the RX ring"),
                    io::Error::last_os_error(),
                ));
            }
            b
        } else {
            base
        };
        let ring = RxRing {
            base: base.cast(),
            len,
            frame_size,
            frame_nr,
        };

        let one: libc::c_int = 1;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_COPY_THRESH, &one)
            .map_err(|e| LinkError::io(ctx("cannot set PACKET_COPY_THRESH"), e))?;
        // Root may raise the buffer past rmem_max; otherwise the capped size will do.
        if setsockopt(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &COPY_PATH_RCVBUF,
        )
        .is_err()
        {
            let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &COPY_PATH_RCVBUF);
        }
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one)
            .map_err(|e| LinkError::io(ctx("cannot set PACKET_IGNORE_OUTGOING"), e))?;
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as libc::c_int,
            mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
            .map_err(|e| LinkError::io(ctx("cannot enter promiscuous mode"), e))?;
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: binds to a valid sockaddr_ll of the stated size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .map_err(|e| LinkError::io(ctx("cannot bind"), e))?;
        let ev = Arc::new(EventFd::new().map_err(|e| LinkError::io(ctx("eventfd"), e))?);
        let tx_vnet = vnet_tx_socket();
        Ok(AfPacketDevice {
            label: spec,
            ifname: ifname.to_string(),
            ifindex,
            ring,
            fd: Arc::new(fd),
            tx_vnet,
            ev,
            mtu,
            next: 0,
            read: ChainRead::new(MAX_BIG_FRAME + 1),
            down: false,
            stats: DeviceStats::default(),
            ring_drops: std::cell::Cell::new(0),
        })
    }

    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Opens `n` sockets on `ifname`, the members of one fanout group
    /// (`PACKET_FANOUT_CBPF`) whose program, [`crate::bpf::shard_steering`], hands
    /// each received frame to the socket of the shard that owns it: member `i` is
    /// shard `i`. `n` = 1 is a plain socket.
    pub fn open_shards(
        ifname: &str,
        mtu: Option<usize>,
        n: usize,
    ) -> Result<Vec<AfPacketDevice>, LinkError> {
        let mut out = Vec::with_capacity(n);
        let mut group = None;
        for _ in 0..n {
            let mut d = AfPacketDevice::open(ifname, mtu)?;
            if n > 1 {
                group = Some(d.join_fanout(group)?);
            }
            out.push(d);
        }
        if n > 1 {
            // Until the last socket joined, frames went to the members there were:
            // between its `bind` and its join a socket took every frame of the
            // interface, and a group of fewer members steered frames modulo its size.
            // Drop them, as a link not yet up would (CI saw a dozen handed between
            // shards when frames still arrived for an earlier server).
            for d in &mut out {
                d.discard_pending();
            }
        }
        Ok(out)
    }

    /// Takes only the frames sent to `mac` (the stack's) and to group addresses, by a
    /// socket filter ([`crate::bpf::frames_for`]): a stack beside the host on one
    /// interface otherwise receives, copies and drops every frame of the host's own
    /// traffic. Frames queued before the filter are still delivered.
    pub fn accept_only(&mut self, mac: [u8; 6]) -> Result<(), LinkError> {
        let prog = crate::bpf::frames_for(mac);
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        setsockopt(&self.fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(|e| LinkError::io(format!("{}: cannot attach the MAC filter", self.label), e))
    }

    /// Joins fanout group `id` (`None`: a new group with an id the kernel picks) with
    /// the shard steering program; returns the group's id. Frames this host sends are
    /// not fanned out back to it (`PACKET_FANOUT_FLAG_IGNORE_OUTGOING`, as
    /// `PACKET_IGNORE_OUTGOING` does for a lone socket).
    fn join_fanout(&mut self, id: Option<u16>) -> Result<u16, LinkError> {
        let ctx = |what: &str| format!("{}: {what}", self.label);
        let mut flags = libc::PACKET_FANOUT_CBPF | libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
        if id.is_none() {
            flags |= libc::PACKET_FANOUT_FLAG_UNIQUEID;
        }
        let arg: u32 = u32::from(id.unwrap_or(0)) | (flags << 16);
        setsockopt(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
            .map_err(|e| LinkError::io(ctx("cannot join a fanout group"), e))?;
        let prog = crate::bpf::shard_steering();
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        setsockopt(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT_DATA, &fprog)
            .map_err(|e| LinkError::io(ctx("cannot set the fanout program"), e))?;
        let got: u32 = getsockopt(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT)
            .map_err(|e| LinkError::io(ctx("cannot read the fanout group"), e))?;
        Ok(got as u16)
    }

    /// Gives back every frame waiting in the ring and in the copy path's queue.
    /// Bounded by the ring's size: frames arriving meanwhile are the group's.
    fn discard_pending(&mut self) {
        for _ in 0..self.ring.frame_nr {
            if !self.ring.is_ours(self.next) {
                break;
            }
            self.release_frame();
        }
        for _ in 0..self.ring.frame_nr {
            if self.discard_copied().is_none() {
                break;
            }
        }
    }

    /// Receives the packet the kernel queued for a ring frame marked TP_STATUS_COPY
    /// (`len` bytes long, says the frame) into pool buffers, the kernel's copy its
    /// only one; `None` (counted) if it is not there, not whole, or the pool is out.
    fn recv_copied(&mut self, pool: &mut PacketPool, len: usize) -> Option<PktBuf> {
        let Some(b) = pool.alloc() else {
            self.stats.rx_no_buffer += 1;
            self.discard_copied();
            return None;
        };
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_IOV];
        let cnt = self.read.iovecs(pool, &b, len.min(MAX_BIG_FRAME), &mut iov);
        // SAFETY: an all-zero msghdr is valid; it names our iovecs below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = cnt;
        // SAFETY: every iovec points at live, writable memory of the stated length
        // (the free space of distinct pool buffers we hold, and our scratch).
        let n = unsafe {
            libc::recvmsg(
                self.fd.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        // MSG_TRUNC: the packet's real length, so a cut one is recognised.
        let whole = usize::try_from(n).is_ok_and(|n| n == len && (14..=MAX_BIG_FRAME).contains(&n));
        if !whole {
            pool.free(b);
            self.stats.rx_errors += 1;
            return None;
        }
        if !self.read.finish(pool, &b, len) {
            pool.free(b);
            self.stats.rx_no_buffer += 1;
            return None;
        }
        Some(b)
    }

    /// Throws away the next packet of the copy path's queue without waiting: its
    /// real length, `None` if none.
    fn discard_copied(&mut self) -> Option<usize> {
        let scratch = self.read.scratch();
        // SAFETY: receives into our own buffer of the stated length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                scratch.as_mut_ptr().cast(),
                scratch.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        usize::try_from(n).ok()
    }

    /// Gives the current frame back to the kernel and moves on.
    fn release_frame(&mut self) {
        // Release: our reads of the frame happen before the kernel may reuse it.
        self.ring
            .status(self.next)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
        self.next = (self.next + 1) % self.ring.frame_nr;
    }
}

/// The transmit socket (see `AfPacketDevice::tx_vnet`). Protocol 0: it receives
/// nothing, so it needs no ring and no filter.
fn vnet_tx_socket() -> Option<OwnedFd> {
    // SAFETY: socket() with constant arguments returns a new fd or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &one).ok()?;
    Some(fd)
}

impl Device for AfPacketDevice {
    fn name(&self) -> &str {
        &self.label
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            rx_csum_offload: true,
            tx_csum_offload: self.tx_vnet.is_some(),
            tso: self.tx_vnet.is_some(),
            max_burst: AF_PACKET_MAX_BURST,
        }
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        let mut n = 0;
        let fs = self.ring.frame_size;
        while n < max && self.ring.is_ours(self.next) {
            let i = self.next;
            let snap = self.ring.read_u32(i, PKT_SNAPLEN) as usize;
            let wire_len = self.ring.read_u32(i, PKT_LEN) as usize;
            let status = self.ring.read_u32(i, PKT_STATUS);
            let mac = self.ring.read_u16(i, PKT_MAC) as usize;
            let got = if status & libc::TP_STATUS_COPY != 0 {
                self.recv_copied(pool, wire_len)
            } else if mac + snap > fs || snap < wire_len || snap < 14 {
                // Truncated by the ring (no room on the copy path), or a bad header.
                self.stats.rx_errors += 1;
                None
            } else {
                let b = pool.alloc_from(self.ring.bytes(i, mac, snap));
                if b.is_none() {
                    self.stats.rx_no_buffer += 1;
                }
                b
            };
            if let Some(b) = got {
                let mut o = Offload::default();
                if status & libc::TP_STATUS_CSUM_VALID != 0 {
                    o.csum_valid = true;
                }
                if status & libc::TP_STATUS_CSUMNOTREADY != 0 {
                    // Locally generated (e.g. by the veth peer's stack): the checksum
                    // is only partial; valid, and finishable by a forwarder. The
                    // headers are in the first buffer.
                    o.csum_valid = true;
                    if let Some((start, offset)) = sys::partial_csum_location(pool.data(&b)) {
                        o.needs_csum = true;
                        o.csum_start = start;
                        o.csum_offset = offset;
                    }
                }
                pool.set_offload(&b, o);
                out.push(b);
                n += 1;
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += wire_len as u64;
            }
            self.release_frame();
        }
        Ok(n)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        let max_frame = self.mtu + 18;
        let vnet = self.tx_vnet.is_some();
        // A GSO frame (only with the vnet header) may be up to 64 KiB of IP.
        let fits = |pool: &PacketPool, f: &PktBuf, len: usize| {
            len >= 14
                && (len <= max_frame || (vnet && pool.offload(f).gso_size > 0 && len <= 65535 + 18))
        };
        let mut sent = 0;
        loop {
            // Drop what can never go out, then gather up to one burst.
            while let Some(f) = frames.front() {
                if fits(pool, f, pool.chain_len(f)) {
                    break;
                }
                let f = frames.pop_front().expect("looked at it");
                pool.free(f);
                self.stats.tx_dropped += 1;
            }
            if frames.is_empty() {
                break;
            }
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_SEGS];
            // SAFETY: mmsghdr and sockaddr_ll are plain old data; all-zero is valid (no
            // name, no control).
            let mut msgs: [libc::mmsghdr; MAX_MSGS] = unsafe { std::mem::zeroed() };
            let mut names: [libc::sockaddr_ll; MAX_MSGS] = unsafe { std::mem::zeroed() };
            let mut hdrs = [[0u8; VNET_TX_HDR_LEN]; MAX_MSGS];
            let mut nseg = 0;
            let mut nmsg = 0;
            for f in frames.iter().take(MAX_MSGS) {
                let len = pool.chain_len(f);
                // One iovec per part of the frame, and one for the header; the batch
                // ends when the next frame's do not fit.
                let parts = pool.part_count(f);
                if !fits(pool, f, len) || nseg + parts + usize::from(vnet) > MAX_SEGS {
                    break;
                }
                let first = nseg;
                if vnet {
                    let h = VnetHdr::from_offload(&pool.offload(f)).emit();
                    hdrs[nmsg].copy_from_slice(&h[..VNET_TX_HDR_LEN]);
                    iov[nseg] = libc::iovec {
                        iov_base: hdrs[nmsg].as_mut_ptr().cast(),
                        iov_len: VNET_TX_HDR_LEN,
                    };
                    nseg += 1;
                    // The unbound socket needs the interface and the protocol per frame.
                    let d = pool.data(f);
                    let n = &mut names[nmsg];
                    n.sll_family = libc::AF_PACKET as u16;
                    n.sll_ifindex = self.ifindex as libc::c_int;
                    n.sll_protocol = u16::from_be_bytes([d[12], d[13]]).to_be();
                    msgs[nmsg].msg_hdr.msg_name = (n as *mut libc::sockaddr_ll).cast();
                    msgs[nmsg].msg_hdr.msg_namelen =
                        std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                }
                for d in pool.parts(f) {
                    iov[nseg] = libc::iovec {
                        iov_base: d.as_ptr() as *mut libc::c_void,
                        iov_len: d.len(),
                    };
                    nseg += 1;
                }
                msgs[nmsg].msg_hdr.msg_iov = iov[first..].as_mut_ptr();
                msgs[nmsg].msg_hdr.msg_iovlen = (nseg - first) as _;
                nmsg += 1;
            }
            if nmsg == 0 {
                // A frame of more than MAX_SEGS parts: cannot gather it.
                let f = frames.pop_front().expect("not empty");
                pool.free(f);
                self.stats.tx_dropped += 1;
                continue;
            }
            // SAFETY: msgs[..nmsg] point at iovecs in `iov`, which point at live pool
            // buffers of the frames still in `frames`; the socket is bound, so no address
            // is needed. The kernel only reads these.
            let fd = self.tx_vnet.as_ref().unwrap_or(&self.fd).as_raw_fd();
            let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), nmsg as libc::c_uint, 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        self.stats.tx_full += 1;
                        break;
                    }
                    Some(libc::EINTR) => continue,
                    _ => {
                        // The first frame was refused (interface down, bad frame): drop it.
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENXIO) | Some(libc::ENETDOWN) | Some(libc::ENODEV)
                        ) {
                            self.down = true;
                        }
                        let f = frames.pop_front().expect("not empty");
                        pool.free(f);
                        self.stats.tx_dropped += 1;
                        continue;
                    }
                }
            }
            let r = r as usize;
            for m in &msgs[..r] {
                let f = frames.pop_front().expect("sent frames are queued");
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += m.msg_len as u64;
                pool.free(f);
            }
            sent += r;
            self.down = false;
            if r < nmsg {
                self.stats.tx_full += 1;
                break;
            }
        }
        Ok(sent)
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        if self.rx_ready() {
            return crate::WaitPlan::ready();
        }
        crate::WaitPlan::fds(self.fd.clone(), Some(self.ev.clone()))
    }

    fn rx_ready(&mut self) -> bool {
        self.ring.is_ours(self.next)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.ring.is_ours(self.next) {
            return Ok(());
        }
        sys::poll_two(self.fd.as_fd(), &self.ev, timeout).map(|_| ())
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

    fn release_buffers(&mut self, pool: &mut PacketPool) {
        self.read.release(pool);
    }

    fn stats(&self) -> DeviceStats {
        if let Ok(st) =
            getsockopt::<TpacketStats>(&self.fd, libc::SOL_PACKET, libc::PACKET_STATISTICS)
        {
            self.ring_drops
                .set(self.ring_drops.get() + u64::from(st.tp_drops));
        }
        DeviceStats {
            rx_ring_drops: self.ring_drops.get(),
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tap::tests::{arp_exchange, OUR_MAC};
    use crate::testutil::pool;
    use std::time::Instant;

    const NS: &str = "usnet-afp-ns";
    const OURS: &str = "usnt-afp0";
    const PEER: &str = "usnt-afp1";
    const ETH_EXPERIMENTAL: u16 = 0x88b5;

    /// Tests that build the namespace take turns (they share its name).
    static VETH_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A netns holding one end of a veth pair (address 10.98.0.1/24); removed on drop.
    struct Veth {
        _turn: std::sync::MutexGuard<'static, ()>,
    }
    impl Veth {
        fn new() -> Veth {
            let guard = VETH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let _ = sys::run_ip(&["netns", "del", NS]);
            let _ = sys::run_ip(&["link", "del", OURS]);
            sys::run_ip(&["netns", "add", NS]).unwrap();
            let v = Veth { _turn: guard };
            sys::run_ip(&["link", "add", OURS, "type", "veth", "peer", "name", PEER]).unwrap();
            sys::run_ip(&["link", "set", PEER, "netns", NS]).unwrap();
            sys::run_ip(&["link", "set", OURS, "up"]).unwrap();
            sys::run_ip(&["-n", NS, "link", "set", PEER, "up"]).unwrap();
            sys::run_ip(&["-n", NS, "addr", "add", "10.98.0.1/24", "dev", PEER]).unwrap();
            v
        }
    }
    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = sys::run_ip(&["netns", "del", NS]);
            let _ = sys::run_ip(&["link", "del", OURS]);
        }
    }

    fn test_frame(src: [u8; 6], payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&src);
        f.extend_from_slice(&ETH_EXPERIMENTAL.to_be_bytes());
        f.extend_from_slice(payload);
        f.resize(f.len().max(60), 0);
        f
    }

    /// Called in a thread of its own: moves the thread into the namespace and opens a raw
    /// packet socket for the experimental ethertype on the peer end (reads time out
    /// after 100 ms).
    fn peer_socket() -> OwnedFd {
        let ns = std::fs::File::open(format!("/run/netns/{NS}")).unwrap();
        // SAFETY: setns on a namespace fd we opened; affects only this thread.
        assert_eq!(
            unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        let idx = sys::if_index(PEER).unwrap();
        let proto = ETH_EXPERIMENTAL.to_be();
        // SAFETY: socket() with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                proto as i32,
            )
        };
        assert!(fd >= 0);
        // SAFETY: fd is new and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero sockaddr_ll is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = idx as i32;
        // SAFETY: valid sockaddr_ll of the stated size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, 0);
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv).unwrap();
        fd
    }

    /// Sends `frame` on the peer's socket.
    fn peer_send(fd: &OwnedFd, frame: &[u8]) {
        // SAFETY: sends our own buffer on the bound socket.
        let r = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(r as usize, frame.len());
    }

    /// In a thread inside the namespace: a raw packet socket on the peer end that sends
    /// `out` and then returns the first experimental-ethertype frame it receives.
    fn peer_side(out: Vec<u8>) -> std::thread::JoinHandle<Option<Vec<u8>>> {
        std::thread::spawn(move || {
            let fd = peer_socket();
            // SAFETY: sends our own buffer on the bound socket.
            let r = unsafe { libc::send(fd.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
            assert_eq!(r as usize, out.len());
            let mut buf = vec![0u8; 2048];
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                // SAFETY: receives into our own buffer of the stated length.
                let r =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if r > 0 && buf[6..12] == OUR_MAC {
                    return Some(buf[..r as usize].to_vec());
                }
            }
            None
        })
    }

    /// Receives on `dev` for at most `limit` (waiting up to `poll` at a time), each
    /// frame linearised and handed to `frame` with `st`, until `done(st)` holds.
    fn receive_until<S>(
        dev: &mut AfPacketDevice,
        p: &mut PacketPool,
        (limit, poll): (Duration, Duration),
        st: &mut S,
        mut frame: impl FnMut(&mut S, &[u8]),
        mut done: impl FnMut(&S) -> bool,
    ) {
        let (mut got, mut v) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while !done(st) && start.elapsed() < limit {
            dev.wait(Some(poll)).unwrap();
            dev.rx_burst(p, &mut got, 64).unwrap();
            for b in got.drain(..) {
                p.copy_chain(&b, &mut v);
                p.free(b);
                frame(st, &v);
            }
        }
    }

    #[test]
    fn afpacket_on_veth() {
        if !sys::is_root() {
            eprintln!("skipped afpacket_on_veth: needs root");
            return;
        }
        let _veth = Veth::new();
        let mut dev = AfPacketDevice::open(OURS, None).unwrap();
        assert_eq!(dev.caps().mtu, 1500);
        let mut p = pool(256, 2048);
        // Our request goes out, Linux in the namespace answers, we receive the answer
        // (and not our own request: PACKET_IGNORE_OUTGOING).
        arp_exchange(&mut dev, &mut p, [10, 98, 0, 2], [10, 98, 0, 1]);

        // A frame built by hand on the other side reaches us; ours reaches it.
        let peer_mac = [0x02, 0, 0x5e, 0, 0x10, 0x02];
        let theirs = test_frame(peer_mac, b"hello from the namespace");
        let peer = peer_side(theirs.clone());
        let mut seen = false;
        receive_until(
            &mut dev,
            &mut p,
            (Duration::from_secs(3), Duration::from_millis(100)),
            &mut seen,
            |seen, v| *seen |= v == theirs,
            |seen| *seen,
        );
        assert!(seen, "frame from the namespace not received");
        let ours = test_frame(OUR_MAC, b"hello from usnet");
        let mut q = VecDeque::new();
        // Send a few (the peer's socket may not be reading yet for the first).
        for _ in 0..20 {
            q.push_back(p.alloc_from(&ours).unwrap());
            dev.tx_burst(&mut p, &mut q).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            if peer.is_finished() {
                break;
            }
        }
        let received = peer
            .join()
            .unwrap()
            .expect("our frame not seen in the namespace");
        assert_eq!(received, ours);
        assert_eq!(dev.link_state(), LinkState::Up);
        assert_eq!(p.in_use(), 0);
    }

    /// With the stack's MAC given, the socket takes the frames sent to it and to
    /// group addresses, and none of the host's unicast traffic on the interface.
    #[test]
    fn afpacket_with_a_mac_takes_only_frames_for_it() {
        if !sys::is_root() {
            eprintln!("skipped afpacket_with_a_mac_takes_only_frames_for_it: needs root");
            return;
        }
        let _veth = Veth::new();
        let mut dev = AfPacketDevice::open(OURS, None).unwrap();
        dev.accept_only(OUR_MAC).unwrap();
        let mut p = pool(256, 2048);
        let peer_mac = [0x02, 0, 0x5e, 0, 0x10, 0x02];
        let addressed = |dst: [u8; 6], what: &[u8]| {
            let mut f = test_frame(peer_mac, what);
            f[..6].copy_from_slice(&dst);
            f
        };
        let host = addressed([0x02, 0, 0x5e, 0, 0x10, 0x77], b"for the host");
        let ours = addressed(OUR_MAC, b"for usnet");
        let group = addressed([0xff; 6], b"for everyone");
        let frames = [host.clone(), ours.clone(), group.clone()];
        let peer = std::thread::spawn(move || {
            let fd = peer_socket();
            // Repeated: the first may go out before our socket reads.
            for _ in 0..5 {
                for f in &frames {
                    peer_send(&fd, f);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let mut seen = (false, false, false);
        receive_until(
            &mut dev,
            &mut p,
            (Duration::from_secs(3), Duration::from_millis(50)),
            &mut seen,
            |(o, g, h), v| {
                *o |= v == ours;
                *g |= v == group;
                *h |= v == host;
            },
            |&(o, g, _)| o && g && peer.is_finished(),
        );
        let (got_ours, got_group, got_host) = seen;
        peer.join().unwrap();
        assert!(got_ours && got_group, "ours {got_ours}, group {got_group}");
        assert!(!got_host, "the host's frame reached the stack");
        assert_eq!(p.in_use(), 0);
    }

    /// A frame larger than a ring frame (the ring is sized for the MTU the stack uses)
    /// comes through the kernel's copy path, whole and in order between small ones.
    #[test]
    fn afpacket_counts_what_the_kernel_dropped_on_a_full_ring() {
        if !sys::is_root() {
            eprintln!("skipped afpacket_counts_what_the_kernel_dropped_on_a_full_ring: needs root");
            return;
        }
        let _veth = Veth::new();
        let mut dev = AfPacketDevice::open(OURS, Some(1500)).unwrap();
        let slots = dev.ring.frame_nr;
        // Nothing drains the ring while the peer sends more frames than it holds.
        let extra = 300;
        let peer = std::thread::spawn(move || {
            let fd = peer_socket();
            let f = test_frame([0x02, 0, 0x5e, 0, 0x10, 0x02], &[7; 100]);
            for _ in 0..slots + extra {
                peer_send(&fd, &f);
            }
        });
        peer.join().unwrap();
        let drops = dev.stats().rx_ring_drops;
        assert!(
            drops >= extra as u64,
            "{drops} drops counted for {extra} frames too many"
        );
        // Reading the kernel's count resets it: the device keeps the total.
        assert_eq!(dev.stats().rx_ring_drops, drops);
        let mut p = pool(256, 2048);
        let mut bufs = Vec::new();
        dev.rx_burst(&mut p, &mut bufs, 64).unwrap();
        assert!(!bufs.is_empty(), "the ring kept the first frames");
        for b in bufs.drain(..) {
            p.free(b);
        }
    }

    /// Shards opened while frames keep arriving each get only the frames the fanout
    /// program gives them: nothing that reached a socket before it joined the group
    /// (another shard's frames, or another interface's before `bind`).
    #[test]
    fn afpacket_shards_opened_under_traffic_get_only_their_own_frames() {
        if !sys::is_root() {
            eprintln!("skipped afpacket_shards_opened_under_traffic_get_only_their_own_frames: needs root");
            return;
        }
        let _veth = Veth::new();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let peer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let fd = peer_socket();
                // IPv4/UDP to ephemeral ports 50000 and 50001: one for each shard.
                let mut f = vec![0xff; 6];
                f.extend_from_slice(&[0x02, 0, 0x5e, 0, 0x10, 0x02]);
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                f.extend_from_slice(&[0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0]);
                f.extend_from_slice(&[10, 98, 0, 1, 10, 98, 0, 2]);
                f.extend_from_slice(&[0x13, 0x88, 0, 0, 0, 8, 0, 0]);
                f.resize(60, 0);
                let mut sent = 0u64;
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(10) {
                    f[36..38].copy_from_slice(&(50000 + (sent % 2) as u16).to_be_bytes());
                    peer_send(&fd, &f);
                    sent += 1;
                }
                sent
            })
        };
        // Let the traffic start, then open the shards in the middle of it.
        std::thread::sleep(Duration::from_millis(50));
        let mut devs = AfPacketDevice::open_shards(OURS, None, 2).unwrap();
        let mut p = pool(4096, 2048);
        let mut got = Vec::new();
        let mut v = Vec::new();
        let mut counts = [0u64; 2];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            for (i, dev) in devs.iter_mut().enumerate() {
                dev.rx_burst(&mut p, &mut got, 64).unwrap();
                for b in got.drain(..) {
                    p.copy_chain(&b, &mut v);
                    p.free(b);
                    assert_eq!(
                        usnet_wire::steer::link_queue(&v, 2),
                        i,
                        "shard {i} got another's frame: {v:02x?}"
                    );
                    counts[i] += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let sent = peer.join().unwrap();
        assert!(
            counts[0] > 0 && counts[1] > 0,
            "both shards receive ({counts:?} of {sent} sent)"
        );
    }

    #[test]
    fn afpacket_frames_larger_than_a_ring_frame() {
        if !sys::is_root() {
            eprintln!("skipped afpacket_frames_larger_than_a_ring_frame: needs root");
            return;
        }
        let _veth = Veth::new();
        sys::run_ip(&["link", "set", OURS, "mtu", "9000"]).unwrap();
        sys::run_ip(&["-n", NS, "link", "set", PEER, "mtu", "9000"]).unwrap();
        let mut dev = AfPacketDevice::open(OURS, Some(1500)).unwrap();
        assert_eq!(dev.ring.frame_size, 2048);
        let mut p = pool(256, 2048);
        let peer_mac = [0x02, 0, 0x5e, 0, 0x10, 0x02];
        let sent: Vec<Vec<u8>> = [100usize, 8000, 60, 5000, 1400]
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let payload: Vec<u8> = (0..n).map(|k| (k * 7 + i) as u8).collect();
                test_frame(peer_mac, &payload)
            })
            .collect();
        let out = sent.clone();
        let peer = std::thread::spawn(move || {
            let fd = peer_socket();
            for f in &out {
                peer_send(&fd, f);
            }
        });
        let mut got: Vec<Vec<u8>> = Vec::new();
        receive_until(
            &mut dev,
            &mut p,
            (Duration::from_secs(3), Duration::from_millis(100)),
            &mut got,
            |got, v| {
                if v[12..14] == ETH_EXPERIMENTAL.to_be_bytes() {
                    got.push(v.to_vec());
                }
            },
            |got| got.len() >= sent.len(),
        );
        peer.join().unwrap();
        assert_eq!(got, sent);
        assert_eq!(dev.stats().rx_errors, 0);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn afpacket_missing_interface() {
        let e = AfPacketDevice::open("usnt-nosuch", None).unwrap_err();
        assert!(matches!(e, LinkError::NoSuchInterface(_)), "{e}");
    }
}
