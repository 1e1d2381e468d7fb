//! The packet processor: fetches published, doorbelled AQL packets in order (honouring the
//! barrier bit), places workgroups on CUs with free wave slots, one queue after another at equal
//! hardware priority, and retires packets by decrementing their completion signals.

use crate::aql::{AqlError, Packet};
use crate::compute::RunningWg;
use crate::device::{Dispatch, Ev, Gpu, MqdState, WAVE_SIZE};
use crate::error::ModelError;
use crate::rng;
use xpreempt_types::{Nanos, QueueId};

/// Where the next workgroup of a queue comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// Saved by CWSR, with this much run time left.
    Saved(Nanos),
    /// Killed by RESET: runs again from the start.
    Redo,
    /// The next new workgroup of a lane.
    Lane,
}

impl Gpu {
    /// Dispatches workgroups until nothing more fits, taking one workgroup from each queue in
    /// turn: every queue has the same hardware priority.
    pub(crate) fn pump(&mut self) {
        let n = self.queues.len();
        for q in 0..n {
            self.fetch(q);
        }
        while self.compute.free_total() > 0 {
            let mut progressed = false;
            for k in 0..n {
                let qi = (self.rr + k) % n;
                if self.dispatch_one(qi) {
                    self.rr = (qi + 1) % n;
                    progressed = true;
                    break;
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn dispatchable(&self, qi: usize) -> bool {
        let q = &self.queues[qi];
        q.state == MqdState::Mapped && q.error.is_none()
    }

    /// Moves published, doorbelled packets into the dispatch stage, in order.
    fn fetch(&mut self, qi: usize) {
        if !self.dispatchable(qi) {
            return;
        }
        loop {
            self.settle_barriers(qi);
            let q = &self.queues[qi];
            let id = q.fetch;
            if id >= q.visible || !q.ring.is_published(id) {
                return;
            }
            // One kernel's workgroups go out before the next kernel starts.
            if q.active.back().is_some_and(|d| d.has_undispatched()) {
                return;
            }
            let Some(bytes) = q.ring.bytes_at(id) else {
                return;
            };
            // Barrier bit: wait for every earlier packet to complete before decoding further.
            let barrier_bit = bytes[1] & 1 != 0;
            if barrier_bit && q.active.iter().any(|d| !d.complete) {
                return;
            }
            let decoded = Packet::decode(bytes);
            match decoded.and_then(|p| self.to_dispatch(qi, id, p)) {
                Ok(d) => {
                    let q = &mut self.queues[qi];
                    q.active.push_back(d);
                    q.fetch += 1;
                }
                Err(source) => {
                    let queue = QueueId(qi as u32);
                    let err = ModelError::Aql {
                        queue,
                        dispatch: id,
                        source,
                    };
                    tracing::warn!(%queue, error = %err, "queue enters the error state");
                    self.stats.malformed_packets += 1;
                    self.queues[qi].error = Some(err);
                    self.touch(qi as u32);
                    return;
                }
            }
        }
    }

    fn to_dispatch(&self, qi: usize, id: u64, p: Packet) -> Result<Dispatch, AqlError> {
        let check_signal = |h: u64| {
            if h != 0 && self.signal_value(h).is_none() {
                Err(AqlError::UnknownSignal(h))
            } else {
                Ok(())
            }
        };
        check_signal(p.completion_signal())?;
        let mut d = Dispatch {
            id,
            kernel: None,
            total: 0,
            waves: 0,
            lanes: Vec::new(),
            fresh: 0,
            redo: Vec::new(),
            done: 0,
            running: 0,
            signal: p.completion_signal(),
            deps: [0; 5],
            complete: false,
            done_bits: Vec::new(),
            started: None,
        };
        match p {
            Packet::Dispatch(k) => {
                let kernel = self
                    .kernel_index(k.kernel_object)
                    .ok_or(AqlError::UnknownKernelObject(k.kernel_object))?;
                let wgs = k.workgroups();
                if wgs > crate::aql::MAX_WORKGROUPS {
                    return Err(AqlError::TooManyWorkgroups(wgs));
                }
                let total = wgs as u32;
                let waves = k.threads_per_workgroup().div_ceil(WAVE_SIZE).max(1);
                if waves > self.compute.waves_per_cu() {
                    // A workgroup that can never be placed would hang the queue; reject it.
                    return Err(AqlError::Geometry {
                        dim: 0,
                        workgroup: k.workgroup_size[0],
                        grid: k.grid_size[0],
                    });
                }
                let lanes = self.queues[qi].xccs.len().max(1) as u32;
                d.kernel = Some(kernel);
                d.total = total;
                d.fresh = total;
                d.lanes = (0..lanes.min(total.max(1))).collect();
                d.waves = waves;
                d.done_bits = vec![0; total.div_ceil(64) as usize];
            }
            Packet::Barrier(b) => {
                for &s in &b.dep_signals {
                    check_signal(s)?;
                }
                d.deps = b.dep_signals;
            }
        }
        Ok(d)
    }

    /// A barrier-AND packet completes once everything before it has and its signals are zero.
    fn settle_barriers(&mut self, qi: usize) {
        loop {
            let q = &self.queues[qi];
            let Some(pos) = q.active.iter().position(|d| !d.complete) else {
                return;
            };
            let d = &q.active[pos];
            let ready = d.kernel.is_none()
                && d.deps
                    .iter()
                    .all(|&s| s == 0 || self.signal_value(s).is_some_and(|v| v <= 0));
            if !ready {
                return;
            }
            self.complete_dispatch(qi, pos);
        }
    }

    /// Starts one workgroup of queue `qi` if it has one and a CU has room.
    fn dispatch_one(&mut self, qi: usize) -> bool {
        if !self.dispatchable(qi) {
            return false;
        }
        let q = &self.queues[qi];
        let nx = q.xccs.len();
        if nx == 0 {
            return false;
        }
        // Saved waves go back first, then killed workgroups, then new ones. Saved and killed
        // workgroups may go to any XCC of the queue; a new one only to its own lane's XCC, so
        // one full XCC does not hold back the others.
        let (pos, wg, waves, pick) = if let Some(s) = q.saved.last() {
            let Some(pos) = q.active.iter().position(|d| d.id == s.dispatch) else {
                return false;
            };
            (pos, s.wg, s.waves, Pick::Saved(s.remaining))
        } else {
            let Some(pos) = q.active.iter().position(|d| d.has_undispatched()) else {
                return false;
            };
            let d = &q.active[pos];
            match d.redo.last() {
                Some(&wg) => (pos, wg, d.waves, Pick::Redo),
                None => (pos, 0, d.waves, Pick::Lane),
            }
        };
        let (rr, lanes) = (q.lane_rr as usize, q.active[pos].lanes.len());
        let mut found = None;
        if pick == Pick::Lane {
            let d = &q.active[pos];
            for k in 0..lanes {
                let j = (rr + k) % lanes;
                if d.lanes[j] < d.total
                    && let Some(cu) =
                        self.compute
                            .find_cu_in(q.xccs[j % nx], waves, q.cu_mask.as_ref())
                {
                    found = Some((cu, j, d.lanes[j]));
                    break;
                }
            }
        } else {
            for k in 0..nx {
                let j = (rr + k) % nx;
                if let Some(cu) = self
                    .compute
                    .find_cu_in(q.xccs[j], waves, q.cu_mask.as_ref())
                {
                    found = Some((cu, j, wg));
                    break;
                }
            }
        }
        let Some((cu, lane, wg)) = found else {
            return false;
        };
        let now = self.now;
        let seed = self.cfg.seed;
        let q = &mut self.queues[qi];
        q.lane_rr = (lane + 1) as u32;
        let mut remaining = None;
        let d = &mut q.active[pos];
        match pick {
            Pick::Saved(left) => {
                remaining = Some(left);
                q.saved.pop();
                self.stats.wgs_restored += 1;
            }
            Pick::Redo => {
                d.redo.pop();
            }
            Pick::Lane => {
                let step = d.lanes.len() as u32;
                d.lanes[lane] = d.lanes[lane].saturating_add(step);
                d.fresh -= 1;
            }
        }
        let d = &mut q.active[pos];
        let (mean, jitter) = d
            .kernel
            .and_then(|k| self.kernels.get(k as usize))
            .map_or((1, 0.0), |k| (k.wg_ns, k.jitter));
        let dur = remaining.unwrap_or_else(|| {
            let u = rng::unit(seed, qi as u64, d.id, u64::from(wg));
            let f = 1.0 + jitter * (2.0 * u - 1.0);
            ((mean as f64 * f).round() as Nanos).max(1)
        });
        d.running += 1;
        d.started.get_or_insert(now);
        q.running += 1;
        let dispatch = d.id;
        let slot = self.compute.start(RunningWg {
            queue: qi as u32,
            dispatch,
            wg,
            cu,
            waves,
            start: now,
            end: now.saturating_add(dur),
            generation: 0,
            live: true,
        });
        let generation = self.compute.get(slot).map_or(0, |w| w.generation);
        self.events
            .push(now.saturating_add(dur), Ev::WgDone { slot, generation });
        self.stats.wgs_dispatched += 1;
        if let Some(t) = self.trace.as_mut() {
            t.wg_start(self.compute.group_of(cu), qi as u32, now);
        }
        true
    }

    pub(crate) fn wg_done(&mut self, slot: u32, generation: u32) {
        if self
            .compute
            .get(slot)
            .is_none_or(|w| !w.live || w.generation != generation)
        {
            return;
        }
        let Some(wg) = self.compute.end(slot, true, self.now) else {
            return;
        };
        let now = self.now;
        if let Some(t) = self.trace.as_mut() {
            t.wg_end(self.compute.group_of(wg.cu), wg.queue, now);
        }
        let qi = wg.queue as usize;
        let q = &mut self.queues[qi];
        q.running -= 1;
        let Some(front) = q.active.front().map(|d| d.id) else {
            return;
        };
        let pos = (wg.dispatch - front) as usize;
        let Some(d) = q.active.get_mut(pos) else {
            return;
        };
        d.running -= 1;
        let (word, bit) = ((wg.wg / 64) as usize, wg.wg % 64);
        if d.done_bits[word] & (1 << bit) != 0 {
            self.stats.exactly_once_violations += 1;
        } else {
            d.done_bits[word] |= 1 << bit;
            d.done += 1;
        }
        self.stats.wgs_completed += 1;
        if d.done == d.total && d.running == 0 {
            self.complete_dispatch(qi, pos);
        }
        self.drain_progress(qi);
        // A mapped queue that just ran out of work hands its HQD to a busy waiter now, not at
        // the next quantum: with many queues allowed at once (equals run together) every slot
        // can be busy when a waiter rings, and the slots free up only afterwards.
        if self.queues[qi].state == MqdState::Mapped && !self.has_work(qi) {
            self.hand_over_idle();
        }
    }

    /// Decrements the completion signal and retires completed packets at the read id.
    pub(crate) fn complete_dispatch(&mut self, qi: usize, pos: usize) {
        let now = self.now;
        let q = &mut self.queues[qi];
        let d = &mut q.active[pos];
        if d.complete {
            self.stats.exactly_once_violations += 1;
            return;
        }
        d.complete = true;
        let (signal, kernel, started, id) = (d.signal, d.kernel, d.started, d.id);
        self.stats.dispatches_completed += 1;
        while q.active.front().is_some_and(|d| d.complete) {
            q.active.pop_front();
            q.ring.retire();
            q.completed += 1;
        }
        if signal != 0
            && let Some(v) = self.signals.get_mut(signal as usize - 1)
        {
            *v -= 1;
            if *v < 0 {
                self.stats.exactly_once_violations += 1;
            }
        }
        if let (Some(t), Some(k)) = (self.trace.as_mut(), kernel) {
            let name = &self.kernels[k as usize].name;
            t.kernel(qi as u32, name, started.unwrap_or(now), now, id);
        }
        self.touch(qi as u32);
    }
}
