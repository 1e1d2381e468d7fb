//! Local mode: the scheduler of one device on its own thread inside the application.
//!
//! Queues report Ready/Idle through an [`EventSink`] that only sends on a channel; the
//! scheduler thread decides and calls suspend/resume on the queues. The daemon runs the same
//! [`Scheduler`] behind a socket instead of a channel.

use super::{Action, QueueInfo, SchedEvent, Scheduler};
use crate::stats::SchedulerStats;
use crate::xqueue::QueueEvent;
use crate::xqueue::threaded::{EventSink, Preemptible};
use crate::{Nanos, QueueId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

enum Msg {
    Register(QueueInfo, Arc<dyn Preemptible>),
    Unregister(QueueId),
    Event(SchedEvent),
    Stats(Sender<SchedulerStats>),
    Shutdown,
}

pub struct LocalScheduler {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl LocalScheduler {
    pub fn start(scheduler: Scheduler) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("xpreempt-sched".into())
            .spawn(move || run(scheduler, rx))?;
        Ok(Self {
            tx,
            thread: Some(thread),
        })
    }

    /// The sink a queue reports to; give it to the queue at creation.
    pub fn sink(&self) -> EventSink {
        let tx = self.tx.clone();
        Arc::new(move |queue: QueueId, event: QueueEvent| {
            let ev = match event {
                QueueEvent::Ready => SchedEvent::Ready { queue, pending: 0 },
                QueueEvent::Idle => SchedEvent::Idle(queue),
            };
            // A closed channel means the scheduler is gone; the queue keeps running unscheduled.
            let _ = tx.send(Msg::Event(ev));
        })
    }

    pub fn register(&self, info: QueueInfo, queue: Arc<dyn Preemptible>) {
        let _ = self.tx.send(Msg::Register(info, queue));
    }

    /// The queue is going away; the scheduler forgets it.
    pub fn unregister(&self, queue: QueueId) {
        let _ = self.tx.send(Msg::Unregister(queue));
    }

    pub fn send(&self, event: SchedEvent) {
        let _ = self.tx.send(Msg::Event(event));
    }

    pub fn stats(&self) -> Option<SchedulerStats> {
        let (tx, rx) = channel();
        self.tx.send(Msg::Stats(tx)).ok()?;
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }
}

impl Drop for LocalScheduler {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(mut scheduler: Scheduler, rx: Receiver<Msg>) {
    let epoch = Instant::now();
    let now = || epoch.elapsed().as_nanos() as Nanos;
    let mut queues: BTreeMap<QueueId, Arc<dyn Preemptible>> = BTreeMap::new();
    loop {
        let msg = match scheduler.next_wake() {
            Some(at) => {
                let wait = Duration::from_nanos(at.saturating_sub(now()));
                match rx.recv_timeout(wait) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => Msg::Event(SchedEvent::Timer),
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            },
        };
        let event = match msg {
            Msg::Shutdown => return,
            Msg::Stats(reply) => {
                let _ = reply.send(scheduler.stats().clone());
                continue;
            }
            Msg::Register(info, queue) => {
                queues.insert(info.id, queue);
                SchedEvent::Created(info)
            }
            Msg::Unregister(id) => {
                queues.remove(&id);
                SchedEvent::Destroyed(id)
            }
            Msg::Event(e) => e,
        };
        let actions = match scheduler.handle(now(), event) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(%e, "scheduler event ignored");
                continue;
            }
        };
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
}
