//! Taking a queue off the hardware: `checkpoint_mqd`, then `destroy_mqd` in one of
//! three modes, with KFD's unmap fence and timeout. The ring's read and write ids are never
//! touched, so resume needs nothing resubmitted.
//!
//! - WAVEFRONT_SAVE (CWSR): waves stop at an instruction boundary; their state is saved at a
//!   cost growing with the waves on the busiest CU, and they later continue where they stopped.
//! - DRAIN: no new workgroups start; running ones finish. Takes as long as they do, which is
//!   what can miss the fence.
//! - RESET: waves are killed at once and their workgroups redone later (REEF). Only for
//!   idempotent kernels; otherwise refused and nothing changes.

use crate::config::us;
use crate::device::{Gpu, MqdState, Pending, SavedWg, TransitionRecord};
use crate::error::ModelError;
use crate::unmap::{After, DestroyMode, Snapshot, Unmap};
use std::collections::BTreeMap;
use xpreempt_types::{Nanos, QueueId};

impl Gpu {
    /// `checkpoint_mqd`: remembers the queue's ring position for the restore.
    pub fn checkpoint_mqd(&mut self, queue: QueueId) -> Result<Snapshot, ModelError> {
        let q = self.q_mut(queue)?;
        let snap = Snapshot {
            read_id: q.ring.read_id(),
            write_id: q.ring.write_id(),
        };
        q.snapshot = Some(snap);
        Ok(snap)
    }

    /// `destroy_mqd`: starts taking the queue off its HQD. Asynchronous like KFD's
    /// (`-EINPROGRESS`): [`Gpu::settled`] turns true when the fence arrives.
    pub fn destroy_mqd(&mut self, queue: QueueId, mode: DestroyMode) -> Result<(), ModelError> {
        self.start_unmap(queue, mode, After::Preempted)
    }

    pub(crate) fn start_unmap(
        &mut self,
        queue: QueueId,
        mode: DestroyMode,
        after: After,
    ) -> Result<(), ModelError> {
        let state = self.q(queue)?.state;
        let qi = queue.0 as usize;
        let refuse = |op| ModelError::State {
            queue,
            state: state.name(),
            op,
        };
        match state {
            MqdState::Mapped => {}
            MqdState::Mapping => {
                // The map is in flight; take it off again as soon as it lands.
                self.check_reset_allowed(queue, mode)?;
                self.queues[qi].pending = Some(Pending::Preempt(mode));
                return Ok(());
            }
            MqdState::Waiting => {
                if after == After::Preempted {
                    self.waiting.retain(|&w| w as usize != qi);
                    self.hqd_wait_end(qi);
                    let q = &mut self.queues[qi];
                    q.state = MqdState::Preempted;
                    q.last_mode = Some(mode);
                    self.record(queue, "preempt", self.now);
                    self.touch(queue.0);
                }
                return Ok(());
            }
            MqdState::Unmapping if self.queues[qi].pending == Some(Pending::Resume) => {
                self.queues[qi].pending = None;
                return Ok(());
            }
            MqdState::Unmapping
                if after == After::Preempted
                    && self.queues[qi]
                        .unmap
                        .as_ref()
                        .is_some_and(|u| u.after.waits()) =>
            {
                // The HWS is already taking it off (a rotation or hand-off): it stays off once
                // the save lands instead of waiting for a slot. The HWS's own save is the
                // checkpoint a later resume restores from, whether or not the caller took one
                // (Lv2's unmap does not).
                let q = &mut self.queues[qi];
                if let Some(u) = q.unmap.as_mut() {
                    u.after = After::Preempted;
                }
                if q.snapshot.is_none() {
                    self.checkpoint_mqd(queue)?;
                }
                return Ok(());
            }
            _ => return Err(refuse("destroy_mqd")),
        }
        self.check_reset_allowed(queue, mode)?;
        let now = self.now;
        let live = self.compute.live_of(queue.0);
        let mut hold: BTreeMap<u32, u32> = BTreeMap::new();
        let mut redo = Vec::new();
        let mut saved = Vec::new();
        if mode != DestroyMode::Drain {
            for slot in live {
                let Some(wg) = self.compute.end(slot, false, now) else {
                    continue;
                };
                if let Some(t) = self.trace.as_mut() {
                    t.wg_end(self.compute.group_of(wg.cu), wg.queue, now);
                }
                *hold.entry(wg.cu).or_default() += wg.waves;
                if mode == DestroyMode::WavefrontSave {
                    saved.push(SavedWg {
                        dispatch: wg.dispatch,
                        wg: wg.wg,
                        waves: wg.waves,
                        remaining: wg.end.saturating_sub(now).max(1),
                    });
                } else {
                    redo.push((wg.dispatch, wg.wg));
                }
            }
        }
        let busiest = hold.values().copied().max().unwrap_or(0);
        let cost = match mode {
            DestroyMode::WavefrontSave => self.cfg.cwsr.save_ns(busiest),
            DestroyMode::Reset => us(self.cfg.cwsr.reset_us),
            DestroyMode::Drain => 0,
        };
        let q = &mut self.queues[qi];
        for &(dispatch, wg) in &redo {
            if let Some(d) = q.active.iter_mut().find(|d| d.id == dispatch) {
                d.running -= 1;
                d.redo.push(wg);
            }
        }
        for s in &saved {
            if let Some(d) = q.active.iter_mut().find(|d| d.id == s.dispatch) {
                d.running -= 1;
            }
        }
        let stopped = (redo.len() + saved.len()) as u32;
        q.running -= stopped;
        // Restored in reverse so that the lowest slot comes back first (pop from the end).
        saved.reverse();
        q.saved.extend(saved.iter().copied());
        if mode == DestroyMode::WavefrontSave && !saved.is_empty() {
            q.restore_ns = cost;
        }
        q.generation = q.generation.wrapping_add(1);
        q.state = MqdState::Unmapping;
        q.last_mode = Some(mode);
        q.unmap = Some(Unmap {
            mode,
            after,
            since: now,
            hold: hold.into_iter().collect(),
        });
        let generation = q.generation;
        let running = q.running;
        self.stats.wgs_saved += saved.len() as u64;
        self.stats.wgs_redone += redo.len() as u64;
        self.stats.unmaps += 1;
        q.hqd.unmaps += 1;
        if after.waits() {
            self.hqd_wait_begin(qi);
        }
        if mode != DestroyMode::Drain || running == 0 {
            self.events.push(
                now.saturating_add(cost),
                crate::device::Ev::UnmapDone {
                    queue: queue.0,
                    generation,
                },
            );
        }
        self.events.push(
            self.after(us(self.cfg.unmap_timeout_us)),
            crate::device::Ev::UnmapTimeout {
                queue: queue.0,
                generation,
            },
        );
        if let Some(t) = self.trace.as_mut() {
            let args = serde_json::json!({ "mode": mode, "waves_stopped": stopped });
            let name = match after {
                After::Preempted => "preempt",
                After::Waiting => "hws-rotate",
                After::Remapped => "runlist-remap",
            };
            t.marker(queue.0, name, now, args);
        }
        Ok(())
    }

    fn check_reset_allowed(&self, queue: QueueId, mode: DestroyMode) -> Result<(), ModelError> {
        if mode != DestroyMode::Reset {
            return Ok(());
        }
        let q = self.q(queue)?;
        for d in q.active.iter().filter(|d| d.running > 0) {
            if let Some(k) = d.kernel.and_then(|k| self.kernel_code(k))
                && !k.idempotent
            {
                return Err(ModelError::NonIdempotent {
                    queue,
                    kernel: k.name.clone(),
                });
            }
        }
        Ok(())
    }

    /// Called after a workgroup of the queue finished: a draining unmap may be complete.
    pub(crate) fn drain_progress(&mut self, qi: usize) {
        let q = &self.queues[qi];
        if q.state == MqdState::Unmapping
            && q.running == 0
            && !self.stats.hws_hung
            && let Some(u) = &q.unmap
            && u.mode == DestroyMode::Drain
        {
            let generation = q.generation;
            self.unmap_done(qi as u32, generation);
        }
    }

    pub(crate) fn unmap_done(&mut self, queue: u32, generation: u32) {
        let qi = queue as usize;
        let q = &mut self.queues[qi];
        if q.generation != generation || q.state != MqdState::Unmapping {
            return;
        }
        let Some(u) = q.unmap.take() else {
            return;
        };
        // From here until it is mapped again nothing may move the queue's read id.
        q.off_read_id = Some(q.ring.read_id());
        q.generation = q.generation.wrapping_add(1);
        let slot = q.slot.take();
        q.state = match u.after {
            After::Preempted => MqdState::Preempted,
            After::Waiting | After::Remapped => MqdState::Waiting,
        };
        for (cu, waves) in u.hold {
            self.compute.release(cu, waves, self.now);
        }
        if let Some(slot) = slot
            && let Err(e) = self.cpsch.deallocate(slot)
        {
            tracing::error!(error = %e, "HQD slot bookkeeping out of step");
        }
        let kind = match u.after {
            After::Preempted => "preempt",
            After::Waiting => "oversubscription-unmap",
            After::Remapped => "runlist-remap",
        };
        self.transitions.push(TransitionRecord {
            queue: QueueId(queue),
            kind,
            requested_at: u.since,
            done_at: self.now,
        });
        if u.after.waits() {
            self.waiting.push_back(queue);
            self.hqd_wait_begin(qi);
        } else {
            self.hqd_wait_end(qi);
        }
        self.sample_occupancy();
        self.touch(queue);
        if self.queues[qi].pending == Some(Pending::Resume) {
            self.queues[qi].pending = None;
            if let Err(e) = self.begin_resume(QueueId(queue)) {
                tracing::error!(error = %e, "deferred resume failed");
            }
        }
        self.schedule_runlist();
    }

    pub(crate) fn unmap_timeout(&mut self, queue: u32, generation: u32) {
        let q = &mut self.queues[queue as usize];
        if q.generation != generation || q.state != MqdState::Unmapping {
            return;
        }
        let timeout_us = (self.cfg.unmap_timeout_us.max(0.0)) as u64;
        tracing::error!(queue, timeout_us, "unsuccessful queue preemption: HWS hung");
        self.stats.hws_hung = true;
        q.error = Some(ModelError::HwsHung { timeout_us });
        self.touch(queue);
    }

    /// `restore_mqd` + `load_mqd`: puts a preempted queue back on an HQD. Saved waves continue
    /// where they stopped; the packet processor goes on from the unchanged read id. A resume
    /// that arrives while the unmap is still in flight is applied when it lands; one that
    /// arrives before a deferred preemption cancels it.
    pub(crate) fn begin_resume(&mut self, queue: QueueId) -> Result<(), ModelError> {
        let qi = queue.0 as usize;
        let state = self.q(queue)?.state;
        match state {
            MqdState::Preempted => {}
            MqdState::Unmapping => {
                self.queues[qi].pending = Some(Pending::Resume);
                return Ok(());
            }
            MqdState::Mapping if matches!(self.queues[qi].pending, Some(Pending::Preempt(_))) => {
                self.queues[qi].pending = None;
                return Ok(());
            }
            _ => {
                return Err(ModelError::State {
                    queue,
                    state: state.name(),
                    op: "resume",
                });
            }
        }
        self.restore_mqd(queue)?;
        self.load_mqd(queue)
    }

    /// `restore_mqd`: takes the checkpoint back. Needed when CWSR saved waves (their state is
    /// in the control stack the checkpoint describes); a drained or reset queue has none.
    pub fn restore_mqd(&mut self, queue: QueueId) -> Result<(), ModelError> {
        let q = self.q_mut(queue)?;
        if q.state != MqdState::Preempted {
            let state = q.state.name();
            return Err(ModelError::State {
                queue,
                state,
                op: "restore_mqd",
            });
        }
        let snap = q.snapshot.take();
        if q.last_mode == Some(DestroyMode::WavefrontSave) && !q.saved.is_empty() {
            let snap = snap.ok_or(ModelError::NoSnapshot { queue })?;
            if snap.read_id != q.ring.read_id() {
                self.stats.ring_moved_while_preempted += 1;
            }
        }
        Ok(())
    }

    /// `load_mqd`: queues the MQD for the next runlist, which gives it an HQD slot on every
    /// XCC as soon as one is free.
    pub fn load_mqd(&mut self, queue: QueueId) -> Result<(), ModelError> {
        let q = self.q_mut(queue)?;
        if q.state != MqdState::Preempted {
            let state = q.state.name();
            return Err(ModelError::State {
                queue,
                state,
                op: "load_mqd",
            });
        }
        q.state = MqdState::Waiting;
        q.map_kind = "resume";
        self.waiting.push_back(queue.0);
        self.hqd_wait_begin(queue.0 as usize);
        self.schedule_runlist();
        Ok(())
    }

    pub(crate) fn record(&mut self, queue: QueueId, kind: &'static str, since: Nanos) {
        self.transitions.push(TransitionRecord {
            queue,
            kind,
            requested_at: since,
            done_at: self.now,
        });
    }
}
