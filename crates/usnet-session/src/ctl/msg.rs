//! The control protocol's messages: one JSON line per request, one or more JSON
//! lines back. The server (`usnet_server::control`), the clients (`usnet_client`),
//! the CLI and the tests all speak through these types, so a field is named,
//! typed and defaulted in one place.
//!
//! Every answer may instead be a [`Refusal`] (`{"error": "..."}`); [`super::call`]
//! turns one into [`super::ControlError::Refused`]. Unknown fields are ignored in
//! both directions, so an older client can talk to a newer stack.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// What a control connection may ask. On the wire the variant is the `cmd` field:
/// `{"cmd":"stat"}`, `{"cmd":"ping","dst":"10.0.0.1"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// A new session (answered by [`AttachReply`] with the session's memory passed
    /// with `SCM_RIGHTS`).
    Attach(Attach),
    /// On an attached connection: pin the session's sockets for another process
    /// ([`PinReply`] on the channel passed with the request): every one for a child
    /// about to be forked, or those of `slots` for the receiver of descriptors
    /// passed with `SCM_RIGHTS`.
    Pin(PinReq),
    /// On a session's connection: the session takes the sockets of pin `token`
    /// ([`ClaimReply`] on the channel passed with the request), as a receiver of
    /// descriptors passed with `SCM_RIGHTS` does.
    Claim(ClaimReq),
    /// The session's zero-copy port ([`Done`] with the pool's and the port's memory).
    ZcPort(ZcPort),
    /// On an attached connection: a netlink socket in the stack's interface mirror
    /// ([`Done`] with the socket, on the channel passed with the request).
    Netlink(NetlinkReq),
    /// Everything `usnet stat` shows ([`Stat`]).
    Stat,
    /// The attached clients ([`Clients`]).
    Clients,
    /// Echo requests from the stack's own address ([`PingEvent`] lines).
    Ping(Ping),
    /// Stop the stack ([`Done`]).
    Stop,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Attach {
    /// The client's word for its pid (the kernel's, from the socket, is preferred).
    #[serde(default)]
    pub pid: u32,
    /// The client's program name, for `usnet clients`.
    #[serde(default)]
    pub command: String,
    /// Ring bytes per socket (a power of two; the server's cap if more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_bytes: Option<u64>,
    /// Socket slots (the server's cap if more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u64>,
    /// The shard to live on (modulo the count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u64>,
    /// A pin's token (hex): the new session holds the pinned sockets too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// A zero-copy port's ring sizes, in slots (the server caps them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZcPort {
    pub session: u32,
    #[serde(default = "default_slots")]
    pub rx_slots: u32,
    #[serde(default = "default_slots")]
    pub tx_slots: u32,
    #[serde(default = "default_slots")]
    pub stash_slots: u32,
}

fn default_slots() -> u32 {
    256
}

/// `ping`'s options, defaulted as ping(8)'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ping {
    pub dst: IpAddr,
    #[serde(default = "Ping::default_count")]
    pub count: u64,
    #[serde(default = "Ping::default_interval_ms")]
    pub interval_ms: u64,
    /// Echo data bytes.
    #[serde(default = "Ping::default_size")]
    pub size: u64,
    /// How long to wait for each reply.
    #[serde(default = "Ping::default_timeout_ms")]
    pub timeout_ms: u64,
}

impl Ping {
    fn default_count() -> u64 {
        4
    }
    fn default_interval_ms() -> u64 {
        1000
    }
    fn default_size() -> u64 {
        56
    }
    fn default_timeout_ms() -> u64 {
        2000
    }

    pub fn to(dst: IpAddr) -> Ping {
        Ping {
            dst,
            count: Self::default_count(),
            interval_ms: Self::default_interval_ms(),
            size: Self::default_size(),
            timeout_ms: Self::default_timeout_ms(),
        }
    }
}

/// An answer that says no.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    pub error: String,
}

/// A request done (`stop`, `zc_port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub ok: bool,
}

impl Done {
    pub const OK: Done = Done { ok: true };
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachReply {
    pub ok: bool,
    pub session: u32,
    pub shard: usize,
    /// `usnet_session_abi::server_page` bell kind.
    pub bell_kind: u32,
    /// The server's pid.
    pub pid: u32,
    /// For a claim: `[parent slot, child slot, tag, role]` per socket it got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<[u32; 4]>>,
    /// The stack's network interface, as the program should see it (`getifaddrs`
    /// under the shim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iface: Option<Iface>,
    /// Whether the stack has an interface mirror to make netlink sockets in
    /// (`Request::Netlink`).
    #[serde(default)]
    pub mirror: bool,
    /// The mirror's helper process, inside it: its `/proc/PID/net` is the
    /// mirror's (0: none).
    #[serde(default)]
    pub mirror_pid: u32,
}

/// A stack's one network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    /// The name of the kernel interface its link attaches to (a TAP device, an
    /// AF_PACKET or AF_XDP interface), else `usnet0`.
    pub name: String,
    /// That interface's index (`IP_PKTINFO`'s), else [`Iface::OWN_INDEX`].
    pub index: u32,
    pub mac: [u8; 6],
    pub mtu: u32,
    /// Its addresses with their prefix lengths (`10.0.0.2/24`, `fe80::1/64`).
    pub addrs: Vec<String>,
}

impl Iface {
    /// The index of a stack whose link has no kernel interface (shm, the emulated
    /// NIC): one above what a namespace's own interfaces normally take.
    pub const OWN_INDEX: u32 = 0x7fff_0000;

    /// The index programs see for a stack whose configured kernel interface
    /// index is `kernel` (0: none), in the attach reply and in `IP_PKTINFO` alike.
    pub fn index_for(kernel: u32) -> u32 {
        if kernel == 0 {
            Iface::OWN_INDEX
        } else {
            kernel
        }
    }

    /// Its addresses with their prefix lengths (what does not parse is left out).
    pub fn cidrs(&self) -> impl Iterator<Item = (std::net::IpAddr, u8)> + '_ {
        self.addrs.iter().filter_map(|a| {
            let (ip, prefix) = a.split_once('/')?;
            Some((ip.parse().ok()?, prefix.parse().ok()?))
        })
    }
}

/// A `socket(AF_NETLINK, ty, protocol)` to make in the stack's interface mirror.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetlinkReq {
    pub ty: i32,
    pub protocol: i32,
}

/// What a `pin` pins.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PinReq {
    /// Only these slots of the session (`None`: every socket, for a fork).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<u32>>,
}

/// A `claim` of a pin by a session that is already attached.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClaimReq {
    /// The pin's token (hex), as its channel's `pin` answers it.
    pub token: String,
}

/// What a `claim` gave: `[pinned slot, new slot, tag, role]` per socket, as
/// [`AttachReply::slots`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimReply {
    pub ok: bool,
    pub slots: Vec<[u32; 4]>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinReply {
    pub ok: bool,
    /// The pin's 128-bit token, hex.
    pub token: String,
    pub sockets: u32,
}

/// One line of a `ping`'s answer, in the order they come: a line per request, then
/// the totals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PingEvent {
    /// The last line.
    Done {
        done: bool,
        sent: u64,
        received: u64,
    },
    Reply {
        seq: u16,
        from: IpAddr,
        bytes: u64,
        ttl: u8,
        rtt_us: f64,
    },
    Timeout {
        seq: u16,
        timeout: bool,
    },
    /// The request could not be sent.
    Failed {
        seq: u16,
        error: String,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Clients {
    pub clients: Vec<ClientRow>,
}

/// Counters of one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionStats {
    pub calls: u64,
    pub kicks: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub bad_requests: u64,
    pub corrupt_rings: u64,
    /// Requests refused or cut down by a per-client limit: a socket past the slot
    /// quota (EMFILE), a listen backlog past `max_backlog`, an `SO_RCVBUF` past
    /// `max_rcvbuf`, a geometry past the server's caps at attach.
    pub quota_sockets: u64,
    pub quota_backlog: u64,
    pub quota_rcvbuf: u64,
    pub quota_geometry: u64,
    pub notifies: u64,
}

/// One attached client, as `usnet clients` lists it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientRow {
    pub id: u32,
    pub pid: u32,
    pub command: String,
    /// Socket slots in use.
    pub sockets: u64,
    pub max_sockets: u32,
    pub ring_bytes: u32,
    pub stats: SessionStats,
    #[serde(default)]
    pub zero_copy: Option<ZcPortStat>,
    /// Bytes queued in the stack for its connections (both directions).
    pub stack_bytes: u64,
    pub tcp_connections: u64,
    /// Stack sockets it holds, connections in its listeners' queues included.
    pub stack_sockets: u64,
    /// Pool buffers its receive queues hold (at most `Limits::max_pool_bufs`).
    #[serde(default)]
    pub pool_held: u64,
    /// Its listeners and connections (the first few), as `ss -p` shows them.
    pub tcp: Vec<SocketRow>,
    /// Its shard, on a sharded server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ZcPortStat {
    pub held_buffers: u64,
    pub bad_slots: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SocketRow {
    pub state: String,
    pub local: String,
    /// `*` for a listener.
    pub remote: String,
    pub recv_q: u64,
    pub send_q: u64,
}

/// Everything `usnet stat` shows. A sharded server's answer sums its shards'
/// (counters, pool, sockets) and lists their rows, each tagged with its shard;
/// `shards` then has a row per shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub name: String,
    pub link: String,
    pub device: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub link_state: String,
    pub mac: String,
    pub mtu: u64,
    pub addrs: Vec<String>,
    pub services: Vec<String>,
    /// The stack's counters by name (`usnet_stack::Counters`).
    pub counters: BTreeMap<String, u64>,
    pub priority: Priority,
    /// The link's counters by name.
    pub device_counters: BTreeMap<String, u64>,
    pub pool: PoolStat,
    pub neighbors: Vec<Neighbor>,
    pub clients: Vec<ClientRow>,
    pub sessions_closed: u64,
    /// Sessions cut off by a panic while serving them.
    pub sessions_broken: u64,
    pub shared_sockets: u64,
    pub fork_pins: Vec<ForkPin>,
    /// Clients refused for `max_clients`.
    pub quota_sessions: u64,
    pub limits: Limits,
    pub sockets: SocketCount,
    pub tcp_listeners: Vec<Listener>,
    pub tcp_connections_total: u64,
    /// The first few connections (`tcp_connections_total` counts them all).
    pub tcp_connections: Vec<Connection>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardRow>,
}

/// Priority-aware receive (`usnet_stack::PrioStatus`, and the scheduler hook's
/// view).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Priority {
    pub forced_drop: bool,
    pub priority: bool,
    pub set_size: u64,
    pub members: Vec<PrioMember>,
    pub ports: Vec<u16>,
    /// Forced drop is dropping now.
    pub forced_drop_active: bool,
    /// Consumers the stack has boosted now.
    pub boosted: Vec<u32>,
    /// What the scheduler hook holds now.
    #[serde(default)]
    pub boosted_now: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrioMember {
    pub handle: u64,
    pub port: u16,
    pub priority: i32,
    pub owner: u32,
    /// The consumer a boost goes to, if known.
    pub pid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStat {
    /// Bytes per buffer (not a sum across shards).
    pub buf_size: u64,
    pub count: u64,
    pub in_use: u64,
    pub peak_in_use: u64,
    pub allocs: u64,
    pub exhausted: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Neighbor {
    pub ip: String,
    /// `None` while resolving.
    pub mac: Option<String>,
}

/// Sockets a session pinned for a child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForkPin {
    pub session: u32,
    pub sockets: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub max_clients: u64,
    pub client_sockets: u32,
    pub ring_bytes: u32,
    pub max_backlog: u64,
    pub max_rcvbuf: u64,
    /// Pool buffers one client's receive queues may hold.
    #[serde(default)]
    pub max_pool_bufs: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SocketCount {
    pub live: u64,
    pub slots: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Listener {
    pub local: String,
    pub owner: u32,
    pub syn_queue: u64,
    pub accept_queue: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Connection {
    pub local: String,
    pub remote: String,
    pub owner: u32,
    pub state: String,
    /// Closed by its owner, still sending or acknowledging.
    pub orphan: bool,
    pub srtt_us: Option<u64>,
    /// The least RTT seen (the path's floor; an srtt well above it is a queue).
    #[serde(default)]
    pub min_rtt_us: Option<u64>,
    pub rto_ms: u64,
    pub cwnd: u32,
    pub ssthresh: u32,
    pub mss: u32,
    pub in_flight: u32,
    pub retransmits: u64,
    /// The congestion controller's name.
    pub congestion: String,
    pub recv_q: u64,
    pub send_q: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<usize>,
}

/// One shard's load, and the frames that crossed between shards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardRow {
    pub shard: usize,
    pub clients: u64,
    pub tcp_connections: u64,
    pub pool_in_use: u64,
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub handoff_out: u64,
    pub handoff_in: u64,
    pub redirected: u64,
    pub every_copies: u64,
}

/// Adds `b`'s counters into `a`'s, name by name.
fn add_counters(a: &mut BTreeMap<String, u64>, b: &BTreeMap<String, u64>) {
    for (k, v) in b {
        let x = a.entry(k.clone()).or_default();
        *x = x.saturating_add(*v);
    }
}

impl Stat {
    /// One answer from every shard's (in shard order): totals, the rows of each
    /// tagged with its shard, and a row per shard. One shard's answer is itself.
    pub fn merge(parts: Vec<Stat>, max_connections: usize) -> Option<Stat> {
        let mut it = parts.into_iter();
        let mut all = it.next()?;
        let rest: Vec<Stat> = it.collect();
        if rest.is_empty() {
            return Some(all);
        }
        all.tag_rows(0);
        let mut rows = vec![all.shard_row(0)];
        for (k, mut v) in rest.into_iter().enumerate() {
            let k = k + 1;
            v.tag_rows(k);
            rows.push(v.shard_row(k));
            add_counters(&mut all.counters, &v.counters);
            add_counters(&mut all.device_counters, &v.device_counters);
            // A pool's buffer size is not a sum.
            let p = &mut all.pool;
            p.count = p.count.saturating_add(v.pool.count);
            p.in_use = p.in_use.saturating_add(v.pool.in_use);
            p.peak_in_use = p.peak_in_use.saturating_add(v.pool.peak_in_use);
            p.allocs = p.allocs.saturating_add(v.pool.allocs);
            p.exhausted = p.exhausted.saturating_add(v.pool.exhausted);
            all.sockets.live = all.sockets.live.saturating_add(v.sockets.live);
            all.sockets.slots = all.sockets.slots.saturating_add(v.sockets.slots);
            all.tcp_connections_total = all
                .tcp_connections_total
                .saturating_add(v.tcp_connections_total);
            all.sessions_closed = all.sessions_closed.saturating_add(v.sessions_closed);
            all.sessions_broken = all.sessions_broken.saturating_add(v.sessions_broken);
            all.shared_sockets = all.shared_sockets.saturating_add(v.shared_sockets);
            all.quota_sessions = all.quota_sessions.saturating_add(v.quota_sessions);
            all.clients.append(&mut v.clients);
            all.tcp_listeners.append(&mut v.tcp_listeners);
            all.tcp_connections.append(&mut v.tcp_connections);
            all.fork_pins.append(&mut v.fork_pins);
        }
        all.clients.sort_by_key(|c| c.id);
        all.tcp_connections.truncate(max_connections);
        all.shards = rows;
        Some(all)
    }

    fn tag_rows(&mut self, k: usize) {
        let shard = Some(k);
        self.clients.iter_mut().for_each(|r| r.shard = shard);
        self.tcp_listeners.iter_mut().for_each(|r| r.shard = shard);
        self.tcp_connections
            .iter_mut()
            .for_each(|r| r.shard = shard);
        self.fork_pins.iter_mut().for_each(|r| r.shard = shard);
    }

    fn shard_row(&self, k: usize) -> ShardRow {
        let c = |name: &str| self.counters.get(name).copied().unwrap_or(0);
        let d = |name: &str| self.device_counters.get(name).copied().unwrap_or(0);
        ShardRow {
            shard: k,
            clients: self.clients.len() as u64,
            tcp_connections: self.tcp_connections_total,
            pool_in_use: self.pool.in_use,
            rx_frames: d("rx_frames"),
            tx_frames: d("tx_frames"),
            handoff_out: c("shard_handoff_out"),
            handoff_in: c("shard_handoff_in"),
            redirected: c("shard_redirected"),
            every_copies: c("shard_every_copies"),
        }
    }
}

impl Clients {
    /// Every shard's clients (in shard order) as one list; with more than one
    /// shard each row says its shard.
    pub fn merge(parts: Vec<Vec<ClientRow>>) -> Clients {
        let sharded = parts.len() > 1;
        let mut clients: Vec<ClientRow> = parts
            .into_iter()
            .enumerate()
            .flat_map(|(k, rows)| {
                rows.into_iter().map(move |mut r| {
                    r.shard = sharded.then_some(k);
                    r
                })
            })
            .collect();
        clients.sort_by_key(|c| c.id);
        Clients { clients }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Request {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn requests_read_as_the_protocol_writes_them_with_defaults_filled() {
        assert_eq!(parse(json!({"cmd": "stat"})), Request::Stat);
        assert_eq!(
            parse(json!({"cmd": "pin"})),
            Request::Pin(PinReq::default())
        );
        assert_eq!(
            parse(json!({"cmd": "pin", "slots": [3, 5]})),
            Request::Pin(PinReq {
                slots: Some(vec![3, 5])
            })
        );
        assert_eq!(
            parse(json!({"cmd": "claim", "token": "ab"})),
            Request::Claim(ClaimReq { token: "ab".into() })
        );
        assert_eq!(
            parse(json!({"cmd": "ping", "dst": "fd77::1", "count": 3})),
            Request::Ping(Ping {
                count: 3,
                ..Ping::to("fd77::1".parse().unwrap())
            })
        );
        let Request::ZcPort(z) = parse(json!({"cmd": "zc_port", "session": 7, "tx_slots": 64}))
        else {
            panic!("zc_port");
        };
        assert_eq!((z.session, z.rx_slots, z.tx_slots), (7, 256, 64));
        // An unknown field is ignored (an older or newer peer).
        let Request::Attach(a) = parse(json!({"cmd": "attach", "pid": 5, "new_field": 1})) else {
            panic!("attach");
        };
        assert_eq!((a.pid, a.ring_bytes, a.claim), (5, None, None));
    }

    #[test]
    fn bad_requests_are_refused_by_type_not_defaulted() {
        for bad in [
            json!({"cmd": "launch"}),
            json!({}),
            json!({"cmd": "ping"}),
            json!({"cmd": "ping", "dst": "not an address"}),
            json!({"cmd": "ping", "dst": "10.0.0.1", "count": -1}),
            json!({"cmd": "zc_port"}),
            json!({"cmd": "attach", "pid": "me"}),
        ] {
            assert!(
                serde_json::from_value::<Request>(bad.clone()).is_err(),
                "{bad} parsed"
            );
        }
    }

    #[test]
    fn every_request_round_trips() {
        let reqs = [
            Request::Attach(Attach {
                pid: 1,
                command: "nginx".into(),
                ring_bytes: Some(1 << 16),
                max_sockets: Some(10),
                shard: Some(1),
                claim: Some("ab".into()),
            }),
            Request::Pin(PinReq::default()),
            Request::Pin(PinReq {
                slots: Some(vec![1]),
            }),
            Request::Claim(ClaimReq { token: "01".into() }),
            Request::ZcPort(ZcPort {
                session: 3,
                rx_slots: 1,
                tx_slots: 2,
                stash_slots: 3,
            }),
            Request::Stat,
            Request::Clients,
            Request::Ping(Ping::to("10.0.0.1".parse().unwrap())),
            Request::Stop,
        ];
        for r in reqs {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r, "{line}");
        }
    }

    #[test]
    fn ping_lines_are_told_apart() {
        let ev = |v| serde_json::from_value::<PingEvent>(v).unwrap();
        assert!(matches!(
            ev(json!({"done": true, "sent": 3, "received": 2})),
            PingEvent::Done { sent: 3, .. }
        ));
        assert!(matches!(
            ev(json!({"seq": 1, "from": "10.0.0.1", "bytes": 64, "ttl": 64, "rtt_us": 12.5})),
            PingEvent::Reply { seq: 1, .. }
        ));
        assert!(matches!(
            ev(json!({"seq": 2, "timeout": true})),
            PingEvent::Timeout { seq: 2, .. }
        ));
        assert!(matches!(
            ev(json!({"seq": 3, "error": "no route"})),
            PingEvent::Failed { seq: 3, .. }
        ));
    }

    fn shard_stat(k: u64) -> Stat {
        Stat {
            counters: [
                ("tcp_rx".to_string(), 10 * k),
                ("shard_handoff_out".into(), k),
            ]
            .into_iter()
            .collect(),
            pool: PoolStat {
                buf_size: 2048,
                count: 100,
                in_use: k,
                ..Default::default()
            },
            clients: vec![ClientRow {
                id: 10 - k as u32,
                ..Default::default()
            }],
            tcp_connections_total: 3,
            tcp_connections: vec![Connection::default(); 3],
            fork_pins: vec![ForkPin {
                session: 1,
                sockets: 2,
                shard: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_sharded_stat_sums_counters_and_tags_every_row() {
        let all = Stat::merge(vec![shard_stat(1), shard_stat(2)], 4).unwrap();
        assert_eq!(all.counters["tcp_rx"], 30);
        assert_eq!(
            (all.pool.buf_size, all.pool.count, all.pool.in_use),
            (2048, 200, 3)
        );
        assert_eq!(all.tcp_connections_total, 6);
        assert_eq!(all.tcp_connections.len(), 4, "cut to the most listed");
        assert_eq!(
            all.clients
                .iter()
                .map(|c| (c.id, c.shard))
                .collect::<Vec<_>>(),
            [(8, Some(1)), (9, Some(0))],
            "sorted by id, each with its shard"
        );
        assert_eq!(all.fork_pins[1].shard, Some(1));
        assert_eq!(
            all.shards.iter().map(|r| r.handoff_out).collect::<Vec<_>>(),
            [1, 2]
        );
        // One shard's answer is itself: no shard rows, no tags.
        let one = Stat::merge(vec![shard_stat(1)], 4).unwrap();
        assert!(one.shards.is_empty() && one.clients[0].shard.is_none());
        assert!(Stat::merge(vec![], 4).is_none());
    }

    #[test]
    fn a_stat_survives_the_wire() {
        let s = Stat::merge(vec![shard_stat(1), shard_stat(2)], 10).unwrap();
        let line = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Stat>(&line).unwrap(), s);
    }
}
