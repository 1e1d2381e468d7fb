//! Policies: given every queue's state, decide which queues run.
//!
//! A policy is a small, pure decision. The scheduler computes effective priorities, calls the
//! policy on every event, and turns the answer into suspend/resume operations; a policy never
//! sees a backend.
//!
//! The priority rule: a queue is stopped only on behalf of an active queue of strictly higher
//! effective priority, and queues at the same priority run together. The policies that take
//! turns say so: `fifo` runs one queue at a time by arrival, `rr` and `bandwidth` give turns
//! and shares, `edf` runs the earliest deadline alone; in `hpf` only queues whose timeslice
//! hint asks for it take turns with their equals.

mod bandwidth;
mod edf;
mod fifo;
mod hpf;
mod lcbe;
mod rr;

pub use bandwidth::Bandwidth;
pub use edf::Edf;
pub use fifo::Fifo;
pub use hpf::Hpf;
pub use lcbe::LcBe;
pub use rr::RoundRobin;

use crate::sched::protocol::QueueState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;
use xpreempt_types::Hints;
use xpreempt_types::{ComputeUnits, Nanos, Priority, ProcessId, QueueId, may_share};

/// Default timeslice of the round-robin policies.
pub const DEFAULT_TIMESLICE_NS: Nanos = 5_000_000;

/// What a policy sees of one queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    pub id: QueueId,
    pub process: ProcessId,
    pub logical_priority: Priority,
    /// Logical priority plus aging.
    pub effective_priority: Priority,
    pub state: QueueState,
    pub pending: usize,
    pub hints: Hints,
    /// When the queue last went from idle to having work.
    pub active_since: Option<Nanos>,
    /// When the queue last started running (allowed with work), if it runs now.
    pub running_since: Option<Nanos>,
    /// Total time the queue has spent running.
    pub run_ns: Nanos,
    /// The compute units the hardware confines it to (`None`: all of them).
    pub compute_units: Option<ComputeUnits>,
}

impl QueueView {
    /// Has work (pending, in flight or stopped part-way).
    pub fn is_active(&self) -> bool {
        self.state != QueueState::Idle
    }

    /// Whether `other` with work holds this queue back: it ranks strictly higher (effective
    /// priority) and may run on the same compute units.
    pub fn held_back_by(&self, other: &QueueView) -> bool {
        other.is_active()
            && other.effective_priority > self.effective_priority
            && may_share(self.compute_units.as_ref(), other.compute_units.as_ref())
    }
}

pub struct View<'a> {
    pub now: Nanos,
    /// Sorted by queue id.
    pub queues: &'a [QueueView],
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Queues allowed to run. An idle queue in the set launches its next submission at once;
    /// one outside it buffers until the scheduler resumes it.
    pub run: BTreeSet<QueueId>,
    /// Ask again at this time even if nothing happens (a timeslice ends).
    pub wake_at: Option<Nanos>,
}

pub trait Policy: Send {
    fn name(&self) -> &'static str;
    fn decide(&mut self, view: &View<'_>) -> Decision;

    /// A rank for `queue` if this policy is a strict preemptive order over ranks, such that,
    /// whatever else the view holds:
    /// - a queue that has work stops (does not let run) every queue of strictly lower rank, and
    /// - a queue that no queue with work outranks runs (equal ranks run together).
    ///
    /// Fast paths outside the scheduler (global mode's agents) use it to suspend a queue the
    /// moment a higher one gets work, and to let it go again when that one is idle, before the
    /// scheduler hears of either; the scheduler confirms afterwards. `None` (the default): the
    /// policy's decisions all go through the scheduler.
    fn preemption_rank(&self, queue: &QueueView) -> Option<i64> {
        let _ = queue;
        None
    }

    /// Spatial yield: queues that `decision` leaves out but that may run instead off the
    /// compute units given for each, where their hardware can move them
    /// ([`crate::sched::QueueInfo::confinable`]); the scheduler stops the others. By default
    /// every queue left out is stopped.
    fn spatial_yield(
        &self,
        view: &View<'_>,
        decision: &Decision,
    ) -> BTreeMap<QueueId, ComputeUnits> {
        let _ = (view, decision);
        BTreeMap::new()
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unknown policy `{0}`; known policies: {known}", known = POLICY_NAMES.join(", "))]
pub struct UnknownPolicy(pub String);

pub const POLICY_NAMES: [&str; 6] = ["hpf", "fifo", "rr", "bandwidth", "edf", "lcbe"];

/// Builds a policy by its command-line name, with default settings.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "hpf" => Box::new(Hpf),
        "fifo" => Box::new(Fifo),
        "rr" => Box::new(RoundRobin::default()),
        "bandwidth" | "bw" => Box::new(Bandwidth::default()),
        "edf" => Box::new(Edf),
        "lcbe" | "lc/be" | "lc-be" => Box::new(LcBe::default()),
        _ => return Err(UnknownPolicy(name.to_string())),
    })
}

/// For policies that run one queue at a time: that queue, plus every idle queue when nothing
/// else is active (so that a lone submitter launches at once).
fn exclusive(view: &View<'_>, chosen: Option<QueueId>) -> BTreeSet<QueueId> {
    match chosen {
        Some(id) => BTreeSet::from([id]),
        None => view.queues.iter().map(|q| q.id).collect(),
    }
}

/// Round-robin among `candidates` (sorted by id): keeps the running one until its timeslice
/// ends, then passes to the next id after it. Returns the choice and when its slice ends.
fn rotate(
    view: &View<'_>,
    candidates: &[&QueueView],
    default_slice: Nanos,
) -> Option<(QueueId, Nanos)> {
    let slice_of = |q: &QueueView| q.hints.timeslice_ns.unwrap_or(default_slice);
    let current = candidates.iter().find(|q| q.running_since.is_some());
    if let Some(cur) = current {
        let end = cur.running_since.unwrap_or(view.now) + slice_of(cur);
        if end > view.now || candidates.len() == 1 {
            return Some((cur.id, end));
        }
        let next = candidates
            .iter()
            .find(|q| q.id > cur.id)
            .or(candidates.first())?;
        return Some((next.id, view.now + slice_of(next)));
    }
    let first = candidates.first()?;
    Some((first.id, view.now + slice_of(first)))
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;

    pub fn queue(id: u32, prio: Priority, state: QueueState) -> QueueView {
        QueueView {
            id: QueueId(id),
            process: 1,
            logical_priority: prio,
            effective_priority: prio,
            state,
            pending: if state == QueueState::Idle { 0 } else { 1 },
            hints: Hints::default(),
            active_since: (state != QueueState::Idle).then_some(0),
            running_since: (state == QueueState::Running).then_some(0),
            run_ns: 0,
            compute_units: None,
        }
    }

    pub fn ids(set: &BTreeSet<QueueId>) -> Vec<u32> {
        set.iter().map(|q| q.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_are_found_by_name_and_unknown_names_list_the_known() {
        for name in POLICY_NAMES {
            assert_eq!(by_name(name).unwrap().name(), name);
        }
        let err = by_name("lottery").err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown policy `lottery`; known policies: hpf, fifo, rr, bandwidth, edf, lcbe"
        );
    }
}
