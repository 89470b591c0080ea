//! `usnet bench preload`: the same nginx, unmodified, on the Linux kernel and on a
//! usnet stack server through the LD_PRELOAD shim (`usnet run`), driven by wrk.
//!
//! Both servers sit in one network namespace on one end of a veth pair: nginx on the
//! kernel at that end's address, the usnet stack beside it on the same end through
//! AF_PACKET with its own address, nginx under the shim on the stack. wrk runs in the
//! other namespace. The servers (nginx, and the stack) are pinned to one core and wrk
//! to the other; the two systems take turns run by run. Responses of a small file
//! (151 bytes, the size of the zero-copy document's responses) and of 64 KiB,
//! keep-alive, `-c` connections; wrk's error counts are reported (they must be 0).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use usnet_report::{bar_plot, median, write_json, Table};

use crate::tcp::{is_root, Veth, VETH_ADDR, VETH_USNET};
use crate::web::{in_ns, need_tools, nginx_alerts, nginx_conf, spawn, wait_serving, wrk, Res};

#[derive(Debug, Clone)]
pub struct PreloadBenchOptions {
    pub out: PathBuf,
    pub runs: usize,
    pub seconds: f64,
    pub connections: usize,
}

const STACK: &str = "bench-preload";
const PORT: u16 = 8089;
const FILES: [(&str, usize); 2] = [("r151", 151), ("r64k", 65536)];

pub fn run(a: &PreloadBenchOptions) -> Res<ExitCode> {
    if !is_root() {
        return Err("usnet bench preload needs root (a veth pair between two namespaces)".into());
    }
    need_tools(&["nginx", "wrk", "curl", "taskset"])?;
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("usnet-bench-preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    for (name, len) in FILES {
        let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(www.join(name), body)?;
    }
    let veth = Veth::create()?;
    let (server_ns, client_ns) = (veth.ns[0].clone(), veth.ns[1].clone());
    let kernel_addr = VETH_ADDR[0];

    // The kernel's nginx.
    let conf_k = nginx_conf(&dir, &www, kernel_addr, PORT, "kernel", "", "")?;
    let mut c = in_ns(&server_ns, 1);
    c.args(["nginx", "-p", &dir.display().to_string(), "-c"])
        .arg(&conf_k);
    let mut nginx_k = spawn(c, &dir, "nginx-kernel")?;
    wait_serving(
        &client_ns,
        &format!("http://{kernel_addr}:{PORT}/r151"),
        &mut nginx_k,
        &dir,
    )?;

    // The usnet stack beside it on the same veth end, and nginx under the shim.
    let mut c = in_ns(&server_ns, 1);
    c.arg(&exe).args([
        "up",
        "--name",
        STACK,
        "--services",
        "none",
        "--quiet",
        "--link",
    ]);
    c.arg(format!("afpacket:{}", veth.dev[0]));
    c.args(["--addr", &format!("{VETH_USNET}/24")]);
    let mut stack = spawn(c, &dir, "usnet-up")?;
    let ctl = dir.join(format!("{STACK}.ctl"));
    let end = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        if let Some(s) = stack.0.try_wait()? {
            let log = std::fs::read_to_string(dir.join("usnet-up.log")).unwrap_or_default();
            return Err(format!("usnet up exited ({s}): {log}").into());
        }
        if Instant::now() > end {
            return Err("usnet up did not come up within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let conf_u = nginx_conf(&dir, &www, VETH_USNET, PORT, "usnet", "", "")?;
    let mut c = in_ns(&server_ns, 1);
    c.arg(&exe)
        .args([
            "run",
            "--stack",
            STACK,
            "--",
            "nginx",
            "-p",
            &dir.display().to_string(),
            "-c",
        ])
        .arg(&conf_u);
    let mut nginx_u = spawn(c, &dir, "nginx-usnet")?;
    wait_serving(
        &client_ns,
        &format!("http://{VETH_USNET}:{PORT}/r151"),
        &mut nginx_u,
        &dir,
    )?;

    let systems = [("Linux kernel", kernel_addr), ("usnet (shim)", VETH_USNET)];
    let mut table = Table::new(
        format!(
            "nginx, one worker pinned to core 1; wrk -t1 -c{} on core 0 (median of {} × {} s)",
            a.connections, a.runs, a.seconds
        ),
        [
            "response",
            "system",
            "req/s",
            "× kernel",
            "errors",
            "runs (req/s)",
        ]
        .map(String::from)
        .to_vec(),
    );
    let mut results = Vec::new();
    let mut bars = Vec::new();
    for (name, len) in FILES {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
        let mut errs = vec![0u64; systems.len()];
        for _ in 0..a.runs.max(1) {
            for (i, (_, addr)) in systems.iter().enumerate() {
                let r = wrk(
                    &client_ns,
                    0,
                    &format!("http://{addr}:{PORT}/{name}"),
                    a.connections,
                    a.seconds,
                )?;
                per[i].push(r.rps);
                errs[i] += r.errors;
            }
        }
        let meds: Vec<f64> = per.iter().map(|v| median(&mut v.clone())).collect();
        for (i, (sys, _)) in systems.iter().enumerate() {
            let ratio = meds[i] / meds[0];
            table.row(vec![
                format!("{len} B"),
                sys.to_string(),
                format!("{:.0}", meds[i]),
                format!("{ratio:.2}"),
                errs[i].to_string(),
                per[i]
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
            bars.push((format!("{sys} {len} B"), meds[i]));
            results.push(
                json!({"response_bytes": len, "system": sys, "median_rps": meds[i],
                "x_kernel": ratio, "errors": errs[i], "runs": per[i]}),
            );
        }
    }
    table.print();
    std::fs::create_dir_all(&a.out)?;
    let doc: Value = json!({"bench": "preload", "connections": a.connections, "seconds": a.seconds,
        "runs": a.runs, "results": results});
    write_json(&a.out.join("preload.json"), &doc)?;
    std::fs::write(a.out.join("preload.md"), table.to_markdown())?;
    if let Err(e) = bar_plot(
        &a.out.join("preload.png"),
        "nginx: kernel vs usnet (LD_PRELOAD)",
        "requests/s",
        &bars,
    ) {
        eprintln!("plot not drawn: {e}");
    }
    for t in ["kernel", "usnet"] {
        if let Some(e) = nginx_alerts(&dir, t) {
            eprintln!("nginx ({t}) logged errors:\n{e}");
        }
    }
    println!(
        "wrote {}/preload.json, preload.md, preload.png",
        a.out.display()
    );
    drop((nginx_u, nginx_k, stack));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ExitCode::SUCCESS)
}
