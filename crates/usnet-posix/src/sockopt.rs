//! The socket option table: every option name the layer knows, how Linux reads its
//! value (sizes, ranges, the errno of a bad one) and how Linux reports it back. One
//! table: usnet-posix (libusnet.so, the shim and the packetdrill backend, which
//! calls libusnet.so) applies a decoded [`Opt`] to a session's socket. Nothing here
//! needs a session.
//!
//! [`decode`] turns `setsockopt`'s bytes into an [`Opt`]; the options that take
//! effect have their own variant, the ones that are only hints to a kernel (which a
//! correct program may set and read and must not fail on) are
//! [`Opt::Recorded`], kept as [`set`] returns them and read back through [`get`].
//! The encoders ([`int`], [`timeval`], [`linger`], [`congestion_name`],
//! [`LinuxTcpInfo`]) give `getsockopt`'s bytes. The table for users is in
//! docs/preload.md.

use std::time::Duration;

use crate::{Errno, Res};

/// Linux's option numbers the `libc` crate may lack.
pub const TCP_FASTOPEN_CONNECT: i32 = 30;
pub const TCP_NOTSENT_LOWAT: i32 = 25;
pub const TCP_CC_INFO: i32 = 26;
/// `SO_MEMINFO`: nine `u32`s (`SK_MEMINFO_*`).
pub const SO_MEMINFO: i32 = 55;
pub const TCP_FASTOPEN_KEY: i32 = 33;
/// Also the `TCP_CM_INQ` cmsg type.
pub const TCP_INQ: i32 = 36;
pub const SO_INCOMING_NAPI_ID: i32 = 56;
pub const SO_TIMESTAMPING: i32 = 37;
pub const SO_PREFER_BUSY_POLL: i32 = 69;
/// `SO_TIMESTAMPING`'s flags for software receive timestamps: generate them, and
/// report software timestamps (`SCM_TIMESTAMPING`'s first `timespec`).
pub const SOF_TIMESTAMPING_RX_SOFTWARE: u32 = 1 << 3;
pub const SOF_TIMESTAMPING_SOFTWARE: u32 = 1 << 4;
/// `SOF_TIMESTAMPING_OPT_ID`, and every flag Linux 6.x knows (through
/// `OPT_RX_FILTER`).
/// `OPT_ID` (Linux's uapi values; the server checks a connection's flags with
/// `usnet_stack::tx_stamps`).
pub const SOF_TIMESTAMPING_OPT_ID: u32 = 1 << 7;
pub const SOF_TIMESTAMPING_MASK: u32 = (1 << 18) - 1;
pub const IP_BIND_ADDRESS_NO_PORT: i32 = 24;
pub const IPV6_MULTICAST_ALL: i32 = 29;
/// Raw sockets' level, and its options (`<linux/icmp.h>`, `<netinet/icmp6.h>`).
pub const SOL_RAW: i32 = 255;
pub const ICMP_FILTER: i32 = 1;
pub const ICMP6_FILTER: i32 = 1;
pub const IPV6_CHECKSUM: i32 = 7;
/// `SOCK_MIN_RCVBUF / 2`: the least TCP_WINDOW_CLAMP Linux keeps.
const MIN_WINDOW_CLAMP: i32 = 1152;

/// What kind of socket an option is set on (what Linux's per-protocol handlers see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockKind {
    /// `SOCK_STREAM` (TCP); else a datagram (UDP) socket.
    pub stream: bool,
    /// `AF_INET6`.
    pub v6: bool,
    /// `SOCK_RAW` (a raw ICMP or ICMPv6 socket).
    pub raw: bool,
}

/// A congestion control algorithm by its Linux name (`TCP_CONGESTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Congestion {
    Cubic,
    Reno,
    Bbr,
}

/// One `setsockopt`, decoded and checked as Linux checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opt {
    ReuseAddr(bool),
    ReusePort(bool),
    /// `SO_MAX_PACING_RATE`, bytes per second (`u64::MAX`: none).
    MaxPacingRate(u64),
    KeepAlive(bool),
    /// `SO_RCVBUF` as given (at least 256; Linux reports twice it).
    RcvBuf(i32),
    /// `SO_SNDBUF` as given (not negative; see [`linux_sndbuf`]).
    SndBuf(i32),
    /// `SO_RCVTIMEO` (`None`: no timeout).
    RcvTimeo(Option<Duration>),
    SndTimeo(Option<Duration>),
    /// `SO_LINGER` (`None`: off).
    Linger(Option<Duration>),
    ZeroCopy(bool),
    /// `SO_TIMESTAMPING` flags.
    Timestamping(u32),
    /// `SO_BINDTODEVICE`: the name without its NUL (empty: unbind).
    BindToDevice(Vec<u8>),
    NoDelay(bool),
    Cork(bool),
    /// `TCP_KEEPIDLE` (0), `TCP_KEEPINTVL` (1), `TCP_KEEPCNT` (2) and its value.
    Keep(usize, u32),
    /// `TCP_USER_TIMEOUT`, ms (0: none).
    UserTimeout(u32),
    /// `TCP_MAXSEG` (`None`: cleared).
    MaxSeg(Option<u16>),
    SynCount(u32),
    Congestion(Congestion),
    /// `TCP_NOTSENT_LOWAT` (0: the sysctl's).
    NotsentLowat(u32),
    /// `TCP_FASTOPEN`: the queue length.
    FastOpen(u32),
    FastOpenConnect(bool),
    /// `TCP_FASTOPEN_KEY`: the primary key and, from a 32-byte value, a backup.
    FastOpenKey([u8; 16], Option<[u8; 16]>),
    Inq(bool),
    /// `IP_TOS` without the ECN bits on a stream (TCP keeps those, as Linux).
    Tos(u8),
    /// `IPV6_TCLASS` (-1 is the default, 0).
    TrafficClass(u8),
    /// `IPV6_MTU`: the size IPv6 datagrams fragment at (0: the link's MTU).
    FragSizeV6(u32),
    V6Only(bool),
    /// `IP_MULTICAST_IF`: the interface address (from an `in_addr` or `ip_mreqn`).
    MulticastIf([u8; 4]),
    /// A multicast join or leave and its key (see [`membership`]).
    Membership {
        join: bool,
        key: Vec<u8>,
    },
    /// `ICMP_FILTER` (word 0) or `ICMP6_FILTER` on a raw socket: the types it
    /// does not receive.
    IcmpFilter([u32; 8]),
    /// An option only recorded: the value to keep (see [`set`]).
    Recorded {
        level: i32,
        name: i32,
        kept: i32,
    },
}

/// Decodes `setsockopt(level, name, value)` on a socket of `kind` as Linux reads it:
/// `ENOPROTOOPT` for an option Linux does not have there, `EINVAL` (or `EDOM` for
/// a bad timeval) for a bad value. Options of usnet's own level are not here.
pub fn decode(level: i32, name: i32, value: &[u8], kind: SockKind) -> Res<Opt> {
    let SockKind {
        stream: tcp,
        v6,
        raw,
    } = kind;
    let bool_ = || int(value).map(|v| v != 0);
    Ok(match (level, name) {
        // Linux copies what it is given, up to the filter's size.
        (SOL_RAW, ICMP_FILTER) if raw && !v6 => Opt::IcmpFilter(icmp_filter(value, 1)),
        (libc::IPPROTO_ICMPV6, ICMP6_FILTER) if raw && v6 => Opt::IcmpFilter(icmp_filter(value, 8)),
        // An ICMPv6 socket's checksum is always the stack's, at offset 2 (RFC
        // 3542 §3.1 forbids the option at IPPROTO_IPV6; Linux's own SOL_RAW one
        // moves it, which the stack does not: that offset alone).
        (libc::IPPROTO_IPV6, IPV6_CHECKSUM) if raw && v6 => return Err(einval()),
        (SOL_RAW, IPV6_CHECKSUM) if raw && v6 => match int(value)? {
            2 => Opt::Recorded {
                level,
                name,
                kept: 2,
            },
            _ => return Err(einval()),
        },
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => Opt::ReuseAddr(bool_()?),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => Opt::ReusePort(bool_()?),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => Opt::KeepAlive(bool_()?),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => Opt::RcvBuf(int(value)?.max(256)),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => Opt::SndBuf(int(value)?.max(0)),
        // Past the sysctl's cap, for a process with CAP_NET_ADMIN (EPERM for
        // others, who then set the plain option, as systemd's daemons do).
        (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE | libc::SO_SNDBUFFORCE) => {
            let v = int(value)?;
            if !net_admin() {
                return Err(Errno(libc::EPERM));
            }
            match name {
                libc::SO_RCVBUFFORCE => Opt::RcvBuf(v.max(256)),
                _ => Opt::SndBuf(v.max(0)),
            }
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => Opt::RcvTimeo(timeval_value(value)?),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => Opt::SndTimeo(timeval_value(value)?),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if value.len() < std::mem::size_of::<libc::linger>() {
                return Err(einval());
            }
            // SAFETY: length checked; read_unaligned copes with any alignment.
            let l = unsafe { std::ptr::read_unaligned(value.as_ptr() as *const libc::linger) };
            Opt::Linger((l.l_onoff != 0).then(|| Duration::from_secs(l.l_linger.max(0) as u64)))
        }
        (libc::SOL_SOCKET, libc::SO_ZEROCOPY) => Opt::ZeroCopy(bool_()?),
        // Linux reads a u64 when given 8 bytes, else a u32 (whose ~0U is none too).
        (libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE) => Opt::MaxPacingRate(match value.len() {
            n if n >= 8 => u64::from_ne_bytes(value[..8].try_into().expect("8 bytes")),
            _ => match int(value)? as u32 {
                u32::MAX => u64::MAX,
                v => u64::from(v),
            },
        }),
        (libc::SOL_SOCKET, SO_TIMESTAMPING) => Opt::Timestamping(int(value)? as u32),
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => {
            let n = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            if n >= libc::IFNAMSIZ {
                return Err(einval());
            }
            Opt::BindToDevice(value[..n].to_vec())
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) if tcp => Opt::NoDelay(bool_()?),
        (libc::IPPROTO_TCP, libc::TCP_CORK) if tcp => Opt::Cork(bool_()?),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE | libc::TCP_KEEPINTVL | libc::TCP_KEEPCNT)
            if tcp =>
        {
            // Linux's limits: 1..=32767 s, 1..=127 probes.
            let v = int(value)?;
            let max = if name == libc::TCP_KEEPCNT {
                127
            } else {
                32767
            };
            if !(1..=max).contains(&v) {
                return Err(einval());
            }
            Opt::Keep((name - libc::TCP_KEEPIDLE) as usize, v as u32)
        }
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) if tcp => {
            let v = int(value)?;
            if v < 0 {
                return Err(einval());
            }
            Opt::UserTimeout(v as u32)
        }
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) if tcp => match int(value)? {
            // 0 clears it; otherwise TCP_MIN_MSS (88) up to MAX_TCP_WINDOW.
            0 => Opt::MaxSeg(None),
            v @ 88..=32767 => Opt::MaxSeg(Some(v as u16)),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_TCP, libc::TCP_SYNCNT) if tcp => match int(value)? {
            v @ 1..=127 => Opt::SynCount(v as u32),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION) if tcp => {
            let n = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            Opt::Congestion(match &value[..n] {
                b"cubic" => Congestion::Cubic,
                b"reno" => Congestion::Reno,
                b"bbr" => Congestion::Bbr,
                _ => return Err(Errno(libc::ENOENT)),
            })
        }
        (libc::IPPROTO_TCP, TCP_NOTSENT_LOWAT) if tcp => Opt::NotsentLowat(int(value)? as u32),
        (libc::IPPROTO_TCP, libc::TCP_FASTOPEN) if tcp => match int(value)? {
            v if v >= 0 => Opt::FastOpen(v as u32),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_TCP, TCP_FASTOPEN_CONNECT) if tcp => match int(value)? {
            v @ 0..=1 => Opt::FastOpenConnect(v == 1),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_TCP, TCP_FASTOPEN_KEY) if tcp => {
            // A primary key, or a primary and a backup.
            if value.len() != 16 && value.len() != 32 {
                return Err(einval());
            }
            let key = |b: &[u8]| -> [u8; 16] { b.try_into().expect("16 bytes") };
            Opt::FastOpenKey(
                key(&value[..16]),
                (value.len() == 32).then(|| key(&value[16..])),
            )
        }
        (libc::IPPROTO_TCP, TCP_INQ) if tcp => Opt::Inq(bool_()?),
        (libc::IPPROTO_IP, libc::IP_TOS) => {
            let v = int_value(level, value)? as u8;
            Opt::Tos(if tcp { v & !3 } else { v })
        }
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) if v6 => match int(value)? {
            -1 => Opt::TrafficClass(0),
            v @ 0..=255 => Opt::TrafficClass(v as u8),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) if v6 => Opt::V6Only(bool_()?),
        // Linux's `frag_size`: 0, or at least IPV6_MIN_MTU.
        (libc::IPPROTO_IPV6, libc::IPV6_MTU) if v6 => match int(value)? {
            v if v == 0 || v >= 1280 => Opt::FragSizeV6(v as u32),
            _ => return Err(einval()),
        },
        (libc::IPPROTO_IP, libc::IP_MULTICAST_IF) => {
            if tcp {
                return Err(einval());
            }
            // An in_addr, or an ip_mreqn whose address is the second field.
            let a = match value.len() {
                4..=7 => &value[..4],
                n if n >= 8 => &value[4..8],
                _ => return Err(einval()),
            };
            Opt::MulticastIf([a[0], a[1], a[2], a[3]])
        }
        _ => match membership(level, name, value)? {
            Some(_) if tcp && level == libc::IPPROTO_IP => return Err(Errno(libc::EPROTO)),
            Some(_) if level == libc::IPPROTO_IPV6 && !v6 => return Err(Errno(libc::ENOPROTOOPT)),
            Some((join, key)) => Opt::Membership { join, key },
            None => {
                // Look the name up first: an unknown option is ENOPROTOOPT whatever
                // its value.
                entry(level, name, tcp, v6)?;
                let v = int_value(level, value)?;
                Opt::Recorded {
                    level,
                    name,
                    kept: set(level, name, v, tcp, v6)?,
                }
            }
        },
    })
}

/// The first `words` words of an ICMP filter from `value` (shorter: the rest 0).
fn icmp_filter(value: &[u8], words: usize) -> [u32; 8] {
    let mut f = [0u32; 8];
    for (w, b) in f[..words].iter_mut().zip(value.chunks(4)) {
        let mut word = [0u8; 4];
        word[..b.len()].copy_from_slice(b);
        *w = u32::from_ne_bytes(word);
    }
    f
}

/// An `int` option's value (at least four bytes, as Linux's `copy_from_sockptr`).
pub fn int(v: &[u8]) -> Res<i32> {
    if v.len() < 4 {
        return Err(einval());
    }
    Ok(i32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
}

/// A `struct timeval` option (`SO_RCVTIMEO`/`SO_SNDTIMEO`); zero is none, an
/// out-of-range one `EDOM` as Linux's `sock_set_timeout`.
pub fn timeval_value(v: &[u8]) -> Res<Option<Duration>> {
    if v.len() < std::mem::size_of::<libc::timeval>() {
        return Err(einval());
    }
    // SAFETY: length checked; read_unaligned copes with any alignment.
    let tv = unsafe { std::ptr::read_unaligned(v.as_ptr() as *const libc::timeval) };
    if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
        return Err(Errno(libc::EDOM));
    }
    let d = Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    Ok((!d.is_zero()).then_some(d))
}

/// `getsockopt`'s bytes of an `int` option.
pub fn int_bytes(v: i32) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

/// `getsockopt`'s bytes of a timeout (`None`: zero).
pub fn timeval(d: Option<Duration>) -> Vec<u8> {
    let d = d.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: timeval is plain data; viewing it as bytes is sound.
    unsafe {
        std::slice::from_raw_parts(&tv as *const _ as *const u8, std::mem::size_of_val(&tv))
            .to_vec()
    }
}

/// `getsockopt(SO_LINGER)`'s `struct linger`.
pub fn linger(l: Option<Duration>) -> Vec<u8> {
    let on = l.is_some() as i32;
    let secs = l.map_or(0, |d| d.as_secs() as i32);
    on.to_ne_bytes()
        .into_iter()
        .chain(secs.to_ne_bytes())
        .collect()
}

/// `getsockopt(TCP_CONGESTION)`: the name in Linux's `TCP_CA_NAME_MAX` bytes,
/// NUL-padded.
pub fn congestion_name(c: Congestion) -> Vec<u8> {
    let mut b = match c {
        Congestion::Cubic => b"cubic".to_vec(),
        Congestion::Reno => b"reno".to_vec(),
        Congestion::Bbr => b"bbr".to_vec(),
    };
    b.resize(16, 0);
    b
}

/// What Linux's `SO_SNDBUF` reports for a value set: twice it (its bookkeeping
/// overhead), at least `SOCK_MIN_SNDBUF` (4608). The stack applies the same
/// (`usnet_stack::sndbuf_for_option`).
pub fn linux_sndbuf(v: i32) -> i32 {
    (i64::from(v.max(0)) * 2).clamp(4608, i64::from(i32::MAX)) as i32
}

/// Recorded options an accepted socket does not inherit from its listener (every
/// other option it does, as Linux's children copy the listener's socket):
/// TCP_DEFER_ACCEPT and TCP_FASTOPEN are the listener's own, TCP_QUICKACK starts on.
pub const NOT_INHERITED: [(i32, i32); 4] = [
    (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT),
    (libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
    (libc::IPPROTO_TCP, TCP_FASTOPEN_CONNECT),
    (libc::IPPROTO_TCP, libc::TCP_QUICKACK),
];

/// Linux's `tcpi_state` numbers (`include/net/tcp_states.h`).
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 1;
    pub const SYN_SENT: u8 = 2;
    pub const SYN_RECV: u8 = 3;
    pub const FIN_WAIT1: u8 = 4;
    pub const FIN_WAIT2: u8 = 5;
    pub const TIME_WAIT: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
    pub const LAST_ACK: u8 = 9;
    pub const LISTEN: u8 = 10;
    pub const CLOSING: u8 = 11;
}

/// `tcpi_options` bits.
pub mod tcpi_opt {
    pub const TIMESTAMPS: u8 = 1;
    pub const SACK: u8 = 2;
    pub const WSCALE: u8 = 4;
    pub const ECN: u8 = 8;
    pub const ECN_SEEN: u8 = 16;
    pub const SYN_DATA: u8 = 32;
}

/// `tcpi_snd_ssthresh` before any congestion event (`TCP_INFINITE_SSTHRESH`).
pub const TCP_INFINITE_SSTHRESH: u32 = 0x7fff_ffff;

/// The size of Linux's `struct tcp_info` (6.x, through `tcpi_options2`) that
/// `getsockopt(TCP_INFO)` answers with; a shorter buffer gets the first bytes.
pub const TCP_INFO_LEN: usize = 280;

/// Linux's `struct tcp_info` (`include/uapi/linux/tcp.h`): windows and thresholds
/// in segments, times in µs (`last_data_recv_ms` in ms). What a layer does not know
/// stays 0. [`LinuxTcpInfo::to_bytes`] lays it out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinuxTcpInfo {
    /// [`tcp_state`].
    pub state: u8,
    /// Open (0), Disorder (1), CWR (2), Recovery (3), Loss (4).
    pub ca_state: u8,
    pub backoff: u8,
    /// [`tcpi_opt`] bits.
    pub options: u8,
    /// Window scales, send and receive (`tcpi_opt::WSCALE` says they count).
    pub wscale: (u8, u8),
    pub rto_us: u32,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub unacked: u32,
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub last_data_recv_ms: u32,
    pub rtt_us: u32,
    pub rttvar_us: u32,
    /// Segments, or [`TCP_INFINITE_SSTHRESH`].
    pub snd_ssthresh: u32,
    pub snd_cwnd: u32,
    pub advmss: u32,
    pub reordering: u32,
    pub rcv_space: u32,
    pub total_retrans: u32,
    /// `u32::MAX` when there is no sample (as Linux's `~0U`).
    pub min_rtt_us: u32,
    pub busy_time_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    pub delivered: u32,
    pub reord_seen: u32,
    pub snd_wnd: u32,
    pub rcv_wnd: u32,
    /// Bytes per second; `max_pacing_rate` is `u64::MAX` when none is set.
    pub pacing_rate: u64,
    pub max_pacing_rate: u64,
    pub delivery_rate: u64,
    pub delivery_rate_app_limited: bool,
}

impl LinuxTcpInfo {
    /// A socket with no connection: Linux's zeroed `tcp_info` with the state
    /// (`CLOSE`, or `LISTEN` for a listener).
    pub fn unconnected(listening: bool) -> LinuxTcpInfo {
        LinuxTcpInfo {
            state: if listening {
                tcp_state::LISTEN
            } else {
                tcp_state::CLOSE
            },
            ..Default::default()
        }
    }

    /// The segment counts Linux reports for a window of `bytes` with this MSS, and
    /// the threshold (`u32::MAX` bytes: never reduced).
    pub fn segments(bytes: u32, mss: u32) -> u32 {
        bytes / mss.max(1)
    }

    /// `snd_ssthresh` for a threshold of `bytes` (`u32::MAX`: never reduced).
    pub fn ssthresh_segments(bytes: u32, mss: u32) -> u32 {
        if bytes == u32::MAX {
            TCP_INFINITE_SSTHRESH
        } else {
            bytes / mss.max(1)
        }
    }

    /// The [`TCP_INFO_LEN`] bytes of Linux's layout.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; TCP_INFO_LEN];
        let mut put32 = |off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put32(8, self.rto_us);
        put32(16, self.snd_mss);
        put32(20, self.rcv_mss);
        put32(24, self.unacked);
        put32(28, self.sacked);
        put32(32, self.lost);
        put32(36, self.retrans);
        put32(52, self.last_data_recv_ms);
        put32(68, self.rtt_us);
        put32(72, self.rttvar_us);
        put32(76, self.snd_ssthresh);
        put32(80, self.snd_cwnd);
        put32(84, self.advmss);
        put32(88, self.reordering);
        put32(96, self.rcv_space);
        put32(100, self.total_retrans);
        put32(148, self.min_rtt_us);
        put32(192, self.delivered);
        put32(220, self.reord_seen);
        put32(228, self.snd_wnd);
        put32(232, self.rcv_wnd);
        let mut put64 = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        put64(168, self.busy_time_us);
        put64(176, self.rwnd_limited_us);
        put64(184, self.sndbuf_limited_us);
        put64(104, self.pacing_rate);
        put64(112, self.max_pacing_rate);
        put64(160, self.delivery_rate);
        b[0] = self.state;
        b[1] = self.ca_state;
        b[4] = self.backoff;
        b[5] = self.options;
        // The byte after the window scales: `tcpi_delivery_rate_app_limited:1`.
        b[7] = u8::from(self.delivery_rate_app_limited);
        if self.options & tcpi_opt::WSCALE != 0 {
            b[6] = (self.wscale.0 & 0xf) | ((self.wscale.1 & 0xf) << 4);
        }
        b
    }
}

fn einval() -> Errno {
    Errno(libc::EINVAL)
}

/// How one recorded option reads and writes.
#[derive(Clone, Copy)]
enum Kind {
    /// Any value; reported as 0 or 1.
    Bool,
    /// Any value, reported as set.
    Int,
    /// `-1` (the default) or `lo..=hi`, else EINVAL.
    Ranged(i32, i32),
    /// `lo..=hi`, else EINVAL.
    Strict(i32, i32),
    /// TCP_DEFER_ACCEPT: seconds, kept as SYN-ACK retransmissions as Linux does
    /// (so 5 reads back as 7).
    DeferAccept,
    /// TCP_WINDOW_CLAMP: 0, or at least half of SOCK_MIN_RCVBUF.
    WindowClamp,
    /// SO_RCVLOWAT: negative is INT_MAX, 0 is 1.
    RcvLowat,
    /// Read-only.
    ReadOnly,
}

/// Whether this process has CAP_NET_ADMIN in its effective set (bit 12 of
/// `/proc/self/status`'s `CapEff`), as `sockopt_capable` asks.
fn net_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
            u64::from_str_radix(hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 12) != 0)
}

/// `(default, kind)` of a recorded option on a socket of this type and family;
/// `Err` is what Linux answers when the option does not apply (ENOPROTOOPT).
fn entry(level: i32, name: i32, stream: bool, v6: bool) -> Res<(i32, Kind)> {
    use Kind::*;
    let none = Err(Errno(libc::ENOPROTOOPT));
    Ok(match level {
        libc::SOL_SOCKET => match name {
            libc::SO_RCVLOWAT => (1, RcvLowat),
            libc::SO_BROADCAST => (0, Bool),
            libc::SO_PRIORITY => (0, Int),
            libc::SO_MARK => (0, Int),
            libc::SO_INCOMING_CPU => (-1, Int),
            SO_INCOMING_NAPI_ID => (0, ReadOnly),
            // Receive timestamps: effect on UDP (`recvmsg`'s SCM_TIMESTAMP,
            // SCM_TIMESTAMPNS); one clears the other as on Linux (the layer).
            libc::SO_TIMESTAMP => (0, Bool),
            libc::SO_TIMESTAMPNS => (0, Bool),
            // Hints to a kernel's device or socket code: recorded.
            libc::SO_DONTROUTE => (0, Bool),
            libc::SO_OOBINLINE => (0, Bool),
            libc::SO_NO_CHECK => (0, Bool),
            libc::SO_RXQ_OVFL => (0, Bool),
            libc::SO_WIFI_STATUS => (0, Bool),
            libc::SO_SELECT_ERR_QUEUE => (0, Bool),
            libc::SO_BUSY_POLL => (0, Strict(0, i32::MAX)),
            SO_PREFER_BUSY_POLL => (0, Bool),
            _ => return none,
        },
        libc::IPPROTO_TCP if stream => match name {
            libc::TCP_QUICKACK => (1, Bool),
            libc::TCP_DEFER_ACCEPT => (0, DeferAccept),
            libc::TCP_FASTOPEN => (0, Strict(0, i32::MAX)),
            TCP_FASTOPEN_CONNECT => (0, Strict(0, 1)),
            libc::TCP_WINDOW_CLAMP => (0, WindowClamp),
            // The sysctl's default, net.ipv4.tcp_syn_retries.
            libc::TCP_SYNCNT => (6, Strict(1, 127)),
            _ => return none,
        },
        libc::IPPROTO_IP => match name {
            libc::IP_TTL => (64, Ranged(1, 255)),
            // Effect on TCP (the stack drops segments below it), as Linux's.
            libc::IP_MINTTL => (0, Strict(0, 255)),
            libc::IP_RECVERR => (0, Bool),
            libc::IP_PKTINFO => (0, Bool),
            libc::IP_RECVTTL => (0, Bool),
            libc::IP_RECVTOS => (0, Bool),
            // Received packets' IP options as control messages: none comes, as
            // from Linux for a packet without options (the stack sends none).
            libc::IP_RECVOPTS => (0, Bool),
            libc::IP_RETOPTS => (0, Bool),
            libc::IP_MTU_DISCOVER => (1, Strict(0, 5)),
            libc::IP_FREEBIND => (0, Bool),
            IP_BIND_ADDRESS_NO_PORT => (0, Bool),
            libc::IP_MULTICAST_TTL => (1, Ranged(0, 255)),
            libc::IP_MULTICAST_LOOP => (1, Bool),
            libc::IP_MULTICAST_ALL => (1, Strict(0, 1)),
            _ => return none,
        },
        libc::IPPROTO_IPV6 if v6 => match name {
            libc::IPV6_UNICAST_HOPS => (64, Ranged(0, 255)),
            libc::IPV6_MINHOPCOUNT => (0, Strict(0, 255)),
            libc::IPV6_RECVERR => (0, Bool),
            libc::IPV6_RECVPKTINFO => (0, Bool),
            libc::IPV6_RECVHOPLIMIT => (0, Bool),
            // RFC 2292's name for it (tracepath asks with it), reported as
            // a control message of its own number.
            libc::IPV6_2292HOPLIMIT => (0, Bool),
            libc::IPV6_RECVTCLASS => (0, Bool),
            libc::IPV6_MTU_DISCOVER => (1, Strict(0, 5)),
            libc::IPV6_MULTICAST_LOOP => (1, Strict(0, 1)),
            libc::IPV6_MULTICAST_HOPS => (1, Ranged(0, 255)),
            libc::IPV6_MULTICAST_IF => (0, Int),
            IPV6_MULTICAST_ALL => (1, Bool),
            _ => return none,
        },
        _ => return none,
    })
}

/// The value to keep for a recorded option set to `v`.
pub fn set(level: i32, name: i32, v: i32, stream: bool, v6: bool) -> Res<i32> {
    let (default, kind) = entry(level, name, stream, v6)?;
    // Multicast sending options a stream reads but does not take.
    match (level, name) {
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL) if stream => return Err(einval()),
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS | libc::IPV6_MULTICAST_IF) if stream => {
            return Err(Errno(libc::ENOPROTOOPT))
        }
        _ => {}
    }
    Ok(match kind {
        Kind::Bool => (v != 0) as i32,
        Kind::Int => v,
        Kind::Ranged(lo, hi) => match v {
            -1 => default,
            _ if (lo..=hi).contains(&v) => v,
            _ => return Err(einval()),
        },
        Kind::Strict(lo, hi) if (lo..=hi).contains(&v) => v,
        Kind::Strict(..) => return Err(einval()),
        Kind::DeferAccept => secs_to_retrans(v),
        Kind::WindowClamp if v == 0 => 0,
        Kind::WindowClamp => v.max(MIN_WINDOW_CLAMP),
        Kind::RcvLowat if v < 0 => i32::MAX,
        Kind::RcvLowat => v.max(1),
        Kind::ReadOnly => return Err(Errno(libc::ENOPROTOOPT)),
    })
}

/// What a recorded option reads: `kept` (as [`set`] returned it) or its default.
pub fn get(level: i32, name: i32, kept: Option<i32>, stream: bool, v6: bool) -> Res<i32> {
    let (default, kind) = entry(level, name, stream, v6)?;
    let v = kept.unwrap_or(default);
    Ok(match kind {
        Kind::DeferAccept => retrans_to_secs(v),
        _ => v,
    })
}

/// Linux's `secs_to_retrans` with TCP_TIMEOUT_INIT 1 s and TCP_RTO_MAX 120 s.
fn secs_to_retrans(secs: i32) -> i32 {
    if secs <= 0 {
        return 0;
    }
    let (mut timeout, mut period, mut res) = (1, 1, 1);
    while secs > period && res < 255 {
        res += 1;
        timeout = (timeout * 2).min(120);
        period += timeout;
    }
    res
}

/// Linux's `retrans_to_secs`.
fn retrans_to_secs(retrans: i32) -> i32 {
    if retrans <= 0 {
        return 0;
    }
    let (mut timeout, mut period) = (1, 1);
    for _ in 1..retrans {
        timeout = (timeout * 2).min(120);
        period += timeout;
    }
    period
}

/// The errno of a `getsockopt` at a level the socket has no such option at:
/// Linux's IPv4 sockets say EOPNOTSUPP for a level they do not know (a TCP level
/// on a UDP socket, IPv6 on an AF_INET socket), IPv6 sockets ENOPROTOOPT.
pub fn get_level_errno(level: i32, stream: bool, v6: bool) -> Errno {
    let known = match level {
        libc::SOL_SOCKET | libc::IPPROTO_IP => true,
        libc::IPPROTO_TCP => stream,
        libc::IPPROTO_UDP => !stream,
        libc::IPPROTO_IPV6 => v6,
        _ => false,
    };
    Errno(if known || v6 {
        libc::ENOPROTOOPT
    } else {
        libc::EOPNOTSUPP
    })
}

/// An option's integer: an `int`, or for the IP level a single byte as Linux
/// takes it.
pub fn int_value(level: i32, v: &[u8]) -> Res<i32> {
    match v.len() {
        n if n >= 4 => Ok(i32::from_ne_bytes([v[0], v[1], v[2], v[3]])),
        1..=3 if level == libc::IPPROTO_IP => Ok(i32::from(v[0])),
        _ => Err(einval()),
    }
}

/// A multicast membership (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP` and their
/// drops): the group and the interface as given (the key `setsockopt` records and
/// carries to the stack, which joins the group on its one interface and tells
/// the link with IGMPv2/MLDv2).
pub fn membership(level: i32, name: i32, v: &[u8]) -> Res<Option<(bool, Vec<u8>)>> {
    if let (
        libc::IPPROTO_IP | libc::IPPROTO_IPV6,
        libc::MCAST_JOIN_GROUP | libc::MCAST_LEAVE_GROUP,
    ) = (level, name)
    {
        return group_req(level, name == libc::MCAST_JOIN_GROUP, v).map(Some);
    }
    let join = match (level, name) {
        (libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP) => true,
        (libc::IPPROTO_IP, libc::IP_DROP_MEMBERSHIP) => false,
        (libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP) => true,
        (libc::IPPROTO_IPV6, libc::IPV6_DROP_MEMBERSHIP) => false,
        _ => return Ok(None),
    };
    let key = if level == libc::IPPROTO_IP {
        // ip_mreq (group, interface address) or ip_mreqn (…, ifindex).
        if v.len() < 8 {
            return Err(einval());
        }
        if v[0] & 0xf0 != 0xe0 {
            return Err(einval());
        }
        v[..v.len().min(12)].to_vec()
    } else {
        // ipv6_mreq: group, ifindex.
        if v.len() < 20 {
            return Err(einval());
        }
        if v[0] != 0xff {
            return Err(einval());
        }
        v[..20].to_vec()
    };
    Ok(Some((join, key)))
}

/// `MCAST_JOIN_GROUP` / `MCAST_LEAVE_GROUP` (RFC 3678's protocol-independent
/// API: a `group_req`, the interface index then the group as a
/// `sockaddr_storage`), keyed as the family's own option would be (`ip_mreqn`,
/// `ipv6_mreq`), with Linux's errors (`ip_mcast_join_leave`,
/// `ipv6_mcast_join_leave`): a group of the other family is EINVAL at the IP
/// level, EADDRNOTAVAIL at the IPv6 one.
fn group_req(level: i32, join: bool, v: &[u8]) -> Res<(bool, Vec<u8>)> {
    const GROUP: usize = 8; // gr_group, after gr_interface and its padding
    if v.len() < GROUP + std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(einval());
    }
    let ifindex = [v[0], v[1], v[2], v[3]];
    let family = i32::from(u16::from_ne_bytes([v[GROUP], v[GROUP + 1]]));
    let key = if level == libc::IPPROTO_IP {
        if family != libc::AF_INET {
            return Err(einval());
        }
        let group = &v[GROUP + 4..GROUP + 8];
        if group[0] & 0xf0 != 0xe0 {
            return Err(einval());
        }
        [group, &[0; 4], &ifindex].concat()
    } else {
        if family != libc::AF_INET6 {
            return Err(Errno(libc::EADDRNOTAVAIL));
        }
        let group = &v[GROUP + 8..GROUP + 24];
        if group[0] != 0xff {
            return Err(einval());
        }
        [group, &ifindex].concat()
    };
    Ok((join, key))
}

/// The group a membership key names: a socket has one membership per group,
/// however the interface was given (the stack has one).
pub fn membership_group(key: &[u8]) -> &[u8] {
    if key.len() == 20 && key[0] == 0xff {
        &key[..16]
    } else {
        &key[..4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP4: SockKind = SockKind {
        stream: true,
        v6: false,
        raw: false,
    };
    const UDP6: SockKind = SockKind {
        stream: false,
        v6: true,
        raw: false,
    };
    const RAW4: SockKind = SockKind {
        stream: false,
        v6: false,
        raw: true,
    };
    const RAW6: SockKind = SockKind {
        stream: false,
        v6: true,
        raw: true,
    };

    #[test]
    fn icmp_filters_are_a_raw_sockets_alone_and_ipv6_sums_are_the_stacks() {
        let Ok(Opt::IcmpFilter(f)) = decode(SOL_RAW, ICMP_FILTER, &i(1 << 3), RAW4) else {
            panic!("ICMP_FILTER on a raw socket");
        };
        assert_eq!(f, [8, 0, 0, 0, 0, 0, 0, 0]);
        let mut six = [0u8; 32];
        six[16] = 0xff;
        let Ok(Opt::IcmpFilter(f)) = decode(libc::IPPROTO_ICMPV6, ICMP6_FILTER, &six, RAW6) else {
            panic!("ICMP6_FILTER on a raw ICMPv6 socket");
        };
        assert_eq!(f[4], 0xff);
        assert!(matches!(
            decode(SOL_RAW, ICMP_FILTER, &i(1), UDP6),
            Err(Errno(libc::ENOPROTOOPT))
        ));
        assert!(matches!(
            decode(libc::IPPROTO_ICMPV6, ICMP6_FILTER, &six, RAW4),
            Err(Errno(libc::ENOPROTOOPT))
        ));
        assert!(matches!(
            decode(libc::IPPROTO_IPV6, IPV6_CHECKSUM, &i(2), RAW6),
            Err(Errno(libc::EINVAL))
        ));
        assert!(decode(SOL_RAW, IPV6_CHECKSUM, &i(2), RAW6).is_ok());
        assert!(matches!(
            decode(SOL_RAW, IPV6_CHECKSUM, &i(4), RAW6),
            Err(Errno(libc::EINVAL))
        ));
    }

    fn i(v: i32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    #[test]
    fn socket_level_options_linux_takes_on_any_socket_are_not_refused() {
        let sol = |name, v: &[u8], k| decode(libc::SOL_SOCKET, name, v, k);
        for name in [libc::SO_TIMESTAMP, libc::SO_OOBINLINE, libc::SO_RXQ_OVFL] {
            for k in [TCP4, UDP6] {
                let got = sol(name, &i(5), k);
                assert!(
                    matches!(got, Ok(Opt::Recorded { kept: 1, .. })),
                    "{name}: {got:?}"
                );
            }
        }
        assert_eq!(
            sol(libc::SO_BUSY_POLL, &i(-1), UDP6),
            Err(einval()),
            "negative"
        );
        // The FORCE variants need CAP_NET_ADMIN, as Linux's sockopt_capable.
        let forced = sol(libc::SO_RCVBUFFORCE, &i(1 << 20), UDP6);
        if net_admin() {
            assert_eq!(forced, Ok(Opt::RcvBuf(1 << 20)));
            assert_eq!(
                sol(libc::SO_SNDBUFFORCE, &i(1 << 20), TCP4),
                Ok(Opt::SndBuf(1 << 20))
            );
        } else {
            assert_eq!(forced, Err(Errno(libc::EPERM)));
        }
        // Read back as set; the FORCE names are not readable, as on Linux.
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, None, false, false),
            Ok(0)
        );
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, None, false, false),
            Err(Errno(libc::ENOPROTOOPT))
        );
    }

    #[test]
    fn decode_checks_values_as_linux() {
        let tcp = |name, v: &[u8]| decode(libc::IPPROTO_TCP, name, v, TCP4);
        assert_eq!(tcp(libc::TCP_NODELAY, &i(7)), Ok(Opt::NoDelay(true)));
        assert_eq!(tcp(libc::TCP_NODELAY, &[1, 0]), Err(einval()));
        assert_eq!(tcp(libc::TCP_KEEPCNT, &i(128)), Err(einval()));
        assert_eq!(tcp(libc::TCP_KEEPINTVL, &i(5)), Ok(Opt::Keep(1, 5)));
        assert_eq!(tcp(libc::TCP_MAXSEG, &i(87)), Err(einval()));
        assert_eq!(tcp(libc::TCP_MAXSEG, &i(0)), Ok(Opt::MaxSeg(None)));
        assert_eq!(tcp(libc::TCP_SYNCNT, &i(0)), Err(einval()));
        assert_eq!(tcp(libc::TCP_USER_TIMEOUT, &i(-1)), Err(einval()));
        assert_eq!(tcp(libc::TCP_FASTOPEN, &i(-1)), Err(einval()));
        assert_eq!(tcp(TCP_FASTOPEN_CONNECT, &i(2)), Err(einval()));
        assert_eq!(tcp(TCP_FASTOPEN_KEY, &[0; 3]), Err(einval()));
        assert_eq!(
            tcp(TCP_FASTOPEN_KEY, &[7; 32]),
            Ok(Opt::FastOpenKey([7; 16], Some([7; 16])))
        );
        assert_eq!(
            tcp(libc::TCP_CONGESTION, b"reno\0"),
            Ok(Opt::Congestion(Congestion::Reno))
        );
        assert_eq!(
            tcp(libc::TCP_CONGESTION, b"bbr"),
            Ok(Opt::Congestion(Congestion::Bbr))
        );
        assert_eq!(
            tcp(libc::TCP_CONGESTION, b"vegas"),
            Err(Errno(libc::ENOENT))
        );
        let sol = |name, v: &[u8]| decode(libc::SOL_SOCKET, name, v, TCP4);
        assert_eq!(
            sol(libc::SO_MAX_PACING_RATE, &1_000_000u64.to_ne_bytes()),
            Ok(Opt::MaxPacingRate(1_000_000))
        );
        assert_eq!(
            sol(libc::SO_MAX_PACING_RATE, &i(-1)),
            Ok(Opt::MaxPacingRate(u64::MAX)),
            "~0U is none"
        );
        // A recorded option keeps Linux's reading of the value.
        assert_eq!(
            tcp(libc::TCP_DEFER_ACCEPT, &i(5)),
            Ok(Opt::Recorded {
                level: libc::IPPROTO_TCP,
                name: libc::TCP_DEFER_ACCEPT,
                kept: 3
            })
        );
        // IP level: one byte is enough; a stream keeps its ECN bits.
        assert_eq!(
            decode(libc::IPPROTO_IP, libc::IP_TOS, &[0x2f], TCP4),
            Ok(Opt::Tos(0x2c))
        );
        assert_eq!(
            decode(libc::IPPROTO_IP, libc::IP_TOS, &[0x2f], UDP6),
            Ok(Opt::Tos(0x2f))
        );
        // Options of another protocol or family: ENOPROTOOPT whatever the value.
        assert_eq!(
            decode(libc::IPPROTO_TCP, libc::TCP_NODELAY, &[], UDP6),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            decode(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &i(1), TCP4),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            decode(libc::SOL_SOCKET, 12345, &i(1), TCP4),
            Err(Errno(libc::ENOPROTOOPT))
        );
        // IPV6_MTU: 0 or at least IPv6's minimum MTU, on an IPv6 socket only.
        let mtu6 = |v: i32, kind| decode(libc::IPPROTO_IPV6, libc::IPV6_MTU, &i(v), kind);
        assert_eq!(mtu6(1280, UDP6), Ok(Opt::FragSizeV6(1280)));
        assert_eq!(mtu6(0, UDP6), Ok(Opt::FragSizeV6(0)));
        assert_eq!(mtu6(1279, UDP6), Err(einval()));
        assert_eq!(mtu6(-1, UDP6), Err(einval()));
        assert_eq!(mtu6(1280, TCP4), Err(Errno(libc::ENOPROTOOPT)));
        // Timeouts: zero is none, a bad one EDOM.
        let tv = |s: i64, us: i64| {
            let t = libc::timeval {
                tv_sec: s as libc::time_t,
                tv_usec: us as libc::suseconds_t,
            };
            // SAFETY: plain data viewed as bytes.
            unsafe { std::slice::from_raw_parts(&t as *const _ as *const u8, 16) }.to_vec()
        };
        assert_eq!(
            decode(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv(0, 0), TCP4),
            Ok(Opt::RcvTimeo(None))
        );
        assert_eq!(
            decode(libc::SOL_SOCKET, libc::SO_SNDTIMEO, &tv(1, 1_000_000), TCP4),
            Err(Errno(libc::EDOM))
        );
        assert_eq!(
            timeval_value(&timeval(Some(Duration::from_millis(1500)))),
            Ok(Some(Duration::from_millis(1500)))
        );
        assert_eq!(
            linger(Some(Duration::from_secs(3))),
            [1, 0, 0, 0, 3, 0, 0, 0]
        );
    }

    #[test]
    fn tcp_info_is_linux_layout() {
        let b = LinuxTcpInfo {
            state: tcp_state::ESTABLISHED,
            ca_state: 3,
            options: tcpi_opt::SACK | tcpi_opt::WSCALE,
            wscale: (7, 9),
            snd_cwnd: 10,
            snd_ssthresh: LinuxTcpInfo::ssthresh_segments(u32::MAX, 1448),
            min_rtt_us: 250,
            busy_time_us: 1 << 40,
            ..Default::default()
        }
        .to_bytes();
        assert_eq!(b.len(), TCP_INFO_LEN);
        assert_eq!(&b[..7], &[1, 3, 0, 0, 0, 6, 0x97]);
        let word = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(word(80), 10);
        assert_eq!(word(76), TCP_INFINITE_SSTHRESH);
        assert_eq!(word(148), 250);
        assert_eq!(u64::from_ne_bytes(b[168..176].try_into().unwrap()), 1 << 40);
        assert_eq!(LinuxTcpInfo::segments(14480, 1448), 10);
        assert_eq!(
            LinuxTcpInfo::unconnected(true).to_bytes()[0],
            tcp_state::LISTEN
        );
    }

    #[test]
    fn values_read_back_as_linux_reports_them() {
        // TCP_DEFER_ACCEPT rounds up to a whole number of SYN-ACK retransmissions.
        assert_eq!(retrans_to_secs(secs_to_retrans(5)), 7);
        assert_eq!(retrans_to_secs(secs_to_retrans(100)), 127);
        assert_eq!(retrans_to_secs(secs_to_retrans(-3)), 0);
        let tcp = |name, v| set(libc::IPPROTO_TCP, name, v, true, false);
        assert_eq!(tcp(libc::TCP_WINDOW_CLAMP, 100), Ok(1152));
        assert_eq!(tcp(libc::TCP_QUICKACK, 5), Ok(1));
        assert_eq!(tcp(TCP_FASTOPEN_CONNECT, 2), Err(Errno(libc::EINVAL)));
        let ip = |name, v| set(libc::IPPROTO_IP, name, v, false, false);
        assert_eq!(ip(libc::IP_TTL, -1), Ok(64));
        assert_eq!(ip(libc::IP_TTL, 0), Err(Errno(libc::EINVAL)));
        assert_eq!(ip(libc::IP_MTU_DISCOVER, 6), Err(Errno(libc::EINVAL)));
        assert_eq!(
            set(libc::SOL_SOCKET, libc::SO_RCVLOWAT, -5, false, false),
            Ok(i32::MAX)
        );
        assert_eq!(
            set(libc::SOL_SOCKET, SO_INCOMING_NAPI_ID, 0, true, false),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            get(libc::SOL_SOCKET, libc::SO_INCOMING_CPU, None, true, false),
            Ok(-1)
        );
        // IPv4 multicast on a stream: EINVAL; IPv6 options on an AF_INET socket: none.
        assert_eq!(
            set(libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 3, true, false),
            Err(Errno(libc::EINVAL))
        );
        assert_eq!(
            set(libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, 3, false, false),
            Err(Errno(libc::ENOPROTOOPT))
        );
        assert_eq!(
            get_level_errno(libc::IPPROTO_TCP, false, false),
            Errno(libc::EOPNOTSUPP)
        );
        assert_eq!(
            get_level_errno(libc::IPPROTO_TCP, false, true),
            Errno(libc::ENOPROTOOPT)
        );
    }
}
