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
    const CAP_SYS_NICE: u32 = 23;
    let cap = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0);
    if cap {
        return Ok(());
    }
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut rl) } == 0;
    // RLIMIT_NICE r allows nice values down to 20 - r.
    if ok && rl.rlim_cur > 20 {
        return Ok(());
    }
    Err("priority control is off: raising a consumer's priority needs CAP_SYS_NICE or RLIMIT_NICE (run as root or raise `ulimit -e`)".into())
}

/// A boosted consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Boosted {
    original: i32,
    /// /proc/PID/stat start time, so a reused pid is never touched.
    start: Option<u64>,
}

/// Applies a stack's [`SchedRequest`]s and undoes them all at the end.
pub struct Booster {
    hook: Box<dyn SchedHook>,
    boosted: HashMap<u32, Boosted>,
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

    /// Consumers boosted now.
    pub fn boosted(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.boosted.keys().copied().collect();
        v.sort_unstable();
        v
    }

    pub fn apply(&mut self, req: SchedRequest) {
        let ok = match req {
            SchedRequest::Boost { pid, steps } => self.boost(pid, steps),
            SchedRequest::Restore { pid } => self.restore(pid),
        };
        match ok {
            Ok(()) => self.applied += 1,
            Err(_) => self.failures += 1,
        }
    }

    fn boost(&mut self, pid: u32, steps: i32) -> io::Result<()> {
        if self.boosted.contains_key(&pid) {
            return Ok(());
        }
        let original = self.hook.get(pid)?;
        let target = (original - steps.max(0)).clamp(NICE_MIN, NICE_MAX);
        if target == original {
            return Ok(());
        }
        // Written down before the change, so a crash right after it is recoverable.
        self.boosted.insert(
            pid,
            Boosted {
                original,
                start: start_time(pid),
            },
        );
        self.save();
        if let Err(e) = self.hook.set(pid, target) {
            self.boosted.remove(&pid);
            self.save();
            return Err(e);
        }
        Ok(())
    }

    fn restore(&mut self, pid: u32) -> io::Result<()> {
        let Some(b) = self.boosted.remove(&pid) else {
            return Ok(());
        };
        let r = if b.start.is_some() && start_time(pid) != b.start {
            Ok(()) // the process is gone (or its pid reused): nothing to undo
        } else {
            self.hook.set(pid, b.original)
        };
        self.save();
        r
    }

    /// Puts every boosted consumer back (the loop stops).
    pub fn restore_all(&mut self) {
        let pids = self.boosted();
        for pid in pids {
            let _ = self.restore(pid);
        }
    }

    fn save(&self) {
        let Some(path) = &self.state else {
            return;
        };
        if self.boosted.is_empty() {
            let _ = std::fs::remove_file(path);
            return;
        }
        let mut text = String::new();
        for (pid, b) in &self.boosted {
            text.push_str(&format!("{pid} {} {}\n", b.original, b.start.unwrap_or(0)));
        }
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Nice values in a map; pids above 90000 refuse changes.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<HashMap<u32, i32>>>);

    impl SchedHook for Fake {
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
