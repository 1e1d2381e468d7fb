//! Announcements handed to local mode's spinning preemption thread, and what the announcing
//! queue says while that thread is deciding on its announcement.
//!
//! An announcement is first *waiting*: its queue's next report takes it back (the thread got no
//! CPU during the launch) and is decided on the reporting thread. Once the thread has *claimed*
//! it, the queue's reports and a failed submission's withdrawal are queued behind it, for the
//! thread to apply after its decision, in order: the latency-critical queue's Ready then costs
//! it a push, not a wait for the decision and the stops (with the stop plan and without the
//! queue, the Ready took 5.4–13.9 µs at p50 on an H100 host, against 1.1–6.2 with it;
//! bench/results/2026-11-23-h100-session14.md). A Ready that comes after the thread *decided* on
//! its announcement is handed to the thread too (and the queue's later reports behind it): it
//! changes nothing that cannot wait, and deciding it on the submitting thread, under the
//! scheduler's lock, was most of that thread's work between its first two launches (0.7–3.3 µs at
//! p50, 7.4–10.5 at p99; bench/results/2026-11-24-h100-session16.md, section 7).

use super::protocol::QueueReport;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use xpreempt_types::QueueId;

/// What an announced queue said while its announcement was being decided on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Later {
    Report(QueueReport),
    /// The submission failed: the announcement is undone.
    Withdraw,
}

/// Where a queue's report goes.
#[derive(Debug, PartialEq)]
pub(crate) enum Route {
    /// Its announcement was still waiting: taken back, the report is decided here.
    TakenBack,
    /// Queued behind its claimed announcement.
    Queued,
    /// The Ready of a queue whose announcement the thread has decided: handed to that thread (to
    /// be woken), since it changes nothing that cannot wait and deciding it here would keep the
    /// submitting thread from its next launch.
    HandedOver,
    /// Nothing of the queue is handed over: the report is decided here.
    Direct,
}

#[derive(Default)]
struct Lists {
    waiting: Vec<QueueId>,
    claimed: Vec<QueueId>,
    later: Vec<(QueueId, Later)>,
    /// Announcements decided on, until their queue's next report.
    decided: Vec<QueueId>,
}

#[derive(Default)]
pub(crate) struct Announcements {
    lists: Mutex<Lists>,
    /// Waiting, claimed and decided, set under the lock: a report that finds zero routes itself
    /// Direct without taking the lock.
    busy: AtomicUsize,
}

impl Announcements {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, l: &Lists) {
        self.busy.store(
            l.waiting.len() + l.claimed.len() + l.decided.len(),
            Ordering::Release,
        );
    }

    pub fn announce(&self, queue: QueueId) {
        let mut l = self.lock();
        l.waiting.push(queue);
        self.count(&l);
    }

    /// Routes `what` from `queue` (see [`Route`]); queued only if it is. A report supersedes
    /// the queue's announcement that waits, also when it is queued behind an earlier claimed one:
    /// decided after it, that announcement would leave the queue active after its Idle.
    pub fn route(&self, queue: QueueId, what: Later) -> Route {
        if self.busy.load(Ordering::Acquire) == 0 {
            return Route::Direct;
        }
        let mut l = self.lock();
        let decided = l.decided.len();
        l.decided.retain(|&q| q != queue);
        if l.decided.len() != decided
            && matches!(what, Later::Report(QueueReport::Ready { .. }))
            && !l.waiting.contains(&queue)
        {
            if !l.claimed.contains(&queue) {
                l.claimed.push(queue);
            }
            l.later.push((queue, what));
            self.count(&l);
            return Route::HandedOver;
        }
        let before = l.waiting.len();
        l.waiting.retain(|&q| q != queue);
        let was_waiting = l.waiting.len() != before;
        self.count(&l);
        if l.claimed.contains(&queue) && !(was_waiting && what == Later::Withdraw) {
            l.later.push((queue, what));
            return Route::Queued;
        }
        if was_waiting {
            Route::TakenBack
        } else {
            Route::Direct
        }
    }

    /// Whether anything waits to be claimed or applied.
    pub fn any_work(&self) -> bool {
        self.busy.load(Ordering::Acquire) != 0 && {
            let l = self.lock();
            !l.waiting.is_empty() || !l.later.is_empty()
        }
    }

    /// The preemption thread takes the waiting announcements to decide on them.
    pub fn claim(&self) -> Vec<QueueId> {
        let mut l = self.lock();
        let taken = std::mem::take(&mut l.waiting);
        l.claimed.extend_from_slice(&taken);
        taken
    }

    /// After the decisions: what was queued behind the claimed announcements (to apply, then
    /// call again), or nothing, and then the claims are over.
    pub fn finish(&self) -> Vec<(QueueId, Later)> {
        let mut l = self.lock();
        if l.later.is_empty() {
            for q in std::mem::take(&mut l.claimed) {
                if !l.decided.contains(&q) {
                    l.decided.push(q);
                }
            }
            self.count(&l);
        }
        std::mem::take(&mut l.later)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: QueueId = QueueId(1);
    const OTHER: QueueId = QueueId(2);
    const IDLE: Later = Later::Report(QueueReport::Idle { generation: 2 });

    #[test]
    fn a_waiting_announcement_is_taken_back_by_its_queues_report() {
        let a = Announcements::default();
        assert_eq!(a.route(Q, IDLE), Route::Direct);
        a.announce(Q);
        assert!(a.any_work());
        assert_eq!(a.route(OTHER, IDLE), Route::Direct);
        assert_eq!(a.route(Q, Later::Withdraw), Route::TakenBack);
        assert_eq!(a.route(Q, IDLE), Route::Direct);
        assert!(!a.any_work());
        assert!(a.claim().is_empty());
    }

    #[test]
    fn reports_during_a_claim_are_queued_in_order_until_it_is_finished() {
        let a = Announcements::default();
        a.announce(Q);
        assert_eq!(a.claim(), vec![Q]);
        assert!(!a.any_work());
        let ready = Later::Report(QueueReport::Ready {
            pending: 1,
            generation: 1,
        });
        assert_eq!(a.route(Q, ready), Route::Queued);
        assert_eq!(a.route(OTHER, IDLE), Route::Direct);
        assert_eq!(a.route(Q, IDLE), Route::Queued);
        assert_eq!(a.finish(), vec![(Q, ready), (Q, IDLE)]);
        // The queue's next submission is announced and reported on while the claim holds: the
        // report supersedes the announcement, which is not decided on after it.
        a.announce(Q);
        assert_eq!(a.route(Q, ready), Route::Queued);
        assert!(
            a.claim().is_empty(),
            "an announcement its own Ready superseded"
        );
        a.announce(Q);
        assert_eq!(a.route(Q, Later::Withdraw), Route::TakenBack);
        assert_eq!(a.finish(), vec![(Q, ready)]);
        // Queued again while the first batch was applied: the claim holds until none is left.
        assert_eq!(a.route(Q, Later::Withdraw), Route::Queued);
        assert_eq!(a.finish(), vec![(Q, Later::Withdraw)]);
        assert!(a.finish().is_empty());
        assert_eq!(a.route(Q, IDLE), Route::Direct);
    }

    #[test]
    fn the_ready_of_a_decided_announcement_is_handed_over_once() {
        let a = Announcements::default();
        let ready = Later::Report(QueueReport::Ready {
            pending: 1,
            generation: 1,
        });
        a.announce(Q);
        assert_eq!(a.claim(), vec![Q]);
        assert!(a.finish().is_empty(), "decided, nothing queued behind it");
        // The queue's Ready comes after the decision: handed to the thread, in order with the
        // queue's later reports.
        assert_eq!(a.route(Q, ready), Route::HandedOver);
        assert!(a.any_work());
        assert_eq!(a.route(Q, IDLE), Route::Queued);
        assert_eq!(a.finish(), vec![(Q, ready), (Q, IDLE)]);
        assert!(a.finish().is_empty());
        // Its next report goes straight to the scheduler, and so does a Ready of a queue whose
        // announcement nobody decided.
        assert_eq!(a.route(Q, IDLE), Route::Direct);
        assert_eq!(a.route(Q, ready), Route::Direct);
        assert_eq!(a.route(OTHER, ready), Route::Direct);
        assert!(!a.any_work());
        // Decided, then announced again before its Ready: that Ready takes the new one back.
        a.announce(Q);
        assert_eq!(a.claim(), vec![Q]);
        assert!(a.finish().is_empty());
        a.announce(Q);
        assert_eq!(a.route(Q, ready), Route::TakenBack);
    }
}
