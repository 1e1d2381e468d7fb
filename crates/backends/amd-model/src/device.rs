//! The GPU model: rings, MQD state per queue, the packet processor that fetches AQL packets and
//! places workgroups on CUs, completion signals, and the event loop that ties them together.
//!
//! Map/unmap and CWSR live in `hws.rs` and `cwsr.rs`; the KFD-style calls in `kfd.rs`. All of
//! them are methods of [`Gpu`], which owns every piece of hardware state.

use crate::aql::Packet;
use crate::compute::{Compute, CuMask};
use crate::config::{GpuConfig, KernelCode, us};
use crate::cpsch::{Cpsch, HqdSlot};
use crate::error::ModelError;
use crate::sim::EventQueue;
use crate::trace::TraceBuf;
use serde::Serialize;
use std::collections::VecDeque;
use xpreempt_types::{Nanos, Priority, QueueId};

/// Kernel objects are "addresses" in this range; anything else is not a loaded code object.
pub(crate) const KERNEL_BASE: u64 = 0x7f00_0000_0000;
const KERNEL_STRIDE: u64 = 0x100;
pub(crate) const WAVE_SIZE: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MqdState {
    /// Active but without an HQD: waits for a slot (oversubscription).
    Waiting,
    /// An HQD slot is allocated and the runlist (or a CWSR restore) is loading it.
    Mapping,
    Mapped,
    /// The HQD is being taken away (waves saved, drained or killed).
    Unmapping,
    /// Off the hardware by a preempt call; its ring and saved state wait for resume.
    Preempted,
    Destroyed,
}

impl MqdState {
    pub fn name(self) -> &'static str {
        match self {
            MqdState::Waiting => "waiting for an HQD",
            MqdState::Mapping => "being mapped",
            MqdState::Mapped => "mapped",
            MqdState::Unmapping => "being unmapped",
            MqdState::Preempted => "preempted",
            MqdState::Destroyed => "destroyed",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Dispatch {
    pub id: u64,
    /// Index into the kernel table; `None` for a barrier-AND packet.
    pub kernel: Option<u32>,
    pub total: u32,
    pub waves: u32,
    /// Next new workgroup of each XCC the queue spreads over: workgroup `w` belongs to lane
    /// `w % lanes.len()`, as the XCCs of one part split a grid between them.
    pub lanes: Vec<u32>,
    /// New workgroups not yet started.
    pub fresh: u32,
    /// Workgroups killed by RESET, to run again from the start.
    pub redo: Vec<u32>,
    pub done: u32,
    pub running: u32,
    pub signal: u64,
    pub deps: [u64; 5],
    pub complete: bool,
    pub(crate) done_bits: Vec<u64>,
    pub started: Option<Nanos>,
}

impl Dispatch {
    pub(crate) fn has_undispatched(&self) -> bool {
        self.fresh > 0 || !self.redo.is_empty()
    }
}

/// A workgroup whose waves CWSR saved mid-run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SavedWg {
    pub dispatch: u64,
    pub wg: u32,
    pub waves: u32,
    pub remaining: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pending {
    Preempt(crate::unmap::DestroyMode),
    Resume,
}

pub struct Hq {
    pub(crate) name: String,
    pub(crate) process: u32,
    pub(crate) priority: Priority,
    pub(crate) ring: crate::ring::Ring,
    pub(crate) cu_mask: Option<CuMask>,
    /// The XCCs this queue's work runs on: those of `xcc_mask` where its CU mask has CUs.
    pub(crate) xccs: Vec<u32>,
    /// Which lane of the current dispatch places next.
    pub(crate) lane_rr: u32,
    pub(crate) hqd: HqdStats,
    /// Since when the queue has had work without an HQD (see [`HqdStats::hqd_wait_ns`]).
    pub(crate) hqd_wait_since: Option<Nanos>,
    pub(crate) state: MqdState,
    pub(crate) slot: Option<HqdSlot>,
    /// The packet processor may fetch dispatch ids below this (the last doorbell it saw).
    pub(crate) visible: u64,
    pub(crate) fetch: u64,
    pub(crate) active: VecDeque<Dispatch>,
    pub(crate) saved: Vec<SavedWg>,
    pub(crate) running: u32,
    pub(crate) error: Option<ModelError>,
    /// Bumped at every map/unmap start, so stale completion and timeout events are ignored.
    pub(crate) generation: u32,
    pub(crate) pending: Option<Pending>,
    pub(crate) unmap: Option<crate::unmap::Unmap>,
    pub(crate) map_since: Nanos,
    pub(crate) map_cost: Nanos,
    pub(crate) mapped_since: Nanos,
    pub(crate) snapshot: Option<crate::unmap::Snapshot>,
    pub(crate) last_mode: Option<crate::unmap::DestroyMode>,
    pub(crate) restore_ns: Nanos,
    pub(crate) completed: u64,
    /// What the running map is, for the transition log: "map" or "resume".
    pub(crate) map_kind: &'static str,
    pub(crate) off_read_id: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    WgDone { slot: u32, generation: u32 },
    Doorbell { queue: u32, upto: u64 },
    UnmapDone { queue: u32, generation: u32 },
    UnmapTimeout { queue: u32, generation: u32 },
    MapDone { queue: u32, generation: u32 },
    Quantum,
}

/// Counters the reports and the exactly-once check read.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuStats {
    pub wgs_dispatched: u64,
    pub wgs_completed: u64,
    pub wgs_saved: u64,
    pub wgs_restored: u64,
    pub wgs_redone: u64,
    pub dispatches_completed: u64,
    /// A workgroup finished twice or a signal went below zero: must stay 0.
    pub exactly_once_violations: u64,
    /// The read id moved while its queue was off the hardware: must stay 0.
    pub ring_moved_while_preempted: u64,
    pub malformed_packets: u64,
    pub runlists: u64,
    pub unmaps: u64,
    pub maps: u64,
    /// Unmaps by the HWS quantum: oversubscription among queues of equal (or lower) priority.
    pub rotations: u64,
    /// Busy lower-priority queues unmapped at once so that a higher one gets an HQD.
    pub displacements: u64,
    /// Idle queues that gave their HQD back to a queue with work.
    pub idle_unmaps: u64,
    /// Runlists executed again because a queue's CU mask changed (each takes every mapped
    /// queue off and maps it again).
    pub runlist_reexecutions: u64,
    /// Time queues with work spent without an HQD, summed over queues (see [`HqdStats`]).
    pub hqd_wait_ns: u64,
    pub max_hqd_wait_ns: u64,
    pub hws_hung: bool,
}

/// One queue's HQD history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HqdStats {
    pub maps: u64,
    pub unmaps: u64,
    /// Unmapped by an HWS quantum rotation.
    pub rotations: u64,
    /// Unmapped, busy, for a higher-priority queue.
    pub displaced: u64,
    /// Unmapped while idle for a queue with work.
    pub idle_unmaps: u64,
    /// Times the queue had work and no HQD (waiting for a slot, its map, or a rotation's
    /// unmap); a preemption the scheduler asked for is not counted.
    pub hqd_waits: u64,
    pub hqd_wait_ns: u64,
    pub max_hqd_wait_ns: u64,
}

/// How long one preemption or resume took in hardware.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransitionRecord {
    pub queue: QueueId,
    pub kind: &'static str,
    pub requested_at: Nanos,
    pub done_at: Nanos,
}

pub struct Gpu {
    pub(crate) cfg: GpuConfig,
    pub(crate) now: Nanos,
    pub(crate) events: EventQueue<Ev>,
    pub(crate) queues: Vec<Hq>,
    pub(crate) cpsch: Cpsch,
    pub(crate) compute: Compute,
    pub(crate) kernels: Vec<KernelCode>,
    pub(crate) signals: Vec<i64>,
    pub(crate) rr: usize,
    touched: Vec<QueueId>,
    touched_flag: Vec<bool>,
    pub(crate) stats: GpuStats,
    pub(crate) waiting: VecDeque<u32>,
    pub(crate) quantum_armed: bool,
    pub(crate) transitions: Vec<TransitionRecord>,
    /// (time, MQDs, HQDs summed over XCCs), appended when either changes.
    pub(crate) occupancy: Vec<(Nanos, u32, u32)>,
    pub(crate) trace: Option<TraceBuf>,
}

impl Gpu {
    pub fn new(cfg: GpuConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        Ok(Self {
            cpsch: Cpsch::new(cfg.topology, cfg.pipe_policy)?,
            compute: Compute::new(
                cfg.cus,
                cfg.waves_per_cu,
                cfg.cu_groups,
                cfg.topology.xccs(),
            ),
            cfg,
            now: 0,
            events: EventQueue::default(),
            queues: Vec::new(),
            kernels: Vec::new(),
            signals: Vec::new(),
            rr: 0,
            touched: Vec::new(),
            touched_flag: Vec::new(),
            stats: GpuStats::default(),
            waiting: VecDeque::new(),
            quantum_armed: false,
            transitions: Vec::new(),
            occupancy: Vec::new(),
            trace: None,
        })
    }

    pub fn enable_trace(&mut self) {
        self.trace = Some(TraceBuf::new(self.cfg.cu_groups));
    }

    pub fn take_trace(&mut self) -> Option<TraceBuf> {
        self.trace.take()
    }

    pub fn config(&self) -> &GpuConfig {
        &self.cfg
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    pub fn stats(&self) -> &GpuStats {
        &self.stats
    }

    /// CU time with at least one wave resident (running, or stopped and being saved), up to
    /// now: busy CU time over `cus × elapsed` is the GPU's utilization.
    pub fn cu_busy_ns(&self) -> u128 {
        self.compute.busy_ns(self.now)
    }

    pub fn transitions(&self) -> &[TransitionRecord] {
        &self.transitions
    }

    pub fn occupancy_history(&self) -> &[(Nanos, u32, u32)] {
        &self.occupancy
    }

    /// Loads a code object; the returned address goes into dispatch packets.
    pub fn load_kernel(&mut self, code: KernelCode) -> u64 {
        self.kernels.push(code);
        KERNEL_BASE + (self.kernels.len() as u64 - 1) * KERNEL_STRIDE
    }

    pub fn kernel(&self, object: u64) -> Option<&KernelCode> {
        self.kernel_index(object).map(|i| &self.kernels[i as usize])
    }

    pub(crate) fn kernel_code(&self, index: u32) -> Option<&KernelCode> {
        self.kernels.get(index as usize)
    }

    pub(crate) fn kernel_index(&self, object: u64) -> Option<u32> {
        let off = object.checked_sub(KERNEL_BASE)?;
        let i = off / KERNEL_STRIDE;
        (off % KERNEL_STRIDE == 0 && (i as usize) < self.kernels.len()).then_some(i as u32)
    }

    /// An HSA signal with an initial value; handles are never 0 (0 means "no signal").
    pub fn create_signal(&mut self, value: i64) -> u64 {
        self.signals.push(value);
        self.signals.len() as u64
    }

    pub fn signal_count(&self) -> u64 {
        self.signals.len() as u64
    }

    pub fn signal_value(&self, handle: u64) -> Option<i64> {
        let i = handle.checked_sub(1)?;
        self.signals.get(i as usize).copied()
    }

    pub(crate) fn q(&self, queue: QueueId) -> Result<&Hq, ModelError> {
        self.queues
            .get(queue.0 as usize)
            .filter(|q| q.state != MqdState::Destroyed)
            .ok_or(ModelError::NoQueue(queue))
    }

    pub(crate) fn q_mut(&mut self, queue: QueueId) -> Result<&mut Hq, ModelError> {
        self.queues
            .get_mut(queue.0 as usize)
            .filter(|q| q.state != MqdState::Destroyed)
            .ok_or(ModelError::NoQueue(queue))
    }

    pub fn queue_ids(&self) -> impl Iterator<Item = QueueId> + '_ {
        (0..self.queues.len() as u32)
            .map(QueueId)
            .filter(|q| self.queues[q.0 as usize].state != MqdState::Destroyed)
    }

    pub fn state(&self, queue: QueueId) -> Result<MqdState, ModelError> {
        Ok(self.q(queue)?.state)
    }

    /// (read dispatch id, write dispatch id): what Scheme A's monitor reads over MMIO.
    pub fn ring_ids(&self, queue: QueueId) -> Result<(u64, u64), ModelError> {
        let q = self.q(queue)?;
        Ok((q.ring.read_id(), q.ring.write_id()))
    }

    pub fn queue_error(&self, queue: QueueId) -> Option<&ModelError> {
        self.queues.get(queue.0 as usize)?.error.as_ref()
    }

    /// The queue's map/unmap counts and the time it waited for an HQD with work to do.
    pub fn hqd_stats(&self, queue: QueueId) -> Result<&HqdStats, ModelError> {
        Ok(&self
            .queues
            .get(queue.0 as usize)
            .ok_or(ModelError::NoQueue(queue))?
            .hqd)
    }

    pub fn hqd_slot(&self, queue: QueueId) -> Result<Option<HqdSlot>, ModelError> {
        Ok(self.q(queue)?.slot)
    }

    /// Running workgroups of a queue (its waves are on CUs now).
    pub fn running_workgroups(&self, queue: QueueId) -> Result<u32, ModelError> {
        Ok(self.q(queue)?.running)
    }

    /// No map, unmap or restore of this queue is under way.
    pub fn settled(&self, queue: QueueId) -> bool {
        self.q(queue).is_ok_and(|q| {
            q.pending.is_none() && matches!(q.state, MqdState::Mapped | MqdState::Preempted)
        })
    }

    /// Queues whose completions or transitions changed since the last call, in first-touch order.
    pub fn take_touched(&mut self) -> Vec<QueueId> {
        for q in &self.touched {
            self.touched_flag[q.0 as usize] = false;
        }
        std::mem::take(&mut self.touched)
    }

    pub(crate) fn touch(&mut self, queue: u32) {
        let flag = &mut self.touched_flag[queue as usize];
        if !*flag {
            *flag = true;
            self.touched.push(QueueId(queue));
        }
    }

    pub(crate) fn add_queue(&mut self, hq: Hq) -> QueueId {
        if let Some(t) = self.trace.as_mut() {
            t.add_queue(&hq.name);
        }
        self.queues.push(hq);
        self.touched_flag.push(false);
        QueueId(self.queues.len() as u32 - 1)
    }

    pub(crate) fn new_hq(
        &self,
        name: &str,
        process: u32,
        priority: Priority,
        ring: crate::ring::Ring,
        cu_mask: Option<CuMask>,
    ) -> Hq {
        Hq {
            name: name.to_string(),
            process,
            priority,
            ring,
            xccs: self.compute.xccs_of(cu_mask.as_ref()),
            lane_rr: 0,
            hqd: HqdStats::default(),
            hqd_wait_since: None,
            cu_mask,
            state: MqdState::Waiting,
            slot: None,
            visible: 0,
            fetch: 0,
            active: VecDeque::new(),
            saved: Vec::new(),
            running: 0,
            error: None,
            generation: 0,
            pending: None,
            unmap: None,
            map_since: 0,
            map_cost: 0,
            mapped_since: 0,
            snapshot: None,
            last_mode: None,
            restore_ns: 0,
            completed: 0,
            map_kind: "map",
            off_read_id: None,
        }
    }

    // ---- producer side (user mode: HIP/ROCr writing its own ring) ----

    /// Writes the body, stores the header last and rings the doorbell: the AQL submit path.
    pub fn submit_packet(&mut self, queue: QueueId, packet: &Packet) -> Result<u64, ModelError> {
        let q = self.q_mut(queue)?;
        let id = q
            .ring
            .reserve_and_write_body(packet)
            .map_err(|e| ModelError::Ring(queue, e))?;
        q.ring
            .publish(id, packet.header().encode())
            .map_err(|e| ModelError::Ring(queue, e))?;
        self.ring_doorbell(queue, id)?;
        Ok(id)
    }

    /// Puts arbitrary bytes in the next slot and rings the doorbell (a buggy or hostile producer).
    pub fn submit_raw(&mut self, queue: QueueId, bytes: &[u8; 64]) -> Result<u64, ModelError> {
        let q = self.q_mut(queue)?;
        let id = q
            .ring
            .write_raw(bytes)
            .map_err(|e| ModelError::Ring(queue, e))?;
        self.ring_doorbell(queue, id)?;
        Ok(id)
    }

    pub fn ring_free(&self, queue: QueueId) -> Result<u64, ModelError> {
        Ok(self.q(queue)?.ring.free())
    }

    pub fn ring_doorbell(&mut self, queue: QueueId, value: u64) -> Result<(), ModelError> {
        self.q_mut(queue)?.ring.ring_doorbell(value);
        self.hqd_wait_begin(queue.0 as usize);
        if self.queues[queue.0 as usize].state == MqdState::Waiting {
            // Newly busy without an HQD: a runlist goes out now rather than at the next quantum.
            self.schedule_runlist();
        }
        self.arm_quantum();
        let at = self.after(us(self.cfg.doorbell_us));
        self.events.push(
            at,
            Ev::Doorbell {
                queue: queue.0,
                upto: value + 1,
            },
        );
        Ok(())
    }

    // ---- the event loop ----

    /// `delay` from now. Validation keeps the clock and every delay below 2^62 ns; saturating
    /// keeps a model driven directly with larger times from wrapping.
    pub(crate) fn after(&self, delay: Nanos) -> Nanos {
        self.now.saturating_add(delay)
    }

    pub fn next_event_time(&self) -> Option<Nanos> {
        self.events.peek_time()
    }

    /// Runs every event due by `until` and moves the clock there.
    pub fn advance_to(&mut self, until: Nanos) {
        while let Some((at, ev)) = self.events.pop_due(until) {
            self.now = at;
            self.handle(ev);
        }
        self.now = self.now.max(until);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::WgDone { slot, generation } => self.wg_done(slot, generation),
            Ev::Doorbell { queue, upto } => {
                let q = &mut self.queues[queue as usize];
                q.visible = q.visible.max(upto);
            }
            Ev::UnmapDone { queue, generation } => self.unmap_done(queue, generation),
            Ev::UnmapTimeout { queue, generation } => self.unmap_timeout(queue, generation),
            Ev::MapDone { queue, generation } => self.map_done(queue, generation),
            Ev::Quantum => self.quantum(),
        }
        self.pump();
    }
}
