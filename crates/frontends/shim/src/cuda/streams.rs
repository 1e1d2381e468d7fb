//! Each CUstream an application uses (per context for the legacy default stream) becomes an
//! XQueue registered with the agent. Kernel and graph launches go through the queue (buffered
//! while the scheduler holds it, launched on the caller's thread otherwise); every other
//! operation goes straight to the driver once the commands it must follow have been launched
//! (`ordering`), so the application never observes the buffering.

use super::driver::{self, Handle, STREAM_LEGACY, STREAM_NON_BLOCKING, STREAM_PER_THREAD, SUCCESS};
use super::settings::{Settings, poll_nap, settings};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Hints, Level, Priority, QueueConfig};
use xpreempt_cuda::queue::capture;
use xpreempt_cuda::{CudaQueue, CudaQueueConfig};

pub struct StreamQueue {
    pub xq: Arc<SharedXQueue<CudaQueue>>,
    pub ctx: usize,
    pub legacy: bool,
    pub non_blocking: bool,
    /// A thread's per-thread default stream: only its own thread can name it, so its commands
    /// reach the driver from that thread alone (`launch::owner_launch`): a launch waits while
    /// the queue is suspended instead of leaving the call buffered.
    pub per_thread: bool,
    /// The priority the queue was declared with (the process's): what a call on its stream
    /// lends the queues it waits for (`ordering`).
    pub priority: Priority,
    /// The queue may hold buffered commands: only such queues are waited for on behalf of
    /// other streams, so a launch does not visit every queue of the process.
    held: AtomicBool,
}

impl StreamQueue {
    /// A submission left its command in the buffer.
    pub fn note_held(&self) {
        self.held.store(true, Ordering::SeqCst);
    }

    /// Whether the queue may hold buffered commands.
    pub fn may_hold(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits until everything submitted so far has been handed to the driver.
    #[track_caller]
    pub fn wait_launched(&self) {
        self.wait(None);
    }

    /// [`Self::wait_launched`] on behalf of another stream's call of priority `waiter`, which the
    /// queue inherits while its buffered commands wait.
    #[track_caller]
    pub fn wait_launched_for(&self, waiter: Priority) {
        self.wait(Some(waiter));
    }

    #[track_caller]
    fn wait(&self, waiter: Option<Priority>) {
        let started = super::exit_report::start(|| self.xq.pending_len() > 0);
        let site = std::panic::Location::caller();
        match waiter {
            Some(p) => self.xq.wait_launched_for(p),
            None => self.xq.wait_launched(),
        }
        // Kernels stopped at Lv2 are launched again only by the resume; meanwhile nothing may
        // follow them on the device, and the waiter's priority stays lent, the buffer empty or not.
        if !self.xq.hal().admit_direct() {
            let _lent = waiter.map(|p| self.xq.lend(p));
            loop {
                std::thread::sleep(poll_nap());
                self.xq.wait_launched();
                if self.xq.hal().admit_direct() {
                    break;
                }
            }
        }
        // Cleared before looking again: a command another thread buffers meanwhile (it marks
        // the queue after buffering) leaves the queue marked.
        self.held.store(false, Ordering::SeqCst);
        if self.xq.pending_len() > 0 {
            self.held.store(true, Ordering::SeqCst);
        }
        super::exit_report::done(started, site);
    }
}

/// With `XPREEMPT_SHIM_LOG=1`, as a queue leaves: how its window was fed.
fn log_queue(q: &StreamQueue) {
    if !crate::log::log_enabled() {
        return;
    }
    let kind = match (q.legacy, q.per_thread, q.non_blocking) {
        (true, ..) => "legacy",
        (_, true, _) => "per-thread",
        (_, _, false) => "blocking",
        (_, _, true) => "non-blocking",
    };
    let st = Preemptible::stats(&*q.xq);
    shim_log!(
        "{kind} stream queue: {} commands, {} launched from its buffer, ran dry {} times, {} preemptions; {}",
        st.submitted,
        st.buffered_launches,
        st.ran_dry,
        st.preemptions,
        q.xq.hal().launch_times().summary()
    );
}

/// Most completion slots of one queue (a launch that finds its slot still held by a kernel in
/// flight runs unstoppable).
const MAX_SLOTS: u32 = 64;

/// Key: (0, stream) for a created stream, (ctx, STREAM_LEGACY) for a context's legacy stream,
/// (ctx, !thread id) for a thread's per-thread default stream in that context.
type Key = (usize, usize);

/// `None`: the stream passes through (its queue could not be made).
static QUEUES: Mutex<Option<HashMap<Key, Option<Arc<StreamQueue>>>>> = Mutex::new(None);
/// Interception is off in this process (a forked child, or the agent could not start).
static OFF: AtomicBool = AtomicBool::new(false);
static AGENT: OnceLock<Option<Agent>> = OnceLock::new();
static HOOKS: std::sync::Once = std::sync::Once::new();

/// Stops interception for the rest of the process (said once).
pub fn turn_off(why: &str) {
    if !OFF.swap(true, Ordering::SeqCst) {
        shim_log!("{why}: CUDA calls pass through from now on");
        // What the queues hold goes out before anything passes them.
        for q in all() {
            q.wait_launched();
        }
    }
}

/// Whether streams get queues (to go through, or, in pass-through mode, to be observed).
pub fn enabled() -> bool {
    settings().intercept && !OFF.load(Ordering::Relaxed)
}

/// Whether calls go through xpreempt's queues (pass-through mode forwards them untouched).
pub fn active() -> bool {
    enabled() && !settings().pass_through
}

/// Pass-through mode: launches go straight to the driver and their queues only observe.
pub fn observing() -> bool {
    enabled() && settings().pass_through
}

fn queues() -> MutexGuard<'static, Option<HashMap<Key, Option<Arc<StreamQueue>>>>> {
    QUEUES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's queues, for operations that concern all of them.
pub fn all() -> Vec<Arc<StreamQueue>> {
    queues()
        .as_ref()
        .map(|m| m.values().flatten().cloned().collect())
        .unwrap_or_default()
}

/// The application waits for `stream`'s work: it synchronizes or queries the stream, or puts a
/// host function behind its work. Its queue reports Ready now if it had not
/// (`QueueConfig::with_ready_when_waited`). Any queue counts, a per-thread stream's and
/// pass-through's observers among them (unlike [`existing`], which gives only the queues that
/// may hold commands back).
pub fn waited(stream: Handle, ptsz: bool) {
    if !enabled() {
        return;
    }
    let (k, _, _) = key(stream, ptsz);
    let q = queues().as_ref().and_then(|m| m.get(&k).cloned().flatten());
    if let Some(q) = q {
        q.xq.waited();
    }
}

/// The application waits for work it does not name by stream (an event, the context, a
/// synchronous copy): every queue of the process counts as waited for. Erring this way only
/// protects work that did not need it.
pub fn waited_all() {
    if enabled() {
        for q in all() {
            q.xq.waited();
        }
    }
}

extern "C" fn in_forked_child() {
    // The agent's threads and the parent's CUDA state are not the child's: pass everything through.
    OFF.store(true, Ordering::Relaxed);
    super::fork_gate::after_fork();
}

extern "C" fn at_exit() {
    if OFF.load(Ordering::SeqCst) {
        // A forked child (the queues and their threads are the parent's), or already drained.
        return;
    }
    // Whatever the scheduler holds back goes out before libcuda's own exit handlers run, and
    // the queues stop calling the driver before those handlers tear the contexts down.
    if let Some(h) = TEST_HOOKS.get() {
        (h.exiting)();
    }
    for q in all() {
        q.wait_launched();
        log_queue(&q);
        q.xq.hal().retire_at_exit();
    }
    if crate::log::log_enabled() {
        for line in super::exit_report::report() {
            shim_log!("{line}");
        }
    }
}

/// What test machinery (the `chaos` feature) does at the agent's start and at exit, registered
/// by that machinery itself when the library loads: product code starts no test thread.
pub struct TestHooks {
    pub agent_started: fn(),
    /// Before the queues drain at exit: whatever the machinery holds is let go.
    pub exiting: fn(),
}

static TEST_HOOKS: OnceLock<TestHooks> = OnceLock::new();

pub fn set_test_hooks(hooks: TestHooks) {
    let _ = TEST_HOOKS.set(hooks);
}

fn agent(s: &Settings) -> Option<&'static Agent> {
    AGENT
        .get_or_init(|| {
            crate::crash::install();
            HOOKS.call_once(|| {
                // A completion watcher that ends holds forks off until it is gone.
                xpreempt_core::xqueue::threaded::on_watcher_ending(super::fork_gate::thread_ending);
                // SAFETY: registering plain extern "C" functions without captured state.
                unsafe {
                    libc::pthread_atfork(
                        Some(super::fork_gate::before_fork),
                        Some(super::fork_gate::after_fork),
                        Some(in_forked_child),
                    );
                    libc::atexit(at_exit);
                }
            });
            match Agent::start(Options {
                local_policy: "hpf".into(),
                ..Options::default()
            }) {
                Ok(a) => {
                    match TEST_HOOKS.get() {
                        Some(h) => (h.agent_started)(),
                        None if s.chaos.is_some() => shim_log!(
                            "XPREEMPT_CHAOS is set, but this shim was built without the `chaos` feature: no random suspensions"
                        ),
                        None => {}
                    }
                    Some(a)
                }
                Err(e) => {
                    shim_log!("the agent did not start ({e}); CUDA calls pass through");
                    OFF.store(true, Ordering::Relaxed);
                    None
                }
            }
        })
        .as_ref()
}

/// Whether `stream` (as the application passed it) is the calling thread's per-thread default
/// stream.
pub fn is_per_thread(stream: Handle, ptsz: bool) -> bool {
    let s = stream as usize;
    s == STREAM_PER_THREAD || (ptsz && s == 0)
}

/// Which stream a call names.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Created,
    Legacy,
    PerThread,
}

fn key(stream: Handle, ptsz: bool) -> (Key, Kind, usize) {
    let s = stream as usize;
    if is_per_thread(stream, ptsz) {
        let ctx = driver::current_ctx() as usize;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as usize;
        ((ctx, !tid), Kind::PerThread, ctx)
    } else if s == 0 || s == STREAM_LEGACY {
        let ctx = driver::current_ctx() as usize;
        ((ctx, STREAM_LEGACY), Kind::Legacy, ctx)
    } else {
        ((0, s), Kind::Created, 0)
    }
}

/// Bumped whenever a queue leaves the map, so that no thread's cached lookup outlives it.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last stream this thread launched on: launches come in runs on one stream, and this
    /// spares them the process-wide lock.
    /// Weak: the cache must not keep a forgotten queue (and its events) alive.
    static LAST: RefCell<Option<(Key, u64, Weak<StreamQueue>)>> = const { RefCell::new(None) };
}

/// The queue of a stream, made on first use; `None` to pass through.
pub fn queue(stream: Handle, ptsz: bool) -> Option<Arc<StreamQueue>> {
    if !enabled() {
        return None;
    }
    let (k, kind, ctx) = key(stream, ptsz);
    let generation = GENERATION.load(Ordering::SeqCst);
    let cached = LAST.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|(lk, lg, _)| *lk == k && *lg == generation)
            .and_then(|(_, _, q)| q.upgrade())
    });
    if cached.is_some() {
        return cached;
    }
    let found = lookup(k, kind, ctx, stream);
    if let Some(q) = &found {
        LAST.with(|l| *l.borrow_mut() = Some((k, generation, Arc::downgrade(q))));
    }
    found
}

fn lookup(k: Key, kind: Kind, ctx: usize, stream: Handle) -> Option<Arc<StreamQueue>> {
    if let Some(found) = queues().as_ref().and_then(|m| m.get(&k)) {
        return found.clone();
    }
    let made = make(stream, kind, ctx);
    if kind == Kind::PerThread && made.is_some() {
        forget_at_thread_exit(k);
    }
    let (kept, lost) = {
        let mut g = queues();
        let slot = g.get_or_insert_with(HashMap::new).entry(k);
        match slot {
            std::collections::hash_map::Entry::Occupied(o) => (o.get().clone(), made),
            std::collections::hash_map::Entry::Vacant(v) => (v.insert(made).clone(), None),
        }
    };
    // Another thread made this stream's queue first: this one leaves the scheduler unused.
    if let (Some(q), Some(Some(a))) = (lost, AGENT.get()) {
        a.remove(Preemptible::queue_id(&*q.xq));
    }
    kept
}

/// The queue of a stream if it has one already.
pub fn existing(stream: Handle, ptsz: bool) -> Option<Arc<StreamQueue>> {
    // A per-thread stream's queue holds no call back from the driver (its own thread makes
    // them, `launch::owner_launch`): nothing to wait for.
    if !active() || is_per_thread(stream, ptsz) {
        return None;
    }
    let (k, _, _) = key(stream, ptsz);
    queues().as_ref().and_then(|m| m.get(&k).cloned().flatten())
}

fn make(stream: Handle, kind: Kind, ctx: usize) -> Option<Arc<StreamQueue>> {
    let s = settings();
    let agent = agent(s)?;
    let mut ctx = ctx as Handle;
    let mut flags = 0u32;
    if kind == Kind::Created
        && (driver::cuStreamGetCtx(stream, &mut ctx) != SUCCESS
            || driver::cuStreamGetFlags(stream, &mut flags) != SUCCESS)
    {
        return None;
    }
    if ctx.is_null() {
        return None;
    }
    let mut device = 0i32;
    {
        let _g = driver::enter_ctx(ctx);
        driver::cuCtxGetDevice(&mut device);
    }
    let hal_stream = match kind {
        Kind::Legacy => STREAM_LEGACY as Handle,
        Kind::PerThread => STREAM_PER_THREAD as Handle,
        Kind::Created => stream,
    };
    let lv3 = (s.level == Level::Lv3).then(super::lv3::control).flatten();
    let (threshold, batch) = s.window();
    let config = match QueueConfig::new(threshold, batch, s.level) {
        // Lv3 interrupts what is in flight; bounding it by time only cost both sides there
        // (docs/results/h200-gpu-window.md).
        Ok(c) => match s.gpu_window_ns().filter(|_| lv3.is_none()) {
            Some(ns) => c.with_gpu_window(ns),
            None => c,
        },
        Err(e) => {
            shim_log!("queue settings: {e}; stream passes through");
            return None;
        }
    };
    // The shim sees the application's waits: they say when a stream's work counts.
    let config = config.with_ready_when_waited();
    let decl = Declaration {
        device: device.max(0) as u32,
        priority: s.priority,
        hints: Hints::default(),
        interleave: None,
        level: s.level,
    };
    if s.pass_through && lv3.is_none() {
        say_once_pass_through_cannot_preempt(s.level);
    }
    let per_thread = kind == Kind::PerThread;
    let hal = CudaQueue::new(
        &driver::REAL,
        ctx,
        hal_stream,
        CudaQueueConfig {
            level: s.level,
            lv3,
            observe: s.pass_through,
            owner_only: per_thread,
            // A slot per command in flight, and one more; each for a grid of up to 64Ki blocks
            // (a larger one runs unstoppable).
            slots: threshold.saturating_add(1).min(MAX_SLOTS),
            max_units: 1 << 16,
            sticky_errors: true,
            poll: poll_nap(),
            time_launches: crate::log::log_enabled(),
        },
    );
    match agent.queue(decl, config, hal) {
        Ok(xq) => Some(Arc::new(StreamQueue {
            xq,
            ctx: ctx as usize,
            legacy: kind == Kind::Legacy,
            non_blocking: flags & STREAM_NON_BLOCKING != 0,
            per_thread,
            priority: s.priority,
            held: AtomicBool::new(false),
        })),
        Err(e) => {
            shim_log!("registering a stream: {e}; it passes through");
            None
        }
    }
}

/// Pass-through holds nothing back, so only Lv3 preempts it: without Lv3 its queues are
/// observed and never stopped, which the user is told once, whatever the log level.
fn say_once_pass_through_cannot_preempt(level: Level) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    if level < Level::Lv3 {
        shim_log!(
            "pass-through at level {}: only level 3 (the process's timeslice) can preempt a program whose launches go straight to the driver; its streams are observed, never stopped",
            level as u8
        );
    } else {
        shim_log!(
            "pass-through without level 3 (no channel group of this process was seen: under MPS, or on an unmeasured driver): its streams are observed, never stopped"
        );
    }
}

/// A stream is destroyed: what it holds goes out first, then it leaves the scheduler.
pub fn forget(stream: Handle) {
    if !enabled() {
        return;
    }
    let (k, _, _) = key(stream, false);
    forget_key(k);
}

/// A thread's per-thread streams go with it: their queues leave at its exit (a TLS
/// destructor; the process's own exit retires whatever is left).
fn forget_at_thread_exit(k: Key) {
    struct Leaving(RefCell<Vec<Key>>);
    impl Drop for Leaving {
        fn drop(&mut self) {
            if enabled() {
                for k in self.0.take() {
                    forget_key(k);
                }
            }
        }
    }
    thread_local! {
        static LEAVING: Leaving = const { Leaving(RefCell::new(Vec::new())) };
    }
    let _ = LEAVING.try_with(|l| l.0.borrow_mut().push(k));
}

fn forget_key(k: Key) {
    let gone = queues().as_mut().and_then(|m| m.remove(&k)).flatten();
    GENERATION.fetch_add(1, Ordering::SeqCst);
    if let Some(q) = gone {
        q.wait_launched();
        log_queue(&q);
        // The driver completes the stream's work after the destroy; nothing here waits for it.
        q.xq.hal().retire();
        if let Some(Some(a)) = AGENT.get() {
            a.remove(Preemptible::queue_id(&*q.xq));
        }
    }
}

/// Before a context goes away: every queue's work goes out and completes, and the queues (their
/// events, their watchers) leave before the driver frees what they use.
pub fn forget_all() {
    if !enabled() {
        return;
    }
    let gone: Vec<Arc<StreamQueue>> = queues()
        .as_mut()
        .map(|m| m.drain().filter_map(|(_, q)| q).collect())
        .unwrap_or_default();
    GENERATION.fetch_add(1, Ordering::SeqCst);
    if crate::log::log_enabled() {
        shim_log!("context teardown: {} queue(s) retired", gone.len());
    }
    for q in gone {
        q.wait_launched();
        if let Err(e) = q.xq.wait_all() {
            shim_log!("waiting for a stream before its context goes: {e}");
        }
        log_queue(&q);
        // Whoever drops the queue last (the scheduler, the chaos thread) must not touch events
        // of a context that is gone by then.
        q.xq.hal().retire();
        if let Some(Some(a)) = AGENT.get() {
            a.remove(Preemptible::queue_id(&*q.xq));
        }
    }
}

/// Before a stream capture begins, once it is counted (`capture::begins`): no completion
/// watcher records on a stream while the capture runs. A queue's own work is all complete by
/// then; an observer records nothing until the capture ends, so it is only fenced (waiting for
/// its marker could outlast another thread's capture, or this one's).
pub fn quiesce() {
    if !enabled() {
        return;
    }
    for q in all() {
        let hal = q.xq.hal();
        if hal.observer().is_some() {
            hal.fence_capture();
            continue;
        }
        q.wait_launched();
        let _ = q.xq.wait_all();
    }
}

/// The queues matching `f` that may hold buffered commands (none, usually: then this neither
/// allocates nor takes a queue's lock), for a call that must wait for them (`ordering`).
pub fn held_where(f: impl Fn(&StreamQueue) -> bool) -> Vec<Arc<StreamQueue>> {
    queues()
        .as_ref()
        .map(|m| {
            m.values()
                .flatten()
                .filter(|q| (q.held.load(Ordering::SeqCst) || q.xq.hal().lv2_busy()) && f(q))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// A launch on `stream` while a capture is active goes straight to the driver.
pub fn capturing(stream: Handle) -> bool {
    capture::in_progress() && driver::is_capturing(stream)
}
