//! Announcements handed to local mode's spinning preemption thread, and what the announcing
//! queue says while that thread is deciding on its announcement.
//!
//! An announcement is first *waiting*: its queue's next report takes it back (the thread got no
//! CPU during the launch) and is decided on the reporting thread. Once the thread has *claimed*
//! it, the queue's reports and a failed submission's withdrawal are queued behind it, for the
//! thread to apply after its decision, in order: the latency-critical queue's Ready then costs
//! it a push, not a wait for the decision and the stops (with the stop plan and without the
//! queue, the Ready took 5.4–13.9 µs at p50 on an H100 host, against 1.1–6.2 with it).
//! A Ready that comes after the thread *decided* on
//! its announcement is handed to the thread too (and the queue's later reports behind it): it
//! changes nothing that cannot wait, and deciding it on the submitting thread, under the
//! scheduler's lock, was most of that thread's work between its first two launches (0.7–3.3 µs at
//! p50, 7.4–10.5 at p99 on a quiet H100 host).
//!
//! The waiting announcements are one word of their own, which the announcing thread writes with
//! one compare-and-swap and the spinning thread watches: the announcement is on the submitting
//! thread's path before its first launch. Under a lock shared with the spinning thread it took
//! 1.1–1.9 µs at p50 on H100 hosts, and 0.5–0.9 µs this way.

use super::protocol::QueueReport;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// Up to two waiting announcements, each half the queue's id + 1 (zero: free), alone on its
/// cache line (128 bytes: some CPUs fetch lines in pairs) so that only announcing, claiming
/// and taking back move it between cores.
#[derive(Default)]
#[repr(align(128))]
struct Waiting(AtomicU64);

const HALF: u32 = 32;

fn halves(word: u64) -> [u64; 2] {
    [word & u64::from(u32::MAX), word >> HALF]
}

impl Waiting {
    /// `false` when both halves are taken (or the id has no room): the caller decides itself.
    fn add(&self, queue: QueueId) -> bool {
        let Some(tag) = queue.0.checked_add(1).map(u64::from) else {
            return false;
        };
        let mut word = self.0.load(Ordering::SeqCst);
        loop {
            let with = match halves(word) {
                [0, _] => word | tag,
                [_, 0] => word | tag << HALF,
                _ => return false,
            };
            match self
                .0
                .compare_exchange_weak(word, with, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    fn holds(&self, queue: QueueId) -> bool {
        let tag = u64::from(queue.0) + 1;
        halves(self.0.load(Ordering::SeqCst)).contains(&tag)
    }

    /// Takes `queue`'s announcements back; whether there was one.
    fn remove(&self, queue: QueueId) -> bool {
        let tag = u64::from(queue.0) + 1;
        let mut word = self.0.load(Ordering::SeqCst);
        loop {
            let [low, high] = halves(word);
            let keep = |half: u64| if half == tag { 0 } else { half };
            let without = keep(low) | keep(high) << HALF;
            if without == word {
                return false;
            }
            match self
                .0
                .compare_exchange_weak(word, without, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    fn take(&self) -> Vec<QueueId> {
        halves(self.0.swap(0, Ordering::SeqCst))
            .into_iter()
            .filter(|&t| t != 0)
            .map(|t| QueueId((t - 1) as u32))
            .collect()
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) != 0
    }
}

#[derive(Default)]
struct Lists {
    claimed: Vec<QueueId>,
    later: Vec<(QueueId, Later)>,
    /// Announcements decided on, until their queue's next report.
    decided: Vec<QueueId>,
}

#[derive(Default)]
pub(crate) struct Announcements {
    waiting: Waiting,
    lists: Mutex<Lists>,
    /// Claimed and decided, set under the lock (and raised before a claim empties `waiting`): a
    /// report of a queue that waits in neither finds zero and routes itself Direct without
    /// taking the lock.
    busy: AtomicUsize,
}

impl Announcements {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, l: &Lists) {
        self.busy
            .store(l.claimed.len() + l.decided.len(), Ordering::SeqCst);
    }

    /// Hands `queue`'s announcement to the thread; `false` if there is no room for it (two
    /// wait already), and the caller decides it itself.
    pub fn announce(&self, queue: QueueId) -> bool {
        self.waiting.add(queue)
    }

    /// Routes `what` from `queue` (see [`Route`]); queued only if it is. A report supersedes
    /// the queue's announcement that waits, also when it is queued behind an earlier claimed one:
    /// decided after it, that announcement would leave the queue active after its Idle.
    pub fn route(&self, queue: QueueId, what: Later) -> Route {
        // `waiting` first: a claim raises `busy` before it takes the announcements from there.
        if !self.waiting.holds(queue) && self.busy.load(Ordering::SeqCst) == 0 {
            return Route::Direct;
        }
        let mut l = self.lock();
        let decided = l.decided.len();
        l.decided.retain(|&q| q != queue);
        if l.decided.len() != decided
            && matches!(what, Later::Report(QueueReport::Ready { .. }))
            && !self.waiting.holds(queue)
        {
            if !l.claimed.contains(&queue) {
                l.claimed.push(queue);
            }
            l.later.push((queue, what));
            self.count(&l);
            return Route::HandedOver;
        }
        let was_waiting = self.waiting.remove(queue);
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

    /// Whether an announcement waits; the spinning thread watches this.
    pub fn any_waiting(&self) -> bool {
        self.waiting.any()
    }

    /// Whether anything waits to be claimed or applied.
    pub fn any_work(&self) -> bool {
        self.waiting.any() || self.busy.load(Ordering::SeqCst) != 0 && !self.lock().later.is_empty()
    }

    /// The preemption thread takes the waiting announcements to decide on them.
    pub fn claim(&self) -> Vec<QueueId> {
        let mut l = self.lock();
        self.busy
            .store(l.claimed.len() + l.decided.len() + 2, Ordering::SeqCst);
        let taken = self.waiting.take();
        l.claimed.extend_from_slice(&taken);
        self.count(&l);
        taken
    }

    /// After the decisions: what was queued behind the claimed announcements (to apply, then
    /// call again), or nothing, and then the claims are over. The lists keep their room, so
    /// that a report queued behind a claim does not allocate on its thread.
    pub fn finish(&self) -> Vec<(QueueId, Later)> {
        let mut l = self.lock();
        if l.later.is_empty() {
            let Lists {
                claimed, decided, ..
            } = &mut *l;
            for q in claimed.drain(..) {
                if !decided.contains(&q) {
                    decided.push(q);
                }
            }
            self.count(&l);
        }
        l.later.drain(..).collect()
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

    #[test]
    fn two_announcements_wait_and_a_third_is_left_to_its_caller() {
        let a = Announcements::default();
        assert!(a.announce(Q));
        assert!(a.announce(OTHER));
        assert!(!a.announce(QueueId(3)), "both halves are taken");
        assert!(a.any_waiting());
        assert_eq!(a.route(Q, IDLE), Route::TakenBack);
        assert!(a.announce(QueueId(3)), "its half is free again");
        let mut claimed = a.claim();
        claimed.sort_by_key(|q| q.0);
        assert_eq!(claimed, vec![OTHER, QueueId(3)]);
        assert!(!a.any_waiting());
        assert!(!a.announce(QueueId(u32::MAX)), "no room for its id");
    }

    /// The queue's report and the thread's claim race for each announcement: exactly one of
    /// them gets it, and the report that lost is queued behind the claim and comes back once.
    #[test]
    fn each_announcement_is_claimed_or_taken_back_exactly_once() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let a = Arc::new(Announcements::default());
        let applied = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let claimer = {
            let (a, applied, stop) = (Arc::clone(&a), Arc::clone(&applied), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut claimed = 0;
                while !stop.load(Ordering::SeqCst) {
                    claimed += a.claim().len();
                    loop {
                        let later = a.finish();
                        if later.is_empty() {
                            break;
                        }
                        assert_eq!(later, vec![(Q, IDLE)]);
                        applied.fetch_add(1, Ordering::SeqCst);
                    }
                }
                claimed
            })
        };
        let (mut rounds, mut taken_back, mut queued, mut after) = (0, 0, 0, 0);
        let start = std::time::Instant::now();
        // Until both have won often, or for as long as a loaded machine may need to let the two
        // threads meet at all.
        while (taken_back < 100 || queued < 100) && start.elapsed().as_secs() < 30 {
            rounds += 1;
            assert!(a.announce(Q));
            // A launch's length, varied, so that the claim lands on either side of the report.
            for _ in 0..rounds % 300 {
                std::hint::spin_loop();
            }
            match a.route(Q, IDLE) {
                Route::TakenBack => taken_back += 1,
                Route::Queued => queued += 1,
                Route::Direct => {
                    // Only after the claim was finished: a claim under way would decide the
                    // announcement after the report.
                    let l = a.lock();
                    assert!(!l.claimed.contains(&Q) && !l.decided.contains(&Q));
                    after += 1;
                }
                Route::HandedOver => panic!("an Idle handed over"),
            }
            // As a queue's next announcement would, this one comes after the decision, and after
            // the claim is over: an announcement taken back by a report queued behind a claim
            // still under way (see `route`) is neither claimed nor counted as taken back here.
            while applied.load(Ordering::SeqCst) != queued || !a.lock().claimed.is_empty() {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::SeqCst);
        let claimed = claimer.join().expect("the claiming thread");
        assert_eq!(claimed, queued + after);
        assert_eq!(taken_back + claimed, rounds);
        // Every round was checked above; this only says that both sides of the race were.
        assert!(
            taken_back >= 1 && queued >= 1,
            "no race: {taken_back} taken back, {queued} queued"
        );
    }
}
