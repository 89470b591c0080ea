//! Devices: where frames come from and go to.
//!
//! Every device moves whole Ethernet frames held in pool buffers, in bursts, behind the
//! small [`Device`] trait: shm, tap, af_packet, AF_XDP ([`xdp`], whose UMEM is the
//! stack's own pool) and the emulated NIC's driver ([`nic`]).
//! Wrappers ([`pcap::PcapWriter`], [`fault::FaultInjector`]) are
//! devices that wrap devices. Each device says what a loop sleeps on while it waits
//! for frames ([`Device::prepare_wait`]: an fd or a futex bell), so one wait can cover
//! the device and a loop's other doorbells ([`wait_device`]). The stack never sees a
//! device: `usnet-driver` joins the two.

pub mod af_packet;
pub mod bpf;
mod chain_read;
pub mod ebpf;
pub mod error;
pub mod fault;
pub mod nic;
pub mod pcap;
pub mod shm;
pub mod spec;
mod sys;
pub mod tap;
#[cfg(test)]
pub(crate) mod testutil;
mod wait;
pub mod xdp;

pub use error::LinkError;
pub use spec::{open, open_shards, wrap, LinkOptions, LinkSpec};
pub use sys::run_ip;
pub use wait::{sleep_on, wait_device, Doorbell, WaitKind, WaitPlan, WaitSpec};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{PacketPool, PktBuf};

/// What a device can do; the stack adapts its MTU and offload use to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest IP packet (L3 MTU) the link carries; frames are this plus 14 (or 18 tagged).
    pub mtu: usize,
    /// Received frames may arrive with `Offload::csum_valid` set (checksum verified by the
    /// peer/kernel), so the stack may skip verifying it.
    pub rx_csum_offload: bool,
    /// The device finishes partial L4 checksums (`Offload::needs_csum`) on transmit.
    pub tx_csum_offload: bool,
    /// The device accepts TCP frames larger than the MTU with `Offload::gso_size` set.
    pub tso: bool,
    /// Frames the device can move in one burst.
    pub max_burst: usize,
}

impl DeviceCaps {
    /// A device with no offloads that moves 64 frames a burst: what memory links and
    /// tests model.
    pub fn plain(mtu: usize) -> DeviceCaps {
        DeviceCaps {
            mtu,
            rx_csum_offload: false,
            tx_csum_offload: false,
            tso: false,
            max_burst: 64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// The peer is gone (shm peer died, TAP interface removed, emulated device stopped).
    Down,
}

/// Counters every device keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames lost on receive because no pool buffer was free.
    pub rx_no_buffer: u64,
    /// Received frames rejected by the device (too long, bad descriptor, bad vnet header).
    pub rx_errors: u64,
    /// Transmit attempts refused because the ring/queue was full (back-pressure, retried).
    pub tx_full: u64,
    /// Frames dropped on transmit (too large, device error).
    pub tx_dropped: u64,
    /// Frames the kernel dropped before usnet saw them, its receive ring being
    /// full (AF_PACKET's PACKET_STATISTICS `tp_drops`; AF_XDP's `rx_dropped` and
    /// `rx_ring_full`): the loop did not drain the ring fast enough.
    pub rx_ring_drops: u64,
}

impl DeviceStats {
    /// Every counter with its name (what `usnet stat` and the benches print).
    pub fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("rx_frames", self.rx_frames),
            ("rx_bytes", self.rx_bytes),
            ("tx_frames", self.tx_frames),
            ("tx_bytes", self.tx_bytes),
            ("rx_no_buffer", self.rx_no_buffer),
            ("rx_errors", self.rx_errors),
            ("rx_ring_drops", self.rx_ring_drops),
            ("tx_full", self.tx_full),
            ("tx_dropped", self.tx_dropped),
        ]
    }
}

/// Wakes a thread blocked in [`Device::wait`], from any thread.
pub trait Wake: Send + Sync {
    fn wake(&self);
}
pub type Waker = Arc<dyn Wake>;

/// A network device moving Ethernet frames in pool buffers.
pub trait Device: Send {
    fn name(&self) -> &str;
    fn caps(&self) -> DeviceCaps;
    /// Moves up to `max` received frames into buffers taken from `pool`, appended to `out`.
    /// Returns how many were added. Never blocks. `Err` only for a fatal device error.
    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> std::io::Result<usize>;
    /// Sends frames from the front of `frames`; those sent are removed and freed to `pool`.
    /// What the device cannot take now stays in `frames` (back-pressure). Never blocks.
    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> std::io::Result<usize>;
    /// Blocks until a frame may be ready to receive, the waker fires, or `timeout` passes.
    /// It may return earlier (callers loop); with no timeout a device still wakes up now
    /// and then, since nothing waits without a deadline.
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()>;
    /// A handle that interrupts `wait` from another thread.
    fn waker(&self) -> Waker;
    /// Gets ready to sleep and says on what (an fd or a futex word): arms the device's
    /// wake-up (re-enables the emulated NIC's interrupt, for one) and reads what a
    /// later wake-up will change. [`wait_device`] sleeps on the plan together with a
    /// loop's other doorbells; `wait` is the same for a device alone (plus a spin).
    fn prepare_wait(&mut self) -> WaitPlan;
    /// What [`Device::prepare_wait`] names when there is nothing to receive: a loop
    /// that waits on the device together with its own doorbells picks doorbells of
    /// this kind.
    fn wait_kind(&self) -> WaitKind {
        WaitKind::Fd
    }
    /// Whether a frame waits to be received now: a cheap look, no system call. The
    /// sleeper re-checks it after announcing itself on a futex bell (devices whose
    /// wake-up is a readable fd may keep this default).
    fn rx_ready(&mut self) -> bool {
        false
    }
    fn link_state(&self) -> LinkState {
        LinkState::Up
    }
    fn stats(&self) -> DeviceStats;
    /// A device whose buffers are the pool's own memory (AF_XDP: the pool is the
    /// UMEM) registers the pool here and lends the kernel its first buffers. Loops
    /// call it once, before the first burst, with the pool every later call passes
    /// (the device binds on its first burst otherwise); devices that copy frames keep
    /// this default.
    fn bind_pool(&mut self, _pool: &mut PacketPool) -> std::io::Result<()> {
        Ok(())
    }
    /// How the device runs, in a few words, for `usnet stat` and the startup line
    /// (AF_XDP: native or generic XDP, copy or zero-copy, its queue and kernel
    /// counters). `None`: nothing to add to the name.
    fn info(&self) -> Option<String> {
        None
    }
    /// Gives back to `pool` every buffer the device holds between calls (frames a fault
    /// injector delays or reorders). Call it before dropping a device when the pool lives
    /// on; devices that hold nothing keep this default.
    fn release_buffers(&mut self, _pool: &mut PacketPool) {}
}

impl<D: Device + ?Sized> Device for Box<D> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn caps(&self) -> DeviceCaps {
        (**self).caps()
    }
    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        (**self).rx_burst(pool, out, max)
    }
    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> std::io::Result<usize> {
        (**self).tx_burst(pool, frames)
    }
    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        (**self).wait(timeout)
    }
    fn waker(&self) -> Waker {
        (**self).waker()
    }
    fn prepare_wait(&mut self) -> WaitPlan {
        (**self).prepare_wait()
    }
    fn rx_ready(&mut self) -> bool {
        (**self).rx_ready()
    }
    fn wait_kind(&self) -> WaitKind {
        (**self).wait_kind()
    }
    fn link_state(&self) -> LinkState {
        (**self).link_state()
    }
    fn stats(&self) -> DeviceStats {
        (**self).stats()
    }
    fn bind_pool(&mut self, pool: &mut PacketPool) -> std::io::Result<()> {
        (**self).bind_pool(pool)
    }
    fn info(&self) -> Option<String> {
        (**self).info()
    }
    fn release_buffers(&mut self, pool: &mut PacketPool) {
        (**self).release_buffers(pool)
    }
}
