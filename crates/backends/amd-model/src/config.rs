//! The model's parameters. Defaults follow the seeds: an MI308X-like part (80 CUs, gfx942
//! MEC/pipe/queue shape), HWS map latency ~20 µs, doorbell-to-CP ~1 µs,
//! CWSR 1–10 µs, KFD's 9 s `queue_preemption_timeout_ms`.

use crate::cpsch::{CpschError, PipePolicy, Topology};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_types::Nanos;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    pub cus: u32,
    /// Wavefront slots per CU (what a workgroup's waves occupy while it runs).
    pub waves_per_cu: u32,
    /// CUs are drawn as this many groups in the trace.
    pub cu_groups: u32,
    pub topology: Topology,
    pub pipe_policy: PipePolicy,
    /// When every HQD slot is taken, further queues wait for one and the HWS time-multiplexes
    /// (true), or creating them fails with EBUSY (false).
    pub oversubscription: bool,
    pub quantum_us: f64,
    pub doorbell_us: f64,
    /// HWS processing of one runlist (map) batch.
    pub runlist_us: f64,
    pub unmap_timeout_us: f64,
    pub cwsr: CwsrCost,
    pub seed: u64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            cus: 80,
            waves_per_cu: 32,
            cu_groups: 8,
            topology: Topology::default(),
            pipe_policy: PipePolicy::Horizontal,
            oversubscription: true,
            quantum_us: 1_000.0,
            doorbell_us: 1.0,
            runlist_us: 20.0,
            unmap_timeout_us: 9_000_000.0,
            cwsr: CwsrCost::default(),
            seed: 1,
        }
    }
}

/// What saving and restoring wave state costs. CUs save in parallel, so the time grows with the
/// waves on the busiest CU; the result is clamped to [min, max].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CwsrCost {
    pub base_us: f64,
    pub per_wave_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Killing waves for a RESET preemption.
    pub reset_us: f64,
}

impl Default for CwsrCost {
    fn default() -> Self {
        Self {
            base_us: 1.0,
            per_wave_us: 0.28,
            min_us: 1.0,
            max_us: 10.0,
            reset_us: 1.0,
        }
    }
}

/// Most wave slots per CU (real parts have 32 to 40): bounds how many workgroups run at once.
pub const MAX_WAVES_PER_CU: u32 = 1024;

/// The model's clock never reaches this: every time a scenario or [`GpuConfig`] gives, and the
/// end of the longest run a scenario can make, must stay below 2^62 ns (about 146 years), so
/// that adding one more delay to any simulated time can never overflow a [`Nanos`].
pub const MAX_TIME_NS: Nanos = 1 << 62;

/// A time in µs the model accepts: finite, below [`MAX_TIME_NS`], and positive (or, when
/// `zero_ok`, non-negative).
pub fn time_us_ok(v: f64, zero_ok: bool) -> bool {
    v.is_finite() && (v > 0.0 || (zero_ok && v >= 0.0)) && v * 1_000.0 < MAX_TIME_NS as f64
}

/// Why a time in µs is refused, for error messages.
pub fn time_us_requirement(zero_ok: bool) -> &'static str {
    if zero_ok {
        "a finite, non-negative number of µs below 2^62 ns (4.6e15 µs)"
    } else {
        "a finite, positive number of µs below 2^62 ns (4.6e15 µs)"
    }
}

/// Converts µs to ns. Non-finite and negative values give 0 and values past the range of
/// [`Nanos`] saturate; validation refuses both before they get here.
pub fn us(v: f64) -> Nanos {
    if v.is_finite() && v > 0.0 {
        (v * 1_000.0).round() as Nanos
    } else {
        0
    }
}

impl CwsrCost {
    pub fn save_ns(&self, busiest_cu_waves: u32) -> Nanos {
        let raw = self.base_us + self.per_wave_us * f64::from(busiest_cu_waves);
        us(raw.clamp(self.min_us, self.max_us.max(self.min_us)))
    }
}

/// A GPU configuration the model cannot be built from.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    #[error("{field} must be 1..={max}, got {got}")]
    Count {
        field: &'static str,
        max: u32,
        got: u32,
    },
    #[error("cu_groups must be 1..=cus ({cus}), got {got}")]
    CuGroups { cus: u32, got: u32 },
    #[error("every XCC needs CUs of its own: {cus} CUs for the {xccs} XCCs of xcc_mask")]
    CusPerXcc { cus: u32, xccs: u32 },
    #[error("{field} must be {}, got {value}", time_us_requirement(*zero_ok))]
    Time {
        field: &'static str,
        value: f64,
        zero_ok: bool,
    },
    #[error(transparent)]
    Topology(#[from] CpschError),
}

impl GpuConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let count = |field, got: u32, max: u32| {
            if got == 0 || got > max {
                Err(ConfigError::Count { field, max, got })
            } else {
                Ok(())
            }
        };
        count("cus", self.cus, 4096)?;
        count("waves_per_cu", self.waves_per_cu, MAX_WAVES_PER_CU)?;
        if self.cu_groups == 0 || self.cu_groups > self.cus {
            return Err(ConfigError::CuGroups {
                cus: self.cus,
                got: self.cu_groups,
            });
        }
        if self.cus < self.topology.xccs() {
            return Err(ConfigError::CusPerXcc {
                cus: self.cus,
                xccs: self.topology.xccs(),
            });
        }
        for (field, value, zero_ok) in self.times_us() {
            if !time_us_ok(value, zero_ok) {
                return Err(ConfigError::Time {
                    field,
                    value,
                    zero_ok,
                });
            }
        }
        Ok(self.topology.validate()?)
    }

    /// Every time setting: (field, value in µs, whether 0 is allowed).
    pub fn times_us(&self) -> [(&'static str, f64, bool); 9] {
        [
            ("quantum_us", self.quantum_us, false),
            ("unmap_timeout_us", self.unmap_timeout_us, false),
            ("doorbell_us", self.doorbell_us, true),
            ("runlist_us", self.runlist_us, true),
            ("cwsr.base_us", self.cwsr.base_us, true),
            ("cwsr.per_wave_us", self.cwsr.per_wave_us, true),
            ("cwsr.min_us", self.cwsr.min_us, true),
            ("cwsr.max_us", self.cwsr.max_us, true),
            ("cwsr.reset_us", self.cwsr.reset_us, true),
        ]
    }
}

/// A loaded code object: what a dispatch's `kernel_object` points at.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelCode {
    pub name: String,
    /// Mean workgroup run time and its relative spread (uniform ±jitter).
    pub wg_ns: Nanos,
    pub jitter: f64,
    /// Running it twice gives the same result, so RESET may kill and redo it.
    pub idempotent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwsr_cost_grows_with_state_and_stays_in_the_default_band() {
        let c = CwsrCost::default();
        assert_eq!(c.save_ns(0), 1_000);
        assert!(c.save_ns(8) < c.save_ns(32));
        assert!(c.save_ns(32) <= 10_000 && c.save_ns(1000) == 10_000);
        assert!(GpuConfig::default().validate().is_ok());
        let bad = GpuConfig {
            cus: 0,
            ..GpuConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("cus"));
    }
}
