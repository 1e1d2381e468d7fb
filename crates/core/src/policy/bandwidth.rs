//! Bandwidth partition: each active queue gets device time in proportion to its utilization
//! share. The queue furthest behind its share runs, one timeslice at a time; a queue that wakes
//! up starts level with the others instead of cashing in the time it was idle.

use super::{DEFAULT_TIMESLICE_NS, Decision, Policy, QueueView, View, exclusive};
use std::collections::BTreeMap;
use xpreempt_types::{Nanos, QueueId};

#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub timeslice_ns: Nanos,
    /// Per queue: the activation it was last seen in, and the virtual time it was credited then.
    credit: BTreeMap<QueueId, (Option<Nanos>, f64)>,
}

impl Default for Bandwidth {
    fn default() -> Self {
        Self {
            timeslice_ns: DEFAULT_TIMESLICE_NS,
            credit: BTreeMap::new(),
        }
    }
}

impl Bandwidth {
    fn share(q: &QueueView, unhinted_share: f64) -> f64 {
        q.hints.utilization_share.unwrap_or(unhinted_share)
    }
}

impl Policy for Bandwidth {
    fn name(&self) -> &'static str {
        "bandwidth"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        let active: Vec<&QueueView> = view.queues.iter().filter(|q| q.is_active()).collect();
        self.credit
            .retain(|id, _| view.queues.iter().any(|q| q.id == *id));
        let hinted: f64 = active
            .iter()
            .filter_map(|q| q.hints.utilization_share)
            .sum();
        let unhinted = active
            .iter()
            .filter(|q| q.hints.utilization_share.is_none())
            .count();
        let unhinted_share = if unhinted == 0 {
            0.0
        } else {
            ((1.0 - hinted) / unhinted as f64).max(0.01)
        };
        let vtime =
            |q: &QueueView, credit: f64| q.run_ns as f64 / Self::share(q, unhinted_share) + credit;
        // Level a newly active queue with the least-served of the queues that were already active.
        let floor = active
            .iter()
            .filter_map(|q| match self.credit.get(&q.id) {
                Some(&(since, c)) if since == q.active_since => Some(vtime(q, c)),
                _ => None,
            })
            .fold(f64::INFINITY, f64::min);
        for q in &active {
            let entry = self.credit.entry(q.id).or_insert((None, 0.0));
            if entry.0 != q.active_since {
                let own = q.run_ns as f64 / Self::share(q, unhinted_share);
                let level = if floor.is_finite() { floor - own } else { 0.0 };
                *entry = (q.active_since, level.max(entry.1));
            }
        }
        let current = active.iter().find(|q| q.running_since.is_some());
        let slice_left = current.map(|q| {
            q.running_since.unwrap_or(view.now) + q.hints.timeslice_ns.unwrap_or(self.timeslice_ns)
        });
        let chosen = match (current, slice_left) {
            (Some(q), Some(end)) if end > view.now => Some((q.id, end)),
            _ => active
                .iter()
                .min_by(|a, b| {
                    let va = vtime(a, self.credit[&a.id].1);
                    let vb = vtime(b, self.credit[&b.id].1);
                    va.total_cmp(&vb).then(a.id.cmp(&b.id))
                })
                .map(|q| {
                    (
                        q.id,
                        view.now + q.hints.timeslice_ns.unwrap_or(self.timeslice_ns),
                    )
                }),
        };
        Decision {
            run: exclusive(view, chosen.map(|c| c.0)),
            wake_at: chosen.filter(|_| active.len() > 1).map(|c| c.1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    #[test]
    fn the_queue_furthest_behind_its_share_runs() {
        let mut bw = Bandwidth {
            timeslice_ns: 10,
            ..Bandwidth::default()
        };
        let mut qs = [queue(0, 0, Suspended), queue(1, 0, Suspended)];
        qs[0].hints.utilization_share = Some(0.75);
        qs[1].hints.utilization_share = Some(0.25);
        qs[0].running_since = None;
        qs[0].run_ns = 600; // 800 virtual
        qs[1].run_ns = 150; // 600 virtual
        let d = bw.decide(&View {
            now: 100,
            queues: &qs,
        });
        assert_eq!((ids(&d.run), d.wake_at), (vec![1], Some(110)));
        qs[1].run_ns = 300; // 1200 virtual
        let d = bw.decide(&View {
            now: 200,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![0]);
    }
}
