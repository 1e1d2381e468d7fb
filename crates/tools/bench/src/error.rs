//! Errors of the benchmark workloads.

use crate::timeslice::Lv3Unavailable;
use std::path::PathBuf;
use thiserror::Error;
use xpreempt_agent::AgentError;
use xpreempt_core::policy::UnknownPolicy;
use xpreempt_core::sched::SchedError;
use xpreempt_core::xqueue::threaded::TrySubmitError;
use xpreempt_core::xqueue::{ConfigError, QueueOpError};
use xpreempt_core::{HalError, QueueId};
use xpreempt_cuda::error::CudaError;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error("invalid queue configuration")]
    QueueConfig(#[from] ConfigError),
    /// The queue refused the command (it was dropped: a benchmark does not resubmit).
    #[error("submitting to the XQueue failed: queue {0}: admission refused")]
    SubmitBusy(QueueId),
    #[error("submitting to the XQueue failed: queue {queue}, command {seq}")]
    Submit {
        queue: QueueId,
        seq: u64,
        #[source]
        source: HalError,
    },
    #[error("waiting for the XQueue failed")]
    Wait(#[source] HalError),
    #[error("suspending or resuming the XQueue failed")]
    Preempt(#[from] QueueOpError),
    #[error(transparent)]
    Policy(#[from] UnknownPolicy),
    #[error("the local scheduler's thread did not start")]
    SchedulerStart(#[source] std::io::Error),
    #[error("registering with the local scheduler failed")]
    Register(#[from] SchedError),
    #[error("Lv3 (channel-group timeslice) is unavailable")]
    Lv3(#[from] Lv3Unavailable),
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    #[error("{what} within {secs} s")]
    TimedOut { what: &'static str, secs: u64 },
    #[error("the global-mode agent")]
    Agent(#[from] AgentError),
    #[error(
        "no xpreempt daemon answered at {socket}: the agent fell back to local scheduling, so this \
         run would not measure the daemon"
    )]
    NoDaemon { socket: PathBuf },
    #[error("the agent lost the daemon during the run: part of it was scheduled locally")]
    LostDaemon,
    #[error("the BE side failed before it started (see its error)")]
    BeGaveUp,
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid benchmark spec: {0}")]
    Spec(String),
}

/// The command that comes back with the error is a deferred driver call, not shared between
/// threads, so the error keeps what the queue said and lets the command go.
impl From<TrySubmitError<xpreempt_cuda::Deferred>> for BenchError {
    fn from(e: TrySubmitError<xpreempt_cuda::Deferred>) -> Self {
        match e {
            TrySubmitError::Busy(queue, _) => BenchError::SubmitBusy(queue),
            TrySubmitError::Launch(e) => BenchError::Submit {
                queue: e.queue,
                seq: e.seq,
                source: e.source,
            },
        }
    }
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;
