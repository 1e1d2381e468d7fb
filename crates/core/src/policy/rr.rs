//! Round robin: active queues take turns, each for its timeslice (hint or policy default).

use super::{DEFAULT_TIMESLICE_NS, Decision, Policy, QueueView, View, exclusive, rotate};
use xpreempt_types::Nanos;

#[derive(Clone, Debug)]
pub struct RoundRobin {
    pub timeslice_ns: Nanos,
}

impl Default for RoundRobin {
    fn default() -> Self {
        Self {
            timeslice_ns: DEFAULT_TIMESLICE_NS,
        }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "rr"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        let active: Vec<&QueueView> = view.queues.iter().filter(|q| q.is_active()).collect();
        let choice = rotate(view, &active, self.timeslice_ns);
        Decision {
            run: exclusive(view, choice.map(|c| c.0)),
            wake_at: choice.filter(|_| active.len() > 1).map(|c| c.1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testutil::{ids, queue};
    use crate::sched::protocol::QueueState::*;

    #[test]
    fn turns_follow_each_queues_timeslice() {
        let mut rr = RoundRobin { timeslice_ns: 10 };
        let mut qs = [
            queue(0, 0, Suspended),
            queue(1, 0, Running),
            queue(2, 0, Idle),
        ];
        qs[1].hints.timeslice_ns = Some(30);
        let d = rr.decide(&View {
            now: 20,
            queues: &qs,
        });
        assert_eq!((ids(&d.run), d.wake_at), (vec![1], Some(30)));
        let d = rr.decide(&View {
            now: 30,
            queues: &qs,
        });
        assert_eq!((ids(&d.run), d.wake_at), (vec![0], Some(40)));
    }
}
