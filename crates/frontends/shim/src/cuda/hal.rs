//! The HAL under an intercepted stream: a command is a deferred driver call on the
//! application's own stream; completion is tracked with events recorded at sync points (Lv1).

use super::driver::{self, CUresult, CtxGuard, Handle, SUCCESS};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::Mutex;
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Level, Op, Seq};

/// How often the completion watcher looks at a sync event it waits for.
const POLL: std::time::Duration = std::time::Duration::from_micros(20);

/// A driver call held until the queue may run; it returns the driver's status.
pub struct Deferred(Option<Box<dyn FnOnce() -> CUresult + Send>>);

impl Deferred {
    pub fn new(call: impl FnOnce() -> CUresult + Send + 'static) -> Self {
        Self(Some(Box::new(call)))
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

/// Runs `f` as the application's submission (see `SUBMITTING`); also says whether the command
/// went to the driver during it.
pub fn submitting<T>(f: impl FnOnce() -> T) -> (T, bool) {
    SUBMITTING.with(|s| s.set(true));
    LAUNCHED.with(|l| l.set(false));
    let r = f();
    SUBMITTING.with(|s| s.set(false));
    (r, LAUNCHED.with(Cell::get))
}

struct State {
    sync: VecDeque<(Seq, Handle)>,
    free: Vec<Handle>,
    completed: Seq,
    launched: Seq,
    /// The first error of a launch made after the application's call returned (from the
    /// pending buffer); reported by the next synchronize or query of the stream.
    sticky: CUresult,
}

// SAFETY: the handles are driver objects usable from any thread (with the context made current).
unsafe impl Send for State {}

pub struct StreamHal {
    ctx: Handle,
    stream: Handle,
    state: Mutex<State>,
}

// SAFETY: the context and stream handles are plain driver handles, valid from any thread.
unsafe impl Send for StreamHal {}
// SAFETY: as above; the mutable state is behind the mutex.
unsafe impl Sync for StreamHal {}

impl StreamHal {
    pub fn new(ctx: Handle, stream: Handle) -> Self {
        Self {
            ctx,
            stream,
            state: Mutex::new(State {
                sync: VecDeque::new(),
                free: Vec::new(),
                completed: 0,
                launched: 0,
                sticky: SUCCESS,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the error of a launch from the pending buffer, if one failed.
    pub fn take_sticky(&self) -> CUresult {
        std::mem::replace(&mut self.lock().sticky, SUCCESS)
    }

    fn record(&self, g: &mut State, watermark: Seq) -> Result<Handle, HalError> {
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

    fn reap(&self, g: &mut State) {
        while let Some(&(m, ev)) = g.sync.front() {
            if driver::cuEventQuery(ev) != SUCCESS {
                break;
            }
            g.completed = g.completed.max(m);
            g.sync.pop_front();
            g.free.push(ev);
        }
    }
}

fn backend(op: &'static str, e: CUresult) -> HalError {
    HalError::Backend {
        op,
        source: std::sync::Arc::new(CuError(e)),
    }
}

impl HwQueue for StreamHal {
    type Payload = Deferred;

    fn max_level(&self) -> Level {
        Level::Lv1
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Deferred>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        let _ctx = CtxGuard::enter(self.ctx);
        let mut g = self.lock();
        let Op::Kernel(Deferred(call)) = &mut command.op else {
            return Err(HalError::Refused {
                op: "launch",
                source: std::sync::Arc::new(CuError(driver::ERROR_INVALID_VALUE)),
            });
        };
        let status = call.take().map_or(SUCCESS, |c| c());
        if SUBMITTING.with(Cell::get) {
            LAUNCHED.with(|l| l.set(true));
        }
        if status != SUCCESS {
            if SUBMITTING.with(Cell::get) {
                return Err(backend("launch", status));
            }
            // From the pending buffer: retrying a call the driver refused cannot help; it counts
            // as done and the stream reports the error at its next synchronize, as CUDA would.
            if g.sticky == SUCCESS {
                g.sticky = status;
            }
        }
        g.launched = seq + 1;
        if sync_point && let Err(e) = self.record(&mut g, seq + 1) {
            // The command is on the stream: a later record_sync covers its completion.
            shim_log!("sync point after a launch: {e}");
        }
        Ok(())
    }

    fn record_sync(&self) -> Result<(), HalError> {
        let _ctx = CtxGuard::enter(self.ctx);
        let mut g = self.lock();
        let tail = g.launched;
        if g.completed >= tail || g.sync.back().is_some_and(|&(m, _)| m >= tail) {
            return Ok(());
        }
        self.record(&mut g, tail).map(|_| ())
    }

    fn completed(&self) -> Seq {
        let mut g = self.lock();
        self.reap(&mut g);
        g.completed
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        let _ctx = CtxGuard::enter(self.ctx);
        loop {
            let ev = {
                let mut g = self.lock();
                self.reap(&mut g);
                if g.completed >= upto {
                    return Ok(());
                }
                if upto > g.launched {
                    return Err(HalError::WouldBlock(
                        "synchronize beyond the launched commands",
                    ));
                }
                match g.sync.iter().find(|&&(m, _)| m >= upto) {
                    Some(&(_, ev)) => ev,
                    None => {
                        let tail = g.launched;
                        self.record(&mut g, tail)?
                    }
                }
            };
            // Waiting without the lock; a reaped and re-recorded event only ends the wait later.
            // Polled with short sleeps instead of cuEventSynchronize: a thread spinning inside
            // libcuda next to the application's launching thread slows its launches.
            loop {
                match driver::cuEventQuery(ev) {
                    SUCCESS => break,
                    driver::ERROR_NOT_READY => std::thread::sleep(POLL),
                    e => return Err(backend("cuEventQuery", e)),
                }
            }
        }
    }
}

impl Drop for StreamHal {
    fn drop(&mut self) {
        let _ctx = CtxGuard::enter(self.ctx);
        let g = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for &(_, ev) in &g.sync {
            driver::cuEventSynchronize(ev);
            driver::cuEventDestroy_v2(ev);
        }
        for &ev in &g.free {
            driver::cuEventDestroy_v2(ev);
        }
    }
}
