//! Giving up root: `usnet up --user NAME` runs the stack server as an ordinary user
//! once everything that needs privileges is done (the link opened, the control
//! socket bound, the loops' nice values set), keeping only the capabilities it
//! still uses (`CAP_SYS_NICE` to boost clients with `--rx-policy priority`), with
//! `PR_SET_NO_NEW_PRIVS` and a seccomp allow-list of the system calls the running
//! server makes ([`ServerHandle::give_up_root`]).
//!
//! Capabilities are set with capset(2) directly rather than through a crate (`caps`
//! would do): the whole use is one structure and two calls, and the order around
//! the uid change (keep-caps on every thread that needs them first) is the part
//! that matters and the part a crate does not do for us.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;
use usnet_link::bpf::{op, seccomp, Asm};

/// The variable that makes a `usnet` process a [`Janitor`] for the stack it names.
pub const JANITOR_ENV: &str = "USNET_JANITOR";
/// The shm link the janitor removes when no stack holds it any more.
pub const JANITOR_SHM_ENV: &str = "USNET_JANITOR_SHM";

/// A process that keeps root when the server gives it up, to do what the server
/// can no longer do once it runs as an ordinary user, after it stops: remove its
/// control socket (and the rpc one) from root's run directory, give boosted
/// clients their priorities back (from the state file), and remove its shm link's
/// file from `/dev/shm` if no other stack holds the link. It waits for the end of a
/// pipe the server holds, so it acts however the server ends, `SIGKILL` included,
/// and it reads nothing from the server but that end (sshd's monitor, reduced to
/// clean-up). It lives in a process group of its own, so a terminal's Ctrl-C stops
/// the server, not it.
pub struct Janitor {
    _pipe: std::process::ChildStdin,
}

impl Janitor {
    /// Starts one for the stack `name` on the shm link `shm`, if it is on one
    /// (call while still root).
    pub fn spawn(name: &str, shm: Option<&str>) -> std::io::Result<Janitor> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.env(JANITOR_ENV, name);
        if let Some(link) = shm {
            cmd.env(JANITOR_SHM_ENV, link);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take().expect("stdin is piped");
        Ok(Janitor { _pipe: pipe })
    }
}

/// Call first in `main`: in a process started as a [`Janitor`], waits for its
/// server to end, cleans up after it and exits.
pub fn maybe_run_janitor() {
    let Some(name) = std::env::var_os(JANITOR_ENV) else {
        return;
    };
    let mut buf = [0u8; 64];
    let mut stdin = std::io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    crate::clean_up_after(&name.to_string_lossy());
    if let Some(link) = std::env::var_os(JANITOR_SHM_ENV) {
        usnet_link::shm::remove_if_unused(&link.to_string_lossy());
    }
    std::process::exit(0);
}

/// `CAP_SYS_NICE` (linux/capability.h): lowering another process's nice value.
pub const CAP_SYS_NICE: u32 = 23;

/// A user to become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub uid: u32,
    pub gid: u32,
}

/// Looks `user` up in the password database (a name, or a numeric uid).
pub fn lookup(user: &str) -> Result<Target, String> {
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let rc = match user.parse::<u32>() {
        // SAFETY: every pointer is to a live local of the size passed; the entry's
        // strings land in `buf`, which outlives the call.
        Ok(uid) => unsafe {
            libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut result)
        },
        Err(_) => {
            let c = CString::new(user).map_err(|_| format!("bad user name {user:?}"))?;
            // SAFETY: as above, with a NUL-terminated name.
            unsafe {
                libc::getpwnam_r(
                    c.as_ptr(),
                    &mut pw,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut result,
                )
            }
        }
    };
    if rc != 0 {
        return Err(format!(
            "cannot look up user {user}: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    if result.is_null() {
        return Err(format!("no user {user} (see /etc/passwd)"));
    }
    Ok(Target {
        uid: pw.pw_uid,
        gid: pw.pw_gid,
    })
}

/// Becomes `to` for good: no supplementary groups, its group, its user (glibc
/// applies each change to every thread of the process). Capabilities go with the
/// uid change, except on threads that set `PR_SET_KEEPCAPS` ([`keep_caps`]), which
/// keep their permitted set (not their effective one) for [`limit_caps`]. Check
/// with [`cannot_regain_root`] once that is done.
pub fn drop_to(to: &Target) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain system calls on integers (setgroups with an empty list).
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(os("setgroups"));
        }
        if libc::setresgid(to.gid, to.gid, to.gid) != 0 {
            return Err(os("setresgid"));
        }
        if libc::setresuid(to.uid, to.uid, to.uid) != 0 {
            return Err(os("setresuid"));
        }
    }
    Ok(())
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails if this thread can become root again.
pub fn cannot_regain_root() -> Result<(), String> {
    // SAFETY: plain system calls on integers.
    unsafe {
        if libc::setuid(0) == 0 || libc::geteuid() == 0 {
            return Err("root could be taken back".into());
        }
    }
    Ok(())
}

/// `PR_SET_KEEPCAPS` on the calling thread: whether its permitted capabilities
/// survive the uid change (they are cut down by [`limit_caps`] right after).
pub fn keep_caps(on: bool) -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, on as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_KEEPCAPS: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Sets the calling thread's capabilities to exactly `keep` (a mask of `1 << CAP_*`)
/// in its permitted and effective sets, none inheritable, none ambient, and clears
/// `PR_SET_KEEPCAPS`.
pub fn limit_caps(keep: u64) -> Result<(), String> {
    const V3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: V3,
        pid: 0,
    };
    let lo = Data {
        effective: keep as u32,
        permitted: keep as u32,
        inheritable: 0,
    };
    let hi = Data {
        effective: (keep >> 32) as u32,
        permitted: (keep >> 32) as u32,
        inheritable: 0,
    };
    let data = [lo, hi];
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: capset reads a header and two data words (version 3), both live
    // locals; prctl takes integers.
    unsafe {
        if libc::syscall(libc::SYS_capset, &mut h as *mut Header, data.as_ptr()) != 0 {
            return Err(os("capset"));
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) != 0
        {
            return Err(os("clearing ambient capabilities"));
        }
    }
    keep_caps(false)
}

/// Sets `PR_SET_NO_NEW_PRIVS` on the calling thread (the seccomp filter's
/// `SECCOMP_FILTER_FLAG_TSYNC` passes it on to every thread): no execve can
/// grant privileges again (set-user-id files, file capabilities).
pub fn no_new_privs() -> Result<(), String> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The system calls a running server makes (its loops, its control thread, the
/// built-in services and the rpc proxy in the same process), found by tracing
/// `usnet up` through the interop scenarios (`strace -f` after the uid change:
/// docs/server.md, "Giving up root"), the hot ones first. `socket` (AF_UNIX only)
/// and `ioctl` (a few fd requests) are checked apart.
#[cfg(target_arch = "x86_64")]
const ALLOWED: &[libc::c_long] = &[
    // The loops: the device, the doorbells, sleeping and time.
    libc::SYS_futex,
    libc::SYS_futex_waitv,
    libc::SYS_ppoll,
    libc::SYS_poll,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_sched_yield,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    // The control thread: clients, their sessions' memory and descriptors.
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_memfd_create,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fcntl,
    libc::SYS_eventfd2,
    libc::SYS_close,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    // The booster and the boost state file (/proc/PID, the run directory), the
    // control socket's removal at exit.
    libc::SYS_openat,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_rename,
    libc::SYS_renameat2,
    // Memory and threads.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getrandom,
    libc::SYS_prlimit64,
    libc::SYS_prctl,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    // Signals (SIGINT/SIGTERM, glibc's own between threads).
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_restart_syscall,
];

/// The ioctl requests allowed: descriptor flags only (no terminal requests such as
/// `TIOCSTI`).
#[cfg(target_arch = "x86_64")]
const IOCTLS: &[u32] = &[
    libc::FIONBIO as u32,
    libc::FIONREAD as u32,
    libc::FIOCLEX as u32,
    libc::FIONCLEX as u32,
    libc::TCGETS as u32,
];

/// The seccomp program: on x86_64 (checked: `seccomp_data.arch`, and no x32
/// calls), the calls in the allow-list pass; `socket` for AF_UNIX only; `ioctl` for
/// a few descriptor requests; anything else fails with `EPERM`. Not
/// `SECCOMP_RET_KILL`: a rare call missing from the list fails as a call, and the
/// server says why, instead of taking every client's stack down. `None` on other
/// architectures (the list is x86_64's).
pub fn allow_list() -> Option<Vec<libc::sock_filter>> {
    #[cfg(target_arch = "x86_64")]
    {
        use Asm::*;
        const X32: u32 = 0x4000_0000;
        let deny = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let mut p = vec![
            Stmt(op::LD_W_ABS, seccomp::ARCH),
            Jump(op::JEQ_K, seccomp::AUDIT_ARCH?, None, Some("deny")),
            Stmt(op::LD_W_ABS, seccomp::NR),
            Jump(op::JGE_K, X32, Some("deny"), None),
            Jump(op::JEQ_K, libc::SYS_socket as u32, Some("socket"), None),
            Jump(op::JEQ_K, libc::SYS_ioctl as u32, Some("ioctl"), None),
        ];
        p.extend(
            ALLOWED
                .iter()
                .map(|&nr| Jump(op::JEQ_K, nr as u32, Some("allow"), None)),
        );
        p.extend([
            Label("deny"),
            Stmt(op::RET_K, deny),
            Label("socket"),
            Stmt(op::LD_W_ABS, seccomp::arg_lo(0)),
            Jump(
                op::JEQ_K,
                libc::AF_UNIX as u32,
                Some("allow"),
                Some("deny2"),
            ),
            Label("ioctl"),
            Stmt(op::LD_W_ABS, seccomp::arg_lo(1)),
        ]);
        p.extend(
            IOCTLS
                .iter()
                .map(|&r| Jump(op::JEQ_K, r, Some("allow"), None)),
        );
        p.extend([
            Label("deny2"),
            Stmt(op::RET_K, deny),
            Label("allow"),
            Stmt(op::RET_K, libc::SECCOMP_RET_ALLOW),
        ]);
        Some(usnet_link::bpf::assemble(&p))
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Installs `prog` ([`allow_list`]) on every thread of the process
/// (`SECCOMP_FILTER_FLAG_TSYNC`, which also passes on no_new_privs). Allocates
/// nothing: usable in a forked child.
pub fn install_filter(prog: &[libc::sock_filter]) -> Result<(), i32> {
    seccomp::install(
        prog,
        libc::SECCOMP_FILTER_FLAG_TSYNC | libc::SECCOMP_FILTER_FLAG_TSYNC_ESRCH,
    )
    .map(|_| ())
}

/// How [`ServerHandle::give_up_root`] leaves the server.
#[derive(Debug, Clone, Copy, Default)]
pub struct Keep {
    /// Capabilities kept (a mask of `1 << CAP_*`): `CAP_SYS_NICE` to boost
    /// clients with `--rx-policy priority`, else none.
    pub caps: u64,
    /// Install the seccomp allow-list (`usnet up --no-seccomp` leaves it out).
    pub seccomp: bool,
}

impl crate::ServerHandle {
    /// Runs the server as `to` from now on (see the module's doc): the loops, which
    /// boost clients, and this thread keep `keep.caps` across the uid change; every
    /// other thread keeps nothing. Then no_new_privs, and the seccomp filter on every
    /// thread. An error leaves the process in an unknown state: exit.
    pub fn give_up_root(&self, to: &Target, keep: Keep) -> Result<(), String> {
        const T: Duration = Duration::from_secs(5);
        let on_loops = |f: fn() -> Result<(), String>| -> Result<(), String> {
            for k in 0..self.shards() {
                self.call_on(k, T, move |_| f())
                    .ok_or_else(|| format!("shard {k}'s loop did not answer"))??;
            }
            Ok(())
        };
        let caps = keep.caps;
        if caps != 0 {
            on_loops(|| keep_caps(true))?;
            keep_caps(true)?;
        }
        drop_to(to)?;
        if caps != 0 {
            for k in 0..self.shards() {
                self.call_on(k, T, move |_| limit_caps(caps))
                    .ok_or_else(|| format!("shard {k}'s loop did not answer"))??;
            }
        }
        limit_caps(caps)?;
        if to.uid != 0 {
            cannot_regain_root()?;
            on_loops(cannot_regain_root)?;
        }
        no_new_privs()?;
        if keep.seccomp {
            let prog = allow_list()
                .ok_or("no seccomp allow-list for this architecture (use --no-seccomp)")?;
            install_filter(&prog)
                .map_err(|e| format!("seccomp: {}", std::io::Error::from_raw_os_error(e)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_found_by_name_and_by_uid() {
        let root = lookup("root").unwrap();
        assert_eq!(root, Target { uid: 0, gid: 0 });
        assert_eq!(lookup("0").unwrap(), root);
        assert!(lookup("no-such-user-here").unwrap_err().contains("no user"));
        assert!(lookup("a\0b").is_err());
    }

    /// The allow-list the server installs, tried in a forked child (the filter is
    /// for good): forbidden calls fail with EPERM, allowed ones work, and the child
    /// lives on to say so. Bit i of the exit code is check i failing.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_seccomp_filter_refuses_what_the_server_does_not_call() {
        let prog = allow_list().unwrap();
        let path = CString::new("/bin/false").unwrap();
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null::<libc::c_char>()];
        // SAFETY: the child makes only raw system calls (nothing allocates or
        // takes a lock) and leaves with _exit; the parent reaps it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: raw calls on live locals (the program, the path, argv/envp
            // built before the fork); null pointers where the call takes them.
            unsafe {
                if install_filter(&prog).is_err() {
                    libc::_exit(0xff);
                }
                let eperm = |r: libc::c_long| r == -1 && *libc::__errno_location() == libc::EPERM;
                let mut bad = 0;
                // Forbidden: running a program, a network socket, tracing, mounting,
                // a terminal request.
                if !eperm(libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) as _) {
                    bad |= 1;
                }
                if !eperm(libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) as _) {
                    bad |= 2;
                }
                if !eperm(libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0)) {
                    bad |= 4;
                }
                let none = std::ptr::null();
                if !eperm(libc::mount(none, none, none, 0, std::ptr::null()) as _) {
                    bad |= 8;
                }
                if !eperm(libc::ioctl(0, libc::TIOCSTI, none as *const u8) as _) {
                    bad |= 16;
                }
                // Allowed: what the server does.
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 || libc::close(fd) != 0 {
                    bad |= 32;
                }
                let efd = libc::eventfd(0, 0);
                if efd < 0 || libc::write(efd, [1u64].as_ptr().cast(), 8) != 8 {
                    bad |= 64;
                }
                if libc::getpid() <= 0 {
                    bad |= 128;
                }
                libc::_exit(bad);
            }
        }
        // Reap it within a deadline (nothing waits without one).
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child with a live status word.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                break;
            }
            if std::time::Instant::now() > end {
                // SAFETY: our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("the filtered child did not exit");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            libc::WIFEXITED(status),
            "the child died: status {status:#x}"
        );
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "checks that failed (bits: execve, socket AF_INET, ptrace, mount, TIOCSTI, \
             socket AF_UNIX, eventfd, getpid; 0xff: the filter was refused)"
        );
    }

    #[test]
    fn capabilities_are_limited_to_the_kept_set() {
        // In a thread of its own: capabilities are per thread.
        std::thread::spawn(|| {
            if !is_root() {
                return;
            }
            limit_caps(1 << CAP_SYS_NICE).unwrap();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let st = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
            let f = |k: &str| {
                st.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap()
                    .trim()
                    .to_string()
            };
            assert_eq!(f("CapEff:"), "0000000000800000");
            assert_eq!(f("CapPrm:"), "0000000000800000");
            assert_eq!(f("CapInh:"), "0000000000000000");
            assert_eq!(f("CapAmb:"), "0000000000000000");
        })
        .join()
        .unwrap();
    }
}
