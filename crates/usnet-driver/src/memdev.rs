//! A device made of two in-memory queues: frames its owner injects come in, frames
//! the stack sends are collected (bytes and offload metadata) for the owner to take.
//! The packetdrill backend and tests use it where there is no wire, so they run the
//! same driver as everything else.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use usnet_link::{Device, DeviceCaps, DeviceStats, Wake, Waker};
use usnet_pool::{Offload, PacketPool, PktBuf};

#[derive(Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<(Vec<u8>, Offload)>,
    woken: bool,
    stats: DeviceStats,
}

/// The owner's handle on a [`MemDevice`]'s queues (clones share them).
#[derive(Clone, Default)]
pub struct MemQueues {
    inner: Arc<(Mutex<Queues>, Condvar)>,
}

impl MemQueues {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a frame for the stack to receive.
    pub fn inject(&self, frame: &[u8]) {
        self.lock().rx.push_back(frame.to_vec());
        self.inner.1.notify_all();
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
        self.lock().woken = true;
        self.inner.1.notify_all();
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
    pub fn new(name: &str, caps: DeviceCaps) -> (MemDevice, MemQueues) {
        let queues = MemQueues::default();
        (
            MemDevice {
                name: name.to_string(),
                caps,
                queues: queues.clone(),
            },
            queues,
        )
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
            let Some(f) = q.rx.pop_front() else {
                break;
            };
            match pool.alloc_from(&f) {
                Some(b) => {
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
            let mut bytes = Vec::with_capacity(pool.chain_len(b));
            pool.copy_chain(b, &mut bytes);
            let o = pool.offload(b);
            pool.free(b);
            q.stats.tx_frames += 1;
            q.stats.tx_bytes += bytes.len() as u64;
            q.tx.push_back((bytes, o));
            n += 1;
        }
        Ok(n)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> std::io::Result<()> {
        let (m, cv) = &*self.queues.inner;
        let mut q = m.lock().unwrap_or_else(|p| p.into_inner());
        // Nothing here sleeps without a deadline.
        let timeout = timeout.unwrap_or(Duration::from_millis(100));
        if q.rx.is_empty() && !q.woken {
            q = cv
                .wait_timeout_while(q, timeout, |q| q.rx.is_empty() && !q.woken)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        q.woken = false;
        Ok(())
    }

    fn waker(&self) -> Waker {
        Arc::new(self.queues.clone())
    }

    fn stats(&self) -> DeviceStats {
        self.queues.lock().stats
    }
}
