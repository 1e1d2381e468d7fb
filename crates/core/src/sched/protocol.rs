//! The queue ↔ scheduler protocol: what a queue declares and reports, what the scheduler's state
//! machine takes, and what it answers. Every type here is serializable, so the same scheduler
//! runs in-process ([`super::local`]) or behind the daemon, and the same loop
//! ([`super::driver::Driver`]) applies its answers.

use serde::{Deserialize, Serialize};
use xpreempt_types::{ComputeUnits, Hints, Nanos, OpKind, Priority, ProcessId, QueueId, Seq};

/// What a queue declares when it is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub id: QueueId,
    pub process: ProcessId,
    pub device: u32,
    pub priority: Priority,
    pub hints: Hints,
    /// At most this many other queues may run alongside this one.
    pub interleave: Option<u32>,
    /// The compute units the hardware confines the queue to (`None`: all of them).
    #[serde(default)]
    pub compute_units: Option<ComputeUnits>,
    /// The queue's hardware can move it off some of its units while it runs
    /// ([`xpreempt_hal::HwQueue::can_confine`]): held back only by queues confined to some
    /// units, it yields those units instead of stopping.
    #[serde(default)]
    pub confinable: bool,
}

impl QueueInfo {
    pub fn new(id: QueueId, priority: Priority) -> Self {
        Self {
            id,
            process: 0,
            device: 0,
            priority,
            hints: Hints::default(),
            interleave: None,
            compute_units: None,
            confinable: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QueueState {
    /// Nothing pending, nothing in flight.
    Idle,
    /// Work is pending and nothing is in flight: the queue is about to launch.
    Ready,
    /// Work is in flight on the hardware.
    Running,
    /// The scheduler has stopped the queue; its work waits in the pending buffer and in-flight log.
    Suspended,
}

impl QueueState {
    /// The state's name as operators read it (`list`, `top`, traces).
    pub fn name(self) -> &'static str {
        match self {
            QueueState::Idle => "idle",
            QueueState::Ready => "ready",
            QueueState::Running => "running",
            QueueState::Suspended => "suspended",
        }
    }
}

/// What a queue tells the scheduler about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueReport {
    /// The queue had no work and now has some; `pending` commands wait in its buffer.
    /// `generation` counts the queue's Ready/Idle reports: reports that race on different
    /// threads are ordered by it, and an older one arriving late is dropped.
    Ready { pending: usize, generation: u64 },
    /// Everything submitted has completed.
    Idle { generation: u64 },
    /// A submission was refused admission and asks again; the queue's activity is unchanged.
    Retry,
    /// A command was submitted (sent only while the scheduler has hooks that want it).
    Submitted { kind: OpKind, seq: Seq },
    /// Every command below `upto` has completed (likewise only for hooks).
    Completed { upto: Seq },
    /// Work of this priority waits for this queue's buffered commands to be launched (an
    /// ordering edge: a record, a legacy or blocking stream); `None` once nothing waits. The
    /// queue inherits the priority meanwhile, so that it is not stopped on behalf of a queue
    /// that the waiter itself outranks.
    Inherit { priority: Option<Priority> },
}

/// What the scheduler's state machine takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SchedEvent {
    Created(QueueInfo),
    Destroyed(QueueId),
    /// The queue went from idle to having work; `pending` commands wait in it.
    Ready {
        queue: QueueId,
        pending: usize,
    },
    Idle(QueueId),
    /// A queue refused admission asks again (its submitter retried); its activity is unchanged.
    Admission(QueueId),
    Hints {
        queue: QueueId,
        hints: Hints,
    },
    Priority {
        queue: QueueId,
        priority: Priority,
    },
    /// Work passed through a queue: for the `work_submit` hook; decides nothing.
    Work {
        queue: QueueId,
        work: Work,
    },
    /// The time asked for by [`super::Scheduler::next_wake`] has come.
    Timer,
    /// The queue inherits `priority` from work that waits on it, or no longer (`None`).
    Inherit {
        queue: QueueId,
        priority: Option<Priority>,
    },
}

/// Work passing through a queue, as the `work_submit` hook sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Work {
    Submitted { kind: OpKind, seq: Seq },
    Completed { upto: Seq },
}

/// What the scheduler answers; applied in order by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Suspend(QueueId),
    Resume(QueueId),
    /// Admission refused: tell the submitter to back off and retry (it stays suspended).
    Refuse(QueueId),
    /// A queue refused earlier is admitted again (or went idle): its submitter may go on.
    Admit(QueueId),
    /// The queue runs on fewer (or again on all of its) compute units: those its hardware is to
    /// avoid are [`super::Scheduler::yielded_units`] as of when the action is applied. Comes
    /// before the queue's `Resume` where both are due.
    Confine(QueueId),
}

impl QueueReport {
    /// The scheduler event this report stands for. Ready/Idle generations are checked by the
    /// caller, which knows the last one applied.
    pub fn event(self, queue: QueueId) -> SchedEvent {
        match self {
            QueueReport::Ready { pending, .. } => SchedEvent::Ready { queue, pending },
            QueueReport::Idle { .. } => SchedEvent::Idle(queue),
            QueueReport::Retry => SchedEvent::Admission(queue),
            QueueReport::Submitted { kind, seq } => SchedEvent::Work {
                queue,
                work: Work::Submitted { kind, seq },
            },
            QueueReport::Completed { upto } => SchedEvent::Work {
                queue,
                work: Work::Completed { upto },
            },
            QueueReport::Inherit { priority } => SchedEvent::Inherit { queue, priority },
        }
    }

    /// The generation of a Ready/Idle report.
    pub fn generation(&self) -> Option<u64> {
        match *self {
            QueueReport::Ready { generation, .. } | QueueReport::Idle { generation } => {
                Some(generation)
            }
            _ => None,
        }
    }
}

/// How long after a failed resume the scheduler tries again.
pub const RESUME_RETRY_NS: Nanos = 1_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_map_to_events() {
        let q = QueueId(3);
        assert_eq!(
            QueueReport::Ready {
                pending: 2,
                generation: 1
            }
            .event(q),
            SchedEvent::Ready {
                queue: q,
                pending: 2
            }
        );
        assert_eq!(QueueReport::Idle { generation: 2 }.generation(), Some(2));
        assert_eq!(QueueReport::Retry.event(q), SchedEvent::Admission(q));
        assert_eq!(QueueReport::Retry.generation(), None);
    }
}
