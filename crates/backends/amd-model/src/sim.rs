//! The discrete-event engine: a time-ordered queue of model events. Ties break by insertion
//! order, which makes every run with the same inputs replay the same way.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use xpreempt_types::Nanos;

struct Entry<E> {
    at: Nanos,
    order: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    // Reversed so that the max-heap yields the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    order: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            order: 0,
        }
    }
}

impl<E> EventQueue<E> {
    pub fn push(&mut self, at: Nanos, event: E) {
        self.order += 1;
        self.heap.push(Entry {
            at,
            order: self.order,
            event,
        });
    }

    pub fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|e| e.at)
    }

    /// The earliest event if it is due by `until`.
    pub fn pop_due(&mut self, until: Nanos) -> Option<(Nanos, E)> {
        if self.heap.peek()?.at > until {
            return None;
        }
        self.heap.pop().map(|e| (e.at, e.event))
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, 'a');
        q.push(3, 'b');
        q.push(5, 'c');
        q.push(3, 'd');
        assert_eq!(q.peek_time(), Some(3));
        let mut got = Vec::new();
        while let Some((t, e)) = q.pop_due(4) {
            got.push((t, e));
        }
        assert_eq!(got, vec![(3, 'b'), (3, 'd')]);
        assert_eq!(q.pop_due(10), Some((5, 'a')));
        assert_eq!(q.pop_due(10), Some((5, 'c')));
        assert!(q.is_empty());
    }
}
