//! `CudaQueue` against the HAL conformance suite on a real GPU, at Lv1 and Lv2: random launches of
//! guard-built kernels, deactivations and reactivations on two queues, then every block must have
//! run exactly once. The blocks count their own runs in device memory (`xp_spin`'s `counts`), so
//! a block relaunched after it finished, or skipped for good, fails the case.
//!
//! Run on a GPU machine: `cargo test --release -p xpreempt-cuda --test conformance -- --ignored`.
//! Each test fails (never passes) when no CUDA driver is found.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_cuda::driver::{Device, DeviceBuffer};
use xpreempt_cuda::nvrtc::BenchKernels;
use xpreempt_cuda::{CudaQueue, CudaQueueConfig, Kernel};
use xpreempt_hal::conformance::{self, Bounds, Target};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Seq};

/// Loop iterations of one block: some 10-20 µs on current GPUs, so that a stop lands between
/// the blocks of a kernel now and then.
const BLOCK_ITERS: u64 = 8_000;
/// The longest real wait one `advance` makes: cases stay fast however large the suite's step.
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// What every case shares: the device, the compiled kernels and their sink word.
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

/// A `CudaQueue` that remembers which counter array each launched command writes, so that the
/// suite can ask for the block counts of (queue, seq).
struct Counted {
    hal: CudaQueue,
    counters: Mutex<HashMap<Seq, u64>>,
}

/// Where `xp_spin`'s `counts` argument sits among a guarded kernel's own arguments.
const COUNTS_ARG: usize = 1;

impl HwQueue for Counted {
    type Payload = Kernel;

    fn max_level(&self) -> Level {
        self.hal.max_level()
    }

    fn launch(&self, seq: Seq, command: &mut Command<Kernel>, sync: bool) -> Result<(), HalError> {
        let counts = match &command.op {
            xpreempt_types::Op::Kernel(k) => Some(k.args[COUNTS_ARG]),
            _ => None,
        };
        self.hal.launch(seq, command, sync)?;
        if let Some(c) = counts {
            self.counters.lock().expect("lock").insert(seq, c);
        }
        Ok(())
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

    fn deactivate(&self) -> Result<(), HalError> {
        self.hal.deactivate()
    }

    fn reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        self.hal.reactivate(log)
    }

    fn interrupt(&self) -> Result<(), HalError> {
        self.hal.interrupt()
    }

    fn restore(&self, log: &mut [Launched<Kernel>]) -> Result<(), HalError> {
        self.hal.restore(log)
    }
}

/// One case: its queues come and go with it, and so do the counter arrays of its kernels.
struct Gpu {
    fx: Arc<Fixture>,
    /// Counter arrays by device address, one per launched kernel.
    counters: HashMap<u64, DeviceBuffer>,
}

impl Target for Gpu {
    type Queue = Counted;

    fn queue(&mut self, level: Level) -> Counted {
        let hal = CudaQueue::new(
            self.fx.device.clone(),
            CudaQueueConfig {
                level,
                stream_priority: 0,
                // More than a case can have in flight on one queue (at most 48 steps).
                slots: 64,
                max_units: 64,
                lv3: None,
            },
        )
        .expect("CudaQueue");
        Counted {
            hal,
            counters: Mutex::new(HashMap::new()),
        }
    }

    fn kernel(&mut self, blocks: u32) -> Command<Kernel> {
        let counts = DeviceBuffer::zeroed(blocks as usize * 4).expect("alloc");
        let k = Kernel::new(
            self.fx.kernels.spin_guarded,
            [blocks, 1, 1],
            [64, 1, 1],
            &[BLOCK_ITERS, counts.ptr, 0, self.fx.sink.ptr],
        )
        .expect("kernel")
        .guarded();
        self.counters.insert(counts.ptr, counts);
        Command::kernel(k)
    }

    fn advance(&mut self, ns: u64) {
        std::thread::sleep(Duration::from_nanos(ns).min(MAX_SLEEP));
    }

    fn block_runs(&self, queue: &Counted, seq: Seq) -> Vec<u32> {
        let at = queue.counters.lock().expect("lock").get(&seq).copied();
        match at.and_then(|ptr| self.counters.get(&ptr)) {
            Some(buf) => buf.read_u32().expect("read the block counters"),
            None => vec![0], // launched but never recorded: a block that never ran
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_queue_conforms_at_lv1() {
    conforms(Level::Lv1);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_queue_conforms_at_lv2() {
    conforms(Level::Lv2);
}

/// A stop whose kernels all finished on the GPU before anything asked the queue flags them
/// without reaping (the flag's set comes first); the resume relaunches them, every block skips
/// itself, and each ran exactly once.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stop_after_the_work_finished_runs_nothing_twice() {
    let fx = fixture();
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
