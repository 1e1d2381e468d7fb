//! The application never observes the shim's pending buffer: without a GPU,
//! a simulated device behind a stand-in `libcuda.so.1` (`tests/sim/driver`: every stream a FIFO
//! run by a device thread, kernels that run for a given time or until their gate opens, events,
//! the legacy stream's implicit synchronization, stream capture, a log of what ran when) and a
//! test application (`tests/sim/app`, reaching the driver as the CUDA runtime does) check each
//! rule with launches that the shim really holds back: behind a gated kernel with a window of one
//! command, under random suspensions (`XPREEMPT_CHAOS`), while the local scheduler takes turns
//! between streams, and (`suspended`) under a real daemon that keeps the process suspended for
//! as long as the test wants, and (`inherit`) while a stream waits for another one that the
//! daemon stopped for a third process. Every scenario also runs on the simulated driver alone, so
//! its checks are CUDA's semantics and not the shim's. `guard` checks Lv2 for guard-built kernels.

mod capture;
mod guard;
mod harness;
mod inherit;
mod lifecycle;
mod order;
mod suspended;
mod sync;
