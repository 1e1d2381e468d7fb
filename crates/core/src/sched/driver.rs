//! The one loop that turns scheduler answers into suspend/resume on queues.
//!
//! Local mode, the AMD model's Scheme B, the demo and the daemon all drive their queues through
//! [`Driver`], so a simulation exercises exactly the loop a GPU runs: it drops stale reports,
//! applies actions in order, feeds what a suspend or resume changed back to the scheduler,
//! retries failed resumes, tells refused submitters to back off, and passes work to the hooks.

use super::protocol::{Action, QueueInfo, QueueReport, SchedEvent};
use super::scheduler::{SchedError, Scheduler};
use crate::xqueue::QueueOpError;
use std::collections::{BTreeMap, BTreeSet};
use xpreempt_hal::{HalError, NoSpatialControl};
use xpreempt_types::{ComputeUnits, Nanos, QueueId};

/// What the driver may do to a queue, whatever its backend. Suspend and resume may change the
/// queue's activity (they take in completions); the report comes back to the driver instead of
/// travelling separately.
pub trait QueueControl {
    fn suspend(&mut self, now: Nanos) -> Result<Option<QueueReport>, QueueOpError>;
    fn resume(&mut self, now: Nanos) -> Result<Option<QueueReport>, QueueOpError>;
    /// While refused, submissions answer busy and ask for admission again.
    fn set_refused(&mut self, refused: bool);

    /// Keeps the queue running off `avoid` (spatial yield), or on all its units again (`None`);
    /// see [`xpreempt_hal::HwQueue::confine`]. Only asked of queues registered as
    /// [`QueueInfo::confinable`].
    fn confine(&mut self, avoid: Option<&ComputeUnits>) -> Result<(), HalError> {
        let _ = avoid;
        Err(HalError::refused("confine", NoSpatialControl))
    }
}

/// A scheduler and the queues it controls.
pub struct Driver<Q> {
    scheduler: Scheduler,
    queues: BTreeMap<QueueId, Q>,
    /// The newest Ready/Idle generation applied per queue.
    generations: BTreeMap<QueueId, u64>,
    /// Queues made ready by [`Driver::announce`] whose own Ready/Idle has not come yet.
    announced: BTreeSet<QueueId>,
    /// Events that applying actions produced, still to decide on.
    work: Vec<SchedEvent>,
    actions: Vec<Action>,
    /// Queues whose confinement failed in the answer being applied: not resumed by it.
    unconfined: BTreeSet<QueueId>,
}

impl<Q: QueueControl> Driver<Q> {
    pub fn new(scheduler: Scheduler) -> Self {
        Self {
            scheduler,
            queues: BTreeMap::new(),
            generations: BTreeMap::new(),
            announced: BTreeSet::new(),
            work: Vec::new(),
            actions: Vec::new(),
            unconfined: BTreeSet::new(),
        }
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    pub fn queue(&self, id: QueueId) -> Option<&Q> {
        self.queues.get(&id)
    }

    pub fn queue_mut(&mut self, id: QueueId) -> Option<&mut Q> {
        self.queues.get_mut(&id)
    }

    pub fn queues(&self) -> impl Iterator<Item = (QueueId, &Q)> {
        self.queues.iter().map(|(id, q)| (*id, q))
    }

    pub fn next_wake(&self) -> Option<Nanos> {
        self.scheduler.next_wake()
    }

    /// Adds a queue; the scheduler decides at once whether it may run.
    pub fn register(
        &mut self,
        info: QueueInfo,
        queue: Q,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), SchedError> {
        let id = info.id;
        if self.queues.contains_key(&id) {
            return Err(SchedError::DuplicateQueue(id));
        }
        self.queues.insert(id, queue);
        let created = self.dispatch(SchedEvent::Created(info), clock);
        if created.is_err() {
            self.queues.remove(&id);
        }
        created
    }

    /// Removes a queue; what it held back for others is decided anew.
    pub fn unregister(&mut self, id: QueueId, clock: &dyn Fn() -> Nanos) -> Option<Q> {
        if let Err(e) = self.dispatch(SchedEvent::Destroyed(id), clock) {
            tracing::debug!(%e, "unregister");
        }
        self.generations.remove(&id);
        self.announced.remove(&id);
        self.queues.remove(&id)
    }

    /// A submission is about to reach `queue`: if the scheduler sees it idle, it is made ready
    /// now, ahead of its own Ready, so that the queues it preempts stop while it launches.
    pub fn announce(
        &mut self,
        queue: QueueId,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), SchedError> {
        if self.scheduler.is_active(queue) || !self.queues.contains_key(&queue) {
            return Ok(());
        }
        self.announced.insert(queue);
        self.dispatch(SchedEvent::Ready { queue, pending: 1 }, clock)
    }

    /// The announced submission failed and `queue` has no work: unless its own report came
    /// meanwhile, it is idle again.
    pub fn withdraw(
        &mut self,
        queue: QueueId,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), SchedError> {
        if !self.announced.remove(&queue) {
            return Ok(());
        }
        self.dispatch(SchedEvent::Idle(queue), clock)
    }

    /// A queue's report. A Ready/Idle report older than one already applied is dropped.
    pub fn report(
        &mut self,
        queue: QueueId,
        report: QueueReport,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), SchedError> {
        match self.accept(queue, report) {
            Some(event) => self.dispatch(event, clock),
            None => Ok(()),
        }
    }

    /// The timer fired: decide again if the scheduler asked for it by now.
    pub fn timer(&mut self, clock: &dyn Fn() -> Nanos) -> Result<(), SchedError> {
        match self.scheduler.next_wake() {
            Some(at) if at <= clock() => self.dispatch(SchedEvent::Timer, clock),
            _ => Ok(()),
        }
    }

    /// Decides on `event` and applies the answer, then whatever applying it reported, until
    /// nothing is left. The event's own error is returned; later ones are logged.
    pub fn dispatch(
        &mut self,
        event: SchedEvent,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), SchedError> {
        let first = self.step(event, clock);
        while let Some(event) = self.work.pop() {
            if let Err(e) = self.step(event, clock) {
                tracing::warn!(%e, "scheduler event ignored");
            }
        }
        first
    }

    fn step(&mut self, event: SchedEvent, clock: &dyn Fn() -> Nanos) -> Result<(), SchedError> {
        self.unconfined.clear();
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        let decided = self
            .scheduler
            .handle(clock(), event)
            .map(|a| actions.extend_from_slice(a));
        if decided.is_ok() {
            for &action in &actions {
                self.apply(action, clock);
            }
        }
        self.actions = actions;
        decided
    }

    fn apply(&mut self, action: Action, clock: &dyn Fn() -> Nanos) {
        let (id, result) = match action {
            Action::Suspend(id) => (id, self.queues.get_mut(&id).map(|q| q.suspend(clock()))),
            Action::Resume(id) if self.unconfined.contains(&id) => {
                // Told as a failed resume is, so that the scheduler counts the queue stopped.
                let _ = self.scheduler.resume_failed(id, clock());
                return;
            }
            Action::Resume(id) => (id, self.queues.get_mut(&id).map(|q| q.resume(clock()))),
            Action::Refuse(id) | Action::Admit(id) => {
                if let Some(q) = self.queues.get_mut(&id) {
                    q.set_refused(matches!(action, Action::Refuse(_)));
                }
                return;
            }
            Action::Confine(id) => {
                let avoid = self.scheduler.yielded_units(id).cloned();
                let Some(q) = self.queues.get_mut(&id) else {
                    return;
                };
                if let Err(e) = q.confine(avoid.as_ref()) {
                    tracing::warn!(queue = %id, error = %e.chain(), "confine failed: the queue is stopped instead");
                    // The rest of this answer does not resume it; then the scheduler decides again.
                    if self.scheduler.confine_failed(id).is_ok() {
                        self.unconfined.insert(id);
                        self.work.push(SchedEvent::Timer);
                    }
                }
                return;
            }
        };
        match result {
            Some(Ok(Some(report))) => {
                if let Some(event) = self.accept(id, report) {
                    self.work.push(event);
                }
            }
            Some(Ok(None)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "scheduler action failed");
                if matches!(action, Action::Resume(_)) {
                    let _ = self.scheduler.resume_failed(id, clock());
                }
            }
            None => tracing::debug!(queue = %id, "action for an unregistered queue"),
        }
    }

    /// The event a report stands for, or `None` for a stale Ready/Idle report.
    fn accept(&mut self, queue: QueueId, report: QueueReport) -> Option<SchedEvent> {
        if let Some(generation) = report.generation() {
            let last = self.generations.entry(queue).or_insert(0);
            if generation <= *last {
                return None;
            }
            *last = generation;
            self.announced.remove(&queue);
        }
        Some(report.event(queue))
    }
}
