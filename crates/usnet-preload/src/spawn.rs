//! The program's start and the programs it starts.
//!
//! - **At start** (a constructor, before `main`): sockets inherited across `exec`
//!   are taken over (`usnet_posix::inherit`; the mechanism is in usnet-posix's
//!   `exec` module), and the shim's settings are noted.
//! - **`posix_spawn`, `posix_spawnp`, `system`, `popen`** start a program without
//!   running fork handlers: the session's sockets are pinned for it first
//!   (`usnet_posix::pin_for_spawn`), so that a parent that closes its copy right
//!   after the call cannot close the socket before the program has claimed it.
//! - **`execve`, `execvpe`, `posix_spawn`, `posix_spawnp`**: a program that builds
//!   the environment of what it starts (sshd, `env -i`, systemd-style launchers)
//!   may leave out `LD_PRELOAD` and `USNET_*`; the shim puts back the ones that
//!   are missing, so the new program is on usnet too and can take its sockets
//!   over.
//! - **`execv`, `execvp`, `execl`, `execlp`, `system`, `popen`** start a program on
//!   the process's own environment through glibc's internal calls. A program may
//!   have emptied it (postfix's `clean_env` sets `environ[0] = NULL`; others call
//!   `clearenv`): the shim puts the missing settings back into it first.
//!   `execl`, `execlp` and `execle` are C-variadic, so they are written in C
//!   (src/execl.c) and reached through naked Rust functions (a cdylib exports only
//!   what Rust defines).
//! - **The loader's secure mode**: a program the kernel starts with other privileges
//!   than its caller's real ones (set-user-ID, or exec'd with an effective uid not
//!   the real one) gets no preload named by a path. Before an exec of such a
//!   program the shim says so, unless it is preloaded by its bare name from the
//!   loader's trusted directory (`usnet shim install`); a shim loaded that way in
//!   secure mode puts `LD_PRELOAD`, which glibc removed, back in the environment.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use usnet_posix::secure_exec::{self, SHIM_FILE};

use super::{enter, env_is};

/// The variables that make a program run on usnet, as this program got them.
const SETTINGS: &[&str] = &[
    "LD_PRELOAD",
    "USNET_STACK",
    "USNET_RUN_DIR",
    "USNET_FALLBACK",
    "USNET_LOOPBACK",
    "USNET_DEBUG",
];

fn settings() -> &'static Vec<CString> {
    static S: OnceLock<Vec<CString>> = OnceLock::new();
    S.get_or_init(|| {
        SETTINGS
            .iter()
            .filter_map(|k| {
                let v = std::env::var_os(k)?;
                let mut kv = format!("{k}=").into_bytes();
                kv.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()));
                CString::new(kv).ok()
            })
            .collect()
    })
}

extern "C" fn at_start() {
    if env_is("USNET_PRELOAD", "off") {
        return;
    }
    let Some(_g) = enter() else {
        return;
    };
    // In the loader's secure mode the shim can only have come by its bare name from
    // the trusted directory (`usnet shim install`), and glibc took `LD_PRELOAD` out
    // of the environment: put it back, so the programs this one starts are on usnet
    // too.
    // SAFETY: getauxval has no preconditions; setenv runs before main, one thread.
    if unsafe { libc::getauxval(libc::AT_SECURE) } != 0 && std::env::var_os("LD_PRELOAD").is_none()
    {
        std::env::set_var("LD_PRELOAD", SHIM_FILE);
    }
    settings();
    usnet_posix::inherit();
    // A program exec'd with a connection on 0 and 1 (inetd style) reads and
    // writes it through stdio.
    for fd in 0..=2 {
        crate::stdio::follow(fd);
    }
}

#[used]
#[link_section = ".init_array"]
static AT_START: extern "C" fn() = at_start;

/// `envp` with the settings it lacks added (`None`: it lacks none).
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings.
unsafe fn completed(envp: *const *const c_char) -> Option<Vec<*const c_char>> {
    let mut have = Vec::new();
    if !envp.is_null() {
        let mut p = envp;
        // SAFETY: the caller's contract: a null-terminated array of C strings.
        unsafe {
            while !(*p).is_null() {
                have.push(*p);
                p = p.add(1);
            }
        }
    }
    let name_of = |s: &[u8]| s.split(|&b| b == b'=').next().map(<[u8]>::to_vec);
    let missing: Vec<&CString> = settings()
        .iter()
        .filter(|kv| {
            let k = name_of(kv.as_bytes());
            // SAFETY: each entry is a C string (the caller's contract).
            !have
                .iter()
                .any(|&e| name_of(unsafe { CStr::from_ptr(e) }.to_bytes()) == k)
        })
        .collect();
    if missing.is_empty() {
        return None;
    }
    let mut out = have;
    out.extend(missing.iter().map(|kv| kv.as_ptr()));
    out.push(std::ptr::null());
    Some(out)
}

/// Runs `f` with `envp` completed (see the module's text).
unsafe fn with_settings<R>(
    envp: *const *const c_char,
    f: impl FnOnce(*const *const c_char) -> R,
) -> R {
    let Some(_g) = enter() else {
        return f(envp);
    };
    // SAFETY: passed on from the caller (libc's contract for envp).
    match unsafe { completed(envp) } {
        Some(v) => f(v.as_ptr()),
        None => f(envp),
    }
}

/// Whether the shim is preloaded by its bare name (the loader's trusted copy), which
/// the loader takes in its secure mode too.
fn preloaded_by_name() -> bool {
    settings().iter().any(|kv| {
        kv.to_bytes().strip_prefix(b"LD_PRELOAD=").is_some_and(|v| {
            v.split(|&b| b == b' ' || b == b':')
                .any(|e| e == SHIM_FILE.as_bytes())
        })
    })
}

/// Says once, before `file` (a path, or a name looked up in `PATH`) is started, that
/// the loader will start it in its secure mode and so leave the shim out, unless
/// the shim comes by its bare name.
///
/// # Safety
/// `file` is null or a C string.
unsafe fn say_if_loader_drops_shim(file: *const c_char) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if file.is_null() || SAID.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Some(_g) = enter() else {
        return;
    };
    if env_is("USNET_PRELOAD", "off") || preloaded_by_name() {
        return;
    }
    // SAFETY: the caller's contract.
    let name = unsafe { CStr::from_ptr(file) };
    let name = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    let Some(why) = secure_exec::find_program(name).and_then(|p| secure_exec::reason(&p)) else {
        return;
    };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!(
            "usnet-preload: {} starts in the dynamic loader's secure mode ({why}), which ignores a preload path: its sockets will be the kernel's unless the shim is installed where the loader takes it (`usnet shim install`, as root)",
            name.display()
        );
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let real =
        real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's contract, passed on.
    unsafe {
        say_if_loader_drops_shim(path);
        with_settings(envp, |e| real(path, argv, e))
    }
}

/// The settings this program started with put back in its own environment where
/// it lacks them: before `execv`, `execvp` (and `execl`, `execlp` through them),
/// `system` and `popen`, which start a program on the process's environment
/// through glibc's internal calls. A program may have emptied it in place
/// (postfix's `clean_env` sets `environ[0] = NULL`) or with `clearenv`.
fn put_back_settings() {
    let Some(_g) = enter() else {
        return;
    };
    for kv in settings() {
        let b = kv.to_bytes();
        let Some(eq) = b.iter().position(|&c| c == b'=') else {
            continue;
        };
        let (Ok(k), Ok(v)) = (CString::new(&b[..eq]), CString::new(&b[eq + 1..])) else {
            continue;
        };
        // SAFETY: NUL-terminated strings; overwrite 0 keeps a value the program set.
        unsafe { libc::setenv(k.as_ptr(), v.as_ptr(), 0) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let real = real!(execv: fn(*const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's contract, passed on.
    unsafe {
        say_if_loader_drops_shim(path);
        put_back_settings();
        real(path, argv)
    }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let real = real!(execvp: fn(*const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's contract, passed on.
    unsafe {
        say_if_loader_drops_shim(file);
        put_back_settings();
        real(file, argv)
    }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let real =
        real!(execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's contract, passed on.
    unsafe {
        say_if_loader_drops_shim(file);
        with_settings(envp, |e| real(file, argv, e))
    }
}

// `execl`, `execlp` and `execle` are C-variadic: src/execl.c gathers their
// arguments and calls the wrapped execv, execvp and execve. Each exported name is a
// naked function that jumps there with the caller's registers and stack untouched.
extern "C" {
    fn usnet_execl();
    fn usnet_execlp();
    fn usnet_execle();
}

macro_rules! jump_to {
    ($name:ident, $target:ident) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {}", sym $target);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {}", sym $target);
        }
    };
}
jump_to!(execl, usnet_execl);
jump_to!(execlp, usnet_execlp);
jump_to!(execle, usnet_execle);

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *const c_char,
    *const *const c_char,
) -> c_int;

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: libc's definition of this very function.
    let real: SpawnFn = unsafe { std::mem::transmute::<usize, SpawnFn>(next_of!(posix_spawn)) };
    // SAFETY: libc's contract: a C string.
    unsafe { say_if_loader_drops_shim(path) };
    let pin = pinned();
    // SAFETY: libc's contract, passed on.
    let r = unsafe { with_settings(envp, |e| real(pid, path, actions, attr, argv, e)) };
    unpin(pin);
    r
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: libc's definition of this very function.
    let real: SpawnFn = unsafe { std::mem::transmute::<usize, SpawnFn>(next_of!(posix_spawnp)) };
    // SAFETY: libc's contract: a C string.
    unsafe { say_if_loader_drops_shim(file) };
    let pin = pinned();
    // SAFETY: libc's contract, passed on.
    let r = unsafe { with_settings(envp, |e| real(pid, file, actions, attr, argv, e)) };
    unpin(pin);
    r
}

/// The sockets pinned for a program about to be spawned (nothing inside the shim).
fn pinned() -> Option<usnet_posix::SpawnPin> {
    let _g = enter()?;
    Some(usnet_posix::pin_for_spawn())
}

/// Our copy of the pin goes once the program was started: closed as the layer's own
/// descriptor (the shim's `close` keeps the layer's descriptors open for the
/// program's closes).
fn unpin(pin: Option<usnet_posix::SpawnPin>) {
    let _g = enter();
    usnet_client::lineage::as_layer(|| drop(pin));
}

#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    let real = real!(system: fn(*const c_char) -> c_int);
    put_back_settings();
    let pin = if command.is_null() { None } else { pinned() };
    // SAFETY: libc's contract, passed on.
    let r = unsafe { real(command) };
    unpin(pin);
    r
}

#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    let real = real!(popen: fn(*const c_char, *const c_char) -> *mut libc::FILE);
    put_back_settings();
    let pin = pinned();
    // SAFETY: libc's contract, passed on.
    let r = unsafe { real(command, mode) };
    unpin(pin);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_without_the_settings_gets_them() {
        let _ = settings();
        let a = CString::new("A=1").unwrap();
        let env = [a.as_ptr(), std::ptr::null()];
        // SAFETY: a null-terminated array of C strings.
        let got = unsafe { completed(env.as_ptr()) };
        match (settings().is_empty(), got) {
            (true, None) => {}
            (false, Some(v)) => {
                assert_eq!(v.len(), 2 + settings().len());
                assert!(v.last().unwrap().is_null());
            }
            (empty, got) => panic!("settings empty: {empty}, completed: {got:?}"),
        }
        // An environment that has every setting is passed as it is.
        let mut full: Vec<*const c_char> = settings().iter().map(|s| s.as_ptr()).collect();
        full.push(std::ptr::null());
        // SAFETY: as above.
        assert!(unsafe { completed(full.as_ptr()) }.is_none());
    }
}
