//! xpreempt's core: the commands a front end submits, the preemptible XQueue that holds them, the
//! hardware abstraction (HAL) the queue drives, the scheduler and its policies, and statistics.
//!
//! Data flows one way: front end → [`xqueue`] → [`scheduler`] / [`policy`] → [`hal`] → backend.
//! Nothing here does I/O or uses `unsafe`; backends live in their own crates. The
//! [`reference`] backend runs on a virtual clock so that everything above the HAL can be tested
//! without a GPU.

#![forbid(unsafe_code)]

pub mod command;
pub mod hal;
pub mod hints;
pub mod histogram;
pub mod policy;
pub mod reference;
pub mod scheduler;
pub mod stats;
pub mod xqueue;

pub use command::{Command, CommandProps, Op, OpKind, Seq};
pub use hal::{HalError, HwQueue, Level};
pub use hints::{HintError, Hints};
pub use xqueue::{QueueConfig, XQueue};

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies an XQueue within one scheduler (one device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QueueId(pub u32);

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

/// The operating-system process a queue belongs to.
pub type ProcessId = u32;

/// Logical priority: larger runs first. Any `i32` is valid; the hardware never sees it.
pub type Priority = i32;

/// Nanoseconds on the scheduler's clock (wall or virtual).
pub type Nanos = u64;
