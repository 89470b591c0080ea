//! Commands that talk to a running stack over its control socket.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::ExitCode;

use clap::Args;
use usnet_session::ctl::msg::{
    ClientRow, Clients, Done, Ping, PingEvent, Priority, Request, ShardRow, Stat,
};
use usnet_session::ctl::{call, call_one, resolve};
use usnet_stack::Counters;

use crate::CmdResult;

#[derive(Args, Debug)]
pub struct StackSel {
    /// Which running stack (its --name); optional when only one runs.
    #[arg(long)]
    pub stack: Option<String>,
}

#[derive(Args, Debug)]
pub struct PingArgs {
    #[command(flatten)]
    pub sel: StackSel,
    /// Address to ping (IPv4 or IPv6).
    pub dst: IpAddr,
    /// Stop after this many requests.
    #[arg(short = 'c', long, default_value_t = 4)]
    pub count: u64,
    /// Seconds between requests.
    #[arg(short = 'i', long, default_value_t = 1.0)]
    pub interval: f64,
    /// Echo data bytes.
    #[arg(short = 's', long, default_value_t = 56)]
    pub size: usize,
    /// Seconds to wait for each reply.
    #[arg(short = 'W', long, default_value_t = 2.0)]
    pub timeout: f64,
}

#[derive(Args, Debug)]
pub struct StatArgs {
    #[command(flatten)]
    pub sel: StackSel,
    /// Show counters that are zero too.
    #[arg(short, long)]
    pub all: bool,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ClientsArgs {
    #[command(flatten)]
    pub sel: StackSel,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn clients(a: ClientsArgs) -> CmdResult {
    let path = resolve(a.sel.stack.as_deref())?;
    let answer: Clients = call_one(&path, &Request::Clients)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer.clients)?);
    } else {
        print!("{}", render_clients(&answer.clients, true));
    }
    Ok(ExitCode::SUCCESS)
}

/// The attached clients: one summary line each, then (with `sockets`) their TCP
/// sockets as `ss -p` shows them.
pub fn render_clients(rows: &[ClientRow], sockets: bool) -> String {
    let mut out = format!("clients ({}):\n", rows.len());
    if rows.is_empty() {
        return out;
    }
    // A sharded server says which shard each client lives on.
    let sharded = rows.iter().any(|c| c.shard.is_some());
    let shard = |c: &ClientRow| match c.shard {
        Some(k) if sharded => format!("{k:>5} "),
        _ => String::new(),
    };
    out += &format!(
        "    {}{:>4} {:>8} {:<16} {:>7} {:>10} {:>10} {:>7} {:>12} {:>12} {:>8}\n",
        if sharded { "shard " } else { "" },
        "id",
        "pid",
        "command",
        "sockets",
        "ring B",
        "stack B",
        "pool",
        "bytes in",
        "bytes out",
        "calls"
    );
    for c in rows {
        let st = &c.stats;
        out += &format!(
            "    {}{:>4} {:>8} {:<16} {:>7} {:>10} {:>10} {:>7} {:>12} {:>12} {:>8}\n",
            shard(c),
            c.id,
            c.pid,
            c.command,
            format!("{}/{}", c.sockets, c.max_sockets),
            c.ring_bytes,
            c.stack_bytes,
            c.pool_held,
            st.bytes_in,
            st.bytes_out,
            st.calls,
        );
    }
    if sockets {
        out += &format!(
            "    {:<12} {:>8} {:>8} {:<44} {:<44} {}\n",
            "state", "recv-q", "send-q", "local", "peer", "process"
        );
        for c in rows {
            let process = format!("users:((\"{}\",pid={},client={}))", c.command, c.pid, c.id);
            for s in &c.tcp {
                out += &format!(
                    "    {:<12} {:>8} {:>8} {:<44} {:<44} {}\n",
                    s.state, s.recv_q, s.send_q, s.local, s.remote, process
                );
            }
        }
    }
    out
}

pub fn down(sel: StackSel) -> CmdResult {
    // A stack that died with clients boosted left their pids behind: put them back
    // whether or not it still answers.
    if let Some(name) = &sel.stack {
        recover_boosts(name);
    }
    let path = resolve(sel.stack.as_deref())?;
    let r = call_one::<Done>(&path, &Request::Stop);
    if let Some(name) = path.file_stem().and_then(|n| n.to_str()) {
        recover_boosts(name);
    }
    r?;
    Ok(ExitCode::SUCCESS)
}

fn recover_boosts(name: &str) {
    let state = usnet_server::boost_state_path(name);
    let n = usnet_driver::sched::recover(&state, &mut usnet_driver::Setpriority);
    if n > 0 {
        println!("usnet: restored the priority of {n} process(es) a stopped stack had boosted");
    }
}

pub fn ping(a: PingArgs) -> CmdResult {
    let path = resolve(a.sel.stack.as_deref())?;
    let req = Request::Ping(Ping {
        dst: a.dst,
        count: a.count,
        interval_ms: (a.interval * 1000.0) as u64,
        size: a.size as u64,
        timeout_ms: (a.timeout * 1000.0) as u64,
    });
    let hdr = if a.dst.is_ipv4() { 28 } else { 48 };
    println!(
        "PING {0} ({0}) {1}({2}) bytes of data.",
        a.dst,
        a.size,
        a.size + hdr
    );
    let mut rtts = Vec::new();
    let (mut sent, mut received) = (0, 0);
    let t0 = std::time::Instant::now();
    call(&path, &req, |ev: PingEvent| {
        match ev {
            PingEvent::Done {
                sent: s,
                received: r,
                ..
            } => {
                (sent, received) = (s, r);
                return false;
            }
            PingEvent::Timeout { seq, .. } => println!("no reply for icmp_seq={seq}"),
            PingEvent::Failed { seq, error } => println!("icmp_seq={seq}: {error}"),
            PingEvent::Reply {
                seq,
                from,
                bytes,
                ttl,
                rtt_us,
            } => {
                let rtt = rtt_us / 1000.0;
                rtts.push(rtt);
                println!("{bytes} bytes from {from}: icmp_seq={seq} ttl={ttl} time={rtt:.3} ms");
            }
        }
        true
    })?;
    println!("\n--- {} ping statistics ---", a.dst);
    let loss = if sent > 0 {
        100.0 * (sent - received) as f64 / sent as f64
    } else {
        0.0
    };
    println!(
        "{sent} packets transmitted, {received} received, {loss:.0}% packet loss, time {}ms",
        t0.elapsed().as_millis()
    );
    if !rtts.is_empty() {
        let n = rtts.len() as f64;
        let avg = rtts.iter().sum::<f64>() / n;
        let min = rtts.iter().cloned().fold(f64::MAX, f64::min);
        let max = rtts.iter().cloned().fold(0.0, f64::max);
        let mdev = (rtts.iter().map(|r| (r - avg) * (r - avg)).sum::<f64>() / n).sqrt();
        println!("rtt min/avg/max/mdev = {min:.3}/{avg:.3}/{max:.3}/{mdev:.3} ms");
    }
    Ok(if received > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub fn stat(a: StatArgs) -> CmdResult {
    let path = resolve(a.sel.stack.as_deref())?;
    let answer: Stat = call_one(&path, &Request::Stat)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", render_stat(&answer, a.all));
    Ok(ExitCode::SUCCESS)
}

/// The `netstat -s`-like text for one stack's `stat` answer.
pub fn render_stat(v: &Stat, all: bool) -> String {
    let mut out = String::new();
    out += &format!(
        "stack {} on {} ({}), pid {}, up {:.0} s, link {}\n",
        v.name, v.link, v.device, v.pid, v.uptime_s, v.link_state
    );
    out += &format!("  mac {}  mtu {}\n", v.mac, v.mtu);
    for a in &v.addrs {
        out += &format!("  inet {a}\n");
    }
    let descs: BTreeMap<&str, &str> = Counters::default()
        .entries()
        .into_iter()
        .map(|(n, d, _)| (n, d))
        .collect();
    let mut layer = "";
    for (name, _, _) in Counters::default().entries() {
        let value = v.counters.get(name).copied().unwrap_or(0);
        if value == 0 && !all {
            continue;
        }
        let l = Counters::layer_of(name);
        if l != layer {
            out += &format!("{l}:\n");
            layer = l;
        }
        out += &format!("    {value:>12} {}  [{name}]\n", descs[name]);
    }
    out += "device:\n";
    for (k, val) in &v.device_counters {
        if all || *val != 0 {
            out += &format!("    {val:>12} {k}\n");
        }
    }
    let p = &v.pool;
    out += &format!(
        "pool:\n    {} buffers of {} bytes, {} in use (peak {}), {} allocations, {} times exhausted\n",
        p.count, p.buf_size, p.in_use, p.peak_in_use, p.allocs, p.exhausted
    );
    if !v.tcp_listeners.is_empty() || !v.tcp_connections.is_empty() {
        let row = |state: &str,
                   local: &str,
                   remote: &str,
                   rtt: [&str; 2],
                   cwnd: &str,
                   re: &str,
                   q| {
            let [srtt, min] = rtt;
            format!(
                "    {state:<12} {local:<44} {remote:<44} {srtt:>8} {min:>8} {cwnd:>8} {re:>8} {q:>6}\n"
            )
        };
        out += &format!("tcp sockets ({} connections):\n", v.tcp_connections_total);
        out += &row(
            "state",
            "local",
            "remote",
            ["srtt µs", "min µs"],
            "cwnd",
            "retrans",
            "recv-q".into(),
        );
        for l in &v.tcp_listeners {
            out += &row(
                "LISTEN",
                &l.local,
                "*",
                ["-", "-"],
                "-",
                "-",
                l.accept_queue.to_string(),
            );
        }
        for c in &v.tcp_connections {
            let us = |v: Option<u64>| v.map_or("-".to_string(), |u| u.to_string());
            let (srtt, min) = (us(c.srtt_us), us(c.min_rtt_us));
            out += &row(
                &c.state,
                &c.local,
                &c.remote,
                [&srtt, &min],
                &c.cwnd.to_string(),
                &c.retransmits.to_string(),
                c.recv_q.to_string(),
            );
        }
    }
    out += &render_shards(&v.shards);
    out += &render_priority(&v.priority);
    out += &render_clients(&v.clients, false);
    if !v.neighbors.is_empty() {
        out += "neighbors:\n";
        for n in &v.neighbors {
            out += &format!(
                "    {:<40} {}\n",
                n.ip,
                n.mac.as_deref().unwrap_or("(resolving)")
            );
        }
    }
    out
}

/// A sharded server's row per shard (empty for one shard): its load, and the
/// frames that crossed between shards.
pub fn render_shards(rows: &[ShardRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "shards ({}; the counters above are their sums):\n    {:>5} {:>7} {:>6} {:>12} {:>12} {:>8} {:>10} {:>10} {:>10} {:>10}\n",
        rows.len(),
        "shard",
        "clients",
        "tcp",
        "rx frames",
        "tx frames",
        "pool",
        "handed out",
        "handed in",
        "redirected",
        "every"
    );
    for r in rows {
        out += &format!(
            "    {:>5} {:>7} {:>6} {:>12} {:>12} {:>8} {:>10} {:>10} {:>10} {:>10}\n",
            r.shard,
            r.clients,
            r.tcp_connections,
            r.rx_frames,
            r.tx_frames,
            r.pool_in_use,
            r.handoff_out,
            r.handoff_in,
            r.redirected,
            r.every_copies,
        );
    }
    out
}

/// The priority-aware receive section of `usnet stat` (empty when both are off).
pub fn render_priority(p: &Priority) -> String {
    if !p.forced_drop && !p.priority {
        return String::new();
    }
    fn list<T: ToString>(v: &[T]) -> String {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.iter().map(T::to_string).collect::<Vec<_>>().join(" ")
        }
    }
    let on = |b: bool| if b { "on" } else { "off" };
    let mut out = format!(
        "priority:\n    forced drop {}{}, priority control {}, set of {}\n    ports P: {}\n    boosted: {}\n",
        on(p.forced_drop),
        if p.forced_drop_active { " (dropping now)" } else { "" },
        on(p.priority),
        p.set_size,
        list(&p.ports),
        list(&p.boosted),
    );
    for m in &p.members {
        out += &format!(
            "    S: port {:<6} priority {:>4}  owner {:<5} consumer {}\n",
            m.port,
            m.priority,
            m.owner,
            m.pid.map_or("-".to_string(), |p| p.to_string())
        );
    }
    out
}
