//! Local mode: the scheduler of one device inside the application.
//!
//! A queue's Ready/Idle report runs the scheduler on the reporting thread and applies the
//! resulting suspend/resume at once: a latency-critical submission preempts the best-effort queue
//! without waking any other thread (a hand-off to a scheduler thread cost hundreds of µs at p99 on
//! the GPU machine). A timer thread only serves the policy's timeslices and aging. The daemon runs
//! the same [`Scheduler`] behind a socket instead.

use super::{Action, QueueInfo, SchedEvent, Scheduler};
use crate::stats::SchedulerStats;
use crate::xqueue::threaded::{EventSink, Preemptible, Report};
use crate::{Nanos, QueueId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct State {
    scheduler: Scheduler,
    queues: BTreeMap<QueueId, Arc<dyn Preemptible>>,
    /// The newest report applied per queue: an older one arriving late is stale.
    generations: BTreeMap<QueueId, u64>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the timer thread when the next wake-up time moves earlier, or at shutdown.
    timer: Condvar,
    shutdown: AtomicBool,
    epoch: Instant,
}

pub struct LocalScheduler {
    shared: Arc<Shared>,
    timer: Option<JoinHandle<()>>,
}

impl LocalScheduler {
    pub fn start(scheduler: Scheduler) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                scheduler,
                queues: BTreeMap::new(),
                generations: BTreeMap::new(),
            }),
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

    /// The sink a queue reports to; give it to the queue at creation. It holds the scheduler
    /// weakly, so queues do not keep a dropped scheduler alive.
    pub fn sink(&self) -> EventSink {
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        Arc::new(move |queue: QueueId, report: Report| {
            if let Some(shared) = shared.upgrade() {
                shared.report(queue, report);
            }
        })
    }

    pub fn register(&self, info: QueueInfo, queue: Arc<dyn Preemptible>) {
        let id = info.id;
        self.shared.lock().queues.insert(id, queue);
        self.shared.dispatch(SchedEvent::Created(info));
    }

    /// The queue is going away; the scheduler forgets it.
    pub fn unregister(&self, queue: QueueId) {
        self.shared.dispatch(SchedEvent::Destroyed(queue));
        let mut st = self.shared.lock();
        st.queues.remove(&queue);
        st.generations.remove(&queue);
    }

    pub fn send(&self, event: SchedEvent) {
        self.shared.dispatch(event);
    }

    pub fn stats(&self) -> SchedulerStats {
        self.shared.lock().scheduler.stats().clone()
    }
}

impl Drop for LocalScheduler {
    fn drop(&mut self) {
        self.shared.lock().queues.clear();
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.timer.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// A queue's report, decided and applied on the calling thread.
    fn report(&self, queue: QueueId, report: Report) {
        let mut st = self.lock();
        if let Some(event) = st.accept(queue, report) {
            self.decide(&mut st, event);
        }
    }

    fn dispatch(&self, event: SchedEvent) {
        let mut st = self.lock();
        self.decide(&mut st, event);
    }

    /// Decides and applies, then whatever the actions themselves report, until nothing is left.
    /// Queues never hold their own lock while reporting, and hand back what suspend/resume
    /// changed instead of reporting it, so taking queue locks under the scheduler lock cannot
    /// deadlock.
    fn decide(&self, st: &mut State, event: SchedEvent) {
        let before = st.scheduler.next_wake();
        let mut work = vec![event];
        while let Some(event) = work.pop() {
            let now = self.now();
            let actions = match st.scheduler.handle(now, event) {
                Ok(actions) => actions.to_vec(),
                Err(e) => {
                    tracing::warn!(%e, "scheduler event ignored");
                    continue;
                }
            };
            for action in actions {
                let (id, result) = match action {
                    Action::Suspend(id) => (id, st.queues.get(&id).map(|q| q.suspend())),
                    Action::Resume(id) => (id, st.queues.get(&id).map(|q| q.resume())),
                    Action::Refuse(id) | Action::Admit(id) => {
                        if let Some(q) = st.queues.get(&id) {
                            q.set_refused(matches!(action, Action::Refuse(_)));
                        }
                        continue;
                    }
                };
                match result {
                    Some(Ok(Some(report))) => work.extend(st.accept(id, report)),
                    Some(Ok(None)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(%e, "scheduler action failed");
                        if matches!(action, Action::Resume(_)) {
                            let _ = st.scheduler.resume_failed(id, self.now());
                        }
                    }
                    None => tracing::debug!(queue = %id, "action for an unregistered queue"),
                }
            }
        }
        let after = st.scheduler.next_wake();
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
    }
}

impl State {
    /// The event a report stands for, or `None` for a report older than one already applied.
    fn accept(&mut self, queue: QueueId, report: Report) -> Option<SchedEvent> {
        let generation = match report {
            Report::Ready { generation, .. } | Report::Idle { generation } => generation,
            Report::Retry => return Some(SchedEvent::Admission(queue)),
        };
        let last = self.generations.entry(queue).or_insert(0);
        if generation <= *last {
            return None;
        }
        *last = generation;
        Some(match report {
            Report::Ready { pending, .. } => SchedEvent::Ready { queue, pending },
            _ => SchedEvent::Idle(queue),
        })
    }
}

fn run_timer(shared: &Shared) {
    let mut st = shared.lock();
    while !shared.shutdown.load(Ordering::Relaxed) {
        let now = shared.now();
        match st.scheduler.next_wake() {
            Some(at) if at <= now => {
                drop(st);
                shared.dispatch(SchedEvent::Timer);
                st = shared.lock();
            }
            Some(at) => {
                st = shared
                    .timer
                    .wait_timeout(st, Duration::from_nanos(at - now))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            None => {
                st = shared.timer.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
