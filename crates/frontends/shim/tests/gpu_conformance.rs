//! The shim's HAL, the one `xpreempt run` drives, against the HAL conformance suite on a real GPU,
//! at Lv1 and Lv2: random launches of guard-built kernels, stops and restarts on two queues, then
//! every block must have run exactly once. The kernels are the CUDA backend's `xp_spin`, which
//! counts each block's runs in device memory; the shim's own libcuda table makes every call.
//!
//! Run on a GPU machine:
//! `cargo test --release -p xpreempt-shim --test gpu_conformance -- --ignored --test-threads=1`.
//! Each test fails (never passes) when no CUDA driver is found.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_cuda::driver::{Device, DeviceBuffer};
use xpreempt_cuda::nvrtc::BenchKernels;
use xpreempt_cuda::{Kernel, launch_on};
use xpreempt_hal::conformance::{self, Bounds, Target};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_shim::cuda::driver::{self, Handle, SUCCESS};
use xpreempt_shim::cuda::stream::{Deferred, GuardValues, StreamHal};
use xpreempt_types::{Command, Launched, Level, Seq};

/// Loop iterations of one block: some 10-20 µs on current GPUs, so that a stop lands between
/// the blocks of a kernel now and then.
const BLOCK_ITERS: u64 = 8_000;
/// The longest real wait one `advance` makes.
const MAX_SLEEP: Duration = Duration::from_micros(200);
/// The queue's window: more than a case has in flight on one queue.
const WINDOW: u32 = 64;

struct Fixture {
    device: Arc<Device>,
    kernels: BenchKernels,
    sink: DeviceBuffer,
}

fn fixture() -> Arc<Fixture> {
    assert!(
        xpreempt_cuda::driver_present(),
        "no CUDA driver: this test needs a GPU"
    );
    let device = Arc::new(Device::open(0).expect("CUDA device 0"));
    let kernels = BenchKernels::build(&device).expect("NVRTC build of the test kernels");
    let sink = DeviceBuffer::zeroed(64).expect("alloc");
    Arc::new(Fixture {
        device,
        kernels,
        sink,
    })
}

type Counts = Arc<Mutex<HashMap<Seq, u64>>>;

/// What a kernel's launch needs from the queue that makes it: the queue's stream, and (at its
/// first launch) its number and where the queue files each command's counter array. Commands are
/// made before the suite picks their queue, so the queue says so around each call.
struct Current {
    stream: Handle,
    seq: Option<Seq>,
    counts: Counts,
}

thread_local! {
    static CURRENT: RefCell<Option<Current>> = const { RefCell::new(None) };
}

impl Counted {
    fn around<T>(&self, seq: Option<Seq>, f: impl FnOnce() -> T) -> T {
        CURRENT.with(|c| {
            *c.borrow_mut() = Some(Current {
                stream: self.stream,
                seq,
                counts: self.counts.clone(),
            })
        });
        let r = f();
        CURRENT.with(|c| *c.borrow_mut() = None);
        r
    }
}

/// The shim's queue, remembering which counter array each launched command writes.
struct Counted {
    hal: StreamHal,
    stream: Handle,
    counts: Counts,
}

// SAFETY: the stream handle is a driver object usable from any thread; StreamHal is Send + Sync.
unsafe impl Send for Counted {}
// SAFETY: as above.
unsafe impl Sync for Counted {}

impl Drop for Counted {
    fn drop(&mut self) {
        self.hal.retire();
        driver::cuStreamSynchronize(self.stream);
        driver::cuStreamDestroy_v2(self.stream);
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
        self.around(Some(seq), || self.hal.launch(seq, command, sync))
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

    fn reactivate(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        self.around(None, || self.hal.reactivate(log))
    }

    fn interrupt(&self) -> Result<(), HalError> {
        self.hal.interrupt()
    }

    fn restore(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        self.around(None, || self.hal.restore(log))
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
        self.fx.device.bind().expect("bind");
        let ctx = driver::current_ctx();
        let mut stream: Handle = std::ptr::null_mut();
        let made = driver::cuStreamCreateWithPriority(&mut stream, 1, 0);
        assert_eq!(made, SUCCESS, "cuStreamCreateWithPriority");
        Counted {
            hal: StreamHal::new(
                ctx,
                stream,
                false,
                level >= Level::Lv2,
                false,
                false,
                WINDOW,
            ),
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
        let call = move |guard: Option<&GuardValues>| {
            let stream = CURRENT.with(|c| {
                let c = c.borrow();
                let c = c.as_ref().expect("launched through a Counted queue");
                if let Some(seq) = c.seq {
                    c.counts.lock().expect("lock").insert(seq, ptr);
                }
                c.stream
            });
            let mut leading = guard.copied().unwrap_or([0; 3]);
            // SAFETY: `stream` is the launching queue's live stream; `xp_spin` takes the guard's
            // three parameters and the kernel's four, none over 8 bytes.
            match unsafe { launch_on(stream.cast(), &k, &mut leading) } {
                Ok(()) => SUCCESS,
                Err(_) => driver::ERROR_INVALID_VALUE,
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
            None => vec![0],
        }
    }
}

fn conforms(level: Level) {
    let fx = fixture();
    fx.device.bind().expect("bind");
    let bounds = Bounds {
        cases: 12,
        max_blocks: 8,
        max_advance_ns: 200_000,
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_shims_hal_conforms_at_lv1() {
    conforms(Level::Lv1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_shims_hal_conforms_at_lv2() {
    conforms(Level::Lv2);
}
