//! The contract between a usnet stack server and its clients: what lives where in a
//! client's session memory, and what the requests, completions and socket slots mean.
//! Plain constants and `#[repr(C)]` types, no dependencies but the errno numbers of
//! `usnet_socket_api` (itself dependency-free), so a client in any language can follow it
//! (`include/usnet.h` mirrors it for C).
//!
//! # A session
//! A client connects to the stack's control socket and asks to attach. The server
//! creates a memfd for the session, lays it out as below, and passes it (and the
//! server's shared page, for a stack on an fd-based link the server's doorbell
//! eventfd, and last the session's own eventfd) over the socket with SCM_RIGHTS. The connection stays open: it is how each
//! side sees the other die.
//!
//! ```text
//! 0          SessionHeader (one page): magic, version, geometry, wake-up words,
//!            the submission and completion ring indices
//! sq_off     submission ring: sq_entries × Request (64 B)       client → server
//! cq_off     completion ring: cq_entries × Completion (32 B)    server → client
//! slots_off  max_sockets × socket slot (SLOT_SIZE B): state, readiness, addresses,
//!            and the counters of the socket's two byte rings
//! data_off   per socket slot i: its receive ring (ring_bytes, server → client) at
//!            data_off + 2·i·ring_bytes, its send ring (client → server) after it
//! ```
//!
//! # Ownership (who writes what)
//! - Submission ring: the client writes entries and `sq_head`; the server writes
//!   `sq_tail`. Completion ring: the other way round. (usnet-shm's spsc protocol.)
//! - A slot's `state`, `kind`, `flags`, `error`, `events`, `accept_pending`, `gen`, the
//!   addresses and the info area are the server's. The receive ring's `prod` is the
//!   server's and its `cons` the client's; the send ring's `prod` the client's and its
//!   `cons` the server's (usnet-shm's byte ring protocol). `rx_armed`/`tx_armed` are set
//!   by the server and taken (swapped to 0) by the client.
//! - The server trusts nothing the client wrote: every request field, slot index and
//!   counter is checked, and a client can only garble its own streams.
//!
//! # Wake-ups
//! - Client → server: after publishing a request (or bytes the server must fetch), a
//!   client issues a SeqCst fence, reads `server_asleep` in its header, and if it is
//!   set rings the server: a futex wake on the shared page's `bell_seq` (after
//!   incrementing it) or a write to the server's eventfd, as `bell_kind` says.
//! - Server → client: the server bumps `client_bell_seq` and wakes it when
//!   `client_sleepers` is non-zero (usnet-shm's Gate), and writes the session's
//!   eventfd when `want_eventfd` is non-zero: a client thread that waits in `poll(2)`
//!   on kernel descriptors too announces itself there (the same Gate, with the
//!   eventfd for the futex: both sides' accesses SeqCst, the client re-checks
//!   `client_bell_seq` after announcing).
//! - Streams: when the server finds a socket's send ring empty it sets `tx_armed`,
//!   fences, and looks again; a client that publishes bytes, fences and finds
//!   `tx_armed` set (swap to 0) posts a `TX_KICK`. The receive ring works the same way
//!   with `rx_armed` and `RX_KICK` when the server stopped for lack of room.

#![forbid(unsafe_code)]

/// "USNETSES" in little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"USNETSES");
/// Bumped on every incompatible change of this layout.
pub const VERSION: u32 = 4;
pub const PAGE: usize = 4096;
pub const CACHE_LINE: usize = 64;

// ---------------------------------------------------------------- session header

/// Offsets in the session header (page 0). Each wake-up word sits on its own line.
pub mod hdr {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const TOTAL_LEN: usize = 16;
    pub const SQ_OFF: usize = 24;
    pub const SQ_ENTRIES: usize = 28;
    pub const CQ_OFF: usize = 32;
    pub const CQ_ENTRIES: usize = 36;
    pub const SLOTS_OFF: usize = 40;
    pub const MAX_SOCKETS: usize = 44;
    pub const RING_BYTES: usize = 48;
    pub const DATA_OFF: usize = 56;
    /// The session's number at the server (its owner id in the stack).
    pub const SESSION_ID: usize = 52;
    /// Server: non-zero while the server may sleep (clients ring it then).
    pub const SERVER_ASLEEP: usize = 64;
    /// Server → client bell: the `seq` futex word the server bumps.
    pub const CLIENT_BELL_SEQ: usize = 128;
    /// Client: how many client threads announced they may sleep on the bell.
    pub const CLIENT_SLEEPERS: usize = 192;
    /// Client: how many client threads wait in `poll(2)` on the session's eventfd
    /// (beside kernel descriptors); the server writes the eventfd while non-zero.
    pub const WANT_EVENTFD: usize = 256;
    /// Server: non-zero once the server has gone (orderly shutdown).
    pub const SERVER_GONE: usize = 320;
    /// Submission ring indices (spsc: producer's head, consumer's tail).
    pub const SQ_HEAD: usize = 384;
    pub const SQ_TAIL: usize = 448;
    /// Completion ring indices.
    pub const CQ_HEAD: usize = 512;
    pub const CQ_TAIL: usize = 576;
    /// The stack's link MTU (u32), which the server writes before the client
    /// attaches: `IP_MTU`, and the limit of a send under `IP_PMTUDISC_DO`.
    pub const LINK_MTU: usize = 640;
}

/// Offsets in the server's shared page (one page, mapped by every client).
pub mod server_page {
    /// The server's futex bell: clients bump `seq` and wake it.
    pub const BELL_SEQ: usize = 0;
    pub const BELL_SLEEPERS: usize = 64;
    /// [`super::BELL_FUTEX`] or [`super::BELL_EVENTFD`].
    pub const BELL_KIND: usize = 128;
    pub const SERVER_PID: usize = 192;
    pub const LEN: usize = super::PAGE;
}

/// The server sleeps on a futex: ring it with a futex wake on `BELL_SEQ`.
pub const BELL_FUTEX: u32 = 1;
/// The server sleeps in ppoll: ring it by writing its eventfd.
pub const BELL_EVENTFD: u32 = 2;

/// The most sockets a client may hold and the largest ring it may have, unless the
/// stack is told otherwise (`usnet up --client-sockets`, `--ring-bytes`). The shim
/// sizes its sessions within the first.
pub const DEFAULT_CLIENT_SOCKETS: u32 = 16384;
pub const DEFAULT_MAX_RING_BYTES: u32 = 1 << 20;

/// A session's geometry, chosen by the server at attach time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub sq_entries: u32,
    pub cq_entries: u32,
    pub max_sockets: u32,
    /// Bytes in each of a socket's two rings (a power of two, at least a page).
    pub ring_bytes: u32,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            sq_entries: 256,
            cq_entries: 512,
            max_sockets: 256,
            ring_bytes: 256 * 1024,
        }
    }
}

/// Where everything of a session lies, derived from its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub geometry: Geometry,
    pub sq_off: usize,
    pub cq_off: usize,
    pub slots_off: usize,
    pub data_off: usize,
    pub total_len: usize,
}

/// Why a geometry cannot be laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadGeometry;

fn page_up(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

impl Layout {
    /// Lays out a session. Entries counts must be powers of two (at most 65536), the
    /// ring size a power of two from one page to 16 MiB, at most 65536 sockets.
    pub fn new(g: Geometry) -> Result<Layout, BadGeometry> {
        let pow2 = |n: u32, lo: u32, hi: u32| n.is_power_of_two() && (lo..=hi).contains(&n);
        if !pow2(g.sq_entries, 2, 65536)
            || !pow2(g.cq_entries, 2, 65536)
            || !pow2(g.ring_bytes, PAGE as u32, 16 << 20)
            || g.max_sockets == 0
            || g.max_sockets > 65536
        {
            return Err(BadGeometry);
        }
        let sq_off = PAGE;
        let cq_off = page_up(sq_off + g.sq_entries as usize * REQUEST_SIZE);
        let slots_off = page_up(cq_off + g.cq_entries as usize * COMPLETION_SIZE);
        let data_off = page_up(slots_off + g.max_sockets as usize * SLOT_SIZE);
        let total_len = data_off
            .checked_add(g.max_sockets as usize * 2 * g.ring_bytes as usize)
            .ok_or(BadGeometry)?;
        Ok(Layout {
            geometry: g,
            sq_off,
            cq_off,
            slots_off,
            data_off,
            total_len,
        })
    }

    /// Offset of slot `i`'s words.
    pub fn slot(&self, i: u32) -> usize {
        self.slots_off + i as usize * SLOT_SIZE
    }

    /// Offset of slot `i`'s receive ring bytes; its send ring follows.
    pub fn rx_data(&self, i: u32) -> usize {
        self.data_off + 2 * i as usize * self.geometry.ring_bytes as usize
    }

    pub fn tx_data(&self, i: u32) -> usize {
        self.rx_data(i) + self.geometry.ring_bytes as usize
    }
}

// ---------------------------------------------------------------- requests

pub const REQUEST_SIZE: usize = 64;
pub const COMPLETION_SIZE: usize = 32;

/// One call from a client. `tag` comes back in the completion; `slot` names the
/// socket; `args` depend on `op`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request {
    pub op: u16,
    pub flags: u16,
    pub slot: u32,
    pub tag: u64,
    pub args: [u64; 6],
}

/// A call's result: `result` is a value (≥ 0) or a negative errno.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub result: i64,
    pub aux: [u64; 2],
}

impl Request {
    pub fn to_bytes(&self) -> [u8; REQUEST_SIZE] {
        let mut b = [0u8; REQUEST_SIZE];
        b[0..2].copy_from_slice(&self.op.to_le_bytes());
        b[2..4].copy_from_slice(&self.flags.to_le_bytes());
        b[4..8].copy_from_slice(&self.slot.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        for (i, a) in self.args.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8; REQUEST_SIZE]) -> Request {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = u64_at(16 + 8 * i);
        }
        Request {
            op: u16::from_le_bytes([b[0], b[1]]),
            flags: u16::from_le_bytes([b[2], b[3]]),
            slot: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            tag: u64_at(8),
            args,
        }
    }
}

impl Completion {
    pub fn to_bytes(&self) -> [u8; COMPLETION_SIZE] {
        let mut b = [0u8; COMPLETION_SIZE];
        b[0..8].copy_from_slice(&self.tag.to_le_bytes());
        b[8..16].copy_from_slice(&self.result.to_le_bytes());
        b[16..24].copy_from_slice(&self.aux[0].to_le_bytes());
        b[24..32].copy_from_slice(&self.aux[1].to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; COMPLETION_SIZE]) -> Completion {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Completion {
            tag: u64_at(0),
            result: u64_at(8) as i64,
            aux: [u64_at(16), u64_at(24)],
        }
    }
}

/// Request opcodes.
pub mod op {
    /// Does nothing; completes with 0 (a round trip).
    pub const NOP: u16 = 0;
    /// `args[0]`: [`super::KIND_TCP`], [`super::KIND_UDP`] or [`super::KIND_ICMP`].
    /// Result: the new slot.
    pub const SOCKET: u16 = 1;
    /// `args[0..4]`: the address ([`super::SockAddr::to_args`]); `args[4]`, for a
    /// UDP socket: the families a wildcard address takes ([`super::FAM_V4`] |
    /// [`super::FAM_V6`]; 0: both); `args[5]`: [`super::BIND_REUSE`]
    /// (SO_REUSEADDR or SO_REUSEPORT was set) | [`super::BIND_REUSEPORT`]
    /// (SO_REUSEPORT, for a TCP socket that will listen).
    pub const BIND: u16 = 2;
    /// `args[0]`: backlog; `args[1]`: the families a wildcard address takes
    /// ([`super::FAM_V4`] | [`super::FAM_V6`]; 0: both, and an unbound listener
    /// listens on `0.0.0.0`; with `FAM_V6` on `[::]`).
    pub const LISTEN: u16 = 3;
    /// Result: the accepted connection's slot (its peer address is in the slot).
    pub const ACCEPT: u16 = 4;
    /// `args[0..4]`: the address. TCP: completes once the SYN is queued (the slot's
    /// `CONNECTED` or `ERROR` flag tells the outcome). UDP: fixes the peer.
    /// `args[4]` [`super::CONNECT_FASTOPEN`]: a Fast Open connect (RFC 7413, Linux's
    /// `sendto(MSG_FASTOPEN)`) whose data the client staged in the send ring; the
    /// result is how many of those bytes ride on the SYN (0 without a cookie: the SYN
    /// asks for one); the rest are dropped, for the client to send once connected.
    /// `EOPNOTSUPP` when the stack's `tcp_fastopen` has no client bit.
    /// Family [`super::AF_UNSPEC`]: Linux's disconnect. A UDP socket forgets its
    /// peer (the slot's `PEER` is cleared, `CONNECTED` drops, an address the connect
    /// chose goes back to the wildcard; the port stays); a TCP socket that never
    /// connected: 0; a connected or connecting one: `EOPNOTSUPP`.
    pub const CONNECT: u16 = 5;
    /// `args[0]`: how ([`super::SHUT_RD`], [`super::SHUT_WR`], [`super::SHUT_RDWR`]).
    pub const SHUTDOWN: u16 = 6;
    /// Bytes the client already put in the send ring still go out (TCP).
    pub const CLOSE: u16 = 7;
    /// `args[0]`: level, `args[1]`: option, `args[2]`: value.
    pub const SETSOCKOPT: u16 = 8;
    /// `args[0]`: level, `args[1]`: option. Result: the value; `TCP_INFO` fills the
    /// slot's info area instead.
    pub const GETSOCKOPT: u16 = 9;
    /// No completion: the send ring of `slot` has bytes (after `tx_armed`).
    pub const TX_KICK: u16 = 10;
    /// No completion: the receive ring of `slot` has room again (after `rx_armed`).
    pub const RX_KICK: u16 = 11;
    /// Zero-copy port (see [`super::zc`]): a listener on `args[0..4]` with backlog
    /// `args[4]`. Result 0; `aux[0]`: the listener's socket as zero-copy slots name it.
    /// `ENXIO` when the session has no zero-copy port.
    pub const ZC_LISTEN: u16 = 12;
    /// Zero-copy port: a connection to `args[0..4]`. Result 0, `aux[0]`: the socket;
    /// the outcome arrives in the port's RX ring (payload, or `SLOT_ERROR`).
    pub const ZC_CONNECT: u16 = 13;
    /// Closes the session's zero-copy port: its sockets close (what they queued
    /// still goes out) and every buffer the client held goes back. Result 0.
    pub const ZC_CLOSE: u16 = 14;
    /// The client reads shared stream `slot` and found nothing (its slot has
    /// [`crate::FLAG_NOT_RECEIVER`]): the stream comes to this slot, with the bytes
    /// the holder that received it had not read, unless that holder is copying out
    /// of its ring at this instant (then the client asks again). As on the kernel,
    /// bytes go to whoever reads. No completion.
    pub const RX_WANT: u16 = 15;
    /// A write the stack takes as Linux's `tcp_sendmsg` takes it (its send
    /// buffer's limit, `MSG_MORE`, `MSG_EOR`): the bytes of the send ring from
    /// position `args[0]` to `args[1]`, with `args[2]` the `SEND_*` flags. Bytes
    /// queued before `args[0]` go into the stack first. Result: how many of the
    /// write's bytes the stack took (0: none, the socket is not writable); the rest
    /// of them are dropped from the ring, so the client may retry them. What a
    /// socket with [`crate::FLAG_SNDBUF`] writes, and any `MSG_MORE`/`MSG_EOR` send.
    pub const SEND: u16 = 16;
    /// The oldest transmit timestamp on the error queue of `slot`
    /// ([`crate::FLAG_ERRQUEUE`], `SO_TIMESTAMPING`). Result: its `SCM_TSTAMP_*`
    /// kind; `aux[0]`: the key (`OPT_ID`) in the low 32 bits, bit 32 set when no
    /// packet comes with it (`OPT_TSONLY`), bit 33 when it has a software time;
    /// `aux[1]`: how long ago it happened, ns. `EAGAIN` when none waits.
    ///
    /// On a datagram socket: the oldest ICMP error report (`IP_RECVERR`), taken
    /// from the queue and written to the slot's [`crate::slot::ERRQ`] area;
    /// result 0. The slot's `ERROR` word becomes the next report's errno, or 0.
    pub const ERRQUEUE: u16 = 17;
    /// A datagram socket's send was refused for the path MTU: `args[0..4]` the
    /// destination, `args[4]` the errno, `args[5]` the MTU. With `IP_RECVERR`
    /// (the destination's family) a local report (`SO_EE_ORIGIN_LOCAL`) waits
    /// on the error queue, as Linux's `ip_local_error` queues one. Result 0.
    pub const LOCAL_ERROR: u16 = 18;
    /// Highest opcode.
    pub const MAX: u16 = 18;
}

/// A wildcard address takes IPv4 (an `AF_INET` socket on `0.0.0.0`, or an
/// `AF_INET6` one on `::` without `IPV6_V6ONLY`).
pub const FAM_V4: u64 = 1;
/// A wildcard address takes IPv6 (an `AF_INET6` socket on `::`).
pub const FAM_V6: u64 = 2;

/// `BIND` of a UDP socket: the address may be shared with other sockets bound
/// with it (SO_REUSEADDR/SO_REUSEPORT; multicast receivers on one port).
pub const BIND_REUSE: u64 = 1;
/// `BIND` of a TCP socket with SO_REUSEPORT: when it listens, it may share its
/// address and port with other SO_REUSEPORT listeners (a reuseport group, whose
/// members share the new connections).
pub const BIND_REUSEPORT: u64 = 2;

/// `BIND`'s `args[5]` for a socket with SO_REUSEADDR (`reuse`) and SO_REUSEPORT
/// (`reuseport`) as set: either lets it share the address, the second also
/// joins it to a reuseport group.
pub fn bind_flags(reuse: bool, reuseport: bool) -> u64 {
    let mut flags = 0;
    if reuse || reuseport {
        flags |= BIND_REUSE;
    }
    if reuseport {
        flags |= BIND_REUSEPORT;
    }
    flags
}

/// `CONNECT`'s `args[4]`: a Fast Open connect.
pub const CONNECT_FASTOPEN: u64 = 1;
/// [`op::SEND`] flags: `MSG_MORE` (more follows at once: no push, a partial
/// segment may wait) and `MSG_EOR` (the write ends a record).
pub const SEND_MORE: u64 = 1;
pub const SEND_EOR: u64 = 2;
/// [`op::SEND`] posted without waiting for its count (the write lies within
/// [`slot::TX_CREDIT`]): what the stack does not take stays in the ring for the
/// usual drain instead of being dropped.
pub const SEND_ASYNC: u64 = 4;

pub const KIND_TCP: u64 = 1;
pub const KIND_UDP: u64 = 2;
/// An ICMP echo socket (Linux's `SOCK_DGRAM` `IPPROTO_ICMP`/`IPPROTO_ICMPV6`): a
/// datagram socket whose records are whole echo messages (a request sent, a
/// reply received, from port 0) and whose port is its echo identifier.
pub const KIND_ICMP: u64 = 3;
/// A raw ICMP socket (Linux's `SOCK_RAW` `IPPROTO_ICMP`, or `IPPROTO_ICMPV6` on
/// an IPv6 one): a datagram socket of one family, its first bind's, whose
/// records are whole ICMP messages (received: a copy of every one of the family
/// to its address, an IPv4 one after its IP header; sent: as written, an IPv6
/// one's checksum computed) from port 0, and whose port is the protocol number.
pub const KIND_RAW: u64 = 4;

pub const SHUT_RD: u64 = 0;
pub const SHUT_WR: u64 = 1;
pub const SHUT_RDWR: u64 = 2;

/// Option levels and names: Linux's values.
pub mod opt {
    pub const SOL_SOCKET: u64 = 1;
    pub const IPPROTO_TCP: u64 = 6;
    pub const SO_KEEPALIVE: u64 = 9;
    pub const SO_RCVBUF: u64 = 8;
    pub const SO_SNDBUF: u64 = 7;
    pub const SO_ERROR: u64 = 4;
    pub const SO_LINGER: u64 = 13;
    pub const SO_REUSEADDR: u64 = 2;
    pub const TCP_NODELAY: u64 = 1;
    pub const TCP_MAXSEG: u64 = 2;
    /// SYN retransmissions before a connect gives up (before `connect` too).
    pub const TCP_SYNCNT: u64 = 7;
    pub const TCP_CORK: u64 = 3;
    pub const TCP_INFO: u64 = 11;
    /// With `SO_KEEPALIVE` on a connection: `args[3]` TCP_KEEPIDLE (s),
    /// `args[4]` TCP_KEEPINTVL (s), `args[5]` TCP_KEEPCNT (0: the default).
    pub const TCP_KEEPIDLE: u64 = 4;
    pub const TCP_KEEPINTVL: u64 = 5;
    pub const TCP_KEEPCNT: u64 = 6;
    /// Milliseconds, 0 for none; on a connection or a listener.
    pub const TCP_USER_TIMEOUT: u64 = 18;
    /// [`CC_CUBIC`], [`CC_RENO`] or [`CC_BBR`]; on a connection.
    pub const TCP_CONGESTION: u64 = 13;
    pub const CC_CUBIC: u64 = 0;
    pub const CC_RENO: u64 = 1;
    pub const CC_BBR: u64 = 2;
    /// Bytes per second, `u64::MAX` for none; on a connection (it paces it).
    pub const SO_MAX_PACING_RATE: u64 = 47;
    pub const TCP_NOTSENT_LOWAT: u64 = 25;
    /// `SO_TIMESTAMPING` flags (`SOF_TIMESTAMPING_*`): transmit timestamps of a
    /// connection's writes, read with [`super::op::ERRQUEUE`].
    pub const SO_TIMESTAMPING: u64 = 37;
    /// On a connection: the server keeps `slot::TX_ACKED` current (the client's
    /// `MSG_ZEROCOPY` completions). Linux's number.
    pub const SO_ZEROCOPY: u64 = 60;
    /// The Fast Open queue length on a listener (0: off).
    pub const TCP_FASTOPEN: u64 = 23;
    /// On a listener: the key its cookies are made with, `args[2]` its bytes 0..8
    /// and `args[3]` its bytes 8..16 (each little-endian); it clears a backup key.
    pub const TCP_FASTOPEN_KEY: u64 = 33;
    /// usnet's own: [`TCP_FASTOPEN_KEY`] with a backup key (Linux's 32-byte
    /// value), the backup's bytes in `args[4]` and `args[5]`.
    pub const TCP_FASTOPEN_KEYS: u64 = 0x1_0000 + 33;
    pub const IPPROTO_IP: u64 = 0;
    /// The TOS byte: on a TCP socket its DSCP bits (TCP keeps the ECN bits); on a
    /// UDP socket the whole byte of every IPv4 datagram it sends.
    pub const IP_TOS: u64 = 1;
    /// The TTL of the IPv4 unicast a socket sends: 1–255, or more than 255 for
    /// the stack's. On a UDP socket kept and applied like the multicast options.
    pub const IP_TTL: u64 = 2;
    /// On a TCP socket, the lowest TTL an IPv4 segment for it may arrive with
    /// (0–255; RFC 5082); lower ones are dropped.
    pub const IP_MINTTL: u64 = 21;
    pub const IPPROTO_IPV6: u64 = 41;
    /// On a raw ICMP socket: `args[2]`, the IPv4 types below 32 it does not
    /// receive (bit `t` blocks type `t`).
    pub const SOL_RAW: u64 = 255;
    pub const ICMP_FILTER: u64 = 1;
    /// On a raw ICMPv6 socket: the 256-bit `struct icmp6_filter` in `args[2..6]`
    /// (little-endian words; a set bit blocks its type).
    pub const IPPROTO_ICMPV6: u64 = 58;
    pub const ICMP6_FILTER: u64 = 1;
    /// 0 or 1, on a datagram socket: ICMP errors of IPv4 (`IP_RECVERR`) or
    /// IPv6 (`IPV6_RECVERR`) wait on its error queue ([`super::op::ERRQUEUE`]).
    pub const IP_RECVERR: u64 = 11;
    pub const IPV6_RECVERR: u64 = 25;
    /// As [`IP_TOS`], for IPv6's traffic class.
    pub const IPV6_TCLASS: u64 = 67;
    /// As [`IP_TTL`], for the hop limit of IPv6 unicast (0–255).
    pub const IPV6_UNICAST_HOPS: u64 = 16;
    /// On a datagram socket: IPv6 datagrams larger than this many bytes leave in
    /// fragments of at most it (0: the link's MTU; else at least 1,280).
    pub const IPV6_MTU: u64 = 24;
    /// As [`IP_MINTTL`], for IPv6's hop limit.
    pub const IPV6_MINHOPCOUNT: u64 = 73;
    // On a TCP socket the six are kept per family, as Linux keeps them: set on a
    // fresh socket they take effect at connect (the SYN) or listen, on a listener
    // for the connections it accepts from then on (their SYN-ACKs too), on a
    // connection of their family from its next packet.
    /// UDP multicast, Linux's numbers. Memberships: `args[2]` the IPv4 group
    /// (its octets as a big-endian u32), `args[3]` the interface address (ignored:
    /// one interface); IPv6: `args[2]`, `args[3]` the group's high and low 64
    /// bits (big-endian), `args[4]` the interface index (ignored). The stack's
    /// errors: `EINVAL` for a non-multicast group, `EADDRINUSE` joining twice,
    /// `EADDRNOTAVAIL` leaving a group not joined. Before the socket is bound
    /// the server keeps them and applies them when it is (bind, connect or the
    /// first send).
    pub const IP_MULTICAST_IF: u64 = 32;
    /// 0–255.
    pub const IP_MULTICAST_TTL: u64 = 33;
    /// 0 or 1.
    pub const IP_MULTICAST_LOOP: u64 = 34;
    pub const IP_ADD_MEMBERSHIP: u64 = 35;
    pub const IP_DROP_MEMBERSHIP: u64 = 36;
    /// 0 or 1; also for IPv6 ([`IPV6_MULTICAST_ALL`]): one flag per socket.
    pub const IP_MULTICAST_ALL: u64 = 49;
    /// 0–255.
    pub const IPV6_MULTICAST_HOPS: u64 = 18;
    /// 0 or 1.
    pub const IPV6_MULTICAST_LOOP: u64 = 19;
    pub const IPV6_ADD_MEMBERSHIP: u64 = 20;
    pub const IPV6_DROP_MEMBERSHIP: u64 = 21;
    pub const IPV6_MULTICAST_ALL: u64 = 29;
    /// usnet's own options.
    pub const SOL_USNET: u64 = 0x7573;
    /// Priority-aware receive: the socket's priority (an i32 on the scale of
    /// `-nice`, as i64 bits), or [`RX_PRIORITY_NONE`] to rank it by its owner again.
    /// Above the client's own priority it needs CAP_SYS_NICE (or RLIMIT_NICE), as
    /// raising a process's priority does.
    pub const USNET_RX_PRIORITY: u64 = 1;
    pub const RX_PRIORITY_NONE: u64 = u64::MAX;
    /// `GETSOCKOPT` with an address in `args[2..6]` (or none): bit 0 set when the
    /// stack's `tcp_fastopen` has its client bit, bit 1 when a Fast Open connect to
    /// the address would carry data on its SYN (a cookie is cached, or the stack
    /// sends data without one), as Linux's `TCP_FASTOPEN_CONNECT` decides whether
    /// to defer.
    pub const USNET_FASTOPEN_READY: u64 = 2;
    /// `SETSOCKOPT` on a connecting stream: a writer waits for the handshake (1) or
    /// stopped waiting (0), as Linux's `sk_write_pending`: the SYN-ACK's ACK then
    /// waits to ride on that writer's data.
    pub const USNET_WRITE_PENDING: u64 = 3;
}

// ---------------------------------------------------------------- zero-copy ports

/// A session's zero-copy port: the netmap/PASTE ring API of `usnet_stack::zerocopy`
/// for a client process. The client asks for it on the control socket
/// (`{"cmd":"zc_port","session":S,"rx_slots":N,"tx_slots":N}`, from the session's own
/// process, on a server started with `--zero-copy`) and receives two memfds: the
/// stack's packet pool (every buffer, `buf_count` × `buf_size` bytes, mapped
/// read-write: payload is read and written where it lies) and the port's own area:
///
/// ```text
/// 0          header (one page): magic, version, geometry, ring indices
/// rx_off     rx_slots × Slot (24 B)       stack → application
/// tx_off     tx_slots × Slot              application → stack
/// stash_off  stash_slots × u32            free buffers, stack → application
/// give_off   stash_slots × u32            buffers given back, application → stack
/// ```
///
/// Ownership, as netmap's: in every ring `head` is the application's and `tail`
/// the stack's, and neither writes the other's index. RX and stash: the stack fills
/// slots from `tail` on; slots `[head, tail)` are the application's, which advances
/// `head` past what it is done with. TX and give: the application fills the slot at
/// `head` and advances it; at a sync the stack takes `[tail, head)` and advances
/// `tail`. One slot of each ring always stays empty. A buffer is the application's
/// from the moment a slot hands it over (RX payload, a stash entry) until a slot
/// hands it back (RX `head` moving past it, a TX slot taken, a give entry); the
/// stack never touches it meanwhile. The stack checks everything the application
/// wrote (indices, buffers it does not hold, ranges, sockets) and refuses it.
///
/// Sync: the application publishes its indices, sets `sync` to 1, and rings the
/// server as after a request (fence, `server_asleep`, bell). The server syncs the
/// port in its next turn, and also whenever the port's sockets have news, then
/// bumps the session's client bell, on which the application sleeps.
pub mod zc {
    /// "USNETZCP" in little-endian bytes.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"USNETZCP");
    pub const VERSION: u32 = 1;
    /// Bytes of one slot: `buf: u32, off: u32, len: u32, flags: u16, pad: u16,
    /// socket: u64` (little-endian; `usnet_stack::zerocopy::Slot`).
    pub const SLOT_BYTES: usize = 24;
    /// The most slots a ring may have.
    pub const MAX_SLOTS: u32 = 1 << 16;

    /// The slot flags (one table with the sans-IO stack's vocabulary).
    pub use usnet_socket_api::zc_flags::{
        NO_BUF, SLOT_BUF_CHANGED, SLOT_CLOSE, SLOT_EOF, SLOT_ERROR, SLOT_KEEP, SLOT_MORE, SLOT_NEW,
        SLOT_SHUT_WR,
    };

    /// Header offsets.
    pub const H_MAGIC: usize = 0;
    pub const H_VERSION: usize = 8;
    pub const H_RX_SLOTS: usize = 12;
    pub const H_TX_SLOTS: usize = 16;
    pub const H_STASH_SLOTS: usize = 20;
    pub const H_BUF_SIZE: usize = 24;
    pub const H_BUF_COUNT: usize = 28;
    /// Where an application writes payload in a buffer it sends (room for headers).
    pub const H_HEADROOM: usize = 32;
    pub const H_TOTAL_LEN: usize = 40;
    /// Ring indices, each on its own line: the application's `head`, the stack's
    /// `tail`.
    pub const RX_HEAD: usize = 128;
    pub const RX_TAIL: usize = 192;
    pub const TX_HEAD: usize = 256;
    pub const TX_TAIL: usize = 320;
    pub const STASH_HEAD: usize = 384;
    pub const STASH_TAIL: usize = 448;
    pub const GIVE_HEAD: usize = 512;
    pub const GIVE_TAIL: usize = 576;
    /// Application: 1 asks the server for a sync (the server swaps it to 0).
    pub const SYNC: usize = 640;
    /// Server: slots it refused so far (bad index, buffer, range or socket).
    pub const BAD_SLOTS: usize = 704;

    /// One slot as the rings carry it (the stack's `Slot`, field by field).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Slot {
        pub buf: u32,
        pub off: u32,
        pub len: u32,
        pub flags: u16,
        pub socket: u64,
    }

    impl Slot {
        pub fn to_bytes(&self) -> [u8; SLOT_BYTES] {
            let mut b = [0u8; SLOT_BYTES];
            b[0..4].copy_from_slice(&self.buf.to_le_bytes());
            b[4..8].copy_from_slice(&self.off.to_le_bytes());
            b[8..12].copy_from_slice(&self.len.to_le_bytes());
            b[12..14].copy_from_slice(&self.flags.to_le_bytes());
            b[16..24].copy_from_slice(&self.socket.to_le_bytes());
            b
        }

        pub fn from_bytes(b: &[u8; SLOT_BYTES]) -> Slot {
            let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
            Slot {
                buf: u32_at(0),
                off: u32_at(4),
                len: u32_at(8),
                flags: u16::from_le_bytes([b[12], b[13]]),
                socket: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            }
        }
    }

    /// A port's geometry.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Geometry {
        pub rx_slots: u32,
        pub tx_slots: u32,
        pub stash_slots: u32,
    }

    /// Where a port's rings lie.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Layout {
        pub geometry: Geometry,
        pub rx_off: usize,
        pub tx_off: usize,
        pub stash_off: usize,
        pub give_off: usize,
        pub total_len: usize,
    }

    impl Layout {
        /// Every ring has 2 to [`MAX_SLOTS`] slots.
        pub fn new(g: Geometry) -> Result<Layout, super::BadGeometry> {
            let ok = |n: u32| (2..=MAX_SLOTS).contains(&n);
            if !ok(g.rx_slots) || !ok(g.tx_slots) || !ok(g.stash_slots) {
                return Err(super::BadGeometry);
            }
            let rx_off = super::PAGE;
            let tx_off = rx_off + g.rx_slots as usize * SLOT_BYTES;
            let stash_off = tx_off + g.tx_slots as usize * SLOT_BYTES;
            let give_off = stash_off + g.stash_slots as usize * 4;
            let total_len = super::page_up(give_off + g.stash_slots as usize * 4);
            Ok(Layout {
                geometry: g,
                rx_off,
                tx_off,
                stash_off,
                give_off,
                total_len,
            })
        }
    }

    // The index words of the two sides never share a line.
    const _: () = assert!(RX_TAIL - RX_HEAD >= super::CACHE_LINE);
    const _: () = assert!(BAD_SLOTS + 8 <= super::PAGE);
}

// ---------------------------------------------------------------- socket slots

pub const SLOT_SIZE: usize = 2048;

/// Offsets in a socket slot.
pub mod slot {
    /// [`super::SLOT_FREE`], [`super::SLOT_OPEN`] or [`super::SLOT_CLOSING`].
    pub const STATE: usize = 0;
    pub const KIND: usize = 4;
    /// Readiness bits, `FLAG_*`.
    pub const FLAGS: usize = 8;
    /// A pending socket error (errno), for `SO_ERROR`.
    pub const ERROR: usize = 12;
    /// Bumped on every change of the flags or the rings (edge-triggered waiters).
    pub const EVENTS: usize = 16;
    /// Connections waiting to be accepted (listeners).
    pub const ACCEPT_PENDING: usize = 20;
    /// Bumped each time the slot is given out, so stale handles are caught.
    pub const GEN: usize = 24;
    /// The client's name for the socket across `exec` (the BSD layer's tag, also
    /// stamped on the kernel socket that holds its descriptor number). Written by the client,
    /// never trusted: the server only reports it back to the same family of
    /// processes in a claim's slot map. Zero in a slot just given out.
    pub const TAG: usize = 28;
    /// A shared stream's receive ring ([`super::FLAG_SHARED`]): the client sets this
    /// word (SeqCst) around each copy out of the ring, and the server sets
    /// [`RX_STEAL`] (SeqCst) before it takes the ring's unread bytes for another
    /// holder that reads (`op::RX_WANT`). Each checks the other's word after setting
    /// its own (Dekker's handshake): at most one of them goes on, so no byte is both
    /// read here and moved.
    pub const RX_BUSY: usize = 32;
    pub const RX_STEAL: usize = 36;
    /// Client threads asleep on this socket alone (a blocking call on it), each
    /// in a futex wait on [`EVENTS`]: the server, after a (SeqCst) bump of
    /// `EVENTS`, wakes them when this is not zero (`usnet_shm::doorbell::Gate` on
    /// the two words). Threads that wait on many sockets, or on kernel
    /// descriptors too, sleep on the session's bell instead; a blocking call does
    /// not, so the server's turn does not wake every thread of a
    /// thread-per-connection program.
    pub const SLEEPERS: usize = 40;
    /// The local address ([`super::SockAddr`], 28 bytes).
    pub const LOCAL: usize = 64;
    /// The peer's address.
    pub const PEER: usize = 96;
    /// Receive ring: the server's `prod` and `rx_armed` on one line, the client's
    /// `cons` on the next.
    pub const RX_PROD: usize = 128;
    pub const RX_ARMED: usize = 136;
    pub const RX_CONS: usize = 192;
    /// The urgent mark (TCP urgent data, not inline): 1 + the receive ring position
    /// where the urgent byte was (the bytes before it end there); 0: none. The
    /// server sets it (before it publishes what follows the mark); the client's
    /// reads stop there, and it clears it (compare-and-swap) once a read passes.
    pub const RX_URG_MARK: usize = 144;
    /// The urgent byte not yet read with `MSG_OOB`: `0x100 | byte`; 0: none. The
    /// server sets it, the client takes it (swap).
    pub const RX_OOB: usize = 152;
    /// Send ring: the client's `prod`, then the server's `cons` with `tx_armed`.
    pub const TX_PROD: usize = 256;
    /// 1 + a send ring position (u64, counted as `TX_PROD`) that the server moves
    /// no byte past until it has served the request posted with the same value in
    /// its `args[3]` (then it clears the word, if unchanged); 0: none. The client
    /// sets it before posting an option that must apply to the bytes written after
    /// it (`TCP_CORK` on), so it need not wait for the answer; bytes of a closing
    /// socket ignore it. A client that never posts the request only holds its own
    /// bytes.
    pub const TX_HOLD: usize = 264;
    pub const TX_CONS: usize = 320;
    pub const TX_ARMED: usize = 328;
    /// Send ring bytes the peer has acknowledged (u64, counted as `TX_PROD` counts:
    /// from the ring's start), kept by the server for a connection with
    /// `SO_ZEROCOPY` on; `u64::MAX` once it can send no more (closed, reset).
    pub const TX_ACKED: usize = 336;
    /// A connection with [`super::FLAG_SNDBUF`]: the send ring position up to which
    /// a write would surely be taken whole by the stack (u64, counted as `TX_PROD`),
    /// so the client may post it without waiting for the count (`SEND_ASYNC`).
    pub const TX_CREDIT: usize = 344;
    /// 128 bytes the server fills on request ([`super::tcp_info`]).
    pub const INFO: usize = 384;
    pub const INFO_LEN: usize = 128;
    /// A datagram socket's error report ([`super::ErrReport`]), which the server
    /// writes in answer to [`super::op::ERRQUEUE`]; the client reads it once the
    /// completion came, before its next `ERRQUEUE` on the slot.
    pub const ERRQ: usize = 512;
    pub const ERRQ_LEN: usize = super::SLOT_SIZE - ERRQ;
}

// The counters of each side sit on separate cache lines; tcp_info fits its area.
const _: () = assert!(slot::RX_CONS - slot::RX_PROD >= CACHE_LINE);
const _: () = assert!(slot::TX_CONS - slot::TX_PROD >= CACHE_LINE);
const _: () = assert!(tcp_info::LEN <= slot::INFO_LEN);
const _: () = assert!(slot::TX_CREDIT + 8 <= slot::INFO);
const _: () = assert!(slot::RX_OOB + 4 <= slot::RX_CONS);

/// A socket a claim gave a session (the control socket's attach reply carries one
/// `[parent slot, child slot, tag, role]` per pinned socket): its slot in the session
/// that pinned it and in the claiming one, the pinning session's tag for it
/// ([`slot::TAG`]) and what it is ([`role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    pub parent_slot: u32,
    pub slot: u32,
    pub tag: u32,
    pub role: u32,
}

impl Claimed {
    /// The four words of the reply's entry.
    pub fn words(&self) -> [u32; 4] {
        [self.parent_slot, self.slot, self.tag, self.role]
    }

    /// From a reply's entry: the two slots are needed; a tag or role that is missing
    /// reads as 0 and as no role (`u32::MAX`).
    pub fn from_words(w: &[Option<u32>]) -> Option<Claimed> {
        let at = |i: usize| w.get(i).copied().flatten();
        Some(Claimed {
            parent_slot: at(0)?,
            slot: at(1)?,
            tag: at(2).unwrap_or(0),
            role: at(3).unwrap_or(u32::MAX),
        })
    }
}

/// What a socket of a claim's slot map is ([`Claimed::role`]).
pub mod role {
    /// A TCP socket before listen or connect (maybe bound).
    pub const FRESH: u32 = 0;
    pub const LISTENER: u32 = 1;
    pub const CONN: u32 = 2;
    pub const UDP: u32 = 3;
}

pub const SLOT_FREE: u32 = 0;
pub const SLOT_OPEN: u32 = 1;
/// Closed by the client; the server still sends what its send ring held.
pub const SLOT_CLOSING: u32 = 2;

/// Readable: the receive ring has bytes, or see the other flags.
pub const FLAG_CONNECTED: u32 = 1 << 0;
/// The peer closed its side: after the ring's bytes, reads return 0.
pub const FLAG_RX_EOF: u32 = 1 << 1;
/// The connection failed; `ERROR` holds the errno.
pub const FLAG_ERROR: u32 = 1 << 2;
/// The connection is over (closed, reset, timed out).
pub const FLAG_HUP: u32 = 1 << 3;
/// A listener has connections to accept.
pub const FLAG_ACCEPTABLE: u32 = 1 << 4;
/// The local side shut down writing.
pub const FLAG_WR_SHUT: u32 = 1 << 5;
/// A UDP or listening socket that is bound (local address valid).
pub const FLAG_BOUND: u32 = 1 << 6;
/// A shared stream whose received bytes go to another holder (see
/// [`op::RX_WANT`]).
pub const FLAG_NOT_RECEIVER: u32 = 1 << 7;
/// A stream other processes hold too: reads take part in the handshake of
/// [`slot::RX_BUSY`].
pub const FLAG_SHARED: u32 = 1 << 8;
/// The stack's send buffer bounds the connection's writes (the program set
/// `SO_SNDBUF` or `TCP_NOTSENT_LOWAT`, or the stack's `tcp_notsent_lowat` is
/// set): writes go through [`op::SEND`], so a write takes what Linux's would, and
/// the socket is writable when [`FLAG_WRITABLE`] says so rather than when the
/// send ring has room.
pub const FLAG_SNDBUF: u32 = 1 << 9;
/// With [`FLAG_SNDBUF`]: the stack's send buffer has room as Linux's
/// `sk_stream_is_writeable` judges (a third free, the unsent bytes below half the
/// low-water mark).
pub const FLAG_WRITABLE: u32 = 1 << 10;
/// Transmit timestamps or ICMP error reports wait on the socket's error queue
/// ([`op::ERRQUEUE`]): `POLLERR`. (A datagram socket's pending error is its
/// `ERROR` word alone, without `FLAG_ERROR`: the socket stays usable.)
pub const FLAG_ERRQUEUE: u32 = 1 << 11;
/// [`op::ERRQUEUE`]'s `aux[0]` bits.
pub const STAMP_TSONLY: u64 = 1 << 32;
pub const STAMP_TIMED: u64 = 1 << 33;

/// UDP records in a byte ring: a header ([`rec`]), the payload, padding to 8
/// bytes. A record never wraps: a producer with too little room before the ring's
/// end writes a header with `len == RECORD_PAD` to skip to the start.
pub const RECORD_HEADER: usize = 72;
pub const RECORD_PAD: u32 = u32::MAX;

/// Offsets in a UDP record's header, the same in both directions.
pub mod rec {
    /// Payload length (u32), or `RECORD_PAD`.
    pub const LEN: usize = 0;
    /// Received: the TTL or hop limit it arrived with; sent: the one to use
    /// (`IP_TTL`, `IPV6_HOPLIMIT` on `sendmsg`) when [`GIVEN`] says so (u8).
    pub const HOP_LIMIT: usize = 4;
    /// Received: the TOS byte or traffic class; sent: the one to use (`IP_TOS`,
    /// `IPV6_TCLASS` on `sendmsg`) when [`GIVEN`] says so (u8).
    pub const TOS: usize = 5;
    /// The family of the address at [`LOCAL`] (u16; 0: none).
    pub const LOCAL_FAMILY: usize = 6;
    /// The peer: received, the sender; sent, the destination (family 0: the
    /// connected peer). A `SockAddr`.
    pub const PEER: usize = 8;
    /// Our address (16 bytes, IPv4 in the first 4): received, the one the
    /// datagram was sent to (`IP_PKTINFO`'s `ipi_addr`); sent, the source to use
    /// (`ipi_spec_dst`), which must be one of the stack's.
    pub const LOCAL: usize = 36;
    /// Received: the index of the interface it came in on (u32; 0: the link has
    /// no kernel interface).
    pub const IFINDEX: usize = 52;
    /// Received over IPv4: the address a reply would come from (4 bytes,
    /// `IP_PKTINFO`'s `ipi_spec_dst`; 0.0.0.0: none).
    pub const SPEC_DST: usize = 56;
    /// Which of [`HOP_LIMIT`] and [`TOS`] hold a value (u8: [`GIVEN_HOP_LIMIT`],
    /// [`GIVEN_TOS`]; 0, as an older writer leaves it: neither, the socket's
    /// options apply).
    pub const GIVEN: usize = 60;
    pub const GIVEN_HOP_LIMIT: u8 = 1;
    pub const GIVEN_TOS: u8 = 2;
    /// Received: when the server queued it for the socket, nanoseconds since the
    /// Unix epoch on CLOCK_REALTIME (u64; 0: not known). What `SO_TIMESTAMP`,
    /// `SO_TIMESTAMPNS` and `SO_TIMESTAMPING`'s software receive stamp report.
    pub const STAMP: usize = 64;

    // The fields do not overlap and fit the header.
    const _: () = {
        assert!(PEER + super::SockAddr::LEN <= LOCAL);
        assert!(LOCAL + 16 <= IFINDEX);
        assert!(IFINDEX + 4 <= SPEC_DST);
        assert!(SPEC_DST + 4 <= GIVEN);
        assert!(GIVEN < STAMP);
        assert!(STAMP + 8 <= super::RECORD_HEADER);
    };
}

/// A UDP record's length for `payload` bytes.
pub fn record_len(payload: usize) -> usize {
    (RECORD_HEADER + payload).div_ceil(8) * 8
}

/// A UDP record's header, decoded ([`rec`] gives the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u32,
    pub peer: SockAddr,
    /// Our address: where a received datagram was sent, or the source a sent one
    /// asks for (None: the stack chooses; also for an unknown family).
    pub local: Option<std::net::IpAddr>,
    /// Received: as it arrived (always given); sent: the one to use (None: the
    /// socket's).
    pub hop_limit: Option<u8>,
    /// As `hop_limit`, for the TOS byte or traffic class.
    pub tos: Option<u8>,
    pub ifindex: u32,
    pub spec_dst: std::net::Ipv4Addr,
    /// Received: when the server queued it, ns since the Unix epoch (0: unknown).
    pub stamp_ns: u64,
}

impl Default for RecordHeader {
    fn default() -> Self {
        RecordHeader {
            len: 0,
            peer: SockAddr::default(),
            local: None,
            hop_limit: None,
            tos: None,
            ifindex: 0,
            spec_dst: std::net::Ipv4Addr::UNSPECIFIED,
            stamp_ns: 0,
        }
    }
}

impl RecordHeader {
    pub fn to_bytes(&self) -> [u8; RECORD_HEADER] {
        let mut b = [0u8; RECORD_HEADER];
        b[rec::LEN..rec::LEN + 4].copy_from_slice(&self.len.to_le_bytes());
        b[rec::HOP_LIMIT] = self.hop_limit.unwrap_or(0);
        b[rec::TOS] = self.tos.unwrap_or(0);
        let given = |v: Option<u8>, bit: u8| if v.is_some() { bit } else { 0 };
        b[rec::GIVEN] =
            given(self.hop_limit, rec::GIVEN_HOP_LIMIT) | given(self.tos, rec::GIVEN_TOS);
        // Our address as a SockAddr carries one: its family and 16 address bytes.
        let local = self
            .local
            .map(|ip| SockAddr::from_std(std::net::SocketAddr::new(ip, 0)))
            .unwrap_or_default();
        b[rec::LOCAL_FAMILY..rec::LOCAL_FAMILY + 2].copy_from_slice(&local.family.to_le_bytes());
        b[rec::PEER..rec::PEER + SockAddr::LEN].copy_from_slice(&self.peer.to_bytes());
        b[rec::LOCAL..rec::LOCAL + 16].copy_from_slice(&local.addr);
        b[rec::IFINDEX..rec::IFINDEX + 4].copy_from_slice(&self.ifindex.to_le_bytes());
        b[rec::SPEC_DST..rec::SPEC_DST + 4].copy_from_slice(&self.spec_dst.octets());
        b[rec::STAMP..rec::STAMP + 8].copy_from_slice(&self.stamp_ns.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; RECORD_HEADER]) -> RecordHeader {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let local = SockAddr {
            family: u16::from_le_bytes([b[rec::LOCAL_FAMILY], b[rec::LOCAL_FAMILY + 1]]),
            addr: b[rec::LOCAL..rec::LOCAL + 16].try_into().expect("16"),
            ..Default::default()
        }
        .to_std()
        .map(|a| a.ip());
        RecordHeader {
            len: u32_at(rec::LEN),
            peer: SockAddr::from_bytes(
                b[rec::PEER..rec::PEER + SockAddr::LEN]
                    .try_into()
                    .expect("28"),
            ),
            local,
            hop_limit: (b[rec::GIVEN] & rec::GIVEN_HOP_LIMIT != 0).then_some(b[rec::HOP_LIMIT]),
            tos: (b[rec::GIVEN] & rec::GIVEN_TOS != 0).then_some(b[rec::TOS]),
            ifindex: u32_at(rec::IFINDEX),
            spec_dst: std::net::Ipv4Addr::new(
                b[rec::SPEC_DST],
                b[rec::SPEC_DST + 1],
                b[rec::SPEC_DST + 2],
                b[rec::SPEC_DST + 3],
            ),
            stamp_ns: u64::from_le_bytes(b[rec::STAMP..rec::STAMP + 8].try_into().expect("8")),
        }
    }
}

/// An ICMP error report on a datagram socket's error queue, as the slot's
/// [`slot::ERRQ`] area carries it: Linux's `struct sock_extended_err` fields,
/// who sent the ICMP message, the quoted destination, the ICMP packet's TTL and
/// TOS, and as much of the quoted payload as fits ([`ErrReport::ROOM`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrReport {
    pub errno: u32,
    /// `SO_EE_ORIGIN_ICMP` (2) or `SO_EE_ORIGIN_ICMP6` (3).
    pub origin: u8,
    pub icmp_type: u8,
    pub code: u8,
    pub hop_limit: u8,
    /// `ee_info`: the next-hop MTU of a too-big message, else 0.
    pub info: u32,
    pub tos: u8,
    /// The quoted payload's bytes that follow the report in the area.
    pub len: u16,
    /// The quoted payload's whole length (more than `len`: the area cut it).
    pub whole: u32,
    pub offender: SockAddr,
    pub dest: SockAddr,
}

impl ErrReport {
    /// Where the quoted payload starts in the area, and how much of it fits.
    pub const PAYLOAD: usize = 80;
    pub const ROOM: usize = slot::ERRQ_LEN - Self::PAYLOAD;

    pub fn to_bytes(&self) -> [u8; Self::PAYLOAD] {
        let mut b = [0u8; Self::PAYLOAD];
        b[0..4].copy_from_slice(&self.errno.to_le_bytes());
        b[4] = self.origin;
        b[5] = self.icmp_type;
        b[6] = self.code;
        b[7] = self.hop_limit;
        b[8..12].copy_from_slice(&self.info.to_le_bytes());
        b[12] = self.tos;
        b[14..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..44].copy_from_slice(&self.offender.to_bytes());
        b[44..72].copy_from_slice(&self.dest.to_bytes());
        b[72..76].copy_from_slice(&self.whole.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; Self::PAYLOAD]) -> ErrReport {
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let addr =
            |at: usize| SockAddr::from_bytes(b[at..at + SockAddr::LEN].try_into().expect("28"));
        ErrReport {
            errno: u32_at(0),
            origin: b[4],
            icmp_type: b[5],
            code: b[6],
            hop_limit: b[7],
            info: u32_at(8),
            tos: b[12],
            len: u16::from_le_bytes([b[14], b[15]]),
            whole: u32_at(72),
            offender: addr(16),
            dest: addr(44),
        }
    }
}

/// A socket address as the ABI carries it (28 bytes, like `sockaddr_in6`):
/// family, port (host order), flow info, 16 address bytes (IPv4 in the first 4),
/// scope id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SockAddr {
    pub family: u16,
    pub port: u16,
    pub flowinfo: u32,
    pub addr: [u8; 16],
    pub scope_id: u32,
}

/// In a CONNECT: dissolve the association (`connect` to `AF_UNSPEC`).
pub const AF_UNSPEC: u16 = 0;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

impl SockAddr {
    pub const LEN: usize = 28;

    pub fn from_std(a: std::net::SocketAddr) -> SockAddr {
        match a {
            std::net::SocketAddr::V4(v4) => {
                let mut addr = [0u8; 16];
                addr[..4].copy_from_slice(&v4.ip().octets());
                SockAddr {
                    family: AF_INET,
                    port: v4.port(),
                    addr,
                    ..Default::default()
                }
            }
            std::net::SocketAddr::V6(v6) => SockAddr {
                family: AF_INET6,
                port: v6.port(),
                flowinfo: v6.flowinfo(),
                addr: v6.ip().octets(),
                scope_id: v6.scope_id(),
            },
        }
    }

    /// `None` for an unknown family.
    pub fn to_std(&self) -> Option<std::net::SocketAddr> {
        match self.family {
            AF_INET => {
                let ip: [u8; 4] = self.addr[..4].try_into().ok()?;
                Some(std::net::SocketAddr::from((ip, self.port)))
            }
            AF_INET6 => Some(std::net::SocketAddr::V6(std::net::SocketAddrV6::new(
                self.addr.into(),
                self.port,
                self.flowinfo,
                self.scope_id,
            ))),
            _ => None,
        }
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..2].copy_from_slice(&self.family.to_le_bytes());
        b[2..4].copy_from_slice(&self.port.to_le_bytes());
        b[4..8].copy_from_slice(&self.flowinfo.to_le_bytes());
        b[8..24].copy_from_slice(&self.addr);
        b[24..28].copy_from_slice(&self.scope_id.to_le_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; Self::LEN]) -> SockAddr {
        SockAddr {
            family: u16::from_le_bytes([b[0], b[1]]),
            port: u16::from_le_bytes([b[2], b[3]]),
            flowinfo: u32::from_le_bytes(b[4..8].try_into().expect("4")),
            addr: b[8..24].try_into().expect("16"),
            scope_id: u32::from_le_bytes(b[24..28].try_into().expect("4")),
        }
    }

    /// The address in four request arguments.
    pub fn to_args(&self) -> [u64; 4] {
        let b = self.to_bytes();
        let mut a = [0u64; 4];
        for (i, w) in a.iter_mut().enumerate() {
            let mut x = [0u8; 8];
            let end = (8 * i + 8).min(Self::LEN);
            x[..end - 8 * i].copy_from_slice(&b[8 * i..end]);
            *w = u64::from_le_bytes(x);
        }
        a
    }

    pub fn from_args(a: &[u64]) -> SockAddr {
        let mut b = [0u8; Self::LEN];
        for (i, w) in a.iter().take(4).enumerate() {
            let x = w.to_le_bytes();
            let end = (8 * i + 8).min(Self::LEN);
            b[8 * i..end].copy_from_slice(&x[..end - 8 * i]);
        }
        SockAddr::from_bytes(&b)
    }
}

/// The part of `tcp_info` the server writes into a slot's info area (`u32` but
/// where marked, little-endian, in this order). Times in microseconds.
pub mod tcp_info {
    pub const STATE: usize = 0;
    pub const RTT_US: usize = 4;
    pub const RTTVAR_US: usize = 8;
    pub const RTO_US: usize = 12;
    pub const SND_MSS: usize = 16;
    pub const RCV_MSS: usize = 20;
    pub const CWND: usize = 24;
    pub const SSTHRESH: usize = 28;
    pub const BYTES_IN_FLIGHT: usize = 32;
    pub const TOTAL_RETRANS: usize = 36;
    pub const SND_WND: usize = 40;
    pub const RCV_WND: usize = 44;
    pub const MIN_RTT_US: usize = 48;
    /// `tcpi_ca_state`, `tcpi_options`, the window scales (send | receive << 4) and
    /// `tcpi_backoff`, a byte each (Linux's numbering).
    pub const CA_OPTIONS: usize = 52;
    /// Segments: selectively acknowledged, lost, retransmitted in flight.
    pub const SACKED: usize = 56;
    pub const LOST: usize = 60;
    pub const RETRANS: usize = 64;
    pub const REORDERING: usize = 68;
    pub const REORD_SEEN: usize = 72;
    pub const RCV_SPACE: usize = 76;
    pub const LAST_DATA_RECV_MS: usize = 80;
    pub const DELIVERED: usize = 84;
    /// `u64`, µs: busy (data queued or unacknowledged), of that limited by the
    /// peer's window, and by the send buffer.
    pub const BUSY_US: usize = 88;
    pub const RWND_LIMITED_US: usize = 96;
    pub const SNDBUF_LIMITED_US: usize = 104;
    /// `u64`, bytes per second: the pacing rate, and the latest delivery-rate
    /// sample with bit 63 set when it was application-limited.
    pub const PACING_RATE: usize = 112;
    pub const DELIVERY_RATE: usize = 120;
    /// Bit 63 of [`DELIVERY_RATE`].
    pub const APP_LIMITED: u64 = 1 << 63;
    pub const LEN: usize = 128;
}

/// The errno values the ABI uses (Linux's), as `i64`: a completion's result is
/// one negated. The numbers are `usnet_socket_api::errno`'s, usnet's one table.
pub mod errno {
    use usnet_socket_api::errno as e;

    pub const EPERM: i64 = e::EPERM as i64;
    pub const EINTR: i64 = e::EINTR as i64;
    pub const ENXIO: i64 = e::ENXIO as i64;
    pub const EBADF: i64 = e::EBADF as i64;
    pub const EAGAIN: i64 = e::EAGAIN as i64;
    pub const ENOMEM: i64 = e::ENOMEM as i64;
    pub const EFAULT: i64 = e::EFAULT as i64;
    pub const EINVAL: i64 = e::EINVAL as i64;
    pub const EMFILE: i64 = e::EMFILE as i64;
    pub const EPIPE: i64 = e::EPIPE as i64;
    pub const ENOENT: i64 = e::ENOENT as i64;
    pub const ENOSYS: i64 = e::ENOSYS as i64;
    pub const ENOTSOCK: i64 = e::ENOTSOCK as i64;
    pub const EMSGSIZE: i64 = e::EMSGSIZE as i64;
    pub const ENOPROTOOPT: i64 = e::ENOPROTOOPT as i64;
    pub const EOPNOTSUPP: i64 = e::EOPNOTSUPP as i64;
    pub const EADDRINUSE: i64 = e::EADDRINUSE as i64;
    pub const EADDRNOTAVAIL: i64 = e::EADDRNOTAVAIL as i64;
    pub const ENETDOWN: i64 = e::ENETDOWN as i64;
    pub const ENETUNREACH: i64 = e::ENETUNREACH as i64;
    pub const ECONNABORTED: i64 = e::ECONNABORTED as i64;
    pub const ECONNRESET: i64 = e::ECONNRESET as i64;
    pub const ENOBUFS: i64 = e::ENOBUFS as i64;
    pub const EISCONN: i64 = e::EISCONN as i64;
    pub const ENOTCONN: i64 = e::ENOTCONN as i64;
    pub const ETIMEDOUT: i64 = e::ETIMEDOUT as i64;
    pub const ECONNREFUSED: i64 = e::ECONNREFUSED as i64;
    pub const EHOSTUNREACH: i64 = e::EHOSTUNREACH as i64;
    pub const EALREADY: i64 = e::EALREADY as i64;
    pub const EINPROGRESS: i64 = e::EINPROGRESS as i64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_header_round_trips_both_families_and_reads_an_unknown_local_as_none() {
        let from = "[2001:db8::7]:5353".parse().unwrap();
        let given = [
            (Some(63), Some(0xb8)),
            (None, Some(0)),
            (Some(0), None),
            (None, None),
        ];
        for (local, (hop_limit, tos)) in [
            None,
            Some("10.0.0.2".parse().unwrap()),
            Some("2001:db8::1".parse().unwrap()),
        ]
        .into_iter()
        .flat_map(|l| given.map(|g| (l, g)))
        {
            let h = RecordHeader {
                len: 1234,
                peer: SockAddr::from_std(from),
                local,
                hop_limit,
                tos,
                ifindex: 7,
                spec_dst: "10.0.0.2".parse().unwrap(),
                stamp_ns: 1_764_650_000_123_456_789,
            };
            let b = h.to_bytes();
            assert_eq!(RecordHeader::from_bytes(&b), h);
            assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 1234);
        }
        let mut b = RecordHeader::default().to_bytes();
        // An older writer's zero flags: values in the bytes are not given.
        (b[rec::HOP_LIMIT], b[rec::TOS]) = (9, 9);
        let h = RecordHeader::from_bytes(&b);
        assert_eq!((h.hop_limit, h.tos), (None, None));
        b[rec::LOCAL_FAMILY] = 99;
        b[rec::LOCAL] = 1;
        assert_eq!(RecordHeader::from_bytes(&b).local, None);
    }

    #[test]
    fn layout_is_page_aligned_and_rejects_bad_geometry() {
        let l = Layout::new(Geometry::default()).unwrap();
        for off in [l.sq_off, l.cq_off, l.slots_off, l.data_off] {
            assert_eq!(off % PAGE, 0);
        }
        assert!(l.cq_off >= l.sq_off + 256 * REQUEST_SIZE);
        assert_eq!(l.tx_data(3) - l.rx_data(3), 256 * 1024);
        assert_eq!(l.total_len, l.data_off + 256 * 2 * 256 * 1024);
        for g in [
            Geometry {
                sq_entries: 3,
                ..Default::default()
            },
            Geometry {
                ring_bytes: 1000,
                ..Default::default()
            },
            Geometry {
                max_sockets: 0,
                ..Default::default()
            },
        ] {
            assert_eq!(Layout::new(g), Err(BadGeometry));
        }
    }

    #[test]
    fn requests_completions_and_addresses_round_trip() {
        let r = Request {
            op: op::CONNECT,
            flags: 3,
            slot: 7,
            tag: 0x1122_3344_5566_7788,
            args: [1, 2, 3, 4, 5, u64::MAX],
        };
        assert_eq!(Request::from_bytes(&r.to_bytes()), r);
        let c = Completion {
            tag: 9,
            result: -errno::ECONNREFUSED,
            aux: [1, 2],
        };
        assert_eq!(Completion::from_bytes(&c.to_bytes()), c);
        for a in ["10.1.2.3:80", "[fd00::1]:443", "[fe80::1%3]:9"] {
            let sa: std::net::SocketAddr = a.parse().unwrap();
            let x = SockAddr::from_std(sa);
            assert_eq!(x.to_std(), Some(sa));
            assert_eq!(SockAddr::from_args(&x.to_args()), x);
        }
        assert_eq!(SockAddr::default().to_std(), None);
    }

    #[test]
    fn slot_words_do_not_overlap_and_fit() {
        let words = [
            (slot::STATE, 4),
            (slot::KIND, 4),
            (slot::FLAGS, 4),
            (slot::ERROR, 4),
            (slot::EVENTS, 4),
            (slot::ACCEPT_PENDING, 4),
            (slot::GEN, 4),
            (slot::TAG, 4),
            (slot::RX_BUSY, 4),
            (slot::RX_STEAL, 4),
            (slot::SLEEPERS, 4),
            (slot::LOCAL, 28),
            (slot::PEER, 28),
            (slot::RX_PROD, 8),
            (slot::RX_ARMED, 4),
            (slot::RX_CONS, 8),
            (slot::TX_PROD, 8),
            (slot::TX_CONS, 8),
            (slot::TX_ARMED, 4),
            (slot::INFO, slot::INFO_LEN),
            (slot::ERRQ, slot::ERRQ_LEN),
        ];
        for (i, &(a, al)) in words.iter().enumerate() {
            assert!(a + al <= SLOT_SIZE);
            for &(b, bl) in &words[i + 1..] {
                assert!(a + al <= b || b + bl <= a, "{a} and {b} overlap");
            }
        }
    }
}
