//! `usnet bench ...`: the command-line arguments of the benchmarks. The benchmarks
//! themselves live in usnet-bench and take plain option structs; this module owns the
//! flags and converts.

use std::path::PathBuf;

use clap::Args;
use usnet_bench::async_syscall::AsyncSyscallBenchOptions;

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
