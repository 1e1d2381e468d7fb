//! Per-queue settings of progressive launching and the preemption level.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_types::{Level, Nanos};

pub const DEFAULT_THRESHOLD: u32 = 16;
pub const DEFAULT_BATCH: u32 = 8;
/// See [`QueueConfig::with_idle_poll`].
pub const DEFAULT_IDLE_POLL_NS: Nanos = 50_000_000;
/// See [`QueueConfig::with_burst_gap`].
pub const DEFAULT_BURST_GAP_NS: Nanos = 0;

fn default_idle_poll() -> Nanos {
    DEFAULT_IDLE_POLL_NS
}

fn default_burst_gap() -> Nanos {
    DEFAULT_BURST_GAP_NS
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    threshold: u32,
    batch: u32,
    level: Level,
    /// How long a queue that ran dry still counts as having work (see [`Self::with_idle_linger`]).
    #[serde(default)]
    idle_linger_ns: Nanos,
    /// How long a threaded queue's watcher keeps looking for work after the queue went idle
    /// (see [`Self::with_idle_poll`]).
    #[serde(default = "default_idle_poll")]
    idle_poll_ns: Nanos,
    /// How long after a submission returned a threaded queue that drained still counts as having
    /// work (see [`Self::with_burst_gap`]).
    #[serde(default = "default_burst_gap")]
    burst_gap_ns: Nanos,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    #[error("threshold must be at least 1 (it is the most commands in flight), got 0")]
    ZeroThreshold,
    #[error("batch must be at least 1 (a sync point every `batch` commands), got 0")]
    ZeroBatch,
    #[error(
        "batch {batch} is larger than threshold {threshold}: the window would fill before its first sync point"
    )]
    BatchAboveThreshold { batch: u32, threshold: u32 },
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            threshold: DEFAULT_THRESHOLD,
            batch: DEFAULT_BATCH,
            level: Level::Lv3,
            idle_linger_ns: 0,
            idle_poll_ns: DEFAULT_IDLE_POLL_NS,
            burst_gap_ns: DEFAULT_BURST_GAP_NS,
        }
    }
}

impl QueueConfig {
    /// `level` is the highest level the queue may use; it is capped at what the hardware has.
    pub fn new(threshold: u32, batch: u32, level: Level) -> Result<Self, ConfigError> {
        if threshold == 0 {
            return Err(ConfigError::ZeroThreshold);
        }
        if batch == 0 {
            return Err(ConfigError::ZeroBatch);
        }
        if batch > threshold {
            return Err(ConfigError::BatchAboveThreshold { batch, threshold });
        }
        Ok(Self {
            threshold,
            batch,
            level,
            idle_linger_ns: 0,
            idle_poll_ns: DEFAULT_IDLE_POLL_NS,
            burst_gap_ns: DEFAULT_BURST_GAP_NS,
        })
    }

    /// A queue whose work all completed reports Idle only after `ns` more without a new
    /// submission. A program that launches in bursts with short gaps on the CPU between them
    /// (eager PyTorch) would otherwise go idle and busy again at every gap, and each time the
    /// queues below it would be resumed and stopped again. Zero (the default): Idle at once.
    /// The Idle is owed from [`XQueue::idle_due`](super::XQueue::idle_due) on; whoever drives
    /// the queue must poll it then (the threaded queue's watcher does).
    pub fn with_idle_linger(mut self, ns: Nanos) -> Self {
        self.idle_linger_ns = ns;
        self
    }

    pub fn idle_linger_ns(&self) -> Nanos {
        self.idle_linger_ns
    }

    /// For `ns` after a threaded queue went idle, its completion watcher looks for new work by
    /// itself every millisecond instead of sleeping until woken, so the submission that makes
    /// the queue busy again does not wake it: that wake-up (a system call) would come between
    /// the application's first two launches. The queue's first wait, or a submission that has
    /// to wait for room, still wakes it at once; otherwise it finds the work within the tick.
    /// Zero: the submission always wakes it. Costs one wake-up per millisecond per queue while
    /// the queue is idle but was busy within `ns`.
    pub fn with_idle_poll(mut self, ns: Nanos) -> Self {
        self.idle_poll_ns = ns;
        self
    }

    pub fn idle_poll_ns(&self) -> Nanos {
        self.idle_poll_ns
    }

    /// A threaded queue that drains while the application is in a call on it (a submission, a
    /// wait), or within `ns` after its last submission returned, reports Idle only once the
    /// calls have returned and `ns` have passed since that submission. An application spends a
    /// few µs on the CPU between two launches of one burst (the launch call, the queue's Ready,
    /// its own work): a first kernel that completes in that time would otherwise make the queue
    /// idle and busy again inside the burst, and the queues below it would be resumed and
    /// stopped again. A waiter that saw the last completion returns before the queues below are
    /// resumed, rather than contending with their driver calls on its way out. Unlike
    /// [`Self::with_idle_linger`], it costs nothing when the queue drains later than `ns` after
    /// its last submission and no call is under way. Zero (the default): off. Measured on an
    /// H100 host at 20 µs: it removed the restarts
    /// of the best-effort queue inside two-kernel requests in one process (from 1–7 % of
    /// requests to at most 0.1 %), but did not lower the request's p99, and the best-effort
    /// queue kept about 0.5 % less throughput. Again under MPS, in two runs on one host: the
    /// pooled p99 gap to the bench-only controller was lower with it in one run and higher in
    /// the other. It also holds back the Idle that a waiter would report
    /// ([`crate::xqueue::threaded::ReportSink::idle_from_waiter`]).
    pub fn with_burst_gap(mut self, ns: Nanos) -> Self {
        self.burst_gap_ns = ns;
        self
    }

    pub fn burst_gap_ns(&self) -> Nanos {
        self.burst_gap_ns
    }

    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    pub fn batch(&self) -> u32 {
        self.batch
    }

    pub fn level(&self) -> Level {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_windows_are_refused() {
        assert_eq!(
            QueueConfig::new(0, 1, Level::Lv1),
            Err(ConfigError::ZeroThreshold)
        );
        assert_eq!(
            QueueConfig::new(4, 0, Level::Lv1),
            Err(ConfigError::ZeroBatch)
        );
        let err = QueueConfig::new(4, 8, Level::Lv1).unwrap_err();
        assert!(
            err.to_string()
                .contains("batch 8 is larger than threshold 4")
        );
        let ok = QueueConfig::new(16, 8, Level::Lv2).unwrap();
        assert_eq!(
            (ok.threshold(), ok.batch(), ok.level()),
            (16, 8, Level::Lv2)
        );
        assert_eq!(
            QueueConfig::default(),
            QueueConfig::new(16, 8, Level::Lv3).unwrap()
        );
    }
}
