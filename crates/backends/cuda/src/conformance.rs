//! The CUDA queue against the HAL conformance suite on a real GPU (feature `conformance`): random
//! launches of guard-built kernels, stops and restarts on two queues, then every block must have
//! run exactly once. The kernels are `xp_spin` (`crate::nvrtc`), which counts each block's runs
//! in device memory, so a block relaunched after it finished, or skipped for good, fails the case.
//!
//! One harness for every driver table: the crate's tests run it through cudarc's driver, the
//! shim's through its own libcuda table (the calls `xpreempt run` makes). Each check panics with
//! the suite's counterexample, and fails (never passes) when no CUDA driver is found.

use crate::driver::{Device, DeviceBuffer};
use crate::entry::{CtxGuard, Driver, Handle, STREAM_NON_BLOCKING, SUCCESS};
use crate::nvrtc::BenchKernels;
use crate::queue::{CudaQueue, CudaQueueConfig, Deferred, GuardValues, PLACEHOLDERS};
use crate::{Kernel, launch_on};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_hal::conformance::{self, Bounds, Target};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Seq};

/// Loop iterations of one block: some 10-20 µs on current GPUs, so that a stop lands between
/// the blocks of a kernel now and then.
const BLOCK_ITERS: u64 = 8_000;
/// The longest real wait one `advance` makes: cases stay fast however large the suite's step.
const MAX_SLEEP: Duration = Duration::from_micros(200);
/// Completion slots: more than a case has in flight on one queue (at most 48 steps).
const SLOTS: u32 = 64;

/// What every case shares: the driver table, the device, the compiled kernels and their sink.
struct Fixture {
    drv: &'static dyn Driver,
    device: Arc<Device>,
    kernels: BenchKernels,
    sink: DeviceBuffer,
}

fn fixture(drv: &'static dyn Driver) -> Arc<Fixture> {
    assert!(
        crate::driver_present(),
        "no CUDA driver: this test needs a GPU"
    );
    let device = Arc::new(Device::open(0).expect("CUDA device 0"));
    let kernels = BenchKernels::build(&device).expect("NVRTC build of the test kernels");
    let sink = DeviceBuffer::zeroed(64).expect("alloc");
    Arc::new(Fixture {
        drv,
        device,
        kernels,
        sink,
    })
}

type Counts = Arc<Mutex<HashMap<Seq, u64>>>;

thread_local! {
    /// Where the launch under way files its counter array: (its seq, the queue's map). Commands
    /// are made before the suite picks their queue, so the queue says so around each launch.
    static CURRENT: RefCell<Option<(Seq, Counts)>> = const { RefCell::new(None) };
}

/// The queue under test, remembering which counter array each launched command writes, on a
/// stream of its own made through the table under test.
struct Counted {
    hal: CudaQueue,
    drv: &'static dyn Driver,
    ctx: Handle,
    stream: Handle,
    counts: Counts,
}

// SAFETY: the context and stream handles are driver objects usable from any thread; the queue is
// Send + Sync.
unsafe impl Send for Counted {}
// SAFETY: as above.
unsafe impl Sync for Counted {}

impl Counted {
    fn launching<T>(&self, seq: Seq, f: impl FnOnce() -> T) -> T {
        CURRENT.with(|c| *c.borrow_mut() = Some((seq, self.counts.clone())));
        let r = f();
        CURRENT.with(|c| *c.borrow_mut() = None);
        r
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.hal.retire();
        let _ctx = CtxGuard::enter(self.drv, self.ctx);
        self.drv.stream_synchronize(self.stream);
        self.drv.stream_destroy(self.stream);
    }
}

impl HwQueue for Counted {
    type Payload = Deferred;

    fn max_level(&self) -> Level {
        self.hal.max_level()
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Deferred>,
        sync: bool,
    ) -> Result<(), HalError> {
        self.launching(seq, || self.hal.launch(seq, command, sync))
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.hal.record_sync()
    }

    fn completed(&self) -> Seq {
        self.hal.completed()
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.hal.synchronize(upto)
    }

    fn settled(&self) -> bool {
        self.hal.settled()
    }

    fn stop_ahead(&self) -> bool {
        self.hal.stop_ahead()
    }

    fn deactivate(&self) -> Result<(), HalError> {
        self.hal.deactivate()
    }

    // A relaunch keeps the counter array its command was filed with.
    fn reactivate(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        self.hal.reactivate(log)
    }

    fn interrupt(&self) -> Result<(), HalError> {
        self.hal.interrupt()
    }

    fn restore(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        self.hal.restore(log)
    }

    fn interrupt_cost_ns(&self) -> Option<xpreempt_hal::Nanos> {
        self.hal.interrupt_cost_ns()
    }
}

/// One case: its queues come and go with it, and so do the counter arrays of its kernels.
struct Gpu {
    fx: Arc<Fixture>,
    counters: HashMap<u64, DeviceBuffer>,
}

impl Target for Gpu {
    type Queue = Counted;

    fn queue(&mut self, level: Level) -> Counted {
        let drv = self.fx.drv;
        self.fx.device.bind().expect("bind");
        let mut ctx: Handle = std::ptr::null_mut();
        assert_eq!(drv.ctx_get_current(&mut ctx), SUCCESS, "cuCtxGetCurrent");
        let mut stream: Handle = std::ptr::null_mut();
        let made = drv.stream_create(&mut stream, STREAM_NON_BLOCKING, 0);
        assert_eq!(made, SUCCESS, "cuStreamCreateWithPriority");
        let cfg = CudaQueueConfig {
            level,
            slots: SLOTS,
            max_units: 64,
            ..CudaQueueConfig::default()
        };
        Counted {
            hal: CudaQueue::new(drv, ctx, stream, cfg),
            drv,
            ctx,
            stream,
            counts: Counts::default(),
        }
    }

    fn kernel(&mut self, blocks: u32) -> Command<Deferred> {
        let counts = DeviceBuffer::zeroed(blocks as usize * 4).expect("alloc");
        let k = Kernel::new(
            self.fx.kernels.spin_guarded,
            [blocks, 1, 1],
            [64, 1, 1],
            &[BLOCK_ITERS, counts.ptr, 0, self.fx.sink.ptr],
        )
        .expect("kernel");
        let ptr = counts.ptr;
        self.counters.insert(ptr, counts);
        let call = move |stream: Handle, guard: Option<&GuardValues>| {
            CURRENT.with(|c| {
                if let Some((seq, counts)) = c.borrow().as_ref() {
                    counts.lock().expect("lock").insert(*seq, ptr);
                }
            });
            let mut leading = guard.copied().unwrap_or(PLACEHOLDERS);
            // SAFETY: `stream` is the launching queue's live stream; `xp_spin` takes the guard's
            // three parameters and the kernel's four, none over 8 bytes.
            match unsafe { launch_on(stream.cast(), &k, &mut leading) } {
                Ok(()) => SUCCESS,
                Err(_) => crate::entry::ERROR_INVALID_VALUE,
            }
        };
        Command::kernel(Deferred::guarded(blocks, call))
    }

    fn advance(&mut self, ns: u64) {
        std::thread::sleep(Duration::from_nanos(ns).min(MAX_SLEEP));
    }

    fn block_runs(&self, queue: &Counted, seq: Seq) -> Vec<u32> {
        let at = queue.counts.lock().expect("lock").get(&seq).copied();
        match at.and_then(|ptr| self.counters.get(&ptr)) {
            Some(buf) => buf.read_u32().expect("read the block counters"),
            None => vec![0], // launched but never recorded: a block that never ran
        }
    }
}

/// The suite at `level` on queues driven through `drv`.
pub fn conforms(drv: &'static dyn Driver, level: Level) {
    let fx = fixture(drv);
    fx.device.bind().expect("bind");
    let bounds = Bounds {
        cases: 12,
        max_blocks: 8,
        max_advance_ns: 200_000,
        // Drains in a few ms; this many 200 µs steps (seconds) means the work is stuck.
        drain_steps: 20_000,
    };
    let make = || {
        fx.device.bind().expect("bind");
        Gpu {
            fx: fx.clone(),
            counters: HashMap::new(),
        }
    };
    if let Err(e) = conformance::run(make, level, bounds) {
        panic!("{level}: {e}");
    }
}

/// A stop whose kernels all finished on the GPU before anything asked the queue flags them
/// without reaping (the flag's set comes first); the resume relaunches them, every block skips
/// itself, and each ran exactly once.
pub fn a_stop_after_the_work_finished_runs_nothing_twice(drv: &'static dyn Driver) {
    let fx = fixture(drv);
    fx.device.bind().expect("bind");
    let mut gpu = Gpu {
        fx: fx.clone(),
        counters: HashMap::new(),
    };
    let q = gpu.queue(Level::Lv2);
    let mut log = Vec::new();
    for seq in 0..3 {
        let mut command = gpu.kernel(8);
        q.launch(seq, &mut command, true).expect("launch");
        log.push(Launched { seq, command });
    }
    std::thread::sleep(Duration::from_millis(20));
    q.deactivate().expect("deactivate");
    assert!(
        q.completed() < 3,
        "the stop reaped the finished kernels: the flag-first path was not taken"
    );
    let t = std::time::Instant::now();
    while !q.settled() {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the stop never settled"
        );
    }
    q.reactivate(&mut log).expect("reactivate");
    q.synchronize(3).expect("synchronize");
    assert_eq!(q.completed(), 3);
    for seq in 0..3 {
        let runs = gpu.block_runs(&q, seq);
        assert!(
            runs.iter().all(|&r| r == 1),
            "kernel {seq}: block runs {runs:?}"
        );
    }
}
