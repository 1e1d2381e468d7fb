//! Scenarios: a GPU, the settings of Scheme A and Scheme B, and tasks (one queue each) that
//! submit batches of kernels at given arrival times. Written in TOML; every section but
//! `[[tasks]]` may be left out:
//!
//! ```toml
//! name = "example"
//! seed = 1
//! [gpu]                      # GpuConfig: cus, waves_per_cu, topology, cwsr, quantum_us, ...
//! cus = 80
//! [scheme_a]
//! check_interval_us = 5000.0
//! mode = "wavefront-save"    # or "drain", "reset"
//! [scheme_b]
//! policy = "hpf"
//! [[tasks]]
//! name = "infer"
//! priority = 12              # logical priority, larger runs first
//! process = 2
//! cu_range = [0, 40]         # optional CU mask: first CU, count
//! kernels = 50               # kernels per request
//! kernel = { workgroups = 640, wg_threads = 256, wg_us = 380.0, jitter = 0.1, idempotent = false }
//! arrival = { at_us = 16200.0, count = 1, every_us = 0.0, poisson = false }
//! ```
//!
//! Two shorthands make larger scenarios short to write:
//!
//! - `count = 20` on a task makes 20 copies of it, named `infer-0` … `infer-19`, each its own
//!   queue with the same settings (a name that clashes with another task's is an error). With
//!   poisson arrivals each copy draws its own gaps; otherwise the copies arrive together.
//! - `arrival` takes explicit points instead of a series, `arrival = { times_us = [0, 100,
//!   150] }` (any order; `at_us`, `count`, `every_us` and `poisson` must then be left out), and
//!   either form takes bursts: `burst = 8` requests at every point, `burst_every_us` apart
//!   (default 0, all at once). `arrival = { at_us = 0, count = 5, every_us = 10000, burst = 8,
//!   burst_every_us = 50 }` is five bursts of eight requests, 10 ms apart.
//!
//! Every time (`*_us`) must be a finite number below 2^62 ns (about 4.6e15 µs): zero or more
//! for arrival times, `doorbell_us`, `runlist_us` and the `cwsr` costs, more than zero for
//! `wg_us`, `quantum_us`, `unmap_timeout_us` and `check_interval_us`. What one scenario may
//! ask of the simulator is bounded too; [`Scenario::validate`] refuses anything past these,
//! naming the field and the limit:
//!
//! - at most [`MAX_TASKS`] tasks (copies included), and `ring_size` a power of two in
//!   2..=65536;
//! - at most [`MAX_REQUESTS`] requests (`arrival.count` or the length of `times_us`, × `burst`,
//!   summed over tasks), [`MAX_COMMANDS`] kernels (requests × `kernels`) and
//!   [`MAX_TOTAL_WORKGROUPS`] workgroups (requests × `kernels × kernel.workgroups`);
//! - the longest run the scenario can make must end before 2^62 ns: the latest arrival
//!   (`at_us + (count - 1) × every_us`, with `every_us` × [`POISSON_MAX_GAP`] for poisson
//!   arrivals, or the latest of `times_us`; plus `(burst - 1) × burst_every_us`), plus [`WORK_SLACK`] × every workgroup's `wg_us` back to back, plus one HWS
//!   rotation per kernel, plus 1 s — the point where the runner gives up on outstanding work
//!   ([`Scenario::horizon_ns`]);
//! - Scheme A's monitor and the HWS quantum tick at most [`MAX_TICKS`] times over that run
//!   (`horizon / check_interval_us`, `horizon / quantum_us`).

use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_amd::DestroyMode;
use xpreempt_amd::config::{GpuConfig, MAX_TIME_NS, time_us_ok, time_us_requirement, us};
use xpreempt_amd::rng::SplitMix;
use xpreempt_core::{Nanos, Priority, ProcessId};

mod arrival;
pub use arrival::Arrival;

/// The train-vs-infer timeline (inference preempting training); `xpreempt sim` runs it when given no file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../../scenarios/train-vs-infer.toml");

/// Most tasks (queues) in one scenario.
pub const MAX_TASKS: usize = 1024;
/// Most requests in one scenario: each task's `arrival.requests()` summed.
pub const MAX_REQUESTS: u64 = 1_000_000;
/// Most kernels (commands) in one scenario: requests × `kernels`, summed over its tasks.
pub const MAX_COMMANDS: u64 = 10_000_000;
/// Most workgroups in one scenario, requests × `kernels × kernel.workgroups` summed over
/// its tasks: a few minutes per mode at the model's few million workgroups per second.
pub const MAX_TOTAL_WORKGROUPS: u64 = 1_000_000_000;
/// Most periodic checks (Scheme A's monitor, the HWS quantum) over the longest run.
pub const MAX_TICKS: u64 = 1_000_000_000;
/// A poisson gap is `-every_us × ln(1 - u)` with `u` in [0, 1) on a 2^-53 grid, so it is at
/// most `every_us × 53 ln 2` (36.74); validation bounds it with this factor.
pub const POISSON_MAX_GAP: f64 = 37.0;
/// The runner gives up on work still outstanding this long after it should have finished.
pub const RUN_SLACK_NS: Nanos = 1_000_000_000;
/// Serial work (every workgroup back to back on one slot) is already far more than a run
/// needs; the factor covers jitter and workgroups that RESET kills and runs again.
pub const WORK_SLACK: u128 = 2;

#[derive(Debug, Error)]
pub enum ScenarioError {
    /// Not a `source`: the message carries it, and an error reporter would print it twice.
    #[error("scenario is not valid TOML for this model: {0}")]
    Parse(toml::de::Error),
    #[error("scenario `{scenario}`: {reason}")]
    Invalid { scenario: String, reason: String },
    #[error("scenario `{scenario}`: {field} must be {requirement}, got {value:?}")]
    Time {
        scenario: String,
        field: String,
        requirement: &'static str,
        value: f64,
    },
    #[error("scenario `{scenario}`: {field} gives {value} {what}, more than the limit of {limit}")]
    TooMany {
        scenario: String,
        field: String,
        value: u128,
        what: &'static str,
        limit: u64,
    },
    #[error(
        "scenario `{scenario}`: {field} could reach {ns} ns of simulated time, past the limit of 2^62 ns ({limit} ns)"
    )]
    TooLong {
        scenario: String,
        field: String,
        ns: u128,
        limit: Nanos,
    },
}

impl From<toml::de::Error> for ScenarioError {
    fn from(e: toml::de::Error) -> Self {
        Self::Parse(e)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub gpu: GpuConfig,
    #[serde(default)]
    pub scheme_a: SchemeAConfig,
    #[serde(default)]
    pub scheme_b: SchemeBConfig,
    pub tasks: Vec<Task>,
}

fn default_seed() -> u64 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchemeAConfig {
    pub check_interval_us: f64,
    pub mode: DestroyMode,
}

impl Default for SchemeAConfig {
    fn default() -> Self {
        Self {
            check_interval_us: 5_000.0,
            mode: DestroyMode::WavefrontSave,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchemeBConfig {
    pub policy: String,
    /// Progressive launching window of `lv1` (commands in flight, sync every `batch`).
    pub lv1_threshold: u32,
    pub lv1_batch: u32,
    /// The window of `lv2`/`lv3`, which stop in-flight work in hardware.
    pub threshold: u32,
    pub batch: u32,
}

impl Default for SchemeBConfig {
    fn default() -> Self {
        Self {
            policy: "hpf".into(),
            lv1_threshold: 1,
            lv1_batch: 1,
            threshold: 64,
            batch: 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub name: String,
    pub priority: Priority,
    #[serde(default = "default_process")]
    pub process: ProcessId,
    #[serde(default = "default_ring")]
    pub ring_size: u32,
    /// `[first, count]`: the CUs this queue may use (spatial partitioning); all when absent.
    #[serde(default)]
    pub cu_range: Option<[u32; 2]>,
    /// Kernels per request.
    pub kernels: u32,
    pub kernel: KernelSpec,
    #[serde(default)]
    pub arrival: Arrival,
    /// Copies of this task, each its own queue; [`Scenario::parse`] expands them, so a parsed
    /// scenario has 1 everywhere.
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

fn default_process() -> ProcessId {
    1
}

fn default_ring() -> u32 {
    256
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    pub workgroups: u32,
    #[serde(default = "default_threads")]
    pub wg_threads: u16,
    pub wg_us: f64,
    #[serde(default)]
    pub jitter: f64,
    #[serde(default)]
    pub idempotent: bool,
}

fn default_threads() -> u16 {
    256
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let mut s: Scenario = toml::from_str(text)?;
        s.gpu.seed = s.seed;
        s.expand_copies()?;
        s.validate()?;
        Ok(s)
    }

    pub fn default_scenario() -> Result<Self, ScenarioError> {
        Self::parse(DEFAULT_SCENARIO)
    }

    /// Replaces every task of `count = n` by its n copies `name-0` … `name-{n-1}`. The total
    /// is checked first: a count of four billion must not allocate four billion tasks.
    pub fn expand_copies(&mut self) -> Result<(), ScenarioError> {
        if let Some(t) = self.tasks.iter().find(|t| t.count == 0) {
            return Err(self.invalid(format!("task `{}`: count must be at least 1", t.name)));
        }
        let total: u128 = self.tasks.iter().map(|t| u128::from(t.count)).sum();
        self.at_most(
            "tasks (count summed over tasks)",
            total,
            "tasks",
            MAX_TASKS as u64,
        )?;
        let mut tasks = Vec::with_capacity(total as usize);
        for t in std::mem::take(&mut self.tasks) {
            if t.count == 1 {
                tasks.push(t);
                continue;
            }
            for i in 0..t.count {
                tasks.push(Task {
                    name: format!("{}-{i}", t.name),
                    count: 1,
                    ..t.clone()
                });
            }
        }
        self.tasks = tasks;
        Ok(())
    }

    fn invalid(&self, reason: String) -> ScenarioError {
        ScenarioError::Invalid {
            scenario: self.name.clone(),
            reason,
        }
    }

    fn time(&self, field: String, value: f64, zero_ok: bool) -> Result<(), ScenarioError> {
        if time_us_ok(value, zero_ok) {
            return Ok(());
        }
        Err(ScenarioError::Time {
            scenario: self.name.clone(),
            field,
            requirement: time_us_requirement(zero_ok),
            value,
        })
    }

    fn at_most(
        &self,
        field: &str,
        value: u128,
        what: &'static str,
        limit: u64,
    ) -> Result<(), ScenarioError> {
        if value <= u128::from(limit) {
            return Ok(());
        }
        Err(ScenarioError::TooMany {
            scenario: self.name.clone(),
            field: field.to_string(),
            value,
            what,
            limit,
        })
    }

    fn before_the_limit(&self, field: String, ns: u128) -> Result<(), ScenarioError> {
        if ns < u128::from(MAX_TIME_NS) {
            return Ok(());
        }
        Err(ScenarioError::TooLong {
            scenario: self.name.clone(),
            field,
            ns,
            limit: MAX_TIME_NS,
        })
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        for (name, v, zero_ok) in self.gpu.times_us() {
            self.time(format!("gpu.{name}"), v, zero_ok)?;
        }
        self.gpu
            .validate()
            .map_err(|r| self.invalid(format!("gpu: {r}")))?;
        if self.tasks.is_empty() {
            return Err(self.invalid("no tasks".into()));
        }
        self.at_most("tasks", self.tasks.len() as u128, "tasks", MAX_TASKS as u64)?;
        self.time(
            "scheme_a.check_interval_us".into(),
            self.scheme_a.check_interval_us,
            false,
        )?;
        let b = &self.scheme_b;
        for (what, t, n) in [
            ("lv1", b.lv1_threshold, b.lv1_batch),
            ("lv2/lv3", b.threshold, b.batch),
        ] {
            xpreempt_core::QueueConfig::new(t, n, xpreempt_core::Level::Lv1)
                .map_err(|e| self.invalid(format!("scheme_b {what} window: {e}")))?;
        }
        xpreempt_core::policy::by_name(&b.policy)
            .map_err(|e| self.invalid(format!("scheme_b.policy: {e}")))?;
        for (i, t) in self.tasks.iter().enumerate() {
            let bad = |r: &str| self.invalid(format!("task `{}`: {r}", t.name));
            let field = |f: &str| format!("task `{}` {f}", t.name);
            if self.tasks[..i].iter().any(|o| o.name == t.name) {
                return Err(bad("name used twice"));
            }
            if t.kernels == 0 || t.kernel.workgroups == 0 || t.kernel.wg_threads == 0 {
                return Err(bad("kernels, workgroups and wg_threads must be at least 1"));
            }
            if u64::from(t.kernel.workgroups) > xpreempt_amd::aql::MAX_WORKGROUPS
                || u64::from(t.kernel.workgroups) * u64::from(t.kernel.wg_threads)
                    > u64::from(u32::MAX)
            {
                return Err(bad(&format!(
                    "a kernel's grid is larger than one AQL dispatch can describe \
                     (kernel.workgroups at most {}, × kernel.wg_threads at most {})",
                    xpreempt_amd::aql::MAX_WORKGROUPS,
                    u32::MAX
                )));
            }
            self.time(field("kernel.wg_us"), t.kernel.wg_us, false)?;
            if !(0.0..1.0).contains(&t.kernel.jitter) {
                return Err(bad(&format!(
                    "kernel.jitter must be in [0, 1), got {}",
                    t.kernel.jitter
                )));
            }
            if u32::from(t.kernel.wg_threads).div_ceil(64) > self.gpu.waves_per_cu {
                return Err(bad("a workgroup has more waves than a CU has slots"));
            }
            if t.count != 1 {
                return Err(bad(
                    "count is not expanded into copies (Scenario::expand_copies)",
                ));
            }
            self.check_arrival(t)?;
            if let Some([first, count]) = t.cu_range
                && (count == 0 || first.saturating_add(count) > self.gpu.cus)
            {
                return Err(bad("cu_range must select CUs that exist"));
            }
            if !t.ring_size.is_power_of_two() || !(2..=65536).contains(&t.ring_size) {
                return Err(bad(&format!(
                    "ring_size must be a power of two in 2..=65536, got {}",
                    t.ring_size
                )));
            }
        }
        let sum = |f: &dyn Fn(&Task) -> u128| self.tasks.iter().map(f).sum::<u128>();
        let requests = sum(&|t| u128::from(t.arrival.requests()));
        self.at_most(
            "arrival.count summed over tasks",
            requests,
            "requests",
            MAX_REQUESTS,
        )?;
        let commands = sum(&|t| u128::from(t.arrival.requests()) * u128::from(t.kernels));
        self.at_most(
            "arrival.count × kernels summed over tasks",
            commands,
            "kernels",
            MAX_COMMANDS,
        )?;
        let workgroups = sum(&|t| {
            u128::from(t.arrival.requests())
                * u128::from(t.kernels)
                * u128::from(t.kernel.workgroups)
        });
        self.at_most(
            "arrival.count × kernels × kernel.workgroups summed over tasks",
            workgroups,
            "workgroups",
            MAX_TOTAL_WORKGROUPS,
        )?;
        let horizon = self.horizon_ns();
        self.before_the_limit(
            "the longest run (latest arrival + 2 × every workgroup's wg_us back to back + one HWS \
             rotation per kernel + 1 s)"
                .into(),
            horizon,
        )?;
        for (field, interval_us) in [
            (
                "scheme_a.check_interval_us",
                self.scheme_a.check_interval_us,
            ),
            ("gpu.quantum_us", self.gpu.quantum_us),
        ] {
            let ticks = horizon / u128::from(us(interval_us).max(1));
            self.at_most(
                field,
                ticks,
                "periodic ticks over the longest run",
                MAX_TICKS,
            )?;
        }
        Ok(())
    }

    /// The longest run this scenario can make, in ns: the latest possible arrival, plus
    /// [`WORK_SLACK`] × every workgroup's time back to back, plus one full HWS rotation per
    /// kernel, plus [`RUN_SLACK_NS`]. The runner gives up there; validation keeps it below
    /// 2^62 ns.
    ///
    /// The rotation term is what oversubscription can cost: a queue that goes idle between
    /// kernels (lv1 launches one at a time) may lose its HQD and wait for every other queue to
    /// get a quantum before it is mapped again — `ceil(queues / HQD slots)` quanta, each with a
    /// runlist, a doorbell and the longest CWSR save. With 1000 queues or a 100 ms quantum that
    /// is seconds, far past a fixed slack.
    pub fn horizon_ns(&self) -> u128 {
        let last = self
            .tasks
            .iter()
            .map(|t| t.arrival.last_bound().0)
            .max()
            .unwrap_or(0);
        let serial: u128 = self
            .tasks
            .iter()
            .map(|t| {
                u128::from(t.arrival.requests())
                    .saturating_mul(u128::from(t.kernels))
                    .saturating_mul(u128::from(t.kernel.workgroups))
                    .saturating_mul(u128::from(us(t.kernel.wg_us)))
            })
            .fold(0, u128::saturating_add);
        let commands: u128 = self
            .tasks
            .iter()
            .map(|t| u128::from(t.arrival.requests()).saturating_mul(u128::from(t.kernels)))
            .fold(0, u128::saturating_add);
        last.saturating_add(serial.saturating_mul(WORK_SLACK))
            .saturating_add(commands.saturating_mul(self.rotation_ns()))
            .saturating_add(u128::from(RUN_SLACK_NS))
    }

    /// The longest an idle queue can wait to be mapped again: every queue ahead of it gets one
    /// quantum, `ceil(queues / HQD slots)` of them, each with its map and unmap costs.
    pub fn rotation_ns(&self) -> u128 {
        let slots = self.gpu.topology.user_slots().max(1) as usize;
        let rounds = self.tasks.len().div_ceil(slots).max(1) as u128;
        let g = &self.gpu;
        let per_round = [g.quantum_us, g.runlist_us, g.doorbell_us, g.cwsr.max_us]
            .into_iter()
            .map(|t| u128::from(us(t)))
            .sum::<u128>();
        rounds.saturating_mul(per_round)
    }

    /// Every request's arrival time, as (time, task index), in time order (ties by task).
    pub fn arrivals(&self) -> Vec<(Nanos, usize)> {
        let mut rng = SplitMix::new(self.seed ^ 0xa11e_0000);
        let mut out = Vec::new();
        for (i, t) in self.tasks.iter().enumerate() {
            t.arrival.push_times(i, &mut rng, &mut out);
        }
        out.sort_by_key(|&(t, i)| (t, i));
        out
    }

    /// The same scenario with only one task (its standalone run).
    pub fn only(&self, task: usize) -> Self {
        let mut s = self.clone();
        s.tasks = vec![self.tasks[task].clone()];
        s
    }

    pub fn total_workgroups(&self) -> u64 {
        self.tasks
            .iter()
            .map(|t| {
                t.arrival
                    .requests()
                    .saturating_mul(u64::from(t.kernels))
                    .saturating_mul(u64::from(t.kernel.workgroups))
            })
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_parses() {
        let s = Scenario::default_scenario().unwrap();
        assert_eq!(s.name, "train-vs-infer");
        assert_eq!(s.tasks.len(), 2);
        assert!(s.arrivals().windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn bad_scenarios_say_what_is_wrong() {
        let err = Scenario::parse("name = \"x\"\ntasks = []\n").unwrap_err();
        assert!(err.to_string().contains("no tasks"), "{err}");
        let err = Scenario::parse("name = \"x\"\nbogus = 1\ntasks = []\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let text = "name = \"x\"\n[[tasks]]\nname = \"a\"\npriority = 1\nkernels = 1\nkernel = { workgroups = 1, wg_us = -1.0 }\n";
        let err = Scenario::parse(text).unwrap_err();
        assert!(err.to_string().contains("wg_us"), "{err}");
    }
}
