//! The sender's scoreboard (RFC 6675): every sent, unacknowledged segment in sequence
//! order with its SACKed/lost marks, and the counters loss recovery and congestion
//! control read on every ACK (`pipe`, SACKed bytes and segments, lost segments).
//! The counters are cached, so every mark goes through a method here that keeps
//! them right; [`Scoreboard::check`] recounts them (the simulation calls it after
//! every step).

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
    /// The next transmission's [`TxSeg::order`].
    next_order: u64,
}

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
    /// Segments marked lost, retransmitted or not, not SACKed (Linux's `lost_out`).
    pub(crate) fn lost_out(&self) -> u32 {
        self.segs.iter().filter(|s| s.lost_marked).count() as u32
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
        self.segs.push_back(seg);
    }

    /// Remove the first segment (cumulatively acknowledged) and its counts.
    pub(crate) fn pop_front(&mut self) -> Option<TxSeg> {
        let s = self.segs.pop_front()?;
        if s.sacked {
            self.sacked_bytes -= s.len();
            self.sacked_segs -= 1;
        } else if s.lost {
            self.lost_segs -= 1;
        } else {
            self.pipe -= s.len();
        }
        Some(s)
    }

    /// A cumulative ACK inside the first segment: its acknowledged head is gone.
    /// Returns whether anything was cut.
    pub(crate) fn trim_front(&mut self, ack: Seq) -> bool {
        let Some(front) = self.segs.front_mut() else {
            return false;
        };
        if !front.start.lt(ack) {
            return false;
        }
        let cut = ack.since(front.start);
        front.start = ack;
        if front.sacked {
            self.sacked_bytes -= cut;
        } else if !front.lost {
            self.pipe -= cut;
        }
        true
    }

    /// Mark segment `i` lost unless it is SACKed or already lost; returns whether it
    /// was newly marked.
    pub(crate) fn mark_lost(&mut self, i: usize) -> bool {
        match self.segs.get_mut(i) {
            Some(s) if !s.sacked && !s.lost => {
                s.lost = true;
                s.lost_marked = true;
                self.pipe -= s.len();
                self.lost_segs += 1;
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
            self.lost_segs -= 1;
        } else {
            self.pipe -= s.len();
        }
        s.sacked = true;
        s.lost = false;
        s.lost_marked = false;
        self.sacked_bytes += s.len();
        self.sacked_segs += 1;
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
            self.lost_segs -= 1;
            self.pipe += s.len();
        }
    }

    /// Segment `i` went out again with delivery-rate stamp `rate`.
    pub(crate) fn stamp_rate(&mut self, i: usize, rate: TxRate) {
        if let Some(s) = self.segs.get_mut(i) {
            s.rate = rate;
        }
    }

    /// Cut segment `i` after `head` payload bytes (the MSS shrank); the tail becomes a
    /// new entry with the same marks and keeps the FIN.
    pub(crate) fn split(&mut self, i: usize, head: u32) {
        let Some(s) = self.segs.get_mut(i) else {
            return;
        };
        let mut tail = *s;
        tail.start = s.start + head;
        s.end = tail.start;
        s.fin = false;
        if tail.lost {
            self.lost_segs += 1;
        } else if tail.sacked {
            self.sacked_segs += 1;
        }
        self.segs.insert(i + 1, tail);
    }

    /// Forget everything (TIME-WAIT keeps no data).
    pub(crate) fn clear(&mut self) {
        self.segs.clear();
        self.pipe = 0;
        self.sacked_bytes = 0;
        self.sacked_segs = 0;
        self.lost_segs = 0;
    }

    /// Recount: the segments must tile `una..nxt` without gaps and the cached
    /// counters must match.
    pub(crate) fn check(&self, una: Seq, nxt: Seq) -> Result<(), String> {
        let (mut pipe, mut sb, mut ss, mut ls) = (0u32, 0u32, 0u32, 0u32);
        let mut prev = una;
        for s in &self.segs {
            if s.start != prev {
                return Err(format!(
                    "gap in scoreboard at {:?} (prev end {:?})",
                    s.start, prev
                ));
            }
            prev = s.end;
            if s.sacked {
                sb += s.len();
                ss += 1;
            } else if s.lost {
                ls += 1;
            } else {
                pipe += s.len();
            }
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
        assert!(!sb.trim_front(Seq(1300)), "nothing before the start");
        assert!(sb.trim_front(Seq(1340)));
        assert_eq!(sb.front().unwrap().start, Seq(1340));
        assert_eq!(counts(&sb), (60, 0, 0, 0));
        sb.check(Seq(1340), Seq(1400)).unwrap();
        assert!(sb.pop_front().is_some() && sb.pop_front().is_none());
        assert!(!sb.trim_front(Seq(2000)));
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
