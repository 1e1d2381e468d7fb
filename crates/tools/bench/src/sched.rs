//! LC/BE in one process through the real local-mode scheduler: both sides are threaded XQueues
//! registered with the HPF policy on its own thread; the LC queue's Ready/Idle reports make the
//! scheduler suspend and resume the BE queue (Lv2 guard), with stream priorities underneath.

use crate::roles::{BeResult, BeSpec, LcResult, LcSpec};
use crate::{BenchError, Env, Result, Summary};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{QueueInfo, Scheduler};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, HwQueue, Level, QueueConfig, QueueId, XQueue, policy};
use xpreempt_cuda::queue::{CudaQueue, CudaQueueConfig};

pub fn run_sched_pair(
    env: &Env,
    be: &BeSpec,
    lc: &LcSpec,
    policy_name: &str,
) -> Result<(LcResult, BeResult)> {
    env.device.bind()?;
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name(policy_name)?))
        .map_err(BenchError::SchedulerStart)?;
    let make = |id: u32,
                prio: i32,
                level: Level,
                stream_priority: i32|
     -> Result<Arc<SharedXQueue<CudaQueue>>> {
        let hal = CudaQueue::new(
            env.device.clone(),
            CudaQueueConfig {
                level,
                stream_priority,
                slots: 2 * be.threshold + 2,
                max_units: 1 << 21,
            },
        )?;
        let qc = QueueConfig::new(be.threshold, be.batch, level)?;
        let hw = hal.max_level();
        let q = Arc::new(SharedXQueue::new(
            XQueue::new(QueueId(id), qc, hw),
            hal,
            Some(sched.sink()),
        ));
        sched.register(
            QueueInfo::new(QueueId(id), prio),
            q.clone() as Arc<dyn Preemptible>,
        )?;
        Ok(q)
    };
    let be_q = make(0, 0, be.level.unwrap_or(Level::Lv2), be.stream_priority)?;
    let lc_q = make(1, 10, Level::Lv1, lc.stream_priority)?;
    let units_done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let be_thread = {
        let (q, units_done, stop) = (be_q.clone(), units_done.clone(), stop.clone());
        let (k, units) = super::roles::be_kernel(env, be, be.guarded)?;
        let dev = env.device.clone();
        let window = be.window;
        std::thread::spawn(move || -> Result<u64> {
            dev.bind()?;
            let mut out = VecDeque::new();
            let mut kernels = 0;
            while !stop.load(Relaxed) {
                out.push_back(q.submit(Command::kernel(k.clone()))?);
                if out.len() >= window
                    && let Some(s) = out.pop_front()
                {
                    q.wait(s).map_err(BenchError::Wait)?;
                    kernels += 1;
                    units_done.fetch_add(units, Relaxed);
                }
            }
            q.wait_all().map_err(BenchError::Wait)?;
            Ok(kernels)
        })
    };
    let k = env.lc_kernel(lc.blocks, lc.kernel_us)?;
    for _ in 0..5 {
        let s = lc_q.submit(Command::kernel(k.clone()))?;
        lc_q.wait(s).map_err(BenchError::Wait)?;
    }
    std::thread::sleep(Duration::from_millis(200));
    let (t_start, u_start) = (Instant::now(), units_done.load(Relaxed));
    let end = t_start + Duration::from_secs_f64(lc.secs);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut lat = Vec::new();
    while Instant::now() < end {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_micros(
            lc.gap_min_us + rng % (lc.gap_max_us - lc.gap_min_us + 1),
        ));
        let t0 = Instant::now();
        let mut last = 0;
        for _ in 0..lc.kernels {
            last = lc_q.submit(Command::kernel(k.clone()))?;
        }
        lc_q.wait(last).map_err(BenchError::Wait)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let rate = (units_done.load(Relaxed) - u_start) as f64 / t_start.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    let kernels = be_thread.join().map_err(|_| BenchError::Panicked("BE"))??;
    let st = be_q.stats();
    let be_r = BeResult {
        units_per_s: rate,
        kernels,
        suspends: st.preemptions,
        level_used: Some(format!(
            "{} via local scheduler ({policy_name})",
            be_q.hal().max_level()
        )),
        hal_errors: st.hal_errors,
        suspend_latency_p50_us: (st.suspend_latency.count() > 0)
            .then(|| st.suspend_latency.quantile(0.5) as f64 / 1e3),
        suspend_latency_p99_us: (st.suspend_latency.count() > 0)
            .then(|| st.suspend_latency.quantile(0.99) as f64 / 1e3),
    };
    Ok((
        LcResult {
            latency_us: Summary::of(lat),
            timeslice_set: None,
        },
        be_r,
    ))
}
