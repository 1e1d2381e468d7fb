//! The RM hooks of every process: the shim reports its process's compute channel groups
//! (created, asking to be enabled, their channels' tokens, freed), and the daemon runs the
//! device's eBPF program at each, the same program (and maps) its XQueues run under. Work that an
//! agent reports for a process's queues also counts as work of that process's channel groups on
//! the device, so that a policy sees per-launch submissions at the RM level too.

use super::{Refusal, State};
use crate::remote::RemoteQueue;
use std::collections::{BTreeMap, BTreeSet};
use xpreempt_bpf::BpfHooks;
use xpreempt_bpf::rm::{RmGroup, RmRuntime, rm_queue_id};
use xpreempt_core::sched::{Driver, Work};
use xpreempt_core::{Nanos, QueueId};
use xpreempt_ipc::msg::{RmDecisionMsg, RmGroupDecl};

#[derive(Default)]
pub(super) struct RmState {
    runtime: RmRuntime,
    /// Client → the channel groups it reported and has not freed.
    by_client: BTreeMap<u64, BTreeSet<u64>>,
}

pub(super) fn bpf_hooks(d: &mut Driver<RemoteQueue>) -> Option<&mut BpfHooks> {
    d.scheduler_mut()
        .hooks_mut()?
        .as_any_mut()?
        .downcast_mut::<BpfHooks>()
}

const NO_PROGRAM: &str = "the daemon runs no eBPF program (start it with --policy FILE.o)";

impl State {
    /// The scheduler of `device`, made now if no queue or channel group opened it yet (so that
    /// an eBPF program's maps exist before the first process comes).
    pub fn open_device(&mut self, device: u32) -> Result<&mut Driver<RemoteQueue>, Refusal> {
        if device >= self.limits.devices {
            self.refused(crate::limits::Reason::Device);
            return Err(Refusal::Device {
                device,
                devices: self.limits.devices,
            });
        }
        Ok(match self.devices.entry(device) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Driver::new((self.make_scheduler)()?))
            }
        })
    }

    fn client_pid(&self, client: u64) -> Result<u32, Refusal> {
        self.clients
            .get(&client)
            .map(|c| c.cred.pid)
            .ok_or(Refusal::NotAnAgent)
    }

    pub fn rm_task_init(
        &mut self,
        client: u64,
        decl: RmGroupDecl,
    ) -> Result<RmDecisionMsg, Refusal> {
        let pid = self.client_pid(client)?;
        let held = self.rm.by_client.get(&client).map_or(0, |s| s.len());
        if held >= self.limits.queues_per_uid {
            self.refused(crate::limits::Reason::QueuesPerUid);
            return Err(Refusal::Limit {
                what: format!("channel groups of process {pid}"),
                limit: self.limits.queues_per_uid,
                flag: "--max-queues-per-uid",
            });
        }
        let now = self.now();
        let group = RmGroup {
            pid,
            device: decl.device,
            tsg: decl.tsg,
            default_timeslice_us: decl.default_timeslice_us,
            default_priority: decl.default_priority,
            hint_class: decl.hint_class,
        };
        self.open_device(decl.device)?;
        let Some(hooks) = self.devices.get_mut(&decl.device).and_then(bpf_hooks) else {
            return Ok(RmDecisionMsg {
                priority: decl.default_priority,
                note: Some(NO_PROGRAM.into()),
                ..RmDecisionMsg::default()
            });
        };
        let d = self.rm.runtime.task_init(hooks, &group, now);
        self.rm
            .by_client
            .entry(client)
            .or_default()
            .insert(d.queue_id);
        let note = match (&d.failure, d.ran) {
            (Some(f), _) => Some(f.clone()),
            (None, false) => Some("the program has no task_init".into()),
            (None, true) => None,
        };
        if let Some(f) = &d.failure {
            tracing::error!(pid, "RM task_init: {f}; the driver's defaults stand");
        }
        tracing::info!(
            pid,
            device = decl.device,
            tsg = decl.tsg,
            timeslice_us = ?d.timeslice_us,
            class = d.class,
            "channel group created"
        );
        Ok(RmDecisionMsg {
            timeslice_us: d.timeslice_us,
            interleave: d.interleave,
            priority: d.priority,
            class: d.class,
            ran: d.ran,
            note,
        })
    }

    /// `(allow, ran, note)` for a group asking to be enabled.
    pub fn rm_schedule(
        &mut self,
        client: u64,
        device: u32,
        tsg: u32,
        channels: u32,
    ) -> Result<(bool, bool, Option<String>), Refusal> {
        let id = rm_queue_id(self.client_pid(client)?, device, tsg);
        let now = self.now();
        let Some(hooks) = self.devices.get_mut(&device).and_then(bpf_hooks) else {
            return Ok((true, false, Some(NO_PROGRAM.into())));
        };
        let a = self.rm.runtime.schedule(hooks, id, channels, now);
        if let Some(f) = &a.failure {
            tracing::error!(%id, "RM schedule: {f}; admitted (the driver's default)");
        }
        Ok((a.allow, a.ran, a.failure))
    }

    pub fn rm_enabled(&mut self, client: u64, device: u32, tsg: u32) -> Result<(), Refusal> {
        let id = rm_queue_id(self.client_pid(client)?, device, tsg);
        self.rm.runtime.enabled(id);
        Ok(())
    }

    pub fn rm_work(
        &mut self,
        client: u64,
        device: u32,
        tsg: u32,
        (event, kind, token): (u32, u32, u64),
    ) -> Result<(), Refusal> {
        let id = rm_queue_id(self.client_pid(client)?, device, tsg);
        self.rm_work_of(id, device, event, kind, token);
        Ok(())
    }

    fn rm_work_of(&mut self, id: u64, device: u32, event: u32, kind: u32, token: u64) {
        let now = self.now();
        if let Some(hooks) = self.devices.get_mut(&device).and_then(bpf_hooks)
            && let Some(f) = self
                .rm
                .runtime
                .work_submit(hooks, id, event, kind, token, now)
        {
            tracing::error!(%id, "RM work_submit: {f}");
        }
    }

    /// An agent's queue `queue` of `client` got work: the process's channel groups on the same
    /// device see it as their work too.
    pub fn rm_forward_work(&mut self, client: u64, queue: QueueId, work: Work) {
        if self.rm.runtime.is_empty() {
            return;
        }
        let (Ok(pid), Some(device)) = (
            self.client_pid(client),
            self.queues.get(&queue).map(|e| e.device),
        ) else {
            return;
        };
        let (event, kind, token) = match work {
            Work::Submitted { kind, seq } => (xpreempt_bpf::ctx::WORK_SUBMIT, kind as u32, seq),
            Work::Completed { upto } => (xpreempt_bpf::ctx::WORK_COMPLETE, 0, upto),
        };
        for id in self.rm.runtime.groups_of(pid) {
            if xpreempt_bpf::rm::decode_rm_queue_id(id).is_some_and(|q| q.device == device) {
                self.rm_work_of(id, device, event, kind, token);
            }
        }
    }

    pub fn rm_task_destroy(&mut self, client: u64, device: u32, tsg: u32) -> Result<(), Refusal> {
        let id = rm_queue_id(self.client_pid(client)?, device, tsg);
        if let Some(set) = self.rm.by_client.get_mut(&client) {
            set.remove(&id);
        }
        self.rm_destroy(id, device);
        Ok(())
    }

    fn rm_destroy(&mut self, id: u64, device: u32) {
        let now: Nanos = self.now();
        if let Some(hooks) = self.devices.get_mut(&device).and_then(bpf_hooks)
            && let Some(f) = self.rm.runtime.task_destroy(hooks, id, now)
        {
            tracing::error!(%id, "RM task_destroy: {f}");
        }
    }

    /// Whether a client holds channel groups.
    pub(super) fn rm_holds(&self, client: u64) -> bool {
        self.rm
            .by_client
            .get(&client)
            .is_some_and(|s| !s.is_empty())
    }

    /// A client is gone: the groups it did not free (it crashed, or was killed) are destroyed.
    pub(super) fn rm_client_gone(&mut self, client: u64) {
        let Some(ids) = self.rm.by_client.remove(&client) else {
            return;
        };
        for id in ids {
            let device = xpreempt_bpf::rm::decode_rm_queue_id(id).map_or(0, |q| q.device);
            tracing::info!(%id, "channel group of a departed process: task_destroy");
            self.rm_destroy(id, device);
        }
    }
}
