//! The KFD-style API: create, destroy and update a queue with a logical priority, and the two
//! new ioctls, preempt queue and resume queue, which check that the caller owns the
//! queue unless it is privileged (the kernel-side monitor of Scheme A, or CAP_SYS_ADMIN).
//!
//! The hardware priority of every queue is NORMAL, as ROCr hard-codes it; the logical priority
//! is only read by software schedulers.

use crate::compute::CuMask;
use crate::device::{Gpu, MqdState};
use crate::error::ModelError;
use crate::ring::Ring;
use crate::unmap::{After, DestroyMode};
use xpreempt_types::{Priority, ProcessId, QueueId};

/// Who makes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub process: ProcessId,
    pub privileged: bool,
}

impl Caller {
    pub fn process(process: ProcessId) -> Self {
        Self {
            process,
            privileged: false,
        }
    }

    /// Code inside the driver (Scheme A's monitor thread).
    pub fn kernel() -> Self {
        Self {
            process: 0,
            privileged: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct QueueProps {
    pub name: String,
    pub ring_size: u32,
    pub logical_priority: Priority,
    pub cu_mask: Option<CuMask>,
}

impl QueueProps {
    pub fn new(name: &str, logical_priority: Priority) -> Self {
        Self {
            name: name.to_string(),
            ring_size: 256,
            logical_priority,
            cu_mask: None,
        }
    }
}

impl Gpu {
    fn hung(&self) -> Result<(), ModelError> {
        if self.stats.hws_hung {
            Err(ModelError::HwsHung {
                timeout_us: self.cfg.unmap_timeout_us.max(0.0) as u64,
            })
        } else {
            Ok(())
        }
    }

    fn owned(&self, caller: Caller, queue: QueueId, op: &'static str) -> Result<(), ModelError> {
        let owner = self.q(queue)?.process;
        if caller.privileged || caller.process == owner {
            Ok(())
        } else {
            Err(ModelError::PermissionDenied {
                caller: caller.process,
                owner,
                queue,
                op,
            })
        }
    }

    /// `create_queue`: allocates the MQD and ring and maps the queue. Without oversubscription a
    /// full MEC answers EBUSY and nothing is created.
    pub fn create_queue(
        &mut self,
        caller: Caller,
        props: QueueProps,
    ) -> Result<QueueId, ModelError> {
        self.hung()?;
        let ring = Ring::new(props.ring_size)
            .map_err(|e| ModelError::Ring(QueueId(self.queues.len() as u32), e))?;
        if let Some(m) = &props.cu_mask
            && m.count() == 0
        {
            return Err(ModelError::EmptyCuMask {
                name: props.name.clone(),
            });
        }
        if !self.cfg.oversubscription && self.cpsch.free_slots() <= self.waiting.len() as u32 {
            // What allocate_hqd answers on a full MEC.
            let t = self.cpsch.topology();
            return Err(crate::cpsch::CpschError::Busy {
                mec: t.user_mec,
                slots: t.user_slots(),
            }
            .into());
        }
        let hq = self.new_hq(
            &props.name,
            caller.process,
            props.logical_priority,
            ring,
            props.cu_mask,
        );
        let id = self.add_queue(hq);
        self.waiting.push_back(id.0);
        self.schedule_runlist();
        self.sample_occupancy();
        Ok(id)
    }

    /// `destroy_queue`: waves are discarded, the HQD and MQD freed.
    pub fn destroy_queue(&mut self, caller: Caller, queue: QueueId) -> Result<(), ModelError> {
        self.owned(caller, queue, "destroy")?;
        let now = self.now;
        for slot in self.compute.live_of(queue.0) {
            if let Some(wg) = self.compute.end(slot, true, now)
                && let Some(t) = self.trace.as_mut()
            {
                t.wg_end(self.compute.group_of(wg.cu), queue.0, now);
            }
        }
        let q = &mut self.queues[queue.0 as usize];
        let slot = q.slot.take();
        q.hqd_wait_since = None;
        q.state = MqdState::Destroyed;
        q.running = 0;
        q.active.clear();
        q.saved.clear();
        q.generation = q.generation.wrapping_add(1);
        if let Some(slot) = slot {
            self.cpsch.deallocate(slot)?;
        }
        self.waiting.retain(|&w| w != queue.0);
        self.sample_occupancy();
        self.schedule_runlist();
        self.pump();
        Ok(())
    }

    /// `update_queue`: a new logical priority and/or CU mask. A new CU mask reaches the
    /// hardware as KFD's does under the HWS: the runlist is executed again, so every mapped
    /// queue, not only this one, is taken off with its waves saved (CWSR) and mapped again
    /// (`runlist-remap` in the trace), waiting for its HQD as a rotation does. Saved waves come
    /// back on their queue's current mask.
    pub fn update_queue(
        &mut self,
        caller: Caller,
        queue: QueueId,
        logical_priority: Option<Priority>,
        cu_mask: Option<Option<CuMask>>,
    ) -> Result<(), ModelError> {
        self.owned(caller, queue, "update")?;
        let q = self.q_mut(queue)?;
        if let Some(p) = logical_priority {
            q.priority = p;
        }
        if let Some(m) = cu_mask
            && m != self.queues[queue.0 as usize].cu_mask
        {
            self.hung()?;
            self.queues[queue.0 as usize].cu_mask = m;
            let xccs = self
                .compute
                .xccs_of(self.queues[queue.0 as usize].cu_mask.as_ref());
            self.queues[queue.0 as usize].xccs = xccs;
            self.stats.runlist_reexecutions += 1;
            let mapped: Vec<QueueId> = self
                .queue_ids()
                .filter(|&id| self.queues[id.0 as usize].state == MqdState::Mapped)
                .collect();
            for id in mapped {
                self.start_unmap(id, DestroyMode::WavefrontSave, After::Remapped)?;
            }
        }
        self.pump();
        Ok(())
    }

    pub fn logical_priority(&self, queue: QueueId) -> Result<Priority, ModelError> {
        Ok(self.q(queue)?.priority)
    }

    /// The queue's CU mask as 64-bit words (`None`: every CU).
    pub fn cu_mask_words(&self, queue: QueueId) -> Result<Option<Vec<u64>>, ModelError> {
        Ok(self.q(queue)?.cu_mask.as_ref().map(|m| m.words().to_vec()))
    }

    pub fn owner(&self, queue: QueueId) -> Result<ProcessId, ModelError> {
        Ok(self.q(queue)?.process)
    }

    pub fn queue_name(&self, queue: QueueId) -> Result<&str, ModelError> {
        Ok(&self.q(queue)?.name)
    }

    /// The preempt-queue ioctl: `checkpoint_mqd` then `destroy_mqd(mode)`.
    pub fn preempt_queue(
        &mut self,
        caller: Caller,
        queue: QueueId,
        mode: DestroyMode,
    ) -> Result<(), ModelError> {
        self.owned(caller, queue, "preempt")?;
        self.hung()?;
        self.checkpoint_mqd(queue)?;
        self.destroy_mqd(queue, mode)?;
        self.pump();
        Ok(())
    }

    /// The resume-queue ioctl: `restore_mqd` + `load_mqd`.
    pub fn resume_queue(&mut self, caller: Caller, queue: QueueId) -> Result<(), ModelError> {
        self.owned(caller, queue, "resume")?;
        self.hung()?;
        self.begin_resume(queue)?;
        self.pump();
        Ok(())
    }

    /// Lv2's unmap: a DRAIN preemption without the CWSR snapshot.
    pub fn unmap_queue(&mut self, caller: Caller, queue: QueueId) -> Result<(), ModelError> {
        self.owned(caller, queue, "unmap")?;
        self.hung()?;
        self.destroy_mqd(queue, DestroyMode::Drain)?;
        self.pump();
        Ok(())
    }

    /// Lv2's map: the queue goes back through the runlist.
    pub fn map_queue(&mut self, caller: Caller, queue: QueueId) -> Result<(), ModelError> {
        self.resume_queue(caller, queue)
    }
}
