//! The one random generator of the simulations.

/// splitmix64 (Steele, Lea, Flood): tiny, any seed is fine (0 included), and good
/// enough to drive fault decisions and fuzzing. Not for secrets.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (0 when `n` is 0; the tiny modulo bias does not matter here).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// An index into a slice of `len` elements (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True with probability `p`. `p <= 0` draws nothing, so a fault that is off
    /// does not shift the decisions after it.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs for seed 0 (as in the reference implementation).
        let mut r = SimRng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn same_seed_same_stream_and_other_seeds_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = SimRng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = SimRng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let mut c = SimRng::new(43);
        assert_eq!(a, b);
        assert_ne!(a[0], c.next_u64());
    }

    #[test]
    fn ranges() {
        let mut r = SimRng::new(7);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!(r.below(10) < 10);
            assert!(r.index(3) < 3);
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.index(0), 0);
    }

    #[test]
    fn chance_follows_p_and_zero_draws_nothing() {
        let mut r = SimRng::new(1);
        let hits = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((24_000..26_000).contains(&hits), "{hits}");
        let mut a = SimRng::new(9);
        let mut b = SimRng::new(9);
        assert!(!a.chance(0.0));
        assert!(!a.chance(-1.0));
        assert_eq!(a.next_u64(), b.next_u64(), "p = 0 consumed nothing");
        assert!((0..1000).all(|_| a.chance(1.0)));
    }
}
