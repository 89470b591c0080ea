//! A session's shared memory, typed: the server creates it, a client attaches it, and
//! both read and write it only through this crate, which follows `usnet-session-abi`'s layout
//! and never hands out a reference into shared bytes (usnet-shm's `Region` copies).
//! Every slot index is checked; nothing read from the memory is trusted beyond being
//! some value of its type.

pub mod ctl;
pub mod zc;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

use usnet_session_abi::{
    hdr, server_page, slot, Completion, Geometry, Layout, Request, SockAddr, COMPLETION_SIZE,
    MAGIC, PAGE, REQUEST_SIZE, VERSION,
};
use usnet_shm::spsc::RingIndices;
use usnet_shm::{ByteRingAt, FutexBell, Region};

/// The largest session a client accepts (a sanity bound on the server's memfd).
pub const MAX_SESSION_BYTES: usize = 64 << 30;

/// A session's memory and layout.
#[derive(Clone)]
pub struct Session {
    region: Arc<Region>,
    layout: Layout,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id())
            .field("layout", &self.layout)
            .finish()
    }
}

fn bad(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m.to_string())
}

impl Session {
    /// Server side: a new sealed memfd laid out for `g`, with its header written.
    pub fn create(id: u32, g: Geometry) -> io::Result<Session> {
        let layout = Layout::new(g).map_err(|_| bad("bad session geometry"))?;
        let region = Arc::new(Region::create_memfd(
            c"usnet-session",
            layout.total_len,
            true,
        )?);
        let r = &region;
        r.u64(hdr::MAGIC).store(MAGIC, Relaxed);
        r.u32(hdr::VERSION).store(VERSION, Relaxed);
        r.u64(hdr::TOTAL_LEN)
            .store(layout.total_len as u64, Relaxed);
        r.u32(hdr::SQ_OFF).store(layout.sq_off as u32, Relaxed);
        r.u32(hdr::SQ_ENTRIES).store(g.sq_entries, Relaxed);
        r.u32(hdr::CQ_OFF).store(layout.cq_off as u32, Relaxed);
        r.u32(hdr::CQ_ENTRIES).store(g.cq_entries, Relaxed);
        r.u32(hdr::SLOTS_OFF)
            .store(layout.slots_off as u32, Relaxed);
        r.u32(hdr::MAX_SOCKETS).store(g.max_sockets, Relaxed);
        r.u32(hdr::RING_BYTES).store(g.ring_bytes, Relaxed);
        r.u32(hdr::SESSION_ID).store(id, Relaxed);
        r.u64(hdr::DATA_OFF).store(layout.data_off as u64, Release);
        Ok(Session { region, layout })
    }

    /// Client side: maps a session memfd the server sent and checks that its header
    /// describes a layout that fits it.
    pub fn attach(fd: OwnedFd) -> io::Result<Session> {
        let region = Arc::new(Region::attach_memfd(fd, PAGE, MAX_SESSION_BYTES, true)?);
        let r = &region;
        if r.u64(hdr::MAGIC).load(Acquire) != MAGIC {
            return Err(bad("not a usnet session (bad magic)"));
        }
        let v = r.u32(hdr::VERSION).load(Relaxed);
        if v != VERSION {
            return Err(bad(&format!(
                "session version {v}, this client speaks {VERSION}"
            )));
        }
        let g = Geometry {
            sq_entries: r.u32(hdr::SQ_ENTRIES).load(Relaxed),
            cq_entries: r.u32(hdr::CQ_ENTRIES).load(Relaxed),
            max_sockets: r.u32(hdr::MAX_SOCKETS).load(Relaxed),
            ring_bytes: r.u32(hdr::RING_BYTES).load(Relaxed),
        };
        let layout = Layout::new(g).map_err(|_| bad("bad session geometry"))?;
        let same = layout.sq_off == r.u32(hdr::SQ_OFF).load(Relaxed) as usize
            && layout.cq_off == r.u32(hdr::CQ_OFF).load(Relaxed) as usize
            && layout.slots_off == r.u32(hdr::SLOTS_OFF).load(Relaxed) as usize
            && layout.data_off == r.u64(hdr::DATA_OFF).load(Relaxed) as usize
            && layout.total_len == r.u64(hdr::TOTAL_LEN).load(Relaxed) as usize
            && layout.total_len <= r.len();
        if !same {
            return Err(bad("session header does not match its layout"));
        }
        Ok(Session { region, layout })
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn geometry(&self) -> Geometry {
        self.layout.geometry
    }

    pub fn id(&self) -> u32 {
        self.region.u32(hdr::SESSION_ID).load(Relaxed)
    }

    /// A header word (`usnet_session_abi::hdr` offsets of `u32` words).
    pub fn word(&self, off: usize) -> &AtomicU32 {
        self.region.u32(off)
    }

    pub fn sq(&self) -> RingIndices {
        RingIndices {
            head: hdr::SQ_HEAD,
            tail: hdr::SQ_TAIL,
            size: self.layout.geometry.sq_entries,
        }
    }

    pub fn cq(&self) -> RingIndices {
        RingIndices {
            head: hdr::CQ_HEAD,
            tail: hdr::CQ_TAIL,
            size: self.layout.geometry.cq_entries,
        }
    }

    /// Submission entry `k` (`k` < entries: ring slot numbers always are).
    pub fn read_request(&self, k: u32) -> Request {
        let mut b = [0u8; REQUEST_SIZE];
        let off = self.layout.sq_off
            + (k & (self.layout.geometry.sq_entries - 1)) as usize * REQUEST_SIZE;
        self.region.read(off, &mut b).expect("inside the layout");
        Request::from_bytes(&b)
    }

    pub fn write_request(&self, k: u32, r: &Request) {
        let off = self.layout.sq_off
            + (k & (self.layout.geometry.sq_entries - 1)) as usize * REQUEST_SIZE;
        self.region
            .write(off, &r.to_bytes())
            .expect("inside the layout");
    }

    pub fn read_completion(&self, k: u32) -> Completion {
        let mut b = [0u8; COMPLETION_SIZE];
        let off = self.layout.cq_off
            + (k & (self.layout.geometry.cq_entries - 1)) as usize * COMPLETION_SIZE;
        self.region.read(off, &mut b).expect("inside the layout");
        Completion::from_bytes(&b)
    }

    pub fn write_completion(&self, k: u32, c: &Completion) {
        let off = self.layout.cq_off
            + (k & (self.layout.geometry.cq_entries - 1)) as usize * COMPLETION_SIZE;
        self.region
            .write(off, &c.to_bytes())
            .expect("inside the layout");
    }

    /// The server → client bell.
    pub fn client_bell(&self) -> FutexBell {
        FutexBell::new(
            self.region.clone(),
            hdr::CLIENT_BELL_SEQ,
            hdr::CLIENT_SLEEPERS,
        )
        .expect("inside the layout")
    }

    // ------------------------------------------------------------ slots

    /// Whether `i` names a slot of this session.
    pub fn valid_slot(&self, i: u32) -> bool {
        i < self.layout.geometry.max_sockets
    }

    fn slot_off(&self, i: u32, off: usize) -> usize {
        assert!(self.valid_slot(i), "slot {i} checked by the caller");
        self.layout.slot(i) + off
    }

    /// A `u32` word of slot `i` (`usnet_session_abi::slot` offsets). Panics on a bad index:
    /// callers check indices from the other side with [`Session::valid_slot`].
    pub fn slot_word(&self, i: u32, off: usize) -> &AtomicU32 {
        self.region.u32(self.slot_off(i, off))
    }

    pub fn slot_u64(&self, i: u32, off: usize) -> &AtomicU64 {
        self.region.u64(self.slot_off(i, off))
    }

    pub fn slot_addr(&self, i: u32, off: usize) -> SockAddr {
        let mut b = [0u8; SockAddr::LEN];
        self.region
            .read(self.slot_off(i, off), &mut b)
            .expect("inside the layout");
        SockAddr::from_bytes(&b)
    }

    pub fn set_slot_addr(&self, i: u32, off: usize, a: &SockAddr) {
        self.region
            .write(self.slot_off(i, off), &a.to_bytes())
            .expect("inside the layout");
    }

    pub fn read_info(&self, i: u32, dst: &mut [u8]) {
        let n = dst.len().min(slot::INFO_LEN);
        self.region
            .read(self.slot_off(i, slot::INFO), &mut dst[..n])
            .expect("inside the layout");
    }

    pub fn write_info(&self, i: u32, src: &[u8]) {
        let n = src.len().min(slot::INFO_LEN);
        self.region
            .write(self.slot_off(i, slot::INFO), &src[..n])
            .expect("inside the layout");
    }

    /// Slot `i`'s error report ([`usnet_session_abi::ErrReport`]) and its
    /// quoted payload, written by the server.
    pub fn write_err_report(&self, i: u32, r: &usnet_session_abi::ErrReport, payload: &[u8]) {
        let off = self.slot_off(i, slot::ERRQ);
        let n = payload.len().min(usnet_session_abi::ErrReport::ROOM);
        self.region
            .write(off, &r.to_bytes())
            .expect("inside the layout");
        self.region
            .write(off + usnet_session_abi::ErrReport::PAYLOAD, &payload[..n])
            .expect("inside the layout");
    }

    /// Slot `i`'s error report, its payload's first bytes into `payload`
    /// (returns the report; `min(len, payload.len())` bytes were copied).
    pub fn read_err_report(&self, i: u32, payload: &mut [u8]) -> usnet_session_abi::ErrReport {
        let off = self.slot_off(i, slot::ERRQ);
        let mut b = [0u8; usnet_session_abi::ErrReport::PAYLOAD];
        self.region.read(off, &mut b).expect("inside the layout");
        let r = usnet_session_abi::ErrReport::from_bytes(&b);
        let n = usize::from(r.len)
            .min(payload.len())
            .min(usnet_session_abi::ErrReport::ROOM);
        self.region
            .read(
                off + usnet_session_abi::ErrReport::PAYLOAD,
                &mut payload[..n],
            )
            .expect("inside the layout");
        r
    }

    /// Slot `i`'s receive ring (server → client).
    pub fn rx_ring(&self, i: u32) -> ByteRingAt {
        ByteRingAt {
            prod: self.slot_off(i, slot::RX_PROD),
            cons: self.slot_off(i, slot::RX_CONS),
            data: self.layout.rx_data(i),
            size: self.layout.geometry.ring_bytes as usize,
        }
    }

    /// Slot `i`'s send ring (client → server).
    pub fn tx_ring(&self, i: u32) -> ByteRingAt {
        ByteRingAt {
            prod: self.slot_off(i, slot::TX_PROD),
            cons: self.slot_off(i, slot::TX_CONS),
            data: self.layout.tx_data(i),
            size: self.layout.geometry.ring_bytes as usize,
        }
    }

    /// Server: empties slot `i` for a new socket (rings reset, words cleared, the
    /// generation bumped) and returns the new generation.
    pub fn reset_slot(&self, i: u32) -> u32 {
        for off in [
            slot::KIND,
            slot::FLAGS,
            slot::ERROR,
            slot::ACCEPT_PENDING,
            slot::TAG,
            slot::RX_ARMED,
            slot::TX_ARMED,
        ] {
            self.slot_word(i, off).store(0, Relaxed);
        }
        for off in [
            slot::RX_PROD,
            slot::RX_CONS,
            slot::TX_PROD,
            slot::TX_CONS,
            slot::TX_ACKED,
        ] {
            self.slot_u64(i, off).store(0, Relaxed);
        }
        self.set_slot_addr(i, slot::LOCAL, &SockAddr::default());
        self.set_slot_addr(i, slot::PEER, &SockAddr::default());
        let g = self
            .slot_word(i, slot::GEN)
            .fetch_add(1, Relaxed)
            .wrapping_add(1);
        self.slot_word(i, slot::EVENTS).fetch_add(1, Release);
        g
    }
}

/// The server's page that every client maps: the server's futex bell and how to ring
/// the server.
#[derive(Clone)]
pub struct ServerPage {
    region: Arc<Region>,
}

impl ServerPage {
    /// Server side: a new page; `kind` is `usnet_session_abi::BELL_FUTEX` or `BELL_EVENTFD`.
    pub fn create(kind: u32) -> io::Result<ServerPage> {
        let region = Arc::new(Region::create_memfd(
            c"usnet-server",
            server_page::LEN,
            true,
        )?);
        region.u32(server_page::BELL_KIND).store(kind, Relaxed);
        region
            .u32(server_page::SERVER_PID)
            .store(std::process::id(), Release);
        Ok(ServerPage { region })
    }

    pub fn attach(fd: OwnedFd) -> io::Result<ServerPage> {
        let region = Arc::new(Region::attach_memfd(
            fd,
            server_page::LEN,
            server_page::LEN,
            true,
        )?);
        Ok(ServerPage { region })
    }

    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    pub fn bell(&self) -> FutexBell {
        FutexBell::new(
            self.region.clone(),
            server_page::BELL_SEQ,
            server_page::BELL_SLEEPERS,
        )
        .expect("inside the page")
    }

    pub fn bell_kind(&self) -> u32 {
        self.region.u32(server_page::BELL_KIND).load(Relaxed)
    }

    pub fn server_pid(&self) -> u32 {
        self.region.u32(server_page::SERVER_PID).load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_client_attaches_what_the_server_created() {
        let g = Geometry {
            max_sockets: 8,
            ring_bytes: 8192,
            ..Geometry::default()
        };
        let s = Session::create(42, g).unwrap();
        let fd = s.region().fd().try_clone_to_owned().unwrap();
        let c = Session::attach(fd).unwrap();
        assert_eq!(c.id(), 42);
        assert_eq!(c.geometry(), g);
        let r = Request {
            op: 3,
            slot: 1,
            tag: 77,
            ..Default::default()
        };
        c.write_request(5, &r);
        assert_eq!(s.read_request(5), r);
        let gen = s.reset_slot(2);
        assert_eq!(c.slot_word(2, slot::GEN).load(Acquire), gen);
        assert!(!c.valid_slot(8));
        assert_eq!(c.rx_ring(1).size, 8192);
        assert_ne!(c.rx_ring(1).data, c.tx_ring(1).data);
        let _ = s.region().fd().as_fd();
    }

    #[test]
    fn a_forged_or_foreign_memfd_is_refused() {
        // Not sealed: refused before anything is read.
        let r = Region::create_memfd(c"forged", 1 << 20, false).unwrap();
        assert!(Session::attach(r.fd().try_clone_to_owned().unwrap()).is_err());
        // Sealed but not a session.
        let r = Region::create_memfd(c"forged", 1 << 20, true).unwrap();
        assert!(Session::attach(r.fd().try_clone_to_owned().unwrap()).is_err());
        // A session whose header lies about its geometry.
        let s = Session::create(1, Geometry::default()).unwrap();
        s.word(hdr::MAX_SOCKETS).store(1 << 20, Relaxed);
        assert!(Session::attach(s.region().fd().try_clone_to_owned().unwrap()).is_err());
    }
}
