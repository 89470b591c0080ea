//! Where a driver's time comes from: the monotonic clock, or virtual time that its
//! owner moves (simulations, the packetdrill backend).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use usnet_stack::Instant;

/// A source of stack time (nanoseconds since some epoch; never goes back).
pub trait Clock {
    fn now(&self) -> Instant;
}

/// Monotonic time since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    epoch: std::time::Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            epoch: std::time::Instant::now(),
        }
    }

    /// The instant stack time counts from.
    pub fn epoch(&self) -> std::time::Instant {
        self.epoch
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// Virtual time: stands still until its owner moves it. Clones share the time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start: Instant) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.as_nanos())))
    }

    /// Moves the time to `t` (never back).
    pub fn set(&self, t: Instant) {
        self.0.fetch_max(t.as_nanos(), Ordering::AcqRel);
    }

    pub fn advance(&self, d: std::time::Duration) {
        self.0.fetch_add(d.as_nanos() as u64, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.0.load(Ordering::Acquire))
    }
}

/// Either clock, for a loop that is built once and runs on real time in service
/// and on virtual time under a harness (the stack server under packetdrill).
#[derive(Debug, Clone)]
pub enum AnyClock {
    System(SystemClock),
    Manual(ManualClock),
}

impl Clock for AnyClock {
    #[inline]
    fn now(&self) -> Instant {
        match self {
            AnyClock::System(c) => c.now(),
            AnyClock::Manual(c) => c.now(),
        }
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Instant {
        (**self).now()
    }
}
