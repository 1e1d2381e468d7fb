//! The vocabulary every layer of xpreempt shares: queue and process ids, time, logical
//! priority, preemption levels, the commands a front end submits, and scheduling hints.
//!
//! Nothing here knows about scheduling or hardware; it sits below both, so a backend and a
//! policy can agree on words without depending on each other.

#![forbid(unsafe_code)]

pub mod command;
mod compute_units;
pub mod hints;
pub mod histogram;
mod level;

pub use command::{Command, CommandProps, HostFn, Launched, Op, OpKind, Seq};
pub use compute_units::{ComputeUnits, may_share};
pub use hints::{HintError, Hints};
pub use level::{Level, ParseLevelError};

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
