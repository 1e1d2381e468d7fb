//! Driver-API interception: unmodified CUDA applications scheduled by xpreempt
//! (`xpreempt run`, `XPREEMPT_INTERCEPT=1`).
//!
//! - [`resolve`]: `dlsym` and `cuGetProcAddress` hand out the shim's wrappers;
//! - [`exports`]: the wrappers, under libcuda's names;
//! - [`launch`]: kernel and graph launches become XQueue commands ([`hal`], made of [`stream`]);
//! - [`streams`]: a stream's queue; [`ordering`]: what every other call waits for, and on
//!   whose behalf;
//! - [`observe`]: pass-through mode, where queues only observe; [`lv2`]: guard-built kernels
//!   stopped by a flag and relaunched ([`guard`] recognizes them); [`lv3`]: the process's timeslice;
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
pub mod hal;
mod launch;
mod lv2;
mod lv3;
mod observe;
mod ordering;
mod priority;
pub mod real;
mod resolve;
pub mod settings;
pub mod stream;
pub mod streams;
