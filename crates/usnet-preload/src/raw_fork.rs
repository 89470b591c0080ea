//! Processes made without `fork`.
//!
//! A child of `fork` gets a session of its own through the fork handlers that
//! `usnet-posix` installs with `pthread_atfork`. A program that makes its child
//! with the raw system call runs no handlers: vsftpd's `syscall(__NR_clone,
//! CLONE_NEWIPC | SIGCHLD, NULL)` for each connection, namespace tools (`clone`
//! with `CLONE_NEWPID`, `CLONE_NEWNET`), `syscall(SYS_fork)`. Such a child is a copy
//! of the process all the same and would go on with its parent's session, whose
//! rings have one producer each. So when a call makes a copy of the process
//! (no `CLONE_VM`, `CLONE_THREAD` or `CLONE_SETTLS`), the shim's `syscall`
//! (through [`as_fork`]) and `clone` run the layer's handlers around it
//! ([`usnet_posix::RawFork`]).
//!
//! **`vfork`** (and `syscall(SYS_vfork)`) is a `fork` here. Its child shares the
//! parent's memory, where the layer keeps its table and sessions, but not its
//! descriptors, and it runs no handlers: Python's `subprocess` and
//! `multiprocessing` (spawn) close there every number the new program is not to
//! have (`close_range`) and so closed the parent's sockets through the layer; and
//! the new program had to claim its sockets from the parent's session, which the
//! parent, resumed at the `exec`, could close first (a server handing a
//! connection to a program it starts). As a `fork`, the handlers pin the sockets
//! for the child's session and what the child closes is its own. POSIX allows
//! this (a `vfork` child may only `exec` or `_exit`); it costs a copy of the page
//! tables.
//!
//! A `clone` with `CLONE_VM | CLONE_VFORK` (a spawn library's child, on a stack of
//! its own) stays what it is: its parent waits until it execs, with the sockets
//! pinned for the program it starts (`usnet_posix::pin_for_spawn`, as for
//! `posix_spawn`), and the child's descriptor calls go to the kernel alone
//! (`usnet_posix::in_vfork_child`).
//!
//! Left alone: threads, and a `syscall` clone onto a new stack (its child cannot
//! return into C code, so nothing of ours could run there).

use std::os::raw::{c_int, c_long, c_void};

use usnet_posix::RawFork;

/// The flags with which a clone shares this process instead of copying it, or
/// gives the child thread-local storage of its own (where the handlers' state,
/// kept per thread, is not).
const SHARES: c_long = (libc::CLONE_VM | libc::CLONE_THREAD | libc::CLONE_SETTLS) as c_long;

/// `clone3`'s `struct clone_args`, as far as this module reads it (version 0 is
/// 64 bytes): the flags, and the stack at the sixth word.
const CLONE_ARGS_FLAGS: usize = 0;
const CLONE_ARGS_STACK: usize = 5;
const CLONE_ARGS_SIZE_VER0: usize = 64;

/// `syscall(n, a1, a2, ..)` makes a copy of this process that goes on where the
/// call returns, as `fork` does.
///
/// # Safety
/// For `clone3`, `a1` and `a2` are what the system call takes: the address and
/// size of a `struct clone_args`.
pub(crate) unsafe fn copies_process(n: c_long, a1: c_long, a2: c_long) -> bool {
    match n {
        // The arguments: flags, then the child's stack.
        libc::SYS_clone => a1 & SHARES == 0 && a2 == 0,
        libc::SYS_clone3 => {
            if a1 == 0 || (a2 as usize) < CLONE_ARGS_SIZE_VER0 {
                return false;
            }
            let args = a1 as *const u64;
            // SAFETY: the caller's contract: `a1` points at `a2` >= 64 bytes.
            let (flags, stack) = unsafe {
                (
                    args.add(CLONE_ARGS_FLAGS).read_unaligned(),
                    args.add(CLONE_ARGS_STACK).read_unaligned(),
                )
            };
            flags as c_long & SHARES == 0 && stack == 0
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_fork => true,
        _ => false,
    }
}

/// `vfork`: a `fork` (see the module's text).
#[no_mangle]
pub extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no memory arguments; libc's runs the fork handlers.
    unsafe { libc::fork() }
}

/// Runs `f` and gives back the `errno` that was there before it.
fn keeping_errno(f: impl FnOnce()) {
    // SAFETY: this thread's errno, always valid.
    let e = unsafe { *libc::__errno_location() };
    f();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `call`, a `syscall` for which [`copies_process`] holds, with the fork
/// handlers around it: 0 is the child's return, anything else the parent's.
pub(crate) fn as_fork(call: impl FnOnce() -> c_long) -> c_long {
    if crate::is_inside() {
        return call();
    }
    let fork = RawFork::begin();
    let r = call();
    keeping_errno(|| if r == 0 { fork.child() } else { fork.parent() });
    r
}

/// What the child of [`clone`] starts with: the program's function and argument,
/// and the handlers' state (the child reads its own copy of this memory).
struct Start {
    f: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    fork: RawFork,
}

extern "C" fn start_child(p: *mut c_void) -> c_int {
    // SAFETY: `p` is the `Start` that `clone` made on its stack, copied into this
    // process with the rest of its memory (no CLONE_VM); this process owns the copy.
    let start = unsafe { std::ptr::read(p as *const Start) };
    start.fork.child();
    (start.f)(start.arg)
}

/// libc's `clone`: a child that copies the process (no `CLONE_VM`, `CLONE_THREAD`
/// or `CLONE_SETTLS`) runs the fork handlers before the program's function.
#[no_mangle]
pub unsafe extern "C" fn clone(
    f: Option<extern "C" fn(*mut c_void) -> c_int>,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    parent_tid: *mut libc::pid_t,
    tls: *mut c_void,
    child_tid: *mut libc::pid_t,
) -> c_int {
    type ChildFn = Option<extern "C" fn(*mut c_void) -> c_int>;
    let real = real!(clone: variadic fn(ChildFn, *mut c_void, c_int, *mut c_void) -> c_int);
    let vfork_style = flags & (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_THREAD)
        == libc::CLONE_VM | libc::CLONE_VFORK;
    if vfork_style && !crate::is_inside() {
        // Held until the child has exec'd (CLONE_VFORK: until then this call waits).
        let _pin = usnet_posix::pin_for_spawn();
        // SAFETY: passed on unchanged.
        return unsafe { real(f, stack, flags, arg, parent_tid, tls, child_tid) };
    }
    let Some(func) = f.filter(|_| !crate::is_inside() && flags as c_long & SHARES == 0) else {
        // SAFETY: passed on unchanged.
        return unsafe { real(f, stack, flags, arg, parent_tid, tls, child_tid) };
    };
    let start = std::mem::ManuallyDrop::new(Start {
        f: func,
        arg,
        fork: RawFork::begin(),
    });
    let p = &*start as *const Start as *mut c_void;
    // SAFETY: libc's contract, with our start function; `start` outlives the call
    // and the child reads its own copy of it.
    let r = unsafe {
        real(
            Some(start_child),
            stack,
            flags,
            p,
            parent_tid,
            tls,
            child_tid,
        )
    };
    let start = std::mem::ManuallyDrop::into_inner(start);
    keeping_errno(|| start.fork.parent());
    r
}
