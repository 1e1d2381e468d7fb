//! The hardware scheduler's side of MQD/HQD mapping: MQDs are unlimited, HQD slots
//! come from CPSCH; queues waiting for a slot are mapped by one runlist batch. A busy queue
//! without a slot is mapped at once in place of an idle or lower-priority one, as KFD unmaps
//! idle queues and remaps on demand; among equals the HWS rotates every quantum
//! (oversubscription). On a multi-XCC part one MQD is loaded into the same (pipe, queue) on
//! every XCC in `xcc_mask`.

use crate::config::us;
use crate::device::{Ev, Gpu, MqdState, Pending};
use crate::error::ModelError;
use crate::unmap::{After, DestroyMode};
use xpreempt_types::{Priority, QueueId};

impl Gpu {
    /// Sends one runlist with every waiting queue that an HQD slot can be found for: busy
    /// queues first, highest logical priority first (KFD builds the runlist; the logical
    /// priority is in the MQD's properties), then idle ones. Busy queues left without a slot
    /// take one from an idle or lower-priority queue at once ([`Gpu::make_room`]).
    pub(crate) fn schedule_runlist(&mut self) {
        let now = self.now;
        let mut batch = 0;
        let mut order: Vec<u32> = self.waiting.iter().copied().collect();
        // Stable: FIFO among equals, so the HWS rotation stays fair between them.
        order.sort_by_key(|&qi| self.runlist_rank(qi as usize));
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
            q.hqd.maps += 1;
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
        self.make_room();
        self.arm_quantum();
    }

    /// Sort key of a waiting queue in the runlist: busy before idle, then higher priority.
    fn runlist_rank(&self, qi: usize) -> (bool, std::cmp::Reverse<Priority>) {
        let busy = self.has_work(qi);
        let prio = if busy {
            self.queues[qi].priority
        } else {
            Priority::MIN
        };
        (!busy, std::cmp::Reverse(prio))
    }

    /// Busy waiting queues, highest priority first (FIFO among equals).
    fn busy_waiters(&self) -> Vec<(Priority, u32)> {
        let mut want: Vec<(Priority, u32)> = self
            .waiting
            .iter()
            .filter(|&&w| self.has_work(w as usize))
            .map(|&w| (self.queues[w as usize].priority, w))
            .collect();
        want.sort_by_key(|&(p, _)| std::cmp::Reverse(p));
        want
    }

    /// HQDs that unmaps now in flight will free (a resume waiting on its unmap takes its own
    /// back).
    fn slots_coming(&self) -> usize {
        self.queues
            .iter()
            .filter(|q| q.state == MqdState::Unmapping && q.pending != Some(Pending::Resume))
            .count()
    }

    /// Unmaps, for each busy waiting queue beyond the slots already on their way back, one
    /// mapped queue that `allowed` lets it take: idle ones first, then the lowest priority,
    /// then the one mapped longest. `rotation`: the HWS quantum does it, not an on-demand runlist.
    fn take_slots(&mut self, rotation: bool, allowed: impl Fn(bool, Priority, Priority) -> bool) {
        if self.stats.hws_hung {
            return;
        }
        let want = self.busy_waiters();
        let coming = self.slots_coming();
        if want.len() <= coming {
            return;
        }
        let mut mapped: Vec<(bool, Priority, u64, u32)> = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.state == MqdState::Mapped && q.pending.is_none())
            .map(|(i, q)| (self.has_work(i), q.priority, q.mapped_since, i as u32))
            .collect();
        mapped.sort_unstable();
        for &(prio, _) in &want[coming..] {
            let Some(k) = mapped
                .iter()
                .position(|&(busy, p, _, _)| allowed(busy, p, prio))
            else {
                continue;
            };
            let (busy, _, _, victim) = mapped.remove(k);
            if let Err(e) =
                self.start_unmap(QueueId(victim), DestroyMode::WavefrontSave, After::Waiting)
            {
                tracing::warn!(error = %e, "HQD hand-off unmap failed");
                continue;
            }
            let (h, s) = (&mut self.queues[victim as usize].hqd, &mut self.stats);
            match (busy, rotation) {
                (false, _) => {
                    (h.idle_unmaps, s.idle_unmaps) = (h.idle_unmaps + 1, s.idle_unmaps + 1)
                }
                (true, true) => (h.rotations, s.rotations) = (h.rotations + 1, s.rotations + 1),
                (true, false) => {
                    (h.displaced, s.displacements) = (h.displaced + 1, s.displacements + 1)
                }
            }
        }
    }

    /// On-demand hand-off (KFD's execute_queues: unmap, then map the new runlist): a busy queue
    /// without an HQD takes the slot of an idle queue or of a busy lower-priority one now,
    /// rather than at the next quantum. Equal priorities wait for the HWS rotation.
    fn make_room(&mut self) {
        self.take_slots(false, |busy, p, want| !busy || p < want);
    }

    /// An HQD of a queue that went idle goes to a busy waiter at once ([`Gpu::make_room`]).
    pub(crate) fn hand_over_idle(&mut self) {
        if self.waiting.iter().any(|&w| self.has_work(w as usize)) {
            self.make_room();
        }
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
        self.hqd_wait_end(qi);
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

    /// Oversubscription among equals: every quantum, each busy waiting queue takes the HQD of
    /// an idle queue or of one of no higher priority, the one mapped longest first. A queue
    /// never loses its HQD to a lower-priority one.
    pub(crate) fn quantum(&mut self) {
        self.quantum_armed = false;
        self.take_slots(true, |busy, p, want| !busy || p <= want);
        self.arm_quantum();
    }

    /// Starts counting HQD wait: the queue has work and no HQD it can run on.
    pub(crate) fn hqd_wait_begin(&mut self, qi: usize) {
        let busy = self.has_work(qi);
        let q = &mut self.queues[qi];
        let off = match q.state {
            MqdState::Waiting | MqdState::Mapping => true,
            MqdState::Unmapping => q.unmap.as_ref().is_some_and(|u| u.after.waits()),
            _ => false,
        };
        if busy && off && q.hqd_wait_since.is_none() {
            q.hqd_wait_since = Some(self.now);
        }
    }

    /// Ends an HQD wait: the queue is mapped, or the scheduler took it off on purpose.
    pub(crate) fn hqd_wait_end(&mut self, qi: usize) {
        let q = &mut self.queues[qi];
        let Some(since) = q.hqd_wait_since.take() else {
            return;
        };
        let waited = self.now.saturating_sub(since);
        q.hqd.hqd_waits += 1;
        q.hqd.hqd_wait_ns = q.hqd.hqd_wait_ns.saturating_add(waited);
        q.hqd.max_hqd_wait_ns = q.hqd.max_hqd_wait_ns.max(waited);
        self.stats.hqd_wait_ns = self.stats.hqd_wait_ns.saturating_add(waited);
        self.stats.max_hqd_wait_ns = self.stats.max_hqd_wait_ns.max(waited);
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
