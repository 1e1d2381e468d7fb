//! Local mode: the scheduler of one device inside the application.
//!
//! A queue's report runs the [`Driver`] on the reporting thread and applies the resulting
//! suspend/resume at once: a latency-critical submission preempts the best-effort queue without
//! waking any other thread (handing decisions to a separate thread cost hundreds of µs at p99 on
//! the GPU machine). A timer thread only serves the policy's timeslices, aging and resume retries.

use super::driver::Driver;
use super::protocol::{QueueInfo, QueueReport, SchedEvent};
use super::scheduler::{SchedError, Scheduler};
use crate::stats::SchedulerStats;
use crate::xqueue::threaded::{EventSink, Preemptible, ReportSink};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xpreempt_types::{Nanos, QueueId};

struct Shared {
    driver: Mutex<Driver<Arc<dyn Preemptible>>>,
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
}

/// Where queues report; holds the scheduler weakly, so queues do not keep a dropped one alive.
/// `wants_work` is shared directly: the submit path reads it without touching the scheduler.
struct Sink {
    shared: Weak<Shared>,
    wants_work: Arc<AtomicBool>,
}

impl ReportSink for Sink {
    fn report(&self, queue: QueueId, report: QueueReport) {
        if let Some(shared) = self.shared.upgrade()
            && let Err(e) = shared.run(|d, clock| d.report(queue, report, clock))
        {
            tracing::warn!(%e, "report ignored");
        }
    }

    fn wants_work(&self) -> bool {
        self.wants_work.load(Ordering::Relaxed)
    }
}

impl LocalScheduler {
    pub fn start(scheduler: Scheduler) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            wants_work: Arc::new(AtomicBool::new(scheduler.wants_work())),
            driver: Mutex::new(Driver::new(scheduler)),
            timer: Condvar::new(),
            shutdown: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let for_timer = Arc::clone(&shared);
        let timer = std::thread::Builder::new()
            .name("xpreempt-timer".into())
            .spawn(move || run_timer(&for_timer))?;
        Ok(Self {
            shared,
            timer: Some(timer),
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

    pub fn stats(&self) -> SchedulerStats {
        self.shared.lock().scheduler().stats().clone()
    }
}

impl Drop for LocalScheduler {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.timer.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Driver<Arc<dyn Preemptible>>> {
        self.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Runs `f` on the driver under its lock, on the calling thread, and wakes the timer thread
    /// if the next wake-up moved earlier. Queues never hold their own lock while reporting, and
    /// hand back what suspend/resume changed instead of reporting it, so taking queue locks
    /// under the driver's lock cannot deadlock.
    fn run<T>(
        &self,
        f: impl FnOnce(&mut Driver<Arc<dyn Preemptible>>, &dyn Fn() -> Nanos) -> T,
    ) -> T {
        let mut d = self.lock();
        let before = d.next_wake();
        let out = f(&mut d, &|| self.now());
        let after = d.next_wake();
        self.wants_work
            .store(d.scheduler().wants_work(), Ordering::Relaxed);
        drop(d);
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
        out
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
