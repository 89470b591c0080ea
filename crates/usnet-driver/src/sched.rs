//! The scheduler hook of priority control (mechanism B; docs/priority.md): the stack
//! only asks ([`SchedRequest`]); a [`Booster`] applies the asks with setpriority(2),
//! keeps every boosted consumer's original nice value and puts it back — when the
//! stack asks, and for all of them when the booster is dropped or the loop stops.
//!
//! If the stack's process dies without running that (SIGKILL), a stack server's
//! boosted clients would stay boosted. So a booster given a state file writes the
//! boosted pids there (pid, original nice, the process's start time) before it
//! boosts, and [`recover`] — run by the next `usnet up` and by `usnet down` —
//! restores whatever a dead stack left (a pid whose start time changed was reused
//! and is left alone). Threads of the stack's own process (the in-process runtime's
//! receivers) die with it, so they need no file.
//!
//! A boosted consumer must not outrank the loop that feeds it: the kernel's protocol
//! work (softirq) runs before any process, but a stack's loop is a thread like the
//! others, and a consumer boosted above it would take the CPU that delivers its own
//! datagrams. So while any boost is in force, the booster keeps the thread that
//! applies the boosts (the stack's loop) one nice step above the best boosted
//! consumer, and puts it back with the last restore.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use usnet_stack::SchedRequest;

/// The nice range of normal (non-real-time) scheduling.
pub const NICE_MIN: i32 = -20;
pub const NICE_MAX: i32 = 19;

/// Reads and sets a process's (or thread's) nice value. The real one is
/// [`Setpriority`]; tests use a fake.
pub trait SchedHook: Send {
    fn get(&mut self, pid: u32) -> io::Result<i32>;
    fn set(&mut self, pid: u32, nice: i32) -> io::Result<()>;
    /// The threads of process `pid` (a nice value is per thread on Linux).
    fn threads(&mut self, pid: u32) -> Vec<u32> {
        vec![pid]
    }
}

/// getpriority(2)/setpriority(2) on `PRIO_PROCESS` (a tid names one thread on Linux).
#[derive(Debug, Default, Clone, Copy)]
pub struct Setpriority;

impl SchedHook for Setpriority {
    fn get(&mut self, pid: u32) -> io::Result<i32> {
        nice_of(pid)
    }
    fn set(&mut self, pid: u32, nice: i32) -> io::Result<()> {
        // SAFETY: plain system call on integers.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    fn threads(&mut self, pid: u32) -> Vec<u32> {
        let mut v: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        if v.is_empty() {
            v.push(pid);
        }
        v.sort_unstable();
        v
    }
}

/// The nice value of a process or thread.
pub fn nice_of(pid: u32) -> io::Result<i32> {
    // getpriority may return -1 legitimately: clear errno first and look again.
    // SAFETY: errno is thread-local; plain system call on integers.
    unsafe {
        *libc::__errno_location() = 0;
        let v = libc::getpriority(libc::PRIO_PROCESS, pid as libc::id_t);
        if v == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }
}

/// The calling thread's id (what a receiving thread hands to
/// `Stack::set_socket_consumer`).
pub fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Whether this process may raise a priority (lower a nice value): CAP_SYS_NICE or
/// an RLIMIT_NICE that allows it. `Err` is the one line to print when it may not.
pub fn can_boost() -> Result<(), String> {
    if may_raise("self", NICE_MIN) {
        return Ok(());
    }
    Err("priority control is off: raising a consumer's priority needs CAP_SYS_NICE or RLIMIT_NICE (run as root or raise `ulimit -e`)".into())
}

/// Whether process `pid` may set a nice value as good as `nice`: it has
/// CAP_SYS_NICE, or its RLIMIT_NICE allows it (what setpriority(2) asks).
pub fn pid_may_raise(pid: u32, nice: i32) -> bool {
    may_raise(&pid.to_string(), nice)
}

fn may_raise(proc_name: &str, nice: i32) -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let cap = std::fs::read_to_string(format!("/proc/{proc_name}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0);
    if cap {
        return true;
    }
    // RLIMIT_NICE r allows nice values down to 20 - r ("Max nice priority", soft).
    std::fs::read_to_string(format!("/proc/{proc_name}/limits"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Max nice priority"))
                .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
        })
        .is_some_and(|r| 20 - r <= i64::from(nice))
}

/// A boosted consumer: each of its threads with its nice value before the boost.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Boosted {
    threads: Vec<BoostedThread>,
    /// The best nice value any of its threads was given.
    target: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BoostedThread {
    tid: u32,
    original: i32,
    /// /proc/TID/stat start time, so a reused id is never touched.
    start: Option<u64>,
}

/// The stack's loop thread while it is raised above the boosted consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Feeder {
    tid: u32,
    original: i32,
}

/// Applies a stack's [`SchedRequest`]s and undoes them all at the end.
pub struct Booster {
    hook: Box<dyn SchedHook>,
    boosted: HashMap<u32, Boosted>,
    feeder: Option<Feeder>,
    /// A consumer is a process: a boost raises all its threads (a stack server's
    /// clients). Else a consumer is one thread (the in-process runtime's readers).
    whole_processes: bool,
    state: Option<PathBuf>,
    /// Requests that failed (the process was gone, or no permission).
    pub failures: u64,
    pub applied: u64,
}

impl Booster {
    pub fn new(hook: Box<dyn SchedHook>, state: Option<PathBuf>) -> Booster {
        Booster {
            hook,
            boosted: HashMap::new(),
            feeder: None,
            whole_processes: false,
            state,
            failures: 0,
            applied: 0,
        }
    }

    /// The real one, if this process may boost; else the one-line reason.
    pub fn system(state: Option<PathBuf>) -> Result<Booster, String> {
        can_boost()?;
        Ok(Booster::new(Box::new(Setpriority), state))
    }

    /// Consumers are processes: a boost raises each of their threads.
    pub fn whole_processes(mut self) -> Booster {
        self.whole_processes = true;
        self
    }

    /// Consumers boosted now.
    pub fn boosted(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.boosted.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Applies one request, from the stack's loop thread (see [`Self::feeder`]).
    pub fn apply(&mut self, req: SchedRequest) {
        let ok = match req {
            SchedRequest::Boost { pid, steps } => self.boost(pid, steps),
            SchedRequest::Restore { pid } => self.restore(pid),
        };
        match ok {
            Ok(()) => self.applied += 1,
            Err(_) => self.failures += 1,
        }
        self.keep_precedence(gettid());
    }

    /// The loop thread's raise: its id and nice value before it, while in force.
    pub fn feeder(&self) -> Option<(u32, i32)> {
        self.feeder.map(|f| (f.tid, f.original))
    }

    /// Keeps thread `tid` (the loop) one step above the best boosted consumer while
    /// any boost is in force, and puts it back when none is.
    fn keep_precedence(&mut self, tid: u32) {
        let Some(best) = self.boosted.values().map(|b| b.target).min() else {
            if let Some(f) = self.feeder.take() {
                let _ = self.hook.set(f.tid, f.original);
            }
            return;
        };
        if self
            .boosted
            .values()
            .any(|b| b.threads.iter().any(|t| t.tid == tid))
        {
            return; // the loop is itself a consumer (a test, or a one-thread program)
        }
        let original = match self.feeder {
            Some(f) if f.tid == tid => f.original,
            _ => match self.hook.get(tid) {
                Ok(n) => n,
                Err(_) => return,
            },
        };
        let want = (best - 1).clamp(NICE_MIN, NICE_MAX).min(original);
        let now = match self.feeder {
            Some(f) if f.tid == tid => self.hook.get(tid).unwrap_or(original),
            _ => original,
        };
        if want < now && self.hook.set(tid, want).is_ok() {
            self.feeder = Some(Feeder { tid, original });
        }
    }

    fn boost(&mut self, pid: u32, steps: i32) -> io::Result<()> {
        if self.boosted.contains_key(&pid) {
            return Ok(());
        }
        let tids = if self.whole_processes {
            self.hook.threads(pid)
        } else {
            vec![pid]
        };
        let mut threads = Vec::new();
        for tid in tids {
            // A thread that ended meanwhile is no error; the consumer itself is.
            match self.hook.get(tid) {
                Ok(original) => threads.push(BoostedThread {
                    tid,
                    original,
                    start: start_time(tid),
                }),
                Err(e) if tid == pid => return Err(e),
                Err(_) => {}
            }
        }
        let first = threads.iter().find(|t| t.tid == pid).map(|t| t.original);
        let Some(original) = first else {
            return Ok(());
        };
        let target = (original - steps.max(0)).clamp(NICE_MIN, NICE_MAX);
        if target == original {
            return Ok(());
        }
        let steps = original - target;
        let to = |t: &BoostedThread| (t.original - steps).clamp(NICE_MIN, NICE_MAX);
        let best = threads.iter().map(to).min().unwrap_or(target);
        // Written down before the change, so a crash right after it is recoverable.
        self.boosted.insert(
            pid,
            Boosted {
                threads: threads.clone(),
                target: best,
            },
        );
        self.save();
        let mut raised = false;
        for t in &threads {
            match self.hook.set(t.tid, to(t)) {
                Ok(()) => raised |= t.tid == pid,
                Err(e) if t.tid == pid => {
                    // Undo the threads already raised.
                    let _ = self.restore(pid);
                    return Err(e);
                }
                Err(_) => {}
            }
        }
        debug_assert!(raised);
        Ok(())
    }

    fn restore(&mut self, pid: u32) -> io::Result<()> {
        let Some(b) = self.boosted.remove(&pid) else {
            return Ok(());
        };
        let mut r = Ok(());
        for t in &b.threads {
            if t.start.is_some() && start_time(t.tid) != t.start {
                continue; // the thread is gone (or its id reused): nothing to undo
            }
            if let Err(e) = self.hook.set(t.tid, t.original) {
                if t.tid == pid {
                    r = Err(e);
                }
            }
        }
        self.save();
        r
    }

    /// Puts every boosted consumer back, and the loop thread (the loop stops).
    pub fn restore_all(&mut self) {
        let pids = self.boosted();
        for pid in pids {
            let _ = self.restore(pid);
        }
        if let Some(f) = self.feeder.take() {
            let _ = self.hook.set(f.tid, f.original);
        }
    }

    fn save(&self) {
        let Some(path) = &self.state else {
            return;
        };
        // A server that gave up root may not create or remove files in root's run
        // directory: it was handed its state file and writes it in place (the
        // janitor removes it: `usnet_server::privs::Janitor`).
        let in_place = |text: &str| {
            if path.exists() {
                let _ = std::fs::write(path, text);
            }
        };
        if self.boosted.is_empty() {
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    in_place("");
                }
            }
            return;
        }
        let mut text = String::new();
        for t in self.boosted.values().flat_map(|b| &b.threads) {
            text.push_str(&format!(
                "{} {} {}\n",
                t.tid,
                t.original,
                t.start.unwrap_or(0)
            ));
        }
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, &text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        } else {
            in_place(&text);
        }
    }
}

impl Drop for Booster {
    fn drop(&mut self) {
        self.restore_all();
    }
}

/// Restores what a dead stack's booster left in `path` (see the module text).
/// Returns how many consumers were put back.
pub fn recover(path: &Path, hook: &mut dyn SchedHook) -> usize {
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    let mut n = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(pid), Some(nice), Some(start)) = (
            f.first().and_then(|v| v.parse::<u32>().ok()),
            f.get(1).and_then(|v| v.parse::<i32>().ok()),
            f.get(2).and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if start != 0 && start_time(pid) != Some(start) {
            continue;
        }
        if hook.set(pid, nice).is_ok() {
            n += 1;
        }
    }
    let _ = std::fs::remove_file(path);
    n
}

/// Field 22 of /proc/PID/stat (start time in clock ticks since boot).
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields restart after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Pins the calling thread to `core`.
pub fn pin_to_core(core: usize) -> std::io::Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it (core checked
    // above); sched_setaffinity reads it for the calling thread (pid 0).
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Nice values in a map; pids above 90000 refuse changes.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<HashMap<u32, i32>>>);

    impl SchedHook for Fake {
        /// Process 50 has threads 50, 51 and 52; every other id is one thread.
        fn threads(&mut self, pid: u32) -> Vec<u32> {
            if pid == 50 {
                vec![50, 51, 52]
            } else {
                vec![pid]
            }
        }
        fn get(&mut self, pid: u32) -> io::Result<i32> {
            Ok(*self.0.lock().unwrap().get(&pid).unwrap_or(&0))
        }
        fn set(&mut self, pid: u32, nice: i32) -> io::Result<()> {
            if pid > 90000 {
                return Err(io::ErrorKind::PermissionDenied.into());
            }
            self.0.lock().unwrap().insert(pid, nice);
            Ok(())
        }
    }

    impl Fake {
        fn nice(&self, pid: u32) -> i32 {
            *self.0.lock().unwrap().get(&pid).unwrap_or(&0)
        }
    }

    #[test]
    fn boosts_within_the_normal_range_and_restores_the_original() {
        let fake = Fake::default();
        fake.0.lock().unwrap().insert(7, 5);
        fake.0.lock().unwrap().insert(8, -15);
        let mut b = Booster::new(Box::new(fake.clone()), None);
        b.apply(SchedRequest::Boost { pid: 7, steps: 10 });
        b.apply(SchedRequest::Boost { pid: 8, steps: 10 });
        assert_eq!(fake.nice(7), -5);
        assert_eq!(fake.nice(8), NICE_MIN, "never past the normal range");
        // A second boost does not stack.
        b.apply(SchedRequest::Boost { pid: 7, steps: 10 });
        assert_eq!(fake.nice(7), -5);
        assert_eq!(b.boosted(), vec![7, 8]);
        b.apply(SchedRequest::Restore { pid: 7 });
        assert_eq!(fake.nice(7), 5);
        // Restoring what is not boosted is harmless.
        b.apply(SchedRequest::Restore { pid: 7 });
        assert_eq!(fake.nice(7), 5);
        assert_eq!(b.failures, 0);
        drop(b);
        assert_eq!(fake.nice(8), -15, "dropped: everything restored");
    }

    #[test]
    fn the_loop_thread_stays_above_the_boosted_consumers() {
        let fake = Fake::default();
        let me = gettid();
        fake.0.lock().unwrap().insert(me, 0);
        fake.0.lock().unwrap().insert(7, 5);
        fake.0.lock().unwrap().insert(8, 0);
        let mut b = Booster::new(Box::new(fake.clone()), None);
        b.apply(SchedRequest::Boost { pid: 7, steps: 10 });
        assert_eq!(fake.nice(7), -5);
        assert_eq!(fake.nice(me), -6, "one step above the boosted consumer");
        b.apply(SchedRequest::Boost { pid: 8, steps: 10 });
        assert_eq!(fake.nice(me), -11, "above the best one");
        assert_eq!(b.feeder(), Some((me, 0)));
        b.apply(SchedRequest::Restore { pid: 8 });
        assert_eq!(fake.nice(me), -11, "not lowered while a boost is in force");
        b.apply(SchedRequest::Restore { pid: 7 });
        assert_eq!(fake.nice(me), 0, "back with the last restore");
        assert_eq!(b.feeder(), None);
        // Restored when the booster goes, too.
        b.apply(SchedRequest::Boost { pid: 7, steps: 8 });
        assert_eq!(fake.nice(me), -4);
        drop(b);
        assert_eq!(fake.nice(me), 0);
        assert_eq!(fake.nice(7), 5);
    }

    #[test]
    fn a_process_is_boosted_thread_by_thread_and_put_back_the_same_way() {
        let fake = Fake::default();
        for (tid, nice) in [(50, 4), (51, 0), (52, 19)] {
            fake.0.lock().unwrap().insert(tid, nice);
        }
        // Per thread (the runtime): only the named thread.
        let mut b = Booster::new(Box::new(fake.clone()), None);
        b.apply(SchedRequest::Boost { pid: 50, steps: 6 });
        assert_eq!((fake.nice(50), fake.nice(51), fake.nice(52)), (-2, 0, 19));
        drop(b);
        assert_eq!(fake.nice(50), 4);
        // Whole processes (the server): every thread by the same steps.
        let mut b = Booster::new(Box::new(fake.clone()), None).whole_processes();
        b.apply(SchedRequest::Boost { pid: 50, steps: 6 });
        assert_eq!((fake.nice(50), fake.nice(51), fake.nice(52)), (-2, -6, 13));
        // The loop stays above the best of them.
        assert_eq!(fake.nice(gettid()), -7);
        b.apply(SchedRequest::Restore { pid: 50 });
        assert_eq!((fake.nice(50), fake.nice(51), fake.nice(52)), (4, 0, 19));
        assert_eq!(fake.nice(gettid()), 0);
    }

    #[test]
    fn a_loop_already_above_is_left_alone() {
        let fake = Fake::default();
        let me = gettid();
        fake.0.lock().unwrap().insert(me, -19);
        let mut b = Booster::new(Box::new(fake.clone()), None);
        b.apply(SchedRequest::Boost { pid: 7, steps: 4 });
        assert_eq!(fake.nice(me), -19);
        assert_eq!(b.feeder(), None);
    }

    #[test]
    fn a_refused_boost_is_counted_and_not_remembered() {
        let fake = Fake::default();
        let mut b = Booster::new(Box::new(fake.clone()), None);
        b.apply(SchedRequest::Boost {
            pid: 99999,
            steps: 5,
        });
        assert_eq!(b.failures, 1);
        assert!(b.boosted().is_empty());
    }

    #[test]
    fn a_dead_stacks_boosts_are_recovered_from_its_state_file() {
        let dir = std::env::temp_dir().join(format!("usnet-boost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stack.boosts");
        let fake = Fake::default();
        let me = std::process::id();
        fake.0.lock().unwrap().insert(me, 3);
        let mut b = Booster::new(Box::new(fake.clone()), Some(path.clone()));
        b.apply(SchedRequest::Boost { pid: me, steps: 4 });
        assert_eq!(fake.nice(me), -1);
        assert!(path.exists());
        // The stack dies without running its destructor.
        std::mem::forget(b);
        let mut hook = fake.clone();
        assert_eq!(recover(&path, &mut hook), 1);
        assert_eq!(fake.nice(me), 3);
        assert!(!path.exists());
        // A line whose process start time does not match (a reused pid) is skipped.
        std::fs::write(&path, format!("{me} 0 1\n")).unwrap();
        assert_eq!(recover(&path, &mut hook), 0);
        assert_eq!(fake.nice(me), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_state_file_goes_when_nothing_is_boosted() {
        let dir = std::env::temp_dir().join(format!("usnet-boost2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.boosts");
        let fake = Fake::default();
        let me = std::process::id();
        let mut b = Booster::new(Box::new(fake), Some(path.clone()));
        b.apply(SchedRequest::Boost { pid: me, steps: 2 });
        assert!(path.exists());
        b.apply(SchedRequest::Restore { pid: me });
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
