//! xpreempt's CUDA backend.
//!
//! - [`queue::CudaQueue`] implements the HAL over one CUstream: Lv1 progressive launching with
//!   CUDA events as sync points; Lv2 block-level preemption for kernels built with
//!   `xpreempt_guard.cuh` (a device-memory flag set from a high-priority control stream, a
//!   per-launch completion array, exact relaunch); Lv3 through the channel-group timeslice
//!   (needs the `xpreempt-shim` ioctl interposer and a tested driver). Lv2 lives in `lv2.rs`;
//!   [`lv3`] counts the interrupted queues of the process, whose timeslice is one setting.
//! - [`native`]: plain streams, events and host-mapped words for work beside the HAL (the
//!   baselines and probes of `xpreempt-bench`), as safe owners of the driver handles.
//! - [`mps`] tells an MPS client from a time-sliced context.
//! - What the CUDA shim (`xpreempt-shim`) shares with [`queue::CudaQueue`]: Lv2's bookkeeping
//!   ([`flight`]) and stop-ahead gate ([`stop_gate`]), the completion watcher's CPU
//!   ([`placement`]) and the driver version check ([`nvidia`]).
//!
//! A HAL backend: it depends on `xpreempt-types` and `xpreempt-hal` only, never on the scheduler.
//! libcuda is loaded at run time: everything builds and the unit tests run without a GPU;
//! [`driver::driver_present`] says whether one can be used.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod driver;
pub mod error;
pub mod flight;
pub mod kernel;
mod launch;
mod lv2;
pub mod lv3;
pub mod mps;
pub mod native;
pub mod nvidia;
pub mod nvrtc;
pub mod placement;
pub mod queue;
pub mod stop_gate;

pub use driver::{Device, driver_present};
pub use error::CudaError;
pub use kernel::Kernel;
pub use launch::launch_on;
pub use native::{Event, HostWord, Stream};
pub use queue::{CudaQueue, CudaQueueConfig};
