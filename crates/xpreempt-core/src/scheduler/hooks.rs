//! Points where a programmable policy (the eBPF layer) joins the scheduler, and what a queue
//! declares when it is created.

use crate::command::{OpKind, Seq};
use crate::hints::Hints;
use crate::{Nanos, Priority, ProcessId, QueueId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub id: QueueId,
    pub process: ProcessId,
    pub device: u32,
    pub priority: Priority,
    pub hints: Hints,
    /// At most this many other queues may run alongside this one.
    pub interleave: Option<u32>,
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
        }
    }
}

/// Called by the scheduler at the seed's hook points. Every method has a neutral default.
pub trait Hooks: Send {
    /// A queue is being created; may set its priority, timeslice hint and interleave limit.
    fn task_init(&mut self, info: &mut QueueInfo) {
        let _ = info;
    }

    /// A queue that was idle has work again. May derive its settings anew from what it declared at
    /// creation (`declared`, before `task_init`) and what the hooks learned since, such as its
    /// submit rate; `None` keeps the current ones.
    fn reclassify(&mut self, declared: &QueueInfo) -> Option<QueueInfo> {
        let _ = declared;
        None
    }

    /// A queue asks to run with `pending` commands while `running` queues run. `false` refuses
    /// admission: the submitter is told to back off and retry.
    fn admit(&mut self, queue: QueueId, pending: usize, running: usize) -> bool {
        let _ = (queue, pending, running);
        true
    }

    /// A command was submitted to a queue (the front end calls this on its submit path, so an
    /// implementation must be cheap).
    fn work_submit(&mut self, queue: QueueId, kind: OpKind, seq: Seq, now: Nanos) {
        let _ = (queue, kind, seq, now);
    }

    /// A queue is gone, after `run_ns` of running in total.
    fn task_destroy(&mut self, queue: QueueId, run_ns: Nanos) {
        let _ = (queue, run_ns);
    }
}
