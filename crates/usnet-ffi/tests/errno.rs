//! Errors of the C socket API that depend on a live socket, called in this
//! process against a stack server in this process (`usnet_server::testing`).

use std::ffi::CString;

use usnet::socket::{usnet_attach, usnet_recvmsg, usnet_sendmsg, usnet_socket};
use usnet_server::ServerConfig;
use usnet_stack::{mac_from_seed, StackConfig};

fn errno() -> i32 {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// sendmsg and recvmsg with more pieces than UIO_MAXIOV are EMSGSIZE (readv and
/// writev say EINVAL), and the count is a size_t: a count past 2^32 is refused,
/// not cut to a small one.
#[test]
fn too_many_pieces_in_a_msghdr_is_emsgsize() {
    let d = std::env::temp_dir().join(format!("usnet-ffi-errno-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    // SAFETY: set before the server or the client reads it (one test in this file).
    unsafe { std::env::set_var("USNET_RUN_DIR", &d) };
    let stack = StackConfig {
        mac: mac_from_seed(31),
        addrs: vec!["10.69.0.1/24".parse().unwrap()],
        ..Default::default()
    };
    let cfg = ServerConfig {
        name: "ffi-errno".into(),
        link: "mem".into(),
        ..Default::default()
    };
    let _server = usnet_server::testing::in_memory(stack, cfg).unwrap();
    let name = CString::new("ffi-errno").unwrap();
    // SAFETY: a NUL-terminated name.
    assert_eq!(unsafe { usnet_attach(name.as_ptr()) }, 0);
    let fd = usnet_socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
    assert!(fd >= 0);
    for n in [libc::UIO_MAXIOV as usize + 1, (1usize << 32) + 1] {
        let mut iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: a zeroed msghdr is valid; the count is refused before a piece is read.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = n;
        // SAFETY: as above.
        assert_eq!(unsafe { usnet_sendmsg(fd, &m, 0) }, -1);
        assert_eq!(errno(), libc::EMSGSIZE, "sendmsg, {n} pieces");
        // SAFETY: as above.
        assert_eq!(unsafe { usnet_recvmsg(fd, &mut m, 0) }, -1);
        assert_eq!(errno(), libc::EMSGSIZE, "recvmsg, {n} pieces");
    }
    let _ = std::fs::remove_dir_all(&d);
}
