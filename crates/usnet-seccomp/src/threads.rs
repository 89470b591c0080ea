//! Relay threads, kept a while for reuse. A connection's relay runs two threads
//! for its whole life, and starting them (a stack mapped and guarded, a `clone`)
//! was about a quarter of the supervisor's time per connection a Go server
//! accepted. A thread whose relay ended waits [`Threads::keep_for`] for the next.
//!
//! Why by hand: each job here blocks for a connection's lifetime, so the pool must
//! grow with the connections; the pools of crates (rayon, threadpool, blocking)
//! cap their threads, and a capped pool would leave the next connection unserved.

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Where an idle thread is handed its next job.
#[derive(Default)]
struct Hand {
    job: Mutex<Option<Job>>,
    given: Condvar,
}

pub struct Threads {
    /// Threads waiting for a job, the latest last.
    idle: Mutex<Vec<Arc<Hand>>>,
    stack: usize,
    keep_for: Duration,
}

impl Threads {
    pub const fn new(stack: usize, keep_for: Duration) -> Threads {
        Threads {
            idle: Mutex::new(Vec::new()),
            stack,
            keep_for,
        }
    }

    /// Runs `f` on an idle thread, or on a new one.
    pub fn run(&'static self, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let job: Job = Box::new(f);
        // A hand taken off the list is one its thread waits on until it is given
        // a job (see `work`), so the job is never lost.
        let hand = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(h) = hand {
            *h.job.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
            h.given.notify_one();
            return Ok(());
        }
        std::thread::Builder::new()
            .name("usnet-relay".into())
            .stack_size(self.stack)
            .spawn(move || self.work(job))
            .map(|_| ())
    }

    fn work(&self, first: Job) {
        let hand = Arc::new(Hand::default());
        let mut job = first;
        loop {
            job();
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Arc::clone(&hand));
            let deadline = Instant::now() + self.keep_for;
            let mut given = hand.job.lock().unwrap_or_else(|p| p.into_inner());
            job = loop {
                if let Some(j) = given.take() {
                    break j;
                }
                let now = Instant::now();
                if now >= deadline {
                    let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(at) = idle.iter().position(|h| Arc::ptr_eq(h, &hand)) {
                        // Still listed: no job can come; leave.
                        idle.swap_remove(at);
                        return;
                    }
                    // Taken off the list: its job is on the way. Wait for it.
                    drop(idle);
                    given = hand.given.wait(given).unwrap_or_else(|p| p.into_inner());
                    continue;
                }
                given = hand
                    .given
                    .wait_timeout(given, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    const WAIT: Duration = Duration::from_secs(20);

    #[test]
    fn a_thread_whose_job_ended_takes_the_next() {
        static T: Threads = Threads::new(64 * 1024, Duration::from_secs(30));
        let (tx, rx) = mpsc::channel();
        let mut ids = HashSet::new();
        for _ in 0..20 {
            let tx = tx.clone();
            T.run(move || tx.send(std::thread::current().id()).unwrap())
                .unwrap();
            ids.insert(rx.recv_timeout(WAIT).unwrap());
            // Until it is listed idle again, the next job would start a thread.
            let listed = Instant::now() + WAIT;
            while T.idle.lock().unwrap().is_empty() {
                assert!(Instant::now() < listed, "never listed idle");
                std::thread::yield_now();
            }
        }
        assert_eq!(ids.len(), 1, "one thread ran all twenty");
    }

    #[test]
    fn jobs_that_block_each_get_a_thread() {
        static T: Threads = Threads::new(64 * 1024, Duration::from_secs(30));
        let n = 50;
        let barrier = Arc::new(std::sync::Barrier::new(n + 1));
        for _ in 0..n {
            let b = Arc::clone(&barrier);
            T.run(move || {
                b.wait();
            })
            .unwrap();
        }
        // Every job waits for all the others: only a pool that grows gets here.
        barrier.wait();
    }

    #[test]
    fn no_job_is_lost_to_a_thread_leaving() {
        // Threads leave as soon as they are idle, so a job often meets a thread
        // as it leaves: taken off the idle list after its wait ended.
        static T: Threads = Threads::new(64 * 1024, Duration::ZERO);
        static DONE: AtomicUsize = AtomicUsize::new(0);
        let (tx, rx) = mpsc::channel();
        let n = 20_000;
        for _ in 0..n {
            let tx = tx.clone();
            T.run(move || {
                DONE.fetch_add(1, Ordering::SeqCst);
                tx.send(()).unwrap();
            })
            .unwrap();
        }
        for _ in 0..n {
            rx.recv_timeout(WAIT).expect("a job was lost");
        }
        assert_eq!(DONE.load(Ordering::SeqCst), n);
    }
}
