//! Every unusual event and every drop has a named counter (like FreeBSD's `tcpstat` or
//! `netstat -s`). The name's prefix before the first `_` is the layer.

macro_rules! define_counters {
    ($($field:ident => $desc:literal,)*) => {
        /// Counters of one stack. Plain `u64`s: the core is single-threaded.
        #[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
        pub struct Counters { $(#[doc = $desc] pub $field: u64,)* }

        impl Counters {
            /// `(name, description, value)` for every counter, in declaration order.
            pub fn entries(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($field), $desc, self.$field)),*]
            }
        }
    };
}

define_counters! {
    link_rx_frames => "frames received from the device (and sent by the stack to itself)",
    link_rx_bytes => "bytes received from the device",
    link_rx_linearised => "frames of several buffers copied into one before processing (all but TCP segments for a connection)",
    link_tx_frames => "frames handed to the device",
    link_tx_bytes => "bytes handed to the device",
    drop_input_queue_full => "frames dropped at the stack entrance: input queue full (drop 1)",
    drop_pool_exhausted => "packets lost because no pool buffer was free",
    prio_forced_drop_drop1 => "frames force-dropped at the entrance (port outside P) while drop 1 happened",
    prio_forced_drop_threshold => "frames force-dropped at the entrance (port outside P) with the input queue above the threshold",
    prio_forced_drop_activations => "forced drop activations (at most one per interval)",
    prio_set_recomputed => "recomputations of the priority set S",
    prio_boosts => "consumer priority boosts requested (a priority socket's queue passed half its limit)",
    prio_restores_drained => "boosts ended: the socket's queue drained",
    prio_restores_timeout => "boosts ended: the boost time was up",
    prio_restores_left_set => "boosts ended: the socket left the priority set",
    shard_handoff_out => "frames (or reassembled datagrams) handed to the shard that owns them",
    shard_handoff_in => "frames (or reassembled datagrams) another shard handed to this one",
    tcp_connect_wrong_shard => "connects refused: the chosen local port puts the flow on another shard",
    shard_redirected => "frames handed to the shard that holds their port's socket (this one has none)",
    shard_every_copies => "copies of every-shard frames (ARP replies, advertisements, multicast) handed to the other shards",
    eth_rx_truncated => "frames shorter than an Ethernet header",
    eth_rx_not_for_us => "frames for another MAC address",
    eth_rx_unknown_type => "frames of an EtherType the stack does not speak",
    eth_rx_vlan_tagged => "802.1Q/802.1ad tagged frames (accepted, tag ignored)",
    arp_rx => "ARP packets received",
    arp_rx_malformed => "ARP packets malformed or not Ethernet/IPv4",
    arp_rx_not_for_us => "ARP requests for another address",
    arp_tx_request => "ARP requests sent",
    arp_tx_reply => "ARP replies sent",
    ip4_rx => "IPv4 packets received",
    ip4_rx_truncated => "IPv4 packets truncated or with a lying length",
    ip4_rx_bad_checksum => "IPv4 headers with a bad checksum",
    ip4_rx_bad_header => "IPv4 packets with a bad version or header length",
    ip4_rx_not_for_us => "IPv4 packets for another address",
    ip4_rx_unknown_proto => "IPv4 packets of an unknown protocol",
    ip4_rx_fragments => "IPv4 fragments received",
    ip4_reassembled => "IPv4 datagrams reassembled",
    ip4_reasm_timeout => "IPv4 reassemblies abandoned after the time limit",
    ip4_reasm_overflow => "IPv4 fragments dropped: reassembly memory or entry limit",
    ip4_reasm_evicted => "unfinished IPv4 reassemblies evicted to make room",
    ip4_reasm_bad => "IPv4 fragments dropped: bad offset, size or overlap",
    ip4_tx => "IPv4 packets sent",
    ip4_tx_fragments => "IPv4 fragments sent",
    ip6_rx => "IPv6 packets received",
    ip6_rx_truncated => "IPv6 packets truncated or with a lying length",
    ip6_rx_bad_header => "IPv6 packets with a bad version or extension header chain",
    ip6_rx_not_for_us => "IPv6 packets for another address",
    ip6_rx_unknown_proto => "IPv6 packets of an unknown next header",
    ip6_rx_fragments => "IPv6 fragments received",
    ip6_reassembled => "IPv6 datagrams reassembled",
    ip6_reasm_timeout => "IPv6 reassemblies abandoned after the time limit",
    ip6_reasm_overflow => "IPv6 fragments dropped: reassembly memory or entry limit",
    ip6_reasm_evicted => "unfinished IPv6 reassemblies evicted to make room",
    ip6_reasm_bad => "IPv6 fragments dropped: bad offset, size or overlap",
    ip6_tx => "IPv6 packets sent",
    ip6_tx_fragments => "IPv6 fragments sent",
    ip_tx_no_route => "packets not sent: no route to the destination",
    neigh_tx_solicit => "neighbour solicitations (ARP requests / NS) sent",
    neigh_queue_full => "packets dropped: queue waiting for address resolution full",
    neigh_unresolved => "packets dropped: address resolution failed",
    neigh_unreachable_reported => "host unreachable errors sent to ourselves about packets whose neighbour never answered",
    neigh_cache_full => "packets dropped: neighbour cache full of unresolved entries",
    neigh_evicted => "neighbour entries forgotten early to make room",
    icmp4_rx => "ICMPv4 messages received",
    icmp4_rx_bad_checksum => "ICMPv4 messages with a bad checksum",
    icmp4_rx_malformed => "ICMPv4 messages truncated or malformed",
    icmp4_rx_echo_request => "ICMPv4 echo requests received",
    icmp4_rx_echo_reply => "ICMPv4 echo replies received",
    icmp4_rx_unreachable => "ICMPv4 destination unreachable received",
    icmp4_rx_time_exceeded => "ICMPv4 time exceeded received",
    icmp4_rx_other => "ICMPv4 messages of other types",
    icmp4_tx_echo_reply => "ICMPv4 echo replies sent",
    icmp4_tx_echo_request => "ICMPv4 echo requests sent",
    icmp4_tx_raw => "ICMPv4 messages sent by raw sockets",
    icmp4_tx_unreachable => "ICMPv4 destination unreachable sent",
    icmp4_tx_time_exceeded => "ICMPv4 time exceeded sent",
    icmp_tx_rate_limited => "ICMP errors not sent: rate limit",
    icmp6_rx => "ICMPv6 messages received",
    icmp6_rx_bad_checksum => "ICMPv6 messages with a bad checksum",
    icmp6_rx_malformed => "ICMPv6 messages truncated or malformed",
    icmp6_rx_echo_request => "ICMPv6 echo requests received",
    icmp6_rx_echo_reply => "ICMPv6 echo replies received",
    icmp6_rx_unreachable => "ICMPv6 destination unreachable received",
    icmp6_rx_packet_too_big => "ICMPv6 packet too big received",
    icmp6_rx_time_exceeded => "ICMPv6 time exceeded received",
    icmp6_rx_neighbor_solicit => "NDP neighbour solicitations received",
    icmp6_rx_neighbor_advert => "NDP neighbour advertisements received",
    icmp6_rx_ndp_invalid => "NDP messages failing RFC 4861 validation (hop limit, code)",
    icmp6_rx_other => "ICMPv6 messages of other types",
    icmp6_tx_echo_reply => "ICMPv6 echo replies sent",
    icmp6_tx_echo_request => "ICMPv6 echo requests sent",
    icmp6_tx_raw => "ICMPv6 messages sent by raw sockets",
    icmp6_tx_neighbor_advert => "NDP neighbour advertisements sent",
    icmp6_tx_unreachable => "ICMPv6 destination unreachable sent",
    icmp6_tx_time_exceeded => "ICMPv6 time exceeded sent",
    udp_rx => "UDP datagrams received",
    udp_rx_truncated => "UDP datagrams truncated or with a lying length",
    udp_rx_bad_checksum => "UDP datagrams with a bad checksum",
    udp_rx_no_socket => "UDP datagrams for a port with no socket",
    udp_rx_queue_full => "UDP datagrams dropped: socket receive queue full (drop 2)",
    udp_rx_owner_full => "UDP datagrams dropped: their socket's owner holds its share of the pool in receive queues",
    udp_rx_delivered => "UDP datagrams queued to a socket",
    udp_tx => "UDP datagrams sent",
    udp_tx_too_big => "UDP datagrams refused: larger than 65507 bytes",
    udp_rx_mcast_delivered => "copies of multicast UDP datagrams queued to sockets (one per member socket)",
    udp_tx_mcast => "multicast UDP datagrams sent",
    udp_tx_mcast_looped => "multicast UDP datagrams looped back to local members (IP_MULTICAST_LOOP)",
    mcast_rx_not_member => "IPv4/IPv6 packets to a multicast group the interface has not joined (dropped)",
    mcast_joins => "groups the interface joined (first socket)",
    mcast_leaves => "groups the interface left (last socket)",
    igmp_rx => "IGMP messages received",
    igmp_rx_malformed => "IGMP messages truncated, malformed or with a bad checksum",
    igmp_rx_query => "IGMP membership queries received",
    igmp_rx_other => "IGMP messages of other types (other hosts' reports, leaves)",
    igmp_tx_report => "IGMPv2 membership reports sent",
    igmp_tx_leave => "IGMPv2 leave messages sent",
    mld_rx => "MLD messages received",
    mld_rx_malformed => "MLD messages malformed, or not from a link-local source with hop limit 1",
    mld_rx_query => "MLD queries received",
    mld_rx_other => "MLD messages of other types (other hosts' reports)",
    mld_tx_report => "MLDv2 reports sent (joins, query answers)",
    mld_tx_leave => "MLDv2 reports sent for a group left (change to include, no sources)",
    ping_rx_no_socket => "echo replies for no ping socket",
    raw_rx_delivered => "copies of ICMP messages queued on raw sockets",
    raw_rx_queue_full => "copies of ICMP messages dropped: raw socket queue or owner share full",
    udp_icmp_rx => "ICMP errors quoting a UDP datagram",
    dgram_icmp_no_socket => "ICMP errors about a datagram of no UDP or ping socket (ignored)",
    dgram_icmp_ignored => "ICMP errors ignored by a datagram socket (soft, or unconnected, without IP_RECVERR)",
    dgram_icmp_queued => "ICMP errors queued on a datagram socket's error queue (IP_RECVERR)",
    dgram_icmp_queue_full => "ICMP errors dropped: error queue over the receive buffer",
    ping_rx_queue_full => "echo replies dropped: ping socket queue full",
    tcp_rx => "TCP segments received",
    tcp_rx_truncated => "TCP segments truncated or with a bad header length",
    tcp_rx_bad_checksum => "TCP segments with a bad checksum",
    tcp_rx_not_unicast => "TCP segments to a broadcast or multicast address (dropped)",
    tcp_rx_min_ttl => "TCP segments below their socket's minimum TTL or hop limit (IP_MINTTL, IPV6_MINHOPCOUNT; dropped)",
    tcp_rx_no_socket => "TCP segments for no connection or listener",
    tcp_gro_merged => "TCP segments coalesced into the segment before them (GRO)",
    tcp_gro_frames => "coalesced TCP segments (of several wire segments) handed to connections (GRO)",
    tcp_rx_chained => "TCP segments that arrived in several buffers (a device's GSO frame) read by their connection where they lie, not linearised",
    tcp_tx_reset_no_socket => "RSTs sent for segments to closed ports",
    tcp_tx_segments => "TCP segments handed to IP",
    tcp_tx_blocked => "TCP segments deferred: transmit queue full or no buffer (retried)",
    tcp_zc_tx_attached => "zero-copy TCP GSO frames that carry the application's buffers as fragments (payload not copied)",
    tcp_tx_lent => "TCP segments whose payload a GSO frame carried from a lent send ring (a stack server client's) by reference, not copied into the frame",
    tcp_lent_given_back => "lent send rings given back to their owner mid-connection, the connection copying what it held into a buffer of its own (the ring bound, the socket became shared, a write went through a copying call, the connection failed)",
    tcp_zc_tx_in_place => "zero-copy TCP segments sent from the application's buffer (headers written into its headroom)",
    tcp_zc_tx_kept => "zero-copy TX slots whose buffer the application kept (SLOT_KEEP: the send queue took a reference of its own)",
    tcp_zc_tx_copied => "zero-copy TCP segments copied into a new frame (several pieces, a piece still in flight, or too little headroom)",
    tcp_zc_rx_staged => "TCP payloads copied into pool buffers for a zero-copy connection (the frame was not one buffer)",
    tcp_zc_bad_slots => "zero-copy ring slots refused: a buffer the application does not own, a bad range or socket",
    tcp_active_opens => "TCP connections opened by connect",
    tcp_passive_opens => "TCP connections accepted by listeners",
    tcp_time_wait_reused => "TIME-WAIT connections replaced by a new SYN (RFC 6191)",
    tcp_conns_reaped => "TCP connections freed",
    tcp_icmp_rx => "ICMP errors quoting a TCP segment",
    tcp_icmp_no_conn => "ICMP errors for TCP matching no connection (ignored)",
    tcp_icmp_other => "ICMP errors for TCP of a code TCP does not act on (ignored)",
    tcp_icmp_out_of_window => "ICMP errors for TCP ignored: quoted sequence number not in flight",
    tcp_icmp_mss_clamped => "TCP MSS decreases by ICMP fragmentation-needed / packet-too-big",
    tcp_icmp_mtu_not_lowered => "ICMP fragmentation-needed / packet-too-big that did not lower the MSS",
    tcp_icmp_hard_errors => "TCP connection attempts ended by ICMP unreachable",
    tcp_icmp_soft_errors => "ICMP errors kept as TCP soft errors (reported only on a timeout)",
    tcp_conn_established => "TCP connections established (engine)",
    tcp_conn_refused => "TCP connection attempts refused (RST in SYN-SENT)",
    tcp_conn_resets => "TCP connections reset by the peer",
    tcp_conn_aborts => "TCP connections aborted locally (RST sent)",
    tcp_conn_timeouts => "TCP connections dropped after too many retransmissions",
    tcp_persist_timeouts => "TCP connections dropped: zero-window probes never answered with an open window",
    tcp_fin_wait2_timeouts => "orphaned TCP connections dropped in FIN-WAIT-2 (peer never closed)",
    tcp_keepalive_timeouts => "TCP connections dropped by keepalive",
    tcp_engine_rx_segments => "TCP segments processed by connections",
    tcp_engine_tx_segments => "TCP segments sent by connections",
    tcp_rx_bytes => "TCP in-order payload bytes received",
    tcp_rx_direct_bytes => "TCP in-order payload bytes written straight into a client's ring (no receive queue)",
    tcp_tx_bytes => "TCP new payload bytes sent",
    tcp_rx_dup_bytes => "TCP payload bytes received twice",
    tcp_rx_ooo_segments => "TCP segments received out of order",
    tcp_rx_out_of_window => "TCP segments outside the receive window",
    tcp_rx_paws_rejected => "TCP segments dropped by PAWS",
    tcp_retransmit_segments => "TCP segments retransmitted",
    tcp_retransmit_bytes => "TCP bytes retransmitted",
    tcp_syn_retransmits => "SYN or SYN-ACK retransmissions",
    tcp_rto_expired => "TCP retransmission timeouts",
    tcp_fast_recoveries => "TCP fast recovery episodes",
    tcp_rack_losses => "TCP segments marked lost by RACK",
    tcp_tlp_probes => "TCP tail loss probes",
    tcp_mtu_probes => "TCP path MTU probes sent (tcp_mtu_probing)",
    tcp_mtu_probe_successes => "TCP path MTU probes acknowledged (MSS raised)",
    tcp_mtu_probe_failures => "TCP path MTU probes lost",
    tcp_mtu_black_holes => "TCP timeouts taken as a path MTU black hole",
    tcp_tx_rst => "RSTs sent by connections and listeners",
    tcp_tx_challenge_acks => "TCP challenge ACKs sent (RFC 5961)",
    tcp_time_wait_entered => "TCP connections that entered TIME-WAIT",
    tcp_listen_syn_received => "SYNs received by listeners",
    tcp_listen_syn_queue_full => "SYNs dropped: SYN queue full and cookies off",
    tcp_listen_cookies_sent => "SYN cookies sent",
    tcp_listen_cookies_valid => "connections completed from a SYN cookie",
    tcp_listen_accept_overflow => "handshakes not completed: accept backlog full",
}

impl Counters {
    /// Copies the engine's totals into the `tcp_*` fields that mirror them.
    pub(crate) fn mirror_tcp(&mut self, s: &usnet_tcp::TcpStats) {
        self.tcp_conn_established = s.conn_established;
        self.tcp_conn_refused = s.conn_refused;
        self.tcp_conn_resets = s.conn_resets;
        self.tcp_conn_aborts = s.conn_aborts;
        self.tcp_conn_timeouts = s.conn_timeouts;
        self.tcp_keepalive_timeouts = s.keepalive_timeouts;
        self.tcp_persist_timeouts = s.persist_timeouts;
        self.tcp_fin_wait2_timeouts = s.fin_wait2_timeouts;
        self.tcp_engine_rx_segments = s.rx_segments;
        self.tcp_engine_tx_segments = s.tx_segments;
        self.tcp_rx_bytes = s.rx_bytes;
        self.tcp_rx_direct_bytes = s.rx_direct_bytes;
        self.tcp_tx_bytes = s.tx_bytes;
        self.tcp_rx_dup_bytes = s.rx_dup_bytes;
        self.tcp_rx_ooo_segments = s.rx_ooo_segments;
        self.tcp_rx_out_of_window = s.rx_out_of_window;
        self.tcp_rx_paws_rejected = s.rx_paws_rejected;
        self.tcp_retransmit_segments = s.retransmit_segments;
        self.tcp_retransmit_bytes = s.retransmit_bytes;
        self.tcp_syn_retransmits = s.syn_retransmits + s.listen_synack_retransmits;
        self.tcp_rto_expired = s.rto_expired;
        self.tcp_fast_recoveries = s.fast_recoveries;
        self.tcp_rack_losses = s.rack_losses;
        self.tcp_tlp_probes = s.tlp_probes;
        self.tcp_mtu_probes = s.mtu_probes;
        self.tcp_mtu_probe_successes = s.mtu_probe_successes;
        self.tcp_mtu_probe_failures = s.mtu_probe_failures;
        self.tcp_mtu_black_holes = s.mtu_black_holes;
        self.tcp_tx_rst = s.tx_rst + s.listen_rst_sent;
        self.tcp_tx_challenge_acks = s.tx_challenge_acks;
        self.tcp_time_wait_entered = s.time_wait_entered;
        self.tcp_icmp_out_of_window = s.icmp_out_of_window;
        self.tcp_icmp_mss_clamped = s.pmtu_decreases;
        self.tcp_icmp_mtu_not_lowered = s.pmtu_not_lowered;
        self.tcp_icmp_hard_errors = s.icmp_hard_errors;
        self.tcp_icmp_soft_errors = s.icmp_soft_errors;
        self.tcp_listen_syn_received = s.listen_syn_received;
        self.tcp_listen_syn_queue_full = s.listen_syn_queue_full;
        self.tcp_listen_cookies_sent = s.listen_cookies_sent;
        self.tcp_listen_cookies_valid = s.listen_cookies_valid;
        self.tcp_listen_accept_overflow = s.listen_accept_overflow;
    }
}

impl Counters {
    /// The layer a counter belongs to (its name up to the first `_`).
    pub fn layer_of(name: &str) -> &str {
        name.split('_').next().unwrap_or(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_list_every_field_with_a_layer() {
        let c = Counters {
            udp_rx_queue_full: 3,
            ..Default::default()
        };
        let e = c.entries();
        assert!(e.len() > 50);
        assert!(e
            .iter()
            .any(|(n, _, v)| *n == "udp_rx_queue_full" && *v == 3));
        assert_eq!(Counters::layer_of("udp_rx_queue_full"), "udp");
    }
}
