//! The preemptions and resumes a run decided, per queue and when, for the trace. The table
//! counts decisions (the scheduler's at lv1/lv2/lv3, the monitor's under Scheme A), not
//! hardware transitions: Lv1 stops a queue without touching the hardware, and the model folds
//! some requests into others (a resume that cancels a preemption still in flight). So the trace
//! gets one `preempt`/`resume` marker per counted decision, next to the model's own `hw-*`
//! markers, and their counts match the table's.
//!
//! Only kept when tracing: diffing every queue's counters after every event costs
//! O(queues) per event.

use crate::scheme_b::SchemeB;
use serde_json::json;
use xpreempt_amd::scheme_a::Monitor;
use xpreempt_amd::trace::TraceBuf;
use xpreempt_amd::{Gpu, MqdState};
use xpreempt_core::{Nanos, QueueId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub at: Nanos,
    pub task: usize,
    pub resume: bool,
}

pub(crate) struct DecisionLog {
    /// Per task: (preemptions, resumes) as last seen.
    seen: Vec<(u64, u64)>,
    /// Scheme A: monitor decisions already logged, and its resume count.
    monitor_decisions: usize,
    monitor_resumes: u64,
    pub(crate) decisions: Vec<Decision>,
}

impl DecisionLog {
    pub(crate) fn new(tasks: usize) -> Self {
        Self {
            seen: vec![(0, 0); tasks],
            monitor_decisions: 0,
            monitor_resumes: 0,
            decisions: Vec::new(),
        }
    }

    /// Scheme B: what each XQueue counted since the last call. A queue counts a suspension only
    /// when it was running and a resume only when it was suspended, so its counters alternate
    /// and both moving in one call is a preempt-resume (or resume-preempt) pair.
    pub(crate) fn scheme_b(&mut self, b: &SchemeB, now: Nanos) {
        for (task, q) in b.queue_stats().enumerate() {
            let Some(seen) = self.seen.get_mut(task) else {
                continue;
            };
            let (mut p, mut r) = *seen;
            while p < q.preemptions || r < q.resumes {
                // Suspended now (more preemptions than resumes): the next decision resumes.
                let resume = (p > r && r < q.resumes) || p >= q.preemptions;
                if resume {
                    r += 1;
                } else {
                    p += 1;
                }
                self.decisions.push(Decision {
                    at: now,
                    task,
                    resume,
                });
            }
            *seen = (p, r);
        }
    }

    /// Scheme A: runs the monitor's due checks and logs what they decided. Preemptions name
    /// their queue; a resume does not, so it is the preempted queue that left the Preempted
    /// state, or else (a resume folded into an unmap still in flight) the preempted queues in
    /// the order the monitor scans them.
    pub(crate) fn run_monitor(&mut self, m: &mut Monitor, gpu: &mut Gpu, now: Nanos) {
        let state = |gpu: &Gpu, t: usize| gpu.state(QueueId(t as u32)).ok();
        let before: Vec<Option<MqdState>> = (0..self.seen.len()).map(|t| state(gpu, t)).collect();
        m.run_due(gpu, now);
        let preempted = |log: &Self, t: usize| log.seen[t].0 > log.seen[t].1;
        let resumes = m.stats.resumes - self.monitor_resumes;
        self.monitor_resumes = m.stats.resumes;
        // Resumes come after the preemption of the same check (step 5 after step 3), and never
        // for a queue that check preempted.
        let mut resumed: Vec<usize> = (0..self.seen.len())
            .filter(|&t| {
                preempted(self, t)
                    && before[t] == Some(MqdState::Preempted)
                    && state(gpu, t) != Some(MqdState::Preempted)
            })
            .collect();
        for t in 0..self.seen.len() {
            if (resumed.len() as u64) >= resumes {
                break;
            }
            if preempted(self, t) && !resumed.contains(&t) {
                resumed.push(t);
            }
        }
        resumed.truncate(resumes as usize);
        resumed.sort_unstable();
        for t in resumed {
            self.seen[t].1 += 1;
            self.decisions.push(Decision {
                at: now,
                task: t,
                resume: true,
            });
        }
        for d in &m.decisions[self.monitor_decisions..] {
            let t = d.low.0 as usize;
            if let Some(seen) = self.seen.get_mut(t) {
                seen.0 += 1;
            }
            self.decisions.push(Decision {
                at: d.at,
                task: t,
                resume: false,
            });
        }
        self.monitor_decisions = m.decisions.len();
    }

    /// Adds the decisions and every request's arrival to the trace, on the tasks' queue tracks.
    pub(crate) fn write(&self, trace: &mut TraceBuf, arrivals: &[(Nanos, usize)]) {
        let mut nth = vec![0u64; self.seen.len()];
        for &(at, task) in arrivals {
            let request = nth.get_mut(task).map_or(0, |n| {
                *n += 1;
                *n - 1
            });
            trace.push_marker(task as u32, "arrival", at, json!({ "request": request }));
        }
        for d in &self.decisions {
            let name = if d.resume { "resume" } else { "preempt" };
            trace.push_marker(d.task as u32, name, d.at, json!({ "decision": true }));
        }
    }
}
