//! Scheduling: the protocol queues and the scheduler speak ([`protocol`]), the scheduler's state
//! machine ([`Scheduler`]), the one loop that applies its answers to queues ([`driver`]), aging,
//! the hook points of programmable policies, and local (in-process) mode.

mod aging;
mod announcements;
pub mod driver;
pub mod hooks;
pub mod local;
mod preempter;
pub mod protocol;
mod scheduler;
mod stop_plan;

pub use aging::{Aging, AgingError};
pub use driver::{Driver, QueueControl};
pub use hooks::Hooks;
pub use preempter::DEFAULT_HOT;
pub use protocol::{Action, QueueInfo, QueueReport, RESUME_RETRY_NS, SchedEvent, Work};
pub use scheduler::{RankedQueue, SchedError, Scheduler};

#[cfg(test)]
mod tests;
