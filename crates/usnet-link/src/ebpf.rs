//! eBPF programs assembled by hand: the instruction encoding (`struct bpf_insn`), a
//! tiny assembler with forward jumps to labels, and the TAP steering program. Written
//! here rather than compiled from C: the programs are a few dozen instructions built
//! at run time (the XDP program takes the stack's addresses as immediates), so
//! nothing needs clang, libbpf or an ELF loader, and the steering program must match
//! `usnet_wire::steer::link_queue` bit for bit (checked in the kernel by the tests).
//! The XDP program is `crate::xdp::prog`; the bpf(2) commands are
//! `crate::xdp::bpf`.

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// The 8 bytes the kernel reads, as a little-endian word: code, dst (low nibble) |
    /// src (high nibble), offset, immediate.
    pub fn encode(&self) -> u64 {
        let regs = (self.dst & 0x0f) | (self.src << 4);
        u64::from(self.code)
            | u64::from(regs) << 8
            | u64::from(self.off as u16) << 16
            | u64::from(self.imm as u32) << 32
    }
}

// Opcode parts (linux/bpf_common.h, linux/bpf.h).
pub const BPF_LD: u8 = 0x00;
pub const BPF_LDX: u8 = 0x01;
pub const BPF_ALU: u8 = 0x04;
pub const BPF_JMP: u8 = 0x05;
pub const BPF_JMP32: u8 = 0x06;
pub const BPF_ALU64: u8 = 0x07;
pub const BPF_W: u8 = 0x00;
pub const BPF_H: u8 = 0x08;
pub const BPF_B: u8 = 0x10;
pub const BPF_DW: u8 = 0x18;
pub const BPF_IMM: u8 = 0x00;
pub const BPF_ABS: u8 = 0x20;
pub const BPF_IND: u8 = 0x40;
pub const BPF_MEM: u8 = 0x60;
pub const BPF_K: u8 = 0x00;
pub const BPF_X: u8 = 0x08;
pub const BPF_ADD: u8 = 0x00;
pub const BPF_MUL: u8 = 0x20;
pub const BPF_AND: u8 = 0x50;
pub const BPF_LSH: u8 = 0x60;
pub const BPF_RSH: u8 = 0x70;
pub const BPF_XOR: u8 = 0xa0;
pub const BPF_MOV: u8 = 0xb0;
pub const BPF_JA: u8 = 0x00;
pub const BPF_JEQ: u8 = 0x10;
pub const BPF_JGT: u8 = 0x20;
pub const BPF_JGE: u8 = 0x30;
pub const BPF_JNE: u8 = 0x50;
pub const BPF_CALL: u8 = 0x80;
pub const BPF_EXIT: u8 = 0x90;
/// ld_imm64's source register that makes the immediate a map fd.
pub const BPF_PSEUDO_MAP_FD: u8 = 1;

/// A tiny assembler: instructions plus forward jumps to labels of type `L`, patched
/// when their label is placed.
pub struct Asm<L> {
    insns: Vec<Insn>,
    fixups: Vec<(usize, L)>,
    labels: Vec<(L, usize)>,
}

impl<L> Default for Asm<L> {
    fn default() -> Self {
        Asm {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: Vec::new(),
        }
    }
}

impl<L: Copy + PartialEq> Asm<L> {
    pub fn push(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
    }
    pub fn mov64_reg(&mut self, dst: u8, src: u8) {
        self.push(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0);
    }
    pub fn mov64_imm(&mut self, dst: u8, imm: i32) {
        self.push(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm);
    }
    pub fn add64_imm(&mut self, dst: u8, imm: i32) {
        self.push(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm);
    }
    /// A 32-bit ALU operation with an immediate (the result zero-extended).
    pub fn alu32_imm(&mut self, op: u8, dst: u8, imm: i32) {
        self.push(BPF_ALU | op | BPF_K, dst, 0, 0, imm);
    }
    /// A 32-bit ALU operation with a register.
    pub fn alu32_reg(&mut self, op: u8, dst: u8, src: u8) {
        self.push(BPF_ALU | op | BPF_X, dst, src, 0, 0);
    }
    pub fn ldx(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.push(BPF_LDX | size | BPF_MEM, dst, src, off, 0);
    }
    /// r0 = the packet's bytes at `off` (socket filters: from `skb->data`), in host
    /// order; the program ends returning 0 if they are past the end. Uses r6 as the
    /// context and clobbers r1..r5.
    pub fn ld_abs(&mut self, size: u8, off: i32) {
        self.push(BPF_LD | size | BPF_ABS, 0, 0, 0, off);
    }
    /// r0 = the packet's bytes at `src + off`, as [`Asm::ld_abs`].
    pub fn ld_ind(&mut self, size: u8, src: u8, off: i32) {
        self.push(BPF_LD | size | BPF_IND, 0, src, 0, off);
    }
    pub fn ld_map_fd(&mut self, dst: u8, fd: i32) {
        self.push(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd);
        self.push(0, 0, 0, 0, 0);
    }
    /// A conditional or unconditional jump to `to`, patched later.
    pub fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: L) {
        self.fixups.push((self.insns.len(), to));
        self.push(code, dst, src, 0, imm);
    }
    pub fn ja(&mut self, to: L) {
        self.jump(BPF_JMP | BPF_JA, 0, 0, 0, to);
    }
    /// if (u32)dst != imm goto to
    pub fn jne32(&mut self, dst: u8, imm: u32, to: L) {
        self.jump(BPF_JMP32 | BPF_JNE | BPF_K, dst, 0, imm as i32, to);
    }
    /// if (u32)dst == imm goto to
    pub fn jeq32(&mut self, dst: u8, imm: u32, to: L) {
        self.jump(BPF_JMP32 | BPF_JEQ | BPF_K, dst, 0, imm as i32, to);
    }
    /// if (u32)dst >= imm goto to (unsigned)
    pub fn jge32(&mut self, dst: u8, imm: u32, to: L) {
        self.jump(BPF_JMP32 | BPF_JGE | BPF_K, dst, 0, imm as i32, to);
    }
    /// if dst > src goto to (unsigned, 64-bit)
    pub fn jgt_reg(&mut self, dst: u8, src: u8, to: L) {
        self.jump(BPF_JMP | BPF_JGT | BPF_X, dst, src, 0, to);
    }
    pub fn call(&mut self, helper: i32) {
        self.push(BPF_JMP | BPF_CALL, 0, 0, 0, helper);
    }
    pub fn exit(&mut self) {
        self.push(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
    }
    pub fn place(&mut self, l: L) {
        self.labels.push((l, self.insns.len()));
    }
    /// Resolves every jump; `None` if a label was never placed or a jump went
    /// backwards (the programs have no loops).
    pub fn finish(mut self) -> Option<Vec<Insn>> {
        for &(at, l) in &self.fixups {
            let target = self.labels.iter().find(|(m, _)| *m == l)?.1;
            let off = target.checked_sub(at + 1)?;
            self.insns[at].off = i16::try_from(off).ok()?;
        }
        Some(self.insns)
    }
}

/// Labels of the TAP steering program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steer {
    V4,
    V4Ports,
    V6,
    V6Ports,
    Mix,
    Ports,
    Zero,
}

/// The TAP steering program (`TUNSETSTEERINGEBPF`, a socket filter the kernel runs on
/// each frame it sends into the TAP; the queue is its return value modulo the queue
/// count): `usnet_wire::steer::link_queue_value` in eBPF. It reads the frame from its
/// Ethernet header (a TAP's `skb->data` on transmit) with the legacy packet loads,
/// whose bounds the kernel checks (a frame too short ends the program with 0, as the
/// Rust function gives 0 for it).
pub fn tap_steering() -> Vec<Insn> {
    use Steer::*;
    let mut a = Asm::<Steer>::default();
    a.mov64_reg(6, 1); // r6 = ctx, for the packet loads
    a.ld_abs(BPF_H, 12);
    a.jeq32(0, 0x0800, V4);
    a.jeq32(0, 0x86dd, V6);
    a.ja(Zero);

    a.place(V4);
    // A fragment (more fragments, or an offset) has no ports to read.
    a.ld_abs(BPF_H, 14 + 6);
    a.alu32_imm(BPF_AND, 0, 0x3fff);
    a.jne32(0, 0, Zero);
    a.ld_abs(BPF_B, 14 + 9);
    a.jeq32(0, 6, V4Ports);
    a.jeq32(0, 17, V4Ports);
    a.ja(Zero);
    a.place(V4Ports);
    a.ld_abs(BPF_B, 14);
    a.alu32_imm(BPF_AND, 0, 0x0f);
    a.alu32_imm(BPF_LSH, 0, 2);
    a.mov64_reg(7, 0); // r7 = IPv4 header length
    a.ld_ind(BPF_H, 7, 14);
    a.mov64_reg(8, 0); // r8 = source port (the remote's)
    a.ld_ind(BPF_H, 7, 16);
    a.mov64_reg(9, 0); // r9 = destination port (ours)
    a.ja(Ports);

    a.place(V6);
    a.ld_abs(BPF_B, 14 + 6);
    a.jeq32(0, 6, V6Ports);
    a.jeq32(0, 17, V6Ports);
    a.ja(Zero);
    a.place(V6Ports);
    a.ld_abs(BPF_H, 14 + 40);
    a.mov64_reg(8, 0);
    a.ld_abs(BPF_H, 14 + 42);
    a.mov64_reg(9, 0);

    // flow_value(local = r9, remote = r8)
    a.place(Ports);
    a.jge32(9, u32::from(usnet_wire::steer::EPHEMERAL_FIRST), Mix);
    a.alu32_reg(BPF_XOR, 9, 8);
    a.alu32_imm(BPF_MUL, 9, 0x9e37_79b1_u32 as i32);
    a.alu32_imm(BPF_RSH, 9, 16);
    a.place(Mix); // (an ephemeral port is its own value)
    a.mov64_reg(0, 9);
    a.exit();

    a.place(Zero);
    a.mov64_imm(0, 0);
    a.exit();
    a.finish()
        .expect("every label is placed, every jump goes forward")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_program_ends_in_exits_and_its_jumps_land_inside() {
        let p = tap_steering();
        let n = p.len();
        assert_eq!(p[n - 1].code, BPF_JMP | BPF_EXIT);
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            let op = insn.code & 0xf0;
            if (class == BPF_JMP || class == BPF_JMP32) && op != BPF_CALL && op != BPF_EXIT {
                let to = i as i64 + 1 + i64::from(insn.off);
                assert!(to > i as i64 && (to as usize) < n, "jump {i} to {to}");
            }
        }
    }

    /// Frames of every kind the steering function distinguishes.
    fn frames() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let eth = |ty: u16, payload: &[u8]| {
            let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
            f.extend_from_slice(&ty.to_be_bytes());
            f.extend_from_slice(payload);
            f
        };
        let ports = [
            (80u16, 49152u16),
            (40000, 80),
            (80, 40000),
            (443, 65535),
            (1, 2),
            (65535, 49151),
            (12345, 54321),
            (0, 0),
        ];
        for &(src, dst) in &ports {
            for proto in [6u8, 17, 1] {
                for (ihl, frag) in [(5u8, 0u16), (6, 0), (15, 0x4000), (5, 0x2000), (5, 0x0001)] {
                    let mut ip = vec![0x40 | ihl, 0, 0, 0, 0, 0];
                    ip.extend_from_slice(&frag.to_be_bytes());
                    ip.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
                    ip.resize(usize::from(ihl) * 4, 1);
                    ip.extend_from_slice(&src.to_be_bytes());
                    ip.extend_from_slice(&dst.to_be_bytes());
                    ip.extend_from_slice(&[0; 16]);
                    out.push(eth(0x0800, &ip));
                }
                let mut ip6 = vec![0x60, 0, 0, 0, 0, 24, proto, 64];
                ip6.extend_from_slice(&[0; 32]);
                ip6.extend_from_slice(&src.to_be_bytes());
                ip6.extend_from_slice(&dst.to_be_bytes());
                ip6.extend_from_slice(&[0; 20]);
                out.push(eth(0x86dd, &ip6));
            }
        }
        // ARP, a VLAN tag, frames cut short before their ports.
        out.push(eth(0x0806, &[0; 28]));
        out.push(eth(0x8100, &[0; 40]));
        let whole = out[0].clone();
        for cut in [13, 20, 35, 36] {
            out.push(whole[..cut].to_vec());
        }
        out
    }

    /// The program, loaded into the kernel, returns what the Rust function does on
    /// every frame (root: loading a program needs CAP_BPF).
    #[test]
    fn the_kernel_runs_the_tap_program_as_the_rust_function_computes() {
        if !crate::sys::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let prog = crate::xdp::bpf::load_socket_filter(&tap_steering(), "usnet_test_tap")
            .unwrap_or_else(|(e, log)| panic!("load: {e}\n{log}"));
        let mut values = std::collections::HashSet::new();
        for f in frames() {
            if f.len() < 14 {
                continue; // the test run wants a whole Ethernet header
            }
            let got = crate::xdp::bpf::test_run_skb(&prog, &f).unwrap();
            values.insert(got);
            assert_eq!(
                got,
                usnet_wire::steer::link_queue_value(&f),
                "frame {:02x?}",
                &f[..f.len().min(60)]
            );
        }
        // Ephemeral ports, mixed ports and zeros all came out.
        assert!(
            values.contains(&49152) && values.contains(&0) && values.len() >= 6,
            "{values:?}"
        );
    }
}
