//! Cost of one hook call through the interpreter, with the LC/BE example policy:
//! `cargo bench -p xpreempt-bpf --bench hooks`. Prints ns per call for each hook, and for the
//! same calls with no policy program (the fixed cost of building the context and dispatching).

use std::hint::black_box;
use std::time::Instant;
use xpreempt_bpf::{BpfHooks, LoadOptions, Policy};
use xpreempt_core::QueueId;
use xpreempt_core::command::OpKind;
use xpreempt_core::scheduler::{Hooks, QueueInfo};

const N: u64 = 200_000;

fn per_call(name: &str, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..N / 10 {
        f(i);
    }
    let t = Instant::now();
    for i in 0..N {
        f(i);
    }
    let ns = t.elapsed().as_nanos() as f64 / N as f64;
    println!("{name:<28} {ns:>8.1} ns/call");
    ns
}

fn main() {
    let path = match xpreempt_bpf::built_object("lcbe") {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let bytes = std::fs::read(&path).expect("read lcbe.o");
    let policy = Policy::load("lcbe", &bytes, LoadOptions::default()).expect("lcbe loads");
    let mut h = BpfHooks::new(policy);
    println!("policy: {} (interpreter)", path.display());
    for q in 0..64 {
        h.task_init(&mut QueueInfo::new(QueueId(q), (q % 2) as i32));
    }
    let mut worst: f64 = 0.0;
    worst = worst.max(per_call("task_init", |i| {
        let mut info = QueueInfo::new(QueueId((i % 64) as u32), 1);
        h.task_init(black_box(&mut info));
    }));
    worst = worst.max(per_call("schedule (admit)", |i| {
        black_box(h.admit(QueueId((i % 64) as u32), 3, 1));
    }));
    worst = worst.max(per_call("work_submit", |i| {
        h.work_submit(QueueId((i % 64) as u32), OpKind::Kernel, i, i * 1_000);
    }));
    worst = worst.max(
        per_call("task_destroy + task_init", |i| {
            let q = QueueId((i % 64) as u32);
            h.task_destroy(q, 5);
            h.task_init(&mut QueueInfo::new(q, 0));
        }) / 2.0,
    );
    println!("slowest hook: {worst:.1} ns/call (goal: <= 1000)");
}
