//! The completion watcher of a threaded queue: its own thread, which blocks on the hardware's
//! sync points (never while holding the queue's lock) to open the window, to notice when the
//! queue goes idle and to drain a Lv1 suspension, and sleeps while the queue is idle.

use super::Inner;
use crate::xqueue::WaitPlan;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::QueueId;

/// How long the completion watcher lets a queue that is still getting launches go on before it
/// asks the hardware for a sync point of its own.
const QUIET: Duration = Duration::from_micros(20);
/// How often an idle queue's watcher looks for work while it polls
/// ([`QueueConfig::with_idle_poll`](crate::QueueConfig::with_idle_poll)).
pub(super) const IDLE_POLL_TICK: Duration = Duration::from_millis(1);

pub(super) fn watch<H: HwQueue>(inner: &Inner<H>, id: QueueId) {
    // The launch tail the watcher last saw while the queue was still getting launches.
    let mut busy_tail = None;
    // Since when the watcher has found nothing to do.
    let mut idle_since: Option<Instant> = None;
    loop {
        let target = {
            let mut q = inner.lock();
            let target = loop {
                if inner.shutdown.load(Ordering::Relaxed) {
                    return;
                }
                match q.wait_plan() {
                    WaitPlan::Nothing => {
                        // Sleep until there is work, except to watch a hardware stop settle, to
                        // or to retry a launch that failed.
                        let retry = !q.is_suspended() && q.pending_len() > 0;
                        let nap = if q.is_settling() {
                            Some(Duration::from_micros(100))
                        } else if retry {
                            Some(Duration::from_millis(50))
                        } else {
                            None
                        };
                        let since = *idle_since.get_or_insert_with(Instant::now);
                        let poll = nap.is_none()
                            && since.elapsed().as_nanos() < u128::from(q.config().idle_poll_ns());
                        inner.polling.store(poll, Ordering::Relaxed);
                        q = match nap {
                            Some(d) => {
                                inner
                                    .work
                                    .wait_timeout(q, d)
                                    .unwrap_or_else(|p| p.into_inner())
                                    .0
                            }
                            None if poll => {
                                inner
                                    .work
                                    .wait_timeout(q, IDLE_POLL_TICK)
                                    .unwrap_or_else(|p| p.into_inner())
                                    .0
                            }
                            None => inner.work.wait(q).unwrap_or_else(|p| p.into_inner()),
                        };
                        if nap.is_some() {
                            drop(q);
                            inner.poll_and_report(id);
                            q = inner.lock();
                        }
                    }
                    WaitPlan::Synchronize(t) => break t,
                    // Still getting launches (the tail moved since the last look): a sync point
                    // of the watcher's own would go between the application's launches, into
                    // the driver's locks. Until the tail rests, it waits on the sync points the
                    // launches carry, or naps.
                    WaitPlan::RecordSyncThenSynchronize(t)
                        if busy_tail != Some(t) && !q.is_suspended() =>
                    {
                        busy_tail = Some(t);
                        if let Some(s) = q.next_sync_point() {
                            break s;
                        }
                        drop(q);
                        std::thread::sleep(QUIET);
                        q = inner.lock();
                    }
                    WaitPlan::RecordSyncThenSynchronize(t) => match q.record_sync(&inner.hal) {
                        Ok(()) => break t,
                        Err(e) => {
                            tracing::warn!(%e, "completion watcher");
                            drop(q);
                            std::thread::sleep(Duration::from_millis(1));
                            q = inner.lock();
                        }
                    },
                }
            };
            // Busy: until the watcher is idle and polling again, a submission wakes it.
            idle_since = None;
            inner.polling.store(false, Ordering::Relaxed);
            inner.wake_owed.store(false, Ordering::Relaxed);
            target
        };
        inner.flush_sink(id);
        match inner.hal.synchronize(target) {
            Ok(()) => {}
            // A virtual-clock backend cannot block: poll it instead.
            Err(HalError::WouldBlock(_)) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) => {
                tracing::warn!(%e, "completion watcher could not synchronize; polling");
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        inner.poll_and_report(id);
        // A Ready reported after the flush above (its submission woke the watcher first).
        inner.flush_sink(id);
    }
}
