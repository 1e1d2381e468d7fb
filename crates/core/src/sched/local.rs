//! Local mode: the scheduler of one device inside the application.
//!
//! A queue's report runs the [`Driver`] on the reporting thread, which makes the resulting
//! suspensions and resumptions right after, having let go of the driver's lock (so that no
//! hardware call holds up another thread's decision): a latency-critical submission preempts
//! the best-effort queue without waking any other thread (handing decisions to a sleeping
//! thread cost hundreds of µs at p99 on the GPU machine). The one exception is a thread that
//! already spins: while a queue with work can be preempted and preemptions happen, the
//! preemption thread ([`super::preempter`]) spins and takes the suspensions off the reporting
//! thread, and handles a submission's announcement itself while the submission launches: it
//! stops what the last decision's stop plan says ([`super::stop_plan`]), then decides, then
//! applies the reports the queue made meanwhile ([`super::announcements`]). What it has not
//! taken by the queue's next report (it got no CPU during the launch) is taken back: the
//! announcement is dropped and the Ready's thread makes the stops. A timer thread serves the
//! policy's timeslices, aging and resume retries.

use super::announcements::{Announcements, Later, Route};
use super::driver::Driver;
use super::preempter::{DEFAULT_HOT, LocalQueue, Preempter};
use super::protocol::{QueueInfo, QueueReport, SchedEvent};
use super::scheduler::{RankedQueue, SchedError, Scheduler};
use super::stop_plan::{StopPlan, plan_ids};
use crate::stats::SchedulerStats;
use crate::xqueue::QueueOpError;
use crate::xqueue::threaded::{EventSink, Preemptible, ReportSink};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xpreempt_types::{Nanos, QueueId};

/// Aligned so that the counts of the `Arc` it lives in, which each report's upgrade of a
/// [`Sink`]'s reference writes, share no cache line with the driver's lock.
#[repr(align(128))]
struct Shared {
    driver: Mutex<Driver<LocalQueue>>,
    preempter: Arc<Preempter>,
    /// Announcements handed to the spinning preemption thread, not decided on yet.
    announced: Announcements,
    /// What an announcement stops at once, as the last decision left things.
    plan: Mutex<Arc<StopPlan>>,
    /// Wakes the timer thread when the next wake-up time moves earlier, or at shutdown.
    timer: Condvar,
    shutdown: AtomicBool,
    /// Mirrors [`Scheduler::wants_work`], read on every submission without the lock.
    wants_work: Arc<AtomicBool>,
    epoch: Instant,
}

pub struct LocalScheduler {
    shared: Arc<Shared>,
    timer: Option<JoinHandle<()>>,
    preempter: Option<JoinHandle<()>>,
}

/// Where queues report; holds the scheduler weakly, so queues do not keep a dropped one alive.
/// `wants_work` is shared directly: the submit path reads it without touching the scheduler.
struct Sink {
    shared: Weak<Shared>,
    wants_work: Arc<AtomicBool>,
}

impl ReportSink for Sink {
    fn report(&self, queue: QueueId, report: QueueReport) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        // The queue's own report supersedes its announcement if the preemption thread has not
        // taken it yet; taken back first, it cannot land after the report. Once taken, the
        // report waits behind the decision, and the thread applies it; so does a Ready that
        // comes after the decision.
        let undecided = match shared.announced.route(queue, Later::Report(report)) {
            Route::Queued => return,
            Route::HandedOver => {
                shared.preempter.ring();
                return;
            }
            Route::TakenBack => true,
            Route::Direct => false,
        };
        let ready = matches!(report, QueueReport::Ready { .. });
        if ready {
            // A stop handed off at the announcement that the preemption thread has not taken
            // during the whole first launch: it got no CPU, so this thread makes the stop.
            apply_handed_off(&shared);
        }
        if let Err(e) = shared.run(|d, clock| d.report(queue, report, clock)) {
            tracing::warn!(%e, "report ignored");
        }
        if ready && undecided {
            // Nor did it get to the announcement: the stops this Ready decided are made here.
            apply_handed_off(&shared);
        }
    }

    fn wants_work(&self) -> bool {
        self.wants_work.load(Ordering::Relaxed)
    }

    /// The fast path of local mode: the Ready is decided before the launch, and what it
    /// preempts (handed to the spinning preemption thread) stops while the launch goes on.
    /// While the preemption thread spins, it decides on the announcement too, so the
    /// submitting thread goes on to its launch at once.
    fn submitting(&self, queue: QueueId) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        if shared.preempter.is_spinning() && shared.announced.announce(queue) {
            // The spinning thread watches the announcements; if it stopped spinning meanwhile,
            // it is woken.
            shared.preempter.nudge();
        } else if let Err(e) = shared.run(|d, clock| d.announce(queue, clock)) {
            tracing::warn!(%e, "announcement ignored");
        }
    }

    fn submit_failed(&self, queue: QueueId) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        match shared.announced.route(queue, Later::Withdraw) {
            Route::TakenBack => return,                  // never decided on
            Route::Queued | Route::HandedOver => return, // undone after the decision
            Route::Direct => {}
        }
        if let Err(e) = shared.run(|d, clock| d.withdraw(queue, clock)) {
            tracing::warn!(%e, "withdrawal ignored");
        }
    }
}

impl LocalScheduler {
    pub fn start(scheduler: Scheduler) -> std::io::Result<Self> {
        Self::start_with(scheduler, DEFAULT_HOT)
    }

    /// `hot`: how long the preemption thread spins after the last preemption while a queue with
    /// work can be preempted (zero: never; every suspension runs on the reporting thread).
    pub fn start_with(scheduler: Scheduler, hot: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            wants_work: Arc::new(AtomicBool::new(scheduler.wants_work())),
            driver: Mutex::new(Driver::new(scheduler)),
            preempter: Arc::new(Preempter::new(hot)),
            announced: Announcements::default(),
            plan: Mutex::new(Arc::default()),
            timer: Condvar::new(),
            shutdown: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let for_timer = Arc::clone(&shared);
        let timer = std::thread::Builder::new()
            .name("xpreempt-timer".into())
            .spawn(move || run_timer(&for_timer))?;
        let for_preempter = Arc::clone(&shared);
        let preempter = std::thread::Builder::new()
            .name("xpreempt-preempt".into())
            .spawn(move || run_preempter(&for_preempter))?;
        shared.preempter.set_thread(preempter.thread().clone());
        Ok(Self {
            shared,
            timer: Some(timer),
            preempter: Some(preempter),
        })
    }

    /// The sink a queue reports to; give it to the queue at creation.
    pub fn sink(&self) -> EventSink {
        Arc::new(Sink {
            shared: Arc::downgrade(&self.shared),
            wants_work: Arc::clone(&self.shared.wants_work),
        })
    }

    pub fn register(&self, info: QueueInfo, queue: Arc<dyn Preemptible>) -> Result<(), SchedError> {
        let queue = LocalQueue {
            queue,
            preempter: Arc::clone(&self.shared.preempter),
        };
        self.shared.run(|d, clock| d.register(info, queue, clock))
    }

    /// The queue is going away; the scheduler forgets it.
    pub fn unregister(&self, queue: QueueId) {
        self.shared.run(|d, clock| d.unregister(queue, clock));
    }

    /// Sends an event of the protocol (a priority or hints change, say) and applies the answer.
    pub fn send(&self, event: SchedEvent) -> Result<(), SchedError> {
        self.shared.run(|d, clock| d.dispatch(event, clock))
    }

    /// Whether the preemption thread spins now, taking stops and announcements off the
    /// reporting threads.
    pub fn preemption_thread_spins(&self) -> bool {
        self.shared.preempter.is_spinning()
    }

    pub fn stats(&self) -> SchedulerStats {
        self.shared.lock().scheduler().stats().clone()
    }
}

impl Drop for LocalScheduler {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.timer.notify_all();
        self.shared.preempter.wake();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        if let Some(t) = self.preempter.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Driver<LocalQueue>> {
        self.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Runs `f` on the driver under its lock, on the calling thread, and wakes the timer thread
    /// if the next wake-up moved earlier. Queues never hold their own lock while reporting, and
    /// hand back what suspend/resume changed instead of reporting it, so taking queue locks
    /// under the driver's lock cannot deadlock.
    ///
    /// The suspensions and resumptions `f` decides (and does not hand to the preemption thread)
    /// are made afterwards, on this thread, without the lock.
    fn run<T>(&self, f: impl FnOnce(&mut Driver<LocalQueue>, &dyn Fn() -> Nanos) -> T) -> T {
        let mut d = self.lock();
        let before = d.next_wake();
        let out = f(&mut d, &|| self.now());
        let after = d.next_wake();
        let wants_work = d.scheduler().wants_work();
        // Read on every submission of every queue: a store only when it changes.
        if self.wants_work.load(Ordering::Relaxed) != wants_work {
            self.wants_work.store(wants_work, Ordering::Relaxed);
        }
        let ranks = d.scheduler().preemption_ranks();
        self.preempter.set_exposed(exposed(ranks.as_deref()));
        self.update_plan(&d, ranks.as_deref());
        let decided = self.preempter.take_deferred();
        drop(d);
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
        self.reconcile(decided);
        out
    }

    /// Makes the stop plan again if the decision changed it.
    fn update_plan(&self, d: &Driver<LocalQueue>, ranks: Option<&[RankedQueue]>) {
        let ids = plan_ids(ranks);
        let mut plan = self.plan.lock().unwrap_or_else(|p| p.into_inner());
        if !plan.is(&ids) {
            *plan = Arc::new(StopPlan::of(ids, |id| {
                d.queue(id).map(|q| Arc::clone(&q.queue))
            }));
        }
    }

    fn current_plan(&self) -> Arc<StopPlan> {
        Arc::clone(&self.plan.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Suspends or resumes each queue as the scheduler wants it now. What the operation reports
    /// goes back to the scheduler; if the scheduler changed its mind meanwhile, the queue is
    /// looked at again.
    fn reconcile(&self, queues: Vec<QueueId>) {
        for id in queues {
            let target = {
                let d = self.lock();
                d.queue(id)
                    .map(|q| (Arc::clone(&q.queue), d.scheduler().is_allowed(id)))
            };
            let Some((queue, allowed)) = target else {
                continue; // unregistered meanwhile
            };
            let outcome = if allowed {
                Preemptible::resume(&*queue)
            } else {
                Preemptible::suspend(&*queue)
            };
            self.run(|d, clock| self.settle(d, clock, id, allowed, outcome));
        }
    }

    /// Under the driver's lock, after `id` was resumed (`allowed`) or suspended: what the
    /// operation reported goes to the scheduler, and if the scheduler wants otherwise by now
    /// (it decided while the operation ran), the queue is looked at again.
    fn settle(
        &self,
        d: &mut Driver<LocalQueue>,
        clock: &dyn Fn() -> Nanos,
        id: QueueId,
        allowed: bool,
        outcome: Result<Option<QueueReport>, QueueOpError>,
    ) {
        match outcome {
            Ok(Some(report)) => {
                if let Err(e) = d.report(id, report, clock) {
                    tracing::warn!(%e, "report after a scheduler action ignored");
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "scheduler action failed");
                if allowed {
                    let _ = d.scheduler_mut().resume_failed(id, clock());
                }
            }
        }
        if d.queue(id).is_some() && d.scheduler().is_allowed(id) != allowed {
            self.preempter.defer(id);
        }
    }
}

fn run_timer(shared: &Shared) {
    let mut d = shared.lock();
    while !shared.shutdown.load(Ordering::Relaxed) {
        let now = shared.now();
        match d.next_wake() {
            Some(at) if at <= now => {
                drop(d);
                if let Err(e) = shared.run(|d, clock| d.timer(clock)) {
                    tracing::warn!(%e, "timer");
                }
                d = shared.lock();
            }
            Some(at) => {
                d = shared
                    .timer
                    .wait_timeout(d, Duration::from_nanos(at - now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            None => {
                d = shared.timer.wait(d).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

/// Whether a queue with work (running, or stopped for now) has a queue ranked above it, which
/// may stop it (again).
fn exposed(ranks: Option<&[RankedQueue]>) -> bool {
    let Some(ranks) = ranks else {
        return false;
    };
    let Some(top) = ranks.iter().map(|r| r.rank).max() else {
        return false;
    };
    ranks.iter().any(|r| r.active && r.rank < top)
}

/// Spins while hot, taking the suspensions handed to it; sleeps otherwise.
fn run_preempter(shared: &Shared) {
    let p = &shared.preempter;
    while !shared.shutdown.load(Ordering::Relaxed) {
        if p.is_hot() {
            p.spinning(true);
            let seen = p.bell();
            let start = Instant::now();
            // `shutdown` is looked at between slices only: it shares a cache line with what the
            // submitting threads write.
            while p.bell() == seen
                && !shared.announced.any_waiting()
                && start.elapsed() < SPIN_SLICE
            {
                // A pause, not a yield: yielding gained nothing on a quiet machine and lost more
                // stops on a loaded one (measured with `bench-request` on a 2-core host).
                std::hint::spin_loop();
            }
        } else {
            p.spinning(false);
            decide_announced(shared);
            apply_handed_off(shared);
            std::thread::park_timeout(Duration::from_millis(20));
        }
        decide_announced(shared);
        apply_handed_off(shared);
    }
    p.spinning(false);
}

/// Decides on the announcements handed to this thread, having first stopped what the stop plan
/// says they stop; then applies what their queues said meanwhile.
fn decide_announced(shared: &Shared) {
    if !shared.announced.any_work() {
        return;
    }
    let queues = shared.announced.claim();
    if !queues.is_empty() {
        let plan = shared.current_plan();
        let mut stopped: Vec<(QueueId, Result<Option<QueueReport>, QueueOpError>)> = Vec::new();
        for v in queues.iter().flat_map(|&q| plan.victims(q)) {
            if !stopped.iter().any(|(id, _)| *id == v.id) {
                stopped.push((v.id, Preemptible::suspend(&*v.queue)));
            }
        }
        shared.run(|d, clock| {
            for q in queues {
                if let Err(e) = d.announce(q, clock) {
                    tracing::warn!(%e, "announcement ignored");
                }
            }
            // Confirmed by the decisions, or resumed if they want otherwise; a stop they
            // handed over is made already.
            for (id, r) in stopped {
                shared.preempter.forget(id);
                shared.settle(d, clock, id, false, r);
            }
        });
    }
    loop {
        let later = shared.announced.finish();
        if later.is_empty() {
            return;
        }
        shared.run(|d, clock| {
            for (q, what) in later {
                let done = match what {
                    Later::Report(r) => d.report(q, r, clock),
                    Later::Withdraw => d.withdraw(q, clock),
                };
                if let Err(e) = done {
                    tracing::warn!(%e, "report after an announcement ignored");
                }
            }
        });
    }
}

/// How long one spin of the preemption thread lasts before it looks whether it is still hot.
const SPIN_SLICE: Duration = Duration::from_millis(1);

/// Suspends the queues handed off that the scheduler still wants suspended. The hardware stop
/// runs without the driver's lock, so that the reports of the queue that caused it (its Ready
/// right after its first launch) do not wait for it; a resume decided meanwhile wins, since each
/// queue is looked at again afterwards and resumed if it is now allowed to run.
fn apply_handed_off(shared: &Shared) {
    let ids = shared.preempter.take();
    if ids.is_empty() {
        return;
    }
    let todo: Vec<(QueueId, Arc<dyn Preemptible>)> = {
        let d = shared.lock();
        ids.into_iter()
            .filter(|&id| !d.scheduler().is_allowed(id))
            .filter_map(|id| d.queue(id).map(|q| (id, Arc::clone(&q.queue))))
            .collect()
    };
    let done: Vec<_> = todo
        .into_iter()
        .map(|(id, q)| (id, Preemptible::suspend(&*q)))
        .collect();
    // A resume decided while a stop ran (it may have come before it) is made afterwards.
    shared.run(|d, clock| {
        for (id, r) in done {
            shared.settle(d, clock, id, false, r);
        }
    });
}
