//! The XQueue: a preemptible command queue in front of one hardware queue.
//!
//! Commands go pending buffer → launch → in-flight log → completed. Progressive launching (Lv1)
//! keeps at most `threshold` commands in flight and asks the hardware for a sync point every
//! `batch` launches, so a suspension only ever waits for a bounded window. Lv2 and Lv3 also stop
//! what is in flight and hand the in-flight log back on resume; the application never resubmits.
//!
//! This type is a synchronous state machine: it does not own the hardware queue or a thread, and
//! every call gets the time from its caller. Simulations drive it from their event loop;
//! [`threaded::SharedXQueue`] wraps it with a lock and a completion watcher for real devices.

mod bound;
mod config;
mod report;
pub mod threaded;

pub use bound::{BoundQueue, DriveError};
pub use config::{ConfigError, DEFAULT_BATCH, DEFAULT_THRESHOLD, QueueConfig};

use crate::sched::QueueReport;
pub use crate::sched::protocol::QueueState;
use crate::stats::QueueStats;
use std::collections::VecDeque;
use thiserror::Error;
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Nanos, QueueId, Seq};

/// A launch the hardware refused; the command comes back so that nothing is lost.
#[derive(Debug, Error)]
#[error("queue {queue}: launch of command {seq} failed")]
pub struct SubmitError<P> {
    pub queue: QueueId,
    pub seq: Seq,
    pub source: HalError,
    pub command: Command<P>,
}

#[derive(Debug, Error, Clone)]
#[error("queue {queue}: {op} failed")]
pub struct QueueOpError {
    pub queue: QueueId,
    pub op: &'static str,
    pub source: HalError,
}

/// A submitted command's number, and the report the submission owes the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub seq: Seq,
    pub report: Option<QueueReport>,
}

/// What the completion watcher of a threaded queue should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPlan {
    /// Nothing in flight to watch.
    Nothing,
    /// Block until the watermark reaches this sequence number, then poll.
    Synchronize(Seq),
    /// Ask the hardware for a sync point after the last launch first.
    RecordSyncThenSynchronize(Seq),
}

pub struct XQueue<P> {
    id: QueueId,
    config: QueueConfig,
    /// The level in use: the configured one, capped at what the hardware supports.
    level: Level,
    pending: VecDeque<Launched<P>>,
    in_flight: VecDeque<Launched<P>>,
    next_seq: Seq,
    completed: Seq,
    /// Watermarks that a sync point will make observable, oldest first.
    sync_points: VecDeque<Seq>,
    since_sync: u32,
    suspended: bool,
    /// The hardware-level stop that resume must undo.
    hw_stopped: Option<Level>,
    stopping_since: Option<Nanos>,
    resuming_since: Option<Nanos>,
    /// Whether the last event reported was Ready (true) or Idle (false).
    reported_active: bool,
    /// The application waited for the work of this burst
    /// ([`QueueConfig::with_ready_when_waited`]).
    waited: bool,
    /// Events reported so far: orders reports that travel on different threads.
    transitions: u64,
    stats: QueueStats,
}

impl<P> XQueue<P> {
    pub fn new(id: QueueId, config: QueueConfig, hardware_level: Level) -> Self {
        // Capacity grows with use; a huge threshold must not allocate up front.
        let threshold = (config.threshold() as usize).min(1024);
        Self {
            id,
            level: config.level().min(hardware_level),
            config,
            pending: VecDeque::with_capacity(threshold * 4),
            in_flight: VecDeque::with_capacity(threshold),
            next_seq: 0,
            completed: 0,
            sync_points: VecDeque::with_capacity(threshold),
            since_sync: 0,
            suspended: false,
            hw_stopped: None,
            stopping_since: None,
            resuming_since: None,
            reported_active: false,
            waited: false,
            transitions: 0,
            stats: QueueStats::default(),
        }
    }

    pub fn id(&self) -> QueueId {
        self.id
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn config(&self) -> QueueConfig {
        self.config
    }

    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }

    /// Sequence number the next submitted command gets.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// Every command with a smaller sequence number has completed.
    pub fn completed(&self) -> Seq {
        self.completed
    }

    /// How many Ready/Idle events this queue has produced; the last one has this number.
    pub fn transitions(&self) -> u64 {
        self.transitions
    }

    /// A suspension or resumption is under way and not yet settled in hardware.
    pub fn is_settling(&self) -> bool {
        self.stopping_since.is_some() || self.resuming_since.is_some()
    }

    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.in_flight.is_empty()
    }

    pub fn state(&self) -> QueueState {
        if self.suspended {
            QueueState::Suspended
        } else if !self.in_flight.is_empty() {
            QueueState::Running
        } else if !self.pending.is_empty() {
            QueueState::Ready
        } else {
            QueueState::Idle
        }
    }

    /// The hot path. Launches on the caller's thread when the queue may run and its window has
    /// room; otherwise the command waits in the pending buffer for `poll`. `clock` is read only
    /// when the queue has nothing in flight.
    pub fn submit<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        command: Command<P>,
        clock: impl Fn() -> Nanos,
    ) -> Result<Submitted, SubmitError<P>> {
        let seq = self.next_seq;
        let entry = Launched { seq, command };
        // Only a queue with nothing on the device dates a submission (a burst or an interval of
        // its GPU time starts); the hot path of a busy queue reads no clock.
        let now = if self.in_flight.is_empty() {
            clock()
        } else {
            0
        };
        if self.is_idle() {
            self.stats.gpu.activated(now);
        }
        if self.pending.is_empty() && self.window_open() {
            match self.launch(hal, entry, now) {
                Ok(()) => {}
                // A stop ahead is under way: the command waits for the suspension after it.
                Err((HalError::Stopping(_), entry)) => self.pending.push_back(entry),
                Err((source, entry)) => {
                    return Err(SubmitError {
                        queue: self.id,
                        seq,
                        source,
                        command: entry.command,
                    });
                }
            }
        } else {
            self.pending.push_back(entry);
        }
        self.next_seq += 1;
        self.stats.submitted += 1;
        Ok(Submitted {
            seq,
            report: self.take_report(),
        })
    }

    /// Takes in completions, finishes suspend/resume bookkeeping, and launches what the window
    /// allows. Returns `Idle` once the last command has completed, whichever call saw it happen.
    pub fn poll<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
    ) -> Result<Option<QueueReport>, QueueOpError> {
        self.progress(hal, now)?;
        Ok(self.take_report())
    }

    fn progress<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
    ) -> Result<(), QueueOpError> {
        self.reap(hal, now);
        self.note_settled(hal, now);
        if !self.suspended {
            while self.window_open() {
                let Some(entry) = self.pending.pop_front() else {
                    break;
                };
                if let Err((source, entry)) = self.launch(hal, entry, now) {
                    self.pending.push_front(entry);
                    if let HalError::Stopping(_) = source {
                        break; // the suspension after the stop ahead takes over
                    }
                    return Err(self.op_error("launch", source));
                }
                self.stats.buffered_launches += 1;
            }
        }
        Ok(())
    }

    /// Stops the queue: no new launches, and at Lv2/Lv3 the hardware stops what is in flight. A
    /// hardware failure leaves the queue suspended at Lv1 (it drains) and is returned.
    pub fn suspend<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
    ) -> Result<bool, QueueOpError> {
        self.suspend_after(hal, now, false)
    }

    /// Whether [`HwQueue::stop_ahead`] may be tried before [`Self::suspend_after`]: only a Lv2
    /// queue stops through `deactivate`.
    pub fn stops_ahead(&self) -> bool {
        self.level == Level::Lv2
    }

    /// [`Self::suspend`] after the caller tried [`HwQueue::stop_ahead`] (before it took the
    /// queue's lock): a stop ahead that was made (`ahead`) is always followed by `deactivate`,
    /// whatever else this suspension finds, since the backend holds the stop until then.
    pub fn suspend_after<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
        ahead: bool,
    ) -> Result<bool, QueueOpError> {
        self.stats.stops_ahead += u64::from(ahead);
        if self.suspended {
            if ahead && self.hw_stopped.is_none() {
                // Suspended already, but not by the hardware (a failed stop drains): the stop
                // ahead is this suspension's now.
                self.stop_hardware(hal, now)?;
            }
            return Ok(false);
        }
        self.suspended = true;
        self.stats.preemptions += 1;
        self.resuming_since = None;
        self.reap(hal, now);
        // A queue with nothing in flight stops at once; timing it would only add zeros.
        self.stopping_since = (!self.in_flight.is_empty()).then_some(now);
        let hardware = ahead || (!self.in_flight.is_empty() && self.hardware_stop_pays(hal));
        let result = if hardware && self.level >= Level::Lv2 {
            self.stop_hardware(hal, now).map(|()| true)
        } else {
            Ok(true)
        };
        self.note_settled(hal, now);
        result
    }

    /// Whether stopping in the hardware can get this queue's work off the device sooner than
    /// letting it drain. At Lv3 only if its commands, as measured, each run longer than an
    /// interrupt takes to act: shorter ones finish before the interrupt would, and draining them
    /// costs the queue no switch and no call. Lv2's guard acts within a block, so it always pays.
    fn hardware_stop_pays<H: HwQueue<Payload = P>>(&self, hal: &H) -> bool {
        if self.level != Level::Lv3 {
            return true;
        }
        match (hal.interrupt_cost_ns(), self.stats.gpu.per_command_ns()) {
            (Some(interrupt), Some(per_command)) => per_command > interrupt,
            _ => true,
        }
    }

    /// Lv2 `deactivate` or Lv3 `interrupt`; a failure leaves the suspension draining at Lv1.
    fn stop_hardware<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
    ) -> Result<(), QueueOpError> {
        if self.level >= Level::Lv2 {
            let (op, outcome) = if self.level == Level::Lv3 {
                ("interrupt", hal.interrupt())
            } else {
                ("deactivate", hal.deactivate())
            };
            match outcome {
                Ok(()) => {
                    self.hw_stopped = Some(self.level);
                    self.stats.gpu.stopped(now);
                }
                Err(source) => {
                    tracing::warn!(queue = %self.id, op, %source, "hardware stop failed; this suspension drains at Lv1");
                    self.stats.hal_errors += 1;
                    return Err(self.op_error(op, source));
                }
            }
        }
        Ok(())
    }

    /// Lets the queue run again from where it stopped: restores or reactivates what the hardware
    /// stopped, then relaunches from the pending buffer.
    pub fn resume<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        now: Nanos,
    ) -> Result<bool, QueueOpError> {
        if !self.suspended {
            return Ok(false);
        }
        // What completed while suspended is taken in first: it did not run dry for want of work.
        self.reap(hal, now);
        self.suspended = false;
        if let Some(since) = self.stopping_since.take() {
            // Resumed before the hardware was ever free of this queue's work: the suspension
            // never took full effect, and it lasted this long.
            self.record_stop(now.saturating_sub(since));
        }
        self.stats.resumes += 1;
        if let Some(level) = self.hw_stopped.take() {
            let log = self.in_flight.make_contiguous();
            let (op, outcome) = if level == Level::Lv3 {
                ("restore", hal.restore(log))
            } else {
                ("reactivate", hal.reactivate(log))
            };
            if let Err(source) = outcome {
                // The work is still in the log; stay stopped so that nothing is lost, and let the
                // caller retry.
                self.suspended = true;
                self.hw_stopped = Some(level);
                self.stats.hal_errors += 1;
                return Err(self.op_error(op, source));
            }
            self.resuming_since = Some(now);
            self.stats.gpu.restarted(now, self.in_flight.len());
        } else {
            self.stats.resume_latency.record(0);
        }
        self.progress(hal, now)?;
        Ok(true)
    }

    /// For the completion watcher of a threaded queue.
    pub fn wait_plan(&self) -> WaitPlan {
        let Some(last) = self.in_flight.back() else {
            return WaitPlan::Nothing;
        };
        if self.hw_stopped.is_some() {
            // Stopped work does not complete until resume; waiting on it would hang.
            return WaitPlan::Nothing;
        }
        let tail = last.seq + 1;
        if !self.pending.is_empty()
            && !self.suspended
            && let Some(&next) = self.sync_points.front()
        {
            return WaitPlan::Synchronize(next);
        }
        if self.sync_points.back() == Some(&tail) {
            WaitPlan::Synchronize(self.sync_points.front().copied().unwrap_or(tail))
        } else {
            WaitPlan::RecordSyncThenSynchronize(tail)
        }
    }

    /// The oldest sync point still ahead, if any.
    pub fn next_sync_point(&self) -> Option<Seq> {
        self.sync_points.front().copied()
    }

    /// The watermark to synchronize on so that command `seq` is seen complete, asking the hardware
    /// for a sync point if none covers it yet. `None` while the command cannot complete by
    /// waiting (not launched yet, or stopped by the hardware).
    pub fn sync_target<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        seq: Seq,
    ) -> Result<Option<Seq>, QueueOpError> {
        let launched = self.in_flight.back().is_some_and(|e| e.seq >= seq);
        if seq < self.completed || !launched || self.hw_stopped.is_some() {
            return Ok(None);
        }
        if let Some(&b) = self.sync_points.iter().find(|&&b| b > seq) {
            return Ok(Some(b));
        }
        self.record_sync(hal)?;
        Ok(self.sync_points.back().copied())
    }

    /// Makes the completion of everything in flight observable.
    pub fn record_sync<H: HwQueue<Payload = P>>(&mut self, hal: &H) -> Result<(), QueueOpError> {
        let Some(last) = self.in_flight.back() else {
            return Ok(());
        };
        let tail = last.seq + 1;
        if self.sync_points.back() != Some(&tail) {
            hal.record_sync()
                .map_err(|source| self.op_error("record_sync", source))?;
            self.sync_points.push_back(tail);
            self.since_sync = 0;
        }
        Ok(())
    }

    fn window_open(&self) -> bool {
        !self.suspended && self.has_room(self.in_flight.len())
    }

    /// Whether one more command fits beside `in_flight` ones: at most `threshold` commands and,
    /// with a GPU-time window, while those in flight take at most that much measured GPU time
    /// (what is in flight stays within the window plus one command).
    fn has_room(&self, in_flight: usize) -> bool {
        if in_flight >= self.config.threshold() as usize {
            return false;
        }
        match self.config.gpu_window_ns() {
            // Until a command was measured, one at a time: the first might be long.
            Some(window) if in_flight > 0 => self
                .stats
                .gpu
                .per_command_ns()
                .is_some_and(|ns| (in_flight as u64).saturating_mul(ns) <= window),
            _ => true,
        }
    }

    fn launch<H: HwQueue<Payload = P>>(
        &mut self,
        hal: &H,
        mut entry: Launched<P>,
        now: Nanos,
    ) -> Result<(), (HalError, Launched<P>)> {
        // The launch that fills the window carries a sync point: the watcher must see it
        // complete to open the window again.
        let sync_point =
            self.since_sync + 1 >= self.config.batch() || !self.has_room(self.in_flight.len() + 1);
        if let Err(e) = hal.launch(entry.seq, &mut entry.command, sync_point) {
            return Err((e, entry));
        }
        self.stats.gpu.launched(now, self.in_flight.len());
        if sync_point {
            self.since_sync = 0;
            self.sync_points.push_back(entry.seq + 1);
        } else {
            self.since_sync += 1;
        }
        self.stats.launched += 1;
        self.in_flight.push_back(entry);
        Ok(())
    }

    fn reap<H: HwQueue<Payload = P>>(&mut self, hal: &H, now: Nanos) {
        let watermark = hal.completed();
        debug_assert!(
            watermark >= self.completed,
            "completion watermark went back"
        );
        let had_work = !self.in_flight.is_empty();
        let mut reaped = 0;
        while self.in_flight.front().is_some_and(|e| e.seq < watermark) {
            self.in_flight.pop_front();
            reaped += 1;
        }
        self.stats.completed += reaped;
        if self.hw_stopped.is_none() {
            self.stats.gpu.completed(now, reaped, self.in_flight.len());
        }
        if had_work && self.is_idle() {
            self.stats.gpu.went_idle(now);
        }
        if had_work && self.in_flight.is_empty() && !self.pending.is_empty() && !self.suspended {
            self.stats.ran_dry += 1;
        }
        while self.sync_points.front().is_some_and(|&s| s <= watermark) {
            self.sync_points.pop_front();
        }
        self.completed = self.completed.max(watermark);
    }

    /// A suspension's stop latency, by the mechanism that made the stop.
    fn record_stop(&mut self, ns: Nanos) {
        if self.hw_stopped.is_none() && self.level > Level::Lv1 {
            self.stats.drain_latency.record(ns);
        } else {
            self.stats.suspend_latency.record(ns);
        }
    }

    fn note_settled<H: HwQueue<Payload = P>>(&mut self, hal: &H, now: Nanos) {
        if let Some(since) = self.stopping_since {
            let stopped = match self.hw_stopped {
                None => self.in_flight.is_empty(),
                Some(_) => hal.settled(),
            };
            if stopped {
                self.record_stop(now.saturating_sub(since));
                self.stopping_since = None;
            }
        }
        if let Some(since) = self.resuming_since
            && hal.settled()
        {
            self.stats.resume_latency.record(now.saturating_sub(since));
            self.resuming_since = None;
        }
    }

    fn op_error(&self, op: &'static str, source: HalError) -> QueueOpError {
        QueueOpError {
            queue: self.id,
            op,
            source,
        }
    }
}

#[cfg(test)]
mod stop_ahead_tests;
#[cfg(test)]
mod tests;
