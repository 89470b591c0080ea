//! `usnet bench ...`: the command-line arguments of the benchmarks. The benchmarks
//! themselves live in usnet-bench and take plain option structs; this module owns the
//! flags and converts.

use std::path::PathBuf;

use clap::Args;
use usnet_bench::async_syscall::AsyncSyscallBenchOptions;
use usnet_bench::nic::NicBenchOptions;
use usnet_bench::prio::PrioBenchOptions;
use usnet_bench::tcp::TcpBenchOptions;
use usnet_bench::udp::UdpBenchOptions;

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
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=3))]
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

/// `usnet bench udp`.
#[derive(Args, Debug, Clone)]
pub struct UdpArgs {
    /// Directory for udp.json, udp.md and udp.png.
    #[arg(long, default_value = "bench-out/udp")]
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds the sender sends per run.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Datagram payload sizes.
    #[arg(long, value_delimiter = ',', default_value = "64,1472")]
    pub sizes: Vec<usize>,
    /// One short run per configuration (for CI smoke tests).
    #[arg(long)]
    pub quick: bool,
    /// Only these configurations: usnet-shm, linux-lo, linux-lo-mmsg, linux-veth,
    /// usnet-tap-tx, usnet-tap-rx, usnet-afp-tx, usnet-afp-rx, usnet-xdp-tx,
    /// usnet-xdp-rx (default: all that can run; the link ones need root).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip the configurations that need root (TAP, veth, AF_PACKET, AF_XDP).
    #[arg(long)]
    pub no_root: bool,
}

impl From<UdpArgs> for UdpBenchOptions {
    fn from(a: UdpArgs) -> Self {
        UdpBenchOptions {
            out: a.out,
            runs: a.runs,
            seconds: a.seconds,
            sizes: a.sizes,
            quick: a.quick,
            only: a.only,
            no_root: a.no_root,
        }
    }
}

/// `usnet bench prio`.
#[derive(Args, Debug, Clone)]
pub struct PrioArgs {
    /// Directory for prio.json, prio.md and the plots.
    #[arg(long, default_value = "bench-out/prio")]
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Datagrams the sender bursts per run.
    #[arg(long, default_value_t = 50_000)]
    pub datagrams: u64,
    /// Receiving threads (the first is Q).
    #[arg(long, default_value_t = 4)]
    pub receivers: usize,
    /// Payload bytes per datagram.
    #[arg(long, default_value_t = 512)]
    pub size: usize,
    /// Busy threads loading the cores during a run (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    pub load: usize,
    /// Microseconds of work a receiver does per datagram.
    #[arg(long, default_value_t = 10)]
    pub work_us: u64,
    /// Q's nice value.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub q_nice: i32,
    /// The other receivers' nice value.
    #[arg(long, default_value_t = 5, allow_hyphen_values = true)]
    pub other_nice: i32,
    /// Priority set size n.
    #[arg(long, default_value_t = 2)]
    pub set_size: usize,
    /// Forced drop's probability.
    #[arg(long, default_value_t = 0.9)]
    pub drop_probability: f64,
    /// Nice steps of a boost.
    #[arg(long, default_value_t = 10)]
    pub boost: i32,
    /// The receiving stack's input queue (drop 1 beyond).
    #[arg(long, default_value_t = 1000)]
    pub input_queue: usize,
    /// Frames the receiving stack processes per turn.
    #[arg(long, default_value_t = 64)]
    pub rx_budget: usize,
    /// Datagrams per second the sender keeps to (0: as fast as it can).
    #[arg(long, default_value_t = 200_000)]
    pub rate: u64,
    /// The policy's interval (ms): activation checks and boosts at most this often.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// usnet receivers take up to 64 queued datagrams per lock of the runtime (as
    /// recvmmsg does) instead of one per recv_from.
    #[arg(long)]
    pub batch: bool,
    /// One short run per configuration (10,000 datagrams).
    #[arg(long)]
    pub quick: bool,
    /// Skip the Linux contrast.
    #[arg(long)]
    pub no_linux: bool,
    /// As root, also run the four configurations with Linux bursting at usnet
    /// through a TAP.
    #[arg(long)]
    pub tap: bool,
    /// Receivers as threads of an in-process runtime (default: client processes of
    /// a stack server, as in the document).
    #[arg(long)]
    pub threads: bool,
    /// Nice value of the stack server's loop and the sender: protocol work gets the
    /// precedence the kernel's softirq has ("inherit": none).
    #[arg(long, default_value = "-10", allow_hyphen_values = true, value_parser = parse_stack_nice)]
    pub stack_nice: StackNice,
    /// A boost ends once its queue is below a quarter and nothing arrived for this
    /// long (ms).
    #[arg(long, default_value_t = 20)]
    pub boost_quiet_ms: u64,
}

/// `--stack-nice`: a nice value, or none ("inherit").
#[derive(Debug, Clone, Copy)]
pub struct StackNice(Option<i32>);

fn parse_stack_nice(s: &str) -> Result<StackNice, String> {
    if s == "inherit" {
        return Ok(StackNice(None));
    }
    match s.parse::<i32>() {
        Ok(n) if (-20..=19).contains(&n) => Ok(StackNice(Some(n))),
        _ => Err(format!("'{s}': a nice value (-20..19) or 'inherit'")),
    }
}

impl From<PrioArgs> for PrioBenchOptions {
    fn from(a: PrioArgs) -> Self {
        PrioBenchOptions {
            out: a.out,
            runs: a.runs.max(1),
            datagrams: a.datagrams,
            receivers: a.receivers,
            size: a.size,
            load: a.load,
            work_us: a.work_us,
            q_nice: a.q_nice,
            other_nice: a.other_nice,
            policy: usnet_stack::RxPolicy {
                set_size: a.set_size.max(1),
                drop_probability: a.drop_probability.clamp(0.0, 1.0),
                boost: a.boost,
                interval: std::time::Duration::from_millis(a.interval_ms.max(1)),
                drain_quiet: std::time::Duration::from_millis(a.boost_quiet_ms),
                ..usnet_stack::RxPolicy::default()
            },
            input_queue: a.input_queue.max(1),
            rx_budget: a.rx_budget.max(1),
            rate: a.rate,
            batch: a.batch,
            quick: a.quick,
            no_linux: a.no_linux,
            tap: a.tap,
            threads: a.threads,
            stack_nice: a.stack_nice.0,
        }
    }
}

/// `usnet bench tcp`.
#[derive(Args, Debug, Clone)]
pub struct TcpArgs {
    /// Directory for tcp.json, tcp.md, tcp.png and tcp-rr.png.
    #[arg(long, default_value = "bench-out/tcp")]
    pub out: PathBuf,
    /// Runs per configuration (the tables show medians).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Bulk message (write) sizes in bytes, multiples of 1024.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,16384,65536,1048576"
    )]
    pub sizes: Vec<usize>,
    /// Request/response message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub rr_sizes: Vec<usize>,
    /// One short run per configuration (for CI smoke tests, under a minute).
    #[arg(long)]
    pub quick: bool,
    /// Check every byte of the bulk streams (default: byte counts plus a stamp per KiB).
    #[arg(long)]
    pub verify: bool,
    /// Skip the configurations that need root (veth, TAP) even when root.
    #[arg(long)]
    pub no_root: bool,
    /// Only these configurations (comma-separated short names: usnet-shm, linux-lo,
    /// linux-veth, usnet-tap-tx, usnet-tap-rx, usnet-afp-tx, usnet-afp-rx, usnet-xdp-tx,
    /// usnet-xdp-rx).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip the request/response part.
    #[arg(long)]
    pub no_rr: bool,
    /// Skip the bulk part.
    #[arg(long)]
    pub no_bulk: bool,
    /// TAP without TCP segmentation offload (usnet sends MTU-sized frames and the
    /// kernel sends it MTU-sized frames), to measure what TSO/GSO brings.
    #[arg(long)]
    pub no_tso: bool,
    /// How long a usnet end on a TAP keeps polling its device after the last frame
    /// before it sleeps on it, in microseconds. On a machine with few cores a spinning
    /// end takes the core its Linux peer's kernel work needs; never sleeping is
    /// `--spin-us 1000000`. Ends on shm always poll.
    #[arg(long, default_value_t = TcpBenchOptions::default().spin_us)]
    pub spin_us: u64,
    /// usnet ends keep their connections' send and receive queues in pool buffers
    /// (`TcpConfig::zero_copy`, used through the copying calls): one copy fewer
    /// each way (docs/benchmarks.md, "Copies per payload byte").
    #[arg(long)]
    pub pool_buffers: bool,
    /// Pool buffer size of the usnet ends (2048, 4096, 9216 or 65536). By default
    /// 64 KiB on shm and on a TAP with TSO (one frame per buffer), 2 KiB elsewhere;
    /// `--buf-size 2048` on a TAP makes each GSO frame a chain, as `usnet up`'s
    /// default does.
    #[arg(long)]
    pub buf_size: Option<usize>,
    /// Slots per ring of the shm link between the usnet ends (a power of two,
    /// 2..=65536; default 512). With 64 KiB frames a ring's slots span slots × 64
    /// KiB of memory the frames cycle through.
    #[arg(long)]
    pub shm_slots: Option<usize>,
    /// Instead of the configurations above: bulk TCP over an emulated wide-area path
    /// (a bottleneck, delay and random loss; TAPs in two namespaces, root), usnet's
    /// controllers against Linux's (`--wan-cc`). Writes wan.json, wan.md, wan.png.
    #[arg(long)]
    pub wan: bool,
    /// The path's round-trip propagation delay, ms.
    #[arg(long, default_value_t = 50.0)]
    pub wan_rtt_ms: f64,
    /// The path's bottleneck rate, Mbit/s.
    #[arg(long, default_value_t = 100.0)]
    pub wan_mbit: f64,
    /// The path's random loss each way, percent.
    #[arg(long, default_value_t = 1.0)]
    pub wan_loss_percent: f64,
    /// The bottleneck's queue, ms at its rate.
    #[arg(long, default_value_t = 10.0)]
    pub wan_queue_ms: f64,
    /// Controllers to compare over the path (Linux names).
    #[arg(long, value_delimiter = ',', default_value = "bbr,cubic")]
    pub wan_cc: Vec<String>,
}

impl TcpArgs {
    /// The `--wan` comparison's options (`--seconds` default 3 becomes 10 there:
    /// a 50 ms path needs seconds to leave slow start behind).
    pub fn wan_options(&self) -> usnet_bench::wan::WanOptions {
        let seconds = if self.quick {
            3.0
        } else if self.seconds == 3.0 {
            10.0
        } else {
            self.seconds
        };
        usnet_bench::wan::WanOptions {
            out: if self.out == std::path::Path::new("bench-out/tcp") {
                PathBuf::from("bench-out/tcp-wan")
            } else {
                self.out.clone()
            },
            runs: if self.quick { 1 } else { self.runs },
            seconds,
            rtt: std::time::Duration::from_secs_f64(self.wan_rtt_ms / 1e3),
            rate_bps: (self.wan_mbit * 1e6) as u64,
            loss: self.wan_loss_percent / 100.0,
            queue: std::time::Duration::from_secs_f64(self.wan_queue_ms / 1e3),
            ccs: self.wan_cc.clone(),
        }
    }
}

impl From<TcpArgs> for TcpBenchOptions {
    fn from(a: TcpArgs) -> Self {
        TcpBenchOptions {
            out: a.out,
            runs: a.runs,
            seconds: a.seconds,
            sizes: a.sizes,
            rr_sizes: a.rr_sizes,
            quick: a.quick,
            verify: a.verify,
            no_root: a.no_root,
            only: a.only,
            no_rr: a.no_rr,
            no_bulk: a.no_bulk,
            no_tso: a.no_tso,
            spin_us: a.spin_us,
            pool_buffers: a.pool_buffers,
            buf_size: a.buf_size,
            shm_slots: a.shm_slots,
        }
    }
}

/// `usnet bench server`: the source document's client/server study.
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Directory for server.json, server.md, server.png and server-rpc.png.
    #[arg(long, default_value = "bench-out/server")]
    pub out: PathBuf,
    /// Runs per point (the tables show medians).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Seconds per run of the rpc baseline.
    #[arg(long, default_value_t = 0.5)]
    pub rpc_seconds: f64,
    /// Buffer sizes of write_server and read_client in bytes (multiples of 1024).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384,65536")]
    pub sizes: Vec<usize>,
    /// 64-byte request/response transactions per run.
    #[arg(long, default_value_t = 20000)]
    pub transactions: usize,
    /// Skip the rpc baseline study.
    #[arg(long)]
    pub no_rpc: bool,
    /// One short run per point (a smoke test).
    #[arg(long)]
    pub quick: bool,
    /// Only configurations whose name contains one of these (comma-separated, e.g.
    /// `server,in-process`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

impl From<ServerArgs> for usnet_bench::server::ServerBenchOptions {
    fn from(a: ServerArgs) -> Self {
        usnet_bench::server::ServerBenchOptions {
            out: a.out,
            sizes: a.sizes,
            runs: if a.quick { 1 } else { a.runs },
            seconds: if a.quick { 0.2 } else { a.seconds },
            rpc_seconds: if a.quick { 0.1 } else { a.rpc_seconds },
            transactions: if a.quick { 2000 } else { a.transactions },
            rpc: !a.no_rpc,
            only: a.only,
        }
    }
}

/// `usnet bench preload`: nginx, redis and iperf3 on the kernel vs under the
/// LD_PRELOAD shim.
#[derive(Args, Debug)]
pub struct PreloadArgs {
    /// Directory for preload.json, preload.md and preload.png.
    #[arg(long, default_value = "bench-out/preload")]
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Seconds per wrk run.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// wrk connections.
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Requests per redis-benchmark run and test (times 4 with -P 16).
    #[arg(long, default_value_t = 100_000)]
    pub redis_requests: usize,
    /// The stack server's busy-poll after its last work (`usnet up --spin-us`); it
    /// shares the servers' core, and yields it to them on each idle pass.
    #[arg(long, default_value_t = 50)]
    pub stack_spin_us: u64,
    /// The stack server keeps its connections' queues in pool buffers (`usnet up
    /// --pool-buffers`).
    #[arg(long)]
    pub pool_buffers: bool,
    /// Only these parts (comma-separated: nginx-151, nginx-64k, redis, iperf3,
    /// iperf3-R).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// How the programs on usnet reach it: the LD_PRELOAD shim, or the seccomp
    /// supervisor that carries static and Go programs (`usnet run --via`).
    #[arg(long, value_enum, default_value_t = BenchVia::Preload)]
    pub via: BenchVia,
    /// One short run per configuration (a smoke test).
    #[arg(long)]
    pub quick: bool,
}

/// `usnet bench preload --via`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum BenchVia {
    Preload,
    Seccomp,
}

impl From<PreloadArgs> for usnet_bench::preload::PreloadBenchOptions {
    fn from(a: PreloadArgs) -> Self {
        usnet_bench::preload::PreloadBenchOptions {
            out: a.out,
            runs: if a.quick { 1 } else { a.runs },
            seconds: if a.quick { 1.0 } else { a.seconds },
            connections: a.connections,
            redis_requests: if a.quick { 2000 } else { a.redis_requests },
            stack_spin_us: a.stack_spin_us,
            pool_buffers: a.pool_buffers,
            only: a.only,
            via: match a.via {
                BenchVia::Preload => usnet_bench::preload::Via::Preload,
                BenchVia::Seccomp => usnet_bench::preload::Via::Seccomp,
            },
        }
    }
}

/// `usnet bench httpd`: usnet httpd (kernel and socket APIs on AF_PACKET, AF_XDP and
/// TAP) vs nginx on Linux, driven by wrk from a namespace.
#[derive(Args, Debug)]
pub struct HttpdArgs {
    /// Directory for httpd.json, httpd.md and httpd.png.
    #[arg(long, default_value = "bench-out/httpd")]
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Seconds per wrk run.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// wrk connections.
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Response body lengths in bytes (64 makes the 151-byte response).
    #[arg(long, value_delimiter = ',', default_value = "64,4096,65536")]
    pub lengths: Vec<usize>,
    /// Only these servers: nginx, kernel, afpacket, xdp, tap, zc-afpacket,
    /// zc-client (the zero-copy server as a client of usnet up), zc-xdp, zc-tap
    /// (default: all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// usnet httpd --batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// usnet httpd --spin-us (socket api): poll this long before sleeping.
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// usnet httpd --buf-size for the servers on AF_PACKET and TAP (AF_XDP keeps
    /// 2048): a zero-copy piece is one buffer.
    #[arg(long, default_value_t = 2048)]
    pub buf_size: usize,
    /// One 1-second run per configuration (a smoke test).
    #[arg(long)]
    pub quick: bool,
}

impl From<HttpdArgs> for usnet_bench::httpd::HttpdBenchOptions {
    fn from(a: HttpdArgs) -> Self {
        usnet_bench::httpd::HttpdBenchOptions {
            out: a.out,
            runs: if a.quick { 1 } else { a.runs.max(1) },
            seconds: if a.quick { 1.0 } else { a.seconds },
            connections: a.connections.max(1),
            lengths: a.lengths,
            only: a.only,
            batch: a.batch.max(1),
            spin_us: a.spin_us,
            buf_size: a.buf_size,
        }
    }
}

/// `usnet bench shards`: usnet httpd --shards N vs nginx with N workers.
#[derive(Args, Debug)]
pub struct ShardsArgs {
    /// Directory for shards.json, shards.md and shards.png.
    #[arg(long, default_value = "bench-out/shards")]
    pub out: PathBuf,
    /// Runs per configuration (the table shows medians).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds per wrk run.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// wrk connections per shard (per nginx worker).
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Response body lengths in bytes (64 makes the 151-byte response).
    #[arg(long, value_delimiter = ',', default_value = "64,4096")]
    pub lengths: Vec<usize>,
    /// The largest shard count (default: the cores available).
    #[arg(long)]
    pub max_shards: Option<usize>,
    /// One 1-second run per configuration (a smoke test).
    #[arg(long)]
    pub quick: bool,
}

impl From<ShardsArgs> for usnet_bench::shards::ShardsBenchOptions {
    fn from(a: ShardsArgs) -> Self {
        let d = usnet_bench::shards::ShardsBenchOptions::default();
        usnet_bench::shards::ShardsBenchOptions {
            out: a.out,
            runs: if a.quick { 1 } else { a.runs.max(1) },
            seconds: if a.quick { 1.0 } else { a.seconds },
            connections: a.connections.max(1),
            lengths: a.lengths,
            max_shards: a.max_shards.unwrap_or(d.max_shards),
        }
    }
}

/// `usnet bench conns`: memory per idle TCP connection, usnet vs Linux.
#[derive(Args, Debug)]
pub struct ConnsArgs {
    /// Directory for conns.json, conns.md and conns.png.
    #[arg(long, default_value = "bench-out/conns")]
    pub out: PathBuf,
    /// Connection counts to measure at.
    #[arg(long, value_delimiter = ',', default_value = "10000,50000,100000")]
    pub counts: Vec<usize>,
    /// 2,000 connections only (a smoke test).
    #[arg(long)]
    pub quick: bool,
    /// Parts to run: stack (two in-process stacks), server (a `usnet up` server
    /// with client sessions); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Rounds of 100 bytes each way per connection in the server's busy phase.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds each round is spread over (default: 2, or one per 5,000
    /// connections).
    #[arg(long)]
    pub round_secs: Option<f64>,
    /// Bytes each way per connection and round.
    #[arg(long, default_value_t = 100)]
    pub msg: usize,
    /// Bytes per socket ring the server case's client sessions ask for (a power of
    /// two from 4096; default: the client's, 256 KiB).
    #[arg(long)]
    pub ring_bytes: Option<u32>,
}

impl From<ConnsArgs> for usnet_bench::conns::ConnsBenchOptions {
    fn from(a: ConnsArgs) -> Self {
        usnet_bench::conns::ConnsBenchOptions {
            out: a.out,
            counts: a.counts,
            quick: a.quick,
            only: a.only,
            rounds: a.rounds,
            period: a
                .round_secs
                .map(|s| std::time::Duration::from_secs_f64(s.max(0.0))),
            msg: a.msg,
            ring_bytes: a.ring_bytes,
        }
    }
}

/// `usnet bench soak`: nginx, redis, iperf3 (under the shim) and usnet client
/// processes at once through one stack server over a lossy, duplicating,
/// reordering link, killing a client every few seconds; checks bytes, deadlines,
/// leaks and counters.
#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Directory for soak.json, soak.md and soak.png.
    #[arg(long, default_value = "bench-out/soak")]
    pub out: PathBuf,
    /// Minutes of load.
    #[arg(long, default_value_t = 2.0)]
    pub minutes: f64,
    /// Seconds of load instead (a short run; overrides --minutes).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Seeds the fault link, the streams and the choice of whom to kill.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seconds between two kills of a client process.
    #[arg(long, default_value_t = 10.0)]
    pub kill_every: f64,
}

impl From<SoakArgs> for usnet_bench::soak::SoakBenchOptions {
    fn from(a: SoakArgs) -> Self {
        usnet_bench::soak::SoakBenchOptions {
            out: a.out,
            seconds: a.seconds.unwrap_or(a.minutes * 60.0),
            seed: a.seed,
            kill_every: a.kill_every,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    enum P {
        Udp(UdpArgs),
        Tcp(TcpArgs),
        Nic(NicBenchArgs),
        AsyncSyscall(AsyncSyscallArgs),
        Httpd(HttpdArgs),
        Soak(SoakArgs),
    }

    /// The flags' defaults are the libraries' (each default lives twice: in the help
    /// text here and in the library's `Default`).
    #[test]
    fn cli_defaults_are_the_library_defaults() {
        let P::Udp(u) = P::parse_from(["b", "udp"]) else {
            unreachable!()
        };
        let (u, d) = (UdpBenchOptions::from(u), UdpBenchOptions::default());
        assert_eq!(
            (u.out, u.runs, u.seconds, u.sizes, u.quick),
            (d.out, d.runs, d.seconds, d.sizes, d.quick)
        );
        let P::Tcp(t) = P::parse_from(["b", "tcp"]) else {
            unreachable!()
        };
        let (t, d) = (TcpBenchOptions::from(t), TcpBenchOptions::default());
        assert_eq!(
            (t.out, t.runs, t.seconds, t.sizes, t.rr_sizes, t.spin_us),
            (d.out, d.runs, d.seconds, d.sizes, d.rr_sizes, d.spin_us)
        );
        let P::Nic(n) = P::parse_from(["b", "nic"]) else {
            unreachable!()
        };
        let (n, d) = (NicBenchOptions::from(n), NicBenchOptions::default());
        assert_eq!((n.out, n.runs, n.only), (d.out, d.runs, d.only));
        let P::AsyncSyscall(a) = P::parse_from(["b", "async-syscall"]) else {
            unreachable!()
        };
        let (a, d) = (
            AsyncSyscallBenchOptions::from(a),
            AsyncSyscallBenchOptions::default(),
        );
        assert_eq!((a.out, a.only, a.tmpfs_dir), (d.out, d.only, d.tmpfs_dir));
        let P::Httpd(h) = P::parse_from(["b", "httpd"]) else {
            unreachable!()
        };
        let (h, d) = (
            usnet_bench::httpd::HttpdBenchOptions::from(h),
            usnet_bench::httpd::HttpdBenchOptions::default(),
        );
        assert_eq!(
            (
                h.out,
                h.runs,
                h.seconds,
                h.connections,
                h.lengths,
                h.batch,
                h.spin_us
            ),
            (
                d.out,
                d.runs,
                d.seconds,
                d.connections,
                d.lengths,
                d.batch,
                d.spin_us
            )
        );
        let P::Soak(s) = P::parse_from(["b", "soak"]) else {
            unreachable!()
        };
        let (s, d) = (
            usnet_bench::soak::SoakBenchOptions::from(s),
            usnet_bench::soak::SoakBenchOptions::default(),
        );
        assert_eq!(
            (s.out, s.seconds, s.seed, s.kill_every),
            (d.out, d.seconds, d.seed, d.kill_every)
        );
    }
}
