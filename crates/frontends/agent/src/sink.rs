//! Where the process's queues report. Ready/Idle go into the queue's slot and ring the daemon
//! (no system call while the daemon's thread is awake); admission retries and hook work go over
//! the socket; without a daemon everything goes to the local scheduler.

use crate::{Inner, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use xpreempt_core::QueueId;
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{EventSink, ReportSink};
use xpreempt_ipc::frame;
use xpreempt_ipc::msg::ClientMsg;
use xpreempt_ipc::shm::encode_report;

/// The agent, held weakly, and its mirror of whether the scheduler wants work reports (read on
/// every submission, so it stays one atomic load).
struct Sink(Weak<Inner>, Arc<AtomicBool>);

pub(crate) fn sink(inner: &Arc<Inner>) -> EventSink {
    Arc::new(Sink(Arc::downgrade(inner), Arc::clone(&inner.wants_work)))
}

/// Refreshes the mirror from whoever schedules now (the daemon's segment, or the local
/// scheduler); the control thread calls it on every turn.
pub(crate) fn mirror_wants_work(inner: &Inner) {
    let wants = match &*inner.mode.read().unwrap_or_else(|p| p.into_inner()) {
        Mode::Remote(conn) => conn.segment.header().wants_work.load(Ordering::Relaxed) != 0,
        Mode::Local => inner.local_sink.wants_work(),
    };
    inner.wants_work.store(wants, Ordering::Relaxed);
}

/// Stores a report word unless a newer one is already there: reports race between the
/// submitting thread, the completion watcher and the control thread.
pub(crate) fn store_newest(word: &AtomicU64, report: u64) -> bool {
    let mut cur = word.load(Ordering::SeqCst);
    loop {
        if cur >> 32 >= report >> 32 && cur != 0 {
            return false;
        }
        match word.compare_exchange_weak(cur, report, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Publishes a queue's Ready/Idle (remote: into its slot, ringing the daemon).
pub(crate) fn publish(inner: &Inner, mode: &Mode, queue: QueueId, report: QueueReport) {
    let Some(word) = encode_report(report) else {
        return;
    };
    let Some(latest) = inner.reports.get(queue.0 as usize) else {
        return;
    };
    store_newest(latest, word);
    match mode {
        Mode::Remote(conn) => {
            if let Some(slot) = conn.segment.slot(queue.0)
                && store_newest(&slot.report, word)
            {
                conn.segment.header().to_daemon.ring();
            }
        }
        Mode::Local => inner.local_sink.report(queue, report),
    }
}

impl ReportSink for Sink {
    fn report(&self, queue: QueueId, report: QueueReport) {
        let Some(inner) = self.0.upgrade() else {
            return;
        };
        let mode = inner.mode.read().unwrap_or_else(|p| p.into_inner());
        match report {
            QueueReport::Ready { .. } | QueueReport::Idle { .. } => {
                publish(&inner, &mode, queue, report)
            }
            QueueReport::Retry | QueueReport::Submitted { .. } | QueueReport::Completed { .. } => {
                match &*mode {
                    Mode::Remote(conn) => {
                        let remote = inner
                            .lock_queues()
                            .get(queue.0 as usize)
                            .and_then(|e| e.as_ref())
                            .and_then(|e| e.remote);
                        let Some(remote) = remote else { return };
                        let msg = match report {
                            QueueReport::Retry => ClientMsg::Retry { queue: remote },
                            QueueReport::Submitted { kind, seq } => ClientMsg::Work {
                                queue: remote,
                                work: xpreempt_core::sched::Work::Submitted { kind, seq },
                            },
                            QueueReport::Completed { upto } => ClientMsg::Work {
                                queue: remote,
                                work: xpreempt_core::sched::Work::Completed { upto },
                            },
                            _ => return,
                        };
                        let mut s = conn.stream.lock().unwrap_or_else(|p| p.into_inner());
                        if let Err(e) = frame::write(&mut *s, &msg) {
                            tracing::debug!(%e, "report to the daemon lost; the control thread notices a dead daemon");
                        }
                    }
                    Mode::Local => inner.local_sink.report(queue, report),
                }
            }
        }
    }

    fn wants_work(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}
