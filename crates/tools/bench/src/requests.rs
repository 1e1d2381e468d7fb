//! The LC request loop, shared by every LC variant (a plain stream, a local XQueue, a queue of
//! the global-mode agent): the same warm-up, arrivals, timing and percentiles, so that the
//! variants differ only in how a request reaches the GPU.

use crate::control::Control;
use crate::marks::{Marks, What};
use crate::queue::{AgentSpec, BenchQueue};
use crate::{BenchError, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};
use xpreempt_cuda::Kernel;
use xpreempt_cuda::native::{Event, Stream};

/// Requests sent before measuring: the first launches pay for module loading and stream setup.
const WARMUP: usize = 5;

/// The LC side's arrival seed: every LC variant sees the same sequence of gaps.
pub const LC_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// One latency-critical client: its requests, how they are submitted and what is kept.
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
    /// Submit through an XQueue registered with `xpreemptd` through this process's agent.
    #[serde(default)]
    pub agent: Option<AgentSpec>,
    /// Without an agent: submit through an XQueue of this process that nobody schedules, which
    /// measures the queue's own cost on the request apart from any scheduler's.
    #[serde(default)]
    pub unscheduled_queue: bool,
    /// Write each request's start and end, and the queue's marks, to this file.
    #[serde(default)]
    pub marks: Option<PathBuf>,
    /// Keep each request's latency in the result ([`crate::roles::LcResult::samples_us`]): a distribution
    /// to pool over runs without the marks' own cost on the request.
    #[serde(default)]
    pub samples: bool,
}

/// Pseudo-random gaps, uniform in `[min_us, max_us]` (xorshift64: cheap, and the same sequence
/// on every run and machine).
#[derive(Clone, Debug)]
pub struct Arrivals {
    state: u64,
    min_us: u64,
    span: u64,
}

impl Arrivals {
    pub fn new(seed: u64, min_us: u64, max_us: u64) -> Result<Self> {
        if max_us < min_us {
            return Err(BenchError::Spec(format!(
                "the longest gap ({max_us} µs) is shorter than the shortest ({min_us} µs)"
            )));
        }
        Ok(Self {
            // Zero is xorshift's fixed point.
            state: seed.max(1),
            min_us,
            // The whole u64 range would need one more: a span one short of it is the same in practice.
            span: (max_us - min_us).saturating_add(1),
        })
    }

    pub fn next_us(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.min_us + self.state % self.span
    }

    pub fn next_gap(&mut self) -> Duration {
        Duration::from_micros(self.next_us())
    }
}

/// Where the LC side's requests go.
pub enum LcTarget<'a> {
    /// Native launches on a stream of this process, with timing events around each request when
    /// its GPU duration is marked.
    Stream(Stream, Option<(Event, Event)>),
    /// Through an XQueue (local, under the local scheduler, or registered with the daemon).
    Queue(&'a BenchQueue),
}

impl LcTarget<'_> {
    /// One request: `n` launches of `k`, complete when the last one is. A plain stream's
    /// launches are marked here (a queue's, by its hardware queue; here, each submission's
    /// return).
    pub fn request(&self, k: &Kernel, n: u32, marks: Option<&Marks>) -> Result<()> {
        match self {
            LcTarget::Stream(s, timing) => {
                let mark = |what| {
                    if let Some(m) = marks {
                        m.mark(what)
                    }
                };
                if let Some((a, _)) = timing {
                    s.record(a)?;
                }
                for _ in 0..n {
                    mark(What::Launch);
                    s.launch(k)?;
                    mark(What::LaunchEnd);
                }
                if let Some((_, b)) = timing {
                    s.record(b)?;
                }
                s.sync()?;
                if let (Some((a, b)), Some(m)) = (timing, marks) {
                    m.value(What::GpuElapsed, (b.elapsed_us(a)? * 1e3) as u64);
                }
                Ok(())
            }
            LcTarget::Queue(q) => {
                let mut last = None;
                for _ in 0..n {
                    last = Some(crate::queue::submit_kernel(q, k)?);
                    if let Some(m) = marks {
                        m.mark(What::Submitted);
                    }
                }
                match last {
                    Some(seq) => q.wait(seq).map_err(BenchError::Wait),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Runs `spec`'s request loop around `request` and returns the request latencies (µs), in the
/// order the requests were made.
///
/// Warm-up, then (unless alone) waits for the BE side through `ctl`; the measuring window is
/// `ctl.phase` 1, and phase 2 (set even when a request fails, so that the BE side stops) ends it.
/// With `spec.signal` each request is bracketed by `ctl.lc_active` (the benchmark's own
/// controller suspends the BE side meanwhile).
pub fn request_loop(
    spec: &LcSpec,
    ctl: &Control,
    marks: Option<&Marks>,
    mut request: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    spec.validate()?;
    let mut arrivals = Arrivals::new(LC_SEED, spec.gap_min_us, spec.gap_max_us)?;
    let measured = (|| -> Result<Vec<f64>> {
        for _ in 0..WARMUP {
            request()?;
        }
        if !spec.alone {
            ctl.wait_for_be(Control::BE_START_PATIENCE)?;
        }
        ctl.phase.store(1, Release);
        let end = Instant::now() + crate::run_length(spec.secs)?;
        let mut lat = Vec::new();
        while Instant::now() < end {
            std::thread::sleep(arrivals.next_gap());
            if spec.signal {
                ctl.lc_active.store(1, Release);
            }
            let mark = |what| {
                if let Some(m) = marks {
                    m.mark(what)
                }
            };
            mark(What::RequestStart);
            let t0 = Instant::now();
            request()?;
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
            mark(What::RequestEnd);
            if spec.signal {
                ctl.lc_active.store(0, Release);
            }
        }
        Ok(lat)
    })();
    ctl.lc_active.store(0, Release);
    ctl.phase.store(2, Release);
    measured
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Summary;

    fn spec(secs: f64, signal: bool) -> LcSpec {
        LcSpec {
            stream_priority: 0,
            kernels: 1,
            blocks: 1,
            kernel_us: 1.0,
            gap_min_us: 20,
            gap_max_us: 60,
            secs,
            signal,
            timeslice_us: None,
            alone: true,
            agent: None,
            unscheduled_queue: false,
            marks: None,
            samples: false,
        }
    }

    fn spin(us: u64) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(us) {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn arrivals_stay_in_range_and_repeat() {
        let mut a = Arrivals::new(LC_SEED, 1000, 3000).expect("valid range");
        let gaps: Vec<u64> = (0..1000).map(|_| a.next_us()).collect();
        assert!(gaps.iter().all(|g| (1000..=3000).contains(g)));
        // Spread over the range, not stuck.
        assert!(gaps.iter().any(|&g| g < 1200) && gaps.iter().any(|&g| g > 2800));
        let mut b = Arrivals::new(LC_SEED, 1000, 3000).expect("valid range");
        assert!(gaps.iter().all(|&g| g == b.next_us()));
        let mut fixed = Arrivals::new(0, 7, 7).expect("a single value is a range");
        assert_eq!(fixed.next_us(), 7);
        assert!(Arrivals::new(LC_SEED, 10, 9).is_err());
        let mut wide = Arrivals::new(LC_SEED, 0, u64::MAX).expect("the widest range");
        wide.next_us();
    }

    #[test]
    fn the_loop_reports_the_synthetic_latencies() {
        // One request in ten takes 2 ms, the others 100 µs.
        let ctl = Control::default();
        let mut i = 0u32;
        let lat = request_loop(&spec(0.15, false), &ctl, None, || {
            i += 1;
            spin(if i.is_multiple_of(10) { 2000 } else { 100 });
            Ok(())
        })
        .expect("loop runs");
        // In the order made: measured request k is the loop's (k + WARMUP + 1)th.
        let slow = |k: usize| (k + WARMUP + 1).is_multiple_of(10);
        assert!(
            lat.iter()
                .enumerate()
                .all(|(k, &us)| !slow(k) || us >= 2000.0),
            "{lat:?}"
        );
        let s = Summary::of(lat);
        assert!(s.n >= 10, "{s:?}");
        assert_eq!(i as usize, s.n + WARMUP);
        assert!(s.p50 >= 100.0 && s.p50 < 2000.0, "{s:?}");
        assert!(s.p99 >= 2000.0 && s.max >= 2000.0, "{s:?}");
        assert!(s.mean > s.p50 && s.mean < s.max, "{s:?}");
        assert_eq!(ctl.phase.load(Acquire), 2);
    }

    #[test]
    fn signal_brackets_each_measured_request() {
        let ctl = Control::default();
        let mut seen = Vec::new();
        request_loop(&spec(0.02, true), &ctl, None, || {
            seen.push((ctl.phase.load(Acquire), ctl.lc_active.load(Acquire)));
            Ok(())
        })
        .expect("loop runs");
        assert!(seen[..WARMUP].iter().all(|&s| s == (0, 0)), "{seen:?}");
        assert!(seen.len() > WARMUP);
        assert!(seen[WARMUP..].iter().all(|&s| s == (1, 1)), "{seen:?}");
        assert_eq!(ctl.lc_active.load(Acquire), 0);
    }

    #[test]
    fn a_failed_request_ends_the_window_and_is_returned() {
        let ctl = Control::default();
        let mut calls = 0;
        let r = request_loop(&spec(5.0, true), &ctl, None, || {
            calls += 1;
            if calls == WARMUP + 3 {
                Err(BenchError::Panicked("synthetic"))
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(BenchError::Panicked("synthetic"))));
        // The BE side is told to stop and is not left suspended.
        assert_eq!(ctl.phase.load(Acquire), 2);
        assert_eq!(ctl.lc_active.load(Acquire), 0);
    }

    #[test]
    fn bad_specs_are_errors_not_panics() {
        let ctl = Control::default();
        let mut s = spec(0.01, false);
        s.gap_max_us = 1;
        assert!(matches!(
            request_loop(&s, &ctl, None, || Ok(())),
            Err(BenchError::Spec(_))
        ));
        for secs in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let s = spec(secs, false);
            assert!(
                request_loop(&s, &ctl, None, || Ok(())).is_err(),
                "secs {secs}"
            );
        }
        let mut s = spec(0.01, false);
        s.kernels = 0;
        assert!(request_loop(&s, &ctl, None, || Ok(())).is_err());
    }
}
