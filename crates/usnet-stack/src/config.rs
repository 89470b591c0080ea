//! Stack configuration and address/prefix types.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use usnet_pool::PoolConfig;
use usnet_wire::MacAddr;

/// An interface address with its prefix length, e.g. `10.20.0.2/24` or `fd00::2/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpCidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad address '{0}': expected ADDRESS/PREFIX such as 10.20.0.2/24 or fd00::2/64")]
pub struct CidrParseError(pub String);

impl IpCidr {
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(IpCidr { addr, prefix })
    }

    /// Whether `other` is inside this prefix.
    pub fn contains(&self, other: IpAddr) -> bool {
        match (self.addr, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = prefix_mask32(self.prefix);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = prefix_mask128(self.prefix);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }

    /// The directed broadcast address of an IPv4 prefix.
    pub fn broadcast_v4(&self) -> Option<Ipv4Addr> {
        match self.addr {
            IpAddr::V4(a) if self.prefix < 31 => {
                Some(Ipv4Addr::from(u32::from(a) | !prefix_mask32(self.prefix)))
            }
            _ => None,
        }
    }
}

fn prefix_mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

fn prefix_mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix as u32)
    }
}

impl FromStr for IpCidr {
    type Err = CidrParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrParseError(s.to_string());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().map_err(|_| err())?,
            None if addr.is_ipv4() => 24,
            None => 64,
        };
        let cidr = IpCidr::new(addr, prefix).ok_or_else(err)?;
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(err());
        }
        if let IpAddr::V4(v4) = addr {
            if v4.is_broadcast() {
                return Err(err());
            }
        }
        Ok(cidr)
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Everything a stack needs to start. `Default` gives a working single-interface stack
/// with no addresses.
#[derive(Debug, Clone)]
pub struct StackConfig {
    pub mac: MacAddr,
    /// IPv4 and IPv6 addresses; an IPv6 link-local address derived from the MAC is
    /// always added.
    pub addrs: Vec<IpCidr>,
    pub gateway4: Option<Ipv4Addr>,
    pub gateway6: Option<Ipv6Addr>,
    /// L3 MTU of the link.
    pub mtu: usize,
    /// The host kernel's index of the interface the link attaches to (0: none, as
    /// for a shared-memory link): what received datagrams report as their
    /// interface (`IP_PKTINFO`'s `ipi_ifindex`).
    pub ifindex: u32,
    pub pool: PoolConfig,
    /// Frames that may wait between the device and protocol processing; beyond this
    /// they are dropped at the entrance (drop 1).
    pub input_queue_len: usize,
    /// Frames processed per `poll` (NAPI-style budget), so timers and transmit get a turn.
    pub rx_budget: usize,
    /// Bytes a UDP socket may hold unread (Linux's rmem_default).
    pub udp_recv_buffer: usize,
    /// Frames that may wait for the device before sends report `WouldBlock`.
    pub tx_queue_len: usize,
    pub neighbor_ttl: Duration,
    pub neighbor_retry: Duration,
    pub neighbor_max_probes: u32,
    pub neighbor_cache_size: usize,
    /// Packets held per neighbour while its address is being resolved.
    pub neighbor_pending: usize,
    pub reasm_timeout: Duration,
    /// Bytes all reassemblies together may hold.
    pub reasm_memory: usize,
    pub reasm_max_datagrams: usize,
    pub ttl: u8,
    /// ICMP errors per second (token bucket).
    pub icmp_error_rate: u32,
    /// The device verified received checksums (frames marked `csum_valid` are trusted).
    pub rx_csum_offload: bool,
    /// The device completes partial L4 checksums on transmit.
    pub tx_csum_offload: bool,
    /// The device takes TCP segmentation offload (`DeviceCaps::tso`): the TCP sink
    /// joins consecutive full-sized segments of one connection, produced in one output
    /// pass, into a GSO frame of up to 64 KiB built as a chain of pool buffers (needs
    /// `tx_csum_offload`; otherwise it has no effect).
    pub tso: bool,
    /// Receive coalescing (GRO): consecutive in-order data segments of one connection
    /// that one `poll` takes from the input queue reach the TCP engine as one segment,
    /// their payloads read in place (see `gro.rs`). Off: each segment on its own.
    pub gro: bool,
    /// Seed for identifiers, ephemeral ports and the TCP secret (ISNs, SYN cookies,
    /// timestamp offsets): the same seed gives the same run. A stack on a real link
    /// must get a random seed (the runtime and the CLI draw one from getrandom(2)).
    pub seed: u64,
    /// Template for TCP connections and listeners: buffer sizes, congestion control,
    /// timers, options. The stack sets `mss` from the MTU and `secret` from `seed`.
    pub tcp: usnet_tcp::TcpConfig,
    /// Priority-aware receive (forced drop, priority control); off by default.
    pub rx_policy: RxPolicy,
    /// This stack's place among the shards of one host (`shard.rs`): frames owned
    /// by another shard are handed over, ephemeral ports and ping identifiers come
    /// from this shard's own class. One shard (the default) changes nothing.
    pub shard: crate::shard::ShardRole,
}

/// Priority-aware receive (docs/priority.md): the top `set_size` sockets by their
/// consumers' priority form the set S (ports P, consumers Q). Both mechanisms are
/// off by default.
#[derive(Debug, Clone, PartialEq)]
pub struct RxPolicy {
    /// Mechanism A: while drop 1 happens (or the input queue is above
    /// `threshold`), frames for ports outside P are dropped at the entrance, before
    /// any IP work, with probability `drop_probability`.
    pub forced_drop: bool,
    /// Mechanism B: when a priority socket's queue passes half its limit, ask for its
    /// consumer's scheduling priority to be raised by `boost` nice steps for at most
    /// `boost_time` (the stack only emits the request: see `Stack::take_sched_requests`).
    pub priority: bool,
    /// n: how many sockets S holds.
    pub set_size: usize,
    /// Activation conditions (and a full recomputation of S) at most this often.
    pub interval: Duration,
    /// Input queue length at which forced drop activates even before drop 1
    /// (0: half the input queue).
    pub threshold: usize,
    pub drop_probability: f64,
    /// Nice steps a boost raises a consumer by (the hook keeps it within -20..19).
    pub boost: i32,
    /// The longest a boost lasts.
    pub boost_time: Duration,
    /// A boost ends early once its queue has drained: below a quarter of its limit
    /// with nothing arrived for this long (the burst is over). Within a burst a
    /// boosted reader keeps its queue short, so "below a quarter" alone would end
    /// the boost while the burst still comes.
    pub drain_quiet: Duration,
}

impl Default for RxPolicy {
    fn default() -> Self {
        RxPolicy {
            forced_drop: false,
            priority: false,
            set_size: 2,
            interval: Duration::from_secs(1),
            threshold: 0,
            drop_probability: 0.9,
            boost: 10,
            boost_time: Duration::from_secs(1),
            drain_quiet: Duration::from_millis(20),
        }
    }
}

impl RxPolicy {
    /// Either mechanism is on.
    pub fn enabled(&self) -> bool {
        self.forced_drop || self.priority
    }
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            mac: MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x01]),
            addrs: Vec::new(),
            gateway4: None,
            gateway6: None,
            mtu: 1500,
            ifindex: 0,
            pool: PoolConfig::default(),
            input_queue_len: 1000,
            rx_budget: 256,
            udp_recv_buffer: 212_992,
            tx_queue_len: 1024,
            neighbor_ttl: Duration::from_secs(60),
            neighbor_retry: Duration::from_secs(1),
            neighbor_max_probes: 3,
            neighbor_cache_size: 1024,
            neighbor_pending: 64,
            reasm_timeout: Duration::from_secs(30),
            reasm_memory: 4 << 20,
            reasm_max_datagrams: 64,
            ttl: 64,
            icmp_error_rate: 1000,
            rx_csum_offload: false,
            tx_csum_offload: false,
            tso: false,
            gro: true,
            seed: 0x5eed_0001,
            tcp: usnet_tcp::TcpConfig::default(),
            rx_policy: RxPolicy::default(),
            shard: crate::shard::ShardRole::default(),
        }
    }
}

impl StackConfig {
    /// This configuration as shard `i` of `n` (`shard.rs`): its role, and a seed of
    /// its own (ISNs, ports and cookies differ between shards; shard 0 keeps this
    /// one).
    pub fn for_shard(&self, i: usize, n: usize) -> StackConfig {
        let mut c = self.clone();
        c.shard = crate::shard::ShardRole::new(i, n);
        c.seed = self.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        c
    }
}

/// A locally administered unicast MAC derived from a seed (for stacks given no MAC).
pub fn mac_from_seed(seed: u64) -> MacAddr {
    let b = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes();
    MacAddr([0x02, b[1], b[2], b[3], b[4], b[5]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_contains() {
        let c: IpCidr = "10.20.0.2/24".parse().unwrap();
        assert!(c.contains("10.20.0.77".parse().unwrap()));
        assert!(!c.contains("10.20.1.1".parse().unwrap()));
        assert_eq!(c.broadcast_v4(), Some(Ipv4Addr::new(10, 20, 0, 255)));
        let c6: IpCidr = "fd00:20::2/64".parse().unwrap();
        assert!(c6.contains("fd00:20::99".parse().unwrap()));
        assert!(!c6.contains("fd00:21::1".parse().unwrap()));
        assert!(!c6.contains("10.20.0.1".parse().unwrap()));
        for bad in [
            "10.20.0.2/33",
            "nonsense",
            "0.0.0.0/8",
            "10.0.0.1/x",
            "::/0",
            "ff02::1/64",
        ] {
            assert!(bad.parse::<IpCidr>().is_err(), "{bad}");
        }
        assert_eq!("10.1.2.3".parse::<IpCidr>().unwrap().prefix, 24);
    }

    #[test]
    fn mac_from_seed_is_local_unicast() {
        let m = mac_from_seed(42);
        assert_eq!(m.0[0], 0x02);
        assert!(m.is_unicast());
    }
}
