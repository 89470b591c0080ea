//! A device made of two in-memory queues: frames its owner injects come in, frames
//! the stack sends are collected (bytes and offload metadata) for the owner to take.
//! The packetdrill backend and tests use it where there is no wire, so they run the
//! same driver as everything else.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use usnet_link::{Device, DeviceCaps, DeviceStats, WaitPlan, WaitSpec, Wake, Waker};
use usnet_pool::{Offload, PacketPool, PktBuf};
use usnet_shm::EventFd;

#[derive(Default)]
struct Queues {
    rx: VecDeque<(Vec<u8>, Offload)>,
    tx: VecDeque<(Vec<u8>, Offload)>,
    stats: DeviceStats,
}

/// The owner's handle on a [`MemDevice`]'s queues (clones share them).
#[derive(Clone)]
pub struct MemQueues {
    queues: Arc<Mutex<Queues>>,
    /// Rung by an injection and by the waker: what a sleeping loop polls.
    bell: Arc<EventFd>,
    /// The same eventfd as the plan's device fd.
    bell_fd: Arc<OwnedFd>,
}

impl MemQueues {
    fn new() -> std::io::Result<Self> {
        let bell = EventFd::new()?;
        let bell_fd = Arc::new(bell.as_fd().try_clone_to_owned()?);
        Ok(MemQueues {
            queues: Arc::default(),
            bell: Arc::new(bell),
            bell_fd,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a frame for the stack to receive.
    pub fn inject(&self, frame: &[u8]) {
        self.inject_with(frame, Offload::default());
    }

    /// Queues a frame with receive offload metadata, as a device that coalesced it
    /// (`gso_size`: a GRO frame of segments that size) or checked its checksum
    /// would hand it up.
    pub fn inject_with(&self, frame: &[u8], offload: Offload) {
        self.lock().rx.push_back((frame.to_vec(), offload));
        self.bell.ring();
    }

    /// The oldest frame the stack sent, with its offload metadata (a partial
    /// checksum or a GSO frame is left as the stack built it).
    pub fn take_sent(&self) -> Option<(Vec<u8>, Offload)> {
        self.lock().tx.pop_front()
    }

    /// Frames waiting to be received.
    pub fn rx_pending(&self) -> usize {
        self.lock().rx.len()
    }
}

impl Wake for MemQueues {
    fn wake(&self) {
        self.bell.ring();
    }
}

/// See the module documentation.
pub struct MemDevice {
    name: String,
    caps: DeviceCaps,
    queues: MemQueues,
}

impl MemDevice {
    /// A device with these capabilities and the owner's handle on its queues.
    /// Fails only when no eventfd can be made.
    pub fn new(name: &str, caps: DeviceCaps) -> std::io::Result<(MemDevice, MemQueues)> {
        let queues = MemQueues::new()?;
        Ok((
            MemDevice {
                name: name.to_string(),
                caps,
                queues: queues.clone(),
            },
            queues,
        ))
    }
}

impl Device for MemDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn caps(&self) -> DeviceCaps {
        self.caps
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        let mut q = self.queues.lock();
        let mut n = 0;
        while n < max {
            let Some((f, o)) = q.rx.pop_front() else {
                break;
            };
            match pool.alloc_from(&f) {
                Some(b) => {
                    if o != Offload::default() {
                        pool.set_offload(&b, o);
                    }
                    q.stats.rx_frames += 1;
                    q.stats.rx_bytes += f.len() as u64;
                    out.push(b);
                    n += 1;
                }
                None => {
                    q.stats.rx_no_buffer += 1;
                    break;
                }
            }
        }
        Ok(n)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> std::io::Result<usize> {
        let mut q = self.queues.lock();
        let mut n = 0;
        while let Some(b) = frames.pop_front() {
            let mut bytes = Vec::with_capacity(pool.chain_len(&b));
            pool.copy_chain(&b, &mut bytes);
            let o = pool.offload(&b);
            pool.free(b);
            q.stats.tx_frames += 1;
            q.stats.tx_bytes += bytes.len() as u64;
            q.tx.push_back((bytes, o));
            n += 1;
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        // Nothing here sleeps without a deadline.
        let timeout = timeout.unwrap_or(Duration::from_millis(100));
        usnet_link::wait_device(self, &[], || false, timeout)
    }

    fn prepare_wait(&mut self) -> WaitPlan {
        if self.rx_ready() {
            return WaitPlan::ready();
        }
        WaitPlan {
            spec: WaitSpec::Fds {
                dev: self.queues.bell_fd.clone(),
                waker: Some(self.queues.bell.clone()),
            },
            within: None,
        }
    }

    fn rx_ready(&mut self) -> bool {
        !self.queues.lock().rx.is_empty()
    }

    fn waker(&self) -> Waker {
        Arc::new(self.queues.clone())
    }

    fn stats(&self) -> DeviceStats {
        self.queues.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnet_pool::PoolConfig;

    #[test]
    fn an_injected_frame_keeps_its_offload_metadata() {
        let caps = DeviceCaps {
            mtu: 1500,
            rx_csum_offload: false,
            tx_csum_offload: false,
            tso: false,
            max_burst: 8,
        };
        let (mut dev, q) = MemDevice::new("mem0", caps).unwrap();
        let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
        let gro = Offload {
            gso_size: 1000,
            ..Offload::default()
        };
        q.inject(&[1u8; 60]);
        q.inject_with(&[2u8; 5000], gro);
        let mut out = Vec::new();
        assert_eq!(dev.rx_burst(&mut pool, &mut out, 8).unwrap(), 2);
        assert_eq!(pool.offload(&out[0]), Offload::default());
        assert_eq!(pool.offload(&out[1]).gso_size, 1000);
        assert_eq!(pool.chain_len(&out[1]), 5000);
        for b in out {
            pool.free(b);
        }
    }
}
