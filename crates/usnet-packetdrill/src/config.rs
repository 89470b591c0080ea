//! What a script's run is set up with: the `--so_flags` options, the stack they
//! describe (addresses, MTU, seed, TCP template) and its in-memory link, and the
//! sysctl lines a script adds while it runs.

use std::ffi::c_int;
use std::net::{Ipv4Addr, Ipv6Addr};

use usnet_link::DeviceCaps;
use usnet_stack::{IpCidr, Stack, StackConfig};

use crate::link::STACK_MAC;

/// A call's result: the value, or an errno.
pub(crate) type Res<T> = Result<T, c_int>;

/// The options parsed from `--so_flags`.
#[derive(Debug, Clone)]
pub struct Options {
    pub local: IpCidr,
    pub gateway: Ipv4Addr,
    pub local6: IpCidr,
    pub gateway6: Ipv6Addr,
    pub mtu: usize,
    pub seed: u64,
    pub tick_ns: u64,
    /// Answer packetdrill's own `getsockopt(TCP_INFO)` on our descriptors
    /// (`trap=0` turns it off; see `crate::trap`).
    pub trap: bool,
    /// The TCP template: `profile=NAME`, then any Linux sysctl name
    /// (`tcp_timestamps=0`, `tcp_rmem=4096 87380 6291456`, ...).
    pub tcp: usnet_stack::TcpConfig,
    /// `sysctl_file=PATH`: a file of `tcp_name=value` lines that grows while the
    /// script runs (its mid-script sysctl commands append to it); each system call
    /// first applies the lines added since the last one.
    pub sysctl_file: Option<String>,
    /// `gso_mss=N` (a script's `--mss=N`): packetdrill hands every TCP packet it
    /// injects to the kernel as a GSO frame of `N`-byte segments; the link gives
    /// the stack such frames with that `gso_size`, as a device that coalesced them.
    pub gso_mss: Option<u16>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            local: "192.168.0.1/16".parse().expect("literal"),
            gateway: Ipv4Addr::new(192, 168, 0, 2),
            local6: "fd3d:fa7b:d17d::1/48".parse().expect("literal"),
            gateway6: "fd3d:fa7b:d17d::2".parse().expect("literal"),
            mtu: 1500,
            seed: 0x7064_7269_6c6c,
            tick_ns: 1_000,
            trap: true,
            tcp: usnet_stack::TcpConfig::default(),
            sysctl_file: None,
            gso_mss: None,
        }
    }
}

impl Options {
    /// Parses `key=value,...`; unknown keys are an error. `profile=` applies before
    /// the sysctls, wherever it stands.
    pub fn parse(flags: &str) -> Result<Options, String> {
        let mut o = Options::default();
        let items: Vec<&str> = flags
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        for item in &items {
            if let Some(p) = item.strip_prefix("profile=") {
                o.tcp = usnet_stack::TcpConfig::profile(p).ok_or_else(|| {
                    format!(
                        "flag profile={p}: unknown profile (known: {})",
                        usnet_stack::TCP_PROFILES.join(", ")
                    )
                })?;
            }
        }
        for item in items {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("flag {item:?}: expected key=value"))?;
            let bad = |e: &dyn std::fmt::Debug| format!("flag {k}={v}: {e:?}");
            match k {
                "local" => o.local = v.parse().map_err(|e| bad(&e))?,
                "gateway" => o.gateway = v.parse().map_err(|e| bad(&e))?,
                "local6" => o.local6 = v.parse().map_err(|e| bad(&e))?,
                "gateway6" => o.gateway6 = v.parse().map_err(|e| bad(&e))?,
                "mtu" => o.mtu = v.parse().map_err(|e| bad(&e))?,
                "seed" => o.seed = v.parse().map_err(|e| bad(&e))?,
                "tick_us" => {
                    o.tick_ns = v.parse::<u64>().map_err(|e| bad(&e))?.saturating_mul(1000)
                }
                "profile" => {}
                "trap" => o.trap = v != "0",
                "gso_mss" => o.gso_mss = Some(v.parse().map_err(|e| bad(&e))?),
                "sysctl_file" => o.sysctl_file = Some(v.to_string()),
                // Every connection on pool-backed queues (`usnet up --pool-buffers`).
                "pool_buffers" => o.tcp.zero_copy = v != "0",
                // The one socket layer there is (the flag of earlier versions).
                "layer" if v == "posix" => {}
                _ if k.starts_with("tcp_") || k == "default_qdisc" => o.tcp.set_sysctl(k, v)?,
                _ => return Err(format!("unknown flag {k:?}")),
            }
        }
        Ok(o)
    }
}

/// The stack a script runs against: packetdrill's addresses, the options' MTU,
/// seed and TCP template.
pub(crate) fn stack_config(o: &Options) -> StackConfig {
    StackConfig {
        mac: STACK_MAC,
        addrs: vec![o.local, o.local6],
        gateway4: Some(o.gateway),
        gateway6: Some(o.gateway6),
        mtu: o.mtu,
        seed: o.seed,
        tcp: o.tcp.clone(),
        ..Default::default()
    }
}

/// The in-memory link: the options' MTU, no offloads.
pub(crate) fn device_caps(o: &Options) -> DeviceCaps {
    DeviceCaps {
        mtu: o.mtu,
        rx_csum_offload: false,
        tx_csum_offload: false,
        tso: false,
        max_burst: 64,
    }
}

/// One line of the script's sysctl file: `tcp_name=value`, or the line that
/// flushes the stack's TCP metrics.
pub(crate) fn apply_sysctl_line(stack: &mut Stack, line: &str) {
    if line.trim() == FLUSH_METRICS {
        stack.tcp_flush_metrics();
        return;
    }
    if let Some((k, v)) = line.trim().split_once('=') {
        if let Err(e) = stack.tcp_config_mut().set_sysctl(k.trim(), v.trim()) {
            eprintln!("usnet-packetdrill: sysctl {k}={v}: {e}");
        }
    }
}

/// The `sysctl_file` line for a script's `ip tcp_metrics flush`: the stack forgets
/// its per-destination metrics (Fast Open cookies).
pub const FLUSH_METRICS: &str = "tcp_metrics_flush";
