//! Preemption latency: a BE queue keeps the GPU busy with kernels of a given duration and block
//! duration; at a random moment the probe side suspends it and launches a one-block probe on a
//! stream of the SAME priority (so hardware priorities do not help). Measured: suspend call →
//! probe complete (the GPU was free for the other queue), and suspend → `settled`.

use crate::{Env, RawStream, Summary};
use cudarc::driver::sys;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_cuda::error::{CudaError, Result};
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
    let probe_stream = RawStream::new(probe_prio)?;
    let probe = env.lc_kernel(1, 1.0);
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
    let k = env.spin(guarded, blocks, block_us, 0, 0);
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
            let qc = QueueConfig::new(4, 2, l).map_err(|e| CudaError::Other(e.to_string()))?;
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
                        let s = q
                            .submit(Command::kernel(k.clone()))
                            .map_err(|e| CudaError::Other(e.to_string()))?;
                        out.push_back(s);
                        if out.len() >= 4 {
                            let s = out.pop_front().expect("non-empty");
                            q.wait(s).map_err(|e| CudaError::Other(e.to_string()))?;
                        }
                    }
                    q.resume().ok();
                    q.wait_all().map_err(|e| CudaError::Other(e.to_string()))?;
                }
                None => {
                    let s = RawStream::new(be_prio)?;
                    let mut evs: VecDeque<sys::CUevent> = VecDeque::new();
                    while !stop.load(Relaxed) {
                        s.launch(&k)?;
                        let mut e: sys::CUevent = std::ptr::null_mut();
                        xpreempt_cuda::cu!(cuEventCreate(
                            &mut e,
                            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
                        ))?;
                        s.record(e)?;
                        evs.push_back(e);
                        if evs.len() >= 4 {
                            let e = evs.pop_front().expect("non-empty");
                            xpreempt_cuda::cu!(cuEventSynchronize(e))?;
                            // SAFETY: event created above, no longer used.
                            unsafe { sys::cuEventDestroy_v2(e) };
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
            q.suspend().map_err(|e| CudaError::Other(e.to_string()))?;
        }
        probe_stream.launch(&probe)?;
        xpreempt_cuda::cu!(cuEventRecord(probe_stream.event, probe_stream.stream))?;
        let mut probe_done = None;
        let mut settled = if level == Some(Level::Lv2) {
            None
        } else {
            Some(0.0)
        };
        while probe_done.is_none() || settled.is_none() {
            if probe_done.is_none() {
                // SAFETY: live event.
                let r = unsafe { sys::cuEventQuery(probe_stream.event) };
                if r == sys::CUresult::CUDA_SUCCESS {
                    probe_done = Some(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            if settled.is_none()
                && let Some(q) = &xq
                && q.hal().settled()
            {
                settled = Some(t0.elapsed().as_secs_f64() * 1e6);
            }
            if t0.elapsed() > Duration::from_secs(5) {
                return Err(CudaError::Other("probe did not complete in 5 s".into()));
            }
        }
        probe_lat.push(probe_done.unwrap_or(f64::NAN));
        if level == Some(Level::Lv2) {
            settle.push(settled.unwrap_or(f64::NAN));
        }
        if let Some(q) = &xq {
            q.resume().map_err(|e| CudaError::Other(e.to_string()))?;
        }
    }
    stop.store(true, Relaxed);
    feeder
        .join()
        .map_err(|_| CudaError::Other("feeder panicked".into()))??;
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
