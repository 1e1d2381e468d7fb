//! Local mode's preemption thread: while a queue with work can be preempted (a queue above it
//! in the policy's order exists, [`super::Scheduler::preemption_ranks`]) and a preemption
//! happened lately, it spins, and the suspensions the scheduler decides are handed to it instead
//! of running on the reporting thread. A latency-critical submission then pays for the decision
//! only, not for stopping the best-effort queue's hardware (driver calls that contend with the
//! best-effort queue's own threads), and goes on launching while the other queue stops, as a
//! dedicated controller would. Otherwise (nothing exposed, or quiet for `hot`) it sleeps and the
//! suspensions run inline, as before, at no CPU cost.

use super::driver::QueueControl;
use super::protocol::QueueReport;
use crate::xqueue::QueueOpError;
use crate::xqueue::threaded::Preemptible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};
use xpreempt_types::{Nanos, QueueId};

/// How long the preemption thread keeps spinning after the last preemption, by default.
pub const DEFAULT_HOT: Duration = Duration::from_millis(50);

const NEVER: u64 = u64::MAX;

/// A value alone on its cache line (128 bytes: two lines, which some CPUs fetch in pairs).
#[repr(align(128))]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

pub(crate) struct Preempter {
    /// Queues to suspend, if the scheduler still wants them suspended when the thread gets there.
    todo: Mutex<Vec<QueueId>>,
    /// Queues whose suspension or resumption the scheduler decided and nobody made yet: the
    /// thread that decided makes them once it has let go of the driver's lock.
    deferred: Mutex<Vec<QueueId>>,
    /// What the spinning thread reads in its loop: alone on its cache line, so that the
    /// reporting threads' writes to the fields around it do not pull the line away from it and
    /// back on every turn (each transfer costs the reporting thread, on the submission's path).
    bell: OwnLine<AtomicU64>,
    /// The thread spins now and takes hand-offs (read on every report).
    spinning: OwnLine<AtomicBool>,
    /// A queue with work may be preempted (the last decision saw a queue ranked above it).
    exposed: AtomicBool,
    /// When (ns since `epoch`) the scheduler last suspended a queue ([`NEVER`]: not yet).
    last: AtomicU64,
    hot: Duration,
    epoch: Instant,
    thread: OnceLock<Thread>,
}

impl Preempter {
    pub fn new(hot: Duration) -> Self {
        Self {
            todo: Mutex::new(Vec::new()),
            deferred: Mutex::new(Vec::new()),
            bell: OwnLine(AtomicU64::new(0)),
            spinning: OwnLine(AtomicBool::new(false)),
            exposed: AtomicBool::new(false),
            last: AtomicU64::new(NEVER),
            hot,
            epoch: Instant::now(),
            thread: OnceLock::new(),
        }
    }

    pub fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    pub fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    pub fn set_exposed(&self, exposed: bool) {
        // Written on every decision, read by the spinning thread: a store only when it changes.
        if self.exposed.load(Ordering::SeqCst) != exposed {
            self.exposed.store(exposed, Ordering::SeqCst);
        }
    }

    /// Whether the thread should spin now.
    pub fn is_hot(&self) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.last.load(Ordering::SeqCst);
        self.exposed.load(Ordering::SeqCst)
            && last != NEVER
            && now.saturating_sub(last) < self.hot.as_nanos() as u64
    }

    pub fn spinning(&self, on: bool) {
        // Set on every turn of the thread's loop, read on every submission: a store only when
        // it changes.
        if self.spinning.load(Ordering::SeqCst) != on {
            self.spinning.store(on, Ordering::SeqCst);
        }
    }

    pub fn is_spinning(&self) -> bool {
        self.spinning.load(Ordering::SeqCst)
    }

    /// Tells the thread there is work for it. It may have stopped spinning after the caller
    /// looked and drained before the caller's push: it is not left asleep with work (an unpark
    /// before its park makes the park return at once).
    pub fn ring(&self) {
        self.bell.fetch_add(1, Ordering::SeqCst);
        self.nudge();
    }

    /// Wakes the thread if it does not spin: work was left where it looks before it sleeps
    /// (an announcement), and it may have looked there already.
    pub fn nudge(&self) {
        if !self.spinning.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    pub fn bell(&self) -> u64 {
        self.bell.load(Ordering::SeqCst)
    }

    /// The scheduler suspends a queue: the thread is to spin for `hot` from now; it starts at
    /// once if it sleeps (never, when it is never to spin: the wake-up would be for nothing).
    fn noted(&self) {
        self.last
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::SeqCst);
        if !self.hot.is_zero() && !self.spinning.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Hands the suspension of `queue` to the spinning thread; `false` if it does not spin (the
    /// deciding thread makes it, once it has let go of the driver's lock).
    fn hand_off(&self, queue: QueueId) -> bool {
        if !self.spinning.load(Ordering::SeqCst) {
            return false;
        }
        self.todo
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue);
        self.ring();
        true
    }

    /// `queue` was stopped meanwhile: a hand-off of its stop is moot.
    pub fn forget(&self, queue: QueueId) {
        self.todo
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&q| q != queue);
    }

    /// What was handed off so far.
    pub fn take(&self) -> Vec<QueueId> {
        std::mem::take(&mut *self.todo.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// `queue` is to be brought to what the scheduler wants once the driver's lock is let go.
    pub fn defer(&self, queue: QueueId) {
        let mut deferred = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        if !deferred.contains(&queue) {
            deferred.push(queue);
        }
    }

    /// What was deferred so far; taken under the driver's lock by the thread that decided it.
    pub fn take_deferred(&self) -> Vec<QueueId> {
        std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A queue as local mode's driver controls it: suspensions may go to the preemption thread.
pub(crate) struct LocalQueue {
    pub queue: Arc<dyn Preemptible>,
    pub preempter: Arc<Preempter>,
}

/// Neither a suspension nor a resumption runs under the driver's lock: they are driver calls
/// that may wait for the queue's own thread (its launch holds the queue's lock), and a
/// latency-critical submission needs that lock for its announcement and its Ready. A resumption
/// of the best-effort queue that the last request's Idle decided took 40 µs at p50 and up to
/// 2.6 ms on an H100 host.
impl QueueControl for LocalQueue {
    fn suspend(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        if !self.preempter.hand_off(self.queue.queue_id()) {
            self.preempter.defer(self.queue.queue_id());
        }
        self.preempter.noted();
        Ok(None)
    }

    fn resume(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.preempter.defer(self.queue.queue_id());
        Ok(None)
    }

    fn set_refused(&mut self, refused: bool) {
        Preemptible::set_refused(&*self.queue, refused);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a thread parked for `nap` was woken early while `f` ran.
    fn woke_early(nap: Duration, f: impl FnOnce(&Preempter)) -> bool {
        let p = Preempter::new(Duration::ZERO);
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            tx.send(()).ok();
            let start = Instant::now();
            std::thread::park_timeout(nap);
            start.elapsed() < nap
        });
        p.set_thread(t.thread().clone());
        rx.recv().ok();
        std::thread::sleep(Duration::from_millis(20));
        f(&p);
        t.join().unwrap_or(true)
    }

    #[test]
    fn a_preempter_that_never_spins_is_not_woken_by_suspensions() {
        let nap = Duration::from_millis(300);
        assert!(
            woke_early(nap, |p| p.wake()),
            "the probe must see a wake-up"
        );
        assert!(!woke_early(nap, |p| p.noted()));
    }
}
