//! Latency-critical / best-effort: while any latency-critical queue has work, best-effort queues
//! are suspended; latency-critical queues always run.

use super::{Decision, Policy, QueueView, View};
use xpreempt_types::{Priority, may_share};

#[derive(Clone, Debug)]
pub struct LcBe {
    /// A queue without an explicit class hint is latency-critical from this priority up.
    pub lc_min_priority: Priority,
}

impl Default for LcBe {
    fn default() -> Self {
        Self { lc_min_priority: 1 }
    }
}

impl LcBe {
    pub fn is_lc(&self, q: &QueueView) -> bool {
        q.hints
            .latency_critical
            .unwrap_or(q.logical_priority >= self.lc_min_priority)
    }
}

impl Policy for LcBe {
    fn name(&self) -> &'static str {
        "lcbe"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        // A BE queue yields to busy LC queues that may share its compute units.
        let held = |q: &QueueView| {
            !self.is_lc(q)
                && view.queues.iter().any(|h| {
                    h.is_active()
                        && self.is_lc(h)
                        && may_share(q.compute_units.as_ref(), h.compute_units.as_ref())
                })
        };
        Decision {
            run: view
                .queues
                .iter()
                .filter(|q| !held(q))
                .map(|q| q.id)
                .collect(),
            wake_at: None,
        }
    }

    /// Latency-critical 1, best-effort 0: a busy LC queue stops every BE queue, LC queues always
    /// run, and a BE queue with no other queue busy runs.
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        queue
            .compute_units
            .is_none()
            .then_some(i64::from(self.is_lc(queue)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    #[test]
    fn best_effort_yields_while_latency_critical_work_exists() {
        let mut qs = [
            queue(0, 0, Running),
            queue(1, 5, Idle),
            queue(2, 0, Running),
        ];
        let mut p = LcBe::default();
        assert_eq!(
            ids(&p
                .decide(&View {
                    now: 0,
                    queues: &qs
                })
                .run),
            vec![0, 1, 2]
        );
        qs[1].state = Ready;
        assert_eq!(
            ids(&p
                .decide(&View {
                    now: 0,
                    queues: &qs
                })
                .run),
            vec![1]
        );
        qs[2].hints.latency_critical = Some(true);
        assert_eq!(
            ids(&p
                .decide(&View {
                    now: 0,
                    queues: &qs
                })
                .run),
            vec![1, 2]
        );
    }
}
