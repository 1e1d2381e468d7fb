//! What taking a queue off the hardware leaves behind, as the device keeps it: the mode of a
//! `destroy_mqd`, what the queue becomes once its HQD is free, the unmap in progress, and the
//! ring position `checkpoint_mqd` remembers. `cwsr.rs` carries these out; the device, the
//! scheduler firmware and the KFD calls only hold and pass them.

use serde::{Deserialize, Serialize};
use xpreempt_types::Nanos;

/// How `destroy_mqd` takes a queue's waves off the compute units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DestroyMode {
    WavefrontSave,
    Drain,
    Reset,
}

/// What the queue becomes once its HQD is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    /// An explicit preemption: stays off until resumed.
    Preempted,
    /// An oversubscription rotation: waits in line for the next free HQD.
    Waiting,
    /// A runlist executed again (a queue's CU mask changed): waits in line as a rotation does.
    Remapped,
}

impl After {
    /// Whether the queue waits for an HQD once off, rather than staying off until resumed.
    pub fn waits(self) -> bool {
        matches!(self, After::Waiting | After::Remapped)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Unmap {
    pub mode: DestroyMode,
    pub after: After,
    pub since: Nanos,
    /// Wave slots that stay busy until the save or kill finishes, per CU.
    pub hold: Vec<(u32, u32)>,
}

/// What `checkpoint_mqd` keeps: the MQD's view of the ring, to check on restore that nothing
/// moved it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub read_id: u64,
    pub write_id: u64,
}
