//! Classic BPF programs, built by hand: the instruction encodings the kernel takes
//! (`struct sock_filter`), with jump targets named by labels instead of counted by
//! hand, and the programs usnet installs. Written here rather than taken from a
//! crate: the programs are a dozen instructions, and the one that steers shards must
//! match `usnet_wire::steer::link_queue` (re-exported by `usnet_stack::shard`) bit for bit (tested below through an
//! interpreter of the same instructions).

/// Opcodes (`linux/filter.h`): class | size | mode, class | op | source.
pub mod op {
    pub const LD_W_ABS: u16 = 0x20;
    pub const LD_H_ABS: u16 = 0x28;
    pub const LD_B_ABS: u16 = 0x30;
    pub const LD_H_IND: u16 = 0x48;
    pub const LD_MEM: u16 = 0x60;
    pub const LDX_MEM: u16 = 0x61;
    pub const LDX_B_MSH: u16 = 0xb1;
    pub const ST: u16 = 0x02;
    pub const ALU_XOR_X: u16 = 0xac;
    pub const ALU_MUL_K: u16 = 0x24;
    pub const ALU_RSH_K: u16 = 0x74;
    pub const JA: u16 = 0x05;
    pub const JEQ_K: u16 = 0x15;
    pub const JGE_K: u16 = 0x35;
    pub const JSET_K: u16 = 0x45;
    pub const RET_K: u16 = 0x06;
    pub const RET_A: u16 = 0x16;
    pub const TAX: u16 = 0x07;
    pub const TXA: u16 = 0x87;
}

/// Ancillary load offset of `skb->protocol` (`SKF_AD_OFF + SKF_AD_PROTOCOL`): the
/// EtherType, in host order, whatever the packet's headers.
pub const AD_PROTOCOL: u32 = 0xffff_f000;

/// A statement with no jump.
pub fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// A conditional jump with offsets counted from the next instruction.
pub fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// One instruction of a program under construction: jumps name labels.
#[derive(Clone, Copy)]
pub enum Asm {
    Stmt(u16, u32),
    /// A conditional jump to `jt` if true, `jf` if false (labels; `None`: next).
    Jump(u16, u32, Option<&'static str>, Option<&'static str>),
    /// An unconditional jump.
    Ja(&'static str),
    Label(&'static str),
}

/// Resolves labels into offsets. Panics on an unknown label or a jump too far for
/// its field: programs are constants, so that is a bug caught by any test.
pub fn assemble(src: &[Asm]) -> Vec<libc::sock_filter> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for a in src {
        match a {
            Asm::Label(l) => {
                at.insert(*l, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    let off = |pc: usize, l: Option<&'static str>| -> u32 {
        match l {
            None => 0,
            Some(l) => {
                let to = *at.get(l).unwrap_or_else(|| panic!("no label {l}"));
                assert!(to > pc, "backward jump to {l}");
                (to - pc - 1) as u32
            }
        }
    };
    for a in src {
        let pc = out.len();
        match *a {
            Asm::Label(_) => {}
            Asm::Stmt(code, k) => out.push(stmt(code, k)),
            Asm::Jump(code, k, t, f) => {
                let (t, f) = (off(pc, t), off(pc, f));
                assert!(t <= 255 && f <= 255, "jump too far");
                out.push(jump(code, k, t as u8, f as u8));
            }
            Asm::Ja(l) => out.push(stmt(op::JA, off(pc, Some(l)))),
        }
    }
    out
}

/// Seccomp filters: what a filter program reads and how one is installed. The one
/// place usnet installs seccomp programs (the stack server's allow-list,
/// `usnet_server::privs`, and packetdrill's trap of `getsockopt`).
pub mod seccomp {
    /// `AUDIT_ARCH_*` of this target, which a filter compares with
    /// `seccomp_data.arch` before trusting the system call number.
    #[cfg(target_arch = "x86_64")]
    pub const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
    #[cfg(target_arch = "aarch64")]
    pub const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const AUDIT_ARCH: Option<u32> = None;

    /// Offsets in `struct seccomp_data`: the call's number, the architecture, and
    /// argument `i`'s low 32 bits (these targets are little-endian).
    pub const NR: u32 = 0;
    pub const ARCH: u32 = 4;
    pub const fn arg_lo(i: u32) -> u32 {
        16 + 8 * i
    }

    /// Sets `PR_SET_NO_NEW_PRIVS` and installs `prog` with `flags`
    /// (`SECCOMP_FILTER_FLAG_*`). Returns what seccomp(2) returns (a listener fd
    /// with `SECCOMP_FILTER_FLAG_NEW_LISTENER`, else 0) or the errno. Makes no
    /// allocation, so a child between fork and exec may call it.
    pub fn install(prog: &[libc::sock_filter], flags: libc::c_ulong) -> Result<i32, i32> {
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prctl takes integer arguments; seccomp reads the program through
        // `fprog`, which points to `prog`, alive for the call.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(*libc::__errno_location());
            }
            let r = libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &fprog as *const libc::sock_fprog,
            );
            if r < 0 {
                return Err(*libc::__errno_location());
            }
            Ok(r as i32)
        }
    }
}

/// The AF_PACKET fanout program that steers each received frame to a shard
/// (`PACKET_FANOUT_CBPF`; the kernel takes the result modulo the group's size).
/// Loads are relative to the network header, where a fanout program sees the
/// packet. For unfragmented TCP and UDP over IPv4 and IPv6 (no extension headers):
/// the destination port (our local port) when it is ephemeral, else
/// `((source ^ destination) * 0x9e3779b1) >> 16`; 0 for everything else. This is
/// `usnet_stack::shard::link_queue_value`.
pub fn shard_steering() -> Vec<libc::sock_filter> {
    use op::*;
    use Asm::*;
    assemble(&[
        Stmt(LD_H_ABS, AD_PROTOCOL),
        Jump(JEQ_K, 0x0800, None, Some("v6")),
        // IPv4: fragments (MF or an offset) go to 0.
        Stmt(LD_H_ABS, 6),
        Jump(JSET_K, 0x3fff, Some("zero"), None),
        Stmt(LD_B_ABS, 9),
        Jump(JEQ_K, 6, Some("tcp4"), None),
        Jump(JEQ_K, 17, None, Some("zero")),
        Label("tcp4"),
        Stmt(LDX_B_MSH, 0),
        Stmt(LD_H_IND, 2),
        Stmt(ST, 0),
        Stmt(LD_H_IND, 0),
        Ja("ports"),
        Label("v6"),
        Jump(JEQ_K, 0x86dd, None, Some("zero")),
        Stmt(LD_B_ABS, 6),
        Jump(JEQ_K, 6, Some("tcp6"), None),
        Jump(JEQ_K, 17, None, Some("zero")),
        Label("tcp6"),
        Stmt(LD_H_ABS, 42),
        Stmt(ST, 0),
        Stmt(LD_H_ABS, 40),
        // A = source port, M[0] = destination port.
        Label("ports"),
        Stmt(LDX_MEM, 0),
        Stmt(ALU_XOR_X, 0),
        Stmt(ALU_MUL_K, 0x9e37_79b1),
        Stmt(ALU_RSH_K, 16),
        Stmt(TAX, 0),
        Stmt(LD_MEM, 0),
        Jump(JGE_K, 49152, Some("ret"), None),
        Stmt(TXA, 0),
        Label("ret"),
        Stmt(RET_A, 0),
        Label("zero"),
        Stmt(RET_K, 0),
    ])
}

/// The AF_PACKET socket filter of a stack beside the host on one interface: a frame
/// whose destination is `mac`, or a group address (broadcast, multicast: ARP and
/// neighbour discovery reach both), is taken whole; any other (the host's own
/// unicast traffic) returns 0, so the kernel drops it for this socket before it
/// copies a byte into the ring. Runs on the frame from its Ethernet header (a
/// `SOCK_RAW` socket's filter does).
pub fn frames_for(mac: [u8; 6]) -> Vec<libc::sock_filter> {
    use op::*;
    use Asm::*;
    let hi = u32::from_be_bytes([mac[0], mac[1], mac[2], mac[3]]);
    let lo = u32::from(u16::from_be_bytes([mac[4], mac[5]]));
    assemble(&[
        Stmt(LD_W_ABS, 0),
        Jump(JEQ_K, hi, None, Some("group")),
        Stmt(LD_H_ABS, 4),
        Jump(JEQ_K, lo, Some("take"), Some("group")),
        Label("group"),
        Stmt(LD_B_ABS, 0),
        Jump(JSET_K, 1, Some("take"), None),
        Stmt(RET_K, 0),
        Label("take"),
        Stmt(RET_K, u32::MAX),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the instructions the programs here use, as the kernel does: a load past
    /// the packet's end ends the program with 0. `pkt` starts at the network header;
    /// `proto` is `skb->protocol`.
    fn run(prog: &[libc::sock_filter], proto: u16, pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut m) = (0u32, 0u32, [0u32; 16]);
        let mut pc = 0usize;
        let byte = |at: u32| pkt.get(at as usize).copied().map(u32::from);
        let half = |at: u32| Some(byte(at)? << 8 | byte(at + 1)?);
        loop {
            let i = prog[pc];
            pc += 1;
            let k = i.k;
            let jmp = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
            match i.code {
                op::LD_H_ABS if k == AD_PROTOCOL => a = u32::from(proto),
                op::LD_W_ABS => match (half(k), half(k + 2)) {
                    (Some(h), Some(l)) => a = h << 16 | l,
                    _ => return 0,
                },
                op::LD_H_ABS => match half(k) {
                    Some(v) => a = v,
                    None => return 0,
                },
                op::LD_B_ABS => match byte(k) {
                    Some(v) => a = v,
                    None => return 0,
                },
                op::LD_H_IND => match half(x + k) {
                    Some(v) => a = v,
                    None => return 0,
                },
                op::LDX_B_MSH => match byte(k) {
                    Some(v) => x = (v & 0xf) * 4,
                    None => return 0,
                },
                op::ST => m[k as usize] = a,
                op::LD_MEM => a = m[k as usize],
                op::LDX_MEM => x = m[k as usize],
                op::ALU_XOR_X => a ^= x,
                op::ALU_MUL_K => a = a.wrapping_mul(k),
                op::ALU_RSH_K => a >>= k,
                op::TAX => x = a,
                op::TXA => a = x,
                op::JA => pc += k as usize,
                op::JEQ_K => pc += jmp(a == k),
                op::JGE_K => pc += jmp(a >= k),
                op::JSET_K => pc += jmp(a & k != 0),
                op::RET_A => return a,
                op::RET_K => return k,
                c => panic!("opcode {c:#x} not interpreted"),
            }
        }
    }

    fn frame(ethertype: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    /// A seeded generator of packets that exercise every branch: IPv4 with and
    /// without options and fragments, IPv6, TCP, UDP, ICMP, ARP, truncation.
    fn packets() -> Vec<(u16, Vec<u8>)> {
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut out = Vec::new();
        for i in 0..20_000 {
            let r = rnd();
            let proto = [6u8, 17, 1, 58, 47][(r % 5) as usize];
            let ports = rnd();
            let (sport, dport) = if r & 0x100 != 0 {
                (ports as u16, 49152 + (ports >> 16) as u16 % 16384)
            } else {
                (ports as u16, (ports >> 16) as u16)
            };
            let (ethertype, mut l3) = match i % 3 {
                0 | 1 => {
                    let ihl = 5 + (r >> 9) as u8 % 3;
                    let mut h = vec![0u8; usize::from(ihl) * 4];
                    h[0] = 0x40 | ihl;
                    h[9] = proto;
                    let frag: u16 = match (r >> 12) % 4 {
                        0 => 0x2000,
                        1 => 0x0010,
                        2 => 0x4000,
                        _ => 0,
                    };
                    h[6..8].copy_from_slice(&frag.to_be_bytes());
                    h[16..20].copy_from_slice(&[10, 0, 0, 2]);
                    (0x0800u16, h)
                }
                _ => {
                    let mut h = vec![0u8; 40];
                    h[0] = 0x60;
                    h[6] = proto;
                    h[24] = 0xfd;
                    (0x86dd, h)
                }
            };
            l3.extend_from_slice(&sport.to_be_bytes());
            l3.extend_from_slice(&dport.to_be_bytes());
            l3.extend_from_slice(&[0u8; 16]);
            // Cut some short, some inside the ports.
            let cut = match (r >> 20) % 8 {
                0 => (r >> 24) as usize % l3.len(),
                _ => l3.len(),
            };
            l3.truncate(cut);
            let ethertype = if (r >> 28) % 16 == 0 {
                0x0806
            } else {
                ethertype
            };
            out.push((ethertype, l3));
        }
        out
    }

    #[test]
    fn the_mac_filter_takes_frames_for_the_stack_and_group_frames_only() {
        let ours = [0x02, 0x5e, 0x10, 0x20, 0x30, 0x41];
        let prog = frames_for(ours);
        let to = |dst: [u8; 6]| {
            let mut f = dst.to_vec();
            f.extend_from_slice(&[0x02, 0, 0, 0, 0, 9, 0x08, 0x00]);
            f.extend_from_slice(&[0x45; 40]);
            f
        };
        assert_eq!(run(&prog, 0x0800, &to(ours)), u32::MAX);
        assert_eq!(run(&prog, 0x0806, &to([0xff; 6])), u32::MAX, "broadcast");
        let mcast6 = [0x33, 0x33, 0xff, 0x20, 0x30, 0x41];
        assert_eq!(run(&prog, 0x86dd, &to(mcast6)), u32::MAX, "multicast");
        // The host's unicast, and addresses that share one half of ours.
        for other in [
            [0x02, 0, 0, 0, 0, 1],
            [0x02, 0x5e, 0x10, 0x20, 0x30, 0x40],
            [0x02, 0x5e, 0x10, 0x21, 0x30, 0x41],
            [0x00, 0x5e, 0x10, 0x20, 0x30, 0x41],
        ] {
            assert_eq!(run(&prog, 0x0800, &to(other)), 0, "{other:x?}");
        }
        assert_eq!(run(&prog, 0x0800, &ours[..5]), 0, "cut short");
    }

    #[test]
    fn the_fanout_program_steers_as_the_stack_expects() {
        let prog = shard_steering();
        assert!(prog.len() < 64);
        for (ethertype, l3) in packets() {
            let f = frame(ethertype, &l3);
            let want = usnet_stack::shard::link_queue_value(&f);
            assert_eq!(run(&prog, ethertype, &l3), want, "{ethertype:#x} {l3:02x?}");
            for n in 1..=8usize {
                assert_eq!(
                    run(&prog, ethertype, &l3) as usize % n,
                    usnet_stack::shard::link_queue(&f, n)
                );
            }
        }
    }

    #[test]
    fn labels_resolve_forward() {
        let p = assemble(&[
            Asm::Jump(op::JEQ_K, 1, Some("b"), None),
            Asm::Stmt(op::RET_K, 1),
            Asm::Label("b"),
            Asm::Stmt(op::RET_K, 2),
        ]);
        assert_eq!((p[0].jt, p[0].jf), (1, 0));
        assert_eq!(p.len(), 3);
    }
}
