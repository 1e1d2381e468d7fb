//! xpreempt's CUDA backend.
//!
//! - [`queue::CudaQueue`] is the one CUDA implementation of the HAL, over one CUstream, which the
//!   shim (`xpreempt run`), the benchmarks and the conformance suite all drive: a command is a
//!   deferred driver call ([`queue::Deferred`]); Lv1 progressive launching with CUDA events as
//!   sync points; Lv2 block-level preemption for kernels built with `xpreempt_guard.cuh` (a
//!   device-memory flag set from a high-priority control stream, a per-launch completion array,
//!   exact relaunch); Lv3 adds the channel-group timeslice, which [`lv3`] counts per process.
//!   Its driver calls go through a table ([`entry::Driver`]): the shim's own libcuda functions,
//!   or cudarc's ([`entry::CUDARC`]).
//! - [`native`]: plain streams, events and host-mapped words for work beside the HAL (the
//!   baselines and probes of `xpreempt-bench`), as safe owners of the driver handles.
//! - [`mps`] tells an MPS client from a time-sliced context.
//! - The queue's parts: Lv2's bookkeeping ([`flight`]) and stop-ahead gate ([`stop_gate`]), the
//!   completion watcher's CPU ([`placement`]); the driver version check ([`nvidia`]), which the
//!   shim's RM interposer uses too.
//!
//! A HAL backend: it depends on `xpreempt-types` and `xpreempt-hal` only, never on the scheduler.
//! libcuda is loaded at run time: everything builds and the unit tests run without a GPU;
//! [`driver::driver_present`] says whether one can be used.

#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod driver;
pub mod entry;
pub mod error;
pub mod flight;
pub mod kernel;
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
pub use kernel::launch_on;
pub use native::{Event, HostWord, Stream};
pub use queue::{CudaQueue, CudaQueueConfig, Deferred, GuardValues};
