//! One direction of a simulated path.

use std::time::Duration;

use crate::SimRng;

/// What a path does to frames. Probabilities are per frame (reordering: per copy),
/// 0.0..=1.0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathConfig {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bottleneck rate in bytes per second; 0 is unlimited (no serialisation and no
    /// queue).
    pub rate: u64,
    /// Bytes a frame takes at the bottleneck besides its own (headers the simulated
    /// frames lack, framing).
    pub overhead: u64,
    /// Longest a frame may wait for the bottleneck; one that would wait longer is
    /// dropped (a drop-tail queue measured in time).
    pub queue: Duration,
    /// Lost on the way.
    pub loss: f64,
    /// Arrives twice.
    pub duplicate: f64,
    /// One bit flipped (a checksum should catch it).
    pub corrupt: f64,
    /// Held back by up to `reorder_window` (uniform), so later frames overtake it.
    pub reorder: f64,
    /// Longest extra delay of a reordered copy.
    pub reorder_window: Duration,
    /// Frames longer than this many bytes are dropped without a word: a path MTU
    /// black hole (a router that sends no ICMP). 0: no limit.
    pub max_frame: usize,
}

impl Default for PathConfig {
    /// A perfect path: no delay, no bottleneck, no faults.
    fn default() -> Self {
        PathConfig {
            delay: Duration::ZERO,
            rate: 0,
            overhead: 0,
            queue: Duration::from_millis(50),
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            reorder_window: Duration::ZERO,
            max_frame: 0,
        }
    }
}

/// What a path did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Frames that entered.
    pub sent: u64,
    /// Lost on the way.
    pub lost: u64,
    /// Dropped at the full bottleneck queue.
    pub queue_drops: u64,
    /// Frames that arrived twice.
    pub duplicated: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Copies held back.
    pub reordered: u64,
    /// Dropped for their size (`max_frame`).
    pub too_big: u64,
    /// Time frames waited in the bottleneck queue, summed (nanoseconds).
    pub queue_wait_ns: u64,
    /// The longest one waited (nanoseconds).
    pub queue_wait_max_ns: u64,
}

impl PathStats {
    /// The mean wait in the bottleneck queue of the frames that passed it.
    pub fn mean_queue_wait(&self) -> std::time::Duration {
        let passed = self.sent - self.lost - self.queue_drops - self.too_big;
        std::time::Duration::from_nanos(self.queue_wait_ns.checked_div(passed).unwrap_or(0))
    }
}

/// What happened to one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fate {
    arrivals: [u64; 2],
    copies: usize,
    /// Lost on the way.
    pub lost: bool,
    /// Dropped at the full bottleneck queue.
    pub queue_drop: bool,
    /// Dropped for its size (`PathConfig::max_frame`).
    pub too_big: bool,
    /// One bit of the frame was flipped.
    pub corrupted: bool,
    /// Two copies arrive.
    pub duplicated: bool,
    /// Copies held back (0..=2).
    pub reordered: u32,
    /// The bit a corruption flips, counted from the frame's first byte's lowest
    /// bit ([`Path::send`] flips it; a caller of [`Path::decide`] does).
    pub corrupt_bit: Option<usize>,
}

impl Fate {
    fn dropped(lost: bool) -> Self {
        Fate {
            arrivals: [0; 2],
            copies: 0,
            lost,
            queue_drop: !lost,
            too_big: false,
            corrupted: false,
            duplicated: false,
            reordered: 0,
            corrupt_bit: None,
        }
    }

    /// When each copy arrives, in the caller's nanoseconds; empty if the frame is
    /// gone.
    pub fn arrivals(&self) -> &[u64] {
        &self.arrivals[..self.copies]
    }
}

/// One direction of a path: a bottleneck (rate and queue) after which the frame
/// meets the faults and the propagation delay. The decisions are drawn from the
/// caller's [`SimRng`] (so several paths can share one stream), in a fixed order:
/// loss, queue, corruption, duplication, then reordering for each copy.
#[derive(Debug, Clone)]
pub struct Path {
    /// The path's behaviour; may be changed between frames.
    pub config: PathConfig,
    /// When the bottleneck finishes sending what it holds (nanoseconds).
    busy_until: u64,
    stats: PathStats,
}

impl Path {
    /// An idle path.
    pub fn new(config: PathConfig) -> Self {
        Path {
            config,
            busy_until: 0,
            stats: PathStats::default(),
        }
    }

    /// Whether the bottleneck's queue has room at `now` for another frame (always,
    /// without a rate): what a sender that must not lose frames to it (a NIC at its
    /// line rate pushing back on the stack) checks before it hands one over.
    pub fn has_room(&self, now: u64) -> bool {
        self.config.rate == 0
            || self.busy_until.saturating_sub(now) <= duration_nanos(self.config.queue)
    }

    /// What the path did so far.
    pub fn stats(&self) -> &PathStats {
        &self.stats
    }

    /// `frame` enters the path at `now` (nanoseconds). Decides whether, when and in
    /// how many copies it arrives; a corrupted frame has one bit flipped in place.
    pub fn send(&mut self, rng: &mut SimRng, now: u64, frame: &mut [u8]) -> Fate {
        let fate = self.decide(rng, now, frame.len());
        if let Some(bit) = fate.corrupt_bit {
            frame[bit / 8] ^= 1 << (bit % 8);
        }
        fate
    }

    /// [`Path::send`] for a frame of `len` bytes that the caller holds in its own
    /// form (a chain of buffers, a buffer others share): the same decisions, from
    /// the same draws, with the bit to flip in `Fate::corrupt_bit`.
    pub fn decide(&mut self, rng: &mut SimRng, now: u64, len: usize) -> Fate {
        let c = self.config;
        self.stats.sent += 1;
        // Before any draw, so that a black hole leaves the random stream alone.
        if c.max_frame > 0 && len > c.max_frame {
            self.stats.too_big += 1;
            return Fate {
                queue_drop: false,
                too_big: true,
                ..Fate::dropped(false)
            };
        }
        if rng.chance(c.loss) {
            self.stats.lost += 1;
            return Fate::dropped(true);
        }
        let mut depart = now;
        // Rate 0 is no bottleneck at all.
        let bytes = len as u64 + c.overhead;
        if let Some(serialisation) = bytes.saturating_mul(1_000_000_000).checked_div(c.rate) {
            let start = self.busy_until.max(now);
            if start - now > duration_nanos(c.queue) {
                self.stats.queue_drops += 1;
                return Fate::dropped(false);
            }
            depart = start.saturating_add(serialisation);
            self.busy_until = depart;
            self.stats.queue_wait_ns += start - now;
            self.stats.queue_wait_max_ns = self.stats.queue_wait_max_ns.max(start - now);
        }
        let mut fate = Fate {
            arrivals: [0; 2],
            copies: 1,
            lost: false,
            queue_drop: false,
            too_big: false,
            corrupted: false,
            duplicated: false,
            reordered: 0,
            corrupt_bit: None,
        };
        if rng.chance(c.corrupt) && len > 0 {
            let i = rng.index(len);
            fate.corrupt_bit = Some(i * 8 + rng.below(8) as usize);
            fate.corrupted = true;
            self.stats.corrupted += 1;
        }
        if rng.chance(c.duplicate) {
            fate.copies = 2;
            fate.duplicated = true;
            self.stats.duplicated += 1;
        }
        for at in &mut fate.arrivals[..fate.copies] {
            *at = depart.saturating_add(duration_nanos(c.delay));
            if rng.chance(c.reorder) {
                let window = duration_nanos(c.reorder_window).max(1);
                *at = at.saturating_add(rng.below(window));
                fate.reordered += 1;
                self.stats.reordered += 1;
            }
        }
        fate
    }
}

fn duration_nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn path(config: PathConfig) -> (Path, SimRng) {
        (Path::new(config), SimRng::new(1))
    }

    #[test]
    fn a_perfect_path_only_delays() {
        let (mut p, mut rng) = path(PathConfig {
            delay: Duration::from_millis(5),
            ..PathConfig::default()
        });
        let mut frame = vec![7u8; 100];
        for k in 0..100 {
            let fate = p.send(&mut rng, k * MS, &mut frame);
            assert_eq!(fate.arrivals(), [k * MS + 5 * MS]);
        }
        assert_eq!(frame, vec![7u8; 100]);
        assert_eq!(p.stats().sent, 100);
        assert_eq!(p.stats().lost + p.stats().queue_drops, 0);
    }

    #[test]
    fn frames_over_max_frame_vanish_and_draw_nothing() {
        let cfg = PathConfig {
            max_frame: 100,
            loss: 0.5,
            ..PathConfig::default()
        };
        let (mut a, mut rng_a) = path(cfg);
        let (mut b, mut rng_b) = path(cfg);
        for k in 0..50 {
            let fate = a.send(&mut rng_a, k, &mut [0u8; 101]);
            assert!(fate.too_big && !fate.lost && !fate.queue_drop);
            assert!(fate.arrivals().is_empty());
            // The same small frames meet the same fates on both paths.
            let x = a.send(&mut rng_a, k, &mut [0u8; 100]);
            let y = b.send(&mut rng_b, k, &mut [0u8; 100]);
            assert_eq!(x, y);
        }
        assert_eq!(a.stats().too_big, 50);
        assert_eq!(b.stats().too_big, 0);
    }

    #[test]
    fn the_bottleneck_serialises_and_drops_when_the_queue_is_full() {
        // 1 MB/s: a 960-byte frame plus 40 bytes of overhead takes 1 ms.
        let (mut p, mut rng) = path(PathConfig {
            rate: 1_000_000,
            overhead: 40,
            queue: Duration::from_millis(3),
            ..PathConfig::default()
        });
        let mut frame = vec![0u8; 960];
        let arrivals: Vec<Vec<u64>> = (0..6)
            .map(|_| p.send(&mut rng, 0, &mut frame).arrivals().to_vec())
            .collect();
        // Back to back: 1, 2, 3, 4 ms; the fifth would wait 4 ms > 3 ms.
        assert_eq!(arrivals[..4], [[MS], [2 * MS], [3 * MS], [4 * MS]]);
        assert!(arrivals[4].is_empty() && arrivals[5].is_empty());
        assert_eq!(p.stats().queue_drops, 2);
        // Once the queue drains, a frame goes straight through.
        assert_eq!(p.send(&mut rng, 10 * MS, &mut frame).arrivals(), [11 * MS]);
    }

    #[test]
    fn loss_duplication_and_corruption_happen_at_their_rates() {
        let (mut p, mut rng) = path(PathConfig {
            loss: 0.1,
            duplicate: 0.1,
            corrupt: 0.1,
            ..PathConfig::default()
        });
        let n = 20_000u64;
        let mut flipped = 0u64;
        for _ in 0..n {
            let mut frame = vec![0u8; 64];
            let fate = p.send(&mut rng, 0, &mut frame);
            let ones: u32 = frame.iter().map(|b| b.count_ones()).sum();
            assert_eq!(
                ones,
                u32::from(fate.corrupted),
                "exactly one bit when corrupted"
            );
            flipped += u64::from(ones);
            assert_eq!(
                fate.arrivals().len(),
                if fate.lost {
                    0
                } else if fate.duplicated {
                    2
                } else {
                    1
                }
            );
        }
        let s = *p.stats();
        assert_eq!(s.corrupted, flipped);
        for (what, count, expect) in [
            ("lost", s.lost, n / 10),
            ("duplicated", s.duplicated, n * 9 / 100),
            ("corrupted", s.corrupted, n * 9 / 100),
        ] {
            assert!(
                count.abs_diff(expect) < expect / 10,
                "{what}: {count}, expected ~{expect}"
            );
        }
    }

    #[test]
    fn reordering_stays_within_its_window() {
        let (mut p, mut rng) = path(PathConfig {
            delay: Duration::from_millis(1),
            reorder: 0.5,
            reorder_window: Duration::from_millis(3),
            duplicate: 0.2,
            ..PathConfig::default()
        });
        let mut late = 0;
        for _ in 0..10_000 {
            let fate = p.send(&mut rng, 0, &mut [0u8; 10]);
            for &at in fate.arrivals() {
                assert!((MS..4 * MS).contains(&at), "{at}");
                late += u32::from(at > MS);
            }
        }
        assert_eq!(u64::from(late), p.stats().reordered);
        assert!(p.stats().reordered > 5_000);
    }

    #[test]
    fn the_same_seed_gives_the_same_fates() {
        let config = PathConfig {
            rate: 5_000_000,
            loss: 0.05,
            duplicate: 0.05,
            corrupt: 0.05,
            reorder: 0.1,
            reorder_window: Duration::from_millis(2),
            ..PathConfig::default()
        };
        let run = |seed| {
            let mut p = Path::new(config);
            let mut rng = SimRng::new(seed);
            (0..500u64)
                .map(|k| {
                    let mut frame = vec![k as u8; 1000];
                    (p.send(&mut rng, k * 100_000, &mut frame), frame)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn faults_that_are_off_draw_nothing() {
        // Only loss is on: the stream is the one `chance(loss)` alone would use, so
        // switching other faults off never changes which frames are lost.
        let (mut p, mut rng) = path(PathConfig {
            loss: 0.3,
            ..PathConfig::default()
        });
        let mut alone = SimRng::new(1);
        for _ in 0..1000 {
            let fate = p.send(&mut rng, 0, &mut [0u8; 10]);
            assert_eq!(fate.lost, alone.chance(0.3));
        }
    }
}
