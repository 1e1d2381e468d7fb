//! Deterministic randomness without a dependency: splitmix64.
//!
//! Workgroup durations are a pure function of (seed, queue, dispatch id, workgroup index), so
//! the same workgroup lasts equally long in every mode and when RESET redoes it; comparing
//! modes then compares scheduling, not luck.

/// One splitmix64 step as a hash of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform value in [0, 1) derived from the key.
pub fn unit(seed: u64, a: u64, b: u64, c: u64) -> f64 {
    let h = mix(mix(mix(seed ^ a).wrapping_add(b)).wrapping_add(c));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A small sequential generator for arrival patterns.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0.wrapping_sub(0x9e37_79b9_7f4a_7c15))
    }

    pub fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_value_and_values_spread() {
        assert_eq!(unit(1, 2, 3, 4), unit(1, 2, 3, 4));
        assert_ne!(unit(1, 2, 3, 4), unit(1, 2, 3, 5));
        let mean: f64 = (0..10_000).map(|i| unit(7, 0, 0, i)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        let mut g = SplitMix::new(3);
        let (a, b) = (g.next_u64(), g.next_u64());
        assert_ne!(a, b);
    }
}
