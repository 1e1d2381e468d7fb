//! The human-readable side of the report: the comparison table, the per-mode summary and
//! latency tiers, and the problems of runs that cannot be trusted.

use super::{Distribution, SimReport, us};
use crate::runner::ModeRun;
use std::fmt::Write;

/// Scheme A's monitor statistics (checks, inversions, preemptions, resumes).
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
        "{:<9} {:<10} {:>5} {:>12} {:>12} {:>7} {:>7} {:>19} {:>8} {:>7} {:>12} {:>27}",
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
        "exactly-once",
        "p50/p90/p99/max ms"
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
                "{:<9} {:<10} {:>5} {:>12} {:>12} {:>7} {:>7} {:>19} {:>8} {:>7} {:>12} {:>27}",
                if first { m.mode } else { "" },
                t.name,
                match t.effective_priority {
                    Some(e) => format!("{}>{e}", t.priority),
                    None => t.priority.to_string(),
                },
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
                pct_ms(t.latency_pct_us.as_ref()),
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
    s + &summary_lines(report) + &tier_lines(report) + &problem_lines(report)
}

fn pct_ms(d: Option<&Distribution>) -> String {
    d.map_or("-".into(), |d| {
        format!(
            "{:.2}/{:.2}/{:.2}/{:.2}",
            d.p50 / 1e3,
            d.p90 / 1e3,
            d.p99 / 1e3,
            d.max / 1e3
        )
    })
}

/// One line per mode: how long, how much, how busy, and what the HWS did.
fn summary_lines(report: &SimReport) -> String {
    let mut s = format!(
        "{:<9} {:>12} {:>10} {:>9} {:>9} {:>6} {:>7} {:>9} {:>6} {:>12}\n",
        "mode",
        "makespan ms",
        "kernels/s",
        "GPU busy",
        "runlists",
        "maps",
        "unmaps",
        "rotations",
        "yields",
        "HQD wait ms"
    );
    for m in &report.modes {
        let _ = writeln!(
            s,
            "{:<9} {:>12.3} {:>10.1} {:>8.1}% {:>9} {:>6} {:>7} {:>9} {:>6} {:>12.3}",
            m.mode,
            m.makespan_us / 1e3,
            m.kernels_per_s,
            m.gpu_utilization * 100.0,
            m.runlists,
            m.maps,
            m.unmaps,
            m.rotations,
            m.yields,
            m.hqd_wait_us / 1e3
        );
    }
    s
}

/// Latency per priority tier, only where a tier has several tasks: with one task per tier the
/// task rows above already say it.
fn tier_lines(report: &SimReport) -> String {
    let mut s = String::new();
    for m in &report.modes {
        for t in m.tiers.iter().filter(|t| t.tasks > 1) {
            let _ = writeln!(
                s,
                "{:<9} prio {:>4}: {} tasks, {} requests, p50/p90/p99/max {} ms",
                m.mode,
                t.priority,
                t.tasks,
                t.requests,
                pct_ms(t.latency_pct_us.as_ref())
            );
        }
    }
    s
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
