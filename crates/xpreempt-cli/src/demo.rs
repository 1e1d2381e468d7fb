//! A two-queue demo on the reference backend: a best-effort queue full of long kernels, and a
//! latency-critical burst that arrives while it runs, under no scheduling and under each level.
//! Everything runs on a virtual clock, so the output is the same on every machine.

use crate::output::Output;
use anyhow::{Context, Result};
use serde::Serialize;
use xpreempt_core::reference::{RefDevice, RefKernel, RefQueue};
use xpreempt_core::scheduler::{Action, QueueInfo, SchedEvent, Scheduler};
use xpreempt_core::stats::Report;
use xpreempt_core::xqueue::QueueEvent;
use xpreempt_core::{Command, CommandProps, HwQueue, Level, Nanos, QueueConfig, QueueId, XQueue};

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
    report: Report,
}

#[derive(Serialize)]
struct DemoResult {
    policy: String,
    lc_alone_us: f64,
    modes: Vec<ModeResult>,
}

struct Lane {
    hal: RefQueue,
    queue: XQueue<RefKernel>,
}

impl Lane {
    fn submit(&mut self, command: Command<RefKernel>, now: Nanos) -> Result<Option<QueueEvent>> {
        Ok(self.queue.submit(&self.hal, command, now)?.event)
    }
}

pub fn run(out: &Output, args: &Args) -> Result<()> {
    let config = |level| QueueConfig::new(args.threshold, args.batch, level);
    config(Level::Lv1).context("bad --threshold/--batch")?;
    xpreempt_core::policy::by_name(&args.policy)?;
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
    policy: &str,
) -> Result<ModeResult> {
    let dev = RefDevice::new();
    let hw_level = level.unwrap_or(Level::Lv1);
    let mut lanes: Vec<Lane> = (0..2)
        .map(|i| {
            let hal = dev.create_queue(hw_level);
            Lane {
                queue: XQueue::new(QueueId(i), cfg, hal.max_level()),
                hal,
            }
        })
        .collect();
    let mut sched =
        level.map(|_| Scheduler::new(xpreempt_core::policy::by_name(policy).expect("checked")));
    if let Some(s) = sched.as_mut() {
        s.handle(0, SchedEvent::Created(QueueInfo::new(QueueId(0), 0)))?;
        s.handle(0, SchedEvent::Created(QueueInfo::new(QueueId(1), 10)))?;
    }
    let kernel = |blocks, block_ns| {
        Command::kernel(RefKernel { blocks, block_ns })
            .with_props(CommandProps::new(true, true, false))
    };
    let mut events = Vec::new();
    for _ in 0..BE_KERNELS {
        events.extend(
            lanes[0]
                .submit(kernel(BE_BLOCKS, BE_BLOCK_NS), 0)?
                .map(|e| (0, e)),
        );
    }
    let mut now = 0;
    let mut lc_submitted = false;
    let mut lc_done = None;
    let mut be_done = None;
    loop {
        for (i, e) in events.drain(..) {
            let Some(s) = sched.as_mut() else { continue };
            let ev = match e {
                QueueEvent::Ready => SchedEvent::Ready {
                    queue: QueueId(i),
                    pending: lanes[i as usize].queue.pending_len(),
                },
                QueueEvent::Idle => SchedEvent::Idle(QueueId(i)),
            };
            for a in s.handle(now, ev)?.to_vec() {
                apply(&mut lanes, a, now)?;
            }
        }
        let mut next = [dev.next_event(), sched.as_ref().and_then(|s| s.next_wake())]
            .into_iter()
            .flatten()
            .min();
        if !lc_submitted {
            next = Some(next.map_or(LC_ARRIVAL_NS, |n| n.min(LC_ARRIVAL_NS)));
        }
        let Some(t) = next else { break };
        now = t;
        dev.advance_to(now);
        if !lc_submitted && now >= LC_ARRIVAL_NS {
            lc_submitted = true;
            for _ in 0..LC_KERNELS {
                events.extend(
                    lanes[1]
                        .submit(kernel(1, LC_BLOCK_NS), now)?
                        .map(|e| (1, e)),
                );
            }
        }
        if let Some(s) = sched.as_mut()
            && s.next_wake().is_some_and(|w| w <= now)
        {
            for a in s.handle(now, SchedEvent::Timer)?.to_vec() {
                apply(&mut lanes, a, now)?;
            }
        }
        for (i, lane) in lanes.iter_mut().enumerate() {
            if let Some(e) = lane.queue.poll(&lane.hal, now)? {
                events.push((i as u32, e));
            }
        }
        if lc_submitted && lc_done.is_none() && lanes[1].queue.is_idle() {
            lc_done = Some(now);
        }
        if be_done.is_none() && lanes[0].queue.is_idle() {
            be_done = Some(now);
        }
    }
    let exactly_once = lanes.iter().all(|l| {
        l.queue.completed() == l.queue.next_seq()
            && (0..l.queue.next_seq()).all(|s| {
                let runs = dev.block_runs(&l.hal, s);
                !runs.is_empty() && runs.iter().all(|&r| r == 1)
            })
    });
    let sched_stats = sched
        .as_ref()
        .map(|s| s.stats().clone())
        .unwrap_or_default();
    Ok(ModeResult {
        mode: name.to_string(),
        lc_latency_us: (lc_done.unwrap_or(now) - LC_ARRIVAL_NS) as f64 / 1e3,
        be_makespan_us: be_done.unwrap_or(now) as f64 / 1e3,
        exactly_once,
        report: Report::new(
            sched_stats,
            lanes.iter().map(|l| (l.queue.id(), l.queue.stats())),
        ),
    })
}

fn apply(lanes: &mut [Lane], action: Action, now: Nanos) -> Result<()> {
    match action {
        Action::Suspend(q) => {
            let l = &mut lanes[q.0 as usize];
            l.queue.suspend(&l.hal, now)?;
        }
        Action::Resume(q) => {
            let l = &mut lanes[q.0 as usize];
            l.queue.resume(&l.hal, now)?;
        }
        Action::Refuse(q) => tracing::info!(queue = %q, "admission refused"),
        Action::Admit(q) => tracing::info!(queue = %q, "admitted again"),
    }
    Ok(())
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
