//! The hardware abstraction: one trait per hardware queue, with three preemption levels.
//!
//! A backend implements [`HwQueue`] for each hardware queue it exposes and says in
//! [`HwQueue::max_level`] how far up it goes. The XQueue uses the highest level both it and the
//! backend allow; it never calls an operation above that level. `docs/hal-contract.md` states
//! the contract; the [`conformance`] suite (feature `conformance`) checks it.
//!
//! Methods take `&self`: the launch path and the completion watcher of one queue run on different
//! threads, so a backend keeps its own interior locking (or none, where its driver is
//! thread-safe).

#![deny(unsafe_code)]

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "reference")]
pub mod faulty;
pub mod observed;
#[cfg(feature = "reference")]
pub mod reference;

pub use xpreempt_types::{Command, ComputeUnits, Launched, Level, Nanos, Seq};

use std::error::Error as StdError;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use thiserror::Error;

/// The backend's own error, kept whole (with its chain) and cheap to clone.
pub type BackendError = Arc<dyn StdError + Send + Sync + 'static>;

#[derive(Debug, Error, Clone)]
pub enum HalError {
    #[error("{op} needs preemption level {needed}, this hardware queue supports up to {supported}")]
    Unsupported {
        op: &'static str,
        needed: Level,
        supported: Level,
    },
    /// The backend runs on a virtual clock and cannot block; drive it with events instead.
    #[error("{0} would block on a backend with a virtual clock")]
    WouldBlock(&'static str),
    /// The backend refused the operation as asked (a malformed command, an operation the
    /// queue's state does not allow); retrying the same call fails the same way.
    #[error("{op} refused")]
    Refused {
        op: &'static str,
        #[source]
        source: BackendError,
    },
    /// Not launched: a stop ahead of this queue is under way ([`HwQueue::stop_ahead`]), and the
    /// command could not be stopped with the rest. Nothing reached the hardware; the command
    /// waits for the suspension that follows.
    #[error("{0} held back: a stop of this queue is under way")]
    Stopping(&'static str),
    /// The hardware or its driver failed.
    #[error("{op} failed in the backend")]
    Backend {
        op: &'static str,
        #[source]
        source: BackendError,
    },
}

/// [`HwQueue::confine`] on hardware that cannot change a queue's compute units while it runs.
#[derive(Debug, Error)]
#[error("this hardware queue cannot change its compute units while it runs")]
pub struct NoSpatialControl;

impl HalError {
    pub fn backend(op: &'static str, source: impl StdError + Send + Sync + 'static) -> Self {
        HalError::Backend {
            op,
            source: Arc::new(source),
        }
    }

    pub fn refused(op: &'static str, source: impl StdError + Send + Sync + 'static) -> Self {
        HalError::Refused {
            op,
            source: Arc::new(source),
        }
    }

    /// The message of this error and of every error below it, joined: for logs and for users.
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur = self.source();
        while let Some(e) = cur {
            s.push_str(": ");
            s.push_str(&e.to_string());
            cur = e.source();
        }
        s
    }
}

/// Takes `m` without ever sleeping on it: a waiter that slept would cost the holder a wake-up
/// (a system call) when it lets go, and the holder is usually the application's thread in the
/// middle of a launch, while the other side (the watcher) can spare the wait.
/// The XQueue's lock and a backend's own state lock use it alike: both are held across the
/// application's launch.
pub fn lock_quietly<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    let mut spins = 0u32;
    loop {
        match m.try_lock() {
            Ok(g) => return g,
            Err(TryLockError::Poisoned(p)) => return p.into_inner(),
            Err(TryLockError::WouldBlock) if spins < 100 => {
                spins += 1;
                std::hint::spin_loop();
            }
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
}

/// One hardware queue (a CUDA stream, an AQL ring, a simulated queue).
pub trait HwQueue {
    /// What a kernel launch carries on this backend.
    type Payload;

    /// The highest level this queue supports.
    fn max_level(&self) -> Level;

    // ---- Lv1 ----

    /// Hands one command to the hardware. `seq` numbers commands of this queue in order. With
    /// `sync_point` set the backend makes this command's completion observable (a CUDA event, a
    /// completion signal); between sync points it may report completion late. The backend may take
    /// data out of the command (a host callback) but must leave the kernel payload in place, since
    /// Lv2/Lv3 may hand the command back for relaunch.
    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Self::Payload>,
        sync_point: bool,
    ) -> Result<(), HalError>;

    /// Makes completion of everything launched so far observable, as if the last launch had been
    /// a sync point.
    fn record_sync(&self) -> Result<(), HalError>;

    /// Completion watermark: every command with a smaller `seq` has completed. Never decreases.
    /// A command that was stopped by `deactivate` or `interrupt` is not complete.
    fn completed(&self) -> Seq;

    /// Blocks until `completed() >= upto`. Returns at once if it already is.
    fn synchronize(&self, upto: Seq) -> Result<(), HalError>;

    /// Advances `completed()` by what the hardware can tell without blocking (sync points that
    /// have passed). A hardware whose `completed()` is always current needs nothing here.
    fn take_in_completions(&self) {}

    /// Whether the last deactivate/interrupt/reactivate/restore has fully taken effect (the
    /// hardware is free of this queue's running work, or running it again). Backends whose
    /// operations are synchronous keep the default.
    fn settled(&self) -> bool {
        true
    }

    // ---- Lv2 ----

    /// Starts a Lv2 stop of the in-flight work at once, from any thread, concurrently with any
    /// other call (a launch under way included): the caller has not taken the queue's lock yet.
    /// `false`: nothing was done (nothing in flight that a stop could safely stop, a stop already
    /// made, or a backend without it). `true`: the stop is under way, as if `deactivate` had been
    /// called (a command it stops is not counted complete), and a launch of a command that
    /// cannot be stopped with the rest fails with [`HalError::Stopping`]; the caller must follow
    /// with [`HwQueue::deactivate`], which then takes the stop over and does not fail.
    fn stop_ahead(&self) -> bool {
        false
    }

    /// Stops in-flight deactivatable work at the next block/workgroup boundary; finished blocks
    /// stay finished. Non-deactivatable work already launched runs to completion.
    fn deactivate(&self) -> Result<(), HalError> {
        Err(self.unsupported("deactivate", Level::Lv2))
    }

    /// Resumes what `deactivate` stopped. `log` holds every launched, not yet completed command
    /// in submission order; a backend relaunches the unfinished part of those it stopped.
    fn reactivate(&self, log: &mut [Launched<Self::Payload>]) -> Result<(), HalError> {
        let _ = log;
        Err(self.unsupported("reactivate", Level::Lv2))
    }

    // ---- Lv3 ----

    /// Stops all in-flight work of the queue at once, saving its state.
    fn interrupt(&self) -> Result<(), HalError> {
        Err(self.unsupported("interrupt", Level::Lv3))
    }

    /// Restores what `interrupt` saved and lets the queue run on from where it stopped.
    fn restore(&self, log: &mut [Launched<Self::Payload>]) -> Result<(), HalError> {
        let _ = log;
        Err(self.unsupported("restore", Level::Lv3))
    }

    /// How long an `interrupt` takes before it acts, as measured on this hardware, or `None`
    /// where it is not measured. A queue whose commands each run shorter than this drains at
    /// Lv1 instead of interrupting: the hardware stop could not get its work off sooner.
    fn interrupt_cost_ns(&self) -> Option<Nanos> {
        None
    }

    // ---- Compute units (at any level) ----

    /// Whether [`HwQueue::confine`] can move this queue onto fewer compute units while it runs
    /// (AMD CU masks). Where it cannot, a queue is stopped for a higher one, never confined.
    fn can_confine(&self) -> bool {
        false
    }

    /// Spatial yield: the queue keeps running, but off `avoid` (the units of the higher queues
    /// it makes room for); `None` gives it back every unit it was created with. Moving the work
    /// already running on `avoid` off them is the backend's (the AMD model saves and restores
    /// every mapped queue, as KFD's runlist re-execution does). Refused where no unit of the
    /// queue's own would be left.
    fn confine(&self, avoid: Option<&ComputeUnits>) -> Result<(), HalError> {
        let _ = avoid;
        Err(HalError::refused("confine", NoSpatialControl))
    }

    #[doc(hidden)]
    fn unsupported(&self, op: &'static str, needed: Level) -> HalError {
        HalError::Unsupported {
            op,
            needed,
            supported: self.max_level(),
        }
    }
}
