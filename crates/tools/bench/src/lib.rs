//! Workloads of `xpreempt bench`: calibrated spin kernels, a saturating best-effort (BE) loop, a
//! latency-critical (LC) request loop, and the preemption-latency probe. The CLI arranges them
//! into scenarios (one process or two, native or through xpreempt).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod control;
pub mod error;
pub mod latency;
pub mod lv3probe;
pub mod roles;
pub mod sched;
pub mod svg;

pub use error::{BenchError, Result};

use std::sync::Arc;
use xpreempt_cuda::driver::{Device, DeviceBuffer};
use xpreempt_cuda::kernel::Kernel;
use xpreempt_cuda::native::Stream;
use xpreempt_cuda::nvrtc::BenchKernels;

pub const THREADS: u32 = 256;
pub const BLOCKS_PER_SM: u32 = 8;

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
    pub fn new(ordinal: i32) -> Result<Self> {
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
        env.calibrate()?;
        Ok(env)
    }

    fn calibrate(&mut self) -> Result<()> {
        let s = Stream::new(&self.device, 0)?;
        let iters = 20_000u32;
        let mut full = 0.0;
        let mut light = 0.0;
        for _ in 0..3 {
            let kf = with_iters(self.spin(false, self.wave, 0.0, 0, 0)?, iters);
            full = s.time_us(|s| s.launch(&kf))?;
            let kl = with_iters(self.spin(false, 4, 0.0, 0, 0)?, iters);
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

    /// A spin kernel of `blocks` blocks of about `block_us` each on a full GPU.
    pub fn spin(
        &self,
        guarded: bool,
        blocks: u32,
        block_us: f64,
        counts: u64,
        total: u64,
    ) -> Result<Kernel> {
        let iters = (block_us * self.iters_per_us_full).max(1.0) as u64;
        let grid = [blocks, 1, 1];
        let block = [THREADS, 1, 1];
        Ok(if guarded {
            Kernel::new(
                self.k.spin_guarded,
                grid,
                block,
                &[iters, counts, total, self.sink.ptr],
            )?
            .guarded()
        } else {
            Kernel::new(
                self.k.spin_plain,
                grid,
                block,
                &[0, 0, 0, iters, counts, total, self.sink.ptr],
            )?
        })
    }

    /// A short LC kernel: `blocks` blocks of about `us` each on an otherwise idle GPU.
    pub fn lc_kernel(&self, blocks: u32, us: f64) -> Result<Kernel> {
        let iters = (us * self.iters_per_us_light).max(1.0) as u64;
        Ok(Kernel::new(
            self.k.spin_plain,
            [blocks, 1, 1],
            [THREADS, 1, 1],
            &[0, 0, 0, iters, 0, 0, self.sink.ptr],
        )?)
    }

    /// A persistent kernel: one wave looping over `items` items of about `item_us` each.
    pub fn persistent(
        &self,
        guarded: bool,
        items: u32,
        item_us: f64,
        counts: u64,
        total: u64,
    ) -> Result<Kernel> {
        let iters = (item_us * self.iters_per_us_full).max(1.0) as u64;
        let grid = [self.wave, 1, 1];
        let block = [THREADS, 1, 1];
        Ok(if guarded {
            Kernel::new(
                self.k.persistent_guarded,
                grid,
                block,
                &[items as u64, iters, counts, total, self.sink.ptr],
            )?
            .guarded_items(items)
        } else {
            Kernel::new(
                self.k.persistent_plain,
                grid,
                block,
                &[0, 0, 0, items as u64, iters, counts, total, self.sink.ptr],
            )?
        })
    }
}

/// Replaces the iteration count of a spin kernel (calibration).
fn with_iters(mut k: Kernel, iters: u32) -> Kernel {
    let at = if k.guard.is_some() { 0 } else { 3 };
    k.args[at] = iters as u64;
    k
}

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
    fn percentiles() {
        let s = Summary::of((1..=100).map(|x| x as f64).collect());
        assert_eq!((s.n, s.p50, s.p99, s.max), (100, 51.0, 99.0, 100.0));
        assert!(Summary::of(vec![]).p50.is_nan());
    }
}
