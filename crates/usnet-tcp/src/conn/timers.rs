//! The connection's timers as one table: every deadline lives in [`Timers`], so
//! `poll_at` is one minimum over the table and expiry is one dispatch `match` in
//! [`Connection::run_timers`]. What each timer does on expiry lives with its mechanism
//! (recovery, send side, receive side, state machine).

use super::Connection;
use crate::time::Instant;

/// Every timer a connection runs. The declaration order is the order in which
/// expired timers are handled within one `poll_transmit`: the close timer first (it
/// may end the connection and clear the others), the RTO before RACK and TLP (an RTO
/// cancels both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// TIME-WAIT end (2MSL), the orphaned FIN-WAIT-2 timeout, or the linger deadline.
    Close,
    /// Retransmission timeout (RFC 6298); in SYN-SENT/SYN-RECEIVED the SYN or SYN-ACK
    /// retransmission, which also bounds the connect attempt.
    Rto,
    /// RACK reordering timer (RFC 8985 §6.2 step 5).
    Reorder,
    /// Tail loss probe (RFC 8985 §7).
    Tlp,
    /// Delayed ACK (RFC 9293 §3.8.6.3).
    DelayedAck,
    /// Persist timer: zero-window probe (RFC 9293 §3.8.6.1).
    Persist,
    /// Keepalive probe (RFC 9293 §3.8.4).
    Keepalive,
    /// The paced sender's next departure time (`conn/pacing.rs`): nothing to do on
    /// expiry but to let `poll_transmit` send.
    Pace,
}

impl Timer {
    const COUNT: usize = 8;

    /// Every timer, in expiry-handling order.
    pub(crate) const ALL: [Timer; Timer::COUNT] = [
        Timer::Close,
        Timer::Rto,
        Timer::Reorder,
        Timer::Tlp,
        Timer::DelayedAck,
        Timer::Persist,
        Timer::Keepalive,
        Timer::Pace,
    ];
}

/// One optional deadline per [`Timer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Timers {
    deadlines: [Option<Instant>; Timer::COUNT],
}

impl Timers {
    /// Arm `timer` for `at` (replacing an earlier deadline).
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    /// Arm `timer` for `at`, or disarm it when `at` is None.
    pub(crate) fn set_or_clear(&mut self, timer: Timer, at: Option<Instant>) {
        self.deadlines[timer as usize] = at;
    }

    /// Arm `timer` for `at` unless it is already armed.
    pub(crate) fn set_if_idle(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize].get_or_insert(at);
    }

    /// Disarm `timer`.
    pub(crate) fn clear(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    /// Disarm every timer.
    pub(crate) fn clear_all(&mut self) {
        self.deadlines = [None; Timer::COUNT];
    }

    /// The deadline of `timer`, if armed.
    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    /// Whether `timer` is armed.
    pub(crate) fn is_armed(&self, timer: Timer) -> bool {
        self.deadlines[timer as usize].is_some()
    }

    /// The earliest deadline of all.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// If `timer` is armed and due at `now`, disarm it and return true.
    pub(crate) fn take_expired(&mut self, timer: Timer, now: Instant) -> bool {
        let slot = &mut self.deadlines[timer as usize];
        if slot.is_some_and(|at| at <= now) {
            *slot = None;
            true
        } else {
            false
        }
    }
}

impl Connection {
    /// Handle every expired timer, in [`Timer::ALL`] order. A timer is checked when
    /// its turn comes, so one that an earlier handler disarmed does not fire.
    pub(crate) fn run_timers(&mut self) {
        for timer in Timer::ALL {
            if self.timers.take_expired(timer, self.now) {
                self.on_timer(timer);
            }
        }
    }

    fn on_timer(&mut self, timer: Timer) {
        match timer {
            Timer::Close => self.on_close_timer(),
            Timer::Rto => self.on_rto_timer(),
            Timer::Reorder => self.on_reorder_timer(),
            Timer::Tlp => self.on_tlp_timer(),
            Timer::DelayedAck => self.on_delayed_ack_timer(),
            Timer::Persist => self.on_persist_timer(),
            Timer::Keepalive => self.on_keepalive_timer(),
            Timer::Pace => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn next_is_the_earliest_armed_deadline() {
        let mut timers = Timers::default();
        assert_eq!(timers.next(), None);
        timers.set(Timer::Keepalive, t(500));
        timers.set(Timer::Rto, t(200));
        timers.set(Timer::DelayedAck, t(40));
        assert_eq!(timers.next(), Some(t(40)));
        timers.clear(Timer::DelayedAck);
        assert_eq!(timers.next(), Some(t(200)));
        // Re-arming replaces, it does not keep the earlier deadline.
        timers.set(Timer::Rto, t(900));
        assert_eq!(timers.next(), Some(t(500)));
        timers.clear_all();
        assert_eq!(timers.next(), None);
    }

    #[test]
    fn take_expired_fires_once_and_only_when_due() {
        let mut timers = Timers::default();
        timers.set(Timer::Persist, t(100));
        assert!(!timers.take_expired(Timer::Persist, t(99)));
        assert!(timers.is_armed(Timer::Persist));
        assert!(timers.take_expired(Timer::Persist, t(100)));
        assert!(!timers.is_armed(Timer::Persist));
        assert!(!timers.take_expired(Timer::Persist, t(1000)), "fires once");
        assert!(!timers.take_expired(Timer::Tlp, t(1000)), "never armed");
    }

    #[test]
    fn set_if_idle_keeps_an_armed_deadline() {
        let mut timers = Timers::default();
        timers.set_if_idle(Timer::Rto, t(300));
        timers.set_if_idle(Timer::Rto, t(100));
        assert_eq!(timers.get(Timer::Rto), Some(t(300)));
        timers.set_or_clear(Timer::Rto, None);
        assert_eq!(timers.get(Timer::Rto), None);
        timers.set_or_clear(Timer::Rto, Some(t(7)));
        assert_eq!(timers.get(Timer::Rto), Some(t(7)));
    }

    #[test]
    fn every_timer_has_its_own_slot() {
        let mut timers = Timers::default();
        for (i, timer) in Timer::ALL.into_iter().enumerate() {
            timers.set(timer, t(10 + i as u64));
        }
        for (i, timer) in Timer::ALL.into_iter().enumerate() {
            assert_eq!(timers.get(timer), Some(t(10 + i as u64)), "{timer:?}");
        }
    }
}
