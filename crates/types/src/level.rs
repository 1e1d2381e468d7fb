//! Preemption levels: how far down a queue can be stopped.

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

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("unknown preemption level `{0}` (expected lv1, lv2 or lv3)")]
pub struct ParseLevelError(pub String);

impl FromStr for Level {
    type Err = ParseLevelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "1" | "lv1" => Ok(Level::Lv1),
            "2" | "lv2" => Ok(Level::Lv2),
            "3" | "lv3" => Ok(Level::Lv3),
            other => Err(ParseLevelError(other.to_string())),
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
        assert!(
            "lv4"
                .parse::<Level>()
                .unwrap_err()
                .to_string()
                .contains("lv4")
        );
        assert!(Level::Lv1 < Level::Lv2 && Level::Lv2 < Level::Lv3);
        assert_eq!(Level::Lv2.to_string(), "lv2");
    }
}
