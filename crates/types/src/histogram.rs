//! A log-linear latency histogram: constant memory, about 3 % relative error, mergeable.

use serde::{Deserialize, Serialize};

/// Each power of two is split into this many linear sub-buckets.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

/// What a histogram says, in the units it was fed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub min: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS
    let shift = exp - SUB_BITS;
    let mantissa = ((v >> shift) as usize) & (SUB - 1);
    ((shift as usize + 1) << SUB_BITS) + mantissa
}

/// The middle of a bucket's value range.
fn value_of(bucket: usize) -> u64 {
    if bucket < SUB {
        return bucket as u64;
    }
    let shift = (bucket >> SUB_BITS) - 1;
    let mantissa = (bucket & (SUB - 1)) as u64;
    let low = (SUB as u64 + mantissa) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.counts[bucket_of(v)] += 1;
        self.count += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The sum of the values recorded.
    pub fn sum(&self) -> u128 {
        self.sum
    }

    /// How many values recorded were below `bound`. Exact when `bound` is where a bucket starts:
    /// every value up to 16 and every power of two (what cumulative Prometheus buckets are made
    /// of); otherwise it counts the values below the start of `bound`'s bucket.
    pub fn count_below(&self, bound: u64) -> u64 {
        self.counts[..bucket_of(bound)].iter().sum()
    }

    /// [`Self::count_below`] of each of `bounds` (ascending) into `out`, in one walk over the
    /// buckets.
    pub fn counts_below(&self, bounds: &[u64], out: &mut [u64]) {
        let (mut bucket, mut below) = (0, 0);
        for (dst, &bound) in out.iter_mut().zip(bounds) {
            let end = bucket_of(bound).max(bucket);
            below += self.counts[bucket..end].iter().sum::<u64>();
            bucket = end;
            *dst = below;
        }
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` in [0, 1]; 0 for an empty histogram.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value_of(bucket).clamp(self.min, self.max);
            }
        }
        self.max
    }

    pub fn summary(&self) -> Summary {
        if self.count == 0 {
            return Summary::default();
        }
        Summary {
            count: self.count,
            min: self.min,
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            max: self.max,
            mean: self.sum as f64 / self.count as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_values_are_exact_and_empty_is_zero() {
        let mut h = Histogram::new();
        assert_eq!(h.summary(), Summary::default());
        for v in 0..16 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.0), 0);
        assert_eq!(h.quantile(1.0), 15);
        assert_eq!(h.summary().count, 16);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.summary().max, 1_000_000);
        assert_eq!(a.summary().min, 10);
    }

    #[test]
    fn counts_below_a_power_of_two_are_exact() {
        let mut h = Histogram::new();
        let values = [
            0,
            1,
            15,
            16,
            1023,
            1024,
            1025,
            2047,
            2048,
            1 << 40,
            (1 << 40) - 1,
        ];
        for v in values {
            h.record(v);
        }
        for bound in [1u64, 16, 17, 1024, 2048, 4096, 1 << 40, 1 << 41] {
            let exact = values.iter().filter(|&&v| v < bound).count() as u64;
            assert_eq!(h.count_below(bound), exact, "below {bound}");
        }
        assert_eq!(h.sum(), values.iter().map(|&v| u128::from(v)).sum::<u128>());
        let bounds = [1u64, 16, 17, 1024, 1280, 2048, 4096, 1 << 40, 1 << 41];
        let mut at_once = [0; 9];
        h.counts_below(&bounds, &mut at_once);
        for (bound, got) in bounds.iter().zip(at_once) {
            assert_eq!(got, h.count_below(*bound), "below {bound}");
        }
    }

    proptest! {
        #[test]
        fn quantiles_are_within_the_bucket_error(values in proptest::collection::vec(1u64..u64::MAX / 4, 1..200), q in 0.0f64..=1.0) {
            let mut h = Histogram::new();
            for &v in &values { h.record(v); }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
            let exact = sorted[rank - 1] as f64;
            let got = h.quantile(q) as f64;
            prop_assert!((got - exact).abs() <= exact / 16.0 + 1.0, "q={q} exact={exact} got={got}");
        }
    }
}
