//! Highest priority first: the queues with the highest effective priority run; equal
//! priorities take turns by timeslice.

use super::{DEFAULT_TIMESLICE_NS, Decision, Policy, QueueView, View, rotate};
use xpreempt_types::Nanos;

#[derive(Clone, Debug)]
pub struct Hpf {
    /// Timeslice between active queues of the same priority.
    pub tie_timeslice_ns: Nanos,
}

impl Default for Hpf {
    fn default() -> Self {
        Self {
            tie_timeslice_ns: DEFAULT_TIMESLICE_NS,
        }
    }
}

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
        let tied: Vec<&QueueView> = view
            .queues
            .iter()
            .filter(|q| q.is_active() && q.effective_priority == top)
            .collect();
        let mut decision = Decision::default();
        if let Some((id, slice_end)) = rotate(view, &tied, self.tie_timeslice_ns) {
            decision.run.insert(id);
            if tied.len() > 1 {
                decision.wake_at = Some(slice_end);
            }
        }
        // An idle queue above everything active may launch the moment it submits.
        decision.run.extend(
            view.queues
                .iter()
                .filter(|q| !q.is_active() && q.effective_priority > top)
                .map(|q| q.id),
        );
        decision
    }

    /// The effective priority: a higher active queue leaves a lower one out (it is below the
    /// top), and a queue above every other active one is the top alone (or an idle queue above
    /// everything active) and runs.
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        Some(i64::from(queue.effective_priority))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    #[test]
    fn the_highest_active_priority_runs() {
        let qs = [
            queue(0, 3, Running),
            queue(1, 12, Ready),
            queue(2, 20, Idle),
            queue(3, 5, Idle),
        ];
        let d = Hpf::default().decide(&View {
            now: 10,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![1, 2]);
        assert_eq!(d.wake_at, None);
    }

    #[test]
    fn everything_may_run_on_an_idle_device() {
        let qs = [queue(0, 3, Idle), queue(1, -7, Idle)];
        let d = Hpf::default().decide(&View {
            now: 0,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![0, 1]);
    }

    #[test]
    fn equal_priorities_take_turns() {
        let mut hpf = Hpf {
            tie_timeslice_ns: 100,
        };
        let mut qs = [
            queue(0, 5, Running),
            queue(1, 5, Suspended),
            queue(2, 1, Suspended),
        ];
        let d = hpf.decide(&View {
            now: 50,
            queues: &qs,
        });
        assert_eq!((ids(&d.run), d.wake_at), (vec![0], Some(100)));
        let d = hpf.decide(&View {
            now: 100,
            queues: &qs,
        });
        assert_eq!((ids(&d.run), d.wake_at), (vec![1], Some(200)));
        qs[0].running_since = None;
        qs[1].running_since = Some(100);
        let d = hpf.decide(&View {
            now: 200,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![0]);
    }
}
