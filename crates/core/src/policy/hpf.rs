//! Highest priority first: every queue at the highest effective priority with work runs, all
//! together, as the hardware would run them; a queue is stopped only while a queue of strictly
//! higher effective priority has work on compute units it may share (queues confined to
//! disjoint units do not delay each other; one held back only by queues confined to some units
//! yields those units instead, where its hardware can). Equal priorities take turns only where
//! a queue's timeslice hint asks for it: the tied queues with such a hint rotate among
//! themselves (each for its own slice), beside the tied queues without one.

use super::{Decision, Policy, QueueView, View, rotate};
use std::collections::BTreeMap;
use xpreempt_types::{ComputeUnits, QueueId};

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
        // Idle queues too may launch the moment they submit where nothing active holds them.
        let mut decision = Decision {
            run: view
                .queues
                .iter()
                .filter(|q| !view.queues.iter().any(|h| q.held_back_by(h)))
                .filter(|q| !wants_turns(q, top))
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
    /// turns by its timeslice hint (a turn ends by the clock, not by the order), nor where a
    /// queue is confined to some compute units (a higher queue elsewhere leaves it running).
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        (queue.hints.timeslice_ns.is_none() && queue.compute_units.is_none())
            .then_some(i64::from(queue.effective_priority))
    }

    /// A queue held back only by queues confined to some compute units (a small service given
    /// its own CUs) may keep the rest: it yields the union of their units instead of stopping.
    /// Not where one of them may use every unit, nor where nothing of its own would be left,
    /// nor for a queue that takes turns by its timeslice hint.
    fn spatial_yield(
        &self,
        view: &View<'_>,
        decision: &Decision,
    ) -> BTreeMap<QueueId, ComputeUnits> {
        let mut yields = BTreeMap::new();
        for q in view.queues.iter().filter(|q| !decision.run.contains(&q.id)) {
            if q.hints.timeslice_ns.is_some() {
                continue;
            }
            let mut avoid: Option<ComputeUnits> = None;
            let mut confined = true;
            for h in view.queues.iter().filter(|h| q.held_back_by(h)) {
                match &h.compute_units {
                    Some(units) => {
                        avoid = Some(avoid.map_or_else(|| units.clone(), |a| a.union(units)));
                    }
                    None => confined = false,
                }
            }
            if let Some(avoid) = avoid.filter(|_| confined)
                && q.compute_units
                    .as_ref()
                    .is_none_or(|own| !own.without(&avoid).is_empty())
            {
                yields.insert(q.id, avoid);
            }
        }
        yields
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

    #[test]
    fn a_higher_queue_on_other_compute_units_stops_nothing() {
        use xpreempt_types::ComputeUnits;
        let mut qs = [
            queue(0, 3, Running),
            queue(1, 12, Ready),
            queue(2, 1, Running),
        ];
        qs[0].compute_units = Some(ComputeUnits::range(40, 40));
        qs[1].compute_units = Some(ComputeUnits::range(0, 40));
        // Queue 2 may run anywhere, so it shares units with the high queue.
        assert_eq!(ids(&decide(&qs, 0).run), vec![0, 1]);
        qs[0].compute_units = Some(ComputeUnits::range(30, 40));
        assert_eq!(ids(&decide(&qs, 0).run), vec![1]);
        assert_eq!(Hpf.preemption_rank(&qs[0]), None);
    }

    #[test]
    fn a_queue_held_back_only_by_confined_queues_may_yield_their_units() {
        use xpreempt_types::ComputeUnits;
        let yields = |qs: &[QueueView]| {
            let view = View { now: 0, queues: qs };
            Hpf.spatial_yield(&view, &Hpf.decide(&view))
        };
        let mut qs = [
            queue(0, 3, Running),
            queue(1, 12, Ready),
            queue(2, 8, Ready),
            queue(3, 12, Idle),
        ];
        qs[1].compute_units = Some(ComputeUnits::range(0, 16));
        qs[2].compute_units = Some(ComputeUnits::range(16, 8));
        // Queue 0 (every unit) yields both higher queues' units; queue 2 is not held back.
        let y = yields(&qs);
        assert_eq!(y.keys().map(|q| q.0).collect::<Vec<_>>(), vec![0]);
        assert_eq!(y[&QueueId(0)], ComputeUnits::range(0, 24));
        // A higher queue that may use every unit stops it outright.
        qs[3].state = Ready;
        assert!(yields(&qs).is_empty());
        qs[3].state = Idle;
        // Nothing left of its own: stopped.
        qs[0].compute_units = Some(ComputeUnits::range(0, 20));
        assert!(yields(&qs).is_empty());
        qs[0].compute_units = Some(ComputeUnits::range(0, 30));
        assert_eq!(yields(&qs)[&QueueId(0)], ComputeUnits::range(0, 24));
        // A queue that takes turns by its timeslice does not yield.
        qs[0].hints.timeslice_ns = Some(100);
        assert!(yields(&qs).is_empty());
    }
}
