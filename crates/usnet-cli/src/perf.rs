//! `usnet perf`: a bulk TCP transfer between a client and a server, either end on a
//! usnet stack (`--link ... --addr ...`) or on the Linux kernel (`--kernel`,
//! std::net), with every byte checked against a deterministic pattern.
//!
//! Protocol: the client sends the byte count (8 bytes, big endian), then the stream
//! (byte `i` is byte `i % 8` of the little-endian word `(i / 8) * K`), then FIN. The
//! server checks every byte and answers with the count of good bytes (8 bytes) when
//! it sees EOF; the client's time runs from connect to that answer.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use usnet_runtime::NetStack;
use usnet_stack::IpCidr;

use crate::up::{self, UpArgs};
use crate::CmdResult;

#[derive(Args, Debug)]
pub struct PerfArgs {
    /// Serve: accept transfers and check them.
    #[arg(long, conflicts_with = "client")]
    pub server: bool,
    /// Send to a server at this address (ADDR or ADDR:PORT).
    #[arg(long, value_name = "ADDR")]
    pub client: Option<String>,
    /// Bytes to send (suffixes K, M, G: powers of 1024).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub bytes: u64,
    /// TCP port.
    #[arg(long, default_value_t = 5201)]
    pub port: u16,
    /// Use the Linux kernel's TCP (std::net) instead of a usnet stack.
    #[arg(long)]
    pub kernel: bool,
    /// Server: exit after one transfer.
    #[arg(long)]
    pub once: bool,
    /// The usnet stack's link: tap:IF, shm:NAME, afpacket:IF, nic:NAME.
    #[arg(long)]
    pub link: Option<String>,
    /// The usnet stack's addresses (repeatable), e.g. 10.20.0.2/24.
    #[arg(long = "addr", value_name = "CIDR")]
    pub addrs: Vec<IpCidr>,
    /// tap only: address(es) for the Linux side of the TAP.
    #[arg(long = "host-addr", value_name = "CIDR")]
    pub host_addrs: Vec<IpCidr>,
    /// Default gateway of the usnet stack (repeatable).
    #[arg(long)]
    pub gateway: Vec<IpAddr>,
    /// L3 MTU of the usnet stack.
    #[arg(long)]
    pub mtu: Option<usize>,
    /// Write size in bytes.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub chunk: u64,
    /// Turn off the usnet stack's receive coalescing (GRO), as `usnet up --no-gro`.
    #[arg(long)]
    pub no_gro: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("bad size '{s}': expected a number with an optional K, M or G"))
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn word(w: u64) -> u64 {
    w.wrapping_mul(K) ^ (w >> 7)
}

/// Byte `off` of the stream.
fn pattern_byte(off: u64) -> u8 {
    word(off / 8).to_le_bytes()[(off % 8) as usize]
}

/// Fills `buf` with the stream from offset `off`.
fn fill(buf: &mut [u8], off: u64) {
    let head = ((8 - off % 8) % 8).min(buf.len() as u64) as usize;
    for (k, b) in buf[..head].iter_mut().enumerate() {
        *b = pattern_byte(off + k as u64);
    }
    let mut w = (off + head as u64) / 8;
    let mut chunks = buf[head..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word(w).to_le_bytes());
        w += 1;
    }
    let rest = chunks.into_remainder();
    for (k, b) in rest.iter_mut().enumerate() {
        *b = word(w).to_le_bytes()[k];
    }
}

/// The first offset in `buf` (from stream offset `off`) that is wrong.
fn check(buf: &[u8], off: u64) -> Option<u64> {
    let head = ((8 - off % 8) % 8).min(buf.len() as u64) as usize;
    for (k, b) in buf[..head].iter().enumerate() {
        if *b != pattern_byte(off + k as u64) {
            return Some(off + k as u64);
        }
    }
    let mut at = off + head as u64;
    let mut chunks = buf[head..].chunks_exact(8);
    for c in &mut chunks {
        if u64::from_le_bytes(c.try_into().expect("8 bytes")) != word(at / 8) {
            return (0..8)
                .map(|k| at + k)
                .find(|&i| c[(i - at) as usize] != pattern_byte(i));
        }
        at += 8;
    }
    for (k, b) in chunks.remainder().iter().enumerate() {
        if *b != pattern_byte(at + k as u64) {
            return Some(at + k as u64);
        }
    }
    None
}

/// What both stream kinds offer beyond Read + Write.
/// How long a transfer may make no progress at all before it fails (a peer that died
/// or a path that went away); nothing waits without a deadline.
const IDLE_LIMIT: Duration = Duration::from_secs(60);

trait Stream: Read + Write {
    fn shut_write(&self) -> io::Result<()>;
    fn set_idle_limit(&mut self, d: Duration) -> io::Result<()>;
    fn retransmits(&self) -> Option<u64> {
        None
    }
    /// Receiver's view of the stream's order: out-of-order segments queued and
    /// segments or bytes that fell outside the window.
    fn arrival_note(&self) -> String {
        String::new()
    }
    /// Sender's view of the path: MSS decreases by ICMP (path MTU discovery).
    fn path_note(&self) -> String {
        String::new()
    }
}

impl Stream for std::net::TcpStream {
    fn shut_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
    fn set_idle_limit(&mut self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Stream for usnet_runtime::TcpStream {
    fn shut_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
    fn set_idle_limit(&mut self, d: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
    fn retransmits(&self) -> Option<u64> {
        self.info().ok().map(|i| i.total_retransmits)
    }
    fn path_note(&self) -> String {
        match (self.stats(), self.info()) {
            (Ok(t), Ok(i)) if t.pmtu_decreases > 0 => format!(
                "; path MTU: MSS lowered by ICMP: {}, now {}",
                t.pmtu_decreases, i.snd_mss
            ),
            _ => String::new(),
        }
    }
    fn arrival_note(&self) -> String {
        self.stats().map_or(String::new(), |t| {
            format!(
                ", {} out-of-order segments, {} outside the window, {} bytes trimmed",
                t.rx_ooo_segments, t.rx_out_of_window, t.rx_beyond_window_bytes
            )
        })
    }
}

fn client_io<S: Stream>(s: &mut S, total: u64, chunk: usize, t0: Instant) -> CmdResult {
    s.set_idle_limit(IDLE_LIMIT)?;
    s.write_all(&total.to_be_bytes())?;
    let mut buf = vec![0u8; chunk.max(1)];
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(buf.len() as u64) as usize;
        fill(&mut buf[..n], sent);
        s.write_all(&buf[..n])?;
        sent += n as u64;
    }
    s.shut_write()?;
    let mut ans = [0u8; 8];
    s.read_exact(&mut ans)?;
    let good = u64::from_be_bytes(ans);
    let secs = t0.elapsed().as_secs_f64();
    let rtx = s
        .retransmits()
        .map_or(String::new(), |r| format!(", {r} retransmits"));
    let path = s.path_note();
    println!(
        "usnet perf: sent {} bytes in {secs:.3} s = {:.1} MB/s ({:.2} Gbit/s){rtx}; server verified {good}{path}",
        total,
        total as f64 / secs / 1e6,
        total as f64 * 8.0 / secs / 1e9
    );
    if good != total {
        eprintln!("usnet perf: the server verified only {good} of {total} bytes");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn server_io<S: Stream>(s: &mut S, peer: SocketAddr) -> io::Result<()> {
    let t0 = Instant::now();
    s.set_idle_limit(IDLE_LIMIT)?;
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    let total = u64::from_be_bytes(hdr);
    let mut buf = vec![0u8; 256 << 10];
    let (mut got, mut bad) = (0u64, None);
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if bad.is_none() {
            bad = check(&buf[..n], got);
        }
        got += n as u64;
    }
    let good = bad.unwrap_or(got);
    s.write_all(&good.to_be_bytes())?;
    let secs = t0.elapsed().as_secs_f64();
    let rtx = s
        .retransmits()
        .map_or(String::new(), |r| format!(", {r} retransmits"))
        + &s.arrival_note();
    match bad {
        None if got == total => println!(
            "usnet perf: {peer}: received {got} bytes, all correct, in {secs:.3} s = {:.1} MB/s{rtx}",
            got as f64 / secs / 1e6
        ),
        None => println!("usnet perf: {peer}: received {got} of {total} bytes (short){rtx}"),
        Some(at) => println!("usnet perf: {peer}: byte {at} is wrong ({got} received){rtx}"),
    }
    Ok(())
}

fn stack(a: &PerfArgs) -> Result<NetStack, Box<dyn std::error::Error>> {
    let link = a
        .link
        .clone()
        .ok_or("a usnet end needs --link and --addr (or --kernel for Linux's TCP)")?;
    let args = UpArgs {
        addrs: a.addrs.clone(),
        host_addrs: a.host_addrs.clone(),
        gateway: a.gateway.clone(),
        mtu: a.mtu,
        no_gro: a.no_gro,
        ..UpArgs::embedded(link, format!("perf-{}", std::process::id()))
    };
    up::start(&args)
}

fn server_addr(s: &str, port: u16) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, port)))
        .map_err(|_| format!("bad server address '{s}'"))
}

pub fn run(a: PerfArgs) -> CmdResult {
    let any = SocketAddr::new(IpAddr::from([0u16; 8]), a.port);
    if let Some(c) = &a.client {
        let to = server_addr(c, a.port)?;
        let t0 = Instant::now();
        if a.kernel {
            let mut s = std::net::TcpStream::connect(to)?;
            return client_io(&mut s, a.bytes, a.chunk as usize, t0);
        }
        let net = stack(&a)?;
        let mut s = usnet_runtime::TcpStream::connect_timeout(&net, to, Duration::from_secs(10))?;
        let t0 = Instant::now();
        let r = client_io(&mut s, a.bytes, a.chunk as usize, t0);
        drop(s);
        net.shutdown();
        return r;
    }
    if !a.server {
        return Err("say --server or --client ADDR".into());
    }
    if a.kernel {
        let l = std::net::TcpListener::bind(any)?;
        println!("usnet perf: kernel server on {}", l.local_addr()?);
        loop {
            let (mut s, peer) = l.accept()?;
            let h = std::thread::spawn(move || server_io(&mut s, peer));
            if a.once {
                h.join().map_err(|_| "server thread panicked")??;
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    let net = stack(&a)?;
    let l = usnet_runtime::TcpListener::bind(&net, any)?;
    println!(
        "usnet perf: usnet server on port {} ({})",
        a.port,
        a.addrs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    loop {
        let (mut s, peer) = l.accept()?;
        let h = std::thread::spawn(move || server_io(&mut s, peer));
        if a.once {
            h.join().map_err(|_| "server thread panicked")??;
            let (gro, c) = net.with(|s| (s.config().gro, s.counters().clone()));
            if gro {
                println!(
                    "usnet perf: receive coalescing: {} of {} TCP segments merged into {} frames",
                    c.tcp_gro_merged + c.tcp_gro_frames,
                    c.tcp_rx,
                    c.tcp_gro_frames
                );
            }
            // Let the answer and FIN leave before the stack goes.
            std::thread::sleep(Duration::from_millis(200));
            net.shutdown();
            return Ok(ExitCode::SUCCESS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_fill_and_check_agree_at_any_offset() {
        for off in [0u64, 1, 7, 8, 13, 1 << 33] {
            for len in [0usize, 1, 5, 8, 9, 100] {
                let mut b = vec![0u8; len];
                fill(&mut b, off);
                for (k, x) in b.iter().enumerate() {
                    assert_eq!(*x, pattern_byte(off + k as u64));
                }
                assert_eq!(check(&b, off), None);
                if len > 3 {
                    b[3] ^= 1;
                    assert_eq!(check(&b, off), Some(off + 3));
                }
            }
        }
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("x").is_err());
    }
}
