//! `usnet bench async-syscall`: the document's Figures 8 and 9 plus the
//! ring as a two-process transport, against direct calls and io_uring.
//!
//! 1. N × gettid, N = 0..400 step 20: direct vs ring (1 exec thread), wall
//!    time per batch and the caller's own cost; io_uring NOP as the floor.
//! 2. 10 MB tmpfs file read in 100 KB pieces (100 `pread64` calls): direct,
//!    ring with 1..8 exec threads, io_uring (inline and `IOSQE_ASYNC`).
//! 3. Two processes: request + completion round trips, ops/s with batching
//!    and p50/p99 latency when both sides spin (and when they sleep).
//!
//! Output: tables on stdout, `results.json`, `results.md` and PNG plots in
//! `--out`.

use serde_json::{json, Value};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use usnet_async_syscall::{
    echo_result, run_syscall, spawn_child, AsyncOptions, AsyncSyscall, Call, Completion, Error,
    ExecOptions, ExitMode, Request, Ring, WaitPolicy,
};
use usnet_report::{bar_plot, histogram_plot, line_plot, percentile, write_json, Series, Table};

type BoxErr = Box<dyn std::error::Error>;

/// Options of `usnet bench async-syscall`.
#[derive(Debug, Clone)]
pub struct AsyncSyscallBenchOptions {
    /// Output directory for JSON, Markdown and plots.
    pub out: PathBuf,
    /// Fewer repetitions and samples (a smoke run, ~10 s).
    pub quick: bool,
    /// Which parts to run: gettid, read, transport (empty: all).
    pub only: Vec<String>,
    /// Directory on tmpfs for the read test (default /dev/shm).
    pub tmpfs_dir: Option<PathBuf>,
}

impl Default for AsyncSyscallBenchOptions {
    fn default() -> Self {
        AsyncSyscallBenchOptions {
            out: PathBuf::from("bench-out/async-syscall"),
            quick: false,
            only: Vec::new(),
            tmpfs_dir: None,
        }
    }
}

fn us(d: f64) -> String {
    format!("{:.2}", d / 1e3)
}

fn median_of(mut v: Vec<f64>) -> f64 {
    usnet_report::median(&mut v)
}

/// Run the benchmark.
pub fn run(args: &AsyncSyscallBenchOptions) -> Result<(), BoxErr> {
    crate::check_only(
        &args.only,
        &["gettid", "read", "transport"].map(String::from),
    )?;
    std::fs::create_dir_all(&args.out)?;
    let want = |p: &str| args.only.is_empty() || args.only.iter().any(|o| o == p);
    let mut json = json!({
        "machine": { "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) },
        "quick": args.quick,
    });
    let mut md = String::from("# usnet bench async-syscall\n\n");
    if want("gettid") {
        let (v, m) = bench_gettid(args)?;
        json["gettid"] = v;
        md += &m;
    }
    if want("read") {
        let (v, m) = bench_read(args)?;
        json["read"] = v;
        md += &m;
    }
    if want("transport") {
        let (v, m) = bench_transport(args)?;
        json["transport"] = v;
        md += &m;
    }
    write_json(&args.out.join("results.json"), &json)?;
    std::fs::write(args.out.join("results.md"), md)?;
    println!("wrote {}", args.out.display());
    Ok(())
}

// ------------------------------------------------------------------ io_uring

struct Uring(Option<io_uring::IoUring>);

impl Uring {
    fn new(entries: u32) -> Uring {
        Uring(io_uring::IoUring::new(entries).ok())
    }

    /// Submit `n` NOPs and wait for all; ns.
    fn nops(&mut self, n: usize) -> Option<f64> {
        let ring = self.0.as_mut()?;
        let t = Instant::now();
        {
            let mut sq = ring.submission();
            for i in 0..n {
                let e = io_uring::opcode::Nop::new().build().user_data(i as u64);
                // SAFETY: a NOP references no memory.
                unsafe { sq.push(&e).ok()? };
            }
        }
        if n > 0 {
            ring.submit_and_wait(n).ok()?;
        }
        let mut got = 0;
        while got < n {
            got += ring.completion().count();
            if got < n {
                ring.submit_and_wait(n - got).ok()?;
            }
        }
        Some(t.elapsed().as_nanos() as f64)
    }

    /// Read `buf.len()` bytes of `fd` in `piece`-sized reads submitted as
    /// one batch; ns. `async_` sets IOSQE_ASYNC (punt to io-wq workers).
    fn reads(&mut self, fd: i32, buf: &mut [u8], piece: usize, async_: bool) -> Option<f64> {
        let ring = self.0.as_mut()?;
        let n = buf.len() / piece;
        let t = Instant::now();
        {
            let mut sq = ring.submission();
            for i in 0..n {
                let mut e = io_uring::opcode::Read::new(
                    io_uring::types::Fd(fd),
                    buf[i * piece..].as_mut_ptr(),
                    piece as u32,
                )
                .offset((i * piece) as u64)
                .build()
                .user_data(i as u64);
                if async_ {
                    e = e.flags(io_uring::squeue::Flags::ASYNC);
                }
                // SAFETY: the buffer slice outlives the batch: we wait for
                // all completions below before returning.
                unsafe { sq.push(&e).ok()? };
            }
        }
        let mut got = 0;
        let mut ok = true;
        while got < n {
            ring.submit_and_wait(1).ok()?;
            for c in ring.completion() {
                ok &= c.result() == piece as i32;
                got += 1;
            }
        }
        ok.then(|| t.elapsed().as_nanos() as f64)
    }
}

// ------------------------------------------------------------------- gettid

fn gettid_calls(n: usize) -> Vec<Call> {
    (0..n)
        .map(|i| Call {
            num: libc::SYS_gettid as u32,
            args: [0; 6],
            user_data: i as u64,
        })
        .collect()
}

/// One ring batch: (wall ns, caller ns = submit + reap, excluding waiting).
/// `spin`: the requester spins on the CQ positions (touching no entry or
/// cell until everything is there) and reaps once; otherwise it sleeps in
/// `wait` and reaps as completions arrive.
fn ring_batch(
    a: &AsyncSyscall,
    calls: &[Call],
    out: &mut Vec<Completion>,
    spin: bool,
) -> Result<(f64, f64), Error> {
    out.clear();
    let n = calls.len();
    let t0 = Instant::now();
    let mut k = 0;
    while k < n {
        k += a.submit_batch(&calls[k..])?;
    }
    let mut caller = t0.elapsed().as_nanos() as f64;
    while out.len() < n {
        if spin {
            let want = (n - out.len()) as u32;
            let ts = Instant::now();
            while a.ring().completions_hint() < want {
                std::hint::spin_loop();
                if ts.elapsed() > Duration::from_millis(1) {
                    break; // e.g. a preempted exec thread: fall back to polling
                }
            }
            let t = Instant::now();
            a.poll_batch(out, usize::MAX);
            caller += t.elapsed().as_nanos() as f64;
        } else {
            a.wait(out, 1, Some(Duration::from_secs(10)))?;
        }
    }
    Ok((t0.elapsed().as_nanos() as f64, caller))
}

fn bench_gettid(args: &AsyncSyscallBenchOptions) -> Result<(Value, String), BoxErr> {
    let reps = if args.quick { 30 } else { 200 };
    let step = if args.quick { 40 } else { 20 };
    let ns: Vec<usize> = (0..=400).step_by(step).collect();
    // Ring as in usnet: exec thread spins a little before sleeping and
    // claims up to 64 requests per SQ pop.
    let spin_opts = AsyncOptions {
        requester_wait: WaitPolicy::default(),
        exec: ExecOptions {
            batch: 64,
            wait: WaitPolicy::default(),
        },
    };
    let mut spin = AsyncSyscall::with_options(1, 512, spin_opts)?;
    // Ring as in the document: the exec thread sleeps until woken.
    let sleep_opts = AsyncOptions {
        requester_wait: WaitPolicy::SLEEP,
        exec: ExecOptions {
            batch: 64,
            wait: WaitPolicy::SLEEP,
        },
    };
    let mut sleep = AsyncSyscall::with_options(1, 512, sleep_opts)?;
    // Requester on CPU 0, the exec thread on CPU 1: pinned through the ring
    // itself (sched_setaffinity(0, ..) is thread-specific, so it acts on the
    // exec thread that runs it). Unpinned, a loaded 2-CPU machine often
    // puts both on one CPU and the ring then measures the scheduler.
    let two_cpus = std::thread::available_parallelism()
        .map(|n| n.get() >= 2)
        .unwrap_or(false);
    let old_mask = if two_cpus { set_affinity(1) } else { None };
    let cpu1: u64 = 2;
    let pinned = old_mask.is_some()
        && [&spin, &sleep].iter().all(|a| {
            matches!(
                a.call_sync(
                    libc::SYS_sched_setaffinity,
                    [0, 8, &cpu1 as *const u64 as u64, 0, 0, 0]
                ),
                Ok(0)
            )
        });
    let mut uring = Uring::new(512);
    let mut out = Vec::with_capacity(512);
    let mut rows = Vec::new();
    let mut t = Table::new(
        "Figure 8: N x gettid per batch (median, us)",
        [
            "N",
            "direct",
            "ring spin",
            "ring sleep",
            "caller cost",
            "io_uring NOP",
        ]
        .map(String::from)
        .to_vec(),
    );
    for &n in &ns {
        let calls = gettid_calls(n);
        let (mut d, mut rs, mut rl, mut cc, mut un) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let t0 = Instant::now();
            for _ in 0..n {
                std::hint::black_box(run_syscall(libc::SYS_gettid, [0; 6]));
            }
            d.push(t0.elapsed().as_nanos() as f64);
            let (w, c) = ring_batch(&spin, &calls, &mut out, true)?;
            if let Some(c0) = out.first() {
                assert!(
                    c0.result > 0,
                    "gettid through the ring failed: {}",
                    c0.result
                );
            }
            rs.push(w);
            cc.push(c);
            rl.push(ring_batch(&sleep, &calls, &mut out, false)?.0);
            if let Some(v) = uring.nops(n) {
                un.push(v);
            }
        }
        let row = json!({
            "n": n,
            "direct_ns": median_of(d),
            "ring_spin_ns": median_of(rs),
            "ring_sleep_ns": median_of(rl),
            "ring_caller_ns": median_of(cc),
            "io_uring_nop_ns": if un.is_empty() { Value::Null } else { json!(median_of(un)) },
        });
        let f = |k: &str| row[k].as_f64().map(us).unwrap_or_else(|| "n/a".into());
        t.row(vec![
            n.to_string(),
            f("direct_ns"),
            f("ring_spin_ns"),
            f("ring_sleep_ns"),
            f("ring_caller_ns"),
            f("io_uring_nop_ns"),
        ]);
        rows.push(row);
    }
    spin.exit(ExitMode::Drain);
    sleep.exit(ExitMode::Drain);
    if let Some(m) = old_mask {
        set_affinity(m);
    }
    t.print();
    let break_even = |key: &str| {
        rows.iter()
            .filter(|r| r["n"].as_u64().unwrap_or(0) > 0)
            .find(|r| r[key].as_f64().unwrap_or(f64::MAX) <= r["direct_ns"].as_f64().unwrap_or(0.0))
            .map(|r| r["n"].as_u64().unwrap_or(0))
    };
    let be_wall = break_even("ring_spin_ns");
    let be_sleep = break_even("ring_sleep_ns");
    let be_caller = break_even("ring_caller_ns");
    let per_call = |key: &str| {
        let last = rows.last().unwrap();
        last[key].as_f64().unwrap_or(f64::NAN) / last["n"].as_f64().unwrap_or(1.0)
    };
    let show = |b: Option<u64>| {
        b.map(|v| v.to_string())
            .unwrap_or_else(|| "none <= 400".into())
    };
    let mut s = Table::new("Figure 8 summary", vec!["metric".into(), "value".into()]);
    s.row(vec![
        "break-even N, wall time, ring spin".into(),
        show(be_wall),
    ]);
    s.row(vec![
        "break-even N, wall time, ring sleep".into(),
        show(be_sleep),
    ]);
    s.row(vec!["break-even N, caller cost".into(), show(be_caller)]);
    for (k, name) in [
        ("direct_ns", "ns/call direct"),
        ("ring_spin_ns", "ns/call ring spin"),
        ("ring_sleep_ns", "ns/call ring sleep"),
        ("ring_caller_ns", "ns/call caller cost"),
        ("io_uring_nop_ns", "ns/call io_uring NOP"),
    ] {
        s.row(vec![
            format!("{name} (N=400)"),
            format!("{:.1}", per_call(k)),
        ]);
    }
    s.print();
    let series = |key: &str, name: &str| {
        Series::new(
            name,
            rows.iter()
                .filter_map(|r| Some((r["n"].as_f64()?, r[key].as_f64()? / 1e3)))
                .collect(),
        )
    };
    line_plot(
        &args.out.join("fig8_gettid.png"),
        "N x gettid per batch: direct vs ring (1 exec thread)",
        "N (calls per batch)",
        "time per batch (us)",
        &[
            series("direct_ns", "direct syscall"),
            series("ring_spin_ns", "ring, exec spins then sleeps"),
            series("ring_sleep_ns", "ring, exec sleeps (document)"),
            series("ring_caller_ns", "ring, caller's own cost"),
            series("io_uring_nop_ns", "io_uring NOP (kernel ring floor)"),
        ],
        false,
    )?;
    let v = json!({
        "reps": reps,
        "pinned_cpu0_cpu1": pinned,
        "rows": rows,
        "break_even_wall_spin": be_wall,
        "break_even_wall_sleep": be_sleep,
        "break_even_caller": be_caller,
        "io_uring_available": uring.0.is_some(),
    });
    Ok((v, t.to_markdown() + "\n" + &s.to_markdown() + "\n"))
}

// --------------------------------------------------------------------- read

fn bench_read(args: &AsyncSyscallBenchOptions) -> Result<(Value, String), BoxErr> {
    const SIZE: usize = 10_000_000;
    const PIECE: usize = 100_000;
    let reps = if args.quick { 10 } else { 40 };
    let dir = args
        .tmpfs_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/dev/shm"));
    let dir = if dir.is_dir() {
        dir
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("usnet-bench-read-{}", std::process::id()));
    let data: Vec<u8> = (0..SIZE)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[3])
        .collect();
    std::fs::write(&path, &data)?;
    let file = std::fs::File::open(&path)?;
    let _ = std::fs::remove_file(&path); // stays readable through `file`
    let fd = file.as_raw_fd();
    let mut buf = vec![1u8; SIZE]; // touched: no page faults in the timing
    let n = SIZE / PIECE;
    let mut results: Vec<(String, f64)> = Vec::new();

    let direct: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                let r = run_syscall(
                    libc::SYS_pread64,
                    [
                        fd as u64,
                        buf[i * PIECE..].as_mut_ptr() as u64,
                        PIECE as u64,
                        (i * PIECE) as u64,
                        0,
                        0,
                    ],
                );
                assert_eq!(r, PIECE as i64);
            }
            t.elapsed().as_nanos() as f64
        })
        .collect();
    assert!(buf == data, "direct read mismatch");
    results.push(("direct".into(), median_of(direct)));

    let mut out = Vec::with_capacity(n);
    for threads in 1..=8 {
        buf.fill(1);
        // The requester sleeps (it would otherwise take a core from the exec
        // threads); idle exec threads spin only briefly.
        let opts = AsyncOptions {
            requester_wait: WaitPolicy::SLEEP,
            exec: ExecOptions {
                batch: 1,
                wait: WaitPolicy {
                    max_spin: Duration::from_micros(10),
                    adaptive: true,
                },
            },
        };
        let mut a = AsyncSyscall::with_options(threads, 128, opts)?;
        let calls: Vec<Call> = (0..n)
            .map(|i| Call {
                num: libc::SYS_pread64 as u32,
                args: [
                    fd as u64,
                    buf[i * PIECE..].as_mut_ptr() as u64,
                    PIECE as u64,
                    (i * PIECE) as u64,
                    0,
                    0,
                ],
                user_data: i as u64,
            })
            .collect();
        let mut times = Vec::new();
        for _ in 0..reps {
            let (w, _) = ring_batch(&a, &calls, &mut out, false)?;
            assert!(
                out.iter().all(|c| c.result == PIECE as i64),
                "ring read failed"
            );
            times.push(w);
        }
        a.exit(ExitMode::Drain);
        assert!(buf == data, "ring read mismatch");
        results.push((format!("ring {threads} exec"), median_of(times)));
    }

    let mut uring = Uring::new(128);
    for (async_, name) in [(false, "io_uring"), (true, "io_uring ASYNC")] {
        buf.fill(1);
        let times: Vec<f64> = (0..reps)
            .filter_map(|_| uring.reads(fd, &mut buf, PIECE, async_))
            .collect();
        if times.len() == reps {
            assert!(buf == data, "io_uring read mismatch");
            results.push((name.into(), median_of(times)));
        }
    }

    let base = results[0].1;
    let one = results[1].1;
    let mut t = Table::new(
        "Figure 9: read 10 MB (tmpfs) as 100 x 100 KB pread (median)",
        ["variant", "ms", "vs direct", "vs ring 1"]
            .map(String::from)
            .to_vec(),
    );
    for (name, v) in &results {
        t.row(vec![
            name.clone(),
            format!("{:.3}", v / 1e6),
            format!("{:.2}x", base / v),
            format!("{:.2}x", one / v),
        ]);
    }
    t.print();
    bar_plot(
        &args.out.join("fig9_read.png"),
        "10 MB tmpfs read, 100 x 100 KB: time (lower is better)",
        "ms",
        &results
            .iter()
            .map(|(k, v)| (k.clone(), v / 1e6))
            .collect::<Vec<_>>(),
    )?;
    let v = json!({
        "reps": reps,
        "file_dir": dir.display().to_string(),
        "median_ns": results.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "two_exec_faster_than_one": results[2].1 < results[1].1,
    });
    Ok((v, t.to_markdown() + "\n"))
}

// ---------------------------------------------------------------- transport

static PIN_CHILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn pin_arg() -> &'static str {
    if PIN_CHILD.load(std::sync::atomic::Ordering::Relaxed) {
        "cpu1"
    } else {
        "any"
    }
}

fn echo_call(i: u64) -> Call {
    Call {
        num: (i % 300) as u32,
        args: [i, i ^ 0x55, 0, 0, 0, i.rotate_left(7)],
        user_data: i,
    }
}

fn check(c: &Completion) {
    let i = c.user_data;
    let want = echo_result(&Request {
        index: 0,
        num: (i % 300) as u32,
        args: echo_call(i).args,
    });
    assert_eq!(c.result, want, "transport result mismatch for {i}");
}

/// The exec peer process: killed if the run ends early (it would serve the ring
/// forever), and given a deadline to exit after `Ring::exit`.
struct PeerChild(std::process::Child);

impl PeerChild {
    fn finish(&mut self) -> Result<(), BoxErr> {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.0.try_wait()? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("ring peer failed: {st}").into())
                };
            }
            if Instant::now() >= end {
                return Err("ring peer did not exit within 10 s of the ring's exit".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for PeerChild {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            crate::kill_and_reap(&mut self.0, Duration::from_secs(5));
        }
    }
}

fn throughput(batch: usize, total: u64, spin: bool) -> Result<f64, BoxErr> {
    let policy = if spin {
        WaitPolicy::SPIN
    } else {
        WaitPolicy::default()
    };
    let ring = Ring::with_policy(1024, policy)?;
    let mode = if spin { "spin" } else { "adaptive" };
    let mut child = PeerChild(spawn_child(
        &ring,
        "echo",
        &format!("{mode}:{}:{}", batch.min(64), pin_arg()),
        &[],
    )?);
    let mut out = Vec::with_capacity(1024);
    let mut calls = Vec::with_capacity(batch);
    let depth = (4 * batch as u32).clamp(batch as u32, 1024);
    // Warm-up: first round trip waits for the child to start.
    ring.submit(&echo_call(0))?;
    check(&ring.wait_one(Some(Duration::from_secs(10)))?);
    let (mut next, mut done) = (1u64, 0u64);
    let t = Instant::now();
    while done < total {
        if next <= total && ring.in_flight() + batch as u32 <= depth {
            calls.clear();
            calls.extend((next..(next + batch as u64).min(total + 1)).map(echo_call));
            let mut k = 0;
            while k < calls.len() {
                match ring.submit_batch(&calls[k..]) {
                    Ok(m) => k += m,
                    Err(Error::Full) => {
                        ring.poll_batch(&mut out, usize::MAX);
                        if t.elapsed() > Duration::from_secs(60) {
                            return Err("transport throughput run took more than 60 s".into());
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            next += calls.len() as u64;
        }
        ring.poll_batch(&mut out, usize::MAX);
        done += out.len() as u64;
        for c in out.drain(..) {
            check(&c);
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err("transport throughput run took more than 60 s".into());
        }
    }
    let ops = total as f64 / t.elapsed().as_secs_f64();
    ring.exit(ExitMode::Drain);
    child.finish()?;
    Ok(ops)
}

fn latency(samples: usize, policy: WaitPolicy) -> Result<Vec<f64>, BoxErr> {
    let ring = Ring::with_policy(64, policy)?;
    let mode = if policy == WaitPolicy::SPIN {
        "spin"
    } else if policy == WaitPolicy::SLEEP {
        "sleep"
    } else {
        "adaptive"
    };
    let mut child = PeerChild(spawn_child(
        &ring,
        "echo",
        &format!("{mode}:1:{}", pin_arg()),
        &[],
    )?);
    ring.submit(&echo_call(0))?;
    check(&ring.wait_one(Some(Duration::from_secs(10)))?);
    let mut lat = Vec::with_capacity(samples);
    for i in 0..(samples + samples / 10) as u64 {
        let t = Instant::now();
        ring.submit(&echo_call(i))?;
        let c = ring.wait_one(Some(Duration::from_secs(10)))?;
        let dt = t.elapsed().as_nanos() as f64;
        check(&c);
        if i >= (samples / 10) as u64 {
            lat.push(dt); // first 10% are warm-up
        }
    }
    ring.exit(ExitMode::Drain);
    child.finish()?;
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

/// Pin the calling thread to the CPUs in `mask` (bit i = CPU i); returns
/// the previous mask. Via the raw system call (no libc wrapper needed).
fn set_affinity(mask: u64) -> Option<u64> {
    let mut old = 0u64;
    let r = run_syscall(
        libc::SYS_sched_getaffinity,
        [0, 8, &mut old as *mut u64 as u64, 0, 0, 0],
    );
    if r < 0 {
        return None;
    }
    let r = run_syscall(
        libc::SYS_sched_setaffinity,
        [0, 8, &mask as *const u64 as u64, 0, 0, 0],
    );
    (r == 0).then_some(old)
}

fn bench_transport(args: &AsyncSyscallBenchOptions) -> Result<(Value, String), BoxErr> {
    // Requester on CPU 0, peer on CPU 1 (the child pins itself): two
    // spinning processes sharing one CPU would measure the scheduler.
    let pinned = std::thread::available_parallelism()
        .map(|n| n.get() >= 2)
        .unwrap_or(false);
    let old_mask = if pinned { set_affinity(1) } else { None };
    let r = bench_transport_inner(args, old_mask.is_some());
    if let Some(m) = old_mask {
        set_affinity(m);
    }
    r
}

fn bench_transport_inner(
    args: &AsyncSyscallBenchOptions,
    pinned: bool,
) -> Result<(Value, String), BoxErr> {
    PIN_CHILD.store(pinned, std::sync::atomic::Ordering::Relaxed);
    let total: u64 = if args.quick { 200_000 } else { 2_000_000 };
    let mut tp = Table::new(
        "Ring transport between two processes: throughput",
        [
            "batch",
            "wait",
            "Mops/s (median of 3)",
            "ns/op",
            "best Mops/s",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut tp_json = Vec::new();
    let mut bars = Vec::new();
    for batch in [1usize, 8, 32, 128] {
        for spin in [true, false] {
            let mut runs = (0..3)
                .map(|_| throughput(batch, total / 3, spin))
                .collect::<Result<Vec<_>, _>>()?;
            runs.sort_by(f64::total_cmp);
            let (ops, best) = (runs[1], runs[2]);
            let wait = if spin { "spin" } else { "spin-then-futex" };
            tp.row(vec![
                batch.to_string(),
                wait.into(),
                format!("{:.2}", ops / 1e6),
                format!("{:.0}", 1e9 / ops),
                format!("{:.2}", best / 1e6),
            ]);
            tp_json.push(json!({"batch": batch, "wait": wait, "ops_per_s_median": ops, "ops_per_s_runs": runs}));
            bars.push((
                format!("b{batch} {}", if spin { "spin" } else { "adapt" }),
                ops / 1e6,
            ));
        }
    }
    tp.print();
    bar_plot(
        &args.out.join("transport_throughput.png"),
        "Two-process ring throughput",
        "Mops/s",
        &bars,
    )?;

    let samples = if args.quick { 20_000 } else { 200_000 };
    let mut lt = Table::new(
        "Ring transport between two processes: round-trip latency (us)",
        ["wait policy", "samples", "p50", "p90", "p99", "p99.9"]
            .map(String::from)
            .to_vec(),
    );
    let mut lat_json = serde_json::Map::new();
    let mut spin_lat = Vec::new();
    for (name, policy, n) in [
        ("spin", WaitPolicy::SPIN, samples),
        (
            "spin-then-futex (default)",
            WaitPolicy::default(),
            samples / 4,
        ),
        ("futex sleep", WaitPolicy::SLEEP, samples / 20),
    ] {
        let lat = latency(n, policy)?;
        let p = |q: f64| percentile(&lat, q);
        lt.row(vec![
            name.into(),
            lat.len().to_string(),
            us(p(50.0)),
            us(p(90.0)),
            us(p(99.0)),
            us(p(99.9)),
        ]);
        lat_json.insert(
            name.into(),
            json!({"samples": lat.len(), "p50_ns": p(50.0), "p90_ns": p(90.0), "p99_ns": p(99.0), "p999_ns": p(99.9)}),
        );
        if policy == WaitPolicy::SPIN {
            spin_lat = lat;
        }
    }
    lt.print();
    // Histogram of the spinning round trips up to p99.
    let hi = percentile(&spin_lat, 99.0).max(1.0);
    let width = (hi / 40.0).max(1.0);
    let mut buckets: Vec<(f64, u64)> = (0..40).map(|i| (i as f64 * width, 0)).collect();
    for &v in &spin_lat {
        let b = ((v / width) as usize).min(39);
        buckets[b].1 += 1;
    }
    histogram_plot(
        &args.out.join("transport_latency_hist.png"),
        "Two-process round trip, both sides spinning (last bucket: >= p99)",
        "ns",
        &buckets,
    )?;
    let v = json!({"total_ops": total, "pinned_cpu0_cpu1": pinned, "throughput": tp_json, "latency": lat_json});
    Ok((v, tp.to_markdown() + "\n" + &lt.to_markdown() + "\n"))
}
