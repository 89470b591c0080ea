//! Arbitrary bytes as a received Ethernet frame, walked down through
//! ARP / IPv4 / IPv6 (+ extension headers) / ICMP / ICMPv6 / UDP / TCP, and
//! fed raw to every parser. Anything that parses must re-emit and re-parse
//! identically (see `usnet_wire::testing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    usnet_wire::testing::walk_raw(data);
});
