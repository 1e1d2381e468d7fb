//! Workloads of `xpreempt-bench`: calibrated spin kernels, a saturating best-effort (BE) loop, a
//! latency-critical (LC) request loop, and the preemption-latency probe. The CLI arranges them
//! into scenarios (one process or two, native or through xpreempt).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod control;
pub mod error;
pub mod latency;
pub mod lv3probe;
pub mod marks;
pub mod queue;
pub mod requests;
pub mod roles;
pub mod sched;
pub mod svg;
pub mod timeslice;

pub use error::{BenchError, Result};

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use xpreempt_cuda::driver::{Device, DeviceBuffer};
use xpreempt_cuda::kernel::Kernel;
use xpreempt_cuda::native::Stream;
use xpreempt_cuda::nvrtc::BenchKernels;

pub const THREADS: u32 = 256;
pub const BLOCKS_PER_SM: u32 = 8;

/// How a BE kernel spends its work units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One block per unit.
    Spin,
    /// One wave of blocks looping over the units (items).
    Persistent,
}

/// Loop iterations per µs of one block: what the kernels' durations are computed from.
///
/// The sides of a two-process scenario take it from the process that runs the scenario instead
/// of measuring it themselves: they start together, and a calibration kernel that shares the GPU
/// with the other side's runs long, which makes that side's kernels short: under MPS, one start in
/// six measured 3.3× too few iterations, and a BE was once reported at 1.6× its throughput alone
/// (H100, driver 580.159.04).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// With the GPU full (8 blocks of 256 per SM): BE kernels.
    pub full: f64,
    /// With a few blocks alone on the GPU: LC kernels.
    pub light: f64,
}

impl std::str::FromStr for Calibration {
    type Err = String;

    /// `FULL,LIGHT`, both finite and positive.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad =
            || format!("calibration `{s}`: expected FULL,LIGHT iterations per µs, both positive");
        let (full, light) = s.split_once(',').ok_or_else(bad)?;
        let num = |v: &str| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(bad)
        };
        Ok(Self {
            full: num(full)?,
            light: num(light)?,
        })
    }
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `{}` of an f64 prints the shortest form that parses back to the same value.
        write!(f, "{},{}", self.full, self.light)
    }
}

/// One device with the benchmark kernels and their calibration.
pub struct Env {
    pub device: Arc<Device>,
    pub k: BenchKernels,
    /// Loop iterations per µs of one block when the GPU is full (8 blocks of 256 per SM).
    pub iters_per_us_full: f64,
    /// Same with a few blocks alone on the GPU (LC kernels).
    pub iters_per_us_light: f64,
    pub wave: u32,
    pub sink: DeviceBuffer,
}

impl Env {
    /// Opens the device and calibrates the kernels on it.
    pub fn new(ordinal: i32) -> Result<Self> {
        Self::open(ordinal, None)
    }

    /// Opens the device; kernels follow `calibration` if given, else one measured now.
    pub fn open(ordinal: i32, calibration: Option<Calibration>) -> Result<Self> {
        let device = Arc::new(Device::open(ordinal)?);
        let k = BenchKernels::build(&device)?;
        let wave = device.sm_count as u32 * BLOCKS_PER_SM;
        let sink = DeviceBuffer::zeroed(64)?;
        let mut env = Self {
            device,
            k,
            iters_per_us_full: 1.0,
            iters_per_us_light: 1.0,
            wave,
            sink,
        };
        match calibration {
            Some(c) => {
                env.iters_per_us_full = c.full;
                env.iters_per_us_light = c.light;
            }
            None => env.calibrate()?,
        }
        Ok(env)
    }

    pub fn calibration(&self) -> Calibration {
        Calibration {
            full: self.iters_per_us_full,
            light: self.iters_per_us_light,
        }
    }

    fn calibrate(&mut self) -> Result<()> {
        let s = Stream::new(&self.device, 0)?;
        let iters = 20_000u32;
        let mut full = 0.0;
        let mut light = 0.0;
        for _ in 0..3 {
            let kf = with_iters(
                self.kernel(Shape::Spin, false, self.wave, 0.0, 0, 0)?,
                iters,
            );
            full = s.time_us(|s| s.launch(&kf))?;
            let kl = with_iters(self.kernel(Shape::Spin, false, 4, 0.0, 0, 0)?, iters);
            light = s.time_us(|s| s.launch(&kl))?;
        }
        self.iters_per_us_full = iters as f64 / full.max(1.0);
        self.iters_per_us_light = iters as f64 / light.max(1.0);
        tracing::info!(
            full_us = full,
            light_us = light,
            "calibrated {iters} iterations"
        );
        Ok(())
    }

    /// A BE kernel of `units` work units of about `unit_us` each on a full GPU: `units` blocks
    /// ([`Shape::Spin`]) or one wave looping over `units` items ([`Shape::Persistent`]).
    /// `counts` and `total` are device words the kernel counts its units into (0: none).
    pub fn kernel(
        &self,
        shape: Shape,
        guarded: bool,
        units: u32,
        unit_us: f64,
        counts: u64,
        total: u64,
    ) -> Result<Kernel> {
        let iters = (unit_us * self.iters_per_us_full).max(1.0) as u64;
        let (blocks, args) = match shape {
            Shape::Spin => (units, vec![iters, counts, total, self.sink.ptr]),
            Shape::Persistent => (
                self.wave,
                vec![units as u64, iters, counts, total, self.sink.ptr],
            ),
        };
        let k = self.build(shape, guarded, blocks, &args)?;
        Ok(match (guarded, shape) {
            (false, _) => k,
            (true, Shape::Spin) => k.guarded(),
            (true, Shape::Persistent) => k.guarded_items(units),
        })
    }

    /// A short LC kernel: `blocks` blocks of about `us` each on an otherwise idle GPU.
    pub fn lc_kernel(&self, blocks: u32, us: f64) -> Result<Kernel> {
        let iters = (us * self.iters_per_us_light).max(1.0) as u64;
        self.build(Shape::Spin, false, blocks, &[iters, 0, 0, self.sink.ptr])
    }

    /// One launch of a benchmark kernel. The guarded and plain builds come from one source and
    /// take the same arguments, the plain one after three leading guard slots it never reads.
    fn build(&self, shape: Shape, guarded: bool, blocks: u32, args: &[u64]) -> Result<Kernel> {
        let k = &self.k;
        let func = match (shape, guarded) {
            (Shape::Spin, true) => k.spin_guarded,
            (Shape::Spin, false) => k.spin_plain,
            (Shape::Persistent, true) => k.persistent_guarded,
            (Shape::Persistent, false) => k.persistent_plain,
        };
        let args: Vec<u64> = if guarded {
            args.to_vec()
        } else {
            [0, 0, 0].into_iter().chain(args.iter().copied()).collect()
        };
        Ok(Kernel::new(func, [blocks, 1, 1], [THREADS, 1, 1], &args)?)
    }
}

/// Replaces the iteration count of a spin kernel (calibration).
fn with_iters(mut k: Kernel, iters: u32) -> Kernel {
    let at = if k.guard.is_some() { 0 } else { 3 };
    k.args[at] = iters as u64;
    k
}

/// A run's length in seconds, as a duration: a negative, NaN or absurdly long one is an error
/// (`Duration::from_secs_f64` would panic on it).
pub fn run_length(secs: f64) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero() && *d <= MAX_RUN)
        .ok_or_else(|| {
            BenchError::Spec(format!(
                "a run of {secs} s: give a positive number of seconds, at most {}",
                MAX_RUN.as_secs()
            ))
        })
}

/// The longest run a benchmark side accepts (a day): a deadline this far is never reached.
pub const MAX_RUN: std::time::Duration = std::time::Duration::from_secs(86_400);

/// p-th percentile (0..=100) of unsorted samples.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub mean: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(mut samples: Vec<f64>) -> Self {
        let n = samples.len();
        let mean = if n == 0 {
            f64::NAN
        } else {
            samples.iter().sum::<f64>() / n as f64
        };
        let p50 = percentile(&mut samples, 50.0);
        let p99 = percentile(&mut samples, 99.0);
        let max = samples.last().copied().unwrap_or(f64::NAN);
        Self {
            n,
            p50,
            p99,
            mean,
            max,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    #[test]
    fn run_lengths_are_checked() {
        assert_eq!(
            run_length(1.5).ok(),
            Some(std::time::Duration::from_millis(1500))
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300, 86_401.0] {
            assert!(run_length(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentiles() {
        let s = Summary::of((1..=100).map(|x| x as f64).collect());
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 51.0, 99.0, 100.0));
        assert!(Summary::of(vec![]).p50.is_nan());
    }

    #[test]
    fn a_calibration_goes_to_a_child_and_back_unchanged() {
        let c = Calibration {
            full: 1.0 / 3.0,
            light: 123.456_789,
        };
        assert_eq!(c.to_string().parse::<Calibration>(), Ok(c));
        for bad in [
            "", "1", "1,", ",1", "1,0", "-1,2", "1,nan", "1,inf", "a,b", "1,2,3",
        ] {
            assert!(bad.parse::<Calibration>().is_err(), "{bad}");
        }
    }
}
