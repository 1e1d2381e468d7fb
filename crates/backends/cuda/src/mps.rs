//! Which sharing mode this process is in, and the level that follows from it.

use crate::driver::Device;
use xpreempt_types::Level;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Sharing {
    /// This context is an MPS client: other processes run in the same hardware context.
    MpsClient,
    /// Ordinary context: other processes are time-sliced against it.
    TimeSliced,
}

pub fn detect(device: &Device) -> Sharing {
    if device.mps_enabled {
        Sharing::MpsClient
    } else {
        Sharing::TimeSliced
    }
}

/// Same context or MPS → stream priorities + Lv2 guard; time-sliced across processes → Lv3.
pub fn choose_level(sharing: Sharing, cross_process: bool) -> Level {
    match (sharing, cross_process) {
        (Sharing::MpsClient, _) | (_, false) => Level::Lv2,
        (Sharing::TimeSliced, true) => Level::Lv3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_follows_sharing() {
        assert_eq!(choose_level(Sharing::MpsClient, true), Level::Lv2);
        assert_eq!(choose_level(Sharing::TimeSliced, false), Level::Lv2);
        assert_eq!(choose_level(Sharing::TimeSliced, true), Level::Lv3);
    }
}
