//! The send side: the send buffer and the send sequence variables (RFC 9293 §3.3.1),
//! the peer's window (SND.WND with the SND.WL1/WL2 rule), segmentation (MSS, Nagle
//! with Minshall's refinement, sender SWS avoidance, the congestion window, restart
//! after idle), the FIN, and the persist timer's zero-window probes.

use std::net::SocketAddr;

use usnet_wire::{TcpFlags, TcpOptions, TcpRepr, TCP_HEADER_LEN};

use super::scoreboard::TxSeg;
use super::timers::Timer;
use super::{Connection, SegmentSink, State, TcpError};
use crate::ring::Ring;
use crate::seq::Seq;
use crate::time::Instant;

/// SND.* and the send buffer.
#[derive(Debug)]
pub(crate) struct SendState {
    /// Initial send sequence number.
    pub iss: Seq,
    /// SND.UNA: oldest unacknowledged sequence number; the send buffer starts here.
    pub una: Seq,
    /// SND.UNA before the latest new ACK (how much that ACK acknowledged).
    pub una_before_last_ack: Seq,
    /// SND.NXT.
    pub nxt: Seq,
    /// SND.WND: the peer's window, scaled.
    pub wnd: u32,
    /// Largest window the peer has offered (sender SWS avoidance, the RFC 5961 ACK
    /// check).
    pub max_wnd: u32,
    /// SND.WL1 / SND.WL2: sequence and acknowledgment numbers of the segment that
    /// last updated the window.
    pub wl1: Seq,
    pub wl2: Seq,
    /// The peer's window shift.
    pub wscale: u8,
    /// End of the last small (less than full-sized) segment sent (Minshall's Nagle).
    pub sml: Seq,
    /// Unacknowledged and unsent data, from SND.UNA on.
    pub buf: Ring,
    /// The application shut down writing: a FIN follows the data.
    pub fin_queued: bool,
    pub fin_sent: bool,
    pub fin_acked: bool,
    /// Peer's MSS (payload without options).
    pub peer_mss: u16,
    /// A send was held back by cwnd since the last new ACK (the controller grows the
    /// window only when it limits).
    pub cwnd_blocked: bool,
    /// When a segment last went out (restart after idle).
    pub last_tx: Instant,
    /// Zero-window probes sent without the window opening.
    pub persist_backoff: u32,
    /// The persist timer fired: the next transmit pass probes (or sends what fits).
    pub persist_pending: bool,
}

impl SendState {
    pub(crate) fn new(iss: Seq, send_buffer: usize, remote: SocketAddr, now: Instant) -> Self {
        SendState {
            iss,
            una: iss,
            una_before_last_ack: iss,
            nxt: iss,
            wnd: 0,
            max_wnd: 0,
            wl1: Seq(0),
            wl2: iss,
            wscale: 0,
            sml: iss,
            buf: Ring::new(send_buffer),
            fin_queued: false,
            fin_sent: false,
            fin_acked: false,
            peer_mss: default_peer_mss(remote),
            cwnd_blocked: false,
            last_tx: now,
            persist_backoff: 0,
            persist_pending: false,
        }
    }
}

/// The MSS to assume when the peer sends none (RFC 9293 §3.7.1).
fn default_peer_mss(remote: SocketAddr) -> u16 {
    if remote.is_ipv4() {
        536
    } else {
        1220
    }
}

impl Connection {
    /// Whether `send` may queue data (not after `shutdown_write`/`close`).
    pub fn may_send(&self) -> bool {
        !self.snd.fin_queued
            && matches!(
                self.state,
                State::SynSent | State::SynReceived | State::Established | State::CloseWait
            )
    }

    /// Free space in the send buffer.
    pub fn send_capacity(&self) -> usize {
        if self.may_send() {
            self.snd.buf.free()
        } else {
            0
        }
    }

    /// Queue data; returns how many bytes were accepted (0 when the buffer is full or
    /// sending is no longer allowed). Call `poll_transmit` afterwards.
    pub fn send(&mut self, data: &[u8]) -> usize {
        if !self.may_send() {
            return 0;
        }
        self.snd.buf.push(data)
    }

    /// [`Connection::send`] whose bytes `fill` writes straight into the send ring (up
    /// to `max`, in up to two slices; it returns how many of each it wrote). Returns
    /// the count queued.
    pub fn send_with(&mut self, max: usize, fill: impl FnMut(&mut [u8]) -> usize) -> usize {
        if !self.may_send() {
            return 0;
        }
        self.snd.buf.push_with(max, fill)
    }

    /// Sender MSS: the largest payload without options.
    pub fn snd_mss(&self) -> u32 {
        u32::from(self.snd.peer_mss.min(self.cfg.mss)).max(64)
    }

    /// Effective sender MSS with the options every segment carries (timestamps).
    pub(crate) fn smss(&self) -> u32 {
        self.snd_mss() - if self.ts.ok { 12 } else { 0 }
    }

    /// The peer's MSS option (or the default without one), clamped to 88..65495.
    pub(crate) fn set_peer_mss(&mut self, mss: Option<u16>) {
        let m = mss.unwrap_or_else(|| default_peer_mss(self.remote));
        let clamped = m.clamp(88, 65495);
        if clamped != m {
            self.stats.mss_clamped += 1;
        }
        self.snd.peer_mss = clamped;
    }

    /// Take the window of a segment `seq`/`ack` as SND.WND.
    pub(crate) fn set_send_window(&mut self, seq: Seq, ack: Seq, window: u16) {
        self.snd.wnd = u32::from(window) << self.snd.wscale;
        self.snd.max_wnd = self.snd.max_wnd.max(self.snd.wnd);
        self.snd.wl1 = seq;
        self.snd.wl2 = ack;
    }

    /// The window update of RFC 9293 §3.10.7.4 (fifth check): only a segment newer
    /// than the last update (SND.WL1/WL2) sets SND.WND. An open window stops the
    /// persist timer. Returns whether the window changed.
    pub(crate) fn update_send_window(&mut self, seq: Seq, ack: Seq, window: u16) -> bool {
        if !(self.snd.wl1.lt(seq) || (self.snd.wl1 == seq && self.snd.wl2.le(ack))) {
            return false;
        }
        let old = self.snd.wnd;
        self.set_send_window(seq, ack, window);
        if self.snd.wnd > 0 && self.timers.is_armed(Timer::Persist) {
            self.timers.clear(Timer::Persist);
            self.snd.persist_backoff = 0;
        }
        self.snd.wnd != old
    }

    /// Largest payload a segment with these options may carry.
    pub(crate) fn max_payload(&self, opts: &TcpOptions) -> usize {
        let hl = TcpRepr {
            options: *opts,
            ..TcpRepr::default()
        }
        .header_len();
        (self.snd_mss() as usize + TCP_HEADER_LEN)
            .saturating_sub(hl)
            .max(1)
    }

    /// Send a new segment of data (and/or the FIN) if the windows, Nagle and the
    /// scoreboard allow. `force` ignores Nagle, SWS avoidance and cwnd (window
    /// probes and TLP). None: nothing to send.
    pub(crate) fn send_new_data<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        force: bool,
        blocked_by_window: &mut bool,
    ) -> Option<bool> {
        if self.snd.fin_sent || self.snd.una == self.snd.iss {
            return None;
        }
        let tfo_early = self.state == State::SynReceived && self.syn.tfo_child;
        if !tfo_early
            && !matches!(
                self.state,
                State::Established
                    | State::CloseWait
                    | State::FinWait1
                    | State::LastAck
                    | State::Closing
            )
        {
            return None;
        }
        let off = self.snd.nxt.since(self.snd.una) as usize;
        let unsent = self.snd.buf.len().saturating_sub(off);
        let want_fin = self.snd.fin_queued;
        if unsent == 0 && !want_fin {
            return None;
        }
        if self.scoreboard.is_full() {
            return None;
        }
        let opts = self.segment_options();
        let maxp = self.max_payload(&opts);
        let wnd_end = self.snd.una + self.snd.wnd;
        let win = wnd_end.since(self.snd.nxt) as usize;
        let mut len = unsent.min(maxp).min(win);
        if unsent > 0 && len == 0 {
            *blocked_by_window = true;
            if !(want_fin && unsent == 0) {
                return None;
            }
        }
        if len > 0 && !force {
            let pipe = self.pipe_est();
            let cwnd = self.cc.cwnd();
            let avail = cwnd.saturating_sub(pipe) as usize;
            if avail < len {
                self.snd.cwnd_blocked = true;
                if pipe > 0 && avail < maxp.min(unsent) {
                    return None;
                }
                len = len.min(avail.max(1));
            }
            let full = len >= maxp;
            let all = len == unsent;
            // Nagle with Minshall's refinement (as Linux): a small segment waits only
            // while an earlier small segment is unacknowledged.
            let small_out = self.snd.sml.gt(self.snd.una);
            let nagle_ok = self.cfg.nodelay || !small_out || self.scoreboard.is_empty() || want_fin;
            // Limited by the peer's window rather than by data: sender SWS avoidance
            // (RFC 9293 §3.8.6.2.1) sends a piece only if it is at least half the
            // largest window the peer offered, or if nothing is in flight (no ACK will
            // come to open the window further). Otherwise every window edge would
            // leave a small tail segment behind (and end a GSO frame early).
            let window_limited = len < unsent
                && len == win
                && (2 * len >= self.snd.max_wnd as usize || self.scoreboard.is_empty());
            if !(full || (all && nagle_ok) || window_limited) {
                return None;
            }
        }
        let fin = want_fin && len == unsent;
        if len == 0 && !fin {
            return None;
        }
        // Restart after idle (RFC 5681 §4.1).
        if self.cfg.slow_start_after_idle
            && self.scoreboard.is_empty()
            && self.now.saturating_since(self.snd.last_tx) > self.rtt.rto
        {
            self.cc
                .on_idle_restart(self.cfg.initial_window * self.smss());
        }
        let mut flags = TcpFlags::ACK;
        if fin {
            flags |= TcpFlags::FIN;
        }
        if len > 0 && (len == unsent || fin) {
            flags |= TcpFlags::PSH;
        }
        let seq = self.snd.nxt;
        if !self.emit(sink, flags, seq, off, len, opts) {
            return Some(false);
        }
        let end = seq + len + u32::from(fin);
        self.scoreboard.push(TxSeg::new(seq, end, fin, self.now));
        self.snd.nxt = end;
        if len < maxp {
            self.snd.sml = end;
        }
        if fin {
            self.snd.fin_sent = true;
        }
        if len > 0 {
            self.stats.tx_data_segments += 1;
            self.stats.tx_bytes += len as u64;
        }
        self.timers
            .set_if_idle(Timer::Rto, self.now + self.rto_backed_off());
        if !self.timers.is_armed(Timer::Tlp) {
            self.arm_tlp();
        }
        Some(true)
    }

    /// Persist timer (RFC 9293 §3.8.6.1): data waits, nothing is in flight and the
    /// peer's window stops us, so no ACK will come to open it. The interval is the
    /// RTO, backed off per unanswered probe, within `persist_min..persist_max`.
    pub(crate) fn arm_persist(&mut self) {
        let base = self.rtt.rto.max(self.cfg.persist_min);
        let shift = self.snd.persist_backoff.min(16);
        let d = (base * (1u32 << shift)).min(self.cfg.persist_max);
        self.timers.set_if_idle(Timer::Persist, self.now + d);
    }

    pub(crate) fn on_persist_timer(&mut self) {
        // Window probes that never open the window count like retransmissions
        // (Linux: tcp_retries2, or tcp_orphan_retries once the application has
        // closed), so a silent zero-window peer cannot pin a connection forever.
        let limit = if self.app_closed {
            self.cfg.orphan_retries
        } else {
            self.cfg.max_retries
        };
        if self.snd.persist_backoff >= limit {
            self.stats.persist_timeouts += 1;
            self.enter_closed(Some(TcpError::TimedOut));
            return;
        }
        self.snd.persist_pending = true;
    }

    /// A zero-window probe (Linux style: no data, so probes never count as
    /// retransmissions). False if the sink is full.
    pub(crate) fn send_window_probe<S: SegmentSink + ?Sized>(
        &mut self,
        sink: &mut S,
        blocked_by_window: &mut bool,
    ) -> bool {
        if !self.send_probe(sink) {
            return false;
        }
        self.snd.persist_pending = false;
        self.snd.persist_backoff += 1;
        self.stats.persist_probes += 1;
        *blocked_by_window = true;
        true
    }

    /// A probe the peer must answer with an ACK: `SEQ = SND.UNA − 1`, an old
    /// sequence number, no data (window probes and keepalives).
    pub(crate) fn send_probe<S: SegmentSink + ?Sized>(&mut self, sink: &mut S) -> bool {
        let opts = self.segment_options();
        self.emit(sink, TcpFlags::ACK, self.snd.una - 1u32, 0, 0, opts)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::TcpConfig;

    #[test]
    fn a_write_is_cut_into_full_segments_with_psh_on_the_last() {
        let (mut cli, _srv) = default_pair();
        cli.send(&vec![3u8; 3 * MSS + 100]);
        let out = drain(&mut cli, T0);
        let sizes: Vec<usize> = out.iter().map(|s| s.payload.len()).collect();
        assert_eq!(sizes, [MSS, MSS, MSS, 100]);
        let psh: Vec<bool> = out.iter().map(|s| s.repr.flags.psh()).collect();
        assert_eq!(psh, [false, false, false, true]);
        assert_eq!(cli.snd.nxt.since(cli.snd.una), 3 * MSS as u32 + 100);
    }

    #[test]
    fn the_initial_window_limits_the_first_flight() {
        let (mut cli, _srv) = default_pair();
        cli.send(&vec![3u8; 20 * MSS]);
        let out = drain(&mut cli, T0);
        assert_eq!(out.len(), 10, "RFC 6928 initial window");
        assert!(cli.snd.cwnd_blocked);
    }

    #[test]
    fn nagle_holds_a_second_small_segment_until_the_first_is_acked() {
        let (mut cli, mut srv) = default_pair();
        cli.send(b"first");
        let first = drain(&mut cli, T0);
        assert_eq!(first.len(), 1, "nothing in flight: sent at once");
        cli.send(b"second");
        assert!(
            drain(&mut cli, T0).is_empty(),
            "held: a small segment is out"
        );
        feed(&mut srv, T0, &first);
        feed(&mut cli, T0 + ms(1), &drain(&mut srv, T0));
        let second = drain(&mut cli, T0 + ms(1));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].payload, b"second");
    }

    #[test]
    fn nodelay_sends_small_segments_at_once() {
        let (mut cli, _srv) = default_pair();
        cli.set_nodelay(true);
        cli.send(b"first");
        drain(&mut cli, T0);
        cli.send(b"second");
        assert_eq!(drain(&mut cli, T0).len(), 1);
    }

    #[test]
    fn the_window_is_taken_only_from_newer_segments() {
        let (mut cli, _srv) = default_pair();
        let (wl1, wl2) = (cli.snd.wl1, cli.snd.wl2);
        let wnd = cli.snd.wnd;
        // An older segment (lower SEG.SEQ) does not move the window.
        assert!(!cli.update_send_window(wl1 - 1u32, wl2, 1));
        assert_eq!(cli.snd.wnd, wnd);
        // Same SEG.SEQ, older SEG.ACK: neither.
        assert!(!cli.update_send_window(wl1, wl2 - 1u32, 1));
        // Same SEG.SEQ and SEG.ACK: taken (scaled).
        assert!(cli.update_send_window(wl1, wl2, 1));
        assert_eq!(cli.snd.wnd, 1 << cli.snd.wscale);
        assert_eq!(cli.snd.max_wnd, wnd, "the largest window is remembered");
        assert!(!cli.update_send_window(wl1, wl2, 1), "unchanged");
    }

    #[test]
    fn a_zero_window_is_probed_then_the_probes_give_up() {
        let cfg = TcpConfig {
            max_retries: 3,
            ..TcpConfig::default()
        };
        let (mut cli, _srv) = pair(cfg, TcpConfig::default());
        let (wl1, wl2) = (cli.snd.wl1, cli.snd.wl2);
        cli.update_send_window(wl1, wl2, 0);
        cli.send(b"waiting");
        assert!(drain(&mut cli, T0).is_empty());
        let first = cli.timers.get(Timer::Persist).expect("persist armed");
        assert_eq!(first, T0 + cli.cfg.persist_min);
        let probe = drain(&mut cli, first);
        assert_eq!(probe.len(), 1);
        assert_eq!(probe[0].repr.seq, (cli.snd.una - 1u32).0, "SND.UNA - 1");
        assert!(probe[0].payload.is_empty());
        // Backed off: the next probe waits twice as long.
        let second = cli.timers.get(Timer::Persist).unwrap();
        assert_eq!(second.saturating_since(first), cli.cfg.persist_min * 2);
        let mut now = second;
        while cli.state() != State::Closed {
            drain(&mut cli, now);
            now = cli.poll_at().unwrap_or(now);
        }
        assert_eq!(cli.stats().persist_probes, 3);
        assert_eq!(cli.stats().persist_timeouts, 1);
        assert_eq!(cli.error(), Some(TcpError::TimedOut));
    }

    #[test]
    fn an_opened_window_stops_the_persist_timer() {
        let (mut cli, _srv) = default_pair();
        let (wl1, wl2) = (cli.snd.wl1, cli.snd.wl2);
        cli.update_send_window(wl1, wl2, 0);
        cli.send(b"waiting");
        drain(&mut cli, T0);
        let at = cli.timers.get(Timer::Persist).unwrap();
        drain(&mut cli, at);
        assert_eq!(cli.snd.persist_backoff, 1);
        assert!(cli.update_send_window(wl1, wl2, 100));
        assert!(!cli.timers.is_armed(Timer::Persist));
        assert_eq!(cli.snd.persist_backoff, 0);
        let out = drain(&mut cli, at);
        assert_eq!(out[0].payload, b"waiting");
    }

    #[test]
    fn restart_after_idle_shrinks_the_window_to_the_initial_one() {
        let (mut cli, mut srv) = default_pair();
        // Grow cwnd beyond the initial window with a few acknowledged flights.
        let mut now = T0;
        for _ in 0..3 {
            cli.send(&vec![1u8; 10 * MSS]);
            let data = drain(&mut cli, now);
            feed(&mut srv, now, &data);
            now = now + ms(1);
            feed(&mut cli, now, &drain(&mut srv, now));
        }
        let grown = cli.info().cwnd;
        assert!(grown > 10 * MSS as u32);
        // Idle for longer than the RTO, then a write.
        now = now + cli.rtt.rto + ms(1);
        cli.send(&vec![1u8; 40 * MSS]);
        assert_eq!(drain(&mut cli, now).len(), 10);
        assert_eq!(cli.info().cwnd, 10 * MSS as u32);
    }

    #[test]
    fn no_writes_after_shutdown() {
        let (mut cli, _srv) = default_pair();
        assert!(cli.may_send());
        assert_eq!(cli.send_capacity(), cli.cfg.send_buffer);
        cli.shutdown_write();
        assert!(!cli.may_send());
        assert_eq!(cli.send_capacity(), 0);
        assert_eq!(cli.send(b"late"), 0);
    }

    #[test]
    fn peer_mss_is_clamped_and_defaulted() {
        let (mut cli, _srv) = default_pair();
        cli.set_peer_mss(Some(20));
        assert_eq!(cli.snd.peer_mss, 88);
        assert_eq!(cli.stats().mss_clamped, 1);
        cli.set_peer_mss(None);
        assert_eq!(cli.snd.peer_mss, 536, "IPv4 default");
        assert_eq!(cli.snd_mss(), 536);
    }
}
