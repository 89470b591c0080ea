//! What every client socket shares: its slot in the session, the client's ends of its
//! two byte rings, blocking and timeouts, and the kick protocol that tells the server
//! when a ring it stopped watching has work again.

use std::io;

use crate::lockorder::{self, Rank};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use usnet_session_abi::{
    errno, op, slot, Request, FLAG_ERROR, FLAG_HUP, FLAG_SHARED, SEND_ASYNC, SEND_EOR, SLOT_OPEN,
};
use usnet_shm::{ByteConsumer, ByteProducer};

use crate::conn::{errno_err, Conn};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[doc(hidden)]
pub struct ClientSocket {
    pub(crate) conn: Arc<Conn>,
    pub(crate) slot: u32,
    gen: u32,
    rx: Mutex<ByteConsumer>,
    tx: Mutex<ByteProducer>,
    nonblocking: AtomicBool,
    read_timeout: Mutex<Option<Duration>>,
    write_timeout: Mutex<Option<Duration>>,
    closed: AtomicBool,
}

thread_local! {
    static DONT_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every socket call of this thread non-blocking (`MSG_DONTWAIT`).
pub fn dont_wait<R>(f: impl FnOnce() -> R) -> R {
    let before = DONT_WAIT.with(|d| d.replace(true));
    let r = f();
    DONT_WAIT.with(|d| d.set(before));
    r
}

/// A ring counter the server says is impossible: our memory was scribbled on.
fn corrupt() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "socket ring corrupt")
}

impl ClientSocket {
    /// A new socket of `kind` (`usnet_session_abi::KIND_*`).
    pub(crate) fn open(conn: &Arc<Conn>, kind: u64) -> io::Result<ClientSocket> {
        let (slot, _) = conn.call(Request {
            op: op::SOCKET,
            args: [kind, 0, 0, 0, 0, 0],
            ..Default::default()
        })?;
        Self::from_slot(conn, slot as u32)
    }

    /// The socket the server put in `slot` (a new one, or an accepted connection).
    pub(crate) fn from_slot(conn: &Arc<Conn>, slot: u32) -> io::Result<ClientSocket> {
        if !conn.mem.valid_slot(slot) {
            return Err(errno_err(errno::EBADF));
        }
        let region = conn.mem.region().clone();
        let rx = ByteConsumer::attach(region.clone(), conn.mem.rx_ring(slot))
            .map_err(|e| io::Error::other(e.to_string()))?;
        let tx = ByteProducer::attach(region, conn.mem.tx_ring(slot))
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(ClientSocket {
            gen: conn.mem.slot_word(slot, slot::GEN).load(Acquire),
            conn: conn.clone(),
            slot,
            rx: Mutex::new(rx),
            tx: Mutex::new(tx),
            nonblocking: AtomicBool::new(false),
            read_timeout: Mutex::new(None),
            write_timeout: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    /// The same socket in a forked child's own session, at `slot` there (the
    /// server's claim put it there), with this one's blocking mode and timeouts. The
    /// caller disowns this one (the parent's copy) in the child.
    pub(crate) fn forked(&self, conn: &Arc<Conn>, slot: u32) -> io::Result<ClientSocket> {
        let s = ClientSocket::from_slot(conn, slot)?;
        s.nonblocking.store(self.nonblocking(), Relaxed);
        // A lock a thread of the parent held at the fork stays held in the child:
        // never wait for one here.
        if let Ok(t) = self.read_timeout.try_lock() {
            *lock(&s.read_timeout) = *t;
        }
        if let Ok(t) = self.write_timeout.try_lock() {
            *lock(&s.write_timeout) = *t;
        }
        Ok(s)
    }

    /// Names the socket across `exec` (`usnet_session_abi::slot::TAG`).
    pub(crate) fn set_tag(&self, tag: u32) {
        self.conn
            .mem
            .slot_word(self.slot, slot::TAG)
            .store(tag, Release);
    }

    /// Never closes or posts again (a forked child's copy of its parent's socket).
    pub(crate) fn disown(&self) {
        self.closed.store(true, Release);
    }

    pub(crate) fn word(&self, off: usize) -> u32 {
        self.conn.mem.slot_word(self.slot, off).load(Acquire)
    }

    pub(crate) fn flags(&self) -> u32 {
        self.word(slot::FLAGS)
    }

    /// Still ours (not closed and given to another socket by the server).
    pub(crate) fn live(&self) -> io::Result<()> {
        if self.closed.load(Relaxed)
            || self.word(slot::GEN) != self.gen
            || self.word(slot::STATE) != SLOT_OPEN
        {
            return Err(errno_err(errno::EBADF));
        }
        Ok(())
    }

    /// The socket's failure, if it failed (does not clear it; see `take_error`).
    /// The connection's error, reported once, as Linux's `sock_error` takes
    /// `sk_err` (later calls see the connection closed: reads end, writes get
    /// EPIPE). `SO_ERROR` takes the same word.
    pub(crate) fn failure(&self) -> Option<io::Error> {
        if self.flags() & FLAG_ERROR == 0 {
            return None;
        }
        self.take_error_word()
    }

    /// Takes the slot's `ERROR` word (swapped to 0), if it holds an errno.
    pub(crate) fn take_error_word(&self) -> Option<io::Error> {
        let word = self.conn.mem.slot_word(self.slot, slot::ERROR);
        // A plain load first: the word is read on every datagram call.
        if word.load(Relaxed) == 0 {
            return None;
        }
        let e = word.swap(0, AcqRel);
        (e != 0).then(|| errno_err(e as i64))
    }

    pub(crate) fn request(&self, op: u16, args: [u64; 6]) -> Request {
        Request {
            op,
            slot: self.slot,
            args,
            ..Default::default()
        }
    }

    pub(crate) fn call(&self, op: u16, args: [u64; 6]) -> io::Result<u64> {
        self.live()?;
        self.conn.call(self.request(op, args)).map(|(v, _)| v)
    }

    /// Sets an IP header field of a TCP socket ([`crate::IpHeader`]).
    pub(crate) fn set_ip_header(&self, f: crate::IpHeader) -> io::Result<()> {
        let [level, name, value] = f.request();
        self.call(
            usnet_session_abi::op::SETSOCKOPT,
            [level, name, value, 0, 0, 0],
        )
        .map(|_| ())
    }

    pub(crate) fn addr(&self, which: usize) -> io::Result<SocketAddr> {
        self.conn
            .mem
            .slot_addr(self.slot, which)
            .to_std()
            .ok_or_else(|| errno_err(errno::ENOTCONN))
    }

    pub(crate) fn set_nonblocking(&self, nb: bool) {
        self.nonblocking.store(nb, Relaxed);
    }

    pub(crate) fn nonblocking(&self) -> bool {
        self.nonblocking.load(Relaxed)
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        *lock(&self.read_timeout) = t;
        Ok(())
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        *lock(&self.write_timeout) = t;
        Ok(())
    }

    pub(crate) fn read_deadline(&self) -> Option<Instant> {
        lock(&self.read_timeout).map(|t| crate::vtime::now() + t)
    }

    pub(crate) fn write_deadline(&self) -> Option<Instant> {
        lock(&self.write_timeout).map(|t| crate::vtime::now() + t)
    }

    /// Waits until `ready` holds; `WouldBlock` when non-blocking (the socket, or this
    /// call through [`dont_wait`]) or at the deadline.
    pub(crate) fn block(
        &self,
        deadline: Option<Instant>,
        ready: impl FnMut() -> bool,
    ) -> io::Result<()> {
        if self.nonblocking() || DONT_WAIT.with(|d| d.get()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if self
            .conn
            .wait_until_on(Some(self.slot), deadline, true, ready)?
        {
            Ok(())
        } else {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }

    // ------------------------------------------------------------ receive ring

    /// Bytes in the receive ring.
    pub(crate) fn rx_ready(&self) -> usize {
        let n = lock(&self.rx).available().unwrap_or(0);
        if n == 0 {
            self.want_stream();
        }
        n
    }

    /// Copies from the receive ring; 0 when it is empty. A read never crosses the
    /// urgent mark (Linux's `tcp_recvmsg` stops there once it copied something);
    /// one that starts at it goes past, and the mark is gone. With `to_mark` (what
    /// `splice` reads with, Linux's `tcp_read_sock`) it stays and 0 comes back.
    pub(crate) fn rx_read(&self, buf: &mut [u8], to_mark: bool) -> io::Result<usize> {
        let Some(_reading) = self.rx_enter() else {
            return Ok(0);
        };
        let mut rx = lock(&self.rx);
        let n = rx.available().map_err(|_| corrupt())?;
        if n == 0 {
            drop(rx);
            self.want_stream();
            return Ok(0);
        }
        // The mark is read after the ring's counter: what follows the mark is
        // published after it.
        let cons = rx.position();
        let mut len = buf.len();
        match self.urgent_mark() {
            Some(m) if m > cons => len = len.min((m - cons) as usize),
            Some(_) if to_mark => return Ok(0),
            Some(m) => self.pass_urgent_mark(m),
            None => {}
        }
        let k = rx.read(&mut buf[..len]);
        rx.release();
        drop(rx);
        self.kick(slot::RX_ARMED, op::RX_KICK);
        Ok(k)
    }

    /// Copies from the front of the receive ring without consuming (`MSG_PEEK`); 0
    /// when it is empty.
    pub(crate) fn rx_peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(_reading) = self.rx_enter() else {
            return Ok(0);
        };
        let mut rx = lock(&self.rx);
        let n = rx.available().map_err(|_| corrupt())?;
        if n == 0 {
            drop(rx);
            self.want_stream();
            return Ok(0);
        }
        let mut k = n.min(buf.len());
        if let Some(m) = self.urgent_mark().filter(|&m| m > rx.position()) {
            k = k.min((m - rx.position()) as usize);
        }
        Ok(rx.peek(0, &mut buf[..k]))
    }

    /// Where the urgent mark is in the receive ring (the position of the first
    /// byte after the urgent byte's place), if one waits (`slot::RX_URG_MARK`).
    fn urgent_mark(&self) -> Option<u64> {
        let w = self
            .conn
            .mem
            .slot_u64(self.slot, slot::RX_URG_MARK)
            .load(Acquire);
        w.checked_sub(1)
    }

    /// A read passes the mark at `m`: it is gone, unless the server set a new one.
    fn pass_urgent_mark(&self, m: u64) {
        let _ = self
            .conn
            .mem
            .slot_u64(self.slot, slot::RX_URG_MARK)
            .compare_exchange(m + 1, 0, AcqRel, Relaxed);
    }

    /// `SIOCATMARK`: the next byte to read is where the urgent byte was.
    pub(crate) fn rx_at_mark(&self) -> bool {
        let rx = lock(&self.rx);
        self.urgent_mark() == Some(rx.position())
    }

    /// `recv(MSG_OOB)`: the urgent byte, once.
    pub(crate) fn rx_take_oob(&self) -> Option<u8> {
        let w = self
            .conn
            .mem
            .slot_word(self.slot, slot::RX_OOB)
            .swap(0, AcqRel);
        (w & 0x100 != 0).then_some(w as u8)
    }

    /// Before copying out of a shared stream's ring: Dekker's handshake with the
    /// server, which may be taking the ring's unread bytes for another holder that
    /// reads (`usnet_session_abi::slot::RX_BUSY`). `None`: it is, so read nothing now (the
    /// bytes go to the other reader). The guard ends the copy.
    fn rx_enter(&self) -> Option<Reading<'_>> {
        if self.flags() & FLAG_SHARED == 0 {
            return Some(Reading(None));
        }
        let busy = self.conn.mem.slot_word(self.slot, slot::RX_BUSY);
        busy.store(1, SeqCst);
        if self
            .conn
            .mem
            .slot_word(self.slot, slot::RX_STEAL)
            .load(SeqCst)
            != 0
        {
            busy.store(0, Release);
            return None;
        }
        Some(Reading(Some(busy)))
    }

    /// Runs `f` on the receive ring's consumer (UDP records), then kicks. `None`
    /// (nothing read) while the server takes a shared socket's datagrams for
    /// another holder that reads ([`Self::rx_enter`]).
    pub(crate) fn with_rx<R>(&self, f: impl FnOnce(&mut ByteConsumer) -> R) -> Option<R> {
        let _reading = self.rx_enter()?;
        let mut rx = lock(&self.rx);
        let r = f(&mut rx);
        let released = rx.release();
        drop(rx);
        if released {
            self.kick(slot::RX_ARMED, op::RX_KICK);
        }
        Some(r)
    }

    // ------------------------------------------------------------ send ring

    /// Room in the send ring.
    /// Bytes written into the send ring since it began.
    pub(crate) fn tx_position(&self) -> u64 {
        lockorder::lock(&self.tx, Rank::SockTx).position()
    }

    /// Send ring bytes the peer acknowledged (`slot::TX_ACKED`).
    pub(crate) fn tx_acked(&self) -> u64 {
        self.conn
            .mem
            .slot_u64(self.slot, slot::TX_ACKED)
            .load(Acquire)
    }

    pub(crate) fn tx_room(&self) -> usize {
        lockorder::lock(&self.tx, Rank::SockTx).free().unwrap_or(0)
    }

    /// Whether a write would be taken now (flags `f`): `poll::send_room`.
    pub(crate) fn tx_send_room(&self, f: u32) -> bool {
        let mut tx = lockorder::lock(&self.tx, Rank::SockTx);
        let size = tx.size() as u64;
        let queued = size - tx.free().unwrap_or(0) as u64;
        crate::poll::send_room(f, queued, size)
    }

    /// Copies into the send ring; 0 when it is full.
    pub(crate) fn tx_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.with_tx(|tx| {
            let free = tx.free().map_err(|_| corrupt())?;
            if free == 0 || buf.is_empty() {
                return Ok(0);
            }
            Ok(tx.push(buf))
        })
    }

    /// Copies the pieces `bufs` into the send ring in order, as far as they fit,
    /// and publishes them at once (the server sees one write, as Linux's `writev`
    /// is one `tcp_sendmsg`); 0 when the ring is full.
    pub(crate) fn tx_write_vectored(&self, bufs: &[&[u8]]) -> io::Result<usize> {
        self.with_tx(|tx| {
            if tx.free().map_err(|_| corrupt())? == 0 {
                return Ok(0);
            }
            Ok(push_pieces(tx, bufs))
        })
    }

    /// Moves up to `max` bytes of the file `fd` (at `file_off`, or from its
    /// position) straight into the send ring; None when the ring is full, 0 at
    /// the end of the file.
    pub(crate) fn tx_write_from_fd(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        file_off: Option<i64>,
        max: usize,
    ) -> io::Result<Option<usize>> {
        self.with_tx(|tx| {
            let free = tx.free().map_err(|_| corrupt())?;
            if free == 0 {
                return Ok(None);
            }
            tx.push_from_fd(fd, file_off, max).map(Some)
        })
    }

    /// Puts `buf` in the send ring without telling the server (a Fast Open
    /// connect's SYN data, which the server takes with the connect). At most what
    /// fits.
    pub(crate) fn tx_stage(&self, buf: &[u8]) -> io::Result<usize> {
        let mut tx = lockorder::lock(&self.tx, Rank::SockTx);
        let free = tx.free().map_err(|_| corrupt())?;
        let n = if free == 0 || buf.is_empty() {
            0
        } else {
            tx.push(buf)
        };
        tx.publish();
        Ok(n)
    }

    /// A write through `op::SEND`: `fill` puts up to `want` bytes in the send ring
    /// (no kick: the call tells the server), then the server hands them to the
    /// stack, which takes what Linux's send buffer would, and drops the rest from
    /// the ring. Returns (bytes put, bytes taken); `flags` are `SEND_*`, and
    /// `SEND_EOR` holds only if every byte wanted went in. Writers queue on the
    /// ring's lock for the whole call, as Linux's hold the socket's lock.
    pub(crate) fn tx_send(
        &self,
        want: usize,
        flags: u64,
        fill: impl FnOnce(&mut ByteProducer) -> io::Result<usize>,
    ) -> io::Result<(usize, usize)> {
        self.live()?;
        let mut tx = lockorder::lock(&self.tx, Rank::SockTx);
        let start = tx.position();
        let put = if tx.free().map_err(|_| corrupt())? == 0 || want == 0 {
            0
        } else {
            fill(&mut tx)?
        };
        tx.publish();
        let flags = if put < want { flags & !SEND_EOR } else { flags };
        let end = start + put as u64;
        // Within the room the server published as surely granted, the count is
        // known: post the write and go on (`slot::TX_CREDIT`).
        let credit = self
            .conn
            .mem
            .slot_u64(self.slot, slot::TX_CREDIT)
            .load(Acquire);
        if put > 0 && end <= credit {
            let req = self.request(op::SEND, [start, end, flags | SEND_ASYNC, 0, 0, 0]);
            self.conn.post(req, true)?;
            return Ok((put, put));
        }
        let taken = self
            .conn
            .call(self.request(op::SEND, [start, end, flags, 0, 0, 0]))?
            .0;
        Ok((put, taken as usize))
    }

    /// Runs `f` on the send ring's producer (UDP records), publishes, then kicks.
    pub(crate) fn with_tx<R>(&self, f: impl FnOnce(&mut ByteProducer) -> R) -> R {
        let mut tx = lockorder::lock(&self.tx, Rank::SockTx);
        let r = f(&mut tx);
        let published = tx.publish();
        drop(tx);
        if published {
            self.kick(slot::TX_ARMED, op::TX_KICK);
        }
        r
    }

    /// The kick protocol: after publishing (or consuming), a fence, then take the
    /// server's "not watching" mark; if it was set, tell the server (usnet_shm::arm).
    fn want_stream(&self) {
        self.conn.want_stream(self.slot);
    }

    fn kick(&self, armed: usize, op: u16) {
        if usnet_shm::arm::take(self.conn.mem.slot_word(self.slot, armed)) {
            let _ = self.conn.post(self.request(op, [0; 6]), false);
        }
    }

    /// Closed, reset or failed: nothing more will come or go.
    pub(crate) fn hung_up(&self) -> bool {
        self.flags() & (FLAG_HUP | FLAG_ERROR) != 0
    }

    /// Closes the socket (bytes already in the send ring still go out).
    pub(crate) fn close(&self) {
        if self.closed.swap(true, AcqRel) {
            return;
        }
        self.conn
            .zc
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.slot);
        if self.word(slot::GEN) == self.gen {
            let _ = self.conn.post(self.request(op::CLOSE, [0; 6]), true);
        }
    }
}

/// Pushes the pieces `bufs` in order, as far as they fit (by the last
/// `ByteProducer::free`); returns the bytes pushed.
pub(crate) fn push_pieces(tx: &mut ByteProducer, bufs: &[&[u8]]) -> usize {
    let mut put = 0;
    for b in bufs {
        let n = tx.push(b);
        put += n;
        if n < b.len() {
            break;
        }
    }
    put
}

/// A copy out of a shared stream's ring in progress (`ClientSocket::rx_enter`).
struct Reading<'a>(Option<&'a std::sync::atomic::AtomicU32>);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.0 {
            b.store(0, Release);
        }
    }
}

impl Drop for ClientSocket {
    fn drop(&mut self) {
        self.close();
    }
}
