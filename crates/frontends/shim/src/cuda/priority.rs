//! The hardware priority of the process's work. Under MPS, stream priorities order the blocks of
//! different processes (they reach across MPS clients, `crates/backends/cuda/README.md`; running
//! blocks are not preempted, waiting ones of a higher stream go first), so a process
//! above logical priority 0 creates its streams at a stream priority that grows with its logical
//! one. The legacy default stream, where PyTorch works unless told otherwise, has the lowest
//! priority and cannot get another: with `XPREEMPT_GRAPH_PROXY=1` a CUDA graph launched there runs
//! instead on a private stream of the process's priority, between two events that keep the legacy
//! stream's order (off by default: on the H100 it changed nothing measurable on the PyTorch pair
//! and trio, docs/results/h100-pytorch.md).

use super::driver::{self, CtxGuard, Handle, STREAM_NON_BLOCKING, SUCCESS};
use super::settings::settings;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

/// The stream priority of work at logical priority `logical` on a device whose priorities run
/// from `least` (the default, e.g. 0) to `greatest` (e.g. -5; lower is higher): at 0 and below
/// the application's `requested`; above 0 one stream level per two logical levels, so that
/// three processes at 0, 5 and 10 get three different levels (0, -3, -5).
pub fn stream_priority_for(logical: i32, requested: i32, least: i32, greatest: i32) -> i32 {
    if logical <= 0 || greatest >= least {
        return requested;
    }
    let steps = logical.saturating_add(1) / 2;
    least.saturating_sub(steps).max(greatest)
}

/// The stream priority of this process's work (None: the application's own, since the process
/// is not above priority 0 or the device has one level).
pub fn process_stream_priority() -> Option<i32> {
    let s = settings();
    if !super::streams::enabled() || s.priority <= 0 {
        return None;
    }
    let (mut least, mut greatest) = (0i32, 0i32);
    if driver::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) != SUCCESS {
        return None;
    }
    let p = stream_priority_for(s.priority, least, least, greatest);
    (p != least).then_some(p)
}

/// The stream priority for a stream the application asked `requested` for: the process's, if
/// it has one (it orders the process against others; its own streams' order gives way).
pub fn stream_priority(requested: i32) -> i32 {
    process_stream_priority().unwrap_or(requested)
}

/// A context's private stream for graphs launched on its legacy stream, with the events that
/// bracket each launch. Handles as integers: the driver's objects, shared between threads.
struct Proxy {
    ctx: usize,
    stream: usize,
    enter: usize,
    leave: usize,
}

/// Context → its proxy (None: the context has none, and will not). Held across a proxied launch:
/// the two events serve one launch at a time.
fn proxies() -> MutexGuard<'static, HashMap<usize, Option<Proxy>>> {
    static P: LazyLock<Mutex<HashMap<usize, Option<Proxy>>>> = LazyLock::new(Mutex::default);
    P.lock().unwrap_or_else(|p| p.into_inner())
}

fn create(ctx: usize, priority: i32) -> Option<Proxy> {
    let (mut stream, mut enter, mut leave): (Handle, Handle, Handle) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    const DISABLE_TIMING: u32 = 0x2;
    if driver::cuStreamCreateWithPriority(&mut stream, STREAM_NON_BLOCKING, priority) != SUCCESS {
        return None;
    }
    if driver::cuEventCreate(&mut enter, DISABLE_TIMING) != SUCCESS
        || driver::cuEventCreate(&mut leave, DISABLE_TIMING) != SUCCESS
    {
        for e in [enter, leave].into_iter().filter(|e| !e.is_null()) {
            driver::cuEventDestroy_v2(e);
        }
        driver::cuStreamDestroy_v2(stream);
        return None;
    }
    Some(Proxy {
        ctx,
        stream: stream as usize,
        enter: enter as usize,
        leave: leave as usize,
    })
}

/// Launches a graph that the application launched on the legacy stream `legacy` of context
/// `ctx` (current on this thread): on the context's proxy stream when the process has a stream
/// priority, with the same order as on `legacy` (the launch follows what `legacy` holds and what
/// it follows; whatever `legacy` gets next, and what follows it, waits for the graph); else, or
/// if the proxy cannot be had, on `legacy` itself.
pub fn launch_graph(
    ctx: usize,
    legacy: Handle,
    launch: impl Fn(Handle) -> driver::CUresult,
) -> driver::CUresult {
    let s = settings();
    if !s.graph_proxy || s.priority <= 0 {
        return launch(legacy);
    }
    let mut map = proxies();
    let proxy = map.entry(ctx).or_insert_with(|| {
        let priority = process_stream_priority()?;
        let p = create(ctx, priority);
        if p.is_none() {
            shim_log!("no private stream for graphs on the legacy stream; they stay there");
        }
        p
    });
    let Some(p) = proxy else {
        return launch(legacy);
    };
    let (stream, enter, leave) = (p.stream as Handle, p.enter as Handle, p.leave as Handle);
    // A failure before the launch (the legacy stream may not take work now, e.g. while another
    // thread captures in global mode) leaves the graph to the legacy stream, which then answers
    // as it would have.
    if driver::cuEventRecord(enter, legacy) != SUCCESS
        || driver::cuStreamWaitEvent(stream, enter, 0) != SUCCESS
    {
        return launch(legacy);
    }
    let status = launch(stream);
    if status != SUCCESS {
        return status;
    }
    if driver::cuEventRecord(leave, stream) != SUCCESS
        || driver::cuStreamWaitEvent(legacy, leave, 0) != SUCCESS
    {
        // The order must hold even so: the graph completes before anything follows it.
        shim_log!("a graph on the proxy stream could not be ordered; waiting for it");
        driver::cuStreamSynchronize(stream);
    }
    SUCCESS
}

/// Before a context goes away (and so all queues): the proxy streams and their events go while
/// their contexts still exist.
pub fn forget_all() {
    // Not in a forked child (it passes everything through): the map's lock may have been held
    // by another thread of the parent at the fork.
    if !super::streams::enabled() {
        return;
    }
    let gone: Vec<Proxy> = proxies().drain().filter_map(|(_, p)| p).collect();
    for p in gone {
        let _ctx = CtxGuard::enter(p.ctx as Handle);
        driver::cuEventDestroy_v2(p.enter as Handle);
        driver::cuEventDestroy_v2(p.leave as Handle);
        driver::cuStreamDestroy_v2(p.stream as Handle);
    }
}

#[cfg(test)]
mod tests {
    use super::stream_priority_for;

    #[test]
    fn logical_priorities_above_zero_climb_the_stream_priorities_two_by_two() {
        let p = |logical| stream_priority_for(logical, 0, 0, -5);
        assert_eq!(
            [p(-3), p(0), p(1), p(2), p(5), p(9), p(10), p(100)],
            [0, 0, -1, -1, -3, -5, -5, -5]
        );
        // The application's own request stands at 0 and below, and on a one-level device.
        assert_eq!(stream_priority_for(0, -2, 0, -5), -2);
        assert_eq!(stream_priority_for(10, 0, 0, 0), 0);
    }
}
