//! What operators ask of the daemon: priority and hint changes (with the permission rule),
//! the list of queues, statistics, and the eBPF program's maps.

use super::{Refusal, State, bpf_program};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use xpreempt_core::sched::SchedEvent;
use xpreempt_core::{Priority, QueueId};
use xpreempt_ipc::msg::{DaemonStats, DeviceStats, PolicyMap, QueueRow, Target};
use xpreempt_ipc::shm::LatencyCounts;
use xpreempt_ipc::unix::Cred;

impl State {
    /// Changes the priority of a process's queues or of one queue, if `who` may.
    pub fn set_priority(
        &mut self,
        who: Cred,
        target: Target,
        priority: Priority,
    ) -> Result<u32, Refusal> {
        let queues = self.targets(target)?;
        self.check_permission(who, &queues)?;
        for &q in &queues {
            self.event_any(q, SchedEvent::Priority { queue: q, priority })?;
        }
        Ok(queues.len() as u32)
    }

    /// Replaces the hints (deadline, share, timeslice, LC/BE) of a process's queues or of one.
    pub fn set_hints(
        &mut self,
        who: Cred,
        target: Target,
        hints: xpreempt_core::Hints,
    ) -> Result<u32, Refusal> {
        let queues = self.targets(target)?;
        self.check_permission(who, &queues)?;
        for &q in &queues {
            self.event_any(q, SchedEvent::Hints { queue: q, hints })?;
        }
        Ok(queues.len() as u32)
    }

    fn event_any(&mut self, queue: QueueId, event: SchedEvent) -> Result<(), Refusal> {
        let client = self
            .queues
            .get(&queue)
            .ok_or(Refusal::UnknownQueue(queue))?
            .client;
        self.event(client, queue, event)
    }

    fn targets(&self, target: Target) -> Result<Vec<QueueId>, Refusal> {
        match target {
            Target::Queue(q) if self.queues.contains_key(&q) => Ok(vec![q]),
            Target::Queue(q) => Err(Refusal::UnknownQueue(q)),
            Target::Process(pid) => {
                let qs: Vec<QueueId> = self
                    .clients
                    .values()
                    .filter(|c| c.cred.pid == pid)
                    .flat_map(|c| c.queues.values().copied())
                    .collect();
                if qs.is_empty() {
                    Err(Refusal::NoSuchProcess(pid))
                } else {
                    Ok(qs)
                }
            }
        }
    }

    fn check_permission(&self, who: Cred, queues: &[QueueId]) -> Result<(), Refusal> {
        for &queue in queues {
            let owner = self
                .queues
                .get(&queue)
                .and_then(|e| self.clients.get(&e.client))
                .ok_or(Refusal::UnknownQueue(queue))?
                .cred;
            if !who.may_change(&owner) {
                return Err(Refusal::Permission {
                    queue,
                    owner_pid: owner.pid,
                    owner_uid: owner.uid,
                    uid: who.uid,
                });
            }
        }
        Ok(())
    }

    pub fn list(&mut self) -> Vec<QueueRow> {
        self.take_all_reports();
        let mut rows = Vec::new();
        let now = self.now();
        for d in self.devices.values() {
            for v in d.scheduler().snapshot(now) {
                let Some(e) = self.queues.get(&v.id) else {
                    continue;
                };
                let Some(c) = self.clients.get(&e.client) else {
                    continue;
                };
                let slot = c.slot(e.slot);
                let load32 = |f: fn(&xpreempt_ipc::shm::Slot) -> &std::sync::atomic::AtomicU32| {
                    slot.map_or(0, |s| f(s).load(Ordering::Relaxed))
                };
                let load64 = |f: fn(&xpreempt_ipc::shm::Slot) -> &std::sync::atomic::AtomicU64| {
                    slot.map_or(0, |s| f(s).load(Ordering::Relaxed))
                };
                let in_flight = load32(|s| &s.in_flight);
                let gpu = slot.map(|s| s.gpu.load()).unwrap_or_default();
                rows.push(QueueRow {
                    queue: v.id,
                    process: c.cred.pid,
                    process_name: c.name.clone(),
                    device: e.device,
                    level: e.level,
                    logical_priority: v.logical_priority,
                    effective_priority: v.effective_priority,
                    state: v.state,
                    in_flight,
                    pending: load32(|s| &s.pending),
                    preemptions: load64(|s| &s.preemptions),
                    drains: slot.map_or(0, |s| s.drain_latency.load().count),
                    resumes: load64(|s| &s.resumes),
                    suspend_p99_ns: load64(|s| &s.suspend_p99_ns),
                    in_flight_gpu_ns: QueueRow::in_flight_gpu(in_flight, &gpu),
                    gpu,
                });
            }
        }
        rows
    }

    /// Each queue's suspend latencies (every suspension, whichever way it stopped) and resume
    /// latencies, as its agent last published them.
    pub fn latencies(&self) -> BTreeMap<QueueId, (LatencyCounts, LatencyCounts)> {
        let mut out = BTreeMap::new();
        for (&queue, e) in &self.queues {
            if let Some(s) = self.clients.get(&e.client).and_then(|c| c.slot(e.slot)) {
                let mut suspend = s.suspend_latency.load();
                xpreempt_ipc::costs::add(&mut suspend, &s.drain_latency.load());
                out.insert(queue, (suspend, s.resume_latency.load()));
            }
        }
        out
    }

    /// The timeline's GPU-time counters (`--trace`): each queue's measurements as its agent
    /// last published them. Sampled on the tick, so nothing is added to the decision path.
    pub fn trace_gpu(&mut self) {
        let now = self.now();
        let Some(trace) = self.trace.as_mut() else {
            return;
        };
        for (&queue, e) in &self.queues {
            if let Some(s) = self.clients.get(&e.client).and_then(|c| c.slot(e.slot)) {
                trace.gpu(e.device, queue, now, &s.gpu.load());
                trace.drains(e.device, queue, now, s.drain_latency.load().count);
            }
        }
    }

    pub fn set_mps_pipe(&mut self, pipe: Option<String>) {
        self.stats.mps_pipe = pipe;
    }

    pub fn stats(&self) -> DaemonStats {
        let mut s = self.stats.clone();
        // Agents only: an operator asking would otherwise count itself, and the metrics
        // endpoint (no socket connection) would say one fewer.
        s.clients = self
            .clients
            .values()
            .filter(|c| c.segment.is_some())
            .count() as u32;
        s.devices = self
            .devices
            .iter()
            .map(|(&device, d)| DeviceStats {
                device,
                policy: d.scheduler().policy_name().to_string(),
                queues: d.queues().count() as u32,
                scheduler: d.scheduler().stats().clone(),
            })
            .collect();
        s
    }

    /// The maps of each device's eBPF program.
    pub fn policy_maps(&mut self) -> Vec<PolicyMap> {
        let mut out = Vec::new();
        for (&device, d) in &mut self.devices {
            let Some(program) = bpf_program(d) else {
                continue;
            };
            for m in program.maps() {
                out.push(PolicyMap {
                    device,
                    map: m.name().to_string(),
                    key_size: m.def().key_size,
                    value_size: m.def().value_size,
                    entries: m.entries(),
                });
            }
        }
        out
    }

    /// Changes a map of every device's program; only root or the daemon's own user may, since
    /// it changes the policy for every process.
    pub fn policy_map_update(
        &mut self,
        who: Cred,
        map: &str,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<u32, Refusal> {
        // SAFETY: geteuid has no preconditions.
        let daemon_uid = unsafe { libc::geteuid() };
        if who.uid != 0 && who.uid != daemon_uid {
            return Err(Refusal::PolicyPermission { uid: who.uid });
        }
        let mut changed = 0;
        for d in self.devices.values_mut() {
            let Some(program) = bpf_program(d) else {
                continue;
            };
            let m = program
                .map_mut(map)
                .ok_or_else(|| Refusal::NoMap(map.to_string()))?;
            match value {
                Some(v) => m.update(key, v, 0),
                None => m.delete(key),
            }
            .map_err(Refusal::Map)?;
            changed += 1;
        }
        if changed == 0 {
            return Err(Refusal::NoProgram);
        }
        Ok(changed)
    }

    /// Whether any device's hooks want work reports (mirrored into every segment).
    pub fn wants_work(&self) -> bool {
        self.devices.values().any(|d| d.scheduler().wants_work())
    }
}
