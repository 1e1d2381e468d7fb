//! Runs a scenario under several modes and compares them: the `xpreempt sim` report.

use crate::runner::{self, Mode, ModeRun, RunError, RunOptions};
use crate::scenario::Scenario;
use serde::Serialize;
use std::fmt::Write;
use xpreempt_core::sched::Hooks;
use xpreempt_core::{Nanos, Priority};

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
    /// seed's 延迟比: training ~80 ms / inference ~25 ms ≈ 3.2×); none when either tier
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
    /// Mean over the task's requests, arrival to last kernel completed; none when no request
    /// completed.
    pub latency_us: Option<f64>,
    pub max_latency_us: Option<f64>,
    /// The same requests with the task alone on the GPU (none when that run completed none).
    pub standalone_us: Option<f64>,
    /// Requests completed.
    pub requests: usize,
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

fn us(ns: Nanos) -> f64 {
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
        let want = spec.arrival.count as usize;
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
    let mut standalone_problems = Vec::new();
    for i in 0..scenario.tasks.len() {
        let only = scenario.only(i);
        let alone = runner::run(&only, Mode::None, RunOptions::default())?;
        standalone.push(mean(&alone.tasks[0].latencies));
        standalone_problems.extend(run_problems(&alone, &only));
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
        .map(|r| mode_report(r, scenario, &standalone))
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

fn mode_report(run: &ModeRun, scenario: &Scenario, standalone: &[Option<f64>]) -> ModeReport {
    let tasks: Vec<TaskReport> = run
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| TaskReport {
            name: t.name.clone(),
            priority: t.priority,
            latency_us: mean(&t.latencies),
            max_latency_us: t.latencies.iter().copied().max().map(us),
            standalone_us: standalone.get(i).copied().flatten(),
            requests: t.latencies.len(),
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
    }
}

/// Scheme A's monitor statistics (the seed's checks, inversions, preemptions, resumes).
pub fn monitor_lines(runs: &[ModeRun]) -> String {
    let mut s = String::new();
    for r in runs {
        if let Some((m, resume)) = &r.monitor {
            let p50 = (resume.count() > 0).then(|| us(resume.quantile(0.5)));
            let _ = writeln!(
                s,
                "{} monitor: {} checks, {} inversions, {} preemptions, {} resumes, resume latency p50 {}",
                r.mode,
                m.checks,
                m.inversions,
                m.preemptions,
                m.resumes,
                p50.map_or("-".to_string(), |v| format!("{v:.1} µs"))
            );
        }
    }
    s
}

/// The human-readable table.
pub fn table(report: &SimReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "scenario: {}", report.scenario);
    let _ = writeln!(
        s,
        "{:<9} {:<10} {:>5} {:>12} {:>12} {:>7} {:>7} {:>19} {:>8} {:>7} {:>12}",
        "mode",
        "task",
        "prio",
        "latency ms",
        "alone ms",
        "x alone",
        "ratio",
        "preempt p50/p99 µs",
        "preempts",
        "resumes",
        "exactly-once"
    );
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    for m in &report.modes {
        for (i, t) in m.tasks.iter().enumerate() {
            let first = i == 0;
            let slow = match (t.latency_us, t.standalone_us) {
                (Some(l), Some(a)) if a > 0.0 => format!("{:.2}", l / a),
                _ => "-".into(),
            };
            let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.3}", v / 1000.0));
            let mut line = String::new();
            let _ = write!(
                line,
                "{:<9} {:<10} {:>5} {:>12} {:>12} {:>7} {:>7} {:>19} {:>8} {:>7} {:>12}",
                if first { m.mode } else { "" },
                t.name,
                t.priority,
                ms(t.latency_us),
                ms(t.standalone_us),
                slow,
                if first {
                    m.latency_ratio.map_or("-".into(), |r| format!("{r:.2}x"))
                } else {
                    String::new()
                },
                if first {
                    format!(
                        "{}/{}",
                        opt(m.preempt_latency_us.p50),
                        opt(m.preempt_latency_us.p99)
                    )
                } else {
                    String::new()
                },
                if first {
                    m.preemptions.to_string()
                } else {
                    String::new()
                },
                if first {
                    m.resumes.to_string()
                } else {
                    String::new()
                },
                if first {
                    if m.exactly_once && m.problems.is_empty() {
                        "yes"
                    } else {
                        "NO"
                    }
                } else {
                    ""
                },
            );
            let _ = writeln!(s, "{}", line.trim_end());
        }
    }
    for m in &report.modes {
        for t in &m.tasks {
            if let Some(d) = t.detection_delay_us {
                let _ = writeln!(s, "{}: {} detection delay {:.1} µs", m.mode, t.name, d);
            }
        }
    }
    s + &problem_lines(report)
}

/// Most problems the table lists per run; the JSON has them all.
const SHOWN_PROBLEMS: usize = 5;

/// The problems under the table, a few per run, so that a failed mode is never just a "NO".
fn problem_lines(report: &SimReport) -> String {
    let mut s = String::new();
    let alone = ("alone", &report.standalone_problems);
    let modes = report.modes.iter().map(|m| (m.mode, &m.problems));
    for (run, problems) in std::iter::once(alone).chain(modes) {
        for p in problems.iter().take(SHOWN_PROBLEMS) {
            let _ = writeln!(s, "PROBLEM {run}: {p}");
        }
        if problems.len() > SHOWN_PROBLEMS {
            let more = problems.len() - SHOWN_PROBLEMS;
            let _ = writeln!(
                s,
                "PROBLEM {run}: ... and {more} more (all of them in --json)"
            );
        }
    }
    s
}
