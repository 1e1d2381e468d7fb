//! Scheme B: xpreempt's own scheduler drives the model through the HAL. The queues are core
//! XQueues bound to the model's HAL, and every report and action goes through the core's
//! [`Driver`]: the same loop local mode and the daemon run on a GPU.

use std::cell::RefCell;
use std::rc::Rc;
use thiserror::Error;
use xpreempt_amd::{AmdHal, AmdKernel, Caller, Gpu};
use xpreempt_core::policy::{self, UnknownPolicy};
use xpreempt_core::sched::{Driver, Hooks, QueueInfo, SchedError, Scheduler};
use xpreempt_core::stats::{QueueStats, SchedulerStats};
use xpreempt_core::xqueue::{BoundQueue, DriveError};
use xpreempt_core::{
    Command, CommandProps, HwQueue, Level, Nanos, Priority, QueueConfig, QueueId, XQueue,
};
use xpreempt_types::ComputeUnits;

#[derive(Debug, Error)]
pub enum SchemeBError {
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Drive(#[from] DriveError<AmdKernel>),
}

/// The XQueues of one Scheme B run and the driver that schedules them. Task `i` is queue `i`.
pub struct SchemeB {
    driver: Driver<BoundQueue<AmdHal>>,
}

impl SchemeB {
    /// `queues[i]` = (model queue, owner, logical priority) of task `i`, `windows[i]` its
    /// progressive-launching window.
    pub fn new(
        gpu: &Rc<RefCell<Gpu>>,
        queues: &[(QueueId, Caller, Priority)],
        level: Level,
        windows: &[QueueConfig],
        policy: &str,
        hooks: Option<Box<dyn Hooks>>,
    ) -> Result<Self, SchemeBError> {
        let mut scheduler = Scheduler::new(policy::by_name(policy)?);
        scheduler.set_hooks(hooks);
        let mut driver = Driver::new(scheduler);
        for (i, &(q, caller, priority)) in queues.iter().enumerate() {
            let id = QueueId(i as u32);
            let mut info = QueueInfo::new(id, priority);
            info.process = caller.process;
            // A queue confined by its CU mask is not stopped for a higher one elsewhere.
            info.compute_units = gpu
                .borrow()
                .cu_mask_words(q)
                .ok()
                .flatten()
                .map(ComputeUnits::from_words);
            let window = windows.get(i).copied().unwrap_or_default();
            let hal = AmdHal::new(gpu.clone(), q, caller, level);
            // Held back only by queues on some CUs, it keeps the others (update_queue's mask).
            info.confinable = hal.can_confine();
            let queue = BoundQueue::new(XQueue::new(id, window, level), hal);
            driver.register(info, queue, &|| 0)?;
        }
        Ok(Self { driver })
    }

    pub fn submit(
        &mut self,
        task: usize,
        kernel: AmdKernel,
        idempotent: bool,
        now: Nanos,
    ) -> Result<(), SchemeBError> {
        let cmd = Command::kernel(kernel).with_props(CommandProps::new(idempotent, true, false));
        self.driver.submit(QueueId(task as u32), cmd, &|| now)?;
        Ok(())
    }

    /// The model touched this queue (completions, a transition finished).
    pub fn poll(&mut self, task: usize, now: Nanos) -> Result<(), SchemeBError> {
        self.driver.poll(QueueId(task as u32), &|| now)?;
        Ok(())
    }

    pub fn next_wake(&self) -> Option<Nanos> {
        self.driver.next_wake()
    }

    pub fn timer(&mut self, now: Nanos) -> Result<(), SchemeBError> {
        Ok(self.driver.timer(&|| now)?)
    }

    /// The priority the scheduler holds for task `task`'s queue (after the hooks).
    pub fn effective_priority(&self, task: usize) -> Option<Priority> {
        self.driver
            .scheduler()
            .queue_info(QueueId(task as u32))
            .map(|i| i.priority)
    }

    pub fn scheduler_stats(&self) -> &SchedulerStats {
        self.driver.scheduler().stats()
    }

    pub fn queue_stats(&self) -> impl Iterator<Item = &QueueStats> {
        self.driver.queues().map(|(_, q)| q.queue().stats())
    }
}
