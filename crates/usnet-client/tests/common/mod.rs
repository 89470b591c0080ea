//! A stack server in this process on an in-memory link, for client tests: sockets to
//! the server's own address go through its local delivery, so whole conversations run
//! without a device or privileges.
#![allow(dead_code)]

use std::sync::Once;
use std::time::Duration;

use usnet_server::{ServerConfig, ServerHandle};
use usnet_stack::{mac_from_seed, StackConfig};

pub const ADDR: &str = "10.66.0.1";

static RUN_DIR: Once = Once::new();

/// Every test of this process uses one private run directory.
pub fn run_dir() {
    RUN_DIR.call_once(|| {
        let d = std::env::temp_dir().join(format!("usnet-client-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: called once, before any test thread reads the environment here.
        unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
    });
}

pub fn server(name: &str, tweak: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    server_with(name, |_| {}, tweak)
}

/// [`server`] with the stack's configuration changed by `stack_tweak` too.
pub fn server_with(
    name: &str,
    stack_tweak: impl FnOnce(&mut StackConfig),
    tweak: impl FnOnce(&mut ServerConfig),
) -> ServerHandle {
    run_dir();
    let mut stack = StackConfig {
        mac: mac_from_seed(9),
        addrs: vec![format!("{ADDR}/24").parse().unwrap()],
        mtu: 65535 - 28,
        ..Default::default()
    };
    stack_tweak(&mut stack);
    let mut cfg = ServerConfig {
        name: name.into(),
        link: "mem".into(),
        spin: Duration::from_micros(20),
        ..Default::default()
    };
    tweak(&mut cfg);
    usnet_server::testing::in_memory(stack, cfg).unwrap()
}
