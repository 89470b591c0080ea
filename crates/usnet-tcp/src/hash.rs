//! SipHash-2-4 (Aumasson & Bernstein), written from the published description: the
//! keyed pseudo-random function behind ISNs (RFC 6528), timestamp offsets (RFC 7323
//! §5.4) and SYN cookies (RFC 4987 §3.6).

use std::net::{IpAddr, SocketAddr};

/// A 128-bit secret key.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SecretKey(pub [u64; 2]);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl SecretKey {
    /// A key derived from a 64-bit seed (the stack's, drawn from a random source in
    /// production, fixed in tests) with SipHash under a fixed key: each half hashes
    /// the seed with its own label, so no half tells anything about the other.
    pub fn derive(seed: u64) -> SecretKey {
        // "usnet-tcp-secret" as a key: a domain of its own, not a secret.
        const DOMAIN: SecretKey = SecretKey([0x7573_6e65_742d_7463, 0x702d_7365_6372_6574]);
        let half = |label: u8| {
            let mut h = SipHasher::new(DOMAIN);
            h.write(&seed.to_le_bytes());
            h.write(&[label]);
            h.finish()
        };
        SecretKey([half(0), half(1)])
    }
}

/// Incremental SipHash-2-4 over whole bytes.
#[derive(Clone)]
pub struct SipHasher {
    v: [u64; 4],
    tail: u64,
    ntail: u32,
    len: u64,
}

#[inline]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

impl SipHasher {
    /// A hasher keyed with `key`.
    pub fn new(key: SecretKey) -> Self {
        let [k0, k1] = key.0;
        SipHasher {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }

    fn block(&mut self, m: u64) {
        self.v[3] ^= m;
        round(&mut self.v);
        round(&mut self.v);
        self.v[0] ^= m;
    }

    /// Absorb bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.tail |= u64::from(b) << (8 * self.ntail);
            self.ntail += 1;
            self.len += 1;
            if self.ntail == 8 {
                let m = self.tail;
                self.block(m);
                self.tail = 0;
                self.ntail = 0;
            }
        }
    }

    /// Absorb an address and port.
    pub fn write_addr(&mut self, a: SocketAddr) {
        match a.ip() {
            IpAddr::V4(v4) => self.write(&v4.octets()),
            IpAddr::V6(v6) => self.write(&v6.octets()),
        }
        self.write(&a.port().to_be_bytes());
    }

    /// The 64-bit result.
    pub fn finish(mut self) -> u64 {
        let m = self.tail | ((self.len & 0xff) << 56);
        self.block(m);
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            round(&mut self.v);
        }
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

/// A TCP Fast Open cookie (RFC 7413 §4.1.2) for a client: SipHash-2-4 keyed with
/// `key` over the client's and then the server's address, the 8 result bytes in
/// little-endian order (the cookie Linux derives from `tcp_fastopen_key`, so a
/// client's cached cookie stays valid across the two).
pub fn fastopen_cookie(key: &[u8; 16], client: IpAddr, server: IpAddr) -> [u8; 8] {
    let half = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&key[8 * i..8 * i + 8]);
        u64::from_le_bytes(b)
    };
    let mut h = SipHasher::new(SecretKey([half(0), half(1)]));
    for a in [client, server] {
        match a {
            IpAddr::V4(v4) => h.write(&v4.octets()),
            IpAddr::V6(v6) => h.write(&v6.octets()),
        }
    }
    h.finish().to_le_bytes()
}

/// Keyed hash of a connection's 4-tuple plus `extra`.
pub(crate) fn tuple_hash(
    key: SecretKey,
    local: SocketAddr,
    remote: SocketAddr,
    extra: &[u8],
) -> u64 {
    let mut h = SipHasher::new(key);
    h.write_addr(local);
    h.write_addr(remote);
    h.write(extra);
    h.finish()
}

/// RFC 6528 initial sequence number: a 4 µs clock plus a keyed hash of the 4-tuple.
pub fn initial_sequence(key: SecretKey, local: SocketAddr, remote: SocketAddr, now_ns: u64) -> u32 {
    let m = (now_ns / 4_000) as u32;
    m.wrapping_add(tuple_hash(key, local, remote, b"isn") as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siphash_reference_vectors() {
        // The reference vectors of the SipHash paper: key 00..0f, message 00..(n-1).
        let key = SecretKey([
            u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]),
            u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]),
        ]);
        let msg: Vec<u8> = (0..16).collect();
        let expect = [
            (0usize, 0x726f_db47_dd0e_0e31u64),
            (1, 0x74f8_39c5_93dc_67fd),
            (8, 0x93f5_f579_9a93_2462),
            (15, 0xa129_ca61_49be_45e5),
        ];
        for (n, want) in expect {
            let mut h = SipHasher::new(key);
            h.write(&msg[..n]);
            assert_eq!(h.finish(), want, "len {n}");
        }
    }

    #[test]
    fn derived_keys_follow_the_seed() {
        let a = SecretKey::derive(1);
        assert_eq!(a, SecretKey::derive(1), "deterministic");
        assert_ne!(a, SecretKey::derive(2));
        assert_ne!(a.0[0], a.0[1], "independent halves");
        assert_ne!(
            SecretKey::derive(0),
            SecretKey::default(),
            "seed 0 is a real key"
        );
    }

    #[test]
    fn isn_depends_on_tuple_and_clock() {
        let k = SecretKey([1, 2]);
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let c: SocketAddr = "10.0.0.2:81".parse().unwrap();
        let i1 = initial_sequence(k, a, b, 0);
        assert_ne!(i1, initial_sequence(k, a, c, 0));
        assert_eq!(initial_sequence(k, a, b, 4_000_000).wrapping_sub(i1), 1000);
        assert_ne!(i1, initial_sequence(SecretKey([1, 3]), a, b, 0));
    }

    #[test]
    fn fastopen_cookies_match_linux() {
        // packetdrill's suite: key a1a1a1a1-b2b2b2b2-c3c3c3c3-d4d4d4d4 (each word
        // little-endian), client 192.0.2.1 to server 192.168.0.1 gets
        // 3021b9d889017eeb; over IPv6 c1d1e9742a47a9bc.
        let mut key = [0u8; 16];
        for (i, w) in [0xa1a1_a1a1u32, 0xb2b2_b2b2, 0xc3c3_c3c3, 0xd4d4_d4d4]
            .iter()
            .enumerate()
        {
            key[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        let c = fastopen_cookie(
            &key,
            "192.0.2.1".parse().unwrap(),
            "192.168.0.1".parse().unwrap(),
        );
        assert_eq!(c, [0x30, 0x21, 0xb9, 0xd8, 0x89, 0x01, 0x7e, 0xeb]);
        let c = fastopen_cookie(
            &key,
            "fd3d:fa7b:d17d::1".parse().unwrap(),
            "fd3d:a0b:17d6::1".parse().unwrap(),
        );
        assert_eq!(c, [0xc1, 0xd1, 0xe9, 0x74, 0x2a, 0x47, 0xa9, 0xbc]);
    }
}
