//! A two-queue demo on the reference backend: a best-effort queue full of long kernels, and a
//! latency-critical burst that arrives while it runs, under no scheduling and under each level.
//! Everything runs on a virtual clock, so the output is the same on every machine.

use crate::output::Output;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeSet;
use xpreempt_core::policy::{self, Decision, Policy, View};
use xpreempt_core::sched::{Driver, QueueInfo, Scheduler};
use xpreempt_core::stats::StatsReport;
use xpreempt_core::xqueue::BoundQueue;
use xpreempt_core::{Command, CommandProps, HwQueue, Level, Nanos, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue};

#[derive(clap::Args)]
pub struct Args {
    /// Scheduling policy.
    #[arg(long, default_value = "hpf")]
    policy: String,
    /// Most commands in flight per queue.
    #[arg(long, default_value_t = xpreempt_core::xqueue::DEFAULT_THRESHOLD)]
    threshold: u32,
    /// A sync point every this many commands.
    #[arg(long, default_value_t = xpreempt_core::xqueue::DEFAULT_BATCH)]
    batch: u32,
}

const BE_KERNELS: usize = 200;
const BE_BLOCKS: u32 = 4;
const BE_BLOCK_NS: Nanos = 250_000;
const LC_ARRIVAL_NS: Nanos = 5_000_000;
const LC_KERNELS: usize = 10;
const LC_BLOCK_NS: Nanos = 50_000;

#[derive(Serialize)]
struct ModeResult {
    mode: String,
    lc_latency_us: f64,
    be_makespan_us: f64,
    exactly_once: bool,
    report: StatsReport,
}

#[derive(Serialize)]
struct DemoResult {
    policy: String,
    lc_alone_us: f64,
    modes: Vec<ModeResult>,
}

/// Without xpreempt: every queue may always run, so nothing is ever suspended.
struct Unscheduled;

impl Policy for Unscheduled {
    fn name(&self) -> &'static str {
        "none"
    }

    fn decide(&mut self, view: &View<'_>) -> Decision {
        Decision {
            run: view.queues.iter().map(|q| q.id).collect::<BTreeSet<_>>(),
            wake_at: None,
        }
    }
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    let config = |level| QueueConfig::new(args.threshold, args.batch, level);
    config(Level::Lv1).context("bad --threshold/--batch")?;
    policy::by_name(&args.policy)?;
    let lc_alone = LC_KERNELS as f64 * LC_BLOCK_NS as f64 / 1e3;
    let mut modes = Vec::new();
    for (name, level) in [
        ("none", None),
        ("lv1", Some(Level::Lv1)),
        ("lv2", Some(Level::Lv2)),
        ("lv3", Some(Level::Lv3)),
    ] {
        // Without xpreempt the application launches everything at once.
        let cfg = match level {
            Some(l) => config(l)?,
            None => QueueConfig::new(
                BE_KERNELS as u32,
                args.batch.min(BE_KERNELS as u32),
                Level::Lv1,
            )?,
        };
        modes.push(simulate(name, level, cfg, &args.policy)?);
    }
    let result = DemoResult {
        policy: args.policy.clone(),
        lc_alone_us: lc_alone,
        modes,
    };
    out.emit(&result, || table(&result))
}

fn simulate(
    name: &str,
    level: Option<Level>,
    cfg: QueueConfig,
    policy_name: &str,
) -> Result<ModeResult> {
    let dev = RefDevice::new();
    let policy: Box<dyn Policy> = match level {
        Some(_) => policy::by_name(policy_name)?,
        None => Box::new(Unscheduled),
    };
    let mut driver: Driver<BoundQueue<RefQueue>> = Driver::new(Scheduler::new(policy));
    let (be, lc) = (QueueId(0), QueueId(1));
    for (id, priority) in [(be, 0), (lc, 10)] {
        let hal = dev.create_queue(level.unwrap_or(Level::Lv1));
        let queue = BoundQueue::new(XQueue::new(id, cfg, hal.max_level()), hal);
        driver.register(QueueInfo::new(id, priority), queue, &|| 0)?;
    }
    let kernel = |blocks, block_ns| {
        Command::kernel(RefKernel { blocks, block_ns })
            .with_props(CommandProps::new(true, true, false))
    };
    for _ in 0..BE_KERNELS {
        driver.submit(be, kernel(BE_BLOCKS, BE_BLOCK_NS), &|| 0)?;
    }
    let mut now = 0;
    let mut lc_submitted = false;
    let mut lc_done = None;
    let mut be_done = None;
    let idle =
        |d: &Driver<BoundQueue<RefQueue>>, id| d.queue(id).is_some_and(|q| q.queue().is_idle());
    loop {
        let mut next = [dev.next_event(), driver.next_wake()]
            .into_iter()
            .flatten()
            .min();
        if !lc_submitted {
            next = Some(next.map_or(LC_ARRIVAL_NS, |n| n.min(LC_ARRIVAL_NS)));
        }
        let Some(t) = next else { break };
        now = t;
        dev.advance_to(now);
        let clock = || now;
        if !lc_submitted && now >= LC_ARRIVAL_NS {
            lc_submitted = true;
            for _ in 0..LC_KERNELS {
                driver.submit(lc, kernel(1, LC_BLOCK_NS), &clock)?;
            }
        }
        driver.timer(&clock)?;
        for id in [be, lc] {
            driver.poll(id, &clock)?;
        }
        if lc_submitted && lc_done.is_none() && idle(&driver, lc) {
            lc_done = Some(now);
        }
        if be_done.is_none() && idle(&driver, be) {
            be_done = Some(now);
        }
    }
    let exactly_once = driver.queues().all(|(_, q)| {
        let (xq, hal) = (q.queue(), q.hal());
        xq.completed() == xq.next_seq()
            && (0..xq.next_seq()).all(|s| {
                let runs = dev.block_runs(hal, s);
                !runs.is_empty() && runs.iter().all(|&r| r == 1)
            })
    });
    Ok(ModeResult {
        mode: name.to_string(),
        lc_latency_us: (lc_done.unwrap_or(now) - LC_ARRIVAL_NS) as f64 / 1e3,
        be_makespan_us: be_done.unwrap_or(now) as f64 / 1e3,
        exactly_once,
        report: StatsReport::new(
            driver.scheduler().stats().clone(),
            driver.queues().map(|(id, q)| (id, q.queue().stats())),
        ),
    })
}

fn table(r: &DemoResult) -> String {
    let mut s = format!(
        "reference backend, policy {}: BE = {BE_KERNELS} kernels x {BE_BLOCKS} blocks x {} us; LC = {LC_KERNELS} kernels x {} us arriving at {} ms (alone: {:.0} us)\n\n",
        r.policy,
        BE_BLOCK_NS / 1000,
        LC_BLOCK_NS / 1000,
        LC_ARRIVAL_NS / 1_000_000,
        r.lc_alone_us
    );
    s.push_str(&format!(
        "{:<6} {:>14} {:>16} {:>12} {:>16} {:>13}\n",
        "mode", "LC latency us", "BE makespan us", "preemptions", "suspend p99 us", "exactly once"
    ));
    for m in &r.modes {
        s.push_str(&format!(
            "{:<6} {:>14.0} {:>16.0} {:>12} {:>16.1} {:>13}\n",
            m.mode,
            m.lc_latency_us,
            m.be_makespan_us,
            m.report.scheduler.preemptions,
            m.report.suspend_latency_ns.p99 as f64 / 1e3,
            if m.exactly_once { "yes" } else { "NO" }
        ));
    }
    s
}
