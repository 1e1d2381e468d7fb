//! The BE and LC sides of an LC/BE scenario. Each runs in a thread of one process or in its own
//! process; they meet through [`Control`].

use crate::control::Control;
use crate::{BenchError, Env, Result, Summary};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, Level, QueueConfig, QueueId, XQueue};
use xpreempt_cuda::native::{Event, Stream};
use xpreempt_cuda::queue::{CudaQueue, CudaQueueConfig};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BeSpec {
    /// None: native launches on a plain stream. Some: through an XQueue at this level.
    pub level: Option<Level>,
    pub stream_priority: i32,
    pub block_us: f64,
    pub kernel_us: f64,
    pub persistent: bool,
    /// Build the kernels with the guard (Lv2 needs it; measures guard overhead otherwise).
    pub guarded: bool,
    /// Kernels the loop keeps outstanding.
    pub window: usize,
    /// XQueue threshold and batch.
    pub threshold: u32,
    pub batch: u32,
    /// Lv3: keep this timeslice (µs) for the whole run instead of switching per request.
    pub static_timeslice_us: Option<u64>,
    pub max_secs: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BeResult {
    /// Work units (blocks or items) per second while the LC side measured (or the whole run).
    pub units_per_s: f64,
    pub kernels: u64,
    pub suspends: u64,
    pub level_used: Option<String>,
    pub hal_errors: u64,
    pub suspend_latency_p50_us: Option<f64>,
    pub suspend_latency_p99_us: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LcSpec {
    pub stream_priority: i32,
    pub kernels: u32,
    pub blocks: u32,
    pub kernel_us: f64,
    pub gap_min_us: u64,
    pub gap_max_us: u64,
    pub secs: f64,
    /// Tell the BE side (lc_active) around each request.
    pub signal: bool,
    /// Lv3: raise this process's timeslice to this many µs while running.
    pub timeslice_us: Option<u64>,
    /// Run without a BE side.
    pub alone: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LcResult {
    pub latency_us: Summary,
    pub timeslice_set: Option<String>,
}

pub(crate) fn be_kernel(
    env: &Env,
    spec: &BeSpec,
    guarded: bool,
) -> Result<(xpreempt_cuda::Kernel, u64)> {
    let units = ((spec.kernel_us / spec.block_us).max(1.0) as u32) * env.wave;
    let k = if spec.persistent {
        env.persistent(guarded, units, spec.block_us, 0, 0)?
    } else {
        env.spin(guarded, units, spec.block_us, 0, 0)?
    };
    Ok((k, units as u64))
}

/// Records units done at the LC side's phase changes.
struct Meter {
    units: AtomicU64,
}

/// Runs the BE loop until the LC side says done (phase 2) or `max_secs`.
pub fn run_be(env: &Env, spec: &BeSpec, ctl: &Control) -> Result<BeResult> {
    env.device.bind()?;
    let meter = Meter {
        units: AtomicU64::new(0),
    };
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs_f64(spec.max_secs);
    let mut result = BeResult::default();

    // Lv3 with a fixed share: this process's timeslice stays low for the whole run.
    let static_ts = match spec.static_timeslice_us {
        Some(us) => {
            let t = xpreempt_cuda::timeslice::Timeslice::probe()?;
            t.set_us(us)?;
            result.level_used = Some(format!("lv3-static {us} us"));
            Some(t)
        }
        None => None,
    };
    // Optional XQueue.
    let xq: Option<Arc<SharedXQueue<CudaQueue>>> = match spec.level {
        None => None,
        Some(level) => {
            let cfg = CudaQueueConfig {
                level,
                stream_priority: spec.stream_priority,
                slots: 2 * spec.threshold + 2,
                max_units: 1 << 21,
            };
            let hal = CudaQueue::new(env.device.clone(), cfg)?;
            result.level_used = Some(hal_level(&hal).to_string());
            let qc = QueueConfig::new(spec.threshold, spec.batch, level)?;
            let hw = xpreempt_core::HwQueue::max_level(&hal);
            Some(Arc::new(SharedXQueue::new(
                XQueue::new(QueueId(1), qc, hw),
                hal,
                None,
            )))
        }
    };

    let started = Instant::now();
    let mut kernels = 0u64;
    let mut feed = || -> Result<()> {
        match &xq {
            None => {
                let s = Stream::new(&env.device, spec.stream_priority)?;
                let (k, units) = be_kernel(env, spec, false)?;
                // One event per kernel in flight, created up front so that the loop only
                // launches, records and waits.
                let mut free = (0..spec.window + 1)
                    .map(|_| Event::new(&env.device))
                    .collect::<Result<Vec<Event>, _>>()?;
                let mut ring: VecDeque<Event> = VecDeque::new();
                while !stop.load(Relaxed) && Instant::now() < deadline {
                    s.launch(&k)?;
                    let e = match free.pop() {
                        Some(e) => e,
                        None => Event::new(&env.device)?,
                    };
                    s.record(&e)?;
                    ring.push_back(e);
                    ctl.be_ready.store(1, Release);
                    if ring.len() >= spec.window
                        && let Some(e) = ring.pop_front()
                    {
                        e.synchronize()?;
                        free.push(e);
                        kernels += 1;
                        meter.units.fetch_add(units, Relaxed);
                    }
                }
                s.sync()?;
            }
            Some(q) => {
                let (k, units) = be_kernel(env, spec, spec.guarded)?;
                let mut outstanding: VecDeque<u64> = VecDeque::new();
                while !stop.load(Relaxed) && Instant::now() < deadline {
                    outstanding.push_back(q.submit(Command::kernel(k.clone()))?);
                    ctl.be_ready.store(1, Release);
                    if outstanding.len() >= spec.window
                        && let Some(s) = outstanding.pop_front()
                    {
                        q.wait(s).map_err(BenchError::Wait)?;
                        kernels += 1;
                        meter.units.fetch_add(units, Relaxed);
                    }
                }
                stop.store(true, Relaxed);
                // Let the poller resume us before draining.
                std::thread::sleep(Duration::from_millis(2));
                q.resume().ok();
                q.wait_all().map_err(BenchError::Wait)?;
            }
        }
        Ok(())
    };
    let (run, (rate, suspends)) = std::thread::scope(|sc| {
        let poller = sc.spawn(|| poll(ctl, xq.as_deref(), &meter, &stop));
        let run = feed();
        stop.store(true, Relaxed);
        (run, poller.join().unwrap_or((0.0, 0)))
    });
    run?;
    result.units_per_s = if rate > 0.0 {
        rate
    } else {
        meter.units.load(Relaxed) as f64 / started.elapsed().as_secs_f64()
    };
    result.kernels = kernels;
    result.suspends = suspends;
    if let Some(q) = &xq {
        let st = q.stats();
        result.hal_errors = st.hal_errors;
        if st.suspend_latency.count() > 0 {
            result.suspend_latency_p50_us = Some(st.suspend_latency.quantile(0.5) as f64 / 1000.0);
            result.suspend_latency_p99_us = Some(st.suspend_latency.quantile(0.99) as f64 / 1000.0);
        }
    }
    if let Some(t) = static_ts {
        t.restore().ok();
    }
    Ok(result)
}

/// The BE side's poller: applies suspend/resume (xpreempt modes) as the LC side asks through
/// `ctl`, and meters the measuring window. Returns (units per second, suspensions).
fn poll(
    ctl: &Control,
    xq: Option<&SharedXQueue<CudaQueue>>,
    meter: &Meter,
    stop: &AtomicBool,
) -> (f64, u64) {
    let mut suspended = false;
    let mut suspends = 0u64;
    let mut t1: Option<(Instant, u64)> = None;
    let mut rate = 0.0;
    while !stop.load(Relaxed) {
        if let Some(q) = xq {
            let want = ctl.lc_active.load(Acquire) != 0;
            if want && !suspended {
                if let Err(e) = q.suspend() {
                    tracing::warn!(%e, "suspend");
                }
                suspended = true;
                suspends += 1;
                ctl.be_suspended.store(1, Release);
            } else if !want && suspended {
                if let Err(e) = q.resume() {
                    tracing::warn!(%e, "resume");
                }
                suspended = false;
                ctl.be_suspended.store(0, Release);
            }
        }
        match (ctl.phase.load(Acquire), t1) {
            (1, None) => t1 = Some((Instant::now(), meter.units.load(Relaxed))),
            (2, Some((t, u))) if rate == 0.0 => {
                let du = meter.units.load(Relaxed) - u;
                rate = du as f64 / t.elapsed().as_secs_f64();
                stop.store(true, Relaxed);
            }
            (2, None) => stop.store(true, Relaxed),
            _ => {}
        }
        std::hint::spin_loop();
    }
    if suspended && let Some(q) = xq {
        let _ = q.resume();
    }
    (rate, suspends)
}

fn hal_level(h: &CudaQueue) -> Level {
    xpreempt_core::HwQueue::max_level(h)
}

/// Runs the LC request loop; waits for the BE side first unless alone.
pub fn run_lc(env: &Env, spec: &LcSpec, ctl: &Control) -> Result<LcResult> {
    env.device.bind()?;
    let s = Stream::new(&env.device, spec.stream_priority)?;
    let k = env.lc_kernel(spec.blocks, spec.kernel_us)?;
    let mut res = LcResult::default();
    let ts = match spec.timeslice_us {
        Some(us) => match xpreempt_cuda::timeslice::Timeslice::probe() {
            Ok(t) => match t.set_us(us) {
                Ok(()) => {
                    res.timeslice_set = Some(format!("{us} us"));
                    Some(t)
                }
                Err(e) => {
                    res.timeslice_set = Some(format!("failed: {e}"));
                    None
                }
            },
            Err(e) => {
                res.timeslice_set = Some(format!("unavailable: {e}"));
                None
            }
        },
        None => None,
    };
    // Warm up.
    for _ in 0..5 {
        s.launch(&k)?;
        s.sync()?;
    }
    if !spec.alone {
        let t = Instant::now();
        while ctl.be_ready.load(Acquire) == 0 {
            if t.elapsed() > Duration::from_secs(30) {
                return Err(BenchError::TimedOut {
                    what: "the BE side did not start",
                    secs: 30,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ctl.phase.store(1, Release);
    let end = Instant::now() + Duration::from_secs_f64(spec.secs);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut lat = Vec::new();
    while Instant::now() < end {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let gap = spec.gap_min_us + rng % (spec.gap_max_us - spec.gap_min_us + 1);
        std::thread::sleep(Duration::from_micros(gap));
        if spec.signal {
            ctl.lc_active.store(1, Release);
        }
        let t0 = Instant::now();
        for _ in 0..spec.kernels {
            s.launch(&k)?;
        }
        s.sync()?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
        if spec.signal {
            ctl.lc_active.store(0, Release);
        }
    }
    ctl.phase.store(2, Release);
    if let Some(t) = ts {
        t.restore().ok();
    }
    res.latency_us = Summary::of(lat);
    Ok(res)
}
