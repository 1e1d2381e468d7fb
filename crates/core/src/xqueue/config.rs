//! Per-queue settings of progressive launching and the preemption level.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_types::{Level, Nanos};

pub const DEFAULT_THRESHOLD: u32 = 16;
pub const DEFAULT_BATCH: u32 = 8;
/// See [`QueueConfig::with_idle_poll`].
pub const DEFAULT_IDLE_POLL_NS: Nanos = 50_000_000;

fn default_idle_poll() -> Nanos {
    DEFAULT_IDLE_POLL_NS
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueConfig {
    threshold: u32,
    batch: u32,
    level: Level,
    /// How long a threaded queue's watcher keeps looking for work after the queue went idle
    /// (see [`Self::with_idle_poll`]).
    #[serde(default = "default_idle_poll")]
    idle_poll_ns: Nanos,
    /// See [`Self::with_gpu_window`].
    #[serde(default)]
    gpu_window_ns: Option<Nanos>,
    /// See [`Self::with_ready_when_waited`].
    #[serde(default)]
    ready_when_waited: bool,
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
            idle_poll_ns: DEFAULT_IDLE_POLL_NS,
            gpu_window_ns: None,
            ready_when_waited: false,
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
            idle_poll_ns: DEFAULT_IDLE_POLL_NS,
            gpu_window_ns: None,
            ready_when_waited: false,
        })
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

    /// Bounds the queue's launched-but-unfinished work by GPU time as well as by count: one
    /// more command is launched only while the commands in flight, at the queue's measured GPU
    /// time per command, take at most `ns` (one command always may run; at most `ns` and one
    /// command are in flight). A suspension that cannot stop
    /// the hardware (Lv1, kernels without the guard) waits for what is in flight, so this
    /// bounds that wait whatever the kernels' length; the count alone let 16 long kernels
    /// through.
    pub fn with_gpu_window(mut self, ns: Nanos) -> Self {
        self.gpu_window_ns = Some(ns);
        self
    }

    /// The queue reports Ready once its work is waited for ([`XQueue::waited`]: the application
    /// blocks on it, polls it or asks to be called back) or held back (buffered while the queue
    /// is suspended), not at the submission that starts a burst. A queue's Ready is what stops
    /// the queues below it, so work nobody waits on runs beside them: a launch-bound
    /// application that rarely waits (eager decoding, whose GPU keeps up with its launches) no
    /// longer holds a GPU-bound lower queue back for as long as it launches, only while it
    /// waits. For front ends that see the application's waits; the others report Ready at
    /// submission.
    ///
    /// [`XQueue::waited`]: crate::XQueue::waited
    pub fn with_ready_when_waited(mut self) -> Self {
        self.ready_when_waited = true;
        self
    }

    pub fn ready_when_waited(&self) -> bool {
        self.ready_when_waited
    }

    pub fn gpu_window_ns(&self) -> Option<Nanos> {
        self.gpu_window_ns
    }

    pub fn idle_poll_ns(&self) -> Nanos {
        self.idle_poll_ns
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
