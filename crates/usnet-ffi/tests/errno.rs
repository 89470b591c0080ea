//! Errors and flags of the C socket API that need a live socket, called in this
//! process against a stack server in this process (`usnet_server::testing`).

use std::ffi::CString;
use std::sync::OnceLock;

use usnet::socket::{
    usnet_accept, usnet_attach, usnet_bind, usnet_connect, usnet_getsockname, usnet_listen,
    usnet_recv, usnet_recvfrom, usnet_recvmsg, usnet_send, usnet_sendmsg, usnet_sendto,
    usnet_setsockopt, usnet_socket,
};
use usnet_server::{ServerConfig, ServerHandle};
use usnet_stack::{mac_from_seed, StackConfig};

/// One server and one attach for the whole file (its tests share the process).
fn attached() {
    static S: OnceLock<ServerHandle> = OnceLock::new();
    S.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("usnet-ffi-errno-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // SAFETY: set once, before the server or the client reads it.
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
        let s = usnet_server::testing::in_memory(stack, cfg).unwrap();
        let name = CString::new("ffi-errno").unwrap();
        // SAFETY: a NUL-terminated name.
        assert_eq!(unsafe { usnet_attach(name.as_ptr()) }, 0);
        s
    });
}

fn sin(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([10, 69, 0, 1]),
        },
        sin_zero: [0; 8],
    }
}

fn bound(ty: i32) -> (i32, libc::sockaddr_in) {
    let fd = usnet_socket(libc::AF_INET, ty, 0);
    assert!(fd >= 0);
    let a = sin(0);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a valid address of `len` bytes.
    assert_eq!(
        unsafe { usnet_bind(fd, (&a as *const libc::sockaddr_in).cast(), len) },
        0
    );
    let mut got = sin(0);
    let mut glen = len;
    // SAFETY: room for a sockaddr_in.
    assert_eq!(
        unsafe { usnet_getsockname(fd, (&mut got as *mut libc::sockaddr_in).cast(), &mut glen) },
        0
    );
    (fd, got)
}

/// A connected TCP pair: the connecting socket and the accepted one.
fn stream_pair() -> (i32, i32) {
    let (l, lat) = bound(libc::SOCK_STREAM);
    assert_eq!(usnet_listen(l, 4), 0);
    let c = usnet_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a valid address.
    assert_eq!(
        unsafe { usnet_connect(c, (&lat as *const libc::sockaddr_in).cast(), len) },
        0
    );
    // SAFETY: no address wanted.
    let a = unsafe { usnet_accept(l, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(a >= 0);
    (c, a)
}

/// MSG_TRUNC: a datagram's whole length (recv, and MSG_TRUNC in recvmsg's
/// msg_flags for a short buffer), a stream's bytes thrown away; MSG_ERRQUEUE
/// through plain recv with nothing queued is EAGAIN, as on Linux.
#[test]
fn msg_trunc_and_msg_errqueue_as_linux() {
    attached();
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // A datagram of 100 bytes to ourselves.
    let (u, at) = bound(libc::SOCK_DGRAM);
    let data: Vec<u8> = (0..100u8).collect();
    // SAFETY: valid buffers and address.
    let sent = unsafe {
        usnet_sendto(
            u,
            data.as_ptr().cast(),
            100,
            0,
            (&at as *const libc::sockaddr_in).cast(),
            len,
        )
    };
    assert_eq!(sent, 100);
    let mut small = [0u8; 10];
    // SAFETY: `small` is writable for its length.
    let r = unsafe {
        usnet_recv(
            u,
            small.as_mut_ptr().cast(),
            10,
            libc::MSG_PEEK | libc::MSG_TRUNC,
        )
    };
    assert_eq!(r, 100, "the whole length, the datagram left queued");
    assert_eq!(small[..], data[..10]);
    let mut iov = libc::iovec {
        iov_base: small.as_mut_ptr().cast(),
        iov_len: 10,
    };
    // SAFETY: a zeroed msghdr with one valid piece.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    // SAFETY: as above.
    assert_eq!(unsafe { usnet_recvmsg(u, &mut m, 0) }, 10);
    assert_ne!(
        m.msg_flags & libc::MSG_TRUNC,
        0,
        "msg_flags {:#x}",
        m.msg_flags
    );

    // A stream: 1000 bytes, of which recv(NULL, 600, MSG_TRUNC) throws 600 away.
    let (c, a) = stream_pair();
    let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    // SAFETY: a valid buffer.
    assert_eq!(
        unsafe { usnet_send(c, bytes.as_ptr().cast(), 1000, 0) },
        1000
    );
    // SAFETY: NULL with MSG_TRUNC, as Linux allows on TCP.
    let r = unsafe {
        usnet_recv(
            a,
            std::ptr::null_mut(),
            600,
            libc::MSG_TRUNC | libc::MSG_WAITALL,
        )
    };
    assert_eq!(r, 600);
    let mut rest = [0u8; 1000];
    // SAFETY: `rest` is writable.
    let r = unsafe {
        usnet_recv(
            a,
            rest.as_mut_ptr().cast(),
            1000,
            libc::MSG_WAITALL | libc::MSG_DONTWAIT,
        )
    };
    assert_eq!(r, 400);
    assert_eq!(rest[..400], bytes[600..]);
    // SAFETY: `rest` is writable.
    let r = unsafe { usnet_recv(a, rest.as_mut_ptr().cast(), 10, libc::MSG_ERRQUEUE) };
    assert_eq!((r, errno()), (-1, libc::EAGAIN));
}

fn errno() -> i32 {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// sendmsg and recvmsg with more pieces than UIO_MAXIOV are EMSGSIZE (readv and
/// writev say EINVAL), and the count is a size_t: a count past 2^32 is refused,
/// not cut to a small one.
#[test]
fn too_many_pieces_in_a_msghdr_is_emsgsize() {
    attached();
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
}

/// recvmsg writes `msg_namelen` back only when there is a `msg_name`, as Linux
/// does: the sender's length for a datagram, 0 for a stream; without a name the
/// caller's value stays (a fuzzer passed NULL with 128 and was told 128, which is
/// right).
#[test]
fn recvmsg_writes_the_name_length_only_with_a_name() {
    attached();
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let full = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let recv = |fd: i32, name: Option<&mut libc::sockaddr_storage>| {
        let mut buf = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: a zeroed msghdr with one valid piece and, if any, a full-sized name.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_namelen = full;
        if let Some(n) = name {
            m.msg_name = (n as *mut libc::sockaddr_storage).cast();
        }
        // A bounded wait: what is read was sent before.
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of its size.
        let set = unsafe {
            usnet_setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        // SAFETY: as above.
        let r = unsafe { usnet_recvmsg(fd, &mut m, 0) };
        (r, m.msg_namelen)
    };
    let (u, at) = bound(libc::SOCK_DGRAM);
    for _ in 0..2 {
        // SAFETY: a valid buffer and address.
        let sent = unsafe {
            usnet_sendto(
                u,
                b"ping".as_ptr().cast(),
                4,
                0,
                (&at as *const libc::sockaddr_in).cast(),
                len,
            )
        };
        assert_eq!(sent, 4);
    }
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    assert_eq!(recv(u, Some(&mut name)), (4, len), "a datagram's sender");
    assert_eq!(recv(u, None), (4, full), "no name: left as it was");

    let (c, a) = stream_pair();
    // SAFETY: a valid buffer.
    assert_eq!(
        unsafe { usnet_send(c, b"abcdefgh".as_ptr().cast(), 8, 0) },
        8
    );
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let (r, got) = recv(a, Some(&mut name));
    assert!(r > 0);
    assert_eq!(got, 0, "a stream gives no address");
    // SAFETY: a valid buffer.
    assert_eq!(unsafe { usnet_send(c, b"ijkl".as_ptr().cast(), 4, 0) }, 4);
    let (r, got) = recv(a, None);
    assert!(r > 0);
    assert_eq!(got, full, "no name: left as it was");
    // recvfrom: the same rule for its address and length.
    // SAFETY: a valid buffer.
    assert_eq!(unsafe { usnet_send(c, b"mn".as_ptr().cast(), 2, 0) }, 2);
    let mut buf = [0u8; 8];
    let mut alen = full;
    // SAFETY: a valid buffer and length; no address buffer.
    let r = unsafe {
        usnet_recvfrom(
            a,
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            std::ptr::null_mut(),
            &mut alen,
        )
    };
    assert_eq!((r, alen), (2, full), "no address buffer: the length stays");
}
