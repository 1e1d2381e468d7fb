//! The watchdog: clients whose agents stopped beating while they had work stop holding others.

use super::{QueueEntry, State};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Instant;
use xpreempt_core::sched::SchedEvent;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::{Nanos, QueueId};
use xpreempt_ipc::shm::decode_report;

impl State {
    /// The watchdog: a client whose agent stopped beating for `bound` while it had work is taken
    /// out of contention (its queues count as idle), so others are not held suspended for it; it
    /// comes back with its current reports as soon as it beats again.
    pub fn watchdog(&mut self, bound: std::time::Duration) {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        let now = Instant::now();
        let ids: Vec<u64> = self.clients.keys().copied().collect();
        for id in ids {
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            let Some(segment) = c.segment.clone() else {
                continue;
            };
            let beat = segment.header().heartbeat.load(Ordering::SeqCst);
            if beat != c.heartbeat.0 {
                c.heartbeat = (beat, now);
                if std::mem::take(&mut c.silenced) {
                    tracing::info!(
                        pid = c.cred.pid,
                        "client answers again; its queues compete again"
                    );
                    c.seen.clear();
                    let queues: Vec<(u32, QueueId)> =
                        c.queues.iter().map(|(s, q)| (*s, *q)).collect();
                    for (slot, queue) in queues {
                        let report = segment
                            .slot(slot)
                            .and_then(|s| decode_report(s.report.load(Ordering::SeqCst)));
                        if let Some(xpreempt_core::sched::QueueReport::Ready { pending, .. }) =
                            report
                        {
                            let _ = self.event(id, queue, SchedEvent::Ready { queue, pending });
                        }
                        // Its bits count again.
                        if let Some(&QueueEntry { device, .. }) = self.queues.get(&queue) {
                            self.refresh(device);
                        }
                    }
                }
                continue;
            }
            if c.silenced || now.duration_since(c.heartbeat.1) < bound {
                continue;
            }
            let queues: Vec<QueueId> = c.queues.values().copied().collect();
            let active: Vec<QueueId> = queues
                .into_iter()
                .filter(|q| self.view_state(*q).is_some_and(|s| s != QueueState::Idle))
                .collect();
            if active.is_empty() {
                continue;
            }
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            c.silenced = true;
            tracing::warn!(
                pid = c.cred.pid,
                name = %c.name,
                silent_ms = now.duration_since(c.heartbeat.1).as_millis() as u64,
                "watchdog: client stopped answering while it had work; its queues no longer hold others back"
            );
            self.stats.watchdog_fires += 1;
            let mut touched = BTreeSet::new();
            for queue in active {
                if let Some(&QueueEntry { device, .. }) = self.queues.get(&queue)
                    && let Some(d) = self.devices.get_mut(&device)
                {
                    touched.insert(device);
                    let _ = d.dispatch(SchedEvent::Idle(queue), &clock);
                }
            }
            // Its bits no longer stop anyone: the masks leave a silenced client out.
            for dev in touched {
                self.refresh(dev);
            }
        }
    }
}
