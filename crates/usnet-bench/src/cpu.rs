//! The CPU a benchmark's server spends, beside its rate: the server's pinned core's
//! counters from `/proc/stat`, user time and kernel time apart. The core's counters
//! rather than the process's: on a veth or TAP the kernel's receive work (softirq)
//! runs on the core that sent or received, and a server's system calls are kernel
//! time too, so the kernel's share of a transfer is counted for usnet and Linux
//! alike. A usnet loop that busy-polls is user time: what it costs is what it
//! shows. Where a benchmark pins nothing (`bench server`), the whole machine's
//! counters are read instead ([`sample_machine`]): both ends and the stack servers
//! together, per GB.

use std::time::Instant;

/// One reading of a core's counters (or of the whole machine's).
#[derive(Debug, Clone, Copy)]
pub struct CoreSample {
    /// None: every core (/proc/stat's `cpu` line).
    core: Option<usize>,
    /// Ticks (`USER_HZ`) in user mode (user + nice) and in the kernel (system +
    /// irq + softirq).
    user: u64,
    kernel: u64,
    at: Instant,
}

/// How busy a core was over a window: the fraction of the window spent in user
/// mode and in the kernel (each 0..=1; for the whole machine, in cores).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CoreUse {
    pub user: f64,
    pub kernel: f64,
    /// The window's length, seconds.
    pub secs: f64,
}

impl CoreUse {
    /// CPU seconds per unit, user and kernel, when the window did `units` of work.
    pub fn per_total(&self, units: f64) -> (f64, f64) {
        if units <= 0.0 {
            return (0.0, 0.0);
        }
        (
            self.user * self.secs / units,
            self.kernel * self.secs / units,
        )
    }
}

/// The counters of `core` now (None: no such core in /proc/stat).
pub fn sample(core: usize) -> Option<CoreSample> {
    read(Some(core))
}

/// The whole machine's counters now (every core together), for a benchmark
/// whose processes are not pinned.
pub fn sample_machine() -> Option<CoreSample> {
    read(None)
}

fn read(core: Option<usize>) -> Option<CoreSample> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let (user, kernel) = parse_core(&text, core)?;
    Some(CoreSample {
        core,
        user,
        kernel,
        at: Instant::now(),
    })
}

/// `user + nice` and `system + irq + softirq` of `cpuN` (None: `cpu`, the sum) in
/// /proc/stat's text.
fn parse_core(text: &str, core: Option<usize>) -> Option<(u64, u64)> {
    let tag = core.map_or("cpu".to_string(), |c| format!("cpu{c}"));
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tag.as_str()))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal ...
    Some((at(0) + at(1), at(2) + at(5) + at(6)))
}

/// A new reading of the core `earlier` read.
pub fn sample_like(earlier: &CoreSample) -> Option<CoreSample> {
    read(earlier.core)
}

impl CoreSample {
    /// How busy the core was from this reading to `later` (a reading of the
    /// same core).
    pub fn until(&self, later: &CoreSample) -> CoreUse {
        debug_assert_eq!(self.core, later.core);
        let secs = later.at.saturating_duration_since(self.at).as_secs_f64();
        if secs <= 0.0 {
            return CoreUse::default();
        }
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let frac = |a: u64, b: u64| b.saturating_sub(a) as f64 / hz / secs;
        CoreUse {
            user: frac(self.user, later.user),
            kernel: frac(self.kernel, later.kernel),
            secs,
        }
    }
}

/// Runs `f` and measures `core` while it runs.
pub fn measure<T>(core: Option<usize>, f: impl FnOnce() -> T) -> (T, Option<CoreUse>) {
    let before = core.and_then(sample);
    let r = f();
    let used = before.and_then(|b| sample_like(&b).map(|a| b.until(&a)));
    (r, used)
}

/// CPU seconds (user and kernel together) that process `pid` and every process
/// descended from it have spent so far, from `/proc/PID/stat` (all threads of a
/// process count; children that already exited do not). For a server that forks
/// workers (nginx): its whole tree. None if `pid` is gone.
pub fn process_tree_secs(pid: u32) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let stat = |pid: u32| -> Option<(u32, u64)> {
        let t = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may hold spaces and parentheses: fields start after the
        // last ')'. Then: state ppid ... utime (14th field) stime (15th).
        let rest = &t[t.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ppid = f.get(1)?.parse().ok()?;
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        Some((ppid, ticks))
    };
    let (_, own) = stat(pid)?;
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        if let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
            if let Some((ppid, t)) = stat(p) {
                procs.push((p, ppid, t));
            }
        }
    }
    let mut tree = vec![pid];
    let mut total = own;
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for &(p, ppid, t) in &procs {
            if ppid == parent && !tree.contains(&p) {
                tree.push(p);
                total += t;
            }
        }
        i += 1;
    }
    Some(total as f64 / hz)
}

/// A table cell of CPU per unit with `digits` decimals; "-" when not measured.
pub fn cell(per: Option<f64>, digits: usize) -> String {
    per.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// A "user/kernel" table cell of CPU per unit; "-" when not measured.
pub fn pair_cell(per: Option<(f64, f64)>, digits: usize) -> String {
    per.map_or("-".into(), |(u, k)| format!("{u:.digits$}/{k:.digits$}"))
}

/// The medians of the user and of the kernel CPU per unit over runs (None: no
/// run was measured).
pub fn median_pair(runs: impl IntoIterator<Item = (f64, f64)>) -> Option<(f64, f64)> {
    let (mut u, mut k): (Vec<f64>, Vec<f64>) = runs.into_iter().unzip();
    (!u.is_empty()).then(|| (usnet_report::median(&mut u), usnet_report::median(&mut k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_are_read_per_core() {
        let text = "cpu  10 1 20 900 0 3 4 0 0 0\n\
                    cpu0 5 0 10 450 0 1 2 0 0 0\n\
                    cpu1 5 1 10 450 0 2 2 0 0 0\n\
                    intr 123\n";
        assert_eq!(parse_core(text, Some(0)), Some((5, 13)));
        assert_eq!(parse_core(text, Some(1)), Some((6, 14)));
        assert_eq!(parse_core(text, Some(2)), None);
        assert_eq!(parse_core(text, None), Some((11, 27)));
    }

    #[test]
    fn use_per_unit_divides_by_the_rate() {
        let u = CoreUse {
            user: 0.5,
            kernel: 0.25,
            secs: 2.0,
        };
        assert_eq!(u.per_total(2000.0), (0.0005, 0.00025));
        assert_eq!(u.per_total(0.0), (0.0, 0.0));
        assert_eq!(cell(Some(500.0), 1), "500.0");
        assert_eq!(cell(None, 1), "-");
        assert_eq!(pair_cell(Some((0.5, 0.25)), 2), "0.50/0.25");
        assert_eq!(
            median_pair([(1.0, 9.0), (3.0, 7.0), (2.0, 8.0)]),
            Some((2.0, 8.0))
        );
        assert_eq!(median_pair([]), None);
    }

    #[test]
    fn a_busy_thread_shows_on_its_core() {
        // The calling thread pinned to a core, spinning for 300 ms: that core is
        // busy for most of the window (user time), whatever else runs.
        let core = 0;
        crate::pin_to_core(core);
        let ((), used) = measure(Some(core), || {
            let end = Instant::now() + std::time::Duration::from_millis(300);
            let mut x = 0u64;
            while Instant::now() < end {
                x = x.wrapping_add(1);
                std::hint::black_box(x);
            }
        });
        let used = used.expect("cpu0 is in /proc/stat");
        assert!(used.user + used.kernel > 0.0, "{used:?}");
    }
}
