//! Earliest deadline first, on the queues' deadline hints. Queues without a deadline run only
//! when no queue with one is active.

use super::{Decision, Policy, View, exclusive};

#[derive(Clone, Copy, Debug, Default)]
pub struct Edf;

impl Policy for Edf {
    fn name(&self) -> &'static str {
        "edf"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        let chosen = view
            .queues
            .iter()
            .filter(|q| q.is_active())
            .min_by_key(|q| {
                (
                    q.hints.deadline_ns.unwrap_or(u64::MAX),
                    q.active_since,
                    q.id,
                )
            })
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
    fn the_earliest_deadline_preempts() {
        let mut qs = [queue(0, 0, Running), queue(1, 0, Ready), queue(2, 0, Ready)];
        qs[0].hints.deadline_ns = Some(900);
        qs[1].hints.deadline_ns = Some(500);
        let d = Edf.decide(&View {
            now: 0,
            queues: &qs,
        });
        assert_eq!(ids(&d.run), vec![1]);
        qs[0].hints.deadline_ns = None;
        qs[1].hints.deadline_ns = None;
        qs[2].active_since = Some(0);
        qs[0].active_since = Some(1);
        qs[1].active_since = Some(1);
        assert_eq!(
            ids(&Edf
                .decide(&View {
                    now: 0,
                    queues: &qs
                })
                .run),
            vec![2]
        );
    }
}
