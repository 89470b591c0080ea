//! A process that drops its privileges before its first socket: attached first.
//!
//! The stack admits the user who started it, root, and its `--group`, by the
//! credentials of the control connection (`SO_PEERCRED`, taken at `connect`). A
//! daemon that starts as root and changes its user or group before it makes a
//! socket (BIND's `named -u bind`, and many others that bind after `setuid`)
//! would attach as that user and be refused: every socket `ENETDOWN`. So before
//! a call that changes the process's user, group or groups, the shim attaches
//! while the process still has its rights; the session, like a forked child's,
//! keeps them. Nothing happens if it is attached already, if the stack refuses
//! it now (the first socket reports why, as before), or in a child that shares
//! the layer's memory before its `exec` (`usnet_posix::in_vfork_child`: a
//! session made there would be its parent's).

use std::os::raw::c_int;

use libc::{gid_t, size_t, uid_t};

/// Attaches, quietly, if the process has not yet (see the module's text).
fn attach_before_the_change() {
    if usnet_posix::in_vfork_child() {
        return;
    }
    let _ = crate::on_usnet();
}

macro_rules! attach_first {
    ($(fn $name:ident($($arg:ident: $t:ty),*);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> c_int {
            let real = real!($name: fn($($t),*) -> c_int);
            attach_before_the_change();
            // SAFETY: libc's contract, passed on.
            unsafe { real($($arg),*) }
        }
    )*};
}

attach_first! {
    fn setuid(uid: uid_t);
    fn seteuid(uid: uid_t);
    fn setreuid(r: uid_t, e: uid_t);
    fn setresuid(r: uid_t, e: uid_t, s: uid_t);
    fn setgid(gid: gid_t);
    fn setegid(gid: gid_t);
    fn setregid(r: gid_t, e: gid_t);
    fn setresgid(r: gid_t, e: gid_t, s: gid_t);
    fn setgroups(n: size_t, list: *const gid_t);
    fn initgroups(user: *const std::os::raw::c_char, group: gid_t);
}
