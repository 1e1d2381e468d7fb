//! What each mechanism costs on a device, as measured: the daemon merges the suspend and resume
//! latencies its queues' agents publish ([`LatencyCounts`]) by device and level, and answers
//! `Costs` with them for `xpreempt list`, `top` and the metrics.
//!
//! A queue's level says what its suspension does: at Lv1 it waits for the queue's window to
//! drain, at Lv2 it stops the queue's work at a block boundary, at Lv3 it switches the queue's
//! context off the device. Nothing measures a spatial confinement (CU masks, green contexts,
//! MPS thread limits) yet: it is listed as not measured rather than given a number.

use crate::shm::{LATENCY_BOUNDS_NS, LATENCY_BUCKETS, LatencyCounts};
use serde::{Deserialize, Serialize};
use xpreempt_types::{Level, Nanos};

/// A way of taking a queue's work off the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// Lv1: the suspension waits until what the queue launched has finished.
    Drain,
    /// Lv2: the queue's kernels stop at a block boundary.
    BlockStop,
    /// Lv3: the device switches the queue's context out (time-slice switch).
    Switch,
    /// The queue keeps running on compute units the high queue does not use.
    SpatialConfinement,
}

impl Mechanism {
    /// The mechanism a suspension at `level` uses.
    pub fn of(level: Level) -> Self {
        match level {
            Level::Lv1 => Self::Drain,
            Level::Lv2 => Self::BlockStop,
            Level::Lv3 => Self::Switch,
        }
    }

    /// Every mechanism, in the order the listings show them.
    pub const ALL: [Mechanism; 4] = [
        Self::Drain,
        Self::BlockStop,
        Self::Switch,
        Self::SpatialConfinement,
    ];

    /// The level whose suspensions measure it; `None` for what no level measures.
    pub fn level(self) -> Option<Level> {
        match self {
            Self::Drain => Some(Level::Lv1),
            Self::BlockStop => Some(Level::Lv2),
            Self::Switch => Some(Level::Lv3),
            Self::SpatialConfinement => None,
        }
    }

    /// What people call it in `list` and `top`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::BlockStop => "block-boundary stop",
            Self::Switch => "switch",
            Self::SpatialConfinement => "spatial confinement",
        }
    }

    /// The metrics' `mechanism` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::BlockStop => "block_stop",
            Self::Switch => "switch",
            Self::SpatialConfinement => "spatial_confinement",
        }
    }
}

/// Latencies of one kind (stopping or restarting) merged over a device's queues at one level.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostSummary {
    /// Suspensions (or resumptions) measured.
    pub samples: u64,
    pub p50_ns: Nanos,
    pub p99_ns: Nanos,
    /// Exact: the sum of the samples over their number.
    pub mean_ns: Nanos,
}

impl CostSummary {
    /// `None` without samples.
    pub fn of(counts: &LatencyCounts) -> Option<Self> {
        (counts.count > 0).then(|| Self {
            samples: counts.count,
            p50_ns: quantile_ns(counts, 0.5),
            p99_ns: quantile_ns(counts, 0.99),
            mean_ns: counts.sum_ns / counts.count,
        })
    }
}

/// The measured cost of one mechanism on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MechanismCost {
    pub mechanism: Mechanism,
    /// The level whose queues measured it (`None`: no level does).
    pub level: Option<Level>,
    /// From suspend until the device is free of the queue's work.
    pub stop: Option<CostSummary>,
    /// From resume until the device runs the queue again.
    pub restart: Option<CostSummary>,
    /// How far back the samples reach (the recent past they summarize); `None` without any.
    pub over_ns: Option<Nanos>,
    /// Why there is no number, where no number can exist yet.
    pub note: Option<String>,
}

impl MechanismCost {
    /// A mechanism nothing measures.
    pub fn not_measured(mechanism: Mechanism) -> Self {
        Self {
            mechanism,
            level: mechanism.level(),
            stop: None,
            restart: None,
            over_ns: None,
            note: Some("not measured".into()),
        }
    }
}

/// Every mechanism's measured cost on one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceCosts {
    pub device: u32,
    /// One per [`Mechanism::ALL`], in that order.
    pub mechanisms: Vec<MechanismCost>,
}

/// Adds `b` to `a`, bucket by bucket.
pub fn add(a: &mut LatencyCounts, b: &LatencyCounts) {
    for (x, y) in a.below.iter_mut().zip(&b.below) {
        *x += y;
    }
    a.count += b.count;
    a.sum_ns = a.sum_ns.saturating_add(b.sum_ns);
}

/// What `now` holds beyond `before` (both cumulative counts of one queue); a histogram that went
/// backwards (a slot that started again) counts from nothing.
pub fn since(now: &LatencyCounts, before: &LatencyCounts) -> LatencyCounts {
    if now.count < before.count || now.below.iter().zip(&before.below).any(|(n, b)| n < b) {
        return *now;
    }
    let mut d = LatencyCounts {
        count: now.count - before.count,
        sum_ns: now.sum_ns.saturating_sub(before.sum_ns),
        ..LatencyCounts::default()
    };
    for (x, (n, b)) in d.below.iter_mut().zip(now.below.iter().zip(&before.below)) {
        *x = n - b;
    }
    d
}

/// The value at quantile `q` of cumulative counts: the bucket that holds it is found exactly
/// and the value placed in it by linear interpolation, as Prometheus' `histogram_quantile`
/// does, so it is known within its bucket (a quarter of an octave, 25 %; below 1 µs, within
/// [0, 1 µs)); above the last bound it is that bound. 0 without samples.
///
/// The sum bounds it too: at least `count - ceil(q * count) + 1` samples are at or above the
/// quantile, so it is at most the sum over them (restarts that had nothing to restart, all
/// zeros, read as zero rather than as half the first bucket).
pub fn quantile_ns(c: &LatencyCounts, q: f64) -> Nanos {
    if c.count == 0 {
        return 0;
    }
    let q = q.clamp(0.0, 1.0);
    let rank = q * c.count as f64;
    let at_or_above = c.count - ((rank.ceil() as u64).clamp(1, c.count)) + 1;
    let bound = c.sum_ns / at_or_above;
    let (mut low, mut below_low) = (0u64, 0u64);
    for (&high, &below) in LATENCY_BOUNDS_NS.iter().zip(&c.below) {
        if below as f64 >= rank && below > below_low {
            let within = (rank - below_low as f64) / (below - below_low) as f64;
            let v = low + ((high - low) as f64 * within.clamp(0.0, 1.0)).round() as u64;
            return v.min(bound);
        }
        (low, below_low) = (high, below);
    }
    LATENCY_BOUNDS_NS[LATENCY_BUCKETS - 1].min(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_types::histogram::Histogram;

    /// Counts as a slot carries them, from exact samples.
    fn counts(values: &[u64]) -> LatencyCounts {
        let mut h = Histogram::new();
        for &v in values {
            h.record(v);
        }
        LatencyCounts::of(&h)
    }

    #[test]
    fn quantiles_fall_in_the_bucket_of_the_exact_value() {
        // 98 stops of 40 µs and two of 3 ms: the median is in the quarter octave [32.8, 41.0)
        // µs, the p99 in [2.62, 3.15) ms.
        let mut v = vec![40_000; 98];
        v.extend([3_000_000, 3_000_000]);
        let s = CostSummary::of(&counts(&v)).unwrap();
        assert_eq!(s.samples, 100);
        assert!((32_768..=40_960).contains(&s.p50_ns), "{s:?}");
        assert!((2_621_440..=3_145_728).contains(&s.p99_ns), "{s:?}");
        assert_eq!(s.mean_ns, (98 * 40_000 + 6_000_000) / 100);
        assert_eq!(CostSummary::of(&LatencyCounts::default()), None);
    }

    #[test]
    fn a_value_below_a_microsecond_and_one_past_the_last_bound_stay_in_range() {
        let fast = CostSummary::of(&counts(&[200])).unwrap();
        assert!(fast.p50_ns < 1_024 && fast.p99_ns < 1_024, "{fast:?}");
        let zeros = CostSummary::of(&counts(&[0, 0, 0])).unwrap();
        assert_eq!((zeros.p50_ns, zeros.p99_ns, zeros.mean_ns), (0, 0, 0));
        // Four restarts of nothing and one of 600 ns: the median is no more than 600 / 3.
        let mostly = CostSummary::of(&counts(&[0, 0, 0, 0, 600])).unwrap();
        assert!(mostly.p50_ns <= 200 && mostly.p99_ns <= 600, "{mostly:?}");
        let slow = CostSummary::of(&counts(&[5_000_000_000])).unwrap();
        assert_eq!(slow.p99_ns, 1 << 30);
        assert_eq!(slow.mean_ns, 5_000_000_000);
    }

    #[test]
    fn differences_and_sums_of_counts_are_the_samples_between() {
        let before = counts(&[10_000, 20_000]);
        let now = counts(&[10_000, 20_000, 500_000, 600_000]);
        let d = since(&now, &before);
        assert_eq!(d, counts(&[500_000, 600_000]));
        let mut merged = counts(&[1_000_000]);
        add(&mut merged, &d);
        assert_eq!(merged, counts(&[500_000, 600_000, 1_000_000]));
        // A slot that started over is read as new samples, never as negative ones.
        assert_eq!(since(&before, &now), before);
    }

    #[test]
    fn each_level_has_its_mechanism_and_spatial_confinement_none() {
        for level in [Level::Lv1, Level::Lv2, Level::Lv3] {
            assert_eq!(Mechanism::of(level).level(), Some(level));
        }
        assert_eq!(Mechanism::SpatialConfinement.level(), None);
        let n = MechanismCost::not_measured(Mechanism::SpatialConfinement);
        assert!(n.stop.is_none() && n.restart.is_none());
        assert_eq!(n.note.as_deref(), Some("not measured"));
    }
}
