//! What an intercepted stream's queue is made of, below the ways it stops: a command is a
//! deferred driver call on the application's own stream, completion is tracked with events
//! recorded at sync points, and the state Lv2 (`lv2.rs`) and pass-through (`observe.rs`) keep
//! lives here with the rest, under one lock. `hal.rs` builds the HAL on all three.

use super::driver::{self, CUresult, CtxGuard, Handle, SUCCESS};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use xpreempt_cuda::flight::{Flight, Relaunch};
use xpreempt_cuda::stop_gate::StopGate;
use xpreempt_hal::HalError;
use xpreempt_types::Seq;

/// How often the completion watcher looks at a sync event it waits for.
pub(super) fn poll_nap() -> std::time::Duration {
    std::time::Duration::from_micros(super::settings::POLL_US)
}

/// The three guard parameters of a guard-built kernel (`XP_GUARD_PARAMS`): the flag's device
/// address, the completion slot's, and the epoch.
pub type GuardValues = [u64; 3];

type Call = Box<dyn FnMut(Option<&GuardValues>) -> CUresult + Send>;

/// A driver call held until the queue may run; it returns the driver's status. A guarded
/// kernel's launch stays callable (with its guard values) for relaunches after a stop.
pub struct Deferred {
    pub(super) call: Option<Call>,
    /// Built with the guard header and recognized as such, at Lv2: its launches get guard values.
    pub(super) guarded: bool,
    /// Its blocks (one completion word each).
    pub(super) units: u32,
    /// Completion slot and epoch, assigned at its first launch when it can be stopped.
    pub(super) slot: Option<(u32, u32)>,
}

impl Deferred {
    pub fn new(call: impl FnOnce() -> CUresult + Send + 'static) -> Self {
        let mut once = Some(call);
        Self {
            call: Some(Box::new(move |_| once.take().map_or(SUCCESS, |c| c()))),
            guarded: false,
            units: 0,
            slot: None,
        }
    }

    /// A guarded kernel's launch of `units` blocks; `call` writes the guard values into its
    /// argument copy, then launches.
    pub fn guarded(
        units: u32,
        call: impl FnMut(Option<&GuardValues>) -> CUresult + Send + 'static,
    ) -> Self {
        Self {
            call: Some(Box::new(call)),
            guarded: true,
            units,
            slot: None,
        }
    }

    /// Makes the driver call (again, for a relaunch); a call already made and dropped is a
    /// success.
    pub(super) fn call(&mut self, guard: Option<&GuardValues>) -> CUresult {
        self.call.as_mut().map_or(SUCCESS, |c| {
            let _inside = super::fork_gate::enter();
            c(guard)
        })
    }
}

/// A driver status as an error with a source.
#[derive(Debug, thiserror::Error)]
#[error("CUDA error {0}")]
pub struct CuError(pub CUresult);

thread_local! {
    /// Set while the application's own thread submits: a launch that fails then is refused so
    /// the application gets the driver's status from its call, as natively.
    static SUBMITTING: Cell<bool> = const { Cell::new(false) };
    /// Whether the submission in progress reached the driver (rather than the buffer).
    static LAUNCHED: Cell<bool> = const { Cell::new(false) };
}

/// Whether the application's own thread is submitting (see `SUBMITTING`).
pub(super) fn is_submitting() -> bool {
    SUBMITTING.with(Cell::get)
}

/// The submission in progress reached the driver.
pub(super) fn note_launched() {
    LAUNCHED.with(|l| l.set(true));
}

/// Runs `f` as the application's submission (see `SUBMITTING`); also says whether the command
/// went to the driver during it.
pub fn submitting<T>(f: impl FnOnce() -> T) -> (T, bool) {
    SUBMITTING.with(|s| s.set(true));
    LAUNCHED.with(|l| l.set(false));
    let r = f();
    SUBMITTING.with(|s| s.set(false));
    (r, LAUNCHED.with(Cell::get))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Running,
    /// Flag set; completion frozen. Stays so until a reactivate has relaunched every stopped
    /// kernel.
    Flagged,
    /// Not safe (or nothing) to flag: the window drains as at Lv1.
    Draining,
}

/// The device side of a queue's Lv2, made at its first guarded launch.
pub(super) struct Resources {
    pub(super) control: Handle,
    pub(super) flag: u64,
    pub(super) done: u64,
    pub(super) clear_event: Handle,
}

pub struct Lv2State {
    pub(super) flight: Flight,
    pub(super) stop: Stop,
    pub(super) relaunch: Relaunch,
    pub(super) stop_event: Option<Handle>,
    /// `stop_event` was recorded for the current stop (it may come after the flag's set).
    pub(super) stop_recorded: bool,
    pub(super) res: Option<Resources>,
    /// Making the resources failed: guarded kernels run as plain ones on this queue.
    pub(super) failed: bool,
    pub(super) slots: u32,
    pub(super) next_slot: u32,
    pub(super) epoch: u32,
    /// Bumped by every flagged stop: an event a poller picked before it proves nothing now.
    pub(super) generation: u64,
}

#[derive(Default)]
pub struct Observer {
    pub(super) real_launches: AtomicU64,
    pub(super) armed: AtomicBool,
    pub(super) held: AtomicBool,
}

pub(super) struct State {
    pub(super) sync: VecDeque<(Seq, Handle)>,
    pub(super) free: Vec<Handle>,
    pub(super) completed: Seq,
    pub(super) launched: Seq,
    /// The first error of a launch made after the application's call returned (from the
    /// pending buffer); reported by the next synchronize or query of the stream.
    pub(super) sticky: CUresult,
    /// The stream or its context is gone: the queue's events are released and everything
    /// launched counts as completed, so no thread calls the driver for this queue again.
    pub(super) retired: bool,
    pub(super) lv2: Lv2State,
}

// SAFETY: the handles are driver objects usable from any thread (with the context made current).
unsafe impl Send for State {}

pub struct StreamHal {
    pub(super) ctx: Handle,
    pub(super) stream: Handle,
    pub(super) state: Mutex<State>,
    /// Lv3 (the process's timeslice) is available to this queue.
    pub(super) lv3: bool,
    /// Interrupted at Lv3 and not restored yet.
    pub(super) interrupted: AtomicBool,
    /// Lv2 (guard-built kernels stopped by the flag) is this queue's level.
    pub(super) lv2: bool,
    /// The flag is set or a guarded kernel is in flight (`lv2.rs`).
    pub(super) lv2_busy: AtomicBool,
    /// Open while a stop ahead may set the flag without the lock (`lv2.rs`).
    pub(super) gate: StopGate,
    /// The flag's address and the control stream, once made: what a stop ahead writes with.
    pub(super) ahead_target: OnceLock<(u64, usize)>,
    /// Set by `retire`: threads polling an event outside the lock stop, so that its events can
    /// be destroyed under nobody's feet.
    pub(super) gone: AtomicBool,
    /// Where the application's thread last launched on this stream (`xpreempt_cuda::placement`).
    pub(super) launcher_cpu: AtomicI32,
    /// Threads polling one of the queue's events outside the lock.
    pub(super) pollers: AtomicU32,
    /// For the exit report (`exit_report`).
    pub(super) launch_times: super::exit_report::LaunchTimes,
    /// Pass-through: the application's launches go straight to the driver and the queue's
    /// commands are markers that only report activity (see `observe`).
    pub(super) observer: Option<Observer>,
    /// A per-thread default stream: its handle means the stream of whichever thread uses it, so
    /// only its own thread calls the driver on it. A command is a marker that lets that thread
    /// make its call, which then records the sync event behind it (`owner_recorded`); this
    /// queue's other threads record nothing on the stream and wait for those events.
    pub(super) owner_only: bool,
    /// The owner's event re-recorded after each of its calls in pass-through mode, which the
    /// observer waits for instead of recording one itself.
    pub(super) owner_mark: Mutex<Option<usize>>,
}

// SAFETY: the context and stream handles are plain driver handles, valid from any thread.
unsafe impl Send for StreamHal {}
// SAFETY: as above; the mutable state is behind the mutex.
unsafe impl Sync for StreamHal {}

impl StreamHal {
    /// The application's launch holds the state during its driver call; the watcher never
    /// sleeps on it, so that the launch never has a sleeper to wake.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        xpreempt_core::xqueue::threaded::lock_quietly(&self.state)
    }

    /// A thread starts polling one of the queue's events outside the lock (call with it held).
    pub(super) fn begin_poll(&self) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn end_poll(&self) {
        self.pollers.fetch_sub(1, Ordering::SeqCst);
    }

    /// `retire` has begun: pollers stop.
    pub(super) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Whether the queue is interrupted through the process's timeslice (Lv3).
    pub fn lv3(&self) -> bool {
        self.lv3
    }

    /// Whether the queue stops guard-built kernels (Lv2).
    pub fn lv2(&self) -> bool {
        self.lv2
    }

    /// On a per-thread stream's own thread, after its call that marker `seq` let go: the sync
    /// event behind the call, which completes the marker.
    pub fn owner_recorded(&self, seq: Seq) {
        let _ctx = CtxGuard::enter(self.ctx);
        let mut g = self.lock();
        if let Err(e) = self.record(&mut g, seq + 1) {
            shim_log!("per-thread stream: no sync event after a call ({e}); its queue waits");
        }
    }

    /// On a per-thread stream's own thread in pass-through mode, after a call: the observer's
    /// event is recorded behind it.
    pub fn owner_marked(&self) {
        let mut mark = self.owner_mark.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_gone() {
            return;
        }
        let ev = match *mark {
            Some(ev) => ev as Handle,
            None => match driver::new_event() {
                Ok(ev) => {
                    *mark = Some(ev as usize);
                    ev
                }
                Err(e) => {
                    shim_log!("per-thread stream: no event to observe it (CUDA error {e})");
                    return;
                }
            },
        };
        let _ctx = CtxGuard::enter(self.ctx);
        driver::cuEventRecord(ev, self.stream);
    }

    /// Whether the stream is a per-thread default stream (see `owner_only`).
    pub fn owner_only(&self) -> bool {
        self.owner_only
    }

    /// Takes the error of a launch from the pending buffer, if one failed.
    pub fn take_sticky(&self) -> CUresult {
        std::mem::replace(&mut self.lock().sticky, SUCCESS)
    }

    pub(super) fn record(&self, g: &mut State, watermark: Seq) -> Result<Handle, HalError> {
        if g.retired {
            g.completed = g.completed.max(watermark);
            return Err(HalError::WouldBlock("the stream is gone"));
        }
        let ev = match g.free.pop() {
            Some(ev) => ev,
            None => driver::new_event().map_err(|e| backend("cuEventCreate", e))?,
        };
        match driver::cuEventRecord(ev, self.stream) {
            SUCCESS => {
                g.sync.push_back((watermark, ev));
                Ok(ev)
            }
            e => {
                g.free.push(ev);
                Err(backend("cuEventRecord", e))
            }
        }
    }
}

pub(super) fn backend(op: &'static str, e: CUresult) -> HalError {
    HalError::Backend {
        op,
        source: std::sync::Arc::new(CuError(e)),
    }
}
