//! `--seeds N`: the same scenario under N consecutive seeds, so that a conclusion does not rest
//! on one draw of jitter and arrivals. Reports the spread of what decides a comparison: the
//! top tier's p99 over its standalone p99, and the makespan.

use crate::report::{SimOptions, SimReport, simulate};
use crate::runner::{Mode, RunError};
use crate::scenario::Scenario;
use serde::Serialize;
use std::fmt::Write;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepReport {
    pub scenario: String,
    pub seeds: Vec<u64>,
    pub modes: Vec<ModeSweep>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeSweep {
    pub mode: &'static str,
    /// The highest priority's p99 over its standalone p99, over the seeds that gave one.
    pub top_p99_vs_alone: Option<Spread>,
    pub makespan_us: Option<Spread>,
    pub per_seed: Vec<SeedResult>,
    /// Seeds whose run (or standalone runs) failed their checks.
    pub failed_seeds: Vec<u64>,
    /// Problems of any seed, prefixed with it: the spread of a run that failed means nothing.
    pub problems: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub top_p99_vs_alone: Option<f64>,
    pub makespan_us: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Self {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

impl SweepReport {
    pub fn failures(&self) -> Vec<String> {
        self.modes
            .iter()
            .flat_map(|m| m.problems.iter().map(move |p| format!("{}: {p}", m.mode)))
            .collect()
    }
}

/// Runs `modes` for seeds `first..first + count` (wrapping), each with its own standalone runs.
pub fn sweep(
    scenario: &Scenario,
    modes: &[Mode],
    first: u64,
    count: u64,
    opts: &SimOptions,
) -> Result<SweepReport, RunError> {
    let seeds: Vec<u64> = (0..count).map(|i| first.wrapping_add(i)).collect();
    let mut reports: Vec<(u64, SimReport)> = Vec::new();
    for &seed in &seeds {
        let mut s = scenario.clone();
        s.seed = seed;
        s.gpu.seed = seed;
        reports.push((seed, simulate(&s, modes, opts)?.0));
    }
    let modes = modes
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            let mut problems = Vec::new();
            let mut failed_seeds = Vec::new();
            let per_seed: Vec<SeedResult> = reports
                .iter()
                .map(|(seed, r)| {
                    let m = &r.modes[i];
                    let alone = r.standalone_problems.iter().map(|p| format!("alone: {p}"));
                    let before = problems.len();
                    for p in alone.chain(m.problems.iter().cloned()) {
                        problems.push(format!("seed {seed}: {p}"));
                    }
                    if problems.len() > before {
                        failed_seeds.push(*seed);
                    }
                    SeedResult {
                        seed: *seed,
                        top_p99_vs_alone: m.tiers.first().and_then(|t| t.p99_vs_alone),
                        makespan_us: m.makespan_us,
                    }
                })
                .collect();
            ModeSweep {
                mode: mode.name(),
                top_p99_vs_alone: Spread::of(per_seed.iter().filter_map(|r| r.top_p99_vs_alone)),
                makespan_us: Spread::of(per_seed.iter().map(|r| r.makespan_us)),
                per_seed,
                failed_seeds,
                problems,
            }
        })
        .collect();
    Ok(SweepReport {
        scenario: scenario.name.clone(),
        seeds,
        modes,
    })
}

/// The sweep for people: one line per mode.
pub fn table(r: &SweepReport) -> String {
    let (first, last) = (r.seeds.first(), r.seeds.last());
    let mut s = format!(
        "scenario: {} over {} seeds ({}..={})\n",
        r.scenario,
        r.seeds.len(),
        first.map_or(String::new(), u64::to_string),
        last.map_or(String::new(), u64::to_string)
    );
    let _ = writeln!(
        s,
        "{:<9} {:>28} {:>30} {:>8}",
        "mode", "top p99 / alone min/med/max", "makespan ms min/med/max", "failed"
    );
    let spread = |v: Option<Spread>, scale: f64, digits: usize| {
        v.map_or("-".to_string(), |v| {
            format!(
                "{:.digits$}/{:.digits$}/{:.digits$}",
                v.min / scale,
                v.median / scale,
                v.max / scale
            )
        })
    };
    for m in &r.modes {
        let failed = m.failed_seeds.len();
        let _ = writeln!(
            s,
            "{:<9} {:>28} {:>30} {:>8}",
            m.mode,
            spread(m.top_p99_vs_alone, 1.0, 3),
            spread(m.makespan_us, 1e3, 3),
            failed
        );
    }
    for p in r.failures().iter().take(10) {
        let _ = writeln!(s, "PROBLEM {p}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        assert_eq!(Spread::of([4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of([]), None);
    }
}
