//! Naming a link on the command line (`tap:NAME`, `shm:NAME`, `afpacket:IFNAME`,
//! `xdp:IFNAME[@QUEUE]`, `nic:NAME`) and opening it with its wrappers. Link names are parsed here and nowhere
//! else.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::af_packet::AfPacketDevice;
use crate::error::LinkError;
use crate::fault::{FaultConfig, FaultInjector};
use crate::nic::{NicDriver, NicOptions};
use crate::pcap::PcapWriter;
use crate::shm::{ShmConfig, ShmDevice};
use crate::tap::{TapConfig, TapDevice};
use crate::xdp::{XdpDevice, XdpMode, XdpOptions};
use crate::Device;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSpec {
    Tap(String),
    Shm(String),
    AfPacket(String),
    /// An AF_XDP socket on RX queue `queue` of `ifname`, the pool as its UMEM.
    Xdp {
        ifname: String,
        queue: u32,
    },
    /// The emulated NIC's driver (the device side is `usnet nicemu --name NAME`).
    Nic(String),
}

impl LinkSpec {
    /// The host kernel's index of the interface this link attaches to (a TAP
    /// device once opened, an AF_PACKET or AF_XDP interface); None for links
    /// with no kernel interface (shm, the emulated NIC) or a name not found.
    pub fn kernel_ifindex(&self) -> Option<u32> {
        match self {
            LinkSpec::Tap(n) | LinkSpec::AfPacket(n) | LinkSpec::Xdp { ifname: n, .. } => {
                crate::sys::if_index(n).ok()
            }
            LinkSpec::Shm(_) | LinkSpec::Nic(_) => None,
        }
    }
}

impl FromStr for LinkSpec {
    type Err = LinkError;

    fn from_str(s: &str) -> Result<Self, LinkError> {
        let unknown = || LinkError::UnknownKind(s.to_string());
        let (kind, name) = s.split_once(':').ok_or_else(unknown)?;
        if name.is_empty() {
            return Err(unknown());
        }
        match kind {
            "tap" => {
                crate::sys::check_ifname(name)?;
                Ok(LinkSpec::Tap(name.to_string()))
            }
            "shm" => {
                crate::shm::check_shm_name(name)?;
                Ok(LinkSpec::Shm(name.to_string()))
            }
            "afpacket" | "af_packet" => {
                crate::sys::check_ifname(name)?;
                Ok(LinkSpec::AfPacket(name.to_string()))
            }
            "xdp" | "af_xdp" => {
                let (ifname, queue) = match name.rsplit_once('@') {
                    Some((i, q)) => {
                        let q = q.parse::<u32>().map_err(|_| LinkError::BadName {
                            name: name.to_string(),
                            why: "the queue after '@' is an RX queue number, e.g. xdp:eth0@1",
                        })?;
                        (i, q)
                    }
                    None => (name, 0),
                };
                crate::sys::check_ifname(ifname)?;
                Ok(LinkSpec::Xdp {
                    ifname: ifname.to_string(),
                    queue,
                })
            }
            "nic" => {
                if !crate::nic::layout::valid_name(name) {
                    return Err(LinkError::BadName {
                        name: name.to_string(),
                        why: "use at most 64 letters, digits, '-', '_' and '.', not starting with '.'",
                    });
                }
                Ok(LinkSpec::Nic(name.to_string()))
            }
            _ => Err(unknown()),
        }
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkSpec::Tap(n) => write!(f, "tap:{n}"),
            LinkSpec::Shm(n) => write!(f, "shm:{n}"),
            LinkSpec::AfPacket(n) => write!(f, "afpacket:{n}"),
            LinkSpec::Xdp { ifname, queue: 0 } => write!(f, "xdp:{ifname}"),
            LinkSpec::Xdp { ifname, queue } => write!(f, "xdp:{ifname}@{queue}"),
            LinkSpec::Nic(n) => write!(f, "nic:{n}"),
        }
    }
}

/// Options that apply when opening any link.
#[derive(Debug, Clone, Default)]
pub struct LinkOptions {
    /// L3 MTU (TAP: set on both sides; shm: the link's MTU; af_packet: must not exceed the
    /// interface's).
    pub mtu: Option<usize>,
    /// Record every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Inject faults (applied inside the pcap writer, so the capture shows what the
    /// stack actually sent and received).
    pub fault: Option<FaultConfig>,
    /// CIDRs given to the Linux side of a TAP, e.g. "10.20.0.1/24", "fd00:20::1/64".
    pub tap_host_addrs: Vec<String>,
    /// Slots per ring of a shm link (a power of two).
    pub shm_slots: Option<usize>,
    /// Queues per side of a shm link (when this side creates it).
    pub shm_queues: Option<usize>,
    /// TAP: negotiate TCP segmentation offload (TUN_F_TSO4/6), so the stack may hand
    /// the kernel 64 KiB TCP frames and the kernel sends it coalesced ones. Other
    /// links ignore it.
    pub tso: bool,
    /// The emulated NIC's driver: rings, buffers, interrupt mode and moderation
    /// (`mtu` and the MAC are taken from [`LinkOptions::mtu`] and
    /// [`LinkOptions::mac`] when those are set). Other links ignore it.
    pub nic: NicOptions,
    /// The stack's MAC, the one place a link learns it. AF_PACKET: the socket takes
    /// only the frames sent to it and to group addresses (a filter in the kernel),
    /// so the host's own traffic on the interface costs the stack nothing; without
    /// it the stack sees every frame. AF_XDP (required there): the steering program
    /// redirects the frames sent to it. The emulated NIC: its config block carries
    /// it (the device side sends to it). Other links ignore it.
    pub mac: Option<[u8; 6]>,
    /// AF_XDP: the stack's addresses (the steering program redirects the ARP
    /// requests and neighbour solicitations for them). Other links ignore them.
    pub addrs: Vec<IpAddr>,
    /// AF_XDP: the bind mode. Other links ignore it.
    pub xdp_mode: XdpMode,
}

/// What the AF_XDP steering program needs, from the options that describe the stack.
fn xdp_options(opts: &LinkOptions) -> XdpOptions {
    let mut x = XdpOptions {
        mac: opts.mac.unwrap_or_default(),
        mode: opts.xdp_mode,
        ..XdpOptions::default()
    };
    for a in &opts.addrs {
        match a {
            IpAddr::V4(v4) => x.ipv4.push(*v4),
            IpAddr::V6(v6) => x.ipv6.push(*v6),
        }
    }
    x
}

fn shm_config(opts: &LinkOptions) -> ShmConfig {
    ShmConfig {
        mtu: opts.mtu,
        slots: opts.shm_slots,
        queues: opts.shm_queues,
        ..ShmConfig::default()
    }
}

/// Opens the link named by `spec`, wrapped in a fault injector and then a pcap writer
/// when `opts` asks for them.
pub fn open(spec: &LinkSpec, opts: &LinkOptions) -> Result<Box<dyn Device>, LinkError> {
    let dev: Box<dyn Device> = match spec {
        LinkSpec::Tap(name) => Box::new(TapDevice::open(
            name,
            &TapConfig {
                mtu: opts.mtu,
                host_addrs: opts.tap_host_addrs.clone(),
                tso: opts.tso,
            },
        )?),
        LinkSpec::Shm(name) => Box::new(ShmDevice::open(name, &shm_config(opts))?),
        LinkSpec::AfPacket(ifname) => {
            let mut d = AfPacketDevice::open(ifname, opts.mtu)?;
            if let Some(mac) = opts.mac {
                d.accept_only(mac)?;
            }
            Box::new(d)
        }
        LinkSpec::Xdp { ifname, queue } => Box::new(XdpDevice::open(
            ifname,
            *queue,
            opts.mtu,
            &xdp_options(opts),
        )?),
        LinkSpec::Nic(name) => {
            let mut nic = opts.nic.clone();
            if let Some(mtu) = opts.mtu {
                nic.mtu = mtu;
            }
            if let Some(mac) = opts.mac {
                nic.mac = mac;
            }
            Box::new(NicDriver::create(name, &nic)?)
        }
    };
    wrap(dev, opts)
}

/// Puts the wrappers `opts` asks for around any device (also one opened elsewhere):
/// fault injection inside, pcap outermost.
/// Opens the link for `n` shards of one stack, one device each, whose frames the
/// link steers to the shard that owns them (`usnet_stack::shard`): AF_PACKET as a
/// fanout group with the steering program ([`crate::bpf::shard_steering`]), TAP
/// with one queue per shard, AF_XDP with one socket per RX queue (shard `i` on
/// queue `i`: the interface's own hash picks the queue, so frames it put on the
/// wrong one are handed over), shm with one queue per shard (the sender steers). With `opts.pcap`, shard `i` writes `NAME.i.pcap`.
pub fn open_shards(
    spec: &LinkSpec,
    opts: &LinkOptions,
    n: usize,
) -> Result<Vec<Box<dyn Device>>, LinkError> {
    if n <= 1 {
        return Ok(vec![open(spec, opts)?]);
    }
    let devs: Vec<Box<dyn Device>> = match spec {
        LinkSpec::AfPacket(ifname) => {
            let mut devs = AfPacketDevice::open_shards(ifname, opts.mtu, n)?;
            if let Some(mac) = opts.mac {
                for d in &mut devs {
                    d.accept_only(mac)?;
                }
            }
            devs.into_iter()
                .map(|d| Box::new(d) as Box<dyn Device>)
                .collect()
        }
        LinkSpec::Tap(name) => TapDevice::open_queues(
            name,
            &TapConfig {
                mtu: opts.mtu,
                host_addrs: opts.tap_host_addrs.clone(),
                tso: opts.tso,
            },
            n,
        )?
        .into_iter()
        .map(|d| Box::new(d) as Box<dyn Device>)
        .collect(),
        LinkSpec::Xdp { ifname, queue: 0 } => {
            XdpDevice::open_queues(ifname, n, opts.mtu, &xdp_options(opts))?
                .into_iter()
                .map(|d| Box::new(d) as Box<dyn Device>)
                .collect()
        }
        LinkSpec::Shm(name) => ShmDevice::open_queues(name, &shm_config(opts), n)?
            .into_iter()
            .map(|d| Box::new(d) as Box<dyn Device>)
            .collect(),
        other => return Err(LinkError::NoShards(other.to_string())),
    };
    devs.into_iter()
        .enumerate()
        .map(|(i, d)| {
            let mut o = opts.clone();
            o.pcap = opts
                .pcap
                .as_ref()
                .map(|p| p.with_extension(format!("{i}.pcap")));
            wrap(d, &o)
        })
        .collect()
}

pub fn wrap(dev: Box<dyn Device>, opts: &LinkOptions) -> Result<Box<dyn Device>, LinkError> {
    let dev: Box<dyn Device> = match &opts.fault {
        Some(f) => Box::new(FaultInjector::new(dev, f.clone())),
        None => dev,
    };
    let dev: Box<dyn Device> = match &opts.pcap {
        Some(path) => Box::new(PcapWriter::create(dev, path)?),
        None => dev,
    };
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steering_program_learns_the_stack_from_the_link_options() {
        let mac = [0x02, 0, 0x5e, 0, 1, 2];
        let opts = LinkOptions {
            mac: Some(mac),
            addrs: vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            xdp_mode: XdpMode::Copy,
            ..LinkOptions::default()
        };
        let x = xdp_options(&opts);
        assert_eq!(x.mac, mac);
        assert_eq!(
            x.ipv4,
            vec!["10.0.0.2".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            x.ipv6,
            vec!["fd00::2".parse::<std::net::Ipv6Addr>().unwrap()]
        );
        assert_eq!(x.mode, XdpMode::Copy);
        // Without a MAC the program has none to steer by: XdpDevice refuses it.
        assert_eq!(xdp_options(&LinkOptions::default()).mac, [0; 6]);
    }

    #[test]
    fn parses_and_prints() {
        for s in [
            "tap:usnet0",
            "shm:bench",
            "afpacket:veth0",
            "nic:n0",
            "xdp:veth0",
            "xdp:eth1@3",
        ] {
            let spec: LinkSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
        assert_eq!(
            "af_packet:eth0".parse::<LinkSpec>().unwrap(),
            LinkSpec::AfPacket("eth0".into())
        );
        assert_eq!(
            "xdp:eth0@0".parse::<LinkSpec>().unwrap(),
            LinkSpec::Xdp {
                ifname: "eth0".into(),
                queue: 0
            }
        );
    }

    #[test]
    fn rejects_unknown_with_one_clear_line() {
        let e = "foo:x".parse::<LinkSpec>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown link 'foo:x': expected tap:NAME, shm:NAME, afpacket:IFNAME, \
             xdp:IFNAME[@QUEUE] or nic:NAME"
        );
        assert!(matches!(
            "tap".parse::<LinkSpec>(),
            Err(LinkError::UnknownKind(_))
        ));
        assert!(matches!(
            "shm:".parse::<LinkSpec>(),
            Err(LinkError::UnknownKind(_))
        ));
        assert!(matches!(
            "shm:../etc".parse::<LinkSpec>(),
            Err(LinkError::BadName { .. })
        ));
        assert!(matches!(
            "tap:waytoolonginterfacename".parse::<LinkSpec>(),
            Err(LinkError::BadName { .. })
        ));
        assert!(matches!(
            "nic:../x".parse::<LinkSpec>(),
            Err(LinkError::BadName { .. })
        ));
        for bad in [
            "xdp:eth0@",
            "xdp:eth0@x",
            "xdp:eth0@-1",
            "xdp:@1",
            "xdp:a/b",
        ] {
            let e = bad.parse::<LinkSpec>().unwrap_err();
            assert!(matches!(e, LinkError::BadName { .. }), "{bad}: {e}");
            assert!(!e.to_string().contains('\n'), "{bad}: {e}");
        }
        assert!(matches!(
            "xdp:".parse::<LinkSpec>(),
            Err(LinkError::UnknownKind(_))
        ));
    }

    #[test]
    fn open_missing_interface_is_clear() {
        if !crate::sys::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let e = open(
            &LinkSpec::AfPacket("nosuch0".into()),
            &LinkOptions::default(),
        )
        .err()
        .unwrap();
        assert_eq!(
            e.to_string(),
            "interface 'nosuch0' not found: check `ip link` for its name"
        );
    }

    #[test]
    fn open_wraps_fault_inside_pcap() {
        let name = format!("t{}-open", std::process::id());
        let pcap = std::env::temp_dir().join(format!("usnet-open-{}.pcap", std::process::id()));
        let spec: LinkSpec = format!("shm:{name}").parse().unwrap();
        let mut a = open(
            &spec,
            &LinkOptions {
                pcap: Some(pcap.clone()),
                fault: Some("drop=0.5,seed=3,dir=tx".parse().unwrap()),
                shm_slots: Some(256),
                ..Default::default()
            },
        )
        .unwrap();
        let mut b = open(&spec, &LinkOptions::default()).unwrap();
        assert_eq!(a.name(), format!("shm:{name}"));
        let mut p = crate::testutil::pool(512, 2048);
        let mut q: std::collections::VecDeque<_> = (0..100u8)
            .map(|i| p.alloc_from(&[i; 64]).unwrap())
            .collect();
        while !q.is_empty() {
            a.tx_burst(&mut p, &mut q).unwrap();
        }
        let mut got = Vec::new();
        b.rx_burst(&mut p, &mut got, 200).unwrap();
        // About half were dropped by the injector, but the capture shows all 100 the
        // stack sent.
        assert!((30..70).contains(&got.len()), "{}", got.len());
        for f in got {
            p.free(f);
        }
        a.release_buffers(&mut p);
        drop(a);
        let (_, recs) = crate::pcap::read_pcap(&std::fs::read(&pcap).unwrap()).unwrap();
        assert_eq!(recs.len(), 100);
        assert!(recs
            .iter()
            .enumerate()
            .all(|(i, r)| r.data == [i as u8; 64]));
        assert_eq!(p.in_use(), 0);
        let _ = std::fs::remove_file(&pcap);
    }
}
