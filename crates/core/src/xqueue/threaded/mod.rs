//! An XQueue for real devices: shared between threads, with a completion watcher.
//!
//! `submit` runs the state machine on the caller's thread under an uncontended lock, so a queue
//! that may run and has room in its window launches with no hand-off. The watcher thread blocks in
//! `synchronize` (never while holding the lock) to open the window, to notice when the queue goes
//! idle, and to drain a Lv1 suspension; it sleeps while the queue is idle.

mod lend;
mod watcher;

pub use lend::Lent;

use super::{QueueOpError, SubmitError, XQueue};
use crate::sched::{QueueControl, QueueReport};
use crate::stats::GpuTimeSummary;
use crate::stats::QueueStats;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Nanos, Priority, QueueId, Seq};

/// Where a queue reports (the scheduler's inbox). Never called while the queue's lock is held.
pub trait ReportSink: Send + Sync {
    fn report(&self, queue: QueueId, report: QueueReport);
    /// Whether the scheduler wants [`QueueReport::Submitted`] / [`QueueReport::Completed`]; read
    /// on every submission, so it must be cheap.
    fn wants_work(&self) -> bool;

    /// A submission is about to reach a queue that may be idle, before its launch: a scheduler
    /// may act on the queue's coming Ready ahead of the report (stop the queues it preempts
    /// while the launch goes on). The Ready (or nothing, if the queue had work already) follows
    /// as usual, or [`ReportSink::submit_failed`] if the submission did not happen.
    fn submitting(&self, queue: QueueId) {
        let _ = queue;
    }

    /// The submission announced by `submitting` failed and left the queue without work: what
    /// was done ahead of its Ready is to be undone.
    fn submit_failed(&self, queue: QueueId) {
        let _ = queue;
    }

    /// Whether a waiter that saw `queue`'s last command complete reports the queue's Idle
    /// itself, before it returns, rather than leave it to the completion watcher, which notices
    /// later, once it has woken. Only where the report costs the waiter no driver call and no
    /// system call: the resumes an Idle causes in a local scheduler would contend with the
    /// waiter's return in the driver.
    fn idle_from_waiter(&self, queue: QueueId) -> bool {
        let _ = queue;
        false
    }

    /// What the sink held back from a report to keep it off the application's thread (a
    /// wake-up of the scheduler it owes) goes out now. The completion watcher calls it before
    /// and after each wait on the hardware, which it turns to soon after any Ready.
    fn flush(&self, queue: QueueId) {
        let _ = queue;
    }
}

pub type EventSink = Arc<dyn ReportSink>;

/// What a scheduler may do to a shared queue, whatever its backend. Suspend and resume may
/// change the queue's activity (they take in completions); the report comes back to the caller
/// instead of going through the sink, since the caller is usually the scheduler itself.
pub trait Preemptible: Send + Sync {
    fn queue_id(&self) -> QueueId;
    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError>;
    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError>;
    fn set_refused(&self, refused: bool);
    /// A snapshot of the queue's counters and latency histograms.
    fn stats(&self) -> QueueStats;
    /// The queue's GPU-time measurements as of now on its own clock: its busy fraction keeps
    /// fading while it is idle, which the summary as of its last event would not show.
    fn gpu_time(&self) -> GpuTimeSummary {
        self.stats().gpu.last_summary()
    }
}

/// A shared queue keeps its own clock (its watcher times settling on it); the driver's `now`
/// is not used.
impl QueueControl for Arc<dyn Preemptible> {
    fn suspend(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        Preemptible::suspend(&**self)
    }

    fn resume(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        Preemptible::resume(&**self)
    }

    fn set_refused(&mut self, refused: bool) {
        Preemptible::set_refused(&**self, refused);
    }
}

struct Inner<H: HwQueue> {
    hal: H,
    queue: Mutex<XQueue<H::Payload>>,
    /// Wakes the watcher when the queue gets work or is resumed.
    work: Condvar,
    /// Wakes waiters in `wait` after every poll.
    progress: Condvar,
    refused: AtomicBool,
    /// The watcher, idle, looks for work by itself every [`watcher::IDLE_POLL_TICK`] (changed
    /// only under the queue's lock): a submission need not wake it.
    polling: AtomicBool,
    /// A submission found the watcher polling and did not wake it; the first wait does.
    wake_owed: AtomicBool,
    /// Whether the last Ready/Idle reported was Ready: submissions to a queue that may be idle
    /// are announced to the sink ahead of their launch.
    reported_active: AtomicBool,
    shutdown: AtomicBool,
    /// The queue stops through Lv2's `deactivate`, so a suspension tries `stop_ahead` first.
    stops_ahead: bool,
    /// Its Ready waits for a wait ([`crate::QueueConfig::with_ready_when_waited`]), so a
    /// submission is not announced ahead of it.
    ready_when_waited: bool,
    epoch: Instant,
    sink: Option<EventSink>,
    /// The priorities of the calls in [`SharedXQueue::wait_launched_for`] now.
    waiters: Mutex<Vec<Priority>>,
}

/// What the process does on a completion watcher's thread as it ends, after it let go of its
/// queue and before the thread's own teardown (thread-local destructors, a driver library's
/// among them): a front end whose process must not fork while a thread tears down inside the
/// driver (the CUDA shim) holds forks off from here. Set once per process.
static WATCHER_ENDING: OnceLock<fn()> = OnceLock::new();

/// Sets [`WATCHER_ENDING`]'s hook; `false` if one was set already.
pub fn on_watcher_ending(hook: fn()) -> bool {
    WATCHER_ENDING.set(hook).is_ok()
}

pub struct SharedXQueue<H: HwQueue> {
    inner: Arc<Inner<H>>,
    id: QueueId,
    watcher: Option<JoinHandle<()>>,
}

/// A submission the queue did not take; the command comes back.
#[derive(Debug, thiserror::Error)]
pub enum TrySubmitError<P> {
    #[error("queue {0}: admission refused, retry later")]
    Busy(QueueId, Command<P>),
    #[error(transparent)]
    Launch(#[from] SubmitError<P>),
}

impl<H> SharedXQueue<H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
    pub fn new(queue: XQueue<H::Payload>, hal: H, sink: Option<EventSink>) -> Self {
        let id = queue.id();
        let stops_ahead = queue.stops_ahead();
        let ready_when_waited = queue.config().ready_when_waited();
        let inner = Arc::new(Inner {
            hal,
            queue: Mutex::new(queue),
            work: Condvar::new(),
            progress: Condvar::new(),
            refused: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            wake_owed: AtomicBool::new(false),
            reported_active: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            stops_ahead,
            ready_when_waited,
            epoch: Instant::now(),
            sink,
            waiters: Mutex::new(Vec::new()),
        });
        let watcher_inner = Arc::clone(&inner);
        let watcher = std::thread::Builder::new()
            .name(format!("xpreempt-{id}"))
            .spawn(move || {
                watcher::watch(&watcher_inner, id);
                drop(watcher_inner);
                if let Some(hook) = WATCHER_ENDING.get() {
                    hook();
                }
            })
            .ok();
        if watcher.is_none() {
            tracing::error!(queue = %id, "could not start the completion watcher; waits will poll");
        }
        Self { inner, id, watcher }
    }

    pub fn id(&self) -> QueueId {
        self.id
    }

    pub fn hal(&self) -> &H {
        &self.inner.hal
    }

    /// The hot path: launches at once when the queue may run and has room.
    pub fn submit(&self, command: Command<H::Payload>) -> Result<Seq, TrySubmitError<H::Payload>> {
        if self.inner.refused.load(Ordering::Relaxed) {
            self.inner.report(self.id, QueueReport::Retry);
            return Err(TrySubmitError::Busy(self.id, command));
        }
        let announced = match &self.inner.sink {
            Some(sink)
                if !self.inner.ready_when_waited
                    && !self.inner.reported_active.load(Ordering::Relaxed) =>
            {
                sink.submitting(self.id);
                true
            }
            _ => false,
        };
        let kind = command.op.kind();
        let (submitted, watcher_polls, unreported_start) = {
            let mut q = self.inner.lock();
            let was_idle = q.is_idle();
            match q.submit(&self.inner.hal, command, || self.inner.now()) {
                Ok(s) => {
                    // Work waiting for room needs the watcher at once to launch it.
                    let polls = self.inner.polling.load(Ordering::Relaxed) && q.pending_len() == 0;
                    // A burst whose Ready waits for a wait still needs the watcher to see it
                    // complete.
                    (s, polls, was_idle && s.report.is_none())
                }
                Err(e) => {
                    let idle = q.is_idle();
                    drop(q);
                    if announced
                        && idle
                        && let Some(sink) = &self.inner.sink
                    {
                        sink.submit_failed(self.id);
                    }
                    return Err(e.into());
                }
            }
        };
        if self.inner.wants_work() {
            let seq = submitted.seq;
            self.inner
                .report(self.id, QueueReport::Submitted { kind, seq });
        }
        if submitted.report.is_some() || unreported_start {
            if watcher_polls {
                self.inner.wake_owed.store(true, Ordering::Relaxed);
            } else {
                self.inner.work.notify_one();
            }
        }
        if let Some(report) = submitted.report {
            self.inner.report(self.id, report);
        }
        Ok(submitted.seq)
    }

    /// The application waits for this queue's work: it blocks on it, polls it or asks to be
    /// called back. A queue whose Ready waits for that
    /// ([`crate::QueueConfig::with_ready_when_waited`]) reports it now.
    pub fn waited(&self) {
        if !self.inner.ready_when_waited || self.inner.reported_active.load(Ordering::Relaxed) {
            return;
        }
        let report = self.inner.lock().waited();
        if let Some(report) = report {
            self.inner.report(self.id, report);
        }
    }

    /// Launches from the pending buffer into the room made by the completions the hardware can
    /// tell without blocking ([`HwQueue::take_in_completions`]), on the caller's thread: a front
    /// end whose application keeps submitting to a backlogged queue may feed the window so,
    /// before each submission, rather than leave it to the completion watcher, which refills
    /// only at its sync points. Nothing happens while the queue is suspended or holds nothing.
    pub fn refill(&self) {
        let (polled, launched) = {
            let mut q = self.inner.lock();
            let pending = q.pending_len();
            if pending == 0 || q.is_suspended() {
                return;
            }
            self.inner.hal.take_in_completions();
            let polled = self.inner.poll_locked(&mut q, self.inner.now());
            (polled, q.pending_len() < pending)
        };
        if launched {
            self.inner.progress.notify_all();
        }
        self.inner.report_progress(self.id, polled);
    }

    /// Submits, backing off (from 50 µs, doubling, up to 10 ms between tries) while admission
    /// is refused, for at most `patience`.
    pub fn submit_with_retry(
        &self,
        mut command: Command<H::Payload>,
        patience: Duration,
    ) -> Result<Seq, TrySubmitError<H::Payload>> {
        let mut deadline = None;
        let mut backoff = Duration::from_micros(50);
        loop {
            match self.submit(command) {
                Err(TrySubmitError::Busy(id, c))
                    if Instant::now()
                        < *deadline.get_or_insert_with(|| Instant::now() + patience) =>
                {
                    command = c;
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(10));
                    let _ = id;
                }
                other => return other,
            }
        }
    }

    /// Blocks until command `seq` has completed. A launched command is waited for on the
    /// hardware from this thread, so completion is seen without a hand-off from the watcher.
    pub fn wait(&self, seq: Seq) -> Result<(), HalError> {
        self.waited();
        // The watcher reports the Idle this wait is likely to end in: it starts now, off this
        // thread, rather than at its next poll.
        self.inner.pay_owed_wake();
        if self.watcher.is_none() {
            // Nobody else would.
            self.inner.flush_sink(self.id);
        }
        // Cleared for a hardware that cannot block (a virtual clock): then the watcher reports.
        let mut direct = true;
        loop {
            let target = {
                let mut q = self.inner.lock();
                if q.completed() > seq {
                    return Ok(());
                }
                match direct.then(|| q.sync_target(&self.inner.hal, seq)) {
                    Some(Ok(Some(t))) => Some(t),
                    Some(Err(e)) => return Err(e.source),
                    _ => {
                        // Not launched, stopped, or a hardware that cannot block: the watcher
                        // reports progress.
                        drop(
                            self.inner
                                .progress
                                .wait_timeout(q, Duration::from_millis(1))
                                .unwrap_or_else(|p| p.into_inner()),
                        );
                        None
                    }
                }
            };
            let Some(target) = target else { continue };
            match self.inner.hal.synchronize(target) {
                Ok(()) => {}
                Err(HalError::WouldBlock(_)) if self.watcher.is_some() => {
                    direct = false;
                    continue;
                }
                Err(HalError::WouldBlock(_)) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => return Err(e),
            }
            if self.watcher.is_some() && self.inner.hal.completed() > seq {
                // The watcher wakes on the same sync point and reports Idle; leaving that (and the
                // resumes it may cause) to it keeps them off the waiter's critical path, unless
                // the sink takes the report at no cost to the waiter.
                if self
                    .inner
                    .sink
                    .as_ref()
                    .is_some_and(|s| s.idle_from_waiter(self.id))
                {
                    // Other waiters hear of it from the watcher's poll, which follows.
                    self.inner.report_progress(self.id, self.inner.poll());
                }
                return Ok(());
            }
            self.inner.poll_and_report(self.id);
        }
    }

    /// Blocks until everything submitted so far has completed.
    pub fn wait_all(&self) -> Result<(), HalError> {
        let last = self.inner.lock().next_seq();
        match last.checked_sub(1) {
            Some(seq) => self.wait(seq),
            None => Ok(()),
        }
    }

    pub fn is_suspended(&self) -> bool {
        self.inner.lock().is_suspended()
    }

    /// Commands submitted but not yet handed to the hardware.
    pub fn pending_len(&self) -> usize {
        self.inner.lock().pending_len()
    }

    /// Blocks until every command submitted so far has been handed to the hardware (not
    /// necessarily completed): what a front end needs before it lets an operation that bypasses
    /// the queue reach the same hardware queue.
    pub fn wait_launched(&self) {
        self.inner.pay_owed_wake();
        let mut q = self.inner.lock();
        while q.pending_len() > 0 {
            // The watcher notifies `progress` after every poll; the timeout covers a resume that
            // launched the pending buffer from another thread without a poll.
            q = self
                .inner
                .progress
                .wait_timeout(q, Duration::from_millis(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl<H> Preemptible for SharedXQueue<H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
    fn queue_id(&self) -> QueueId {
        self.id
    }

    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError> {
        // Before the lock, which the queue's own launch holds through its driver call.
        let ahead = self.inner.stops_ahead && self.inner.hal.stop_ahead();
        let now = self.inner.now();
        let report = {
            let mut q = self.inner.lock();
            q.suspend_after(&self.inner.hal, now, ahead)?;
            q.poll(&self.inner.hal, now)?
        };
        self.inner.work.notify_one();
        self.inner.mirror(report.as_ref());
        Ok(report)
    }

    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError> {
        let now = self.inner.now();
        let report = {
            let mut q = self.inner.lock();
            q.resume(&self.inner.hal, now)?;
            q.take_report()
        };
        self.inner.work.notify_one();
        self.inner.progress.notify_all();
        self.inner.mirror(report.as_ref());
        Ok(report)
    }

    fn set_refused(&self, refused: bool) {
        self.inner.refused.store(refused, Ordering::Relaxed);
    }

    fn stats(&self) -> QueueStats {
        self.inner.lock().stats().clone()
    }

    fn gpu_time(&self) -> GpuTimeSummary {
        let now = self.inner.now();
        self.inner.lock().stats().gpu.summary(now)
    }
}

impl<H: HwQueue> Drop for SharedXQueue<H> {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Relaxed);
        // Taken once so that the watcher is either before its look at `shutdown` (it sees it)
        // or already waiting (the notification reaches it): a notification between its look
        // and its wait would be lost, and the join below would wait forever.
        drop(self.inner.lock());
        self.inner.work.notify_all();
        // The last owner may let go on the watcher itself (it reports to an agent or scheduler
        // that the application dropped meanwhile): it sees `shutdown` when it returns, and
        // keeps what it uses alive until then.
        if let Some(w) = self.watcher.take()
            && w.thread().id() != std::thread::current().id()
        {
            let _ = w.join();
        }
    }
}

/// The queue's lock, shared with the HAL's own (a HAL keeps its launch path and its watcher
/// apart the same way).
pub use xpreempt_hal::lock_quietly;

impl<H: HwQueue> Inner<H> {
    fn lock(&self) -> MutexGuard<'_, XQueue<H::Payload>> {
        lock_quietly(&self.queue)
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Keeps `reported_active` in line with a Ready/Idle about to reach the scheduler.
    fn mirror(&self, report: Option<&QueueReport>) {
        match report {
            Some(QueueReport::Ready { .. }) => self.reported_active.store(true, Ordering::Relaxed),
            Some(QueueReport::Idle { .. }) => self.reported_active.store(false, Ordering::Relaxed),
            _ => {}
        }
    }

    fn report(&self, id: QueueId, report: QueueReport) {
        self.mirror(Some(&report));
        if let Some(sink) = &self.sink {
            sink.report(id, report);
        }
    }

    fn wants_work(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| s.wants_work())
    }

    /// Completed work for the hooks, then a Ready/Idle, as a poll found them.
    fn report_progress(&self, id: QueueId, (upto, report): (Option<Seq>, Option<QueueReport>)) {
        if let Some(upto) = upto
            && self.wants_work()
        {
            self.report(id, QueueReport::Completed { upto });
        }
        if let Some(report) = report {
            self.report(id, report);
        }
    }

    fn flush_sink(&self, id: QueueId) {
        if let Some(sink) = &self.sink {
            sink.flush(id);
        }
    }

    fn pay_owed_wake(&self) {
        if self.wake_owed.swap(false, Ordering::Relaxed) {
            self.work.notify_one();
        }
    }

    /// Polls the queue, wakes waiters, then reports (unlocked) what changed: completed work
    /// for the hooks, and Idle.
    fn poll_and_report(&self, id: QueueId) {
        let polled = self.poll();
        self.progress.notify_all();
        self.report_progress(id, polled);
    }

    /// [`Self::poll_locked`] under the queue's lock, taken here.
    fn poll(&self) -> (Option<Seq>, Option<QueueReport>) {
        let mut q = self.lock();
        // Read under the lock: a drain seen now must not be dated before a wait for the lock.
        let now = self.now();
        self.poll_locked(&mut q, now)
    }

    /// Polls the queue (under its lock): how far completions now reach, if further than before,
    /// and the Ready/Idle owed; [`Self::report_progress`] reports them once the lock is let go.
    fn poll_locked(
        &self,
        q: &mut XQueue<H::Payload>,
        now: Nanos,
    ) -> (Option<Seq>, Option<QueueReport>) {
        let before = q.completed();
        let report = q.poll(&self.hal, now).unwrap_or_else(|e| {
            // The watcher retries the launch.
            tracing::warn!(%e, "launch from the pending buffer failed; will retry");
            None
        });
        let upto = q.completed();
        ((upto > before).then_some(upto), report)
    }
}
