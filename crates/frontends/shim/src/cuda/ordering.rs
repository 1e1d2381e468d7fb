//! What a call on a stream waits for before it reaches the driver: the buffered commands CUDA
//! orders it after, on its own stream's queue and on the other streams of its context (the
//! legacy default stream and the blocking streams follow each other), so the application never
//! observes the buffering.
//!
//! A wait on another stream's queue is made on behalf of the waiting stream's priority, which
//! that queue inherits until its buffered commands are launched
//! ([`xpreempt_core::xqueue::threaded::SharedXQueue::wait_launched_for`]): a queue the scheduler
//! stopped for a third one, which the waiting stream outranks or equals, runs again rather than
//! holding the waiting stream behind that third queue.

use super::driver::{self, Handle, STREAM_LEGACY};
use super::settings::settings;
use super::streams::{self, StreamQueue, active, existing, is_per_thread};
use std::sync::Arc;
use xpreempt_core::Priority;

/// The priority a call on a stream waits with: its own queue's, else (a stream without a queue)
/// the process's.
fn waiter(own: Option<&StreamQueue>) -> Priority {
    own.map_or(settings().priority, |q| q.priority)
}

/// Waits, on behalf of `waiter`, for the queues matching `f` that may hold buffered commands
/// (none, usually: then this neither allocates nor takes a queue's lock).
#[track_caller]
fn drain_where(waiter: Priority, f: impl Fn(&StreamQueue) -> bool) {
    for q in streams::held_where(f) {
        q.wait_launched_for(waiter);
    }
}

/// Before `stream` gets work that bypasses its queue (or before its queue gets more work): the
/// commands CUDA orders it after are handed to the driver first. The legacy default stream
/// follows every blocking stream of its context and they follow it; a per-thread default
/// stream is blocking too.
pub fn order_before(stream: Handle, ptsz: bool, own: Option<&StreamQueue>) {
    if !active() {
        return;
    }
    let p = waiter(own);
    if is_per_thread(stream, ptsz) {
        let ctx = driver::current_ctx() as usize;
        return drain_where(p, |q| q.legacy && q.ctx == ctx);
    }
    match own {
        Some(q) if q.legacy => {
            let ctx = q.ctx;
            // Not its own buffer: its queue keeps that order, and a wait for it cost a
            // backlogged PyTorch training a fifth of its throughput (H100, window 16: 0.80 of
            // native with the wait, 0.98 without).
            drain_where(p, |o| o.ctx == ctx && !o.non_blocking && !o.legacy);
        }
        Some(q) if !q.non_blocking => {
            let ctx = q.ctx;
            drain_where(p, |o| o.legacy && o.ctx == ctx);
        }
        _ => {}
    }
}

/// Before a direct call on `stream`: its own queue and what it is ordered after are launched.
pub fn before_direct(stream: Handle, ptsz: bool) {
    if !active() {
        return;
    }
    let own = existing(stream, ptsz);
    if let Some(q) = &own {
        q.wait_launched();
    }
    order_after_others(stream, ptsz, own.as_deref());
}

/// What a direct call on `stream` is ordered after, beyond its own queue: `order_before`, and
/// for a stream without a queue yet that is a context's legacy stream, the context's blocking
/// streams.
fn order_after_others(stream: Handle, ptsz: bool, own: Option<&StreamQueue>) {
    order_before(stream, ptsz, own);
    if own.is_none() && !is_per_thread(stream, ptsz) {
        let s = stream as usize;
        if s == 0 || s == STREAM_LEGACY {
            let ctx = driver::current_ctx() as usize;
            drain_where(waiter(None), |o| o.ctx == ctx && !o.non_blocking);
        }
    }
}

/// Before a synchronize of `stream`: what `before_direct` does, except that the stream's own
/// queue keeps its guarded kernels stoppable (a synchronize adds no work behind them). Returns
/// that queue and its Lv2 generation: if a stop came while the driver waited, the synchronize
/// returned early and must be made again (`CudaQueue::stopped_since`).
pub fn before_sync(stream: Handle, ptsz: bool) -> Option<(Arc<StreamQueue>, u64)> {
    if !active() {
        return None;
    }
    let own = existing(stream, ptsz);
    let seen = own.as_ref().map(|q| {
        let started = super::exit_report::start(|| q.xq.pending_len() > 0);
        let generation = loop {
            q.xq.wait_launched();
            if let Some(generation) = q.xq.hal().admit_sync() {
                break generation;
            }
            std::thread::sleep(super::settings::poll_nap());
        };
        super::exit_report::done(started, std::panic::Location::caller());
        generation
    });
    order_after_others(stream, ptsz, own.as_deref());
    own.zip(seen)
}

/// Before a synchronous call (copies, frees, unloads, context teardown): everything buffered
/// anywhere in the process goes out, on behalf of the process's priority.
pub fn drain_all() {
    if active() {
        drain_where(waiter(None), |_| true);
    }
}
