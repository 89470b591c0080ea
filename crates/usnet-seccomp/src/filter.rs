//! The BPF program the supervised process installs: which calls reach the
//! supervisor (SECCOMP_RET_USER_NOTIF) and which go straight to the kernel.
//!
//! Relays live at fixed descriptor ranges because a filter can see numbers, not
//! files: datagram relays in [DGRAM_BASE, STREAM_BASE), where data calls are
//! notified too (each datagram carries an address a Unix pair cannot), stream
//! relays from STREAM_BASE up, where only socket-level calls are.

use libc::sock_filter;

pub const DGRAM_BASE: u32 = 256;
pub const STREAM_BASE: u32 = 384;

#[cfg(target_arch = "x86_64")]
const ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// Calls on a socket as a whole: notified for any relay.
pub const SOCKET_LEVEL: &[libc::c_long] = &[
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_shutdown,
];

/// Calls that move data: notified only for datagram relays.
pub const DATA: &[libc::c_long] = usnet_posix::DATA_SYSCALLS;

#[derive(Clone, Copy)]
enum To {
    Next,
    Allow,
    Notify,
    At(usize),
}

struct Ins {
    code: u16,
    k: u32,
    jt: To,
    jf: To,
}

const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

// Offsets in struct seccomp_data.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARG0_LO: u32 = 16; // little-endian: the low word of args[0]

fn ld(off: u32) -> Ins {
    Ins {
        code: LD_W_ABS,
        k: off,
        jt: To::Next,
        jf: To::Next,
    }
}
fn jeq(k: u32, jt: To, jf: To) -> Ins {
    Ins {
        code: JEQ,
        k,
        jt,
        jf,
    }
}
fn jge(k: u32, jt: To, jf: To) -> Ins {
    Ins {
        code: JGE,
        k,
        jt,
        jf,
    }
}

/// The program, ending in its two returns (allow, notify).
pub fn program() -> Vec<sock_filter> {
    let mut p: Vec<Ins> = Vec::new();
    p.push(ld(OFF_ARCH));
    p.push(jeq(ARCH, To::Next, To::Allow));
    p.push(ld(OFF_NR));
    // Placeholders for the three blocks, patched below once their starts are known.
    let socket_at = p.len();
    p.push(jeq(libc::SYS_socket as u32, To::Next, To::Next));
    let level_at = p.len();
    for nr in SOCKET_LEVEL {
        p.push(jeq(*nr as u32, To::Next, To::Next));
    }
    let data_at = p.len();
    for nr in DATA {
        p.push(jeq(*nr as u32, To::Next, To::Next));
    }
    p.push(Ins {
        code: RET,
        k: libc::SECCOMP_RET_ALLOW,
        jt: To::Next,
        jf: To::Next,
    });
    // socket(AF_INET | AF_INET6 | AF_NETLINK, ...)
    let socket_block = p.len();
    p.push(ld(OFF_ARG0_LO));
    p.push(jeq(libc::AF_INET as u32, To::Notify, To::Next));
    p.push(jeq(libc::AF_INET6 as u32, To::Notify, To::Next));
    p.push(jeq(libc::AF_NETLINK as u32, To::Notify, To::Allow));
    // Socket-level calls on any relay.
    let level_block = p.len();
    p.push(ld(OFF_ARG0_LO));
    p.push(jge(DGRAM_BASE, To::Notify, To::Allow));
    // Data calls on a datagram relay.
    let data_block = p.len();
    p.push(ld(OFF_ARG0_LO));
    p.push(jge(STREAM_BASE, To::Allow, To::Next));
    p.push(jge(DGRAM_BASE, To::Notify, To::Allow));
    p[socket_at].jt = To::At(socket_block);
    for ins in &mut p[level_at..data_at] {
        ins.jt = To::At(level_block);
    }
    for ins in &mut p[data_at..data_at + DATA.len()] {
        ins.jt = To::At(data_block);
    }
    let allow = p.len();
    let notify = allow + 1;
    p.push(Ins {
        code: RET,
        k: libc::SECCOMP_RET_ALLOW,
        jt: To::Next,
        jf: To::Next,
    });
    p.push(Ins {
        code: RET,
        k: libc::SECCOMP_RET_USER_NOTIF,
        jt: To::Next,
        jf: To::Next,
    });
    let off = |i: usize, t: To| -> u8 {
        let to = match t {
            To::Next => i + 1,
            To::Allow => allow,
            To::Notify => notify,
            To::At(j) => j,
        };
        u8::try_from(to - (i + 1)).expect("a BPF jump within 255")
    };
    p.iter()
        .enumerate()
        .map(|(i, ins)| sock_filter {
            code: ins.code,
            jt: if ins.code == JEQ || ins.code == JGE {
                off(i, ins.jt)
            } else {
                0
            },
            jf: if ins.code == JEQ || ins.code == JGE {
                off(i, ins.jf)
            } else {
                0
            },
            k: ins.k,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BPF interpreter for the instructions `program` uses, to check what it
    /// decides for a call without installing it.
    fn run(p: &[sock_filter], arch: u32, nr: u32, arg0: u32) -> u32 {
        let word = |off: u32| match off {
            OFF_NR => nr,
            OFF_ARCH => arch,
            OFF_ARG0_LO => arg0,
            _ => panic!("load of {off}"),
        };
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = &p[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => a = word(i.k),
                JEQ => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                JGE => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
                RET => return i.k,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    #[test]
    fn only_relay_calls_reach_the_supervisor() {
        let p = program();
        let n = libc::SECCOMP_RET_USER_NOTIF;
        let y = libc::SECCOMP_RET_ALLOW;
        let s = |nr: libc::c_long, a: u32| run(&p, ARCH, nr as u32, a);
        assert_eq!(s(libc::SYS_socket, libc::AF_INET as u32), n);
        assert_eq!(s(libc::SYS_socket, libc::AF_INET6 as u32), n);
        assert_eq!(s(libc::SYS_socket, libc::AF_NETLINK as u32), n);
        assert_eq!(s(libc::SYS_socket, libc::AF_UNIX as u32), y);
        assert_eq!(s(libc::SYS_connect, 3), y);
        assert_eq!(s(libc::SYS_connect, DGRAM_BASE), n);
        assert_eq!(s(libc::SYS_connect, STREAM_BASE + 5), n);
        assert_eq!(s(libc::SYS_read, STREAM_BASE + 5), y);
        assert_eq!(s(libc::SYS_read, DGRAM_BASE + 5), n);
        assert_eq!(s(libc::SYS_sendto, DGRAM_BASE - 1), y);
        assert_eq!(s(libc::SYS_openat, DGRAM_BASE), y);
        assert_eq!(run(&p, 0x4000_0003, libc::SYS_socket as u32, 2), y);
    }
}
