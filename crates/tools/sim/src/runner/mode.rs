//! The paths a run can take through the model.

use std::fmt;
use thiserror::Error;
use xpreempt_core::Level;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    None,
    Lv1,
    SchemeA,
    Lv2,
    Lv3,
}

impl Mode {
    pub const ALL: [Mode; 5] = [Mode::None, Mode::Lv1, Mode::SchemeA, Mode::Lv2, Mode::Lv3];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Lv1 => "lv1",
            Mode::SchemeA => "scheme-a",
            Mode::Lv2 => "lv2",
            Mode::Lv3 => "lv3",
        }
    }

    pub(super) fn level(self) -> Option<Level> {
        match self {
            Mode::Lv1 => Some(Level::Lv1),
            Mode::Lv2 => Some(Level::Lv2),
            Mode::Lv3 => Some(Level::Lv3),
            Mode::None | Mode::SchemeA => None,
        }
    }
}

/// A mode name that is none of [`Mode::ALL`].
#[derive(Debug, Error)]
#[error("unknown mode `{0}`; known modes: none, lv1, scheme-a, lv2, lv3")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownMode(s.to_string()))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
