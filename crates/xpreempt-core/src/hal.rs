//! The hardware abstraction: one trait per hardware queue, with three preemption levels.
//!
//! A backend implements [`HwQueue`] for each hardware queue it exposes and says in
//! [`HwQueue::max_level`] how far up it goes. The XQueue uses the highest level both it and the
//! backend allow; it never calls an operation above that level.
//!
//! Methods take `&self`: the launch path and the completion watcher of one queue run on different
//! threads, so a backend keeps its own interior locking (or none, where its driver is
//! thread-safe).

use crate::command::{Command, Launched, Seq};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Preemption level, ordered: a higher level can do everything a lower one can.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Level {
    /// Progressive launching: bound what is in flight; suspension waits for it to drain.
    Lv1 = 1,
    /// Deactivate/reactivate: in-flight work stops at a block or workgroup boundary.
    Lv2 = 2,
    /// Interrupt/restore: in-flight work stops at an instruction boundary, state saved.
    Lv3 = 3,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lv{}", *self as u8)
    }
}

impl FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "lv1" => Ok(Level::Lv1),
            "2" | "lv2" => Ok(Level::Lv2),
            "3" | "lv3" => Ok(Level::Lv3),
            other => Err(format!(
                "unknown preemption level `{other}` (expected lv1, lv2 or lv3)"
            )),
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HalError {
    #[error("{op} needs preemption level {needed}, this hardware queue supports up to {supported}")]
    Unsupported {
        op: &'static str,
        needed: Level,
        supported: Level,
    },
    /// The backend runs on a virtual clock and cannot block; drive it with events instead.
    #[error("{0} would block on a backend with a virtual clock")]
    WouldBlock(&'static str),
    /// The backend refused the command as given (malformed, not allowed at this level).
    #[error("command refused: {0}")]
    Refused(String),
    #[error("backend error: {0}")]
    Backend(String),
}

/// One hardware queue (a CUDA stream, an AQL ring, a simulated queue).
pub trait HwQueue {
    /// What a kernel launch carries on this backend.
    type Payload;

    /// The highest level this queue supports.
    fn max_level(&self) -> Level;

    // ---- Lv1 ----

    /// Hands one command to the hardware. `seq` numbers commands of this queue in order. With
    /// `sync_point` set the backend makes this command's completion observable (a CUDA event, a
    /// completion signal); between sync points it may report completion late. The backend may take
    /// data out of the command (a host callback) but must leave the kernel payload in place, since
    /// Lv2/Lv3 may hand the command back for relaunch.
    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Self::Payload>,
        sync_point: bool,
    ) -> Result<(), HalError>;

    /// Makes completion of everything launched so far observable, as if the last launch had been
    /// a sync point.
    fn record_sync(&self) -> Result<(), HalError>;

    /// Completion watermark: every command with a smaller `seq` has completed. Never decreases.
    /// A command that was stopped by `deactivate` or `interrupt` is not complete.
    fn completed(&self) -> Seq;

    /// Blocks until `completed() >= upto`. Returns at once if it already is.
    fn synchronize(&self, upto: Seq) -> Result<(), HalError>;

    /// Whether the last deactivate/interrupt/reactivate/restore has fully taken effect (the
    /// hardware is free of this queue's running work, or running it again). Backends whose
    /// operations are synchronous keep the default.
    fn settled(&self) -> bool {
        true
    }

    // ---- Lv2 ----

    /// Stops in-flight deactivatable work at the next block/workgroup boundary; finished blocks
    /// stay finished. Non-deactivatable work already launched runs to completion.
    fn deactivate(&self) -> Result<(), HalError> {
        Err(self.unsupported("deactivate", Level::Lv2))
    }

    /// Resumes what `deactivate` stopped. `log` holds every launched, not yet completed command
    /// in submission order; a backend relaunches the unfinished part of those it stopped.
    fn reactivate(&self, log: &mut [Launched<Self::Payload>]) -> Result<(), HalError> {
        let _ = log;
        Err(self.unsupported("reactivate", Level::Lv2))
    }

    // ---- Lv3 ----

    /// Stops all in-flight work of the queue at once, saving its state.
    fn interrupt(&self) -> Result<(), HalError> {
        Err(self.unsupported("interrupt", Level::Lv3))
    }

    /// Restores what `interrupt` saved and lets the queue run on from where it stopped.
    fn restore(&self, log: &mut [Launched<Self::Payload>]) -> Result<(), HalError> {
        let _ = log;
        Err(self.unsupported("restore", Level::Lv3))
    }

    #[doc(hidden)]
    fn unsupported(&self, op: &'static str, needed: Level) -> HalError {
        HalError::Unsupported {
            op,
            needed,
            supported: self.max_level(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!("LV3".parse::<Level>().unwrap(), Level::Lv3);
        assert_eq!("2".parse::<Level>().unwrap(), Level::Lv2);
        assert!("lv4".parse::<Level>().unwrap_err().contains("lv4"));
        assert!(Level::Lv1 < Level::Lv2 && Level::Lv2 < Level::Lv3);
        assert_eq!(Level::Lv2.to_string(), "lv2");
    }
}
