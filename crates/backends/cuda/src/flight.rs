//! What a `CudaQueue` has launched and not yet seen complete, with a per-slot count of the
//! guarded kernels holding each completion slot, so that a launch asks "is this slot free?" in
//! O(1) instead of scanning the window.

use std::collections::VecDeque;
use xpreempt_types::Seq;

#[derive(Debug)]
pub(crate) struct Flight {
    /// (seq, completion slot of a guarded kernel), oldest first.
    entries: VecDeque<(Seq, Option<u32>)>,
    /// How many entries hold each slot (0 or 1 in a well-formed queue).
    holders: Vec<u32>,
}

impl Flight {
    pub(crate) fn new(slots: u32, capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            holders: vec![0; slots as usize],
        }
    }

    pub(crate) fn push(&mut self, seq: Seq, slot: Option<u32>) {
        if let Some(s) = slot {
            self.holders[s as usize] += 1;
        }
        self.entries.push_back((seq, slot));
    }

    /// Drops the entries below the completion watermark `done`.
    pub(crate) fn retire_below(&mut self, done: Seq) {
        while let Some(&(seq, slot)) = self.entries.front() {
            if seq >= done {
                break;
            }
            self.entries.pop_front();
            if let Some(s) = slot {
                self.holders[s as usize] -= 1;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.holders.iter_mut().for_each(|h| *h = 0);
    }

    /// Whether a launched, not yet complete (or stopped) guarded kernel holds `slot`.
    pub(crate) fn slot_busy(&self, slot: u32) -> bool {
        self.holders[slot as usize] > 0
    }

    /// The completion slot of each entry, oldest first (`None`: not a guarded kernel).
    pub(crate) fn slots(&self) -> impl Iterator<Item = Option<u32>> + '_ {
        self.entries.iter().map(|&(_, s)| s)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_counts_follow_pushes_and_retirement() {
        let mut f = Flight::new(4, 8);
        f.push(0, None);
        f.push(1, Some(2));
        f.push(2, Some(3));
        assert!(f.slot_busy(2) && f.slot_busy(3) && !f.slot_busy(0));
        f.retire_below(2);
        assert!(!f.slot_busy(2) && f.slot_busy(3));
        assert_eq!(f.len(), 1);
        f.push(3, Some(0));
        f.clear();
        assert!((0..4).all(|s| !f.slot_busy(s)));
        assert_eq!(f.len(), 0);
        assert_eq!(f.slots().count(), 0);
    }
}
