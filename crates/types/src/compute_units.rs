//! The compute units a queue may run on, where the hardware confines it (CU masks on AMD,
//! green contexts on NVIDIA): queues on disjoint units do not delay each other, so neither is
//! stopped for the other.

use serde::{Deserialize, Serialize};

/// A set of compute units, bit `i` of word `i / 64` for unit `i`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ComputeUnits(Vec<u64>);

impl ComputeUnits {
    /// Units `first .. first + count`.
    pub fn range(first: u32, count: u32) -> Self {
        let mut words = vec![0u64; (first as usize + count as usize).div_ceil(64)];
        for cu in first..first + count {
            words[cu as usize / 64] |= 1 << (cu % 64);
        }
        Self(words)
    }

    pub fn from_words(words: Vec<u64>) -> Self {
        Self(words)
    }

    pub fn words(&self) -> &[u64] {
        &self.0
    }

    /// Whether the two sets share a unit.
    pub fn overlaps(&self, other: &Self) -> bool {
        self.0.iter().zip(&other.0).any(|(a, b)| a & b != 0)
    }

    /// The units of either set.
    pub fn union(&self, other: &Self) -> Self {
        let (long, short) = if self.0.len() >= other.0.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.0.clone();
        for (w, o) in words.iter_mut().zip(&short.0) {
            *w |= o;
        }
        Self(words)
    }

    /// The units of this set that `other` does not have.
    pub fn without(&self, other: &Self) -> Self {
        let mut words = self.0.clone();
        for (w, o) in words.iter_mut().zip(&other.0) {
            *w &= !o;
        }
        Self(words)
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// How many units the set holds.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

/// Whether queues confined to `a` and `b` (`None`: every unit) can delay each other.
pub fn may_share(a: Option<&ComputeUnits>, b: Option<&ComputeUnits>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.overlaps(b),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_overlap_only_where_they_share_a_unit() {
        let low = ComputeUnits::range(0, 40);
        let high = ComputeUnits::range(40, 40);
        assert!(!low.overlaps(&high) && !high.overlaps(&low));
        assert!(low.overlaps(&ComputeUnits::range(39, 2)));
        assert!(ComputeUnits::range(60, 70).overlaps(&ComputeUnits::range(129, 1)));
        assert!(may_share(None, Some(&low)) && may_share(Some(&high), None));
        assert!(!may_share(Some(&low), Some(&high)));
    }

    #[test]
    fn union_and_difference_work_across_word_lengths() {
        let all = ComputeUnits::range(0, 130);
        let high = ComputeUnits::range(0, 16);
        let rest = all.without(&high);
        assert_eq!(rest.count(), 114);
        assert!(!rest.overlaps(&high));
        assert_eq!(rest.union(&high), all);
        assert_eq!(high.union(&rest), all);
        assert!(high.without(&all).is_empty());
        assert!(!high.is_empty() && ComputeUnits::default().is_empty());
    }
}
