//! The shared-memory Ethernet: a point-to-point link between two unprivileged processes
//! through one file in `/dev/shm`.
//!
//! # Layout of `/dev/shm/usnet-shm-NAME`
//!
//! ```text
//! 0      header page (4096 bytes)
//!          0  magic "usnetshm" (u64, written last by the initialiser)
//!          8  version u32 · 12 mtu u32 · 16 slot size u32 · 20 slot count u32
//!        128  side A {pid i32, claimed u32, generation u32}
//!        256  side B {pid i32, claimed u32, generation u32}
//!        512  ring 0 (A→B) control · 1024 ring 1 (B→A) control, each:
//!               +0   head: producer index (written only by the producer)
//!               +128 tail: consumer index (written only by the consumer)
//!               +256 seq: futex word the consumer sleeps on · +260 need_wake flag
//! 4096   ring 0 slots, then ring 1 slots: `count` slots of `slot size` bytes, each
//!        {len: u32, reserved: u32, frame bytes}
//! ```
//!
//! Indices are free-running `u32`s; slot `i` lives at `i & (count - 1)`. The ring holds
//! `head - tail` frames. Ownership: slots in `[tail, head)` belong to the consumer, the
//! rest to the producer.
//!
//! # Memory ordering
//! * Producer: writes slot bytes and `len`, then `head.store(Release)` once per burst.
//!   Consumer: `head.load(Acquire)` before reading any slot, so it sees the bytes.
//! * Consumer: reads slots, then `tail.store(Release)` once per burst. Producer:
//!   `tail.load(Acquire)` before overwriting a slot, so the consumer's reads are done.
//!   The producer re-reads `tail` only when its cached copy says the ring is full, and
//!   the consumer re-reads `head` only when its cached copy says the ring is empty: a busy
//!   link moves frames without touching the other side's cache line on every frame and
//!   without system calls.
//!
//! # Wake-ups without lost wake-ups
//! Consumer about to sleep:  (1) `s = seq.load`, (2) `need_wake = 1`, (3) SeqCst fence,
//! (4) re-check `head`, (5) `FUTEX_WAIT(seq, s)`.
//! Producer after publishing: (a) `head.store(Release)`, (b) SeqCst fence, (c) if
//! `need_wake` is set: clear it, `seq += 1`, `FUTEX_WAKE(seq)`.
//! The two fences are totally ordered. If (b) comes first, the consumer's check (4) sees
//! the new `head` and does not sleep. If (3) comes first, the producer's load (c) sees
//! `need_wake == 1` and bumps `seq`; the consumer read `s` before that bump, so its
//! FUTEX_WAIT either finds `seq != s` and returns at once, or is already queued and is
//! woken (the kernel compares the word and queues the waiter under one lock). Either
//! way a published frame never waits for a timeout.
//!
//! The futex is shared (not FUTEX_PRIVATE) because the word lives in a file mapping used
//! by two processes. The consumer sleeps in slices of at most 200 ms and checks between
//! slices whether the peer is still alive, so a peer that died is noticed within ~0.2 s.
//!
//! # Sides and claims
//! Opening takes an exclusive `flock` on the file for the whole open (and close), so two
//! simultaneous first openers cannot both initialise it. The first opener initialises the
//! file and becomes side A, the next one side B. A side whose owner died (its pid no
//! longer exists) is reclaimed by the next opener; when both sides are held by live
//! processes, a third opener gets [`LinkError::ShmInUse`]. Liveness uses `kill(pid, 0)`,
//! so both processes must share a pid namespace, and a dead child that its parent has not
//! reaped yet (a zombie) still counts as alive. On close a side clears its claim and wakes
//! the peer; the last one out unlinks the file.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use usnet_pool::{PacketPool, PktBuf};

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
const VERSION: u32 = 1;
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
const RING_NEED_WAKE: usize = 260;
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

/// The mapping of the shared file. Every access to shared control words goes through
/// atomics; frame bytes are copied through raw pointers only inside slots this side owns.
struct Shared {
    map: MmapRaw,
}

impl Shared {
    fn atomic<T>(&self, off: usize) -> *const T {
        assert!(
            off & (std::mem::align_of::<T>() - 1) == 0
                && off + std::mem::size_of::<T>() <= HDR_SIZE
        );
        // SAFETY: `off` is inside the header page of the mapping (checked above; the
        // mapping is at least HDR_SIZE long, checked at open) and suitably aligned (the
        // mapping is page aligned).
        unsafe { self.map.as_mut_ptr().add(off) as *const T }
    }
    fn u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: aligned, in bounds (see `atomic`), lives as long as `self`; only ever
        // accessed atomically by both processes.
        unsafe { &*self.atomic::<AtomicU32>(off) }
    }
    fn i32(&self, off: usize) -> &AtomicI32 {
        // SAFETY: as for `u32`.
        unsafe { &*self.atomic::<AtomicI32>(off) }
    }
    fn u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as for `u32`.
        unsafe { &*self.atomic::<AtomicU64>(off) }
    }
    fn len(&self) -> usize {
        self.map.len()
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 in a shared mapping; `ts` outlives the call.
    // FUTEX_WAIT only reads the word; every outcome (woken, EAGAIN, ETIMEDOUT, EINTR) is
    // handled by the caller re-checking state.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32 in a shared mapping; FUTEX_WAKE does not touch
    // memory beyond looking up waiters on that address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists; it sends nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
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

/// One direction's ring, seen from this process.
#[derive(Debug, Clone, Copy)]
struct Ring {
    ctrl: usize,
    slots: usize,
}

impl Ring {
    fn new(r: usize, count: usize, slot_size: usize) -> Ring {
        Ring {
            ctrl: OFF_RING[r],
            slots: HDR_SIZE + r * count * slot_size,
        }
    }
}

/// One end of a shm link.
pub struct ShmDevice {
    label: String,
    path: PathBuf,
    file: File,
    shared: Arc<Shared>,
    side: usize,
    tx: Ring,
    rx: Ring,
    mask: u32,
    count: u32,
    slot_size: usize,
    mtu: usize,
    max_frame: usize,
    spin: Duration,
    /// Producer index of the tx ring (only we write it) and our last view of its tail.
    tx_head: u32,
    tx_tail_cache: u32,
    /// Consumer index of the rx ring (only we write it) and our last view of its head.
    rx_tail: u32,
    rx_head_cache: u32,
    /// The rx ring's `seq` as of the last wake-up `wait` acted on.
    seen_seq: u32,
    /// Our claim's generation: on close we clear the claim only if it is still ours.
    generation: u32,
    /// (checked at, peer pid, alive): `kill(pid, 0)` runs at most every 50 ms.
    alive_cache: Cell<(Instant, i32, bool)>,
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
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| LinkError::io(ctx("cannot open"), e))?;
            flock(&file, libc::LOCK_EX).map_err(|e| LinkError::io(ctx("cannot lock"), e))?;
            let ours = file
                .metadata()
                .map_err(|e| LinkError::io(ctx("cannot stat"), e))?;
            match std::fs::metadata(&path) {
                Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => break file,
                _ => continue, // dropping `file` releases the lock
            }
        };
        // The device keeps a duplicate of the descriptor (same open file, same lock).
        let r = Self::open_locked(name, cfg, path, &file);
        let _ = flock(&file, libc::LOCK_UN);
        r
    }

    fn open_locked(
        name: &str,
        cfg: &ShmConfig,
        path: PathBuf,
        file: &File,
    ) -> Result<ShmDevice, LinkError> {
        let ctx = |what: &str| format!("shm:{name}: {what} {}", path.display());
        let map_file = |len: usize| -> Result<Arc<Shared>, LinkError> {
            let map = MmapOptions::new()
                .len(len)
                .map_raw(file)
                .map_err(|e| LinkError::io(ctx("cannot map"), e))?;
            Ok(Arc::new(Shared { map }))
        };
        let file_len = file
            .metadata()
            .map_err(|e| LinkError::io(ctx("cannot stat"), e))?
            .len() as usize;

        // Look at an existing, initialised file.
        let mut existing: Option<(Arc<Shared>, Layout, [bool; 2])> = None;
        if file_len >= HDR_SIZE {
            let sh = map_file(file_len)?;
            if sh.u64(OFF_MAGIC).load(Ordering::Acquire) == MAGIC {
                let live = [0, 1].map(|s| {
                    sh.u32(OFF_SIDE[s] + SIDE_CLAIMED).load(Ordering::SeqCst) == 1
                        && pid_alive(sh.i32(OFF_SIDE[s] + SIDE_PID).load(Ordering::SeqCst))
                });
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

        let (shared, lay, side) = match existing {
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
        if shared.len() < lay.total() {
            return Err(LinkError::ShmMismatch {
                name: name.to_string(),
                what: "a truncated file".into(),
            });
        }

        let tx = Ring::new(side, lay.slots, lay.slot_size);
        let rx = Ring::new(1 - side, lay.slots, lay.slot_size);
        // Frames left in our rx ring were meant for a previous owner of this side (or
        // were sent while the link was down): discard them. Then claim.
        let rx_head = shared.u32(rx.ctrl + RING_HEAD).load(Ordering::Acquire);
        shared
            .u32(rx.ctrl + RING_TAIL)
            .store(rx_head, Ordering::Release);
        shared
            .u32(rx.ctrl + RING_NEED_WAKE)
            .store(0, Ordering::SeqCst);
        let me = OFF_SIDE[side];
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        shared.i32(me + SIDE_PID).store(pid, Ordering::SeqCst);
        let generation = shared
            .u32(me + SIDE_GEN)
            .fetch_add(1, Ordering::SeqCst)
            .wrapping_add(1);
        shared.u32(me + SIDE_CLAIMED).store(1, Ordering::SeqCst);

        let tx_head = shared.u32(tx.ctrl + RING_HEAD).load(Ordering::Acquire);
        let tx_tail = shared.u32(tx.ctrl + RING_TAIL).load(Ordering::Acquire);
        let seen_seq = shared.u32(rx.ctrl + RING_SEQ).load(Ordering::SeqCst);
        Ok(ShmDevice {
            label: format!("shm:{name}"),
            path: path.clone(),
            file: file
                .try_clone()
                .map_err(|e| LinkError::io(ctx("cannot dup"), e))?,
            shared,
            side,
            tx,
            rx,
            mask: lay.slots as u32 - 1,
            count: lay.slots as u32,
            slot_size: lay.slot_size,
            mtu: lay.mtu,
            max_frame: lay.mtu + FRAME_OVERHEAD,
            spin: cfg.spin,
            tx_head,
            tx_tail_cache: tx_tail,
            rx_tail: rx_head,
            rx_head_cache: rx_head,
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

    fn peer_up(&self) -> bool {
        let peer = OFF_SIDE[1 - self.side];
        if self.shared.u32(peer + SIDE_CLAIMED).load(Ordering::Acquire) != 1 {
            return false;
        }
        let pid = self.shared.i32(peer + SIDE_PID).load(Ordering::Acquire);
        let (at, cached_pid, alive) = self.alive_cache.get();
        if cached_pid == pid && at.elapsed() < LIVENESS_CACHE {
            return alive;
        }
        let alive = pid_alive(pid);
        self.alive_cache.set((Instant::now(), pid, alive));
        alive
    }

    fn slot_ptr(&self, ring: Ring, idx: u32) -> *mut u8 {
        let off = ring.slots + (idx & self.mask) as usize * self.slot_size;
        debug_assert!(off + self.slot_size <= self.shared.len());
        // SAFETY: `off` is inside the mapping: the ring's slot area was checked against
        // the mapping length at open and `idx & mask < count`.
        unsafe { self.shared.map.as_mut_ptr().add(off) }
    }

    fn rx_pending(&mut self) -> bool {
        if self.rx_head_cache != self.rx_tail {
            return true;
        }
        self.rx_head_cache = self
            .shared
            .u32(self.rx.ctrl + RING_HEAD)
            .load(Ordering::Acquire);
        self.rx_head_cache != self.rx_tail
    }

    /// Wakes the peer if it is asleep on our tx ring (see the module docs for ordering).
    fn notify_peer(&self) {
        fence(Ordering::SeqCst);
        let need = self.shared.u32(self.tx.ctrl + RING_NEED_WAKE);
        if need.load(Ordering::Relaxed) != 0 && need.swap(0, Ordering::SeqCst) != 0 {
            let seq = self.shared.u32(self.tx.ctrl + RING_SEQ);
            seq.fetch_add(1, Ordering::SeqCst);
            futex_wake(seq);
        }
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
        if max == 0 || !self.rx_pending() {
            return Ok(0);
        }
        let avail = self.rx_head_cache.wrapping_sub(self.rx_tail);
        if avail > self.count {
            // The peer wrote nonsense into its head index: resynchronise, count it.
            self.stats.rx_errors += 1;
            self.rx_tail = self.rx_head_cache;
            self.shared
                .u32(self.rx.ctrl + RING_TAIL)
                .store(self.rx_tail, Ordering::Release);
            return Ok(0);
        }
        let n = (avail as usize).min(max);
        let mut added = 0;
        for i in 0..n as u32 {
            let slot = self.slot_ptr(self.rx, self.rx_tail.wrapping_add(i));
            // SAFETY: the slot is in [tail, head) so the producer published it (Acquire
            // load of head in rx_pending) and will not touch it until we advance tail; the
            // slot start is 64-byte aligned.
            let len = unsafe { std::ptr::read_volatile(slot as *const u32) } as usize;
            if len == 0 || len > self.max_frame {
                self.stats.rx_errors += 1;
                continue;
            }
            // SAFETY: as above; len <= max_frame and SLOT_HDR + max_frame <= slot_size, so
            // the slice stays inside this slot.
            let bytes = unsafe { std::slice::from_raw_parts(slot.add(SLOT_HDR), len) };
            // SAFETY: same slot, the flags word at offset 4 (aligned).
            let flags = unsafe { std::ptr::read_volatile(slot.add(4) as *const u32) };
            match pool.alloc_from(bytes) {
                Some(b) => {
                    if flags & SLOT_CSUM_TRUSTED != 0 {
                        let mut o = pool.offload(b);
                        o.csum_valid = true;
                        pool.set_offload(b, o);
                    }
                    out.push(b);
                    added += 1;
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += len as u64;
                }
                None => self.stats.rx_no_buffer += 1,
            }
        }
        self.rx_tail = self.rx_tail.wrapping_add(n as u32);
        // One Release store per burst hands every slot we read back to the producer.
        self.shared
            .u32(self.rx.ctrl + RING_TAIL)
            .store(self.rx_tail, Ordering::Release);
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
        let mut head = self.tx_head;
        let mut sent = 0;
        while let Some(&f) = frames.front() {
            let len = pool.chain_len(f);
            if len == 0 || len > self.max_frame {
                frames.pop_front();
                pool.free(f);
                self.stats.tx_dropped += 1;
                continue;
            }
            if head.wrapping_sub(self.tx_tail_cache) >= self.count {
                self.tx_tail_cache = self
                    .shared
                    .u32(self.tx.ctrl + RING_TAIL)
                    .load(Ordering::Acquire);
                if head.wrapping_sub(self.tx_tail_cache) >= self.count {
                    self.stats.tx_full += 1;
                    break;
                }
            }
            let slot = self.slot_ptr(self.tx, head);
            let mut off = SLOT_HDR;
            let mut cur = Some(f);
            while let Some(c) = cur {
                let d = pool.data(c);
                // SAFETY: the slot is outside [tail, head) so the consumer is done with it
                // (Acquire load of tail); off + d.len() <= SLOT_HDR + len <= slot_size.
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), slot.add(off), d.len()) };
                off += d.len();
                cur = pool.next(c);
            }
            let o = pool.offload(f);
            let flags = if o.needs_csum || o.csum_valid {
                SLOT_CSUM_TRUSTED
            } else {
                0
            };
            // SAFETY: same slot: aligned u32s at its start (length) and at offset 4 (flags).
            unsafe {
                std::ptr::write_volatile(slot as *mut u32, len as u32);
                std::ptr::write_volatile(slot.add(4) as *mut u32, flags);
            }
            head = head.wrapping_add(1);
            frames.pop_front();
            pool.free(f);
            sent += 1;
            self.stats.tx_frames += 1;
            self.stats.tx_bytes += len as u64;
        }
        if head != self.tx_head {
            self.tx_head = head;
            // One Release store per burst publishes every slot written above.
            self.shared
                .u32(self.tx.ctrl + RING_HEAD)
                .store(head, Ordering::Release);
            self.notify_peer();
        }
        Ok(sent)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let seq = self.shared.clone();
        let seq = seq.u32(self.rx.ctrl + RING_SEQ);
        let need_wake = self.shared.clone();
        let need_wake = need_wake.u32(self.rx.ctrl + RING_NEED_WAKE);
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        // Spin briefly: a busy peer usually delivers within a few microseconds, and
        // sleeping costs two system calls on each side.
        let spin = timeout.map_or(self.spin, |t| t.min(self.spin));
        loop {
            if self.rx_pending() {
                return Ok(());
            }
            let s = seq.load(Ordering::SeqCst);
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
            // (1) read seq, (2) raise the flag, (3) fence, (4) re-check, (5) sleep.
            let s = seq.load(Ordering::SeqCst);
            if s != self.seen_seq {
                // A waker or the peer bumped it since we last looked.
                self.seen_seq = s;
                return Ok(());
            }
            need_wake.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.rx_pending() {
                need_wake.store(0, Ordering::Relaxed);
                return Ok(());
            }
            futex_wait(seq, s, slice);
            need_wake.store(0, Ordering::Relaxed);
            if self.link_state() != entry_state {
                return Ok(());
            }
            // Loop: the top re-checks seq (woken) and the ring; a timeout just continues.
        }
    }

    fn waker(&self) -> Waker {
        Arc::new(ShmWaker {
            shared: self.shared.clone(),
            seq: self.rx.ctrl + RING_SEQ,
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
    shared: Arc<Shared>,
    seq: usize,
}

impl Wake for ShmWaker {
    fn wake(&self) {
        let seq = self.shared.u32(self.seq);
        seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(seq);
    }
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        let _ = flock(&self.file, libc::LOCK_EX);
        let me = OFF_SIDE[self.side];
        // If we were declared dead and our side reclaimed, the claim is not ours to clear.
        if self.shared.u32(me + SIDE_GEN).load(Ordering::SeqCst) == self.generation {
            self.shared
                .u32(me + SIDE_CLAIMED)
                .store(0, Ordering::SeqCst);
            self.shared.i32(me + SIDE_PID).store(0, Ordering::SeqCst);
        }
        // Wake the peer so it notices at once that we are gone.
        let seq = self.shared.u32(self.tx.ctrl + RING_SEQ);
        seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(seq);
        let peer = OFF_SIDE[1 - self.side];
        let peer_live = self.shared.u32(peer + SIDE_CLAIMED).load(Ordering::SeqCst) == 1
            && pid_alive(self.shared.i32(peer + SIDE_PID).load(Ordering::SeqCst));
        if !peer_live {
            // Last one out: remove the file, but only if the name still refers to it.
            if let (Ok(ours), Ok(now)) = (self.file.metadata(), std::fs::metadata(&self.path)) {
                if ours.ino() == now.ino() && ours.dev() == now.dev() {
                    let _ = std::fs::remove_file(&self.path);
                }
            }
        }
        let _ = flock(&self.file, libc::LOCK_UN);
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
                p.copy_chain(b, &mut v);
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
                p.copy_chain(f, &mut v);
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
        // Pretend B's process died: put a pid that no longer exists into its claim.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        b.shared
            .i32(OFF_SIDE[1] + SIDE_PID)
            .store(dead, Ordering::SeqCst);
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
        for (&f, &s) in got.iter().zip(&sizes) {
            if s > 2048 {
                assert!(p.next(f).is_some(), "chained");
            }
            p.copy_chain(f, &mut v);
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
            p.copy_chain(got[0], &mut v);
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
        let rx = std::thread::spawn(move || {
            let mut p = pool(4096, 2048);
            let mut got = Vec::with_capacity(64);
            let mut count = 0u64;
            while count < N {
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
