//! The few bpf(2) commands usnet needs: an XSKMAP, loading the AF_XDP steering
//! program (and the TAP steering program, a socket filter), attaching the XDP program
//! to an interface through a BPF link, and (for tests) running a program on a frame. Each command's part of `union bpf_attr` is a `#[repr(C)]` struct
//! laid out as in `<linux/bpf.h>`; the kernel takes the size we pass and treats the
//! rest of the union as zero.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::ebpf::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`: BPF_XDP.
const BPF_XDP: u32 = 37;
const BPF_OBJ_NAME_LEN: usize = 16;

/// `XDP_FLAGS_SKB_MODE`: generic XDP, run on the socket buffer after the driver.
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP, run by the driver before any socket buffer.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; BPF_OBJ_NAME_LEN],
}

#[repr(C)]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; BPF_OBJ_NAME_LEN],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// bpf(cmd, attr, sizeof attr).
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised #[repr(C)] struct laid out like the
    // command's part of `union bpf_attr`, and its exact size is passed; every pointer
    // inside it points at memory that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_from(r: libc::c_long) -> OwnedFd {
    // SAFETY: the bpf() commands called with this return a new descriptor (created
    // O_CLOEXEC by the kernel) that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as libc::c_int) }
}

fn name16(name: &str) -> [u8; BPF_OBJ_NAME_LEN] {
    let mut n = [0u8; BPF_OBJ_NAME_LEN];
    // Object names allow [A-Za-z0-9_.], at most 15 bytes.
    for (d, s) in n
        .iter_mut()
        .zip(
            name.bytes()
                .filter(|c| c.is_ascii_alphanumeric() || *c == b'_'),
        )
        .take(BPF_OBJ_NAME_LEN - 1)
    {
        *d = s;
    }
    n
}

/// An XSKMAP with `entries` slots (key: RX queue index, value: an AF_XDP socket fd).
pub fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut a = MapCreate {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        map_name: name16("usnet_xsks"),
        ..MapCreate::default()
    };
    bpf(BPF_MAP_CREATE, &mut a).map(fd_from)
}

/// Sets `map[key] = value` (both u32).
pub fn map_update_u32(map: &OwnedFd, key: u32, value: u32) -> io::Result<()> {
    let (k, v) = (key, value);
    let mut a = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: &k as *const u32 as u64,
        value: &v as *const u32 as u64,
        ..MapElem::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// Removes `map[key]`.
pub fn map_delete_u32(map: &OwnedFd, key: u32) -> io::Result<()> {
    let k = key;
    let mut a = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: &k as *const u32 as u64,
        ..MapElem::default()
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut a).map(|_| ())
}

/// Loads an XDP program. On failure the error carries the verifier's log.
pub fn load_xdp(insns: &[Insn], name: &str) -> Result<OwnedFd, (io::Error, String)> {
    load(BPF_PROG_TYPE_XDP, BPF_XDP, insns, name)
}

/// Loads a socket filter program (what `TUNSETSTEERINGEBPF` takes). On failure the
/// error carries the verifier's log.
pub fn load_socket_filter(insns: &[Insn], name: &str) -> Result<OwnedFd, (io::Error, String)> {
    load(BPF_PROG_TYPE_SOCKET_FILTER, 0, insns, name)
}

fn load(
    prog_type: u32,
    expected_attach_type: u32,
    insns: &[Insn],
    name: &str,
) -> Result<OwnedFd, (io::Error, String)> {
    let license = c"Dual MIT/GPL";
    let words: Vec<u64> = insns.iter().map(|i| i.encode()).collect();
    let mut a = ProgLoad {
        prog_type,
        insn_cnt: words.len() as u32,
        insns: words.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16(name),
        expected_attach_type,
        ..ProgLoad::default()
    };
    match bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(fd_from(fd)),
        Err(first) => {
            // Load again with the verifier's log, to say why.
            let mut log = vec![0u8; 64 * 1024];
            a.log_level = 1;
            a.log_size = log.len() as u32;
            a.log_buf = log.as_mut_ptr() as u64;
            match bpf(BPF_PROG_LOAD, &mut a) {
                Ok(fd) => Ok(fd_from(fd)),
                Err(_) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    Err((first, String::from_utf8_lossy(&log[..end]).into_owned()))
                }
            }
        }
    }
}

/// Attaches `prog` to interface `ifindex` through a BPF link (`flags`: native or
/// generic mode). The program stays attached exactly as long as the returned
/// descriptor (or a duplicate of it) is open: closing it, or the death of the process
/// however it happens, detaches the program.
pub fn link_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let mut a = LinkCreate {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
    };
    bpf(BPF_LINK_CREATE, &mut a).map(fd_from)
}

/// Runs `prog` once on `frame` (BPF_PROG_TEST_RUN, RX queue 0); returns the XDP
/// action. For tests: it shows what the loaded program decides.
pub fn test_run_xdp(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    test_run(prog, frame)
}

/// BPF_PROG_TEST_RUN once on `frame`; the program's return value.
fn test_run(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    let mut out = vec![0u8; frame.len() + 512];
    let mut a = TestRun {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..TestRun::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut a).map(|_| a.retval)
}

/// Runs a socket filter `prog` once on an Ethernet `frame` (BPF_PROG_TEST_RUN) and
/// returns its value. The test run strips an Ethernet header before the program
/// sees the packet (`eth_type_trans`), while a TAP's steering program sees the frame
/// from its Ethernet header: so a dummy header goes in front. For tests.
pub fn test_run_skb(prog: &OwnedFd, frame: &[u8]) -> io::Result<u32> {
    let mut input = vec![0u8; 14];
    input[0] = 0x02; // a unicast MAC
    input[12..14].copy_from_slice(&[0x08, 0x00]);
    input.extend_from_slice(frame);
    test_run(prog, &input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_match_linux_bpf_h() {
        assert_eq!(std::mem::offset_of!(MapCreate, map_name), 28);
        assert_eq!(std::mem::offset_of!(MapElem, key), 8);
        assert_eq!(std::mem::offset_of!(MapElem, flags), 24);
        assert_eq!(std::mem::offset_of!(ProgLoad, log_buf), 32);
        assert_eq!(std::mem::offset_of!(ProgLoad, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoad, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(LinkCreate, flags), 12);
        assert_eq!(std::mem::offset_of!(TestRun, ctx_in), 48);
        assert_eq!(std::mem::offset_of!(TestRun, batch_size), 72);
    }

    #[test]
    fn object_names_are_short_and_clean() {
        assert_eq!(&name16("usnet-xdp:veth0.1")[..], b"usnetxdpveth01\0\0");
        assert_eq!(name16("a_very_long_program_name")[15], 0);
    }
}
