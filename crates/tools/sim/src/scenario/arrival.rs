//! When a task's requests arrive: a regular or poisson series, an explicit list of times, and
//! bursts of several requests at each of those points (see the format at the top of
//! [`super`]).

use super::{POISSON_MAX_GAP, Scenario, ScenarioError, Task};
use serde::{Deserialize, Serialize};
use xpreempt_amd::config::us;
use xpreempt_amd::rng::SplitMix;
use xpreempt_core::Nanos;

/// `count` arrival points from `at_us`, `every_us` apart (the mean gap of exponential
/// inter-arrival times when `poisson`), or the points `times_us` lists; `burst` requests at
/// each point, `burst_every_us` apart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Arrival {
    pub at_us: f64,
    pub count: u32,
    pub every_us: f64,
    pub poisson: bool,
    /// Explicit arrival points (µs, any order); replaces `at_us`, `count`, `every_us` and
    /// `poisson`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub times_us: Option<Vec<f64>>,
    /// Requests per arrival point.
    pub burst: u32,
    /// The gap between the requests of one burst.
    pub burst_every_us: f64,
}

impl Default for Arrival {
    fn default() -> Self {
        Self {
            at_us: 0.0,
            count: 1,
            every_us: 0.0,
            poisson: false,
            times_us: None,
            burst: 1,
            burst_every_us: 0.0,
        }
    }
}

impl Arrival {
    /// Arrival points: the length of `times_us`, or `count`.
    pub fn points(&self) -> u64 {
        match &self.times_us {
            Some(t) => t.len() as u64,
            None => u64::from(self.count),
        }
    }

    /// Requests this task makes: `burst` per arrival point.
    pub fn requests(&self) -> u64 {
        self.points().saturating_mul(u64::from(self.burst))
    }

    /// Pushes every request's arrival time, tagged with `task`. A poisson series draws its gaps
    /// from `rng`, one after every point (the last one too, so that adding a burst or a list
    /// elsewhere leaves the other tasks' draws as they were).
    pub(super) fn push_times(
        &self,
        task: usize,
        rng: &mut SplitMix,
        out: &mut Vec<(Nanos, usize)>,
    ) {
        let burst = |at: Nanos, out: &mut Vec<(Nanos, usize)>| {
            let gap = us(self.burst_every_us);
            for j in 0..u64::from(self.burst) {
                out.push((at.saturating_add(gap.saturating_mul(j)), task));
            }
        };
        if let Some(times) = &self.times_us {
            for &t in times {
                burst(us(t), out);
            }
            return;
        }
        let mut at = us(self.at_us);
        for _ in 0..self.count {
            burst(at, out);
            let gap = if self.poisson {
                let u = rng.next_unit();
                -self.every_us * (1.0 - u).ln()
            } else {
                self.every_us
            };
            at = at.saturating_add(us(gap));
        }
    }

    /// The latest a request can arrive, in ns, and how that is computed (for the error).
    pub(super) fn last_bound(&self) -> (u128, &'static str) {
        let bursts = u128::from(self.burst.saturating_sub(1)) * u128::from(us(self.burst_every_us));
        if let Some(times) = &self.times_us {
            let latest = times.iter().map(|&t| us(t)).max().unwrap_or(0);
            return (
                u128::from(latest) + bursts,
                "arrival (the latest of times_us + (burst - 1) × burst_every_us)",
            );
        }
        let (gap, how) = match (self.poisson, self.burst > 1) {
            (true, false) => (
                us(self.every_us * POISSON_MAX_GAP),
                "arrival (at_us + (count - 1) × every_us × 37, the longest poisson gaps)",
            ),
            (true, true) => (
                us(self.every_us * POISSON_MAX_GAP),
                "arrival (at_us + (count - 1) × every_us × 37, the longest poisson gaps, \
                 + (burst - 1) × burst_every_us)",
            ),
            (false, false) => (
                us(self.every_us),
                "arrival (at_us + (count - 1) × every_us)",
            ),
            (false, true) => (
                us(self.every_us),
                "arrival (at_us + (count - 1) × every_us + (burst - 1) × burst_every_us)",
            ),
        };
        let n = u128::from(self.count.saturating_sub(1));
        (
            u128::from(us(self.at_us)) + n * u128::from(gap) + bursts,
            how,
        )
    }
}

impl Scenario {
    /// A task's arrival fields: times, counts, and the latest arrival before the clock's limit.
    pub(super) fn check_arrival(&self, t: &Task) -> Result<(), ScenarioError> {
        let a = &t.arrival;
        let bad = |r: &str| self.invalid(format!("task `{}`: {r}", t.name));
        let field = |f: &str| format!("task `{}` arrival.{f}", t.name);
        match &a.times_us {
            Some(times) => {
                if times.is_empty() {
                    return Err(bad("arrival.times_us needs at least one time"));
                }
                // Only the burst fields may sit beside the list.
                let series = Arrival::default();
                if (a.at_us, a.count, a.every_us, a.poisson)
                    != (series.at_us, series.count, series.every_us, series.poisson)
                {
                    return Err(bad(
                        "arrival.times_us lists the arrival points itself: leave out at_us, \
                         count, every_us and poisson",
                    ));
                }
                for (i, &v) in times.iter().enumerate() {
                    self.time(field(&format!("times_us[{i}]")), v, true)?;
                }
            }
            None => {
                if a.count == 0 {
                    return Err(bad("arrival needs count >= 1"));
                }
                self.time(field("at_us"), a.at_us, true)?;
                self.time(field("every_us"), a.every_us, true)?;
            }
        }
        if a.burst == 0 {
            return Err(bad("arrival.burst must be at least 1"));
        }
        self.time(field("burst_every_us"), a.burst_every_us, true)?;
        let (last, how) = a.last_bound();
        self.before_the_limit(format!("task `{}` {how}", t.name), last)
    }
}
