//! The sender's scoreboard (RFC 6675): every sent, unacknowledged segment in sequence
//! order with its SACKed/lost marks, and the counters loss recovery and congestion
//! control read on every ACK (`pipe`, SACKed bytes and segments, lost segments).
//! The counters are cached, so every mark goes through a method here that keeps
//! them right; [`Scoreboard::check`] recounts them (the simulation calls it after
//! every step).
//!
//! An entry may stand for several segments, as Linux's TSO buffer (`skb`) does:
//! full-sized segments sent back to back in one pass with the same stamps join the
//! entry before them ([`Scoreboard::join_last`]), so a bulk sender pushes, acknowledges
//! and scans one entry per burst instead of one per segment (each entry is a cache
//! line's worth of stores). An entry is cut where the per-segment rules need it: a
//! SACK block covering part of it (on its segment grid, as Linux's
//! `tcp_match_skb_to_sack`), a retransmission (one segment), a tail loss probe (the
//! last). The counters loss recovery reads are in segments (`segs`), as Linux's
//! `pcount`.

use std::collections::VecDeque;
use std::ops::Index;

use super::rate::TxRate;
use crate::seq::Seq;
use crate::time::Instant;

/// One sent segment on the retransmission queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxSeg {
    pub start: Seq,
    /// End in sequence space (includes the FIN if `fin`).
    pub end: Seq,
    pub fin: bool,
    /// Time of the latest (re)transmission.
    pub sent: Instant,
    /// Transmissions so far (1 = never retransmitted).
    pub xmits: u16,
    /// Order of the latest (re)transmission among the connection's: `sent` is one
    /// instant for everything a poll sends, so RACK breaks ties with this.
    pub order: u64,
    pub sacked: bool,
    /// Marked lost and not yet retransmitted.
    pub lost: bool,
    /// Marked lost in this episode, retransmitted or not, and not SACKed since
    /// (Linux's LOST mark, which its `lost_out` counts).
    pub lost_marked: bool,
    /// Where the piece it was first sent in ends (`conn/tso.rs`; its own end
    /// outside TSO pieces): Linux retransmits what is left of that buffer as one.
    pub piece_end: Seq,
    /// Delivery-rate stamp of the latest transmission (`conn/rate.rs`).
    pub rate: TxRate,
    /// Segments the entry stands for (Linux's `pcount`): 1, or more once later
    /// segments joined it; after a cut, its bytes over `unit`, rounded up.
    pub segs: u32,
    /// Payload of each of its segments (the last may be shorter): where a SACK
    /// block may cut it.
    pub unit: u32,
}

impl TxSeg {
    /// A segment sent for the first time now.
    pub(crate) fn new(start: Seq, end: Seq, fin: bool, sent: Instant) -> Self {
        TxSeg {
            start,
            end,
            fin,
            sent,
            xmits: 1,
            order: 0,
            sacked: false,
            lost: false,
            lost_marked: false,
            piece_end: end,
            rate: TxRate::default(),
            segs: 1,
            unit: end.since(start).saturating_sub(u32::from(fin)).max(1),
        }
    }

    /// Sequence space of its first segment: what a retransmission of it sends.
    pub(crate) fn head_len(&self) -> u32 {
        if self.segs > 1 {
            self.unit.min(self.len())
        } else {
            self.len()
        }
    }

    /// Payload of its largest segment.
    pub(crate) fn seg_payload(&self) -> u32 {
        if self.segs > 1 {
            self.unit
        } else {
            self.data_len()
        }
    }

    /// Sequence space, FIN included.
    pub(crate) fn len(&self) -> u32 {
        self.end.since(self.start)
    }

    /// Payload bytes (the FIN excluded).
    pub(crate) fn data_len(&self) -> u32 {
        self.len() - u32::from(self.fin)
    }
}

/// Sent segments from SND.UNA to SND.NXT, at most a capacity fixed at creation.
#[derive(Debug, Clone)]
pub(crate) struct Scoreboard {
    segs: VecDeque<TxSeg>,
    capacity: usize,
    /// Bytes in flight: neither SACKed nor marked lost (RFC 6675 `pipe`).
    pipe: u32,
    sacked_bytes: u32,
    sacked_segs: u32,
    lost_segs: u32,
    /// Segments of all entries (Linux's `packets_out`).
    segs_out: u32,
    /// The next transmission's [`TxSeg::order`].
    next_order: u64,
}

/// The most payload one entry carries (a TSO frame's, `GSO_MAX_SIZE`).
const MAX_ENTRY_BYTES: u32 = 65536;

impl Index<usize> for Scoreboard {
    type Output = TxSeg;
    fn index(&self, i: usize) -> &TxSeg {
        &self.segs[i]
    }
}

impl Scoreboard {
    /// A scoreboard for a send buffer of `send_buffer` bytes: up to one entry per 256
    /// bytes, 64..65536 entries. The room grows with what is in flight (doubling, a
    /// handful of times in a connection's life) instead of being taken at creation:
    /// a 1 MiB send buffer's 4,096 entries are 130 KiB, which every idle connection
    /// paid (`usnet bench conns`: 139 KB per connection end, against Linux's 4 KB).
    pub(crate) fn new(send_buffer: usize) -> Self {
        let capacity = (send_buffer / 256).clamp(64, 65536);
        Scoreboard {
            segs: VecDeque::new(),
            capacity,
            pipe: 0,
            sacked_bytes: 0,
            sacked_segs: 0,
            lost_segs: 0,
            segs_out: 0,
            next_order: 1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.segs.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }
    /// No new segment may be sent until an ACK frees an entry.
    pub(crate) fn is_full(&self) -> bool {
        self.segs.len() >= self.capacity
    }
    /// Entries that may still be added.
    pub(crate) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.segs.len())
    }
    pub(crate) fn pipe(&self) -> u32 {
        self.pipe
    }
    pub(crate) fn sacked_bytes(&self) -> u32 {
        self.sacked_bytes
    }
    pub(crate) fn sacked_segs(&self) -> u32 {
        self.sacked_segs
    }
    pub(crate) fn lost_segs(&self) -> u32 {
        self.lost_segs
    }
    /// Segments sent and not acknowledged, SACKed ones too (Linux's `packets_out`).
    pub(crate) fn segs_out(&self) -> u32 {
        self.segs_out
    }
    /// Segments marked lost, retransmitted or not, not SACKed (Linux's `lost_out`).
    pub(crate) fn lost_out(&self) -> u32 {
        self.segs
            .iter()
            .filter(|s| s.lost_marked)
            .map(|s| s.segs)
            .sum()
    }
    /// Retransmitted segments still in flight: not SACKed, not marked lost again
    /// (Linux's `retrans_out`, `tcpi_retrans`), in segments of `mss` bytes (a
    /// multi-segment entry counts as Linux's TSO buffer's `pcount`).
    pub(crate) fn retrans_out(&self, mss: u32) -> u32 {
        self.segs
            .iter()
            .filter(|s| s.xmits > 1 && !s.sacked && !s.lost)
            .map(|s| s.data_len().div_ceil(mss.max(1)).max(1))
            .sum()
    }
    /// End of the highest SACKed segment (Linux's forward-most SACKed sequence).
    pub(crate) fn highest_sacked_end(&self) -> Option<Seq> {
        self.segs.iter().rev().find(|s| s.sacked).map(|s| s.end)
    }
    /// Whether a segment still outstanding was sent more than once.
    pub(crate) fn any_retransmitted(&self) -> bool {
        self.segs.iter().any(|s| s.xmits > 1)
    }
    pub(crate) fn front(&self) -> Option<TxSeg> {
        self.segs.front().copied()
    }

    /// Index of the first segment that ends after `seq` (where a SACK block starting
    /// at `seq` can begin to cover segments).
    pub(crate) fn first_ending_after(&self, seq: Seq) -> usize {
        self.segs.partition_point(|s| s.end.le(seq))
    }
    /// Index of the first segment marked lost.
    pub(crate) fn first_lost(&self) -> Option<usize> {
        self.segs.iter().position(|s| s.lost)
    }
    /// Index of the first segment not SACKed.
    pub(crate) fn first_unsacked(&self) -> Option<usize> {
        self.segs.iter().position(|s| !s.sacked)
    }
    /// Index of the last segment not SACKed.
    pub(crate) fn last_unsacked(&self) -> Option<usize> {
        self.segs.iter().rposition(|s| !s.sacked)
    }

    /// A newly sent segment (in flight).
    pub(crate) fn push(&mut self, mut seg: TxSeg) {
        seg.order = self.next_order;
        self.next_order += 1;
        self.pipe += seg.len();
        self.segs_out += seg.segs;
        self.segs.push_back(seg);
    }

    /// A newly sent segment `seg` that continues the last entry joins it as one more
    /// of its segments (true) if that entry is new data sent at the same instant with
    /// the same rate stamp, unmarked, holds only whole segments at least as long as
    /// `seg`, and stays within a TSO frame; with `pieces`, only inside the same TSO
    /// piece. Else false: the caller pushes it.
    pub(crate) fn join_last(&mut self, seg: &TxSeg, pieces: bool) -> bool {
        let Some(last) = self.segs.back_mut() else {
            return false;
        };
        let joins = last.end == seg.start
            && !last.fin
            && !seg.fin
            && last.xmits == 1
            && seg.xmits == 1
            && !(last.sacked || last.lost || last.lost_marked)
            && last.sent == seg.sent
            && last.rate == seg.rate
            && (!pieces || last.piece_end == seg.piece_end)
            && last.data_len() == last.segs * last.unit
            && (1..=last.unit).contains(&seg.data_len())
            && last.data_len() + seg.data_len() <= MAX_ENTRY_BYTES;
        if !joins {
            return false;
        }
        last.end = seg.end;
        if !pieces {
            last.piece_end = seg.end;
        }
        last.segs += 1;
        last.order = self.next_order;
        self.next_order += 1;
        self.pipe += seg.len();
        self.segs_out += 1;
        true
    }

    /// Remove the first segment (cumulatively acknowledged) and its counts.
    pub(crate) fn pop_front(&mut self) -> Option<TxSeg> {
        let s = self.segs.pop_front()?;
        if s.sacked {
            self.sacked_bytes -= s.len();
            self.sacked_segs -= s.segs;
        } else if s.lost {
            self.lost_segs -= s.segs;
        } else {
            self.pipe -= s.len();
        }
        self.segs_out -= s.segs;
        Some(s)
    }

    /// A cumulative ACK inside the first entry: its acknowledged head is gone.
    /// Returns None if nothing was cut, else how many of its segments went (whole
    /// ones: Linux's `tcp_tso_acked`; 0 for an ACK inside a single segment).
    pub(crate) fn trim_front(&mut self, ack: Seq) -> Option<u32> {
        let front = self.segs.front_mut()?;
        if !front.start.lt(ack) || !ack.lt(front.end) {
            return None;
        }
        let cut = ack.since(front.start);
        front.start = ack;
        let segs = front.data_len().div_ceil(front.unit).max(1);
        let gone = front.segs - segs.min(front.segs);
        front.segs -= gone;
        if front.sacked {
            self.sacked_bytes -= cut;
            self.sacked_segs -= gone;
        } else if front.lost {
            self.lost_segs -= gone;
        } else {
            self.pipe -= cut;
        }
        self.segs_out -= gone;
        Some(gone)
    }

    /// Mark segment `i` lost unless it is SACKed or already lost; returns whether it
    /// was newly marked.
    pub(crate) fn mark_lost(&mut self, i: usize) -> bool {
        match self.segs.get_mut(i) {
            Some(s) if !s.sacked && !s.lost => {
                s.lost = true;
                s.lost_marked = true;
                self.pipe -= s.len();
                self.lost_segs += s.segs;
                true
            }
            _ => false,
        }
    }

    /// Mark segment `i` SACKed (it no longer counts as lost or in flight); returns
    /// whether it was newly SACKed.
    pub(crate) fn mark_sacked(&mut self, i: usize) -> bool {
        let Some(s) = self.segs.get_mut(i) else {
            return false;
        };
        if s.sacked {
            return false;
        }
        if s.lost {
            self.lost_segs -= s.segs;
        } else {
            self.pipe -= s.len();
        }
        s.sacked = true;
        s.lost = false;
        s.lost_marked = false;
        self.sacked_bytes += s.len();
        self.sacked_segs += s.segs;
        true
    }

    /// Segment `i` was sent again at `now`: a lost one is in flight again.
    pub(crate) fn retransmitted(&mut self, i: usize, now: Instant) {
        let order = self.next_order;
        let Some(s) = self.segs.get_mut(i) else {
            return;
        };
        self.next_order += 1;
        s.sent = now;
        s.order = order;
        s.xmits = s.xmits.saturating_add(1);
        if s.lost {
            s.lost = false;
            self.lost_segs -= s.segs;
            self.pipe += s.len();
        }
    }

    /// Segment `i` went out again with delivery-rate stamp `rate`.
    pub(crate) fn stamp_rate(&mut self, i: usize, rate: TxRate) {
        if let Some(s) = self.segs.get_mut(i) {
            s.rate = rate;
        }
    }

    /// Cut entry `i` after `head` payload bytes (one segment of it is resent, a SACK
    /// block covers part of it, the MSS shrank); the tail becomes a new entry with
    /// the same marks and keeps the FIN. Each part counts its bytes over the unit,
    /// rounded up, as segments. Nothing happens unless the cut is inside the payload.
    pub(crate) fn split(&mut self, i: usize, head: u32) {
        let Some(s) = self.segs.get_mut(i) else {
            return;
        };
        if head == 0 || head >= s.data_len() {
            return;
        }
        let before = s.segs;
        let mut tail = *s;
        tail.start = s.start + head;
        s.end = tail.start;
        s.fin = false;
        s.segs = head.div_ceil(s.unit).max(1);
        s.unit = s.unit.min(head);
        tail.segs = tail.data_len().div_ceil(tail.unit).max(1);
        tail.unit = tail.unit.min(tail.data_len().max(1));
        let added = s.segs + tail.segs - before;
        if tail.lost {
            self.lost_segs += added;
        } else if tail.sacked {
            self.sacked_segs += added;
        }
        self.segs_out += added;
        self.segs.insert(i + 1, tail);
    }

    /// Forget everything (TIME-WAIT keeps no data).
    pub(crate) fn clear(&mut self) {
        self.segs.clear();
        self.pipe = 0;
        self.sacked_bytes = 0;
        self.sacked_segs = 0;
        self.lost_segs = 0;
        self.segs_out = 0;
    }

    /// Recount: the segments must tile `una..nxt` without gaps and the cached
    /// counters must match.
    pub(crate) fn check(&self, una: Seq, nxt: Seq) -> Result<(), String> {
        let (mut pipe, mut sb, mut ss, mut ls) = (0u32, 0u32, 0u32, 0u32);
        let mut out = 0u32;
        let mut prev = una;
        for s in &self.segs {
            if s.start != prev {
                return Err(format!(
                    "gap in scoreboard at {:?} (prev end {:?})",
                    s.start, prev
                ));
            }
            if s.segs == 0 || s.unit == 0 || s.data_len() > s.segs * s.unit {
                return Err(format!(
                    "entry at {:?}: {} bytes as {} segments of {}",
                    s.start,
                    s.data_len(),
                    s.segs,
                    s.unit
                ));
            }
            prev = s.end;
            out += s.segs;
            if s.sacked {
                sb += s.len();
                ss += s.segs;
            } else if s.lost {
                ls += s.segs;
            } else {
                pipe += s.len();
            }
        }
        if out != self.segs_out {
            return Err(format!("segments: recount {out}, cached {}", self.segs_out));
        }
        if !self.segs.is_empty() && prev != nxt {
            return Err(format!("scoreboard ends at {prev:?}, snd_nxt {nxt:?}"));
        }
        if (pipe, sb, ss, ls)
            != (
                self.pipe,
                self.sacked_bytes,
                self.sacked_segs,
                self.lost_segs,
            )
        {
            return Err(format!(
                "counters: recount pipe {pipe} sacked {sb}/{ss} lost {ls}; cached {} {}/{} {}",
                self.pipe, self.sacked_bytes, self.sacked_segs, self.lost_segs
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Instant = Instant::from_millis(1);

    /// Four 100-byte segments from 1000.
    fn four() -> Scoreboard {
        let mut sb = Scoreboard::new(1 << 20);
        for k in 0..4u32 {
            let start = Seq(1000 + 100 * k);
            sb.push(TxSeg::new(start, start + 100u32, false, T0));
        }
        sb
    }

    fn counts(sb: &Scoreboard) -> (u32, u32, u32, u32) {
        (
            sb.pipe(),
            sb.sacked_bytes(),
            sb.sacked_segs(),
            sb.lost_segs(),
        )
    }

    #[test]
    fn retrans_out_counts_retransmitted_segments_in_flight() {
        let mut sb = four();
        assert_eq!(sb.retrans_out(100), 0);
        sb.mark_lost(0);
        sb.mark_lost(1);
        sb.retransmitted(0, T0);
        sb.retransmitted(1, T0);
        assert_eq!(sb.retrans_out(100), 2);
        // 100 bytes are two segments of 50 (Linux's pcount).
        assert_eq!(sb.retrans_out(50), 4);
        // SACKed, or marked lost again: no longer counted.
        sb.mark_sacked(1);
        assert_eq!(sb.retrans_out(100), 1);
        sb.mark_lost(0);
        assert_eq!(sb.retrans_out(100), 0);
    }

    #[test]
    fn capacity_follows_the_send_buffer() {
        // The room comes with what is in flight: an idle connection holds none.
        assert_eq!(Scoreboard::new(1 << 20).segs.capacity(), 0);
        assert_eq!(Scoreboard::new(0).capacity, 64);
        assert_eq!(Scoreboard::new(1 << 20).capacity, 4096);
        assert_eq!(Scoreboard::new(1 << 30).capacity, 65536);
        let mut sb = Scoreboard::new(0);
        for k in 0..64u32 {
            assert!(!sb.is_full());
            sb.push(TxSeg::new(Seq(k), Seq(k + 1), false, T0));
        }
        assert!(sb.is_full());
    }

    #[test]
    fn marks_move_bytes_between_the_counters() {
        let mut sb = four();
        assert_eq!(counts(&sb), (400, 0, 0, 0));
        assert!(sb.mark_lost(0));
        assert!(!sb.mark_lost(0), "already lost");
        assert_eq!(counts(&sb), (300, 0, 0, 1));
        assert!(sb.mark_sacked(2));
        assert!(!sb.mark_lost(2), "a SACKed segment is never lost");
        assert_eq!(counts(&sb), (200, 100, 1, 1));
        // A lost segment SACKed after all: no longer lost, not in flight either.
        assert!(sb.mark_sacked(0));
        assert!(!sb.mark_sacked(0));
        assert_eq!(counts(&sb), (200, 200, 2, 0));
        assert!(
            !sb.mark_lost(9) && !sb.mark_sacked(9),
            "out of range is ignored"
        );
        sb.check(Seq(1000), Seq(1400)).unwrap();
    }

    #[test]
    fn a_retransmission_puts_a_lost_segment_back_in_flight() {
        let mut sb = four();
        sb.mark_lost(1);
        assert_eq!(sb.first_lost(), Some(1));
        let later = Instant::from_millis(9);
        sb.retransmitted(1, later);
        assert_eq!(counts(&sb), (400, 0, 0, 0));
        assert_eq!((sb[1].xmits, sb[1].sent, sb[1].lost), (2, later, false));
        assert_eq!(sb.first_lost(), None);
    }

    #[test]
    fn cumulative_acks_pop_and_trim() {
        let mut sb = four();
        sb.mark_sacked(1);
        sb.mark_lost(2);
        let s = sb.pop_front().unwrap();
        assert_eq!(s.start, Seq(1000));
        assert_eq!(counts(&sb), (100, 100, 1, 1));
        sb.pop_front();
        sb.pop_front();
        assert_eq!(counts(&sb), (100, 0, 0, 0));
        // An ACK in the middle of the last segment cuts its head off.
        assert_eq!(sb.trim_front(Seq(1300)), None, "nothing before the start");
        assert_eq!(sb.trim_front(Seq(1340)), Some(0), "no whole segment");
        assert_eq!(sb.front().unwrap().start, Seq(1340));
        assert_eq!(counts(&sb), (60, 0, 0, 0));
        sb.check(Seq(1340), Seq(1400)).unwrap();
        assert!(sb.pop_front().is_some() && sb.pop_front().is_none());
        assert_eq!(sb.trim_front(Seq(2000)), None);
    }

    /// Ten 100-byte segments sent in one pass from 1000, joined into one entry.
    fn burst() -> Scoreboard {
        let mut sb = Scoreboard::new(1 << 20);
        for k in 0..10u32 {
            let start = Seq(1000 + 100 * k);
            let seg = TxSeg::new(start, start + 100u32, false, T0);
            if !sb.join_last(&seg, false) {
                sb.push(seg);
            }
        }
        sb
    }

    #[test]
    fn full_segments_of_one_pass_join_one_entry() {
        let sb = burst();
        assert_eq!(sb.len(), 1);
        assert_eq!(
            (sb[0].start, sb[0].end, sb[0].segs, sb[0].unit),
            (Seq(1000), Seq(2000), 10, 100)
        );
        assert_eq!((sb.pipe(), sb.segs_out()), (1000, 10));
        sb.check(Seq(1000), Seq(2000)).unwrap();
        // What does not join: another instant, a longer segment, a FIN, a marked
        // entry, a segment after a short one, another piece.
        let mut sb = burst();
        let later = TxSeg::new(Seq(2000), Seq(2100), false, Instant::from_millis(2));
        assert!(!sb.join_last(&later, false));
        assert!(!sb.join_last(&TxSeg::new(Seq(2000), Seq(2101), false, T0), false));
        assert!(!sb.join_last(&TxSeg::new(Seq(2000), Seq(2101), true, T0), false));
        let short = TxSeg::new(Seq(2000), Seq(2050), false, T0);
        assert!(sb.join_last(&short, false));
        assert!(!sb.join_last(&TxSeg::new(Seq(2050), Seq(2150), false, T0), false));
        let mut piece = TxSeg::new(Seq(2050), Seq(2150), false, T0);
        piece.piece_end = Seq(3000);
        sb.push(piece);
        let mut other = TxSeg::new(Seq(2150), Seq(2250), false, T0);
        other.piece_end = Seq(4000);
        assert!(!sb.join_last(&other, true));
        other.piece_end = Seq(3000);
        assert!(sb.join_last(&other, true));
        sb.mark_lost(1);
        assert!(!sb.join_last(&TxSeg::new(Seq(2250), Seq(2350), false, T0), true));
        sb.check(Seq(1000), Seq(2250)).unwrap();
        // An entry stays within a TSO frame.
        let mut sb = Scoreboard::new(1 << 20);
        sb.push(TxSeg::new(Seq(0), Seq(32768), false, T0));
        assert!(sb.join_last(&TxSeg::new(Seq(32768), Seq(65536), false, T0), false));
        assert!(!sb.join_last(&TxSeg::new(Seq(65536), Seq(65537), false, T0), false));
    }

    #[test]
    fn cutting_a_joined_entry_counts_segments_on_its_grid() {
        let mut sb = burst();
        sb.mark_lost(0);
        assert_eq!(sb.lost_segs(), 10);
        // Cut after three segments, then one more: 3 + 1 + 6, all lost.
        sb.split(0, 300);
        sb.split(1, 100);
        assert_eq!((sb.len(), sb[0].segs, sb[1].segs, sb[2].segs), (3, 3, 1, 6));
        assert_eq!((sb.lost_segs(), sb.segs_out(), sb.pipe()), (10, 10, 0));
        sb.check(Seq(1000), Seq(2000)).unwrap();
        // A cut off the grid (the MSS shrank to 60): the parts round up.
        let mut sb = burst();
        sb.mark_sacked(0);
        sb.split(0, 60);
        assert_eq!(
            (sb[0].segs, sb[0].unit, sb[1].segs, sb[1].unit),
            (1, 60, 10, 100)
        );
        assert_eq!(
            (sb.sacked_segs(), sb.segs_out(), sb.sacked_bytes()),
            (11, 11, 1000)
        );
        sb.check(Seq(1000), Seq(2000)).unwrap();
        // No cut at the ends.
        let mut sb = burst();
        sb.split(0, 0);
        sb.split(0, 1000);
        assert_eq!(sb.len(), 1);
    }

    #[test]
    fn an_ack_inside_a_joined_entry_delivers_its_whole_segments() {
        let mut sb = burst();
        assert_eq!(
            sb.trim_front(Seq(1250)),
            Some(2),
            "two whole, half of the third"
        );
        assert_eq!((sb[0].segs, sb.segs_out(), sb.pipe()), (8, 8, 750));
        assert_eq!(sb.trim_front(Seq(1300)), Some(1));
        assert_eq!(sb.trim_front(Seq(1350)), Some(0));
        sb.check(Seq(1350), Seq(2000)).unwrap();
        assert_eq!(sb.lost_out(), 0);
        sb.mark_lost(0);
        assert_eq!((sb.lost_segs(), sb.lost_out()), (7, 7));
        assert_eq!(sb.trim_front(Seq(1500)), Some(2));
        assert_eq!((sb.lost_segs(), sb.segs_out()), (5, 5));
        sb.check(Seq(1500), Seq(2000)).unwrap();
        let s = sb.pop_front().unwrap();
        assert_eq!((s.segs, sb.lost_segs(), sb.segs_out()), (5, 0, 0));
    }

    #[test]
    fn split_keeps_marks_and_the_fin() {
        let mut sb = Scoreboard::new(1 << 20);
        sb.push(TxSeg::new(Seq(0), Seq(1001), true, T0));
        sb.mark_lost(0);
        sb.split(0, 600);
        assert_eq!(sb.len(), 2);
        assert_eq!(
            (sb[0].start, sb[0].end, sb[0].fin),
            (Seq(0), Seq(600), false)
        );
        assert_eq!(
            (sb[1].start, sb[1].end, sb[1].fin),
            (Seq(600), Seq(1001), true)
        );
        assert_eq!(sb[1].data_len(), 400);
        assert!(sb[0].lost && sb[1].lost);
        assert_eq!(counts(&sb), (0, 0, 0, 2));
        sb.check(Seq(0), Seq(1001)).unwrap();
    }

    #[test]
    fn lookups() {
        let mut sb = four();
        assert_eq!(sb.first_ending_after(Seq(1000)), 0);
        assert_eq!(sb.first_ending_after(Seq(1100)), 1);
        assert_eq!(sb.first_ending_after(Seq(1150)), 1);
        assert_eq!(sb.first_ending_after(Seq(5000)), 4);
        sb.mark_sacked(0);
        sb.mark_sacked(3);
        assert_eq!(sb.first_unsacked(), Some(1));
        assert_eq!(sb.last_unsacked(), Some(2));
    }

    #[test]
    fn check_finds_gaps_and_wrong_counters() {
        let mut sb = four();
        assert!(sb.check(Seq(1000), Seq(1400)).is_ok());
        assert!(sb.check(Seq(999), Seq(1400)).is_err(), "gap at SND.UNA");
        assert!(sb.check(Seq(1000), Seq(1500)).is_err(), "short of SND.NXT");
        sb.pipe += 1;
        assert!(sb.check(Seq(1000), Seq(1400)).is_err(), "counter drift");
        sb.clear();
        assert!(sb.check(Seq(5), Seq(9)).is_ok(), "empty is consistent");
        assert_eq!(counts(&sb), (0, 0, 0, 0));
    }
}
