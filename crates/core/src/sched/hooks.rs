//! Points where a programmable policy (the eBPF layer) joins the scheduler: four hooks.

use super::protocol::{QueueInfo, Work};
use xpreempt_types::{Nanos, QueueId};

/// Called by the scheduler at the hook points. Every method has a neutral default.
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

    /// A command was submitted to a queue, or its commands completed up to a point. Called on
    /// the submit path, so an implementation must be cheap.
    fn work_submit(&mut self, queue: QueueId, work: Work, now: Nanos) {
        let _ = (queue, work, now);
    }

    /// The implementation itself, for a host that knows its concrete type (the daemon reaches an
    /// eBPF program's maps this way).
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// A queue is gone, after `run_ns` of running in total.
    fn task_destroy(&mut self, queue: QueueId, run_ns: Nanos) {
        let _ = (queue, run_ns);
    }
}
