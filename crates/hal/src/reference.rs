//! A reference backend on a virtual clock, for testing everything above the HAL without a GPU.
//!
//! The device has one engine that runs one block at a time, taking launched work in launch order
//! across queues (as a GPU's hardware queue does when nothing preempts), so a busy queue delays
//! every queue behind it. A kernel is a row of blocks of fixed length. Lv2 stops a queue at the next block
//! boundary (a non-deactivatable command runs to its end first); Lv3 stops it at once and keeps
//! the position inside the block. Every executed block is recorded, so tests can check that each
//! ran exactly once.

use crate::{HalError, HwQueue};
use thiserror::Error;
use xpreempt_types::{Command, HostFn, Launched, Level, Nanos, Op, QueueId, Seq};

/// What the reference device refuses or finds inconsistent.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RefError {
    #[error("a kernel needs at least one block")]
    EmptyKernel,
    #[error("in-flight log does not match the commands the device holds")]
    LogMismatch,
}
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// What a kernel does on the reference device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefKernel {
    pub blocks: u32,
    pub block_ns: Nanos,
}

/// How long a command other than a kernel takes.
pub const OTHER_OP_NS: Nanos = 1_000;

#[derive(Default)]
struct Work {
    /// Launch order across all queues.
    ticket: u64,
    seq: Seq,
    blocks: u32,
    block_ns: Nanos,
    deactivatable: bool,
    callback: Option<HostFn>,
}

#[derive(Default)]
struct QueueSim {
    launched: VecDeque<Work>,
    /// Index of the next block of the front command.
    block: u32,
    /// Time left in the current block when an interrupt saved it.
    saved_remaining: Option<Nanos>,
    stop_requested: bool,
    stopped: Option<Level>,
    completed: Seq,
    /// What `interrupt_cost_ns` reports (the interrupt itself still acts at once).
    interrupt_cost: Option<Nanos>,
}

#[derive(Default)]
struct DeviceState {
    now: Nanos,
    queues: Vec<QueueSim>,
    /// The queue whose block the engine runs, and when that block ends.
    running: Option<(usize, Nanos)>,
    next_ticket: u64,
    /// Times each (queue, seq) block ran.
    executed: BTreeMap<(u32, Seq), Vec<u32>>,
    launch_order: Vec<(u32, Seq)>,
}

/// The device: owns the clock and every queue's execution.
#[derive(Clone, Default)]
pub struct RefDevice {
    state: Arc<Mutex<DeviceState>>,
}

/// One hardware queue of a [`RefDevice`].
pub struct RefQueue {
    device: RefDevice,
    index: usize,
    level: Level,
}

impl RefDevice {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        // A panic in a test thread must not hide the state from the others.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn create_queue(&self, level: Level) -> RefQueue {
        let mut st = self.lock();
        st.queues.push(QueueSim::default());
        RefQueue {
            device: self.clone(),
            index: st.queues.len() - 1,
            level,
        }
    }

    pub fn now(&self) -> Nanos {
        self.lock().now
    }

    /// When the running block ends, if anything runs.
    pub fn next_event(&self) -> Option<Nanos> {
        self.lock().running.map(|(_, end)| end)
    }

    /// Runs the device until `t` (the clock never goes back).
    pub fn advance_to(&self, t: Nanos) {
        let mut st = self.lock();
        while let Some((i, end)) = st.running
            && end <= t
        {
            st.now = end;
            st.running = None;
            finish_block(&mut st, i);
            dispatch(&mut st);
        }
        st.now = st.now.max(t);
    }

    /// How often each block of command `seq` of queue `queue` ran.
    pub fn block_runs(&self, queue: &RefQueue, seq: Seq) -> Vec<u32> {
        self.lock()
            .executed
            .get(&(queue.index as u32, seq))
            .cloned()
            .unwrap_or_default()
    }

    /// Every (queue index, seq) in the order the device was handed them.
    pub fn launch_order(&self) -> Vec<(u32, Seq)> {
        self.lock().launch_order.clone()
    }
}

/// Starts the oldest launched block of any queue that may run, if the engine is free.
fn dispatch(st: &mut DeviceState) {
    if st.running.is_some() {
        return;
    }
    let next = st
        .queues
        .iter()
        .enumerate()
        .filter(|(_, q)| q.stopped.is_none())
        .filter_map(|(i, q)| q.launched.front().map(|w| (w.ticket, i)))
        .min();
    if let Some((_, i)) = next {
        let q = &mut st.queues[i];
        let block_ns = q.launched.front().map_or(0, |w| w.block_ns);
        let len = q.saved_remaining.take().unwrap_or(block_ns);
        st.running = Some((i, st.now + len.max(1)));
    }
}

fn finish_block(st: &mut DeviceState, i: usize) {
    let q = &mut st.queues[i];
    let Some(w) = q.launched.front_mut() else {
        return;
    };
    let (seq, block) = (w.seq, q.block);
    let runs = st.executed.entry((i as u32, seq)).or_default();
    if runs.len() < w.blocks as usize {
        runs.resize(w.blocks as usize, 0);
    }
    runs[block as usize] += 1;
    let last_block = block + 1 >= w.blocks;
    let deactivatable = w.deactivatable;
    if last_block {
        let mut done = q.launched.pop_front().unwrap_or_default();
        q.block = 0;
        q.completed = seq + 1;
        if let Some(cb) = done.callback.take() {
            cb();
        }
    } else {
        q.block += 1;
    }
    // Lv2 stops at a block boundary of a deactivatable kernel, or once a command is whole.
    if q.stop_requested && (last_block || deactivatable) {
        q.stop_requested = false;
        q.stopped = Some(Level::Lv2);
    }
}

impl RefQueue {
    pub fn index(&self) -> u32 {
        self.index as u32
    }

    pub fn queue_id(&self) -> QueueId {
        QueueId(self.index as u32)
    }

    pub fn device(&self) -> &RefDevice {
        &self.device
    }

    /// Makes the queue report this measured interrupt cost, as a backend that times its
    /// interrupts would.
    pub fn set_interrupt_cost(&self, ns: Option<Nanos>) {
        self.device.lock().queues[self.index].interrupt_cost = ns;
    }

    /// Lv2: stops at the next block boundary of a deactivatable kernel (at once if nothing of
    /// this queue runs).
    fn stop_at_boundary(&self, st: &mut DeviceState) {
        let running_here = st.running.is_some_and(|(i, _)| i == self.index);
        let q = &mut st.queues[self.index];
        if running_here {
            q.stop_requested = true;
        } else {
            q.stopped = Some(Level::Lv2);
        }
    }

    fn check_log(q: &QueueSim, log: &[Launched<RefKernel>]) -> Result<(), HalError> {
        let device_seqs = q.launched.iter().map(|w| w.seq);
        if !device_seqs.eq(log.iter().map(|e| e.seq)) {
            return Err(HalError::backend(
                "check the in-flight log",
                RefError::LogMismatch,
            ));
        }
        Ok(())
    }
}

impl HwQueue for RefQueue {
    type Payload = RefKernel;

    fn max_level(&self) -> Level {
        self.level
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<RefKernel>,
        _sync_point: bool,
    ) -> Result<(), HalError> {
        let mut work = Work {
            ticket: 0,
            seq,
            blocks: 1,
            block_ns: OTHER_OP_NS,
            deactivatable: command.props.deactivatable,
            callback: None,
        };
        match &mut command.op {
            Op::Kernel(k) => {
                if k.blocks == 0 {
                    return Err(HalError::refused("launch", RefError::EmptyKernel));
                }
                work.blocks = k.blocks;
                work.block_ns = k.block_ns;
            }
            Op::HostCallback(f) => {
                work.callback = Some(std::mem::replace(f, Box::new(|| {})));
            }
            _ => {}
        }
        let mut st = self.device.lock();
        work.ticket = st.next_ticket;
        st.next_ticket += 1;
        st.launch_order.push((self.index as u32, seq));
        st.queues[self.index].launched.push_back(work);
        dispatch(&mut st);
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }

    fn completed(&self) -> Seq {
        self.device.lock().queues[self.index].completed
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        if self.completed() >= upto {
            Ok(())
        } else {
            Err(HalError::WouldBlock("synchronize"))
        }
    }

    fn settled(&self) -> bool {
        let st = self.device.lock();
        let q = &st.queues[self.index];
        !q.stop_requested
    }

    /// The device holds no lock a launch keeps, so a stop ahead is a deactivate made early.
    fn stop_ahead(&self) -> bool {
        if self.level < Level::Lv2 {
            return false;
        }
        let mut st = self.device.lock();
        let q = &st.queues[self.index];
        if q.launched.is_empty() || q.stopped.is_some() || q.stop_requested {
            return false;
        }
        self.stop_at_boundary(&mut st);
        true
    }

    fn deactivate(&self) -> Result<(), HalError> {
        if self.level < Level::Lv2 {
            return Err(self.unsupported("deactivate", Level::Lv2));
        }
        self.stop_at_boundary(&mut self.device.lock());
        Ok(())
    }

    fn reactivate(&self, log: &mut [Launched<RefKernel>]) -> Result<(), HalError> {
        if self.level < Level::Lv2 {
            return Err(self.unsupported("reactivate", Level::Lv2));
        }
        let mut st = self.device.lock();
        let q = &mut st.queues[self.index];
        Self::check_log(q, log)?;
        q.stop_requested = false;
        q.stopped = None;
        dispatch(&mut st);
        Ok(())
    }

    fn interrupt_cost_ns(&self) -> Option<Nanos> {
        self.device.lock().queues[self.index].interrupt_cost
    }

    fn interrupt(&self) -> Result<(), HalError> {
        if self.level < Level::Lv3 {
            return Err(self.unsupported("interrupt", Level::Lv3));
        }
        let mut st = self.device.lock();
        let now = st.now;
        if let Some((i, end)) = st.running
            && i == self.index
        {
            st.running = None;
            st.queues[i].saved_remaining = Some(end - now);
        }
        let q = &mut st.queues[self.index];
        q.stop_requested = false;
        q.stopped = Some(Level::Lv3);
        dispatch(&mut st);
        Ok(())
    }

    fn restore(&self, log: &mut [Launched<RefKernel>]) -> Result<(), HalError> {
        if self.level < Level::Lv3 {
            return Err(self.unsupported("restore", Level::Lv3));
        }
        let mut st = self.device.lock();
        let q = &mut st.queues[self.index];
        Self::check_log(q, log)?;
        q.stopped = None;
        dispatch(&mut st);
        Ok(())
    }
}

/// Moves a device's virtual clock along with the wall clock (every 50 µs) until dropped: for
/// tests of threaded queues, schedulers and daemons that run in real time.
pub struct WallClock {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WallClock {
    pub fn start(device: &RefDevice) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let (dev, flag) = (device.clone(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !flag.load(Ordering::Relaxed) {
                dev.advance_to(start.elapsed().as_nanos() as Nanos);
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for WallClock {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_types::CommandProps;

    fn kernel(blocks: u32, block_ns: Nanos) -> Command<RefKernel> {
        Command::kernel(RefKernel { blocks, block_ns })
    }

    #[test]
    fn kernels_run_in_order_block_by_block() {
        let dev = RefDevice::new();
        let q = dev.create_queue(Level::Lv1);
        q.launch(0, &mut kernel(2, 10), false).unwrap();
        q.launch(1, &mut kernel(1, 5), true).unwrap();
        dev.advance_to(15);
        assert_eq!(q.completed(), 0);
        dev.advance_to(20);
        assert_eq!(q.completed(), 1);
        dev.advance_to(25);
        assert_eq!(q.completed(), 2);
        assert_eq!(dev.block_runs(&q, 0), vec![1, 1]);
        assert!(matches!(
            q.synchronize(3),
            Err(HalError::WouldBlock("synchronize"))
        ));
    }

    #[test]
    fn one_engine_serves_queues_in_launch_order() {
        let dev = RefDevice::new();
        let a = dev.create_queue(Level::Lv2);
        let b = dev.create_queue(Level::Lv2);
        let mut ka = kernel(3, 100);
        a.launch(0, &mut ka, true).unwrap();
        b.launch(0, &mut kernel(1, 10), true).unwrap();
        dev.advance_to(299);
        assert_eq!((a.completed(), b.completed()), (0, 0), "b waits behind a");
        dev.advance_to(310);
        assert_eq!((a.completed(), b.completed()), (1, 1));
        // Deactivating the busy queue lets the other one in at the next block boundary.
        let stoppable = CommandProps::new(false, true, false);
        a.launch(1, &mut kernel(3, 100).with_props(stoppable), true)
            .unwrap();
        b.launch(1, &mut kernel(1, 10), true).unwrap();
        dev.advance_to(350);
        a.deactivate().unwrap();
        assert!(!a.settled());
        dev.advance_to(420);
        assert!(a.settled());
        assert_eq!((a.completed(), b.completed()), (1, 2));
    }

    #[test]
    fn interrupt_keeps_the_position_inside_a_block() {
        let dev = RefDevice::new();
        let q = dev.create_queue(Level::Lv3);
        let mut cmd = kernel(1, 100);
        q.launch(0, &mut cmd, true).unwrap();
        dev.advance_to(40);
        q.interrupt().unwrap();
        dev.advance_to(1_000);
        assert_eq!(q.completed(), 0);
        let mut log = vec![Launched {
            seq: 0,
            command: cmd,
        }];
        q.restore(&mut log).unwrap();
        dev.advance_to(1_059);
        assert_eq!(q.completed(), 0);
        dev.advance_to(1_060);
        assert_eq!(q.completed(), 1);
        assert_eq!(dev.block_runs(&q, 0), vec![1]);
    }

    #[test]
    fn levels_above_the_queue_are_refused() {
        let dev = RefDevice::new();
        let q = dev.create_queue(Level::Lv1);
        assert!(matches!(q.deactivate(), Err(HalError::Unsupported { .. })));
        assert!(matches!(q.interrupt(), Err(HalError::Unsupported { .. })));
    }
}
