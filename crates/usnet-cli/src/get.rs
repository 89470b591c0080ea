//! `usnet get URL`: an HTTP/1.1 client on a usnet stack (`--link ... --addr ...`
//! as for `usnet up`). The URL names the server by an IPv4 or IPv6 literal
//! (`http://10.0.0.1:8080/x`, `http://[fd00::1]/x`; no DNS). Content-Length,
//! chunked and read-until-close bodies; progress on stderr; the byte count and
//! SHA-256 of the body at the end (`--sha256`: only the hex digest); `-o FILE`
//! writes the body. With `--stack NAME` instead of `--link`, no stack is started: the
//! command is a client of the running stack server NAME (`usnet up`), its bytes
//! crossing the server's shared-memory rings. `-o FILE`
//! writes the body. The exit status is non-zero for HTTP statuses 400 and above,
//! and for a body cut short. The HTTP itself (URL, request, response framing) is
//! `usnet_http::client`; this is the command around it.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use usnet_http::client::{self, parse_url, BodyFill, Fetched, Url};
use usnet_http::{hex, ResponseHead};
use usnet_runtime::{NetStack, TcpStream};
use usnet_stack::IpCidr;

use crate::up::{self, UpArgs};
use crate::CmdResult;

#[derive(Args, Debug)]
pub struct GetArgs {
    /// http://ADDR[:PORT]/PATH, ADDR an IPv4 literal or an [IPv6] literal.
    pub url: String,
    /// Write the body to this file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print only the hex SHA-256 of the body.
    #[arg(long)]
    pub sha256: bool,
    /// The usnet stack's link: tap:IF, shm:NAME, afpacket:IF, nic:NAME.
    #[arg(long, required_unless_present = "stack", conflicts_with = "stack")]
    pub link: Option<String>,
    /// Use the running stack server of this name (`usnet up`) as a client instead of
    /// starting a stack.
    #[arg(long)]
    pub stack: Option<String>,
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
    /// Seconds to wait for the connection and for each read.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// Turn off the usnet stack's receive coalescing (GRO), as `usnet up --no-gro`.
    #[arg(long)]
    pub no_gro: bool,
}

/// One HTTP/1.1 exchange on a fresh usnet connection to `url` (see
/// [`usnet_http::client::exchange`]), with `timeout` for the connection and for each
/// read and write.
pub fn exchange(
    net: &NetStack,
    url: &Url,
    method: &str,
    body: Option<BodyFill<'_>>,
    timeout: Duration,
    on_head: &mut dyn FnMut(&ResponseHead),
    sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<Fetched> {
    let mut s = TcpStream::connect_timeout(net, url.addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    client::exchange(&mut s, url, method, body, on_head, sink)
}

pub fn run(a: GetArgs) -> CmdResult {
    let url = parse_url(&a.url)?;
    let timeout = Duration::from_secs_f64(a.timeout.max(0.1));
    if let Some(name) = &a.stack {
        let c = usnet_client::Client::attach(name)
            .map_err(|e| format!("cannot attach to stack '{name}': {e}"))?;
        return fetch(&a, &mut |on_head, sink| {
            let mut s = usnet_client::TcpStream::connect_timeout(&c, url.addr, timeout)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            client::exchange(&mut s, &url, "GET", None, on_head, sink)
        });
    }
    let link = a.link.clone().ok_or("--link or --stack")?;
    let args = UpArgs {
        addrs: a.addrs.clone(),
        host_addrs: a.host_addrs.clone(),
        gateway: a.gateway.clone(),
        mtu: a.mtu,
        no_gro: a.no_gro,
        ..UpArgs::embedded(link, format!("get-{}", std::process::id()))
    };
    let net = up::start(&args)?;
    let r = fetch(&a, &mut |on_head, sink| {
        exchange(&net, &url, "GET", None, timeout, on_head, sink)
    });
    net.shutdown();
    r
}

/// One exchange: the response head, then the body in pieces.
type Exchange<'a> = dyn FnMut(
        &mut dyn FnMut(&ResponseHead),
        &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<Fetched>
    + 'a;

fn fetch(a: &GetArgs, exchange: &mut Exchange<'_>) -> CmdResult {
    let mut out = match &a.output {
        Some(p) => Some(BufWriter::with_capacity(
            1 << 20,
            File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?,
        )),
        None => None,
    };
    let bar = if a.sha256 {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    let t0 = Instant::now();
    let mut on_head = |h: &ResponseHead| {
        if let Some(len) = h.content_length {
            bar.set_length(len);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        } else {
            bar.set_style(
                ProgressStyle::with_template("{spinner} {bytes} {bytes_per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
        }
    };
    let mut sink = |d: &[u8]| -> io::Result<()> {
        bar.inc(d.len() as u64);
        match out.as_mut() {
            Some(w) => w.write_all(d),
            None => Ok(()),
        }
    };
    let r = exchange(&mut on_head, &mut sink);
    bar.finish_and_clear();
    let f = r.map_err(|e| format!("GET {}: {e}", a.url))?;
    if let Some(mut w) = out {
        w.flush()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let digest = hex(&f.sha256);
    let summary = if a.sha256 {
        format!("{digest}\n")
    } else {
        format!(
            "usnet get: HTTP {} {}, {} bytes in {secs:.3} s ({:.1} MB/s)\nsha256 {digest}\n",
            f.head.status,
            f.head.reason,
            f.bytes,
            f.bytes as f64 / secs.max(1e-9) / 1e6
        )
    };
    // A reader that stopped early (`| head -1`) is not an error of ours.
    match io::stdout().lock().write_all(summary.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    if f.head.status >= 400 {
        eprintln!(
            "usnet get: {}: HTTP {} {}",
            a.url, f.head.status, f.head.reason
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
