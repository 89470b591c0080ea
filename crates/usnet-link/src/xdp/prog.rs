//! The XDP program that steers the stack's frames to its AF_XDP socket, assembled by
//! hand: a few dozen eBPF instructions, built at run time with the stack's MAC and
//! addresses as immediates, so nothing needs a C compiler, libbpf or an ELF loader.
//!
//! What it does with each frame arriving on the interface:
//! - destination MAC = the stack's: **redirect** to the socket of the frame's RX
//!   queue (`bpf_redirect_map(xsks, rx_queue_index, fallback)`);
//! - broadcast ARP whose target protocol address is one of the stack's IPv4
//!   addresses: redirect;
//! - IPv6 multicast to the solicited-node group (33:33:ff:xx:xx:xx) of one of the
//!   stack's IPv6 addresses (neighbour solicitations for it): redirect;
//! - anything else (the host's own unicast, ARP and NDP for the host's addresses, all
//!   other broadcast and multicast): `XDP_PASS`, so the host's traffic on the
//!   interface keeps flowing.
//!
//! When no socket is in the map for the queue (not bound yet, or another queue), the
//! redirect falls back to `fallback` (`XDP_PASS` in service): the frame goes to Linux
//! as if there were no program. Tests build it with `XDP_DROP` as the fallback, so a
//! redirect attempt is visible in `BPF_PROG_TEST_RUN`'s return value.

use std::net::{Ipv4Addr, Ipv6Addr};

/// XDP actions.
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

use crate::ebpf::{Asm, Insn, BPF_H, BPF_W};

/// Helper number of `bpf_redirect_map`.
const FN_REDIRECT_MAP: i32 = 51;

// `struct xdp_md` field offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE: i16 = 16;

/// Jump targets inside the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    NotOurs,
    Multicast,
    Redirect,
    Pass,
    /// The next candidate of a list (local to one comparison).
    Next(usize),
}

/// What the program steers to the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steering {
    /// The stack's MAC.
    pub mac: [u8; 6],
    /// Targets of ARP requests the stack answers.
    pub ipv4: Vec<Ipv4Addr>,
    /// Addresses whose neighbour solicitations the stack answers (the link-local one
    /// derived from `mac` is added by [`Steering::solicited_macs`]).
    pub ipv6: Vec<Ipv6Addr>,
    /// Action when no socket is bound for the frame's queue: `XDP_PASS` in service.
    pub fallback: u32,
}

/// At most this many IPv4 and this many IPv6 addresses (the program stays short).
pub const MAX_ADDRS: usize = 64;

impl Steering {
    /// The solicited-node multicast MACs (33:33:ff + the low 24 bits of the address)
    /// of the stack's IPv6 addresses and of its EUI-64 link-local address, without
    /// duplicates.
    pub fn solicited_macs(&self) -> Vec<[u8; 6]> {
        let m = self.mac;
        let mut out = vec![[0x33, 0x33, 0xff, m[3], m[4], m[5]]];
        for a in &self.ipv6 {
            let o = a.octets();
            let mac = [0x33, 0x33, 0xff, o[13], o[14], o[15]];
            if !out.contains(&mac) {
                out.push(mac);
            }
        }
        out
    }
}

/// Reads bytes 0..4 of a MAC as the program's little-endian 32-bit load does.
fn lo32(m: &[u8; 6]) -> u32 {
    u32::from_le_bytes([m[0], m[1], m[2], m[3]])
}

/// Bytes 4..6 as a little-endian 16-bit load.
fn hi16(m: &[u8; 6]) -> u32 {
    u32::from(u16::from_le_bytes([m[4], m[5]]))
}

/// Builds the steering program for the XSKMAP `map_fd`. `None` when there are too
/// many addresses.
pub fn steering_program(s: &Steering, map_fd: i32) -> Option<Vec<Insn>> {
    if s.ipv4.len() > MAX_ADDRS || s.ipv6.len() > MAX_ADDRS {
        return None;
    }
    let mut a = Asm::<Label>::default();
    // r6 = ctx; r2 = data; r3 = data_end
    a.mov64_reg(6, 1);
    a.ldx(BPF_W, 2, 6, MD_DATA);
    a.ldx(BPF_W, 3, 6, MD_DATA_END);
    // A whole Ethernet header, or pass.
    a.mov64_reg(4, 2);
    a.add64_imm(4, 14);
    a.jgt_reg(4, 3, Label::Pass);
    // r4 = destination MAC bytes 0..4, r5 = bytes 4..6
    a.ldx(BPF_W, 4, 2, 0);
    a.ldx(BPF_H, 5, 2, 4);
    a.jne32(4, lo32(&s.mac), Label::NotOurs);
    a.jne32(5, hi16(&s.mac), Label::NotOurs);
    a.ja(Label::Redirect);

    // Broadcast: ARP for one of our IPv4 addresses.
    a.place(Label::NotOurs);
    a.jne32(4, u32::MAX, Label::Multicast);
    a.jne32(5, 0xffff, Label::Pass);
    if s.ipv4.is_empty() {
        a.ja(Label::Pass);
    } else {
        a.ldx(BPF_H, 7, 2, 12);
        a.jne32(7, u32::from(u16::from_le_bytes([0x08, 0x06])), Label::Pass);
        // Ethernet (14) + ARP for IPv4 over Ethernet (28): the target protocol
        // address is the last 4 bytes.
        a.mov64_reg(7, 2);
        a.add64_imm(7, 42);
        a.jgt_reg(7, 3, Label::Pass);
        a.ldx(BPF_W, 7, 2, 38);
        for ip in &s.ipv4 {
            a.jeq32(7, u32::from_le_bytes(ip.octets()), Label::Redirect);
        }
        a.ja(Label::Pass);
    }

    // Multicast: the solicited-node group of one of our IPv6 addresses.
    a.place(Label::Multicast);
    for (i, m) in s.solicited_macs().iter().enumerate() {
        a.jne32(4, lo32(m), Label::Next(i));
        a.jeq32(5, hi16(m), Label::Redirect);
        a.place(Label::Next(i));
    }
    a.ja(Label::Pass);

    // return bpf_redirect_map(&xsks, ctx->rx_queue_index, fallback)
    a.place(Label::Redirect);
    a.ld_map_fd(1, map_fd);
    a.ldx(BPF_W, 2, 6, MD_RX_QUEUE);
    a.mov64_imm(3, s.fallback as i32);
    a.call(FN_REDIRECT_MAP);
    a.exit();

    a.place(Label::Pass);
    a.mov64_imm(0, XDP_PASS as i32);
    a.exit();
    a.finish()
}

/// Classifies a frame the way the program does: `true` if it would be redirected.
/// The reference the kernel tests compare the loaded program against.
pub fn steers(s: &Steering, frame: &[u8]) -> bool {
    if frame.len() < 14 {
        return false;
    }
    let dst: [u8; 6] = frame[..6].try_into().expect("6 bytes");
    if dst == s.mac {
        return true;
    }
    if dst == [0xff; 6] {
        return frame[12..14] == [0x08, 0x06]
            && frame.len() >= 42
            && s.ipv4.iter().any(|ip| frame[38..42] == ip.octets());
    }
    s.solicited_macs().contains(&dst)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ebpf::*;

    pub(crate) fn steering() -> Steering {
        Steering {
            mac: [0x02, 0x5e, 0x10, 0xaa, 0xbb, 0xcc],
            ipv4: vec![Ipv4Addr::new(10, 40, 0, 2), Ipv4Addr::new(192, 168, 7, 9)],
            ipv6: vec!["fd40::2".parse().unwrap()],
            fallback: XDP_DROP,
        }
    }

    /// An Ethernet frame to `dst` of `ethertype`, padded to 60 bytes.
    pub(crate) fn eth(dst: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f.resize(f.len().max(60), 0);
        f
    }

    /// An ARP request for `target`.
    pub(crate) fn arp_request(target: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0, 1, 8, 0, 6, 4, 0, 1];
        p.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 10, 40, 0, 1]);
        p.extend_from_slice(&[0; 6]);
        p.extend_from_slice(&target);
        eth([0xff; 6], 0x0806, &p)
    }

    /// Frames and whether the stack wants each.
    pub(crate) fn cases() -> Vec<(&'static str, Vec<u8>, bool)> {
        let s = steering();
        vec![
            ("unicast to us", eth(s.mac, 0x0800, &[0x45; 40]), true),
            (
                "unicast to the host",
                eth([0x02, 0x5e, 0x10, 0xaa, 0xbb, 0xcd], 0x0800, &[0x45; 40]),
                false,
            ),
            ("ARP for us", arp_request([10, 40, 0, 2]), true),
            (
                "ARP for our second address",
                arp_request([192, 168, 7, 9]),
                true,
            ),
            ("ARP for the host", arp_request([10, 40, 0, 3]), false),
            ("broadcast IPv4", eth([0xff; 6], 0x0800, &[0x45; 40]), false),
            (
                "NS for fd40::2",
                eth([0x33, 0x33, 0xff, 0, 0, 2], 0x86dd, &[0x60; 40]),
                true,
            ),
            (
                "NS for our link-local",
                eth([0x33, 0x33, 0xff, 0xaa, 0xbb, 0xcc], 0x86dd, &[0x60; 40]),
                true,
            ),
            (
                "NS for the host",
                eth([0x33, 0x33, 0xff, 0, 0, 3], 0x86dd, &[0x60; 40]),
                false,
            ),
            (
                "all-nodes",
                eth([0x33, 0x33, 0, 0, 0, 1], 0x86dd, &[0x60; 40]),
                false,
            ),
            ("runt", vec![0x02, 0x5e, 0x10], false),
            // The ARP target lies past the end of a 40-byte frame: not read.
            (
                "short ARP",
                arp_request([10, 40, 0, 2])[..40].to_vec(),
                false,
            ),
        ]
    }

    #[test]
    fn encodes_like_the_kernel_reads() {
        // r1 = r6 (mov64 reg): 0xbf, dst 1, src 6.
        let i = Insn {
            code: BPF_ALU64 | BPF_MOV | BPF_X,
            dst: 1,
            src: 6,
            off: 0,
            imm: 0,
        };
        assert_eq!(i.encode().to_le_bytes(), [0xbf, 0x61, 0, 0, 0, 0, 0, 0]);
        let j = Insn {
            code: BPF_JMP32 | BPF_JNE | BPF_K,
            dst: 4,
            src: 0,
            off: -2,
            imm: -1,
        };
        assert_eq!(
            j.encode().to_le_bytes(),
            [0x56, 0x04, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
    }

    #[test]
    fn jumps_land_on_their_labels_and_the_program_ends_in_exits() {
        let p = steering_program(&steering(), 7).unwrap();
        let n = p.len();
        assert!(n < 100, "{n} instructions");
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            let op = insn.code & 0xf0;
            if (class == BPF_JMP || class == BPF_JMP32) && op != BPF_CALL && op != BPF_EXIT {
                let t = i as i64 + 1 + i64::from(insn.off);
                assert!(t > i as i64 && (t as usize) < n, "jump at {i} to {t}");
            }
        }
        assert_eq!(p[n - 1].code, BPF_JMP | BPF_EXIT);
        // The map fd sits in the ld_imm64 pair.
        let ld = p.iter().position(|i| i.code == BPF_LD | BPF_DW | BPF_IMM);
        let ld = ld.expect("map load");
        assert_eq!((p[ld].src, p[ld].imm), (BPF_PSEUDO_MAP_FD, 7));
        assert_eq!(p[ld + 1].encode(), 0);
    }

    #[test]
    fn without_ipv4_addresses_arp_passes() {
        let s = Steering {
            ipv4: vec![],
            ..steering()
        };
        assert!(steering_program(&s, 3).is_some());
        assert!(!steers(&s, &arp_request([10, 40, 0, 2])));
    }

    #[test]
    fn too_many_addresses_are_refused() {
        let s = Steering {
            ipv4: vec![Ipv4Addr::LOCALHOST; MAX_ADDRS + 1],
            ..steering()
        };
        assert!(steering_program(&s, 3).is_none());
    }

    #[test]
    fn the_reference_classifier_agrees_with_the_cases() {
        let s = steering();
        for (what, f, want) in cases() {
            assert_eq!(steers(&s, &f), want, "{what}");
        }
        assert_eq!(s.solicited_macs().len(), 2);
    }
}
