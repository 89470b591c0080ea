//! Connection and listener configuration, with defaults close to Linux's.

use std::time::Duration;

use crate::cc::CcAlgorithm;
use crate::hash::SecretKey;

/// Keepalive parameters (off unless set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (Linux: 7200 s).
    pub idle: Duration,
    /// Time between unanswered probes (75 s).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (9).
    pub count: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle: Duration::from_secs(7200),
            interval: Duration::from_secs(75),
            count: 9,
        }
    }
}

/// Everything tunable about one connection. Copied into the connection at creation;
/// the socket-level options can be changed later through `Connection` setters.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Largest segment payload the link allows without options: link MTU minus IP and
    /// TCP headers (1460 for IPv4 over Ethernet, 1440 for IPv6). Advertised in the SYN
    /// and the cap on what is sent.
    pub mss: u16,
    /// Send buffer size in bytes (the most unacknowledged + unsent data held): the
    /// ring's size and the limit send-buffer autotuning grows towards (Linux's
    /// `tcp_wmem` maximum).
    pub send_buffer: usize,
    /// The send-buffer limit a connection starts with, in Linux's `sk_sndbuf` terms
    /// (bytes plus a fixed cost per buffered chunk; `tcp_wmem` default). Autotuning
    /// grows it towards `send_buffer` unless the application set `SO_SNDBUF`.
    pub send_buffer_initial: usize,
    /// Send new data in the pieces Linux's TSO engine cuts (`conn/tso.rs`): at
    /// most the congestion window's room and the autosized TSO size each, whole
    /// segments at the window's edge, PSH at a multi-segment piece's end. Off by
    /// default; the `linux` profile turns it on.
    pub tso_pieces: bool,
    /// Send the full segments that follow a full new-data segment in one pass as
    /// one run: the rules looked at once for the run, the options built once (as
    /// Linux's `tcp_write_xmit` sends a TSO buffer of several segments). On by
    /// default; off, each goes through the per-segment path. The segments on the
    /// wire are the same either way (`tests/sim.rs` compares them byte for byte);
    /// off is there for that comparison and for measuring what runs save.
    pub send_runs: bool,
    /// Clamp the advertised window as Linux's `rcv_ssthresh` does: it starts at
    /// 64 KB (what a SYN can offer) and grows as in-order data arrives (by twice
    /// the larger of our MSS and the segment, `tcp_grow_window`), up to the
    /// receive space. Off by default; the `linux` profile turns it on.
    pub rcv_ssthresh: bool,
    /// Linux's `tcp_min_tso_segs`: the fewest segments a TSO piece is sized for.
    pub min_tso_segs: u32,
    /// Linux's `tcp_notsent_lowat`: a write is admitted, and the socket polls
    /// writable, only while fewer bytes than this wait unsent (`u32::MAX`: no
    /// limit). A connection's `TCP_NOTSENT_LOWAT` overrides it.
    pub notsent_lowat: u32,
    /// Receive buffer size in bytes (the largest window that can be advertised).
    pub recv_buffer: usize,
    /// Initial receive window when autotuning (grows towards `recv_buffer`).
    pub recv_buffer_initial: usize,
    /// Hold payload as pieces of pool buffers (scatter-gather queues) instead of
    /// bytes in rings: the zero-copy API. Only the stack (which owns the pool) can
    /// serve such a connection: `send_span`, `recv_spans`, `take_buf_ops`.
    pub zero_copy: bool,
    /// Receive-buffer autotuning (dynamic right-sizing of the advertised window).
    pub autotune: bool,
    /// Disable Nagle's algorithm (TCP_NODELAY).
    pub nodelay: bool,
    /// Keepalive, if enabled (SO_KEEPALIVE).
    pub keepalive: Option<Keepalive>,
    /// The parameters SO_KEEPALIVE turns on when a socket sets none of its own
    /// (Linux `tcp_keepalive_time`, `_intvl`, `_probes`).
    pub keepalive_defaults: Keepalive,
    /// TCP_USER_TIMEOUT (RFC 5482; RFC 9293 §3.10.8's USER TIMEOUT): the longest
    /// transmitted data may stay unacknowledged (or, against a zero window, wait to
    /// be sent) before the connection is dropped (ETIMEDOUT). It replaces
    /// `max_retries` as the limit and caps the retransmission timer, so the abort
    /// comes on time; it also ends an unanswered keepalive probe run. None: the
    /// retry counts decide.
    pub user_timeout: Option<Duration>,
    /// ECN (RFC 3168) as Linux's `tcp_ecn`: [`ECN_OFF`], [`ECN_ON`] (ask for it on
    /// active opens, agree on passive ones), [`ECN_ACCEPT`] (agree when asked).
    pub ecn: u8,
    /// SO_LINGER: `Some(0)` makes `close()` abortive (RST); `Some(t)` bounds how long a
    /// closing connection may try to deliver its data before it is aborted.
    pub linger: Option<Duration>,
    /// Answer an ACK of data not yet sent (SEG.ACK > SND.NXT) with an ACK before
    /// dropping it, as RFC 9293 §3.10.7.4 and RFC 5961 §5.2 say; off, it is
    /// dropped without a word, as Linux does (the `linux` profile).
    pub challenge_unsent_acks: bool,
    /// Congestion controller.
    pub congestion: CcAlgorithm,
    /// Pace every connection, as Linux does under the `fq` qdisc: segments leave
    /// at the pacing rate (`conn/pacing.rs`). Off, only connections whose
    /// controller paces (BBR) or that set `SO_MAX_PACING_RATE` are paced, as
    /// Linux's TCP paces itself without `fq`.
    pub pacing: bool,
    /// The default pacing rate in slow start, percent of cwnd per SRTT (Linux's
    /// `tcp_pacing_ss_ratio`, 200).
    pub pacing_ss_ratio: u32,
    /// The default pacing rate after slow start, percent of cwnd per SRTT
    /// (`tcp_pacing_ca_ratio`, 120).
    pub pacing_ca_ratio: u32,
    /// Initial congestion window in segments (RFC 6928).
    pub initial_window: u32,
    /// Initial RTO (RFC 6298: 1 s).
    pub initial_rto: Duration,
    /// The least the RTO exceeds SRTT by (RFC 6298's G; Linux's `tcp_rto_min`, 200
    /// ms): room for the peer's delayed ACK on top of the round trip.
    pub min_rto: Duration,
    /// Upper bound of the RTO (120 s).
    pub max_rto: Duration,
    /// SYN retransmissions before `connect` fails (Linux tcp_syn_retries: 6).
    pub syn_retries: u32,
    /// SYN-ACK retransmissions by a listener (tcp_synack_retries: 5).
    pub synack_retries: u32,
    /// Data retransmissions (consecutive RTOs) before the connection is dropped
    /// (tcp_retries2: 15).
    pub max_retries: u32,
    /// Longest an ACK may be delayed (40 ms, Linux's minimum delayed-ACK timeout).
    pub delayed_ack: Duration,
    /// Segments acknowledged at once at the start of a connection (quick-ack mode).
    pub quickack_segments: u32,
    /// TIME-WAIT duration, 2*MSL (Linux: 60 s).
    pub time_wait: Duration,
    /// How long an orphaned connection (closed by the application) may stay in
    /// FIN-WAIT-2 (tcp_fin_timeout: 60 s).
    pub fin_wait2_timeout: Duration,
    /// Offer/accept window scaling (RFC 7323).
    pub window_scaling: bool,
    /// Offer/accept timestamps (RFC 7323).
    pub timestamps: bool,
    /// Offer/accept SACK (RFC 2018).
    pub sack: bool,
    /// Add a keyed per-connection offset to timestamp values (RFC 7323 §5.4). Off
    /// only in scripted tests, where `TSval` is then milliseconds of `now`.
    pub ts_random_offset: bool,
    /// Most out-of-order ranges held by the receiver.
    pub max_ooo_ranges: usize,
    /// Challenge ACKs (RFC 5961) a connection may send per second.
    pub challenge_ack_limit: u32,
    /// Deliver urgent data inline (SO_OOBINLINE). When false (the default, as in
    /// Linux), the byte the urgent pointer designates is taken out of the stream and
    /// kept as the out-of-band byte (`recv_urgent`).
    pub oob_inline: bool,
    /// Secret for ISNs, timestamp offsets and SYN cookies; the stack draws it from a
    /// random source at start-up.
    pub secret: SecretKey,
    /// Unanswered retransmissions or window probes before an orphaned connection (the
    /// application has closed it) is dropped; Linux's `tcp_orphan_retries` default.
    pub orphan_retries: u32,
    /// Lower bound of the persist (zero-window probe) interval.
    pub persist_min: Duration,
    /// Upper bound of the persist interval.
    pub persist_max: Duration,
    /// Tail loss probes (RFC 8985 §7).
    pub tlp: bool,
    /// Longest the peer is assumed to delay an ACK (RACK-TLP's WCDelAckT: 200 ms).
    pub peer_max_ack_delay: Duration,
    /// Restart from the initial window after an idle RTO (RFC 5681 §4.1; Linux
    /// `tcp_slow_start_after_idle`).
    pub slow_start_after_idle: bool,
    /// Report duplicates with D-SACK blocks (RFC 2883; Linux `tcp_dsack`).
    pub dsack: bool,
    /// Answer SYN-queue overflow with SYN cookies (Linux `tcp_syncookies`).
    pub syn_cookies: bool,
    /// TCP Fast Open (RFC 7413), as Linux's `tcp_fastopen` bits: [`FASTOPEN_CLIENT`]
    /// (`TCP_FASTOPEN_CONNECT`/`MSG_FASTOPEN` may be used), [`FASTOPEN_SERVER`]
    /// (listeners that ask for it with `TCP_FASTOPEN` accept data on SYNs),
    /// [`FASTOPEN_SERVER_NO_COOKIE`] (a server takes SYN data without a valid
    /// cookie), [`FASTOPEN_SERVER_ALL`] (every listener, no `TCP_FASTOPEN` needed).
    pub fastopen: u32,
    /// The server's cookie key (Linux `tcp_fastopen_key`); None: derived from
    /// `secret`.
    pub fastopen_key: Option<[u8; 16]>,
    /// A second key whose cookies a server still accepts (Linux's backup key,
    /// for rotating keys across a fleet): a SYN with such a cookie gets its data
    /// taken and a fresh cookie of the primary key on the SYN-ACK.
    pub fastopen_backup_key: Option<[u8; 16]>,
    /// Packetization-layer path MTU discovery (RFC 4821) as Linux's
    /// `tcp_mtu_probing`: [`MTU_PROBING_OFF`], [`MTU_PROBING_BLACKHOLE`] (on once
    /// repeated timeouts suggest a path that drops large segments silently),
    /// [`MTU_PROBING_ALWAYS`] (every connection starts at `base_mss` and probes up).
    pub mtu_probing: u8,
    /// Linux's `tcp_base_mss`: the MSS probing starts from (search_low), and the
    /// most a black hole's halving leaves.
    pub base_mss: u16,
    /// Linux's `tcp_mtu_probe_floor`: the least MSS black-hole halving goes down to.
    pub mtu_probe_floor: u16,
    /// Linux's `tcp_probe_threshold`: probing stops once the search range (in
    /// bytes of MTU) is narrower than this.
    pub probe_threshold: u32,
    /// Linux's `tcp_probe_interval`: after this long the search starts again from
    /// the MSS in use (RFC 4821 §7.7: the path may have grown).
    pub probe_interval: Duration,
    /// Linux's `tcp_retries1`: consecutive retransmission timeouts after which the
    /// path is suspected (a black hole, with `mtu_probing` on).
    pub retries1: u32,
}

/// `TcpConfig::ecn`: no ECN.
pub const ECN_OFF: u8 = 0;
/// `TcpConfig::ecn`: ask for ECN when connecting, agree when asked.
pub const ECN_ON: u8 = 1;
/// `TcpConfig::ecn`: agree to ECN when a peer asks (Linux's default).
pub const ECN_ACCEPT: u8 = 2;

/// `TcpConfig::mtu_probing`: no probing (Linux's default).
pub const MTU_PROBING_OFF: u8 = 0;
/// `TcpConfig::mtu_probing`: probing starts when a black hole is suspected.
pub const MTU_PROBING_BLACKHOLE: u8 = 1;
/// `TcpConfig::mtu_probing`: probing from the start of every connection.
pub const MTU_PROBING_ALWAYS: u8 = 2;

/// `TcpConfig::fastopen`: clients may send data on their SYN.
pub const FASTOPEN_CLIENT: u32 = 0x1;
/// `TcpConfig::fastopen`: listeners that enabled it accept data on SYNs.
pub const FASTOPEN_SERVER: u32 = 0x2;
/// `TcpConfig::fastopen`: clients send SYN data even without a cookie.
pub const FASTOPEN_CLIENT_NO_COOKIE: u32 = 0x4;
/// `TcpConfig::fastopen`: servers accept SYN data without a valid cookie.
pub const FASTOPEN_SERVER_NO_COOKIE: u32 = 0x200;
/// `TcpConfig::fastopen`: every listener does Fast Open without `TCP_FASTOPEN`.
pub const FASTOPEN_SERVER_ALL: u32 = 0x400;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            send_buffer: 1 << 20,
            send_buffer_initial: 1 << 20,
            notsent_lowat: u32::MAX,
            tso_pieces: false,
            send_runs: true,
            rcv_ssthresh: false,
            min_tso_segs: 2,
            recv_buffer: 4 << 20,
            recv_buffer_initial: 128 << 10,
            zero_copy: false,
            autotune: true,
            nodelay: false,
            keepalive: None,
            keepalive_defaults: Keepalive::default(),
            linger: None,
            user_timeout: None,
            ecn: ECN_ACCEPT,
            challenge_unsent_acks: true,
            congestion: CcAlgorithm::Cubic,
            pacing: false,
            pacing_ss_ratio: 200,
            pacing_ca_ratio: 120,
            initial_window: 10,
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(120),
            syn_retries: 6,
            synack_retries: 5,
            max_retries: 15,
            delayed_ack: Duration::from_millis(40),
            quickack_segments: 16,
            time_wait: Duration::from_secs(60),
            fin_wait2_timeout: Duration::from_secs(60),
            window_scaling: true,
            timestamps: true,
            sack: true,
            ts_random_offset: true,
            max_ooo_ranges: 64,
            challenge_ack_limit: 100,
            oob_inline: false,
            secret: SecretKey([0x7573_6e65_742d_7463, 0x702d_6b65_792d_3031]),
            orphan_retries: 8,
            persist_min: Duration::from_millis(200),
            persist_max: Duration::from_secs(120),
            tlp: true,
            peer_max_ack_delay: Duration::from_millis(200),
            slow_start_after_idle: true,
            dsack: true,
            syn_cookies: true,
            fastopen: FASTOPEN_CLIENT,
            fastopen_key: None,
            fastopen_backup_key: None,
            mtu_probing: MTU_PROBING_OFF,
            base_mss: 1024,
            mtu_probe_floor: 48,
            probe_threshold: 8,
            probe_interval: Duration::from_secs(600),
            retries1: 3,
        }
    }
}

/// The profiles [`TcpConfig::profile`] knows.
pub const PROFILES: &[&str] = &["usnet", "linux"];

impl TcpConfig {
    /// A named set of defaults: `usnet` (this crate's [`Default`]) or `linux`, the
    /// settings of a Linux host as packetdrill's TCP suite configures it
    /// (`gtests/net/common/defaults.sh`): `tcp_rmem` max 15 MiB (so window scale 8),
    /// `tcp_wmem` max 4 MiB, 5 SYN and SYN-ACK retries, no slow start after idle.
    pub fn profile(name: &str) -> Option<TcpConfig> {
        let mut c = TcpConfig::default();
        match name {
            "usnet" => {}
            "linux" => {
                c.recv_buffer = 15 << 20;
                c.recv_buffer_initial = 540_000;
                c.send_buffer = 4 << 20;
                c.send_buffer_initial = 256 << 10;
                c.tso_pieces = true;
                c.rcv_ssthresh = true;
                c.syn_retries = 5;
                c.synack_retries = 5;
                c.slow_start_after_idle = false;
                c.fastopen = 0x70403;
                // Linux's default; packetdrill's defaults.sh leaves it.
                c.mtu_probing = MTU_PROBING_OFF;
                c.challenge_unsent_acks = false;
            }
            _ => return None,
        }
        Some(c)
    }

    /// Sets one tunable by its Linux sysctl name (`net.ipv4.` left out), with the
    /// value as `/proc/sys` takes it: `tcp_timestamps`, `tcp_sack`, `tcp_dsack`,
    /// `tcp_window_scaling`, `tcp_rmem` and `tcp_wmem` ("min default max": the
    /// maximum is the buffer, as far as Linux's autotuning may grow it; the receive
    /// default is the initial receive window, the send default the initial send
    /// buffer limit), `tcp_notsent_lowat`, `tcp_min_tso_segs`,
    /// `tcp_syn_retries`, `tcp_synack_retries`, `tcp_retries2`, `tcp_orphan_retries`,
    /// `tcp_fin_timeout`, `tcp_keepalive_time`/`_intvl`/`_probes`,
    /// `tcp_slow_start_after_idle`, `tcp_syncookies`, `tcp_ecn` (0, 1, 2),
    /// `tcp_fastopen` (the bits of
    /// [`TcpConfig::fastopen`]), `tcp_fastopen_key` (`xxxxxxxx-xxxxxxxx-xxxxxxxx-xxxxxxxx`,
    /// then optionally a comma and a backup key), `tcp_congestion_control`
    /// (`cubic`, `reno`, `bbr`), `tcp_pacing_ss_ratio`, `tcp_pacing_ca_ratio`,
    /// `default_qdisc` (`fq` paces every connection, [`TcpConfig::pacing`]; any
    /// other qdisc does not), `tcp_early_retrans` (0 turns tail loss probes off),
    /// `tcp_retries1`, `tcp_mtu_probing` (0, 1, 2), `tcp_base_mss`,
    /// `tcp_mtu_probe_floor`, `tcp_probe_threshold`, `tcp_probe_interval` (seconds).
    /// Returns an error naming the problem for an unknown name or a bad value.
    pub fn set_sysctl(&mut self, name: &str, value: &str) -> Result<(), String> {
        let value = value.trim();
        let bad = || format!("{name}={value}: bad value");
        let int = || -> Result<u64, String> {
            let v = value.trim();
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).map_err(|_| bad()),
                None => v.parse::<u64>().map_err(|_| bad()),
            }
        };
        let flag = || int().map(|v| v != 0);
        let triple = || -> Result<[usize; 3], String> {
            let v: Vec<usize> = value
                .split_whitespace()
                .map(|x| x.parse::<usize>().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            <[usize; 3]>::try_from(v).map_err(|_| bad())
        };
        let secs = || int().map(Duration::from_secs);
        let count = || int().map(|v| v.min(u64::from(u32::MAX)) as u32);
        match name {
            "tcp_timestamps" => self.timestamps = flag()?,
            "tcp_sack" => self.sack = flag()?,
            "tcp_dsack" => self.dsack = flag()?,
            "tcp_window_scaling" => self.window_scaling = flag()?,
            "tcp_rmem" => {
                let [_, def, max] = triple()?;
                self.recv_buffer = max.max(1024);
                self.recv_buffer_initial = def.clamp(1024, self.recv_buffer);
            }
            "tcp_wmem" => {
                let [_, def, max] = triple()?;
                self.send_buffer = max.max(1024);
                self.send_buffer_initial = def.clamp(1024, self.send_buffer);
            }
            "tcp_notsent_lowat" => self.notsent_lowat = count()?,
            "tcp_min_tso_segs" => self.min_tso_segs = count()?.clamp(1, 255),
            "tcp_syn_retries" => self.syn_retries = count()?,
            "tcp_synack_retries" => self.synack_retries = count()?,
            "tcp_retries2" => self.max_retries = count()?,
            "tcp_orphan_retries" => self.orphan_retries = count()?,
            "tcp_fin_timeout" => self.fin_wait2_timeout = secs()?,
            "tcp_keepalive_time" => self.keepalive_defaults.idle = secs()?,
            "tcp_keepalive_intvl" => self.keepalive_defaults.interval = secs()?,
            "tcp_keepalive_probes" => self.keepalive_defaults.count = count()?,
            "tcp_slow_start_after_idle" => self.slow_start_after_idle = flag()?,
            "tcp_syncookies" => self.syn_cookies = flag()?,
            "tcp_early_retrans" => self.tlp = int()? >= 3,
            "tcp_ecn" => {
                self.ecn = match int()? {
                    v @ 0..=2 => v as u8,
                    _ => return Err(bad()),
                }
            }
            "tcp_retries1" => self.retries1 = count()?,
            "tcp_mtu_probing" => {
                self.mtu_probing = match int()? {
                    v @ 0..=2 => v as u8,
                    _ => return Err(bad()),
                }
            }
            // Linux's limits: an MSS of 48 up to what an IPv4 MTU allows.
            "tcp_base_mss" => self.base_mss = mss_value(int()?).ok_or_else(bad)?,
            "tcp_mtu_probe_floor" => self.mtu_probe_floor = mss_value(int()?).ok_or_else(bad)?,
            "tcp_probe_threshold" => self.probe_threshold = count()?,
            "tcp_probe_interval" => self.probe_interval = secs()?,
            "tcp_fastopen" => self.fastopen = int()? as u32,
            "tcp_fastopen_key" => {
                let (primary, backup) = parse_fastopen_keys(value).ok_or_else(bad)?;
                self.fastopen_key = Some(primary);
                self.fastopen_backup_key = backup;
            }
            "tcp_pacing_ss_ratio" => self.pacing_ss_ratio = count()?,
            "tcp_pacing_ca_ratio" => self.pacing_ca_ratio = count()?,
            "default_qdisc" => {
                self.pacing = match value {
                    "fq" => true,
                    "fq_codel" | "pfifo_fast" | "pfifo" | "noqueue" | "cake" | "sfq" => false,
                    _ => return Err(bad()),
                }
            }
            "tcp_congestion_control" => {
                self.congestion = CcAlgorithm::from_name(value).ok_or_else(bad)?
            }
            _ => return Err(format!("{name}: unknown tunable")),
        }
        Ok(())
    }
}

impl TcpConfig {
    /// The MSS for an IP MTU: `mtu - ip header - 20`.
    pub fn mss_for_mtu(mtu: usize, ipv6: bool) -> u16 {
        let ip = if ipv6 { 40 } else { 20 };
        mtu.saturating_sub(ip + 20).clamp(64, 65495) as u16
    }

    /// The window shift needed to advertise `recv_buffer`.
    pub(crate) fn rcv_wscale(&self) -> u8 {
        let mut s = 0u8;
        while s < 14 && (self.recv_buffer >> s) > 65535 {
            s += 1;
        }
        s
    }
}

/// An MSS sysctl's value within Linux's bounds (48 ..= 65495), else None.
fn mss_value(v: u64) -> Option<u16> {
    (48..=65495).contains(&v).then_some(v as u16)
}

/// `tcp_fastopen_key` as Linux writes it: a primary key, then optionally a comma
/// and a backup key.
pub fn parse_fastopen_keys(s: &str) -> Option<([u8; 16], Option<[u8; 16]>)> {
    let mut keys = s.split(',');
    let primary = parse_fastopen_key(keys.next()?)?;
    let backup = match keys.next() {
        Some(b) => Some(parse_fastopen_key(b)?),
        None => None,
    };
    keys.next().is_none().then_some((primary, backup))
}

/// A key as Linux's `tcp_fastopen_key` writes it: four 32-bit hex words, each
/// stored little-endian.
pub fn parse_fastopen_key(s: &str) -> Option<[u8; 16]> {
    let words: Vec<u32> = s
        .trim()
        .split('-')
        .map(|w| u32::from_str_radix(w, 16).ok())
        .collect::<Option<_>>()?;
    if words.len() != 4 {
        return None;
    }
    let mut k = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        k[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linux_profile_scales_the_window_by_8() {
        assert_eq!(TcpConfig::default().rcv_wscale(), 7);
        let l = TcpConfig::profile("linux").unwrap();
        assert_eq!(l.rcv_wscale(), 8, "tcp_rmem max 15 MiB");
        assert_eq!((l.syn_retries, l.synack_retries), (5, 5));
        assert!(!l.slow_start_after_idle);
        assert!(TcpConfig::profile("bsd").is_none());
        for p in PROFILES {
            assert!(TcpConfig::profile(p).is_some());
        }
    }

    #[test]
    fn sysctls_set_their_tunable() {
        let mut c = TcpConfig::default();
        c.set_sysctl("tcp_timestamps", "0").unwrap();
        assert!(!c.timestamps);
        c.set_sysctl("tcp_rmem", "4096 87380 6291456").unwrap();
        assert_eq!((c.recv_buffer, c.recv_buffer_initial), (6291456, 87380));
        assert_eq!(c.rcv_wscale(), 7);
        c.set_sysctl("tcp_wmem", " 4096 50000 4194304 ").unwrap();
        assert_eq!((c.send_buffer, c.send_buffer_initial), (4194304, 50000));
        c.set_sysctl("tcp_notsent_lowat", "4000").unwrap();
        assert_eq!(c.notsent_lowat, 4000);
        c.set_sysctl("tcp_syn_retries", "2").unwrap();
        assert_eq!(c.syn_retries, 2);
        c.set_sysctl("tcp_keepalive_time", "30").unwrap();
        assert_eq!(c.keepalive_defaults.idle, Duration::from_secs(30));
        c.set_sysctl("tcp_congestion_control", "reno").unwrap();
        assert_eq!(c.congestion, CcAlgorithm::NewReno);
        c.set_sysctl("tcp_ecn", "1").unwrap();
        assert_eq!(c.ecn, ECN_ON);
        assert!(
            c.set_sysctl("tcp_ecn", "3").is_err(),
            "AccECN is not offered"
        );
        c.set_sysctl("tcp_early_retrans", "0").unwrap();
        assert!(!c.tlp);
        c.set_sysctl("tcp_fastopen", "0x602").unwrap();
        assert_eq!(
            c.fastopen,
            FASTOPEN_SERVER | FASTOPEN_SERVER_NO_COOKIE | FASTOPEN_SERVER_ALL
        );
        c.set_sysctl(
            "tcp_fastopen_key",
            "01020304-05060708-090a0b0c-0d0e0f10,a1a1a1a1-b2b2b2b2-c3c3c3c3-d4d4d4d4",
        )
        .unwrap();
        assert_eq!(c.fastopen_key.unwrap()[..5], [4, 3, 2, 1, 8]);
        assert_eq!(
            c.fastopen_backup_key.unwrap()[..5],
            [0xa1, 0xa1, 0xa1, 0xa1, 0xb2]
        );
        assert!(c
            .set_sysctl("tcp_fastopen_key", "1-2-3-4,5-6-7-8,9-a-b-c")
            .is_err());
        c.set_sysctl("tcp_fastopen_key", "a1a1a1a1-b2b2b2b2-c3c3c3c3-d4d4d4d4")
            .unwrap();
        assert_eq!(c.fastopen_key.unwrap()[..5], [0xa1, 0xa1, 0xa1, 0xa1, 0xb2]);
        assert!(c.set_sysctl("tcp_fastopen_key", "a1-b2").is_err());
        assert!(c.set_sysctl("tcp_sack", "yes").is_err());
        assert!(c.set_sysctl("tcp_rmem", "1 2").is_err());
        assert!(c.set_sysctl("tcp_nonsense", "1").is_err());
    }

    #[test]
    fn mtu_probing_sysctls_default_as_linux_and_set() {
        let mut c = TcpConfig::default();
        assert_eq!(c.mtu_probing, MTU_PROBING_OFF);
        assert_eq!(
            (c.base_mss, c.mtu_probe_floor, c.probe_threshold),
            (1024, 48, 8)
        );
        assert_eq!(
            (c.probe_interval, c.retries1),
            (Duration::from_secs(600), 3)
        );
        assert_eq!(TcpConfig::profile("linux").unwrap().mtu_probing, 0);
        c.set_sysctl("tcp_mtu_probing", "2").unwrap();
        assert_eq!(c.mtu_probing, MTU_PROBING_ALWAYS);
        assert!(c.set_sysctl("tcp_mtu_probing", "3").is_err());
        c.set_sysctl("tcp_base_mss", "512").unwrap();
        c.set_sysctl("tcp_mtu_probe_floor", "256").unwrap();
        c.set_sysctl("tcp_probe_threshold", "16").unwrap();
        c.set_sysctl("tcp_probe_interval", "30").unwrap();
        c.set_sysctl("tcp_retries1", "5").unwrap();
        assert_eq!(
            (c.base_mss, c.mtu_probe_floor, c.probe_threshold),
            (512, 256, 16)
        );
        assert_eq!((c.probe_interval, c.retries1), (Duration::from_secs(30), 5));
        assert!(c.set_sysctl("tcp_base_mss", "47").is_err());
        assert!(c.set_sysctl("tcp_mtu_probe_floor", "70000").is_err());
    }
}
