//! The BE and LC sides of an LC/BE scenario. Each runs in a thread of one process or in its own
//! process; they meet through [`Control`]. Who suspends the BE side is the scenario's business:
//! the benchmark's controller (`lc_active`), the local scheduler (`sched`) or `xpreemptd` (a
//! side whose spec names an agent).

use crate::control::Control;
use crate::marks::Marks;
use crate::queue::{AgentSpec, BenchQueue, QueueSpec};
pub use crate::requests::LcSpec;
use crate::requests::{LcTarget, request_loop};
use crate::timeslice::Timeslice;
use crate::{BenchError, Env, Result, Shape};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Instant;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_core::{HwQueue, Level, QueueId};
use xpreempt_cuda::Kernel;
use xpreempt_cuda::native::{Event, Stream};

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
    /// Register the XQueue with `xpreemptd` through this process's agent.
    #[serde(default)]
    pub agent: Option<AgentSpec>,
    /// Write the queue's marks (see [`crate::marks`]) to this file.
    #[serde(default)]
    pub marks: Option<PathBuf>,
}

impl BeSpec {
    /// The XQueue this side submits through, if any.
    pub fn queue(&self) -> Option<QueueSpec> {
        self.level.map(|level| QueueSpec {
            level,
            stream_priority: self.stream_priority,
            threshold: self.threshold,
            batch: self.batch,
        })
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BeResult {
    /// Work units (blocks or items) per second while the LC side measured (or the whole run).
    pub units_per_s: f64,
    pub kernels: u64,
    /// Times the BE queue was suspended, by whoever did it.
    pub suspends: u64,
    /// Of those, the ones whose stop began before the queue's lock (`HwQueue::stop_ahead`).
    #[serde(default)]
    pub stops_ahead: u64,
    pub level_used: Option<String>,
    pub hal_errors: u64,
    pub suspend_latency_p50_us: Option<f64>,
    pub suspend_latency_p99_us: Option<f64>,
}

impl LcSpec {
    /// The LC side's XQueue, where it has one (scheduler paths): Lv1, since nothing preempts
    /// it; a window of two requests, and one sync point per request (as the native loop syncs
    /// its stream once per request) rather than one per kernel.
    pub fn queue(&self) -> QueueSpec {
        let kernels = self.kernels.max(1);
        QueueSpec {
            level: Level::Lv1,
            stream_priority: self.stream_priority,
            threshold: 2 * kernels,
            batch: kernels,
        }
    }

    /// Rejects a spec the request loop cannot run (before any GPU work).
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(BenchError::Spec(why));
        crate::run_length(self.secs)?;
        if self.kernels == 0 || self.blocks == 0 {
            return bad("an LC request needs at least one kernel of one block".into());
        }
        if self.gap_max_us < self.gap_min_us {
            return bad(format!(
                "LC gaps {}..{} µs: the longest is shorter than the shortest",
                self.gap_min_us, self.gap_max_us
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LcResult {
    pub latency_us: crate::Summary,
    pub timeslice_set: Option<String>,
    /// Each measured request's latency (µs) in the order made, where the spec asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_us: Option<Vec<f64>>,
}

pub(crate) fn be_kernel(env: &Env, spec: &BeSpec, guarded: bool) -> Result<(Kernel, u64)> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !(positive(spec.block_us) && positive(spec.kernel_us)) {
        return Err(BenchError::Spec(format!(
            "BE kernels of {} µs in blocks of {} µs: both must be positive",
            spec.kernel_us, spec.block_us
        )));
    }
    // At least one wave; a float-to-int cast saturates, so an absurd ratio cannot wrap.
    let units = ((spec.kernel_us / spec.block_us).max(1.0) as u32).saturating_mul(env.wave);
    let shape = if spec.persistent {
        Shape::Persistent
    } else {
        Shape::Spin
    };
    let k = env.kernel(shape, guarded, units, spec.block_us, 0, 0)?;
    Ok((k, units as u64))
}

/// A saturating BE loop: keeps `window` kernels outstanding.
pub(crate) struct Feed<'a> {
    pub env: &'a Env,
    pub kernel: &'a Kernel,
    /// The plain stream's priority when there is no XQueue.
    pub stream_priority: i32,
    pub window: usize,
}

impl Feed<'_> {
    /// Launches while `running()`: on a plain stream (a ring of events, then a final sync) or
    /// through `q` (what is in flight is left to [`Feed::drain`]). Calls `launched` after each
    /// launch and `done` for each kernel seen complete.
    pub fn run(
        &self,
        q: Option<&BenchQueue>,
        running: impl Fn() -> bool,
        mut launched: impl FnMut(),
        mut done: impl FnMut(),
    ) -> Result<()> {
        let Some(q) = q else {
            let s = Stream::new(&self.env.device, self.stream_priority)?;
            // One event per kernel in flight, created up front so that the loop only launches,
            // records and waits.
            let mut free = (0..self.window + 1)
                .map(|_| Event::new(&self.env.device))
                .collect::<Result<Vec<Event>, _>>()?;
            let mut ring: VecDeque<Event> = VecDeque::new();
            while running() {
                s.launch(self.kernel)?;
                let e = match free.pop() {
                    Some(e) => e,
                    None => Event::new(&self.env.device)?,
                };
                s.record(&e)?;
                ring.push_back(e);
                launched();
                if ring.len() >= self.window
                    && let Some(e) = ring.pop_front()
                {
                    e.synchronize()?;
                    free.push(e);
                    done();
                }
            }
            return Ok(s.sync()?);
        };
        let mut outstanding: VecDeque<u64> = VecDeque::new();
        while running() {
            outstanding.push_back(crate::queue::submit_kernel(q, self.kernel)?);
            launched();
            if outstanding.len() >= self.window
                && let Some(s) = outstanding.pop_front()
            {
                q.wait(s).map_err(BenchError::Wait)?;
                done();
            }
        }
        Ok(())
    }

    /// The run is over: whoever suspended the queue, let what it holds finish.
    pub fn drain(q: &BenchQueue) -> Result<()> {
        q.resume().ok();
        q.wait_all().map_err(BenchError::Wait)
    }
}

/// Runs the BE loop until the LC side says done (phase 2) or `max_secs`, on the queue `spec`
/// asks for (none, a local XQueue, or one registered with the daemon).
pub fn run_be(env: &Env, spec: &BeSpec, ctl: &Control) -> Result<BeResult> {
    env.device.bind()?;
    // Lv3 with a fixed share: this process's timeslice stays low for the whole run.
    let static_ts = match spec.static_timeslice_us {
        Some(us) => {
            let t = Timeslice::probe()?;
            t.set_us(us)?;
            Some((t, us))
        }
        None => None,
    };
    let m = Marks::wanted(spec.marks.as_deref());
    let r = match (spec.queue(), &spec.agent) {
        (None, None) => run_be_on(env, spec, ctl, None),
        (None, Some(_)) => Err(BenchError::Spec(
            "a BE side through the daemon needs an XQueue level".into(),
        )),
        (Some(qs), None) => qs
            .local(env, QueueId(1), None, m.clone())
            .and_then(|q| run_be_on(env, spec, ctl, Some(&q))),
        (Some(qs), Some(a)) => a
            .run("xpreempt-bench-be", env, &qs, false, m.clone(), |q| {
                run_be_on(env, spec, ctl, Some(q))
            })
            .map(|mut r| {
                r.level_used = r.level_used.map(|l| format!("{l} via xpreemptd"));
                r
            }),
    };
    if r.is_err() {
        // Ends the run for an LC side still waiting for this one to start.
        ctl.phase.store(2, Release);
    }
    let r = r.and_then(|r| m.as_ref().map_or(Ok(()), |m| m.save()).map(|()| r));
    match static_ts {
        Some((t, us)) => {
            t.restore().ok();
            r.map(|mut r| {
                r.level_used = Some(format!("lv3-static {us} us"));
                r
            })
        }
        None => r,
    }
}

/// Records units done at the LC side's phase changes.
struct Meter {
    units: AtomicU64,
}

/// The BE loop on `xq` (or a plain stream), metered over the LC side's window.
pub fn run_be_on(
    env: &Env,
    spec: &BeSpec,
    ctl: &Control,
    xq: Option<&BenchQueue>,
) -> Result<BeResult> {
    env.device.bind()?;
    let meter = Meter {
        units: AtomicU64::new(0),
    };
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + crate::run_length(spec.max_secs)?;
    let started = Instant::now();
    let (k, units) = be_kernel(env, spec, xq.is_some() && spec.guarded)?;
    let feed = Feed {
        env,
        kernel: &k,
        stream_priority: spec.stream_priority,
        window: spec.window,
    };
    let mut kernels = 0u64;
    let (run, rate) = std::thread::scope(|sc| {
        let poller = sc.spawn(|| poll(ctl, xq, &meter, &stop));
        let run = feed.run(
            xq,
            || !stop.load(Relaxed) && Instant::now() < deadline,
            || ctl.be_ready.store(1, Release),
            || {
                kernels += 1;
                meter.units.fetch_add(units, Relaxed);
            },
        );
        // The poller resumes what it suspended when it stops, before the drain below.
        stop.store(true, Relaxed);
        (run, poller.join().unwrap_or(0.0))
    });
    if run.is_err() {
        // Ends the run for an LC side still waiting for this one to start.
        ctl.phase.store(2, Release);
    }
    let drained = xq.map_or(Ok(()), Feed::drain);
    run?;
    drained?;
    let mut result = BeResult {
        units_per_s: if rate > 0.0 {
            rate
        } else {
            meter.units.load(Relaxed) as f64 / started.elapsed().as_secs_f64()
        },
        kernels,
        ..BeResult::default()
    };
    if let Some(q) = xq {
        let st = q.stats();
        result.level_used = Some(q.hal().max_level().to_string());
        result.suspends = st.preemptions;
        result.stops_ahead = st.stops_ahead;
        result.hal_errors = st.hal_errors;
        if st.suspend_latency.count() > 0 {
            result.suspend_latency_p50_us = Some(st.suspend_latency.quantile(0.5) as f64 / 1e3);
            result.suspend_latency_p99_us = Some(st.suspend_latency.quantile(0.99) as f64 / 1e3);
        }
    }
    Ok(result)
}

/// The BE side's poller: applies suspend/resume as the LC side asks through `ctl.lc_active`
/// (the benchmark's controller; never set on scheduler paths), and meters the measuring
/// window. Returns units per second over the window.
fn poll(ctl: &Control, xq: Option<&BenchQueue>, meter: &Meter, stop: &AtomicBool) -> f64 {
    let mut suspended = false;
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
    rate
}

/// Runs the LC request loop on the target `spec` asks for (a plain stream, or a queue
/// registered with the daemon); waits for the BE side first unless alone.
pub fn run_lc(env: &Env, spec: &LcSpec, ctl: &Control) -> Result<LcResult> {
    spec.validate()?;
    env.device.bind()?;
    let (ts, timeslice_set) = match spec.timeslice_us {
        Some(us) => raise_timeslice(us),
        None => (None, None),
    };
    let m = Marks::wanted(spec.marks.as_deref());
    let r = match &spec.agent {
        None if spec.unscheduled_queue => spec
            .queue()
            .local(env, QueueId(2), None, m.clone())
            .and_then(|q| run_lc_on(env, spec, ctl, &LcTarget::Queue(&q), m.as_deref())),
        None => {
            let s = Stream::new(&env.device, spec.stream_priority)?;
            let timing = match (&m, std::env::var_os("XP_BENCH_GPU_ELAPSED")) {
                (Some(_), Some(_)) => {
                    Some((Event::timed(&env.device)?, Event::timed(&env.device)?))
                }
                _ => None,
            };
            run_lc_on(env, spec, ctl, &LcTarget::Stream(s, timing), m.as_deref())
        }
        Some(a) => a.run(
            "xpreempt-bench-lc",
            env,
            &spec.queue(),
            true,
            m.clone(),
            |q| run_lc_on(env, spec, ctl, &LcTarget::Queue(q), m.as_deref()),
        ),
    };
    let r = r.and_then(|r| m.as_ref().map_or(Ok(()), |m| m.save()).map(|()| r));
    if let Some(t) = ts {
        t.restore().ok();
    }
    r.map(|r| LcResult { timeslice_set, ..r })
}

/// The LC request loop on `target`.
pub fn run_lc_on(
    env: &Env,
    spec: &LcSpec,
    ctl: &Control,
    target: &LcTarget,
    marks: Option<&Marks>,
) -> Result<LcResult> {
    env.device.bind()?;
    let k = env.lc_kernel(spec.blocks, spec.kernel_us)?;
    let lat = request_loop(spec, ctl, marks, || target.request(&k, spec.kernels, marks))?;
    Ok(LcResult {
        samples_us: spec.samples.then(|| lat.clone()),
        latency_us: crate::Summary::of(lat),
        timeslice_set: None,
    })
}

/// Lv3: this process's timeslice raised to `us`; what happened is reported, not fatal (the
/// scenario then shows the default share).
fn raise_timeslice(us: u64) -> (Option<Timeslice>, Option<String>) {
    match Timeslice::probe() {
        Ok(t) => match t.set_us(us) {
            Ok(()) => (Some(t), Some(format!("{us} us"))),
            Err(e) => (None, Some(format!("failed: {e}"))),
        },
        Err(e) => (None, Some(format!("unavailable: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_appear_in_the_result_only_when_kept() {
        let without = LcResult::default();
        let json = serde_json::to_string(&without).expect("json");
        assert!(!json.contains("samples_us"), "{json}");
        let with = LcResult {
            samples_us: Some(vec![51.5, 49.0]),
            ..LcResult::default()
        };
        let back: LcResult =
            serde_json::from_str(&serde_json::to_string(&with).expect("json")).expect("back");
        assert_eq!(back.samples_us, Some(vec![51.5, 49.0]));
        // A result from a side that never heard of samples.
        let old: LcResult = serde_json::from_str(&json).expect("old");
        assert_eq!(old.samples_us, None);
    }
}
