//! The interface layout: packetdrill's `struct packetdrill_interface`
//! (`gtests/net/packetdrill/packetdrill.h`) in C types, member for member. Only the
//! layout lives here; [`crate::ffi`] fills it.

use std::ffi::{c_int, c_long, c_longlong, c_uint, c_ulong, c_void};

use libc::{iovec, msghdr, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};

/// The C struct, field for field (`packetdrill.h`). Variadic members (`fcntl`,
/// `ioctl`) are declared with one fixed argument: on the x86-64 System V and AArch64
/// Linux ABIs a variadic integer or pointer argument travels in the same register as a
/// named one, which is how packetdrill calls them (one argument at most).
#[repr(C)]
pub struct PacketdrillInterface {
    pub userdata: *mut c_void,
    pub free: Option<unsafe extern "C" fn(*mut c_void)>,
    pub socket: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int) -> c_int>,
    pub bind: Option<unsafe extern "C" fn(*mut c_void, c_int, *const sockaddr, socklen_t) -> c_int>,
    pub listen: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int) -> c_int>,
    pub accept:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *mut sockaddr, *mut socklen_t) -> c_int>,
    pub connect:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *const sockaddr, socklen_t) -> c_int>,
    pub read: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, size_t) -> ssize_t>,
    pub readv: Option<unsafe extern "C" fn(*mut c_void, c_int, *const iovec, c_int) -> ssize_t>,
    pub recv:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, size_t, c_int) -> ssize_t>,
    pub recvfrom: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut c_void,
            size_t,
            c_int,
            *mut sockaddr,
            *mut socklen_t,
        ) -> ssize_t,
    >,
    pub recvmsg: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut msghdr, c_int) -> ssize_t>,
    pub write: Option<unsafe extern "C" fn(*mut c_void, c_int, *const c_void, size_t) -> ssize_t>,
    pub writev: Option<unsafe extern "C" fn(*mut c_void, c_int, *const iovec, c_int) -> ssize_t>,
    pub send:
        Option<unsafe extern "C" fn(*mut c_void, c_int, *const c_void, size_t, c_int) -> ssize_t>,
    pub sendto: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *const c_void,
            size_t,
            c_int,
            *const sockaddr,
            socklen_t,
        ) -> ssize_t,
    >,
    pub sendmsg: Option<unsafe extern "C" fn(*mut c_void, c_int, *const msghdr, c_int) -> ssize_t>,
    pub fcntl: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int, c_long) -> c_int>,
    pub ioctl: Option<unsafe extern "C" fn(*mut c_void, c_int, c_ulong, *mut c_void) -> c_int>,
    pub close: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    pub shutdown: Option<unsafe extern "C" fn(*mut c_void, c_int, c_int) -> c_int>,
    pub getsockopt: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            c_int,
            c_int,
            *mut c_void,
            *mut socklen_t,
        ) -> c_int,
    >,
    pub setsockopt: Option<
        unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
    >,
    pub poll: Option<unsafe extern "C" fn(*mut c_void, *mut pollfd, libc::nfds_t, c_int) -> c_int>,
    pub netdev_send: Option<unsafe extern "C" fn(*mut c_void, *const c_void, size_t) -> c_int>,
    pub netdev_receive: Option<
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut size_t, *mut c_longlong) -> c_int,
    >,
    pub usleep: Option<unsafe extern "C" fn(*mut c_void, libc::useconds_t) -> c_int>,
    pub gettimeofday: Option<unsafe extern "C" fn(*mut c_void, *mut timeval, *mut c_void) -> c_int>,
    pub epoll_create: Option<unsafe extern "C" fn(*mut c_void, c_int) -> c_int>,
    pub epoll_ctl: Option<
        unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, *mut libc::epoll_event) -> c_int,
    >,
    pub epoll_wait: Option<
        unsafe extern "C" fn(*mut c_void, c_int, *mut libc::epoll_event, c_int, c_int) -> c_int,
    >,
    pub pipe: Option<unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int>,
    pub splice: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut libc::loff_t,
            c_int,
            *mut libc::loff_t,
            size_t,
            c_uint,
        ) -> ssize_t,
    >,
}
