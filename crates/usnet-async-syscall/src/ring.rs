//! The request ring: a shared request area with the document's
//! `syscall_info` entries, a submission queue (SQ) and a completion queue
//! (CQ) of entry indices, futex waiting and the exit protocol.
//!
//! # Roles
//! * **Requester** (one process; any number of its threads): takes free
//!   entries from a private free list, fills them, moves them NONE → HASCALL,
//!   pushes their indices to the SQ; reaps completions from the CQ
//!   (COMPLETED → NONE) and returns entries to the free list.
//! * **Exec threads** (any number, in any process that maps the area): pop
//!   indices from the SQ, move HASCALL → EXECUTING, run the handler, store
//!   `ret`, move EXECUTING → COMPLETED, push the index to the CQ.
//!
//! Neither side scans the entry array: the SQ/CQ carry exactly the indices
//! that changed hands.
//!
//! # Trust
//! Nothing read from the area is trusted: indices are range-checked, every
//! state transition is a compare-and-swap from the one state it may start
//! from (so an entry pushed twice still runs once), completions are matched
//! against a private in-flight table, queue loops are bounded. Violations
//! are counted in [`ErrorCounts`] (in private memory) and never cause
//! undefined behaviour.
//!
//! # Waiting and the lost wake-up argument
//! Both directions use the same protocol on a `layout::WaitWord` `{seq,
//! waiters}` (the "needs wakeup" flag is `waiters != 0`). It is
//! `usnet_shm::doorbell::Gate`, the one implementation every shared-memory
//! user in usnet runs; loom checks it here through the model futex in
//! `sync.rs`:
//!
//! ```text
//! waiter                                   waker
//! s = seq.load(Acquire)                    publish item (cell store, Release)
//! waiters.fetch_add(1)                     fence(SeqCst)              (F2)
//! fence(SeqCst)                  (F1)      if waiters.load() != 0 {
//! if item visible: waiters -= 1; return        seq.fetch_add(1)
//! futex_wait(seq, s)                           futex_wake(seq)
//! waiters -= 1                             }
//! ```
//!
//! F1 and F2 are both in the single total order S of SeqCst operations. If
//! F1 precedes F2, the waker's load of `waiters` (after F2) sees the
//! increment (before F1), so it bumps `seq` and wakes: the waiter either
//! reads a changed `seq` in futex_wait (which compares and enqueues
//! atomically under the futex bucket lock) and returns at once, or it is
//! already queued and is woken. If F2 precedes F1, the waiter's re-check
//! (after F1) sees the published cell (before F2) and it does not sleep.
//! Either way no wake-up is lost. Dropping either fence reintroduces the
//! store-buffer reordering (x86 lets the `waiters` load pass the cell
//! store) that caused liburing's SQPOLL need-wakeup bug, where the
//! submitter read a stale "poller awake" flag after writing the SQ tail.
//!
//! The exit protocol uses the same shape on the control word: a submitter
//! pushes, fences, and re-reads `ctl`; an exec thread that has seen exit
//! fences before its final "queue empty" check. So either the exec thread
//! sees the late submission, or the submitter sees the exit and cancels its
//! own stranded request (see [`Ring::cancel_pending`]).

use crate::layout::{ctl, state, Geometry};
use crate::queue::{OwnedQueue, Queue};
use crate::shm::{Entry, Region, WaitRef};
use crate::sync::{fence, spin_hint, AtomicU32, AtomicU64, Futex};
use std::sync::atomic::AtomicU64 as StatU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use usnet_shm::doorbell::Gate;

/// Longest single futex sleep when the caller has no deadline: waits are
/// sliced (every waiting loop re-checks), so nothing sleeps unbounded.
const IDLE_SLICE: Duration = Duration::from_secs(1);

/// Errors of ring operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the ring is exiting; no new requests")]
    Exiting,
    #[error("no free entries")]
    Full,
    #[error("timed out")]
    TimedOut,
    #[error("nothing in flight")]
    Idle,
    #[error("ring exited and nothing is left in flight")]
    Closed,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("protocol violation by the peer: {0}")]
    Protocol(&'static str),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One request as the requester submits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Call {
    pub num: u32,
    pub args: [u64; 6],
    /// Returned with the completion; kept in private memory, never shared.
    pub user_data: u64,
}

/// One request as an exec thread sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub index: u32,
    pub num: u32,
    pub args: [u64; 6],
}

/// A reaped completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub user_data: u64,
    /// Handler result; `-ECANCELED` if cancelled by exit, `-EPROTO` if the
    /// peer broke the state machine for this entry.
    pub result: i64,
}

/// How [`Ring::exit`] treats queued requests not yet started. Requests
/// already EXECUTING always run to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitMode {
    /// Exec threads run everything already queued, then return.
    Drain,
    /// Queued requests complete with `-ECANCELED` without running.
    Cancel,
}

/// Spin-then-sleep policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Longest spin before sleeping on the futex. `ZERO`: sleep at once;
    /// `Duration::MAX`: spin forever (never sleep; latency benchmarks).
    pub max_spin: Duration,
    /// Adapt the spin budget: double it after a spin that found work, halve
    /// it after one that did not (between `max_spin / 64` and `max_spin`).
    pub adaptive: bool,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            max_spin: Duration::from_micros(50),
            adaptive: true,
        }
    }
}

impl WaitPolicy {
    pub const SLEEP: WaitPolicy = WaitPolicy {
        max_spin: Duration::ZERO,
        adaptive: false,
    };
    pub const SPIN: WaitPolicy = WaitPolicy {
        max_spin: Duration::MAX,
        adaptive: false,
    };
}

/// Options for [`Ring::exec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecOptions {
    /// Requests claimed per SQ pop (1..=64). 1 spreads work best over
    /// several exec threads; larger batches cut per-request overhead.
    pub batch: usize,
    pub wait: WaitPolicy,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            batch: 1,
            wait: WaitPolicy::default(),
        }
    }
}

/// What one exec loop did before returning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecStats {
    pub executed: u64,
    pub cancelled: u64,
}

/// Protocol violations seen by this process (private memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounts {
    /// Entry index out of range (SQ or CQ).
    pub bad_index: u64,
    /// A known state, but not the one the transition starts from.
    pub bad_state: u64,
    /// A state value outside NONE..=COMPLETED.
    pub unknown_state: u64,
    /// A completion for an entry this requester has not got in flight.
    pub bad_completion: u64,
    /// SQ/CQ positions and cells inconsistent (bounded loop gave up, or a
    /// queue that cannot be full with a correct peer was full).
    pub queue_corrupt: u64,
}

impl ErrorCounts {
    pub fn total(&self) -> u64 {
        self.bad_index
            + self.bad_state
            + self.unknown_state
            + self.bad_completion
            + self.queue_corrupt
    }
}

#[derive(Default)]
struct Counters {
    bad_index: StatU64,
    bad_state: StatU64,
    unknown_state: StatU64,
    bad_completion: StatU64,
    queue_corrupt: StatU64,
}

struct Inner {
    region: Region,
    n: u32,
    sq_futex: Futex,
    cq_futex: Futex,
    // Requester-private state.
    free: OwnedQueue,
    inflight: Box<[AtomicU32]>,
    user_data: Box<[AtomicU64]>,
    in_flight: AtomicU32,
    wait: WaitPolicy,
    errors: Counters,
}

/// A handle to a request ring (cheap to clone; `Send + Sync`).
#[derive(Clone)]
pub struct Ring {
    inner: Arc<Inner>,
}

/// Adaptive spinner state, one per waiting loop.
struct Spinner {
    limit: Duration,
    policy: WaitPolicy,
}

impl Spinner {
    fn new(policy: WaitPolicy) -> Spinner {
        Spinner {
            limit: policy.max_spin,
            policy,
        }
    }

    /// Spin until `ready` or the budget is used; true if ready.
    fn spin(&mut self, ready: &dyn Fn() -> bool) -> bool {
        if self.limit.is_zero() || cfg!(loom) {
            return false;
        }
        let start = Instant::now();
        loop {
            for _ in 0..32 {
                if ready() {
                    if self.policy.adaptive {
                        self.limit = (self.limit * 2).min(self.policy.max_spin);
                    }
                    return true;
                }
                spin_hint();
            }
            if self.limit == Duration::MAX {
                // Spin forever, but let a peer that shares our CPU run now
                // and then (an oversubscribed machine would otherwise burn
                // whole time slices on both sides).
                if start.elapsed() >= Duration::from_micros(200) {
                    std::thread::yield_now();
                    return false;
                }
            } else if start.elapsed() >= self.limit {
                if self.policy.adaptive {
                    self.limit = (self.limit / 2).max(self.policy.max_spin / 64);
                }
                return false;
            }
        }
    }
}

/// Bounded backoff for queues that look full only transiently: spin, then
/// yield, and give up after [`Backoff::LIMIT`] (a peer that holds a cell
/// that long is treated as broken).
struct Backoff {
    tries: u32,
    start: Option<Instant>,
}

impl Backoff {
    const LIMIT: Duration = Duration::from_secs(2);

    fn new() -> Backoff {
        Backoff {
            tries: 0,
            start: None,
        }
    }

    /// Wait a little; false once the limit is reached.
    fn snooze(&mut self) -> bool {
        self.tries += 1;
        if self.tries < 64 {
            spin_hint();
            return true;
        }
        if cfg!(loom) {
            return self.tries < 1000 && {
                spin_hint();
                true
            };
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        if self.tries & 255 == 0 && start.elapsed() > Self::LIMIT {
            return false;
        }
        std::thread::yield_now();
        true
    }
}

fn stat(c: &StatU64) {
    c.fetch_add(1, Relaxed);
}

impl Ring {
    /// Create a ring with `nentries` entries (a power of two, 1..=65536) in a
    /// fresh sealed memfd. The creator usually is the requester.
    pub fn new(nentries: u32) -> Result<Ring, Error> {
        Ring::with_policy(nentries, WaitPolicy::default())
    }

    /// [`Ring::new`] with the requester's wait policy.
    pub fn with_policy(nentries: u32, wait: WaitPolicy) -> Result<Ring, Error> {
        let geo = Geometry::new(nentries).ok_or(Error::Invalid(
            "nentries must be a power of two in 1..=65536",
        ))?;
        Ok(Ring::from_region(Region::create(geo)?, wait))
    }

    /// Attach to a ring created by another process (validates the area).
    #[cfg(not(loom))]
    pub fn from_fd(fd: std::os::fd::OwnedFd, wait: WaitPolicy) -> Result<Ring, Error> {
        Ok(Ring::from_region(Region::attach(fd)?, wait))
    }

    /// The memfd backing the area (pass it to another process to share).
    #[cfg(not(loom))]
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.region.fd()
    }

    fn from_region(region: Region, wait: WaitPolicy) -> Ring {
        let n = region.geometry().nentries;
        Ring {
            inner: Arc::new(Inner {
                region,
                n,
                sq_futex: Futex::default(),
                cq_futex: Futex::default(),
                free: OwnedQueue::full_of_indices(n),
                inflight: (0..n).map(|_| AtomicU32::new(0)).collect(),
                user_data: (0..n).map(|_| AtomicU64::new(0)).collect(),
                in_flight: AtomicU32::new(0),
                wait,
                errors: Counters::default(),
            }),
        }
    }

    /// Number of entries.
    pub fn capacity(&self) -> u32 {
        self.inner.n
    }

    /// Requests submitted by this requester and not yet reaped.
    pub fn in_flight(&self) -> u32 {
        self.inner.in_flight.load(Acquire)
    }

    /// Protocol violations counted by this process.
    pub fn errors(&self) -> ErrorCounts {
        let e = &self.inner.errors;
        ErrorCounts {
            bad_index: e.bad_index.load(Relaxed),
            bad_state: e.bad_state.load(Relaxed),
            unknown_state: e.unknown_state.load(Relaxed),
            bad_completion: e.bad_completion.load(Relaxed),
            queue_corrupt: e.queue_corrupt.load(Relaxed),
        }
    }

    /// Completions posted (or being posted) and not yet reaped, from the CQ
    /// positions: a hint for pollers (untrusted, may be off transiently).
    pub fn completions_hint(&self) -> u32 {
        let r = self.region();
        r.cq_tail()
            .load(Acquire)
            .wrapping_sub(r.cq_head().load(Relaxed))
            .min(self.inner.n)
    }

    /// True once [`Ring::exit`] was called (by any party).
    pub fn is_exiting(&self) -> bool {
        self.region().ctl().load(Acquire) != ctl::RUNNING
    }

    fn region(&self) -> &Region {
        &self.inner.region
    }

    /// Entry `i`; callers range-check `i < n` first.
    fn entry(&self, i: u32) -> Entry<'_> {
        self.inner.region.entry(i)
    }

    fn sq(&self) -> Queue<'_> {
        let r = self.region();
        Queue {
            cells: r.sq(),
            head: r.sq_head(),
            tail: r.sq_tail(),
            mask: self.inner.n - 1,
        }
    }

    fn cq(&self) -> Queue<'_> {
        let r = self.region();
        Queue {
            cells: r.cq(),
            head: r.cq_head(),
            tail: r.cq_tail(),
            mask: self.inner.n - 1,
        }
    }

    fn count_state(&self, s: u32) {
        if s > state::COMPLETED {
            stat(&self.inner.errors.unknown_state);
        } else {
            stat(&self.inner.errors.bad_state);
        }
    }

    // ----------------------------------------------------------------- waiting

    /// Wake sleepers on `ww` if any announced themselves (waker half of the
    /// protocol in the module docs; the caller published before calling).
    fn notify(&self, ww: WaitRef<'_>, fx: &Futex, n: u32) {
        Gate::with_futex(ww.seq, ww.waiters, fx).notify(n);
    }

    /// Waiter half: spin, then announce and sleep unless `ready`. Returns
    /// after `ready` was seen, a wake-up, or the timeout; callers loop.
    fn wait_on(
        &self,
        ww: WaitRef<'_>,
        fx: &Futex,
        spin: &mut Spinner,
        ready: &dyn Fn() -> bool,
        timeout: Option<Duration>,
    ) {
        if spin.spin(ready) || spin.limit == Duration::MAX {
            return; // ready, or spin-only policy (the caller re-checks)
        }
        let gate = Gate::with_futex(ww.seq, ww.waiters, fx);
        let s = gate.seq();
        // Announce, fence (F1), re-check, sleep. Without a deadline of the
        // caller's the sleep is sliced; every caller loops and re-checks.
        gate.sleep(s, ready, timeout.unwrap_or(IDLE_SLICE));
    }

    // --------------------------------------------------------------- requester

    /// Submit one request (see [`Ring::submit_batch`]).
    pub fn submit(&self, call: &Call) -> Result<(), Error> {
        self.submit_batch(std::slice::from_ref(call)).map(|_| ())
    }

    /// Submit a batch: one SQ reservation and at most one wake-up per 64
    /// calls. Returns how many were submitted (a prefix of `calls`; fewer
    /// than asked when entries run out). `Err(Full)` if none could be.
    pub fn submit_batch(&self, calls: &[Call]) -> Result<usize, Error> {
        if calls.is_empty() {
            return Ok(0);
        }
        if self.is_exiting() {
            return Err(Error::Exiting);
        }
        let inner = &*self.inner;
        let mut total = 0usize;
        let mut idx = [0u32; 64];
        for chunk in calls.chunks(64) {
            let n = inner.free.view().pop(&mut idx[..chunk.len()]).unwrap_or(0);
            if n == 0 {
                break;
            }
            for (i, c) in idx[..n].iter().zip(chunk) {
                let e = self.entry(*i);
                e.num.store(c.num, Relaxed);
                for (a, v) in e.arg.iter().zip(c.args) {
                    a.store(v, Relaxed);
                }
                e.ret.store(0, Relaxed);
                inner.user_data[*i as usize].store(c.user_data, Relaxed);
                inner.inflight[*i as usize].store(1, Relaxed);
                // NONE -> HASCALL. The requester owns NONE entries; anything
                // else means the peer scribbled on a free entry.
                let old = e.state.swap(state::HASCALL, Release);
                if old != state::NONE {
                    self.count_state(old);
                }
            }
            inner.in_flight.fetch_add(n as u32, AcqRel);
            // The SQ has room for every entry, but a consumer preempted
            // between claiming a cell and releasing it makes the queue look
            // full for a while: back off and retry, within a time bound.
            let mut pushed = 0;
            let mut b = Backoff::new();
            while pushed < n {
                match self.sq().push(&idx[pushed..n]) {
                    Ok(k) if k > 0 => pushed += k,
                    Ok(_) if b.snooze() => {}
                    _ => break,
                }
            }
            if pushed < n {
                // Only a corrupted queue stays full that long. Roll back.
                stat(&inner.errors.queue_corrupt);
                for &i in &idx[pushed..n] {
                    self.entry(i).state.store(state::NONE, Relaxed);
                    inner.inflight[i as usize].store(0, Relaxed);
                }
                let _ = inner.free.view().push(&idx[pushed..n]);
                inner.in_flight.fetch_sub((n - pushed) as u32, AcqRel);
            }
            total += pushed;
            if pushed > 0 {
                self.notify(self.region().sq_wait(), &inner.sq_futex, pushed as u32);
                // Exit race (module docs): the fence in notify orders our push
                // before this load. If exit already began, the exec threads
                // may have made their final empty check: cancel what is still
                // queued ourselves (whoever pops an index completes it).
                if self.region().ctl().load(SeqCst) != ctl::RUNNING {
                    self.cancel_pending();
                }
            }
            if pushed < chunk.len() {
                break;
            }
        }
        if total == 0 {
            return Err(Error::Full);
        }
        Ok(total)
    }

    /// Reap one entry index popped from the CQ.
    fn reap(&self, idx: u32) -> Option<Completion> {
        let inner = &*self.inner;
        if idx >= inner.n {
            stat(&inner.errors.bad_index);
            return None;
        }
        if inner.inflight[idx as usize].swap(0, AcqRel) != 1 {
            stat(&inner.errors.bad_completion);
            return None;
        }
        let e = self.entry(idx);
        let result = match e
            .state
            .compare_exchange(state::COMPLETED, state::NONE, Acquire, Relaxed)
        {
            // Acquire pairs with the exec thread's EXECUTING -> COMPLETED
            // release: `ret` is the value it stored.
            Ok(_) => e.ret.load(Relaxed),
            Err(s) => {
                self.count_state(s);
                e.state.store(state::NONE, Relaxed);
                -(libc::EPROTO as i64)
            }
        };
        let user_data = inner.user_data[idx as usize].load(Relaxed);
        let _ = inner.free.view().push(&[idx]);
        inner.in_flight.fetch_sub(1, AcqRel);
        Some(Completion { user_data, result })
    }

    /// Reap up to `max` available completions into `out` without waiting.
    pub fn poll_batch(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut got = 0;
        let mut idx = [0u32; 64];
        while got < max {
            let want = (max - got).min(64);
            let n = match self.cq().pop(&mut idx[..want]) {
                Ok(n) => n,
                Err(_) => {
                    stat(&self.inner.errors.queue_corrupt);
                    0
                }
            };
            if n == 0 {
                break;
            }
            for &i in &idx[..n] {
                if let Some(c) = self.reap(i) {
                    out.push(c);
                    got += 1;
                }
            }
        }
        got
    }

    /// Reap one completion if available (completion polling).
    pub fn poll(&self) -> Option<Completion> {
        let mut idx = [0u32; 1];
        loop {
            match self.cq().pop(&mut idx) {
                Ok(1) => {
                    if let Some(c) = self.reap(idx[0]) {
                        return Some(c);
                    }
                }
                Ok(_) => return None,
                Err(_) => {
                    stat(&self.inner.errors.queue_corrupt);
                    return None;
                }
            }
        }
    }

    fn wait_cq(&self, spin: &mut Spinner, timeout: Option<Duration>) {
        let cq = self.cq();
        let ready = || cq.maybe_nonempty() || (self.is_exiting() && self.in_flight() == 0);
        self.wait_on(
            self.region().cq_wait(),
            &self.inner.cq_futex,
            spin,
            &ready,
            timeout,
        );
    }

    /// Wait until at least `min` completions were reaped into `out` (also
    /// reaps any others available). Errors: `Idle` if nothing is in flight
    /// and nothing to reap, `Closed` likewise after exit, `TimedOut`.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        min: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        self.wait_max(out, min, usize::MAX, timeout)
    }

    /// [`Ring::wait`] reaping at most `max` (>= `min`) completions.
    pub fn wait_max(
        &self,
        out: &mut Vec<Completion>,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, Error> {
        let max = max.max(min);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut spin = Spinner::new(self.inner.wait);
        let mut got = 0;
        loop {
            got += self.poll_batch(out, max - got);
            if got >= min {
                return Ok(got);
            }
            if self.in_flight() == 0 {
                return Err(if self.is_exiting() {
                    Error::Closed
                } else {
                    Error::Idle
                });
            }
            let left = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(Error::TimedOut);
                    }
                    Some(d - now)
                }
                None => None,
            };
            self.wait_cq(&mut spin, left);
        }
    }

    /// Wait for one request to complete and reap it.
    pub fn wait_one(&self, timeout: Option<Duration>) -> Result<Completion, Error> {
        if let Some(c) = self.poll() {
            return Ok(c);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut spin = Spinner::new(self.inner.wait);
        loop {
            if let Some(c) = self.poll() {
                return Ok(c);
            }
            if self.in_flight() == 0 {
                return Err(if self.is_exiting() {
                    Error::Closed
                } else {
                    Error::Idle
                });
            }
            let left = match deadline {
                Some(d) => Some(
                    d.checked_duration_since(Instant::now())
                        .ok_or(Error::TimedOut)?,
                ),
                None => None,
            };
            self.wait_cq(&mut spin, left);
        }
    }

    /// The document's `wakeup`: wake sleeping exec threads, then wait until
    /// at least one request has completed; reaps everything available into
    /// `out` and returns the count.
    pub fn wakeup(&self, out: &mut Vec<Completion>) -> Result<usize, Error> {
        self.wakeup_max(out, usize::MAX)
    }

    /// [`Ring::wakeup`] reaping at most `max` (>= 1) completions.
    pub fn wakeup_max(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize, Error> {
        self.notify(self.region().sq_wait(), &self.inner.sq_futex, u32::MAX);
        self.wait_max(out, 1, max, None)
    }

    // -------------------------------------------------------------------- exec

    /// Run one claimed index; returns it if it must be posted to the CQ.
    fn exec_one(
        &self,
        idx: u32,
        cancel: bool,
        handler: &mut dyn FnMut(&Request) -> i64,
        st: &mut ExecStats,
    ) -> Option<u32> {
        if idx >= self.inner.n {
            stat(&self.inner.errors.bad_index);
            return None;
        }
        let e = self.entry(idx);
        // HASCALL -> EXECUTING: exactly one exec thread wins, so a request
        // runs at most once even if its index was queued twice. Acquire pairs
        // with the requester's release of HASCALL (arguments visible).
        if let Err(s) = e
            .state
            .compare_exchange(state::HASCALL, state::EXECUTING, Acquire, Relaxed)
        {
            self.count_state(s);
            return None;
        }
        let req = Request {
            index: idx,
            num: e.num.load(Relaxed),
            args: std::array::from_fn(|i| e.arg[i].load(Relaxed)),
        };
        let ret = if cancel {
            st.cancelled += 1;
            -(libc::ECANCELED as i64)
        } else {
            st.executed += 1;
            handler(&req)
        };
        e.ret.store(ret, Relaxed);
        // EXECUTING -> COMPLETED, release: `ret` visible to the reaper.
        if let Err(s) =
            e.state
                .compare_exchange(state::EXECUTING, state::COMPLETED, Release, Relaxed)
        {
            self.count_state(s);
            return None;
        }
        Some(idx)
    }

    fn post(&self, done: &[u32]) {
        if done.is_empty() {
            return;
        }
        let mut off = 0;
        let mut b = Backoff::new();
        while off < done.len() {
            match self.cq().push(&done[off..]) {
                Ok(k) if k > 0 => off += k,
                // Never full for long with a correct requester (every entry
                // is in the CQ at most once; a reaper preempted between its
                // claim and its release can hold one cell): back off.
                Ok(_) if b.snooze() => {}
                _ => {
                    stat(&self.inner.errors.queue_corrupt);
                    break;
                }
            }
        }
        self.notify(self.region().cq_wait(), &self.inner.cq_futex, u32::MAX);
    }

    fn process(&self, idx: &[u32], handler: &mut dyn FnMut(&Request) -> i64, st: &mut ExecStats) {
        let cancel = self.region().ctl().load(Acquire) == ctl::EXIT_CANCEL;
        let mut done = [0u32; 64];
        let mut nd = 0;
        for &i in idx {
            if let Some(i) = self.exec_one(i, cancel, handler, st) {
                done[nd] = i;
                nd += 1;
            }
        }
        self.post(&done[..nd]);
    }

    fn pop_sq(&self, out: &mut [u32]) -> usize {
        self.sq().pop(out).unwrap_or_else(|_| {
            stat(&self.inner.errors.queue_corrupt);
            0
        })
    }

    /// The document's `exec`: an exec thread's loop. Waits for requests
    /// (spin, then futex), runs `handler` for each (its return value is the
    /// result; use negative errno for errors), and returns after
    /// [`Ring::exit`] once the SQ is empty.
    pub fn exec<F: FnMut(&Request) -> i64>(&self, opts: &ExecOptions, mut handler: F) -> ExecStats {
        let mut st = ExecStats::default();
        let mut buf = [0u32; 64];
        let b = opts.batch.clamp(1, 64);
        let mut spin = Spinner::new(opts.wait);
        let sq = self.sq();
        let ctlw = self.region().ctl();
        loop {
            let n = self.pop_sq(&mut buf[..b]);
            if n > 0 {
                self.process(&buf[..n], &mut handler, &mut st);
                continue;
            }
            if ctlw.load(SeqCst) != ctl::RUNNING {
                // Final check after seeing exit (pairs with the submitter's
                // fence + ctl re-read; see module docs).
                fence(SeqCst);
                let n = self.pop_sq(&mut buf[..b]);
                if n == 0 {
                    return st;
                }
                self.process(&buf[..n], &mut handler, &mut st);
                continue;
            }
            let ready = || sq.maybe_nonempty() || ctlw.load(Relaxed) != ctl::RUNNING;
            self.wait_on(
                self.region().sq_wait(),
                &self.inner.sq_futex,
                &mut spin,
                &ready,
                None,
            );
        }
    }

    /// Complete every queued-but-unstarted request with `-ECANCELED` from
    /// the calling thread (used after exit when no exec thread is left, and
    /// by submitters that lose the race with exit). Returns how many.
    pub fn cancel_pending(&self) -> usize {
        let mut st = ExecStats::default();
        let mut buf = [0u32; 64];
        let mut nop = |_: &Request| 0i64;
        loop {
            let n = self.pop_sq(&mut buf);
            if n == 0 {
                return st.cancelled as usize;
            }
            let mut done = [0u32; 64];
            let mut nd = 0;
            for &i in &buf[..n] {
                if let Some(i) = self.exec_one(i, true, &mut nop, &mut st) {
                    done[nd] = i;
                    nd += 1;
                }
            }
            self.post(&done[..nd]);
        }
    }

    /// The document's `exit`: stop the exec threads and wake every waiter.
    ///
    /// * New submissions fail with [`Error::Exiting`].
    /// * Exec threads return once the SQ is empty; with [`ExitMode::Drain`]
    ///   they run what is queued first, with [`ExitMode::Cancel`] queued
    ///   requests complete with `-ECANCELED`. Running requests finish.
    /// * Waiters wake; waits keep returning completions until nothing is in
    ///   flight, then fail with [`Error::Closed`].
    ///
    /// `Cancel` may upgrade an earlier `Drain`, never the reverse. Returns
    /// immediately; [`crate::AsyncSyscall::exit`] also joins its threads.
    pub fn exit(&self, mode: ExitMode) {
        let v = match mode {
            ExitMode::Drain => ctl::EXIT_DRAIN,
            ExitMode::Cancel => ctl::EXIT_CANCEL,
        };
        let c = self.region().ctl();
        let mut cur = c.load(SeqCst);
        while cur < v {
            match c.compare_exchange(cur, v, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(x) => cur = x,
            }
        }
        fence(SeqCst);
        let r = self.region();
        for (ww, fx) in [
            (r.sq_wait(), &self.inner.sq_futex),
            (r.cq_wait(), &self.inner.cq_futex),
        ] {
            Gate::with_futex(ww.seq, ww.waiters, fx).ring(u32::MAX);
        }
    }

    // ------------------------------------------------------------- test hooks

    /// Scribble `count` random values over random words of the shared area,
    /// with correctly sized atomic stores, as a buggy or hostile peer in
    /// this process would (fuzz tests). `seed` drives a xorshift generator.
    #[doc(hidden)]
    pub fn fuzz_scribble(&self, seed: u64, count: usize) {
        let mut x = seed | 1;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let n = self.inner.n as u64;
        let area = self.region();
        for _ in 0..count {
            let r = rnd();
            let v = rnd();
            // Bias towards plausible-looking values half of the time.
            let v32 = if v & 1 == 0 {
                (v >> 8) as u32 % (n as u32 + 4)
            } else {
                (v >> 8) as u32
            };
            match r % 8 {
                0 => self
                    .entry(((r >> 8) % n) as u32)
                    .state
                    .store(v32 % 6, Relaxed),
                1 => self.entry(((r >> 8) % n) as u32).state.store(v32, Relaxed),
                2 => area.sq()[(r >> 8) as usize % n as usize].store(v, Relaxed),
                3 => area.cq()[(r >> 8) as usize % n as usize].store(v, Relaxed),
                4 => {
                    let c = &area.cq()[(r >> 8) as usize % n as usize];
                    // A plausible "produced" cell with a random index.
                    let s = (c.load(Relaxed) >> 32) as u32;
                    c.store(((s.wrapping_add(1) as u64) << 32) | v32 as u64, Relaxed)
                }
                5 => {
                    let c = &area.sq()[(r >> 8) as usize % n as usize];
                    let s = (c.load(Relaxed) >> 32) as u32;
                    c.store(((s.wrapping_add(1) as u64) << 32) | v32 as u64, Relaxed)
                }
                6 => {
                    let pos = [
                        area.sq_tail(),
                        area.sq_head(),
                        area.cq_tail(),
                        area.cq_head(),
                    ];
                    pos[(r >> 8) as usize % 4].fetch_add(v32 % 3, Relaxed);
                }
                _ => {
                    let e = self.entry(((r >> 8) % n) as u32);
                    e.num.store(v32, Relaxed);
                    e.ret.store(v as i64, Relaxed);
                }
            }
        }
    }

    /// Length of the shared area (cross-process fuzzing).
    #[cfg(not(loom))]
    #[doc(hidden)]
    pub fn fuzz_area_len(&self) -> usize {
        self.inner.region.len()
    }

    /// Write one byte at `off` of the shared area with a plain store, as a
    /// buggy or hostile peer process would (cross-process fuzzing).
    #[cfg(not(loom))]
    #[doc(hidden)]
    pub fn fuzz_poke(&self, off: usize, byte: u8) {
        self.inner.region.poke(off, byte)
    }
}
