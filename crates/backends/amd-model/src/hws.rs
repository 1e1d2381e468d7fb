//! The hardware scheduler's side of MQD/HQD mapping (seed 004): MQDs are unlimited, HQD slots
//! come from CPSCH; queues waiting for a slot are mapped by one runlist batch; when there are
//! more active queues than slots, the HWS rotates them every quantum (oversubscription). On a
//! multi-XCC part one MQD is loaded into the same (pipe, queue) on every XCC in `xcc_mask`.

use crate::config::us;
use crate::cwsr::{After, DestroyMode};
use crate::device::{Ev, Gpu, MqdState, Pending};
use crate::error::ModelError;
use xpreempt_types::QueueId;

impl Gpu {
    /// Sends one runlist with every waiting queue that an HQD slot can be found for, oldest
    /// waiter first.
    pub(crate) fn schedule_runlist(&mut self) {
        let now = self.now;
        let mut batch = 0;
        // Queues with work go first; an idle queue does not need its HQD yet.
        let (mut order, idle): (Vec<u32>, Vec<u32>) = self
            .waiting
            .iter()
            .partition(|&&qi| self.has_work(qi as usize));
        order.extend(idle);
        let mut mapped = Vec::new();
        for qi in order {
            let process = self.queues[qi as usize].process;
            let Ok(slot) = self.cpsch.allocate(process) else {
                break;
            };
            mapped.push(qi);
            let runlist = us(self.cfg.runlist_us);
            let q = &mut self.queues[qi as usize];
            // A CWSR restore reloads saved waves directly; a plain map goes through the runlist.
            let cost = if q.saved.is_empty() {
                runlist
            } else {
                q.restore_ns
            };
            q.slot = Some(slot);
            q.state = MqdState::Mapping;
            q.generation = q.generation.wrapping_add(1);
            q.map_since = now;
            q.map_cost = cost;
            let generation = q.generation;
            self.events.push(
                now.saturating_add(cost),
                Ev::MapDone {
                    queue: qi,
                    generation,
                },
            );
            batch += 1;
        }
        self.waiting.retain(|q| !mapped.contains(q));
        if batch > 0 {
            self.stats.runlists += 1;
            self.stats.maps += batch;
            self.sample_occupancy();
        }
        self.arm_quantum();
    }

    /// Work in the ring or saved waves: what makes a queue worth an HQD.
    pub(crate) fn has_work(&self, qi: usize) -> bool {
        let q = &self.queues[qi];
        q.ring.pending() > 0 || !q.saved.is_empty() || q.running > 0
    }

    /// The HWS only rotates while a queue with work is waiting for an HQD.
    pub(crate) fn arm_quantum(&mut self) {
        if !self.quantum_armed && self.waiting.iter().any(|&w| self.has_work(w as usize)) {
            self.quantum_armed = true;
            self.events
                .push(self.after(us(self.cfg.quantum_us)), Ev::Quantum);
        }
    }

    pub(crate) fn map_done(&mut self, queue: u32, generation: u32) {
        let qi = queue as usize;
        let now = self.now;
        let q = &mut self.queues[qi];
        if q.generation != generation || q.state != MqdState::Mapping {
            return;
        }
        q.state = MqdState::Mapped;
        q.mapped_since = now;
        if q.off_read_id.take().is_some_and(|r| r != q.ring.read_id()) {
            self.stats.ring_moved_while_preempted += 1;
        }
        let (kind, since) = (q.map_kind, q.map_since);
        q.map_kind = "map";
        self.record(QueueId(queue), kind, since);
        if kind == "resume"
            && let Some(t) = self.trace.as_mut()
        {
            let args = serde_json::json!({ "latency_us": (now - since) as f64 / 1000.0 });
            t.marker(queue, "resume", now, args);
        }
        self.touch(queue);
        if let Some(Pending::Preempt(mode)) = self.queues[qi].pending.take()
            && let Err(e) = self.start_unmap(QueueId(queue), mode, After::Preempted)
        {
            tracing::warn!(error = %e, "deferred preemption failed");
            self.queues[qi].error = Some(e);
        }
    }

    /// Oversubscription: idle mapped queues, then those mapped longest, make room for the
    /// waiting queues that have work.
    pub(crate) fn quantum(&mut self) {
        self.quantum_armed = false;
        let want = self
            .waiting
            .iter()
            .filter(|&&w| self.has_work(w as usize))
            .count();
        if want == 0 || self.stats.hws_hung {
            return;
        }
        let mut mapped: Vec<(bool, u64, u32)> = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.state == MqdState::Mapped && q.pending.is_none())
            .map(|(i, q)| (self.has_work(i), q.mapped_since, i as u32))
            .collect();
        mapped.sort_unstable();
        for &(_, _, qi) in mapped.iter().take(want) {
            if let Err(e) =
                self.start_unmap(QueueId(qi), DestroyMode::WavefrontSave, After::Waiting)
            {
                tracing::warn!(error = %e, "oversubscription unmap failed");
            }
        }
        self.arm_quantum();
    }

    /// MQDs that exist and HQDs they occupy, summed over XCCs.
    pub fn mqd_hqd_counts(&self) -> (u32, u32) {
        let xccs = self.cfg.topology.xccs();
        let mqds = self
            .queues
            .iter()
            .filter(|q| q.state != MqdState::Destroyed)
            .count() as u32;
        let slots = self.queues.iter().filter(|q| q.slot.is_some()).count() as u32;
        (mqds, slots * xccs)
    }

    pub(crate) fn sample_occupancy(&mut self) {
        let (m, h) = self.mqd_hqd_counts();
        if self
            .occupancy
            .last()
            .is_none_or(|&(_, lm, lh)| (lm, lh) != (m, h))
        {
            self.occupancy.push((self.now, m, h));
            if let Some(t) = self.trace.as_mut() {
                t.counter("MQDs / HQDs", self.now, &[("mqds", m), ("hqds", h)]);
            }
        }
    }

    /// The physical HQDs a queue occupies: (xcc, pipe, queue) for every XCC in the mask.
    pub fn physical_hqds(&self, queue: QueueId) -> Result<Vec<(u32, u32, u32)>, ModelError> {
        let Some(slot) = self.q(queue)?.slot else {
            return Ok(Vec::new());
        };
        let mask = self.cfg.topology.xcc_mask;
        Ok((0..32)
            .filter(|x| mask & (1 << x) != 0)
            .map(|x| (x, slot.pipe, slot.queue))
            .collect())
    }
}
