//! Arbitrary bytes as an IGMP message and as an MLD message: whatever parses
//! must re-emit and parse back identically, with a valid checksum (the walker in
//! `usnet_wire::testing`).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use usnet_wire::testing::walk_transport;

fuzz_target!(|data: &[u8]| {
    let v4 = (
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1)),
    );
    let v6 = (
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16)),
    );
    walk_transport(usnet_wire::IPPROTO_IGMP, v4.0, v4.1, data);
    walk_transport(usnet_wire::IPPROTO_ICMPV6, v6.0, v6.1, data);
});
