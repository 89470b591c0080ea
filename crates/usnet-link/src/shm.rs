//! The shared-memory Ethernet: a point-to-point link between two unprivileged processes
//! through one file in `/dev/shm`.
//!
//! # Layout of `/dev/shm/usnet-shm-NAME` (version 3)
//!
//! ```text
//! 0      header page (4096 bytes)
//!          0  magic "usnetshm" (u64, written last by the initialiser)
//!          8  version u32 · 12 mtu u32 · 16 slot size u32 · 20 slots per ring u32
//!         24  queues per side Q u32
//!        128  side A {pid i32 (informational), claimed u32, generation u32, shards u32}
//!        256  side B {same}
//! 4096   doorbells, 128 bytes each: side A's queues 0..Q, then side B's, each
//!          +0 seq: the futex its consumer sleeps on · +4 sleepers
//! then   (page-aligned) ring indices, 256 bytes each: ring r at r·256,
//!          +0 head: producer index (written only by the producer)
//!          +128 tail: consumer index (written only by the consumer)
//! then   (page-aligned) ring r's slots at r · slots · slot size: `slots` slots of
//!        `slot size` bytes, each {len: u32, flags: u32, frame bytes}
//!
//! ring (s, i, j) = (s·Q + i)·Q + j: from queue i of side s to queue j of the other
//! ```
//!
//! A side runs as many queues as its stack has shards (`shards`, at most Q; one for an
//! unsharded stack), so each pair of queues has a ring each way, and every ring has one
//! producer and one consumer. A queue consumes the rings from every peer queue into
//! itself and sleeps on its own doorbell, which every one of those producers rings. A
//! sender puts each frame into the ring to the peer queue that owns it
//! ([`usnet_wire::steer::link_queue`] over the peer's `shards`), which is how a sharded
//! stack gets every frame on the shard that handles it, as a NIC's RSS would do it. Q
//! is fixed by whoever creates the file ([`SHM_DEFAULT_QUEUES`] unless asked): rings
//! between queues nobody runs are never touched, so they cost file size, not memory.
//!
//! Each ring is a single-producer single-consumer ring; its indices, their
//! ownership and their memory ordering (one Release store per burst, an Acquire load
//! before reading or overwriting slots, cached copies of the other side's index) are
//! `usnet_shm::spsc`'s. Slot contents are copied with `Region::read`/`write`, so no
//! reference into the shared bytes is ever held.
//!
//! # Wake-ups without lost wake-ups
//! A consumer about to sleep announces itself on its queue's doorbell (`sleepers`),
//! fences, re-checks its rings and sleeps on `seq`; a producer publishes its head,
//! fences, and rings only if a consumer announced itself. This is
//! `usnet_shm::doorbell::Gate`, where the argument that no wake-up is lost is written
//! out. The futex is shared (not FUTEX_PRIVATE) because the word lives in a file mapping
//! used by two processes. The consumer sleeps in slices of at most 200 ms and checks
//! between slices whether the peer is still alive, so a peer that died is noticed within
//! ~0.2 s.
//!
//! # Sides, claims and liveness
//! All the queues of one side belong to one process ([`ShmDevice::open_queues`]),
//! which claims the side once.
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
/// Queues per side a link is created with unless asked: room for a stack of up to
/// four shards on either side. Rings nobody uses cost file size, not memory (the
/// file is sparse and its pages are touched only by traffic).
pub const SHM_DEFAULT_QUEUES: usize = 4;
/// Most queues per side (the sides' doorbells fit one page, the rings' indices a few).
pub const SHM_MAX_QUEUES: usize = 16;
/// Frames per burst the stack should ask for.
pub const SHM_MAX_BURST: usize = 64;
/// Directory and prefix of the shared files.
pub const SHM_DIR: &str = "/dev/shm";
pub const SHM_PREFIX: &str = "usnet-shm-";

const MAGIC: u64 = u64::from_le_bytes(*b"usnetshm");
/// 3: a grid of rings between the sides' queues (2 was one ring each way).
const VERSION: u32 = 3;
const HDR_SIZE: usize = 4096;
const PAGE: usize = 4096;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_MTU: usize = 12;
const OFF_SLOT_SIZE: usize = 16;
const OFF_SLOTS: usize = 20;
const OFF_QUEUES: usize = 24;
const OFF_SIDE: [usize; 2] = [128, 256];
const SIDE_PID: usize = 0;
const SIDE_CLAIMED: usize = 4;
const SIDE_GEN: usize = 8;
const SIDE_SHARDS: usize = 12;
const BELL_STRIDE: usize = 128;
const BELL_SEQ: usize = 0;
const BELL_SLEEPERS: usize = 4;
const RING_STRIDE: usize = 256;
const RING_HEAD: usize = 0;
const RING_TAIL: usize = 128;
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
    /// Queues per side (each side's shards; [`SHM_DEFAULT_QUEUES`] when creating).
    pub queues: Option<usize>,
    /// How long `wait` spins before it sleeps.
    pub spin: Duration,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            mtu: None,
            slots: None,
            queues: None,
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

/// Removes the link `name`'s file when no side of it is held. The last stack out
/// removes it itself, but a stack that gave up root after opening the link (`usnet
/// up` as root) cannot unlink root's file in the sticky `/dev/shm`: its clean-up
/// process, still root, calls this once the stack has ended. Returns whether the
/// file was removed.
pub fn remove_if_unused(name: &str) -> bool {
    if check_shm_name(name).is_err() {
        return false;
    }
    let path = shm_path(name);
    let Ok(file) = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
    else {
        return false;
    };
    if liveness::lock_within(&file, LOCK_OPEN, OPEN_LOCK_TIMEOUT).is_err() {
        return false;
    }
    // A side is in use while its owner holds its lock (a stack opening the link
    // holds the open lock, which we hold now).
    let unused = LOCK_SIDE
        .iter()
        .all(|&l| matches!(liveness::claimed_by_other(&file, l), Ok(false)));
    let removed = unused && remove_if_it_names(&path, &file);
    let _ = liveness::release(&file, LOCK_OPEN);
    removed
}

/// Removes `path` if the name still refers to `file` (not to a file a newer stack
/// made since). Returns whether it did.
fn remove_if_it_names(path: &Path, file: &File) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(ours), Ok(now)) if ours.ino() == now.ino() && ours.dev() == now.dev() => {
            std::fs::remove_file(path).is_ok()
        }
        _ => false,
    }
}

fn slot_size_for(mtu: usize) -> usize {
    (SLOT_HDR + mtu + FRAME_OVERHEAD).next_multiple_of(64)
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

/// What the devices of one side (the shards of one stack) share: the mapping, the
/// side's claim, and giving the claim back when the last of them closes.
struct Claim {
    path: PathBuf,
    region: Arc<Region>,
    side: usize,
    lay: Layout,
    /// Our claim's generation: on close we clear the claim only if it is still ours.
    generation: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let file = self.region.file();
        let locked = liveness::lock_within(file, LOCK_OPEN, OPEN_LOCK_TIMEOUT).is_ok();
        let me = OFF_SIDE[self.side];
        // If we were declared dead and our side reclaimed, the claim is not ours to clear.
        if self.region.u32(me + SIDE_GEN).load(Ordering::SeqCst) == self.generation {
            self.region
                .u32(me + SIDE_CLAIMED)
                .store(0, Ordering::SeqCst);
            self.region.u32(me + SIDE_SHARDS).store(0, Ordering::SeqCst);
            self.region.i32(me + SIDE_PID).store(0, Ordering::SeqCst);
        }
        // Our lock only: a new owner of this side holds its own.
        let _ = liveness::release(file, LOCK_SIDE[self.side]);
        // Wake every queue of the peer so it notices at once that we are gone.
        for q in 0..self.lay.queues {
            self.lay.bell(&self.region, 1 - self.side, q).ring();
        }
        if locked {
            let peer_live = side_live(&self.region, 1 - self.side).unwrap_or(true);
            if !peer_live {
                // Last one out.
                remove_if_it_names(&self.path, file);
            }
            let _ = liveness::release(file, LOCK_OPEN);
        }
    }
}

/// One end of a shm link: one queue of one side (a whole side unless the stack on it
/// is sharded).
pub struct ShmDevice {
    label: String,
    claim: Arc<Claim>,
    region: Arc<Region>,
    side: usize,
    /// Our queue among our side's queues.
    queue: usize,
    /// The rings we produce into, one per peer queue, and their slot areas.
    tx: Vec<Producer>,
    tx_slots: Vec<usize>,
    /// The doorbell each peer queue sleeps on.
    tx_bells: Vec<FutexBell>,
    /// The rings we consume, one per peer queue, their slot areas, and the one our
    /// rx rings ring (ours).
    rx: Vec<Consumer>,
    rx_slots: Vec<usize>,
    rx_bell: FutexBell,
    /// The rx ring a burst starts with, moved on each burst so no ring starves.
    rx_next: usize,
    count: u32,
    slot_size: usize,
    mtu: usize,
    max_frame: usize,
    spin: Duration,
    /// The rx bell's `seq` as of the last wake-up `wait` acted on.
    seen_seq: u32,
    /// (checked at, on the coarse clock; peer generation; alive): the lock probe runs
    /// at most every 50 ms.
    alive_cache: Cell<(Duration, u32, bool)>,
    stats: DeviceStats,
}

impl std::fmt::Debug for ShmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDevice")
            .field("name", &self.label)
            .field("side", &self.side())
            .field("queue", &self.queue)
            .field("mtu", &self.mtu)
            .field("slots", &self.count)
            .finish()
    }
}

#[derive(Debug, Clone, Copy)]
struct Layout {
    mtu: usize,
    slots: usize,
    slot_size: usize,
    queues: usize,
}

impl Layout {
    /// Offset of the doorbell queue `q` of side `s` sleeps on.
    fn bell_at(&self, s: usize, q: usize) -> usize {
        HDR_SIZE + (s * self.queues + q) * BELL_STRIDE
    }
    fn bell(&self, region: &Arc<Region>, s: usize, q: usize) -> FutexBell {
        let at = self.bell_at(s, q);
        FutexBell::new(region.clone(), at + BELL_SEQ, at + BELL_SLEEPERS)
            .expect("bells lie inside the checked layout")
    }
    fn rings_at(&self) -> usize {
        HDR_SIZE + (2 * self.queues * BELL_STRIDE).next_multiple_of(PAGE)
    }
    fn rings(&self) -> usize {
        2 * self.queues * self.queues
    }
    /// The ring from queue `i` of side `s` to queue `j` of the other side.
    fn ring(&self, s: usize, i: usize, j: usize) -> usize {
        (s * self.queues + i) * self.queues + j
    }
    fn indices(&self, r: usize) -> RingIndices {
        let at = self.rings_at() + r * RING_STRIDE;
        RingIndices {
            head: at + RING_HEAD,
            tail: at + RING_TAIL,
            size: self.slots as u32,
        }
    }
    fn slots_at(&self) -> usize {
        self.rings_at() + (self.rings() * RING_STRIDE).next_multiple_of(PAGE)
    }
    fn ring_slots(&self, r: usize) -> usize {
        self.slots_at() + r * self.slots * self.slot_size
    }
    fn total(&self) -> usize {
        self.slots_at() + self.rings() * self.slots * self.slot_size
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
    if let Some(q) = cfg.queues {
        if !(1..=SHM_MAX_QUEUES).contains(&q) {
            return Err(LinkError::BadQueues(q));
        }
    }
    Ok(())
}

impl ShmDevice {
    /// Opens (creating if needed) the link `name` and claims a free side of it.
    pub fn open(name: &str, cfg: &ShmConfig) -> Result<ShmDevice, LinkError> {
        let mut devs = Self::open_queues(name, cfg, 1)?;
        Ok(devs.pop().expect("one queue asked for"))
    }

    /// Opens the link `name` for a stack of `n` shards: claims a free side and returns
    /// one device per queue `0..n` of it. Each shard's device consumes the rings from
    /// every peer queue to its own, and sends each frame into the ring to the peer
    /// queue that owns it ([`usnet_wire::steer::link_queue`] over the peer's shard
    /// count), so a sharded peer gets every frame on the shard that handles it.
    pub fn open_queues(name: &str, cfg: &ShmConfig, n: usize) -> Result<Vec<ShmDevice>, LinkError> {
        check_shm_name(name)?;
        check_config(cfg)?;
        if !(1..=SHM_MAX_QUEUES).contains(&n) {
            return Err(LinkError::BadQueues(n));
        }
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
        let r = Self::open_locked(name, cfg, n, path, &file);
        let _ = liveness::release(&file, LOCK_OPEN);
        r
    }

    fn open_locked(
        name: &str,
        cfg: &ShmConfig,
        n: usize,
        path: PathBuf,
        file: &File,
    ) -> Result<Vec<ShmDevice>, LinkError> {
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
        let mismatch = |what: String| LinkError::ShmMismatch {
            name: name.to_string(),
            what,
        };

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
                    queues: sh.u32(OFF_QUEUES).load(Ordering::Relaxed) as usize,
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
                        && (1..=SHM_MAX_QUEUES).contains(&lay.queues)
                        && lay.total() <= file_len;
                    if !sane {
                        return Err(mismatch(format!(
                            "an incompatible layout (version {version})"
                        )));
                    }
                    if cfg.mtu.is_some_and(|m| m != lay.mtu) {
                        return Err(mismatch(format!("MTU {}", lay.mtu)));
                    }
                    if cfg.slots.is_some_and(|s| s != lay.slots) {
                        return Err(mismatch(format!("{} slots", lay.slots)));
                    }
                    if cfg.queues.is_some_and(|q| q != lay.queues) {
                        return Err(mismatch(format!("{} queues per side", lay.queues)));
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
                    queues: cfg.queues.unwrap_or(SHM_DEFAULT_QUEUES.max(n)),
                };
                let len = lay.total().max(file_len);
                file.set_len(len as u64)
                    .map_err(|e| LinkError::io(ctx("cannot size"), e))?;
                let sh = map_file(len)?;
                sh.u64(OFF_MAGIC).store(0, Ordering::SeqCst);
                // The header, the bells and the ring indices start at zero.
                for off in (8..lay.slots_at()).step_by(4) {
                    sh.u32(off).store(0, Ordering::Relaxed);
                }
                sh.u32(OFF_VERSION).store(VERSION, Ordering::Relaxed);
                sh.u32(OFF_MTU).store(lay.mtu as u32, Ordering::Relaxed);
                sh.u32(OFF_SLOT_SIZE)
                    .store(lay.slot_size as u32, Ordering::Relaxed);
                sh.u32(OFF_SLOTS).store(lay.slots as u32, Ordering::Relaxed);
                sh.u32(OFF_QUEUES)
                    .store(lay.queues as u32, Ordering::Relaxed);
                sh.u64(OFF_MAGIC).store(MAGIC, Ordering::Release);
                (sh, lay, 0)
            }
        };
        if region.len() < lay.total() {
            return Err(mismatch("a truncated file".into()));
        }
        if n > lay.queues {
            return Err(LinkError::ShmQueues {
                name: name.to_string(),
                queues: lay.queues,
                shards: n,
            });
        }

        let layout_err = |e: usnet_shm::RangeError| {
            LinkError::io(
                ctx("bad layout"),
                io::Error::new(io::ErrorKind::InvalidData, e),
            )
        };
        let peer = 1 - side;
        let mut parts = Vec::with_capacity(n);
        for k in 0..n {
            let mut tx = Vec::with_capacity(lay.queues);
            let mut rx = Vec::with_capacity(lay.queues);
            for q in 0..lay.queues {
                let out = lay.ring(side, k, q);
                tx.push(Producer::attach(region.clone(), lay.indices(out)).map_err(layout_err)?);
                // Frames left in our rx rings were meant for a previous owner of this
                // side (or were sent while the link was down): discard them.
                let inn = lay.ring(peer, q, k);
                rx.push(
                    Consumer::attach_discarding(region.clone(), lay.indices(inn))
                        .map_err(layout_err)?,
                );
            }
            // A previous owner that died asleep left its announcement behind: clear it.
            region
                .u32(lay.bell_at(side, k) + BELL_SLEEPERS)
                .store(0, Ordering::SeqCst);
            parts.push((tx, rx));
        }
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
        region
            .u32(me + SIDE_SHARDS)
            .store(n as u32, Ordering::SeqCst);
        let generation = region
            .u32(me + SIDE_GEN)
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        region.u32(me + SIDE_CLAIMED).store(1, Ordering::SeqCst);
        let claim = Arc::new(Claim {
            path,
            region: region.clone(),
            side,
            lay,
            generation,
        });

        let devs = parts
            .into_iter()
            .enumerate()
            .map(|(k, (tx, rx))| {
                let rx_bell = lay.bell(&region, side, k);
                let seen_seq = rx_bell.seq();
                ShmDevice {
                    label: if n == 1 {
                        format!("shm:{name}")
                    } else {
                        format!("shm:{name}#{k}")
                    },
                    claim: claim.clone(),
                    region: region.clone(),
                    side,
                    queue: k,
                    tx,
                    tx_slots: (0..lay.queues)
                        .map(|q| lay.ring_slots(lay.ring(side, k, q)))
                        .collect(),
                    tx_bells: (0..lay.queues)
                        .map(|q| lay.bell(&region, peer, q))
                        .collect(),
                    rx,
                    rx_slots: (0..lay.queues)
                        .map(|q| lay.ring_slots(lay.ring(peer, q, k)))
                        .collect(),
                    rx_bell,
                    rx_next: 0,
                    count: lay.slots as u32,
                    slot_size: lay.slot_size,
                    mtu: lay.mtu,
                    max_frame: lay.mtu + FRAME_OVERHEAD,
                    spin: cfg.spin,
                    seen_seq,
                    alive_cache: Cell::new((Duration::ZERO, 0, false)),
                    stats: DeviceStats::default(),
                }
            })
            .collect();
        Ok(devs)
    }

    pub fn side(&self) -> ShmSide {
        if self.side == 0 {
            ShmSide::A
        } else {
            ShmSide::B
        }
    }

    pub fn path(&self) -> &Path {
        &self.claim.path
    }

    /// Slots per ring.
    pub fn slots(&self) -> usize {
        self.count as usize
    }

    /// This device's queue among its side's, and how many queues each side has.
    pub fn queue(&self) -> (usize, usize) {
        (self.queue, self.claim.lay.queues)
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
        // Asked on every burst: the coarse clock costs no TSC read.
        let now = crate::sys::coarse_now();
        let (checked, cached_gen, alive) = self.alive_cache.get();
        if cached_gen == generation
            && checked != Duration::ZERO
            && now.saturating_sub(checked) < LIVENESS_CACHE
        {
            return alive;
        }
        let alive =
            liveness::claimed_by_other(self.region.file(), LOCK_SIDE[peer]).unwrap_or(false);
        self.alive_cache.set((now, generation, alive));
        alive
    }

    /// How many shards the peer runs (its queues in use: the rings we send into and
    /// consume), whatever it wrote there kept within the layout. Read per burst: a
    /// peer that comes back with another shard count is followed at once.
    fn peer_shards(&self) -> usize {
        let n = self
            .region
            .u32(OFF_SIDE[1 - self.side] + SIDE_SHARDS)
            .load(Ordering::Acquire) as usize;
        n.clamp(1, self.tx.len())
    }

    fn rx_pending(&mut self) -> bool {
        let rings = self.peer_shards();
        self.rx[..rings].iter_mut().any(|c| c.pending())
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
        // Only the peer's queues in use send to us.
        let rings = self.peer_shards();
        let mut room = max as u32;
        let mut added = 0;
        for step in 0..rings {
            if room == 0 {
                break;
            }
            let r = (self.rx_next + step) % rings;
            let avail = match self.rx[r].available() {
                Ok(n) => n,
                Err(_) => {
                    // The peer wrote nonsense into its head index: the ring resynchronised.
                    self.stats.rx_errors += 1;
                    continue;
                }
            };
            let n = avail.min(room);
            room -= n;
            for k in 0..n {
                // The slot is in [tail, head): published by the producer (Acquire load
                // of head in `available`) and not touched by it until we release it.
                let slot = self.rx_slots[r] + self.rx[r].slot(k) as usize * self.slot_size;
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
            // One Release store per ring and burst hands every slot we read back to
            // its producer.
            self.rx[r].consume(n);
            self.rx[r].release();
        }
        self.rx_next = (self.rx_next + 1) % rings;
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
        let peers = self.peer_shards();
        let mut written = 0u32; // a bit per ring written into
        let mut sent = 0;
        while let Some(f) = frames.front().map(|f| f.id()) {
            let len = pool.chain_len(f);
            if len == 0 || len > self.max_frame {
                pool.free(frames.pop_front().expect("the frame looked at"));
                self.stats.tx_dropped += 1;
                continue;
            }
            // The peer queue that owns the frame (the headers are in its first buffer).
            let q = if peers > 1 {
                usnet_wire::steer::link_queue(pool.data(f), peers)
            } else {
                0
            };
            let Some(s) = self.tx[q].reserve() else {
                // Back-pressure: the frame and those behind it wait, in order.
                self.stats.tx_full += 1;
                break;
            };
            // The slot is outside [tail, head): the consumer is done with it (Acquire
            // load of tail in `reserve`); SLOT_HDR + len <= slot_size.
            let slot = self.tx_slots[q] + s as usize * self.slot_size;
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
            self.tx[q].commit();
            written |= 1 << q;
            pool.free(frames.pop_front().expect("the frame looked at"));
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        // One Release store per ring and burst publishes every slot written above; then
        // wake that peer queue if it is asleep.
        while written != 0 {
            let q = written.trailing_zeros() as usize;
            written &= written - 1;
            if self.tx[q].publish() {
                self.tx_bells[q].notify();
            }
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
            if self.rx_pending() {
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
            let rings = self.peer_shards();
            let (bell, rx) = (&self.rx_bell, &mut self.rx[..rings]);
            if !bell.sleep(s, || rx.iter_mut().any(|c| c.pending()), slice) {
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
        if self.rx_pending() {
            return crate::WaitPlan::ready();
        }
        let mut plan = crate::WaitPlan::bell(self.rx_bell.clone(), s);
        // Come back now and then to look at the peer's liveness.
        plan.within = Some(LIVENESS_SLICE);
        plan
    }

    fn rx_ready(&mut self) -> bool {
        self.rx_pending()
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

    /// An Ethernet + IPv4 + TCP frame between two ports, its tag in the payload.
    fn tcp_frame(src: u16, dst: u16, tag: u32) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + 4];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 6;
        f[34..36].copy_from_slice(&src.to_be_bytes());
        f[36..38].copy_from_slice(&dst.to_be_bytes());
        f[54..58].copy_from_slice(&tag.to_be_bytes());
        f
    }

    /// Sends `frames` from `dev` (all of them, within the ring's room).
    fn send_all(dev: &mut ShmDevice, p: &mut PacketPool, frames: &[Vec<u8>]) {
        let mut q: VecDeque<PktBuf> = frames.iter().map(|f| p.alloc_from(f).unwrap()).collect();
        assert_eq!(dev.tx_burst(p, &mut q).unwrap(), frames.len());
    }

    /// Everything waiting on `dev`, as byte vectors.
    fn drain(dev: &mut ShmDevice, p: &mut PacketPool) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while dev.rx_burst(p, &mut got, 7).unwrap() > 0 {}
        got.into_iter()
            .map(|b| {
                let mut v = Vec::new();
                p.copy_chain(&b, &mut v);
                p.free(b);
                v
            })
            .collect()
    }

    #[test]
    fn sharded_sides_get_each_frame_on_the_queue_that_owns_it() {
        use usnet_wire::steer::link_queue;
        let n = name("shards");
        // A runs 2 shards, B 3: different counts on each side, on the default 4 queues.
        let mut a = ShmDevice::open_queues(&n, &cfg(64), 2).unwrap();
        let mut b = ShmDevice::open_queues(&n, &ShmConfig::default(), 3).unwrap();
        assert_eq!((a[1].queue(), b[2].queue()), ((1, 4), (2, 4)));
        assert_eq!(a[0].link_state(), LinkState::Up);
        let mut p = pool(1024, 2048);
        // Frames from every A queue to B: each lands on the B queue that owns it, in
        // order per sender and flow.
        let frames: Vec<Vec<u8>> = (0..40u32)
            .map(|i| tcp_frame(80 + (i % 5) as u16, 49152 + i as u16 * 7, i))
            .collect();
        let (from0, from1) = frames.split_at(20);
        send_all(&mut a[0], &mut p, from0);
        send_all(&mut a[1], &mut p, from1);
        let mut seen = 0;
        for (k, dev) in b.iter_mut().enumerate() {
            let got = drain(dev, &mut p);
            for f in &got {
                assert_eq!(link_queue(f, 3), k, "on the queue that owns it");
            }
            // Per sender, the order it sent in.
            for half in [from0, from1] {
                let mine: Vec<&Vec<u8>> = got.iter().filter(|f| half.contains(f)).collect();
                let want: Vec<&Vec<u8>> = half.iter().filter(|f| link_queue(f, 3) == k).collect();
                assert_eq!(mine, want);
            }
            seen += got.len();
        }
        assert_eq!(seen, 40, "every frame arrived once");
        // And back: B's queues to A's two.
        let back: Vec<Vec<u8>> = (0..30u32)
            .map(|i| tcp_frame(49152 + i as u16, 8080, 100 + i))
            .collect();
        for (k, chunk) in back.chunks(10).enumerate() {
            send_all(&mut b[k], &mut p, chunk);
        }
        let mut seen = 0;
        for (k, dev) in a.iter_mut().enumerate() {
            let got = drain(dev, &mut p);
            assert!(got.iter().all(|f| link_queue(f, 2) == k));
            seen += got.len();
        }
        assert_eq!(seen, 30);
        // A frame with no ports (ARP) goes to queue 0.
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        send_all(&mut b[2], &mut p, &[arp.clone()]);
        assert_eq!(drain(&mut a[0], &mut p), vec![arp]);
        // The side stays up while any of its queues is open.
        let last = b.pop().unwrap();
        drop(b);
        assert_eq!(a[0].link_state(), LinkState::Up);
        drop(last);
        std::thread::sleep(LIVENESS_CACHE * 2);
        assert_eq!(a[1].link_state(), LinkState::Down);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn a_sleeping_queue_is_woken_by_any_peer_queue() {
        let n = name("shwake");
        let mut a = ShmDevice::open_queues(&n, &cfg(64), 2).unwrap();
        let mut b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let a1 = a.pop().unwrap();
        let th = std::thread::spawn(move || {
            let mut a1 = a1;
            let mut p = pool(64, 2048);
            let t = Instant::now();
            let mut got = Vec::new();
            while got.is_empty() {
                assert!(t.elapsed() < Duration::from_secs(10), "never woken");
                a1.wait(Some(Duration::from_secs(5))).unwrap();
                a1.rx_burst(&mut p, &mut got, 8).unwrap();
            }
            let n = got.len();
            for f in got {
                p.free(f);
            }
            (n, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut p = pool(64, 2048);
        // Port 49153 is odd: queue 1 of two.
        send_all(&mut b, &mut p, &[tcp_frame(80, 49153, 1)]);
        let (n, waited) = th.join().unwrap();
        assert_eq!(n, 1);
        assert!(waited < Duration::from_secs(5), "woken, not timed out");
    }

    #[test]
    fn too_few_queues_for_the_shards_is_a_clear_error() {
        let n = name("fewq");
        let _a = ShmDevice::open(
            &n,
            &ShmConfig {
                queues: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        let e = ShmDevice::open_queues(&n, &ShmConfig::default(), 3).unwrap_err();
        assert!(
            e.to_string()
                .contains("has 2 queues per side, fewer than the 3 shards"),
            "{e}"
        );
        let e = ShmDevice::open(
            &n,
            &ShmConfig {
                queues: Some(4),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("2 queues per side"), "{e}");
        assert!(matches!(
            ShmDevice::open_queues(&n, &ShmConfig::default(), 17),
            Err(LinkError::BadQueues(17))
        ));
        let b = ShmDevice::open_queues(&n, &ShmConfig::default(), 2).unwrap();
        assert_eq!(b.len(), 2);
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
