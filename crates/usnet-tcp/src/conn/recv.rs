//! The receive side: the receive buffer and sequence variables (RFC 9293 §3.3.1),
//! reassembly of out-of-order data straight into the ring, the window we advertise
//! (receiver SWS avoidance, no shrinking, rounding that keeps the promise, autotuning),
//! SACK and D-SACK blocks to send (RFC 2018, RFC 2883), urgent data (RFC 6093), and
//! when to acknowledge (quick-ack, every second segment, delayed ACK, duplicate ACKs
//! for out-of-order data).

use std::time::Duration;

use usnet_wire::TcpOptions;

use super::timers::Timer;
use super::{Connection, Segment};
use crate::config::TcpConfig;
use crate::payload::Payload;
use crate::ring::{OooAdd, OooRanges, Ring};
use crate::seq::Seq;
use crate::sg::{BufSpan, RecvBuf, RecvSink, SgRecv};
use crate::time::Instant;

/// RCV.*, the receive buffer and what arrived out of order.
#[derive(Debug)]
pub(crate) struct RecvState {
    /// Initial receive sequence number.
    pub irs: Seq,
    /// RCV.NXT: the receive buffer's in-order data ends here.
    pub nxt: Seq,
    /// Our window shift.
    pub wscale: u8,
    /// Right edge of the window we last advertised (never moves left).
    pub adv: Seq,
    /// In-order data not yet read, then out-of-order data at its offset.
    pub buf: RecvBuf,
    /// Which out-of-order ranges the buffer holds.
    pub ooo: OooRanges,
    /// A sequence number inside each recently changed SACK block, newest first.
    pub sack_recent: [Option<Seq>; 4],
    /// A duplicate to report in the next ACK (D-SACK).
    pub dsack: Option<(Seq, Seq)>,
    /// Sequence number of the peer's FIN, once seen (possibly out of order).
    pub fin_seq: Option<Seq>,
    /// The FIN was taken in order: RCV.NXT is past it.
    pub fin_received: bool,
    /// Largest wire segment seen from the peer (the ACK-every-two rule's unit).
    pub mss: u32,
    /// Receive-window limit (autotuned).
    pub space: usize,
    /// Bytes the application read since `space_at` (autotuning).
    pub copied: usize,
    pub space_at: Instant,
    /// The receiver's RTT estimate from timestamp echoes (autotuning).
    pub rtt: Option<Duration>,
    /// Sequence number of the pending out-of-band byte in the receive buffer.
    pub urg_seq: Option<Seq>,
    /// The out-of-band byte, taken out of the stream and not yet read.
    pub oob_byte: Option<u8>,
    /// The application shut down reading (SHUT_RD).
    pub read_shut: bool,
    /// Linux's `rcv_ssthresh` (`TcpConfig::rcv_ssthresh`): the most window to
    /// offer; `u32::MAX` when off.
    pub ssthresh: u32,
    /// Where in-order bytes go when nothing waits before them (what it took is
    /// counted in `rx_direct_bytes`).
    pub sink: Option<Box<dyn RecvSink>>,
}

impl RecvState {
    pub(crate) fn new(cfg: &TcpConfig, mss: u32, now: Instant) -> Self {
        let space = if cfg.autotune {
            cfg.recv_buffer_initial.min(cfg.recv_buffer)
        } else {
            cfg.recv_buffer
        };
        RecvState {
            irs: Seq(0),
            nxt: Seq(0),
            wscale: 0,
            adv: Seq(0),
            buf: if cfg.zero_copy {
                RecvBuf::Bufs(SgRecv::new(cfg.recv_buffer))
            } else {
                RecvBuf::Bytes(Ring::new(cfg.recv_buffer))
            },
            ooo: OooRanges::new(cfg.max_ooo_ranges),
            sack_recent: [None; 4],
            dsack: None,
            fin_seq: None,
            fin_received: false,
            mss: mss.min(536),
            space,
            copied: 0,
            space_at: now,
            rtt: None,
            urg_seq: None,
            oob_byte: None,
            read_shut: false,
            ssthresh: if cfg.rcv_ssthresh { 65535 } else { u32::MAX },
            sink: None,
        }
    }
}

/// When to acknowledge.
#[derive(Debug, Clone)]
pub(crate) struct AckState {
    /// An ACK is due now.
    pub pending: bool,
    /// Duplicate ACKs still to send, one per out-of-order wire segment.
    pub dupacks_owed: u32,
    /// In-order bytes received since the last ACK.
    pub unacked_bytes: u32,
    /// Segments still to acknowledge one by one (quick-ack mode).
    pub quickack: u32,
    /// RCV.NXT in the last ACK sent (RFC 7323's Last.ACK.sent).
    pub last_sent: Seq,
    /// When data last arrived in order (None: never), for interactive mode.
    pub last_data_rx: Option<Instant>,
    /// When data (or an active open's SYN-ACK) last arrived: `tcpi_last_data_recv`.
    pub last_rcv: Option<Instant>,
    /// Interactive ("pingpong") mode, as Linux: data we send within a delayed-ACK
    /// interval of data received means the peer's next data is answered with our
    /// reply, so it is not acknowledged at once (no quick-acks) but with the
    /// delayed-ACK timer; the timer firing ends the mode.
    pub pingpong: bool,
}

impl AckState {
    pub(crate) fn new(quickack: u32) -> Self {
        AckState {
            pending: false,
            dupacks_owed: 0,
            unacked_bytes: 0,
            quickack,
            last_sent: Seq(0),
            last_data_rx: None,
            last_rcv: None,
            pingpong: false,
        }
    }
}

impl Connection {
    /// Bytes that `recv` can return now.
    pub fn recv_available(&self) -> usize {
        self.rcv.buf.len() - usize::from(self.rcv.urg_seq.is_some_and(|u| self.in_rcvbuf(u)))
    }

    /// The peer sent FIN and everything before it has been read, or the application
    /// shut down reading and has read what was queued.
    pub fn is_eof(&self) -> bool {
        (self.rcv.fin_received || self.rcv.read_shut) && self.recv_available() == 0
    }

    /// Hands in-order bytes that nothing waits before to `sink` instead of queueing
    /// them (a stack server's client ring): one copy fewer per byte received. They
    /// count as read, so the window and autotuning see an application that reads
    /// at once; a segment the sink has no room for, and everything after it until
    /// the queue empties again, is queued as usual. Only a copying receive queue
    /// takes one. Returns the sink it replaces.
    pub fn set_recv_sink(&mut self, sink: Option<Box<dyn RecvSink>>) -> Option<Box<dyn RecvSink>> {
        std::mem::replace(&mut self.rcv.sink, sink)
    }

    /// Bytes handed to a receive sink so far.
    pub fn recv_delivered(&self) -> u64 {
        self.stats.rx_direct_bytes
    }

    /// SHUT_RD: reading ends once what is queued has been read (`recv` then returns
    /// 0, as Linux does); what arrives later is still acknowledged and queued, and
    /// counts as unread data when the application closes.
    pub fn shutdown_read(&mut self) {
        self.rcv.read_shut = true;
    }

    fn in_rcvbuf(&self, s: Seq) -> bool {
        let head = self.rcv.nxt - self.rcv.buf.len() as u32;
        s.in_range(head, self.rcv.nxt)
    }

    /// Copy received in-order data into `out`; returns the count (0: nothing now, or
    /// EOF if [`Connection::is_eof`]). With `oob_inline` off, the urgent byte is
    /// skipped here and kept for [`Connection::recv_urgent`].
    pub fn recv(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        self.recv_with(out.len(), |chunk| {
            out[done..done + chunk.len()].copy_from_slice(chunk);
            done += chunk.len();
        })
    }

    /// [`Connection::recv`] that hands up to `max` bytes to `sink` as they lie in the
    /// receive ring (in order, a few slices), so a consumer elsewhere (a stack server
    /// client's shared ring) gets them with one copy. Returns the count taken.
    pub fn recv_with(&mut self, max: usize, sink: impl FnMut(&[u8])) -> usize {
        self.recv_upto(max, false, sink)
    }

    /// [`Connection::recv`] that stops at the urgent mark instead of taking the
    /// urgent byte out of the stream (Linux's `tcp_read_sock`, what `splice` reads
    /// with): at the mark it returns 0 while data waits (see
    /// [`Connection::at_urgent_mark`]).
    pub fn recv_to_mark(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        self.recv_upto(out.len(), true, |chunk| {
            out[done..done + chunk.len()].copy_from_slice(chunk);
            done += chunk.len();
        })
    }

    /// [`Connection::recv_with`] that stops at the urgent mark (see
    /// [`Connection::recv_to_mark`]): a consumer elsewhere learns where the mark is
    /// by finding [`Connection::at_urgent_mark`] after it, then takes the urgent
    /// byte with [`Connection::take_urgent_at_mark`].
    pub fn recv_with_to_mark(&mut self, max: usize, sink: impl FnMut(&[u8])) -> usize {
        self.recv_upto(max, true, sink)
    }

    /// At the urgent mark: takes the urgent byte out of the stream (as a read that
    /// passes the mark does) and returns it; None elsewhere.
    pub fn take_urgent_at_mark(&mut self) -> Option<u8> {
        // A queue of pool buffers: the byte is in the pool (`take_urgent_piece`).
        if !self.at_urgent_mark() || matches!(self.rcv.buf, RecvBuf::Bufs(_)) {
            return None;
        }
        let mut b = [0u8; 1];
        self.rcv.buf.peek(0, &mut b);
        self.rcv.buf.consume(1);
        self.rcv.urg_seq = None;
        self.rcv.oob_byte = None;
        self.after_app_read(1);
        Some(b[0])
    }

    /// Whether the next byte to read is the urgent byte (out of band, not inline).
    pub fn at_urgent_mark(&self) -> bool {
        let head = self.rcv.nxt - self.rcv.buf.len() as u32;
        !self.rcv.buf.is_empty() && self.rcv.urg_seq == Some(head)
    }

    fn recv_upto(&mut self, max: usize, stop_at_mark: bool, mut sink: impl FnMut(&[u8])) -> usize {
        let mut done = 0;
        while done < max && !self.rcv.buf.is_empty() {
            let head = self.rcv.nxt - self.rcv.buf.len() as u32;
            let mut want = max - done;
            if let Some(u) = self.rcv.urg_seq {
                if u == head && stop_at_mark {
                    break;
                }
                if u == head {
                    let mut b = [0u8; 1];
                    self.rcv.buf.peek(0, &mut b);
                    self.rcv.buf.consume(1);
                    self.rcv.oob_byte = Some(b[0]);
                    self.rcv.urg_seq = None;
                    continue;
                }
                if self.in_rcvbuf(u) {
                    want = want.min(u.since(head) as usize);
                } else if u.lt(head) {
                    self.rcv.urg_seq = None;
                }
            }
            let (a, b) = self.rcv.buf.slices(0, want);
            let n = a.len() + b.len();
            if !a.is_empty() {
                sink(a);
            }
            if !b.is_empty() {
                sink(b);
            }
            self.rcv.buf.consume(n);
            done += n;
            if n == 0 {
                break;
            }
        }
        if done > 0 {
            self.after_app_read(done);
        }
        done
    }

    /// Zero-copy connection: hands in-order payload to `sink` as pieces of pool
    /// buffers (whole pieces, at most `max_pieces`, the last cut only to respect
    /// `max`), whose references the caller takes over. Returns the bytes handed
    /// over (0: nothing now, or EOF if [`Connection::is_eof`]).
    pub fn recv_spans(
        &mut self,
        max: usize,
        max_pieces: usize,
        sink: impl FnMut(BufSpan),
    ) -> usize {
        let RecvBuf::Bufs(q) = &mut self.rcv.buf else {
            return 0;
        };
        let done = q.take(max, max_pieces, sink);
        if done > 0 {
            self.after_app_read(done);
        }
        done
    }

    /// Bytes a read may take before the urgent byte (out of band, not inline):
    /// Some(0) at the mark, None while no urgent byte is queued.
    pub fn bytes_to_urgent_mark(&self) -> Option<usize> {
        let u = self.rcv.urg_seq?;
        let head = self.rcv.nxt - self.rcv.buf.len() as u32;
        self.in_rcvbuf(u).then(|| u.since(head) as usize)
    }

    /// Zero-copy connection at the urgent mark: takes the urgent byte out of the
    /// stream as a one-byte piece (its reference goes to the caller, who reads the
    /// byte from the pool: [`Connection::take_urgent_at_mark`] for a queue of
    /// pool buffers). None elsewhere.
    pub fn take_urgent_piece(&mut self) -> Option<BufSpan> {
        if !self.at_urgent_mark() {
            return None;
        }
        let RecvBuf::Bufs(q) = &mut self.rcv.buf else {
            return None;
        };
        let mut piece = None;
        q.take(1, 1, |s| piece = Some(s));
        self.rcv.urg_seq = None;
        self.rcv.oob_byte = None;
        if piece.is_some() {
            self.after_app_read(1);
        }
        piece
    }

    /// The urgent byte a read of a zero-copy connection passed (it took the byte
    /// out of the stream with [`Connection::take_urgent_piece`]): kept for
    /// [`Connection::recv_urgent`], as a copying read keeps it.
    pub fn keep_urgent_byte(&mut self, b: u8) {
        self.rcv.oob_byte = Some(b);
    }

    /// The out-of-band byte (urgent data), if one arrived and was not read.
    pub fn recv_urgent(&mut self) -> Option<u8> {
        self.rcv.oob_byte.take()
    }

    /// After the application read: autotune the window and decide on a window update.
    fn after_app_read(&mut self, n: usize) {
        self.rcv.copied += n;
        if self.cfg.autotune && self.rcv.space < self.cfg.recv_buffer {
            let rtt = self
                .rcv
                .rtt
                .or(self.rtt.srtt)
                .unwrap_or(Duration::from_millis(100))
                .max(Duration::from_millis(1));
            if self.now.saturating_since(self.rcv.space_at) >= rtt {
                // Dynamic right-sizing: the window must hold what the application
                // consumes in two RTTs, with room for the sender to double.
                let want = self.rcv.copied.saturating_mul(4);
                if want > self.rcv.space {
                    self.rcv.space = want.min(self.cfg.recv_buffer);
                    self.stats.rcv_window_grown += 1;
                }
                self.rcv.copied = 0;
                self.rcv.space_at = self.now;
            }
        }
        if !self.state.is_synchronized() || self.rcv.fin_received {
            return;
        }
        // Window update when the usable window grows by enough (RFC 9293 §3.8.6.2.2).
        // The window field can say at most 65535 << scale, so a bigger buffer cannot
        // move the advertised edge further (without window scaling every small read
        // would otherwise ask for a duplicate ACK).
        let max_adv = 65535u32 << u32::from(self.rcv.wscale);
        let right = self.rcv.nxt + self.rcv_window_available().min(max_adv);
        let adv_left = self.rcv.adv.since(self.rcv.nxt) as usize;
        let limit = self.rcv_limit();
        if self.rcv.ssthresh != u32::MAX {
            // Linux's `tcp_cleanup_rbuf`: an update when the read at least doubles
            // a window that had shrunk to half the clamp or less.
            let new = right.since(self.rcv.nxt) as usize;
            if 2 * adv_left <= limit && new >= 2 * adv_left && new > 0 {
                self.ack.pending = true;
                self.stats.tx_window_updates += 1;
            }
            return;
        }
        let step = (limit / 2).min(2 * self.rcv.mss as usize).max(1);
        if right.since(self.rcv.adv) as usize >= step && adv_left <= limit / 2 {
            self.ack.pending = true;
            self.stats.tx_window_updates += 1;
        }
    }

    pub(crate) fn rcv_limit(&self) -> usize {
        self.rcv.space.min(self.rcv.buf.capacity())
    }

    /// Window the buffer could take now, bytes.
    pub(crate) fn rcv_window_available(&self) -> u32 {
        let free = self.rcv_limit().saturating_sub(self.rcv.buf.len());
        let free = free.min(self.rcv.buf.free()).min(u32::MAX as usize / 2) as u32;
        free.min(self.rcv.ssthresh)
    }

    /// The window field to send, and the right edge it advertises.
    pub(crate) fn window_field(&self, syn: bool) -> (u16, Seq) {
        let avail = self.rcv_window_available();
        let mut right = self.rcv.nxt + avail;
        if right.gt(self.rcv.adv) {
            // Receiver SWS avoidance (RFC 9293 §3.8.6.2.2).
            let step = ((self.rcv_limit() / 2) as u32).min(self.rcv.mss).max(1);
            if right.since(self.rcv.adv) < step && self.rcv.adv.gt(self.rcv.nxt) {
                right = self.rcv.adv;
            }
        } else {
            // Never shrink the window.
            right = self.rcv.adv.max(self.rcv.nxt);
        }
        let wnd = right.since(self.rcv.nxt);
        if syn {
            let f = wnd.min(65535);
            return (f as u16, self.rcv.nxt + f);
        }
        let ws = u32::from(self.rcv.wscale);
        let mut f = wnd >> ws;
        // Round up rather than shrink, but never past the bytes the buffer can really
        // take: each rounding would otherwise promise up to 2^ws - 1 bytes more than
        // the last, the promise ratchets ahead of the buffer while it is full, and the
        // sender's in-window segments get trimmed and look lost (RFC 7323 appendix F).
        // Rounding down there shrinks the edge by less than one scale unit.
        let room = self.rcv.buf.free().min(u32::MAX as usize / 2) as u32;
        if (f << ws) < self.rcv.adv.since(self.rcv.nxt) && ((f + 1) << ws) <= room {
            f += 1;
        }
        let f = f.min(65535);
        (f as u16, self.rcv.nxt + (f << ws))
    }

    /// The SACK blocks for an ACK (RFC 2018 §4): a D-SACK first, then the most
    /// recently changed blocks, then the highest ones.
    pub(crate) fn push_sack_blocks(&self, o: &mut TcpOptions) {
        if let Some((l, r)) = self.rcv.dsack {
            o.push_sack(l.0, r.0);
        }
        for p in self.rcv.sack_recent.iter().flatten() {
            if let Some((l, r)) = self.rcv.ooo.containing(*p) {
                if !o.sacks().contains(&(l.0, r.0)) {
                    o.push_sack(l.0, r.0);
                }
            }
        }
        // Fill from the highest ranges if recency did not name enough.
        for &(l, r) in self.rcv.ooo.ranges().iter().rev() {
            if o.sack_count >= 4 {
                break;
            }
            if !o.sacks().contains(&(l.0, r.0)) {
                o.push_sack(l.0, r.0);
            }
        }
    }

    /// An ACK went out advertising the right edge `adv`: nothing is owed any more
    /// (one duplicate ACK less), and a reported D-SACK is done.
    pub(crate) fn on_ack_sent(&mut self, adv: Seq, sent_sack: bool) {
        if self.rcv.dsack.is_some() && sent_sack {
            self.stats.rare().tx_dsack += 1;
            self.rcv.dsack = None;
        }
        self.rcv.adv = self.rcv.adv.max(adv);
        self.ack.last_sent = self.rcv.nxt;
        self.ack.pending = false;
        self.timers.clear(Timer::DelayedAck);
        self.ack.unacked_bytes = 0;
        self.ack.dupacks_owed = self.ack.dupacks_owed.saturating_sub(1);
    }

    pub(crate) fn on_delayed_ack_timer(&mut self) {
        // A delayed ACK that had to go alone: the exchange is not interactive.
        self.ack.pingpong = false;
        if !self.ack.pending {
            self.ack.pending = true;
            self.stats.tx_delayed_acks += 1;
        }
    }

    /// The urgent pointer of a segment starting at `seq` (RFC 6093: BSD/Linux
    /// semantics, the pointer names the byte after the urgent byte).
    pub(crate) fn note_urgent(&mut self, seq: Seq, up: u16) {
        // (The zero-copy API's connections, which hand out whole buffers, are
        // configured with `oob_inline`; a pool-backed queue read through the
        // copying calls takes the urgent byte out as a byte ring does.)
        if up == 0 || self.cfg.oob_inline {
            self.stats.rare().rx_urgent_inline += 1;
            return;
        }
        let u = seq + (u32::from(up) - 1);
        if u.ge(self.rcv.nxt) && u.lt(self.rcv.adv) {
            if self.rcv.urg_seq != Some(u) {
                self.rcv.urg_seq = Some(u);
                self.stats.rare().rx_urgent_oob += 1;
            }
        } else {
            self.stats.rare().rx_urgent_inline += 1;
        }
    }

    /// The data (and FIN position) of an acceptable segment starting at `seq`: trim
    /// what we have and what does not fit, then take it in order or hold it out of
    /// order; the FIN is remembered until the data before it is in.
    pub(crate) fn receive_text(&mut self, seg: &Segment, seq: Seq, fin: bool) {
        let payload = seg.payload;
        let wire_segs = seg.wire_segments();
        if !payload.is_empty() {
            self.note_peer_segment(seg);
        }
        let mut start = seq;
        let mut data = payload;
        // Trim what we already have.
        if start.lt(self.rcv.nxt) {
            let dup = (self.rcv.nxt.since(start) as usize).min(data.len());
            if dup > 0 {
                self.stats.rx_dup_bytes += dup as u64;
                if self.opts.sack && self.cfg.dsack {
                    self.rcv.dsack = Some((start, start + dup));
                }
                self.ack.pending = true;
            }
            data = data.skip(dup);
            start = self.rcv.nxt;
        }
        // Trim to the window we advertised and the buffer.
        let limit = self.rcv.adv.min(self.rcv.nxt + self.rcv.buf.free() as u32);
        let room = limit.since(start) as usize;
        let mut fin = fin;
        if data.len() > room {
            self.stats.rare().rx_beyond_window_bytes += (data.len() - room) as u64;
            data = data.take(room);
            fin = false;
            self.ack.pending = true;
        }
        if fin {
            let fs = start + data.len();
            if self.rcv.fin_seq.is_none_or(|f| f == fs) {
                self.rcv.fin_seq = Some(fs);
                self.rcv.ooo.truncate(fs);
                let head = self.rcv.nxt - self.rcv.buf.len() as u32;
                self.rcv.buf.truncate(fs.since(head) as usize);
            }
        }
        if data.is_empty() {
            if fin && start.gt(self.rcv.nxt) {
                // An out-of-order FIN is out-of-order data too: a duplicate ACK at
                // once (RFC 5681 §4.2).
                self.ack.dupacks_owed += 1;
                self.stats.rx_ooo_segments += 1;
            }
            return;
        }
        if start == self.rcv.nxt {
            self.receive_in_order(data);
        } else {
            self.receive_out_of_order(start, data, wire_segs);
        }
    }

    /// Linux's `tcp_grow_window` for a data segment of `len` bytes (at least 128):
    /// the window clamp grows by twice the larger of our MSS and the segment, up
    /// to the receive space.
    fn grow_rcv_ssthresh(&mut self, len: usize) {
        if self.rcv.ssthresh == u32::MAX || len < 128 {
            return;
        }
        let limit = self.rcv_limit().min(u32::MAX as usize / 2) as u32;
        let room = limit.saturating_sub(self.rcv.ssthresh);
        let incr = (2 * u32::from(self.cfg.mss)).max(2 * len as u32);
        self.rcv.ssthresh += room.min(incr);
    }

    /// Counters, the peer's segment size and the receiver's RTT (for autotuning) from
    /// a segment carrying data.
    fn note_peer_segment(&mut self, seg: &Segment) {
        let payload = seg.payload;
        self.stats.rx_data_segments += u64::from(seg.wire_segments());
        let wire_segment = match seg.gso_size {
            0 => payload.len() as u32,
            g => u32::from(g).min(payload.len() as u32),
        };
        self.rcv.mss = self.rcv.mss.max(wire_segment).min(65535);
        self.grow_rcv_ssthresh(payload.len());
        if self.ts.ok {
            if let Some((_, ecr)) = seg.options.timestamps {
                if let Some(ms) = self.ts.echo_ms(ecr, self.now) {
                    let r = Duration::from_millis(u64::from(ms.max(1)));
                    self.rcv.rtt = Some(self.rcv.rtt.map_or(r, |p| p.min(r)));
                }
            }
        }
    }

    /// Data at RCV.NXT: append it, pull in what it joins from the out-of-order
    /// ranges, and decide when to acknowledge.
    fn receive_in_order(&mut self, data: Payload) {
        let had_ooo = !self.rcv.ooo.is_empty();
        let direct = self.deliver_to_sink(&data);
        let n = match direct {
            Some(n) => n,
            None => {
                let off = self.rcv.buf.len();
                let n = self.rcv.buf.write_payload(off, data);
                self.rcv.buf.commit(n);
                n
            }
        };
        self.rcv.nxt = self.rcv.nxt + n;
        if let Some(n) = direct {
            self.after_app_read(n);
        }
        let mut got = n as u64;
        while let Some(e) = self.rcv.ooo.pop_contiguous(self.rcv.nxt) {
            if e.gt(self.rcv.nxt) {
                let extra = e.since(self.rcv.nxt);
                self.rcv.buf.commit(extra as usize);
                self.rcv.nxt = e;
                got += u64::from(extra);
            }
        }
        self.stats.rx_bytes += got;
        if had_ooo {
            // A hole was filled: tell the sender at once (RFC 5681 §4.2).
            self.ack.pending = true;
            return;
        }
        // Quick-ack at first; then an ACK for every second full segment (never fewer,
        // so a bulk sender is never throttled), a lone one within `delayed_ack`.
        self.ack.unacked_bytes += n as u32;
        self.ack.last_data_rx = Some(self.now);
        self.ack.last_rcv = Some(self.now);
        if self.ack.quickack > 0 && !self.ack.pingpong {
            self.ack.quickack -= 1;
            self.ack.pending = true;
            self.stats.tx_quick_acks += 1;
        } else if self.ack.unacked_bytes >= 2 * self.rcv.mss {
            self.ack.pending = true;
        } else {
            self.timers
                .set_if_idle(Timer::DelayedAck, self.now + self.cfg.delayed_ack);
        }
    }

    /// In-order data straight to the receive sink, when nothing is queued or waits
    /// out of order (the stream stays in order), no urgent byte is pending (it is
    /// taken out of the stream on the way), and the sink has room for all of it.
    fn deliver_to_sink(&mut self, data: &Payload) -> Option<usize> {
        if !self.rcv.buf.is_empty()
            || !self.rcv.ooo.is_empty()
            || self.rcv.urg_seq.is_some()
            || !matches!(self.rcv.buf, RecvBuf::Bytes(_))
        {
            return None;
        }
        let sink = self.rcv.sink.as_mut()?;
        let n = data.len();
        if sink.room() < n {
            return None;
        }
        for c in data.chunks() {
            sink.push(c);
        }
        self.stats.rx_direct_bytes += n as u64;
        Some(n)
    }

    /// Data after a hole: written into the ring at its offset and remembered as a
    /// range (or dropped if the range list is full); a duplicate ACK at once.
    fn receive_out_of_order(&mut self, start: Seq, data: Payload, wire_segs: u32) {
        let off = self.rcv.buf.len() + start.since(self.rcv.nxt) as usize;
        let dend = start + data.len();
        if self.rcv.ooo.covers(start, dend) {
            self.stats.rx_dup_bytes += data.len() as u64;
            if self.opts.sack && self.cfg.dsack {
                self.rcv.dsack = Some((start, dend));
            }
        } else {
            // Only what the buffer took is held: a pool-backed queue stops at its
            // piece limit or at a part that lies in no pool buffer. A range longer
            // than what was placed would count the rest as data once the hole fills.
            // (What was placed beyond a refused range stays where it is, at its
            // offset, and is used when the data arrives again.)
            let n = self.rcv.buf.write_payload(off, data);
            match (n > 0).then(|| self.rcv.ooo.add(start, start + n)) {
                Some(OooAdd::Added) => {
                    self.stats.rx_ooo_segments += u64::from(wire_segs);
                    self.rcv.sack_recent.rotate_right(1);
                    self.rcv.sack_recent[0] = Some(start);
                }
                Some(OooAdd::Duplicate) => {}
                Some(OooAdd::Full) | None => self.stats.rare().rx_ooo_full += 1,
            }
        }
        // Out of order: a duplicate ACK at once, every time (RFC 5681 §4.2); a
        // coalesced frame owes one per wire segment, as they would have. Reordering
        // also brings quick-acks back for a while.
        self.ack.dupacks_owed = (self.ack.dupacks_owed + wire_segs).min(8);
        self.ack.quickack = self.ack.quickack.max(2);
    }

    /// The FIN is next in sequence: take it (RCV.NXT moves past it). Returns whether
    /// it was taken now.
    pub(crate) fn take_fin(&mut self) -> bool {
        match self.rcv.fin_seq {
            Some(fs) if fs == self.rcv.nxt && !self.rcv.fin_received => {
                self.rcv.nxt = self.rcv.nxt + 1u32;
                self.rcv.fin_received = true;
                self.ack.pending = true;
                self.rcv.ooo.clear();
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::super::State;
    use super::*;
    use crate::testing::OwnedSegment;
    use crate::TcpConfig;

    /// `n` full segments of `byte` from the client, not yet delivered.
    fn segments(cli: &mut Connection, n: usize, now: Instant) -> Vec<OwnedSegment> {
        let data: Vec<u8> = (0..n * MSS).map(|i| (i / MSS) as u8).collect();
        assert_eq!(cli.send(&data), data.len());
        let out = drain(cli, now);
        assert_eq!(out.len(), n);
        out
    }

    fn read_all(c: &mut Connection) -> Vec<u8> {
        let mut buf = vec![0u8; 1 << 20];
        let n = c.recv(&mut buf);
        buf.truncate(n);
        buf
    }

    /// A pool-backed queue holds only what lies in pool buffers: an out-of-order
    /// segment it could not keep (here no part has an origin) is not held, so the
    /// hole's filling does not count it as received (`server_session` found the
    /// queue then saying in-order bytes it did not have: acknowledged, never
    /// delivered).
    #[test]
    fn an_out_of_order_segment_a_pool_backed_queue_cannot_keep_is_not_held() {
        use crate::payload::Origin;
        let zc = TcpConfig {
            zero_copy: true,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), zc);
        let now = T0 + ms(1);
        let segs = segments(&mut cli, 3, now);
        let start = srv.rcv.nxt;
        let with_origin = |c: &mut Connection, s: &OwnedSegment, buf: u32| {
            let mut seg = s.segment();
            seg.payload = Payload::with_origin(&s.payload, Origin { buf, off: 0 });
            c.input(now, &seg);
        };
        // The third first, where the queue cannot keep it; then the first two.
        srv.input(now, &segs[2].segment());
        with_origin(&mut srv, &segs[0], 1);
        with_origin(&mut srv, &segs[1], 2);
        assert_eq!(srv.rcv.nxt, start + (2 * MSS) as u32, "only what is held");
        // Sent again, it is kept, and the stream reads whole.
        with_origin(&mut srv, &segs[2], 3);
        assert_eq!(srv.rcv.nxt, start + (3 * MSS) as u32);
        let mut spans = Vec::new();
        let n = srv.recv_spans(usize::MAX, usize::MAX, |s| spans.push(s));
        assert_eq!(n, 3 * MSS);
        let bufs: Vec<u32> = spans.iter().map(|s| s.buf).collect();
        assert_eq!(bufs, vec![1, 2, 3]);
    }

    /// A receive sink whose room the test sets; what it got, shared with the test.
    #[derive(Debug, Clone, Default)]
    struct TestSink(std::sync::Arc<std::sync::Mutex<(Vec<u8>, usize)>>);

    impl RecvSink for TestSink {
        fn room(&self) -> usize {
            self.0.lock().unwrap().1
        }
        fn push(&mut self, chunk: &[u8]) {
            let mut g = self.0.lock().unwrap();
            assert!(chunk.len() <= g.1, "pushed past the room it said");
            g.0.extend_from_slice(chunk);
            g.1 -= chunk.len();
        }
    }

    impl TestSink {
        fn give_room(&self, n: usize) {
            self.0.lock().unwrap().1 += n;
        }
        fn got(&self) -> Vec<u8> {
            self.0.lock().unwrap().0.clone()
        }
    }

    /// A sink takes in-order segments while nothing is queued before them; one it
    /// has no room for is queued, and so is what follows until the queue is read,
    /// so the stream reads in order from the sink then the queue then the sink.
    #[test]
    fn a_receive_sink_takes_in_order_bytes_while_nothing_waits_before_them() {
        let (mut cli, mut srv) = default_pair();
        let sink = TestSink::default();
        sink.give_room(2 * MSS + MSS / 2);
        assert!(srv.set_recv_sink(Some(Box::new(sink.clone()))).is_none());
        let now = T0 + ms(1);
        let segs = segments(&mut cli, 5, now);
        let w0 = srv.rcv_window_available();
        let wake = srv.input(now, &segs[0].segment());
        assert!(wake.readable, "the sink's bytes wake the reader");
        srv.input(now, &segs[1].segment());
        assert_eq!(srv.recv_delivered(), (2 * MSS) as u64);
        assert_eq!(srv.recv_available(), 0);
        assert_eq!(srv.rcv_window_available(), w0, "counted as read");
        // No room for the third: queued; the fourth follows it though room came.
        srv.input(now, &segs[2].segment());
        sink.give_room(10 * MSS);
        srv.input(now, &segs[3].segment());
        assert_eq!(srv.recv_available(), 2 * MSS);
        let queued = read_all(&mut srv);
        srv.input(now, &segs[4].segment());
        assert_eq!(srv.recv_available(), 0);
        let mut stream = sink.got();
        stream.splice(2 * MSS..2 * MSS, queued);
        let want: Vec<u8> = (0..5 * MSS).map(|i| (i / MSS) as u8).collect();
        assert_eq!(stream, want);
        assert_eq!(srv.recv_delivered(), (3 * MSS) as u64);
    }

    /// What arrives out of order is queued, and so is the segment that fills the
    /// hole (the queue holds what follows it); an urgent byte keeps the sink out.
    #[test]
    fn a_receive_sink_leaves_reordered_and_urgent_data_to_the_queue() {
        let (mut cli, mut srv) = default_pair();
        let sink = TestSink::default();
        sink.give_room(1 << 20);
        srv.set_recv_sink(Some(Box::new(sink.clone())));
        let now = T0 + ms(1);
        let segs = segments(&mut cli, 3, now);
        srv.input(now, &segs[1].segment());
        srv.input(now, &segs[0].segment());
        assert_eq!(srv.recv_delivered(), 0);
        assert_eq!(srv.recv_available(), 2 * MSS);
        read_all(&mut srv);
        // Urgent data: the byte is taken out of the stream, which a sink cannot.
        let mut seg = segs[2].clone();
        seg.repr.flags |= usnet_wire::TcpFlags::URG;
        seg.repr.urgent = 10;
        srv.input(now, &seg.segment());
        assert_eq!(srv.recv_delivered(), 0);
        assert!(sink.got().is_empty());
    }

    #[test]
    fn recv_with_hands_out_the_stream_in_order_across_the_ring_wrap() {
        let cfg = TcpConfig {
            recv_buffer: 4 * MSS,
            recv_buffer_initial: 4 * MSS,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), cfg);
        let mut got = Vec::new();
        let mut now = T0;
        let mut sent = 0usize;
        let total = 20 * MSS;
        while got.len() < total {
            let data: Vec<u8> = (sent..total).map(|i| (i % 251) as u8).collect();
            sent += cli.send(&data);
            feed(&mut srv, now, &drain(&mut cli, now));
            // Odd-sized reads make the ring wrap at odd places.
            let n = srv.recv_with(MSS + 7, |chunk| got.extend_from_slice(chunk));
            assert!(n <= MSS + 7);
            feed(&mut cli, now, &drain(&mut srv, now));
            now = now + ms(1);
        }
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    #[test]
    fn send_with_queues_what_the_filler_wrote_and_stops_at_a_short_count() {
        let (mut cli, _) = default_pair();
        let mut next = 0u8;
        let n = cli.send_with(5000, |dst| {
            for b in dst.iter_mut() {
                *b = next;
                next = next.wrapping_add(1);
            }
            dst.len()
        });
        assert_eq!(n, 5000);
        // A filler that writes less than offered ends the append.
        let n = cli.send_with(5000, |dst| dst.len().min(100));
        assert_eq!(n, 100);
        let segs = drain(&mut cli, T0);
        let bytes: Vec<u8> = segs.iter().flat_map(|s| s.payload.clone()).collect();
        assert_eq!(bytes.len(), 5100);
        assert!(bytes[..5000].iter().enumerate().all(|(i, b)| *b == i as u8));
    }

    #[test]
    fn out_of_order_data_waits_for_the_hole_and_is_sacked() {
        let (mut cli, mut srv) = default_pair();
        let segs = segments(&mut cli, 4, T0);
        feed(&mut srv, T0, &segs[2..]);
        assert_eq!(srv.recv_available(), 0);
        let dupacks = drain(&mut srv, T0);
        assert_eq!(
            dupacks.len(),
            2,
            "one duplicate ACK per out-of-order segment"
        );
        let last = &dupacks[1].repr;
        assert_eq!(last.ack, segs[0].repr.seq);
        assert_eq!(
            last.options.sacks(),
            [(segs[2].repr.seq, segs[3].repr.seq + MSS as u32)]
        );
        feed(&mut srv, T0, &segs[1..2]);
        feed(&mut srv, T0, &segs[..1]);
        let acks = drain(&mut srv, T0);
        assert_eq!(acks.last().unwrap().repr.ack, segs[3].repr.seq + MSS as u32);
        assert_eq!(acks.last().unwrap().repr.options.sack_count, 0);
        let got = read_all(&mut srv);
        assert_eq!(got.len(), 4 * MSS);
        assert!(got
            .chunks(MSS)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8)));
        // Segments 2, 3 and then 1 arrived before 0.
        assert_eq!(srv.stats().rx_ooo_segments, 3);
    }

    #[test]
    fn a_duplicate_is_reported_with_a_dsack() {
        let (mut cli, mut srv) = default_pair();
        let segs = segments(&mut cli, 2, T0);
        feed(&mut srv, T0, &segs);
        drain(&mut srv, T0);
        // The first segment again, overlapping nothing new.
        feed(&mut srv, T0, &segs[..1]);
        let ack = drain(&mut srv, T0);
        assert_eq!(ack.len(), 1);
        let s = segs[0].repr.seq;
        assert_eq!(ack[0].repr.options.sacks(), [(s, s + MSS as u32)]);
        assert_eq!(srv.stats().tx_dsack, 1);
        assert_eq!(srv.rcv.dsack, None, "reported once");
        assert_eq!(srv.stats().rx_dup_bytes, MSS as u64);
    }

    #[test]
    fn quick_acks_then_one_ack_per_two_segments_then_the_delayed_ack() {
        let cfg = TcpConfig {
            quickack_segments: 2,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), cfg);
        let segs = segments(&mut cli, 7, T0);
        let mut acks_after = Vec::new();
        for s in &segs {
            feed(&mut srv, T0, std::slice::from_ref(s));
            acks_after.push(drain(&mut srv, T0).len());
        }
        // Two quick-acks, then every second segment.
        assert_eq!(acks_after, [1, 1, 0, 1, 0, 1, 0]);
        assert_eq!(srv.stats().tx_quick_acks, 2);
        let at = srv
            .timers
            .get(Timer::DelayedAck)
            .expect("a lone segment waits");
        assert_eq!(at, T0 + srv.cfg.delayed_ack);
        assert_eq!(drain(&mut srv, at).len(), 1);
        assert_eq!(srv.stats().tx_delayed_acks, 1);
        assert!(!srv.timers.is_armed(Timer::DelayedAck));
    }

    #[test]
    fn data_beyond_the_window_is_cut_off() {
        let scfg = TcpConfig {
            recv_buffer: 4096,
            recv_buffer_initial: 4096,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), scfg);
        // The client believes the window is larger than it is.
        let (wl1, wl2) = (cli.snd.wl1, cli.snd.wl2);
        cli.update_send_window(wl1, wl2, 60_000);
        let segs = segments(&mut cli, 3, T0);
        feed(&mut srv, T0, &segs);
        assert_eq!(srv.recv_available(), 4096);
        assert_eq!(srv.stats().rx_beyond_window_bytes, (3 * MSS - 4096) as u64);
        assert!(srv.ack.pending);
        let ack = drain(&mut srv, T0);
        assert_eq!(ack.last().unwrap().repr.window, 0, "full: a zero window");
    }

    #[test]
    fn reading_opens_the_window_with_an_update() {
        let scfg = TcpConfig {
            recv_buffer: 16 * MSS,
            recv_buffer_initial: 16 * MSS,
            autotune: false,
            window_scaling: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), scfg);
        let segs = segments(&mut cli, 10, T0);
        feed(&mut srv, T0, &segs);
        let acks = drain(&mut srv, T0);
        let closed_to = acks.last().unwrap().repr.window;
        assert_eq!(closed_to as usize, 6 * MSS);
        let read = read_all(&mut srv);
        assert_eq!(read.len(), 10 * MSS);
        assert_eq!(srv.stats().tx_window_updates, 1);
        let update = drain(&mut srv, T0);
        assert_eq!(update.len(), 1);
        assert_eq!(update[0].repr.window as usize, 16 * MSS);
    }

    #[test]
    fn the_advertised_edge_never_moves_back() {
        let (_cli, mut srv) = default_pair();
        let ws = srv.rcv.wscale;
        assert!(ws > 0);
        let promised = srv.rcv.adv;
        // The limit falls below what was promised: the edge stays where it was.
        srv.rcv.space = 1000;
        let (field, right) = srv.window_field(false);
        assert!(right.ge(promised));
        assert_eq!(u32::from(field) << ws, right.since(srv.rcv.nxt));
        // Without the earlier promise the window is what fits, in whole scale units.
        srv.rcv.adv = srv.rcv.nxt;
        let (field, right) = srv.window_field(false);
        assert_eq!(u32::from(field) << ws, (1000 >> ws) << ws);
        assert!(right.lt(promised));
    }

    #[test]
    fn autotuning_grows_the_window_with_what_the_application_reads() {
        let (mut cli, mut srv) = default_pair();
        let initial = srv.rcv.space;
        let mut now = T0;
        for _ in 0..6 {
            cli.send(&vec![0u8; 64 * MSS]);
            let data = drain(&mut cli, now);
            feed(&mut srv, now, &data);
            feed(&mut cli, now, &drain(&mut srv, now));
            now = now + ms(150);
            read_all(&mut srv);
        }
        assert!(srv.rcv.space > initial, "{} <= {initial}", srv.rcv.space);
        assert!(srv.stats().rcv_window_grown > 0);
    }

    #[test]
    fn the_urgent_byte_leaves_the_stream() {
        let (mut cli, mut srv) = default_pair();
        let mut segs = segments(&mut cli, 1, T0);
        // Urgent pointer 10: byte 9 is the out-of-band byte.
        segs[0].repr.flags |= usnet_wire::TcpFlags::URG;
        segs[0].repr.urgent = 10;
        segs[0].payload[9] = b'!';
        feed(&mut srv, T0, &segs);
        assert_eq!(srv.recv_available(), MSS - 1);
        let data = read_all(&mut srv);
        assert_eq!(data.len(), MSS - 1);
        assert!(!data.contains(&b'!'));
        assert_eq!(srv.recv_urgent(), Some(b'!'));
        assert_eq!(srv.recv_urgent(), None);
    }

    #[test]
    fn the_window_clamp_starts_at_64k_and_grows_with_data() {
        let srv_cfg = TcpConfig {
            rcv_ssthresh: true,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), srv_cfg);
        assert_eq!(srv.rcv.ssthresh, 65535);
        assert!(srv.rcv_window_available() <= 65535);
        let segs = segments(&mut cli, 4, T0);
        feed(&mut srv, T0, &segs);
        // Four in-order segments: twice our MSS (the larger) each.
        let grown = 65535 + 4 * 2 * u32::from(srv.cfg.mss);
        assert_eq!(srv.rcv.ssthresh, grown);
        // Off: no clamp.
        let (_, plain) = default_pair();
        assert_eq!(plain.rcv.ssthresh, u32::MAX);
    }

    #[test]
    fn with_the_clamp_a_read_updates_the_window_only_when_it_doubles() {
        let srv_cfg = TcpConfig {
            rcv_ssthresh: true,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), srv_cfg);
        let segs = segments(&mut cli, 2, T0);
        feed(&mut srv, T0, &segs);
        drain(&mut srv, T0);
        // A small read frees little next to the window still offered: no update.
        let mut buf = [0u8; 500];
        assert_eq!(srv.recv(&mut buf), 500);
        assert!(!srv.ack.pending);
    }

    #[test]
    fn a_read_to_the_mark_stops_before_the_urgent_byte() {
        let (mut cli, mut srv) = default_pair();
        let mut segs = segments(&mut cli, 1, T0);
        segs[0].repr.flags |= usnet_wire::TcpFlags::URG;
        segs[0].repr.urgent = 10;
        segs[0].payload[9] = b'!';
        feed(&mut srv, T0, &segs);
        let mut buf = vec![0u8; 2 * MSS];
        assert!(!srv.at_urgent_mark());
        assert_eq!(srv.recv_to_mark(&mut buf), 9);
        // At the mark: nothing more, the urgent byte stays queued.
        assert!(srv.at_urgent_mark());
        assert_eq!(srv.recv_to_mark(&mut buf), 0);
        assert!(srv.at_urgent_mark());
        // An ordinary read takes it out of band and goes on.
        assert_eq!(srv.recv(&mut buf), MSS - 10);
        assert_eq!(srv.recv_urgent(), Some(b'!'));
    }

    #[test]
    fn a_consumer_elsewhere_finds_the_mark_and_takes_the_urgent_byte() {
        // What a stack server does: copy up to the mark, note where it is, take
        // the byte, copy on.
        let (mut cli, mut srv) = default_pair();
        let mut segs = segments(&mut cli, 1, T0);
        segs[0].repr.flags |= usnet_wire::TcpFlags::URG;
        segs[0].repr.urgent = 10;
        segs[0].payload[9] = b'!';
        feed(&mut srv, T0, &segs);
        let mut got = Vec::new();
        assert_eq!(srv.take_urgent_at_mark(), None, "not at the mark yet");
        assert_eq!(
            srv.recv_with_to_mark(usize::MAX, |c| got.extend_from_slice(c)),
            9
        );
        assert_eq!(
            srv.recv_with_to_mark(usize::MAX, |c| got.extend_from_slice(c)),
            0
        );
        assert_eq!(srv.take_urgent_at_mark(), Some(b'!'));
        assert!(!srv.at_urgent_mark());
        assert_eq!(
            srv.recv_with_to_mark(usize::MAX, |c| got.extend_from_slice(c)),
            MSS - 10
        );
        assert_eq!(got.len(), MSS - 1, "every byte but the urgent one, once");
        assert_eq!(srv.recv_urgent(), None, "taken already");
    }

    #[test]
    fn a_fin_out_of_order_is_taken_when_the_hole_fills() {
        let (mut cli, mut srv) = default_pair();
        let segs = segments(&mut cli, 2, T0);
        cli.shutdown_write();
        let fin = drain(&mut cli, T0);
        assert!(fin[0].repr.flags.fin());
        feed(&mut srv, T0, &segs[1..]);
        drain(&mut srv, T0);
        feed(&mut srv, T0, &fin);
        assert_eq!(srv.state(), State::Established);
        assert!(srv.rcv.fin_seq.is_some() && !srv.rcv.fin_received);
        // The FIN beyond the hole is answered at once with a duplicate ACK.
        let dup = drain(&mut srv, T0);
        assert_eq!(dup.len(), 1);
        assert_eq!(dup[0].repr.ack, srv.rcv.nxt.0);
        feed(&mut srv, T0, &segs[..1]);
        assert_eq!(srv.state(), State::CloseWait);
        assert!(!srv.is_eof(), "data first");
        assert_eq!(read_all(&mut srv).len(), 2 * MSS);
        assert!(srv.is_eof());
    }

    #[test]
    fn shut_rd_reads_what_is_queued_then_end_of_stream() {
        let (mut cli, mut srv) = default_pair();
        cli.send(b"queued");
        feed(&mut srv, T0, &drain(&mut cli, T0));
        srv.shutdown_read();
        assert!(!srv.is_eof(), "queued data first");
        let mut b = [0u8; 16];
        assert_eq!(srv.recv(&mut b), 6);
        assert!(srv.is_eof());
        assert_eq!(srv.recv(&mut b), 0);
        // Data arriving later is still taken and acknowledged.
        feed(&mut cli, T0, &drain(&mut srv, T0 + ms(50)));
        cli.send(b"late");
        feed(&mut srv, T0, &drain(&mut cli, T0));
        assert_eq!(srv.recv_available(), 4);
        assert!(!srv.is_eof());
        let ack = drain(&mut srv, T0 + ms(50));
        assert_eq!(ack.last().unwrap().repr.ack, srv.rcv.nxt.0);
        assert_eq!(srv.state(), State::Established, "writing goes on");
    }
}
