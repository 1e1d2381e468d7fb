//! `CudaQueue`: the HAL over one CUDA stream, the one every front end drives (the shim under
//! `xpreempt run`, the benchmarks, the conformance suite). A command is a deferred driver call
//! ([`Deferred`]) made on the queue's stream; completion is tracked with events recorded at sync
//! points; the state Lv2 (`lv2.rs`) and pass-through (`observe.rs`) keep lives here with the
//! rest, under one lock. `hal.rs` builds the HAL on all three; Lv3 is the process's timeslice
//! (`crate::lv3`), which adds to Lv2.
//!
//! The driver calls go through the table the queue was given ([`crate::entry::Driver`]): the
//! shim's own libcuda table, or cudarc's.

pub mod capture;
mod hal;
mod launch_times;
mod lv2;
mod observe;
mod owned;
mod sync_events;

pub use launch_times::LaunchTimes;
pub use lv2::{guarded_launches, relaunches, stops_ahead};
pub use observe::Observer;

use crate::entry::{self, CUresult, Driver, Handle, SUCCESS};
use crate::flight::{Flight, Relaunch};
use crate::kernel::{Kernel, launch_on};
use crate::lv3::ProcessLv3;
use crate::stop_gate::StopGate;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use xpreempt_hal::HalError;
use xpreempt_types::{Level, Seq};

/// Logs through the queue's driver table (the front end's log).
macro_rules! note {
    ($q:expr, $($t:tt)*) => { $q.drv.note(format_args!($($t)*)) };
}
pub(crate) use note;

/// The three guard parameters of a guard-built kernel (`XP_GUARD_PARAMS`): the flag's device
/// address, the completion slot's, and the epoch.
pub type GuardValues = [u64; 3];

/// The guard values of a launch that must not be stopped: the header's placeholders.
pub const PLACEHOLDERS: GuardValues = [0, 0, 0];

type Call = Box<dyn FnMut(Handle, Option<&GuardValues>) -> CUresult + Send>;

/// A driver call held until the queue may run; it returns the driver's status. A guarded
/// kernel's launch stays callable (with its guard values) for relaunches after a stop.
pub struct Deferred {
    pub(crate) call: Option<Call>,
    /// Built with the guard header and recognized as such, at Lv2: its launches get guard values.
    pub(crate) guarded: bool,
    /// Its blocks (one completion word each).
    pub(crate) units: u32,
    /// Completion slot and epoch, assigned at its first launch when it can be stopped.
    pub(crate) slot: Option<(u32, u32)>,
}

impl Deferred {
    /// A call that names its stream itself (the application's call, on the queue's stream).
    pub fn new(call: impl FnOnce() -> CUresult + Send + 'static) -> Self {
        Self::on_stream(|_| call())
    }

    /// A call made on the queue's stream, which it is given.
    pub fn on_stream(call: impl FnOnce(Handle) -> CUresult + Send + 'static) -> Self {
        let mut once = Some(call);
        Self {
            call: Some(Box::new(move |stream, _| {
                once.take().map_or(SUCCESS, |c| c(stream))
            })),
            guarded: false,
            units: 0,
            slot: None,
        }
    }

    /// A guarded kernel's launch of `units` blocks; `call` writes the guard values into its
    /// argument copy, then launches (on the queue's stream, which it is given).
    pub fn guarded(
        units: u32,
        call: impl FnMut(Handle, Option<&GuardValues>) -> CUresult + Send + 'static,
    ) -> Self {
        Self {
            call: Some(Box::new(call)),
            guarded: true,
            units,
            slot: None,
        }
    }

    /// A launch of `k` on the queue's stream; a guard-built kernel (`Kernel::guard`) gets the
    /// guard values, or the placeholders where the queue cannot stop it.
    pub fn kernel(k: Kernel) -> Self {
        let units = k.guard.map(|u| u.0);
        let call = move |stream: Handle, guard: Option<&GuardValues>| {
            let mut values = guard.copied().unwrap_or(PLACEHOLDERS);
            let leading = if k.guard.is_some() {
                &mut values[..]
            } else {
                &mut [][..]
            };
            // SAFETY: `stream` is the queue's live stream (its context current); `Kernel`'s
            // contract covers its parameters, the guard's three included when it is guarded.
            match unsafe { launch_on(stream.cast(), &k, leading) } {
                Ok(()) => SUCCESS,
                Err(crate::CudaError::Driver { code, .. }) => code as CUresult,
                Err(_) => entry::ERROR_INVALID_VALUE,
            }
        };
        Self {
            call: Some(Box::new(call)),
            guarded: units.is_some(),
            units: units.unwrap_or(0),
            slot: None,
        }
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("called", &self.call.is_none())
            .field("guarded", &self.guarded)
            .field("units", &self.units)
            .field("slot", &self.slot)
            .finish()
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
pub(crate) fn is_submitting() -> bool {
    SUBMITTING.with(Cell::get)
}

/// The submission in progress reached the driver.
pub(crate) fn note_launched() {
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

/// Settings of one CUDA queue.
#[derive(Clone, Debug)]
pub struct CudaQueueConfig {
    /// Highest level asked for: Lv2 stops guard-built kernels; Lv3 adds the process's timeslice
    /// where `lv3` is given (without it the queue stays at Lv2).
    pub level: Level,
    /// The process's Lv3 control, where Lv3 is available.
    pub lv3: Option<ProcessLv3>,
    /// Pass-through: the application's launches go straight to the driver, and the queue's
    /// commands are markers that only report activity (see `observe.rs`). Nothing to stop but
    /// the process (Lv3).
    pub observe: bool,
    /// A per-thread default stream: its handle means the stream of whichever thread uses it, so
    /// only its own thread calls the driver on it. No Lv2 (a stopped kernel could be relaunched
    /// only by its own thread).
    pub owner_only: bool,
    /// Completion-array slots: one per command in flight, and one more.
    pub slots: u32,
    /// Most completion words (blocks or items) one stoppable launch may use; a larger one runs
    /// unstoppable.
    pub max_units: u32,
    /// A launch that fails outside the application's call (from the pending buffer) counts as
    /// done, and its status waits for the stream's next synchronize ([`CudaQueue::take_sticky`]),
    /// as CUDA reports an asynchronous error. Off: every failed launch is an error of `launch`.
    pub sticky_errors: bool,
    /// How long a wait naps between looks at an event.
    pub poll: Duration,
    /// Time launches ([`CudaQueue::launch_times`]).
    pub time_launches: bool,
}

impl Default for CudaQueueConfig {
    fn default() -> Self {
        Self {
            level: Level::Lv2,
            lv3: None,
            observe: false,
            owner_only: false,
            slots: 64,
            max_units: 1 << 16,
            sticky_errors: false,
            poll: Duration::from_micros(20),
            time_launches: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Running,
    /// Flag set; completion frozen. Stays so until a reactivate has relaunched every stopped
    /// kernel.
    Flagged,
    /// Not safe (or nothing) to flag: the window drains as at Lv1.
    Draining,
}

/// The device side of a queue's Lv2, made at its first guarded launch.
pub(crate) struct Resources {
    pub(crate) control: Handle,
    pub(crate) flag: u64,
    pub(crate) done: u64,
    pub(crate) clear_event: Handle,
}

pub(crate) struct Lv2State {
    pub(crate) flight: Flight,
    pub(crate) stop: Stop,
    pub(crate) relaunch: Relaunch,
    pub(crate) stop_event: Option<Handle>,
    /// `stop_event` was recorded for the current stop (it may come after the flag's set).
    pub(crate) stop_recorded: bool,
    pub(crate) res: Option<Resources>,
    /// Making the resources failed: guarded kernels run as plain ones on this queue.
    pub(crate) failed: bool,
    pub(crate) slots: u32,
    pub(crate) max_units: u32,
    pub(crate) next_slot: u32,
    pub(crate) epoch: u32,
    /// Bumped by every flagged stop: an event a poller picked before it proves nothing now.
    pub(crate) generation: u64,
}

pub(crate) struct State {
    pub(crate) sync: VecDeque<(Seq, Handle)>,
    pub(crate) free: Vec<Handle>,
    pub(crate) completed: Seq,
    pub(crate) launched: Seq,
    /// The first error of a launch made after the application's call returned (from the
    /// pending buffer); reported by the next synchronize or query of the stream.
    pub(crate) sticky: CUresult,
    /// The stream or its context is gone: the queue's events are released and everything
    /// launched counts as completed, so no thread calls the driver for this queue again.
    pub(crate) retired: bool,
    pub(crate) lv2: Lv2State,
}

// SAFETY: the handles are driver objects usable from any thread (with the context made current).
unsafe impl Send for State {}

pub struct CudaQueue {
    pub(crate) drv: &'static dyn Driver,
    pub(crate) ctx: Handle,
    pub(crate) stream: Handle,
    pub(crate) state: Mutex<State>,
    /// The process's timeslice (Lv3), where this queue may use it.
    pub(crate) lv3: Option<ProcessLv3>,
    /// Interrupted at Lv3 and not restored yet.
    pub(crate) interrupted: AtomicBool,
    /// Lv2 (guard-built kernels stopped by the flag) is this queue's level.
    pub(crate) lv2: bool,
    /// The flag is set or a guarded kernel is in flight (`lv2.rs`).
    pub(crate) lv2_busy: AtomicBool,
    /// Open while a stop ahead may set the flag without the lock (`lv2.rs`).
    pub(crate) gate: StopGate,
    /// The flag's address and the control stream, once made: what a stop ahead writes with.
    pub(crate) ahead_target: OnceLock<(u64, usize)>,
    /// Set by `retire`: threads polling an event outside the lock stop, so that its events can
    /// be destroyed under nobody's feet.
    pub(crate) gone: AtomicBool,
    /// Where the application's thread last launched on this stream (`crate::placement`).
    pub(crate) launcher_cpu: AtomicI32,
    /// Threads polling one of the queue's events outside the lock.
    pub(crate) pollers: AtomicU32,
    pub(crate) launch_times: LaunchTimes,
    pub(crate) observer: Option<Observer>,
    /// See [`CudaQueueConfig::owner_only`]: a command is a marker that lets the owning thread
    /// make its call, which then records the sync event behind it (`owner_recorded`); this
    /// queue's other threads record nothing on the stream and wait for those events.
    pub(crate) owner_only: bool,
    /// The owner's event re-recorded after each of its calls in pass-through mode, which the
    /// observer waits for instead of recording one itself.
    pub(crate) owner_mark: Mutex<Option<usize>>,
    pub(crate) sticky_errors: bool,
    pub(crate) poll: Duration,
    pub(crate) time_launches: bool,
    /// The stream this queue made for itself, and the device whose context it keeps alive
    /// (`owned.rs`); `None` for a stream of the application's.
    pub(crate) owned: Option<Arc<crate::driver::Device>>,
}

// SAFETY: the context and stream handles are plain driver handles, valid from any thread.
unsafe impl Send for CudaQueue {}
// SAFETY: as above; the mutable state is behind the mutex.
unsafe impl Sync for CudaQueue {}

impl CudaQueue {
    /// The application's launch holds the state during its driver call; the watcher never
    /// sleeps on it, so that the launch never has a sleeper to wake.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        xpreempt_hal::lock_quietly(&self.state)
    }

    /// Makes the queue's context current for the guard's life. A queue with a stream of its own
    /// makes it current for good, once per thread (`owned.rs`), so that its threads do not push
    /// and pop it around every call; the application's threads get it back as they had it.
    pub(crate) fn enter(&self) -> entry::CtxGuard<'static> {
        if let Some(device) = &self.owned {
            owned::bind_once(device);
        }
        entry::CtxGuard::enter(self.drv, self.ctx)
    }

    pub(crate) fn nap(&self) {
        std::thread::sleep(self.poll);
    }

    /// A thread starts polling one of the queue's events outside the lock (call with it held).
    pub(crate) fn begin_poll(&self) {
        self.pollers
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn end_poll(&self) {
        self.pollers
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// `retire` has begun: pollers stop.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The queue's stream.
    pub fn stream(&self) -> Handle {
        self.stream
    }

    /// Whether the queue is interrupted through the process's timeslice (Lv3).
    pub fn lv3(&self) -> bool {
        self.lv3.is_some()
    }

    /// Whether the queue stops guard-built kernels (Lv2).
    pub fn lv2(&self) -> bool {
        self.lv2
    }

    /// Pass-through's observer, in that mode.
    pub fn observer(&self) -> Option<&Observer> {
        self.observer.as_ref()
    }

    /// How long this queue's launches took, if it times them.
    pub fn launch_times(&self) -> &LaunchTimes {
        &self.launch_times
    }

    /// Makes `d`'s call now on the queue's stream, outside the queue: a per-thread stream's own
    /// thread, once the marker that stands for the call has left the queue.
    pub fn call_now(&self, d: &mut Deferred) -> CUresult {
        d.call(self, None)
    }

    /// On a per-thread stream's own thread, after its call that marker `seq` let go: the sync
    /// event behind the call, which completes the marker.
    pub fn owner_recorded(&self, seq: Seq) {
        let _ctx = self.enter();
        let mut g = self.lock();
        if let Err(e) = self.record(&mut g, seq + 1) {
            note!(
                self,
                "per-thread stream: no sync event after a call ({e}); its queue waits"
            );
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
            None => match entry::new_event(self.drv) {
                Ok(ev) => {
                    *mark = Some(ev as usize);
                    ev
                }
                Err(e) => {
                    note!(
                        self,
                        "per-thread stream: no event to observe it (CUDA error {e})"
                    );
                    return;
                }
            },
        };
        let _ctx = self.enter();
        self.drv.event_record(ev, self.stream);
    }

    /// Whether the stream is a per-thread default stream (see `owner_only`).
    pub fn owner_only(&self) -> bool {
        self.owner_only
    }

    /// Takes the error of a launch from the pending buffer, if one failed.
    pub fn take_sticky(&self) -> CUresult {
        std::mem::replace(&mut self.lock().sticky, SUCCESS)
    }

    pub(crate) fn record(&self, g: &mut State, watermark: Seq) -> Result<Handle, HalError> {
        if g.retired {
            g.completed = g.completed.max(watermark);
            return Err(HalError::WouldBlock("the stream is gone"));
        }
        let ev = match g.free.pop() {
            Some(ev) => ev,
            None => entry::new_event(self.drv).map_err(|e| backend("cuEventCreate", e))?,
        };
        match self.drv.event_record(ev, self.stream) {
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

impl Deferred {
    /// Makes the driver call on `q`'s stream (again, for a relaunch); a call already made and
    /// dropped is a success.
    pub(crate) fn call(&mut self, q: &CudaQueue, guard: Option<&GuardValues>) -> CUresult {
        let stream = q.stream;
        self.call
            .as_mut()
            .map_or(SUCCESS, |c| q.drv.call(&mut || c(stream, guard)))
    }
}

pub(crate) fn backend(op: &'static str, e: CUresult) -> HalError {
    HalError::Backend {
        op,
        source: std::sync::Arc::new(CuError(e)),
    }
}
