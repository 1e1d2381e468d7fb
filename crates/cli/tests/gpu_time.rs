//! What each queue measured of its GPU time reaches the user: a client process runs bursts of
//! 2 ms kernels with CPU gaps between them on the reference backend, and `xpreempt list --json`
//! (another process) and the daemon's metrics show its GPU time per command, busy fraction,
//! burst, gap and GPU time in flight, close to what the client did; the daemon's `--trace`
//! timeline has the queue's busy fraction and GPU time per command as counters.
//!
//! The client is this test binary run again with `XPREEMPT_GPU_CHILD` set: the `child` test
//! below is its entry point and does nothing in a normal run.

mod common;

use common::{Client, cli, scrape};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::{Command as GpuCommand, CommandProps, Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

const ROLE: &str = "XPREEMPT_GPU_CHILD";
const KERNEL_NS: u64 = 2_000_000;
const BURST_KERNELS: usize = 10;
const GAP: Duration = Duration::from_millis(60);
const BURSTS: usize = 4;
/// The last phase: long enough for several samples of a queue with work in flight.
const TAIL_KERNELS: usize = 1_500;

fn kernel() -> GpuCommand<RefKernel> {
    GpuCommand::kernel(RefKernel {
        blocks: 1,
        block_ns: KERNEL_NS,
    })
    .with_props(CommandProps::new(false, true, false))
}

/// The client: `SOCKET`. Runs [`BURSTS`] bursts with [`GAP`] between them, says `bursts`, and
/// on a line from the test runs [`TAIL_KERNELS`] back to back; it keeps its queue until its
/// stdin closes.
#[test]
fn child() {
    let Ok(sock) = std::env::var(ROLE) else {
        return;
    };
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let agent = Agent::start(Options {
        socket: PathBuf::from(sock),
        name: "gputime".into(),
        ..Options::default()
    })
    .unwrap();
    assert!(agent.is_remote(), "the client could not reach the daemon");
    let decl = Declaration {
        device: 0,
        priority: 0,
        hints: Hints::default(),
        interleave: None,
        level: Level::Lv2,
    };
    let q = agent
        .queue(
            decl,
            QueueConfig::new(4, 2, Level::Lv2).unwrap(),
            dev.create_queue(Level::Lv2),
        )
        .unwrap();
    for i in 0..BURSTS {
        if i > 0 {
            std::thread::sleep(GAP);
        }
        for _ in 0..BURST_KERNELS {
            q.submit(kernel()).unwrap();
        }
        q.wait_all().unwrap();
    }
    println!("bursts");
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    for _ in 0..TAIL_KERNELS {
        q.submit(kernel()).unwrap();
    }
    q.wait_all().unwrap();
    println!("tail");
    let _ = stdin.read_line(&mut line);
}

/// The client's row in `xpreempt --json list`, run as a user runs it.
fn listed(sock: &Path) -> Option<serde_json::Value> {
    let v = cli(&["list"], sock);
    v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["process_name"] == "gputime")
        .cloned()
}

/// Polls `list` until `f` holds for the client's row; panics with the last row if it never does.
fn wait_row(sock: &Path, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let row = listed(sock);
        if let Some(r) = row.as_ref().filter(|r| f(r)) {
            return r.clone();
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}; the client's row: {row:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ns(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a duration: {v}"))
}

/// The client's sample of `name`, if the metrics have one.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("process=\"gputime\""))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xpreempt-gpu-time-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn list_and_metrics_show_what_a_client_s_queue_measured_of_its_gpu_time() {
    let dir = scratch();
    let sock = dir.join("xpreempt.sock");
    let mut config = Config::new(sock.clone());
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    let trace = dir.join("trace.json");
    config.trace = Some(trace.clone());
    let daemon = Daemon::start(config).expect("daemon starts");
    let addr = daemon.metrics_addr().unwrap();

    let mut client = Client::start(ROLE, sock.to_str().unwrap());
    client.expect("bursts");
    // Published on the agent's next heartbeat: every command of the bursts measured.
    let all = (BURSTS * BURST_KERNELS) as u64;
    let row = wait_row(&sock, "the bursts were not all published", |r| {
        r["gpu"]["measured_commands"].as_u64() == Some(all) && r["in_flight"] == 0
    });
    eprintln!("after the bursts: {row}");
    let gpu = &row["gpu"];
    let per = ns(&gpu["per_command_ns"]);
    assert!(
        (KERNEL_NS * 3 / 4..KERNEL_NS * 5).contains(&per),
        "GPU time per command {per} ns for {KERNEL_NS} ns kernels"
    );
    let burst = ns(&gpu["burst_ns"]);
    let work = KERNEL_NS * BURST_KERNELS as u64;
    assert!(
        (work * 3 / 4..work * 10).contains(&burst),
        "a burst of {work} ns of kernels measured {burst} ns"
    );
    let gap = ns(&gpu["gap_ns"]);
    let slept = GAP.as_nanos() as u64;
    assert!(
        (slept / 2..slept * 5).contains(&gap),
        "a gap of {slept} ns measured {gap} ns"
    );
    let u = gpu["busy_fraction"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&u), "busy fraction {u}");
    assert_eq!(row["in_flight_gpu_ns"], 0, "nothing in flight: {row}");

    // Back-to-back work: commands in flight, each worth its measured GPU time, and the busy
    // fraction climbs towards one.
    writeln!(client.stdin, "go").unwrap();
    let row = wait_row(&sock, "the busy fraction never climbed", |r| {
        r["in_flight"].as_u64().is_some_and(|n| n > 0)
            && r["gpu"]["busy_fraction"].as_f64().is_some_and(|u| u > 0.5)
    });
    eprintln!("busy: {row}");
    let (in_flight, per) = (
        row["in_flight"].as_u64().unwrap(),
        ns(&row["gpu"]["per_command_ns"]),
    );
    assert_eq!(ns(&row["in_flight_gpu_ns"]), in_flight * per, "{row}");

    let body = scrape(addr);
    let of = |name: &str| {
        sample(&body, name).unwrap_or_else(|| panic!("no {name} for the client:\n{body}"))
    };
    let per_s = of("xpreempt_queue_gpu_command_seconds");
    assert!(
        (0.75 * KERNEL_NS as f64 / 1e9..5.0 * KERNEL_NS as f64 / 1e9).contains(&per_s),
        "{per_s} s per command"
    );
    let u = of("xpreempt_queue_gpu_busy_ratio");
    assert!(u > 0.3 && u <= 1.0, "busy ratio {u}");
    assert!(of("xpreempt_queue_gpu_burst_seconds") > 0.0);
    assert!(of("xpreempt_queue_gpu_gap_seconds") > 0.0);
    assert!(of("xpreempt_queue_gpu_in_flight_seconds") >= 0.0);
    assert!(of("xpreempt_queue_gpu_measured_commands_total") >= 20.0);
    for (name, kind) in [
        ("xpreempt_queue_gpu_command_seconds", "gauge"),
        ("xpreempt_queue_gpu_busy_ratio", "gauge"),
        ("xpreempt_queue_gpu_in_flight_seconds", "gauge"),
        ("xpreempt_queue_gpu_measured_commands_total", "counter"),
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} is not a {kind}"
        );
    }

    drop(client);
    daemon.stop();
    // The timeline has the queue's counters beside its states: u climbed over 30 %, and the
    // GPU time of a command is about the kernel's.
    let events: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("a closed trace");
    let counter = |name: &str, arg: &str| -> Vec<f64> {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .map(|e| e["args"][arg].as_f64().unwrap())
            .collect()
    };
    let busy = counter("q0 busy %", "u");
    assert!(busy.iter().any(|&u| u > 30.0), "busy %: {busy:?}");
    let per = counter("q0 GPU time per command (µs)", "us");
    let kernel_us = KERNEL_NS as f64 / 1e3;
    assert!(
        !per.is_empty()
            && per
                .iter()
                .all(|&p| p > 0.75 * kernel_us && p < 5.0 * kernel_us),
        "µs per command: {per:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
