//! Local mode's counterpart of global mode's board: after every decision, for each queue, the
//! queues its next announced submission will stop, as the policy's preemptive order says
//! ([`crate::policy::Policy::preemption_rank`]: a queue with work stops every queue of lower
//! rank). The spinning preemption thread stops them from this plan the moment it sees the
//! announcement, before it takes the driver's lock to decide; the decision confirms the stops,
//! or the queues are resumed if it wants otherwise.
//!
//! Why: deciding first put 4.9–7.8 µs at p50 and 28–43 µs at p99 between a latency-critical
//! request's start and the best-effort queue's stop on an H100 host, against 0.4–0.9 and 4–9
//! for the benchmark's controller, which stops straight away; with the plan, 2.3–3.9 at p50.

use super::scheduler::RankedQueue;
use crate::xqueue::threaded::Preemptible;
use std::sync::Arc;
use xpreempt_types::QueueId;

/// A queue the plan stops, and what to stop it through.
pub(crate) struct Victim {
    pub id: QueueId,
    pub queue: Arc<dyn Preemptible>,
}

/// Each ranked queue that would stop others, with the ids of the queues it stops.
pub(crate) type PlanIds = Vec<(QueueId, Vec<QueueId>)>;

/// What each queue's announcement stops now, as [`StopPlan::of`] reads it off `ranks`: the
/// running queues with work of lower rank. Empty where the policy has no preemptive order.
pub(crate) fn plan_ids(ranks: Option<&[RankedQueue]>) -> PlanIds {
    let Some(ranks) = ranks else {
        return Vec::new();
    };
    ranks
        .iter()
        .filter_map(|q| {
            let below: Vec<QueueId> = ranks
                .iter()
                .filter(|r| r.active && r.allowed && r.rank < q.rank)
                .map(|r| r.id)
                .collect();
            (!below.is_empty()).then_some((q.id, below))
        })
        .collect()
}

#[derive(Default)]
pub(crate) struct StopPlan {
    ids: PlanIds,
    /// Each queue some announcement stops, once.
    handles: Vec<Victim>,
}

impl StopPlan {
    /// The plan `ids` describes; `handle` gives a queue's handle (a queue without one is left
    /// to the decision).
    pub fn of(ids: PlanIds, handle: impl Fn(QueueId) -> Option<Arc<dyn Preemptible>>) -> Self {
        let mut handles: Vec<Victim> = Vec::new();
        for &id in ids.iter().flat_map(|(_, below)| below) {
            if !handles.iter().any(|v| v.id == id)
                && let Some(queue) = handle(id)
            {
                handles.push(Victim { id, queue });
            }
        }
        Self { ids, handles }
    }

    /// What `queue`'s announcement stops.
    pub fn victims(&self, queue: QueueId) -> impl Iterator<Item = &Victim> {
        let below = self.ids.iter().find(|(q, _)| *q == queue);
        below
            .into_iter()
            .flat_map(|(_, below)| below)
            .filter_map(|id| self.handles.iter().find(|v| v.id == *id))
    }

    /// Whether this plan is the one `ids` describes (then it need not be made again).
    pub fn is(&self, ids: &PlanIds) -> bool {
        self.ids == *ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(id: u32, rank: i64, active: bool, allowed: bool) -> RankedQueue {
        RankedQueue {
            id: QueueId(id),
            rank,
            active,
            allowed,
        }
    }

    fn ids(ranks: &[RankedQueue], q: u32) -> Vec<u32> {
        plan_ids(Some(ranks))
            .into_iter()
            .find(|(id, _)| *id == QueueId(q))
            .map_or(vec![], |(_, below)| below.iter().map(|v| v.0).collect())
    }

    #[test]
    fn a_queue_stops_the_running_queues_with_work_below_it() {
        let ranks = [
            ranked(0, 1, true, true),  // low, running
            ranked(1, 2, true, false), // middle, already stopped
            ranked(2, 3, false, true), // idle
            ranked(3, 9, false, true), // the high queue, idle
            ranked(4, 9, true, true),  // its equal, running
        ];
        assert_eq!(ids(&ranks, 3), vec![0]);
        assert_eq!(ids(&ranks, 2), vec![0]);
        assert_eq!(ids(&ranks, 1), vec![0]);
        assert!(ids(&ranks, 0).is_empty());
        assert!(ids(&ranks, 7).is_empty(), "an unknown queue stops nothing");
    }

    #[test]
    fn no_order_no_plan_and_a_plan_is_known_by_its_ids() {
        assert!(plan_ids(None).is_empty());
        let a = [ranked(0, 1, true, true), ranked(1, 2, false, true)];
        let b = [ranked(0, 1, true, true), ranked(1, 2, true, true)];
        let c = [ranked(0, 1, true, false), ranked(1, 2, false, true)];
        let plan = |r: &[RankedQueue]| StopPlan::of(plan_ids(Some(r)), |_| None);
        assert!(
            plan(&a).is(&plan_ids(Some(&b))),
            "queue 1 running stops nothing more"
        );
        assert!(!plan(&a).is(&plan_ids(Some(&c))));
        assert!(plan(&c).is(&plan_ids(Some(&c))));
        assert_eq!(plan(&a).victims(QueueId(1)).count(), 0, "no handles");
    }
}
