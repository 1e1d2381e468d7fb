//! The scheduler of one device: takes queue events, asks the policy which queues run, and
//! answers with suspend/resume actions.
//!
//! It is a synchronous state machine with an explicit clock, so the same code runs inside a
//! discrete-event simulation, in one process ([`super::local`]), or in the daemon. It owns effective
//! priorities (aging), admission, the interleave limit and the statistics; the policy owns only
//! the choice.

use super::aging::Aging;
use super::hooks::Hooks;
use super::protocol::{Action, QueueInfo, RESUME_RETRY_NS, SchedEvent};
use crate::policy::{Policy, QueueView, View};
use crate::sched::protocol::QueueState;
use crate::stats::SchedulerStats;
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;
use xpreempt_types::{ComputeUnits, HintError, Nanos, Priority, QueueId};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SchedError {
    #[error("queue {0} is not known to the scheduler")]
    UnknownQueue(QueueId),
    #[error("queue {0} already exists")]
    DuplicateQueue(QueueId),
    #[error("queue {queue}: {source}")]
    Hint { queue: QueueId, source: HintError },
}

/// A queue's place in the policy's preemptive order ([`Scheduler::preemption_ranks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankedQueue {
    pub id: QueueId,
    pub rank: i64,
    /// Has work.
    pub active: bool,
    /// The last decision lets it run.
    pub allowed: bool,
}

#[derive(Clone, Debug)]
struct Entry {
    /// What the queue asked for at creation and through later events, before any hook.
    declared: QueueInfo,
    info: QueueInfo,
    active: bool,
    allowed: bool,
    refused: bool,
    pending: usize,
    active_since: Option<Nanos>,
    running_since: Option<Nanos>,
    /// Since when the queue has had work without running (aging counts from here).
    waiting_since: Option<Nanos>,
    run_ns: Nanos,
    /// The priority of work that waits on this queue's buffered commands, if any.
    inherited: Option<Priority>,
    /// The compute units the queue was last told to stay off (spatial yield).
    yielding: Option<ComputeUnits>,
}

pub struct Scheduler {
    policy: Box<dyn Policy>,
    hooks: Option<Box<dyn Hooks>>,
    aging: Option<Aging>,
    queues: BTreeMap<QueueId, Entry>,
    stats: SchedulerStats,
    next_wake: Option<Nanos>,
    views: Vec<QueueView>,
    actions: Vec<Action>,
}

impl Scheduler {
    pub fn new(policy: Box<dyn Policy>) -> Self {
        Self {
            policy,
            hooks: None,
            aging: None,
            queues: BTreeMap::new(),
            stats: SchedulerStats::default(),
            next_wake: None,
            views: Vec::new(),
            actions: Vec::new(),
        }
    }

    pub fn with_aging(mut self, aging: Aging) -> Self {
        self.aging = Some(aging);
        self
    }

    pub fn with_hooks(mut self, hooks: Box<dyn Hooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Swaps the policy; the next event is decided by the new one.
    pub fn set_policy(&mut self, policy: Box<dyn Policy>) {
        self.policy = policy;
    }

    pub fn set_hooks(&mut self, hooks: Option<Box<dyn Hooks>>) {
        self.hooks = hooks;
    }

    pub fn hooks_mut(&mut self) -> Option<&mut (dyn Hooks + 'static)> {
        self.hooks.as_deref_mut()
    }

    /// Whether queues should report their work (submissions, completions): only hooks use it,
    /// and without hooks the submit path stays free of it.
    pub fn wants_work(&self) -> bool {
        self.hooks.is_some()
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// When the scheduler wants a [`SchedEvent::Timer`].
    pub fn next_wake(&self) -> Option<Nanos> {
        self.next_wake
    }

    pub fn queue_info(&self, queue: QueueId) -> Option<&QueueInfo> {
        self.queues.get(&queue).map(|e| &e.info)
    }

    /// Whether the last decision lets the queue run.
    pub fn is_allowed(&self, queue: QueueId) -> bool {
        self.queues.get(&queue).is_some_and(|e| e.allowed)
    }

    /// Whether the queue has work, as its reports (or an announcement) said.
    pub fn is_active(&self, queue: QueueId) -> bool {
        self.queues.get(&queue).is_some_and(|e| e.active)
    }

    /// What the policy saw at the last decision.
    pub fn views(&self) -> &[QueueView] {
        &self.views
    }

    /// Each queue's rank in the policy's preemptive order as of the last decision, for fast
    /// paths that act before the scheduler hears of a change (see
    /// [`Policy::preemption_rank`]). `None` when every decision must go through the scheduler:
    /// the policy has no such order, hooks may reclassify or refuse a queue, an interleave
    /// limit may leave a queue out whatever its rank, or a queue may yield compute units
    /// instead of stopping.
    pub fn preemption_ranks(&self) -> Option<Vec<RankedQueue>> {
        if self.hooks.is_some()
            || self
                .queues
                .values()
                .any(|e| e.info.interleave.is_some() || e.info.confinable)
        {
            return None;
        }
        self.views
            .iter()
            .map(|v| {
                Some(RankedQueue {
                    id: v.id,
                    rank: self.policy.preemption_rank(v)?,
                    active: v.is_active(),
                    allowed: self.is_allowed(v.id),
                })
            })
            .collect()
    }

    /// Every queue as it stands now, after the last decision took effect (for operators).
    pub fn snapshot(&self, now: Nanos) -> Vec<QueueView> {
        self.queues
            .values()
            .map(|e| e.view(now, self.aging))
            .collect()
    }

    /// Applies one event and decides again. The actions are to be applied in order.
    pub fn handle(&mut self, now: Nanos, event: SchedEvent) -> Result<&[Action], SchedError> {
        self.actions.clear();
        match event {
            SchedEvent::Created(declared) => {
                if self.queues.contains_key(&declared.id) {
                    return Err(SchedError::DuplicateQueue(declared.id));
                }
                let mut info = declared.clone();
                if let Some(h) = self.hooks.as_mut() {
                    h.task_init(&mut info);
                }
                info.hints.validate().map_err(|source| SchedError::Hint {
                    queue: info.id,
                    source,
                })?;
                self.queues.insert(info.id, Entry::new(declared, info));
            }
            SchedEvent::Destroyed(id) => {
                let mut e = self
                    .queues
                    .remove(&id)
                    .ok_or(SchedError::UnknownQueue(id))?;
                e.stop_running(now);
                if let Some(h) = self.hooks.as_mut() {
                    h.task_destroy(id, e.run_ns);
                }
            }
            SchedEvent::Ready { queue, pending } => {
                let declared = &self
                    .queues
                    .get(&queue)
                    .ok_or(SchedError::UnknownQueue(queue))?
                    .declared;
                let fresh = match self.hooks.as_mut() {
                    Some(h) if !self.queues[&queue].active => h.reclassify(declared),
                    _ => None,
                };
                if let Some(info) = fresh {
                    match info.hints.validate() {
                        Ok(()) => self.entry(queue)?.info = info,
                        Err(e) => tracing::warn!(%queue, %e, "reclassification ignored"),
                    }
                }
                self.admission(queue, pending)?;
                let e = self.entry(queue)?;
                e.pending = pending;
                if !e.active {
                    e.active = true;
                    e.active_since = Some(now);
                    e.waiting_since = Some(now);
                }
            }
            SchedEvent::Admission(queue) => {
                let pending = self.entry(queue)?.pending;
                if self.queues[&queue].refused {
                    self.admission(queue, pending)?;
                }
            }
            SchedEvent::Idle(queue) => {
                let e = self.entry(queue)?;
                e.active = false;
                if std::mem::take(&mut e.refused) {
                    self.actions.push(Action::Admit(queue));
                }
                let e = self.entry(queue)?;
                e.pending = 0;
                e.active_since = None;
                e.waiting_since = None;
                e.stop_running(now);
            }
            SchedEvent::Hints { queue, hints } => {
                hints
                    .validate()
                    .map_err(|source| SchedError::Hint { queue, source })?;
                let e = self.entry(queue)?;
                e.declared.hints = hints;
                e.info.hints = hints;
            }
            SchedEvent::Inherit { queue, priority } => {
                self.entry(queue)?.inherited = priority;
            }
            SchedEvent::Priority { queue, priority } => {
                let e = self.entry(queue)?;
                e.declared.priority = priority;
                e.info.priority = priority;
            }
            SchedEvent::Work { queue, work } => {
                self.entry(queue)?;
                if let Some(h) = self.hooks.as_mut() {
                    h.work_submit(queue, work, now);
                }
                // Work decides nothing: the queue's activity changes only through Ready/Idle.
                return Ok(&self.actions);
            }
            SchedEvent::Timer => {}
        }
        self.check(now);
        Ok(&self.actions)
    }

    /// The compute units `queue` is to stay off now (spatial yield), `None` where it runs on
    /// all of its own.
    pub fn yielded_units(&self, queue: QueueId) -> Option<&ComputeUnits> {
        self.queues.get(&queue)?.yielding.as_ref()
    }

    /// Moving `queue` onto other compute units failed in hardware: it is never confined again,
    /// so the next decision stops it where it would have yielded.
    pub fn confine_failed(&mut self, queue: QueueId) -> Result<(), SchedError> {
        let e = self.entry(queue)?;
        // The declaration too: a hook's reclassification starts from it.
        e.declared.confinable = false;
        e.info.confinable = false;
        e.yielding = None;
        Ok(())
    }

    /// A resume the scheduler asked for failed in hardware (the queue stayed suspended): decide
    /// again after [`RESUME_RETRY_NS`], which asks for the resume anew.
    pub fn resume_failed(&mut self, queue: QueueId, now: Nanos) -> Result<(), SchedError> {
        let e = self.entry(queue)?;
        e.allowed = false;
        e.stop_running(now);
        let retry = now + RESUME_RETRY_NS;
        self.next_wake = Some(self.next_wake.map_or(retry, |w| w.min(retry)));
        Ok(())
    }

    /// Runs the admission hook for a queue asking to run, and says what changed.
    fn admission(&mut self, queue: QueueId, pending: usize) -> Result<(), SchedError> {
        let running = self.queues.values().filter(|e| e.is_running()).count();
        let admitted = match self.hooks.as_mut() {
            Some(h) => h.admit(queue, pending, running),
            None => true,
        };
        let e = self.entry(queue)?;
        let was_refused = std::mem::replace(&mut e.refused, !admitted);
        if !admitted {
            self.stats.refusals += 1;
            self.actions.push(Action::Refuse(queue));
        } else if was_refused {
            self.actions.push(Action::Admit(queue));
        }
        Ok(())
    }

    fn entry(&mut self, queue: QueueId) -> Result<&mut Entry, SchedError> {
        self.queues
            .get_mut(&queue)
            .ok_or(SchedError::UnknownQueue(queue))
    }

    fn check(&mut self, now: Nanos) {
        self.stats.checks += 1;
        let aging = self.aging;
        if let Some(a) = aging {
            for e in self.queues.values_mut() {
                if e.running_since.is_some()
                    && a.next_change(e.waiting_since, e.running_since, now)
                        .is_none()
                {
                    // Served for a whole interval: the boost is spent.
                    e.waiting_since = None;
                }
            }
        }
        self.views.clear();
        self.views
            .extend(self.queues.values().map(|e| e.view(now, aging)));
        let waiting_max = self
            .views
            .iter()
            .filter(|v| v.is_active() && v.running_since.is_none())
            .map(|v| v.effective_priority)
            .max();
        let running_min = self
            .views
            .iter()
            .filter(|v| v.running_since.is_some())
            .map(|v| v.effective_priority)
            .min();
        if let (Some(w), Some(r)) = (waiting_max, running_min)
            && w > r
        {
            self.stats.inversions += 1;
        }
        let view = View {
            now,
            queues: &self.views,
        };
        let decision = self.policy.decide(&view);
        // Only queues whose hardware can move them yield; where an interleave limit counts the
        // queues that run, they stop instead.
        let mut yields = BTreeMap::new();
        if self.queues.values().any(|e| e.info.confinable)
            && self.queues.values().all(|e| e.info.interleave.is_none())
        {
            yields = self.policy.spatial_yield(&view, &decision);
            yields.retain(|id, _| self.queues.get(id).is_some_and(|e| e.info.confinable));
        }
        let run = self.limit_interleave(decision.run);
        for (id, e) in self.queues.iter_mut() {
            let yielding = yields.remove(id);
            let allow = (run.contains(id) || yielding.is_some()) && !e.refused;
            // A stopped queue keeps its units until it runs again; then it runs on what this
            // decision leaves it, set before it resumes.
            if allow && yielding != e.yielding {
                e.yielding = yielding;
                self.actions.push(Action::Confine(*id));
            }
            if allow != e.allowed {
                e.allowed = allow;
                self.actions.push(if allow {
                    self.stats.resumes += 1;
                    Action::Resume(*id)
                } else {
                    self.stats.preemptions += 1;
                    Action::Suspend(*id)
                });
            }
            if e.active && e.allowed {
                e.running_since.get_or_insert(now);
            } else {
                e.stop_running(now);
                if e.active {
                    e.waiting_since.get_or_insert(now);
                }
            }
        }
        let mut wake = decision.wake_at.filter(|&t| t > now);
        if let Some(a) = aging {
            for e in self.queues.values() {
                let next = a.next_change(e.waiting_since, e.running_since, now);
                wake = match (wake, next) {
                    (Some(x), Some(y)) => Some(x.min(y)),
                    (x, y) => x.or(y),
                };
            }
        }
        self.next_wake = wake;
    }

    /// Keeps, in order of effective priority, the queues whose interleave limits (and those of
    /// the queues already kept) allow one more queue alongside.
    fn limit_interleave(&self, run: BTreeSet<QueueId>) -> BTreeSet<QueueId> {
        if self.queues.values().all(|e| e.info.interleave.is_none()) {
            return run;
        }
        let mut order: Vec<&QueueView> =
            self.views.iter().filter(|v| run.contains(&v.id)).collect();
        order.sort_by_key(|v| {
            (
                !v.is_active(),
                std::cmp::Reverse(v.effective_priority),
                v.id,
            )
        });
        let mut kept: Vec<(QueueId, Option<u32>)> = Vec::new();
        for v in order {
            let limit = self.queues[&v.id].info.interleave;
            let others = kept.len();
            let fits = |l: Option<u32>| l.is_none_or(|l| others <= l as usize);
            if fits(limit) && kept.iter().all(|&(_, l)| fits(l)) {
                kept.push((v.id, limit));
            }
        }
        kept.into_iter().map(|(id, _)| id).collect()
    }
}

impl Entry {
    fn new(declared: QueueInfo, info: QueueInfo) -> Self {
        Self {
            declared,
            info,
            active: false,
            allowed: true,
            refused: false,
            pending: 0,
            active_since: None,
            running_since: None,
            waiting_since: None,
            run_ns: 0,
            inherited: None,
            yielding: None,
        }
    }

    fn is_running(&self) -> bool {
        self.active && self.allowed
    }

    fn stop_running(&mut self, now: Nanos) {
        if let Some(since) = self.running_since.take() {
            self.run_ns += now.saturating_sub(since);
        }
    }

    fn view(&self, now: Nanos, aging: Option<Aging>) -> QueueView {
        // A refused queue does not compete: its work waits for admission, not for the device.
        let state = match (
            self.active && !self.refused,
            self.allowed,
            self.running_since,
        ) {
            (false, _, _) => QueueState::Idle,
            (true, false, _) => QueueState::Suspended,
            (true, true, Some(_)) => QueueState::Running,
            (true, true, None) => QueueState::Ready,
        };
        let boost = aging.map_or(0, |a| a.boost(self.waiting_since, now));
        QueueView {
            id: self.info.id,
            process: self.info.process,
            logical_priority: self.info.priority,
            effective_priority: self
                .info
                .priority
                .saturating_add(boost)
                .max(self.inherited.unwrap_or(Priority::MIN)),
            state,
            pending: self.pending,
            hints: self.info.hints,
            active_since: self.active_since,
            running_since: self.running_since,
            run_ns: self.run_ns + self.running_since.map_or(0, |s| now.saturating_sub(s)),
            compute_units: self.info.compute_units.clone(),
        }
    }
}
