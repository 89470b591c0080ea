//! Commands that talk to a running stack over its control socket.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::ExitCode;

use clap::Args;
use serde_json::{json, Value};
use usnet_session::ctl::{request, resolve};
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
    let mut answer = Value::Null;
    request(&path, &json!({"cmd": "clients"}), |v| {
        answer = v.clone();
        false
    })?;
    if let Some(e) = answer["error"].as_str() {
        return Err(e.to_string().into());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer["clients"])?);
    } else {
        print!("{}", render_clients(&answer["clients"], true));
    }
    Ok(ExitCode::SUCCESS)
}

/// The attached clients: one summary line each, then (with `sockets`) their TCP
/// sockets as `ss -p` shows them.
pub fn render_clients(clients: &Value, sockets: bool) -> String {
    let rows = clients.as_array().cloned().unwrap_or_default();
    let mut out = format!("clients ({}):\n", rows.len());
    if rows.is_empty() {
        return out;
    }
    // A sharded server says which shard each client lives on.
    let sharded = rows.iter().any(|c| c.get("shard").is_some());
    let shard = |c: &Value| {
        if sharded {
            format!("{:>5} ", c["shard"].to_string())
        } else {
            String::new()
        }
    };
    out += &format!(
        "    {}{:>4} {:>8} {:<16} {:>7} {:>10} {:>10} {:>12} {:>12} {:>8}\n",
        if sharded { "shard " } else { "" },
        "id",
        "pid",
        "command",
        "sockets",
        "ring B",
        "stack B",
        "bytes in",
        "bytes out",
        "calls"
    );
    for c in &rows {
        let st = &c["stats"];
        out += &format!(
            "    {}{:>4} {:>8} {:<16} {:>7} {:>10} {:>10} {:>12} {:>12} {:>8}\n",
            shard(c),
            c["id"].to_string(),
            c["pid"].to_string(),
            c["command"].as_str().unwrap_or("?"),
            format!("{}/{}", c["sockets"], c["max_sockets"]),
            c["ring_bytes"].to_string(),
            c["stack_bytes"].to_string(),
            st["bytes_in"].to_string(),
            st["bytes_out"].to_string(),
            st["calls"].to_string(),
        );
    }
    if sockets {
        out += &format!(
            "    {:<12} {:>8} {:>8} {:<44} {:<44} {}\n",
            "state", "recv-q", "send-q", "local", "peer", "process"
        );
        for c in &rows {
            let process = format!(
                "users:((\"{}\",pid={},client={}))",
                c["command"].as_str().unwrap_or("?"),
                c["pid"],
                c["id"]
            );
            for s in c["tcp"].as_array().into_iter().flatten() {
                out += &format!(
                    "    {:<12} {:>8} {:>8} {:<44} {:<44} {}\n",
                    s["state"].as_str().unwrap_or("?"),
                    s["recv_q"].to_string(),
                    s["send_q"].to_string(),
                    s["local"].as_str().unwrap_or("?"),
                    s["remote"].as_str().unwrap_or("?"),
                    process
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
    let r = request(&path, &json!({"cmd": "stop"}), |_| false);
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
    let req = json!({
        "cmd": "ping", "dst": a.dst.to_string(), "count": a.count,
        "interval_ms": (a.interval * 1000.0) as u64, "size": a.size,
        "timeout_ms": (a.timeout * 1000.0) as u64,
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
    request(&path, &req, |v| {
        if v.get("done").is_some() {
            sent = v["sent"].as_u64().unwrap_or(0);
            received = v["received"].as_u64().unwrap_or(0);
            return false;
        }
        let seq = v["seq"].as_u64().unwrap_or(0);
        if v.get("timeout").is_some() {
            println!("no reply for icmp_seq={seq}");
        } else if let Some(e) = v.get("error") {
            println!("icmp_seq={seq}: {}", e.as_str().unwrap_or("error"));
        } else {
            let rtt = v["rtt_us"].as_f64().unwrap_or(0.0) / 1000.0;
            rtts.push(rtt);
            println!(
                "{} bytes from {}: icmp_seq={seq} ttl={} time={rtt:.3} ms",
                v["bytes"],
                v["from"].as_str().unwrap_or("?"),
                v["ttl"]
            );
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
    let mut answer = Value::Null;
    request(&path, &json!({"cmd": "stat"}), |v| {
        answer = v.clone();
        false
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", render_stat(&answer, a.all));
    Ok(ExitCode::SUCCESS)
}

/// The `netstat -s`-like text for one stack's `stat` answer.
pub fn render_stat(v: &Value, all: bool) -> String {
    let mut out = String::new();
    let s = |k: &str| v[k].as_str().unwrap_or("?").to_string();
    out += &format!(
        "stack {} on {} ({}), pid {}, up {:.0} s, link {}\n",
        s("name"),
        s("link"),
        s("device"),
        v["pid"],
        v["uptime_s"].as_f64().unwrap_or(0.0),
        s("link_state")
    );
    out += &format!("  mac {}  mtu {}\n", s("mac"), v["mtu"]);
    for a in v["addrs"].as_array().into_iter().flatten() {
        out += &format!("  inet {}\n", a.as_str().unwrap_or("?"));
    }
    let descs: BTreeMap<&str, &str> = Counters::default()
        .entries()
        .into_iter()
        .map(|(n, d, _)| (n, d))
        .collect();
    let mut layer = "";
    for (name, _, _) in Counters::default().entries() {
        let value = v["counters"][name].as_u64().unwrap_or(0);
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
    if let Some(d) = v["device_counters"].as_object() {
        for (k, val) in d {
            if all || val.as_u64() != Some(0) {
                out += &format!("    {:>12} {k}\n", val);
            }
        }
    }
    let p = &v["pool"];
    out += &format!(
        "pool:\n    {} buffers of {} bytes, {} in use (peak {}), {} allocations, {} times exhausted\n",
        p["count"], p["buf_size"], p["in_use"], p["peak_in_use"], p["allocs"], p["exhausted"]
    );
    let listeners = v["tcp_listeners"].as_array().cloned().unwrap_or_default();
    let conns = v["tcp_connections"].as_array().cloned().unwrap_or_default();
    if !listeners.is_empty() || !conns.is_empty() {
        out += &format!(
            "tcp sockets ({} connections):\n    {:<12} {:<44} {:<44} {:>8} {:>8} {:>8} {:>6}\n",
            v["tcp_connections_total"],
            "state",
            "local",
            "remote",
            "srtt µs",
            "cwnd",
            "retrans",
            "recv-q"
        );
        for l in &listeners {
            out += &format!(
                "    {:<12} {:<44} {:<44} {:>8} {:>8} {:>8} {:>6}\n",
                "LISTEN",
                l["local"].as_str().unwrap_or("?"),
                "*",
                "-",
                "-",
                "-",
                l["accept_queue"].to_string()
            );
        }
        for c in &conns {
            out += &format!(
                "    {:<12} {:<44} {:<44} {:>8} {:>8} {:>8} {:>6}\n",
                c["state"].as_str().unwrap_or("?"),
                c["local"].as_str().unwrap_or("?"),
                c["remote"].as_str().unwrap_or("?"),
                c["srtt_us"]
                    .as_u64()
                    .map_or("-".to_string(), |u| u.to_string()),
                c["cwnd"].to_string(),
                c["retransmits"].to_string(),
                c["recv_q"].to_string(),
            );
        }
    }
    out += &render_shards(&v["shards"]);
    out += &render_priority(&v["priority"]);
    out += &render_clients(&v["clients"], false);
    let neigh = v["neighbors"].as_array().cloned().unwrap_or_default();
    if !neigh.is_empty() {
        out += "neighbors:\n";
        for n in neigh {
            out += &format!(
                "    {:<40} {}\n",
                n["ip"].as_str().unwrap_or("?"),
                n["mac"].as_str().unwrap_or("(resolving)")
            );
        }
    }
    out
}

/// A sharded server's row per shard (empty for one shard): its load, and the
/// frames that crossed between shards.
pub fn render_shards(rows: &Value) -> String {
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        return String::new();
    };
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
            r["shard"].to_string(),
            r["clients"].to_string(),
            r["tcp_connections"].to_string(),
            r["rx_frames"].to_string(),
            r["tx_frames"].to_string(),
            r["pool_in_use"].to_string(),
            r["handoff_out"].to_string(),
            r["handoff_in"].to_string(),
            r["redirected"].to_string(),
            r["every_copies"].to_string(),
        );
    }
    out
}

/// The priority-aware receive section of `usnet stat` (empty when both are off).
pub fn render_priority(p: &Value) -> String {
    let on = |k: &str| p[k].as_bool().unwrap_or(false);
    if !on("forced_drop") && !on("priority") {
        return String::new();
    }
    let list = |k: &str| {
        let v: Vec<String> = p[k]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| x.to_string())
            .collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    let mut out = format!(
        "priority:\n    forced drop {}{}, priority control {}, set of {}\n    ports P: {}\n    boosted: {}\n",
        if on("forced_drop") { "on" } else { "off" },
        if on("forced_drop_active") { " (dropping now)" } else { "" },
        if on("priority") { "on" } else { "off" },
        p["set_size"],
        list("ports"),
        list("boosted"),
    );
    for m in p["members"].as_array().into_iter().flatten() {
        out += &format!(
            "    S: port {:<6} priority {:>4}  owner {:<5} consumer {}\n",
            m["port"],
            m["priority"],
            m["owner"],
            m["pid"].as_u64().map_or("-".to_string(), |p| p.to_string())
        );
    }
    out
}
