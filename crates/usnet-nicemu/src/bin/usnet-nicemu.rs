//! Stand-alone front end of this crate (the `usnet` binary wires the same functions as
//! `usnet nicemu` and `usnet bench nic`). Accepts the same subcommand names, so the
//! benchmark can re-exec whichever binary it runs in.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "usnet-nicemu",
    about = "usnet emulated NIC: device side and benchmark"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Play the NIC hardware for a usnet driver.
    Nicemu(usnet_nicemu::NicemuArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// The emulated-NIC measurements of source document 3.
    Nic(usnet_nicemu::NicBenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Nicemu(a) => usnet_nicemu::run_device(&a),
        Cmd::Bench {
            which: BenchCmd::Nic(a),
        } => usnet_nicemu::run_bench(&a),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
