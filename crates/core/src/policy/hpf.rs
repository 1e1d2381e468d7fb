//! Highest priority first: every queue at the highest effective priority with work runs, all
//! together, as the hardware would run them; a queue is stopped only while a queue of strictly
//! higher effective priority has work. Equal priorities take turns only where a queue's
//! timeslice hint asks for it: the tied queues with such a hint rotate among themselves (each
//! for its own slice), beside the tied queues without one.

use super::{Decision, Policy, QueueView, View, rotate};

#[derive(Clone, Copy, Debug, Default)]
pub struct Hpf;

impl Policy for Hpf {
    fn name(&self) -> &'static str {
        "hpf"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        let Some(top) = view
            .queues
            .iter()
            .filter(|q| q.is_active())
            .map(|q| q.effective_priority)
            .max()
        else {
            return Decision {
                run: view.queues.iter().map(|q| q.id).collect(),
                wake_at: None,
            };
        };
        // Idle queues at or above the top may launch the moment they submit: nothing active
        // is above them.
        let mut decision = Decision {
            run: view
                .queues
                .iter()
                .filter(|q| q.effective_priority >= top && !wants_turns(q, top))
                .map(|q| q.id)
                .collect(),
            wake_at: None,
        };
        let turns: Vec<&QueueView> = view.queues.iter().filter(|q| wants_turns(q, top)).collect();
        if let Some((id, slice_end)) = rotate(view, &turns, 0) {
            decision.run.insert(id);
            if turns.len() > 1 {
                decision.wake_at = Some(slice_end);
            }
        }
        decision
    }

    /// The effective priority: an active queue stops every queue of strictly lower priority,
    /// and a queue with no active queue above it runs. No order where a tied queue takes
    /// turns by its timeslice hint: a turn ends by the clock, not by the order.
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        queue
            .hints
            .timeslice_ns
            .is_none()
            .then_some(i64::from(queue.effective_priority))
    }
}

/// An active queue at the top that asked to take turns with its equals.
fn wants_turns(q: &QueueView, top: xpreempt_types::Priority) -> bool {
    q.is_active() && q.effective_priority == top && q.hints.timeslice_ns.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    fn decide(qs: &[QueueView], now: u64) -> Decision {
        Hpf.decide(&View { now, queues: qs })
    }

    #[test]
    fn the_highest_active_priority_runs() {
        let qs = [
            queue(0, 3, Running),
            queue(1, 12, Ready),
            queue(2, 20, Idle),
            queue(3, 5, Idle),
        ];
        let d = decide(&qs, 10);
        assert_eq!(ids(&d.run), vec![1, 2]);
        assert_eq!(d.wake_at, None);
    }

    #[test]
    fn everything_may_run_on_an_idle_device() {
        let qs = [queue(0, 3, Idle), queue(1, -7, Idle)];
        assert_eq!(ids(&decide(&qs, 0).run), vec![0, 1]);
    }

    #[test]
    fn equal_priorities_run_together_and_only_a_higher_one_stops_them() {
        let qs = [
            queue(0, 5, Running),
            queue(1, 5, Suspended),
            queue(2, 1, Running),
            queue(3, 5, Idle),
            queue(4, 4, Idle),
        ];
        let d = decide(&qs, 50);
        assert_eq!((ids(&d.run), d.wake_at), (vec![0, 1, 3], None));
    }

    #[test]
    fn equals_take_turns_only_where_a_timeslice_hint_asks() {
        let mut qs = [
            queue(0, 5, Running),
            queue(1, 5, Suspended),
            queue(2, 5, Running),
            queue(3, 1, Suspended),
        ];
        qs[0].hints.timeslice_ns = Some(100);
        qs[1].hints.timeslice_ns = Some(100);
        let d = decide(&qs, 50);
        assert_eq!((ids(&d.run), d.wake_at), (vec![0, 2], Some(100)));
        let d = decide(&qs, 100);
        assert_eq!((ids(&d.run), d.wake_at), (vec![1, 2], Some(200)));
        assert_eq!(Hpf.preemption_rank(&qs[0]), None);
        assert_eq!(Hpf.preemption_rank(&qs[2]), Some(5));
    }
}
