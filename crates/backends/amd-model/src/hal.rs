//! The model seen through xpreempt's HAL: one [`AmdHal`] per model queue. Lv1 launches AQL
//! packets into the ring; Lv2 unmaps the queue with DRAIN and maps it back through the runlist;
//! Lv3 calls the preempt-queue / resume-queue ioctls (CWSR).

use crate::aql::{BarrierAnd, Header, KernelDispatch, Packet};
use crate::compute::CuMask;
use crate::device::Gpu;
use crate::error::ModelError;
use crate::kfd::Caller;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, ComputeUnits, HostFn, Launched, Level, Op, QueueId, Seq};

/// A kernel launch on the model: a loaded code object and its grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdKernel {
    pub object: u64,
    pub workgroups: u32,
    pub wg_threads: u16,
}

/// One model queue seen through the HAL. The simulation is single-threaded, so the device is
/// shared by `Rc<RefCell<_>>`; no HAL call re-enters another.
pub struct AmdHal {
    gpu: Rc<RefCell<Gpu>>,
    queue: QueueId,
    caller: Caller,
    level: Level,
    callbacks: RefCell<BTreeMap<Seq, HostFn>>,
    /// The CU mask the queue was created with (`None`: every CU): what `confine(None)` restores.
    created_mask: Option<CuMask>,
}

/// `confine` would leave the queue no CU of its own.
#[derive(Debug, thiserror::Error)]
#[error("queue {queue}: every CU of its mask is one a higher queue is confined to")]
pub struct NoUnitLeft {
    queue: QueueId,
}

/// Refusals (not allowed in the queue's state or to the caller) come back as such; the rest
/// are the model's failures.
fn hal_err(op: &'static str) -> impl Fn(ModelError) -> HalError {
    move |e| match e {
        ModelError::NonIdempotent { .. } | ModelError::PermissionDenied { .. } => {
            HalError::refused(op, e)
        }
        e => HalError::backend(op, e),
    }
}

impl AmdHal {
    pub fn new(gpu: Rc<RefCell<Gpu>>, queue: QueueId, caller: Caller, level: Level) -> Self {
        let created_mask = {
            let g = gpu.borrow();
            let cus = g.config().cus;
            g.cu_mask_words(queue)
                .ok()
                .flatten()
                .map(|w| CuMask::from_words(w, cus))
        };
        Self {
            gpu,
            queue,
            caller,
            level,
            callbacks: RefCell::new(BTreeMap::new()),
            created_mask,
        }
    }
}

impl HwQueue for AmdHal {
    type Payload = AmdKernel;

    fn max_level(&self) -> Level {
        self.level
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<AmdKernel>,
        _sync_point: bool,
    ) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        let (_, write) = gpu.ring_ids(self.queue).map_err(hal_err("launch"))?;
        if write != seq {
            // One command is one packet, so dispatch ids and sequence numbers coincide.
            return Err(HalError::backend(
                "launch",
                ModelError::OutOfOrder {
                    queue: self.queue,
                    seq,
                    dispatch: write,
                },
            ));
        }
        // Completion signals are always observable on this hardware, so every launch is a
        // sync point and record_sync has nothing to do.
        let signal = gpu.create_signal(1);
        let packet = match &mut command.op {
            Op::Kernel(k) => Packet::Dispatch(KernelDispatch::linear(
                k.object,
                k.workgroups,
                k.wg_threads,
                signal,
            )),
            op => {
                if let Op::HostCallback(_) = op
                    && let Op::HostCallback(f) = std::mem::replace(op, Op::Barrier)
                {
                    self.callbacks.borrow_mut().insert(seq, f);
                }
                // The model has no DMA engine or host queue: everything else is a barrier-AND
                // packet, which keeps queue order and completes at once.
                Packet::Barrier(BarrierAnd {
                    header: Header::barrier_and(),
                    dep_signals: [0; 5],
                    completion_signal: signal,
                })
            }
        };
        gpu.submit_packet(self.queue, &packet)
            .map_err(hal_err("launch"))?;
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }

    fn completed(&self) -> Seq {
        let done = self
            .gpu
            .borrow()
            .ring_ids(self.queue)
            .map_or(0, |(read, _)| read);
        let mut cbs = self.callbacks.borrow_mut();
        while let Some(entry) = cbs.first_entry() {
            if *entry.key() >= done {
                break;
            }
            (entry.remove())();
        }
        done
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        if self.completed() >= upto {
            Ok(())
        } else {
            Err(HalError::WouldBlock("synchronize"))
        }
    }

    fn settled(&self) -> bool {
        self.gpu.borrow().settled(self.queue)
    }

    fn deactivate(&self) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        gpu.unmap_queue(self.caller, self.queue)
            .map_err(hal_err("deactivate"))
    }

    fn reactivate(&self, _log: &mut [Launched<AmdKernel>]) -> Result<(), HalError> {
        // The unfinished work is still in the ring: mapping the queue again is all it takes.
        let mut gpu = self.gpu.borrow_mut();
        gpu.map_queue(self.caller, self.queue)
            .map_err(hal_err("reactivate"))
    }

    fn interrupt(&self) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        gpu.preempt_queue(self.caller, self.queue, crate::DestroyMode::WavefrontSave)
            .map_err(hal_err("interrupt"))
    }

    fn restore(&self, _log: &mut [Launched<AmdKernel>]) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        gpu.resume_queue(self.caller, self.queue)
            .map_err(hal_err("restore"))
    }

    fn can_confine(&self) -> bool {
        true
    }

    /// A new CU mask through `update_queue`: the created mask less `avoid`, or the created mask
    /// again. The model executes the runlist again, as KFD does, so this costs every mapped
    /// queue a save and a restore.
    fn confine(&self, avoid: Option<&ComputeUnits>) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        let cus = gpu.config().cus;
        let mask = match avoid {
            None => self.created_mask.clone(),
            Some(avoid) => {
                let own = self
                    .created_mask
                    .clone()
                    .unwrap_or_else(|| CuMask::all(cus));
                let rest = ComputeUnits::from_words(own.words().to_vec()).without(avoid);
                if rest.is_empty() {
                    return Err(HalError::refused(
                        "confine",
                        NoUnitLeft { queue: self.queue },
                    ));
                }
                Some(CuMask::from_words(rest.words().to_vec(), cus))
            }
        };
        gpu.update_queue(self.caller, self.queue, None, Some(mask))
            .map_err(hal_err("confine"))
    }
}
