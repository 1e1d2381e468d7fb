//! Each device's measured mechanism costs reach the user: two client processes on the reference
//! backend, a low-priority one at Lv2 that keeps the device busy and a high-priority one at Lv3
//! whose bursts preempt it. Afterwards `xpreempt list --json`, `top --json` and the metrics
//! show the Lv2 block-boundary stop and its restart, measured from exactly the suspensions and
//! resumptions the low queue counted, and nothing for the levels nobody was suspended at.
//!
//! A level-3 low queue whose commands are shorter than its interrupt takes to act drains
//! instead: its stops show as Lv1 drains, and `list`, `top` and the metrics count them.
//!
//! The clients are this test binary run again with `XPREEMPT_COSTS_CHILD` set: the `child` test
//! below is their entry point and does nothing in a normal run.

mod common;

use common::{Client, cli, scrape};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use xpreempt_agent::{Agent, Declaration, Options};
use xpreempt_core::{Command as GpuCommand, CommandProps, Hints, Level, QueueConfig};
use xpreempt_daemon::{Config, Daemon};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

const ROLE: &str = "XPREEMPT_COSTS_CHILD";
/// The low client's kernels: blocks of this long, so that a block-boundary stop waits for at
/// most one.
const LOW_BLOCK_NS: u64 = 500_000;
const LOW_KERNELS: usize = 600;
const HIGH_BURSTS: usize = 5;

fn kernel(blocks: u32, block_ns: u64) -> GpuCommand<RefKernel> {
    GpuCommand::kernel(RefKernel { blocks, block_ns })
        .with_props(CommandProps::new(false, true, false))
}

/// A client: `low`, `low-lv3` or `high`, then the socket. It says `started` once its queue is
/// registered (a low one once its work is in flight), `done` when its work is finished, and
/// keeps its queue until its stdin closes. `low-lv3` reports an interrupt cost of a second, so
/// that once its 2 ms kernels are measured its suspensions drain.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let (who, sock) = role.split_once(':').unwrap();
    let (priority, level) = match who {
        "low" => (0, Level::Lv2),
        "low-lv3" => (0, Level::Lv3),
        _ => (10, Level::Lv3),
    };
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let agent = Agent::start(Options {
        socket: PathBuf::from(sock),
        name: who.into(),
        ..Options::default()
    })
    .unwrap();
    assert!(agent.is_remote(), "the client could not reach the daemon");
    let decl = Declaration {
        device: 0,
        priority,
        hints: Hints::default(),
        interleave: None,
        level,
    };
    let hal = dev.create_queue(level);
    if who == "low-lv3" {
        hal.set_interrupt_cost(Some(1_000_000_000));
    }
    let q = agent
        .queue(decl, QueueConfig::new(4, 2, level).unwrap(), hal)
        .unwrap();
    if who.starts_with("low") {
        q.submit(kernel(4, LOW_BLOCK_NS)).unwrap();
        println!("started");
        for _ in 1..LOW_KERNELS {
            q.submit(kernel(4, LOW_BLOCK_NS)).unwrap();
        }
    } else {
        println!("started");
        for _ in 0..HIGH_BURSTS {
            for _ in 0..3 {
                q.submit(kernel(1, 1_000_000)).unwrap();
            }
            q.wait_all().unwrap();
            std::thread::sleep(Duration::from_millis(40));
        }
    }
    q.wait_all().unwrap();
    println!("done");
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

/// The value of the sample of `name` whose labels include every one of `labels`.
fn sample(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// Device 0's entry for `mechanism` in a `costs` array.
fn mechanism<'a>(costs: &'a serde_json::Value, mechanism: &str) -> &'a serde_json::Value {
    let dev = costs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == 0)
        .unwrap_or_else(|| panic!("no device 0 in {costs}"));
    dev["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mechanism"] == mechanism)
        .unwrap_or_else(|| panic!("no {mechanism} in {dev}"))
}

/// A daemon with metrics, its socket in a fresh directory named after `tag`.
fn daemon(tag: &str) -> (PathBuf, PathBuf, Daemon) {
    let dir = std::env::temp_dir().join(format!("xpreempt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("xpreempt.sock");
    let mut config = Config::new(sock.clone());
    config.metrics = Some("127.0.0.1:0".parse().unwrap());
    (dir, sock, Daemon::start(config).expect("daemon starts"))
}

#[test]
fn list_top_and_metrics_show_the_measured_stop_and_restart_of_each_level() {
    let (dir, sock, daemon) = daemon("costs");
    let addr = daemon.metrics_addr().unwrap();

    let mut low = Client::start(ROLE, &format!("low:{}", sock.display()));
    low.expect("started");
    // Before any suspension every level is listed without a measurement.
    let before = cli(&["list"], &sock);
    let lv2 = mechanism(&before["costs"], "block_stop");
    assert!(lv2["stop"].is_null(), "nothing suspended yet: {lv2}");
    let mut high = Client::start(ROLE, &format!("high:{}", sock.display()));
    high.expect("started");
    high.expect("done");
    // Every suspension is over and recorded once the low queue's work is done.
    low.expect("done");

    // The low queue's own counts (per-queue histograms in the metrics) and the device's Lv2
    // cost must describe the same suspensions once its agent has published them all.
    let lv2 = ["device=\"0\"", "level=\"lv2\"", "mechanism=\"block_stop\""];
    let t = Instant::now();
    let body = loop {
        let body = scrape(addr);
        let low_count = |h: &str| {
            sample(
                &body,
                &format!("xpreempt_queue_{h}_latency_seconds_count"),
                &["process=\"low\""],
            )
        };
        let (stops, restarts) = (low_count("suspend"), low_count("resume"));
        let merged_stops = sample(&body, "xpreempt_mechanism_stop_samples", &lv2);
        let merged_restarts = sample(&body, "xpreempt_mechanism_restart_samples", &lv2);
        if stops.is_some_and(|n| n >= 1.0)
            && stops == merged_stops
            && restarts.is_some_and(|n| n >= 1.0)
            && restarts == merged_restarts
        {
            break body;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the low queue's suspensions ({stops:?}) and resumptions ({restarts:?}) never \
             matched the device's Lv2 costs ({merged_stops:?}, {merged_restarts:?}):\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stops = sample(&body, "xpreempt_mechanism_stop_samples", &lv2).unwrap();
    let p50 = sample(
        &body,
        "xpreempt_mechanism_stop_seconds",
        &[&lv2[..], &["quantile=\"0.5\""]].concat(),
    )
    .expect("a stop median");
    let p99 = sample(
        &body,
        "xpreempt_mechanism_stop_seconds",
        &[&lv2[..], &["quantile=\"0.99\""]].concat(),
    )
    .expect("a stop p99");
    assert!(p50 > 0.0 && p50 <= p99, "stop p50 {p50} s, p99 {p99} s");
    assert!(
        sample(
            &body,
            "xpreempt_mechanism_restart_seconds",
            &[&lv2[..], &["quantile=\"0.99\""]].concat()
        )
        .is_some(),
        "no restart p99:\n{body}"
    );
    // Nobody was suspended at Lv1 or Lv3 (the high queue is Lv3 and never stopped).
    for level in ["lv1", "lv3"] {
        assert_eq!(
            sample(
                &body,
                "xpreempt_mechanism_stop_samples",
                &[&format!("level=\"{level}\"")]
            ),
            None,
            "{body}"
        );
    }

    let listing = cli(&["list"], &sock);
    let block = mechanism(&listing["costs"], "block_stop");
    eprintln!("Lv2 in list: {block}");
    assert_eq!(block["level"], "Lv2");
    assert_eq!(block["stop"]["samples"].as_f64(), Some(stops), "{block}");
    let (p50_ns, p99_ns) = (
        block["stop"]["p50_ns"].as_u64().unwrap(),
        block["stop"]["p99_ns"].as_u64().unwrap(),
    );
    assert_eq!((p50_ns as f64 / 1e9, p99_ns as f64 / 1e9), (p50, p99));
    // A block-boundary stop waits for the block on the device, not for the queue's window
    // (4 kernels of 4 blocks) to drain: its exact mean says which one was measured.
    let window_ns = 4 * 4 * LOW_BLOCK_NS;
    let mean = block["stop"]["mean_ns"].as_u64().unwrap();
    assert!(
        mean > 0 && mean < window_ns / 2,
        "mean stop {mean} ns with {LOW_BLOCK_NS} ns blocks"
    );
    assert!(block["restart"]["samples"].as_u64().unwrap() >= 1);
    assert!(block["over_ns"].as_u64().unwrap() > 0, "{block}");
    // The device's p99 comes from the low queue's suspensions alone, so it lies within a
    // bucket (a quarter of an octave) of the p99 that queue keeps itself (within 1/16).
    let own = listing["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["process_name"] == "low")
        .expect("the low queue's row")["suspend_p99_ns"]
        .as_u64()
        .unwrap() as f64;
    assert!(
        (own / 1.4..=own * 1.4).contains(&(p99_ns as f64)),
        "the device's Lv2 stop p99 {p99_ns} ns against the queue's own {own} ns"
    );
    for (name, level) in [("drain", "Lv1"), ("switch", "Lv3")] {
        let m = mechanism(&listing["costs"], name);
        assert_eq!(m["level"], level);
        assert!(m["stop"].is_null() && m["restart"].is_null(), "{m}");
    }
    let spatial = mechanism(&listing["costs"], "spatial_confinement");
    assert!(spatial["stop"].is_null(), "{spatial}");
    assert_eq!(spatial["note"], "not measured");

    // The table people read says the same.
    let o = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(["list", "--socket", sock.to_str().unwrap()])
        .output()
        .expect("run xpreempt");
    let table = String::from_utf8(o.stdout).unwrap();
    eprintln!("{table}");
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("  0 lv2 block-boundary stop"))
        .unwrap_or_else(|| panic!("no Lv2 row in:\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[4], block["stop"]["samples"].to_string(), "{table}");
    assert!(row[5].ends_with('s') && row[6].ends_with('s'), "{table}");
    assert!(
        table.contains("  0 spatial confinement     not measured"),
        "{table}"
    );

    let top = cli(&["top"], &sock);
    assert_eq!(
        mechanism(&top["costs"], "block_stop")["stop"]["samples"],
        block["stop"]["samples"]
    );

    drop(high);
    drop(low);
    daemon.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_level_3_queue_that_drains_counts_as_an_lv1_drain() {
    let (dir, sock, daemon) = daemon("drains");
    let addr = daemon.metrics_addr().unwrap();

    let mut low = Client::start(ROLE, &format!("low-lv3:{}", sock.display()));
    low.expect("started");
    let mut high = Client::start(ROLE, &format!("high:{}", sock.display()));
    high.expect("started");
    high.expect("done");
    low.expect("done");

    // Every drained suspension of the low queue, and only those, is an Lv1 drain of device 0.
    let lv1 = ["device=\"0\"", "level=\"lv1\"", "mechanism=\"drain\""];
    let t = Instant::now();
    let (drains, body) = loop {
        let body = scrape(addr);
        let drains = sample(
            &body,
            "xpreempt_queue_drains_total",
            &["process=\"low-lv3\""],
        );
        let merged = sample(&body, "xpreempt_mechanism_stop_samples", &lv1);
        if drains.is_some_and(|n| n >= 1.0) && drains == merged {
            break (drains.unwrap(), body);
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the low queue's drains ({drains:?}) never matched the device's Lv1 drains \
             ({merged:?}):\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The queue's own histogram counts every suspension it timed, drained or stopped; the
    // device's Lv3 switch only the ones that interrupted.
    let timed = sample(
        &body,
        "xpreempt_queue_suspend_latency_seconds_count",
        &["process=\"low-lv3\""],
    )
    .unwrap();
    let lv3 = ["device=\"0\"", "level=\"lv3\""];
    let switched = sample(&body, "xpreempt_mechanism_stop_samples", &lv3).unwrap_or(0.0);
    eprintln!("low-lv3: {timed} suspensions timed, {drains} drained, {switched} switched");
    assert_eq!(timed, drains + switched, "{body}");

    let listing = cli(&["list"], &sock);
    let row = listing["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["process_name"] == "low-lv3")
        .expect("the low queue's row");
    assert_eq!(row["drains"].as_f64(), Some(drains), "{row}");
    assert!(row["preemptions"].as_f64().unwrap() >= drains, "{row}");
    let drain = mechanism(&listing["costs"], "drain");
    assert_eq!(drain["stop"]["samples"].as_f64(), Some(drains), "{drain}");
    // A drain waits for the window to finish: at least part of a 2 ms kernel.
    assert!(drain["stop"]["mean_ns"].as_u64().unwrap() > 0, "{drain}");

    let o = Command::new(env!("CARGO_BIN_EXE_xpreempt"))
        .args(["list", "--socket", sock.to_str().unwrap()])
        .output()
        .expect("run xpreempt");
    let table = String::from_utf8(o.stdout).unwrap();
    let header: Vec<&str> = table
        .lines()
        .find(|l| l.trim_start().starts_with("queue"))
        .unwrap_or_else(|| panic!("no queue header in:\n{table}"))
        .split_whitespace()
        .collect();
    let cells: Vec<&str> = table
        .lines()
        .find(|l| l.contains("low-lv3"))
        .unwrap_or_else(|| panic!("no low-lv3 row in:\n{table}"))
        .split_whitespace()
        .collect();
    let at = header.iter().position(|h| *h == "drained").unwrap();
    assert_eq!(cells[at], format!("{drains}"), "{table}");

    drop(high);
    drop(low);
    daemon.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
