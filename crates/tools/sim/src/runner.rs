//! Plays a scenario on a fresh model under one mode and measures it.
//!
//! - `none`: applications write their rings directly; the hardware alone decides.
//! - `scheme-a`: the same, plus Scheme A's in-kernel monitor loop.
//! - `lv1`, `lv2`, `lv3`: Scheme B, the core scheduler and XQueues at that level.

use crate::decisions::DecisionLog;
use crate::scenario::{Scenario, ScenarioError};
use crate::scheme_b::{SchemeB, SchemeBError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use thiserror::Error;
use xpreempt_amd::config::{KernelCode, us};
use xpreempt_amd::scheme_a::Monitor;
use xpreempt_amd::trace::TraceBuf;
use xpreempt_amd::{AmdKernel, Caller, Gpu, GpuStats, HqdStats, QueueProps, aql, compute::CuMask};
use xpreempt_core::sched::Hooks;
use xpreempt_core::stats::histogram::Histogram;
use xpreempt_core::xqueue::ConfigError;
use xpreempt_core::{Level, Nanos, QueueConfig, QueueId};

mod mode;
pub use mode::{Mode, UnknownMode};

/// Each variant's cause is its `source`, not part of its message: reporters print the chain, and
/// a message that repeated it would print it twice.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("mode {mode}: setting up the model failed")]
    Model {
        mode: Mode,
        #[source]
        source: xpreempt_amd::ModelError,
    },
    #[error("mode {mode}: Scheme B")]
    Scheduler {
        mode: Mode,
        #[source]
        source: SchemeBError,
    },
    #[error("mode {mode}: a queue's launch window")]
    Window {
        mode: Mode,
        #[source]
        source: ConfigError,
    },
    #[error("mode {mode}: the scenario's run would not fit the model's clock")]
    Clock { mode: Mode },
    /// A HAL outlived Scheme B: a bug, reported instead of checking a model in use.
    #[error("mode {mode}: the model is still shared after the run")]
    StillShared { mode: Mode },
    /// The scenario is not one the model can run (see [`Scenario::validate`]).
    #[error("mode {mode}")]
    Scenario {
        mode: Mode,
        #[source]
        source: ScenarioError,
    },
}

#[derive(Default)]
pub struct RunOptions {
    pub trace: bool,
    /// Overrides the scenario's Scheme B policy.
    pub policy: Option<String>,
    /// Programmable hooks (the eBPF layer) for Scheme B's scheduler.
    pub hooks: Option<Box<dyn Hooks>>,
}

#[derive(Clone, Debug)]
pub struct TaskRun {
    pub name: String,
    pub priority: xpreempt_core::Priority,
    /// The priority Scheme B's scheduler held for the task's queue at the end of the run, after
    /// the hooks (an eBPF `task_init`) had their say; `None` outside Scheme B.
    pub effective_priority: Option<xpreempt_core::Priority>,
    /// Arrival to completion of the last kernel, per request.
    pub latencies: Vec<Nanos>,
    /// Scheme A: for the requests the monitor preempted lower queues for, the time from the
    /// request becoming the highest priority with work to that preemption (never more than
    /// the check interval). One entry per such request.
    pub detection_delays: Vec<Nanos>,
    /// Scheme A: what the monitor did for each completed request, in arrival order.
    pub detections: Vec<Detection>,
    pub kernels: u64,
    /// The task's queue's map/unmap counts and the time it waited for an HQD with work.
    pub hqd: HqdStats,
}

/// What Scheme A's monitor did for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Detection {
    /// At its first check the monitor found lower queues running and preempted them; `delay`
    /// runs from the request becoming the highest priority with work (its arrival, or the end
    /// of the higher-priority work then outstanding) to that check.
    Acted { delay: Nanos },
    /// Nothing lower was running at that check: there was no inversion to detect.
    NotNeeded,
    /// The request finished before any check saw it as the highest priority with work.
    Unseen,
}

pub struct ModeRun {
    pub mode: Mode,
    pub tasks: Vec<TaskRun>,
    /// Preemption request to the hardware being free of the queue's work (ns).
    pub preempt_latency: Histogram,
    pub preemptions: u64,
    pub resumes: u64,
    pub exactly_once: bool,
    pub problems: Vec<String>,
    pub stats: GpuStats,
    pub end: Nanos,
    /// When the first request arrived: the makespan runs from here to `end`.
    pub first_arrival: Nanos,
    /// CU time with waves resident (see [`Gpu::cu_busy_ns`]).
    pub cu_busy_ns: u128,
    pub trace: Option<TraceBuf>,
    /// Scheme A's own counters, and its resume latency (ns).
    pub monitor: Option<(xpreempt_amd::scheme_a::MonitorStats, Histogram)>,
}

struct Outstanding {
    end_seq: u64,
    arrival: Nanos,
}

/// Runs `scenario` under `mode`.
pub fn run(scenario: &Scenario, mode: Mode, opts: RunOptions) -> Result<ModeRun, RunError> {
    let model = |source| RunError::Model { mode, source };
    let sched = |source| RunError::Scheduler { mode, source };
    // The fields are public, so a scenario may have been changed since it was parsed.
    scenario
        .validate()
        .map_err(|source| RunError::Scenario { mode, source })?;
    let mut gpu = Gpu::new(scenario.gpu.clone()).map_err(model)?;
    if opts.trace {
        gpu.enable_trace();
    }
    let mut queues = Vec::new();
    let mut objects = Vec::new();
    for t in &scenario.tasks {
        objects.push(gpu.load_kernel(KernelCode {
            name: t.name.clone(),
            wg_ns: us(t.kernel.wg_us).max(1),
            jitter: t.kernel.jitter,
            idempotent: t.kernel.idempotent,
        }));
        let props = QueueProps {
            name: t.name.clone(),
            ring_size: t.ring_size,
            logical_priority: t.priority,
            cu_mask: t
                .cu_range
                .map(|[first, n]| CuMask::from_range(first, n, scenario.gpu.cus)),
        };
        let caller = Caller::process(t.process);
        queues.push((
            gpu.create_queue(caller, props).map_err(model)?,
            caller,
            t.priority,
        ));
    }
    let gpu = Rc::new(RefCell::new(gpu));
    let mut scheme_b = match mode.level() {
        Some(level) => {
            let b = &scenario.scheme_b;
            let (t, n) = if level == Level::Lv1 {
                (b.lv1_threshold, b.lv1_batch)
            } else {
                (b.threshold, b.batch)
            };
            // More in flight than the ring holds would make a launch fail; the ring bounds it.
            let windows = scenario
                .tasks
                .iter()
                .map(|task| {
                    let t = t.min(task.ring_size);
                    QueueConfig::new(t, n.min(t), level)
                        .map_err(|source| RunError::Window { mode, source })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let policy = opts.policy.as_deref().unwrap_or(&b.policy);
            Some(SchemeB::new(&gpu, &queues, level, &windows, policy, opts.hooks).map_err(sched)?)
        }
        None => None,
    };
    let mut monitor = (mode == Mode::SchemeA).then(|| {
        Monitor::new(
            us(scenario.scheme_a.check_interval_us),
            scenario.scheme_a.mode,
        )
    });

    let arrivals = scenario.arrivals();
    let n = scenario.tasks.len();
    let mut next_arrival = 0;
    let mut outstanding: Vec<VecDeque<Outstanding>> = (0..n).map(|_| VecDeque::new()).collect();
    let mut apps = Apps {
        submitted: vec![0; n],
        backlog: vec![0; n],
        signals: Vec::new(),
    };
    let mut tasks: Vec<TaskRun> = scenario
        .tasks
        .iter()
        .map(|t| TaskRun {
            name: t.name.clone(),
            priority: t.priority,
            effective_priority: None,
            latencies: Vec::new(),
            detection_delays: Vec::new(),
            detections: Vec::new(),
            kernels: 0,
            hqd: HqdStats::default(),
        })
        .collect();
    let mut problems = Vec::new();
    // Validation keeps this below 2^62 ns; checked all the same.
    let limit = Nanos::try_from(scenario.horizon_ns()).map_err(|_| RunError::Clock { mode })?;
    let mut log = opts.trace.then(|| DecisionLog::new(n));

    loop {
        let done = next_arrival == arrivals.len() && outstanding.iter().all(|o| o.is_empty());
        if done {
            break;
        }
        let candidates = [
            gpu.borrow().next_event_time(),
            arrivals.get(next_arrival).map(|a| a.0),
            monitor.as_ref().map(|m| m.next_tick()),
            scheme_b.as_ref().and_then(|b| b.next_wake()),
        ];
        let Some(now) = candidates.into_iter().flatten().min() else {
            problems.push("the model stopped with work outstanding".to_string());
            break;
        };
        if now > limit {
            problems.push(format!("work still outstanding at {} ms", now / 1_000_000));
            break;
        }
        gpu.borrow_mut().advance_to(now);
        while let Some(&(at, task)) = arrivals.get(next_arrival) {
            if at > now {
                break;
            }
            next_arrival += 1;
            let t = &scenario.tasks[task];
            let k = u64::from(t.kernels);
            outstanding[task].push_back(Outstanding {
                end_seq: apps.submitted[task] + apps.backlog[task] + k,
                arrival: now,
            });
            tasks[task].kernels += k;
            match scheme_b.as_mut() {
                Some(b) => {
                    let kernel = AmdKernel {
                        object: objects[task],
                        workgroups: t.kernel.workgroups,
                        wg_threads: t.kernel.wg_threads,
                    };
                    for _ in 0..k {
                        b.submit(task, kernel, t.kernel.idempotent, now)
                            .map_err(sched)?;
                    }
                    apps.submitted[task] += k;
                }
                None => apps.backlog[task] += k,
            }
        }
        if scheme_b.is_none() {
            apps.write(&mut gpu.borrow_mut(), scenario, &objects, &queues)
                .map_err(model)?;
        }
        if let Some(m) = monitor.as_mut() {
            run_monitor(m, &mut gpu.borrow_mut(), now, log.as_mut());
        }
        if let Some(b) = scheme_b.as_mut() {
            b.timer(now).map_err(sched)?;
        }
        loop {
            let touched = gpu.borrow_mut().take_touched();
            if touched.is_empty() {
                break;
            }
            for q in touched {
                let task = q.0 as usize;
                if let Some(b) = scheme_b.as_mut() {
                    b.poll(task, now).map_err(sched)?;
                }
                let read = gpu.borrow().ring_ids(q).map_or(0, |r| r.0);
                while outstanding[task].front().is_some_and(|o| o.end_seq <= read) {
                    if let Some(o) = outstanding[task].pop_front() {
                        tasks[task].latencies.push(now - o.arrival);
                    }
                }
                if let Some(e) = gpu.borrow().queue_error(q) {
                    let p = format!("queue {}: {e}", scenario.tasks[task].name);
                    if !problems.contains(&p) {
                        problems.push(p);
                    }
                }
            }
            if scheme_b.is_none() {
                apps.write(&mut gpu.borrow_mut(), scenario, &objects, &queues)
                    .map_err(model)?;
            }
        }
        if let Some(m) = monitor.as_mut() {
            run_monitor(m, &mut gpu.borrow_mut(), now, log.as_mut());
        }
        if let (Some(b), Some(log)) = (&scheme_b, log.as_mut()) {
            log.scheme_b(b, now);
        }
    }

    let (preempt_latency, preemptions, resumes) = match (&scheme_b, &monitor) {
        (Some(b), _) => {
            let mut h = Histogram::new();
            for q in b.queue_stats() {
                h.merge(&q.suspend_latency);
            }
            let s = b.scheduler_stats();
            (h, s.preemptions, s.resumes)
        }
        (None, Some(m)) => {
            let mut h = Histogram::new();
            for t in gpu
                .borrow()
                .transitions()
                .iter()
                .filter(|t| t.kind == "preempt")
            {
                h.record(t.done_at - t.requested_at);
            }
            (h, m.stats.preemptions, m.stats.resumes)
        }
        (None, None) => (Histogram::new(), 0, 0),
    };
    if let Some(m) = &monitor {
        record_detections(m, &arrivals, &mut tasks);
    }
    if let Some(b) = &scheme_b {
        for (i, t) in tasks.iter_mut().enumerate() {
            t.effective_priority = b.effective_priority(i);
        }
    }
    drop(scheme_b);
    let mut gpu = Rc::try_unwrap(gpu)
        .map_err(|_| RunError::StillShared { mode })?
        .into_inner();
    for (t, &(q, _, _)) in tasks.iter_mut().zip(&queues) {
        if let Ok(h) = gpu.hqd_stats(q) {
            t.hqd = h.clone();
        }
    }
    let exactly_once = check_exactly_once(
        &gpu,
        scenario,
        &queues,
        &apps.submitted,
        &apps.signals,
        &mut problems,
    );
    let mut trace = gpu.take_trace();
    if let (Some(t), Some(log)) = (trace.as_mut(), &log) {
        log.write(t, &arrivals[..next_arrival]);
    }
    Ok(ModeRun {
        mode,
        tasks,
        preempt_latency,
        preemptions,
        resumes,
        exactly_once,
        problems,
        stats: gpu.stats().clone(),
        end: gpu.now(),
        first_arrival: arrivals.first().map_or(0, |a| a.0),
        cu_busy_ns: gpu.cu_busy_ns(),
        trace,
        monitor: monitor.map(|m| (m.stats, m.resume_latency)),
    })
}

/// Classifies every completed request by what Scheme A's monitor did for it (see
/// [`Detection`]). A request becomes eligible once no request of a higher priority is
/// outstanding; the first check at or after that either finds an inversion for its priority
/// and clears it, or finds none.
fn record_detections(m: &Monitor, arrivals: &[(Nanos, usize)], tasks: &mut [TaskRun]) {
    let interval = m.interval();
    let acted: std::collections::BTreeSet<(Nanos, xpreempt_core::Priority)> =
        m.inversion_checks.iter().copied().collect();
    // Every completed request: (arrival, completion, priority).
    let mut done: Vec<(Nanos, Nanos, xpreempt_core::Priority)> = Vec::new();
    let mut per_task: Vec<Vec<(Nanos, Nanos)>> = vec![Vec::new(); tasks.len()];
    for (task, t) in tasks.iter().enumerate() {
        let requests = arrivals.iter().filter(|a| a.1 == task).zip(&t.latencies);
        for (&(at, _), &latency) in requests {
            let end = at.saturating_add(latency);
            done.push((at, end, t.priority));
            per_task[task].push((at, end));
        }
    }
    for (t, requests) in tasks.iter_mut().zip(per_task) {
        // Higher-priority work as disjoint busy intervals, in time order.
        let mut busy: Vec<(Nanos, Nanos)> = done
            .iter()
            .filter(|d| d.2 > t.priority)
            .map(|d| (d.0, d.1))
            .collect();
        busy.sort_unstable();
        let mut merged: Vec<(Nanos, Nanos)> = Vec::new();
        for (a, b) in busy {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (at, end) in requests {
            let k = merged.partition_point(|&(a, _)| a <= at);
            let eligible = match k.checked_sub(1).map(|k| merged[k]) {
                Some((_, b)) if b > at => b,
                _ => at,
            };
            // The monitor checks at every multiple of the interval, starting at one interval.
            let check = eligible.div_ceil(interval).max(1).saturating_mul(interval);
            let d = if check >= end {
                Detection::Unseen
            } else if acted.contains(&(check, t.priority)) {
                t.detection_delays.push(check - eligible);
                Detection::Acted {
                    delay: check - eligible,
                }
            } else {
                Detection::NotNeeded
            };
            t.detections.push(d);
        }
    }
}

/// Scheme A's due checks, logged for the trace when one is kept.
fn run_monitor(m: &mut Monitor, gpu: &mut Gpu, now: Nanos, log: Option<&mut DecisionLog>) {
    match log {
        Some(log) => log.run_monitor(m, gpu, now),
        None => m.run_due(gpu, now),
    }
}

/// The application side of `none`/`scheme-a`: kernels written straight into the rings.
struct Apps {
    /// Kernels written into each task's ring so far.
    submitted: Vec<u64>,
    /// Kernels that arrived but did not fit the ring yet.
    backlog: Vec<u64>,
    /// Every completion signal created, for the exactly-once check.
    signals: Vec<u64>,
}

impl Apps {
    /// Writes as many backlogged kernels as each ring has room for.
    fn write(
        &mut self,
        gpu: &mut Gpu,
        scenario: &Scenario,
        objects: &[u64],
        queues: &[(QueueId, Caller, i32)],
    ) -> Result<(), xpreempt_amd::ModelError> {
        for (task, t) in scenario.tasks.iter().enumerate() {
            write_backlog(
                gpu,
                &mut self.backlog[task],
                &mut self.submitted[task],
                &mut self.signals,
                t,
                objects[task],
                queues[task].0,
            )?;
        }
        Ok(())
    }
}

fn write_backlog(
    gpu: &mut Gpu,
    backlog: &mut u64,
    submitted: &mut u64,
    signals: &mut Vec<u64>,
    task: &crate::scenario::Task,
    object: u64,
    queue: QueueId,
) -> Result<(), xpreempt_amd::ModelError> {
    if *backlog == 0 {
        return Ok(());
    }
    let room = gpu.ring_free(queue)?.min(*backlog);
    for _ in 0..room {
        let signal = gpu.create_signal(1);
        signals.push(signal);
        let p = aql::Packet::Dispatch(aql::KernelDispatch::linear(
            object,
            task.kernel.workgroups,
            task.kernel.wg_threads,
            signal,
        ));
        gpu.submit_packet(queue, &p)?;
    }
    *backlog -= room;
    *submitted += room;
    Ok(())
}

/// Every kernel completed once: the rings are fully retired, every completion signal went from
/// 1 to exactly 0, each workgroup finished once, and no read id moved while off the hardware.
fn check_exactly_once(
    gpu: &Gpu,
    scenario: &Scenario,
    queues: &[(QueueId, Caller, xpreempt_core::Priority)],
    submitted: &[u64],
    signals: &[u64],
    problems: &mut Vec<String>,
) -> bool {
    let before = problems.len();
    let s = gpu.stats();
    for (task, t) in scenario.tasks.iter().enumerate() {
        let (r, w) = gpu.ring_ids(queues[task].0).unwrap_or((0, u64::MAX));
        if r != w || w != submitted[task] {
            problems.push(format!(
                "task {}: {} kernels submitted, ring write id {w}, read id {r}",
                t.name, submitted[task]
            ));
        }
    }
    let mut want = 0u64;
    for (task, t) in scenario.tasks.iter().enumerate() {
        want = want.saturating_add(submitted[task].saturating_mul(u64::from(t.kernel.workgroups)));
    }
    if s.wgs_completed != want {
        problems.push(format!(
            "{} workgroups completed, {want} expected",
            s.wgs_completed
        ));
    }
    let _ = signals;
    if let Some(h) = (1..=gpu.signal_count()).find(|&h| gpu.signal_value(h) != Some(0)) {
        problems.push(format!(
            "completion signal {h} is {:?}, not 0",
            gpu.signal_value(h)
        ));
    }
    if s.exactly_once_violations > 0 || s.ring_moved_while_preempted > 0 {
        problems.push(format!(
            "{} duplicate completions, {} read-id moves while preempted",
            s.exactly_once_violations, s.ring_moved_while_preempted
        ));
    }
    problems.len() == before
}
