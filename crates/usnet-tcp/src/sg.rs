//! Scatter-gather send and receive queues: a zero-copy connection holds its payload
//! as pieces of the stack's pool buffers ([`BufSpan`]) instead of bytes in a
//! [`Ring`]. The engine never touches the pool: every piece it starts or stops
//! holding is one buffer reference, and it lists the references it took and gave up
//! ([`BufOp`]) for the stack to apply to the pool right after the call
//! (`Connection::take_buf_ops`). [`SendBuf`] and [`RecvBuf`] put both storages behind
//! the one set of calls the sequence logic uses, so SACK, RACK, window and
//! retransmission code is the same for both.

use std::collections::VecDeque;

use crate::payload::Payload;
use crate::ring::Ring;

/// A piece of a pool buffer: `len` bytes from byte `off` of buffer `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufSpan {
    /// Pool buffer index.
    pub buf: u32,
    /// First byte, from the start of the buffer's memory.
    pub off: u32,
    /// Bytes.
    pub len: u32,
}

/// A change of the engine's buffer references, for the stack to apply to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufOp {
    /// The engine now holds one more reference to this buffer (retain it before the
    /// frame it came in is freed).
    Retain(u32),
    /// The engine gave up one reference (free it).
    Release(u32),
}

/// The smallest payload a held piece is assumed to carry when bounding the pieces a
/// queue may hold: a queue of tiny segments must not pin the whole pool.
const MIN_PIECE: usize = 512;

/// The send queue of a zero-copy connection: unacknowledged, then unsent pieces, in
/// sequence order. Each piece is one buffer reference.
#[derive(Debug)]
pub struct SgSend {
    spans: VecDeque<BufSpan>,
    len: usize,
    cap: usize,
    max_spans: usize,
    ops: Vec<BufOp>,
    /// Where the last lookup ended: (index of a piece, its offset from the front).
    /// Segments are cut in sequence order, so the next lookup starts there instead
    /// of walking the queue from its front (which would make a long queue of
    /// small pieces quadratic).
    cursor: (usize, usize),
}

impl SgSend {
    /// A queue of up to `cap` bytes.
    pub fn new(cap: usize) -> Self {
        let max_spans = (cap / MIN_PIECE).max(16);
        SgSend {
            spans: VecDeque::with_capacity(max_spans.min(1024)),
            len: 0,
            cap,
            max_spans,
            ops: Vec::new(),
            cursor: (0, 0),
        }
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left, bytes (0 once the piece limit is reached).
    pub fn free(&self) -> usize {
        if self.spans.len() >= self.max_spans {
            0
        } else {
            self.cap - self.len
        }
    }

    /// Appends a piece whose reference the caller hands over; false (nothing taken)
    /// if it does not fit or is empty.
    pub fn push(&mut self, span: BufSpan) -> bool {
        if span.len == 0 || span.len as usize > self.free() {
            return false;
        }
        self.len += span.len as usize;
        self.spans.push_back(span);
        true
    }

    /// The last piece queued.
    pub fn last(&self) -> Option<BufSpan> {
        self.spans.back().copied()
    }

    /// Grows the last piece by `n` bytes its owner wrote right behind it (the same
    /// buffer reference); false, nothing changed, if they do not fit or nothing is
    /// queued.
    pub fn extend_last(&mut self, n: usize) -> bool {
        if n > self.cap - self.len {
            return false;
        }
        let Some(last) = self.spans.back_mut() else {
            return false;
        };
        last.len += n as u32;
        self.len += n;
        true
    }

    /// The pieces covering bytes `[offset, offset + n)` (clipped to what is queued),
    /// cut to exactly that range, appended to `out`. Returns whether the first one
    /// starts where its piece starts (nothing of the piece lies before it).
    pub fn spans_at(&mut self, offset: usize, n: usize, out: &mut Vec<BufSpan>) -> bool {
        let end = (offset + n).min(self.len);
        let (mut k, mut at) = self.cursor;
        if k >= self.spans.len() || at > offset {
            (k, at) = (0, 0);
        }
        let mut at_start = false;
        for (j, s) in self.spans.iter().enumerate().skip(k) {
            if at >= end {
                break;
            }
            if at + s.len as usize <= offset {
                // Wholly before the range: the next lookup may start after it.
                self.cursor = (j + 1, at + s.len as usize);
            }
            let s_end = at + s.len as usize;
            if s_end > offset {
                let from = offset.saturating_sub(at);
                if out.is_empty() {
                    at_start = from == 0;
                }
                let to = (end - at).min(s.len as usize);
                out.push(BufSpan {
                    buf: s.buf,
                    off: s.off + from as u32,
                    len: (to - from) as u32,
                });
            }
            at = s_end;
        }
        at_start
    }

    /// Drops `n` acknowledged bytes from the front, releasing the pieces they finish.
    pub fn consume(&mut self, n: usize) {
        let mut n = n.min(self.len);
        self.len -= n;
        let (total, mut popped) = (n, 0usize);
        while n > 0 {
            let Some(front) = self.spans.front_mut() else {
                break;
            };
            if (front.len as usize) <= n {
                n -= front.len as usize;
                self.ops.push(BufOp::Release(front.buf));
                self.spans.pop_front();
                popped += 1;
            } else {
                front.off += n as u32;
                front.len -= n as u32;
                n = 0;
            }
        }
        // Offsets count from the front, which moved by `total` bytes and `popped`
        // pieces: the cursor moves with it (or starts over if it fell off).
        let (k, at) = self.cursor;
        self.cursor = if k >= popped && at >= total {
            (k - popped, at - total)
        } else {
            (0, 0)
        };
    }

    /// Releases every piece (the connection is gone).
    pub fn clear(&mut self) {
        for s in self.spans.drain(..) {
            self.ops.push(BufOp::Release(s.buf));
        }
        self.len = 0;
    }
}

/// The receive queue of a zero-copy connection: pieces of received frames at their
/// offset in the byte stream, in order and without overlap; the first `len` bytes are
/// in order (readable), pieces beyond are out-of-order data.
#[derive(Debug)]
pub struct SgRecv {
    /// `(stream offset, piece)`, sorted by offset, disjoint.
    pieces: VecDeque<(u64, BufSpan)>,
    /// Stream offset of the first unread byte.
    head: u64,
    len: usize,
    cap: usize,
    max_pieces: usize,
    ops: Vec<BufOp>,
}

impl SgRecv {
    /// A queue for a window of up to `cap` bytes.
    pub fn new(cap: usize) -> Self {
        let max_pieces = (cap / MIN_PIECE).max(16);
        SgRecv {
            pieces: VecDeque::with_capacity(max_pieces.min(1024)),
            head: 0,
            len: 0,
            cap,
            max_pieces,
            ops: Vec::new(),
        }
    }

    /// In-order bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No in-order bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left for in-order data, bytes (0 once the piece limit is reached).
    pub fn free(&self) -> usize {
        if self.pieces.len() >= self.max_pieces {
            0
        } else {
            self.cap - self.len
        }
    }

    /// Keeps the parts of `data` that lie in pool buffers, at `offset` from the
    /// first unread byte, skipping bytes already held; returns how many bytes of
    /// `data` from its start are now held (a part without an origin, or the piece
    /// limit, ends it).
    pub fn write_at(&mut self, offset: usize, data: Payload) -> usize {
        let mut at = self.head + offset as u64;
        let limit = self.head + self.cap as u64;
        let mut done = 0usize;
        for (bytes, origin) in data.spans() {
            let Some(o) = origin else { break };
            let end = (at + bytes.len() as u64).min(limit);
            if end <= at {
                break;
            }
            if !self.insert(at, end, o.buf, o.off) {
                break;
            }
            done += (end - at) as usize;
            at = end;
            if end == limit {
                break;
            }
        }
        done
    }

    /// Holds `[start, end)` of the stream, lying in `buf` from byte `off`, except the
    /// parts already held; false if the piece limit stopped it.
    fn insert(&mut self, start: u64, end: u64, buf: u32, off: u32) -> bool {
        let mut s = start;
        // First piece that ends after `s`.
        let mut k = self
            .pieces
            .partition_point(|(o, p)| o + u64::from(p.len) <= s);
        while s < end {
            let next_start = self.pieces.get(k).map(|(o, _)| *o).unwrap_or(u64::MAX);
            if next_start <= s {
                // Held already: skip past that piece.
                let (o, p) = self.pieces[k];
                s = o + u64::from(p.len);
                k += 1;
                continue;
            }
            let e = end.min(next_start);
            if self.pieces.len() >= self.max_pieces {
                return false;
            }
            let piece = BufSpan {
                buf,
                off: off + (s - start) as u32,
                len: (e - s) as u32,
            };
            self.pieces.insert(k, (s, piece));
            self.ops.push(BufOp::Retain(buf));
            k += 1;
            s = e;
        }
        true
    }

    /// Extends the in-order bytes over `n` bytes already placed with `write_at`.
    pub fn commit(&mut self, n: usize) {
        self.len = (self.len + n).min(self.cap);
    }

    /// Hands whole in-order pieces (at most `max_bytes` in at most `max_pieces`
    /// pieces, the last one cut if needed) to `sink`, which takes over their
    /// references; returns the bytes handed over.
    pub fn take(
        &mut self,
        max_bytes: usize,
        max_pieces: usize,
        mut sink: impl FnMut(BufSpan),
    ) -> usize {
        let mut done = 0usize;
        let mut pieces = 0usize;
        while done < max_bytes && pieces < max_pieces && self.len > 0 {
            pieces += 1;
            let Some(&(o, p)) = self.pieces.front() else {
                break;
            };
            debug_assert_eq!(o, self.head, "in-order data is contiguous");
            let want = (max_bytes - done).min(self.len);
            let give = if (p.len as usize) <= want {
                self.pieces.pop_front();
                p
            } else {
                // Cut: the caller gets the front with this reference, the queue keeps
                // the rest with a new one.
                let cut = want as u32;
                let front = &mut self.pieces[0];
                front.0 += u64::from(cut);
                front.1.off += cut;
                front.1.len -= cut;
                self.ops.push(BufOp::Retain(p.buf));
                BufSpan { len: cut, ..p }
            };
            sink(give);
            self.head += u64::from(give.len);
            self.len -= give.len as usize;
            done += give.len as usize;
        }
        done
    }

    /// Forgets out-of-order data at or beyond stream offset `offset` from the first
    /// unread byte (after a FIN ends the stream earlier).
    pub fn truncate(&mut self, offset: usize) {
        let limit = self.head + offset as u64;
        while let Some(&(o, p)) = self.pieces.back() {
            let end = o + u64::from(p.len);
            if end <= limit {
                break;
            }
            if o >= limit {
                self.ops.push(BufOp::Release(p.buf));
                self.pieces.pop_back();
            } else {
                self.pieces.back_mut().expect("checked").1.len = (limit - o) as u32;
                break;
            }
        }
    }

    /// Releases every piece (the connection is gone, or closed with unread data).
    pub fn clear(&mut self) {
        for (_, p) in self.pieces.drain(..) {
            self.ops.push(BufOp::Release(p.buf));
        }
        self.head += self.len as u64;
        self.len = 0;
    }
}

/// A byte ring someone else keeps that a connection sends from in place (a stack
/// server client's shared send ring): the connection's send buffer is then that
/// ring, as a kernel socket's buffer is the bytes it was written into.
pub trait LentBytes: std::fmt::Debug + Send {
    /// Ring positions `[pos, pos + n)` as up to two slices. The connection asks only
    /// for bytes it was lent and has not acknowledged.
    fn slices(&self, pos: u64, n: usize) -> (&[u8], &[u8]);
}

/// Where a connection hands in-order bytes that nothing waits before (a stack
/// server client's shared receive ring): the reader gets them with one copy from
/// the frame, where the receive buffer would take one and give one. The connection
/// counts them as read by the application.
pub trait RecvSink: std::fmt::Debug + Send {
    /// Room for bytes now.
    fn room(&self) -> usize;
    /// Appends `chunk`; the connection made sure of room for all of a segment first.
    fn push(&mut self, chunk: &[u8]);
}

/// A send buffer in a lent ring: bytes `[head, head + len)` of it, `head` being the
/// ring position of SND.UNA's byte.
#[derive(Debug)]
pub struct LentRing {
    src: Box<dyn LentBytes>,
    head: u64,
    len: usize,
    cap: usize,
    /// The capacity of the byte ring the connection had before, for when it takes
    /// its bytes back ([`SendBuf::unlend`]).
    own_cap: usize,
}

impl LentRing {
    /// The ring position of the first unacknowledged byte.
    pub fn head(&self) -> u64 {
        self.head
    }
    /// It holds all the lender lets it.
    pub fn is_full(&self) -> bool {
        self.len >= self.cap
    }
    /// The bytes it holds, as up to two slices of the ring.
    pub fn held(&self) -> (&[u8], &[u8]) {
        self.src.slices(self.head, self.len)
    }
}

/// The send buffer: bytes in a ring (copying sockets), pieces of pool buffers
/// (zero-copy connections), or a ring lent by whoever wrote the bytes.
#[derive(Debug)]
pub enum SendBuf {
    /// Bytes copied in by `send`.
    Bytes(Ring),
    /// Pool-buffer pieces handed over by `send_span`.
    Bufs(SgSend),
    /// Bytes left where they were written (`Connection::lend_send_buffer`).
    Lent(LentRing),
}

impl SendBuf {
    /// Bytes queued.
    pub fn len(&self) -> usize {
        match self {
            SendBuf::Bytes(r) => r.len(),
            SendBuf::Bufs(q) => q.len(),
            SendBuf::Lent(l) => l.len,
        }
    }
    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Room left.
    pub fn free(&self) -> usize {
        match self {
            SendBuf::Bytes(r) => r.free(),
            SendBuf::Bufs(q) => q.free(),
            SendBuf::Lent(l) => l.cap - l.len,
        }
    }
    /// Appends bytes (a byte ring only; a zero-copy queue takes pieces, a lent ring
    /// its owner's bytes in place).
    pub fn push(&mut self, data: &[u8]) -> usize {
        match self {
            SendBuf::Bytes(r) => r.push(data),
            SendBuf::Bufs(_) | SendBuf::Lent(_) => 0,
        }
    }
    /// [`Ring::push_with`] (a byte ring only).
    pub fn push_with(&mut self, n: usize, fill: impl FnMut(&mut [u8]) -> usize) -> usize {
        match self {
            SendBuf::Bytes(r) => r.push_with(n, fill),
            SendBuf::Bufs(_) | SendBuf::Lent(_) => 0,
        }
    }
    /// Takes up to `n` more bytes of a lent ring, the ones right after those it
    /// holds (a lent ring only). Returns the count taken.
    pub fn extend_lent(&mut self, n: usize) -> usize {
        match self {
            SendBuf::Lent(l) => {
                let n = n.min(l.cap - l.len);
                l.len += n;
                n
            }
            SendBuf::Bytes(_) | SendBuf::Bufs(_) => 0,
        }
    }
    /// An empty byte ring becomes a view of `src` from ring position `pos`, holding
    /// at most `cap` bytes (at most its own capacity). False, nothing changed,
    /// otherwise.
    pub fn lend(&mut self, src: Box<dyn LentBytes>, pos: u64, cap: usize) -> bool {
        let SendBuf::Bytes(r) = self else {
            return false;
        };
        if !r.is_empty() {
            return false;
        }
        let own_cap = r.capacity();
        *self = SendBuf::Lent(LentRing {
            src,
            head: pos,
            len: 0,
            cap: cap.min(own_cap),
            own_cap,
        });
        true
    }
    /// A lent ring's bytes copied into a byte ring of the connection's own, which
    /// becomes the buffer (the lender wants its ring back). Returns whether it was
    /// lent.
    pub fn unlend(&mut self) -> bool {
        let SendBuf::Lent(l) = self else {
            return false;
        };
        let mut r = Ring::new(l.own_cap);
        let (a, b) = l.held();
        r.push(a);
        r.push(b);
        *self = SendBuf::Bytes(r);
        true
    }
    /// Drops `n` acknowledged bytes.
    pub fn consume(&mut self, n: usize) {
        match self {
            SendBuf::Bytes(r) => r.consume(n),
            SendBuf::Bufs(q) => q.consume(n),
            SendBuf::Lent(l) => {
                let n = n.min(l.len);
                l.head += n as u64;
                l.len -= n;
            }
        }
    }
    /// The payload of bytes `[offset, offset + n)`; `scratch` holds the pieces of a
    /// zero-copy queue.
    pub fn payload_at<'a>(
        &'a mut self,
        offset: usize,
        n: usize,
        scratch: &'a mut Vec<BufSpan>,
    ) -> TxData<'a> {
        match self {
            SendBuf::Bytes(r) => {
                let (a, b) = r.slices(offset, n);
                TxData::Bytes(a, b)
            }
            SendBuf::Bufs(q) => {
                scratch.clear();
                let at_piece_start = q.spans_at(offset, n, scratch);
                TxData::Bufs {
                    spans: scratch,
                    at_piece_start,
                }
            }
            SendBuf::Lent(l) => {
                if offset >= l.len {
                    return TxData::NONE;
                }
                let (a, b) = l.src.slices(l.head + offset as u64, n.min(l.len - offset));
                TxData::Bytes(a, b)
            }
        }
    }
    fn ops(&mut self) -> Option<&mut Vec<BufOp>> {
        match self {
            SendBuf::Bytes(_) | SendBuf::Lent(_) => None,
            SendBuf::Bufs(q) => Some(&mut q.ops),
        }
    }
}

/// The receive buffer: bytes in a ring (copying sockets) or pieces of received
/// frames (zero-copy connections).
#[derive(Debug)]
pub enum RecvBuf {
    /// Bytes copied out of each segment.
    Bytes(Ring),
    /// The received frames' buffers, kept.
    Bufs(SgRecv),
}

impl RecvBuf {
    /// In-order bytes held.
    pub fn len(&self) -> usize {
        match self {
            RecvBuf::Bytes(r) => r.len(),
            RecvBuf::Bufs(q) => q.len(),
        }
    }
    /// No in-order bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        match self {
            RecvBuf::Bytes(r) => r.capacity(),
            RecvBuf::Bufs(q) => q.cap,
        }
    }
    /// Room left.
    pub fn free(&self) -> usize {
        match self {
            RecvBuf::Bytes(r) => r.free(),
            RecvBuf::Bufs(q) => q.free(),
        }
    }
    /// Places `data` at `offset` from the first unread byte; returns the bytes placed.
    pub fn write_payload(&mut self, offset: usize, data: Payload) -> usize {
        match self {
            RecvBuf::Bytes(r) => {
                let mut n = 0;
                for c in data.chunks() {
                    let w = r.write_at(offset + n, c);
                    n += w;
                    if w < c.len() {
                        break;
                    }
                }
                n
            }
            RecvBuf::Bufs(q) => q.write_at(offset, data),
        }
    }
    /// Extends the in-order bytes over bytes already placed.
    pub fn commit(&mut self, n: usize) {
        match self {
            RecvBuf::Bytes(r) => r.commit(n),
            RecvBuf::Bufs(q) => q.commit(n),
        }
    }
    /// In-order bytes from `offset` as up to two slices (a byte ring only).
    pub fn slices(&self, offset: usize, n: usize) -> (&[u8], &[u8]) {
        match self {
            RecvBuf::Bytes(r) => r.slices(offset, n),
            RecvBuf::Bufs(_) => (&[], &[]),
        }
    }
    /// Copies from `offset` without consuming (a byte ring only).
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        match self {
            RecvBuf::Bytes(r) => r.peek(offset, out),
            RecvBuf::Bufs(_) => 0,
        }
    }
    /// Drops `n` in-order bytes (a byte ring only; pieces leave through `take`).
    pub fn consume(&mut self, n: usize) {
        if let RecvBuf::Bytes(r) = self {
            r.consume(n);
        }
    }
    /// Forgets out-of-order data from `offset` on.
    pub fn truncate(&mut self, offset: usize) {
        if let RecvBuf::Bufs(q) = self {
            q.truncate(offset);
        }
    }
    fn ops(&mut self) -> Option<&mut Vec<BufOp>> {
        match self {
            RecvBuf::Bytes(_) => None,
            RecvBuf::Bufs(q) => Some(&mut q.ops),
        }
    }
}

/// Hands the buffer-reference changes of both queues to `f`, retains first (a
/// released piece may be the last reference to a buffer another piece just took).
pub(crate) fn drain_ops(snd: &mut SendBuf, rcv: &mut RecvBuf, mut f: impl FnMut(BufOp)) {
    for ops in [rcv.ops(), snd.ops()].into_iter().flatten() {
        for op in ops.iter().filter(|o| matches!(o, BufOp::Retain(_))) {
            f(*op);
        }
    }
    for ops in [rcv.ops(), snd.ops()].into_iter().flatten() {
        for op in ops.drain(..).filter(|o| matches!(o, BufOp::Release(_))) {
            f(op);
        }
    }
}

/// `len` bytes from `from` of the two slices `(a, b)` taken as one (a ring's
/// bytes that may wrap), as two slices again.
pub fn ring_range<'a>(
    (a, b): (&'a [u8], &'a [u8]),
    from: usize,
    len: usize,
) -> (&'a [u8], &'a [u8]) {
    if from >= a.len() {
        let f = from - a.len();
        (&b[f..f + len], &[])
    } else {
        let in_a = len.min(a.len() - from);
        (&a[from..from + in_a], &b[..len - in_a])
    }
}

/// A segment's payload as the engine hands it to a [`SegmentSink`](crate::SegmentSink).
#[derive(Debug, Clone, Copy)]
pub enum TxData<'a> {
    /// Bytes from the send ring (it may wrap: two slices).
    Bytes(&'a [u8], &'a [u8]),
    /// Pieces of pool buffers, in order; the sink reads them from the pool. A lone
    /// span that starts where its piece starts may go in place, the headers written
    /// in front of it: the bytes there are acknowledged or headroom. (In front of a
    /// later part of a piece they would be payload still unacknowledged.)
    Bufs {
        /// The pieces, cut to the segment.
        spans: &'a [BufSpan],
        /// The first span starts at its piece's start.
        at_piece_start: bool,
    },
}

impl TxData<'_> {
    /// No payload.
    pub const NONE: TxData<'static> = TxData::Bytes(&[], &[]);

    /// Payload bytes.
    pub fn len(&self) -> usize {
        match self {
            TxData::Bytes(a, b) => a.len() + b.len(),
            TxData::Bufs { spans, .. } => spans.iter().map(|s| s.len as usize).sum(),
        }
    }

    /// No payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::Origin;

    fn span(buf: u32, off: u32, len: u32) -> BufSpan {
        BufSpan { buf, off, len }
    }

    #[test]
    fn send_queue_cuts_ranges_and_releases_what_is_acknowledged() {
        let mut q = SgSend::new(1 << 16);
        assert!(q.push(span(1, 200, 100)));
        assert!(q.push(span(2, 200, 50)));
        assert!(!q.push(span(3, 0, 0)), "empty pieces are refused");
        let mut out = Vec::new();
        assert!(!q.spans_at(90, 30, &mut out));
        assert_eq!(out, vec![span(1, 290, 10), span(2, 200, 20)]);
        out.clear();
        assert!(q.spans_at(100, 10, &mut out));
        out.clear();
        q.spans_at(140, 100, &mut out);
        assert_eq!(out, vec![span(2, 240, 10)]);
        q.consume(120);
        assert_eq!(q.ops, vec![BufOp::Release(1)]);
        assert_eq!(q.len(), 30);
        out.clear();
        assert!(
            q.spans_at(0, 30, &mut out),
            "what was acknowledged is no longer part of the piece"
        );
        assert_eq!(out, vec![span(2, 220, 30)]);
        q.clear();
        assert_eq!(q.ops, vec![BufOp::Release(1), BufOp::Release(2)]);
    }

    #[test]
    fn send_queue_lookups_in_any_order_match_a_walk_from_the_front() {
        let mut q = SgSend::new(1 << 20);
        for k in 0..200u32 {
            assert!(q.push(span(k, 100, 1 + k % 37)));
        }
        let flat: Vec<(u32, u32)> = q
            .spans
            .iter()
            .flat_map(|s| (0..s.len).map(move |i| (s.buf, s.off + i)))
            .collect();
        let mut rng = 12345u64;
        let mut base = 0usize;
        for step in 0..2000 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (rng >> 33) as usize;
            if step % 50 == 49 {
                let n = r % 40;
                q.consume(n);
                base += n;
                continue;
            }
            let (off, n) = (r % (q.len() + 1), 1 + (r >> 8) % 60);
            let mut out = Vec::new();
            q.spans_at(off, n, &mut out);
            let got: Vec<(u32, u32)> = out
                .iter()
                .flat_map(|s| (0..s.len).map(move |i| (s.buf, s.off + i)))
                .collect();
            let want: Vec<(u32, u32)> = flat[base + off..]
                .iter()
                .take(n.min(q.len() - off))
                .copied()
                .collect();
            assert_eq!(got, want, "step {step}: offset {off}, {n} bytes");
        }
    }

    #[test]
    fn send_queue_limits_pieces() {
        let mut q = SgSend::new(16 * MIN_PIECE);
        for k in 0..16 {
            assert!(q.push(span(k, 0, 1)));
        }
        assert_eq!(q.free(), 0);
        assert!(!q.push(span(99, 0, 1)));
    }

    #[test]
    fn receive_queue_keeps_each_byte_once_and_hands_out_in_order() {
        let mut q = SgRecv::new(1 << 16);
        let d = [0u8; 300];
        // Out of order first: stream bytes [100, 200) in buffer 7.
        let n = q.write_at(
            100,
            Payload::with_origin(&d[..100], Origin { buf: 7, off: 50 }),
        );
        assert_eq!(n, 100);
        // Then [0, 150) in buffer 8: only [0, 100) is new.
        let n = q.write_at(
            0,
            Payload::with_origin(&d[..150], Origin { buf: 8, off: 10 }),
        );
        assert_eq!(n, 150);
        assert_eq!(q.ops, vec![BufOp::Retain(7), BufOp::Retain(8)]);
        q.commit(200);
        let mut got = Vec::new();
        assert_eq!(q.take(60, usize::MAX, |s| got.push(s)), 60);
        assert_eq!(got, vec![span(8, 10, 60)]);
        assert_eq!(
            q.ops.last(),
            Some(&BufOp::Retain(8)),
            "a cut piece takes a reference"
        );
        got.clear();
        assert_eq!(q.take(usize::MAX, 1, |s| got.push(s)), 40);
        assert_eq!(q.take(usize::MAX, 5, |s| got.push(s)), 100);
        assert_eq!(got, vec![span(8, 70, 40), span(7, 50, 100)]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn receive_queue_stops_at_a_part_without_origin() {
        let mut q = SgRecv::new(1 << 16);
        let d = [0u8; 10];
        let parts: [&[u8]; 2] = [&d, &d];
        assert_eq!(q.write_at(0, Payload::chain(&parts)), 0);
        let origins = [Origin { buf: 1, off: 0 }, Origin { buf: 2, off: 0 }];
        assert_eq!(
            q.write_at(0, Payload::chain_with_origins(&parts, &origins)),
            20
        );
    }

    #[test]
    fn receive_queue_truncates_and_clears() {
        let mut q = SgRecv::new(1 << 16);
        let d = [0u8; 100];
        q.write_at(0, Payload::with_origin(&d, Origin { buf: 1, off: 0 }));
        q.write_at(200, Payload::with_origin(&d, Origin { buf: 2, off: 0 }));
        q.write_at(400, Payload::with_origin(&d, Origin { buf: 3, off: 0 }));
        q.commit(100);
        q.truncate(250);
        assert_eq!(q.pieces.len(), 2);
        assert_eq!(q.pieces[1].1.len, 50);
        assert!(q.ops.contains(&BufOp::Release(3)));
        q.clear();
        let retains = q
            .ops
            .iter()
            .filter(|o| matches!(o, BufOp::Retain(_)))
            .count();
        let releases = q
            .ops
            .iter()
            .filter(|o| matches!(o, BufOp::Release(_)))
            .count();
        assert_eq!(retains, releases, "every reference taken is given back");
    }
}
