//! Scheme B: xpreempt's own scheduler drives the model through the HAL, event by event.
//! Lv1 launches progressively into the ring; Lv2 unmaps the queue with DRAIN and maps it back
//! through the runlist; Lv3 calls the preempt-queue / resume-queue ioctls (CWSR).

use crate::aql::{BarrierAnd, Header, KernelDispatch, Packet};
use crate::device::Gpu;
use crate::error::ModelError;
use crate::kfd::Caller;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use xpreempt_core::command::HostFn;
use xpreempt_core::scheduler::{Action, Hooks, QueueInfo, SchedEvent, Scheduler};
use xpreempt_core::xqueue::QueueEvent;
use xpreempt_core::{
    Command, CommandProps, HalError, HwQueue, Level, Nanos, Op, OpKind, QueueConfig, QueueId, Seq,
    XQueue,
};

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
}

fn hal_err(e: ModelError) -> HalError {
    match e {
        e @ (ModelError::NonIdempotent { .. } | ModelError::PermissionDenied { .. }) => {
            HalError::Refused(e.to_string())
        }
        e => HalError::Backend(e.to_string()),
    }
}

impl AmdHal {
    pub fn new(gpu: Rc<RefCell<Gpu>>, queue: QueueId, caller: Caller, level: Level) -> Self {
        Self {
            gpu,
            queue,
            caller,
            level,
            callbacks: RefCell::new(BTreeMap::new()),
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
        let (_, write) = gpu.ring_ids(self.queue).map_err(hal_err)?;
        if write != seq {
            // One command is one packet, so dispatch ids and sequence numbers coincide.
            return Err(HalError::Backend(format!(
                "queue {}: command {seq} would land at dispatch id {write}",
                self.queue
            )));
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
        gpu.submit_packet(self.queue, &packet).map_err(hal_err)?;
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
        gpu.unmap_queue(self.caller, self.queue).map_err(hal_err)
    }

    fn reactivate(
        &self,
        _log: &mut [xpreempt_core::command::Launched<AmdKernel>],
    ) -> Result<(), HalError> {
        // The unfinished work is still in the ring: mapping the queue again is all it takes.
        let mut gpu = self.gpu.borrow_mut();
        gpu.map_queue(self.caller, self.queue).map_err(hal_err)
    }

    fn interrupt(&self) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        gpu.preempt_queue(self.caller, self.queue, crate::DestroyMode::WavefrontSave)
            .map_err(hal_err)
    }

    fn restore(
        &self,
        _log: &mut [xpreempt_core::command::Launched<AmdKernel>],
    ) -> Result<(), HalError> {
        let mut gpu = self.gpu.borrow_mut();
        gpu.resume_queue(self.caller, self.queue).map_err(hal_err)
    }
}

/// The XQueues, their HALs and the scheduler of one Scheme B run.
pub struct SchemeB {
    pub queues: Vec<XQueue<AmdKernel>>,
    pub hals: Vec<AmdHal>,
    pub scheduler: Scheduler,
    actions: Vec<Action>,
}

impl SchemeB {
    /// `queues[i]` = (model queue, owner, logical priority) of task `i`, `windows[i]` its
    /// progressive-launching window.
    pub fn new(
        gpu: &Rc<RefCell<Gpu>>,
        queues: &[(QueueId, Caller, xpreempt_core::Priority)],
        level: Level,
        windows: &[QueueConfig],
        policy: &str,
        hooks: Option<Box<dyn Hooks>>,
    ) -> Result<Self, String> {
        let policy = xpreempt_core::policy::by_name(policy).map_err(|e| e.to_string())?;
        let mut scheduler = Scheduler::new(policy);
        scheduler.set_hooks(hooks);
        let mut xqs = Vec::new();
        let mut hals = Vec::new();
        for (i, &(q, caller, prio)) in queues.iter().enumerate() {
            let id = QueueId(i as u32);
            let mut info = QueueInfo::new(id, prio);
            info.process = caller.process;
            scheduler
                .handle(0, SchedEvent::Created(info))
                .map_err(|e| e.to_string())?;
            let window = windows.get(i).copied().unwrap_or_default();
            xqs.push(XQueue::new(id, window, level));
            hals.push(AmdHal::new(gpu.clone(), q, caller, level));
        }
        Ok(Self {
            queues: xqs,
            hals,
            scheduler,
            actions: Vec::new(),
        })
    }

    pub fn submit(
        &mut self,
        task: usize,
        kernel: AmdKernel,
        idempotent: bool,
        now: Nanos,
    ) -> Result<(), String> {
        let cmd = Command::kernel(kernel).with_props(CommandProps::new(idempotent, true, false));
        let s = self.queues[task]
            .submit(&self.hals[task], cmd, now)
            .map_err(|e| e.to_string())?;
        let queue = QueueId(task as u32);
        if let Some(h) = self.scheduler.hooks_mut() {
            h.work_submit(queue, OpKind::Kernel, s.seq, now);
        }
        if s.event == Some(QueueEvent::Ready) {
            let pending = self.queues[task].pending_len() + self.queues[task].in_flight_len();
            self.event(now, SchedEvent::Ready { queue, pending })?;
        }
        Ok(())
    }

    /// The model touched this queue (completions, a transition finished).
    pub fn poll(&mut self, task: usize, now: Nanos) -> Result<(), String> {
        let ev = self.queues[task]
            .poll(&self.hals[task], now)
            .map_err(|e| e.to_string())?;
        if ev == Some(QueueEvent::Idle) {
            self.event(now, SchedEvent::Idle(QueueId(task as u32)))?;
        }
        Ok(())
    }

    pub fn next_wake(&self) -> Option<Nanos> {
        self.scheduler.next_wake()
    }

    pub fn timer(&mut self, now: Nanos) -> Result<(), String> {
        if self.scheduler.next_wake().is_some_and(|w| w <= now) {
            self.event(now, SchedEvent::Timer)?;
        }
        Ok(())
    }

    fn event(&mut self, now: Nanos, ev: SchedEvent) -> Result<(), String> {
        self.actions.clear();
        let actions = self.scheduler.handle(now, ev).map_err(|e| e.to_string())?;
        self.actions.extend_from_slice(actions);
        for i in 0..self.actions.len() {
            let a = self.actions[i];
            let outcome = match a {
                Action::Suspend(q) => {
                    let i = q.0 as usize;
                    self.queues[i].suspend(&self.hals[i], now).map(|_| ())
                }
                Action::Resume(q) => {
                    let i = q.0 as usize;
                    self.queues[i].resume(&self.hals[i], now).map(|_| ())
                }
                Action::Refuse(q) => {
                    tracing::debug!(queue = %q, "admission refused");
                    Ok(())
                }
                Action::Admit(q) => {
                    tracing::debug!(queue = %q, "admitted again");
                    Ok(())
                }
            };
            if let Err(e) = outcome {
                tracing::warn!(error = %e, "scheduler action failed");
            }
        }
        Ok(())
    }
}
