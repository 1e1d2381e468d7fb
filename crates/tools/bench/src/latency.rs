//! Preemption latency: a BE queue keeps the GPU busy with kernels of a given duration and block
//! duration; at a random moment the probe side suspends it and launches a one-block probe on a
//! stream of the SAME priority (so hardware priorities do not help). Measured: suspend call →
//! probe complete (the GPU was free for the other queue), and suspend → `settled`.

use crate::queue::{BenchQueue, QueueSpec};
use crate::requests::Arrivals;
use crate::roles::Feed;
use crate::{BenchError, Env, Result, Shape, Summary};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_core::{HwQueue, Level, QueueId};
use xpreempt_cuda::native::{Event, Stream};

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
    let k = env.kernel(Shape::Spin, guarded, blocks, block_us, 0, 0)?;
    let stop = AtomicBool::new(false);
    let xq: Option<Arc<BenchQueue>> = match level {
        None => None,
        Some(level) => Some(
            QueueSpec {
                level,
                stream_priority: be_prio,
                threshold: 4,
                batch: 2,
            }
            .local(env, QueueId(1), None, None)?,
        ),
    };
    std::thread::scope(|sc| {
        // BE feeder thread: keeps 4 kernels outstanding.
        let feeder = sc.spawn(|| -> Result<()> {
            env.device.bind()?;
            let feed = Feed {
                env,
                kernel: &k,
                stream_priority: be_prio,
                window: 4,
            };
            let run = feed.run(xq.as_deref(), || !stop.load(Relaxed), || {}, || {});
            let drained = xq.as_deref().map_or(Ok(()), Feed::drain);
            run.and(drained)
        });
        let probed = probe_loop(env, level, xq.as_deref(), trials, &probe_stream);
        stop.store(true, Relaxed);
        let fed = feeder.join().unwrap_or(Err(BenchError::Panicked("feeder")));
        let (probe_lat, settle) = probed?;
        fed?;
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
    })
}

/// The probes: at random moments suspends `xq` (if any), launches the probe and times it (and
/// the queue's settling at Lv2). Returns (probe latencies, settle times), µs.
fn probe_loop(
    env: &Env,
    level: Option<Level>,
    xq: Option<&BenchQueue>,
    trials: usize,
    probe_stream: &Stream,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let probe = env.lc_kernel(1, 1.0)?;
    let probe_done = Event::new(&env.device)?;
    std::thread::sleep(Duration::from_millis(20));
    let mut probe_lat = Vec::new();
    let mut settle = Vec::new();
    let mut moments = Arrivals::new(0x2545_f491_4f6c_dd1d, 2000, 4999)?;
    for _ in 0..trials {
        std::thread::sleep(moments.next_gap());
        let t0 = Instant::now();
        if let Some(q) = xq {
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
                && let Some(q) = xq
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
        if let Some(q) = xq {
            q.resume()?;
        }
    }
    Ok((probe_lat, settle))
}
