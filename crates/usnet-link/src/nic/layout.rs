//! The emulated NIC's shared-memory layout: one file `/dev/shm/usnet-nic-NAME`.
//!
//! ```text
//! page 0          register page: config (driver writes once), driver registers,
//!                 device registers, the interrupt line (futex word), raise-time log
//! page 1..        RX descriptor ring   (rx_ring x 16 B)
//! ..              TX descriptor ring   (tx_ring x 16 B)
//! ..              RX packet buffers    (rx_ring x buf_size)
//! ..              TX packet buffers    (tx_ring x buf_size)
//! ```
//!
//! Ownership (netmap style, written next to every field in `docs/nicemu.md`): the driver
//! creates the file and writes the config block once, before `STATE` becomes `READY`.
//! Registers are written by one side only (`irq_status` is the exception: the device sets
//! bits, the driver clears them by swapping in 0). A descriptor belongs to the device while
//! its `OWN` bit is set and to the driver while it is clear; the side that owns it is the
//! only one that writes it. Nothing either side reads from the other is trusted.
//!
//! Liveness: each side holds an open-file-description lock on one byte of the file
//! ([`LOCK_DRIVER`], [`LOCK_DEVICE`]) for as long as it lives (`usnet_shm::liveness`).

/// Byte of the file locked by the driver while it lives.
pub const LOCK_DRIVER: u64 = 0;
/// Byte of the file locked by the device side while it lives.
pub const LOCK_DEVICE: u64 = 1;

/// `"USNETNIC"` little endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"USNETNIC");
pub const VERSION: u32 = 1;
pub const PAGE: usize = 4096;
pub const DESC_SIZE: usize = 16;

// ---- config block (driver writes once, before STATE = READY) ----
pub const R_MAGIC: usize = 0x000; // u64
pub const R_VERSION: usize = 0x008; // u32
pub const R_STATE: usize = 0x00c; // u32: 0 initialising, 1 ready
pub const R_RX_RING: usize = 0x010; // u32 descriptors
pub const R_TX_RING: usize = 0x014; // u32 descriptors
pub const R_BUF_SIZE: usize = 0x018; // u32 bytes per packet buffer
pub const R_MTU: usize = 0x01c; // u32 L3 MTU
pub const R_MAC_LO: usize = 0x020; // u32 bytes 0..4 of the driver's MAC
pub const R_MAC_HI: usize = 0x024; // u32 bytes 4..6
pub const R_RX_DESC_OFF: usize = 0x028; // u64
pub const R_TX_DESC_OFF: usize = 0x030; // u64
pub const R_RX_BUF_OFF: usize = 0x038; // u64
pub const R_TX_BUF_OFF: usize = 0x040; // u64
pub const R_TOTAL_LEN: usize = 0x048; // u64

// ---- driver-written registers (own cache line) ----
/// Next RX descriptor the driver will look at (RDT-like; informational for the device).
pub const R_RX_TAIL: usize = 0x080;
/// One past the last TX descriptor the driver has handed over (TDT, the doorbell).
pub const R_TX_TAIL: usize = 0x084;
/// Interrupt mask: a cause raises the line only while its bit is set here.
pub const R_IRQ_MASK: usize = 0x088;
/// Interrupt moderation: minimum ns between two raised interrupts (0 = none).
pub const R_ITR_NS: usize = 0x08c;
/// Interrupt moderation: raise once per this many completed RX packets (0/1 = each).
pub const R_ITR_PKTS: usize = 0x090;
/// Non-zero while the driver may sleep on the interrupt line (device must FUTEX_WAKE):
/// the `sleepers` word of the line's doorbell (`usnet_shm::doorbell::Gate`).
pub const R_DRV_SLEEPING: usize = 0x094;

// ---- device-written registers (own cache line) ----
/// Next RX descriptor the device will fill (RDH).
pub const R_RX_HEAD: usize = 0x100;
/// Next TX descriptor the device will consume (TDH).
pub const R_TX_HEAD: usize = 0x104;
/// 1 = link up (carrier), 0 = down.
pub const R_LINK: usize = 0x108;
/// Frames the device could not place for lack of a free RX descriptor (u64, MPC-like).
pub const R_RX_MISSED: usize = 0x110;
/// Frames the device generated (u64): delivered + missed + dropped by injected faults.
pub const R_DEV_FRAMES: usize = 0x118;
/// How many device sides have attached over the file's life.
pub const R_ATTACHES: usize = 0x120;

// ---- interrupt status: device sets bits (fetch_or), driver reads-to-clear (swap 0) ----
pub const R_IRQ_STATUS: usize = 0x140;
// ---- the interrupt line: futex word (the doorbell's `seq`), device increments once per
// raised interrupt ----
pub const R_IRQ_SEQ: usize = 0x180;
/// Raise-time log: u64 CLOCK_MONOTONIC ns of interrupt `seq`, at `R_IRQ_LOG + 8*(seq % N)`.
pub const R_IRQ_LOG: usize = 0x800;
pub const IRQ_LOG_LEN: usize = 256;

// ---- interrupt causes ----
pub const IRQ_RX: u32 = 1;
pub const IRQ_TX: u32 = 2;
pub const IRQ_LINK: u32 = 4;
/// The device found no free RX descriptor (frame missed).
pub const IRQ_RX_NOBUF: u32 = 8;
pub const IRQ_ALL: u32 = IRQ_RX | IRQ_TX | IRQ_LINK | IRQ_RX_NOBUF;

// ---- descriptor: 16 bytes, four u32 words ----
/// Buffer index (into the RX or TX buffer area of this ring).
pub const D_BUF: usize = 0;
/// RX: driver writes the buffer capacity, device writes the bytes placed.
/// TX: driver writes the bytes to send.
pub const D_LEN: usize = 4;
/// Status/command bits below.
pub const D_FLAGS: usize = 8;
/// Reserved (device may write a sequence/timestamp; the driver ignores it).
pub const D_AUX: usize = 12;

/// Set: the device owns the descriptor. Cleared by the device when done (RX filled,
/// TX sent); set by the driver when it hands the descriptor (back) to the device.
pub const F_OWN: u32 = 1 << 31;
/// End of ring: the last descriptor (RTL8169 EOR); the device wraps after it.
pub const F_EOR: u32 = 1 << 30;
/// First segment of a frame.
pub const F_FS: u32 = 1 << 29;
/// Last segment of a frame.
pub const F_LS: u32 = 1 << 28;
/// RX: the device reports an error on this frame (driver drops it).
pub const F_ERR: u32 = 1 << 27;

/// Smallest / largest frames the NIC moves (64 B .. 64 KiB).
pub const MIN_FRAME: usize = 14;
pub const MAX_FRAME: usize = 65536;

/// The sizes and offsets of one NIC instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub rx_ring: u32,
    pub tx_ring: u32,
    pub buf_size: u32,
    pub rx_desc_off: usize,
    pub tx_desc_off: usize,
    pub rx_buf_off: usize,
    pub tx_buf_off: usize,
    pub total_len: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("ring size {0} must be a power of two between 8 and 32768")]
    BadRing(u32),
    #[error("buffer size {0} must be a multiple of 64 between 256 and 65536")]
    BadBufSize(u32),
    #[error("shared layout is inconsistent: {0}")]
    Inconsistent(&'static str),
}

fn align_page(x: usize) -> usize {
    x.div_ceil(PAGE) * PAGE
}

impl Layout {
    pub fn new(rx_ring: u32, tx_ring: u32, buf_size: u32) -> Result<Self, LayoutError> {
        for r in [rx_ring, tx_ring] {
            if !(8..=32768).contains(&r) || !r.is_power_of_two() {
                return Err(LayoutError::BadRing(r));
            }
        }
        if !(256..=65536).contains(&buf_size) || buf_size & 63 != 0 {
            return Err(LayoutError::BadBufSize(buf_size));
        }
        let rx_desc_off = PAGE;
        let tx_desc_off = align_page(rx_desc_off + rx_ring as usize * DESC_SIZE);
        let rx_buf_off = align_page(tx_desc_off + tx_ring as usize * DESC_SIZE);
        let tx_buf_off = align_page(rx_buf_off + rx_ring as usize * buf_size as usize);
        let total_len = align_page(tx_buf_off + tx_ring as usize * buf_size as usize);
        Ok(Layout {
            rx_ring,
            tx_ring,
            buf_size,
            rx_desc_off,
            tx_desc_off,
            rx_buf_off,
            tx_buf_off,
            total_len,
        })
    }

    /// Checks a layout read from shared memory against what it must be and the file's
    /// real size (the reader never trusts the writer's offsets).
    pub fn validate_read(
        rx_ring: u32,
        tx_ring: u32,
        buf_size: u32,
        offs: [u64; 5],
        file_len: usize,
    ) -> Result<Self, LayoutError> {
        let l = Layout::new(rx_ring, tx_ring, buf_size)?;
        let want = [
            l.rx_desc_off,
            l.tx_desc_off,
            l.rx_buf_off,
            l.tx_buf_off,
            l.total_len,
        ];
        if offs.iter().zip(want).any(|(&a, b)| a != b as u64) {
            return Err(LayoutError::Inconsistent(
                "offsets differ from the computed layout",
            ));
        }
        if l.total_len > file_len {
            return Err(LayoutError::Inconsistent("file shorter than the layout"));
        }
        Ok(l)
    }

    pub fn rx_desc(&self, i: u32) -> usize {
        self.rx_desc_off + (i % self.rx_ring) as usize * DESC_SIZE
    }
    pub fn tx_desc(&self, i: u32) -> usize {
        self.tx_desc_off + (i % self.tx_ring) as usize * DESC_SIZE
    }
    /// Byte offset of RX buffer `b`, `None` when the index is out of range.
    pub fn rx_buf(&self, b: u32) -> Option<usize> {
        (b < self.rx_ring).then(|| self.rx_buf_off + b as usize * self.buf_size as usize)
    }
    pub fn tx_buf(&self, b: u32) -> Option<usize> {
        (b < self.tx_ring).then(|| self.tx_buf_off + b as usize * self.buf_size as usize)
    }
}

/// The file behind NIC `name`.
pub fn shm_path(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/usnet-nic-{name}"))
}

/// A NIC name is a short token usable in a file name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_page_aligned_and_validates() {
        let l = Layout::new(256, 64, 2048).unwrap();
        for off in [
            l.rx_desc_off,
            l.tx_desc_off,
            l.rx_buf_off,
            l.tx_buf_off,
            l.total_len,
        ] {
            assert_eq!(off % PAGE, 0);
        }
        assert_eq!(l.rx_buf(255), Some(l.rx_buf_off + 255 * 2048));
        assert_eq!(l.rx_buf(256), None);
        assert_eq!(l.tx_buf(64), None);
        let offs = [
            l.rx_desc_off as u64,
            l.tx_desc_off as u64,
            l.rx_buf_off as u64,
            l.tx_buf_off as u64,
            l.total_len as u64,
        ];
        assert_eq!(
            Layout::validate_read(256, 64, 2048, offs, l.total_len),
            Ok(l)
        );
        assert!(Layout::validate_read(256, 64, 2048, offs, l.total_len - 1).is_err());
        let mut bad = offs;
        bad[2] += 64;
        assert!(Layout::validate_read(256, 64, 2048, bad, l.total_len).is_err());
        assert!(Layout::new(100, 64, 2048).is_err());
        assert!(Layout::new(256, 64, 100).is_err());
        // Registers never overlap the log and stay in page 0.
        const { assert!(R_IRQ_SEQ < R_IRQ_LOG && R_IRQ_LOG + 8 * IRQ_LOG_LEN <= PAGE) };
    }

    #[test]
    fn names() {
        assert!(valid_name("nic0"));
        assert!(!valid_name("../x"));
        assert!(!valid_name(""));
        assert!(!valid_name(".hidden"));
    }
}
