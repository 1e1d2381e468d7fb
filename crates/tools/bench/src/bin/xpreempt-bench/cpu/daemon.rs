//! `xpreempt-bench daemon`: how long global mode takes to decide, on any machine (no GPU).
//!
//! The measured path is the product's: a high-priority queue in one agent submits (its Ready goes
//! into shared memory and rings the daemon), `xpreemptd` (a separate process) decides, and the
//! agent holding a busy low-priority queue applies the Suspend — the time to its hardware
//! queue's `deactivate` is the sample. The two measuring agents live in this process (each with
//! its own segment, doorbells and control thread, as in two processes); the other clients are
//! separate processes whose queues (on another device, so they never preempt the measured pair)
//! come and go with short bursts: they load the daemon with decisions of their own.

use super::{
    Daemon, Guard, Held, HeldHal, Percentiles, Release, agent, command, decl, next_random, wait_for,
};
use crate::output::Output;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Command as Proc, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::{Command, HalError, HwQueue, Level, QueueConfig, Seq};

#[derive(clap::Args)]
pub struct Args {
    /// Client processes in all, the two measuring agents included (at least 2).
    #[arg(long, default_value_t = 2)]
    clients: u32,
    /// Decisions to measure.
    #[arg(long, default_value_t = 2000)]
    samples: u32,
    /// How long the agents' control threads spin before sleeping (µs).
    #[arg(long, default_value_t = 0)]
    agent_spin_us: u64,
    /// How long an agent whose queue a higher one may preempt keeps spinning after the last
    /// such preemption (µs; 0: never spins longer than --agent-spin-us).
    #[arg(long, default_value_t = 50_000)]
    agent_hot_us: u64,
    /// How long to watch the idle daemon's CPU use (s).
    #[arg(long, default_value_t = 3.0)]
    idle_secs: f64,
    /// Write the JSON result here too.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Serialize)]
struct Result_ {
    clients: u32,
    samples: usize,
    agent_spin_us: u64,
    agent_hot_us: u64,
    ready_to_suspend_us: Percentiles,
    daemon_cpu_idle_pct: f64,
    daemon_cpu_load_pct: f64,
    path: &'static str,
}

/// A hardware queue whose commands each take `work` after their launch: long enough for the
/// daemon to see the queue busy (a shorter burst is over before it matters).
struct Timed {
    work: Duration,
    launched: Mutex<Vec<Instant>>,
}

impl Timed {
    fn new(work: Duration) -> Self {
        Self {
            work,
            launched: Mutex::new(Vec::new()),
        }
    }
}

impl HwQueue for Timed {
    type Payload = ();
    fn max_level(&self) -> Level {
        Level::Lv1
    }
    fn launch(&self, _: Seq, _: &mut Command<()>, _: bool) -> Result<(), HalError> {
        let mut l = self.launched.lock().unwrap_or_else(|p| p.into_inner());
        let start = l
            .last()
            .map_or(Instant::now(), |&prev| prev.max(Instant::now()));
        l.push(start + self.work);
        Ok(())
    }
    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }
    fn completed(&self) -> Seq {
        let now = Instant::now();
        let l = self.launched.lock().unwrap_or_else(|p| p.into_inner());
        l.iter().take_while(|&&done| done <= now).count() as Seq
    }
    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        let due = {
            let l = self.launched.lock().unwrap_or_else(|p| p.into_inner());
            upto.checked_sub(1).and_then(|i| l.get(i as usize).copied())
        };
        if let Some(due) = due {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        Ok(())
    }
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    if args.clients < 2 || args.samples == 0 {
        bail!("--clients must be at least 2 and --samples at least 1");
    }
    let daemon = Daemon::start("daemon", &[])?;
    let socket = daemon.socket.clone();
    let exe = std::env::current_exe()?;
    let idle = cpu_pct(daemon.pid(), Duration::from_secs_f64(args.idle_secs))?;
    let mut others = Vec::new();
    for i in 0..args.clients - 2 {
        others.push(Guard(
            Proc::new(&exe)
                .args([
                    "client",
                    "--priority",
                    &(i as i32 % 3).to_string(),
                    "--socket",
                ])
                .arg(&socket)
                .stdout(Stdio::null())
                .spawn()
                .context("starting a client process")?,
        ));
    }
    let (spin, hot) = (args.agent_spin_us, args.agent_hot_us);
    let (low_agent, high_agent) = (
        agent(&socket, "bench-low", spin, hot)?,
        agent(&socket, "bench-high", spin, hot)?,
    );
    let busy = Arc::new(Held::default());
    let epoch = Instant::now();
    let low = low_agent.queue(
        decl(0, 0, Level::Lv2),
        QueueConfig::new(4, 2, Level::Lv2)?,
        HeldHal {
            held: busy.clone(),
            epoch,
            level: Level::Lv2,
        },
    )?;
    // Declared after `low`, so dropped first on any exit: lets the low queue's watcher go.
    let _release = Release(busy.clone());
    // The high queue stays busy until its sample is taken, however long a loaded machine takes
    // to suspend the low one.
    let gate = Arc::new(Held::default());
    let high = high_agent.queue(
        decl(0, 100, Level::Lv1),
        QueueConfig::new(4, 2, Level::Lv1)?,
        HeldHal {
            held: gate.clone(),
            epoch,
            level: Level::Lv1,
        },
    )?;
    let _finish = Release(gate.clone());
    low.submit(command()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cpu_before = cpu_ticks(daemon.pid())?;
    let started = Instant::now();
    let mut samples = Vec::with_capacity(args.samples as usize);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..args.samples {
        // The low queue runs (not suspended) before each sample.
        wait_for(|| !low.is_suspended(), "the low queue to be resumed")?;
        busy.stopped_at.store(0, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(200 + next_random(&mut rng) % 300));
        let t0 = epoch.elapsed().as_nanos() as u64;
        high.submit(command()).map_err(|e| anyhow::anyhow!("{e}"))?;
        wait_for(
            || busy.stopped_at.load(Ordering::SeqCst) != 0,
            "the low queue's suspension",
        )
        .with_context(|| format!("sample {i}"))?;
        let t1 = busy.stopped_at.load(Ordering::SeqCst);
        // The high queue goes idle; the low one is resumed before the next sample.
        gate.finish();
        if t1 < t0 {
            bail!("the low queue was suspended by something else than the measured submission");
        }
        samples.push((t1 - t0) as f64 / 1e3);
        if i % 500 == 499 {
            tracing::info!("{} / {} decisions", i + 1, args.samples);
        }
    }
    let load_secs = started.elapsed().as_secs_f64();
    let load = ticks_pct(cpu_ticks(daemon.pid())? - cpu_before, load_secs);
    drop((_finish, _release, low, high, low_agent, high_agent, others));
    drop(daemon);
    let ready_to_suspend_us = Percentiles::of(&mut samples).context("no samples")?;
    let r = Result_ {
        clients: args.clients,
        samples: samples.len(),
        agent_spin_us: args.agent_spin_us,
        agent_hot_us: args.agent_hot_us,
        ready_to_suspend_us,
        daemon_cpu_idle_pct: idle,
        daemon_cpu_load_pct: load,
        path: "scheduler (xpreemptd; the fast path: the agents of one user stop preempted queues through their board, the daemon confirms)",
    };
    if let Some(p) = &args.out {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    out.emit(&r, || {
        format!(
            "daemon decision latency, {} clients, agents spinning {} µs (hot {} µs), {} samples\nReady -> remote Suspend applied: p50 {:.1} µs  p99 {:.1} µs  p99.9 {:.1} µs  max {:.1} µs\ndaemon CPU: idle {:.2} % of a core, under load {:.1} %\n",
            r.clients,
            r.agent_spin_us,
            r.agent_hot_us,
            r.samples,
            r.ready_to_suspend_us.p50,
            r.ready_to_suspend_us.p99,
            r.ready_to_suspend_us.p999,
            r.ready_to_suspend_us.max,
            r.daemon_cpu_idle_pct,
            r.daemon_cpu_load_pct
        )
    })
}

/// user + system CPU ticks of a process.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(get(11) + get(12))
}

fn ticks_pct(ticks: u64, secs: f64) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz / secs * 100.0
}

fn cpu_pct(pid: u32, over: Duration) -> Result<f64> {
    let before = cpu_ticks(pid)?;
    std::thread::sleep(over);
    Ok(ticks_pct(cpu_ticks(pid)? - before, over.as_secs_f64()))
}

#[derive(clap::Args)]
pub struct ClientArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, allow_hyphen_values = true)]
    priority: i32,
}

/// A background client of the benchmark: one queue that gets a short burst every 10 ms.
pub fn client(args: &ClientArgs) -> Result<()> {
    let a = agent(&args.socket, "bench-client", 20, 50_000)?;
    let q = a.queue(
        decl(1, args.priority, Level::Lv1),
        QueueConfig::new(4, 2, Level::Lv1)?,
        Timed::new(Duration::from_micros(500)),
    )?;
    loop {
        q.submit(command()).map_err(|e| anyhow::anyhow!("{e}"))?;
        std::thread::sleep(Duration::from_millis(10));
    }
}
