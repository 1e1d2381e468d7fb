//! Everything the daemon knows, behind one lock: a driver (scheduler + remote queues) per
//! device, the clients and their segments, and where each queue lives.

mod rm;

use crate::remote::RemoteQueue;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use thiserror::Error;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::sched::{Driver, QueueInfo, SchedError, SchedEvent, Scheduler};
use xpreempt_core::{Level, Nanos, Priority, QueueId, policy};
use xpreempt_ipc::msg::{DaemonStats, DeviceStats, PolicyMap, QueueDecl, QueueRow, Target};
use xpreempt_ipc::shm::{Segment, decode_report};
use xpreempt_ipc::unix::Cred;

/// Makes the scheduler of a device the first time a queue registers on it.
pub type SchedulerFactory = Box<dyn Fn() -> Result<Scheduler, policy::UnknownPolicy> + Send>;

/// What a client asked for that the daemon will not do; the text goes back to it.
#[derive(Debug, Error)]
pub enum Refusal {
    #[error("slot {slot} is not free in this client's segment (it has {slots} slots)")]
    Slot { slot: u32, slots: u32 },
    #[error("only an agent (a process with a shared segment) registers queues")]
    NotAnAgent,
    #[error("queue {0} is not known to the daemon")]
    UnknownQueue(QueueId),
    #[error(
        "queue {queue} belongs to process {owner_pid} of user {owner_uid}; user {uid} may not change it"
    )]
    Permission {
        queue: QueueId,
        owner_pid: u32,
        owner_uid: u32,
        uid: u32,
    },
    #[error("process {0} has no queues")]
    NoSuchProcess(u32),
    #[error("only root or the daemon's user may change the policy's maps (you are uid {uid})")]
    PolicyPermission { uid: u32 },
    #[error("the policy has no map named `{0}`")]
    NoMap(String),
    #[error(
        "no device runs an eBPF program yet (start the daemon with --policy FILE.o; devices appear with their first queue)"
    )]
    NoProgram,
    #[error("map update: {0}")]
    Map(xpreempt_bpf::maps::MapError),
    #[error(transparent)]
    Policy(#[from] policy::UnknownPolicy),
    #[error(transparent)]
    Sched(#[from] SchedError),
}

fn bpf_program(d: &mut Driver<RemoteQueue>) -> Option<&mut xpreempt_bpf::BpfProgram> {
    rm::bpf_hooks(d)?.program_mut()
}

pub struct Client {
    pub cred: Cred,
    pub name: String,
    pub segment: Option<Arc<Segment>>,
    /// Slot → queue.
    pub queues: BTreeMap<u32, QueueId>,
    /// The report word last taken from each slot.
    seen: BTreeMap<u32, u64>,
    /// The heartbeat last seen, and when it moved.
    heartbeat: (u64, Instant),
    /// The watchdog took this client's queues out of contention until it shows life again.
    silenced: bool,
}

struct QueueEntry {
    client: u64,
    slot: u32,
    device: u32,
    level: Level,
}

pub struct State {
    devices: BTreeMap<u32, Driver<RemoteQueue>>,
    queues: BTreeMap<QueueId, QueueEntry>,
    pub clients: BTreeMap<u64, Client>,
    make_scheduler: SchedulerFactory,
    rm: rm::RmState,
    epoch: Instant,
    next_queue: u32,
    next_client: u64,
    pub stats: DaemonStats,
}

impl State {
    pub fn new(make_scheduler: SchedulerFactory) -> Self {
        Self {
            devices: BTreeMap::new(),
            queues: BTreeMap::new(),
            clients: BTreeMap::new(),
            make_scheduler,
            rm: rm::RmState::default(),
            epoch: Instant::now(),
            next_queue: 0,
            next_client: 1,
            stats: DaemonStats {
                protocol: xpreempt_ipc::PROTOCOL_VERSION,
                ..DaemonStats::default()
            },
        }
    }

    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    pub fn add_client(&mut self, cred: Cred, name: String, segment: Option<Arc<Segment>>) -> u64 {
        let id = self.next_client;
        self.next_client += 1;
        self.clients.insert(
            id,
            Client {
                cred,
                name,
                segment,
                queues: BTreeMap::new(),
                seen: BTreeMap::new(),
                heartbeat: (0, Instant::now()),
                silenced: false,
            },
        );
        id
    }

    /// A client is gone (exited, crashed, killed, or cut off): its queues leave the scheduler,
    /// which at once resumes whatever was suspended in their favour.
    pub fn remove_client(&mut self, id: u64) {
        self.rm_client_gone(id);
        let Some(client) = self.clients.remove(&id) else {
            return;
        };
        for queue in client.queues.into_values() {
            self.drop_queue(queue);
        }
    }

    pub fn register(
        &mut self,
        client: u64,
        slot: u32,
        decl: QueueDecl,
    ) -> Result<QueueId, Refusal> {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        let c = self.clients.get_mut(&client).ok_or(Refusal::NotAnAgent)?;
        let segment = c.segment.clone().ok_or(Refusal::NotAnAgent)?;
        if slot >= segment.slots() || c.queues.contains_key(&slot) {
            return Err(Refusal::Slot {
                slot,
                slots: segment.slots(),
            });
        }
        let id = QueueId(self.next_queue);
        let info = QueueInfo {
            id,
            process: c.cred.pid,
            device: decl.device,
            priority: decl.priority,
            hints: decl.hints,
            interleave: decl.interleave,
        };
        if let Some(s) = segment.slot(slot) {
            // A slot reused after an earlier queue starts from nothing.
            s.command.store(0, Ordering::SeqCst);
        }
        let driver = match self.devices.entry(decl.device) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Driver::new((self.make_scheduler)()?))
            }
        };
        driver.register(info, RemoteQueue::new(segment, slot), &clock)?;
        self.next_queue += 1;
        // A device's hooks exist from its first queue on: tell every agent whether to send work.
        let wants = u32::from(self.wants_work());
        for c in self.clients.values() {
            if let Some(seg) = &c.segment {
                seg.header().wants_work.store(wants, Ordering::Relaxed);
            }
        }
        let c = self.clients.get_mut(&client).ok_or(Refusal::NotAnAgent)?;
        c.queues.insert(slot, id);
        c.seen.insert(slot, 0);
        self.queues.insert(
            id,
            QueueEntry {
                client,
                slot,
                device: decl.device,
                level: decl.level,
            },
        );
        Ok(id)
    }

    pub fn unregister(&mut self, client: u64, queue: QueueId) -> Result<(), Refusal> {
        let entry = self
            .queues
            .get(&queue)
            .filter(|e| e.client == client)
            .ok_or(Refusal::UnknownQueue(queue))?;
        let slot = entry.slot;
        if let Some(c) = self.clients.get_mut(&client) {
            c.queues.remove(&slot);
            c.seen.remove(&slot);
        }
        self.drop_queue(queue);
        Ok(())
    }

    fn drop_queue(&mut self, queue: QueueId) {
        let Some(entry) = self.queues.remove(&queue) else {
            return;
        };
        let epoch = self.epoch;
        if let Some(d) = self.devices.get_mut(&entry.device) {
            d.unregister(queue, &move || epoch.elapsed().as_nanos() as Nanos);
        }
    }

    /// Takes every changed report out of a client's segment and decides on each: the fast path.
    pub fn take_reports(&mut self, client: u64) {
        self.stats.fast_path_wakeups += 1;
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        let Some(segment) = c.segment.clone() else {
            return;
        };
        if c.silenced {
            return;
        }
        for (&slot, &queue) in &c.queues {
            let Some(s) = segment.slot(slot) else {
                continue;
            };
            let word = s.report.load(Ordering::SeqCst);
            let seen = c.seen.entry(slot).or_insert(0);
            if word == *seen {
                continue;
            }
            *seen = word;
            let Some(report) = decode_report(word) else {
                continue;
            };
            let device = self.queues.get(&queue).map(|e| e.device);
            if let Some(d) = device.and_then(|dev| self.devices.get_mut(&dev))
                && let Err(e) = d.report(queue, report, &clock)
            {
                tracing::warn!(%queue, %e, "report ignored");
            }
        }
    }

    /// Admission retries and work for the hooks, from the socket.
    pub fn event(&mut self, client: u64, queue: QueueId, event: SchedEvent) -> Result<(), Refusal> {
        let device = self
            .queues
            .get(&queue)
            .filter(|e| e.client == client)
            .ok_or(Refusal::UnknownQueue(queue))?
            .device;
        let epoch = self.epoch;
        if let Some(d) = self.devices.get_mut(&device) {
            d.dispatch(event, &move || epoch.elapsed().as_nanos() as Nanos)?;
        }
        Ok(())
    }

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

    /// Fires timers that are due; returns when the next one is.
    pub fn run_timers(&mut self) -> Option<Nanos> {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        for d in self.devices.values_mut() {
            if let Err(e) = d.timer(&clock) {
                tracing::warn!(%e, "timer");
            }
        }
        self.devices.values().filter_map(|d| d.next_wake()).min()
    }

    /// The watchdog: a client whose agent stopped beating for `bound` while it had work is taken
    /// out of contention (its queues count as idle), so others are not held suspended for it; it
    /// comes back with its current reports as soon as it beats again.
    pub fn watchdog(&mut self, bound: std::time::Duration) {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        let now = Instant::now();
        let ids: Vec<u64> = self.clients.keys().copied().collect();
        for id in ids {
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            let Some(segment) = c.segment.clone() else {
                continue;
            };
            let beat = segment.header().heartbeat.load(Ordering::SeqCst);
            if beat != c.heartbeat.0 {
                c.heartbeat = (beat, now);
                if std::mem::take(&mut c.silenced) {
                    tracing::info!(
                        pid = c.cred.pid,
                        "client answers again; its queues compete again"
                    );
                    c.seen.clear();
                    let queues: Vec<(u32, QueueId)> =
                        c.queues.iter().map(|(s, q)| (*s, *q)).collect();
                    for (slot, queue) in queues {
                        let report = segment
                            .slot(slot)
                            .and_then(|s| decode_report(s.report.load(Ordering::SeqCst)));
                        if let Some(xpreempt_core::sched::QueueReport::Ready { pending, .. }) =
                            report
                        {
                            let _ = self.event(id, queue, SchedEvent::Ready { queue, pending });
                        }
                    }
                }
                continue;
            }
            if c.silenced || now.duration_since(c.heartbeat.1) < bound {
                continue;
            }
            let queues: Vec<QueueId> = c.queues.values().copied().collect();
            let active: Vec<QueueId> = queues
                .into_iter()
                .filter(|q| self.view_state(*q).is_some_and(|s| s != QueueState::Idle))
                .collect();
            if active.is_empty() {
                continue;
            }
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            c.silenced = true;
            tracing::warn!(
                pid = c.cred.pid,
                name = %c.name,
                silent_ms = now.duration_since(c.heartbeat.1).as_millis() as u64,
                "watchdog: client stopped answering while it had work; its queues no longer hold others back"
            );
            self.stats.watchdog_fires += 1;
            for queue in active {
                if let Some(d) = self
                    .queues
                    .get(&queue)
                    .and_then(|e| self.devices.get_mut(&e.device))
                {
                    let _ = d.dispatch(SchedEvent::Idle(queue), &clock);
                }
            }
        }
    }

    fn view_state(&self, queue: QueueId) -> Option<QueueState> {
        let e = self.queues.get(&queue)?;
        let d = self.devices.get(&e.device)?;
        d.scheduler()
            .views()
            .iter()
            .find(|v| v.id == queue)
            .map(|v| v.state)
    }

    pub fn list(&self) -> Vec<QueueRow> {
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
                let slot = c.segment.as_ref().and_then(|s| s.slot(e.slot));
                let load32 = |f: fn(&xpreempt_ipc::shm::Slot) -> &std::sync::atomic::AtomicU32| {
                    slot.map_or(0, |s| f(s).load(Ordering::Relaxed))
                };
                let load64 = |f: fn(&xpreempt_ipc::shm::Slot) -> &std::sync::atomic::AtomicU64| {
                    slot.map_or(0, |s| f(s).load(Ordering::Relaxed))
                };
                rows.push(QueueRow {
                    queue: v.id,
                    process: c.cred.pid,
                    process_name: c.name.clone(),
                    device: e.device,
                    level: e.level,
                    logical_priority: v.logical_priority,
                    effective_priority: v.effective_priority,
                    state: v.state,
                    in_flight: load32(|s| &s.in_flight),
                    pending: load32(|s| &s.pending),
                    preemptions: load64(|s| &s.preemptions),
                    resumes: load64(|s| &s.resumes),
                    suspend_p99_ns: load64(|s| &s.suspend_p99_ns),
                });
            }
        }
        rows
    }

    pub fn set_mps_pipe(&mut self, pipe: Option<String>) {
        self.stats.mps_pipe = pipe;
    }

    pub fn stats(&self) -> DaemonStats {
        let mut s = self.stats.clone();
        s.clients = self.clients.len() as u32;
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
