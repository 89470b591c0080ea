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
    /// Send buffer size in bytes (the most unacknowledged + unsent data held).
    pub send_buffer: usize,
    /// Receive buffer size in bytes (the largest window that can be advertised).
    pub recv_buffer: usize,
    /// Initial receive window when autotuning (grows towards `recv_buffer`).
    pub recv_buffer_initial: usize,
    /// Receive-buffer autotuning (dynamic right-sizing of the advertised window).
    pub autotune: bool,
    /// Disable Nagle's algorithm (TCP_NODELAY).
    pub nodelay: bool,
    /// Keepalive, if enabled (SO_KEEPALIVE).
    pub keepalive: Option<Keepalive>,
    /// SO_LINGER: `Some(0)` makes `close()` abortive (RST); `Some(t)` bounds how long a
    /// closing connection may try to deliver its data before it is aborted.
    pub linger: Option<Duration>,
    /// Congestion controller.
    pub congestion: CcAlgorithm,
    /// Initial congestion window in segments (RFC 6928).
    pub initial_window: u32,
    /// Initial RTO (RFC 6298: 1 s).
    pub initial_rto: Duration,
    /// Lower bound of the RTO (Linux: 200 ms).
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
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1460,
            send_buffer: 1 << 20,
            recv_buffer: 4 << 20,
            recv_buffer_initial: 128 << 10,
            autotune: true,
            nodelay: false,
            keepalive: None,
            linger: None,
            congestion: CcAlgorithm::Cubic,
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
        }
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
