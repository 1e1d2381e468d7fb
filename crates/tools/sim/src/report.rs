//! Runs a scenario under several modes and compares them: the `xpreempt sim` report.

use crate::runner::{self, Mode, ModeRun, RunError, RunOptions};
use crate::scenario::Scenario;
use serde::Serialize;
use xpreempt_core::sched::Hooks;
use xpreempt_core::{Nanos, Priority};

mod table;
pub use table::{monitor_lines, table};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    pub scenario: String,
    pub modes: Vec<ModeReport>,
    /// What went wrong in the standalone runs (each task alone), which every "x alone"
    /// column divides by.
    pub standalone_problems: Vec<String>,
}

impl SimReport {
    /// Every problem of every run, prefixed with the run it belongs to: empty when the
    /// simulation can be trusted.
    pub fn failures(&self) -> Vec<String> {
        let alone = self
            .standalone_problems
            .iter()
            .map(|p| format!("alone: {p}"));
        let modes = self
            .modes
            .iter()
            .flat_map(|m| m.problems.iter().map(move |p| format!("{}: {p}", m.mode)));
        alone.chain(modes).collect()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeReport {
    pub mode: &'static str,
    pub tasks: Vec<TaskReport>,
    /// Mean latency of the lowest-priority tasks over that of the highest-priority ones (the
    /// latency ratio: training ~80 ms / inference ~25 ms ≈ 3.2×); none when either tier
    /// completed nothing.
    pub latency_ratio: Option<f64>,
    pub preempt_latency_us: Percentiles,
    pub preemptions: u64,
    pub resumes: u64,
    pub exactly_once: bool,
    /// Why this mode's numbers cannot be trusted: a kernel not run exactly once, work still
    /// outstanding when the runner gave up, a task that completed fewer requests than it
    /// made. Empty when all is well.
    pub problems: Vec<String>,
    /// Latency per logical priority, highest first: the requests of every task at that
    /// priority together.
    pub tiers: Vec<TierReport>,
    /// First arrival to the last completion (µs).
    pub makespan_us: f64,
    /// Kernels completed, and per second of makespan.
    pub kernels: u64,
    pub kernels_per_s: f64,
    /// CU time with waves resident over `CUs × makespan` (0 to 1).
    pub gpu_utilization: f64,
    /// HWS work: runlists sent, queues mapped (each map of a batch) and unmapped.
    pub runlists: u64,
    pub maps: u64,
    pub unmaps: u64,
    /// Unmaps by an HWS quantum rotation, and busy queues unmapped for a higher one.
    pub rotations: u64,
    pub displacements: u64,
    /// CU-mask changes (spatial yield: a lower queue giving up a higher queue's CUs, or taking
    /// them back), each a runlist executed again.
    pub yields: u64,
    /// Time queues with work waited for an HQD (summed over queues), and the longest wait.
    pub hqd_wait_us: f64,
    pub max_hqd_wait_us: f64,
}

/// Nearest-rank percentiles and the maximum of a set of latencies (µs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Distribution {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Distribution {
    /// None for an empty set: no request completed, so there is nothing to describe.
    pub fn of(latencies: &[Nanos]) -> Option<Self> {
        let mut v = latencies.to_vec();
        v.sort_unstable();
        let at = |q: f64| {
            // Nearest rank: the smallest value with at least q of the set at or below it.
            let rank = (q * v.len() as f64).ceil() as usize;
            us(v[rank.clamp(1, v.len()) - 1])
        };
        let max = *v.last()?;
        Some(Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: us(max),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierReport {
    pub priority: Priority,
    pub tasks: usize,
    /// Requests completed by the tier's tasks.
    pub requests: usize,
    pub mean_us: Option<f64>,
    pub latency_pct_us: Option<Distribution>,
    /// The p99 of the same tasks' requests, each task alone on the GPU, and this tier's p99
    /// over it: how much the other tenants cost the tier at its tail.
    pub standalone_p99_us: Option<f64>,
    pub p99_vs_alone: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskReport {
    pub name: String,
    pub priority: Priority,
    /// Scheme A: what the monitor did for each completed request, in arrival order (empty in
    /// other modes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub detections: Vec<crate::runner::Detection>,
    /// The task's queue's HQD history: maps, unmaps, rotations, and time waiting for a slot.
    pub hqd: xpreempt_amd::HqdStats,
    /// The priority the scheduler used when an eBPF policy changed it (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effective_priority: Option<Priority>,
    /// Mean over the task's requests, arrival to last kernel completed; none when no request
    /// completed.
    pub latency_us: Option<f64>,
    pub max_latency_us: Option<f64>,
    /// The same requests with the task alone on the GPU (none when that run completed none).
    pub standalone_us: Option<f64>,
    /// Requests completed.
    pub requests: usize,
    /// Percentiles of the same latencies (none when no request completed).
    pub latency_pct_us: Option<Distribution>,
    /// Scheme A only: arrival to the preemption made for this task (max over requests).
    pub detection_delay_us: Option<f64>,
}

#[derive(Default)]
pub struct SimOptions {
    pub trace: bool,
    pub policy: Option<String>,
    /// Builds fresh hooks for each Scheme B run.
    pub hooks: Option<Box<dyn Fn() -> Box<dyn Hooks>>>,
}

pub(crate) fn us(ns: Nanos) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

fn mean(v: &[Nanos]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    // Summed wider than `Nanos`: a million latencies near the 2^62 ns limit would overflow.
    let sum: u128 = v.iter().map(|&l| u128::from(l)).sum();
    Some(us((sum / v.len() as u128) as Nanos))
}

/// The run's own problems, plus every task that completed fewer requests than it made: a
/// latency averaged over the requests that happened to finish would look fine.
fn run_problems(run: &ModeRun, scenario: &Scenario) -> Vec<String> {
    let mut problems = run.problems.clone();
    for (t, spec) in run.tasks.iter().zip(&scenario.tasks) {
        let want = spec.arrival.requests() as usize;
        if t.latencies.len() < want {
            problems.push(format!(
                "task {} completed {} of its {want} requests",
                t.name,
                t.latencies.len()
            ));
        }
    }
    problems
}

/// Runs `modes` and each task alone; returns the report and the raw runs (traces, stats).
pub fn simulate(
    scenario: &Scenario,
    modes: &[Mode],
    opts: &SimOptions,
) -> Result<(SimReport, Vec<ModeRun>), RunError> {
    let mut standalone = Vec::new();
    let mut alone_latencies = Vec::new();
    let mut standalone_problems = Vec::new();
    for i in 0..scenario.tasks.len() {
        let only = scenario.only(i);
        let mut alone = runner::run(&only, Mode::None, RunOptions::default())?;
        standalone.push(mean(&alone.tasks[0].latencies));
        standalone_problems.extend(run_problems(&alone, &only));
        alone_latencies.push(std::mem::take(&mut alone.tasks[0].latencies));
    }
    let mut runs = Vec::new();
    for &mode in modes {
        let run_opts = RunOptions {
            trace: opts.trace,
            policy: opts.policy.clone(),
            hooks: opts.hooks.as_ref().map(|f| f()),
        };
        runs.push(runner::run(scenario, mode, run_opts)?);
    }
    let modes = runs
        .iter()
        .map(|r| mode_report(r, scenario, &standalone, &alone_latencies))
        .collect();
    Ok((
        SimReport {
            scenario: scenario.name.clone(),
            modes,
            standalone_problems,
        },
        runs,
    ))
}

fn mode_report(
    run: &ModeRun,
    scenario: &Scenario,
    standalone: &[Option<f64>],
    alone_latencies: &[Vec<Nanos>],
) -> ModeReport {
    let tasks: Vec<TaskReport> = run
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| TaskReport {
            name: t.name.clone(),
            priority: t.priority,
            effective_priority: t.effective_priority.filter(|&p| p != t.priority),
            hqd: t.hqd.clone(),
            detections: t.detections.clone(),
            latency_us: mean(&t.latencies),
            max_latency_us: t.latencies.iter().copied().max().map(us),
            standalone_us: standalone.get(i).copied().flatten(),
            requests: t.latencies.len(),
            latency_pct_us: Distribution::of(&t.latencies),
            detection_delay_us: t.detection_delays.iter().copied().max().map(us),
        })
        .collect();
    // A tier with a task that completed nothing has no mean worth comparing.
    let of_prio = |p: Priority| {
        let v: Option<Vec<f64>> = tasks
            .iter()
            .filter(|t| t.priority == p)
            .map(|t| t.latency_us)
            .collect();
        v.filter(|v| !v.is_empty())
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
    };
    let hi = tasks.iter().map(|t| t.priority).max().unwrap_or(0);
    let lo = tasks.iter().map(|t| t.priority).min().unwrap_or(0);
    let ratio = match (of_prio(lo), of_prio(hi)) {
        (Some(lo), Some(hi)) if hi > 0.0 => Some(((lo / hi) * 1000.0).round() / 1000.0),
        _ => None,
    };
    let h = &run.preempt_latency;
    let pct = |q: f64| (h.count() > 0).then(|| us(h.quantile(q)));
    let makespan = run.end.saturating_sub(run.first_arrival);
    let kernels = run.stats.dispatches_completed;
    let cu_time = u128::from(scenario.gpu.cus) * u128::from(makespan);
    ModeReport {
        mode: run.mode.name(),
        tasks,
        latency_ratio: ratio,
        preempt_latency_us: Percentiles {
            p50: pct(0.5),
            p99: pct(0.99),
        },
        preemptions: run.preemptions,
        resumes: run.resumes,
        exactly_once: run.exactly_once && run.problems.is_empty(),
        problems: run_problems(run, scenario),
        tiers: tiers(run, alone_latencies),
        makespan_us: us(makespan),
        kernels,
        kernels_per_s: if makespan > 0 {
            (kernels as f64 * 1e9 / makespan as f64 * 10.0).round() / 10.0
        } else {
            0.0
        },
        gpu_utilization: if cu_time > 0 {
            (run.cu_busy_ns as f64 / cu_time as f64 * 1e4).round() / 1e4
        } else {
            0.0
        },
        runlists: run.stats.runlists,
        maps: run.stats.maps,
        unmaps: run.stats.unmaps,
        rotations: run.stats.rotations,
        displacements: run.stats.displacements,
        yields: run.stats.runlist_reexecutions,
        hqd_wait_us: us(run.stats.hqd_wait_ns),
        max_hqd_wait_us: us(run.stats.max_hqd_wait_ns),
    }
}

/// Every task's requests grouped by logical priority, highest first.
fn tiers(run: &ModeRun, alone_latencies: &[Vec<Nanos>]) -> Vec<TierReport> {
    let mut prios: Vec<Priority> = run.tasks.iter().map(|t| t.priority).collect();
    prios.sort_unstable_by(|a, b| b.cmp(a));
    prios.dedup();
    prios
        .into_iter()
        .map(|p| {
            let of_tier = || run.tasks.iter().filter(move |t| t.priority == p);
            let latencies: Vec<Nanos> = of_tier()
                .flat_map(|t| t.latencies.iter().copied())
                .collect();
            let alone: Vec<Nanos> = run
                .tasks
                .iter()
                .zip(alone_latencies)
                .filter(|(t, _)| t.priority == p)
                .flat_map(|(_, l)| l.iter().copied())
                .collect();
            let pct = Distribution::of(&latencies);
            let alone_p99 = Distribution::of(&alone).map(|d| d.p99);
            let ratio = match (pct, alone_p99) {
                (Some(d), Some(a)) if a > 0.0 => Some((d.p99 / a * 1000.0).round() / 1000.0),
                _ => None,
            };
            TierReport {
                priority: p,
                tasks: of_tier().count(),
                requests: latencies.len(),
                mean_us: mean(&latencies),
                latency_pct_us: pct,
                standalone_p99_us: alone_p99,
                p99_vs_alone: ratio,
            }
        })
        .collect()
}
