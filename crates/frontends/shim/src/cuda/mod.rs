//! Driver-API interception: unmodified CUDA applications scheduled by xpreempt
//! (`xpreempt run`, `XPREEMPT_INTERCEPT=1`).
//!
//! - [`resolve`]: `dlsym` and `cuGetProcAddress` hand out the shim's wrappers;
//! - [`exports`]: the wrappers, under libcuda's names;
//! - [`launch`]: kernel and graph launches become XQueue commands, deferred driver calls on the
//!   CUDA backend's queue (`xpreempt_cuda::CudaQueue`, driven through [`driver::REAL`]);
//! - [`streams`]: a stream's queue; [`ordering`]: what every other call waits for, and on
//!   whose behalf;
//! - [`guard`] recognizes guard-built kernels (which the queue stops at Lv2); [`lv3`]: the
//!   process's timeslice control, which the queues call at Lv3;
//! - [`priority`]: the stream priority of the process's work;
//! - [`settings`]: what `xpreempt run` asks for;
//! - `chaos` (the `chaos` feature, tests only): random suspensions and a stand-in timeslice.
//! - [`fork_gate`]: the shim's own threads stay out of libcuda while the application forks.

#[cfg(feature = "chaos")]
mod chaos;
pub mod driver;
mod exit_report;
mod exports;
pub(crate) mod fork_gate;
mod guard;
mod launch;
mod lv3;
mod ordering;
mod priority;
pub mod real;
mod resolve;
pub mod settings;
pub mod streams;
