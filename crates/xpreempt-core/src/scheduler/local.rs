//! Local mode: the scheduler of one device inside the application.
//!
//! A queue's Ready/Idle report runs the scheduler on the reporting thread and applies the
//! resulting suspend/resume at once: a latency-critical submission preempts the best-effort queue
//! without waking any other thread (a hand-off to a scheduler thread cost hundreds of µs at p99 on
//! the GPU machine). A timer thread only serves the policy's timeslices and aging. The daemon runs
//! the same [`Scheduler`] behind a socket instead.

use super::{Action, QueueInfo, SchedEvent, Scheduler};
use crate::stats::SchedulerStats;
use crate::xqueue::QueueEvent;
use crate::xqueue::threaded::{EventSink, Preemptible};
use crate::{Nanos, QueueId};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct State {
    scheduler: Scheduler,
    queues: BTreeMap<QueueId, Arc<dyn Preemptible>>,
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

    /// The sink a queue reports to; give it to the queue at creation.
    pub fn sink(&self) -> EventSink {
        let shared = Arc::clone(&self.shared);
        Arc::new(move |queue: QueueId, event: QueueEvent, pending: usize| {
            let ev = match event {
                QueueEvent::Ready => SchedEvent::Ready { queue, pending },
                QueueEvent::Idle => SchedEvent::Idle(queue),
            };
            shared.dispatch(ev);
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
        self.shared.lock().queues.remove(&queue);
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

    /// Decides and applies on the calling thread. Queues never hold their own lock while
    /// reporting, so taking queue locks under the scheduler lock cannot deadlock.
    fn dispatch(&self, event: SchedEvent) {
        let mut st = self.lock();
        let before = st.scheduler.next_wake();
        let now = self.now();
        let State { scheduler, queues } = &mut *st;
        match scheduler.handle(now, event) {
            Ok(actions) => apply(queues, actions),
            Err(e) => tracing::warn!(%e, "scheduler event ignored"),
        }
        let after = st.scheduler.next_wake();
        if after.is_some() && (before.is_none() || after < before) {
            self.timer.notify_one();
        }
    }
}

fn apply(queues: &BTreeMap<QueueId, Arc<dyn Preemptible>>, actions: &[Action]) {
    for action in actions {
        let (id, result) = match *action {
            Action::Suspend(id) => (id, queues.get(&id).map(|q| q.suspend())),
            Action::Resume(id) => (id, queues.get(&id).map(|q| q.resume())),
            Action::Refuse(id) => (
                id,
                queues.get(&id).map(|q| {
                    q.refuse();
                    Ok(())
                }),
            ),
        };
        match result {
            Some(Err(e)) => tracing::warn!(%e, "scheduler action failed"),
            None => tracing::debug!(queue = %id, "action for an unregistered queue"),
            Some(Ok(())) => {}
        }
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
