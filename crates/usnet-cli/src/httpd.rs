//! `usnet httpd`: the phttpd-like server (crate usnet-httpd) on Linux sockets
//! (`--api kernel`), on a usnet stack of its own in the same thread (`--api socket`
//! or `zerocopy`, on a link as `usnet up` opens it), or with `--api zerocopy
//! --stack NAME` as a client process of a running `usnet up --zero-copy`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use usnet_driver::{Driver, SystemClock};
use usnet_httpd::socket::{SocketServer, StackApp};
use usnet_httpd::zerocopy::ZcServer;
use usnet_httpd::{Api, HttpdConfig};
use usnet_stack::IpCidr;

use crate::up::Shards;
use crate::up::{self, UpArgs};
use crate::CmdResult;

#[derive(Args, Debug, Clone)]
pub struct HttpdArgs {
    /// The network API: kernel (Linux sockets, epoll), socket (usnet's stack in this
    /// thread, on --link) or zerocopy (usnet's zero-copy rings: on --link in this
    /// thread, or with --stack through a stack server).
    #[arg(long, default_value = "kernel")]
    pub api: Api,
    /// zerocopy: be a client of this running stack server (`usnet up --zero-copy`)
    /// instead of opening a link: the rings and the packet pool are its shared
    /// memory, and its loop does the protocol work.
    #[arg(long)]
    pub stack: Option<String>,
    /// Listening port.
    #[arg(short, long, default_value_t = 80)]
    pub port: u16,
    /// Response body length in bytes; the head is fixed (87 bytes for a two-digit
    /// length), so the default, 64, makes phttpd's 151-byte response.
    #[arg(short = 'l', long, default_value_t = usnet_httpd::DEFAULT_LENGTH)]
    pub length: usize,
    /// A static header line added to every response, 'Name: value' (repeatable).
    #[arg(short = 'H', long = "header", value_name = "LINE")]
    pub headers: Vec<String>,
    /// Events (ready sockets) handled per loop iteration.
    #[arg(short, long, default_value_t = 64)]
    pub batch: usize,
    /// Pin the server to this CPU.
    #[arg(short, long)]
    pub core: Option<usize>,
    /// Address to listen on (default: every address).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Connections served at once (more are refused).
    #[arg(long, default_value_t = 65536)]
    pub max_conns: usize,
    /// socket, zerocopy: the link, as `usnet up --link` takes it (tap:NAME, afpacket:IF,
    /// xdp:IF[:QUEUE], shm:NAME, nic:NAME).
    #[arg(long)]
    pub link: Option<String>,
    /// socket, zerocopy: an address of the stack with its prefix (repeatable).
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<IpCidr>,
    /// socket, zerocopy, tap links: address(es) for the Linux side of the TAP.
    #[arg(long = "host-addr", value_name = "CIDR")]
    pub host_addrs: Vec<IpCidr>,
    /// socket, zerocopy: default gateway (repeatable).
    #[arg(long)]
    pub gateway: Vec<IpAddr>,
    /// socket, zerocopy: L3 MTU (default: the link's).
    #[arg(long)]
    pub mtu: Option<usize>,
    /// socket, zerocopy: packet buffer size (2048, 4096, 9216 or 65536; AF_XDP
    /// takes at most a page). A zero-copy piece is one buffer, so larger buffers
    /// mean fewer pieces per response.
    #[arg(long, default_value_t = 2048)]
    pub buf_size: usize,
    /// socket, zerocopy, xdp links: auto, copy, zerocopy or generic.
    #[arg(long, default_value = "auto")]
    pub xdp_mode: usnet_link::xdp::XdpMode,
    /// socket, zerocopy: write every frame to this pcap file.
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// socket, zerocopy: keep polling the device this long (µs) after the last work before
    /// sleeping on it (0: sleep at once).
    #[arg(long, default_value_t = 0)]
    pub spin_us: u64,
    /// socket, zerocopy: run this many shards of the stack, one thread each pinned to
    /// its own core (from --core, or 0, up), each a complete stack with its own
    /// listener, the link steering each connection to one shard (afpacket: a fanout
    /// group; tap: one queue per shard). A number, or `cores` for one per core.
    #[arg(long, default_value = "1")]
    pub shards: Shards,
    /// zerocopy: write every answer into fresh buffers, instead of sending the
    /// responses from buffers written once and kept (SLOT_KEEP, as sendfile sends
    /// the page cache; used where pieces travel by reference, i.e. with TSO).
    #[arg(long)]
    pub no_cache: bool,
    /// Stop after this many seconds (default: at SIGINT/SIGTERM).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print nothing but errors (and the summary at exit).
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(a: HttpdArgs) -> CmdResult {
    let cfg = HttpdConfig {
        port: a.port,
        bind: a.bind,
        length: a.length,
        headers: a.headers.clone(),
        batch: a.batch.max(1),
        max_conns: a.max_conns.max(1),
        spin_us: a.spin_us,
        zc_cache: !a.no_cache,
    };
    // The responses are checked before anything opens.
    let resp = usnet_httpd::Responses::new(cfg.length, &cfg.headers)?;
    if a.api == Api::Kernel && (a.link.is_some() || !a.addrs.is_empty() || !a.host_addrs.is_empty())
    {
        return Err(
            "--link, --addr and --host-addr are for --api socket and zerocopy (the \
             kernel api uses the host's addresses; --bind picks one)"
                .into(),
        );
    }
    if a.stack.is_some() && (a.api != Api::Zerocopy || a.link.is_some() || !a.addrs.is_empty()) {
        return Err(
            "--stack is for --api zerocopy without --link and --addr (the stack server \
             has the link and the addresses)"
                .into(),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    if let Some(secs) = a.duration {
        let s = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
            s.store(true, Ordering::Relaxed);
        });
    }
    let sharded = a.shards.0 > 1;
    if sharded && (a.api == Api::Kernel || a.stack.is_some()) {
        return Err("--shards is for --api socket and zerocopy on --link".into());
    }
    if let Some(c) = a.core.filter(|_| !sharded) {
        usnet_httpd::pin_to_core(c).map_err(|e| format!("cannot pin to core {c}: {e}"))?;
    }
    let what = format!(
        "{}-byte responses ({} B head + {} B body)",
        resp.response().len(),
        resp.head_len(),
        cfg.length
    );
    let stats = match a.api {
        Api::Kernel => {
            let mut srv = usnet_httpd::kernel::KernelServer::bind(&cfg)
                .map_err(|e| format!("cannot listen on port {}: {e}", cfg.port))?;
            if !a.quiet {
                println!(
                    "usnet httpd: api kernel, listening on {}, {what}",
                    srv.local_addr()?
                );
            }
            srv.run(&stop)?
        }
        Api::Zerocopy if a.stack.is_some() => {
            let name = a.stack.clone().unwrap_or_default();
            if !a.quiet {
                println!(
                    "usnet httpd: api zerocopy through stack server {name}, port {}, {what}",
                    cfg.port
                );
            }
            usnet_httpd::zerocopy::run_client(&name, &cfg, &stop)
                .map_err(|e| format!("stack server {name}: {e}"))?
        }
        Api::Socket | Api::Zerocopy if sharded => run_shards(&a, &cfg, &what, &stop)?,
        Api::Socket | Api::Zerocopy => {
            let (mut driver, link) = stack_driver(&a)?;
            // Either server is a StackApp in the same loop, on the same driver.
            let mut app: Box<dyn StackApp> = match a.api {
                Api::Zerocopy => Box::new(ZcServer::start(driver.stack_mut(), &cfg)?),
                _ => Box::new(SocketServer::start(driver.stack_mut(), &cfg)?),
            };
            if !a.quiet {
                let addrs: Vec<String> = driver
                    .stack()
                    .addrs()
                    .iter()
                    .map(|x| x.to_string())
                    .collect();
                println!(
                    "usnet httpd: api {} on {link} ({}), port {}, {what}",
                    a.api,
                    addrs.join(" "),
                    cfg.port
                );
            }
            usnet_httpd::socket::run(
                &mut driver,
                app.as_mut(),
                Duration::from_micros(cfg.spin_us),
                &stop,
            )?
        }
    };
    println!("usnet httpd: {stats}");
    Ok(ExitCode::SUCCESS)
}

/// The driver of a usnet stack on a link opened from the command line.
type StackDriver = Driver<Box<dyn usnet_link::Device>>;

/// The `usnet up` flags of the stack behind `--api socket` and `zerocopy`.
fn up_args(a: &HttpdArgs) -> Result<UpArgs, Box<dyn std::error::Error>> {
    let link = a
        .link
        .clone()
        .ok_or("--api socket and zerocopy need --link (e.g. tap:NAME, afpacket:IF, xdp:IF)")?;
    if a.addrs.is_empty() {
        return Err(
            "--api socket and zerocopy need --addr (the stack's address, e.g. 10.0.0.2/24)".into(),
        );
    }
    let name = format!("httpd-{}", std::process::id());
    Ok(UpArgs {
        addrs: a.addrs.clone(),
        host_addrs: a.host_addrs.clone(),
        gateway: a.gateway.clone(),
        mtu: a.mtu,
        buf_size: a.buf_size,
        // The same pool memory whatever the buffer size (32 MiB).
        buffers: ((32usize << 20) / a.buf_size).max(1024) as u32,
        xdp_mode: a.xdp_mode,
        pcap: a.pcap.clone(),
        ..UpArgs::embedded(link, name)
    })
}

/// Runs one server per shard, each in its own thread pinned to its own core, and
/// adds up what they did.
fn run_shards(
    a: &HttpdArgs,
    cfg: &HttpdConfig,
    what: &str,
    stop: &Arc<AtomicBool>,
) -> Result<usnet_httpd::Stats, Box<dyn std::error::Error>> {
    let ua = up_args(a)?;
    let n = a.shards.0;
    let mut drivers = Vec::with_capacity(n);
    for o in up::open_shards(&ua, n)? {
        let mut scfg = o.cfg;
        usnet_driver::fit_to_device(&mut scfg, o.dev.caps());
        let mut driver = Driver::new(usnet_stack::Stack::new(scfg)?, o.dev, SystemClock::new());
        driver.bind_device()?;
        drivers.push(driver);
    }
    let mut shards = usnet_driver::Shards::new(drivers)?;
    // Each shard's server listens on its own stack before any shard turns.
    let mut apps: Vec<std::sync::Mutex<Box<dyn StackApp + Send>>> = Vec::with_capacity(n);
    for i in 0..n {
        let d = shards.driver_mut(i);
        apps.push(std::sync::Mutex::new(match a.api {
            Api::Zerocopy => Box::new(ZcServer::start(d.stack_mut(), cfg)?),
            _ => Box::new(SocketServer::start(d.stack_mut(), cfg)?),
        }));
    }
    if !a.quiet {
        println!(
            "usnet httpd: api {} on {} ({}), {n} shards, port {}, {what}",
            a.api,
            ua.link,
            a.addrs
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            cfg.port
        );
    }
    let spin = Duration::from_micros(cfg.spin_us);
    let results = shards.run(Some(a.core.unwrap_or(0)), |i, driver| {
        let mut app = apps[i].lock().unwrap_or_else(|p| p.into_inner());
        let r = usnet_httpd::socket::run(driver, app.as_mut(), spin, stop);
        if r.is_err() {
            // One shard down stops the others.
            stop.store(true, Ordering::Relaxed);
        }
        r.map(|st| (st, driver.stack().counters_snapshot()))
    });
    let mut total = usnet_httpd::Stats::default();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(Ok((st, c))) => {
                println!(
                    "usnet httpd: shard {i}: {st}; {} frames handed out, {} in, {} copies to all",
                    c.shard_handoff_out, c.shard_handoff_in, c.shard_every_copies
                );
                total += st;
            }
            Ok(Err(e)) => return Err(format!("shard {i}: {e}").into()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
}

/// The usnet stack of `--api socket` (and of the zero-copy api): the link opened as
/// `usnet up` opens it, the stack fitted to the device, in a driver for this thread.
fn stack_driver(a: &HttpdArgs) -> Result<(StackDriver, String), Box<dyn std::error::Error>> {
    let ua = up_args(a)?;
    let link = ua.link.clone();
    let o = up::open(&ua)?;
    let mut scfg = o.cfg;
    usnet_driver::fit_to_device(&mut scfg, o.dev.caps());
    let stack = usnet_stack::Stack::new(scfg)?;
    let mut driver = Driver::new(stack, o.dev, SystemClock::new());
    // An AF_XDP link registers the stack's pool as its UMEM now.
    driver.bind_device()?;
    if !a.quiet {
        if let Some(i) = driver.device().info() {
            println!("usnet httpd: {link}: {i}");
        }
    }
    Ok((driver, link))
}
