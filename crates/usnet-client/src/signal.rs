//! Signals whose handler ran on this thread, so that a blocking call can end with
//! `EINTR` as the kernel's would. The LD_PRELOAD shim's signal trampoline calls
//! [`note`]; nothing else does, so without the shim no wait is ever cut short.

use std::cell::Cell;

thread_local! {
    /// (handlers run, handlers run without SA_RESTART) on this thread.
    static SEEN: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Called by a signal handler on the thread the signal interrupted; `restart` says
/// whether the handler was installed with SA_RESTART. Only touches this thread's
/// counters (async-signal-safe).
pub fn note(restart: bool) {
    SEEN.with(|c| {
        let (any, unrestarted) = c.get();
        c.set((any + 1, unrestarted + u64::from(!restart)));
    });
}

/// Where this thread's counters stand, to compare with later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark((u64, u64));

pub fn mark() -> Mark {
    Mark(SEEN.with(Cell::get))
}

/// Whether a handler ran since `m` that ends a call: any handler for a call the kernel
/// never restarts (poll, epoll_wait, select), one without SA_RESTART for the socket
/// calls the kernel restarts (accept, connect, recv, send).
pub fn interrupted_since(m: Mark, restartable: bool) -> bool {
    let now = SEEN.with(Cell::get);
    if restartable {
        now.1 != m.0 .1
    } else {
        now.0 != m.0 .0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_only_hides_handlers_with_sa_restart() {
        let m = mark();
        assert!(!interrupted_since(m, true) && !interrupted_since(m, false));
        note(true);
        assert!(!interrupted_since(m, true));
        assert!(interrupted_since(m, false));
        note(false);
        assert!(interrupted_since(m, true));
        // Another thread's signals are not this thread's.
        let m2 = mark();
        std::thread::spawn(|| note(false)).join().unwrap();
        assert!(!interrupted_since(m2, false));
    }
}
