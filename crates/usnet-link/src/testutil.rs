//! Test helpers: an in-memory device and a pool.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use usnet_pool::{PacketPool, PktBuf, PoolConfig};

use crate::{Device, DeviceCaps, DeviceStats, Wake, Waker};

pub(crate) fn pool(count: u32, buf_size: usize) -> PacketPool {
    PacketPool::new(&PoolConfig {
        count,
        buf_size,
        ..Default::default()
    })
    .unwrap()
}

/// Delivers the frames in `to_rx`; records what it sends in `sent`, at most
/// `tx_per_call` frames per `tx_burst` (to exercise back-pressure).
pub(crate) struct MemDevice {
    pub to_rx: VecDeque<Vec<u8>>,
    pub sent: Vec<Vec<u8>>,
    pub tx_per_call: usize,
    pub stats: DeviceStats,
}

impl MemDevice {
    pub fn new() -> Self {
        MemDevice {
            to_rx: VecDeque::new(),
            sent: Vec::new(),
            tx_per_call: usize::MAX,
            stats: DeviceStats::default(),
        }
    }
}

struct NoWake;
impl Wake for NoWake {
    fn wake(&self) {}
}

impl Device for MemDevice {
    fn name(&self) -> &str {
        "mem"
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            mtu: 1500,
            rx_csum_offload: false,
            tx_csum_offload: false,
            tso: false,
            max_burst: 32,
        }
    }
    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> std::io::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(f) = self.to_rx.pop_front() else {
                break;
            };
            let b = pool.alloc_from(&f).expect("test pool large enough");
            out.push(b);
            self.stats.rx_frames += 1;
            n += 1;
        }
        Ok(n)
    }
    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> std::io::Result<usize> {
        let mut n = 0;
        while n < self.tx_per_call {
            let Some(f) = frames.pop_front() else { break };
            let mut v = Vec::new();
            pool.copy_chain(&f, &mut v);
            self.sent.push(v);
            pool.free(f);
            self.stats.tx_frames += 1;
            n += 1;
        }
        if !frames.is_empty() {
            self.stats.tx_full += 1;
        }
        Ok(n)
    }
    fn wait(&mut self, _timeout: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }
    fn waker(&self) -> Waker {
        Arc::new(NoWake)
    }
    fn prepare_wait(&mut self) -> crate::WaitPlan {
        crate::WaitPlan::ready()
    }
    fn stats(&self) -> DeviceStats {
        self.stats
    }
}
