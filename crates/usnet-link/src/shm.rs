//! The shared-memory Ethernet: a point-to-point link between two unprivileged processes
//! through one file in `/dev/shm`.
//!
//! # Layout of `/dev/shm/usnet-shm-NAME` (version 2)
//!
//! ```text
//! 0      header page (4096 bytes)
//!          0  magic "usnetshm" (u64, written last by the initialiser)
//!          8  version u32 · 12 mtu u32 · 16 slot size u32 · 20 slot count u32
//!        128  side A {pid i32 (informational), claimed u32, generation u32}
//!        256  side B {pid i32 (informational), claimed u32, generation u32}
//!        512  ring 0 (A→B) control · 1024 ring 1 (B→A) control, each:
//!               +0   head: producer index (written only by the producer)
//!               +128 tail: consumer index (written only by the consumer)
//!               +256 seq: the doorbell the consumer sleeps on · +260 sleepers
//! 4096   ring 0 slots, then ring 1 slots: `count` slots of `slot size` bytes, each
//!        {len: u32, flags: u32, frame bytes}
//! ```
//!
//! Each direction is a single-producer single-consumer ring; its indices, their
//! ownership and their memory ordering (one Release store per burst, an Acquire load
//! before reading or overwriting slots, cached copies of the other side's index) are
//! `usnet_shm::spsc`'s. Slot contents are copied with `Region::read`/`write`, so no
//! reference into the shared bytes is ever held.
//!
//! # Wake-ups without lost wake-ups
//! A consumer about to sleep announces itself on its ring's doorbell (`sleepers`),
//! fences, re-checks the ring and sleeps on `seq`; a producer publishes its head,
//! fences, and rings only if a consumer announced itself. This is
//! `usnet_shm::doorbell::Gate`, where the argument that no wake-up is lost is written
//! out. The futex is shared (not FUTEX_PRIVATE) because the word lives in a file mapping
//! used by two processes. The consumer sleeps in slices of at most 200 ms and checks
//! between slices whether the peer is still alive, so a peer that died is noticed within
//! ~0.2 s.
//!
//! # Sides, claims and liveness
//! Opening takes a lock on byte 2 of the file (an open-file-description lock, waited for
//! at most 5 s) for the whole open (and close), so two simultaneous first openers cannot
//! both initialise it. The first opener initialises the file and becomes side A, the
//! next one side B. A side is held by a live process while its `claimed` word is set
//! *and* its owner holds the OFD lock on the side's byte of the file (byte 0 for A, 1
//! for B; `usnet_shm::liveness`). The kernel drops that lock however the owner dies, so
//! a dead owner is noticed without pids (which can be reused, and which a zombie keeps)
//! and across pid namespaces; a side whose owner died is reclaimed by the next opener.
//! When both sides are held by live processes, a third opener gets
//! [`LinkError::ShmInUse`] (the pids in the header only serve that message). On close a
//! side clears its claim (unless it was reclaimed meanwhile: the generation tells),
//! drops its lock and wakes the peer; the last one out unlinks the file.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnet_pool::{PacketPool, PktBuf};
use usnet_shm::spsc::{Consumer, Producer, RingIndices};
use usnet_shm::{liveness, FutexBell, Populate, Region};

use crate::error::LinkError;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Wake, Waker};

pub const SHM_DEFAULT_MTU: usize = 1500;
pub const SHM_MIN_MTU: usize = 68;
pub const SHM_MAX_MTU: usize = 65535;
pub const SHM_DEFAULT_SLOTS: usize = 512;
/// Frames per burst the stack should ask for.
pub const SHM_MAX_BURST: usize = 64;
/// Directory and prefix of the shared files.
pub const SHM_DIR: &str = "/dev/shm";
pub const SHM_PREFIX: &str = "usnet-shm-";

const MAGIC: u64 = u64::from_le_bytes(*b"usnetshm");
/// 2: liveness by OFD locks, and `sleepers` is a count (1 was a pid check and a flag).
const VERSION: u32 = 2;
const HDR_SIZE: usize = 4096;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_MTU: usize = 12;
const OFF_SLOT_SIZE: usize = 16;
const OFF_SLOTS: usize = 20;
const OFF_SIDE: [usize; 2] = [128, 256];
const SIDE_PID: usize = 0;
const SIDE_CLAIMED: usize = 4;
const SIDE_GEN: usize = 8;
const OFF_RING: [usize; 2] = [512, 1024];
const RING_HEAD: usize = 0;
const RING_TAIL: usize = 128;
const RING_SEQ: usize = 256;
const RING_SLEEPERS: usize = 260;
/// File bytes whose OFD locks are the sides' claims, and the open/close lock.
const LOCK_SIDE: [u64; 2] = [0, 1];
const LOCK_OPEN: u64 = 2;
/// Longest an opener or closer waits for another one to finish.
const OPEN_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes in front of the frame in a slot: len u32 + flags u32.
const SLOT_HDR: usize = 8;
/// Slot flag: the frame's L4 checksum is complete or was left partial by a sender
/// using checksum offload; either way the receiver need not verify it.
const SLOT_CSUM_TRUSTED: u32 = 1;
/// A frame is at most MTU + Ethernet header + one VLAN tag.
const FRAME_OVERHEAD: usize = 18;
const LIVENESS_SLICE: Duration = Duration::from_millis(200);
const LIVENESS_CACHE: Duration = Duration::from_millis(50);

/// How to open a shm link. `None` fields take the value of an existing link (or the
/// default when creating one); a value that differs from an existing link is an error.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    pub mtu: Option<usize>,
    /// Slots per direction (a power of two).
    pub slots: Option<usize>,
    /// How long `wait` spins before it sleeps.
    pub spin: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            mtu: None,
            slots: None,
            spin: Duration::from_micros(10),
        }
    }
}

/// Which end of the link this device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmSide {
    A,
    B,
}

/// Checks a link name: it becomes part of a file name.
pub fn check_shm_name(name: &str) -> Result<(), LinkError> {
    let why = if name.is_empty() {
        "a shm link name cannot be empty"
    } else if name.len() > 64 {
        "shm link names are at most 64 characters"
    } else if name.starts_with('.') {
        "shm link names cannot start with '.'"
    } else if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
    {
        "use only letters, digits, '-', '_' and '.'"
    } else {
        return Ok(());
    };
    Err(LinkError::BadName {
        name: name.to_string(),
        why,
    })
}

/// The file behind a shm link name.
pub fn shm_path(name: &str) -> PathBuf {
    Path::new(SHM_DIR).join(format!("{SHM_PREFIX}{name}"))
}

fn slot_size_for(mtu: usize) -> usize {
    (SLOT_HDR + mtu + FRAME_OVERHEAD).next_multiple_of(64)
}

fn ring_indices(r: usize, slots: usize) -> RingIndices {
    RingIndices {
        head: OFF_RING[r] + RING_HEAD,
        tail: OFF_RING[r] + RING_TAIL,
        size: slots as u32,
    }
}

fn ring_bell(region: &Arc<Region>, r: usize) -> FutexBell {
    FutexBell::new(
        region.clone(),
        OFF_RING[r] + RING_SEQ,
        OFF_RING[r] + RING_SLEEPERS,
    )
    .expect("ring control words lie in the header page")
}

/// Whether side `s` is held by a live process: claimed, and its owner's lock is held.
fn side_live(region: &Region, s: usize) -> io::Result<bool> {
    Ok(region
        .u32(OFF_SIDE[s] + SIDE_CLAIMED)
        .load(Ordering::SeqCst)
        == 1
        && liveness::claimed_by_other(region.file(), LOCK_SIDE[s])?)
}

/// Copies `len` bytes at `off` of the region into a new pool buffer (a chain when they
/// do not fit one). None when the pool runs dry.
fn alloc_from_region(
    pool: &mut PacketPool,
    region: &Region,
    off: usize,
    len: usize,
) -> Option<PktBuf> {
    let head = pool.alloc()?;
    let mut cur = head.id();
    let mut done = 0;
    loop {
        let take = pool.tailroom(cur).min(len - done);
        let dst = pool.append(cur, take).expect("tailroom checked");
        if region.read(off + done, dst).is_err() {
            pool.free(head); // cannot happen: slots were checked against the mapping
            return None;
        }
        done += take;
        if done == len {
            return Some(head);
        }
        let Some(n) = pool.alloc_continuation() else {
            pool.free(head);
            return None;
        };
        let id = n.id();
        pool.set_next(cur, Some(n));
        cur = id;
    }
}

/// One end of a shm link.
pub struct ShmDevice {
    label: String,
    path: PathBuf,
    region: Arc<Region>,
    side: usize,
    /// Our tx ring (we produce) and rx ring (we consume).
    tx: Producer,
    rx: Consumer,
    /// Offsets of the two rings' slot areas.
    tx_slots: usize,
    rx_slots: usize,
    /// The doorbell the peer sleeps on (our tx ring's) and ours (our rx ring's).
    tx_bell: FutexBell,
    rx_bell: FutexBell,
    count: u32,
    slot_size: usize,
    mtu: usize,
    max_frame: usize,
    spin: Duration,
    /// The rx ring's `seq` as of the last wake-up `wait` acted on.
    seen_seq: u32,
    /// Our claim's generation: on close we clear the claim only if it is still ours.
    generation: u32,
    /// (checked at, peer generation, alive): the lock probe runs at most every 50 ms.
    alive_cache: Cell<(Instant, u32, bool)>,
    stats: DeviceStats,
}

impl std::fmt::Debug for ShmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDevice")
            .field("name", &self.label)
            .field("side", &self.side())
            .field("mtu", &self.mtu)
            .field("slots", &self.count)
            .finish()
    }
}

struct Layout {
    mtu: usize,
    slots: usize,
    slot_size: usize,
}

impl Layout {
    fn total(&self) -> usize {
        HDR_SIZE + 2 * self.slots * self.slot_size
    }
}

fn check_config(cfg: &ShmConfig) -> Result<(), LinkError> {
    if let Some(mtu) = cfg.mtu {
        if !(SHM_MIN_MTU..=SHM_MAX_MTU).contains(&mtu) {
            return Err(LinkError::BadMtu {
                mtu,
                min: SHM_MIN_MTU,
                max: SHM_MAX_MTU,
            });
        }
    }
    if let Some(s) = cfg.slots {
        if !s.is_power_of_two() || !(2..=65536).contains(&s) {
            return Err(LinkError::BadSlots(s));
        }
    }
    Ok(())
}

impl ShmDevice {
    /// Opens (creating if needed) the link `name` and claims a free side of it.
    pub fn open(name: &str, cfg: &ShmConfig) -> Result<ShmDevice, LinkError> {
        check_shm_name(name)?;
        check_config(cfg)?;
        let path = shm_path(name);
        let ctx = |what: &str| format!("shm:{name}: {what} {}", path.display());
        // Open and lock; retry if the file we locked was unlinked meanwhile by a closer.
        let file = loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| LinkError::io(ctx("cannot open"), e))?;
            liveness::lock_within(&file, LOCK_OPEN, OPEN_LOCK_TIMEOUT)
                .map_err(|e| LinkError::io(ctx("cannot lock"), e))?;
            let ours = file
                .metadata()
                .map_err(|e| LinkError::io(ctx("cannot stat"), e))?;
            match std::fs::metadata(&path) {
                Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => break file,
                _ => continue, // closing `file` releases the lock
            }
        };
        // The device's region keeps a duplicate of the descriptor: the same open file
        // description, so the side's lock taken through it is held while the device is.
        let r = Self::open_locked(name, cfg, path, &file);
        let _ = liveness::release(&file, LOCK_OPEN);
        r
    }

    fn open_locked(
        name: &str,
        cfg: &ShmConfig,
        path: PathBuf,
        file: &File,
    ) -> Result<ShmDevice, LinkError> {
        let ctx = |what: &str| format!("shm:{name}: {what} {}", path.display());
        let map_file = |len: usize| -> Result<Arc<Region>, LinkError> {
            let dup = file
                .try_clone()
                .map_err(|e| LinkError::io(ctx("cannot dup"), e))?;
            let region = Region::map(dup, len, Populate::Lazily)
                .map_err(|e| LinkError::io(ctx("cannot map"), e))?;
            Ok(Arc::new(region))
        };
        let file_len = file
            .metadata()
            .map_err(|e| LinkError::io(ctx("cannot stat"), e))?
            .len() as usize;

        // Look at an existing, initialised file.
        let mut existing: Option<(Arc<Region>, Layout, [bool; 2])> = None;
        if file_len >= HDR_SIZE {
            let sh = map_file(file_len)?;
            if sh.u64(OFF_MAGIC).load(Ordering::Acquire) == MAGIC {
                let mut live = [false; 2];
                for (s, l) in live.iter_mut().enumerate() {
                    *l = side_live(&sh, s).map_err(|e| LinkError::io(ctx("cannot probe"), e))?;
                }
                let version = sh.u32(OFF_VERSION).load(Ordering::Relaxed);
                let lay = Layout {
                    mtu: sh.u32(OFF_MTU).load(Ordering::Relaxed) as usize,
                    slot_size: sh.u32(OFF_SLOT_SIZE).load(Ordering::Relaxed) as usize,
                    slots: sh.u32(OFF_SLOTS).load(Ordering::Relaxed) as usize,
                };
                if live[0] || live[1] {
                    if live[0] && live[1] {
                        return Err(LinkError::ShmInUse {
                            name: name.to_string(),
                            pid_a: sh.i32(OFF_SIDE[0] + SIDE_PID).load(Ordering::SeqCst),
                            pid_b: sh.i32(OFF_SIDE[1] + SIDE_PID).load(Ordering::SeqCst),
                        });
                    }
                    let sane = version == VERSION
                        && (SHM_MIN_MTU..=SHM_MAX_MTU).contains(&lay.mtu)
                        && lay.slot_size == slot_size_for(lay.mtu)
                        && lay.slots.is_power_of_two()
                        && (2..=65536).contains(&lay.slots)
                        && lay.total() <= file_len;
                    if !sane {
                        return Err(LinkError::ShmMismatch {
                            name: name.to_string(),
                            what: format!("an incompatible layout (version {version})"),
                        });
                    }
                    if cfg.mtu.is_some_and(|m| m != lay.mtu) {
                        return Err(LinkError::ShmMismatch {
                            name: name.to_string(),
                            what: format!("MTU {}", lay.mtu),
                        });
                    }
                    if cfg.slots.is_some_and(|s| s != lay.slots) {
                        return Err(LinkError::ShmMismatch {
                            name: name.to_string(),
                            what: format!("{} slots", lay.slots),
                        });
                    }
                    existing = Some((sh, lay, live));
                }
            }
        }

        let (region, lay, side) = match existing {
            Some((sh, lay, live)) => {
                let side = if live[0] { 1 } else { 0 };
                (sh, lay, side)
            }
            None => {
                // Fresh or stale (nobody alive): initialise. Never shrink the file, so a
                // stray mapping in some exiting process cannot fault past its end.
                let mtu = cfg.mtu.unwrap_or(SHM_DEFAULT_MTU);
                let lay = Layout {
                    mtu,
                    slots: cfg.slots.unwrap_or(SHM_DEFAULT_SLOTS),
                    slot_size: slot_size_for(mtu),
                };
                let len = lay.total().max(file_len);
                file.set_len(len as u64)
                    .map_err(|e| LinkError::io(ctx("cannot size"), e))?;
                let sh = map_file(len)?;
                sh.u64(OFF_MAGIC).store(0, Ordering::SeqCst);
                for off in (8..HDR_SIZE).step_by(4) {
                    sh.u32(off).store(0, Ordering::Relaxed);
                }
                sh.u32(OFF_VERSION).store(VERSION, Ordering::Relaxed);
                sh.u32(OFF_MTU).store(lay.mtu as u32, Ordering::Relaxed);
                sh.u32(OFF_SLOT_SIZE)
                    .store(lay.slot_size as u32, Ordering::Relaxed);
                sh.u32(OFF_SLOTS).store(lay.slots as u32, Ordering::Relaxed);
                sh.u64(OFF_MAGIC).store(MAGIC, Ordering::Release);
                (sh, lay, 0)
            }
        };
        if region.len() < lay.total() {
            return Err(LinkError::ShmMismatch {
                name: name.to_string(),
                what: "a truncated file".into(),
            });
        }

        let layout_err = |e: usnet_shm::RangeError| {
            LinkError::io(
                ctx("bad layout"),
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        };
        let tx =
            Producer::attach(region.clone(), ring_indices(side, lay.slots)).map_err(layout_err)?;
        // Frames left in our rx ring were meant for a previous owner of this side (or
        // were sent while the link was down): discard them. A previous owner that died
        // asleep left its announcement behind: clear it. Then claim.
        let rx = Consumer::attach_discarding(region.clone(), ring_indices(1 - side, lay.slots))
            .map_err(layout_err)?;
        region
            .u32(OFF_RING[1 - side] + RING_SLEEPERS)
            .store(0, Ordering::SeqCst);
        if !liveness::try_claim(region.file(), LOCK_SIDE[side])
            .map_err(|e| LinkError::io(ctx("cannot claim"), e))?
        {
            // Only a process that ignores the open lock gets here.
            return Err(LinkError::ShmInUse {
                name: name.to_string(),
                pid_a: region.i32(OFF_SIDE[0] + SIDE_PID).load(Ordering::SeqCst),
                pid_b: region.i32(OFF_SIDE[1] + SIDE_PID).load(Ordering::SeqCst),
            });
        }
        let me = OFF_SIDE[side];
        region
            .i32(me + SIDE_PID)
            .store(std::process::id() as i32, Ordering::SeqCst);
        let generation = region
            .u32(me + SIDE_GEN)
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        region.u32(me + SIDE_CLAIMED).store(1, Ordering::SeqCst);

        let tx_bell = ring_bell(&region, side);
        let rx_bell = ring_bell(&region, 1 - side);
        let seen_seq = rx_bell.seq();
        let slots_at = |r: usize| HDR_SIZE + r * lay.slots * lay.slot_size;
        Ok(ShmDevice {
            label: format!("shm:{name}"),
            path: path.clone(),
            side,
            tx,
            rx,
            tx_slots: slots_at(side),
            rx_slots: slots_at(1 - side),
            tx_bell,
            rx_bell,
            region,
            count: lay.slots as u32,
            slot_size: lay.slot_size,
            mtu: lay.mtu,
            max_frame: lay.mtu + FRAME_OVERHEAD,
            spin: cfg.spin,
            seen_seq,
            generation,
            alive_cache: Cell::new((Instant::now() - LIVENESS_CACHE * 2, 0, false)),
            stats: DeviceStats::default(),
        })
    }

    pub fn side(&self) -> ShmSide {
        if self.side == 0 {
            ShmSide::A
        } else {
            ShmSide::B
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Slots per direction.
    pub fn slots(&self) -> usize {
        self.count as usize
    }

    /// Tests: drop our side's lock as the kernel does when a process dies, leaving the
    /// claim word set, so the peer and later openers see a dead owner.
    #[cfg(test)]
    fn simulate_crash(&self) {
        liveness::release(self.region.file(), LOCK_SIDE[self.side]).unwrap();
    }

    fn peer_up(&self) -> bool {
        let peer = 1 - self.side;
        let at = OFF_SIDE[peer];
        if self.region.u32(at + SIDE_CLAIMED).load(Ordering::Acquire) != 1 {
            return false;
        }
        // The generation changes when the side is reclaimed: a new owner is probed at once.
        let generation = self.region.u32(at + SIDE_GEN).load(Ordering::Acquire);
        let (checked, cached_gen, alive) = self.alive_cache.get();
        if cached_gen == generation && checked.elapsed() < LIVENESS_CACHE {
            return alive;
        }
        let alive =
            liveness::claimed_by_other(self.region.file(), LOCK_SIDE[peer]).unwrap_or(false);
        self.alive_cache.set((Instant::now(), generation, alive));
        alive
    }
}

impl Device for ShmDevice {
    fn name(&self) -> &str {
        &self.label
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: self.mtu,
            // Like Linux's loopback and veth: frames cross memory, not a wire, so a
            // sender may leave the L4 checksum partial and the receiver need not verify
            // it (the slot's CSUM_TRUSTED flag says so per frame).
            rx_csum_offload: true,
            tx_csum_offload: true,
            tso: false,
            max_burst: SHM_MAX_BURST,
        }
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let avail = match self.rx.available() {
            Ok(n) => n,
            Err(_) => {
                // The peer wrote nonsense into its head index: the ring resynchronised.
                self.stats.rx_errors += 1;
                return Ok(0);
            }
        };
        let n = avail.min(max as u32);
        let mut added = 0;
        for k in 0..n {
            // The slot is in [tail, head): published by the producer (Acquire load of
            // head in `available`) and not touched by it until we release it.
            let slot = self.rx_slots + self.rx.slot(k) as usize * self.slot_size;
            let len = self.region.u32(slot).load(Ordering::Relaxed) as usize;
            if len == 0 || len > self.max_frame {
                self.stats.rx_errors += 1;
                continue;
            }
            let flags = self.region.u32(slot + 4).load(Ordering::Relaxed);
            // len <= max_frame and SLOT_HDR + max_frame <= slot_size: inside this slot.
            match alloc_from_region(pool, &self.region, slot + SLOT_HDR, len) {
                Some(b) => {
                    if flags & SLOT_CSUM_TRUSTED != 0 {
                        let mut o = pool.offload(&b);
                        o.csum_valid = true;
                        pool.set_offload(&b, o);
                    }
                    out.push(b);
                    added += 1;
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len as u64;
                }
                None => self.stats.rx_no_buffer += 1,
            }
        }
        // One Release store per burst hands every slot we read back to the producer.
        self.rx.consume(n);
        self.rx.release();
        Ok(added)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        if frames.is_empty() {
            return Ok(0);
        }
        if !self.peer_up() {
            // No carrier: like a NIC with the cable pulled, frames are dropped, not queued.
            self.stats.tx_dropped += frames.len() as u64;
            for f in frames.drain(..) {
                pool.free(f);
            }
            return Ok(0);
        }
        let mut sent = 0;
        while let Some(f) = frames.front().map(|f| f.id()) {
            let len = pool.chain_len(f);
            if len == 0 || len > self.max_frame {
                pool.free(frames.pop_front().expect("the frame looked at"));
                self.stats.tx_dropped += 1;
                continue;
            }
            let Some(s) = self.tx.reserve() else {
                self.stats.tx_full += 1;
                break;
            };
            // The slot is outside [tail, head): the consumer is done with it (Acquire
            // load of tail in `reserve`); SLOT_HDR + len <= slot_size.
            let slot = self.tx_slots + s as usize * self.slot_size;
            let mut off = slot + SLOT_HDR;
            for d in pool.parts(f) {
                self.region
                    .write(off, d)
                    .expect("slots were checked against the mapping at open");
                off += d.len();
            }
            let o = pool.offload(f);
            let flags = if o.needs_csum || o.csum_valid {
                SLOT_CSUM_TRUSTED
            } else {
                0
            };
            self.region.u32(slot).store(len as u32, Ordering::Relaxed);
            self.region.u32(slot + 4).store(flags, Ordering::Relaxed);
            self.tx.commit();
            pool.free(frames.pop_front().expect("the frame looked at"));
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        // One Release store per burst publishes every slot written above; then wake the
        // peer if it is asleep on this ring.
        if self.tx.publish() {
            self.tx_bell.notify();
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        // Spin briefly: a busy peer usually delivers within a few microseconds, and
        // sleeping costs two system calls on each side.
        let spin = timeout.map_or(self.spin, |t| t.min(self.spin));
        loop {
            if self.rx.pending() {
                return Ok(());
            }
            let s = self.rx_bell.seq();
            if s != self.seen_seq {
                self.seen_seq = s;
                return Ok(());
            }
            if start.elapsed() >= spin {
                break;
            }
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        let entry_state = self.link_state();
        loop {
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if remaining == Some(Duration::ZERO) {
                return Ok(());
            }
            let slice = remaining.map_or(LIVENESS_SLICE, |r| r.min(LIVENESS_SLICE));
            // Read seq before looking at the ring, then announce, fence, re-check and
            // sleep (usnet_shm::doorbell::Gate).
            let s = self.rx_bell.seq();
            if s != self.seen_seq {
                // A waker or the peer rang since we last looked.
                self.seen_seq = s;
                return Ok(());
            }
            let (bell, rx) = (&self.rx_bell, &mut self.rx);
            if !bell.sleep(s, || rx.pending(), slice) {
                return Ok(()); // a frame arrived meanwhile
            }
            if self.link_state() != entry_state {
                return Ok(());
            }
            // Loop: the top re-checks seq (woken) and the ring; a timeout just continues.
        }
    }

    fn wait_kind(&self) -> crate::WaitKind {
        crate::WaitKind::Bell
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        // `seq` first, then the ring: a frame published after this look moves `seq`
        // only if we announce ourselves, which the sleeper does before its re-check.
        let s = self.rx_bell.seq();
        if s != self.seen_seq {
            self.seen_seq = s;
            return crate::WaitPlan::ready();
        }
        if self.rx.pending() {
            return crate::WaitPlan::ready();
        }
        let mut plan = crate::WaitPlan::bell(self.rx_bell.clone(), s);
        // Come back now and then to look at the peer's liveness.
        plan.within = Some(LIVENESS_SLICE);
        plan
    }

    fn rx_ready(&mut self) -> bool {
        self.rx.pending()
    }

    fn waker(&self) -> Waker {
        Arc::new(ShmWaker {
            bell: self.rx_bell.clone(),
        })
    }

    fn link_state(&self) -> LinkState {
        if self.peer_up() {
            LinkState::Up
        } else {
            LinkState::Down
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats
    }
}

struct ShmWaker {
    bell: FutexBell,
}

impl Wake for ShmWaker {
    fn wake(&self) {
        self.bell.ring();
    }
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        let file = self.region.file();
        let locked = liveness::lock_within(file, LOCK_OPEN, OPEN_LOCK_TIMEOUT).is_ok();
        let me = OFF_SIDE[self.side];
        // If we were declared dead and our side reclaimed, the claim is not ours to clear.
        if self.region.u32(me + SIDE_GEN).load(Ordering::SeqCst) == self.generation {
            self.region
                .u32(me + SIDE_CLAIMED)
                .store(0, Ordering::SeqCst);
            self.region.i32(me + SIDE_PID).store(0, Ordering::SeqCst);
        }
        // Our lock only: a new owner of this side holds its own.
        let _ = liveness::release(file, LOCK_SIDE[self.side]);
        // Wake the peer so it notices at once that we are gone.
        self.tx_bell.ring();
        if locked {
            let peer_live = side_live(&self.region, 1 - self.side).unwrap_or(true);
            if !peer_live {
                // Last one out: remove the file, but only if the name still refers to it.
                if let (Ok(ours), Ok(now)) = (file.metadata(), std::fs::metadata(&self.path)) {
                    if ours.ino() == now.ino() && ours.dev() == now.dev() {
                        let _ = std::fs::remove_file(&self.path);
                    }
                }
            }
            let _ = liveness::release(file, LOCK_OPEN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::pool;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn name(tag: &str) -> String {
        format!("t{}-{tag}", std::process::id())
    }

    fn cfg(slots: usize) -> ShmConfig {
        ShmConfig {
            slots: Some(slots),
            ..Default::default()
        }
    }

    /// Frame `seq` from `side`: the sequence number, then a pattern of both.
    fn frame(side: u8, seq: u32, len: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..len)
            .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8 ^ side)
            .collect();
        v[..4].copy_from_slice(&seq.to_be_bytes());
        v
    }

    fn check(side: u8, bytes: &[u8], expect_seq: u32) {
        let seq = u32::from_be_bytes(bytes[..4].try_into().unwrap());
        assert_eq!(seq, expect_seq, "in order, nothing lost");
        assert_eq!(bytes, &frame(side, seq, bytes.len())[..], "bytes intact");
    }

    /// One side of the exchange: sends `n` frames of random sizes, checks the `n` it gets.
    fn run_side(mut dev: ShmDevice, me: u8, n: u32) -> (ShmDevice, DeviceStats) {
        let mut p = pool(1024, 2048);
        let mut rng = StdRng::seed_from_u64(me as u64);
        let (mut next_tx, mut next_rx) = (0u32, 0u32);
        let mut q = VecDeque::new();
        let mut got = Vec::new();
        let mut v = Vec::new();
        let start = Instant::now();
        while next_rx < n || next_tx < n || !q.is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "stuck at tx {next_tx} rx {next_rx}"
            );
            while q.len() < 256 && next_tx < n {
                let len = rng.gen_range(60..=1514);
                q.push_back(p.alloc_from(&frame(me, next_tx, len)).unwrap());
                next_tx += 1;
            }
            let sent = dev.tx_burst(&mut p, &mut q).unwrap();
            let got_n = dev.rx_burst(&mut p, &mut got, 64).unwrap();
            for b in got.drain(..) {
                p.copy_chain(&b, &mut v);
                check(1 - me, &v, next_rx);
                next_rx += 1;
                p.free(b);
            }
            if sent == 0 && got_n == 0 {
                dev.wait(Some(Duration::from_millis(20))).unwrap();
            }
        }
        assert_eq!(p.in_use(), 0);
        let s = dev.stats();
        (dev, s)
    }

    #[test]
    fn exchange_100k_frames_both_ways() {
        let n = name("xchg");
        let a = ShmDevice::open(&n, &cfg(256)).unwrap();
        let b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        assert_eq!((a.side(), b.side()), (ShmSide::A, ShmSide::B));
        assert_eq!(b.slots(), 256, "B adopts the link's layout");
        assert_eq!(a.link_state(), LinkState::Up);
        const N: u32 = 100_000;
        let tb = std::thread::spawn(move || run_side(b, 1, N));
        let (a, sa) = run_side(a, 0, N);
        let (b, sb) = tb.join().unwrap();
        assert_eq!(
            (sa.tx_frames, sa.rx_frames, sb.tx_frames, sb.rx_frames),
            (N as u64, N as u64, N as u64, N as u64)
        );
        assert_eq!(sa.rx_bytes, sb.tx_bytes);
        assert_eq!(
            sa.rx_errors + sb.rx_errors + sa.tx_dropped + sb.tx_dropped,
            0
        );
        let path = a.path().to_path_buf();
        drop(a);
        assert!(path.exists(), "B still holds it");
        drop(b);
        assert!(!path.exists(), "last one out unlinks");
    }

    #[test]
    fn full_ring_back_pressures_without_loss() {
        let n = name("bp");
        let mut a = ShmDevice::open(&n, &cfg(8)).unwrap();
        let mut b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let mut p = pool(256, 2048);
        let mut q = VecDeque::new();
        let mut got = Vec::new();
        let mut v = Vec::new();
        let (mut next_tx, mut next_rx) = (0u32, 0u32);
        while next_rx < 1000 {
            while q.len() < 64 && next_tx < 1000 {
                q.push_back(p.alloc_from(&frame(0, next_tx, 100)).unwrap());
                next_tx += 1;
            }
            a.tx_burst(&mut p, &mut q).unwrap();
            b.rx_burst(&mut p, &mut got, 3).unwrap(); // a slow consumer
            for f in got.drain(..) {
                p.copy_chain(&f, &mut v);
                check(0, &v, next_rx);
                next_rx += 1;
                p.free(f);
            }
        }
        assert!(a.stats().tx_full > 100, "{:?}", a.stats());
        assert_eq!(a.stats().tx_dropped, 0);
        assert_eq!(b.stats().rx_frames, 1000);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn third_opener_gets_in_use_and_bad_settings_are_clear() {
        let n = name("third");
        let _a = ShmDevice::open(
            &n,
            &ShmConfig {
                mtu: Some(9000),
                ..cfg(16)
            },
        )
        .unwrap();
        let e = ShmDevice::open(
            &n,
            &ShmConfig {
                mtu: Some(1500),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("shm link '{n}' was created with MTU 9000; open it with the same settings or pick another name")
        );
        let b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        assert_eq!(b.caps().mtu, 9000);
        let e = ShmDevice::open(&n, &ShmConfig::default()).unwrap_err();
        let pid = std::process::id();
        assert_eq!(
            e.to_string(),
            format!(
                "shm link '{n}' is in use: both sides are held by live processes (pids {pid} and {pid}); stop one of them or pick another name"
            )
        );
        assert!(matches!(
            ShmDevice::open("a/b", &ShmConfig::default()),
            Err(LinkError::BadName { .. })
        ));
        assert!(matches!(
            ShmDevice::open(&n, &cfg(6)),
            Err(LinkError::BadSlots(6))
        ));
        assert!(matches!(
            ShmDevice::open(
                &n,
                &ShmConfig {
                    mtu: Some(70000),
                    ..Default::default()
                }
            ),
            Err(LinkError::BadMtu { .. })
        ));
    }

    #[test]
    fn dead_side_is_reclaimed_and_peer_sees_down() {
        let n = name("reclaim");
        let a = ShmDevice::open(&n, &cfg(16)).unwrap();
        let b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        assert_eq!(a.link_state(), LinkState::Up);
        // Pretend B's process died: its lock goes, as the kernel drops it at death,
        // while its claim word stays set.
        b.simulate_crash();
        std::thread::sleep(LIVENESS_CACHE * 2);
        assert_eq!(a.link_state(), LinkState::Down);
        let c = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        assert_eq!(c.side(), ShmSide::B);
        assert_eq!(a.link_state(), LinkState::Up);
        drop(b); // the stale owner must not clear the new claim
        assert_eq!(a.link_state(), LinkState::Up);
        drop(c);
        assert_eq!(a.link_state(), LinkState::Down);
        // Frames to a peer that is gone are dropped, not queued.
        let mut a = a;
        let mut p = pool(8, 2048);
        let mut q = VecDeque::from([p.alloc_from(&[1u8; 60]).unwrap()]);
        assert_eq!(a.tx_burst(&mut p, &mut q).unwrap(), 0);
        assert!(q.is_empty());
        assert_eq!(a.stats().tx_dropped, 1);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn jumbo_frames_travel_as_chains() {
        let n = name("jumbo");
        let big = ShmConfig {
            mtu: Some(SHM_MAX_MTU),
            ..cfg(16)
        };
        let mut a = ShmDevice::open(&n, &big).unwrap();
        let mut b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let mut p = pool(512, 2048);
        let sizes = [9000usize, 65000, 60, SHM_MAX_MTU + 18];
        let mut q: VecDeque<PktBuf> = sizes
            .iter()
            .map(|&s| p.alloc_from(&frame(0, s as u32, s)).unwrap())
            .collect();
        q.push_back(p.alloc_from(&vec![0u8; SHM_MAX_MTU + 19]).unwrap()); // too large
        assert_eq!(a.tx_burst(&mut p, &mut q).unwrap(), 4);
        assert_eq!(a.stats().tx_dropped, 1);
        let mut got = Vec::new();
        assert_eq!(b.rx_burst(&mut p, &mut got, 64).unwrap(), 4);
        let mut v = Vec::new();
        for (f, &s) in got.into_iter().zip(&sizes) {
            if s > 2048 {
                assert!(p.next(&f).is_some(), "chained");
            }
            p.copy_chain(&f, &mut v);
            assert_eq!(v.len(), s);
            check(0, &v, s as u32);
            p.free(f);
        }
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn waker_interrupts_wait_and_is_not_lost() {
        let n = name("wake");
        let mut a = ShmDevice::open(&n, &cfg(16)).unwrap();
        let _b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let w = a.waker();
        w.wake(); // before the wait: the wait returns at once
        let t = Instant::now();
        a.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            w.wake();
        });
        let t = Instant::now();
        a.wait(Some(Duration::from_secs(5))).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(90) && t.elapsed() < Duration::from_secs(2));
        th.join().unwrap();
        // A plain timeout.
        let t = Instant::now();
        a.wait(Some(Duration::from_millis(50))).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(50));
    }

    /// Not a test by itself: the child process of `peer_process_death_is_seen`.
    #[test]
    fn shm_child_process() {
        let Ok(n) = std::env::var("USNET_SHM_CHILD") else {
            return;
        };
        let mut dev = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let mut p = pool(64, 2048);
        let mut got = Vec::new();
        let mut q = VecDeque::new();
        println!("child ready");
        loop {
            // Echo everything back until killed.
            dev.wait(Some(Duration::from_millis(500))).unwrap();
            dev.rx_burst(&mut p, &mut got, 64).unwrap();
            q.extend(got.drain(..));
            dev.tx_burst(&mut p, &mut q).unwrap();
        }
    }

    #[test]
    fn peer_process_death_is_seen() {
        let n = name("xproc");
        let mut a = ShmDevice::open(&n, &cfg(64)).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shm::tests::shm_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("USNET_SHM_CHILD", &n)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while a.link_state() != LinkState::Up {
            assert!(t.elapsed() < Duration::from_secs(20), "child never came up");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A round trip through the other process (futex wake-ups across processes).
        let mut p = pool(64, 2048);
        let mut got = Vec::new();
        let mut v = Vec::new();
        for i in 0..20u32 {
            let mut q = VecDeque::from([p.alloc_from(&frame(0, i, 200)).unwrap()]);
            assert_eq!(a.tx_burst(&mut p, &mut q).unwrap(), 1);
            let t = Instant::now();
            while got.is_empty() {
                assert!(t.elapsed() < Duration::from_secs(5), "no echo");
                a.wait(Some(Duration::from_secs(1))).unwrap();
                a.rx_burst(&mut p, &mut got, 8).unwrap();
            }
            p.copy_chain(&got[0], &mut v);
            check(0, &v, i);
            for b in got.drain(..) {
                p.free(b);
            }
        }
        child.kill().unwrap();
        child.wait().unwrap(); // reaped: its pid no longer exists
        let t = Instant::now();
        while a.link_state() != LinkState::Down {
            assert!(t.elapsed() < Duration::from_secs(2), "peer death not seen");
            a.wait(Some(Duration::from_secs(5))).unwrap();
        }
        assert_eq!(p.in_use(), 0);
    }

    /// Small-frame rate between two threads (each with its own pool, as two processes).
    #[test]
    #[ignore = "benchmark: cargo test --release -p usnet-link -- --ignored shm_throughput --nocapture"]
    fn shm_throughput() {
        const N: u64 = 5_000_000;
        let n = name("perf");
        let mut a = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let mut b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        // Nothing is lost on a shm link, but every loop still has a deadline.
        let deadline = Instant::now() + Duration::from_secs(120);
        let rx = std::thread::spawn(move || {
            let mut p = pool(4096, 2048);
            let mut got = Vec::with_capacity(64);
            let mut count = 0u64;
            while count < N {
                assert!(Instant::now() < deadline, "receiver stuck at {count}");
                if b.rx_burst(&mut p, &mut got, 64).unwrap() == 0 {
                    b.wait(Some(Duration::from_millis(100))).unwrap();
                }
                count += got.len() as u64;
                for f in got.drain(..) {
                    p.free(f);
                }
            }
        });
        let mut p = pool(4096, 2048);
        let mut q = VecDeque::with_capacity(128);
        let start = Instant::now();
        let mut sent = 0u64;
        while sent < N {
            assert!(Instant::now() < deadline, "sender stuck at {sent}");
            while q.len() < 64 {
                q.push_back(p.alloc_from(&[0x5a; 64]).unwrap());
            }
            let k = a.tx_burst(&mut p, &mut q).unwrap() as u64;
            sent += k;
            if k == 0 {
                std::thread::yield_now(); // ring full: let the consumer run
            }
        }
        rx.join().unwrap();
        let secs = start.elapsed().as_secs_f64();
        println!(
            "shm: {:.2} M frames/s (64 B), tx_full {}",
            N as f64 / secs / 1e6,
            a.stats().tx_full
        );
        for f in q {
            p.free(f);
        }
    }
}
