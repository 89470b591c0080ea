//! The usnet driver of the emulated NIC: a [`Device`] like any other.
//!
//! Receive follows the NAPI pattern. [`Device::wait`] re-enables the interrupt (writes the
//! mask register), re-checks the ring, and sleeps on the interrupt line (or spins on it);
//! the "handler" is the wake-up: it records when it ran, acknowledges the status register
//! and masks the interrupt again. [`Device::rx_burst`] then reads completed descriptors
//! under a budget, copies each frame out of the NIC buffer into pool buffers (the copy the
//! Mint paper measures), gives the descriptor back to the device (refill) and moves
//! the tail register. When a later `wait` finds the ring empty, interrupts are re-enabled.
//!
//! Nothing the device writes is trusted: a descriptor whose buffer index differs from the
//! one posted, whose length is zero or larger than the buffer, whose first/last bits do not
//! form a frame, or that the device skipped (its head register moved past a descriptor it
//! still owns), is counted by kind and dropped; the descriptor is re-armed and the ring
//! keeps moving.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{fence, AtomicBool, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{BufId, PacketPool, PktBuf};
use usnet_shm::{liveness, monotonic_ns as now_ns, FutexBell, Populate, Region};

use super::layout::*;
use super::NicError;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Wake, Waker};

/// How the driver waits for the interrupt line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqMode {
    /// Sleep in FUTEX_WAIT; the device side FUTEX_WAKEs (an interrupt that costs a wake-up).
    Futex,
    /// Spin on the line (a dedicated polling core; the device never makes a system call).
    Spin,
    /// Spin for this many ns, then sleep.
    Hybrid { spin_ns: u64 },
}

/// How to create an emulated NIC and its driver (`LinkOptions::nic` for `nic:NAME`
/// links; `usnet_link::open` takes the MTU from `LinkOptions::mtu` when that is set).
#[derive(Debug, Clone)]
pub struct NicOptions {
    pub rx_ring: u32,
    pub tx_ring: u32,
    /// Bytes per NIC packet buffer; larger frames span several descriptors (FS..LS).
    /// `None`: 2048 up to MTU 1500, 16384 above (one descriptor per jumbo frame).
    pub buf_size: Option<u32>,
    /// L3 MTU; frames up to `mtu + 18` are accepted (jumbo up to 65518).
    pub mtu: usize,
    pub mac: [u8; 6],
    pub irq_mode: IrqMode,
    /// NAPI budget: most frames one `rx_burst` takes.
    pub napi_budget: usize,
    /// Interrupt moderation registers (see `layout::R_ITR_*`).
    pub itr_ns: u32,
    pub itr_pkts: u32,
    /// Keep up to this many handler records (0 = none).
    pub record_irqs: usize,
}

impl NicOptions {
    /// The NIC buffer size these options give.
    pub fn buf_size(&self) -> u32 {
        self.buf_size
            .unwrap_or(if self.mtu > 1500 { 16384 } else { 2048 })
    }
}

impl Default for NicOptions {
    fn default() -> Self {
        NicOptions {
            rx_ring: 256,
            tx_ring: 256,
            buf_size: None,
            mtu: 1500,
            mac: [0x02, 0x00, 0x00, 0x00, 0x00, 0x02],
            irq_mode: IrqMode::Futex,
            napi_budget: 64,
            itr_ns: 0,
            itr_pkts: 0,
            record_irqs: 0,
        }
    }
}

/// One run of the interrupt handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqRecord {
    /// Value of the interrupt line when the handler ran.
    pub seq: u32,
    /// When the device says it raised that interrupt (CLOCK_MONOTONIC ns; untrusted).
    pub raised_ns: u64,
    /// When the handler ran (CLOCK_MONOTONIC ns).
    pub handled_ns: u64,
    /// Interrupts folded into this run (line moved by more than one).
    pub coalesced: u32,
}

/// The driver's own counters (a superset of [`DeviceStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_descs: u64,
    /// Descriptor length zero, above the buffer size, or a frame above MTU / below 14 B.
    pub rx_bad_len: u64,
    /// Descriptor buffer index not the one posted (out of range or swapped).
    pub rx_bad_index: u64,
    /// First/last bits that do not form a frame (segment without FS, FS inside a frame).
    pub rx_bad_flags: u64,
    /// Descriptors the device skipped (head moved past a descriptor it still owns).
    pub rx_bad_own: u64,
    /// Frames the device flagged with F_ERR.
    pub rx_dev_err: u64,
    /// Frames lost for lack of pool buffers.
    pub rx_no_buffer: u64,
    /// Partial frames thrown away when the link went down.
    pub rx_aborted: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_full: u64,
    pub tx_dropped: u64,
    /// Handler runs (interrupts taken).
    pub irqs: u64,
    /// Interrupts folded into an earlier handler run.
    pub irqs_coalesced: u64,
    /// `wait` calls that returned at once because work was already there (polling).
    pub polls_ready: u64,
    pub link_changes: u64,
}

enum RxState {
    Idle,
    /// A frame in assembly: its pool chain head and tail and its length so far.
    Assembling {
        head: PktBuf,
        tail: BufId,
        len: usize,
    },
    /// Throwing away the rest of a frame already counted as bad or lost.
    Discarding,
}

struct NicWaker {
    irq: FutexBell,
    woken: Arc<AtomicBool>,
}

impl Wake for NicWaker {
    fn wake(&self) {
        self.woken.store(true, SeqCst);
        // The waker rings the interrupt line's doorbell: moving the line makes a sleeping
        // FUTEX_WAIT return (the handler tells a wake-up from an interrupt by `woken` and
        // an empty status register).
        self.irq.ring();
    }
}

pub struct NicDriver {
    name: String,
    region: Arc<Region>,
    /// The interrupt line: `R_IRQ_SEQ` is its futex word, `R_DRV_SLEEPING` its sleepers.
    irq: FutexBell,
    layout: Layout,
    opts: NicOptions,
    max_frame: usize,
    rx_next: u32,
    /// RX descriptors consumed or stepped over, free-running like `R_RX_HEAD`.
    rx_count: u32,
    rx_state: RxState,
    tx_next: u32,
    tx_clean: u32,
    tx_in_flight: u32,
    want_tx_irq: bool,
    irq_seen: u32,
    woken: Arc<AtomicBool>,
    stats: NicStats,
    records: Vec<IrqRecord>,
    link: Cell<LinkState>,
    link_changes: Cell<u64>,
    last_probe: Cell<u64>,
    path: std::path::PathBuf,
}

/// Liveness probes of the device side are at most this frequent.
const PROBE_NS: u64 = 5_000_000;
/// Longest single sleep, so a device that dies is noticed while waiting.
const SLEEP_SLICE: Duration = Duration::from_millis(10);

impl NicDriver {
    /// Creates the NIC `name` (`/dev/shm/usnet-nic-NAME`) and returns its driver. The
    /// device side (`usnet nicemu --name NAME`) may attach before or after traffic
    /// starts; until it does the link is down.
    pub fn create(name: &str, opts: &NicOptions) -> Result<Self, NicError> {
        if !valid_name(name) {
            return Err(NicError::BadName(name.to_string()));
        }
        if !(68..=MAX_FRAME - 18).contains(&opts.mtu) {
            return Err(NicError::Config(format!(
                "mtu {} outside 68..=65518",
                opts.mtu
            )));
        }
        if opts.napi_budget == 0 {
            return Err(NicError::Config("napi budget must be at least 1".into()));
        }
        let layout = Layout::new(opts.rx_ring, opts.tx_ring, opts.buf_size())?;
        let path = shm_path(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?;
        if !liveness::try_claim(&file, LOCK_DRIVER)? {
            return Err(NicError::Busy(name.to_string()));
        }
        // Zero the old content: a stale file from a dead driver is re-initialised.
        file.set_len(0)?;
        file.set_len(layout.total_len as u64)?;
        // Populated up front: no page fault (and page zeroing) on the first touch of a
        // packet buffer in the middle of a timed run.
        let region = Arc::new(Region::map(file, layout.total_len, Populate::Now)?);
        let r = &region;
        r.u32(R_STATE).store(0, SeqCst);
        r.u32(R_VERSION).store(VERSION, Relaxed);
        r.u32(R_RX_RING).store(layout.rx_ring, Relaxed);
        r.u32(R_TX_RING).store(layout.tx_ring, Relaxed);
        r.u32(R_BUF_SIZE).store(layout.buf_size, Relaxed);
        r.u32(R_MTU).store(opts.mtu as u32, Relaxed);
        let m = opts.mac;
        r.u32(R_MAC_LO)
            .store(u32::from_le_bytes([m[0], m[1], m[2], m[3]]), Relaxed);
        r.u32(R_MAC_HI)
            .store(u32::from_le_bytes([m[4], m[5], 0, 0]), Relaxed);
        r.u64(R_RX_DESC_OFF)
            .store(layout.rx_desc_off as u64, Relaxed);
        r.u64(R_TX_DESC_OFF)
            .store(layout.tx_desc_off as u64, Relaxed);
        r.u64(R_RX_BUF_OFF).store(layout.rx_buf_off as u64, Relaxed);
        r.u64(R_TX_BUF_OFF).store(layout.tx_buf_off as u64, Relaxed);
        r.u64(R_TOTAL_LEN).store(layout.total_len as u64, Relaxed);
        // Every RX descriptor is posted to the device: buffer i in slot i, OWN set.
        for i in 0..layout.rx_ring {
            let d = layout.rx_desc(i);
            r.u32(d + D_BUF).store(i, Relaxed);
            r.u32(d + D_LEN).store(layout.buf_size, Relaxed);
            r.u32(d + D_FLAGS)
                .store(F_OWN | eor(i, layout.rx_ring), Relaxed);
        }
        for i in 0..layout.tx_ring {
            let d = layout.tx_desc(i);
            r.u32(d + D_BUF).store(i, Relaxed);
            r.u32(d + D_FLAGS).store(eor(i, layout.tx_ring), Relaxed);
        }
        r.u32(R_IRQ_MASK).store(0, Relaxed);
        r.u32(R_ITR_NS).store(opts.itr_ns, Relaxed);
        r.u32(R_ITR_PKTS).store(opts.itr_pkts, Relaxed);
        r.u64(R_MAGIC).store(MAGIC, Relaxed);
        r.u32(R_STATE).store(1, Release);
        let irq = FutexBell::new(region.clone(), R_IRQ_SEQ, R_DRV_SLEEPING)?;
        Ok(NicDriver {
            name: name.to_string(),
            region,
            irq,
            layout,
            max_frame: opts.mtu + 18,
            opts: opts.clone(),
            rx_next: 0,
            rx_count: 0,
            rx_state: RxState::Idle,
            tx_next: 0,
            tx_clean: 0,
            tx_in_flight: 0,
            want_tx_irq: false,
            irq_seen: 0,
            woken: Arc::new(AtomicBool::new(false)),
            stats: NicStats::default(),
            records: Vec::with_capacity(opts.record_irqs),
            link: Cell::new(LinkState::Down),
            link_changes: Cell::new(0),
            last_probe: Cell::new(0),
            path,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn nic_stats(&self) -> NicStats {
        let mut s = self.stats;
        s.link_changes = self.link_changes.get();
        s
    }
    /// Frames the device reports it could not place (ring full); read from a device
    /// register, so informational only.
    pub fn device_missed(&self) -> u64 {
        self.region.u64(R_RX_MISSED).load(Relaxed)
    }
    /// Frames the device reports it generated (informational).
    pub fn device_frames(&self) -> u64 {
        self.region.u64(R_DEV_FRAMES).load(Relaxed)
    }
    /// Whether a device side holds its liveness lock right now.
    pub fn device_attached(&self) -> bool {
        liveness::claimed_by_other(self.region.file(), LOCK_DEVICE).unwrap_or(false)
    }

    /// How many device sides have attached over the file's life (one that attached,
    /// did its work and exited still counts).
    pub fn device_attaches(&self) -> u32 {
        self.region.u32(R_ATTACHES).load(Acquire)
    }
    pub fn irq_records(&self) -> &[IrqRecord] {
        &self.records
    }
    pub fn take_irq_records(&mut self) -> Vec<IrqRecord> {
        std::mem::replace(&mut self.records, Vec::with_capacity(self.opts.record_irqs))
    }
    pub fn set_irq_mode(&mut self, m: IrqMode) {
        self.opts.irq_mode = m;
    }
    /// Writes the interrupt moderation registers.
    pub fn set_moderation(&mut self, itr_ns: u32, itr_pkts: u32) {
        self.opts.itr_ns = itr_ns;
        self.opts.itr_pkts = itr_pkts;
        self.region.u32(R_ITR_NS).store(itr_ns, Relaxed);
        self.region.u32(R_ITR_PKTS).store(itr_pkts, Relaxed);
    }
    /// TX descriptors handed to the device and not yet given back.
    pub fn tx_in_flight(&self) -> u32 {
        self.tx_in_flight
    }
    /// Counts of the RX ring: descriptors the device owns right now (all but those
    /// completed and not yet read). A healthy idle ring has all of them.
    pub fn rx_owned_by_device(&self) -> u32 {
        (0..self.layout.rx_ring)
            .filter(|&i| self.flags_rx(i) & F_OWN != 0)
            .count() as u32
    }

    #[inline]
    fn flags_rx(&self, i: u32) -> u32 {
        self.region
            .u32(self.layout.rx_desc(i) + D_FLAGS)
            .load(Acquire)
    }

    /// Whether the next RX descriptor is complete (work for `rx_burst`).
    #[inline]
    fn rx_desc_ready(&self) -> bool {
        let f = self.flags_rx(self.rx_next);
        f & F_OWN == 0 || self.device_skipped()
    }

    /// The device's head register says it moved past `rx_next` although that descriptor
    /// is still marked as the device's: the device skipped it (an OWN-bit bug).
    fn device_skipped(&self) -> bool {
        if self.head_ahead().0 == 0 {
            return false;
        }
        // The device writes a descriptor before the head register: reading the head
        // (acquire) and then the flags again rules out a descriptor completed in between.
        self.flags_rx(self.rx_next) & F_OWN != 0
    }

    /// How many descriptors the device's head register is ahead of `rx_next` (0 when
    /// level or behind), and the count it implies for `rx_next` when the register is
    /// not a plausible count (garbage, or a device side that attached with its own).
    ///
    /// The register counts free-running, so a head read just before the device
    /// published a frame we already consumed reads as behind us (at most a ring), not
    /// as a skip; a ring-modulo register could not tell the two apart.
    fn head_ahead(&self) -> (u32, Option<u32>) {
        let head = self.region.u32(R_RX_HEAD).load(Acquire);
        let ring = self.layout.rx_ring;
        let ahead = head.wrapping_sub(self.rx_count) as i32;
        if (-(ring as i32)..=ring as i32).contains(&ahead) {
            return (ahead.max(0) as u32, None);
        }
        let ahead = (head % ring).wrapping_sub(self.rx_next) % ring;
        (ahead, Some(head.wrapping_sub(ahead)))
    }

    fn step_rx(&mut self) {
        self.rx_count = self.rx_count.wrapping_add(1);
        self.rx_next = self.rx_count % self.layout.rx_ring;
    }

    fn rearm_rx(&self, i: u32) {
        let d = self.layout.rx_desc(i);
        self.region.u32(d + D_BUF).store(i, Relaxed);
        self.region
            .u32(d + D_LEN)
            .store(self.layout.buf_size, Relaxed);
        self.region
            .u32(d + D_FLAGS)
            .store(F_OWN | eor(i, self.layout.rx_ring), Release);
    }

    fn drop_partial(&mut self, pool: &mut PacketPool) {
        if let RxState::Assembling { head, .. } =
            std::mem::replace(&mut self.rx_state, RxState::Idle)
        {
            pool.free(head);
        }
    }

    /// Appends `len` bytes of NIC buffer at `off` to the frame being assembled.
    fn append(&mut self, pool: &mut PacketPool, off: usize, len: usize) -> bool {
        let RxState::Assembling {
            mut tail,
            len: mut flen,
            ..
        } = self.rx_state
        else {
            return false;
        };
        let mut done = 0;
        while done < len {
            let mut room = pool.tailroom(tail);
            if room == 0 {
                let Some(n) = pool.alloc() else {
                    return false;
                };
                // Continuation buffers carry no headroom.
                let h = pool.headroom_of(&n);
                if pool.prepend(&n, h).is_some() {
                    pool.truncate(&n, 0);
                }
                let id = n.id();
                pool.set_next(tail, Some(n));
                tail = id;
                room = pool.tailroom(tail);
            }
            let take = room.min(len - done);
            let dst = pool.append(tail, take).expect("tailroom checked");
            self.region
                .read(off + done, dst)
                .expect("NIC buffers lie inside the mapping (layout checked at create)");
            done += take;
        }
        flen += len;
        if let RxState::Assembling {
            tail: t, len: l, ..
        } = &mut self.rx_state
        {
            *t = tail;
            *l = flen;
        }
        true
    }

    fn rx_one_desc(&mut self, pool: &mut PacketPool, out: &mut Vec<PktBuf>) -> bool {
        let i = self.rx_next;
        let d = self.layout.rx_desc(i);
        let flags = self.region.u32(d + D_FLAGS).load(Acquire);
        if flags & F_OWN != 0 {
            if !self.device_skipped() {
                return false;
            }
            if let (_, Some(count)) = self.head_ahead() {
                self.rx_count = count; // resynchronise with an implausible register
            }
            // Skipped by the device: the descriptor stays posted; move past it.
            self.stats.rx_bad_own += 1;
            if matches!(self.rx_state, RxState::Assembling { .. }) {
                self.drop_partial(pool);
                self.rx_state = RxState::Discarding;
            }
            self.step_rx();
            return true;
        }
        self.stats.rx_descs += 1;
        let buf = self.region.u32(d + D_BUF).load(Relaxed);
        let len = self.region.u32(d + D_LEN).load(Relaxed) as usize;
        let (fs, ls) = (flags & F_FS != 0, flags & F_LS != 0);
        let bad = if buf != i || self.layout.rx_buf(buf).is_none() {
            Some(&mut self.stats.rx_bad_index)
        } else if len == 0 || len > self.layout.buf_size as usize {
            Some(&mut self.stats.rx_bad_len)
        } else if flags & F_ERR != 0 {
            Some(&mut self.stats.rx_dev_err)
        } else {
            None
        };
        if let Some(counter) = bad {
            *counter += 1;
            self.drop_partial(pool);
            self.rx_state = if ls {
                RxState::Idle
            } else {
                RxState::Discarding
            };
        } else {
            let off = self.layout.rx_buf(i).expect("checked");
            if fs {
                match self.rx_state {
                    RxState::Assembling { .. } => {
                        self.stats.rx_bad_flags += 1; // a frame without its last segment
                        self.drop_partial(pool);
                    }
                    RxState::Discarding | RxState::Idle => {}
                }
                match pool.alloc() {
                    Some(b) => {
                        self.rx_state = RxState::Assembling {
                            tail: b.id(),
                            head: b,
                            len: 0,
                        }
                    }
                    None => {
                        self.stats.rx_no_buffer += 1;
                        self.rx_state = RxState::Discarding;
                    }
                }
            } else if matches!(self.rx_state, RxState::Idle) {
                self.stats.rx_bad_flags += 1; // a continuation with no frame open
                self.rx_state = RxState::Discarding;
            }
            if let RxState::Assembling { len: flen, .. } = self.rx_state {
                if flen + len > self.max_frame {
                    self.stats.rx_bad_len += 1;
                    self.drop_partial(pool);
                    self.rx_state = RxState::Discarding;
                } else if !self.append(pool, off, len) {
                    self.stats.rx_no_buffer += 1;
                    self.drop_partial(pool);
                    self.rx_state = RxState::Discarding;
                }
            }
            if ls {
                match std::mem::replace(&mut self.rx_state, RxState::Idle) {
                    RxState::Assembling { head, len, .. } => {
                        if len < MIN_FRAME {
                            self.stats.rx_bad_len += 1;
                            pool.free(head);
                        } else {
                            self.stats.rx_frames += 1;
                            self.stats.rx_bytes += len as u64;
                            out.push(head);
                        }
                    }
                    RxState::Discarding | RxState::Idle => {}
                }
            }
        }
        // Refill: the same buffer goes back to the device.
        self.rearm_rx(i);
        self.step_rx();
        true
    }

    fn reclaim_tx(&mut self) {
        while self.tx_in_flight > 0 {
            let d = self.layout.tx_desc(self.tx_clean);
            if self.region.u32(d + D_FLAGS).load(Acquire) & F_OWN != 0 {
                break;
            }
            self.tx_clean = (self.tx_clean + 1) % self.layout.tx_ring;
            self.tx_in_flight -= 1;
        }
    }

    fn probe_link(&self, force: bool) -> LinkState {
        let now = now_ns();
        if !force && now.saturating_sub(self.last_probe.get()) < PROBE_NS {
            return self.link.get();
        }
        self.last_probe.set(now);
        let up = self.device_attached() && self.region.u32(R_LINK).load(Acquire) == 1;
        let st = if up { LinkState::Up } else { LinkState::Down };
        if st != self.link.get() {
            self.link.set(st);
            self.link_changes.set(self.link_changes.get() + 1);
        }
        st
    }

    fn irq_mask_value(&self) -> u32 {
        let mut m = IRQ_RX | IRQ_LINK | IRQ_RX_NOBUF;
        if self.want_tx_irq {
            m |= IRQ_TX;
        }
        m
    }

    /// The interrupt handler: runs when the line moved.
    fn handler(&mut self, seq: u32) {
        let handled_ns = now_ns();
        self.region.u32(R_IRQ_MASK).store(0, SeqCst); // NAPI: poll with interrupts off
        let status = self.region.u32(R_IRQ_STATUS).swap(0, SeqCst);
        let woken = self.woken.swap(false, SeqCst);
        let moved = seq.wrapping_sub(self.irq_seen);
        self.irq_seen = seq;
        if status == 0 && woken {
            return; // a wake-up from our own waker, not an interrupt
        }
        if status & IRQ_LINK != 0 {
            self.probe_link(true);
        }
        self.stats.irqs += 1;
        self.stats.irqs_coalesced += moved.saturating_sub(1) as u64;
        if self.records.len() < self.opts.record_irqs {
            let raised_ns = self
                .region
                .u64(R_IRQ_LOG + 8 * (seq as usize % IRQ_LOG_LEN))
                .load(Relaxed);
            self.records.push(IrqRecord {
                seq,
                raised_ns,
                handled_ns,
                coalesced: moved.max(1),
            });
        }
    }
}

fn eor(i: u32, ring: u32) -> u32 {
    if i + 1 == ring {
        F_EOR
    } else {
        0
    }
}

impl Drop for NicDriver {
    fn drop(&mut self) {
        self.region.u32(R_IRQ_MASK).store(0, SeqCst);
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Device for NicDriver {
    fn name(&self) -> &str {
        &self.name
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.opts.mtu,
            rx_csum_offload: false,
            tx_csum_offload: false,
            tso: false,
            max_burst: self.opts.napi_budget,
        }
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        // Woken from a loop's shared wait (`prepare_wait`), not from `wait`: the line
        // moved since we armed it, so the handler runs here.
        let line = self.irq.word().load(SeqCst);
        if line != self.irq_seen {
            self.handler(line);
        }
        let before = out.len();
        let budget = max.min(self.opts.napi_budget);
        // Descriptors are bounded too, so a device that fills the ring with garbage cannot
        // keep one call busy forever.
        let mut descs = 0;
        while out.len() - before < budget && descs < self.layout.rx_ring {
            if !self.rx_one_desc(pool, out) {
                break;
            }
            descs += 1;
        }
        if descs > 0 {
            self.region.u32(R_RX_TAIL).store(self.rx_next, Release);
        }
        if self.link.get() == LinkState::Down && matches!(self.rx_state, RxState::Assembling { .. })
        {
            // A device that died mid-frame: nothing will finish it.
            if !self.device_attached() {
                self.stats.rx_aborted += 1;
                self.drop_partial(pool);
            }
        }
        Ok(out.len() - before)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> std::io::Result<usize> {
        self.reclaim_tx();
        let ring = self.layout.tx_ring;
        let bs = self.layout.buf_size as usize;
        let mut sent = 0;
        while let Some(f) = frames.front() {
            let len = pool.chain_len(f);
            if !(MIN_FRAME..=self.max_frame).contains(&len) {
                self.stats.tx_dropped += 1;
                let f = frames.pop_front().expect("looked at it");
                pool.free(f);
                continue;
            }
            let segs = len.div_ceil(bs) as u32;
            // One descriptor always stays free, so a full ring (tail == head) is never
            // mistaken by the device for an empty one.
            if ring - 1 - self.tx_in_flight < segs {
                self.stats.tx_full += 1;
                self.want_tx_irq = true;
                break;
            }
            // Copy the chain into consecutive TX buffers.
            let first = self.tx_next;
            let mut slot = first;
            let mut filled = 0usize;
            for mut data in pool.parts(f) {
                while !data.is_empty() {
                    let at = filled % bs;
                    let take = (bs - at).min(data.len());
                    let off = self.layout.tx_buf(slot).expect("slot < ring") + at;
                    self.region
                        .write(off, &data[..take])
                        .expect("NIC buffers lie inside the mapping (layout checked at create)");
                    data = &data[take..];
                    filled += take;
                    if filled / bs * bs == filled && filled < len {
                        slot = (slot + 1) % ring;
                    }
                }
            }
            // Descriptors: the first one is handed over last so the device never sees
            // half a frame.
            for k in (0..segs).rev() {
                let s = (first + k) % ring;
                let d = self.layout.tx_desc(s);
                let seg_len = if k + 1 == segs {
                    len - bs * k as usize
                } else {
                    bs
                };
                let mut fl = F_OWN | eor(s, ring);
                if k == 0 {
                    fl |= F_FS;
                }
                if k + 1 == segs {
                    fl |= F_LS;
                }
                self.region.u32(d + D_BUF).store(s, Relaxed);
                self.region.u32(d + D_LEN).store(seg_len as u32, Relaxed);
                self.region.u32(d + D_FLAGS).store(fl, Release);
            }
            self.tx_next = (first + segs) % ring;
            self.tx_in_flight += segs;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
            let f = frames.pop_front().expect("sent it");
            pool.free(f);
            sent += 1;
        }
        if sent > 0 {
            // The doorbell: the device polls the tail register.
            self.region.u32(R_TX_TAIL).store(self.tx_next, Release);
            if self.tx_in_flight < ring / 2 {
                self.want_tx_irq = false;
            }
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        let start = now_ns();
        let deadline = timeout.map(|t| start.saturating_add(t.as_nanos() as u64));
        if self.rx_desc_ready() {
            self.stats.polls_ready += 1;
            return Ok(());
        }
        let line = self.irq.word();
        let link_before = self.probe_link(false);
        // Re-enable interrupts (NAPI complete), acknowledge stale causes, then look at the
        // ring once more: a frame placed while interrupts were off raised nothing.
        let seen = line.load(SeqCst);
        self.irq_seen = seen;
        self.region.u32(R_IRQ_STATUS).swap(0, SeqCst);
        self.region
            .u32(R_IRQ_MASK)
            .store(self.irq_mask_value(), SeqCst);
        fence(SeqCst);
        if self.rx_desc_ready() {
            self.region.u32(R_IRQ_MASK).store(0, SeqCst);
            self.stats.polls_ready += 1;
            return Ok(());
        }
        let spin_until = match self.opts.irq_mode {
            IrqMode::Spin => u64::MAX,
            IrqMode::Futex => 0,
            IrqMode::Hybrid { spin_ns } => start.saturating_add(spin_ns),
        };
        let mut n = 0u32;
        let mut now = start;
        loop {
            if n & 63 == 0 {
                now = now_ns();
                if deadline.is_some_and(|d| now >= d) || self.probe_link(false) != link_before {
                    break;
                }
            }
            n = n.wrapping_add(1);
            let cur = line.load(SeqCst);
            if cur != seen {
                self.handler(cur);
                return Ok(());
            }
            if self.woken.swap(false, SeqCst) {
                return Ok(());
            }
            if now < spin_until {
                std::hint::spin_loop();
                continue;
            }
            // Sleep on the line, announced in R_DRV_SLEEPING so the device FUTEX_WAKEs
            // us (usnet_shm's Gate: announce, fence, re-check, sleep).
            let remain = deadline.map_or(SLEEP_SLICE, |d| {
                Duration::from_nanos(d.saturating_sub(now)).min(SLEEP_SLICE)
            });
            if remain.is_zero() {
                break;
            }
            let woken = &self.woken;
            self.irq.sleep(
                seen,
                || line.load(SeqCst) != seen || woken.load(SeqCst),
                remain,
            );
            n = 0;
        }
        self.region.u32(R_IRQ_MASK).store(0, SeqCst);
        Ok(())
    }

    fn wait_kind(&self) -> crate::WaitKind {
        crate::WaitKind::Bell
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        if self.rx_desc_ready() {
            self.stats.polls_ready += 1;
            return crate::WaitPlan::ready();
        }
        // As `wait` does: re-enable interrupts (NAPI complete), acknowledge stale
        // causes, look at the ring once more; the line's `seq` is read first, so an
        // interrupt raised after this look ends the sleep.
        let seen = self.irq.word().load(SeqCst);
        self.irq_seen = seen;
        self.region.u32(R_IRQ_STATUS).swap(0, SeqCst);
        self.region
            .u32(R_IRQ_MASK)
            .store(self.irq_mask_value(), SeqCst);
        fence(SeqCst);
        if self.rx_desc_ready() {
            self.region.u32(R_IRQ_MASK).store(0, SeqCst);
            self.stats.polls_ready += 1;
            return crate::WaitPlan::ready();
        }
        let mut plan = crate::WaitPlan::bell(self.irq.clone(), seen);
        plan.within = Some(SLEEP_SLICE);
        plan
    }

    fn rx_ready(&mut self) -> bool {
        self.rx_desc_ready()
    }

    fn waker(&self) -> Waker {
        Arc::new(NicWaker {
            irq: self.irq.clone(),
            woken: self.woken.clone(),
        })
    }

    fn link_state(&self) -> LinkState {
        self.probe_link(false)
    }

    fn stats(&self) -> DeviceStats {
        let s = &self.stats;
        DeviceStats {
            rx_frames: s.rx_frames,
            rx_bytes: s.rx_bytes,
            tx_frames: s.tx_frames,
            tx_bytes: s.tx_bytes,
            rx_no_buffer: s.rx_no_buffer,
            rx_errors: s.rx_bad_len + s.rx_bad_index + s.rx_bad_flags + s.rx_bad_own + s.rx_dev_err,
            tx_full: s.tx_full,
            tx_dropped: s.tx_dropped,
            // The device side counts the frames it found no RX descriptor for
            // (`DevCounters::missed`, in the emulator's own process).
            rx_ring_drops: 0,
        }
    }
}
