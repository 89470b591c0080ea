//! Counters for every unusual event, per connection and per listener (the engine's
//! `tcpstat`). The stack sums them with [`TcpStats::merge`] for `usnet stat`.

macro_rules! define_stats {
    ($($field:ident => $desc:literal,)*) => {
        /// TCP counters. Plain `u64`s: a connection is single-threaded.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct TcpStats { $(#[doc = $desc] pub $field: u64,)* }

        impl TcpStats {
            /// `(name, description, value)` for every counter, in declaration order.
            pub fn entries(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($field), $desc, self.$field)),*]
            }
            /// Add every counter of `other` into `self`.
            pub fn merge(&mut self, other: &TcpStats) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

define_stats! {
    rx_segments => "segments received",
    rx_data_segments => "segments received carrying data",
    rx_bytes => "new in-order data bytes received",
    rx_dup_bytes => "data bytes received that were already received",
    rx_ooo_segments => "segments received out of order (queued)",
    rx_ooo_full => "out-of-order segments dropped: range limit",
    rx_out_of_window => "segments outside the receive window (ACK sent)",
    rx_beyond_window_bytes => "data bytes trimmed because they were beyond the window",
    rx_after_close => "data received after the application closed (RST sent)",
    rx_paws_rejected => "segments dropped by PAWS (old timestamp)",
    rx_ts_recent_expired => "TS.Recent invalidated after 24 days idle",
    rx_missing_ts => "segments without the timestamps the connection negotiated (accepted)",
    rx_no_ack => "segments without ACK in a synchronized state (dropped)",
    rx_ack_too_new => "ACKs for data never sent (challenge ACK)",
    rx_ack_too_old => "ACKs older than the send window allows (ACK sent, dropped)",
    rx_dup_acks => "duplicate ACKs",
    rx_rst => "RSTs that reset the connection",
    rx_rst_out_of_window => "RSTs outside the window (ignored)",
    rx_rst_time_wait => "RSTs ignored in TIME-WAIT (RFC 1337)",
    rx_rst_challenged => "in-window RSTs not at RCV.NXT (challenge ACK)",
    rx_syn_challenged => "SYNs in a synchronized state (challenge ACK)",
    rx_bad_syn_ack => "unacceptable SYN-ACKs in SYN-SENT (RST sent)",
    rx_urgent => "segments with the urgent flag",
    rx_urgent_inline => "urgent bytes left inline (oob_inline or beyond the window)",
    rx_urgent_oob => "urgent bytes taken out of the stream",
    rx_closed_drop => "segments arriving for a closed connection",
    tx_segments => "segments sent",
    tx_data_segments => "segments sent carrying data",
    tx_bytes => "new data bytes sent",
    tx_acks => "pure ACKs sent",
    tx_delayed_acks => "ACKs sent by the delayed-ACK timer",
    tx_quick_acks => "ACKs sent at once in quick-ack mode",
    tx_window_updates => "window updates sent after the application read",
    tx_zero_window => "segments advertising a zero window",
    tx_challenge_acks => "challenge ACKs sent (RFC 5961)",
    challenge_acks_limited => "challenge ACKs suppressed by the rate limit",
    tx_rst => "RSTs sent",
    tx_sack_blocks => "SACK blocks sent",
    tx_dsack => "D-SACK blocks sent (duplicate data reported)",
    tx_sink_full => "segments the sink refused (no buffer; retried later)",
    retransmit_segments => "segments retransmitted",
    retransmit_bytes => "bytes retransmitted",
    syn_retransmits => "SYN or SYN-ACK retransmissions",
    rto_expired => "retransmission timeouts",
    fast_recoveries => "fast recovery episodes",
    rto_recoveries => "loss recovery episodes started by an RTO",
    partial_acks => "partial ACKs in recovery (NewReno)",
    dupthresh_losses => "segments marked lost by the duplicate-ACK / SACK threshold",
    rack_losses => "segments marked lost by RACK",
    rack_reorder_timeouts => "RACK reordering timer expiries",
    reordering_seen => "reordering detected (a hole filled by an original transmission)",
    tlp_probes => "tail loss probes sent",
    rx_sack_blocks => "SACK blocks received",
    rx_sack_invalid => "SACK blocks ignored: beyond SND.NXT or empty",
    rx_dsack => "D-SACK blocks received (tolerated)",
    persist_probes => "zero-window probes sent",
    persist_timeouts => "connections dropped: zero-window probes never answered with an open window",
    keepalive_probes => "keepalive probes sent",
    keepalive_timeouts => "connections dropped by keepalive",
    conn_timeouts => "connections dropped after too many retransmissions",
    conn_refused => "connection attempts refused (RST in SYN-SENT)",
    conn_resets => "connections reset by the peer",
    conn_aborts => "connections aborted locally (RST sent)",
    conn_established => "connections established",
    time_wait_entered => "connections that entered TIME-WAIT",
    time_wait_restarted => "TIME-WAIT timers restarted by a retransmitted FIN",
    fin_wait2_timeouts => "orphaned FIN-WAIT-2 connections timed out",
    linger_timeouts => "close() linger times that ran out (RST sent)",
    rcv_window_grown => "receive-window autotuning steps",
    mss_clamped => "peer MSS values clamped to a sane range",
    pmtu_decreases => "MSS lowered by an ICMP fragmentation-needed / packet-too-big",
    pmtu_not_lowered => "ICMP fragmentation-needed / packet-too-big that did not lower the MSS",
    mtu_probes => "path MTU probes sent (RFC 4821, tcp_mtu_probing)",
    mtu_probe_successes => "path MTU probes acknowledged (the MSS rose)",
    mtu_probe_failures => "path MTU probes lost (the search's upper bound fell)",
    mtu_black_holes => "timeouts past tcp_retries1 taken as a path MTU black hole (probing on, or its MSS halved)",
    mtu_reprobes => "path MTU searches restarted after tcp_probe_interval",
    pmtu_resends => "fragmentation-needed / packet-too-big errors that resent segments in flight at once",
    icmp_hard_errors => "connection attempts ended by an ICMP error (port/host/net unreachable)",
    icmp_soft_errors => "ICMP errors kept as soft errors (reported only on a timeout)",
    icmp_out_of_window => "ICMP errors ignored: quoted sequence number not in flight (RFC 5927)",
    listen_syn_received => "SYNs received by listeners",
    listen_syn_queue_full => "SYNs dropped: SYN queue full and cookies off",
    listen_cookies_sent => "SYN cookies sent",
    listen_cookies_valid => "connections completed from a valid SYN cookie",
    listen_cookies_invalid => "ACKs with an invalid or expired SYN cookie (RST sent)",
    listen_accept_overflow => "handshakes not completed: accept backlog full",
    listen_synack_retransmits => "SYN-ACK retransmissions",
    listen_synack_timeouts => "SYN queue entries dropped after all SYN-ACK retries",
    listen_rst_sent => "RSTs sent by listeners",
    listen_bad_segments => "segments for a listener dropped",
    tfo_syn_data_accepted => "Fast Open: SYNs whose data a server accepted (RFC 7413)",
    tfo_cookie_requests => "Fast Open: cookies a server sent (requested, or the client's was invalid)",
    tfo_syn_data_acked => "Fast Open: SYN data the server acknowledged (client)",
    tfo_syn_data_resent => "Fast Open: SYN data the server did not acknowledge, sent again (client)",
    rx_ecn_ce => "data segments that arrived CE-marked (ECN, RFC 3168)",
    rx_ecn_ece => "ACKs carrying ECE (ECN congestion echo)",
    ecn_reductions => "congestion-window reductions for ECN echoes",
    listen_challenge_acks => "challenge ACKs for an in-window, inexact RST on a half-open connection (RFC 5961 §3.2)",
}
