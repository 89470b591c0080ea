//! The device side: what the NIC hardware would do, played by another process (or, in
//! tests, another thread). It places frames in the buffers the driver posted, completes
//! the descriptors, raises the interrupt line, consumes the TX ring, and misbehaves on
//! request (fault injection).

use std::fs::OpenOptions;
use std::sync::atomic::{fence, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

use usnet_link::nic::layout::*;
use usnet_link::nic::NicError;
use usnet_shm::{liveness, FutexBell, Populate, Region};

use crate::frame::UdpTemplate;
use crate::sys::now_ns;

/// What the device does with frames the driver transmits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TxMode {
    /// Count them.
    Count,
    /// Check their IPv4 and UDP checksums and lengths.
    Verify,
    /// Put them back on the RX ring unchanged.
    Loopback,
    /// Put them back on the RX ring as replies (MACs, addresses, ports swapped).
    Echo,
}

/// What the device does when the next RX descriptor is not its own (ring full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RingFullPolicy {
    /// Count the frame as missed and drop it, like hardware.
    Drop,
    /// Wait for the driver (flow control; lossless functional tests).
    Wait,
}

/// The device side's counters. Invariant for generated traffic:
/// `generated + duplicated == placed_gen + dropped_fault + dropped_link_down + missed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DevCounters {
    pub generated: u64,
    /// Frames placed on the RX ring (generated ones, duplicates and looped-back ones).
    pub placed: u64,
    pub placed_gen: u64,
    pub placed_bytes: u64,
    pub missed: u64,
    pub dropped_fault: u64,
    pub dropped_link_down: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub bursts: u64,
    pub link_flaps: u64,
    pub injected_bad_len: u64,
    pub injected_bad_index: u64,
    pub injected_bad_flags: u64,
    pub injected_own_skip: u64,
    pub irqs_raised: u64,
    /// Causes that found the interrupt masked (latched in the status register only).
    pub irqs_masked: u64,
    pub futex_wakes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    pub tx_verify_ok: u64,
    pub tx_verify_bad: u64,
    pub tx_looped: u64,
    /// TX descriptors the driver wrote wrongly (bad length or first/last bits).
    pub tx_bad_desc: u64,
}

/// One attached device side.
pub struct DeviceSide {
    region: Arc<Region>,
    /// The interrupt line: `R_IRQ_SEQ` is its futex word, `R_DRV_SLEEPING` its sleepers.
    irq: FutexBell,
    layout: Layout,
    /// Next RX descriptor to fill (`rx_count % ring`).
    rx_head: u32,
    /// RX descriptors completed or skipped, free-running (the `R_RX_HEAD` register).
    rx_count: u32,
    tx_head: u32,
    /// The driver's MAC, read from the config block (destination of generated frames).
    pub driver_mac: [u8; 6],
    pub mtu: usize,
    pub counters: DevCounters,
    pub tx_mode: TxMode,
    pub ring_policy: RingFullPolicy,
    last_raise: u64,
    pending_rx: u32,
    first_pending: u64,
    tx_frame: Vec<u8>,
    last_alive_check: u64,
}

/// Fallback moderation timer when only a packet threshold is set.
const ITR_TIMER_NS: u64 = 50_000;

/// Opens the NIC file the driver created and maps all of it (populated, so no page
/// fault in a timed run).
fn open_region(path: &std::path::Path) -> std::io::Result<Region> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    if len < PAGE as u64 || len > (1u64 << 36) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad NIC file size",
        ));
    }
    Region::map(file, len as usize, Populate::Now)
}

/// Copies `bytes` into a NIC buffer: the offsets come from a descriptor whose buffer
/// index was checked against the layout, which was checked against the mapping.
fn put(r: &Region, off: usize, bytes: &[u8]) {
    r.write(off, bytes)
        .expect("NIC buffers lie inside the mapping (layout checked at attach)");
}

/// Flips the bits of one byte in place (fault injection: corrupt a placed frame).
fn xor_byte(r: &Region, off: usize, mask: u8) {
    let mut b = [0u8];
    if r.read(off, &mut b).is_ok() {
        put(r, off, &[b[0] ^ mask]);
    }
}

impl DeviceSide {
    /// Attaches to NIC `name`, waiting up to `wait` for the driver to create it.
    pub fn attach(name: &str, wait: Duration) -> Result<DeviceSide, NicError> {
        if !valid_name(name) {
            return Err(NicError::BadName(name.to_string()));
        }
        let path = shm_path(name);
        let deadline = now_ns() + wait.as_nanos() as u64;
        let region = loop {
            match open_region(&path) {
                Ok(r)
                    if r.u64(R_MAGIC).load(Relaxed) == MAGIC
                        && r.u32(R_STATE).load(Acquire) == 1 =>
                {
                    break r
                }
                Ok(_) | Err(_) if now_ns() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Ok(_) => return Err(NicError::NotReady(name.to_string())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(NicError::NotFound(name.to_string()))
                }
                Err(e) => return Err(NicError::Io(e)),
            }
        };
        if region.u32(R_VERSION).load(Relaxed) != VERSION {
            return Err(NicError::Config("layout version mismatch".into()));
        }
        let offs = [
            R_RX_DESC_OFF,
            R_TX_DESC_OFF,
            R_RX_BUF_OFF,
            R_TX_BUF_OFF,
            R_TOTAL_LEN,
        ]
        .map(|o| region.u64(o).load(Relaxed));
        let layout = Layout::validate_read(
            region.u32(R_RX_RING).load(Relaxed),
            region.u32(R_TX_RING).load(Relaxed),
            region.u32(R_BUF_SIZE).load(Relaxed),
            offs,
            region.len(),
        )?;
        if !liveness::try_claim(region.file(), LOCK_DEVICE)? {
            return Err(NicError::Busy(name.to_string()));
        }
        if !liveness::claimed_by_other(region.file(), LOCK_DRIVER)? {
            return Err(NicError::DriverGone);
        }
        let lo = region.u32(R_MAC_LO).load(Relaxed).to_le_bytes();
        let hi = region.u32(R_MAC_HI).load(Relaxed).to_le_bytes();
        let mtu = (region.u32(R_MTU).load(Relaxed) as usize).clamp(68, MAX_FRAME - 18);
        // Resume where an earlier device side stopped (its head registers persist).
        let rx_count = region.u32(R_RX_HEAD).load(Relaxed);
        let rx_head = rx_count % layout.rx_ring;
        let tx_head = region.u32(R_TX_HEAD).load(Relaxed) % layout.tx_ring;
        region.u32(R_ATTACHES).fetch_add(1, Relaxed);
        let region = Arc::new(region);
        let irq = FutexBell::new(region.clone(), R_IRQ_SEQ, R_DRV_SLEEPING)?;
        let mut d = DeviceSide {
            region,
            irq,
            layout,
            rx_head,
            rx_count,
            tx_head,
            driver_mac: [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1]],
            mtu,
            counters: DevCounters::default(),
            tx_mode: TxMode::Count,
            ring_policy: RingFullPolicy::Drop,
            last_raise: 0,
            pending_rx: 0,
            first_pending: 0,
            tx_frame: Vec::new(),
            last_alive_check: now_ns(),
        };
        d.set_link(true);
        Ok(d)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Carrier up or down, announced with a link interrupt.
    pub fn set_link(&mut self, up: bool) {
        self.region.u32(R_LINK).store(up as u32, SeqCst);
        self.raise(IRQ_LINK, now_ns());
    }

    /// Whether the driver still lives (checked at most every 10 ms unless `force`).
    pub fn driver_alive(&mut self, now: u64, force: bool) -> bool {
        if !force && now.saturating_sub(self.last_alive_check) < 10_000_000 {
            return true;
        }
        self.last_alive_check = now;
        liveness::claimed_by_other(self.region.file(), LOCK_DRIVER).unwrap_or(false)
    }

    #[inline]
    fn rx_flags(&self, i: u32) -> &std::sync::atomic::AtomicU32 {
        self.region.u32(self.layout.rx_desc(i) + D_FLAGS)
    }

    /// Whether `n` descriptors from the head are posted to the device.
    fn rx_room(&self, n: u32) -> bool {
        n <= self.layout.rx_ring
            && (0..n).all(|k| self.rx_flags(self.rx_head + k).load(Acquire) & F_OWN != 0)
    }

    /// Waits (policy `Wait`) or not (`Drop`) for `segs` free descriptors.
    fn room_for(&mut self, segs: u32) -> Result<bool, NicError> {
        if self.rx_room(segs) {
            return Ok(true);
        }
        if self.ring_policy == RingFullPolicy::Drop || segs > self.layout.rx_ring {
            return Ok(false);
        }
        loop {
            let now = now_ns();
            self.try_raise(now);
            if self.rx_room(segs) {
                return Ok(true);
            }
            if !self.driver_alive(now, false) {
                return Err(NicError::DriverGone);
            }
            std::hint::spin_loop();
        }
    }

    fn count_missed(&mut self) {
        self.counters.missed += 1;
        self.region.u64(R_RX_MISSED).fetch_add(1, Relaxed);
        self.status(IRQ_RX_NOBUF);
    }

    /// Places one frame of `len` bytes; `fill(region, frame_off, buf_off, n)` writes the
    /// bytes `frame_off..frame_off + n` of the frame at `buf_off` of the shared mapping.
    /// Returns false (frame missed) when the ring has no room.
    pub fn place_with(
        &mut self,
        len: usize,
        mut fill: impl FnMut(&Region, usize, usize, usize),
    ) -> Result<bool, NicError> {
        let bs = self.layout.buf_size as usize;
        let segs = len.div_ceil(bs).max(1) as u32;
        if !self.room_for(segs)? {
            self.count_missed();
            return Ok(false);
        }
        let ring = self.layout.rx_ring;
        let mut done = 0;
        for k in 0..segs {
            let i = (self.rx_head + k) % ring;
            let d = self.layout.rx_desc(i);
            // The driver's buffer index is not trusted either.
            let b = self.region.u32(d + D_BUF).load(Relaxed);
            let Some(off) = self.layout.rx_buf(b) else {
                // A driver bug: give the descriptor back flagged as an error.
                self.complete_rx(i, 0, F_FS | F_LS | F_ERR);
                self.advance_rx(k + 1);
                self.count_missed();
                return Ok(false);
            };
            let n = (len - done).min(bs);
            fill(&self.region, done, off, n);
            let mut fl = 0;
            if k == 0 {
                fl |= F_FS;
            }
            if k + 1 == segs {
                fl |= F_LS;
            }
            self.complete_rx(i, n as u32, fl);
            done += n;
        }
        self.advance_rx(segs);
        self.counters.placed += 1;
        self.counters.placed_bytes += len as u64;
        Ok(true)
    }

    fn complete_rx(&self, i: u32, len: u32, flags: u32) {
        let d = self.layout.rx_desc(i);
        self.region.u32(d + D_LEN).store(len, Relaxed);
        let eor = self.region.u32(d + D_FLAGS).load(Relaxed) & F_EOR;
        self.region.u32(d + D_FLAGS).store(flags | eor, Release);
    }

    /// Places generated frame `seq` from a template; `corrupt` flips a payload byte.
    pub fn place_generated(
        &mut self,
        t: &UdpTemplate,
        seq: u64,
        corrupt: bool,
    ) -> Result<bool, NicError> {
        let (s, c) = t.stamp(seq);
        let len = t.len();
        let ok = self.place_with(len, |r, foff, boff, n| {
            put(r, boff, &t.frame[foff..foff + n]);
            let patch = |at: usize, bytes: &[u8]| {
                if at >= foff && at + bytes.len() <= foff + n {
                    put(r, boff + at - foff, bytes);
                }
            };
            patch(crate::frame::SEQ_OFF, &s);
            patch(crate::frame::ETH_HDR + crate::frame::IP_HDR + 6, &c);
            if corrupt && foff + n == len {
                xor_byte(r, boff + n - 1, 0x5a);
            }
        })?;
        if ok {
            self.counters.placed_gen += 1;
            if corrupt {
                self.counters.corrupted += 1;
            }
        }
        Ok(ok)
    }

    /// Places a frame given as bytes (TX loopback/echo).
    pub fn place_bytes(&mut self, frame: &[u8]) -> Result<bool, NicError> {
        self.place_with(frame.len(), |r, foff, boff, n| {
            put(r, boff, &frame[foff..foff + n])
        })
    }

    /// Fault: completes one descriptor with a length larger than its buffer.
    pub fn inject_bad_len(&mut self) -> Result<bool, NicError> {
        self.inject(|s, i| s.complete_rx(i, s.layout.buf_size + 1 + (i % 7), F_FS | F_LS))
            .inspect(|&ok| s_count(ok, &mut self.counters.injected_bad_len))
    }

    /// Fault: completes one descriptor naming a buffer index out of range.
    pub fn inject_bad_index(&mut self) -> Result<bool, NicError> {
        self.inject(|s, i| {
            let d = s.layout.rx_desc(i);
            s.region
                .u32(d + D_BUF)
                .store(s.layout.rx_ring + 3 + i, Relaxed);
            s.complete_rx(i, 64, F_FS | F_LS);
        })
        .inspect(|&ok| s_count(ok, &mut self.counters.injected_bad_index))
    }

    /// Fault: completes one descriptor as a last segment with no first one.
    pub fn inject_bad_flags(&mut self) -> Result<bool, NicError> {
        self.inject(|s, i| s.complete_rx(i, 64, F_LS))
            .inspect(|&ok| s_count(ok, &mut self.counters.injected_bad_flags))
    }

    /// Fault (OWN game): skips one descriptor, leaving it marked as the device's while
    /// the head register moves past it.
    pub fn inject_own_skip(&mut self) -> Result<bool, NicError> {
        self.inject(|_, _| {})
            .inspect(|&ok| s_count(ok, &mut self.counters.injected_own_skip))
    }

    /// Moves past `n` descriptors (all written) and publishes the count: the driver
    /// tells a skipped descriptor from a head register it read just before this store
    /// only because the count runs free instead of wrapping at the ring size.
    fn advance_rx(&mut self, n: u32) {
        self.rx_count = self.rx_count.wrapping_add(n);
        self.rx_head = self.rx_count % self.layout.rx_ring;
        self.region.u32(R_RX_HEAD).store(self.rx_count, Release);
    }

    fn inject(&mut self, f: impl FnOnce(&Self, u32)) -> Result<bool, NicError> {
        if !self.room_for(1)? {
            return Ok(false);
        }
        let i = self.rx_head;
        f(self, i);
        self.advance_rx(1);
        Ok(true)
    }

    /// Latches interrupt causes without raising.
    fn status(&self, bits: u32) {
        self.region.u32(R_IRQ_STATUS).fetch_or(bits, SeqCst);
    }

    /// Notes `n` received frames for the RX interrupt, honouring moderation.
    pub fn rx_done(&mut self, n: u32, now: u64) {
        if n == 0 {
            return;
        }
        self.status(IRQ_RX);
        if self.pending_rx == 0 {
            self.first_pending = now;
        }
        self.pending_rx += n;
        self.try_raise(now);
    }

    /// Raises a pending RX interrupt when moderation allows (called from idle loops).
    pub fn try_raise(&mut self, now: u64) {
        if self.pending_rx == 0 {
            return;
        }
        let itr_ns = self.region.u32(R_ITR_NS).load(Relaxed) as u64;
        let itr_pkts = self.region.u32(R_ITR_PKTS).load(Relaxed).max(1);
        let gap_ok = itr_ns == 0 || now.saturating_sub(self.last_raise) >= itr_ns;
        let timer = if itr_ns > 0 { itr_ns } else { ITR_TIMER_NS };
        let expired = now.saturating_sub(self.first_pending) >= timer;
        if (self.pending_rx >= itr_pkts && gap_ok) || expired {
            self.pending_rx = 0;
            self.raise(IRQ_RX, now);
        }
    }

    /// Sets cause bits and, if the driver has them unmasked, moves the interrupt line.
    /// Returns whether the line moved.
    pub fn raise(&mut self, bits: u32, now: u64) -> bool {
        self.status(bits);
        fence(SeqCst);
        if self.region.u32(R_IRQ_MASK).load(SeqCst) & bits == 0 {
            self.counters.irqs_masked += 1;
            return false;
        }
        let seq = self.irq.word().load(Relaxed).wrapping_add(1);
        // The raise time goes in the log before the line moves, so the handler finds it.
        self.region
            .u64(R_IRQ_LOG + 8 * (seq as usize % IRQ_LOG_LEN))
            .store(now, Relaxed);
        // The line moves always; the driver is woken only if it announced a sleep.
        if self.irq.bump_and_notify() {
            self.counters.futex_wakes += 1;
        }
        self.last_raise = now;
        self.counters.irqs_raised += 1;
        true
    }

    /// Consumes what the driver put on the TX ring. Returns frames consumed.
    pub fn service_tx(&mut self) -> Result<usize, NicError> {
        let ring = self.layout.tx_ring;
        let tail = self.region.u32(R_TX_TAIL).load(Acquire);
        if tail >= ring || tail == self.tx_head {
            return Ok(0);
        }
        let bs = self.layout.buf_size as usize;
        let mut frames = 0;
        let mut frame = std::mem::take(&mut self.tx_frame);
        while self.tx_head != tail {
            // Gather one frame: descriptors from FS to LS.
            frame.clear();
            let mut i = self.tx_head;
            let mut ok = true;
            let mut complete = false;
            let mut used = 0;
            while used < ring {
                let d = self.layout.tx_desc(i);
                let fl = self.region.u32(d + D_FLAGS).load(Acquire);
                if fl & F_OWN == 0 {
                    break; // not handed over (yet)
                }
                let len = self.region.u32(d + D_LEN).load(Relaxed) as usize;
                let b = self.region.u32(d + D_BUF).load(Relaxed);
                if (used == 0) != (fl & F_FS != 0) || len == 0 || len > bs {
                    ok = false;
                }
                if let (true, Some(off)) = (ok, self.layout.tx_buf(b)) {
                    let at = frame.len();
                    if at + len <= MAX_FRAME {
                        frame.resize(at + len, 0);
                        self.region.read(off, &mut frame[at..]).expect(
                            "NIC buffers lie inside the mapping (layout checked at attach)",
                        );
                    } else {
                        ok = false;
                    }
                } else {
                    ok = false;
                }
                used += 1;
                i = (i + 1) % ring;
                if fl & F_LS != 0 {
                    complete = true;
                    break;
                }
            }
            if !complete {
                break; // wait for the rest (or a broken ring: the driver's problem)
            }
            // Give the descriptors back: OWN cleared.
            for k in 0..used {
                let d = self.layout.tx_desc(self.tx_head + k);
                let fl = self.region.u32(d + D_FLAGS).load(Relaxed);
                self.region.u32(d + D_FLAGS).store(fl & !F_OWN, Release);
            }
            self.tx_head = i;
            frames += 1;
            if !ok {
                self.counters.tx_bad_desc += 1;
                continue;
            }
            self.counters.tx_frames += 1;
            self.counters.tx_bytes += frame.len() as u64;
            match self.tx_mode {
                TxMode::Count => {}
                TxMode::Verify => {
                    if crate::frame::verify_udp4(&frame) {
                        self.counters.tx_verify_ok += 1
                    } else {
                        self.counters.tx_verify_bad += 1
                    }
                }
                TxMode::Loopback | TxMode::Echo => {
                    if self.tx_mode == TxMode::Echo {
                        crate::frame::echo_swap(&mut frame);
                    }
                    if self.place_bytes(&frame)? {
                        self.counters.tx_looped += 1;
                        self.rx_done(1, now_ns());
                    }
                }
            }
        }
        self.tx_frame = frame;
        if frames > 0 {
            self.region.u32(R_TX_HEAD).store(self.tx_head, Release);
            self.raise(IRQ_TX, now_ns());
        }
        Ok(frames)
    }

    /// A buggy device: writes RX descriptor `i` with arbitrary words and moves the head
    /// register to `head` (both unchecked). For robustness tests.
    pub fn write_rx_desc_raw(&mut self, i: u32, buf: u32, len: u32, flags: u32, head: u32) {
        let d = self.layout.rx_desc(i);
        self.region.u32(d + D_BUF).store(buf, Relaxed);
        self.region.u32(d + D_LEN).store(len, Relaxed);
        self.region.u32(d + D_FLAGS).store(flags, Release);
        self.region.u32(R_RX_HEAD).store(head, Release);
        self.rx_count = head;
        self.rx_head = head % self.layout.rx_ring;
    }

    /// Publishes the generated-frame count in its register (informational for the driver).
    pub fn publish_generated(&self, n: u64) {
        self.region.u64(R_DEV_FRAMES).store(n, Relaxed);
    }

    /// Device side stops cleanly: carrier down (the lock goes when `self` drops).
    /// Returns the final counters (including the link-down interrupt).
    pub fn detach(mut self) -> DevCounters {
        self.set_link(false);
        self.counters
    }
}

fn s_count(ok: bool, c: &mut u64) {
    if ok {
        *c += 1;
    }
}
