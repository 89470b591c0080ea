//! `usnet nicemu`: the flags of the emulated NIC's device side, converted into
//! `usnet_nicemu::NicemuOptions` (whose `Default` gives the defaults shown here).

use std::net::SocketAddrV4;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use usnet_nicemu::{NicemuOptions, RingFullPolicy, TxMode};

fn parse_prob(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err("a probability is between 0 and 1".into())
    }
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{e}"))?;
    v.try_into().map_err(|_| "a MAC has six bytes".to_string())
}

/// What the device does with frames the driver transmits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TxArg {
    /// Count them.
    Count,
    /// Check their IPv4 and UDP checksums and lengths.
    Verify,
    /// Put them back on the RX ring unchanged.
    Loopback,
    /// Put them back on the RX ring as replies (MACs, addresses, ports swapped).
    Echo,
}

/// What the device does when the next RX descriptor is not its own (ring full).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RingFullArg {
    /// Count the frame as missed and drop it, like hardware.
    Drop,
    /// Wait for the driver (flow control; lossless functional tests).
    Wait,
}

/// The device-side tool (`usnet nicemu`).
#[derive(Debug, Clone, Args)]
pub struct NicemuArgs {
    /// NIC name: attaches to /dev/shm/usnet-nic-NAME (created by the driver).
    #[arg(long)]
    pub name: String,
    /// Ethernet frame size in bytes (64..=65536; MTU + 14 must allow it).
    #[arg(long, default_value_t = NicemuOptions::default().size)]
    pub size: usize,
    /// Interval between interrupts (per packet, or per batch with --batch), in ns.
    #[arg(long, default_value_t = NicemuOptions::default().interval_ns)]
    pub interval_ns: u64,
    /// Frames to generate (0: none, only serve the TX ring for --linger-ms).
    #[arg(long, default_value_t = NicemuOptions::default().count)]
    pub count: u64,
    /// Frames placed per interval; one interrupt per batch unless --irq-per-packet.
    #[arg(long, default_value_t = NicemuOptions::default().batch)]
    pub batch: u32,
    /// With --batch > 1: raise an interrupt after every frame.
    #[arg(long)]
    pub irq_per_packet: bool,
    /// Destination of the generated UDP datagrams.
    #[arg(long, default_value_t = NicemuOptions::default().dst)]
    pub dst: SocketAddrV4,
    /// Source of the generated UDP datagrams.
    #[arg(long, default_value_t = NicemuOptions::default().src)]
    pub src: SocketAddrV4,
    /// Source MAC (the destination MAC is the driver's, from the NIC's config block).
    #[arg(long, default_value = "02:00:00:00:00:01", value_parser = parse_mac)]
    pub src_mac: [u8; 6],
    /// Pin the device side to this core.
    #[arg(long)]
    pub core: Option<usize>,
    /// Run the device side in SCHED_FIFO (real-time) so other load cannot preempt it.
    #[arg(long)]
    pub rt: bool,
    /// Wait this long for the driver to create the NIC.
    #[arg(long, default_value_t = NicemuOptions::default().wait_ms)]
    pub wait_ms: u64,
    /// Delay between attaching (link up) and the first frame.
    #[arg(long, default_value_t = NicemuOptions::default().start_delay_ms)]
    pub start_delay_ms: u64,
    /// Keep serving the TX ring this long after the last frame.
    #[arg(long, default_value_t = NicemuOptions::default().linger_ms)]
    pub linger_ms: u64,
    /// When the RX ring is full: drop (count as missed, like hardware) or wait.
    #[arg(long, value_enum, default_value_t = RingFullArg::Drop)]
    pub ring_full: RingFullArg,
    /// What to do with transmitted frames.
    #[arg(long, value_enum, default_value_t = TxArg::Count)]
    pub tx: TxArg,
    /// Fault: probability of dropping a frame.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub drop: f64,
    /// Fault: probability of corrupting a frame's last byte (checksum no longer matches).
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub corrupt: f64,
    /// Fault: probability of placing a frame twice.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub duplicate: f64,
    /// Fault: probability of holding a frame back behind the next one.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub reorder: f64,
    /// Bad descriptor: probability of completing one with a length beyond its buffer.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_len: f64,
    /// Bad descriptor: probability of completing one with a buffer index out of range.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_index: f64,
    /// Bad descriptor: probability of completing a last segment with no first.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub bad_flags: f64,
    /// OWN game: probability of skipping a descriptor it still owns.
    #[arg(long, default_value_t = 0.0, value_parser = parse_prob)]
    pub own_skip: f64,
    /// Ring full: every K intervals place a back-to-back burst of --burst-len frames.
    #[arg(long, default_value_t = 0)]
    pub burst_every: u64,
    #[arg(long, default_value_t = 0)]
    pub burst_len: u64,
    /// Link flap: every N frames take the link down for --link-down-pkts frames.
    #[arg(long, default_value_t = 0)]
    pub link_flap_every: u64,
    #[arg(long, default_value_t = NicemuOptions::default().link_down_pkts)]
    pub link_down_pkts: u64,
    /// Die (abort the process, no clean-up) after placing this many frames.
    #[arg(long)]
    pub die_after: Option<u64>,
    /// Seed of the fault generator.
    #[arg(long, default_value_t = NicemuOptions::default().seed)]
    pub seed: u64,
    /// Write a JSON report here.
    #[arg(long)]
    pub stats_out: Option<PathBuf>,
    /// Include every interrupt's raise time in the JSON report.
    #[arg(long)]
    pub record_raises: bool,
    /// Print nothing.
    #[arg(long)]
    pub quiet: bool,
}

impl From<NicemuArgs> for NicemuOptions {
    fn from(a: NicemuArgs) -> Self {
        NicemuOptions {
            name: a.name,
            size: a.size,
            interval_ns: a.interval_ns,
            count: a.count,
            batch: a.batch,
            irq_per_packet: a.irq_per_packet,
            dst: a.dst,
            src: a.src,
            src_mac: a.src_mac,
            core: a.core,
            rt: a.rt,
            wait_ms: a.wait_ms,
            start_delay_ms: a.start_delay_ms,
            linger_ms: a.linger_ms,
            ring_full: match a.ring_full {
                RingFullArg::Drop => RingFullPolicy::Drop,
                RingFullArg::Wait => RingFullPolicy::Wait,
            },
            tx: match a.tx {
                TxArg::Count => TxMode::Count,
                TxArg::Verify => TxMode::Verify,
                TxArg::Loopback => TxMode::Loopback,
                TxArg::Echo => TxMode::Echo,
            },
            drop: a.drop,
            corrupt: a.corrupt,
            duplicate: a.duplicate,
            reorder: a.reorder,
            bad_len: a.bad_len,
            bad_index: a.bad_index,
            bad_flags: a.bad_flags,
            own_skip: a.own_skip,
            burst_every: a.burst_every,
            burst_len: a.burst_len,
            link_flap_every: a.link_flap_every,
            link_down_pkts: a.link_down_pkts,
            die_after: a.die_after,
            seed: a.seed,
            stats_out: a.stats_out,
            record_raises: a.record_raises,
            quiet: a.quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: NicemuArgs,
    }

    #[test]
    fn cli_defaults_are_the_library_defaults() {
        let o: NicemuOptions = P::parse_from(["nicemu", "--name", "n0"]).a.into();
        assert_eq!(o, NicemuOptions::new("n0"));
    }
}
