//! `libxpreempt_shim.so`: xpreempt's LD_PRELOAD front end for unmodified CUDA applications.
//!
//! - [`rm`]: interposed `ioctl`/`close` that watch libcuda's resource-manager calls and find the
//!   process's compute channel groups (xpreempt's Lv3 on NVIDIA sets their timeslice);
//! - [`cuda`]: driver-API interception, so that each stream becomes an XQueue (on with
//!   `XPREEMPT_INTERCEPT=1`, which `xpreempt run` sets).
//!
//! Nothing here panics across the C boundary; a failure inside the shim is logged and the call
//! passes through unchanged.

#[macro_use]
mod log;
mod crash;
pub mod cuda;
pub mod rm;
