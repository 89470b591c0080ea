//! The spin-then-sleep policy of a loop that polls: after its last work it keeps
//! turning for a while (a busy peer usually has the next frame or request within
//! microseconds, and a sleep costs a wake-up on each side), then sleeps on its device
//! or doorbells. Every polling loop in the house (the runtime's poll thread, the stack
//! server's loops, `usnet httpd`, the TCP bench) asks this one.

use std::time::{Duration, Instant};

/// How long a loop keeps polling after its last work.
#[derive(Debug, Clone)]
pub struct SpinWindow {
    spin: Duration,
    /// The first idle pass since the last work (read only on idle passes, so a busy
    /// loop reads no clock for it; the wall clock, as the stack's may be virtual).
    idle_since: Option<Instant>,
}

impl SpinWindow {
    /// `Duration::ZERO`: sleep at the first idle pass; `Duration::MAX`: never sleep.
    pub fn new(spin: Duration) -> SpinWindow {
        SpinWindow {
            spin,
            idle_since: None,
        }
    }

    /// A pass did work: the window opens again at the next idle pass.
    #[inline]
    pub fn worked(&mut self) {
        self.idle_since = None;
    }

    /// An idle pass: whether to keep polling (`true`) or to sleep.
    pub fn keep_polling(&mut self) -> bool {
        if self.spin.is_zero() {
            return false;
        }
        if self.spin == Duration::MAX {
            return true;
        }
        let now = Instant::now();
        now.duration_since(*self.idle_since.get_or_insert(now)) < self.spin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_opens_at_the_first_idle_pass_and_work_reopens_it() {
        let mut w = SpinWindow::new(Duration::from_millis(30));
        assert!(w.keep_polling());
        std::thread::sleep(Duration::from_millis(40));
        assert!(!w.keep_polling(), "past the window");
        assert!(
            !w.keep_polling(),
            "stays closed while idle (after a sleep too)"
        );
        w.worked();
        assert!(w.keep_polling());
        assert!(!SpinWindow::new(Duration::ZERO).keep_polling());
        let mut never = SpinWindow::new(Duration::MAX);
        std::thread::sleep(Duration::from_millis(5));
        assert!(never.keep_polling());
    }
}
