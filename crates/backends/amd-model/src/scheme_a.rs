//! Scheme A: an in-kernel monitor. Every `check_interval` it reads each queue's rptr
//! and wptr, finds the highest logical priority with pending work and every queue running below
//! it (inversions), preempts all of them through CWSR in that one pass, and resumes a preempted
//! queue once no higher-priority queue has work. Nothing is intercepted: applications keep
//! ringing their doorbells. Because one pass clears every inversion it finds, a queue that
//! becomes the highest with work is served at the first check after that: its detection delay
//! is at most one check interval.

use crate::cwsr::DestroyMode;
use crate::device::Gpu;
use crate::kfd::Caller;
use serde::Serialize;
use xpreempt_types::histogram::Histogram;
use xpreempt_types::{Nanos, Priority, QueueId};

#[derive(Clone, Debug, Default, Serialize)]
pub struct MonitorStats {
    pub checks: u64,
    pub inversions: u64,
    pub preemptions: u64,
    pub resumes: u64,
    pub errors: u64,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    pending: u64,
    preempted: bool,
}

/// One preemption the monitor made: when, and for which higher queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub at: Nanos,
    pub high: QueueId,
    pub low: QueueId,
}

pub struct Monitor {
    interval: Nanos,
    mode: DestroyMode,
    next_tick: Nanos,
    seen: Vec<Seen>,
    pub stats: MonitorStats,
    pub decisions: Vec<Decision>,
    /// Checks that found an inversion: (time, the priority it was resolved for).
    pub inversion_checks: Vec<(Nanos, Priority)>,
    /// From resume call to the queue running again, (the monitor's `resume latency`).
    pub resume_latency: Histogram,
    resuming: Vec<(QueueId, Nanos)>,
}

impl Monitor {
    pub fn new(interval: Nanos, mode: DestroyMode) -> Self {
        Self {
            interval: interval.max(1),
            mode,
            next_tick: interval.max(1),
            seen: Vec::new(),
            stats: MonitorStats::default(),
            decisions: Vec::new(),
            inversion_checks: Vec::new(),
            resume_latency: Histogram::new(),
            resuming: Vec::new(),
        }
    }

    pub fn next_tick(&self) -> Nanos {
        self.next_tick
    }

    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// Runs every check due by `now`.
    pub fn run_due(&mut self, gpu: &mut Gpu, now: Nanos) {
        while self.next_tick <= now {
            self.check(gpu, now);
            self.next_tick = self.next_tick.saturating_add(self.interval);
        }
        self.note_resumed(gpu, now);
    }

    fn note_resumed(&mut self, gpu: &Gpu, now: Nanos) {
        let hist = &mut self.resume_latency;
        self.resuming.retain(|&(q, since)| {
            let done = gpu.settled(q);
            if done {
                hist.record(now - since);
            }
            !done
        });
    }

    /// One pass of the monitor thread: scan, detect, preempt, then try to resume.
    pub fn check(&mut self, gpu: &mut Gpu, now: Nanos) {
        self.stats.checks += 1;
        let ids: Vec<QueueId> = gpu.queue_ids().collect();
        self.seen.resize(
            ids.iter().map(|q| q.0 as usize + 1).max().unwrap_or(0),
            Seen {
                pending: 0,
                preempted: false,
            },
        );
        // Step 1: rptr/wptr of every queue (two MMIO reads each on real hardware).
        let mut view: Vec<(QueueId, Priority, u64, bool)> = Vec::new();
        for &q in &ids {
            let Ok((r, w)) = gpu.ring_ids(q) else {
                continue;
            };
            let prio = gpu.logical_priority(q).unwrap_or(Priority::MIN);
            let s = &mut self.seen[q.0 as usize];
            s.pending = w - r;
            view.push((q, prio, s.pending, s.preempted));
        }
        // Step 2: the highest logical priority with work (preempted queues still have theirs).
        let top = view.iter().filter(|v| v.2 > 0).map(|v| v.1).max();
        if let Some(top) = top {
            self.preempt_below(gpu, now, &view, top);
        }
        // Step 5: resume preempted queues that nothing higher keeps off.
        for &(q, prio, _, _) in &view {
            if !self.seen[q.0 as usize].preempted {
                continue;
            }
            // Only the top level comes back, so that a lower queue is not resumed in the same
            // pass as the higher one it would be preempted for at the next.
            if top.is_some_and(|t| prio < t) {
                continue;
            }
            match gpu.resume_queue(Caller::kernel(), q) {
                Ok(()) => {
                    self.stats.resumes += 1;
                    self.seen[q.0 as usize].preempted = false;
                    self.resuming.push((q, now));
                }
                Err(e) => {
                    self.stats.errors += 1;
                    tracing::warn!(queue = %q, error = %e, "scheme A: resume failed");
                }
            }
        }
    }

    /// Step 3: CWSR preemption of every queue running below `top`, all in this pass; their
    /// rings stay as they are.
    fn preempt_below(
        &mut self,
        gpu: &mut Gpu,
        now: Nanos,
        view: &[(QueueId, Priority, u64, bool)],
        top: Priority,
    ) {
        let high = view
            .iter()
            .filter(|v| v.2 > 0 && v.1 == top)
            .map(|v| v.0)
            .min()
            .unwrap_or(QueueId(0));
        let lows: Vec<QueueId> = view
            .iter()
            .filter(|v| v.2 > 0 && !v.3 && v.1 < top)
            .map(|v| v.0)
            .collect();
        if !lows.is_empty() {
            self.stats.inversions += 1;
            self.inversion_checks.push((now, top));
        }
        for low in lows {
            match gpu.preempt_queue(Caller::kernel(), low, self.mode) {
                Ok(()) => {
                    self.stats.preemptions += 1;
                    self.seen[low.0 as usize].preempted = true;
                    self.decisions.push(Decision { at: now, high, low });
                    tracing::debug!(%high, %low, "scheme A: preempted on inversion");
                }
                Err(e) => {
                    self.stats.errors += 1;
                    tracing::warn!(queue = %low, error = %e, "scheme A: preemption failed");
                }
            }
        }
    }
}
