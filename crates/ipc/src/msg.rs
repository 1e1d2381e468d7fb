//! The messages of the socket. `Hello` is variant 0 with the protocol version as its first
//! field in every version, so a daemon can read a client's version before it knows its dialect.

use serde::{Deserialize, Serialize};
use xpreempt_core::sched::Work;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::stats::GpuTimeSummary;
use xpreempt_core::stats::SchedulerStats;
use xpreempt_types::{Hints, Level, Nanos, Priority, ProcessId, QueueId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// A process whose queues the daemon schedules; gets a shared segment.
    Agent,
    /// The operator's CLI: lists, statistics, priority changes.
    Operator,
    /// The shim's RM hooks: the channel-group events of one process (its own process id comes
    /// from the socket's peer credentials).
    Rm,
}

/// A compute channel group the shim saw libcuda create (`RmTaskInit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmGroupDecl {
    /// The RM device instance the group was created under.
    pub device: u32,
    /// The hardware TSG id (or the shim's stand-in when the driver would not say).
    pub tsg: u32,
    /// The timeslice the driver reported for the new group (µs, 0 if unknown).
    pub default_timeslice_us: u64,
    /// The process's declared priority.
    pub default_priority: Priority,
    /// The LC/BE class the process declared (the eBPF header's `XP_CLASS_*`).
    pub hint_class: u32,
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
    /// Work of `priority` waits on the queue's buffered commands (`None`: no longer); see
    /// `QueueReport::Inherit`. The daemon caps it at the client's own highest priority.
    Inherit {
        queue: QueueId,
        priority: Option<Priority>,
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
    /// RM hooks: a compute channel group was created; answered with `RmDecision`.
    RmTaskInit {
        group: RmGroupDecl,
    },
    /// RM hooks: a group asks to be enabled (libcuda's GPFIFO_SCHEDULE); answered with
    /// `RmAdmission`.
    RmSchedule {
        device: u32,
        tsg: u32,
        channels: u32,
    },
    /// RM hooks: the group was enabled (no answer).
    RmEnabled {
        device: u32,
        tsg: u32,
    },
    /// RM hooks: work of a group (the eBPF header's `XP_WORK_*` event and `XP_OP_*` kind; no
    /// answer).
    RmWork {
        device: u32,
        tsg: u32,
        event: u32,
        kind: u32,
        token: u64,
    },
    /// RM hooks: the group was freed (no answer).
    RmTaskDestroy {
        device: u32,
        tsg: u32,
    },
    /// What each mechanism measured to cost on each device (`xpreempt list`, `top`).
    Costs,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DaemonMsg {
    /// The answer to an agent's `Hello`; the segment's fd follows on the socket (`SCM_RIGHTS`),
    /// then, with a `bell`, the fd of the user's board ([`crate::board`]): the agent waits on
    /// that bell instead of the segment's `to_agent`.
    Welcome {
        slots: u32,
        bell: Option<u32>,
    },
    /// The answer to an operator's `Hello`.
    Ready,
    Registered {
        queue: QueueId,
        /// The queue's bit on the board, which its agent sets while the queue has work.
        bit: Option<u32>,
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
    /// What `task_init` decided for a channel group, in the driver's units.
    RmDecision(RmDecisionMsg),
    /// Whether a channel group may be enabled now.
    RmAdmission {
        allow: bool,
        /// Whether a program decided (else the driver's default: admitted).
        ran: bool,
        /// Why the driver's defaults apply (no program, or it failed).
        note: Option<String>,
    },
    /// The answer to `Costs`: one entry per device the daemon schedules.
    Costs(Vec<crate::costs::DeviceCosts>),
}

/// `task_init`'s decision for a channel group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmDecisionMsg {
    /// SET_TIMESLICE to this (µs); `None` leaves the driver's.
    pub timeslice_us: Option<u64>,
    /// SET_INTERLEAVE_LEVEL to this driver level (0 LOW, 1 MEDIUM, 2 HIGH); `None` leaves it.
    pub interleave: Option<u32>,
    pub priority: Priority,
    /// `XP_CLASS_*`.
    pub class: u32,
    /// Whether a program decided (else the driver's defaults stand).
    pub ran: bool,
    /// Why the driver's defaults stand (no program, or it failed).
    pub note: Option<String>,
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
    /// Suspensions that drained as at Lv1 although the queue's level could stop the hardware:
    /// its commands ran shorter than the stop takes to act, or the stop failed.
    #[serde(default)]
    pub drains: u64,
    pub resumes: u64,
    pub suspend_p99_ns: Nanos,
    /// The queue's GPU time per command, busy fraction, bursts and gaps, as its agent measured
    /// them from its completions.
    #[serde(default)]
    pub gpu: GpuTimeSummary,
    /// GPU time launched and not yet finished: commands in flight × GPU time per command
    /// (what a drain of its window costs); `None` until a command was measured.
    #[serde(default)]
    pub in_flight_gpu_ns: Option<Nanos>,
}

impl QueueRow {
    /// Commands in flight × the measured GPU time of one.
    pub fn in_flight_gpu(in_flight: u32, gpu: &GpuTimeSummary) -> Option<Nanos> {
        gpu.per_command_ns
            .map(|per| per.saturating_mul(Nanos::from(in_flight)))
    }
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
    /// The policy the daemon runs on every device: a built-in one's name (`hpf`), or
    /// `FILE.o (eBPF) over BASE`.
    pub policy: String,
    /// Connected agents: the processes whose queues the daemon schedules. Operator connections
    /// (`xpreempt stats`, `list`, `top`, this request's own) and the shim's RM-hook connections
    /// are not counted; the `xpreempt_clients` metric is the same number.
    pub clients: u32,
    pub devices: Vec<DeviceStats>,
    /// Frames refused as malformed, truncated, oversized or of another version.
    pub bad_frames: u64,
    /// Times the watchdog took a silent client's queues out of contention.
    pub watchdog_fires: u64,
    /// Times an agent's doorbell woke the decision loop (rings it took together count once).
    pub fast_path_wakeups: u64,
    /// The pipe directory of the MPS control daemon this daemon owns (`--mps`), for clients'
    /// `CUDA_MPS_PIPE_DIRECTORY`; `None` when the GPU is time-sliced.
    pub mps_pipe: Option<String>,
    /// Requests and connections refused by the daemon's limits, by reason (`connections`,
    /// `connections_per_uid`, `queues`, `queues_per_uid`, `device`, `change_rate`, `idle`,
    /// `slow_frame`, `hello_timeout`).
    #[serde(default)]
    pub refusals: std::collections::BTreeMap<String, u64>,
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
