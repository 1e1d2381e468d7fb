//! Statistics the seed asks for: scheduler checks, inversions, preemptions and resumes, per queue
//! and in total, and histograms of suspend and resume latency.

use crate::QueueId;
mod gpu_time;

pub use gpu_time::{GpuTime, GpuTimeSummary};
use serde::{Deserialize, Serialize};
pub use xpreempt_types::histogram;
use xpreempt_types::histogram::{Histogram, Summary};

/// Kept by each XQueue.
#[derive(Clone, Debug, Default)]
pub struct QueueStats {
    pub submitted: u64,
    pub launched: u64,
    pub completed: u64,
    pub preemptions: u64,
    /// Suspensions whose hardware stop began before the queue's lock was taken
    /// (`HwQueue::stop_ahead`).
    pub stops_ahead: u64,
    pub resumes: u64,
    pub hal_errors: u64,
    /// Launches from the pending buffer (the window was full when they were submitted).
    pub buffered_launches: u64,
    /// Times everything launched was found complete while commands waited in the buffer and the
    /// queue could run: the hardware may have idled for want of the queue's work.
    pub ran_dry: u64,
    /// From `suspend` until the hardware is free of the queue's work (ns), for suspensions that
    /// used the queue's level's mechanism.
    pub suspend_latency: Histogram,
    /// The same for suspensions of a queue above Lv1 that drained as at Lv1 instead: its
    /// commands were too short for the hardware stop to pay, or the stop failed. They cost what
    /// an Lv1 drain costs, not what the level's mechanism does.
    pub drain_latency: Histogram,
    /// From `resume` until the hardware runs the queue again (ns).
    pub resume_latency: Histogram,
    /// The queue's GPU time, busy fraction, bursts and gaps, measured from its completions.
    pub gpu: GpuTime,
}

/// Kept by the scheduler.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerStats {
    /// Times the policy was asked.
    pub checks: u64,
    /// Checks that found a lower effective priority running while a higher one waited.
    pub inversions: u64,
    pub preemptions: u64,
    pub resumes: u64,
    /// Admissions a policy refused (busy-retry).
    pub refusals: u64,
}

/// A printable, serializable snapshot of one queue's statistics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueSummary {
    pub queue: QueueId,
    pub submitted: u64,
    pub completed: u64,
    pub preemptions: u64,
    pub resumes: u64,
    pub hal_errors: u64,
    pub suspend_latency_ns: Summary,
    /// Suspensions that drained although the queue's level could stop the hardware.
    #[serde(default)]
    pub drain_latency_ns: Summary,
    pub resume_latency_ns: Summary,
    #[serde(default)]
    pub gpu: GpuTimeSummary,
}

/// The whole device: scheduler counters, per-queue reports and merged latency histograms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub scheduler: SchedulerStats,
    pub queues: Vec<QueueSummary>,
    pub suspend_latency_ns: Summary,
    pub resume_latency_ns: Summary,
}

impl QueueStats {
    pub fn report(&self, queue: QueueId) -> QueueSummary {
        QueueSummary {
            queue,
            submitted: self.submitted,
            completed: self.completed,
            preemptions: self.preemptions,
            resumes: self.resumes,
            hal_errors: self.hal_errors,
            suspend_latency_ns: self.suspend_latency.summary(),
            drain_latency_ns: self.drain_latency.summary(),
            resume_latency_ns: self.resume_latency.summary(),
            gpu: self.gpu.last_summary(),
        }
    }
}

impl StatsReport {
    pub fn new<'a>(
        scheduler: SchedulerStats,
        queues: impl IntoIterator<Item = (QueueId, &'a QueueStats)>,
    ) -> Self {
        let mut suspend = Histogram::new();
        let mut resume = Histogram::new();
        let queues = queues
            .into_iter()
            .map(|(id, s)| {
                suspend.merge(&s.suspend_latency);
                suspend.merge(&s.drain_latency);
                resume.merge(&s.resume_latency);
                s.report(id)
            })
            .collect();
        Self {
            scheduler,
            queues,
            suspend_latency_ns: suspend.summary(),
            resume_latency_ns: resume.summary(),
        }
    }
}
