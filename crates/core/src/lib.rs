//! xpreempt's core: the preemptible XQueue in front of a hardware queue, the scheduler with its
//! protocol and driver loop, the policies, and statistics.
//!
//! Data flows one way: front end → [`xqueue`] → [`sched`] / [`policy`] → HAL
//! ([`xpreempt_hal`]) → backend. Nothing here does I/O or uses `unsafe`; backends live in their
//! own crates and never see this one.

#![forbid(unsafe_code)]

pub mod policy;
pub mod sched;
pub mod stats;
pub mod xqueue;

pub use xpreempt_hal::{HalError, HwQueue};
pub use xpreempt_types::{
    Command, CommandProps, Hints, Level, Nanos, Op, OpKind, Priority, ProcessId, QueueId, Seq,
};
pub use xqueue::{QueueConfig, XQueue};
