//! Scheme A: an in-kernel monitor. Every `check_interval` it reads each queue's rptr
//! and wptr, finds the highest logical priority with pending work and every queue running below
//! it (inversions), preempts all of them through CWSR in that one pass, and resumes a preempted
//! queue once no higher-priority queue has work. A queue whose CU mask is disjoint from a
//! higher one's is left running: the two do not delay each other. Nothing is intercepted: applications keep
//! ringing their doorbells. Because one pass clears every inversion it finds, a queue that
//! becomes the highest with work is served at the first check after that: its detection delay
//! is at most one check interval.

use crate::device::Gpu;
use crate::kfd::Caller;
use crate::unmap::DestroyMode;
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
        // Step 2: for each queue, the highest queue with work above it on CUs it may share
        // (preempted queues still have theirs).
        let masks: Vec<Option<Vec<u64>>> = view
            .iter()
            .map(|v| gpu.cu_mask_words(v.0).ok().flatten())
            .collect();
        let above: Vec<Option<QueueId>> = (0..view.len())
            .map(|i| {
                (0..view.len())
                    .filter(|&j| view[j].2 > 0 && view[j].1 > view[i].1)
                    .filter(|&j| share(masks[i].as_deref(), masks[j].as_deref()))
                    .max_by_key(|&j| (view[j].1, std::cmp::Reverse(view[j].0)))
                    .map(|j| view[j].0)
            })
            .collect();
        self.preempt_held(gpu, now, &view, &above);
        // Step 5: resume preempted queues that nothing higher keeps off (a lower queue is not
        // resumed in the same pass as the higher one it would be preempted for at the next).
        for (i, &(q, _, _, _)) in view.iter().enumerate() {
            if !self.seen[q.0 as usize].preempted || above[i].is_some() {
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

    /// Step 3: CWSR preemption of every running queue with work that a higher queue with work
    /// (`above`) may share CUs with, all in this pass; their rings stay as they are.
    fn preempt_held(
        &mut self,
        gpu: &mut Gpu,
        now: Nanos,
        view: &[(QueueId, Priority, u64, bool)],
        above: &[Option<QueueId>],
    ) {
        let lows: Vec<(QueueId, QueueId)> = view
            .iter()
            .zip(above)
            .filter(|(v, _)| v.2 > 0 && !v.3)
            .filter_map(|(v, a)| a.map(|high| (v.0, high)))
            .collect();
        if let Some(top) = lows
            .iter()
            .filter_map(|&(_, h)| view.iter().find(|v| v.0 == h).map(|v| v.1))
            .max()
        {
            self.stats.inversions += 1;
            self.inversion_checks.push((now, top));
        }
        for (low, high) in lows {
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

/// Whether queues with these CU masks (`None`: every CU) may run on a common CU.
fn share(a: Option<&[u64]>, b: Option<&[u64]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.iter().zip(b).any(|(x, y)| x & y != 0),
        _ => true,
    }
}
