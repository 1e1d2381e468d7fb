//! LC/BE in one process through the real local-mode scheduler: both sides are threaded XQueues
//! registered with a policy on its own thread; the LC queue's Ready/Idle reports make the
//! scheduler suspend and resume the BE queue (Lv2 guard), with stream priorities underneath.
//! The BE loop and the LC request loop are the same as in every other scenario (`roles`); only
//! the queues and who suspends them differ.

use crate::control::Control;
use crate::marks::{MarkedSink, Marks};
use crate::queue::{BenchQueue, QueueSpec, env_micros};
use crate::requests::LcTarget;
use crate::roles::{BeResult, BeSpec, LcResult, LcSpec, run_be_on, run_lc_on};
use crate::{BenchError, Env, Result};
use std::sync::Arc;
use std::time::Duration;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{DEFAULT_HOT, QueueInfo, Scheduler};
use xpreempt_core::xqueue::threaded::{EventSink, Preemptible};
use xpreempt_core::{Level, QueueId, policy};

/// Scheduler priorities of the two sides: LC above BE.
pub const BE_PRIORITY: i32 = 0;
pub const LC_PRIORITY: i32 = 10;

pub fn run_sched_pair(
    env: &Env,
    be: &BeSpec,
    lc: &LcSpec,
    policy_name: &str,
) -> Result<(LcResult, BeResult)> {
    env.device.bind()?;
    // `XP_BENCH_HOT_US=N`: how long the preemption thread spins after a preemption (0: never,
    // every stop runs on the reporting thread), for A/B runs of one build.
    let hot = env_micros("XP_BENCH_HOT_US").map_or(DEFAULT_HOT, Duration::from_micros);
    let sched = LocalScheduler::start_with(Scheduler::new(policy::by_name(policy_name)?), hot)
        .map_err(BenchError::SchedulerStart)?;
    let register =
        |qs: QueueSpec, id: u32, prio: i32, marks: Option<Arc<Marks>>| -> Result<Arc<BenchQueue>> {
            // With marks, the queue's announcements, Ready and Idle reports to the scheduler are marked.
            let sink: EventSink = match &marks {
                Some(m) => Arc::new(MarkedSink {
                    inner: sched.sink(),
                    marks: m.clone(),
                }),
                None => sched.sink(),
            };
            let q = qs.local(env, QueueId(id), Some(sink), marks)?;
            sched.register(
                QueueInfo::new(QueueId(id), prio),
                q.clone() as Arc<dyn Preemptible>,
            )?;
            Ok(q)
        };
    // The scheduler needs a preemptible BE queue: Lv2 unless the spec asks for a level.
    let be_qs = be.queue().unwrap_or(QueueSpec {
        level: Level::Lv2,
        stream_priority: be.stream_priority,
        threshold: be.threshold,
        batch: be.batch,
    });
    let (be_marks, lc_marks) = (
        Marks::wanted(be.marks.as_deref()),
        Marks::wanted(lc.marks.as_deref()),
    );
    let be_q = register(be_qs, 0, BE_PRIORITY, be_marks.clone())?;
    let lc_q = register(lc.queue(), 1, LC_PRIORITY, lc_marks.clone())?;
    let ctl = Control::default();
    let (lc_r, be_r) = std::thread::scope(|sc| {
        let be_h = sc.spawn(|| run_be_on(env, be, &ctl, Some(&be_q)));
        let lc_r = run_lc_on(env, lc, &ctl, &LcTarget::Queue(&lc_q), lc_marks.as_deref());
        let be_r = be_h.join().unwrap_or(Err(BenchError::Panicked("BE")));
        (lc_r, be_r)
    });
    for m in be_marks.iter().chain(&lc_marks) {
        m.save()?;
    }
    let mut be_r = be_r?;
    be_r.level_used = be_r
        .level_used
        .map(|l| format!("{l} via local scheduler ({policy_name})"));
    Ok((lc_r?, be_r))
}
