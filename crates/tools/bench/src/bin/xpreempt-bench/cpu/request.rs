//! `xpreempt-bench request`: what the stack adds to a latency-critical request, on any machine.
//!
//! A request is `--launches` commands on a stand-in GPU (each command runs `--kernel-us` after
//! the one before; a launch call spins `--launch-us`, as a driver's call takes time), then a
//! wait for the last one. The same requests go through each path:
//! - `native`: the stand-in's own calls, nothing of xpreempt;
//! - `queue`: an XQueue with no scheduler;
//! - `local`: an agent with no daemon (the in-process scheduler), beside a busy best-effort
//!   queue of the same process that each request preempts;
//! - `daemon`: two agents (as two processes) and a private `xpreemptd`;
//! - `local-alone`, `daemon-alone`: the same with no best-effort queue (LC alone through the
//!   stack).
//!
//! Per request it stamps when the first launch call began, when the last submission returned
//! (the submitting thread's own cost), when the wait returned, and when the best-effort queue's
//! hardware stop was called.

use super::{
    Daemon, Held, HeldHal, Percentiles, Release, agent, command, decl, next_random, wait_for,
    wait_for_within,
};
use crate::output::Output;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Options};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command, HalError, HwQueue, Level, QueueConfig, QueueId, Seq, XQueue};

const PATHS: [&str; 6] = [
    "native",
    "queue",
    "local-alone",
    "local",
    "daemon-alone",
    "daemon",
];

#[derive(clap::Args)]
pub struct Args {
    /// Comma-separated paths: native, queue, local-alone, local, daemon-alone, daemon.
    #[arg(
        long,
        default_value = "native,queue,local-alone,local,daemon-alone,daemon"
    )]
    paths: String,
    /// Requests per path.
    #[arg(long, default_value_t = 2000)]
    requests: u32,
    /// Launches per request.
    #[arg(long, default_value_t = 10)]
    launches: u32,
    /// How long each stand-in kernel runs (µs).
    #[arg(long, default_value_t = 5.0)]
    kernel_us: f64,
    /// How long each launch call takes (µs, spinning).
    #[arg(long, default_value_t = 2.0)]
    launch_us: f64,
    /// Write the JSON result here too.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A GPU stand-in: commands run one after another, each `kernel` long; completion is read off
/// the clock.
struct Gpu {
    launch: Duration,
    kernel: u64,
    epoch: Instant,
    /// When each launched command is done (ns since `epoch`), in launch order.
    due: Mutex<Vec<u64>>,
    /// When the first launch call since the last reset began (ns since `epoch`; 0: none yet).
    first_launch: AtomicU64,
}

impl Gpu {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

struct GpuHal(Arc<Gpu>);

thread_local! {
    /// Set on the thread that makes the requests.
    static REQUESTER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl HwQueue for GpuHal {
    type Payload = ();
    fn max_level(&self) -> Level {
        Level::Lv1
    }
    fn launch(&self, _: Seq, _: &mut Command<()>, _: bool) -> Result<(), HalError> {
        let g = &self.0;
        let start = g.now();
        let _ = g
            .first_launch
            .compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst);
        let end = start + g.launch.as_nanos() as u64;
        while g.now() < end {
            std::hint::spin_loop();
        }
        let mut due = g.due.lock().unwrap_or_else(|p| p.into_inner());
        let begin = due.last().map_or(end, |&prev| prev.max(end));
        due.push(begin + g.kernel);
        Ok(())
    }
    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }
    fn completed(&self) -> Seq {
        let now = self.0.now();
        let due = self.0.due.lock().unwrap_or_else(|p| p.into_inner());
        due.partition_point(|&d| d <= now) as Seq
    }
    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        let due = {
            let due = self.0.due.lock().unwrap_or_else(|p| p.into_inner());
            upto.checked_sub(1)
                .and_then(|i| due.get(i as usize).copied())
        };
        if let Some(t) = due {
            let left = t.saturating_sub(self.0.now());
            if REQUESTER.get() {
                // The application's wait spins, as a CUDA stream synchronize does.
                while self.0.now() < t {
                    std::thread::yield_now();
                }
            } else {
                // xpreempt's completion watcher blocks, as on a blocking-sync event.
                std::thread::sleep(Duration::from_nanos(left));
            }
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct PathResult {
    path: &'static str,
    requests: usize,
    /// Request start to the first launch call.
    first_launch_us: Percentiles,
    /// Request start to the return of its last submission.
    launches_us: Percentiles,
    /// Request start to the return of its wait.
    request_us: Percentiles,
    /// Request start to the best-effort queue's hardware stop (paths with one).
    be_stop_us: Option<Percentiles>,
    /// How long the requesting thread waited for a CPU while runnable, per request (its gap
    /// included; from /proc/thread-self/schedstat): what the path's other threads cost it on a
    /// machine with few cores.
    runnable_not_running_us_per_request: Option<f64>,
    /// Requests during which the best-effort queue was not stopped (paths with one).
    be_not_stopped: Option<u32>,
}

#[derive(Serialize)]
struct Result_ {
    launches: u32,
    kernel_us: f64,
    launch_us: f64,
    paths: Vec<PathResult>,
    what: &'static str,
}

/// The request's side of a path: how it submits and waits.
enum Lc {
    Native(GpuHal),
    Queue(Arc<SharedXQueue<GpuHal>>),
}

impl Lc {
    /// Submits `n` commands and waits for the last; returns when (ns since the stand-in's
    /// epoch) the last submission returned.
    fn request(&self, gpu: &Gpu, n: u32) -> Result<u64> {
        match self {
            Lc::Native(hal) => {
                let mut next = hal.0.due.lock().unwrap_or_else(|p| p.into_inner()).len() as Seq;
                for _ in 0..n {
                    hal.launch(next, &mut command(), false)?;
                    next += 1;
                }
                let launched = gpu.now();
                hal.synchronize(next)?;
                Ok(launched)
            }
            Lc::Queue(q) => {
                let mut last = 0;
                for _ in 0..n {
                    last = q.submit(command()).map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                let launched = gpu.now();
                q.wait(last)?;
                Ok(launched)
            }
        }
    }
}

/// One path set up: the request's queue, the best-effort queue it preempts (if any), and what
/// must outlive them.
struct Setup {
    lc: Lc,
    gpu: Arc<Gpu>,
    be: Option<(Arc<Held>, Arc<SharedXQueue<HeldHal>>)>,
    _keep: Vec<Box<dyn std::any::Any>>,
}

fn gpu(args: &Args) -> Arc<Gpu> {
    Arc::new(Gpu {
        launch: Duration::from_secs_f64(args.launch_us / 1e6),
        kernel: (args.kernel_us * 1e3) as u64,
        epoch: Instant::now(),
        due: Mutex::new(Vec::new()),
        first_launch: AtomicU64::new(0),
    })
}

/// The request's queue never buffers: the highest queue is not throttled.
fn lc_config() -> Result<QueueConfig> {
    Ok(xpreempt_bench::queue::with_env_overrides(QueueConfig::new(
        64,
        32,
        Level::Lv1,
    )?))
}

fn setup(path: &str, args: &Args) -> Result<Setup> {
    let g = gpu(args);
    let (lc_agent, be_agent, daemon) = match path.trim_end_matches("-alone") {
        "native" => {
            return Ok(Setup {
                lc: Lc::Native(GpuHal(g.clone())),
                gpu: g,
                be: None,
                _keep: Vec::new(),
            });
        }
        "queue" => {
            let q = SharedXQueue::new(
                XQueue::new(QueueId(0), lc_config()?, Level::Lv1),
                GpuHal(g.clone()),
                None,
            );
            return Ok(Setup {
                lc: Lc::Queue(Arc::new(q)),
                gpu: g,
                be: None,
                _keep: Vec::new(),
            });
        }
        "local" => {
            let nowhere = std::env::temp_dir().join(format!(
                "xpreempt-bench-request-{}-no-daemon.sock",
                std::process::id()
            ));
            let a = Arc::new(Agent::start(Options {
                socket: nowhere,
                name: "bench-request".into(),
                ..Options::default()
            })?);
            if a.is_remote() {
                bail!("the local path found a daemon");
            }
            (a.clone(), a, None)
        }
        "daemon" => {
            let d = Daemon::start("request", &[])?;
            // The product's spin settings.
            let o = Options::default();
            let (spin, hot) = (o.spin.as_micros() as u64, o.hot.as_micros() as u64);
            let be = Arc::new(agent(&d.socket, "bench-request-be", spin, hot)?);
            let lc = Arc::new(agent(&d.socket, "bench-request-lc", spin, hot)?);
            (lc, be, Some(d))
        }
        other => bail!("unknown path {other:?} (known: {})", PATHS.join(", ")),
    };
    // Dropped in this order: the busy queue's work ends before its queue, the agents and the
    // daemon go.
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    let be = if path.ends_with("-alone") {
        None
    } else {
        let busy = Arc::new(Held::default());
        let be = be_agent.queue(
            decl(0, 0, Level::Lv2),
            QueueConfig::new(4, 2, Level::Lv2)?,
            HeldHal {
                held: busy.clone(),
                epoch: g.epoch,
                level: Level::Lv2,
            },
        )?;
        keep.push(Box::new(Release(busy.clone())));
        keep.push(Box::new(be.clone()));
        Some((busy, be))
    };
    let lc = lc_agent.queue(decl(0, 10, Level::Lv1), lc_config()?, GpuHal(g.clone()))?;
    if let Some((_, be)) = &be {
        be.submit(command()).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    keep.push(Box::new((lc_agent, be_agent)));
    keep.push(Box::new(daemon));
    Ok(Setup {
        lc: Lc::Queue(lc),
        gpu: g,
        be,
        _keep: keep,
    })
}

fn measure(path: &'static str, args: &Args) -> Result<PathResult> {
    let s = setup(path, args)?;
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3;
    let n = args.requests as usize;
    let (mut first, mut launched, mut done, mut stops) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut not_stopped = 0;
    REQUESTER.set(true);
    let run_delay = run_delay_ns();
    for i in 0..args.requests {
        if let Some((busy, be)) = &s.be {
            wait_for(|| !be.is_suspended(), "the best-effort queue to be resumed")?;
            busy.stopped_at.store(0, Ordering::SeqCst);
        }
        s.gpu.first_launch.store(0, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(200 + next_random(&mut rng) % 300));
        let t0 = s.gpu.now();
        let t1 =
            s.lc.request(&s.gpu, args.launches)
                .with_context(|| format!("{path}: request {i}"))?;
        let t2 = s.gpu.now();
        launched.push(us(t0, t1));
        first.push(us(t0, s.gpu.first_launch.load(Ordering::SeqCst)));
        done.push(us(t0, t2));
        if let Some((busy, _)) = &s.be {
            // A stop comes soon after the request or not at all: the best-effort queue's agent
            // may not get a core before the request is over (seen on a 2-core machine).
            if wait_for_within(
                || busy.stopped_at.load(Ordering::SeqCst) != 0,
                Duration::from_millis(20),
            ) {
                stops.push(us(t0, busy.stopped_at.load(Ordering::SeqCst)));
            } else {
                not_stopped += 1;
            }
        }
        if i % 500 == 499 {
            tracing::info!("{path}: {} / {} requests", i + 1, args.requests);
        }
    }
    let waited = run_delay_ns().zip(run_delay).map(|(after, before)| {
        after.saturating_sub(before) as f64 / 1e3 / f64::from(args.requests)
    });
    Ok(PathResult {
        path,
        requests: done.len(),
        runnable_not_running_us_per_request: waited,
        first_launch_us: Percentiles::of(&mut first).context("no requests")?,
        launches_us: Percentiles::of(&mut launched).context("no requests")?,
        request_us: Percentiles::of(&mut done).context("no requests")?,
        be_stop_us: Percentiles::of(&mut stops),
        be_not_stopped: s.be.as_ref().map(|_| not_stopped),
    })
}

/// The calling thread's time spent runnable but not running, in ns (Linux schedstat).
fn run_delay_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    if args.requests == 0 || args.launches == 0 {
        bail!("--requests and --launches must be at least 1");
    }
    if !(args.kernel_us >= 0.0 && args.launch_us >= 0.0) {
        bail!("--kernel-us and --launch-us must be zero or more");
    }
    let mut paths = Vec::new();
    for name in args
        .paths
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some(&path) = PATHS.iter().find(|&&p| p == name) else {
            bail!("unknown path {name:?} (known: {})", PATHS.join(", "));
        };
        tracing::info!("{path}: {} requests", args.requests);
        paths.push(measure(path, args)?);
    }
    if paths.is_empty() {
        bail!("no path given (known: {})", PATHS.join(", "));
    }
    let r = Result_ {
        launches: args.launches,
        kernel_us: args.kernel_us,
        launch_us: args.launch_us,
        paths,
        what: "CPU only: a stand-in GPU; the agents, local scheduler and xpreemptd are the product's",
    };
    if let Some(p) = &args.out {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    out.emit(&r, || table(&r))
}

fn table(r: &Result_) -> String {
    let mut s = format!(
        "request = {} launches ({} µs each call) of {} µs stand-in kernels, then a wait; µs from the request's start, p50 / p99; CPU wait: µs per request the requesting thread was runnable but not running\n{:<13} {:>17} {:>17} {:>17} {:>17} {:>12} {:>9}\n",
        r.launches,
        r.launch_us,
        r.kernel_us,
        "path",
        "first launch",
        "last submit",
        "request done",
        "BE stopped",
        "not stopped",
        "CPU wait"
    );
    let cell = |p: &Percentiles| format!("{:.1} / {:.1}", p.p50, p.p99);
    for p in &r.paths {
        s += &format!(
            "{:<13} {:>17} {:>17} {:>17} {:>17} {:>12} {:>9}\n",
            p.path,
            cell(&p.first_launch_us),
            cell(&p.launches_us),
            cell(&p.request_us),
            p.be_stop_us.as_ref().map_or("-".into(), cell),
            p.be_not_stopped.map_or("-".into(), |n| n.to_string()),
            p.runnable_not_running_us_per_request
                .map_or("-".into(), |w| format!("{w:.1}"))
        );
    }
    s
}
