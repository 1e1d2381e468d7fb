//! First in, first out: the queue that became active first runs until it is idle.

use super::{Decision, Policy, View, exclusive};

#[derive(Clone, Copy, Debug, Default)]
pub struct Fifo;

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        let active = view.queues.iter().filter(|q| q.is_active());
        let chosen = active
            .clone()
            .find(|q| q.running_since.is_some())
            .or_else(|| active.min_by_key(|q| (q.active_since, q.id)))
            .map(|q| q.id);
        Decision {
            run: exclusive(view, chosen),
            wake_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    #[test]
    fn the_earliest_arrival_runs_to_completion() {
        let mut qs = [queue(0, 9, Ready), queue(1, 0, Ready), queue(2, 0, Idle)];
        qs[0].active_since = Some(20);
        qs[1].active_since = Some(10);
        let d = Fifo.decide(&View {
            now: 30,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![1]);
        qs[0].running_since = Some(5);
        qs[0].state = Running;
        let d = Fifo.decide(&View {
            now: 30,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![0]);
    }
}
