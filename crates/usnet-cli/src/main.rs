//! `usnet`: the one entry point for users.

mod bench;
mod ctl;
mod demo;
mod get;
mod httpd;
mod nicemu;
mod perf;
mod run;
mod shim;
mod up;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "usnet",
    version,
    about = "A userspace TCP/IP stack and the tools to measure it against Linux"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring a stack up on a link and run until interrupted.
    Up(Box<up::UpArgs>),
    /// Stop a running stack.
    Down(ctl::StackSel),
    /// Send ICMP echo requests from a running stack and print round-trip times.
    Ping(ctl::PingArgs),
    /// Print the counters of a running stack (like `netstat -s`).
    Stat(ctl::StatArgs),
    /// List the client processes attached to a running stack and their sockets
    /// (like `ss -p`).
    Clients(ctl::ClientsArgs),
    /// Two stacks on a shared-memory link, no root needed: ping, UDP echo, summary.
    Demo(demo::DemoArgs),
    /// Bulk TCP transfer with every byte checked; either end usnet or Linux (--kernel).
    Perf(perf::PerfArgs),
    /// Fetch an http:// URL (IP literal) through a usnet stack; print size and SHA-256.
    Get(get::GetArgs),
    /// Run an unmodified program with its IPv4/IPv6 sockets on a stack server
    /// (LD_PRELOAD shim): `usnet run [--stack NAME] -- CMD ARGS...`.
    Run(run::RunArgs),
    /// The shim where the dynamic loader takes it in its secure mode too
    /// (set-user-ID programs, workers exec'd with a dropped effective uid):
    /// `usnet shim [status|install|remove]`.
    Shim(shim::ShimArgs),
    /// A phttpd-like HTTP/1.1 server (every request gets the same response) on Linux
    /// sockets (--api kernel) or on a usnet stack in its own thread (--api socket).
    Httpd(Box<httpd::HttpdArgs>),
    /// Play the emulated NIC's device side: build frames, place them in the RX ring
    /// and raise interrupts at a chosen interval and count.
    Nicemu(nicemu::NicemuArgs),
    /// Benchmarks against Linux on this machine.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// UDP packets/s over the shm link vs Linux loopback (send/recv and sendmmsg/recvmmsg).
    Udp(bench::UdpArgs),
    /// TCP bulk throughput and request/response latency: usnet over shm and TAP vs
    /// Linux over loopback and veth.
    Tcp(bench::TcpArgs),
    /// The stack server: write_server → read_client through the server, in-process,
    /// Linux and the rpc baseline (MCLBYTES × MCLNUM), plus the cost of one call.
    Server(bench::ServerArgs),
    /// The emulated NIC: delivery cost, interrupt interval accuracy, lossless rate.
    Nic(bench::NicBenchArgs),
    /// Asynchronous system calls through shared-memory rings vs direct calls and io_uring.
    AsyncSyscall(bench::AsyncSyscallArgs),
    /// Unmodified programs: nginx (wrk), redis (redis-benchmark) and iperf3 on the
    /// Linux kernel vs on a stack server through the LD_PRELOAD shim (`usnet run`),
    /// over a veth (root).
    Preload(bench::PreloadArgs),
    /// usnet httpd (--api kernel, and --api socket on AF_PACKET, AF_XDP and TAP) vs
    /// nginx on Linux, wrk -c100 from a namespace, 151 B / 4 KiB / 64 KiB responses (root).
    Httpd(bench::HttpdArgs),
    /// Many cores: usnet httpd --shards N (socket and zero-copy, AF_PACKET fanout) vs
    /// nginx with N workers, N = 1 .. the cores, wrk -tN from a namespace (root).
    Shards(bench::ShardsArgs),
    /// Memory per idle established TCP connection: usnet's heap against Linux's
    /// slab and socket buffers, at several connection counts (root for 100k
    /// descriptors).
    Conns(bench::ConnsArgs),
    /// Priority-aware receive: a UDP burst to several receivers under CPU load, with
    /// forced drop and priority control on and off, vs Linux.
    Prio(bench::PrioArgs),
    /// A soak with faults: nginx, redis, iperf3 and usnet clients at once through
    /// one stack server over a lossy link, clients killed and restarted (root).
    Soak(bench::SoakArgs),
}

fn main() -> ExitCode {
    // A process a benchmark started as its peer (the ring's exec peer, the emulated
    // NIC's device side, a udp/tcp bench end) runs that role and exits.
    usnet_async_syscall::maybe_run_child();
    usnet_nicemu::maybe_run_child();
    usnet_bench::peer::maybe_run_peer();
    usnet_server::privs::maybe_run_janitor();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Up(a) => up::run(*a),
        Cmd::Down(a) => ctl::down(a),
        Cmd::Ping(a) => ctl::ping(a),
        Cmd::Stat(a) => ctl::stat(a),
        Cmd::Clients(a) => ctl::clients(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Perf(a) => perf::run(a),
        Cmd::Get(a) => get::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Shim(a) => shim::run(a),
        Cmd::Httpd(a) => httpd::run(*a),
        Cmd::Bench(BenchCmd::Udp(a)) => usnet_bench::udp::run(&a.into()),
        Cmd::Bench(BenchCmd::Tcp(a)) if a.wan => {
            usnet_bench::wan::run(&a.wan_options()).map_err(|e| e.to_string().into())
        }
        Cmd::Bench(BenchCmd::Tcp(a)) => usnet_bench::tcp::run(&a.into()),
        Cmd::Bench(BenchCmd::Server(a)) => usnet_bench::server::run(&a.into()),
        Cmd::Bench(BenchCmd::Preload(a)) => usnet_bench::preload::run(&a.into()),
        Cmd::Bench(BenchCmd::Httpd(a)) => usnet_bench::httpd::run(&a.into()),
        Cmd::Bench(BenchCmd::Shards(a)) => usnet_bench::shards::run(&a.into()),
        Cmd::Bench(BenchCmd::Conns(a)) => {
            usnet_bench::conns::run(&a.into()).map(|()| ExitCode::SUCCESS)
        }
        Cmd::Bench(BenchCmd::Prio(a)) => usnet_bench::prio::run(&a.into()),
        Cmd::Bench(BenchCmd::Soak(a)) => usnet_bench::soak::run(&a.into()),
        Cmd::Nicemu(a) => usnet_nicemu::run_device(&a.into()).map(|()| ExitCode::SUCCESS),
        Cmd::Bench(BenchCmd::Nic(a)) => {
            usnet_bench::nic::run_bench(&a.into()).map(|()| ExitCode::SUCCESS)
        }
        Cmd::Bench(BenchCmd::AsyncSyscall(a)) => {
            usnet_bench::async_syscall::run(&a.into()).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("usnet: {e}");
            ExitCode::FAILURE
        }
    }
}

pub type CmdResult = Result<ExitCode, Box<dyn std::error::Error>>;
