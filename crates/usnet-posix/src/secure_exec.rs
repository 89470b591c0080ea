//! Whether a program this process starts runs in the dynamic loader's secure mode
//! (`AT_SECURE`), where the loader ignores a preload library named by a path.
//!
//! Linux (`cap_bprm_creds_from_file`) marks an `exec` secure when the new program's
//! effective uid is not the caller's real uid, or its effective gid not the real gid,
//! or, for a caller that is not root, when file capabilities raise it. So a process
//! running with an effective id not its real one (a root daemon's child that took a
//! service user's effective uid) starts every program in secure mode, and anyone
//! starts a set-user-ID, set-group-ID or file-capability program in it, unless
//! `no_new_privs` is set or the file system is mounted `nosuid`. The shim and
//! `usnet run` use this to say so instead of leaving a program on the kernel
//! without a word (docs/preload.md, "Programs in the loader's secure mode").

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The shim's file name: what `LD_PRELOAD` names, without a path, when the loader's
/// trusted copy is used (`usnet shim install`).
pub const SHIM_FILE: &str = "libusnet_preload.so";

/// Why the loader would start `program` in its secure mode if this process exec'd
/// it, or `None` if it would not (or `program` cannot be looked at).
pub fn reason(program: &Path) -> Option<String> {
    let (mut ruid, mut euid, mut suid) = (0, 0, 0);
    let (mut rgid, mut egid, mut sgid) = (0, 0, 0);
    // SAFETY: out-pointers to locals.
    unsafe {
        libc::getresuid(&mut ruid, &mut euid, &mut suid);
        libc::getresgid(&mut rgid, &mut egid, &mut sgid);
    }
    if euid != ruid {
        return Some(format!("effective uid {euid}, real uid {ruid}"));
    }
    if egid != rgid {
        return Some(format!("effective gid {egid}, real gid {rgid}"));
    }
    // SAFETY: a query with no pointers.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1;
    let meta = std::fs::metadata(program).ok()?;
    if nnp || nosuid_mount(program) {
        return None;
    }
    let mode = meta.mode();
    if mode & libc::S_ISUID != 0 && meta.uid() != ruid {
        return Some(format!("set-user-ID {}", meta.uid()));
    }
    // A set-group-ID bit without group execute is mandatory locking's mark, not a
    // change of group.
    if mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && meta.gid() != rgid {
        return Some(format!("set-group-ID {}", meta.gid()));
    }
    if ruid != 0 && has_file_capabilities(program) {
        return Some("file capabilities".into());
    }
    None
}

/// `file` as `execvp` finds it: itself if it has a `/`, else the first executable
/// match in `PATH` (glibc's default path if `PATH` is unset).
pub fn find_program(file: &Path) -> Option<PathBuf> {
    if file.as_os_str().as_bytes().contains(&b'/') {
        return Some(file.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(file))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

fn nosuid_mount(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and an out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0) && st.f_flag & libc::ST_NOSUID != 0
}

fn has_file_capabilities(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: NUL-terminated strings; a size query (no buffer).
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_program_is_not_secure_and_a_set_user_id_one_of_another_owner_is() {
        use std::os::unix::fs::PermissionsExt;
        let sh = find_program(Path::new("sh")).expect("sh in PATH");
        // The test runs with its real ids as its effective ones.
        assert_eq!(reason(&sh), None);
        let dir = std::env::temp_dir().join(format!("usnet-secure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4755)).unwrap();
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        // Owned by this user: exec keeps the effective uid, not secure.
        assert_eq!(reason(&f), None);
        if me == 0 && !nosuid_mount(&f) {
            // (chown clears the set-user-ID bit: set it again.)
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4755)).unwrap();
            let r = reason(&f).expect("set-user-ID nobody is secure for root");
            assert!(r.contains("set-user-ID 65534"), "{r}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
