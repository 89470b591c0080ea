//! The send buffer's limit as Linux keeps it, so that writes, `poll` and `epoll`
//! see the same back-pressure an application sees on Linux (the byte ring in
//! [`send`](super::send) stays the hard cap underneath):
//!
//! - **`sk_sndbuf`** (`SO_SNDBUF` doubled, or `tcp_wmem`'s default grown by
//!   autotuning as `tcp_sndbuf_expand`: twice the congestion window's worth of
//!   worst-case buffers, when an ACK comes while a writer waits and cwnd is not
//!   full) against **`sk_wmem_queued`**: the bytes held plus a fixed cost per
//!   buffered chunk. Linux queues a write in chunks (`skb`s) of its size goal
//!   (the most one TSO frame carries, at most half the largest window the peer
//!   offered); each costs [`CHUNK_OVERHEAD`] besides its bytes, and a chunk is cut
//!   in two where a transmission ends inside it.
//! - **`TCP_NOTSENT_LOWAT`** (or the `tcp_notsent_lowat` sysctl): the most bytes
//!   that may wait unsent.
//!
//! A write fills the last unsent chunk up to the size goal unchecked, and starts a
//! new chunk only while `wmem_queued < sndbuf` and the unsent bytes are below the
//! low-water mark (`sk_stream_memory_free`); when a chunk at the head of the unsent
//! data fills, it goes out before the write goes on (`tcp_push_one`), which is
//! why a write's count depends on what the congestion window lets out meanwhile.
//! The socket is writable while a third of `sndbuf` is free and twice the unsent
//! bytes are below the mark (`sk_stream_is_writeable`); a writer that found no
//! room is woken (once, which is what an edge-triggered `EPOLLOUT` reports) by
//! the ACK that makes it writable again (`tcp_check_space`).

use std::collections::VecDeque;

use super::chrono::Chrono;
use super::{Connection, State};
use crate::seq::Seq;

/// What Linux charges a chunk besides its bytes: the `truesize` of a TCP `skb`
/// whose payload lies in page fragments (a 1 KiB head for the headers and the
/// shared info, and the 256-byte `sk_buff`, on x86-64).
pub const CHUNK_OVERHEAD: u32 = 1280;

/// Linux's `SOCK_MIN_SNDBUF`: room for two minimal buffers.
pub const MIN_SNDBUF: u32 = 2 * (2048 + 256);

/// Linux's largest TSO frame (`GSO_LEGACY_MAX_SIZE`), the size goal's upper bound.
const GSO_MAX_SIZE: u32 = 65536;

/// The `sk_sndbuf` an `SO_SNDBUF` of `value` sets: Linux doubles it (for its
/// bookkeeping overhead) and keeps at least [`MIN_SNDBUF`]; `getsockopt` reports
/// the doubled value.
pub fn sndbuf_for_option(value: i32) -> u32 {
    (i64::from(value.max(0)) * 2).clamp(i64::from(MIN_SNDBUF), i64::from(i32::MAX)) as u32
}

/// The send buffer's limit and accounting.
#[derive(Debug)]
pub(crate) struct Wmem {
    /// `sk_sndbuf`.
    pub sndbuf: u32,
    /// The application set `SO_SNDBUF`: no autotuning (`SOCK_SNDBUF_LOCK`).
    pub locked: bool,
    /// `TCP_NOTSENT_LOWAT`; 0: the configured default.
    pub lowat: u32,
    /// A write found no room (`SOCK_NOSPACE`): the ACK that makes the socket
    /// writable wakes the writer.
    pub nospace: bool,
    /// SND.UNA advanced since the last check for room.
    pub acked: bool,
    /// Where the last push point was marked (Linux's `pushed_seq`): the end of
    /// the last write without `MSG_MORE`, or of the last forced push.
    pub pushed: Seq,
    /// Chunk ends a forced push marked (`tcp_mark_push` in the middle of a write,
    /// when half the peer's largest window went unpushed): the segment that ends
    /// there carries PSH.
    marks: VecDeque<Seq>,
    /// The ends of the chunks from the start of the send buffer on, in order.
    chunks: VecDeque<Seq>,
    /// A piece queued on a zero-copy connection filled the chunk at the head of
    /// the unsent data or marked a forced push: the writer should transmit before
    /// queuing more ([`Connection::take_push_due`]), as [`Connection::send_step`]
    /// says through its return value.
    push_due: bool,
}

impl Wmem {
    pub(crate) fn new(sndbuf: usize, iss: Seq) -> Self {
        Wmem {
            sndbuf: sndbuf.clamp(MIN_SNDBUF as usize, i32::MAX as usize) as u32,
            locked: false,
            lowat: 0,
            nospace: false,
            acked: false,
            pushed: iss,
            marks: VecDeque::new(),
            chunks: VecDeque::new(),
            push_due: false,
        }
    }
}

impl Wmem {
    /// The first chunk that ends after `p` (the one holding `p`).
    pub(crate) fn chunk_index_after(&self, p: Seq) -> Option<usize> {
        let i = self.chunks.partition_point(|e| e.le(p));
        (i < self.chunks.len()).then_some(i)
    }

    pub(crate) fn chunk_end(&self, i: usize) -> Seq {
        self.chunks[i]
    }

    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Cuts the chunk holding `at` in two there (`start`: the buffer's first byte).
    pub(crate) fn cut(&mut self, at: Seq, start: Seq) {
        let i = self.chunks.partition_point(|e| e.le(at));
        if i == self.chunks.len() {
            return;
        }
        let from = if i == 0 { start } else { self.chunks[i - 1] };
        if from.lt(at) {
            self.chunks.insert(i, at);
        }
    }
}

impl Connection {
    /// Sequence number of the send buffer's first byte.
    pub(crate) fn data_start_seq(&self) -> Seq {
        self.data_start()
    }

    /// Sequence number after the send buffer's last byte.
    pub(crate) fn write_end_seq(&self) -> Seq {
        self.write_end()
    }

    /// Our SYN (or SYN-ACK) is not acknowledged yet. SND.UNA at the ISS alone
    /// does not say so: after the SYN and 2^32 - 1 bytes it is there again, but
    /// by then something was delivered (the handshake counts one).
    pub(crate) fn syn_unacked(&self) -> bool {
        self.snd.una == self.snd.iss && self.snd.delivered == 0
    }

    /// Sequence number of the send buffer's first byte.
    fn data_start(&self) -> Seq {
        if self.syn_unacked() {
            self.snd.iss + 1u32
        } else {
            self.snd.una
        }
    }

    /// Sequence number after the send buffer's last byte.
    fn write_end(&self) -> Seq {
        self.data_start() + self.snd.buf.len() as u32
    }

    /// Where the unsent data begins (SND.NXT within the buffer).
    fn unsent_start(&self) -> Seq {
        let start = self.data_start();
        let end = self.write_end();
        if self.snd.nxt.le(start) {
            start
        } else if self.snd.nxt.ge(end) {
            end
        } else {
            self.snd.nxt
        }
    }

    /// Bytes queued but not sent yet.
    pub fn notsent_bytes(&self) -> u32 {
        self.write_end().since(self.unsent_start())
    }

    /// Linux's `sk_wmem_queued`: the bytes held plus [`CHUNK_OVERHEAD`] per chunk.
    pub fn wmem_queued(&self) -> u32 {
        let n = self.wmem.chunks.len() as u32;
        (self.snd.buf.len() as u32).saturating_add(n.saturating_mul(CHUNK_OVERHEAD))
    }

    /// The send buffer's limit (Linux's `sk_sndbuf`, what `SO_SNDBUF` reports).
    pub fn send_buffer_limit(&self) -> u32 {
        self.wmem.sndbuf
    }

    /// `SO_SNDBUF`: the limit is `sndbuf` (already doubled: [`sndbuf_for_option`])
    /// from now on, without autotuning.
    pub fn set_send_buffer_limit(&mut self, sndbuf: u32) {
        self.wmem.sndbuf = sndbuf.max(MIN_SNDBUF);
        self.wmem.locked = true;
    }

    /// `TCP_NOTSENT_LOWAT` as set (0: none set, the configured default applies).
    pub fn notsent_lowat(&self) -> u32 {
        self.wmem.lowat
    }

    /// `TCP_NOTSENT_LOWAT`: at most `lowat` bytes wait unsent (0: the configured
    /// default, [`TcpConfig::notsent_lowat`](crate::TcpConfig)).
    pub fn set_notsent_lowat(&mut self, lowat: u32) {
        self.wmem.lowat = lowat;
    }

    /// The send buffer's limit is one the application (or the configuration)
    /// chose: `SO_SNDBUF` locked it, or a not-sent low-water mark applies. A stack
    /// server then lets the program's writes meet it as Linux's do, instead of
    /// buffering them in its ring first.
    pub fn send_limit_chosen(&self) -> bool {
        self.wmem.locked || self.effective_lowat() != u32::MAX
    }

    fn effective_lowat(&self) -> u32 {
        if self.wmem.lowat != 0 {
            self.wmem.lowat
        } else {
            self.cfg.notsent_lowat
        }
    }

    /// Linux's `sk_stream_memory_free`: a new chunk may start (`wake`: the stricter
    /// test for waking a writer, half the low-water mark).
    fn memory_free(&self, wake: bool) -> bool {
        let notsent = u64::from(self.notsent_bytes()) << u32::from(wake);
        self.wmem_queued() < self.wmem.sndbuf && notsent < u64::from(self.effective_lowat())
    }

    /// Whether the application may write (Linux's `sk_stream_is_writeable`): a
    /// third of the send buffer's limit is free and the unsent bytes are below half
    /// the low-water mark. False once writing is over.
    pub fn is_writable(&self) -> bool {
        if !self.may_send() {
            return false;
        }
        let queued = i64::from(self.wmem_queued());
        i64::from(self.wmem.sndbuf) - queued >= queued / 2 && self.memory_free(true)
    }

    /// A write of at most this many bytes would be taken whole now (a lower
    /// bound of what [`Connection::send_step`]s admit: the unsent tail chunk's
    /// room, then new chunks of the size goal while the queued bytes, with each
    /// chunk's overhead, stay under the limit and the unsent bytes under the
    /// low-water mark; transmissions in between only help). 0 once writing is over.
    pub fn sure_write_room(&self) -> u32 {
        if !self.may_send() {
            return 0;
        }
        let goal = self.size_goal();
        let tail = self.tail_room(goal);
        let queued = u64::from(self.wmem_queued()) + u64::from(tail);
        let notsent = u64::from(self.notsent_bytes()) + u64::from(tail);
        let (limit, lowat) = (
            u64::from(self.wmem.sndbuf),
            u64::from(self.effective_lowat()),
        );
        let step = u64::from(goal) + u64::from(CHUNK_OVERHEAD);
        let mut chunks = 0u64;
        // The k-th new chunk starts while queued + k·step < limit and notsent +
        // k·goal < lowat (k from 0).
        while queued + chunks * step < limit && notsent + chunks * u64::from(goal) < lowat {
            chunks += 1;
            if chunks > 1 << 16 {
                break;
            }
        }
        let room = u64::from(tail) + chunks * u64::from(goal);
        // The byte ring underneath is the hard cap.
        room.min(self.snd.buf.free() as u64)
            .min(u64::from(u32::MAX)) as u32
    }

    /// Linux's size goal: the most one chunk holds, whole segments of the current
    /// MSS up to a TSO frame, at most half the largest window the peer offered.
    pub fn size_goal(&self) -> u32 {
        let mss = self.smss().max(1);
        let max_wnd = self.snd.max_wnd;
        let cutoff = if max_wnd > 536 { max_wnd / 2 } else { max_wnd };
        let mut goal = GSO_MAX_SIZE;
        if cutoff > 0 && goal > cutoff {
            goal = cutoff.max(68);
        }
        (goal / mss * mss).max(mss)
    }

    /// Room left in the last chunk if it is unsent and may take more (not the end
    /// of a record).
    fn tail_room(&self, goal: u32) -> u32 {
        let Some(&end) = self.wmem.chunks.back() else {
            return 0;
        };
        if end != self.write_end() || self.snd.records.back() == Some(&end) {
            return 0;
        }
        let start = self.chunk_start(self.wmem.chunks.len() - 1);
        if start.lt(self.unsent_start()) {
            return 0;
        }
        goal.saturating_sub(end.since(start))
    }

    fn chunk_start(&self, i: usize) -> Seq {
        match i {
            0 => self.data_start(),
            _ => self.wmem.chunks[i - 1],
        }
    }

    /// One step of a write as Linux's `tcp_sendmsg` takes it: fill the last unsent
    /// chunk, or start a new one if the buffer's limit admits it. Returns the bytes
    /// queued and whether the caller should transmit before the next step (a chunk
    /// at the head of the unsent data filled up, or half the peer's largest window
    /// went unpushed: `tcp_push_one`, `forced_push`). `(0, _)`: no room; the
    /// writer is woken when there is (see the module documentation).
    pub fn send_step(&mut self, data: &[u8], more: bool) -> (usize, bool) {
        self.send_step_with(data.len(), more, crate::ring::fill_from(data))
    }

    /// [`Self::send_step`] over the next `avail` bytes of a source that `fill`
    /// copies into the send buffer in order (each call is handed the next part,
    /// returns what it wrote): a caller whose bytes are not one slice (a shared
    /// ring) needs no copy of its own first.
    pub fn send_step_with(
        &mut self,
        avail: usize,
        more: bool,
        fill: impl FnMut(&mut [u8]) -> usize,
    ) -> (usize, bool) {
        if !self.may_send() || avail == 0 {
            return (0, false);
        }
        let goal = self.size_goal();
        let room = self.tail_room(goal) as usize;
        let want = if room > 0 {
            room.min(avail)
        } else if self.memory_free(false) {
            (goal as usize).min(avail)
        } else {
            self.no_space();
            return (0, false);
        };
        let n = self.snd.buf.push_with(want, fill);
        if n == 0 {
            self.no_space();
            return (0, false);
        }
        self.account_written(n);
        self.snd.more = more;
        self.snd.more_pass = more;
        self.chrono_start(Chrono::Busy);
        let last = self.wmem.chunks.len() - 1;
        let start = self.chunk_start(last);
        let end = self.write_end();
        if end.since(start) < goal {
            return (n, false);
        }
        let head = start.le(self.unsent_start());
        let forced = self.mark_forced_push(end);
        (n, head || forced)
    }

    /// A chunk ending at `filled_end` just reached the size goal (Linux's skb):
    /// if half the peer's largest window went unpushed, Linux's `forced_push`
    /// marks it with PSH (`tcp_mark_push`). Returns whether it did.
    fn mark_forced_push(&mut self, filled_end: Seq) -> bool {
        let forced = filled_end.since(self.wmem.pushed) > self.snd.max_wnd / 2;
        if forced {
            self.wmem.pushed = filled_end;
            self.wmem.marks.push_back(filled_end);
        }
        forced
    }

    /// `n` bytes joined a zero-copy connection's queue (pieces, not a ring, so
    /// not through [`Self::send_step`]): the same forced push on a chunk they
    /// filled, the last one if a piece filled several, and the same request to
    /// transmit before the next piece ([`Self::take_push_due`]).
    pub(crate) fn account_piece(&mut self, n: usize) {
        let chunks_before = self.wmem.chunks.len();
        self.account_written(n);
        let Some(last) = self.wmem.chunks.len().checked_sub(1) else {
            return;
        };
        let goal = self.size_goal();
        let end = self.write_end();
        // The chunk these bytes filled: the last one, or the one before it if they
        // began in it and went on into a new one (a new chunk behind one that was
        // already whole, or sent, means they filled nothing).
        let piece_start = end - n as u32;
        let filled = if end.since(self.chunk_start(last)) >= goal {
            Some(last)
        } else if self.wmem.chunks.len() > chunks_before
            && last > 0
            && self.wmem.chunks[last - 1].gt(piece_start)
        {
            Some(last - 1)
        } else {
            None
        };
        if let Some(i) = filled {
            let head = self.chunk_start(i).le(self.unsent_start());
            let forced = self.mark_forced_push(self.wmem.chunks[i]);
            self.wmem.push_due |= head || forced;
        }
    }

    /// Whether the pieces queued since the last call filled the chunk at the head
    /// of the unsent data or marked a forced push: a writer that has more to queue
    /// transmits first ([`Self::push_one`]), so that what the window lets out makes
    /// room (Linux's `tcp_push_one` in the middle of `tcp_sendmsg`).
    pub fn take_push_due(&mut self) -> bool {
        std::mem::take(&mut self.wmem.push_due)
    }

    /// Whether a write may queue anything now: the last chunk has room, or the
    /// buffer's limit admits a new one.
    pub(crate) fn may_queue(&self) -> bool {
        self.tail_room(self.size_goal()) > 0 || self.memory_free(false)
    }

    /// `n` bytes were just appended to the send buffer: they fill the last chunk
    /// (if it is unsent and has room), then new chunks of the size goal.
    pub(crate) fn account_written(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let goal = self.size_goal();
        let end = self.write_end();
        let mut at = end - n as u32;
        // The tail's room as it was before these bytes.
        let room = match self.wmem.chunks.back() {
            Some(&last) if last == at && self.snd.records.back() != Some(&last) => {
                let start = self.chunk_start(self.wmem.chunks.len() - 1);
                if start.lt(self.unsent_start()) {
                    0
                } else {
                    goal.saturating_sub(last.since(start))
                }
            }
            _ => 0,
        };
        if room > 0 {
            let old_end = at;
            at = at + room.min(n as u32);
            if let Some(last) = self.wmem.chunks.back_mut() {
                *last = at;
            }
            // A forced push marked the chunk (Linux's PSH is on the buffer): the mark
            // moves to its new end.
            if let Some(m) = self.wmem.marks.iter_mut().find(|m| **m == old_end) {
                *m = at;
            }
        }
        if at.lt(end) && self.state.is_synchronized() {
            self.restart_after_idle();
        }
        while at.lt(end) {
            at = at + goal.min(end.since(at));
            self.wmem.chunks.push_back(at);
        }
    }

    /// A write found no room: wake the writer when there is.
    pub fn no_space(&mut self) {
        self.wmem.nospace = true;
    }

    /// A write ended (Linux's `tcp_push` at the end of `tcp_sendmsg`): without
    /// `MSG_MORE` its end is a push point.
    pub fn write_done(&mut self, more: bool) {
        // The write's own MSG_MORE holds for its last bytes (a zero-copy write
        // queues its pieces as "more follows" until the last one it expected).
        self.snd.more = more;
        self.snd.more_pass = more;
        if !more {
            self.wmem.pushed = self.write_end();
        }
    }

    /// Whether a forced push marked `end` (see [`Wmem`]'s `marks`).
    pub(crate) fn push_marked(&self, end: Seq) -> bool {
        self.wmem.marks.contains(&end)
    }

    /// Of `n` segments of `seg` bytes from `seq`, the count up to and including
    /// the first whose end a forced push marked, if one is (the marks are in
    /// sequence order: one per chunk end).
    pub(crate) fn first_push_mark_at_segment_end(
        &self,
        seq: Seq,
        seg: usize,
        n: usize,
    ) -> Option<usize> {
        let end = seq + (n * seg) as u32;
        self.wmem
            .marks
            .iter()
            .skip_while(|m| m.le(seq))
            .take_while(|m| m.le(end))
            .map(|m| m.since(seq) as usize)
            .find(|d| d % seg == 0)
            .map(|d| d / seg)
    }

    /// SND.UNA advanced: forget the chunks it acknowledged.
    pub(crate) fn wmem_on_ack(&mut self) {
        let una = self.snd.una;
        while self.wmem.marks.front().is_some_and(|e| e.le(una)) {
            self.wmem.marks.pop_front();
        }
        while self.wmem.chunks.front().is_some_and(|e| e.le(una)) {
            self.wmem.chunks.pop_front();
        }
        self.wmem.acked = true;
    }

    /// After a transmit pass (`sent`: it sent new data): the chunk SND.NXT now
    /// falls inside is cut there (as Linux splits a buffer that went out in part).
    /// A pass that sent everything queued without cwnd stopping it while a writer
    /// waits for room starts the send-buffer limited time (the sender starves for
    /// want of buffer, as Linux's `tcp_cwnd_validate` judges). Then, if an ACK came
    /// while a writer waits, grow the limit (`tcp_sndbuf_expand`, unless locked or
    /// cwnd is full) and wake the writer if it may write again, which ends that
    /// time. Returns whether to wake it.
    pub(crate) fn wmem_after_transmit(&mut self, sent: bool) -> bool {
        if self.snd.buf.is_empty() {
            self.wmem.chunks.clear();
        } else {
            let end = self.write_end();
            while self.wmem.chunks.back().is_some_and(|e| e.gt(end)) {
                self.wmem.chunks.pop_back();
            }
            let (cut, start) = (self.unsent_start(), self.data_start());
            self.wmem.cut(cut, start);
        }
        let cwnd_limited = self.snd.cwnd_blocked || self.pipe_est() >= self.cc.cwnd();
        if sent
            && !cwnd_limited
            && self.wmem.nospace
            && self.notsent_bytes() == 0
            && matches!(self.state, State::Established | State::CloseWait)
        {
            self.chrono_start(Chrono::SndbufLimited);
        }
        if !std::mem::take(&mut self.wmem.acked) || !self.wmem.nospace {
            return false;
        }
        let cwnd_segs = self.cc.cwnd() / self.smss().max(1);
        if !self.wmem.locked && self.scoreboard.segs_out() < cwnd_segs {
            self.expand_sndbuf();
        }
        if self.state == State::Closed || !self.is_writable() {
            return false;
        }
        self.wmem.nospace = false;
        self.chrono_stop(Chrono::SndbufLimited);
        true
    }

    /// Linux's `tcp_sndbuf_expand`: room for twice the congestion window (at
    /// least the initial window, and the reordering degree) of worst-case
    /// buffers, one segment each, up to the configured maximum.
    pub(crate) fn expand_sndbuf(&mut self) {
        let mss = u32::from(self.snd.peer_mss.min(self.cfg.mss)).max(self.smss());
        // The head (MAX_TCP_HEADER and the shared info, 320 bytes each) in a
        // power-of-two allocation, and the sk_buff.
        let per_mss = (mss + 640).next_power_of_two() + 256;
        let cwnd_segs = self.cc.cwnd() / self.smss().max(1);
        let segs = cwnd_segs.max(10).max(self.recovery.reordering + 1);
        let want = u64::from(2 * segs) * u64::from(per_mss);
        let max = self.cfg.send_buffer.min(i32::MAX as usize) as u64;
        if u64::from(self.wmem.sndbuf) < want {
            self.wmem.sndbuf = want.min(max).max(u64::from(self.wmem.sndbuf)) as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::TcpConfig;

    #[test]
    fn so_sndbuf_doubles_with_a_floor() {
        assert_eq!(sndbuf_for_option(21000), 42000);
        assert_eq!(sndbuf_for_option(1), MIN_SNDBUF);
        assert_eq!(sndbuf_for_option(-5), MIN_SNDBUF);
        assert_eq!(sndbuf_for_option(i32::MAX), i32::MAX as u32);
    }

    #[test]
    fn writes_stop_at_the_limit_in_chunks_of_the_size_goal() {
        let cfg = TcpConfig {
            send_buffer: 1 << 20,
            send_buffer_initial: 1 << 20,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg, TcpConfig::default());
        cli.set_send_buffer_limit(42_000);
        let goal = cli.size_goal() as usize;
        let data = vec![7u8; 200_000];
        let mut done = 0;
        loop {
            let (n, _) = cli.send_step(&data[done..], false);
            if n == 0 {
                break;
            }
            done += n;
        }
        // Chunks start while less than the limit is charged: the last one may
        // go past it.
        let chunks = done.div_ceil(goal);
        assert!(done - goal + (chunks - 1) * CHUNK_OVERHEAD as usize <= 42_000);
        assert!(done + chunks * CHUNK_OVERHEAD as usize >= 42_000);
        assert_eq!(
            cli.wmem_queued() as usize,
            done + chunks * CHUNK_OVERHEAD as usize
        );
        assert!(!cli.is_writable());
        assert!(cli.wmem.nospace);
    }

    #[test]
    fn notsent_lowat_limits_unsent_bytes_and_writability() {
        let (mut cli, _srv) = default_pair();
        cli.set_notsent_lowat(4000);
        assert!(cli.is_writable());
        let data = vec![1u8; 100_000];
        let (n, _) = cli.send_step(&data, false);
        assert_eq!(n, cli.size_goal() as usize);
        // Unsent bytes at the mark: no new chunk, not writable.
        assert_eq!(cli.send_step(&data, false).0, 0);
        assert!(!cli.is_writable());
        assert_eq!(cli.notsent_bytes() as usize, n);
        // The configured default applies when the option is 0.
        cli.set_notsent_lowat(0);
        assert!(cli.memory_free(false));
    }

    #[test]
    fn a_write_within_the_sure_room_is_taken_whole() {
        let srv_cfg = TcpConfig {
            recv_buffer: 8192,
            recv_buffer_initial: 8192,
            autotune: false,
            ..TcpConfig::default()
        };
        for (limit, lowat) in [(20_000, 0), (200_000, 0), (50_000, 4000), (9000, 0)] {
            let (mut cli, _srv) = pair(TcpConfig::default(), srv_cfg.clone());
            cli.set_send_buffer_limit(limit);
            cli.set_notsent_lowat(lowat);
            let data = vec![1u8; 300_000];
            let mut done = 0;
            // Twice: from empty, then with what the first write left queued.
            for _ in 0..2 {
                let sure = cli.sure_write_room() as usize;
                let mut took = 0;
                while took < sure {
                    let (n, _) = cli.send_step(&data[..sure - took], false);
                    if n == 0 {
                        break;
                    }
                    took += n;
                }
                assert_eq!(took, sure, "limit {limit} lowat {lowat}: all of {sure}");
                done += took;
            }
            assert!(done > 0 && done < data.len());
        }
    }

    #[test]
    fn an_ack_that_frees_a_third_wakes_the_writer_once() {
        // A small receive window makes small chunks (half of it, whole segments).
        let srv_cfg = TcpConfig {
            recv_buffer: 8192,
            recv_buffer_initial: 8192,
            autotune: false,
            ..TcpConfig::default()
        };
        let (mut cli, mut srv) = pair(TcpConfig::default(), srv_cfg);
        cli.set_send_buffer_limit(20_000);
        let data = vec![1u8; 100_000];
        let mut done = 0;
        while let (n @ 1.., _) = cli.send_step(&data[done..], false) {
            done += n;
        }
        assert!(done < data.len() && !cli.is_writable());
        let mut sink = crate::testing::VecSink::default();
        let w = cli.poll_transmit(T0, &mut sink);
        assert!(!w.writable, "nothing acknowledged yet");
        let out = std::mem::take(&mut sink.segments);
        assert!(!out.is_empty());
        let t1 = T0 + ms(10);
        feed(&mut srv, t1, &out);
        feed(&mut cli, t1, &drain(&mut srv, t1));
        assert!(cli.is_writable());
        let w = cli.poll_transmit(t1, &mut sink);
        assert!(w.writable, "the ACK made the waiting writer writable");
        let w = cli.poll_transmit(t1, &mut sink);
        assert!(!w.writable, "once");
        assert!(cli.send_step(&data[done..], false).0 > 0);
    }

    /// A write as the stack takes it (`Stack::tcp_send_steps`): step by step, a
    /// transmit pass where a step asks for a push and data remains; the segments
    /// sent in all, after the write's own pass.
    fn write_in_steps(cli: &mut Connection, data: &[u8]) -> Vec<crate::testing::OwnedSegment> {
        let mut out = Vec::new();
        let mut done = 0;
        while done < data.len() {
            let (n, push) = cli.send_step(&data[done..], false);
            if n == 0 {
                break;
            }
            done += n;
            if push && done < data.len() {
                cli.push_one();
                out.extend(drain(cli, T0));
            }
        }
        cli.write_done(false);
        out.extend(drain(cli, T0));
        out
    }

    #[test]
    fn a_forced_push_marks_psh_and_a_mid_write_push_does_not() {
        // A 8 KiB receive window: chunks of two segments (half the window, whole
        // segments); a forced push once more than 4 KiB went unpushed.
        let srv_cfg = TcpConfig {
            recv_buffer: 8192,
            recv_buffer_initial: 8192,
            autotune: false,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(TcpConfig::default(), srv_cfg);
        let half = cli.snd.max_wnd / 2;
        let goal = cli.size_goal();
        assert!(
            goal < half && 2 * goal > half,
            "goal {goal}, half window {half}"
        );
        let start = cli.snd.nxt;
        let out = write_in_steps(&mut cli, &vec![5u8; 3 * goal as usize]);
        let psh: Vec<(u32, bool)> = out
            .iter()
            .map(|s| {
                let end = crate::seq::Seq(s.repr.seq) + s.payload.len() as u32;
                (end.since(start), s.repr.flags.psh())
            })
            .collect();
        // The first chunk went out in the middle of the write: no push point. The
        // second ends a forced push; the window stops the third, whose end the
        // write's own push marks.
        let at = |end: u32| psh.iter().find(|p| p.0 == end).map(|p| p.1);
        assert_eq!(at(goal), Some(false), "{psh:?}");
        assert_eq!(at(2 * goal), Some(true), "{psh:?}");
        assert!(psh.iter().filter(|p| p.1).count() <= 2, "{psh:?}");
        assert_eq!(cli.wmem.pushed, start + 3 * goal);
    }

    #[test]
    fn autotuning_grows_the_limit_unless_locked() {
        let cfg = TcpConfig {
            send_buffer: 4 << 20,
            send_buffer_initial: 16_384,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg.clone(), TcpConfig::default());
        let before = cli.send_buffer_limit();
        cli.expand_sndbuf();
        // Ten segments of 1460 bytes, each in a 4 KiB head and an sk_buff.
        assert_eq!(before, 16_384);
        assert_eq!(cli.send_buffer_limit(), 2 * 10 * (4096 + 256));
        let (mut locked, _srv) = pair(cfg, TcpConfig::default());
        locked.set_send_buffer_limit(sndbuf_for_option(5000));
        locked.wmem.nospace = true;
        locked.wmem.acked = true;
        locked.wmem_after_transmit(false);
        assert_eq!(locked.send_buffer_limit(), 10_000);
    }
}
