//! Logical priorities (any i32, larger first) onto CUDA stream priorities (a small range where a
//! smaller number runs first). Every level the device has is used; the highest active logical
//! priority always gets the greatest stream priority alone, the lowest gets the least.

use std::collections::BTreeMap;
use xpreempt_types::Priority;

/// Maps each distinct active priority to a stream priority in `greatest..=least`
/// (CUDA: `greatest <= least`, e.g. -5..=0).
pub fn map_priorities(active: &[Priority], least: i32, greatest: i32) -> BTreeMap<Priority, i32> {
    let mut distinct: Vec<Priority> = active.to_vec();
    distinct.sort_unstable_by(|a, b| b.cmp(a));
    distinct.dedup();
    let levels = (least - greatest).unsigned_abs() as usize + 1;
    let m = distinct.len();
    let mut out = BTreeMap::new();
    for (rank, &p) in distinct.iter().enumerate() {
        let level = if m <= 1 {
            0
        } else if m <= levels {
            // Spread evenly over the whole range: the top is greatest, the bottom least.
            (rank * (levels - 1) + (m - 1) / 2) / (m - 1)
        } else if rank == 0 {
            0
        } else {
            // More priorities than levels: the top keeps level 0; the rest share 1..levels.
            1 + ((rank - 1) * (levels - 1)) / (m - 1)
        };
        out.insert(p, greatest + level as i32);
    }
    // With one active priority, run it at the greatest level.
    out
}

/// Keeps the active set and tells which queues must move when it changes.
#[derive(Debug, Default)]
pub struct PriorityMapper {
    least: i32,
    greatest: i32,
    counts: BTreeMap<Priority, usize>,
    current: BTreeMap<Priority, i32>,
}

impl PriorityMapper {
    pub fn new(least: i32, greatest: i32) -> Self {
        Self {
            least,
            greatest,
            ..Default::default()
        }
    }

    /// A queue of priority `p` became active; returns the new mapping when it changed.
    pub fn activate(&mut self, p: Priority) -> Option<&BTreeMap<Priority, i32>> {
        *self.counts.entry(p).or_default() += 1;
        self.remap()
    }

    pub fn deactivate(&mut self, p: Priority) -> Option<&BTreeMap<Priority, i32>> {
        if let Some(c) = self.counts.get_mut(&p) {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&p);
            }
        }
        self.remap()
    }

    pub fn stream_priority(&self, p: Priority) -> i32 {
        self.current.get(&p).copied().unwrap_or(self.least)
    }

    fn remap(&mut self) -> Option<&BTreeMap<Priority, i32>> {
        let active: Vec<Priority> = self.counts.keys().copied().collect();
        let next = map_priorities(&active, self.least, self.greatest);
        if next != self.current {
            self.current = next;
            Some(&self.current)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_priorities_spread_over_the_range() {
        let m = map_priorities(&[10, 0], 0, -5);
        assert_eq!(m[&10], -5);
        assert_eq!(m[&0], 0);
        let m = map_priorities(&[3, 2, 1], 0, -5);
        assert_eq!((m[&3], m[&2], m[&1]), (-5, -2, 0));
        assert_eq!(map_priorities(&[7, 7], 0, -5)[&7], -5);
    }

    #[test]
    fn many_priorities_keep_order_and_top_alone() {
        let ps: Vec<i32> = (0..20).collect();
        let m = map_priorities(&ps, 0, -5);
        assert_eq!(m[&19], -5);
        assert!(ps.iter().filter(|&&p| m[&p] == -5).count() == 1);
        for w in ps.windows(2) {
            assert!(
                m[&w[1]] <= m[&w[0]],
                "higher logical must not get a lower stream priority"
            );
        }
        assert_eq!(m[&0], 0);
        let used: std::collections::BTreeSet<i32> = m.values().copied().collect();
        assert_eq!(used.len(), 6, "all six levels are used");
    }

    #[test]
    fn mapper_remaps_as_the_active_set_changes() {
        let mut pm = PriorityMapper::new(0, -5);
        assert!(pm.activate(1).is_some());
        assert_eq!(pm.stream_priority(1), -5);
        assert!(pm.activate(5).is_some());
        assert_eq!((pm.stream_priority(5), pm.stream_priority(1)), (-5, 0));
        assert!(pm.activate(5).is_none(), "same set, no remap");
        assert!(pm.deactivate(5).is_none());
        assert!(pm.deactivate(5).is_some());
        assert_eq!(pm.stream_priority(1), -5);
    }
}
