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

use crate::config::{GpuConfig, us};
use crate::cwsr::DestroyMode;
use crate::rng::SplitMix;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_core::{Nanos, Priority, ProcessId};

/// The seed's train-vs-infer timeline; `xpreempt sim` runs it when given no file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../../scenarios/train-vs-infer.toml");

#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("scenario is not valid TOML for this model: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("scenario `{scenario}`: {reason}")]
    Invalid { scenario: String, reason: String },
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

/// When a task's requests arrive: `count` requests from `at_us`, `every_us` apart (the mean
/// gap of exponential inter-arrival times when `poisson`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Arrival {
    pub at_us: f64,
    pub count: u32,
    pub every_us: f64,
    pub poisson: bool,
}

impl Default for Arrival {
    fn default() -> Self {
        Self {
            at_us: 0.0,
            count: 1,
            every_us: 0.0,
            poisson: false,
        }
    }
}

impl Scenario {
    pub fn parse(text: &str) -> Result<Self, ScenarioError> {
        let mut s: Scenario = toml::from_str(text)?;
        s.gpu.seed = s.seed;
        s.validate()?;
        Ok(s)
    }

    pub fn default_scenario() -> Result<Self, ScenarioError> {
        Self::parse(DEFAULT_SCENARIO)
    }

    fn invalid(&self, reason: String) -> ScenarioError {
        ScenarioError::Invalid {
            scenario: self.name.clone(),
            reason,
        }
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.gpu
            .validate()
            .map_err(|r| self.invalid(format!("gpu: {r}")))?;
        if self.tasks.is_empty() {
            return Err(self.invalid("no tasks".into()));
        }
        if !(self.scheme_a.check_interval_us.is_finite() && self.scheme_a.check_interval_us > 0.0) {
            return Err(self.invalid("scheme_a.check_interval_us must be positive".into()));
        }
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
            if self.tasks[..i].iter().any(|o| o.name == t.name) {
                return Err(bad("name used twice"));
            }
            if t.kernels == 0 || t.kernel.workgroups == 0 || t.kernel.wg_threads == 0 {
                return Err(bad("kernels, workgroups and wg_threads must be at least 1"));
            }
            if u64::from(t.kernel.workgroups) > crate::aql::MAX_WORKGROUPS
                || u64::from(t.kernel.workgroups) * u64::from(t.kernel.wg_threads)
                    > u64::from(u32::MAX)
            {
                return Err(bad(
                    "a kernel's grid is larger than one AQL dispatch can describe",
                ));
            }
            if !(t.kernel.wg_us.is_finite() && t.kernel.wg_us > 0.0) {
                return Err(bad("wg_us must be positive"));
            }
            if !(0.0..1.0).contains(&t.kernel.jitter) {
                return Err(bad("jitter must be in [0, 1)"));
            }
            if u32::from(t.kernel.wg_threads).div_ceil(64) > self.gpu.waves_per_cu {
                return Err(bad("a workgroup has more waves than a CU has slots"));
            }
            if t.arrival.count == 0 || !(t.arrival.at_us >= 0.0 && t.arrival.every_us >= 0.0) {
                return Err(bad("arrival needs count >= 1 and non-negative times"));
            }
            if let Some([first, count]) = t.cu_range
                && (count == 0 || first.saturating_add(count) > self.gpu.cus)
            {
                return Err(bad("cu_range must select CUs that exist"));
            }
            if !t.ring_size.is_power_of_two() || t.ring_size < 2 {
                return Err(bad("ring_size must be a power of two"));
            }
        }
        Ok(())
    }

    /// Every request's arrival time, as (time, task index), in time order (ties by task).
    pub fn arrivals(&self) -> Vec<(Nanos, usize)> {
        let mut rng = SplitMix::new(self.seed ^ 0xa11e_0000);
        let mut out = Vec::new();
        for (i, t) in self.tasks.iter().enumerate() {
            let mut at = us(t.arrival.at_us);
            for _ in 0..t.arrival.count {
                out.push((at, i));
                let gap = if t.arrival.poisson {
                    let u = rng.next_unit();
                    -t.arrival.every_us * (1.0 - u).ln()
                } else {
                    t.arrival.every_us
                };
                at += us(gap);
            }
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
                u64::from(t.arrival.count) * u64::from(t.kernels) * u64::from(t.kernel.workgroups)
            })
            .sum()
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
