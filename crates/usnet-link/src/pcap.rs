//! A device wrapper that records every frame received and every frame transmitted to a
//! pcap file (nanosecond timestamps, LINKTYPE_ETHERNET), readable by tshark/Wireshark.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use usnet_pool::{PacketPool, PktBuf};

use crate::error::LinkError;
use crate::{Device, DeviceCaps, DeviceStats, LinkState, Waker};

/// pcap magic for nanosecond-resolution timestamps (written in native byte order).
pub const PCAP_MAGIC_NANOS: u32 = 0xa1b2_3c4d;
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Largest frame recorded whole; longer ones (TSO super-frames) are truncated.
pub const PCAP_SNAPLEN: u32 = 262_144;
/// Buffered records reach the file at least this often.
pub const PCAP_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// Records the traffic of `D`. For transmit it records exactly the frames the inner device
/// took (frames it removed from the queue; a frame the inner device dropped as invalid is
/// recorded too, since the queue does not say which were dropped).
pub struct PcapWriter<D: Device> {
    inner: D,
    path: PathBuf,
    /// `None` after a write error: the device keeps working, capture stops.
    out: Option<BufWriter<File>>,
    dirty: bool,
    last_flush: Instant,
    batch: VecDeque<PktBuf>,
    snapshot: Vec<PktBuf>,
    records: u64,
    write_errors: u64,
}

impl<D: Device> PcapWriter<D> {
    /// Creates (truncates) `path` and writes the pcap file header.
    pub fn create(inner: D, path: impl AsRef<Path>) -> Result<Self, LinkError> {
        let path = path.as_ref().to_path_buf();
        let ctx = || format!("cannot write pcap file {}", path.display());
        let file = File::create(&path).map_err(|e| LinkError::io(ctx(), e))?;
        let mut out = BufWriter::with_capacity(256 * 1024, file);
        let mut hdr = [0u8; 24];
        hdr[0..4].copy_from_slice(&PCAP_MAGIC_NANOS.to_ne_bytes());
        hdr[4..6].copy_from_slice(&2u16.to_ne_bytes());
        hdr[6..8].copy_from_slice(&4u16.to_ne_bytes());
        // thiszone and sigfigs stay 0.
        hdr[16..20].copy_from_slice(&PCAP_SNAPLEN.to_ne_bytes());
        hdr[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
        out.write_all(&hdr)
            .and_then(|_| out.flush())
            .map_err(|e| LinkError::io(ctx(), e))?;
        Ok(PcapWriter {
            inner,
            path,
            out: Some(out),
            dirty: false,
            last_flush: Instant::now(),
            batch: VecDeque::new(),
            snapshot: Vec::new(),
            records: 0,
            write_errors: 0,
        })
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Frames written so far.
    pub fn records(&self) -> u64 {
        self.records
    }
    /// Write errors seen (capture stops after the first).
    pub fn write_errors(&self) -> u64 {
        self.write_errors
    }

    /// Pushes buffered records to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        self.dirty = false;
        match &mut self.out {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }

    fn record(&mut self, pool: &PacketPool, b: &PktBuf) {
        let Some(out) = &mut self.out else { return };
        let len = pool.chain_len(b);
        let incl = len.min(PCAP_SNAPLEN as usize);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&(ts.as_secs() as u32).to_ne_bytes());
        hdr[4..8].copy_from_slice(&ts.subsec_nanos().to_ne_bytes());
        hdr[8..12].copy_from_slice(&(incl as u32).to_ne_bytes());
        hdr[12..16].copy_from_slice(&(len as u32).to_ne_bytes());
        let mut r = out.write_all(&hdr);
        let mut left = incl;
        for d in pool.parts(b) {
            if left == 0 {
                break;
            }
            let n = d.len().min(left);
            r = r.and_then(|_| out.write_all(&d[..n]));
            left -= n;
        }
        match r {
            Ok(()) => {
                self.records += 1;
                self.dirty = true;
            }
            Err(_) => {
                self.write_errors += 1;
                self.out = None;
            }
        }
    }

    fn maybe_flush(&mut self) {
        if self.dirty && self.last_flush.elapsed() >= PCAP_FLUSH_INTERVAL && self.flush().is_err() {
            self.write_errors += 1;
            self.out = None;
        }
    }
}

impl<D: Device> Device for PcapWriter<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }

    fn rx_burst(
        &mut self,
        pool: &mut PacketPool,
        out: &mut Vec<PktBuf>,
        max: usize,
    ) -> io::Result<usize> {
        let start = out.len();
        let n = self.inner.rx_burst(pool, out, max)?;
        for b in &out[start..] {
            self.record(pool, b);
        }
        self.maybe_flush();
        Ok(n)
    }

    fn tx_burst(
        &mut self,
        pool: &mut PacketPool,
        frames: &mut VecDeque<PktBuf>,
    ) -> io::Result<usize> {
        // Hand the inner device at most one burst, each frame with an extra reference of
        // ours so it is still readable after the inner device freed its own.
        let k = self.inner.caps().max_burst.max(1);
        self.batch.clear();
        self.snapshot.clear();
        while self.batch.len() < k {
            let Some(f) = frames.pop_front() else { break };
            self.snapshot.push(pool.retain(&f));
            self.batch.push_back(f);
        }
        let r = self.inner.tx_burst(pool, &mut self.batch);
        let taken = self.snapshot.len() - self.batch.len();
        // Record what was taken; drop our extra reference of every frame.
        let mut snapshot = std::mem::take(&mut self.snapshot);
        for (i, f) in snapshot.drain(..).enumerate() {
            if i < taken {
                self.record(pool, &f);
            }
            pool.free(f);
        }
        self.snapshot = snapshot;
        // Not taken: back in front, in order.
        while let Some(f) = self.batch.pop_back() {
            frames.push_front(f);
        }
        self.maybe_flush();
        r
    }

    fn wait_kind(&self) -> crate::WaitKind {
        self.inner.wait_kind()
    }

    fn prepare_wait(&mut self) -> crate::WaitPlan {
        let mut plan = self.inner.prepare_wait();
        if self.dirty {
            let left = PCAP_FLUSH_INTERVAL.saturating_sub(self.last_flush.elapsed());
            plan.within = Some(plan.within.map_or(left, |w| w.min(left)));
        }
        plan
    }

    fn rx_ready(&mut self) -> bool {
        self.inner.rx_ready()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let timeout = if self.dirty {
            let left = PCAP_FLUSH_INTERVAL.saturating_sub(self.last_flush.elapsed());
            Some(timeout.map_or(left, |t| t.min(left)))
        } else {
            timeout
        };
        let r = self.inner.wait(timeout);
        self.maybe_flush();
        r
    }
    fn waker(&self) -> Waker {
        self.inner.waker()
    }
    fn link_state(&self) -> LinkState {
        self.inner.link_state()
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn bind_pool(&mut self, pool: &mut PacketPool) -> io::Result<()> {
        self.inner.bind_pool(pool)
    }
    fn info(&self) -> Option<String> {
        self.inner.info()
    }
    fn release_buffers(&mut self, pool: &mut PacketPool) {
        self.inner.release_buffers(pool)
    }
}

impl<D: Device> Drop for PcapWriter<D> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// A frame read back from a pcap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    pub ts: Duration,
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Reads a pcap file (either byte order, micro- or nanosecond magic); for tests and tools.
pub fn read_pcap(bytes: &[u8]) -> Result<(u32, Vec<PcapRecord>), String> {
    let magic_bytes: [u8; 4] = bytes.get(0..4).ok_or("short file")?.try_into().unwrap();
    let (swap, nanos) = match (
        u32::from_ne_bytes(magic_bytes),
        u32::from_ne_bytes(magic_bytes).swap_bytes(),
    ) {
        (0xa1b2_c3d4, _) => (false, false),
        (PCAP_MAGIC_NANOS, _) => (false, true),
        (_, 0xa1b2_c3d4) => (true, false),
        (_, PCAP_MAGIC_NANOS) => (true, true),
        _ => return Err("not a pcap file".into()),
    };
    let u32_at = |off: usize| -> Result<u32, String> {
        let b: [u8; 4] = bytes
            .get(off..off + 4)
            .ok_or("truncated")?
            .try_into()
            .unwrap();
        let v = u32::from_ne_bytes(b);
        Ok(if swap { v.swap_bytes() } else { v })
    };
    let linktype = u32_at(20)?;
    let mut off = 24;
    let mut recs = Vec::new();
    while off < bytes.len() {
        let sec = u32_at(off)?;
        let frac = u32_at(off + 4)?;
        let incl = u32_at(off + 8)? as usize;
        let orig_len = u32_at(off + 12)?;
        let data = bytes
            .get(off + 16..off + 16 + incl)
            .ok_or("truncated record")?
            .to_vec();
        let sub = if nanos { frac } else { frac * 1000 };
        recs.push(PcapRecord {
            ts: Duration::new(sec as u64, sub),
            orig_len,
            data,
        });
        off += 16 + incl;
    }
    Ok((linktype, recs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{pool, MemDevice};

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("usnet-pcap-{}-{name}.pcap", std::process::id()))
    }

    #[test]
    fn records_rx_and_tx_and_reads_back() {
        let path = tmp("rt");
        let mut p = pool(256, 2048);
        let mut mem = MemDevice::new();
        mem.tx_per_call = 3; // back-pressure: frames stay queued
        let rx_frames: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 60 + i * 100]).collect();
        mem.to_rx.extend(rx_frames.iter().cloned());
        let mut dev = PcapWriter::create(mem, &path).unwrap();
        let mut got = Vec::new();
        assert_eq!(dev.rx_burst(&mut p, &mut got, 16).unwrap(), 5);
        for b in got.drain(..) {
            p.free(b);
        }
        // A jumbo chained frame and a few small ones.
        let jumbo: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
        let mut q = VecDeque::new();
        q.push_back(p.alloc_from(&jumbo).unwrap());
        for i in 0..4u8 {
            q.push_back(p.alloc_from(&[0xA0 + i; 64]).unwrap());
        }
        assert_eq!(dev.tx_burst(&mut p, &mut q).unwrap(), 3);
        assert_eq!(q.len(), 2);
        for f in &q {
            assert_eq!(p.refcount(f), 1, "extra reference dropped");
        }
        assert_eq!(dev.tx_burst(&mut p, &mut q).unwrap(), 2);
        assert!(q.is_empty());
        assert_eq!(dev.records(), 10);
        assert_eq!(p.in_use(), 0);
        let sent = dev.inner().sent.clone();
        drop(dev); // flushes
        let bytes = std::fs::read(&path).unwrap();
        let (lt, recs) = read_pcap(&bytes).unwrap();
        assert_eq!(lt, LINKTYPE_ETHERNET);
        assert_eq!(recs.len(), 10);
        for (r, f) in recs.iter().zip(rx_frames.iter().chain(sent.iter())) {
            assert_eq!(&r.data, f);
            assert_eq!(r.orig_len as usize, f.len());
        }
        assert_eq!(recs[5].data, jumbo);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn flushes_on_interval_during_wait() {
        let path = tmp("flush");
        let mut p = pool(16, 2048);
        let mut mem = MemDevice::new();
        mem.to_rx.push_back(vec![7u8; 100]);
        let mut dev = PcapWriter::create(mem, &path).unwrap();
        let mut got = Vec::new();
        dev.rx_burst(&mut p, &mut got, 4).unwrap();
        p.free(got.remove(0));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            24,
            "still buffered"
        );
        std::thread::sleep(PCAP_FLUSH_INTERVAL);
        dev.wait(Some(Duration::from_millis(1))).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 24 + 16 + 100);
        drop(dev);
        assert_eq!(p.in_use(), 0);
        let _ = std::fs::remove_file(&path);
    }

    /// Runs only where tshark is installed.
    #[test]
    fn tshark_reads_our_file() {
        if std::process::Command::new("tshark")
            .arg("-v")
            .output()
            .is_err()
        {
            eprintln!("skipped: tshark not installed");
            return;
        }
        let path = tmp("tshark");
        let mut p = pool(16, 2048);
        let mut mem = MemDevice::new();
        // A broadcast ARP request.
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 2]);
        arp.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
        mem.to_rx.push_back(arp);
        let mut dev = PcapWriter::create(mem, &path).unwrap();
        let mut got = Vec::new();
        dev.rx_burst(&mut p, &mut got, 4).unwrap();
        p.free(got.remove(0));
        drop(dev);
        let out = std::process::Command::new("tshark")
            .args(["-r", path.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("ARP"), "{text}");
        let _ = std::fs::remove_file(&path);
    }
}
