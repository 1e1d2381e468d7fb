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
}
