//! The sync events of a queue whose stream completes in order: once a wait saw the event of
//! watermark `mark` fire, every event recorded before it has fired too and goes back to the pool
//! unqueried.

use std::collections::VecDeque;
use xpreempt_types::Seq;

/// Moves the events of every watermark up to `mark` from `sync` (oldest first) into `free`.
pub(crate) fn retire_reached<E>(sync: &mut VecDeque<(Seq, E)>, free: &mut Vec<E>, mark: Seq) {
    while let Some(&(m, _)) = sync.front()
        && m <= mark
    {
        if let Some((_, ev)) = sync.pop_front() {
            free.push(ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_up_to_the_mark_return_to_the_pool_in_order() {
        let mut sync = VecDeque::from([(2, 'a'), (4, 'b'), (6, 'c')]);
        let mut free = vec!['z'];
        retire_reached(&mut sync, &mut free, 4);
        assert_eq!(
            (sync, free),
            (VecDeque::from([(6, 'c')]), vec!['z', 'a', 'b'])
        );
    }
}
