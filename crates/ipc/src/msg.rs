//! The messages of the socket. `Hello` is variant 0 with the protocol version as its first
//! field in every version, so a daemon can read a client's version before it knows its dialect.

use serde::{Deserialize, Serialize};
use xpreempt_core::sched::Work;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::stats::SchedulerStats;
use xpreempt_types::{Hints, Level, Nanos, Priority, ProcessId, QueueId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A process whose queues the daemon schedules; gets a shared segment.
    Agent,
    /// The operator's CLI: lists, statistics, priority changes.
    Operator,
}

/// What a queue declares when it registers; the daemon adds its id and the process (from the
/// socket's peer credentials, so a client cannot claim another's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueDecl {
    pub device: u32,
    pub priority: Priority,
    pub hints: Hints,
    pub interleave: Option<u32>,
    pub level: Level,
}

/// Whose queues a priority change is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    Process(ProcessId),
    Queue(QueueId),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClientMsg {
    Hello {
        version: u32,
        role: Role,
        /// The process's name, for `xpreempt list`.
        name: String,
    },
    /// Registers a queue in shared-memory slot `slot` of the client's segment.
    Register {
        slot: u32,
        decl: QueueDecl,
    },
    Unregister {
        queue: QueueId,
    },
    /// A refused submitter asks for admission again.
    Retry {
        queue: QueueId,
    },
    /// Work for the `work_submit` hook (sent only while the daemon asks for it).
    Work {
        queue: QueueId,
        work: Work,
    },
    SetPriority {
        target: Target,
        priority: Priority,
    },
    SetHints {
        target: Target,
        hints: Hints,
    },
    List,
    Stats,
    /// The maps of the eBPF program each device runs.
    PolicyMaps,
    /// Stores `value` under `key` in `map` on every device (`None` deletes the key).
    PolicyMapUpdate {
        map: String,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DaemonMsg {
    /// The answer to an agent's `Hello`; the segment's fd follows on the socket (`SCM_RIGHTS`).
    Welcome {
        slots: u32,
    },
    /// The answer to an operator's `Hello`.
    Ready,
    Registered {
        queue: QueueId,
    },
    /// A request succeeded; `changed` queues were affected.
    Done {
        changed: u32,
    },
    /// A request was refused; the reason is for the user.
    Refused {
        reason: String,
    },
    List(Vec<QueueRow>),
    Stats(DaemonStats),
    PolicyMaps(Vec<PolicyMap>),
}

/// One map of the eBPF program a device runs, with its entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyMap {
    pub device: u32,
    pub map: String,
    pub key_size: u32,
    pub value_size: u32,
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One queue as the operator sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueRow {
    pub queue: QueueId,
    pub process: ProcessId,
    pub process_name: String,
    pub device: u32,
    pub level: Level,
    pub logical_priority: Priority,
    pub effective_priority: Priority,
    pub state: QueueState,
    pub in_flight: u32,
    pub pending: u32,
    pub preemptions: u64,
    pub resumes: u64,
    pub suspend_p99_ns: Nanos,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: u32,
    pub policy: String,
    pub queues: u32,
    pub scheduler: SchedulerStats,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonStats {
    pub protocol: u32,
    pub clients: u32,
    pub devices: Vec<DeviceStats>,
    /// Frames refused as malformed, truncated, oversized or of another version.
    pub bad_frames: u64,
    /// Times the watchdog took a silent client's queues out of contention.
    pub watchdog_fires: u64,
    /// Times the decision loop ran (reports taken from shared memory).
    pub fast_path_wakeups: u64,
    /// The pipe directory of the MPS control daemon this daemon owns (`--mps`), for clients'
    /// `CUDA_MPS_PIPE_DIRECTORY`; `None` when the GPU is time-sliced.
    pub mps_pipe: Option<String>,
}

/// The protocol version a `Hello` frame carries, whatever the sender's other messages look like.
pub fn hello_version(body: &[u8]) -> Option<u32> {
    let (variant, rest): (u32, _) = postcard::take_from_bytes(body).ok()?;
    if variant != 0 {
        return None;
    }
    postcard::take_from_bytes::<u32>(rest).ok().map(|(v, _)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_readable_from_any_hello() {
        let hello = ClientMsg::Hello {
            version: 77,
            role: Role::Agent,
            name: "x".into(),
        };
        let body = postcard::to_stdvec(&hello).unwrap();
        assert_eq!(hello_version(&body), Some(77));
        let other = postcard::to_stdvec(&ClientMsg::List).unwrap();
        assert_eq!(hello_version(&other), None);
    }
}
