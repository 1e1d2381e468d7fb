//! Errors of the model and of its KFD-style API.

use crate::aql::AqlError;
use crate::cpsch::CpschError;
use crate::ring::RingError;
use thiserror::Error;
use xpreempt_types::{QueueId, Seq};

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    #[error("queue {0} does not exist")]
    NoQueue(QueueId),
    #[error("queue {0}: {1}")]
    Ring(QueueId, #[source] RingError),
    #[error(transparent)]
    Cpsch(#[from] CpschError),
    #[error("queue {queue}: malformed AQL packet at dispatch id {dispatch}: {source}")]
    Aql {
        queue: QueueId,
        dispatch: u64,
        #[source]
        source: AqlError,
    },
    #[error(
        "queue {queue}: RESET refused: kernel `{kernel}` has waves running and is not idempotent"
    )]
    NonIdempotent { queue: QueueId, kernel: String },
    #[error("queue {queue} is {state}; {op} is not possible now")]
    State {
        queue: QueueId,
        state: &'static str,
        op: &'static str,
    },
    #[error("queue {queue}: resume needs a checkpointed MQD (checkpoint_mqd before destroy_mqd)")]
    NoSnapshot { queue: QueueId },
    #[error(
        "the hardware scheduler is hung: an unmap missed its {timeout_us} µs fence (kfd_hws_hang); no queue operation is possible until reset"
    )]
    HwsHung { timeout_us: u64 },
    #[error(
        "process {caller} may not {op} queue {queue}: it belongs to process {owner} and the caller is not privileged"
    )]
    PermissionDenied {
        caller: u32,
        owner: u32,
        queue: QueueId,
        op: &'static str,
    },
    #[error("queue {queue}: workgroup of {waves} waves cannot fit a CU of {slots} wave slots")]
    WorkgroupTooLarge {
        queue: QueueId,
        waves: u32,
        slots: u32,
    },
    #[error("queue {queue}: command {seq} would land at dispatch id {dispatch}")]
    OutOfOrder {
        queue: QueueId,
        seq: Seq,
        dispatch: u64,
    },
    #[error("invalid configuration")]
    Config(#[from] crate::config::ConfigError),
    #[error("queue {name}: the CU mask selects no CU")]
    EmptyCuMask { name: String },
}
