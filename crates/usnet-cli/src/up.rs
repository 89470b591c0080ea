//! `usnet up`: a stack server on a link. Other processes use it as their network
//! stack through `usnet-client` / `libusnet.so` (and unmodified programs through the
//! LD_PRELOAD shim); the built-in services run as its clients. `demo`, `get` and
//! `perf` embed an in-process stack with [`start`] instead.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use usnet_link::{fault::FaultConfig, LinkOptions, LinkSpec, LinkState};
use usnet_pool::{Backing, PoolConfig, DEFAULT_HEADROOM};
use usnet_runtime::{NetStack, RuntimeConfig, ServiceKind};
use usnet_session::ctl::socket_path;
use usnet_stack::{mac_from_seed, IpCidr, StackConfig};
use usnet_wire::MacAddr;

use crate::CmdResult;

/// How many shards: a number, or one per available core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards(pub usize);

impl std::str::FromStr for Shards {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "cores" {
            return Ok(Shards(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ));
        }
        match s.parse::<usize>() {
            Ok(n) if (1..=256).contains(&n) => Ok(Shards(n)),
            _ => Err(format!(
                "bad shard count {s:?}: a number from 1 to 256, or 'cores'"
            )),
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// tap:IFNAME (root; created if missing), shm:NAME (two processes, no root),
    /// afpacket:IFNAME (root; e.g. a veth end) or nic:NAME (the emulated NIC, driven
    /// by `usnet nicemu --name NAME`).
    #[arg(long)]
    pub link: String,
    /// An address of the stack with its prefix, e.g. 10.20.0.2/24 or fd00:20::2/64
    /// (repeatable). An IPv6 link-local address is always added.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<IpCidr>,
    /// tap only: address(es) for the Linux side of the TAP, e.g. 10.20.0.1/24.
    #[arg(long = "host-addr", value_name = "CIDR")]
    pub host_addrs: Vec<IpCidr>,
    /// Run this many shards of the stack (a number, or `cores` for one per core):
    /// each a complete stack on its own core with its own loop, pool and connection
    /// table, the link steering each flow to one shard (afpacket: a fanout group;
    /// tap: one queue per shard; xdp: one socket per queue). A client lives on one
    /// shard; a pre-forking server's workers are spread over them.
    #[arg(long, default_value = "1")]
    pub shards: Shards,
    /// Default gateway (IPv4 and/or IPv6; repeatable).
    #[arg(long)]
    pub gateway: Vec<IpAddr>,
    /// L3 MTU (default: the link's, 1500).
    #[arg(long)]
    pub mtu: Option<usize>,
    /// MAC address (default: a locally administered one derived from the name).
    #[arg(long)]
    pub mac: Option<MacAddr>,
    /// Built-in services over UDP and TCP: echo (port 7), discard (9), chargen (19),
    /// or none.
    #[arg(long, value_delimiter = ',', default_value = "echo")]
    pub services: Vec<String>,
    /// Name of this stack for `usnet stat/ping/down --stack` (default: from the link).
    #[arg(long)]
    pub name: Option<String>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// Inject faults, e.g. drop=0.01,dup=0.001,corrupt=0.001,reorder=0.01,seed=7
    /// (also window=, the reordering window; delay=; rate=100mbit,queue=10ms: a
    /// bottleneck; dir=rx|tx|both).
    #[arg(long)]
    pub fault: Option<FaultConfig>,
    /// Packet buffer size: 2048, 4096, 9216 or 65536.
    #[arg(long, default_value_t = 2048)]
    pub buf_size: usize,
    /// Number of packet buffers.
    #[arg(long, default_value_t = 16384)]
    pub buffers: u32,
    /// Slots per direction of a shm link.
    #[arg(long)]
    pub shm_slots: Option<usize>,
    /// Queues per side of a shm link, set by the side that creates it (default 4, or
    /// the shard count if larger): a sharded stack needs one per shard.
    #[arg(long)]
    pub shm_queues: Option<usize>,
    /// tap only: turn off TCP segmentation offload. By default a TAP negotiates it:
    /// usnet hands the kernel TCP frames of up to 64 KiB (chains of pool buffers) and
    /// the kernel hands usnet coalesced ones; without it every frame is MTU-sized.
    #[arg(long)]
    pub no_tso: bool,
    /// Turn off receive coalescing (GRO). By default consecutive in-order TCP segments
    /// of one connection that arrive in one burst reach TCP as one segment (counted as
    /// tcp_gro_merged / tcp_gro_frames in `usnet stat`); without it each goes alone.
    #[arg(long)]
    pub no_gro: bool,
    /// xdp links only: auto (zero-copy when the driver can, else copy), copy,
    /// zerocopy (or fail), generic (SKB-mode XDP, works on any interface).
    #[arg(long, default_value = "auto")]
    pub xdp_mode: usnet_link::xdp::XdpMode,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Besides the stack's owner (and root), members of this group may attach
    /// (numeric gid; the control socket becomes mode 0660).
    #[arg(long)]
    pub group: Option<u32>,
    /// Once the link is open, the control socket bound and the loops started, run as
    /// this user (a name or a numeric uid; its primary group, no supplementary
    /// groups), as nginx's workers and ntpd do: a client that finds a bug in the
    /// server then holds an unprivileged process. Started as root, the default is the
    /// user who ran sudo ($SUDO_USER), else nobody; `--user root` stays root. Only
    /// CAP_SYS_NICE is kept, with `--rx-policy priority`; no_new_privs and a seccomp
    /// allow-list follow (docs/server.md, "Giving up root"). The control socket is
    /// handed to that user, so its processes and root may attach.
    #[arg(long)]
    pub user: Option<String>,
    /// With the user change, leave out the seccomp filter of the system calls the
    /// server makes (an escape hatch if it refuses one it should not).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Offer zero-copy ports (the netmap/PASTE ring API; docs/zerocopy.md) to
    /// clients of the stack's own user and root. Such a client maps the whole
    /// packet pool, every other client's traffic included: grant it only where
    /// that is acceptable.
    #[arg(long)]
    pub zero_copy: bool,
    /// Keep every TCP connection's send and receive queues in pool buffers (the
    /// zero-copy connections' storage, used through the ordinary calls): a segment
    /// leaves from the buffer its bytes were copied into, and a reader copies from
    /// the buffer they arrived in, one copy fewer each way (docs/benchmarks.md,
    /// "Copies per payload byte"). The queues then come out of the pool: size it
    /// (`--buffers`) for the connections' buffers as well as for the frames.
    #[arg(long)]
    pub pool_buffers: bool,
    /// Clients at once (more are refused, counted as quota_sessions in `usnet stat`).
    #[arg(long, default_value_t = 1024)]
    pub max_clients: usize,
    /// The largest listen backlog a client gets (a larger one is cut, counted as
    /// quota_backlog): connections waiting to be accepted are the client's too.
    #[arg(long, default_value_t = 1024)]
    pub max_backlog: usize,
    /// The largest UDP receive buffer (SO_RCVBUF) a client may set: the bytes of
    /// packet buffers one of its sockets may hold while its ring is full (a larger
    /// one is cut, counted as quota_rcvbuf).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_rcvbuf: usize,
    /// The share of the packet pool, in percent, one client's receive queues may
    /// hold (datagrams waiting while its rings are full); past it that client's
    /// datagrams are dropped (counted), so it cannot take the pool from the others.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_pool_percent: u32,
    /// Sockets one client may hold at most (its quota; each has two rings). A client
    /// gets 1024 unless it asks for more.
    #[arg(long, default_value_t = usnet_session_abi::DEFAULT_CLIENT_SOCKETS)]
    pub client_sockets: u32,
    /// The largest ring a client socket may have (a power of two, 4096 .. 16 MiB); a
    /// client gets 256 KiB unless it asks otherwise.
    #[arg(long, default_value_t = usnet_session_abi::DEFAULT_MAX_RING_BYTES)]
    pub ring_bytes: u32,
    /// Bytes the server moves between a socket's ring and the stack per turn:
    /// the cluster size (MCLBYTES) ...
    #[arg(long, default_value_t = 65536)]
    pub cluster_bytes: usize,
    /// ... times the clusters one step may carry (MCLNUM).
    #[arg(long, default_value_t = 4)]
    pub clusters: usize,
    /// Do not mirror the stack's interface into the network namespace `usnet-NAME`
    /// (made when `usnet up` runs as root): programs that read rtnetlink
    /// themselves (`ip`, Go's `net.Interfaces`, dnsmasq) then see the host's
    /// interfaces rather than the stack's (docs/preload.md, "Interfaces").
    #[arg(long)]
    pub no_mirror: bool,
    /// Also serve the rpc baseline transport at `<run dir>/<name>.rpc`: the rump
    /// kernel's cost structure (a Unix-socket round trip per call and per copy request
    /// of clusters), kept to reproduce the source document's study
    /// (`usnet bench server`).
    #[arg(long)]
    pub rpc: bool,
    /// Priority-aware receive (docs/priority.md): forced-drop (mechanism A: frames
    /// for ports outside the priority set are dropped at the entrance while drop 1
    /// happens), priority (mechanism B: a priority socket's consumer is boosted while
    /// its queue is past half; needs CAP_SYS_NICE or RLIMIT_NICE), both, or none.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub rx_policy: Vec<RxPolicyName>,
    /// How many sockets the priority set holds (n).
    #[arg(long, default_value_t = 2)]
    pub prio_set_size: usize,
    /// Activation conditions are looked at most this often (ms).
    #[arg(long, default_value_t = 1000)]
    pub prio_interval_ms: u64,
    /// Input queue length at which forced drop starts before drop 1 (0: half the
    /// input queue).
    #[arg(long, default_value_t = 0)]
    pub forced_drop_threshold: usize,
    /// Probability that forced drop drops a frame for a port outside the set.
    #[arg(long, default_value_t = 0.9)]
    pub forced_drop_probability: f64,
    /// Nice steps a boost raises a consumer by (within -20..19).
    #[arg(long, default_value_t = 10)]
    pub boost: i32,
    /// The longest a boost lasts (ms).
    #[arg(long, default_value_t = 1000)]
    pub boost_ms: u64,
    /// The stack loop's nice value (default: inherited). A better value than the
    /// applications' gives protocol work the precedence the kernel's softirq has;
    /// below the current value it needs CAP_SYS_NICE or RLIMIT_NICE.
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub loop_nice: Option<i32>,
    /// How long the loop keeps polling (busy) after its last work before it
    /// sleeps, in microseconds. Polling saves a wake-up per burst; it yields the
    /// core on every idle pass, so an application sharing the core runs meanwhile.
    #[arg(long, default_value_t = 50)]
    pub spin_us: u64,
    /// A TCP tunable by its Linux sysctl name, `NAME=VALUE` (repeatable; the
    /// `net.ipv4.`/`net.core.` prefix may be left out), e.g.
    /// `tcp_congestion_control=bbr`, `default_qdisc=fq` (pace every connection),
    /// `tcp_ecn=1`; the list is `TcpConfig::set_sysctl`'s.
    #[arg(long = "sysctl", value_name = "NAME=VALUE")]
    pub sysctls: Vec<String>,
    /// A boost ends early once its queue is below a quarter and nothing arrived for
    /// this long (ms): the burst is over.
    #[arg(long, default_value_t = 20)]
    pub boost_quiet_ms: u64,
    /// Frames that may wait between the device and protocol work (drop 1 beyond).
    #[arg(long, default_value_t = 1000)]
    pub input_queue: usize,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// A mechanism of `--rx-policy`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxPolicyName {
    ForcedDrop,
    Priority,
    None,
}

impl UpArgs {
    /// The stack's receive policy from the flags.
    pub fn rx_policy(&self) -> Result<usnet_stack::RxPolicy, String> {
        if !(0.0..=1.0).contains(&self.forced_drop_probability) {
            return Err("--forced-drop-probability must be within 0..1".into());
        }
        if self.prio_set_size == 0 || self.prio_interval_ms == 0 {
            return Err("--prio-set-size and --prio-interval-ms must be at least 1".into());
        }
        Ok(usnet_stack::RxPolicy {
            forced_drop: self.rx_policy.contains(&RxPolicyName::ForcedDrop),
            priority: self.rx_policy.contains(&RxPolicyName::Priority),
            set_size: self.prio_set_size,
            interval: Duration::from_millis(self.prio_interval_ms),
            threshold: self.forced_drop_threshold,
            drop_probability: self.forced_drop_probability,
            boost: self.boost,
            boost_time: Duration::from_millis(self.boost_ms),
            drain_quiet: Duration::from_millis(self.boost_quiet_ms),
        })
    }
}

impl UpArgs {
    /// A stack for a command that embeds one (`demo`, `get`, `perf`): no services,
    /// quiet, every other setting at `usnet up`'s defaults. Callers set what they need
    /// with struct update syntax, so a new `up` flag is added in one place.
    pub fn embedded(link: String, name: String) -> UpArgs {
        UpArgs {
            link,
            addrs: vec![],
            host_addrs: vec![],
            gateway: vec![],
            shards: Shards(1),
            mtu: None,
            mac: None,
            services: vec!["none".into()],
            name: Some(name),
            pcap: None,
            fault: None,
            buf_size: 2048,
            buffers: 16384,
            shm_slots: None,
            shm_queues: None,
            no_tso: false,
            no_gro: false,
            xdp_mode: usnet_link::xdp::XdpMode::Auto,
            duration: None,
            group: None,
            user: None,
            no_seccomp: false,
            zero_copy: false,
            pool_buffers: false,
            max_clients: 1024,
            max_backlog: 1024,
            max_rcvbuf: 4 << 20,
            max_pool_percent: 25,
            client_sockets: usnet_session_abi::DEFAULT_CLIENT_SOCKETS,
            ring_bytes: usnet_session_abi::DEFAULT_MAX_RING_BYTES,
            cluster_bytes: 65536,
            clusters: 4,
            rpc: false,
            no_mirror: true,
            rx_policy: vec![RxPolicyName::None],
            prio_set_size: 2,
            prio_interval_ms: 1000,
            forced_drop_threshold: 0,
            forced_drop_probability: 0.9,
            boost: 10,
            boost_ms: 1000,
            boost_quiet_ms: 20,
            loop_nice: None,
            spin_us: 50,
            sysctls: vec![],
            input_queue: 1000,
            quiet: true,
        }
    }
}

fn default_name(spec: &LinkSpec) -> String {
    match spec {
        LinkSpec::Tap(n) | LinkSpec::AfPacket(n) => n.clone(),
        LinkSpec::Xdp { ifname, queue: 0 } => format!("xdp-{ifname}"),
        LinkSpec::Xdp { ifname, queue } => format!("xdp-{ifname}-{queue}"),
        LinkSpec::Nic(n) => format!("nic-{n}"),
        LinkSpec::Shm(n) => {
            // The first stack on a shm link is NAME-a, the second NAME-b.
            let a = format!("{n}-a");
            if !socket_path(&a).exists()
                || std::os::unix::net::UnixStream::connect(socket_path(&a)).is_err()
            {
                a
            } else {
                format!("{n}-b")
            }
        }
    }
}

fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    }) ^ std::process::id() as u64
}

/// What `usnet up` and the embedding commands build from the flags.
pub struct Opened {
    pub dev: Box<dyn usnet_link::Device>,
    pub cfg: StackConfig,
    pub name: String,
    pub services: Vec<ServiceKind>,
}

/// Checks the flags, opens the link and makes the stack's configuration.
pub fn open(args: &UpArgs) -> Result<Opened, Box<dyn std::error::Error>> {
    let p = plan(args)?;
    let dev = usnet_link::open(&p.link, &p.opts)?;
    Ok(Opened {
        dev,
        cfg: p.cfg,
        name: p.name,
        services: p.services,
    })
}

/// [`open`] for `n` shards of one stack (`usnet_stack::shard`): the link opened once
/// per shard, steering each frame to its shard's device, and each shard's
/// configuration (its role, its own seed).
pub fn open_shards(args: &UpArgs, n: usize) -> Result<Vec<Opened>, Box<dyn std::error::Error>> {
    let p = plan(args)?;
    let devs = usnet_link::open_shards(&p.link, &p.opts, n)?;
    Ok(devs
        .into_iter()
        .enumerate()
        .map(|(i, dev)| Opened {
            dev,
            cfg: p.cfg.for_shard(i, n),
            name: p.name.clone(),
            services: p.services.clone(),
        })
        .collect())
}

/// What opening a link takes: checked flags, the link's options, the stack's
/// configuration.
struct Plan {
    link: LinkSpec,
    opts: LinkOptions,
    cfg: StackConfig,
    name: String,
    services: Vec<ServiceKind>,
}

fn plan(args: &UpArgs) -> Result<Plan, Box<dyn std::error::Error>> {
    let link: LinkSpec = args.link.parse()?;
    let services: Vec<ServiceKind> = args
        .services
        .iter()
        .filter(|s| s.as_str() != "none" && !s.is_empty())
        .map(|s| s.parse::<ServiceKind>())
        .collect::<Result<_, _>>()?;
    let name = args.name.clone().unwrap_or_else(|| default_name(&link));
    if !usnet_session::ctl::valid_name(&name) {
        return Err(
            format!("bad stack name '{name}': use letters, digits, '-', '_' and '.'").into(),
        );
    }
    if args.no_tso && !matches!(link, LinkSpec::Tap(_)) {
        return Err("--no-tso only applies to tap links".into());
    }
    if !matches!(link, LinkSpec::Tap(_)) && !args.host_addrs.is_empty() {
        return Err("--host-addr only applies to tap links".into());
    }
    let mut opts = LinkOptions {
        mtu: args.mtu,
        pcap: args.pcap.clone(),
        fault: args.fault.clone(),
        tap_host_addrs: args.host_addrs.iter().map(|c| c.to_string()).collect(),
        shm_slots: args.shm_slots,
        shm_queues: args.shm_queues,
        tso: !args.no_tso,
        ..LinkOptions::default()
    };
    let mut gateway4 = None;
    let mut gateway6 = None;
    for g in &args.gateway {
        match g {
            IpAddr::V4(a) => gateway4 = Some(*a),
            IpAddr::V6(a) => gateway6 = Some(*a),
        }
    }
    let cfg = StackConfig {
        mac: args.mac.unwrap_or_else(|| mac_from_seed(name_seed(&name))),
        addrs: args.addrs.clone(),
        gateway4,
        gateway6,
        mtu: args.mtu.unwrap_or(65535),
        pool: PoolConfig {
            buf_size: args.buf_size,
            count: args.buffers,
            headroom: DEFAULT_HEADROOM,
            backing: Backing::Memfd,
        },
        seed: name_seed(&name),
        gro: !args.no_gro,
        input_queue_len: args.input_queue.max(1),
        rx_policy: args.rx_policy()?,
        tcp: tcp_config(args)?,
        ..StackConfig::default()
    };
    // Check the configuration before touching the link, so mistakes cost nothing.
    usnet_stack::Stack::new(StackConfig {
        mtu: cfg.mtu.min(args.mtu.unwrap_or(1500)),
        pool: PoolConfig {
            count: 1,
            ..cfg.pool.clone()
        },
        ..cfg.clone()
    })?;
    // The link learns the stack's MAC and addresses: AF_PACKET takes only the frames
    // for the MAC (and group frames), so the host's traffic on the same interface is
    // not copied into the stack to be dropped; the AF_XDP steering program redirects
    // the frames for them (ARP and NDP for the addresses) and leaves the rest to
    // Linux; the emulated NIC's config block carries the MAC.
    opts.mac = Some(cfg.mac.0);
    opts.addrs = cfg.addrs.iter().map(|a| a.addr).collect();
    opts.xdp_mode = args.xdp_mode;
    Ok(Plan {
        link,
        opts,
        cfg,
        name,
        services,
    })
}

/// An in-process stack with its services in the poll loop (`demo`, `get`, `perf`).
pub fn start(args: &UpArgs) -> Result<NetStack, Box<dyn std::error::Error>> {
    let o = open(args)?;
    let net = NetStack::start(o.dev, o.cfg, RuntimeConfig::default())?;
    for s in &o.services {
        let svc = net
            .with(|st| s.start(st))
            .map_err(|e| format!("cannot start service {s:?} on port {}: {e}", s.port()))?;
        net.add_service(svc);
    }
    Ok(net)
}

/// `usnet up`: the stack server, with the built-in services as its clients.
pub fn run(args: UpArgs) -> CmdResult {
    let n = args.shards.0;
    // The user to become, checked before anything is opened.
    let become_user = user_to_become(args.user.as_deref())?;
    let opened = if n > 1 {
        open_shards(&args, n)?
    } else {
        vec![open(&args)?]
    };
    if !args.cluster_bytes.is_power_of_two() || args.clusters == 0 {
        return Err("--cluster-bytes must be a power of two and --clusters at least 1".into());
    }
    let geometry = usnet_session_abi::Geometry {
        max_sockets: args.client_sockets,
        ring_bytes: args.ring_bytes,
        ..Default::default()
    };
    usnet_session_abi::Layout::new(geometry)
        .map_err(|_| "bad --client-sockets or --ring-bytes (a power of two, 4096 .. 16 MiB)")?;
    let (name, services) = (opened[0].name.clone(), opened[0].services.clone());
    let link_spec: LinkSpec = args.link.parse()?;
    // (After the open: a TAP device exists from then on.)
    let ifindex = link_spec.kernel_ifindex().unwrap_or(0);
    let mut parts = Vec::with_capacity(n);
    let mut cfg_policy = None;
    let mut dev_info = None;
    for o in opened {
        let mut cfg = o.cfg;
        if cfg.rx_policy.priority {
            if let Err(why) = usnet_driver::sched::can_boost() {
                if cfg_policy.is_none() {
                    eprintln!("usnet: {why}");
                }
                cfg.rx_policy.priority = false;
            }
        }
        usnet_driver::fit_to_device(&mut cfg, o.dev.caps());
        cfg.ifindex = ifindex;
        cfg_policy.get_or_insert_with(|| cfg.rx_policy.clone());
        let mut stack = usnet_stack::Stack::new(cfg)?;
        let mut dev = o.dev;
        // An AF_XDP link registers the stack's pool as its UMEM now, so a pool it
        // cannot use is reported before the server starts.
        dev.bind_pool(stack.pool_mut())?;
        // How the device runs (AF_XDP: native or generic, copy or zero-copy, its queue).
        if dev_info.is_none() {
            dev_info = dev.info();
        }
        parts.push((stack, dev));
    }
    let cfg_policy = cfg_policy.expect("one shard at least");
    let stack = &parts[0].0;
    let (mac, addrs, mtu) = (
        stack.mac(),
        stack
            .addrs()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        stack.mtu(),
    );
    let server_cfg = usnet_server::ServerConfig {
        name: name.clone(),
        link: args.link.clone(),
        geometry,
        limits: usnet_server::ServerLimits {
            chunk: args.cluster_bytes * args.clusters,
            max_sessions: args.max_clients,
            max_backlog: args.max_backlog,
            max_rcvbuf: args.max_rcvbuf,
            max_pool_percent: args.max_pool_percent,
            ..Default::default()
        },
        group: args.group,
        zero_copy: args.zero_copy,
        services: args.services.clone(),
        loop_nice: args.loop_nice,
        spin: std::time::Duration::from_micros(args.spin_us),
        // SAFETY: a plain query.
        mirror: !args.no_mirror && unsafe { libc::geteuid() } == 0,
        ..Default::default()
    };
    let clock = usnet_driver::AnyClock::System(usnet_driver::SystemClock::new());
    let mut server = usnet_server::ServerHandle::start_shards(parts, server_cfg, clock)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    // The stack by its control socket's path (less `.ctl`) for the clients in this
    // process: the run directory follows the uid, which is about to change.
    let stack_ref = server
        .control_path()
        .map(|p| p.with_extension("").display().to_string())
        .unwrap_or_else(|| name.clone());
    let rpc = if args.rpc {
        Some(usnet_rpc::Proxy::start(&stack_ref, args.group)?)
    } else {
        None
    };
    // The services are clients like any other; they attach before the user change,
    // while the run directory is still the one the control socket is in.
    let svc_thread = if services.is_empty() {
        None
    } else {
        Some(spawn_services(&stack_ref, &services, stop.clone())?)
    };
    // Kept until this process ends: its end tells the janitor to clean up.
    let mut _janitor = None;
    let shm_link = match &link_spec {
        LinkSpec::Shm(n) => Some(n.clone()),
        _ => None,
    };
    let privs_line = match &become_user {
        Become::Stay => None,
        Become::Root => Some("running as root (--user root)".to_string()),
        Become::User(user, to) => {
            if let Some(p) = server.control_path() {
                std::os::unix::fs::chown(p, Some(to.uid), Some(args.group.unwrap_or(to.gid)))
                    .map_err(|e| format!("cannot hand the control socket to {user}: {e}"))?;
            }
            if cfg_policy.priority {
                // The booster rewrites this file as the user; created here, as root.
                let state = usnet_server::boost_state_path(&name);
                std::fs::write(&state, "")
                    .and_then(|_| std::os::unix::fs::chown(&state, Some(to.uid), Some(to.gid)))
                    .map_err(|e| format!("cannot hand {} to {user}: {e}", state.display()))?;
            }
            // Root's run directory is not the user's to clean: this one is.
            _janitor = Some(
                usnet_server::privs::Janitor::spawn(&name, shm_link.as_deref())
                    .map_err(|e| format!("cannot start the clean-up process: {e}"))?,
            );
            // Boosting clients (other processes) needs CAP_SYS_NICE.
            let keep = usnet_server::privs::Keep {
                caps: if cfg_policy.priority {
                    1 << usnet_server::privs::CAP_SYS_NICE
                } else {
                    0
                },
                seccomp: !args.no_seccomp,
            };
            server
                .give_up_root(to, keep)
                .map_err(|e| format!("giving up root for {user}: {e}"))?;
            Some(format!(
                "running as {user} (uid {}, gid {}), {}, no_new_privs, {}",
                to.uid,
                to.gid,
                if keep.caps != 0 {
                    "keeping CAP_SYS_NICE"
                } else {
                    "no capabilities"
                },
                if keep.seccomp {
                    "seccomp allow-list"
                } else {
                    "no seccomp filter (--no-seccomp)"
                }
            ))
        }
    };
    if let (Some(info), false) = (&dev_info, args.quiet) {
        println!("usnet: {}: {info}", args.link);
    }
    if !args.quiet {
        println!(
            "usnet: stack '{}' up on {}{} (mac {mac}, mtu {mtu}): {}; services: {}",
            name,
            args.link,
            if n > 1 {
                format!(", {n} shards")
            } else {
                String::new()
            },
            addrs.join(" "),
            args.services.join(",")
        );
        if cfg_policy.enabled() {
            println!(
                "usnet: receive policy:{}{} (set of {}, checked every {} ms)",
                if cfg_policy.forced_drop {
                    " forced-drop"
                } else {
                    ""
                },
                if cfg_policy.priority { " priority" } else { "" },
                cfg_policy.set_size,
                cfg_policy.interval.as_millis()
            );
        }
        // Before the line a starter waits for, so it is there when that line is.
        if let Some(l) = &privs_line {
            println!("usnet: {l}");
        }
        println!(
            "usnet: serving clients at {}; `usnet stat --stack {}` shows its counters",
            server
                .control_path()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            name
        );
        if let Some(p) = &rpc {
            println!("usnet: rpc baseline transport at {}", p.path().display());
        }
    }
    let deadline = args
        .duration
        .map(|d| std::time::Instant::now() + Duration::from_secs_f64(d));
    // A shm link is Down until the other end opens it; report changes after that.
    let link_state = || {
        server
            .call(Duration::from_secs(2), |lp| lp.driver.link_state())
            .unwrap_or(LinkState::Down)
    };
    let mut last_state = link_state();
    while server.is_running() && !stop.load(Ordering::Relaxed) {
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        let state = link_state();
        if state != last_state && !args.quiet {
            match state {
                LinkState::Up => println!("usnet: link {} is up", args.link),
                LinkState::Down => println!("usnet: link {} is down (peer gone)", args.link),
            }
        }
        last_state = state;
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let counters: Option<(u64, u64)> = (0..server.shards())
        .map(|k| {
            server.call_on(k, Duration::from_secs(2), |lp| {
                let c = lp.stack().counters();
                (c.link_rx_frames, c.link_tx_frames)
            })
        })
        .try_fold((0, 0), |a, c| c.map(|c| (a.0 + c.0, a.1 + c.1)));
    let r = server.shutdown();
    if let Some(t) = svc_thread {
        let _ = join_within(t, Duration::from_secs(5));
    }
    r?;
    if !args.quiet {
        if let Some((rx, tx)) = counters {
            println!(
                "usnet: stack '{}' down: {rx} frames in, {tx} frames out",
                name
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Who `usnet up` runs as once it is serving.
enum Become {
    /// Started as an ordinary user, without `--user`: no change.
    Stay,
    /// `--user root` (or uid 0, also through $SUDO_USER): stays root, said in one line.
    Root,
    /// Gives up root for this user.
    User(String, usnet_server::privs::Target),
}

/// `--user`, else (started as root) the user who ran sudo, else nobody.
fn user_to_become(user: Option<&str>) -> Result<Become, String> {
    use usnet_server::privs::lookup;
    let root = usnet_server::privs::is_root();
    let (name, to) = match user {
        Some(u) => (
            u.to_string(),
            lookup(u).map_err(|e| format!("--user: {e}"))?,
        ),
        None if !root => return Ok(Become::Stay),
        None => {
            let sudo = std::env::var("SUDO_USER")
                .ok()
                .filter(|u| !u.is_empty())
                .and_then(|u| lookup(&u).ok().map(|t| (u, t)));
            match sudo {
                Some(s) => s,
                None => (
                    "nobody".to_string(),
                    lookup("nobody").map_err(|e| {
                        format!("giving up root: {e} (name a user with --user, or --user root)")
                    })?,
                ),
            }
        }
    };
    Ok(if to.uid == 0 {
        Become::Root
    } else {
        Become::User(name, to)
    })
}

/// Joins a thread, giving up after `limit` (nothing waits without a deadline).
fn join_within(t: std::thread::JoinHandle<()>, limit: Duration) -> bool {
    let end = std::time::Instant::now() + limit;
    while !t.is_finished() {
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    t.join().is_ok()
}

/// One client thread running every built-in service: attach, start them, then poll
/// them whenever the server changed something in the session.
fn spawn_services(
    name: &str,
    kinds: &[ServiceKind],
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, Box<dyn std::error::Error>> {
    // Services hold a socket per connection they serve: ask for many, with small
    // rings (their traffic is requests and responses, not bulk).
    let client = usnet_client::Client::attach_with(
        Some(name),
        &usnet_client::AttachOptions {
            max_sockets: Some(usnet_session_abi::DEFAULT_CLIENT_SOCKETS),
            ring_bytes: Some(64 * 1024),
            ..Default::default()
        },
    )?;
    let mut net = usnet_client::ClientNet::new(client);
    let mut svcs = Vec::new();
    for k in kinds {
        let svc = k
            .start(&mut net)
            .map_err(|e| format!("cannot start service {k:?} on port {}: {e}", k.port()))?;
        svcs.push(svc);
    }
    Ok(std::thread::Builder::new()
        .name("usnet-services".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) && net.client().is_alive() {
                let seen = net.seq();
                let mut did = false;
                for s in svcs.iter_mut() {
                    did |= s.poll(&mut net);
                }
                if !did && net.wait(seen, Duration::from_millis(100)).is_err() {
                    break;
                }
            }
        })?)
}

/// The TCP configuration: the stack's default with `--pool-buffers` and every
/// `--sysctl` applied in order.
fn tcp_config(args: &UpArgs) -> Result<usnet_stack::TcpConfig, Box<dyn std::error::Error>> {
    let mut tcp = usnet_stack::TcpConfig {
        zero_copy: args.pool_buffers,
        ..StackConfig::default().tcp
    };
    for s in &args.sysctls {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| format!("--sysctl {s}: expected NAME=VALUE"))?;
        let name = name.trim();
        let name = name
            .strip_prefix("net.ipv4.")
            .or_else(|| name.strip_prefix("net.core."))
            .unwrap_or(name);
        tcp.set_sysctl(name, value)
            .map_err(|e| format!("--sysctl {s}: {e}"))?;
    }
    Ok(tcp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        up: UpArgs,
    }

    fn parse(extra: &[&str]) -> UpArgs {
        let mut args = vec!["usnet", "--link", "shm:x"];
        args.extend_from_slice(extra);
        P::parse_from(args).up
    }

    #[test]
    fn sysctl_flags_set_the_tcp_configuration() {
        let t = tcp_config(&parse(&[
            "--sysctl",
            "net.ipv4.tcp_congestion_control=bbr",
            "--sysctl",
            "net.core.default_qdisc=fq",
        ]))
        .unwrap();
        assert_eq!(t.congestion, usnet_stack::CcAlgorithm::Bbr);
        assert!(t.pacing);
        let e = tcp_config(&parse(&["--sysctl", "tcp_congestion_control=vegas"])).unwrap_err();
        assert!(e.to_string().contains("bad value"), "{e}");
        assert!(tcp_config(&parse(&["--sysctl", "tcp_sack"])).is_err());
    }

    #[test]
    fn rx_policy_flags_make_the_stacks_policy() {
        let off = parse(&[]).rx_policy().unwrap();
        assert!(!off.enabled());
        let p = parse(&[
            "--rx-policy",
            "forced-drop,priority",
            "--prio-set-size",
            "3",
            "--prio-interval-ms",
            "250",
            "--forced-drop-probability",
            "0.5",
            "--boost",
            "4",
        ])
        .rx_policy()
        .unwrap();
        assert!(p.forced_drop && p.priority);
        assert_eq!(p.set_size, 3);
        assert_eq!(p.interval, Duration::from_millis(250));
        assert_eq!((p.drop_probability, p.boost), (0.5, 4));
        let a = parse(&["--rx-policy", "forced-drop"]).rx_policy().unwrap();
        assert!(a.forced_drop && !a.priority);
        assert!(parse(&["--forced-drop-probability", "1.5"])
            .rx_policy()
            .is_err());
        assert!(P::try_parse_from(["usnet", "--link", "shm:x", "--rx-policy", "bogus"]).is_err());
    }
}
