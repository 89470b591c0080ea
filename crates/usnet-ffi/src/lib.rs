//! C ABI of usnet (`libusnet.so` / `libusnet.a`), declared in
//! `include/usnet.h`.
//!
//! Section "sockets" ([`socket`]): BSD sockets on a usnet stack server (`usnet up`),
//! through `usnet-posix`: `-1` and `errno` on failure, as the system calls.
//!
//! Section "interfaces" ([`ifaces`]): `getifaddrs` and the `if_*` name calls as a
//! program on the stack sees its network.
//!
//! Section "asynchronous system calls": the `usnet_async_*` functions wrap
//! [`usnet_async_syscall::AsyncSyscall`]. All functions return 0 or a count on
//! success and a negative errno on failure, like the system calls they
//! carry; results of the carried calls follow `syscall(2)` semantics with
//! negative errno. No Rust panic crosses the boundary (they abort).

pub mod ifaces;
pub mod socket;

use std::ptr;
use std::time::Duration;
use usnet_async_syscall::{AsyncSyscall, Call, Completion, Error, ExitMode};

/// Opaque handle (`usnet_async_t`).
pub struct UsnetAsync {
    inner: AsyncSyscall,
}

/// `usnet_async_call_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UsnetAsyncCall {
    pub num: i64,
    pub args: [u64; 6],
    pub user_data: u64,
}

/// `usnet_async_completion_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UsnetAsyncCompletion {
    pub user_data: u64,
    pub result: i64,
}

/// `usnet_async_errors_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UsnetAsyncErrors {
    pub bad_index: u64,
    pub bad_state: u64,
    pub unknown_state: u64,
    pub bad_completion: u64,
    pub queue_corrupt: u64,
}

pub const USNET_ASYNC_EXIT_DRAIN: i32 = 0;
pub const USNET_ASYNC_EXIT_CANCEL: i32 = 1;

fn errno(e: &Error) -> i32 {
    -match e {
        Error::Exiting => libc::ESHUTDOWN,
        Error::Full => libc::EAGAIN,
        Error::TimedOut => libc::ETIMEDOUT,
        Error::Idle => libc::ENOENT,
        Error::Closed => libc::EPIPE,
        Error::Invalid(_) => libc::EINVAL,
        Error::Protocol(_) => libc::EPROTO,
        Error::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
    }
}

fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            let _ = fallback;
            std::process::abort()
        }
    }
}

fn to_c(c: Completion) -> UsnetAsyncCompletion {
    UsnetAsyncCompletion {
        user_data: c.user_data,
        result: c.result,
    }
}

/// Borrow a handle; NULL gives None.
///
/// # Safety
/// `h` is NULL or a live pointer from `usnet_async_init`.
unsafe fn handle<'a>(h: *mut UsnetAsync) -> Option<&'a mut UsnetAsync> {
    // SAFETY: per the function contract.
    unsafe { h.as_mut() }
}

/// Write up to `max` completions to `out`.
///
/// # Safety
/// `out` points to `max` writable completions (or max == 0).
unsafe fn write_out(v: &[Completion], out: *mut UsnetAsyncCompletion) {
    for (i, c) in v.iter().enumerate() {
        // SAFETY: i < v.len() <= max by the callers.
        unsafe { out.add(i).write(to_c(*c)) };
    }
}

/// Create the facility: a ring of `nentries` (power of two) entries and
/// `nexec` exec threads. NULL on failure with `errno` set.
#[no_mangle]
pub extern "C" fn usnet_async_init(nexec: u32, nentries: u32) -> *mut UsnetAsync {
    guard(ptr::null_mut(), || {
        match AsyncSyscall::new(nexec as usize, nentries) {
            Ok(inner) => Box::into_raw(Box::new(UsnetAsync { inner })),
            Err(e) => {
                // SAFETY: __errno_location is the thread's errno slot.
                unsafe { *libc::__errno_location() = -errno(&e) };
                ptr::null_mut()
            }
        }
    })
}

/// Queue one system call. 0, or -EAGAIN (no free entry), -ESHUTDOWN
/// (exiting), -EINVAL.
///
/// # Safety
/// `h` from `usnet_async_init`; `args` NULL (all zero) or 6 readable u64.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_submit(
    h: *mut UsnetAsync,
    num: i64,
    args: *const u64,
    user_data: u64,
) -> i32 {
    guard(-libc::EINVAL, || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -libc::EINVAL;
        };
        let mut a = [0u64; 6];
        if !args.is_null() {
            // SAFETY: caller provides 6 readable u64.
            a.copy_from_slice(unsafe { std::slice::from_raw_parts(args, 6) });
        }
        match h.inner.submit(num, a, user_data) {
            Ok(()) => 0,
            Err(e) => errno(&e),
        }
    })
}

/// Queue `n` calls with one submission; returns how many were queued (a
/// prefix), or a negative errno if none.
///
/// # Safety
/// `calls` points to `n` readable `usnet_async_call_t`.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_submit_batch(
    h: *mut UsnetAsync,
    calls: *const UsnetAsyncCall,
    n: u32,
) -> i32 {
    guard(-libc::EINVAL, || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -libc::EINVAL;
        };
        if n == 0 {
            return 0;
        }
        if calls.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: caller provides n readable calls.
        let src = unsafe { std::slice::from_raw_parts(calls, n as usize) };
        let mut v = Vec::with_capacity(src.len());
        for c in src {
            let Ok(num) = u32::try_from(c.num) else {
                return -libc::EINVAL;
            };
            v.push(Call {
                num,
                args: c.args,
                user_data: c.user_data,
            });
        }
        match h.inner.submit_batch(&v) {
            Ok(k) => k as i32,
            Err(e) => errno(&e),
        }
    })
}

fn reap_into(
    h: &mut UsnetAsync,
    out: *mut UsnetAsyncCompletion,
    max: u32,
    f: impl FnOnce(&AsyncSyscall, &mut Vec<Completion>) -> Result<usize, Error>,
) -> i32 {
    if max == 0 || out.is_null() {
        return -libc::EINVAL;
    }
    let mut v = Vec::new();
    let r = f(&h.inner, &mut v);
    // Anything beyond `max` cannot be handed out: never happens because the
    // closures reap at most `max`.
    debug_assert!(v.len() <= max as usize);
    // SAFETY: out has room for `max` >= v.len() completions (caller).
    unsafe { write_out(&v, out) };
    match r {
        Ok(_) => v.len() as i32,
        Err(e) if v.is_empty() => errno(&e),
        Err(_) => v.len() as i32,
    }
}

/// The document's wakeup: wake exec threads, wait until at least one call
/// completed, write up to `max` completions to `out`; returns the count
/// or a negative errno (-ENOENT nothing in flight, -EPIPE exited).
///
/// # Safety
/// `out` has room for `max` completions.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_wakeup(
    h: *mut UsnetAsync,
    out: *mut UsnetAsyncCompletion,
    max: u32,
) -> i32 {
    guard(-libc::EINVAL, || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -libc::EINVAL;
        };
        reap_into(h, out, max, |a, v| {
            if a.poll_batch(v, max as usize) == 0 {
                a.ring().wakeup_max(v, max as usize)?;
            }
            Ok(v.len())
        })
    })
}

/// Wait (up to `timeout_ns`, or forever if negative) for one completion.
/// 0 on success, -ETIMEDOUT, -ENOENT (nothing in flight), -EPIPE (exited).
///
/// # Safety
/// `out` points to one writable completion.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_wait_one(
    h: *mut UsnetAsync,
    out: *mut UsnetAsyncCompletion,
    timeout_ns: i64,
) -> i32 {
    guard(-libc::EINVAL, || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -libc::EINVAL;
        };
        if out.is_null() {
            return -libc::EINVAL;
        }
        let t = (timeout_ns >= 0).then(|| Duration::from_nanos(timeout_ns as u64));
        match h.inner.wait_one(t) {
            Ok(c) => {
                // SAFETY: out is writable (caller).
                unsafe { out.write(to_c(c)) };
                0
            }
            Err(e) => errno(&e),
        }
    })
}

/// Reap up to `max` completions without waiting; returns the count (0 if
/// none).
///
/// # Safety
/// `out` has room for `max` completions.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_poll(
    h: *mut UsnetAsync,
    out: *mut UsnetAsyncCompletion,
    max: u32,
) -> i32 {
    guard(-libc::EINVAL, || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -libc::EINVAL;
        };
        reap_into(h, out, max, |a, v| Ok(a.poll_batch(v, max as usize)))
    })
}

/// Calls submitted and not yet reaped.
///
/// # Safety
/// `h` from `usnet_async_init`.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_in_flight(h: *mut UsnetAsync) -> i32 {
    // SAFETY: contract of this function.
    unsafe { handle(h) }
        .map(|h| h.inner.ring().in_flight() as i32)
        .unwrap_or(-libc::EINVAL)
}

/// Protocol-violation counters.
///
/// # Safety
/// `out` points to one writable `usnet_async_errors_t`.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_errors(h: *mut UsnetAsync, out: *mut UsnetAsyncErrors) -> i32 {
    // SAFETY: contract of this function.
    let Some(h) = (unsafe { handle(h) }) else {
        return -libc::EINVAL;
    };
    if out.is_null() {
        return -libc::EINVAL;
    }
    let e = h.inner.errors();
    let c = UsnetAsyncErrors {
        bad_index: e.bad_index,
        bad_state: e.bad_state,
        unknown_state: e.unknown_state,
        bad_completion: e.bad_completion,
        queue_corrupt: e.queue_corrupt,
    };
    // SAFETY: writable per contract.
    unsafe { out.write(c) };
    0
}

/// The document's exit: stop and join the exec threads. `mode`
/// USNET_ASYNC_EXIT_DRAIN runs queued calls first, USNET_ASYNC_EXIT_CANCEL
/// completes them with -ECANCELED. Completions stay reapable; new submits
/// fail with -ESHUTDOWN. Returns the number of calls cancelled.
///
/// # Safety
/// `h` from `usnet_async_init`.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_exit(h: *mut UsnetAsync, mode: i32) -> i64 {
    guard(-(libc::EINVAL as i64), || {
        // SAFETY: contract of this function.
        let Some(h) = (unsafe { handle(h) }) else {
            return -(libc::EINVAL as i64);
        };
        let m = match mode {
            USNET_ASYNC_EXIT_DRAIN => ExitMode::Drain,
            USNET_ASYNC_EXIT_CANCEL => ExitMode::Cancel,
            _ => return -(libc::EINVAL as i64),
        };
        h.inner.exit(m).cancelled as i64
    })
}

/// Exit (cancel mode) if not done yet and free the handle. NULL is a no-op.
///
/// # Safety
/// `h` from `usnet_async_init`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn usnet_async_destroy(h: *mut UsnetAsync) {
    if !h.is_null() {
        // SAFETY: h came from Box::into_raw in usnet_async_init.
        guard((), || drop(unsafe { Box::from_raw(h) }));
    }
}
