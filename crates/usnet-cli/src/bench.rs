//! `usnet bench ...`: the command-line arguments of the benchmarks. The benchmarks
//! themselves live in usnet-bench and take plain option structs; this module owns the
//! flags and converts.

use std::path::PathBuf;

use clap::Args;
use usnet_bench::async_syscall::AsyncSyscallBenchOptions;
use usnet_bench::nic::NicBenchOptions;

/// `usnet bench async-syscall`.
#[derive(Args, Debug, Clone)]
pub struct AsyncSyscallArgs {
    /// Output directory for JSON, Markdown and plots.
    #[arg(long, default_value = "bench-out/async-syscall")]
    pub out: PathBuf,
    /// Fewer repetitions and samples (a smoke run, ~10 s).
    #[arg(long)]
    pub quick: bool,
    /// Which parts to run: gettid, read, transport (default: all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Directory on tmpfs for the read test (default /dev/shm).
    #[arg(long)]
    pub tmpfs_dir: Option<PathBuf>,
}

impl From<AsyncSyscallArgs> for AsyncSyscallBenchOptions {
    fn from(a: AsyncSyscallArgs) -> Self {
        AsyncSyscallBenchOptions {
            out: a.out,
            quick: a.quick,
            only: a.only,
            tmpfs_dir: a.tmpfs_dir,
        }
    }
}

/// `usnet bench nic`.
#[derive(Args, Debug, Clone)]
pub struct NicBenchArgs {
    /// Output directory for tables, JSON and plots.
    #[arg(long, default_value = "bench-out/nic")]
    pub out: PathBuf,
    /// Runs per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Fewer packets, runs and cycles: a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Skip the TAP contrast of experiment 2 (needs root).
    #[arg(long)]
    pub no_tap: bool,
    /// Run the stack side and the device side in SCHED_FIFO (real-time), so that other
    /// load on the machine cannot preempt them (root).
    #[arg(long)]
    pub rt: bool,
    /// Only these experiments (1, 2, 3); default all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<u32>,
}

impl From<NicBenchArgs> for NicBenchOptions {
    fn from(a: NicBenchArgs) -> Self {
        NicBenchOptions {
            out: a.out,
            runs: a.runs,
            quick: a.quick,
            no_tap: a.no_tap,
            rt: a.rt,
            only: a.only,
        }
    }
}
