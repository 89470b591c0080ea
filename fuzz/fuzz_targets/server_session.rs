//! A hostile client's session memory against the stack server's session processing:
//! raw writes anywhere in the memory (rings, ring indices, slot words, data area),
//! requests, stream bytes and UDP records, reads, server turns and time, as
//! `usnet_server::fuzzing::run` reads them. The harness checks that the server never
//! panics or spins, never gives a session more sockets than its quota or a socket it
//! does not own, and gets every socket and packet buffer back when the client goes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    usnet_server::fuzzing::run(data);
});
