//! Everything the daemon knows, behind one lock: a driver (scheduler + remote queues) per
//! device, the clients and their segments, and where each queue lives.

mod fast;
mod mechanisms;
mod operator;
mod rm;
mod watchdog;

pub use fast::Seat;

use crate::remote::RemoteQueue;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use thiserror::Error;
use xpreempt_core::sched::protocol::QueueState;
use xpreempt_core::sched::{Driver, QueueInfo, SchedError, SchedEvent, Scheduler};
use xpreempt_core::{Level, Nanos, Priority, QueueId, policy};
use xpreempt_ipc::msg::{DaemonStats, QueueDecl};
use xpreempt_ipc::shm::{Quiet, Segment, decode_report};
use xpreempt_ipc::unix::Cred;

use crate::limits::{ChangeRate, Limits, Reason};

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
    #[error(
        "device {device} is not one this daemon schedules (ids below {devices}; --max-devices)"
    )]
    Device { device: u32, devices: u32 },
    #[error("{what}: the limit of {limit} is reached ({flag})")]
    Limit {
        what: String,
        limit: usize,
        flag: &'static str,
    },
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
    /// Its agent's bell on its user's board (the fast path).
    pub seat: Option<Seat>,
}

impl Client {
    /// One of its segment's slots, where it has a segment and the slot exists.
    pub fn slot(&self, slot: u32) -> Option<&xpreempt_ipc::shm::Slot> {
        self.segment.as_ref()?.slot(slot)
    }
}

struct QueueEntry {
    client: u64,
    slot: u32,
    device: u32,
    level: Level,
    /// Its bit on its user's board, and the fast path's words as last written to its slot.
    bit: Option<u32>,
    preempted_by: u128,
    quiet: Quiet,
}

pub struct State {
    devices: BTreeMap<u32, Driver<RemoteQueue>>,
    queues: BTreeMap<QueueId, QueueEntry>,
    pub clients: BTreeMap<u64, Client>,
    make_scheduler: SchedulerFactory,
    rm: rm::RmState,
    boards: fast::Boards,
    costs: crate::costs::CostBook,
    epoch: Instant,
    next_queue: u32,
    next_client: u64,
    pub stats: DaemonStats,
    pub limits: Limits,
    pub change_rate: ChangeRate,
    pub trace: Option<crate::trace::Trace>,
}

impl State {
    /// Agents of one user share a board and act on the policy's order before the daemon
    /// decides ([`fast`]).
    pub fn new(make_scheduler: SchedulerFactory) -> Self {
        Self {
            devices: BTreeMap::new(),
            queues: BTreeMap::new(),
            clients: BTreeMap::new(),
            make_scheduler,
            rm: rm::RmState::default(),
            boards: fast::Boards::default(),
            costs: crate::costs::CostBook::default(),
            epoch: Instant::now(),
            next_queue: 0,
            next_client: 1,
            stats: DaemonStats {
                protocol: xpreempt_ipc::PROTOCOL_VERSION,
                ..DaemonStats::default()
            },
            limits: Limits::default(),
            change_rate: ChangeRate::default(),
            trace: None,
        }
    }

    /// Counts a refusal; returns how many of this reason so far.
    pub fn refused(&mut self, reason: Reason) -> u64 {
        let n = self
            .stats
            .refusals
            .entry(reason.name().to_string())
            .or_default();
        *n += 1;
        *n
    }

    /// Whether a client holds queues or channel groups (one that holds nothing may be closed
    /// when idle).
    pub fn holds_anything(&self, client: u64) -> bool {
        self.clients
            .get(&client)
            .is_some_and(|c| !c.queues.is_empty())
            || self.rm_holds(client)
    }

    /// Refuses a queue on a device beyond the bound, or beyond the bounds on queues.
    fn check_queue_limits(&mut self, client: u64, device: u32) -> Result<(), Refusal> {
        let l = &self.limits;
        let refusal = if device >= l.devices {
            Some((
                Reason::Device,
                Refusal::Device {
                    device,
                    devices: l.devices,
                },
            ))
        } else if self.queues.len() >= l.queues {
            Some((
                Reason::Queues,
                Refusal::Limit {
                    what: "queues of all users".into(),
                    limit: l.queues,
                    flag: "--max-queues",
                },
            ))
        } else {
            let uid = self.clients.get(&client).map(|c| c.cred.uid);
            let mine = self
                .queues
                .values()
                .filter(|e| self.clients.get(&e.client).map(|c| c.cred.uid) == uid)
                .count();
            (mine >= l.queues_per_uid).then(|| {
                (
                    Reason::QueuesPerUid,
                    Refusal::Limit {
                        what: format!("queues of user {}", uid.unwrap_or(0)),
                        limit: l.queues_per_uid,
                        flag: "--max-queues-per-uid",
                    },
                )
            })
        };
        match refusal {
            Some((reason, r)) => {
                self.refused(reason);
                Err(r)
            }
            None => Ok(()),
        }
    }

    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    pub fn add_client(&mut self, cred: Cred, name: String, segment: Option<Arc<Segment>>) -> u64 {
        let id = self.next_client;
        self.next_client += 1;
        let seat = segment
            .as_ref()
            .and_then(|_| self.boards.seat(cred.uid, id));
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
                seat,
            },
        );
        id
    }

    /// A client is gone (exited, crashed, killed, or cut off): its queues leave the scheduler,
    /// which at once resumes whatever was suspended in their favour.
    pub fn remove_client(&mut self, id: u64) {
        self.rm_client_gone(id);
        let Some(client) = self.clients.get(&id) else {
            return;
        };
        for queue in client.queues.values().copied().collect::<Vec<_>>() {
            self.drop_queue(queue);
        }
        if let Some(client) = self.clients.remove(&id)
            && let Some(seat) = &client.seat
        {
            self.boards.unseat(seat);
        }
    }

    pub fn register(
        &mut self,
        client: u64,
        slot: u32,
        decl: QueueDecl,
    ) -> Result<(QueueId, Option<u32>), Refusal> {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        self.check_queue_limits(client, decl.device)?;
        self.wake_quiet(decl.device);
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
            compute_units: None,
            // The CUDA HAL cannot move a queue between SMs while it runs.
            confinable: false,
        };
        if let Some(s) = segment.slot(slot) {
            // A slot reused after an earlier queue starts from nothing.
            s.command.store(0, Ordering::SeqCst);
            s.lift.store(0);
            s.preempted_by.store(0);
            s.set_quiet(Quiet::Loud);
            s.gpu.clear();
            s.suspend_latency.clear();
            s.drain_latency.clear();
            s.resume_latency.clear();
        }
        let driver = match self.devices.entry(decl.device) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Driver::new((self.make_scheduler)()?))
            }
        };
        driver.register(info, RemoteQueue::new(segment, slot), &clock)?;
        if let Some(t) = self.trace.as_mut() {
            t.name(decl.device, id, &format!("{} ({})", c.name, c.cred.pid));
        }
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
        let bit = match &c.seat {
            Some(seat) => self.boards.take_bit(seat, id),
            None => None,
        };
        self.queues.insert(
            id,
            QueueEntry {
                client,
                slot,
                device: decl.device,
                level: decl.level,
                bit,
                preempted_by: 0,
                quiet: Quiet::Loud,
            },
        );
        self.refresh(decl.device);
        Ok((id, bit))
    }

    /// A queue is about to join `device`: a queue there may have reported without a doorbell
    /// so far (`quiet`); from now on it rings, and what it reported meanwhile is taken now.
    fn wake_quiet(&mut self, device: u32) {
        let quiet: Vec<(u64, u32)> = self
            .queues
            .values_mut()
            .filter(|e| e.device == device && e.quiet != Quiet::Loud)
            .map(|e| {
                e.quiet = Quiet::Loud;
                (e.client, e.slot)
            })
            .collect();
        for (client, slot) in quiet {
            if let Some(s) = self.clients.get(&client).and_then(|c| c.slot(slot)) {
                // Cleared before the report is read: a Ready stored after this read rings.
                s.set_quiet(Quiet::Loud);
            }
            self.take_reports(client);
        }
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
        self.retire_costs(queue);
        let Some(entry) = self.queues.remove(&queue) else {
            return;
        };
        let epoch = self.epoch;
        if let Some(d) = self.devices.get_mut(&entry.device) {
            d.unregister(queue, &move || epoch.elapsed().as_nanos() as Nanos);
        }
        if let Some(t) = self.trace.as_mut() {
            t.forget(entry.device, queue, epoch.elapsed().as_nanos() as Nanos);
        }
        self.refresh(entry.device);
        let uid = self
            .clients
            .get(&entry.client)
            .and_then(|c| c.seat.as_ref())
            .map(|s| s.uid);
        if let (Some(uid), Some(bit)) = (uid, entry.bit) {
            self.boards.release_bit(uid, bit);
        }
    }

    /// Takes every changed report out of a client's segment and decides on each: the fast path.
    pub fn take_reports(&mut self, client: u64) {
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
        let mut touched = BTreeSet::new();
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
            if let Some(dev) = device
                && let Some(d) = self.devices.get_mut(&dev)
            {
                touched.insert(dev);
                if let Err(e) = d.report(queue, report, &clock) {
                    tracing::warn!(%queue, %e, "report ignored");
                }
            }
        }
        for dev in touched {
            self.refresh(dev);
        }
    }

    /// Every client's reports, for an operator's view of queues that report quietly.
    pub fn take_all_reports(&mut self) {
        let ids: Vec<u64> = self.clients.keys().copied().collect();
        for id in ids {
            self.take_reports(id);
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
            let r = d.dispatch(event, &move || epoch.elapsed().as_nanos() as Nanos);
            self.refresh(device);
            r?;
        }
        Ok(())
    }

    /// `queue` inherits `priority` from its client's work that waits on it, capped at the
    /// highest priority of that client's queues on the device: a client lends only what it has.
    pub fn inherit(
        &mut self,
        client: u64,
        queue: QueueId,
        priority: Option<Priority>,
    ) -> Result<(), Refusal> {
        let device = self
            .queues
            .get(&queue)
            .filter(|e| e.client == client)
            .ok_or(Refusal::UnknownQueue(queue))?
            .device;
        let cap = self.devices.get(&device).and_then(|d| {
            self.queues
                .iter()
                .filter(|(_, e)| e.client == client && e.device == device)
                .filter_map(|(id, _)| d.scheduler().queue_info(*id).map(|i| i.priority))
                .max()
        });
        let priority = priority.map(|p| cap.map_or(p, |c| p.min(c)));
        self.event(client, queue, SchedEvent::Inherit { queue, priority })
    }

    /// Ends the timeline (`--trace`), if one is written.
    pub fn finish_trace(&mut self) {
        let now = self.epoch.elapsed().as_nanos() as Nanos;
        if let Some(t) = self.trace.as_mut() {
            t.finish(now);
        }
    }

    /// Fires timers that are due; returns when the next one is.
    pub fn run_timers(&mut self) -> Option<Nanos> {
        let epoch = self.epoch;
        let clock = move || epoch.elapsed().as_nanos() as Nanos;
        let mut fired = Vec::new();
        for (&dev, d) in self.devices.iter_mut() {
            if d.next_wake().is_some_and(|at| at <= clock()) {
                fired.push(dev);
            }
            if let Err(e) = d.timer(&clock) {
                tracing::warn!(%e, "timer");
            }
        }
        for dev in fired {
            self.refresh(dev);
        }
        self.devices.values().filter_map(|d| d.next_wake()).min()
    }

    /// Shows every agent that the daemon is alive (`Header::daemon_beat`).
    pub fn beat(&self) {
        for seg in self.clients.values().filter_map(|c| c.segment.as_ref()) {
            seg.header().daemon_beat.fetch_add(1, Ordering::SeqCst);
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
}
