//! Lv3 check: is descheduling through the channel-group timeslice real? A progress kernel in this
//! process competes with a saturating BE process; its progress rate is read from host-mapped
//! memory in three windows: default timeslice, own timeslice at the minimum, restored.

use crate::timeslice::Timeslice;
use crate::{BenchError, Env, Result};
use serde::Serialize;
use std::time::{Duration, Instant};
use xpreempt_cuda::native::{HostWord, Stream};

#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub timeslice_us: u64,
    pub set_call_us: f64,
    /// Progress steps per ms in this window.
    pub rate_per_ms: f64,
    /// Longest time without progress in this window (ms).
    pub longest_stall_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Lv3Probe {
    pub windows: Vec<Window>,
    pub driver: String,
    pub channel_groups: u32,
}

/// Runs the probe; the competing process must already be busy.
pub fn probe(env: &Env, window_ms: u64) -> Result<Lv3Probe> {
    env.device.bind()?;
    let ts = Timeslice::probe()?;
    // Read from the host while the kernel runs: a copy would queue behind the kernel itself.
    let progress = HostWord::new(&env.device)?;
    let s = Stream::new(&env.device, 0)?;
    // ~ (3 windows + margin) of ~20 µs steps on one block.
    let steps = window_ms * 4 * 1000 / 20;
    let iters = (20.0 * env.iters_per_us_light) as u64;
    let k = xpreempt_cuda::Kernel::new(
        env.k.progress,
        [1, 1, 1],
        [32, 1, 1],
        &[steps, iters, progress.device_ptr(), env.sink.ptr],
    )?;
    s.launch(&k)?;
    let read = || progress.load();
    let t = Instant::now();
    while read() == 0 {
        if t.elapsed() > Duration::from_secs(10) {
            return Err(BenchError::TimedOut {
                what: "the progress kernel did not start",
                secs: 10,
            });
        }
    }
    let mut windows = Vec::new();
    for us in [
        ts.normal_us,
        xpreempt_cuda::lv3::MIN_TIMESLICE_US,
        ts.normal_us,
    ] {
        let t0 = Instant::now();
        ts.set_us(us)?;
        let set_call_us = t0.elapsed().as_secs_f64() * 1e6;
        let start = Instant::now();
        let p0 = read();
        let mut last = p0;
        let mut last_change = start;
        let mut stall = Duration::ZERO;
        while start.elapsed() < Duration::from_millis(window_ms) {
            let p = read();
            if p != last {
                last = p;
                stall = stall.max(last_change.elapsed());
                last_change = Instant::now();
            }
        }
        stall = stall.max(last_change.elapsed());
        windows.push(Window {
            timeslice_us: us,
            set_call_us,
            rate_per_ms: (last - p0) as f64 / window_ms as f64,
            longest_stall_ms: stall.as_secs_f64() * 1e3,
        });
    }
    ts.restore().ok();
    // Dropping the stream waits for the rest of the kernel (sized to about four windows, three
    // of which have passed); only then does `progress`, which it writes, go.
    drop(s);
    Ok(Lv3Probe {
        windows,
        driver: ts.driver.clone(),
        channel_groups: ts.channel_groups(),
    })
}
