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
        let slot = self.clients.get(&e.client)?.slot(e.slot)?;
        Some(Latencies {
            suspend: slot.suspend_latency.load(),
            drain: slot.drain_latency.load(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use xpreempt_core::policy;
    use xpreempt_core::sched::Scheduler;
    use xpreempt_ipc::msg::QueueDecl;
    use xpreempt_ipc::shm::Segment;
    use xpreempt_ipc::unix::Cred;
    use xpreempt_types::histogram::Histogram;

    fn hist(values: &[u64]) -> Histogram {
        let mut h = Histogram::new();
        values.iter().for_each(|&v| h.record(v));
        h
    }

    fn decl(level: Level) -> QueueDecl {
        QueueDecl {
            device: 0,
            priority: 0,
            hints: Default::default(),
            interleave: None,
            level,
        }
    }

    #[test]
    fn a_queue_s_latencies_reach_its_device_and_level_and_outlive_it_once() {
        let mut st = State::new(Box::new(|| Ok(Scheduler::new(policy::by_name("hpf")?))));
        let segment = Arc::new(Segment::create(2).unwrap());
        let cred = Cred {
            pid: 1,
            uid: 1,
            gid: 1,
        };
        let client = st.add_client(cred, "app".into(), Some(segment.clone()));
        let (q, _) = st.register(client, 0, decl(Level::Lv3)).unwrap();
        let slot = segment.slot(0).unwrap();
        slot.suspend_latency.store(&hist(&[2_000_000, 3_000_000]));
        slot.resume_latency.store(&hist(&[1_000_000, 1_000_000]));
        st.sample_costs();
        let c = st.mechanism_cost(0, Level::Lv3);
        assert_eq!(c.stop.unwrap().samples, 2);
        assert_eq!(c.stop.unwrap().mean_ns, 2_500_000);
        assert_eq!(c.restart.unwrap().mean_ns, 1_000_000);
        assert!(st.mechanism_cost(0, Level::Lv2).stop.is_none());
        // Published after the last tick, just before the queue left: counted once.
        slot.suspend_latency
            .store(&hist(&[2_000_000, 3_000_000, 4_000_000]));
        st.unregister(client, q).unwrap();
        assert_eq!(st.mechanism_cost(0, Level::Lv3).stop.unwrap().samples, 3);
        // The slot's next queue starts from nothing, not from its predecessor's samples.
        st.register(client, 0, decl(Level::Lv3)).unwrap();
        let costs = st.mechanism_costs();
        assert_eq!(costs.len(), 1);
        assert_eq!(costs[0].mechanisms[2].stop.unwrap().samples, 3);
        assert_eq!(costs[0].mechanisms[2].stop.unwrap().mean_ns, 3_000_000);
    }
}
