//! Counters for every unusual event, per connection and per listener (the engine's
//! `tcpstat`). The stack sums them with [`TcpStats::merge`] for `usnet stat`.
//!
//! A connection keeps them as [`ConnStats`]: the counters nearly every connection
//! moves inline, the rest in a block allocated the first time one of them counts.
//! Most connections never see a PAWS reject, an ICMP error or a SYN cookie, and
//! the 74 rare counters inline were 592 of an idle connection's bytes.

macro_rules! define_stats {
    (common { $($hot:ident => $hdesc:literal,)* } rare { $($cold:ident => $cdesc:literal,)* }) => {
        /// TCP counters. Plain `u64`s: a connection is single-threaded.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct TcpStats {
            $(#[doc = $hdesc] pub $hot: u64,)*
            $(#[doc = $cdesc] pub $cold: u64,)*
        }

        impl TcpStats {
            /// `(name, description, value)` for every counter, in declaration order.
            pub fn entries(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![
                    $((stringify!($hot), $hdesc, self.$hot),)*
                    $((stringify!($cold), $cdesc, self.$cold),)*
                ]
            }
            /// Add every counter of `other` into `self`.
            pub fn merge(&mut self, other: &TcpStats) {
                $(self.$hot += other.$hot;)*
                $(self.$cold += other.$cold;)*
            }
        }

        /// A connection's counters: the common ones inline, the rare ones behind
        /// [`ConnStats::rare`] (allocated when one first counts).
        #[derive(Debug, Clone, Default)]
        pub struct ConnStats {
            $(#[doc = $hdesc] pub $hot: u64,)*
            rare: Option<Box<RareStats>>,
        }

        /// The counters a connection rarely moves.
        #[derive(Debug, Clone, Default)]
        pub struct RareStats {
            $(#[doc = $cdesc] pub $cold: u64,)*
        }

        impl ConnStats {
            /// The rare counters, to count in (allocates them the first time).
            pub fn rare(&mut self) -> &mut RareStats {
                self.rare.get_or_insert_with(Default::default)
            }
            /// Every counter, as the stack and `tcp_info` read them.
            pub fn to_stats(&self) -> TcpStats {
                let mut t = TcpStats {
                    $($hot: self.$hot,)*
                    ..TcpStats::default()
                };
                if let Some(r) = &self.rare {
                    $(t.$cold = r.$cold;)*
                }
                t
            }
        }
    };
}

define_stats! {
    common {
        rx_segments => "segments received",
        rx_data_segments => "segments received carrying data",
        rx_bytes => "new in-order data bytes received",
        rx_direct_bytes => "in-order data bytes handed straight to a receive sink (a stack server client's ring)",
        rx_dup_bytes => "data bytes received that were already received",
        rx_ooo_segments => "segments received out of order (queued)",
        rx_dup_acks => "duplicate ACKs",
        tx_segments => "segments sent",
        tx_data_segments => "segments sent carrying data",
        tx_bytes => "new data bytes sent",
        tx_run_segments => "new-data segments sent in runs (full segments after a full one in the same pass; TcpConfig::send_runs)",
        tx_acks => "pure ACKs sent",
        tx_delayed_acks => "ACKs sent by the delayed-ACK timer",
        tx_quick_acks => "ACKs sent at once in quick-ack mode",
        tx_window_updates => "window updates sent after the application read",
        tx_zero_window => "segments advertising a zero window",
        tx_sack_blocks => "SACK blocks sent",
        retransmit_segments => "segments retransmitted",
        retransmit_bytes => "bytes retransmitted",
        syn_retransmits => "SYN or SYN-ACK retransmissions",
        rto_expired => "retransmission timeouts",
        fast_recoveries => "fast recovery episodes",
        tlp_probes => "tail loss probes sent",
        rx_sack_blocks => "SACK blocks received",
        conn_established => "connections established",
        time_wait_entered => "connections that entered TIME-WAIT",
        rcv_window_grown => "receive-window autotuning steps",
    }
    rare {
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
        tx_challenge_acks => "challenge ACKs sent (RFC 5961)",
        challenge_acks_limited => "challenge ACKs suppressed by the rate limit",
        tx_rst => "RSTs sent",
        tx_dsack => "D-SACK blocks sent (duplicate data reported)",
        tx_sink_full => "segments the sink refused (no buffer; retried later)",
        rto_recoveries => "loss recovery episodes started by an RTO",
        partial_acks => "partial ACKs in recovery (NewReno)",
        dupthresh_losses => "segments marked lost by the duplicate-ACK / SACK threshold",
        rack_losses => "segments marked lost by RACK",
        rack_reorder_timeouts => "RACK reordering timer expiries",
        reordering_seen => "reordering detected (a hole filled by an original transmission)",
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
        time_wait_restarted => "TIME-WAIT timers restarted by a retransmitted FIN",
        fin_wait2_timeouts => "orphaned FIN-WAIT-2 connections timed out",
        linger_timeouts => "close() linger times that ran out (RST sent)",
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rare_counters_take_room_only_once_one_counts() {
        let mut s = ConnStats::default();
        assert!(s.rare.is_none());
        // The rare block is its own allocation: inline is the common counters and a pointer.
        assert!(std::mem::size_of::<ConnStats>() * 3 < std::mem::size_of::<TcpStats>());
        s.rx_segments = 3;
        assert!(s.rare.is_none(), "a common counter allocates nothing");
        s.rare().rx_paws_rejected += 2;
        s.rare().listen_rst_sent += 1;
        let t = s.to_stats();
        assert_eq!(
            (t.rx_segments, t.rx_paws_rejected, t.listen_rst_sent),
            (3, 2, 1)
        );
        let total: u64 = t.entries().iter().map(|e| e.2).sum();
        assert_eq!(total, 6, "nothing else moved");
        assert_eq!(t.entries().len(), 101, "every counter is listed once");
    }
}
