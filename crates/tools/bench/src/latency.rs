//! Preemption latency: a BE queue keeps the GPU busy with kernels of a given duration and block
//! duration; at a random moment the probe side suspends it and launches a one-block probe on a
//! stream of the SAME priority (so hardware priorities do not help). Measured: suspend call →
//! probe complete (the GPU was free for the other queue), and suspend → `settled`.

use crate::{BenchError, Env, Result, Summary};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_cuda::native::{Event, Stream};
use xpreempt_cuda::queue::{CudaQueue, CudaQueueConfig};

#[derive(Clone, Debug, Serialize)]
pub struct LatencyPoint {
    /// "native" (no preemption), "lv1", "lv2".
    pub level: String,
    pub block_us: f64,
    pub kernel_us: f64,
    pub probe_us: Summary,
    pub settle_us: Option<Summary>,
    pub idle_probe_us: f64,
}

/// One point of the sweep.
/// With `prio`, the BE queue runs at the least stream priority and the probe at the greatest
/// (xpreempt's same-context mode); without, both at the same priority.
pub fn measure(
    env: &Env,
    level: Option<Level>,
    prio: bool,
    block_us: f64,
    kernel_us: f64,
    trials: usize,
) -> Result<LatencyPoint> {
    env.device.bind()?;
    let (least, greatest) = env.device.stream_priority_range()?;
    let (be_prio, probe_prio) = if prio { (least, greatest) } else { (0, 0) };
    let probe_stream = Stream::new(&env.device, probe_prio)?;
    let probe_done = Event::new(&env.device)?;
    let probe = env.lc_kernel(1, 1.0)?;
    // Idle probe time.
    let mut idle = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        probe_stream.launch(&probe)?;
        probe_stream.sync()?;
        idle.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let idle_probe_us = Summary::of(idle).p50;
    let blocks = ((kernel_us / block_us).max(1.0).round() as u32) * env.wave;
    let guarded = level == Some(Level::Lv2);
    let k = env.spin(guarded, blocks, block_us, 0, 0)?;
    let stop = Arc::new(AtomicBool::new(false));
    let xq: Option<Arc<SharedXQueue<CudaQueue>>> = match level {
        None => None,
        Some(l) => {
            let hal = CudaQueue::new(
                env.device.clone(),
                CudaQueueConfig {
                    level: l,
                    stream_priority: be_prio,
                    slots: 12,
                    max_units: 1 << 21,
                },
            )?;
            let hw = hal.max_level();
            let qc = QueueConfig::new(4, 2, l)?;
            Some(Arc::new(SharedXQueue::new(
                XQueue::new(QueueId(1), qc, hw),
                hal,
                None,
            )))
        }
    };
    // BE feeder thread: keeps 4 kernels outstanding.
    let feeder = {
        let xq = xq.clone();
        let stop = stop.clone();
        let k = k.clone();
        let dev = env.device.clone();
        std::thread::spawn(move || -> Result<()> {
            dev.bind()?;
            match xq {
                Some(q) => {
                    let mut out = VecDeque::new();
                    while !stop.load(Relaxed) {
                        out.push_back(q.submit(Command::kernel(k.clone()))?);
                        if out.len() >= 4
                            && let Some(s) = out.pop_front()
                        {
                            q.wait(s).map_err(BenchError::Wait)?;
                        }
                    }
                    q.resume().ok();
                    q.wait_all().map_err(BenchError::Wait)?;
                }
                None => {
                    let s = Stream::new(&dev, be_prio)?;
                    // A ring of events, one per kernel in flight, reused round after round.
                    let mut ring: VecDeque<Event> = VecDeque::new();
                    let mut free: Vec<Event> = Vec::new();
                    while !stop.load(Relaxed) {
                        s.launch(&k)?;
                        let e = match free.pop() {
                            Some(e) => e,
                            None => Event::new(&dev)?,
                        };
                        s.record(&e)?;
                        ring.push_back(e);
                        if ring.len() >= 4
                            && let Some(e) = ring.pop_front()
                        {
                            e.synchronize()?;
                            free.push(e);
                        }
                    }
                    s.sync()?;
                }
            }
            Ok(())
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let mut probe_lat = Vec::new();
    let mut settle = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..trials {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_micros(2000 + rng % 3000));
        let t0 = Instant::now();
        if let Some(q) = &xq {
            q.suspend()?;
        }
        probe_stream.launch(&probe)?;
        probe_stream.record(&probe_done)?;
        let mut probe_lat_us = None;
        let mut settled = if level == Some(Level::Lv2) {
            None
        } else {
            Some(0.0)
        };
        while probe_lat_us.is_none() || settled.is_none() {
            if probe_lat_us.is_none() && probe_done.is_complete()? {
                probe_lat_us = Some(t0.elapsed().as_secs_f64() * 1e6);
            }
            if settled.is_none()
                && let Some(q) = &xq
                && q.hal().settled()
            {
                settled = Some(t0.elapsed().as_secs_f64() * 1e6);
            }
            if t0.elapsed() > Duration::from_secs(5) {
                return Err(BenchError::TimedOut {
                    what: "the probe did not complete",
                    secs: 5,
                });
            }
        }
        probe_lat.push(probe_lat_us.unwrap_or(f64::NAN));
        if level == Some(Level::Lv2) {
            settle.push(settled.unwrap_or(f64::NAN));
        }
        if let Some(q) = &xq {
            q.resume()?;
        }
    }
    stop.store(true, Relaxed);
    feeder
        .join()
        .map_err(|_| BenchError::Panicked("feeder"))??;
    Ok(LatencyPoint {
        level: format!(
            "{}{}",
            level.map_or("native".into(), |l| l.to_string()),
            if prio { "+prio" } else { "" }
        ),
        block_us,
        kernel_us,
        probe_us: Summary::of(probe_lat),
        settle_us: (!settle.is_empty()).then(|| Summary::of(settle)),
        idle_probe_us,
    })
}
