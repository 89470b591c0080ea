//! Stand-alone runner of `usnet bench async-syscall` (same code as the CLI):
//! `cargo run --release -p usnet-ring --example async_syscall_bench -- --quick`
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: usnet_ring::bench::AsyncSyscallBenchArgs,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    usnet_ring::maybe_run_child();
    usnet_ring::bench::run(&Cli::parse().args)
}
