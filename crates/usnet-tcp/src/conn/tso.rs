//! Linux's TSO pieces ([`TcpConfig::tso_pieces`](crate::TcpConfig), on in the
//! `linux` profile): Linux sends its write queue a buffer (`skb`, a chunk in
//! [`wmem`](super::wmem)'s terms) at a time, each cut to at most the congestion
//! window's room and its TSO size (`tcp_tso_autosize`: about a millisecond at the
//! pacing rate, at least `tcp_min_tso_segs` segments) and to whole segments at the
//! peer's window edge (`tcp_mss_split_point`), and a TSO frame's last segment
//! carries PSH. Where the pieces end is no TCP matter (RFC 9293
//! leaves segmentation and PSH to the sender); it decides where the send buffer's
//! chunks are cut, which applications see through its accounting and `EPOLLOUT`,
//! and where PSH goes. Linux's TSO deferral (`tcp_tso_should_defer`) is not
//! modelled: usnet sends what the windows allow.

use super::Connection;
use crate::seq::Seq;

/// Linux's `sk_gso_max_size` (`GSO_LEGACY_MAX_SIZE`).
const GSO_MAX_SIZE: u64 = 65536;

impl Connection {
    /// The chunk that holds `p`: its end, and whether it is the last one.
    fn chunk_at(&self, p: Seq) -> Option<(Seq, bool)> {
        let i = self.wmem.chunk_index_after(p)?;
        Some((self.wmem.chunk_end(i), i + 1 == self.wmem.chunk_count()))
    }

    /// Linux's `tcp_tso_segs`/`tcp_tso_autosize`: the most segments one piece
    /// carries, a millisecond's worth (1/1024 s) at the pacing rate
    /// (`Connection::pacing_rate`), plus a bonus on short paths, within a
    /// TSO frame and at least `min_tso_segs`.
    pub(crate) fn tso_segs(&self, mss: u32) -> u32 {
        let mut bytes = self.pacing_rate() >> 10;
        if let Some(m) = self.rtt.min_rtt {
            let r = (m.as_micros() as u64) >> 9;
            if r < 32 {
                bytes += GSO_MAX_SIZE >> r;
            }
        }
        let bytes = bytes.min(GSO_MAX_SIZE);
        ((bytes / u64::from(mss.max(1))) as u32).max(self.cfg.min_tso_segs.max(1))
    }

    /// The most new data the segment at SND.NXT may carry: the room left in the
    /// current piece, a new piece being cut from the chunk at SND.NXT when the last
    /// one is used up. `None`: a push of a single piece (`Connection::push_one`)
    /// already sent it. `mss`: a full segment's payload; `unsent`: bytes waiting.
    pub(crate) fn tso_piece(&mut self, mss: usize, unsent: usize) -> Option<usize> {
        let nxt = self.snd.nxt;
        if let Some(end) = self.snd.piece_end {
            if nxt.lt(end) {
                return Some(end.since(nxt) as usize);
            }
            if self.snd.push_one {
                return None;
            }
        }
        let (end, tail) = self.chunk_at(nxt).unwrap_or((nxt + unsent as u32, true));
        let len = end.since(nxt);
        let mss = mss.max(1) as u32;
        let in_flight = self.pipe_est().div_ceil(mss);
        // Linux's `tcp_cwnd_test`: cwnd's room, but at most half of cwnd in one
        // frame, so that at least two are in flight.
        let cwnd_segs = self.cc.cwnd() / mss;
        let quota = cwnd_segs
            .saturating_sub(in_flight)
            .min((cwnd_segs / 2).max(1));
        if len <= mss || quota == 0 {
            // One segment (Nagle's to judge), or cwnd's own check stops it.
            self.snd.piece_end = Some(end);
            self.snd.piece_tso = false;
            return Some(len as usize);
        }
        let window = (self.snd.una + self.snd.wnd).since(nxt);
        if window < len.min(mss) {
            // Not a segment fits the peer's window (Linux's `tcp_snd_wnd_test`):
            // no piece; the window rules decide.
            return Some(len as usize);
        }
        // tcp_mss_split_point: whole segments up to the quota and the TSO size,
        // the window's edge for the last chunk.
        let max_len = mss * quota.min(self.tso_segs(mss));
        let piece = if max_len <= window && !tail {
            max_len
        } else if window < len {
            max_len.min((window / mss * mss).max(mss.min(window)))
        } else {
            max_len.min(len)
        }
        .clamp(1, len);
        self.snd.piece_end = Some(nxt + piece);
        self.snd.piece_tso = piece > mss;
        if piece < len {
            let start = self.data_start_seq();
            self.wmem.cut(nxt + piece, start);
        }
        Some(piece as usize)
    }

    /// Whether the segment that ends at `end` closes a multi-segment piece with
    /// more data queued behind it (or, in a pass in the middle of a write, about to
    /// be): the end of one of Linux's TSO frames, which carries PSH there in any
    /// congestion state, as the suite shows. (At the end of the queued data the
    /// application's push decides.)
    pub(crate) fn tso_piece_ends(&self, end: Seq) -> bool {
        self.cfg.tso_pieces
            && self.snd.piece_tso
            && self.snd.piece_end == Some(end)
            && (end.lt(self.write_end_seq()) || self.snd.push_one)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::TcpConfig;

    fn linuxish() -> TcpConfig {
        TcpConfig {
            tso_pieces: true,
            ..TcpConfig::default()
        }
    }

    #[test]
    fn autosizing_follows_the_pacing_rate_with_a_floor() {
        let (mut cli, _srv) = pair(linuxish(), TcpConfig::default());
        // No RTT yet: as much as a TSO frame holds.
        assert_eq!(cli.tso_segs(1000), 65);
        cli.rtt.srtt = Some(ms(100));
        cli.rtt.min_rtt = Some(ms(100));
        // 2 * 10 segments per 100 ms is 200 kB/s: 195 bytes a millisecond.
        assert_eq!(cli.tso_segs(1000), cli.cfg.min_tso_segs);
        std::sync::Arc::make_mut(&mut cli.cfg).min_tso_segs = 10;
        assert_eq!(cli.tso_segs(1000), 10);
    }

    #[test]
    fn pieces_are_cut_at_the_tso_size_and_carry_psh_at_their_end() {
        let cfg = TcpConfig {
            min_tso_segs: 4,
            ..linuxish()
        };
        let (mut cli, mut srv) = pair_with_rtt(cfg, TcpConfig::default(), ms(20));
        let mss = cli.smss() as usize;
        let t0 = T0 + ms(20);
        assert_eq!(cli.send(&vec![1u8; 10 * mss]), 10 * mss);
        let out1 = drain(&mut cli, t0);
        assert_eq!(out1.len(), 10);
        let t1 = t0 + ms(20);
        cli.send(&vec![2u8; 40 * mss]);
        feed(&mut srv, t1, &out1);
        feed(&mut cli, t1, &drain(&mut srv, t1));
        // cwnd 20 after the initial window; SRTT 20 ms: pieces of the floor, four
        // segments, each ending with PSH.
        let out2 = drain(&mut cli, t1);
        assert_eq!(out2.len(), 20);
        let psh: Vec<usize> = (0..out2.len())
            .filter(|&i| out2[i].repr.flags.psh())
            .collect();
        assert_eq!(psh, vec![3, 7, 11, 15, 19]);
        // Each piece is a chunk of its own in the send buffer's accounting.
        assert!(cli.wmem_queued() as usize >= 50 * mss - 10 * mss + 6 * 1280);
    }

    #[test]
    fn a_piece_takes_at_most_half_of_cwnd_and_a_restart_after_idle_comes_first() {
        let cfg = TcpConfig {
            min_tso_segs: 10,
            slow_start_after_idle: true,
            ..linuxish()
        };
        let (mut cli, mut srv) = pair_with_rtt(cfg, TcpConfig::default(), ms(20));
        let mss = cli.smss() as usize;
        let t0 = T0 + ms(20);
        // The initial window of 10 in two pieces of 5 (tcp_cwnd_test), each
        // ending with PSH (the second as the end of the write).
        cli.send(&vec![1u8; 10 * mss]);
        let out = drain(&mut cli, t0);
        let psh: Vec<usize> = (0..out.len())
            .filter(|&i| out[i].repr.flags.psh())
            .collect();
        assert_eq!((out.len(), psh), (10, vec![4, 9]));
        let t1 = t0 + ms(20);
        feed(&mut srv, t1, &out);
        feed(&mut cli, t1, &drain(&mut srv, t1));
        assert_eq!(cli.cc.cwnd() as usize, 20 * mss);
        // Idle for seconds: the write after it restarts cwnd at the initial window
        // before the first piece is cut, so the piece is half of that.
        let t2 = t1 + ms(3000);
        cli.advance_clock(t2);
        cli.send(&vec![2u8; 20 * mss]);
        assert_eq!(cli.cc.cwnd() as usize, 10 * mss);
        let out = drain(&mut cli, t2);
        assert_eq!(out.len(), 10);
        assert!(out[4].repr.flags.psh() && !out[3].repr.flags.psh());
    }
}
