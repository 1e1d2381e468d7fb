//! A queue on a stream of its own, for a program that drives the GPU itself (the benchmarks, the
//! conformance suite): the queue makes the stream at the CUDA priority asked for, calls the
//! driver cudarc loaded, and keeps the device's context alive until its stream is gone.

use super::{CudaQueue, CudaQueueConfig};
use crate::driver::Device;
use crate::entry::CUDARC;
use crate::error::Result;
use std::sync::Arc;

impl CudaQueue {
    /// A queue on a new non-blocking stream of `device` at CUDA stream priority `priority`
    /// (smaller is higher; see `Device::stream_priority_range`).
    pub fn on_device(device: Arc<Device>, priority: i32, cfg: CudaQueueConfig) -> Result<Self> {
        let stream = crate::native::create_stream(&device, priority)?;
        let mut q = Self::new(&CUDARC, device.ctx.cast(), stream.cast(), cfg);
        q.owned = Some(device);
        Ok(q)
    }

    /// Drop of a queue with its own stream: the stream's work ends (its guarded kernels use the
    /// queue's flag and completion array), the queue retires (its events and Lv2 resources go),
    /// then the stream.
    pub(crate) fn release_owned(&mut self) {
        let drv = self.drv;
        let _ctx = crate::entry::CtxGuard::enter(drv, self.ctx);
        drv.stream_synchronize(self.stream);
        self.retire();
        drv.stream_destroy(self.stream);
    }
}

/// Makes `device`'s context current on this thread unless this thread made it so last (a thread
/// of the program's own, which binds devices as it likes: a failure is left to the guard, which
/// pushes the context instead).
pub(crate) fn bind_once(device: &Device) {
    thread_local! {
        static BOUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    let ctx = device.ctx as usize;
    if BOUND.with(|b| b.get()) != ctx && device.bind().is_ok() {
        BOUND.with(|b| b.set(ctx));
    }
}
