//! What each mechanism costs on each device, for operators, the metrics and decisions: each
//! queue's suspend and resume latencies, read from its slot, go into the daemon's
//! [`CostBook`](crate::costs::CostBook) by device and level.

use super::State;
use crate::costs::Latencies;
use xpreempt_core::{Level, QueueId};
use xpreempt_ipc::costs::{DeviceCosts, MechanismCost};

impl State {
    /// What `queue`'s agent last published of its suspend and resume latencies.
    fn queue_latencies(&self, queue: QueueId) -> Option<Latencies> {
        let e = self.queues.get(&queue)?;
        let slot = self
            .clients
            .get(&e.client)?
            .segment
            .as_ref()?
            .slot(e.slot)?;
        Some(Latencies {
            suspend: slot.suspend_latency.load(),
            resume: slot.resume_latency.load(),
        })
    }

    fn observe_costs(&mut self, queue: QueueId) {
        let now = self.now();
        if let (Some(e), Some(l)) = (self.queues.get(&queue), self.queue_latencies(queue)) {
            self.costs.observe(queue, e.device, e.level, now, l);
        }
    }

    /// Takes every queue's latencies into the costs: on the daemon's tick, and before the
    /// costs are shown.
    pub fn sample_costs(&mut self) {
        let queues: Vec<QueueId> = self.queues.keys().copied().collect();
        for q in queues {
            self.observe_costs(q);
        }
    }

    /// A queue leaves: what it measured since the last tick counts too.
    pub(super) fn retire_costs(&mut self, queue: QueueId) {
        self.observe_costs(queue);
        self.costs.forget(queue);
    }

    /// Every mechanism's measured cost on every device the daemon schedules, as of now.
    pub fn mechanism_costs(&mut self) -> Vec<DeviceCosts> {
        self.sample_costs();
        let now = self.now();
        self.costs.devices(self.devices.keys().copied(), now)
    }

    /// The measured cost of stopping and restarting a queue of `device` at `level` (the Lv1
    /// drain, the Lv2 block-boundary stop, the Lv3 switch), merged over the device's queues at
    /// that level over the recent past, as of the last tick; `stop` and `restart` are `None`
    /// until a suspension at that level was measured there. For decisions that weigh a
    /// suspension's price.
    pub fn mechanism_cost(&self, device: u32, level: Level) -> MechanismCost {
        self.costs.cost(device, level, self.now())
    }
}
