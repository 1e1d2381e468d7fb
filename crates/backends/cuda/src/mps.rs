//! Which sharing mode this process is in: an MPS client shares one hardware context with other
//! processes (stream priorities reach across them), an ordinary context is time-sliced.

use crate::driver::Device;

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
