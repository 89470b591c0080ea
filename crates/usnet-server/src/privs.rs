//! Giving up root: `usnet up --user NAME` runs the stack server as an ordinary user
//! once everything that needs privileges is done (the link opened, the control
//! socket bound, the loops' nice values set).

use std::ffi::CString;

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
/// applies each change to every thread of the process), and checks that root cannot
/// be taken back. Capabilities go with the uid change (no `PR_SET_KEEPCAPS`).
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
        if to.uid != 0 && (libc::setuid(0) == 0 || libc::geteuid() == 0) {
            return Err("root could be taken back".into());
        }
    }
    Ok(())
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
}
