//! TCP timestamps (RFC 7323): our TSval clock with its keyed per-connection offset
//! (§5.4), TS.Recent and its update rule (§4.3), PAWS (§5.3, with TS.Recent
//! invalidated after 24 days idle, §5.5), and RTT samples from the echo.

use std::time::Duration;

use crate::seq::Seq;
use crate::time::Instant;

/// TS.Recent is only trusted for 24 days of idleness (RFC 7323 §5.5).
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

/// An echo older than this is not a plausible round trip.
const MAX_ECHO_MS: u32 = 60_000;

/// Timestamp state of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Timestamps {
    /// Both sides sent the option in the handshake.
    pub ok: bool,
    /// TS.Recent: the peer's TSval to echo.
    pub recent: u32,
    /// When TS.Recent was last set.
    pub recent_at: Instant,
    /// Keyed offset added to our clock (0 in scripted tests).
    pub offset: u32,
}

/// What PAWS says about a segment's TSval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Paws {
    /// Not older than TS.Recent.
    Fresh,
    /// Older, but TS.Recent had been idle for 24 days: it was replaced.
    RecentExpired,
    /// Older: an old duplicate; drop it (and acknowledge).
    Reject,
}

impl Timestamps {
    pub(crate) fn new(offset: u32, now: Instant) -> Self {
        Timestamps {
            ok: false,
            recent: 0,
            recent_at: now,
            offset,
        }
    }

    /// Our TSval at `now`: milliseconds plus the offset.
    pub(crate) fn clock(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.offset)
    }

    /// `tsval` is later than TS.Recent (modulo 2^32).
    pub(crate) fn newer_than_recent(&self, tsval: u32) -> bool {
        (tsval.wrapping_sub(self.recent) as i32) > 0
    }

    /// Take the peer's TSval as TS.Recent.
    pub(crate) fn set_recent(&mut self, tsval: u32, now: Instant) {
        self.recent = tsval;
        self.recent_at = now;
    }

    /// PAWS (RFC 7323 §5.3 R1, with §5.5's idle expiry).
    pub(crate) fn paws(&mut self, tsval: u32, now: Instant) -> Paws {
        if (tsval.wrapping_sub(self.recent) as i32) >= 0 {
            return Paws::Fresh;
        }
        if now.saturating_since(self.recent_at) > PAWS_IDLE {
            self.set_recent(tsval, now);
            Paws::RecentExpired
        } else {
            Paws::Reject
        }
    }

    /// RFC 7323 §4.3: TS.Recent follows a segment whose TSval is not older and that
    /// starts at or before what our last ACK acknowledged (`last_ack_sent`).
    pub(crate) fn update_recent(&mut self, tsval: u32, seq: Seq, last_ack_sent: Seq, now: Instant) {
        if (tsval.wrapping_sub(self.recent) as i32) >= 0 && seq.le(last_ack_sent) {
            self.set_recent(tsval, now);
        }
    }

    /// Milliseconds since we sent the TSval the peer echoes in `ecr`, if plausible
    /// (0 is no echo, and more than a minute is a stale or forged one).
    pub(crate) fn echo_ms(&self, ecr: u32, now: Instant) -> Option<u32> {
        let ms = self.clock(now).wrapping_sub(ecr);
        (ecr != 0 && ms < MAX_ECHO_MS).then_some(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_milliseconds_plus_the_offset() {
        let ts = Timestamps::new(u32::MAX, Instant::ZERO);
        assert_eq!(ts.clock(Instant::from_millis(5)), 4, "wraps");
        assert_eq!(ts.echo_ms(4, Instant::from_millis(25)), Some(20));
        assert_eq!(ts.echo_ms(0, Instant::from_millis(25)), None, "no echo");
        // An echo "from the future" or a minute old is implausible.
        assert_eq!(ts.echo_ms(100, Instant::from_millis(25)), None);
        assert_eq!(ts.echo_ms(4, Instant::from_millis(60_005)), None);
    }

    #[test]
    fn paws_rejects_older_timestamps_until_recent_is_stale() {
        let t0 = Instant::from_millis(10);
        let mut ts = Timestamps::new(0, t0);
        ts.set_recent(1000, t0);
        assert_eq!(ts.paws(1000, t0), Paws::Fresh);
        assert_eq!(ts.paws(1001, t0), Paws::Fresh);
        assert_eq!(ts.paws(999, t0), Paws::Reject);
        assert_eq!(ts.recent, 1000, "a rejected segment changes nothing");
        // Across the 2^32 wrap, "older" is modular.
        ts.set_recent(u32::MAX - 5, t0);
        assert_eq!(ts.paws(3, t0), Paws::Fresh);
        assert_eq!(ts.paws(u32::MAX - 6, t0), Paws::Reject);
        // After 24 days of silence TS.Recent is no longer trusted.
        let later = t0 + PAWS_IDLE + Duration::from_secs(1);
        assert_eq!(ts.paws(7, later), Paws::Fresh);
        assert_eq!(ts.paws(u32::MAX - 6, later), Paws::RecentExpired);
        assert_eq!((ts.recent, ts.recent_at), (u32::MAX - 6, later));
    }

    #[test]
    fn recent_follows_only_segments_up_to_the_last_ack() {
        let t0 = Instant::from_millis(10);
        let t1 = Instant::from_millis(20);
        let mut ts = Timestamps::new(0, t0);
        ts.set_recent(500, t0);
        // Beyond what we acknowledged (out of order): TS.Recent stays.
        ts.update_recent(600, Seq(2000), Seq(1000), t1);
        assert_eq!(ts.recent, 500);
        ts.update_recent(600, Seq(1000), Seq(1000), t1);
        assert_eq!((ts.recent, ts.recent_at), (600, t1));
        // Never backwards.
        ts.update_recent(550, Seq(900), Seq(1000), t1);
        assert_eq!(ts.recent, 600);
        assert!(ts.newer_than_recent(601) && !ts.newer_than_recent(600));
    }
}
